/* test_kernels_misc.c - the small kernels: rmsnorm and the per-head rmsnorm, embed, swiglu, add, argmax, fill and
 * set_hdr. Their CPU references against naive computations written here, and their ops (params, declared
 * accesses, geometry, argument checks) through the fake device (tests/util/tkern.h).
 *
 * Tolerances (stated per check): the references round to f32 at the same points HF does, so each result is
 * within a few f32 ulps (~6e-8 relative each) of the exact value; the checks allow 1e-6 relative to the sum
 * of absolute terms, except where an f32 rounding is part of the spec (rope's angle) and is mirrored here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/dtype.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

/* ---------------------------------------------------------------------------------------------------------
 * rmsnorm, head_rmsnorm */

/* expected out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] in double; f32 rounding of the mean, the scale and
 * two products stays within 1e-6 relative. */
static void rms_expect(const float *x, const double *w, int n, float eps, double *want)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) want[i] = x[i] * r * w[i];
}

static void test_rmsnorm_reference(void **state)
{
    (void)state;
    const int n = 1000;
    for (int dt = 0; dt < 3; dt++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            double *wv = malloc(n * sizeof *wv), *want = malloc(n * sizeof *want);
            void *w = tu_wrand(dt, n, wv);
            float *x = tu_frand(n, -3, 3), *out = malloc(n * 4), *first = malloc(n * 4), *x0 = malloc(n * 4);
            assert_non_null(want);
            assert_non_null(out);
            memcpy(x0, x, n * 4);
            rms_expect(x, wv, n, 1e-5f, want);
            float *o = inplace ? x : out;
            ppn_kp_rmsnorm p = {.out = D(o), .in = D(x), .w = D(w), .n = n, .wdt = dt, .eps = 1e-5f};
            tu_kernel_run(PPN_K_RMSNORM, &p);
            for (int i = 0; i < n; i++) tu_check_close(o[i], want[i], 1e-6 * fabs(want[i]) + 1e-30, "rmsnorm", i);
            memcpy(first, o, n * 4);
            memcpy(x, x0, n * 4);
            tu_kernel_run(PPN_K_RMSNORM, &p);
            assert_memory_equal(first, o, n * 4);
            free(wv), free(want), free(w), free(x), free(out), free(first), free(x0);
        }
    }
    /* eps matters: an all-zero vector gives zeros (not NaN) and a tiny vector is damped by eps */
    float z[4] = {0, 0, 0, 0}, wz[4] = {1, 1, 1, 1}, oz[4];
    ppn_kp_rmsnorm p = {.out = D(oz), .in = D(z), .w = D(wz), .n = 4, .wdt = PPN_DTYPE_F32, .eps = 1e-6f};
    tu_kernel_run(PPN_K_RMSNORM, &p);
    for (int i = 0; i < 4; i++) assert_true(oz[i] == 0.0f);
    float t[2] = {1e-3f, -1e-3f};
    p.in = D(t), p.n = 2, p.eps = 1e-6f;
    tu_kernel_run(PPN_K_RMSNORM, &p);
    tu_check_close(oz[0], 1e-3 / sqrt(1e-6 + 1e-6), 1e-6, "rmsnorm eps", 0);
}

