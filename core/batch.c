/* batch.c - several sequences in one call: today a whole-trunk walk per sequence on stage 0's stream (no
 * stage split yet), behind the fail-closed guard that refuses it when weights live on several devices. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

/* pp_sharded_cross_device: the door is open, the placement spans 2+ devices and the sharded loader is on,
 * so some weights live away from any one stream's device. */
static int sharded_cross_device(const ppn_stage_map *map)
{
    if (map->n_stages < 2 || !map->door.shard) return 0;
    for (int s = 1; s < map->n_stages; s++)
        if (map->dev[s] != map->dev[0]) return 1;
    return 0;
}

ppn_status ppn_refuse_unsplit_if_remote(const ppn_model *m, const char *path, const char *alt)
{
    const ppn_stage_map *map = m->map;
    if (!sharded_cross_device(map) || map->door.allow_unsplit_batch) return PPN_OK;
    return ppn_err(PPN_EREFUSED, "%s has no stage split: it would walk the whole trunk on one stream and read the "
                                 "weights of the other stages' devices over the link every step; use %s "
                                 "(MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 overrides, for measurement)", path, alt);
}

/* One whole-trunk walk of q on stage 0's stream (weights read wherever they live). */
static ppn_status unsplit_walk(ppn_seq *q, int token, float *logits)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    ppn_stage_rt *s0 = &m->stages[0];
    ppn_stage_scratch *r = &q->scr[0];
    PPN_CHECK(ppn_op_set_hdr(g, s0->stream, r->io, q->pos, token, q->id, (int)m->next_step++));
    PPN_CHECK(ppn_fwd_embed(m, s0->stream, r, r->io));
    for (int l = 0; l < m->cfg.n_layers; l++) PPN_CHECK(ppn_fwd_layer(q, s0->stream, s0->dev, r, r->io, l));
    PPN_CHECK(ppn_fwd_head(m, s0->stream, r, r->io, r->ulogits));
    size_t bytes = sizeof(float) * (size_t)m->cfg.vocab;
    PPN_CHECK(g->ops->copy_dtoh(g, s0->stream, q->logits_h[0], r->ulogits, bytes));
    PPN_CHECK(g->ops->stream_sync(g, s0->stream));
    memcpy(logits, q->logits_h[0], bytes);
    q->pos++;
    return PPN_OK;
}

/* The seed's warn_unwired_once: with the door open, MEMRA_BATCH_PP=1 asks for a batched stage split that does
 * not exist yet; say once that this path walks unsplit (the guard above still refuses the cross-device case). */
static void note_unwired_batch(const ppn_stage_map *map)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (map->n_stages < 2 || !map->door.batch_pp || atomic_flag_test_and_set(&said)) return;
    fprintf(stderr, "ppn: note: ppn_decode_batch has no stage split yet: with the door open it walks the whole "
                    "trunk per sequence on stage 0's stream (MEMRA_BATCH_PP=1 is not wired)\n");
}

ppn_status ppn_decode_batch(ppn_seq **seqs, const int *tokens, int n, float *logits)
{
    if (n <= 0 || !seqs || !tokens) return ppn_err(PPN_EINVAL, "ppn_decode_batch: %d sequences", n);
    ppn_model *m = seqs[0]->m;
    PPN_CHECK(ppn_refuse_unsplit_if_remote(m, "ppn_decode_batch", "ppn_decode_step for each sequence"));
    note_unwired_batch(m->map);
    PPN_CHECK(ppn_model_drain(m));
    for (int i = 0; i < n; i++) {
        if (seqs[i]->m != m) return ppn_err(PPN_EINVAL, "ppn_decode_batch: sequences of different models");
        if (seqs[i]->issued != seqs[i]->waited)
            return ppn_err(PPN_ESTATE, "ppn_decode_batch: sequence %d has deferred steps in flight", seqs[i]->id);
        PPN_CHECK(ppn_step_checks(seqs[i], tokens[i]));
    }
    for (int i = 0; i < n; i++) /* the device queue of the last stage may still hold earlier steps */
        for (int s = 0; s < m->map->n_stages; s++) PPN_CHECK(m->rt->g->ops->stream_sync(m->rt->g, m->stages[s].stream));
    for (int i = 0; i < n; i++) PPN_CHECK(unsplit_walk(seqs[i], tokens[i], logits + (size_t)i * (size_t)m->cfg.vocab));
    return PPN_OK;
}
