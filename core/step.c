/* step.c - one decode step through the stages.
 *
 *   caller: ppn_decode_step_deferred(seq, token) -> one command per stage (preallocated, lock-free queue)
 *   stage 0: set the step header {pos, token, seq, step} in its io buffer; embed; walk [f0, f1); send on
 *            boundary 0 (wait ev_rx of the slot's previous step -> copy -> record ev_tx)
 *   stage s: host-wait until boundary s-1 recorded ev_tx for this step, then stream-wait on it; read the slot
 *            (in place, or copied in); walk its layers; hand on through boundary s; release the slot (ev_rx)
 *   last:    final norm + lm head into the sequence's logits ring entry; record the step's done event
 * A stage's body (embed, its layers, the head: every kernel between the boundary ops) is one graph replay
 * with PPN_GRAPHS=1 (the default): captured the first time a (map, io, logits) triple is met, then replayed.
 * The kernels read pos and token from the header in device memory, so one recording serves every step.
 *   caller:  ppn_pending_wait: the dedicated readback stream waits the done event, copies, syncs
 * With one stage (the door shut) the caller's thread issues the stage itself. MEMRA_PP_STREAMS=0 issues every
 * stage on stage 0's stream from the caller's thread, with two plain dtod copies per boundary.
 *
 * Failure inside a stage thread: the first status and message are kept on the model (sticky), the thread
 * still posts every generation its step owes so no other stage waits forever, and the caller's wait returns
 * the failure.
 */
#include <stdlib.h>
#include <string.h>
#include <urcu/urcu-qsbr.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

typedef struct step_posts { /* what this stage owes the others for this step */
    int sent, released, done;
} step_posts;

static void walk_enter(ppn_model *m, ppn_stage_rt *sr)
{
    atomic_fetch_add_explicit(&sr->walker_runs, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&m->active_walkers, 1, memory_order_relaxed) > 0)
        atomic_fetch_add_explicit(&m->overlap_observed, 1, memory_order_relaxed);
}

static void walk_leave(ppn_model *m) { atomic_fetch_sub_explicit(&m->active_walkers, 1, memory_order_relaxed); }

/* What the last stage's body writes: the logits, and for a device-greedy step their argmax (tok != 0, an
 * entry of seq->tok; the split argmax uses seq->amx). */
typedef struct stage_out {
    ppn_dptr logits, tok;
} stage_out;

/* Stage s's kernels for one step: the embed on stage 0, its layers, and on the last stage the head into
 * o.logits (and their argmax into o.tok). Only launches: this is what a graph captures. */
static ppn_status stage_body(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, ppn_seq *seq,
                             ppn_dptr io, stage_out o)
{
    ppn_stage_scratch *r = &seq->scr[s];
    if (s == 0) PPN_CHECK(ppn_fwd_embed(m, q, r, io));
    for (int l = map->fence[s]; l < map->fence[s + 1]; l++) PPN_CHECK(ppn_fwd_layer(seq, q, map->dev[s], r, io, l));
    if (o.logits) PPN_CHECK(ppn_fwd_head(m, q, r, io, o.logits));
    if (o.tok) PPN_CHECK(ppn_op_argmax_wide(m->rt->g, q, o.tok, o.logits, m->cfg.vocab, seq->amx));
    return PPN_OK;
}

/* Capture stage s's body on q into entry e. A failed capture is abandoned and leaves e empty; the body's own
 * error is the one reported. */
static ppn_status graph_capture(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, ppn_seq *seq,
                                ppn_dptr io, stage_out o, ppn_stage_graph *e)
{
    ppn_gpu *g = m->rt->g;
    if (e->exec) {
        ppn_ggraph *old = e->exec;
        e->exec = NULL;
        PPN_CHECK(g->ops->graph_destroy(g, old));
    }
    PPN_CHECK(g->ops->capture_begin(g, q));
    ppn_status st = stage_body(m, map, s, q, seq, io, o);
    if (st != PPN_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", ppn_last_error());
        (void)g->ops->capture_end(g, q, NULL);
        return ppn_err(st, "%s (while capturing stage %d's graph)", why, s);
    }
    ppn_ggraph *x = NULL;
    PPN_CHECK(g->ops->capture_end(g, q, &x));
    *e = (ppn_stage_graph){x, map->gen, io, o.logits, o.tok, map->dev[s]};
    atomic_fetch_add_explicit(&m->graph_captures, 1, memory_order_relaxed);
    return PPN_OK;
}

