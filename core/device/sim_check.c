/* sim_check.c - the sim backend's happens-before checker and memory map.
 *
 * WHAT IT PROVES. Every op on a sim stream declares the device ranges it reads and writes (a launch: its
 * ppn_launch.acc[]; a copy: its source and destination; a memset: its destination; PPN_ANN_FREE: a write of
 * the freed block by the freeing stream). The checker finds, and reports naming the op (and, for races, use
 * after free and double free, the earlier op involved):
 *   RACE            two accesses to one block, at least one a write, on different streams, with no chain of
 *                   event records/waits (or host syncs) ordering them;
 *   PLACEMENT       a kernel, dtod copy or memset on a stream of device d touching device e's memory with no
 *                   peer_enable(d, e); a host copy touching another device's memory the same way; a copy_peer
 *                   whose memory is not on the devices it names (copy_peer itself needs no grant);
 *   USE AFTER FREE  an access to a freed pool block or to a raw allocation after mem_free;
 *   DOUBLE FREE     PPN_ANN_FREE of anything but a live block; mem_free twice or of an unknown pointer;
 *   BOUNDS          a range not inside one allocation, or inside a carved (pool) region but not inside one
 *                   block, or past the bytes requested of a block handed out by mem_issue (not the class size);
 *   STALE POINTER   an access to a live block through the address of an earlier allocation of it (counted as
 *                   stale, status PPN_EUSEAFTERFREE).
 *
 * BLOCKS. Access history is kept per block: a raw mem_alloc region, or, inside a region the pool has carved
 * (PPN_ANN_CARVE), a pool block (PPN_ANN_ALLOC; outside any carved region, ALLOC carves its own range first).
 * Two ops touching different bytes of one block are treated as touching the same block (the pool hands out
 * whole blocks, so that never happens in correct code).
 * A block's record survives its free and is revived (or, when the new block has other extents, trimmed and
 * its history merged into the new one) by a later PPN_ANN_ALLOC. So a block freed on stream A and handed to
 * stream B still carries A's accesses and A's free: B's first access races with them unless an event chain
 * (or a host sync) orders it after the free.
 *
 * VECTOR CLOCKS. Stream i's clock VC_i is an array indexed by stream id. Executing op #k of stream i sets
 * VC_i[i] = k (ops are numbered from 1 in issue order). An event record snapshots VC_i into a refcounted
 * record object created when event_record is called; stream_wait_event binds, when it is called, to the
 * event's latest record (CUDA semantics), and the waiting stream merges that record's snapshot (max per
 * entry) once the record has executed. The host also has clocks (sim_thr), with ids from the streams' id
 * space: stream_sync, event_sync and a "done" event_query merge what they waited for into the calling
 * thread's clock, and the next op that thread issues merges it first (host order is real order in CUDA too).
 * Every host thread has its own clock (PPN_SIM_THREAD_CLOCKS=1, the default), so a sync orders only the
 * syncing thread's later ops, and a two-thread program whose threads are ordered only by host means (a mutex,
 * a queue, thread creation) is reported whatever the timing, unless the hand-off is declared: host_release
 * before the signal publishes the thread's clock under a key, host_acquire after the wait merges it. The
 * runtime declares each of its hand-offs beside the synchronisation itself: the stage threads' commands and
 * done words (core/step.c, core/model.c), a step's done generation (core/step.c, core/pending.c, core/seq.c),
 * the boundary generations (transport/boundary.c) and the engine's scheduler thread (core/engine.c); an
 * embedder declares its own through ppn.h's ppn_model_handoff_release / _acquire (core/model.c).
 * PPN_SIM_THREAD_CLOCKS=0 makes every thread share one clock (the opt-out: a race that timing orders then
 * goes unseen).
 * An earlier access by stream j at clock c happens-before the current op of stream i iff c <= VC_i[j].
 *
 * PINNED HOST MEMORY. host_alloc regions are tracked too: the host side of copy_htod (a read) and copy_dtoh
 * (a write) is declared as an access of the issuing stream, and a host thread declares its own reads and
 * writes of pinned buffers with host_access (checked at once, against the thread's clock). Histories are
 * kept per range accessed (the pinned arena sub-allocates regions without telling the backend). Memory that
 * is not pinned is not tracked.
 *
 * HISTORY per block: for each stream, its latest write not superseded and its latest read since; a write
 * that passes the check replaces everything with itself (one that raced is added beside what it raced with).
 * An access conflicts with an entry of another stream (W-W, W-R, R-W) whose clock is not <= the accessor's VC
 * entry for that stream. Whether a race is reported is decided by the clocks alone, not by how the worker
 * threads happened to be scheduled (only which of the two ops is named first, the one that ran second, depends
 * on it).
 *
 * GENERATIONS. Every raw allocation reserves SIM_VIEWS windows of address space; window 0 is the memory,
 * and mem_issue maps window w (1..SIM_VIEWS-1) as an alias of the same pages. Each allocation of a pool block
 * (a generation) is handed out in the window after its previous one's, so the address itself says which
 * generation the holder got: an access resolves to the block and its window must be the current one. The
 * aliases are the same memory, so the CPU kernels run on them unchanged; the checker keeps its records at the
 * window-0 address. A stale address goes unseen only when the block was reused a multiple of SIM_VIEWS-1
 * times since (the windows wrap).
 *
 * WHEN. Liveness and bounds follow the pool's view in host order: they are resolved when the op is issued
 * (an op issued while its block is live is fine even if the block is freed later in stream order; the free's
 * write then orders or races with it). Races are found when the op executes, on its worker thread, under
 * g->ck. A raw allocation freed by mem_free after an op was issued is caught at execution (the memory is
 * gone: the op is skipped). Every finding is printed when its op executes and the first one becomes the
 * backend's sticky error (gpu_sim.c), returned by the next sync, query or enqueue on any stream.
 * An op with a finding is not executed (one report per op at most). A placement or race finding still
 * records its accesses (it names valid memory), so later ops are checked against it. Skipping racy ops
 * also means the simulated memory never sees two racing accesses overlap in real time: a program the
 * checker flags does not also trip ThreadSanitizer in the simulator itself.
 *
 * Every function here runs with g->ck held.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "core/base/err.h"
#include "core/device/sim_internal.h"

typedef unsigned long long ull;

/* ---- op and block names for reports --------------------------------------------------------------- */

