/* seq.c - sequences: the KV cache of each layer on its owning stage's device, per-stage scratch, and the
 * logits ring (device buffers, done/readback events, pinned host rows) on the last stage's device. */
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

static const size_t scratch_off[] = {
    offsetof(ppn_stage_scratch, io),  offsetof(ppn_stage_scratch, xb), offsetof(ppn_stage_scratch, att),
    offsetof(ppn_stage_scratch, qkv), offsetof(ppn_stage_scratch, gu), offsetof(ppn_stage_scratch, ulogits),
    offsetof(ppn_stage_scratch, attp), offsetof(ppn_stage_scratch, tokin), offsetof(ppn_stage_scratch, kvt),
};

/* Every block is freed on its device's stream after the caller drained the stages (host-ordered). A failed free
 * does not stop the rest; the first failure is returned. */
static ppn_status scratch_free(ppn_model *m, ppn_stage_scratch *r)
{
    ppn_err_first first = {0};
    for (size_t i = 0; i < sizeof scratch_off / sizeof scratch_off[0] && r->dev >= 0; i++)
        ppn_err_first_add(&first, ppn_model_block_free(m, r->dev, (ppn_dptr *)((char *)r + scratch_off[i])));
    r->dev = -1;
    return ppn_err_first_done(&first);
}

/* Attention's scratch, zeroed once: its arrival counters must start at 0 (each launch leaves them 0). The
 * memset runs on the device stream the block was allocated on; the host sync orders it before the first
 * attention on the stage's stream (another stream; not a step path: maps and sequences change here). */
static ppn_status attn_scratch_alloc(ppn_model *m, ppn_stage_scratch *r, int dev)
{
    const ppn_model_config *c = &m->cfg;
    ppn_gpu *g = m->rt->g;
    ppn_gstream *s;
    size_t n = ppn_op_attn_scratch_bytes(c->n_heads, m->attn_split, c->head_dim);
    PPN_CHECK(ppn_model_block_alloc(m, dev, n, "attn partials", &r->attp));
    PPN_CHECK(ppn_model_dev_stream(m, dev, &s));
    PPN_CHECK(g->ops->memset_d8(g, s, r->attp, 0, n));
    return g->ops->stream_sync(g, s);
}

static ppn_status scratch_alloc(ppn_model *m, ppn_stage_scratch *r, int dev, int first)
{
    const ppn_model_config *c = &m->cfg;
    size_t f = sizeof(float), qd = f * (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kvd = f * (size_t)c->n_kv_heads * (size_t)c->head_dim;
    r->dev = dev;
    PPN_CHECK(ppn_model_block_alloc(m, dev, PPN_IO_HDR_BYTES + f * (size_t)c->dim, "io (hdr + x)", &r->io));
    PPN_CHECK(ppn_model_block_alloc(m, dev, f * (size_t)c->dim, "xb", &r->xb));
    PPN_CHECK(ppn_model_block_alloc(m, dev, qd + 2 * kvd, "qkv", &r->qkv));
    PPN_CHECK(ppn_model_block_alloc(m, dev, qd, "att", &r->att));
    PPN_CHECK(ppn_model_block_alloc(m, dev, 2 * f * (size_t)c->ffn_dim, "gate|up", &r->gu));
    if (first) PPN_CHECK(ppn_model_block_alloc(m, dev, f * (size_t)c->vocab, "unsplit logits", &r->ulogits));
    if (first) PPN_CHECK(ppn_model_block_alloc(m, dev, sizeof(int32_t), "greedy token in", &r->tokin));
    size_t tb = sizeof(int32_t) * (size_t)ppn_kv_max_blocks(m);
    PPN_CHECK(ppn_model_block_alloc(m, dev, tb, "KV block table", &r->kvt));
    r->kvt_synced = 0; /* a new home: the next walk on this stage copies the whole table */
    return attn_scratch_alloc(m, r, dev);
}

/* Like scratch_free: everything released, the first failed free returned. */
static ppn_status ring_free(ppn_seq *q)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    ppn_err_first first = {0};
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) {
        if (q->ring_dev >= 0) ppn_err_first_add(&first, ppn_model_block_free(m, q->ring_dev, &q->logits[i]));
        if (q->done_ev[i]) g->ops->event_destroy(g, q->done_ev[i]);
        if (q->rb_ev[i]) g->ops->event_destroy(g, q->rb_ev[i]);
        q->done_ev[i] = q->rb_ev[i] = NULL;
    }
    for (int i = 0; i < PPN_MAX_INFLIGHT && q->ring_dev >= 0; i++)
        ppn_err_first_add(&first, ppn_model_block_free(m, q->ring_dev, &q->tok[i]));
    if (q->ring_dev >= 0) ppn_err_first_add(&first, ppn_model_block_free(m, q->ring_dev, &q->amx));
    q->ring_dev = -1;
    return ppn_err_first_done(&first);
}

/* The greedy token of each ring entry and the split argmax's scratch, zeroed once (its counter must start at
 * 0; each launch leaves it 0); ordered before any step like attention's scratch. */
