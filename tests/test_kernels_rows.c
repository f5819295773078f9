/* test_kernels_rows.c - the many-rows kernels (prefill chunks; kernels/rows_cpu.c, kernels/ops_rows.c): every
 * row op against the single-token decode reference applied row by row, and a whole chunked prefill (rope + KV
 * store of the rows, then causal attention, in two chunks) against token-by-token decode: the same bits. Then
 * attention against a naive double-precision softmax written here (1e-5 relative), the ops' declared accesses
 * and geometry through the fake device, their refusals, and a chunk on the sim backend (whose checker holds
 * every access to the declared bytes of exactly sized buffers).
 *
 * Tolerances: the row references ARE the decode references run per row, so everything but the naive check is
 * compared bit for bit. The naive attention sums in double and the references round the output to f32 once:
 * 1e-5 relative to the largest |v| is ample.
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
#include "tests/util/tcheck.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

static void *zmem(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void *dup_mem(const void *src, size_t bytes)
{
    void *p = zmem(bytes);
    memcpy(p, src, bytes);
    return p;
}

static void inv_freq_fill(float *inv, int hd)
{
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
}

/* ---------------------------------------------------------------------------------------------------------
 * row ops against the decode references, row by row */

static void test_embed_rows_reference(void **state)
{
    (void)state;
    const int vocab = 37, dim = 24, c = 6;
    int32_t tok[6] = {0, 36, 5, -1, 37, 5};
    for (int dt = PPN_DTYPE_F32; dt <= PPN_DTYPE_F16; dt++) {
        void *table = tu_wrand(dt, (size_t)vocab * dim, NULL);
        float *out = zmem((size_t)c * dim * 4), want[24];
        ppn_kp_embed_rows p = {.out = D(out), .table = D(table), .tok = D(tok), .dim = dim, .vocab = vocab,
                               .wdt = dt, .c = c};
        tu_kernel_run(PPN_K_EMBED_ROWS, &p);
        for (int i = 0; i < c; i++) {
            if (tok[i] < 0 || tok[i] >= vocab) {
                for (int d = 0; d < dim; d++) assert_true(out[i * dim + d] == 0.0f && !signbit(out[i * dim + d]));
                continue;
            }
            ppn_step_hdr hdr = {.token = tok[i]};
            ppn_kp_embed e = {.out = D(want), .table = D(table), .hdr = D(&hdr), .dim = dim, .vocab = vocab, .wdt = dt};
            tu_kernel_run(PPN_K_EMBED, &e);
            assert_memory_equal(out + i * dim, want, sizeof want);
        }
        free(table), free(out);
    }
}

static void test_rmsnorm_rows_reference(void **state)
{
    (void)state;
    const int n = 67, c = 5;
    for (int dt = PPN_DTYPE_F32; dt <= PPN_DTYPE_F16; dt++) {
        void *w = tu_wrand(dt, (size_t)n, NULL);
        float *in = tu_frand((size_t)c * n, -3, 3), *out = zmem((size_t)c * n * 4), *alias = dup_mem(in, (size_t)c * n * 4);
        ppn_kp_rmsnorm_rows p = {.out = D(out), .in = D(in), .w = D(w), .n = n, .wdt = dt, .c = c, .eps = 1e-5f};
        tu_kernel_run(PPN_K_RMSNORM_ROWS, &p);
        p.out = p.in = D(alias); /* in place */
        tu_kernel_run(PPN_K_RMSNORM_ROWS, &p);
        assert_memory_equal(alias, out, (size_t)c * n * 4);
        for (int i = 0; i < c; i++) {
            float want[67];
            ppn_kp_rmsnorm r = {.out = D(want), .in = D(in + i * n), .w = D(w), .n = n, .wdt = dt, .eps = 1e-5f};
            tu_kernel_run(PPN_K_RMSNORM, &r);
            assert_memory_equal(out + i * n, want, sizeof want);
        }
        free(w), free(in), free(out), free(alias);
    }
}

/* Heads h0 .. h0 + nh - 1 of each row normed as head_rmsnorm norms them; the rest of each row untouched. */
static void test_head_rmsnorm_rows_reference(void **state)
{
    (void)state;
    const int hd = 16, stride = 7 * hd + 3, h0 = 2, nh = 3, c = 4;
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)hd, NULL);
    float *x = tu_frand((size_t)c * stride, -2, 2), *x0 = dup_mem(x, (size_t)c * stride * 4);
    ppn_kp_head_rmsnorm_rows p = {.x = D(x), .w = D(w), .stride = stride, .h0 = h0, .n_heads = nh, .head_dim = hd,
                                  .wdt = PPN_DTYPE_BF16, .c = c, .eps = 1e-6f};
    tu_kernel_run(PPN_K_HEAD_RMSNORM_ROWS, &p);
    for (int i = 0; i < c; i++) {
        float *want = dup_mem(x0 + i * stride, (size_t)stride * 4);
        ppn_kp_head_rmsnorm h = {.x = D(want + h0 * hd), .w = D(w), .n_heads = nh, .head_dim = hd,
                                 .wdt = PPN_DTYPE_BF16, .eps = 1e-6f};
        tu_kernel_run(PPN_K_HEAD_RMSNORM, &h);
        assert_memory_equal(x + i * stride, want, (size_t)stride * 4);
        free(want);
    }
    free(w), free(x), free(x0);
}

static void test_swiglu_rows_reference(void **state)
{
    (void)state;
    const int n = 45, c = 3;
    float *gu = tu_frand((size_t)c * 2 * n, -6, 6), *out = zmem((size_t)c * n * 4), want[45];
    ppn_kp_swiglu_rows p = {.out = D(out), .gu = D(gu), .n = n, .c = c};
    tu_kernel_run(PPN_K_SWIGLU_ROWS, &p);
    for (int i = 0; i < c; i++) {
        ppn_kp_swiglu s = {.out = D(want), .gate = D(gu + i * 2 * n), .up = D(gu + i * 2 * n + n), .n = n};
        tu_kernel_run(PPN_K_SWIGLU, &s);
        assert_memory_equal(out + i * n, want, sizeof want);
    }
    free(gu), free(out);
}

