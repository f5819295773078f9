/* tutil.h - helpers shared by the tests: fixture paths, reading files and reference ids, logits checks, running
 * the ppn binary, temp dirs, loading a model, setting environment variables for a while. */
#ifndef PPN_TUTIL_H
#define PPN_TUTIL_H

#include <stddef.h>
#include "ppn.h"

/* $PPN_FIXTURES/<rel> (default ../shared/fixtures from the repo root). */
const char *tu_fixture(const char *rel);
/* Whole file in a malloc'd buffer (*n bytes); NULL and a message on stderr if unreadable. */
void *tu_read_file(const char *path, size_t *n);
/* Write n bytes of data to path (created or truncated); fails the test, naming path, if it cannot. */
void tu_write_file(const char *path, const void *data, size_t n);
/* reference.json's integer array `key` (malloc'd); NULL if missing. */
int *tu_ref_ids(const char *ref_json_path, const char *key, int *n);
/* llama2.c ids file: whitespace- or comma-separated integers. */
int *tu_read_ids_text(const char *path, int *n);
/* A fixture's model folder (hf/NAME, or llama2c/NAME for a name ending in .bin) into dir, and its reference ids
 * (reference.json's all_ids, or stories260K.bos.ids); fails the test when the fixture is missing. */
int *tu_fixture_ids(const char *name, char *dir, size_t cap, int *n);

typedef struct tu_cmp {
    double worst_ratio;   /* max over rows of max|x-ref| / (tol_rel * max(1, max|ref|)) (<= 1 passes) */
    int worst_row;
    int greedy_checked;   /* rows whose reference top-1/top-2 margin exceeds the margin threshold */
    int greedy_mismatch;
} tu_cmp;
/* Compare one logits row with the reference row: updates c. Greedy agreement is checked on rows whose reference
 * margin exceeds margin; margin < 0 means 2 * tol_rel * max(1, max|ref|), the widest gap a result within
 * tolerance could close. */
void tu_cmp_row(tu_cmp *c, int row, const float *x, const float *ref, int vocab, double tol_rel, double margin);

/* Where the converted SmolLM2 checkpoint is: $PPN_SMOLLM2 (ctest sets it from the PPN_SMOLLM2 cache variable,
 * default .whl/smollm2 in the source tree, where .ci/run fetches it). A missing checkpoint fails the (cmocka)
 * test with the fetch command, unless PPN_SMOLLM2_UNAVAILABLE=1 says this machine cannot run fetch.sh: then it
 * returns NULL and the caller skips. */
const char *tu_smollm2(void);

/* Run a command, capturing stdout and stderr into malloc'd strings; returns the exit status (-1 on failure
 * to run). */
int tu_run(const char *cmd, char **out, char **err);
/* A fresh temporary directory under $TMPDIR (default /tmp; malloc'd path) and its recursive removal. */
char *tu_tmpdir(void);
void tu_rmrf(const char *path);
/* The ppn binary under test ($PPN_BIN, which ctest sets) run as `ppn <args>` with the door's variables
 * (MEMRA_PP_*) and PPN_KPROF unset, then env's assignments (may be ""), and TMPDIR a fresh directory, removed
 * after; stdout and stderr captured as tu_run does. *tmp_left (may be NULL) receives the entries the command
 * left in its TMPDIR. Returns the exit status (-1 when it could not run). */
int tu_run_ppn(const char *env, const char *args, char **out, char **err, int *tmp_left);

/* A copy of the llama-tiny fixture in a fresh directory (returned, malloc'd; tu_rmrf it) whose F32 tensor name has
 * its first count values set to v: a checkpoint with a planted bad value. */
char *tu_patched_tiny(const char *name, float v, int count);

/* A sim runtime shared by a cmocka group: pass tu_sim_rt_setup and tu_sim_rt_teardown to cmocka_run_group_tests,
 * and tu_sim_rt() is the runtime in between. The setup fails (-1, ppn's message on stderr) when ppn_rt_create
 * does; the teardown fails (-1) when ppn_rt_destroy does (a model left loaded, a failed device free). */
int tu_sim_rt_setup(void **state);
int tu_sim_rt_teardown(void **state);
ppn_rt *tu_sim_rt(void);

/* ppn_model_load of path with o (NULL: the defaults); the (cmocka) test fails, naming path and ppn's message,
 * when the model does not load. */
ppn_model *tu_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *o);

/* Set an environment variable (value NULL: unset it) until tu_env_restore, which puts back what every
 * tu_env_set since the last restore found, newest first (a teardown can call it after a failed check). */
void tu_env_set(const char *name, const char *value);
void tu_env_restore(void);

#endif
