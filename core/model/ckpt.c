/* ckpt.c - ppn_ckpt_open/close: pick the loader, parse the config, bind every expected tensor to a view.
 *
 * HF checkpoints: config.json is parsed first (it says which tensors must exist and their shapes), then the
 * safetensors set is mapped and validated, then each expected tensor is looked up and checked for dtype and
 * exact shape. Then every tensor the files hold must be one of those: a tensor the config does not use (a layer
 * past num_hidden_layers, a bias the architecture has none of, a name ppn does not know) is refused by name
 * rather than dropped, since a forward pass without it is silently another model. The one exception is the
 * rotary table old exporters stored (rotary_emb.inv_freq): ppn computes the same table from rope_theta.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/model/ckpt_internal.h"
#include "core/base/err.h"
#include "core/model/safetensors.h"

#define PPN_MAX_CONFIG (16u << 20)

/* ---- binding ------------------------------------------------------------------------------------------ */

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *dims)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)dims[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The host views are read as typed arrays by the uploaders; a file that stores a tensor off its element
 * alignment (legal in safetensors, never done by real writers) gets an aligned private copy. */
static ppn_status view_aligned(ppn_ckpt *c, const char *file, const char *name, ppn_tensor *t)
{
    size_t el = t->dtype == PPN_DTYPE_F32 ? 4 : 2;
    if (((uintptr_t)t->data % el) == 0) return PPN_OK;
    ppn_ckpt_priv *p = c->priv;
    void **grown = realloc(p->owned, (p->n_owned + 1) * sizeof *grown);
    if (!grown) return ppn_err(PPN_ENOMEM, "%s: tensor '%s': out of memory", file, name);
    p->owned = grown;
    void *copy = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
    if (!copy) return ppn_err(PPN_ENOMEM, "%s: tensor '%s': out of memory for an aligned copy", file, name);
    memcpy(copy, t->data, t->nbytes);
    p->owned[p->n_owned++] = copy;
    t->data = copy;
    return PPN_OK;
}

/* Bind name to t with exactly the shape given; an absent tensor is an error only when required. */
static ppn_status bind(ppn_ckpt *c, const char *name, int ndim, const int64_t *dims, int required, ppn_tensor *t)
{
    const char *file;
    char want[96], got[160];
    ppn_ckpt_priv *p = c->priv;
    const ppn_st_tensor *e = ppn_st_set_find(p->st, name, &file);
    memset(t, 0, sizeof *t);
    fmt_shape(want, sizeof want, ndim, dims);
    if (!e) {
        if (!required) return PPN_OK;
        return ppn_err(PPN_EFORMAT, "%s: missing tensor '%s' (expected shape %s)", file, name, want);
    }
    if (e->ppn_dtype < 0)
        return ppn_err(PPN_EUNSUPPORTED, "%s: tensor '%s' has dtype %s; ppn loads F32, BF16 and F16", file, name,
                       e->dtype);
    int same = e->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = e->shape[i] == dims[i];
    if (!same) {
        fmt_shape(got, sizeof got, e->ndim, e->shape);
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' has shape %s, expected %s", file, name, got, want);
    }
    t->data = e->data;
    t->nbytes = e->nbytes;
    t->dtype = e->ppn_dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = dims[i];
    return view_aligned(c, file, name, t);
}

static ppn_status bind_layer(ppn_ckpt *c, int l)
{
    char name[160];
    int64_t dims[2];
    for (size_t i = 0; i < ppn_hf_n_layer_slots; i++) {
        const ppn_hf_slot *s = &ppn_hf_layer_slots[i];
        ppn_tensor *t = (ppn_tensor *)((char *)&c->layers[l] + s->offset);
        if (!ppn_hf_slot_present(&c->cfg, s)) continue;   /* stays zeroed: absent */
        snprintf(name, sizeof name, "model.layers.%d.%s", l, s->suffix);
        int nd = ppn_hf_shape_dims(&c->cfg, s->shape, dims);
        PPN_CHECK(bind(c, name, nd, dims, 1, t));
    }
    return PPN_OK;
}

/* tie_word_embeddings=false needs lm_head.weight; true uses it when present anyway (a checkpoint that
 * stores it says what it means), else shares the embedding. cfg.tied_embeddings ends up saying which. */
static ppn_status bind_globals(ppn_ckpt *c)
{
    int64_t vd[2], d[2];
    ppn_hf_shape_dims(&c->cfg, PPN_HF_VOCAB, vd);
    ppn_hf_shape_dims(&c->cfg, PPN_HF_DIM, d);
    PPN_CHECK(bind(c, "model.embed_tokens.weight", 2, vd, 1, &c->embed));
    PPN_CHECK(bind(c, "model.norm.weight", 1, d, 1, &c->final_norm));
    PPN_CHECK(bind(c, "lm_head.weight", 2, vd, !c->cfg.tied_embeddings, &c->lm_head));
    c->cfg.tied_embeddings = c->lm_head.data == NULL;
    if (c->cfg.tied_embeddings) c->lm_head = c->embed;
    return PPN_OK;
}

/* ---- tensors the config does not use ------------------------------------------------------------------ */

/* "model.layers.<N>.<rest>": N (digits as bind_layer spells them: no sign, no leading zero; INT_MAX when too
 * large) and *rest; 0 if name is not one ("model.layers.01.x" is not layer 1, which bind_layer never bound). */
static int layer_name(const char *name, long *n, const char **rest)
{
    static const char pfx[] = "model.layers.";
    const char *p = name + sizeof pfx - 1;
    long v = 0;
    if (strncmp(name, pfx, sizeof pfx - 1) != 0 || *p < '0' || *p > '9') return 0;
    if (p[0] == '0' && p[1] >= '0' && p[1] <= '9') return 0;
    for (; *p >= '0' && *p <= '9'; p++) v = v > INT_MAX / 10 ? INT_MAX : v * 10 + (*p - '0');
    if (*p != '.') return 0;
    *n = v;
    *rest = p + 1;
    return 1;
}

static const ppn_hf_slot *slot_find(const char *suffix)
{
    for (size_t i = 0; i < ppn_hf_n_layer_slots; i++)
        if (strcmp(ppn_hf_layer_slots[i].suffix, suffix) == 0) return &ppn_hf_layer_slots[i];
    return NULL;
}

/* A tensor of a decoder layer that the config does not bind: why, naming the config field that says so. */
static ppn_status layer_unused(const ppn_ckpt *c, const char *file, const char *name, long l, const char *rest)
{
    const ppn_model_config *g = &c->cfg;
    if (l >= g->n_layers)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is in layer %ld, but %s/config.json has num_hidden_layers = %d "
                       "(layers 0-%d): ppn refuses to drop the checkpoint's layers past it", file, name, l, c->path,
                       g->n_layers, g->n_layers - 1);
    const ppn_hf_slot *s = slot_find(rest);
    if (s && s->when == PPN_HF_IF_QKV_BIAS)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is a q/k/v bias, but %s/config.json says the model has none "
                       "(architectures: %s; attention_bias absent or false): ppn refuses to drop it (a Qwen2 "
                       "checkpoint must say Qwen2ForCausalLM)", file, name, c->path, g->arch_name);
    if (s && s->when == PPN_HF_IF_QK_NORM)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is a q/k norm, but %s/config.json's architectures says %s, "
                       "which has none (Qwen3ForCausalLM has them): ppn refuses to drop it", file, name, c->path,
                       g->arch_name);
    return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is not a tensor of a %s layer: ppn does not know it and refuses "
                   "to drop it", file, name, g->arch_name);
}

