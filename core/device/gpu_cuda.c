/* gpu_cuda.c - the cuda backend of the device layer: struct ppn_gpu_ops over the CUDA driver API.
 *
 * Contexts: each device uses its primary context, retained on first use of the device (retaining costs
 * device memory, so unused GPUs stay untouched) and released at destroy. Every op that needs a context makes
 * the right one current on the calling thread first; a per-thread cache skips redundant cuCtxSetCurrent.
 *
 * Kernels: the fatbins embedded by the build (kernels/ktable.c's images) are loaded into a device's context on
 * the first launch there; each kernel's CUfunction is looked up by its kernel-table name, in the first image
 * that has it, on its first launch and cached per device.
 *
 * Threading contract (gpu.h): every op may be called from any thread; calls on one stream are serialized by
 * the caller. Per-device lazy state (context, module, functions) is created under the device's mutex and
 * published with a release store; the fast path reads it with an acquire load and takes no lock. The
 * peer-access matrix and the device handles are written once at create and read-only after.
 * Streams and events must be destroyed by their owners before ppn_gpu_close: releasing the last reference
 * to a primary context destroys whatever still lives in it.
 *
 * Code outside ppn that calls cuCtxSetCurrent on a thread that also calls ppn must restore the previous
 * context before calling ppn again (the per-thread cache cannot see such changes).
 *
 * Kernel profile (PPN_KPROF=1, a diagnostics path): each launch is bracketed by two timing events taken from
 * a ring owned by its stream (created at the stream's first profiled launch, reused after), tagged with the
 * kernel id and the launch's declared bytes. Completed pairs are harvested (cuEventElapsedTime) when the ring
 * is half full at a launch, at stream_sync and at kprof_read, into per-kernel totals. A full ring makes the
 * issuing thread wait for its oldest pair: safe because no GPU work of ppn waits on a host thread (ppn issues
 * no host functions that block). Each pair adds two event records to the stream, so profiled steps are slower.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/env.h"
#include "core/device/cuda_drv.h"
#include "core/device/gpu.h"

typedef struct cu_dev {
    CUdevice dev;                            /* written at create, read-only after */
    pthread_mutex_t mu;                      /* serializes the lazy creation of ctx, mod and fn[] */
    _Atomic(CUcontext) ctx;                  /* retained primary context; NULL until first use */
    CUmodule mod[PPN_GPU_MAX_IMAGES];        /* the embedded images in ctx (under mu); NULL until first launch */
    _Atomic(CUfunction) fn[PPN_GPU_MAX_KERNELS];     /* per kernel id; NULL until its first launch */
    int pdl;                                 /* launches carry the programmatic-serialization attribute */
    int tma;                                 /* tma_ok's level (PPN_TMA's, or 0); immutable after create */
    int sms;                                 /* multiprocessors; immutable after create */
} cu_dev;

#define CU_KP_RING 2048u /* event pairs per profiled stream */

/* One profiled launch. */
typedef struct cu_kpair {
    CUevent start, end; /* created with timing; recorded right before and after the launch */
    int kernel;
    double bytes;       /* the launch's declared access bytes */
    uint64_t epoch;     /* the profile's epoch at issue: a reset drops the pairs of older epochs */
} cu_kpair;

/* A stream's ring of event pairs. */
typedef struct cu_kring {
    pthread_mutex_t mu;    /* pairs, head, tail; the issuer holds it from the start record to the end record */
    CUcontext ctx;         /* the stream's context; immutable */
    cu_kpair *pairs;       /* [CU_KP_RING]; NULL until the stream's first profiled launch */
    uint64_t head, tail;   /* pairs published / harvested: [tail, head) are in flight, slot = index % ring */
    struct cu_kring *next; /* the backend's list of rings: under cu_gpu.kp_mu */
} cu_kring;

/* Per-kernel sums harvested from rings, added to the totals when their epoch is still the current one. */
typedef struct cu_kp_sum {
    uint64_t epoch;
    uint64_t calls[PPN_GPU_MAX_KERNELS];
    double ms[PPN_GPU_MAX_KERNELS], bytes[PPN_GPU_MAX_KERNELS];
} cu_kp_sum;

typedef struct cu_gpu {
    ppn_gpu base;          /* first: ppn_gpu * and cu_gpu * convert */
    ppn_cuda_drv drv;      /* immutable after create */
    int ndev;              /* immutable after create */
    unsigned char *can;    /* [ndev * ndev]: can[i*ndev+j] = device i can access j's memory; immutable */
    cu_dev *devs;          /* [ndev] */
    int kprof;             /* PPN_KPROF=1; immutable after create */
    int pdl;               /* PPN_PDL (default 1): programmatic dependent launch where the device has it */
    pthread_mutex_t kp_mu; /* kp_rings, kp_epoch (writes) and the totals; taken before a ring's mu, never after */
    cu_kring *kp_rings;
    _Atomic uint64_t kp_epoch; /* bumped by kprof_reset; read without the lock at issue */
    cu_kp_sum kp_total;    /* kp_total.epoch unused */
} cu_gpu;

struct ppn_gstream {
    CUstream s;
    int dev;
    CUcontext ctx; /* the context s lives in */
    cu_kring *kp;  /* NULL unless PPN_KPROF=1 */
    int capturing; /* between capture_begin and capture_end; only the issuing thread touches it */
};

struct ppn_ggraph {
    CUgraphExec exec;
    int dev;
    CUcontext ctx;
};

/* Only launches may be captured (the gpu.h contract, the same on sim): refuse every other stream op. */
#define CU_NOT_CAPTURING(s, op)                                                                              \
    do {                                                                                                     \
        if ((s)->capturing)                                                                                  \
            return ppn_err(PPN_ESTATE, "cuda: %s on a stream of device %d that is capturing a graph (only "  \
                           "launches can be captured)", op, (s)->dev);                                       \
    } while (0)

struct ppn_gevent {
    CUevent e;
    int dev;
    int timing;
    CUcontext ctx;
};

static inline cu_gpu *cu_of(ppn_gpu *g) { return (cu_gpu *)g; }

/* ---------------------------------------------------------------------------------------------------------
 * Contexts */

/* Bumped whenever a backend is destroyed (its contexts may have been released); a thread's cached current
 * context is trusted only while the epoch it was set in is still current. */
static atomic_uint_fast64_t cu_ctx_epoch = 1;
static _Thread_local struct {
    uint_fast64_t epoch;
    CUcontext ctx;
} cu_tls;

static ppn_status cu_set_current(cu_gpu *b, CUcontext c)
{
    uint_fast64_t ep = atomic_load_explicit(&cu_ctx_epoch, memory_order_relaxed);
    if (cu_tls.ctx == c && cu_tls.epoch == ep) return PPN_OK;
    PPN_CHECK(PPN_CU(&b->drv, cuCtxSetCurrent, c));
    cu_tls.ctx = c;
    cu_tls.epoch = ep;
    return PPN_OK;
}

