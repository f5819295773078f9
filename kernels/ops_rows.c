/* ops_rows.c - the many-rows ops (kernels/ops.h, "Many rows per launch"): a prefill chunk's c rows at positions
 * pos0 .. pos0 + c - 1 of one sequence per launch. Each validates its sizes (PPN_EINVAL naming the bad value),
 * fills its params struct (kparams.h), declares the bytes it reads and writes (for the sim checker) and picks
 * the geometry of its kernel (kernels/rows.cu) from the sizes alone, so the CUDA bits repeat run to run.
 *
 * Every op returns PPN_OK, PPN_EINVAL or whatever g->ops->launch returns (PPN_EDRIVER, PPN_ENOKERNELS on cuda;
 * a sticky checker status such as PPN_ERACE or PPN_EBOUNDS on sim).
 *
 * Geometry contract with rows.cu: the row index is blockIdx.x (the elementwise kernels take their column
 * blocks in blockIdx.y), so c is bounded only by int; blocks are whole warps.
 */
#include "kernels/ops.h"
#include "kernels/ops_internal.h"

#define ROWS_ELEM_BLOCK 256u  /* embed, swiglu: one element per thread, a row's columns over grid.y */
#define ROWS_NORM_BLOCK 1024u /* rmsnorm: one block per row (256 took 2x as long at 16..64 rows of 4096: PERF.md) */
#define ROWS_HEAD_WARPS 8u    /* head norms: one warp per (row, head), 8 a block */
#define ROWS_ROPE_BLOCK 256u  /* rope: one block per row, a thread per (head, rotated pair) */
#define ROWS_ATTN_BLOCK 128u  /* attention: 4 warps (rows.cu PPN_RA_WARPS) */
#define ROWS_ATTN_TILE 32u    /* the SIMT path's positions per tile (rows.cu PPN_RA_TILE) */
#define ROWS_ATTN_MAX_HEAD_DIM 256
#define ROWS_TC_BM 64u        /* the tensor-core path: query rows (position, head) per block (rows.cu PPN_TC_BM) */
#define ROWS_TC_BN 64u        /* and KV positions per tile (PPN_TC_BN), double-buffered */

/* The chunk's common rule: 1 <= c, and (where there is a cache) a valid view with 0 <= pos0, pos0 + c <= the
 * positions it holds (ppn_kv_view_limit). */
static ppn_status need_rows(const char *op, int c) { return need_positive(op, "c (rows)", c); }

static ppn_status need_span(const char *op, int pos0, int c, const ppn_kv_view *kv)
{
    PPN_CHECK(need_rows(op, c));
    PPN_CHECK(ppn_kv_view_check(op, kv));
    int lim = ppn_kv_view_limit(kv);
    if (pos0 < 0 || pos0 > lim - c)
        return ppn_err(PPN_EINVAL, "%s: rows at positions %d .. %d do not fit the %d positions the %s holds (pos0 %d, "
                       "c %d)", op, pos0, pos0 + c - 1, lim, kv->tbl ? "block table" : "cache", pos0, c);
    return PPN_OK;
}


static ppn_status need_even_head(const char *op, int head_dim)
{
    PPN_CHECK(need_positive(op, "head_dim", head_dim));
    if (head_dim % 2 || head_dim > ROWS_ATTN_MAX_HEAD_DIM)
        return ppn_err(PPN_EINVAL, "%s: head_dim must be even and at most %d (got %d)", op, ROWS_ATTN_MAX_HEAD_DIM,
                       head_dim);
    return PPN_OK;
}

/* [a, a + an) and [b, b + bn) share no byte. */
static int disjoint(ppn_dptr a, size_t an, ppn_dptr b, size_t bn) { return a + an <= b || b + bn <= a; }

