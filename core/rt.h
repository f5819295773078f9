/* rt.h - internal runtime objects: the runtime (backend, per-device pools, pinned arena, topology), the
 * device-resident model with its RCU-published stage map, the stages' streams and issue threads, the
 * boundaries between them, and sequences (KV cache, per-stage scratch, the logits ring).
 *
 * Ownership (the seed's multi-stream law):
 *   - weights of layer l live on layer_dev[l], fixed at load (the owning stage's device, or the primary with
 *     MEMRA_PP_SHARD=0); the embed table with stage 0, final norm + lm head with the last stage;
 *   - layer l's KV pools (paged, shared by every sequence: kvpool.c) live on the owning stage's device;
 *   - per-stage scratch is allocated and used only on that stage's stream;
 *   - everything that crosses stages flows through the boundary slots, ordered by ev_tx / ev_rx;
 *   - the logits of a step are read back on a dedicated readback stream behind the step's done event.
 * Threading: the caller (one thread at a time per model) issues steps and publishes maps; stage threads issue
 * their stage's work. A map is published only when no step is in flight (ppn_model_drain).
 */
#ifndef PPN_RT_H
#define PPN_RT_H

#include <stdatomic.h>
#include "ppn.h"
#include "core/device/gpu.h"
#include "core/model/ckpt.h"
#include "alloc/pool.h"
#include "alloc/host.h"
#include "sched/issue.h"
#include "sched/topo.h"
#include "transport/boundary.h"
#include "kernels/ops.h"

#define PPN_MAX_DEVICES 64
#define PPN_MAX_NUMA 64      /* NUMA nodes with a pinned arena of their own; more share the unbound one */
#define PPN_CMD_RING 64      /* preallocated commands per stage */
#define PPN_KV_BLOCK_LOG2 4  /* paged KV: positions per block = 16 */
#define PPN_KV_BLOCK (1 << PPN_KV_BLOCK_LOG2)
#define PPN_KV_DEFAULT_MIN 1024 /* the pools' positions by default: 4 contexts, at least this many */

struct ppn_rt {
    ppn_gpu *g;
    int n_models;                        /* loaded and not yet freed: ppn_rt_destroy refuses while > 0 */
    _Atomic int engine_on;               /* an engine runs on one of its models (engine.c): one a runtime, since
                                          * a runtime's models are driven from one thread at a time */
    int n_dev;
    ppn_pool *pool[PPN_MAX_DEVICES];     /* created on first use of a device */
    ppn_pinned_arena *pinned;            /* bound to no node: buffers that every stage's device touches */
    pthread_mutex_t place_mu;            /* protects topo's first load and pinned_node[]'s creation */
    ppn_topo *topo;                      /* loaded on first use */
    ppn_pinned_arena *pinned_node[PPN_MAX_NUMA]; /* per NUMA node (logical index), created on first use */
    ppn_pinned_arena *pinned_interleave; /* pages spread over every node (a measurement arm), on first use */
};

/* runtime.c: the pool of device dev, created on first use. Returns PPN_OK, PPN_EINVAL, PPN_ENOMEM. */
ppn_status ppn_rt_pool(ppn_rt *rt, int dev, ppn_pool **out);
/* The topology, loaded on first use (with I/O objects on cuda, to find each GPU's PCI device). */
ppn_status ppn_rt_topo(ppn_rt *rt, ppn_topo **out);
/* Host memory placement (docs/PIPELINE.md): a pinned buffer comes from the arena of the NUMA node of the device
 * that touches it; the arena's memory is bound to that node before it is pinned. *out = the arena of node
 * (created on first use), the interleaved one for PPN_PINNED_INTERLEAVE, or the unbound one for another node < 0
 * (or beyond PPN_MAX_NUMA).
 * Returns PPN_OK, PPN_ENOMEM, PPN_EDRIVER, PPN_EIO (the topology). */
ppn_status ppn_rt_pinned_on(ppn_rt *rt, int node, ppn_pinned_arena **out);
/* The local NUMA node of device dev (-1: not located, every node). Returns PPN_OK, PPN_EINVAL, PPN_EIO. */
ppn_status ppn_rt_dev_node(ppn_rt *rt, int dev, int *node);
/* ppn_rt_pinned_on(the node of dev). */
ppn_status ppn_rt_pinned_for(ppn_rt *rt, int dev, ppn_pinned_arena **out);
/* A pinned buffer of n bytes from ppn_rt_pinned_for(dev); free it with ppn_pinned_free(rt->pinned, p). */
ppn_status ppn_rt_pinned_alloc(ppn_rt *rt, int dev, size_t n, void **out);

/* The stage map: immutable once published (rcu_assign_pointer); replaced whole, never edited. */
typedef struct ppn_stage_map {
    int n_stages;
    int fence[PPN_MAX_STAGES + 1];       /* stage s runs layers [fence[s], fence[s+1]) */
    int dev[PPN_MAX_STAGES];
    int xport[PPN_MAX_STAGES];           /* boundary b: stage b -> b+1 */
    int pu[PPN_MAX_STAGES];              /* the core each stage's issue thread is pinned to */
    int node[PPN_MAX_STAGES];            /* the NUMA node its memory is bound to (that core's; -1: none) */
    int shared_cores;                    /* 1: fewer cores than stages */
    ppn_door door;                       /* the flags it was built from */
    uint64_t gen;
} ppn_stage_map;