static ppn_status cu_check_dev(cu_gpu *b, int dev, const char *op)
{
    if (dev < 0 || dev >= b->ndev)
        return ppn_err(PPN_EINVAL, "cuda: %s: device %d out of range [0, %d)", op, dev, b->ndev);
    return PPN_OK;
}

static ppn_status cu_retain_locked(cu_gpu *b, cu_dev *d, int dev, CUcontext *out)
{
    CUcontext c = atomic_load_explicit(&d->ctx, memory_order_relaxed);
    if (!c) {
        ppn_status st = PPN_CU(&b->drv, cuDevicePrimaryCtxRetain, &c, d->dev);
        if (st != PPN_OK) return ppn_err_ctx(st, "retaining the primary context of device %d", dev);
        atomic_store_explicit(&d->ctx, c, memory_order_release); /* pairs with the acquire in cu_ctx() */
    }
    *out = c;
    return PPN_OK;
}

/* The retained primary context of dev (retained on first use). */
static ppn_status cu_ctx(cu_gpu *b, int dev, CUcontext *out)
{
    cu_dev *d = &b->devs[dev];
    CUcontext c = atomic_load_explicit(&d->ctx, memory_order_acquire); /* pairs with cu_retain_locked() */
    if (c) {
        *out = c;
        return PPN_OK;
    }
    pthread_mutex_lock(&d->mu);
    ppn_status st = cu_retain_locked(b, d, dev, out);
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* Make dev's context current on this thread (retaining it on first use). */
static ppn_status cu_use_dev(cu_gpu *b, int dev, const char *op)
{
    CUcontext c = NULL;
    PPN_CHECK(cu_check_dev(b, dev, op));
    PPN_CHECK(cu_ctx(b, dev, &c));
    return cu_set_current(b, c);
}

/* ---------------------------------------------------------------------------------------------------------
 * Devices */

static int cu_device_count(ppn_gpu *g) { return cu_of(g)->ndev; }

static ppn_status cu_attr(cu_gpu *b, int dev, CUdevice_attribute a, const char *what, int *out)
{
    ppn_status st = PPN_CU(&b->drv, cuDeviceGetAttribute, out, a, b->devs[dev].dev);
    if (st != PPN_OK) return ppn_err_ctx(st, "device %d: reading %s", dev, what);
    return PPN_OK;
}

/* Needs no context: these are device queries. */
static ppn_status cu_device_info(ppn_gpu *g, int dev, ppn_device_info *out)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(cu_check_dev(b, dev, "device_info"));
    CUdevice d = b->devs[dev].dev;
    memset(out, 0, sizeof *out);
    PPN_CHECK(PPN_CU(&b->drv, cuDeviceGetName, out->name, (int)sizeof out->name, d));
    PPN_CHECK(PPN_CU(&b->drv, cuDeviceTotalMem, &out->mem_total, d));
    PPN_CHECK(PPN_CU(&b->drv, cuDeviceGetPCIBusId, out->pci_bus_id, (int)sizeof out->pci_bus_id, d));
    PPN_CHECK(cu_attr(b, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability", &out->cc_major));
    PPN_CHECK(cu_attr(b, dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability", &out->cc_minor));
    PPN_CHECK(cu_attr(b, dev, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count", &out->sm_count));
    out->sim = 0;
    return PPN_OK;
}

static ppn_status cu_mem_get_info(ppn_gpu *g, int dev, size_t *free_b, size_t *total_b)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(cu_use_dev(b, dev, "mem_get_info"));
    return PPN_CU(&b->drv, cuMemGetInfo, free_b, total_b);
}

/* ---------------------------------------------------------------------------------------------------------
 * Memory */

static ppn_status cu_mem_alloc(ppn_gpu *g, int dev, size_t bytes, ppn_dptr *out)
{
    cu_gpu *b = cu_of(g);
    CUdeviceptr p = 0;
    PPN_CHECK(cu_use_dev(b, dev, "mem_alloc"));
    ppn_status st = PPN_CU(&b->drv, cuMemAlloc, &p, bytes);
    if (st != PPN_OK) return ppn_err_ctx(st, "allocating %zu bytes on device %d", bytes, dev);
    __atomic_fetch_add(&g->n_mem_alloc, 1, __ATOMIC_RELAXED);
    *out = (ppn_dptr)p;
    return PPN_OK;
}

static ppn_status cu_mem_free(ppn_gpu *g, int dev, ppn_dptr p)
{
    cu_gpu *b = cu_of(g);
    if (!p) return PPN_OK;
    PPN_CHECK(cu_use_dev(b, dev, "mem_free"));
    return PPN_CU(&b->drv, cuMemFree, (CUdeviceptr)p);
}

/* Pinned memory needs some current context; device 0's serves, and PORTABLE makes the pages pinned for
 * every context, so any device's streams can copy from them asynchronously. */
static ppn_status cu_host_alloc(ppn_gpu *g, size_t bytes, void **out)
{
    cu_gpu *b = cu_of(g);
    void *p = NULL;
    if (bytes == 0) return ppn_err(PPN_EINVAL, "cuda: host_alloc of 0 bytes");
    PPN_CHECK(cu_use_dev(b, 0, "host_alloc"));
    ppn_status st = PPN_CU(&b->drv, cuMemHostAlloc, &p, bytes, CU_MEMHOSTALLOC_PORTABLE);
    if (st != PPN_OK) return ppn_err_ctx(st, "pinning %zu host bytes", bytes);
    *out = p;
    return PPN_OK;
}

static ppn_status cu_host_free(ppn_gpu *g, void *p, size_t bytes)
{
    cu_gpu *b = cu_of(g);
    (void)bytes; /* the driver knows the size */
    if (!p) return PPN_OK;
    PPN_CHECK(cu_use_dev(b, 0, "host_free"));
    return PPN_CU(&b->drv, cuMemFreeHost, p);
}

/* Like host_alloc: device 0's context serves, PORTABLE pins the pages for every context. */
static ppn_status cu_host_register(ppn_gpu *g, void *p, size_t bytes)
{
    cu_gpu *b = cu_of(g);
    if (!p || bytes == 0) return ppn_err(PPN_EINVAL, "cuda: host_register(%p, %zu B)", p, bytes);
    PPN_CHECK(cu_use_dev(b, 0, "host_register"));
    ppn_status st = PPN_CU(&b->drv, cuMemHostRegister, p, bytes, CU_MEMHOSTREGISTER_PORTABLE);
    return st == PPN_OK ? PPN_OK : ppn_err_ctx(st, "pinning %zu host bytes at %p", bytes, p);
}

static ppn_status cu_host_unregister(ppn_gpu *g, void *p)
{
    cu_gpu *b = cu_of(g);
    if (!p) return PPN_OK;
    PPN_CHECK(cu_use_dev(b, 0, "host_unregister"));
    return PPN_CU(&b->drv, cuMemHostUnregister, p);
}

/* PPN_PDL: unset, empty or 1 = programmatic dependent launch on every device of compute capability 9.0 or
 * newer (older ones launch plainly); 0 = never; anything else is refused by name. */
static ppn_status cu_pdl_env(cu_gpu *b)
{
    PPN_CHECK(ppn_env_flag("PPN_PDL", &b->pdl));
    for (int i = 0; i < b->ndev && b->pdl; i++) {
        int cc = 0;
        PPN_CHECK(cu_attr(b, i, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability", &cc));
        b->devs[i].pdl = cc >= 9;
    }
    return PPN_OK;
}

/* PPN_TMA: unset, empty or 1 = the TMA kernels on every device of compute capability 9.x when the image has
 * sm_90a code (tma_ok says 1); 2 = those and the split-K tiles' (tma_ok says 2); 3 = of those gemm_tc_k16t alone
 * (ops_gemm.c); 0 = never (the kernels that take no tensor maps run: the same bits); anything else is refused by
 * name. Each device's SM count is cached here too (sm_count). */
static ppn_status cu_tma_env(cu_gpu *b)
{
    int on = 1;
    PPN_CHECK(ppn_env_int("PPN_TMA", &on));
    for (int i = 0; i < b->ndev; i++) {
        int cc = 0;
        PPN_CHECK(cu_attr(b, i, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability", &cc));
        b->devs[i].tma = cc == 9 && b->base.kern.sm90a ? on : 0; /* tma_ok's level */
        PPN_CHECK(cu_attr(b, i, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count", &b->devs[i].sms));
    }
    return PPN_OK;
}

static int cu_sm_count(ppn_gpu *g, ppn_gstream *s) { return s ? cu_of(g)->devs[s->dev].sms : 0; }

static int cu_tma_ok(ppn_gpu *g, ppn_gstream *s) { return s ? cu_of(g)->devs[s->dev].tma : 0; }

static ppn_status cu_tmap_encode(ppn_gpu *g, ppn_gstream *s, const ppn_tmap_desc *d, void *map)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(ppn_tmap_check("cuda", d));
    if (!map || ((uintptr_t)map & 63u))
        return ppn_err(PPN_EINVAL, "cuda: tmap_encode: map %p is not 64-byte aligned", map);
    if (!cu_tma_ok(g, s))
        return ppn_err(PPN_EUNSUPPORTED, "cuda: tmap_encode: no TMA kernels on device %d (compute capability 9.x, "
                                         "an image with sm_90a code and PPN_TMA not 0)", s ? s->dev : -1);
    cuuint64_t dims[2] = {d->dim[0], d->dim[1]}, strides[1] = {d->row_bytes};
    cuuint32_t box[2] = {d->box[0], d->box[1]}, es[2] = {1, 1};
    CUtensorMapDataType dt = d->elem_bytes == 4 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
    return PPN_CU(&b->drv, cuTensorMapEncodeTiled, (CUtensorMap *)map, dt, 2, (void *)(uintptr_t)d->base, dims,
                  strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                  CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/* ---------------------------------------------------------------------------------------------------------
 * Kernel profile (PPN_KPROF=1) */

static ppn_status cu_kp_env(cu_gpu *b) { return ppn_env_flag("PPN_KPROF", &b->kprof); }

static void cu_kp_sum_init(cu_gpu *b, cu_kp_sum *sum)
{
    memset(sum, 0, sizeof *sum);
    sum->epoch = atomic_load_explicit(&b->kp_epoch, memory_order_relaxed);
}

/* Under kp_mu: a sum harvested before a reset is dropped (its launches were issued before it). */
static void cu_kp_add_locked(cu_gpu *b, const cu_kp_sum *sum)
{
    if (sum->epoch != atomic_load_explicit(&b->kp_epoch, memory_order_relaxed)) return;
    for (int k = 0; k < PPN_GPU_MAX_KERNELS; k++) {
        b->kp_total.calls[k] += sum->calls[k];
        b->kp_total.ms[k] += sum->ms[k];
        b->kp_total.bytes[k] += sum->bytes[k];
    }
}

static void cu_kp_add(cu_gpu *b, const cu_kp_sum *sum)
{
    uint64_t any = 0;
    for (int k = 0; k < PPN_GPU_MAX_KERNELS; k++) any |= sum->calls[k];
    if (!any) return;
    pthread_mutex_lock(&b->kp_mu);
    cu_kp_add_locked(b, sum);
    pthread_mutex_unlock(&b->kp_mu);
}

/* Under r->mu, with r's context current: move the completed pairs into sum, oldest first (a stream completes
 * in issue order, so the first pair not done ends the scan). The oldest `need` pairs are waited for if they
 * are not done yet (a full ring). */
static ppn_status cu_kp_harvest(cu_gpu *b, cu_kring *r, uint64_t need, cu_kp_sum *sum)
{
    for (uint64_t freed = 0; r->tail < r->head; freed++) {
        cu_kpair *p = &r->pairs[r->tail % CU_KP_RING];
        CUresult q = b->drv.cuEventQuery(p->end);
        if (q == CUDA_ERROR_NOT_READY) {
            if (freed >= need) return PPN_OK;
            PPN_CHECK(PPN_CU(&b->drv, cuEventSynchronize, p->end));
        } else {
            PPN_CHECK(ppn_cuda_result(&b->drv, q, "cuEventQuery(p->end)", PPN_CU_FILE_, __LINE__));
        }
        float ms = 0;
        PPN_CHECK(PPN_CU(&b->drv, cuEventElapsedTime, &ms, p->start, p->end));
        if (p->epoch == sum->epoch) {
            sum->calls[p->kernel]++;
            sum->ms[p->kernel] += (double)ms;
            sum->bytes[p->kernel] += p->bytes;
        }
        r->tail++;
    }
    return PPN_OK;
}

/* Harvest what r has completed (waiting for nothing) and add it to the totals. */
static ppn_status cu_kp_collect(cu_gpu *b, cu_kring *r)
{
    cu_kp_sum sum;
    ppn_status st = PPN_OK;
    cu_kp_sum_init(b, &sum);
    pthread_mutex_lock(&r->mu);
    if (r->pairs) {
        st = cu_set_current(b, r->ctx);
        if (st == PPN_OK) st = cu_kp_harvest(b, r, 0, &sum);
    }
    pthread_mutex_unlock(&r->mu);
    cu_kp_add(b, &sum);
    if (st != PPN_OK) return ppn_err_ctx(st, "PPN_KPROF: harvesting kernel timings");
    return PPN_OK;
}

/* Destroy a ring's events (up to n pairs) and free its array; the ring's context must be current. */
static ppn_status cu_kp_events_free(cu_gpu *b, cu_kring *r, unsigned n)
{
    ppn_status st = PPN_OK;
    for (unsigned i = 0; i < n; i++) {
        ppn_status a = r->pairs[i].start ? PPN_CU(&b->drv, cuEventDestroy, r->pairs[i].start) : PPN_OK;
        ppn_status e = r->pairs[i].end ? PPN_CU(&b->drv, cuEventDestroy, r->pairs[i].end) : PPN_OK;
        if (st == PPN_OK) st = a != PPN_OK ? a : e;
    }
    free(r->pairs);
    r->pairs = NULL;
    return st;
}

/* A ring for a new stream (its events come at the first profiled launch), linked into the backend's list. */
static ppn_status cu_kp_ring_new(cu_gpu *b, CUcontext ctx, cu_kring **out)
{
    cu_kring *r = calloc(1, sizeof *r);
    if (!r) return ppn_err(PPN_ENOMEM, "PPN_KPROF: out of host memory for a stream's event ring");
    pthread_mutex_init(&r->mu, NULL);
    r->ctx = ctx;
    pthread_mutex_lock(&b->kp_mu);
    r->next = b->kp_rings;
    b->kp_rings = r;
    pthread_mutex_unlock(&b->kp_mu);
    *out = r;
    return PPN_OK;
}

/* Unlink and free a ring whose stream is drained (or dead): events still pending are released by the driver
 * when they complete. */
static ppn_status cu_kp_ring_free(cu_gpu *b, cu_kring *r)
{
    ppn_status st = PPN_OK;
    pthread_mutex_lock(&b->kp_mu);
    for (cu_kring **pp = &b->kp_rings; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&b->kp_mu);
    if (r->pairs) {
        st = cu_set_current(b, r->ctx);
        ppn_status st2 = cu_kp_events_free(b, r, CU_KP_RING);
        if (st == PPN_OK) st = st2;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
    return st;
}

/* One entry per kernel with calls, after harvesting what every stream has completed. A stream whose harvest
 * fails keeps its pairs (its fault surfaces at its next sync or launch). */
static int cu_kprof_read(ppn_gpu *g, struct ppn_kprof_entry *out, int max)
{
    cu_gpu *b = cu_of(g);
    int n = 0;
    if (!b->kprof || !out || max <= 0) return 0;
    pthread_mutex_lock(&b->kp_mu);
    for (cu_kring *r = b->kp_rings; r; r = r->next) {
        cu_kp_sum sum;
        cu_kp_sum_init(b, &sum);
        pthread_mutex_lock(&r->mu);
        if (r->pairs && cu_set_current(b, r->ctx) == PPN_OK) (void)cu_kp_harvest(b, r, 0, &sum);
        pthread_mutex_unlock(&r->mu);
        cu_kp_add_locked(b, &sum);
    }
    for (int k = 0; k < g->kern.n && n < max; k++)
        if (b->kp_total.calls[k])
            out[n++] = (struct ppn_kprof_entry){g->kern.k[k].name, b->kp_total.calls[k], b->kp_total.ms[k],
                                                b->kp_total.bytes[k]};
    pthread_mutex_unlock(&b->kp_mu);
    return n;
}

static void cu_kprof_reset(ppn_gpu *g)
{
    cu_gpu *b = cu_of(g);
    if (!b->kprof) return;
    pthread_mutex_lock(&b->kp_mu);
    atomic_fetch_add_explicit(&b->kp_epoch, 1, memory_order_relaxed);
    memset(&b->kp_total, 0, sizeof b->kp_total);
    pthread_mutex_unlock(&b->kp_mu);
}

/* ---------------------------------------------------------------------------------------------------------
 * Streams and events */

static ppn_status cu_stream_create(ppn_gpu *g, int dev, ppn_gstream **out)
{
    cu_gpu *b = cu_of(g);
    ppn_status st = PPN_OK;
    ppn_gstream *s = calloc(1, sizeof *s);
    if (!s) return ppn_err(PPN_ENOMEM, "cuda: stream_create: out of host memory");
    PPN_CHECK_GOTO(cu_use_dev(b, dev, "stream_create"), st, out);
    PPN_CHECK_GOTO(cu_ctx(b, dev, &s->ctx), st, out);
    if (b->kprof) PPN_CHECK_GOTO(cu_kp_ring_new(b, s->ctx, &s->kp), st, out);
    PPN_CHECK_GOTO(PPN_CU(&b->drv, cuStreamCreate, &s->s, CU_STREAM_NON_BLOCKING), st, out);
    s->dev = dev;
    *out = s;
out:
    if (st != PPN_OK && s->kp) (void)cu_kp_ring_free(b, s->kp); /* no events yet: no driver call */
    if (st != PPN_OK) free(s);
    return st;
}

/* With PPN_KPROF=1, also harvests the stream's completed kernel timings. */
static ppn_status cu_stream_sync(ppn_gpu *g, ppn_gstream *s)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "stream_sync");
    PPN_CHECK(cu_set_current(b, s->ctx));
    ppn_status st = PPN_CU(&b->drv, cuStreamSynchronize, s->s);
    if (st != PPN_OK) return ppn_err_ctx(st, "stream on device %d", s->dev);
    if (s->kp) PPN_CHECK(cu_kp_collect(b, s->kp));
    return PPN_OK;
}

static ppn_status cu_capture_end(ppn_gpu *g, ppn_gstream *s, ppn_ggraph **out);

/* Drains the stream first, so an asynchronous fault of its last work is reported here, not lost. The
 * stream is destroyed and freed whatever the drain says. */
static ppn_status cu_stream_destroy(ppn_gpu *g, ppn_gstream *s)
{
    cu_gpu *b = cu_of(g);
    if (!s) return PPN_OK;
    if (s->capturing) (void)cu_capture_end(g, s, NULL); /* abandon it: a capturing stream cannot sync */
    ppn_status st = cu_stream_sync(g, s);
    ppn_status st3 = s->kp ? cu_kp_ring_free(b, s->kp) : PPN_OK;
    ppn_status st2 = cu_set_current(b, s->ctx);
    if (st2 == PPN_OK) st2 = PPN_CU(&b->drv, cuStreamDestroy, s->s);
    free(s);
    return st != PPN_OK ? st : st2 != PPN_OK ? st2 : st3;
}

static int cu_stream_device(ppn_gpu *g, ppn_gstream *s)
{
    (void)g;
    return s->dev;
}

static ppn_status cu_event_create(ppn_gpu *g, int dev, int timing, ppn_gevent **out)
{
    cu_gpu *b = cu_of(g);
    ppn_status st = PPN_OK;
    ppn_gevent *e = calloc(1, sizeof *e);
    if (!e) return ppn_err(PPN_ENOMEM, "cuda: event_create: out of host memory");
    PPN_CHECK_GOTO(cu_use_dev(b, dev, "event_create"), st, out);
    PPN_CHECK_GOTO(cu_ctx(b, dev, &e->ctx), st, out);
    /* Timing costs a timestamp write per record; only requested events pay it. */
    unsigned flags = timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
    PPN_CHECK_GOTO(PPN_CU(&b->drv, cuEventCreate, &e->e, flags), st, out);
    e->dev = dev;
    e->timing = timing != 0;
    *out = e;
out:
    if (st != PPN_OK) free(e);
    return st;
}

static ppn_status cu_event_destroy(ppn_gpu *g, ppn_gevent *e)
{
    cu_gpu *b = cu_of(g);
    if (!e) return PPN_OK;
    ppn_status st = cu_set_current(b, e->ctx);
    if (st == PPN_OK) st = PPN_CU(&b->drv, cuEventDestroy, e->e);
    free(e);
    return st;
}

/* The driver requires the event and the stream to share a context; say so before it does, naming both. */
static ppn_status cu_event_record(ppn_gpu *g, ppn_gevent *e, ppn_gstream *s)
{
    cu_gpu *b = cu_of(g);
    if (e->dev != s->dev)
        return ppn_err(PPN_EINVAL, "cuda: event_record: event of device %d on a stream of device %d", e->dev,
                       s->dev);
    CU_NOT_CAPTURING(s, "event_record");
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuEventRecord, e->e, s->s);
}

/* Cross-device waits are allowed: the driver synchronizes the two devices. */
static ppn_status cu_stream_wait_event(ppn_gpu *g, ppn_gstream *s, ppn_gevent *e)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "stream_wait_event");
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuStreamWaitEvent, s->s, e->e, 0);
}

static ppn_status cu_event_query(ppn_gpu *g, ppn_gevent *e, int *done)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(cu_set_current(b, e->ctx));
    CUresult r = b->drv.cuEventQuery(e->e);
    if (r == CUDA_ERROR_NOT_READY) {
        *done = 0;
        return PPN_OK;
    }
    PPN_CHECK(ppn_cuda_result(&b->drv, r, "cuEventQuery(e->e)", PPN_CU_FILE_, __LINE__));
    *done = 1;
    return PPN_OK;
}

static ppn_status cu_event_sync(ppn_gpu *g, ppn_gevent *e)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(cu_set_current(b, e->ctx));
    return PPN_CU(&b->drv, cuEventSynchronize, e->e);
}

static ppn_status cu_event_elapsed(ppn_gpu *g, ppn_gevent *start, ppn_gevent *end, float *ms)
{
    cu_gpu *b = cu_of(g);
    if (!start->timing || !end->timing)
        return ppn_err(PPN_EINVAL, "cuda: event_elapsed: the %s event was created without timing",
                       start->timing ? "end" : "start");
    PPN_CHECK(cu_set_current(b, start->ctx));
    return PPN_CU(&b->drv, cuEventElapsedTime, ms, start->e, end->e);
}

/* ---------------------------------------------------------------------------------------------------------
 * Copies */

static ppn_status cu_copy_htod(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, const void *src, size_t n)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "copy_htod");
    if (n == 0) return PPN_OK;
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuMemcpyHtoDAsync, (CUdeviceptr)dst, src, n, s->s);
}

static ppn_status cu_copy_dtoh(ppn_gpu *g, ppn_gstream *s, void *dst, ppn_dptr src, size_t n)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "copy_dtoh");
    if (n == 0) return PPN_OK;
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuMemcpyDtoHAsync, dst, (CUdeviceptr)src, n, s->s);
}

