/* batch.c - one decode step of many sequences in one forward: B rows (one per sequence, each at its own
 * position) walk the layers together, so every weight is read once for all of them (GEMMs over the B rows), and
 * each row's rotary, KV store and attention go to its own sequence's cache.
 *
 * Three ways through, chosen per step from the published map (the door is read per step: a gate A/Bs the arms
 * in one process by publishing another door):
 *   the split        (MEMRA_BATCH_PP=1, the default with the door open) the rows cut into micro-batches, each a
 *                    many-rows walk through the stages with the ev_tx/ev_rx chain: with the stages on several
 *                    devices, one micro-batch per device is in flight at once, so stage s works on micro-batch
 *                    k + 1 while stage s + 1 works on k (GPipe-style); on one device, one micro-batch (more would
 *                    read every weight once per micro-batch for no overlap);
 *   the one stage    the same walk, the door shut;
 *   the unsplit walk (MEMRA_BATCH_PP=0, or MEMRA_PP_STREAMS=0) every layer on stage 0's stream: refused when the
 *                    weights are sharded over several devices (the seed's 28x peer-read regime) unless
 *                    MEMRA_PP_ALLOW_UNSPLIT_BATCH=1, which is for measurement.
 * A mixed step (ppn_batch_opts.n_prime) also feeds prompt slices: their rows first, then the decode rows, one
 * walk (PPN_ROWS_MIXED) that reads each weight once for all of them: chunked prefill beside running decodes. Its
 * prompt segments take the prefill chunk's attention, its decode rows the batch's.
 * The head computes every row's logits with one GEMM and, for greedy steps, their argmax on the device: the host
 * reads back B ids, never the logits. A batch of one on the split (or one stage) is a decode step: it goes through
 * ppn_decode_step / ppn_decode_greedy (the matvec kernels, which read the weights at the bandwidth floor where the
 * GEMMs of one row do not). */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"

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

/* ppn_op_argmax_rows's rule on the host (rt.h): the lowest index of the largest value, -1 when any is NaN or
 * infinite. */
int ppn_batch_argmax_rule(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i])) return -1;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

ppn_batch_opts ppn_batch_opts_default(void) { return (ppn_batch_opts){.micro = 0, .n_prime = 0}; }

/* Distinct devices among the map's stages. */
static int map_devices(const ppn_stage_map *map)
{
    int n = 0;
    for (int s = 0; s < map->n_stages; s++) {
        int seen = 0;
        for (int t = 0; t < s && !seen; t++) seen = map->dev[t] == map->dev[s];
        n += !seen;
    }
    return n;
}

/* A mixed step's prompt slices: each a distinct sequence of the model, none a decode row's, its ids in the
 * vocabulary and within its context; all rows together within PPN_PREFILL_MAX_CHUNK. */
