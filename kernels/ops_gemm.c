/* ops_gemm.c - ppn_op_gemm (ops.h): the prefill GEMM's checks, its kernel (by shape, dtype and alignment), its
 * geometry (kparams.h's tiles) and its declared accesses.
 *
 * The choice is a function of (m, rows, cols, wdt) and the 16-byte alignment of w and x alone, so a given
 * shape always runs the same kernel and gives the same bits. The prefill tiles (l, m, s) sum each output in the
 * same order (k16 steps in k order into one f32 accumulator), so among them the tile never shows in the bits.
 * Few tokens (m <= gemm_k_max_m(rows, cols): 32, 16 or 8; batched decode) take gemm_tc_k, which splits K over a
 * cluster of CTAs and adds the partial sums in a fixed order: the same bits run to run, and a token's row has
 * the same bits at every m up to that bound (the k-ranges depend on rows and cols alone), but not the bits the
 * prefill tiles give it above, except where gemm_tc_k does not split (1024 weight tiles or more: the lm heads).
 * Above that bound, up to 64, 256 or 512 tokens (gemm_kw_fits), matrices of up to 264 middle tiles of rows take
 * gemm_tc_kw, the middle tile split over K the same way (its own k-ranges: again the same bits at every m it is
 * taken for), or below 4096 rows and up to 64 tokens gemm_tc_kwx, the same tile and sums with x through its ring
 * (gemm_tc_kw's bits). ppn_op_gemm_x16 runs gemm_tc_kw16 where gemm_tc_kw is taken (bf16 W), and gemm_tc_k16
 * where gemm_tc_k is: x given in bf16 by its producer, the same bits again.
 * Where the stream's device runs the TMA kernels (gpu.h: tma_ok; PPN_TMA=0 says no) the large tile is
 * gemm_tc_h on the shapes where it was faster (gemm_h_wins), the same tile and sum warp-specialized behind the
 * tensor memory accelerator: gemm_tc_l's bits. At tma_ok's level 2 (PPN_TMA=2) ppn_op_gemm_x16 and
 * ppn_op_gemm_swiglu also take the split-K tiles' TMA forms, gemm_tc_k16t, gemm_tc_kwt and gemm_swiglu_t: their
 * forms' bits, slower on an H100 but for gemm_tc_k16t (2026-12-06, docs/PERF.md; gemm_tma_kw); at level 3
 * (PPN_TMA=3) gemm_tc_k16t alone.
 * On such a device (at levels 1 and 3), where PPN_GEMM_KX's level takes m (ppn_gemm_kx_takes: by default up to 16 and
 * 65-80 tokens), ppn_op_gemm_x16 and ppn_op_gemm_swiglu take gemm_tc_kx and gemm_swiglu_x where they would take
 * gemm_tc_kw16 and gemm_swiglu: the same split and sums with the operands swapped, groups of 128 tokens, so one pass
 * over W up to 128 tokens. The widest matrix the middle split-K tile fits (the 8B's gate|up) keeps it up to 192
 * tokens on every device (gemm_kw_wide), so the fused SwiGLU takes it there.
 * So for bf16 / f16 weights a token's row depends on which of those ranges of m its chunk falls in.
 * ppn_op_gemm_rows16 takes x in bf16 row-major from its producer and runs gemm_tc_w (no K split: the large tiles'
 * sums at every m); the forward takes it where ppn_op_gemm_rows16_takes (PPN_GEMM_W's level), and there the sums are
 * the tiles' whatever m (ppn_op_gemm_sums_on). ppn_op_gemm_swiglu_rows16 runs gemm_tc_w's k-loop over a gate|up matrix
 * with SwiGLU in its epilogue (gemm_swiglu_w, up to 128 tokens): gemm_tc_w's sums, then swiglu rows' arithmetic.
 */
#include <string.h>
#include "core/base/dtype.h"
#include "core/base/err.h"
#include "kernels/ops.h"
#include "kernels/ops_internal.h"

#define GEMM_L_MIN_TILES 96 /* large tiles from about 3/4 of a wave of them on the H200's 132 SMs (below) */
#define GEMM_L_MIN_M 65       /* and from m > 64: below, half a large tile's tokens would be padding */


#define GEMM_MAX_CTAS 0x7fffffffu /* a 1-D grid's limit */

/* The middle tile's shared memory: its ring takes 48 KB, and its 140 registers (sm_90a) let 3 CTAs share an SM;
 * asking 80 KB keeps it to 2 an SM (3 x 81 KB is more than an H200's 228 KB, or an A100's 164). Two were faster
 * wherever it is taken in a prompt (H200, 2026-12-02, alternating rounds of one tree differing in this alone:
 * pp512 8B 16,226-16,265 -> 17,177-17,196 tok/s, 1B 70,548-70,808 -> 76,231-76,858; pp4096 within the rounds'
 * noise; docs/PERF.md). */
#define GEMM_M_SMEM (80u * 1024u)
_Static_assert(GEMM_M_SMEM >= PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES) &&
                   GEMM_M_SMEM <= PPN_DYN_SMEM_MAX,
               "the middle tile's ring fits what it asks, and the opt-in covers it");

static size_t gemm_tiles(int m, int rows, int bm, int bn)
{
    return (size_t)blocks_for(m, (unsigned)bm) * (size_t)blocks_for(rows, (unsigned)bn);
}

/* The tensor-core kernels need 16-byte loads of whole 8-element chunks of a weight row (cols % 8, w aligned)
 * and of x (x aligned); anything else, and f32 weights, take the SIMT kernel. The large tile is the faster one
 * per SM (H200, tests/gpu/test_gpu_gemm.c, 2026-12-01: ~350 against ~270 TFLOP/s at m = 4096) but has 4x fewer
 * CTAs: the middle one wins where the large ones leave SMs idle (llama-8b o at m = 512: 64 large tiles, 246
 * against 180 TFLOP/s) or carry mostly padding (m <= 64: lm head at m = 64, 201 against 184). From 96 large
 * tiles on, the large one won every shape measured (8b o at m = 1024, 128 tiles: 312 against 192) but one
 * (8b qkv at m = 1024, 192 tiles: 246 against 255); 96 tiles (8b q|k|v at m = 512, 1b q|k|v at m = 1024) it won
 * by 49% and 40% on 2026-12-02 (277 against 186, 233 against 166; 64 tiles still go to the middle one: 8b o at
 * m = 512, 194 against 245). At m <= 16 the middle tile also beat a 16 x 32 one made
 * for weight bandwidth on every shape. The square tile (gemm_tc_s, 128 x 128) is not taken: it beat the better
 * of the other two on one shape of the 40 measured (1b qkv at m = 512: 163 against 154) and lost up to 25%
 * (8b qkv at m = 512: 194 against 260). */
/* The tensor-core tiles take 2-byte weights, cols a multiple of 8 and 16-byte-aligned w and x. */
static int gemm_tc_fits(const ppn_kp_gemm *p)
{
    return p->wdt != PPN_DTYPE_F32 && p->cols % 8 == 0 && !(p->w & 15u) && !(p->x & 15u);
}

/* gemm_tc_k's and gemm_tc_kw's K split and ring depth where the caller names none (p->ks, p->stages 0): the
 * K split depends on rows alone (kparams.h's KS), so a token's bits do not depend on m; the depth only on m. */
static int gemm_k_ks(const ppn_kp_gemm *p) { return p->ks ? p->ks : (int)PPN_GEMM_TC_K_KS(p->rows); }
static int gemm_k_stages(const ppn_kp_gemm *p) { return p->stages ? p->stages : (int)PPN_GEMM_TC_K_STAGES(p->m); }
static int gemm_kw_ks(const ppn_kp_gemm *p) { return p->ks ? p->ks : (int)PPN_GEMM_TC_KW_KS(p->rows); }
/* gemm_tc_kw's, gemm_tc_kwx's and gemm_tc_kwt's ring depth: one each (kparams.h). */
static int gemm_kw_depth(int kernel)
{
    return kernel == PPN_K_GEMM_TC_KWX   ? (int)PPN_GEMM_TC_KWX_STAGES
           : kernel == PPN_K_GEMM_TC_KWT ? (int)PPN_GEMM_TC_KWT_STAGES
           : kernel == PPN_K_GEMM_TC_KX  ? (int)PPN_GEMM_TC_KX_STAGES
                                         : (int)PPN_GEMM_TC_KW_STAGES;
}

