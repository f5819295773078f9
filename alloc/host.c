/* host.c - jemalloc host allocations and the pinned jemalloc arenas (see host.h).
 *
 * A pinned arena's extent hooks take whole regions (anonymous mappings, bound to the arena's NUMA node if it has
 * one, then registered with the backend: gpu->ops->host_register) and never give them back piecemeal: dalloc
 * opts out (jemalloc retains the extent for reuse), merge is refused (two regions stay two extents), and the
 * regions are unregistered and unmapped, from our own list, only after the arena itself is destroyed.
 * Binding comes before registering because pinning faults every page in: after it, a binding would only apply
 * to pages that are never touched again.
 *
 * No driver call runs inside jemalloc while it holds its global locks: arenas.create allocates the new
 * arena's metadata through these very hooks under jemalloc's arenas lock, and a first cuMemHostAlloc there
 * can start driver threads whose own first malloc needs that lock (a deadlock seen on the H200). So the
 * arena's first RESERVE_BYTES are pinned before arenas.create, and the hooks carve from them first.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    void *base;          /* the mapping */
    size_t size;         /* its length (a multiple of the page) */
} region;

/* Region records live in the arena itself: the hooks run inside jemalloc and must not call back into it. */
#define MAX_REGIONS 4096
#define RESERVE_BYTES ((size_t)64 << 20)
#define PAGE 4096

struct ppn_pinned_arena {
    extent_hooks_t hooks;  /* first member: the hooks pointer jemalloc hands back is the arena */
    ppn_gpu *g;
    ppn_pinned_bind bind;  /* immutable; bind.node < 0: not bound */
    unsigned arena_ind;
    pthread_mutex_t mu;    /* protects regions, n_regions, reserved, reserve_used, bind_failed */
    char *reserve;         /* regions[0]: mapped before the arena exists, carved first */
    size_t reserve_used;
    size_t n_regions;
    size_t reserved;
    int bind_failed;       /* a region could not be bound (said once on stderr) */
    region regions[MAX_REGIONS];
};

/* A region of bytes (a multiple of the page): mapped, bound to the arena's node, registered. Returns PPN_OK,
 * PPN_ENOMEM (mmap), or the backend's status (host_register); a failed binding is not a failure: the notice says so once and the memory goes where
 * the kernel puts it (ppn_pinned_bind_failed, and the placement read back from the OS, tell the truth). */
static ppn_status region_map(ppn_pinned_arena *a, size_t bytes, void **out)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ppn_err(PPN_ENOMEM, "pinned arena: mmap of %zu B failed: %s", bytes, strerror(errno));
    if (a->bind.bind && a->bind.bind(a->bind.ctx, p, bytes, a->bind.node) != PPN_OK) {
        pthread_mutex_lock(&a->mu);
        int first = !a->bind_failed;
        a->bind_failed = 1;
        pthread_mutex_unlock(&a->mu);
        if (first)
            fprintf(stderr, "ppn: notice: pinned host memory for NUMA node %d is not bound there (%s); the kernel "
                    "places it\n", a->bind.node, ppn_last_error());
    }
    ppn_status st = a->g->ops->host_register(a->g, p, bytes);
    if (st != PPN_OK) {
        munmap(p, bytes);
        return st;
    }
    *out = p;
    return PPN_OK;
}

static void region_unmap(ppn_pinned_arena *a, void *p, size_t bytes)
{
    if (a->g->ops->host_unregister(a->g, p) != PPN_OK)
        fprintf(stderr, "ppn: warning: unpinning %zu B of host memory: %s\n", bytes, ppn_last_error());
    munmap(p, bytes);
}

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
    /* Over-ask so an aligned extent fits; a mapping's own alignment is a page. */
    size_t ask = (alignment > PAGE ? size + alignment : size) + PAGE - 1;
    ask -= ask % PAGE;
    void *base;
    if (region_map(a, ask, &base) != PPN_OK) return NULL;
    pthread_mutex_lock(&a->mu);
    if (a->n_regions == MAX_REGIONS) {
        pthread_mutex_unlock(&a->mu);
        region_unmap(a, base, ask);
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
    return true; /* refuse: two regions must stay two extents */
}

ppn_status ppn_pinned_arena_create(ppn_gpu *g, const ppn_pinned_bind *bind, ppn_pinned_arena **out)
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
    a->bind = bind && bind->bind ? *bind : (ppn_pinned_bind){.bind = NULL, .node = -1};
    pthread_mutex_init(&a->mu, NULL);
    ppn_status st = region_map(a, RESERVE_BYTES, (void **)&a->reserve);
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
        region_unmap(a, a->reserve, RESERVE_BYTES);
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
    for (size_t i = 0; i < a->n_regions; i++) region_unmap(a, a->regions[i].base, a->regions[i].size);
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
    (void)a; /* jemalloc finds the arena from the pointer: any arena's buffer may be freed through any arena */
    if (p) dallocx(p, MALLOCX_TCACHE_NONE);
}

size_t ppn_pinned_reserved(ppn_pinned_arena *a)
{
    pthread_mutex_lock(&a->mu);
    size_t r = a->reserved;
    pthread_mutex_unlock(&a->mu);
    return r;
}

int ppn_pinned_node(const ppn_pinned_arena *a) { return a->bind.node; }

int ppn_pinned_bind_failed(ppn_pinned_arena *a)
{
    pthread_mutex_lock(&a->mu);
    int f = a->bind_failed;
    pthread_mutex_unlock(&a->mu);
    return f;
}
