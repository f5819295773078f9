/* sim_internal.h - the sim backend's private structures, shared by gpu_sim.c (streams, events, ops) and
 * sim_check.c (memory map and happens-before checker). Nothing outside core/ includes this.
 *
 * Locks (taken in this order when nested; never the reverse):
 *   g->ck     the checker lock: memory map, block records, vector clocks, host clock, peer grants,
 *             sticky error, report counts, fault-injection counters.
 *   g->sync   event records: which record is an event's latest, whether a record has executed.
 *   s->lock   one stream's queue and its issued/done counters.
 *   g->lists  the lists of live streams and events (for destroy).
 * A worker holds at most one of them at a time, except ck -> nothing else.
 */
#ifndef PPN_SIM_INTERNAL_H
#define PPN_SIM_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include "core/device/gpu.h"

#define SIM_MAX_DEVICES 64
#define SIM_MAX_FAILS 16
#define SIM_MAX_PRINTED 32 /* reports printed to stderr per backend; the rest are only counted */
#define SIM_VIEWS 16       /* address windows per raw allocation: 0 its own, 1..15 aliases naming generations */
#define SIM_CANARY 0xA5    /* guard byte: a block's bytes past its requested size, an allocation's past its size */

/* Report kinds, as counted (struct ppn_sim_counts). */
enum {
    SIM_REP_RACE,
    SIM_REP_PLACEMENT,
    SIM_REP_UAF,
    SIM_REP_DFREE,
    SIM_REP_BOUNDS,
    SIM_REP_STALE,
    SIM_REP_UNDECLARED,
    SIM_REP_KINDS
};

/* A vector-clock snapshot. As an event record it is created when event_record is called, filled when the
 * record executes (vc under g->ck, then done under g->sync) and shared, refcounted, by the event and by
 * every wait bound to it. As a host-clock snapshot it is born done. Immutable once done. */
typedef struct sim_rec {
    int refs;      /* atomic */
    int done;      /* under g->sync */
    uint64_t t_ns; /* CLOCK_MONOTONIC at execution; under g->sync */
    size_t len;    /* entries in vc, fixed at creation */
    uint64_t vc[]; /* vc[i]: index of the last op of stream i that happens-before this point */
} sim_rec;

/* Who did an access: enough to name the op in a report. Copied by value; strings are static. A host thread's
 * access has dev -1 and its thread's clock id as stream. */
typedef struct sim_opref {
    int stream;
    int dev;
    uint64_t idx;     /* 1-based index of the op on its stream (== the stream's clock at that op) */
    const char *what; /* "kernel", "copy htod", "copy dtoh", "copy dtod", "copy peer", "memset", "free" */
    const char *name; /* kernel name, or NULL */
} sim_opref;

/* One stream's latest access of one kind to a block. */
typedef struct sim_epoch {
    int stream;
    uint64_t clock;
    sim_opref op;
} sim_epoch;

/* Access history of a block: writes not yet superseded and reads since them, at most one entry per stream.
 * Usually one write; several only after records of concurrent writers were merged by PPN_ANN_ALLOC. */
typedef struct sim_hist {
    sim_epoch *w;
    int nw, capw;
    sim_epoch *r;
    int nr, capr;
} sim_hist;

enum { SIM_BLK_UNALLOCATED = 0, SIM_BLK_LIVE = 1, SIM_BLK_FREED = 2 };

/* A block record inside a carved region. Records of one raw allocation are disjoint and, inside carved
 * regions, cover them entirely (CARVE starts with one UNALLOCATED record spanning the region). */
typedef struct sim_block {
    ppn_dptr base;
    size_t bytes;
    int state;          /* SIM_BLK_*; the pool's view, changed at annotate time (host order) */
    char tag[32];
    sim_opref freed_by; /* the PPN_ANN_FREE op that freed it, valid when state == SIM_BLK_FREED */
    size_t req;         /* bytes requested by mem_issue for the current generation; 0: the whole block */
    uint32_t gen;       /* mem_issue calls so far: the generation the current one is */
    unsigned window;    /* the address window handed out for the current generation (0: none, own address) */
    uint32_t armed_gen; /* the generation whose bytes past req hold SIM_CANARY (0: none) */
    sim_hist h;
} sim_block;

