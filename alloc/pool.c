/* pool.c - stream-ordered device pool (see pool.h for the cross-stream rule and the threading contract).
 *
 * Layout: small blocks (<= large_min) are power-of-two classes carved from slabs by a bump pointer and never
 * returned to the slab; large blocks get their own raw allocation, rounded to LARGE_GRAIN, and are cached by
 * that rounded size. Every block owns one event, created when the block is carved, recorded at each free.
 * The sim checker is told about slabs (carve) and blocks (alloc/free), using the block's full rounded range
 * so its access history stays attached to the same range across reuse. Each allocation is then handed out
 * through mem_issue with the size asked for: on sim, at an address that names the allocation's generation
 * (a stale copy of an earlier one is reported), bounded by the requested bytes rather than the class.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "alloc/pool.h"
#include "core/base/err.h"

#define MIN_SHIFT 8                    /* 256 B: the smallest class, and every block's alignment */
#define DEFAULT_SLAB (32u << 20)       /* 32 MiB */
#define LARGE_GRAIN (64u << 10)        /* large blocks round to 64 KiB */
#define MAX_CLASSES 40

typedef struct block {
    ppn_dptr ptr;
    ppn_dptr user;            /* the address handed out for the current allocation (mem_issue; the live map's key) */
    size_t size;              /* rounded size: the class size, or the large size */
    int cls;                  /* class index, or -1 for large */
    int live;
    int retired;              /* its free's event record failed: out of circulation until ppn_pool_destroy */
    ppn_gstream *last_stream; /* stream of the last free (NULL: never freed) */
    ppn_gevent *ev;           /* recorded on last_stream at the last free */
    struct block *next_free;  /* free-list link (valid while !live) */
    struct block *next_all;   /* every block, for destroy */
} block;

typedef struct slab {
    ppn_dptr base;
    size_t size, used;
    struct slab *next;
} slab;

struct ppn_pool {
    pthread_mutex_t mu;       /* protects everything below */
    ppn_gpu *g;
    int dev;
    size_t slab_bytes, large_min;
    slab *slabs;              /* slabs[0] is the one carved from */
    block *free_cls[MAX_CLASSES];
    block *free_large;
    block *all;
    block **live;             /* open-addressing map ptr -> live block */
    size_t live_cap, live_n;
    ppn_pool_stats st;
#if PPN_TEST_HOOKS
    int skip_cross_wait;      /* test-only */
#endif
};

/* Live map ------------------------------------------------------------------------------------------------ */

static size_t live_slot(const ppn_pool *p, ppn_dptr ptr)
{
    return (size_t)((ptr >> MIN_SHIFT) * 0x9E3779B97F4A7C15ull) & (p->live_cap - 1);
}

static ppn_status live_grow(ppn_pool *p)
{
    size_t cap = p->live_cap ? p->live_cap * 2 : 256;
    block **t = calloc(cap, sizeof *t);
    if (!t) return ppn_err(PPN_ENOMEM, "pool dev %d: host out of memory for the block map", p->dev);
    block **old = p->live;
    size_t old_cap = p->live_cap;
    p->live = t;
    p->live_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i]) continue;
        size_t j = live_slot(p, old[i]->user);
        while (t[j]) j = (j + 1) & (cap - 1);
        t[j] = old[i];
    }
    free(old);
    return PPN_OK;
}

/* Room for one more live block, so that live_insert cannot fail. */
static ppn_status live_reserve(ppn_pool *p)
{
    return (p->live_n + 1) * 2 > p->live_cap ? live_grow(p) : PPN_OK;
}

static void live_insert(ppn_pool *p, block *b)
{
    size_t j = live_slot(p, b->user);
    while (p->live[j]) j = (j + 1) & (p->live_cap - 1);
    p->live[j] = b;
    p->live_n++;
}

