/* test_gpu_numa.c - issue 18 on a real GPU (cuda backend, device ops only: no kernels needed): each GPU is found
 * in the hwloc topology from its PCI id; a pinned arena bound to its node maps, binds (MPOL_BIND, read back with
 * get_mempolicy) and registers memory with cuMemHostRegister, and copies through it round-trip; the arena is
 * destroyed (cuMemHostUnregister) cleanly. Run by ./build.sh gputest (not in CI: no GPU there).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>
#include "alloc/host.h"
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "sched/topo.h"

static ppn_gpu *G;
static ppn_topo *T;

static ppn_status bind_cb(void *ctx, void *p, size_t n, int node) { return ppn_topo_bind_area(ctx, p, n, node); }

static void test_gpu_numa_bound_registered_arena(void **state)
{
    (void)state;
    for (int d = 0; d < G->ops->device_count(G); d++) {
        ppn_dev_place pl;
        assert_int_equal(ppn_topo_place_device(T, G, d, &pl), PPN_OK);
        print_message("    device %d: pci %s, located %d, package %d, NUMA node %d, cpuset %s (%d nodes, %d packages)\n",
                      d, pl.pci, pl.located, pl.package, pl.numa_node, pl.cpuset, ppn_topo_n_numa(T),
                      ppn_topo_n_packages(T));
        assert_int_equal(pl.located, 1); /* a real GPU's PCI device is in the topology */
        int node = pl.numa_node >= 0 ? pl.numa_node : 0;
        ppn_pinned_bind b = {.bind = bind_cb, .ctx = T, .node = node};
        ppn_pinned_arena *a = NULL;
        assert_int_equal(ppn_pinned_arena_create(G, &b, &a), PPN_OK);
        assert_int_equal(ppn_pinned_bind_failed(a), 0);
        size_t n = 8u << 20; /* above the reserve's first carve: a region of its own is mapped, bound, registered */
        unsigned char *h_in = NULL, *h_out = NULL, *big = NULL;
        assert_int_equal(ppn_pinned_alloc(a, n, (void **)&h_in), PPN_OK);
        assert_int_equal(ppn_pinned_alloc(a, n, (void **)&h_out), PPN_OK);
        assert_int_equal(ppn_pinned_alloc(a, 96u << 20, (void **)&big), PPN_OK); /* past the 64 MiB reserve */
        for (size_t i = 0; i < n; i++) h_in[i] = (unsigned char)(i * 7 + d);
        memset(big, 1, 96u << 20);
        ppn_gstream *s = NULL;
        ppn_dptr dp = 0;
        assert_int_equal(G->ops->stream_create(G, d, &s), PPN_OK);
        assert_int_equal(G->ops->mem_alloc(G, d, n, &dp), PPN_OK);
        assert_int_equal(G->ops->copy_htod(G, s, dp, h_in, n), PPN_OK);
        assert_int_equal(G->ops->copy_dtoh(G, s, h_out, dp, n), PPN_OK);
        assert_int_equal(G->ops->copy_htod(G, s, dp, big + (90u << 20), n), PPN_OK);
        assert_int_equal(G->ops->stream_sync(G, s), PPN_OK);
        assert_memory_equal(h_in, h_out, n);
        const void *probe[3] = {h_in, h_out, big + (95u << 20)};
        for (int k = 0; k < 3; k++) {
            int mode = -1, at = -1;
            unsigned long mask[16] = {0};
            assert_int_equal(syscall(SYS_get_mempolicy, &mode, mask, 1024ul, probe[k], 2ul /* MPOL_F_ADDR */), 0);
            assert_int_equal(syscall(SYS_get_mempolicy, &at, NULL, 0ul, probe[k], 3ul /* F_NODE|F_ADDR */), 0);
            int got = -9;
            char os[32];
            assert_int_equal(ppn_topo_area_node(T, probe[k], 4096, &got, os, sizeof os), PPN_OK);
            print_message("    device %d buffer %d: policy %d mask 0x%lx, page on OS node %d (hwloc: node %d, OS %s)\n", d,
                          k, mode, mask[0], at, got, os);
            assert_int_equal(mode, 2); /* MPOL_BIND */
            assert_int_equal(got, node);
        }
        assert_int_equal(G->ops->mem_free(G, d, dp), PPN_OK);
        assert_int_equal(G->ops->stream_destroy(G, s), PPN_OK);
        ppn_pinned_free(a, h_in);
        ppn_pinned_free(a, h_out);
        ppn_pinned_free(a, big);
        ppn_pinned_arena_destroy(a);
    }
}

int main(void)
{
    ppn_status st = ppn_gpu_cuda_create(ppn_kernel_set(), &G);
    if (st != PPN_OK) {
        fprintf(stderr, "FAIL: the GPU tests need a CUDA driver and device: %s: %s\n", ppn_status_name(st),
                ppn_last_error());
        return 1;
    }
    if ((st = ppn_topo_load(&T, 1)) != PPN_OK) {
        fprintf(stderr, "FAIL: topology: %s\n", ppn_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_numa_bound_registered_arena),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ppn_topo_destroy(T);
    ppn_gpu_close(G);
    return rc;
}