static ppn_status check_prime(const char *fn, ppn_model *m, ppn_seq *const *seqs, int n, const ppn_batch_opts *o)
{
    if (o->n_prime < 0) return ppn_err(PPN_EINVAL, "%s: n_prime %d is negative", fn, o->n_prime);
    if (!o->n_prime) return PPN_OK;
    if (!o->prime_seqs || !o->prime_ids || !o->prime_n)
        return ppn_err(PPN_EINVAL, "%s: n_prime %d with NULL prime_seqs, prime_ids or prime_n", fn, o->n_prime);
    if (o->micro > 1)
        return ppn_err(PPN_EINVAL, "%s: a mixed step is one walk: micro %d with prompt slices", fn, o->micro);
    long rows = n;
    for (int i = 0; i < o->n_prime; i++) {
        ppn_seq *q = o->prime_seqs[i];
        int k = o->prime_n[i];
        if (!q || !o->prime_ids[i] || k < 1)
            return ppn_err(PPN_EINVAL, "%s: prompt slice %d: %s", fn, i, !q ? "NULL sequence" : !o->prime_ids[i]
                                                                            ? "NULL ids" : "no ids");
        if (q->m != m) return ppn_err(PPN_EINVAL, "%s: prompt slice %d: a sequence of another model", fn, i);
        for (int j = 0; j < n; j++)
            if (seqs[j] == q)
                return ppn_err(PPN_EINVAL, "%s: sequence %d is both decode row %d and prompt slice %d", fn, q->id,
                               j, i);
        for (int j = 0; j < i; j++)
            if (o->prime_seqs[j] == q)
                return ppn_err(PPN_EINVAL, "%s: sequence %d is prompt slices %d and %d", fn, q->id, j, i);
        if (q->issued != q->waited)
            return ppn_err(PPN_ESTATE, "%s: prompt slice %d: sequence %d has deferred steps in flight", fn, i, q->id);
        if (k > m->ctx - q->pos)
            return ppn_err(PPN_ESTATE, "%s: prompt slice %d: %d ids from position %d exceed sequence %d's context of "
                                       "%d positions", fn, i, k, q->pos, q->id, m->ctx);
        for (int t = 0; t < k; t++)
            if (o->prime_ids[i][t] < 0 || o->prime_ids[i][t] >= m->cfg.vocab)
                return ppn_err(PPN_EINVAL, "%s: prompt slice %d, id %d at %d is outside the vocabulary [0, %d)", fn,
                               i, o->prime_ids[i][t], t, m->cfg.vocab);
        rows += k;
    }
    if (rows > PPN_PREFILL_MAX_CHUNK)
        return ppn_err(PPN_EINVAL, "%s: %ld rows (%d decode, the rest prompt) exceed PPN_PREFILL_MAX_CHUNK (%d)", fn,
                       rows, n, PPN_PREFILL_MAX_CHUNK);
    return PPN_OK;
}

ppn_status ppn_batch_check(const char *fn, ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *o,
                           int inflight_ok)
{
    if (!seqs || !tokens || n <= 0)
        return ppn_err(PPN_EINVAL, "%s: %s", fn, n <= 0 ? "n must be positive" : "NULL seqs or tokens");
    if (o->micro < 0 || o->micro > PPN_MAX_INFLIGHT)
        return ppn_err(PPN_EINVAL, "%s: micro %d is outside 0 .. %d", fn, o->micro, PPN_MAX_INFLIGHT);
    if (!seqs[0]) return ppn_err(PPN_EINVAL, "%s: sequence 0 is NULL", fn);
    ppn_model *m = seqs[0]->m;
    PPN_CHECK(ppn_model_caller(m, fn));
    PPN_CHECK(ppn_model_failed(m));
    for (int i = 0; i < n; i++) {
        ppn_seq *q = seqs[i];
        if (!q) return ppn_err(PPN_EINVAL, "%s: sequence %d is NULL", fn, i);
        if (q->m != m) return ppn_err(PPN_EINVAL, "%s: sequences of different models (row %d)", fn, i);
        for (int k = 0; k < i; k++)
            if (seqs[k] == q) return ppn_err(PPN_EINVAL, "%s: sequence %d appears twice (rows %d and %d)", fn, q->id, k, i);
        if (q->issued != q->waited && !inflight_ok)
            return ppn_err(PPN_ESTATE, "%s: sequence %d has deferred steps in flight: wait them first", fn, q->id);
        ppn_status st = ppn_step_checks(q, tokens[i]);
        if (st != PPN_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", ppn_last_error());
            return ppn_err(st, "%s: row %d: %s", fn, i, why);
        }
    }
    return check_prime(fn, m, seqs, n, o);
}