/* PPN_OK when bind_globals / bind_layer bound name (or it is the harmless rotary table); else why not. */
static ppn_status check_used(const ppn_ckpt *c, const char *file, const char *name)
{
    static const char *const globals[] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                                          "model.rotary_emb.inv_freq"};
    long l;
    const char *rest;
    for (size_t i = 0; i < PPN_ARRAY_LEN(globals); i++)
        if (strcmp(name, globals[i]) == 0) return PPN_OK;   /* lm_head: bound whenever present */
    if (!layer_name(name, &l, &rest))
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is not used by %s/config.json (%s): ppn does not know it and "
                       "refuses to drop it", file, name, c->path, c->cfg.arch_name);
    if (strcmp(rest, "self_attn.rotary_emb.inv_freq") == 0) return PPN_OK;
    const ppn_hf_slot *s = slot_find(rest);
    if (l < c->cfg.n_layers && s && ppn_hf_slot_present(&c->cfg, s)) return PPN_OK;
    return layer_unused(c, file, name, l, rest);
}

/* Every tensor of every file (an index's shards: their whole contents, as transformers loads them). */
static ppn_status check_all_used(const ppn_ckpt *c)
{
    const ppn_st_set *st = ((const ppn_ckpt_priv *)c->priv)->st;
    for (size_t f = 0; f < st->n_files; f++)
        for (size_t i = 0; i < st->files[f]->n_tensors; i++)
            PPN_CHECK(check_used(c, st->files[f]->path, st->files[f]->tensors[i].name));
    return PPN_OK;
}

