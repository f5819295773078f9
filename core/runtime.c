/* runtime.c - runtime, model load (weight upload with dtype conversion), sequences and the decode step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "rt.h"
#include "err.h"
#include "../kernels/ktable.h"

#define STAGING_BYTES (16u << 20)

/* Runtime ------------------------------------------------------------------------------------------------- */

ppn_status ppn_rt_create(const char *backend, ppn_rt **out)
{
    *out = NULL;
    ppn_rt *rt = ppn_hcalloc(1, sizeof *rt);
    if (!rt) return ppn_err(PPN_ENOMEM, "runtime: host out of memory");
    ppn_status st;
    PPN_CHECK_GOTO(ppn_gpu_open(backend, &rt->g), st, fail);
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
    for (int d = 0; d < PPN_MAX_DEVICES; d++) ppn_pool_destroy(rt->pool[d]);
    ppn_pinned_arena_destroy(rt->pinned);
    ppn_gpu_close(rt->g);
    ppn_hfree(rt);
}

const char *ppn_rt_backend(const ppn_rt *rt) { return rt->g->ops->name; }

ppn_status ppn_rt_pool(ppn_rt *rt, int dev, ppn_pool **out)
{
    if (dev < 0 || dev >= rt->n_dev)
        return ppn_err(PPN_EINVAL, "device %d does not exist (%s backend has %d)", dev, rt->g->ops->name,
                       rt->n_dev);
    if (!rt->pool[dev]) PPN_CHECK(ppn_pool_create(rt->g, dev, 0, &rt->pool[dev]));
    *out = rt->pool[dev];
    return PPN_OK;
}

/* Weight upload ------------------------------------------------------------------------------------------- */

typedef struct uploader {
    ppn_model *m;
    void *buf[2];          /* pinned staging, double-buffered */
    ppn_gevent *ev[2];     /* recorded after the copy out of buf[i] */
    int cur;
    size_t done, total;
    void (*progress)(void *, size_t, size_t);
    void *progress_arg;
} uploader;

static float load_f32(const void *src, int dt, size_t i)
{
    switch (dt) {
    case PPN_DT_BF16: return ppn_bf16_to_f32(((const uint16_t *)src)[i]);
    case PPN_DT_F16: return ppn_f16_to_f32(((const uint16_t *)src)[i]);
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
        if (ddt == PPN_DT_F32) ((float *)dst)[i] = f;
        else if (ddt == PPN_DT_BF16) ((uint16_t *)dst)[i] = ppn_f32_to_bf16(f);
        else ((uint16_t *)dst)[i] = ppn_f32_to_f16(f);
    }
}

static ppn_status model_track_block(ppn_model *m, ppn_dptr p, int stage)
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
    m->weight_blocks[m->n_weight_blocks++] = (struct ppn_weight_block){p, stage};
    return PPN_OK;
}

/* Copy n elements of src (dtype sdt) to device dst (dtype ddt) through the staging buffers. */
static ppn_status stage_copy(uploader *u, ppn_stage *st, ppn_dptr dst, int ddt, const void *src, int sdt,
                             size_t n)
{
    ppn_gpu *g = u->m->rt->g;
    size_t esz = ppn_dtype_size(ddt), per = STAGING_BYTES / esz;
    for (size_t i = 0; i < n; i += per) {
        size_t k = n - i < per ? n - i : per;
        PPN_CHECK(g->ops->event_sync(g, u->ev[u->cur])); /* the copy out of this buffer is done */
        convert(u->buf[u->cur], ddt, (const char *)src + i * ppn_dtype_size(sdt), sdt, k);
        PPN_CHECK(g->ops->copy_htod(g, st->stream, dst + i * esz, u->buf[u->cur], k * esz));
        PPN_CHECK(g->ops->event_record(g, u->ev[u->cur], st->stream));
        u->cur ^= 1;
        u->done += k * esz;
        if (u->progress) u->progress(u->progress_arg, u->done, u->total);
    }
    return PPN_OK;
}

