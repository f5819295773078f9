/* cpu_ref.c - the CPU reference of every kernel: what the sim backend runs, and what the CUDA kernels are
 * checked against.
 *
 * Reentrant: no static mutable state (the sim runs these on its stream worker threads concurrently).
 * Device pointers are host addresses here. Math follows HF transformers in float32: every stored value and
 * every elementwise step is f32, rounded where HF rounds. Long reductions (dot products, sums of squares,
 * softmax sums) accumulate in double, in a fixed order, which is at least as accurate as HF's f32 BLAS and
 * gives the same bits on every run.
 *
 * Header values out of range (a token outside the vocabulary, a position outside the cache) never make a
 * kernel touch memory outside its buffers: embed and attn write NaN to their output so the fault is loud,
 * the KV stores (rope's, attention's) write nothing. The CUDA kernels do the same. Every KV access goes through
 * the block table (ppn_kv_pool_pos, kparams.h): a position the table maps nowhere stores nothing and reads zeros.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/dtype.h"
#include "kernels/ktable.h"

#include "kernels/cpu_ref.h"

#define PTR(type, p) ((type *)(uintptr_t)(p))

static float bf16_at(const uint16_t *w, size_t i) { return ppn_bf16_to_f32(w[i]); }

/* Element i of a weight array of dtype wdt, widened to f32. */
static float w_at(uint64_t w, int wdt, size_t i)
{
    switch (wdt) {
    case PPN_DTYPE_BF16: return bf16_at(PTR(const uint16_t, w), i);
    case PPN_DTYPE_F16: return ppn_f16_to_f32(PTR(const uint16_t, w)[i]);
    default: return PTR(const float, w)[i];
    }
}

/* The KV caches hold the weights' dtype (kparams.h): read with w_at; v stored, rounded. */
static void kv_put(uint64_t c, int kvdt, size_t i, float v)
{
    switch (kvdt) {
    case PPN_DTYPE_BF16: PTR(uint16_t, c)[i] = ppn_f32_to_bf16(v); break;
    case PPN_DTYPE_F16: PTR(uint16_t, c)[i] = ppn_f32_to_f16(v); break;
    default: PTR(float, c)[i] = v;
    }
}

/* n floats of src into cache c from element i */
static void kv_put_row(uint64_t c, int kvdt, size_t i, const float *src, size_t n)
{
    if (kvdt == PPN_DTYPE_F32) memcpy(PTR(float, c) + i, src, n * sizeof(float));
    else
        for (size_t k = 0; k < n; k++) kv_put(c, kvdt, i + k, src[k]);
}

static void fill_nan(float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = NAN;
}

static const ppn_step_hdr *hdr_of(uint64_t p) { return PTR(const ppn_step_hdr, p); }

/* Element 0 of (KV head g, position pos) in a pool through table tbl, or -1 when nothing may be touched. */
static int64_t kv_elem(uint64_t tbl, int L, int cap, int hd, int g, int32_t pos)
{
    int32_t pp = ppn_kv_pool_pos(tbl ? PTR(const int32_t, tbl) : NULL, L, cap, pos);
    return pp < 0 ? -1 : ((int64_t)g * cap + pp) * hd;
}

void ppn_cpu_embed(const void *params)
{
    const ppn_kp_embed *p = params;
    float *out = PTR(float, p->out);
    int32_t tok = hdr_of(p->hdr)->token;
    if (tok < 0 || tok >= p->vocab) {
        fill_nan(out, (size_t)p->dim);
        return;
    }
    size_t base = (size_t)tok * (size_t)p->dim;
    for (int i = 0; i < p->dim; i++) out[i] = w_at(p->table, p->wdt, base + (size_t)i);
}

/* out = x * (1/sqrt(mean(x^2) + eps)) * w over n values, as HF's RMSNorm: the mean rounded to f32, the
 * scale applied to x first, then the weight. out may alias x (the sum is done before any write). */
