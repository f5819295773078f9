/* test_gpu_kernels.c - every CUDA kernel of the table against its CPU reference, on a real GPU.
 *
 * Each case builds random inputs at realistic sizes, runs the op through kernels/ops.c on the cuda backend,
 * runs it again and demands identical bits (determinism), then compares with the CPU reference (what the sim
 * backend runs) on the same inputs. One line per case gives the max error and its ratio to the tolerance.
 *
 * Tolerances: the CUDA kernels sum in f32 (fmaf, fixed trees) where the reference sums in double, so
 * reductions are held to 1e-5 relative to the sum of absolute terms (matvec, norms) or 1e-5 absolute on
 * softmax-weighted averages of values in [-1, 1] (attention); elementwise math that differs only in libm vs
 * CUDA's expf/sincosf (2 ulp) to 2e-6 relative; copies, embed, fill, add and argmax must match exactly.
 *
 * Runs only where a CUDA driver and GPU exist (./build.sh gputest). Without them it FAILS.
 * PPN_GPU_TEST_FILTER=<cmocka pattern> runs only the tests it names (test_gpu_kernels_matvec_bw: the matvec
 * bandwidth);
 * PPN_MV_SWEEP=0 leaves out the matvec geometry sweep.
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
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tcheck.h"
#include "tests/util/tdev.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

static ppn_gpu *G;
static ppn_gstream *S;

/* ---------------------------------------------------------------------------------------------------------
 * host and device buffers (random inputs: tests/util/trand.h) */

static void *hmem(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* The device buffers of the case in progress, freed by dfree_from / dfree_all (free_buffers after a failure). */
#define MAX_DBUF 32
static ppn_dptr dbufs[MAX_DBUF];
static int ndbuf;

static ppn_dptr dalloc(size_t bytes)
{
    assert_true(ndbuf < MAX_DBUF);
    return dbufs[ndbuf++] = tu_dalloc(G, 0, bytes);
}

/* Frees the buffers allocated since ndbuf was mark. */
static void dfree_from(int mark)
{
    for (int i = mark; i < ndbuf; i++) EXPECT_OK(G->ops->mem_free(G, 0, dbufs[i]));
    ndbuf = mark;
}

static void dfree_all(void) { dfree_from(0); }

static void put(ppn_dptr d, const void *h, size_t bytes) { tu_upload(G, S, d, h, bytes); }

static ppn_dptr up(const void *h, size_t bytes)
{
    ppn_dptr d = dalloc(bytes);
    put(d, h, bytes);
    return d;
}

static void get(void *h, ppn_dptr d, size_t bytes) { tu_download(G, S, h, d, bytes); }

static void sync_ok(void) { EXPECT_OK(G->ops->stream_sync(G, S)); }

/* ---------------------------------------------------------------------------------------------------------
 * comparison */

/* Max over i of |got - ref| / (rel * scale_i + abs), scale_i = scale ? scale[i] : |ref[i]|; a NaN on one
 * side only is an infinite error. *wi: where it is; *max_abs: the largest |got - ref|. */
static double err_ratio(const float *got, const float *ref, size_t n, const double *scale, double rel,
                        double abs_tol, size_t *wi, double *max_abs)
{
    double worst = 0;
    *wi = 0, *max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        double r;
        if (isnan(got[i]) || isnan(ref[i])) r = (isnan(got[i]) && isnan(ref[i])) ? 0 : INFINITY;
        else {
            double e = fabs((double)got[i] - ref[i]);
            if (e > *max_abs) *max_abs = e;
            r = e / (rel * (scale ? scale[i] : fabs((double)ref[i])) + abs_tol);
        }
        if (r > worst) worst = r, *wi = i;
    }
    return worst;
}

/* err_ratio, printing the case line (when verbose); fails when the ratio exceeds 1. Returns the ratio. */
static double compare_v(const char *what, const float *got, const float *ref, size_t n, const double *scale,
                        double rel, double abs_tol, int verbose)
{
    size_t wi;
    double max_abs, worst = err_ratio(got, ref, n, scale, rel, abs_tol, &wi, &max_abs);
    if (verbose) printf("  %-58s max|err| %.3e  err/tol %.3f\n", what, max_abs, worst);
    if (!(worst <= 1.0))
        fail_msg("%s: element %zu: gpu %.9g cpu %.9g (err/tol %.3g)", what, wi, got[wi], ref[wi], worst);
    return worst;
}

static void compare(const char *what, const float *got, const float *ref, size_t n, const double *scale,
                    double rel, double abs_tol)
{
    compare_v(what, got, ref, n, scale, rel, abs_tol, 1);
}

static void exact(const char *what, const void *got, const void *ref, size_t bytes)
{
    printf("  %-58s %s\n", what, memcmp(got, ref, bytes) ? "DIFFERENT BITS" : "bit-exact");
    assert_memory_equal(got, ref, bytes);
}

static void same_bits(const char *what, const void *a, const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes)) fail_msg("%s: two runs on the same inputs gave different bits", what);
}

/* ---------------------------------------------------------------------------------------------------------
 * matvec */

typedef struct mv_case {
    int rows, cols, dt, bias, res, alias;
} mv_case;

/* Row abs-sums: the scale of each row's rounding error. */
static double *mv_scale(const mv_case *c, const void *w, const float *x, const void *b, const float *res)
{
    double *sc = hmem((size_t)c->rows * sizeof *sc);
    for (int r = 0; r < c->rows; r++) {
        double a = 0;
        for (int k = 0; k < c->cols; k++) a += fabs(tu_wval(w, c->dt, (size_t)r * c->cols + k) * (double)x[k]);
        if (c->bias) a += fabs(tu_wval(b, c->dt, (size_t)r));
        if (c->res) a += fabs(res[r]);
        sc[r] = a;
    }
    return sc;
}

static void matvec_case(const mv_case *c)
{
    size_t R = (size_t)c->rows, C = (size_t)c->cols, es = ppn_dtype_size(c->dt);
    void *w = tu_wrand(c->dt, R * C, NULL), *b = tu_wrand(c->dt, R, NULL);
    float *x = tu_frand(C, -1, 1), *res = tu_frand(R, -2, 2), *ref = hmem(R * 4), *g1 = hmem(R * 4), *g2 = hmem(R * 4);
    ppn_dptr dw = up(w, R * C * es), db = up(b, R * es), dx = up(x, C * 4), dres = up(res, R * 4);
    ppn_dptr dout = c->alias ? dres : dalloc(R * 4);
    /* x again at an address 4 bytes off 16-byte alignment: the scalar path must give the same bits */
    ppn_dptr dxm = dalloc(C * 4 + 16) + 4;
    put(dxm, x, C * 4);
    char what[96];
    snprintf(what, sizeof what, "matvec %s %dx%d%s%s%s", ppn_dtype_name(c->dt), c->rows, c->cols,
             c->bias ? " +bias" : "", c->res ? " +res" : "", c->alias ? " (res aliases out)" : "");
    for (int run = 0; run < 3; run++) {
        if (c->alias) put(dres, res, R * 4);
        EXPECT_OK(ppn_op_matvec(G, S, dout, dw, c->dt, run == 2 ? dxm : dx, c->rows, c->cols, c->bias ? db : 0,
                         c->res ? dres : 0));
        sync_ok();
        get(run == 0 ? g1 : g2, dout, R * 4);
        if (run > 0) same_bits(what, g1, g2, R * 4);
    }
    ppn_kp_matvec p = {.out = D(ref), .w = D(w), .x = D(x), .bias = c->bias ? D(b) : 0,
                       .res = c->res ? D(res) : 0, .rows = c->rows, .cols = c->cols, .wdt = c->dt};
    tu_kernel_run(PPN_K_MATVEC, &p);
    double *sc = mv_scale(c, w, x, b, res);
    compare(what, g1, ref, R, sc, 1e-5, 1e-30);
    free(w), free(b), free(x), free(res), free(ref), free(g1), free(g2), free(sc);
    dfree_all();
}

/* matmat: m tokens of one weight matrix, each token's row checked against the CPU reference (whose rows equal
 * its matvec's), twice for bits; m above PPN_MATMAT_MAX_M exercises the chunked launches. */