/* Replay stage s's body for (map, io, outputs), capturing it the first time. */
static ppn_status graph_replay(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, ppn_seq *seq,
                               ppn_dptr io, stage_out o)
{
    ppn_gpu *g = m->rt->g;
    ppn_stage_graph *set = seq->graphs[s], *e = NULL;
    for (int i = 0; i < PPN_STAGE_GRAPHS && !e; i++)
        if (set[i].exec && set[i].gen == map->gen && set[i].io == io && set[i].logits == o.logits &&
            set[i].tok == o.tok && set[i].dev == map->dev[s])
            e = &set[i];
    if (!e) {
        e = &set[seq->graph_next[s]++ % PPN_STAGE_GRAPHS];
        PPN_CHECK(graph_capture(m, map, s, q, seq, io, o, e));
    }
    return g->ops->graph_launch(g, e->exec, q);
}

static ppn_status stage_walk(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, ppn_seq *seq,
                             ppn_dptr io, stage_out o)
{
    ppn_stage_rt *sr = &m->stages[s];
    walk_enter(m, sr);
    ppn_status st = map->door.graphs ? graph_replay(m, map, s, q, seq, io, o) : stage_body(m, map, s, q, seq, io, o);
    walk_leave(m);
    return st;
}

/* After the head (inside the last stage's body): the step's done event. */
static ppn_status stage_finish(ppn_model *m, ppn_gstream *q, ppn_seq *seq, const ppn_step_cmd *c, step_posts *p)
{
    ppn_gpu *g = m->rt->g;
    PPN_CHECK(g->ops->event_record(g, seq->done_ev[c->ring], q));
    p->done = 1;
    /* the post and its sim checker's view pair with the acquires in pend_wait, step_header, rows_token_wait, drop */
    g->ops->host_release(g, &seq->done_gen[c->ring]);
    ppn_gen_post(&seq->done_gen[c->ring], c->step + 1);
    return PPN_OK;
}

/* The outputs of stage s's body for step c. */
static stage_out out_of(const ppn_stage_map *map, int s, const ppn_step_cmd *c)
{
    stage_out o = {0, 0};
    if (s != map->n_stages - 1) return o;
    o.logits = c->seq->logits[c->ring];
    if (c->argmax) o.tok = c->seq->tok[c->ring];
    return o;
}

/* The step header, on stage 0's stream q. A device-greedy step's token is the previous step's argmax, on the
 * last stage's device: wait until the last stage has recorded that step's done event (the host generation
 * first, as at a boundary, so the stream wait binds to that record), copy the token over when the devices
 * differ, and let the set_hdr kernel read it. */
static ppn_status step_header(ppn_model *m, const ppn_stage_map *map, ppn_gstream *q, const ppn_step_cmd *c,
                              ppn_dptr io, int same_stream)
{
    ppn_gpu *g = m->rt->g;
    ppn_seq *seq = c->seq;
    if (c->tok_ring < 0) return ppn_op_set_hdr(g, q, io, c->pos, c->token, seq->id, (int)c->step);
    ppn_dptr tok = seq->tok[c->tok_ring];
    if (!same_stream) {
        ppn_gen_wait(&seq->done_gen[c->tok_ring], c->tok_step + 1, map->door.spin);
        g->ops->host_acquire(g, &seq->done_gen[c->tok_ring]); /* pairs with the release in stage_finish() */
        /* a failed last stage posts the generation without recording done_ev: the stream wait would bind to
         * an older record and the token read race its writer (the failure is published before the post) */
        PPN_CHECK(ppn_model_failed(m));
        PPN_CHECK(g->ops->stream_wait_event(g, q, seq->done_ev[c->tok_ring]));
    }
    if (seq->ring_dev != map->dev[0]) {
        PPN_CHECK(g->ops->copy_peer(g, q, seq->scr[0].tokin, map->dev[0], tok, seq->ring_dev, sizeof(int32_t)));
        tok = seq->scr[0].tokin;
    }
    return ppn_op_set_hdr_dev(g, q, io, c->pos, tok, seq->id, (int)c->step);
}

