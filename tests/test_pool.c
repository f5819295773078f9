/* test_pool.c - the stream-ordered device pool on the sim backend: the cross-stream rule, proved against the
 * sim checker; zero driver allocations in steady state; exhaustion and recovery; double free; a free whose
 * event record fails retires its block (PPN_SIM_FAIL=record:K). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "alloc/pool.h"
#include "tests/util/tdev.h"
#include "tests/util/tutil.h"

typedef struct fx {
    ppn_gpu *g;
    ppn_pool *p;
    ppn_gstream *a, *b;
} fx;

/* A sim backend created with the PPN_SIM_* variable var set to value (var NULL: none), a 1 MiB-slab pool, two
 * streams. */
static int setup_env(void **state, const char *var, const char *value)
{
    fx *f = calloc(1, sizeof *f);
    if (var) tu_env_set(var, value);
    ppn_status st = ppn_gpu_sim_create(ppn_kernel_set(), &f->g);
    tu_env_restore();
    assert_int_equal(st, PPN_OK);
    assert_int_equal(ppn_pool_create(f->g, 0, 1 << 20, &f->p), PPN_OK);
    f->a = tu_stream(f->g, 0);
    f->b = tu_stream(f->g, 0);
    *state = f;
    return 0;
}

static int setup(void **state) { return setup_env(state, NULL, NULL); }
static int setup_small(void **state) { return setup_env(state, "PPN_SIM_MEM", "8M"); }
static int setup_failing_records(void **state) { return setup_env(state, "PPN_SIM_FAIL", "record:1,record:2"); }

static int teardown(void **state)
{
    fx *f = *state;
    f->g->ops->stream_sync(f->g, f->a);
    f->g->ops->stream_sync(f->g, f->b);
    if (f->p) ppn_pool_stream_retired(f->p, f->a);
    if (f->p) ppn_pool_stream_retired(f->p, f->b);
    f->g->ops->stream_destroy(f->g, f->a);
    f->g->ops->stream_destroy(f->g, f->b);
    ppn_pool_destroy(f->p);
    ppn_gpu_close(f->g);
    free(f);
    return 0;
}

static ppn_pool_stats stats(fx *f)
{
    ppn_pool_stats s;
    ppn_pool_get_stats(f->p, &s);
    return s;
}

/* The sticky checker status after draining both streams (PPN_OK when the checker stayed silent). */
static ppn_status drain(fx *f, char *msg, size_t cap)
{
    f->g->ops->stream_sync(f->g, f->a);
    f->g->ops->stream_sync(f->g, f->b);
    return ppn_gpu_sim_take_error(f->g, msg, cap);
}

static void test_pool_same_stream_reuse_inserts_no_wait(void **state)
{
    fx *f = *state;
    ppn_dptr p1, p2;
    assert_int_equal(ppn_pool_alloc(f->p, 1000, f->a, "t", &p1), PPN_OK);
    assert_int_equal(tu_fill(f->g, f->a, p1, 7, 250), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p1, f->a), PPN_OK);
    assert_int_equal(ppn_pool_alloc(f->p, 1000, f->a, "t", &p2), PPN_OK);
    /* reused: the same memory (at a new generation's address on sim) ... */
    assert_true(ppn_gpu_sim_canonical(f->g, p1) == ppn_gpu_sim_canonical(f->g, p2));
    assert_int_equal(stats(f).cross_waits, 0); /* ... with stream order alone */
    assert_int_equal(tu_fill(f->g, f->a, p2, 9, 250), PPN_OK);
    char msg[1024];
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p2, f->a), PPN_OK);
}

/* Write on A, free on A, reuse on B, write on B: exactly one wait, and the checker is silent. */
static ppn_status cross_stream_sequence(fx *f, ppn_dptr *p1_out, ppn_dptr *p2_out)
{
    ppn_dptr p1, p2;
    assert_int_equal(ppn_pool_alloc(f->p, 4096, f->a, "act", &p1), PPN_OK);
    assert_int_equal(tu_fill(f->g, f->a, p1, 1, 1024), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p1, f->a), PPN_OK);
    assert_int_equal(ppn_pool_alloc(f->p, 4096, f->b, "act", &p2), PPN_OK);
    assert_int_equal(tu_fill(f->g, f->b, p2, 2, 1024), PPN_OK);
    *p1_out = p1;
    *p2_out = p2;
    return PPN_OK;
}

