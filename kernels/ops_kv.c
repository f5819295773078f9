/* ops_kv.c - paged KV for the ops (kernels/ops.h, ppn_kv_view): a view's checks, the declared accesses of the
 * pool blocks an op may touch, and the batched decode ops (B sequences of a layer, one row each).
 *
 * Declarations. The sim checker trusts what an op declares, so a paged op declares exactly the blocks its
 * sequence holds (from the table's host copy), per KV head, in each pool: never a byte of another sequence's
 * blocks. A table of b blocks gives up to 2 n_kv b ranges, more than a launch's fixed list holds, so they go in a
 * heap list hung on the launch (ppn_launch.xacc); ranges that meet (consecutive pool blocks in table order) are
 * coalesced. An identity view (tbl 0) declares what the ops declared before paging.
 *
 * Every op returns PPN_OK, PPN_EINVAL (a size, a view or a row the rules refuse, named in the message),
 * PPN_ENOMEM (the declarations' host memory) or whatever g->ops->launch returns.
 */
#include <stdlib.h>
#include "kernels/ops.h"
#include "kernels/ops_internal.h"

#define KV_MAX_BLOCK_LOG2 12
#define BATCH_MAX_ROWS 65535 /* grid.z of the attention, grid.y of nothing: rows are blockIdx.x or .z */
#define BATCH_ROPE_BLOCK 1024u /* a block per row (256: a quarter slower at 16 rows of the 8B, PERF.md) */
#define BATCH_ATTN_BLOCK 256u  /* ppn_op_attn's CTA (ops.c ATTN_BLOCK) */
#define BATCH_ATTN_TC_BLOCK 128u /* ppn_k_attn_batch_tc's CTA: 4 warps (rows_batch_attn.cu PPN_ATC_WARPS) */
#define BATCH_ATTN_TC_MAXG 8     /* query heads a KV head: the mma's 16 rows hold at most 8 (rows 8..15 unused) */
#define BATCH_ATTN_MAX_SPLIT 64
#define BATCH_ATTN_MAX_HEAD_DIM 256

/* ---- views ------------------------------------------------------------------------------------------- */

static ppn_status pool_check(const char *op, const ppn_kv_pool *pool)
{
    PPN_CHECK(need_kvdt(op, pool->kvdt));
    PPN_CHECK(need_ptr(op, "the K pool", pool->k));
    PPN_CHECK(need_ptr(op, "the V pool", pool->v));
    PPN_CHECK(need_positive(op, "cap (pool positions)", pool->cap));
    int L = pool->block_log2;
    if (L < 0 || L > KV_MAX_BLOCK_LOG2 || pool->cap % (1 << L))
        return ppn_err(PPN_EINVAL, "%s: block_log2 %d must be in 0..%d and divide cap %d into whole blocks", op, L,
                       KV_MAX_BLOCK_LOG2, pool->cap);
    return PPN_OK;
}

/* A table's host copy: 1 <= n <= the pool's blocks, every entry one of them. */
static ppn_status table_check(const char *op, const ppn_kv_pool *pool, const int32_t *tbl_h, int n, int row)
{
    int nb = pool->cap >> pool->block_log2;
    if (!tbl_h || n < 1 || n > nb)
        return ppn_err(PPN_EINVAL, "%s: row %d: a block table needs its host copy and 1..%d held blocks (got %s, %d)",
                       op, row, nb, tbl_h ? "a copy" : "none", n);
    for (int b = 0; b < n; b++)
        if (tbl_h[b] < 0 || tbl_h[b] >= nb)
            return ppn_err(PPN_EINVAL, "%s: row %d: table entry %d is block %d, outside the pool's %d blocks", op,
                           row, b, (int)tbl_h[b], nb);
    return PPN_OK;
}

ppn_status ppn_kv_view_check(const char *op, const ppn_kv_view *kv)
{
    if (!kv) return ppn_err(PPN_EINVAL, "%s: the KV view is NULL", op);
    PPN_CHECK(pool_check(op, &kv->pool));
    if (kv->tbl) PPN_CHECK(table_check(op, &kv->pool, kv->tbl_h, kv->n_tbl, 0));
    return PPN_OK;
}

