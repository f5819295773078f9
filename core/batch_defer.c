/* batch_defer.c - a batch step the caller does not wait for at once, and the device greedy loop of a batch.
 *
 * Deferred (ppn_decode_batch_deferred, ppn_decode_batch_wait): the step's walks are issued as ppn_decode_batch_ex
 * issues them (same arm, micro-batches, graphs) and the call returns; the step's host side (its plan: row
 * descriptors, tokens, the ids' pinned rows) lives in a ppn_bstep on the model's list until it is waited.
 * In-flight room: the first row of each micro-batch owns that walk's ring entry (its done event marks the walk's
 * end, as in ppn_rows_run_staged); every other row counts the step in its own issued/waited pair, without an
 * entry. So each row's room (PPN_MAX_INFLIGHT) holds the step until it is waited, and ppn_seq_reset / destroy of a
 * row find it (ppn_seq_drop_inflight calls ppn_bstep_drop_rows_of): the step's walks are waited without readback,
 * that row is dropped from the step, and the step is freed once no live row holds it; the other rows' results
 * stay for their wait. The unsplit walk (MEMRA_BATCH_PP=0) is synchronous: its step runs at issue and the wait
 * only returns it.
 *
 * Greedy (ppn_decode_batch_greedy): step t + 1's micro-batch k takes its tokens from the argmax step t's
 * micro-batch k left on the head's device (the cmd's gtok_in / gtok_out: one block per micro-batch, as the
 * checker orders accesses per block), copied in by stage 0 after that walk's done event (core/step.c). The host
 * keeps up to PPN_MAX_INFLIGHT steps in flight, one plan each (only positions change between steps: every KV block
 * is reserved up front), and reads back 4 bytes a row a step. The unsplit walk runs one step at a time (it is
 * synchronous), its tokens still fed on the device.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"

struct ppn_bstep {
    struct ppn_bstep *next;
    ppn_step_id id;
    int n, single, issued;        /* issued: positions advanced, so it must be waited or dropped */
    ppn_batch_plan pl;            /* the walks' host side (not single) */
    ppn_seq **seqs;               /* [n]: the rows' sequences; NULL once that sequence dropped the step */
    int *pos;                     /* [n]: the position each row fed (messages) */
    unsigned char *member;        /* [n]: 1 the row counts the step by issued/waited; 0 by its walk's ring entry */
    int n_walks;                  /* walks issued */
    ppn_pend fly[PPN_MAX_INFLIGHT];
    ppn_seq *own[PPN_MAX_INFLIGHT];  /* the sequence whose ring entry each walk holds */
    int own_row[PPN_MAX_INFLIGHT];   /* and its row */
    unsigned char done[PPN_MAX_INFLIGHT]; /* walk k waited already (by a drop) */
    ppn_status st;                /* the first failure: at issue, or met by a walk a drop waited */
    float *logits;                /* the caller's */
    int *ids;
};

static ppn_bstep *bstep_new(int n)
{
    ppn_bstep *b = ppn_hcalloc(1, sizeof *b);
    if (!b) return NULL;
    b->n = n;
    b->seqs = ppn_hcalloc((size_t)n, sizeof *b->seqs);
    b->pos = ppn_hcalloc((size_t)n, sizeof *b->pos);
    b->member = ppn_hcalloc((size_t)n, sizeof *b->member);
    if (b->seqs && b->pos && b->member) return b;
    ppn_hfree(b->seqs);
    ppn_hfree(b->pos);
    ppn_hfree(b->member);
    ppn_hfree(b);
    return NULL;
}

/* After its walks finished (or were never issued). */
static void bstep_free(ppn_model *m, ppn_bstep *b)
{
    if (!b->single) ppn_batch_plan_free(m, &b->pl);
    ppn_hfree(b->seqs);
    ppn_hfree(b->pos);
    ppn_hfree(b->member);
    ppn_hfree(b);
}

