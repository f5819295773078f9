/* run_spec.h - greedy decode with speculative verify (tools/run_spec.c). */
#ifndef PPN_RUN_SPEC_H
#define PPN_RUN_SPEC_H

#include "ppn.h"

typedef struct run_spec_stats {
    int verifies, drafted, accepted;
} run_spec_stats;

/* Greedy decode of n_new ids after the prompt ids[0 .. n_ids) on seq (fresh): the prompt but its last id primed
 * chunk rows at a time (0: token by token), then rounds of ppn_spec_verify with up to k drafts from
 * ppn_draft_lookup over the prompt and what was generated (a round without a draft is a verify of 0 drafts: one
 * row). gen receives the n_new ids plain greedy decode gives. */
ppn_status run_spec_decode(ppn_seq *seq, const int *ids, int n_ids, int n_new, int k, int chunk, int vocab, int *gen,
                           run_spec_stats *st);

#endif
