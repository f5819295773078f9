/* cli.h - shared helpers of the ppn subcommands: strict argument parsing and error reporting. */
#ifndef PPN_CLI_H
#define PPN_CLI_H

#include <stdint.h>
#include <stdio.h>
#include "ppn.h"

/* Print "ppn: error: <fmt>" on stderr; returns 1 (the exit status for a runtime error). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "ppn: error: <what>: <ppn_last_error()>" for a failed status; returns 1. */
int cli_fail_status(ppn_status st, const char *what);

/* Strict parsers: the whole string must be a number in [min, max]; else a usage error naming the flag. */
int cli_int(const char *flag, const char *v, long min, long max, long *out);
int cli_float(const char *flag, const char *v, double min, double max, double *out);
int cli_u64(const char *flag, const char *v, uint64_t *out);
/* "1,300,401" -> ids (malloc'd), each in [0, INT32_MAX]. */
int cli_ids(const char *flag, const char *v, int **ids, int *n);
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
 * printing) if invalid. */
int cli_door_flag(ppn_door *d, int argc, char **argv, int *i);
/* One line describing the published stage map, e.g. "3 stages: layers 0-1 @dev0 | 2-3 @dev1 ...". */
void cli_print_stage_map(FILE *f, const ppn_model *m);
/* The stage map as a JSON object (no trailing newline). */
void cli_json_stage_map(FILE *f, const ppn_model *m);

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

#endif
