/* runtime.c - the runtime, and model load: the door resolved into a stage map, weights uploaded (with dtype
 * conversion) to the devices the map places them on, the load barrier, then the map installed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/dtype.h"
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"

#define STAGING_BYTES (16u << 20)

/* Runtime ------------------------------------------------------------------------------------------------- */

ppn_status ppn_rt_create(const char *backend, ppn_rt **out)
{
    *out = NULL;
    ppn_rt *rt = ppn_hcalloc(1, sizeof *rt);
    if (!rt) return ppn_err(PPN_ENOMEM, "runtime: host out of memory");
    ppn_status st;
    PPN_CHECK_GOTO(ppn_gpu_open(backend, ppn_kernel_set(), &rt->g), st, fail);
    ppn_trace("backend %s open", rt->g->ops->name);
    rt->n_dev = rt->g->ops->device_count(rt->g);
    if (rt->n_dev > PPN_MAX_DEVICES) rt->n_dev = PPN_MAX_DEVICES;
    PPN_CHECK_GOTO(ppn_pinned_arena_create(rt->g, &rt->pinned), st, fail);
    ppn_trace("pinned arena ready");
    *out = rt;
    return PPN_OK;
fail:
    ppn_rt_destroy(rt);
    return st;
}

void ppn_rt_destroy(ppn_rt *rt)
{
    if (!rt) return;
    ppn_topo_destroy(rt->topo);
    for (int d = 0; d < PPN_MAX_DEVICES; d++) ppn_pool_destroy(rt->pool[d]);
    ppn_pinned_arena_destroy(rt->pinned);
    ppn_gpu_close(rt->g);
    ppn_hfree(rt);
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

ppn_status ppn_rt_topo(ppn_rt *rt, ppn_topo **out)
{
    if (!rt->topo) PPN_CHECK(ppn_topo_load(&rt->topo, strcmp(rt->g->ops->name, "sim") != 0));
    *out = rt->topo;
    return PPN_OK;
}

ppn_status ppn_model_dev_stream(ppn_model *m, int dev, ppn_gstream **out)
{
    if (!m->dev_stream[dev]) PPN_CHECK(m->rt->g->ops->stream_create(m->rt->g, dev, &m->dev_stream[dev]));
    *out = m->dev_stream[dev];
    return PPN_OK;
}

/* Weight upload ------------------------------------------------------------------------------------------- */

typedef struct uploader {
    ppn_model *m;
    void *buf[2];          /* pinned staging, double-buffered */
    ppn_gevent *ev[2];     /* recorded after the copy out of buf[i], on device ev_dev[i] */
    int ev_dev[2];
    int cur;
    size_t done, total;
    void (*progress)(void *, size_t, size_t);
    void *progress_arg;
} uploader;

static float load_f32(const void *src, int dt, size_t i)
{
    switch (dt) {
    case PPN_DTYPE_BF16: return ppn_bf16_to_f32(((const uint16_t *)src)[i]);
    case PPN_DTYPE_F16: return ppn_f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

static void convert(void *dst, int ddt, const void *src, int sdt, size_t n)
{
    if (ddt == sdt) {
        memcpy(dst, src, n * ppn_dtype_size(ddt));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f = load_f32(src, sdt, i);
        if (ddt == PPN_DTYPE_F32) ((float *)dst)[i] = f;
        else if (ddt == PPN_DTYPE_BF16) ((uint16_t *)dst)[i] = ppn_f32_to_bf16(f);
        else ((uint16_t *)dst)[i] = ppn_f32_to_f16(f);
    }
}

static ppn_status model_track_block(ppn_model *m, ppn_dptr p, int dev)
{
    if (m->n_weight_blocks == m->cap_weight_blocks) {
        int cap = m->cap_weight_blocks ? m->cap_weight_blocks * 2 : 64;
        struct ppn_weight_block *nb = ppn_halloc((size_t)cap * sizeof *nb);
        if (!nb) return ppn_err(PPN_ENOMEM, "model: host out of memory");
        if (m->weight_blocks) memcpy(nb, m->weight_blocks, (size_t)m->n_weight_blocks * sizeof *nb);
        ppn_hfree(m->weight_blocks);
        m->weight_blocks = nb;
        m->cap_weight_blocks = cap;
    }
    m->weight_blocks[m->n_weight_blocks++] = (struct ppn_weight_block){p, dev};
    return PPN_OK;
}

/* Staging buffer i is free once its last copy is done; its event moves to the device of the next copy
 * (an event is recorded only on a stream of its own device). */
static ppn_status staging_ready(uploader *u, int i, int dev)
{
    ppn_gpu *g = u->m->rt->g;
    if (u->ev[i]) PPN_CHECK(g->ops->event_sync(g, u->ev[i]));
    if (u->ev[i] && u->ev_dev[i] == dev) return PPN_OK;
    if (u->ev[i]) g->ops->event_destroy(g, u->ev[i]);
    u->ev[i] = NULL;
    PPN_CHECK(g->ops->event_create(g, dev, 0, &u->ev[i]));
    u->ev_dev[i] = dev;
    return PPN_OK;
}

/* Copy n elements of src (dtype sdt) to dst (dtype ddt) on dev's stream through the staging buffers. */
static ppn_status stage_copy(uploader *u, int dev, ppn_dptr dst, int ddt, const void *src, int sdt, size_t n)
{
    ppn_gpu *g = u->m->rt->g;
    ppn_gstream *s;
    PPN_CHECK(ppn_model_dev_stream(u->m, dev, &s));
    size_t esz = ppn_dtype_size(ddt), per = STAGING_BYTES / esz;
    for (size_t i = 0; i < n; i += per) {
        size_t k = n - i < per ? n - i : per;
        PPN_CHECK(staging_ready(u, u->cur, dev));
        convert(u->buf[u->cur], ddt, (const char *)src + i * ppn_dtype_size(sdt), sdt, k);
        PPN_CHECK(g->ops->copy_htod(g, s, dst + i * esz, u->buf[u->cur], k * esz));
        PPN_CHECK(g->ops->event_record(g, u->ev[u->cur], s));
        u->cur ^= 1;
        u->done += k * esz;
        if (u->progress) u->progress(u->progress_arg, u->done, u->total);
    }
    return PPN_OK;
}

/* Tensors t[0..n) back to back in one block of dtype dt (row-major matrices with the same column count stack
 * into one taller matrix, so one launch computes what n would). All present, or all absent (out = 0). */
static ppn_status upload_stacked(uploader *u, int dev, const ppn_tensor *const *t, int n, int dt, const char *tag,
                                 ppn_dptr *out)
{
    ppn_model *m = u->m;
    *out = 0;
    if (!t[0]->data) return PPN_OK; /* optional tensor absent */
    size_t esz = ppn_dtype_size(dt), total = 0;
    for (int i = 0; i < n; i++) total += t[i]->nbytes / ppn_dtype_size(t[i]->dtype);
    ppn_pool *pool;
    ppn_gstream *s;
    PPN_CHECK(ppn_rt_pool(m->rt, dev, &pool));
    PPN_CHECK(ppn_model_dev_stream(m, dev, &s));
    PPN_CHECK(ppn_pool_alloc(pool, total * esz, s, tag, out));
    ppn_status st = model_track_block(m, *out, dev);
    if (st != PPN_OK) {
        ppn_pool_free(pool, *out, s);
        *out = 0;
        return st;
    }
    m->weight_bytes += total * esz;
    size_t at = 0;
    for (int i = 0; i < n && st == PPN_OK; i++) {
        size_t k = t[i]->nbytes / ppn_dtype_size(t[i]->dtype);
        st = stage_copy(u, dev, *out + at * esz, dt, t[i]->data, t[i]->dtype, k);
        at += k;
    }
    return st == PPN_OK ? PPN_OK : ppn_err_ctx(st, "uploading %s to device %d", tag, dev);
}

static ppn_status upload_as(uploader *u, int dev, const ppn_tensor *t, int dt, const char *tag, ppn_dptr *out)
{
    return upload_stacked(u, dev, &t, 1, dt, tag, out);
}

static ppn_status upload(uploader *u, int dev, const ppn_tensor *t, const char *tag, ppn_dptr *out)
{
    return upload_as(u, dev, t, u->m->wdt, tag, out);
}

static size_t tensor_elems(const ppn_tensor *t) { return t->data ? t->nbytes / ppn_dtype_size(t->dtype) : 0; }

static size_t upload_total(const ppn_ckpt *c, int wdt)
{
    size_t n = tensor_elems(&c->embed) + tensor_elems(&c->final_norm);
    if (!c->cfg.tied_embeddings) n += tensor_elems(&c->lm_head);
    for (int l = 0; l < c->cfg.n_layers; l++) {
        const ppn_tensor *t = &c->layers[l].attn_norm;
        for (size_t k = 0; k < sizeof(ppn_layer_tensors) / sizeof(ppn_tensor); k++) n += tensor_elems(&t[k]);
    }
    return n * ppn_dtype_size(wdt);
}

static ppn_status upload_layer(uploader *u, int dev, const ppn_layer_tensors *t, ppn_dev_layer *d)
{
    PPN_CHECK(upload(u, dev, &t->attn_norm, "attn_norm", &d->attn_norm));
    const ppn_tensor *qkv[3] = {&t->wq, &t->wk, &t->wv}, *bqkv[3] = {&t->bq, &t->bk, &t->bv};
    const ppn_tensor *gu[2] = {&t->w_gate, &t->w_up};
    PPN_CHECK(upload_stacked(u, dev, qkv, 3, u->m->wdt, "wq|wk|wv", &d->wqkv));
    PPN_CHECK(upload_stacked(u, dev, bqkv, 3, u->m->wdt, "bq|bk|bv", &d->bqkv));
    PPN_CHECK(upload(u, dev, &t->wo, "wo", &d->wo));
    PPN_CHECK(upload(u, dev, &t->q_norm, "q_norm", &d->q_norm));
    PPN_CHECK(upload(u, dev, &t->k_norm, "k_norm", &d->k_norm));
    PPN_CHECK(upload(u, dev, &t->ffn_norm, "ffn_norm", &d->ffn_norm));
    PPN_CHECK(upload_stacked(u, dev, gu, 2, u->m->wdt, "w_gate|w_up", &d->wgu));
    PPN_CHECK(upload(u, dev, &t->w_down, "w_down", &d->w_down));
    return PPN_OK;
}

/* The rope frequency table: HF's default (theta^(-2i/d)) and llama3 scaling, computed as transformers does
 * (in float32 from an arange), so positions rotate by the same angles. */
static void rope_inv_freq(const ppn_model_config *c, float *f)
{
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)c->head_dim;
        f[i] = (float)(1.0 / pow(c->rope_theta, (double)exponent));
    }
    if (c->rope_type != PPN_ROPE_LLAMA3) return;
    double lo_wl = c->rope_orig_max_pos / c->rope_low_freq_factor;
    double hi_wl = c->rope_orig_max_pos / c->rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
        double wl = 2.0 * M_PI / f[i];
        if (wl > lo_wl) {
            f[i] = (float)(f[i] / c->rope_factor);
        } else if (wl >= hi_wl) {
            double smooth = (c->rope_orig_max_pos / wl - c->rope_low_freq_factor) /
                            (c->rope_high_freq_factor - c->rope_low_freq_factor);
            f[i] = (float)((1.0 - smooth) * f[i] / c->rope_factor + smooth * f[i]);
        }
    }
}

