/* main.c - the ppn command line: one binary, subcommands. */
#include <stdio.h>
#include <string.h>
#include "ppn.h"
#include "tools/cli.h"
#include "tools/serve.h"

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
          "  tokenize  UTF-8 text on stdin to comma-separated ids: ppn tokenize --model DIR [--special]\n"
          "  detokenize  ids to text: ppn detokenize --model DIR --ids 1,2,3\n"
          "  serve     OpenAI-compatible HTTP over the engine: ppn serve --model DIR [--host 127.0.0.1] [--port 8080]\n"
          "  template  a JSON conversation on stdin through the chat template: ppn template --model DIR [--add-generation-prompt]\n"
          "run 'ppn <command> --help' for its options; 'ppn --version' prints the library's version\n"
          "exit status: 2 for a usage or syntax error (a flag, a value, an environment variable), 1 for a failure\n"
          "while running\n",
          f);
}

/* Whether argv asks for help: it is printed whatever the environment holds. */
static int wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

/* env: the environment is input like the flags, so a value breaking its rule is refused before the command
 * runs (exit 2); `ppn env` reports such values instead (its own exit rule). door: the command reads the door
 * from the environment, and notes the door-only variables a shut door leaves unread. */
static const struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    int env, door;
} commands[] = {
    {"run", cmd_run, 1, 1},
    {"mkmodel", cmd_mkmodel, 1, 0},
    {"topo", cmd_topo, 1, 0},
    {"gate", cmd_gate, 1, 0},
    {"bench", cmd_bench, 1, 1},
    {"transport-bench", cmd_transport_bench, 1, 0},
    {"sched-bench", cmd_sched_bench, 1, 0},
    {"env", cmd_env, 0, 0},
    {"tokenize", cmd_tokenize, 0, 0},
    {"detokenize", cmd_tokenize, 0, 0},
    {"template", cmd_template, 0, 0},
    {"serve", cmd_serve, 1, 1},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const struct command *c = &commands[i];
        if (strcmp(cmd, c->name) != 0) continue;
        int rc = c->env && !wants_help(argc - 1, argv + 1) ? cli_env_check(c->door) : 0;
        return rc ? rc : c->fn(argc - 1, argv + 1);
    }
    if (!strcmp(cmd, "help") && argc > 2 && !strcmp(argv[2], "env")) return cmd_env(argc - 2, argv + 2);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("ppn %s\n", ppn_version());
        return 0;
    }
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    cli_fail("unknown command '%s'", cmd);
    usage(stderr);
    return 2;
}
