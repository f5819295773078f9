/* test_kernels_gemm.c - the prefill GEMM (ppn_kp_gemm, kernels/gemm_cpu.c; ppn_op_gemm, kernels/ops_gemm.c):
 * the CPU reference against a naive double-precision sum written here, and the op's kernel choice, geometry,
 * declared accesses and refusals through the fake device (tests/util/tkern.h).
 *
 * Tolerance of the reference: x rounded to the weight dtype is part of the spec, so the naive sum rounds it too
 * (by the formats' definitions, here: round_sig). What remains is f32 summation: 16 lanes of ceil(cols / 16)
 * terms each, a 4-level tree of the lanes, then + bias and + res (and for f32 weights a rounded product per
 * term): at most (ceil(cols / 16) + 8) u of the sum of absolute terms, u = 2^-24 (the classical gamma_n bound,
 * n u < 1 here). The checks use exactly that.
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
#include "core/base/err.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

static const int dts[] = {PPN_DTYPE_F32, PPN_DTYPE_BF16, PPN_DTYPE_F16};

/* v rounded to nearest even at `bits` significant bits, its quantum at least 2^min_exp (f16's subnormals). */
static double round_sig(double v, int bits, int min_exp)
{
    if (v == 0 || !isfinite(v)) return v;
    int e;
    frexp(v, &e);
    int q = e - bits < min_exp ? min_exp : e - bits;
    return ldexp(nearbyint(ldexp(v, -q)), q);
}

/* x as the products take it (kparams.h, ppn_kp_gemm): bf16 8 significant bits, f16 11 (subnormals from 2^-24). */
static double x_as(float v, int dt)
{
    if (dt == PPN_DTYPE_BF16) return round_sig(v, 8, -133);
    if (dt == PPN_DTYPE_F16) return round_sig(v, 11, -24);
    return v;
}

typedef struct gemm_case {
    int dt, m, rows, cols, bias, res, alias; /* alias: res and out are the same buffer */
} gemm_case;

/* Runs the reference on random inputs and checks every output against the double sum within the bound above;
 * then again on the same inputs for the same bits. */
static void gemm_case_run(const gemm_case *c)
{
    size_t M = (size_t)c->m, R = (size_t)c->rows, C = (size_t)c->cols;
    double *wv = malloc(R * C * sizeof *wv), *bv = malloc(R * sizeof *bv);
    void *w = tu_wrand(c->dt, R * C, wv), *b = tu_wrand(c->dt, R, bv);
    float *x = tu_frand(M * C, -2, 2), *res = tu_frand(M * R, -4, 4), *out = tu_frand(M * R, -9, 9);
    float *res0 = malloc(M * R * 4), *first = malloc(M * R * 4);
    double *want = malloc(M * R * sizeof *want), *tol = malloc(M * R * sizeof *tol);
    assert_non_null(wv);
    assert_non_null(bv);
    assert_non_null(res0);
    assert_non_null(first);
    assert_non_null(want);
    assert_non_null(tol);
    memcpy(res0, res, M * R * 4);
    double n_u = (double)((C + 15) / 16 + 8) * 0x1p-24;
    for (size_t i = 0; i < M; i++)
        for (size_t r = 0; r < R; r++) {
            double s = 0, a = 0;
            for (size_t k = 0; k < C; k++) {
                double t = wv[r * C + k] * x_as(x[i * C + k], c->dt);
                s += t, a += fabs(t);
            }
            if (c->bias) s += bv[r], a += fabs(bv[r]);
            if (c->res) s += res[i * R + r], a += fabs(res[i * R + r]);
            want[i * R + r] = s;
            tol[i * R + r] = n_u * a;
        }
    float *o = c->alias ? res : out;
    ppn_kp_gemm p = {.out = D(o), .w = D(w), .x = D(x), .bias = c->bias ? D(b) : 0, .res = c->res ? D(res) : 0,
                     .m = c->m, .rows = c->rows, .cols = c->cols, .wdt = c->dt};
    tu_kernel_run(PPN_K_GEMM, &p);
    char what[96];
    snprintf(what, sizeof what, "gemm %s m=%d %dx%d bias=%d res=%d alias=%d", ppn_dtype_name(c->dt), c->m, c->rows,
             c->cols, c->bias, c->res, c->alias);
    for (size_t i = 0; i < M * R; i++) tu_check_close(o[i], want[i], tol[i], what, i);
    memcpy(first, o, M * R * 4);
    if (c->alias) memcpy(res, res0, M * R * 4);
    tu_kernel_run(PPN_K_GEMM_TC_L, &p); /* every gemm kernel has the one reference */
    assert_memory_equal(first, o, M * R * 4);
    free(wv), free(bv), free(w), free(b), free(x), free(res), free(out), free(res0), free(first), free(want);
    free(tol);
}

static void test_gemm_reference(void **state)
{
    (void)state;
    for (size_t d = 0; d < TU_LEN(dts); d++) {
        int dt = dts[d];
        gemm_case cs[] = {
            {dt, 3, 37, 133, 0, 0, 0},  {dt, 3, 37, 133, 1, 0, 0},  {dt, 3, 37, 133, 0, 1, 0},
            {dt, 3, 37, 133, 1, 1, 0},  {dt, 3, 37, 133, 1, 1, 1},  {dt, 1, 1, 1, 1, 1, 0},
            {dt, 5, 64, 172, 0, 1, 1},  {dt, 7, 344, 64, 0, 0, 0},  {dt, 2, 9, 4099, 1, 0, 0},
            {dt, 17, 96, 64, 0, 1, 1},  {dt, 33, 40, 256, 1, 1, 1},
        };
        for (size_t i = 0; i < TU_LEN(cs); i++) gemm_case_run(&cs[i]);
    }
}

/* A token's row never depends on the other tokens of the launch: the bits of m = 1 for each. */
static void test_gemm_reference_rows(void **state)
{
    (void)state;
    enum { M = 6, R = 21, C = 40 };
    for (size_t d = 0; d < TU_LEN(dts); d++) {
        void *w = tu_wrand(dts[d], (size_t)R * C, NULL), *b = tu_wrand(dts[d], R, NULL);
        float *x = tu_frand((size_t)M * C, -1, 1), all[M * R], one[R];
        ppn_kp_gemm p = {.out = D(all), .w = D(w), .x = D(x), .bias = D(b), .m = M, .rows = R, .cols = C,
                         .wdt = dts[d]};
        tu_kernel_run(PPN_K_GEMM, &p);
        for (int i = 0; i < M; i++) {
            ppn_kp_gemm q = p;
            q.out = D(one), q.x = D(x + (size_t)i * C), q.m = 1;
            tu_kernel_run(PPN_K_GEMM, &q);
            assert_memory_equal(one, all + (size_t)i * R, sizeof one);
        }
        free(w), free(b), free(x);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the op */

static int dry_off(void **state)
{
    (void)state;
    tu_cap.dry = 0;
    return 0;
}

/* Fake device addresses (dry captures): 256-byte aligned, far apart. */
#define FAKE_OUT ((ppn_dptr)0x100000000000ull)
#define FAKE_W ((ppn_dptr)0x200000000000ull)
#define FAKE_X ((ppn_dptr)0x300000000000ull)

static unsigned tiles(int m, int rows, int bm, int bn)
{
    return (unsigned)(((m + bm - 1) / bm) * (long)((rows + bn - 1) / bn));
}

/* The captured launch is kernel k with its tile's grid, threads and shared memory (kparams.h; gemm_tc_s, which
 * the op never picks, is launched by tests/gpu/test_gpu_gemm.c with the same rule). */
static void expect_launch(int k, int m, int rows)
{
    int bm = PPN_GEMM_SIMT_BM, bn = PPN_GEMM_SIMT_BN;
    unsigned th = PPN_GEMM_SIMT_THREADS, smem = 0;
    if (k == PPN_K_GEMM_TC_L)
        bm = PPN_GEMM_TC_L_BM, bn = PPN_GEMM_TC_L_BN, th = PPN_GEMM_TC_L_THREADS,
        smem = PPN_GEMM_TC_SMEM(bm, bn, PPN_GEMM_TC_L_STAGES);
    if (k == PPN_K_GEMM_TC_M) /* its ring, 48 KB, asked as 80 KB: 2 CTAs an SM (ops_gemm.c) */
        bm = PPN_GEMM_TC_M_BM, bn = PPN_GEMM_TC_M_BN, th = PPN_GEMM_TC_M_THREADS, smem = 80u * 1024u;
    if (k == PPN_K_GEMM_TC_S)
        bm = PPN_GEMM_TC_S_BM, bn = PPN_GEMM_TC_S_BN, th = PPN_GEMM_TC_S_THREADS,
        smem = PPN_GEMM_TC_SMEM(bm, bn, PPN_GEMM_TC_S_STAGES);
    unsigned grid = tiles(m, rows, bm, bn);
    if (k == PPN_K_GEMM_TC_K) /* clusters of 8 CTAs: 8 / KS weight tiles of 64 rows, per 32 tokens */
        th = PPN_GEMM_TC_K_THREADS, smem = PPN_GEMM_TC_K_SMEM(m),
        grid = tiles(m, rows * (int)PPN_GEMM_TC_K_KS(rows), PPN_GEMM_TC_K_MG, PPN_GEMM_TC_K_BN * 8) * 8;
    if (k == PPN_K_GEMM_TC_K16) /* gemm_tc_k's grid; its ring's x rows 64 bf16: 128 bytes (kparams.h) */
        th = PPN_GEMM_TC_K_THREADS,
        smem = PPN_GEMM_TC_K_STAGES(m) * (64u * 64u * 2u + PPN_GEMM_TC_K_MP(m) * 128u),
        grid = tiles(m, rows * (int)PPN_GEMM_TC_K_KS(rows), PPN_GEMM_TC_K_MG, PPN_GEMM_TC_K_BN * 8) * 8;
    if (k == PPN_K_GEMM_TC_KW || k == PPN_K_GEMM_TC_KW16) /* clusters of 8 CTAs: 8 / KW_KS middle tiles of 128 rows,
                                                               * per 64 tokens (kw16: the same, x in bf16) */
        th = PPN_GEMM_TC_M_THREADS, smem = PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES),
        grid = tiles(m, rows * (int)PPN_GEMM_TC_KW_KS(rows), PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN * 8) * 8;
    if (k == PPN_K_GEMM_TC_KWX) /* gemm_tc_kw's grid; its ring holds x too: 3 x (16 KB of W + 64 x 72 floats) */
        th = PPN_GEMM_TC_M_THREADS, smem = 3u * (128u * 64u * 2u + 64u * 72u * 4u),
        grid = tiles(m, rows * (int)PPN_GEMM_TC_KW_KS(rows), PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN * 8) * 8;
    assert_int_equal(tu_cap.l.kernel, k);
    assert_int_equal(tu_cap.l.block[0], th);
    assert_int_equal(tu_cap.l.grid[0], grid);
    assert_int_equal(tu_cap.l.smem, smem);
    if (k == PPN_K_GEMM_TC_KWX) /* above the set's opt-in: the kernel's own */
        assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_TC_KWX], PPN_GEMM_TC_KWX_SMEM);
    else
        assert_true(tu_cap.l.smem <= PPN_DYN_SMEM_MAX);
    tu_expect_geometry(th);
}

static int op_kernel(int dt, int m, int rows, int cols, ppn_dptr w, ppn_dptr x)
{
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, FAKE_OUT, w, dt, x, m, rows, cols, 0, 0), PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    return tu_cap.l.kernel;
}