/* ---------------------------------------------------------------------------------------------------------
 * a chunked prefill against token-by-token decode */

typedef struct shape {
    int nq, nkv, hd, interleaved, kvdt, ctx;
} shape;

static size_t row_floats(const shape *s) { return (size_t)(s->nq + 2 * s->nkv) * s->hd; }
static size_t cache_bytes(const shape *s) { return ppn_op_kv_cache_bytes(s->nkv, s->hd, s->ctx, s->kvdt); }

/* Decode: token t's row of qkv through rope with caches (hdr pos t) and attention at t. qkv rows are rotated in
 * place; out [n, nq hd]. */
static void decode_tokens(const shape *s, float *qkv, int n, const float *inv, void *kc, void *vc, float *out)
{
    size_t hd = (size_t)s->hd, row = row_floats(s);
    float scale = 1.0f / sqrtf((float)s->hd);
    for (int t = 0; t < n; t++) {
        ppn_step_hdr hdr = {.pos = t};
        float *x = qkv + t * row;
        ppn_kp_rope r = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .kc = D(kc), .vc = D(vc),
                         .v = D(x + (size_t)(s->nq + s->nkv) * hd), .n_heads = s->nq + s->nkv, .head_dim = s->hd,
                         .interleaved = s->interleaved, .n_kv = s->nkv, .cap = s->ctx, .kvdt = s->kvdt};
        tu_kernel_run(PPN_K_ROPE, &r);
        ppn_kp_attn a = {.out = D(out + t * s->nq * hd), .q = D(x), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr),
                         .n_heads = s->nq, .n_kv = s->nkv, .head_dim = s->hd, .cap = s->ctx, .n_split = 1,
                         .kvdt = s->kvdt, .scale = scale};
        tu_kernel_run(PPN_K_ATTN, &a);
    }
}

/* Prefill: chunks of the given sizes through the ops (the fake device runs the references). */
static void prefill_chunks(const shape *s, float *qkv, const int *chunks, int nchunks, const float *inv, void *kc,
                           void *vc, float *out)
{
    size_t row = row_floats(s);
    float scale = 1.0f / sqrtf((float)s->hd);
    int pos0 = 0;
    for (int k = 0; k < nchunks; k++) {
        int c = chunks[k];
        float *x = qkv + pos0 * row, *o = out + (size_t)pos0 * s->nq * s->hd;
        EXPECT_ST(PPN_OK, tu_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(x), s->nq, s->nkv, s->hd, D(inv),
                                              s->interleaved, D(kc), D(vc), s->ctx, s->kvdt, pos0, c));
        EXPECT_ST(PPN_OK, tu_op_attn_rows(&tu_fake, tu_fake_stream, D(o), D(x), D(kc), D(vc), s->nq, s->nkv, s->hd,
                                           s->ctx, s->kvdt, scale, pos0, c));
        pos0 += c;
    }
}

/* out[t, h] by its definition in double, from the caches as stored. */
static void naive_attn(const shape *s, const float *qkv, int n, const void *kc, const void *vc, const float *out)
{
    size_t hd = (size_t)s->hd, row = row_floats(s);
    int group = s->nq / s->nkv;
    double scale = 1.0f / sqrtf((float)s->hd);
    double *w = zmem(sizeof(double) * (size_t)n);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < s->nq; h++) {
            const float *q = qkv + t * row + h * hd;
            size_t base = (size_t)(h / group) * (size_t)s->ctx * hd;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (size_t i = 0; i < hd; i++) d += (double)q[i] * tu_wval(kc, s->kvdt, base + j * hd + i);
                w[j] = d * scale;
                if (w[j] > mx) mx = w[j];
            }
            for (int j = 0; j <= t; j++) sum += (w[j] = exp(w[j] - mx));
            for (size_t i = 0; i < hd; i++) {
                double o = 0;
                for (int j = 0; j <= t; j++) o += w[j] * tu_wval(vc, s->kvdt, base + j * hd + i);
                tu_check_close(out[(t * s->nq + h) * hd + i], o / sum, 1e-5, "attn_rows vs naive",
                               (t * s->nq + h) * hd + i);
            }
        }
    free(w);
}

static void chunked_case(const shape *s, const int *chunks, int nchunks)
{
    int n = 0;
    for (int k = 0; k < nchunks; k++) n += chunks[k];
    size_t row = row_floats(s), cb = cache_bytes(s), ob = (size_t)n * s->nq * s->hd * 4;
    float inv[128], *qkv = tu_frand((size_t)n * row, -1, 1), *qkv2 = dup_mem(qkv, (size_t)n * row * 4);
    inv_freq_fill(inv, s->hd);
    void *kc = zmem(cb), *vc = zmem(cb), *kc2 = zmem(cb), *vc2 = zmem(cb);
    float *out = zmem(ob), *out2 = zmem(ob);
    decode_tokens(s, qkv, n, inv, kc, vc, out);
    prefill_chunks(s, qkv2, chunks, nchunks, inv, kc2, vc2, out2);
    assert_memory_equal(qkv, qkv2, (size_t)n * row * 4); /* the rotated q and k, v untouched */
    assert_memory_equal(kc, kc2, cb);
    assert_memory_equal(vc, vc2, cb);
    assert_memory_equal(out, out2, ob);
    naive_attn(s, qkv2, n, kc2, vc2, out2);
    free(qkv), free(qkv2), free(kc), free(vc), free(kc2), free(vc2), free(out), free(out2);
}

/* Both rotary conventions, the fixture head_dims (32, 48 with interleaved pairs, 64), GQA groups 1, 2 and 4, every
 * cache dtype; one chunk, two chunks (the second after the first), and one-row chunks. */
