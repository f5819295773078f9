/* test_sim.c - the sim backend: stream order, events across streams and devices, peer copies, and every
 * hazard its checker must report (race, placement, use after free, double free, bounds), fault injection,
 * environment validation, the latency model.
 *
 * Races are made deterministic by holding a stream on a host function that waits for a gate: the conflicting
 * op runs on the other stream first, then the gate opens. The checker decides by vector clocks, so the
 * report must come regardless of the real order. Expected values are computed here from the kernels'
 * documented semantics (fill: n u32 words of value; add: out[i] = a[i] + b[i] over floats). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tdev.h"
#include "tests/util/trand.h"
#include "tests/util/tutil.h"

#define OPS(g) ((g)->ops)

/* ---- helpers ------------------------------------------------------------------------------------------ */

static ppn_gpu *open_sim_env(const char *var, const char *val)
{
    ppn_gpu *g = NULL;
    if (var) tu_env_set(var, val);
    ppn_status st = ppn_gpu_sim_create(ppn_kernel_set(), &g);
    tu_env_restore();
    assert_int_equal(st, PPN_OK);
    assert_non_null(g);
    assert_string_equal(OPS(g)->name, "sim");
    return g;
}

static ppn_gpu *open_sim(void) { return open_sim_env(NULL, NULL); }

static struct ppn_sim_counts counts(ppn_gpu *g)
{
    struct ppn_sim_counts c;
    ppn_gpu_sim_counts(g, &c);
    return c;
}

static void assert_no_reports(ppn_gpu *g)
{
    char msg[1024] = "";
    ppn_status st = ppn_gpu_sim_take_error(g, msg, sizeof msg);
    if (st != PPN_OK) fail_msg("unexpected report: %s", msg);
    struct ppn_sim_counts c = counts(g);
    assert_int_equal(c.race + c.placement + c.use_after_free + c.double_free + c.bounds, 0);
}

static void assert_has(const char *msg, const char *what)
{
    if (!strstr(msg, what)) fail_msg("'%s' not found in: %s", what, msg);
}

/* A host function that blocks its stream until the test opens the gate. */
typedef struct gate {
    pthread_mutex_t m;
    pthread_cond_t c;
    int open;
} gate;

static void gate_init(gate *gt)
{
    pthread_mutex_init(&gt->m, NULL);
    pthread_cond_init(&gt->c, NULL);
    gt->open = 0;
}

static void gate_wait(void *arg)
{
    gate *gt = arg;
    pthread_mutex_lock(&gt->m);
    while (!gt->open) pthread_cond_wait(&gt->c, &gt->m);
    pthread_mutex_unlock(&gt->m);
}

static void gate_open(gate *gt)
{
    pthread_mutex_lock(&gt->m);
    gt->open = 1;
    pthread_cond_broadcast(&gt->c);
    pthread_mutex_unlock(&gt->m);
}

static void gate_fini(gate *gt)
{
    pthread_cond_destroy(&gt->c);
    pthread_mutex_destroy(&gt->m);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll e for up to ms; returns whether it completed. */
static int poll_done(ppn_gpu *g, ppn_gevent *e, int ms)
{
    int done = 0;
    for (int i = 0; i <= ms; i++) {
        assert_int_equal(OPS(g)->event_query(g, e, &done), PPN_OK);
        if (done) return 1;
        sleep_ms(1);
    }
    return 0;
}

static void sleep_20ms(void *arg)
{
    (void)arg;
    sleep_ms(20);
}

/* ---- ordering and data ------------------------------------------------------------------------------- */

static void test_sim_stream_order(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    const int n = 64;
    ppn_dptr a = tu_dalloc(g, 0, n * 4), b = tu_dalloc(g, 0, n * 4), c = tu_dalloc(g, 0, n * 4), d = tu_dalloc(g, 0, n * 4);
    assert_int_equal(tu_fill(g, s, a, tu_f32_bits(1.5f), n), PPN_OK);
    assert_int_equal(tu_fill(g, s, b, tu_f32_bits(2.25f), n), PPN_OK);
    assert_int_equal(tu_add(g, s, c, a, b, n), PPN_OK);     /* c = 3.75: must see both fills */
    assert_int_equal(tu_fill(g, s, a, tu_f32_bits(10.0f), n), PPN_OK); /* after the add read a */
    assert_int_equal(tu_add(g, s, d, c, a, n), PPN_OK);     /* d = 13.75 */
    float hc[64], hd[64];
    assert_int_equal(OPS(g)->copy_dtoh(g, s, hc, c, sizeof hc), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, s, hd, d, sizeof hd), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    for (int i = 0; i < n; i++) {
        assert_true(hc[i] == 3.75f);
        assert_true(hd[i] == 13.75f);
    }
    /* memset and dtod keep the order too */
    unsigned char hb[256];
    assert_int_equal(OPS(g)->memset_d8(g, s, a, 0x5a, 256), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtod(g, s, b, a, 256), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, s, hb, b, 256), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    for (int i = 0; i < 256; i++) assert_int_equal(hb[i], 0x5a);
    assert_no_reports(g);
    assert_int_equal(g->n_mem_alloc, 4);
    assert_int_equal(OPS(g)->stream_destroy(g, s), PPN_OK);
    ppn_gpu_close(g);
}

static void test_sim_device_info_and_capacity(void **state)
{
    (void)state;
    tu_env_set("PPN_SIM_DEVICES", "3");
    ppn_gpu *g = open_sim_env("PPN_SIM_MEM", "1M"); /* restores both */
    assert_int_equal(OPS(g)->device_count(g), 3);
    ppn_device_info di;
    assert_int_equal(OPS(g)->device_info(g, 2, &di), PPN_OK);
    assert_string_equal(di.name, "ppn-sim device 2");
    assert_int_equal(di.sim, 1);
    assert_int_equal(di.mem_total, 1 << 20);
    assert_string_equal(di.pci_bus_id, "0000:03:00.0"); /* device d at bus d + 1: a place in PPN_TOPO_XML */
    assert_int_equal(OPS(g)->device_info(g, 3, &di), PPN_EINVAL);
    ppn_dptr p = tu_dalloc(g, 1, 600 << 10), q = 0;
    size_t fr, tot;
    assert_int_equal(OPS(g)->mem_get_info(g, 1, &fr, &tot), PPN_OK);
    assert_int_equal(tot, 1 << 20);
    assert_int_equal(fr, (1 << 20) - (600 << 10));
    assert_int_equal(OPS(g)->mem_alloc(g, 1, 600 << 10, &q), PPN_ENOMEM);
    assert_has(ppn_last_error(), "device 1");
    assert_has(ppn_last_error(), "614400");
    ppn_dptr r = tu_dalloc(g, 0, 600 << 10); /* capacity is per device */
    assert_int_equal(OPS(g)->mem_free(g, 1, p), PPN_OK);
    q = tu_dalloc(g, 1, 600 << 10); /* freed capacity is usable again */
    assert_int_equal(OPS(g)->mem_free(g, 1, q), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, r), PPN_OK);
    void *h = NULL;
    assert_int_equal(OPS(g)->host_alloc(g, 8192, &h), PPN_OK);
    memset(h, 1, 8192);
    assert_int_equal(OPS(g)->host_free(g, h, 8192), PPN_OK);
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* B waits for A's event (A held at a gate): B must not run before the gate opens, and sees A's data. */
static void test_sim_event_orders_streams(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0), *done_b = tu_event(g, 0, 0);
    const int n = 32;
    ppn_dptr x = tu_dalloc(g, 0, n * 4), y = tu_dalloc(g, 0, n * 4);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &gt), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, tu_f32_bits(3.0f), n), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
    assert_int_equal(tu_add(g, b, y, x, x, n), PPN_OK);
    float hy[32];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, hy, y, sizeof hy), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, done_b, b), PPN_OK);
    assert_false(poll_done(g, done_b, 30)); /* held behind A's gate */
    gate_open(&gt);
    assert_int_equal(OPS(g)->event_sync(g, done_b), PPN_OK);
    for (int i = 0; i < n; i++) assert_true(hy[i] == 6.0f);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_no_reports(g);
    gate_fini(&gt);
    OPS(g)->event_destroy(g, e);
    OPS(g)->event_destroy(g, done_b);
    OPS(g)->stream_destroy(g, a);
    OPS(g)->stream_destroy(g, b);
    ppn_gpu_close(g);
}