/* The small split-K tile in any of its forms: gemm_tc_k, gemm_tc_k16, gemm_tc_k16t (one grid, split, ring and bits). */
static int gemm_is_k(int kernel)
{
    return kernel == PPN_K_GEMM_TC_K || kernel == PPN_K_GEMM_TC_K16 || kernel == PPN_K_GEMM_TC_K16T;
}

/* The middle split-K tile in any of its forms: gemm_tc_kw, gemm_tc_kwx, gemm_tc_kw16, gemm_tc_kwt (one grid, split
 * and bits), and gemm_tc_kx (the same split and bits; its own grid: groups of 128 tokens). */
static int gemm_is_kw(int kernel)
{
    return kernel == PPN_K_GEMM_TC_KW || kernel == PPN_K_GEMM_TC_KWX || kernel == PPN_K_GEMM_TC_KW16 ||
           kernel == PPN_K_GEMM_TC_KWT || kernel == PPN_K_GEMM_TC_KX;
}

/* x's element size: bf16 for gemm_tc_kw16, gemm_tc_kwt, gemm_tc_kx, gemm_tc_k16 and gemm_tc_k16t, f32 for every
 * other kernel. */
static size_t gemm_x_es(int kernel)
{
    int x16 = kernel == PPN_K_GEMM_TC_KW16 || kernel == PPN_K_GEMM_TC_KWT || kernel == PPN_K_GEMM_TC_KX ||
              kernel == PPN_K_GEMM_TC_K16 || kernel == PPN_K_GEMM_TC_K16T || kernel == PPN_K_GEMM_TC_W;
    return x16 ? 2u : 4u;
}

/* gemm_tc_k's (or gemm_tc_k16's, gemm_tc_k16t's with its mbarriers) ring at m tokens and that depth. */
static unsigned gemm_k_smem(int kernel, int m, int stages)
{
    return kernel == PPN_K_GEMM_TC_K16T  ? PPN_GEMM_TC_K16T_SMEM_S(m, stages)
           : kernel == PPN_K_GEMM_TC_K16 ? PPN_GEMM_TC_K16_SMEM_S(m, stages)
                                         : PPN_GEMM_TC_K_SMEM_S(m, stages);
}

/* gemm_tc_k's CTAs: clusters of CLUSTER / KS weight tiles, for each token group (kparams.h). */
static size_t gemm_k_ctas(const ppn_kp_gemm *p)
{
    unsigned per = PPN_GEMM_TC_K_CLUSTER / (unsigned)gemm_k_ks(p);
    return (size_t)blocks_for((int)PPN_GEMM_TC_K_TILES(p->rows), per) * blocks_for(p->m, PPN_GEMM_TC_K_MG) *
           PPN_GEMM_TC_K_CLUSTER;
}

/* gemm_tc_kw's (and gemm_tc_kwx's) CTAs: clusters of CLUSTER / KW_KS middle tiles, for each group of 64 tokens
 * (kparams.h). */
static size_t gemm_kw_ctas(const ppn_kp_gemm *p)
{
    unsigned per = PPN_GEMM_TC_K_CLUSTER / (unsigned)gemm_kw_ks(p);
    return (size_t)blocks_for((int)PPN_GEMM_TC_KW_TILES(p->rows), per) * blocks_for(p->m, PPN_GEMM_TC_M_BM) *
           PPN_GEMM_TC_K_CLUSTER;
}

/* gemm_tc_kx's: the same clusters for each group of 128 tokens (kparams.h); never more than gemm_tc_kw's. */
static size_t gemm_kx_ctas(const ppn_kp_gemm *p)
{
    unsigned per = PPN_GEMM_TC_K_CLUSTER / (unsigned)gemm_kw_ks(p);
    return (size_t)blocks_for((int)PPN_GEMM_TC_KW_TILES(p->rows), per) * blocks_for(p->m, PPN_GEMM_TC_KX_BM) *
           PPN_GEMM_TC_K_CLUSTER;
}

/* Up to how many tokens gemm_tc_k, the split-K tile built for weight bandwidth, is taken (H200,
 * tests/gpu/test_gpu_gemm.c's decode table, 2026-12-01 15:30 and 16:15 UTC; docs/PERF.md): at m <= 16 on every
 * llama-1b / 8b shape (gemm_tc_kw within 5% of it or behind then); at m = 32 only on the 1B's narrow, short q|k|v
 * and o (up to 8192 rows, cols < 4096: q|k|v 29% of the copy floor against 25%; o 20% against 22%, noise),
 * where gemm_tc_kw's 64-token tile is mostly padding over few k-tiles; elsewhere gemm_tc_k's x traffic (f32,
 * once per 64-row CTA: as many bytes as W's at m = 32) tells.
 * Since gemm_tc_kw's later tuning, only up to 8 on the large matrices where gemm_tc_kw fits (at least 6144 rows
 * over at least 4096 columns, KW_KS >= 2). Same table at m = 16, two builds of one call (2026-12-03 10:48 UTC):
 * 8B q|k|v 59.4 / 59.2% against gemm_tc_k's 55.0 / 54.4%, 8B gate|up 85.1 / 85.4% against 79.4 / 80.1%; on 4096
 * rows gemm_tc_k stays ahead (8B o 46.8% against 61.3%, 8B down 63.9% against 76.9%), and on 2048 columns (1B
 * gate|up 50.8% against 70.6%); at m = 8 gemm_tc_k was ahead or level on all (8B q|k|v 63.7% against 59.9%,
 * gate|up 85.3% against 86.4%). The lm heads keep 16 (KW_KS 1: gemm_tc_kw does not fit).
 * Since x comes in bf16 (gemm_tc_k16, gemm_tc_kw16), q|k|v's 6144 rows take gemm_tc_k up to 16 again: H200, the
 * decode table of 2026-12-05 10:48 UTC at m = 16, 8B q|k|v gemm_tc_k16 67.7% against gemm_tc_kw16 60.7% (f32 x:
 * gemm_tc_k 56.1%, gemm_tc_kw 59.4% on 12-03: the PPN_FUSE=0 path follows the rule, so both give the same bits);
 * the 8B's B=16 step 5.318-5.336 -> 5.305-5.314 ms (three alternating rounds, 2026-12-05 18:07 UTC, docs/PERF.md);
 * so only matrices of more than 8192 rows over at least 4096 columns (the 8B's gate|up: gemm_tc_kw16 91.5% against
 * gemm_tc_k16 87.3%) switch at 8. */
/* gemm_tc_w's grid: its weight tiles times its token tiles (kparams.h's form for m). */
static size_t gemm_w_ctas(const ppn_kp_gemm *p)
{
    return (size_t)blocks_for(p->rows, (unsigned)PPN_GEMM_TC_W_BM(p->m)) *
           (size_t)blocks_for(p->m, (unsigned)PPN_GEMM_TC_W_BT(p->m));
}

static int gemm_k_max_m(int rows, int cols)
{
    if (rows <= 8192 && cols < 4096) return 32;
    return rows > 8192 && cols >= 4096 && PPN_GEMM_TC_KW_KS(rows) >= 2u ? 8 : 16;
}

/* Above that, up to 256 tokens, gemm_tc_kw (the middle tile split over K in a cluster) where its K split is 2 or
 * more (up to 264 middle tiles of weight rows; the lm heads keep the middle / large tile). Same table: at m = 32
 * 8B q|k|v 58% against 45% (gemm_tc_k), o 44% against 31%, down 62% against 39%, 1B down 38% against 31%, 1B and
 * 8B gate|up 48% / 83% against 43% / 73% (the middle tile); at m = 64 every such shape (1B 19-43%, 8B 36-77%,
 * against 12-35% / 20-59% for the better of the others); at m = 128 all but the 1B gate|up (KS 4 over 2048 cols:
 * 27% against the middle tile's 31%), so above 64 tokens it needs KS 8 or cols >= 4096, and it yields to the
 * large tile where that one is taken (8B gate|up at m = 128: 43% against the large tile's 54% at 15:30).
 * From 129 to 256 tokens too (one H100, the decode table of 2026-12-06 10:43 UTC, docs/PERF.md; us, the middle tile
 * unsplit (gemm_tc_m, the op's choice before) against gemm_tc_kw16): 8B q|k|v at m = 192 73.2 / 52.7, o 61.8 / 35.3,
 * down 202.2 / 88.8; at m = 256 77.4 / 65.6, 60.6 / 46.5, 203.5 / 123.9; 1B q|k|v, o, down at m = 192 39.9 / 23.8,
 * 31.7 / 13.9, 96.0 / 29.3 (gemm_tc_kw on f32 x: 30.2, 17.2, 41.3). The gate|up matrices keep the large tile
 * there (at least 96 of its tiles; 8B at m = 256 188.4 against 208.9). A 16 + 176-row mixed step of the 8B took
 * 20.93 ms against 12.03 for 16 + 112. Over sums of 8192 columns or more (the down matrices) up to 512 (the same
 * table at 320, 384 and 512 tokens, 10:56 UTC, another H100: 8B down 234.8 / 136.1, 245.6 / 172.2, 250.8 / 223.2;
 * 1B down 109.9 / 52.7, 114.2 / 56.2, 110.3 / 77.0); on shorter sums past 256 it was level or behind somewhere (8B
 * q|k|v at 320 73.5 / 74.9; o on the prompt walk's f32 x, gemm_tc_kw, at 320 67.2 / 70.0). */
