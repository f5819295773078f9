/* ops.c - typed launch wrappers: validate the sizes, fill the kernel's params struct, declare exactly the
 * bytes it reads and writes (the sim checker proves the stream laws from these), pick the cuda geometry and
 * launch through the device layer.
 *
 * Every wrapper returns PPN_OK, PPN_EINVAL (a non-positive size, an unknown weight dtype, a required pointer
 * that is 0, or a size rule named in the message) or whatever g->ops->launch returns (PPN_EDRIVER,
 * PPN_ENOKERNELS on cuda; a sticky checker status such as PPN_ERACE or PPN_EBOUNDS on sim).
 *
 * The geometry is a function of the sizes alone: the CUDA reductions are shaped by it, so fixing it per size
 * is what makes their bits repeat from run to run. Contract with ppn_kernels.cu: blocks are whole warps,
 * at most 1024 threads; attention at most 16 warps, head_dim <= 256 and n_split <= 64.
 */
#include "core/base/dtype.h"
#include "kernels/ops.h"
#include "core/base/err.h"
#include "kernels/ops_internal.h"

#define ELEM_BLOCK 256u     /* elementwise kernels: one element per thread */
#define NORM_BLOCK 512u     /* rmsnorm: one block sums the whole vector */
#define HEADNORM_BLOCK 128u /* per-head rmsnorm: one block per head */
#define MATVEC_BLOCK 256u   /* matvec threads per block: a multiple of 32 x the kernel's largest G (8) */
#define MATVEC_INFLIGHT 8u  /* 16-byte weight chunks a matvec thread has in flight (PPN_MV_U) */
#define MATVEC_MAX_SPLIT 8u /* at most G warps share a row (PPN_MV_MAX_SPLIT) */
#define MATVEC_SMS 132u        /* the H200's SMs: the resident wave is sized for it */
#define MATVEC_MAX_PER_SM 4u   /* 256 threads x 64 registers: 4 blocks fill an SM's register file */
#define MATVEC_SM_SMEM 232448u /* shared memory an H200 SM gives its blocks (227 KB) */
#define MATVEC_WIDE_X 16384u   /* staged x bytes from which 512-thread blocks are taken at equal threads an SM */
#define MATVEC_BLOCK_SMEM 1280u /* per block beside the staged x: static s_part (256 B) + 1 KB the driver keeps */
/* x is staged in shared memory up to the opt-in every kernel gets (PPN_DYN_SMEM_MAX), less the kernel's
 * static s_part (2 x 32 floats). A fused input (the norm) must be staged, so that is its cols limit. */
#define MATVEC_STAGE_MAX (PPN_DYN_SMEM_MAX - 256u)
#define ROPE_BLOCK 64u      /* one block per head, a thread per rotated pair */
#define ATTN_BLOCK 256u     /* one block per (KV head, position split), 8 warps; two blocks fit an SM */
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_ROPE_MAX_HEAD_DIM 128 /* the fused rotary (PPN_ATTN_ROPE_MAXJ in the kernel) */
#define ATTN_MAX_SPLIT 64   /* the kernel's merge stages one {max, sum} pair per split in shared memory */
#define ATTN_SPLIT_CAP 64   /* the most ppn_op_attn_split picks: more splits only lengthen the merge */
#define ARGMAX_WIDE_BLOCK 512u  /* the split argmax: 128 blocks of 512 threads cover a 64K vocabulary in one */
#define ARGMAX_WIDE_GRID 128    /* pass per thread and a 128K one in two */

#define MATMAT_BLOCK 256 /* 8 warps: 8 rows per CTA */