int ppn_kv_view_limit(const ppn_kv_view *kv) { return kv->tbl ? kv->n_tbl << kv->pool.block_log2 : kv->pool.cap; }

/* ---- declarations ------------------------------------------------------------------------------------ */

/* Append a range; merge: extend the last one instead where it ends at p with this mode. */
static ppn_status decl_put(ppn_kv_decl *d, ppn_dptr p, size_t bytes, int mode, int merge)
{
    if (merge && d->n) {
        ppn_access *last = &d->a[d->n - 1];
        if (last->mode == mode && last->ptr + last->bytes == p) {
            last->bytes += bytes;
            return PPN_OK;
        }
    }
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 64;
        ppn_access *a = realloc(d->a, (size_t)cap * sizeof *a);
        if (!a) return ppn_err(PPN_ENOMEM, "paged KV: out of host memory for %d declared ranges", cap);
        d->a = a;
        d->cap = cap;
    }
    d->a[d->n++] = (ppn_access){.ptr = p, .bytes = bytes, .mode = mode};
    return PPN_OK;
}

ppn_status ppn_kv_decl_add(ppn_kv_decl *d, ppn_dptr p, size_t bytes, int mode) { return decl_put(d, p, bytes, mode, 0); }

ppn_status ppn_kv_decl_blocks(ppn_kv_decl *d, const ppn_kv_pool *pool, int n_kv, int head_dim, const int32_t *tbl_h,
                              int b0, int b1, int mode)
{
    size_t es = ppn_dtype_size(pool->kvdt), row = (size_t)head_dim * es, blk = row << pool->block_log2;
    ppn_dptr pools[2] = {pool->k, pool->v};
    for (int c = 0; c < 2; c++)
        for (int g = 0; g < n_kv; g++) {
            ppn_dptr head = pools[c] + (size_t)g * (size_t)pool->cap * row;
            for (int b = b0; b < b1; b++) /* consecutive pool blocks of one head coalesce */
                PPN_CHECK(decl_put(d, head + (size_t)tbl_h[b] * blk, blk, mode, b > b0));
        }
    return PPN_OK;
}

/* An identity view's positions [p0, p1): from head 0's p0 to the last head's p1 - 1, one range per pool. */
static void identity_span(const ppn_kv_view *kv, int n_kv, int head_dim, int p0, int p1, size_t *first, size_t *bytes)
{
    size_t row = (size_t)head_dim * ppn_dtype_size(kv->pool.kvdt);
    *first = (size_t)p0 * row;
    *bytes = ((size_t)(n_kv - 1) * (size_t)kv->pool.cap + (size_t)p1) * row - *first;
}

ppn_status ppn_kv_decl_view(ppn_kv_decl *d, const ppn_kv_view *kv, int n_kv, int head_dim, int p0, int p1, int mode)
{
    const ppn_kv_pool *pool = &kv->pool;
    if (kv->tbl) {
        int L = pool->block_log2;
        PPN_CHECK(ppn_kv_decl_blocks(d, pool, n_kv, head_dim, kv->tbl_h, p0 >> L, ((p1 - 1) >> L) + 1, mode));
        return ppn_kv_decl_add(d, kv->tbl, (size_t)kv->n_tbl * sizeof(int32_t), PPN_ACC_R);
    }
    size_t first, bytes;
    identity_span(kv, n_kv, head_dim, p0, p1, &first, &bytes);
    PPN_CHECK(ppn_kv_decl_add(d, pool->k + first, bytes, mode));
    return ppn_kv_decl_add(d, pool->v + first, bytes, mode);
}

ppn_status ppn_kv_submit(ppn_gpu *g, ppn_gstream *s, ppn_launch *l, const ppn_kv_view *kv, int n_kv, int head_dim,
                         int p0, int p1, int mode)
{
    if (!kv->tbl && l->nacc + 2 <= PPN_LAUNCH_MAX_ACC) { /* the fixed list holds it: no heap list on the step path */
        size_t first, bytes;
        identity_span(kv, n_kv, head_dim, p0, p1, &first, &bytes);
        acc_add(l, kv->pool.k + first, bytes, mode);
        acc_add(l, kv->pool.v + first, bytes, mode);
        return submit(g, s, l);
    }
    ppn_kv_decl d = {0};
    ppn_status st = ppn_kv_decl_view(&d, kv, n_kv, head_dim, p0, p1, mode);
    if (st != PPN_OK) {
        ppn_kv_decl_free(&d);
        return st;
    }
    return ppn_kv_decl_submit(g, s, l, &d);
}