/* Many rows ----------------------------------------------------------------------------------------------- */

/* Layers [f0, f1) of a many-rows walk over x (rows of r's capacity), with the embedding first and the head last
 * when asked: what one stage does with a prefill chunk, and what the unsplit walk does with all the layers. */
ppn_status ppn_rows_body(ppn_model *m, ppn_gstream *q, int dev, ppn_rows_scratch *r, ppn_dptr x,
                         const ppn_step_cmd *c, int f0, int f1, int embed, int head)
{
    if (embed) PPN_CHECK(ppn_fwd_rows_embed(m, q, r, x, c->rows));
    for (int l = f0; l < f1; l++) PPN_CHECK(ppn_fwd_rows_layer(m, q, dev, r, x, c, l));
    if (head && (c->kind == PPN_ROWS_BATCH || c->kind == PPN_ROWS_VERIFY))
        return ppn_fwd_rows_head_batch(m, q, r, x, c->rows, c->ids_h != NULL);
    if (head) PPN_CHECK(ppn_fwd_rows_head(m, q, r, x, c->segs, c->nseg, c->rows));
    if (head && c->kind == PPN_ROWS_MIXED) /* the decode rows' logits and ids as a batch's, by one GEMM */
        return ppn_fwd_rows_head_batch(m, q, r, x + sizeof(float) * (size_t)m->cfg.dim * (size_t)c->brow0,
                                       c->rows - c->brow0, c->ids_h != NULL);
    return PPN_OK;
}

/* A batch's (a verify's, a mixed walk's) results to the host, after its head: every decode row's logits and
 * argmax; for a greedy batch, the argmax also stays on the device for the next step's tokens (gtok_out, on this
 * stage's device: the rows scratch's ids are rewritten by the next walk). */
static ppn_status rows_results(ppn_model *m, ppn_gstream *q, ppn_rows_scratch *r, const ppn_step_cmd *c)
{
    ppn_gpu *g = m->rt->g;
    size_t v = (size_t)m->cfg.vocab, n = (size_t)(c->rows - c->brow0);
    if (c->logits_h) PPN_CHECK(g->ops->copy_dtoh(g, q, c->logits_h, r->lall, sizeof(float) * v * n));
    if (c->ids_h) PPN_CHECK(g->ops->copy_dtoh(g, q, c->ids_h, r->ids, sizeof(int32_t) * n));
    if (c->gtok_out) PPN_CHECK(g->ops->copy_dtod(g, q, c->gtok_out, r->ids, sizeof(int32_t) * n));
    return PPN_OK;
}

static void batch_graph_drop(ppn_model *m, ppn_batch_graph *b)
{
    ppn_gpu *g = m->rt->g;
    if (b->exec && g->ops->graph_destroy(g, b->exec) != PPN_OK)
        fprintf(stderr, "ppn: destroying a captured batch graph: %s\n", ppn_last_error());
    b->exec = NULL;
    ppn_hfree(b->who);
    b->who = NULL;
}

void ppn_stage_drop_batch_graphs(ppn_model *m, int s)
{
    for (int i = 0; i < PPN_BATCH_GRAPHS; i++) batch_graph_drop(m, &m->stages[s].bg[i]);
}

void ppn_drop_batch_graphs_of(ppn_model *m, const ppn_seq *q)
{
    for (int s = 0; s < PPN_MAX_STAGES; s++)
        for (int i = 0; i < PPN_BATCH_GRAPHS; i++) {
            ppn_batch_graph *b = &m->stages[s].bg[i];
            for (int r = 0; b->exec && b->who && r < b->rows; r++)
                if (b->who[r] == q) {
                    batch_graph_drop(m, b);
                    break;
                }
        }
}

/* Stage s's part of a batch on q: its captured walk for (map, io, rows, ids) replayed, captured the first time
 * (PPN_GRAPHS=1), or issued launch by launch. The row descriptors, tables and tokens were copied in before
 * (their contents change per step, their places do not), the results are copied out after. */
