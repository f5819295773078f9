/* spec.c - speculative decoding's verify step and rollback, and the prompt-lookup drafter.
 *
 * One verify feeds the sequence's next token and k draft tokens as k + 1 rows of one many-rows walk, takes every
 * row's argmax on the device, accepts the drafts greedily (draft j stands while it equals row j's argmax) and
 * rolls the rows past the last accepted one back on every owning stage (the sequence's position moves back;
 * their KV rows are overwritten by the next feed). With the door open the walk takes the stage split
 * (MEMRA_SPEC_PP=1, the default); MEMRA_SPEC_PP=0 walks every layer on stage 0's stream, refused under a sharded
 * cross-device placement unless MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 (the seed's rule for verify, as for batches). */
#include <stdatomic.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"

ppn_status ppn_seq_truncate(ppn_seq *q, int pos)
{
    if (!q) return ppn_err(PPN_EINVAL, "ppn_seq_truncate: seq is NULL");
    PPN_CHECK(ppn_model_caller(q->m, "ppn_seq_truncate"));
    if (pos < 0 || pos > q->pos)
        return ppn_err(PPN_EINVAL, "ppn_seq_truncate: position %d is outside 0 .. %d (sequence %d's length)", pos,
                       q->pos, q->id);
    ppn_status st = ppn_seq_drop_inflight(q);
    q->pos = pos;
    ppn_kv_release(q, pos);
    return st;
}

static ppn_status check_verify(ppn_seq *q, int token, const int *draft, int k, const int *out, const int *n_out)
{
    static const char fn[] = "ppn_spec_verify";
    if (!q || !out || !n_out || (k > 0 && !draft))
        return ppn_err(PPN_EINVAL, "%s: %s is NULL", fn, !q ? "seq" : !out ? "out" : !n_out ? "n_out" : "draft");
    if (k < 0 || k > PPN_SPEC_MAX_DRAFT)
        return ppn_err(PPN_EINVAL, "%s: k %d is outside 0 .. %d", fn, k, PPN_SPEC_MAX_DRAFT);
    ppn_model *m = q->m;
    PPN_CHECK(ppn_model_caller(m, fn));
    PPN_CHECK(ppn_step_checks(q, token));
    if (q->issued != q->waited)
        return ppn_err(PPN_ESTATE, "%s: sequence %d has deferred steps in flight: wait them first", fn, q->id);
    if (k + 1 > m->ctx - q->pos)
        return ppn_err(PPN_ESTATE, "%s: sequence %d: %d rows from position %d exceed its context of %d positions", fn,
                       q->id, k + 1, q->pos, m->ctx);
    for (int j = 0; j < k; j++)
        if (draft[j] < 0 || draft[j] >= m->cfg.vocab)
            return ppn_err(PPN_EINVAL, "%s: draft %d (id %d) is outside the vocabulary [0, %d)", fn, j, draft[j],
                           m->cfg.vocab);
    return PPN_OK;
}

