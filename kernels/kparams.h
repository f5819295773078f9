/* kparams.h - the parameter struct of every kernel, shared by the CPU reference (C) and CUDA (.cu).
 *
 * Each kernel takes one of these by value. Device pointers are uint64_t (ppn_dptr). Activations are f32;
 * weights are stored in wdt (PPN_DTYPE_*). Every kernel is deterministic: a fixed reduction order, so the same
 * inputs give the same bits on every run (the pipeline gates compare bits).
 */
#ifndef PPN_KPARAMS_H
#define PPN_KPARAMS_H

#include <stdint.h>
#include "ppn.h" /* ppn_dtype: weights and KV elements */


/* The step header: lives in device memory, written once per step by stage 0 and carried across boundaries.
 * Kernels read pos/token from it, so a step's position is ordered by the same event chain as its data. */
typedef struct ppn_step_hdr {
    int32_t pos;   /* position of the token being fed */
    int32_t token; /* token id being fed */
    int32_t seq;   /* sequence id */
    int32_t step;  /* step counter */
} ppn_step_hdr;

/* out[dim] = table[hdr->token, :]   (table: [vocab, dim] in wdt) */
typedef struct { uint64_t out, table, hdr; int32_t dim, vocab, wdt; } ppn_kp_embed;

/* out[n] = in[n] * rsqrt(mean(in^2) + eps) * w[n]   (w in wdt) */
typedef struct { uint64_t out, in, w; int32_t n, wdt; float eps; } ppn_kp_rmsnorm;

/* Dynamic shared memory a kernel may ask for: the cuda backend opts every kernel in to this much (the default
 * without the opt-in is 48 KB; an H200 block may have 227 KB). */
#define PPN_DYN_SMEM_MAX (96u * 1024u)

/* out[r] = (res ? res[r] : 0) + (bias ? bias[r] : 0) + sum_c W[r, c] * xin[c]
 * W: [rows, cols] row-major in wdt; bias in wdt (0 = none); res f32 (0 = none; may alias out).
 * xin is x as xmode says; a fused input is computed once per block into shared memory and never stored (the
 * fusion that saves a launch and a round trip of the activation per norm):
 *   PPN_MV_X_PLAIN    xin[c] = x[c]
 *   PPN_MV_X_RMSNORM  xin[c] = (x[c] * r) * nw[c], r = 1 / sqrt(mean(x[0..cols)^2) + eps): the rmsnorm kernel's
 *                     formula; nw (norm weight) in wdt
 * (SwiGLU fused the same way cost more on the H200 than the swiglu launch it saved: every block re-reads all of
 * gate and up; docs/PERF.md. That mode is gone; 2 is not reused.) */
enum { PPN_MV_X_PLAIN = 0, PPN_MV_X_RMSNORM = 1 };
typedef struct { uint64_t out, w, x, bias, res, nw; int32_t rows, cols, wdt, xmode; float eps; } ppn_kp_matvec;

/* Small matrix-matrix product for m tokens at once (prefill, batches): for t < m,
 * out[t, r] = (res ? res[t, r] : 0) + (bias ? bias[r] : 0) + sum_c W[r, c] * x[t, c]
 * x: [m, cols], out and res: [m, rows] (f32, row-major); W and bias as in matvec. Each (t, r) is reduced in the
 * same order as a matvec of token t, so on one backend the rows of a matmat equal m matvecs bit for bit on the
 * CPU reference (the CUDA kernel keeps its own fixed order). m <= PPN_MATMAT_MAX_M per launch. */
#define PPN_MATMAT_MAX_M 8
typedef struct { uint64_t out, w, x, bias, res; int32_t rows, cols, m, wdt; } ppn_kp_matmat;

