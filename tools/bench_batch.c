/* bench_batch.c - batched decode throughput per batch size, in the form of llama-batched-bench's S_TG: the
 * aggregate rate B / step time, next to the per-sequence rate and the weight-read floor (a batched step still
 * reads every weight once; the KV it also reads is not in the floor). */
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"
#include "tools/bench_batch.h"

typedef struct batch_row {
    int B, mixed; /* mixed: the prompt rows a step fed beside the B decode rows (their mean over the timed steps) */
    double median_ms, p99_ms, agg_tok_s, seq_tok_s, gbs, floor_ratio, prime_ms;
    double greedy_ms, greedy_tok_s; /* the device greedy loop's step (--device-greedy; 0: not measured) */
} batch_row;

static int prompt_id(int t, int vocab) { return (int)(((long long)t * 7919 + 13) % vocab); }

/* The kernel account (PPN_KPROF=1) of the timed steps: totals per kernel name. */
typedef struct kacct {
    ppn_kernel_time k[PPN_KERNEL_PROFILE_MAX];
    int n;
} kacct;

static void kacct_add(kacct *a, ppn_rt *rt, int sign)
{
    ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
    int n = ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < a->n && strcmp(a->k[j].name, e[i].name)) j++;
        if (j == a->n && a->n < PPN_KERNEL_PROFILE_MAX) a->k[a->n++] = (ppn_kernel_time){.name = e[i].name};
        if (j == a->n) continue;
        a->k[j].calls += sign > 0 ? e[i].calls : -e[i].calls;
        a->k[j].ms += sign * e[i].ms;
    }
}

/* Step t's prompt slice beside the decode rows (o->mixed rows of *ps's prompt of o->prompt ids, from where *ps is;
 * it starts over once its prompt is fed whole). Sets *opt, which points at *ps, *at and *n (the caller's: they
 * must outlive the step), and returns its row count (0: no slice). */
static int mixed_slice(const bench_batch_opts *o, ppn_seq **ps, const int *pids, const int **at, int *n,
                       ppn_batch_opts *opt, ppn_status *st)
{
    *opt = ppn_batch_opts_default();
    if (!o->mixed) return 0;
    int pos = ppn_seq_pos(*ps);
    if (pos >= o->prompt) {
        if ((*st = ppn_seq_reset(*ps)) != PPN_OK) return 0;
        pos = 0;
    }
    *n = o->prompt - pos < o->mixed ? o->prompt - pos : o->mixed;
    *at = pids + pos;
    opt->n_prime = 1, opt->prime_seqs = ps, opt->prime_ids = at, opt->prime_n = n;
    return *n;
}

/* One rep: B sequences primed together, then n_new timed batched steps into dec (NULL: a warm-up), with o->mixed
 * a prompt slice each (their rows summed into *rows); greedy: the n_new steps are one device greedy loop, its step
 * time (the call's / n_new) into dec[0]. */