/* The same across devices: A on dev 0 produces, B on dev 1 copies it over (peer) and computes. */
static void test_sim_event_orders_devices(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 1);
    ppn_gevent *e = tu_event(g, 0, 0);
    const int n = 16;
    ppn_dptr x0 = tu_dalloc(g, 0, n * 4), x1 = tu_dalloc(g, 1, n * 4), y1 = tu_dalloc(g, 1, n * 4);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &gt), PPN_OK);
    assert_int_equal(tu_fill(g, a, x0, tu_f32_bits(4.0f), n), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
    assert_int_equal(OPS(g)->copy_peer(g, b, x1, 1, x0, 0, n * 4), PPN_OK);
    assert_int_equal(tu_add(g, b, y1, x1, x1, n), PPN_OK);
    float hy[16];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, hy, y1, sizeof hy), PPN_OK);
    sleep_ms(10);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    for (int i = 0; i < n; i++) assert_true(hy[i] == 8.0f);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_no_reports(g);
    gate_fini(&gt);
    ppn_gpu_close(g); /* destroys the streams and the event it still holds */
}

static void peer_copy_one(ppn_gpu *g, int src_dev, int dst_dev, uint64_t staged_delta)
{
    ppn_gstream *s = tu_stream(g, src_dev);
    unsigned char src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (unsigned char)(i * 7 + 3);
    memset(dst, 0, sizeof dst);
    ppn_dptr a = tu_dalloc(g, src_dev, sizeof src), b = tu_dalloc(g, dst_dev, sizeof dst);
    uint64_t before = g->n_host_staged;
    assert_int_equal(OPS(g)->copy_htod(g, s, a, src, sizeof src), PPN_OK);
    assert_int_equal(OPS(g)->copy_peer(g, s, b, dst_dev, a, src_dev, sizeof src), PPN_OK);
    ppn_gstream *t = tu_stream(g, dst_dev);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK); /* host order: t's copy comes after */
    assert_int_equal(OPS(g)->copy_dtoh(g, t, dst, b, sizeof dst), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, t), PPN_OK);
    assert_memory_equal(src, dst, sizeof src);
    assert_int_equal(g->n_host_staged - before, staged_delta);
    OPS(g)->stream_destroy(g, s);
    OPS(g)->stream_destroy(g, t);
    assert_int_equal(OPS(g)->mem_free(g, src_dev, a), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, dst_dev, b), PPN_OK);
}

static void test_sim_peer_copies_and_grants(void **state)
{
    (void)state;
    int can = -1;
    ppn_gpu *g = open_sim(); /* default: all */
    assert_int_equal(OPS(g)->peer_can_access(g, 0, 1, &can), PPN_OK);
    assert_int_equal(can, 1);
    peer_copy_one(g, 0, 1, 0);
    assert_int_equal(OPS(g)->peer_enable(g, 0, 1), PPN_OK);
    assert_no_reports(g);
    ppn_gpu_close(g);

    g = open_sim_env("PPN_SIM_PEER", "none");
    assert_int_equal(OPS(g)->peer_can_access(g, 0, 1, &can), PPN_OK);
    assert_int_equal(can, 0);
    peer_copy_one(g, 0, 1, 1); /* still works, through the host */
    peer_copy_one(g, 2, 2, 0); /* same device: nothing staged */
    assert_int_equal(OPS(g)->peer_enable(g, 0, 1), PPN_EINVAL);
    assert_has(ppn_last_error(), "peer_enable(0, 1)");
    assert_has(ppn_last_error(), "PPN_SIM_PEER=none");
    assert_no_reports(g);
    ppn_gpu_close(g);

    g = open_sim_env("PPN_SIM_PEER", "0-1,2-3");
    assert_int_equal(OPS(g)->peer_can_access(g, 1, 0, &can), PPN_OK); /* symmetric */
    assert_int_equal(can, 1);
    assert_int_equal(OPS(g)->peer_can_access(g, 0, 2, &can), PPN_OK);
    assert_int_equal(can, 0);
    peer_copy_one(g, 3, 2, 0);
    peer_copy_one(g, 0, 2, 1);
    assert_int_equal(OPS(g)->peer_enable(g, 1, 0), PPN_OK);
    assert_int_equal(OPS(g)->peer_enable(g, 1, 2), PPN_EINVAL);
    assert_has(ppn_last_error(), "peer_enable(1, 2)");
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* CUDA semantics: a wait binds to the record issued before it, not to a later record of the same event. */
static void test_sim_wait_binds_to_earlier_record(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0), *fresh = tu_event(g, 0, 0), *done_b = tu_event(g, 0, 0);
    ppn_dptr x = tu_dalloc(g, 0, 64), y = tu_dalloc(g, 0, 64);
    gate g1, g2;
    gate_init(&g1);
    gate_init(&g2);
    int done = 0;
    assert_int_equal(OPS(g)->event_query(g, fresh, &done), PPN_OK); /* never recorded: complete */
    assert_int_equal(done, 1);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, fresh), PPN_OK); /* a no-op */
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &g1), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 11, 16), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK); /* binds to the record above */
    uint32_t hx[16];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, hx, x, sizeof hx), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, done_b, b), PPN_OK);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &g2), PPN_OK);
    assert_int_equal(tu_fill(g, a, y, 12, 16), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK); /* a later record B must not wait for */
    gate_open(&g1);
    assert_true(poll_done(g, done_b, 5000)); /* completes while g2 still holds A */
    for (int i = 0; i < 16; i++) assert_int_equal(hx[i], 11);
    assert_int_equal(OPS(g)->event_query(g, e, &done), PPN_OK);
    assert_int_equal(done, 0);
    gate_open(&g2);
    assert_int_equal(OPS(g)->event_sync(g, e), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    assert_no_reports(g);
    gate_fini(&g1);
    gate_fini(&g2);
    ppn_gpu_close(g);
}

/* ---- races ------------------------------------------------------------------------------------------- */

/* A (stream 0) writes x after B (stream 1) read it, with nothing ordering them: a race whatever the timing. */
static void test_sim_race_without_event_is_reported(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0), *c = tu_stream(g, 0);
    ppn_dptr x = tu_dalloc(g, 0, 4096);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &gt), PPN_OK);    /* a op #1 */
    assert_int_equal(tu_fill(g, a, x, 5, 1024), PPN_OK);                   /* a op #2 */
    uint32_t h[4];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, h, x, sizeof h), PPN_OK); /* b op #1 */
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);               /* B ran first: no report yet */
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_ERACE);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ppn_last_error());
    assert_has(msg, "RACE");
    assert_has(msg, "stream 0 (dev 0) op #2 kernel ppn_k_fill");
    assert_has(msg, "stream 1 (dev 0) op #1 copy dtoh");
    assert_has(msg, "no event chain");
    assert_int_equal(counts(g).race, 1);
    /* sticky: any stream's next enqueue, query or sync returns it, with the report */
    assert_int_equal(OPS(g)->copy_htod(g, c, x, h, sizeof h), PPN_ERACE);
    assert_string_equal(ppn_last_error(), msg);
    assert_int_equal(OPS(g)->stream_sync(g, c), PPN_ERACE);
    char taken[1024];
    assert_int_equal(ppn_gpu_sim_take_error(g, taken, sizeof taken), PPN_ERACE);
    assert_string_equal(taken, msg);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK); /* cleared */
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    assert_int_equal(ppn_gpu_sim_take_error(g, taken, sizeof taken), PPN_OK);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

