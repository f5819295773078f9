/* fuzz_llama2c.c - a llama2.c legacy .bin (28-byte header of seven int32, then float32 weights, the file exactly
 * as long as the header implies) through ppn_ckpt_open. Every view handed out must lie inside the file. */
#include "core/model/ckpt.h"
#include "fuzz_util.h"

static void check_view(const ppn_tensor *t)
{
    size_t count = 1;
    for (int d = 0; d < t->ndim; d++) count *= (size_t)t->shape[d];
    if (!t->data || t->dtype != PPN_DTYPE_F32 || count * 4 != t->nbytes) abort();
    volatile uint8_t sink = 0;   /* ASan sees a view past the mapping */
    sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ppn_ckpt *c = NULL;
    if (ppn_ckpt_open(fz_memfd(data, size), &c) != PPN_OK) return 0;
    check_view(&c->embed);
    check_view(&c->final_norm);
    check_view(&c->lm_head);
    for (int l = 0; l < c->cfg.n_layers; l++) {
        const ppn_layer_tensors *L = &c->layers[l];
        const ppn_tensor *all[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->ffn_norm, &L->w_gate,
                                   &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) check_view(all[i]);
    }
    ppn_ckpt_close(c);
    return 0;
}