/* The kernel by shape, dtype and alignment (kernels/ops_gemm.c), and its geometry. */
static void test_gemm_op_choice(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    for (int dt = PPN_DTYPE_BF16; dt <= PPN_DTYPE_F16; dt++) {
        assert_int_equal(op_kernel(dt, 4096, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L);
        expect_launch(PPN_K_GEMM_TC_L, 4096, 2048);
        assert_int_equal(op_kernel(dt, 512, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M); /* 32 large, 64 square */
        expect_launch(PPN_K_GEMM_TC_M, 512, 2048);
        assert_int_equal(op_kernel(dt, 512, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M); /* 64 large tiles */
        assert_int_equal(op_kernel(dt, 512, 128256, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L);
        assert_int_equal(op_kernel(dt, 1024, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L); /* 128 tiles */
        assert_int_equal(op_kernel(dt, 1024, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L); /* 96 large tiles */
        assert_int_equal(op_kernel(dt, 512, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L);  /* 96 */
        assert_int_equal(op_kernel(dt, 512, 5888, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M);  /* 92 */
        /* few tokens (batched decode): the split-K tile built for weight bandwidth, up to 16 or 32 by shape; then
         * the middle tile split over K where its split is 2 or more (up to 264 tiles), up to 64 or 128 tokens */
        assert_int_equal(op_kernel(dt, 16, 128256, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        expect_launch(PPN_K_GEMM_TC_K, 16, 128256);
        assert_int_equal(op_kernel(dt, 17, 128256, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M);
        assert_int_equal(op_kernel(dt, 65, 128256, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L);
        assert_int_equal(op_kernel(dt, 32, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* cols >= 4096 */
        assert_int_equal(op_kernel(dt, 32, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 33, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX);
        assert_int_equal(op_kernel(dt, 32, 16384, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* rows > 8192 */
        assert_int_equal(op_kernel(dt, 16, 4096, 14336, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 17, 4096, 14336, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 128, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* KW_KS 8 */
        assert_int_equal(op_kernel(dt, 256, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 257, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M);
        assert_int_equal(op_kernel(dt, 64, 16384, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 65, 16384, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M); /* KW_KS 4, cols < 4096 */
        assert_int_equal(op_kernel(dt, 128, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* gemm_kw_wide */
        assert_int_equal(op_kernel(dt, 64, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 33, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 33, 6144);
        assert_int_equal(tu_cap.l.grid[0], 48 * 8); /* the 6144 rows' 48 tiles, each over 8 k-ranges */
        assert_int_equal(op_kernel(dt, 64, 4096, 14336, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 64, 4096);
        /* below 4096 rows and up to 64 tokens, x through the ring too (gemm_tc_kwx: the 1B's q|k|v, o, down); from
         * 4096 rows or 65 tokens, gemm_tc_kw */
        assert_int_equal(op_kernel(dt, 128, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 128, 4096);
        assert_int_equal(tu_cap.l.grid[0], 2 * 32 * 8); /* two token groups */
        assert_int_equal(op_kernel(dt, 64, 4095, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX);
        expect_launch(PPN_K_GEMM_TC_KWX, 64, 4095);
        assert_int_equal(tu_cap.l.grid[0], 32 * 8);
        assert_int_equal(op_kernel(dt, 65, 4095, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 65, 4095);
        assert_int_equal(tu_cap.l.grid[0], 2 * 32 * 8);
        assert_int_equal(op_kernel(dt, 65, 2048, 8192, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* 1B down */
        assert_int_equal(op_kernel(dt, 64, 3072, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX); /* 1B q|k|v */
        assert_int_equal(op_kernel(dt, 64, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX); /* 1B o */
        assert_int_equal(op_kernel(dt, 64, 2048, 8192, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX); /* 1B down */
        assert_int_equal(op_kernel(dt, 64, 16384, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* 1B gate|up */
        assert_int_equal(op_kernel(dt, 64, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 64, 28672);
        assert_int_equal(op_kernel(dt, 64, 128256, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_M); /* KW_KS 1 */
        /* up to 256 tokens where fewer than 96 large tiles (the 8B's o, down and q|k|v), up to 512 over sums of 8192
         * columns or more (the down matrices); the 8B's gate|up (224 large tiles at m = 192) up to 192
         * (gemm_kw_wide), then the large tile */
        static const int past128[][4] = {
            {129, 4096, 4096, PPN_K_GEMM_TC_KW},    {192, 4096, 14336, PPN_K_GEMM_TC_KW},
            {257, 4096, 4096, PPN_K_GEMM_TC_M},     {512, 4096, 14336, PPN_K_GEMM_TC_KW},
            {384, 2048, 8192, PPN_K_GEMM_TC_KW},    {513, 4096, 14336, PPN_K_GEMM_TC_M},
            {384, 4096, 8184, PPN_K_GEMM_TC_M},     {192, 28672, 4096, PPN_K_GEMM_TC_KW},
            {193, 28672, 4096, PPN_K_GEMM_TC_L},    {256, 28672, 4096, PPN_K_GEMM_TC_L},
        };
        for (size_t i = 0; i < TU_LEN(past128); i++)
            if (op_kernel(dt, past128[i][0], past128[i][1], past128[i][2], FAKE_W, FAKE_X) != past128[i][3])
                fail_msg("m %d, %d x %d: kernel %s, want %s", past128[i][0], past128[i][1], past128[i][2],
                         ppn_kernels[tu_cap.l.kernel].name, ppn_kernels[past128[i][3]].name);
        assert_int_equal(op_kernel(dt, 256, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW); /* and its launch: */
        expect_launch(PPN_K_GEMM_TC_KW, 256, 6144);
        assert_int_equal(tu_cap.l.grid[0], 4 * 48 * 8); /* four token groups */
        assert_int_equal(op_kernel(dt, 16, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        expect_launch(PPN_K_GEMM_TC_K, 16, 4096);
        /* from 9 tokens, gemm_tc_kw on more than 8192 rows over at least 4096 columns (the 8B's gate|up); the 8B's
         * q|k|v (6144 rows) keeps gemm_tc_k up to 16 */
        assert_int_equal(op_kernel(dt, 8, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 9, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 16, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        expect_launch(PPN_K_GEMM_TC_K, 16, 6144);
        assert_int_equal(op_kernel(dt, 17, 6144, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 16, 8192, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 9, 8200, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 8, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        assert_int_equal(op_kernel(dt, 9, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        assert_int_equal(op_kernel(dt, 16, 28672, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
        expect_launch(PPN_K_GEMM_TC_KW, 16, 28672);
        assert_int_equal(op_kernel(dt, 16, 5888, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);   /* below 6144 rows */
        assert_int_equal(op_kernel(dt, 16, 16384, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);  /* 1B gate|up */
        assert_int_equal(op_kernel(dt, 16, 4096, 14336, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);  /* 8B down */
        assert_int_equal(op_kernel(dt, 16, 128256, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K); /* KW_KS 1 */
        assert_int_equal(op_kernel(dt, 1, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
        expect_launch(PPN_K_GEMM_TC_K, 1, 2048);
        assert_int_equal(op_kernel(dt, 33, 2048, 8192, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX);
        expect_launch(PPN_K_GEMM_TC_KWX, 33, 2048);
        assert_int_equal(tu_cap.l.grid[0], 16 * 8); /* the 2048 rows' 16 middle tiles, each over 8 k-ranges */
        assert_int_equal(PPN_GEMM_TC_KW_KS(128256), 1);
        assert_int_equal(PPN_GEMM_TC_KW_KS(28672), 2);
        assert_int_equal(PPN_GEMM_TC_KW_KS(16384), 4);
        assert_int_equal(PPN_GEMM_TC_KW_KS(6144), 8);
        assert_int_equal(PPN_GEMM_TC_K_KS(128256), 1); /* the k-ranges a weight tile is summed in, by rows */
        assert_int_equal(PPN_GEMM_TC_K_KS(28672), 4);
        assert_int_equal(PPN_GEMM_TC_K_KS(16384), 2);
        assert_int_equal(PPN_GEMM_TC_K_KS(6144), 4);
        assert_int_equal(PPN_GEMM_TC_K_KS(4096), 8);
        assert_int_equal(PPN_GEMM_TC_K_KS(2048), 8);
        /* what the tensor cores cannot take: cols % 8, misaligned w or x */
        assert_int_equal(op_kernel(dt, 64, 64, 172, FAKE_W, FAKE_X), PPN_K_GEMM);
        expect_launch(PPN_K_GEMM, 64, 64);
        assert_int_equal(op_kernel(dt, 4096, 2048, 2044, FAKE_W, FAKE_X), PPN_K_GEMM);
        assert_int_equal(op_kernel(dt, 4096, 2048, 2048, FAKE_W + 8, FAKE_X), PPN_K_GEMM);
        assert_int_equal(op_kernel(dt, 4096, 2048, 2048, FAKE_W, FAKE_X + 4), PPN_K_GEMM);
    }
    assert_int_equal(op_kernel(PPN_DTYPE_F32, 4096, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM);
    expect_launch(PPN_K_GEMM, 4096, 2048);
    tu_cap.dry = 0;
}

/* The tile the caller names (ppn_op_gemm_tile, what tests/gpu/test_gpu_gemm.c compares the tiles with): its
 * geometry, the same accesses as the op's, and the refusals of a non-gemm kernel or a tile the shape cannot take. */
static void test_gemm_op_tile_forced(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 512, .rows = 2048, .cols = 2048,
                     .wdt = PPN_DTYPE_BF16};
    for (int k = PPN_K_GEMM; k <= PPN_K_GEMM_TC_KWX; k++) {
        tu_cap.calls = 0;
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, k, &p), PPN_OK);
        assert_int_equal(tu_cap.calls, 1);
        expect_launch(k, p.m, p.rows);
        assert_int_equal(tu_cap.l.nacc, 3); /* w, x, out: no bias, no res */
    }
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_EMBED, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "not a gemm kernel"));
    ppn_kp_gemm f32 = p, odd = p, mis = p;
    f32.wdt = PPN_DTYPE_F32;
    odd.cols = 2044;
    mis.x = FAKE_X + 4;
    const ppn_kp_gemm *bad[] = {&f32, &odd, &mis};
    for (size_t i = 0; i < TU_LEN(bad); i++) {
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_L, bad[i]), PPN_EINVAL);
        assert_non_null(strstr(ppn_last_error(), "needs 2-byte weights"));
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM, bad[i]), PPN_OK); /* SIMT takes any */
    }
    assert_int_equal(tu_cap.calls, 3); /* the refusals launched nothing */
    for (size_t i = 0; i < TU_LEN(bad); i++) {
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K, bad[i]), PPN_EINVAL);
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_KW, bad[i]), PPN_EINVAL);
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_KWX, bad[i]), PPN_EINVAL);
    }
    assert_int_equal(tu_cap.calls, 3);
    tu_cap.dry = 0;
}

/* gemm_tc_k's and gemm_tc_kw's K split and ring depth: the op resolves them into the params the kernel reads
 * (kparams.h's tables where nothing is named: KS by rows, the depth by m), a forced tile may name them (the grid
 * and shared memory follow), the other tiles get zeros, and a split or depth the kernel does not take is refused
 * before anything is launched. */
static void test_gemm_op_split_knobs(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    const ppn_kp_gemm *q = (const ppn_kp_gemm *)tu_cap.params;
    /* the op's choice at m = 16 (gemm_tc_k) and m = 64 (gemm_tc_kw) on the 8B's o: the tables' values */
    assert_int_equal(op_kernel(PPN_DTYPE_BF16, 16, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_K);
    assert_int_equal(q->ks, (int)PPN_GEMM_TC_K_KS(4096));
    assert_int_equal(q->stages, (int)PPN_GEMM_TC_K_STAGES(16));
    assert_int_equal(op_kernel(PPN_DTYPE_BF16, 64, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KW);
    assert_int_equal(q->ks, (int)PPN_GEMM_TC_KW_KS(4096));
    assert_int_equal(q->stages, (int)PPN_GEMM_TC_KW_STAGES);
    assert_int_equal(op_kernel(PPN_DTYPE_BF16, 4096, 4096, 4096, FAKE_W, FAKE_X), PPN_K_GEMM_TC_L);
    assert_true(q->ks == 0 && q->stages == 0);
    /* forced: every split and depth each tile takes, its grid (clusters of 8: 8 / ks tiles) and ring */
    static const int kss[] = {1, 2, 4, 8}, k_st[] = {3, 4}, kw_st[] = {3};
    for (size_t a = 0; a < TU_LEN(kss); a++) {
        for (size_t b = 0; b < TU_LEN(k_st); b++) {
            int m = 16;
            ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = m, .rows = 4096, .cols = 4096,
                             .wdt = PPN_DTYPE_BF16, .ks = kss[a], .stages = k_st[b]};
            tu_cap.calls = 0;
            assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K, &p), PPN_OK);
            assert_int_equal(tu_cap.calls, 1);
            assert_true(q->ks == kss[a] && q->stages == k_st[b]);
            assert_int_equal(tu_cap.l.grid[0], (4096 / PPN_GEMM_TC_K_BN) * kss[a]);
            assert_int_equal(tu_cap.l.smem, PPN_GEMM_TC_K_SMEM_S(m, k_st[b]));
            assert_true(tu_cap.l.smem <= PPN_DYN_SMEM_MAX);
        }
        for (size_t b = 0; b < TU_LEN(kw_st); b++) {
            ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 64, .rows = 4096, .cols = 4096,
                             .wdt = PPN_DTYPE_BF16, .ks = kss[a], .stages = kw_st[b]};
            assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_KW, &p), PPN_OK);
            assert_true(q->ks == kss[a] && q->stages == kw_st[b]);
            assert_int_equal(tu_cap.l.grid[0], (4096 / PPN_GEMM_TC_M_BN) * kss[a]);
            unsigned ring = (unsigned)kw_st[b] * PPN_GEMM_TC_M_BN * 64u * 2u,
                     mid = PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES);
            assert_int_equal(tu_cap.l.smem, ring > mid ? ring : mid);
            assert_true(tu_cap.l.smem <= PPN_DYN_SMEM_MAX);
        }
        ppn_kp_gemm p2 = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 64, .rows = 4096, .cols = 4096,
                          .wdt = PPN_DTYPE_BF16, .ks = kss[a]};
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_KWX, &p2), PPN_OK);
        assert_true(q->ks == kss[a] && q->stages == (int)PPN_GEMM_TC_KWX_STAGES);
        assert_int_equal(tu_cap.l.grid[0], (4096 / PPN_GEMM_TC_M_BN) * kss[a]);
        assert_int_equal(tu_cap.l.smem, PPN_GEMM_TC_KWX_SMEM);
    }
    /* gemm_tc_kwx (the 1B's o at m = 64) takes gemm_tc_kw's split: a token's bits are the same from either */
    assert_int_equal(op_kernel(PPN_DTYPE_BF16, 64, 2048, 2048, FAKE_W, FAKE_X), PPN_K_GEMM_TC_KWX);
    assert_int_equal(q->ks, (int)PPN_GEMM_TC_KW_KS(2048));
    assert_int_equal(q->stages, (int)PPN_GEMM_TC_KWX_STAGES);
    /* refused, nothing launched: a split that does not divide a cluster, depths not instantiated */
    static const struct { int k, m, ks, stages; const char *what; } bad[] = {
        {PPN_K_GEMM_TC_K, 16, 3, 0, "ks 3"},     {PPN_K_GEMM_TC_K, 16, 16, 0, "ks 16"},
        {PPN_K_GEMM_TC_K, 16, -1, 0, "ks -1"},   {PPN_K_GEMM_TC_K, 16, 0, 5, "stages 5"},
        {PPN_K_GEMM_TC_K, 16, 0, 2, "stages 2"}, {PPN_K_GEMM_TC_K, 16, 0, 6, "stages 6"},
        {PPN_K_GEMM_TC_KW, 64, 6, 0, "ks 6"},    {PPN_K_GEMM_TC_KW, 64, 0, 4, "stages 4"},
        {PPN_K_GEMM_TC_KW, 64, 0, 5, "stages 5"},
        {PPN_K_GEMM_TC_KWX, 64, 5, 0, "ks 5"},    {PPN_K_GEMM_TC_KWX, 64, 0, 4, "stages 4"},
    };
    tu_cap.calls = 0;
    for (size_t i = 0; i < TU_LEN(bad); i++) {
        ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = bad[i].m, .rows = 4096, .cols = 4096,
                         .wdt = PPN_DTYPE_BF16, .ks = bad[i].ks, .stages = bad[i].stages};
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, bad[i].k, &p), PPN_EINVAL);
        if (!strstr(ppn_last_error(), bad[i].what)) fail_msg("'%s' does not name '%s'", ppn_last_error(), bad[i].what);
    }
    assert_int_equal(tu_cap.calls, 0);
    tu_cap.dry = 0;
}

/* Every model shape the prefill walks (q|k|v, o, gate|up, down, lm head of llama-1b and llama-8b; the fixtures'
 * and stories260K's) at chunk sizes 1 .. 4096 is accepted, bf16 / f16 ones on tensor cores (cols % 8 == 0). */
static void test_gemm_op_model_shapes(void **state)
{
    (void)state;
    static const int shapes[][2] = {
        {3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}, {128256, 2048},          /* llama-1b */
        {6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096},         /* llama-8b */
        {96, 64},     {64, 64},     {352, 64},     {64, 176},     {256, 64},  {128, 64},  /* fixtures */
        {64, 128},    {320, 64},    {64, 160},     {256, 64},     {64, 128},              /* fixtures */
        {192, 64},    {344, 64},    {64, 172},     {512, 64},                             /* stories260K */
    };
    static const int ms[] = {1, 7, 16, 64, 512, 4096};
    tu_cap.dry = 1;
    for (size_t s = 0; s < TU_LEN(shapes); s++)
        for (size_t i = 0; i < TU_LEN(ms); i++)
            for (size_t d = 0; d < TU_LEN(dts); d++) {
                int k = op_kernel(dts[d], ms[i], shapes[s][0], shapes[s][1], FAKE_W, FAKE_X);
                int tc = dts[d] != PPN_DTYPE_F32 && shapes[s][1] % 8 == 0;
                assert_int_equal(k != PPN_K_GEMM, tc);
                assert_true(tu_cap.l.smem <= (k == PPN_K_GEMM_TC_KWX ? PPN_GEMM_TC_KWX_SMEM : PPN_DYN_SMEM_MAX));
                tu_expect_geometry(1);
            }
    tu_cap.dry = 0;
}

/* A real launch through the fake device: the params, exactly the declared accesses, and the reference's result. */
static void test_gemm_op_accesses(void **state)
{
    (void)state;
    enum { M = 5, R = 24, C = 32 };
    for (size_t d = 0; d < TU_LEN(dts); d++) {
        int dt = dts[d];
        size_t es = ppn_dtype_size(dt);
        void *w = tu_wrand(dt, (size_t)R * C, NULL), *b = tu_wrand(dt, R, NULL);
        float *x = tu_frand((size_t)M * C, -1, 1), *res = tu_frand((size_t)M * R, -1, 1), out[M * R], ref[M * R];
        ppn_kp_gemm p = {.out = D(ref), .w = D(w), .x = D(x), .bias = D(b), .res = D(res), .m = M, .rows = R,
                         .cols = C, .wdt = dt};
        tu_kernel_run(PPN_K_GEMM, &p);
        tu_cap.calls = 0;
        assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, D(out), D(w), dt, D(x), M, R, C, D(b), D(res)), PPN_OK);
        assert_int_equal(tu_cap.calls, 1);
        const ppn_kp_gemm *q = (const ppn_kp_gemm *)tu_cap.params;
        assert_true(q->out == D(out) && q->w == D(w) && q->x == D(x) && q->bias == D(b) && q->res == D(res));
        assert_true(q->m == M && q->rows == R && q->cols == C && q->wdt == dt);
        assert_int_equal(tu_cap.l.nacc, 5);
        tu_expect_acc(0, w, (size_t)R * C * es, PPN_ACC_R);
        tu_expect_acc(1, x, (size_t)M * C * 4, PPN_ACC_R);
        tu_expect_acc(2, b, (size_t)R * es, PPN_ACC_R);
        tu_expect_acc(3, res, (size_t)M * R * 4, PPN_ACC_R);
        tu_expect_acc(4, out, (size_t)M * R * 4, PPN_ACC_W);
        assert_memory_equal(out, ref, sizeof out);
        /* no bias, no res: only w, x, out; res aliasing out */
        assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, D(out), D(w), dt, D(x), M, R, C, 0, 0), PPN_OK);
        assert_int_equal(tu_cap.l.nacc, 3);
        tu_expect_acc(2, out, (size_t)M * R * 4, PPN_ACC_W);
        assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, D(res), D(w), dt, D(x), M, R, C, 0, D(res)), PPN_OK);
        tu_expect_acc(2, res, (size_t)M * R * 4, PPN_ACC_R);
        tu_expect_acc(3, res, (size_t)M * R * 4, PPN_ACC_W);
        free(w), free(b), free(x), free(res);
    }
}

static void expect_refused(ppn_status st, const char *what)
{
    assert_int_equal(st, PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_gemm"));
    if (!strstr(ppn_last_error(), what)) fail_msg("message '%s' does not name '%s'", ppn_last_error(), what);
}

static void test_gemm_op_refusals(void **state)
{
    (void)state;
    enum { M = 4, R = 8, C = 16 };
    float x[M * C], out[M * R];
    uint16_t w[R * C];
    ppn_gpu *g = &tu_fake;
    ppn_gstream *s = tu_fake_stream;
    int bf = PPN_DTYPE_BF16;
    tu_cap.calls = 0;
    expect_refused(ppn_op_gemm(g, s, D(out), D(w), bf, D(x), 0, R, C, 0, 0), "m must be positive");
    expect_refused(ppn_op_gemm(g, s, D(out), D(w), bf, D(x), M, -1, C, 0, 0), "rows must be positive");
    expect_refused(ppn_op_gemm(g, s, D(out), D(w), bf, D(x), M, R, 0, 0, 0), "cols must be positive");
    expect_refused(ppn_op_gemm(g, s, D(out), D(w), 99, D(x), M, R, C, 0, 0), "dtype 99");
    expect_refused(ppn_op_gemm(g, s, 0, D(w), bf, D(x), M, R, C, 0, 0), "out");
    expect_refused(ppn_op_gemm(g, s, D(out), 0, bf, D(x), M, R, C, 0, 0), "w is a null");
    expect_refused(ppn_op_gemm(g, s, D(out), D(w), bf, 0, M, R, C, 0, 0), "x is a null");
    expect_refused(ppn_op_gemm(g, s, D(x + 8), D(w), bf, D(x), 1, R, C, 0, 0), "overlaps x");
    expect_refused(ppn_op_gemm(g, s, D(x), D(w), bf, D(x), 1, R, C, 0, 0), "overlaps x");
    expect_refused(ppn_op_gemm(g, s, FAKE_OUT, FAKE_W, bf, FAKE_X, 2000000000, 2000000000, 8, 0, 0), "CTAs");
    assert_int_equal(tu_cap.calls, 0);
}


/* ---------------------------------------------------------------------------------------------------------
 * ppn_op_gemm_x16: x given in bf16 (gemm_tc_kw16) where ppn_op_gemm runs the middle split-K tile on bf16 W. */

/* gemm_tc_kw16's layout: a permutation of each 64-element block that puts a thread's fragment elements together
 * (k = 16 s + 8 h + 2 q + e at 16 q + 4 s + 2 h + e), pairs kept whole. */
static void test_gemm_x16_layout(void **state)
{
    (void)state;
    int seen[192] = {0};
    for (int k = 0; k < 192; k++) {
        int p = PPN_X16_POS(k), s = (k >> 4) & 3, h = (k >> 3) & 1, q = (k >> 1) & 3, e = k & 1;
        assert_int_equal(p, (k & ~63) + 16 * q + 4 * s + 2 * h + e);
        assert_true(p / 64 == k / 64);
        seen[p]++;
        if (e) assert_int_equal(p, PPN_X16_POS(k - 1) + 1);
    }
    for (int p = 0; p < 192; p++) assert_int_equal(seen[p], 1);
}

/* The shapes it takes are those where the op picks gemm_tc_kw over whole 64-column blocks, bf16 only. */
static void test_gemm_x16_fits(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    static const int shapes[][3] = {
        {16, 6144, 4096}, {8, 6144, 4096}, {9, 6144, 4096}, {16, 4096, 4096}, {64, 4096, 4096}, {64, 4096, 14336},
        {64, 28672, 4096}, {96, 4096, 4096}, {128, 28672, 4096}, {64, 3072, 2048}, {32, 3072, 2048},
        {33, 3072, 2048}, {65, 3072, 2048}, {192, 4096, 14336}, {256, 6144, 4096}, {257, 4096, 4096},
        {384, 4096, 14336}, {40, 256, 128}, {40, 768, 128}, {33, 128, 384}, {32, 256, 128}, {16, 128256, 2048},
        {65, 128256, 4096}, {512, 4096, 4096}, {1, 6144, 4096}, {40, 256, 136}, {40, 352, 176},
        {16, 28672, 4096}, {9, 28672, 4096}, {17, 6144, 4096},
    };
    int taken = 0;
    for (size_t i = 0; i < TU_LEN(shapes); i++) {
        int m = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2];
        int k = op_kernel(PPN_DTYPE_BF16, m, rows, cols, FAKE_W, FAKE_X);
        int want = k == PPN_K_GEMM_TC_KW && cols % 64 == 0;
        if (ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_BF16) != want)
            fail_msg("m %d, %d x %d: op kernel %s, x16_fits %d", m, rows, cols, ppn_kernels[k].name, !want);
        taken += want;
        assert_false(ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_F16));
        assert_false(ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_F32));
    }
    assert_true(taken >= 5 && taken < (int)TU_LEN(shapes)); /* both answers met */
    assert_false(ppn_op_gemm_x16_fits(64, 3072, 2048, PPN_DTYPE_BF16)); /* gemm_tc_kwx there (the 1B's q|k|v) */
    assert_true(ppn_op_gemm_x16_fits(16, 28672, 4096, PPN_DTYPE_BF16)); /* the 8B's gate|up at B=16 */
    assert_true(ppn_op_gemm_x16_fits(17, 6144, 4096, PPN_DTYPE_BF16));  /* the 8B's q|k|v above 16 rows */
    assert_false(ppn_op_gemm_x16_fits(16, 6144, 4096, PPN_DTYPE_BF16)); /* gemm_tc_k there (gemm_tc_k16) */
    assert_false(ppn_op_gemm_x16_fits(8, 28672, 4096, PPN_DTYPE_BF16));
    assert_false(ppn_op_gemm_x16_fits(0, 28672, 4096, PPN_DTYPE_BF16));
    /* its launch: gemm_tc_kw's grid, split and depth, x declared as m x cols bf16 */
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_x16(&tu_fake, tu_fake_stream, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 17, 6144,
                                     4096, 0, 0), PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    expect_launch(PPN_K_GEMM_TC_KW16, 17, 6144);
    const ppn_kp_gemm *q = (const ppn_kp_gemm *)tu_cap.params;
    assert_true(q->ks == (int)PPN_GEMM_TC_KW_KS(6144) && q->stages == (int)PPN_GEMM_TC_KW_STAGES);
    assert_int_equal(tu_cap.l.nacc, 3);
    assert_true(tu_cap.l.acc[1].ptr == FAKE_X && tu_cap.l.acc[1].bytes == (size_t)17 * 4096 * 2 &&
                tu_cap.l.acc[1].mode == PPN_ACC_R);
    tu_cap.dry = 0;
}

/* The sum order by shape follows the op's kernel (ops_gemm.c's head): gemm_tc_k where it splits K, gemm_tc_kw and
 * gemm_tc_kwx, the prefill tiles (with gemm_tc_k unsplit), the SIMT kernel; and where two m meet it. */
static void test_gemm_sums(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    static const int shapes[][3] = {
        {16, 6144, 4096}, {17, 6144, 4096}, {64, 3072, 2048}, {65, 3072, 2048}, {128, 28672, 4096},
        {192, 28672, 4096}, {193, 28672, 4096}, {16, 128256, 4096}, {64, 128256, 4096}, {512, 4096, 14336},
        {513, 4096, 14336}, {257, 4096, 4096}, {40, 256, 136}, {64, 64, 172}, {1, 2048, 2048}, {20, 512, 64},
    };
    int seen[4] = {0};
    for (int dt = PPN_DTYPE_F32; dt <= PPN_DTYPE_F16; dt++)
        for (size_t i = 0; i < TU_LEN(shapes); i++) {
            int m = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2];
            int k = op_kernel(dt, m, rows, cols, FAKE_W, FAKE_X), want = PPN_GEMM_SUMS_TILE;
            if (k == PPN_K_GEMM) want = PPN_GEMM_SUMS_SIMT;
            else if (k == PPN_K_GEMM_TC_K && PPN_GEMM_TC_K_KS(rows) > 1) want = PPN_GEMM_SUMS_K;
            else if (k == PPN_K_GEMM_TC_KW || k == PPN_K_GEMM_TC_KWX) want = PPN_GEMM_SUMS_KW;
            if (ppn_op_gemm_sums(m, rows, cols, dt) != want)
                fail_msg("m %d, %d x %d, %s: op kernel %s, sums %d, want %d", m, rows, cols, ppn_dtype_name(dt),
                         ppn_kernels[k].name, ppn_op_gemm_sums(m, rows, cols, dt), want);
            seen[want]++;
        }
    for (int i = 0; i < 4; i++) assert_true(seen[i] > 0); /* every order met */
    /* the bounds the gate's batched prime meets: the 8B's q|k|v 16 | 17, its gate|up 192 | 193; the lm head's
     * gemm_tc_k does not split (the tiles' order on both sides of 16) */
    assert_int_equal(ppn_op_gemm_sums(16, 6144, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_K);
    assert_int_equal(ppn_op_gemm_sums(17, 6144, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_KW);
    assert_int_equal(ppn_op_gemm_sums(192, 28672, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_KW);
    assert_int_equal(ppn_op_gemm_sums(193, 28672, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_TILE);
    assert_int_equal(ppn_op_gemm_sums(16, 128256, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_TILE);
    assert_int_equal(ppn_op_gemm_sums(65, 128256, 4096, PPN_DTYPE_BF16), PPN_GEMM_SUMS_TILE);
    assert_int_equal(ppn_op_gemm_sums(16, 6144, 4096, PPN_DTYPE_F32), ppn_op_gemm_sums(4096, 6144, 4096, PPN_DTYPE_F32));
    tu_cap.dry = 0;
}

/* ppn_op_gemm_x16 on case c = {m, rows, cols, bias?, res?} (bf16 W, x rounded into gemm_tc_kw16's layout) runs
 * kernel and gives ppn_op_gemm's sums on the f32 x, byte for byte (one reference here; tests/gpu compares the
 * kernels); the same bytes read as f32 x by the f32 tile, or as bf16 in row order, give other sums. */
static void x16_case(const int *c, int kernel)
{
    int m = c[0], rows = c[1], cols = c[2], f32_tile = kernel == PPN_K_GEMM_TC_K16 ? PPN_K_GEMM_TC_K : PPN_K_GEMM_TC_KW;
    size_t mr = (size_t)m * (size_t)rows, mc = (size_t)m * (size_t)cols;
    assert_true(kernel == PPN_K_GEMM_TC_K16 ? ppn_op_gemm_k16_fits(m, rows, cols, PPN_DTYPE_BF16)
                                            : ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_BF16));
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)rows * (size_t)cols, NULL);
    void *b = tu_wrand(PPN_DTYPE_BF16, rows, NULL);
    float *x = tu_frand(mc, -3, 3), *res = tu_frand(mr, -1, 1), *want = malloc(mr * 4), *got = malloc(mr * 4);
    uint16_t *xh = calloc(mc, 4); /* room for mc floats: its bytes are read as f32 x below */
    assert_true(want && got && xh);
    for (size_t k = 0; k < mc; k++) /* rounded, in gemm_tc_kw16's layout (kparams.h) */
        xh[k - k % (size_t)cols + PPN_X16_POS(k % (size_t)cols)] = ppn_f32_to_bf16(x[k]);
    ppn_dptr bias = c[3] ? D(b) : 0, rs = c[4] ? D(res) : 0;
    assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, D(want), D(w), PPN_DTYPE_BF16, D(x), m, rows, cols, bias,
                                 rs), PPN_OK);
    assert_int_equal(tu_cap.l.kernel, f32_tile);
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_x16(&tu_fake, tu_fake_stream, D(got), D(w), PPN_DTYPE_BF16, D(xh), m, rows, cols,
                                     bias, rs), PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    assert_int_equal(tu_cap.l.kernel, kernel);
    assert_memory_equal(got, want, mr * 4);
    ppn_kp_gemm p = *(const ppn_kp_gemm *)tu_cap.params;
    { /* a device at PPN_TMA's level 1: the same kernel; at 2, its TMA form (gemm_tc_kwt, gemm_tc_k16t): the same grid
       * and sums, W (and gemm_tc_k16t's x) read where the tensor maps say; at 3 gemm_tc_k16t alone (level 2 last: the
       * checks below read its launch) */
        const int tk = kernel == PPN_K_GEMM_TC_KW16 ? PPN_K_GEMM_TC_KWT : PPN_K_GEMM_TC_K16T;
        ppn_launch kl = tu_cap.l;
        ppn_gpu *tg = tu_fake_tma(132);
        static const int levels[] = {1, 3, 2};
        for (int li = 0; li < 3; li++) {
            const int lv = levels[li];
            tu_tma_level = lv;
            memset(got, 0xa5, mr * 4);
            tu_cap.calls = 0;
            assert_int_equal(ppn_op_gemm_x16(tg, (ppn_gstream *)tg, D(got), D(w), PPN_DTYPE_BF16, D(xh), m, rows,
                                             cols, bias, rs), PPN_OK);
            assert_int_equal(tu_cap.calls, 1);
            assert_int_equal(tu_cap.l.kernel, lv == 2 || (lv == 3 && tk == PPN_K_GEMM_TC_K16T) ? tk : kernel);
            assert_memory_equal(got, want, mr * 4);
        }
        tu_tma_level = 1;
        assert_int_equal(tu_cap.l.grid[0], kl.grid[0]);
        assert_int_equal(tu_cap.l.block[0], kl.block[0]);
        assert_int_equal(tu_cap.l.smem, tk == PPN_K_GEMM_TC_KWT ? PPN_GEMM_TC_KWT_SMEM
                                                                : PPN_GEMM_TC_K16T_SMEM_S(m, p.stages));
        union {
            ppn_kp_gemm_tc_kwt w;
            ppn_kp_gemm_tc_k16t k;
        } tp;
        ppn_kp_gemm *tg_p = tk == PPN_K_GEMM_TC_KWT ? &tp.w.g : &tp.k.g;
        assert_int_equal(tu_cap.l.params_size, tk == PPN_K_GEMM_TC_KWT ? sizeof tp.w : sizeof tp.k);
        memcpy(&tp, tu_cap.params, tu_cap.l.params_size);
        assert_int_equal(tg_p->ks, p.ks);
        assert_int_equal(tg_p->stages, p.stages);
        tg_p->w = 0, tg_p->x = tk == PPN_K_GEMM_TC_K16T ? 0 : tg_p->x; /* the operands are read where the maps say */
        memset(got, 0xa5, mr * 4);
        tu_kernel_run(tk, &tp);
        assert_memory_equal(got, want, mr * 4);
        if (tk == PPN_K_GEMM_TC_K16T) { /* an x map whose box is not the kernel's: NaN, never x from elsewhere */
            ppn_kp_gemm_tc_k16t bad = tp.k;
            ppn_tmap_desc xd;
            assert_true(ppn_tmap_sim_decode(&bad.xmap, &xd));
            assert_true(xd.base == D(xh) && xd.box[1] == PPN_GEMM_TC_K_MP(m));
            xd.box[1] += 8;
            ppn_tmap_sim_encode(&xd, &bad.xmap);
            tu_kernel_run(tk, &bad);
            assert_true(isnan(got[0]) && isnan(got[mr - 1]));
        }
        memset(tk == PPN_K_GEMM_TC_KWT ? (void *)&tp.w.wmap : (void *)&tp.k.wmap, 0, sizeof(ppn_tmap)); /* no map: NaN */
        tu_kernel_run(tk, &tp);
        assert_true(isnan(got[0]) && isnan(got[mr - 1]));
        /* forced: on a device without TMA kernels refused; at level 1 taken (a forced tile needs only the kernels) */
        tu_cap.dry = 1;
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, tk, &p), PPN_EUNSUPPORTED);
        tu_cap.calls = 0;
        assert_int_equal(ppn_op_gemm_tile(tg, (ppn_gstream *)tg, tk, &p), PPN_OK);
        assert_int_equal(tu_cap.calls, 1);
        assert_int_equal(tu_cap.l.kernel, tk);
        tu_cap.dry = 0;
    }
    p.out = D(got);
    tu_kernel_run(f32_tile, &p);
    assert_true(memcmp(got, want, mr * 4) != 0);
    for (size_t k = 0; k < mc; k++) xh[k] = ppn_f32_to_bf16(x[k]);
    tu_kernel_run(kernel, &p);
    assert_true(memcmp(got, want, mr * 4) != 0);
    free(w), free(b), free(x), free(res), free(want), free(got), free(xh);
}

/* Its sums are ppn_op_gemm's on the f32 x that was rounded (both on the one reference here; tests/gpu compares
 * the kernels); what it refuses, it refuses before any launch. */
static void test_gemm_x16_values(void **state)
{
    (void)state;
    static const int cs[][5] = {{40, 4096, 128, 1, 0}, {33, 4100, 192, 0, 1}, {64, 6144, 64, 1, 1}};
    for (size_t i = 0; i < TU_LEN(cs); i++) x16_case(cs[i], PPN_K_GEMM_TC_KW16);
    /* refusals: a shape the middle tile does not take, other weights, misaligned or overlapping x, a forced
     * gemm_tc_kw16 on f16 */
    ppn_gpu *g = &tu_fake;
    ppn_gstream *s = tu_fake_stream;
    tu_cap.dry = 1;
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 3072, 2048, 0, 0),
                     PPN_EUNSUPPORTED); /* gemm_tc_kwx there */
    assert_non_null(strstr(ppn_last_error(), "ppn_op_gemm_x16_fits"));
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 512, 4096, 4096, 0, 0),
                     PPN_EUNSUPPORTED); /* a prefill tile */
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_OUT, FAKE_W, PPN_DTYPE_F16, FAKE_X, 16, 28672, 4096, 0, 0),
                     PPN_EUNSUPPORTED);
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X + 8, 16, 28672, 4096, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "16-byte aligned"));
    /* x16 of 16 x 4096 bf16 is 128 KB: out 64 KB in is inside it (as f32 x it would be 256 KB) */
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_X + 65536, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 16, 28672, 4096, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps x"));
    assert_int_equal(ppn_op_gemm_x16(g, s, FAKE_X + 131072, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 16, 28672, 4096, 0, 0),
                     PPN_OK); /* right after it: apart */
    assert_int_equal(tu_cap.calls, 1);
    ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 16, .rows = 6144, .cols = 4096,
                     .wdt = PPN_DTYPE_F16};
    assert_int_equal(ppn_op_gemm_tile(g, s, PPN_K_GEMM_TC_KW16, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "gemm_tc_kw16 takes bf16"));
    p.wdt = PPN_DTYPE_BF16, p.cols = 4104;
    assert_int_equal(ppn_op_gemm_tile(g, s, PPN_K_GEMM_TC_KW16, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "cols % 64 == 0"));
    p.cols = 4096;
    assert_int_equal(ppn_op_gemm_tile(g, s, PPN_K_GEMM_TC_KW16, &p), PPN_OK);
    expect_launch(PPN_K_GEMM_TC_KW16, 16, 6144);
    assert_int_equal(tu_cap.calls, 2);
    tu_cap.dry = 0;
}

/* gemm_tc_k16: where the op picks gemm_tc_k over whole 64-column blocks of bf16 W, ppn_op_gemm_x16 takes bf16 x
 * there too (ppn_op_gemm_k16_fits; the forward takes it), on gemm_tc_k's grid, split and ring depth with a
 * ring of bf16 x rows; its sums are ppn_op_gemm's on the f32 x that was rounded (one reference here; tests/gpu
 * compares the kernels); f16 or cols % 64 are refused by name. */
static void test_gemm_k16(void **state)
{
    (void)state;
    tu_cap.dry = 1;
    static const int shapes[][3] = {
        {16, 4096, 4096}, {16, 4096, 14336}, {8, 6144, 4096}, {1, 6144, 4096}, {16, 6144, 4096}, {16, 128256, 4096},
        {32, 3072, 2048}, {33, 3072, 2048}, {40, 256, 136}, {4, 256, 136}, {64, 4096, 4096}, {512, 4096, 4096},
    };
    int taken = 0;
    for (size_t i = 0; i < TU_LEN(shapes); i++) {
        int m = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2];
        int k = op_kernel(PPN_DTYPE_BF16, m, rows, cols, FAKE_W, FAKE_X);
        int want = k == PPN_K_GEMM_TC_K && cols % 64 == 0;
        if (ppn_op_gemm_k16_fits(m, rows, cols, PPN_DTYPE_BF16) != want)
            fail_msg("m %d, %d x %d: op kernel %s, k16_fits %d", m, rows, cols, ppn_kernels[k].name, !want);
        assert_false(want && ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_BF16)); /* one tile or the other */
        assert_false(ppn_op_gemm_k16_fits(m, rows, cols, PPN_DTYPE_F16));
        taken += want;
        if (!want) continue;
        tu_cap.calls = 0;
        assert_int_equal(ppn_op_gemm_x16(&tu_fake, tu_fake_stream, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, m, rows,
                                         cols, 0, 0), PPN_OK);
        assert_int_equal(tu_cap.calls, 1);
        expect_launch(PPN_K_GEMM_TC_K16, m, rows);
        const ppn_kp_gemm *q = (const ppn_kp_gemm *)tu_cap.params;
        assert_true(q->ks == (int)PPN_GEMM_TC_K_KS(rows) && q->stages == (int)PPN_GEMM_TC_K_STAGES(m));
        assert_true(tu_cap.l.acc[1].ptr == FAKE_X && tu_cap.l.acc[1].bytes == (size_t)m * (size_t)cols * 2);
    }
    assert_true(taken >= 5 && taken < (int)TU_LEN(shapes)); /* both answers met */
    assert_true(ppn_op_gemm_k16_fits(16, 4096, 14336, PPN_DTYPE_BF16)); /* the 8B's down at B=16 */
    ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 16, .rows = 4096, .cols = 4096,
                     .wdt = PPN_DTYPE_F16};
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K16, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "gemm_tc_k16 takes bf16"));
    p.wdt = PPN_DTYPE_BF16, p.cols = 4104;
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K16, &p), PPN_EINVAL);
    p.cols = 4096, p.stages = 5;
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K16, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "stages 5 for ppn_k_gemm_tc_k16"));
    p.stages = 4;
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_K16, &p), PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    assert_int_equal(tu_cap.l.smem, 4u * (64u * 64u * 2u + 16u * 128u));
    tu_cap.dry = 0;
    /* values, with bias and res */
    static const int cs[][5] = {{16, 512, 128, 1, 0}, {5, 256, 192, 0, 1}, {1, 320, 64, 1, 1}};
    for (size_t i = 0; i < TU_LEN(cs); i++) x16_case(cs[i], PPN_K_GEMM_TC_K16);
    /* the 8B's q|k|v at B=16, where the rule sends both x forms to gemm_tc_k (PPN_FUSE 1 and 0 give the same bits) */
    static const int qkv[5] = {16, 6144, 4096, 0, 0};
    x16_case(qkv, PPN_K_GEMM_TC_K16);
}