typedef struct sim_range {
    ppn_dptr base;
    size_t bytes;
} sim_range;

/* One host thread's clock on one backend. Host threads take ids from the streams' id space, so one vector clock
 * indexes both. vc[id] counts the thread's own host accesses; the rest is what its syncs and queries observed.
 * Ops it issues merge vc first; a sync orders only this thread's later ops (and, through them, whatever waits
 * on them): another thread's work is ordered after it only through streams and events. */
typedef struct sim_thr {
    const void *key; /* the owning thread's token (the address of a thread-local) */
    int id;
    uint64_t *vc;    /* under g->ck */
    size_t len;
    uint64_t ver;    /* bumped when vc changes */
    sim_rec *snap;   /* vc at ver, shared by the ops issued since, or NULL */
} sim_thr;

/* What host_release published under a key: the join of the releasing threads' clocks. */
typedef struct sim_handoff {
    const void *key;
    uint64_t *vc;
    size_t len;
} sim_handoff;

/* What an access is checked with: the accessor's clock id and vector clock. */
typedef struct sim_who {
    int id;
    const uint64_t *vc;
    size_t len;
} sim_who;

/* One raw mem_alloc region. After mem_free it stays as a dead tombstone (memory released) until a new
 * allocation overlaps its range, so late accesses are named use-after-free rather than out of bounds. */
typedef struct sim_raw {
    ppn_dptr base;
    size_t bytes;
    int dev;         /* -1: pinned host memory (host_alloc) */
    int host;        /* pinned host memory: no blocks; blocks[] holds one record per range accessed (below) */
    uint64_t serial; /* unique per allocation: tells a reused address from the original */
    int live;
    int waiters;     /* host accesses waiting for busy to drop to 0 */
    int free_pending; /* PPN_ANN_FREE ops of its blocks issued and not yet executed */
    int busy;        /* ops executing on its memory right now; mem_free waits for 0 */
    size_t map_bytes; /* the reserved address range: SIM_VIEWS windows of stride bytes (munmapped at free) */
    size_t stride;    /* a window's length: bytes rounded to pages; window w starts at base + w * stride */
    uint32_t mapped;  /* bit w: window w maps the memory (0 always; others when first handed out) */
    sim_range *carved;
    int ncarved, capcarved;
    sim_block **blocks; /* sorted by base, disjoint; host: per accessed range, unsorted, may overlap */
    int nblocks, capblocks;
    sim_hist h;         /* history of accesses outside carved regions (the raw region is the block) */
} sim_raw;

/* One declared access of an op. want_dev: the device the memory must be on (-1: any); peer_ok: a peer grant
 * from want_dev to the memory's device also makes it legal. serial: the raw allocation resolved at enqueue.
 * host: the host side of a copy (checked only when it is pinned memory from host_alloc). */
typedef struct sim_acc {
    ppn_dptr p;
    size_t n;
    int mode;
    int want_dev;
    int peer_ok;
    int host;
    uint64_t serial;
    sim_raw *busy_raw; /* set while the op executes and holds a busy reference */
} sim_acc;

enum {
    SIM_OP_HTOD,
    SIM_OP_DTOH,
    SIM_OP_DTOD,
    SIM_OP_PEER,
    SIM_OP_MEMSET,
    SIM_OP_LAUNCH,
    SIM_OP_HOSTFN,
    SIM_OP_RECORD,
    SIM_OP_WAIT,
    SIM_OP_FREE,
};