void sim_fmt_op(char *buf, size_t cap, const sim_opref *r)
{
    if (r->dev < 0) { /* a host thread's access */
        snprintf(buf, cap, "host thread %d access #%llu: %s%s%s", r->stream, (ull)r->idx, r->what,
                 r->name ? " of " : "", r->name ? r->name : "");
        return;
    }
    snprintf(buf, cap, "stream %d (dev %d) op #%llu %s%s%s", r->stream, r->dev, (ull)r->idx, r->what,
             r->name ? " " : "", r->name ? r->name : "");
}

static void fmt_block(char *buf, size_t cap, const sim_raw *raw, const sim_block *b)
{
    if (raw->host && b)
        snprintf(buf, cap, "pinned host range 0x%llx [%zu B] (host_alloc region 0x%llx [%zu B])", (ull)b->base,
                 b->bytes, (ull)raw->base, raw->bytes);
    else if (raw->host)
        snprintf(buf, cap, "pinned host region 0x%llx [%zu B]", (ull)raw->base, raw->bytes);
    else if (b)
        snprintf(buf, cap, "block 0x%llx [%zu B, '%s'] (dev %d)", (ull)b->base, b->bytes, b->tag, raw->dev);
    else
        snprintf(buf, cap, "allocation 0x%llx [%zu B, raw] (dev %d)", (ull)raw->base, raw->bytes, raw->dev);
}

static const char *mode_name(int mode)
{
    return mode == PPN_ACC_RW ? "read-write" : (mode & PPN_ACC_W) ? "write" : "read";
}

/* Record the first finding of an op made at issue time; later findings of the same op are dropped. */
__attribute__((format(printf, 3, 4))) static void set_verdict(sim_op *op, ppn_status st, const char *fmt, ...)
{
    if (op->verdict != PPN_OK) return;
    op->verdict = st;
    op->vkind = -1;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&op->report, fmt, ap) < 0) op->report = NULL; /* emit prints a fallback */
    va_end(ap);
}

/* ---- reports ---------------------------------------------------------------------------------------- */

static int count_index(ppn_status st)
{
    switch (st) {
    case PPN_ERACE: return SIM_REP_RACE;
    case PPN_EPLACEMENT: return SIM_REP_PLACEMENT;
    case PPN_EUSEAFTERFREE: return SIM_REP_UAF;
    case PPN_EDOUBLEFREE: return SIM_REP_DFREE;
    case PPN_EBOUNDS: return SIM_REP_BOUNDS;
    default: return -1;
    }
}

/* Print a finding, count it, and make it the sticky error if there is none. */
void sim_ck_emit(sim_gpu *g, ppn_status st, const char *msg) { sim_ck_emit_kind(g, st, count_index(st), msg); }

/* The same, counted as kind (SIM_REP_*; -1: not counted). */
void sim_ck_emit_kind(sim_gpu *g, ppn_status st, int kind, const char *msg)
{
    int i = kind;
    if (!msg) msg = "ppn sim: a checker report was lost (out of host memory while formatting it)";
    if (i >= 0) g->counts[i]++;
    if (g->printed < SIM_MAX_PRINTED) {
        fprintf(stderr, "%s\n", msg);
        if (++g->printed == SIM_MAX_PRINTED)
            fprintf(stderr, "ppn sim: %d reports printed; further ones are only counted\n", SIM_MAX_PRINTED);
    }
    if (g->sticky == PPN_OK) {
        g->sticky = st;
        snprintf(g->sticky_msg, sizeof g->sticky_msg, "%s", msg);
    }
}

/* ---- history ---------------------------------------------------------------------------------------- */

void sim_hist_clear(sim_hist *h)
{
    free(h->w);
    free(h->r);
    memset(h, 0, sizeof *h);
}

/* Set the entry of e->stream in arr to e if e is later (or there is none). Returns -1 when out of memory. */
static int epoch_upsert(sim_epoch **arr, int *n, int *cap, const sim_epoch *e)
{
    for (int i = 0; i < *n; i++) {
        if ((*arr)[i].stream != e->stream) continue;
        if ((*arr)[i].clock < e->clock) (*arr)[i] = *e;
        return 0;
    }
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 2;
        sim_epoch *na = realloc(*arr, (size_t)nc * sizeof *na);
        if (!na) return -1;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = *e;
    return 0;
}

static int hist_merge(sim_hist *dst, const sim_hist *src)
{
    for (int i = 0; i < src->nw; i++)
        if (epoch_upsert(&dst->w, &dst->nw, &dst->capw, &src->w[i])) return -1;
    for (int i = 0; i < src->nr; i++)
        if (epoch_upsert(&dst->r, &dst->nr, &dst->capr, &src->r[i])) return -1;
    return 0;
}

static uint64_t vc_get(const sim_who *s, int stream)
{
    return (size_t)stream < s->len ? s->vc[stream] : 0;
}

/* The first entry of h that conflicts with an access of mode by s, or NULL. *prev_w: it is a write. */
static const sim_epoch *hist_conflict(const sim_hist *h, const sim_who *s, int mode, int *prev_w)
{
    for (int i = 0; i < h->nw; i++) {
        const sim_epoch *e = &h->w[i];
        if (e->stream != s->id && e->clock > vc_get(s, e->stream)) {
            *prev_w = 1;
            return e;
        }
    }
    if (!(mode & PPN_ACC_W)) return NULL;
    for (int i = 0; i < h->nr; i++) {
        const sim_epoch *e = &h->r[i];
        if (e->stream != s->id && e->clock > vc_get(s, e->stream)) {
            *prev_w = 0;
            return e;
        }
    }
    return NULL;
}

/* Record e. A write replaces everything with itself, unless it raced (record() says why). */
static int hist_update(sim_hist *h, const sim_epoch *e, int mode, int raced)
{
    if (mode & PPN_ACC_W) {
        if (!raced) h->nw = h->nr = 0;
        return epoch_upsert(&h->w, &h->nw, &h->capw, e);
    }
    return epoch_upsert(&h->r, &h->nr, &h->capr, e);
}

/* ---- the memory map ---------------------------------------------------------------------------------- */

static int in_range(ppn_dptr base, size_t bytes, ppn_dptr p, size_t n)
{
    return p >= base && n <= bytes && p - base <= bytes - n;
}