/* The rope table on every device (small; lets any map run any stage anywhere without a re-upload). */
static ppn_status upload_rope_all(uploader *u)
{
    ppn_model *m = u->m;
    const ppn_model_config *c = &m->cfg;
    size_t bytes = sizeof(float) * (size_t)(c->head_dim / 2);
    float *f = ppn_halloc(bytes);
    if (!f) return ppn_err(PPN_ENOMEM, "model: host out of memory");
    rope_inv_freq(c, f);
    ppn_tensor t = {.data = f, .nbytes = bytes, .dtype = PPN_DTYPE_F32};
    ppn_status s = PPN_OK;
    for (int d = 0; d < m->rt->n_dev && s == PPN_OK; d++)
        s = upload_as(u, d, &t, PPN_DTYPE_F32, "rope inv_freq", &m->inv_freq[d]);
    for (int d = 0; d < m->rt->n_dev && s == PPN_OK; d++) s = m->rt->g->ops->stream_sync(m->rt->g, m->dev_stream[d]);
    ppn_hfree(f); /* after the syncs: the copies read it */
    return s;
}

static ppn_status uploader_open(uploader *u, ppn_model *m)
{
    for (int i = 0; i < 2; i++) PPN_CHECK(ppn_pinned_alloc(m->rt->pinned, STAGING_BYTES, &u->buf[i]));
    return PPN_OK;
}

