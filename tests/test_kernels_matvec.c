/* test_kernels_matvec.c - the matvec and matmat CPU references against naive double-precision sums written
 * here, and their ops (ppn_op_matvec, ppn_op_matvec_in's fused norm, ppn_op_matmat): params, declared accesses,
 * argument checks and the matvec's geometry, through the fake device (tests/util/tkern.h).
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
 * the references */

typedef struct mv_case {
    int dt, rows, cols, bias, res, alias; /* alias: res and out are the same buffer */
} mv_case;

static void matvec_case(const mv_case *c)
{
    size_t R = (size_t)c->rows, C = (size_t)c->cols;
    double *wv = malloc(R * C * sizeof *wv), *bv = malloc(R * sizeof *bv), *want = malloc(R * sizeof *want);
    double *tol = malloc(R * sizeof *tol);
    void *w = tu_wrand(c->dt, R * C, wv);
    void *b = tu_wrand(c->dt, R, bv);
    float *x = tu_frand(C, -1, 1), *res = tu_frand(R, -4, 4), *out = tu_frand(R, -9, 9), *out2 = malloc(R * 4);
    float *res_copy = malloc(R * 4);
    assert_non_null(wv);
    assert_non_null(want);
    assert_non_null(out2);
    memcpy(res_copy, res, R * 4);
    for (size_t r = 0; r < R; r++) {
        double s = 0, a = 0;
        for (size_t k = 0; k < C; k++) s += wv[r * C + k] * x[k], a += fabs(wv[r * C + k] * x[k]);
        if (c->bias) s += bv[r], a += fabs(bv[r]);
        if (c->res) s += res[r], a += fabs(res[r]);
        want[r] = s;
        tol[r] = 1e-6 * a + 1e-30;
    }
    float *o = c->alias ? res : out;
    ppn_kp_matvec p = {.out = D(o), .w = D(w), .x = D(x), .bias = c->bias ? D(b) : 0,
                       .res = c->res ? D(res) : 0, .rows = c->rows, .cols = c->cols, .wdt = c->dt};
    tu_kernel_run(PPN_K_MATVEC, &p);
    char what[64];
    snprintf(what, sizeof what, "matvec %s %dx%d bias=%d res=%d alias=%d", ppn_dtype_name(c->dt), c->rows, c->cols,
             c->bias, c->res, c->alias);
    for (size_t r = 0; r < R; r++) tu_check_close(o[r], want[r], tol[r], what, r);
    /* determinism: the same inputs again give the same bits */
    memcpy(out2, o, R * 4);
    if (c->alias) memcpy(res, res_copy, R * 4);
    tu_kernel_run(PPN_K_MATVEC, &p);
    assert_memory_equal(out2, o, R * 4);
    free(wv), free(bv), free(want), free(tol), free(w), free(b), free(x), free(res), free(out), free(out2);
    free(res_copy);
}

static void test_matvec_reference(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        mv_case cs[] = {
            {dt, 37, 133, 0, 0, 0}, {dt, 37, 133, 1, 0, 0}, {dt, 37, 133, 0, 1, 0}, {dt, 37, 133, 1, 1, 0},
            {dt, 37, 133, 1, 1, 1}, {dt, 64, 256, 0, 1, 1}, {dt, 1, 1, 1, 1, 0},    {dt, 5, 4099, 0, 0, 0},
        };
        for (size_t i = 0; i < TU_LEN(cs); i++) matvec_case(&cs[i]);
    }
}