/* Remove and return the live block at ptr, or NULL. Backward-shift deletion keeps probe chains intact. */
static block *live_take(ppn_pool *p, ppn_dptr ptr)
{
    if (!p->live_cap) return NULL;
    size_t j = live_slot(p, ptr);
    while (p->live[j] && p->live[j]->user != ptr) j = (j + 1) & (p->live_cap - 1);
    block *b = p->live[j];
    if (!b) return NULL;
    p->live[j] = NULL;
    p->live_n--;
    for (size_t k = (j + 1) & (p->live_cap - 1); p->live[k]; k = (k + 1) & (p->live_cap - 1)) {
        block *m = p->live[k];
        p->live[k] = NULL;
        size_t h = live_slot(p, m->user);
        while (p->live[h]) h = (h + 1) & (p->live_cap - 1);
        p->live[h] = m;
    }
    return b;
}

/* Sizes ---------------------------------------------------------------------------------------------------- */

static int size_class(size_t n)
{
    int c = 0;
    while (((size_t)1 << (c + MIN_SHIFT)) < n) c++;
    return c;
}

static size_t class_size(int c) { return (size_t)1 << (c + MIN_SHIFT); }

static size_t round_up(size_t n, size_t grain) { return (n + grain - 1) / grain * grain; }

/* Raw memory ----------------------------------------------------------------------------------------------- */

static ppn_status raw_alloc(ppn_pool *p, size_t n, const char *what, ppn_dptr *out)
{
    ppn_status st = p->g->ops->mem_alloc(p->g, p->dev, n, out);
    if (st != PPN_OK)
        return ppn_err_ctx(st, "pool dev %d: %s of %zu B (in use %zu B, reserved %zu B)", p->dev, what, n,
                           p->st.in_use, p->st.reserved);
    p->st.slabs++;
    p->st.reserved += n;
    return PPN_OK;
}

static ppn_status slab_new(ppn_pool *p, size_t need)
{
    size_t n = need > p->slab_bytes ? round_up(need, LARGE_GRAIN) : p->slab_bytes;
    slab *s = calloc(1, sizeof *s);
    if (!s) return ppn_err(PPN_ENOMEM, "pool dev %d: host out of memory", p->dev);
    ppn_status st = raw_alloc(p, n, "slab", &s->base);
    if (st != PPN_OK) {
        free(s);
        return st;
    }
    s->size = n;
    s->next = p->slabs;
    p->slabs = s;
    p->g->ops->mem_annotate(p->g, NULL, p->dev, s->base, n, PPN_ANN_CARVE, "pool slab");
    return PPN_OK;
}

/* A new block record with its event; ptr/size filled by the caller. */
static ppn_status block_new(ppn_pool *p, block **out)
{
    block *b = calloc(1, sizeof *b);
    if (!b) return ppn_err(PPN_ENOMEM, "pool dev %d: host out of memory", p->dev);
    ppn_status st = p->g->ops->event_create(p->g, p->dev, 0, &b->ev);
    if (st != PPN_OK) {
        free(b);
        return ppn_err_ctx(st, "pool dev %d: block event", p->dev);
    }
    *out = b;
    return PPN_OK;
}

static ppn_status carve_small(ppn_pool *p, int cls, block **out)
{
    size_t n = class_size(cls);
    if (!p->slabs || p->slabs->size - p->slabs->used < n) PPN_CHECK(slab_new(p, n));
    block *b;
    PPN_CHECK(block_new(p, &b));
    slab *s = p->slabs;
    b->ptr = s->base + s->used;
    b->size = n;
    b->cls = cls;
    s->used += n;
    b->next_all = p->all;
    p->all = b;
    *out = b;
    return PPN_OK;
}

static ppn_status carve_large(ppn_pool *p, size_t n, block **out)
{
    block *b;
    PPN_CHECK(block_new(p, &b));
    ppn_status st = raw_alloc(p, n, "large block", &b->ptr);
    if (st != PPN_OK) {
        p->g->ops->event_destroy(p->g, b->ev);
        free(b);
        return st;
    }
    b->size = n;
    b->cls = -1;
    b->next_all = p->all;
    p->all = b;
    *out = b;
    return PPN_OK;
}

/* Reuse ---------------------------------------------------------------------------------------------------- */