/* PPN_GEMM_KX=1 (g->gemm_kx; 2: only at some m) on a device that runs TMA kernels: where ppn_op_gemm_x16 takes
 * gemm_tc_kw16 it takes gemm_tc_kx, and ppn_op_gemm_swiglu gemm_swiglu_x: gemm_tc_kw16's K split on clusters of 8
 * CTAs for each group of 128 tokens (not 64), a ring of 4 x (16 KB of W + NX rows of 128 bytes), NX = min(m, 128) rounded up to 16, and the
 * same sums (the one reference here; tests/gpu compares the kernels' bits). Without the flag, or at PPN_TMA=2, or on
 * a device without TMA kernels, the kernels before; gemm_tc_k16's shapes keep it. */
static void kx_geometry(int m, int rows)
{
    const unsigned nx = ((unsigned)(m < 128 ? m : 128) + 15u) & ~15u;
    assert_int_equal(tu_cap.l.block[0], PPN_GEMM_TC_M_THREADS);
    assert_int_equal(tu_cap.l.grid[0], tiles(m, rows * (int)PPN_GEMM_TC_KW_KS(rows), 128, PPN_GEMM_TC_M_BN * 8) * 8);
    assert_int_equal(tu_cap.l.smem, 4u * (128u * 64u * 2u + nx * 128u));
    assert_true(tu_cap.l.smem <= ppn_kernel_set()->smem_max[tu_cap.l.kernel]);
    const ppn_kp_gemm *q = (const ppn_kp_gemm *)tu_cap.params;
    assert_int_equal(q->ks, (int)PPN_GEMM_TC_KW_KS(rows));
    assert_int_equal(q->stages, (int)PPN_GEMM_TC_KX_STAGES);
}

