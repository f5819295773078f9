/* ops.h - typed launch wrappers: build the params struct, the declared accesses (for the sim checker) and the
 * cuda geometry of each kernel, then call g->ops->launch. The forward pass calls only these.
 * Sizes are element counts; wdt is the weight dtype (PPN_DTYPE_*). Each returns the launch's status. */
#ifndef PPN_OPS_H
#define PPN_OPS_H

#include "core/device/gpu.h"
#include "kernels/ktable.h"

/* Paged KV (kparams.h, "KV caches"): one layer's K and V pools, each [n_kv, cap, head_dim] elements of kvdt, cap =
 * n_blocks << block_log2 pool positions (block_log2 in 0..12), shared by every sequence of the layer. */
typedef struct ppn_kv_pool {
    ppn_dptr k, v;
    int cap, block_log2, kvdt;
} ppn_kv_pool;
/* One sequence's view of a layer's pools: its block table maps its position p to pool position
 * (tbl[p >> L] << L) | (p & (2^L - 1)). The kernels read the table in device memory; the host copy is what the ops
 * check (every entry in [0, cap >> L), else PPN_EINVAL) and declare to the sim checker (the K and V ranges of each
 * held block for every KV head, and the table itself as read; an identity view declares the whole pools as
 * before). The device table must hold the host copy's entries by the time the launch runs (the caller orders
 * that); positions an op touches must lie below n_tbl << block_log2. */
typedef struct ppn_kv_view {
    ppn_kv_pool pool;
    ppn_dptr tbl;         /* the sequence's device block table (0: identity) */
    const int32_t *tbl_h; /* host copy of its first n_tbl entries, for the declared accesses (NULL with tbl 0) */
    int n_tbl;            /* blocks the sequence holds: positions < n_tbl << block_log2 (with tbl 0: cap) */
} ppn_kv_view;

/* The identity view of caches k, v [n_kv, cap, head_dim] (the layout before paging). */
static inline ppn_kv_view ppn_kv_view_identity(ppn_dptr k, ppn_dptr v, int cap, int kvdt)
{
    ppn_kv_view w = {.pool = {.k = k, .v = v, .cap = cap, .block_log2 = 0, .kvdt = kvdt}, .tbl = 0, .tbl_h = 0,
                     .n_tbl = 0};
    return w;
}

ppn_status ppn_op_embed(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr table, int wdt, int vocab, int dim,
                        ppn_dptr hdr);
ppn_status ppn_op_rmsnorm(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr in, ppn_dptr w, int wdt, int n,
                          float eps);
ppn_status ppn_op_matvec(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int rows,
                         int cols, ppn_dptr bias, ppn_dptr res);
/* The matvec's input as kparams.h's PPN_MV_X_* modes compute it: x itself, or rmsnorm(x) with weight nw (wdt)
 * and eps. A fused input is computed in shared memory: cols at most (PPN_DYN_SMEM_MAX - 256) / 4, else
 * PPN_EUNSUPPORTED. */
typedef struct ppn_mv_input {
    int mode;
    ppn_dptr x, nw;
    float eps;
} ppn_mv_input;
ppn_status ppn_op_matvec_in(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_mv_input in,
                            int rows, int cols, ppn_dptr bias, ppn_dptr res);
/* 1 when a fused input of cols columns fits (the forward pass fuses only then; wider models keep the separate
 * rmsnorm launch). */
int ppn_op_matvec_fusable(int cols);
/* m tokens at once (see ppn_kp_matmat); out, x, res hold m rows each. Not called by the library yet: the seed of
 * prefill. */
ppn_status ppn_op_matmat(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int m, int rows,
                         int cols, ppn_dptr bias, ppn_dptr res);
/* rope over qk = [q: n_q heads][k: n_kv heads], then the rotated k and v [n_kv, head_dim] stored into the pools
 * of kv at hdr->pos through its table, in one launch. kv->pool.kvdt (here and in attention): the pools' element
 * dtype, PPN_DTYPE_F32/BF16/F16 (kparams.h, KV caches). Also PPN_EINVAL for a view ppn_kv_view's rules refuse. */