static int bstep_row_of(const ppn_bstep *b, const ppn_seq *q)
{
    for (int i = 0; i < b->n; i++)
        if (b->seqs[i] == q) return i;
    return -1;
}

static int bstep_live(const ppn_bstep *b)
{
    for (int i = 0; i < b->n; i++)
        if (b->seqs[i]) return 1;
    return 0;
}

/* Wait every walk of b not waited yet, without readback; their ring entries are free after. */
static ppn_status bstep_wait_walks(ppn_bstep *b)
{
    for (int k = 0; k < b->n_walks; k++) {
        if (b->done[k]) continue;
        b->done[k] = 1;
        ppn_status w = ppn_pend_wait(b->own[k], b->fly[k], NULL, NULL);
        if (b->st == PPN_OK) b->st = w;
    }
    return b->st;
}

/* Deferred --------------------------------------------------------------------------------------------------- */

/* A batch of one on the split (or one stage) is a decode step, as ppn_decode_batch_ex issues it: with ids and no
 * logits its argmax on the device; otherwise its logits, and the ids their argmax on the host at the wait. */
static ppn_status issue_single(ppn_bstep *b, int token)
{
    ppn_seq *q = b->seqs[0];
    PPN_CHECK(ppn_kv_reserve_one(q, q->pos + 1));
    ppn_greedy_link gl = {-1, 0};
    b->single = b->issued = 1;
    b->own[0] = q;
    b->n_walks = 1;
    return ppn_step_issue_deferred(q, token, b->ids && !b->logits ? &gl : NULL, &b->fly[0]);
}

/* Every row's KV block for positions below end[i] = pos + ahead, all or none (a refusal names the sequence). */
static ppn_status reserve_ahead(ppn_seq *const *seqs, int n, int ahead, const char *fn)
{
    int *end = ppn_hcalloc((size_t)n, sizeof *end);
    if (!end) return ppn_err(PPN_ENOMEM, "%s: host out of memory for %d rows", fn, n);
    for (int i = 0; i < n; i++) end[i] = seqs[i]->pos + ahead;
    ppn_status st = ppn_kv_reserve(seqs, end, n);
    ppn_hfree(end);
    return st;
}

/* Rows fed, their in-flight room taken, then the walks: through the stages without waiting, or the unsplit walk
 * at once. */
static ppn_status issue_rows(ppn_model *m, ppn_bstep *b, ppn_seq *const *seqs, const int *tokens, int mb, int unsplit,
                             const ppn_batch_opts *o)
{
    int n = b->n;
    PPN_CHECK(reserve_ahead(seqs, n, 1, "ppn_decode_batch_deferred"));
    ppn_status st = ppn_map_reserve_batch(m, (n + mb - 1) / mb);
    if (st != PPN_OK) { /* the slots may be half rebuilt: the model is refused from here on, as ppn_decode_batch_ex */
        ppn_model_fail(m, st);
        return st;
    }
    PPN_CHECK(ppn_batch_plan_build(m, seqs, tokens, n, mb, b->logits, b->ids != NULL, o, &b->pl));
    for (int i = 0; i < n; i++) b->member[i] = 1;
    for (int k = 0; k < mb && !unsplit; k++) {
        b->own_row[k] = (int)((long)k * n / mb);
        b->own[k] = seqs[b->own_row[k]];
        b->member[b->own_row[k]] = 0;
    }
    for (int i = 0; i < n; i++) {
        seqs[i]->pos++;
        seqs[i]->issued += b->member[i];
    }
    b->issued = 1; /* from here a failure leaves caches half written: the model's failure, sticky */
    if (unsplit) {
        st = ppn_rows_run_unsplit(m, b->pl.cmds, mb);
        if (st != PPN_OK) ppn_model_fail(m, st), ppn_rows_quiesce(m);
        return st;
    }
    for (int k = 0; k < mb && st == PPN_OK; k++, b->n_walks++) st = ppn_step_issue_rows(&b->pl.cmds[k], &b->fly[k]);
    if (st != PPN_OK) ppn_model_fail(m, st);
    return st;
}