static void test_rows_prefill_equals_decode(void **state)
{
    (void)state;
    static const shape shapes[] = {
        {4, 2, 16, 0, PPN_DTYPE_F32, 24}, {4, 2, 16, 1, PPN_DTYPE_F32, 24}, {8, 4, 48, 1, PPN_DTYPE_F32, 20},
        {4, 1, 32, 0, PPN_DTYPE_BF16, 20}, {2, 2, 64, 0, PPN_DTYPE_F16, 17}, {8, 2, 64, 0, PPN_DTYPE_BF16, 19},
    };
    static const int one[] = {13}, two[] = {5, 9}, ones[] = {1, 1, 1, 4}, three[] = {3, 1, 12};
    for (size_t k = 0; k < TU_LEN(shapes); k++) {
        chunked_case(&shapes[k], one, 1);
        chunked_case(&shapes[k], two, 2);
        chunked_case(&shapes[k], ones, 4);
        chunked_case(&shapes[k], three, 3);
    }
}

/* The row references are the decode ones run per row, so attention's bits are ppn_cpu_attn's at each position;
 * here with the caches filled directly (no rope), pos0 > 0 and every dtype. */
static void test_attn_rows_reference_per_position(void **state)
{
    (void)state;
    for (int kvdt = PPN_DTYPE_F32; kvdt <= PPN_DTYPE_F16; kvdt++) {
        const int nq = 6, nkv = 2, hd = 40, ctx = 30, pos0 = 11, c = 9;
        size_t row = (size_t)(nq + 2 * nkv) * hd;
        void *kc = tu_wrand(kvdt, (size_t)nkv * ctx * hd, NULL), *vc = tu_wrand(kvdt, (size_t)nkv * ctx * hd, NULL);
        float *qkv = tu_frand((size_t)c * row, -2, 2), *out = zmem((size_t)c * nq * hd * 4), want[6 * 40];
        ppn_kp_attn_rows p = {.out = D(out), .qkv = D(qkv), .kc = D(kc), .vc = D(vc), .n_heads = nq, .n_kv = nkv,
                              .head_dim = hd, .cap = ctx, .kvdt = kvdt, .pos0 = pos0, .c = c, .scale = 0.3f};
        tu_kernel_run(kvdt == PPN_DTYPE_F32 ? PPN_K_ATTN_ROWS : kvdt == PPN_DTYPE_BF16 ? PPN_K_ATTN_ROWS_BF16
                                                                                     : PPN_K_ATTN_ROWS_F16, &p);
        for (int i = 0; i < c; i++) {
            ppn_step_hdr hdr = {.pos = pos0 + i};
            ppn_kp_attn a = {.out = D(want), .q = D(qkv + i * row), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr),
                             .n_heads = nq, .n_kv = nkv, .head_dim = hd, .cap = ctx, .n_split = 7, .kvdt = kvdt,
                             .scale = 0.3f};
            tu_kernel_run(PPN_K_ATTN, &a);
            for (int k = 0; k < nq * hd; k++)
                tu_check_close(out[i * nq * hd + k], want[k], 1e-5 * fmax(1.0, fabs(want[k])), "attn_rows", (size_t)k);
        }
        free(kc), free(vc), free(qkv), free(out);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the ops: declared accesses, geometry, refusals */

static void test_rows_ops_accesses(void **state)
{
    (void)state;
    const int c = 3, dim = 40, vocab = 9;
    float *table = tu_frand((size_t)vocab * dim, -1, 1), *out = zmem((size_t)c * dim * 4);
    int32_t tok[3] = {1, 2, 8};
    tu_cap.calls = 0;
    EXPECT_ST(PPN_OK, ppn_op_embed_rows(&tu_fake, tu_fake_stream, D(out), D(table), PPN_DTYPE_F32, vocab, dim, D(tok), c));
    tu_expect_acc(0, table, (size_t)vocab * dim * 4, PPN_ACC_R);
    tu_expect_acc(1, tok, sizeof tok, PPN_ACC_R);
    tu_expect_acc(2, out, (size_t)c * dim * 4, PPN_ACC_W);
    assert_int_equal(tu_cap.l.grid[0], c);
    assert_true(tu_cap.l.grid[1] * tu_cap.l.block[0] >= (unsigned)dim);
    for (int d = 0; d < dim; d++) assert_true(out[2 * dim + d] == table[8 * dim + d]);

    /* rope rows: qkv read-write; the caches from head 0's row pos0 to the last head's row pos0 + c - 1 */
    const int nq = 4, nkv = 2, hd = 8, ctx = 16, pos0 = 5;
    size_t row = (size_t)(nq + 2 * nkv) * hd, es = 2;
    float inv[4], *qkv = tu_frand((size_t)c * row, -1, 1);
    inv_freq_fill(inv, hd);
    uint16_t *kc = zmem((size_t)nkv * ctx * hd * es), *vc = zmem((size_t)nkv * ctx * hd * es);
    EXPECT_ST(PPN_OK, tu_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(qkv), nq, nkv, hd, D(inv), 0, D(kc), D(vc), ctx,
                                          PPN_DTYPE_BF16, pos0, c));
    size_t first = (size_t)pos0 * hd, span = ((size_t)(nkv - 1) * ctx + pos0 + c) * hd - first;
    tu_expect_acc(0, qkv, (size_t)c * row * 4, PPN_ACC_RW);
    tu_expect_acc(1, inv, sizeof inv, PPN_ACC_R);
    tu_expect_acc(2, kc + first, span * es, PPN_ACC_W);
    tu_expect_acc(3, vc + first, span * es, PPN_ACC_W);
    assert_int_equal(tu_cap.l.grid[0], c);
    assert_int_equal(tu_cap.l.grid[1], 1);
    assert_int_equal(tu_cap.l.block[0] % (hd / 2), 0); /* each thread keeps one pair (and its angle) */
    /* attention: q of every row, the caches' positions 0 .. pos0 + c - 1, out */
    float *ao = zmem((size_t)c * nq * hd * 4);
    EXPECT_ST(PPN_OK, tu_op_attn_rows(&tu_fake, tu_fake_stream, D(ao), D(qkv), D(kc), D(vc), nq, nkv, hd, ctx,
                                       PPN_DTYPE_BF16, 0.5f, pos0, c));
    tu_expect_acc(0, qkv, ((c - 1) * row + (size_t)nq * hd) * 4, PPN_ACC_R);
    tu_expect_acc(1, ao, (size_t)c * nq * hd * 4, PPN_ACC_W);
    tu_expect_acc(2, kc, (first + span) * es, PPN_ACC_R);
    tu_expect_acc(3, vc, (first + span) * es, PPN_ACC_R);
    assert_true(tu_cap.l.block[0] % 32 == 0 && tu_cap.l.block[0] <= 1024);
    assert_true(tu_cap.l.smem <= PPN_DYN_SMEM_MAX);
    /* head norms: the span from the first normed head of row 0 to the last of row c - 1 */
    float w[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    EXPECT_ST(PPN_OK, ppn_op_head_rmsnorm_rows(&tu_fake, tu_fake_stream, D(qkv), (int)row, nq, nkv, hd, D(w),
                                               PPN_DTYPE_F32, 1e-6f, c));
    tu_expect_acc(0, qkv + nq * hd, ((c - 1) * row + (size_t)nkv * hd) * 4, PPN_ACC_RW);
    tu_expect_acc(1, w, sizeof w, PPN_ACC_R);
    assert_true(tu_cap.l.grid[0] * tu_cap.l.block[0] / 32 >= (unsigned)(c * nkv));
    /* rmsnorm and swiglu rows */
    float *gu = tu_frand((size_t)c * 2 * dim, -1, 1);
    EXPECT_ST(PPN_OK, ppn_op_rmsnorm_rows(&tu_fake, tu_fake_stream, D(out), D(out), D(table), PPN_DTYPE_F32, dim,
                                          1e-5f, c));
    tu_expect_acc(0, out, (size_t)c * dim * 4, PPN_ACC_R);
    tu_expect_acc(1, table, (size_t)dim * 4, PPN_ACC_R);
    tu_expect_acc(2, out, (size_t)c * dim * 4, PPN_ACC_W);
    assert_int_equal(tu_cap.l.grid[0], c);
    EXPECT_ST(PPN_OK, ppn_op_swiglu_rows(&tu_fake, tu_fake_stream, D(out), D(gu), dim, c));
    tu_expect_acc(0, gu, (size_t)c * 2 * dim * 4, PPN_ACC_R);
    tu_expect_acc(1, out, (size_t)c * dim * 4, PPN_ACC_W);
    /* four columns a thread where n % 4 == 0 and the rows are 16-byte aligned, else one */
    static const struct { int n, off, vec; } sw[] = {{256, 0, 1}, {1028, 0, 1}, {258, 0, 0}, {256, 4, 0}};
    tu_cap.dry = 1;
    for (size_t k = 0; k < sizeof sw / sizeof sw[0]; k++) {
        const ppn_kp_swiglu_rows *q = (const ppn_kp_swiglu_rows *)tu_cap.params;
        EXPECT_ST(PPN_OK, ppn_op_swiglu_rows(&tu_fake, tu_fake_stream, ((ppn_dptr)1 << 30) + (ppn_dptr)sw[k].off,
                                             (ppn_dptr)2 << 30, sw[k].n, 3));
        assert_int_equal(q->vec, sw[k].vec);
        assert_int_equal(tu_cap.l.grid[1], (unsigned)((sw[k].vec ? sw[k].n / 4 : sw[k].n) + 255) / 256);
        assert_int_equal(tu_cap.l.grid[0], 3);
    }
    /* argmax rows: 16-byte loads where n % 4 == 0 and x is 16-byte aligned, else 4-byte ones; one block a row,
     * x read and the ids written, declared */
    static const struct { int n, off, vec; } am[] = {{128256, 0, 1}, {1000, 0, 1}, {1001, 0, 0}, {1000, 8, 0}};
    for (size_t k = 0; k < sizeof am / sizeof am[0]; k++) {
        const ppn_kp_argmax_rows *q = (const ppn_kp_argmax_rows *)tu_cap.params;
        ppn_dptr xa = ((ppn_dptr)3 << 30) + (ppn_dptr)am[k].off, oa = (ppn_dptr)4 << 30;
        EXPECT_ST(PPN_OK, ppn_op_argmax_rows(&tu_fake, tu_fake_stream, oa, xa, am[k].n, 5));
        assert_int_equal(tu_cap.l.kernel, PPN_K_ARGMAX_ROWS);
        assert_int_equal(q->vec, am[k].vec);
        assert_int_equal(tu_cap.l.grid[0], 5);
        assert_int_equal(tu_cap.l.block[0], PPN_ARGMAX_ROWS_THREADS);
        assert_true(tu_cap.l.acc[0].ptr == xa && tu_cap.l.acc[0].bytes == (size_t)5 * (size_t)am[k].n * 4u);
        assert_true(tu_cap.l.acc[1].ptr == oa && tu_cap.l.acc[1].bytes == 5u * 4u);
    }
    tu_cap.dry = 0;
    free(table), free(out), free(qkv), free(kc), free(vc), free(ao), free(gu);
}

/* The attention launch for the model shapes: which kernel (by cache dtype) and shared memory within the opt-in. */
static void test_attn_rows_op_geometry(void **state)
{
    (void)state;
    static const struct { int nq, nkv, hd, kvdt, kernel; } cases[] = {
        {32, 8, 64, PPN_DTYPE_BF16, PPN_K_ATTN_ROWS_BF16}, {32, 8, 128, PPN_DTYPE_BF16, PPN_K_ATTN_ROWS_BF16},
        {32, 8, 128, PPN_DTYPE_F16, PPN_K_ATTN_ROWS_F16},  {32, 8, 128, PPN_DTYPE_F32, PPN_K_ATTN_ROWS},
        {8, 4, 48, PPN_DTYPE_BF16, PPN_K_ATTN_ROWS_BF16},  {16, 16, 256, PPN_DTYPE_F32, PPN_K_ATTN_ROWS},
        {40, 8, 128, PPN_DTYPE_BF16, PPN_K_ATTN_ROWS_BF16}, {28, 4, 128, PPN_DTYPE_F16, PPN_K_ATTN_ROWS_F16},
    };
    tu_cap.dry = 1;
    for (size_t k = 0; k < TU_LEN(cases); k++) {
        const int c = 4096, ctx = 8192;
        EXPECT_ST(PPN_OK, tu_op_attn_rows(&tu_fake, tu_fake_stream, 1u << 30, 1u << 20, 2u << 30, 3u << 30,
                                           cases[k].nq, cases[k].nkv, cases[k].hd, ctx, cases[k].kvdt, 0.1f, 17, c));
        assert_int_equal(tu_cap.l.kernel, cases[k].kernel);
        assert_true(tu_cap.l.smem <= PPN_DYN_SMEM_MAX);
        assert_true(tu_cap.l.block[0] == 128 && tu_cap.l.block[1] == 1);
        int group = cases[k].nq / cases[k].nkv, tc = cases[k].kvdt != PPN_DTYPE_F32 && (cases[k].hd == 64 || cases[k].hd == 128);
        if (tc) { /* (KV head x sub-group of gb heads, tiles of 64 / gb positions), 64 KB at most of k, v stages */
            int gb = group % 4 ? group % 2 ? 1 : 2 : 4; /* these groups: 4, 5, 7 */
            assert_int_equal(tu_cap.l.grid[0], cases[k].nkv * (group / gb));
            assert_int_equal(tu_cap.l.grid[1], (c + 64 / gb - 1) / (64 / gb));
            assert_int_equal(tu_cap.l.smem, 512 * cases[k].hd);
        } else {
            assert_int_equal(tu_cap.l.grid[0], c);
            assert_int_equal(tu_cap.l.grid[1], cases[k].nkv);
        }
    }
    /* the SIMT path takes any alignment */
    EXPECT_ST(PPN_OK, tu_op_attn_rows(&tu_fake, tu_fake_stream, 1u << 30, 1u << 20, (2u << 30) + 2, 3u << 30, 8, 4, 48,
                                       64, PPN_DTYPE_BF16, 0.1f, 0, 9));
    tu_cap.dry = 0;
}

static void test_rows_ops_refusals(void **state)
{
    (void)state;
    ppn_gpu *g = &tu_fake;
    ppn_gstream *s = tu_fake_stream;
    const uint64_t a = 1u << 20, b = 1u << 24, k = 1u << 26, v = 1u << 28; /* never touched: refused first */
    EXPECT_ST(PPN_EINVAL, ppn_op_embed_rows(g, s, a, b, PPN_DTYPE_F32, 10, 8, k, 0));
    MSG_HAS("c (rows)");
    EXPECT_ST(PPN_EINVAL, ppn_op_embed_rows(g, s, a, b, 7, 10, 8, k, 2));
    EXPECT_ST(PPN_EINVAL, ppn_op_embed_rows(g, s, a, b, PPN_DTYPE_F32, 10, 8, 0, 2));
    MSG_HAS("tok");
    EXPECT_ST(PPN_EINVAL, ppn_op_rmsnorm_rows(g, s, a, b, k, PPN_DTYPE_F32, 8, 1e-5f, -1));
    EXPECT_ST(PPN_EINVAL, ppn_op_rmsnorm_rows(g, s, a + 4, a, k, PPN_DTYPE_F32, 8, 1e-5f, 2)); /* partial overlap */
    MSG_HAS("overlaps");
    EXPECT_ST(PPN_EINVAL, ppn_op_head_rmsnorm_rows(g, s, a, 64, 3, 2, 16, k, PPN_DTYPE_F32, 1e-6f, 4));
    MSG_HAS("stride 64");
    EXPECT_ST(PPN_EINVAL, ppn_op_head_rmsnorm_rows(g, s, a, 64, 0, 4, 16, k, PPN_DTYPE_F32, 1e-6f, 0));
    /* rope: the span, the head_dim */
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 16, b, 0, k, v, 32, PPN_DTYPE_F32, 30, 3));
    MSG_HAS("the 32 positions");
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 16, b, 0, k, v, 32, PPN_DTYPE_F32, -1, 3));
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 16, b, 0, k, v, 32, PPN_DTYPE_F32, 0, 0));
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 15, b, 0, k, v, 32, PPN_DTYPE_F32, 0, 3));
    MSG_HAS("got 15");
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 16, 0, 0, k, v, 32, PPN_DTYPE_F32, 0, 3));
    MSG_HAS("inv_freq");
    EXPECT_ST(PPN_EINVAL, tu_op_rope_kv_rows(g, s, a, 4, 2, 16, b, 0, k, v, 32, 9, 0, 3));
    /* attention */
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 4, 2, 16, 32, PPN_DTYPE_F32, 0.25f, 31, 2));
    MSG_HAS("do not fit");
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 4, 2, 16, 32, PPN_DTYPE_F32, 0.25f, 0, 0));
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 6, 4, 16, 32, PPN_DTYPE_F32, 0.25f, 0, 2));
    MSG_HAS("multiple of n_kv");
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 4, 2, 258, 32, PPN_DTYPE_F32, 0.25f, 0, 2));
    MSG_HAS("got 258");
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 4, 2, 17, 32, PPN_DTYPE_BF16, 0.25f, 0, 2));
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, a + 64, k, v, 4, 2, 16, 32, PPN_DTYPE_F32, 0.25f, 0, 2));
    MSG_HAS("overlaps");
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k, v, 4, 2, 16, 32, 5, 0.25f, 0, 2));
    EXPECT_ST(PPN_EINVAL, tu_op_attn_rows(g, s, a, b, k + 8, v, 4, 2, 64, 32, PPN_DTYPE_BF16, 0.25f, 0, 2));
    MSG_HAS("16-byte aligned");
    /* swiglu: separate buffers */
    EXPECT_ST(PPN_EINVAL, ppn_op_swiglu_rows(g, s, a, a, 8, 2));
    MSG_HAS("overlaps");
    EXPECT_ST(PPN_EINVAL, ppn_op_swiglu_rows(g, s, a, b, 0, 2));
}