ppn_status ppn_op_embed(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr table, int wdt, int vocab, int dim,
                        ppn_dptr hdr)
{
    static const char op[] = "ppn_op_embed";
    PPN_CHECK(need_positive(op, "vocab", vocab));
    PPN_CHECK(need_positive(op, "dim", dim));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "table", table));
    PPN_CHECK(need_ptr(op, "hdr", hdr));
    ppn_kp_embed p = {.out = out, .table = table, .hdr = hdr, .dim = dim, .vocab = vocab, .wdt = wdt};
    ppn_launch l = launch_init(PPN_K_EMBED, &p, blocks_for(dim, ELEM_BLOCK), ELEM_BLOCK);
    acc_add(&l, table, (size_t)vocab * (size_t)dim * ppn_dtype_size(wdt), PPN_ACC_R);
    acc_add(&l, hdr, sizeof(ppn_step_hdr), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)dim), PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_rmsnorm(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr in, ppn_dptr w, int wdt, int n,
                          float eps)
{
    static const char op[] = "ppn_op_rmsnorm";
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "in", in));
    PPN_CHECK(need_ptr(op, "w", w));
    ppn_kp_rmsnorm p = {.out = out, .in = in, .w = w, .n = n, .wdt = wdt, .eps = eps};
    ppn_launch l = launch_init(PPN_K_RMSNORM, &p, 1, NORM_BLOCK);
    acc_add(&l, in, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, w, (size_t)n * ppn_dtype_size(wdt), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)n), PPN_ACC_W);
    return submit(g, s, &l);
}

/* x is read by every row while out is written, so they must not overlap (res may alias out). */
static ppn_status matvec_check(ppn_dptr out, ppn_dptr x, int rows, int cols)
{
    static const char op[] = "ppn_op_matvec";
    size_t ob = f32_bytes((size_t)rows), xb = f32_bytes((size_t)cols);
    if (out < x + xb && x < out + ob)
        return ppn_err(PPN_EINVAL, "%s: out [0x%llx, +%zu) overlaps x [0x%llx, +%zu)", op,
                       (unsigned long long)out, ob, (unsigned long long)x, xb);
    return PPN_OK;
}

/* The kernel gives each row G warps, G = the fewest (a power of 2, at most MATVEC_MAX_SPLIT) that have the
 * row's 16-byte chunks all in flight at once, MATVEC_INFLIGHT per thread; it picks G from cols and the dtype
 * alone (ppn_mv_split), so a row's bits never depend on the geometry chosen here nor on how many rows share
 * the launch (forward.c stacks q, k, v). G is mirrored here only to count the blocks. At most
 * MATVEC_MAX_BLOCKS blocks, each looping over rows: on the H200 sweep (tests/gpu/test_gpu_kernels.c,
 * 2026-11-29) one resident wave beat a block per row slot where the rows make one to two waves (llama-1b
 * down 16.6 -> 13.8 us, llama-8b qkv 18.4 -> 17.0 us) and stayed within 3% elsewhere. x is staged in shared
 * memory when it fits. */
static ppn_launch matvec_geometry(const ppn_kp_matvec *p, size_t es)
{
    _Static_assert(MATVEC_BLOCK % (32u * MATVEC_MAX_SPLIT) == 0, "matvec blocks hold whole row groups");
    size_t chunks = ((size_t)p->cols * es + 15u) / 16u, per_group = 32u * MATVEC_INFLIGHT;
    unsigned split = 1;
    while (split < MATVEC_MAX_SPLIT && chunks > per_group * split) split *= 2u;
    unsigned block = MATVEC_BLOCK, smem = 0, per_sm = MATVEC_MAX_PER_SM;
    if ((size_t)p->cols * sizeof(float) <= MATVEC_STAGE_MAX) smem = (unsigned)((size_t)p->cols * sizeof(float));
    /* a large staged x leaves room for fewer resident blocks: the wave is what fits */
    unsigned fit = smem ? MATVEC_SM_SMEM / (smem + MATVEC_BLOCK_SMEM) : 0; /* blocks an SM's shared memory holds */
    if (smem && fit < per_sm) per_sm = fit;
    /* Fewer, wider blocks when that keeps more threads (weight loads in flight) on an SM, or as many while a
     * staged x of MATVEC_WIDE_X bytes or more is copied half as often: one staged x then serves 512 threads.
     * llama-8b's down projection (x of 57 KB) gets 2 x 512 threads an SM instead of 3 x 256 (8B step 4.673 ->
     * 4.507 ms); from 16 KB of x, llama-1b's down and llama-8b's q|k|v, o, gate|up and lm head get 2 x 512
     * instead of 4 x 256 (device greedy 1B 0.997 -> 0.972..0.979 ms, 8B 4.514 -> 4.447 ms; H200,
     * docs/PERF.md). The bits do not change: a row's reduction depends on its G alone. */
    unsigned per_sm2 = fit < MATVEC_MAX_PER_SM / 2u ? fit : MATVEC_MAX_PER_SM / 2u;
    if (per_sm2 * 2u > per_sm || (smem >= MATVEC_WIDE_X && per_sm2 * 2u == per_sm))
        block = 2u * MATVEC_BLOCK, per_sm = per_sm2;
    unsigned blocks = blocks_for(p->rows, block / (32u * split));
    if (blocks > MATVEC_SMS * per_sm) blocks = MATVEC_SMS * per_sm;
    ppn_launch l = launch_init(PPN_K_MATVEC, p, blocks, block);
    l.smem = smem;
    return l;
}