static ppn_status batch_body(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, const ppn_step_cmd *c,
                             ppn_dptr x, int head)
{
    ppn_stage_rt *sr = &m->stages[s];
    ppn_rows_scratch *r = &sr->rs;
    int f0 = map->fence[s], f1 = map->fence[s + 1];
    if (head) PPN_CHECK(ppn_fwd_rows_lall(m, r)); /* no allocation inside a capture */
    if (!map->door.graphs) return ppn_rows_body(m, q, map->dev[s], r, x, c, f0, f1, s == 0, head);
    ppn_gpu *g = m->rt->g;
    ppn_dptr io = x - PPN_IO_HDR_BYTES;
    int ids = c->ids_h != NULL;
    ppn_batch_graph *e = NULL;
    ppn_seq **who = NULL;
    ppn_status st0;
    for (int i = 0; i < PPN_BATCH_GRAPHS && !e; i++) {
        ppn_batch_graph *b = &sr->bg[i];
        if (b->exec && b->gen == map->gen && b->io == io && b->rows == c->rows && b->ids == ids && b->dev == map->dev[s])
            e = b;
    }
    if (!e) {
        e = &sr->bg[sr->bg_next++ % PPN_BATCH_GRAPHS];
        batch_graph_drop(m, e);
        who = ppn_hcalloc((size_t)c->rows, sizeof *who);
        if (!who) return ppn_err(PPN_ENOMEM, "batch graph: host out of memory for %d rows", c->rows);
        for (int i = 0; i < c->nseg; i++) who[c->segs[i].r0] = c->segs[i].seq;
        PPN_CHECK_GOTO(g->ops->capture_begin(g, q), st0, fail_who);
        ppn_status st = ppn_rows_body(m, q, map->dev[s], r, x, c, f0, f1, s == 0, head);
        if (st != PPN_OK) {
            char why[1024];
            snprintf(why, sizeof why, "%s", ppn_last_error());
            (void)g->ops->capture_end(g, q, NULL);
            ppn_hfree(who);
            return ppn_err(st, "%s (while capturing stage %d's batch graph)", why, s);
        }
        ppn_ggraph *gx = NULL;
        PPN_CHECK_GOTO(g->ops->capture_end(g, q, &gx), st0, fail_who);
        *e = (ppn_batch_graph){gx, map->gen, io, c->rows, ids, map->dev[s], who};
        atomic_fetch_add_explicit(&m->graph_captures, 1, memory_order_relaxed);
    }
    return g->ops->graph_launch(g, e->exec, q);
fail_who:
    ppn_hfree(who);
    return st0;
}

/* A chunk holds rows of more than one sequence (a cross-request prime batch). */
static int rows_batched(const ppn_step_cmd *c)
{
    for (int i = 1; i < c->nseg; i++)
        if (c->segs[i].seq != c->segs[0].seq) return 1;
    return 0;
}

/* Stage s's walk of a chunk or a batch, and the liveness counters of its kind.
 * Prime: a walker entered while another stage's ran (PRIME_PIPE_OVERLAPS), and on the last stage of a split,
 * one chunk that walked the per-stage split (PRIME_SPLIT_CHUNKS; STEP35_PRIME_BATCH_SPLITS when it held several
 * sequences' rows). Batch: this stage's batch walks, a batch walker entered while another stage's ran
 * (micro-batch pipelining), and on the last stage of a split, one (micro-)batch that walked the split. A mixed
 * walk counts as a batch walk and, on the split, as a prime chunk too. */