static ppn_status need_apart(const char *op, const char *an, ppn_dptr a, size_t as, const char *bn, ppn_dptr b,
                             size_t bs)
{
    if (disjoint(a, as, b, bs)) return PPN_OK;
    return ppn_err(PPN_EINVAL, "%s: %s [0x%llx, +%zu) overlaps %s [0x%llx, +%zu)", op, an, (unsigned long long)a, as,
                   bn, (unsigned long long)b, bs);
}

ppn_status ppn_op_embed_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr table, int wdt, int vocab, int dim,
                             ppn_dptr tok, int c)
{
    static const char op[] = "ppn_op_embed_rows";
    PPN_CHECK(need_rows(op, c));
    PPN_CHECK(need_positive(op, "vocab", vocab));
    PPN_CHECK(need_positive(op, "dim", dim));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "table", table));
    PPN_CHECK(need_ptr(op, "tok", tok));
    ppn_kp_embed_rows p = {.out = out, .table = table, .tok = tok, .dim = dim, .vocab = vocab, .wdt = wdt, .c = c};
    ppn_launch l = launch_init(PPN_K_EMBED_ROWS, &p, (unsigned)c, ROWS_ELEM_BLOCK);
    l.grid[1] = blocks_for(dim, ROWS_ELEM_BLOCK);
    acc_add(&l, table, (size_t)vocab * (size_t)dim * ppn_dtype_size(wdt), PPN_ACC_R);
    acc_add(&l, tok, (size_t)c * sizeof(int32_t), PPN_ACC_R);
    acc_add(&l, out, f32_bytes((size_t)c * (size_t)dim), PPN_ACC_W);
    return submit(g, s, &l);
}

/* The rows ops' output dtypes: f32, or bf16 in gemm_tc_kw16's layout for the GEMM that reads it (ops.h), whole
 * 64-element blocks a row. */
ppn_status ppn_op_rmsnorm_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr in, ppn_dptr w, int wdt,
                                  int n, float eps, int c)
{
    static const char op[] = "ppn_op_rmsnorm_rows";
    PPN_CHECK(need_rows(op, c));
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_odt(op, odt, n));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "in", in));
    PPN_CHECK(need_ptr(op, "w", w));
    size_t bytes = f32_bytes((size_t)c * (size_t)n), ob = (size_t)c * (size_t)n * odt_size(odt);
    /* a row reads before it writes, so in place is fine in f32; bf16 rows sit elsewhere than the f32 ones */
    if (out != in || odt != PPN_DTYPE_F32) PPN_CHECK(need_apart(op, "out", out, ob, "in", in, bytes));
    ppn_kp_rmsnorm_rows p = {.out = out, .in = in, .w = w, .n = n, .wdt = wdt, .c = c, .eps = eps, .odt = odt};
    ppn_launch l = launch_init(PPN_K_RMSNORM_ROWS, &p, (unsigned)c, ROWS_NORM_BLOCK);
    acc_add(&l, in, bytes, PPN_ACC_R);
    acc_add(&l, w, (size_t)n * ppn_dtype_size(wdt), PPN_ACC_R);
    acc_add(&l, out, ob, PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_rmsnorm_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr in, ppn_dptr w, int wdt, int n,
                               float eps, int c)
{
    return ppn_op_rmsnorm_rows_to(g, s, out, PPN_DTYPE_F32, in, w, wdt, n, eps, c);
}

