/* test_gpu_stream.c - the cuda backend on a real GPU: stream order, events across streams, timing, peer
 * copies, host functions, pinned memory, error mapping, a kernel launch.
 *
 * Runs only where a CUDA driver and GPU exist (./build.sh gputest). Without them it FAILS: a GPU test that
 * passes on a machine without a GPU would prove nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/device/gpu.h"
#include "tests/util/tcheck.h"
#include "kernels/ktable.h"
#include "tests/util/tdev.h"

#ifndef PPN_HAVE_FATBIN
#define PPN_HAVE_FATBIN 0
#endif

static ppn_gpu *G;


static unsigned char *pinned(size_t n)
{
    void *p = NULL;
    EXPECT_OK(G->ops->host_alloc(G, n, &p));
    assert_non_null(p);
    return p;
}


static void test_gpu_stream_open_cuda(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    if (PPN_HAVE_FATBIN) {
        EXPECT_OK(ppn_gpu_open("cuda", ppn_kernel_set(), &g));
        assert_string_equal(g->ops->name, "cuda");
        assert_true(g->ops->device_count(g) >= 1);
        ppn_gpu_close(g);
    } else {
        EXPECT_ST(PPN_ENOKERNELS, ppn_gpu_open("cuda", ppn_kernel_set(), &g));
        MSG_HAS("no kernels");
    }
}

static void test_gpu_stream_device_info(void **state)
{
    (void)state;
    int n = G->ops->device_count(G);
    assert_true(n >= 1);
    for (int d = 0; d < n; d++) {
        ppn_device_info info;
        size_t free_b = 0, total_b = 0;
        EXPECT_OK(G->ops->device_info(G, d, &info));
        printf("    device %d: %s, %s, cc %d.%d, %d SMs, %zu MiB\n", d, info.name, info.pci_bus_id, info.cc_major,
               info.cc_minor, info.sm_count, info.mem_total >> 20);
        assert_true(info.name[0] != '\0');
        assert_non_null(strchr(info.pci_bus_id, ':'));
        assert_int_equal(info.sim, 0);
        assert_true(info.cc_major >= 7);
        assert_true(info.sm_count > 0);
        assert_true(info.mem_total >= ((size_t)1 << 30));
        EXPECT_OK(G->ops->mem_get_info(G, d, &free_b, &total_b));
        assert_true(total_b > 0 && free_b > 0 && free_b <= total_b);
    }
    ppn_device_info info;
    EXPECT_ST(PPN_EINVAL, G->ops->device_info(G, n, &info));
    MSG_HAS("out of range");
}

/* memset, then an upload over part of it, then a memset over part of the upload, then a device copy and a
 * readback: only in-order execution gives the bytes the host model below predicts. */
static void test_gpu_stream_stream_order(void **state)
{
    (void)state;
    const size_t n = 4u << 20, up_off = 4096, up_n = 64u << 10, ms_off = 8192, ms_n = 100;
    unsigned char *h_in = pinned(up_n), *h_out = pinned(n), *want = malloc(n);
    assert_non_null(want);
    for (size_t i = 0; i < up_n; i++) h_in[i] = (unsigned char)(i * 31 + 7);
    memset(h_out, 0, n);
    memset(want, 0xAB, n);
    memcpy(want + up_off, h_in, up_n);
    memset(want + ms_off, 0x11, ms_n);

    ppn_dptr a = tu_dalloc(G, 0, n), b = tu_dalloc(G, 0, n);
    ppn_gstream *s = tu_stream(G, 0);
    EXPECT_OK(G->ops->memset_d8(G, s, a, 0xAB, n));
    EXPECT_OK(G->ops->copy_htod(G, s, a + up_off, h_in, up_n));
    EXPECT_OK(G->ops->memset_d8(G, s, a + ms_off, 0x11, ms_n));
    EXPECT_OK(G->ops->copy_dtod(G, s, b, a, n));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h_out, b, n));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_memory_equal(h_out, want, n);

    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, a));
    EXPECT_OK(G->ops->mem_free(G, 0, b));
    EXPECT_OK(G->ops->host_free(G, h_in, up_n));
    EXPECT_OK(G->ops->host_free(G, h_out, n));
    free(want);
}