void ppn_kv_decl_attach(const ppn_kv_decl *d, ppn_launch *l)
{
    l->xacc = d->a;
    l->nxacc = d->n;
}

void ppn_kv_decl_free(ppn_kv_decl *d)
{
    free(d->a);
    *d = (ppn_kv_decl){0};
}

/* ---- batched decode ---------------------------------------------------------------------------------- */

/* Every row's position and table against the pool; with table rows, their tables must be given. */
static ppn_status batch_rows_check(const char *op, const ppn_kv_pool *pool, const ppn_kseg *segs_h,
                                   const int32_t *const *tbl_h, const int *n_tbl, int B)
{
    if (B < 1 || B > BATCH_MAX_ROWS) return ppn_err(PPN_EINVAL, "%s: B must be in 1..%d (got %d)", op, BATCH_MAX_ROWS, B);
    if (!segs_h) return ppn_err(PPN_EINVAL, "%s: segs_h (the rows' host copy) is NULL", op);
    for (int i = 0; i < B; i++) {
        int limit = pool->cap;
        if (segs_h[i].tbl) {
            if (!tbl_h || !n_tbl) return ppn_err(PPN_EINVAL, "%s: row %d has a table but tbl_h or n_tbl is NULL", op, i);
            PPN_CHECK(table_check(op, pool, tbl_h[i], n_tbl[i], i));
            limit = n_tbl[i] << pool->block_log2;
        }
        if (segs_h[i].pos < 0 || segs_h[i].pos >= limit)
            return ppn_err(PPN_EINVAL, "%s: row %d: position %d outside the %d positions its %s holds", op, i,
                           (int)segs_h[i].pos, limit, segs_h[i].tbl ? "table" : "pool");
    }
    return PPN_OK;
}

/* The pools' ranges the rows may touch: every held block of every table row; an identity row reaches the whole
 * pools, which then cover every row. The tables and segs are read. */
static ppn_status batch_decl(ppn_kv_decl *d, const ppn_kv_pool *pool, int n_kv, int head_dim, ppn_dptr segs_d,
                             const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B, int mode)
{
    int whole = 0;
    for (int i = 0; i < B; i++) whole |= segs_h[i].tbl == 0;
    if (whole) {
        ppn_kv_view all = ppn_kv_view_identity(pool->k, pool->v, pool->cap, pool->kvdt);
        PPN_CHECK(ppn_kv_decl_view(d, &all, n_kv, head_dim, 0, pool->cap, mode));
    }
    for (int i = 0; i < B; i++) {
        if (!segs_h[i].tbl) continue;
        if (!whole) PPN_CHECK(ppn_kv_decl_blocks(d, pool, n_kv, head_dim, tbl_h[i], 0, n_tbl[i], mode));
        PPN_CHECK(ppn_kv_decl_add(d, segs_h[i].tbl, (size_t)n_tbl[i] * sizeof(int32_t), PPN_ACC_R));
    }
    return ppn_kv_decl_add(d, segs_d, (size_t)B * sizeof(ppn_kseg), PPN_ACC_R);
}

ppn_status ppn_kv_decl_submit(ppn_gpu *g, ppn_gstream *s, ppn_launch *l, ppn_kv_decl *d)
{
    ppn_kv_decl_attach(d, l);
    ppn_status st = submit(g, s, l);
    ppn_kv_decl_free(d);
    return st;
}

static ppn_status need_head(const char *op, int head_dim, int even)
{
    PPN_CHECK(need_positive(op, "head_dim", head_dim));
    if ((even && head_dim % 2) || head_dim > BATCH_ATTN_MAX_HEAD_DIM)
        return ppn_err(PPN_EINVAL, "%s: head_dim must be %sat most %d (got %d)", op, even ? "even and " : "",
                       BATCH_ATTN_MAX_HEAD_DIM, head_dim);
    return PPN_OK;
}