/* A write that raced is skipped, and must not stand for the accesses it raced with: B's second write, ordered
 * after B's first (the racy one) but, like it, not after A's write, races with A's write too and is skipped too.
 * (The checker used to let the racy write replace A's entry, so B's second write passed and ran: where A's op was
 * still running, the simulator's memory raced: ThreadSanitizer saw it in test_pipeline, CI of 2026-12-07.) And a
 * write ordered after both, by an event after A's and B's, is clean and runs. */
static void test_sim_racy_write_keeps_what_it_raced_with(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_gevent *ea = tu_event(g, 0, 0), *eb = tu_event(g, 0, 0);
    ppn_dptr x = tu_dalloc(g, 0, 4096);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, b, gate_wait, &gt), PPN_OK); /* b op #1: holds b until a has run */
    assert_int_equal(tu_fill(g, b, x, 7, 1024), PPN_OK);              /* b op #2: races with a's fill */
    assert_int_equal(tu_fill(g, b, x, 8, 1024), PPN_OK);              /* b op #3: so does this one */
    assert_int_equal(OPS(g)->event_record(g, eb, b), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 5, 1024), PPN_OK); /* a op #1 */
    assert_int_equal(OPS(g)->event_record(g, ea, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_ERACE);
    char msg[1024];
    assert_int_equal(ppn_gpu_sim_take_error(g, msg, sizeof msg), PPN_ERACE);
    assert_has(msg, "stream 1 (dev 0) op #2 kernel ppn_k_fill");
    assert_int_equal(counts(g).race, 2); /* op #2 and op #3, each against a's op #1 */
    uint32_t h[1024];
    assert_int_equal(OPS(g)->copy_dtoh(g, a, h, x, sizeof h), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_int_equal(h[1023], 5); /* neither racy fill ran */
    assert_int_equal(OPS(g)->stream_wait_event(g, a, eb), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, a, ea), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 9, 1024), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, a, h, x, sizeof h), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_int_equal(h[1023], 9);
    assert_int_equal(counts(g).race, 2);
    assert_int_equal(ppn_gpu_sim_take_error(g, msg, sizeof msg), PPN_OK);
    /* The same in pinned host memory (kept per range, not per block): two copies into it on b race with a's. */
    void *pin = NULL;
    assert_int_equal(OPS(g)->host_alloc(g, 4096, &pin), PPN_OK);
    gt.open = 0;
    assert_int_equal(OPS(g)->host_fn(g, b, gate_wait, &gt), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, b, pin, x, 4096), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, b, pin, x, 4096), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, a, pin, x, 4096), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_ERACE);
    assert_int_equal(ppn_gpu_sim_take_error(g, msg, sizeof msg), PPN_ERACE);
    assert_has(msg, "copy dtoh");
    assert_int_equal(counts(g).race, 4);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    assert_int_equal(OPS(g)->host_free(g, pin, 4096), PPN_OK);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

/* The same two ops ordered by an event: clean. */
static void test_sim_race_with_event_is_clean(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0);
    ppn_dptr x = tu_dalloc(g, 0, 4096);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &gt), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 5, 1024), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
    uint32_t h[4];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, h, x, sizeof h), PPN_OK);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    assert_int_equal(h[3], 5);
    /* and the write-after-read direction: B's read, then A writes after waiting for B */
    ppn_gevent *f = tu_event(g, 0, 0);
    assert_int_equal(OPS(g)->event_record(g, f, b), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, a, f), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 6, 1024), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_no_reports(g);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

/* A wait carries the clock of the record it bound to, not the event's state when the wait runs: A's second
 * write (recorded again on the same event after B's wait was issued) is not ordered before B's read. */
static void test_sim_wait_uses_the_bound_record(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0);
    ppn_dptr x = tu_dalloc(g, 0, 256);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, b, gate_wait, &gt), PPN_OK); /* B runs last */
    assert_int_equal(tu_fill(g, a, x, 1, 64), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 2, 64), PPN_OK); /* a op #3 */
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    uint32_t h[64];
    assert_int_equal(OPS(g)->copy_dtoh(g, b, h, x, sizeof h), PPN_OK); /* b op #3 */
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK); /* A's second record has executed: B still races */
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_ERACE);
    assert_has(ppn_last_error(), "stream 1 (dev 0) op #3 copy dtoh");
    assert_has(ppn_last_error(), "stream 0 (dev 0) op #3 kernel ppn_k_fill");
    assert_has(ppn_last_error(), "only up to op #2");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_ERACE);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

/* Event chains are transitive: A -> B -> C orders A's write before C's read. */
static void test_sim_event_chains_are_transitive(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 1), *c = tu_stream(g, 2);
    ppn_gevent *ea = tu_event(g, 0, 0), *eb = tu_event(g, 1, 0);
    ppn_dptr x = tu_dalloc(g, 0, 256), y = tu_dalloc(g, 1, 256), zx = tu_dalloc(g, 2, 256), zy = tu_dalloc(g, 2, 256);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, a, gate_wait, &gt), PPN_OK);
    assert_int_equal(tu_fill(g, a, x, 21, 64), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, ea, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, ea), PPN_OK);
    assert_int_equal(tu_fill(g, b, y, 22, 64), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, eb, b), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, c, eb), PPN_OK);
    assert_int_equal(OPS(g)->copy_peer(g, c, zx, 2, x, 0, 256), PPN_OK); /* A's data, through B's event */
    assert_int_equal(OPS(g)->copy_peer(g, c, zy, 2, y, 1, 256), PPN_OK);
    uint32_t hx[64], hy[64];
    assert_int_equal(OPS(g)->copy_dtoh(g, c, hx, zx, sizeof hx), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, c, hy, zy, sizeof hy), PPN_OK);
    sleep_ms(5);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, c), PPN_OK);
    assert_int_equal(hx[63], 21);
    assert_int_equal(hy[0], 22);
    assert_no_reports(g);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

/* A host sync orders later host-issued work after what it waited for; without it, a race. */
static void test_sim_host_sync_orders_work(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
    ppn_dptr x = tu_dalloc(g, 0, 256);
    uint32_t h[64];
    assert_int_equal(tu_fill(g, a, x, 3, 64), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, a), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, b, h, x, sizeof h), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
    assert_int_equal(h[63], 3);
    assert_no_reports(g);
    assert_int_equal(tu_fill(g, b, x, 4, 64), PPN_OK); /* not synced ... */
    assert_int_equal(OPS(g)->copy_dtoh(g, a, h, x, sizeof h), PPN_OK); /* ... so this read races */
    OPS(g)->stream_sync(g, a);
    OPS(g)->stream_sync(g, b);
    char msg[1024];
    assert_int_equal(ppn_gpu_sim_take_error(g, msg, sizeof msg), PPN_ERACE);
    assert_has(msg, "kernel ppn_k_fill");
    assert_has(msg, "copy dtoh");
    assert_int_equal(counts(g).race, 1);
    ppn_gpu_close(g);
}

