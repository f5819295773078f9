/* cli.h - shared helpers of the ppn subcommands: strict argument parsing and error reporting. */
#ifndef PPN_CLI_H
#define PPN_CLI_H

#include <stdint.h>
#include <stdio.h>
#include "ppn.h"

/* Exit status: 2 for usage and syntax errors (an unknown flag, a value of the wrong form, an environment
 * variable breaking its rule), refused before anything runs; 1 for everything else (a failure while running). */

/* Print "ppn: error: <fmt>" on stderr as one line (control characters escaped: \n, \t, \r, \xNN); returns 1
 * (the exit status for a runtime error). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "ppn: error: <what>: <ppn_last_error()>" for a failed status; returns 1. */
int cli_fail_status(ppn_status st, const char *what);
/* ppn_seq_destroy (NULL: nothing) for a command whose exit status so far is rc: its failure (a block retired,
 * named) is printed ("ppn: error: sequence teardown: ...") and turns an rc of 0 into 1; an earlier rc stays.
 * Returns the new rc. */
int cli_seq_destroy(ppn_seq *q, int rc);
/* ppn_model_free and ppn_rt_destroy (NULL: nothing) by the same rule ("model teardown", "runtime teardown"). */
int cli_model_free(ppn_model *m, int rc);
int cli_rt_destroy(ppn_rt *rt, int rc);
/* ppn_seq_destroy (NULL: nothing) after work that returned st, for a caller that returns a status: st when it
 * failed (its message ppn_last_error() again), else the destroy's status and message. */
ppn_status cli_seq_destroy_after(ppn_seq *q, ppn_status st);

/* Strict parsers: the whole string must be a number in [min, max]; else a usage error naming the flag and the
 * value (returns 2). Integers are digits only, with a leading '-' only where min < 0 (no space, no '+');
 * numbers are [-]digits[.digits][e[+-]digits]. */
int cli_int(const char *flag, const char *v, long min, long max, long *out);
int cli_float(const char *flag, const char *v, double min, double max, double *out);
int cli_u64(const char *flag, const char *v, uint64_t *out);
/* "1,300,401" -> ids (malloc'd; the caller frees them, on its error paths too), each digits only, at most
 * INT32_MAX. Returns 0, 2 (refused: nothing allocated), 1 (out of memory). */
int cli_ids(const char *flag, const char *v, int **ids, int *n);
/* A backend name ppn_rt_create takes (auto, cuda, sim): 0, else 2 after the message. */
int cli_backend(const char *flag, const char *v);
/* ppn_rt_create with the CLI's exit rule: 0; 2 after the message for PPN_EINVAL (by ppn.h's contract a bad
 * backend name or a bad PPN_SIM_* value: the lists PPN_SIM_PEER and PPN_SIM_FAIL are checked only there);
 * 1 after the message for any other failure. */
int cli_rt_create(const char *backend, ppn_rt **rt);
/* Feed ids[0..n) to seq: primed chunk rows at a time (ppn_prefill), or token by token with chunk 0; rows (may be
 * NULL) receives every row's logits (vocab floats each), last (may be NULL) the last row's. */
ppn_status cli_feed(ppn_seq *seq, const int *ids, int n, int chunk, int vocab, float *rows, float *last);
/* Every environment variable set against its rule (core/base/env.c), before a command runs: 0, else 2 after
 * the message. door: the command reads the door from the environment, so also print a one-line notice naming
 * the door-only variables set while MEMRA_PP_STAGES keeps the door shut (nothing reads them). */
int cli_env_check(int door);
/* "f32" | "bf16" | "f16" -> PPN_DTYPE_* */
int cli_dtype(const char *flag, const char *v, int *out);

/* argv helper: the value of flag at argv[*i] (advancing *i), or a usage error. */
const char *cli_value(int argc, char **argv, int *i);

/* Door flags (cli_door.c): --stages --splits --split --devices --shard --streams --overlap --spin --graphs
 * --fuse, each parsed by the rule of the variable it spells (MEMRA_PP_STAGES ...). Apply one flag and its value
 * to d, over what ppn_door_from_env read. @return PPN_OK, PPN_EINVAL (NULL argument, unknown flag, empty value,
 * or a value breaking the rule: the message names the flag, the value and the rule); *d changes only on
 * success. */
ppn_status cli_door_set_flag(ppn_door *d, const char *flag, const char *value);
/* If argv[*i] is a door flag, apply it (and its value) to d and return 1; 0 if it is not a door flag; -1 (after
 * printing) if invalid, or if it is door-only (--splits --split --devices --shard --streams --overlap) while the
 * door stays shut: no --stages N >= 2 anywhere in argv (nor bench's --stages-sweep) and, without --stages, no
 * MEMRA_PP_STAGES >= 2 in d as read from the environment. */
int cli_door_flag(ppn_door *d, int argc, char **argv, int *i);
/* One line describing the published stage map, e.g. "3 stages: layers 0-1 @dev0 | 2-3 @dev1 ...". */
void cli_print_stage_map(FILE *f, const ppn_model *m);
/* The stage map as a JSON object (no trailing newline). */
void cli_json_stage_map(FILE *f, const ppn_model *m);
/* A stage's host buffers in words ("none", "2 on node 0", ...), into buf. */
const char *cli_host_node(const ppn_stage_place *p, char *buf, size_t cap);

/* Timing and statistics shared by the benchmarks. */
double cli_now_us(void);                            /* CLOCK_MONOTONIC, microseconds */
void cli_sort(double *v, int n);                    /* ascending */
double cli_rank(const double *sorted, int n, double q); /* nearest-rank quantile, q in [0, 1] */
double cli_median(const double *sorted, int n);     /* mean of the middle two for an even count */

/* A load progress bar on stderr (only when stderr is a terminal). */
void cli_progress(void *arg, size_t done, size_t total);

int cmd_run(int argc, char **argv);
int cmd_topo(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_gate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_transport_bench(int argc, char **argv);
int cmd_sched_bench(int argc, char **argv);
int cmd_env(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);   /* tokenize and detokenize (argv[0] says which) */
int cmd_template(int argc, char **argv);

#endif
