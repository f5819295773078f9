/* boundary.c - double-buffered stage boundaries and their transports (see boundary.h). */
#include <string.h>
#include "transport/boundary.h"
#include "core/base/err.h"
#include "sched/issue.h"

#if PPN_TEST_HOOKS
static _Atomic int skip_waits;      /* test-only: both sides' */
static _Atomic int skip_recv_waits; /* test-only: the consumer's */

void ppn_boundary_test_skip_waits(int skip) { atomic_store(&skip_waits, skip); }
void ppn_boundary_test_skip_recv_wait(int skip) { atomic_store(&skip_recv_waits, skip); }
#endif

/* recv: the consumer's wait (on ev_tx), else the producer's (on ev_rx). */
static ppn_status wait_event(ppn_gpu *g, ppn_gstream *s, ppn_gevent *e, int recv)
{
#if PPN_TEST_HOOKS
    if (atomic_load_explicit(&skip_waits, memory_order_relaxed)) return PPN_OK;
    if (recv && atomic_load_explicit(&skip_recv_waits, memory_order_relaxed)) return PPN_OK;
#else
    (void)recv;
#endif
    return g->ops->stream_wait_event(g, s, e);
}

const char *ppn_xport_name(int x)
{
    static const char *const names[] = {"inplace", "dtod", "peer", "host"};
    return x >= 0 && x < PPN_XPORT_COUNT ? names[x] : "?";
}

static ppn_status slot_init(ppn_boundary *b, ppn_gpu *g, ppn_slot *sl)
{
    PPN_CHECK(ppn_pool_alloc(b->pool, b->bytes, b->alloc_stream, "boundary slot", &sl->buf));
    PPN_CHECK(g->ops->event_create(g, b->from_dev, 0, &sl->ev_tx));
    PPN_CHECK(g->ops->event_create(g, b->to_dev, 0, &sl->ev_rx));
    if (b->xport == PPN_XPORT_HOST) PPN_CHECK(ppn_pinned_alloc(b->pinned, b->bytes, &sl->host));
    return PPN_OK;
}

ppn_status ppn_boundary_init(ppn_boundary *b, ppn_gpu *g, ppn_pool *from_pool, ppn_gstream *from_stream,
                             int to_dev, int xport, int dim, int max_rows, ppn_pinned_arena *pinned)
{
    memset(b, 0, sizeof *b);
    if (xport < 0 || xport >= PPN_XPORT_COUNT) return ppn_err(PPN_EINVAL, "boundary: transport %d", xport);
    if (max_rows < 1) return ppn_err(PPN_EINVAL, "boundary: %d rows", max_rows);
    b->from_dev = ppn_pool_device(from_pool);
    b->to_dev = to_dev;
    b->xport = xport;
    b->row_bytes = sizeof(float) * (size_t)dim;
    b->max_rows = max_rows;
    b->bytes = PPN_IO_HDR_BYTES + b->row_bytes * (size_t)max_rows;
    b->pool = from_pool;
    b->alloc_stream = from_stream;
    b->pinned = pinned;
    for (int k = 0; k < 2; k++) {
        ppn_status st = slot_init(b, g, &b->slot[k]);
        if (st != PPN_OK) {
            ppn_err_first first = {0}; /* st with its message, whatever the fini meets */
            ppn_err_first_add(&first, ppn_err_ctx(st, "boundary %d->%d", b->from_dev, to_dev));
            ppn_err_first_add(&first, ppn_boundary_fini(b, g));
            return ppn_err_first_done(&first);
        }
    }
    return PPN_OK;
}

ppn_status ppn_boundary_fini(ppn_boundary *b, ppn_gpu *g)
{
    ppn_err_first first = {0};
    for (int k = 0; k < 2; k++) {
        ppn_slot *sl = &b->slot[k];
        if (sl->buf) ppn_err_first_add(&first, ppn_pool_free(b->pool, sl->buf, b->alloc_stream));
        if (sl->ev_tx) g->ops->event_destroy(g, sl->ev_tx);
        if (sl->ev_rx) g->ops->event_destroy(g, sl->ev_rx);
        if (sl->host) ppn_pinned_free(b->pinned, sl->host);
        memset(sl, 0, sizeof *sl);
    }
    return ppn_err_first_done(&first);
}

/* After a host wait: was the generation posted by an abandon? The acquire in ppn_gen_wait pairs with the
 * release in the abandon's post, which follows its poison store, so a relaxed load sees it. */
static ppn_status poison_check(const ppn_boundary *b, const char *side)
{
    if (!atomic_load_explicit(&b->poisoned, memory_order_relaxed)) return PPN_OK;
    return ppn_err(PPN_ESTATE, "boundary %d->%d: %s refused: a failed stage abandoned the hand-off", b->from_dev,
                   b->to_dev, side);
}