ppn_status ppn_op_rope_kv(ppn_gpu *g, ppn_gstream *s, ppn_dptr qk, int n_q, int n_kv, int head_dim,
                          ppn_dptr inv_freq, int interleaved, ppn_dptr hdr, const ppn_kv_view *kv, ppn_dptr v);
ppn_status ppn_op_head_rmsnorm(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int n_heads, int head_dim, ppn_dptr w,
                               int wdt, float eps);
/* Decode attention split over positions into n_split CTAs per KV head (1..64; see ppn_kp_attn). part: scratch of
 * ppn_op_attn_scratch_bytes(n_heads, n_split, head_dim) bytes whose counters are zero (zero it once at
 * allocation; every launch leaves them zero), used by one stream at a time. */
ppn_status ppn_op_attn(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr q, const ppn_kv_view *kv, int n_heads,
                       int n_kv, int head_dim, float scale, ppn_dptr hdr, ppn_dptr part, int n_split);
/* The same attention with the rotary fused in (see ppn_kp_attn): qkv holds the unrotated [q: n_heads heads;
 * k: n_kv; v: n_kv] of the q|k|v projection and is only read; the rotated k and v are stored into kv's pools at
 * hdr->pos, as ppn_op_rope_kv stores them. The same bits as rope_kv then attn. Also PPN_EINVAL for an odd
 * head_dim or no inv_freq, and PPN_EUNSUPPORTED for a shape ppn_op_attn_rope_fits refuses. */
ppn_status ppn_op_attn_rope(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, const ppn_kv_view *kv,
                            int n_heads, int n_kv, int head_dim, float scale, ppn_dptr hdr, ppn_dptr part,
                            int n_split, ppn_dptr inv_freq, int interleaved);
/* 1 when ppn_op_attn_rope takes this head_dim and rotary convention: any even head_dim up to 128 with
 * interleaved pairs; 2, 4, .., 32, 64 or 128 with rotated halves (the forward pass fuses only then; else
 * rope_kv + attn). */
int ppn_op_attn_rope_fits(int head_dim, int interleaved);
/* Bytes of one layer's k (or v) pool [n_kv, cap, head_dim] of dtype kvdt (0 for a non-positive size or an
 * unknown dtype): what the runtime allocates and what the ops above declare for an identity view. */
size_t ppn_op_kv_cache_bytes(int n_kv, int head_dim, int cap, int kvdt);
/* Bytes of ppn_op_attn's scratch (0 for a non-positive argument). */
size_t ppn_op_attn_scratch_bytes(int n_heads, int n_split, int head_dim);
/* The n_split to use on a device of sm_count SMs for n_kv KV heads: ceil(2 sm_count / n_kv) in 1..64 (1 when
 * sm_count is unknown, <= 0). A model fixes it once, so every stage and every map computes the same bits. */
int ppn_op_attn_split(int n_kv, int sm_count);
ppn_status ppn_op_swiglu(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr gate, ppn_dptr up, int n);
ppn_status ppn_op_add(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n);
/* out_i32 = argmax(x[0..n)) over many blocks (see ppn_kp_argmax): part is scratch of ppn_op_argmax_scratch_bytes()
 * whose counter (its last 4 bytes) is zero (zero it once; every launch leaves it zero), used by one stream at a
 * time. */
ppn_status ppn_op_argmax_wide(ppn_gpu *g, ppn_gstream *s, ppn_dptr out_i32, ppn_dptr x, int n, ppn_dptr part);
size_t ppn_op_argmax_scratch_bytes(void);
/* set_hdr with the token read on the device from tok (int32). */
ppn_status ppn_op_set_hdr_dev(ppn_gpu *g, ppn_gstream *s, ppn_dptr hdr, int pos, ppn_dptr tok, int seq, int step);
ppn_status ppn_op_set_hdr(ppn_gpu *g, ppn_gstream *s, ppn_dptr hdr, int pos, int token, int seq, int step);