ppn_status ppn_op_head_rmsnorm_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr x, int stride, int h0, int n_heads,
                                    int head_dim, ppn_dptr w, int wdt, float eps, int c)
{
    static const char op[] = "ppn_op_head_rmsnorm_rows";
    PPN_CHECK(need_rows(op, c));
    PPN_CHECK(need_positive(op, "n_heads", n_heads));
    PPN_CHECK(need_positive(op, "head_dim", head_dim));
    PPN_CHECK(need_positive(op, "stride", stride));
    PPN_CHECK(need_wdt(op, wdt));
    PPN_CHECK(need_ptr(op, "x", x));
    PPN_CHECK(need_ptr(op, "w", w));
    if (h0 < 0 || (int64_t)(h0 + (int64_t)n_heads) * head_dim > stride)
        return ppn_err(PPN_EINVAL, "%s: heads %d .. %d of %d floats do not fit a row of stride %d", op, h0,
                       h0 + n_heads - 1, head_dim, stride);
    ppn_kp_head_rmsnorm_rows p = {.x = x, .w = w, .stride = stride, .h0 = h0, .n_heads = n_heads,
                                  .head_dim = head_dim, .wdt = wdt, .c = c, .eps = eps};
    size_t items = (size_t)c * (size_t)n_heads;
    if (items > (size_t)INT32_MAX) return ppn_err(PPN_EINVAL, "%s: c x n_heads = %zu rows exceed 2^31 - 1", op, items);
    ppn_launch l = launch_init(PPN_K_HEAD_RMSNORM_ROWS, &p, blocks_for((int)items, ROWS_HEAD_WARPS),
                               32u * ROWS_HEAD_WARPS);
    size_t first = f32_bytes((size_t)h0 * (size_t)head_dim);
    size_t span = f32_bytes((size_t)(c - 1) * (size_t)stride + (size_t)n_heads * (size_t)head_dim);
    acc_add(&l, x + first, span, PPN_ACC_RW);
    acc_add(&l, w, (size_t)head_dim * ppn_dtype_size(wdt), PPN_ACC_R);
    return submit(g, s, &l);
}

/* A multiple of half (the pairs a head has) where one fits in ROWS_ROPE_BLOCK whole warps, so each thread keeps
 * one pair and its angle for every head (rows.cu); else ROWS_ROPE_BLOCK (angles recomputed as pairs change). */
static unsigned rope_rows_block(int half)
{
    unsigned h = (unsigned)half, b = ROWS_ROPE_BLOCK;
    while (b >= 32u && b % h) b -= 32u;
    return b >= 32u ? b : ROWS_ROPE_BLOCK;
}

ppn_status ppn_op_rope_kv_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                               ppn_dptr inv_freq, int interleaved, const ppn_kv_view *kv, int pos0, int c)
{
    static const char op[] = "ppn_op_rope_kv_rows";
    PPN_CHECK(need_span(op, pos0, c, kv));
    PPN_CHECK(need_positive(op, "n_q", n_q));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    PPN_CHECK(need_even_head(op, head_dim));
    PPN_CHECK(need_ptr(op, "qkv", qkv));
    PPN_CHECK(need_ptr(op, "inv_freq", inv_freq));
    const ppn_kv_pool *pl = &kv->pool;
    ppn_kp_rope_kv_rows p = {.qkv = qkv, .inv_freq = inv_freq, .kc = pl->k, .vc = pl->v, .tbl = kv->tbl, .n_q = n_q,
                             .n_kv = n_kv, .head_dim = head_dim, .interleaved = interleaved ? 1 : 0, .cap = pl->cap,
                             .kvdt = pl->kvdt, .pos0 = pos0, .c = c, .block_log2 = pl->block_log2};
    size_t row = (size_t)(n_q + 2 * n_kv) * (size_t)head_dim;
    ppn_launch l = launch_init(PPN_K_ROPE_KV_ROWS, &p, (unsigned)c, rope_rows_block(head_dim / 2));
    acc_add(&l, qkv, f32_bytes((size_t)c * row), PPN_ACC_RW);
    acc_add(&l, inv_freq, f32_bytes((size_t)head_dim / 2), PPN_ACC_R);
    return ppn_kv_submit(g, s, &l, kv, n_kv, head_dim, pos0, pos0 + c, PPN_ACC_W);
}

/* The tensor-core kernels take bf16 / f16 caches with head_dim 64 or 128; the rest runs the SIMT path. */
static int attn_rows_tc(int kvdt, int head_dim)
{
    return kvdt != PPN_DTYPE_F32 && (head_dim == 64 || head_dim == 128);
}