static void test_head_rmsnorm_reference(void **state)
{
    (void)state;
    const int nh = 4, hd = 32;
    for (int dt = 0; dt < 3; dt++) {
        double wv[32], want[32];
        void *w = tu_wrand(dt, hd, wv);
        float *x = tu_frand((size_t)nh * hd, -2, 2), *x0 = malloc((size_t)nh * hd * 4), *first = malloc(nh * hd * 4);
        assert_non_null(x0);
        assert_non_null(first);
        for (int h = 0; h < nh; h++) /* give each head a different scale so per-head norms differ */
            for (int i = 0; i < hd; i++) x[h * hd + i] *= (float)(h + 1);
        memcpy(x0, x, (size_t)nh * hd * 4);
        ppn_kp_head_rmsnorm p = {.x = D(x), .w = D(w), .n_heads = nh, .head_dim = hd, .wdt = dt, .eps = 1e-6f};
        tu_kernel_run(PPN_K_HEAD_RMSNORM, &p);
        for (int h = 0; h < nh; h++) {
            rms_expect(x0 + h * hd, wv, hd, 1e-6f, want);
            for (int i = 0; i < hd; i++)
                tu_check_close(x[h * hd + i], want[i], 1e-6 * fabs(want[i]) + 1e-30, "head_rmsnorm", (size_t)(h * hd + i));
        }
        memcpy(first, x, (size_t)nh * hd * 4);
        memcpy(x, x0, (size_t)nh * hd * 4);
        tu_kernel_run(PPN_K_HEAD_RMSNORM, &p);
        assert_memory_equal(first, x, (size_t)nh * hd * 4);
        free(w), free(x), free(x0), free(first);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * embed, swiglu, add, argmax, fill, set_hdr */

static void test_embed_reference(void **state)
{
    (void)state;
    const int vocab = 50, dim = 24;
    for (int dt = 0; dt < 3; dt++) {
        double *tv = malloc((size_t)vocab * dim * sizeof *tv);
        assert_non_null(tv);
        void *table = tu_wrand(dt, (size_t)vocab * dim, tv);
        float out[24], first[24];
        ppn_step_hdr hdr = {.token = 37};
        ppn_kp_embed p = {.out = D(out), .table = D(table), .hdr = D(&hdr), .dim = dim, .vocab = vocab,
                          .wdt = dt};
        tu_kernel_run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true((double)out[i] == tv[37 * dim + i]);
        memcpy(first, out, sizeof out);
        tu_kernel_run(PPN_K_EMBED, &p);
        assert_memory_equal(first, out, sizeof out);
        hdr.token = vocab; /* out of range: NaN, no read past the table */
        tu_kernel_run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true(isnan(out[i]));
        hdr.token = -1;
        memset(out, 0, sizeof out);
        tu_kernel_run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true(isnan(out[i]));
        free(tv), free(table);
    }
}

static void test_swiglu_reference(void **state)
{
    (void)state;
    const int n = 777;
    float *g = tu_frand(n, -12, 12), *u = tu_frand(n, -3, 3), *out = malloc(n * 4), *first = malloc(n * 4);
    assert_non_null(out);
    assert_non_null(first);
    g[0] = 0.0f, g[1] = -90.0f, g[2] = 90.0f;
    ppn_kp_swiglu p = {.out = D(out), .gate = D(g), .up = D(u), .n = n};
    tu_kernel_run(PPN_K_SWIGLU, &p);
    for (int i = 0; i < n; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        tu_check_close(out[i], want, 1e-6 * fabs(want) + 1e-30, "swiglu", (size_t)i);
    }
    memcpy(first, out, n * 4);
    tu_kernel_run(PPN_K_SWIGLU, &p);
    assert_memory_equal(first, out, n * 4);
    free(g), free(u), free(out), free(first);
}

static void test_add_reference(void **state)
{
    (void)state;
    const int n = 300;
    float *a = tu_frand(n, -5, 5), *b = tu_frand(n, -5, 5), *out = malloc(n * 4), *a0 = malloc(n * 4);
    assert_non_null(out);
    assert_non_null(a0);
    memcpy(a0, a, n * 4);
    ppn_kp_add p = {.out = D(out), .a = D(a), .b = D(b), .n = n};
    tu_kernel_run(PPN_K_ADD, &p);
    for (int i = 0; i < n; i++) assert_true(out[i] == (float)((double)a[i] + b[i])); /* exact rounding */
    p.out = D(a); /* out aliases a */
    tu_kernel_run(PPN_K_ADD, &p);
    assert_memory_equal(a, out, n * 4);
    memcpy(a, a0, n * 4);
    tu_kernel_run(PPN_K_ADD, &p);
    assert_memory_equal(a, out, n * 4);
    free(a), free(b), free(out), free(a0);
}

static int32_t argmax_of(const float *x, int n)
{
    int32_t out = -7;
    ppn_kp_argmax p = {.out = D(&out), .x = D(x), .n = n};
    tu_kernel_run(PPN_K_ARGMAX, &p);
    return out;
}

static void test_argmax_reference(void **state)
{
    (void)state;
    float a[] = {1, 3, 2, 3, -1};
    assert_int_equal(argmax_of(a, 5), 1); /* tie: lowest index */
    /* a NaN or an infinity anywhere: -1 (non-finite logits are an error the host names, never a choice) */
    float b[] = {NAN, 0.5f, 0.5f, 0.5f, 0.25f};
    assert_int_equal(argmax_of(b, 5), -1);
    float b2[] = {0.5f, 0.5f, 0.25f, NAN};
    assert_int_equal(argmax_of(b2, 4), -1);
    float c[] = {-3, -INFINITY, -2};
    assert_int_equal(argmax_of(c, 3), -1);
    float d[] = {-3, 7, INFINITY};
    assert_int_equal(argmax_of(d, 3), -1);
    float e[] = {NAN, NAN, NAN};
    assert_int_equal(argmax_of(e, 3), -1);
    float c2[] = {-3, -3e38f, 3e38f, -2};
    assert_int_equal(argmax_of(c2, 4), 2); /* the largest finite values are values */
    float f[] = {-0.0f, 0.0f};
    assert_int_equal(argmax_of(f, 2), 0); /* -0 == +0: a tie */
    float g1[] = {42};
    assert_int_equal(argmax_of(g1, 1), 0);

    /* a large random vector: compare with a naive scan */
    const int n = 50000;
    float *x = tu_frand(n, -10, 10);
    x[31337] = 11.0f, x[40000] = 11.0f;
    assert_int_equal(argmax_of(x, n), 31337);
    x[49999] = NAN; /* the last element */
    assert_int_equal(argmax_of(x, n), -1);
    free(x);
}

static void test_fill_reference(void **state)
{
    (void)state;
    uint32_t buf[70];
    for (int i = 0; i < 70; i++) buf[i] = 0x11111111u;
    ppn_kp_fill p = {.out = D(buf), .value = 0xDEADBEEFu, .n = 65};
    tu_kernel_run(PPN_K_FILL, &p);
    for (int i = 0; i < 70; i++) assert_true(buf[i] == (i < 65 ? 0xDEADBEEFu : 0x11111111u));
}

static void test_set_hdr_reference(void **state)
{
    (void)state;
    ppn_step_hdr h[2] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}};
    ppn_kp_set_hdr p = {.hdr = D(&h[0]), .v = {.pos = 41, .token = 7, .seq = 3, .step = 99}};
    tu_kernel_run(PPN_K_SET_HDR, &p);
    assert_int_equal(h[0].pos, 41);
    assert_int_equal(h[0].token, 7);
    assert_int_equal(h[0].seq, 3);
    assert_int_equal(h[0].step, 99);
    assert_int_equal(h[1].pos, -1); /* nothing past the header */
}

