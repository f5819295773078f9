/* pool.h - the stream-ordered device pool that replaces the driver's default mempool.
 *
 * One pool per device. Raw memory comes from the backend in slabs (mem_alloc, counted as driver allocations);
 * blocks are carved from slabs in power-of-two size classes; blocks larger than a slab get their own raw
 * allocation and are cached by exact size after free. Nothing is ever returned to the driver before
 * ppn_pool_destroy, so the steady-state step path never calls the driver's allocator.
 *
 * The cross-stream rule (the reason this pool exists):
 *   - every free is stream-ordered: ppn_pool_free(p, ptr, S) records the block's event on S and remembers S;
 *   - an alloc on stream S takes a free block last freed on S first: stream order alone makes reuse safe,
 *     and no wait is inserted;
 *   - otherwise it takes a block last freed on another stream T only after inserting
 *     stream_wait_event(S, block.event): an explicit cross-stream dependency, counted in stats.cross_waits;
 *   - there is no opportunistic reuse: a block freed on T is never handed to S without that wait, even if the
 *     event has completed long ago.
 *
 * Retired blocks (issue 14): when the event record of a free fails, nothing orders a later user after the work
 * queued on S before the free, so the block is retired instead of freed: it leaves the live map (a second free
 * of ptr is a double free) and in_use, never goes back to a free list, and is counted in stats.retired and
 * stats.retired_bytes (its bytes stay in reserved). The free returns the record's failure with a message that
 * says the block was retired; callers propagate it (a teardown carries on and returns its first failure). While
 * the pool lives no allocation returns a retired block's address; ppn_pool_destroy releases retired blocks with
 * every other one (a large block's raw allocation is freed, a small block goes with its slab), under the same
 * precondition as for live blocks: the streams that used the pool have been drained.
 *
 * Threading contract: all functions are thread-safe (one mutex per pool). The mutex is held across the
 * backend calls that alloc/free make (event record, stream wait), which are host-side enqueues only.
 * Callers on the step path should allocate at setup and reuse; the pool is still correct if they do not.
 */
#ifndef PPN_POOL_H
#define PPN_POOL_H

#include <stddef.h>
#include <stdint.h>
#include "core/device/gpu.h"

typedef struct ppn_pool ppn_pool;

typedef struct ppn_pool_stats {
    size_t in_use;          /* bytes in live blocks (rounded to the size class) */
    size_t peak;            /* max of in_use */
    size_t reserved;        /* bytes of raw memory held (slabs + large blocks) */
    uint64_t slabs;         /* raw allocations made (slabs + large) = driver allocations */
    uint64_t cross_waits;   /* stream waits inserted for cross-stream reuse */
    uint64_t allocs;        /* calls */
    uint64_t frees;         /* frees that put a block back in circulation (a retirement is not one) */
    uint64_t retired;       /* blocks retired: their free's event record failed (out of circulation until destroy) */
    size_t retired_bytes;   /* their bytes (rounded to the size class; still counted in reserved) */
} ppn_pool_stats;

/* Create a pool for device dev. slab_bytes 0 = default (2 MiB... grows with demand; see pool.c).
 * Returns PPN_OK, PPN_EINVAL (bad device), PPN_ENOMEM (host). */
ppn_status ppn_pool_create(ppn_gpu *g, int dev, size_t slab_bytes, ppn_pool **out);
/* Release every raw allocation. The caller must have drained the streams that used the pool. A failed free does
 * not stop it: everything else is released all the same and the first failure returned (NULL: PPN_OK).
 * Returns PPN_OK, PPN_EDRIVER or the checker's PPN_EDOUBLEFREE (a free the backend refused). */
ppn_status ppn_pool_destroy(ppn_pool *p);

/* Allocate n bytes (>0) usable on stream s (a stream of this pool's device, or of another device that reads
 * it through a peer grant). tag names the block in checker reports (static string, may be NULL).
 * Returns PPN_OK, PPN_EINVAL (n == 0, s NULL), PPN_ENOMEM (the device is full: the pool stays usable, and
 * serves again once blocks are freed), PPN_EDRIVER (the stream wait or event creation failed). */
ppn_status ppn_pool_alloc(ppn_pool *p, size_t n, ppn_gstream *s, const char *tag, ppn_dptr *out);
/* Free ptr, stream-ordered on s (work enqueued on s before this call may still use it).
 * Returns PPN_OK, PPN_EINVAL (s NULL, or a stream of another device), PPN_EDOUBLEFREE (ptr not a live block of
 * this pool: message names it), or the event record's failure (PPN_EDRIVER, or on sim the checker's sticky
 * status): ptr is then no longer live but retired, not freed (see "Retired blocks" above; the message says so). */
ppn_status ppn_pool_free(ppn_pool *p, ppn_dptr ptr, ppn_gstream *s);

void ppn_pool_get_stats(ppn_pool *p, ppn_pool_stats *out);
int ppn_pool_device(const ppn_pool *p);

/* Forget stream s (about to be destroyed): blocks it freed become foreign to every stream, so a later
 * stream that happens to reuse its address still waits on their events. Call before destroying s. */
void ppn_pool_stream_retired(ppn_pool *p, ppn_gstream *s);

#if PPN_TEST_HOOKS
/* Test-only (the test build of the library, ppncore_test): skip the cross-stream wait (proves the sim
 * checker sees the race the wait prevents). */
void ppn_pool_test_skip_cross_wait(ppn_pool *p, int skip);
#endif

#endif