#define GEMM_KW_MAX_M 256
#define GEMM_KW_MAX_M_LONG 512 /* cols >= GEMM_KW_LONG */
#define GEMM_KW_LONG 8192
static int gemm_kw_fits(int m, int rows, int cols)
{
    unsigned ks = PPN_GEMM_TC_KW_KS(rows);
    return m <= (cols >= GEMM_KW_LONG ? GEMM_KW_MAX_M_LONG : GEMM_KW_MAX_M) && ks >= 2 &&
           (m <= 64 || ks == 8 || cols >= 4096);
}

/* Where gemm_tc_kw is taken, gemm_tc_kwx (the same tile and bits, x copied through the ring beside W in 16-byte
 * pieces, 102 KB of shared memory a CTA) replaces it on matrices of fewer than 4096 rows at up to 64 tokens: the
 * 1B's q|k|v, o and down. H200, test_gpu_gemm's decode table, 2026-12-03 14:24 UTC (docs/PERF.md), % of the copy
 * floor, kw against kwx: at m = 64 1B q|k|v 20.4 / 30.5, o 18.4 / 21.1, down 31.2 / 42.3; at m = 32 1B down 39.1 /
 * 45.3; the 1B's B=64 step 2.51-2.56 -> 2.26-2.28 ms. On the 8B's 4096-row o and down it was level alone (m = 64:
 * 35.2 / 35.7, 49.0 / 51.2) but slower in the step (B=64 7.95-8.00 -> 8.62-8.67 ms), and behind on the wider
 * matrices. Above 64 tokens gemm_tc_kw16 (bf16 x, where the op's choice is gemm_tc_kw) was ahead of it on the 1B's
 * three (one H100, 2026-12-06 10:43 UTC: us, kwx / kw16, at m = 128 q|k|v 19.7 / 14.7, o 16.3 / 13.2, down 36.0 /
 * 27.3; at m = 80 gemm_tc_kx 11.2, 10.8, 21.5 against kwx 17.8, 15.3, 32.8). */
static int gemm_kwx_wins(int m, int rows) { return rows < 4096 && m <= 64; }

/* sms: the stream's device's multiprocessors where it runs the TMA kernels (gpu.h: tma_ok, sm_count), else 0. */
static int gemm_tma_sms(ppn_gpu *g, ppn_gstream *s)
{
    if (!g->ops->tma_ok || !g->ops->tma_ok(g, s)) return 0;
    int n = g->ops->sm_count ? g->ops->sm_count(g, s) : 0;
    return n > 0 ? n : 1;
}

static int gemm_tma_level(ppn_gpu *g, ppn_gstream *s) { return g->ops->tma_ok ? g->ops->tma_ok(g, s) : 0; }

/* Whether the stream's device takes the middle split-K tiles' TMA forms (gemm_tc_kwt for gemm_tc_kw16,
 * gemm_swiglu_t for gemm_swiglu: the same bits): tma_ok's level 2 (PPN_TMA=2). Not the default: on an H100
 * (2026-12-06, docs/PERF.md; tools/device/tmakw.sh) the 8B's B=16 and B=64 steps ran 16% slower, gemm_tc_kwt and
 * gemm_swiglu_t 18-40% a launch, gemm_tc_k16t alone 4.6% faster. */
static int gemm_tma_kw(ppn_gpu *g, ppn_gstream *s) { return gemm_tma_level(g, s) == 2; }

/* Whether it takes gemm_tc_k16t for gemm_tc_k16 (the same bits): levels 2 and 3 (PPN_TMA=3: that form alone, the
 * one that won a launch at level 2). */
static int gemm_tma_k16(ppn_gpu *g, ppn_gstream *s) { return gemm_tma_level(g, s) >= 2; }

/* Whether the stream's device takes gemm_tc_kx for gemm_tc_kw16 and gemm_swiglu_x for gemm_swiglu (the same bits) at
 * m tokens: where it runs sm_90a code (tma_ok; warpgroup MMA with both operands in shared memory), not at PPN_TMA=2
 * (its forms instead), and PPN_GEMM_KX's level (g->gemm_kx) takes m (ppn_gemm_kx_takes). */
static int gemm_kx_on(ppn_gpu *g, ppn_gstream *s, int m)
{
    return ppn_gemm_kx_takes(g, m) && gemm_tma_sms(g, s) > 0 && !gemm_tma_kw(g, s);
}

/* Level 2 (the default): up to 16 tokens (where gemm_tc_kw16 runs there: the 8B's gate|up, gemm_swiglu_x) and 65-80
 * (one pass over W where gemm_tc_kw16 takes two). One H100, 2026-12-06 (docs/PERF.md; tools/device/kx.sh), us a launch
 * in test_gpu_gemm's decode table, gemm_tc_kw16 (or the op's tile) against gemm_tc_kx: at m = 80 the 8B's q|k|v 36.24
 * / 32.15, o 28.57 / 27.79, down 76.81 / 70.75, gate|up 108.47 (gemm_tc_l) / 105.66; at m = 64 and 128 gemm_tc_kx was
 * behind on every 8B matrix (q|k|v 25.84 / 29.80 and 37.60 / 53.80); at m = 16 gate|up 90.33 / 88.82. The 8B's steps,
 * level 1 against 0: B=16 6.89 against 7.02 ms, a 16 + 64-row mixed step 10.81 against 11.26, but B=64 9.36 against
 * 8.55 and 16 + 48 rows 10.10 against 9.28. */
int ppn_gemm_kx_takes(const ppn_gpu *g, int m)
{
    return g->gemm_kx == 1 || (g->gemm_kx == 2 && (m <= 16 || (m >= 65 && m <= 80)));
}

/* Where the device runs it, gemm_tc_h replaces gemm_tc_l (the same tile and bits) but on one wave of tiles over a
 * sum shorter than 8192 columns, where gemm_tc_l was faster: H200, test_gpu_gemm's timing table, 2026-12-02
 * (docs/PERF.md): 8B q|k|v at m = 512 (96 tiles) 277 against 251 TFLOP/s, 8B o at m = 1024 (128 tiles) 353
 * against 327, 1B o at m = 2048 (128 tiles) 277 against 226; with more tiles, or cols >= 8192 (8B down at
 * m = 1024, 128 tiles: 460 against 423), gemm_tc_h was ahead or level. */
static int gemm_h_wins(const ppn_kp_gemm *p, int sms)
{
    return p->cols >= 8192 || gemm_tiles(p->m, p->rows, PPN_GEMM_TC_H_BM, PPN_GEMM_TC_H_BN) > (size_t)sms;
}

/* On the widest matrices the split-K middle tile fits (more than 8192 rows: the 8B's gate|up, 28,672 rows at K split
 * 2) it keeps up to GEMM_KW_WIDE_M tokens (three token groups) from the large tile, and so SwiGLU stays in its
 * epilogue (ppn_op_gemm_swiglu; gemm_swiglu_x where PPN_GEMM_KX takes m). One H100, test_gpu_gemm's decode table
 * of 2026-12-06 10:42 UTC (docs/PERF.md), us: at m = 192 gemm_tc_kw16 157.65 against the op's gemm_tc_h 193.96
 * (gemm_tc_l 176.74), whose f32 output then takes a swiglu_rows launch; at m = 128 116.50 against gemm_tc_l's
 * 113.59 plus swiglu_rows (7.8 us a launch at 103-128 rows in the mixed step's account); at m = 256 208.88 against
 * 188.44: the large tile's two row blocks cost what one does, the split-K tile's fourth group does not. The 8B's
 * steps: docs/PERF.md (16 + 176 rows 15.6 -> 14.2 ms). It also holds the 65-80 tokens gemm_tc_kx reads W once
 * for, where a rule of the device's PPN_GEMM_KX level kept them before (the same shapes: at most 128 tokens, more
 * than 95 large tiles, so more than 8192 rows). */
