/* ckpt.h - checkpoints on the host: model config + host views of every tensor (mmapped, source dtype).
 *
 * ppn_ckpt_open() accepts an HF checkpoint directory (config.json + model.safetensors, or a sharded set with
 * model.safetensors.index.json) or a llama2.c legacy .bin file. Every checkpoint is untrusted input: offsets,
 * shapes and sizes are validated against the mapping before any tensor view is handed out.
 */
#ifndef PPN_CKPT_H
#define PPN_CKPT_H

#include <stddef.h>
#include <stdint.h>
#include "ppn.h"

enum { PPN_ARCH_LLAMA = 1, PPN_ARCH_MISTRAL, PPN_ARCH_QWEN2, PPN_ARCH_QWEN3, PPN_ARCH_LLAMA2C };
enum { PPN_ROPE_DEFAULT = 0, PPN_ROPE_LLAMA3 = 1 };

typedef struct ppn_model_config {
    int arch;
    char arch_name[64];       /* as written in the checkpoint, e.g. "LlamaForCausalLM" */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_pos;
    float norm_eps;
    double rope_theta;
    int rope_type;            /* PPN_ROPE_* */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_orig_max_pos;    /* llama3 original_max_position_embeddings */
    int rope_interleaved;     /* 1: llama2.c adjacent-pair rotary (handled by the rope kernel) */
    int qkv_bias;             /* Qwen2 */
    int qk_norm;              /* Qwen3 */
    int tied_embeddings;
    int bos_id, eos_id;       /* -1 if absent */
} ppn_model_config;

/* A host view of one tensor inside a mapping (or an owned buffer). Never written through. */
typedef struct ppn_tensor {
    const void *data;         /* NULL = absent (optional tensors: biases, q/k norms) */
    size_t nbytes;
    int dtype;                /* PPN_DTYPE_* of the source */
    int ndim;
    int64_t shape[4];
} ppn_tensor;

typedef struct ppn_layer_tensors {
    ppn_tensor attn_norm, wq, wk, wv, wo;
    ppn_tensor bq, bk, bv;    /* Qwen2 only */
    ppn_tensor q_norm, k_norm;/* Qwen3 only, [head_dim] */
    ppn_tensor ffn_norm, w_gate, w_up, w_down;
} ppn_layer_tensors;

typedef struct ppn_ckpt {
    ppn_model_config cfg;
    char path[1024];
    ppn_tensor embed;         /* [vocab, dim] */
    ppn_tensor final_norm;    /* [dim] */
    ppn_tensor lm_head;       /* [vocab, dim]; same view as embed when tied */
    ppn_layer_tensors *layers;/* [n_layers] */
    void *priv;               /* loader-owned state (mappings) */
} ppn_ckpt;

/* Open a checkpoint (directory or llama2.c .bin). Returns PPN_OK; PPN_EIO (cannot open/map, naming the
 * file); PPN_EFORMAT (malformed: message names the file and tensor or field); PPN_EUNSUPPORTED (architecture
 * or feature ppn does not handle, named); PPN_ENOMEM. On failure nothing is leaked and *out is NULL. */
ppn_status ppn_ckpt_open(const char *path, ppn_ckpt **out);
void ppn_ckpt_close(ppn_ckpt *c);

/* Parse an HF config.json text (both transformers 4.x and 5.x spellings) into cfg. where names the file
 * for messages. Returns PPN_OK, PPN_EFORMAT, PPN_EUNSUPPORTED. */
ppn_status ppn_config_parse(const char *json_text, size_t len, const char *where, ppn_model_config *cfg);

/* Write a random-weight checkpoint in HF layout (config.json + model.safetensors) to dir.
 * shape: "tiny", "llama-1b", "llama-8b", "qwen2-7b", "qwen3-tiny". dtype: PPN_DTYPE_*. */
ppn_status ppn_mkmodel(const char *shape, int dtype, const char *dir, uint64_t seed);

/* ppn_mkmodel with a shard size: when the weights exceed shard_bytes (0 = 4 GiB) they are written as
 * model-0000i-of-0000n.safetensors + model.safetensors.index.json. Returns PPN_OK, PPN_EINVAL (unknown shape,
 * listing the known ones, or bad dtype), PPN_EIO (naming the file), PPN_ENOMEM. */
ppn_status ppn_mkmodel_ex(const char *shape, int dtype, const char *dir, uint64_t seed, size_t shard_bytes);

/* A tokenizer's numbers for a model made to go with it: one past its largest id, its BOS and EOS ids (-1: none). */
typedef struct ppn_mk_tok {
    int vocab, bos, eos;
} ppn_mk_tok;
/* ppn_mkmodel_ex with tok's vocabulary size (the embedding and head rows) and BOS / EOS ids in config.json in
 * place of the shape's (tok NULL: the shape's own). Returns as ppn_mkmodel_ex, and PPN_EINVAL for a vocabulary
 * outside [1, 2^24] or an id outside it. */
ppn_status ppn_mkmodel_tok(const char *shape, int dtype, const char *dir, uint64_t seed, size_t shard_bytes,
                           const ppn_mk_tok *tok);

#endif