/* Row i of micro-batch [r0, r1) on each stage: its position, its table on that stage's device. */
static void plan_ksegs(ppn_model *m, ppn_seq *const *seqs, ppn_batch_plan *pl, int r0, int r1)
{
    int ns = m->map->n_stages;
    ppn_kseg *k0 = pl->ksegs + (size_t)ns * (size_t)r0;
    for (int i = r0; i < r1; i++)
        for (int s = 0; s < ns; s++)
            k0[(size_t)s * (size_t)(r1 - r0) + (size_t)(i - r0)] =
                (ppn_kseg){.pos = seqs[i]->pos, .tbl = seqs[i]->scr[s].kvt};
    /* the sim checks them against the copies out of this pinned memory: the last owner's, or the last step's */
    ppn_gpu *g = m->rt->g;
    g->ops->host_access(g, k0, sizeof(ppn_kseg) * (size_t)ns * (size_t)(r1 - r0), PPN_ACC_W, "batch row descriptors");
}

ppn_status ppn_batch_plan_build(ppn_model *m, ppn_seq *const *seqs, const int *tokens, int n, int mb, float *logits,
                                int want_ids, const ppn_batch_opts *o, ppn_batch_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->mb = mb;
    pl->n = n;
    const ppn_stage_map *map = m->map;
    int ns = map->n_stages, np = o->n_prime, P = 0;
    for (int i = 0; i < np; i++) P += o->prime_n[i];
    pl->segs = ppn_hcalloc((size_t)(n + np), sizeof *pl->segs);
    pl->tbl_hs = ppn_hcalloc((size_t)n, sizeof *pl->tbl_hs);
    pl->n_tbls = ppn_hcalloc((size_t)n, sizeof *pl->n_tbls);
    if (!pl->segs || !pl->tbl_hs || !pl->n_tbls)
        return ppn_err(PPN_ENOMEM, "ppn_decode_batch: host out of memory for %d rows", n);
    /* host memory on the node of the device that reads it (docs/PIPELINE.md): the tokens stage 0's, the ids the
     * last stage's; the row descriptors every stage's (one slice each), so the unbound arena */
    PPN_CHECK(ppn_rt_pinned_alloc(m->rt, map->dev[0], sizeof(int32_t) * (size_t)(P + n), (void **)&pl->tok_h));
    PPN_CHECK(ppn_pinned_alloc(m->rt->pinned, sizeof(ppn_kseg) * (size_t)n * (size_t)ns, (void **)&pl->ksegs));
    if (want_ids)
        PPN_CHECK(ppn_rt_pinned_alloc(m->rt, map->dev[ns - 1], sizeof(int32_t) * (size_t)n, (void **)&pl->ids_h));
    for (int i = 0, r = 0; i < np; r += o->prime_n[i], i++) {
        ppn_seq *q = o->prime_seqs[i];
        memcpy(pl->tok_h + r, o->prime_ids[i], sizeof(int32_t) * (size_t)o->prime_n[i]);
        pl->segs[i] = (ppn_rowseg){.seq = q, .pos0 = q->pos, .r0 = r, .n = o->prime_n[i], .n_tbl = q->n_blk,
                                   .out = o->prime_logits ? o->prime_logits[i] : NULL};
    }
    int32_t *tok_h = pl->tok_h + P;
    ppn_rowseg *segs = pl->segs + np;
    for (int i = 0; i < n; i++) {
        ppn_seq *q = seqs[i];
        tok_h[i] = tokens[i];
        segs[i] = (ppn_rowseg){.seq = q, .pos0 = q->pos, .n = 1, .n_tbl = q->n_blk};
        pl->tbl_hs[i] = q->tbl_h;
        pl->n_tbls[i] = q->n_blk;
    }
    /* the sim checks the slices' and rows' tokens against the copies out of this pinned memory's last owner */
    ppn_gpu *g = m->rt->g;
    g->ops->host_access(g, pl->tok_h, sizeof(int32_t) * (size_t)(P + n), PPN_ACC_W, "batch tokens");
    size_t vocab = (size_t)m->cfg.vocab;
    for (int k = 0; k < mb; k++) {
        int r0 = (int)((long)k * n / mb), r1 = (int)((long)(k + 1) * n / mb);
        ppn_step_cmd *c = &pl->cmds[k];
        c->kind = np ? PPN_ROWS_MIXED : PPN_ROWS_BATCH;
        c->brow0 = P; /* 0 unless mixed, which is one walk (mb 1) */
        c->rows = P + r1 - r0;
        c->nseg = np + r1 - r0;
        c->segs = np ? pl->segs : segs + r0;
        c->tok_h = np ? pl->tok_h : tok_h + r0;
        c->seq = c->segs[0].seq; /* its ring entry marks the walk's end */
        c->logits_h = logits ? logits + (size_t)r0 * vocab : NULL;
        c->ids_h = pl->ids_h ? pl->ids_h + r0 : NULL;
        c->tbl_hs = pl->tbl_hs + r0;
        c->n_tbls = pl->n_tbls + r0;
        c->ksegs_h = pl->ksegs + (size_t)ns * (size_t)r0;
        for (int i = r0; i < r1; i++) segs[i].r0 = P + i - r0;
        plan_ksegs(m, seqs, pl, r0, r1);
    }
    return PPN_OK;
}