typedef struct ppn_dev_layer {
    ppn_dptr attn_norm, wo, q_norm, k_norm, ffn_norm, w_down;
    ppn_dptr wqkv;  /* [wq; wk; wv] rows back to back: q, k and v come from one matvec */
    ppn_dptr bqkv;  /* [bq; bk; bv] (Qwen2), or 0 */
    ppn_dptr wgu;   /* [w_gate; w_up]: gate and up come from one matvec */
} ppn_dev_layer;

/* Rows of one sequence inside a many-rows walk (a prefill chunk): rows r0 .. r0 + n - 1 of the chunk are
 * positions pos0 .. pos0 + n - 1 of seq. out: where the logits of those rows go on the host (NULL: none); with
 * all_rows every row's, else the last row's only (that row must be the sequence's last prompt row). */
typedef struct ppn_rowseg {
    struct ppn_seq *seq;
    int pos0, r0, n;
    int n_tbl;                 /* the sequence's KV blocks when the walk was planned (it holds pos0 + n) */
    float *out;
    int all_rows;
} ppn_rowseg;

/* What a many-rows walk is for. A mixed walk holds prompt rows [0, brow0) (prefill segments, as a prime chunk's)
 * and one decode row per sequence in [brow0, rows) (as a batch's): one forward reads each weight once for both. */
enum { PPN_ROWS_PRIME, PPN_ROWS_BATCH, PPN_ROWS_VERIFY, PPN_ROWS_MIXED };

typedef struct ppn_step_cmd {
    ppn_cmd cmd;
    struct ppn_seq *seq;
    const ppn_stage_map *map;            /* the map the step was issued under (checked by the thread) */
    uint32_t step;
    int pos, token, slot, ring;
    int tok_ring;                        /* >= 0: the token is the argmax of step tok_step, in tok[tok_ring] */
    uint32_t tok_step;
    int argmax;                          /* the last stage also writes argmax(logits) to tok[ring] */
    /* a many-rows walk (rows > 0; a decode step has rows 0): segs[0 .. nseg) cover rows [0, rows); the host
     * memory they and tok_h (the rows' token ids, uploaded by stage 0) point at outlives the walk */
    int rows, nseg;
    const ppn_rowseg *segs;
    const int32_t *tok_h;
    int kind;                            /* a many-rows walk's purpose: PPN_ROWS_* (counters and head) */
    int brow0;                           /* the first decode row: 0 in a batch, the prompt rows in a mixed walk */
    float *logits_h;                     /* batch / mixed: every decode row's logits, [rows - brow0, vocab] host
                                          * (NULL: none) */
    int32_t *ids_h;                      /* batch / mixed: every decode row's argmax, [rows - brow0] pinned (NULL:
                                          * none) */
    int n_tbl;                           /* a decode step: the sequence's KV blocks when it was issued */
    /* batch / mixed: every stage's decode-row descriptors [n_stages][rows - brow0] (pinned: stage s uploads its
     * own), and each decode row's host table and blocks (the ops' declarations) */
    const ppn_kseg *ksegs_h;
    const int32_t *const *tbl_hs;
    const int *n_tbls;
    /* a greedy batch (ppn_decode_batch_greedy): gtok_out (int32 [rows - brow0] on gtok_dev, the device whose rows
     * scratch computes the head) takes the walk's argmax after its head; with gtok_in the walk's tokens are not
     * uploaded but copied from there by stage 0, after step tok_step (on ring entry tok_ring of seq: the same
     * rows one step before) is done. 0: none. */
    ppn_dptr gtok_in, gtok_out;
    int gtok_dev;
    int used;                            /* caller: handed to the thread at least once */
} ppn_step_cmd;

/* A stage's scratch for many-rows walks, on its device, for up to rows rows; every sequence's chunks share it
 * (a stage walks one chunk at a time, in its stream's order). io = [hdr][x: rows x dim] (the boundary layout). */
typedef struct ppn_rows_scratch {
    int dev, rows;             /* rows: the capacity (0: nothing allocated) */
    ppn_dptr io, xb, qkv, att, gu, act;
    ppn_dptr tok;              /* int32 [rows]: the chunk's token ids (stage 0) */
    ppn_dptr lrow;             /* [vocab]: one row's logits (the last stage's head) */
    ppn_dptr lall;             /* [rows, vocab]: every row's logits, allocated on first use (all_rows, batches) */
    ppn_dptr ids;              /* int32 [rows]: every row's argmax (the last stage of a greedy batch) */
    ppn_dptr segs;             /* ppn_kseg [segs_stages][rows]: a batch's row descriptors (the unsplit walk's on
                                * stage 0 for every stage's layers, else this stage's in the first [rows]) */
    int segs_stages;
    ppn_dptr attp;             /* batched attention's split partials for batch_rows rows (counters zeroed) */
    int batch_rows;
} ppn_rows_scratch;

