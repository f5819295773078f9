/* forward.c - the pieces of one decode step: embed, one transformer layer, final norm + lm head.
 * io is [ppn_step_hdr (PPN_IO_HDR_BYTES)][x: dim floats]; every kernel reads the position and token from the
 * header in device memory, so they are ordered by the same stream/event chain as the hidden state. */
#include <math.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

static ppn_dptr io_x(ppn_dptr io) { return io + PPN_IO_HDR_BYTES; }

ppn_status ppn_fwd_embed(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io)
{
    return ppn_op_embed(m->rt->g, s, io_x(io), m->embed, m->wdt, m->cfg.vocab, m->cfg.dim, io);
}

/* out = W rmsnorm(x): the norm fused into the matvec's input when it fits, else its own launch into xb. */
static ppn_status norm_matvec(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr out, ppn_dptr w,
                              int rows, ppn_dptr x, ppn_dptr nw, ppn_dptr bias)
{
    ppn_gpu *g = m->rt->g;
    const ppn_model_config *c = &m->cfg;
    if (m->map->door.fuse && ppn_op_matvec_fusable(c->dim)) {
        ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = x, .nw = nw, .eps = c->norm_eps};
        return ppn_op_matvec_in(g, s, out, w, m->wdt, in, rows, c->dim, bias, 0);
    }
    PPN_CHECK(ppn_op_rmsnorm(g, s, r->xb, x, nw, m->wdt, c->dim, c->norm_eps));
    return ppn_op_matvec(g, s, out, w, m->wdt, r->xb, rows, c->dim, bias, 0);
}

/* x += attn(norm(x)); x += mlp(norm(x)) for layer l, on a stage whose stream is on device dev: 6 launches
 * (norm+qkv, rope+kv store+attention, o+residual, norm+gate|up, SwiGLU, down+residual), 2 more with q/k
 * norms; PPN_FUSE=0 gives the norms and the rotary their own launches again (9: rmsnorm, qkv, rope+kv store,
 * attention, o, rmsnorm, gate|up, SwiGLU, down). */
ppn_status ppn_fwd_layer(ppn_seq *q, ppn_gstream *s, int dev, ppn_stage_scratch *r, ppn_dptr io, int l)
{
    ppn_model *m = q->m;
    const ppn_model_config *c = &m->cfg;
    const ppn_dev_layer *w = &m->layers[l];
    ppn_gpu *g = m->rt->g;
    ppn_dptr x = io_x(io), hdr = io;
    int wdt = m->wdt, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim;
    /* q, k, v from one matvec over the stacked [wq; wk; wv]: every row is reduced exactly as on its own */
    ppn_dptr qv = r->qkv, kv = qv + sizeof(float) * (size_t)(nh * hd), vv = kv + sizeof(float) * (size_t)(nkv * hd);
    ppn_dptr gate = r->gu, up = gate + sizeof(float) * (size_t)ffn;
    PPN_CHECK(norm_matvec(m, s, r, qv, w->wqkv, (nh + 2 * nkv) * hd, x, w->attn_norm, w->bqkv));
    if (c->qk_norm) {
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, qv, nh, hd, w->q_norm, wdt, c->norm_eps));
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, kv, nkv, hd, w->k_norm, wdt, c->norm_eps));
    }
    float scale = 1.0f / sqrtf((float)hd);
    if (m->map->door.fuse && ppn_op_attn_rope_fits(hd, c->rope_interleaved)) { /* the rotary and the k/v store inside */
        PPN_CHECK(ppn_op_attn_rope(g, s, r->att, qv, q->kc[l], q->vc[l], nh, nkv, hd, m->ctx, scale, hdr, r->attp,
                                   m->attn_split, m->inv_freq[dev], c->rope_interleaved, m->kvdt));
    } else { /* q and k are adjacent heads at one position: one rotary launch covers both, and stores k and v */
        PPN_CHECK(ppn_op_rope_kv(g, s, qv, nh, nkv, hd, m->inv_freq[dev], c->rope_interleaved, hdr, q->kc[l],
                                 q->vc[l], vv, m->ctx, m->kvdt));
        PPN_CHECK(ppn_op_attn(g, s, r->att, qv, q->kc[l], q->vc[l], nh, nkv, hd, m->ctx, scale, hdr, r->attp,
                              m->attn_split, m->kvdt));
    }
    PPN_CHECK(ppn_op_matvec(g, s, x, w->wo, wdt, r->att, dim, nh * hd, 0, x));
    PPN_CHECK(norm_matvec(m, s, r, gate, w->wgu, 2 * ffn, x, w->ffn_norm, 0));
    /* SwiGLU keeps its own launch: computed in down's input it cost more than the launch (PERF.md: every block
     * re-reads all of gate and up) */
    PPN_CHECK(ppn_op_swiglu(g, s, gate, gate, up, ffn));
    return ppn_op_matvec(g, s, x, w->w_down, wdt, gate, dim, ffn, 0, x);
}

ppn_status ppn_fwd_head(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io, ppn_dptr logits)
{
    return norm_matvec(m, s, r, logits, m->lm_head, m->cfg.vocab, io_x(io), m->final_norm, 0);
}
