/* host.c - jemalloc host allocations and the pinned jemalloc arena (see host.h).
 *
 * The pinned arena's extent hooks take whole regions from the backend (gpu->ops->host_alloc) and never give
 * them back piecemeal: dalloc opts out (jemalloc retains the extent for reuse), merge is refused (regions of
 * two backend allocations stay distinct), and the regions are returned to the backend, from our own list,
 * only after the arena itself is destroyed.
 *
 * No driver call runs inside jemalloc while it holds its global locks: arenas.create allocates the new
 * arena's metadata through these very hooks under jemalloc's arenas lock, and a first cuMemHostAlloc there
 * can start driver threads whose own first malloc needs that lock (a deadlock seen on the H200). So the
 * arena's first RESERVE_BYTES are pinned before arenas.create, and the hooks carve from them first.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jemalloc/jemalloc.h>
#include "alloc/host.h"
#include "core/base/err.h"

/* Ordinary host memory ---------------------------------------------------------------------------------- */

void *ppn_halloc(size_t n)
{
#if PPN_HOST_JEMALLOC
    return mallocx(n ? n : 1, 0);
#else
    return malloc(n ? n : 1);
#endif
}

void *ppn_hcalloc(size_t count, size_t n)
{
    if (n && count > SIZE_MAX / n) return NULL;
#if PPN_HOST_JEMALLOC
    size_t bytes = count * n;
    return mallocx(bytes ? bytes : 1, MALLOCX_ZERO);
#else
    return calloc(count ? count : 1, n ? n : 1);
#endif
}

void ppn_hfree(void *p)
{
    if (!p) return;
#if PPN_HOST_JEMALLOC
    dallocx(p, 0);
#else
    free(p);
#endif
}

/* The pinned arena ----------------------------------------------------------------------------------------- */

typedef struct region {
    void *base;          /* what the backend returned */
    size_t size;         /* what was asked of the backend */
} region;

/* Region records live in the arena itself: the hooks run inside jemalloc and must not call back into it. */
#define MAX_REGIONS 4096
#define RESERVE_BYTES ((size_t)64 << 20)

struct ppn_pinned_arena {
    extent_hooks_t hooks;  /* first member: the hooks pointer jemalloc hands back is the arena */
    ppn_gpu *g;
    unsigned arena_ind;
    pthread_mutex_t mu;    /* protects regions, n_regions, reserved, reserve_used */
    char *reserve;         /* regions[0]: pinned before the arena exists, carved first */
    size_t reserve_used;
    size_t n_regions;
    size_t reserved;
    region regions[MAX_REGIONS];
};

/* An aligned piece of the reserve, or NULL when it cannot hold size bytes. */
static void *reserve_carve(ppn_pinned_arena *a, size_t size, size_t alignment)
{
    pthread_mutex_lock(&a->mu);
    uintptr_t base = (uintptr_t)a->reserve, at = base + a->reserve_used;
    uintptr_t p = (at + alignment - 1) & ~(uintptr_t)(alignment - 1);
    void *out = NULL;
    if (p + size <= base + RESERVE_BYTES) {
        a->reserve_used = p + size - base;
        out = (void *)p;
    }
    pthread_mutex_unlock(&a->mu);
    return out;
}

static void *pinned_extent_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t alignment, bool *zero,
                                 bool *commit, unsigned arena_ind)
{
    ppn_pinned_arena *a = (ppn_pinned_arena *)h;
    if (new_addr) return NULL; /* cannot grow in place */
    void *p = reserve_carve(a, size, alignment);
    if (p) {
        if (*zero) memset(p, 0, size);
        *commit = true;
        return p;
    }
    /* Over-ask so an aligned extent fits; the backend's own alignment is a page. */
    size_t ask = alignment > 4096 ? size + alignment : size;
    void *base = NULL;
    if (a->g->ops->host_alloc(a->g, ask, &base) != PPN_OK) return NULL;
    pthread_mutex_lock(&a->mu);
    if (a->n_regions == MAX_REGIONS) {
        pthread_mutex_unlock(&a->mu);
        a->g->ops->host_free(a->g, base, ask);
        return NULL;
    }
    a->regions[a->n_regions++] = (region){base, ask};
    a->reserved += ask;
    pthread_mutex_unlock(&a->mu);
    uintptr_t q = ((uintptr_t)base + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (*zero) memset((void *)q, 0, size);
    *commit = true;
    return (void *)q;
}

/* Returning true opts out: jemalloc keeps the extent (retained) and may hand it out again. */
static bool pinned_extent_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind)
{
    return true;
}