/* One captured batch walk of a stage (step.c): the embedding (stage 0), its layers, the head's GEMM and argmax
 * (last stage) for rows rows; valid for one map generation and one rows scratch. */
#define PPN_BATCH_GRAPHS 8
typedef struct ppn_batch_graph {
    ppn_ggraph *exec;          /* NULL: an empty entry */
    uint64_t gen;
    ppn_dptr io;
    int rows, ids, dev;
    struct ppn_seq **who;      /* the rows' sequences at capture: the sim keeps the launches' declared accesses,
                                * which name their tables, so the graph dies with any of them (ppn_seq_destroy) */
} ppn_batch_graph;

/* A stage stream's busy time (ppn_model_time_stages): a pair of timing events around each walk it runs (the
 * kernels between its boundary ops), their elapsed time summed as they complete. The ring and events are the
 * issuing thread's (the stage's, or the caller's on one stream); the sums are read by any thread. */
#define PPN_BUSY_RING 16
typedef struct ppn_busy {
    ppn_gevent *ev[PPN_BUSY_RING][2]; /* start, end: on dev (created when first timed) */
    int dev;                          /* -1: none */
    unsigned head, tail, open;        /* pairs recorded, pairs summed; open: a start recorded, its end not yet */
    _Atomic uint64_t ns, walks;       /* device time of the walks summed, and how many */
} ppn_busy;

/* One stage's execution home. */
typedef struct ppn_stage_rt {
    _Alignas(64) struct ppn_model *m;
    int index;
    int dev;                             /* device of stream (-1: none yet) */
    ppn_gstream *stream;
    ppn_issue_thread thr;
    int thr_started;
    ppn_step_cmd cmds[PPN_CMD_RING];
    _Atomic uint64_t walker_runs;        /* liveness: steps this stage's walker executed */
    ppn_rows_scratch rs;                 /* many-rows walks on this stage (prefill chunks, batches) */
    _Atomic uint64_t batch_walks;        /* liveness: batched decode steps (or micro-batches) this stage walked */
    ppn_batch_graph bg[PPN_BATCH_GRAPHS];/* captured batch walks (PPN_GRAPHS=1): this stage's issuing thread only */
    unsigned bg_next;
    ppn_busy busy;                       /* this stage stream's busy time */
} ppn_stage_rt;

struct ppn_model {
    ppn_rt *rt;
    ppn_model_config cfg;
    int wdt;                   /* weight storage dtype */
    int kvdt;                  /* KV cache element dtype: wdt, as transformers keeps the cache */
    int ctx;
    int primary;
    size_t weight_bytes;
    int *layer_dev;            /* [n_layers] where each layer's weights live */
    int embed_dev, head_dev;
    ppn_dptr embed, final_norm, lm_head;
    ppn_dev_layer *layers;
    ppn_dptr inv_freq[PPN_MAX_DEVICES];  /* rope table on every device a stage may run on (0: not yet) */
    struct ppn_weight_block { ppn_dptr ptr; int dev; } *weight_blocks;
    int n_weight_blocks, cap_weight_blocks;

    ppn_stage_map *map;        /* RCU-published: stage threads rcu_dereference it */
    uint64_t map_gen;
    ppn_stage_rt *stages;      /* [PPN_MAX_STAGES] */
    ppn_boundary bnd[PPN_MAX_STAGES];
    int n_bnd;
    ppn_gstream *rb_stream;    /* the dedicated readback stream, on the last stage's device */
    int rb_dev;
    ppn_gstream *dev_stream[PPN_MAX_DEVICES]; /* a stream per device in use: loads, frees, the unsplit walk */

