/* test_hazards.c - the planted-hazard suite (issue 14): one case per hazard class the sim checker must report,
 * each planted on purpose (in the test itself, or through a test-only switch of the test build) and each
 * expected to produce its own report: the status, the count of its kind and the words of its message. Where a
 * case has a correct twin (the same program without the hazard), the twin must be clean, so a checker that
 * reports everything fails too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "alloc/pool.h"
#include "core/device/gpu.h"
#include "core/rt.h"
#include "kernels/ktable.h"
#include "transport/boundary.h"
#include "tests/util/tdev.h"
#include "tests/util/tutil.h"

#define OPS(g) ((g)->ops)

static ppn_gpu *open_sim(void)
{
    ppn_gpu *g = NULL;
    assert_int_equal(ppn_gpu_sim_create(ppn_kernel_set(), &g), PPN_OK);
    return g;
}

static struct ppn_sim_counts counts(ppn_gpu *g)
{
    struct ppn_sim_counts c;
    ppn_gpu_sim_counts(g, &c);
    return c;
}

static uint64_t total(struct ppn_sim_counts c)
{
    return c.race + c.placement + c.use_after_free + c.double_free + c.bounds + c.stale + c.undeclared;
}

/* The backend's sticky report must be st and contain every word of the NULL-terminated list. */
static void expect_report(ppn_gpu *g, ppn_status st, ...)
{
    char msg[1024] = "";
    ppn_status got = ppn_gpu_sim_take_error(g, msg, sizeof msg);
    if (got != st) fail_msg("expected %s, got %s: %s", ppn_status_name(st), ppn_status_name(got), msg);
    va_list ap;
    va_start(ap, st);
    for (const char *w; (w = va_arg(ap, const char *));)
        if (!strstr(msg, w)) fail_msg("'%s' not found in the report: %s", w, msg);
    va_end(ap);
}

static void expect_clean(ppn_gpu *g)
{
    char msg[1024] = "";
    ppn_status st = ppn_gpu_sim_take_error(g, msg, sizeof msg);
    if (st != PPN_OK) fail_msg("unexpected report: %s", msg);
    assert_int_equal(total(counts(g)), 0);
}

/* ---- device memory: the requested size, generations ----------------------------------------------------- */

/* A pool slot of 1000 B sits in a 1024 B block: one byte past the 1000 is reported, the 1000 are fine. */
static void test_hazard_off_by_one_of_a_non_power_of_two_slot(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *s = tu_stream(g, 0);
        ppn_pool *p = NULL;
        assert_int_equal(ppn_pool_create(g, 0, 0, &p), PPN_OK);
        ppn_dptr slot;
        assert_int_equal(ppn_pool_alloc(p, 1000, s, "boundary slot", &slot), PPN_OK);
        unsigned char h[1001];
        memset(h, 7, sizeof h);
        assert_int_equal(OPS(g)->copy_htod(g, s, slot, h, 1000 + (size_t)planted), PPN_OK);
        OPS(g)->stream_sync(g, s);
        if (planted) {
            expect_report(g, PPN_EBOUNDS, "ACCESS OUTSIDE A BLOCK", "copy htod", "1 B past the 1000 B requested",
                          "'boundary slot'", NULL);
            assert_int_equal(counts(g).bounds, 1);
        } else {
            expect_clean(g);
        }
        assert_int_equal(ppn_pool_free(p, slot, s), PPN_OK);
        OPS(g)->stream_sync(g, s);
        ppn_pool_destroy(p);
        ppn_gpu_close(g);
    }
}

/* A pointer kept past its free, used after the block went to a new owner on the same stream (stream order makes
 * it no race, and the block is live again, so no use after free either): reported as stale. */
