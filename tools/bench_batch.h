/* bench_batch.h - `ppn bench --batch B1,B2,..`: batched decode throughput per batch size (tools/bench_batch.c). */
#ifndef PPN_BENCH_BATCH_H
#define PPN_BENCH_BATCH_H

#include <stdio.h>
#include "ppn.h"

typedef struct bench_batch_opts {
    const int *sizes;
    int n_sizes;
    int prompt, n_new, reps, warmup, chunk, json;
    double bw_gbs;                 /* the floor's bandwidth, GB/s */
    ppn_rt *rt;                    /* with kprof (PPN_KPROF=1): the kernel account of the timed steps, per B */
    int kprof;
    int device_greedy;             /* also time the batch's device greedy loop (ppn_decode_batch_greedy) */
    int mixed;                     /* > 0: each step also feeds a slice of this many prompt rows (a mixed step) */
} bench_batch_opts;

/* For each batch size B: --warmup then --reps reps of B fresh sequences primed together with prompt ids each
 * (sequence i's prompt shifted by i, so they differ), then n_new batched greedy steps (ppn_decode_batch_ex with
 * ids: the argmax on the device), each step timed; with device_greedy, as many reps again whose n_new steps are one
 * ppn_decode_batch_greedy call, timed whole (its step time: the call's / n_new). With mixed = P, each timed step is
 * a mixed step (ppn_batch_opts.n_prime, one `ppn serve` iteration): the B decode rows and a slice of up to P rows of
 * one more sequence's prompt of `prompt` ids, which starts over (ppn_seq_reset) once fed whole; no device greedy
 * loop then. Prints a table (or, with json, writes a JSON array to out: the caller places it). 0, or 1 after the
 * message. */
int bench_batch(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, FILE *out);
/* The verify step's cost: reps sequences primed with prompt ids, then n_new rounds each of one greedy decode step
 * (ppn_decode_greedy of 1) and one verify of k drafts (ppn_spec_verify; drafts that will be rejected, so each
 * verify is a full k + 1 rows), both timed to their ids on the host. Prints (or writes JSON to out) the medians
 * and their ratio. 0, or 1 after the message. */
int bench_spec(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, int k, FILE *out);

#endif
