/* gpu_sim.c - the sim backend of the device layer: virtual devices in host memory, one worker thread per
 * stream, events as refcounted vector-clock records, CPU reference kernels, fault injection and an optional
 * latency model. The happens-before checker it feeds is in sim_check.c (its header comment has the rules).
 *
 * Environment, read once by ppn_gpu_sim_create (empty = unset). The table in core/base/env.c parses each one
 * but the lists PPN_SIM_PEER and PPN_SIM_FAIL, checked here; an invalid PPN_PDL is refused here too, and
 * PPN_TMA=0 turns tma_ok off (the TMA kernels' maps are the sim's own encoding, read by their CPU references):
 *   PPN_SIM_DEVICES  number of devices, 1..64 (default 4)
 *   PPN_SIM_MEM      capacity per device in bytes, suffix K, M, G or T (binary) allowed (default 8G). Host
 *                    memory is taken per mem_alloc, not up front.
 *   PPN_SIM_PEER     all (default) | none | pairs "0-1,2-3": which peer grants are possible (symmetric)
 *   PPN_SIM_FAIL     "kind:K,..." with kind alloc (mem_alloc), copy (htod, dtoh, dtod, peer), launch, record
 *                    (event_record), wait (stream_wait_event), memset, hostfn (host_fn), free (mem_free,
 *                    host_free), stream (stream_create) or event (event_create): the K-th such call (1-based,
 *                    per backend) fails, with PPN_ENOMEM (alloc) or PPN_EDRIVER, and does nothing
 *   PPN_SIM_LATENCY  1: each op takes a modelled time (K in 2..1000: K times it) (launch 4 us, a kernel replayed from a graph 1 us; copy
 *                    5 us + bytes at 1 TB/s on a device, 50 GB/s peer, 20 GB/s host or host-staged); 0
 *                    (default): ops run as fast as they can. The launch/graph ratio is the H200's (DESIGN.md:
 *                    100 small kernels, 333 us through a stream, 114 us as one graph). Each accepted copy's
 *                    and launch's unscaled cost is accounted per kind (ppn_sim_counts.copies, copy_model_ns;
 *                    launches, launch_model_ns: launched or graph-replayed) whatever this says: the model's
 *                    figures without the wall clock, what tests check it on
 *   PPN_SIM_THREAD_CLOCKS  1 (default): a checker clock per host thread (a sync orders only the syncing
 *                    thread's later ops; a hand-off between threads orders them only where it is declared,
 *                    host_release / host_acquire: by the runtime, or by an embedder through ppn.h's
 *                    ppn_model_handoff_release / _acquire); 0: one host clock shared by every thread, the opt-out
 *                    (a race that timing happens to order goes unseen; sim_check.c says more)
 *   PPN_KPROF        1: account each kernel's calls, declared bytes and the CPU wall time of its reference
 *                    implementation (kprof_read); 0 (default): off
 *
 * Stream ids are 0, 1, 2... in creation order per backend and are what reports print; op indices are 1-based
 * per stream in issue order. A report makes the backend's sticky error: every later sync, query or enqueue
 * on any stream returns it (with the report as ppn_last_error()) until ppn_gpu_sim_take_error() clears it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "core/base/env.h"
#include "core/base/err.h"
#include "core/device/gpu.h"
#include "core/device/sim_internal.h"

typedef unsigned long long ull;


static const struct ppn_gpu_ops sim_ops;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static sim_gpu *sim_of(ppn_gpu *g) { return (sim_gpu *)g; }

struct sim_graph;
static void graph_free(struct sim_graph *gr);
static ppn_status check_stream(ppn_gstream *s, const char *call);

/* The kernel profile (PPN_KPROF=1). It lives beside sim_gpu, in the same allocation, so the structures the
 * checker shares with sim_check.c stay as they are. */
typedef struct sim_kprof {
    int on;                        /* immutable after create */
    pthread_mutex_t mu;            /* the totals below */
    uint64_t calls[PPN_GPU_MAX_KERNELS];
    uint64_t ns[PPN_GPU_MAX_KERNELS];      /* CPU wall time of the reference kernels */
    double bytes[PPN_GPU_MAX_KERNELS];
} sim_kprof;

typedef struct sim_gpu_kp {
    sim_gpu g; /* first: a ppn_gpu * is a sim_gpu * is a sim_gpu_kp * */
    sim_kprof kp;
} sim_gpu_kp;

static sim_kprof *kp_of(sim_gpu *g) { return &((sim_gpu_kp *)g)->kp; }

/* ---- environment ------------------------------------------------------------------------------------ */

/* The table in core/base/env.c holds the ranges; this one must match the device arrays here. */
_Static_assert(SIM_MAX_DEVICES == 64, "PPN_SIM_DEVICES' range in core/base/env.c is 1..64");

static int parse_u64(const char *s, const char **end, uint64_t *out)
{
    if (*s < '0' || *s > '9') return -1;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v)) return -1;
    *end = s;
    *out = v;
    return 0;
}

/* One "a-b" pair of PPN_SIM_PEER; returns 0 and advances *s, or -1. */
static int parse_pair(sim_gpu *g, const char **s, int *a, int *b)
{
    uint64_t x, y;
    const char *end;
    if (parse_u64(*s, &end, &x) || *end != '-' || parse_u64(end + 1, &end, &y)) return -1;
    if (x >= (uint64_t)g->ndev || y >= (uint64_t)g->ndev || x == y) return -1;
    *a = (int)x;
    *b = (int)y;
    *s = end;
    return 0;
}

/* PPN_SIM_PEER is a TEXT of the table: its pairs depend on PPN_SIM_DEVICES, so it is checked here. */
static ppn_status parse_peer(sim_gpu *g)
{
    const char *v;
    PPN_CHECK(ppn_env_str("PPN_SIM_PEER", &v));
    snprintf(g->peer_env, sizeof g->peer_env, "%s", v ? v : "all");
    if (!v || !strcmp(v, "all")) {
        for (int d = 0; d < g->ndev; d++)
            for (int e = 0; e < g->ndev; e++)
                if (d != e) g->peer_possible[d] |= 1ull << e;
        return PPN_OK;
    }
    if (!strcmp(v, "none")) return PPN_OK;
    for (const char *s = v;;) {
        int a, b;
        if (parse_pair(g, &s, &a, &b))
            return ppn_err(PPN_EINVAL, "PPN_SIM_PEER='%s' is invalid: it must be all, none, or pairs of two "
                           "different devices below PPN_SIM_DEVICES=%d like 0-1,2-3", v, g->ndev);
        g->peer_possible[a] |= 1ull << b;
        g->peer_possible[b] |= 1ull << a;
        if (!*s) return PPN_OK;
        if (*s++ != ',' || !*s)
            return ppn_err(PPN_EINVAL, "PPN_SIM_PEER='%s' is invalid: pairs must be separated by single "
                           "commas (e.g. 0-1,2-3)", v);
    }
}

_Static_assert(SIM_FAIL_KINDS == PPN_SIM_FAIL_KINDS, "ppn_sim_counts.fault_calls must have a slot per fault kind");
static const char *const fail_names[SIM_FAIL_KINDS] = {"alloc",  "copy",   "launch", "record", "wait",
                                                        "memset", "hostfn", "free",   "stream", "event"};

/* PPN_SIM_FAIL is a TEXT of the table: its kinds are the sim's, so it is checked here. */
static ppn_status parse_fail(sim_gpu *g)
{
    const char *const *kinds = fail_names;
    const char *v;
    PPN_CHECK(ppn_env_str("PPN_SIM_FAIL", &v));
    if (!v) return PPN_OK;
    for (const char *s = v;;) {
        int kind = -1;
        for (int k = 0; k < SIM_FAIL_KINDS; k++) {
            size_t l = strlen(kinds[k]);
            if (!strncmp(s, kinds[k], l) && s[l] == ':') {
                kind = k;
                s += l + 1;
            }
        }
        uint64_t n;
        const char *end;
        if (kind < 0 || parse_u64(s, &end, &n) || n == 0 || (*end && *end != ',') || (*end == ',' && !end[1]))
            return ppn_err(PPN_EINVAL, "PPN_SIM_FAIL='%s' is invalid: it must be a comma-separated list of "
                           "kind:K with kind alloc, copy, launch, record, wait, memset, hostfn, free, stream or event "
                           "and K >= 1 (e.g. alloc:3,launch:10)",
                           v);
        if (g->nfails == SIM_MAX_FAILS)
            return ppn_err(PPN_EINVAL, "PPN_SIM_FAIL='%s' is invalid: it must have at most %d entries", v,
                           SIM_MAX_FAILS);
        g->fails[g->nfails++] = (sim_fail){kind, n};
        if (!*end) return PPN_OK;
        s = end + 1;
    }
}

/* Every variable the sim reads, each refused by name. PPN_SIM_LATENCY is 0..1000: 0 off, K the model's times
 * multiplied by K (tests that compare arms whose modelled difference would drown in a small VM's scheduling
 * noise at K = 1 scale it up). */
static ppn_status parse_env(sim_gpu *g, sim_kprof *kp)
{
    int pdl;
    PPN_CHECK(ppn_env_int("PPN_SIM_DEVICES", &g->ndev));
    PPN_CHECK(ppn_env_size("PPN_SIM_MEM", &g->cap));
    PPN_CHECK(parse_peer(g));
    PPN_CHECK(parse_fail(g));
    PPN_CHECK(ppn_env_int("PPN_SIM_LATENCY", &g->latency));
    PPN_CHECK(ppn_env_flag("PPN_SIM_THREAD_CLOCKS", &g->thread_clocks));
    PPN_CHECK(ppn_env_flag("PPN_KPROF", &kp->on));
    g->tma = 1;
    PPN_CHECK(ppn_env_int("PPN_TMA", &g->tma));
    /* The sim has no programmatic dependent launch, but a value no backend accepts is refused on every
     * backend: a typo is caught on the simulator, before it reaches a GPU run. */
    return ppn_env_flag("PPN_PDL", &pdl);
}

