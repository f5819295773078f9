/* load.c - a model's lifetime: options checked, the checkpoint opened, the door resolved into a stage map,
 * weights placed and uploaded, the KV context chosen, the map installed; a new door published later; free. */
#include <stdlib.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

/* Where weights live under map: the owning stage's device, or the primary with MEMRA_PP_SHARD=0. */
static void place_weights(ppn_model *m, const ppn_stage_map *map)
{
    int shard = map->door.shard;
    for (int l = 0; l < m->cfg.n_layers; l++) m->layer_dev[l] = shard ? map->dev[ppn_layer_stage(map, l)] : m->primary;
    m->embed_dev = shard ? map->dev[0] : m->primary;
    m->head_dev = shard ? map->dev[map->n_stages - 1] : m->primary;
}

/* A sequence's context (want, or the model's maximum capped to what fits) and the paged pools' positions
 * (kv_want, or 4 contexts capped to what fits, at least one context), from the room next to the weights on every
 * device where map puts KV, leaving 64 MB for scratch. Pools of the default size leave room too for each stage's
 * rows scratch at the default chunk (PPN_PREFILL_CHUNK rows, every row's logits with them: ppn_rows_scratch_bytes;
 * the 8B's 1.5 GB a stage) where a context fits beside it: before, the pools took all but the 64 MB wherever 4
 * contexts did not fit (the 8B on an 80 GB card), and a prefill of a few hundred rows, or a batch step after it, ran
 * out of device memory. A pool size the caller names is held to the 64 MB alone. */
static size_t positions_beside(size_t free_b, size_t keep, size_t per_position)
{
    return free_b > keep ? (free_b - keep) / per_position : 0;
}

static ppn_status choose_ctx(ppn_model *m, const ppn_stage_map *map, int want, int kv_want)
{
    const ppn_model_config *c = &m->cfg;
    if (want > c->max_pos)
        return ppn_err(PPN_EINVAL, "ctx %d exceeds the model's max_position_embeddings %d", want, c->max_pos);
    size_t per_layer = 2 * ppn_op_kv_cache_bytes(c->n_kv_heads, c->head_dim, 1, m->kvdt); /* k and v, a position */
    size_t reserve = (size_t)64 << 20, room = SIZE_MAX, room_rows = SIZE_MAX;
    size_t rows_b = ppn_rows_scratch_bytes(c, PPN_PREFILL_CHUNK, map->n_stages);
    int ctx = want > 0 ? want : c->max_pos;
    for (int s = 0; s < map->n_stages; s++) {
        int dev = map->dev[s];
        size_t layers = (size_t)(map->fence[s + 1] - map->fence[s]), stages = 1, free_b = 0, total_b = 0;
        for (int t = 0; t < s; t++) /* stages sharing a device share its memory */
            if (map->dev[t] == dev) layers = 0;
        for (int t = s + 1; t < map->n_stages && layers; t++)
            if (map->dev[t] == dev) layers += (size_t)(map->fence[t + 1] - map->fence[t]), stages++;
        if (!layers) continue;
        PPN_CHECK(m->rt->g->ops->mem_get_info(m->rt->g, dev, &free_b, &total_b));
        size_t fit = positions_beside(free_b, reserve, layers * per_layer);
        size_t fit_rows = positions_beside(free_b, reserve + stages * rows_b, layers * per_layer);
        if (fit < room) room = fit;
        if (fit_rows < room_rows) room_rows = fit_rows;
        if (want == 0 && (size_t)ctx > fit) ctx = (int)fit;
        if (ctx < 1 || (size_t)ctx > fit)
            return ppn_err(PPN_ENOMEM, "device %d: a KV cache of %d positions for %zu layers needs %zu B; %zu B free",
                           dev, ctx < 1 ? 1 : ctx, layers, (size_t)(ctx < 1 ? 1 : ctx) * layers * per_layer, free_b);
    }
    /* the default pools within room_rows where the context fits there; else (a device too small for the scratch
     * beside one context) within room, as before */
    size_t kv = kv_want == 0 && room_rows >= (size_t)ctx ? ppn_kv_pool_positions(room_rows, &ctx, want == 0, 0)
                                                          : ppn_kv_pool_positions(room, &ctx, want == 0, kv_want);
    m->ctx = ctx;
    if (kv > room || kv > (size_t)INT32_MAX / 2)
        return ppn_err(PPN_ENOMEM, "kv_tokens %zu: the KV pools of that many positions do not fit next to the weights "
                                   "(room for %zu)", kv, room);
    return ppn_kv_init(m, (int)kv);
}