/* The prefill GEMM (ppn_op_gemm): for i < m, r < rows,
 * out[i, r] = (res ? res[i, r] : 0) + (bias ? bias[r] : 0) + sum_k W[r, k] x[i, k]
 * x [m, cols] f32; out and res [m, rows] f32 (res may alias out); W [rows, cols] row-major and bias [rows] in wdt.
 * bf16 / f16 W: x is rounded to wdt (nearest even) and the products (exact in f32) are summed in f32; f32 W:
 * f32 throughout. These kernels take these params (one CPU reference, gemm_cpu.c, serves them all):
 *   gemm       SIMT tiles, any shape, dtype and alignment (f32 weights, odd shapes)
 *   gemm_tc_l  tensor cores, bf16 / f16 W, cols % 8 == 0, w and x 16-byte aligned: 128 x 256 output tiles
 *              (warpgroup MMA on sm_90a, mma.sync m16n8k16 on sm_80)
 *   gemm_tc_m  the same, 64 x 128 tiles (small m, or too few larger tiles to fill the GPU)
 *   gemm_tc_s  the same, 128 x 128 ("square") tiles: correct, timed by tests/gpu, not chosen by the op (on the
 *              H200 the better of the other two won all but one shape; ops_gemm.c)
 *   gemm_tc_k  the same, for few tokens (batched decode): 64 weight rows x up to 32 tokens per CTA, K split
 *              over KS(rows) CTAs of a cluster whose partial sums are added in k order (sm_90; elsewhere the
 *              first CTA of each tile sums all of K and the others return)
 *   gemm_tc_kw the same, for a few dozen tokens: the middle tile (64 tokens x 128 weight rows, warpgroup MMA on
 *              sm_90a) with K split over KW_KS(rows) CTAs of a cluster as gemm_tc_k splits it (elsewhere the
 *              first CTA of each tile sums all of K on mma.sync and the others return)
 *   gemm_tc_kwx gemm_tc_kw with x copied through its ring beside W (sm_90a): the same tile, split and bits
 *   gemm_tc_k16 gemm_tc_k on x given in bf16 (W bf16 only) in gemm_tc_kw16's layout (PPN_X16_POS below): the same
 *              tile, split and bits on the x its producer rounded
 *   gemm_tc_kw16 gemm_tc_kw on x given in bf16 (W bf16 only) in its fragment layout (PPN_X16_POS below): x's
 *              producer (the rows norm, SwiGLU: odt below) rounded it as gemm_tc_kw rounds, so the same tile,
 *              split and bits on the x it rounded
 *   gemm_tc_k16t gemm_tc_k16 with W and x brought in by the tensor memory accelerator and no block-wide barrier in
 *              its k-loop (sm_90a only): the same tile, split and bits
 *   gemm_tc_kwt gemm_tc_kw16 with W brought in by the tensor memory accelerator and no block-wide barrier in its
 *              k-loop (sm_90a only): the same tile, split and bits
 *   gemm_swiglu gemm_tc_kw16 over a gate|up matrix (gate rows, then as many up rows) with SwiGLU in its
 *              epilogue: out [m, rows / 2] = silu(gate) * up, f32 or bf16 in PPN_X16_POS's layout (odt); the same
 *              split and sums, so the bits of gemm_tc_kw16 then swiglu rows (sm_90a only)
 *   gemm_swiglu_t gemm_swiglu on gemm_tc_kwt's k-loop: the same bits (sm_90a only)
 *   gemm_tc_kx gemm_tc_kw16's split and sums with W as the warpgroup MMA's A operand and up to 128 tokens as N, both
 *              from shared memory: the same bits, one pass over W for 65-128 tokens (sm_90a only; PPN_GEMM_KX=1)
 *   gemm_tc_w  no K split: a CTA owns 64 (128) weight rows and BT tokens (32-256), W and x (bf16, row-major) come
 *              through the tensor memory accelerator into a deep ring, W is the warpgroup MMA's A operand and the
 *              tokens its N; one f32 accumulator through k16 steps in k order: the large tiles' sums (sm_90a only)
 *   gemm_swiglu_x gemm_swiglu on gemm_tc_kx's tile: the same bits (sm_90a only)
 * Only gemm_tc_k and gemm_tc_kw (and gemm_tc_kwx) split a sum over K: elsewhere every output is one thread's sum in
 * k order (SIMT: a fmaf chain; tensor cores: one f32 accumulator through k16 steps in k order, which on the H200
 * gave the same bits from both tiles and both instruction families). gemm_tc_k sums each of KS(rows) k-ranges so
 * (the ranges depend on rows and cols alone), then adds the partial sums in k order: its bits are the same for
 * every m, and where KS is 1 (the lm heads) they are the tiles' bits. gemm_tc_kw does the same over its own
 * KW_KS(rows) ranges (its bits: the same for every m, not gemm_tc_k's), and gemm_tc_kwx gives gemm_tc_kw's. */
/* ks and stages: gemm_tc_k's and gemm_tc_kw's (gemm_tc_kwx's) K split (CTAs of a cluster per weight tile: 1, 2, 4
 * or 8) and ring depth (k-tiles: gemm_tc_k 3 or 4; gemm_tc_kw and gemm_tc_kwx 3), chosen by the op (ops_gemm.c; a
 * forced tile may name them: ppn_op_gemm_tile); the other kernels ignore them. The kernels read them from here, so
 * the host's table is the only place they are chosen. */
/* ctas: gemm_tc_h's grid, CTAs that walk its tiles gridDim.x apart (0: the op's choice, one a multiprocessor up to
 * the tiles; a forced tile may name another count, capped at the tiles: ppn_op_gemm_tile); the other kernels
 * ignore it. */
/* A tensor map as the driver encodes it (CUtensorMap: 128 bytes, 64-byte aligned; opaque here). */
#ifdef __cplusplus
#define PPN_ALIGN64 alignas(64)
#else
#define PPN_ALIGN64 _Alignas(64)
#endif
typedef struct { PPN_ALIGN64 uint64_t opaque[16]; } ppn_tmap;
typedef struct { uint64_t out, w, x, bias, res; int32_t m, rows, cols, wdt, ks, stages, ctas; } ppn_kp_gemm;
typedef ppn_kp_gemm ppn_kp_gemm_tc_l;
typedef ppn_kp_gemm ppn_kp_gemm_tc_m;
typedef ppn_kp_gemm ppn_kp_gemm_tc_s;
typedef ppn_kp_gemm ppn_kp_gemm_tc_k;
typedef ppn_kp_gemm ppn_kp_gemm_tc_k16; /* x [m, cols] in bf16 (PPN_X16_POS), not f32: see gemm_tc_k16 above */
typedef ppn_kp_gemm ppn_kp_gemm_tc_kw;
typedef ppn_kp_gemm ppn_kp_gemm_tc_kwx;
typedef ppn_kp_gemm ppn_kp_gemm_tc_kw16; /* x [m, cols] in bf16, not f32: see gemm_tc_kw16 above */
typedef ppn_kp_gemm ppn_kp_gemm_tc_kx; /* x as gemm_tc_kw16's (bf16); gemm_swiglu_x takes ppn_kp_gemm_swiglu */
/* gemm_tc_k16t: gemm_tc_k16's params, and wmap: W as gemm_tc_kwt's below; xmap: x [m, cols] bf16 (row pitch cols x 2
 * bytes) in boxes of 64 columns x PPN_GEMM_TC_K_MP(m) rows, the 128-byte swizzle, zeros past the matrix. */
typedef struct { ppn_tmap wmap, xmap; ppn_kp_gemm g; } ppn_kp_gemm_tc_k16t;
/* gemm_tc_kwt: gemm_tc_kw16's params, and wmap: W [rows, cols] bf16 (row pitch cols x 2 bytes) in boxes of 64 columns
 * x 64 rows (PPN_GEMM_TC_KWT_BOX), the 128-byte swizzle, zeros past the matrix. */
typedef struct { ppn_tmap wmap; ppn_kp_gemm g; } ppn_kp_gemm_tc_kwt;
/* g: gemm_tc_kw16's over the gate|up matrix (rows = 2 n, rows / 2 % 64 == 0, no bias or res); out [m, n] in odt
 * (PPN_DTYPE_F32 or PPN_DTYPE_BF16), 16-byte aligned. */