ppn_status ppn_spec_verify(ppn_seq *q, int token, const int *draft, int k, int *out, int *n_out)
{
    PPN_CHECK(check_verify(q, token, draft, k, out, n_out));
    *n_out = 0;
    ppn_model *m = q->m;
    const ppn_stage_map *map = m->map;
    int unsplit = map->n_stages > 1 && (!map->door.streams || !map->door.spec_pp);
    if (unsplit) { /* refused before anything moves */
        PPN_CHECK(ppn_refuse_unsplit_if_remote(m, "ppn_spec_verify with MEMRA_SPEC_PP=0",
                                               "the verify split (MEMRA_SPEC_PP=1)"));
        PPN_CHECK(ppn_rows_unsplit_reachable(m, "ppn_spec_verify (MEMRA_SPEC_PP=0)", "the verify split"));
    }
    int rows = k + 1;
    PPN_CHECK(ppn_kv_reserve_one(q, q->pos + rows));
    ppn_status st = ppn_map_reserve_rows(m, rows);
    if (st != PPN_OK) { /* the slots may be half rebuilt: the model is refused from here on, cleanly */
        ppn_model_fail(m, st);
        return st;
    }
    int32_t *tok_h = NULL, *ids_h = NULL;
    /* ids in on stage 0's device, argmax ids out of the last stage's: each from that device's node */
    st = ppn_rt_pinned_alloc(m->rt, map->dev[0], sizeof(int32_t) * (size_t)rows, (void **)&tok_h);
    if (st == PPN_OK)
        st = ppn_rt_pinned_alloc(m->rt, map->dev[map->n_stages - 1], sizeof(int32_t) * (size_t)rows, (void **)&ids_h);
    if (st == PPN_OK) {
        ppn_gpu *g = m->rt->g;
        tok_h[0] = token;
        for (int j = 0; j < k; j++) tok_h[j + 1] = draft[j];
        /* the sim checks it against the copies out of this pinned memory's last owner */
        g->ops->host_access(g, tok_h, sizeof(int32_t) * (size_t)rows, PPN_ACC_W, "verify tokens");
        ppn_rowseg seg = {.seq = q, .pos0 = q->pos, .r0 = 0, .n = rows, .n_tbl = q->n_blk};
        ppn_step_cmd c = {.kind = PPN_ROWS_VERIFY, .seq = q, .rows = rows, .nseg = 1, .segs = &seg, .tok_h = tok_h,
                          .ids_h = ids_h};
        int pos0 = q->pos;
        q->pos += rows;
        st = unsplit ? ppn_rows_run_unsplit(m, &c, 1) : ppn_rows_run_staged(m, &c, 1, 1);
        if (st != PPN_OK) {
            ppn_model_fail(m, st);
        } else { /* the sim checks the read against the last stage's copy of the ids */
            g->ops->host_access(g, ids_h, sizeof(int32_t) * (size_t)rows, PPN_ACC_R, "verify ids readback");
            int acc = 0;
            while (acc < k && draft[acc] == ids_h[acc]) acc++;
            for (int j = 0; j <= acc; j++) out[j] = ids_h[j];
            *n_out = acc + 1;
            q->pos = pos0 + 1 + acc; /* the rejected rows roll back: blocks past the last accepted row go back */
            ppn_kv_release(q, q->pos);
            atomic_fetch_add_explicit(&m->spec_verifies, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&m->spec_drafted, (uint64_t)k, memory_order_relaxed);
            atomic_fetch_add_explicit(&m->spec_accepted, (uint64_t)acc, memory_order_relaxed);
            for (int j = 0; st == PPN_OK && j <= acc; j++) /* an id of -1: every logit of that row was NaN */
                st = ppn_row_checked(m, "ppn_spec_verify", q, pos0 + j, NULL, &ids_h[j]);
        }
    }
    ppn_pinned_free(m->rt->pinned, tok_h);
    ppn_pinned_free(m->rt->pinned, ids_h);
    return st;
}

/* Prompt lookup: the longest suffix of hist (ngram_max tokens down to 1) that also occurs earlier; the tokens
 * after its most recent earlier occurrence are the draft. */
int ppn_draft_lookup(const int *hist, int n, int k, int ngram_max, int *draft)
{
    if (!hist || !draft || n < 2 || k < 1 || ngram_max < 1) return 0;
    for (int g = ngram_max < n - 1 ? ngram_max : n - 1; g >= 1; g--) {
        const int *suf = hist + n - g;
        for (int at = n - g - 1; at >= 0; at--) { /* the match hist[at .. at + g) ends before the suffix starts */
            if (memcmp(hist + at, suf, sizeof(int) * (size_t)g) != 0) continue;
            int take = 0;
            while (take < k && at + g + take < n) draft[take] = hist[at + g + take], take++;
            if (take > 0) return take;
        }
    }
    return 0;
}