static ppn_status rows_walk(ppn_model *m, const ppn_stage_map *map, int s, ppn_gstream *q, const ppn_step_cmd *c,
                            ppn_dptr io)
{
    ppn_stage_rt *sr = &m->stages[s];
    int batch = c->kind == PPN_ROWS_BATCH || c->kind == PPN_ROWS_MIXED;
    _Atomic int *walkers = batch ? &m->batch_walkers : &m->prime_walkers;
    atomic_fetch_add_explicit(&sr->walker_runs, 1, memory_order_relaxed);
    if (batch) atomic_fetch_add_explicit(&sr->batch_walks, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(walkers, 1, memory_order_relaxed) > 0)
        atomic_fetch_add_explicit(batch ? &m->batch_pipe_overlaps : &m->prime_pipe_overlaps, 1, memory_order_relaxed);
    int last = s == map->n_stages - 1;
    /* a mixed walk is issued launch by launch (its prompt segments change every call): no graph */
    ppn_status st = last && c->kind == PPN_ROWS_MIXED ? ppn_fwd_rows_lall(m, &sr->rs) : PPN_OK;
    if (st == PPN_OK)
        st = c->kind == PPN_ROWS_BATCH ? batch_body(m, map, s, q, c, io + PPN_IO_HDR_BYTES, last)
                                       : ppn_rows_body(m, q, map->dev[s], &sr->rs, io + PPN_IO_HDR_BYTES, c,
                                                       map->fence[s], map->fence[s + 1], s == 0, last);
    if (st == PPN_OK && last && (batch || c->kind == PPN_ROWS_VERIFY)) st = rows_results(m, q, &sr->rs, c);
    atomic_fetch_sub_explicit(walkers, 1, memory_order_relaxed);
    if (st != PPN_OK || !last || map->n_stages < 2) return st;
    if (batch) {
        atomic_fetch_add_explicit(&m->batch_split_steps, 1, memory_order_relaxed);
        if (c->kind == PPN_ROWS_MIXED) atomic_fetch_add_explicit(&m->prime_split_chunks, 1, memory_order_relaxed);
    } else if (c->kind == PPN_ROWS_VERIFY) {
        atomic_fetch_add_explicit(&m->spec_split_verifies, 1, memory_order_relaxed);
    } else if (c->kind == PPN_ROWS_PRIME) {
        atomic_fetch_add_explicit(&m->prime_split_chunks, 1, memory_order_relaxed);
        if (rows_batched(c)) atomic_fetch_add_explicit(&m->prime_batch_splits, 1, memory_order_relaxed);
    }
    return st;
}

/* Stage 0 of a chunk: its token ids into the stage's rows scratch (pinned host memory that outlives the walk).
 * A greedy batch's later walks take theirs from the device instead (c->gtok_in: the same rows' argmax one step
 * before, on c->gtok_dev), with no host round trip. */
ppn_status ppn_rows_tokens(ppn_model *m, ppn_gstream *q, const ppn_step_cmd *c)
{
    ppn_gpu *g = m->rt->g;
    ppn_dptr dst = m->stages[0].rs.tok;
    size_t n = sizeof(int32_t) * (size_t)c->rows;
    if (!c->gtok_in) return g->ops->copy_htod(g, q, dst, c->tok_h, n);
    int dev = g->ops->stream_device(g, q);
    if (c->gtok_dev == dev) return g->ops->copy_dtod(g, q, dst, c->gtok_in, n);
    return g->ops->copy_peer(g, q, dst, dev, c->gtok_in, c->gtok_dev, n);
}

/* A greedy batch walk's wait on stage 0 (stream q) for the walk whose argmax are its tokens, as step_header waits
 * for a greedy step's: the host generation of that walk's done first, so the stream wait binds to its record (the
 * ring entry is not reused before this walk has passed stage 0: the caller waits a walk before it reissues the
 * entry, and stage 0 takes commands in order). On one stream the order is the stream's. */
static ppn_status rows_token_wait(ppn_model *m, const ppn_stage_map *map, ppn_gstream *q, const ppn_step_cmd *c)
{
    if (!c->gtok_in || map->n_stages == 1) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    ppn_gen_wait(&c->seq->done_gen[c->tok_ring], c->tok_step + 1, map->door.spin);
    g->ops->host_acquire(g, &c->seq->done_gen[c->tok_ring]); /* pairs with the release in stage_finish() */
    PPN_CHECK(ppn_model_failed(m)); /* a failed last stage posts without recording (step_header says why) */
    return g->ops->stream_wait_event(g, q, c->seq->done_ev[c->tok_ring]);
}

/* Stage s's copy of what c's walk reads from the host, on q before the walk: each sequence's new KV block table
 * entries and, for a batch, its row descriptors (pinned memory the call owns until the walk is done). */
