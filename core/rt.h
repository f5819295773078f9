/* rt.h - internal runtime objects: the runtime (backend + per-device pools), the device-resident model
 * split into stages, and sequences (KV cache + per-stage scratch).
 *
 * Ownership: a stage owns its stream and allocates from its device's pool; weights of layers [l0, l1) live on
 * the stage's device; the KV cache of a layer is allocated by the stage owning the layer. Today a model has
 * one stage; the pipeline runtime (N stages) builds on the same objects.
 */
#ifndef PPN_RT_H
#define PPN_RT_H

#include "ppn.h"
#include "gpu.h"
#include "ckpt.h"
#include "../alloc/pool.h"
#include "../alloc/host.h"

#define PPN_MAX_DEVICES 64

struct ppn_rt {
    ppn_gpu *g;
    int n_dev;
    ppn_pool *pool[PPN_MAX_DEVICES];     /* created on first use of a device */
    ppn_pinned_arena *pinned;
};

/* The pool of device dev, created on first use. Returns PPN_OK, PPN_EINVAL, PPN_ENOMEM. */
ppn_status ppn_rt_pool(ppn_rt *rt, int dev, ppn_pool **out);

typedef struct ppn_dev_layer {
    ppn_dptr attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, ffn_norm, w_gate, w_up, w_down;
} ppn_dev_layer;

typedef struct ppn_stage {
    int dev;
    int l0, l1;                /* layers [l0, l1) */
    ppn_gstream *stream;       /* the stage's compute stream */
    ppn_pool *pool;
    ppn_dptr inv_freq;         /* rope table, f32 [head_dim/2], on this stage's device */
} ppn_stage;

struct ppn_model {
    ppn_rt *rt;
    ppn_model_config cfg;
    int wdt;                   /* weight storage dtype */
    int ctx;
    size_t weight_bytes;
    int n_stages;
    ppn_stage stages[1];
    ppn_dptr embed, final_norm, lm_head; /* embed on the first stage's device; head on the last stage's */
    ppn_dev_layer *layers;
    struct ppn_weight_block { ppn_dptr ptr; int stage; } *weight_blocks; /* every weight block, for free */
    int n_weight_blocks, cap_weight_blocks;
};

/* Scratch of one stage for one sequence. */
typedef struct ppn_stage_scratch {
    ppn_dptr hdr;              /* ppn_step_hdr */
    ppn_dptr x, xb, q, k, v, att, hb, hb2;
    ppn_dptr logits;           /* last stage only */
} ppn_stage_scratch;

struct ppn_seq {
    ppn_model *m;
    int pos;
    ppn_dptr *kc, *vc;         /* per layer, on the owning stage's device */
    ppn_stage_scratch scr[1];
    ppn_step_hdr *hdr_h;       /* pinned */
    float *logits_h;           /* pinned, vocab floats */
};

/* One forward step of seq through every stage for token at seq->pos (header already written on the device).
 * Enqueues only; the caller synchronizes. */
ppn_status ppn_forward_step(ppn_seq *s);

#endif