/* The last launch's bf16 out h of c rows of n: declared as its one write of c n 2 bytes, and each element the f32
 * op's f rounded to nearest even at PPN_X16_POS. */
static void expect_bf16_rows(const uint16_t *h, const float *f, int c, int n, const char *what)
{
    int outs = 0;
    for (int k = 0; k < tu_cap.l.nacc; k++)
        if (tu_cap.l.acc[k].mode == PPN_ACC_W) {
            assert_true(tu_cap.l.acc[k].ptr == D(h) && tu_cap.l.acc[k].bytes == (size_t)c * (size_t)n * 2);
            outs++;
        }
    assert_int_equal(outs, 1);
    for (int k = 0; k < c * n; k++) {
        int at = k - k % n + PPN_X16_POS(k % n);
        if (h[at] != ppn_f32_to_bf16(f[k]))
            fail_msg("%s: element %d (at %d): 0x%04x, want 0x%04x", what, k, at, h[at], ppn_f32_to_bf16(f[k]));
    }
}

/* The norm and SwiGLU rows with bf16 output (the x of ppn_op_gemm_x16): each value the f32 op's, rounded to
 * nearest even, in gemm_tc_kw16's layout (kparams.h, PPN_X16_POS); out declared at 2 bytes an element; the vector
 * path from out aligned to four of its elements; a bf16 out over in, rows not of whole 64-element blocks, or another
 * output dtype, refused. */