static void test_gemm_kx_choice(void **state)
{
    (void)state;
    ppn_gpu *tg = tu_fake_tma(132);
    ppn_gstream *ts = (ppn_gstream *)tg;
    assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_TC_KX], 4u * (128u * 64u * 2u + 128u * 128u));
    assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_SWIGLU_X], 4u * (128u * 64u * 2u + 128u * 128u));
    /* the model shapes, dry: the 8B's q|k|v, o and down of a 16 + 64-row mixed step, B=64, 17 and 128 rows */
    static const int shapes[][3] = {{80, 6144, 4096}, {80, 4096, 4096}, {80, 4096, 14336}, {64, 4096, 14336},
                                    {17, 6144, 4096}, {128, 6144, 4096}, {100, 4096, 4096}};
    tu_cap.dry = 1;
    for (size_t i = 0; i < TU_LEN(shapes); i++) {
        int m = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2];
        assert_true(ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_BF16));
        for (int kx = 0; kx < 2; kx++)
            for (int lv = 1; lv <= 2; lv++) {
                tg->gemm_kx = kx, tu_tma_level = lv;
                tu_cap.calls = 0;
                assert_int_equal(ppn_op_gemm_x16(tg, ts, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, m, rows, cols, 0,
                                                 0), PPN_OK);
                assert_int_equal(tu_cap.calls, 1);
                int want = lv == 2 ? PPN_K_GEMM_TC_KWT : kx ? PPN_K_GEMM_TC_KX : PPN_K_GEMM_TC_KW16;
                assert_int_equal(tu_cap.l.kernel, want);
                if (want == PPN_K_GEMM_TC_KX) {
                    kx_geometry(m, rows);
                    assert_true(tu_cap.l.acc[1].ptr == FAKE_X && tu_cap.l.acc[1].bytes == (size_t)m * cols * 2u);
                }
            }
        /* a device without TMA kernels never takes it, the flag set or not */
        tu_fake.gemm_kx = 1;
        assert_int_equal(ppn_op_gemm_x16(&tu_fake, tu_fake_stream, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, m, rows,
                                         cols, 0, 0), PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_KW16);
        tu_fake.gemm_kx = 0;
    }
    tu_tma_level = 1;
    /* the 8B's gate|up at 65-192 rows: the middle split-K tile with or without the flag (ops_gemm.c gemm_kw_wide), so
     * the fused SwiGLU takes it (gemm_swiglu_x where gemm_tc_kx runs) and f32 x (PPN_FUSE=0) runs gemm_tc_kw, its
     * bits; past 192 rows the large tile */
    static const int gm[] = {65, 80, 128, 129, 192};
    for (size_t i = 0; i < TU_LEN(gm); i++)
        for (int kx = 0; kx < 2; kx++) {
            tg->gemm_kx = kx;
            assert_true(ppn_op_gemm_swiglu_fits(tg, ts, gm[i], 14336, 4096, PPN_DTYPE_BF16));
            assert_true(ppn_op_gemm_x16_fits(gm[i], 28672, 4096, PPN_DTYPE_BF16));
            assert_int_equal(ppn_op_gemm(tg, ts, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, gm[i], 28672, 4096, 0, 0),
                             PPN_OK);
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_KW);
            assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, gm[i],
                                                14336, 4096), PPN_OK);
            assert_int_equal(tu_cap.l.kernel, kx ? PPN_K_GEMM_SWIGLU_X : PPN_K_GEMM_SWIGLU);
            if (kx) kx_geometry(gm[i], 28672);
        }
    for (int kx = 0; kx < 2; kx++) {
        tg->gemm_kx = kx;
        assert_false(ppn_op_gemm_swiglu_fits(tg, ts, 193, 14336, 4096, PPN_DTYPE_BF16)); /* the large tile */
        assert_false(ppn_op_gemm_x16_fits(193, 28672, 4096, PPN_DTYPE_BF16));
        assert_int_equal(ppn_op_gemm(tg, ts, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 193, 28672, 4096, 0, 0), PPN_OK);
        assert_true(tu_cap.l.kernel == PPN_K_GEMM_TC_L || tu_cap.l.kernel == PPN_K_GEMM_TC_H);
    }
    tu_tma_level = 2; /* PPN_TMA=2's forms come first: no gemm_tc_kx, the split-K tile's TMA form */
    assert_true(ppn_op_gemm_swiglu_fits(tg, ts, 80, 14336, 4096, PPN_DTYPE_BF16));
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 80, 14336,
                                        4096), PPN_OK);
    assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_SWIGLU_T);
    tu_tma_level = 1;
    /* PPN_GEMM_KX=2 (the default): up to 16 and 65-80 tokens (the 8B's down at 64, 80 and 81 rows; gate|up's fused kernel
     * at 16, 17, 80, 81 and 192 rows: gemm_swiglu past 80) */
    tg->gemm_kx = 2;
    tu_cap.dry = 1;
    static const int lv2[][2] = {{64, PPN_K_GEMM_TC_KW16}, {65, PPN_K_GEMM_TC_KX}, {80, PPN_K_GEMM_TC_KX},
                                 {81, PPN_K_GEMM_TC_KW16}};
    for (size_t i = 0; i < TU_LEN(lv2); i++) {
        assert_int_equal(ppn_gemm_kx_takes(tg, lv2[i][0]), lv2[i][1] == PPN_K_GEMM_TC_KX);
        assert_int_equal(ppn_op_gemm_x16(tg, ts, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, lv2[i][0], 4096, 14336, 0, 0),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, lv2[i][1]);
    }
    static const int gu2[][2] = {{16, PPN_K_GEMM_SWIGLU_X}, {17, PPN_K_GEMM_SWIGLU}, {80, PPN_K_GEMM_SWIGLU_X},
                                 {81, PPN_K_GEMM_SWIGLU},   {192, PPN_K_GEMM_SWIGLU}};
    for (size_t i = 0; i < TU_LEN(gu2); i++) {
        assert_true(ppn_op_gemm_swiglu_fits(tg, ts, gu2[i][0], 14336, 4096, PPN_DTYPE_BF16));
        assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, gu2[i][0],
                                            14336, 4096), PPN_OK);
        assert_int_equal(tu_cap.l.kernel, gu2[i][1]);
    }
    assert_false(ppn_op_gemm_swiglu_fits(tg, ts, 193, 14336, 4096, PPN_DTYPE_BF16));
    tg->gemm_kx = 0;
    assert_false(ppn_gemm_kx_takes(tg, 16) || ppn_gemm_kx_takes(tg, 80));
    tg->gemm_kx = 1;
    /* gemm_tc_k16's shape keeps it */
    assert_int_equal(ppn_op_gemm_x16(tg, ts, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 16, 4096, 4096, 0, 0), PPN_OK);
    assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_K16);
    /* forced: refused where the device runs no sm_90a code, taken where it does */
    ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 80, .rows = 4096, .cols = 4096,
                     .wdt = PPN_DTYPE_BF16};
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_KX, &p), PPN_EUNSUPPORTED);
    assert_int_equal(ppn_op_gemm_tile(tg, ts, PPN_K_GEMM_TC_KX, &p), PPN_OK);
    kx_geometry(80, 4096);
    p.stages = 3;
    assert_int_equal(ppn_op_gemm_tile(tg, ts, PPN_K_GEMM_TC_KX, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "stages 3 for ppn_k_gemm_tc_kx"));
    tu_cap.dry = 0;
    /* values: gemm_tc_kw16's sums, byte for byte, with bias and res; gemm_swiglu_x: gemm_swiglu's */
    static const int cs[][5] = {{40, 4096, 128, 1, 0}, {100, 4100, 192, 0, 1}, {128, 4096, 64, 1, 1}};
    for (size_t i = 0; i < TU_LEN(cs); i++) {
        int m = cs[i][0], rows = cs[i][1], cols = cs[i][2];
        size_t mr = (size_t)m * (size_t)rows, mc = (size_t)m * (size_t)cols;
        assert_true(ppn_op_gemm_x16_fits(m, rows, cols, PPN_DTYPE_BF16));
        void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)rows * (size_t)cols, NULL);
        void *b = tu_wrand(PPN_DTYPE_BF16, rows, NULL);
        float *res = tu_frand(mr, -1, 1), *want = malloc(mr * 4), *got = malloc(mr * 4);
        uint16_t *xh = tu_wrand(PPN_DTYPE_BF16, mc, NULL);
        assert_true(want && got);
        ppn_dptr bias = cs[i][3] ? D(b) : 0, rs = cs[i][4] ? D(res) : 0;
        tg->gemm_kx = 0;
        assert_int_equal(ppn_op_gemm_x16(tg, ts, D(want), D(w), PPN_DTYPE_BF16, D(xh), m, rows, cols, bias, rs),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_KW16);
        tg->gemm_kx = 1;
        memset(got, 0xa5, mr * 4);
        assert_int_equal(ppn_op_gemm_x16(tg, ts, D(got), D(w), PPN_DTYPE_BF16, D(xh), m, rows, cols, bias, rs), PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_KX);
        kx_geometry(m, rows);
        assert_memory_equal(got, want, mr * 4);
        if (rows % 128 == 0) { /* gate|up of n = rows / 2 into bf16 */
            int n = rows / 2;
            size_t ob = (size_t)m * (size_t)n * 2u;
            void *sw = malloc(ob), *sx = malloc(ob);
            assert_true(sw && sx);
            tg->gemm_kx = 0;
            assert_int_equal(ppn_op_gemm_swiglu(tg, ts, D(sw), PPN_DTYPE_BF16, D(w), PPN_DTYPE_BF16, D(xh), m, n, cols),
                             PPN_OK);
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_SWIGLU);
            tg->gemm_kx = 1;
            memset(sx, 0xa5, ob);
            assert_int_equal(ppn_op_gemm_swiglu(tg, ts, D(sx), PPN_DTYPE_BF16, D(w), PPN_DTYPE_BF16, D(xh), m, n, cols),
                             PPN_OK);
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_SWIGLU_X);
            kx_geometry(m, rows);
            assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_gemm_swiglu));
            assert_int_equal(((const ppn_kp_gemm_swiglu *)tu_cap.params)->odt, PPN_DTYPE_BF16);
            assert_memory_equal(sx, sw, ob);
            free(sw), free(sx);
        }
        free(w), free(b), free(res), free(want), free(got), free(xh);
    }
    tg->gemm_kx = 0;
}