ppn_status ppn_decode_batch_deferred(ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *opts,
                                     float *logits, int *ids, ppn_step_id *out)
{
    static const char fn[] = "ppn_decode_batch_deferred";
    if (!out) return ppn_err(PPN_EINVAL, "%s: out is NULL", fn);
    *out = 0;
    ppn_batch_opts o = opts ? *opts : ppn_batch_opts_default();
    PPN_CHECK(ppn_batch_check(fn, seqs, tokens, n, &o, 1));
    if (o.n_prime)
        return ppn_err(PPN_EINVAL, "%s: prompt slices (n_prime %d) are fed by ppn_decode_batch_ex only", fn, o.n_prime);
    ppn_model *m = seqs[0]->m;
    int unsplit, mb;
    PPN_CHECK(ppn_batch_arm(m, fn, &o, n, &unsplit, &mb));
    ppn_bstep *b = bstep_new(n);
    if (!b) return ppn_err(PPN_ENOMEM, "%s: host out of memory for %d rows", fn, n);
    b->logits = logits;
    b->ids = ids;
    for (int i = 0; i < n; i++) b->seqs[i] = seqs[i], b->pos[i] = seqs[i]->pos;
    ppn_status st = n == 1 && !unsplit ? issue_single(b, tokens[0]) : issue_rows(m, b, seqs, tokens, mb, unsplit, &o);
    if (!b->issued) { /* refused before anything moved */
        bstep_free(m, b);
        return st;
    }
    b->st = st;
    b->id = (1ull << 63) | ++m->bstep_serial; /* never a ppn_pending_wait id: its ring field would be out of range */
    b->next = m->bsteps;
    m->bsteps = b;
    *out = b->id;
    return st;
}

static ppn_status wait_single(ppn_model *m, ppn_bstep *b)
{
    int on_device = b->ids && !b->logits;
    b->done[0] = 1;
    ppn_status st = ppn_pend_wait(b->own[0], b->fly[0], b->logits, on_device ? b->ids : NULL);
    if (b->st != PPN_OK) return b->st;
    if (st == PPN_OK && b->ids && b->logits) b->ids[0] = ppn_batch_argmax_rule(b->logits, m->cfg.vocab);
    if (st == PPN_OK) atomic_fetch_add_explicit(&m->batch_steps, 1, memory_order_relaxed);
    return st;
}

/* Every walk waited, every live row's room freed; then the ids copied out and the live rows checked (NaN or Inf:
 * named, the model's failure, as ppn_decode_batch_ex: the batch ran). */
static ppn_status wait_rows(ppn_model *m, ppn_bstep *b)
{
    ppn_status st = bstep_wait_walks(b);
    if (st != PPN_OK) ppn_rows_quiesce(m); /* a stage may still read the plan the step frees */
    for (int i = 0; i < b->n; i++)
        if (b->seqs[i] && b->member[i]) b->seqs[i]->waited++;
    if (st != PPN_OK) return st;
    ppn_gpu *g = m->rt->g;
    size_t v = (size_t)m->cfg.vocab;
    if (b->ids) g->ops->host_access(g, b->pl.ids_h, sizeof(int32_t) * (size_t)b->n, PPN_ACC_R, "batch ids readback");
    for (int i = 0; b->ids && i < b->n; i++) b->ids[i] = b->pl.ids_h[i];
    for (int i = 0; st == PPN_OK && i < b->n; i++)
        if (b->seqs[i])
            st = ppn_row_checked(m, "ppn_decode_batch_wait", b->seqs[i], b->pos[i], b->logits ? b->logits + (size_t)i * v : NULL,
                                 b->ids ? &b->pl.ids_h[i] : NULL);
    if (st == PPN_ENONFINITE) ppn_model_fail(m, st);
    if (st == PPN_OK) atomic_fetch_add_explicit(&m->batch_steps, 1, memory_order_relaxed);
    return st;
}