static ppn_status upload(uploader *u, ppn_stage *st, const ppn_tensor *t, const char *tag, ppn_dptr *out)
{
    ppn_model *m = u->m;
    *out = 0;
    if (!t->data) return PPN_OK; /* optional tensor absent */
    size_t n = t->nbytes / ppn_dtype_size(t->dtype);
    PPN_CHECK(ppn_pool_alloc(st->pool, n * ppn_dtype_size(m->wdt), st->stream, tag, out));
    ppn_status s = model_track_block(m, *out, (int)(st - m->stages));
    if (s != PPN_OK) {
        ppn_pool_free(st->pool, *out, st->stream);
        *out = 0;
        return s;
    }
    m->weight_bytes += n * ppn_dtype_size(m->wdt);
    s = stage_copy(u, st, *out, m->wdt, t->data, t->dtype, n);
    return s == PPN_OK ? PPN_OK : ppn_err_ctx(s, "uploading %s", tag);
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

static ppn_status upload_layer(uploader *u, ppn_stage *st, const ppn_layer_tensors *t, ppn_dev_layer *d)
{
    PPN_CHECK(upload(u, st, &t->attn_norm, "attn_norm", &d->attn_norm));
    PPN_CHECK(upload(u, st, &t->wq, "wq", &d->wq));
    PPN_CHECK(upload(u, st, &t->wk, "wk", &d->wk));
    PPN_CHECK(upload(u, st, &t->wv, "wv", &d->wv));
    PPN_CHECK(upload(u, st, &t->wo, "wo", &d->wo));
    PPN_CHECK(upload(u, st, &t->bq, "bq", &d->bq));
    PPN_CHECK(upload(u, st, &t->bk, "bk", &d->bk));
    PPN_CHECK(upload(u, st, &t->bv, "bv", &d->bv));
    PPN_CHECK(upload(u, st, &t->q_norm, "q_norm", &d->q_norm));
    PPN_CHECK(upload(u, st, &t->k_norm, "k_norm", &d->k_norm));
    PPN_CHECK(upload(u, st, &t->ffn_norm, "ffn_norm", &d->ffn_norm));
    PPN_CHECK(upload(u, st, &t->w_gate, "w_gate", &d->w_gate));
    PPN_CHECK(upload(u, st, &t->w_up, "w_up", &d->w_up));
    PPN_CHECK(upload(u, st, &t->w_down, "w_down", &d->w_down));
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

static ppn_status upload_rope(uploader *u, ppn_stage *st)
{
    const ppn_model_config *c = &u->m->cfg;
    float *f = ppn_halloc(sizeof(float) * (size_t)(c->head_dim / 2));
    if (!f) return ppn_err(PPN_ENOMEM, "model: host out of memory");
    rope_inv_freq(c, f);
    ppn_tensor t = {.data = f, .nbytes = sizeof(float) * (size_t)(c->head_dim / 2), .dtype = PPN_DT_F32};
    int wdt = u->m->wdt;
    u->m->wdt = PPN_DT_F32; /* the table stays f32 whatever the weights are */
    ppn_status s = upload(u, st, &t, "rope inv_freq", &st->inv_freq);
    u->m->wdt = wdt;
    if (s == PPN_OK) s = u->m->rt->g->ops->stream_sync(u->m->rt->g, st->stream); /* f is freed next */
    ppn_hfree(f);
    return s;
}

/* Model load ---------------------------------------------------------------------------------------------- */

ppn_load_opts ppn_load_opts_default(void)
{
    return (ppn_load_opts){.dtype = PPN_DTYPE_DEFAULT, .ctx = 0, .device = 0};
}

static ppn_status uploader_open(uploader *u, ppn_model *m)
{
    ppn_gpu *g = m->rt->g;
    for (int i = 0; i < 2; i++) {
        PPN_CHECK(ppn_pinned_alloc(m->rt->pinned, STAGING_BYTES, &u->buf[i]));
        PPN_CHECK(g->ops->event_create(g, m->stages[0].dev, 0, &u->ev[i]));
    }
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

static ppn_status upload_all(ppn_model *m, const ppn_ckpt *c, const ppn_load_opts *o)
{
    uploader u = {.m = m, .total = upload_total(c, m->wdt), .progress = o->progress,
                  .progress_arg = o->progress_arg};
    ppn_status s;
    ppn_stage *first = &m->stages[0], *last = &m->stages[m->n_stages - 1];
    PPN_CHECK_GOTO(uploader_open(&u, m), s, out);
    PPN_CHECK_GOTO(upload(&u, first, &c->embed, "embed", &m->embed), s, out);
    for (int i = 0; i < m->n_stages; i++) {
        ppn_stage *st = &m->stages[i];
        for (int l = st->l0; l < st->l1; l++)
            PPN_CHECK_GOTO(upload_layer(&u, st, &c->layers[l], &m->layers[l]), s, out);
        PPN_CHECK_GOTO(upload_rope(&u, st), s, out);
    }
    PPN_CHECK_GOTO(upload(&u, last, &c->final_norm, "final_norm", &m->final_norm), s, out);
    if (c->cfg.tied_embeddings && first == last) m->lm_head = m->embed;
    else PPN_CHECK_GOTO(upload(&u, last, &c->lm_head, "lm_head", &m->lm_head), s, out);
    /* The load barrier: no stage runs before every upload is complete. */
    for (int i = 0; i < m->n_stages; i++)
        PPN_CHECK_GOTO(m->rt->g->ops->stream_sync(m->rt->g, m->stages[i].stream), s, out);
out:
    uploader_close(&u);
    return s;
}

/* KV positions that fit on the device next to the weights, leaving room for scratch. */
static ppn_status choose_ctx(ppn_model *m, int want)
{
    const ppn_model_config *c = &m->cfg;
    size_t per_pos = (size_t)c->n_layers * 2 * (size_t)c->n_kv_heads * (size_t)c->head_dim * sizeof(float);
    size_t free_b = 0, total_b = 0;
    ppn_gpu *g = m->rt->g;
    PPN_CHECK(g->ops->mem_get_info(g, m->stages[0].dev, &free_b, &total_b));
    size_t reserve = (size_t)64 << 20;
    size_t fit = free_b > reserve ? (free_b - reserve) / per_pos : 0;
    if (want > c->max_pos)
        return ppn_err(PPN_EINVAL, "ctx %d exceeds the model's max_position_embeddings %d", want, c->max_pos);
    int ctx = want > 0 ? want : c->max_pos;
    if (want == 0 && (size_t)ctx > fit) ctx = (int)fit;
    if (ctx < 1 || (size_t)ctx > fit)
        return ppn_err(PPN_ENOMEM, "device %d: a KV cache of %d positions needs %zu B; %zu B free", m->stages[0].dev,
                       ctx < 1 ? 1 : ctx, (size_t)(ctx < 1 ? 1 : ctx) * per_pos, free_b);
    m->ctx = ctx;
    return PPN_OK;
}

static ppn_status model_stages_init(ppn_model *m, int dev)
{
    ppn_stage *st = &m->stages[0];
    m->n_stages = 1;
    st->dev = dev;
    st->l0 = 0;
    st->l1 = m->cfg.n_layers;
    PPN_CHECK(ppn_rt_pool(m->rt, dev, &st->pool));
    return m->rt->g->ops->stream_create(m->rt->g, dev, &st->stream);
}

ppn_status ppn_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *opts, ppn_model **out)
{
    *out = NULL;
    ppn_load_opts o = opts ? *opts : ppn_load_opts_default();
    if (o.dtype < PPN_DTYPE_DEFAULT || o.dtype > PPN_DTYPE_F16)
        return ppn_err(PPN_EINVAL, "dtype %d is not f32, bf16 or f16", o.dtype);
    if (o.ctx < 0) return ppn_err(PPN_EINVAL, "ctx %d is negative", o.ctx);
    if (o.device < 0 || o.device >= rt->n_dev)
        return ppn_err(PPN_EINVAL, "device %d does not exist (%d devices)", o.device, rt->n_dev);
    ppn_ckpt *c = NULL;
    PPN_CHECK(ppn_ckpt_open(path, &c));
    ppn_status s;
    ppn_model *m = ppn_hcalloc(1, sizeof *m);
    if (!m) {
        ppn_ckpt_close(c);
        return ppn_err(PPN_ENOMEM, "model: host out of memory");
    }
    m->rt = rt;
    m->cfg = c->cfg;
    m->wdt = o.dtype != PPN_DTYPE_DEFAULT ? o.dtype : (strcmp(rt->g->ops->name, "cuda") == 0 ? PPN_DT_BF16 : PPN_DT_F32);
    m->layers = ppn_hcalloc((size_t)c->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        s = ppn_err(PPN_ENOMEM, "model: host out of memory");
        goto fail;
    }
    ppn_trace("checkpoint %s open: %s, %d layers", path, c->cfg.arch_name, c->cfg.n_layers);
    PPN_CHECK_GOTO(model_stages_init(m, o.device), s, fail);
    PPN_CHECK_GOTO(upload_all(m, c, &o), s, fail);
    ppn_trace("weights uploaded: %zu B", m->weight_bytes);
    PPN_CHECK_GOTO(choose_ctx(m, o.ctx), s, fail);
    ppn_trace("ctx %d", m->ctx);
    ppn_ckpt_close(c);
    *out = m;
    return PPN_OK;
fail:
    ppn_ckpt_close(c);
    ppn_model_free(m);
    return s;
}

void ppn_model_free(ppn_model *m)
{
    if (!m) return;
    ppn_gpu *g = m->rt->g;
    for (int i = 0; i < m->n_stages; i++) {
        ppn_stage *st = &m->stages[i];
        if (!st->stream) continue;
        g->ops->stream_sync(g, st->stream);
        for (int b = 0; b < m->n_weight_blocks; b++)
            if (m->weight_blocks[b].stage == i) ppn_pool_free(st->pool, m->weight_blocks[b].ptr, st->stream);
        g->ops->stream_sync(g, st->stream);
        ppn_pool_stream_retired(st->pool, st->stream);
        g->ops->stream_destroy(g, st->stream);
    }
    ppn_hfree(m->weight_blocks);
    ppn_hfree(m->layers);
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
    o->bos_id = c->bos_id;
    o->eos_id = c->eos_id;
    o->weight_bytes = m->weight_bytes;
}