/* ppn_op_gemm_swiglu (gemm_swiglu: SwiGLU in gemm_tc_kw16's epilogue) on a device that runs TMA kernels: out is
 * ppn_op_gemm_x16 into [m, 2 n] then ppn_op_swiglu_rows_to in either output dtype, byte for byte; one launch on
 * gemm_tc_kw16's grid, split and ring, declaring W, x16 and out. Where it does not fit (no TMA, n % 64, f16) or
 * is given bad operands, it refuses by name before any launch. */
static void test_gemm_swiglu_values(void **state)
{
    (void)state;
    ppn_gpu *tg = tu_fake_tma(132);
    ppn_gstream *ts = (ppn_gstream *)tg;
    static const int cs[][3] = {{40, 2048, 128}, {64, 3072, 64}, {33, 2112, 192}, {48, 4096, 64}};
    for (size_t i = 0; i < TU_LEN(cs); i++)
        for (int bf = 0; bf < 2; bf++) {
            int m = cs[i][0], n = cs[i][1], cols = cs[i][2], odt = bf ? PPN_DTYPE_BF16 : PPN_DTYPE_F32;
            size_t mc = (size_t)m * (size_t)cols, ob = (size_t)m * (size_t)n * (bf ? 2u : 4u);
            assert_true(ppn_op_gemm_x16_fits(m, 2 * n, cols, PPN_DTYPE_BF16));
            assert_true(ppn_op_gemm_swiglu_fits(tg, ts, m, n, cols, PPN_DTYPE_BF16));
            assert_false(ppn_op_gemm_swiglu_fits(&tu_fake, tu_fake_stream, m, n, cols, PPN_DTYPE_BF16));
            void *w = tu_wrand(PPN_DTYPE_BF16, 2u * (size_t)n * (size_t)cols, NULL);
            float *x = tu_frand(mc, -3, 3), *gu = malloc((size_t)m * 2u * (size_t)n * 4u);
            void *want = malloc(ob), *got = malloc(ob);
            uint16_t *xh = malloc(mc * 2u);
            assert_true(gu && want && got && xh);
            for (size_t k = 0; k < mc; k++) /* rounded, in gemm_tc_kw16's layout (kparams.h) */
                xh[k - k % (size_t)cols + PPN_X16_POS(k % (size_t)cols)] = ppn_f32_to_bf16(x[k]);
            assert_int_equal(ppn_op_gemm_x16(&tu_fake, tu_fake_stream, D(gu), D(w), PPN_DTYPE_BF16, D(xh), m, 2 * n,
                                             cols, 0, 0), PPN_OK);
            ppn_launch kw = tu_cap.l;
            ppn_kp_gemm kp = *(const ppn_kp_gemm *)tu_cap.params;
            assert_int_equal(ppn_op_swiglu_rows_to(&tu_fake, tu_fake_stream, D(want), odt, D(gu), n, m), PPN_OK);
            for (int lv = 1; lv <= 2; lv++) { /* PPN_TMA's level 1: gemm_swiglu; 2: gemm_swiglu_t, the same bytes */
                tu_tma_level = lv;
                memset(got, 0xa5, ob);
                tu_cap.calls = 0;
                assert_int_equal(ppn_op_gemm_swiglu(tg, ts, D(got), odt, D(w), PPN_DTYPE_BF16, D(xh), m, n, cols),
                                 PPN_OK);
                assert_int_equal(tu_cap.calls, 1);
                assert_memory_equal(got, want, ob);
                /* one launch on gemm_tc_kw16's geometry and split (level 2: gemm_tc_kwt's ring and mbarriers) */
                assert_int_equal(tu_cap.l.kernel, lv == 2 ? PPN_K_GEMM_SWIGLU_T : PPN_K_GEMM_SWIGLU);
                assert_int_equal(kw.kernel, PPN_K_GEMM_TC_KW16);
                assert_int_equal(tu_cap.l.grid[0], kw.grid[0]);
                assert_int_equal(tu_cap.l.block[0], kw.block[0]);
                assert_int_equal(tu_cap.l.smem, lv == 2 ? PPN_GEMM_TC_KWT_SMEM : kw.smem);
                ppn_kp_gemm_swiglu_t st;
                if (lv == 2) {
                    assert_int_equal(tu_cap.l.params_size, sizeof st);
                    memcpy(&st, tu_cap.params, sizeof st);
                } else {
                    assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_gemm_swiglu));
                    const ppn_kp_gemm_swiglu *sp = (const ppn_kp_gemm_swiglu *)tu_cap.params;
                    st.g = sp->g, st.odt = sp->odt;
                }
                assert_int_equal(st.odt, odt);
                assert_int_equal(st.g.rows, 2 * n);
                assert_int_equal(st.g.ks, kp.ks);
                assert_int_equal(st.g.stages, kp.stages);
                assert_true(st.g.bias == 0 && st.g.res == 0);
                assert_int_equal(tu_cap.l.nacc, 3);
                tu_expect_acc(0, w, 2u * (size_t)n * (size_t)cols * 2u, PPN_ACC_R);
                tu_expect_acc(1, xh, mc * 2u, PPN_ACC_R);
                tu_expect_acc(2, got, ob, PPN_ACC_W);
                if (lv == 2) { /* W is read where its tensor map says; without the map, NaN */
                    st.g.w = 0;
                    memset(got, 0xa5, ob);
                    tu_kernel_run(PPN_K_GEMM_SWIGLU_T, &st);
                    assert_memory_equal(got, want, ob);
                    memset(&st.wmap, 0, sizeof st.wmap);
                    tu_kernel_run(PPN_K_GEMM_SWIGLU_T, &st);
                    assert_true(bf ? ((const uint16_t *)got)[0] == 0x7fc0u : isnan(((const float *)got)[0]));
                }
            }
            tu_tma_level = 1;
            free(w), free(x), free(gu), free(want), free(got), free(xh);
        }
    /* refusals, before any launch */
    tu_cap.dry = 1;
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_swiglu(&tu_fake, tu_fake_stream, FAKE_OUT, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16,
                                        FAKE_X, 64, 2048, 4096), PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_gemm_swiglu_fits"));
    assert_non_null(strstr(ppn_last_error(), "backend fake"));
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 2080,
                                        4096), PPN_EUNSUPPORTED); /* n % 64 */
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_F16, FAKE_X, 64, 2048,
                                        4096), PPN_EUNSUPPORTED);
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 8, 7168,
                                        4096), PPN_EUNSUPPORTED); /* gemm_tc_k's m */
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_F16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 2048,
                                        4096), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "output dtype"));
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT + 8, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 2048,
                                        4096), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "16-byte aligned"));
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, 0, 64, 2048, 4096),
                     PPN_EINVAL);
    /* x16 of 64 x 4096 bf16 is 512 KB: out at 256 KB in overlaps it; right after it is apart */
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_X + 262144, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64,
                                        2048, 4096), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps x16"));
    assert_int_equal(tu_cap.calls, 0);
    assert_int_equal(ppn_op_gemm_swiglu(tg, ts, FAKE_X + 524288, PPN_DTYPE_BF16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64,
                                        2048, 4096), PPN_OK);
    assert_int_equal(tu_cap.calls, 1);
    tu_cap.dry = 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * gemm_tc_h: the large tile behind the tensor memory accelerator, on a fake device that says it runs TMA kernels
 * and encodes maps the sim's way (so the CPU reference reads the operands through them). */

