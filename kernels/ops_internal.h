/* ops_internal.h - what the op files (kernels/ops*.c) share: a launch's initial state, its declared accesses,
 * the argument checks that name the bad value, and the submit. Static inline: each op file has its own copy,
 * and none of it is exported. */
#ifndef PPN_OPS_INTERNAL_H
#define PPN_OPS_INTERNAL_H

#include "core/base/dtype.h"
#include "core/base/err.h"
#include "kernels/ops.h"

static inline ppn_launch launch_init(int kernel, const void *params, unsigned grid, unsigned block)
{
    PPN_ASSERT(kernel >= 0 && kernel < PPN_K_COUNT);
    ppn_launch l = {.kernel = kernel, .grid = {grid, 1, 1}, .block = {block, 1, 1}, .smem = 0,
                    .params = params, .params_size = ppn_kernels[kernel].params_size, .nacc = 0};
    return l;
}

static inline void acc_add(ppn_launch *l, ppn_dptr p, size_t bytes, int mode)
{
    PPN_ASSERT(l->nacc < PPN_LAUNCH_MAX_ACC);
    l->acc[l->nacc++] = (ppn_access){.ptr = p, .bytes = bytes, .mode = mode};
}

static inline unsigned blocks_for(int n, unsigned per_block) { return ((unsigned)n + per_block - 1u) / per_block; }

static inline ppn_status need_positive(const char *op, const char *what, int v)
{
    if (v <= 0) return ppn_err(PPN_EINVAL, "%s: %s must be positive (got %d)", op, what, v);
    return PPN_OK;
}

static inline ppn_status need_ptr(const char *op, const char *what, ppn_dptr p)
{
    if (!p) return ppn_err(PPN_EINVAL, "%s: %s is a null device pointer", op, what);
    return PPN_OK;
}

/* The fused rotary's shapes (ppn_op_attn_rope_fits), refused by name with the unfused ops to use instead (alt). */
static inline ppn_status need_rope_fits(const char *op, int head_dim, int interleaved, const char *alt)
{
    if (!ppn_op_attn_rope_fits(head_dim, interleaved))
        return ppn_err(PPN_EUNSUPPORTED, "%s: head_dim %d (%s): the fused rotary takes head_dim 2, 4, .., 32, 64 or "
                       "128 with rotated halves, or an even head_dim up to 128 with interleaved pairs (use %s)",
                       op, head_dim, interleaved ? "interleaved pairs" : "rotated halves", alt);
    return PPN_OK;
}

static inline ppn_status need_wdt(const char *op, int wdt)
{
    if (ppn_dtype_size(wdt) == 0)
        return ppn_err(PPN_EINVAL, "%s: unknown weight dtype %d (expected PPN_DTYPE_F32/BF16/F16)", op, wdt);
    return PPN_OK;
}

static inline ppn_status need_kvdt(const char *op, int kvdt)
{
    if (ppn_dtype_size(kvdt) == 0)
        return ppn_err(PPN_EINVAL, "%s: unknown KV cache dtype %d (expected PPN_DTYPE_F32/BF16/F16)", op, kvdt);
    return PPN_OK;
}

/* An output dtype for a GEMM's x (the rows norm, SwiGLU, batched attention): PPN_DTYPE_F32, or PPN_DTYPE_BF16 in
 * gemm_tc_kw16's layout (PPN_X16_POS), which takes rows of whole 64-element blocks (n per row). */
static inline ppn_status need_odt(const char *op, int odt, int n)
{
    if (odt != PPN_DTYPE_F32 && odt != PPN_DTYPE_BF16 && odt != PPN_ODT_BF16_ROWS)
        return ppn_err(PPN_EINVAL, "%s: output dtype %d: PPN_DTYPE_F32, PPN_DTYPE_BF16 or PPN_ODT_BF16_ROWS", op, odt);
    if (odt != PPN_DTYPE_F32 && n % 64)
        return ppn_err(PPN_EINVAL, "%s: bf16 output rows of %d: a multiple of 64 (the bf16 GEMMs' x)", op, n);
    return PPN_OK;
}

/* Bytes an element of an output of odt (need_odt's): 4 for f32, 2 for either bf16 form. */
static inline size_t odt_size(int odt) { return odt == PPN_DTYPE_F32 ? 4u : 2u; }

static inline ppn_status submit(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l)
{
    PPN_ASSERT(g && g->ops && s);
    return g->ops->launch(g, s, l);
}

static inline size_t f32_bytes(size_t n) { return n * sizeof(float); }

/* Paged KV (kernels/ops_kv.c): a view's checks and the declared accesses of the blocks an op may touch. A
 * ppn_kv_decl grows a heap list of ranges (adjacent ranges of one mode coalesced) that ppn_kv_decl_attach hangs
 * on a launch as its further accesses (ppn_launch.xacc); free it after the submit. */
typedef struct ppn_kv_decl {
    ppn_access *a;
    int n, cap;
} ppn_kv_decl;
/* The view's rules (ppn_kv_view in ops.h): pools, cap, block_log2, kvdt, and with a table its host copy (1 <= n_tbl
 * <= cap >> L, every entry in the pool). PPN_EINVAL naming op otherwise. */
ppn_status ppn_kv_view_check(const char *op, const ppn_kv_view *kv);
/* Positions below this may be touched through kv: n_tbl << L with a table, else cap. */
int ppn_kv_view_limit(const ppn_kv_view *kv);
ppn_status ppn_kv_decl_add(ppn_kv_decl *d, ppn_dptr p, size_t bytes, int mode);
/* Table blocks b0 .. b1 - 1 of tbl_h (host copy) for every KV head, in the K pool then the V pool, with mode. */
ppn_status ppn_kv_decl_blocks(ppn_kv_decl *d, const ppn_kv_pool *pool, int n_kv, int head_dim, const int32_t *tbl_h,
                              int b0, int b1, int mode);
/* Positions [p0, p1) of kv for every KV head, as ppn_kv_decl_blocks (a table view: the blocks holding them, and
 * the table's entries 0 .. n_tbl - 1 as read) or, for an identity view, from head 0's position p0 to the last
 * head's p1 - 1 in one range per pool (the heads between covered whole, as before paging). */
ppn_status ppn_kv_decl_view(ppn_kv_decl *d, const ppn_kv_view *kv, int n_kv, int head_dim, int p0, int p1, int mode);
void ppn_kv_decl_attach(const ppn_kv_decl *d, ppn_launch *l);
/* Submit l with kv's positions [p0, p1) declared as ppn_kv_decl_view declares them (an identity view in the
 * launch's fixed list when it has room). */
ppn_status ppn_kv_submit(ppn_gpu *g, ppn_gstream *s, ppn_launch *l, const ppn_kv_view *kv, int n_kv, int head_dim,
                         int p0, int p1, int mode);
/* Submit l with d's ranges attached as its further accesses, then free d (whatever the status). */
ppn_status ppn_kv_decl_submit(ppn_gpu *g, ppn_gstream *s, ppn_launch *l, ppn_kv_decl *d);
void ppn_kv_decl_free(ppn_kv_decl *d);

#endif
