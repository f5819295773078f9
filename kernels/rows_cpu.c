/* rows_cpu.c - the CPU references of the many-rows kernels (kparams.h, "Many rows per launch"): each row is the
 * decode kernel's reference (cpu_ref.c) run on that row, with a step header made here for the row's position
 * or token. So a prefill chunk computes every row exactly as token-by-token decode computes it on the sim: the
 * same formula, the same accumulation order, the same rotary bits, the same KV rounding.
 *
 * Reentrant (the sim runs these on its stream workers concurrently): the per-row headers and params live on
 * the stack. Device pointers are host addresses here.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/dtype.h"
#include "kernels/ktable.h"

#include "kernels/cpu_ref.h"

#define PTR(type, p) ((type *)(uintptr_t)(p))

static uint64_t row_at(uint64_t base, int i, size_t floats) { return base + (uint64_t)i * floats * sizeof(float); }

/* A token outside the vocabulary gives zeros here (the decode kernel's NaN marks a header it cannot trust;
 * the host checked a chunk's tokens before the upload). */
void ppn_cpu_embed_rows(const void *params)
{
    const ppn_kp_embed_rows *p = params;
    const int32_t *tok = PTR(const int32_t, p->tok);
    for (int i = 0; i < p->c; i++) {
        uint64_t out = row_at(p->out, i, (size_t)p->dim);
        if (tok[i] < 0 || tok[i] >= p->vocab) {
            memset(PTR(void, out), 0, (size_t)p->dim * sizeof(float));
            continue;
        }
        ppn_step_hdr hdr = {.token = tok[i]};
        ppn_kp_embed e = {.out = out, .table = p->table, .hdr = (uint64_t)(uintptr_t)&hdr, .dim = p->dim,
                          .vocab = p->vocab, .wdt = p->wdt};
        ppn_cpu_embed(&e);
    }
}

/* odt bf16: row i computed in f32 into tmp, then rounded (nearest even) into out's row i of n bf16 in
 * gemm_tc_kw16's layout (kparams.h, PPN_X16_POS), or row-major for PPN_ODT_BF16_ROWS. Without host memory for tmp,
 * or for n % 64 != 0 (the op refuses it), the rows are NaN (loud, as the other references' faults). */
static float *bf16_rows_tmp(uint64_t out, int odt, int n, int c)
{
    if (odt == PPN_DTYPE_F32) return NULL;
    float *t = n % 64 ? NULL : malloc((size_t)n * sizeof *t);
    if (!t)
        for (size_t k = 0; k < (size_t)n * (size_t)c; k++) PTR(uint16_t, out)[k] = 0x7fc0u;
    return t;
}

static void bf16_row_store(uint64_t out, int odt, int i, const float *t, int n)
{
    uint16_t *o = PTR(uint16_t, out) + (size_t)i * (size_t)n;
    for (int k = 0; k < n; k++) o[PPN_X16_AT(odt, k)] = ppn_f32_to_bf16(t[k]); /* odt's bf16 layout (n % 64 == 0) */
}

void ppn_cpu_rmsnorm_rows(const void *params)
{
    const ppn_kp_rmsnorm_rows *p = params;
    float *t = bf16_rows_tmp(p->out, p->odt, p->n, p->c);
    if (p->odt != PPN_DTYPE_F32 && !t) return;
    for (int i = 0; i < p->c; i++) {
        ppn_kp_rmsnorm r = {.out = t ? (uint64_t)(uintptr_t)t : row_at(p->out, i, (size_t)p->n),
                            .in = row_at(p->in, i, (size_t)p->n), .w = p->w, .n = p->n, .wdt = p->wdt, .eps = p->eps};
        ppn_cpu_rmsnorm(&r);
        if (t) bf16_row_store(p->out, p->odt, i, t, p->n);
    }
    free(t);
}

