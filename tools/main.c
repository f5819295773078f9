/* main.c - the ppn command line: one binary, subcommands. */
#include <stdio.h>
#include <string.h>
#include "tools/cli.h"

static void usage(FILE *f)
{
    fputs("usage: ppn <command> [options]\n"
          "commands:\n"
          "  run       decode with a model: ppn run --model PATH --ids 1,2,3 -n 32 [--backend auto|sim|cuda]\n"
          "  bench     decode latency vs the weight-streaming floor: ppn bench --shape llama-1b --stages-sweep 1,2,4\n"
          "  mkmodel   write a random-weight checkpoint: ppn mkmodel --shape tiny --out DIR\n"
          "  gate      split vs unsplit, pipelined vs eager, soak: ppn gate --model PATH [split|pipelined|soak|all]\n"
          "  topo      devices, their cpusets and NUMA nodes, peer grants: ppn topo [--backend ...]\n"
          "  transport-bench  stage hand-off latency/bandwidth per transport and size: ppn transport-bench --sizes 4K..64M\n"
          "  sched-bench      decode steps/s per issue-thread configuration: ppn sched-bench --shape tiny --stages 2\n"
          "  env       every environment variable ppn reads, and the values set here checked: ppn env [--json]\n"
          "run 'ppn <command> --help' for its options\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "mkmodel")) return cmd_mkmodel(argc - 1, argv + 1);
    if (!strcmp(cmd, "topo")) return cmd_topo(argc - 1, argv + 1);
    if (!strcmp(cmd, "gate")) return cmd_gate(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "transport-bench")) return cmd_transport_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "sched-bench")) return cmd_sched_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "env")) return cmd_env(argc - 1, argv + 1);
    if (!strcmp(cmd, "help") && argc > 2 && !strcmp(argv[2], "env")) return cmd_env(argc - 2, argv + 2);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    cli_fail("unknown command '%s'", cmd);
    usage(stderr);
    return 2;
}
