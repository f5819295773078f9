/* test_gpu_gemm.c - the prefill GEMM (ppn_op_gemm; kernels/gemm.cu) on a real GPU: against the CPU reference
 * on random inputs at the llama-1b / llama-8b projection shapes and the fixtures', bits repeated, every
 * tensor-core tile forced on the same inputs giving the op's bits, then a timing table (TFLOP/s).
 *
 * Checks: at most GG_SAMPLE token rows of each case (the first, the last, the middle and random ones) are
 * downloaded and compared with the CPU reference run on those rows (gemm_cpu.c: x rounded to W's dtype, f32
 * sums). Both sides sum in f32 in different orders, so the bound is 1e-5 of the row's sum of absolute terms
 * (|W| |x as rounded|, + |bias| + |res|): f32 summation of up to 14336 terms of either order stays within
 * n u ~ 9e-4 of it at worst and ~sqrt(n) u ~ 1e-5 typically; 1e-5 leaves the typical case 10x or more.
 *
 * Timing: device time between an event pair around one launch, the median of GG_TIMED after GG_WARM
 * launches; each launch reads another copy of W from a pool (a small W is not served from L2 by its previous
 * launch). TFLOP/s = 2 m rows cols / time. The op's choice is timed, and each tensor-core tile forced.
 *
 * Decode timing (few tokens, m = 1 .. 256, or the list in PPN_GG_DECODE_M): launches back to back in bursts, as a
 * decode step issues them, each as weight bandwidth (W bytes / time) against a device-to-device copy's (bytes read +
 * written / time). PPN_GG_DECODE_RES=1: o and down with the residual (f32, added in the epilogue), as the forward.
 *
 * Runs only where a CUDA driver and GPU exist. PPN_GPU_TEST_FILTER=<cmocka pattern> picks tests
 * (test_gpu_gemm_correct, test_gpu_gemm_timing, test_gpu_gemm_decode). PPN_GG_MAX_MACS=N keeps the correctness
 * cases of at most N multiply-adds (m x rows x cols): every case still runs every tile, split and depth, so a
 * small N is a sanitizer-sized run over every kernel (racecheck runs each launch about 1000x slower).
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
#include <time.h>

#include "core/base/dtype.h"
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tcheck.h"
#include "tests/util/tdev.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

#define GG_SAMPLE 6
#define GG_WARM 3
#define GG_TIMED 11
#ifndef GG_SMOKE
#define GG_BACKEND "cuda"
#define GG_MAX_M 4096
#define GG_MAX_ROWS 128256
#define GG_MAX_COLS 14336
#define GG_POOL_ELEMS ((size_t)128256 * 4096) /* the largest W (lm head of llama-8b) */
#define GG_POOL16_ELEMS ((size_t)28672 * 4096) /* the largest f16 / f32 W tested */
#else /* -DGG_SMOKE: this file's own logic checked on the sim backend (CPU), at the shapes that fit */
#define GG_BACKEND "sim"
#define GG_MAX_M 4096
#define GG_MAX_ROWS 16384
#define GG_MAX_COLS 8192
#define GG_POOL_ELEMS ((size_t)16384 * 2048)
#define GG_POOL16_ELEMS ((size_t)16384 * 2048)
#endif

static ppn_gpu *G;
static ppn_gstream *S;
static int failures;

/* Device and host buffers shared by every case (random contents, a prefix of each used). */
static struct {
    ppn_dptr w[3];   /* W pool per dtype (index = PPN_DTYPE_*) */
    size_t wn[3];    /* elements in each */
    void *hw[3];     /* host copies */
    ppn_dptr x, out, res, bias[3];
    ppn_dptr xh; /* x rounded to bf16 (nearest even) in gemm_tc_kw16's layout, by 64-element blocks of the whole
                  * buffer: for cols % 64 == 0 the blocks of each row, what ppn_op_gemm_x16 reads */
    ppn_dptr xr; /* x rounded to bf16 (nearest even), row-major: what ppn_op_gemm_rows16 (gemm_tc_w) reads */
    float *hx, *hres;
    void *hbias[3];
} B;