static void test_hazard_stale_pointer_into_a_reused_block(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *s = tu_stream(g, 0);
        ppn_pool *p = NULL;
        assert_int_equal(ppn_pool_create(g, 0, 0, &p), PPN_OK);
        ppn_dptr old, cur;
        assert_int_equal(ppn_pool_alloc(p, 4096, s, "act", &old), PPN_OK);
        assert_int_equal(tu_fill(g, s, old, 1, 1024), PPN_OK);
        assert_int_equal(ppn_pool_free(p, old, s), PPN_OK);
        assert_int_equal(ppn_pool_alloc(p, 4096, s, "kv", &cur), PPN_OK);
        assert_true(ppn_gpu_sim_canonical(g, old) == ppn_gpu_sim_canonical(g, cur)); /* the same memory */
        assert_int_equal(tu_fill(g, s, planted ? old : cur, 2, 1024), PPN_OK);
        OPS(g)->stream_sync(g, s);
        if (planted) {
            expect_report(g, PPN_EUSEAFTERFREE, "STALE POINTER", "'kv'", "kernel ppn_k_fill",
                          "earlier allocation of the block", NULL);
            assert_int_equal(counts(g).stale, 1);
            assert_int_equal(counts(g).use_after_free, 0);
        } else {
            expect_clean(g);
        }
        assert_int_equal(ppn_pool_free(p, cur, s), PPN_OK);
        OPS(g)->stream_sync(g, s);
        ppn_pool_destroy(p);
        ppn_gpu_close(g);
    }
}


/* ---- launches confined to what they declare ------------------------------------------------------------------- */

/* A fill kernel that writes one word more than its launch declares (the declaration says 250 words, the params
 * 251), into a 1000 B slot of a 1024 B block: the write lands in the guard bytes, found when the block's free
 * executes. With the params saying 250 it is clean. */
static void test_hazard_undeclared_write_by_a_kernel(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *s = tu_stream(g, 0);
        ppn_pool *p = NULL;
        assert_int_equal(ppn_pool_create(g, 0, 0, &p), PPN_OK);
        ppn_dptr slot;
        assert_int_equal(ppn_pool_alloc(p, 1000, s, "act", &slot), PPN_OK);
        ppn_kp_fill kp;
        ppn_launch l = tu_launch_fill(&kp, slot, 9, 250); /* declares 1000 B */
        kp.n = 250 + planted;                             /* writes 1000 or 1004 B */
        assert_int_equal(OPS(g)->launch(g, s, &l), PPN_OK);
        assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK); /* the write itself is not seen */
        /* the report is made when the free executes: the pool's event record after it may already return it */
        ppn_status fst = ppn_pool_free(p, slot, s);
        assert_true(fst == PPN_OK || (planted && fst == PPN_EBOUNDS));
        OPS(g)->stream_sync(g, s);
        if (planted) {
            expect_report(g, PPN_EBOUNDS, "UNDECLARED WRITE", "'act'", "4 byte(s) past its 1000 B",
                          "the first at +1000 B", "kernel ppn_k_fill", NULL);
            assert_int_equal(counts(g).undeclared, 1);
        } else {
            expect_clean(g);
        }
        ppn_pool_destroy(p);
        ppn_gpu_close(g);
    }
}

/* The same past a raw allocation's size (found when it is freed). */
static void test_hazard_undeclared_write_past_a_raw_allocation(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr x = tu_dalloc(g, 0, 1000);
    ppn_kp_fill kp;
    ppn_launch l = tu_launch_fill(&kp, x, 9, 250);
    kp.n = 251;
    assert_int_equal(OPS(g)->launch(g, s, &l), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, x), PPN_OK);
    expect_report(g, PPN_EBOUNDS, "UNDECLARED WRITE", "[1000 B, raw]", "when the allocation was freed", NULL);
    assert_int_equal(counts(g).undeclared, 1);
    ppn_gpu_close(g);
}

/* A block handed out through mem_issue and then annotated again without it (as tests that annotate by hand do) has
 * no guard any more: writing all of it is not an undeclared write. */
static void test_hazard_guard_only_for_issued_generations(void **state)
{
    (void)state;
    ppn_gpu *g = open_sim();
    ppn_gstream *s = tu_stream(g, 0);
    ppn_dptr slab = tu_dalloc(g, 0, 1 << 16), user;
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 1 << 16, PPN_ANN_CARVE, "slab"), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 4096, PPN_ANN_ALLOC, "a"), PPN_OK);
    assert_int_equal(OPS(g)->mem_issue(g, 0, slab, 1000, &user), PPN_OK);
    assert_int_equal(tu_fill(g, s, user, 1, 250), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, s, 0, user, 4096, PPN_ANN_FREE, NULL), PPN_OK);
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->mem_annotate(g, NULL, 0, slab, 4096, PPN_ANN_ALLOC, "b"), PPN_OK);
    assert_int_equal(tu_fill(g, s, slab, 2, 1024), PPN_OK); /* the whole block, through its own address */
    assert_int_equal(OPS(g)->stream_sync(g, s), PPN_OK);
    assert_int_equal(OPS(g)->mem_free(g, 0, slab), PPN_OK);
    expect_clean(g);
    ppn_gpu_close(g);
}