    uint32_t next_step;        /* caller: the global step counter */
    struct ppn_seq *seqs;      /* live sequences (caller) */
    _Atomic int busy_on;       /* ppn_model_time_stages: time the walks (read by the issuing threads per walk) */
    _Atomic int active_walkers;
    _Atomic uint64_t overlap_observed;   /* liveness: a walker started while another stage's walker ran */
    _Atomic uint64_t graph_captures;     /* stage bodies captured (PPN_GRAPHS=1) */
    int max_rows;              /* rows a boundary slot holds (1 until a prefill asks for more) */
    int rows_cap;              /* rows each stage's rows scratch holds (0 until the first prefill) */
    int batch_cap;             /* rows a batch may have: batched attention's scratch (0 until the first batch) */
    _Atomic int prime_walkers;           /* prefill walkers issuing right now, on any stage */
    _Atomic uint64_t prime_split_chunks; /* liveness: prefill chunks that walked the per-stage split */
    _Atomic uint64_t prime_pipe_overlaps;/* liveness: a stage's prefill walker entered while another's ran */
    _Atomic uint64_t prime_batches;      /* prefill calls that primed several sequences in one forward */
    _Atomic uint64_t prime_batch_splits; /* chunks of those that walked the per-stage split */
    _Atomic int batch_walkers;           /* batched decode walkers issuing right now, on any stage */
    _Atomic uint64_t batch_steps;        /* batched decode steps (ppn_decode_batch*) done */
    _Atomic uint64_t batch_split_steps;  /* liveness: micro-batches that walked the per-stage split */
    _Atomic uint64_t batch_pipe_overlaps;/* liveness: a stage's batch walker entered while another's ran */
    _Atomic uint64_t mixed_steps;        /* batched steps with prompt slices */
    _Atomic uint64_t batch_greedy_steps; /* steps of ppn_decode_batch_greedy done (each fed on the device) */
    struct ppn_bstep *bsteps;  /* deferred batch steps in flight (caller; batch_defer.c) */
    uint64_t bstep_serial;     /* caller: the last deferred batch step's number (its id's low bits) */
    _Atomic uint64_t spec_verifies, spec_drafted, spec_accepted; /* ppn_spec_verify calls, drafts, accepted */
    _Atomic uint64_t spec_split_verifies;/* liveness: verify walks that walked the per-stage split */
    _Atomic int engine_on;     /* PPN_ENGINE_*: who may drive the model while an engine is on it (engine.c) */
    _Atomic int err;           /* first failure inside a stage thread (sticky for the model) */
    char err_msg[1024];
    int attn_split;            /* attention's position splits (ppn_op_attn_split of the primary), fixed at
                                * load: every stage and every map reduce in the same shape, so same bits */
    int sm_count;              /* the primary's SMs (batched attention takes one split when rows x n_kv fill them) */
    struct ppn_kv_pools {      /* paged KV (kvpool.c) */
        int n_blocks, cap;     /* blocks, and positions (n_blocks << PPN_KV_BLOCK_LOG2) of every pool */
        int *free, n_free;     /* free block ids (a stack; the caller's thread) */
        ppn_dptr *k, *v;       /* per layer: the pools [n_kv, cap, head_dim] */
        int *dev;              /* per layer: their device (-1: none) */
    } kv;
};

/* Scratch of one stage for one sequence, on the stage's device. io = [hdr][x] (the boundary layout). */
typedef struct ppn_stage_scratch {
    int dev;                   /* -1: not allocated */
    ppn_dptr io, xb, att;
    ppn_dptr qkv;              /* [q: n_heads*hd][k: n_kv*hd][v: n_kv*hd], the fused projection's output */
    ppn_dptr gu;               /* [gate: ffn][up: ffn]; SwiGLU writes its result over gate */
    ppn_dptr ulogits;          /* stage 0 only: logits of the unsplit (batch) walk */
    ppn_dptr attp;
    ppn_dptr tokin;            /* stage 0 only: the previous step's greedy token, copied in from the last stage */
    ppn_dptr kvt;              /* int32 [ppn_kv_max_blocks]: the sequence's KV block table on this device */
    int kvt_synced;            /* entries kvt holds (the stage's issuing thread; the caller between drains) */             /* attention's split partials and arrival counters (zeroed at allocation) */
} ppn_stage_scratch;

/* One captured stage body of one sequence (step.c): valid for one map generation, io and logits buffer. */
#define PPN_STAGE_GRAPHS 16 /* what a stage can meet: 2 boundary slots x 4 logits entries x argmax or not */
typedef struct ppn_stage_graph {
    ppn_ggraph *exec;          /* NULL: an empty entry */
    uint64_t gen;
    ppn_dptr io, logits, tok;  /* tok: where the body's argmax goes (0: none) */
    int dev;
} ppn_stage_graph;

struct ppn_seq {
    ppn_model *m;
    struct ppn_seq *next;      /* model's live list */
    int id;
    int pos;
    int32_t *tbl_h;            /* pinned [ppn_kv_max_blocks]: the KV block table (entry b: positions b*16 ..) */
    int n_blk;                 /* blocks held: positions < n_blk * PPN_KV_BLOCK have a home */
    ppn_stage_scratch scr[PPN_MAX_STAGES];
    /* the logits ring, on the last stage's device */
    int ring_dev;
    ppn_dptr logits[PPN_MAX_INFLIGHT];
    ppn_gevent *done_ev[PPN_MAX_INFLIGHT], *rb_ev[PPN_MAX_INFLIGHT];
    float *logits_h[PPN_MAX_INFLIGHT];
    /* device greedy decode, on ring_dev: tok[i] (int32) = argmax of logits[i]; amx = the split argmax's scratch.
     * Separate blocks: the checker orders accesses per block, and these are read and written by different
     * streams (readback, stage 0's header, the last stage's argmax) */
    ppn_dptr tok[PPN_MAX_INFLIGHT], amx;
    int32_t *tok_h;            /* pinned [PPN_MAX_INFLIGHT]: the ids read back */
    _Atomic uint32_t done_gen[PPN_MAX_INFLIGHT]; /* step+1 whose done event the last stage recorded */
    uint32_t ring_step[PPN_MAX_INFLIGHT];        /* caller: step+1 issued on the ring entry (0: free) */
    int ring_pos[PPN_MAX_INFLIGHT];              /* caller: a decode step's position (for its messages) */
    uint64_t issued, waited;   /* caller: deferred steps issued / retired (waited or dropped) */
    /* each stage's captured bodies: touched only by that stage's issuing thread, dropped between drained steps */
    ppn_stage_graph graphs[PPN_MAX_STAGES][PPN_STAGE_GRAPHS];
    unsigned graph_next[PPN_MAX_STAGES]; /* the entry the next capture replaces (round robin) */
};