/* ---- small helpers ---------------------------------------------------------------------------------- */

static sim_rec *rec_new(size_t len)
{
    sim_rec *r = calloc(1, sizeof *r + len * sizeof(uint64_t));
    if (!r) return NULL;
    r->refs = 1;
    r->len = len;
    return r;
}

static sim_rec *rec_ref(sim_rec *r)
{
    if (r) __atomic_fetch_add(&r->refs, 1, __ATOMIC_RELAXED);
    return r;
}

static void rec_unref(sim_rec *r)
{
    /* pairs with the other owners' release: the last one frees */
    if (r && __atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL) == 0) free(r);
}

/* Grow a zero-extended clock array to len entries. */
static int vc_grow(uint64_t **vc, size_t *vlen, size_t len)
{
    if (*vlen >= len) return 0;
    uint64_t *n = realloc(*vc, len * sizeof *n);
    if (!n) return -1;
    memset(n + *vlen, 0, (len - *vlen) * sizeof *n);
    *vc = n;
    *vlen = len;
    return 0;
}

static void vc_merge(uint64_t *vc, size_t vlen, const uint64_t *src, size_t slen)
{
    PPN_ASSERT(vlen >= slen); /* grown when the op was issued */
    for (size_t i = 0; i < slen; i++)
        if (src[i] > vc[i]) vc[i] = src[i];
}

/* ---- host threads ------------------------------------------------------------------------------------- */

static _Thread_local char thr_token; /* its address names the thread */
static _Thread_local struct {
    uint64_t serial;
    sim_thr *t;
} thr_cache; /* the calling thread's clock on the backend it used last */
static _Atomic uint64_t backend_serials;

/* Under ck: the calling thread's clock on g, made on first use (an id of its own, nothing observed yet), or
 * NULL when out of host memory. With PPN_SIM_THREAD_CLOCKS=0 every thread gets the one shared clock. */
sim_thr *sim_thr_self(sim_gpu *g)
{
    if (thr_cache.serial == g->serial) return thr_cache.t;
    const void *key = g->thread_clocks ? &thr_token : NULL;
    sim_thr *t = NULL;
    for (int i = 0; i < g->nthrs && !t; i++)
        if (g->thrs[i]->key == key) t = g->thrs[i];
    if (!t) {
        if (g->nthrs == g->capthrs) {
            int nc = g->capthrs ? 2 * g->capthrs : 8;
            sim_thr **na = realloc(g->thrs, (size_t)nc * sizeof *na);
            if (!na) return NULL;
            g->thrs = na;
            g->capthrs = nc;
        }
        t = calloc(1, sizeof *t);
        if (!t) return NULL;
        t->key = key;
        t->id = g->next_stream_id;
        if (vc_grow(&t->vc, &t->len, (size_t)t->id + 1)) {
            free(t);
            return NULL;
        }
        g->next_stream_id++;
        g->thrs[g->nthrs++] = t;
    }
    thr_cache.serial = g->serial;
    thr_cache.t = t;
    return t;
}

static ppn_status thr_oom(void) { return ppn_err(PPN_ENOMEM, "sim: out of host memory for a host thread's clock"); }

/* Under ck: the calling thread has observed everything in vc (a sync or query returned). */
static ppn_status host_merge(sim_gpu *g, const uint64_t *vc, size_t len)
{
    sim_thr *t = sim_thr_self(g);
    if (!t || vc_grow(&t->vc, &t->len, len)) return thr_oom();
    int changed = 0;
    for (size_t i = 0; i < len; i++)
        if (vc[i] > t->vc[i]) {
            t->vc[i] = vc[i];
            changed = 1;
        }
    if (changed) {
        t->ver++;
        rec_unref(t->snap);
        t->snap = NULL;
    }
    return PPN_OK;
}

/* Under ck: the sticky error as this thread's status and message, or PPN_OK. */
static ppn_status sticky_status(sim_gpu *g)
{
    if (g->sticky == PPN_OK) return PPN_OK;
    return ppn_err(g->sticky, "%s", g->sticky_msg);
}

static int valid_dev(sim_gpu *g, int dev) { return dev >= 0 && dev < g->ndev; }

static ppn_status bad_dev(sim_gpu *g, const char *call, int dev)
{
    return ppn_err(PPN_EINVAL, "sim: %s: device %d does not exist (PPN_SIM_DEVICES=%d)", call, dev, g->ndev);
}

/* ---- ops: build, issue, execute -------------------------------------------------------------------- */

static sim_op *op_new(ppn_gstream *s, int kind, const char *what, const char *name)
{
    sim_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->kind = kind;
    op->ref = (sim_opref){s->id, s->dev, 0, what, name};
    op->acc = op->acc_in;
    op->cap_acc = PPN_LAUNCH_MAX_ACC;
    return op;
}

static void op_free(sim_op *op)
{
    if (!op) return;
    if (op->kind == SIM_OP_LAUNCH) free(op->u.k.params);
    if (op->kind == SIM_OP_RECORD || op->kind == SIM_OP_WAIT) rec_unref(op->u.ev.rec);
    rec_unref(op->hsnap);
    free(op->report);
    if (op->acc != op->acc_in) free(op->acc);
    free(op);
}

/* Room for n accesses (a launch's fixed list and its further ones); 0 when out of host memory. */
static int op_acc_reserve(sim_op *op, int n)
{
    if (n <= op->cap_acc) return 1;
    sim_acc *a = malloc((size_t)n * sizeof *a);
    if (!a) return 0;
    memcpy(a, op->acc, (size_t)op->nacc * sizeof *a);
    if (op->acc != op->acc_in) free(op->acc);
    op->acc = a;
    op->cap_acc = n;
    return 1;
}

static void op_acc(sim_op *op, ppn_dptr p, size_t n, int mode, int want_dev, int peer_ok)
{
    PPN_ASSERT(op->nacc < op->cap_acc);
    op->acc[op->nacc++] = (sim_acc){p, n, mode, want_dev, peer_ok, 0, 0, NULL};
}

/* The host side of a copy: checked when it is pinned memory (host_alloc), ignored otherwise. */
static void op_acc_host(sim_op *op, const void *p, size_t n, int mode)
{
    PPN_ASSERT(op->nacc < op->cap_acc);
    op->acc[op->nacc++] = (sim_acc){(ppn_dptr)(uintptr_t)p, n, mode, -1, 0, 1, 0, NULL};
}

/* Under ck: count a call of this fault kind; 1 when PPN_SIM_FAIL says it must fail. */
static int fail_hit(sim_gpu *g, int kind, uint64_t *nth)
{
    *nth = ++g->fail_count[kind];
    for (int i = 0; i < g->nfails; i++)
        if (g->fails[i].kind == kind && g->fails[i].k == *nth) return 1;
    return 0;
}

static ppn_status injected(int kind, uint64_t nth, ppn_status st)
{
    return ppn_err(st, "sim: injected failure of %s #%llu (PPN_SIM_FAIL)", fail_names[kind], (ull)nth);
}

/* Under ck: attach the issuing thread's clock to op unless s has already seen that version of it. */
static ppn_status attach_host(sim_gpu *g, ppn_gstream *s, sim_op *op, sim_thr *t)
{
    if (s->seen_thr == t && s->seen_ver == t->ver) return PPN_OK;
    if (!t->snap) {
        sim_rec *r = rec_new(t->len);
        if (!r) return ppn_err(PPN_ENOMEM, "sim: out of host memory (host clock snapshot)");
        memcpy(r->vc, t->vc, t->len * sizeof *r->vc);
        r->done = 1;
        t->snap = r;
    }
    if (vc_grow(&s->vc, &s->vc_len, t->snap->len))
        return ppn_err(PPN_ENOMEM, "sim: out of host memory (vector clock)");
    op->hsnap = rec_ref(t->snap);
    return PPN_OK;
}

/* Under ck: per-kind preparation that may fail (record object, clock growth for a wait). */
static ppn_status prepare_kind(sim_gpu *g, ppn_gstream *s, sim_op *op)
{
    if (op->kind == SIM_OP_RECORD) {
        op->u.ev.rec = rec_new((size_t)g->next_stream_id);
        if (!op->u.ev.rec) return ppn_err(PPN_ENOMEM, "sim: out of host memory (event record)");
    } else if (op->kind == SIM_OP_WAIT) {
        if (vc_grow(&s->vc, &s->vc_len, op->u.ev.rec->len))
            return ppn_err(PPN_ENOMEM, "sim: out of host memory (vector clock)");
    }
    return PPN_OK;
}

static void push(ppn_gstream *s, sim_op *op)
{
    pthread_mutex_lock(&s->lock);
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    s->n_enq++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->lock);
}

/* Issue op on s: sticky error, fault injection (fail_kind >= 0), host clock, issue-time checks, then the
 * queue. ev: the event an op of kind RECORD records. Takes ownership of op (freed on failure). */
static ppn_status submit(sim_gpu *g, ppn_gstream *s, sim_op *op, int fail_kind, ppn_gevent *ev)
{
    ppn_status st;
    uint64_t nth;
    sim_thr *t;
    op->ref.idx = s->n_enq + 1; /* only this (the issuing) thread writes n_enq */
    pthread_mutex_lock(&g->ck);
    PPN_CHECK_GOTO(sticky_status(g), st, out);
    if (!(t = sim_thr_self(g))) {
        st = thr_oom();
        goto out;
    }
    if (fail_kind >= 0 && fail_hit(g, fail_kind, &nth)) {
        st = injected(fail_kind, nth, PPN_EDRIVER);
        goto out;
    }
    PPN_CHECK_GOTO(prepare_kind(g, s, op), st, out);
    PPN_CHECK_GOTO(attach_host(g, s, op, t), st, out);
    if (op->kind == SIM_OP_FREE) PPN_CHECK_GOTO(sim_ck_free(g, op->ann_dev, op), st, out);
    else sim_ck_resolve(g, op);
    s->seen_thr = t;
    s->seen_ver = t->ver;
    if (op->copy_cost) { /* an accepted copy: the model's account (a refused one is not) */
        g->copies[op->copy_kind]++;
        g->copy_model_ns[op->copy_kind] += op->copy_cost;
    }
    if (op->launch_cost) { /* an accepted launch, the same way */
        g->launches[op->launch_kind]++;
        g->launch_model_ns[op->launch_kind] += op->launch_cost;
    }
out:
    pthread_mutex_unlock(&g->ck);
    if (st != PPN_OK) {
        op_free(op);
        return st;
    }
    if (op->kind == SIM_OP_RECORD) {
        pthread_mutex_lock(&g->sync);
        rec_unref(ev->latest);
        ev->latest = rec_ref(op->u.ev.rec);
        pthread_mutex_unlock(&g->sync);
    }
    push(s, op);
    return PPN_OK;
}

