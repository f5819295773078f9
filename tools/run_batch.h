/* run_batch.h - `ppn run` with several prompts: one batch (tools/run_batch.c). */
#ifndef PPN_RUN_BATCH_H
#define PPN_RUN_BATCH_H

#include <stdint.h>
#include "ppn.h"

/* Several prompts: each a list of ids (--ids repeated, or --ids-file, one prompt a line). */
typedef struct run_prompts {
    int **ids;
    int *n;
    int count, cap;
} run_prompts;

/* Add a prompt (taking ids): 0, or 1 after the message (out of memory; ids freed). */
int run_prompts_add(run_prompts *p, int *ids, int n);
/* Read --ids-file path: one prompt a line, each a comma-separated id list (blank lines skipped). 0, 2 (a line
 * that is not an id list: named with its line number), 1 (I/O or memory). */
int run_prompts_file(run_prompts *p, const char *flag, const char *path);
void run_prompts_free(run_prompts *p);

typedef struct run_batch_opts {
    int n_new, chunk, json, quiet;
    double temp, top_p;
    int top_k;
    uint64_t seed;
} run_batch_opts;

/* Prime every prompt together (ppn_prefill_batch, all but each prompt's last id), then decode n_new tokens for
 * all of them in batched steps (ppn_decode_batch_ex: greedy on the device at temperature 0, else sampled on the
 * host from each row's logits, sequence i with seed + i); one output line per prompt (or a JSON object). */
int run_batch(ppn_model *m, const ppn_model_info *mi, const run_prompts *p, const run_batch_opts *o);

#endif
