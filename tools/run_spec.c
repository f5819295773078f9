/* run_spec.c - greedy decode through speculative verify rounds with the prompt-lookup drafter. */
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"
#include "tools/run_spec.h"

#define SPEC_NGRAM 3

ppn_status run_spec_decode(ppn_seq *seq, const int *ids, int n_ids, int n_new, int k, int chunk, int vocab, int *gen,
                           run_spec_stats *rs)
{
    memset(rs, 0, sizeof *rs);
    if (n_ids < 1 || n_new < 1) return PPN_OK;
    int *hist = malloc(sizeof(int) * (size_t)(n_ids + n_new + k + 1)), *draft = malloc(sizeof(int) * (size_t)(k + 1));
    int *out = malloc(sizeof(int) * (size_t)(k + 1));
    if (!hist || !draft || !out) {
        free(hist), free(draft), free(out);
        return PPN_ENOMEM;
    }
    memcpy(hist, ids, sizeof(int) * (size_t)n_ids);
    ppn_status st = cli_feed(seq, ids, n_ids - 1, chunk, vocab, NULL, NULL);
    int n = n_ids, made = 0; /* hist[0 .. n): fed, but for hist[n - 1], the next token to feed */
    while (st == PPN_OK && made < n_new) {
        int room = n_new - made - 1; /* drafts past the last wanted id would be wasted rows */
        int want = k < room ? k : room;
        int nd = want > 0 ? ppn_draft_lookup(hist, n, want, SPEC_NGRAM, draft) : 0, got = 0;
        st = ppn_spec_verify(seq, hist[n - 1], draft, nd, out, &got);
        if (st != PPN_OK) break;
        rs->verifies++, rs->drafted += nd, rs->accepted += got - 1;
        for (int j = 0; j < got && made < n_new; j++) gen[made++] = out[j], hist[n++] = out[j];
    }
    free(hist);
    free(draft);
    free(out);
    return st;
}