static void model_wait(uint64_t deadline)
{
    for (;;) {
        uint64_t t = now_ns();
        if (t >= deadline) return;
        if (deadline - t > 200000) { /* sleep most of a long wait, spin the end (sleep overshoots) */
            uint64_t wake = deadline - 100000;
            struct timespec ts = {(time_t)(wake / 1000000000ull), (long)(wake % 1000000000ull)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        }
    }
}

/* The host function running on this worker thread, so its host_access calls count as its op's accesses. */
static _Thread_local struct {
    sim_gpu *g;
    ppn_gstream *s;
    sim_op *op;
} exec_cur;

static void exec_body(sim_op *op)
{
    switch (op->kind) {
    case SIM_OP_HTOD: memcpy((void *)(uintptr_t)op->u.cp.dst, op->u.cp.hsrc, op->u.cp.n); break;
    case SIM_OP_DTOH: memcpy(op->u.cp.hdst, (const void *)(uintptr_t)op->u.cp.src, op->u.cp.n); break;
    case SIM_OP_DTOD:
    case SIM_OP_PEER:
        memmove((void *)(uintptr_t)op->u.cp.dst, (const void *)(uintptr_t)op->u.cp.src, op->u.cp.n);
        break;
    case SIM_OP_MEMSET: memset((void *)(uintptr_t)op->u.ms.dst, op->u.ms.v, op->u.ms.n); break;
    case SIM_OP_LAUNCH: op->u.k.cpu(op->u.k.params); break;
    case SIM_OP_HOSTFN: op->u.hf.fn(op->u.hf.arg); break; /* exec_cur names it (exec_op) */
    default: break;
    }
}

/* A launch ran (on its stream's worker): add it to the kernel profile. */
static void kprof_add(sim_gpu *g, const sim_op *op, uint64_t ns)
{
    sim_kprof *kp = kp_of(g);
    double bytes = 0;
    for (int i = 0; i < op->nacc; i++) bytes += (double)op->acc[i].n;
    pthread_mutex_lock(&kp->mu);
    kp->calls[op->u.k.kernel]++;
    kp->ns[op->u.k.kernel] += ns;
    kp->bytes[op->u.k.kernel] += bytes;
    pthread_mutex_unlock(&kp->mu);
}

/* Run one op on s's worker: wait for its record, advance s's clock, check, execute, publish. */
static void exec_op(sim_gpu *g, ppn_gstream *s, sim_op *op)
{
    if (op->kind == SIM_OP_WAIT) {
        pthread_mutex_lock(&g->sync);
        while (!op->u.ev.rec->done) pthread_cond_wait(&g->sync_cv, &g->sync);
        pthread_mutex_unlock(&g->sync);
    }
    uint64_t t0 = now_ns();
    pthread_mutex_lock(&g->ck);
    if (op->hsnap) vc_merge(s->vc, s->vc_len, op->hsnap->vc, op->hsnap->len);
    if (op->kind == SIM_OP_WAIT) vc_merge(s->vc, s->vc_len, op->u.ev.rec->vc, op->u.ev.rec->len);
    s->vc[s->id] = op->ref.idx;
    int skip = sim_ck_exec_begin(g, s, op);
    if (op->kind == SIM_OP_RECORD) {
        sim_rec *r = op->u.ev.rec;
        size_t n = s->vc_len < r->len ? s->vc_len : r->len;
        for (size_t i = n; i < s->vc_len; i++) PPN_ASSERT(s->vc[i] == 0); /* ids issued later: unseen */
        memcpy(r->vc, s->vc, n * sizeof *r->vc);
    }
    pthread_mutex_unlock(&g->ck);
    int timed = kp_of(g)->on && op->kind == SIM_OP_LAUNCH && !skip;
    uint64_t k0 = timed ? now_ns() : 0;
    if (op->kind == SIM_OP_HOSTFN) exec_cur.g = g, exec_cur.s = s, exec_cur.op = op;
    if (!skip) exec_body(op);
    exec_cur.g = NULL;
    if (timed) kprof_add(g, op, now_ns() - k0); /* the reference alone: not the modelled latency */
    if (op->model_ns) model_wait(t0 + op->model_ns);
    pthread_mutex_lock(&g->ck);
    sim_ck_exec_end(g, op);
    pthread_mutex_unlock(&g->ck);
    if (op->kind == SIM_OP_RECORD) {
        pthread_mutex_lock(&g->sync);
        op->u.ev.rec->t_ns = now_ns();
        op->u.ev.rec->done = 1;
        pthread_cond_broadcast(&g->sync_cv); /* pairs with the waits in exec_op and event_sync */
        pthread_mutex_unlock(&g->sync);
    }
}

static void *worker(void *arg)
{
    ppn_gstream *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv_work, &s->lock);
        sim_op *op = s->head;
        if (!op) { /* stop requested and the queue is drained */
            pthread_mutex_unlock(&s->lock);
            return NULL;
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        exec_op(s->g, s, op);
        op_free(op);
        pthread_mutex_lock(&s->lock);
        s->n_done++;
        pthread_cond_broadcast(&s->cv_done); /* pairs with the wait in stream_sync */
        pthread_mutex_unlock(&s->lock);
    }
}

/* ---- devices and memory ----------------------------------------------------------------------------- */

static int sim_device_count(ppn_gpu *gg) { return sim_of(gg)->ndev; }

static ppn_status sim_device_info(ppn_gpu *gg, int dev, ppn_device_info *out)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "device_info", dev);
    if (!out) return ppn_err(PPN_EINVAL, "sim: device_info: out is NULL");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "ppn-sim device %d", dev);
    /* A PCI location, so that a topology given by PPN_TOPO_XML can place the device (sched/topo.h). */
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "0000:%02x:00.0", dev + 1);
    out->mem_total = g->cap;
    out->sim = 1;
    out->sm_count = 1;
    return PPN_OK;
}

static ppn_status sim_mem_get_info(ppn_gpu *gg, int dev, size_t *free_b, size_t *total_b)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "mem_get_info", dev);
    pthread_mutex_lock(&g->ck);
    size_t used = g->used[dev];
    pthread_mutex_unlock(&g->ck);
    if (free_b) *free_b = g->cap - used;
    if (total_b) *total_b = g->cap;
    return PPN_OK;
}

/* Device memory: SIM_VIEWS windows of stride bytes are reserved, window 0 maps the memory (shared, lazily
 * zeroed pages), the others stay inaccessible until sim_ck_issue maps one as an alias of the same pages. */
static void *host_mem_get(size_t bytes, size_t *map_bytes, size_t *stride)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t st = (bytes + page - 1) / page * page, total;
    if (__builtin_mul_overflow(st, (size_t)SIM_VIEWS, &total)) return NULL;
    void *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (mmap(p, st, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) ==
        MAP_FAILED) {
        munmap(p, total);
        return NULL;
    }
    *map_bytes = total;
    *stride = st;
    return p;
}

static void host_mem_put(void *p, size_t map_bytes) { munmap(p, map_bytes); }

/* Reserve capacity, take host memory, register the allocation.
 * Returns PPN_OK, PPN_EINVAL (device, size), PPN_ENOMEM (capacity, host memory, injected). */
static ppn_status sim_mem_alloc(ppn_gpu *gg, int dev, size_t bytes, ppn_dptr *out)
{
    sim_gpu *g = sim_of(gg);
    ppn_status st = PPN_OK;
    uint64_t nth;
    void *mem = NULL;
    size_t map_bytes = 0;
    sim_raw *raw = NULL;
    if (!valid_dev(g, dev)) return bad_dev(g, "mem_alloc", dev);
    if (!out || bytes == 0) return ppn_err(PPN_EINVAL, "sim: mem_alloc of %zu B on dev %d: bad size or out", bytes, dev);
    __atomic_fetch_add(&gg->n_mem_alloc, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g->ck);
    if (fail_hit(g, SIM_FAIL_ALLOC, &nth)) st = injected(SIM_FAIL_ALLOC, nth, PPN_ENOMEM);
    else if (bytes > g->cap - g->used[dev])
        st = ppn_err(PPN_ENOMEM, "sim: mem_alloc of %zu B on device %d exceeds its capacity: %zu B of %zu B "
                     "in use (PPN_SIM_MEM)", bytes, dev, g->used[dev], g->cap);
    else g->used[dev] += bytes;
    pthread_mutex_unlock(&g->ck);
    if (st != PPN_OK) return st;
    size_t stride = 0;
    mem = host_mem_get(bytes, &map_bytes, &stride);
    raw = calloc(1, sizeof *raw);
    if (!mem || !raw) {
        st = ppn_err(PPN_ENOMEM, "sim: mem_alloc of %zu B on device %d: out of host memory", bytes, dev);
        goto fail;
    }
    *raw = (sim_raw){.base = (ppn_dptr)(uintptr_t)mem, .bytes = bytes, .dev = dev, .live = 1,
                     .map_bytes = map_bytes, .stride = stride, .mapped = 1};
    sim_ck_raw_guard_fill(raw);
    pthread_mutex_lock(&g->ck);
    raw->serial = ++g->next_serial;
    st = sim_raw_insert(g, raw);
    pthread_mutex_unlock(&g->ck);
    if (st != PPN_OK) goto fail;
    *out = raw->base;
    return PPN_OK;
fail:
    free(raw);
    if (mem) host_mem_put(mem, map_bytes);
    pthread_mutex_lock(&g->ck);
    g->used[dev] -= bytes;
    pthread_mutex_unlock(&g->ck);
    return st;
}