/* ---------------------------------------------------------------------------------------------------------
 * Many rows per launch: prefill chunks (later batched decode and speculative verify). Activations are f32,
 * row-major [c, n]. A chunk's c rows are positions pos0 .. pos0 + c - 1 of one sequence. Every op is
 * deterministic (a fixed reduction order for a given shape), declares every buffer it touches for the sim
 * checker, and returns PPN_EINVAL for c < 1 or a shape it cannot take (named in the message).
 * --------------------------------------------------------------------------------------------------------- */

/* out[i, :] = table[tok[i], :] for i < c (table [vocab, dim] in wdt, tok int32 [c] in device memory); a token
 * outside [0, vocab) gives a row of zeros (the host checked them before). */
ppn_status ppn_op_embed_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr table, int wdt, int vocab, int dim,
                             ppn_dptr tok, int c);
/* The rmsnorm kernel's formula on each of c rows of n (out may be in itself; a partial overlap is refused). */
ppn_status ppn_op_rmsnorm_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr in, ppn_dptr w, int wdt, int n,
                               float eps, int c);
/* The same with out [c, n] of dtype odt: PPN_DTYPE_F32 (as above) or PPN_DTYPE_BF16, each value rounded to nearest
 * even and laid out for gemm_tc_kw16 (kparams.h, PPN_X16_POS; n % 64 == 0): the x of ppn_op_gemm_x16, rounded as
 * the GEMM would round its f32 x. A bf16 out must not overlap in. */
ppn_status ppn_op_rmsnorm_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr in, ppn_dptr w, int wdt,
                                  int n, float eps, int c);
/* out[i, r] = (res ? res[i, r] : 0) + (bias ? bias[r] : 0) + sum_k W[r, k] x[i, k], for i < m, r < rows:
 * x [m, cols] f32, W [rows, cols] in wdt (row-major, as the checkpoint stores it), bias [rows] in wdt (0: none),
 * res [m, rows] f32 (0: none; may alias out). bf16 / f16 W: x is rounded to W's dtype (nearest even) and the
 * products accumulate in f32 on tensor cores; f32 W: f32 throughout (the f32 fixtures' accuracy).
 * Any m, rows, cols >= 1 (kernels/ops_gemm.c): bf16 / f16 with cols % 8 == 0 and w, x 16-byte aligned run on
 * tensor cores, anything else (f32 W, odd cols such as stories260K's 172) on a SIMT fallback; the choice is a
 * function of the shape, dtype and that alignment. Deterministic; on tensor cores a token's row has the same bits
 * at every m up to 16, 32 or 64 by rows (the split-K kernel for few tokens) and at every m above (the prefill
 * tiles), not across (ops_gemm.c).
 * PPN_EINVAL also when out overlaps x. */
ppn_status ppn_op_gemm(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int m, int rows,
                       int cols, ppn_dptr bias, ppn_dptr res);
/* ppn_op_gemm on the tile kernel the caller names (PPN_K_GEMM or a PPN_K_GEMM_TC_*) instead of the op's choice:
 * for tests and benchmarks that compare the tiles. For gemm_tc_k, gemm_tc_kw and gemm_tc_kwx, p->ks and p->stages
 * name the K split and ring depth (kparams.h; 0: the op's choice), so a benchmark can sweep them; the other tiles
 * ignore them.
 * For gemm_tc_h, p->ctas names its persistent grid's CTAs (0: the op's, one a multiprocessor; capped at the tiles).
 * @return as ppn_op_gemm, and PPN_EINVAL for a kernel that is not a gemm tile or a tensor-core tile the shape,
 * dtype or alignment does not fit, a K split or depth the tile does not take, or ctas < 0; PPN_EUNSUPPORTED for
 * gemm_tc_h, gemm_tc_kwt, gemm_tc_k16t, gemm_tc_kx and gemm_tc_w where the stream's device runs no TMA kernels
 * (gpu.h: tma_ok). gemm_tc_w reads x as ppn_op_gemm_rows16 does (bf16 row-major). */