void ppn_batch_plan_refill(ppn_model *m, ppn_seq *const *seqs, ppn_batch_plan *pl)
{
    for (int i = 0; i < pl->n; i++) pl->segs[i].pos0 = seqs[i]->pos;
    for (int k = 0; k < pl->mb; k++)
        plan_ksegs(m, seqs, pl, (int)((long)k * pl->n / pl->mb), (int)((long)(k + 1) * pl->n / pl->mb));
}

void ppn_batch_plan_free(ppn_model *m, ppn_batch_plan *pl)
{
    ppn_hfree(pl->segs);
    ppn_hfree(pl->tbl_hs);
    ppn_hfree(pl->n_tbls);
    ppn_pinned_free(m->rt->pinned, pl->ksegs);
    ppn_pinned_free(m->rt->pinned, pl->tok_h);
    ppn_pinned_free(m->rt->pinned, pl->ids_h);
}

ppn_status ppn_batch_arm(ppn_model *m, const char *fn, const ppn_batch_opts *o, int n, int *unsplit, int *mb)
{
    const ppn_stage_map *map = m->map;
    *unsplit = map->n_stages > 1 && (!map->door.streams || !map->door.batch_pp);
    if (*unsplit) { /* refused before anything moves */
        char what[96];
        snprintf(what, sizeof what, "%s with MEMRA_BATCH_PP=0", fn);
        PPN_CHECK(ppn_refuse_unsplit_if_remote(m, what, "the batched split (MEMRA_BATCH_PP=1)"));
        snprintf(what, sizeof what, "%s (MEMRA_BATCH_PP=0)", fn);
        PPN_CHECK(ppn_rows_unsplit_reachable(m, what, "the batched split"));
    }
    *mb = o->micro ? o->micro : (*unsplit || o->n_prime ? 1 : map_devices(map));
    if (*mb > PPN_MAX_INFLIGHT) *mb = PPN_MAX_INFLIGHT;
    if (*mb > n) *mb = n;
    return PPN_OK;
}

