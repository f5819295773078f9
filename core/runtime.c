/* runtime.c - the runtime's lifetime: the backend (with the kernel table), the pinned host arenas (one bound to
 * no node, one per NUMA node in use), the device pools and the topology, each created on first use; the kernel
 * profile. */
#include <stdlib.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ktable.h"

ppn_status ppn_rt_create(const char *backend, ppn_rt **out)
{
    *out = NULL;
    ppn_rt *rt = ppn_hcalloc(1, sizeof *rt);
    if (!rt) return ppn_err(PPN_ENOMEM, "runtime: host out of memory");
    ppn_status st;
    PPN_CHECK_GOTO(ppn_gpu_open(backend, ppn_kernel_set(), &rt->g), st, fail);
    ppn_trace("backend %s open", rt->g->ops->name);
    pthread_mutex_init(&rt->place_mu, NULL);
    rt->n_dev = rt->g->ops->device_count(rt->g);
    if (rt->n_dev > PPN_MAX_DEVICES) rt->n_dev = PPN_MAX_DEVICES;
    PPN_CHECK_GOTO(ppn_pinned_arena_create(rt->g, NULL, &rt->pinned), st, fail);
    ppn_trace("pinned arena ready");
    *out = rt;
    return PPN_OK;
fail:
    ppn_rt_destroy(rt);
    return st;
}

ppn_status ppn_rt_destroy(ppn_rt *rt)
{
    if (!rt) return PPN_OK;
    if (rt->n_models > 0)
        return ppn_err(PPN_ESTATE, "ppn_rt_destroy: %d model(s) still loaded on this runtime: free them first",
                       rt->n_models);
    ppn_status first = PPN_OK; /* a failed free: the rest is freed all the same (ppn_pool_destroy) */
    for (int d = 0; d < PPN_MAX_DEVICES; d++) {
        ppn_status st = ppn_pool_destroy(rt->pool[d]);
        if (first == PPN_OK) first = st;
    }
    for (int n = 0; n < PPN_MAX_NUMA; n++) ppn_pinned_arena_destroy(rt->pinned_node[n]);
    ppn_pinned_arena_destroy(rt->pinned_interleave);
    ppn_pinned_arena_destroy(rt->pinned);
    ppn_topo_destroy(rt->topo);
    if (rt->g) pthread_mutex_destroy(&rt->place_mu);
    ppn_gpu_close(rt->g);
    ppn_hfree(rt);
    return first;
}

const char *ppn_rt_backend(const ppn_rt *rt) { return rt->g->ops->name; }

int ppn_rt_device_count(const ppn_rt *rt) { return rt->n_dev; }

int ppn_rt_peer_possible(const ppn_rt *rt, int dev, int peer)
{
    int can = 0;
    if (dev < 0 || peer < 0 || dev >= rt->n_dev || peer >= rt->n_dev) return 0;
    if (dev == peer) return 1;
    return rt->g->ops->peer_can_access(rt->g, dev, peer, &can) == PPN_OK && can;
}

ppn_status ppn_rt_pool(ppn_rt *rt, int dev, ppn_pool **out)
{
    if (dev < 0 || dev >= rt->n_dev)
        return ppn_err(PPN_EINVAL, "device %d does not exist (%s backend has %d)", dev, rt->g->ops->name,
                       rt->n_dev);
    if (!rt->pool[dev]) PPN_CHECK(ppn_pool_create(rt->g, dev, 0, &rt->pool[dev]));
    *out = rt->pool[dev];
    return PPN_OK;
}

static ppn_status topo_locked(ppn_rt *rt, ppn_topo **out)
{
    if (!rt->topo) PPN_CHECK(ppn_topo_load(&rt->topo, strcmp(rt->g->ops->name, "sim") != 0));
    *out = rt->topo;
    return PPN_OK;
}

ppn_status ppn_rt_topo(ppn_rt *rt, ppn_topo **out)
{
    pthread_mutex_lock(&rt->place_mu);
    ppn_status st = topo_locked(rt, out);
    pthread_mutex_unlock(&rt->place_mu);
    return st;
}

static ppn_status bind_to_node(void *ctx, void *p, size_t n, int node)
{
    if (node == PPN_PINNED_INTERLEAVE) return ppn_topo_interleave_area((ppn_topo *)ctx, p, n);
    return ppn_topo_bind_area((ppn_topo *)ctx, p, n, node);
}

ppn_status ppn_rt_pinned_on(ppn_rt *rt, int node, ppn_pinned_arena **out)
{
    *out = rt->pinned;
    int ilv = node == PPN_PINNED_INTERLEAVE;
    if (!ilv && (node < 0 || node >= PPN_MAX_NUMA)) return PPN_OK;
    pthread_mutex_lock(&rt->place_mu);
    ppn_pinned_arena **slot = ilv ? &rt->pinned_interleave : &rt->pinned_node[node];
    ppn_topo *t;
    ppn_status st = topo_locked(rt, &t);
    if (st == PPN_OK && !*slot) {
        ppn_pinned_bind b = {.bind = bind_to_node, .ctx = t, .node = node};
        st = ppn_pinned_arena_create(rt->g, &b, slot);
        if (st == PPN_OK) ppn_trace("pinned arena of NUMA node %d ready (-2: interleaved)", node);
    }
    if (st == PPN_OK) *out = *slot;
    pthread_mutex_unlock(&rt->place_mu);
    return st;
}

ppn_status ppn_rt_dev_node(ppn_rt *rt, int dev, int *node)
{
    ppn_topo *t;
    ppn_dev_place pl;
    PPN_CHECK(ppn_rt_topo(rt, &t));
    PPN_CHECK(ppn_topo_place_device(t, rt->g, dev, &pl));
    *node = pl.numa_node;
    return PPN_OK;
}

ppn_status ppn_rt_pinned_for(ppn_rt *rt, int dev, ppn_pinned_arena **out)
{
    int node;
    PPN_CHECK(ppn_rt_dev_node(rt, dev, &node));
    return ppn_rt_pinned_on(rt, node, out);
}

ppn_status ppn_rt_pinned_alloc(ppn_rt *rt, int dev, size_t n, void **out)
{
    ppn_pinned_arena *a;
    *out = NULL;
    PPN_CHECK(ppn_rt_pinned_for(rt, dev, &a));
    return ppn_pinned_alloc(a, n, out);
}

_Static_assert(PPN_K_COUNT <= PPN_KERNEL_PROFILE_MAX, "PPN_KERNEL_PROFILE_MAX must cover every kernel");

/* Returns the number of entries written (0 when PPN_KPROF is off or the backend has no profile). */
int ppn_rt_kernel_profile(ppn_rt *rt, ppn_kernel_time *out, int max)
{
    struct ppn_kprof_entry e[PPN_KERNEL_PROFILE_MAX];
    if (!rt || !out || max <= 0 || !rt->g->ops->kprof_read) return 0;
    int n = rt->g->ops->kprof_read(rt->g, e, max < PPN_KERNEL_PROFILE_MAX ? max : PPN_KERNEL_PROFILE_MAX);
    for (int i = 0; i < n; i++) out[i] = (ppn_kernel_time){e[i].name, e[i].calls, e[i].ms, e[i].bytes};
    return n;
}

void ppn_rt_kernel_profile_reset(ppn_rt *rt)
{
    if (rt && rt->g->ops->kprof_reset) rt->g->ops->kprof_reset(rt->g);
}
