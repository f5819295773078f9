/* tkern.c - the kernel tests' shared helpers (see tkern.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include <stdlib.h>
#include "core/base/err.h"
#include "kernels/ops.h"
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
    free(tu_cap.xacc);
    tu_cap.xacc = NULL;
    if (l->nxacc) {
        tu_cap.xacc = malloc((size_t)l->nxacc * sizeof *tu_cap.xacc);
        assert_non_null(tu_cap.xacc);
        memcpy(tu_cap.xacc, l->xacc, (size_t)l->nxacc * sizeof *tu_cap.xacc);
    }
    tu_cap.l.xacc = tu_cap.xacc;
    tu_cap.calls++;
    if (!tu_cap.dry) ppn_kernels[l->kernel].cpu(tu_cap.params);
    return PPN_OK;
}

static const struct ppn_gpu_ops fake_ops = {.name = "fake", .launch = fake_launch};
ppn_gpu tu_fake = {.ops = &fake_ops};
ppn_gstream *const tu_fake_stream = (ppn_gstream *)&tu_fake;

int tu_tma_shift;
static int fake_tma_sms;
int tu_tma_level = 1;
static int fake_tma_ok(ppn_gpu *g, ppn_gstream *s) { return (void)g, (void)s, tu_tma_level; }
static int fake_sm_count(ppn_gpu *g, ppn_gstream *s) { return (void)g, (void)s, fake_tma_sms; }
static ppn_status fake_tmap_encode(ppn_gpu *g, ppn_gstream *s, const ppn_tmap_desc *d, void *map)
{
    (void)g, (void)s;
    PPN_CHECK(ppn_tmap_check("fake", d));
    ppn_tmap_desc e = *d;
    e.base += (ppn_dptr)tu_tma_shift;
    ppn_tmap_sim_encode(&e, map);
    return PPN_OK;
}
static const struct ppn_gpu_ops fake_tma_ops = {.name = "fake-tma", .launch = fake_launch, .tma_ok = fake_tma_ok,
                                                .tmap_encode = fake_tmap_encode, .sm_count = fake_sm_count};
static ppn_gpu fake_tma = {.ops = &fake_tma_ops};

ppn_gpu *tu_fake_tma(int sms)
{
    fake_tma_sms = sms;
    return &fake_tma;
}

const ppn_access *tu_acc(int i)
{
    assert_true(i >= 0 && i < tu_cap.l.nacc + tu_cap.l.nxacc);
    return i < tu_cap.l.nacc ? &tu_cap.l.acc[i] : &tu_cap.l.xacc[i - tu_cap.l.nacc];
}

void tu_expect_acc(int i, const void *p, size_t bytes, int mode)
{
    const ppn_access *a = tu_acc(i);
    assert_true(a->ptr == D(p));
    assert_int_equal(a->bytes, bytes);
    assert_int_equal(a->mode, mode);
}

int tu_declared(const void *p, size_t bytes, int mode)
{
    for (int i = 0; i < tu_cap.l.nacc + tu_cap.l.nxacc; i++) {
        const ppn_access *a = tu_acc(i);
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

ppn_status tu_op_rope_kv(ppn_gpu *g, ppn_gstream *s, ppn_dptr qk, int n_q, int n_kv, int head_dim, ppn_dptr inv_freq,
                         int interleaved, ppn_dptr hdr, ppn_dptr kc, ppn_dptr vc, ppn_dptr v, int ctx, int kvdt)
{
    ppn_kv_view kv = ppn_kv_view_identity(kc, vc, ctx, kvdt);
    return ppn_op_rope_kv(g, s, qk, n_q, n_kv, head_dim, inv_freq, interleaved, hdr, &kv, v);
}

ppn_status tu_op_attn(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr q, ppn_dptr kc, ppn_dptr vc, int n_heads,
                      int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part, int n_split, int kvdt)
{
    ppn_kv_view kv = ppn_kv_view_identity(kc, vc, ctx, kvdt);
    return ppn_op_attn(g, s, out, q, &kv, n_heads, n_kv, head_dim, scale, hdr, part, n_split);
}

ppn_status tu_op_attn_rope(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                           int n_heads, int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part,
                           int n_split, ppn_dptr inv_freq, int interleaved, int kvdt)
{
    ppn_kv_view kv = ppn_kv_view_identity(kc, vc, ctx, kvdt);
    return ppn_op_attn_rope(g, s, out, qkv, &kv, n_heads, n_kv, head_dim, scale, hdr, part, n_split, inv_freq,
                            interleaved);
}

ppn_status tu_op_rope_kv_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                              ppn_dptr inv_freq, int interleaved, ppn_dptr kc, ppn_dptr vc, int ctx, int kvdt, int pos0,
                              int c)
{
    ppn_kv_view kv = ppn_kv_view_identity(kc, vc, ctx, kvdt);
    return ppn_op_rope_kv_rows(g, s, qkv, n_q, n_kv, head_dim, inv_freq, interleaved, &kv, pos0, c);
}

ppn_status tu_op_attn_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                           int n_heads, int n_kv, int head_dim, int ctx, int kvdt, float scale, int pos0, int c)
{
    ppn_kv_view kv = ppn_kv_view_identity(kc, vc, ctx, kvdt);
    return ppn_op_attn_rows(g, s, out, qkv, &kv, n_heads, n_kv, head_dim, scale, pos0, c);
}
