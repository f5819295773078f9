/* busy.c - how long each stage stream was busy: the device time of the walks it ran (a stage's kernels between
 * its boundary ops: embed, its layers, the head), for a server's metrics (issue 17: per-stage busy time).
 *
 * Off until ppn_model_time_stages turns it on; then each walk on a stage stream is bracketed by a pair of timing
 * events recorded on that stream, and the pairs' elapsed times are summed in order as they complete: before the
 * next walk's start is recorded (never waiting while a free pair is left), and all of them once the stream is
 * idle (ppn_model_time_stages drains the model first; a map change or teardown synchronises the stream). So a
 * counter lags by the walks still running, and is exact after ppn_model_time_stages returns. The time between
 * walks (waiting for the previous stage's hand-off, the host's turn between steps) is not busy. */
#include "core/rt.h"
#include "core/base/err.h"

static ppn_status busy_sum(ppn_model *m, ppn_busy *b, unsigned k)
{
    ppn_gpu *g = m->rt->g;
    float ms = 0.0f;
    PPN_CHECK(g->ops->event_elapsed(g, b->ev[k % PPN_BUSY_RING][0], b->ev[k % PPN_BUSY_RING][1], &ms));
    atomic_fetch_add_explicit(&b->ns, (uint64_t)((double)ms * 1e6 + 0.5), memory_order_relaxed);
    atomic_fetch_add_explicit(&b->walks, 1, memory_order_relaxed);
    return PPN_OK;
}

/* Sum the pairs in order: the completed ones, and waiting for each while more than keep are outstanding. */
static ppn_status busy_harvest(ppn_model *m, ppn_busy *b, unsigned keep)
{
    ppn_gpu *g = m->rt->g;
    while (b->tail != b->head) {
        ppn_gevent *end = b->ev[b->tail % PPN_BUSY_RING][1];
        if (b->head - b->tail > keep) {
            PPN_CHECK(g->ops->event_sync(g, end));
        } else {
            int done = 0;
            PPN_CHECK(g->ops->event_query(g, end, &done));
            if (!done) break;
        }
        PPN_CHECK(busy_sum(m, b, b->tail));
        b->tail++;
    }
    return PPN_OK;
}

static void busy_events_free(ppn_model *m, ppn_busy *b)
{
    ppn_gpu *g = m->rt->g;
    for (int k = 0; k < PPN_BUSY_RING; k++)
        for (int e = 0; e < 2; e++)
            if (b->ev[k][e]) (void)g->ops->event_destroy(g, b->ev[k][e]), b->ev[k][e] = NULL;
    b->dev = -1;
    b->head = b->tail = b->open = 0;
}

/* The ring's events on dev (a stage stream's device changes only with a published map, after ppn_busy_fini). */
static ppn_status busy_events(ppn_model *m, ppn_busy *b, int dev)
{
    if (b->dev == dev) return PPN_OK;
    if (b->dev >= 0) PPN_CHECK(busy_harvest(m, b, 0));
    busy_events_free(m, b);
    ppn_gpu *g = m->rt->g;
    for (int k = 0; k < PPN_BUSY_RING; k++)
        for (int e = 0; e < 2; e++) {
            ppn_status st = g->ops->event_create(g, dev, 1, &b->ev[k][e]);
            if (st != PPN_OK) {
                busy_events_free(m, b);
                return ppn_err_ctx(st, "busy time: timing events on device %d", dev);
            }
        }
    b->dev = dev;
    return PPN_OK;
}

ppn_status ppn_busy_begin(ppn_model *m, int s, ppn_gstream *q)
{
    ppn_busy *b = &m->stages[s].busy;
    b->open = 0; /* a walk that failed after its start left the pair unfinished: not counted */
    if (!atomic_load_explicit(&m->busy_on, memory_order_relaxed)) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    PPN_CHECK(busy_events(m, b, g->ops->stream_device(g, q)));
    PPN_CHECK(busy_harvest(m, b, PPN_BUSY_RING - 1)); /* a free pair: waits only when all are running */
    PPN_CHECK(g->ops->event_record(g, b->ev[b->head % PPN_BUSY_RING][0], q));
    b->open = 1;
    return PPN_OK;
}

ppn_status ppn_busy_end(ppn_model *m, int s, ppn_gstream *q)
{
    ppn_busy *b = &m->stages[s].busy;
    if (!b->open) return PPN_OK;
    b->open = 0;
    ppn_gpu *g = m->rt->g;
    PPN_CHECK(g->ops->event_record(g, b->ev[b->head % PPN_BUSY_RING][1], q));
    b->head++;
    return PPN_OK;
}

ppn_status ppn_busy_flush(ppn_model *m, int s) { return busy_harvest(m, &m->stages[s].busy, 0); }

void ppn_busy_fini(ppn_model *m, int s)
{
    (void)ppn_busy_flush(m, s); /* the stream was synchronised: nothing waits */
    busy_events_free(m, &m->stages[s].busy);
}

ppn_status ppn_model_time_stages(ppn_model *m, int on)
{
    if (!m) return ppn_err(PPN_EINVAL, "ppn_model_time_stages: model is NULL");
    PPN_CHECK(ppn_model_caller(m, "ppn_model_time_stages"));
    PPN_CHECK(ppn_model_failed(m));
    PPN_CHECK(ppn_model_drain(m)); /* the stage threads idle: their rings are the caller's until the next step */
    for (int s = 0; s < PPN_MAX_STAGES; s++) PPN_CHECK(ppn_busy_flush(m, s));
    atomic_store_explicit(&m->busy_on, on != 0, memory_order_relaxed);
    return PPN_OK;
}