void ppn_cpu_head_rmsnorm_rows(const void *params)
{
    const ppn_kp_head_rmsnorm_rows *p = params;
    for (int i = 0; i < p->c; i++) {
        uint64_t x = row_at(p->x, i, (size_t)p->stride) + (uint64_t)p->h0 * (uint64_t)p->head_dim * sizeof(float);
        ppn_kp_head_rmsnorm h = {.x = x, .w = p->w, .n_heads = p->n_heads, .head_dim = p->head_dim, .wdt = p->wdt,
                                 .eps = p->eps};
        ppn_cpu_head_rmsnorm(&h);
    }
}

/* Row i is the decode rope with caches at position pos0 + i: x = its q and k heads, v = its v heads. */
void ppn_cpu_rope_kv_rows(const void *params)
{
    const ppn_kp_rope_kv_rows *p = params;
    size_t hd = (size_t)p->head_dim, row = (size_t)(p->n_q + 2 * p->n_kv) * hd;
    for (int i = 0; i < p->c; i++) {
        ppn_step_hdr hdr = {.pos = p->pos0 + i};
        uint64_t x = row_at(p->qkv, i, row);
        ppn_kp_rope r = {.x = x, .inv_freq = p->inv_freq, .hdr = (uint64_t)(uintptr_t)&hdr, .kc = p->kc,
                         .vc = p->vc, .v = x + (uint64_t)(p->n_q + p->n_kv) * hd * sizeof(float), .tbl = p->tbl,
                         .n_heads = p->n_q + p->n_kv, .head_dim = p->head_dim, .interleaved = p->interleaved,
                         .n_kv = p->n_kv, .cap = p->cap, .kvdt = p->kvdt, .block_log2 = p->block_log2};
        ppn_cpu_rope(&r);
    }
}

/* Row i is decode attention at position pos0 + i (one split: the CPU reference is exact whatever the split, and
 * touches no scratch). */
void ppn_cpu_attn_rows(const void *params)
{
    const ppn_kp_attn_rows *p = params;
    size_t hd = (size_t)p->head_dim, row = (size_t)(p->n_heads + 2 * p->n_kv) * hd;
    int n = p->n_heads * p->head_dim;
    float *t = bf16_rows_tmp(p->out, p->odt, n, p->c); /* odt bf16: each row in f32, then rounded (as the GPU's) */
    if (p->odt != PPN_DTYPE_F32 && !t) return;
    for (int i = 0; i < p->c; i++) {
        ppn_step_hdr hdr = {.pos = p->pos0 + i};
        ppn_kp_attn a = {.out = t ? (uint64_t)(uintptr_t)t : row_at(p->out, i, (size_t)n), .q = row_at(p->qkv, i, row),
                         .kc = p->kc, .vc = p->vc, .hdr = (uint64_t)(uintptr_t)&hdr, .tbl = p->tbl,
                         .n_heads = p->n_heads, .n_kv = p->n_kv, .head_dim = p->head_dim, .cap = p->cap,
                         .n_split = 1, .kvdt = p->kvdt, .block_log2 = p->block_log2, .scale = p->scale,
                         .odt = PPN_DTYPE_F32};
        ppn_cpu_attn(&a);
        if (t) bf16_row_store(p->out, p->odt, i, t, n);
    }
    free(t);
}

void ppn_cpu_attn_rows_bf16(const void *params) { ppn_cpu_attn_rows(params); }
void ppn_cpu_attn_rows_f16(const void *params) { ppn_cpu_attn_rows(params); }

void ppn_cpu_swiglu_rows(const void *params)
{
    const ppn_kp_swiglu_rows *p = params;
    float *t = bf16_rows_tmp(p->out, p->odt, p->n, p->c);
    if (p->odt != PPN_DTYPE_F32 && !t) return;
    for (int i = 0; i < p->c; i++) {
        uint64_t gu = row_at(p->gu, i, 2u * (size_t)p->n);
        ppn_kp_swiglu s = {.out = t ? (uint64_t)(uintptr_t)t : row_at(p->out, i, (size_t)p->n), .gate = gu,
                           .up = gu + (uint64_t)p->n * sizeof(float), .n = p->n};
        ppn_cpu_swiglu(&s);
        if (t) bf16_row_store(p->out, p->odt, i, t, p->n);
    }
    free(t);
}