/* The query heads a tensor-core block packs per KV head: the largest power of two dividing the group, at most
 * 16 (so a warp's 16 rows hold whole positions). Mirrors rows.cu ppn_tc_gb. */
static int attn_rows_gb(int group)
{
    int gb = 1;
    while (gb < 16 && group % (2 * gb) == 0) gb *= 2;
    return gb;
}

/* SIMT: block (row i, KV head g), its 4 warps taking the group's query heads in turn over tiles of 32 positions
 * staged in shared memory (k padded a float a row). Tensor cores: block (KV head g and sub-group of gb heads,
 * tile of 64 / gb positions counted from the chunk's end), 64 (position, head) rows over KV tiles of 64
 * positions, k and v double-buffered. */
static void attn_rows_geometry(ppn_launch *l, const ppn_kp_attn_rows *p)
{
    int group = p->n_heads / p->n_kv;
    if (attn_rows_tc(p->kvdt, p->head_dim)) {
        int gb = attn_rows_gb(group), qp = (int)ROWS_TC_BM / gb;
        l->grid[0] = (unsigned)(p->n_kv * (group / gb));
        l->grid[1] = blocks_for(p->c, (unsigned)qp);
        l->smem = 2u * 2u * ROWS_TC_BN * (unsigned)p->head_dim * 2u; /* k and v, two stages, 2-byte elements */
        return;
    }
    unsigned hd = (unsigned)p->head_dim;
    l->grid[0] = (unsigned)p->c;
    l->grid[1] = (unsigned)p->n_kv;
    l->smem = (ROWS_ATTN_TILE * (hd + 1u) + ROWS_ATTN_TILE * hd + (ROWS_ATTN_BLOCK / 32u) * hd) * 4u;
}

ppn_status ppn_op_attn_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, const ppn_kv_view *kv,
                            int n_heads, int n_kv, int head_dim, float scale, int pos0, int c)
{
    return ppn_op_attn_rows_to(g, s, out, PPN_DTYPE_F32, qkv, kv, n_heads, n_kv, head_dim, scale, pos0, c);
}

ppn_status ppn_op_attn_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv,
                               const ppn_kv_view *kv, int n_heads, int n_kv, int head_dim, float scale, int pos0,
                               int c)
{
    static const char op[] = "ppn_op_attn_rows";
    PPN_CHECK(need_span(op, pos0, c, kv));
    const ppn_kv_pool *pl = &kv->pool;
    ppn_dptr kc = pl->k, vc = pl->v;
    int kvdt = pl->kvdt;
    PPN_CHECK(need_positive(op, "n_heads", n_heads));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    if (n_heads % n_kv)
        return ppn_err(PPN_EINVAL, "%s: n_heads (%d) must be a multiple of n_kv (%d)", op, n_heads, n_kv);
    PPN_CHECK(need_even_head(op, head_dim));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "qkv", qkv));
    PPN_CHECK(need_odt(op, odt, n_heads * head_dim));
    size_t hd = (size_t)head_dim, row = (size_t)(n_heads + 2 * n_kv) * hd;
    size_t qb = f32_bytes((size_t)(c - 1) * row + (size_t)n_heads * hd);
    size_t ob = (size_t)c * (size_t)n_heads * hd * odt_size(odt);
    PPN_CHECK(need_apart(op, "out", out, ob, "qkv", qkv, qb));
    if (attn_rows_tc(kvdt, head_dim) && ((kc | vc) % 16u || (qkv | out) % 8u))
        return ppn_err(PPN_EINVAL, "%s: the tensor-core path needs kc, vc 16-byte aligned and qkv, out 8-byte aligned "
                       "(kc 0x%llx, vc 0x%llx, qkv 0x%llx, out 0x%llx)", op, (unsigned long long)kc,
                       (unsigned long long)vc, (unsigned long long)qkv, (unsigned long long)out);
    ppn_kp_attn_rows p = {.out = out, .qkv = qkv, .kc = kc, .vc = vc, .tbl = kv->tbl, .n_heads = n_heads,
                          .n_kv = n_kv, .head_dim = head_dim, .cap = pl->cap, .kvdt = kvdt, .pos0 = pos0, .c = c,
                          .block_log2 = pl->block_log2, .scale = scale, .odt = odt};
    int k = kvdt == PPN_DTYPE_BF16 ? PPN_K_ATTN_ROWS_BF16 : kvdt == PPN_DTYPE_F16 ? PPN_K_ATTN_ROWS_F16 : PPN_K_ATTN_ROWS;
    ppn_launch l = launch_init(k, &p, 1, ROWS_ATTN_BLOCK);
    attn_rows_geometry(&l, &p);
    acc_add(&l, qkv, qb, PPN_ACC_R);
    acc_add(&l, out, ob, PPN_ACC_W);
    return ppn_kv_submit(g, s, &l, kv, n_kv, head_dim, 0, pos0 + c, PPN_ACC_R);
}