/* The producer's last write is a large memset; the consumer reads the buffer's tail (written last) after
 * waiting on the producer's event. Without the wait the read would race the memsets. */
static void test_gpu_stream_event_cross_stream(void **state)
{
    (void)state;
    const size_t n = 256u << 20, win = 1u << 20;
    ppn_dptr d = tu_dalloc(G, 0, n);
    unsigned char *h = pinned(2 * win);
    ppn_gstream *prod = tu_stream(G, 0), *cons = tu_stream(G, 0);
    ppn_gevent *ev = NULL;
    EXPECT_OK(G->ops->event_create(G, 0, 0, &ev));

    EXPECT_OK(G->ops->memset_d8(G, prod, d, 0x00, n));
    EXPECT_OK(G->ops->stream_sync(G, prod));
    memset(h, 0xEE, 2 * win);
    for (int rep = 0; rep < 4; rep++) EXPECT_OK(G->ops->memset_d8(G, prod, d, (unsigned char)(0x10 + rep), n));
    EXPECT_OK(G->ops->memset_d8(G, prod, d, 0x5A, n));
    EXPECT_OK(G->ops->event_record(G, ev, prod));
    EXPECT_OK(G->ops->stream_wait_event(G, cons, ev));
    EXPECT_OK(G->ops->copy_dtoh(G, cons, h, d + n - win, win));
    EXPECT_OK(G->ops->copy_dtoh(G, cons, h + win, d, win));
    EXPECT_OK(G->ops->stream_sync(G, cons));
    for (size_t i = 0; i < 2 * win; i++)
        if (h[i] != 0x5A) fail_msg("byte %zu read 0x%02x, want 0x5A: the wait did not order the read", i, h[i]);

    int done = 0;
    EXPECT_OK(G->ops->event_query(G, ev, &done)); /* cons finished after waiting on ev, so ev has completed */
    assert_int_equal(done, 1);
    EXPECT_OK(G->ops->event_sync(G, ev));

    EXPECT_OK(G->ops->event_destroy(G, ev));
    EXPECT_OK(G->ops->stream_destroy(G, prod));
    EXPECT_OK(G->ops->stream_destroy(G, cons));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
    EXPECT_OK(G->ops->host_free(G, h, 2 * win));
}

static void test_gpu_stream_event_timing(void **state)
{
    (void)state;
    const size_t n = 1u << 30;
    ppn_dptr d = tu_dalloc(G, 0, n);
    ppn_gstream *s = tu_stream(G, 0);
    ppn_gevent *t0 = NULL, *t1 = NULL, *plain = NULL;
    EXPECT_OK(G->ops->event_create(G, 0, 1, &t0));
    EXPECT_OK(G->ops->event_create(G, 0, 1, &t1));
    EXPECT_OK(G->ops->event_create(G, 0, 0, &plain));
    EXPECT_OK(G->ops->event_record(G, t0, s));
    for (int i = 0; i < 4; i++) EXPECT_OK(G->ops->memset_d8(G, s, d, (unsigned char)i, n));
    EXPECT_OK(G->ops->event_record(G, t1, s));
    EXPECT_OK(G->ops->event_record(G, plain, s));
    EXPECT_OK(G->ops->event_sync(G, t1));
    float ms = -1.0f;
    EXPECT_OK(G->ops->event_elapsed(G, t0, t1, &ms));
    printf("    4 x 1 GiB memset: %.3f ms\n", ms);
    assert_true(ms > 0.0f && ms < 10000.0f);
    EXPECT_ST(PPN_EINVAL, G->ops->event_elapsed(G, t0, plain, &ms));
    MSG_HAS("without timing");

    EXPECT_OK(G->ops->event_destroy(G, t0));
    EXPECT_OK(G->ops->event_destroy(G, t1));
    EXPECT_OK(G->ops->event_destroy(G, plain));
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
}

/* Two devices: a copy from 0 to 1 on a stream of device 1, counted as host-staged exactly when the two
 * cannot reach each other. One device: the same call on 0 -> 0, never staged. */
