/* pending.c - the caller's side of deferred steps: a step drained through the dedicated readback stream (or
 * dropped), greedy decode with the argmax on the device, and the eager step (issue, then drain at once). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/dtype.h"
#include "core/base/err.h"

/* Non-finite logits ------------------------------------------------------------------------------------ */

size_t ppn_logits_first_nonfinite(const float *x, size_t n) { return ppn_first_nonfinite(x, n, PPN_DTYPE_F32); }

ppn_status ppn_logits_nonfinite(const ppn_model *m, const char *what, size_t i, float v)
{
    const ppn_stage_map *map = m->map;
    int s = map->n_stages - 1;
    return ppn_err(PPN_ENONFINITE, "%s: the logits are not finite (logits[%zu] = %g), computed by stage %d of %d "
                   "(layers %d-%d, the final norm and the head): NaN or Inf weights, or a config value that "
                   "overflows", what, i, (double)v, s, map->n_stages, map->fence[s], map->fence[s + 1] - 1);
}

static ppn_status argmax_nan(const ppn_model *m, const char *what)
{
    return ppn_err(PPN_ENONFINITE, "%s: the device argmax found a logit that is NaN or infinite, computed by stage "
                   "%d of %d (the final norm and the head): NaN or Inf weights, or a config value that overflows", what,
                   m->map->n_stages - 1, m->map->n_stages);
}

ppn_status ppn_row_checked(const ppn_model *m, const char *fn, const ppn_seq *q, int pos, const float *logits,
                           const int32_t *id)
{
    size_t v = (size_t)m->cfg.vocab;
    if ((!logits || !ppn_copy_nonfinite(NULL, logits, v, PPN_DTYPE_F32)) && (!id || *id >= 0)) return PPN_OK;
    char what[160];
    snprintf(what, sizeof what, "%s: sequence %d, the row at position %d", fn, q->id, pos);
    if (!logits || !ppn_copy_nonfinite(NULL, logits, v, PPN_DTYPE_F32)) return argmax_nan(m, what);
    size_t i = ppn_logits_first_nonfinite(logits, v);
    return ppn_logits_nonfinite(m, what, i, logits[i]);
}

/* The step on ring entry ring of q, for messages. */
static void step_name(const ppn_seq *q, int ring, char *buf, size_t cap)
{
    snprintf(buf, cap, "sequence %d, the step at position %d", q->id, q->ring_pos[ring]);
}

/* The readback of a step of q: its logits row copied out and checked, or its device argmax checked (-1: a logit
 * was NaN or infinite, the argmax kernels' rule). */
static ppn_status readback_checked(ppn_seq *q, int ring, float *logits, int *id)
{
    ppn_model *m = q->m;
    char what[96];
    size_t v = (size_t)m->cfg.vocab;
    /* the copy to the caller checks as it goes: about a memcpy's cost, and nothing on the device */
    if (logits && ppn_copy_nonfinite(logits, q->logits_h[ring], v, PPN_DTYPE_F32)) {
        size_t i = ppn_logits_first_nonfinite(logits, v);
        step_name(q, ring, what, sizeof what);
        return ppn_logits_nonfinite(m, what, i, logits[i]);
    }
    if (!id) return PPN_OK;
    *id = q->tok_h[ring];
    if (*id >= 0) return PPN_OK;
    step_name(q, ring, what, sizeof what);
    return argmax_nan(m, what);
}

/* p names a step of q still in flight: its ring entry holds that step. */
static int pend_live(const ppn_seq *q, ppn_pend p)
{
    /* a free entry holds 0, which the id 0 (never a step) would otherwise match */
    return p.ring >= 0 && p.ring < PPN_MAX_INFLIGHT && q->ring_step[p.ring] && q->ring_step[p.ring] == p.step + 1;
}

#if PPN_TEST_HOOKS
static _Atomic int skip_wait_syncs; /* test-only */

void ppn_pend_test_skip_wait_syncs(int skip) { atomic_store(&skip_wait_syncs, skip); }
#endif

static int wait_syncs_skipped(void)
{
#if PPN_TEST_HOOKS
    return atomic_load_explicit(&skip_wait_syncs, memory_order_relaxed);
#else
    return 0;
#endif
}