/* Each row by the one-row argmax's rule (ppn_cpu_argmax). */
void ppn_cpu_argmax_rows(const void *params)
{
    const ppn_kp_argmax_rows *p = params;
    for (int i = 0; i < p->rows; i++) {
        ppn_kp_argmax a = {.out = p->out + sizeof(int32_t) * (size_t)i, .x = row_at(p->x, i, (size_t)p->n), .n = p->n};
        ppn_cpu_argmax(&a);
    }
}

/* Row i is the decode rope with caches at segs[i].pos through segs[i].tbl: rope_kv_rows's row with its own
 * position and table. */
void ppn_cpu_rope_kv_batch(const void *params)
{
    const ppn_kp_rope_kv_batch *p = params;
    const ppn_kseg *segs = PTR(const ppn_kseg, p->segs);
    size_t hd = (size_t)p->head_dim, row = (size_t)(p->n_q + 2 * p->n_kv) * hd;
    for (int i = 0; i < p->B; i++) {
        ppn_step_hdr hdr = {.pos = segs[i].pos};
        uint64_t x = row_at(p->qkv, i, row);
        ppn_kp_rope r = {.x = x, .inv_freq = p->inv_freq, .hdr = (uint64_t)(uintptr_t)&hdr, .kc = p->kc,
                         .vc = p->vc, .v = x + (uint64_t)(p->n_q + p->n_kv) * hd * sizeof(float), .tbl = segs[i].tbl,
                         .n_heads = p->n_q + p->n_kv, .head_dim = p->head_dim, .interleaved = p->interleaved,
                         .n_kv = p->n_kv, .cap = p->cap, .kvdt = p->kvdt, .block_log2 = p->block_log2};
        ppn_cpu_rope(&r);
    }
}

/* Row i of a batched decode attention by one: ppn_cpu_attn or ppn_cpu_attn_tc on its rows of qkv and out, at
 * segs[i].pos through segs[i].tbl. odt bf16: each row computed in f32, then rounded into gemm_tc_kw16's layout
 * (bf16_row_store). */
static void attn_batch_rows(const ppn_kp_attn_batch *p, void (*one)(const ppn_kp_attn *))
{
    const ppn_kseg *segs = PTR(const ppn_kseg, p->segs);
    int n = p->a.n_heads * p->a.head_dim;
    size_t hd = (size_t)p->a.head_dim, row = (size_t)(p->a.n_heads + 2 * p->a.n_kv) * hd;
    float *t = bf16_rows_tmp(p->a.out, p->a.odt, n, p->B);
    if (p->a.odt != PPN_DTYPE_F32 && !t) return;
    for (int i = 0; i < p->B; i++) {
        ppn_step_hdr hdr = {.pos = segs[i].pos};
        ppn_kp_attn a = p->a;
        a.odt = PPN_DTYPE_F32;
        a.out = t ? (uint64_t)(uintptr_t)t : row_at(p->a.out, i, (size_t)n);
        a.q = row_at(p->a.q, i, row);
        a.hdr = (uint64_t)(uintptr_t)&hdr;
        a.tbl = segs[i].tbl; /* a.inv_freq as given: the fused rotary at the row's position */
        one(&a);
        if (t) bf16_row_store(p->a.out, p->a.odt, i, t, n);
    }
    free(t);
}

static void attn_one(const ppn_kp_attn *a) { ppn_cpu_attn(a); }

/* Row i is decode attention at segs[i].pos through segs[i].tbl, on its rows of qkv and out (exact: it touches no
 * scratch, whatever n_split is), with the fused rotary where inv_freq is set. So a row never depends on the other
 * rows. */
void ppn_cpu_attn_batch(const void *params) { attn_batch_rows(params, attn_one); }

/* ppn_cpu_attn_batch's rows by ppn_cpu_attn_tc (no fused rotary: the op takes no inv_freq). */
void ppn_cpu_attn_batch_tc(const void *params) { attn_batch_rows(params, ppn_cpu_attn_tc); }

void ppn_cpu_attn_batch_bf16(const void *params) { ppn_cpu_attn_batch(params); }
void ppn_cpu_attn_batch_f16(const void *params) { ppn_cpu_attn_batch(params); }