static void matmat_case(int rows, int cols, int m, int dt, int bias, int res_on)
{
    size_t R = (size_t)rows, C = (size_t)cols, M = (size_t)m, es = ppn_dtype_size(dt);
    void *w = tu_wrand(dt, R * C, NULL), *b = tu_wrand(dt, R, NULL);
    float *x = tu_frand(M * C, -1, 1), *res = tu_frand(M * R, -2, 2), *ref = hmem(M * R * 4), *g1 = hmem(M * R * 4),
          *g2 = hmem(M * R * 4);
    ppn_dptr dw = up(w, R * C * es), db = up(b, R * es), dx = up(x, M * C * 4), dres = up(res, M * R * 4);
    ppn_dptr dout = dalloc(M * R * 4);
    char what[96];
    snprintf(what, sizeof what, "matmat %s %dx%d m=%d%s%s", ppn_dtype_name(dt), rows, cols, m, bias ? " +bias" : "",
             res_on ? " +res" : "");
    for (int run = 0; run < 2; run++) {
        EXPECT_OK(ppn_op_matmat(G, S, dout, dw, dt, dx, m, rows, cols, bias ? db : 0, res_on ? dres : 0));
        sync_ok();
        get(run == 0 ? g1 : g2, dout, M * R * 4);
    }
    same_bits(what, g1, g2, M * R * 4);
    ppn_kp_matmat p = {.out = D(ref), .w = D(w), .x = D(x), .bias = bias ? D(b) : 0, .res = res_on ? D(res) : 0,
                       .rows = rows, .cols = cols, .m = m, .wdt = dt};
    tu_kernel_run(PPN_K_MATMAT, &p);
    double worst = 0;
    for (int t = 0; t < m; t++) {
        mv_case c = {rows, cols, dt, bias, res_on, 0};
        double *sc = mv_scale(&c, w, x + (size_t)t * C, b, res + (size_t)t * R);
        double r = compare_v(what, g1 + (size_t)t * R, ref + (size_t)t * R, R, sc, 1e-5, 1e-30, 0);
        if (r > worst) worst = r;
        free(sc);
    }
    printf("  %-58s worst err/tol over %d tokens %.3f\n", what, m, worst);
    free(w), free(b), free(x), free(res), free(ref), free(g1), free(g2);
    dfree_all();
}

static void test_gpu_kernels_matmat(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        matmat_case(2048, 2048, 4, dt, 0, 0);
        matmat_case(1000, 4099, PPN_MATMAT_MAX_M + 3, dt, 1, 1);
        matmat_case(3, 7, 1, dt, 1, 1);
    }
}

static void test_gpu_kernels_matvec(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        mv_case cs[] = {
            {2048, 2048, dt, 0, 0, 0}, {2048, 2048, dt, 1, 1, 0}, {4096, 1000, dt, 0, 0, 0},
            {4096, 1000, dt, 1, 0, 0}, {4096, 1000, dt, 0, 1, 1}, {1000, 4099, dt, 1, 1, 1},
            {3, 7, dt, 1, 1, 0},
            /* several warps per row (cols 8192: 4 in bf16); x too wide to stage (57 KB) and odd cols with
             * it; the widest staged x (48 KB less the kernel's 256 static bytes) and one float more; more
             * rows than ops.c's blocks take at once (each block loops) */
            {300, 8192, dt, 0, 1, 0}, {64, 14336, dt, 1, 1, 1}, {40, 14341, dt, 1, 0, 0},
            {33, 12224, dt, 0, 1, 1}, {17, 12225, dt, 1, 0, 0}, {20000, 64, dt, 1, 1, 1},
        };
        for (size_t i = 0; i < TU_LEN(cs); i++) matvec_case(&cs[i]);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * matvec at the llama shapes (bf16, the production dtype): correctness against the CPU reference, bits
 * repeated, a row's bits independent of how many rows share the launch, and bandwidth.
 *
 * Bandwidth = weight bytes / device time between an event pair around one launch (median of MV_TIMED after
 * MV_WARM warm-ups), and the same over MV_TIMED launches back to back. Each launch reads another copy of
 * the weights in a pool of MV_POOL bytes, so a small matrix is not served from L2 (60 MB) by its previous
 * launch, as it is not in a decode step.
 *
 * PPN_MV_SWEEP=0 skips the sweep: geometries the kernel's contract allows (threads per block, a cap on the
 * blocks, x staged in shared memory or not) checked the same way and timed, to choose ops.c's geometry from
 * measurements. Each must give ops.c's bits: the kernel's summation order depends on cols and the dtype only. */

#define MV_WARM 5
#define MV_TIMED 20
#define MV_POOL ((size_t)128256 * 4096 * 2) /* the largest matrix below */

typedef struct mv_shape {
    int rows, cols;
    const char *name;
} mv_shape;

static const mv_shape mv_shapes[] = {
    {2048, 2048, "1b q,o"},     {512, 2048, "1b k,v"},      {3072, 2048, "1b qkv"},    {16384, 2048, "1b gate|up"},
    {2048, 8192, "1b down"},    {128256, 2048, "1b lm head"}, {4096, 4096, "8b q,o"},  {6144, 4096, "8b qkv"},
    {28672, 4096, "8b gate|up"}, {4096, 14336, "8b down"},   {128256, 4096, "8b lm head"},
};

/* A launch geometry; threads 0 = ppn_op_matvec's own. ctas: at most this many blocks (0: enough for a row
 * group each), each then looping over rows. */
typedef struct mv_geo {
    unsigned threads, ctas;
    int xs;
} mv_geo;

/* The kernel's G (warps per row) for these cols, as ppn_kernels.cu picks it: here only to count blocks. */
static unsigned mv_split(int cols, int dt)
{
    size_t chunks = ((size_t)cols * ppn_dtype_size(dt) + 15) / 16;
    unsigned g = 1;
    while (g < 8 && chunks > 256u * g) g *= 2;
    return g;
}

static ppn_gevent *mv_ev[2 * MV_TIMED + 2];
static int free_buffers(void **state);
static unsigned mv_turn; /* which copy of the weights the next timed launch reads */