static void uploader_close(uploader *u)
{
    ppn_gpu *g = u->m->rt->g;
    for (int i = 0; i < 2; i++) {
        if (u->ev[i]) {
            g->ops->event_sync(g, u->ev[i]);
            g->ops->event_destroy(g, u->ev[i]);
        }
        ppn_pinned_free(u->m->rt->pinned, u->buf[i]);
    }
}

/* Upload every weight to the device the placement gives it, then the load barrier (the seed's
 * sync_stages_after_load): no stage runs before every upload on every device is complete. */
static ppn_status upload_all(ppn_model *m, const ppn_ckpt *c, const ppn_load_opts *o)
{
    uploader u = {.m = m, .total = upload_total(c, m->wdt), .progress = o->progress,
                  .progress_arg = o->progress_arg};
    ppn_status s;
    PPN_CHECK_GOTO(uploader_open(&u, m), s, out);
    PPN_CHECK_GOTO(upload(&u, m->embed_dev, &c->embed, "embed", &m->embed), s, out);
    for (int l = 0; l < c->cfg.n_layers; l++)
        PPN_CHECK_GOTO(upload_layer(&u, m->layer_dev[l], &c->layers[l], &m->layers[l]), s, out);
    PPN_CHECK_GOTO(upload(&u, m->head_dev, &c->final_norm, "final_norm", &m->final_norm), s, out);
    if (c->cfg.tied_embeddings && m->embed_dev == m->head_dev) m->lm_head = m->embed;
    else PPN_CHECK_GOTO(upload(&u, m->head_dev, &c->lm_head, "lm_head", &m->lm_head), s, out);
    PPN_CHECK_GOTO(upload_rope_all(&u), s, out);
    for (int d = 0; d < PPN_MAX_DEVICES; d++)
        if (m->dev_stream[d]) PPN_CHECK_GOTO(m->rt->g->ops->stream_sync(m->rt->g, m->dev_stream[d]), s, out);
out:
    uploader_close(&u);
    return s;
}

