/* test_gpu_rows.c - the many-rows kernels (kernels/rows.cu) on a real GPU against their CPU references
 * (kernels/rows_cpu.c: the decode references run per row), and the prefill attention's speed.
 *
 * Cases: the row ops at the model shapes (llama-1b: dim 2048, 32 / 8 heads of 64; llama-8b: dim 4096, 32 / 8
 * heads of 128) and the fixtures' (head_dim 8 .. 64); attention for c = 1, 7, 64, 512 rows at pos0 = 0 and
 * after a first chunk (pos0 > 0), every cache dtype (bf16 / f16 head_dim 64, 128: tensor cores; f32 and other
 * head_dims: the SIMT path). The cache past the chunk's last position holds NaN, which must never reach an
 * output. Each launch runs twice and must give the same bits. The rotary is also checked bit for bit against
 * decode's rope_kv on the GPU (prefill and decode must store the same cache bits).
 *
 * Tolerances: elementwise math that differs from the reference only by CUDA's expf / sincosf (2 ulp): 2e-6
 * relative; a cache element stored from such a value: one ulp of its dtype; f32 sums (norms): 1e-5 relative,
 * and rmsnorm_rows also bit for bit against its own summation order emulated on the host (norm_row_bits); embed
 * exact. Attention (values in [-1, 1], q in [-3, 3]): SIMT 1e-5 absolute; tensor cores with q given in the
 * cache's dtype (so only the softmax weights' rounding and the f32 sums differ): 4e-3 (bf16, 2^-9 per weight) and
 * 1e-3 (f16) absolute. Long chunks are checked on a sample of rows (the reference costs O(position) a row).
 *
 * Timing (test_gpu_rows_attn_timing): attn_rows at c = 512 and 4096 (pos0 = 0) on both model shapes, median of 15
 * launches after 3 warm-up ones, with the causal attention's TFLOP/s (4 head_dim flops per (query head, query,
 * attended position)); and the row ops' GB/s at c = 4096.
 *
 * The batched decode attention on tensor cores (test_gpu_rows_attn_tc): every row against a reference with its
 * roundings and against the exact attention, alone and in a batch, with pool blocks nobody holds full of NaN;
 * then timed beside the decode kernel per row at the batch step's shapes and splits (10 launches replayed from a
 * graph: the device's time, not the host's).
 *
 * Runs only where a CUDA driver and GPU exist. PPN_GPU_TEST_FILTER=<cmocka pattern> runs only the tests it names.
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
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

#define OK(call) EXPECT_ST(PPN_OK, call)

static ppn_gpu *G;
static ppn_gstream *S;

static void *hmem(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    assert_non_null(p);
    return p;
}

#define MAX_DBUF 32
static ppn_dptr dbufs[MAX_DBUF];
static int ndbuf;

static ppn_dptr dalloc(size_t n)
{
    assert_true(ndbuf < MAX_DBUF);
    ppn_dptr p = 0;
    OK(G->ops->mem_alloc(G, 0, n ? n : 1, &p));
    return dbufs[ndbuf++] = p;
}

static void dfree_all(void)
{
    for (int i = 0; i < ndbuf; i++) OK(G->ops->mem_free(G, 0, dbufs[i]));
    ndbuf = 0;
}

static void put(ppn_dptr d, const void *h, size_t n)
{
    OK(G->ops->copy_htod(G, S, d, h, n));
    OK(G->ops->stream_sync(G, S));
}

static ppn_dptr up(const void *h, size_t n)
{
    ppn_dptr d = dalloc(n);
    put(d, h, n);
    return d;
}

static void get(void *h, ppn_dptr d, size_t n)
{
    OK(G->ops->copy_dtoh(G, S, h, d, n));
    OK(G->ops->stream_sync(G, S));
}

static int setup(void **state)
{
    (void)state;
    tu_rand_seed(0x9e3779b97f4a7c15ULL);
    if (ppn_gpu_open("cuda", ppn_kernel_set(), &G) != PPN_OK) {
        fprintf(stderr, "no CUDA device: %s\n", ppn_last_error());
        return -1;
    }
    if (G->ops->stream_create(G, 0, &S) != PPN_OK) return -1;
    ppn_device_info info;
    if (G->ops->device_info(G, 0, &info) == PPN_OK) printf("  device: %s (%d SMs)\n", info.name, info.sm_count);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dfree_all();
    if (S) G->ops->stream_destroy(G, S);
    if (G) G->ops->destroy(G);
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------
 * comparison */

typedef struct cmp {
    double worst, ratio; /* largest |got - want| and its ratio to the tolerance */
    size_t at;
} cmp;

static void cmp_add(cmp *c, double got, double want, double tol, size_t i)
{
    double e = fabs(got - want), r = e / tol;
    if (!(r <= c->ratio) || isnan(got) != isnan(want)) {
        c->ratio = isnan(got) != isnan(want) || isnan(r) ? INFINITY : r;
        c->worst = e, c->at = i;
    }
}

static void cmp_done(const cmp *c, const char *what)
{
    printf("  %-58s max err %.3g (%.2f of tol)\n", what, c->worst, c->ratio);
    if (!(c->ratio <= 1.0)) fail_msg("%s: element %zu off by %.3g (%.2f of its tolerance)", what, c->at, c->worst, c->ratio);
}

/* One ulp of dtype dt at |v| (f32's for f32). */
static double ulp_of(int dt, double v)
{
    int e;
    frexp(fabs(v) > 1e-30 ? v : 1e-30, &e);
    int mant = dt == PPN_DTYPE_BF16 ? 8 : dt == PPN_DTYPE_F16 ? 11 : 24;
    double u = ldexp(1.0, e - mant);
    return dt == PPN_DTYPE_F16 && u < ldexp(1.0, -24) ? ldexp(1.0, -24) : u;
}

static double elem(const void *a, int dt, size_t i) { return tu_wval(a, dt, i); }

/* ---------------------------------------------------------------------------------------------------------
 * the row ops: embed, rmsnorm, head norms, swiglu, rope + KV store */

typedef struct mshape {
    const char *name;
    int dim, nq, nkv, hd, ffn;
} mshape;

static const mshape MODELS[] = {
    {"llama-1b", 2048, 32, 8, 64, 8192},
    {"llama-8b", 4096, 32, 8, 128, 14336},
    {"qwen3-tiny", 64, 4, 2, 32, 128},
    {"llama-tiny", 64, 8, 2, 8, 172},
};

/* c rows of n bf16 at dh (gemm_tc_kw16's layout, kparams.h PPN_X16_POS) against f32 rows want: each element the
 * f32 value rounded to nearest even, at its place in the layout. */
static void check_bf16_rows(const char *what, ppn_dptr dh, const float *want, size_t c, size_t n)
{
    uint16_t *h16 = hmem(c * n * 2);
    get(h16, dh, c * n * 2);
    for (size_t i = 0; i < c * n; i++)
        if (h16[i - i % n + PPN_X16_POS(i % n)] != ppn_f32_to_bf16(want[i]))
            fail_msg("%s: bf16 element %zu is not the f32 kernel's rounded", what, i);
    printf("  %-58s bf16 out: the f32 kernel's, rounded\n", what);
    free(h16);
}

/* The bits ppn_k_rmsnorm_rows gives a row of n at bd threads a block (ops_rows.c launches NORM_ROWS_BLOCK): thread
 * t's fmaf chain over x[t], x[t + bd], ...; each warp's butterfly (kdev.cuh ppn_warp_sum: v + the value at lane ^
 * 16, 8, 4, 2, 1; every lane ends with the same sum, since f32 adds commute); the warps' sums through the same
 * butterfly (lanes past the warps hold 0); var = sum / n, r = 1 / sqrtf(var + eps), out (x r) w. All f32 and
 * IEEE-rounded as the kernel's are (nvcc -prec-div, -prec-sqrt; no product is followed by an add, so none is
 * contracted), so the kernel must give exactly these bits: a change of its loads that keeps its sums keeps them. */
#define NORM_ROWS_BLOCK 1024
static float warp_butterfly(float *v)
{
    for (int m = 16; m > 0; m >>= 1) {
        float t[32];
        for (int l = 0; l < 32; l++) t[l] = v[l] + v[l ^ m];
        memcpy(v, t, sizeof t);
    }
    return v[0];
}

static void norm_row_bits(float *out, const float *x, const void *w, int wdt, int n, float eps, int bd)
{
    float lanes[32], warps[32] = {0};
    for (int wp = 0; wp < bd / 32; wp++) {
        for (int l = 0; l < 32; l++) {
            float ss = 0.0f;
            for (int i = wp * 32 + l; i < n; i += bd) ss = fmaf(x[i], x[i], ss);
            lanes[l] = ss;
        }
        warps[wp] = warp_butterfly(lanes);
    }
    float var = warp_butterfly(warps) / (float)n, r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) {
        float xr = x[i] * r;
        out[i] = xr * (float)elem(w, wdt, (size_t)i); /* the weight widened exactly, as the kernel's ppn_wload */
    }
}

/* c rows of n at dx (the kernel's in-place output) against norm_row_bits, bit for bit. */
static void check_norm_bits(const char *what, ppn_dptr dx, const float *in, const void *w, int wdt, int n, int c)
{
    float *got = hmem((size_t)c * n * 4), *want = hmem((size_t)n * 4);
    get(got, dx, (size_t)c * n * 4);
    for (int i = 0; i < c; i++) {
        norm_row_bits(want, in + (size_t)i * n, w, wdt, n, 1e-5f, NORM_ROWS_BLOCK);
        for (int k = 0; k < n; k++)
            if (memcmp(&got[(size_t)i * n + k], &want[k], 4))
                fail_msg("%s: row %d element %d %.9g, want %.9g (its summation order's bits)", what, i, k,
                         got[(size_t)i * n + k], want[k]);
    }
    printf("  %-58s the bits of its summation order\n", what);
    free(got), free(want);
}