/* ---- pinned host memory -------------------------------------------------------------------------------------- */

/* The readback pattern: a dtoh into pinned memory, the host reads it. Read before the sync: reported, whichever of
 * the two runs first in real time (the copy is held back by a gate here, so the read comes first). */
typedef struct gate {
    pthread_mutex_t m;
    pthread_cond_t c;
    int open;
} gate;

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

static void test_hazard_pinned_readback_before_the_sync(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *s = tu_stream(g, 0);
        ppn_dptr logits = tu_dalloc(g, 0, 4096);
        float *h = NULL;
        assert_int_equal(OPS(g)->host_alloc(g, 1 << 16, (void **)&h), PPN_OK);
        gate gt = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
        assert_int_equal(OPS(g)->host_fn(g, s, gate_wait, &gt), PPN_OK);
        assert_int_equal(tu_fill(g, s, logits, 5, 1024), PPN_OK);
        assert_int_equal(OPS(g)->copy_dtoh(g, s, h + 64, logits, 4096), PPN_OK);
        if (planted) OPS(g)->host_access(g, h + 64, 4096, PPN_ACC_R, "logits readback"); /* no sync yet */
        gate_open(&gt);
        OPS(g)->stream_sync(g, s);
        if (!planted) {
            OPS(g)->host_access(g, h + 64, 4096, PPN_ACC_R, "logits readback");
            assert_int_equal(((uint32_t *)h)[64], 5);
            expect_clean(g);
        } else {
            expect_report(g, PPN_ERACE, "RACE on pinned host range", "copy dtoh", "host read of logits readback",
                          NULL);
            assert_int_equal(counts(g).race, 1);
        }
        assert_int_equal(OPS(g)->host_free(g, h, 1 << 16), PPN_OK);
        ppn_gpu_close(g);
    }
}

/* A host copy declares its host side too: an htod reading pinned memory another stream's dtoh writes, with no
 * event between them, is a race on the pinned range (the host-staged boundary's pattern, at the device layer). */
static void test_hazard_host_copies_declare_both_ends(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 1);
        ppn_gevent *e = tu_event(g, 0, 0);
        ppn_dptr x = tu_dalloc(g, 0, 1024), y = tu_dalloc(g, 1, 1024);
        void *stage = NULL;
        assert_int_equal(OPS(g)->host_alloc(g, 4096, &stage), PPN_OK);
        assert_int_equal(tu_fill(g, a, x, 3, 256), PPN_OK);
        assert_int_equal(OPS(g)->copy_dtoh(g, a, stage, x, 1024), PPN_OK);
        assert_int_equal(OPS(g)->event_record(g, e, a), PPN_OK);
        if (!planted) assert_int_equal(OPS(g)->stream_wait_event(g, b, e), PPN_OK);
        assert_int_equal(OPS(g)->copy_htod(g, b, y, stage, 1024), PPN_OK);
        OPS(g)->stream_sync(g, a);
        OPS(g)->stream_sync(g, b);
        if (planted) {
            expect_report(g, PPN_ERACE, "RACE on pinned host range", "copy", NULL);
            assert_true(counts(g).race >= 1);
        } else {
            uint32_t w[256];
            tu_download(g, b, w, y, sizeof w);
            assert_int_equal(w[255], 3);
            expect_clean(g);
        }
        assert_int_equal(OPS(g)->host_free(g, stage, 4096), PPN_OK);
        ppn_gpu_close(g);
    }
}

/* A host function declares what it touches too (host_access inside it is an access of its op): reading pinned
 * memory that a dtoh of another stream writes, with no event between them, is a race; on the dtoh's own stream,
 * after it, it is clean. */
typedef struct hostfn_arg {
    ppn_gpu *g;
    const uint32_t *h;
    uint32_t seen;
} hostfn_arg;

static void hostfn_reader(void *arg)
{
    hostfn_arg *a = arg;
    OPS(a->g)->host_access(a->g, a->h, 1024, PPN_ACC_R, "staged rows");
    a->seen = 1;
}

