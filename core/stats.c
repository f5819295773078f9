/* stats.c - what a model reports: its shape, its liveness counters and memory, its published stage map. */
#include <stdio.h>
#include <string.h>
#include "core/rt.h"

void ppn_model_get_info(const ppn_model *m, ppn_model_info *o)
{
    const ppn_model_config *c = &m->cfg;
    memset(o, 0, sizeof *o);
    snprintf(o->arch, sizeof o->arch, "%s", c->arch_name);
    o->n_layers = c->n_layers;
    o->dim = c->dim;
    o->n_heads = c->n_heads;
    o->n_kv_heads = c->n_kv_heads;
    o->head_dim = c->head_dim;
    o->ffn_dim = c->ffn_dim;
    o->vocab = c->vocab;
    o->max_pos = c->max_pos;
    o->ctx = m->ctx;
    o->dtype = m->wdt;
    o->kv_dtype = m->kvdt;
    o->bos_id = c->bos_id;
    o->eos_id = c->eos_id;
    o->weight_bytes = m->weight_bytes;
}

void ppn_model_get_stats(const ppn_model *m, ppn_stats *o)
{
    memset(o, 0, sizeof *o);
    const ppn_stage_map *map = m->map;
    o->n_stages = map->n_stages;
    for (int s = 0; s < PPN_MAX_STAGES; s++)
        o->walker_runs[s] = atomic_load_explicit(&m->stages[s].walker_runs, memory_order_relaxed);
    for (int b = 0; b < m->n_bnd; b++) {
        ppn_boundary_counts(&m->bnd[b], &o->boundary_sends[b], &o->boundary_overlap_steps[b]);
    }
    o->overlap_observed = atomic_load_explicit(&m->overlap_observed, memory_order_relaxed);
    o->steps = m->next_step;
    o->driver_allocs = m->rt->g->n_mem_alloc;
    o->host_staged = m->rt->g->n_host_staged;
    o->graph_captures = atomic_load_explicit(&m->graph_captures, memory_order_relaxed);
    o->graph_launches = __atomic_load_n(&m->rt->g->n_graph_launches, __ATOMIC_RELAXED);
    o->prime_split_chunks = atomic_load_explicit(&m->prime_split_chunks, memory_order_relaxed);
    o->prime_pipe_overlaps = atomic_load_explicit(&m->prime_pipe_overlaps, memory_order_relaxed);
    o->prime_batches = atomic_load_explicit(&m->prime_batches, memory_order_relaxed);
    o->prime_batch_splits = atomic_load_explicit(&m->prime_batch_splits, memory_order_relaxed);
    for (int s = 0; s < PPN_MAX_STAGES; s++) {
        o->batch_walks[s] = atomic_load_explicit(&m->stages[s].batch_walks, memory_order_relaxed);
        o->stage_busy_ns[s] = atomic_load_explicit(&m->stages[s].busy.ns, memory_order_relaxed);
        o->stage_busy_walks[s] = atomic_load_explicit(&m->stages[s].busy.walks, memory_order_relaxed);
    }
    o->batch_steps = atomic_load_explicit(&m->batch_steps, memory_order_relaxed);
    o->mixed_steps = atomic_load_explicit(&m->mixed_steps, memory_order_relaxed);
    o->batch_split_steps = atomic_load_explicit(&m->batch_split_steps, memory_order_relaxed);
    o->batch_pipe_overlaps = atomic_load_explicit(&m->batch_pipe_overlaps, memory_order_relaxed);
    o->spec_verifies = atomic_load_explicit(&m->spec_verifies, memory_order_relaxed);
    o->spec_drafted = atomic_load_explicit(&m->spec_drafted, memory_order_relaxed);
    o->spec_accepted = atomic_load_explicit(&m->spec_accepted, memory_order_relaxed);
    o->spec_split_verifies = atomic_load_explicit(&m->spec_split_verifies, memory_order_relaxed);
    o->batch_greedy_steps = atomic_load_explicit(&m->batch_greedy_steps, memory_order_relaxed);
    for (int d = 0; d < PPN_MAX_DEVICES; d++) {
        if (!m->rt->pool[d]) continue;
        ppn_pool_stats ps;
        ppn_pool_get_stats(m->rt->pool[d], &ps);
        o->cross_waits += ps.cross_waits;
        o->pool_in_use += ps.in_use;
        o->pool_peak += ps.peak;
        o->pool_reserved += ps.reserved;
        o->pool_retired += ps.retired;
        o->pool_retired_bytes += ps.retired_bytes;
    }
}

void ppn_model_get_stage_map(const ppn_model *m, ppn_stage_info *o)
{
    const ppn_stage_map *map = m->map;
    memset(o, 0, sizeof *o);
    o->n_stages = map->n_stages;
    memcpy(o->fence, map->fence, sizeof o->fence);
    memcpy(o->dev, map->dev, sizeof o->dev);
    memcpy(o->xport, map->xport, sizeof o->xport);
    memcpy(o->pu, map->pu, sizeof o->pu);
    o->shared_cores = map->shared_cores;
    o->threads = map->n_stages > 1 && map->door.streams;
    o->same_device_streams = ppn_multi_stream_same_device(map);
    o->door = map->door;
}

const char *ppn_transport_name(int x) { return ppn_xport_name(x); }
