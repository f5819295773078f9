/* forward.c - one decode step through the stages: embed, the layers of each stage, final norm + lm head.
 * Every kernel reads the position from the step header in device memory (ppn_step_hdr), so the position is
 * ordered by the same stream/event chain as the data. */
#include <math.h>
#include "rt.h"
#include "err.h"
#include "../kernels/ops.h"

/* One transformer layer on stage st: x += attn(norm(x)); x += mlp(norm(x)). */
static ppn_status layer_step(ppn_seq *s, ppn_stage *st, ppn_stage_scratch *r, int l)
{
    ppn_model *m = s->m;
    const ppn_model_config *c = &m->cfg;
    const ppn_dev_layer *w = &m->layers[l];
    ppn_gpu *g = m->rt->g;
    ppn_gstream *q = st->stream;
    int wdt = m->wdt, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    PPN_CHECK(ppn_op_rmsnorm(g, q, r->xb, r->x, w->attn_norm, wdt, dim, c->norm_eps));
    PPN_CHECK(ppn_op_matvec(g, q, r->q, w->wq, wdt, r->xb, nh * hd, dim, w->bq, 0));
    PPN_CHECK(ppn_op_matvec(g, q, r->k, w->wk, wdt, r->xb, nkv * hd, dim, w->bk, 0));
    PPN_CHECK(ppn_op_matvec(g, q, r->v, w->wv, wdt, r->xb, nkv * hd, dim, w->bv, 0));
    if (c->qk_norm) {
        PPN_CHECK(ppn_op_head_rmsnorm(g, q, r->q, nh, hd, w->q_norm, wdt, c->norm_eps));
        PPN_CHECK(ppn_op_head_rmsnorm(g, q, r->k, nkv, hd, w->k_norm, wdt, c->norm_eps));
    }
    PPN_CHECK(ppn_op_rope(g, q, r->q, nh, hd, st->inv_freq, c->rope_interleaved, r->hdr));
    PPN_CHECK(ppn_op_rope(g, q, r->k, nkv, hd, st->inv_freq, c->rope_interleaved, r->hdr));
    PPN_CHECK(ppn_op_kv_store(g, q, s->kc[l], s->vc[l], r->k, r->v, nkv, hd, m->ctx, r->hdr));
    PPN_CHECK(ppn_op_attn(g, q, r->att, r->q, s->kc[l], s->vc[l], nh, nkv, hd, m->ctx, 1.0f / sqrtf((float)hd),
                          r->hdr));
    PPN_CHECK(ppn_op_matvec(g, q, r->x, w->wo, wdt, r->att, dim, nh * hd, 0, r->x));
    PPN_CHECK(ppn_op_rmsnorm(g, q, r->xb, r->x, w->ffn_norm, wdt, dim, c->norm_eps));
    PPN_CHECK(ppn_op_matvec(g, q, r->hb, w->w_gate, wdt, r->xb, c->ffn_dim, dim, 0, 0));
    PPN_CHECK(ppn_op_matvec(g, q, r->hb2, w->w_up, wdt, r->xb, c->ffn_dim, dim, 0, 0));
    PPN_CHECK(ppn_op_swiglu(g, q, r->hb, r->hb, r->hb2, c->ffn_dim));
    PPN_CHECK(ppn_op_matvec(g, q, r->x, w->w_down, wdt, r->hb, dim, c->ffn_dim, 0, r->x));
    return PPN_OK;
}

static ppn_status head_step(ppn_seq *s, ppn_stage *st, ppn_stage_scratch *r)
{
    ppn_model *m = s->m;
    ppn_gpu *g = m->rt->g;
    const ppn_model_config *c = &m->cfg;
    PPN_CHECK(ppn_op_rmsnorm(g, st->stream, r->xb, r->x, m->final_norm, m->wdt, c->dim, c->norm_eps));
    return ppn_op_matvec(g, st->stream, r->logits, m->lm_head, m->wdt, r->xb, c->vocab, c->dim, 0, 0);
}

ppn_status ppn_forward_step(ppn_seq *s)
{
    ppn_model *m = s->m;
    ppn_stage *st = &m->stages[0];
    ppn_stage_scratch *r = &s->scr[0];
    PPN_CHECK(ppn_op_embed(m->rt->g, st->stream, r->x, m->embed, m->wdt, m->cfg.vocab, m->cfg.dim, r->hdr));
    for (int l = st->l0; l < st->l1; l++) PPN_CHECK(layer_step(s, st, r, l));
    return head_step(s, st, r);
}
