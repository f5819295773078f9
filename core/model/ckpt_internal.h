/* ckpt_internal.h - shared between the checkpoint loaders (ckpt.c, safetensors.c, llama2c.c) and the
 * random-checkpoint writer (mkmodel.c): the HF tensor layout table, file mapping, loader-private state. */
#ifndef PPN_CKPT_INTERNAL_H
#define PPN_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "core/model/ckpt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ppn's checkpoint loaders read little-endian files in place and assume a little-endian host"
#endif

struct ppn_st_set;

/* Loader-owned state behind ppn_ckpt.priv. Written only while the checkpoint is being opened; read-only
 * afterwards (a published ppn_ckpt is immutable until ppn_ckpt_close). */
typedef struct ppn_ckpt_priv {
    struct ppn_st_set *st;    /* HF checkpoints: the mapped safetensors file(s) */
    const uint8_t *bin;       /* llama2.c: the mapped .bin file */
    size_t bin_len;
    void **owned;             /* aligned copies of tensors the file stores misaligned */
    size_t n_owned;
} ppn_ckpt_priv;

/* What shape an expected HF tensor has, in terms of the config. */
typedef enum ppn_hf_shape {
    PPN_HF_DIM,        /* [dim]                     layer norms, final norm */
    PPN_HF_HEAD,       /* [head_dim]                Qwen3 q/k norm */
    PPN_HF_Q_W,        /* [n_heads*hd, dim] */
    PPN_HF_KV_W,       /* [n_kv*hd, dim] */
    PPN_HF_O_W,        /* [dim, n_heads*hd] */
    PPN_HF_Q_B,        /* [n_heads*hd] */
    PPN_HF_KV_B,       /* [n_kv*hd] */
    PPN_HF_FFN_IN,     /* [ffn, dim]                gate, up */
    PPN_HF_FFN_OUT,    /* [dim, ffn]                down */
    PPN_HF_VOCAB,      /* [vocab, dim]              embed, lm_head */
} ppn_hf_shape;

enum { PPN_HF_ALWAYS = 0, PPN_HF_IF_QKV_BIAS, PPN_HF_IF_QK_NORM };

/* One tensor of a decoder layer: "model.layers.N." + suffix, bound at offset in ppn_layer_tensors. */
typedef struct ppn_hf_slot {
    const char *suffix;
    size_t offset;
    ppn_hf_shape shape;
    int when;          /* PPN_HF_ALWAYS / _IF_QKV_BIAS / _IF_QK_NORM */
} ppn_hf_slot;

/* layout.c */
extern const ppn_hf_slot ppn_hf_layer_slots[];
extern const size_t ppn_hf_n_layer_slots;

/* Fill dims for a shape kind under cfg; returns the number of dims (1 or 2). */
int ppn_hf_shape_dims(const ppn_model_config *cfg, ppn_hf_shape shape, int64_t dims[2]);
/* Whether a slot exists under cfg (biases only with qkv_bias, q/k norms only with qk_norm). */
int ppn_hf_slot_present(const ppn_model_config *cfg, const ppn_hf_slot *slot);

/* safetensors.c: file access shared by the loaders */
/* Map a whole file read-only (PROT_READ, MAP_PRIVATE). An empty file gives base NULL, len 0. Anything but a
 * regular file (a FIFO, a device, a directory) is refused without blocking: it is opened O_NONBLOCK and
 * checked with fstat before a byte is read.
 * Returns PPN_OK, PPN_EIO (naming the file and the failing call, or what the file is: "is a FIFO, not a
 * regular file"). */
ppn_status ppn_map_readonly(const char *path, const uint8_t **base, size_t *len);
void ppn_unmap(const uint8_t *base, size_t len);

/* Read a whole small text file (config.json, the shard index) into a NUL-terminated malloc'd buffer;
 * files over max_len are refused, and non-regular files as ppn_map_readonly refuses them.
 * Returns PPN_OK, PPN_EIO, PPN_EFORMAT (too large), PPN_ENOMEM. */
ppn_status ppn_read_text(const char *path, size_t max_len, char **text, size_t *len);

/* layout.c: allocate c->layers for c->cfg.n_layers. Returns PPN_OK, PPN_ENOMEM. */
ppn_status ppn_ckpt_alloc_layers(ppn_ckpt *c);

/* llama2c.c */
/* Open a llama2.c legacy .bin into c (c->path set, c->priv allocated). Returns PPN_OK, PPN_EIO,
 * PPN_EFORMAT, PPN_EUNSUPPORTED, PPN_ENOMEM; on failure the caller closes c. */
ppn_status ppn_llama2c_open(ppn_ckpt *c);

#endif