/* Under ck: a mem_free that frees nothing is a double-free report. */
static ppn_status bad_free(sim_gpu *g, int dev, ppn_dptr p, const sim_raw *raw)
{
    char msg[512];
    if (raw && raw->base == p)
        snprintf(msg, sizeof msg, "ppn sim: DOUBLE FREE: mem_free(dev %d, 0x%llx) on the host: allocation "
                 "0x%llx [%zu B, raw] (dev %d) was already freed by mem_free", dev, (ull)p, (ull)raw->base,
                 raw->bytes, raw->dev);
    else
        snprintf(msg, sizeof msg, "ppn sim: DOUBLE FREE: mem_free(dev %d, 0x%llx) on the host: no allocation "
                 "starts at this address", dev, (ull)p);
    sim_ck_emit(g, PPN_EDOUBLEFREE, msg);
    return ppn_err(PPN_EDOUBLEFREE, "%s", msg);
}

/* Free a raw allocation: waits for ops executing on it; ops issued on it that have not run yet will report a
 * use after free. Returns PPN_OK, PPN_EINVAL (device), PPN_EDOUBLEFREE (freed or unknown pointer). */
static ppn_status sim_mem_free(ppn_gpu *gg, int dev, ppn_dptr p)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "mem_free", dev);
    if (p == 0) return ppn_err(PPN_EINVAL, "sim: mem_free(dev %d, 0): null pointer", dev);
    uint64_t nth;
    pthread_mutex_lock(&g->ck);
    if (fail_hit(g, SIM_FAIL_FREE, &nth)) { /* nothing freed */
        pthread_mutex_unlock(&g->ck);
        return injected(SIM_FAIL_FREE, nth, PPN_EDRIVER);
    }
    sim_raw *raw = sim_raw_find(g, p);
    if (!raw || raw->base != p || !raw->live) {
        ppn_status st = bad_free(g, dev, p, raw);
        pthread_mutex_unlock(&g->ck);
        return st;
    }
    if (raw->dev != dev) {
        pthread_mutex_unlock(&g->ck);
        return ppn_err(PPN_EINVAL, "sim: mem_free(dev %d, 0x%llx): the allocation is on dev %d", dev, (ull)p,
                       raw->dev);
    }
    raw->live = 0;
    while (raw->busy) pthread_cond_wait(&g->busy_cv, &g->ck); /* pairs with sim_ck_exec_end */
    sim_ck_raw_guard_check(g, raw);
    g->used[dev] -= raw->bytes;
    size_t map_bytes = raw->map_bytes;
    sim_raw_drop_contents(raw); /* a tombstone: range, device and serial only */
    pthread_mutex_unlock(&g->ck);
    host_mem_put((void *)(uintptr_t)p, map_bytes);
    return PPN_OK;
}

/* Pinned host memory: a region the checker tracks (copies' host sides, host_access), per range accessed. */
static ppn_status sim_host_alloc(ppn_gpu *gg, size_t bytes, void **out)
{
    sim_gpu *g = sim_of(gg);
    if (!out || bytes == 0) return ppn_err(PPN_EINVAL, "sim: host_alloc of %zu B: bad size or out", bytes);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return ppn_err(PPN_ENOMEM, "sim: host_alloc of %zu B: mmap failed: %s", bytes, strerror(errno));
    sim_raw *raw = calloc(1, sizeof *raw);
    ppn_status st = raw ? PPN_OK : ppn_err(PPN_ENOMEM, "sim: host_alloc of %zu B: out of host memory", bytes);
    if (raw) {
        *raw = (sim_raw){.base = (ppn_dptr)(uintptr_t)p, .bytes = bytes, .dev = -1, .host = 1, .live = 1};
        pthread_mutex_lock(&g->ck);
        raw->serial = ++g->next_serial;
        st = sim_raw_insert(g, raw);
        pthread_mutex_unlock(&g->ck);
    }
    if (st != PPN_OK) {
        free(raw);
        munmap(p, bytes);
        return st;
    }
    *out = p;
    return PPN_OK;
}

/* Waits for copies executing on the region; its record stays as a tombstone, like device memory's. */
static ppn_status sim_host_free(ppn_gpu *gg, void *p, size_t bytes)
{
    sim_gpu *g = sim_of(gg);
    uint64_t nth;
    if (!p) return PPN_OK;
    pthread_mutex_lock(&g->ck);
    if (fail_hit(g, SIM_FAIL_FREE, &nth)) { /* nothing freed */
        pthread_mutex_unlock(&g->ck);
        return injected(SIM_FAIL_FREE, nth, PPN_EDRIVER);
    }
    sim_raw *raw = sim_raw_find(g, (ppn_dptr)(uintptr_t)p);
    if (raw && raw->host && raw->live && raw->base == (ppn_dptr)(uintptr_t)p) {
        raw->live = 0;
        while (raw->busy) pthread_cond_wait(&g->busy_cv, &g->ck); /* pairs with sim_ck_exec_end */
        sim_raw_drop_contents(raw);
    }
    pthread_mutex_unlock(&g->ck);
    if (munmap(p, bytes))
        return ppn_err(PPN_EINVAL, "sim: host_free(%p, %zu B): munmap failed: %s", p, bytes, strerror(errno));
    return PPN_OK;
}

/* Registered host memory is pinned memory as host_alloc's is: a region the checker tracks (the pinned arenas map,
 * bind and register theirs: alloc/host.c). The checks a driver makes first: a page-aligned, non-empty range. */
static ppn_status sim_host_register(ppn_gpu *gg, void *p, size_t bytes)
{
    sim_gpu *g = sim_of(gg);
    if (!p || bytes == 0 || (uintptr_t)p % 4096 || bytes % 4096)
        return ppn_err(PPN_EINVAL, "sim: host_register(%p, %zu B): not a non-empty page-aligned range", p, bytes);
    sim_raw *raw = calloc(1, sizeof *raw);
    if (!raw) return ppn_err(PPN_ENOMEM, "sim: host_register of %zu B: out of host memory", bytes);
    *raw = (sim_raw){.base = (ppn_dptr)(uintptr_t)p, .bytes = bytes, .dev = -1, .host = 1, .live = 1};
    pthread_mutex_lock(&g->ck);
    raw->serial = ++g->next_serial;
    ppn_status st = sim_raw_insert(g, raw);
    pthread_mutex_unlock(&g->ck);
    if (st != PPN_OK) free(raw);
    return st;
}

/* Waits for copies executing on the region; its record stays as a tombstone, as host_free's does. */
static ppn_status sim_host_unregister(ppn_gpu *gg, void *p)
{
    sim_gpu *g = sim_of(gg);
    if (!p) return PPN_OK;
    pthread_mutex_lock(&g->ck);
    sim_raw *raw = sim_raw_find(g, (ppn_dptr)(uintptr_t)p);
    ppn_status st = PPN_OK;
    if (raw && raw->host && raw->live && raw->base == (ppn_dptr)(uintptr_t)p) {
        raw->live = 0;
        while (raw->busy) pthread_cond_wait(&g->busy_cv, &g->ck); /* pairs with sim_ck_exec_end */
        sim_raw_drop_contents(raw);
    } else {
        st = ppn_err(PPN_EINVAL, "sim: host_unregister(%p): not a registered range", p);
    }
    pthread_mutex_unlock(&g->ck);
    return st;
}

/* ---- streams ------------------------------------------------------------------------------------------ */

static void stream_free(ppn_gstream *s)
{
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    pthread_mutex_destroy(&s->lock);
    free(s->vc);
    free(s);
}

static ppn_status sim_stream_create(ppn_gpu *gg, int dev, ppn_gstream **out)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "stream_create", dev);
    if (!out) return ppn_err(PPN_EINVAL, "sim: stream_create: out is NULL");
    uint64_t nth;
    pthread_mutex_lock(&g->ck);
    int fail = fail_hit(g, SIM_FAIL_STREAM, &nth);
    pthread_mutex_unlock(&g->ck);
    if (fail) return injected(SIM_FAIL_STREAM, nth, PPN_EDRIVER);
    ppn_gstream *s = calloc(1, sizeof *s);
    if (!s) return ppn_err(PPN_ENOMEM, "sim: stream_create on dev %d: out of host memory", dev);
    s->g = g;
    s->dev = dev;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_mutex_lock(&g->ck);
    s->id = g->next_stream_id++;
    int oom = vc_grow(&s->vc, &s->vc_len, (size_t)s->id + 1);
    pthread_mutex_unlock(&g->ck);
    int rc = oom ? ENOMEM : pthread_create(&s->thr, NULL, worker, s);
    if (rc) {
        stream_free(s);
        return ppn_err(PPN_ENOMEM, "sim: stream_create on dev %d: %s", dev,
                       oom ? "out of host memory" : strerror(rc));
    }
    pthread_mutex_lock(&g->lists);
    s->next_all = g->streams;
    if (g->streams) g->streams->prev_all = s;
    g->streams = s;
    pthread_mutex_unlock(&g->lists);
    *out = s;
    return PPN_OK;
}

/* Drain the queue, then stop and join the worker. */
static void stream_stop(ppn_gstream *s)
{
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thr, NULL);
}