/* A pool block freed on A and reused on B without an event: the history survives the free. */
static void test_sim_reuse_without_wait_is_a_race(void **state)
{
    (void)state;
    for (int with_event = 0; with_event < 2; with_event++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
        ppn_gevent *e = tu_event(g, 0, 0);
        ppn_dptr slab = tu_dalloc(g, 0, 1 << 16);
        assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 1 << 16, PPN_ANN_CARVE, "slab"), PPN_OK);
        assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 4096, PPN_ANN_ALLOC, "act"), PPN_OK);
        assert_int_equal(tu_fill(g, a, slab, 1, 1024), PPN_OK);
        assert_int_equal(OPS(g)->mem_annotate(g, a, 0, slab, 4096, PPN_ANN_FREE, NULL), PPN_OK);
        if (with_event) {
            assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
            assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
        }
        /* reused with other extents: the new block inherits the old history */
        assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 2048, PPN_ANN_ALLOC, "kv"), PPN_OK);
        assert_int_equal(tu_fill(g, b, slab, 2, 512), PPN_OK);
        OPS(g)->stream_sync(g, a);
        OPS(g)->stream_sync(g, b);
        char msg[1024] = "";
        ppn_status st = ppn_gpu_sim_take_error(g, msg, sizeof msg);
        if (with_event) {
            assert_int_equal(st, PPN_OK);
            assert_int_equal(counts(g).race, 0);
            uint32_t w[512];
            assert_int_equal(OPS(g)->copy_dtoh(g, b, w, slab, sizeof w), PPN_OK);
            assert_int_equal(OPS(g)->stream_sync(g, b), PPN_OK);
            assert_int_equal(w[511], 2);
        } else {
            assert_int_equal(st, PPN_ERACE);
            assert_has(msg, "stream 0 (dev 0)");
            assert_has(msg, "stream 1 (dev 0)");
            assert_has(msg, "'kv'");
            /* The two workers are unordered, so the race shows from one side or both: b's fill after a's
             * free executed is one report; the free executing after the fill is reported too. */
            uint64_t races = counts(g).race;
            assert_true(races == 1 || races == 2);
        }
        assert_int_equal(OPS(g)->mem_annotate(g, b, 0, slab, 2048, PPN_ANN_FREE, NULL), PPN_OK);
        OPS(g)->stream_sync(g, b);
        assert_int_equal(ppn_gpu_sim_take_error(g, msg, sizeof msg), PPN_OK);
        ppn_gpu_close(g);
    }
}

/* ---- placement, use after free, double free, bounds --------------------------------------------------- */

static void test_sim_placement_needs_peer_enable(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s0 = tu_stream(g, 0), *s1 = tu_stream(g, 1);
    ppn_dptr a0 = tu_dalloc(g, 0, 256), b1 = tu_dalloc(g, 1, 256), o1 = tu_dalloc(g, 1, 256), c2 = tu_dalloc(g, 2, 256);
    assert_int_equal(tu_fill(g, s0, a0, tu_f32_bits(1.0f), 64), PPN_OK);
    assert_int_equal(tu_fill(g, s1, b1, tu_f32_bits(2.0f), 64), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s0), PPN_OK);
    assert_int_equal(tu_add(g, s1, o1, a0, b1, 64), PPN_OK); /* reads dev 0 memory from dev 1 */
    assert_int_equal(OPS(g)->stream_sync(g, s1), PPN_EPLACEMENT);
    const char *m = ppn_last_error();
    assert_has(m, "PLACEMENT");
    assert_has(m, "stream 1 (dev 1) op #2 kernel ppn_k_add");
    assert_has(m, "device 0");
    assert_has(m, "peer_enable(1, 0)");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EPLACEMENT);
    assert_int_equal(counts(g).placement, 1);

    assert_int_equal(OPS(g)->peer_enable(g, 1, 0), PPN_OK);
    assert_int_equal(tu_add(g, s1, o1, a0, b1, 64), PPN_OK);
    float h[64];
    assert_int_equal(OPS(g)->copy_dtoh(g, s1, h, o1, sizeof h), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s1), PPN_OK);
    assert_true(h[0] == 3.0f && h[63] == 3.0f);
    assert_int_equal(counts(g).placement, 1);

    /* a host copy on dev 1's stream of dev 2 memory (no grant 1 -> 2) */
    assert_int_equal(OPS(g)->copy_dtoh(g, s1, h, c2, 64), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s1), PPN_EPLACEMENT);
    assert_has(ppn_last_error(), "copy dtoh");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EPLACEMENT);
    /* a peer copy naming the wrong device for its source */
    assert_int_equal(OPS(g)->copy_peer(g, s1, o1, 1, c2, 0, 64), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s1), PPN_EPLACEMENT);
    assert_has(ppn_last_error(), "names device 0");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EPLACEMENT);
    assert_int_equal(counts(g).placement, 3);
    ppn_gpu_close(g);
}

static void test_sim_use_after_free_of_block(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr slab = tu_dalloc(g, 0, 8192);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 8192, PPN_ANN_CARVE, "slab"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 1024, PPN_ANN_ALLOC, "act"), PPN_OK);
    assert_int_equal(tu_fill(g, s, slab, 1, 256), PPN_OK);                                        /* #1 */
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, slab, 1024, PPN_ANN_FREE, NULL), PPN_OK);  /* #2 */
    assert_int_equal(tu_fill(g, s, slab, 9, 256), PPN_OK);                                        /* #3 */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EUSEAFTERFREE);
    const char *m = ppn_last_error();
    assert_has(m, "USE AFTER FREE");
    assert_has(m, "'act'");
    assert_has(m, "stream 0 (dev 0) op #3 kernel ppn_k_fill");
    assert_has(m, "freed by stream 0 (dev 0) op #2 free");
    assert_int_equal(((uint32_t *)(uintptr_t)slab)[0], 1); /* the faulting op did not run */
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EUSEAFTERFREE);
    assert_int_equal(counts(g).use_after_free, 1);
    /* a block that is a whole raw allocation (no CARVE: ALLOC carves its own range) */
    ppn_dptr big = tu_dalloc(g, 0, 16384);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, big, 16384, PPN_ANN_ALLOC, "large"), PPN_OK);
    assert_int_equal(tu_fill(g, s, big, 1, 4096), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, big, 16384, PPN_ANN_FREE, NULL), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, s, &(uint32_t){0}, big, 4), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EUSEAFTERFREE);
    assert_has(ppn_last_error(), "'large'");
    assert_has(ppn_last_error(), "copy dtoh");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EUSEAFTERFREE);
    /* a block straddling the edge of a carved region is refused at once */
    ppn_dptr part = tu_dalloc(g, 0, 8192);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, part, 4096, PPN_ANN_CARVE, "half"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, part + 3072, 2048, PPN_ANN_ALLOC, "x"), PPN_EINVAL);
    assert_has(ppn_last_error(), "straddles");
    assert_int_equal(counts(g).use_after_free, 2);
    ppn_gpu_close(g);
}

static void test_sim_use_after_free_of_raw(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr x = tu_dalloc(g, 0, 4096);
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_OK);
    assert_int_equal(tu_fill(g, s, x, 1, 16), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EUSEAFTERFREE);
    assert_has(ppn_last_error(), "mem_free");
    assert_has(ppn_last_error(), "kernel ppn_k_fill");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EUSEAFTERFREE);
    /* freed while the op waits in the queue: caught when it runs, the memory is not touched (ASan) */
    ppn_dptr y = tu_dalloc(g, 0, 2 << 20);
    gate gt;
    gate_init(&gt);
    assert_int_equal(OPS(g)->host_fn(g, s, gate_wait, &gt), PPN_OK);
    assert_int_equal(tu_fill(g, s, y, 1, 1024), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, y), PPN_OK);
    gate_open(&gt);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EUSEAFTERFREE);
    assert_has(ppn_last_error(), "after the op was issued");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EUSEAFTERFREE);
    assert_int_equal(counts(g).use_after_free, 2);
    gate_fini(&gt);
    ppn_gpu_close(g);
}

static void test_sim_double_free_is_reported(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr slab = tu_dalloc(g, 0, 8192);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 8192, PPN_ANN_CARVE, "slab"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab + 4096, 512, PPN_ANN_ALLOC, "w"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, slab + 4096, 512, PPN_ANN_FREE, NULL), PPN_OK); /* #1 */
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, slab + 4096, 512, PPN_ANN_FREE, NULL), PPN_OK); /* #2 */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EDOUBLEFREE);
    const char *m = ppn_last_error();
    assert_has(m, "DOUBLE FREE");
    assert_has(m, "'w'");
    assert_has(m, "free by stream 0 (dev 0) op #2 free");
    assert_has(m, "previously freed by stream 0 (dev 0) op #1 free");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EDOUBLEFREE);
    /* a free of a range that was never a block */
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, slab + 100, 64, PPN_ANN_FREE, NULL), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EDOUBLEFREE);
    assert_has(ppn_last_error(), "not a live block");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EDOUBLEFREE);
    /* raw: twice, and a pointer that was never allocated */
    ppn_dptr x = tu_dalloc(g, 0, 4096);
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_EDOUBLEFREE);
    assert_has(ppn_last_error(), "already freed");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EDOUBLEFREE);
    assert_int_equal(OPS(g)->mem_free(g, 0, slab + 64), PPN_EDOUBLEFREE);
    assert_has(ppn_last_error(), "no allocation starts");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EDOUBLEFREE);
    assert_int_equal(counts(g).double_free, 4);
    ppn_gpu_close(g);
}

