/* seq.c - sequences: KV cache per layer on the owning stage's device, per-stage scratch, the decode step. */
#include <string.h>
#include "rt.h"
#include "err.h"

static ppn_status scratch_alloc(ppn_stage *st, size_t n, const char *tag, ppn_dptr *out)
{
    return ppn_pool_alloc(st->pool, n, st->stream, tag, out);
}

static ppn_status scratch_create(ppn_model *m, ppn_stage *st, ppn_stage_scratch *r, int last)
{
    const ppn_model_config *c = &m->cfg;
    size_t f = sizeof(float);
    PPN_CHECK(scratch_alloc(st, sizeof(ppn_step_hdr), "step header", &r->hdr));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->dim, "x", &r->x));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->dim, "xb", &r->xb));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->n_heads * (size_t)c->head_dim, "q", &r->q));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->n_kv_heads * (size_t)c->head_dim, "k", &r->k));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->n_kv_heads * (size_t)c->head_dim, "v", &r->v));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->n_heads * (size_t)c->head_dim, "att", &r->att));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->ffn_dim, "hb", &r->hb));
    PPN_CHECK(scratch_alloc(st, f * (size_t)c->ffn_dim, "hb2", &r->hb2));
    if (last) PPN_CHECK(scratch_alloc(st, f * (size_t)c->vocab, "logits", &r->logits));
    return PPN_OK;
}

static void scratch_free(ppn_stage *st, ppn_stage_scratch *r)
{
    ppn_dptr *all[] = {&r->hdr, &r->x, &r->xb, &r->q, &r->k, &r->v, &r->att, &r->hb, &r->hb2, &r->logits};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (*all[i]) ppn_pool_free(st->pool, *all[i], st->stream);
}

static ppn_stage *stage_of_layer(ppn_model *m, int l)
{
    for (int i = 0; i < m->n_stages; i++)
        if (l >= m->stages[i].l0 && l < m->stages[i].l1) return &m->stages[i];
    PPN_ASSERT(!"layer outside every stage");
    return NULL;
}

ppn_status ppn_seq_create(ppn_model *m, ppn_seq **out)
{
    *out = NULL;
    ppn_seq *s = ppn_hcalloc(1, sizeof *s);
    if (!s) return ppn_err(PPN_ENOMEM, "sequence: host out of memory");
    s->m = m;
    const ppn_model_config *c = &m->cfg;
    ppn_status st;
    s->kc = ppn_hcalloc((size_t)c->n_layers, sizeof *s->kc);
    s->vc = ppn_hcalloc((size_t)c->n_layers, sizeof *s->vc);
    if (!s->kc || !s->vc) {
        st = ppn_err(PPN_ENOMEM, "sequence: host out of memory");
        goto fail;
    }
    size_t kv = (size_t)m->ctx * (size_t)c->n_kv_heads * (size_t)c->head_dim * sizeof(float);
    for (int l = 0; l < c->n_layers; l++) {
        ppn_stage *owner = stage_of_layer(m, l);
        PPN_CHECK_GOTO(scratch_alloc(owner, kv, "k cache", &s->kc[l]), st, fail);
        PPN_CHECK_GOTO(scratch_alloc(owner, kv, "v cache", &s->vc[l]), st, fail);
    }
    for (int i = 0; i < m->n_stages; i++)
        PPN_CHECK_GOTO(scratch_create(m, &m->stages[i], &s->scr[i], i == m->n_stages - 1), st, fail);
    PPN_CHECK_GOTO(ppn_pinned_alloc(m->rt->pinned, sizeof *s->hdr_h, (void **)&s->hdr_h), st, fail);
    PPN_CHECK_GOTO(ppn_pinned_alloc(m->rt->pinned, sizeof(float) * (size_t)c->vocab, (void **)&s->logits_h), st,
                   fail);
    *out = s;
    return PPN_OK;
fail:
    ppn_seq_destroy(s);
    return st;
}

void ppn_seq_destroy(ppn_seq *s)
{
    if (!s) return;
    ppn_model *m = s->m;
    ppn_gpu *g = m->rt->g;
    for (int i = 0; i < m->n_stages; i++) g->ops->stream_sync(g, m->stages[i].stream);
    for (int l = 0; l < m->cfg.n_layers && s->kc; l++) {
        ppn_stage *owner = stage_of_layer(m, l);
        if (s->kc[l]) ppn_pool_free(owner->pool, s->kc[l], owner->stream);
        if (s->vc && s->vc[l]) ppn_pool_free(owner->pool, s->vc[l], owner->stream);
    }
    for (int i = 0; i < m->n_stages; i++) scratch_free(&m->stages[i], &s->scr[i]);
    ppn_pinned_free(m->rt->pinned, s->hdr_h);
    ppn_pinned_free(m->rt->pinned, s->logits_h);
    ppn_hfree(s->kc);
    ppn_hfree(s->vc);
    ppn_hfree(s);
}

void ppn_seq_reset(ppn_seq *s) { s->pos = 0; }

int ppn_seq_pos(const ppn_seq *s) { return s->pos; }

ppn_status ppn_decode_step(ppn_seq *s, int token, float *logits)
{
    ppn_model *m = s->m;
    ppn_gpu *g = m->rt->g;
    if (token < 0 || token >= m->cfg.vocab)
        return ppn_err(PPN_EINVAL, "token %d is outside the vocabulary [0, %d)", token, m->cfg.vocab);
    if (s->pos >= m->ctx)
        return ppn_err(PPN_ESTATE, "sequence is full: %d positions (ctx)", m->ctx);
    ppn_stage *first = &m->stages[0], *last = &m->stages[m->n_stages - 1];
    *s->hdr_h = (ppn_step_hdr){.pos = s->pos, .token = token, .seq = 0, .step = s->pos};
    PPN_CHECK(g->ops->copy_htod(g, first->stream, s->scr[0].hdr, s->hdr_h, sizeof *s->hdr_h));
    ppn_trace("step pos %d token %d: enqueue", s->pos, token);
    PPN_CHECK(ppn_forward_step(s));
    if (logits)
        PPN_CHECK(g->ops->copy_dtoh(g, last->stream, s->logits_h, s->scr[m->n_stages - 1].logits,
                                    sizeof(float) * (size_t)m->cfg.vocab));
    PPN_CHECK(g->ops->stream_sync(g, last->stream)); /* the pinned header is reused next step */
    ppn_trace("step pos %d done", s->pos);
    if (logits) memcpy(logits, s->logits_h, sizeof(float) * (size_t)m->cfg.vocab);
    s->pos++;
    return PPN_OK;
}