typedef struct { ppn_kp_gemm g; int32_t odt, pad; } ppn_kp_gemm_swiglu;
typedef ppn_kp_gemm_swiglu ppn_kp_gemm_swiglu_x; /* gemm_swiglu_x: gemm_swiglu's */
/* gemm_swiglu_t: gemm_swiglu's, and wmap: the gate|up matrix as gemm_tc_kwt's. */
typedef struct { ppn_tmap wmap; ppn_kp_gemm g; int32_t odt, pad; } ppn_kp_gemm_swiglu_t;
/* gemm_tc_kw16's x: bf16 rows of cols % 64 == 0 elements laid out by 64-element blocks, element k of a row at
 * PPN_X16_POS(k): within a block, k = 16 s + 8 h + 2 q + e (s < 4, h < 2, q < 4, e < 2) sits at 16 q + 4 s + 2 h + e,
 * so the 16 elements a thread's wgmma fragments take from a 64-column k-tile (those of its q = lane % 4) lie
 * together and come in two 16-byte loads, whole 32-byte sectors for the warp. The producers (rmsnorm and SwiGLU
 * rows with odt bf16) write it so; nothing else reads it. */
#define PPN_X16_POS(k)                                                                                            \
    (((k) & ~63) | ((((k) >> 1) & 3) << 4) | ((((k) >> 4) & 3) << 2) | ((((k) >> 3) & 1) << 1) | ((k) & 1))
/* The producers' other bf16 form (their odt): PPN_ODT_BF16_ROWS, row-major (element k of a row at k), what gemm_tc_w
 * reads (ppn_op_gemm_rows16; a TMA box cannot read PPN_X16_POS's order); rounded alike, rows of n % 64 == 0 as
 * PPN_DTYPE_BF16's. PPN_X16_AT(odt, k): element k's place in a row of either bf16 form. */
#define PPN_ODT_BF16_ROWS 16
#define PPN_X16_AT(odt, k) ((odt) == PPN_ODT_BF16_ROWS ? (k) : PPN_X16_POS(k))
/* Each gemm kernel's tile (BM tokens x BN weight rows of out per CTA), threads and pipeline: the contract
 * between ops_gemm.c's geometry and gemm.cu. A 1-D grid of ceil(m / BM) * ceil(rows / BN) CTAs; the tensor-core
 * kernels take PPN_GEMM_TC_SMEM(BM, BN, STAGES) bytes of dynamic shared memory, the SIMT one none. */
#define PPN_GEMM_SIMT_BM 64
#define PPN_GEMM_SIMT_BN 64
#define PPN_GEMM_SIMT_THREADS 256
#define PPN_GEMM_TC_BK 32 /* k per pipeline stage: two m16n8k16 steps */
#define PPN_GEMM_TC_L_BM 128
#define PPN_GEMM_TC_L_BN 256
#define PPN_GEMM_TC_L_THREADS 256
#define PPN_GEMM_TC_L_STAGES 4
#define PPN_GEMM_TC_M_BM 64
#define PPN_GEMM_TC_M_BN 128
#define PPN_GEMM_TC_M_THREADS 128
#define PPN_GEMM_TC_M_STAGES 4
#define PPN_GEMM_TC_S_BM 128
#define PPN_GEMM_TC_S_BN 128
#define PPN_GEMM_TC_S_THREADS 256
#define PPN_GEMM_TC_S_STAGES 4
#define PPN_GEMM_TC_SMEM(bm, bn, stages) ((unsigned)((bm) + (bn)) * PPN_GEMM_TC_BK * 2u * (unsigned)(stages))
/* gemm_tc_k: clusters of CLUSTER CTAs; a cluster holds CLUSTER / KS(rows) weight tiles of BN rows, each summed
 * over K in KS(rows) k-ranges by as many CTAs. KS fills about one wave (528 CTAs: 4 a multiprocessor on the
 * H200's 132, as many as fit at m = 16) where the tiles alone leave SMs idle: 8 up to 66 tiles, 4 up to 132, 2
 * up to 264; above, waves of shorter CTAs beat one long wave (llama-8b gate|up, 448 tiles: 94% of the copy
 * floor at KS 4, 79% at KS 2; H200, 2026-12-01), so 4, and 1 from 1024 tiles (the lm heads: 96% either way, and
 * KS 1 gives the other tiles' bits). A 1-D grid of ceil(ceil(rows / BN) / (CLUSTER / KS)) x ceil(m / MG)
 * clusters (the token group fastest); shared memory: STAGES(m) x (a W k-tile of BN x KT 16-bit elements, then an
 * x k-tile of MP(m) = ceil8(min(m, MG)) rows of XROW f32). */
#define PPN_GEMM_TC_K_BN 64
#define PPN_GEMM_TC_K_MG 32
#define PPN_GEMM_TC_K_KT 64
#define PPN_GEMM_TC_K_THREADS 128
#define PPN_GEMM_TC_K_CLUSTER 8
#define PPN_GEMM_TC_K_XROW (PPN_GEMM_TC_K_KT + 8) /* 72 = 8 mod 32 words: the fragments' float2 reads miss no bank */
#define PPN_GEMM_TC_K_MP(m) ((((m) < PPN_GEMM_TC_K_MG ? (unsigned)(m) : (unsigned)PPN_GEMM_TC_K_MG) + 7u) & ~7u)
/* The ring's depth: 4 k-tiles up to 8 tokens (42 KB: 5 CTAs a multiprocessor), 3 above (38 KB at 16 tokens:
 * still 5, so KS's 512-CTA waves stay whole; 52 KB at 32: 4). */
