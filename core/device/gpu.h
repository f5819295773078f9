/* gpu.h - the device layer: one vtable of device operations, two backends (cuda, sim).
 *
 * Everything above this layer (pool, transport, forward) talks to devices only through struct ppn_gpu_ops.
 * Device memory is addressed by ppn_dptr (a CUdeviceptr on cuda; a host address of simulated memory on sim).
 *
 * Threading contract: every op may be called from any thread. Calls on one stream must be serialized by
 * the caller (one issuing thread per stream at a time), as with the CUDA driver. Device ordinals are 0-based
 * and valid in [0, device_count).
 *
 * Errors: every op returns a ppn_status and sets ppn_last_error(). Stream-ordered failures (a sim checker
 * report, an asynchronous driver fault) are sticky on the backend: they surface at the next sync, query or
 * enqueue, as with the CUDA driver's sticky errors.
 */
#ifndef PPN_GPU_H
#define PPN_GPU_H

#include <stddef.h>
#include <stdint.h>
#include "ppn.h"

typedef uint64_t ppn_dptr;
typedef struct ppn_gpu ppn_gpu;
typedef struct ppn_gstream ppn_gstream; /* backend-defined */
typedef struct ppn_gevent ppn_gevent;   /* backend-defined */
typedef struct ppn_ggraph ppn_ggraph;   /* backend-defined: an executable graph of captured launches */

typedef struct ppn_device_info {
    char name[128];
    char pci_bus_id[32]; /* "0000:00:06.0" on cuda; on sim "0000:<dev + 1>:00.0" (a place in PPN_TOPO_XML) */
    size_t mem_total;
    int sim;             /* 1 for a simulated device */
    int cc_major, cc_minor;
    int sm_count;
} ppn_device_info;

/* What an op touches, declared so the sim checker can prove the multi-stream laws. */
enum { PPN_ACC_R = 1, PPN_ACC_W = 2, PPN_ACC_RW = 3 };
typedef struct ppn_access {
    ppn_dptr ptr;
    size_t bytes;
    int mode; /* PPN_ACC_R | PPN_ACC_W */
} ppn_access;

#define PPN_LAUNCH_MAX_ACC 8

/* A kernel as the device layer knows it. The layer above (kernels/ktable.c) owns the table and hands it to
 * the backend at open, so this floor never includes the kernels: cuda looks name up in image, sim runs cpu. */
typedef struct ppn_gpu_kernel {
    const char *name;                /* the CUDA symbol (extern "C") */
    size_t params_size;              /* the one by-value parameter struct */
    void (*cpu)(const void *params); /* the CPU reference the sim backend runs */
} ppn_gpu_kernel;

#define PPN_GPU_MAX_KERNELS 48

/* A 2-D tiled tensor map for the tensor memory accelerator (TMA, compute capability 9.0): what tmap_encode
 * encodes into a 128-byte, 64-byte-aligned map that a kernel takes in its params (kparams.h's ppn_tmap). The
 * array is row-major: dim[0] elements a row (contiguous), dim[1] rows, row_bytes apart; a copy moves a box of
 * box[0] x box[1] elements into shared memory in the 128-byte swizzle (box[0] x elem_bytes <= 128), elements
 * outside the array read as zeros. */
typedef struct ppn_tmap_desc {
    ppn_dptr base;      /* 16-byte aligned */
    int elem_bytes;     /* 2 (bf16 / f16: moved as 16-bit words) or 4 (f32) */
    uint64_t dim[2];    /* elements a row, rows: each 1 .. 2^32 */
    uint64_t row_bytes; /* a multiple of 16, at least dim[0] x elem_bytes */
    unsigned box[2];    /* 1 .. 256 each */
} ppn_tmap_desc;
#define PPN_TMAP_BYTES 128

/* One embedded fatbin: the build compiles the kernels in a few translation units (CMakeLists: kernels/gemm.cu's
 * templates apart from the rest, so their compilers run side by side), each into its own image. */
typedef struct ppn_gpu_image {
    const char *name; /* the build's name for it, in messages */
    const void *data;
    size_t size;
} ppn_gpu_image;
#define PPN_GPU_MAX_IMAGES 4

