/* prefill.c - prompts many rows at a time: the prompt (or several sequences' prompts) cut into chunks of up to
 * C rows, each chunk one walk through the layers with the many-rows ops (GEMMs that read each weight once for
 * all rows, causal attention over the cache), its K/V written on each owning stage.
 *
 * Three ways through, chosen per call from the published map:
 *   one stage        the chunk's walk on the caller's thread, as a decode step is;
 *   the split        (MEMRA_PRIME_PP=1, the default with the door open) each chunk walks stage s's layers on
 *                    stage s's stream and crosses the boundaries as [rows, dim] with the ev_tx/ev_rx chain; with
 *                    MEMRA_PRIME_PIPE=1 (default) up to PPN_MAX_INFLIGHT chunks are in flight, so chunk c + 1
 *                    enters stage 0 while chunk c is on stage 1; MEMRA_PRIME_PIPE=0 waits for each chunk;
 *   the unsplit walk (MEMRA_PRIME_PP=0, or MEMRA_PP_STREAMS=0) every layer on stage 0's stream, reading the weights
 *                    and caches wherever they live: the gate's reference arm, kept callable across devices.
 * Every chunk's rows, segment list and token ids live in host memory this call owns until its last chunk is
 * done; the logits reach the caller's buffer through copies ordered before the last chunk's done event. */
#include <string.h>
#include "core/base/dtype.h"
#include "core/rt.h"
#include "core/base/err.h"

ppn_prefill_opts ppn_prefill_opts_default(void) { return (ppn_prefill_opts){.chunk = 0, .all_logits = 0}; }

/* The call's chunks: cmds[k] covers rows of segs, its token ids in tok_h (pinned). */
typedef struct prime_plan {
    ppn_step_cmd *cmds;
    ppn_rowseg *segs;
    int32_t *tok_h;
    int n_cmds, rows;
} prime_plan;

static void plan_free(ppn_model *m, prime_plan *pl)
{
    ppn_hfree(pl->cmds);
    ppn_hfree(pl->segs);
    ppn_pinned_free(m->rt->pinned, pl->tok_h);
}

/* Where segment (prompt i, its rows j .. j + take) puts logits: every row's at the prompt's rows of out, or the
 * last row's at out's entry i when the segment holds the prompt's last row. */
static float *seg_out(float *out, int all, size_t vocab, int i, int base_row, int j, int take, int n_i)
{
    if (!out) return NULL;
    if (all) return out + (size_t)(base_row + j) * vocab;
    return j + take == n_i ? out + (size_t)i * vocab : NULL;
}

/* Cut the prompts into chunks of up to chunk rows, in prompt order. */
static ppn_status plan_build(ppn_model *m, ppn_seq *const *seqs, const int *const *ids, const int *n, int count,
                             int chunk, const ppn_prefill_opts *o, float *logits, prime_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    for (int i = 0; i < count; i++) pl->rows += n[i];
    int max_cmds = (pl->rows + chunk - 1) / chunk;
    pl->cmds = ppn_hcalloc((size_t)max_cmds, sizeof *pl->cmds);
    pl->segs = ppn_hcalloc((size_t)(max_cmds + count), sizeof *pl->segs);
    if (!pl->cmds || !pl->segs) return ppn_err(PPN_ENOMEM, "prefill: host out of memory for %d chunks", max_cmds);
    PPN_CHECK(ppn_rt_pinned_alloc(m->rt, m->map->dev[0], sizeof(int32_t) * (size_t)pl->rows, (void **)&pl->tok_h));
    size_t vocab = (size_t)m->cfg.vocab;
    ppn_gpu *g = m->rt->g;
    int i = 0, j = 0, row = 0, base = 0, nseg = 0;
    while (row < pl->rows) {
        ppn_step_cmd *c = &pl->cmds[pl->n_cmds++];
        c->rows = pl->rows - row < chunk ? pl->rows - row : chunk;
        c->segs = &pl->segs[nseg];
        c->tok_h = pl->tok_h + row;
        for (int r = 0; r < c->rows;) {
            int take = n[i] - j < c->rows - r ? n[i] - j : c->rows - r;
            pl->segs[nseg++] = (ppn_rowseg){.seq = seqs[i], .pos0 = seqs[i]->pos + j, .r0 = r, .n = take,
                                            .n_tbl = seqs[i]->n_blk,
                                            .out = seg_out(logits, o->all_logits, vocab, i, base, j, take, n[i]),
                                            .all_rows = o->all_logits};
            memcpy(pl->tok_h + row + r, ids[i] + j, sizeof(int32_t) * (size_t)take);
            /* the sim checks it against the copies out of this pinned memory's last owner */
            g->ops->host_access(g, pl->tok_h + row + r, sizeof(int32_t) * (size_t)take, PPN_ACC_W, "prefill tokens");
            c->nseg++;
            r += take;
            j += take;
            if (j == n[i]) base += n[i], i++, j = 0;
        }
        c->seq = c->segs[0].seq; /* its ring entry marks the chunk's end */
        row += c->rows;
    }
    return PPN_OK;
}