ppn_status ppn_op_gemm_tile(ppn_gpu *g, ppn_gstream *s, int kernel, const ppn_kp_gemm *p);
/* ppn_op_gemm with x16 [m, cols] in bf16 (bf16 W) in gemm_tc_kw16's layout (kparams.h, PPN_X16_POS): the rounding
 * ppn_op_gemm does to its f32 x done by x's producer (ppn_op_rmsnorm_rows_to, ppn_op_swiglu_rows_to with
 * PPN_DTYPE_BF16), so a token's row has the bits ppn_op_gemm gives it on the f32 x that was rounded, at half of x's
 * bytes and a quarter of its loads (gemm_tc_kw16; gemm_tc_k16 on the shapes of ppn_op_gemm_k16_fits; at tma_ok's
 * level 2, PPN_TMA=2, their TMA forms gemm_tc_kwt and gemm_tc_k16t, the same bits). Taken only on the shapes those
 * two name, else PPN_EUNSUPPORTED (and PPN_EINVAL as ppn_op_gemm, for unaligned w or x16). */
ppn_status ppn_op_gemm_x16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x16, int m,
                           int rows, int cols, ppn_dptr bias, ppn_dptr res);
/* 1 where ppn_op_gemm runs gemm_tc_kw (m tokens over rows x cols of wdt), wdt is bf16 and cols a multiple of 64:
 * the shapes ppn_op_gemm_x16 takes (a function of the shape alone, so a caller decides before x's producer runs). */
int ppn_op_gemm_x16_fits(int m, int rows, int cols, int wdt);
/* 1 where ppn_op_gemm runs gemm_tc_k (few tokens) under the same conditions: ppn_op_gemm_x16 takes these too
 * (gemm_tc_k16; the forward does where the door fuses: ops_gemm.c has its figures). */
int ppn_op_gemm_k16_fits(int m, int rows, int cols, int wdt);
/* out = x16 . W^T (+ bias)(+ res) as ppn_op_gemm, x16 [m, cols] in bf16 row-major (bf16 W, cols % 64 == 0): the
 * rounding of ppn_op_gemm's f32 x done by x's producer, on gemm_tc_w (kparams.h: no K split, one f32 accumulator in
 * k order, so gemm_tc_l's sums: PPN_GEMM_SUMS_TILE at every m). Only where ppn_op_gemm_rows16_fits (the stream's
 * device runs the TMA kernels; gemm_tc_w is sm_90a's), else PPN_EUNSUPPORTED; PPN_EINVAL as ppn_op_gemm, for
 * unaligned w or x16, and for a grid past 2^31 - 1 CTAs. The forward takes it where ppn_op_gemm_rows16_takes. */
ppn_status ppn_op_gemm_rows16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x16, int m,
                              int rows, int cols, ppn_dptr bias, ppn_dptr res);
int ppn_op_gemm_rows16_fits(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt);
/* Whether the forward takes ppn_op_gemm_rows16 for m tokens over rows x cols on s's device: where it fits and g's
 * PPN_GEMM_W level takes m (0: never; 1: always; 2: ops_gemm.c's rule on m and gemm_tc_w's grid; 3: that rule from
 * 256 tokens where ppn_op_gemm_sums is already PPN_GEMM_SUMS_TILE, so ppn_op_gemm's bits; 4, the default: 2's rule
 * but where the op runs gemm_tc_k or the device's PPN_GEMM_KX level gemm_tc_kx). A function of the shape and the
 * device alone, so a caller decides before x's producer runs. */
int ppn_op_gemm_rows16_takes(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt);
/* ppn_op_gemm_sums for the forward on s's device: PPN_GEMM_SUMS_TILE where ppn_op_gemm_rows16_takes (gemm_tc_w sums
 * as the large tiles), else ppn_op_gemm_sums. */
int ppn_op_gemm_sums_on(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt);
/* out [m, n] = silu(gate) * up, gate|up = x16 . W^T over W's 2 n rows (gate rows, then up rows; bf16), x16 in bf16
 * in gemm_tc_kw16's layout: ppn_op_gemm_x16 into [m, 2 n] f32 then ppn_op_swiglu_rows_to(odt) in one kernel
 * (gemm_swiglu; at tma_ok's level 2 gemm_swiglu_t), the same bits, without the gate|up round trip through memory.
 * odt: PPN_DTYPE_F32, or PPN_DTYPE_BF16 in gemm_tc_kw16's layout (the down projection's x). Taken only where
 * ppn_op_gemm_swiglu_fits; else PPN_EUNSUPPORTED. PPN_EINVAL: a bad dtype, pointer or size, out overlapping x16, w
 * or x16 not 16-byte aligned, out not 16-byte aligned. */
