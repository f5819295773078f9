/* test_gpu_pool.c - the device pool on the real driver (cuda backend): same-stream reuse without a wait,
 * cross-stream reuse with exactly one wait and correct data, zero driver allocations in steady state,
 * exhaustion with recovery. Fails (does not pass) without a GPU. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "alloc/pool.h"
#include "tests/util/tdev.h"

static ppn_gpu *g;
static ppn_pool *p;
static ppn_gstream *sa, *sb;

static int setup(void **state)
{
    if (ppn_gpu_open("cuda", ppn_kernel_set(), &g) != PPN_OK) {
        fprintf(stderr, "no cuda backend: %s\n", ppn_last_error());
        return -1;
    }
    if (ppn_pool_create(g, 0, 0, &p) != PPN_OK) return -1;
    if (g->ops->stream_create(g, 0, &sa) != PPN_OK || g->ops->stream_create(g, 0, &sb) != PPN_OK) return -1;
    return 0;
}

static int teardown(void **state)
{
    g->ops->stream_sync(g, sa);
    g->ops->stream_sync(g, sb);
    ppn_pool_stream_retired(p, sa);
    ppn_pool_stream_retired(p, sb);
    g->ops->stream_destroy(g, sa);
    g->ops->stream_destroy(g, sb);
    ppn_pool_destroy(p);
    ppn_gpu_close(g);
    return 0;
}

static ppn_pool_stats stats(void)
{
    ppn_pool_stats s;
    ppn_pool_get_stats(p, &s);
    return s;
}

static void test_gpu_pool_same_stream_reuse(void **state)
{
    ppn_dptr a, b;
    uint64_t w0 = stats().cross_waits;
    assert_int_equal(ppn_pool_alloc(p, 4000, sa, "t", &a), PPN_OK);
    assert_int_equal(ppn_pool_free(p, a, sa), PPN_OK);
    assert_int_equal(ppn_pool_alloc(p, 4000, sa, "t", &b), PPN_OK);
    assert_true(a == b);
    assert_int_equal(stats().cross_waits, w0);
    assert_int_equal(ppn_pool_free(p, b, sa), PPN_OK);
}

/* A writes 1s, frees; B reuses, writes 2s after the pool's wait; the readback sees 2s everywhere. */
static void test_gpu_pool_cross_stream_reuse_orders_data(void **state)
{
    size_t words = 1 << 22; /* 16 MiB: long enough that an unordered write would interleave */
    ppn_dptr a, b;
    uint64_t w0 = stats().cross_waits;
    assert_int_equal(ppn_pool_alloc(p, words * 4, sa, "x", &a), PPN_OK);
    for (int i = 0; i < 20; i++) assert_int_equal(tu_fill(g, sa, a, 1, (int)words), PPN_OK);
    assert_int_equal(ppn_pool_free(p, a, sa), PPN_OK);
    assert_int_equal(ppn_pool_alloc(p, words * 4, sb, "x", &b), PPN_OK);
    assert_true(a == b);
    assert_int_equal(stats().cross_waits, w0 + 1);
    assert_int_equal(tu_fill(g, sb, b, 2, (int)words), PPN_OK);
    uint32_t *h = malloc(words * 4);
    tu_download(g, sb, h, b, words * 4);
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += h[i] != 2;
    assert_int_equal(bad, 0);
    free(h);
    assert_int_equal(ppn_pool_free(p, b, sb), PPN_OK);
}

static void test_gpu_pool_steady_state_no_driver_alloc(void **state)
{
    size_t sizes[] = {256, 65536, 1 << 20, 20 << 20};
    ppn_dptr x[4];
    for (int i = 0; i < 4; i++) assert_int_equal(ppn_pool_alloc(p, sizes[i], sa, "w", &x[i]), PPN_OK);
    for (int i = 0; i < 4; i++) assert_int_equal(ppn_pool_free(p, x[i], sa), PPN_OK);
    uint64_t drv = g->n_mem_alloc;
    for (int it = 0; it < 1000; it++) {
        ppn_gstream *s = (it & 1) ? sb : sa;
        for (int i = 0; i < 4; i++) assert_int_equal(ppn_pool_alloc(p, sizes[i], s, "w", &x[i]), PPN_OK);
        for (int i = 0; i < 4; i++) assert_int_equal(ppn_pool_free(p, x[i], s), PPN_OK);
    }
    assert_int_equal(g->n_mem_alloc, drv);
    assert_int_equal(g->ops->stream_sync(g, sa), PPN_OK);
    assert_int_equal(g->ops->stream_sync(g, sb), PPN_OK);
}

static void test_gpu_pool_exhaustion_then_recovery(void **state)
{
    ppn_dptr x;
    size_t free_b, total_b;
    assert_int_equal(g->ops->mem_get_info(g, 0, &free_b, &total_b), PPN_OK);
    assert_int_equal(ppn_pool_alloc(p, total_b * 2, sa, "huge", &x), PPN_ENOMEM);
    assert_non_null(strstr(ppn_last_error(), "pool dev 0"));
    assert_int_equal(ppn_pool_alloc(p, 1 << 20, sa, "after", &x), PPN_OK);
    assert_int_equal(ppn_pool_free(p, x, sa), PPN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_pool_same_stream_reuse),
        cmocka_unit_test(test_gpu_pool_cross_stream_reuse_orders_data),
        cmocka_unit_test(test_gpu_pool_steady_state_no_driver_alloc),
        cmocka_unit_test(test_gpu_pool_exhaustion_then_recovery),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