static ppn_status check_seq(const ppn_model *m, ppn_seq *const *seqs, const int *const *ids, const int *n, int i)
{
    const ppn_seq *q = seqs[i];
    if (!q || !ids[i] || n[i] < 1)
        return ppn_err(PPN_EINVAL, "prefill: prompt %d: %s", i, !q ? "seq is NULL" : !ids[i] ? "ids is NULL" : "no ids");
    if (q->m != m) return ppn_err(PPN_EINVAL, "prefill: prompt %d's sequence belongs to another model", i);
    for (int k = 0; k < i; k++)
        if (seqs[k] == q) return ppn_err(PPN_EINVAL, "prefill: sequence %d appears twice (prompts %d and %d)", q->id, k, i);
    if (q->issued != q->waited)
        return ppn_err(PPN_ESTATE, "prefill: sequence %d has deferred steps in flight: wait them first", q->id);
    if (n[i] > m->ctx - q->pos)
        return ppn_err(PPN_ESTATE, "prefill: sequence %d: %d prompt ids from position %d exceed its context of %d "
                                   "positions", q->id, n[i], q->pos, m->ctx);
    for (int t = 0; t < n[i]; t++)
        if (ids[i][t] < 0 || ids[i][t] >= m->cfg.vocab)
            return ppn_err(PPN_EINVAL, "prefill: prompt %d, id %d at %d is outside the vocabulary [0, %d)", i,
                           ids[i][t], t, m->cfg.vocab);
    return PPN_OK;
}

static ppn_status check_call(ppn_seq *const *seqs, const int *const *ids, const int *n, int count,
                             const ppn_prefill_opts *o)
{
    if (!seqs || !ids || !n || count < 1)
        return ppn_err(PPN_EINVAL, "prefill: %s", count < 1 ? "no prompts" : "NULL argument");
    if (!seqs[0]) return ppn_err(PPN_EINVAL, "prefill: prompt 0: seq is NULL");
    ppn_model *m = seqs[0]->m;
    PPN_CHECK(ppn_model_caller(m, "ppn_prefill"));
    PPN_CHECK(ppn_model_failed(m));
    if (o->chunk < 0 || o->chunk > PPN_PREFILL_MAX_CHUNK)
        return ppn_err(PPN_EINVAL, "prefill: chunk %d is outside 0 .. %d (0: %d)", o->chunk, PPN_PREFILL_MAX_CHUNK,
                       PPN_PREFILL_CHUNK);
    for (int i = 0; i < count; i++) PPN_CHECK(check_seq(m, seqs, ids, n, i));
    return PPN_OK;
}

/* The logits prefill wrote (each prompt's last row, or all_logits: every row, prompts in order), checked once
 * the walks are done: NaN or Inf is PPN_ENONFINITE naming the prompt, its sequence and the row's position. The
 * sequences' positions have advanced past the prompts already. */