static void test_pool_cross_stream_reuse_inserts_one_wait(void **state)
{
    fx *f = *state;
    ppn_dptr p1, p2;
    cross_stream_sequence(f, &p1, &p2);
    assert_true(ppn_gpu_sim_canonical(f->g, p1) == ppn_gpu_sim_canonical(f->g, p2)); /* the same memory */
    assert_int_equal(stats(f).cross_waits, 1);
    char msg[1024] = "";
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
    uint32_t w[4];
    tu_download(f->g, f->b, w, p2, sizeof w);
    assert_int_equal(w[0], 2);
    assert_int_equal(w[3], 2);
    assert_int_equal(ppn_pool_free(f->p, p2, f->b), PPN_OK);
}

/* The same sequence with the pool's wait removed is a race the checker must report. */
static void test_pool_removed_wait_is_reported_as_race(void **state)
{
    fx *f = *state;
    ppn_pool_test_skip_cross_wait(f->p, 1);
    ppn_dptr p1, p2;
    cross_stream_sequence(f, &p1, &p2);
    assert_true(ppn_gpu_sim_canonical(f->g, p1) == ppn_gpu_sim_canonical(f->g, p2)); /* the same memory */
    assert_int_equal(stats(f).cross_waits, 0);
    char msg[2048] = "";
    assert_int_equal(drain(f, msg, sizeof msg), PPN_ERACE);
    assert_non_null(strstr(msg, "act")); /* names the block */
    assert_int_equal(ppn_pool_free(f->p, p2, f->b), PPN_OK);
    f->g->ops->stream_sync(f->g, f->b);
    ppn_gpu_sim_take_error(f->g, msg, sizeof msg);
}

static void test_pool_steady_state_makes_no_driver_allocation(void **state)
{
    fx *f = *state;
    size_t sizes[] = {256, 4096, 10000, 65536, 300000, 3 << 20};
    ppn_dptr p[6];
    for (int warm = 0; warm < 2; warm++) /* warm-up: carve every class once */
        for (int i = 0; i < 6; i++) {
            assert_int_equal(ppn_pool_alloc(f->p, sizes[i], f->a, "w", &p[i]), PPN_OK);
            if (warm) continue;
            assert_int_equal(ppn_pool_free(f->p, p[i], f->a), PPN_OK);
        }
    for (int i = 0; i < 6; i++) assert_int_equal(ppn_pool_free(f->p, p[i], f->a), PPN_OK);
    uint64_t drv = f->g->n_mem_alloc, slabs = stats(f).slabs;
    for (int it = 0; it < 1000; it++) {
        ppn_gstream *s = (it & 1) ? f->b : f->a;
        for (int i = 0; i < 6; i++) assert_int_equal(ppn_pool_alloc(f->p, sizes[i], s, "w", &p[i]), PPN_OK);
        for (int i = 0; i < 6; i++) assert_int_equal(ppn_pool_free(f->p, p[i], s), PPN_OK);
    }
    assert_int_equal(f->g->n_mem_alloc, drv);
    assert_int_equal(stats(f).slabs, slabs);
    assert_true(stats(f).cross_waits > 0); /* alternating streams did go through the wait path */
    char msg[1024];
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
}

static void test_pool_exhaustion_returns_enomem_and_pool_recovers(void **state)
{
    fx *f = *state; /* 8 MiB device */
    ppn_dptr p[64];
    int n = 0;
    ppn_status st;
    while ((st = ppn_pool_alloc(f->p, 1 << 20, f->a, "big", &p[n])) == PPN_OK) {
        n++;
        assert_true(n < 64);
    }
    assert_int_equal(st, PPN_ENOMEM);
    assert_non_null(strstr(ppn_last_error(), "pool dev 0"));
    assert_true(n >= 4);
    ppn_dptr small;
    assert_int_equal(ppn_pool_free(f->p, p[n - 1], f->a), PPN_OK);
    assert_int_equal(ppn_pool_alloc(f->p, 1 << 20, f->a, "big", &small), PPN_OK); /* serves again */
    assert_true(ppn_gpu_sim_canonical(f->g, small) == ppn_gpu_sim_canonical(f->g, p[n - 1]));
    p[n - 1] = small;
    for (int i = 0; i < n; i++) assert_int_equal(ppn_pool_free(f->p, p[i], f->a), PPN_OK);
    char msg[512];
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
}

static void test_pool_double_free_is_refused(void **state)
{
    fx *f = *state;
    ppn_dptr p;
    assert_int_equal(ppn_pool_alloc(f->p, 512, f->a, "x", &p), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p, f->a), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p, f->a), PPN_EDOUBLEFREE);
    assert_non_null(strstr(ppn_last_error(), "not a live block"));
    assert_int_equal(ppn_pool_free(f->p, p + 256, f->a), PPN_EDOUBLEFREE);
    assert_int_equal(stats(f).in_use, 0);
    char msg[512];
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
}