#define GEMM_KW_WIDE_M 192
static int gemm_kw_wide(const ppn_kp_gemm *p, int kw) { return kw && p->rows > 8192 && p->m <= GEMM_KW_WIDE_M; }

/* A function of the shape and the device's TMA kernels (sms > 0: gemm_tc_h may replace gemm_tc_l, the same bits)
 * alone: ppn_op_gemm's f32 x (PPN_FUSE=0) and ppn_op_gemm_x16's bf16 x take the same tile family, so the same
 * bits. */
static int gemm_kernel(const ppn_kp_gemm *p, int sms)
{
    if (!gemm_tc_fits(p)) return PPN_K_GEMM;
    if (p->m <= gemm_k_max_m(p->rows, p->cols)) return PPN_K_GEMM_TC_K;
    const int kw = gemm_kw_fits(p->m, p->rows, p->cols);
    if (p->m >= GEMM_L_MIN_M && gemm_tiles(p->m, p->rows, PPN_GEMM_TC_L_BM, PPN_GEMM_TC_L_BN) >= GEMM_L_MIN_TILES &&
        !gemm_kw_wide(p, kw))
        return sms && gemm_h_wins(p, sms) ? PPN_K_GEMM_TC_H : PPN_K_GEMM_TC_L;
    if (kw) return gemm_kwx_wins(p->m, p->rows) ? PPN_K_GEMM_TC_KWX : PPN_K_GEMM_TC_KW;
    return PPN_K_GEMM_TC_M;
}

static ppn_launch gemm_geometry(int kernel, const ppn_kp_gemm *p)
{
    int bm = PPN_GEMM_SIMT_BM, bn = PPN_GEMM_SIMT_BN;
    unsigned threads = PPN_GEMM_SIMT_THREADS, smem = 0;
    switch (kernel) {
    case PPN_K_GEMM_TC_L:
        bm = PPN_GEMM_TC_L_BM, bn = PPN_GEMM_TC_L_BN, threads = PPN_GEMM_TC_L_THREADS;
        smem = PPN_GEMM_TC_SMEM(bm, bn, PPN_GEMM_TC_L_STAGES);
        break;
    case PPN_K_GEMM_TC_M:
        bm = PPN_GEMM_TC_M_BM, bn = PPN_GEMM_TC_M_BN, threads = PPN_GEMM_TC_M_THREADS;
        smem = GEMM_M_SMEM;
        break;
    case PPN_K_GEMM_TC_S:
        bm = PPN_GEMM_TC_S_BM, bn = PPN_GEMM_TC_S_BN, threads = PPN_GEMM_TC_S_THREADS;
        smem = PPN_GEMM_TC_SMEM(bm, bn, PPN_GEMM_TC_S_STAGES);
        break;
    case PPN_K_GEMM_TC_H: { /* persistent: p->ctas CTAs (resolved by gemm_submit); its own opt-in (ktable.c) */
        ppn_launch l = launch_init(kernel, p, (unsigned)p->ctas, PPN_GEMM_TC_H_THREADS);
        l.smem = PPN_GEMM_TC_H_SMEM;
        return l;
    }
    case PPN_K_GEMM_TC_K:
    case PPN_K_GEMM_TC_K16:
    case PPN_K_GEMM_TC_K16T: {
        PPN_ASSERT(gemm_k_smem(kernel, p->m, p->stages) <= PPN_DYN_SMEM_MAX);
        ppn_launch l = launch_init(kernel, p, (unsigned)gemm_k_ctas(p), PPN_GEMM_TC_K_THREADS);
        l.smem = gemm_k_smem(kernel, p->m, p->stages);
        return l;
    }
    case PPN_K_GEMM_TC_KW:
    case PPN_K_GEMM_TC_KW16:
    case PPN_K_GEMM_TC_KWT: {
        ppn_launch l = launch_init(kernel, p, (unsigned)gemm_kw_ctas(p), PPN_GEMM_TC_M_THREADS);
        l.smem = kernel == PPN_K_GEMM_TC_KWT ? PPN_GEMM_TC_KWT_SMEM : PPN_GEMM_TC_KW_SMEM(p->stages);
        PPN_ASSERT(l.smem <= PPN_DYN_SMEM_MAX);
        return l;
    }
    case PPN_K_GEMM_TC_KX: { /* above the set's opt-in: its own (ktable.c) */
        ppn_launch l = launch_init(kernel, p, (unsigned)gemm_kx_ctas(p), PPN_GEMM_TC_M_THREADS);
        l.smem = PPN_GEMM_TC_KX_SMEM(p->m);
        return l;
    }
    case PPN_K_GEMM_TC_W: { /* above the set's opt-in: its own (ktable.c); its form by m (kparams.h) */
        ppn_launch l = launch_init(kernel, p, (unsigned)gemm_w_ctas(p), (unsigned)PPN_GEMM_TC_W_THREADS(p->m));
        l.smem = PPN_GEMM_TC_W_SMEM(p->m);
        return l;
    }
    case PPN_K_GEMM_TC_KWX: { /* above the set's opt-in: its own (ktable.c) */
        ppn_launch l = launch_init(kernel, p, (unsigned)gemm_kw_ctas(p), PPN_GEMM_TC_M_THREADS);
        l.smem = PPN_GEMM_TC_KWX_SMEM;
        return l;
    }
    default: break;
    }
    PPN_ASSERT(smem <= PPN_DYN_SMEM_MAX);
    ppn_launch l = launch_init(kernel, p, (unsigned)gemm_tiles(p->m, p->rows, bm, bn), threads);
    l.smem = smem;
    return l;
}

/* Every CTA reads x (xes bytes an element) while others write out, so they must not overlap (res may alias out:
 * each element is read by the thread that then writes it). The grid is 1-D: its CTA count must stay below 2^31. */
static ppn_status gemm_check(const char *op, const ppn_kp_gemm *p, size_t xes)
{
    PPN_CHECK(need_positive(op, "m", p->m));
    PPN_CHECK(need_positive(op, "rows", p->rows));
    PPN_CHECK(need_positive(op, "cols", p->cols));
    PPN_CHECK(need_wdt(op, p->wdt));
    PPN_CHECK(need_ptr(op, "out", p->out));
    PPN_CHECK(need_ptr(op, "w", p->w));
    PPN_CHECK(need_ptr(op, "x", p->x));
    if (gemm_tiles(p->m, p->rows, PPN_GEMM_SIMT_BM, PPN_GEMM_SIMT_BN) > GEMM_MAX_CTAS) /* the most CTAs a tile takes */
        return ppn_err(PPN_EINVAL, "%s: m %d x rows %d needs more than 2^31 - 1 CTAs", op, p->m, p->rows);
    size_t ob = f32_bytes((size_t)p->m * (size_t)p->rows), xb = (size_t)p->m * (size_t)p->cols * xes;
    if (p->out < p->x + xb && p->x < p->out + ob)
        return ppn_err(PPN_EINVAL, "%s: out [0x%llx, +%zu) overlaps x [0x%llx, +%zu)", op,
                       (unsigned long long)p->out, ob, (unsigned long long)p->x, xb);
    return PPN_OK;
}

/* The TMA forms' tensor map of W (p's rows x cols bf16) into map: 64 x 64 boxes (kparams.h). */
static ppn_status gemm_wmap(ppn_gpu *g, ppn_gstream *s, const char *op, const ppn_kp_gemm *p, ppn_tmap *map)
{
    ppn_tmap_desc wd = {.base = p->w, .elem_bytes = 2, .dim = {(uint64_t)p->cols, (uint64_t)p->rows},
                        .row_bytes = (uint64_t)p->cols * 2u, .box = {PPN_GEMM_TC_KWT_BOX, PPN_GEMM_TC_KWT_BOX}};
    memset(map, 0, sizeof *map);
    if (!g->ops->tmap_encode)
        return ppn_err(PPN_EUNSUPPORTED, "%s: W's tensor map: backend %s has none", op, g->ops->name);
    return g->ops->tmap_encode(g, s, &wd, map);
}