/* Placement ----------------------------------------------------------------------------------------------- */

/* Where weights live under map: the owning stage's device, or the primary with MEMRA_PP_SHARD=0. */
static void place_weights(ppn_model *m, const ppn_stage_map *map)
{
    int shard = map->door.shard;
    for (int l = 0; l < m->cfg.n_layers; l++) m->layer_dev[l] = shard ? map->dev[ppn_layer_stage(map, l)] : m->primary;
    m->embed_dev = shard ? map->dev[0] : m->primary;
    m->head_dev = shard ? map->dev[map->n_stages - 1] : m->primary;
}

/* KV positions that fit next to the weights on every device holding KV, leaving room for scratch. */
static ppn_status choose_ctx(ppn_model *m, int want)
{
    const ppn_model_config *c = &m->cfg;
    if (want > c->max_pos)
        return ppn_err(PPN_EINVAL, "ctx %d exceeds the model's max_position_embeddings %d", want, c->max_pos);
    size_t per_layer = 2 * ppn_op_kv_cache_bytes(c->n_kv_heads, c->head_dim, 1, m->kvdt); /* k and v, a position */
    size_t reserve = (size_t)64 << 20;
    int ctx = want > 0 ? want : c->max_pos;
    for (int s = 0; s < m->map->n_stages; s++) {
        int dev = m->map->dev[s];
        size_t layers = (size_t)(m->map->fence[s + 1] - m->map->fence[s]), free_b = 0, total_b = 0;
        for (int t = 0; t < s; t++) /* stages sharing a device share its memory */
            if (m->map->dev[t] == dev) layers = 0;
        for (int t = s + 1; t < m->map->n_stages && layers; t++)
            if (m->map->dev[t] == dev) layers += (size_t)(m->map->fence[t + 1] - m->map->fence[t]);
        if (!layers) continue;
        PPN_CHECK(m->rt->g->ops->mem_get_info(m->rt->g, dev, &free_b, &total_b));
        size_t fit = free_b > reserve ? (free_b - reserve) / (layers * per_layer) : 0;
        if (want == 0 && (size_t)ctx > fit) ctx = (int)fit;
        if (ctx < 1 || (size_t)ctx > fit)
            return ppn_err(PPN_ENOMEM, "device %d: a KV cache of %d positions for %zu layers needs %zu B; %zu B free",
                           dev, ctx < 1 ? 1 : ctx, layers, (size_t)(ctx < 1 ? 1 : ctx) * layers * per_layer, free_b);
    }
    m->ctx = ctx;
    return PPN_OK;
}