ppn_status ppn_op_gemm_swiglu(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr w, int wdt, ppn_dptr x16,
                              int m, int n, int cols);
/* 1 where ppn_op_gemm_x16 takes the gate|up GEMM (m tokens over 2 n rows x cols), n is a multiple of 64 and s's
 * device runs the TMA kernels (gpu.h: tma_ok; the kernel is sm_90a's): ppn_op_gemm_swiglu's shapes. */
int ppn_op_gemm_swiglu_fits(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt);
/* out [m, n] = silu(gate) * up as ppn_op_gemm_swiglu, x16 [m, cols] in bf16 row-major: ppn_op_gemm_rows16 into
 * [m, 2 n] f32 then ppn_op_swiglu_rows_to(odt) in one kernel (gemm_swiglu_w: gemm_tc_w's sums, PPN_GEMM_SUMS_TILE),
 * the same bits. odt: PPN_DTYPE_F32 or a bf16 form (PPN_ODT_BF16_ROWS: the down projection's x on gemm_tc_w). Taken
 * only where ppn_op_gemm_swiglu_rows16_fits (m <= PPN_GEMM_SWIGLU_W_MAX_M, n % 64 == 0, and where
 * ppn_op_gemm_rows16_fits the 2 n-row GEMM), else PPN_EUNSUPPORTED; PPN_EINVAL as ppn_op_gemm_swiglu. The forward
 * takes it for gate|up where ppn_op_gemm_swiglu_rows16_takes: it fits and the device's PPN_GEMM_W_SWIGLU level takes
 * m (0 never; 1 where ppn_op_gemm_rows16_takes the 2 n-row GEMM; 2, the default, also where PPN_GEMM_W is 4 and its
 * level 2 would take it). A function of the shape and the device, as ppn_op_gemm_rows16_takes. */
ppn_status ppn_op_gemm_swiglu_rows16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr w, int wdt,
                                     ppn_dptr x16, int m, int n, int cols);
int ppn_op_gemm_swiglu_rows16_fits(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt);
int ppn_op_gemm_swiglu_rows16_takes(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt);
/* The order in which ppn_op_gemm (and ppn_op_gemm_x16 and ppn_op_gemm_swiglu, which run where it runs gemm_tc_kw or
 * gemm_tc_k, with the same bits) sums an output of m tokens over a rows x cols matrix of wdt, with 16-byte aligned
 * w and x (the forward's): a function of the shape alone. Two m that get the same order on a matrix give a token's
 * row the same bits there; ops_gemm.c's head says which kernels share one:
 *   PPN_GEMM_SUMS_SIMT  the SIMT kernel (f32 weights, or cols not a multiple of 8): one order at every m;
 *   PPN_GEMM_SUMS_K     gemm_tc_k (few tokens): K split into PPN_GEMM_TC_K_KS(rows) ranges, added in a fixed order;
 *   PPN_GEMM_SUMS_KW    gemm_tc_kw, gemm_tc_kwx (and the x16 forms): PPN_GEMM_TC_KW_KS(rows) ranges of their own;
 *   PPN_GEMM_SUMS_TILE  the prefill tiles (l, m, s, h) and gemm_tc_k where it does not split: K in order. */
enum { PPN_GEMM_SUMS_SIMT, PPN_GEMM_SUMS_K, PPN_GEMM_SUMS_KW, PPN_GEMM_SUMS_TILE };
int ppn_op_gemm_sums(int m, int rows, int cols, int wdt);
/* Whether g's PPN_GEMM_KX level takes m tokens (0: never; 1: always; 2, the default: up to 16 and 65-80): where it
 * does and the device runs sm_90a code, ppn_op_gemm_x16 and ppn_op_gemm_swiglu run the middle split-K tile with the
 * operands swapped (gemm_tc_kx, gemm_swiglu_x: the same bits; kernels/ops_gemm.c). */