static void test_gpu_stream_peer_copy(void **state)
{
    (void)state;
    const size_t n = 8u << 20;
    int ndev = G->ops->device_count(G);
    int src_dev = 0, dst_dev = ndev >= 2 ? 1 : 0;
    if (ndev < 2) printf("    only one GPU exists: testing copy_peer device 0 -> device 0\n");
    unsigned char *h_in = pinned(n), *h_out = pinned(n);
    for (size_t i = 0; i < n; i++) h_in[i] = (unsigned char)((i >> 8) ^ (i * 13));
    memset(h_out, 0, n);
    ppn_dptr src = tu_dalloc(G, src_dev, n), dst = tu_dalloc(G, dst_dev, n);
    ppn_gstream *s_src = tu_stream(G, src_dev), *s_dst = tu_stream(G, dst_dev);
    EXPECT_OK(G->ops->copy_htod(G, s_src, src, h_in, n));
    EXPECT_OK(G->ops->stream_sync(G, s_src));

    int can01 = 0, can10 = 0;
    EXPECT_OK(G->ops->peer_can_access(G, dst_dev, src_dev, &can10));
    EXPECT_OK(G->ops->peer_can_access(G, src_dev, dst_dev, &can01));
    if (dst_dev == src_dev) assert_true(can01 && can10);
    printf("    peer access %d->%d: %d, %d->%d: %d\n", dst_dev, src_dev, can10, src_dev, dst_dev, can01);
    if (can10) {
        EXPECT_OK(G->ops->peer_enable(G, dst_dev, src_dev));
        EXPECT_OK(G->ops->peer_enable(G, dst_dev, src_dev)); /* twice: already enabled is fine */
    }
    uint64_t staged0 = G->n_host_staged;
    EXPECT_OK(G->ops->copy_peer(G, s_dst, dst, dst_dev, src, src_dev, n));
    EXPECT_OK(G->ops->copy_dtoh(G, s_dst, h_out, dst, n));
    EXPECT_OK(G->ops->stream_sync(G, s_dst));
    assert_memory_equal(h_out, h_in, n);
    assert_int_equal(G->n_host_staged - staged0, (can01 && can10) ? 0 : 1);

    EXPECT_OK(G->ops->stream_destroy(G, s_src));
    EXPECT_OK(G->ops->stream_destroy(G, s_dst));
    EXPECT_OK(G->ops->mem_free(G, src_dev, src));
    EXPECT_OK(G->ops->mem_free(G, dst_dev, dst));
    EXPECT_OK(G->ops->host_free(G, h_in, n));
    EXPECT_OK(G->ops->host_free(G, h_out, n));
}

struct fn_log {
    int order[4];
    int n;
    const unsigned char *h1, *h2;
    unsigned char seen1, seen2;
};

static void fn_first(void *arg)
{
    struct fn_log *l = arg;
    l->order[l->n++] = 1;
    l->seen1 = l->h1[4095];
}

static void fn_second(void *arg)
{
    struct fn_log *l = arg;
    l->order[l->n++] = 2;
    l->seen2 = l->h2[0];
}

/* Each host function must run after the readback before it and before the work after it. */
static void test_gpu_stream_host_fn(void **state)
{
    (void)state;
    unsigned char *h = pinned(8192);
    memset(h, 0, 8192);
    struct fn_log log = {.h1 = h, .h2 = h + 4096};
    ppn_dptr d = tu_dalloc(G, 0, 4096);
    ppn_gstream *s = tu_stream(G, 0);
    EXPECT_OK(G->ops->memset_d8(G, s, d, 0x77, 4096));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, d, 4096));
    EXPECT_OK(G->ops->host_fn(G, s, fn_first, &log));
    EXPECT_OK(G->ops->memset_d8(G, s, d, 0x33, 4096));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h + 4096, d, 4096));
    EXPECT_OK(G->ops->host_fn(G, s, fn_second, &log));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_int_equal(log.n, 2);
    assert_int_equal(log.order[0], 1);
    assert_int_equal(log.order[1], 2);
    assert_int_equal(log.seen1, 0x77);
    assert_int_equal(log.seen2, 0x33);
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
    EXPECT_OK(G->ops->host_free(G, h, 8192));
}

