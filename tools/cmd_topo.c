/* cmd_topo.c - `ppn topo`: the backend, the machine (or PPN_TOPO_XML's), each device with its PCI id, package,
 * cpuset and NUMA node (or why it has none), the peer-grant matrix. */
#include <stdio.h>
#include <string.h>
#include "tools/cli.h"
#include "kernels/ktable.h"
#include "core/device/gpu.h"
#include "sched/topo.h"

static int topo_print(ppn_gpu *g, ppn_topo *t, int json)
{
    int n = g->ops->device_count(g);
    if (json) printf("{\"backend\":\"%s\",\"topology\":\"%s\",\"cores\":%d,\"numa_nodes\":%d,\"packages\":%d,"
                     "\"devices\":[", g->ops->name, ppn_topo_source(t), ppn_topo_n_cores(t), ppn_topo_n_numa(t),
                     ppn_topo_n_packages(t));
    else printf("backend: %s   machine (%s): %d cores, %d NUMA node(s), %d package(s)\n", g->ops->name,
                ppn_topo_source(t), ppn_topo_n_cores(t), ppn_topo_n_numa(t), ppn_topo_n_packages(t));
    for (int d = 0; d < n; d++) {
        ppn_device_info di;
        ppn_dev_place pl;
        ppn_status st = g->ops->device_info(g, d, &di);
        if (st == PPN_OK) st = ppn_topo_place_device(t, g, d, &pl);
        if (st != PPN_OK) return cli_fail_status(st, "topo");
        if (json)
            printf("%s{\"id\":%d,\"name\":\"%s\",\"mem_bytes\":%zu,\"sim\":%s,\"pci\":\"%s\",\"cpuset\":\"%s\","
                   "\"numa\":%d,\"package\":%d,\"located\":%s}",
                   d ? "," : "", d, di.name, di.mem_total, di.sim ? "true" : "false", di.pci_bus_id, pl.cpuset,
                   pl.numa_node, pl.package, pl.located ? "true" : "false");
        else
            printf("device %d: %s (%s), %.1f GiB%s%s, cpuset %s (%d PUs), NUMA node %d, package %d%s\n", d, di.name,
                   di.sim ? "sim" : "real", (double)di.mem_total / (1 << 30), di.pci_bus_id[0] ? ", pci " : "",
                   di.pci_bus_id, pl.cpuset, pl.n_pus, pl.numa_node, pl.package,
                   pl.located ? "" : " (not located: whole machine, every node)");
    }
    if (json) printf("],\"peer\":[");
    else printf("peer grants possible (row can access column):\n     ");
    if (!json)
        for (int d = 0; d < n; d++) printf(" %3d", d);
    for (int a = 0; a < n; a++) {
        if (json) printf("%s[", a ? "," : "");
        else printf("\n %3d ", a);
        for (int b = 0; b < n; b++) {
            int can = 0;
            if (a != b) {
                ppn_status st = g->ops->peer_can_access(g, a, b, &can);
                if (st != PPN_OK) return cli_fail_status(st, "topo: peer query");
            }
            if (json) printf("%s%d", b ? "," : "", a == b ? 1 : can);
            else printf("   %s", a == b ? "-" : can ? "y" : "n");
        }
        if (json) printf("]");
    }
    printf(json ? "]}\n" : "\n");
    return 0;
}

int cmd_topo(int argc, char **argv)
{
    const char *backend = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--backend")) {
            if (!(backend = cli_value(argc, argv, &i))) return 2;
            if (cli_backend("--backend", backend)) return 2;
        } else if (!strcmp(argv[i], "--help")) {
            puts("usage: ppn topo [--backend auto|sim|cuda] [--json]");
            return 0;
        } else return cli_fail("topo: unknown option '%s'", argv[i]), 2;
    }
    ppn_gpu *g = NULL;
    ppn_topo *t = NULL;
    ppn_status st = ppn_gpu_open(backend, ppn_kernel_set(), &g);
    if (st != PPN_OK) return cli_fail_status(st, "backend");
    int rc;
    if ((st = ppn_topo_load(&t, strcmp(g->ops->name, "sim") != 0)) != PPN_OK) rc = cli_fail_status(st, "topo");
    else rc = topo_print(g, t, json);
    ppn_topo_destroy(t);
    ppn_gpu_close(g);
    return rc;
}