ppn_status ppn_op_matvec_in(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_mv_input in,
                            int rows, int cols, ppn_dptr bias, ppn_dptr res)
{
    static const char op[] = "ppn_op_matvec";
    PPN_CHECK(need_positive(op, "rows", rows));
    PPN_CHECK(need_positive(op, "cols", cols));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "w", w));
    PPN_CHECK(need_ptr(op, "x", in.x));
    if (in.mode != PPN_MV_X_PLAIN && in.mode != PPN_MV_X_RMSNORM)
        return ppn_err(PPN_EINVAL, "%s: input mode %d is not PPN_MV_X_PLAIN/RMSNORM", op, in.mode);
    if (in.mode == PPN_MV_X_RMSNORM) PPN_CHECK(need_ptr(op, "norm weight", in.nw));
    if (in.mode != PPN_MV_X_PLAIN && (size_t)cols * sizeof(float) > MATVEC_STAGE_MAX)
        return ppn_err(PPN_EUNSUPPORTED, "%s: a fused input of %d columns does not fit the %u bytes of shared "
                       "memory it is computed in (at most %zu columns)", op, cols, MATVEC_STAGE_MAX,
                       (size_t)MATVEC_STAGE_MAX / sizeof(float));
    PPN_CHECK(matvec_check(out, in.x, rows, cols));
    size_t es = ppn_dtype_size(wdt);
    ppn_kp_matvec p = {.out = out, .w = w, .x = in.x, .bias = bias, .res = res, .nw = in.nw, .rows = rows,
                       .cols = cols, .wdt = wdt, .xmode = in.mode, .eps = in.eps};
    ppn_launch l = matvec_geometry(&p, es);
    acc_add(&l, w, (size_t)rows * (size_t)cols * es, PPN_ACC_R);
    acc_add(&l, in.x, f32_bytes((size_t)cols), PPN_ACC_R);
    if (in.mode == PPN_MV_X_RMSNORM) acc_add(&l, in.nw, (size_t)cols * es, PPN_ACC_R);
    if (bias) acc_add(&l, bias, (size_t)rows * es, PPN_ACC_R);
    if (res) acc_add(&l, res, f32_bytes((size_t)rows), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)rows), PPN_ACC_W);
    return submit(g, s, &l);
}

int ppn_op_matvec_fusable(int cols) { return cols > 0 && (size_t)cols * sizeof(float) <= MATVEC_STAGE_MAX; }

ppn_status ppn_op_matvec(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int rows,
                         int cols, ppn_dptr bias, ppn_dptr res)
{
    ppn_mv_input in = {.mode = PPN_MV_X_PLAIN, .x = x};
    return ppn_op_matvec_in(g, s, out, w, wdt, in, rows, cols, bias, res);
}

/* The rotary's checks, then its geometry and accesses with the KV store's (whose arguments the caller
 * validated). The row stored depends on hdr->pos, which lives in device memory, so every block the view holds
 * (an identity view: the whole pools) is declared. */
