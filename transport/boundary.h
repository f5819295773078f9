/* boundary.h - the seam between stage s and stage s+1: two persistent slots, each a device buffer holding
 * the step header and the hidden state ([ppn_step_hdr, padded to 256 B][dim floats]), with its own ev_tx
 * (recorded by the producer after writing the slot) and ev_rx (recorded by the consumer when it no longer
 * needs the slot).
 *
 * The chain, for step t on slot k (k = t % 2 with MEMRA_PP_OVERLAP=1, else 0):
 *   producer: host-wait rx_gen >= prev+1 (the consumer released the slot's previous step), then
 *             stream_wait_event(ev_rx) -> write the slot -> record ev_tx -> post tx_gen = t+1
 *   consumer: host-wait tx_gen >= t+1, then stream_wait_event(ev_tx) -> read the slot -> record ev_rx ->
 *             post rx_gen = t+1
 * The host-side waits matter: cuStreamWaitEvent binds to the latest record issued before the call, so a
 * stage must not wait on ev_tx before its producer has recorded it for this step.
 *
 * Transports (chosen per boundary when the map is built):
 *   INPLACE  same device: the consumer computes on the slot itself and releases it after its walk
 *   DTOD     same device, rollback: the consumer copies the slot out (dtod) and releases it at once
 *   PEER     different devices: the consumer pulls the slot with a peer copy (driver DMA over the link)
 *   HOST     no peer access possible: the producer stages the slot through pinned host memory
 *
 * Threading: the producer side (send) is called only by the producing stage's thread and the consumer side
 * (recv/release) only by the consuming stage's thread; the generation words are their only shared state.
 */
#ifndef PPN_BOUNDARY_H
#define PPN_BOUNDARY_H

#include <stdatomic.h>
#include <stdint.h>
#include "core/device/gpu.h"
#include "alloc/pool.h"
#include "alloc/host.h"

enum { PPN_XPORT_INPLACE = 0, PPN_XPORT_DTOD, PPN_XPORT_PEER, PPN_XPORT_HOST, PPN_XPORT_COUNT };
const char *ppn_xport_name(int x);

#define PPN_IO_HDR_BYTES 256 /* the header's room at the front of every io buffer: keeps x 256-B aligned */

typedef struct ppn_slot {
    ppn_dptr buf;             /* on the producer's device: [hdr][x] */
    void *host;               /* pinned, HOST transport only */
    ppn_gevent *ev_tx;        /* producer device */
    ppn_gevent *ev_rx;        /* consumer device */
    _Alignas(64) _Atomic uint32_t tx_gen; /* step+1 of the last ev_tx record (producer writes) */
    _Alignas(64) _Atomic uint32_t rx_gen; /* step+1 of the last ev_rx record (consumer writes) */
    _Alignas(64) uint32_t last_step;      /* producer thread only: step+1 that last used the slot (0: none) */
} ppn_slot;

typedef struct ppn_boundary {
    int from_dev, to_dev, xport;
    size_t bytes;             /* a slot's capacity: header room + max_rows rows of dim floats */
    size_t row_bytes;         /* dim floats */
    int max_rows;
    ppn_slot slot[2];
    ppn_pool *pool;           /* the producer device's pool (owns buf) */
    ppn_gstream *alloc_stream;
    ppn_pinned_arena *pinned;
    uint64_t overlap_steps;   /* steps sent on slot 1 (the overlap step counter); producer thread only */
    uint64_t sends;           /* producer thread only */
    _Atomic int poisoned;     /* set by an abandon before its generation is posted; never cleared (the model's
                               * failure is sticky; a new map builds new boundaries) */
} ppn_boundary;

/* Create the boundary's slots. Returns PPN_OK, PPN_ENOMEM, PPN_EDRIVER, PPN_EINVAL (bad transport). */
ppn_status ppn_boundary_init(ppn_boundary *b, ppn_gpu *g, ppn_pool *from_pool, ppn_gstream *from_stream,
                             int to_dev, int xport, int dim, int max_rows, ppn_pinned_arena *pinned);
/* Free everything (the streams that used it must be drained). A failed slot free (its block retired: alloc/pool.h)
 * does not stop it; the first failure is returned. */
ppn_status ppn_boundary_fini(ppn_boundary *b, ppn_gpu *g);

/* Producer: write io ([hdr][rows x dim floats] on from_dev; 1 <= rows <= max_rows) into slot k for step, on
 * stream s. Only the rows sent are copied. */
ppn_status ppn_boundary_send(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step, ppn_dptr io,
                             int rows, int spin);
/* Consumer: wait for step on slot k; with a copy transport copy its rows into local (on to_dev) and release the
 * slot; with INPLACE return the slot buffer in *io (release later with ppn_boundary_release). */
ppn_status ppn_boundary_recv(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step, ppn_dptr local,
                             ppn_dptr *io, int rows, int spin);
/* Consumer: release slot k after step (INPLACE only; the copy transports release inside recv). */
ppn_status ppn_boundary_release(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, int k, uint32_t step);

#if PPN_TEST_HOOKS
/* Test-only (the test build of the library, ppncore_test): skip the stream waits on ev_tx / ev_rx (the
 * host-side waits stay), to prove the sim checker reports the race those waits prevent. */
void ppn_boundary_test_skip_waits(int skip);
/* Test-only: skip only the consumer's stream wait on ev_tx (the host-staged transport's read of the pinned slot
 * is then unordered with the producer's write into it). */
void ppn_boundary_test_skip_recv_wait(int skip);
#endif

/* 1 when the consumer computes on the slot itself (release it with ppn_boundary_release after its last read). */
int ppn_boundary_in_place(const ppn_boundary *b);
/* After a failed stage: post the generations the step owes without the stream work, so no stage waits forever
 * (the model's sticky failure stops every later step). send: the producer's side; recv: the consumer's.
 * An abandon poisons the boundary first: the event it owed was never recorded (or its record failed), so a
 * stream wait on it would bind to an older record and order nothing. Every send or recv whose host wait then
 * returns finds the poison and fails with PPN_ESTATE before issuing any stream work on the slot. */
void ppn_boundary_abandon_send(ppn_boundary *b, int k, uint32_t step);
void ppn_boundary_abandon_recv(ppn_boundary *b, int k, uint32_t step);
/* MEMRA_PP_STREAMS=0: every stage on one stream, so the stream orders everything: plain copies of io into and
 * out of slot 0, no events, no generations. */
ppn_status ppn_boundary_put_plain(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, ppn_dptr io, int rows);
ppn_status ppn_boundary_get_plain(ppn_boundary *b, ppn_gpu *g, ppn_gstream *s, ppn_dptr io, int rows);
/* The counters (producer thread's; exact between steps). */
void ppn_boundary_counts(const ppn_boundary *b, uint64_t *sends, uint64_t *overlap_steps);

#endif