static void test_sim_access_outside_a_block(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr raw = tu_dalloc(g, 0, 4096), slab = tu_dalloc(g, 0, 8192);
    assert_int_equal(tu_fill(g, s, raw, 1, 1025), PPN_OK); /* 4 bytes past the end */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EBOUNDS);
    assert_has(ppn_last_error(), "ACCESS OUTSIDE A BLOCK");
    assert_has(ppn_last_error(), "4 B past the end");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EBOUNDS);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 8192, PPN_ANN_CARVE, "slab"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 1024, PPN_ANN_ALLOC, "q"), PPN_OK);
    assert_int_equal(tu_fill(g, s, slab + 2048, 1, 16), PPN_OK); /* carved but in no block */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EBOUNDS);
    assert_has(ppn_last_error(), "not inside one allocated block");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EBOUNDS);
    uint32_t h[256];
    assert_int_equal(OPS(g)->copy_dtoh(g, s, h, slab + 512, 1024), PPN_OK); /* straddles the block's end */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EBOUNDS);
    assert_has(ppn_last_error(), "'q'");
    assert_has(ppn_last_error(), "copy dtoh");
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EBOUNDS);
    assert_int_equal(tu_fill(g, s, slab, 7, 256), PPN_OK); /* exactly the block: fine */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(counts(g).bounds, 3);
    ppn_gpu_close(g);
}

/* ---- fault injection, environment, timing ------------------------------------------------------------ */

static void test_sim_fault_injection(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim_env("PPN_SIM_FAIL", "alloc:2,copy:1,launch:2,record:1");
    ppn_gstream *s = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0);
    ppn_dptr x = tu_dalloc(g, 0, 256), y = 0;
    assert_int_equal(OPS(g)->mem_alloc(g, 0, 256, &y), PPN_ENOMEM);
    assert_has(ppn_last_error(), "sim: injected failure of alloc #2 (PPN_SIM_FAIL)");
    assert_int_equal(y, 0);
    y = tu_dalloc(g, 0, 256);
    uint32_t src[64], dst[64];
    for (int i = 0; i < 64; i++) src[i] = (uint32_t)i * 3u;
    assert_int_equal(OPS(g)->copy_htod(g, s, x, src, sizeof src), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of copy #1");
    assert_int_equal(OPS(g)->copy_htod(g, s, x, src, sizeof src), PPN_OK);
    assert_int_equal(tu_fill(g, s, y, 8, 64), PPN_OK);
    assert_int_equal(tu_fill(g, s, y, 9, 64), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of launch #2");
    assert_int_equal(OPS(g)->event_record(g, e, s), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of record #1");
    assert_int_equal(OPS(g)->event_record(g, e, s), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, s, dst, x, sizeof dst), PPN_OK);
    uint32_t hy[64];
    assert_int_equal(OPS(g)->copy_dtoh(g, s, hy, y, sizeof hy), PPN_OK);
    assert_int_equal(OPS(g)->event_sync(g, e), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_memory_equal(src, dst, sizeof src);
    assert_int_equal(hy[63], 8); /* the failed launch was never enqueued */
    assert_int_equal(g->n_mem_alloc, 3);
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* Every op kind can fail (issue 14): the K-th call of the kind fails with PPN_EDRIVER naming it, does nothing, and
 * the next call works. */
static int hostfn_ran;
static void hostfn_mark(void *arg) { (void)arg, hostfn_ran++; }

static void test_sim_fault_injection_every_kind(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim_env("PPN_SIM_FAIL", "wait:1,memset:2,hostfn:1,free:1,stream:2,event:2");
    ppn_gstream *s = tu_stream(g, 0), *t = NULL;
    assert_int_equal(OPS(g)->stream_create(g, 0, &t), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of stream #2");
    assert_null(t);
    t = tu_stream(g, 0);
    ppn_gevent *e = tu_event(g, 0, 0), *f = NULL;
    assert_int_equal(OPS(g)->event_create(g, 0, 0, &f), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of event #2");
    assert_null(f);
    ppn_dptr x = tu_dalloc(g, 0, 256);
    assert_int_equal(OPS(g)->event_record(g, e, s), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, t, e), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of wait #1");
    assert_int_equal(OPS(g)->stream_wait_event(g, t, e), PPN_OK);
    assert_int_equal(OPS(g)->memset_d8(g, s, x, 1, 256), PPN_OK);
    assert_int_equal(OPS(g)->memset_d8(g, s, x, 2, 256), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of memset #2");
    assert_int_equal(OPS(g)->host_fn(g, s, hostfn_mark, NULL), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of hostfn #1");
    hostfn_ran = 0;
    assert_int_equal(OPS(g)->host_fn(g, s, hostfn_mark, NULL), PPN_OK);
    unsigned char h[256];
    tu_download(g, s, h, x, sizeof h);
    assert_int_equal(h[255], 1); /* the failed memset did nothing */
    assert_int_equal(hostfn_ran, 1); /* the failed host fn never ran */
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_EDRIVER);
    assert_has(ppn_last_error(), "injected failure of free #1");
    tu_download(g, s, h, x, sizeof h); /* still allocated */
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_OK);
    void *pin = NULL;
    assert_int_equal(OPS(g)->host_alloc(g, 4096, &pin), PPN_OK);
    assert_int_equal(OPS(g)->host_free(g, pin, 4096), PPN_OK); /* free #3: only the first was to fail */
    assert_no_reports(g);
    ppn_gpu_close(g);
}

static void test_sim_invalid_environment_is_refused(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"PPN_SIM_DEVICES", "0"},   {"PPN_SIM_DEVICES", "65"},    {"PPN_SIM_DEVICES", "2x"},
        {"PPN_SIM_MEM", "12X"},     {"PPN_SIM_MEM", "0"},         {"PPN_SIM_MEM", "G"},
        {"PPN_SIM_MEM", "99999999999999999999"},                  {"PPN_SIM_PEER", "some"},
        {"PPN_SIM_PEER", "0-4"},    {"PPN_SIM_PEER", "1-1"},      {"PPN_SIM_PEER", "0-1,"},
        {"PPN_SIM_PEER", "0-1;2-3"}, {"PPN_SIM_FAIL", "alloc"},   {"PPN_SIM_FAIL", "alloc:0"},
        {"PPN_SIM_FAIL", "sync:1"}, {"PPN_SIM_FAIL", "copy:1,"},  {"PPN_SIM_LATENCY", "1001"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ppn_gpu *g = (ppn_gpu *)0x1;
        tu_env_set(bad[i][0], bad[i][1]);
        ppn_status st = ppn_gpu_sim_create(ppn_kernel_set(), &g);
        tu_env_restore();
        if (st != PPN_EINVAL) fail_msg("%s=%s accepted (status %d)", bad[i][0], bad[i][1], st);
        assert_null(g);
        assert_has(ppn_last_error(), bad[i][0]);
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i][1]);
        assert_has(ppn_last_error(), quoted);
        assert_has(ppn_last_error(), "must");
    }
    ppn_gpu *g = open_sim_env("PPN_SIM_PEER", "all"); /* the valid spellings */
    ppn_gpu_close(g);
    g = open_sim_env("PPN_SIM_MEM", "64k");
    ppn_device_info di;
    assert_int_equal(OPS(g)->device_info(g, 0, &di), PPN_OK);
    assert_int_equal(di.mem_total, 64 << 10);
    ppn_gpu_close(g);
}

static void test_sim_elapsed_and_latency_model(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_gevent *t0 = tu_event(g, 0, 1), *t1 = tu_event(g, 0, 1), *plain = tu_event(g, 0, 0);
    float ms = -1;
    assert_int_equal(OPS(g)->event_elapsed(g, t0, t1, &ms), PPN_EINVAL); /* never recorded */
    assert_int_equal(OPS(g)->event_record(g, t0, s), PPN_OK);
    assert_int_equal(OPS(g)->host_fn(g, s, sleep_20ms, NULL), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, t1, s), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, plain, s), PPN_OK);
    assert_int_equal(OPS(g)->event_sync(g, t1), PPN_OK);
    assert_int_equal(OPS(g)->event_elapsed(g, t0, t1, &ms), PPN_OK);
    assert_true(ms >= 19.0f && ms < 2000.0f);
    assert_int_equal(OPS(g)->event_elapsed(g, t0, plain, &ms), PPN_EINVAL);
    assert_has(ppn_last_error(), "without timing");
    ppn_gpu_close(g);

    g = open_sim_env("PPN_SIM_LATENCY", "1");
    s = tu_stream(g, 0);
    t0 = tu_event(g, 0, 1);
    t1 = tu_event(g, 0, 1);
    size_t n = 4 << 20;
    void *h = NULL;
    assert_int_equal(OPS(g)->host_alloc(g, n, &h), PPN_OK);
    ppn_dptr x = tu_dalloc(g, 0, n);
    assert_int_equal(OPS(g)->event_record(g, t0, s), PPN_OK);
    assert_int_equal(OPS(g)->copy_htod(g, s, x, h, n), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, t1, s), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->event_elapsed(g, t0, t1, &ms), PPN_OK);
    double want = (5e3 + (double)n / 20.0) / 1e6; /* 5 us + 4 MiB at 20 GB/s, in ms */
    assert_true(ms >= want * 0.999);
    assert_int_equal(OPS(g)->event_record(g, t0, s), PPN_OK);
    for (int i = 0; i < 50; i++) assert_int_equal(tu_fill(g, s, x, 1, 1), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, t1, s), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->event_elapsed(g, t0, t1, &ms), PPN_OK);
    assert_true(ms >= 50 * 4e-3 * 0.999); /* 50 launches of 4 us */
    assert_int_equal(OPS(g)->host_free(g, h, n), PPN_OK);
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* The latency model's account (ppn_sim_counts.copies, copy_model_ns): every accepted copy adds 5 us + its bytes at
 * its kind's rate (htod, dtoh, staged 20 GB/s; peer 50 GB/s; dtod and a peer copy within a device 1 TB/s), with
 * the model off (PPN_SIM_LATENCY unset) too; a refused copy adds nothing. Expected costs computed here from the
 * documented rates. */