/* tu_fake_tma (tests/util/tkern.h) on 132 SMs, its encoder honest. */
static ppn_gpu *tma_fake;
static ppn_gstream *tma_stream(void)
{
    tma_fake = tu_fake_tma(132);
    tu_tma_shift = 0;
    return (ppn_gstream *)tma_fake;
}

static void expect_map(const ppn_tmap *map, ppn_dptr base, int es, int cols, int rows, unsigned b0, unsigned b1)
{
    ppn_tmap_desc d;
    assert_true(ppn_tmap_sim_decode(map, &d));
    assert_true(d.base == base && d.elem_bytes == es && d.dim[0] == (uint64_t)cols && d.dim[1] == (uint64_t)rows);
    assert_true(d.row_bytes == (uint64_t)cols * (uint64_t)es && d.box[0] == b0 && d.box[1] == b1);
}

/* Where the device runs TMA kernels the large tile is gemm_tc_h (every other choice unchanged): its grid,
 * threads and shared memory (past the set's opt-in: its own, ktable.c), and its maps of x and W. */
static void test_gemm_tc_h_choice(void **state)
{
    (void)state;
    ppn_gstream *s = tma_stream();
    tu_cap.dry = 1;
    static const int shapes[][5] = {
        /* m, rows, cols, the kernel without TMA, with it (on 132 SMs; ops_gemm.c's gemm_h_wins: gemm_tc_l on one
         * wave of tiles over fewer than 8192 columns) */
        {4096, 28672, 4096, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H}, /* more tiles than SMs */
        {2048, 4096, 4096, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H},  /* 8B o, 256 tiles */
        {1024, 4096, 4096, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_L},  /* 8B o, 128 tiles: gemm_tc_l */
        {1024, 4096, 14336, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H}, /* 8B down, 128 tiles over a long sum */
        {2048, 2048, 8192, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H},  /* 1B down */
        {2048, 2048, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_L},  /* 1B o: 128 tiles over 2048 columns */
        {4096, 2048, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H},  /* 256 tiles: more than a wave */
        {1024, 16384, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H}, /* 512 tiles */
        {1024, 16896, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H}, {2048, 2304, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H},
        {2048, 2048, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_L}, /* 144 tiles: h; 128: l */
        {512, 128256, 2048, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H}, {128, 28672, 4096, PPN_K_GEMM_TC_KW, PPN_K_GEMM_TC_KW},
        {512, 6144, 4096, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_L},   /* 96 tiles: large, one wave */
        {193, 28672, 4096, PPN_K_GEMM_TC_L, PPN_K_GEMM_TC_H},  /* 224 tiles, past gemm_kw_wide's 192 rows */
        {512, 2048, 2048, PPN_K_GEMM_TC_M, PPN_K_GEMM_TC_M},   {512, 4096, 4096, PPN_K_GEMM_TC_M, PPN_K_GEMM_TC_M},
        {16, 4096, 4096, PPN_K_GEMM_TC_K, PPN_K_GEMM_TC_K},    {64, 4096, 4096, PPN_K_GEMM_TC_KW, PPN_K_GEMM_TC_KW},
        {4096, 2048, 2047, PPN_K_GEMM, PPN_K_GEMM}};
    for (int dt = PPN_DTYPE_BF16; dt <= PPN_DTYPE_F16; dt++)
        for (size_t i = 0; i < TU_LEN(shapes); i++) {
            int m = shapes[i][0], rows = shapes[i][1], cols = shapes[i][2], plain = shapes[i][3], tma = shapes[i][4];
            assert_int_equal(op_kernel(dt, m, rows, cols, FAKE_W, FAKE_X), plain); /* tu_fake: no TMA */
            tu_cap.calls = 0;
            assert_int_equal(ppn_op_gemm(tma_fake, s, FAKE_OUT, FAKE_W, dt, FAKE_X, m, rows, cols, 0, 0), PPN_OK);
            assert_int_equal(tu_cap.calls, 1);
            if (tma != PPN_K_GEMM_TC_H) {
                assert_int_equal(tu_cap.l.kernel, tma);
                continue;
            }
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_H);
            assert_int_equal(tu_cap.l.block[0], PPN_GEMM_TC_H_THREADS);
            unsigned nt = tiles(m, rows, PPN_GEMM_TC_H_BM, PPN_GEMM_TC_H_BN); /* persistent: one CTA an SM */
            assert_int_equal(tu_cap.l.grid[0], nt < 132 ? nt : 132);
            assert_int_equal(tu_cap.l.smem, PPN_GEMM_TC_H_SMEM);
            assert_true(PPN_GEMM_TC_H_SMEM > PPN_DYN_SMEM_MAX && PPN_GEMM_TC_H_SMEM <= 227u * 1024u);
            assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_TC_H], PPN_GEMM_TC_H_SMEM);
            assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_gemm_tc_h));
            const ppn_kp_gemm_tc_h *q = (const ppn_kp_gemm_tc_h *)tu_cap.params;
            assert_true(q->g.out == FAKE_OUT && q->g.w == FAKE_W && q->g.x == FAKE_X && q->g.m == m &&
                        q->g.rows == rows && q->g.cols == cols && q->g.wdt == dt && q->g.ctas == (int)tu_cap.l.grid[0]);
            expect_map(&q->xmap, FAKE_X, 4, cols, m, PPN_GEMM_TC_H_XBOX, PPN_GEMM_TC_H_BM);
            expect_map(&q->wmap, FAKE_W, 2, cols, rows, PPN_GEMM_TC_H_BK, PPN_GEMM_TC_H_BN);
            tu_expect_geometry(PPN_GEMM_TC_H_THREADS);
        }
    /* forced: the caller's CTA count, capped at the tiles; a negative one refused */
    static const int want[][3] = {{1, 4096, 1}, {7, 4096, 7}, {500, 4096, 256}, {0, 4096, 132}, {0, 256, 16}};
    for (size_t i = 0; i < TU_LEN(want); i++) {
        ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = want[i][1], .rows = 2048, .cols = 2048,
                         .wdt = PPN_DTYPE_BF16, .ctas = want[i][0]};
        assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_H, &p), PPN_OK);
        assert_int_equal(tu_cap.l.grid[0], want[i][2]);
        assert_int_equal(((const ppn_kp_gemm_tc_h *)tu_cap.params)->g.ctas, want[i][2]);
    }
    ppn_kp_gemm p = {.out = FAKE_OUT, .w = FAKE_W, .x = FAKE_X, .m = 256, .rows = 2048, .cols = 2048,
                     .wdt = PPN_DTYPE_BF16, .ctas = -1};
    assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_H, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ctas -1"));
    tu_cap.dry = 0;
}

/* Forced on odd shapes (partial tiles in every direction, bias, res, res aliasing out): the same bits as
 * gemm_tc_l's, read through the maps; an encoder whose maps point 16 bytes off gives other sums, and a shape the
 * maps do not match gives NaN (the reference refuses to guess). Without TMA the tile is refused by name. */
static void test_gemm_tc_h_values(void **state)
{
    (void)state;
    ppn_gstream *s = tma_stream();
    tu_cap.dry = 0;
    static const int cs[][5] = {{70, 300, 72, 1, 0}, {129, 257, 136, 0, 1}, {1, 8, 8, 1, 1}, {300, 513, 64, 1, 1}};
    for (int dt = PPN_DTYPE_BF16; dt <= PPN_DTYPE_F16; dt++)
        for (size_t i = 0; i < TU_LEN(cs); i++) {
            int m = cs[i][0], rows = cs[i][1], cols = cs[i][2];
            size_t mr = (size_t)m * (size_t)rows;
            /* 16 bytes of slack after x and W: the broken encoder's maps below stay inside the buffers */
            void *w = tu_wrand(dt, (size_t)rows * (size_t)cols + 8, NULL), *b = tu_wrand(dt, (size_t)rows, NULL);
            float *x = tu_frand((size_t)m * (size_t)cols + 4, -2, 2), *res = tu_frand(mr, -1, 1);
            float *want = malloc(mr * 4), *got = malloc(mr * 4), *res0 = malloc(mr * 4);
            assert_true(want && got && res0);
            memcpy(res0, res, mr * 4);
            int alias = (int)(i % 2);
            ppn_kp_gemm p = {.out = D(alias ? res : want), .w = D(w), .x = D(x), .bias = cs[i][3] ? D(b) : 0,
                             .res = cs[i][4] || alias ? D(res) : 0, .m = m, .rows = rows, .cols = cols, .wdt = dt};
            assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_L, &p), PPN_OK);
            if (alias) memcpy(want, res, mr * 4), memcpy(res, res0, mr * 4);
            if (!alias) p.out = D(got);
            assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_H, &p), PPN_OK);
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_H);
            if (alias) memcpy(got, res, mr * 4), memcpy(res, res0, mr * 4);
            assert_memory_equal(got, want, mr * 4);
            /* the maps are what the reference reads: 16 bytes off, other sums */
            tu_tma_shift = 16;
            if (!alias) {
                assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_H, &p), PPN_OK);
                assert_true(memcmp(got, want, mr * 4) != 0);
            }
            tu_tma_shift = 0;
            /* a map of another shape than the launch's: NaN everywhere */
            ppn_kp_gemm_tc_h hp;
            memcpy(&hp, tu_cap.params, sizeof hp);
            ppn_tmap_desc xd;
            assert_true(ppn_tmap_sim_decode(&hp.xmap, &xd));
            xd.dim[1] += 1;
            ppn_tmap_sim_encode(&xd, &hp.xmap);
            hp.g.out = D(got), hp.g.res = 0;
            tu_kernel_run(PPN_K_GEMM_TC_H, &hp);
            for (size_t k = 0; k < mr; k++) assert_true(isnan(got[k]));
            free(w), free(b), free(x), free(res), free(want), free(got), free(res0);
        }
    /* refused without TMA, and for what no tensor-core tile takes */
    float xx[64], oo[64];
    uint16_t ww[64];
    ppn_kp_gemm p = {.out = D(oo), .w = D(ww), .x = D(xx), .m = 8, .rows = 8, .cols = 8, .wdt = PPN_DTYPE_BF16};
    tu_cap.calls = 0;
    assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_H, &p), PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "gemm_tc_h"));
    p.wdt = PPN_DTYPE_F32;
    assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_H, &p), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "2-byte weights"));
    assert_int_equal(tu_cap.calls, 0);
}