static ppn_status sim_stream_destroy(ppn_gpu *gg, ppn_gstream *s)
{
    sim_gpu *g = sim_of(gg);
    if (!s) return PPN_OK;
    pthread_mutex_lock(&g->lists);
    if (s->prev_all) s->prev_all->next_all = s->next_all;
    else g->streams = s->next_all;
    if (s->next_all) s->next_all->prev_all = s->prev_all;
    pthread_mutex_unlock(&g->lists);
    stream_stop(s);
    graph_free(s->cap); /* a capture never ended is abandoned */
    stream_free(s);
    return PPN_OK;
}

/* Wait for every op issued on s so far; returns the sticky error if there is one. */
static ppn_status sim_stream_sync(ppn_gpu *gg, ppn_gstream *s)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "stream_sync"));
    pthread_mutex_lock(&s->lock);
    uint64_t target = s->n_enq;
    while (s->n_done < target) pthread_cond_wait(&s->cv_done, &s->lock);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&g->ck);
    ppn_status st = host_merge(g, s->vc, s->vc_len);
    if (st == PPN_OK) st = sticky_status(g);
    pthread_mutex_unlock(&g->ck);
    return st;
}

static int sim_stream_device(ppn_gpu *gg, ppn_gstream *s)
{
    (void)gg;
    return s ? s->dev : -1;
}

/* ---- events ------------------------------------------------------------------------------------------- */

static ppn_status sim_event_create(ppn_gpu *gg, int dev, int timing, ppn_gevent **out)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "event_create", dev);
    if (!out) return ppn_err(PPN_EINVAL, "sim: event_create: out is NULL");
    uint64_t nth;
    pthread_mutex_lock(&g->ck);
    int fail = fail_hit(g, SIM_FAIL_EVENT, &nth);
    pthread_mutex_unlock(&g->ck);
    if (fail) return injected(SIM_FAIL_EVENT, nth, PPN_EDRIVER);
    ppn_gevent *e = calloc(1, sizeof *e);
    if (!e) return ppn_err(PPN_ENOMEM, "sim: event_create on dev %d: out of host memory", dev);
    e->dev = dev;
    e->timing = timing != 0;
    pthread_mutex_lock(&g->lists);
    e->next_all = g->events;
    if (g->events) g->events->prev_all = e;
    g->events = e;
    pthread_mutex_unlock(&g->lists);
    *out = e;
    return PPN_OK;
}

static ppn_status sim_event_destroy(ppn_gpu *gg, ppn_gevent *e)
{
    sim_gpu *g = sim_of(gg);
    if (!e) return PPN_OK;
    pthread_mutex_lock(&g->lists);
    if (e->prev_all) e->prev_all->next_all = e->next_all;
    else g->events = e->next_all;
    if (e->next_all) e->next_all->prev_all = e->prev_all;
    pthread_mutex_unlock(&g->lists);
    rec_unref(e->latest); /* records still queued keep their own reference */
    free(e);
    return PPN_OK;
}

/* Returns PPN_OK, PPN_EINVAL (NULL, device mismatch), PPN_ENOMEM, PPN_EDRIVER (injected), sticky error. */
static ppn_status sim_event_record(ppn_gpu *gg, ppn_gevent *e, ppn_gstream *s)
{
    sim_gpu *g = sim_of(gg);
    if (!e) return ppn_err(PPN_EINVAL, "sim: event_record: event is NULL");
    PPN_CHECK(check_stream(s, "event_record"));
    if (e->dev != s->dev)
        return ppn_err(PPN_EINVAL, "sim: event_record: event of dev %d recorded on stream %d of dev %d", e->dev,
                       s->id, s->dev);
    sim_op *op = op_new(s, SIM_OP_RECORD, "event record", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: event_record: out of host memory");
    return submit(g, s, op, SIM_FAIL_RECORD, e);
}

/* Binds to e's latest record issued before this call; a never-recorded event is a no-op wait. */
static ppn_status sim_stream_wait_event(ppn_gpu *gg, ppn_gstream *s, ppn_gevent *e)
{
    sim_gpu *g = sim_of(gg);
    if (!e) return ppn_err(PPN_EINVAL, "sim: stream_wait_event: event is NULL");
    PPN_CHECK(check_stream(s, "stream_wait_event"));
    pthread_mutex_lock(&g->sync);
    sim_rec *rec = rec_ref(e->latest);
    pthread_mutex_unlock(&g->sync);
    if (!rec) { /* nothing to wait for: still a call that can fail */
        uint64_t nth;
        pthread_mutex_lock(&g->ck);
        ppn_status st = sticky_status(g);
        if (st == PPN_OK && fail_hit(g, SIM_FAIL_WAIT, &nth)) st = injected(SIM_FAIL_WAIT, nth, PPN_EDRIVER);
        pthread_mutex_unlock(&g->ck);
        return st;
    }
    sim_op *op = op_new(s, SIM_OP_WAIT, "event wait", NULL);
    if (!op) {
        rec_unref(rec);
        return ppn_err(PPN_ENOMEM, "sim: stream_wait_event: out of host memory");
    }
    op->u.ev.rec = rec;
    return submit(g, s, op, SIM_FAIL_WAIT, NULL);
}

/* After the host saw rec executed (takes ck): order later host-issued work after it, return the sticky error. */
static ppn_status host_saw(sim_gpu *g, sim_rec *rec)
{
    pthread_mutex_lock(&g->ck);
    ppn_status st = rec ? host_merge(g, rec->vc, rec->len) : PPN_OK;
    if (st == PPN_OK) st = sticky_status(g);
    pthread_mutex_unlock(&g->ck);
    return st;
}

static ppn_status sim_event_query(ppn_gpu *gg, ppn_gevent *e, int *done)
{
    sim_gpu *g = sim_of(gg);
    if (!e || !done) return ppn_err(PPN_EINVAL, "sim: event_query: event or done is NULL");
    pthread_mutex_lock(&g->sync);
    sim_rec *rec = e->latest;
    *done = !rec || rec->done;
    rec = *done ? rec_ref(rec) : NULL;
    pthread_mutex_unlock(&g->sync);
    ppn_status st = host_saw(g, rec);
    rec_unref(rec);
    return st;
}

static ppn_status sim_event_sync(ppn_gpu *gg, ppn_gevent *e)
{
    sim_gpu *g = sim_of(gg);
    if (!e) return ppn_err(PPN_EINVAL, "sim: event_sync: event is NULL");
    pthread_mutex_lock(&g->sync);
    sim_rec *rec = rec_ref(e->latest);
    while (rec && !rec->done) pthread_cond_wait(&g->sync_cv, &g->sync); /* pairs with exec_op's broadcast */
    pthread_mutex_unlock(&g->sync);
    ppn_status st = host_saw(g, rec);
    rec_unref(rec);
    return st;
}

/* Returns PPN_OK, PPN_EINVAL (no timing, never recorded), PPN_ESTATE (a record has not executed yet). */
static ppn_status sim_event_elapsed(ppn_gpu *gg, ppn_gevent *start, ppn_gevent *end, float *ms)
{
    sim_gpu *g = sim_of(gg);
    ppn_status st = PPN_OK;
    if (!start || !end || !ms) return ppn_err(PPN_EINVAL, "sim: event_elapsed: NULL argument");
    if (!start->timing || !end->timing)
        return ppn_err(PPN_EINVAL, "sim: event_elapsed: the %s event was created without timing",
                       !start->timing ? "start" : "end");
    pthread_mutex_lock(&g->sync);
    sim_rec *a = start->latest, *b = end->latest;
    if (!a || !b)
        st = ppn_err(PPN_EINVAL, "sim: event_elapsed: the %s event was never recorded", !a ? "start" : "end");
    else if (!a->done || !b->done)
        st = ppn_err(PPN_ESTATE, "sim: event_elapsed: the %s event's record has not executed yet",
                     !a->done ? "start" : "end");
    else *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    pthread_mutex_unlock(&g->sync);
    return st;
}

/* ---- copies, launches, host functions ---------------------------------------------------------------- */

/* The latency model's rates (bytes per ns): a copy on one device, between devices with a peer grant, and one
 * with host memory on a side (htod, dtoh, a peer copy staged through the host). */
#define SIM_RATE_DEVICE 1000.0
#define SIM_RATE_PEER 50.0
#define SIM_RATE_HOST 20.0

/* The model's cost of moving n bytes at bytes_per_ns: 5 us + n at the rate (what PPN_SIM_LATENCY=1 charges). */
static uint64_t copy_cost(size_t n, double bytes_per_ns) { return 5000 + (uint64_t)((double)n / bytes_per_ns); }

static uint64_t copy_model(sim_gpu *g, size_t n, double bytes_per_ns)
{
    return (uint64_t)g->latency * copy_cost(n, bytes_per_ns);
}

/* A copy's modelled duration, and its kind and unscaled cost for the account submit keeps (ppn_sim_counts:
 * copies, copy_model_ns), whether or not PPN_SIM_LATENCY applies the model. */
static void copy_set_model(sim_gpu *g, sim_op *op, int kind, size_t n, double bytes_per_ns)
{
    op->model_ns = copy_model(g, n, bytes_per_ns);
    op->copy_kind = kind;
    op->copy_cost = copy_cost(n, bytes_per_ns);
}

/* Any op but a launch: the stream must exist and must not be capturing (only launches can be captured). */
static ppn_status check_stream(ppn_gstream *s, const char *call)
{
    if (!s) return ppn_err(PPN_EINVAL, "sim: %s: stream is NULL", call);
    if (s->cap)
        return ppn_err(PPN_ESTATE, "sim: %s on stream %d while it is capturing a graph (only launches can be "
                       "captured)", call, s->id);
    return PPN_OK;
}

static ppn_status sim_copy_htod(ppn_gpu *gg, ppn_gstream *s, ppn_dptr dst, const void *src, size_t n)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "copy_htod"));
    if (n && !src) return ppn_err(PPN_EINVAL, "sim: copy_htod of %zu B: source is NULL", n);
    sim_op *op = op_new(s, SIM_OP_HTOD, "copy htod", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: copy_htod: out of host memory");
    op->u.cp.dst = dst;
    op->u.cp.hsrc = src;
    op->u.cp.n = n;
    copy_set_model(g, op, PPN_SIM_COPY_HTOD, n, SIM_RATE_HOST);
    if (n) {
        op_acc(op, dst, n, PPN_ACC_W, s->dev, 1);
        op_acc_host(op, src, n, PPN_ACC_R);
    }
    return submit(g, s, op, SIM_FAIL_COPY, NULL);
}