static ppn_status rope_submit(ppn_gpu *g, ppn_gstream *s, const char *op, const ppn_kp_rope *p, const ppn_kv_view *kv)
{
    PPN_CHECK(need_positive(op, "head_dim", p->head_dim));
    if (p->head_dim % 2) return ppn_err(PPN_EINVAL, "%s: head_dim must be even (got %d)", op, p->head_dim);
    PPN_CHECK(need_ptr(op, "qk", p->x));
    PPN_CHECK(need_ptr(op, "inv_freq", p->inv_freq));
    PPN_CHECK(need_ptr(op, "hdr", p->hdr));
    size_t kvn = (size_t)p->n_kv * (size_t)p->head_dim;
    ppn_launch l = launch_init(PPN_K_ROPE, p, (unsigned)p->n_heads, ROPE_BLOCK);
    acc_add(&l, p->x, f32_bytes((size_t)p->n_heads * (size_t)p->head_dim), PPN_ACC_RW);
    acc_add(&l, p->inv_freq, f32_bytes((size_t)p->head_dim / 2), PPN_ACC_R);
    acc_add(&l, p->hdr, sizeof(ppn_step_hdr), PPN_ACC_R);
    acc_add(&l, p->v, f32_bytes(kvn), PPN_ACC_R);
    return ppn_kv_submit(g, s, &l, kv, p->n_kv, p->head_dim, 0, ppn_kv_view_limit(kv), PPN_ACC_W);
}

ppn_status ppn_op_rope_kv(ppn_gpu *g, ppn_gstream *s, ppn_dptr qk, int n_q, int n_kv, int head_dim,
                          ppn_dptr inv_freq, int interleaved, ppn_dptr hdr, const ppn_kv_view *kv, ppn_dptr v)
{
    static const char op[] = "ppn_op_rope_kv";
    PPN_CHECK(ppn_kv_view_check(op, kv));
    PPN_CHECK(need_positive(op, "n_q", n_q));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    PPN_CHECK(need_ptr(op, "v", v));
    const ppn_kv_pool *pl = &kv->pool;
    ppn_kp_rope p = {.x = qk, .inv_freq = inv_freq, .hdr = hdr, .kc = pl->k, .vc = pl->v, .v = v, .tbl = kv->tbl,
                     .n_heads = n_q + n_kv, .head_dim = head_dim, .interleaved = interleaved ? 1 : 0, .n_kv = n_kv,
                     .cap = pl->cap, .kvdt = pl->kvdt, .block_log2 = pl->block_log2};
    return rope_submit(g, s, op, &p, kv);
}

ppn_status ppn_op_head_rmsnorm(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int n_heads, int head_dim, ppn_dptr w,
                               int wdt, float eps)
{
    static const char op[] = "ppn_op_head_rmsnorm";
    PPN_CHECK(need_positive(op, "n_heads", n_heads));
    PPN_CHECK(need_positive(op, "head_dim", head_dim));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "x", x));
    PPN_CHECK(need_ptr(op, "w", w));
    ppn_kp_head_rmsnorm p = {.x = x, .w = w, .n_heads = n_heads, .head_dim = head_dim, .wdt = wdt, .eps = eps};
    ppn_launch l = launch_init(PPN_K_HEAD_RMSNORM, &p, (unsigned)n_heads, HEADNORM_BLOCK);
    acc_add(&l, x, f32_bytes((size_t)n_heads * (size_t)head_dim), PPN_ACC_RW);
    acc_add(&l, w, (size_t)head_dim * ppn_dtype_size(wdt), PPN_ACC_R);
    return submit(g, s, &l);
}

size_t ppn_op_kv_cache_bytes(int n_kv, int head_dim, int cap, int kvdt)
{
    if (n_kv <= 0 || head_dim <= 0 || cap <= 0) return 0;
    return (size_t)n_kv * (size_t)head_dim * (size_t)cap * ppn_dtype_size(kvdt);
}

size_t ppn_op_attn_scratch_bytes(int n_heads, int n_split, int head_dim)
{
    if (n_heads <= 0 || n_split <= 0 || head_dim <= 0) return 0;
    size_t recs = (size_t)n_heads * (size_t)n_split * ((size_t)head_dim + 2u);
    return f32_bytes(recs) + (size_t)n_heads * sizeof(uint32_t);
}

/* About two CTAs per SM (the kernel's occupancy) over the n_kv x n_split grid: fewer leave SMs idle at long
 * context, more only add partials to merge. */
int ppn_op_attn_split(int n_kv, int sm_count)
{
    if (n_kv <= 0 || sm_count <= 0) return 1;
    int n = (2 * sm_count + n_kv - 1) / n_kv;
    return n < 1 ? 1 : n > ATTN_SPLIT_CAP ? ATTN_SPLIT_CAP : n;
}