static ppn_status cu_copy_dtod(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, ppn_dptr src, size_t n)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "copy_dtod");
    if (n == 0) return PPN_OK;
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuMemcpyDtoDAsync, (CUdeviceptr)dst, (CUdeviceptr)src, n, s->s);
}

/* Direct when the two devices can reach each other; otherwise the driver stages the copy through host
 * memory, which we count so callers can see a boundary running on the slow path. */
static int cu_peer_direct(cu_gpu *b, int a, int c)
{
    return a == c || (b->can[a * b->ndev + c] && b->can[c * b->ndev + a]);
}

static ppn_status cu_copy_peer(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, int dst_dev, ppn_dptr src,
                               int src_dev, size_t n)
{
    cu_gpu *b = cu_of(g);
    CUcontext dctx = NULL, sctx = NULL;
    PPN_CHECK(cu_check_dev(b, dst_dev, "copy_peer (destination)"));
    PPN_CHECK(cu_check_dev(b, src_dev, "copy_peer (source)"));
    CU_NOT_CAPTURING(s, "copy_peer");
    if (n == 0) return PPN_OK;
    PPN_CHECK(cu_ctx(b, dst_dev, &dctx));
    PPN_CHECK(cu_ctx(b, src_dev, &sctx));
    PPN_CHECK(cu_set_current(b, s->ctx));
    ppn_status st = PPN_CU(&b->drv, cuMemcpyPeerAsync, (CUdeviceptr)dst, dctx, (CUdeviceptr)src, sctx, n, s->s);
    if (st != PPN_OK)
        return ppn_err_ctx(st, "copy_peer of %zu bytes, device %d -> %d", n, src_dev, dst_dev);
    if (!cu_peer_direct(b, src_dev, dst_dev)) __atomic_fetch_add(&g->n_host_staged, 1, __ATOMIC_RELAXED);
    return PPN_OK;
}