/* A multiple of half (the pairs a head has) in whole warps where one fits: ops_rows.c's rule. */
static unsigned rope_batch_block(int half)
{
    unsigned h = (unsigned)half, b = BATCH_ROPE_BLOCK;
    while (b >= 32u && b % h) b -= 32u;
    return b >= 32u ? b : BATCH_ROPE_BLOCK;
}

ppn_status ppn_op_rope_kv_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                                ppn_dptr inv_freq, int interleaved, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B)
{
    static const char op[] = "ppn_op_rope_kv_batch";
    if (!pool) return ppn_err(PPN_EINVAL, "%s: the pool is NULL", op);
    PPN_CHECK(pool_check(op, pool));
    PPN_CHECK(batch_rows_check(op, pool, segs_h, tbl_h, n_tbl, B));
    PPN_CHECK(need_positive(op, "n_q", n_q));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    PPN_CHECK(need_head(op, head_dim, 1));
    PPN_CHECK(need_ptr(op, "qkv", qkv));
    PPN_CHECK(need_ptr(op, "inv_freq", inv_freq));
    PPN_CHECK(need_ptr(op, "segs_d", segs_d));
    ppn_kp_rope_kv_batch p = {.qkv = qkv, .inv_freq = inv_freq, .kc = pool->k, .vc = pool->v, .segs = segs_d,
                              .n_q = n_q, .n_kv = n_kv, .head_dim = head_dim, .interleaved = interleaved ? 1 : 0,
                              .cap = pool->cap, .kvdt = pool->kvdt, .block_log2 = pool->block_log2, .B = B};
    ppn_launch l = launch_init(PPN_K_ROPE_KV_BATCH, &p, (unsigned)B, rope_batch_block(head_dim / 2));
    size_t row = (size_t)(n_q + 2 * n_kv) * (size_t)head_dim;
    acc_add(&l, qkv, f32_bytes((size_t)B * row), PPN_ACC_RW);
    acc_add(&l, inv_freq, f32_bytes((size_t)head_dim / 2), PPN_ACC_R);
    ppn_kv_decl d = {0};
    ppn_status st = batch_decl(&d, pool, n_kv, head_dim, segs_d, segs_h, tbl_h, n_tbl, B, PPN_ACC_W);
    if (st != PPN_OK) {
        ppn_kv_decl_free(&d);
        return st;
    }
    return ppn_kv_decl_submit(g, s, &l, &d);
}

size_t ppn_op_attn_batch_scratch_bytes(int B, int n_heads, int n_split, int head_dim)
{
    if (B <= 0) return 0;
    return (size_t)B * ppn_op_attn_scratch_bytes(n_heads, n_split, head_dim);
}

static ppn_status attn_batch_check(const char *op, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads, int n_kv,
                                   int head_dim, ppn_dptr part, int n_split, int B)
{
    if (n_split < 1 || n_split > BATCH_ATTN_MAX_SPLIT)
        return ppn_err(PPN_EINVAL, "%s: n_split must be in 1..%d (got %d)", op, BATCH_ATTN_MAX_SPLIT, n_split);
    PPN_CHECK(need_positive(op, "n_heads", n_heads));
    PPN_CHECK(need_positive(op, "n_kv", n_kv));
    if (n_heads % n_kv)
        return ppn_err(PPN_EINVAL, "%s: n_heads (%d) must be a multiple of n_kv (%d)", op, n_heads, n_kv);
    PPN_CHECK(need_head(op, head_dim, 0));
    PPN_CHECK(need_odt(op, odt, n_heads * head_dim));
    PPN_CHECK(need_ptr(op, "out", out));
    PPN_CHECK(need_ptr(op, "qkv", qkv));
    PPN_CHECK(need_ptr(op, "part", part));
    size_t hd = (size_t)head_dim, row = (size_t)(n_heads + 2 * n_kv) * hd;
    size_t qb = f32_bytes((size_t)(B - 1) * row + (size_t)n_heads * hd);
    size_t ob = (size_t)B * (size_t)n_heads * hd * odt_size(odt);
    if (!(out + ob <= qkv || qkv + qb <= out))
        return ppn_err(PPN_EINVAL, "%s: out [0x%llx, +%zu) overlaps qkv [0x%llx, +%zu)", op, (unsigned long long)out,
                       ob, (unsigned long long)qkv, qb);
    return PPN_OK;
}