/* p (checked) on kernel: its tile's geometry and every buffer it touches, declared. The split-K tiles get their
 * K split and ring depth resolved here (the kernels read them from the params). */
static ppn_status gemm_submit(ppn_gpu *g, ppn_gstream *s, int kernel, const ppn_kp_gemm *pc)
{
    ppn_kp_gemm rp = *pc, *p = &rp;
    if (gemm_is_k(kernel)) rp.ks = gemm_k_ks(pc), rp.stages = gemm_k_stages(pc);
    else if (gemm_is_kw(kernel)) rp.ks = gemm_kw_ks(pc), rp.stages = gemm_kw_depth(kernel);
    else rp.ks = 0, rp.stages = 0;
    rp.ctas = 0;
    if (kernel == PPN_K_GEMM_TC_H) { /* one CTA a multiprocessor (or the caller's count), at most one a tile */
        size_t tiles = gemm_tiles(p->m, p->rows, PPN_GEMM_TC_H_BM, PPN_GEMM_TC_H_BN);
        size_t want = pc->ctas > 0 ? (size_t)pc->ctas : g->ops->sm_count ? (size_t)g->ops->sm_count(g, s) : 0;
        rp.ctas = (int)(want > 0 && want < tiles ? want : tiles);
    }
    size_t es = ppn_dtype_size(p->wdt), ob = f32_bytes((size_t)p->m * (size_t)p->rows);
    ppn_launch l = gemm_geometry(kernel, p);
    ppn_kp_gemm_tc_h hp; /* gemm_tc_h's params: the tensor maps of x and W, then the GEMM's */
    if (kernel == PPN_K_GEMM_TC_H) {
        ppn_tmap_desc xd = {.base = p->x, .elem_bytes = 4, .dim = {(uint64_t)p->cols, (uint64_t)p->m},
                            .row_bytes = (uint64_t)p->cols * 4u, .box = {PPN_GEMM_TC_H_XBOX, PPN_GEMM_TC_H_BM}};
        ppn_tmap_desc wd = {.base = p->w, .elem_bytes = 2, .dim = {(uint64_t)p->cols, (uint64_t)p->rows},
                            .row_bytes = (uint64_t)p->cols * 2u, .box = {PPN_GEMM_TC_H_BK, PPN_GEMM_TC_H_BN}};
        memset(&hp, 0, sizeof hp);
        hp.g = *p;
        if (!g->ops->tmap_encode)
            return ppn_err(PPN_EUNSUPPORTED, "ppn_op_gemm: gemm_tc_h needs tensor maps; backend %s has none",
                           g->ops->name);
        PPN_CHECK(g->ops->tmap_encode(g, s, &xd, &hp.xmap));
        PPN_CHECK(g->ops->tmap_encode(g, s, &wd, &hp.wmap));
        l.params = &hp;
        l.params_size = sizeof hp;
    }
    ppn_kp_gemm_tc_kwt tp; /* gemm_tc_kwt's params: W's tensor map, then the GEMM's */
    if (kernel == PPN_K_GEMM_TC_KWT) {
        PPN_CHECK(gemm_wmap(g, s, "ppn_op_gemm", p, &tp.wmap));
        tp.g = *p;
        l.params = &tp;
        l.params_size = sizeof tp;
    }
    ppn_kp_gemm_tc_k16t kp; /* gemm_tc_k16t's: W's and x's tensor maps, then the GEMM's */
    if (kernel == PPN_K_GEMM_TC_K16T) {
        ppn_tmap_desc xd = {.base = p->x, .elem_bytes = 2, .dim = {(uint64_t)p->cols, (uint64_t)p->m},
                            .row_bytes = (uint64_t)p->cols * 2u, .box = {PPN_GEMM_TC_K_KT, PPN_GEMM_TC_K_MP(p->m)}};
        PPN_CHECK(gemm_wmap(g, s, "ppn_op_gemm", p, &kp.wmap));
        memset(&kp.xmap, 0, sizeof kp.xmap);
        PPN_CHECK(g->ops->tmap_encode(g, s, &xd, &kp.xmap));
        kp.g = *p;
        l.params = &kp;
        l.params_size = sizeof kp;
    }
    ppn_kp_gemm_tc_w wp; /* gemm_tc_w's: W's and x's tensor maps, then the GEMM's */
    if (kernel == PPN_K_GEMM_TC_W) {
        ppn_tmap_desc xd = {.base = p->x, .elem_bytes = 2, .dim = {(uint64_t)p->cols, (uint64_t)p->m},
                            .row_bytes = (uint64_t)p->cols * 2u, .box = {64u, (unsigned)PPN_GEMM_TC_W_BT(p->m)}};
        PPN_CHECK(gemm_wmap(g, s, "ppn_op_gemm", p, &wp.wmap));
        memset(&wp.xmap, 0, sizeof wp.xmap);
        PPN_CHECK(g->ops->tmap_encode(g, s, &xd, &wp.xmap));
        wp.g = *p;
        l.params = &wp;
        l.params_size = sizeof wp;
    }
    acc_add(&l, p->w, (size_t)p->rows * (size_t)p->cols * es, PPN_ACC_R);
    acc_add(&l, p->x, (size_t)p->m * (size_t)p->cols * gemm_x_es(kernel), PPN_ACC_R);
    if (p->bias) acc_add(&l, p->bias, (size_t)p->rows * es, PPN_ACC_R);
    if (p->res) acc_add(&l, p->res, ob, PPN_ACC_R);
    acc_add(&l, p->out, ob, PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_gemm(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int m, int rows,
                       int cols, ppn_dptr bias, ppn_dptr res)
{
    ppn_kp_gemm p = {.out = out, .w = w, .x = x, .bias = bias, .res = res, .m = m, .rows = rows, .cols = cols,
                     .wdt = wdt, .ks = 0, .stages = 0, .ctas = 0};
    PPN_CHECK(gemm_check("ppn_op_gemm", &p, 4));
    return gemm_submit(g, s, gemm_kernel(&p, gemm_tma_sms(g, s)), &p);
}

/* The kernel ppn_op_gemm runs on this shape with 16-byte aligned w and x (the forward's). */
static int gemm_shape_kernel(int m, int rows, int cols, int wdt)
{
    ppn_kp_gemm p = {.out = 256, .w = 256, .x = 256, .m = m, .rows = rows, .cols = cols, .wdt = wdt};
    return gemm_kernel(&p, 0);
}

/* The kernel ppn_op_gemm runs on this shape with bf16 W over whole 64-column blocks (aligned pointers), else -1. */
static int gemm_x16_base(int m, int rows, int cols, int wdt)
{
    if (wdt != PPN_DTYPE_BF16 || m < 1 || rows < 1 || cols < 1 || cols % 64) return -1;
    return gemm_shape_kernel(m, rows, cols, wdt);
}

int ppn_op_gemm_sums(int m, int rows, int cols, int wdt)
{
    switch (gemm_shape_kernel(m, rows, cols, wdt)) {
    case PPN_K_GEMM: return PPN_GEMM_SUMS_SIMT;
    case PPN_K_GEMM_TC_K: return PPN_GEMM_TC_K_KS(rows) > 1u ? PPN_GEMM_SUMS_K : PPN_GEMM_SUMS_TILE;
    case PPN_K_GEMM_TC_KW:
    case PPN_K_GEMM_TC_KWX: return PPN_GEMM_SUMS_KW;
    default: return PPN_GEMM_SUMS_TILE;
    }
}

/* Where ppn_op_gemm runs gemm_tc_kw on bf16 weights over whole 64-column blocks: there gemm_tc_kw16 gives its bits
 * from x rounded to bf16 by its producer, in its layout (kparams.h, PPN_X16_POS), with a quarter of gemm_tc_kw's x
 * loads. H200, test_gpu_gemm's decode table, 2026-12-03 17:49 UTC (docs/PERF.md), % of the copy floor, kw against
 * kw16: 8B at m = 64 q|k|v 52.8 / 59.5, gate|up 78.1 / 84.1, down 49.9 / 64.4; m = 16 gate|up 88.1 / 91.6; 8B B=64
 * step 7.89-7.94 -> 7.25-7.32 ms. Not where the op takes gemm_tc_kwx (x through its ring, f32): on the 1B's q|k|v
 * and down it kept ahead (m = 64: 31.5 / 25.7, 42.7 / 37.7), and the 1B's B=64 step was 2.32 ms with kw16 there
 * against 2.18-2.22 without. The shape's choice alone (the pointers' alignment is the op's check). */
int ppn_op_gemm_x16_fits(int m, int rows, int cols, int wdt)
{
    return gemm_x16_base(m, rows, cols, wdt) == PPN_K_GEMM_TC_KW;
}

/* Where ppn_op_gemm runs gemm_tc_k on bf16 weights over whole 64-column blocks, gemm_tc_k16 gives its bits from x
 * in bf16 (its tile reads that layout through its ring as gemm_tc_kw16 does): half of x's bytes, which gemm_tc_k
 * reads once per 64 weight rows (at m = 16 half as many bytes as W's on the 8B's o and down). H200, tests/gpu's
 * decode table (2026-12-05 10:48 UTC, docs/PERF.md), % of the copy floor, gemm_tc_k / gemm_tc_k16: at m = 16 the 8B's
 * o 62.3 / 68.3, down 79.2 / 85.1, lm head 87.2 / 96.2; at m = 1 level (o 73.4 / 74.1, lm head 99.6 / 101.7). The
 * forward takes it (core/forward.c x16_takes). */
int ppn_op_gemm_k16_fits(int m, int rows, int cols, int wdt)
{
    return gemm_x16_base(m, rows, cols, wdt) == PPN_K_GEMM_TC_K;
}

ppn_status ppn_op_gemm_x16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x16, int m,
                           int rows, int cols, ppn_dptr bias, ppn_dptr res)
{
    static const char op[] = "ppn_op_gemm_x16";
    ppn_kp_gemm p = {.out = out, .w = w, .x = x16, .bias = bias, .res = res, .m = m, .rows = rows, .cols = cols,
                     .wdt = wdt, .ks = 0, .stages = 0, .ctas = 0};
    PPN_CHECK(gemm_check(op, &p, 2));
    int k16 = ppn_op_gemm_k16_fits(m, rows, cols, wdt);
    if (!k16 && !ppn_op_gemm_x16_fits(m, rows, cols, wdt))
        return ppn_err(PPN_EUNSUPPORTED, "%s: m %d, rows %d, cols %d, %s weights: bf16 x is taken only where "
                                         "ppn_op_gemm runs gemm_tc_kw or gemm_tc_k on bf16 weights "
                                         "(ppn_op_gemm_x16_fits, ppn_op_gemm_k16_fits); give ppn_op_gemm f32 x", op, m,
                       rows, cols, ppn_dtype_name(wdt));
    if (!gemm_tc_fits(&p))
        return ppn_err(PPN_EINVAL, "%s: w and x must be 16-byte aligned (w 0x%llx, x 0x%llx)", op,
                       (unsigned long long)w, (unsigned long long)x16);
    const int k = k16                   ? (gemm_tma_k16(g, s) ? PPN_K_GEMM_TC_K16T : PPN_K_GEMM_TC_K16)
                  : gemm_tma_kw(g, s)   ? PPN_K_GEMM_TC_KWT
                  : gemm_kx_on(g, s, m) ? PPN_K_GEMM_TC_KX
                                        : PPN_K_GEMM_TC_KW16;
    return gemm_submit(g, s, k, &p);
}

/* The fused SwiGLU ops' arguments (ppn_op_gemm_swiglu, ppn_op_gemm_swiglu_rows16): sizes, dtypes, pointers; then,
 * once the op knows it takes the shape, out [m, n] of odt apart from x16 [m, cols] bf16, and all three 16-byte
 * aligned. */
static ppn_status swiglu_args(const char *op, ppn_dptr out, int odt, ppn_dptr w, int wdt, ppn_dptr x16, int m, int n,
                              int cols)
{
    PPN_CHECK(need_positive(op, "m", m));
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_positive(op, "cols", cols));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_odt(op, odt, n));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "w", w));
    return need_ptr(op, "x16", x16);
}

