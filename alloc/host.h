/* host.h - host memory: jemalloc for ordinary host allocations, and pinned buffers from a jemalloc arena
 * whose extent hooks get their memory from the device layer (cuMemHostAlloc on cuda, mmap on sim).
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

/* A jemalloc arena over pinned memory of backend g. Returns PPN_OK, PPN_ENOMEM, PPN_EDRIVER (jemalloc
 * refused the arena: message has the mallctl error). */
ppn_status ppn_pinned_arena_create(ppn_gpu *g, ppn_pinned_arena **out);
/* Destroys the arena and returns every pinned region to the backend. All buffers must be freed (or dead). */
void ppn_pinned_arena_destroy(ppn_pinned_arena *a);
/* Pinned buffer of n bytes (64-byte aligned at least). Returns PPN_OK or PPN_ENOMEM (message names n). */
ppn_status ppn_pinned_alloc(ppn_pinned_arena *a, size_t n, void **out);
void ppn_pinned_free(ppn_pinned_arena *a, void *p);
/* Bytes of pinned memory obtained from the backend so far. */
size_t ppn_pinned_reserved(ppn_pinned_arena *a);

#endif