#define PPN_GEMM_TC_K_STAGES(m) (PPN_GEMM_TC_K_MP(m) <= 8u ? 4u : 3u)
#define PPN_GEMM_TC_K_TILES(rows) (((unsigned)(rows) + PPN_GEMM_TC_K_BN - 1u) / PPN_GEMM_TC_K_BN)
#define PPN_GEMM_TC_K_KS(rows)                                                                                    \
    (PPN_GEMM_TC_K_TILES(rows) <= 66u    ? 8u                                                                     \
     : PPN_GEMM_TC_K_TILES(rows) <= 132u ? 4u                                                                     \
     : PPN_GEMM_TC_K_TILES(rows) <= 264u ? 2u                                                                     \
     : PPN_GEMM_TC_K_TILES(rows) < 1024u ? 4u : 1u)
#define PPN_GEMM_TC_K_SMEM_S(m, stages)                                                                           \
    ((unsigned)(stages) *                                                                                       \
     ((unsigned)PPN_GEMM_TC_K_BN * PPN_GEMM_TC_K_KT * 2u + PPN_GEMM_TC_K_MP(m) * PPN_GEMM_TC_K_XROW * 4u))
#define PPN_GEMM_TC_K_SMEM(m) PPN_GEMM_TC_K_SMEM_S(m, PPN_GEMM_TC_K_STAGES(m))
/* gemm_tc_k16's ring: the same stages, x rows of 64 bf16 (128 bytes, unpadded: its 16-byte chunks swizzled). */
#define PPN_GEMM_TC_K16_SMEM_S(m, stages)                                                                         \
    ((unsigned)(stages) * ((unsigned)PPN_GEMM_TC_K_BN * PPN_GEMM_TC_K_KT * 2u + PPN_GEMM_TC_K_MP(m) * PPN_GEMM_TC_K_KT * 2u))
/* gemm_tc_k16t's: gemm_tc_k16's ring, then a full and an empty mbarrier (8 bytes each) per stage. */
#define PPN_GEMM_TC_K16T_SMEM_S(m, stages) (PPN_GEMM_TC_K16_SMEM_S(m, stages) + (unsigned)(stages) * 16u)
/* gemm_tc_kw: the middle tile's BM x BN (64 tokens x 128 weight rows), threads and shared memory, in clusters of
 * CLUSTER CTAs laid out as gemm_tc_k's: a cluster holds CLUSTER / KW_KS(rows) weight tiles, each summed over K in
 * KW_KS(rows) k-ranges of whole 64-column k-tiles, ceil(ceil(cols / 64) / KS) a range, whose partial sums are
 * added in k order through distributed shared memory. KS fills about one wave (4 CTAs an SM fit: 528 on the
 * H200): 8 up to 66 tiles, 4 up to 132, 2 up to 264, 1 above. A 1-D grid of
 * ceil(ceil(rows / BN) / (CLUSTER / KW_KS)) x ceil(m / BM) clusters (the token group fastest). */
#define PPN_GEMM_TC_KW_TILES(rows) (((unsigned)(rows) + PPN_GEMM_TC_M_BN - 1u) / PPN_GEMM_TC_M_BN)
#define PPN_GEMM_TC_KW_KS(rows)                                                                                   \
    (PPN_GEMM_TC_KW_TILES(rows) <= 66u    ? 8u                                                                    \
     : PPN_GEMM_TC_KW_TILES(rows) <= 132u ? 4u                                                                    \
     : PPN_GEMM_TC_KW_TILES(rows) <= 264u ? 2u : 1u)
/* Its ring: STAGES k-tiles of BN x 64 16-bit W elements (x goes to registers); at least the middle tile's
 * shared memory, which the sm_80 code (mma.sync, the middle tile's ring) takes. */
#define PPN_GEMM_TC_KW_STAGES 3u
#define PPN_GEMM_TC_KW_SMEM(stages)                                                                               \
    ((unsigned)(stages) * PPN_GEMM_TC_M_BN * 64u * 2u >                                                           \
             PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES)                          \
         ? (unsigned)(stages) * PPN_GEMM_TC_M_BN * 64u * 2u                                                       \
         : PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES))

/* gemm_tc_kwt (and gemm_swiglu): gemm_tc_kw's ring of W k-tiles (BN x 64 bf16 each, two 64-row TMA boxes), then a
 * full and an empty mbarrier (8 bytes each) per stage. */
#define PPN_GEMM_TC_KWT_BOX 64
#define PPN_GEMM_TC_KWT_STAGES 3u
#define PPN_GEMM_TC_KWT_SMEM (PPN_GEMM_TC_KWT_STAGES * (PPN_GEMM_TC_M_BN * 64u * 2u + 16u))

/* gemm_tc_kx and gemm_swiglu_x (sm_90a): gemm_tc_kw16's and gemm_swiglu's grid of clusters, K split and sums
 * (their bits) with W as the warpgroup MMA's A operand and the tokens as N, groups of BM tokens a CTA (one pass
 * over W up to 128): a ring of STAGES x (a W k-tile of 128 x 64 bf16, then x's NX(m) rows of the k-tile in bf16,
 * NX(m) = min(m, BM) rounded up to 16), 72-128 KB, above the set's opt-in (ktable.c asks it for these two). */
#define PPN_GEMM_TC_KX_BM 128
#define PPN_GEMM_TC_KX_STAGES 4u
#define PPN_GEMM_TC_KX_NX(m)                                                                                      \
    ((((unsigned)(m) < (unsigned)PPN_GEMM_TC_KX_BM ? (unsigned)(m) : (unsigned)PPN_GEMM_TC_KX_BM) + 15u) & ~15u)
#define PPN_GEMM_TC_KX_SMEM(m)                                                                                    \
    (PPN_GEMM_TC_KX_STAGES * (PPN_GEMM_TC_M_BN * 64u * 2u + PPN_GEMM_TC_KX_NX(m) * 128u))
#define PPN_GEMM_TC_KX_SMEM_MAX PPN_GEMM_TC_KX_SMEM(PPN_GEMM_TC_KX_BM)