/* matmat: each token's row is bit-identical to a matvec of that token, and close to the double reference. */
static void test_matmat_reference(void **state)
{
    (void)state;
    enum { R = 37, C = 70, M = 5 };
    for (int dt = PPN_DTYPE_F32; dt <= PPN_DTYPE_F16; dt++) {
        double wv[R * C], bv[R];
        void *w = tu_wrand(dt, (size_t)R * C, wv), *b = tu_wrand(dt, R, bv);
        float *x = tu_frand((size_t)M * C, -1, 1), *res = tu_frand((size_t)M * R, -2, 2);
        float out[M * R], row[R];
        ppn_kp_matmat p = {.out = D(out), .w = D(w), .x = D(x), .bias = D(b), .res = D(res), .rows = R, .cols = C,
                           .m = M, .wdt = dt};
        tu_kernel_run(PPN_K_MATMAT, &p);
        for (int t = 0; t < M; t++) {
            ppn_kp_matvec v = {.out = D(row), .w = D(w), .x = D(x + t * C), .bias = D(b), .res = D(res + t * R),
                               .rows = R, .cols = C, .wdt = dt};
            tu_kernel_run(PPN_K_MATVEC, &v);
            assert_memory_equal(row, out + t * R, sizeof row);
            for (int r = 0; r < R; r += 9) {
                double s = res[t * R + r] + bv[r], mag = fabs(res[t * R + r]) + fabs(bv[r]);
                for (int c = 0; c < C; c++) s += wv[r * C + c] * x[t * C + c], mag += fabs(wv[r * C + c] * x[t * C + c]);
                tu_check_close(out[t * R + r], s, 1e-6 * mag + 1e-6, "matmat", r);
            }
        }
        free(w), free(b), free(x), free(res);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the ops, through the fake device */

static void test_matvec_op(void **state)
{
    (void)state;
    const int rows = 20, cols = 33;
    double wv[20 * 33], bv[20];
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)rows * cols, wv), *b = tu_wrand(PPN_DTYPE_BF16, rows, bv);
    float *x = tu_frand(cols, -1, 1), *res = tu_frand(rows, -1, 1);
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, cols, 0,
                                   D(res)),
                     PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    assert_int_equal(tu_cap.l.kernel, PPN_K_MATVEC);
    assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_matvec));
    const ppn_kp_matvec *p = (const ppn_kp_matvec *)tu_cap.params;
    assert_true(p->out == D(res) && p->w == D(w) && p->x == D(x) && p->bias == 0 && p->res == D(res));
    assert_true(p->rows == rows && p->cols == cols && p->wdt == PPN_DTYPE_BF16);
    assert_int_equal(tu_cap.l.nacc, 4); /* no access for the absent bias */
    tu_expect_acc(0, w, (size_t)rows * cols * 2, PPN_ACC_R);
    tu_expect_acc(1, x, (size_t)cols * 4, PPN_ACC_R);
    tu_expect_acc(2, res, (size_t)rows * 4, PPN_ACC_R);
    tu_expect_acc(3, res, (size_t)rows * 4, PPN_ACC_W);
    /* one warp per row: enough warps for every row */
    assert_true((unsigned long long)tu_cap.l.grid[0] * (tu_cap.l.block[0] / 32) >= (unsigned)rows);
    tu_expect_geometry(32);
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, cols, D(b), 0),
                     PPN_OK);
    assert_int_equal(tu_cap.l.nacc, 4);
    assert_true(tu_declared(b, (size_t)rows * 2, PPN_ACC_R));
    assert_true(tu_declared(res, (size_t)rows * 4, PPN_ACC_W));
    /* the result went through the reference: check one row */
    double s = bv[3];
    for (int c = 0; c < cols; c++) s += wv[3 * cols + c] * x[c];
    tu_check_close(res[3], s, 1e-5, "op matvec", 3);

    /* argument checks: name the op and the value; nothing launched */
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), 0, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_matvec"));
    assert_non_null(strstr(ppn_last_error(), "rows"));
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, -3, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "-3"));
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(res), D(w), 9, D(x), rows, cols, 0, 0), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "9"));
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(x), D(w), PPN_DTYPE_BF16, D(x), rows, cols, 0, 0),
                     PPN_EINVAL); /* out overlapping x */
    assert_non_null(strstr(ppn_last_error(), "overlaps"));
    assert_int_equal(tu_cap.calls, 0);
    free(w), free(b), free(x), free(res);
}

/* The matvec geometry the H200 runs chose (ops.c matvec_geometry; docs/PERF.md): 256-thread blocks, four an SM,
 * while x is staged under 16 KB; 512-thread blocks from 16 KB of staged x (x copied half as often) and where a
 * large x leaves room for fewer blocks; never more blocks than one resident wave of 132 SMs; x over the
 * shared-memory opt-in read unstaged. Captured only (model-sized shapes, no buffers behind the pointers). */
static void test_matvec_op_geometry(void **state)
{
    (void)state;
    static const struct { int rows, cols; unsigned block, max_grid, smem; } g[] = {
        {3072, 2048, 256, 528, 8192},     /* llama-1b q|k|v: x of 8 KB */
        {16384, 2048, 256, 528, 8192},    /* llama-1b gate|up */
        {2048, 8192, 512, 264, 32768},    /* llama-1b down: x of 32 KB */
        {6144, 4096, 512, 264, 16384},    /* llama-8b q|k|v: x of 16 KB */
        {4096, 14336, 512, 264, 57344},   /* llama-8b down: 2 x 512 threads fit beside 57 KB, not 4 x 256 */
        {128256, 4096, 512, 264, 16384},  /* llama-8b lm head */
        {64, 30000, 256, 528, 0},         /* x of 120 KB: over the opt-in, read unstaged */
    };
    tu_cap.dry = 1;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        ppn_dptr w = 0x100000, x = 0x10000000, out = 0x20000000;
        assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, out, w, PPN_DTYPE_BF16, x, g[i].rows, g[i].cols, 0, 0),
                         PPN_OK);
        if (tu_cap.l.block[0] != g[i].block || tu_cap.l.grid[0] > g[i].max_grid || tu_cap.l.smem != g[i].smem)
            fail_msg("%d x %d: block %u grid %u smem %u, expected block %u grid <= %u smem %u", g[i].rows, g[i].cols,
                     tu_cap.l.block[0], tu_cap.l.grid[0], tu_cap.l.smem, g[i].block, g[i].max_grid, g[i].smem);
        tu_expect_geometry(1);
    }
}