static void rmsnorm_span(float *out, const float *x, uint64_t w, int wdt, size_t w_off, int n, float eps)
{
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float var = (float)(ss / n);
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) out[i] = (x[i] * r) * w_at(w, wdt, w_off + (size_t)i);
}

void ppn_cpu_rmsnorm(const void *params)
{
    const ppn_kp_rmsnorm *p = params;
    rmsnorm_span(PTR(float, p->out), PTR(const float, p->in), p->w, p->wdt, 0, p->n, p->eps);
}

void ppn_cpu_head_rmsnorm(const void *params)
{
    const ppn_kp_head_rmsnorm *p = params;
    float *x = PTR(float, p->x);
    for (int h = 0; h < p->n_heads; h++) {
        float *xh = x + (size_t)h * (size_t)p->head_dim;
        rmsnorm_span(xh, xh, p->w, p->wdt, 0, p->head_dim, p->eps);
    }
}

/* Row dot products, one per weight dtype so the widening is not a switch per element. Four partial sums
 * (element c goes to c % 4) keep the double adds pipelined; they are combined in a fixed order. */
static double dot_f32(const float *w, const float *x, int n)
{
    double a[4] = {0, 0, 0, 0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int k = 0; k < 4; k++) a[k] += (double)w[c + k] * (double)x[c + k];
    for (; c < n; c++) a[c & 3] += (double)w[c] * (double)x[c];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static double dot_bf16(const uint16_t *w, const float *x, int n)
{
    double a[4] = {0, 0, 0, 0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int k = 0; k < 4; k++) a[k] += (double)bf16_at(w, (size_t)(c + k)) * (double)x[c + k];
    for (; c < n; c++) a[c & 3] += (double)bf16_at(w, (size_t)c) * (double)x[c];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static double dot_f16(const uint16_t *w, const float *x, int n)
{
    double a[4] = {0, 0, 0, 0};
    int c = 0;
    for (; c + 4 <= n; c += 4)
        for (int k = 0; k < 4; k++) a[k] += (double)ppn_f16_to_f32(w[c + k]) * (double)x[c + k];
    for (; c < n; c++) a[c & 3] += (double)ppn_f16_to_f32(w[c]) * (double)x[c];
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static double row_dot(const ppn_kp_matvec *p, const float *x, int r)
{
    size_t off = (size_t)r * (size_t)p->cols;
    switch (p->wdt) {
    case PPN_DTYPE_BF16: return dot_bf16(PTR(const uint16_t, p->w) + off, x, p->cols);
    case PPN_DTYPE_F16: return dot_f16(PTR(const uint16_t, p->w) + off, x, p->cols);
    default: return dot_f32(PTR(const float, p->w) + off, x, p->cols);
    }
}

/* The matvec's fused input (kparams.h PPN_MV_X_RMSNORM) with the rmsnorm reference's own arithmetic, so a fused
 * launch gives the bits of the two unfused ones here. NULL when out of host memory. */
static float *matvec_input(const ppn_kp_matvec *p)
{
    float *in = malloc(sizeof(float) * (size_t)p->cols);
    if (in) rmsnorm_span(in, PTR(const float, p->x), p->nw, p->wdt, 0, p->cols, p->eps);
    return in;
}

/* As HF: y = x W^T (+ bias) in f32, and the residual added to y afterwards. res may alias out: each row
 * reads res[r] before writing out[r]. A fused input is computed first; without the host memory for it the
 * output is NaN (loud, as an out-of-range header). */
void ppn_cpu_matvec(const void *params)
{
    const ppn_kp_matvec *p = params;
    float *out = PTR(float, p->out);
    const float *res = p->res ? PTR(const float, p->res) : NULL;
    float *in = p->xmode == PPN_MV_X_PLAIN ? NULL : matvec_input(p);
    if (p->xmode != PPN_MV_X_PLAIN && !in) {
        fill_nan(out, (size_t)p->rows);
        return;
    }
    const float *x = in ? in : PTR(const float, p->x);
    for (int r = 0; r < p->rows; r++) {
        float v = (float)row_dot(p, x, r);
        if (p->bias) v = v + w_at(p->bias, p->wdt, (size_t)r);
        if (res) v = res[r] + v;
        out[r] = v;
    }
    free(in);
}

/* The angle is pos * inv_freq[i] rounded to f32 (as HF's f32 matmul does); its cos and sin are computed in
 * double and rounded, so they are the correctly rounded f32 values. */
static void rope_angle(int32_t pos, float inv_freq, float *c, float *s)
{
    float ang = (float)pos * inv_freq;
    *c = (float)cos((double)ang);
    *s = (float)sin((double)ang);
}

/* Rotate the pair (a, b) by the angle: a' = a cos - b sin, b' = b cos + a sin, each product rounded to f32
 * (HF: x * cos + rotate_half(x) * sin). */
static void rope_pair(float *a, float *b, float c, float s)
{
    float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x1 * c + x0 * s;
}

/* Head xh [hd] rotated in place at pos: pairs (i, i + hd/2), or (2i, 2i + 1) interleaved. rope and the
 * fused rotary in attention both take it, so they give the same bits. */
static void rope_head(float *xh, int hd, int32_t pos, const float *inv, int interleaved)
{
    for (int i = 0; i < hd / 2; i++) {
        float c, s;
        rope_angle(pos, inv[i], &c, &s);
        if (interleaved) rope_pair(&xh[2 * i], &xh[2 * i + 1], c, s);
        else rope_pair(&xh[i], &xh[i + hd / 2], c, s);
    }
}

void ppn_cpu_rope(const void *params)
{
    const ppn_kp_rope *p = params;
    float *x = PTR(float, p->x);
    const float *inv = PTR(const float, p->inv_freq);
    int32_t pos = hdr_of(p->hdr)->pos;
    for (int h = 0; h < p->n_heads; h++)
        rope_head(x + (size_t)h * (size_t)p->head_dim, p->head_dim, pos, inv, p->interleaved);
    if (!p->kc) return; /* the KV store: rotated k heads and v */
    size_t hd = (size_t)p->head_dim;
    for (int h = 0; h < p->n_kv; h++) {
        int64_t e = kv_elem(p->tbl, p->block_log2, p->cap, p->head_dim, h, pos);
        if (e < 0) return;
        size_t dst = (size_t)e;
        kv_put_row(p->kc, p->kvdt, dst, x + (size_t)(p->n_heads - p->n_kv + h) * hd, hd);
        kv_put_row(p->vc, p->kvdt, dst, PTR(const float, p->v) + (size_t)h * hd, hd);
    }
}

/* Output dims are accumulated in double in chunks of this many (a fixed stack buffer, no allocation). */
#define ATTN_CHUNK 128

typedef struct attn_head {
    const float *q;     /* q[hd] */
    uint64_t k, v;      /* the pools, of dtype kvdt */
    uint64_t tbl;       /* the block table (0: identity) */
    int L, cap, g;      /* block_log2, pool positions, the KV head */
    int kvdt, hd, npos; /* cache dtype; head_dim; positions 0..npos-1 attended */
    double scale, max;  /* softmax scale; max score (set by attn_max) */
    int tc;             /* 1: the weights in the output's sum rounded to bf16 (ppn_k_attn_batch_tc's), q given so */
} attn_head;

/* Element 0 of position t's row; -1: mapped nowhere (the row reads as zeros). */
static int64_t attn_row(const attn_head *a, int t) { return kv_elem(a->tbl, a->L, a->cap, a->hd, a->g, t); }

static double attn_score(const attn_head *a, int t)
{
    int64_t kt = attn_row(a, t);
    double d = 0.0;
    if (kt < 0) return d * a->scale;
    for (int i = 0; i < a->hd; i++) d += (double)a->q[i] * (double)w_at(a->k, a->kvdt, (size_t)kt + (size_t)i);
    return d * a->scale;
}

static void attn_max(attn_head *a)
{
    a->max = -INFINITY;
    for (int t = 0; t < a->npos; t++) {
        double s = attn_score(a, t);
        if (s > a->max) a->max = s;
    }
}

/* out[d0..d0+nd) = sum_t p_t v_t[d] / sum_t p_t with p_t = exp(s_t - max). Scores are recomputed per chunk
 * (identically), trading compute for a scratch-free reference. */
static void attn_chunk(const attn_head *a, float *out, int d0, int nd)
{
    double acc[ATTN_CHUNK] = {0}, sum = 0.0;
    for (int t = 0; t < a->npos; t++) {
        double pt = exp(attn_score(a, t) - a->max);
        int64_t row = attn_row(a, t);
        sum += pt;
        if (row < 0) continue;
        if (a->tc) pt = (double)ppn_bf16_to_f32(ppn_f32_to_bf16((float)pt));
        size_t vt = (size_t)row + (size_t)d0;
        for (int i = 0; i < nd; i++) acc[i] += pt * (double)w_at(a->v, a->kvdt, vt + (size_t)i);
    }
    for (int i = 0; i < nd; i++) out[d0 + i] = (float)(acc[i] / sum);
}

/* One head's output: its max score, then every chunk of its dims. */
static void attn_head_out(attn_head *a, float *out)
{
    attn_max(a);
    for (int d0 = 0; d0 < a->hd; d0 += ATTN_CHUNK) {
        int nd = a->hd - d0 < ATTN_CHUNK ? a->hd - d0 : ATTN_CHUNK;
        attn_chunk(a, out, d0, nd);
    }
}

/* The fused rotary's stores: each KV head's k rotated at pos and v into the caches there (none past a missing
 * block). tmp: head_dim floats. */
static void attn_rope_store(const ppn_kp_attn *p, int32_t pos, const float *inv, float *tmp)
{
    size_t hd = (size_t)p->head_dim;
    const float *k = PTR(const float, p->q) + (size_t)p->n_heads * hd, *v = k + (size_t)p->n_kv * hd;
    for (int g = 0; g < p->n_kv; g++) {
        int64_t dst = kv_elem(p->tbl, p->block_log2, p->cap, p->head_dim, g, pos);
        if (dst < 0) break;
        memcpy(tmp, k + (size_t)g * hd, hd * sizeof(float));
        rope_head(tmp, p->head_dim, pos, inv, p->interleaved);
        kv_put_row(p->kc, p->kvdt, (size_t)dst, tmp, hd);
        kv_put_row(p->vc, p->kvdt, (size_t)dst, v + (size_t)g * hd, hd);
    }
}

/* Exact over [0, pos] whatever p->n_split is: the split only reshapes the CUDA reduction, and the scratch
 * (p->part) is left untouched, its counters staying 0 as the CUDA kernel leaves them. */
void ppn_cpu_attn(const void *params)
{
    const ppn_kp_attn *p = params;
    int32_t pos = hdr_of(p->hdr)->pos;
    size_t hd = (size_t)p->head_dim;
    if (pos < 0 || pos >= p->cap) {
        fill_nan(PTR(float, p->out), (size_t)p->n_heads * hd);
        return;
    }
    const float *inv = p->inv_freq ? PTR(const float, p->inv_freq) : NULL;
    float qr[256]; /* a rotated query or key head: ppn_op_attn allows head_dim <= 256 */
    if (inv) attn_rope_store(p, pos, inv, qr);
    int group = p->n_heads / p->n_kv;
    for (int h = 0; h < p->n_heads; h++) {
        const float *qh = PTR(const float, p->q) + (size_t)h * hd;
        if (inv) {
            memcpy(qr, qh, hd * sizeof(float));
            rope_head(qr, p->head_dim, pos, inv, p->interleaved);
            qh = qr;
        }
        attn_head a = {qh, p->kc, p->vc, p->tbl, p->block_log2, p->cap, h / group, p->kvdt, p->head_dim, pos + 1,
                       p->scale, 0.0, 0};
        attn_head_out(&a, PTR(float, p->out) + (size_t)h * hd);
    }
}

/* ppn_k_attn_batch_tc's arithmetic for one row (p->inv_freq 0): ppn_cpu_attn with q rounded to bf16 and each
 * weight rounded to bf16 where it multiplies v (the sum it is divided by keeps the unrounded weights). Exact
 * otherwise; the device rounds each weight against its tile's running maximum, not the row's, and sums in the
 * tensor cores' order: the same values within rounding, not the same bits. */
void ppn_cpu_attn_tc(const ppn_kp_attn *p)
{
    int32_t pos = hdr_of(p->hdr)->pos;
    size_t hd = (size_t)p->head_dim;
    if (pos < 0 || pos >= p->cap) {
        fill_nan(PTR(float, p->out), (size_t)p->n_heads * hd);
        return;
    }
    float qr[256];
    int group = p->n_heads / p->n_kv;
    for (int h = 0; h < p->n_heads; h++) {
        const float *qh = PTR(const float, p->q) + (size_t)h * hd;
        for (size_t i = 0; i < hd; i++) qr[i] = ppn_bf16_to_f32(ppn_f32_to_bf16(qh[i]));
        attn_head a = {qr, p->kc, p->vc, p->tbl, p->block_log2, p->cap, h / group, p->kvdt, p->head_dim, pos + 1,
                       p->scale, 0.0, 1};
        attn_head_out(&a, PTR(float, p->out) + (size_t)h * hd);
    }
}

void ppn_cpu_attn_bf16(const void *params) { ppn_cpu_attn(params); }
void ppn_cpu_attn_f16(const void *params) { ppn_cpu_attn(params); }

/* silu(g) * u with silu(g) = g / (1 + exp(-g)), all in f32 like HF's act_fn(gate) * up. */
void ppn_cpu_swiglu(const void *params)
{
    const ppn_kp_swiglu *p = params;
    float *out = PTR(float, p->out);
    const float *g = PTR(const float, p->gate), *u = PTR(const float, p->up);
    for (int i = 0; i < p->n; i++) {
        float s = g[i] / (1.0f + expf(-g[i]));
        out[i] = s * u[i];
    }
}

void ppn_cpu_add(const void *params)
{
    const ppn_kp_add *p = params;
    float *out = PTR(float, p->out);
    const float *a = PTR(const float, p->a), *b = PTR(const float, p->b);
    for (int i = 0; i < p->n; i++) out[i] = a[i] + b[i];
}

/* Lowest index of the largest value; -1 when any value is NaN or infinite (non-finite logits: the host names
 * them). */
void ppn_cpu_argmax(const void *params)
{
    const ppn_kp_argmax *p = params;
    const float *x = PTR(const float, p->x);
    int32_t best = -1;
    for (int i = 0; i < p->n; i++) {
        if (!isfinite(x[i])) {
            best = -1;
            break;
        }
        if (best < 0 || x[i] > x[best]) best = i;
    }
    *PTR(int32_t, p->out) = best;
}

void ppn_cpu_fill(const void *params)
{
    const ppn_kp_fill *p = params;
    uint32_t *out = PTR(uint32_t, p->out);
    for (int i = 0; i < p->n; i++) out[i] = p->value;
}

void ppn_cpu_set_hdr(const void *params)
{
    const ppn_kp_set_hdr *p = params;
    ppn_step_hdr v = p->v;
    if (p->tok) v.token = *PTR(const int32_t, p->tok);
    *PTR(ppn_step_hdr, p->hdr) = v;
}

/* m matvecs: the same per-row reduction (row_dot) token by token, so every row equals ppn_cpu_matvec's. */
void ppn_cpu_matmat(const void *params)
{
    const ppn_kp_matmat *p = params;
    for (int t = 0; t < p->m; t++) {
        size_t xo = (size_t)t * (size_t)p->cols * sizeof(float), oo = (size_t)t * (size_t)p->rows * sizeof(float);
        ppn_kp_matvec v = {.out = p->out + oo, .w = p->w, .x = p->x + xo, .bias = p->bias,
                           .res = p->res ? p->res + oo : 0, .rows = p->rows, .cols = p->cols, .wdt = p->wdt};
        ppn_cpu_matvec(&v);
    }
}
