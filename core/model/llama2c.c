/* llama2c.c - llama2.c legacy checkpoints (.bin): 7 int32 of header, then float32 weights.
 *
 * Header: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative: an unshared classifier
 * follows the weights), seq_len. Weights, in order: token_embedding [vocab, dim]; rms_att [L, dim];
 * wq [L, n_heads*hs, dim]; wk, wv [L, n_kv*hs, dim]; wo [L, dim, n_heads*hs]; rms_ffn [L, dim];
 * w1 (gate) [L, hidden, dim]; w2 (down) [L, dim, hidden]; w3 (up) [L, hidden, dim]; rms_final [dim];
 * freq_cis_real, freq_cis_imag [seq_len, hs/2] (unused: ppn computes rotary itself); wcls [vocab, dim] when
 * unshared. hs = dim / n_heads. The file must be exactly that long: the format has no trailer, so extra
 * bytes mean a different layout (or a different format) and guessing would hand out wrong weights.
 */
#include <limits.h>
#include <string.h>
#include "core/model/ckpt_internal.h"
#include "core/base/err.h"

#define L2C_HEADER_BYTES 28

typedef struct l2c_hdr {
    int32_t dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len;
} l2c_hdr;

/* A cursor over the weights: each take() hands out the next count floats or names what is missing. */
typedef struct l2c_cursor {
    const char *path;
    const uint8_t *base;
    size_t len, off;
} l2c_cursor;

static ppn_status take(l2c_cursor *cur, uint64_t count, const char *what, const float **out)
{
    uint64_t need = count * 4;   /* count < 2^50 by the header limits below */
    if (need > cur->len - cur->off)
        return ppn_err(PPN_EFORMAT, "%s: file ends inside tensor '%s' (needs %llu bytes at offset %zu, file is %zu "
                       "bytes)", cur->path, what, (unsigned long long)need, cur->off, cur->len);
    *out = (const float *)(const void *)(cur->base + cur->off);
    cur->off += (size_t)need;
    return PPN_OK;
}

static ppn_status check_header(const char *path, const l2c_hdr *h)
{
    /* llama2.c's newer exports start with the magic "ak42"; they are a different layout. */
    if (memcmp(&h->dim, "ak42", 4) == 0)
        return ppn_err(PPN_EUNSUPPORTED, "%s: llama2.c version-1/2 export (magic ak42) is not supported; "
                       "export with the legacy format", path);
    const struct { const char *name; int32_t v, hi; } f[] = {
        {"dim", h->dim, 1 << 16}, {"hidden_dim", h->hidden, 1 << 20}, {"n_layers", h->n_layers, 1 << 12},
        {"n_heads", h->n_heads, 1 << 12}, {"n_kv_heads", h->n_kv, 1 << 12}, {"seq_len", h->seq_len, 1 << 24},
    };
    for (size_t i = 0; i < PPN_ARRAY_LEN(f); i++)
        if (f[i].v <= 0 || f[i].v > f[i].hi)
            return ppn_err(PPN_EFORMAT, "%s: header field %s = %d is out of range [1, %d]", path, f[i].name,
                           f[i].v, f[i].hi);
    if (h->vocab == 0 || h->vocab < -(1 << 24) || h->vocab > (1 << 24))
        return ppn_err(PPN_EFORMAT, "%s: header field vocab_size = %d is out of range", path, h->vocab);
    if (h->dim % h->n_heads != 0 || h->n_heads % h->n_kv != 0)
        return ppn_err(PPN_EFORMAT, "%s: dim %d, n_heads %d, n_kv_heads %d do not divide evenly", path, h->dim,
                       h->n_heads, h->n_kv);
    if ((h->dim / h->n_heads) % 2 != 0)
        return ppn_err(PPN_EFORMAT, "%s: head size %d is odd (rotary embedding rotates pairs)", path,
                       h->dim / h->n_heads);
    return PPN_OK;
}

static void fill_config(const l2c_hdr *h, ppn_model_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->arch = PPN_ARCH_LLAMA2C;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "llama2.c");
    cfg->dim = h->dim;
    cfg->ffn_dim = h->hidden;
    cfg->n_layers = h->n_layers;
    cfg->n_heads = h->n_heads;
    cfg->n_kv_heads = h->n_kv;
    cfg->head_dim = h->dim / h->n_heads;
    cfg->vocab = h->vocab < 0 ? -h->vocab : h->vocab;
    cfg->tied_embeddings = h->vocab > 0;
    cfg->max_pos = h->seq_len;
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 10000.0;
    cfg->rope_type = PPN_ROPE_DEFAULT;
    /* llama2.c rotates ADJACENT pairs (2i, 2i+1) where HF rotates halves (i, i + hd/2); the rope kernel
     * follows this flag, so the weights need no permutation. */
    cfg->rope_interleaved = 1;
    cfg->bos_id = 1;
    cfg->eos_id = -1;   /* llama2.c stops when it samples BOS (1) again; there is no EOS id */
}