/* Unlink and return a free block of this list, preferring one last freed on s; sets *same_stream. */
static block *take_free(block **list, size_t want_size, ppn_gstream *s, int *same_stream)
{
    block **best = NULL;
    for (block **it = list; *it; it = &(*it)->next_free) {
        if ((*it)->size != want_size) continue;
        if ((*it)->last_stream == s) {
            best = it;
            break;
        }
        if (!best) best = it;
    }
    if (!best) return NULL;
    block *b = *best;
    *best = b->next_free;
    b->next_free = NULL;
    *same_stream = (b->last_stream == s);
    return b;
}

/* The one place a block freed on another stream is handed out: always behind an explicit wait. */
static ppn_status order_reuse(ppn_pool *p, block *b, ppn_gstream *s)
{
#if PPN_TEST_HOOKS
    if (p->skip_cross_wait) return PPN_OK;
#endif
    ppn_status st = p->g->ops->stream_wait_event(p->g, s, b->ev);
    if (st != PPN_OK) return ppn_err_ctx(st, "pool dev %d: cross-stream reuse wait", p->dev);
    p->st.cross_waits++;
    return PPN_OK;
}

static void push_free(ppn_pool *p, block *b)
{
    PPN_ASSERT(!b->retired);
    block **list = b->cls >= 0 ? &p->free_cls[b->cls] : &p->free_large;
    b->next_free = *list;
    *list = b;
}

/* A block whose free could not be ordered (no event recorded on the freeing stream): work queued before the
 * free may still use it, and nothing can make a later user wait for that work, so it is never handed out again.
 * It stays on p->all, so ppn_pool_destroy releases it with everything else (its caller drained the streams). */
static void retire(ppn_pool *p, block *b)
{
    b->retired = 1;
    p->st.retired++;
    p->st.retired_bytes += b->size;
}

/* Public --------------------------------------------------------------------------------------------------- */

ppn_status ppn_pool_create(ppn_gpu *g, int dev, size_t slab_bytes, ppn_pool **out)
{
    *out = NULL;
    if (dev < 0 || dev >= g->ops->device_count(g))
        return ppn_err(PPN_EINVAL, "pool: device %d does not exist (%d devices)", dev, g->ops->device_count(g));
    ppn_pool *p = calloc(1, sizeof *p);
    if (!p) return ppn_err(PPN_ENOMEM, "pool: host out of memory");
    pthread_mutex_init(&p->mu, NULL);
    p->g = g;
    p->dev = dev;
    p->slab_bytes = slab_bytes ? round_up(slab_bytes, LARGE_GRAIN) : DEFAULT_SLAB;
    p->large_min = p->slab_bytes / 4;
    *out = p;
    return PPN_OK;
}

/* Keep the first failure of a teardown in *first (with its message), carry on with the rest. */
static void keep_first(ppn_err_first *first, ppn_status st, const ppn_pool *p, const char *what)
{
    if (st == PPN_OK || first->st != PPN_OK) return;
    ppn_err_first_add(first, ppn_err_ctx(st, "pool dev %d: destroy: %s", p->dev, what));
}

/* A failed free does not stop the teardown (issue 14's rule for free and destroy paths): every other block,
 * slab and event is still released and the first failure returned; what the driver refused to free is its own
 * to reclaim when the backend closes (cuda: the context; sim: its close frees every live allocation). Retired
 * blocks are on p->all like every other: a large one's raw allocation is freed here, a small one goes with its
 * slab (the caller drained the streams, which is what their unrecorded events could not prove). */
ppn_status ppn_pool_destroy(ppn_pool *p)
{
    ppn_err_first first = {0};
    if (!p) return PPN_OK;
    for (block *b = p->all, *nx; b; b = nx) {
        nx = b->next_all;
        if (b->cls < 0) keep_first(&first, p->g->ops->mem_free(p->g, p->dev, b->ptr), p, "large block");
        keep_first(&first, p->g->ops->event_destroy(p->g, b->ev), p, "block event");
        free(b);
    }
    for (slab *s = p->slabs, *nx; s; s = nx) {
        nx = s->next;
        keep_first(&first, p->g->ops->mem_free(p->g, p->dev, s->base), p, "slab");
        free(s);
    }
    free(p->live);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return ppn_err_first_done(&first);
}