/* The internal functions, by file, bottom up: a file calls only the files above it in this list (and the
 * floors below core/: alloc, sched, transport, kernels, core/model, core/device, core/base). */

/* model.c: what every part of a loaded model shares */
/* The stage of map that runs layer l. */
int ppn_layer_stage(const ppn_stage_map *map, int l);
ppn_status ppn_model_dev_stream(ppn_model *m, int dev, ppn_gstream **out); /* created on first use */
/* Keep the first failure (status and the thread's message) on the model: sticky, every later step returns it. */
void ppn_model_fail(ppn_model *m, ppn_status st);
/* PPN_OK, or the model's sticky failure (re-set as this thread's message). */
ppn_status ppn_model_failed(ppn_model *m);
/* m->engine_on: no engine (the caller's thread drives the model, as the API says); an engine being created or
 * destroyed (the thread creating or destroying it drives the model); an engine running (its scheduler thread alone
 * drives the model: it owns every sequence and step). One engine a model at a time. */
enum { PPN_ENGINE_NONE, PPN_ENGINE_HANDOVER, PPN_ENGINE_RUNS };
/* The calling thread is (m non-NULL) or is no longer (NULL) the scheduler thread of m's engine. */
void ppn_model_engine_thread(const ppn_model *m);
/* 1 when the calling thread is the scheduler thread of m's engine. */
int ppn_model_on_engine_thread(const ppn_model *m);
/* PPN_OK where the calling thread may drive m (create, destroy, reset, truncate or step its sequences, publish a
 * door, time its stages); PPN_ESTATE naming op while an engine runs on m and this is not its scheduler thread:
 * refused before anything changes, so m, its sequences and the engine carry on. */
ppn_status ppn_model_caller(ppn_model *m, const char *op);
/* Every command handed to a stage thread has finished (the devices may still be running them). */
ppn_status ppn_model_drain(ppn_model *m);
/* A block of n bytes from dev's pool, allocated (or freed) on dev's model stream: for state that stages use only
 * after a host sync (scratch, caches, slots), never on the step path. */
ppn_status ppn_model_block_alloc(ppn_model *m, int dev, size_t n, const char *tag, ppn_dptr *out);
/* *p = 0 after, whatever the status (0 is nothing to free); the pool free's failure is returned (a failed event
 * record retires the block: alloc/pool.h). */
ppn_status ppn_model_block_free(ppn_model *m, int dev, ppn_dptr *p);

/* kvpool.c: paged KV */
int ppn_kv_max_blocks(const ppn_model *m);          /* blocks of one full-context sequence */
ppn_status ppn_kv_init(ppn_model *m, int tokens);   /* the host side, for tokens positions (no pools yet) */
/* The KV pools' positions (whole blocks) for room positions of free memory and a context of *ctx: kv_want rounded
 * up when given; else 4 contexts (at least PPN_KV_DEFAULT_MIN), or the whole blocks the room holds when that is
 * less, and where even those cannot hold one sequence of *ctx, a *ctx that was chosen (ctx_free) shrinks to them.
 * A result past room is the caller's refusal (core/load.c). */
size_t ppn_kv_pool_positions(size_t room, int *ctx, int ctx_free, int kv_want);
ppn_status ppn_kv_fini(ppn_model *m);            /* the pools freed; the first failed free returned */
/* PPN_ESTATE when a sequence holds blocks of a layer map would move (checked before anything changes). */
ppn_status ppn_kv_check_map(const ppn_model *m, const ppn_stage_map *map);
ppn_status ppn_kv_fit_map(ppn_model *m, const ppn_stage_map *map); /* pools where map runs each layer */
/* Blocks for positions < end[i] of seqs[i], all or none: PPN_ENOMEM naming a sequence when too few are free. */
ppn_status ppn_kv_need(ppn_seq *const *seqs, const int *end, int n);
ppn_status ppn_kv_reserve(ppn_seq *const *seqs, const int *end, int n);
ppn_status ppn_kv_reserve_one(ppn_seq *q, int end);
void ppn_kv_release(ppn_seq *q, int keep_pos);      /* blocks past keep_pos back to the pool (between drains) */
/* Stage s's device table of q holds its first n_tbl entries: the missing ones copied on stream. */
ppn_status ppn_kv_sync(ppn_model *m, ppn_seq *q, int s, ppn_gstream *stream, int n_tbl);
ppn_kv_pool ppn_kv_pool_of(const ppn_model *m, int l);
/* q's view of layer l's pools through stage s's device table, n_tbl blocks held. */
ppn_kv_view ppn_kv_view_of(const ppn_model *m, const ppn_seq *q, int s, int l, int n_tbl);