static int dry_off(void **state) /* also after a failed check, so later tests run the reference again */
{
    (void)state;
    tu_cap.dry = 0;
    return 0;
}

/* The fused matvec input gives, on the reference, the bits of the separate rmsnorm launch followed by a plain
 * matvec (the reference shares their arithmetic); declared accesses cover the norm weight; bad modes (2, the
 * SwiGLU input that is gone, among them), a missing norm weight, a fused input wider than shared memory and
 * an out overlapping x are refused by name before any launch. */
static void test_matvec_op_fused_norm(void **state)
{
    (void)state;
    const int rows = 24, cols = 40;
    double wv[24 * 40], nv[40];
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)rows * cols, wv), *nw = tu_wrand(PPN_DTYPE_BF16, cols, nv);
    float *x = tu_frand((size_t)cols, -2, 2), xn[40], a[24], b[24];
    ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = D(x), .nw = D(nw), .eps = 1e-5f};
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_OK);
    assert_true(tu_declared(nw, (size_t)cols * 2, PPN_ACC_R) && tu_declared(x, (size_t)cols * 4, PPN_ACC_R));
    assert_true(tu_cap.l.smem >= (unsigned)cols * 4); /* a fused input is staged */
    assert_int_equal(ppn_op_rmsnorm(&tu_fake, tu_fake_stream, D(xn), D(x), D(nw), PPN_DTYPE_BF16, cols, 1e-5f), PPN_OK);
    assert_int_equal(ppn_op_matvec(&tu_fake, tu_fake_stream, D(b), D(w), PPN_DTYPE_BF16, D(xn), rows, cols, 0, 0),
                     PPN_OK);
    assert_memory_equal(a, b, sizeof a);

    tu_cap.calls = 0;
    in.mode = 7;
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "mode 7"));
    in.mode = 2;
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "mode 2"));
    in = (ppn_mv_input){.mode = PPN_MV_X_RMSNORM, .x = D(x)};
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "norm weight"));
    in.nw = D(nw);
    int wide = (int)(PPN_DYN_SMEM_MAX / 4);
    assert_false(ppn_op_matvec_fusable(wide));
    assert_true(ppn_op_matvec_fusable(wide - 64));
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, wide, 0, 0),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "shared memory"));
    /* out inside x: the overlap check holds for a fused input too */
    assert_int_equal(ppn_op_matvec_in(&tu_fake, tu_fake_stream, D(x + 4), D(w), PPN_DTYPE_BF16, in, 8, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps"));
    assert_int_equal(tu_cap.calls, 0);
    free(w), free(nw), free(x);
}

/* m above PPN_MATMAT_MAX_M goes in contiguous chunks, each launch declaring exactly its rows. */
static void test_matmat_op_chunks(void **state)
{
    (void)state;
    enum { R = 9, C = 16, M = PPN_MATMAT_MAX_M + 3 };
    double wv[R * C];
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)R * C, wv);
    float *x = tu_frand((size_t)M * C, -1, 1), out[M * R];
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_matmat(&tu_fake, tu_fake_stream, D(out), D(w), PPN_DTYPE_BF16, D(x), M, R, C, 0, 0),
                     PPN_OK);
    assert_int_equal(tu_cap.calls, 2);
    assert_int_equal(tu_cap.l.kernel, PPN_K_MATMAT);
    const ppn_kp_matmat *p = (const ppn_kp_matmat *)tu_cap.params; /* the last launch: tokens 8..10 */
    assert_int_equal(p->m, 3);
    assert_true(p->x == D(x + PPN_MATMAT_MAX_M * C) && p->out == D(out + PPN_MATMAT_MAX_M * R));
    assert_true(tu_declared(x + PPN_MATMAT_MAX_M * C, (size_t)3 * C * 4, PPN_ACC_R));
    assert_true(tu_declared(out + PPN_MATMAT_MAX_M * R, (size_t)3 * R * 4, PPN_ACC_W));
    for (int t = 0; t < M; t++) { /* every token computed (through the reference) */
        double s = 0;
        for (int c = 0; c < C; c++) s += wv[2 * C + c] * x[t * C + c];
        tu_check_close(out[t * R + 2], s, 1e-5, "op matmat", t);
    }
    assert_int_equal(ppn_op_matmat(&tu_fake, tu_fake_stream, D(out), D(w), PPN_DTYPE_BF16, D(x), 0, R, C, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_matmat"));
    free(w), free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matvec_reference),
        cmocka_unit_test(test_matmat_reference),
        cmocka_unit_test(test_matvec_op),
        cmocka_unit_test_teardown(test_matvec_op_geometry, dry_off),
        cmocka_unit_test(test_matvec_op_fused_norm),
        cmocka_unit_test(test_matmat_op_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