ppn_status ppn_decode_batch_wait(ppn_seq *s, ppn_step_id step)
{
    if (!s) return ppn_err(PPN_EINVAL, "ppn_decode_batch_wait: seq is NULL");
    ppn_model *m = s->m;
    PPN_CHECK(ppn_model_caller(m, "ppn_decode_batch_wait"));
    ppn_bstep **it = &m->bsteps;
    while (*it && (*it)->id != step) it = &(*it)->next;
    ppn_bstep *b = *it;
    if (!b || bstep_row_of(b, s) < 0)
        return ppn_err(PPN_EINVAL, "ppn_decode_batch_wait: step id %llu is not a batch step of sequence %d in flight "
                                   "(already waited, dropped by a reset or destroy of this sequence, or never issued)",
                       (unsigned long long)step, s->id);
    *it = b->next;
    ppn_status st = b->single ? wait_single(m, b) : wait_rows(m, b);
    bstep_free(m, b);
    return st;
}

/* Row i (q) leaves b. The walks are waited first: q's caches and ring entries may be released after this. An owner
 * row whose walk that wait retired keeps counting the step by its own pair, like every row, until the step is
 * waited. */
static void bstep_drop_row(ppn_bstep *b, int i, ppn_seq *q)
{
    (void)bstep_wait_walks(b); /* b->st keeps what it met */
    for (int k = 0; k < b->n_walks; k++) {
        int r = b->own_row[k];
        if (b->seqs[r] && !b->member[r]) b->member[r] = 1, b->seqs[r]->issued++;
    }
    b->seqs[i] = NULL;
    if (b->member[i]) q->waited++;
}

ppn_status ppn_bstep_drop_rows_of(ppn_seq *q)
{
    ppn_model *m = q->m;
    ppn_status st = PPN_OK;
    for (ppn_bstep **it = &m->bsteps; *it;) {
        ppn_bstep *b = *it;
        int i = bstep_row_of(b, q);
        if (i < 0) {
            it = &b->next;
            continue;
        }
        bstep_drop_row(b, i, q);
        if (st == PPN_OK) st = b->st;
        if (bstep_live(b)) {
            it = &b->next;
            continue;
        }
        *it = b->next;
        if (b->st != PPN_OK) ppn_rows_quiesce(m);
        bstep_free(m, b);
    }
    return st;
}

/* Greedy ----------------------------------------------------------------------------------------------------- */

typedef struct greedy {
    int n, mb, depth, dev;                 /* depth: plans (steps in flight); dev: where the head runs */
    ppn_batch_plan pl[PPN_MAX_INFLIGHT];
    ppn_dptr gtok[PPN_MAX_INFLIGHT];       /* micro-batch k's argmax, the next step's tokens */
} greedy;

/* The token blocks on the head's device, allocated on its model stream and finished before any stage uses them. */
static ppn_status greedy_alloc(ppn_model *m, greedy *g)
{
    for (int k = 0; k < g->mb; k++) {
        int rows = (int)((long)(k + 1) * g->n / g->mb) - (int)((long)k * g->n / g->mb);
        PPN_CHECK(ppn_model_block_alloc(m, g->dev, sizeof(int32_t) * (size_t)rows, "greedy batch tokens", &g->gtok[k]));
    }
    ppn_gstream *ds;
    PPN_CHECK(ppn_model_dev_stream(m, g->dev, &ds));
    return m->rt->g->ops->stream_sync(m->rt->g, ds);
}

/* Everything freed; the first failed device free returned. */
static ppn_status greedy_free(ppn_model *m, greedy *g)
{
    ppn_err_first first = {0};
    for (int k = 0; k < PPN_MAX_INFLIGHT; k++) ppn_err_first_add(&first, ppn_model_block_free(m, g->dev, &g->gtok[k]));
    for (int j = 0; j < g->depth; j++) ppn_batch_plan_free(m, &g->pl[j]);
    return ppn_err_first_done(&first);
}