/* gemm_tc_kwx: gemm_tc_kw's tile, grid and K split with x copied through the ring beside W: STAGES x (a W k-tile
 * of 128 x 64 16-bit elements, then x's 64 rows of the k-tile as f32, XROW floats a row) = 102 KB, above the
 * set's opt-in (ktable.c asks it for this kernel alone). */
#define PPN_GEMM_TC_KWX_XROW 72 /* 64 + 8: rows 8 mod 32 words apart, so the fragments' float2 reads miss no bank */
#define PPN_GEMM_TC_KWX_STAGES 3u
#define PPN_GEMM_TC_KWX_SMEM                                                                                      \
    (PPN_GEMM_TC_KWX_STAGES * (PPN_GEMM_TC_M_BN * 64u * 2u + PPN_GEMM_TC_M_BM * PPN_GEMM_TC_KWX_XROW * 4u))

/* gemm_tc_h (sm_90a, Hopper): the large tile (128 tokens x 256 weight rows) warp-specialized. One producer
 * warpgroup's thread streams x (f32) and W (16-bit) k-tiles of 64 columns into a ring of STAGES through the tensor
 * memory accelerator (TMA: bulk copies described by tensor maps, zero-filled past the matrix, landing in the
 * 128-byte swizzle the tensor cores read); two consumer warpgroups (64 tokens each) wait on each stage's
 * mbarrier, round their x to W's dtype into the A fragments (registers) and keep one k-tile's warpgroup MMA in
 * flight while they build the next one's. The same sum as gemm_tc_l's (k16 steps in k order into one f32
 * accumulator): the same bits. Its params add the two tensor maps (encoded by the backend: tmap_encode, gpu.h)
 * to the GEMM's; its CPU reference reads x and W through the maps, so a map that does not describe the
 * operands shows on the sim. Taken for gemm_tc_l's shapes where the device can run it (gpu.h: tma_ok). The grid
 * is persistent: p.ctas CTAs (one a multiprocessor) walk the tiles gridDim.x apart in gemm_tc_l's order, so a
 * CTA's producer fills the next tile's first slots while its consumers store the last one. */
#define PPN_GEMM_TC_H_BM 128
#define PPN_GEMM_TC_H_BN 256
#define PPN_GEMM_TC_H_BK 64
#define PPN_GEMM_TC_H_THREADS 384 /* a producer warpgroup and two consumers */
#define PPN_GEMM_TC_H_STAGES 3u
#define PPN_GEMM_TC_H_STAGE_BYTES ((unsigned)PPN_GEMM_TC_H_BN * PPN_GEMM_TC_H_BK * 2u + \
                                   (unsigned)PPN_GEMM_TC_H_BM * PPN_GEMM_TC_H_BK * 4u)
/* The ring, then a full and an empty mbarrier (8 bytes each) per stage. */
#define PPN_GEMM_TC_H_SMEM (PPN_GEMM_TC_H_STAGES * PPN_GEMM_TC_H_STAGE_BYTES + PPN_GEMM_TC_H_STAGES * 16u)
/* x's box: 32 f32 (128 bytes) x BM rows, two a k-tile; W's: 64 16-bit elements (128 bytes) x BN rows. */
#define PPN_GEMM_TC_H_XBOX 32
typedef struct { ppn_tmap xmap, wmap; ppn_kp_gemm g; } ppn_kp_gemm_tc_h;

/* gemm_tc_w (sm_90a, Hopper): the shape of the fastest library kernels at 32-2,048 tokens (docs/PERF.md, 2026-12-06:
 * tools/device/exp/gemm_ws, its experiment). A CTA owns PPN_GEMM_TC_W_BM(m) weight rows (64 a consumer warpgroup)
 * and BT(m) tokens of x, which comes in bf16 row-major ([m, cols], row pitch cols x 2 bytes: rounded by its
 * producer as the tiles round f32 x), and walks all of K: one producer warp's lane streams W's 64 x 64 boxes and x's
 * BT x 64 box of each k-tile through the tensor memory accelerator into a ring of STAGES(m) (the 128-byte swizzle,
 * zeros past the matrix); each consumer warpgroup issues a k-tile's four m64nBTk16 steps as one wgmma group (W as
 * A, tokens as N, both from shared memory) and keeps it in flight while it waits for the next slot. One f32
 * accumulator through k16 steps in k order: gemm_tc_l's sums (PPN_GEMM_SUMS_TILE). Token tiles of a weight tile
 * are neighbours in the 1-D grid (they share W through L2). Its params add the maps of W (64 x 64 boxes, as
 * gemm_tc_kwt's) and x (64 columns x BT(m) rows); the CPU reference reads both through them. */
#define PPN_GEMM_TC_W_BT(m) ((m) <= 32 ? 32 : (m) <= 64 ? 64 : (m) <= 128 ? 128 : 256)
#define PPN_GEMM_TC_W_WG(m) ((m) <= 128 ? 1 : 2)  /* consumer warpgroups (of 64 weight rows each) */
#define PPN_GEMM_TC_W_BM(m) (64 * PPN_GEMM_TC_W_WG(m))
#define PPN_GEMM_TC_W_STAGES(m) ((m) <= 32 ? 16 : (m) <= 64 ? 12 : (m) <= 128 ? 8 : 4)
#define PPN_GEMM_TC_W_THREADS(m) (128 * PPN_GEMM_TC_W_WG(m) + 32)
#define PPN_GEMM_TC_W_THREADS_MAX 288
/* Every form's ring is 192 KB (STAGES x (BM + BT) x 128 bytes), then a full and an empty mbarrier a stage. */
#define PPN_GEMM_TC_W_SMEM(m)                                                                                     \
    ((unsigned)PPN_GEMM_TC_W_STAGES(m) * (unsigned)(PPN_GEMM_TC_W_BM(m) + PPN_GEMM_TC_W_BT(m)) * 128u +             \
     (unsigned)PPN_GEMM_TC_W_STAGES(m) * 16u)
