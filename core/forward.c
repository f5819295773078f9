/* forward.c - the pieces of one decode step: embed, one transformer layer, final norm + lm head.
 * io is [ppn_step_hdr (PPN_IO_HDR_BYTES)][x: dim floats]; every kernel reads the position and token from the
 * header in device memory, so they are ordered by the same stream/event chain as the hidden state. */
#include <math.h>
#include "rt.h"
#include "err.h"
#include "../kernels/ops.h"

static ppn_dptr io_x(ppn_dptr io) { return io + PPN_IO_HDR_BYTES; }

ppn_status ppn_fwd_embed(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io)
{
    return ppn_op_embed(m->rt->g, s, io_x(io), m->embed, m->wdt, m->cfg.vocab, m->cfg.dim, io);
}

/* x += attn(norm(x)); x += mlp(norm(x)) for layer l, on a stage whose stream is on device dev. */
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
    PPN_CHECK(ppn_op_rmsnorm(g, s, r->xb, x, w->attn_norm, wdt, dim, c->norm_eps));
    PPN_CHECK(ppn_op_matvec(g, s, qv, w->wqkv, wdt, r->xb, (nh + 2 * nkv) * hd, dim, w->bqkv, 0));
    if (c->qk_norm) {
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, qv, nh, hd, w->q_norm, wdt, c->norm_eps));
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, kv, nkv, hd, w->k_norm, wdt, c->norm_eps));
    }
    /* q and k are adjacent heads at one position: one rotary launch covers both */
    PPN_CHECK(ppn_op_rope(g, s, qv, nh + nkv, hd, m->inv_freq[dev], c->rope_interleaved, hdr));
    PPN_CHECK(ppn_op_kv_store(g, s, q->kc[l], q->vc[l], kv, vv, nkv, hd, m->ctx, hdr));
    PPN_CHECK(ppn_op_attn(g, s, r->att, qv, q->kc[l], q->vc[l], nh, nkv, hd, m->ctx, 1.0f / sqrtf((float)hd), hdr,
                          r->attp, m->attn_split));
    PPN_CHECK(ppn_op_matvec(g, s, x, w->wo, wdt, r->att, dim, nh * hd, 0, x));
    PPN_CHECK(ppn_op_rmsnorm(g, s, r->xb, x, w->ffn_norm, wdt, dim, c->norm_eps));
    PPN_CHECK(ppn_op_matvec(g, s, gate, w->wgu, wdt, r->xb, 2 * ffn, dim, 0, 0));
    PPN_CHECK(ppn_op_swiglu(g, s, gate, gate, up, ffn));
    PPN_CHECK(ppn_op_matvec(g, s, x, w->w_down, wdt, gate, dim, ffn, 0, x));
    return PPN_OK;
}

ppn_status ppn_fwd_head(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io, ppn_dptr logits)
{
    ppn_gpu *g = m->rt->g;
    const ppn_model_config *c = &m->cfg;
    PPN_CHECK(ppn_op_rmsnorm(g, s, r->xb, io_x(io), m->final_norm, m->wdt, c->dim, c->norm_eps));
    return ppn_op_matvec(g, s, logits, m->lm_head, m->wdt, r->xb, c->vocab, c->dim, 0, 0);
}