static void mv_run(const mv_geo *geo, ppn_dptr out, ppn_dptr w, ppn_dptr x, const mv_shape *sh, int dt)
{
    if (!geo->threads) {
        EXPECT_OK(ppn_op_matvec(G, S, out, w, dt, x, sh->rows, sh->cols, 0, 0));
        return;
    }
    unsigned rb = geo->threads / (32u * mv_split(sh->cols, dt)), nb = ((unsigned)sh->rows + rb - 1) / rb;
    if (geo->ctas && nb > geo->ctas) nb = geo->ctas;
    ppn_kp_matvec p = {.out = out, .w = w, .x = x, .rows = sh->rows, .cols = sh->cols, .wdt = dt};
    ppn_launch l = {.kernel = PPN_K_MATVEC, .grid = {nb, 1, 1},
                    .block = {geo->threads, 1, 1}, .smem = geo->xs ? (unsigned)sh->cols * 4u : 0,
                    .params = &p, .params_size = sizeof p, .nacc = 0};
    EXPECT_OK(G->ops->launch(G, S, &l));
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median single-launch and mean back-to-back device time in us. */
static void mv_time(const mv_geo *geo, ppn_dptr out, ppn_dptr pool, ppn_dptr x, const mv_shape *sh, int dt,
                    double *med_us, double *b2b_us)
{
    size_t wb = (size_t)sh->rows * sh->cols * ppn_dtype_size(dt), slots = MV_POOL / wb ? MV_POOL / wb : 1;
#define MV_W() (pool + (size_t)(mv_turn++ % slots) * wb)
    for (int i = 0; i < MV_WARM; i++) mv_run(geo, out, MV_W(), x, sh, dt);
    for (int i = 0; i < MV_TIMED; i++) {
        EXPECT_OK(G->ops->event_record(G, mv_ev[2 * i], S));
        mv_run(geo, out, MV_W(), x, sh, dt);
        EXPECT_OK(G->ops->event_record(G, mv_ev[2 * i + 1], S));
    }
    EXPECT_OK(G->ops->event_record(G, mv_ev[2 * MV_TIMED], S));
    for (int i = 0; i < MV_TIMED; i++) mv_run(geo, out, MV_W(), x, sh, dt);
    EXPECT_OK(G->ops->event_record(G, mv_ev[2 * MV_TIMED + 1], S));
#undef MV_W
    sync_ok();
    float ms[MV_TIMED], all;
    for (int i = 0; i < MV_TIMED; i++) EXPECT_OK(G->ops->event_elapsed(G, mv_ev[2 * i], mv_ev[2 * i + 1], &ms[i]));
    EXPECT_OK(G->ops->event_elapsed(G, mv_ev[2 * MV_TIMED], mv_ev[2 * MV_TIMED + 1], &all));
    qsort(ms, MV_TIMED, sizeof ms[0], cmp_float);
    *med_us = 500.0 * (ms[MV_TIMED / 2 - 1] + ms[MV_TIMED / 2]);
    *b2b_us = 1000.0 * all / MV_TIMED;
}

/* Runs geo on the pool's first copy with x aligned and x 4 bytes off, demands equal bits, checks against
 * the reference; got receives the result. Returns err/tol. */
static double mv_check(const mv_geo *geo, const char *what, ppn_dptr out, ppn_dptr pool, ppn_dptr x,
                       ppn_dptr xm, const mv_shape *sh, int dt, const float *ref, const double *sc, float *got,
                       float *tmp)
{
    size_t R = (size_t)sh->rows;
    mv_run(geo, out, pool, x, sh, dt);
    sync_ok();
    get(got, out, R * 4);
    mv_run(geo, out, pool, xm, sh, dt);
    sync_ok();
    get(tmp, out, R * 4);
    same_bits(what, got, tmp, R * 4);
    return compare_v(what, got, ref, R, sc, 1e-5, 1e-30, 0);
}

static double gbs(const mv_shape *sh, int dt, double us)
{
    return (double)sh->rows * sh->cols * ppn_dtype_size(dt) / (us * 1e3);
}

/* A block of rows on its own (the weights from row r0 on) gives the bits it has in the whole launch. */
static void mv_rows_alone(ppn_dptr out, ppn_dptr pool, ppn_dptr x, const mv_shape *sh, int dt,
                          const float *whole, float *tmp)
{
    int r0 = sh->rows / 3, n = sh->rows - r0 < 512 ? sh->rows - r0 : 512;
    mv_shape part = {n, sh->cols, sh->name};
    mv_geo def = {0, 0, 0};
    mv_run(&def, out, pool + (size_t)r0 * sh->cols * ppn_dtype_size(dt), x, &part, dt);
    sync_ok();
    get(tmp, out, (size_t)n * 4);
    if (memcmp(tmp, whole + r0, (size_t)n * 4))
        fail_msg("matvec %s: rows %d..%d alone differ in bits from the same rows in the whole launch", sh->name,
                 r0, r0 + n - 1);
}

/* The sweep: threads per block (multiples of 256, the contract) x block cap x x staged or not. */
static const unsigned mv_threads[] = {256, 512, 1024}, mv_caps[] = {0, 264, 528, 1056, 2112};

/* The sweep for one shape: every geometry checked and timed; all give the bits of ops.c's (want). */
static void mv_sweep_shape(const mv_shape *sh, int dt, ppn_dptr out, ppn_dptr pool, ppn_dptr x, ppn_dptr xm,
                           const float *ref, const double *sc, const float *want, double def_b2b)
{
    size_t R = (size_t)sh->rows;
    float *got = hmem(R * 4), *tmp = hmem(R * 4);
    double best = 0, best_med = 0, worst_ratio = 0;
    mv_geo bg = {0, 0, 0};
    int n = 0;
    for (size_t ti = 0; ti < TU_LEN(mv_threads); ti++)
        for (int xs = 0; xs < 2; xs++)
            for (size_t ci = 0; ci < TU_LEN(mv_caps); ci++) {
                mv_geo geo = {mv_threads[ti], mv_caps[ci], xs};
                if (xs && (size_t)sh->cols * 4 > 49152 - 256) continue; /* 48 KB less the static */
                char what[112];
                snprintf(what, sizeof what, "matvec %s %dx%d threads=%u ctas=%u x %s", ppn_dtype_name(dt), sh->rows,
                         sh->cols, geo.threads, geo.ctas, xs ? "staged" : "cached");
                double ratio = mv_check(&geo, what, out, pool, x, xm, sh, dt, ref, sc, got, tmp);
                if (ratio > worst_ratio) worst_ratio = ratio;
                if (memcmp(want, got, R * 4)) fail_msg("%s: bits differ from ops.c's geometry", what);
                double med, b2b;
                mv_time(&geo, out, pool, x, sh, dt, &med, &b2b);
                printf("    sweep %-10s thr=%-4u ctas=%-4u x %-6s single %8.2f us %5.0f GB/s  b2b %8.2f us %5.0f "
                       "GB/s  err/tol %.3f\n",
                       sh->name, geo.threads, geo.ctas, xs ? "staged" : "cached", med, gbs(sh, dt, med), b2b,
                       gbs(sh, dt, b2b), ratio);
                if (gbs(sh, dt, b2b) > best) best = gbs(sh, dt, b2b), best_med = gbs(sh, dt, med), bg = geo;
                n++;
            }
    printf("  bw best %-10s of %d: thr=%u ctas=%u x %s: b2b %.0f GB/s single %.0f GB/s (ops.c b2b %.0f); "
           "worst err/tol %.3f\n",
           sh->name, n, bg.threads, bg.ctas, bg.xs ? "staged" : "cached", best, best_med, gbs(sh, dt, def_b2b),
           worst_ratio);
    free(got), free(tmp);
}

static void test_gpu_kernels_matvec_bw(void **state)
{
    (void)state;
    const int dt = PPN_DTYPE_BF16;
    const char *sw = getenv("PPN_MV_SWEEP");
    int sweep = !(sw && !strcmp(sw, "0"));
    ppn_device_info di;
    EXPECT_OK(G->ops->device_info(G, 0, &di));
    printf("  bw device %s, %d SMs; weights bf16, x f32; pool %.2f GB\n", di.name, di.sm_count, MV_POOL / 1e9);
    for (size_t i = 0; i < TU_LEN(mv_ev); i++) EXPECT_OK(G->ops->event_create(G, 0, 1, &mv_ev[i]));
    /* the pool: random bf16 in [-1, 1), a 64 MB pattern repeated; every shape's matrix is its prefix */
    size_t pat = (size_t)1 << 25;
    uint16_t *hw = tu_wrand(dt, pat, NULL);
    uint16_t *hpool = hmem(MV_POOL);
    for (size_t off = 0; off < MV_POOL / 2; off += pat)
        memcpy(hpool + off, hw, (MV_POOL / 2 - off < pat ? MV_POOL / 2 - off : pat) * 2);
    free(hw);
    ppn_dptr pool = up(hpool, MV_POOL);
    double tot_step[2] = {0, 0};
    for (size_t s = 0; s < TU_LEN(mv_shapes); s++) {
        const mv_shape *sh = &mv_shapes[s];
        int mark = ndbuf; /* this shape's buffers, freed after it */
        size_t R = (size_t)sh->rows, C = (size_t)sh->cols;
        float *x = tu_frand(C, -1, 1), *ref = hmem(R * 4), *got = hmem(R * 4), *tmp = hmem(R * 4);
        ppn_dptr dx = up(x, C * 4), dxm = dalloc(C * 4 + 16) + 4, out = dalloc(R * 4);
        put(dxm, x, C * 4);
        ppn_kp_matvec p = {.out = D(ref), .w = D(hpool), .x = D(x), .rows = sh->rows, .cols = sh->cols, .wdt = dt};
        tu_kernel_run(PPN_K_MATVEC, &p);
        mv_case mc = {sh->rows, sh->cols, dt, 0, 0, 0};
        double *sc = mv_scale(&mc, hpool, x, NULL, NULL);
        char what[96];
        snprintf(what, sizeof what, "matvec %s %dx%d (%s)", ppn_dtype_name(dt), sh->rows, sh->cols, sh->name);
        mv_geo def = {0, 0, 0};
        double ratio = mv_check(&def, what, out, pool, dx, dxm, sh, dt, ref, sc, got, tmp);
        mv_rows_alone(out, pool, dx, sh, dt, got, tmp);
        double med, b2b;
        mv_time(&def, out, pool, dx, sh, dt, &med, &b2b);
        printf("  bw %-10s %6dx%-5d %7.1f MB  single %8.2f us %6.0f GB/s  b2b %8.2f us %6.0f GB/s  err/tol %.3f\n",
               sh->name, sh->rows, sh->cols, R * C * 2 / 1e6, med, gbs(sh, dt, med), b2b, gbs(sh, dt, b2b), ratio);
        /* a decode step's matvecs: qkv, o, gate|up, down per layer (16 in 1b, 32 in 8b) and the lm head */
        int layers = sh->name[0] == '1' ? 16 : 32, k = sh->name[0] == '1' ? 0 : 1;
        if (strstr(sh->name, "lm head")) tot_step[k] += b2b;
        else if (!strstr(sh->name, "k,v")) tot_step[k] += layers * b2b;
        if (sweep) mv_sweep_shape(sh, dt, out, pool, dx, dxm, ref, sc, got, b2b);
        free(x), free(ref), free(got), free(tmp), free(sc);
        dfree_from(mark);
    }
    printf("  bw decode-step matvecs (b2b, ops.c geometry): llama-1b %.1f us, llama-8b %.1f us\n", tot_step[0],
           tot_step[1]);
    free(hpool);
}

/* After test_gpu_kernels_matvec_bw, passed or failed: its events and buffers. */
static int mv_teardown(void **state)
{
    for (size_t i = 0; i < TU_LEN(mv_ev); i++)
        if (mv_ev[i]) G->ops->event_destroy(G, mv_ev[i]), mv_ev[i] = NULL;
    return free_buffers(state);
}

/* ---------------------------------------------------------------------------------------------------------
 * rmsnorm, head_rmsnorm */

static void rmsnorm_case(int n, int dt, int inplace)
{
    void *w = tu_wrand(dt, (size_t)n, NULL);
    float *x = tu_frand((size_t)n, -3, 3), *ref = hmem((size_t)n * 4), *g1 = hmem((size_t)n * 4),
          *g2 = hmem((size_t)n * 4);
    size_t es = ppn_dtype_size(dt);
    ppn_dptr dx = up(x, (size_t)n * 4), dw = up(w, (size_t)n * es), dout = inplace ? dx : dalloc((size_t)n * 4);
    char what[96];
    snprintf(what, sizeof what, "rmsnorm %s n=%d%s", ppn_dtype_name(dt), n, inplace ? " in place" : "");
    for (int run = 0; run < 2; run++) {
        put(dx, x, (size_t)n * 4);
        EXPECT_OK(ppn_op_rmsnorm(G, S, dout, dx, dw, dt, n, 1e-5f));
        sync_ok();
        get(run ? g2 : g1, dout, (size_t)n * 4);
    }
    same_bits(what, g1, g2, (size_t)n * 4);
    ppn_kp_rmsnorm p = {.out = D(ref), .in = D(x), .w = D(w), .n = n, .wdt = dt, .eps = 1e-5f};
    tu_kernel_run(PPN_K_RMSNORM, &p);
    compare(what, g1, ref, (size_t)n, NULL, 1e-5, 1e-30);
    free(w), free(x), free(ref), free(g1), free(g2);
    dfree_all();
}

static void head_rmsnorm_case(int nh, int hd, int dt)
{
    size_t n = (size_t)nh * hd;
    void *w = tu_wrand(dt, (size_t)hd, NULL);
    float *x = tu_frand(n, -3, 3), *ref = hmem(n * 4), *g1 = hmem(n * 4), *g2 = hmem(n * 4);
    ppn_dptr dx = up(x, n * 4), dw = up(w, (size_t)hd * ppn_dtype_size(dt));
    char what[96];
    snprintf(what, sizeof what, "head_rmsnorm %s heads=%d head_dim=%d", ppn_dtype_name(dt), nh, hd);
    for (int run = 0; run < 2; run++) {
        put(dx, x, n * 4);
        EXPECT_OK(ppn_op_head_rmsnorm(G, S, dx, nh, hd, dw, dt, 1e-6f));
        sync_ok();
        get(run ? g2 : g1, dx, n * 4);
    }
    same_bits(what, g1, g2, n * 4);
    memcpy(ref, x, n * 4);
    ppn_kp_head_rmsnorm p = {.x = D(ref), .w = D(w), .n_heads = nh, .head_dim = hd, .wdt = dt, .eps = 1e-6f};
    tu_kernel_run(PPN_K_HEAD_RMSNORM, &p);
    compare(what, g1, ref, n, NULL, 1e-5, 1e-30);
    free(w), free(x), free(ref), free(g1), free(g2);
    dfree_all();
}

static void test_gpu_kernels_norms(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        rmsnorm_case(4096, dt, 0);
        rmsnorm_case(8192, dt, 1);
        rmsnorm_case(1000, dt, 0);
        head_rmsnorm_case(32, 128, dt);
        head_rmsnorm_case(8, 64, dt);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * rope (with its KV store), attention */

/* Element i of a KV cache of dtype kd set to v, rounded as the CPU rounds it (ppn_f32_to_*). */
static void cache_put(void *c, int kd, size_t i, float v)
{
    if (kd == PPN_DTYPE_BF16) ((uint16_t *)c)[i] = ppn_f32_to_bf16(v);
    else if (kd == PPN_DTYPE_F16) ((uint16_t *)c)[i] = ppn_f32_to_f16(v);
    else ((float *)c)[i] = v;
}

/* rope_kv over nq + nkv heads, twice for bits: the rotated heads against the CPU reference (cos/sin differ by
 * ulps between libm and CUDA); row pos of each KV head's cache holds that head's rotated k (the GPU's own
 * rotation) and its v, rounded to kd as the CPU rounds them, bit for bit; every other row is untouched, and a
 * position outside the cache stores nothing. */
static void rope_case(int nq, int nkv, int hd, int ctx, int interleaved, int32_t pos, int kd)
{
    int nh = nq + nkv;
    size_t n = (size_t)nh * hd, kvn = (size_t)nkv * hd, csz = (size_t)nkv * ctx * hd, cb = csz * ppn_dtype_size(kd);
    float *inv = hmem((size_t)hd / 2 * 4), *x = tu_frand(n, -2, 2), *v = tu_frand(kvn, -2, 2), *ref = hmem(n * 4),
          *g1 = hmem(n * 4), *g2 = hmem(n * 4);
    void *c0 = tu_wrand(kd, csz, NULL), *k1 = hmem(cb), *v1 = hmem(cb), *k2 = hmem(cb), *v2 = hmem(cb), *ek = hmem(cb),
         *ev = hmem(cb);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
    ppn_step_hdr hdr = {.pos = pos, .token = 0, .seq = 0, .step = 0};
    ppn_dptr dx = up(x, n * 4), dinv = up(inv, (size_t)hd / 2 * 4), dh = up(&hdr, sizeof hdr), dv = up(v, kvn * 4),
             dkc = up(c0, cb), dvc = up(c0, cb);
    char what[112];
    snprintf(what, sizeof what, "rope_kv %s %d+%d heads head_dim=%d ctx=%d pos=%d %s",
             interleaved ? "interleaved" : "hf", nq, nkv, hd, ctx, pos, ppn_dtype_name(kd));
    for (int run = 0; run < 2; run++) {
        put(dx, x, n * 4), put(dkc, c0, cb), put(dvc, c0, cb);
        EXPECT_OK(tu_op_rope_kv(G, S, dx, nq, nkv, hd, dinv, interleaved, dh, dkc, dvc, dv, ctx, kd));
        sync_ok();
        get(run ? g2 : g1, dx, n * 4), get(run ? k2 : k1, dkc, cb), get(run ? v2 : v1, dvc, cb);
    }
    same_bits(what, g1, g2, n * 4);
    same_bits(what, k1, k2, cb);
    same_bits(what, v1, v2, cb);
    memcpy(ref, x, n * 4);
    ppn_kp_rope p = {.x = D(ref), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = nh, .head_dim = hd,
                     .interleaved = interleaved};
    tu_kernel_run(PPN_K_ROPE, &p);
    /* scale: |x0| + |x1| of the element's pair (cos/sin differ by ulps between libm and CUDA) */
    double *sc = hmem(n * sizeof *sc);
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd / 2; i++) {
            size_t base = (size_t)h * hd;
            size_t a = base + (interleaved ? 2 * i : i), b = base + (interleaved ? 2 * i + 1 : i + hd / 2);
            sc[a] = sc[b] = fabs(x[a]) + fabs(x[b]);
        }
    compare(what, g1, ref, n, sc, 2e-6, 1e-30);
    memcpy(ek, c0, cb), memcpy(ev, c0, cb);
    if (pos >= 0 && pos < ctx)
        for (int h = 0; h < nkv; h++)
            for (int i = 0; i < hd; i++) {
                size_t at = ((size_t)h * ctx + (size_t)pos) * hd + (size_t)i;
                cache_put(ek, kd, at, g1[(size_t)(nq + h) * hd + (size_t)i]);
                cache_put(ev, kd, at, v[(size_t)h * hd + (size_t)i]);
            }
    exact("  the k cache: the rotated k heads at pos", k1, ek, cb);
    exact("  the v cache: v at pos", v1, ev, cb);
    free(inv), free(x), free(v), free(ref), free(g1), free(g2), free(c0), free(k1), free(v1), free(k2), free(v2),
        free(ek), free(ev), free(sc);
    dfree_all();
}

static void test_gpu_kernels_rope(void **state)
{
    (void)state;
    static const int32_t poss[] = {0, 1, 4095, 100000};
    for (int il = 0; il < 2; il++)
        for (size_t i = 0; i < TU_LEN(poss); i++) {
            rope_case(24, 8, 128, 4096, il, poss[i], PPN_DTYPE_F32);
            rope_case(6, 2, 64, 100, il, poss[i], PPN_DTYPE_F32); /* 4095 and on: outside the cache */
        }
    rope_case(32, 8, 128, 64, 0, 37, PPN_DTYPE_F32);        /* llama-8b's q|k */
    rope_case(24, 8, 128, 4096, 0, 4095, PPN_DTYPE_BF16);   /* caches in the weights' dtype */
    rope_case(8, 8, 64, 512, 1, 7, PPN_DTYPE_F16);
}

/* Two launches back to back on one scratch (no sync between: the second relies on the first having reset
 * the counters in stream order) must give the same bits; then the counters must read 0 (the first n_kv count
 * the CTAs of each KV head, the rest are never touched) and the result match the CPU reference, which
 * computes the exact attention whatever n_split is. */
static void attn_case(int nh, int nkv, int hd, int ctx, int32_t pos, int ns, int kd)
{
    size_t csz = (size_t)nkv * ctx * hd, qn = (size_t)nh * hd, pb = ppn_op_attn_scratch_bytes(nh, ns, hd);
    size_t cnt_at = pb - (size_t)nh * sizeof(uint32_t);
    size_t cb = csz * ppn_dtype_size(kd);
    float *q = tu_frand(qn, -1, 1);
    void *kc = tu_wrand(kd, csz, NULL), *vc = tu_wrand(kd, csz, NULL);
    float *ref = hmem(qn * 4), *g1 = hmem(qn * 4), *g2 = hmem(qn * 4);
    uint32_t *cnt = hmem((size_t)nh * sizeof *cnt);
    for (size_t i = 0; i < qn; i++) q[i] *= 4.0f; /* a softmax that is neither flat nor one-hot */
    ppn_step_hdr hdr = {.pos = pos};
    float scale = 1.0f / sqrtf((float)hd);
    ppn_dptr dq = up(q, qn * 4), dkc = up(kc, cb), dvc = up(vc, cb), dh = up(&hdr, sizeof hdr),
             dout1 = dalloc(qn * 4), dout2 = dalloc(qn * 4), dpart = dalloc(pb);
    EXPECT_OK(G->ops->memset_d8(G, S, dpart, 0, pb)); /* once, as seq.c does at allocation */
    char what[96];
    snprintf(what, sizeof what, "attn %s heads=%d kv=%d head_dim=%d ctx=%d pos=%d n_split=%d", ppn_dtype_name(kd), nh,
             nkv, hd, ctx, pos, ns);
    EXPECT_OK(tu_op_attn(G, S, dout1, dq, dkc, dvc, nh, nkv, hd, ctx, scale, dh, dpart, ns, kd));
    EXPECT_OK(tu_op_attn(G, S, dout2, dq, dkc, dvc, nh, nkv, hd, ctx, scale, dh, dpart, ns, kd));
    sync_ok();
    get(g1, dout1, qn * 4);
    get(g2, dout2, qn * 4);
    get(cnt, dpart + cnt_at, (size_t)nh * sizeof *cnt);
    same_bits(what, g1, g2, qn * 4);
    for (int h = 0; h < nh; h++)
        if (cnt[h]) fail_msg("%s: arrival counter %d (of %d KV heads) is %u after the launches, not 0", what, h, nkv,
                             cnt[h]);
    ppn_kp_attn p = {.out = D(ref), .q = D(q), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr), .n_heads = nh,
                     .n_kv = nkv, .head_dim = hd, .cap = ctx, .n_split = ns, .kvdt = kd, .scale = scale};
    tu_kernel_run(PPN_K_ATTN, &p);
    compare(what, g1, ref, qn, NULL, 0.0, 1e-5);
    free(q), free(kc), free(vc), free(ref), free(g1), free(g2), free(cnt);
    dfree_all();
}