static int overlaps(ppn_dptr a, size_t an, ppn_dptr b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* Index of the first raw allocation whose base is > p. */
static int raw_upper(sim_gpu *g, ppn_dptr p)
{
    int lo = 0, hi = g->nraws;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (g->raws[mid]->base <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The address range an allocation holds: its windows (or its bytes, for a record made without them). */
static size_t raw_extent(const sim_raw *r) { return r->map_bytes ? r->map_bytes : r->bytes; }

/* The allocation (live or tombstone) whose address range (any window) contains p, or NULL. */
sim_raw *sim_raw_find(sim_gpu *g, ppn_dptr p)
{
    int i = raw_upper(g, p) - 1;
    if (i < 0) return NULL;
    sim_raw *r = g->raws[i];
    return p - r->base < raw_extent(r) ? r : NULL;
}

/* p with its window taken off (the allocation's own address of the same byte); *window: which window p is
 * in. p itself, window 0, when no allocation holds it. */
ppn_dptr sim_canonical(sim_gpu *g, ppn_dptr p, sim_raw **raw, unsigned *window)
{
    sim_raw *r = sim_raw_find(g, p);
    *raw = r;
    *window = 0;
    if (!r || !r->stride) return p;
    *window = (unsigned)((p - r->base) / r->stride);
    return r->base + (p - r->base) % r->stride;
}

void sim_raw_drop_contents(sim_raw *raw)
{
    for (int i = 0; i < raw->nblocks; i++) {
        sim_hist_clear(&raw->blocks[i]->h);
        free(raw->blocks[i]);
    }
    free(raw->blocks);
    raw->blocks = NULL;
    raw->nblocks = raw->capblocks = 0;
    free(raw->carved);
    raw->carved = NULL;
    raw->ncarved = raw->capcarved = 0;
    sim_hist_clear(&raw->h);
}

void sim_raw_destroy(sim_raw *raw)
{
    if (!raw) return;
    sim_raw_drop_contents(raw);
    free(raw);
}

/* Insert a new live allocation; tombstones its range overlaps are forgotten (their memory was released and
 * the host allocator reused it). Returns PPN_OK or PPN_ENOMEM (nothing changed). */
ppn_status sim_raw_insert(sim_gpu *g, sim_raw *raw)
{
    if (g->nraws == g->capraws) {
        int nc = g->capraws ? g->capraws * 2 : 16;
        sim_raw **na = realloc(g->raws, (size_t)nc * sizeof *na);
        if (!na) return ppn_err(PPN_ENOMEM, "sim: out of host memory for the allocation table");
        g->raws = na;
        g->capraws = nc;
    }
    int j = 0;
    for (int i = 0; i < g->nraws; i++) {
        sim_raw *r = g->raws[i];
        if (overlaps(r->base, raw_extent(r), raw->base, raw_extent(raw))) {
            PPN_ASSERT(!r->live); /* the host allocator never hands out live memory twice */
            sim_raw_destroy(r);
            continue;
        }
        g->raws[j++] = r;
    }
    g->nraws = j;
    int at = raw_upper(g, raw->base);
    memmove(&g->raws[at + 1], &g->raws[at], (size_t)(g->nraws - at) * sizeof *g->raws);
    g->raws[at] = raw;
    g->nraws++;
    return PPN_OK;
}

/* Index of the first block of raw that ends after p. */
static int blk_first_after(const sim_raw *raw, ppn_dptr p)
{
    int lo = 0, hi = raw->nblocks;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        const sim_block *b = raw->blocks[mid];
        if (b->base + b->bytes <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static sim_range *carved_overlap(const sim_raw *raw, ppn_dptr p, size_t n)
{
    for (int i = 0; i < raw->ncarved; i++)
        if (overlaps(raw->carved[i].base, raw->carved[i].bytes, p, n)) return &raw->carved[i];
    return NULL;
}

/* ---- annotations (host order) -------------------------------------------------------------------------- */

static ppn_status find_live_raw(sim_gpu *g, int dev, ppn_dptr p, size_t n, const char *what, sim_raw **out)
{
    sim_raw *raw = sim_raw_find(g, p);
    if (!raw || !raw->live || !in_range(raw->base, raw->bytes, p, n))
        return ppn_err(PPN_EINVAL, "sim: mem_annotate %s of [0x%llx, +%zu B) on dev %d: not inside one live "
                       "allocation", what, (ull)p, n, dev);
    if (raw->dev != dev)
        return ppn_err(PPN_EINVAL, "sim: mem_annotate %s of [0x%llx, +%zu B): the memory is on dev %d, not "
                       "dev %d", what, (ull)p, n, raw->dev, dev);
    *out = raw;
    return PPN_OK;
}

static sim_block *block_new(ppn_dptr base, size_t bytes, int state, const char *tag)
{
    sim_block *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->base = base;
    b->bytes = bytes;
    b->state = state;
    snprintf(b->tag, sizeof b->tag, "%s", tag ? tag : "");
    return b;
}

static int blocks_reserve(sim_raw *raw, int extra)
{
    if (raw->nblocks + extra <= raw->capblocks) return 0;
    int nc = raw->capblocks ? raw->capblocks * 2 : 8;
    while (nc < raw->nblocks + extra) nc *= 2;
    sim_block **na = realloc(raw->blocks, (size_t)nc * sizeof *na);
    if (!na) return -1;
    raw->blocks = na;
    raw->capblocks = nc;
    return 0;
}

/* PPN_ANN_CARVE: [p, p+n) becomes pool-managed. It starts as one UNALLOCATED record carrying the history of
 * the raw region (accesses made before the carve still order against later blocks). */
ppn_status sim_ck_carve(sim_gpu *g, int dev, ppn_dptr p, size_t n)
{
    sim_raw *raw;
    PPN_CHECK(find_live_raw(g, dev, p, n, "CARVE", &raw));
    sim_range *c = carved_overlap(raw, p, n);
    if (c)
        return ppn_err(PPN_EINVAL, "sim: mem_annotate CARVE of [0x%llx, +%zu B) overlaps the carved region "
                       "[0x%llx, +%zu B)", (ull)p, n, (ull)c->base, c->bytes);
    sim_block *b = block_new(p, n, SIM_BLK_UNALLOCATED, "unallocated");
    if (!b || blocks_reserve(raw, 1) || hist_merge(&b->h, &raw->h)) goto oom;
    if (raw->ncarved == raw->capcarved) {
        int nc = raw->capcarved ? raw->capcarved * 2 : 2;
        sim_range *na = realloc(raw->carved, (size_t)nc * sizeof *na);
        if (!na) goto oom;
        raw->carved = na;
        raw->capcarved = nc;
    }
    raw->carved[raw->ncarved++] = (sim_range){p, n};
    int at = blk_first_after(raw, p);
    memmove(&raw->blocks[at + 1], &raw->blocks[at], (size_t)(raw->nblocks - at) * sizeof *raw->blocks);
    raw->blocks[at] = b;
    raw->nblocks++;
    return PPN_OK;
oom:
    if (b) sim_hist_clear(&b->h);
    free(b);
    return ppn_err(PPN_ENOMEM, "sim: out of host memory for checker records (CARVE)");
}

/* Copy of b trimmed to [base, base+bytes), with its state, tag and history. */
static sim_block *block_piece(const sim_block *b, ppn_dptr base, size_t bytes)
{
    sim_block *nb = block_new(base, bytes, b->state, b->tag);
    if (!nb) return NULL;
    nb->freed_by = b->freed_by;
    nb->gen = b->gen;
    if (hist_merge(&nb->h, &b->h)) {
        sim_hist_clear(&nb->h);
        free(nb);
        return NULL;
    }
    return nb;
}

static void block_free(sim_block *b)
{
    if (!b) return;
    sim_hist_clear(&b->h);
    free(b);
}

/* PPN_ANN_ALLOC: [p, p+n) becomes a live block. The records it overlaps (freed or never allocated) are
 * replaced: their parts outside [p, p+n) remain, with their history; the new block gets the union of the
 * overlapped histories, so reuse across streams is checked against what happened before the free.
 * Outside any carved region, the range is carved first (how a block that is a whole raw allocation, such as
 * the pool's large blocks, comes under the same rules). */
ppn_status sim_ck_alloc(sim_gpu *g, int dev, ppn_dptr p, size_t n, const char *tag)
{
    sim_raw *raw;
    PPN_CHECK(find_live_raw(g, dev, p, n, "ALLOC", &raw));
    sim_range *c = carved_overlap(raw, p, n);
    if (!c) { /* a block outside any pool region (e.g. a whole raw allocation): its range becomes one */
        PPN_CHECK(sim_ck_carve(g, dev, p, n));
        c = carved_overlap(raw, p, n);
    }
    if (!in_range(c->base, c->bytes, p, n))
        return ppn_err(PPN_EINVAL, "sim: mem_annotate ALLOC of [0x%llx, +%zu B) '%s': straddles the edge of the "
                       "carved region [0x%llx, +%zu B)", (ull)p, n, tag ? tag : "", (ull)c->base, c->bytes);
    int i = blk_first_after(raw, p), j = i;
    while (j < raw->nblocks && raw->blocks[j]->base < p + n) j++;
    PPN_ASSERT(j > i); /* carved regions are covered by records */
    for (int k = i; k < j; k++) {
        sim_block *b = raw->blocks[k];
        if (b->state == SIM_BLK_LIVE)
            return ppn_err(PPN_EINVAL, "sim: mem_annotate ALLOC of [0x%llx, +%zu B) '%s' overlaps the live "
                           "block 0x%llx [%zu B, '%s'] (pool bug: a block handed out twice)", (ull)p, n,
                           tag ? tag : "", (ull)b->base, b->bytes, b->tag);
    }
    sim_block *first = raw->blocks[i], *last = raw->blocks[j - 1];
    if (j == i + 1 && first->base == p && first->bytes == n) { /* the same block again: revive it */
        first->state = SIM_BLK_LIVE;
        first->req = 0;
        first->window = 0;
        first->armed_gen = 0; /* guarded again only if handed out by mem_issue */
        snprintf(first->tag, sizeof first->tag, "%s", tag ? tag : "");
        return PPN_OK;
    }
    /* Build the replacement of blocks[i..j): [left piece] new [right piece], before touching the table. */
    sim_block *rep[3];
    int nrep = 0;
    sim_block *nb = block_new(p, n, SIM_BLK_LIVE, tag), *left = NULL, *right = NULL;
    if (!nb || blocks_reserve(raw, 2)) goto oom;
    for (int k = i; k < j; k++) {
        if (hist_merge(&nb->h, &raw->blocks[k]->h)) goto oom;
        if (raw->blocks[k]->gen > nb->gen) nb->gen = raw->blocks[k]->gen; /* its addresses are taken */
    }
    if (first->base < p && !(left = block_piece(first, first->base, p - first->base))) goto oom;
    if (last->base + last->bytes > p + n && !(right = block_piece(last, p + n, last->base + last->bytes - p - n)))
        goto oom;
    if (left) rep[nrep++] = left;
    rep[nrep++] = nb;
    if (right) rep[nrep++] = right;
    for (int k = i; k < j; k++) block_free(raw->blocks[k]);
    memmove(&raw->blocks[i + nrep], &raw->blocks[j], (size_t)(raw->nblocks - j) * sizeof *raw->blocks);
    memcpy(&raw->blocks[i], rep, (size_t)nrep * sizeof *rep);
    raw->nblocks += nrep - (j - i);
    return PPN_OK;
oom:
    block_free(nb);
    block_free(left);
    block_free(right);
    return ppn_err(PPN_ENOMEM, "sim: out of host memory for checker records (ALLOC)");
}

/* PPN_ANN_FREE issued on op's stream: op->acc[0] is the block's range (a write). A live block becomes freed
 * now (pool view) and the op carries the write; anything else is a double free, reported when op executes.
 * Returns PPN_EINVAL only when the memory is on another device than dev. */
ppn_status sim_ck_free(sim_gpu *g, int dev, sim_op *op)
{
    char me[192], prev[192], blk[160];
    sim_raw *raw;
    unsigned win;
    ppn_dptr p = sim_canonical(g, op->acc[0].p, &raw, &win);
    size_t n = op->acc[0].n;
    sim_block *b = NULL;
    sim_fmt_op(me, sizeof me, &op->ref);
    if (raw && raw->live && raw->dev != dev)
        return ppn_err(PPN_EINVAL, "sim: mem_annotate FREE of [0x%llx, +%zu B): the memory is on dev %d, not "
                       "dev %d", (ull)p, n, raw->dev, dev);
    if (raw && raw->live && carved_overlap(raw, p, n)) {
        int i = blk_first_after(raw, p);
        if (i < raw->nblocks && raw->blocks[i]->base == p && raw->blocks[i]->bytes == n) b = raw->blocks[i];
    }
    if (b && b->state == SIM_BLK_LIVE) {
        sim_ck_resolve(g, op);
        b->state = SIM_BLK_FREED;
        b->freed_by = op->ref;
        raw->free_pending++;
        op->free_base = b->base;
        op->free_serial = raw->serial;
        op->free_req = b->armed_gen && b->armed_gen == b->gen ? b->req : 0;
        return PPN_OK;
    }
    op->nacc = 0; /* nothing to execute or record */
    if (b && b->state == SIM_BLK_FREED) {
        fmt_block(blk, sizeof blk, raw, b);
        sim_fmt_op(prev, sizeof prev, &b->freed_by);
        set_verdict(op, PPN_EDOUBLEFREE, "ppn sim: DOUBLE FREE of %s: free by %s; previously freed by %s",
                    blk, me, prev);
        return PPN_OK;
    }
    const char *why = !raw ? "no allocation contains it"
                      : !raw->live ? "its allocation was freed by mem_free"
                      : !carved_overlap(raw, p, n) ? "it is not in a carved (pool) region"
                      : b ? "that block was never allocated"
                          : "no block has exactly this range";
    set_verdict(op, PPN_EDOUBLEFREE, "ppn sim: DOUBLE FREE: free by %s of [0x%llx, +%zu B), which is not a live "
                "block: %s", me, (ull)p, n, why);
    return PPN_OK;
}

/* Map window w of raw (an alias of its memory: both name the same pages). Returns 0, or -1 (errno). */
static int window_map(sim_raw *raw, unsigned w)
{
    if ((raw->mapped >> w) & 1) return 0;
    void *at = (void *)(uintptr_t)(raw->base + (ppn_dptr)w * raw->stride);
    /* old_size 0 on a shared mapping: a second mapping of the same pages (mremap(2)) */
    void *p = mremap((void *)(uintptr_t)raw->base, 0, raw->stride, MREMAP_MAYMOVE | MREMAP_FIXED, at);
    if (p == MAP_FAILED) return -1;
    raw->mapped |= 1u << w;
    return 0;
}

/* mem_issue: the live block at p starts a new generation of n requested bytes; *out is its address in the
 * window that names it. Consecutive generations of a block get different windows (1..SIM_VIEWS-1 in turn), so
 * a stale address is caught unless the block was reused a multiple of SIM_VIEWS-1 times in between. */
ppn_status sim_ck_issue(sim_gpu *g, int dev, ppn_dptr p, size_t n, ppn_dptr *out)
{
    sim_raw *raw;
    PPN_CHECK(find_live_raw(g, dev, p, 1, "ISSUE", &raw));
    int i = blk_first_after(raw, p);
    sim_block *b = i < raw->nblocks ? raw->blocks[i] : NULL;
    if (!b || b->base != p || b->state != SIM_BLK_LIVE || n == 0 || n > b->bytes)
        return ppn_err(PPN_EINVAL, "sim: mem_issue of %zu B at 0x%llx (dev %d): not a live block of at least that "
                       "size (annotate PPN_ANN_ALLOC first)", n, (ull)p, dev);
    *out = p;
    if (!raw->stride) return PPN_OK; /* no windows: the block's own address */
    unsigned w = 1 + b->gen % (SIM_VIEWS - 1);
    if (window_map(raw, w))
        return ppn_err(PPN_ENOMEM, "sim: mem_issue: mapping address window %u of 0x%llx failed", w, (ull)raw->base);
    b->gen++;
    b->window = w;
    b->req = n;
    b->armed_gen = 0;
    /* Guard bytes past n, written now only when no free of this allocation's blocks is still queued (one could
     * be the previous owner's, whose ops may still write there within its own size); else this generation goes
     * unguarded. */
    if (raw->free_pending == 0 && n < b->bytes) {
        memset((void *)(uintptr_t)(p + n), SIM_CANARY, b->bytes - n);
        b->armed_gen = b->gen;
    }
    *out = p + (ppn_dptr)w * raw->stride;
    return PPN_OK;
}

/* ---- issue-time resolution ------------------------------------------------------------------------------ */

/* Check one access against the pool's current view: inside one allocation, live, inside one live block when
 * carved, and on an allowed device. Returns 0 when fine. */
static int resolve_acc(sim_gpu *g, sim_op *op, sim_acc *a)
{
    char me[192], blk[256], prev[192];
    sim_fmt_op(me, sizeof me, &op->ref);
    const char *mn = mode_name(a->mode);
    sim_raw *raw;
    unsigned win;
    ppn_dptr given = a->p;
    a->p = sim_canonical(g, a->p, &raw, &win); /* history and execution-time checks use the own address */
    if (a->host && (!raw || !raw->host)) { /* the host side of a copy in memory that is not pinned: untracked */
        a->n = 0;
        return 0;
    }
    if (!raw || (raw->host && !a->host)) {
        set_verdict(op, PPN_EBOUNDS, "ppn sim: ACCESS OUTSIDE A BLOCK: %s of [0x%llx, +%zu B) by %s: the "
                    "address is in no device allocation", mn, (ull)a->p, a->n, me);
        return -1;
    }
    fmt_block(blk, sizeof blk, raw, NULL);
    if (!in_range(raw->base, raw->bytes, a->p, a->n)) {
        set_verdict(op, PPN_EBOUNDS, "ppn sim: ACCESS OUTSIDE A BLOCK: %s of [0x%llx, +%zu B) by %s extends "
                    "%llu B past the end of %s", mn, (ull)a->p, a->n, me,
                    (ull)(a->p + a->n - raw->base - raw->bytes), blk);
        return -1;
    }
    if (!raw->live) {
        set_verdict(op, PPN_EUSEAFTERFREE, "ppn sim: USE AFTER FREE of %s: %s of [0x%llx, +%zu B) by %s; the "
                    "allocation was freed by mem_free on the host", blk, mn, (ull)a->p, a->n, me);
        return -1;
    }
    if (!carved_overlap(raw, a->p, a->n) && win != 0) {
        set_verdict(op, PPN_EBOUNDS, "ppn sim: ACCESS OUTSIDE A BLOCK: %s of [0x%llx, +%zu B) by %s: the address "
                    "is in alias window %u of %s, which only pool blocks are handed out in", mn, (ull)given, a->n,
                    me, win, blk);
        return -1;
    }
    if (carved_overlap(raw, a->p, a->n)) {
        int i = blk_first_after(raw, a->p);
        sim_block *b = i < raw->nblocks ? raw->blocks[i] : NULL;
        if (!b || b->state == SIM_BLK_UNALLOCATED || !in_range(b->base, b->bytes, a->p, a->n)) {
            if (!b || b->base > a->p)
                snprintf(blk, sizeof blk, "it starts outside the pool region");
            else if (b->state == SIM_BLK_UNALLOCATED)
                snprintf(blk, sizeof blk, "it starts in unallocated pool space [0x%llx, +%zu B)", (ull)b->base,
                         b->bytes);
            else {
                char bb[160];
                fmt_block(bb, sizeof bb, raw, b);
                snprintf(blk, sizeof blk, "it starts in %s", bb);
            }
            set_verdict(op, PPN_EBOUNDS, "ppn sim: ACCESS OUTSIDE A BLOCK: %s of [0x%llx, +%zu B) by %s is in "
                        "a pool region but not inside one allocated block (%s)", mn, (ull)a->p, a->n, me, blk);
            return -1;
        }
        if (b->state == SIM_BLK_FREED) {
            fmt_block(blk, sizeof blk, raw, b);
            sim_fmt_op(prev, sizeof prev, &b->freed_by);
            set_verdict(op, PPN_EUSEAFTERFREE, "ppn sim: USE AFTER FREE of %s: %s of [0x%llx, +%zu B) by %s; "
                        "the block was freed by %s", blk, mn, (ull)a->p, a->n, me, prev);
            return -1;
        }
        if (win != b->window) {
            fmt_block(blk, sizeof blk, raw, b);
            set_verdict(op, PPN_EUSEAFTERFREE, "ppn sim: STALE POINTER into %s: %s of [0x%llx, +%zu B) by %s "
                        "goes through address window %u, but the block's current allocation (generation %u) was "
                        "handed out as window %u: the pointer is left from an earlier allocation of the block",
                        blk, mn, (ull)given, a->n, me, win, b->gen, b->window);
            op->vkind = SIM_REP_STALE;
            return -1;
        }
        size_t lim = b->req && op->kind != SIM_OP_FREE ? b->req : b->bytes; /* a free names the whole block */
        if (!in_range(b->base, lim, a->p, a->n)) {
            fmt_block(blk, sizeof blk, raw, b);
            set_verdict(op, PPN_EBOUNDS, "ppn sim: ACCESS OUTSIDE A BLOCK: %s of [0x%llx, +%zu B) by %s extends "
                        "%llu B past the %zu B requested of %s", mn, (ull)given, a->n, me,
                        (ull)(a->p + a->n - b->base - lim), lim, blk);
            return -1;
        }
    }
    if (a->want_dev >= 0 && raw->dev != a->want_dev) {
        int granted = a->peer_ok && ((g->peer_enabled[a->want_dev] >> raw->dev) & 1);
        if (!granted) {
            if (a->peer_ok)
                set_verdict(op, PPN_EPLACEMENT, "ppn sim: PLACEMENT FAULT: %s of [0x%llx, +%zu B) by %s "
                            "touches %s, memory of device %d, with no peer grant (peer_enable(%d, %d) was not "
                            "called)", mn, (ull)a->p, a->n, me, blk, raw->dev, a->want_dev, raw->dev);
            else
                set_verdict(op, PPN_EPLACEMENT, "ppn sim: PLACEMENT FAULT: %s of [0x%llx, +%zu B) by %s: "
                            "the copy names device %d but %s is on device %d", mn, (ull)a->p, a->n, me,
                            a->want_dev, blk, raw->dev);
            return -1;
        }
    }
    a->serial = raw->serial;
    return 0;
}

/* Resolve every declared access of op at issue time; the first finding becomes op->verdict. */
void sim_ck_resolve(sim_gpu *g, sim_op *op)
{
    for (int i = 0; i < op->nacc; i++) {
        if (op->acc[i].n == 0) continue;
        if (resolve_acc(g, op, &op->acc[i])) return;
    }
}

/* ---- guard bytes ------------------------------------------------------------------------------------------ */

/* UNDECLARED WRITE: a kernel (or any op) wrote bytes no op declared. Declared accesses past a block's
 * requested size are BOUNDS reports and are not executed, so bytes there change only by a write nobody
 * declared: they hold SIM_CANARY from the block's hand-out (mem_issue) and an allocation's from mem_alloc,
 * and are checked when the block's free executes and when the allocation is freed. The op is not named (the
 * write was not declared): the block's last declared writers are, as the likely culprits. */
static size_t guard_bad(ppn_dptr p, size_t n, size_t *first)
{
    const unsigned char *c = (const unsigned char *)(uintptr_t)p;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (c[i] != SIM_CANARY && !bad++) *first = i;
    return bad;
}

static void guard_report(sim_gpu *g, const sim_raw *raw, const sim_block *b, size_t size, size_t bad, size_t first,
                         const char *when)
{
    char blk[192], who[256] = "no op declared a write into it", op[192], msg[1024];
    fmt_block(blk, sizeof blk, raw, b);
    const sim_hist *h = b ? &b->h : &raw->h;
    for (int i = 0; i < h->nw && i < 2; i++) {
        sim_fmt_op(op, sizeof op, &h->w[i].op);
        size_t l = i ? strlen(who) : 0;
        snprintf(who + l, sizeof who - l, "%s%s", i ? "; " : "its last declared write: ", op);
    }
    snprintf(msg, sizeof msg, "ppn sim: UNDECLARED WRITE into %s: %zu byte(s) past its %zu B (the first at +%zu B) "
             "changed, found %s; no op declared a write there (%s)", blk, bad, size, size + first, when, who);
    sim_ck_emit_kind(g, PPN_EBOUNDS, SIM_REP_UNDECLARED, msg);
}

/* A raw allocation's own guard: the bytes between its size and its window's end. */
void sim_ck_raw_guard_fill(sim_raw *raw)
{
    if (raw->stride > raw->bytes)
        memset((void *)(uintptr_t)(raw->base + raw->bytes), SIM_CANARY, raw->stride - raw->bytes);
}

/* mem_free (nothing executes on raw any more): its own guard and its live guarded blocks'. */
void sim_ck_raw_guard_check(sim_gpu *g, sim_raw *raw)
{
    size_t first = 0, bad;
    if (raw->stride > raw->bytes && (bad = guard_bad(raw->base + raw->bytes, raw->stride - raw->bytes, &first)))
        guard_report(g, raw, NULL, raw->bytes, bad, first, "when the allocation was freed");
    for (int i = 0; i < raw->nblocks && !raw->host; i++) {
        sim_block *b = raw->blocks[i];
        if (b->state != SIM_BLK_LIVE || !b->req || !b->armed_gen || b->armed_gen != b->gen) continue;
        if ((bad = guard_bad(b->base + b->req, b->bytes - b->req, &first)))
            guard_report(g, raw, b, b->req, bad, first, "when its allocation was freed");
    }
}

/* The free of a guarded block executes: every op of its allocation is ordered before this one (or was
 * reported racing with it). */
static void guard_check_free(sim_gpu *g, const sim_op *op, sim_raw *raw)
{
    size_t first = 0, bad;
    int i = blk_first_after(raw, op->free_base);
    sim_block *b = i < raw->nblocks ? raw->blocks[i] : NULL;
    if (!b || b->base > op->free_base) return; /* reshaped since: no record names it any more */
    if ((bad = guard_bad(op->free_base + op->free_req, b->bytes - op->free_req, &first)))
        guard_report(g, raw, b, op->free_req, bad, first, "when the block's free executed");
}

/* ---- execution-time checks ---------------------------------------------------------------------------- */

static void report_race(sim_gpu *g, const sim_who *s, const sim_opref *ref, const sim_acc *a,
                        const sim_raw *raw, const sim_block *b, const sim_epoch *prev, int prev_w)
{
    char me[192], other[192], blk[192], msg[1024];
    sim_fmt_op(me, sizeof me, ref);
    sim_fmt_op(other, sizeof other, &prev->op);
    fmt_block(blk, sizeof blk, raw, b);
    char seen[96];
    uint64_t upto = vc_get(s, prev->stream);
    const char *me_kind = ref->dev < 0 ? "host thread" : "stream";
    const char *pk = prev->op.dev < 0 ? "host thread" : "stream";
    if (upto)
        snprintf(seen, sizeof seen, "%s %d has seen %s %d only up to %s #%llu", me_kind, s->id, pk, prev->stream,
                 prev->op.dev < 0 ? "access" : "op", (ull)upto);
    else
        snprintf(seen, sizeof seen, "%s %d has seen nothing of %s %d", me_kind, s->id, pk, prev->stream);
    snprintf(msg, sizeof msg, "ppn sim: RACE on %s: %s of [0x%llx, +%zu B) by %s; previous %s by %s; no event "
             "chain orders them (%s)", blk, mode_name(a->mode), (ull)a->p, a->n, me, prev_w ? "write" : "read",
             other, seen);
    sim_ck_emit(g, PPN_ERACE, msg);
}

/* Check one history against the access and report the first conflict (once per op). Returns whether the access
 * conflicts (reported now or not: the op may have been reported already). */
static int check_only(sim_gpu *g, const sim_who *s, const sim_opref *ref, const sim_acc *a, const sim_raw *raw,
                      const sim_block *b, const sim_hist *h, int *reported)
{
    int prev_w = 0;
    const sim_epoch *prev = hist_conflict(h, s, a->mode, &prev_w);
    if (prev && !*reported) {
        report_race(g, s, ref, a, raw, b, prev, prev_w);
        *reported = 1;
    }
    return prev != NULL;
}

/* Record the access. A write that conflicted keeps the entries it raced with: it is not ordered after them (and is
 * not executed), and they may still be running, so a later op that the racing write's stream orders must still be
 * checked against them. Had it replaced them, that op would pass and run beside them: the simulator's own memory
 * would race (ThreadSanitizer saw it: test_pipeline_checker_sees_missing_boundary_wait, CI of 2026-12-07). */
static void record(sim_gpu *g, const sim_who *s, const sim_opref *ref, int mode, int raced, sim_hist *h,
                   int *reported)
{
    sim_epoch e = {s->id, ref->idx, *ref};
    if (hist_update(h, &e, mode, raced) && !*reported) {
        sim_ck_emit(g, PPN_ENOMEM, "ppn sim: out of host memory for access history");
        *reported = 1;
    }
}

/* Check one history against the access, report the first conflict (once per op), then record the access. */
static void check_hist(sim_gpu *g, const sim_who *s, const sim_opref *ref, const sim_acc *a, const sim_raw *raw,
                       const sim_block *b, sim_hist *h, int *reported)
{
    int raced = check_only(g, s, ref, a, raw, b, h, reported);
    record(g, s, ref, a->mode, raced, h, reported);
}

/* ---- pinned host memory ------------------------------------------------------------------------------------ */

/* Pinned host memory comes in host_alloc regions that the pinned arena sub-allocates without telling the
 * backend, so it has no blocks. Its history is kept per range accessed instead: one record per exact range
 * (the buffers are used whole, so each buffer soon has its own), checked against every record it overlaps. A
 * write drops the records it covers: whatever they hold is ordered before it or was reported with it, so a
 * later access ordered after the write is ordered after them too, and one that is not conflicts with it. */
static sim_block *host_range(sim_raw *raw, ppn_dptr p, size_t n)
{
    for (int i = 0; i < raw->nblocks; i++)
        if (raw->blocks[i]->base == p && raw->blocks[i]->bytes == n) return raw->blocks[i];
    if (blocks_reserve(raw, 1)) return NULL;
    sim_block *b = block_new(p, n, SIM_BLK_LIVE, "pinned");
    if (b) raw->blocks[raw->nblocks++] = b;
    return b;
}

static void check_host(sim_gpu *g, const sim_who *s, const sim_opref *ref, const sim_acc *a, sim_raw *raw,
                       int *reported)
{
    int raced = 0;
    for (int i = 0; i < raw->nblocks; i++) {
        sim_block *b = raw->blocks[i];
        if (overlaps(b->base, b->bytes, a->p, a->n)) raced |= check_only(g, s, ref, a, raw, b, &b->h, reported);
    }
    sim_block *x = host_range(raw, a->p, a->n);
    if (!x) {
        if (!*reported) sim_ck_emit(g, PPN_ENOMEM, "ppn sim: out of host memory for access history");
        *reported = 1;
        return;
    }
    if ((a->mode & PPN_ACC_W) && !raced) {
        int j = 0;
        for (int i = 0; i < raw->nblocks; i++) {
            sim_block *b = raw->blocks[i];
            if (b != x && in_range(a->p, a->n, b->base, b->bytes)) block_free(b);
            else raw->blocks[j++] = b;
        }
        raw->nblocks = j;
    }
    record(g, s, ref, a->mode, raced, &x->h, reported);
}

/* A host_access of [p, p+n) now, by who as ref: a host thread's access (the caller has counted it in the
 * thread's clock) or a host function's (the stream's op). Pinned memory only: other memory is not tracked. */
void sim_ck_host_access(sim_gpu *g, const sim_who *who, const sim_opref *op, const void *p, size_t n, int mode)
{
    sim_raw *raw = sim_raw_find(g, (ppn_dptr)(uintptr_t)p);
    if (!raw || !raw->host || n == 0) return;
    sim_opref ref = *op;
    sim_acc a = {(ppn_dptr)(uintptr_t)p, n, mode, -1, 0, 1, raw->serial, NULL};
    char me[192], blk[192], msg[512];
    if (!raw->live || !in_range(raw->base, raw->bytes, a.p, n)) {
        sim_fmt_op(me, sizeof me, &ref);
        fmt_block(blk, sizeof blk, raw, NULL);
        snprintf(msg, sizeof msg, "ppn sim: %s: [0x%llx, +%zu B) by %s %s %s", !raw->live ? "USE AFTER FREE" :
                 "ACCESS OUTSIDE A BLOCK", (ull)a.p, n, me, !raw->live ? "after host_free of" : "is not inside",
                 blk);
        sim_ck_emit(g, !raw->live ? PPN_EUSEAFTERFREE : PPN_EBOUNDS, msg);
        return;
    }
    int reported = 0;
    check_host(g, who, &ref, &a, raw, &reported);
    /* A copy still running on it would touch the memory while the caller does (the report stands either way):
     * wait for it, so the simulator itself never races (ThreadSanitizer runs these tests too). */
    if (reported && raw->busy) {
        raw->waiters++;
        while (raw->busy) pthread_cond_wait(&g->busy_cv, &g->ck); /* pairs with sim_ck_exec_end */
        raw->waiters--;
    }
}

static void check_access(sim_gpu *g, const sim_who *s, const sim_op *op, const sim_acc *a, sim_raw *raw,
                         int *reported)
{
    if (raw->host) {
        check_host(g, s, &op->ref, a, raw, reported);
        return;
    }
    if (!carved_overlap(raw, a->p, a->n)) {
        check_hist(g, s, &op->ref, a, raw, NULL, &raw->h, reported);
        return;
    }
    /* Records may have been split or merged by ALLOC since issue: check every one the range touches. */
    for (int i = blk_first_after(raw, a->p); i < raw->nblocks && raw->blocks[i]->base < a->p + a->n; i++)
        check_hist(g, s, &op->ref, a, raw, raw->blocks[i], &raw->blocks[i]->h, reported);
}

/* Called on the worker with s's clock already advanced to this op. Emits op's issue-time finding, checks that
 * its allocations are still the ones resolved at issue (else use after free), takes busy references, and
 * checks/records its accesses. Returns 1 when the op must not execute (it has a finding). */
int sim_ck_exec_begin(sim_gpu *g, struct ppn_gstream *s, sim_op *op)
{
    int reported = 0;
    sim_raw *fr = op->free_serial ? sim_raw_find(g, op->free_base) : NULL;
    if (fr && fr->serial != op->free_serial) fr = NULL;
    if (fr) fr->free_pending--; /* a free of one of its blocks is no longer queued */
    if (fr && op->free_req && op->verdict == PPN_OK) guard_check_free(g, op, fr);
    if (op->verdict != PPN_OK) {
        sim_ck_emit_kind(g, op->verdict, op->vkind >= 0 ? op->vkind : count_index(op->verdict), op->report);
        if (op->verdict != PPN_EPLACEMENT) return 1; /* its ranges may not be valid memory */
        reported = 1;                                /* valid memory: record its accesses, then skip it */
    }
    for (int i = 0; i < op->nacc; i++) {
        sim_acc *a = &op->acc[i];
        if (a->n == 0) continue;
        sim_raw *raw = sim_raw_find(g, a->p);
        if (!raw || raw->serial != a->serial || !raw->live) {
            char me[192], msg[512];
            sim_fmt_op(me, sizeof me, &op->ref);
            snprintf(msg, sizeof msg, "ppn sim: USE AFTER FREE: %s of [0x%llx, +%zu B) by %s; its allocation "
                     "was freed by mem_free on the host after the op was issued", mode_name(a->mode),
                     (ull)a->p, a->n, me);
            if (!reported) sim_ck_emit(g, PPN_EUSEAFTERFREE, msg);
            return 1;
        }
        raw->busy++;
        a->busy_raw = raw;
    }
    sim_who who = {s->id, s->vc, s->vc_len};
    for (int i = 0; i < op->nacc; i++)
        if (op->acc[i].busy_raw) check_access(g, &who, op, &op->acc[i], op->acc[i].busy_raw, &reported);
    return reported;
}

/* Drop the busy references taken by sim_ck_exec_begin; wakes a mem_free waiting for them. */
void sim_ck_exec_end(sim_gpu *g, sim_op *op)
{
    for (int i = 0; i < op->nacc; i++) {
        sim_raw *raw = op->acc[i].busy_raw;
        if (!raw) continue;
        op->acc[i].busy_raw = NULL;
        if (--raw->busy == 0 && (!raw->live || raw->waiters)) pthread_cond_broadcast(&g->busy_cv);
    }
}