static void test_sim_copy_model_account(void **state)
{
    (void)state;
    tu_env_set("PPN_SIM_FAIL", "copy:1");
    tu_env_set("PPN_SIM_PEER", "0-1");
    ppn_gpu *g = NULL;
    ppn_status st = ppn_gpu_sim_create(ppn_kernel_set(), &g);
    tu_env_restore();
    assert_int_equal(st, PPN_OK);
    enum { N = 4000 }; /* a multiple of 20, 50 and 1000: the rates divide it exactly */
    static unsigned char h[N];
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr x = tu_dalloc(g, 0, N), y = tu_dalloc(g, 0, N), p1 = tu_dalloc(g, 1, N), p2 = tu_dalloc(g, 2, N);
    assert_int_equal(OPS(g)->copy_htod(g, s, x, h, N), PPN_EDRIVER); /* refused: not accounted */
    assert_int_equal(OPS(g)->copy_htod(g, s, x, h, N), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtoh(g, s, h, x, N), PPN_OK);
    assert_int_equal(OPS(g)->copy_dtod(g, s, y, x, N), PPN_OK);
    assert_int_equal(OPS(g)->copy_peer(g, s, y, 0, x, 0, N), PPN_OK);   /* within a device: dtod */
    assert_int_equal(OPS(g)->copy_peer(g, s, p1, 1, x, 0, N), PPN_OK);  /* grant possible: peer */
    assert_int_equal(OPS(g)->copy_peer(g, s, p2, 2, x, 0, N), PPN_OK);  /* none: staged through the host */
    assert_int_equal(OPS(g)->copy_peer(g, s, p2, 2, x, 0, N), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    struct ppn_sim_counts c = counts(g);
    const uint64_t want_n[PPN_SIM_COPY_KINDS] = {1, 1, 2, 1, 2};
    const uint64_t want_ns[PPN_SIM_COPY_KINDS] = {5000 + N / 20, 5000 + N / 20, 2 * (5000 + N / 1000), 5000 + N / 50,
                                                  2 * (5000 + N / 20)};
    for (int k = 0; k < PPN_SIM_COPY_KINDS; k++)
        if (c.copies[k] != want_n[k] || c.copy_model_ns[k] != want_ns[k])
            fail_msg("copy kind %d: %llu copies, %llu ns modelled (want %llu, %llu)", k,
                     (unsigned long long)c.copies[k], (unsigned long long)c.copy_model_ns[k],
                     (unsigned long long)want_n[k], (unsigned long long)want_ns[k]);
    assert_no_reports(g);
    ppn_gpu_close(g);
}


/* The latency model's launch account (ppn_sim_counts.launches, launch_model_ns): every accepted kernel adds 4 us
 * when launched through a stream and 1 us when replayed from a graph (each kernel of each replay), with the model
 * off (PPN_SIM_LATENCY unset); a launch recorded into a capture runs nothing and adds nothing, a refused one
 * (here the second kernel of a replay, PPN_SIM_FAIL=launch:4) adds nothing while the replay's first kernel,
 * accepted before it, counts. Expected figures from the documented costs. */
static void test_sim_launch_model_account(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim_env("PPN_SIM_FAIL", "launch:4");
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr a = tu_dalloc(g, 0, 1024), c = tu_dalloc(g, 0, 1024);
    assert_int_equal(tu_fill(g, s, a, tu_f32_bits(1.0f), 256), PPN_OK);  /* launch 1: through the stream */
    assert_int_equal(tu_fill(g, s, c, tu_f32_bits(0.0f), 256), PPN_OK);  /* launch 2 */
    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_OK);
    assert_int_equal(tu_add(g, s, c, c, a, 256), PPN_OK); /* recorded, not run: not a launch */
    assert_int_equal(tu_add(g, s, c, c, a, 256), PPN_OK);
    ppn_ggraph *gr = NULL;
    assert_int_equal(OPS(g)->capture_end(g, s, &gr), PPN_OK);
    struct ppn_sim_counts c0 = counts(g);
    if (c0.launches[PPN_SIM_LAUNCH_GRAPH] || c0.launch_model_ns[PPN_SIM_LAUNCH_GRAPH])
        fail_msg("a capture counted %llu graph kernels", (unsigned long long)c0.launches[PPN_SIM_LAUNCH_GRAPH]);
    assert_int_equal(OPS(g)->graph_launch(g, gr, s), PPN_EDRIVER); /* launch 3; launch 4, its second kernel, refused */
    assert_int_equal(OPS(g)->graph_launch(g, gr, s), PPN_OK);      /* launches 5, 6 */
    assert_int_equal(tu_add(g, s, c, c, a, 256), PPN_OK);          /* launch 7: through the stream */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    struct ppn_sim_counts k = counts(g);
    const uint64_t want_n[PPN_SIM_LAUNCH_KINDS] = {3, 3};
    const uint64_t want_ns[PPN_SIM_LAUNCH_KINDS] = {3 * 4000, 3 * 1000};
    for (int i = 0; i < PPN_SIM_LAUNCH_KINDS; i++)
        if (k.launches[i] != want_n[i] || k.launch_model_ns[i] != want_ns[i])
            fail_msg("launch kind %d: %llu kernels, %llu ns modelled (want %llu, %llu)", i,
                     (unsigned long long)k.launches[i], (unsigned long long)k.launch_model_ns[i],
                     (unsigned long long)want_n[i], (unsigned long long)want_ns[i]);
    float h[256];
    tu_download(g, s, h, c, sizeof h);
    assert_true(h[0] == 4.0f); /* 1 + 2 + 1: the refused replay's first kernel ran */
    assert_int_equal(OPS(g)->graph_destroy(g, gr), PPN_OK);
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* ---- graphs ----------------------------------------------------------------------------------------------- */

/* A capture records launches without running them; every replay runs them again, in order; nothing but a
 * launch can be captured; a graph belongs to its device. */
static void test_sim_graph_capture_and_replay(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0), *t = tu_stream(g, 1);
    ppn_gevent *e = tu_event(g, 0, 0);
    ppn_dptr a = tu_dalloc(g, 0, 1024), b = tu_dalloc(g, 0, 1024), c = tu_dalloc(g, 0, 1024);
    assert_int_equal(tu_fill(g, s, a, tu_f32_bits(1.0f), 256), PPN_OK);
    assert_int_equal(tu_fill(g, s, b, tu_f32_bits(2.0f), 256), PPN_OK);
    assert_int_equal(tu_fill(g, s, c, tu_f32_bits(0.0f), 256), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);

    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_OK);
    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_EUNSUPPORTED);
    assert_int_equal(tu_add(g, s, c, c, a, 256), PPN_OK); /* c += a */
    assert_int_equal(tu_add(g, s, c, c, b, 256), PPN_OK); /* c += b */
    float h[256];
    assert_int_equal(OPS(g)->copy_dtoh(g, s, h, c, sizeof h), PPN_ESTATE);
    assert_has(ppn_last_error(), "capturing a graph");
    assert_int_equal(OPS(g)->event_record(g, e, s), PPN_ESTATE);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_ESTATE);
    ppn_ggraph *gr = NULL;
    assert_int_equal(OPS(g)->capture_end(g, s, &gr), PPN_OK);
    assert_non_null(gr);
    assert_int_equal(OPS(g)->capture_end(g, s, &gr), PPN_ESTATE); /* no longer capturing */

    tu_download(g, s, h, c, sizeof h);
    assert_true(h[0] == 0.0f && h[255] == 0.0f); /* the capture ran nothing */
    for (int k = 1; k <= 3; k++) {
        assert_int_equal(OPS(g)->graph_launch(g, gr, s), PPN_OK);
        tu_download(g, s, h, c, sizeof h);
        for (int i = 0; i < 256; i++) assert_true(h[i] == 3.0f * (float)k);
    }
    assert_int_equal(g->n_graph_launches, 3);
    assert_int_equal(OPS(g)->graph_launch(g, gr, t), PPN_EINVAL); /* recorded on device 0 */
    assert_has(ppn_last_error(), "graph of dev 0");

    /* abandoned: nothing recorded runs, the stream is ordinary again */
    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_OK);
    assert_int_equal(tu_fill(g, s, c, tu_f32_bits(7.0f), 256), PPN_OK);
    assert_int_equal(OPS(g)->capture_end(g, s, NULL), PPN_OK);
    tu_download(g, s, h, c, sizeof h);
    assert_true(h[0] == 9.0f);
    assert_int_equal(OPS(g)->graph_destroy(g, gr), PPN_OK);
    assert_no_reports(g);
    ppn_gpu_close(g);
}