/* gemm_tc_w (ppn_op_gemm_rows16): x in bf16 row-major gives the bits the f32 x it rounds gives every tile (the sim's
 * reference is the tiles' one sum); its form by m (kparams.h: token tile, warpgroups, ring), grid (weight tiles x
 * token tiles), its own shared memory past the set's opt-in, and its maps, which are what the reference reads (16
 * bytes off: other sums; a box that is not its form's: NaN). Refused without TMA kernels, for f32 weights, cols not
 * a multiple of 64, unaligned x and an out that overlaps x. */
static void test_gemm_tc_w(void **state)
{
    (void)state;
    ppn_gstream *s = tma_stream();
    tu_cap.dry = 0;
    static const int cs[][5] = {{1, 200, 128, 1, 0},  {17, 130, 64, 0, 1},   {33, 64, 192, 1, 1}, {64, 300, 128, 0, 0},
                                {65, 129, 64, 1, 1}, {128, 72, 128, 0, 1}, {129, 200, 64, 1, 0}, {300, 257, 128, 1, 1}};
    for (size_t i = 0; i < TU_LEN(cs); i++) {
        int m = cs[i][0], rows = cs[i][1], cols = cs[i][2];
        size_t mr = (size_t)m * (size_t)rows, mc = (size_t)m * (size_t)cols;
        void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)rows * (size_t)cols + 8, NULL);
        void *b = tu_wrand(PPN_DTYPE_BF16, (size_t)rows, NULL);
        float *x = tu_frand(mc, -2, 2), *res = tu_frand(mr, -1, 1), *want = malloc(mr * 4), *got = malloc(mr * 4);
        uint16_t *xr = calloc(mc + 8, 2);
        assert_true(want && got && xr);
        for (size_t k = 0; k < mc; k++) xr[k] = ppn_f32_to_bf16(x[k]);
        ppn_dptr bias = cs[i][3] ? D(b) : 0, rs = cs[i][4] ? D(res) : 0;
        assert_int_equal(ppn_op_gemm(&tu_fake, tu_fake_stream, D(want), D(w), PPN_DTYPE_BF16, D(x), m, rows, cols,
                                     bias, rs), PPN_OK);
        memset(got, 0xa5, mr * 4);
        tu_cap.calls = 0;
        assert_true(ppn_op_gemm_rows16_fits(tma_fake, s, m, rows, cols, PPN_DTYPE_BF16));
        assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, D(got), D(w), PPN_DTYPE_BF16, D(xr), m, rows, cols, bias, rs),
                         PPN_OK);
        assert_int_equal(tu_cap.calls, 1);
        assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_TC_W);
        assert_memory_equal(got, want, mr * 4);
        const int bt = PPN_GEMM_TC_W_BT(m), bm = PPN_GEMM_TC_W_BM(m);
        assert_int_equal(bt, m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256);
        assert_int_equal(tu_cap.l.grid[0], (unsigned)((rows + bm - 1) / bm * ((m + bt - 1) / bt)));
        assert_int_equal(tu_cap.l.block[0], (unsigned)(bm * 2 + 32));
        assert_int_equal(tu_cap.l.smem, PPN_GEMM_TC_W_SMEM(m));
        assert_true(tu_cap.l.smem > PPN_DYN_SMEM_MAX && tu_cap.l.smem <= PPN_GEMM_TC_W_SMEM_MAX);
        assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_gemm_tc_w));
        ppn_kp_gemm_tc_w wp;
        memcpy(&wp, tu_cap.params, sizeof wp);
        expect_map(&wp.xmap, D(xr), 2, cols, m, 64, (unsigned)bt);
        expect_map(&wp.wmap, D(w), 2, cols, rows, 64, 64);
        tu_expect_geometry(bm * 2 + 32);
        /* the maps are what the reference reads: 16 bytes off, other sums; x's box not the form's, NaN */
        tu_tma_shift = 16;
        assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, D(got), D(w), PPN_DTYPE_BF16, D(xr), m, rows, cols, bias, rs),
                         PPN_OK);
        assert_true(memcmp(got, want, mr * 4) != 0);
        tu_tma_shift = 0;
        ppn_tmap_desc xd;
        assert_true(ppn_tmap_sim_decode(&wp.xmap, &xd));
        xd.box[1] = (unsigned)(bt == 32 ? 64 : bt / 2);
        ppn_tmap_sim_encode(&xd, &wp.xmap);
        tu_kernel_run(PPN_K_GEMM_TC_W, &wp);
        assert_true(isnan(got[0]) && isnan(got[mr - 1]));
        /* forced: the same launch; on a device without TMA kernels refused */
        ppn_kp_gemm p = {.out = D(got), .w = D(w), .x = D(xr), .bias = bias, .res = rs, .m = m, .rows = rows,
                         .cols = cols, .wdt = PPN_DTYPE_BF16};
        memset(got, 0xa5, mr * 4);
        assert_int_equal(ppn_op_gemm_tile(tma_fake, s, PPN_K_GEMM_TC_W, &p), PPN_OK);
        assert_memory_equal(got, want, mr * 4);
        tu_cap.calls = 0;
        assert_int_equal(ppn_op_gemm_tile(&tu_fake, tu_fake_stream, PPN_K_GEMM_TC_W, &p), PPN_EUNSUPPORTED);
        assert_int_equal(ppn_op_gemm_rows16(&tu_fake, tu_fake_stream, D(got), D(w), PPN_DTYPE_BF16, D(xr), m, rows,
                                            cols, bias, rs), PPN_EUNSUPPORTED);
        assert_non_null(strstr(ppn_last_error(), "ppn_op_gemm_rows16"));
        assert_int_equal(tu_cap.calls, 0);
        free(w), free(b), free(x), free(res), free(want), free(got), free(xr);
    }
    assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_TC_W], PPN_GEMM_TC_W_SMEM_MAX);
    assert_true(PPN_GEMM_TC_W_SMEM_MAX <= 227u * 1024u);
    static const int ms[] = {1, 32, 33, 64, 65, 128, 129, 256, 2048};
    for (size_t i = 0; i < TU_LEN(ms); i++) assert_true(PPN_GEMM_TC_W_SMEM(ms[i]) <= PPN_GEMM_TC_W_SMEM_MAX);
    /* refusals, each naming its culprit, nothing launched */
    tu_cap.dry = 1;
    tu_cap.calls = 0;
    assert_false(ppn_op_gemm_rows16_fits(tma_fake, s, 64, 128, 64, PPN_DTYPE_F16));
    assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, FAKE_OUT, FAKE_W, PPN_DTYPE_F32, FAKE_X, 64, 128, 64, 0, 0),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "f32 weights"));
    assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 128, 72, 0, 0),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "cols 72"));
    assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X + 8, 64, 128, 64, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "16-byte aligned"));
    assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, FAKE_X + 64, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64, 128, 64, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps x"));
    assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, FAKE_OUT, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 0, 128, 64, 0, 0),
                     PPN_EINVAL);
    assert_int_equal(tu_cap.calls, 0);
    tu_cap.dry = 0;
}

/* gemm_swiglu_w (ppn_op_gemm_swiglu_rows16): gemm_tc_w over a gate|up matrix with SwiGLU in its epilogue gives the
 * bytes of ppn_op_gemm_rows16 into [m, 2 n] f32 then swiglu rows, in every output form (f32, bf16 row-major, bf16 in
 * gemm_tc_kw16's layout); its form by m (kparams.h: 32, 64 or 128 tokens, a ring two CTAs share an SM), its grid (n /
 * 64 column tiles x token tiles), 288 threads, its own shared memory past the set's opt-in, its declared accesses and
 * its maps, which are what the reference reads (16 bytes off: other bytes; x's box not the form's: NaN). Refused past
 * 128 tokens, without TMA kernels, for f32 weights, n or cols not multiples of 64, unaligned or overlapping buffers and
 * a bad output form, each naming its culprit, nothing launched. */
static void test_gemm_swiglu_w(void **state)
{
    (void)state;
    ppn_gstream *s = tma_stream();
    tu_cap.dry = 0;
    static const int cs[][3] = {{1, 64, 64}, {17, 128, 128}, {33, 192, 64}, {64, 64, 192}, {65, 128, 64},
                                {128, 192, 128}};
    static const int odts[] = {PPN_DTYPE_F32, PPN_ODT_BF16_ROWS, PPN_DTYPE_BF16};
    for (size_t i = 0; i < TU_LEN(cs); i++)
        for (size_t o = 0; o < TU_LEN(odts); o++) {
            int m = cs[i][0], n = cs[i][1], cols = cs[i][2], odt = odts[o];
            size_t mc = (size_t)m * (size_t)cols, ob = (size_t)m * (size_t)n * (odt == PPN_DTYPE_F32 ? 4u : 2u);
            void *w = tu_wrand(PPN_DTYPE_BF16, 2u * (size_t)n * (size_t)cols + 8, NULL);
            float *x = tu_frand(mc, -3, 3), *gu = malloc((size_t)m * 2u * (size_t)n * 4u);
            void *want = malloc(ob), *got = malloc(ob);
            uint16_t *xr = calloc(mc + 8, 2);
            assert_true(gu && want && got && xr);
            for (size_t k = 0; k < mc; k++) xr[k] = ppn_f32_to_bf16(x[k]);
            assert_int_equal(ppn_op_gemm_rows16(tma_fake, s, D(gu), D(w), PPN_DTYPE_BF16, D(xr), m, 2 * n, cols, 0, 0),
                             PPN_OK);
            assert_int_equal(ppn_op_swiglu_rows_to(tma_fake, s, D(want), odt, D(gu), n, m), PPN_OK);
            memset(got, 0xa5, ob);
            tu_cap.calls = 0;
            assert_true(ppn_op_gemm_swiglu_rows16_fits(tma_fake, s, m, n, cols, PPN_DTYPE_BF16));
            assert_false(ppn_op_gemm_swiglu_rows16_fits(&tu_fake, tu_fake_stream, m, n, cols, PPN_DTYPE_BF16));
            assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, D(got), odt, D(w), PPN_DTYPE_BF16, D(xr), m, n,
                                                       cols), PPN_OK);
            assert_int_equal(tu_cap.calls, 1);
            assert_int_equal(tu_cap.l.kernel, PPN_K_GEMM_SWIGLU_W);
            assert_memory_equal(got, want, ob);
            const int bt = PPN_GEMM_SWIGLU_W_BT(m);
            assert_int_equal(bt, m <= 32 ? 32 : m <= 64 ? 64 : 128);
            assert_int_equal(tu_cap.l.grid[0], (unsigned)(n / 64 * ((m + bt - 1) / bt)));
            assert_int_equal(tu_cap.l.block[0], 288u);
            assert_int_equal(tu_cap.l.smem, PPN_GEMM_SWIGLU_W_SMEM(m));
            assert_true(tu_cap.l.smem > PPN_DYN_SMEM_MAX && tu_cap.l.smem <= PPN_GEMM_SWIGLU_W_SMEM_MAX);
            tu_expect_geometry(288u);
            assert_int_equal(tu_cap.l.params_size, sizeof(ppn_kp_gemm_swiglu_w));
            ppn_kp_gemm_swiglu_w wp;
            memcpy(&wp, tu_cap.params, sizeof wp);
            assert_int_equal(wp.odt, odt);
            assert_true(wp.g.rows == 2 * n && wp.g.m == m && wp.g.cols == cols && !wp.g.bias && !wp.g.res);
            expect_map(&wp.xmap, D(xr), 2, cols, m, 64, (unsigned)bt);
            expect_map(&wp.wmap, D(w), 2, cols, 2 * n, 64, 64);
            assert_int_equal(tu_cap.l.nacc, 3);
            tu_expect_acc(0, w, 2u * (size_t)n * (size_t)cols * 2u, PPN_ACC_R);
            tu_expect_acc(1, xr, mc * 2u, PPN_ACC_R);
            tu_expect_acc(2, got, ob, PPN_ACC_W);
            /* the maps are what the reference reads: 16 bytes off, other bytes; x's box not the form's, NaN */
            tu_tma_shift = 16;
            assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, D(got), odt, D(w), PPN_DTYPE_BF16, D(xr), m, n,
                                                       cols), PPN_OK);
            assert_true(memcmp(got, want, ob) != 0);
            tu_tma_shift = 0;
            ppn_tmap_desc xd;
            assert_true(ppn_tmap_sim_decode(&wp.xmap, &xd));
            xd.box[1] = (unsigned)(bt == 32 ? 64 : bt / 2);
            ppn_tmap_sim_encode(&xd, &wp.xmap);
            tu_kernel_run(PPN_K_GEMM_SWIGLU_W, &wp);
            assert_true(odt == PPN_DTYPE_F32 ? isnan(((const float *)got)[0]) : ((const uint16_t *)got)[0] == 0x7fc0u);
            free(w), free(x), free(gu), free(want), free(got), free(xr);
        }
    assert_int_equal(ppn_kernel_set()->smem_max[PPN_K_GEMM_SWIGLU_W], PPN_GEMM_SWIGLU_W_SMEM_MAX);
    /* the forward's rule: where PPN_GEMM_W's level takes the 2 n-row GEMM, it fits and PPN_GEMM_W_SWIGLU is on (the
     * 8B's gate|up at level 4: not at 16 rows, where the op runs gemm_tc_kx; at 17-64 and 81-128; not past 128); at 2
     * also where level 4 leaves the op's gemm_tc_kx and level 2 takes (16 and 65-80), not below 16 (level 2's rule),
     * and not where level 4 leaves the op's gemm_tc_k (the 1B's gate|up at 16 rows) */
    tma_fake->gemm_w = 4, tma_fake->gemm_kx = 2, tma_fake->gemm_w_swiglu = 1;
    static const struct { int m, want; } gu[] = {{16, 0}, {17, 1}, {64, 1}, {80, 0}, {81, 1}, {128, 1}, {129, 0}};
    for (size_t i = 0; i < TU_LEN(gu); i++) {
        const int m = gu[i].m;
        assert_int_equal(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, m, 14336, 4096, PPN_DTYPE_BF16), gu[i].want);
        assert_int_equal(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, m, 14336, 4096, PPN_DTYPE_BF16),
                         ppn_op_gemm_rows16_takes(tma_fake, s, m, 28672, 4096, PPN_DTYPE_BF16) && m <= 128);
    }
    tma_fake->gemm_w_swiglu = 2;
    static const struct { int m, want; } gu2[] = {{8, 0}, {15, 0}, {16, 1}, {17, 1}, {65, 1}, {80, 1}, {128, 1}, {129, 0}};
    for (size_t i = 0; i < TU_LEN(gu2); i++)
        assert_int_equal(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, gu2[i].m, 14336, 4096, PPN_DTYPE_BF16),
                         gu2[i].want);
    assert_false(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 16, 8192, 2048, PPN_DTYPE_BF16)); /* 1B: gemm_tc_k */
    assert_true(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 17, 8192, 2048, PPN_DTYPE_BF16));
    tma_fake->gemm_w = 2; /* level 2 takes it at 16 already: 2 changes nothing there */
    assert_true(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 16, 14336, 4096, PPN_DTYPE_BF16));
    tma_fake->gemm_w = 3;
    assert_false(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 16, 14336, 4096, PPN_DTYPE_BF16));
    tma_fake->gemm_w = 4;
    tma_fake->gemm_w_swiglu = 0;
    assert_false(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 100, 14336, 4096, PPN_DTYPE_BF16));
    assert_true(ppn_op_gemm_swiglu_rows16_fits(tma_fake, s, 100, 14336, 4096, PPN_DTYPE_BF16));
    tma_fake->gemm_w_swiglu = 1;
    tma_fake->gemm_w = 3; /* prompt chunks only: never at up to 128 rows */
    assert_false(ppn_op_gemm_swiglu_rows16_takes(tma_fake, s, 100, 14336, 4096, PPN_DTYPE_BF16));
    assert_false(ppn_op_gemm_swiglu_rows16_takes(NULL, s, 100, 14336, 4096, PPN_DTYPE_BF16));
    tma_fake->gemm_w = 0, tma_fake->gemm_kx = 0, tma_fake->gemm_w_swiglu = 0; /* the fake's own, for the tests after */
    for (int m = 1; m <= PPN_GEMM_SWIGLU_W_MAX_M; m++) /* each form's ring: two CTAs an SM (228 KB, 1 KB each kept) */
        assert_true(PPN_GEMM_SWIGLU_W_SMEM(m) <= PPN_GEMM_SWIGLU_W_SMEM_MAX &&
                    2u * (PPN_GEMM_SWIGLU_W_SMEM(m) + 1024u) <= 228u * 1024u);
    /* refusals, each naming its culprit, nothing launched */
    tu_cap.dry = 1;
    tu_cap.calls = 0;
    assert_false(ppn_op_gemm_swiglu_rows16_fits(tma_fake, s, 129, 128, 64, PPN_DTYPE_BF16));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X,
                                               129, 128, 64), PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "m 129"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(&tu_fake, tu_fake_stream, FAKE_OUT, PPN_DTYPE_F32, FAKE_W,
                                               PPN_DTYPE_BF16, FAKE_X, 64, 128, 64), PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "backend fake"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_F32, FAKE_X, 64,
                                               128, 64), PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "f32 weights"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64,
                                               96, 64), PPN_EUNSUPPORTED); /* n % 64 */
    assert_non_null(strstr(ppn_last_error(), "n 96"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64,
                                               128, 72), PPN_EUNSUPPORTED); /* cols % 64 */
    assert_non_null(strstr(ppn_last_error(), "cols 72"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F16, FAKE_W, PPN_DTYPE_BF16, FAKE_X, 64,
                                               128, 64), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "output dtype"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT + 8, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16,
                                               FAKE_X, 64, 128, 64), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "16-byte aligned"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_X + 64, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, FAKE_X,
                                               64, 128, 64), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps x16"));
    assert_int_equal(ppn_op_gemm_swiglu_rows16(tma_fake, s, FAKE_OUT, PPN_DTYPE_F32, FAKE_W, PPN_DTYPE_BF16, 0, 64,
                                               128, 64), PPN_EINVAL);
    assert_int_equal(tu_cap.calls, 0);
    tu_cap.dry = 0;
}