static void rowops_case(const mshape *m, int c, int wdt)
{
    char what[128];
    const int vocab = 1000, dim = m->dim, n = m->ffn;
    int32_t *tok = hmem((size_t)c * 4);
    for (int i = 0; i < c; i++) tok[i] = (int32_t)(tu_rand32() % (vocab + 2)) - 1; /* -1 and vocab: zeros */
    void *table = tu_wrand(wdt, (size_t)vocab * dim, NULL), *w = tu_wrand(wdt, (size_t)dim, NULL);
    size_t es = ppn_dtype_size(wdt), xb = (size_t)c * dim * 4;
    float *x = hmem(xb), *xg = hmem(xb), *gu = tu_frand((size_t)c * 2 * n, -8, 8), *sw = hmem((size_t)c * n * 4),
          *swg = hmem((size_t)c * n * 4);
    ppn_dptr dtab = up(table, (size_t)vocab * dim * es), dtok = up(tok, (size_t)c * 4), dw = up(w, (size_t)dim * es);
    ppn_dptr dx = dalloc(xb), dgu = up(gu, (size_t)c * 2 * n * 4), dsw = dalloc((size_t)c * n * 4);
    /* embed */
    OK(ppn_op_embed_rows(G, S, dx, dtab, wdt, vocab, dim, dtok, c));
    get(xg, dx, xb);
    ppn_kp_embed_rows pe = {.out = D(x), .table = D(table), .tok = D(tok), .dim = dim, .vocab = vocab, .wdt = wdt, .c = c};
    tu_kernel_run(PPN_K_EMBED_ROWS, &pe);
    snprintf(what, sizeof what, "%s embed_rows c=%d %s", m->name, c, ppn_dtype_name(wdt));
    if (memcmp(x, xg, xb)) fail_msg("%s: not the reference's bits", what);
    printf("  %-58s exact\n", what);
    /* rmsnorm in place, on random rows */
    float *r = tu_frand((size_t)c * dim, -2, 2);
    put(dx, r, xb);
    OK(ppn_op_rmsnorm_rows(G, S, dx, dx, dw, wdt, dim, 1e-5f, c));
    get(xg, dx, xb);
    ppn_kp_rmsnorm_rows pr = {.out = D(x), .in = D(r), .w = D(w), .n = dim, .wdt = wdt, .c = c, .eps = 1e-5f};
    tu_kernel_run(PPN_K_RMSNORM_ROWS, &pr);
    cmp cm = {0};
    for (size_t i = 0; i < (size_t)c * dim; i++) cmp_add(&cm, xg[i], x[i], 1e-5 * fmax(1.0, fabs(x[i])), i);
    snprintf(what, sizeof what, "%s rmsnorm_rows c=%d %s", m->name, c, ppn_dtype_name(wdt));
    cmp_done(&cm, what);
    check_norm_bits(what, dx, r, w, wdt, dim, c);
    /* bf16 rows for gemm_tc_kw16 (kparams.h, PPN_X16_POS): each the f32 kernel's value rounded, in that layout */
    if (dim % 64 == 0) {
        ppn_dptr dh = dalloc((size_t)c * dim * 2);
        put(dx, r, xb);
        OK(ppn_op_rmsnorm_rows_to(G, S, dh, PPN_DTYPE_BF16, dx, dw, wdt, dim, 1e-5f, c));
        check_bf16_rows(what, dh, xg, (size_t)c, (size_t)dim);
    }
    /* swiglu */
    OK(ppn_op_swiglu_rows(G, S, dsw, dgu, n, c));
    get(swg, dsw, (size_t)c * n * 4);
    ppn_kp_swiglu_rows ps = {.out = D(sw), .gu = D(gu), .n = n, .c = c};
    tu_kernel_run(PPN_K_SWIGLU_ROWS, &ps);
    cm = (cmp){0};
    for (size_t i = 0; i < (size_t)c * n; i++) cmp_add(&cm, swg[i], sw[i], 2e-6 * fabs(sw[i]) + 1e-30, i);
    snprintf(what, sizeof what, "%s swiglu_rows c=%d", m->name, c);
    cmp_done(&cm, what);
    if (n % 64 == 0) { /* bf16 rows for gemm_tc_kw16, as the norm's above */
        ppn_dptr dh = dalloc((size_t)c * n * 2);
        OK(ppn_op_swiglu_rows_to(G, S, dh, PPN_DTYPE_BF16, dgu, n, c));
        check_bf16_rows(what, dh, swg, (size_t)c, (size_t)n);
    }
    /* the same rows 4 bytes past 16-byte alignment: one column a thread (the op's scalar path), the same bits as
     * the four a thread above */
    {
        size_t gb = (size_t)c * 2 * n * 4, ob = (size_t)c * n * 4;
        ppn_dptr gu4 = dalloc(gb + 16) + 4, sw4 = dalloc(ob + 16) + 4;
        OK(G->ops->copy_htod(G, S, gu4, gu, gb));
        OK(ppn_op_swiglu_rows(G, S, sw4, gu4, n, c));
        float *s1 = hmem(ob);
        get(s1, sw4, ob);
        snprintf(what, sizeof what, "%s swiglu_rows c=%d, rows 4 bytes off", m->name, c);
        if (memcmp(s1, swg, ob)) fail_msg("%s: not the 16-byte path's bits", what);
        printf("  %-58s the 16-byte path's bits\n", what);
        free(s1);
    }
    free(tok), free(table), free(w), free(x), free(xg), free(gu), free(sw), free(swg), free(r);
    dfree_all();
}

/* Head norms on the k heads of q|k|v rows, then the rotary + KV store of the rows against the reference, and
 * against decode's rope_kv on the GPU bit for bit (a row at a time, with the step header). */
static void rope_case(const mshape *m, int c, int pos0, int kvdt, int interleaved)
{
    char what[160];
    const int nq = m->nq, nkv = m->nkv, hd = m->hd, ctx = pos0 + c + 5;
    size_t row = (size_t)(nq + 2 * nkv) * hd, qb = (size_t)c * row * 4, cb = ppn_op_kv_cache_bytes(nkv, hd, ctx, kvdt);
    float *qkv = tu_frand((size_t)c * row, -2, 2), *ref = hmem(qb), *got = hmem(qb), inv[128];
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(500000.0, (2.0 * i) / hd));
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)hd, NULL);
    void *kc = hmem(cb), *vc = hmem(cb), *kg = hmem(cb), *vg = hmem(cb);
    memcpy(ref, qkv, qb);
    ppn_dptr dq = up(qkv, qb), dinv = up(inv, sizeof inv), dw = up(w, (size_t)hd * 2);
    ppn_dptr dkc = up(kc, cb), dvc = up(vc, cb);
    OK(ppn_op_head_rmsnorm_rows(G, S, dq, (int)row, nq, nkv, hd, dw, PPN_DTYPE_BF16, 1e-6f, c));
    OK(tu_op_rope_kv_rows(G, S, dq, nq, nkv, hd, dinv, interleaved, dkc, dvc, ctx, kvdt, pos0, c));
    get(got, dq, qb), get(kg, dkc, cb), get(vg, dvc, cb);
    ppn_kp_head_rmsnorm_rows ph = {.x = D(ref), .w = D(w), .stride = (int)row, .h0 = nq, .n_heads = nkv,
                                   .head_dim = hd, .wdt = PPN_DTYPE_BF16, .c = c, .eps = 1e-6f};
    tu_kernel_run(PPN_K_HEAD_RMSNORM_ROWS, &ph);
    ppn_kp_rope_kv_rows pr = {.qkv = D(ref), .inv_freq = D(inv), .kc = D(kc), .vc = D(vc), .n_q = nq, .n_kv = nkv,
                              .head_dim = hd, .interleaved = interleaved, .cap = ctx, .kvdt = kvdt, .pos0 = pos0, .c = c};
    tu_kernel_run(PPN_K_ROPE_KV_ROWS, &pr);
    cmp cq = {0}, ck = {0};
    /* the norm's f32 sum and the rotation's sincosf: 1e-5 relative to the row's scale */
    for (size_t i = 0; i < (size_t)c * row; i++) cmp_add(&cq, got[i], ref[i], 1e-5 * fmax(1.0, fabs(ref[i])), i);
    size_t ne = cb / ppn_dtype_size(kvdt);
    for (size_t i = 0; i < ne; i++) {
        double a = elem(kc, kvdt, i), b = elem(vc, kvdt, i);
        cmp_add(&ck, elem(kg, kvdt, i), a, ulp_of(kvdt, a) + 1e-5 * fmax(1.0, fabs(a)), i);
        cmp_add(&ck, elem(vg, kvdt, i), b, 1e-30, i); /* v is stored as given: exact */
    }
    snprintf(what, sizeof what, "%s head norms + rope_kv_rows c=%d pos0=%d %s%s", m->name, c, pos0,
             ppn_dtype_name(kvdt), interleaved ? " il" : "");
    cmp_done(&cq, what);
    snprintf(what, sizeof what, "%s   its KV store", m->name);
    cmp_done(&ck, what);
    /* decode's rope_kv on the GPU, row by row from the normed rows, stores the same bits */
    float *normed = hmem(qb);
    put(dq, qkv, qb);
    OK(ppn_op_head_rmsnorm_rows(G, S, dq, (int)row, nq, nkv, hd, dw, PPN_DTYPE_BF16, 1e-6f, c));
    get(normed, dq, qb);
    ppn_dptr dkc2 = up(kc, cb), dvc2 = up(vc, cb), hdr = dalloc(sizeof(ppn_step_hdr));
    OK(G->ops->memset_d8(G, S, dkc2, 0, cb));
    OK(G->ops->memset_d8(G, S, dvc2, 0, cb));
    OK(G->ops->memset_d8(G, S, dkc, 0, cb));
    OK(G->ops->memset_d8(G, S, dvc, 0, cb));
    OK(tu_op_rope_kv_rows(G, S, dq, nq, nkv, hd, dinv, interleaved, dkc, dvc, ctx, kvdt, pos0, c));
    ppn_dptr dn = up(normed, qb);
    for (int i = 0; i < c; i++) {
        ppn_dptr x = dn + (size_t)i * row * 4;
        OK(ppn_op_set_hdr(G, S, hdr, pos0 + i, 0, 0, i));
        OK(tu_op_rope_kv(G, S, x, nq, nkv, hd, dinv, interleaved, hdr, dkc2, dvc2, x + (size_t)(nq + nkv) * hd * 4,
                          ctx, kvdt));
    }
    float *dec = hmem(qb);
    get(got, dq, qb), get(dec, dn, qb), get(kg, dkc, cb), get(vg, dvc, cb), get(kc, dkc2, cb), get(vc, dvc2, cb);
    if (memcmp(got, dec, qb) || memcmp(kg, kc, cb) || memcmp(vg, vc, cb))
        fail_msg("%s: prefill's rotary and KV store differ from decode's rope_kv on the GPU", what);
    printf("  %-58s = decode's rope_kv bits\n", "");
    free(qkv), free(ref), free(got), free(w), free(kc), free(vc), free(kg), free(vg), free(normed), free(dec);
    dfree_all();
}