static ppn_status swiglu_bufs(const char *op, ppn_dptr out, int odt, ppn_dptr w, ppn_dptr x16, int m, int n, int cols)
{
    size_t ob = (size_t)m * (size_t)n * odt_size(odt), xb = (size_t)m * (size_t)cols * 2u;
    if (out < x16 + xb && x16 < out + ob)
        return ppn_err(PPN_EINVAL, "%s: out [0x%llx, +%zu) overlaps x16 [0x%llx, +%zu)", op, (unsigned long long)out,
                       ob, (unsigned long long)x16, xb);
    if ((w | x16 | out) & 15u)
        return ppn_err(PPN_EINVAL, "%s: out, w and x16 must be 16-byte aligned (out 0x%llx, w 0x%llx, x16 0x%llx)", op,
                       (unsigned long long)out, (unsigned long long)w, (unsigned long long)x16);
    return PPN_OK;
}

/* SwiGLU in gemm_tc_kw16's epilogue: the gate|up output's round trip (m x 2 ffn f32 written, read back by swiglu
 * rows) and one launch a layer go. H200, test_gpu_gemm_swiglu, 2026-12-04 (docs/PERF.md), us a layer with bf16 out:
 * 8B gate|up m = 17 69.3 -> 64.3, m = 64 74.7 -> 66.7; 1B m = 64 38.6 -> 32.1; the 8B's B=64 step 7.07 from 7.10 ms.
 * See ops.h; sm_90a only (the kernel's split-K epilogue). */
int ppn_op_gemm_swiglu_fits(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt)
{
    return n > 0 && n % 64 == 0 && n <= INT32_MAX / 2 &&
           gemm_x16_base(m, 2 * n, cols, wdt) == PPN_K_GEMM_TC_KW && gemm_tma_sms(g, s) > 0;
}

ppn_status ppn_op_gemm_swiglu(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr w, int wdt, ppn_dptr x16,
                              int m, int n, int cols)
{
    static const char op[] = "ppn_op_gemm_swiglu";
    PPN_CHECK(swiglu_args(op, out, odt, w, wdt, x16, m, n, cols));
    if (!ppn_op_gemm_swiglu_fits(g, s, m, n, cols, wdt))
        return ppn_err(PPN_EUNSUPPORTED, "%s: m %d, n %d, cols %d, %s weights on backend %s: taken only where "
                                         "ppn_op_gemm_x16 takes the 2 n-row gate|up GEMM, n %% 64 == 0 and the device "
                                         "runs TMA kernels (ppn_op_gemm_swiglu_fits); use ppn_op_gemm_x16 and "
                                         "ppn_op_swiglu_rows_to", op, m, n, cols, ppn_dtype_name(wdt), g->ops->name);
    PPN_CHECK(swiglu_bufs(op, out, odt, w, x16, m, n, cols));
    size_t ob = (size_t)m * (size_t)n * odt_size(odt), xb = (size_t)m * (size_t)cols * 2u;
    ppn_kp_gemm_swiglu p = {.g = {.out = out, .w = w, .x = x16, .m = m, .rows = 2 * n, .cols = cols, .wdt = wdt},
                            .odt = odt, .pad = 0};
    p.g.ks = gemm_kw_ks(&p.g), p.g.stages = gemm_kw_depth(PPN_K_GEMM_TC_KW16); /* gemm_tc_kw16's split: its bits */
    ppn_launch l = gemm_geometry(PPN_K_GEMM_TC_KW16, &p.g);
    l.kernel = PPN_K_GEMM_SWIGLU, l.params = &p, l.params_size = sizeof p;
    ppn_kp_gemm_swiglu_t tp; /* gemm_swiglu_t (PPN_TMA=2): W's tensor map, then the same params */
    if (gemm_tma_kw(g, s)) {
        PPN_CHECK(gemm_wmap(g, s, op, &p.g, &tp.wmap));
        tp.g = p.g, tp.odt = p.odt, tp.pad = 0;
        l = gemm_geometry(PPN_K_GEMM_TC_KWT, &p.g); /* gemm_tc_kwt's grid, ring and mbarriers */
        l.kernel = PPN_K_GEMM_SWIGLU_T, l.params = &tp, l.params_size = sizeof tp;
    } else if (gemm_kx_on(g, s, m)) { /* PPN_GEMM_KX: gemm_tc_kx's grid and ring, the same params and bits */
        p.g.stages = gemm_kw_depth(PPN_K_GEMM_TC_KX);
        l = gemm_geometry(PPN_K_GEMM_TC_KX, &p.g);
        l.kernel = PPN_K_GEMM_SWIGLU_X, l.params = &p, l.params_size = sizeof p;
    }
    acc_add(&l, w, (size_t)p.g.rows * (size_t)cols * 2u, PPN_ACC_R);
    acc_add(&l, x16, xb, PPN_ACC_R);
    acc_add(&l, out, ob, PPN_ACC_W);
    return submit(g, s, &l);
}