static ppn_status logits_checked(ppn_model *m, ppn_seq *const *seqs, const int *n, int count, int all,
                                 const float *logits)
{
    size_t v = (size_t)m->cfg.vocab;
    const float *row = logits;
    for (int i = 0; i < count; i++) {
        int rows = all ? n[i] : 1, pos0 = seqs[i]->pos - rows;
        for (int r = 0; r < rows; r++, row += v) {
            if (!ppn_copy_nonfinite(NULL, row, v, PPN_DTYPE_F32)) continue; /* vectorised: a memcpy's cost */
            size_t j = ppn_logits_first_nonfinite(row, v);
            char what[128];
            snprintf(what, sizeof what, "prefill: prompt %d (sequence %d), the row at position %d", i, seqs[i]->id,
                     pos0 + r);
            return ppn_logits_nonfinite(m, what, j, row[j]);
        }
    }
    return PPN_OK;
}

ppn_status ppn_prefill_batch(ppn_seq *const *seqs, const int *const *ids, const int *n, int count,
                             const ppn_prefill_opts *opts, float *logits)
{
    ppn_prefill_opts o = opts ? *opts : ppn_prefill_opts_default();
    PPN_CHECK(check_call(seqs, ids, n, count, &o));
    ppn_model *m = seqs[0]->m;
    const ppn_stage_map *map = m->map;
    int total = 0;
    for (int i = 0; i < count; i++) total += n[i];
    int chunk = o.chunk ? o.chunk : PPN_PREFILL_CHUNK;
    if (chunk > total) chunk = total;
    int unsplit = map->n_stages > 1 && (!map->door.streams || !map->door.prime_pp);
    if (unsplit) /* refused before anything moves */
        PPN_CHECK(ppn_rows_unsplit_reachable(m, "prefill (MEMRA_PRIME_PP=0)", "the split (MEMRA_PRIME_PP=1)"));
    int *end = ppn_hcalloc((size_t)count, sizeof *end);
    if (!end) return ppn_err(PPN_ENOMEM, "prefill: host out of memory");
    for (int i = 0; i < count; i++) end[i] = seqs[i]->pos + n[i];
    ppn_status kst = ppn_kv_reserve(seqs, end, count); /* all or none: a refusal names the sequence */
    ppn_hfree(end);
    PPN_CHECK(kst);
    ppn_status st = ppn_map_reserve_rows(m, chunk);
    if (st != PPN_OK) { /* the slots may be half rebuilt: the model is refused from here on, cleanly */
        ppn_model_fail(m, st);
        return st;
    }
    prime_plan pl;
    st = plan_build(m, seqs, ids, n, count, chunk, &o, logits, &pl);
    if (st == PPN_OK) { /* from here a failure leaves caches half written: the model's failure, sticky */
        for (int i = 0; i < count; i++) seqs[i]->pos += n[i];
        st = unsplit ? ppn_rows_run_unsplit(m, pl.cmds, pl.n_cmds)
                     : ppn_rows_run_staged(m, pl.cmds, pl.n_cmds, map->door.prime_pipe ? PPN_MAX_INFLIGHT : 1);
        if (st != PPN_OK) ppn_model_fail(m, st);
        else if (count > 1) atomic_fetch_add_explicit(&m->prime_batches, 1, memory_order_relaxed);
    }
    plan_free(m, &pl);
    if (st == PPN_OK && logits) st = logits_checked(m, seqs, n, count, o.all_logits, logits);
    /* several prompts ran together: a caller cannot retry some of them alone, so the failure is the model's */
    if (st == PPN_ENONFINITE && count > 1) ppn_model_fail(m, st);
    return st;
}

ppn_status ppn_prefill(ppn_seq *s, const int *ids, int n, const ppn_prefill_opts *o, float *logits)
{
    return ppn_prefill_batch(&s, &ids, &n, 1, o, logits);
}