static void *hmem(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static ppn_dptr up(const void *h, size_t bytes)
{
    ppn_dptr d = tu_dalloc(G, 0, bytes);
    tu_upload(G, S, d, h, bytes);
    return d;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int setup(void **state)
{
    (void)state;
    double t0 = now_s();
    B.wn[PPN_DTYPE_BF16] = GG_POOL_ELEMS, B.wn[PPN_DTYPE_F16] = GG_POOL16_ELEMS, B.wn[PPN_DTYPE_F32] = GG_POOL16_ELEMS;
    for (int dt = 0; dt < 3; dt++) {
        size_t es = ppn_dtype_size(dt);
        B.hw[dt] = tu_wrand(dt, B.wn[dt], NULL);
        B.w[dt] = up(B.hw[dt], B.wn[dt] * es);
        B.hbias[dt] = tu_wrand(dt, GG_MAX_ROWS, NULL);
        B.bias[dt] = up(B.hbias[dt], GG_MAX_ROWS * es);
    }
    size_t xn = (size_t)GG_MAX_M * GG_MAX_COLS, on = (size_t)GG_MAX_M * GG_MAX_ROWS, rn = (size_t)512 * 16384;
    B.hx = tu_frand(xn, -2, 2);
    B.x = up(B.hx, xn * 4);
    uint16_t *hxh = hmem(xn * 2);
    for (size_t i = 0; i < xn; i++) hxh[PPN_X16_POS(i)] = ppn_f32_to_bf16(B.hx[i]);
    B.xh = up(hxh, xn * 2);
    for (size_t i = 0; i < xn; i++) hxh[i] = ppn_f32_to_bf16(B.hx[i]);
    B.xr = up(hxh, xn * 2);
    EXPECT_OK(G->ops->stream_sync(G, S));
    free(hxh);
    B.hres = tu_frand(rn, -4, 4);
    B.res = up(B.hres, rn * 4);
    B.out = tu_dalloc(G, 0, on * 4);
    EXPECT_OK(G->ops->stream_sync(G, S));
    printf("  inputs generated and uploaded in %.1f s\n", now_s() - t0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        G->ops->mem_free(G, 0, B.w[dt]), G->ops->mem_free(G, 0, B.bias[dt]);
        free(B.hw[dt]), free(B.hbias[dt]);
    }
    G->ops->mem_free(G, 0, B.x), G->ops->mem_free(G, 0, B.xh), G->ops->mem_free(G, 0, B.xr), G->ops->mem_free(G, 0, B.out);
    G->ops->mem_free(G, 0, B.res);
    free(B.hx), free(B.hres);
    return 0;
}

/* k < 0: the op's choice. */
static ppn_status run_gemm(int k, const ppn_kp_gemm *p)
{
    if (k < 0) return ppn_op_gemm(G, S, p->out, p->w, p->wdt, p->x, p->m, p->rows, p->cols, p->bias, p->res);
    return ppn_op_gemm_tile(G, S, k, p);
}

static const char *kname(int k) { return k < 0 ? "op" : ppn_kernels[k].name + 6; }

/* G's stream runs the TMA kernels (gemm_tc_h): tma_ok's level (PPN_TMA's), 0 where it runs none. */
static int gg_tma(void) { return G->ops->tma_ok ? G->ops->tma_ok(G, S) : 0; }

/* The last tile the loops below force: gemm_tc_h where G runs it. */
static int gg_last_tile(void) { return gg_tma() ? PPN_K_GEMM_TC_H : PPN_K_GEMM_TC_KWX; }

/* The kernel ppn_op_gemm picks for p: the op run against a fake device like G (TMA kernels and SMs as G's
 * stream has them), capturing only. */
static int op_choice(const ppn_kp_gemm *p)
{
    ppn_gpu *f = gg_tma() ? tu_fake_tma(G->ops->sm_count ? G->ops->sm_count(G, S) : 0) : &tu_fake;
    tu_cap.dry = 1;
    tu_tma_shift = 0;
    EXPECT_OK(ppn_op_gemm(f, (ppn_gstream *)f, p->out, p->w, p->wdt, p->x, p->m, p->rows, p->cols, p->bias, p->res));
    tu_cap.dry = 0;
    return tu_cap.l.kernel;
}

/* ---------------------------------------------------------------------------------------------------------
 * correctness */

typedef struct gg_case {
    const char *name;
    int m, rows, cols, dt, bias, res, alias, xoff; /* xoff: x this many floats past 16-byte alignment */
} gg_case;

static int pick_rows(int m, int *t)
{
    int n = 0, cand[GG_SAMPLE] = {0, m - 1, m / 2, (int)(tu_rand32() % (unsigned)m), (int)(tu_rand32() % (unsigned)m),
                                  (int)(tu_rand32() % (unsigned)m)};
    for (int i = 0; i < GG_SAMPLE; i++) {
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= t[j] == cand[i];
        if (!dup) t[n++] = cand[i];
    }
    return n;
}

/* The sampled rows (out [ns, rows] on the host) of a launch whose output is at dout. */
static void fetch_rows(float *h, ppn_dptr dout, const int *t, int ns, int rows)
{
    size_t rb = (size_t)rows * 4;
    for (int i = 0; i < ns; i++) tu_download(G, S, h + (size_t)i * rows, dout + (size_t)t[i] * rb, rb);
}

/* n elements of dtype dt with their signs cleared. */
static void *abs_copy(const void *w, int dt, size_t n)
{
    void *a = hmem(n * ppn_dtype_size(dt));
    if (dt == PPN_DTYPE_F32)
        for (size_t i = 0; i < n; i++) ((float *)a)[i] = fabsf(((const float *)w)[i]);
    else
        for (size_t i = 0; i < n; i++) ((uint16_t *)a)[i] = ((const uint16_t *)w)[i] & 0x7fffu;
    return a;
}

/* Puts the case's res into out (res aliasing out) before a launch. */
static void reset_alias(const gg_case *c)
{
    if (c->alias) tu_upload(G, S, B.out, B.hres, (size_t)c->m * c->rows * 4);
}

/* Worst |got - ref| / (1e-5 scale) over n outputs (a NaN on either side: infinite); *wi where, *max_abs its size. */
static double err_ratio(const float *got, const float *ref, const float *scale, size_t n, size_t *wi, double *max_abs)
{
    double worst = 0;
    *wi = 0, *max_abs = 0;
    for (size_t o = 0; o < n; o++) {
        double e = fabs((double)got[o] - (double)ref[o]);
        double ratio = isnan(got[o]) || isnan(ref[o]) ? INFINITY : e / (1e-5 * scale[o] + 1e-30);
        if (ratio > worst) worst = ratio, *wi = o;
        if (e > *max_abs) *max_abs = e;
    }
    return worst;
}

/* The CPU reference of the sampled rows t[0 .. ns) into ref, and their scales (the same reference on |W|, |x|
 * (rounding is symmetric), |bias|, |res|: the sum of absolute terms) into scale. */
static void gg_reference(const gg_case *c, const int *t, int ns, float *ref, float *scale)
{
    size_t R = (size_t)c->rows, C = (size_t)c->cols;
    float *hx = hmem((size_t)ns * C * 4), *hr = hmem((size_t)ns * R * 4);
    for (int i = 0; i < ns; i++) {
        memcpy(hx + (size_t)i * C, B.hx + (size_t)c->xoff + (size_t)t[i] * C, C * 4);
        if (c->res) memcpy(hr + (size_t)i * R, B.hres + (size_t)t[i] * R, R * 4);
    }
    ppn_kp_gemm q = {.out = D(ref), .w = D(B.hw[c->dt]), .x = D(hx), .bias = c->bias ? D(B.hbias[c->dt]) : 0,
                     .res = c->res ? D(hr) : 0, .m = ns, .rows = c->rows, .cols = c->cols, .wdt = c->dt};
    tu_kernel_run(PPN_K_GEMM, &q);
    void *aw = abs_copy(B.hw[c->dt], c->dt, R * C), *ab = abs_copy(B.hbias[c->dt], c->dt, R);
    for (size_t i = 0; i < (size_t)ns * C; i++) hx[i] = fabsf(hx[i]);
    for (size_t i = 0; i < (size_t)ns * R; i++) hr[i] = fabsf(hr[i]);
    q.out = D(scale), q.w = D(aw), q.bias = c->bias ? D(ab) : 0;
    tu_kernel_run(PPN_K_GEMM, &q);
    free(aw), free(ab), free(hx), free(hr);
}

/* Kernel k (< 0: the op) on p, its sampled rows into h. */
static void gg_run(const gg_case *c, int k, const ppn_kp_gemm *p, const int *t, int ns, float *h)
{
    reset_alias(c);
    EXPECT_OK(run_gemm(k, p));
    EXPECT_OK(G->ops->stream_sync(G, S));
    fetch_rows(h, B.out, t, ns, c->rows);
}

/* The op twice (the same bits), then every tensor-core tile the shape allows forced, each within the bound of
 * the CPU reference; whether a tile gives the op's bits is printed (=, !=), not required. */
static void gg_check(const gg_case *c)
{
    size_t R = (size_t)c->rows, C = (size_t)c->cols;
    assert_true((size_t)c->m * C + (size_t)c->xoff <= (size_t)GG_MAX_M * GG_MAX_COLS);
    assert_true(R * C <= B.wn[c->dt] && (!c->res || (size_t)c->m * R <= (size_t)512 * 16384));
    int t[GG_SAMPLE], ns = pick_rows(c->m, t);
    size_t n = (size_t)ns * R, wi;
    ppn_kp_gemm p = {.out = B.out, .w = B.w[c->dt], .x = B.x + (size_t)c->xoff * 4, .bias = c->bias ? B.bias[c->dt] : 0,
                     .res = c->alias ? B.out : c->res ? B.res : 0, .m = c->m, .rows = c->rows, .cols = c->cols,
                     .wdt = c->dt};
    float *g1 = hmem(n * 4), *g2 = hmem(n * 4), *ref = hmem(n * 4), *scale = hmem(n * 4);
    gg_reference(c, t, ns, ref, scale);
    gg_run(c, -1, &p, t, ns, g1);
    gg_run(c, -1, &p, t, ns, g2);
    int same = !memcmp(g1, g2, n * 4), chosen = op_choice(&p);
    double max_abs, worst = err_ratio(g1, ref, scale, n, &wi, &max_abs), tile_worst = 0;
    char tiles[400] = "";
    int tc = c->dt != PPN_DTYPE_F32 && c->cols % 8 == 0 && c->xoff % 4 == 0, h_as_l = 1, kwx_as_kw = 1;
    float *gl = hmem(n * 4); /* gemm_tc_l's rows: gemm_tc_h must give these bits */
    float *gkw = hmem(n * 4); /* gemm_tc_kw's rows: gemm_tc_kwx must give these bits */
    float *gk = hmem(n * 4);  /* gemm_tc_k's rows: gemm_tc_k16 must give these bits */
    for (int k = PPN_K_GEMM_TC_L; tc && k <= gg_last_tile(); k++) {
        if (k == PPN_K_GEMM_TC_KW16) continue; /* its x is bf16: below */
        gg_run(c, k, &p, t, ns, g2);
        size_t wk;
        double ak, rk = err_ratio(g2, ref, scale, n, &wk, &ak);
        if (rk > tile_worst) tile_worst = rk;
        if (k == PPN_K_GEMM_TC_L) memcpy(gl, g2, n * 4);
        if (k == PPN_K_GEMM_TC_H) h_as_l = !memcmp(gl, g2, n * 4);
        if (k == PPN_K_GEMM_TC_KW) memcpy(gkw, g2, n * 4);
        if (k == PPN_K_GEMM_TC_K) memcpy(gk, g2, n * 4);
        if (k == PPN_K_GEMM_TC_KWX) kwx_as_kw = !memcmp(gkw, g2, n * 4);
        snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " %s%s%.3f%s", kname(k) + 8,
                 memcmp(g1, g2, n * 4) ? "!=" : "=", rk,
                 k == PPN_K_GEMM_TC_H ? (h_as_l ? "(=l)" : "(!=l)")
                 : k == PPN_K_GEMM_TC_KWX ? (kwx_as_kw ? "(=kw)" : "(!=kw)") : "");
    }
    /* x in bf16 (rounded as the tiles round it): gemm_tc_kw16 forced gives gemm_tc_kw's bits, gemm_tc_k16 gemm_tc_k's
     * (at every K split and ring depth), and where the op takes bf16 x (ppn_op_gemm_x16_fits, _k16_fits)
     * ppn_op_gemm_x16 gives the op's */
    int kw16_as_kw = 1, x16_as_op = 1, k16_as_k = 1, w_as_l = 1;
    if (tc && c->dt == PPN_DTYPE_BF16 && c->xoff % 64 == 0 && c->cols % 64 == 0) {
        ppn_kp_gemm q = p;
        if (gg_tma()) { /* gemm_tc_w (x row-major, no K split): gemm_tc_l's bits */
            q.x = B.xr + (size_t)c->xoff * 2;
            gg_run(c, PPN_K_GEMM_TC_W, &q, t, ns, g2);
            w_as_l = !memcmp(gl, g2, n * 4);
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " w%s", w_as_l ? "(=l)" : "(!=l)");
        }
        q.x = B.xh + (size_t)c->xoff * 2;
        gg_run(c, PPN_K_GEMM_TC_KW16, &q, t, ns, g2);
        kw16_as_kw = !memcmp(gkw, g2, n * 4);
        snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " kw16%s", kw16_as_kw ? "(=kw)" : "(!=kw)");
        if (gg_tma()) { /* gemm_tc_kwt (W through the tensor memory accelerator): gemm_tc_kw's bits too */
            gg_run(c, PPN_K_GEMM_TC_KWT, &q, t, ns, g2);
            kw16_as_kw &= !memcmp(gkw, g2, n * 4);
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " kwt%s",
                     !memcmp(gkw, g2, n * 4) ? "(=kw)" : "(!=kw)");
        }
        if (gg_tma()) { /* gemm_tc_kx (the operands swapped, groups of 128 tokens): gemm_tc_kw's bits at every K split */
            gg_run(c, PPN_K_GEMM_TC_KX, &q, t, ns, g2);
            int kx_as_kw = !memcmp(gkw, g2, n * 4);
            float *gx = hmem(n * 4);
            static const int kxs[] = {1, 2, 4, 8};
            for (size_t a = 0; a < TU_LEN(kxs); a++) {
                ppn_kp_gemm pf = p, ph = q;
                pf.ks = ph.ks = kxs[a];
                gg_run(c, PPN_K_GEMM_TC_KW, &pf, t, ns, gx);
                gg_run(c, PPN_K_GEMM_TC_KX, &ph, t, ns, g2);
                kx_as_kw &= !memcmp(gx, g2, n * 4);
            }
            free(gx);
            kw16_as_kw &= kx_as_kw;
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " kx%s", kx_as_kw ? "(=kw)" : "(!=kw)");
        }
        gg_run(c, PPN_K_GEMM_TC_K16, &q, t, ns, g2);
        k16_as_k = !memcmp(gk, g2, n * 4);
        if (gg_tma()) { /* gemm_tc_k16t (W and x through the tensor memory accelerator): gemm_tc_k's bits too */
            gg_run(c, PPN_K_GEMM_TC_K16T, &q, t, ns, g2);
            k16_as_k &= !memcmp(gk, g2, n * 4);
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " k16t%s",
                     !memcmp(gk, g2, n * 4) ? "(=k)" : "(!=k)");
        }
        static const int kss[] = {1, 2, 4, 8}, st[] = {3, 4};
        for (size_t a = 0; a < TU_LEN(kss); a++)
            for (size_t b = 0; b < TU_LEN(st); b++) {
                if (PPN_GEMM_TC_K_SMEM_S(c->m, st[b]) > PPN_DYN_SMEM_MAX) continue;
                ppn_kp_gemm pf = p, ph = q;
                pf.ks = ph.ks = kss[a], pf.stages = ph.stages = st[b];
                gg_run(c, PPN_K_GEMM_TC_K, &pf, t, ns, gk);
                gg_run(c, PPN_K_GEMM_TC_K16, &ph, t, ns, g2);
                k16_as_k &= !memcmp(gk, g2, n * 4);
                if (gg_tma()) {
                    gg_run(c, PPN_K_GEMM_TC_K16T, &ph, t, ns, g2);
                    k16_as_k &= !memcmp(gk, g2, n * 4);
                }
            }
        snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " k16%s", k16_as_k ? "(=k)" : "(!=k)");
        if (ppn_op_gemm_x16_fits(c->m, c->rows, c->cols, c->dt) || ppn_op_gemm_k16_fits(c->m, c->rows, c->cols, c->dt)) {
            reset_alias(c);
            EXPECT_OK(ppn_op_gemm_x16(G, S, q.out, q.w, q.wdt, q.x, q.m, q.rows, q.cols, q.bias, q.res));
            EXPECT_OK(G->ops->stream_sync(G, S));
            fetch_rows(g2, B.out, t, ns, c->rows);
            x16_as_op = !memcmp(g1, g2, n * 4);
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " x16%s", x16_as_op ? "(=op)" : "(!=op)");
        }
    }
    free(gl), free(gkw), free(gk);
    /* Every K split and ring depth the split-K tiles take (ppn_op_gemm_tile's ks and stages, what the decode
     * sweep times), each within the bound; a depth whose ring does not fit at this m is refused, not run. */
    double knob_worst = 0;
    int knobs = 0;
    for (int k = PPN_K_GEMM_TC_K; tc && k <= PPN_K_GEMM_TC_KWX; k++) {
        static const int kss[] = {1, 2, 4, 8}, k_st[] = {3, 4}, kw_st[] = {3}, kwx_st[] = {3};
        const int *st = k == PPN_K_GEMM_TC_K ? k_st : k == PPN_K_GEMM_TC_KW ? kw_st : kwx_st;
        int nst = k == PPN_K_GEMM_TC_K ? (int)TU_LEN(k_st) : 1;
        for (size_t a = 0; a < TU_LEN(kss); a++)
            for (int b = 0; b < nst; b++) {
                if (k == PPN_K_GEMM_TC_K && PPN_GEMM_TC_K_SMEM_S(c->m, st[b]) > PPN_DYN_SMEM_MAX) continue;
                ppn_kp_gemm q = p;
                q.ks = kss[a], q.stages = st[b];
                gg_run(c, k, &q, t, ns, g2);
                size_t wk;
                double ak, rk = err_ratio(g2, ref, scale, n, &wk, &ak);
                if (rk > knob_worst) knob_worst = rk;
                knobs++;
            }
    }
    if (knobs)
        snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " %d splits/depths %.3f", knobs, knob_worst);
    if (knob_worst > tile_worst) tile_worst = knob_worst;
    /* A token's row alone (m = 1) gives its bits in this batch on the split-K tile the op took (gemm_tc_k or
     * gemm_tc_kw, forced at m = 1: their k-splits depend on rows and cols alone); checked on the first sampled
     * row, where res does not alias out. */
    int alone = 1;
    if ((chosen == PPN_K_GEMM_TC_K || chosen == PPN_K_GEMM_TC_KW || chosen == PPN_K_GEMM_TC_KWX) && !c->alias) {
        ppn_kp_gemm q = p;
        q.m = 1, q.x = p.x + (size_t)t[0] * C * 4, q.res = c->res ? B.res + (size_t)t[0] * R * 4 : 0;
        q.out = B.out + (size_t)c->m * R * 4; /* past the batch's rows */
        {
            EXPECT_OK(run_gemm(chosen, &q));
            EXPECT_OK(G->ops->stream_sync(G, S));
            tu_download(G, S, g2, q.out, R * 4);
            alone = !memcmp(g1, g2, R * 4);
            snprintf(tiles + strlen(tiles), sizeof tiles - strlen(tiles), " m=1%s", alone ? "=" : "!=");
        }
    }
    int ok = same && alone && h_as_l && w_as_l && kwx_as_kw && kw16_as_kw && k16_as_k && x16_as_op && worst <= 1.0 &&
             tile_worst <= 1.0;
    printf("  %-14s %-4s m=%-4d %6dx%-5d%s%s%s%s  %-9s max|err| %.2e err/tol %.3f  %s%s%s\n", c->name,
           ppn_dtype_name(c->dt), c->m, c->rows, c->cols, c->bias ? " +bias" : "", c->res ? " +res" : "",
           c->alias ? "=out" : "", c->xoff ? " x+4B" : "", kname(chosen), max_abs, worst,
           same ? "bits repeat" : "BITS DIFFER", tiles, ok ? "" : "  FAIL");
    if (!ok) {
        failures++;
        printf("    worst at token %d row %zu: gpu %.9g cpu %.9g\n", t[wi / R], wi % R, g1[wi], ref[wi]);
    }
    free(g1), free(g2), free(ref), free(scale);
}