static ppn_status sim_copy_dtoh(ppn_gpu *gg, ppn_gstream *s, void *dst, ppn_dptr src, size_t n)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "copy_dtoh"));
    if (n && !dst) return ppn_err(PPN_EINVAL, "sim: copy_dtoh of %zu B: destination is NULL", n);
    sim_op *op = op_new(s, SIM_OP_DTOH, "copy dtoh", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: copy_dtoh: out of host memory");
    op->u.cp.hdst = dst;
    op->u.cp.src = src;
    op->u.cp.n = n;
    copy_set_model(g, op, PPN_SIM_COPY_DTOH, n, SIM_RATE_HOST);
    if (n) {
        op_acc(op, src, n, PPN_ACC_R, s->dev, 1);
        op_acc_host(op, dst, n, PPN_ACC_W);
    }
    return submit(g, s, op, SIM_FAIL_COPY, NULL);
}

static ppn_status sim_copy_dtod(ppn_gpu *gg, ppn_gstream *s, ppn_dptr dst, ppn_dptr src, size_t n)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "copy_dtod"));
    sim_op *op = op_new(s, SIM_OP_DTOD, "copy dtod", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: copy_dtod: out of host memory");
    op->u.cp.dst = dst;
    op->u.cp.src = src;
    op->u.cp.n = n;
    copy_set_model(g, op, PPN_SIM_COPY_DTOD, n, SIM_RATE_DEVICE);
    if (n) {
        op_acc(op, src, n, PPN_ACC_R, s->dev, 1);
        op_acc(op, dst, n, PPN_ACC_W, s->dev, 1);
    }
    return submit(g, s, op, SIM_FAIL_COPY, NULL);
}

/* Works with or without a grant; without a possible one it is staged through the host (counted). */
static ppn_status sim_copy_peer(ppn_gpu *gg, ppn_gstream *s, ppn_dptr dst, int dst_dev, ppn_dptr src,
                                int src_dev, size_t n)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "copy_peer"));
    if (!valid_dev(g, dst_dev)) return bad_dev(g, "copy_peer (dst)", dst_dev);
    if (!valid_dev(g, src_dev)) return bad_dev(g, "copy_peer (src)", src_dev);
    int staged = src_dev != dst_dev && !((g->peer_possible[dst_dev] >> src_dev) & 1);
    sim_op *op = op_new(s, SIM_OP_PEER, "copy peer", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: copy_peer: out of host memory");
    op->u.cp.dst = dst;
    op->u.cp.src = src;
    op->u.cp.n = n;
    if (src_dev == dst_dev) copy_set_model(g, op, PPN_SIM_COPY_DTOD, n, SIM_RATE_DEVICE);
    else if (staged) copy_set_model(g, op, PPN_SIM_COPY_STAGED, n, SIM_RATE_HOST);
    else copy_set_model(g, op, PPN_SIM_COPY_PEER, n, SIM_RATE_PEER);
    if (n) {
        op_acc(op, src, n, PPN_ACC_R, src_dev, 0);
        op_acc(op, dst, n, PPN_ACC_W, dst_dev, 0);
    }
    PPN_CHECK(submit(g, s, op, SIM_FAIL_COPY, NULL));
    if (staged) __atomic_fetch_add(&gg->n_host_staged, 1, __ATOMIC_RELAXED);
    return PPN_OK;
}

static ppn_status sim_memset_d8(ppn_gpu *gg, ppn_gstream *s, ppn_dptr dst, unsigned char v, size_t n)
{
    sim_gpu *g = sim_of(gg);
    PPN_CHECK(check_stream(s, "memset_d8"));
    sim_op *op = op_new(s, SIM_OP_MEMSET, "memset", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: memset_d8: out of host memory");
    op->u.ms.dst = dst;
    op->u.ms.v = v;
    op->u.ms.n = n;
    op->model_ns = copy_model(g, n, SIM_RATE_DEVICE);
    if (n) op_acc(op, dst, n, PPN_ACC_W, s->dev, 1);
    return submit(g, s, op, SIM_FAIL_MEMSET, NULL);
}

static ppn_status check_launch(const ppn_gpu *g, const ppn_launch *l)
{
    PPN_CHECK(ppn_gpu_check_launch(g, l));
    const ppn_gpu_kernel *k = &g->kern.k[l->kernel];
    if (!k->cpu) return ppn_err(PPN_EUNSUPPORTED, "sim: launch of %s: it has no CPU reference", k->name);
    for (int i = 0; i < l->nacc + l->nxacc; i++) {
        const ppn_access *a = i < l->nacc ? &l->acc[i] : &l->xacc[i - l->nacc];
        if (a->mode < PPN_ACC_R || a->mode > PPN_ACC_RW)
            return ppn_err(PPN_EINVAL, "sim: launch of %s: access %d has mode %d", k->name, i, a->mode);
    }
    return PPN_OK;
}

/* A captured graph: the launches, params copied at capture. Replay checks and runs them as ordinary ops, so
 * the checker sees every kernel of every replay (a graph is no blind spot). */
typedef struct sim_glaunch {
    ppn_launch l;    /* l.params points at params, l.xacc at xacc */
    void *params;
    ppn_access *xacc;
} sim_glaunch;

struct sim_graph {
    int dev;
    int n, cap;
    sim_glaunch *k;
};
struct ppn_ggraph { /* the executable is the recording itself */
    struct sim_graph gr;
};

static void graph_free(struct sim_graph *gr)
{
    if (!gr) return;
    for (int i = 0; i < gr->n; i++) free(gr->k[i].params), free(gr->k[i].xacc);
    free(gr->k);
    free(gr);
}

static ppn_status graph_record(const ppn_gpu *g, struct sim_graph *gr, const ppn_launch *l)
{
    const char *name = g->kern.k[l->kernel].name;
    if (gr->n == gr->cap) {
        int cap = gr->cap ? 2 * gr->cap : 64;
        sim_glaunch *k = realloc(gr->k, (size_t)cap * sizeof *k);
        if (!k) return ppn_err(PPN_ENOMEM, "sim: capturing %s: out of host memory", name);
        gr->k = k;
        gr->cap = cap;
    }
    void *params = malloc(l->params_size ? l->params_size : 1);
    if (!params) return ppn_err(PPN_ENOMEM, "sim: capturing %s: out of host memory", name);
    memcpy(params, l->params, l->params_size);
    ppn_access *xacc = NULL;
    if (l->nxacc) {
        xacc = malloc((size_t)l->nxacc * sizeof *xacc);
        if (!xacc) {
            free(params);
            return ppn_err(PPN_ENOMEM, "sim: capturing %s: out of host memory", name);
        }
        memcpy(xacc, l->xacc, (size_t)l->nxacc * sizeof *xacc);
    }
    gr->k[gr->n] = (sim_glaunch){*l, params, xacc};
    gr->k[gr->n].l.params = params;
    gr->k[gr->n].l.xacc = xacc;
    gr->n++;
    return PPN_OK;
}

/* The latency model's cost of one kernel (ns): launched through a stream, replayed from a graph. */
#define SIM_LAUNCH_NS 4000ull
#define SIM_GRAPH_KERNEL_NS 1000ull

static ppn_status launch_submit(sim_gpu *g, ppn_gstream *s, const ppn_launch *l, int kind);

/* Copies the params struct now; the worker runs the CPU reference on the copy. */
static ppn_status sim_launch(ppn_gpu *gg, ppn_gstream *s, const ppn_launch *l)
{
    sim_gpu *g = sim_of(gg);
    if (!s) return ppn_err(PPN_EINVAL, "sim: launch: stream is NULL");
    if (!l) return ppn_err(PPN_EINVAL, "sim: launch: NULL launch");
    PPN_CHECK(check_launch(&g->base, l));
    if (s->cap) return graph_record(&g->base, s->cap, l);
    return launch_submit(g, s, l, PPN_SIM_LAUNCH_STREAM);
}

static int sim_tma_ok(ppn_gpu *gg, ppn_gstream *s) { return s ? sim_of(gg)->tma : 0; }

static int sim_sm_count(ppn_gpu *gg, ppn_gstream *s) { return (void)gg, s ? 1 : 0; } /* device_info's */

/* The sim's tensor map: the desc itself (ppn_tmap_sim_encode), checked as the driver checks it, so a map the
 * driver would refuse is refused here first; the CPU references of the TMA kernels read their operands through
 * it, so a map that does not describe them gives wrong sums on the sim. */
static ppn_status sim_tmap_encode(ppn_gpu *gg, ppn_gstream *s, const ppn_tmap_desc *d, void *map)
{
    PPN_CHECK(ppn_tmap_check("sim", d));
    if (!map || ((uintptr_t)map & 63u))
        return ppn_err(PPN_EINVAL, "sim: tmap_encode: map %p is not 64-byte aligned", map);
    if (!sim_tma_ok(gg, s)) return ppn_err(PPN_EUNSUPPORTED, "sim: tmap_encode: PPN_TMA=0");
    ppn_tmap_sim_encode(d, map);
    return PPN_OK;
}

/* Enqueue one checked launch of kind (PPN_SIM_LAUNCH_*): its modelled duration, and its unscaled cost for the
 * account submit keeps (ppn_sim_counts: launches, launch_model_ns), whether or not PPN_SIM_LATENCY applies it. */
static ppn_status launch_submit(sim_gpu *g, ppn_gstream *s, const ppn_launch *l, int kind)
{
    const ppn_gpu_kernel *k = &g->base.kern.k[l->kernel];
    sim_op *op = op_new(s, SIM_OP_LAUNCH, "kernel", k->name);
    void *params = malloc(l->params_size ? l->params_size : 1);
    if (!op || !params || !op_acc_reserve(op, l->nacc + l->nxacc)) {
        op_free(op);
        free(params);
        return ppn_err(PPN_ENOMEM, "sim: launch of %s: out of host memory", k->name);
    }
    memcpy(params, l->params, l->params_size);
    op->u.k.kernel = l->kernel;
    op->u.k.cpu = k->cpu;
    op->u.k.params = params;
    op->launch_kind = kind;
    op->launch_cost = kind == PPN_SIM_LAUNCH_GRAPH ? SIM_GRAPH_KERNEL_NS : SIM_LAUNCH_NS;
    op->model_ns = op->launch_cost * (uint64_t)g->latency;
    for (int i = 0; i < l->nacc + l->nxacc; i++) {
        const ppn_access *a = i < l->nacc ? &l->acc[i] : &l->xacc[i - l->nacc];
        if (a->bytes) op_acc(op, a->ptr, a->bytes, a->mode, s->dev, 1);
    }
    return submit(g, s, op, SIM_FAIL_LAUNCH, NULL);
}

static ppn_status sim_host_fn(ppn_gpu *gg, ppn_gstream *s, ppn_host_fn fn, void *arg)
{
    PPN_CHECK(check_stream(s, "host_fn"));
    if (!fn) return ppn_err(PPN_EINVAL, "sim: host_fn: function is NULL");
    sim_op *op = op_new(s, SIM_OP_HOSTFN, "host fn", NULL);
    if (!op) return ppn_err(PPN_ENOMEM, "sim: host_fn: out of host memory");
    op->u.hf.fn = fn;
    op->u.hf.arg = arg;
    return submit(sim_of(gg), s, op, SIM_FAIL_HOSTFN, NULL);
}

/* ---- graphs ---------------------------------------------------------------------------------------------- */

static ppn_status sim_capture_begin(ppn_gpu *gg, ppn_gstream *s)
{
    if (!s) return ppn_err(PPN_EINVAL, "sim: capture_begin: stream is NULL");
    if (kp_of(sim_of(gg))->on)
        return ppn_err(PPN_EUNSUPPORTED, "sim: graph capture with PPN_KPROF=1: the profile accounts each launch "
                       "on its own (profile with PPN_GRAPHS=0)");
    if (s->cap) return ppn_err(PPN_EUNSUPPORTED, "sim: stream %d is already capturing", s->id);
    struct sim_graph *gr = calloc(1, sizeof *gr);
    if (!gr) return ppn_err(PPN_ENOMEM, "sim: capture_begin: out of host memory");
    gr->dev = s->dev;
    s->cap = gr;
    return PPN_OK;
}

static ppn_status sim_capture_end(ppn_gpu *gg, ppn_gstream *s, ppn_ggraph **out)
{
    (void)gg;
    if (!s) return ppn_err(PPN_EINVAL, "sim: capture_end: stream is NULL");
    struct sim_graph *gr = s->cap;
    if (!gr) return ppn_err(PPN_ESTATE, "sim: capture_end on stream %d, which is not capturing", s->id);
    s->cap = NULL;
    if (!out) {
        graph_free(gr);
        return PPN_OK;
    }
    /* struct ppn_ggraph is the recording: same layout, one allocation */
    *out = (ppn_ggraph *)gr;
    return PPN_OK;
}

/* Fault injection counts each replayed kernel as a launch, as the eager path does, so PPN_SIM_FAIL=launch:K
 * names the same kernel with graphs on or off. */
static ppn_status sim_graph_launch(ppn_gpu *gg, ppn_ggraph *x, ppn_gstream *s)
{
    sim_gpu *g = sim_of(gg);
    struct sim_graph *gr = (struct sim_graph *)x;
    if (!gr) return ppn_err(PPN_EINVAL, "sim: graph_launch: graph is NULL");
    PPN_CHECK(check_stream(s, "graph_launch"));
    if (gr->dev != s->dev)
        return ppn_err(PPN_EINVAL, "sim: graph_launch: graph of dev %d on stream %d of dev %d", gr->dev, s->id,
                       s->dev);
    for (int i = 0; i < gr->n; i++) PPN_CHECK(launch_submit(g, s, &gr->k[i].l, PPN_SIM_LAUNCH_GRAPH));
    __atomic_fetch_add(&gg->n_graph_launches, 1, __ATOMIC_RELAXED);
    return PPN_OK;
}

static ppn_status sim_graph_destroy(ppn_gpu *gg, ppn_ggraph *x)
{
    (void)gg;
    graph_free((struct sim_graph *)x);
    return PPN_OK;
}

/* ---- peers and annotations ---------------------------------------------------------------------------- */

static ppn_status sim_peer_can_access(ppn_gpu *gg, int dev, int peer, int *can)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "peer_can_access", dev);
    if (!valid_dev(g, peer)) return bad_dev(g, "peer_can_access (peer)", peer);
    if (!can) return ppn_err(PPN_EINVAL, "sim: peer_can_access: can is NULL");
    *can = (int)((g->peer_possible[dev] >> peer) & 1);
    return PPN_OK;
}