static void test_hazard_host_function_access(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_gpu *g = open_sim();
        ppn_gstream *a = tu_stream(g, 0), *b = tu_stream(g, 0);
        ppn_dptr x = tu_dalloc(g, 0, 1024);
        uint32_t *h = NULL;
        assert_int_equal(OPS(g)->host_alloc(g, 4096, (void **)&h), PPN_OK);
        assert_int_equal(tu_fill(g, a, x, 4, 256), PPN_OK);
        assert_int_equal(OPS(g)->copy_dtoh(g, a, h, x, 1024), PPN_OK);
        hostfn_arg arg = {g, h, 0};
        assert_int_equal(OPS(g)->host_fn(g, planted ? b : a, hostfn_reader, &arg), PPN_OK);
        OPS(g)->stream_sync(g, a);
        OPS(g)->stream_sync(g, b);
        assert_int_equal(arg.seen, 1);
        if (planted) {
            expect_report(g, PPN_ERACE, "RACE on pinned host range", "op #1 host fn read staged rows", NULL);
        } else {
            expect_clean(g);
        }
        assert_int_equal(OPS(g)->host_free(g, h, 4096), PPN_OK);
        ppn_gpu_close(g);
    }
}

/* ---- the runtime: upload staging, host-staged boundary, destroy and publish in flight -------------------------- */

static ppn_rt *rt_with(const char *var, const char *val)
{
    ppn_rt *r = NULL;
    if (var) tu_env_set(var, val);
    ppn_status st = ppn_rt_create("sim", &r);
    tu_env_restore();
    assert_int_equal(st, PPN_OK);
    return r;
}

static ppn_load_opts opts_for(const ppn_door *d)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    o.door = d;
    return o;
}

static ppn_door door_devs(int n, const int *devs)
{
    ppn_door d = ppn_door_default();
    d.n_stages = n;
    if (devs) {
        d.n_devices = n;
        memcpy(d.devices, devs, sizeof(int) * (size_t)n);
    }
    return d;
}

/* Refilling a pinned staging buffer before the copy out of it is done (upload.c's event wait skipped). */
static void test_hazard_upload_staging_refilled_without_its_wait(void **state)
{
    (void)state;
    ppn_rt *r = rt_with(NULL, NULL);
    ppn_load_opts o = opts_for(NULL);
    ppn_model *m = NULL;
    ppn_upload_test_skip_staging_wait(1);
    ppn_status st = ppn_model_load(r, tu_fixture("hf/llama-tiny"), &o, &m);
    ppn_upload_test_skip_staging_wait(0);
    assert_int_equal(st, PPN_ERACE);
    const char *msg = ppn_last_error();
    if (!strstr(msg, "upload staging") || !strstr(msg, "pinned host range") || !strstr(msg, "copy htod"))
        fail_msg("not the staging refill race: %s", msg);
    assert_null(m);
    ppn_rt_destroy(r);
    /* the twin, with the wait: loads clean */
    r = rt_with(NULL, NULL);
    m = tu_model_load(r, tu_fixture("hf/llama-tiny"), &o);
    ppn_model_free(m);
    ppn_rt_destroy(r);
}

/* A host-staged boundary (no peer access: PPN_SIM_PEER=none) with the consumer's wait removed: its htod out of the
 * pinned slot is unordered with the producer's dtoh into it. */
static void test_hazard_host_staged_boundary_without_the_consumer_wait(void **state)
{
    (void)state;
    ppn_rt *r = rt_with("PPN_SIM_PEER", "none");
    int devs[2] = {0, 1};
    ppn_door d = door_devs(2, devs);
    ppn_load_opts o = opts_for(&d);
    ppn_model *m = tu_model_load(r, tu_fixture("hf/llama-tiny"), &o);
    ppn_stage_info si;
    ppn_model_get_stage_map(m, &si);
    assert_string_equal(ppn_transport_name(si.xport[0]), "host");
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    ppn_status st = PPN_OK;
    float x[256];
    for (int t = 0; t < 4 && st == PPN_OK; t++) st = ppn_decode_step(q, 3 + t, x); /* the twin: clean */
    assert_int_equal(st, PPN_OK);
    ppn_boundary_test_skip_recv_wait(1);
    /* with a clock per host thread (the default) the first unordered pair is reported whatever the timing; the
     * steps are for the shared clock (PPN_SIM_THREAD_CLOCKS=0), where a sync elsewhere can order a pair by chance
     * (as test_pipeline's device-slot case does) */
    for (int t = 0; t < 48 && st == PPN_OK; t++) {
        ppn_step_id p;
        st = ppn_decode_step_deferred(q, 3 + t, &p);
        if (st == PPN_OK) st = ppn_pending_wait(q, p, NULL);
    }
    ppn_boundary_test_skip_recv_wait(0);
    assert_int_equal(st, PPN_ERACE);
    const char *msg = ppn_last_error();
    if (!strstr(msg, "pinned host range") || !strstr(msg, "copy"))
        fail_msg("not the host-staged slot race: %s", msg);
    ppn_seq_destroy(q);
    ppn_model_free(m);
    ppn_rt_destroy(r);
}