static void test_gpu_gemm_correct(void **state)
{
    (void)state;
    const int bf = PPN_DTYPE_BF16, fh = PPN_DTYPE_F16, f32 = PPN_DTYPE_F32;
    const gg_case cs[] = {
        /* llama-1b */
        {"1b qkv", 4096, 3072, 2048, bf, 0, 0, 0, 0},       {"1b qkv", 64, 3072, 2048, bf, 1, 1, 0, 0},
        {"1b o", 512, 2048, 2048, bf, 0, 1, 1, 0},         {"1b o", 7, 2048, 2048, bf, 0, 0, 0, 0},
        {"1b gate|up", 512, 16384, 2048, bf, 0, 0, 0, 0},  {"1b down", 4096, 2048, 8192, bf, 0, 0, 0, 0},
        {"1b down", 1, 2048, 8192, bf, 0, 0, 0, 0},        {"1b lm head", 7, 128256, 2048, bf, 0, 0, 0, 0},
        /* llama-8b */
        {"8b qkv", 512, 6144, 4096, bf, 1, 0, 0, 0},       {"8b o", 4096, 4096, 4096, bf, 0, 0, 0, 0},
        {"8b o", 64, 4096, 4096, bf, 0, 1, 1, 0},          {"8b gate|up", 64, 28672, 4096, bf, 0, 0, 0, 0},
        {"8b down", 512, 4096, 14336, bf, 0, 1, 0, 0},     {"8b down", 16, 4096, 14336, bf, 0, 0, 0, 0},
        {"8b lm head", 1, 128256, 4096, bf, 0, 0, 0, 0},   {"8b qkv", 512, 6144, 4096, fh, 1, 1, 0, 0},
        {"8b down", 64, 4096, 14336, fh, 0, 0, 0, 0},      {"1b o", 512, 2048, 2048, f32, 1, 1, 1, 0},
        /* tails: m, rows and k-tiles partly out; 16-byte misaligned x; odd cols */
        {"tails", 333, 1000, 4104, bf, 1, 1, 0, 0},        {"tails", 333, 1000, 4104, fh, 1, 1, 1, 0},
        {"x+4B", 100, 300, 256, bf, 1, 0, 0, 1},           {"odd cols", 77, 300, 1001, bf, 1, 1, 0, 0},
        {"odd cols", 77, 300, 1001, f32, 1, 1, 0, 0},      {"tiny", 1, 1, 8, bf, 1, 1, 0, 0},
        {"tiny", 1, 1, 1, fh, 1, 1, 1, 0},
        /* few tokens (gemm_tc_k): token groups, k-ranges and weight tiles partly out */
        {"8b qkv", 4, 6144, 4096, bf, 0, 0, 0, 0},         {"1b gate|up", 32, 16384, 2048, bf, 1, 0, 0, 0},
        {"tails", 33, 1000, 4104, bf, 1, 1, 0, 0},         {"tails", 5, 1000, 4104, fh, 1, 1, 1, 0},
        {"tails", 8, 100, 72, bf, 0, 1, 0, 0},             {"1b down", 17, 2048, 8192, bf, 0, 1, 0, 0},
        /* a few dozen tokens (gemm_tc_kw): two token groups, a last k-range short, tiles past the matrix */
        {"tails", 100, 1000, 4104, bf, 1, 1, 0, 0},       {"tails", 65, 1000, 4104, fh, 1, 0, 0, 0},
        {"8b qkv", 48, 6144, 4096, bf, 0, 0, 0, 0},        {"1b gate|up", 128, 16384, 2048, bf, 0, 1, 0, 0},
        /* ... and from 9 tokens on wide matrices (ops_gemm.c: gemm_k_max_m) */
        {"8b qkv", 16, 6144, 4096, bf, 1, 0, 0, 0},        {"8b gate|up", 12, 28672, 4096, fh, 0, 0, 0, 0},
        /* x through the ring (gemm_tc_kwx, the op's below 4096 rows; forced on every case): token groups and
         * k-ranges partly out */
        {"8b o", 96, 4096, 4096, bf, 0, 1, 1, 0},          {"8b down", 80, 4096, 14336, fh, 0, 0, 0, 0},
        {"8b qkv", 127, 6144, 4096, bf, 1, 0, 0, 0},       {"1b qkv", 66, 3072, 2048, bf, 0, 0, 0, 0},
        {"1b down", 40, 2048, 8192, bf, 1, 1, 0, 0},       {"1b o", 64, 2048, 2048, fh, 0, 1, 1, 0},
        /* 129-256 tokens on the split-K middle tile (three and four token groups; ops_gemm.c gemm_kw_fits) */
        {"8b down", 192, 4096, 14336, bf, 0, 1, 0, 0},     {"8b o", 256, 4096, 4096, bf, 1, 0, 0, 0},
        {"1b qkv", 200, 3072, 2048, bf, 0, 0, 0, 0},
        /* ... and to 512 over sums of 8192 columns or more (the down matrices) */
        {"8b down", 384, 4096, 14336, bf, 1, 0, 0, 0},     {"1b down", 500, 2048, 8192, bf, 0, 1, 0, 0},
        /* the widest matrix up to 192 (gemm_kw_wide) */
        {"8b gate|up", 160, 28672, 4096, bf, 0, 0, 0, 0},
    };
    static const int fx[][2] = {{96, 64}, {64, 64}, {352, 64}, {64, 176}, {128, 64}, {64, 128}, {320, 64},
                                {64, 160}, {256, 64}, {344, 64}, {64, 172}, {512, 64}};
    static const int fm[] = {1, 7, 64, 100};
    const char *mm = getenv("PPN_GG_MAX_MACS");
    char *end = NULL;
    unsigned long long max_macs = mm ? strtoull(mm, &end, 10) : ~0ull;
    if (mm && (!*mm || *end || !max_macs)) fail_msg("PPN_GG_MAX_MACS=%s: want a positive count of multiply-adds", mm);
    int run = 0, skipped = 0;
    for (size_t i = 0; i < TU_LEN(cs); i++) {
        if ((unsigned long long)cs[i].m * cs[i].rows * cs[i].cols > max_macs) {
            skipped++;
            continue;
        }
#ifdef GG_SMOKE
        if ((size_t)cs[i].m * cs[i].rows * cs[i].cols > 3000000000u || (size_t)cs[i].rows * cs[i].cols > GG_POOL_ELEMS ||
            cs[i].rows > GG_MAX_ROWS || cs[i].cols > GG_MAX_COLS)
            continue;
#endif
        gg_check(&cs[i]);
        run++;
    }
    for (size_t s = 0; s < TU_LEN(fx); s++)
        for (size_t j = 0; j < TU_LEN(fm); j++)
            for (int dt = 0; dt < 3; dt++) {
                gg_case c = {"fixture", fm[j], fx[s][0], fx[s][1], dt, (int)(j & 1), (int)(j >= 2), j == 3, 0};
                if ((unsigned long long)c.m * c.rows * c.cols > max_macs) {
                    skipped++;
                    continue;
                }
                gg_check(&c);
                run++;
            }
    if (skipped) printf("  %d case(s) run, %d over PPN_GG_MAX_MACS=%s left out\n", run, skipped, mm);
    if (!run) fail_msg("no case ran (PPN_GG_MAX_MACS=%s)", mm);
    if (failures) fail_msg("%d gemm case(s) failed (FAIL lines above)", failures);
}