/* ---------------------------------------------------------------------------------------------------------
 * the ops, through the fake device */

static void test_small_ops(void **state)
{
    (void)state;
    const int n = 600;
    float *a = tu_frand(n, -1, 1), *b = tu_frand(n, -1, 1), *out = malloc(n * 4), w[600];
    int32_t idx = -5;
    size_t amx_bytes = ppn_op_argmax_scratch_bytes();
    unsigned char *amx = calloc(amx_bytes, 1); /* the argmax's scratch; the CPU reference leaves it alone */
    uint16_t tab[4 * 600];
    assert_non_null(out);
    for (int i = 0; i < n; i++) w[i] = 1.0f;
    for (int i = 0; i < 4 * n; i++) tab[i] = ppn_f32_to_f16((float)(i % 7));
    ppn_step_hdr hdr = {.token = 2};

    assert_int_equal(ppn_op_embed(&tu_fake, tu_fake_stream, D(out), D(tab), PPN_DTYPE_F16, 4, n, D(&hdr)), PPN_OK);
    tu_expect_geometry((unsigned)n);
    assert_true(tu_declared(tab, sizeof tab, PPN_ACC_R) && tu_declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_true(tu_declared(out, (size_t)n * 4, PPN_ACC_W));
    assert_true(out[5] == (float)((2 * n + 5) % 7));

    assert_int_equal(ppn_op_rmsnorm(&tu_fake, tu_fake_stream, D(out), D(a), D(w), PPN_DTYPE_F32, n, 1e-5f), PPN_OK);
    assert_true(tu_declared(a, (size_t)n * 4, PPN_ACC_R) && tu_declared(w, (size_t)n * 4, PPN_ACC_R));
    assert_true(tu_declared(out, (size_t)n * 4, PPN_ACC_W));

    assert_int_equal(ppn_op_head_rmsnorm(&tu_fake, tu_fake_stream, D(out), 10, 60, D(w), PPN_DTYPE_F32, 1e-6f), PPN_OK);
    assert_int_equal(tu_cap.l.grid[0], 10);
    assert_true(tu_declared(out, (size_t)n * 4, PPN_ACC_RW) && tu_declared(w, 60 * 4, PPN_ACC_R));

    assert_int_equal(ppn_op_swiglu(&tu_fake, tu_fake_stream, D(out), D(a), D(b), n), PPN_OK);
    tu_expect_geometry((unsigned)n);
    tu_check_close(out[9], a[9] / (1.0 + exp(-(double)a[9])) * b[9], 1e-6, "op swiglu", 9);

    assert_int_equal(ppn_op_add(&tu_fake, tu_fake_stream, D(a), D(a), D(b), n), PPN_OK);
    tu_expect_geometry((unsigned)n);
    assert_true(tu_declared(a, (size_t)n * 4, PPN_ACC_R) && tu_declared(a, (size_t)n * 4, PPN_ACC_W));

    a[123] = 50.0f;
    assert_int_equal(ppn_op_argmax_wide(&tu_fake, tu_fake_stream, D(&idx), D(a), n, D(amx)), PPN_OK);
    assert_int_equal(idx, 123);
    assert_true(tu_declared(&idx, 4, PPN_ACC_W) && tu_declared(a, (size_t)n * 4, PPN_ACC_R));
    assert_true(tu_declared(amx, amx_bytes, PPN_ACC_R) && tu_declared(amx, amx_bytes, PPN_ACC_W));
    assert_true(tu_cap.l.grid[0] > 1); /* many blocks, merging through the scratch */

    tu_cap.calls = 0;
    assert_int_equal(ppn_op_add(&tu_fake, tu_fake_stream, D(out), D(a), D(b), -1), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "-1"));
    assert_int_equal(ppn_op_swiglu(&tu_fake, tu_fake_stream, D(out), D(a), 0, n), PPN_EINVAL);
    assert_int_equal(ppn_op_argmax_wide(&tu_fake, tu_fake_stream, D(&idx), D(a), 0, D(amx)), PPN_EINVAL);
    assert_int_equal(ppn_op_argmax_wide(&tu_fake, tu_fake_stream, D(&idx), D(a), n, 0), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "part"));
    assert_int_equal(ppn_op_embed(&tu_fake, tu_fake_stream, D(out), D(tab), PPN_DTYPE_F16, 0, n, D(&hdr)), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "vocab"));
    assert_int_equal(ppn_op_head_rmsnorm(&tu_fake, tu_fake_stream, D(out), 10, 0, D(w), PPN_DTYPE_F32, 1e-6f),
                     PPN_EINVAL);
    assert_int_equal(ppn_op_rmsnorm(&tu_fake, tu_fake_stream, D(out), D(a), D(w), 3, n, 1e-5f), PPN_EINVAL);
    assert_int_equal(tu_cap.calls, 0);
    free(a), free(b), free(out), free(amx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm_reference),
        cmocka_unit_test(test_head_rmsnorm_reference),
        cmocka_unit_test(test_embed_reference),
        cmocka_unit_test(test_swiglu_reference),
        cmocka_unit_test(test_add_reference),
        cmocka_unit_test(test_argmax_reference),
        cmocka_unit_test(test_fill_reference),
        cmocka_unit_test(test_set_hdr_reference),
        cmocka_unit_test(test_small_ops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