/* A replay is no blind spot: its kernels go through the checker like eager launches. */
static void test_sim_graph_replay_is_checked(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr a = tu_dalloc(g, 0, 1024), c = tu_dalloc(g, 0, 1024);
    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_OK);
    assert_int_equal(tu_add(g, s, c, c, a, 256), PPN_OK);
    ppn_ggraph *gr = NULL;
    assert_int_equal(OPS(g)->capture_end(g, s, &gr), PPN_OK);
    assert_int_equal(OPS(g)->graph_launch(g, gr, s), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, a), PPN_OK);
    assert_int_equal(OPS(g)->graph_launch(g, gr, s), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_EUSEAFTERFREE);
    assert_has(ppn_last_error(), "kernel ppn_k_add");
    assert_int_equal(counts(g).use_after_free, 1);
    assert_int_equal(ppn_gpu_sim_take_error(g, NULL, 0), PPN_EUSEAFTERFREE);
    assert_int_equal(OPS(g)->graph_destroy(g, gr), PPN_OK);
    ppn_gpu_close(g);

    g = open_sim_env("PPN_KPROF", "1"); /* per-launch accounting and graphs do not mix: refused, named */
    s = tu_stream(g, 0);
    assert_int_equal(OPS(g)->capture_begin(g, s), PPN_EUNSUPPORTED);
    assert_has(ppn_last_error(), "PPN_KPROF=1");
    ppn_gpu_close(g);
}

/* Closing with streams, events, queued ops and allocations still alive frees everything (ASan). */
static void test_sim_close_with_everything_alive(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 1);
    ppn_gevent *e = tu_event(g, 0, 1);
    ppn_dptr x = tu_dalloc(g, 0, 3 << 20), y = tu_dalloc(g, 1, 1000);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, x, 1 << 20, PPN_ANN_CARVE, "slab"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, x, 4096, PPN_ANN_ALLOC, "blk"), PPN_OK);
    for (int i = 0; i < 20; i++) assert_int_equal(tu_fill(g, a, x, (uint32_t)i, 1024), PPN_OK);
    assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
    assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
    assert_int_equal(OPS(g)->copy_peer(g, b, y, 1, x, 0, 1000), PPN_OK);
    ppn_gpu_close(g);
}


/* The TMA path on the sim (gpu.h: tma_ok, tmap_encode): the op takes gemm_tc_h for a large-tile shape (m 65,
 * 512 tiles of 256 weight rows; the kernel profile names it), its result is the reference's bits (the sim's CPU
 * reference reads the operands through the maps the sim encoded) and the checker has nothing to report; a map
 * the driver would refuse is refused here too; PPN_TMA=0 gives gemm_tc_l (the same bits), refuses the forced
 * tile and the encoder by name; PPN_TMA=2 and 3 are levels 2 and 3; a PPN_TMA the door does not take is refused at
 * creation. */