static void test_rows_bf16_out(void **state)
{
    (void)state;
    enum { C = 5, N = 320 };
    float *x = tu_frand((size_t)C * N, -3, 3), *gu = tu_frand((size_t)C * 2 * N, -4, 4), *f = malloc(C * N * 4);
    void *nw = tu_wrand(PPN_DTYPE_BF16, N, NULL);
    uint16_t *h = malloc(C * N * 2);
    assert_true(f && h);
    for (int op = 0; op < 2; op++) {
        ppn_status a = op ? ppn_op_swiglu_rows(&tu_fake, tu_fake_stream, D(f), D(gu), N, C)
                          : ppn_op_rmsnorm_rows(&tu_fake, tu_fake_stream, D(f), D(x), D(nw), PPN_DTYPE_BF16, N, 1e-5f,
                                                C);
        EXPECT_ST(PPN_OK, a);
        memset(h, 0xff, C * N * 2);
        ppn_status b = op ? ppn_op_swiglu_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_BF16, D(gu), N, C)
                          : ppn_op_rmsnorm_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_BF16, D(x), D(nw),
                                                   PPN_DTYPE_BF16, N, 1e-5f, C);
        EXPECT_ST(PPN_OK, b);
        expect_bf16_rows(h, f, C, N, op ? "swiglu rows" : "rmsnorm rows");
    }
    tu_cap.dry = 1;
    static const struct { int off, vec; } al[] = {{0, 1}, {8, 1}, {4, 0}};
    for (size_t k = 0; k < sizeof al / sizeof al[0]; k++) {
        EXPECT_ST(PPN_OK, ppn_op_swiglu_rows_to(&tu_fake, tu_fake_stream, ((ppn_dptr)1 << 30) + (ppn_dptr)al[k].off,
                                                PPN_DTYPE_BF16, (ppn_dptr)2 << 30, 256, 3));
        assert_int_equal(((const ppn_kp_swiglu_rows *)tu_cap.params)->vec, al[k].vec);
        assert_int_equal(((const ppn_kp_swiglu_rows *)tu_cap.params)->odt, PPN_DTYPE_BF16);
    }
    tu_cap.dry = 0;
    tu_cap.calls = 0;
    EXPECT_ST(PPN_EINVAL, ppn_op_rmsnorm_rows_to(&tu_fake, tu_fake_stream, D(x), PPN_DTYPE_BF16, D(x), D(nw),
                                                 PPN_DTYPE_BF16, N, 1e-5f, C));
    MSG_HAS("overlaps");
    EXPECT_ST(PPN_EINVAL, ppn_op_rmsnorm_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_F16, D(x), D(nw),
                                                 PPN_DTYPE_BF16, N, 1e-5f, C));
    MSG_HAS("output dtype 2");
    EXPECT_ST(PPN_EINVAL, ppn_op_swiglu_rows_to(&tu_fake, tu_fake_stream, D(h), 7, D(gu), N, C));
    MSG_HAS("output dtype 7");
    EXPECT_ST(PPN_EINVAL, ppn_op_swiglu_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_BF16, D(gu), N - 4, C));
    MSG_HAS("multiple of 64");
    EXPECT_ST(PPN_EINVAL, ppn_op_rmsnorm_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_BF16, D(x), D(nw),
                                                 PPN_DTYPE_BF16, N - 8, 1e-5f, C));
    MSG_HAS("multiple of 64");
    assert_int_equal(tu_cap.calls, 0);
    free(x), free(gu), free(f), free(nw), free(h);
}