/* seq.c */
/* Scratch on every stage's device and the logits ring on the last one's, as map places them. */
ppn_status ppn_seq_fit_map(ppn_seq *q, const ppn_stage_map *map);
/* Destroy q's captured graphs (its scratch is about to move or die); call between drained steps. */
void ppn_seq_drop_graphs(ppn_seq *q);
/* Ring entry ring of q is free again (its step was waited or dropped). */
void ppn_seq_retire(ppn_seq *q, int ring);
/* Drop every step of q in flight (no readback), its deferred batch steps' rows included (the one call up this
 * list: ppn_bstep_drop_rows_of in batch_defer.c); on a healthy model the host waits for the dropped steps' done
 * events, so the caller may rewrite q's KV block table after. Returns the model's failure, if any (a failed wait
 * becomes it). */
ppn_status ppn_seq_drop_inflight(ppn_seq *q);

/* stagemap.c */
/* Two or more stage streams on one device (reported in ppn_stage_info.same_device_streams). */
int ppn_multi_stream_same_device(const ppn_stage_map *map);
/* Build a map from the door (every door value checked; nothing allocated but the map). */
ppn_status ppn_map_build(ppn_model *m, const ppn_door *d, ppn_stage_map **out);
/* Install map: quiesce the old one, streams, boundaries, sequences refitted, publish, then the stage issue
 * threads, each running stage_fn on its commands. On success the model owns map. */
ppn_status ppn_map_install(ppn_model *m, ppn_stage_map *map, ppn_issue_fn stage_fn);
/* Stop the stage threads, free the map's homes; a failed device free does not stop it (the first is returned). */
ppn_status ppn_map_teardown(ppn_model *m);
/* Destroy stage s's captured batch walks (its rows scratch or map is about to change; between drained steps). */
void ppn_stage_drop_batch_graphs(ppn_model *m, int s);
/* busy.c. Around a walk on stage s's stream q (s: the stream's stage, 0 on one stream): begin records the start
 * (when timing is on) after summing the pairs that completed; end records the end of an opened pair. */
ppn_status ppn_busy_begin(ppn_model *m, int s, ppn_gstream *q);
ppn_status ppn_busy_end(ppn_model *m, int s, ppn_gstream *q);
/* With the stage's stream idle (drained, synchronised): every pair summed; fini also frees the events. */
ppn_status ppn_busy_flush(ppn_model *m, int s);
void ppn_busy_fini(ppn_model *m, int s);
/* Destroy every stage's captured batch walks whose rows included q (q is being destroyed; between drains). */
void ppn_drop_batch_graphs_of(ppn_model *m, const struct ppn_seq *q);
/* Room for many-rows walks of up to rows rows: boundary slots and every stage's rows scratch grown (after a
 * quiesce) when they hold fewer. @return PPN_OK, PPN_ENOMEM (the device named), PPN_EDRIVER. */
ppn_status ppn_map_reserve_rows(ppn_model *m, int rows);
/* The device bytes one stage's rows scratch takes for rows rows on a map of stages stages (stagemap.c's
 * rows_scratch_alloc: io, xb, q|k|v, attention, gate|up, act, tokens, argmax, row descriptors, a logits row), with
 * every row's logits (allocated on a batch or mixed walk's first use): what the default KV pools leave free (load.c). */
size_t ppn_rows_scratch_bytes(const ppn_model_config *c, int rows, int stages);
/* ppn_map_reserve_rows, and batched attention's scratch for batches of up to rows rows on every stage. */
ppn_status ppn_map_reserve_batch(ppn_model *m, int rows);

/* forward.c: the pieces of a step, enqueued on stream s. io = [hdr][x]. */
ppn_status ppn_fwd_embed(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io);
ppn_status ppn_fwd_layer(ppn_seq *q, ppn_gstream *s, int dev, ppn_stage_scratch *r, ppn_dptr io, int l);
ppn_status ppn_fwd_head(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io, ppn_dptr logits);
/* Many rows: x [rows, dim] (the rows io's x). embed reads r->tok; layer l walks every row, the rotary, KV store and
 * attention per segment; head writes each segment's logits (its last row's, or every row's) to its out on the
 * host, ordered on s (the caller syncs before reading them). */
ppn_status ppn_fwd_rows_embed(ppn_model *m, ppn_gstream *s, const ppn_rows_scratch *r, ppn_dptr x, int rows);
ppn_status ppn_fwd_rows_layer(ppn_model *m, ppn_gstream *s, int dev, const ppn_rows_scratch *r, ppn_dptr x,
                              const struct ppn_step_cmd *cmd, int l);
ppn_status ppn_fwd_rows_head(ppn_model *m, ppn_gstream *s, ppn_rows_scratch *r, ppn_dptr x, const ppn_rowseg *sg,
                             int nseg, int rows);
/* A batch's head: every row's logits by one GEMM over the lm head into r->lall, and with ids their argmax into
 * r->ids (only launches: a graph may capture it; r->lall must exist: ppn_fwd_rows_lall). */