static ppn_status tok_alloc(ppn_seq *q, int dev)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    ppn_gstream *s;
    size_t n = ppn_op_argmax_scratch_bytes();
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) PPN_CHECK(ppn_model_block_alloc(m, dev, sizeof(int32_t), "greedy token", &q->tok[i]));
    PPN_CHECK(ppn_model_block_alloc(m, dev, n, "argmax scratch", &q->amx));
    PPN_CHECK(ppn_model_dev_stream(m, dev, &s));
    PPN_CHECK(g->ops->memset_d8(g, s, q->amx, 0, n));
    if (!q->tok_h) PPN_CHECK(ppn_rt_pinned_alloc(m->rt, dev, sizeof(int32_t) * PPN_MAX_INFLIGHT, (void **)&q->tok_h));
    return g->ops->stream_sync(g, s);
}

static ppn_status ring_alloc(ppn_seq *q, int dev)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    q->ring_dev = dev;
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) {
        PPN_CHECK(ppn_model_block_alloc(m, dev, sizeof(float) * (size_t)m->cfg.vocab, "logits", &q->logits[i]));
        PPN_CHECK(g->ops->event_create(g, dev, 0, &q->done_ev[i]));
        PPN_CHECK(g->ops->event_create(g, dev, 0, &q->rb_ev[i]));
        if (!q->logits_h[i])
            PPN_CHECK(ppn_rt_pinned_alloc(m->rt, dev, sizeof(float) * (size_t)m->cfg.vocab, (void **)&q->logits_h[i]));
    }
    return tok_alloc(q, dev);
}

/* Scratch on every stage's device and the ring on the last one's, as map places them. */
ppn_status ppn_seq_fit_map(ppn_seq *q, const ppn_stage_map *map)
{
    ppn_model *m = q->m;
    ppn_seq_drop_graphs(q); /* they name scratch and a map generation that are about to change */
    for (int s = 0; s < PPN_MAX_STAGES; s++) {
        ppn_stage_scratch *r = &q->scr[s];
        int want = s < map->n_stages ? map->dev[s] : -1;
        if (r->dev == want) continue;
        PPN_CHECK(scratch_free(m, r));
        if (want >= 0) PPN_CHECK(scratch_alloc(m, r, want, s == 0));
    }
    int last = map->dev[map->n_stages - 1];
    if (q->ring_dev != last) {
        PPN_CHECK(ring_free(q));
        PPN_CHECK(ring_alloc(q, last));
    }
    return PPN_OK;
}

/* Everything q holds; the first failed device free is returned (the rest is released all the same). */
static ppn_status seq_release(ppn_seq *q)
{
    ppn_model *m = q->m;
    ppn_err_first first = {0};
    ppn_seq_drop_graphs(q);
    ppn_drop_batch_graphs_of(m, q);
    if (q->tbl_h) ppn_kv_release(q, 0);
    for (int s = 0; s < PPN_MAX_STAGES; s++) ppn_err_first_add(&first, scratch_free(m, &q->scr[s]));
    ppn_err_first_add(&first, ring_free(q));
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) ppn_pinned_free(m->rt->pinned, q->logits_h[i]);
    ppn_pinned_free(m->rt->pinned, q->tok_h);
    ppn_pinned_free(m->rt->pinned, q->tbl_h);
    ppn_hfree(q);
    return ppn_err_first_done(&first);
}

ppn_status ppn_seq_create(ppn_model *m, ppn_seq **out)
{
    *out = NULL;
    PPN_CHECK(ppn_model_caller(m, "ppn_seq_create"));
    PPN_CHECK(ppn_model_failed(m));
    ppn_seq *q = ppn_hcalloc(1, sizeof *q);
    if (!q) return ppn_err(PPN_ENOMEM, "sequence: host out of memory");
    q->m = m;
    q->ring_dev = -1;
    for (int s = 0; s < PPN_MAX_STAGES; s++) q->scr[s].dev = -1;
    const ppn_stage_map *map = m->map;
    ppn_status st;
    PPN_CHECK_GOTO(ppn_pinned_alloc(m->rt->pinned, sizeof(int32_t) * (size_t)ppn_kv_max_blocks(m), (void **)&q->tbl_h),
                   st, fail);
    PPN_CHECK_GOTO(ppn_seq_fit_map(q, map), st, fail);
    PPN_CHECK_GOTO(ppn_model_drain(m), st, fail);
    for (int d = 0; d < PPN_MAX_DEVICES; d++) /* allocations are ordered on the device streams: finish them */
        if (m->dev_stream[d]) PPN_CHECK_GOTO(m->rt->g->ops->stream_sync(m->rt->g, m->dev_stream[d]), st, fail);
    static _Atomic int next_id; /* process-wide: runtimes on other threads create sequences too */
    q->id = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
    q->next = m->seqs;
    m->seqs = q;
    *out = q;
    return PPN_OK;
fail:;
    ppn_err_first first = {0}; /* st with its message, whatever the release meets */
    ppn_err_first_add(&first, st);
    ppn_err_first_add(&first, seq_release(q));
    return ppn_err_first_done(&first);
}

void ppn_seq_retire(ppn_seq *q, int ring)
{
    q->ring_step[ring] = 0;
    q->waited++;
}