/* Steps in flight when the sequence is destroyed: with its syncs the frees are ordered after them; without (test-only
 * switches: the stream syncs, and the drop's waits for the steps' done events), the first free races with a step
 * still running on a stage stream. */
static void test_hazard_seq_destroy_with_steps_in_flight(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_rt *r = rt_with(NULL, NULL);
        ppn_door d = door_devs(2, NULL);
        ppn_load_opts o = opts_for(&d);
        ppn_model *m = tu_model_load(r, tu_fixture("hf/llama-tiny"), &o);
        ppn_seq *q = NULL;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        ppn_step_id p[4];
        for (int t = 0; t < 4; t++) assert_int_equal(ppn_decode_step_deferred(q, 3 + t, &p[t]), PPN_OK);
        ppn_seq_test_skip_destroy_syncs(planted);
        ppn_seq_test_skip_drop_syncs(planted);
        ppn_seq_destroy(q); /* four steps in flight */
        ppn_seq_test_skip_destroy_syncs(0);
        ppn_seq_test_skip_drop_syncs(0);
        ppn_gpu *g = r->g;
        if (planted) {
            char msg[1024] = "";
            ppn_status st = ppn_gpu_sim_take_error(g, msg, sizeof msg);
            /* the frees come right after the last step was issued: the pool's free of a block a step uses */
            if (st == PPN_OK) { /* the report comes when the free executes: wait for every stream */
                ppn_model_free(m); /* its teardown syncs every stream */
                st = ppn_gpu_sim_take_error(g, msg, sizeof msg);
                m = NULL;
            }
            assert_int_equal(st, PPN_ERACE);
            if (!strstr(msg, "free")) fail_msg("not a race with a free: %s", msg);
        } else {
            ppn_model_free(m);
            m = NULL;
            expect_clean(g);
        }
        ppn_model_free(m);
        ppn_rt_destroy(r);
    }
}

/* A sequence reset with steps in flight: the next step reserves blocks and writes their ids into the pinned KV
 * block table where a dropped step's copy of the table (each stage's, before its walk) read the old ones. The drop
 * waits for the dropped steps' done events, so the rewrite is ordered after those copies; without that wait
 * (test-only switch), the host write races with the copy, whether the copy has run yet or not. */
static void test_hazard_kv_table_rewritten_under_a_dropped_step(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_rt *r = rt_with(NULL, NULL);
        int devs[2] = {0, 1};
        ppn_door d = door_devs(2, devs);
        ppn_load_opts o = opts_for(&d);
        ppn_model *m = tu_model_load(r, tu_fixture("hf/llama-tiny"), &o);
        ppn_seq *q = NULL;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        ppn_step_id p[PPN_MAX_INFLIGHT];
        for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_step_deferred(q, 3 + t, &p[t]), PPN_OK);
        ppn_seq_test_skip_drop_syncs(planted);
        ppn_status st = ppn_seq_reset(q); /* the steps dropped, their blocks back in the pool */
        ppn_seq_test_skip_drop_syncs(0);
        assert_int_equal(st, PPN_OK);
        float x[256];
        st = ppn_decode_step(q, 7, x); /* block 0 again: its id written where the first step's copies read */
        ppn_gpu *g = r->g;
        char msg[1024] = "";
        ppn_status rep = ppn_gpu_sim_take_error(g, msg, sizeof msg);
        if (planted) {
            if (rep != PPN_ERACE) fail_msg("expected a race, got %s (step: %s): %s", ppn_status_name(rep),
                                           ppn_status_name(st), msg);
            if (!strstr(msg, "RACE on pinned host range") || !strstr(msg, "KV block table") || !strstr(msg, "copy htod"))
                fail_msg("not the block table's rewrite: %s", msg);
            assert_true(counts(g).race >= 1);
        } else {
            assert_int_equal(st, PPN_OK);
            if (rep != PPN_OK) fail_msg("unexpected report: %s", msg);
            assert_int_equal(total(counts(g)), 0);
        }
        ppn_seq_destroy(q);
        ppn_model_free(m);
        ppn_rt_destroy(r);
    }
}

