/* upload.c - weights to the devices the stage map places them on: each tensor converted to the model's dtype in
 * double-buffered pinned staging, stacked where one launch serves several (q|k|v, gate|up), and the rope
 * table on every device; then the load barrier. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/dtype.h"
#include "core/base/err.h"
#include "core/rt.h"

#define STAGING_BYTES (16u << 20)

#if PPN_TEST_HOOKS
static _Atomic int skip_staging_wait; /* test-only */

void ppn_upload_test_skip_staging_wait(int skip) { atomic_store(&skip_staging_wait, skip); }
#endif

static int staging_wait_skipped(void)
{
#if PPN_TEST_HOOKS
    return atomic_load_explicit(&skip_staging_wait, memory_order_relaxed);
#else
    return 0;
#endif
}

typedef struct uploader {
    ppn_model *m;
    void *buf[2];          /* pinned staging, double-buffered */
    ppn_pinned_arena *buf_arena[2]; /* the arena of buf[i]: the node of the device it last fed */
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

/* Convert n values; returns nonzero when the result holds NaN or Inf (a NaN or Inf in the source, or a finite
 * value past the range of the destination dtype). */
static int convert(void *dst, int ddt, const void *src, int sdt, size_t n)
{
    if (ddt == sdt) return ppn_copy_nonfinite(dst, src, n, ddt);
    for (size_t i = 0; i < n; i++) {
        float f = load_f32(src, sdt, i);
        if (ddt == PPN_DTYPE_F32) ((float *)dst)[i] = f;
        else if (ddt == PPN_DTYPE_BF16) ((uint16_t *)dst)[i] = ppn_f32_to_bf16(f);
        else ((uint16_t *)dst)[i] = ppn_f32_to_f16(f);
    }
    return ppn_copy_nonfinite(NULL, dst, n, ddt); /* the result: a source NaN, or a value past ddt's range */
}

/* The refusal of a tensor whose element at (of n, dtype sdt at src; converted to ddt) is not finite. */
static ppn_status nonfinite_refused(const void *src, int sdt, int ddt, size_t at, size_t n)
{
    float f = load_f32(src, sdt, at);
    if (!isfinite(f))
        return ppn_err(PPN_EFORMAT, "element %zu of %zu is %s: a weight that is NaN or Inf makes every logit NaN",
                       at, n, isnan(f) ? "NaN" : "Inf");
    return ppn_err(PPN_EUNSUPPORTED, "element %zu of %zu, %g, is past the range of %s: load with a wider dtype",
                   at, n, (double)f, ppn_dtype_name((ppn_dtype)ddt));
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
 * (an event is recorded only on a stream of its own device), and the buffer to that device's NUMA node. */
static ppn_status staging_ready(uploader *u, int i, int dev)
{
    ppn_gpu *g = u->m->rt->g;
    ppn_pinned_arena *a;
    if (u->ev[i] && !staging_wait_skipped()) PPN_CHECK(g->ops->event_sync(g, u->ev[i]));
    PPN_CHECK(ppn_rt_pinned_for(u->m->rt, dev, &a));
    if (a != u->buf_arena[i]) {
        ppn_pinned_free(a, u->buf[i]);
        u->buf[i] = NULL;
        PPN_CHECK(ppn_pinned_alloc(a, STAGING_BYTES, &u->buf[i]));
        u->buf_arena[i] = a;
    }
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
        g->ops->host_access(g, u->buf[u->cur], k * esz, PPN_ACC_W, "upload staging"); /* the sim checks the refill */
        const char *from = (const char *)src + i * ppn_dtype_size(sdt);
        if (convert(u->buf[u->cur], ddt, from, sdt, k))
            return nonfinite_refused(src, sdt, ddt, i + ppn_first_nonfinite(u->buf[u->cur], k, ddt), n);
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
        ppn_err_first first = {0}; /* st with its message, whatever the free meets */
        ppn_err_first_add(&first, st);
        ppn_err_first_add(&first, ppn_model_block_free(m, dev, out));
        return ppn_err_first_done(&first);
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
ppn_status ppn_upload_weights(ppn_model *m, const ppn_ckpt *c, const ppn_load_opts *o)
{
    uploader u = {.m = m, .total = upload_total(c, m->wdt), .progress = o->progress,
                  .progress_arg = o->progress_arg};
    ppn_status s;
    PPN_CHECK_GOTO(upload(&u, m->embed_dev, &c->embed, "embed", &m->embed), s, out);
    for (int l = 0; l < c->cfg.n_layers; l++) {
        s = upload_layer(&u, m->layer_dev[l], &c->layers[l], &m->layers[l]);
        if (s != PPN_OK) {
            ppn_err_ctx(s, "layer %d", l);
            goto out;
        }
    }
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