int ppn_gemm_kx_takes(const ppn_gpu *g, int m);
/* Per-head rmsnorm in place (the head_rmsnorm formula) of heads h0 .. h0 + n_heads - 1 of each of c rows of x,
 * a row being stride floats (Qwen3's q and k norms over the rows of the q|k|v projection). */
ppn_status ppn_op_head_rmsnorm_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int stride, int h0, int n_heads,
                                    int head_dim, ppn_dptr w, int wdt, float eps, int c);
/* Row i of qkv [c, (n_q + 2 n_kv) head_dim] (the q|k|v projection: q heads, k heads, v heads): its q and k heads
 * rotated in place at position pos0 + i (inv_freq and interleaved as ppn_op_rope_kv), then its rotated k and its
 * v stored into kv's pools (dtype kvdt, rounded to nearest even) at pos0 + i through its table.
 * 0 <= pos0, pos0 + c <= n_tbl << block_log2 (cap for an identity view); head_dim even, at most 256. The bits of
 * ppn_op_rope_kv run per row. A table view declares the blocks holding positions pos0 .. pos0 + c - 1. */
ppn_status ppn_op_rope_kv_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                               ppn_dptr inv_freq, int interleaved, const ppn_kv_view *kv, int pos0, int c);
/* Causal attention of c query rows over the caches (which already hold the chunk's own k and v): row i, at
 * position p = pos0 + i, for query head h with KV head g = h / (n_heads / n_kv):
 *   out[i, h] = softmax_j(q[i, h] . K[g, j] * scale) V[g, j], j = 0 .. p
 * q is the first n_heads * head_dim floats of each row of qkv (row stride (n_heads + 2 n_kv) head_dim), out
 * [c, n_heads * head_dim], which must not overlap qkv. kv as in ppn_op_rope_kv_rows (a table view declares the
 * blocks holding positions 0 .. pos0 + c - 1). head_dim even, at most 256. bf16 / f16 caches with head_dim 64 or
 * 128 run on tensor cores (q and the softmax weights rounded to the cache's dtype, f32 accumulation; the pools
 * 16-byte and qkv, out 8-byte aligned, else PPN_EINVAL); f32 caches and other head_dims on a slower f32 path. */
ppn_status ppn_op_attn_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, const ppn_kv_view *kv,
                            int n_heads, int n_kv, int head_dim, float scale, int pos0, int c);
/* The same with out of dtype odt (PPN_DTYPE_F32 or PPN_DTYPE_BF16, as ppn_op_rmsnorm_rows_to: the o GEMM's bf16 x;
 * out is then [c, n_heads * head_dim] bf16). */
ppn_status ppn_op_attn_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv,
                               const ppn_kv_view *kv, int n_heads, int n_kv, int head_dim, float scale, int pos0,
                               int c);
/* out[i, :] = silu(gu[i, 0 .. n)) * gu[i, n .. 2n) for i < c: gu [c, 2n] (the gate|up GEMM's rows), out [c, n],
 * a separate buffer. */
ppn_status ppn_op_swiglu_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr gu, int n, int c);
/* The same with out of dtype odt (PPN_DTYPE_F32 or PPN_DTYPE_BF16, as ppn_op_rmsnorm_rows_to). */
ppn_status ppn_op_swiglu_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr gu, int n, int c);
/* out_i32[i] = argmax of row i of x [rows, n] (ppn_op_argmax_wide's rule: lowest index on ties, -1 for a row
 * holding a NaN or an infinity), one block per row; out must not overlap x. */
ppn_status ppn_op_argmax_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out_i32, ppn_dptr x, int n, int rows);

/* ---------------------------------------------------------------------------------------------------------
 * Batched decode: B sequences of one layer in one launch, one row each (kparams.h, "Batched decode"). Row i's
 * position and table are segs_d[i] (ppn_kseg, device memory: a launch's parameters stay fixed while the sequences
 * grow); segs_h is its host copy, and tbl_h[i], n_tbl[i] the host copy of row i's table (as ppn_kv_view's tbl_h,
 * n_tbl; ignored for a row whose segs_h[i].tbl is 0, the identity; tbl_h and n_tbl may be NULL when every row's
 * is). The ops check every row (0 <= pos < n_tbl[i] << block_log2, or < cap for an identity row; table entries
 * in the pool; else PPN_EINVAL naming the row) and declare every held block of every row's table for every KV
 * head (an identity row: the whole pools), the tables and segs_d as read. 1 <= B <= 65535.
 * --------------------------------------------------------------------------------------------------------- */