static ppn_status stage_inputs(ppn_model *m, int s, ppn_gstream *q, const ppn_step_cmd *c)
{
    if (!c->rows) return ppn_kv_sync(m, c->seq, s, q, c->n_tbl);
    for (int i = 0; i < c->nseg; i++) PPN_CHECK(ppn_kv_sync(m, c->segs[i].seq, s, q, c->segs[i].n_tbl));
    if (c->kind != PPN_ROWS_BATCH && c->kind != PPN_ROWS_MIXED) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    size_t nb = (size_t)(c->rows - c->brow0), n = sizeof(ppn_kseg) * nb;
    return g->ops->copy_htod(g, q, m->stages[s].rs.segs, c->ksegs_h + (size_t)s * nb, n);
}

ppn_status ppn_rows_inputs_unsplit(ppn_model *m, const ppn_step_cmd *c)
{
    const ppn_stage_map *map = m->map;
    for (int s = 0; s < map->n_stages; s++)
        for (int i = 0; i < c->nseg; i++)
            PPN_CHECK(ppn_kv_sync(m, c->segs[i].seq, s, m->stages[s].stream, c->segs[i].n_tbl));
    if (c->kind != PPN_ROWS_BATCH && c->kind != PPN_ROWS_MIXED) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    size_t n = sizeof(ppn_kseg) * (size_t)(c->rows - c->brow0) * (size_t)map->n_stages;
    return g->ops->copy_htod(g, m->stages[0].stream, m->stages[0].rs.segs, c->ksegs_h, n);
}

static ppn_status stage_issue(ppn_model *m, const ppn_stage_map *map, int s, const ppn_step_cmd *c, step_posts *p)
{
    ppn_gpu *g = m->rt->g;
    ppn_gstream *q = m->stages[s].stream;
    ppn_seq *seq = c->seq;
    int n = map->n_stages, spin = map->door.spin, rows = c->rows ? c->rows : 1;
    ppn_dptr local = c->rows ? m->stages[s].rs.io : seq->scr[s].io, io = local;
    PPN_CHECK(stage_inputs(m, s, q, c));
    if (s == 0) {
        if (c->rows) PPN_CHECK(rows_token_wait(m, map, q, c));
        PPN_CHECK(c->rows ? ppn_rows_tokens(m, q, c) : step_header(m, map, q, c, io, n == 1));
    } else {
        PPN_CHECK(ppn_boundary_recv(&m->bnd[s - 1], g, q, c->slot, c->step, local, &io, rows, spin));
        p->released = !ppn_boundary_in_place(&m->bnd[s - 1]);
    }
    PPN_CHECK(ppn_busy_begin(m, s, q));
    PPN_CHECK(c->rows ? rows_walk(m, map, s, q, c, io) : stage_walk(m, map, s, q, seq, io, out_of(map, s, c)));
    PPN_CHECK(ppn_busy_end(m, s, q));
    if (s + 1 < n) {
        PPN_CHECK(ppn_boundary_send(&m->bnd[s], g, q, c->slot, c->step, io, rows, spin));
        p->sent = 1;
    }
    if (s == n - 1) PPN_CHECK(stage_finish(m, q, seq, c, p));
    /* In place, the slot is this stage's io: release it only after its last reader (the send, or the final
     * norm on the last stage). Releasing before the head let the producer's next send overwrite the hidden
     * state while the final norm read it: a race the sim checker reported in the pipelined arm. */
    if (s > 0 && !p->released) {
        PPN_CHECK(ppn_boundary_release(&m->bnd[s - 1], g, q, c->slot, c->step));
        p->released = 1;
    }
    return PPN_OK;
}

/* After a failure: post what the step still owes, so no stage or caller waits forever. */
static void stage_settle(ppn_model *m, const ppn_stage_map *map, int s, const ppn_step_cmd *c, step_posts *p)
{
    if (s + 1 < map->n_stages && !p->sent) {
        ppn_boundary_abandon_send(&m->bnd[s], c->slot, c->step);
    }
    if (s > 0 && !p->released) ppn_boundary_abandon_recv(&m->bnd[s - 1], c->slot, c->step);
    if (s == map->n_stages - 1 && !p->done) {
        m->rt->g->ops->host_release(m->rt->g, &c->seq->done_gen[c->ring]); /* as stage_finish() does */
        ppn_gen_post(&c->seq->done_gen[c->ring], c->step + 1);
    }
}

