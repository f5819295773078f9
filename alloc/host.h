/* host.h - host memory: jemalloc for ordinary host allocations, and pinned buffers from jemalloc arenas whose
 * extent hooks map their memory, bind it to the arena's NUMA node (when it has one) and only then pin it
 * through the device layer (host_register: cuMemHostRegister on cuda, a check on sim).
 *
 * One arena per NUMA node is the runtime's rule (core/runtime.c: ppn_rt_pinned_for): a buffer comes from the
 * arena of the node of the device that touches it. alloc/ does not know the topology: the binding is a
 * callback the layer above supplies.
 *
 * Threading: ppn_halloc/ppn_hfree and ppn_pinned_alloc/free are thread-safe (jemalloc's own locking).
 * In sanitizer builds (PPN_HOST_JEMALLOC=0) ppn_halloc is plain malloc so ASan sees every allocation.
 */
#ifndef PPN_HOST_H
#define PPN_HOST_H

#include <stddef.h>
#include "core/device/gpu.h"

void *ppn_halloc(size_t n);                /* NULL on failure (n == 0 gives a unique pointer) */
void *ppn_hcalloc(size_t count, size_t n); /* zeroed; NULL on failure or overflow */
void ppn_hfree(void *p);

typedef struct ppn_pinned_arena ppn_pinned_arena;

/* How an arena's memory is bound to its node before it is pinned. bind(ctx, p, n, node) binds the page-aligned
 * range [p, p + n) and returns PPN_OK or a status with a message; it may be called from any thread, inside
 * jemalloc (it must not allocate from a pinned arena). node: a node, or PPN_PINNED_INTERLEAVE (pages spread over
 * every node: a measurement arm). bind NULL: an arena not bound anywhere. */
#define PPN_PINNED_INTERLEAVE (-2)
typedef struct ppn_pinned_bind {
    ppn_status (*bind)(void *ctx, void *p, size_t n, int node);
    void *ctx;
    int node;
} ppn_pinned_bind;

/* A jemalloc arena over pinned memory of backend g, bound as bind says (NULL: unbound). Returns PPN_OK,
 * PPN_ENOMEM, PPN_EDRIVER (jemalloc refused the arena: message has the mallctl error; or the backend could not
 * pin the reserve). A binding the kernel refuses is not an error: one notice on stderr, ppn_pinned_bind_failed. */
ppn_status ppn_pinned_arena_create(ppn_gpu *g, const ppn_pinned_bind *bind, ppn_pinned_arena **out);
/* Destroys the arena and returns every pinned region. All buffers must be freed (or dead). */
void ppn_pinned_arena_destroy(ppn_pinned_arena *a);
/* Pinned buffer of n bytes (64-byte aligned at least). Returns PPN_OK or PPN_ENOMEM (message names n). */
ppn_status ppn_pinned_alloc(ppn_pinned_arena *a, size_t n, void **out);
/* Free a buffer of any pinned arena (a is not consulted: jemalloc knows the buffer's arena). */
void ppn_pinned_free(ppn_pinned_arena *a, void *p);
/* Bytes of pinned memory mapped so far. */
size_t ppn_pinned_reserved(ppn_pinned_arena *a);
/* The node the arena binds to (-1: none), and 1 when the kernel refused to bind some of its memory there. */
int ppn_pinned_node(const ppn_pinned_arena *a);
int ppn_pinned_bind_failed(ppn_pinned_arena *a);

#endif