/* Attention rows with bf16 output (o's x for ppn_op_gemm_x16, in a mixed walk or a short chunk): each value the f32
 * op's, rounded to nearest even, in gemm_tc_kw16's layout, for both cache dtypes' references; out declared at 2
 * bytes an element (so an out that would overlap qkv only in f32 is fine); heads of fewer than 64 elements a row in
 * all, or another output dtype, refused before any launch. */
static void test_attn_rows_bf16_out(void **state)
{
    (void)state;
    enum { NQ = 4, NKV = 2, HD = 32, C = 5, POS0 = 3, CTX = 16 };
    const int n = NQ * HD, row = (NQ + 2 * NKV) * HD;
    for (int kvdt = PPN_DTYPE_F32; kvdt <= PPN_DTYPE_BF16; kvdt++) {
        float *qkv = tu_frand((size_t)C * row, -2, 2), *f = zmem(sizeof(float) * C * n);
        void *kc = tu_wrand(kvdt, (size_t)NKV * CTX * HD, NULL), *vc = tu_wrand(kvdt, (size_t)NKV * CTX * HD, NULL);
        uint16_t *h = zmem(sizeof(uint16_t) * C * n);
        ppn_kv_view kv = ppn_kv_view_identity(D(kc), D(vc), CTX, kvdt);
        EXPECT_ST(PPN_OK, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(f), D(qkv), &kv, NQ, NKV, HD, 0.3f, POS0, C));
        memset(h, 0xff, sizeof(uint16_t) * C * n);
        EXPECT_ST(PPN_OK, ppn_op_attn_rows_to(&tu_fake, tu_fake_stream, D(h), PPN_DTYPE_BF16, D(qkv), &kv, NQ, NKV, HD,
                                              0.3f, POS0, C));
        assert_int_equal(((const ppn_kp_attn_rows *)tu_cap.params)->odt, PPN_DTYPE_BF16);
        expect_bf16_rows(h, f, C, n, kvdt == PPN_DTYPE_F32 ? "attn rows, f32 cache" : "attn rows, bf16 cache");
        free(qkv), free(f), free(kc), free(vc), free(h);
    }
    tu_cap.dry = 1;
    ppn_kv_view kv = ppn_kv_view_identity((ppn_dptr)3 << 30, (ppn_dptr)4 << 30, 64, PPN_DTYPE_BF16);
    /* bf16 out of 2 rows x 128 = 512 bytes, just below qkv: apart (f32 it would be 1024 bytes, overlapping) */
    ppn_dptr q = (ppn_dptr)1 << 30;
    EXPECT_ST(PPN_OK, ppn_op_attn_rows_to(&tu_fake, tu_fake_stream, q - 512, PPN_DTYPE_BF16, q, &kv, 4, 2, 32, 0.3f,
                                          0, 2));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows_to(&tu_fake, tu_fake_stream, q - 512, PPN_DTYPE_F32, q, &kv, 4, 2, 32,
                                              0.3f, 0, 2));
    MSG_HAS("overlaps");
    tu_cap.dry = 0;
    tu_cap.calls = 0;
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows_to(&tu_fake, tu_fake_stream, (ppn_dptr)2 << 30, PPN_DTYPE_BF16, q, &kv, 2,
                                              2, 16, 0.3f, 0, 2));
    MSG_HAS("multiple of 64");
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows_to(&tu_fake, tu_fake_stream, (ppn_dptr)2 << 30, PPN_DTYPE_F16, q, &kv, 4,
                                              2, 32, 0.3f, 0, 2));
    MSG_HAS("output dtype 2");
    assert_int_equal(tu_cap.calls, 0);
}