/* ---------------------------------------------------------------------------------------------------------
 * timing */

static ppn_gevent *ev[2 * GG_TIMED];

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median device ms of kernel k (< 0: the op) on p, W cycling through the pool. */
static double time_ms(int k, ppn_kp_gemm p)
{
    size_t wb = (size_t)p.rows * p.cols * ppn_dtype_size(p.wdt), slots = B.wn[p.wdt] * ppn_dtype_size(p.wdt) / wb;
    unsigned turn = 0;
    ppn_dptr w0 = B.w[p.wdt];
    for (int i = 0; i < GG_WARM; i++) {
        p.w = w0 + (size_t)(turn++ % slots) * wb;
        EXPECT_OK(run_gemm(k, &p));
    }
    for (int i = 0; i < GG_TIMED; i++) {
        p.w = w0 + (size_t)(turn++ % slots) * wb;
        EXPECT_OK(G->ops->event_record(G, ev[2 * i], S));
        EXPECT_OK(run_gemm(k, &p));
        EXPECT_OK(G->ops->event_record(G, ev[2 * i + 1], S));
    }
    EXPECT_OK(G->ops->stream_sync(G, S));
    float ms[GG_TIMED];
    for (int i = 0; i < GG_TIMED; i++) EXPECT_OK(G->ops->event_elapsed(G, ev[2 * i], ev[2 * i + 1], &ms[i]));
    qsort(ms, GG_TIMED, sizeof ms[0], cmp_float);
    return ms[GG_TIMED / 2];
}