/* Device time of one attention launch at the longest position, per n_split (printed, not checked). */
static void attn_time(int nh, int nkv, int hd, int ctx, int ns, int kd)
{
    enum { REPS = 50 };
    size_t csz = (size_t)nkv * ctx * hd, qn = (size_t)nh * hd, pb = ppn_op_attn_scratch_bytes(nh, ns, hd);
    size_t cb = csz * ppn_dtype_size(kd);
    float *q = tu_frand(qn, -1, 1);
    void *kc = tu_wrand(kd, csz, NULL);
    ppn_step_hdr hdr = {.pos = ctx - 1};
    ppn_dptr dq = up(q, qn * 4), dkc = up(kc, cb), dvc = up(kc, cb), dh = up(&hdr, sizeof hdr),
             dout = dalloc(qn * 4), dpart = dalloc(pb);
    ppn_gevent *ev[2];
    float ms = 0;
    EXPECT_OK(G->ops->memset_d8(G, S, dpart, 0, pb));
    for (int i = 0; i < 2; i++) EXPECT_OK(G->ops->event_create(G, 0, 1, &ev[i]));
    EXPECT_OK(tu_op_attn(G, S, dout, dq, dkc, dvc, nh, nkv, hd, ctx, 0.1f, dh, dpart, ns, kd)); /* warm */
    EXPECT_OK(G->ops->event_record(G, ev[0], S));
    for (int r = 0; r < REPS; r++)
        EXPECT_OK(tu_op_attn(G, S, dout, dq, dkc, dvc, nh, nkv, hd, ctx, 0.1f, dh, dpart, ns, kd));
    EXPECT_OK(G->ops->event_record(G, ev[1], S));
    sync_ok();
    EXPECT_OK(G->ops->event_elapsed(G, ev[0], ev[1], &ms));
    double us = 1e3 * ms / REPS; /* k and v read once: 2 cb bytes */
    printf("  attn time %s heads=%d kv=%d head_dim=%d pos=%d n_split=%-2d  %8.2f us/launch  %6.0f GB/s\n",
           ppn_dtype_name(kd), nh, nkv, hd, ctx - 1, ns, us, 2.0 * (double)cb / (us * 1e3));
    for (int i = 0; i < 2; i++) EXPECT_OK(G->ops->event_destroy(G, ev[i]));
    free(q), free(kc);
    dfree_all();
}