/* A map published with steps in flight: quiesce's syncs order the old map's work before its boundaries and scratch
 * are freed; without them (test-only switch), a free races with the old map's last steps. */
static void test_hazard_publish_with_steps_in_flight(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        ppn_rt *r = rt_with(NULL, NULL);
        ppn_door d = door_devs(3, NULL);
        ppn_load_opts o = opts_for(&d);
        ppn_model *m = tu_model_load(r, tu_fixture("hf/llama-tiny"), &o);
        ppn_seq *q = NULL;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        ppn_step_id p[4];
        for (int t = 0; t < 4; t++) assert_int_equal(ppn_decode_step_deferred(q, 3 + t, &p[t]), PPN_OK);
        ppn_door two = door_devs(2, NULL);
        ppn_map_test_skip_quiesce_syncs(planted);
        ppn_status st = ppn_model_publish_door(m, &two);
        ppn_map_test_skip_quiesce_syncs(0);
        ppn_gpu *g = r->g;
        char msg[1024] = "";
        if (st == PPN_OK) {
            ppn_seq_destroy(q); /* its syncs: every stream of the new map and the readback stream */
            q = NULL;
            ppn_model_free(m);
            m = NULL;
        }
        ppn_status rep = ppn_gpu_sim_take_error(g, msg, sizeof msg);
        if (planted) {
            if (rep != PPN_ERACE) fail_msg("expected a race, got %s (publish: %s): %s", ppn_status_name(rep),
                                           ppn_status_name(st), msg);
            if (!strstr(msg, "free")) fail_msg("not a race with a free: %s", msg);
        } else {
            assert_int_equal(st, PPN_OK);
            if (rep != PPN_OK) fail_msg("unexpected report: %s", msg);
        }
        ppn_seq_destroy(q);
        ppn_model_free(m);
        ppn_rt_destroy(r);
    }
}

/* ---- the synchronous many-rows walks: tokens written into pinned staging, ids read back ----------------------- */

/* One stage of llama-tiny, two sequences primed (clean) with a short prompt; every path below run once (clean)
 * so that what each allocates lazily is allocated before the planted call. */
typedef struct walks {
    ppn_rt *r;
    ppn_model *m;
    ppn_seq *q[2];
} walks;

enum walk_path { WALK_PREFILL, WALK_BATCH, WALK_VERIFY };

static const char *const walk_name[] = {"prefill", "batch", "verify"};

/* The path's call on w's sequences: a prefill of 2 ids, a batch of 2 rows with their ids, a verify of 2 drafts. */
static ppn_status walk_run(walks *w, enum walk_path path)
{
    int toks[2] = {3, 4}, ids[2], out[3], n_out;
    if (path == WALK_PREFILL) return ppn_prefill(w->q[0], toks, 2, NULL, NULL);
    if (path == WALK_BATCH) return ppn_decode_batch_ex(w->q, toks, 2, NULL, NULL, ids);
    return ppn_spec_verify(w->q[0], 5, toks, 2, out, &n_out);
}

static walks walks_open(void)
{
    walks w = {rt_with(NULL, NULL), NULL, {NULL, NULL}};
    ppn_load_opts o = opts_for(NULL);
    w.m = tu_model_load(w.r, tu_fixture("hf/llama-tiny"), &o);
    int prompt[2] = {1, 2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ppn_seq_create(w.m, &w.q[i]), PPN_OK);
        assert_int_equal(ppn_prefill(w.q[i], prompt, 2, NULL, NULL), PPN_OK);
    }
    for (int path = WALK_PREFILL; path <= WALK_VERIFY; path++) assert_int_equal(walk_run(&w, path), PPN_OK);
    expect_clean(w.r->g);
    return w;
}