static ppn_status hf_open(ppn_ckpt *c)
{
    char cfg_path[1100];
    char *text;
    size_t len;
    ppn_ckpt_priv *p = c->priv;
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", c->path);
    PPN_CHECK(ppn_read_text(cfg_path, PPN_MAX_CONFIG, &text, &len));
    ppn_status st = ppn_config_parse(text, len, cfg_path, &c->cfg);
    free(text);
    PPN_CHECK(st);
    PPN_CHECK(ppn_st_set_open(c->path, &p->st));
    PPN_CHECK(ppn_ckpt_alloc_layers(c));
    PPN_CHECK(bind_globals(c));
    for (int l = 0; l < c->cfg.n_layers; l++) PPN_CHECK(bind_layer(c, l));
    return check_all_used(c);
}

/* A regular file is a llama2.c .bin; HF files are refused by name so the error says what to pass. */
static ppn_status file_open(ppn_ckpt *c)
{
    size_t n = strlen(c->path);
    static const char *const hf_ext[] = {".safetensors", ".json"};
    for (size_t i = 0; i < PPN_ARRAY_LEN(hf_ext); i++) {
        size_t e = strlen(hf_ext[i]);
        if (n >= e && strcmp(c->path + n - e, hf_ext[i]) == 0)
            return ppn_err(PPN_EUNSUPPORTED, "%s: pass the checkpoint directory, not one of its files", c->path);
    }
    return ppn_llama2c_open(c);
}

ppn_status ppn_ckpt_open(const char *path, ppn_ckpt **out)
{
    ppn_status st;
    struct stat sb;
    PPN_ASSERT(path && out);
    *out = NULL;
    if (stat(path, &sb) != 0) return ppn_err(PPN_EIO, "%s: %s", path, strerror(errno));
    ppn_ckpt *c = calloc(1, sizeof *c);
    if (!c) return ppn_err(PPN_ENOMEM, "%s: out of memory", path);
    c->priv = calloc(1, sizeof(ppn_ckpt_priv));
    if (!c->priv) {
        st = ppn_err(PPN_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    if (strlen(path) >= sizeof c->path) {
        st = ppn_err(PPN_EIO, "%s: path too long", path);
        goto fail;
    }
    strcpy(c->path, path);
    if (S_ISDIR(sb.st_mode)) st = hf_open(c);
    else if (S_ISREG(sb.st_mode)) st = file_open(c);
    else st = ppn_err(PPN_EIO, "%s: is %s: neither a checkpoint directory nor a regular file", path,
                      S_ISFIFO(sb.st_mode) ? "a FIFO" : S_ISSOCK(sb.st_mode) ? "a socket" : "a device or special file");
    if (st != PPN_OK) goto fail;
    *out = c;
    return PPN_OK;
fail:
    ppn_ckpt_close(c);
    return st;
}

void ppn_ckpt_close(ppn_ckpt *c)
{
    if (!c) return;
    ppn_ckpt_priv *p = c->priv;
    if (p) {
        ppn_st_set_close(p->st);
        ppn_unmap(p->bin, p->bin_len);
        for (size_t i = 0; i < p->n_owned; i++) free(p->owned[i]);
        free(p->owned);
        free(p);
    }
    free(c->layers);
    free(c);
}
