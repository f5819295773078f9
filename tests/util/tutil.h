/* tutil.h - helpers shared by the tests: fixture paths, reading files and reference ids, logits checks. */
#ifndef PPN_TUTIL_H
#define PPN_TUTIL_H

#include <stddef.h>

/* $PPN_FIXTURES/<rel> (default ../shared/fixtures from the repo root). */
const char *tu_fixture(const char *rel);
/* Whole file in a malloc'd buffer (*n bytes); NULL and a message on stderr if unreadable. */
void *tu_read_file(const char *path, size_t *n);
/* reference.json's integer array `key` (malloc'd); NULL if missing. */
int *tu_ref_ids(const char *ref_json_path, const char *key, int *n);
/* llama2.c ids file: whitespace- or comma-separated integers. */
int *tu_read_ids_text(const char *path, int *n);

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

/* Run a command, capturing stdout and stderr into malloc'd strings; returns the exit status (-1 on failure
 * to run). */
int tu_run(const char *cmd, char **out, char **err);
/* A fresh temporary directory (malloc'd path) and its recursive removal. */
char *tu_tmpdir(void);
void tu_rmrf(const char *path);

#endif
