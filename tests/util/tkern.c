/* tkern.c - the kernel tests' shared helpers (see tkern.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "tests/util/tkern.h"

void tu_kernel_run(int id, const void *params) { ppn_kernels[id].cpu(params); }

void tu_check_close(double got, double want, double tol, const char *what, size_t i)
{
    if (!(fabs(got - want) <= tol)) fail_msg("%s[%zu]: got %.9g want %.9g (tol %.3g)", what, i, got, want, tol);
}

tu_capture tu_cap;

static ppn_status fake_launch(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l)
{
    (void)g, (void)s;
    assert_true(l->params_size <= sizeof tu_cap.params);
    tu_cap.l = *l;
    memcpy(tu_cap.params, l->params, l->params_size);
    tu_cap.l.params = tu_cap.params;
    tu_cap.calls++;
    if (!tu_cap.dry) ppn_kernels[l->kernel].cpu(tu_cap.params);
    return PPN_OK;
}

static const struct ppn_gpu_ops fake_ops = {.name = "fake", .launch = fake_launch};
ppn_gpu tu_fake = {.ops = &fake_ops};
ppn_gstream *const tu_fake_stream = (ppn_gstream *)&tu_fake;

void tu_expect_acc(int i, const void *p, size_t bytes, int mode)
{
    assert_true(i < tu_cap.l.nacc);
    assert_true(tu_cap.l.acc[i].ptr == D(p));
    assert_int_equal(tu_cap.l.acc[i].bytes, bytes);
    assert_int_equal(tu_cap.l.acc[i].mode, mode);
}

int tu_declared(const void *p, size_t bytes, int mode)
{
    for (int i = 0; i < tu_cap.l.nacc; i++) {
        const ppn_access *a = &tu_cap.l.acc[i];
        if ((a->mode & mode) && a->ptr <= D(p) && D(p) + bytes <= a->ptr + a->bytes) return 1;
    }
    return 0;
}

void tu_expect_geometry(unsigned min_threads)
{
    unsigned b = tu_cap.l.block[0];
    assert_true(b >= 32 && b <= 1024 && b % 32 == 0);
    assert_true(tu_cap.l.block[1] == 1 && tu_cap.l.block[2] == 1 && tu_cap.l.grid[1] == 1 && tu_cap.l.grid[2] == 1);
    assert_true(tu_cap.l.grid[0] >= 1);
    assert_true((unsigned long long)tu_cap.l.grid[0] * b >= min_threads);
}