static void walks_close(walks *w)
{
    for (int i = 0; i < 2; i++) ppn_seq_destroy(w->q[i]); /* its syncs: every stream */
    assert_int_equal(ppn_model_free(w->m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(w->r), PPN_OK);
}

/* Every stream of w's model drained, so a copy that runs after the host's access in real time has been checked
 * (a report makes every sync fail: the report is taken after). */
static void walks_settle(walks *w)
{
    ppn_gpu *g = w->r->g;
    for (int s = 0; s < w->m->map->n_stages; s++) (void)OPS(g)->stream_sync(g, w->m->stages[s].stream);
    (void)OPS(g)->stream_sync(g, w->m->rb_stream);
}

/* The report after a planted walk: a race on the pinned range between the host's access (how: "read" or
 * "write", of what) and the walk's copy (copy: "copy dtoh" or "copy htod"), whichever ran first. */
static void expect_pinned_race(walks *w, ppn_status call, const char *how, const char *what, const char *copy)
{
    ppn_gpu *g = w->r->g;
    walks_settle(w);
    char msg[1024] = "", host[96];
    ppn_status rep = ppn_gpu_sim_take_error(g, msg, sizeof msg);
    snprintf(host, sizeof host, "host %s of %s", how, what);
    if (rep != PPN_ERACE)
        fail_msg("expected a race, got %s (call: %s): %s", ppn_status_name(rep), ppn_status_name(call), msg);
    if (!strstr(msg, "RACE on pinned host range") || !strstr(msg, host) || !strstr(msg, copy))
        fail_msg("not the race of the %s with a %s: %s", host, copy, msg);
    assert_true(counts(g).race >= 1);
}

/* A batch's and a verify's ids are read once the walk is waited: with the device half of that wait removed
 * (test-only switch), the host reads them while the last stage's copy into them may not have run. */
static void test_hazard_walk_ids_read_before_the_walk_has_run(void **state)
{
    (void)state;
    static const char *const what[] = {[WALK_BATCH] = "batch ids readback", [WALK_VERIFY] = "verify ids readback"};
    for (int path = WALK_BATCH; path <= WALK_VERIFY; path++)
        for (int planted = 0; planted < 2; planted++) {
            walks w = walks_open();
            ppn_pend_test_skip_wait_syncs(planted);
            ppn_status st = walk_run(&w, path);
            ppn_pend_test_skip_wait_syncs(0);
            if (planted) {
                expect_pinned_race(&w, st, "read", what[path], "copy dtoh");
            } else {
                if (st != PPN_OK) fail_msg("%s: %s", walk_name[path], ppn_last_error());
                walks_settle(&w);
                expect_clean(w.r->g);
            }
            walks_close(&w);
        }
}

/* The tokens of a prefill, a batch and a verify are written into pinned staging before the walk is issued; the
 * memory comes from the pinned arena, where the last call's walk copied its tokens out of the same bytes. That
 * call's wait orders its copy before the write; with the device half of the wait removed (test-only switch, on
 * the prefill before), the write races with the copy. */
static void test_hazard_walk_tokens_written_under_the_last_walk(void **state)
{
    (void)state;
    static const char *const what[] = {"prefill tokens", "batch tokens", "verify tokens"};
    for (int path = WALK_PREFILL; path <= WALK_VERIFY; path++)
        for (int planted = 0; planted < 2; planted++) {
            walks w = walks_open();
            ppn_pend_test_skip_wait_syncs(planted);
            ppn_status st = walk_run(&w, WALK_PREFILL); /* the last owner of the tokens' pinned bytes */
            ppn_pend_test_skip_wait_syncs(0);
            assert_int_equal(st, PPN_OK);
            st = walk_run(&w, path);
            if (planted) {
                expect_pinned_race(&w, st, "write", what[path], "copy htod");
            } else {
                if (st != PPN_OK) fail_msg("%s: %s", walk_name[path], ppn_last_error());
                walks_settle(&w);
                expect_clean(w.r->g);
            }
            walks_close(&w);
        }
}

/* ---- host threads ---------------------------------------------------------------------------------------------- */

typedef struct reader {
    ppn_gpu *g;
    ppn_gstream *writer, *own;
    ppn_dptr x;
    int sync_first; /* the twin: this thread syncs the writer's stream itself */
    uint32_t got;
} reader;

static void *reader_main(void *arg)
{
    reader *r = arg;
    if (r->sync_first) assert_int_equal(OPS(r->g)->stream_sync(r->g, r->writer), PPN_OK);
    uint32_t h[256];
    OPS(r->g)->copy_dtoh(r->g, r->own, h, r->x, sizeof h);
    OPS(r->g)->stream_sync(r->g, r->own);
    r->got = h[255];
    return NULL;
}

/* The main thread syncs the writer's stream, then starts a thread that reads the data on another stream with no
 * event: ordered only by the thread's creation, which the checker does not see. With a clock per host thread
 * (the default) that is reported every time, though the sync came first in real time; with the one shared clock
 * (the opt-out, PPN_SIM_THREAD_CLOCKS=0) it is not (the sync was first here; in general it depends on timing). The
 * reader syncing the writer's stream itself is clean in both. */
static void test_hazard_two_threads_ordered_only_by_host_means(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) { /* 0: thread clocks, planted; 1: thread clocks, twin; 2: shared */
        tu_env_set("PPN_SIM_THREAD_CLOCKS", mode < 2 ? "1" : "0");
        ppn_gpu *g = open_sim();
        tu_env_restore();
        reader r = {g, tu_stream(g, 0), tu_stream(g, 0), tu_dalloc(g, 0, 1024), mode == 1, 0};
        assert_int_equal(tu_fill(g, r.writer, r.x, 6, 256), PPN_OK);
        assert_int_equal(OPS(g)->stream_sync(g, r.writer), PPN_OK);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, reader_main, &r), 0);
        pthread_join(th, NULL);
        if (mode == 0) {
            expect_report(g, PPN_ERACE, "RACE on allocation", "copy dtoh", "kernel ppn_k_fill", NULL);
            assert_int_equal(counts(g).race, 1);
        } else {
            assert_int_equal(r.got, 6);
            expect_clean(g);
        }
        ppn_gpu_close(g);
    }
}