/* Row i of qkv [B, (n_q + 2 n_kv) head_dim]: its q and k heads rotated in place at segs[i].pos, then its rotated
 * k and its v stored into the pools through segs[i].tbl: ppn_op_rope_kv_rows's row, with the same bits. */
ppn_status ppn_op_rope_kv_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                                ppn_dptr inv_freq, int interleaved, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B);
/* out [B, n_heads head_dim]: row i's q (the first n_heads head_dim floats of row i of qkv, whose rows are
 * (n_heads + 2 n_kv) head_dim floats) attends positions 0 .. segs[i].pos of its own sequence (causal, GQA; the
 * pools already hold this step's k and v: ppn_op_rope_kv_batch first). Every CTA is one of ppn_op_attn's, over
 * (KV head, position split, row): so each row is ppn_op_attn at its position with this n_split, the same bits
 * (on the CPU reference and on CUDA), whatever B and the other rows are. n_split (1..64) is the caller's: a
 * model keeps one (ppn_op_attn_split) so a row's bits never depend on the batch. part: scratch of
 * ppn_op_attn_batch_scratch_bytes(B, n_heads, n_split, head_dim) bytes whose counters are zero (zero it once;
 * every launch leaves them zero), used by one stream at a time. out must not overlap qkv. */
ppn_status ppn_op_attn_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, int n_heads, int n_kv,
                             int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                             const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                             ppn_dptr part, int n_split);
/* ppn_op_attn_batch with each row's rotary inside (ppn_op_attn_rope per row: q rotated in registers, k rotated and
 * stored with v into the pools at the row's position, qkv only read): the bits of ppn_op_rope_kv_batch then
 * ppn_op_attn_batch, in one launch. PPN_EUNSUPPORTED where !ppn_op_attn_rope_fits(head_dim, interleaved). */
ppn_status ppn_op_attn_rope_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, int n_heads, int n_kv,
                                  int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                  const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                  ppn_dptr part, int n_split, ppn_dptr inv_freq, int interleaved);
/* The same two with out [B, n_heads head_dim] of dtype odt: PPN_DTYPE_F32 (as above) or PPN_DTYPE_BF16, each value
 * rounded to nearest even in gemm_tc_kw16's layout (kparams.h, PPN_X16_POS; n_heads head_dim % 64 == 0), for
 * ppn_op_gemm_x16 (the o projection: the bits gemm_tc_kw gives from the f32 rows). */
ppn_status ppn_op_attn_batch_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads,
                                int n_kv, int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                ppn_dptr part, int n_split);
ppn_status ppn_op_attn_rope_batch_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads,
                                     int n_kv, int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                     const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                     ppn_dptr part, int n_split, ppn_dptr inv_freq, int interleaved);
/* ppn_op_attn_batch_to on tensor cores (ppn_k_attn_batch_tc): the caches are only read (the rotary and the k/v
 * store ran before, ppn_op_rope_kv_batch), q and the softmax weights rounded to bf16; the same grid, splits and
 * scratch. PPN_EUNSUPPORTED where !ppn_op_attn_batch_tc_fits (a bf16 cache, head_dim 64 or 128, at most 8 query
 * heads a KV head); PPN_EINVAL for qkv not 16-byte aligned and for what ppn_op_attn_batch_to refuses. */
int ppn_op_attn_batch_tc_fits(int n_heads, int n_kv, int head_dim, int kvdt);
ppn_status ppn_op_attn_batch_tc(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads, int n_kv,
                                int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                ppn_dptr part, int n_split);
/* Bytes of ppn_op_attn_batch's scratch: B rows of ppn_op_attn_scratch_bytes (0 for a non-positive argument). */
size_t ppn_op_attn_batch_scratch_bytes(int B, int n_heads, int n_split, int head_dim);

#endif
