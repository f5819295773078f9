/* fuzz_ckpt.c - a whole Hugging Face checkpoint directory through ppn_ckpt_open: the input is config.json, a NUL
 * byte, then model.safetensors (no NUL: config.json alone, and the open fails on the missing weights). This
 * reaches what neither file's own parser sees: binding each expected tensor by name, dtype and shape, and
 * refusing the tensors the config does not use. Every bound view must lie inside the file. */
#include "core/model/ckpt.h"
#include "fuzz_util.h"

static void check_view(const ppn_tensor *t)
{
    if (!t->data) return;
    size_t el = t->dtype == PPN_DTYPE_F32 ? 4 : 2, count = 1;
    for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
    if (t->ndim < 1 || t->ndim > 2 || count * el != t->nbytes || (uintptr_t)t->data % el) abort();
    volatile uint8_t sink = 0;   /* ASan sees a view past the mapping or a freed copy */
    if (t->nbytes) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    (void)sink;
}

static void check(const ppn_ckpt *c)
{
    check_view(&c->embed);
    check_view(&c->final_norm);
    check_view(&c->lm_head);
    if (!c->embed.data || !c->final_norm.data || !c->lm_head.data) abort();
    for (int l = 0; l < c->cfg.n_layers; l++) {
        const ppn_layer_tensors *L = &c->layers[l];
        const ppn_tensor *all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->bq, &L->bk, &L->bv,
                                   &L->q_norm, &L->k_norm, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) check_view(all[i]);
        if (!L->wq.data || !L->w_down.data) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *weights;
    size_t cfg_len, weights_len;
    fz_split(data, size, &weights, &cfg_len, &weights_len);
    fz_put("config.json", data, cfg_len);
    fz_put("model.safetensors", weights, weights_len);
    ppn_ckpt *c = NULL;
    if (ppn_ckpt_open(fz_dir(), &c) == PPN_OK) {
        check(c);
        ppn_ckpt_close(c);
    }
    return 0;
}
