/* rows_run.c - running a list of many-rows walks (prefill chunks, a batch's micro-batches) to the end, the two
 * ways a call can take:
 *   staged   each walk issued as one step through the stages (the split, or the one stage), up to depth in flight
 *            so stage s + 1 works on walk k while stage s starts walk k + 1; every issued walk is waited (after a
 *            failure, every stage thread and stream too), so the caller owns nothing the stages still read when
 *            this returns;
 *   unsplit  every walk through every layer on stage 0's stream, reading weights and caches wherever they live:
 *            after every stage stream has drained (the other stages' caches were last written there) and
 *            synchronised before return (nothing later may overtake it). */
#include "core/rt.h"
#include "core/base/err.h"

/* After a failure: a walk's done generation may have been posted by a stage that gave up while an earlier
 * stage's thread still runs that walk (or the next one), reading the call's host descriptors, and its stream
 * still copies from the call's pinned memory. Wait for every command and every stage stream before the caller
 * frees them (errors here are ignored: the first failure is the one reported). Deferred batch steps call it too. */
void ppn_rows_quiesce(ppn_model *m)
{
    ppn_gpu *g = m->rt->g;
    (void)ppn_model_drain(m);
    for (int s = 0; s < m->map->n_stages; s++)
        if (m->stages[s].stream) (void)g->ops->stream_sync(g, m->stages[s].stream);
}

ppn_status ppn_rows_run_staged(ppn_model *m, const ppn_step_cmd *cmds, int n, int depth)
{
    ppn_pend fly[PPN_MAX_INFLIGHT];
    ppn_seq *own[PPN_MAX_INFLIGHT];
    int issued = 0, waited = 0;
    ppn_status st = PPN_OK;
    if (depth < 1) depth = 1;
    if (depth > PPN_MAX_INFLIGHT) depth = PPN_MAX_INFLIGHT;
    while (waited < issued || (st == PPN_OK && issued < n)) {
        if (st == PPN_OK && issued < n && issued - waited < depth) {
            const ppn_step_cmd *c = &cmds[issued];
            own[issued % PPN_MAX_INFLIGHT] = c->seq;
            st = ppn_step_issue_rows(c, &fly[issued % PPN_MAX_INFLIGHT]);
            issued++;
        } else {
            ppn_status w = ppn_pend_wait(own[waited % PPN_MAX_INFLIGHT], fly[waited % PPN_MAX_INFLIGHT], NULL, NULL);
            if (st == PPN_OK) st = w;
            waited++;
        }
    }
    if (st != PPN_OK) ppn_rows_quiesce(m);
    return st;
}

ppn_status ppn_rows_unsplit_reachable(ppn_model *m, const char *what, const char *alt)
{
    const ppn_stage_map *map = m->map;
    ppn_gpu *g = m->rt->g;
    for (int s = 1; s < map->n_stages; s++) {
        int can = 1;
        if (map->dev[s] != map->dev[0]) PPN_CHECK(g->ops->peer_can_access(g, map->dev[0], map->dev[s], &can));
        if (!can)
            return ppn_err(PPN_EUNSUPPORTED, "%s: the unsplit walk runs every layer on device %d, which cannot access "
                                             "device %d's weights and caches (no peer access); use %s", what,
                           map->dev[0], map->dev[s], alt);
    }
    return PPN_OK;
}

ppn_status ppn_rows_run_unsplit(ppn_model *m, const ppn_step_cmd *cmds, int n)
{
    ppn_gpu *g = m->rt->g;
    const ppn_stage_map *map = m->map;
    ppn_stage_rt *s0 = &m->stages[0];
    PPN_CHECK(ppn_model_drain(m));
    for (int k = 0; k < n; k++) PPN_CHECK(ppn_rows_inputs_unsplit(m, &cmds[k]));
    for (int s = 0; s < map->n_stages; s++) PPN_CHECK(g->ops->stream_sync(g, m->stages[s].stream));
    for (int k = 0; k < n; k++) {
        const ppn_step_cmd *c = &cmds[k];
        PPN_CHECK(ppn_rows_tokens(m, s0->stream, c));
        if (c->kind != PPN_ROWS_PRIME) PPN_CHECK(ppn_fwd_rows_lall(m, &s0->rs));
        PPN_CHECK(ppn_busy_begin(m, 0, s0->stream)); /* the whole trunk: stage 0's stream's busy time */
        PPN_CHECK(ppn_rows_body(m, s0->stream, map->dev[0], &s0->rs, s0->rs.io + PPN_IO_HDR_BYTES, c, 0,
                                m->cfg.n_layers, 1, 1));
        PPN_CHECK(ppn_busy_end(m, 0, s0->stream));
        ppn_gpu *gg = m->rt->g;
        size_t v = (size_t)m->cfg.vocab, nr = (size_t)(c->rows - c->brow0);
        if (c->logits_h) PPN_CHECK(gg->ops->copy_dtoh(gg, s0->stream, c->logits_h, s0->rs.lall, sizeof(float) * v * nr));
        if (c->ids_h) PPN_CHECK(gg->ops->copy_dtoh(gg, s0->stream, c->ids_h, s0->rs.ids, sizeof(int32_t) * nr));
        if (c->gtok_out) PPN_CHECK(gg->ops->copy_dtod(gg, s0->stream, c->gtok_out, s0->rs.ids, sizeof(int32_t) * nr));
    }
    return g->ops->stream_sync(g, s0->stream);
}