static void test_gpu_stream_pinned(void **state)
{
    (void)state;
    const size_t n = 8u << 20;
    unsigned char *a = pinned(n), *b = pinned(n);
    for (size_t i = 0; i < n; i++) a[i] = (unsigned char)(i * 7 + (i >> 12));
    memset(b, 0, n);
    ppn_dptr d = tu_dalloc(G, 0, n);
    ppn_gstream *s = tu_stream(G, 0);
    EXPECT_OK(G->ops->copy_htod(G, s, d, a, n));
    EXPECT_OK(G->ops->copy_dtoh(G, s, b, d, n));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_memory_equal(a, b, n);
    void *p = NULL;
    EXPECT_ST(PPN_EINVAL, G->ops->host_alloc(G, 0, &p));
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
    EXPECT_OK(G->ops->host_free(G, a, n));
    EXPECT_OK(G->ops->host_free(G, b, n));
}

/* An absurd allocation maps to PPN_ENOMEM naming the driver call, counts nothing, and leaves the backend
 * working. */
static void test_gpu_stream_error_mapping(void **state)
{
    (void)state;
    uint64_t allocs0 = G->n_mem_alloc;
    ppn_dptr p = 0;
    EXPECT_ST(PPN_ENOMEM, G->ops->mem_alloc(G, 0, (size_t)1 << 60, &p));
    MSG_HAS("cuMemAlloc");
    MSG_HAS("CUDA_ERROR_OUT_OF_MEMORY");
    printf("    message: %s\n", ppn_last_error());
    assert_int_equal(G->n_mem_alloc, allocs0);
    EXPECT_ST(PPN_EINVAL, G->ops->mem_alloc(G, G->ops->device_count(G), 4096, &p));
    MSG_HAS("out of range");

    ppn_dptr d = tu_dalloc(G, 0, 1u << 20);
    assert_int_equal(G->n_mem_alloc, allocs0 + 1);
    unsigned char *h = pinned(1u << 20);
    ppn_gstream *s = tu_stream(G, 0);
    EXPECT_OK(G->ops->memset_d8(G, s, d, 0xC3, 1u << 20));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, d, 1u << 20));
    EXPECT_OK(G->ops->stream_sync(G, s));
    for (size_t i = 0; i < (1u << 20); i++)
        if (h[i] != 0xC3) fail_msg("byte %zu = 0x%02x after the failed allocation", i, h[i]);
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
    EXPECT_OK(G->ops->host_free(G, h, 1u << 20));
}

/* PPN_K_FILL writes exactly n words; run it on every device (each loads the fatbin itself). Two launches
 * in a row: the second value must win. */
static void fill_on(int dev)
{
    const int n = 1000003, guard = 64;
    const size_t bytes = (size_t)(n + guard) * 4;
    ppn_dptr d = tu_dalloc(G, dev, bytes);
    uint32_t *h = (uint32_t *)pinned(bytes);
    ppn_gstream *s = tu_stream(G, dev);
    ppn_launch l;
    ppn_kp_fill p;
    EXPECT_OK(G->ops->memset_d8(G, s, d, 0, bytes));
    l = tu_launch_fill(&p, d, 0x12345678u, n);
    EXPECT_OK(G->ops->launch(G, s, &l));
    l = tu_launch_fill(&p, d, 0xDEADBEEFu, n);
    EXPECT_OK(G->ops->launch(G, s, &l));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, d, bytes));
    EXPECT_OK(G->ops->stream_sync(G, s));
    for (int i = 0; i < n; i++)
        if (h[i] != 0xDEADBEEFu) fail_msg("device %d: word %d = 0x%08x, want 0xdeadbeef", dev, i, h[i]);
    for (int i = n; i < n + guard; i++)
        if (h[i] != 0) fail_msg("device %d: word %d past the end = 0x%08x, want 0", dev, i, h[i]);

    l = tu_launch_fill(&p, d, 1, n);
    l.params_size = sizeof p - 1;
    EXPECT_ST(PPN_EINVAL, G->ops->launch(G, s, &l));
    MSG_HAS("ppn_k_fill");
    l.params_size = sizeof p;
    l.kernel = PPN_K_COUNT;
    EXPECT_ST(PPN_EINVAL, G->ops->launch(G, s, &l));
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, dev, d));
    EXPECT_OK(G->ops->host_free(G, h, bytes));
}