/* ---------------------------------------------------------------------------------------------------------
 * the sim backend: a two-chunk prefill on exactly sized buffers, the checker holding each access to its
 * declaration, then the decode of one more token; the results as the references give them */

typedef struct simdev {
    ppn_gpu *g;
    ppn_gstream *s;
} simdev;

static ppn_dptr sim_buf(simdev *d, const void *h, size_t n)
{
    ppn_dptr p = 0;
    EXPECT_ST(PPN_OK, d->g->ops->mem_alloc(d->g, 0, n, &p));
    if (h) EXPECT_ST(PPN_OK, d->g->ops->copy_htod(d->g, d->s, p, h, n));
    else EXPECT_ST(PPN_OK, d->g->ops->memset_d8(d->g, d->s, p, 0, n));
    return p;
}

/* On the sim backend, its checker holding each launch to its declared accesses on exactly sized buffers: SwiGLU
 * rows with bf16 output (2 bytes an element, gemm_tc_kw16's layout), then the down projection on them
 * (ppn_op_gemm_x16: 4096 rows, gemm_tc_kw16), and the same pair in f32 (ppn_op_gemm): the same bits. The norm's
 * bf16 rows meet gemm_tc_kw16 in a forward (tests/test_kprof.c). */
static void test_rows_sim_swiglu_x16(void **state)
{
    (void)state;
    simdev d = {0};
    EXPECT_ST(PPN_OK, ppn_gpu_open("sim", ppn_kernel_set(), &d.g));
    EXPECT_ST(PPN_OK, d.g->ops->stream_create(d.g, 0, &d.s));
    enum { C = 40, N = 128, R = 4096 };
    assert_true(ppn_op_gemm_x16_fits(C, R, N, PPN_DTYPE_BF16));
    float *gu = tu_frand((size_t)C * 2 * N, -3, 3), *a = zmem((size_t)C * R * 4), *b = zmem((size_t)C * R * 4);
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)R * N, NULL);
    ppn_dptr dgu = sim_buf(&d, gu, (size_t)C * 2 * N * 4), dw = sim_buf(&d, w, (size_t)R * N * 2);
    ppn_dptr dh = sim_buf(&d, NULL, (size_t)C * N * 2), df = sim_buf(&d, NULL, (size_t)C * N * 4);
    ppn_dptr da = sim_buf(&d, NULL, (size_t)C * R * 4), db = sim_buf(&d, NULL, (size_t)C * R * 4);
    EXPECT_ST(PPN_OK, ppn_op_swiglu_rows_to(d.g, d.s, dh, PPN_DTYPE_BF16, dgu, N, C));
    EXPECT_ST(PPN_OK, ppn_op_gemm_x16(d.g, d.s, da, dw, PPN_DTYPE_BF16, dh, C, R, N, 0, 0));
    EXPECT_ST(PPN_OK, ppn_op_swiglu_rows(d.g, d.s, df, dgu, N, C));
    EXPECT_ST(PPN_OK, ppn_op_gemm(d.g, d.s, db, dw, PPN_DTYPE_BF16, df, C, R, N, 0, 0));
    EXPECT_ST(PPN_OK, d.g->ops->copy_dtoh(d.g, d.s, a, da, (size_t)C * R * 4));
    EXPECT_ST(PPN_OK, d.g->ops->copy_dtoh(d.g, d.s, b, db, (size_t)C * R * 4));
    EXPECT_ST(PPN_OK, d.g->ops->stream_sync(d.g, d.s));
    assert_memory_equal(a, b, (size_t)C * R * 4);
    ppn_dptr bufs[] = {dgu, dw, dh, df, da, db};
    for (size_t i = 0; i < TU_LEN(bufs); i++) EXPECT_ST(PPN_OK, d.g->ops->mem_free(d.g, 0, bufs[i]));
    EXPECT_ST(PPN_OK, d.g->ops->stream_destroy(d.g, d.s));
    d.g->ops->destroy(d.g);
    free(gu), free(a), free(b), free(w);
}