static ppn_status attn_check(const char *op, int n_heads, int n_kv, int head_dim, int n_split)
{
    if (n_split < 1 || n_split > ATTN_MAX_SPLIT)
        return ppn_err(PPN_EINVAL, "%s: n_split must be in 1..%d (got %d)", op, ATTN_MAX_SPLIT, n_split);
    PPN_CHECK(need_positive(op, "n_heads", n_heads));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    PPN_CHECK(need_positive(op, "head_dim", head_dim));
    if (n_heads % n_kv)
        return ppn_err(PPN_EINVAL, "%s: n_heads (%d) must be a multiple of n_kv (%d)", op, n_heads, n_kv);
    if (head_dim > ATTN_MAX_HEAD_DIM)
        return ppn_err(PPN_EUNSUPPORTED, "%s: head_dim %d exceeds the kernel's limit %d", op, head_dim,
                       ATTN_MAX_HEAD_DIM);
    return PPN_OK;
}

/* The checks, geometry and accesses attn and attn_rope share (p->inv_freq set: the fused rotary). The whole
 * scratch is declared read-write whatever n_split is: its counters carry state between launches, so two
 * streams sharing one scratch must be ordered (the checker sees it). The positions read and the row written at
 * hdr->pos depend on device memory, so every block the view holds is declared (read-write with the fused
 * rotary). */
static ppn_status attn_submit(ppn_gpu *g, ppn_gstream *s, const char *op, const ppn_kp_attn *p, const ppn_kv_view *kv)
{
    PPN_CHECK(ppn_kv_view_check(op, kv));
    PPN_CHECK(attn_check(op, p->n_heads, p->n_kv, p->head_dim, p->n_split));
    if (p->inv_freq) { /* the fused rotary's shapes */
        if (p->head_dim % 2) return ppn_err(PPN_EINVAL, "%s: head_dim must be even (got %d)", op, p->head_dim);
        PPN_CHECK(need_rope_fits(op, p->head_dim, p->interleaved, "rope_kv + attn"));
    }
    PPN_CHECK(need_ptr(op, "out", p->out));
    PPN_CHECK(need_ptr(op, "q", p->q));
    PPN_CHECK(need_ptr(op, "hdr", p->hdr));
    PPN_CHECK(need_ptr(op, "part", p->part));
    size_t qb = f32_bytes((size_t)p->n_heads * (size_t)p->head_dim);
    size_t kvb = f32_bytes((size_t)p->n_kv * (size_t)p->head_dim);
    int cmode = p->inv_freq ? PPN_ACC_RW : PPN_ACC_R;
    int k = p->kvdt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BF16 : p->kvdt == PPN_DTYPE_F16 ? PPN_K_ATTN_F16 : PPN_K_ATTN;
    ppn_launch l = launch_init(k, p, (unsigned)p->n_kv, ATTN_BLOCK); /* a CTA per KV head's group */
    l.grid[1] = (unsigned)p->n_split; /* never pos: the launch is the same for every step */
    acc_add(&l, p->q, p->inv_freq ? qb + 2u * kvb : qb, PPN_ACC_R);
    acc_add(&l, p->hdr, sizeof(ppn_step_hdr), PPN_ACC_R);
    acc_add(&l, p->part, ppn_op_attn_scratch_bytes(p->n_heads, p->n_split, p->head_dim), PPN_ACC_RW);
    acc_add(&l, p->out, qb, PPN_ACC_W);
    if (p->inv_freq) acc_add(&l, p->inv_freq, f32_bytes((size_t)p->head_dim / 2), PPN_ACC_R);
    return ppn_kv_submit(g, s, &l, kv, p->n_kv, p->head_dim, 0, ppn_kv_view_limit(kv), cmode);
}

/* The params' KV fields from a view (checked by attn_submit; a NULL view is caught there). */
static void attn_kv(ppn_kp_attn *p, const ppn_kv_view *kv)
{
    if (!kv) return;
    p->kc = kv->pool.k, p->vc = kv->pool.v, p->tbl = kv->tbl, p->cap = kv->pool.cap, p->kvdt = kv->pool.kvdt;
    p->block_log2 = kv->pool.block_log2;
}

