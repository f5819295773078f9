/* tkern.h - what the kernel tests (tests/test_kernels_*.c) share: a kernel's CPU reference by id, a closeness
 * check, and a fake device that captures each launch of the ops (kernel, params, declared accesses, geometry)
 * and runs the CPU reference on it, as the sim backend does. Include after <cmocka.h>. */
#ifndef PPN_TKERN_H
#define PPN_TKERN_H

#include <stddef.h>
#include <stdint.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"

/* A host pointer as a kernel's device address: the CPU references read host memory. */
#define D(p) ((uint64_t)(uintptr_t)(p))
#define TU_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Run kernel id's CPU reference on params. */
void tu_kernel_run(int id, const void *params);
/* Fails the test, naming what[i], unless |got - want| <= tol (NaN fails). */
void tu_check_close(double got, double want, double tol, const char *what, size_t i);

/* The fake device: tu_fake's launch copies the launch and its params into tu_cap, counts it, and (unless dry)
 * runs the kernel's CPU reference. */
typedef struct tu_capture {
    ppn_launch l; /* the last launch; l.params points at params, l.xacc at xacc (a copy) */
    _Alignas(64) unsigned char params[512]; /* 64-byte aligned: gemm_tc_h's tensor maps */
    ppn_access *xacc; /* the further accesses (l.nxacc of them) */
    int calls;
    int dry; /* capture only: the pointers are not real buffers (geometry checks of model-sized shapes) */
} tu_capture;
extern tu_capture tu_cap;
extern ppn_gpu tu_fake;
extern ppn_gstream *const tu_fake_stream;

/* tu_fake that runs TMA kernels (gpu.h: tma_ok) on sms multiprocessors (sm_count) and encodes tensor maps the
 * sim's way (ppn_tmap_sim_encode, after ppn_tmap_check), so the CPU references read through them; each map's base
 * moved by tu_tma_shift bytes (0: an honest encoder; a test of the maps sets it). Its launches land in tu_cap like
 * tu_fake's. Returns the device; its stream is the device itself, as tu_fake's is. */
extern int tu_tma_shift;
ppn_gpu *tu_fake_tma(int sms);
/* What tu_fake_tma's tma_ok says: 1 (the default, PPN_TMA's), or 2 (PPN_TMA=2: the middle tile's TMA kernels too). */
extern int tu_tma_level;

/* The captured launch's access i is exactly (p, bytes, mode): i < l.nacc indexes the fixed list, then xacc. */
void tu_expect_acc(int i, const void *p, size_t bytes, int mode);
/* 1 when [p, p + bytes) is covered by one declared access with this mode bit. */
int tu_declared(const void *p, size_t bytes, int mode);
/* The captured launch's access i of all l.nacc + l.nxacc. */
const ppn_access *tu_acc(int i);

/* The KV ops on an identity view of caches kc, vc [n_kv, ctx, head_dim] of kvdt: the signatures before paging,
 * for the tests written against them. */
ppn_status tu_op_rope_kv(ppn_gpu *g, ppn_gstream *s, ppn_dptr qk, int n_q, int n_kv, int head_dim, ppn_dptr inv_freq,
                         int interleaved, ppn_dptr hdr, ppn_dptr kc, ppn_dptr vc, ppn_dptr v, int ctx, int kvdt);
ppn_status tu_op_attn(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr q, ppn_dptr kc, ppn_dptr vc, int n_heads,
                      int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part, int n_split, int kvdt);
ppn_status tu_op_attn_rope(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                           int n_heads, int n_kv, int head_dim, int ctx, float scale, ppn_dptr hdr, ppn_dptr part,
                           int n_split, ppn_dptr inv_freq, int interleaved, int kvdt);
ppn_status tu_op_rope_kv_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr qkv, int n_q, int n_kv, int head_dim,
                              ppn_dptr inv_freq, int interleaved, ppn_dptr kc, ppn_dptr vc, int ctx, int kvdt, int pos0,
                              int c);
ppn_status tu_op_attn_rows(ppn_gpu *g, ppn_gstream *s, ppn_dptr out, ppn_dptr qkv, ppn_dptr kc, ppn_dptr vc,
                           int n_heads, int n_kv, int head_dim, int ctx, int kvdt, float scale, int pos0, int c);

/* A 1-D geometry within the kernels' contract (whole warps, at most 1024 threads) with at least min_threads. */
void tu_expect_geometry(unsigned min_threads);

#endif
