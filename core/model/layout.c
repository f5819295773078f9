/* layout.c - the tensor layout every loader fills: the HF decoder layer's tensors (name suffix, field, shape
 * under the config, when present), and the per-layer array of a ppn_ckpt. The loaders (ckpt.c for HF, llama2c.c)
 * and mkmodel sit above it. */
#include <stddef.h>
#include <stdlib.h>
#include "core/base/err.h"
#include "core/model/ckpt_internal.h"

#define SLOT(sfx, field, shape, when) {sfx, offsetof(ppn_layer_tensors, field), shape, when}
const ppn_hf_slot ppn_hf_layer_slots[] = {
    SLOT("input_layernorm.weight", attn_norm, PPN_HF_DIM, PPN_HF_ALWAYS),
    SLOT("self_attn.q_proj.weight", wq, PPN_HF_Q_W, PPN_HF_ALWAYS),
    SLOT("self_attn.k_proj.weight", wk, PPN_HF_KV_W, PPN_HF_ALWAYS),
    SLOT("self_attn.v_proj.weight", wv, PPN_HF_KV_W, PPN_HF_ALWAYS),
    SLOT("self_attn.q_proj.bias", bq, PPN_HF_Q_B, PPN_HF_IF_QKV_BIAS),
    SLOT("self_attn.k_proj.bias", bk, PPN_HF_KV_B, PPN_HF_IF_QKV_BIAS),
    SLOT("self_attn.v_proj.bias", bv, PPN_HF_KV_B, PPN_HF_IF_QKV_BIAS),
    SLOT("self_attn.o_proj.weight", wo, PPN_HF_O_W, PPN_HF_ALWAYS),
    SLOT("self_attn.q_norm.weight", q_norm, PPN_HF_HEAD, PPN_HF_IF_QK_NORM),
    SLOT("self_attn.k_norm.weight", k_norm, PPN_HF_HEAD, PPN_HF_IF_QK_NORM),
    SLOT("post_attention_layernorm.weight", ffn_norm, PPN_HF_DIM, PPN_HF_ALWAYS),
    SLOT("mlp.gate_proj.weight", w_gate, PPN_HF_FFN_IN, PPN_HF_ALWAYS),
    SLOT("mlp.up_proj.weight", w_up, PPN_HF_FFN_IN, PPN_HF_ALWAYS),
    SLOT("mlp.down_proj.weight", w_down, PPN_HF_FFN_OUT, PPN_HF_ALWAYS),
};
#undef SLOT
const size_t ppn_hf_n_layer_slots = PPN_ARRAY_LEN(ppn_hf_layer_slots);

int ppn_hf_shape_dims(const ppn_model_config *cfg, ppn_hf_shape shape, int64_t dims[2])
{
    int64_t q = (int64_t)cfg->n_heads * cfg->head_dim, kv = (int64_t)cfg->n_kv_heads * cfg->head_dim;
    switch (shape) {
    case PPN_HF_DIM: dims[0] = cfg->dim; return 1;
    case PPN_HF_HEAD: dims[0] = cfg->head_dim; return 1;
    case PPN_HF_Q_B: dims[0] = q; return 1;
    case PPN_HF_KV_B: dims[0] = kv; return 1;
    case PPN_HF_Q_W: dims[0] = q; dims[1] = cfg->dim; return 2;
    case PPN_HF_KV_W: dims[0] = kv; dims[1] = cfg->dim; return 2;
    case PPN_HF_O_W: dims[0] = cfg->dim; dims[1] = q; return 2;
    case PPN_HF_FFN_IN: dims[0] = cfg->ffn_dim; dims[1] = cfg->dim; return 2;
    case PPN_HF_FFN_OUT: dims[0] = cfg->dim; dims[1] = cfg->ffn_dim; return 2;
    case PPN_HF_VOCAB: dims[0] = cfg->vocab; dims[1] = cfg->dim; return 2;
    }
    PPN_ASSERT(!"unknown ppn_hf_shape");
    return 0;
}

int ppn_hf_slot_present(const ppn_model_config *cfg, const ppn_hf_slot *slot)
{
    if (slot->when == PPN_HF_IF_QKV_BIAS) return cfg->qkv_bias;
    if (slot->when == PPN_HF_IF_QK_NORM) return cfg->qk_norm;
    return 1;
}

ppn_status ppn_ckpt_alloc_layers(ppn_ckpt *c)
{
    c->layers = calloc((size_t)c->cfg.n_layers, sizeof *c->layers);
    if (!c->layers) return ppn_err(PPN_ENOMEM, "%s: out of memory for %d layers", c->path, c->cfg.n_layers);
    return PPN_OK;
}