/* rmsnorm_rows on rows past the model shapes, in place: 8 values a thread (n = 8 NORM_ROWS_BLOCK), and 9 for the
 * first 8 threads only; both must give their summation order's bits. */
static void norm_wide_case(int n, int c, int wdt)
{
    char what[128];
    size_t xb = (size_t)c * n * 4;
    float *r = tu_frand((size_t)c * n, -2, 2);
    void *w = tu_wrand(wdt, (size_t)n, NULL);
    ppn_dptr dx = up(r, xb), dw = up(w, (size_t)n * ppn_dtype_size(wdt));
    OK(ppn_op_rmsnorm_rows(G, S, dx, dx, dw, wdt, n, 1e-5f, c));
    snprintf(what, sizeof what, "rmsnorm_rows n=%d c=%d %s", n, c, ppn_dtype_name(wdt));
    check_norm_bits(what, dx, r, w, wdt, n, c);
    free(r), free(w);
    dfree_all();
}

static void test_gpu_rows_ops(void **state)
{
    (void)state;
    for (size_t k = 0; k < TU_LEN(MODELS); k++)
        for (int c = 1; c <= 512; c *= 8) {
            rowops_case(&MODELS[k], c == 1 ? 1 : c == 8 ? 7 : c, k % 2 ? PPN_DTYPE_F32 : PPN_DTYPE_BF16);
            rope_case(&MODELS[k], c == 1 ? 1 : c == 8 ? 7 : c, k < 2 ? 0 : 3, k == 1 ? PPN_DTYPE_F16 : PPN_DTYPE_BF16,
                      k == 3);
            if (c == 64) rope_case(&MODELS[k], 64, 130, PPN_DTYPE_F32, k == 3);
        }
    static const int wdts[] = {PPN_DTYPE_F32, PPN_DTYPE_BF16};
    for (size_t k = 0; k < TU_LEN(wdts); k++) {
        norm_wide_case(8 * NORM_ROWS_BLOCK, 3, wdts[k]);
        norm_wide_case(8 * NORM_ROWS_BLOCK + 8, 3, wdts[k]);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * attention */

typedef struct ashape {
    const char *name;
    int nq, nkv, hd;
} ashape;

/* Random caches over positions 0 .. pos0 + c - 1 and NaN past them (never attended: must never show). q in
 * [-3, 3], given in the cache's dtype when that is 2 bytes (the tensor cores round it so). */
static void attn_inputs(const ashape *a, int c, int pos0, int ctx, int kvdt, float **qkv, void **kc, void **vc)
{
    size_t row = (size_t)(a->nq + 2 * a->nkv) * a->hd, ne = (size_t)a->nkv * ctx * a->hd, es = ppn_dtype_size(kvdt);
    *qkv = tu_frand((size_t)c * row, -3, 3);
    if (kvdt != PPN_DTYPE_F32)
        for (size_t i = 0; i < (size_t)c * row; i++)
            (*qkv)[i] = kvdt == PPN_DTYPE_BF16 ? ppn_bf16_to_f32(ppn_f32_to_bf16((*qkv)[i]))
                                               : ppn_f16_to_f32(ppn_f32_to_f16((*qkv)[i]));
    *kc = tu_wrand(kvdt, ne, NULL), *vc = tu_wrand(kvdt, ne, NULL);
    for (int g = 0; g < a->nkv; g++)
        for (int t = pos0 + c; t < ctx; t++)
            for (int d = 0; d < a->hd; d++) {
                size_t i = ((size_t)g * ctx + t) * a->hd + d;
                if (es == 4) ((float *)*kc)[i] = ((float *)*vc)[i] = NAN;
                else ((uint16_t *)*kc)[i] = ((uint16_t *)*vc)[i] = 0x7fff;
            }
}

static double attn_tol(int kvdt, int hd)
{
    int tc = kvdt != PPN_DTYPE_F32 && (hd == 64 || hd == 128);
    return !tc ? 1e-5 : kvdt == PPN_DTYPE_BF16 ? 4e-3 : 1e-3;
}

static void attn_case(const ashape *a, int c, int pos0, int kvdt)
{
    char what[160];
    const int ctx = pos0 + c + 70, hd = a->hd;
    size_t row = (size_t)(a->nq + 2 * a->nkv) * hd, orow = (size_t)a->nq * hd, es = ppn_dtype_size(kvdt);
    size_t cb = (size_t)a->nkv * ctx * hd * es, ob = (size_t)c * orow * 4;
    float *qkv, *out = hmem(ob), *out2 = hmem(ob), *want = hmem(orow * 4);
    void *kc, *vc;
    attn_inputs(a, c, pos0, ctx, kvdt, &qkv, &kc, &vc);
    ppn_dptr dq = up(qkv, (size_t)c * row * 4), dkc = up(kc, cb), dvc = up(vc, cb), dout = dalloc(ob);
    float scale = 1.0f / sqrtf((float)hd);
    OK(tu_op_attn_rows(G, S, dout, dq, dkc, dvc, a->nq, a->nkv, hd, ctx, kvdt, scale, pos0, c));
    get(out, dout, ob);
    OK(G->ops->memset_d8(G, S, dout, 0xff, ob));
    OK(tu_op_attn_rows(G, S, dout, dq, dkc, dvc, a->nq, a->nkv, hd, ctx, kvdt, scale, pos0, c));
    get(out2, dout, ob);
    snprintf(what, sizeof what, "%s attn_rows c=%d pos0=%d %s", a->name, c, pos0, ppn_dtype_name(kvdt));
    if (memcmp(out, out2, ob)) fail_msg("%s: two launches gave different bits", what);
    if (orow % 64 == 0) { /* bf16 out (o's x for gemm_tc_kw16): the f32 out rounded, in PPN_X16_POS's layout */
        ppn_dptr dh = dalloc(ob / 2);
        uint16_t *h = hmem(ob / 2);
        ppn_kv_view kv = ppn_kv_view_identity(dkc, dvc, ctx, kvdt);
        OK(ppn_op_attn_rows_to(G, S, dh, PPN_DTYPE_BF16, dq, &kv, a->nq, a->nkv, hd, scale, pos0, c));
        get(h, dh, ob / 2);
        for (size_t k = 0; k < (size_t)c * orow; k++) {
            size_t at = k - k % orow + PPN_X16_POS(k % orow);
            if (h[at] != ppn_f32_to_bf16(out[k]))
                fail_msg("%s: bf16 out element %zu (at %zu) 0x%04x, want 0x%04x (the f32 out rounded)", what, k, at,
                         h[at], ppn_f32_to_bf16(out[k]));
        }
        free(h);
    }
    cmp cm = {0};
    double tol = attn_tol(kvdt, hd);
    int step = c <= 64 ? 1 : c / 29; /* a sample of long chunks' rows, the last always in */
    for (int i = 0; i < c; i = i + step < c || i == c - 1 ? i + step : c - 1) {
        ppn_step_hdr hdr = {.pos = pos0 + i};
        ppn_kp_attn p = {.out = D(want), .q = D(qkv + i * row), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr),
                         .n_heads = a->nq, .n_kv = a->nkv, .head_dim = hd, .cap = ctx, .n_split = 1, .kvdt = kvdt,
                         .scale = scale};
        tu_kernel_run(PPN_K_ATTN, &p);
        for (size_t k = 0; k < orow; k++) cmp_add(&cm, out[i * orow + k], want[k], tol, i * orow + k);
    }
    cmp_done(&cm, what);
    free(qkv), free(kc), free(vc), free(out), free(out2), free(want);
    dfree_all();
}

static const ashape ATTN_MODELS[] = {{"llama-1b", 32, 8, 64}, {"llama-8b", 32, 8, 128}};
static const ashape ATTN_FIXTURES[] = {
    {"llama-tiny", 8, 2, 8}, {"qwen2-tiny", 4, 2, 16}, {"qwen3-tiny", 4, 2, 32}, {"hd48", 8, 4, 48},
    {"hd64 mha", 4, 4, 64}, {"hd128 g8", 16, 2, 128}, {"hd64 g6", 12, 2, 64}, {"hd128 g16", 16, 1, 128},
};

static void test_gpu_rows_attn_models(void **state)
{
    (void)state;
    static const int cs[] = {1, 7, 64, 512};
    for (size_t k = 0; k < TU_LEN(ATTN_MODELS); k++)
        for (size_t i = 0; i < TU_LEN(cs); i++) {
            attn_case(&ATTN_MODELS[k], cs[i], 0, PPN_DTYPE_BF16);
            attn_case(&ATTN_MODELS[k], cs[i], 512, PPN_DTYPE_BF16); /* a second chunk after one of 512 */
            attn_case(&ATTN_MODELS[k], cs[i], cs[i] == 7 ? 57 : 0, PPN_DTYPE_F16);
            if (cs[i] <= 64) attn_case(&ATTN_MODELS[k], cs[i], 33, PPN_DTYPE_F32);
        }
}

static void test_gpu_rows_attn_fixtures(void **state)
{
    (void)state;
    for (size_t k = 0; k < TU_LEN(ATTN_FIXTURES); k++)
        for (int kvdt = PPN_DTYPE_F32; kvdt <= PPN_DTYPE_F16; kvdt++) {
            attn_case(&ATTN_FIXTURES[k], 13, 0, kvdt);
            attn_case(&ATTN_FIXTURES[k], 70, 45, kvdt);
        }
}

/* ---------------------------------------------------------------------------------------------------------
 * timing */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef ppn_status (*launch_fn)(void *arg);

/* Median milliseconds of one launch: 3 warm-ups, then 15 launches each between timing events. */
static double time_ms(launch_fn fn, void *arg)
{
    ppn_gevent *e0, *e1;
    OK(G->ops->event_create(G, 0, 1, &e0));
    OK(G->ops->event_create(G, 0, 1, &e1));
    for (int i = 0; i < 3; i++) OK(fn(arg));
    float ms[15];
    for (int i = 0; i < 15; i++) {
        OK(G->ops->event_record(G, e0, S));
        OK(fn(arg));
        OK(G->ops->event_record(G, e1, S));
        OK(G->ops->event_sync(G, e1));
        OK(G->ops->event_elapsed(G, e0, e1, &ms[i]));
    }
    OK(G->ops->event_destroy(G, e0));
    OK(G->ops->event_destroy(G, e1));
    qsort(ms, 15, sizeof ms[0], cmp_float);
    return ms[7];
}

typedef struct attn_run {
    const ashape *a;
    ppn_dptr out, qkv, kc, vc;
    int ctx, kvdt, c, pos0;
} attn_run;

static ppn_status attn_launch(void *arg)
{
    attn_run *r = arg;
    return tu_op_attn_rows(G, S, r->out, r->qkv, r->kc, r->vc, r->a->nq, r->a->nkv, r->a->hd, r->ctx, r->kvdt,
                            1.0f / sqrtf((float)r->a->hd), r->pos0, r->c);
}

typedef struct rows_run {
    const mshape *m;
    int which, c;
    ppn_dptr a, b, w, tok, kc, vc, inv;
} rows_run;

static ppn_status rows_launch(void *arg)
{
    rows_run *r = arg;
    const mshape *m = r->m;
    switch (r->which) {
    case 0: return ppn_op_embed_rows(G, S, r->a, r->w, PPN_DTYPE_BF16, 1000, m->dim, r->tok, r->c);
    case 1: return ppn_op_rmsnorm_rows(G, S, r->a, r->b, r->w, PPN_DTYPE_BF16, m->dim, 1e-5f, r->c);
    case 2: return tu_op_rope_kv_rows(G, S, r->b, m->nq, m->nkv, m->hd, r->inv, 0, r->kc, r->vc, r->c,
                                       PPN_DTYPE_BF16, 0, r->c);
    default: return ppn_op_swiglu_rows(G, S, r->a, r->b, m->ffn, r->c);
    }
}

static void test_gpu_rows_attn_timing(void **state)
{
    (void)state;
    printf("  attn_rows, pos0 = 0 (causal), median of 15 after 3 warm-ups:\n");
    printf("  %-10s %-5s %6s %10s %9s\n", "model", "kv", "c", "ms", "TFLOP/s");
    static const int cs[] = {512, 4096};
    static const int dts[] = {PPN_DTYPE_BF16, PPN_DTYPE_F16, PPN_DTYPE_F32};
    for (size_t k = 0; k < TU_LEN(ATTN_MODELS); k++)
        for (size_t d = 0; d < TU_LEN(dts); d++)
            for (size_t i = 0; i < TU_LEN(cs); i++) {
                const ashape *a = &ATTN_MODELS[k];
                int c = cs[i], kvdt = dts[d];
                if (kvdt == PPN_DTYPE_F32 && c > 512) continue; /* the accuracy path: one size is enough */
                size_t row = (size_t)(a->nq + 2 * a->nkv) * a->hd, es = ppn_dtype_size(kvdt);
                size_t cb = (size_t)a->nkv * c * a->hd * es;
                float *q = tu_frand((size_t)c * row, -3, 3);
                void *kc = tu_wrand(kvdt, cb / es, NULL), *vc = tu_wrand(kvdt, cb / es, NULL);
                attn_run r = {.a = a, .qkv = up(q, (size_t)c * row * 4), .kc = up(kc, cb), .vc = up(vc, cb),
                              .out = dalloc((size_t)c * a->nq * a->hd * 4), .ctx = c, .kvdt = kvdt, .c = c};
                double ms = time_ms(attn_launch, &r);
                double flops = 4.0 * a->hd * a->nq * ((double)c * (c + 1) / 2);
                printf("  %-10s %-5s %6d %10.4f %9.1f\n", a->name, ppn_dtype_name(kvdt), c, ms, flops / (ms * 1e9));
                free(q), free(kc), free(vc);
                dfree_all();
            }
    printf("  4096 positions as 8 chunks of 512 (pos0 = 0, 512, .., 3584; bf16), each chunk's median:\n");
    for (size_t k = 0; k < TU_LEN(ATTN_MODELS); k++) {
        const ashape *a = &ATTN_MODELS[k];
        const int c = 512, ctx = 4096;
        size_t row = (size_t)(a->nq + 2 * a->nkv) * a->hd, cb = (size_t)a->nkv * ctx * a->hd * 2;
        float *q = tu_frand((size_t)c * row, -3, 3);
        void *kc = tu_wrand(PPN_DTYPE_BF16, cb / 2, NULL), *vc = tu_wrand(PPN_DTYPE_BF16, cb / 2, NULL);
        attn_run r = {.a = a, .qkv = up(q, (size_t)c * row * 4), .kc = up(kc, cb), .vc = up(vc, cb),
                      .out = dalloc((size_t)c * a->nq * a->hd * 4), .ctx = ctx, .kvdt = PPN_DTYPE_BF16, .c = c};
        double total = 0, last = 0;
        for (r.pos0 = 0; r.pos0 < ctx; r.pos0 += c) total += last = time_ms(attn_launch, &r);
        double flops = 4.0 * a->hd * a->nq * ((double)ctx * (ctx + 1) / 2);
        printf("  %-10s sum %.4f ms (%.1f TFLOP/s), last chunk %.4f ms\n", a->name, total, flops / (total * 1e9), last);
        free(q), free(kc), free(vc);
        dfree_all();
    }
    printf("  row ops at c = 4096 (bf16 weights and caches), median of 15:\n");
    static const char *const names[] = {"embed_rows", "rmsnorm_rows", "rope_kv_rows", "swiglu_rows"};
    for (size_t k = 0; k < TU_LEN(ATTN_MODELS); k++) {
        const mshape *m = &MODELS[k];
        const int c = 4096;
        size_t row = (size_t)(m->nq + 2 * m->nkv) * m->hd, big = (size_t)c * 2 * (m->ffn > (int)row ? m->ffn : (int)row);
        rows_run r = {.m = m, .c = c, .a = dalloc(big * 4), .b = dalloc(big * 4), .w = dalloc((size_t)1000 * m->dim * 2),
                      .tok = dalloc((size_t)c * 4), .kc = dalloc((size_t)m->nkv * c * m->hd * 2),
                      .vc = dalloc((size_t)m->nkv * c * m->hd * 2), .inv = dalloc((size_t)m->hd * 2)};
        OK(G->ops->memset_d8(G, S, r.a, 0, big * 4));
        OK(G->ops->memset_d8(G, S, r.b, 0, big * 4));
        OK(G->ops->memset_d8(G, S, r.w, 0, (size_t)1000 * m->dim * 2));
        OK(G->ops->memset_d8(G, S, r.tok, 0, (size_t)c * 4));
        OK(G->ops->memset_d8(G, S, r.inv, 0, (size_t)m->hd * 2));
        double bytes[4] = {(double)c * m->dim * (4 + 2), (double)c * m->dim * 8,
                           (double)c * row * 8 + (double)c * 2 * m->nkv * m->hd * 2, (double)c * m->ffn * 12};
        for (int w = 0; w < 4; w++) {
            r.which = w;
            double ms = time_ms(rows_launch, &r);
            printf("  %-10s %-13s %9.4f ms %8.0f GB/s\n", m->name, names[w], ms, bytes[w] / (ms * 1e6));
        }
        dfree_all();
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * Paged KV: the same values behind a scrambled block table (blocks of 1, 16, 64 positions; pool blocks nobody
 * holds full of NaN) must give the identity layout's bits on the GPU (the kernels' reduction order never depends
 * on where a row lives), and so match the CPU reference as the identity layout does (checked on the last row).
 * Then the batched decode ops: attn_batch's rows are ppn_op_attn's bits at their positions, whatever the batch,
 * and rope_kv_batch's are rope_kv_rows's. */

typedef struct pgv {
    int L, n_tbl, n_blocks, cap;
    int32_t *tbl;
} pgv;

static pgv pgv_new(int L, int ctx)
{
    pgv p = {.L = L, .n_tbl = (ctx + (1 << L) - 1) >> L};
    p.n_blocks = p.n_tbl + 3;
    if (p.n_blocks % 7 == 0) p.n_blocks++;
    p.cap = p.n_blocks << L;
    p.tbl = hmem((size_t)p.n_tbl * 4);
    for (int b = 0; b < p.n_tbl; b++) p.tbl[b] = (int32_t)((7 * b + 3) % p.n_blocks);
    return p;
}

static size_t pgv_row(const pgv *p, int g, int t, int hd)
{
    int32_t pp = (p->tbl[t >> p->L] << p->L) | (t & ((1 << p->L) - 1));
    return ((size_t)g * p->cap + (size_t)pp) * hd;
}

/* identity [nkv, ctx, hd] <-> pool [nkv, cap, hd] through the table (to_pool: scatter, else gather) */
static void pgv_move(const pgv *p, int nkv, int ctx, int hd, size_t es, void *id, void *pool, int to_pool)
{
    for (int g = 0; g < nkv; g++)
        for (int t = 0; t < ctx; t++) {
            unsigned char *a = (unsigned char *)id + ((size_t)g * ctx + t) * hd * es;
            unsigned char *b = (unsigned char *)pool + pgv_row(p, g, t, hd) * es;
            if (to_pool) memcpy(b, a, (size_t)hd * es);
            else memcpy(a, b, (size_t)hd * es);
        }
}

static void paged_case(const ashape *a, int c, int pos0, int kvdt, int L)
{
    char what[160];
    const int ctx = pos0 + c + 1, hd = a->hd; /* one more position: decode attention at pos0 + c */
    pgv pg = pgv_new(L, ctx);
    size_t row = (size_t)(a->nq + 2 * a->nkv) * hd, orow = (size_t)a->nq * hd, es = ppn_dtype_size(kvdt);
    size_t cb = (size_t)a->nkv * ctx * hd * es, pb = (size_t)a->nkv * pg.cap * hd * es, ob = (size_t)c * orow * 4;
    float *qkv, *o1 = hmem(ob), *o2 = hmem(ob), *q1 = hmem((size_t)c * row * 4), *q2 = hmem((size_t)c * row * 4);
    void *kc, *vc, *pk = hmem(pb), *pv = hmem(pb), *k1 = hmem(cb), *k2 = hmem(cb), *v1 = hmem(cb), *v2 = hmem(cb);
    attn_inputs(a, c, pos0, ctx, kvdt, &qkv, &kc, &vc);
    memset(pk, 0xff, pb), memset(pv, 0xff, pb); /* NaN in every dtype */
    pgv_move(&pg, a->nkv, ctx, hd, es, kc, pk, 1), pgv_move(&pg, a->nkv, ctx, hd, es, vc, pv, 1);
    float inv[128];
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    ppn_dptr dq1 = up(qkv, (size_t)c * row * 4), dq2 = up(qkv, (size_t)c * row * 4), dinv = up(inv, sizeof inv);
    ppn_dptr dkc = up(kc, cb), dvc = up(vc, cb), dpk = up(pk, pb), dpv = up(pv, pb), dtbl = up(pg.tbl, pg.n_tbl * 4);
    ppn_dptr do1 = dalloc(ob), do2 = dalloc(ob);
    ppn_kv_view id = ppn_kv_view_identity(dkc, dvc, ctx, kvdt);
    ppn_kv_view pv_ = {.pool = {.k = dpk, .v = dpv, .cap = pg.cap, .block_log2 = L, .kvdt = kvdt}, .tbl = dtbl,
                       .tbl_h = pg.tbl, .n_tbl = pg.n_tbl};
    float scale = 1.0f / sqrtf((float)hd);
    OK(ppn_op_rope_kv_rows(G, S, dq1, a->nq, a->nkv, hd, dinv, 0, &id, pos0, c));
    OK(ppn_op_rope_kv_rows(G, S, dq2, a->nq, a->nkv, hd, dinv, 0, &pv_, pos0, c));
    OK(ppn_op_attn_rows(G, S, do1, dq1, &id, a->nq, a->nkv, hd, scale, pos0, c));
    OK(ppn_op_attn_rows(G, S, do2, dq2, &pv_, a->nq, a->nkv, hd, scale, pos0, c));
    get(q1, dq1, (size_t)c * row * 4), get(q2, dq2, (size_t)c * row * 4), get(o1, do1, ob), get(o2, do2, ob);
    get(k1, dkc, cb), get(v1, dvc, cb), get(pk, dpk, pb), get(pv, dpv, pb);
    pgv_move(&pg, a->nkv, ctx, hd, es, k2, pk, 0), pgv_move(&pg, a->nkv, ctx, hd, es, v2, pv, 0);
    snprintf(what, sizeof what, "%s paged rows c=%d pos0=%d %s block %d", a->name, c, pos0, ppn_dtype_name(kvdt), 1 << L);
    if (memcmp(q1, q2, (size_t)c * row * 4) || memcmp(o1, o2, ob) || memcmp(k1, k2, cb) || memcmp(v1, v2, cb))
        fail_msg("%s: the paged layout's bits differ from the identity layout's", what);
    /* the CPU reference on the pool as the GPU left it, the chunk's last row, with q given in the cache's dtype as
     * the tensor cores take it (attn_tol's premise; the rotated q is not) */
    cmp cm = {0};
    float *want = hmem(orow * 4), *qr = hmem(orow * 4);
    memcpy(qr, q2 + (size_t)(c - 1) * row, orow * 4);
    for (size_t k = 0; k < orow && kvdt != PPN_DTYPE_F32; k++)
        qr[k] = kvdt == PPN_DTYPE_BF16 ? ppn_bf16_to_f32(ppn_f32_to_bf16(qr[k])) : ppn_f16_to_f32(ppn_f32_to_f16(qr[k]));
    ppn_step_hdr hdr = {.pos = pos0 + c - 1};
    ppn_kp_attn p = {.out = D(want), .q = D(attn_tol(kvdt, hd) > 1e-5 ? qr : q2 + (size_t)(c - 1) * row), .kc = D(pk), .vc = D(pv), .hdr = D(&hdr),
                     .tbl = D(pg.tbl), .n_heads = a->nq, .n_kv = a->nkv, .head_dim = hd, .cap = pg.cap, .n_split = 1,
                     .kvdt = kvdt, .block_log2 = L, .scale = scale};
    tu_kernel_run(PPN_K_ATTN, &p);
    for (size_t k = 0; k < orow; k++) cmp_add(&cm, o2[(size_t)(c - 1) * orow + k], want[k], attn_tol(kvdt, hd), k);
    cmp_done(&cm, what);
    /* decode attention at pos0 + c - 1 (hdr on the device), split: the same bits through either layout */
    int ns = 8;
    size_t sb = ppn_op_attn_scratch_bytes(a->nq, ns, hd);
    ppn_dptr dh = up(&hdr, sizeof hdr), dpart = dalloc(sb);
    OK(G->ops->memset_d8(G, S, dpart, 0, sb));
    OK(ppn_op_attn(G, S, do1, dq1 + (size_t)(c - 1) * row * 4, &id, a->nq, a->nkv, hd, scale, dh, dpart, ns));
    OK(ppn_op_attn(G, S, do2, dq2 + (size_t)(c - 1) * row * 4, &pv_, a->nq, a->nkv, hd, scale, dh, dpart, ns));
    get(o1, do1, orow * 4), get(o2, do2, orow * 4);
    if (memcmp(o1, o2, orow * 4)) fail_msg("%s: decode attention's bits differ between the layouts", what);
    cmp cd = {0};
    p.q = D(q2 + (size_t)(c - 1) * row); /* decode attention takes q in f32 */
    tu_kernel_run(PPN_K_ATTN, &p);
    for (size_t k = 0; k < orow; k++) cmp_add(&cd, o2[k], want[k], 2e-5, k);
    snprintf(what, sizeof what, "%s paged decode attn pos=%d %s block %d", a->name, pos0 + c - 1, ppn_dtype_name(kvdt),
             1 << L);
    cmp_done(&cd, what);
    free(qkv), free(kc), free(vc), free(o1), free(o2), free(q1), free(q2), free(pk), free(pv), free(k1), free(k2);
    free(v1), free(v2), free(want), free(qr), free(pg.tbl);
    dfree_all();
}

/* B rows of different sequences in one pool: attn_batch's row i is ppn_op_attn's bits on row i's view, in a batch
 * of B and alone; rope_kv_batch's row i is rope_kv_rows's; attn_rope_batch is rope_kv_batch then attn_batch. */
static void batch_case(const ashape *a, int kvdt, int L, int B)
{
    char what[160];
    const int hd = a->hd, ns = 8, maxpos = 700;
    int per = (maxpos + (1 << L) - 1) >> L; /* blocks a sequence holds */
    pgv pg = pgv_new(L, B * (per << L)); /* one table cut into B sequences' tables of per blocks */
    size_t row = (size_t)(a->nq + 2 * a->nkv) * hd, orow = (size_t)a->nq * hd, es = ppn_dtype_size(kvdt);
    size_t pb = (size_t)a->nkv * pg.cap * hd * es, ob = (size_t)B * orow * 4;
    void *pk = tu_wrand(kvdt, pb / es, NULL), *pv = tu_wrand(kvdt, pb / es, NULL);
    float *qkv = tu_frand((size_t)B * row, -3, 3), *ob_ = hmem(ob), *one = hmem(orow * 4), *q1 = hmem((size_t)B * row * 4);
    float *q2 = hmem((size_t)B * row * 4);
    ppn_kseg *segs = hmem((size_t)B * sizeof(ppn_kseg));
    const int32_t **tb = hmem((size_t)B * sizeof(int32_t *));
    int *nt = hmem((size_t)B * sizeof(int));
    ppn_dptr dpk = up(pk, pb), dpv = up(pv, pb), dtbl = up(pg.tbl, (size_t)pg.n_tbl * 4), dq = up(qkv, (size_t)B * row * 4);
    ppn_dptr dq2 = up(qkv, (size_t)B * row * 4), dout = dalloc(ob), d1 = dalloc(orow * 4);
    ppn_dptr dpart = dalloc(ppn_op_attn_batch_scratch_bytes(B, a->nq, ns, hd)), dsegs = dalloc((size_t)B * sizeof(ppn_kseg));
    ppn_dptr dh = dalloc(sizeof(ppn_step_hdr));
    ppn_dptr dpk3 = up(pk, pb), dpv3 = up(pv, pb), dq3 = up(qkv, (size_t)B * row * 4); /* the fused op's inputs */
    OK(G->ops->memset_d8(G, S, dpart, 0, ppn_op_attn_batch_scratch_bytes(B, a->nq, ns, hd)));
    for (int i = 0; i < B; i++) {
        segs[i] = (ppn_kseg){.pos = (int32_t)((i * 997 + 13) % maxpos), .tbl = dtbl + (size_t)i * per * 4};
        tb[i] = pg.tbl + (size_t)i * per, nt[i] = per;
    }
    put(dsegs, segs, (size_t)B * sizeof(ppn_kseg));
    ppn_kv_pool pool = {.k = dpk, .v = dpv, .cap = pg.cap, .block_log2 = L, .kvdt = kvdt};
    float scale = 1.0f / sqrtf((float)hd), inv[128];
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    ppn_dptr dinv = up(inv, sizeof inv);
    /* the rotary: batch vs one row chunk per sequence */
    OK(ppn_op_rope_kv_batch(G, S, dq, a->nq, a->nkv, hd, dinv, 0, &pool, dsegs, segs, tb, nt, B));
    get(q1, dq, (size_t)B * row * 4);
    for (int i = 0; i < B; i++) {
        ppn_kv_view w = {.pool = pool, .tbl = segs[i].tbl, .tbl_h = tb[i], .n_tbl = nt[i]};
        OK(ppn_op_rope_kv_rows(G, S, dq2 + (size_t)i * row * 4, a->nq, a->nkv, hd, dinv, 0, &w, segs[i].pos, 1));
    }
    get(q2, dq2, (size_t)B * row * 4);
    snprintf(what, sizeof what, "%s batch B=%d %s block %d", a->name, B, ppn_dtype_name(kvdt), 1 << L);
    if (memcmp(q1, q2, (size_t)B * row * 4)) fail_msg("%s: rope_kv_batch differs from rope_kv_rows", what);
    OK(ppn_op_attn_batch(G, S, dout, dq, a->nq, a->nkv, hd, scale, &pool, dsegs, segs, tb, nt, B, dpart, ns));
    get(ob_, dout, ob);
    get(pk, dpk, pb), get(pv, dpv, pb);
    /* out in bf16 for the o projection's gemm_tc_kw16 (attn_batch_to): the f32 bits rounded, in its layout */
    ppn_dptr d16 = dalloc((size_t)B * orow * 2);
    OK(ppn_op_attn_batch_to(G, S, d16, PPN_DTYPE_BF16, dq, a->nq, a->nkv, hd, scale, &pool, dsegs, segs, tb, nt, B,
                            dpart, ns));
    check_bf16_rows(what, d16, ob_, (size_t)B, orow);
    /* the rotary inside (ppn_op_attn_rope_batch) on the unrotated rows and the pools as they were: the same bits
     * as rope_kv_batch then attn_batch, out and both pools, and q|k|v left as it was */
    ppn_kv_pool pool3 = {.k = dpk3, .v = dpv3, .cap = pg.cap, .block_log2 = L, .kvdt = kvdt};
    if (ppn_op_attn_rope_fits(hd, 0)) {
        ppn_dptr dfo = dalloc(ob);
        OK(ppn_op_attn_rope_batch(G, S, dfo, dq3, a->nq, a->nkv, hd, scale, &pool3, dsegs, segs, tb, nt, B, dpart, ns,
                                  dinv, 0));
        float *of = hmem(ob), *xf = hmem((size_t)B * row * 4);
        unsigned char *kf = hmem(pb), *vf = hmem(pb);
        get(of, dfo, ob), get(kf, dpk3, pb), get(vf, dpv3, pb), get(xf, dq3, (size_t)B * row * 4);
        if (memcmp(of, ob_, ob)) fail_msg("%s: attn_rope_batch's out differs from rope_kv_batch + attn_batch", what);
        if (memcmp(kf, pk, pb) || memcmp(vf, pv, pb)) fail_msg("%s: attn_rope_batch's pools differ", what);
        if (memcmp(xf, qkv, (size_t)B * row * 4)) fail_msg("%s: attn_rope_batch wrote q|k|v", what);
        /* again into bf16 (attn_rope_batch_to; it stores the same k and v at each row's position) */
        OK(ppn_op_attn_rope_batch_to(G, S, d16, PPN_DTYPE_BF16, dq3, a->nq, a->nkv, hd, scale, &pool3, dsegs, segs, tb,
                                     nt, B, dpart, ns, dinv, 0));
        char w16[200];
        snprintf(w16, sizeof w16, "%s rope", what);
        check_bf16_rows(w16, d16, of, (size_t)B, orow);
        free(of), free(xf), free(kf), free(vf);
    } else if (ppn_op_attn_rope_batch(G, S, dout, dq3, a->nq, a->nkv, hd, scale, &pool3, dsegs, segs, tb, nt, B, dpart,
                                      ns, dinv, 0) != PPN_EUNSUPPORTED) {
        fail_msg("%s: attn_rope_batch took head_dim %d (rotated halves), which the fused rotary does not", what, hd);
    }
    cmp cm = {0};
    float *want = hmem(orow * 4);
    for (int i = 0; i < B; i++) {
        ppn_kv_view w = {.pool = pool, .tbl = segs[i].tbl, .tbl_h = tb[i], .n_tbl = nt[i]};
        ppn_step_hdr hdr = {.pos = segs[i].pos};
        put(dh, &hdr, sizeof hdr);
        OK(ppn_op_attn(G, S, d1, dq + (size_t)i * row * 4, &w, a->nq, a->nkv, hd, scale, dh, dpart, ns));
        get(one, d1, orow * 4);
        if (memcmp(one, ob_ + (size_t)i * orow, orow * 4)) fail_msg("%s: row %d differs from ppn_op_attn", what, i);
        ppn_kp_attn p = {.out = D(want), .q = D(q1 + (size_t)i * row), .kc = D(pk), .vc = D(pv), .hdr = D(&hdr),
                         .tbl = D(tb[i]), .n_heads = a->nq, .n_kv = a->nkv, .head_dim = hd, .cap = pg.cap,
                         .n_split = 1, .kvdt = kvdt, .block_log2 = L, .scale = scale};
        tu_kernel_run(PPN_K_ATTN, &p);
        for (size_t k = 0; k < orow; k++) cmp_add(&cm, ob_[(size_t)i * orow + k], want[k], 2e-5, k);
    }
    cmp_done(&cm, what);
    free(pk), free(pv), free(qkv), free(ob_), free(one), free(q1), free(q2), free(segs), free(tb), free(nt), free(want);
    free(pg.tbl);
    dfree_all();
}

/* ---------------------------------------------------------------------------------------------------------
 * The batched decode attention on tensor cores (ppn_op_attn_batch_tc). Each row against a double-precision
 * reference with the kernel's roundings (q to bf16; each weight to bf16 where it multiplies v, the sum unrounded)
 * within 2^-7 of the magnitude sum p |v| / sum p (the device rounds each weight against its tile's running maximum,
 * the reference against the row's: two roundings of 2^-9, and f32 sums), and against the exact attention within
 * those roundings' bound; every row alone gives its bits in the batch; two launches give the same bits (the split
 * counters back at 0); bf16 out = the f32 out rounded in gemm_tc_kw16's layout. Then timed beside the decode
 * kernel per row (ppn_op_attn_batch_to) at the batch step's shapes. */

/* Row i's reference at pos over the pool through tbl; worst |got - ref| / tol over the row: tc 2^-7 mag; exact the
 * roundings' bound (as tests/test_kernels_paged.c's batch_expect). */
static void tc_expect(const ashape *a, const float *q, const void *pk, const void *pv, int kvdt, int cap, const int32_t *tbl,
                      int L, int pos, const float *got, double *worst_tc, double *worst_exact)
{
    int hd = a->hd, group = a->nq / a->nkv;
    double *s = hmem(sizeof(double) * (size_t)(pos + 1)), *x = hmem(sizeof(double) * (size_t)(pos + 1));
    for (int h = 0; h < a->nq; h++) {
        int g = h / group;
        double mx = -INFINITY, xmx = -INFINITY, den = 0, xden = 0, dq = 0;
        for (int t = 0; t <= pos; t++) {
            size_t at = ((size_t)g * cap + (size_t)((tbl[t >> L] << L) | (t & ((1 << L) - 1)))) * hd;
            double d = 0, dx = 0, dd = 0;
            for (int e = 0; e < hd; e++) {
                double qe = q[h * hd + e], qr = ppn_bf16_to_f32(ppn_f32_to_bf16(q[h * hd + e])), k = elem(pk, kvdt, at + e);
                d += qr * k, dx += qe * k, dd += fabs(qe - qr) * fabs(k);
            }
            s[t] = d / sqrt((double)hd), x[t] = dx / sqrt((double)hd);
            dq = fmax(dq, dd / sqrt((double)hd)), mx = fmax(mx, s[t]), xmx = fmax(xmx, x[t]);
        }
        for (int t = 0; t <= pos; t++) s[t] = exp(s[t] - mx), den += s[t], x[t] = exp(x[t] - xmx), xden += x[t];
        for (int e = 0; e < hd; e++) {
            double num = 0, mag = 0, xnum = 0;
            for (int t = 0; t <= pos; t++) {
                size_t at = ((size_t)g * cap + (size_t)((tbl[t >> L] << L) | (t & ((1 << L) - 1)))) * hd + e;
                double v = elem(pv, kvdt, at);
                num += ppn_bf16_to_f32(ppn_f32_to_bf16((float)s[t])) * v, mag += s[t] * fabs(v), xnum += x[t] * v;
            }
            double o = got[h * hd + e], m = mag / den;
            *worst_tc = fmax(*worst_tc, fabs(o - num / den) / (m / 128 + 1e-30));
            *worst_exact = fmax(*worst_exact, fabs(o - xnum / xden) / (m * (1.0 / 256 + expm1(4 * dq)) + 1e-30));
            if (!(o == o)) *worst_tc = INFINITY;
        }
    }
    free(s), free(x);
}

static void tc_case(const ashape *a, int L, int B, int ns)
{
    char what[160];
    const int hd = a->hd, maxpos = 700;
    int per = (maxpos + (1 << L) - 1) >> L;
    pgv pg = pgv_new(L, B * (per << L));
    size_t row = (size_t)(a->nq + 2 * a->nkv) * hd, orow = (size_t)a->nq * hd;
    size_t pb = (size_t)a->nkv * pg.cap * hd * 2, ob = (size_t)B * orow * 4;
    void *pk = tu_wrand(PPN_DTYPE_BF16, pb / 2, NULL), *pv = tu_wrand(PPN_DTYPE_BF16, pb / 2, NULL);
    char *held = hmem((size_t)pg.n_blocks);
    memset(held, 0, (size_t)pg.n_blocks);
    for (int b = 0; b < pg.n_tbl; b++) held[pg.tbl[b]] = 1;
    for (int b = 0; b < pg.n_blocks; b++) /* blocks nobody holds: NaN, which must never reach an output */
        for (size_t e = 0; !held[b] && e < (size_t)a->nkv * ((size_t)1 << L) * hd; e++) {
            size_t g = e / (((size_t)1 << L) * hd), r = e % (((size_t)1 << L) * hd);
            size_t at = (g * pg.cap + ((size_t)b << L)) * hd + r;
            ((uint16_t *)pk)[at] = ((uint16_t *)pv)[at] = 0x7fc0u;
        }
    free(held);
    float *qkv = tu_frand((size_t)B * row, -3, 3), *o1 = hmem(ob), *o2 = hmem(ob), *one = hmem(orow * 4);
    ppn_kseg *segs = hmem((size_t)B * sizeof(ppn_kseg));
    const int32_t **tb = hmem((size_t)B * sizeof(int32_t *));
    int *nt = hmem((size_t)B * sizeof(int));
    size_t partb = ppn_op_attn_batch_scratch_bytes(B, a->nq, ns, hd);
    ppn_dptr dpk = up(pk, pb), dpv = up(pv, pb), dtbl = up(pg.tbl, (size_t)pg.n_tbl * 4), dq = up(qkv, (size_t)B * row * 4);
    ppn_dptr dout = dalloc(ob), d1 = dalloc(orow * 4), dpart = dalloc(partb), dsegs = dalloc((size_t)B * sizeof(ppn_kseg));
    ppn_dptr d16 = dalloc((size_t)B * orow * 2);
    OK(G->ops->memset_d8(G, S, dpart, 0, partb));
    static const int edge[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 699};
    for (int i = 0; i < B; i++) {
        int pos = i < (int)TU_LEN(edge) ? edge[i] : (i * 997 + 13) % maxpos;
        segs[i] = (ppn_kseg){.pos = pos, .tbl = dtbl + (size_t)i * per * 4};
        tb[i] = pg.tbl + (size_t)i * per, nt[i] = per;
    }
    put(dsegs, segs, (size_t)B * sizeof(ppn_kseg));
    ppn_kv_pool pool = {.k = dpk, .v = dpv, .cap = pg.cap, .block_log2 = L, .kvdt = PPN_DTYPE_BF16};
    float scale = 1.0f / sqrtf((float)hd);
    OK(ppn_op_attn_batch_tc(G, S, dout, PPN_DTYPE_F32, dq, a->nq, a->nkv, hd, scale, &pool, dsegs, segs, tb, nt, B,
                            dpart, ns));
    get(o1, dout, ob);
    OK(ppn_op_attn_batch_tc(G, S, dout, PPN_DTYPE_F32, dq, a->nq, a->nkv, hd, scale, &pool, dsegs, segs, tb, nt, B,
                            dpart, ns));
    get(o2, dout, ob);
    snprintf(what, sizeof what, "%s attn_batch_tc B=%d block %d, %d splits", a->name, B, 1 << L, ns);
    if (memcmp(o1, o2, ob)) fail_msg("%s: two launches differ", what);
    OK(ppn_op_attn_batch_tc(G, S, d16, PPN_DTYPE_BF16, dq, a->nq, a->nkv, hd, scale, &pool, dsegs, segs, tb, nt, B,
                            dpart, ns));
    check_bf16_rows(what, d16, o1, (size_t)B, orow);
    double wt = 0, we = 0;
    for (int i = 0; i < B; i++) {
        if (i % 5 == 0 || i < (int)TU_LEN(edge)) { /* alone: the same bits */
            OK(ppn_op_attn_batch_tc(G, S, d1, PPN_DTYPE_F32, dq + (size_t)i * row * 4, a->nq, a->nkv, hd, scale, &pool,
                                    dsegs + (size_t)i * sizeof(ppn_kseg), &segs[i], &tb[i], &nt[i], 1, dpart, ns));
            get(one, d1, orow * 4);
            if (memcmp(one, o1 + (size_t)i * orow, orow * 4)) fail_msg("%s: row %d alone differs", what, i);
        }
        tc_expect(a, qkv + (size_t)i * row, pk, pv, PPN_DTYPE_BF16, pg.cap, tb[i], L, segs[i].pos, o1 + (size_t)i * orow,
                  &wt, &we);
    }
    printf("  %-58s worst %.3f of 2^-7 mag (rounded ref), %.3f of the bound (exact)\n", what, wt, we);
    if (!(wt <= 1.0) || !(we <= 1.0)) fail_msg("%s: off the reference (%.3f, %.3f of tolerance)", what, wt, we);
    free(pk), free(pv), free(qkv), free(o1), free(o2), free(one), free(segs), free(tb), free(nt), free(pg.tbl);
    dfree_all();
}

typedef struct tcrun {
    const ashape *a;
    ppn_kv_pool pool;
    ppn_dptr out, q, segs, part;
    const ppn_kseg *segs_h;
    const int32_t **tb;
    int *nt;
    int B, ns, tc;
} tcrun;

static ppn_status graph_replay(void *arg) { return G->ops->graph_launch(G, (ppn_ggraph *)arg, S); }

/* Microseconds of one launch of fn on the device alone: 10 launches captured into a graph, the graph's replay timed
 * (time_ms), divided by 10. Timing the op directly would count its host-side work (a paged op builds its
 * declarations per held block) whenever that is longer than the kernel. */
static double time_graph_us(launch_fn fn, void *arg)
{
    ppn_ggraph *gr = NULL;
    OK(G->ops->capture_begin(G, S));
    for (int i = 0; i < 10; i++) OK(fn(arg));
    OK(G->ops->capture_end(G, S, &gr));
    double us = time_ms(graph_replay, gr) * 1e3 / 10;
    OK(G->ops->graph_destroy(G, gr));
    return us;
}

static ppn_status tc_launch(void *arg)
{
    tcrun *r = arg;
    const ashape *a = r->a;
    float scale = 1.0f / sqrtf((float)a->hd);
    if (r->tc)
        return ppn_op_attn_batch_tc(G, S, r->out, PPN_DTYPE_BF16, r->q, a->nq, a->nkv, a->hd, scale, &r->pool, r->segs,
                                    r->segs_h, r->tb, r->nt, r->B, r->part, r->ns);
    return ppn_op_attn_batch_to(G, S, r->out, PPN_DTYPE_BF16, r->q, a->nq, a->nkv, a->hd, scale, &r->pool, r->segs,
                                r->segs_h, r->tb, r->nt, r->B, r->part, r->ns);
}

static void test_gpu_rows_attn_tc(void **state)
{
    (void)state;
    static const ashape shapes[] = {{"llama-8b", 32, 8, 128}, {"llama-1b", 32, 8, 64}, {"g8", 16, 2, 128}, {"g1", 8, 8, 64}};
    for (size_t k = 0; k < TU_LEN(shapes); k++) {
        tc_case(&shapes[k], 4, 17, 1);
        tc_case(&shapes[k], 4, 17, 8);
        tc_case(&shapes[k], 0, 3, 3);
        tc_case(&shapes[k], 6, 64, 2);
    }
    /* timing: each position's context as the bench's (prompt 128, then decoding: positions 128 .. 191) and long */
    int sms = G->ops->sm_count(G, S);
    printf("  batched decode attention, bf16 cache in blocks of 16, bf16 out; %d SMs; us a launch on the device (10 "
           "launches in a graph, median of 15 replays):\n", sms);
    printf("  %-9s %3s %5s | %-22s | %s\n", "model", "B", "pos", "per row (splits)",
           "tensor cores: splits 1 / 2 / 3 / 4 / the rule");
    static const int Bs[] = {16, 64};
    static const int ctxs[] = {160, 1000};
    for (size_t k = 0; k < 2; k++)
        for (size_t bi = 0; bi < TU_LEN(Bs); bi++)
            for (size_t ci = 0; ci < TU_LEN(ctxs); ci++) {
                const ashape *a = &shapes[k];
                const int B = Bs[bi], L = 4, maxpos = ctxs[ci] + 32;
                int per = (maxpos + 15) >> 4;
                pgv pg = pgv_new(L, B * (per << L));
                size_t row = (size_t)(a->nq + 2 * a->nkv) * a->hd, pb = (size_t)a->nkv * pg.cap * a->hd * 2;
                void *pk = tu_wrand(PPN_DTYPE_BF16, pb / 2, NULL);
                float *qkv = tu_frand((size_t)B * row, -3, 3);
                ppn_kseg *segs = hmem((size_t)B * sizeof(ppn_kseg));
                const int32_t **tb = hmem((size_t)B * sizeof(int32_t *));
                int *nt = hmem((size_t)B * sizeof(int));
                ppn_dptr dtbl = up(pg.tbl, (size_t)pg.n_tbl * 4);
                for (int i = 0; i < B; i++) {
                    segs[i] = (ppn_kseg){.pos = ctxs[ci] + (i * 7) % 32, .tbl = dtbl + (size_t)i * per * 4};
                    tb[i] = pg.tbl + (size_t)i * per, nt[i] = per;
                }
                int model_split = ppn_op_attn_split(a->nkv, sms);
                size_t partb = ppn_op_attn_batch_scratch_bytes(B, a->nq, model_split, a->hd);
                tcrun r = {.a = a, .pool = {.k = up(pk, pb), .v = up(pk, pb), .cap = pg.cap, .block_log2 = L,
                                            .kvdt = PPN_DTYPE_BF16},
                           .out = dalloc((size_t)B * a->nq * a->hd * 2), .q = up(qkv, (size_t)B * row * 4),
                           .segs = up(segs, (size_t)B * sizeof(ppn_kseg)), .part = dalloc(partb), .segs_h = segs,
                           .tb = tb, .nt = nt, .B = B};
                OK(G->ops->memset_d8(G, S, r.part, 0, partb));
                /* the forward's rules (core/forward.c batch_attention) */
                int one = sms / (B * a->nkv), three = 3 * sms / (B * a->nkv);
                r.ns = one > 1 ? (one < model_split ? one : model_split) : 1;
                double base = time_graph_us(tc_launch, &r);
                printf("  %-9s %3d %5d | %14.2f (%2d) | ", a->name, B, ctxs[ci], base, r.ns);
                r.tc = 1;
                for (int ns = 1; ns <= 4; ns++) {
                    r.ns = ns;
                    printf("%6.2f ", time_graph_us(tc_launch, &r));
                }
                r.ns = three > 1 ? (three < model_split ? three : model_split) : 1;
                printf("/ %6.2f (%d)\n", time_graph_us(tc_launch, &r), r.ns);
                free(pk), free(qkv), free(segs), free(tb), free(nt), free(pg.tbl);
                dfree_all();
            }
}

/* The batched argmax (ppn_op_argmax_rows) against its CPU reference, row by row: random rows, ties (the lower index
 * wins), the winner first or last, a NaN, +Inf or -Inf among numbers (-1), every value NaN, on the 16-byte-load
 * path (n % 4 == 0, x aligned: the vocabularies of llama 3 and the fixtures) and the 4-byte one (n odd, or x off by
 * one float); then each timed on 64 rows of 128256 (the 8B's B=64 greedy step). */
typedef struct argmax_run {
    ppn_dptr out, x;
    int n, rows;
} argmax_run;

static ppn_status argmax_launch(void *arg)
{
    argmax_run *r = arg;
    return ppn_op_argmax_rows(G, S, r->out, r->x, r->n, r->rows);
}

static void test_gpu_rows_argmax(void **state)
{
    (void)state;
    enum { ROWS = 64 };
    static const struct { int n, off, vec; } cs[] = {{128256, 0, 1}, {1000, 0, 1}, {1001, 0, 0}, {128256, 1, 0},
                                                     {4, 0, 1}, {3, 0, 0}};
    for (size_t k = 0; k < TU_LEN(cs); k++) {
        int n = cs[k].n, off = cs[k].off;
        size_t xn = (size_t)ROWS * (size_t)n;
        float *x = tu_frand(xn + (size_t)off, -8, 8), *xr = x + off;
        int32_t got[ROWS], want[ROWS];
        /* row 0: a tie at the front and the back; 1: the first wins; 2: the last wins; 3: a NaN; 4: +Inf; 5: -Inf;
         * 6: every value NaN; the rest random (ties unlikely) */
        float *r0 = xr;
        r0[n / 3] = 50.0f, r0[n - 1 - n / 5] = 50.0f;
        xr[1 * (size_t)n] = 60.0f;
        xr[2 * (size_t)n + (size_t)n - 1] = 70.0f;
        xr[3 * (size_t)n + (size_t)n / 2] = NAN;
        xr[4 * (size_t)n + (size_t)n / 2] = INFINITY;
        xr[5 * (size_t)n] = -INFINITY;
        for (int i = 0; i < n; i++) xr[6 * (size_t)n + (size_t)i] = NAN;
        ppn_kp_argmax_rows p = {.out = (uint64_t)(uintptr_t)want, .x = (uint64_t)(uintptr_t)xr, .n = n, .rows = ROWS};
        tu_kernel_run(PPN_K_ARGMAX_ROWS, &p);
        ppn_dptr dx = up(x, (xn + (size_t)off) * 4), dout = dalloc(sizeof got);
        argmax_run r = {.out = dout, .x = dx + (ppn_dptr)off * 4u, .n = n, .rows = ROWS};
        OK(argmax_launch(&r));
        get(got, dout, sizeof got);
        int bad = 0;
        for (int i = 0; i < ROWS; i++)
            if (got[i] != want[i]) {
                if (!bad) printf("  argmax n=%d row %d: device %d, reference %d\n", n, i, got[i], want[i]);
                bad++;
            }
        if (n >= 5) {
            assert_int_equal(want[0], n / 3);
            assert_int_equal(want[1], 0);
            assert_int_equal(want[2], n - 1);
            for (int i = 3; i < 7; i++) assert_int_equal(want[i], -1);
        }
        double us = 1e3 * time_ms(argmax_launch, &r);
        printf("  argmax rows %d x %-6d %s: %s, %.2f us a launch\n", ROWS, n, cs[k].vec ? "16-byte loads" : "4-byte loads ",
               bad ? "DIFFERENT" : "every row the reference's", us);
        free(x);
        dfree_all();
        if (bad) fail_msg("argmax rows n=%d: %d of %d rows differ from the reference", n, bad, ROWS);
    }
}

static void test_gpu_rows_paged(void **state)
{
    (void)state;
    static const ashape shapes[] = {{"llama-8b", 32, 8, 128}, {"llama-1b", 32, 8, 64}, {"odd", 8, 1, 72}};
    static const int dts[] = {PPN_DTYPE_BF16, PPN_DTYPE_F16, PPN_DTYPE_F32};
    static const int Ls[] = {0, 4, 6};
    for (size_t k = 0; k < TU_LEN(shapes); k++)
        for (size_t d = 0; d < TU_LEN(dts); d++)
            for (size_t l = 0; l < TU_LEN(Ls); l++) {
                paged_case(&shapes[k], 77, 130, dts[d], Ls[l]);
                if (l == 1) paged_case(&shapes[k], 5, 0, dts[d], Ls[l]);
            }
    for (size_t k = 0; k < TU_LEN(shapes); k++) {
        batch_case(&shapes[k], PPN_DTYPE_BF16, 4, 1);
        batch_case(&shapes[k], PPN_DTYPE_BF16, 4, 17);
        batch_case(&shapes[k], PPN_DTYPE_F32, 0, 3);
        batch_case(&shapes[k], PPN_DTYPE_F16, 6, 5);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_rows_ops),
        cmocka_unit_test(test_gpu_rows_attn_models),
        cmocka_unit_test(test_gpu_rows_attn_fixtures),
        cmocka_unit_test(test_gpu_rows_attn_timing),
        cmocka_unit_test(test_gpu_rows_paged),
        cmocka_unit_test(test_gpu_rows_argmax),
        cmocka_unit_test(test_gpu_rows_attn_tc),
    };
    const char *f = getenv("PPN_GPU_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
    return cmocka_run_group_tests(tests, setup, teardown);
}