static int one_rep(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, int B, double *dec,
                   double *prime_ms, kacct *ka, int greedy, long *rows)
{
    ppn_seq **q = calloc((size_t)B, sizeof *q);
    int *ids = malloc(sizeof(int) * (size_t)B * (size_t)o->prompt), *n = malloc(sizeof(int) * (size_t)B);
    const int **pp = malloc(sizeof *pp * (size_t)B);
    int *tok = malloc(sizeof(int) * (size_t)B), rc = 0;
    ppn_status st = PPN_OK;
    if (!q || !ids || !n || !pp || !tok) rc = cli_fail("bench: out of memory for a batch of %d", B);
    for (int i = 0; i < B && rc == 0; i++) {
        if ((st = ppn_seq_create(m, &q[i])) != PPN_OK) rc = cli_fail_status(st, "bench: sequence");
        for (int t = 0; t < o->prompt && rc == 0; t++) ids[(size_t)i * o->prompt + t] = prompt_id(t + i, mi->vocab);
        pp[i] = ids + (size_t)i * o->prompt, n[i] = o->prompt - 1;
        tok[i] = ids[(size_t)i * o->prompt + o->prompt - 1];
    }
    double t0 = cli_now_us();
    ppn_prefill_opts po = {.chunk = o->chunk};
    if (rc == 0 && o->prompt > 1 && (st = ppn_prefill_batch(q, pp, n, B, &po, NULL)) != PPN_OK)
        rc = cli_fail_status(st, "bench: batched prime");
    if (prime_ms) *prime_ms = (cli_now_us() - t0) / 1e3;
    if (ka && rc == 0) kacct_add(ka, o->rt, -1);
    int *gids = greedy ? malloc(sizeof(int) * (size_t)B * (size_t)o->n_new) : NULL;
    if (greedy && !gids && rc == 0) rc = cli_fail("bench: out of memory for %d x %d ids", B, o->n_new);
    if (greedy && rc == 0) {
        double s0 = cli_now_us();
        if ((st = ppn_decode_batch_greedy(q, tok, B, o->n_new, NULL, gids)) != PPN_OK)
            rc = cli_fail_status(st, "bench: batch greedy loop");
        if (dec) dec[0] = (cli_now_us() - s0) / 1e3 / o->n_new;
    }
    free(gids);
    ppn_seq *ps = NULL; /* --mixed: the sequence whose prompt is fed in slices beside the decode rows */
    int *pids = o->mixed ? malloc(sizeof(int) * (size_t)o->prompt) : NULL;
    if (o->mixed && rc == 0 && !pids) rc = cli_fail("bench: out of memory for a prompt of %d", o->prompt);
    if (o->mixed && rc == 0 && (st = ppn_seq_create(m, &ps)) != PPN_OK) rc = cli_fail_status(st, "bench: sequence");
    for (int t = 0; pids && t < o->prompt; t++) pids[t] = prompt_id(3 * t + 1, mi->vocab);
    for (int t = 0; t < o->n_new && rc == 0 && !greedy; t++) {
        const int *at = NULL;
        int n_at = 0;
        ppn_batch_opts mo;
        int fed = mixed_slice(o, &ps, pids, &at, &n_at, &mo, &st);
        if (st != PPN_OK) {
            rc = cli_fail_status(st, "bench: --mixed: starting the prompt over");
            break;
        }
        double s0 = cli_now_us();
        if ((st = ppn_decode_batch_ex(q, tok, B, &mo, NULL, tok)) != PPN_OK)
            rc = cli_fail_status(st, o->mixed ? "bench: mixed step" : "bench: batched step");
        if (dec) dec[t] = (cli_now_us() - s0) / 1e3;
        if (rows) *rows += fed;
    }
    if (ps) rc = cli_seq_destroy(ps, rc);
    free(pids);
    if (ka && rc == 0) kacct_add(ka, o->rt, +1); /* every step was synchronised: its kernels are counted */
    for (int i = 0; q && i < B; i++) rc = cli_seq_destroy(q[i], rc);
    free(q);
    free(ids);
    free(n);
    free(pp);
    free(tok);
    return rc;
}