/* n positions rounded up to whole KV blocks. */
static size_t kv_whole_blocks(size_t n) { return (n + PPN_KV_BLOCK - 1) / PPN_KV_BLOCK * PPN_KV_BLOCK; }

size_t ppn_kv_pool_positions(size_t room, int *ctx, int ctx_free, int kv_want)
{
    if (kv_want > 0) return kv_whole_blocks((size_t)kv_want); /* as asked */
    size_t kv = 4 * (size_t)*ctx;
    if (kv < PPN_KV_DEFAULT_MIN) kv = PPN_KV_DEFAULT_MIN; /* short contexts: room for many */
    kv = kv_whole_blocks(kv);
    if (kv <= room) return kv;
    kv = room / PPN_KV_BLOCK * PPN_KV_BLOCK; /* the whole blocks the room holds (rounding up would pass it) */
    if (kv >= (size_t)*ctx) return kv;
    if (!ctx_free || kv == 0) /* one sequence of the asked context does not fit: past the room, so refused */
        return kv_whole_blocks((size_t)*ctx);
    *ctx = (int)kv; /* a chosen context shrinks to what the pool holds */
    return kv;
}

ppn_load_opts ppn_load_opts_default(void)
{
    return (ppn_load_opts){.dtype = PPN_DTYPE_DEFAULT, .ctx = 0, .kv_tokens = 0, .device = 0, .door = NULL};
}

static ppn_status check_opts(ppn_rt *rt, const ppn_load_opts *o)
{
    if (o->dtype < PPN_DTYPE_DEFAULT || o->dtype > PPN_DTYPE_F16)
        return ppn_err(PPN_EINVAL, "dtype %d is not f32, bf16 or f16", o->dtype);
    if (o->ctx < 0) return ppn_err(PPN_EINVAL, "ctx %d is negative", o->ctx);
    if (o->kv_tokens < 0) return ppn_err(PPN_EINVAL, "kv_tokens %d is negative", o->kv_tokens);
    if (o->device < 0 || o->device >= rt->n_dev)
        return ppn_err(PPN_EINVAL, "device %d does not exist (%d devices)", o->device, rt->n_dev);
    return PPN_OK;
}

/* From the primary's SM count, once: a per-stage choice would give split and unsplit runs different bits. */
static ppn_status attn_split_choose(ppn_model *m)
{
    ppn_device_info di;
    PPN_CHECK(m->rt->g->ops->device_info(m->rt->g, m->primary, &di));
    m->attn_split = ppn_op_attn_split(m->cfg.n_kv_heads, di.sm_count);
    m->sm_count = di.sm_count;
    return PPN_OK;
}

static ppn_status model_alloc(ppn_rt *rt, const ppn_ckpt *c, const ppn_load_opts *o, ppn_model **out)
{
    ppn_model *m = ppn_hcalloc(1, sizeof *m);
    if (!m) return ppn_err(PPN_ENOMEM, "model: host out of memory");
    *out = m;
    m->rt = rt;
    m->cfg = c->cfg;
    m->primary = o->device;
    m->wdt = o->dtype != PPN_DTYPE_DEFAULT ? o->dtype
                                           : (strcmp(rt->g->ops->name, "cuda") == 0 ? PPN_DTYPE_BF16 : PPN_DTYPE_F32);
    m->kvdt = m->wdt;
    m->layers = ppn_hcalloc((size_t)c->cfg.n_layers, sizeof *m->layers);
    m->layer_dev = ppn_hcalloc((size_t)c->cfg.n_layers, sizeof *m->layer_dev);
    m->stages = ppn_hcalloc(PPN_MAX_STAGES, sizeof *m->stages);
    if (!m->layers || !m->layer_dev || !m->stages) return ppn_err(PPN_ENOMEM, "model: host out of memory");
    for (int s = 0; s < PPN_MAX_STAGES; s++) {
        m->stages[s].m = m;
        m->stages[s].index = s;
        m->stages[s].dev = -1;
        m->stages[s].rs.dev = -1;
        m->stages[s].busy.dev = -1;
    }
    m->rb_dev = -1;
    m->max_rows = 1;
    return attn_split_choose(m);
}

/* Everything a model holds, in reverse order of creation: threads and streams, weights, device streams. Also
 * the cleanup of a load that failed part way. A failed device free does not stop it: the first is returned. */