/* Model load ---------------------------------------------------------------------------------------------- */

ppn_load_opts ppn_load_opts_default(void)
{
    return (ppn_load_opts){.dtype = PPN_DTYPE_DEFAULT, .ctx = 0, .device = 0, .door = NULL};
}

static ppn_status check_opts(ppn_rt *rt, const ppn_load_opts *o)
{
    if (o->dtype < PPN_DTYPE_DEFAULT || o->dtype > PPN_DTYPE_F16)
        return ppn_err(PPN_EINVAL, "dtype %d is not f32, bf16 or f16", o->dtype);
    if (o->ctx < 0) return ppn_err(PPN_EINVAL, "ctx %d is negative", o->ctx);
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
    }
    m->rb_dev = -1;
    return attn_split_choose(m);
}

ppn_status ppn_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *opts, ppn_model **out)
{
    *out = NULL;
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
    m->map = map; /* not yet published: no thread runs */
    place_weights(m, map);
    PPN_CHECK_GOTO(upload_all(m, c, &o), s, fail);
    ppn_trace("weights uploaded: %zu B", m->weight_bytes);
    PPN_CHECK_GOTO(choose_ctx(m, o.ctx), s, fail);
    m->map = NULL;
    PPN_CHECK_GOTO(ppn_map_install(m, map), s, fail);
    map = NULL;
    ppn_trace("ctx %d, %d stage(s), attention in %d split(s)", m->ctx, m->map->n_stages, m->attn_split);
    ppn_ckpt_close(c);
    *out = m;
    return PPN_OK;
fail:
    if (m && m->map == map) m->map = NULL;
    ppn_hfree(map);
    ppn_ckpt_close(c);
    ppn_model_free(m);
    return s;
}

void ppn_model_free(ppn_model *m)
{
    if (!m) return;
    ppn_gpu *g = m->rt->g;
    while (m->seqs) ppn_seq_destroy(m->seqs);
    ppn_map_teardown(m);
    for (int b = 0; b < m->n_weight_blocks; b++) {
        ppn_gstream *s;
        ppn_pool *pool;
        int dev = m->weight_blocks[b].dev;
        if (ppn_model_dev_stream(m, dev, &s) == PPN_OK && ppn_rt_pool(m->rt, dev, &pool) == PPN_OK)
            ppn_pool_free(pool, m->weight_blocks[b].ptr, s);
    }
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
}

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

/* Kernel profile ------------------------------------------------------------------------------------------ */

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