/* The bytes a hand-off of rows moves: the header and those rows. */
static size_t sent_bytes(const ppn_boundary *b, int rows)
{
    PPN_ASSERT(rows >= 1 && rows <= b->max_rows);
    return PPN_IO_HDR_BYTES + b->row_bytes * (size_t)rows;
}

ppn_status ppn_boundary_send(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step, ppn_dptr io,
                             int rows, int spin)
{
    ppn_slot *sl = &b->slot[k];
    size_t n = sent_bytes(b, rows);
    if (sl->last_step) { /* the slot's previous step must have been released by the consumer */
        ppn_gen_wait(&sl->rx_gen, sl->last_step, spin);
        g->ops->host_acquire(g, &sl->rx_gen); /* the sim checker's view of that hand-off */
        PPN_CHECK(poison_check(b, "send"));
        PPN_CHECK(wait_event(g, s, sl->ev_rx, 0));
    }
    if (b->xport == PPN_XPORT_HOST) PPN_CHECK(g->ops->copy_dtoh(g, s, sl->host, io, n));
    else PPN_CHECK(g->ops->copy_dtod(g, s, sl->buf, io, n));
    PPN_CHECK(g->ops->event_record(g, sl->ev_tx, s));
    sl->last_step = step + 1;
    b->sends++;
    b->overlap_steps += k;
    g->ops->host_release(g, &sl->tx_gen);
    ppn_gen_post(&sl->tx_gen, step + 1); /* release: pairs with the acquire in the consumer's recv */
    return PPN_OK;
}

ppn_status ppn_boundary_release(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step)
{
    ppn_slot *sl = &b->slot[k];
    PPN_CHECK(g->ops->event_record(g, sl->ev_rx, s));
    g->ops->host_release(g, &sl->rx_gen);
    ppn_gen_post(&sl->rx_gen, step + 1); /* release: pairs with the acquire in the producer's send */
    return PPN_OK;
}

ppn_status ppn_boundary_recv(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step, ppn_dptr local,
                             ppn_dptr *io, int rows, int spin)
{
    ppn_slot *sl = &b->slot[k];
    size_t n = sent_bytes(b, rows);
    ppn_gen_wait(&sl->tx_gen, step + 1, spin); /* the producer recorded ev_tx for this step */
    g->ops->host_acquire(g, &sl->tx_gen);
    PPN_CHECK(poison_check(b, "recv"));
    PPN_CHECK(wait_event(g, s, sl->ev_tx, 1));
    switch (b->xport) {
    case PPN_XPORT_INPLACE:
        *io = sl->buf;
        return PPN_OK;
    case PPN_XPORT_DTOD: PPN_CHECK(g->ops->copy_dtod(g, s, local, sl->buf, n)); break;
    case PPN_XPORT_PEER: PPN_CHECK(g->ops->copy_peer(g, s, local, b->to_dev, sl->buf, b->from_dev, n)); break;
    default: PPN_CHECK(g->ops->copy_htod(g, s, local, sl->host, n)); break;
    }
    *io = local;
    return ppn_boundary_release(b, g, s, k, step);
}

int ppn_boundary_in_place(const ppn_boundary *b) { return b->xport == PPN_XPORT_INPLACE; }

void ppn_boundary_abandon_send(ppn_boundary *b, int k, uint32_t step)
{
    ppn_slot *sl = &b->slot[k];
    sl->last_step = step + 1;
    atomic_store_explicit(&b->poisoned, 1, memory_order_relaxed); /* published by the release below */
    ppn_gen_post(&sl->tx_gen, step + 1); /* release: pairs with the acquire in the consumer's recv */
}

void ppn_boundary_abandon_recv(ppn_boundary *b, int k, uint32_t step)
{
    atomic_store_explicit(&b->poisoned, 1, memory_order_relaxed); /* published by the release below */
    ppn_gen_post(&b->slot[k].rx_gen, step + 1); /* release: pairs with the acquire in the producer's send */
}

ppn_status ppn_boundary_put_plain(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, ppn_dptr io, int rows)
{
    return g->ops->copy_dtod(g, s, b->slot[0].buf, io, sent_bytes(b, rows));
}

ppn_status ppn_boundary_get_plain(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, ppn_dptr io, int rows)
{
    return g->ops->copy_dtod(g, s, io, b->slot[0].buf, sent_bytes(b, rows));
}

void ppn_boundary_counts(const ppn_boundary *b, uint64_t *sends, uint64_t *overlap_steps)
{
    *sends = b->sends;
    *overlap_steps = b->overlap_steps;
}