ppn_status ppn_fwd_rows_head_batch(ppn_model *m, ppn_gstream *s, ppn_rows_scratch *r, ppn_dptr x, int rows, int ids);
/* r->lall [r->rows, vocab], allocated (and its allocation finished) if it is not yet. */
ppn_status ppn_fwd_rows_lall(ppn_model *m, ppn_rows_scratch *r);

/* step.c: one step through the stages */
/* A deferred step inside ppn: its logits ring entry and global step number (ppn_step_id is its public name). */
typedef struct ppn_pend {
    int ring;
    uint32_t step;
} ppn_pend;
/* ring in the bits above 33, step + 1 below: never 0 */
static inline ppn_step_id ppn_pend_id(ppn_pend p) { return ((uint64_t)p.ring << 33) | ((uint64_t)p.step + 1); }
static inline ppn_pend ppn_pend_of(ppn_step_id id)
{
    return (ppn_pend){.ring = (int)(id >> 33), .step = (uint32_t)((id & ((1ull << 33) - 1)) - 1)};
}
/* Greedy decode: the step is fed the argmax of step tok_step on ring entry tok_ring (-1: the first greedy step,
 * fed its token) and computes its own argmax on the device. */
typedef struct ppn_greedy_link {
    int tok_ring;
    uint32_t tok_step;
} ppn_greedy_link;
/* The stage issue thread's command handler (ppn_map_install starts the threads with it). */
void ppn_stage_thread_fn(void *ctx, ppn_cmd *c);
/* The checks every step passes before anything is issued: the model's failure, token, room, in-flight room. */
ppn_status ppn_step_checks(ppn_seq *q, int token);
/* Issue q's next step on a free ring entry (gl: NULL for a host-fed step); *out is set whatever the status. */
ppn_status ppn_step_issue_deferred(ppn_seq *q, int token, const ppn_greedy_link *gl, ppn_pend *out);
/* Issue a many-rows walk (tmpl: seq, rows, nseg, segs, tok_h) on a free ring entry of tmpl->seq, whose done event
 * marks the walk's end; the caller found the entry free. *out is set whatever the status. The positions are the
 * caller's to advance. */
ppn_status ppn_step_issue_rows(const ppn_step_cmd *tmpl, ppn_pend *out);
/* The unsplit walk's inputs, after the stages drained: every stage's KV block tables of c's sequences on that
 * stage's stream, and a batch's row descriptors of every stage into stage 0's rows scratch on stage 0's stream. */
ppn_status ppn_rows_inputs_unsplit(ppn_model *m, const ppn_step_cmd *c);
/* The chunk's token ids (c->tok_h, pinned host memory that outlives the walk) into stage 0's rows scratch, on q. */
ppn_status ppn_rows_tokens(ppn_model *m, ppn_gstream *q, const ppn_step_cmd *c);
/* Layers [f0, f1) of c's rows over x on stream q of device dev with scratch r (embedding first, head last when
 * asked): a stage's part of a chunk, or the whole unsplit walk. */
ppn_status ppn_rows_body(ppn_model *m, ppn_gstream *q, int dev, ppn_rows_scratch *r, ppn_dptr x,
                         const ppn_step_cmd *c, int f0, int f1, int embed, int head);

/* pending.c */
/* Wait for step p of q (issued and not yet waited) and read back its logits (logits != NULL) or its device argmax
 * (id != NULL); the ring entry is free after. */
ppn_status ppn_pend_wait(ppn_seq *q, ppn_pend p, float *logits, int *id);
/* The index of the first NaN or Inf of x[0..n), or n when every value is finite. */
size_t ppn_logits_first_nonfinite(const float *x, size_t n);
/* PPN_ENONFINITE for logits[i] = v of what (e.g. "sequence 3, the step at position 7"), naming the stage that
 * computed them (the last of m's map: the final norm and the head). */
ppn_status ppn_logits_nonfinite(const ppn_model *m, const char *what, size_t i, float v);
/* A row a many-rows walk returned for q at pos (fn names the call): its logits (vocab floats; NULL: none)
 * finite and its device argmax (NULL: none) not -1, else PPN_ENONFINITE naming fn, the sequence, the position
 * and the stage. */
ppn_status ppn_row_checked(const ppn_model *m, const char *fn, const ppn_seq *q, int pos, const float *logits,
                           const int32_t *id);

/* rows_run.c: a list of many-rows walks run to the end */
/* Each walk issued through the stages (the split or the one stage), up to depth (1 .. PPN_MAX_INFLIGHT) in
 * flight; every issued walk is waited, whatever fails. */
ppn_status ppn_rows_run_staged(ppn_model *m, const ppn_step_cmd *cmds, int n, int depth);
/* Every walk through every layer on stage 0's stream, after every stage stream drained; synchronised on return. */
ppn_status ppn_rows_run_unsplit(ppn_model *m, const ppn_step_cmd *cmds, int n);
/* PPN_EUNSUPPORTED (naming what and alt) when stage 0's device cannot reach another stage's memory. */
ppn_status ppn_rows_unsplit_reachable(ppn_model *m, const char *what, const char *alt);
/* After a failure: every stage thread's commands finished and every stage stream synchronised, so the caller may
 * free what the walks read (errors ignored: the first failure is the one reported). */
