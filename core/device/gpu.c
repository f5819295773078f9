/* gpu.c - what both backends share: the kernel table handed over at open, and the launch checks against it. */
#include <string.h>
#include "core/base/err.h"
#include "core/device/gpu.h"

ppn_status ppn_gpu_set_kernels(ppn_gpu *g, const ppn_gpu_kernels *kern)
{
    g->kern = (ppn_gpu_kernels){0};
    if (!kern) return PPN_OK;
    if (kern->n < 0 || kern->n > PPN_GPU_MAX_KERNELS || (kern->n && !kern->k))
        return ppn_err(PPN_EINVAL, "%s: a kernel table of %d entries (at most %d)", g->ops->name, kern->n,
                       PPN_GPU_MAX_KERNELS);
    if (kern->n_images < 0 || kern->n_images > PPN_GPU_MAX_IMAGES)
        return ppn_err(PPN_EINVAL, "%s: %d kernel images (at most %d)", g->ops->name, kern->n_images,
                       PPN_GPU_MAX_IMAGES);
    if (kern->n_images && !kern->images)
        return ppn_err(PPN_EINVAL, "%s: %d kernel images at NULL", g->ops->name, kern->n_images);
    for (int i = 0; i < kern->n_images; i++)
        if (!kern->images[i].data || !kern->images[i].size)
            return ppn_err(PPN_EINVAL, "%s: kernel image %d (%s) is empty", g->ops->name, i,
                           kern->images[i].name ? kern->images[i].name : "unnamed");
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

ppn_status ppn_tmap_check(const char *backend, const ppn_tmap_desc *d)
{
    if (!d) return ppn_err(PPN_EINVAL, "%s: tmap_encode: desc is NULL", backend);
    if (!d->base || (d->base & 15u))
        return ppn_err(PPN_EINVAL, "%s: tmap_encode: base 0x%llx is not a 16-byte-aligned device address", backend,
                       (unsigned long long)d->base);
    if (d->elem_bytes != 2 && d->elem_bytes != 4)
        return ppn_err(PPN_EINVAL, "%s: tmap_encode: elem_bytes %d (2 or 4)", backend, d->elem_bytes);
    for (int i = 0; i < 2; i++) {
        if (d->dim[i] < 1 || d->dim[i] > (1ull << 32))
            return ppn_err(PPN_EINVAL, "%s: tmap_encode: dim[%d] %llu (1 .. 2^32)", backend, i,
                           (unsigned long long)d->dim[i]);
        if (d->box[i] < 1 || d->box[i] > 256)
            return ppn_err(PPN_EINVAL, "%s: tmap_encode: box[%d] %u (1 .. 256)", backend, i, d->box[i]);
    }
    if ((uint64_t)d->box[0] * (uint64_t)d->elem_bytes > 128)
        return ppn_err(PPN_EINVAL, "%s: tmap_encode: a box row of %u x %d bytes is wider than the 128-byte swizzle",
                       backend, d->box[0], d->elem_bytes);
    if (d->row_bytes % 16 || d->row_bytes < d->dim[0] * (uint64_t)d->elem_bytes || d->row_bytes >= (1ull << 40))
        return ppn_err(PPN_EINVAL, "%s: tmap_encode: row_bytes %llu (a multiple of 16, at least dim[0] x elem_bytes = "
                                   "%llu, below 2^40)", backend, (unsigned long long)d->row_bytes,
                       (unsigned long long)(d->dim[0] * (uint64_t)d->elem_bytes));
    return PPN_OK;
}

/* The sim's map: this magic word, then the desc's fields in order; the rest of the 128 bytes zero. */
#define TMAP_SIM_MAGIC 0x3170616d74707070ull /* "ppptmap1" */

void ppn_tmap_sim_encode(const ppn_tmap_desc *d, void *map)
{
    uint64_t w[PPN_TMAP_BYTES / 8] = {TMAP_SIM_MAGIC, d->base, (uint64_t)d->elem_bytes, d->dim[0], d->dim[1],
                                      d->row_bytes, d->box[0], d->box[1]};
    memcpy(map, w, sizeof w);
}

int ppn_tmap_sim_decode(const void *map, ppn_tmap_desc *d)
{
    uint64_t w[PPN_TMAP_BYTES / 8];
    memcpy(w, map, sizeof w);
    if (w[0] != TMAP_SIM_MAGIC) return 0;
    *d = (ppn_tmap_desc){.base = w[1], .elem_bytes = (int)w[2], .dim = {w[3], w[4]}, .row_bytes = w[5],
                         .box = {(unsigned)w[6], (unsigned)w[7]}};
    return 1;
}