typedef struct sim_op {
    struct sim_op *next;
    int kind;
    sim_opref ref;
    sim_acc *acc;                      /* acc_in, or a heap array for a launch with further accesses */
    sim_acc acc_in[PPN_LAUNCH_MAX_ACC];
    int nacc, cap_acc;
    ppn_status verdict; /* a finding made at enqueue (bounds, use after free, placement, double free) */
    int vkind;          /* its SIM_REP_* kind */
    char *report;       /* its report, printed when the op executes */
    sim_rec *hsnap;     /* host clock to merge before the op, or NULL */
    uint64_t model_ns;  /* modelled duration (PPN_SIM_LATENCY=1), else 0 */
    int copy_kind;      /* a copy: its PPN_SIM_COPY_* kind ... */
    uint64_t copy_cost; /* ... and the model's unscaled cost (ns), whatever PPN_SIM_LATENCY says; 0: not a copy */
    int launch_kind;      /* a launch: its PPN_SIM_LAUNCH_* kind ... */
    uint64_t launch_cost; /* ... and its unscaled cost (ns), as for a copy; 0: not a launch */
    int ann_dev;        /* FREE: the device the annotation names */
    ppn_dptr free_base; /* FREE of a live block: the block (own address) and its allocation's serial, ... */
    uint64_t free_serial;
    size_t free_req;    /* ... and the bytes requested, when the bytes past them hold SIM_CANARY (else 0) */
    union {
        struct { ppn_dptr dst, src; void *hdst; const void *hsrc; size_t n; } cp;
        struct { ppn_dptr dst; unsigned char v; size_t n; } ms;
        struct { int kernel; void (*cpu)(const void *); void *params; } k;
        struct { ppn_host_fn fn; void *arg; } hf;
        struct { sim_rec *rec; } ev; /* RECORD: the record it fills; WAIT: the record it waits for */
    } u;
} sim_op;

struct ppn_gstream {
    struct sim_gpu *g;
    int id;  /* index in vector clocks; never reused within a backend */
    int dev;
    pthread_t thr;
    pthread_mutex_t lock;
    pthread_cond_t cv_work; /* worker waits for ops */
    pthread_cond_t cv_done; /* stream_sync waits for n_done */
    sim_op *head, *tail;    /* under lock */
    uint64_t n_enq, n_done; /* under lock (n_enq written only by the issuing thread) */
    int stop;               /* under lock */
    uint64_t *vc;           /* under g->ck: this stream's vector clock */
    size_t vc_len;          /* under g->ck */
    const sim_thr *seen_thr; /* under g->ck: the thread whose clock ... */
    uint64_t seen_ver;       /* ... at this version was attached to an op of this stream last */
    struct sim_graph *cap;  /* the recording between capture_begin and capture_end (issuing thread only) */
    struct ppn_gstream *next_all, *prev_all; /* under g->lists */
};

struct ppn_gevent {
    int dev;
    int timing;
    sim_rec *latest; /* under g->sync: the latest record issued, or NULL */
    struct ppn_gevent *next_all, *prev_all; /* under g->lists */
};

typedef struct sim_fail {
    int kind; /* SIM_FAIL_* */
    uint64_t k;
} sim_fail;

/* PPN_SIM_FAIL kinds (gpu_sim.c's fail_names spells them): every op kind of the backend can fail. */
enum {
    SIM_FAIL_ALLOC,  /* mem_alloc */
    SIM_FAIL_COPY,   /* copy_htod, copy_dtoh, copy_dtod, copy_peer */
    SIM_FAIL_LAUNCH, /* launch (each kernel of a graph replay too) */
    SIM_FAIL_RECORD, /* event_record */
    SIM_FAIL_WAIT,   /* stream_wait_event */
    SIM_FAIL_MEMSET, /* memset_d8 */
    SIM_FAIL_HOSTFN, /* host_fn */
    SIM_FAIL_FREE,   /* mem_free, host_free */
    SIM_FAIL_STREAM, /* stream_create */
    SIM_FAIL_EVENT,  /* event_create */
    SIM_FAIL_KINDS
};