/* ppn_op_attn_batch, and with inv_freq ppn_op_attn_rope_batch: the rotary of each row's q (in registers) and
 * of its k, stored with v at the row's position, inside the launch (so qkv is only read, all of it). */
static ppn_status attn_batch_submit(const char *op, ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv,
                                    int n_heads, int n_kv, int head_dim, float scale, const ppn_kv_pool *pool,
                                    ppn_dptr segs_d, const ppn_kseg *segs_h, const int32_t *const *tbl_h,
                                    const int *n_tbl, int B, ppn_dptr part, int n_split, ppn_dptr inv_freq,
                                    int interleaved, int tc)
{
    if (!pool) return ppn_err(PPN_EINVAL, "%s: the pool is NULL", op);
    PPN_CHECK(pool_check(op, pool));
    PPN_CHECK(batch_rows_check(op, pool, segs_h, tbl_h, n_tbl, B));
    PPN_CHECK(attn_batch_check(op, out, odt, qkv, n_heads, n_kv, head_dim, part, n_split, B));
    PPN_CHECK(need_ptr(op, "segs_d", segs_d));
    ppn_kp_attn_batch p = {.a = {.out = out, .q = qkv, .kc = pool->k, .vc = pool->v, .part = part,
                                 .inv_freq = inv_freq, .n_heads = n_heads, .n_kv = n_kv, .head_dim = head_dim,
                                 .cap = pool->cap, .n_split = n_split, .kvdt = pool->kvdt,
                                 .block_log2 = pool->block_log2, .interleaved = interleaved ? 1 : 0, .scale = scale,
                                 .odt = odt},
                           .segs = segs_d, .B = B};
    int kvdt = pool->kvdt;
    int k = tc                         ? PPN_K_ATTN_BATCH_TC
            : kvdt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BATCH_BF16
            : kvdt == PPN_DTYPE_F16  ? PPN_K_ATTN_BATCH_F16
                                     : PPN_K_ATTN_BATCH;
    /* a CTA per (KV head, split, row) */
    ppn_launch l = launch_init(k, &p, (unsigned)n_kv, tc ? BATCH_ATTN_TC_BLOCK : BATCH_ATTN_BLOCK);
    l.grid[1] = (unsigned)n_split;
    l.grid[2] = (unsigned)B;
    size_t hd = (size_t)head_dim, row = (size_t)(n_heads + 2 * n_kv) * hd;
    /* the fused rotary reads each row's k and v too */
    acc_add(&l, qkv, f32_bytes((size_t)(B - 1) * row + (inv_freq ? row : (size_t)n_heads * hd)), PPN_ACC_R);
    if (inv_freq) acc_add(&l, inv_freq, f32_bytes(hd / 2), PPN_ACC_R);
    acc_add(&l, part, ppn_op_attn_batch_scratch_bytes(B, n_heads, n_split, head_dim), PPN_ACC_RW);
    acc_add(&l, out, (size_t)B * (size_t)n_heads * hd * odt_size(odt), PPN_ACC_W);
    ppn_kv_decl d = {0};
    ppn_status st = batch_decl(&d, pool, n_kv, head_dim, segs_d, segs_h, tbl_h, n_tbl, B,
                               inv_freq ? PPN_ACC_RW : PPN_ACC_R);
    if (st != PPN_OK) {
        ppn_kv_decl_free(&d);
        return st;
    }
    return ppn_kv_decl_submit(g, s, &l, &d);
}

ppn_status ppn_op_attn_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, int n_heads, int n_kv,
                             int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                             const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                             ppn_dptr part, int n_split)
{
    return attn_batch_submit("ppn_op_attn_batch", g, s, out, PPN_DTYPE_F32, qkv, n_heads, n_kv, head_dim, scale,
                             pool, segs_d, segs_h, tbl_h, n_tbl, B, part, n_split, 0, 0, 0);
}