static void view(ppn_tensor *t, const float *data, int64_t d0, int64_t d1)
{
    t->data = data;
    t->dtype = PPN_DTYPE_F32;
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = (size_t)(d0 * (d1 ? d1 : 1)) * 4;
}

/* One [L, rows, cols] block, sliced into layer l's field at offset (a ppn_layer_tensors member). */
static ppn_status take_layers(ppn_ckpt *c, l2c_cursor *cur, const char *what, size_t offset, int64_t rows,
                              int64_t cols)
{
    const float *p = NULL;
    int64_t per = rows * (cols ? cols : 1);
    PPN_CHECK(take(cur, (uint64_t)per * (uint64_t)c->cfg.n_layers, what, &p));
    for (int l = 0; l < c->cfg.n_layers; l++)
        view((ppn_tensor *)((char *)&c->layers[l] + offset), p + (size_t)l * (size_t)per, rows, cols);
    return PPN_OK;
}

#define LAYER(field) offsetof(ppn_layer_tensors, field)

static ppn_status take_all(ppn_ckpt *c, l2c_cursor *cur)
{
    const ppn_model_config *g = &c->cfg;
    int64_t dim = g->dim, q = (int64_t)g->n_heads * g->head_dim, kv = (int64_t)g->n_kv_heads * g->head_dim;
    const float *p = NULL;
    PPN_CHECK(take(cur, (uint64_t)g->vocab * (uint64_t)dim, "token_embedding_table", &p));
    view(&c->embed, p, g->vocab, dim);
    PPN_CHECK(take_layers(c, cur, "rms_att_weight", LAYER(attn_norm), dim, 0));
    PPN_CHECK(take_layers(c, cur, "wq", LAYER(wq), q, dim));
    PPN_CHECK(take_layers(c, cur, "wk", LAYER(wk), kv, dim));
    PPN_CHECK(take_layers(c, cur, "wv", LAYER(wv), kv, dim));
    PPN_CHECK(take_layers(c, cur, "wo", LAYER(wo), dim, q));
    PPN_CHECK(take_layers(c, cur, "rms_ffn_weight", LAYER(ffn_norm), dim, 0));
    PPN_CHECK(take_layers(c, cur, "w1", LAYER(w_gate), g->ffn_dim, dim));
    PPN_CHECK(take_layers(c, cur, "w2", LAYER(w_down), dim, g->ffn_dim));
    PPN_CHECK(take_layers(c, cur, "w3", LAYER(w_up), g->ffn_dim, dim));
    PPN_CHECK(take(cur, (uint64_t)dim, "rms_final_weight", &p));
    view(&c->final_norm, p, dim, 0);
    uint64_t freq = (uint64_t)g->max_pos * (uint64_t)(g->head_dim / 2);
    PPN_CHECK(take(cur, freq, "freq_cis_real", &p));
    PPN_CHECK(take(cur, freq, "freq_cis_imag", &p));
    if (g->tied_embeddings) {
        c->lm_head = c->embed;
    } else {
        PPN_CHECK(take(cur, (uint64_t)g->vocab * (uint64_t)dim, "wcls", &p));
        view(&c->lm_head, p, g->vocab, dim);
    }
    if (cur->off != cur->len)
        return ppn_err(PPN_EFORMAT, "%s: %zu bytes follow the last tensor ('%s'); the header implies a %zu-byte "
                       "file", cur->path, cur->len - cur->off, g->tied_embeddings ? "freq_cis_imag" : "wcls",
                       cur->off);
    return PPN_OK;
}

ppn_status ppn_llama2c_open(ppn_ckpt *c)
{
    ppn_ckpt_priv *p = c->priv;
    l2c_hdr h;
    PPN_CHECK(ppn_map_readonly(c->path, &p->bin, &p->bin_len));
    if (p->bin_len < L2C_HEADER_BYTES)
        return ppn_err(PPN_EFORMAT, "%s: %zu bytes, shorter than the 28-byte llama2.c header", c->path,
                       p->bin_len);
    memcpy(&h, p->bin, sizeof h);
    PPN_CHECK(check_header(c->path, &h));
    fill_config(&h, &c->cfg);
    PPN_CHECK(ppn_ckpt_alloc_layers(c));
    l2c_cursor cur = {.path = c->path, .base = p->bin, .len = p->bin_len, .off = L2C_HEADER_BYTES};
    return take_all(c, &cur);
}
