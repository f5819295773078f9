/* gpu.c - what both backends share: the kernel table handed over at open, and the launch checks against it. */
#include "core/base/err.h"
#include "core/device/gpu.h"

ppn_status ppn_gpu_set_kernels(ppn_gpu *g, const ppn_gpu_kernels *kern)
{
    g->kern = (ppn_gpu_kernels){0};
    if (!kern) return PPN_OK;
    if (kern->n < 0 || kern->n > PPN_GPU_MAX_KERNELS || (kern->n && !kern->k))
        return ppn_err(PPN_EINVAL, "%s: a kernel table of %d entries (at most %d)", g->ops->name, kern->n,
                       PPN_GPU_MAX_KERNELS);
    g->kern = *kern;
    return PPN_OK;
}

ppn_status ppn_gpu_check_launch(const ppn_gpu *g, const ppn_launch *l)
{
    if (l->kernel < 0 || l->kernel >= g->kern.n)
        return ppn_err(PPN_EINVAL, "%s: launch: kernel id %d is not in the kernel table (%d kernels)", g->ops->name,
                       l->kernel, g->kern.n);
    const ppn_gpu_kernel *k = &g->kern.k[l->kernel];
    if (!l->params || l->params_size != k->params_size)
        return ppn_err(PPN_EINVAL, "%s: launch of %s: params %p of %zu B (the kernel takes %zu B)", g->ops->name,
                       k->name, l->params, l->params_size, k->params_size);
    if (l->nacc < 0 || l->nacc > PPN_LAUNCH_MAX_ACC)
        return ppn_err(PPN_EINVAL, "%s: launch of %s: %d accesses (at most %d)", g->ops->name, k->name, l->nacc,
                       PPN_LAUNCH_MAX_ACC);
    if (l->nxacc < 0 || (l->nxacc > 0 && !l->xacc))
        return ppn_err(PPN_EINVAL, "%s: launch of %s: %d further accesses at %p", g->ops->name, k->name, l->nxacc,
                       (const void *)l->xacc);
    return PPN_OK;
}