static void test_gpu_kernels_attn(void **state)
{
    (void)state;
    ppn_device_info di;
    EXPECT_OK(G->ops->device_info(G, 0, &di));
    int chosen = ppn_op_attn_split(8, di.sm_count); /* what an 8-KV-head model runs with on this device */
    int chosen4 = ppn_op_attn_split(4, di.sm_count); /* Qwen2-7B: 28 heads over 4 KV heads */
    static const int32_t poss[] = {0, 1, 4095};
    static const int splits[] = {1, 16};
    for (size_t k = 0; k < TU_LEN(splits); k++)
        for (size_t i = 0; i < TU_LEN(poss); i++) { /* pos 0, 1: all but the first splits empty */
            attn_case(32, 8, 64, 4096, poss[i], splits[k], PPN_DTYPE_F32);
            attn_case(32, 8, 128, 4096, poss[i], splits[k], PPN_DTYPE_F32);
        }
    attn_case(32, 8, 128, 4096, 4095, chosen, PPN_DTYPE_F32);
    attn_case(32, 32, 128, 4096, 4095, 64, PPN_DTYPE_F32);  /* MHA, the most splits */
    attn_case(8, 1, 256, 1024, 777, 1, PPN_DTYPE_F32);      /* MQA, the widest head */
    attn_case(8, 1, 256, 1024, 777, 32, PPN_DTYPE_F32);
    attn_case(12, 4, 96, 300, 13, 16, PPN_DTYPE_F32);       /* head_dim not a multiple of 32; pos < n_split */
    attn_case(12, 4, 96, 300, 299, 3, PPN_DTYPE_F32);
    attn_case(4, 4, 32, 64, 64, 1, PPN_DTYPE_F32);          /* pos outside the cache: NaN on both, counters untouched */
    attn_case(4, 4, 32, 64, 64, 8, PPN_DTYPE_F32);
    attn_case(28, 4, 128, 4096, 4095, chosen4, PPN_DTYPE_F32); /* 7 heads a KV head: one pass of 8, a slot padded */
    attn_case(32, 2, 128, 2048, 2000, 16, PPN_DTYPE_F32);      /* 16 heads a KV head: two passes */
    attn_case(16, 4, 160, 512, 511, 7, PPN_DTYPE_F32);         /* head_dim past 128: 4 heads a pass, 2-position tiles */
    /* 2-byte caches (ppn_k_attn_bf16, ppn_k_attn_f16) */
    attn_case(32, 8, 128, 4096, 4095, chosen, PPN_DTYPE_BF16);
    attn_case(32, 8, 64, 4096, 100, chosen, PPN_DTYPE_BF16);
    attn_case(32, 8, 64, 4096, 3000, chosen, PPN_DTYPE_F16);
    attn_case(12, 4, 96, 300, 299, 3, PPN_DTYPE_BF16);
    attn_case(16, 4, 160, 512, 511, 7, PPN_DTYPE_BF16);
    attn_case(4, 4, 32, 64, 64, 8, PPN_DTYPE_BF16);
    /* head dims whose rows are not whole 16-byte chunks (12-, 10- and 20-byte rows; an odd head_dim): a kernel
     * that loads rows in wider pieces must still read every element and nothing past the row */
    attn_case(8, 2, 6, 200, 150, 2, PPN_DTYPE_BF16);
    attn_case(8, 2, 5, 200, 199, 3, PPN_DTYPE_BF16);
    attn_case(8, 2, 5, 200, 130, 1, PPN_DTYPE_F16);
    attn_case(8, 2, 5, 200, 130, 2, PPN_DTYPE_F32);
    attn_time(32, 8, 128, 4096, chosen, PPN_DTYPE_BF16);
    attn_time(32, 8, 64, 4096, chosen, PPN_DTYPE_BF16);
    attn_time(32, 8, 128, 4096, 1, PPN_DTYPE_F32);
    attn_time(32, 8, 128, 4096, chosen, PPN_DTYPE_F32);
    attn_time(32, 8, 128, 4096, 16, PPN_DTYPE_F32);
    attn_time(32, 8, 128, 4096, 48, PPN_DTYPE_F32);
    attn_time(32, 8, 128, 4096, 64, PPN_DTYPE_F32);
    attn_time(32, 8, 64, 4096, chosen, PPN_DTYPE_F32); /* llama 1B */
    attn_time(32, 8, 64, 4096, 64, PPN_DTYPE_F32);
    attn_time(28, 4, 128, 4096, chosen4, PPN_DTYPE_F32);
}