static void pinned_extent_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned ind)
{
    /* Regions are returned from our own list after the arena is gone (an extent may be a split piece). */
}

static bool pinned_extent_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
                                bool committed, unsigned ind)
{
    return false; /* splitting is bookkeeping only: allowed */
}

static bool pinned_extent_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
                                bool committed, unsigned ind)
{
    return true; /* refuse: two backend regions must stay two extents */
}

ppn_status ppn_pinned_arena_create(ppn_gpu *g, ppn_pinned_arena **out)
{
    *out = NULL;
    ppn_pinned_arena *a = calloc(1, sizeof *a);
    if (!a) return ppn_err(PPN_ENOMEM, "pinned arena: host out of memory");
    a->hooks.alloc = pinned_extent_alloc;
    a->hooks.dalloc = pinned_extent_dalloc;
    a->hooks.destroy = pinned_extent_destroy;
    a->hooks.split = pinned_extent_split;
    a->hooks.merge = pinned_extent_merge;
    a->g = g;
    pthread_mutex_init(&a->mu, NULL);
    ppn_status st = g->ops->host_alloc(g, RESERVE_BYTES, (void **)&a->reserve);
    if (st != PPN_OK) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return ppn_err_ctx(st, "pinned arena: reserve of %zu B", RESERVE_BYTES);
    }
    a->regions[a->n_regions++] = (region){a->reserve, RESERVE_BYTES};
    a->reserved = RESERVE_BYTES;
    extent_hooks_t *hp = &a->hooks;
    size_t sz = sizeof a->arena_ind;
    int rc = mallctl("arenas.create", &a->arena_ind, &sz, &hp, sizeof hp);
    if (rc != 0) {
        g->ops->host_free(g, a->reserve, RESERVE_BYTES);
        pthread_mutex_destroy(&a->mu);
        free(a);
        return ppn_err(PPN_EDRIVER, "pinned arena: jemalloc mallctl(\"arenas.create\") failed: %s", strerror(rc));
    }
    *out = a;
    return PPN_OK;
}

void ppn_pinned_arena_destroy(ppn_pinned_arena *a)
{
    if (!a) return;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", a->arena_ind);
    int rc = mallctl(name, NULL, NULL, NULL, 0);
    if (rc != 0) fprintf(stderr, "ppn: warning: jemalloc %s failed: %s\n", name, strerror(rc));
    for (size_t i = 0; i < a->n_regions; i++) a->g->ops->host_free(a->g, a->regions[i].base, a->regions[i].size);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

ppn_status ppn_pinned_alloc(ppn_pinned_arena *a, size_t n, void **out)
{
    *out = mallocx(n ? n : 1, MALLOCX_ARENA(a->arena_ind) | MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(64));
    if (!*out) return ppn_err(PPN_ENOMEM, "pinned arena: cannot allocate %zu B of pinned host memory", n);
    return PPN_OK;
}

void ppn_pinned_free(ppn_pinned_arena *a, void *p)
{
    if (p) dallocx(p, MALLOCX_TCACHE_NONE);
}

size_t ppn_pinned_reserved(ppn_pinned_arena *a)
{
    pthread_mutex_lock(&a->mu);
    size_t r = a->reserved;
    pthread_mutex_unlock(&a->mu);
    return r;
}