#if PPN_TEST_HOOKS
static _Atomic int skip_destroy_syncs, skip_drop_syncs; /* test-only */

void ppn_seq_test_skip_destroy_syncs(int skip) { atomic_store(&skip_destroy_syncs, skip); }
void ppn_seq_test_skip_drop_syncs(int skip) { atomic_store(&skip_drop_syncs, skip); }
#endif

static int destroy_syncs_skipped(void)
{
#if PPN_TEST_HOOKS
    return atomic_load_explicit(&skip_destroy_syncs, memory_order_relaxed);
#else
    return 0;
#endif
}

static int drop_syncs_skipped(void)
{
#if PPN_TEST_HOOKS
    return atomic_load_explicit(&skip_drop_syncs, memory_order_relaxed);
#else
    return 0;
#endif
}

/* Drop every step of q in flight: its deferred batch steps' rows first (ppn_bstep_drop_rows_of waits their walks
 * through ppn_pend_wait, after their done events), then its own steps: no readback is issued, and the ring entry
 * is free. The host waits until each one's done event is recorded (a failed stage still posts it), then, on a
 * model that has not failed, until it has executed: every stage copies the block table entries it lacks from the
 * pinned host table before its walk (ppn_kv_sync), and those copies precede the done event (the last stage's
 * stream waits on every boundary event), so after this the caller may rewrite the table (a reset or a truncate
 * releases blocks, the next step reserves and writes new ids where a dropped step's queued copy still read the old
 * ones). Only a drop pays the wait: at most PPN_MAX_INFLIGHT steps of device time, never on the step path. A
 * failed model refuses every later step (nothing rewrites the table) and its done events may not be recorded;
 * there the stage threads are drained instead: the last stage may post a step's done while an earlier stage's
 * thread is still inside that step (reading the sequence's block table, say), so the caller may release what the
 * step read (ThreadSanitizer found ppn_seq_reset's KV release racing stage 1's table sync in test_faults).
 * Returns the model's failure, if any. */
ppn_status ppn_seq_drop_inflight(ppn_seq *q)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    ppn_status st = PPN_OK;
    (void)ppn_bstep_drop_rows_of(q); /* first: its walks own ring entries here; a failure stays on the model */
    for (int ring = 0; ring < PPN_MAX_INFLIGHT; ring++) {
        if (!q->ring_step[ring]) continue;
        ppn_gen_wait(&q->done_gen[ring], q->ring_step[ring], m->map->door.spin);
        g->ops->host_acquire(g, &q->done_gen[ring]); /* pairs with the release in stage_finish() (core/step.c) */
        if (st == PPN_OK && !drop_syncs_skipped() && atomic_load_explicit(&m->err, memory_order_acquire) == PPN_OK)
            st = g->ops->event_sync(g, q->done_ev[ring]);
        ppn_seq_retire(q, ring);
    }
    if (st != PPN_OK) ppn_model_fail(m, st); /* the table's readers may still be queued: no step may rewrite it */
    st = ppn_model_failed(m);
    if (st != PPN_OK) ppn_model_drain(m);
    return st;
}

ppn_status ppn_seq_destroy(ppn_seq *q)
{
    if (!q) return PPN_OK;
    ppn_model *m = q->m;
    PPN_CHECK(ppn_model_caller(m, "ppn_seq_destroy"));
    ppn_gpu *g = m->rt->g;
    (void)ppn_seq_drop_inflight(q); /* a failure stays on the model; destroying still works */
    ppn_model_drain(m);
    for (int s = 0; s < PPN_MAX_STAGES && !destroy_syncs_skipped(); s++)
        if (m->stages[s].stream) g->ops->stream_sync(g, m->stages[s].stream);
    if (m->rb_stream && !destroy_syncs_skipped()) g->ops->stream_sync(g, m->rb_stream);
    for (ppn_seq **it = &m->seqs; *it; it = &(*it)->next)
        if (*it == q) {
            *it = q->next;
            break;
        }
    return seq_release(q);
}

ppn_status ppn_seq_reset(ppn_seq *s)
{
    if (!s) return ppn_err(PPN_EINVAL, "ppn_seq_reset: seq is NULL");
    PPN_CHECK(ppn_model_caller(s->m, "ppn_seq_reset"));
    ppn_status st = ppn_seq_drop_inflight(s);
    s->pos = 0;
    ppn_kv_release(s, 0);
    return st;
}

int ppn_seq_pos(const ppn_seq *s) { return s->pos; }

void ppn_seq_drop_graphs(ppn_seq *q)
{
    ppn_gpu *g = q->m->rt->g;
    for (int s = 0; s < PPN_MAX_STAGES; s++)
        for (int i = 0; i < PPN_STAGE_GRAPHS; i++) {
            ppn_stage_graph *e = &q->graphs[s][i];
            /* the driver frees an executable still in flight when it completes; sim copied its params */
            if (e->exec && g->ops->graph_destroy(g, e->exec) != PPN_OK)
                fprintf(stderr, "ppn: destroying a captured graph: %s\n", ppn_last_error());
            e->exec = NULL;
        }
}
