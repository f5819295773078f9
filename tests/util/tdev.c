/* tdev.c - device helpers for the tests (see tdev.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include "tests/util/tcheck.h"
#include "tests/util/tdev.h"

#define TU_ELEM_BLOCK 256u

ppn_dptr tu_dalloc(ppn_gpu *g, int dev, size_t n)
{
    ppn_dptr p = 0;
    EXPECT_OK(g->ops->mem_alloc(g, dev, n, &p));
    assert_true(p != 0);
    return p;
}

ppn_gstream *tu_stream(ppn_gpu *g, int dev)
{
    ppn_gstream *s = NULL;
    EXPECT_OK(g->ops->stream_create(g, dev, &s));
    assert_non_null(s);
    assert_int_equal(g->ops->stream_device(g, s), dev);
    return s;
}

ppn_gevent *tu_event(ppn_gpu *g, int dev, int timing)
{
    ppn_gevent *e = NULL;
    EXPECT_OK(g->ops->event_create(g, dev, timing, &e));
    assert_non_null(e);
    return e;
}

void tu_upload(ppn_gpu *g, ppn_gstream *s, ppn_dptr d, const void *h, size_t n)
{
    EXPECT_OK(g->ops->copy_htod(g, s, d, h, n));
    EXPECT_OK(g->ops->stream_sync(g, s));
}

void tu_download(ppn_gpu *g, ppn_gstream *s, void *h, ppn_dptr d, size_t n)
{
    EXPECT_OK(g->ops->copy_dtoh(g, s, h, d, n));
    EXPECT_OK(g->ops->stream_sync(g, s));
}

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

static void acc_add(ppn_launch *l, ppn_dptr p, size_t bytes, int mode)
{
    l->acc[l->nacc++] = (ppn_access){.ptr = p, .bytes = bytes, .mode = mode};
}

ppn_launch tu_launch_fill(ppn_kp_fill *p, ppn_dptr out, uint32_t value, int n)
{
    *p = (ppn_kp_fill){.out = out, .value = value, .n = n};
    ppn_launch l = launch_1d(PPN_K_FILL, p, n);
    acc_add(&l, out, (size_t)n * sizeof(uint32_t), PPN_ACC_W);
    return l;
}

ppn_launch tu_launch_add(ppn_kp_add *p, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n)
{
    *p = (ppn_kp_add){.out = out, .a = a, .b = b, .n = n};
    ppn_launch l = launch_1d(PPN_K_ADD, p, n);
    acc_add(&l, a, (size_t)n * sizeof(float), PPN_ACC_R);
    acc_add(&l, b, (size_t)n * sizeof(float), PPN_ACC_R);
    acc_add(&l, out, (size_t)n * sizeof(float), PPN_ACC_W);
    return l;
}

ppn_status tu_fill(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, uint32_t value, int n)
{
    ppn_kp_fill p;
    ppn_launch l = tu_launch_fill(&p, out, value, n);
    return g->ops->launch(g, s, &l);
}

ppn_status tu_add(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n)
{
    ppn_kp_add p;
    ppn_launch l = tu_launch_add(&p, out, a, b, n);
    return g->ops->launch(g, s, &l);
}