#define PPN_GEMM_TC_W_SMEM_MAX (192u * 1024u + 16u * 16u)
typedef struct { ppn_tmap wmap, xmap; ppn_kp_gemm g; } ppn_kp_gemm_tc_w;
/* gemm_swiglu_w (sm_90a): gemm_tc_w over a gate|up matrix ([2 n, cols]: gate rows, then as many up rows) with SwiGLU
 * in its epilogue, for up to PPN_GEMM_SWIGLU_W_MAX_M tokens: a CTA of two consumer warpgroups and the producer warp
 * owns output columns 64 t .. 64 t + 63 (gate rows 64 t.., read by warpgroup 0; the up rows n further, by
 * warpgroup 1) and BT(m) tokens; W's two 64 x 64 boxes and x's box of a k-tile share a stage of a ring of 96-100
 * KB, so two CTAs share an SM. The sums are gemm_tc_w's (one f32 accumulator through k16 steps in k order), then
 * out [m, n] = silu(gate) * up as ppn_k_swiglu_rows computes it, in odt (f32, or either bf16 form: PPN_X16_AT):
 * the bits of gemm_tc_w then swiglu rows. Its params: gemm_tc_w's maps (W's 64 x 64 boxes of the gate|up matrix,
 * x's 64 columns x BT(m) rows) and g (rows = 2 n), then odt. */
#define PPN_GEMM_SWIGLU_W_MAX_M 128
#define PPN_GEMM_SWIGLU_W_BT(m) ((m) <= 32 ? 32 : (m) <= 64 ? 64 : 128)
#define PPN_GEMM_SWIGLU_W_STAGES(m) ((m) <= 32 ? 5 : (m) <= 64 ? 4 : 3)
#define PPN_GEMM_SWIGLU_W_THREADS (2 * 128 + 32)
#define PPN_GEMM_SWIGLU_W_SMEM(m)                                                                                  \
    ((unsigned)PPN_GEMM_SWIGLU_W_STAGES(m) * (unsigned)(128 + PPN_GEMM_SWIGLU_W_BT(m)) * 128u +                   \
     (unsigned)PPN_GEMM_SWIGLU_W_STAGES(m) * 16u)
#define PPN_GEMM_SWIGLU_W_SMEM_MAX (100u * 1024u + 5u * 16u)
typedef struct { ppn_tmap wmap, xmap; ppn_kp_gemm g; int32_t odt, pad; } ppn_kp_gemm_swiglu_w;

/* Rotary embedding in place on x[n_heads, head_dim] at position hdr->pos.
 * inv_freq: f32 [head_dim/2], precomputed on the host (default, llama3 scaling...).
 * interleaved = 0: HF convention, rotate halves (i, i + head_dim/2);
 * interleaved = 1: llama2.c convention, rotate adjacent pairs (2i, 2i+1).
 * With kc != 0 (as ppn_op_rope_kv always launches it) it also stores into the KV pools: heads
 * n_heads - n_kv .. n_heads - 1 of x are the k heads; once rotated they are stored into kc, and v
 * [n_kv, head_dim] into vc, at hdr->pos through the block table tbl (KV caches below; a position outside
 * [0, cap) or mapped through an entry outside the pool stores nothing). */
typedef struct {
    uint64_t x, inv_freq, hdr, kc, vc, v, tbl;
    int32_t n_heads, head_dim, interleaved, n_kv, cap, kvdt, block_log2;
} ppn_kp_rope;

/* Per-head RMSNorm in place on x[n_heads, head_dim] with weight w[head_dim] (Qwen3 q/k norm). */
typedef struct { uint64_t x, w; int32_t n_heads, head_dim, wdt; float eps; } ppn_kp_head_rmsnorm;

/* KV caches (rope's store, attention) are paged: one layer's K pool and V pool, each [n_kv, cap, head_dim]
 * elements of dtype kvdt (PPN_DTYPE_*; 0 = f32): the model's weight dtype, as transformers keeps them. f32 values
 * are rounded to nearest even on the store, and widened exactly on the load. cap = n_blocks << block_log2 pool
 * positions. A sequence's block table tbl (int32 in device memory) maps its position p to the pool position
 *   pp = (tbl[p >> L] << L) | (p & ((1 << L) - 1)),   L = block_log2 (0..12),
 * and element (g, p, d) is at ((size_t)g * cap + pp) * head_dim + d. tbl = 0 is the identity (pp = p). A table
 * entry outside [0, cap >> L) maps nowhere: a store through it stores nothing, a load reads zeros (the kernels
 * never touch memory outside the pools; the host checks the tables it knows). The table pointer and L stay
 * fixed while a sequence grows (its contents change), so captured graphs stay valid. */
/* The pool position of position p through table tb (NULL: identity), or -1 where nothing may be touched: p
 * outside [0, cap), or an entry outside the pool. The CPU references and the CUDA kernels share it. */
#ifdef __CUDACC__
#define PPN_KV_FN static __host__ __device__ __forceinline__
#else
#define PPN_KV_FN static inline
#endif
PPN_KV_FN int32_t ppn_kv_pool_pos(const int32_t *tb, int32_t L, int32_t cap, int32_t p)
{
    if (p < 0 || p >= cap) return -1;
    if (!tb) return p;
    int32_t b = tb[p >> L];
    if (b < 0 || b >= (cap >> L)) return -1;
    return (b << L) | (p & ((1 << L) - 1));
}