typedef struct handed {
    ppn_gpu *g;
    ppn_gstream *own;
    ppn_dptr x;
    _Atomic int posted;
    uint32_t got;
} handed;

static void *adopter_main(void *arg)
{
    handed *h = arg;
    while (!atomic_load(&h->posted)) sched_yield(); /* the host means: a flag */
    OPS(h->g)->host_acquire(h->g, &h->posted);
    uint32_t w[256];
    OPS(h->g)->copy_dtoh(h->g, h->own, w, h->x, sizeof w);
    OPS(h->g)->stream_sync(h->g, h->own);
    h->got = w[255];
    return NULL;
}

/* With a clock per thread, a hand-off by host means is declared with host_release / host_acquire: the thread
 * that acquires is ordered after what the releasing thread had synced. Without the acquire, it is reported. */
static void test_hazard_host_handoff_declared(void **state)
{
    (void)state;
    for (int planted = 0; planted < 2; planted++) {
        tu_env_set("PPN_SIM_THREAD_CLOCKS", "1");
        ppn_gpu *g = open_sim();
        tu_env_restore();
        ppn_gstream *w = tu_stream(g, 0);
        handed h = {g, tu_stream(g, 0), tu_dalloc(g, 0, 1024), 0, 0};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, adopter_main, &h), 0);
        assert_int_equal(tu_fill(g, w, h.x, 8, 256), PPN_OK);
        assert_int_equal(OPS(g)->stream_sync(g, w), PPN_OK);
        if (!planted) OPS(g)->host_release(g, &h.posted);
        atomic_store(&h.posted, 1);
        pthread_join(th, NULL);
        if (planted) {
            expect_report(g, PPN_ERACE, "copy dtoh", "kernel ppn_k_fill", NULL);
        } else {
            assert_int_equal(h.got, 8);
            expect_clean(g);
        }
        ppn_gpu_close(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hazard_off_by_one_of_a_non_power_of_two_slot),
        cmocka_unit_test(test_hazard_stale_pointer_into_a_reused_block),
        cmocka_unit_test(test_hazard_undeclared_write_by_a_kernel),
        cmocka_unit_test(test_hazard_undeclared_write_past_a_raw_allocation),
        cmocka_unit_test(test_hazard_guard_only_for_issued_generations),
        cmocka_unit_test(test_hazard_pinned_readback_before_the_sync),
        cmocka_unit_test(test_hazard_host_copies_declare_both_ends),
        cmocka_unit_test(test_hazard_host_function_access),
        cmocka_unit_test(test_hazard_two_threads_ordered_only_by_host_means),
        cmocka_unit_test(test_hazard_host_handoff_declared),
        cmocka_unit_test(test_hazard_upload_staging_refilled_without_its_wait),
        cmocka_unit_test(test_hazard_host_staged_boundary_without_the_consumer_wait),
        cmocka_unit_test(test_hazard_seq_destroy_with_steps_in_flight),
        cmocka_unit_test(test_hazard_kv_table_rewritten_under_a_dropped_step),
        cmocka_unit_test(test_hazard_publish_with_steps_in_flight),
        cmocka_unit_test(test_hazard_walk_ids_read_before_the_walk_has_run),
        cmocka_unit_test(test_hazard_walk_tokens_written_under_the_last_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