static void test_sim_tma_gemm(void **state)
{
    (void)state;
    enum { M = 65, R = 512 * PPN_GEMM_TC_H_BN, C = 8 }; /* 512 tiles: gemm_tc_h's (ops_gemm.c) */
    float *out[2], *x = tu_frand((size_t)M * C, -2, 2), *want = malloc((size_t)M * R * 4);
    void *w = tu_wrand(PPN_DTYPE_BF16, (size_t)R * C, NULL);
    assert_non_null(want);
    ppn_kp_gemm ref = {.out = (uintptr_t)want, .w = (uintptr_t)w, .x = (uintptr_t)x, .m = M, .rows = R, .cols = C,
                       .wdt = PPN_DTYPE_BF16};
    ppn_kernels[PPN_K_GEMM].cpu(&ref);
    for (int arm = 0; arm < 2; arm++) { /* 0: PPN_TMA unset; 1: PPN_TMA=0 */
        tu_env_set("PPN_KPROF", "1");
        if (arm) tu_env_set("PPN_TMA", "0");
        ppn_gpu *g = NULL;
        ppn_status st = ppn_gpu_sim_create(ppn_kernel_set(), &g);
        tu_env_restore();
        assert_int_equal(st, PPN_OK);
        ppn_gstream *s = tu_stream(g, 0);
        assert_int_equal(OPS(g)->tma_ok(g, s), !arm);
        ppn_dptr dw = tu_dalloc(g, 0, (size_t)R * C * 2), dx = tu_dalloc(g, 0, (size_t)M * C * 4);
        ppn_dptr dout = tu_dalloc(g, 0, (size_t)M * R * 4);
        tu_upload(g, s, dw, w, (size_t)R * C * 2);
        tu_upload(g, s, dx, x, (size_t)M * C * 4);
        assert_int_equal(ppn_op_gemm(g, s, dout, dw, PPN_DTYPE_BF16, dx, M, R, C, 0, 0), PPN_OK);
        out[arm] = malloc((size_t)M * R * 4);
        assert_non_null(out[arm]);
        tu_download(g, s, out[arm], dout, (size_t)M * R * 4);
        assert_memory_equal(out[arm], want, (size_t)M * R * 4);
        struct ppn_kprof_entry e[PPN_K_COUNT];
        int n = OPS(g)->kprof_read(g, e, PPN_K_COUNT), found = 0;
        for (int i = 0; i < n; i++)
            if (e[i].calls) {
                assert_string_equal(e[i].name, arm ? "ppn_k_gemm_tc_l" : "ppn_k_gemm_tc_h");
                found += (int)e[i].calls;
            }
        assert_int_equal(found, 1);
        ppn_kp_gemm p = {.out = dout, .w = dw, .x = dx, .m = M, .rows = R, .cols = C, .wdt = PPN_DTYPE_BF16};
        ppn_tmap_desc d = {.base = dx, .elem_bytes = 4, .dim = {C, M}, .row_bytes = C * 4, .box = {32, 128}};
        _Alignas(64) unsigned char map[PPN_TMAP_BYTES];
        if (arm) {
            assert_int_equal(ppn_op_gemm_tile(g, s, PPN_K_GEMM_TC_H, &p), PPN_EUNSUPPORTED);
            assert_non_null(strstr(ppn_last_error(), "PPN_TMA"));
            assert_int_equal(OPS(g)->tmap_encode(g, s, &d, map), PPN_EUNSUPPORTED);
        } else {
            assert_int_equal(OPS(g)->tmap_encode(g, s, &d, map), PPN_OK);
            ppn_tmap_desc back;
            assert_true(ppn_tmap_sim_decode(map, &back));
            assert_true(back.base == d.base && back.elem_bytes == d.elem_bytes && back.dim[0] == d.dim[0] &&
                        back.dim[1] == d.dim[1] && back.row_bytes == d.row_bytes && back.box[0] == d.box[0] &&
                        back.box[1] == d.box[1]);
            d.row_bytes = C * 4 - 16; /* shorter than a row: the driver refuses it, so does the sim */
            assert_int_equal(OPS(g)->tmap_encode(g, s, &d, map), PPN_EINVAL);
            assert_non_null(strstr(ppn_last_error(), "row_bytes"));
            assert_int_equal(OPS(g)->tmap_encode(g, s, &d, map + 8), PPN_EINVAL); /* not 64-byte aligned */
        }
        assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
        assert_no_reports(g);
        ppn_gpu_close(g);
    }
    assert_memory_equal(out[0], out[1], (size_t)M * R * 4);
    tu_env_set("PPN_TMA", "2"); /* level 2: the middle tile's TMA kernels too (ops_gemm.c) */
    ppn_gpu *g = NULL;
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    tu_env_restore();
    ppn_gstream *s2 = tu_stream(g, 0);
    assert_int_equal(OPS(g)->tma_ok(g, s2), 2);
    assert_int_equal(OPS(g)->stream_destroy(g, s2), PPN_OK);
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_TMA", "3"); /* level 3: gemm_tc_k16t alone of the split-K tiles' TMA forms (ops_gemm.c) */
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    tu_env_restore();
    s2 = tu_stream(g, 0);
    assert_int_equal(OPS(g)->tma_ok(g, s2), 3);
    assert_int_equal(OPS(g)->stream_destroy(g, s2), PPN_OK);
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_TMA", "4");
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_EINVAL);
    tu_env_restore();
    assert_non_null(strstr(ppn_last_error(), "PPN_TMA"));
    /* PPN_GEMM_W: gemm_tc_w's level (ops_gemm.c), 4 unless set; a value the door does not take is refused by name */
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    assert_int_equal(g->gemm_w, 4);
    ppn_gpu_close(g);
    g = NULL;
    static const char *const good_w[] = {"2", "3"};
    for (size_t i = 0; i < sizeof good_w / sizeof good_w[0]; i++) {
        tu_env_set("PPN_GEMM_W", good_w[i]);
        assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
        tu_env_restore();
        assert_int_equal(g->gemm_w, good_w[i][0] - '0');
        ppn_gpu_close(g);
        g = NULL;
    }
    static const char *const bad_w[] = {"5", "-1", "x", "1.5"};
    for (size_t i = 0; i < sizeof bad_w / sizeof bad_w[0]; i++) {
        tu_env_set("PPN_GEMM_W", bad_w[i]);
        assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_EINVAL);
        tu_env_restore();
        assert_null(g);
        assert_non_null(strstr(ppn_last_error(), "PPN_GEMM_W"));
    }
    /* PPN_GEMM_W_SWIGLU: gate|up on gemm_swiglu_w, 2 unless set; 0 and 1 taken; anything else refused by name */
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    assert_int_equal(g->gemm_w_swiglu, 2);
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_GEMM_W_SWIGLU", "0");
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    tu_env_restore();
    assert_int_equal(g->gemm_w_swiglu, 0);
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_GEMM_W_SWIGLU", "1");
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    tu_env_restore();
    assert_int_equal(g->gemm_w_swiglu, 1);
    ppn_gpu_close(g);
    g = NULL;
    static const char *const bad_sw[] = {"3", "-1", "on"};
    for (size_t i = 0; i < sizeof bad_sw / sizeof bad_sw[0]; i++) {
        tu_env_set("PPN_GEMM_W_SWIGLU", bad_sw[i]);
        assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_EINVAL);
        tu_env_restore();
        assert_null(g);
        assert_non_null(strstr(ppn_last_error(), "PPN_GEMM_W_SWIGLU"));
    }
    free(out[0]), free(out[1]), free(x), free(want), free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_stream_order),
        cmocka_unit_test(test_sim_device_info_and_capacity),
        cmocka_unit_test(test_sim_event_orders_streams),
        cmocka_unit_test(test_sim_event_orders_devices),
        cmocka_unit_test(test_sim_peer_copies_and_grants),
        cmocka_unit_test(test_sim_wait_binds_to_earlier_record),
        cmocka_unit_test(test_sim_race_without_event_is_reported),
        cmocka_unit_test(test_sim_racy_write_keeps_what_it_raced_with),
        cmocka_unit_test(test_sim_race_with_event_is_clean),
        cmocka_unit_test(test_sim_wait_uses_the_bound_record),
        cmocka_unit_test(test_sim_event_chains_are_transitive),
        cmocka_unit_test(test_sim_host_sync_orders_work),
        cmocka_unit_test(test_sim_reuse_without_wait_is_a_race),
        cmocka_unit_test(test_sim_placement_needs_peer_enable),
        cmocka_unit_test(test_sim_use_after_free_of_block),
        cmocka_unit_test(test_sim_use_after_free_of_raw),
        cmocka_unit_test(test_sim_double_free_is_reported),
        cmocka_unit_test(test_sim_access_outside_a_block),
        cmocka_unit_test(test_sim_fault_injection),
        cmocka_unit_test(test_sim_fault_injection_every_kind),
        cmocka_unit_test(test_sim_invalid_environment_is_refused),
        cmocka_unit_test(test_sim_elapsed_and_latency_model),
        cmocka_unit_test(test_sim_copy_model_account),
        cmocka_unit_test(test_sim_launch_model_account),
        cmocka_unit_test(test_sim_graph_capture_and_replay),
        cmocka_unit_test(test_sim_graph_replay_is_checked),
        cmocka_unit_test(test_sim_close_with_everything_alive),
        cmocka_unit_test(test_sim_tma_gemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