static int measure(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, int B, batch_row *r)
{
    int nd = o->reps * o->n_new, rc = 0;
    double *dec = malloc(sizeof(double) * (size_t)nd), pr[64];
    if (!dec) return cli_fail("bench: out of memory");
    kacct ka = {0};
    long fed = 0;
    for (int w = 0; w < o->warmup && rc == 0; w++) rc = one_rep(m, mi, o, B, NULL, NULL, NULL, 0, NULL);
    if (o->kprof) ppn_rt_kernel_profile_reset(o->rt);
    for (int k = 0; k < o->reps && rc == 0; k++)
        rc = one_rep(m, mi, o, B, dec + (size_t)k * o->n_new, &pr[k < 64 ? k : 63], o->kprof ? &ka : NULL, 0, &fed);
    double gr[64];
    for (int w = 0; o->device_greedy && w < o->warmup && rc == 0; w++)
        rc = one_rep(m, mi, o, B, NULL, NULL, NULL, 1, NULL);
    for (int k = 0; o->device_greedy && k < o->reps && rc == 0; k++)
        rc = one_rep(m, mi, o, B, &gr[k < 64 ? k : 63], NULL, NULL, 1, NULL);
    for (int i = 0; rc == 0 && o->kprof && !o->json && i < ka.n; i++) {
        if (!ka.k[i].calls) continue; /* the prime's kernels that the steps never launch */
        double steps = (double)nd, us = 1e3 * ka.k[i].ms / steps;
        printf("       B=%d %-16s %8.2f calls/step %10.2f us/step\n", B, ka.k[i].name, (double)ka.k[i].calls / steps, us);
    }
    if (rc == 0) {
        int np = o->reps < 64 ? o->reps : 64;
        cli_sort(dec, nd);
        cli_sort(pr, np);
        double floor_ms = 1e3 * (double)mi->weight_bytes / (o->bw_gbs * 1e9);
        r->B = B;
        r->mixed = (int)((fed + nd / 2) / nd);
        r->median_ms = cli_median(dec, nd);
        r->p99_ms = cli_rank(dec, nd, 0.99);
        r->seq_tok_s = r->median_ms > 0 ? 1e3 / r->median_ms : 0;
        r->agg_tok_s = r->seq_tok_s * B;
        r->gbs = r->median_ms > 0 ? (double)mi->weight_bytes / (r->median_ms * 1e-3) / 1e9 : 0;
        r->floor_ratio = r->median_ms > 0 ? floor_ms / r->median_ms : 0;
        r->prime_ms = cli_median(pr, np);
        if (o->device_greedy) {
            cli_sort(gr, np);
            r->greedy_ms = cli_median(gr, np);
            r->greedy_tok_s = r->greedy_ms > 0 ? 1e3 / r->greedy_ms * B : 0;
        }
    }
    free(dec);
    return rc;
}

int bench_batch(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, FILE *out)
{
    int rc = 0;
    if (!o->json) {
        printf("batched decode: %d reps x (B sequences primed with %d ids each, then %d batched greedy steps), %d "
               "warm-up rep%s; floor %.4g ms/step = weight bytes / %g GB/s\n", o->reps, o->prompt, o->n_new,
               o->warmup, o->warmup == 1 ? "" : "s", 1e3 * (double)mi->weight_bytes / (o->bw_gbs * 1e9), o->bw_gbs);
        if (o->mixed)
            printf("mixed steps: each step also feeds up to %d rows of a %d-id prompt (one more sequence, started "
                   "over once fed whole), as a `ppn serve` iteration; agg_tok/s counts the decode rows\n", o->mixed,
                   o->prompt);
        printf("%6s %10s %10s %12s %12s %9s %11s %12s", "B", "step_ms", "p99_ms", "agg_tok/s", "seq_tok/s", "GB/s",
               "floor_ratio", "prime_ms");
        printf(o->device_greedy ? " %10s %13s\n" : "\n", "greedy_ms", "greedy_tok/s");
        fflush(stdout);
    } else {
        fputc('[', out);
    }
    for (int k = 0; k < o->n_sizes && rc == 0; k++) {
        batch_row r = {0};
        if ((rc = measure(m, mi, o, o->sizes[k], &r)) != 0) break;
        if (o->json) {
            fprintf(out, "%s{\"B\":%d,\"step_ms\":%.6g,\"p99_ms\":%.6g,\"agg_tok_s\":%.6g,\"seq_tok_s\":%.6g,"
                         "\"gbs\":%.6g,\"floor_ratio\":%.6g,\"prime_ms\":%.6g", k ? "," : "", r.B, r.median_ms,
                    r.p99_ms, r.agg_tok_s, r.seq_tok_s, r.gbs, r.floor_ratio, r.prime_ms);
            if (o->mixed) fprintf(out, ",\"mixed\":%d,\"prompt_rows_per_step\":%d", o->mixed, r.mixed);
            if (o->device_greedy)
                fprintf(out, ",\"greedy_step_ms\":%.6g,\"greedy_agg_tok_s\":%.6g", r.greedy_ms, r.greedy_tok_s);
            fputc('}', out);
        } else {
            printf("%6d %10.4f %10.4f %12.1f %12.1f %9.2f %11.4f %12.3f", r.B, r.median_ms, r.p99_ms, r.agg_tok_s,
                   r.seq_tok_s, r.gbs, r.floor_ratio, r.prime_ms);
            if (o->device_greedy) printf(" %10.4f %13.1f", r.greedy_ms, r.greedy_tok_s);
            if (o->mixed) printf("   (+ %d prompt rows a step)", r.mixed);
            putchar('\n');
            fflush(stdout);
        }
    }
    if (o->json) fputc(']', out);
    return rc;
}