static void test_pool_retired_stream_forces_a_wait(void **state)
{
    fx *f = *state;
    ppn_dptr p1, p2;
    assert_int_equal(ppn_pool_alloc(f->p, 2048, f->a, "r", &p1), PPN_OK);
    assert_int_equal(ppn_pool_free(f->p, p1, f->a), PPN_OK);
    ppn_pool_stream_retired(f->p, f->a);
    assert_int_equal(ppn_pool_alloc(f->p, 2048, f->a, "r", &p2), PPN_OK);
    assert_true(ppn_gpu_sim_canonical(f->g, p1) == ppn_gpu_sim_canonical(f->g, p2)); /* the same memory */
    assert_int_equal(stats(f).cross_waits, 1);
    assert_int_equal(ppn_pool_free(f->p, p2, f->a), PPN_OK);
}

static void test_pool_stats_track_use_and_peak(void **state)
{
    fx *f = *state;
    ppn_dptr a, b;
    assert_int_equal(ppn_pool_alloc(f->p, 300, f->a, "s", &a), PPN_OK); /* class 512 */
    assert_int_equal(ppn_pool_alloc(f->p, 1024, f->a, "s", &b), PPN_OK);
    assert_int_equal(stats(f).in_use, 512 + 1024);
    assert_int_equal(ppn_pool_free(f->p, a, f->a), PPN_OK);
    assert_int_equal(stats(f).in_use, 1024);
    assert_int_equal(stats(f).peak, 512 + 1024);
    assert_int_equal(ppn_pool_free(f->p, b, f->a), PPN_OK);
    assert_int_equal(ppn_pool_alloc(f->p, 0, f->a, "s", &a), PPN_EINVAL);
}

/* A free whose event record fails retires the block (issue 14): the free returns the record's failure and says
 * the block was retired, the stats count it, no later alloc on either stream returns its memory while the pool
 * lives, and the pool's destroy releases it: the device's memory is all free again. One small block (a 1024 B
 * class in a slab) and one large (its own 640 KiB raw allocation). */
static void test_pool_failed_record_retires_the_block(void **state)
{
    fx *f = *state; /* PPN_SIM_FAIL=record:1,record:2: the first two frees fail */
    const size_t want[2] = {1000, 600000}, rounded[2] = {1024, 640u << 10};
    ppn_dptr gone[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(ppn_pool_alloc(f->p, want[i], f->a, "doomed", &gone[i]), PPN_OK);
        assert_int_equal(tu_fill(f->g, f->a, gone[i], 3, 250), PPN_OK);
        assert_int_equal(ppn_pool_free(f->p, gone[i], f->a), PPN_EDRIVER);
        assert_non_null(strstr(ppn_last_error(), "injected failure of record"));
        assert_non_null(strstr(ppn_last_error(), "retired"));
    }
    ppn_pool_stats s = stats(f);
    assert_int_equal(s.retired, 2);
    assert_int_equal(s.retired_bytes, rounded[0] + rounded[1]);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.frees, 0);
    assert_true(s.reserved >= (1u << 20) + rounded[1]); /* still held: the slab and the large block */
    assert_int_equal(ppn_pool_free(f->p, gone[0], f->a), PPN_EDOUBLEFREE); /* no longer live */
    for (int it = 0; it < 8; it++) /* records succeed from here: these blocks circulate, on both streams */
        for (int i = 0; i < 2; i++) {
            ppn_gstream *st = (it & 1) ? f->b : f->a;
            ppn_dptr p;
            assert_int_equal(ppn_pool_alloc(f->p, want[i], st, "after", &p), PPN_OK);
            assert_true(ppn_gpu_sim_canonical(f->g, p) != ppn_gpu_sim_canonical(f->g, gone[i]));
            assert_int_equal(ppn_pool_free(f->p, p, st), PPN_OK);
        }
    s = stats(f);
    assert_int_equal(s.retired, 2);
    assert_int_equal(s.frees, 16);
    char msg[512] = "";
    assert_int_equal(drain(f, msg, sizeof msg), PPN_OK);
    size_t free_b, total_b;
    assert_int_equal(ppn_pool_destroy(f->p), PPN_OK);
    f->p = NULL;
    assert_int_equal(f->g->ops->mem_get_info(f->g, 0, &free_b, &total_b), PPN_OK);
    assert_int_equal(free_b, total_b); /* the retired blocks' memory went back with the pool */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pool_same_stream_reuse_inserts_no_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_cross_stream_reuse_inserts_one_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_removed_wait_is_reported_as_race, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_steady_state_makes_no_driver_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_exhaustion_returns_enomem_and_pool_recovers, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_pool_double_free_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_retired_stream_forces_a_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_stats_track_use_and_peak, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_failed_record_retires_the_block, setup_failing_records, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