/* The kernels a backend may launch: launch ids index k. */
typedef struct ppn_gpu_kernels {
    const ppn_gpu_kernel *k;
    int n;                /* <= PPN_GPU_MAX_KERNELS */
    /* The fatbins (cuda): a kernel is looked up by name in the first image that has it. n_images 0: built
     * without nvcc (cuda refuses to open for models). */
    const ppn_gpu_image *images;
    int n_images;         /* <= PPN_GPU_MAX_IMAGES */
    unsigned dyn_smem_max; /* dynamic shared memory every kernel is opted in to (cuda) */
    const unsigned *smem_max; /* [n] or NULL: a kernel's own opt-in where it needs more (0: dyn_smem_max) */
    int sm90a;            /* the image has sm_90a code (warpgroup MMA, TMA): tma_ok's condition on cuda */
} ppn_gpu_kernels;

/* One kernel launch. Every kernel takes exactly one parameter: a struct passed by value
 * (kernels/kparams.h); params points at it. The sim backend copies it at enqueue time. */
typedef struct ppn_launch {
    int kernel;                 /* index into the backend's ppn_gpu_kernels */
    unsigned grid[3], block[3]; /* cuda geometry; ignored by sim */
    unsigned smem;              /* dynamic shared memory bytes (cuda) */
    const void *params;
    size_t params_size;
    ppn_access acc[PPN_LAUNCH_MAX_ACC];
    int nacc;
    /* More accesses beyond the fixed list (a paged KV cache declares a range per held block and KV head): host
     * memory read during the launch call only (a backend that keeps them copies them); NULL with nxacc 0. */
    const ppn_access *xacc;
    int nxacc;
} ppn_launch;

/* mem_annotate ops: the pool tells the sim checker which ranges are live blocks. */
enum {
    PPN_ANN_CARVE = 1, /* a raw allocation becomes pool-managed: only live blocks inside it are valid */
    PPN_ANN_ALLOC = 2, /* [p, p+n) becomes a live block (immediately) */
    PPN_ANN_FREE = 3,  /* [p, p+n) is freed, ordered on the given stream (stream-ordered free) */
};

typedef void (*ppn_host_fn)(void *arg);

/* One kernel's account under PPN_KPROF=1 (kprof_read). PPN_KPROF is read once at backend creation: unset,
 * empty or 0 = off, 1 = on, anything else = PPN_EINVAL naming the variable. */
struct ppn_kprof_entry {
    const char *name; /* the kernel's name in kern (static storage) */
    uint64_t calls;   /* launches harvested */
    double ms;        /* cuda: device time between a pair of timing events around each launch;
                       * sim: CPU wall time of the reference kernel (not a device time) */
    double bytes;     /* the launches' declared access bytes (sum of l->acc[i].bytes) */
};

struct ppn_gpu_ops {
    const char *name; /* "cuda" or "sim" */
    void (*destroy)(ppn_gpu *g);

    int (*device_count)(ppn_gpu *g);
    ppn_status (*device_info)(ppn_gpu *g, int dev, ppn_device_info *out);
    ppn_status (*mem_get_info)(ppn_gpu *g, int dev, size_t *free_b, size_t *total_b);

    /* Raw device memory (the pool's slabs). Never on the steady-state step path. */
    ppn_status (*mem_alloc)(ppn_gpu *g, int dev, size_t bytes, ppn_dptr *out);
    ppn_status (*mem_free)(ppn_gpu *g, int dev, ppn_dptr p);
    /* Pinned host memory (cuMemHostAlloc, portable; mmap on sim). */
    ppn_status (*host_alloc)(ppn_gpu *g, size_t bytes, void **out);
    ppn_status (*host_free)(ppn_gpu *g, void *p, size_t bytes);
    /* Pin (and unpin) host memory the caller mapped itself, page aligned (cuMemHostRegister, portable; sim:
     * checked and accepted): how memory bound to a NUMA node first becomes pinned. */
    ppn_status (*host_register)(ppn_gpu *g, void *p, size_t bytes);
    ppn_status (*host_unregister)(ppn_gpu *g, void *p);

    ppn_status (*stream_create)(ppn_gpu *g, int dev, ppn_gstream **out); /* non-blocking stream */
    ppn_status (*stream_destroy)(ppn_gpu *g, ppn_gstream *s);             /* after draining it */
    ppn_status (*stream_sync)(ppn_gpu *g, ppn_gstream *s);
    int (*stream_device)(ppn_gpu *g, ppn_gstream *s);