int bench_spec(ppn_model *m, const ppn_model_info *mi, const bench_batch_opts *o, int k, FILE *out)
{
    int nd = o->reps * o->n_new, rc = 0;
    double *dec = malloc(sizeof(double) * (size_t)nd), *ver = malloc(sizeof(double) * (size_t)nd);
    int *ids = malloc(sizeof(int) * (size_t)o->prompt), draft[PPN_SPEC_MAX_DRAFT], got[PPN_SPEC_MAX_DRAFT + 1];
    if (!dec || !ver || !ids) rc = cli_fail("bench: out of memory");
    for (int t = 0; rc == 0 && t < o->prompt; t++) ids[t] = prompt_id(t, mi->vocab);
    for (int r = -o->warmup; r < o->reps && rc == 0; r++) {
        ppn_seq *q = NULL;
        ppn_status st = ppn_seq_create(m, &q);
        ppn_prefill_opts po = {.chunk = o->chunk};
        if (st == PPN_OK && o->prompt > 1) st = ppn_prefill(q, ids, o->prompt - 1, &po, NULL);
        int tok = ids[o->prompt - 1];
        for (int t = 0; st == PPN_OK && t < o->n_new; t++) {
            double t0 = cli_now_us();
            st = ppn_decode_greedy(q, tok, 1, &tok);
            double t1 = cli_now_us();
            for (int j = 0; j < k; j++) draft[j] = (tok + 1 + j) % mi->vocab; /* never the argmax of a row 0 */
            int n = 0;
            if (st == PPN_OK) st = ppn_spec_verify(q, tok, draft, k, got, &n);
            double t2 = cli_now_us();
            if (st == PPN_OK) tok = got[n - 1];
            if (r >= 0) dec[r * o->n_new + t] = (t1 - t0) / 1e3, ver[r * o->n_new + t] = (t2 - t1) / 1e3;
        }
        if (st != PPN_OK) rc = cli_fail_status(st, "bench: --spec");
        rc = cli_seq_destroy(q, rc);
    }
    if (rc == 0) {
        cli_sort(dec, nd);
        cli_sort(ver, nd);
        double d = cli_median(dec, nd), v = cli_median(ver, nd);
        if (o->json)
            fprintf(out, "{\"k\":%d,\"rows\":%d,\"decode_step_ms\":%.6g,\"verify_ms\":%.6g,\"ratio\":%.6g}", k,
                    k + 1, d, v, d > 0 ? v / d : 0);
        else
            printf("speculative verify: k = %d drafts (%d rows): verify %.4f ms, greedy decode step %.4f ms (median of "
                   "%d each): %.3fx a decode step\n", k, k + 1, v, d, nd, d > 0 ? v / d : 0);
    }
    free(dec);
    free(ver);
    free(ids);
    return rc;
}