/* Plan pl for the next step: positions now, and every micro-batch's argmax kept on the device; after the first
 * step its tokens are the argmax of the previous step's same micro-batch (prev: those walks; NULL on step 0). */
static void greedy_step_plan(ppn_model *m, greedy *g, ppn_seq *const *seqs, ppn_batch_plan *pl, const ppn_pend *prev,
                             int later)
{
    ppn_batch_plan_refill(m, seqs, pl);
    for (int k = 0; k < g->mb; k++) {
        ppn_step_cmd *c = &pl->cmds[k];
        c->gtok_out = g->gtok[k];
        c->gtok_dev = g->dev;
        c->gtok_in = later ? g->gtok[k] : 0;
        c->tok_ring = prev ? prev[k].ring : -1;
        c->tok_step = prev ? prev[k].step : 0;
    }
    for (int i = 0; i < g->n; i++) seqs[i]->pos++;
}

/* Step t's ids (plan pl, waited) into out; an id of -1 (every logit of the row NaN) is named and fails the model:
 * the steps after it were fed that row's -1 on the device. */
static ppn_status greedy_ids(ppn_model *m, const ppn_batch_plan *pl, ppn_seq *const *seqs, int t, int *out)
{
    ppn_gpu *g = m->rt->g;
    g->ops->host_access(g, pl->ids_h, sizeof(int32_t) * (size_t)pl->n, PPN_ACC_R, "batch greedy ids readback");
    for (int i = 0; i < pl->n; i++) {
        out[i] = pl->ids_h[i];
        if (out[i] >= 0) continue;
        char fn[96];
        snprintf(fn, sizeof fn, "ppn_decode_batch_greedy: row %d, step %d", i, t);
        ppn_status st = ppn_row_checked(m, fn, seqs[i], pl->segs[i].pos0, NULL, &pl->ids_h[i]);
        ppn_model_fail(m, st);
        return st;
    }
    return PPN_OK;
}

/* Through the stages: up to PPN_MAX_INFLIGHT steps in flight, every issued walk waited whatever fails. */
static ppn_status greedy_staged(ppn_model *m, greedy *g, ppn_seq *const *seqs, int steps, int *ids)
{
    ppn_pend fly[PPN_MAX_INFLIGHT][PPN_MAX_INFLIGHT];
    int nfly[PPN_MAX_INFLIGHT] = {0}, issued = 0, waited = 0;
    ppn_status st = PPN_OK;
    while (waited < issued || (st == PPN_OK && issued < steps)) {
        if (st == PPN_OK && issued < steps && issued - waited < g->depth) {
            int j = issued % g->depth;
            ppn_batch_plan *pl = &g->pl[j];
            greedy_step_plan(m, g, seqs, pl, issued ? fly[(issued - 1) % g->depth] : NULL, issued > 0);
            for (nfly[j] = 0; nfly[j] < g->mb && st == PPN_OK; nfly[j]++)
                st = ppn_step_issue_rows(&pl->cmds[nfly[j]], &fly[j][nfly[j]]);
            issued++;
        } else {
            int j = waited % g->depth;
            for (int k = 0; k < nfly[j]; k++) {
                ppn_status w = ppn_pend_wait(g->pl[j].cmds[k].seq, fly[j][k], NULL, NULL);
                if (st == PPN_OK) st = w;
            }
            if (st == PPN_OK) st = greedy_ids(m, &g->pl[j], seqs, waited, ids + (size_t)waited * (size_t)g->n);
            waited++;
        }
    }
    return st;
}

/* The unsplit walk: synchronous, one step at a time. */
static ppn_status greedy_unsplit(ppn_model *m, greedy *g, ppn_seq *const *seqs, int steps, int *ids)
{
    ppn_status st = PPN_OK;
    for (int t = 0; t < steps && st == PPN_OK; t++) {
        greedy_step_plan(m, g, seqs, &g->pl[0], NULL, t > 0);
        st = ppn_rows_run_unsplit(m, g->pl[0].cmds, g->mb);
        if (st == PPN_OK) st = greedy_ids(m, &g->pl[0], seqs, t, ids + (size_t)t * (size_t)g->n);
    }
    return st;
}