    ppn_status (*event_create)(ppn_gpu *g, int dev, int timing, ppn_gevent **out);
    ppn_status (*event_destroy)(ppn_gpu *g, ppn_gevent *e);
    ppn_status (*event_record)(ppn_gpu *g, ppn_gevent *e, ppn_gstream *s);
    /* s waits for the latest record of e issued before this call (CUDA semantics). */
    ppn_status (*stream_wait_event)(ppn_gpu *g, ppn_gstream *s, ppn_gevent *e);
    ppn_status (*event_query)(ppn_gpu *g, ppn_gevent *e, int *done);
    ppn_status (*event_sync)(ppn_gpu *g, ppn_gevent *e);
    ppn_status (*event_elapsed)(ppn_gpu *g, ppn_gevent *start, ppn_gevent *end, float *ms);

    /* Asynchronous copies, ordered on s. Host pointers should be pinned (host_alloc) for true asynchrony. */
    ppn_status (*copy_htod)(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, const void *src, size_t n);
    ppn_status (*copy_dtoh)(ppn_gpu *g, ppn_gstream *s, void *dst, ppn_dptr src, size_t n);
    ppn_status (*copy_dtod)(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, ppn_dptr src, size_t n);
    /* Cross-device copy; works without a peer grant (staged through the host, counted by the backend). */
    ppn_status (*copy_peer)(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, int dst_dev, ppn_dptr src, int src_dev,
                            size_t n);
    ppn_status (*memset_d8)(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, unsigned char v, size_t n);

    /* Peer grants: can dev map peer's memory; enable lets kernels on dev touch peer's memory. */
    ppn_status (*peer_can_access)(ppn_gpu *g, int dev, int peer, int *can);
    ppn_status (*peer_enable)(ppn_gpu *g, int dev, int peer);

    ppn_status (*launch)(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l);
    /* Whether kernels launched on s may take tensor maps (the TMA kernels, kparams.h's gemm_tc_h): cuda, a
     * device of compute capability 9.x and an image with sm_90a code; sim, always. PPN_TMA=0 (read at backend
     * creation) says no on both: the kernels that take none run instead (the same bits). The level where they
     * may: PPN_TMA's, 1 (default: the ops take the TMA kernels timed on a GPU) or 2 (also gemm_tc_kwt and
     * gemm_swiglu_t, not yet timed); 0: no. NULL: no. */
    int (*tma_ok)(ppn_gpu *g, ppn_gstream *s);
    /* Encode d into map (PPN_TMAP_BYTES, 64-byte aligned) for kernels launched on s; host-only, nothing is
     * enqueued. cuda: cuTensorMapEncodeTiled; sim: its own encoding, which the sim's CPU references read
     * back. Both refuse a desc outside the limits above (PPN_EINVAL naming the field), and a stream where
     * tma_ok says no (PPN_EUNSUPPORTED). */
    ppn_status (*tmap_encode)(ppn_gpu *g, ppn_gstream *s, const ppn_tmap_desc *d, void *map);
    /* The multiprocessors of s's device (a persistent grid's size: gemm_tc_h); 0 when unknown. Cheap (cached at
     * creation): ops call it per launch. cuda: the device attribute; sim: device_info's (1). */
    int (*sm_count)(ppn_gpu *g, ppn_gstream *s);
    ppn_status (*host_fn)(ppn_gpu *g, ppn_gstream *s, ppn_host_fn fn, void *arg);

    /* Checker annotations (no-op on cuda). s is the ordering stream for PPN_ANN_FREE, else NULL. */
    ppn_status (*mem_annotate)(ppn_gpu *g, ppn_gstream *s, int dev, ppn_dptr p, size_t n, int op,
                               const char *tag);
    /* The live block at p (just annotated PPN_ANN_ALLOC) is handed out for n requested bytes; *out is the
     * address to hand out. cuda: p. sim: an alias of p naming this allocation's generation, so an access
     * through the address of an earlier generation of the block is reported (STALE POINTER), and an access
     * past its n bytes is reported although the block is larger (BOUNDS). The block is freed (PPN_ANN_FREE)
     * through *out. Returns PPN_OK, PPN_EINVAL (p is not a live block of dev). */
    ppn_status (*mem_issue)(ppn_gpu *g, int dev, ppn_dptr p, size_t n, ppn_dptr *out);
    /* The calling thread reads or writes [p, p+n) of pinned host memory (host_alloc) now (mode PPN_ACC_*; what
     * names the buffer in reports). sim: checked at once against the copies whose host side touches it,
     * ordered by what this thread has synchronised with (a report is sticky, like any other); memory that is
     * not pinned is ignored. Called inside a host function (host_fn), it declares an access of that op,
     * ordered as its stream. cuda: nothing. */
    void (*host_access)(ppn_gpu *g, const void *p, size_t n, int mode, const char *what);
    /* A hand-off between host threads by host means (a queue, a generation word, a mutex) that the sim
     * checker cannot see: release before the signal (what the calling thread has observed is published under
     * key), acquire after the wait (the calling thread adopts what was published under key). Matters with a
     * clock per host thread (the sim's default; PPN_SIM_THREAD_CLOCKS=0 shares one), where a sync orders only
     * the syncing thread's later ops. cuda: nothing. */
    void (*host_release)(ppn_gpu *g, const void *key);
    void (*host_acquire)(ppn_gpu *g, const void *key);