/* Wait for a step of q and read back its logits (logits != NULL) or its device argmax (id != NULL). */
ppn_status ppn_pend_wait(ppn_seq *q, ppn_pend p, float *logits, int *id)
{
    ppn_model *m = q->m;
    ppn_gpu *g = m->rt->g;
    ppn_gen_wait(&q->done_gen[p.ring], p.step + 1, m->map->door.spin); /* the done event is recorded */
    g->ops->host_acquire(g, &q->done_gen[p.ring]); /* pairs with the release in stage_finish() (core/step.c) */
    ppn_status st = ppn_model_failed(m);
    int synced = !wait_syncs_skipped(); /* 0 only in test_hazards: the host goes on before the step has run */
    if (st == PPN_OK && synced) st = g->ops->stream_wait_event(g, m->rb_stream, q->done_ev[p.ring]);
    size_t bytes = sizeof(float) * (size_t)m->cfg.vocab;
    if (st == PPN_OK && logits) st = g->ops->copy_dtoh(g, m->rb_stream, q->logits_h[p.ring], q->logits[p.ring], bytes);
    if (st == PPN_OK && id)
        st = g->ops->copy_dtoh(g, m->rb_stream, &q->tok_h[p.ring], q->tok[p.ring], sizeof(int32_t));
    if (st == PPN_OK && synced) st = g->ops->event_record(g, q->rb_ev[p.ring], m->rb_stream);
    if (st == PPN_OK && synced) st = g->ops->stream_sync(g, m->rb_stream);
    if (st != PPN_OK) {
        ppn_seq_retire(q, p.ring);
        ppn_model_fail(m, st);
        return st;
    }
    if (logits) /* the sim checks the host's read of the pinned row against the readback copy */
        g->ops->host_access(g, q->logits_h[p.ring], bytes, PPN_ACC_R, "logits readback");
    if (id) g->ops->host_access(g, &q->tok_h[p.ring], sizeof(int32_t), PPN_ACC_R, "token readback");
    st = readback_checked(q, p.ring, logits, id); /* not the model's failure: the device did what it was told */
    ppn_seq_retire(q, p.ring);
    return st;
}

ppn_status ppn_pending_wait(ppn_seq *q, ppn_step_id step, float *logits)
{
    if (!q) return ppn_err(PPN_EINVAL, "ppn_pending_wait: seq is NULL");
    PPN_CHECK(ppn_model_caller(q->m, "ppn_pending_wait"));
    ppn_pend p = ppn_pend_of(step);
    if (!pend_live(q, p))
        return ppn_err(PPN_EINVAL, "ppn_pending_wait: step id %llu is not in flight on sequence %d (already waited, "
                                   "dropped by a reset, or never issued)", (unsigned long long)step, q->id);
    return ppn_pend_wait(q, p, logits, NULL);
}

/* Greedy decode on the device: step i > 0 is fed the argmax of step i-1 by the set_hdr kernel itself, so the
 * host issues up to PPN_MAX_INFLIGHT steps ahead and reads back 4 bytes per step; the device never waits on it.
 * Checks come first, for all n steps: nothing is issued when they fail. */
ppn_status ppn_decode_greedy(ppn_seq *q, int token, int n, int *ids)
{
    if (!q || !ids || n <= 0)
        return ppn_err(PPN_EINVAL, "ppn_decode_greedy: %s", !q ? "seq is NULL" : !ids ? "ids is NULL" : "n must be positive");
    ppn_model *m = q->m;
    PPN_CHECK(ppn_model_caller(m, "ppn_decode_greedy"));
    PPN_CHECK(ppn_step_checks(q, token));
    if (q->issued != q->waited)
        return ppn_err(PPN_ESTATE, "ppn_decode_greedy: sequence %d has deferred steps in flight: wait them first", q->id);
    if (n > m->ctx - q->pos)
        return ppn_err(PPN_ESTATE, "ppn_decode_greedy: %d steps from position %d exceed the sequence's %d positions "
                       "(ctx)", n, q->pos, m->ctx);
    PPN_CHECK(ppn_kv_reserve_one(q, q->pos + n));
    ppn_pend pend[PPN_MAX_INFLIGHT];
    ppn_greedy_link gl = {-1, 0};
    int issued = 0, waited = 0;
    ppn_status st = PPN_OK;
    while (waited < issued || (st == PPN_OK && issued < n)) {
        if (st == PPN_OK && issued < n && issued - waited < PPN_MAX_INFLIGHT) {
            ppn_pend *p = &pend[issued % PPN_MAX_INFLIGHT];
            st = ppn_step_issue_deferred(q, token, &gl, p);
            gl = (ppn_greedy_link){p->ring, p->step};
            issued++;
        } else {
            ppn_status w = ppn_pend_wait(q, pend[waited % PPN_MAX_INFLIGHT], NULL, &ids[waited]);
            if (st == PPN_OK) st = w;
            waited++;
        }
    }
    return st;
}

/* The eager arm: the deferred step, drained at once. */
ppn_status ppn_decode_step(ppn_seq *q, int token, float *logits)
{
    ppn_step_id id = 0;
    ppn_status st = ppn_decode_step_deferred(q, token, &id);
    if (!id) return st; /* refused before anything was issued */
    ppn_status w = ppn_pending_wait(q, id, logits);
    return st != PPN_OK ? st : w;
}