int ppn_op_gemm_rows16_fits(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt)
{
    return wdt == PPN_DTYPE_BF16 && m > 0 && rows > 0 && cols > 0 && cols % 64 == 0 && gemm_tma_sms(g, s) > 0;
}

/* PPN_GEMM_W's level 2: gemm_tc_w from 16 tokens where its grid has 64 CTAs or more, and past 64 tokens from
 * 48 (a CTA owns its weight tile's rows for all of K, so a smaller grid leaves SMs idle where the split-K tiles do
 * not). One H100, tests/gpu's decode table, 2026-12-06 22:33 UTC (docs/PERF.md), us a launch, gemm_tc_w against the
 * forward's kernel before it: the 8B at 16 tokens q|k|v 19.85 / 22.55 (gemm_tc_k16; 96 CTAs), o 15.30 / 15.14 and
 * down 42.25 / 44.87 (64 each), the lm head 345.83 / 367.41; at 128 tokens q|k|v 25.54 / 37.37 (gemm_tc_kw16), o
 * 21.00 / 29.18, down 54.36 / 79.20; at 256 q|k|v 51.91 / 66.16 (48 CTAs) but o 50.48 / 47.33 and down 141.64 /
 * 123.33 (32 CTAs); the 1B's 2048-row o and down (32 CTAs up to 128 tokens) lost at every m but o's 128 (12.16 /
 * 12.87), its q|k|v (48) at 16 tokens (8.71 / 8.22) and won from 128 (12.20 / 13.63). */
#define GEMM_W_MIN_M 16
#define GEMM_W_MIN_CTAS 64
#define GEMM_W_MIN_CTAS_WIDE 48 /* past 64 tokens */
/* Level 3: level 2's rule from 256 tokens (prompt chunks: the engine's mixed iterations stop at 128 rows,
 * its step_rows), and only where ppn_op_gemm's own kernel has the tile sums (gemm_tc_l, gemm_tc_h, gemm_tc_m: no K
 * split; not the 8B's q|k|v at 256 tokens, on gemm_tc_kw), so the forward's bits are level 0's. Inside decode and
 * mixed steps (up to 128 rows) gemm_tc_w took ~51 us a launch against 33.6 in the decode table's bursts and the steps
 * came out level (B=16 +2.3%); prompt primes ran 25% faster (one H100, 2026-12-06 23:25 UTC, docs/PERF.md). */
#define GEMM_W_PROMPT_M 256
/* Level 4, the default since 2026-12-07: level 2's rule but where the op runs gemm_tc_k (up to gemm_k_max_m tokens:
 * 16 on the 8B's matrices, the B=16 step) or the device's PPN_GEMM_KX level runs gemm_tc_kx (65-80 tokens: one pass
 * over W, the 16 + 64-row iteration). Once the epilogues read res before they store (gemm_store_n), level 2 ran the
 * 8B's B=64 step 3.9% and its 16 + 112-row iteration 8.5% faster than level 3, but its B=16 step 3.5% and the 16 +
 * 64-row iteration 4.0% slower (one H100, 2026-12-07 08:44 UTC, two alternating rounds, docs/PERF.md): those two keep
 * the op's tiles here. Where it takes gemm_tc_w the sums are the large tiles' (PPN_GEMM_SUMS_TILE), not the split-K
 * tile's: within the fixtures' tolerance of transformers (tools/device/hf_compare.py under level 1, which takes it
 * everywhere, 2026-12-07 08:36 UTC), not level 0's bits. */
static int gemm_w4_skips(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt)
{
    const int k = gemm_shape_kernel(m, rows, cols, wdt);
    /* the op's gemm_tc_k, or its gemm_tc_kw where ppn_op_gemm_x16 and ppn_op_gemm_swiglu run gemm_tc_kx instead */
    return k == PPN_K_GEMM_TC_K || (k == PPN_K_GEMM_TC_KW && gemm_kx_on(g, s, m));
}

/* Level 2's rule: from GEMM_W_MIN_M tokens where gemm_tc_w's grid fills the device. */
static int gemm_w_fills(int m, int rows, int cols)
{
    ppn_kp_gemm p = {.m = m, .rows = rows, .cols = cols};
    const size_t ctas = gemm_w_ctas(&p);
    return m >= GEMM_W_MIN_M && ctas >= (m > 64 ? GEMM_W_MIN_CTAS_WIDE : GEMM_W_MIN_CTAS);
}

int ppn_op_gemm_rows16_takes(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt)
{
    if (!g || g->gemm_w == 0 || !ppn_op_gemm_rows16_fits(g, s, m, rows, cols, wdt)) return 0;
    if (g->gemm_w == 1) return 1;
    if (g->gemm_w == 3 && (m < GEMM_W_PROMPT_M || ppn_op_gemm_sums(m, rows, cols, wdt) != PPN_GEMM_SUMS_TILE)) return 0;
    if (g->gemm_w == 4 && gemm_w4_skips(g, s, m, rows, cols, wdt)) return 0;
    return gemm_w_fills(m, rows, cols);
}

int ppn_op_gemm_sums_on(ppn_gpu *g, ppn_gstream *s, int m, int rows, int cols, int wdt)
{
    return ppn_op_gemm_rows16_takes(g, s, m, rows, cols, wdt) ? PPN_GEMM_SUMS_TILE
                                                               : ppn_op_gemm_sums(m, rows, cols, wdt);
}

ppn_status ppn_op_gemm_rows16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x16, int m,
                              int rows, int cols, ppn_dptr bias, ppn_dptr res)
{
    static const char op[] = "ppn_op_gemm_rows16";
    ppn_kp_gemm p = {.out = out, .w = w, .x = x16, .bias = bias, .res = res, .m = m, .rows = rows, .cols = cols,
                     .wdt = wdt, .ks = 0, .stages = 0, .ctas = 0};
    PPN_CHECK(gemm_check(op, &p, 2));
    if (!ppn_op_gemm_rows16_fits(g, s, m, rows, cols, wdt))
        return ppn_err(PPN_EUNSUPPORTED, "%s: m %d, rows %d, cols %d, %s weights on backend %s: gemm_tc_w takes bf16 "
                                         "weights over cols %% 64 == 0 on a device that runs the TMA kernels "
                                         "(ppn_op_gemm_rows16_fits); give ppn_op_gemm f32 x", op, m, rows, cols,
                       ppn_dtype_name(wdt), g->ops->name);
    if (gemm_w_ctas(&p) > GEMM_MAX_CTAS)
        return ppn_err(PPN_EINVAL, "%s: m %d x rows %d needs more than 2^31 - 1 CTAs of gemm_tc_w", op, m, rows);
    if (!gemm_tc_fits(&p))
        return ppn_err(PPN_EINVAL, "%s: w and x16 must be 16-byte aligned (w 0x%llx, x16 0x%llx)", op,
                       (unsigned long long)w, (unsigned long long)x16);
    return gemm_submit(g, s, PPN_K_GEMM_TC_W, &p);
}

/* gemm_tc_w and swiglu rows in one kernel, for the gate|up GEMM where gemm_tc_w takes it at up to 128 tokens: the
 * gate|up output's round trip (m x 2 n f32) and a launch go, and two warpgroups (gate, up) share x's box of each
 * k-tile with two CTAs an SM (kparams.h). See ops.h. */
int ppn_op_gemm_swiglu_rows16_fits(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt)
{
    return n > 0 && n % 64 == 0 && n <= INT32_MAX / 2 && m <= PPN_GEMM_SWIGLU_W_MAX_M &&
           ppn_op_gemm_rows16_fits(g, s, m, 2 * n, cols, wdt);
}