/* PPN_GEMM_W's levels (ppn_op_gemm_rows16_takes) on a 132-SM device that runs TMA kernels: 0 never; 1 wherever it
 * fits; 2 from 16 tokens where gemm_tc_w's grid has 64 CTAs (48 past 64 tokens); 3 level 2's rule from 256 tokens,
 * and only where the op's own kernel already has the tile sums, so ppn_op_gemm_sums_on is ppn_op_gemm_sums at every m
 * and shape: the forward's bits are level 0's (the 8B's q|k|v at 256 tokens stays on the split-K tile); at a default
 * prefill chunk (2,048 rows) it takes what level 2 takes, whose primes were timed on an H100; 4 (the default) level
 * 2's rule but where the op runs gemm_tc_k or (PPN_GEMM_KX's default level) gemm_tc_kx, and there the op's sums,
 * elsewhere gemm_tc_w's (the tiles'). */
static void test_gemm_w_levels(void **state)
{
    (void)state;
    ppn_gstream *s = tma_stream();
    const int bf = PPN_DTYPE_BF16;
    static const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096},
                                    {3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192},  {4096, 64}};
    static const int ms[] = {1, 8, 16, 17, 32, 64, 65, 80, 128, 129, 255, 256, 300, 512, 1024, 2048, 4096};
    int took3 = 0, kept3 = 0, took4 = 0;
    tma_fake->gemm_kx = 2; /* PPN_GEMM_KX's default: gemm_tc_kx at up to 16 and 65-80 tokens (level 4 leaves those) */
    for (size_t i = 0; i < TU_LEN(shapes); i++)
        for (size_t j = 0; j < TU_LEN(ms); j++) {
            const int rows = shapes[i][0], cols = shapes[i][1], m = ms[j];
            tma_fake->gemm_w = 0;
            assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, m, rows, cols, bf));
            tma_fake->gemm_w = 1;
            assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, m, rows, cols, bf));
            tma_fake->gemm_w = 2;
            const int two = ppn_op_gemm_rows16_takes(tma_fake, s, m, rows, cols, bf);
            tma_fake->gemm_w = 3;
            const int three = ppn_op_gemm_rows16_takes(tma_fake, s, m, rows, cols, bf);
            if (three && (!two || m < 256))
                fail_msg("level 3 took m %d over %d x %d where level 2 did %d", m, rows, cols, two);
            if (ppn_op_gemm_sums_on(tma_fake, s, m, rows, cols, bf) != ppn_op_gemm_sums(m, rows, cols, bf))
                fail_msg("level 3: m %d over %d x %d sums otherwise than the op (%d against %d)", m, rows, cols,
                         ppn_op_gemm_sums_on(tma_fake, s, m, rows, cols, bf), ppn_op_gemm_sums(m, rows, cols, bf));
            if (m >= PPN_PREFILL_CHUNK && three != two) /* a default chunk: every GEMM level 2 takes (its primes) */
                fail_msg("m %d over %d x %d: level 3 %d, level 2 %d", m, rows, cols, three, two);
            took3 += three, kept3 += two && m >= 256 && !three;
            tma_fake->gemm_w = 4; /* level 2's rule but where the op runs gemm_tc_k or the device gemm_tc_kx */
            const int four = ppn_op_gemm_rows16_takes(tma_fake, s, m, rows, cols, bf);
            const int k = ppn_op_gemm_k16_fits(m, rows, cols, bf); /* the op's gemm_tc_k */
            const int kx = ppn_op_gemm_x16_fits(m, rows, cols, bf) && ppn_gemm_kx_takes(tma_fake, m); /* gemm_tc_kx */
            if (four != (two && !k && !kx))
                fail_msg("level 4: m %d over %d x %d took %d (level 2 %d, gemm_tc_k %d, gemm_tc_kx %d)", m, rows, cols,
                         four, two, k, kx);
            if (ppn_op_gemm_sums_on(tma_fake, s, m, rows, cols, bf) !=
                (four ? PPN_GEMM_SUMS_TILE : ppn_op_gemm_sums(m, rows, cols, bf)))
                fail_msg("level 4: m %d over %d x %d sums otherwise than its kernels", m, rows, cols);
            took4 += four && !three;
        }
    assert_true(took3 > 0 && kept3 > 0 && took4 > 0); /* both sides of the sums test were met; level 4's own */
    tma_fake->gemm_w = 4; /* by example: the 8B's B=16 and 16 + 64-row steps keep the op's tiles, B=64 and 128 rows not */
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 16, 4096, 4096, bf));
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 80, 6144, 4096, bf));
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 64, 6144, 4096, bf));
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 128, 4096, 14336, bf));
    tma_fake->gemm_w = 2; /* level 2's rule by example: q|k|v and o from 16 tokens (96 and 64 CTAs), not at 8; not */
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 8, 6144, 4096, bf)); /* the 1B's 2048-row o (32) */
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 16, 6144, 4096, bf));
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 16, 4096, 4096, bf));
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 128, 2048, 2048, bf));
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 256, 6144, 4096, bf)); /* 48 CTAs past 64 tokens */
    tma_fake->gemm_w = 3; /* level 3: the 8B's q|k|v at 256 tokens is on gemm_tc_kw (split-K sums); at 2,048 taken */
    assert_int_equal(ppn_op_gemm_sums(256, 6144, 4096, bf), PPN_GEMM_SUMS_KW);
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 256, 6144, 4096, bf));
    assert_true(ppn_op_gemm_rows16_takes(tma_fake, s, 2048, 6144, 4096, bf));
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 128, 28672, 4096, bf));
    assert_false(ppn_op_gemm_rows16_takes(tma_fake, s, 2048, 6144, 4096, PPN_DTYPE_F16)); /* bf16 weights alone */
    /* on a device without TMA kernels no level takes it */
    tu_fake.gemm_w = 1;
    assert_false(ppn_op_gemm_rows16_takes(&tu_fake, tu_fake_stream, 2048, 6144, 4096, bf));
    tu_fake.gemm_w = 0;
    tma_fake->gemm_w = 0;
    tma_fake->gemm_kx = 0;
}

/* The map limits both backends check (gpu.h: ppn_tmap_desc), each refusal naming its field. */
static void test_gemm_tmap_check(void **state)
{
    (void)state;
    const ppn_tmap_desc ok = {.base = FAKE_X, .elem_bytes = 4, .dim = {4096, 100}, .row_bytes = 16384,
                              .box = {32, 128}};
    assert_int_equal(ppn_tmap_check("t", &ok), PPN_OK);
    static const struct { int field; uint64_t v; const char *what; } bad[] = {
        {0, 0, "base"},           {0, FAKE_X + 8, "base"},   {1, 3, "elem_bytes"},     {1, 8, "elem_bytes"},
        {2, 0, "dim[0]"},         {3, 0, "dim[1]"},          {3, (1ull << 32) + 1, "dim[1]"},
        {4, 16376, "row_bytes"},  {4, 16392, "row_bytes"},   {5, 0, "box[0]"},         {5, 33, "box row"},
        {6, 257, "box[1]"},
    };
    for (size_t i = 0; i < TU_LEN(bad); i++) {
        ppn_tmap_desc d = ok;
        switch (bad[i].field) {
        case 0: d.base = bad[i].v; break;
        case 1: d.elem_bytes = (int)bad[i].v; break;
        case 2: d.dim[0] = bad[i].v; break;
        case 3: d.dim[1] = bad[i].v; break;
        case 4: d.row_bytes = bad[i].v; break;
        case 5: d.box[0] = (unsigned)bad[i].v; break;
        default: d.box[1] = (unsigned)bad[i].v; break;
        }
        assert_int_equal(ppn_tmap_check("t", &d), PPN_EINVAL);
        if (!strstr(ppn_last_error(), bad[i].what)) fail_msg("'%s' does not name '%s'", ppn_last_error(), bad[i].what);
    }
    unsigned char junk[PPN_TMAP_BYTES] = {1};
    ppn_tmap_desc d;
    assert_false(ppn_tmap_sim_decode(junk, &d));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_reference),
        cmocka_unit_test(test_gemm_reference_rows),
        cmocka_unit_test_teardown(test_gemm_op_choice, dry_off),
        cmocka_unit_test_teardown(test_gemm_op_model_shapes, dry_off),
        cmocka_unit_test_teardown(test_gemm_op_tile_forced, dry_off),
        cmocka_unit_test_teardown(test_gemm_op_split_knobs, dry_off),
        cmocka_unit_test(test_gemm_op_accesses),
        cmocka_unit_test(test_gemm_op_refusals),
        cmocka_unit_test(test_gemm_x16_layout), cmocka_unit_test(test_gemm_k16),
        cmocka_unit_test_teardown(test_gemm_x16_fits, dry_off),
        cmocka_unit_test_teardown(test_gemm_sums, dry_off),
        cmocka_unit_test_teardown(test_gemm_x16_values, dry_off),
        cmocka_unit_test_teardown(test_gemm_swiglu_values, dry_off),
        cmocka_unit_test_teardown(test_gemm_kx_choice, dry_off),
        cmocka_unit_test_teardown(test_gemm_tc_h_choice, dry_off),
        cmocka_unit_test(test_gemm_tc_h_values),
        cmocka_unit_test_teardown(test_gemm_tc_w, dry_off),
        cmocka_unit_test_teardown(test_gemm_swiglu_w, dry_off),
        cmocka_unit_test(test_gemm_w_levels),
        cmocka_unit_test(test_gemm_tmap_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