typedef struct gg_shape {
    const char *name;
    int rows, cols, per_layer; /* per_layer: 0 = the lm head (once per model) */
} gg_shape;

static const gg_shape shapes_1b[] = {{"1b qkv", 3072, 2048, 1}, {"1b o", 2048, 2048, 1}, {"1b gate|up", 16384, 2048, 1},
                                     {"1b down", 2048, 8192, 1}, {"1b lm head", 128256, 2048, 0}};
static const gg_shape shapes_8b[] = {{"8b qkv", 6144, 4096, 1}, {"8b o", 4096, 4096, 1}, {"8b gate|up", 28672, 4096, 1},
                                     {"8b down", 4096, 14336, 1}, {"8b lm head", 128256, 4096, 0}};

static double tflops(int m, int rows, int cols, double ms) { return 2.0 * m * (double)rows * cols / (ms * 1e9); }

/* One line: the op's time and TFLOP/s, then each tensor-core tile forced. Returns the op's ms. */
static double time_line(const gg_shape *s, int m, int dt)
{
    ppn_kp_gemm p = {.out = B.out, .w = B.w[dt], .x = B.x, .m = m, .rows = s->rows, .cols = s->cols, .wdt = dt};
    double op = time_ms(-1, p);
    char line[400];
    int n = snprintf(line, sizeof line, "  %-11s %-4s m=%-4d %6dx%-5d  %-9s %8.3f ms %6.1f TFLOP/s |", s->name,
                     ppn_dtype_name(dt), m, s->rows, s->cols, kname(op_choice(&p)), op, tflops(m, s->rows, s->cols, op));
    for (int k = PPN_K_GEMM_TC_L; dt != PPN_DTYPE_F32 && k <= gg_last_tile(); k++) {
        if (k == PPN_K_GEMM_TC_KW16) continue; /* bf16 x: the decode table times it */
        double t = time_ms(k, p);
        n += snprintf(line + n, sizeof line - (size_t)n, " %s %6.1f", kname(k) + 8, tflops(m, s->rows, s->cols, t));
    }
    if (dt == PPN_DTYPE_BF16 && s->cols % 64 == 0 && gg_tma()) { /* gemm_tc_w on x in bf16 row-major */
        ppn_kp_gemm q = p;
        q.x = B.xr;
        double t = time_ms(PPN_K_GEMM_TC_W, q);
        n += snprintf(line + n, sizeof line - (size_t)n, " w %6.1f", tflops(m, s->rows, s->cols, t));
    }
    if (dt != PPN_DTYPE_F32 && gg_tma()) { /* gemm_tc_h with one CTA a tile: what its persistent grid buys */
        ppn_kp_gemm q = p;
        q.ctas = (m + PPN_GEMM_TC_H_BM - 1) / PPN_GEMM_TC_H_BM * ((s->rows + PPN_GEMM_TC_H_BN - 1) / PPN_GEMM_TC_H_BN);
        double t = time_ms(PPN_K_GEMM_TC_H, q);
        n += snprintf(line + n, sizeof line - (size_t)n, " h/tile %6.1f", tflops(m, s->rows, s->cols, t));
    }
    if (m <= 64 || dt == PPN_DTYPE_F32) {
        double t = time_ms(PPN_K_GEMM, p);
        n += snprintf(line + n, sizeof line - (size_t)n, " simt %5.1f", tflops(m, s->rows, s->cols, t));
    }
    printf("%s\n", line);
    return op;
}

/* A model's GEMM time for a prompt of 4096 tokens in chunks of m: every layer's projections per chunk, plus the
 * lm head on the last row. */
static void time_model(const char *name, const gg_shape *sh, int n, int layers, int m)
{
    double layer = 0, head = 0;
    for (int i = 0; i < n; i++) {
        if (sh[i].per_layer) layer += time_line(&sh[i], m, PPN_DTYPE_BF16);
        else head = time_line(&sh[i], 1, PPN_DTYPE_BF16);
    }
    double total = layer * layers * (4096 / m) + head;
    printf("  => %s, 4096 tokens in chunks of %d: GEMMs %.3f ms a layer-chunk x %d x %d + head %.3f ms = %.2f ms: "
           "%.0f tok/s from the GEMMs alone\n", name, m, layer, layers, 4096 / m, head, total, 4096e3 / total);
}

static void test_gpu_gemm_timing(void **state)
{
    (void)state;
    for (int i = 0; i < 2 * GG_TIMED; i++) ev[i] = tu_event(G, 0, 1);
    printf("  device ms: median of %d launches after %d warm-ups; TFLOP/s = 2 m rows cols / time; then the tiles "
           "forced (l 128x256, m 64x128, s 128x128, k, kw, h: l behind TMA where the device runs it) and the SIMT "
           "kernel, TFLOP/s\n", GG_TIMED, GG_WARM);
    time_model("llama-1b", shapes_1b, (int)TU_LEN(shapes_1b), 16, 4096);
    time_model("llama-8b", shapes_8b, (int)TU_LEN(shapes_8b), 32, 4096);
    time_model("llama-1b", shapes_1b, (int)TU_LEN(shapes_1b), 16, 512);
    time_model("llama-8b", shapes_8b, (int)TU_LEN(shapes_8b), 32, 512);
    static const int ms[] = {1, 16, 64, 128, 256, 1024, 2048};
    for (size_t j = 0; j < TU_LEN(ms); j++) {
        for (size_t i = 0; i < TU_LEN(shapes_1b); i++) time_line(&shapes_1b[i], ms[j], PPN_DTYPE_BF16);
        for (size_t i = 0; i < TU_LEN(shapes_8b); i++) time_line(&shapes_8b[i], ms[j], PPN_DTYPE_BF16);
    }
    time_line(&shapes_1b[0], 4096, PPN_DTYPE_F16);
    time_line(&shapes_8b[3], 4096, PPN_DTYPE_F16);
    time_line(&shapes_1b[1], 512, PPN_DTYPE_F32);
    for (int i = 0; i < 2 * GG_TIMED; i++) G->ops->event_destroy(G, ev[i]);
}

/* ---------------------------------------------------------------------------------------------------------
 * few tokens (batched decode): weight bandwidth against a device-to-device copy */

#define GD_BURST 20 /* launches between one event pair, as a decode step issues them */
#define GD_REPS 5

/* Median device ms a launch of kernel k (< 0: the op) takes in bursts of GD_BURST back to back (each on another
 * copy of W where the pool holds several), programmatic dependent launch as the runtime has it. */