static void test_rows_sim_chunks(void **state)
{
    (void)state;
    simdev d = {0};
    EXPECT_ST(PPN_OK, ppn_gpu_open("sim", ppn_kernel_set(), &d.g));
    EXPECT_ST(PPN_OK, d.g->ops->stream_create(d.g, 0, &d.s));
    const shape sh = {4, 2, 32, 0, PPN_DTYPE_BF16, 12};
    const int n = 11, c0 = 7, vocab = 20, dim = 16;
    size_t row = row_floats(&sh), cb = cache_bytes(&sh), ob = (size_t)n * sh.nq * sh.hd * 4;
    float inv[16], *qkv = tu_frand((size_t)n * row, -1, 1), *ref = dup_mem(qkv, (size_t)n * row * 4);
    inv_freq_fill(inv, sh.hd);
    void *kc = zmem(cb), *vc = zmem(cb), *gkc = zmem(cb), *gvc = zmem(cb);
    float *out = zmem(ob), *gout = zmem(ob);
    decode_tokens(&sh, ref, n, inv, kc, vc, out);
    ppn_dptr dq = sim_buf(&d, qkv, (size_t)n * row * 4), dinv = sim_buf(&d, inv, sizeof inv);
    ppn_dptr dkc = sim_buf(&d, NULL, cb), dvc = sim_buf(&d, NULL, cb), dout = sim_buf(&d, NULL, ob);
    float scale = 1.0f / sqrtf((float)sh.hd);
    for (int pos0 = 0; pos0 < n; pos0 = c0) {
        int c = pos0 ? n - c0 : c0;
        ppn_dptr x = dq + (size_t)pos0 * row * 4, o = dout + (size_t)pos0 * sh.nq * sh.hd * 4;
        EXPECT_ST(PPN_OK, tu_op_rope_kv_rows(d.g, d.s, x, sh.nq, sh.nkv, sh.hd, dinv, 0, dkc, dvc, sh.ctx, sh.kvdt,
                                              pos0, c));
        EXPECT_ST(PPN_OK, tu_op_attn_rows(d.g, d.s, o, x, dkc, dvc, sh.nq, sh.nkv, sh.hd, sh.ctx, sh.kvdt, scale,
                                           pos0, c));
        if (pos0) break;
    }
    /* the other row ops on exactly sized buffers */
    int32_t tok[11] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 19};
    float *table = tu_frand((size_t)vocab * dim, -1, 1), *gu = tu_frand((size_t)n * 2 * dim, -1, 1);
    ppn_dptr dtab = sim_buf(&d, table, (size_t)vocab * dim * 4), dtok = sim_buf(&d, tok, sizeof tok);
    ppn_dptr demb = sim_buf(&d, NULL, (size_t)n * dim * 4), dgu = sim_buf(&d, gu, (size_t)n * 2 * dim * 4);
    ppn_dptr dsw = sim_buf(&d, NULL, (size_t)n * dim * 4);
    EXPECT_ST(PPN_OK, ppn_op_embed_rows(d.g, d.s, demb, dtab, PPN_DTYPE_F32, vocab, dim, dtok, n));
    EXPECT_ST(PPN_OK, ppn_op_rmsnorm_rows(d.g, d.s, demb, demb, dtab, PPN_DTYPE_F32, dim, 1e-5f, n));
    EXPECT_ST(PPN_OK, ppn_op_head_rmsnorm_rows(d.g, d.s, dq, (int)row, sh.nq, sh.nkv, sh.hd, dtab, PPN_DTYPE_F32,
                                               1e-6f, n));
    EXPECT_ST(PPN_OK, ppn_op_swiglu_rows(d.g, d.s, dsw, dgu, dim, n));
    EXPECT_ST(PPN_OK, d.g->ops->copy_dtoh(d.g, d.s, gkc, dkc, cb));
    EXPECT_ST(PPN_OK, d.g->ops->copy_dtoh(d.g, d.s, gvc, dvc, cb));
    EXPECT_ST(PPN_OK, d.g->ops->copy_dtoh(d.g, d.s, gout, dout, ob));
    EXPECT_ST(PPN_OK, d.g->ops->stream_sync(d.g, d.s));
    assert_memory_equal(gkc, kc, cb);
    assert_memory_equal(gvc, vc, cb);
    assert_memory_equal(gout, out, ob);
    ppn_dptr bufs[] = {dq, dinv, dkc, dvc, dout, dtab, dtok, demb, dgu, dsw};
    for (size_t i = 0; i < TU_LEN(bufs); i++) EXPECT_ST(PPN_OK, d.g->ops->mem_free(d.g, 0, bufs[i]));
    EXPECT_ST(PPN_OK, d.g->ops->stream_destroy(d.g, d.s));
    d.g->ops->destroy(d.g);
    free(qkv), free(ref), free(kc), free(vc), free(gkc), free(gvc), free(out), free(gout), free(table), free(gu);
}

int main(void)
{
    tu_rand_seed(0x50c0ffeeULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed_rows_reference),
        cmocka_unit_test(test_rmsnorm_rows_reference),
        cmocka_unit_test(test_head_rmsnorm_rows_reference),
        cmocka_unit_test(test_swiglu_rows_reference),
        cmocka_unit_test(test_rows_prefill_equals_decode),
        cmocka_unit_test(test_attn_rows_reference_per_position),
        cmocka_unit_test(test_rows_ops_accesses),
        cmocka_unit_test(test_attn_rows_op_geometry),
        cmocka_unit_test(test_rows_ops_refusals),
        cmocka_unit_test(test_rows_bf16_out),
        cmocka_unit_test(test_attn_rows_bf16_out),
        cmocka_unit_test(test_rows_sim_chunks),
        cmocka_unit_test(test_rows_sim_swiglu_x16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