typedef struct sim_gpu {
    struct ppn_gpu base; /* first: a ppn_gpu * is a sim_gpu * */
    /* configuration, immutable after create */
    int ndev;
    size_t cap;
    uint64_t peer_possible[SIM_MAX_DEVICES]; /* bit e of [d]: a grant d -> e is possible */
    char peer_env[128];
    int latency;
    int thread_clocks; /* PPN_SIM_THREAD_CLOCKS=1: a clock per host thread; 0: one shared by every thread */
    int tma;           /* PPN_TMA (default 1): what tma_ok says */
    sim_fail fails[SIM_MAX_FAILS];
    int nfails;

    pthread_mutex_t ck;
    pthread_cond_t busy_cv;                  /* signalled when a dead raw allocation's busy drops to 0 */
    uint64_t fail_count[SIM_FAIL_KINDS];     /* under ck */
    size_t used[SIM_MAX_DEVICES];            /* under ck */
    uint64_t peer_enabled[SIM_MAX_DEVICES];  /* under ck: bit e of [d]: peer_enable(d, e) was called */
    sim_raw **raws;                          /* under ck: sorted by base, disjoint (live and tombstones) */
    int nraws, capraws;
    uint64_t next_serial;                    /* under ck */
    int next_stream_id;                      /* under ck */
    uint64_t serial;                         /* unique per backend (thread-local caches of sim_thr) */
    sim_thr **thrs;                          /* under ck: the host threads seen, each with its clock */
    int nthrs, capthrs;
    struct sim_handoff *handoffs;            /* under ck: host_release snapshots by key */
    int nhandoffs, caphandoffs;
    ppn_status sticky;                       /* under ck: first report, until taken */
    char sticky_msg[1024];
    uint64_t counts[SIM_REP_KINDS];          /* under ck: reports per kind (SIM_REP_*) */
    uint64_t copies[PPN_SIM_COPY_KINDS];     /* under ck: copies accepted, per PPN_SIM_COPY_* kind ... */
    uint64_t copy_model_ns[PPN_SIM_COPY_KINDS]; /* under ck: ... and the sum of their copy_cost */
    uint64_t launches[PPN_SIM_LAUNCH_KINDS];  /* under ck: kernels accepted, per PPN_SIM_LAUNCH_* kind ... */
    uint64_t launch_model_ns[PPN_SIM_LAUNCH_KINDS]; /* under ck: ... and the sum of their launch_cost */
    int printed;                             /* under ck */

    pthread_mutex_t sync;
    pthread_cond_t sync_cv; /* broadcast when a record executes */

    pthread_mutex_t lists;
    struct ppn_gstream *streams; /* under lists */
    struct ppn_gevent *events;   /* under lists */
} sim_gpu;

/* sim_check.c: everything below is called with g->ck held. */
sim_raw *sim_raw_find(sim_gpu *g, ppn_dptr p);
ppn_status sim_raw_insert(sim_gpu *g, sim_raw *raw);
void sim_raw_drop_contents(sim_raw *raw);
void sim_raw_destroy(sim_raw *raw);
ppn_status sim_ck_carve(sim_gpu *g, int dev, ppn_dptr p, size_t n);
ppn_status sim_ck_alloc(sim_gpu *g, int dev, ppn_dptr p, size_t n, const char *tag);
ppn_status sim_ck_free(sim_gpu *g, int dev, sim_op *op);
void sim_ck_resolve(sim_gpu *g, sim_op *op);
int sim_ck_exec_begin(sim_gpu *g, struct ppn_gstream *s, sim_op *op);
void sim_ck_exec_end(sim_gpu *g, sim_op *op);
void sim_ck_raw_guard_fill(sim_raw *raw);
void sim_ck_raw_guard_check(sim_gpu *g, sim_raw *raw);
void sim_ck_emit(sim_gpu *g, ppn_status st, const char *msg);
void sim_ck_emit_kind(sim_gpu *g, ppn_status st, int kind, const char *msg);
ppn_status sim_ck_issue(sim_gpu *g, int dev, ppn_dptr p, size_t n, ppn_dptr *out);
ppn_dptr sim_canonical(sim_gpu *g, ppn_dptr p, sim_raw **raw, unsigned *window);
void sim_hist_clear(sim_hist *h);
sim_thr *sim_thr_self(sim_gpu *g);
void sim_ck_host_access(sim_gpu *g, const sim_who *who, const sim_opref *op, const void *p, size_t n, int mode);
void sim_fmt_op(char *buf, size_t cap, const sim_opref *r);

#endif