static ppn_status cu_memset_d8(ppn_gpu *g, ppn_gstream *s, ppn_dptr dst, unsigned char v, size_t n)
{
    cu_gpu *b = cu_of(g);
    if (n == 0) return PPN_OK;
    CU_NOT_CAPTURING(s, "memset_d8");
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuMemsetD8Async, (CUdeviceptr)dst, v, n, s->s);
}

/* ---------------------------------------------------------------------------------------------------------
 * Peer access */

static ppn_status cu_peer_can_access(ppn_gpu *g, int dev, int peer, int *can)
{
    cu_gpu *b = cu_of(g);
    PPN_CHECK(cu_check_dev(b, dev, "peer_can_access"));
    PPN_CHECK(cu_check_dev(b, peer, "peer_can_access (peer)"));
    *can = dev == peer || b->can[dev * b->ndev + peer];
    return PPN_OK;
}

/* A device always reaches its own memory: enabling itself is a no-op (the driver would call it invalid).
 * Enabling twice is fine too (the driver's ALREADY_ENABLED is not sticky). */
static ppn_status cu_peer_enable(ppn_gpu *g, int dev, int peer)
{
    cu_gpu *b = cu_of(g);
    CUcontext pctx = NULL;
    PPN_CHECK(cu_check_dev(b, peer, "peer_enable (peer)"));
    PPN_CHECK(cu_use_dev(b, dev, "peer_enable"));
    if (dev == peer) return PPN_OK;
    PPN_CHECK(cu_ctx(b, peer, &pctx));
    CUresult r = b->drv.cuCtxEnablePeerAccess(pctx, 0);
    if (r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return PPN_OK;
    ppn_status st = ppn_cuda_result(&b->drv, r, "cuCtxEnablePeerAccess(pctx, 0)", PPN_CU_FILE_, __LINE__);
    if (st != PPN_OK) return ppn_err_ctx(st, "enabling device %d to access device %d", dev, peer);
    return PPN_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Kernels */

/* Every embedded image loaded into dev's context (on the first launch there). Under d->mu. */
static ppn_status cu_modules_locked(cu_gpu *b, int dev)
{
    cu_dev *d = &b->devs[dev];
    if (!b->base.kern.n_images) return ppn_err(PPN_ENOKERNELS, "cuda: this build has no kernels (built without nvcc)");
    for (int i = 0; i < b->base.kern.n_images; i++) {
        if (d->mod[i]) continue;
        const ppn_gpu_image *im = &b->base.kern.images[i];
        ppn_status st = PPN_CU(&b->drv, cuModuleLoadData, &d->mod[i], im->data);
        if (st != PPN_OK) {
            d->mod[i] = NULL;
            return ppn_err_ctx(st, "loading the embedded kernel image %s (%zu-byte fatbin) on device %d", im->name,
                               im->size, dev);
        }
    }
    return PPN_OK;
}

/* Every kernel may take up to kern.dyn_smem_max bytes of dynamic shared memory (48 KB without the opt-in), or
 * its own kern.smem_max where that is set; a device that offers less gets what it offers, and a launch asking
 * more fails in the driver, named. */
static ppn_status cu_smem_optin(cu_gpu *b, int dev, int id, CUfunction f, const char *name)
{
    int optin = 0, stat = 0;
    PPN_CHECK(cu_attr(b, dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "the shared memory opt-in",
                      &optin));
    ppn_status gs = PPN_CU(&b->drv, cuFuncGetAttribute, &stat, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f);
    if (gs != PPN_OK) return ppn_err_ctx(gs, "reading kernel %s's static shared memory (device %d)", name, dev);
    int cap = (int)(b->base.kern.smem_max && b->base.kern.smem_max[id] ? b->base.kern.smem_max[id]
                                                                           : b->base.kern.dyn_smem_max);
    int want = optin - stat < cap ? optin - stat : cap;
    if (want <= 48 * 1024) return PPN_OK;
    ppn_status st = PPN_CU(&b->drv, cuFuncSetAttribute, f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, want);
    if (st != PPN_OK) return ppn_err_ctx(st, "opting kernel %s in to %d bytes of shared memory (device %d)", name,
                                         want, dev);
    return PPN_OK;
}

static ppn_status cu_function_locked(cu_gpu *b, int dev, int id, CUfunction *out)
{
    cu_dev *d = &b->devs[dev];
    CUfunction f = atomic_load_explicit(&d->fn[id], memory_order_relaxed);
    if (!f) {
        PPN_CHECK(cu_modules_locked(b, dev));
        const char *name = b->base.kern.k[id].name;
        CUresult r = CUDA_ERROR_NOT_FOUND; /* each kernel lives in one image: the others answer NOT_FOUND */
        for (int i = 0; i < b->base.kern.n_images && r == CUDA_ERROR_NOT_FOUND; i++)
            r = b->drv.cuModuleGetFunction(&f, d->mod[i], name);
        ppn_status st = ppn_cuda_result(&b->drv, r, "cuModuleGetFunction(&f, d->mod[i], name)", PPN_CU_FILE_,
                                        __LINE__);
        if (st != PPN_OK)
            return ppn_err_ctx(st, "looking up kernel %s in the %d embedded kernel images (device %d)", name,
                               b->base.kern.n_images, dev);
        PPN_CHECK(cu_smem_optin(b, dev, id, f, name));
        atomic_store_explicit(&d->fn[id], f, memory_order_release); /* pairs with the acquire in cu_kernel() */
    }
    *out = f;
    return PPN_OK;
}

/* The CUfunction of kernel id on dev; dev's context must be current (module loads go into it). */
static ppn_status cu_kernel(cu_gpu *b, int dev, int id, CUfunction *out)
{
    cu_dev *d = &b->devs[dev];
    CUfunction f = atomic_load_explicit(&d->fn[id], memory_order_acquire);
    if (f) {
        *out = f;
        return PPN_OK;
    }
    pthread_mutex_lock(&d->mu);
    ppn_status st = cu_function_locked(b, dev, id, out);
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* Every kernel takes one struct by value: kernelParams holds one pointer to it; the driver copies the
 * bytes at this call, so the caller's struct may die as soon as we return. s's context is current.
 * Programmatic dependent launch (sm_90+, PPN_PDL): the kernel may start while the previous kernel on s
 * drains; every kernel waits (griddepcontrol.wait) before it touches memory a predecessor wrote or reads,
 * and only immutable weights are read before that (ppn_kernels.cu), so the stream order is kept. */
static ppn_status cu_launch_on(cu_gpu *b, ppn_gstream *s, CUfunction f, const ppn_launch *l)
{
    void *args[1] = {(void *)l->params};
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg = {l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem,
                          s->s, &attr, 1};
    ppn_status st = b->devs[s->dev].pdl ? PPN_CU(&b->drv, cuLaunchKernelEx, &cfg, f, args, NULL)
                                        : PPN_CU(&b->drv, cuLaunchKernel, f, l->grid[0], l->grid[1], l->grid[2],
                                                 l->block[0], l->block[1], l->block[2], l->smem, s->s, args, NULL);
    if (st != PPN_OK)
        return ppn_err_ctx(st, "launching %s on device %d (grid %u,%u,%u block %u,%u,%u smem %u)",
                           b->base.kern.k[l->kernel].name, s->dev, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                           l->block[1], l->block[2], l->smem);
    return PPN_OK;
}

/* Under r->mu, with r's context current: create the ring's events (the stream's first profiled launch). */
static ppn_status cu_kp_events(cu_gpu *b, cu_kring *r, int dev)
{
    ppn_status st = PPN_OK;
    r->pairs = calloc(CU_KP_RING, sizeof *r->pairs);
    if (!r->pairs) return ppn_err(PPN_ENOMEM, "PPN_KPROF: out of host memory for %u event pairs", CU_KP_RING);
    for (unsigned i = 0; i < CU_KP_RING && st == PPN_OK; i++) {
        st = PPN_CU(&b->drv, cuEventCreate, &r->pairs[i].start, CU_EVENT_DEFAULT); /* timing on */
        if (st == PPN_OK) st = PPN_CU(&b->drv, cuEventCreate, &r->pairs[i].end, CU_EVENT_DEFAULT);
    }
    if (st == PPN_OK) return PPN_OK;
    ppn_err_ctx(st, "PPN_KPROF: creating %u timing event pairs on device %d", CU_KP_RING, dev);
    cu_kp_events_free(b, r, CU_KP_RING); /* unset handles are NULL (calloc) */
    return st;
}

static double cu_launch_bytes(const ppn_launch *l)
{
    double bytes = 0;
    for (int i = 0; i < l->nacc && i < PPN_LAUNCH_MAX_ACC; i++) bytes += (double)l->acc[i].bytes;
    for (int i = 0; i < l->nxacc; i++) bytes += (double)l->xacc[i].bytes;
    return bytes;
}

/* PPN_KPROF=1: the launch between the two events of the ring's next pair, published only when all three
 * were enqueued. Harvests when the ring is half full (waiting for the oldest pair only when it is full). */
static ppn_status cu_launch_timed(cu_gpu *b, ppn_gstream *s, CUfunction f, const ppn_launch *l)
{
    cu_kring *r = s->kp;
    cu_kp_sum sum;
    ppn_status st = PPN_OK;
    cu_kp_sum_init(b, &sum);
    pthread_mutex_lock(&r->mu);
    if (!r->pairs) PPN_CHECK_GOTO(cu_kp_events(b, r, s->dev), st, out);
    if (r->head - r->tail >= CU_KP_RING / 2)
        PPN_CHECK_GOTO(cu_kp_harvest(b, r, r->head - r->tail >= CU_KP_RING ? 1 : 0, &sum), st, out);
    cu_kpair *p = &r->pairs[r->head % CU_KP_RING];
    PPN_CHECK_GOTO(PPN_CU(&b->drv, cuEventRecord, p->start, s->s), st, out);
    PPN_CHECK_GOTO(cu_launch_on(b, s, f, l), st, out);
    PPN_CHECK_GOTO(PPN_CU(&b->drv, cuEventRecord, p->end, s->s), st, out);
    p->kernel = l->kernel;
    p->bytes = cu_launch_bytes(l);
    p->epoch = sum.epoch;
    r->head++;
out:
    pthread_mutex_unlock(&r->mu);
    cu_kp_add(b, &sum); /* what was harvested is real even if this launch failed */
    if (st != PPN_OK) return ppn_err_ctx(st, "PPN_KPROF: timed launch of %s", b->base.kern.k[l->kernel].name);
    return PPN_OK;
}

static ppn_status cu_launch(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l)
{
    cu_gpu *b = cu_of(g);
    CUfunction f = NULL;
    PPN_CHECK(ppn_gpu_check_launch(g, l));
    PPN_CHECK(cu_set_current(b, s->ctx));
    PPN_CHECK(cu_kernel(b, s->dev, l->kernel, &f));
    return s->kp ? cu_launch_timed(b, s, f, l) : cu_launch_on(b, s, f, l);
}

static ppn_status cu_host_fn(ppn_gpu *g, ppn_gstream *s, ppn_host_fn fn, void *arg)
{
    cu_gpu *b = cu_of(g);
    CU_NOT_CAPTURING(s, "host_fn");
    PPN_CHECK(cu_set_current(b, s->ctx));
    return PPN_CU(&b->drv, cuLaunchHostFunc, s->s, fn, arg);
}

/* The driver enforces nothing the annotations describe; only the sim checker uses them. */
static ppn_status cu_mem_annotate(ppn_gpu *g, ppn_gstream *s, int dev, ppn_dptr p, size_t n, int op,
                                  const char *tag)
{
    (void)g, (void)s, (void)dev, (void)p, (void)n, (void)op, (void)tag;
    return PPN_OK;
}

/* Host accesses are declared for the sim checker only. */
static void cu_host_access(ppn_gpu *g, const void *p, size_t n, int mode, const char *what)
{
    (void)g, (void)p, (void)n, (void)mode, (void)what;
}

static void cu_host_handoff(ppn_gpu *g, const void *key) { (void)g, (void)key; }

/* A block's address is its address: generations are the sim's alone. */
static ppn_status cu_mem_issue(ppn_gpu *g, int dev, ppn_dptr p, size_t n, ppn_dptr *out)
{
    (void)g, (void)dev, (void)n;
    *out = p;
    return PPN_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Graphs */

/* Every kernel of dev resolved before a capture: module loads are not stream work, and a first-use lookup
 * must not happen while the stream records. dev's context is current. */
static ppn_status cu_kernels_all(cu_gpu *b, int dev)
{
    CUfunction f;
    if (!b->base.kern.n_images) return ppn_err(PPN_ENOKERNELS, "cuda: this build has no kernels (built without nvcc)");
    for (int k = 0; k < b->base.kern.n; k++) PPN_CHECK(cu_kernel(b, dev, k, &f));
    return PPN_OK;
}

/* Thread-local capture mode: other threads issue to their own streams meanwhile (one issue thread per
 * stage), and only this thread's unsafe calls are refused by the driver. */
static ppn_status cu_capture_begin(ppn_gpu *g, ppn_gstream *s)
{
    cu_gpu *b = cu_of(g);
    if (b->kprof)
        return ppn_err(PPN_EUNSUPPORTED, "cuda: graph capture with PPN_KPROF=1: the profile times each launch "
                       "with its own event pair, which a graph cannot carry (profile with PPN_GRAPHS=0)");
    if (s->capturing) return ppn_err(PPN_EUNSUPPORTED, "cuda: the stream of device %d is already capturing", s->dev);
    PPN_CHECK(cu_set_current(b, s->ctx));
    PPN_CHECK(cu_kernels_all(b, s->dev));
    PPN_CHECK(PPN_CU(&b->drv, cuStreamBeginCapture, s->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    s->capturing = 1;
    return PPN_OK;
}

static ppn_status cu_capture_end(ppn_gpu *g, ppn_gstream *s, ppn_ggraph **out)
{
    cu_gpu *b = cu_of(g);
    CUgraph graph = NULL;
    if (!s->capturing) return ppn_err(PPN_ESTATE, "cuda: capture_end on a stream of device %d that is not "
                                      "capturing", s->dev);
    s->capturing = 0;
    PPN_CHECK(cu_set_current(b, s->ctx));
    ppn_status st = PPN_CU(&b->drv, cuStreamEndCapture, s->s, &graph);
    if (st != PPN_OK) return ppn_err_ctx(st, "ending the graph capture on device %d", s->dev);
    ppn_ggraph *gr = out ? calloc(1, sizeof *gr) : NULL;
    if (out && !gr) st = ppn_err(PPN_ENOMEM, "cuda: capture_end: out of host memory");
    if (gr) {
        st = PPN_CU(&b->drv, cuGraphInstantiateWithFlags, &gr->exec, graph, 0);
        if (st != PPN_OK) ppn_err_ctx(st, "instantiating a captured graph on device %d", s->dev);
    }
    /* the executable owns what it needs; the recording itself is no longer used */
    ppn_status st2 = graph ? PPN_CU(&b->drv, cuGraphDestroy, graph) : PPN_OK;
    if (st == PPN_OK) st = st2;
    if (st != PPN_OK) {
        if (gr && gr->exec) (void)PPN_CU(&b->drv, cuGraphExecDestroy, gr->exec);
        free(gr);
        return st;
    }
    if (gr) {
        gr->dev = s->dev;
        gr->ctx = s->ctx;
        *out = gr;
    }
    return PPN_OK;
}

static ppn_status cu_graph_launch(ppn_gpu *g, ppn_ggraph *gr, ppn_gstream *s)
{
    cu_gpu *b = cu_of(g);
    if (!gr || !s) return ppn_err(PPN_EINVAL, "cuda: graph_launch: %s is NULL", gr ? "stream" : "graph");
    if (gr->dev != s->dev)
        return ppn_err(PPN_EINVAL, "cuda: graph_launch: graph of device %d on a stream of device %d", gr->dev,
                       s->dev);
    CU_NOT_CAPTURING(s, "graph_launch");
    PPN_CHECK(cu_set_current(b, s->ctx));
    PPN_CHECK(PPN_CU(&b->drv, cuGraphLaunch, gr->exec, s->s));
    __atomic_fetch_add(&g->n_graph_launches, 1, __ATOMIC_RELAXED);
    return PPN_OK;
}

static ppn_status cu_graph_destroy(ppn_gpu *g, ppn_ggraph *gr)
{
    cu_gpu *b = cu_of(g);
    if (!gr) return PPN_OK;
    ppn_status st = cu_set_current(b, gr->ctx);
    if (st == PPN_OK) st = PPN_CU(&b->drv, cuGraphExecDestroy, gr->exec);
    free(gr);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * Create / destroy */

/* destroy returns nothing, so a failure to unload or release is reported on stderr and teardown goes on. */
static void cu_teardown_warn(ppn_status st)
{
    if (st != PPN_OK) fprintf(stderr, "ppn: cuda: while closing the backend: %s\n", ppn_last_error());
}

static void cu_release_dev(cu_gpu *b, int dev)
{
    cu_dev *d = &b->devs[dev];
    CUcontext c = atomic_load_explicit(&d->ctx, memory_order_acquire);
    for (int i = 0; i < PPN_GPU_MAX_IMAGES; i++) {
        if (!d->mod[i]) continue;
        ppn_status st = cu_set_current(b, c);
        if (st == PPN_OK) st = PPN_CU(&b->drv, cuModuleUnload, d->mod[i]);
        cu_teardown_warn(st);
    }
    if (c) cu_teardown_warn(PPN_CU(&b->drv, cuDevicePrimaryCtxRelease, d->dev));
    pthread_mutex_destroy(&d->mu);
}

/* Also undoes a partial create: devs[0, ndev) are initialized, the table may or may not be loaded. */
static void cu_destroy(ppn_gpu *g)
{
    cu_gpu *b = cu_of(g);
    for (int i = 0; i < b->ndev; i++) cu_release_dev(b, i);
    /* Contexts may be gone now: no thread may trust its cached current context any more. */
    atomic_fetch_add_explicit(&cu_ctx_epoch, 1, memory_order_relaxed);
    cu_tls.ctx = NULL;
    if (b->drv.lib) ppn_cuda_drv_close(&b->drv);
    free(b->can);
    free(b->devs);
    pthread_mutex_destroy(&b->kp_mu); /* rings of streams not destroyed by their owners leak with them */
    free(b);
}

static const struct ppn_gpu_ops cu_ops = {
    .name = "cuda",
    .destroy = cu_destroy,
    .device_count = cu_device_count,
    .device_info = cu_device_info,
    .mem_get_info = cu_mem_get_info,
    .mem_alloc = cu_mem_alloc,
    .mem_free = cu_mem_free,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .stream_device = cu_stream_device,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait_event,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .event_elapsed = cu_event_elapsed,
    .copy_htod = cu_copy_htod,
    .copy_dtoh = cu_copy_dtoh,
    .copy_dtod = cu_copy_dtod,
    .copy_peer = cu_copy_peer,
    .memset_d8 = cu_memset_d8,
    .peer_can_access = cu_peer_can_access,
    .peer_enable = cu_peer_enable,
    .launch = cu_launch,
    .tma_ok = cu_tma_ok,
    .tmap_encode = cu_tmap_encode,
    .sm_count = cu_sm_count,
    .host_fn = cu_host_fn,
    .mem_annotate = cu_mem_annotate,
    .mem_issue = cu_mem_issue,
    .host_access = cu_host_access,
    .host_release = cu_host_handoff,
    .host_acquire = cu_host_handoff,
    .kprof_read = cu_kprof_read,
    .kprof_reset = cu_kprof_reset,
    .capture_begin = cu_capture_begin,
    .capture_end = cu_capture_end,
    .graph_launch = cu_graph_launch,
    .graph_destroy = cu_graph_destroy,
};

static ppn_status cu_count_devices(cu_gpu *b, int *out)
{
    int n = 0;
    PPN_CHECK(PPN_CU(&b->drv, cuDeviceGetCount, &n));
    if (n <= 0) {
        /* Quoted only (the driver reads it). Unset and empty read alike here, and an empty list hides every
         * device, so the message says both. */
        const char *visible;
        PPN_CHECK(ppn_env_str("CUDA_VISIBLE_DEVICES", &visible));
        return ppn_err(PPN_ENODEV, "cuda: the driver (CUDA %d.%d) sees no device (CUDA_VISIBLE_DEVICES=%s)",
                       b->drv.driver_version / 1000, b->drv.driver_version % 1000 / 10,
                       visible ? visible : "<unset or empty>");
    }
    b->devs = calloc((size_t)n, sizeof *b->devs);
    b->can = calloc((size_t)n * (size_t)n, 1);
    if (!b->devs || !b->can) return ppn_err(PPN_ENOMEM, "cuda: out of host memory for %d devices", n);
    *out = n;
    return PPN_OK;
}

/* Device handles and the peer matrix: plain queries, no context is created here. b->ndev counts the
 * devices initialized so far, so cu_destroy undoes exactly those. */
static ppn_status cu_init_devices(cu_gpu *b, int n)
{
    for (int i = 0; i < n; i++) {
        cu_dev *d = &b->devs[i];
        PPN_CHECK(PPN_CU(&b->drv, cuDeviceGet, &d->dev, i));
        pthread_mutex_init(&d->mu, NULL);
        b->ndev = i + 1;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int can = 0;
            if (i != j) PPN_CHECK(PPN_CU(&b->drv, cuDeviceCanAccessPeer, &can, b->devs[i].dev, b->devs[j].dev));
            b->can[i * n + j] = can != 0;
        }
    return PPN_OK;
}

ppn_status ppn_gpu_cuda_create(const ppn_gpu_kernels *kern, ppn_gpu **out)
{
    ppn_status st = PPN_OK;
    cu_gpu *b = calloc(1, sizeof *b);
    if (!b) return ppn_err(PPN_ENOMEM, "cuda: out of host memory for the backend");
    b->base.ops = &cu_ops;
    PPN_CHECK_GOTO(ppn_gpu_set_kernels(&b->base, kern), st, out);
    pthread_mutex_init(&b->kp_mu, NULL);
    PPN_CHECK_GOTO(ppn_cuda_drv_open(&b->drv), st, out);
    int n = 0;
    PPN_CHECK_GOTO(cu_count_devices(b, &n), st, out);
    PPN_CHECK_GOTO(cu_init_devices(b, n), st, out);
    PPN_CHECK_GOTO(cu_kp_env(b), st, out); /* after the devices: no driver or device stays PPN_ENODEV */
    PPN_CHECK_GOTO(cu_pdl_env(b), st, out);
    PPN_CHECK_GOTO(cu_tma_env(b), st, out);
    b->base.kprof = b->kprof;
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_KX", &b->base.gemm_kx), st, out);
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_W", &b->base.gemm_w), st, out);
    PPN_CHECK_GOTO(ppn_env_int("PPN_GEMM_W_SWIGLU", &b->base.gemm_w_swiglu), st, out);
    *out = &b->base;
out:
    if (st != PPN_OK) cu_destroy(&b->base);
    return st;
}