static void test_gpu_stream_launch_fill(void **state)
{
    (void)state;
    if (!PPN_HAVE_FATBIN) {
        ppn_gstream *s = tu_stream(G, 0);
        ppn_launch l;
        ppn_kp_fill p;
        l = tu_launch_fill(&p, 0, 0, 1);
        EXPECT_ST(PPN_ENOKERNELS, G->ops->launch(G, s, &l));
        EXPECT_OK(G->ops->stream_destroy(G, s));
        fail_msg("this build has no kernels (no nvcc at configure time): the GPU tests need them");
    }
    for (int dev = 0; dev < G->ops->device_count(G); dev++) fill_on(dev);
}


/* The driver's stream capture: launches recorded, not run; each replay runs them again in order; other ops
 * refused while capturing; an abandoned capture leaves an ordinary stream; a graph is bound to its device. */
static void test_gpu_stream_graph_capture(void **state)
{
    (void)state;
    const int n = 4096;
    const size_t bytes = (size_t)n * 4;
    ppn_dptr a = tu_dalloc(G, 0, bytes), c = tu_dalloc(G, 0, bytes);
    float *h = (float *)pinned(bytes);
    ppn_gstream *s = tu_stream(G, 0);
    ppn_launch l;
    ppn_kp_fill pf;
    ppn_kp_add pa;
    union { float f; uint32_t u; } one = {.f = 1.5f};
    l = tu_launch_fill(&pf, a, one.u, n);
    EXPECT_OK(G->ops->launch(G, s, &l));
    EXPECT_OK(G->ops->memset_d8(G, s, c, 0, bytes));
    EXPECT_OK(G->ops->stream_sync(G, s));
    EXPECT_OK(G->ops->capture_begin(G, s));
    l = tu_launch_add(&pa, c, c, a, n); /* c += a, twice */
    EXPECT_OK(G->ops->launch(G, s, &l));
    EXPECT_OK(G->ops->launch(G, s, &l));
    EXPECT_ST(PPN_ESTATE, G->ops->copy_dtoh(G, s, h, c, bytes));
    MSG_HAS("capturing a graph");
    EXPECT_ST(PPN_ESTATE, G->ops->stream_sync(G, s));
    ppn_ggraph *gr = NULL;
    EXPECT_OK(G->ops->capture_end(G, s, &gr));
    assert_non_null(gr);
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, c, bytes));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_true(h[0] == 0.0f && h[n - 1] == 0.0f); /* nothing ran at capture */
    for (int k = 1; k <= 3; k++) {
        EXPECT_OK(G->ops->graph_launch(G, gr, s));
        EXPECT_OK(G->ops->copy_dtoh(G, s, h, c, bytes));
        EXPECT_OK(G->ops->stream_sync(G, s));
        for (int i = 0; i < n; i++)
            if (h[i] != 3.0f * (float)k) fail_msg("replay %d: c[%d] = %g, want %g", k, i, h[i], 3.0 * k);
    }
    EXPECT_OK(G->ops->capture_begin(G, s)); /* abandoned */
    l = tu_launch_fill(&pf, c, 0, n);
    EXPECT_OK(G->ops->launch(G, s, &l));
    EXPECT_OK(G->ops->capture_end(G, s, NULL));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, c, bytes));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_true(h[0] == 9.0f);
    if (G->ops->device_count(G) > 1) {
        ppn_gstream *t = tu_stream(G, 1);
        EXPECT_ST(PPN_EINVAL, G->ops->graph_launch(G, gr, t));
        EXPECT_OK(G->ops->stream_destroy(G, t));
    }
    EXPECT_OK(G->ops->graph_destroy(G, gr));
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, a));
    EXPECT_OK(G->ops->mem_free(G, 0, c));
    EXPECT_OK(G->ops->host_free(G, h, bytes));
}

/* A thread that never touched CUDA must get the right context made current for it. */
struct thr_res {
    ppn_status st;
    char msg[256];
    unsigned char byte;
};