static ppn_status model_release(ppn_model *m)
{
    if (!m) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    ppn_err_first first = {0};
    ppn_err_first_add(&first, ppn_map_teardown(m));
    ppn_err_first_add(&first, ppn_kv_fini(m));
    for (int b = 0; b < m->n_weight_blocks; b++)
        ppn_err_first_add(&first, ppn_model_block_free(m, m->weight_blocks[b].dev, &m->weight_blocks[b].ptr));
    for (int d = 0; d < PPN_MAX_DEVICES; d++) {
        if (!m->dev_stream[d]) continue;
        g->ops->stream_sync(g, m->dev_stream[d]);
        if (m->rt->pool[d]) ppn_pool_stream_retired(m->rt->pool[d], m->dev_stream[d]);
        g->ops->stream_destroy(g, m->dev_stream[d]);
    }
    ppn_hfree(m->weight_blocks);
    ppn_hfree(m->layers);
    ppn_hfree(m->layer_dev);
    ppn_hfree(m->stages);
    ppn_hfree(m);
    return ppn_err_first_done(&first);
}

ppn_status ppn_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *opts, ppn_model **out)
{
    if (!rt || !path || !out)
        return ppn_err(PPN_EINVAL, "ppn_model_load: %s is NULL", !rt ? "runtime" : !path ? "path" : "out");
    *out = NULL;
    if (atomic_load(&rt->engine_on))
        return ppn_err(PPN_ESTATE, "ppn_model_load: an engine runs on a model of this runtime, whose models are "
                       "driven from one thread at a time: load on a runtime of its own, or destroy the engine first");
    ppn_load_opts o = opts ? *opts : ppn_load_opts_default();
    PPN_CHECK(check_opts(rt, &o));
    ppn_door door = ppn_door_default();
    if (o.door) door = *o.door;
    else PPN_CHECK(ppn_door_from_env(&door));
    ppn_ckpt *c = NULL;
    PPN_CHECK(ppn_ckpt_open(path, &c));
    ppn_trace("checkpoint %s open: %s, %d layers", path, c->cfg.arch_name, c->cfg.n_layers);
    ppn_model *m = NULL;
    ppn_stage_map *map = NULL;
    ppn_status s;
    PPN_CHECK_GOTO(model_alloc(rt, c, &o, &m), s, fail);
    PPN_CHECK_GOTO(ppn_map_build(m, &door, &map), s, fail); /* every door value checked before any upload */
    place_weights(m, map);
    PPN_CHECK_GOTO(ppn_upload_weights(m, c, &o), s, fail);
    ppn_trace("weights uploaded: %zu B", m->weight_bytes);
    PPN_CHECK_GOTO(choose_ctx(m, map, o.ctx, o.kv_tokens), s, fail);
    PPN_CHECK_GOTO(ppn_map_install(m, map, ppn_stage_thread_fn), s, fail);
    map = NULL; /* the model's now */
    ppn_trace("ctx %d, KV pools of %d positions, %d stage(s), attention in %d split(s)", m->ctx, m->kv.cap,
              m->map->n_stages, m->attn_split);
    ppn_ckpt_close(c);
    rt->n_models++;
    *out = m;
    return PPN_OK;
fail:
    if (m && m->map == map) map = NULL; /* published before a later part of the install failed */
    ppn_hfree(map);
    ppn_ckpt_close(c);
    ppn_err_first first = {0}; /* s with its message, whatever the release meets */
    ppn_err_first_add(&first, s);
    ppn_err_first_add(&first, model_release(m));
    return ppn_err_first_done(&first);
}

static int seq_count(const ppn_model *m)
{
    int n = 0;
    for (const ppn_seq *q = m->seqs; q; q = q->next) n++;
    return n;
}

ppn_status ppn_model_free(ppn_model *m)
{
    if (!m) return PPN_OK;
    if (atomic_load(&m->engine_on)) /* its scheduler thread uses the model: m->seqs is that thread's */
        return ppn_err(PPN_ESTATE, "ppn_model_free: an engine runs on this model: ppn_engine_destroy it first");
    PPN_CHECK(ppn_model_caller(m, "ppn_model_free")); /* or on another model of its runtime */
    if (m->seqs)
        return ppn_err(PPN_ESTATE, "ppn_model_free: %d sequence(s) still live on this model: destroy them first",
                       seq_count(m));
    m->rt->n_models--;
    return model_release(m);
}

ppn_status ppn_model_publish_door(ppn_model *m, const ppn_door *d)
{
    if (!m || !d) return ppn_err(PPN_EINVAL, "ppn_model_publish_door: %s is NULL", !m ? "model" : "door");
    PPN_CHECK(ppn_model_caller(m, "ppn_model_publish_door"));
    ppn_stage_map *map;
    PPN_CHECK(ppn_map_build(m, d, &map));
    ppn_status st = ppn_map_install(m, map, ppn_stage_thread_fn);
    if (st != PPN_OK && m->map != map) ppn_hfree(map);
    return st;
}