ppn_status ppn_op_attn_batch_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads,
                                int n_kv, int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                ppn_dptr part, int n_split)
{
    return attn_batch_submit("ppn_op_attn_batch_to", g, s, out, odt, qkv, n_heads, n_kv, head_dim, scale, pool,
                             segs_d, segs_h, tbl_h, n_tbl, B, part, n_split, 0, 0, 0);
}

static ppn_status attn_rope_batch(const char *op, ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv,
                                  int n_heads, int n_kv, int head_dim, float scale, const ppn_kv_pool *pool,
                                  ppn_dptr segs_d, const ppn_kseg *segs_h, const int32_t *const *tbl_h,
                                  const int *n_tbl, int B, ppn_dptr part, int n_split, ppn_dptr inv_freq,
                                  int interleaved)
{
    PPN_CHECK(need_ptr(op, "inv_freq", inv_freq));
    PPN_CHECK(need_rope_fits(op, head_dim, interleaved, "rope_kv_batch + attn_batch"));
    return attn_batch_submit(op, g, s, out, odt, qkv, n_heads, n_kv, head_dim, scale, pool, segs_d, segs_h, tbl_h,
                             n_tbl, B, part, n_split, inv_freq, interleaved, 0);
}

ppn_status ppn_op_attn_rope_batch(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, int n_heads, int n_kv,
                                  int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                  const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                  ppn_dptr part, int n_split, ppn_dptr inv_freq, int interleaved)
{
    return attn_rope_batch("ppn_op_attn_rope_batch", g, s, out, PPN_DTYPE_F32, qkv, n_heads, n_kv, head_dim, scale,
                           pool, segs_d, segs_h, tbl_h, n_tbl, B, part, n_split, inv_freq, interleaved);
}

ppn_status ppn_op_attn_rope_batch_to(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads,
                                     int n_kv, int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                     const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                     ppn_dptr part, int n_split, ppn_dptr inv_freq, int interleaved)
{
    return attn_rope_batch("ppn_op_attn_rope_batch_to", g, s, out, odt, qkv, n_heads, n_kv, head_dim, scale, pool,
                           segs_d, segs_h, tbl_h, n_tbl, B, part, n_split, inv_freq, interleaved);
}

int ppn_op_attn_batch_tc_fits(int n_heads, int n_kv, int head_dim, int kvdt)
{
    return kvdt == PPN_DTYPE_BF16 && (head_dim == 64 || head_dim == 128) && n_kv > 0 && n_heads > 0 &&
           n_heads % n_kv == 0 && n_heads / n_kv <= BATCH_ATTN_TC_MAXG;
}

ppn_status ppn_op_attn_batch_tc(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, int odt, ppn_dptr qkv, int n_heads, int n_kv,
                                int head_dim, float scale, const ppn_kv_pool *pool, ppn_dptr segs_d,
                                const ppn_kseg *segs_h, const int32_t *const *tbl_h, const int *n_tbl, int B,
                                ppn_dptr part, int n_split)
{
    const char *op = "ppn_op_attn_batch_tc";
    if (!pool) return ppn_err(PPN_EINVAL, "%s: the pool is NULL", op);
    if (!ppn_op_attn_batch_tc_fits(n_heads, n_kv, head_dim, pool->kvdt))
        return ppn_err(PPN_EUNSUPPORTED,
                       "%s: %d query heads over %d KV heads of head_dim %d, %s cache: the tensor-core attention takes a "
                       "bf16 cache, head_dim 64 or 128 and at most %d query heads a KV head (ppn_op_attn_batch_to "
                       "takes the rest)",
                       op, n_heads, n_kv, head_dim, ppn_dtype_name((ppn_dtype)pool->kvdt), BATCH_ATTN_TC_MAXG);
    if (qkv % 16)
        return ppn_err(PPN_EINVAL, "%s: qkv 0x%llx must be 16-byte aligned (q is read 4 floats at a time)", op,
                       (unsigned long long)qkv);
    return attn_batch_submit(op, g, s, out, odt, qkv, n_heads, n_kv, head_dim, scale, pool, segs_d, segs_h, tbl_h,
                             n_tbl, B, part, n_split, 0, 0, 1);
}