    /* Kernel profile (PPN_KPROF=1; a diagnostics path). kprof_read harvests the launches that have completed
     * and writes one entry per kernel with calls > 0, in kernel-id order, at most max of them; it returns the
     * number written (0 when profiling is off). max >= kern.n gets every kernel. kprof_reset zeroes the
     * account; for an exact account call it while no launch is in flight (sim counts a launch when it
     * executes). Both may be called from any thread. */
    int (*kprof_read)(ppn_gpu *g, struct ppn_kprof_entry *out, int max);
    void (*kprof_reset)(ppn_gpu *g);

    /* Graphs: record a run of launches once, replay it with one call per step.
     * capture_begin: from now until capture_end, launches issued on s (from this thread) are recorded, not
     *   run. Only launches may be captured: any other op on a capturing stream (copy, memset, event record or
     *   wait, host fn, sync) returns PPN_ESTATE and leaves the capture as it was. PPN_EUNSUPPORTED when
     *   PPN_KPROF=1 (its per-launch timing events cannot ride in a graph) or s is already capturing.
     * capture_end: ends the capture of s and instantiates it into *out, an executable bound to s's device;
     *   out == NULL abandons the recording (after a failed launch, say). s is an ordinary stream again
     *   whatever the result.
     * graph_launch: enqueue every recorded launch on s, in recorded order, as one op; s must be on the
     *   graph's device. Kernels read what varies per step from device memory (the step header), so one
     *   graph serves every step. graph_destroy: after its last launch was enqueued (the driver keeps it
     *   alive until it has run). */
    ppn_status (*capture_begin)(ppn_gpu *g, ppn_gstream *s);
    ppn_status (*capture_end)(ppn_gpu *g, ppn_gstream *s, ppn_ggraph **out);
    ppn_status (*graph_launch)(ppn_gpu *g, ppn_ggraph *gr, ppn_gstream *s);
    ppn_status (*graph_destroy)(ppn_gpu *g, ppn_ggraph *gr);
};

struct ppn_gpu {
    const struct ppn_gpu_ops *ops;
    /* Counters every backend keeps (read without locks; relaxed atomics). */
    uint64_t n_mem_alloc;     /* raw device allocations (driver cuMemAlloc calls) */
    uint64_t n_host_staged;   /* peer copies staged through the host for lack of a grant */
    uint64_t n_graph_launches; /* graph_launch calls */
    int kprof;                /* PPN_KPROF=1 (immutable after create): graphs are refused */
    int gemm_kx;              /* PPN_GEMM_KX (immutable after create): gemm_tc_kx's level (ppn_gemm_kx_takes) */
    int gemm_w;               /* PPN_GEMM_W (immutable after create): gemm_tc_w's level (ppn_op_gemm_rows16_takes) */
    int gemm_w_swiglu;        /* PPN_GEMM_W_SWIGLU (immutable): gate|up on gemm_swiglu_w's level (ops_gemm.c) */
    ppn_gpu_kernels kern;     /* the launchable kernels (n = 0: device ops only); immutable after create */
};

/* Backend constructors. name: "auto", "cuda" or "sim". auto = cuda when a driver, a device and kernels are
 * present, else sim. Returns PPN_ENODEV (cuda: no driver/device), PPN_ENOKERNELS, PPN_EINVAL (bad name or
 * bad PPN_SIM_* value), PPN_ENOMEM. */
ppn_status ppn_gpu_open(const char *name, const ppn_gpu_kernels *kern, ppn_gpu **out);
/* kern may be NULL in both constructors: a backend for device ops only (pool and stream tests); its launches
 * are refused with PPN_EINVAL. kern->k must outlive the backend (a static table). */