/* ---------------------------------------------------------------------------------------------------------
 * embed, swiglu, add, argmax, fill */

static void embed_case(int vocab, int dim, int dt, int32_t tok)
{
    size_t es = ppn_dtype_size(dt), tn = (size_t)vocab * dim;
    void *table = tu_wrand(dt, tn, NULL);
    float *ref = hmem((size_t)dim * 4), *g1 = hmem((size_t)dim * 4);
    ppn_step_hdr hdr = {.token = tok};
    ppn_dptr dt_ = up(table, tn * es), dh = up(&hdr, sizeof hdr), dout = dalloc((size_t)dim * 4);
    EXPECT_OK(ppn_op_embed(G, S, dout, dt_, dt, vocab, dim, dh));
    sync_ok();
    get(g1, dout, (size_t)dim * 4);
    ppn_kp_embed p = {.out = D(ref), .table = D(table), .hdr = D(&hdr), .dim = dim, .vocab = vocab, .wdt = dt};
    tu_kernel_run(PPN_K_EMBED, &p);
    char what[96];
    snprintf(what, sizeof what, "embed %s vocab=%d dim=%d token=%d", ppn_dtype_name(dt), vocab, dim, tok);
    if (tok >= 0 && tok < vocab) exact(what, g1, ref, (size_t)dim * 4);
    else compare(what, g1, ref, (size_t)dim, NULL, 0, 0); /* NaN on both sides */
    free(table), free(ref), free(g1);
    dfree_all();
}

static void test_gpu_kernels_embed(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        embed_case(8192, 4096, dt, 0);
        embed_case(8192, 4096, dt, 8191);
        embed_case(1000, 1000, dt, 1000);
    }
}

static void test_gpu_kernels_swiglu_add_fill(void **state)
{
    (void)state;
    static const int ns[] = {14336, 11008, 1001};
    for (size_t k = 0; k < TU_LEN(ns); k++) {
        size_t n = (size_t)ns[k];
        float *a = tu_frand(n, -12, 12), *b = tu_frand(n, -3, 3), *ref = hmem(n * 4), *g1 = hmem(n * 4),
              *g2 = hmem(n * 4);
        ppn_dptr da = up(a, n * 4), db = up(b, n * 4), dout = dalloc(n * 4);
        char what[96];
        snprintf(what, sizeof what, "swiglu n=%zu", n);
        for (int run = 0; run < 2; run++) {
            EXPECT_OK(ppn_op_swiglu(G, S, dout, da, db, (int)n));
            sync_ok();
            get(run ? g2 : g1, dout, n * 4);
        }
        same_bits(what, g1, g2, n * 4);
        ppn_kp_swiglu ps = {.out = D(ref), .gate = D(a), .up = D(b), .n = (int)n};
        tu_kernel_run(PPN_K_SWIGLU, &ps);
        compare(what, g1, ref, n, NULL, 2e-6, 1e-30);

        snprintf(what, sizeof what, "add n=%zu (out aliases a)", n);
        EXPECT_OK(ppn_op_add(G, S, da, da, db, (int)n));
        sync_ok();
        get(g1, da, n * 4);
        ppn_kp_add pa = {.out = D(ref), .a = D(a), .b = D(b), .n = (int)n};
        tu_kernel_run(PPN_K_ADD, &pa);
        exact(what, g1, ref, n * 4);

        snprintf(what, sizeof what, "fill n=%zu", n);
        EXPECT_OK(tu_fill(G, S, dout, 0xA5C3E1F0u, (int)n));
        sync_ok();
        get(g1, dout, n * 4);
        ppn_kp_fill pf = {.out = D(ref), .value = 0xA5C3E1F0u, .n = (int)n};
        tu_kernel_run(PPN_K_FILL, &pf);
        exact(what, g1, ref, n * 4);
        free(a), free(b), free(ref), free(g1), free(g2);
        dfree_all();
    }
}

/* The argmax over many blocks (the last one merges) against the CPU reference and the expected index (expect < -1:
 * not known in advance), twice on one scratch (the counter left at 0 by the first), the counter 0 after. */
static void argmax_case(const char *label, const float *x, int n, int expect)
{
    int32_t got = -9, again = -9, want = -9;
    size_t sb = ppn_op_argmax_scratch_bytes();
    ppn_dptr dx = up(x, (size_t)n * 4), dout = dalloc(4), part = dalloc(sb);
    EXPECT_OK(G->ops->memset_d8(G, S, part, 0, sb)); /* once, as seq.c does at allocation */
    EXPECT_OK(ppn_op_argmax_wide(G, S, dout, dx, n, part));
    sync_ok();
    get(&got, dout, 4);
    EXPECT_OK(ppn_op_argmax_wide(G, S, dout, dx, n, part));
    sync_ok();
    get(&again, dout, 4);
    ppn_kp_argmax p = {.out = D(&want), .x = D(x), .n = n};
    tu_kernel_run(PPN_K_ARGMAX, &p);
    printf("  %-58s gpu %d cpu %d\n", label, got, want);
    assert_int_equal(got, again);
    assert_int_equal(got, want);
    if (expect >= -1) assert_int_equal(got, expect);
    uint32_t cnt = 1;
    get(&cnt, part + sb - 4, 4);
    assert_int_equal(cnt, 0);
    dfree_all();
}

/* A NaN or an infinity anywhere gives -1 (non-finite logits are an error, never a choice), in any block. */
static void test_gpu_kernels_argmax(void **state)
{
    (void)state;
    const int n = 128256;
    float *x = tu_frand((size_t)n, -20, 20);
    argmax_case("argmax random n=128256", x, n, -2);
    x[100001] = 25.0f, x[5] = 25.0f, x[70000] = 25.0f;
    argmax_case("argmax ties at 5, 70000, 100001 (lowest wins)", x, n, 5);
    x[3] = INFINITY;
    argmax_case("argmax +inf at 3 (-1)", x, n, -1);
    x[3] = -INFINITY;
    argmax_case("argmax -inf at 3 (-1)", x, n, -1);
    x[3] = 0.0f, x[n - 1] = NAN;
    argmax_case("argmax one NaN, the last element (-1)", x, n, -1);
    x[n - 1] = 0.0f, x[64000] = NAN;
    argmax_case("argmax one NaN in a middle block (-1)", x, n, -1);
    for (int i = 0; i < n; i++) x[i] = NAN;
    argmax_case("argmax all NaN (-1)", x, n, -1);
    for (int i = 0; i < n; i++) x[i] = 1.0f;
    argmax_case("argmax all equal (0)", x, n, 0);
    free(x);
}

/* The step header written from the kernel's parameters; the word after it is left alone. */
static void test_gpu_kernels_set_hdr(void **state)
{
    (void)state;
    int32_t init[8] = {-1, -1, -1, -1, -1, -1, -1, -1}, got[8], want[8];
    memcpy(want, init, sizeof want);
    ppn_dptr d = up(init, sizeof init);
    EXPECT_OK(ppn_op_set_hdr(G, S, d, 4095, 128000, 7, 123456));
    sync_ok();
    get(got, d, sizeof got);
    ppn_kp_set_hdr p = {.hdr = D(want), .v = {.pos = 4095, .token = 128000, .seq = 7, .step = 123456}};
    tu_kernel_run(PPN_K_SET_HDR, &p);
    printf("  %-58s gpu {%d,%d,%d,%d}\n", "set_hdr", got[0], got[1], got[2], got[3]);
    exact("set_hdr", got, want, sizeof got);
    int32_t tok = 31337;
    ppn_dptr dt = up(&tok, 4);
    EXPECT_OK(ppn_op_set_hdr_dev(G, S, d, 17, dt, 3, 9));
    sync_ok();
    get(got, d, sizeof got);
    assert_true(got[0] == 17 && got[1] == 31337 && got[2] == 3 && got[3] == 9); /* the token read on the device */
    dfree_all();
}

/* ---------------------------------------------------------------------------------------------------------
 * every kernel in the table has a case above */


/* The norm fused into the matvec on the GPU against the CPU reference (its reduction has the matvec block's
 * shape, not the rmsnorm kernel's, so bits may differ from the unfused pair), twice for bits. Shapes: the
 * llama-1b and llama-8b q|k|v, and a wide input (18944 columns) that needs the shared-memory opt-in. */
/* Device time per call, 50 back to back after 5 warm-up: the fused launch against the unfused pair (the rmsnorm
 * kernel, then the plain matvec). Printed, not asserted (speed is not a test). */