/* Decode attention for one query position hdr->pos over cache positions [0, pos] with GQA:
 * out[h] = softmax(q[h] . K[h/(n_heads/n_kv), 0..pos] * scale) . V[...]. out, q: [n_heads, head_dim].
 *
 * Split over positions so that long contexts fill the GPU: a step uses e = min(n_split, pos / 64 + 1) splits
 * (every split at least 64 positions; e depends on pos alone); CTA (g, j), j < e, takes KV head g and all
 * n_heads / n_kv query heads that share it (each k, v row is read once for all of them) over positions
 * [j c, min((j + 1) c, pos + 1)) with c = ceil((pos + 1) / e); tail splits may be empty; CTAs j >= e leave.
 * The grid is (n_kv, n_split) whatever pos is, so one launch stays valid for every step (graph capture).
 * part (scratch, ppn_op_attn_scratch_bytes()): n_heads * e records of head_dim + 2 floats,
 * record (h, j) = {max score, sum of exp(s - max), o[head_dim] (unnormalized)}, an empty split's being
 * {-inf, 0, 0..}; then n_heads u32 arrival counters (counter g counts KV head g's CTAs; those past n_kv stay
 * unused), which must be 0 before a launch and are 0 after it. The last CTA of a KV head to arrive merges
 * the records of its query heads in j order, so the bits never depend on which CTA finished last.
 * e == 1 (short contexts) writes out directly and touches no scratch. The CPU reference computes the exact result
 * whatever n_split is and touches no scratch either.
 *
 * The fused rotary (inv_freq != 0; one launch less per layer than rope_kv + attn): q then holds the unrotated
 * [n_heads q heads; n_kv k heads; n_kv v heads] of the q|k|v projection and is only read. q is rotated as
 * rope_kv rotates it (inv_freq [head_dim / 2], interleaved as in ppn_kp_rope) in registers; position pos is
 * attended with this step's k (rotated) and v taken from the projection, rounded to kvdt as the caches hold
 * them, and they are stored into kc and vc at pos, so the output and the caches are the bits of rope_kv then
 * attn. A position outside the cache stores nothing. Shapes: ppn_op_attn_rope_fits. kc, vc: dtype kvdt
 * (KV caches above). */
typedef struct {
    uint64_t out, q, kc, vc, hdr, part, inv_freq, tbl;
    int32_t n_heads, n_kv, head_dim, cap, n_split, interleaved, kvdt, block_log2;
    float scale;
    int32_t odt; /* out's dtype: PPN_DTYPE_F32 (0), or PPN_DTYPE_BF16 for gemm_tc_kw16 (batched rows only, below) */
} ppn_kp_attn;
/* The same op for bf16 and f16 caches: a kernel per cache dtype, so each keeps its registers unspilled. */
typedef ppn_kp_attn ppn_kp_attn_bf16;
typedef ppn_kp_attn ppn_kp_attn_f16;

/* out[n] = silu(gate[n]) * up[n] */
typedef struct { uint64_t out, gate, up; int32_t n; } ppn_kp_swiglu;

/* out[n] = a[n] + b[n] (out may alias a or b) */
typedef struct { uint64_t out, a, b; int32_t n; } ppn_kp_add;

/* out[0] (int32) = argmax(x[0..n)), lowest index on ties; -1 when any value is NaN or infinite.
 * part = 0: one block (no op launches that form; ppn_op_argmax_wide always gives part). Else nblk blocks each
 * reduce a strided share into part (nblk records of {f32 value, i32 index}, then a u32 arrival counter that is
 * 0 before a launch and after it) and the last block to arrive reduces the records; (value, index) is a total
 * order, so the winner never depends on the shape. */
typedef struct { uint64_t out, x, part; int32_t n, nblk; } ppn_kp_argmax;

/* *hdr = v: stage 0 writes the step header from the kernel's parameters, so no host buffer has to outlive
 * the enqueue (and a captured graph can carry it). With tok != 0 the token is read from device memory there
 * instead (int32: the previous step's argmax, for greedy decode without a host round trip). */
typedef struct { uint64_t hdr, tok; ppn_step_hdr v; } ppn_kp_set_hdr;

/* out[n] (u32 words) = value. No op launches it: the device-layer tests (tests/util tu_fill) take it as their
 * simplest write, on sim and on cuda (scratch is zeroed with memset_d8). */
typedef struct { uint64_t out; uint32_t value; int32_t n; } ppn_kp_fill;

/* ---------------------------------------------------------------------------------------------------------
 * Many rows per launch (prefill chunks; kernels/ops.h): activations f32 row-major [c, n]; row i of a chunk is
 * position pos0 + i of one sequence. Each row is the decode kernel's formula applied to that row, so the CPU
 * references are the decode references run row by row (kernels/rows_cpu.c). */

/* out[i, :] = table[tok[i], :] for i < c (tok int32 [c]); a token outside [0, vocab) gives a row of zeros. */
typedef struct { uint64_t out, table, tok; int32_t dim, vocab, wdt, c; } ppn_kp_embed_rows;

/* The rmsnorm formula on each of c rows of n: in, out [c, n] (out may alias in), w [n] in wdt. odt: out's dtype,
 * PPN_DTYPE_F32 or PPN_DTYPE_BF16: each value rounded to nearest even as the f32 is computed (what a bf16 GEMM
 * does to its f32 x, so the GEMM after it reads the same values) and stored in gemm_tc_kw16's layout
 * (PPN_X16_POS; n % 64 == 0, out apart from in). */
typedef struct { uint64_t out, in, w; int32_t n, wdt, c; float eps; int32_t odt; } ppn_kp_rmsnorm_rows;

/* head_rmsnorm in place on heads h0 .. h0 + n_heads - 1 of each of c rows of x, a row being stride floats. */
typedef struct { uint64_t x, w; int32_t stride, h0, n_heads, head_dim, wdt, c; float eps; } ppn_kp_head_rmsnorm_rows;

/* Row i of qkv [c, (n_q + 2 n_kv) head_dim]: its n_q + n_kv q and k heads rotated in place at pos0 + i (rope's
 * inv_freq, interleaved and bits), then its k heads (rotated) and v heads stored into kc, vc [n_kv, cap, head_dim]
 * (dtype kvdt) at pos0 + i through tbl (KV caches above): what ppn_k_rope with caches does for one token, per row. */