static ppn_status alloc_locked(ppn_pool *p, size_t n, ppn_gstream *s, const char *tag, ppn_dptr *out)
{
    int large = n > p->large_min;
    int cls = large ? -1 : size_class(n);
    size_t size = large ? round_up(n, LARGE_GRAIN) : class_size(cls);
    int same = 0;
    block *b = take_free(large ? &p->free_large : &p->free_cls[cls], size, s, &same);
    ppn_status st;
    if (b && !same && (st = order_reuse(p, b, s)) != PPN_OK) {
        push_free(p, b);
        return st;
    }
    if (!b) PPN_CHECK(large ? carve_large(p, size, &b) : carve_small(p, cls, &b));
    if ((st = live_reserve(p)) != PPN_OK) {
        push_free(p, b);
        return st;
    }
    b->live = 1;
    p->g->ops->mem_annotate(p->g, NULL, p->dev, b->ptr, b->size, PPN_ANN_ALLOC, tag);
    /* the checker's address for this allocation (sim: names its generation; bounds are n, not the class) */
    b->user = b->ptr;
    if (p->g->ops->mem_issue) p->g->ops->mem_issue(p->g, p->dev, b->ptr, n, &b->user);
    live_insert(p, b);
    p->st.in_use += b->size;
    if (p->st.in_use > p->st.peak) p->st.peak = p->st.in_use;
    *out = b->user;
    return PPN_OK;
}

ppn_status ppn_pool_alloc(ppn_pool *p, size_t n, ppn_gstream *s, const char *tag, ppn_dptr *out)
{
    *out = 0;
    if (n == 0 || !s) return ppn_err(PPN_EINVAL, "pool dev %d: alloc of %zu B on stream %p", p->dev, n, (void *)s);
    pthread_mutex_lock(&p->mu);
    p->st.allocs++;
    ppn_status st = alloc_locked(p, n, s, tag, out);
    pthread_mutex_unlock(&p->mu);
    return st;
}

ppn_status ppn_pool_free(ppn_pool *p, ppn_dptr ptr, ppn_gstream *s)
{
    if (!s) return ppn_err(PPN_EINVAL, "pool dev %d: free of 0x%llx without a stream", p->dev,
                           (unsigned long long)ptr);
    if (p->g->ops->stream_device(p->g, s) != p->dev)
        return ppn_err(PPN_EINVAL, "pool dev %d: free of 0x%llx on a stream of device %d (free on the pool's device)",
                       p->dev, (unsigned long long)ptr, p->g->ops->stream_device(p->g, s));
    pthread_mutex_lock(&p->mu);
    ppn_status st = PPN_OK;
    block *b = live_take(p, ptr);
    if (!b) {
        st = ppn_err(PPN_EDOUBLEFREE, "pool dev %d: free of 0x%llx, which is not a live block (double free?)",
                     p->dev, (unsigned long long)ptr);
        goto out;
    }
    p->g->ops->mem_annotate(p->g, s, p->dev, b->user, b->size, PPN_ANN_FREE, NULL);
    p->st.in_use -= b->size;
    b->live = 0;
    st = p->g->ops->event_record(p->g, b->ev, s);
    if (st != PPN_OK) {
        retire(p, b);
        st = ppn_err_ctx(st, "pool dev %d: free of 0x%llx: the block's event record failed, so it is retired (out "
                         "of circulation until the pool is destroyed)", p->dev, (unsigned long long)ptr);
        goto out;
    }
    b->last_stream = s;
    push_free(p, b);
    p->st.frees++;
out:
    pthread_mutex_unlock(&p->mu);
    return st;
}

void ppn_pool_get_stats(ppn_pool *p, ppn_pool_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
}

int ppn_pool_device(const ppn_pool *p) { return p->dev; }

void ppn_pool_stream_retired(ppn_pool *p, ppn_gstream *s)
{
    pthread_mutex_lock(&p->mu);
    for (block *b = p->all; b; b = b->next_all)
        if (b->last_stream == s) b->last_stream = NULL;
    pthread_mutex_unlock(&p->mu);
}

#if PPN_TEST_HOOKS
void ppn_pool_test_skip_cross_wait(ppn_pool *p, int skip)
{
    pthread_mutex_lock(&p->mu);
    p->skip_cross_wait = skip;
    pthread_mutex_unlock(&p->mu);
}
#endif