ppn_status ppn_op_swiglu_rows_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr gu, int n, int c)
{
    static const char op[] = "ppn_op_swiglu_rows";
    PPN_CHECK(need_rows(op, c));
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_odt(op, odt, n));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "gu", gu));
    size_t es = odt_size(odt), ob = (size_t)c * (size_t)n * es, gb = 2u * f32_bytes((size_t)c * (size_t)n);
    PPN_CHECK(need_apart(op, "out", out, ob, "gu", gu, gb));
    /* four columns a thread where every row starts 16-byte aligned (out: four of its elements): on the H200 the
     * prompt's SwiGLU moved 2.3 TB/s one column a thread (docs/PERF.md, the prime's kernel account) */
    int vec = n % 4 == 0 && !(out & (4u * es - 1u)) && !(gu & 15u);
    ppn_kp_swiglu_rows p = {.out = out, .gu = gu, .n = n, .c = c, .vec = vec, .odt = odt};
    ppn_launch l = launch_init(PPN_K_SWIGLU_ROWS, &p, (unsigned)c, ROWS_ELEM_BLOCK);
    l.grid[1] = blocks_for(vec ? n / 4 : n, ROWS_ELEM_BLOCK);
    acc_add(&l, gu, gb, PPN_ACC_R);
    acc_add(&l, out, ob, PPN_ACC_W);
    return submit(g, s, &l);
}

ppn_status ppn_op_swiglu_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr gu, int n, int c)
{
    return ppn_op_swiglu_rows_to(g, s, out, PPN_DTYPE_F32, gu, n, c);
}

ppn_status ppn_op_argmax_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out_i32, ppn_dptr x, int n, int rows)
{
    static const char op[] = "ppn_op_argmax_rows";
    PPN_CHECK(need_rows(op, rows));
    PPN_CHECK(need_positive(op, "n", n));
    PPN_CHECK(need_ptr(op, "out", out_i32));
    PPN_CHECK(need_ptr(op, "x", x));
    size_t xb = f32_bytes((size_t)rows * (size_t)n), ob = sizeof(int32_t) * (size_t)rows;
    PPN_CHECK(need_apart(op, "out", out_i32, ob, "x", x, xb));
    /* 16-byte loads, four in flight a thread, where the rows start aligned: on the H200 one block per 128256-entry
     * row with 4-byte loads took 55-57 us at 16 and 64 rows (the 8B's kernel account, 2026-12-04). */
    int vec = n % 4 == 0 && !(x & 15u);
    ppn_kp_argmax_rows p = {.out = out_i32, .x = x, .n = n, .rows = rows, .vec = vec, .pad = 0};
    ppn_launch l = launch_init(PPN_K_ARGMAX_ROWS, &p, (unsigned)rows, PPN_ARGMAX_ROWS_THREADS);
    acc_add(&l, x, xb, PPN_ACC_R);
    acc_add(&l, out_i32, ob, PPN_ACC_W);
    return submit(g, s, &l);
}