/* Also returns PPN_EUNSUPPORTED for head_dim > 256 (the CUDA kernel keeps a head's output in registers). */
ppn_status ppn_op_attn(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr q, const ppn_kv_view *kv, int n_heads,
                       int n_kv, int head_dim, float scale, ppn_dptr hdr, ppn_dptr part, int n_split)
{
    ppn_kp_attn p = {.out = out, .q = q, .hdr = hdr, .part = part, .n_heads = n_heads, .n_kv = n_kv,
                     .head_dim = head_dim, .n_split = n_split, .scale = scale};
    attn_kv(&p, kv);
    return attn_submit(g, s, "ppn_op_attn", &p, kv);
}

/* The kernel rotates a row where attention holds it (lane l: dims l + 32 i, i < NJ = 2, 4 for head_dim up
 * to 64, 128), so each pair must be in one lane or on two lanes l, l ^ m: interleaved pairs (2i, 2i + 1) always
 * are (m = 1); halves (i, i + head_dim / 2) when head_dim = 32 NJ (one lane) or head_dim <= 32 is a power of
 * two (m = head_dim / 2). Wider heads (NJ = 8) would spill. */
int ppn_op_attn_rope_fits(int head_dim, int interleaved)
{
    if (head_dim <= 0 || head_dim > ATTN_ROPE_MAX_HEAD_DIM || head_dim % 2) return 0;
    int pow2 = (head_dim & (head_dim - 1)) == 0;
    return interleaved || head_dim == 64 || head_dim == 128 || (head_dim <= 32 && pow2);
}

ppn_status ppn_op_attn_rope(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, const ppn_kv_view *kv,
                            int n_heads, int n_kv, int head_dim, float scale, ppn_dptr hdr, ppn_dptr part,
                            int n_split, ppn_dptr inv_freq, int interleaved)
{
    static const char op[] = "ppn_op_attn_rope";
    PPN_CHECK(need_ptr(op, "inv_freq", inv_freq)); /* attn_submit checks the rest */
    ppn_kp_attn p = {.out = out, .q = qkv, .hdr = hdr, .part = part, .inv_freq = inv_freq, .n_heads = n_heads,
                     .n_kv = n_kv, .head_dim = head_dim, .n_split = n_split, .interleaved = interleaved ? 1 : 0,
                     .scale = scale};
    attn_kv(&p, kv);
    return attn_submit(g, s, op, &p, kv);
}

ppn_status ppn_op_swiglu(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr gate, ppn_dptr up, int n)
{
    static const char op[] = "ppn_op_swiglu";
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "gate", gate));
    PPN_CHECK(need_ptr(op, "up", up));
    ppn_kp_swiglu p = {.out = out, .gate = gate, .up = up, .n = n};
    ppn_launch l = launch_init(PPN_K_SWIGLU, &p, blocks_for(n, ELEM_BLOCK), ELEM_BLOCK);
    acc_add(&l, gate, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, up, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)n), PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_add(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr a, ppn_dptr b, int n)
{
    static const char op[] = "ppn_op_add";
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "a", a));
    PPN_CHECK(need_ptr(op, "b", b));
    ppn_kp_add p = {.out = out, .a = a, .b = b, .n = n};
    ppn_launch l = launch_init(PPN_K_ADD, &p, blocks_for(n, ELEM_BLOCK), ELEM_BLOCK);
    acc_add(&l, a, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, b, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)n), PPN_ACC_W);
    return submit(g, s, &l);
}

size_t ppn_op_argmax_scratch_bytes(void) { return (size_t)ARGMAX_WIDE_GRID * 8u + 4u; }

/* out_i32 receives the lowest index of the largest value, or -1 when any value is NaN or infinite:
 * ARGMAX_WIDE_GRID blocks merging through the scratch. */