/* PPN_GEMM_W_SWIGLU's levels: 1 where PPN_GEMM_W's level takes the 2 n-row GEMM; 2, the default, also where level 4
 * leaves it to the op's gemm_tc_kx (gemm_swiglu_x) but level 2's rule would take it: the 8B's gate|up at 16 and 65-80
 * rows. One H100, 2026-12-07 (docs/PERF.md): in the decode table's bursts gemm_swiglu_w 83.37 us at 16 against
 * gemm_swiglu_x's 89.67, 97.85 against 104.06 at 80, but 107.87 against 101.34 at 65; in the forward, level 2 against
 * 1, two rounds alternating, the 8B's B=16 step 6.560, 6.605 against 6.807, 6.810 ms and its 16 + 64-row iteration
 * 10.375, 10.368 against 10.516, 10.593 ms. Not where the op runs gemm_tc_k: the 1B's gate|up at 16 rows (gemm_tc_k16
 * then SwiGLU rows) took the 1B's B=16 step from 1.466, 1.467 to 1.498, 1.495 ms on that H100 when level 2 took it
 * there too (the first rule, 85a2f26). */
int ppn_op_gemm_swiglu_rows16_takes(ppn_gpu *g, ppn_gstream *s, int m, int n, int cols, int wdt)
{
    if (!g || !g->gemm_w_swiglu || !ppn_op_gemm_swiglu_rows16_fits(g, s, m, n, cols, wdt)) return 0;
    if (ppn_op_gemm_rows16_takes(g, s, m, 2 * n, cols, wdt)) return 1;
    return g->gemm_w_swiglu == 2 && g->gemm_w == 4 && gemm_w_fills(m, 2 * n, cols) &&
           gemm_shape_kernel(m, 2 * n, cols, wdt) == PPN_K_GEMM_TC_KW && gemm_kx_on(g, s, m);
}

ppn_status ppn_op_gemm_swiglu_rows16(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr w, int wdt,
                                     ppn_dptr x16, int m, int n, int cols)
{
    static const char op[] = "ppn_op_gemm_swiglu_rows16";
    PPN_CHECK(swiglu_args(op, out, odt, w, wdt, x16, m, n, cols));
    if (!ppn_op_gemm_swiglu_rows16_fits(g, s, m, n, cols, wdt))
        return ppn_err(PPN_EUNSUPPORTED, "%s: m %d, n %d, cols %d, %s weights on backend %s: gemm_swiglu_w takes bf16 "
                                         "weights, n %% 64 == 0, cols %% 64 == 0 and up to %d tokens on a device that "
                                         "runs the TMA kernels (ppn_op_gemm_swiglu_rows16_fits); use "
                                         "ppn_op_gemm_rows16 and ppn_op_swiglu_rows_to", op, m, n, cols,
                       ppn_dtype_name(wdt), g->ops->name, PPN_GEMM_SWIGLU_W_MAX_M);
    PPN_CHECK(swiglu_bufs(op, out, odt, w, x16, m, n, cols));
    size_t ob = (size_t)m * (size_t)n * odt_size(odt), xb = (size_t)m * (size_t)cols * 2u;
    ppn_kp_gemm_swiglu_w p = {.g = {.out = out, .w = w, .x = x16, .m = m, .rows = 2 * n, .cols = cols, .wdt = wdt},
                              .odt = odt, .pad = 0};
    ppn_tmap_desc xd = {.base = x16, .elem_bytes = 2, .dim = {(uint64_t)cols, (uint64_t)m},
                        .row_bytes = (uint64_t)cols * 2u, .box = {64u, (unsigned)PPN_GEMM_SWIGLU_W_BT(m)}};
    PPN_CHECK(gemm_wmap(g, s, op, &p.g, &p.wmap));
    memset(&p.xmap, 0, sizeof p.xmap);
    PPN_CHECK(g->ops->tmap_encode(g, s, &xd, &p.xmap));
    const size_t ctas = (size_t)(n / 64) * (size_t)blocks_for(m, (unsigned)PPN_GEMM_SWIGLU_W_BT(m));
    ppn_launch l = launch_init(PPN_K_GEMM_SWIGLU_W, &p, (unsigned)ctas, PPN_GEMM_SWIGLU_W_THREADS);
    l.smem = PPN_GEMM_SWIGLU_W_SMEM(m);
    acc_add(&l, w, (size_t)p.g.rows * (size_t)cols * 2u, PPN_ACC_R);
    acc_add(&l, x16, xb, PPN_ACC_R);
    acc_add(&l, out, ob, PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_gemm_tile(ppn_gpu *g, ppn_gstream *s, int kernel, const ppn_kp_gemm *p)
{
    static const char op[] = "ppn_op_gemm_tile";
    if (kernel != PPN_K_GEMM && kernel != PPN_K_GEMM_TC_L && kernel != PPN_K_GEMM_TC_M && kernel != PPN_K_GEMM_TC_S &&
        !gemm_is_k(kernel) && !gemm_is_kw(kernel) && kernel != PPN_K_GEMM_TC_H && kernel != PPN_K_GEMM_TC_W)
        return ppn_err(PPN_EINVAL, "%s: kernel %d is not a gemm kernel", op, kernel);
    PPN_CHECK(gemm_check(op, p, gemm_x_es(kernel)));
    if (gemm_x_es(kernel) == 2 && (p->wdt != PPN_DTYPE_BF16 || p->cols % 64))
        return ppn_err(PPN_EINVAL, "%s: %s takes bf16 weights (and bf16 x) over cols %% 64 == 0, not %s over %d", op,
                       ppn_kernels[kernel].name, ppn_dtype_name(p->wdt), p->cols);
    if (p->ctas < 0) return ppn_err(PPN_EINVAL, "%s: ctas %d (0: the op's choice)", op, p->ctas);
    const int tma_kernel = kernel == PPN_K_GEMM_TC_H || kernel == PPN_K_GEMM_TC_KWT || kernel == PPN_K_GEMM_TC_K16T ||
                           kernel == PPN_K_GEMM_TC_KX || /* gemm_tc_kx: sm_90a code, as the TMA kernels */
                           kernel == PPN_K_GEMM_TC_W;
    if (tma_kernel && !gemm_tma_sms(g, s))
        return ppn_err(PPN_EUNSUPPORTED, "%s: %s on backend %s: the stream's device runs no TMA kernels "
                                         "(compute capability 9.x and sm_90a code, PPN_TMA not 0)", op,
                       ppn_kernels[kernel].name, g->ops->name);
    const int kw = gemm_is_kw(kernel);
    if ((gemm_is_k(kernel) || kw) && p->ks &&
        p->ks != 1 && p->ks != 2 && p->ks != 4 && p->ks != 8)
        return ppn_err(PPN_EINVAL, "%s: ks %d for %s: 1, 2, 4 or 8 CTAs of a cluster of %d (or 0: the op's)", op,
                       p->ks, ppn_kernels[kernel].name, PPN_GEMM_TC_K_CLUSTER);
    if (gemm_is_k(kernel) && p->stages &&
        ((p->stages != 3 && p->stages != 4) || gemm_k_smem(kernel, p->m, p->stages) > PPN_DYN_SMEM_MAX))
        return ppn_err(PPN_EINVAL, "%s: stages %d for %s: 3 or 4 whose ring fits %u B at m %d (or 0: the op's)", op,
                       p->stages, ppn_kernels[kernel].name, PPN_DYN_SMEM_MAX, p->m);
    if (kw && p->stages && p->stages != gemm_kw_depth(kernel))
        return ppn_err(PPN_EINVAL, "%s: stages %d for %s: %d (or 0: the op's)", op, p->stages, ppn_kernels[kernel].name,
                       gemm_kw_depth(kernel));
    if (gemm_is_k(kernel) && gemm_k_ctas(p) > GEMM_MAX_CTAS)
        return ppn_err(PPN_EINVAL, "%s: m %d x rows %d needs more than 2^31 - 1 CTAs of %s", op, p->m, p->rows,
                       ppn_kernels[kernel].name);
    if (kw && gemm_kw_ctas(p) > GEMM_MAX_CTAS)
        return ppn_err(PPN_EINVAL, "%s: m %d x rows %d needs more than 2^31 - 1 CTAs of %s", op, p->m, p->rows,
                       ppn_kernels[kernel].name);
    if (kernel != PPN_K_GEMM && !gemm_tc_fits(p))
        return ppn_err(PPN_EINVAL, "%s: %s needs 2-byte weights, cols %% 8 == 0 and 16-byte-aligned w and x (dtype "
                                   "%s, cols %d)", op, ppn_kernels[kernel].name, ppn_dtype_name(p->wdt), p->cols);
    return gemm_submit(g, s, kernel, p);
}