static void stage_run(ppn_model *m, const ppn_stage_map *map, int s, const ppn_step_cmd *c)
{
    step_posts p = {0};
    ppn_status st = ppn_model_failed(m);
    if (st == PPN_OK) st = stage_issue(m, map, s, c, &p);
    if (st == PPN_OK) return;
    ppn_err_ctx(st, "stage %d, step %u", s, c->step);
    ppn_model_fail(m, st);
    stage_settle(m, map, s, c, &p);
}

void ppn_stage_thread_fn(void *ctx, ppn_cmd *cmd)
{
    ppn_stage_rt *sr = ctx;
    ppn_gpu *g = sr->m->rt->g;
    ppn_step_cmd *c = caa_container_of(cmd, ppn_step_cmd, cmd);
    /* the sim checker's view of the queue's hand-off: pairs with the release in post_to_threads() */
    g->ops->host_acquire(g, &cmd->posted);
    const ppn_stage_map *map = rcu_dereference(sr->m->map);
    PPN_ASSERT(map == c->map); /* maps change only between drained steps */
    stage_run(sr->m, map, sr->index, c);
    g->ops->host_release(g, &cmd->done); /* pairs with the acquires in post_to_threads(), ppn_model_drain() */
    ppn_issue_done(cmd);
}

static ppn_status one_stream_issue(ppn_model *m, const ppn_stage_map *map, const ppn_step_cmd *c, step_posts *p)
{
    ppn_gpu *g = m->rt->g;
    ppn_gstream *q = m->stages[0].stream;
    ppn_seq *seq = c->seq;
    int n = map->n_stages;
    for (int s = 0; s < n; s++) {
        ppn_dptr io = seq->scr[s].io;
        PPN_CHECK(ppn_kv_sync(m, seq, s, q, c->n_tbl));
        if (s == 0) PPN_CHECK(step_header(m, map, q, c, io, 1));
        else PPN_CHECK(ppn_boundary_get_plain(&m->bnd[s - 1], g, q, io, 1));
        /* every stage is on stage 0's device here, and its busy time on stage 0's stream */
        PPN_CHECK(ppn_busy_begin(m, 0, q));
        PPN_CHECK(stage_walk(m, map, s, q, seq, io, out_of(map, s, c)));
        PPN_CHECK(ppn_busy_end(m, 0, q));
        if (s + 1 < n) PPN_CHECK(ppn_boundary_put_plain(&m->bnd[s], g, q, io, 1));
    }
    return stage_finish(m, q, seq, c, p);
}

ppn_status ppn_step_checks(ppn_seq *q, int token)
{
    ppn_model *m = q->m;
    PPN_CHECK(ppn_model_failed(m));
    if (token < 0 || token >= m->cfg.vocab)
        return ppn_err(PPN_EINVAL, "token %d is outside the vocabulary [0, %d)", token, m->cfg.vocab);
    if (q->pos >= m->ctx) return ppn_err(PPN_ESTATE, "sequence %d is full: %d positions (ctx)", q->id, m->ctx);
    if (q->issued - q->waited >= PPN_MAX_INFLIGHT)
        return ppn_err(PPN_ESTATE, "sequence %d has %d deferred steps in flight: wait one first", q->id,
                       PPN_MAX_INFLIGHT);
    return PPN_OK;
}

/* Hand the step to the stage threads (commands are preallocated; a command is reused only once done). */
static void post_to_threads(ppn_model *m, const ppn_step_cmd *tmpl)
{
    const ppn_stage_map *map = m->map;
    ppn_gpu *g = m->rt->g;
    for (int s = 0; s < map->n_stages; s++) {
        ppn_stage_rt *sr = &m->stages[s];
        ppn_step_cmd *c = &sr->cmds[tmpl->step % PPN_CMD_RING];
        if (c->used) {
            ppn_gen_wait(&c->cmd.done, c->cmd.seqno + 1, map->door.spin);
            g->ops->host_acquire(g, &c->cmd.done); /* pairs with the release in ppn_stage_thread_fn() */
        }
        uint32_t seqno = tmpl->step;
        *c = *tmpl;
        c->used = 1;
        c->cmd.seqno = seqno;
        atomic_store_explicit(&c->cmd.done, seqno, memory_order_relaxed); /* not done yet */
        /* what this thread has synced (and its host writes: the KV block table) is the stage thread's to build on;
         * pairs with the acquire in ppn_stage_thread_fn(), after the queue's own hand-off */
        g->ops->host_release(g, &c->cmd.posted);
        ppn_issue_post(&sr->thr, &c->cmd);
    }
}