ppn_status ppn_gpu_sim_create(const ppn_gpu_kernels *kern, ppn_gpu **out);  /* reads PPN_SIM_* */
ppn_status ppn_gpu_cuda_create(const ppn_gpu_kernels *kern, ppn_gpu **out); /* dlopen("libcuda.so.1") */
/* Copy kern into g (NULL: none), refusing a table larger than PPN_GPU_MAX_KERNELS. */
ppn_status ppn_gpu_set_kernels(ppn_gpu *g, const ppn_gpu_kernels *kern);
/* PPN_OK when d is within ppn_tmap_desc's limits, else PPN_EINVAL naming the field (both backends' check). */
ppn_status ppn_tmap_check(const char *backend, const ppn_tmap_desc *d);
/* The sim's encoding: a magic word, then d's fields; ppn_tmap_sim_decode returns 0 for a map it did not write. */
void ppn_tmap_sim_encode(const ppn_tmap_desc *d, void *map);
int ppn_tmap_sim_decode(const void *map, ppn_tmap_desc *d);
/* PPN_OK when id names one of g's kernels and params match its struct, else PPN_EINVAL naming the backend. */
ppn_status ppn_gpu_check_launch(const ppn_gpu *g, const ppn_launch *l);

/* sim only: checker reports so far, per kind (counted even when not printed or not sticky). */
#define PPN_SIM_FAIL_KINDS 10
/* sim only: the latency model's copy kinds and their rates: htod and dtoh 20 GB/s, dtod (and copy_peer within a
 * device) 1 TB/s, peer (copy_peer with a possible grant) 50 GB/s, staged (copy_peer through the host) 20 GB/s */
enum { PPN_SIM_COPY_HTOD, PPN_SIM_COPY_DTOH, PPN_SIM_COPY_DTOD, PPN_SIM_COPY_PEER, PPN_SIM_COPY_STAGED,
       PPN_SIM_COPY_KINDS };
/* sim only: the latency model's launch kinds and their costs: a kernel launched through a stream 4 us, one
 * replayed from a graph (graph_launch) 1 us */
enum { PPN_SIM_LAUNCH_STREAM, PPN_SIM_LAUNCH_GRAPH, PPN_SIM_LAUNCH_KINDS };
struct ppn_sim_counts {
    uint64_t race, placement, use_after_free, double_free, bounds;
    uint64_t stale;      /* an access through an earlier generation's address of a reused block (PPN_EUSEAFTERFREE) */
    uint64_t undeclared; /* a write no op declared, found in a block's guard bytes (PPN_EBOUNDS) */
    /* the calls each PPN_SIM_FAIL kind has counted so far (the K its injection counts), in the order alloc, copy,
     * launch, record, wait, memset, hostfn, free, stream, event: test_faults sweeps K up to what a clean run
     * reaches */
    uint64_t fault_calls[PPN_SIM_FAIL_KINDS];
    /* the latency model's account: the copies accepted so far per kind, and the sum of their modelled costs
     * (ns: 5 us + bytes at the kind's rate, PPN_SIM_LATENCY=1's charge; kept whether or not PPN_SIM_LATENCY
     * applies it, and unscaled by its K). Deterministic, unlike the wall time the model adds: tests check the
     * model through it (test_microbench: transport-bench's model_copy_us). */
    uint64_t copies[PPN_SIM_COPY_KINDS];
    uint64_t copy_model_ns[PPN_SIM_COPY_KINDS];
    /* the same account for kernels: those accepted so far per PPN_SIM_LAUNCH_* kind (each kernel of a graph's
     * replay is one), and their modelled costs (ns, unscaled); a launch recorded into a capture is not run, so
     * not counted, and a refused one (fault injection included) is not either (test_microbench: sched-bench's
     * model_launch_us) */
    uint64_t launches[PPN_SIM_LAUNCH_KINDS];
    uint64_t launch_model_ns[PPN_SIM_LAUNCH_KINDS];
};
/* sim only: return the sticky error (PPN_OK if none) and clear it, so the backend can be used again; msg
 * (may be NULL) receives its report. Returns PPN_EINVAL when g is not a sim backend. */
ppn_status ppn_gpu_sim_take_error(ppn_gpu *g, char *msg, size_t cap);
/* sim only: the report counts (all zero when g is not a sim backend). */
void ppn_gpu_sim_counts(ppn_gpu *g, struct ppn_sim_counts *out);
/* sim only: the allocation address behind p (an address mem_issue handed out names the same memory as the
 * block's own address: this undoes the alias, so tests can tell that a block was reused); p elsewhere. */
ppn_dptr ppn_gpu_sim_canonical(ppn_gpu *g, ppn_dptr p);
static inline void ppn_gpu_close(ppn_gpu *g)
{
    if (g) g->ops->destroy(g);
}

#endif