typedef struct {
    uint64_t qkv, inv_freq, kc, vc, tbl;
    int32_t n_q, n_kv, head_dim, interleaved, cap, kvdt, pos0, c, block_log2;
} ppn_kp_rope_kv_rows;

/* Causal attention of c query rows over the caches: row i (position p = pos0 + i), query head h, KV head
 * g = h / (n_heads / n_kv): out[i, h] = softmax_{j <= p}(q[i, h] . K[g, j] * scale) V[g, j]. q: the first
 * n_heads head_dim floats of each row of qkv (row stride (n_heads + 2 n_kv) head_dim floats); out
 * [c, n_heads head_dim]; kc, vc of dtype kvdt (the KV pools above, through tbl), holding positions 0 .. pos0 + c - 1.
 * One kernel per cache dtype: bf16 and f16 caches with head_dim 64 or 128 run on tensor cores (q and the
 * softmax weights rounded to the cache's dtype, f32 accumulation); f32 caches and other head_dims on a SIMT path
 * in f32. The CPU reference is ppn_cpu_attn run per row. odt: out's dtype, PPN_DTYPE_F32, or PPN_DTYPE_BF16 for
 * the o GEMM after it (gemm_tc_kw16, gemm_tc_k16): each f32 output rounded to nearest even in PPN_X16_POS's
 * layout (n_heads head_dim % 64 == 0), as rmsnorm rows' odt. */
typedef struct {
    uint64_t out, qkv, kc, vc, tbl;
    int32_t n_heads, n_kv, head_dim, cap, kvdt, pos0, c, block_log2;
    float scale;
    int32_t odt;
} ppn_kp_attn_rows;
typedef ppn_kp_attn_rows ppn_kp_attn_rows_bf16;
typedef ppn_kp_attn_rows ppn_kp_attn_rows_f16;

/* out[i, :] = silu(gu[i, 0 .. n)) * gu[i, n .. 2n) for i < c: gu [c, 2n], out [c, n] (separate). vec: four
 * elements a thread in 16-byte loads (the op sets it where n % 4 == 0, gu is 16-byte aligned and out aligned to
 * four of its elements; grid.y then covers n / 4), else one; the same per-element arithmetic either way. odt: out's
 * dtype, PPN_DTYPE_F32 or PPN_DTYPE_BF16 (rounded and laid out as rmsnorm rows' odt). */
typedef struct { uint64_t out, gu; int32_t n, c, vec, odt; } ppn_kp_swiglu_rows;

/* out[i] (int32) = argmax of row i of x [rows, n] by ppn_kp_argmax's rule (lowest index on ties, -1 when any
 * value of the row is NaN or infinite): one block per row (a batched decode step's greedy tokens). vec: four
 * elements a 16-byte load, four loads in flight a thread (the op sets it where n % 4 == 0 and x is 16-byte
 * aligned); the winner is the same either way (a total order). */
typedef struct { uint64_t out, x; int32_t n, rows, vec, pad; } ppn_kp_argmax_rows;
#define PPN_ARGMAX_ROWS_THREADS 1024

/* ---------------------------------------------------------------------------------------------------------
 * Batched decode: B sequences in one launch, one row each (row i of a [B, ...] activation). Row i's position and
 * block table come from segs[i] in device memory, so a launch's parameters do not change as the sequences grow. */

/* One row of a batched decode step, in device memory: its position and its sequence's block table (0: identity). */
typedef struct ppn_kseg { int32_t pos, pad; uint64_t tbl; } ppn_kseg;

/* Row i of qkv [B, (n_q + 2 n_kv) head_dim]: its q and k heads rotated in place at segs[i].pos, then its rotated k
 * heads and v heads stored into the pools kc, vc through segs[i].tbl: ppn_kp_rope_kv_rows's row with the position
 * and table of its own. */
typedef struct {
    uint64_t qkv, inv_freq, kc, vc, segs;
    int32_t n_q, n_kv, head_dim, interleaved, cap, kvdt, block_log2, B;
} ppn_kp_rope_kv_batch;

/* Decode attention of B rows: row i is ppn_kp_attn at position segs[i].pos through segs[i].tbl, with a.q and a.out
 * its row of qkv (row stride (n_heads + 2 n_kv) head_dim floats) and of out (n_heads head_dim floats), and its own
 * scratch: row i's part is a.part + i * ppn_op_attn_scratch_bytes(n_heads, n_split, head_dim). a.hdr and a.tbl are
 * 0. a.inv_freq: 0, or the fused rotary per row (ppn_kp_attn's: row i's q and k rotated at segs[i].pos, k and v
 * stored there through segs[i].tbl). Grid (n_kv, n_split, B): every CTA is a decode attention CTA of its row, so
 * row i's bits are ppn_kp_attn's at that position and n_split, whatever the other rows are. a.odt PPN_DTYPE_BF16:
 * out is [B, n_heads head_dim] bf16 in gemm_tc_kw16's layout (PPN_X16_POS; n_heads head_dim % 64 == 0), each
 * value the f32 one rounded to nearest even (as gemm_tc_kw rounds its f32 x: the o projection's same bits). */
typedef struct {
    ppn_kp_attn a;
    uint64_t segs;
    int32_t B;
} ppn_kp_attn_batch;
typedef ppn_kp_attn_batch ppn_kp_attn_batch_bf16;
typedef ppn_kp_attn_batch ppn_kp_attn_batch_f16;
/* The same rows on tensor cores (kernels/rows_batch_attn.cu): a.kvdt bf16, head_dim 64 or 128, n_heads / n_kv <= 8,
 * a.inv_freq 0 (the rotary and k/v store ran before: the caches are only read). Grid (n_kv, n_split, B) of 128-thread
 * CTAs, the same splits, scratch and merge; q and the softmax weights are rounded to bf16 and the products summed in
 * the tensor cores' order, so a row's bits are not ppn_kp_attn's, but still its own (never the other rows'). */
typedef ppn_kp_attn_batch ppn_kp_attn_batch_tc;

#endif