static void fused_time(int rows, int cols, int dt, ppn_dptr dw, ppn_dptr dnw, ppn_dptr dx, ppn_dptr dout,
                       ppn_dptr dres)
{
    ppn_gevent *e0 = NULL, *e1 = NULL;
    EXPECT_OK(G->ops->event_create(G, 0, 1, &e0));
    EXPECT_OK(G->ops->event_create(G, 0, 1, &e1));
    ppn_dptr tmp = dalloc((size_t)cols * 4);
    ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = dx, .nw = dnw, .eps = 1e-5f};
    float ms[2];
    for (int arm = 0; arm < 2; arm++) {
        for (int it = 0; it < 55; it++) {
            if (it == 5) EXPECT_OK(G->ops->event_record(G, e0, S));
            if (arm == 0) EXPECT_OK(ppn_op_matvec_in(G, S, dout, dw, dt, in, rows, cols, 0, dres));
            else {
                EXPECT_OK(ppn_op_rmsnorm(G, S, tmp, dx, dnw, dt, cols, 1e-5f));
                EXPECT_OK(ppn_op_matvec(G, S, dout, dw, dt, tmp, rows, cols, 0, dres));
            }
        }
        EXPECT_OK(G->ops->event_record(G, e1, S));
        sync_ok();
        EXPECT_OK(G->ops->event_elapsed(G, e0, e1, &ms[arm]));
    }
    printf("  time %-9s %5dx%-5d fused %8.2f us   unfused pair %8.2f us\n", "norm-in", rows, cols, 1e3 * ms[0] / 50,
           1e3 * ms[1] / 50);
    EXPECT_OK(G->ops->event_destroy(G, e0));
    EXPECT_OK(G->ops->event_destroy(G, e1));
}

static void fused_case(int rows, int cols, int dt)
{
    size_t R = (size_t)rows, C = (size_t)cols, es = ppn_dtype_size(dt);
    void *w = tu_wrand(dt, R * C, NULL), *nw = tu_wrand(dt, C, NULL);
    float *x = tu_frand(C, -2, 2), *res = tu_frand(R, -2, 2), *ref = hmem(R * 4), *g1 = hmem(R * 4), *g2 = hmem(R * 4);
    ppn_dptr dw = up(w, R * C * es), dnw = up(nw, C * es), dx = up(x, C * 4), dout = dalloc(R * 4);
    ppn_dptr dres = up(res, R * 4);
    ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = dx, .nw = dnw, .eps = 1e-5f};
    char what[96];
    snprintf(what, sizeof what, "matvec norm-in %s %dx%d +res", ppn_dtype_name(dt), rows, cols);
    for (int run = 0; run < 2; run++) {
        EXPECT_OK(ppn_op_matvec_in(G, S, dout, dw, dt, in, rows, cols, 0, dres));
        sync_ok();
        get(run ? g2 : g1, dout, R * 4);
    }
    same_bits(what, g1, g2, R * 4);
    ppn_kp_matvec p = {.out = D(ref), .w = D(w), .x = D(x), .res = D(res), .nw = D(nw), .rows = rows, .cols = cols,
                       .wdt = dt, .xmode = PPN_MV_X_RMSNORM, .eps = 1e-5f};
    tu_kernel_run(PPN_K_MATVEC, &p);
    /* scale: the row's |w| . |xin| + |res|, xin from the reference's own norm */
    float *xin = hmem(C * 4);
    ppn_kp_rmsnorm pn = {.out = D(xin), .in = D(x), .w = D(nw), .n = cols, .wdt = dt, .eps = 1e-5f};
    tu_kernel_run(PPN_K_RMSNORM, &pn);
    double *sc = hmem(R * sizeof *sc);
    for (size_t r = 0; r < R; r++) {
        double a = fabs(res[r]);
        for (size_t k = 0; k < C; k++) a += fabs(tu_wval(w, dt, r * C + k) * (double)xin[k]);
        sc[r] = a;
    }
    compare(what, g1, ref, R, sc, 2e-5, 1e-30);
    fused_time(rows, cols, dt, dw, dnw, dx, dout, dres);
    free(w), free(nw), free(x), free(res), free(ref), free(g1), free(g2), free(xin), free(sc);
    dfree_all();
}

/* Attention with the rotary fused in against rope_kv then attn on the GPU: the same output and caches, bit
 * for bit, and the projection left as it was. */
static void attn_rope_case(int nh, int nkv, int hd, int ctx, int32_t pos, int ns, int il, int kd)
{
    size_t qkvn = (size_t)(nh + 2 * nkv) * hd, on = (size_t)nh * hd, csz = (size_t)nkv * ctx * hd;
    size_t pb = ppn_op_attn_scratch_bytes(nh, ns, hd), cb = csz * ppn_dtype_size(kd);
    float *inv = hmem((size_t)hd / 2 * 4), *x = tu_frand(qkvn, -2, 2);
    void *c = tu_wrand(kd, csz, NULL), *k1 = hmem(cb), *k2 = hmem(cb), *v1 = hmem(cb), *v2 = hmem(cb);
    float *o1 = hmem(on * 4), *o2 = hmem(on * 4), *x1 = hmem(qkvn * 4);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
    ppn_step_hdr hdr = {.pos = pos};
    float scale = 1.0f / sqrtf((float)hd);
    ppn_dptr dinv = up(inv, (size_t)hd / 2 * 4), dh = up(&hdr, sizeof hdr), dx1 = up(x, qkvn * 4),
             dx2 = up(x, qkvn * 4), dk1 = up(c, cb), dk2 = up(c, cb), dv1 = up(c, cb), dv2 = up(c, cb), dout1 = dalloc(on * 4), dout2 = dalloc(on * 4), dp1 = dalloc(pb), dp2 = dalloc(pb);
    EXPECT_OK(G->ops->memset_d8(G, S, dp1, 0, pb));
    EXPECT_OK(G->ops->memset_d8(G, S, dp2, 0, pb));
    EXPECT_OK(tu_op_attn_rope(G, S, dout1, dx1, dk1, dv1, nh, nkv, hd, ctx, scale, dh, dp1, ns, dinv, il, kd));
    EXPECT_OK(tu_op_rope_kv(G, S, dx2, nh, nkv, hd, dinv, il, dh, dk2, dv2, dx2 + (qkvn - (size_t)nkv * hd) * 4, ctx,
                             kd));
    EXPECT_OK(tu_op_attn(G, S, dout2, dx2, dk2, dv2, nh, nkv, hd, ctx, scale, dh, dp2, ns, kd));
    sync_ok();
    get(o1, dout1, on * 4), get(o2, dout2, on * 4), get(k1, dk1, cb), get(k2, dk2, cb),
        get(v1, dv1, cb), get(v2, dv2, cb), get(x1, dx1, qkvn * 4);
    char what[112];
    snprintf(what, sizeof what, "attn_rope %s %d/%d heads hd %d pos %d n_split %d%s: out", ppn_dtype_name(kd), nh, nkv,
             hd, pos, ns, il ? " interleaved" : "");
    exact(what, o1, o2, on * 4);
    exact("attn_rope: the k cache", k1, k2, cb);
    exact("attn_rope: the v cache", v1, v2, cb);
    exact("attn_rope: q|k|v only read", x1, x, qkvn * 4);
    free(inv), free(x), free(c), free(o1), free(o2), free(k1), free(k2), free(v1), free(v2), free(x1);
    dfree_all();
}

/* Device time of the fused launch against the pair it replaces, 50 of each back to back (printed only). */
static void attn_rope_time(int nh, int nkv, int hd, int ctx, int32_t pos, int ns, int kd)
{
    enum { REPS = 50 };
    size_t qkvn = (size_t)(nh + 2 * nkv) * hd, on = (size_t)nh * hd, csz = (size_t)nkv * ctx * hd;
    size_t pb = ppn_op_attn_scratch_bytes(nh, ns, hd), cb = csz * ppn_dtype_size(kd);
    float *inv = hmem((size_t)hd / 2 * 4), *x = tu_frand(qkvn, -2, 2);
    void *c = tu_wrand(kd, csz, NULL);
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / hd));
    ppn_step_hdr hdr = {.pos = pos};
    ppn_dptr dinv = up(inv, (size_t)hd / 2 * 4), dh = up(&hdr, sizeof hdr), dx = up(x, qkvn * 4),
             dk = up(c, cb), dv = up(c, cb), dout = dalloc(on * 4), dp = dalloc(pb);
    ppn_gevent *ev[3];
    float ms[2] = {0, 0};
    EXPECT_OK(G->ops->memset_d8(G, S, dp, 0, pb));
    for (int i = 0; i < 3; i++) EXPECT_OK(G->ops->event_create(G, 0, 1, &ev[i]));
    EXPECT_OK(tu_op_attn_rope(G, S, dout, dx, dk, dv, nh, nkv, hd, ctx, 0.1f, dh, dp, ns, dinv, 0, kd)); /* warm */
    EXPECT_OK(G->ops->event_record(G, ev[0], S));
    for (int r = 0; r < REPS; r++)
        EXPECT_OK(tu_op_attn_rope(G, S, dout, dx, dk, dv, nh, nkv, hd, ctx, 0.1f, dh, dp, ns, dinv, 0, kd));
    EXPECT_OK(G->ops->event_record(G, ev[1], S));
    for (int r = 0; r < REPS; r++) {
        EXPECT_OK(tu_op_rope_kv(G, S, dx, nh, nkv, hd, dinv, 0, dh, dk, dv, dx + (qkvn - (size_t)nkv * hd) * 4, ctx,
                                 kd));
        EXPECT_OK(tu_op_attn(G, S, dout, dx, dk, dv, nh, nkv, hd, ctx, 0.1f, dh, dp, ns, kd));
    }
    EXPECT_OK(G->ops->event_record(G, ev[2], S));
    sync_ok();
    EXPECT_OK(G->ops->event_elapsed(G, ev[0], ev[1], &ms[0]));
    EXPECT_OK(G->ops->event_elapsed(G, ev[1], ev[2], &ms[1]));
    printf("  attn_rope time %s heads=%d kv=%d head_dim=%d pos=%-4d n_split=%-2d fused %6.2f us, rope_kv + attn %6.2f us\n",
           ppn_dtype_name(kd), nh, nkv, hd, pos, ns, 1e3 * ms[0] / REPS, 1e3 * ms[1] / REPS);
    for (int i = 0; i < 3; i++) EXPECT_OK(G->ops->event_destroy(G, ev[i]));
    free(inv), free(x), free(c);
    dfree_all();
}