static void *thr_body(void *arg)
{
    struct thr_res *r = arg;
    ppn_gstream *s = NULL;
    ppn_dptr d = 0;
    unsigned char h[64];
    r->st = G->ops->stream_create(G, 0, &s);
    if (r->st == PPN_OK) r->st = G->ops->mem_alloc(G, 0, 64, &d);
    if (r->st == PPN_OK) r->st = G->ops->memset_d8(G, s, d, 0x42, 64);
    if (r->st == PPN_OK) r->st = G->ops->copy_dtoh(G, s, h, d, 64);
    if (r->st == PPN_OK) r->st = G->ops->stream_sync(G, s);
    if (r->st == PPN_OK) r->byte = h[63];
    if (r->st != PPN_OK) snprintf(r->msg, sizeof r->msg, "%s", ppn_last_error());
    if (d) G->ops->mem_free(G, 0, d);
    if (s) G->ops->stream_destroy(G, s);
    return NULL;
}

static void test_gpu_stream_other_thread(void **state)
{
    (void)state;
    struct thr_res r = {0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, thr_body, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (r.st != PPN_OK) fail_msg("worker thread: %s: %s", ppn_status_name(r.st), r.msg);
    assert_int_equal(r.byte, 0x42);
}

/* A second backend shares the primary contexts; closing it must leave the first one working. */
static void test_gpu_stream_second_instance(void **state)
{
    (void)state;
    ppn_gpu *g2 = NULL;
    EXPECT_OK(ppn_gpu_cuda_create(ppn_kernel_set(), &g2));
    ppn_gstream *s2 = NULL;
    ppn_dptr d2 = 0;
    EXPECT_OK(g2->ops->stream_create(g2, 0, &s2));
    EXPECT_OK(g2->ops->mem_alloc(g2, 0, 4096, &d2));
    EXPECT_OK(g2->ops->memset_d8(g2, s2, d2, 1, 4096));
    EXPECT_OK(g2->ops->stream_sync(g2, s2));
    EXPECT_OK(g2->ops->mem_free(g2, 0, d2));
    EXPECT_OK(g2->ops->stream_destroy(g2, s2));
    ppn_gpu_close(g2);

    unsigned char *h = pinned(4096);
    ppn_dptr d = tu_dalloc(G, 0, 4096);
    ppn_gstream *s = tu_stream(G, 0);
    EXPECT_OK(G->ops->memset_d8(G, s, d, 0x99, 4096));
    EXPECT_OK(G->ops->copy_dtoh(G, s, h, d, 4096));
    EXPECT_OK(G->ops->stream_sync(G, s));
    assert_int_equal(h[0], 0x99);
    assert_int_equal(h[4095], 0x99);
    EXPECT_OK(G->ops->stream_destroy(G, s));
    EXPECT_OK(G->ops->mem_free(G, 0, d));
    EXPECT_OK(G->ops->host_free(G, h, 4096));
}

int main(void)
{
    ppn_status st = ppn_gpu_cuda_create(ppn_kernel_set(), &G);
    if (st != PPN_OK) {
        fprintf(stderr, "FAIL: the GPU tests need a CUDA driver and device: %s: %s\n", ppn_status_name(st),
                ppn_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_stream_open_cuda),
        cmocka_unit_test(test_gpu_stream_device_info),
        cmocka_unit_test(test_gpu_stream_stream_order),
        cmocka_unit_test(test_gpu_stream_event_cross_stream),
        cmocka_unit_test(test_gpu_stream_event_timing),
        cmocka_unit_test(test_gpu_stream_peer_copy),
        cmocka_unit_test(test_gpu_stream_host_fn),
        cmocka_unit_test(test_gpu_stream_pinned),
        cmocka_unit_test(test_gpu_stream_error_mapping),
        cmocka_unit_test(test_gpu_stream_launch_fill),
        cmocka_unit_test(test_gpu_stream_other_thread),
        cmocka_unit_test(test_gpu_stream_second_instance),
        cmocka_unit_test(test_gpu_stream_graph_capture),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    ppn_gpu_close(G);
    return failed;
}