/* Lets kernels on dev touch peer's memory. Returns PPN_OK, PPN_EINVAL (bad devices, grant not possible). */
static ppn_status sim_peer_enable(ppn_gpu *gg, int dev, int peer)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "peer_enable", dev);
    if (!valid_dev(g, peer)) return bad_dev(g, "peer_enable (peer)", peer);
    if (!((g->peer_possible[dev] >> peer) & 1))
        return ppn_err(PPN_EINVAL, "sim: peer_enable(%d, %d): no peer grant is possible between devices %d and "
                       "%d (PPN_SIM_PEER=%s)", dev, peer, dev, peer, g->peer_env);
    pthread_mutex_lock(&g->ck);
    g->peer_enabled[dev] |= 1ull << peer;
    pthread_mutex_unlock(&g->ck);
    return PPN_OK;
}

/* CARVE and ALLOC take effect now; FREE is an op on s (a write of the block by s).
 * Returns PPN_OK, PPN_EINVAL (bad range, device, op or overlap), PPN_ENOMEM, the sticky error (FREE). */
static ppn_status sim_mem_annotate(ppn_gpu *gg, ppn_gstream *s, int dev, ppn_dptr p, size_t n, int op,
                                   const char *tag)
{
    sim_gpu *g = sim_of(gg);
    ppn_status st;
    if (!valid_dev(g, dev)) return bad_dev(g, "mem_annotate", dev);
    if (p == 0 || n == 0) return ppn_err(PPN_EINVAL, "sim: mem_annotate: empty range [0x%llx, +%zu B)", (ull)p, n);
    if (op == PPN_ANN_CARVE || op == PPN_ANN_ALLOC) {
        pthread_mutex_lock(&g->ck);
        st = op == PPN_ANN_CARVE ? sim_ck_carve(g, dev, p, n) : sim_ck_alloc(g, dev, p, n, tag);
        pthread_mutex_unlock(&g->ck);
        return st;
    }
    if (op != PPN_ANN_FREE) return ppn_err(PPN_EINVAL, "sim: mem_annotate: unknown op %d", op);
    if (!s) return ppn_err(PPN_EINVAL, "sim: mem_annotate FREE of [0x%llx, +%zu B): needs a stream", (ull)p, n);
    sim_op *fop = op_new(s, SIM_OP_FREE, "free", NULL);
    if (!fop) return ppn_err(PPN_ENOMEM, "sim: mem_annotate FREE: out of host memory");
    fop->ann_dev = dev;
    op_acc(fop, p, n, PPN_ACC_W, -1, 0);
    return submit(g, s, fop, -1, NULL);
}

/* Returns PPN_OK, PPN_EINVAL (not a live block of dev), PPN_ENOMEM (mapping the window). */
static ppn_status sim_mem_issue(ppn_gpu *gg, int dev, ppn_dptr p, size_t n, ppn_dptr *out)
{
    sim_gpu *g = sim_of(gg);
    if (!valid_dev(g, dev)) return bad_dev(g, "mem_issue", dev);
    if (!out) return ppn_err(PPN_EINVAL, "sim: mem_issue: out is NULL");
    pthread_mutex_lock(&g->ck);
    ppn_status st = sim_ck_issue(g, dev, p, n, out);
    pthread_mutex_unlock(&g->ck);
    return st;
}

/* The calling thread reads or writes pinned host memory now: checked at once against the copies that touch it. */
static void sim_host_access(ppn_gpu *gg, const void *p, size_t n, int mode, const char *what)
{
    sim_gpu *g = sim_of(gg);
    pthread_mutex_lock(&g->ck);
    const char *how = (mode & PPN_ACC_W) ? "host write" : "host read";
    if (exec_cur.g == g) { /* inside a host function: an access of its op, on its stream's clock */
        ppn_gstream *s = exec_cur.s;
        sim_who who = {s->id, s->vc, s->vc_len};
        sim_opref ref = exec_cur.op->ref;
        ref.what = mode & PPN_ACC_W ? "host fn write" : "host fn read";
        ref.name = what;
        sim_ck_host_access(g, &who, &ref, p, n, mode);
        pthread_mutex_unlock(&g->ck);
        return;
    }
    sim_thr *t = sim_thr_self(g);
    if (t) { /* a new event of the thread: ops it issues from now on carry it */
        t->vc[t->id]++;
        t->ver++;
        rec_unref(t->snap);
        t->snap = NULL;
        sim_who who = {t->id, t->vc, t->len};
        sim_opref ref = {t->id, -1, t->vc[t->id], how, what};
        sim_ck_host_access(g, &who, &ref, p, n, mode);
    } else
        sim_ck_emit(g, PPN_ENOMEM, "ppn sim: out of host memory for a host thread's clock");
    pthread_mutex_unlock(&g->ck);
}