static double burst_ms(int k, ppn_kp_gemm p)
{
    size_t wb = (size_t)p.rows * p.cols * ppn_dtype_size(p.wdt), slots = B.wn[p.wdt] * ppn_dtype_size(p.wdt) / wb;
    unsigned turn = 0;
    ppn_dptr w0 = B.w[p.wdt];
    float ms[GD_REPS];
    for (int r = -1; r < GD_REPS; r++) { /* r = -1: warm-up */
        EXPECT_OK(G->ops->event_record(G, ev[0], S));
        for (int i = 0; i < GD_BURST; i++) {
            p.w = w0 + (size_t)(turn++ % slots) * wb;
            EXPECT_OK(run_gemm(k, &p));
        }
        EXPECT_OK(G->ops->event_record(G, ev[1], S));
        EXPECT_OK(G->ops->stream_sync(G, S));
        if (r >= 0) EXPECT_OK(G->ops->event_elapsed(G, ev[0], ev[1], &ms[r]));
    }
    qsort(ms, GD_REPS, sizeof ms[0], cmp_float);
    return ms[GD_REPS / 2] / GD_BURST;
}

/* The copy floor: GB/s of a device-to-device copy of n bytes (read + written), median of GD_REPS. */
static double copy_gbs(size_t n)
{
    float ms[GD_REPS];
    for (int r = -1; r < GD_REPS; r++) {
        EXPECT_OK(G->ops->event_record(G, ev[0], S));
        EXPECT_OK(G->ops->copy_dtod(G, S, B.out, B.w[PPN_DTYPE_BF16], n));
        EXPECT_OK(G->ops->event_record(G, ev[1], S));
        EXPECT_OK(G->ops->stream_sync(G, S));
        if (r >= 0) EXPECT_OK(G->ops->event_elapsed(G, ev[0], ev[1], &ms[r]));
    }
    qsort(ms, GD_REPS, sizeof ms[0], cmp_float);
    return 2.0 * (double)n / (ms[GD_REPS / 2] * 1e6);
}

static void test_gpu_gemm_decode(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) ev[i] = tu_event(G, 0, 1);
    double floor_gbs = copy_gbs((size_t)512 << 20);
    printf("  copy floor: device-to-device copy of 512 MiB, %.0f GB/s (read + written); same-size copies of 8 / 32 MiB "
           "%.0f / %.0f GB/s\n", floor_gbs, copy_gbs((size_t)8 << 20), copy_gbs((size_t)32 << 20));
    printf("  per launch in bursts of %d (median of %d): us, weight GB/s (W bytes / time), %% of the copy floor; "
           "then the tiles forced\n", GD_BURST, GD_REPS);
    int ms[16] = {1, 4, 8, 16, 32, 64, 80, 128, 192, 256}, nm = 10;
    const char *ml = getenv("PPN_GG_DECODE_M"); /* another list of m, comma-separated */
    if (ml) {
        nm = 0;
        for (const char *q = ml; *q && nm < (int)TU_LEN(ms);) {
            char *end = NULL;
            long v = strtol(q, &end, 10);
            if (end == q || v < 1 || v > GG_MAX_M || (*end && *end != ','))
                fail_msg("PPN_GG_DECODE_M=%s: want m,m,..", ml);
            ms[nm++] = (int)v, q = *end ? end + 1 : end;
        }
    }
    /* PPN_GG_DECODE_RES=1: o and down add the residual stream in their epilogue, as the forward runs them */
    const char *rv = getenv("PPN_GG_DECODE_RES");
    const int with_res = rv && !strcmp(rv, "1");
    if (rv && !with_res && strcmp(rv, "0")) fail_msg("PPN_GG_DECODE_RES=%s: want 0 or 1", rv);
    if (with_res) printf("  o and down with res (f32 [m, rows] read and added in the epilogue)\n");
    const gg_shape *all[] = {shapes_1b, shapes_8b};
    for (int j = 0; j < nm; j++)
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < 5; i++) {
                const gg_shape *sh = &all[a][i];
                ppn_kp_gemm p = {.out = B.out, .w = B.w[PPN_DTYPE_BF16], .x = B.x, .m = ms[j], .rows = sh->rows,
                                 .cols = sh->cols, .wdt = PPN_DTYPE_BF16};
                if (with_res && (i == 1 || i == 3)) {
                    if ((size_t)ms[j] * (size_t)sh->rows > (size_t)512 * 16384) continue; /* B.res's size */
                    p.res = B.res;
                }
                double wb = (double)sh->rows * sh->cols * 2, op = burst_ms(-1, p);
                char line[512];
                int n = snprintf(line, sizeof line, "  decode %-11s m=%-4d %-9s %8.2f us %6.0f GB/s %5.1f%% |",
                                 sh->name, ms[j], kname(op_choice(&p)), op * 1e3, wb / (op * 1e6),
                                 100.0 * wb / (op * 1e6) / floor_gbs);
                static const int ks[] = {PPN_K_GEMM_TC_M,    PPN_K_GEMM_TC_K,   PPN_K_GEMM_TC_K16,
                                         PPN_K_GEMM_TC_K16T, PPN_K_GEMM_TC_KW,  PPN_K_GEMM_TC_KWX,
                                         PPN_K_GEMM_TC_KW16, PPN_K_GEMM_TC_KWT, PPN_K_GEMM_TC_KX,
                                         PPN_K_GEMM_TC_L,    PPN_K_GEMM_TC_H,   PPN_K_GEMM_TC_W};
                for (size_t q = 0; q < TU_LEN(ks); q++) {
                    if ((ks[q] == PPN_K_GEMM_TC_L || ks[q] == PPN_K_GEMM_TC_H) && ms[j] <= 64) continue; /* padding */
                    if (ks[q] == PPN_K_GEMM_TC_H && !gg_tma()) continue;
                    ppn_kp_gemm pk = p;
                    const int tk = ks[q] == PPN_K_GEMM_TC_KWT || ks[q] == PPN_K_GEMM_TC_K16T ||
                                   ks[q] == PPN_K_GEMM_TC_KX || ks[q] == PPN_K_GEMM_TC_W; /* sm_90a code */
                    if (tk && !gg_tma()) continue;
                    if (ks[q] == PPN_K_GEMM_TC_KW16 || ks[q] == PPN_K_GEMM_TC_K16 || tk) pk.x = B.xh; /* bf16 x */
                    if (ks[q] == PPN_K_GEMM_TC_W) pk.x = B.xr; /* bf16 x, row-major */
                    double t = burst_ms(ks[q], pk);
                    n += snprintf(line + n, sizeof line - (size_t)n, " %s %7.2f us %5.1f%%", kname(ks[q]) + 8,
                                  t * 1e3, 100.0 * wb / (t * 1e6) / floor_gbs);
                }
                printf("%s\n", line);
            }
    for (int i = 0; i < 2; i++) G->ops->event_destroy(G, ev[i]);
}

/* gemm_swiglu (ppn_op_gemm_swiglu: SwiGLU in gemm_tc_kw16's epilogue) against the two kernels it replaces,
 * ppn_op_gemm_x16 into [m, 2 n] f32 then ppn_op_swiglu_rows_to: the same bytes in both output dtypes, on the
 * llama-1b / 8b gate|up matrices at every m where it is taken; then both timed in bursts (bf16 out, as the forward
 * runs them). */
#define GS_MAX_M 192
/* The gate|up matrices both fused SwiGLU tests run on: n rows each of gate and up over cols. */
typedef struct { const char *name; int n, cols; } gs_shape;
static const gs_shape gs_shapes[] = {{"1b gate|up", 8192, 2048}, {"8b gate|up", 14336, 4096}};

/* The arms: GS_KW16 gemm_tc_kw16 forced then swiglu rows (the bits gemm_swiglu, _t and _x must give), GS_FUSED
 * ppn_op_gemm_swiglu, GS_W gemm_tc_w forced then swiglu rows (the bits gemm_swiglu_w must give; x row-major), GS_WSW
 * ppn_op_gemm_swiglu_rows16. */