/* Checks for all steps, before anything is issued: the call's (as a batch's), positions left, and every KV block
 * the steps need reserved. */
static ppn_status greedy_checks(const char *fn, ppn_seq *const *seqs, const int *tokens, int n, int steps,
                                const ppn_batch_opts *o, int *ids)
{
    PPN_CHECK(ppn_batch_check(fn, seqs, tokens, n, o, 0));
    if (!ids || steps <= 0) return ppn_err(PPN_EINVAL, "%s: %s", fn, !ids ? "ids is NULL" : "steps must be positive");
    if (o->n_prime)
        return ppn_err(PPN_EINVAL, "%s: prompt slices (n_prime %d) are fed by ppn_decode_batch_ex only", fn, o->n_prime);
    ppn_model *m = seqs[0]->m;
    for (int i = 0; i < n; i++)
        if (steps > m->ctx - seqs[i]->pos)
            return ppn_err(PPN_ESTATE, "%s: row %d: %d steps from position %d exceed sequence %d's %d positions (ctx)",
                           fn, i, steps, seqs[i]->pos, seqs[i]->id, m->ctx);
    return PPN_OK;
}

ppn_status ppn_decode_batch_greedy(ppn_seq *const *seqs, const int *tokens, int n, int steps,
                                   const ppn_batch_opts *opts, int *ids)
{
    static const char fn[] = "ppn_decode_batch_greedy";
    ppn_batch_opts o = opts ? *opts : ppn_batch_opts_default();
    PPN_CHECK(greedy_checks(fn, seqs, tokens, n, steps, &o, ids));
    ppn_model *m = seqs[0]->m;
    int unsplit, mb;
    PPN_CHECK(ppn_batch_arm(m, fn, &o, n, &unsplit, &mb));
    ppn_status st;
    if (n == 1 && !unsplit) { /* a decode step per step, as ppn_decode_batch_ex issues a batch of one */
        st = ppn_decode_greedy(seqs[0], tokens[0], steps, ids);
    } else {
        PPN_CHECK(reserve_ahead(seqs, n, steps, fn)); /* all or none: running out is named before anything moves */
        st = ppn_map_reserve_batch(m, (n + mb - 1) / mb);
        if (st != PPN_OK) { /* the slots may be half rebuilt: the model is refused from here on */
            ppn_model_fail(m, st);
            return st;
        }
        const ppn_stage_map *map = m->map;
        greedy g = {.n = n, .mb = mb, .depth = unsplit ? 1 : (steps < PPN_MAX_INFLIGHT ? steps : PPN_MAX_INFLIGHT),
                    .dev = unsplit ? map->dev[0] : map->dev[map->n_stages - 1]};
        st = greedy_alloc(m, &g);
        for (int j = 0; j < g.depth && st == PPN_OK; j++)
            st = ppn_batch_plan_build(m, seqs, tokens, n, mb, NULL, 1, &o, &g.pl[j]);
        if (st == PPN_OK) { /* from here a failure leaves caches half written: the model's failure, sticky */
            st = unsplit ? greedy_unsplit(m, &g, seqs, steps, ids) : greedy_staged(m, &g, seqs, steps, ids);
            if (st != PPN_OK) ppn_model_fail(m, st), ppn_rows_quiesce(m);
        }
        ppn_err_first first = {0}; /* the loop's failure first, with its message; else a failed free's */
        ppn_err_first_add(&first, st);
        ppn_err_first_add(&first, greedy_free(m, &g));
        st = ppn_err_first_done(&first);
    }
    if (st == PPN_OK) {
        atomic_fetch_add_explicit(&m->batch_steps, (uint64_t)steps, memory_order_relaxed);
        atomic_fetch_add_explicit(&m->batch_greedy_steps, (uint64_t)steps, memory_order_relaxed);
    }
    return st;
}