void ppn_rows_quiesce(ppn_model *m);

/* batch.c */
/* PPN_EREFUSED naming path and alt when path would walk the whole trunk on one stream while weights live on
 * other devices (MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 overrides). */
ppn_status ppn_refuse_unsplit_if_remote(const ppn_model *m, const char *path, const char *alt);
/* A batch call's arguments (fn names the call): NULLs, n, micro, distinct sequences of one model, every row's
 * token and room (ppn_step_checks), the prompt slices; deferred steps in flight on a row are refused unless
 * inflight_ok (then only a full in-flight room is). */
ppn_status ppn_batch_check(const char *fn, ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *o,
                           int inflight_ok);
/* The walk a batch of n rows (np prompt slices) takes under the published map: *unsplit (MEMRA_BATCH_PP=0 or
 * one stream; refused, naming fn, when weights are remote or unreachable from stage 0) and *mb micro-batches. */
ppn_status ppn_batch_arm(ppn_model *m, const char *fn, const ppn_batch_opts *o, int n, int *unsplit, int *mb);
/* The host side of a batch step's walks: micro-batch k holds rows [k n / mb, (k + 1) n / mb), one segment per
 * row; its ids land in ids_h and its logits in logits at its first row. A mixed step (o->n_prime) is one walk
 * whose first rows are the prompt slices, one segment each, and whose decode rows follow from brow0. */
typedef struct ppn_batch_plan {
    ppn_step_cmd cmds[PPN_MAX_INFLIGHT];
    ppn_rowseg *segs;
    int32_t *tok_h, *ids_h;
    ppn_kseg *ksegs;           /* pinned: micro-batch k's [n_stages][its rows] at n_stages * its first row */
    const int32_t **tbl_hs;    /* row i's host block table and blocks (the ops' declarations) */
    int *n_tbls;
    int mb, n;
} ppn_batch_plan;
/* Build the plan of n rows at the sequences' current positions (their KV blocks reserved). ids_h is allocated
 * when want_ids. @return PPN_OK, PPN_ENOMEM (host or pinned memory: free the plan all the same). */
ppn_status ppn_batch_plan_build(ppn_model *m, ppn_seq *const *seqs, const int *tokens, int n, int mb, float *logits,
                                int want_ids, const ppn_batch_opts *o, ppn_batch_plan *pl);
/* The same rows at their sequences' current positions (a plan of decode rows only, reused for a later step). */
void ppn_batch_plan_refill(ppn_model *m, ppn_seq *const *seqs, ppn_batch_plan *pl);
void ppn_batch_plan_free(ppn_model *m, ppn_batch_plan *pl);
/* ppn_op_argmax_rows's rule on the host: the lowest index of the largest value, -1 when any is NaN or infinite. */
int ppn_batch_argmax_rule(const float *x, int n);

/* batch_defer.c: deferred batch steps and the device greedy loop of a batch */
/* A deferred batch step in flight (ppn_decode_batch_deferred), on its model's list until waited or until every
 * row's sequence dropped it. */
typedef struct ppn_bstep ppn_bstep;
/* Drop q's rows of the deferred batch steps in flight: each such step's walks are waited (no readback: their
 * results stay for the other rows' wait), q's in-flight room is freed, and a step no live row holds any more is
 * freed. Returns PPN_OK or the first failure one of those walks met. */
ppn_status ppn_bstep_drop_rows_of(ppn_seq *q);

/* upload.c */
/* Every weight of c to the device m->layer_dev / embed_dev / head_dev give it, then the load barrier. */
ppn_status ppn_upload_weights(ppn_model *m, const ppn_ckpt *c, const ppn_load_opts *o);
#if PPN_TEST_HOOKS
/* Test-only (ppncore_test): refill a staging buffer without waiting for the copy out of it (proves the sim
 * checker reports the race that wait prevents). */
void ppn_upload_test_skip_staging_wait(int skip);
/* Test-only: ppn_seq_destroy skips its stream syncs (the device half of its drain; the host half, waiting for
 * the stage threads' commands, stays: without it they would use freed host memory, which no checker of the
 * device model can see). */
void ppn_seq_test_skip_destroy_syncs(int skip);
/* Test-only: quiesce (before a map is replaced or torn down) skips its stream syncs. */
void ppn_map_test_skip_quiesce_syncs(int skip);
/* Test-only: dropping a sequence's steps in flight (reset, truncate, destroy) skips the wait for their done events,
 * so a reset's next step may rewrite the pinned KV block table while a dropped step's copy still reads it. */
void ppn_seq_test_skip_drop_syncs(int skip);
/* Test-only: a step's wait (ppn_pend_wait) skips its device half (the readback stream's wait on the step's done
 * event and its sync) and keeps the host half (the done generation): the host goes on once the done event is
 * recorded, not once it has executed, so it may read the ids a walk's last copy is still writing, or the next
 * call may write its tokens into pinned staging a copy of the walk is still reading. */
void ppn_pend_test_skip_wait_syncs(int skip);
#endif

#endif