enum { GS_KW16, GS_FUSED, GS_W, GS_WSW };
static void gs_pair(int arm, ppn_dptr gu, ppn_dptr out, int odt, ppn_dptr w, int m, int n, int cols)
{
    ppn_kp_gemm q = {.out = gu, .w = w, .x = arm == GS_W ? B.xr : B.xh, .m = m, .rows = 2 * n, .cols = cols,
                     .wdt = PPN_DTYPE_BF16};
    switch (arm) {
    case GS_FUSED: EXPECT_OK(ppn_op_gemm_swiglu(G, S, out, odt, w, PPN_DTYPE_BF16, B.xh, m, n, cols)); break;
    case GS_WSW: EXPECT_OK(ppn_op_gemm_swiglu_rows16(G, S, out, odt, w, PPN_DTYPE_BF16, B.xr, m, n, cols)); break;
    default:
        EXPECT_OK(ppn_op_gemm_tile(G, S, arm == GS_W ? PPN_K_GEMM_TC_W : PPN_K_GEMM_TC_KW16, &q));
        EXPECT_OK(ppn_op_swiglu_rows_to(G, S, out, odt, gu, n, m));
    }
}

/* Arm a into o1 and arm b into o2 (odt out; o1 and o2 filled with different bytes first), downloaded into h1 and h2:
 * 1 where the bytes are the same; a line either way, naming the first byte apart. */
static int gs_same(int a, int b, int odt, ppn_dptr gu, ppn_dptr o1, ppn_dptr o2, unsigned char *h1, unsigned char *h2,
                   int m, int n, int cols, const char *what, const char *shape)
{
    const size_t es = odt == PPN_DTYPE_F32 ? 4u : 2u, nb = (size_t)m * (size_t)n * es;
    EXPECT_OK(G->ops->memset_d8(G, S, o1, 0xa5, nb));
    EXPECT_OK(G->ops->memset_d8(G, S, o2, 0x5a, nb));
    gs_pair(a, gu, o1, odt, B.w[PPN_DTYPE_BF16], m, n, cols);
    gs_pair(b, gu, o2, odt, B.w[PPN_DTYPE_BF16], m, n, cols);
    tu_download(G, S, h1, o1, nb);
    tu_download(G, S, h2, o2, nb);
    const int same = !memcmp(h1, h2, nb);
    size_t first = 0;
    while (!same && first < nb && h1[first] == h2[first]) first++;
    printf("  %s %-11s m=%-4d %s out: ", what, shape, m, es == 2 ? "bf16" : "f32 ");
    if (same) printf("the bytes of %s + swiglu_rows\n", a == GS_W ? "gemm_tc_w" : "gemm_tc_kw16");
    else printf("DIFFERENT (first at byte %zu: token %zu)\n", first, first / ((size_t)n * es));
    return same;
}

static double gs_burst_ms(int arm, ppn_dptr gu, ppn_dptr out, int m, int n, int cols)
{
    size_t wb = (size_t)2 * n * cols * 2, slots = B.wn[PPN_DTYPE_BF16] * 2 / wb;
    unsigned turn = 0;
    float ms[GD_REPS];
    for (int r = -1; r < GD_REPS; r++) {
        EXPECT_OK(G->ops->event_record(G, ev[0], S));
        for (int i = 0; i < GD_BURST; i++)
            gs_pair(arm, gu, out, arm >= GS_W ? PPN_ODT_BF16_ROWS : PPN_DTYPE_BF16,
                    B.w[PPN_DTYPE_BF16] + (size_t)(turn++ % slots) * wb, m, n, cols);
        EXPECT_OK(G->ops->event_record(G, ev[1], S));
        EXPECT_OK(G->ops->stream_sync(G, S));
        if (r >= 0) EXPECT_OK(G->ops->event_elapsed(G, ev[0], ev[1], &ms[r]));
    }
    qsort(ms, GD_REPS, sizeof ms[0], cmp_float);
    return ms[GD_REPS / 2] / GD_BURST;
}

static void test_gpu_gemm_swiglu(void **state)
{
    (void)state;
    const gs_shape *sh = gs_shapes;
    static const int ms[] = {8, 17, 32, 40, 64, 100, 128, 150, 192, 193};
    size_t ob = (size_t)GS_MAX_M * 14336 * 4;
    ppn_dptr gu = tu_dalloc(G, 0, ob * 2), o1 = tu_dalloc(G, 0, ob), o2 = tu_dalloc(G, 0, ob);
    unsigned char *h1 = hmem(ob), *h2 = hmem(ob);
    for (int i = 0; i < 2; i++) ev[i] = tu_event(G, 0, 1);
    int checked = 0, bad = 0;
    for (size_t a = 0; a < TU_LEN(gs_shapes); a++) {
        int n = sh[a].n, cols = sh[a].cols;
        if ((size_t)2 * n * cols > B.wn[PPN_DTYPE_BF16] || cols > GG_MAX_COLS) continue; /* GG_SMOKE's pool */
        for (size_t j = 0; j < TU_LEN(ms); j++) {
            int m = ms[j];
            if (!ppn_op_gemm_swiglu_fits(G, S, m, n, cols, PPN_DTYPE_BF16)) {
                if (ppn_op_gemm_x16_fits(m, 2 * n, cols, PPN_DTYPE_BF16) && gg_tma())
                    fail_msg("%s m=%d: gemm_tc_kw16 takes it on a TMA device, gemm_swiglu does not", sh[a].name, m);
                printf("  swiglu %-11s m=%-4d not taken (ppn_op_gemm_x16_fits %d, TMA %d)\n", sh[a].name, m,
                       ppn_op_gemm_x16_fits(m, 2 * n, cols, PPN_DTYPE_BF16), gg_tma());
                continue;
            }
            for (int bf = 0; bf < 2; bf++) {
                const int same = gs_same(GS_KW16, GS_FUSED, bf ? PPN_DTYPE_BF16 : PPN_DTYPE_F32, gu, o1, o2, h1, h2,
                                         m, n, cols, "swiglu", sh[a].name);
                checked++, bad += !same;
            }
        }
    }
#ifndef GG_SMOKE
    printf("  per layer in bursts of %d (median of %d), bf16 out: gemm_tc_kw16 + swiglu_rows against ppn_op_gemm_swiglu "
           "(PPN_TMA %d, PPN_GEMM_KX %d)\n", GD_BURST, GD_REPS, gg_tma(), G->gemm_kx);
    for (size_t a = 0; a < TU_LEN(gs_shapes); a++)
        for (size_t j = 0; j < TU_LEN(ms); j++) {
            int m = ms[j], n = sh[a].n, cols = sh[a].cols;
            if (!ppn_op_gemm_swiglu_fits(G, S, m, n, cols, PPN_DTYPE_BF16)) continue;
            double t0 = gs_burst_ms(GS_KW16, gu, o1, m, n, cols), t1 = gs_burst_ms(GS_FUSED, gu, o1, m, n, cols);
            printf("  swiglu %-11s m=%-4d two kernels %8.2f us, gemm_swiglu %8.2f us (%+.1f%%)\n", sh[a].name, m,
                   t0 * 1e3, t1 * 1e3, 100.0 * (t1 - t0) / t0);
        }
#endif
    for (int i = 0; i < 2; i++) G->ops->event_destroy(G, ev[i]);
    G->ops->mem_free(G, 0, gu), G->ops->mem_free(G, 0, o1), G->ops->mem_free(G, 0, o2);
    free(h1), free(h2);
    if (gg_tma() && !checked) fail_msg("gemm_swiglu was taken on no shape of a TMA device");
    if (bad) fail_msg("%d of %d gemm_swiglu cases differ from gemm_tc_kw16 + swiglu_rows", bad, checked);
}

/* gemm_swiglu_w (ppn_op_gemm_swiglu_rows16: gemm_tc_w over gate|up with SwiGLU in its epilogue, two warpgroups a
 * CTA) against gemm_tc_w forced then swiglu rows: the same bytes in f32 and bf16 row-major out, on the llama-1b / 8b
 * gate|up matrices at every m it takes (up to 128); then per layer in bursts (bf16 out): gemm_tc_w + swiglu rows,
 * gemm_swiglu_w, and the split-K gemm_swiglu where it fits (its x and out in gemm_tc_kw16's layout). */
