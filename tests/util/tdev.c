/* tdev.c - device helpers for the tests (see tdev.h). */
#include <string.h>
#include "tests/util/tdev.h"

#define TU_ELEM_BLOCK 256u

/* An elementwise launch of kernel over n elements with params p (its struct size from the kernel table). */
static ppn_launch launch_1d(int kernel, const void *p, int n)
{
    ppn_launch l;
    memset(&l, 0, sizeof l);
    l.kernel = kernel;
    l.grid[0] = ((unsigned)n + TU_ELEM_BLOCK - 1u) / TU_ELEM_BLOCK;
    l.grid[1] = l.grid[2] = 1;
    l.block[0] = TU_ELEM_BLOCK;
    l.block[1] = l.block[2] = 1;
    l.params = p;
    l.params_size = ppn_kernels[kernel].params_size;
    return l;
}

ppn_launch tu_launch_fill(ppn_kp_fill *p, ppn_dptr out, uint32_t value, int n)
{
    *p = (ppn_kp_fill){.out = out, .value = value, .n = n};
    ppn_launch l = launch_1d(PPN_K_FILL, p, n);
    l.nacc = 1;
    l.acc[0] = (ppn_access){.ptr = out, .bytes = (size_t)n * sizeof(uint32_t), .mode = PPN_ACC_W};
    return l;
}

ppn_status tu_fill(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, uint32_t value, int n)
{
    ppn_kp_fill p;
    ppn_launch l = tu_launch_fill(&p, out, value, n);
    return g->ops->launch(g, s, &l);
}