/* Under ck: the hand-off record of key, made on first use; NULL when out of host memory. */
static sim_handoff *handoff_of(sim_gpu *g, const void *key)
{
    for (int i = 0; i < g->nhandoffs; i++)
        if (g->handoffs[i].key == key) return &g->handoffs[i];
    if (g->nhandoffs == g->caphandoffs) {
        int nc = g->caphandoffs ? 2 * g->caphandoffs : 16;
        sim_handoff *na = realloc(g->handoffs, (size_t)nc * sizeof *na);
        if (!na) return NULL;
        g->handoffs = na;
        g->caphandoffs = nc;
    }
    g->handoffs[g->nhandoffs] = (sim_handoff){key, NULL, 0};
    return &g->handoffs[g->nhandoffs++];
}

/* Publish what the calling thread has observed under key (joined with earlier releases under it). A key is
 * usually a field of the object handed over; records are kept until the backend is closed. */
static void sim_host_release(ppn_gpu *gg, const void *key)
{
    sim_gpu *g = sim_of(gg);
    pthread_mutex_lock(&g->ck);
    sim_thr *t = sim_thr_self(g);
    sim_handoff *h = t ? handoff_of(g, key) : NULL;
    if (!h || vc_grow(&h->vc, &h->len, t->len))
        sim_ck_emit(g, PPN_ENOMEM, "ppn sim: out of host memory for a host hand-off");
    else
        vc_merge(h->vc, h->len, t->vc, t->len);
    pthread_mutex_unlock(&g->ck);
}

/* The calling thread adopts what was released under key (nothing when nothing was). */
static void sim_host_acquire(ppn_gpu *gg, const void *key)
{
    sim_gpu *g = sim_of(gg);
    pthread_mutex_lock(&g->ck);
    sim_handoff *h = NULL;
    for (int i = 0; i < g->nhandoffs && !h; i++)
        if (g->handoffs[i].key == key) h = &g->handoffs[i];
    if (h && host_merge(g, h->vc, h->len) != PPN_OK)
        sim_ck_emit(g, PPN_ENOMEM, "ppn sim: out of host memory for a host hand-off");
    pthread_mutex_unlock(&g->ck);
}

ppn_dptr ppn_gpu_sim_canonical(ppn_gpu *gg, ppn_dptr p)
{
    if (!gg || gg->ops != &sim_ops) return p;
    sim_gpu *g = sim_of(gg);
    sim_raw *raw;
    unsigned w;
    pthread_mutex_lock(&g->ck);
    ppn_dptr c = sim_canonical(g, p, &raw, &w);
    pthread_mutex_unlock(&g->ck);
    return c;
}

/* ---- lifetime ------------------------------------------------------------------------------------------ */

static void sim_destroy(ppn_gpu *gg)
{
    sim_gpu *g = sim_of(gg);
    if (!g) return;
    for (ppn_gstream *s = g->streams, *next; s; s = next) { /* workers finish what was issued */
        next = s->next_all;
        stream_stop(s);
        graph_free(s->cap);
        stream_free(s);
    }
    for (ppn_gevent *e = g->events, *next; e; e = next) {
        next = e->next_all;
        rec_unref(e->latest);
        free(e);
    }
    for (int i = 0; i < g->nraws; i++) {
        sim_raw *r = g->raws[i];
        if (r->live && !r->host) host_mem_put((void *)(uintptr_t)r->base, r->map_bytes); /* host: host_free's */
        sim_raw_destroy(r);
    }
    free(g->raws);
    for (int i = 0; i < g->nthrs; i++) {
        free(g->thrs[i]->vc);
        rec_unref(g->thrs[i]->snap);
        free(g->thrs[i]);
    }
    free(g->thrs);
    for (int i = 0; i < g->nhandoffs; i++) free(g->handoffs[i].vc);
    free(g->handoffs);
    pthread_mutex_destroy(&g->ck);
    pthread_cond_destroy(&g->busy_cv);
    pthread_mutex_destroy(&g->sync);
    pthread_cond_destroy(&g->sync_cv);
    pthread_mutex_destroy(&g->lists);
    pthread_mutex_destroy(&kp_of(g)->mu);
    free(g);
}

/* Returns PPN_OK, PPN_EINVAL (a PPN_SIM_* value, named), PPN_ENOMEM. */
ppn_status ppn_gpu_sim_create(const ppn_gpu_kernels *kern, ppn_gpu **out)
{
    if (!out) return ppn_err(PPN_EINVAL, "sim: create: out is NULL");
    *out = NULL;
    sim_gpu_kp *gk = calloc(1, sizeof *gk);
    if (!gk) return ppn_err(PPN_ENOMEM, "sim: create: out of host memory");
    sim_gpu *g = &gk->g;
    ppn_status st;
    PPN_CHECK_GOTO(parse_env(g, &gk->kp), st, fail);
    g->base.ops = &sim_ops;
    PPN_CHECK_GOTO(ppn_gpu_set_kernels(&g->base, kern), st, fail);
    g->base.kprof = gk->kp.on;
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_KX", &g->base.gemm_kx), st, fail);
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_W", &g->base.gemm_w), st, fail);
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_W_SWIGLU", &g->base.gemm_w_swiglu), st, fail);
    g->serial = atomic_fetch_add(&backend_serials, 1) + 1;
    pthread_mutex_init(&g->ck, NULL);
    pthread_cond_init(&g->busy_cv, NULL);
    pthread_mutex_init(&g->sync, NULL);
    pthread_cond_init(&g->sync_cv, NULL);
    pthread_mutex_init(&g->lists, NULL);
    pthread_mutex_init(&gk->kp.mu, NULL);
    *out = &g->base;
    return PPN_OK;
fail:
    free(gk);
    return st;
}

ppn_status ppn_gpu_sim_take_error(ppn_gpu *gg, char *msg, size_t cap)
{
    if (!gg || gg->ops != &sim_ops) return ppn_err(PPN_EINVAL, "sim: take_error: not a sim backend");
    sim_gpu *g = sim_of(gg);
    pthread_mutex_lock(&g->ck);
    ppn_status st = g->sticky;
    if (msg && cap) snprintf(msg, cap, "%s", st != PPN_OK ? g->sticky_msg : "");
    g->sticky = PPN_OK;
    g->sticky_msg[0] = '\0';
    pthread_mutex_unlock(&g->ck);
    return st;
}

void ppn_gpu_sim_counts(ppn_gpu *gg, struct ppn_sim_counts *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!gg || gg->ops != &sim_ops) return;
    sim_gpu *g = sim_of(gg);
    pthread_mutex_lock(&g->ck);
    out->race = g->counts[0];
    out->placement = g->counts[1];
    out->use_after_free = g->counts[2];
    out->double_free = g->counts[3];
    out->bounds = g->counts[4];
    out->stale = g->counts[SIM_REP_STALE];
    out->undeclared = g->counts[SIM_REP_UNDECLARED];
    memcpy(out->fault_calls, g->fail_count, sizeof out->fault_calls);
    memcpy(out->copies, g->copies, sizeof out->copies);
    memcpy(out->copy_model_ns, g->copy_model_ns, sizeof out->copy_model_ns);
    memcpy(out->launches, g->launches, sizeof out->launches);
    memcpy(out->launch_model_ns, g->launch_model_ns, sizeof out->launch_model_ns);
    pthread_mutex_unlock(&g->ck);
}

/* The CPU time of the reference kernels, per kernel (PPN_KPROF=1). */
static int sim_kprof_read(ppn_gpu *gg, struct ppn_kprof_entry *out, int max)
{
    sim_kprof *kp = kp_of(sim_of(gg));
    int n = 0;
    if (!kp->on || !out) return 0;
    pthread_mutex_lock(&kp->mu);
    for (int k = 0; k < gg->kern.n && n < max; k++)
        if (kp->calls[k])
            out[n++] = (struct ppn_kprof_entry){gg->kern.k[k].name, kp->calls[k], (double)kp->ns[k] / 1e6,
                                                kp->bytes[k]};
    pthread_mutex_unlock(&kp->mu);
    return n;
}

static void sim_kprof_reset(ppn_gpu *gg)
{
    sim_kprof *kp = kp_of(sim_of(gg));
    if (!kp->on) return;
    pthread_mutex_lock(&kp->mu);
    memset(kp->calls, 0, sizeof kp->calls);
    memset(kp->ns, 0, sizeof kp->ns);
    memset(kp->bytes, 0, sizeof kp->bytes);
    pthread_mutex_unlock(&kp->mu);
}

static const struct ppn_gpu_ops sim_ops = {
    .name = "sim",
    .destroy = sim_destroy,
    .device_count = sim_device_count,
    .device_info = sim_device_info,
    .mem_get_info = sim_mem_get_info,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .host_register = sim_host_register,
    .host_unregister = sim_host_unregister,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_sync = sim_stream_sync,
    .stream_device = sim_stream_device,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait_event,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_elapsed = sim_event_elapsed,
    .copy_htod = sim_copy_htod,
    .copy_dtoh = sim_copy_dtoh,
    .copy_dtod = sim_copy_dtod,
    .copy_peer = sim_copy_peer,
    .memset_d8 = sim_memset_d8,
    .peer_can_access = sim_peer_can_access,
    .peer_enable = sim_peer_enable,
    .launch = sim_launch,
    .tma_ok = sim_tma_ok,
    .tmap_encode = sim_tmap_encode,
    .sm_count = sim_sm_count,
    .host_fn = sim_host_fn,
    .mem_annotate = sim_mem_annotate,
    .mem_issue = sim_mem_issue,
    .host_access = sim_host_access,
    .host_release = sim_host_release,
    .host_acquire = sim_host_acquire,
    .kprof_read = sim_kprof_read,
    .kprof_reset = sim_kprof_reset,
    .capture_begin = sim_capture_begin,
    .capture_end = sim_capture_end,
    .graph_launch = sim_graph_launch,
    .graph_destroy = sim_graph_destroy,
};