static void test_gpu_gemm_swiglu_w(void **state)
{
    (void)state;
    const gs_shape *sh = gs_shapes;
    static const int ms[] = {1, 16, 17, 32, 33, 48, 64, 65, 80, 81, 100, 112, 128};
    size_t ob = (size_t)128 * 14336 * 4;
    ppn_dptr gu = tu_dalloc(G, 0, ob * 2), o1 = tu_dalloc(G, 0, ob), o2 = tu_dalloc(G, 0, ob);
    unsigned char *h1 = hmem(ob), *h2 = hmem(ob);
    for (int i = 0; i < 2; i++) ev[i] = tu_event(G, 0, 1);
    int checked = 0, bad = 0;
    for (size_t a = 0; a < TU_LEN(gs_shapes); a++) {
        int n = sh[a].n, cols = sh[a].cols;
        if ((size_t)2 * n * cols > B.wn[PPN_DTYPE_BF16] || cols > GG_MAX_COLS) continue; /* GG_SMOKE's pool */
        for (size_t j = 0; j < TU_LEN(ms); j++) {
            int m = ms[j];
            if (!ppn_op_gemm_swiglu_rows16_fits(G, S, m, n, cols, PPN_DTYPE_BF16)) {
                if (gg_tma()) fail_msg("%s m=%d: gemm_swiglu_w not taken on a TMA device", sh[a].name, m);
                continue;
            }
            for (int bf = 0; bf < 2; bf++) {
                const int same = gs_same(GS_W, GS_WSW, bf ? PPN_ODT_BF16_ROWS : PPN_DTYPE_F32, gu, o1, o2, h1, h2, m,
                                         n, cols, "swiglu_w", sh[a].name);
                checked++, bad += !same;
            }
        }
    }
#ifndef GG_SMOKE
    printf("  per layer in bursts of %d (median of %d), bf16 out, us: gemm_tc_w + swiglu_rows | gemm_swiglu_w | "
           "gemm_swiglu (PPN_GEMM_KX %d)\n", GD_BURST, GD_REPS, G->gemm_kx);
    for (size_t a = 0; a < TU_LEN(gs_shapes); a++)
        for (size_t j = 0; j < TU_LEN(ms); j++) {
            int m = ms[j], n = sh[a].n, cols = sh[a].cols;
            if (!ppn_op_gemm_swiglu_rows16_fits(G, S, m, n, cols, PPN_DTYPE_BF16)) continue;
            double t0 = gs_burst_ms(GS_W, gu, o1, m, n, cols), t1 = gs_burst_ms(GS_WSW, gu, o1, m, n, cols);
            double t2 = ppn_op_gemm_swiglu_fits(G, S, m, n, cols, PPN_DTYPE_BF16) ? gs_burst_ms(GS_FUSED, gu, o1, m, n,
                                                                                                 cols) : 0.0;
            printf("  swiglu_w %-11s m=%-4d %8.2f | %8.2f (%+.1f%%) | ", sh[a].name, m, t0 * 1e3, t1 * 1e3,
                   100.0 * (t1 - t0) / t0);
            if (t2 > 0) printf("%8.2f\n", t2 * 1e3);
            else printf("     -\n");
        }
#endif
    for (int i = 0; i < 2; i++) G->ops->event_destroy(G, ev[i]);
    G->ops->mem_free(G, 0, gu), G->ops->mem_free(G, 0, o1), G->ops->mem_free(G, 0, o2);
    free(h1), free(h2);
    if (gg_tma() && !checked) fail_msg("gemm_swiglu_w was taken on no shape of a TMA device");
    if (bad) fail_msg("%d of %d gemm_swiglu_w cases differ from gemm_tc_w + swiglu_rows", bad, checked);
}

/* The split-K tiles' K split and ring depth swept (ppn_op_gemm_tile's ks and stages) on every llama-1b / 8b matrix
 * but the lm heads, at the m each tile is taken for: per launch in bursts, % of the copy floor. The op's choice
 * comes first; "best" names the fastest combination. A table for choosing kparams.h's KS and STAGES, not a
 * check: it fails only if a launch does. Run alone with PPN_GPU_TEST_FILTER=test_gpu_gemm_sweep. */
static void test_gpu_gemm_sweep(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++) ev[i] = tu_event(G, 0, 1);
    double floor_gbs = copy_gbs((size_t)512 << 20);
    printf("  copy floor %.0f GB/s; entries ks/stages: %% of the floor\n", floor_gbs);
    static const struct { int k, m; } runs[] = {
        {PPN_K_GEMM_TC_K, 1},   {PPN_K_GEMM_TC_K, 4},   {PPN_K_GEMM_TC_K, 8},   {PPN_K_GEMM_TC_K, 16},
        {PPN_K_GEMM_TC_K, 32},  {PPN_K_GEMM_TC_KW, 32}, {PPN_K_GEMM_TC_KW, 64}, {PPN_K_GEMM_TC_KW, 128},
        {PPN_K_GEMM_TC_KWX, 32}, {PPN_K_GEMM_TC_KWX, 64},
    };
    static const int kss[] = {1, 2, 4, 8}, k_st[] = {3, 4}, kw_st[] = {3}, kwx_st[] = {3};
    const gg_shape *all[] = {shapes_1b, shapes_8b};
    for (size_t r = 0; r < TU_LEN(runs); r++)
        for (int a = 0; a < 2; a++)
            for (int i = 0; i < 4; i++) {
                const gg_shape *sh = &all[a][i];
                int k = runs[r].k;
                ppn_kp_gemm p = {.out = B.out, .w = B.w[PPN_DTYPE_BF16], .x = B.x, .m = runs[r].m, .rows = sh->rows,
                                 .cols = sh->cols, .wdt = PPN_DTYPE_BF16};
                double wb = (double)sh->rows * sh->cols * 2, pct0 = 100.0 * wb / (burst_ms(k, p) * 1e6) / floor_gbs;
                char line[1024];
                int n = snprintf(line, sizeof line, "  sweep %-10s m=%-4d %-10s default %5.1f%% |", sh->name, p.m,
                                 kname(k), pct0);
                double best = 0;
                int bks = 0, bst = 0;
                const int *st = k == PPN_K_GEMM_TC_K ? k_st : k == PPN_K_GEMM_TC_KW ? kw_st : kwx_st;
                int nst = k == PPN_K_GEMM_TC_K ? (int)TU_LEN(k_st) : 1;
                for (size_t x = 0; x < TU_LEN(kss); x++)
                    for (int y = 0; y < nst; y++) {
                        if (k == PPN_K_GEMM_TC_K && PPN_GEMM_TC_K_SMEM_S(p.m, st[y]) > PPN_DYN_SMEM_MAX) continue;
                        p.ks = kss[x], p.stages = st[y];
                        double pct = 100.0 * wb / (burst_ms(k, p) * 1e6) / floor_gbs;
                        if (pct > best) best = pct, bks = kss[x], bst = st[y];
                        n += snprintf(line + n, sizeof line - (size_t)n, " %d/%d %.1f", kss[x], st[y], pct);
                    }
                printf("%s | best %d/%d %.1f%%\n", line, bks, bst, best);
            }
    for (int i = 0; i < 2; i++) G->ops->event_destroy(G, ev[i]);
}

int main(void)
{
    ppn_status st = ppn_gpu_open(GG_BACKEND, ppn_kernel_set(), &G);
    if (st != PPN_OK) {
        fprintf(stderr, "test_gpu_gemm: FAIL: no cuda backend: %s: %s\n", ppn_status_name(st), ppn_last_error());
        return 1;
    }
    st = G->ops->stream_create(G, 0, &S);
    if (st != PPN_OK) {
        fprintf(stderr, "test_gpu_gemm: FAIL: stream_create: %s: %s\n", ppn_status_name(st), ppn_last_error());
        ppn_gpu_close(G);
        return 1;
    }
    const char *only = getenv("PPN_GPU_TEST_FILTER");
    if (only && *only) cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_gemm_correct),
        cmocka_unit_test(test_gpu_gemm_swiglu),
        cmocka_unit_test(test_gpu_gemm_swiglu_w),
#ifndef GG_SMOKE
        cmocka_unit_test(test_gpu_gemm_timing),
        cmocka_unit_test(test_gpu_gemm_decode),
        cmocka_unit_test(test_gpu_gemm_sweep),
#endif
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    G->ops->stream_destroy(G, S);
    ppn_gpu_close(G);
    return rc;
}