/* Issue c (its sequence, ring entry and own fields set) as the next step under the published map: to the stage
 * threads, or on the caller's thread. A many-rows walk alternates the boundary slots always, so stage 0 may run
 * a chunk ahead of stage 1 (the prime pipeline); a decode step alternates them with MEMRA_PP_OVERLAP=1. */
static ppn_status issue_cmd(ppn_model *m, ppn_step_cmd *c)
{
    const ppn_stage_map *map = m->map;
    c->map = map;
    c->step = m->next_step++;
    c->slot = map->door.overlap || c->rows ? (int)(c->step & 1) : 0;
    c->seq->ring_step[c->ring] = c->step + 1;
    step_posts p = {0};
    ppn_status st = PPN_OK;
    if (map->n_stages > 1 && map->door.streams) post_to_threads(m, c);
    else if (map->n_stages > 1) st = one_stream_issue(m, map, c, &p);
    else st = stage_issue(m, map, 0, c, &p);
    if (st != PPN_OK) {
        ppn_model_fail(m, st);
        if (!p.done) ppn_gen_post(&c->seq->done_gen[c->ring], c->step + 1);
    }
    return st;
}

static ppn_status issue_step(ppn_seq *q, int token, int ring, const ppn_greedy_link *gl, uint32_t *step_out)
{
    ppn_step_cmd c = {.seq = q, .pos = q->pos, .token = token, .ring = ring, .tok_ring = gl ? gl->tok_ring : -1,
                      .tok_step = gl ? gl->tok_step : 0, .argmax = gl != NULL, .n_tbl = q->n_blk};
    ppn_status st = issue_cmd(q->m, &c);
    *step_out = c.step;
    return st;
}

/* A free entry of the logits ring (ppn_step_checks guaranteed one), the oldest first: steps may be waited in
 * any order, so the entry after the last one issued may still be in flight. */
static int ring_free_entry(const ppn_seq *q)
{
    for (int i = 0; i < PPN_MAX_INFLIGHT; i++) {
        int ring = (int)((q->issued + (uint64_t)i) % PPN_MAX_INFLIGHT);
        if (!q->ring_step[ring]) return ring;
    }
    PPN_ASSERT(!"no free logits ring entry");
    return -1;
}

ppn_status ppn_step_issue_deferred(ppn_seq *q, int token, const ppn_greedy_link *gl, ppn_pend *out)
{
    int ring = ring_free_entry(q);
    uint32_t step;
    q->ring_pos[ring] = q->pos;
    ppn_status st = issue_step(q, token, ring, gl, &step);
    q->issued++;
    q->pos++;
    *out = (ppn_pend){.ring = ring, .step = step};
    return st;
}

ppn_status ppn_step_issue_rows(const ppn_step_cmd *tmpl, ppn_pend *out)
{
    ppn_seq *q = tmpl->seq;
    ppn_step_cmd c = *tmpl;
    c.ring = ring_free_entry(q);
    ppn_status st = issue_cmd(q->m, &c);
    q->issued++;
    *out = (ppn_pend){.ring = c.ring, .step = c.step};
    return st;
}

ppn_status ppn_decode_step_deferred(ppn_seq *q, int token, ppn_step_id *out)
{
    if (!q || !out) return ppn_err(PPN_EINVAL, "ppn_decode_step_deferred: %s is NULL", !q ? "seq" : "out");
    *out = 0;
    PPN_CHECK(ppn_model_caller(q->m, "ppn_decode_step"));
    PPN_CHECK(ppn_step_checks(q, token));
    PPN_CHECK(ppn_kv_reserve_one(q, q->pos + 1));
    ppn_pend p;
    ppn_status st = ppn_step_issue_deferred(q, token, NULL, &p);
    *out = ppn_pend_id(p);
    return st;
}
