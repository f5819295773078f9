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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "alloc/pool.h"
#include "core/device/gpu.h"
#include "kernels/ktable.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hazard_off_by_one_of_a_non_power_of_two_slot),
        cmocka_unit_test(test_hazard_stale_pointer_into_a_reused_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
