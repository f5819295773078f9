/* ops.h - typed launch wrappers: build the params struct, the declared accesses (for the sim checker) and the
 * cuda geometry of each kernel, then call g->ops->launch. The forward pass calls only these.
 * Sizes are element counts; wdt is the weight dtype (PPN_DTYPE_*). Each returns the launch's status. */
#ifndef PPN_OPS_H
#define PPN_OPS_H

#include "core/device/gpu.h"
#include "kernels/ktable.h"

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
/* rope over qk = [q: n_q heads][k: n_kv heads], then the rotated k and v [n_kv, head_dim] stored into the caches
 * at hdr->pos, in one launch. kvdt (here and in attention): the caches' element dtype, PPN_DTYPE_F32/BF16/F16
 * (kparams.h, KV caches). */
ppn_status ppn_op_rope_kv(ppn_gpu *g, ppn_gstream *s, ppn_dptr qk, int n_q, int n_kv, int head_dim,
                          ppn_dptr inv_freq, int interleaved, ppn_dptr hdr, ppn_dptr kc, ppn_dptr vc, ppn_dptr v,
                          int ctx, int kvdt);
ppn_status ppn_op_head_rmsnorm(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int n_heads, int head_dim, ppn_dptr w,
                               int wdt, float eps);
/* Decode attention split over positions into n_split CTAs per KV head (1..64; see ppn_kp_attn). part: scratch of
 * ppn_op_attn_scratch_bytes(n_heads, n_split, head_dim) bytes whose counters are zero (zero it once at
 * allocation; every launch leaves them zero), used by one stream at a time. */
ppn_status ppn_op_attn(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr q, ppn_dptr kc, ppn_dptr vc,
                       int n_heads, int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part,
                       int n_split, int kvdt);
/* The same attention with the rotary fused in (see ppn_kp_attn): qkv holds the unrotated [q: n_heads heads;
 * k: n_kv; v: n_kv] of the q|k|v projection and is only read; the rotated k and v are stored into kc, vc at
 * hdr->pos, as ppn_op_rope_kv stores them. The same bits as rope_kv then attn. Also PPN_EINVAL for an odd
 * head_dim or no inv_freq, and PPN_EUNSUPPORTED for a shape ppn_op_attn_rope_fits refuses. */
ppn_status ppn_op_attn_rope(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                            int n_heads, int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part,
                            int n_split, ppn_dptr inv_freq, int interleaved, int kvdt);
/* 1 when ppn_op_attn_rope takes this head_dim and rotary convention: any even head_dim up to 128 with
 * interleaved pairs; 2, 4, .., 32, 64 or 128 with rotated halves (the forward pass fuses only then; else
 * rope_kv + attn). */
int ppn_op_attn_rope_fits(int head_dim, int interleaved);
/* Bytes of one layer's k (or v) cache [n_kv, ctx, head_dim] of dtype kvdt (0 for a non-positive size or an
 * unknown dtype): what the sequence allocates and what the ops above declare. */
size_t ppn_op_kv_cache_bytes(int n_kv, int head_dim, int ctx, int kvdt);
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
 * for tests and benchmarks that compare the tiles. @return as ppn_op_gemm, and PPN_EINVAL for a kernel that is
 * not a gemm tile or a tensor-core tile the shape, dtype or alignment does not fit. */
ppn_status ppn_op_gemm_tile(ppn_gpu *g, ppn_gstream *s, int kernel, const ppn_kp_gemm *p);
/* Per-head rmsnorm in place (the head_rmsnorm formula) of heads h0 .. h0 + n_heads - 1 of each of c rows of x,
 * a row being stride floats (Qwen3's q and k norms over the rows of the q|k|v projection). */
ppn_status ppn_op_head_rmsnorm_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int stride, int h0, int n_heads,
                                    int head_dim, ppn_dptr w, int wdt, float eps, int c);
/* Row i of qkv [c, (n_q + 2 n_kv) head_dim] (the q|k|v projection: q heads, k heads, v heads): its q and k heads
 * rotated in place at position pos0 + i (inv_freq and interleaved as ppn_op_rope_kv), then its rotated k and its
 * v stored into the caches kc, vc [n_kv, ctx, head_dim] (dtype kvdt, rounded to nearest even) at pos0 + i.
 * 0 <= pos0, pos0 + c <= ctx; head_dim even, at most 256. The bits of ppn_op_rope_kv run per row. */
ppn_status ppn_op_rope_kv_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                               ppn_dptr inv_freq, int interleaved, ppn_dptr kc, ppn_dptr vc, int ctx, int kvdt,
                               int pos0, int c);
/* Causal attention of c query rows over the caches (which already hold the chunk's own k and v): row i, at
 * position p = pos0 + i, for query head h with KV head g = h / (n_heads / n_kv):
 *   out[i, h] = softmax_j(q[i, h] . K[g, j] * scale) V[g, j], j = 0 .. p
 * q is the first n_heads * head_dim floats of each row of qkv (row stride (n_heads + 2 n_kv) head_dim), out
 * [c, n_heads * head_dim], which must not overlap qkv. kc, vc as in ppn_op_rope_kv_rows. 0 <= pos0, pos0 + c <= ctx;
 * head_dim even, at most 256. bf16 / f16 caches with head_dim 64 or 128 run on tensor cores (q and the softmax
 * weights rounded to the cache's dtype, f32 accumulation; kc, vc 16-byte and qkv, out 8-byte aligned, else
 * PPN_EINVAL); f32 caches and other head_dims on a slower f32 path. */
ppn_status ppn_op_attn_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                            int n_heads, int n_kv, int head_dim, int ctx, int kvdt, float scale, int pos0, int c);
/* out[i, :] = silu(gu[i, 0 .. n)) * gu[i, n .. 2n) for i < c: gu [c, 2n] (the gate|up GEMM's rows), out [c, n],
 * a separate buffer. */
ppn_status ppn_op_swiglu_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr gu, int n, int c);

#endif