ppn_status ppn_op_argmax_wide(ppn_gpu *g, ppn_gstream *s, ppn_dptr out_i32, ppn_dptr x, int n, ppn_dptr part)
{
    static const char op[] = "ppn_op_argmax_wide";
    PPN_CHECK(need_ptr(op, "part", part));
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_ptr(op, "out", out_i32));
    PPN_CHECK(need_ptr(op, "x", x));
    ppn_kp_argmax p = {.out = out_i32, .x = x, .part = part, .n = n, .nblk = ARGMAX_WIDE_GRID};
    ppn_launch l = launch_init(PPN_K_ARGMAX, &p, ARGMAX_WIDE_GRID, ARGMAX_WIDE_BLOCK);
    acc_add(&l, x, f32_bytes((size_t)n), PPN_ACC_R);
    acc_add(&l, part, ppn_op_argmax_scratch_bytes(), PPN_ACC_RW);
    acc_add(&l, out_i32, sizeof(int32_t), PPN_ACC_W);
    return submit(g, s, &l);
}

/* The header, its token from the params or (p->tok set) from device memory. */
static ppn_status set_hdr_submit(ppn_gpu *g, ppn_gstream *s, const char *op, const ppn_kp_set_hdr *p)
{
    PPN_CHECK(need_ptr(op, "hdr", p->hdr));
    ppn_launch l = launch_init(PPN_K_SET_HDR, p, 1, 32);
    if (p->tok) acc_add(&l, p->tok, sizeof(int32_t), PPN_ACC_R);
    acc_add(&l, p->hdr, sizeof(ppn_step_hdr), PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_set_hdr(ppn_gpu *g, ppn_gstream *s, ppn_dptr hdr, int pos, int token, int seq, int step)
{
    ppn_kp_set_hdr p = {.hdr = hdr, .v = {.pos = pos, .token = token, .seq = seq, .step = step}};
    return set_hdr_submit(g, s, "ppn_op_set_hdr", &p);
}

ppn_status ppn_op_set_hdr_dev(ppn_gpu *g, ppn_gstream *s, ppn_dptr hdr, int pos, ppn_dptr tok, int seq, int step)
{
    static const char op[] = "ppn_op_set_hdr_dev";
    PPN_CHECK(need_ptr(op, "tok", tok));
    ppn_kp_set_hdr p = {.hdr = hdr, .tok = tok, .v = {.pos = pos, .token = -1, .seq = seq, .step = step}};
    return set_hdr_submit(g, s, op, &p);
}

/* One warp per row keeps every token's accumulator in registers; tokens beyond PPN_MATMAT_MAX_M go in further
 * launches of contiguous chunks (each chunk's rows are independent, so the split changes no result).
 * No library code calls it yet: it is kept (and tested, here and on the GPU) as the seed of the prefill work. */
ppn_status ppn_op_matmat(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int m, int rows,
                         int cols, ppn_dptr bias, ppn_dptr res)
{
    static const char op[] = "ppn_op_matmat";
    PPN_CHECK(need_positive(op, "m", m));
    PPN_CHECK(need_positive(op, "rows", rows));
    PPN_CHECK(need_positive(op, "cols", cols));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "w", w));
    PPN_CHECK(need_ptr(op, "x", x));
    size_t es = ppn_dtype_size(wdt);
    for (int t0 = 0; t0 < m; t0 += PPN_MATMAT_MAX_M) {
        int k = m - t0 < PPN_MATMAT_MAX_M ? m - t0 : PPN_MATMAT_MAX_M;
        size_t oo = f32_bytes((size_t)t0 * (size_t)rows), xo = f32_bytes((size_t)t0 * (size_t)cols);
        ppn_kp_matmat p = {.out = out + oo, .w = w, .x = x + xo, .bias = bias, .res = res ? res + oo : 0,
                           .rows = rows, .cols = cols, .m = k, .wdt = wdt};
        ppn_launch l = launch_init(PPN_K_MATMAT, &p, blocks_for(rows, MATMAT_BLOCK / 32), MATMAT_BLOCK);
        acc_add(&l, w, (size_t)rows * (size_t)cols * es, PPN_ACC_R);
        acc_add(&l, p.x, f32_bytes((size_t)k * (size_t)cols), PPN_ACC_R);
        if (bias) acc_add(&l, bias, (size_t)rows * es, PPN_ACC_R);
        if (res) acc_add(&l, p.res, f32_bytes((size_t)k * (size_t)rows), PPN_ACC_R);
        acc_add(&l, p.out, f32_bytes((size_t)k * (size_t)rows), PPN_ACC_W);
        PPN_CHECK(submit(g, s, &l));
    }
    return PPN_OK;
}