ppn_status ppn_decode_batch_ex(ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *opts,
                               float *logits, int *ids)
{
    ppn_batch_opts o = opts ? *opts : ppn_batch_opts_default();
    PPN_CHECK(ppn_batch_check("ppn_decode_batch", seqs, tokens, n, &o, 0));
    ppn_model *m = seqs[0]->m;
    int unsplit, mb;
    PPN_CHECK(ppn_batch_arm(m, "ppn_decode_batch", &o, n, &unsplit, &mb));
    int np = o.n_prime, P = 0;
    for (int i = 0; i < np; i++) P += o.prime_n[i];
    if (n == 1 && !unsplit && !np) { /* a decode step; with logits and ids both, the ids are their argmax (the rule) */
        ppn_status st = ids && !logits ? ppn_decode_greedy(seqs[0], tokens[0], 1, ids)
                                       : ppn_decode_step(seqs[0], tokens[0], logits);
        if (st == PPN_OK && ids && logits) ids[0] = ppn_batch_argmax_rule(logits, m->cfg.vocab);
        if (st == PPN_OK) atomic_fetch_add_explicit(&m->batch_steps, 1, memory_order_relaxed);
        return st;
    }
    int *end = ppn_hcalloc((size_t)(n + np), sizeof *end);
    ppn_seq **all = ppn_hcalloc((size_t)(n + np), sizeof *all);
    if (!end || !all) {
        ppn_hfree(end);
        ppn_hfree(all);
        return ppn_err(PPN_ENOMEM, "ppn_decode_batch: host out of memory for %d rows", n + np);
    }
    for (int i = 0; i < n; i++) all[i] = seqs[i], end[i] = seqs[i]->pos + 1;
    for (int i = 0; i < np; i++) all[n + i] = o.prime_seqs[i], end[n + i] = o.prime_seqs[i]->pos + o.prime_n[i];
    ppn_status st = ppn_kv_reserve(all, end, n + np); /* all or none: a refusal names the sequence, nothing moved */
    ppn_hfree(end);
    ppn_hfree(all);
    PPN_CHECK(st);
    st = np ? ppn_map_reserve_rows(m, P + n) : PPN_OK;
    if (st == PPN_OK) st = ppn_map_reserve_batch(m, (n + mb - 1) / mb);
    if (st != PPN_OK) { /* the slots may be half rebuilt: the model is refused from here on, cleanly */
        ppn_model_fail(m, st);
        return st;
    }
    ppn_batch_plan pl;
    st = ppn_batch_plan_build(m, seqs, tokens, n, mb, logits, ids != NULL, &o, &pl);
    if (st == PPN_OK) { /* from here a failure leaves caches half written: the model's failure, sticky */
        for (int i = 0; i < n; i++) seqs[i]->pos++;
        for (int i = 0; i < np; i++) o.prime_seqs[i]->pos += o.prime_n[i];
        st = unsplit ? ppn_rows_run_unsplit(m, pl.cmds, mb) : ppn_rows_run_staged(m, pl.cmds, mb, mb);
        if (st != PPN_OK) ppn_model_fail(m, st);
        else atomic_fetch_add_explicit(np ? &m->mixed_steps : &m->batch_steps, 1, memory_order_relaxed);
        if (st == PPN_OK && ids) { /* the sim checks the read against the last stage's copy of the ids */
            m->rt->g->ops->host_access(m->rt->g, pl.ids_h, sizeof(int32_t) * (size_t)n, PPN_ACC_R,
                                       "batch ids readback");
            for (int i = 0; i < n; i++) ids[i] = pl.ids_h[i];
        }
        for (int i = 0; st == PPN_OK && i < n; i++) /* NaN or Inf: named, the model's failure (the batch ran) */
            st = ppn_row_checked(m, "ppn_decode_batch", seqs[i], seqs[i]->pos - 1,
                                 logits ? logits + (size_t)i * (size_t)m->cfg.vocab : NULL, ids ? &pl.ids_h[i] : NULL);
        for (int i = 0; st == PPN_OK && o.prime_logits && i < np; i++) /* the slices' last rows alike */
            if (o.prime_logits[i])
                st = ppn_row_checked(m, "ppn_decode_batch (prompt slice)", o.prime_seqs[i], o.prime_seqs[i]->pos - 1,
                                     o.prime_logits[i], NULL);
        if (st == PPN_ENONFINITE) ppn_model_fail(m, st);
    }
    ppn_batch_plan_free(m, &pl);
    return st;
}

ppn_status ppn_decode_batch(ppn_seq **seqs, const int *tokens, int n, float *logits)
{
    return ppn_decode_batch_ex(seqs, tokens, n, NULL, logits, NULL);
}