static void test_gpu_kernels_attn_rope(void **state)
{
    (void)state;
    ppn_device_info di;
    EXPECT_OK(G->ops->device_info(G, 0, &di));
    int chosen = ppn_op_attn_split(8, di.sm_count);
    static const int32_t poss[] = {0, 37, 700, 4095};
    for (size_t i = 0; i < TU_LEN(poss); i++) {
        attn_rope_case(32, 8, 64, 4096, poss[i], chosen, 0, PPN_DTYPE_F32);  /* llama 1B */
        attn_rope_case(32, 8, 128, 4096, poss[i], chosen, 0, PPN_DTYPE_F32); /* llama 8B */
    }
    attn_rope_case(6, 6, 48, 256, 200, 16, 1, PPN_DTYPE_F32);    /* llama2.c: MHA, interleaved pairs, 4 of 16 splits used */
    attn_rope_case(32, 8, 128, 4096, 77, chosen, 1, PPN_DTYPE_F32);  /* interleaved, lanes pair up */
    attn_rope_case(14, 2, 64, 1024, 1000, 7, 0, PPN_DTYPE_F32);  /* 7 heads a KV head: one pass of 8, a slot padded */
    attn_rope_case(32, 2, 128, 2048, 2000, 16, 0, PPN_DTYPE_F32); /* 16 heads a KV head: two passes, pos stored once */
    attn_rope_case(8, 1, 128, 1024, 777, 32, 0, PPN_DTYPE_F32);  /* MQA */
    attn_rope_case(12, 4, 96, 300, 299, 3, 1, PPN_DTYPE_F32);    /* head_dim not a multiple of 32, interleaved */
    attn_rope_case(8, 2, 8, 64, 40, 1, 0, PPN_DTYPE_F32);        /* halves on lanes l, l ^ 4 (the llama-tiny fixture) */
    attn_rope_case(4, 2, 16, 64, 63, 1, 0, PPN_DTYPE_F32);       /* l, l ^ 8 (qwen2-tiny) */
    attn_rope_case(4, 2, 32, 512, 300, 16, 0, PPN_DTYPE_F32);    /* l, l ^ 16 (qwen3-tiny, mkmodel tiny) */
    attn_rope_case(4, 4, 64, 64, 64, 8, 0, PPN_DTYPE_F32);       /* pos outside the cache: NaN, nothing stored */
    attn_rope_case(4, 4, 64, 64, 63, 1, 0, PPN_DTYPE_F32);       /* the last position, one split */
    /* 64 splits at pos 4,032: the last split holds pos alone, and the one before it has a tile reaching past
     * its span to pos (that block must not take the row from its unwritten shared memory) */
    attn_rope_case(32, 32, 128, 4096, 4032, 64, 0, PPN_DTYPE_F32);
    attn_rope_case(32, 32, 64, 4096, 4032, 64, 1, PPN_DTYPE_BF16);
    attn_rope_case(32, 8, 64, 4096, 100, chosen, 0, PPN_DTYPE_BF16);   /* caches in the weights' dtype */
    attn_rope_case(32, 8, 128, 4096, 4095, chosen, 0, PPN_DTYPE_BF16);
    attn_rope_case(32, 8, 128, 4096, 700, chosen, 1, PPN_DTYPE_F16);
    attn_rope_case(4, 2, 16, 64, 63, 1, 0, PPN_DTYPE_BF16);
    attn_rope_case(4, 2, 6, 64, 50, 1, 1, PPN_DTYPE_BF16);  /* 12-byte rows, interleaved pairs */
    attn_rope_case(4, 2, 10, 200, 150, 2, 1, PPN_DTYPE_F16); /* 20-byte rows over two splits */
    attn_rope_time(32, 8, 64, 4096, 37, chosen, PPN_DTYPE_BF16);
    attn_rope_time(32, 8, 128, 4096, 37, chosen, PPN_DTYPE_BF16);
    attn_rope_time(32, 8, 128, 4096, 4095, chosen, PPN_DTYPE_BF16);
    attn_rope_time(32, 8, 64, 4096, 37, chosen, PPN_DTYPE_F32);
    attn_rope_time(32, 8, 128, 4096, 37, chosen, PPN_DTYPE_F32);
    attn_rope_time(32, 8, 128, 4096, 4095, chosen, PPN_DTYPE_F32);
}

static void test_gpu_kernels_matvec_fused(void **state)
{
    (void)state;
    fused_case(3072, 2048, PPN_DTYPE_BF16);
    fused_case(4096, 4096, PPN_DTYPE_BF16);
    fused_case(1000, 1000, PPN_DTYPE_F32);
    fused_case(512, 18944, PPN_DTYPE_F16); /* over the 48 KB a kernel gets without the opt-in */
}

static int free_buffers(void **state)
{
    (void)state;
    for (int i = 0; i < ndbuf; i++) G->ops->mem_free(G, 0, dbufs[i]); /* after a failed case */
    ndbuf = 0;
    return 0;
}

static void test_gpu_kernels_table_covered(void **state)
{
    (void)state;
    printf("  kernels in the table: %d (embed..matmat here; the prefill's gemm and row kernels in test_gpu_gemm.c "
           "and test_gpu_rows.c, the batched decode kernels in test_gpu_rows.c's paged test)\n", PPN_K_COUNT);
    /* a new kernel needs a case in tests/gpu: 14 here (attn_bf16, attn_f16: the 2-byte cases); in test_gpu_gemm.c
     * gemm and its 13 tensor-core tiles (l, m, s, k, kw, kwx, kw16, h, k16, kwt, k16t, kx, w: forced, each against
     * the CPU reference and the tile whose bits it must give) and the 4 fused SwiGLU forms (gemm_swiglu; _t and _x
     * where PPN_TMA=2 and PPN_GEMM_KX take the op there; _w against gemm_tc_w + swiglu rows); the 8 row kernels in test_gpu_rows.c, and the 5 batched
     * decode kernels (rope_kv_batch, attn_batch in f32 and bf16, attn_batch_tc there; attn_batch_f16 shares their
     * body), and argmax_rows in test_gpu_batch.c (every batched row's device argmax against its logits' argmax).
     * The count had stood at 34 since gemm_tc_h while eleven kernels came (found 2026-12-06 with gemm_tc_w). */
    assert_int_equal(PPN_K_COUNT, 14 + 14 + 4 + 8 + 5 + 1);
}

int main(void)
{
    ppn_status st = ppn_gpu_open("cuda", ppn_kernel_set(), &G);
    if (st != PPN_OK) {
        fprintf(stderr, "test_gpu_kernels: FAIL: no cuda backend: %s: %s\n", ppn_status_name(st), ppn_last_error());
        return 1;
    }
    st = G->ops->stream_create(G, 0, &S);
    if (st != PPN_OK) {
        fprintf(stderr, "test_gpu_kernels: FAIL: stream_create: %s: %s\n", ppn_status_name(st), ppn_last_error());
        ppn_gpu_close(G);
        return 1;
    }
    const char *only = getenv("PPN_GPU_TEST_FILTER"); /* a cmocka pattern of test names, e.g. *matvec* */
    if (only && *only) cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_gpu_kernels_set_hdr, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_matmat, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_table_covered, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_matvec, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_matvec_bw, mv_teardown),
        cmocka_unit_test_teardown(test_gpu_kernels_norms, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_rope, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_matvec_fused, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_attn, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_attn_rope, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_embed, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_swiglu_add_fill, free_buffers),
        cmocka_unit_test_teardown(test_gpu_kernels_argmax, free_buffers),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    G->ops->stream_destroy(G, S);
    ppn_gpu_close(G);
    return rc;
}
