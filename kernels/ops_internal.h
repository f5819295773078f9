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

static inline ppn_status submit(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l)
{
    PPN_ASSERT(g && g->ops && s);
    return g->ops->launch(g, s, l);
}

static inline size_t f32_bytes(size_t n) { return n * sizeof(float); }

#endif
