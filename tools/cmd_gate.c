/* cmd_gate.c - `ppn gate`: the pipeline's proofs, as the seed's gates define them.
 *
 *   split      for every N in 2..min(n_layers, --max-stages) and several placements (all on the primary,
 *              one device per stage, repeated devices) and seams (overlap, one stream, unsharded, eager
 *              launches): the logits of every step are bit-identical to the unsplit (door shut) run, and every
 *              stage's walker ran. The reference issues every kernel eagerly (PPN_GRAPHS=0); the maps replay
 *              captured graphs (the default) except in the eager seam, so graphs are proven against eager too
 *   pipelined  the same maps driven through the deferred readback (up to 4 steps in flight) with the boundary
 *              slots alternating: bit-identical per step to eager, and the overlap counter advanced
 *   soak       --runs K runs, each with its own seed (prompt) and map, pipelined vs eager
 *   prime      the prompt primed --chunk rows at a time (ppn_prefill, every row's logits): for every N and
 *              placement, the split walk (serial and pipelined) and the unsplit walk (MEMRA_PRIME_PP=0) are
 *              bit-identical to the door-shut prime; red unless PRIME_SPLIT_CHUNKS advanced by the chunks of
 *              each split run and PRIME_PIPE_OVERLAPS advanced over the pipelined runs (the 2-stage pipelined
 *              run repeated, up to 8 times, until it does); then three prompts primed together (ppn_prefill_batch)
 *              are bit-identical to each primed alone on every row whose chunk sizes, together and alone, the model
 *              sums alike (ppn_model_rows_same_bits: every row at the default sizes), the rows after one that is
 *              not within the bf16 tolerance, and red unless STEP35_PRIME_BATCHES and STEP35_PRIME_BATCH_SPLITS
 *              advanced
 *   batch      4 sequences at different lengths decoded together (ppn_decode_batch_ex, every row's logits): for every
 *              N and placement, the batched split with micro-batches pipelined over the devices, the split with
 *              one micro-batch, and the unsplit walk (MEMRA_BATCH_PP=0) are bit-identical to the door-shut batch;
 *              red unless every stage's batch walker ran each micro-batch, the split counter advanced by them
 *              (and not at all for the unsplit walk), and, where a placement spreads over devices, the
 *              micro-batch overlap counter advanced; on each of those maps the batch's device greedy loop
 *              (ppn_decode_batch_greedy, each step fed its rows' argmax on the device) gives the ids of the door-shut
 *              step-by-step batch (ppn_decode_batch_ex with ids, fed back by the host), red unless
 *              batch_greedy_steps advanced by its steps and, on the split, every step walked it
 *   spec       greedy decode through verify rounds (ppn_spec_verify, prompt-lookup drafts, and every third round a
 *              draft of one right and one wrong id) gives the reference ids for every N and placement, through the
 *              verify split and the unsplit walk (MEMRA_SPEC_PP=0); red unless drafts were both accepted and
 *              rejected (rollback ran) and, for the split, every verify walked it. The reference: door-shut plain
 *              greedy for f32 weights; for bf16 / f16 weights the door-shut greedy through verifies of no draft
 *              (the same many-rows kernels: their GEMMs round activations to the weight dtype, the single-row
 *              matvec keeps them f32, so a near-tie may fall the other way), with plain greedy's agreement shown
 * A table on stdout; exit status 1 on any mismatch or on a liveness counter that did not advance, and on a failed
 * teardown: a model a row loaded for its placement (a FAIL row of the arm under the row that used it), the shared
 * models and the runtime (FAIL rows of "teardown", before the verdict, which names it among the failed arms); a
 * teardown failure stops nothing, what failed being freed all the same.
 * An error (a status, not a mismatch) stops its arm at that row, which names the cause: a failed model stays
 * refused, so the rows after it would only repeat the failure. The gate then frees both models and loads them
 * again (on a new runtime if the old one refuses), and the next arm runs on those. The last line names the arms
 * that failed.
 * Maps that keep every weight on the primary are published in-process against one loaded model (the seed's
 * in-process A/B); placements over several devices load the model again with that door.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"
#include "core/base/err.h"

typedef struct gate_args {
    const char *model, *backend;
    int dtype, steps, prompt, runs, max_stages, chunk, split, pipelined, soak, prime, batch, spec;
} gate_args;

typedef struct gate {
    gate_args a;
    ppn_rt *rt;
    ppn_model *ref, *work; /* work: loaded with every weight on the primary */
    ppn_model_info mi;
    int n_dev, fails, rows;
    int teardown_fails;    /* FAIL rows of the teardowns of the shared models and the runtime (in fails too) */
    ppn_status broken;     /* the first error of the arm running (PPN_OK: none): the arm stops there */
} gate;

typedef struct config {
    int n, devs[PPN_MAX_STAGES], spread; /* spread 0: all on primary */
    int overlap, streams, shard, graphs;
    int prime_pp, prime_pipe;   /* the prime arm's seams (MEMRA_PRIME_PP, MEMRA_PRIME_PIPE) */
    int batch_pp, micro;        /* the batch arm's seams (MEMRA_BATCH_PP, micro-batches: 0 auto) */
    int spec_pp;                /* the spec arm's seam (MEMRA_SPEC_PP) */
    const char *placement;
} config;

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    return x ^ (x >> 31);
}

/* Feed ids through m (fresh sequence); rows[t] = logits after ids[0..t]. deferred: keep 4 steps in flight. */
static ppn_status trace(ppn_model *m, const int *ids, int n, int deferred, float *rows, int vocab)
{
    ppn_seq *q = NULL;
    PPN_CHECK(ppn_seq_create(m, &q));
    ppn_status st = PPN_OK;
    ppn_step_id pend[PPN_MAX_INFLIGHT];
    int issued = 0, waited = 0;
    while (st == PPN_OK && waited < n) {
        if (!deferred) {
            st = ppn_decode_step(q, ids[waited], rows + (size_t)waited * (size_t)vocab);
            waited++;
            continue;
        }
        if (issued < n && issued - waited < PPN_MAX_INFLIGHT) {
            st = ppn_decode_step_deferred(q, ids[issued], &pend[issued % PPN_MAX_INFLIGHT]);
            issued += pend[issued % PPN_MAX_INFLIGHT] != 0; /* a refused step was never issued */
        } else {
            st = ppn_pending_wait(q, pend[waited % PPN_MAX_INFLIGHT], rows + (size_t)waited * (size_t)vocab);
            waited++;
        }
    }
    /* after a failure, ppn_seq_destroy drops what is still in flight */
    return cli_seq_destroy_after(q, st);
}

static void door_of(const config *c, ppn_door *d)
{
    *d = ppn_door_default();
    d->n_stages = c->n;
    d->overlap = c->overlap;
    d->streams = c->streams;
    d->shard = c->shard;
    d->graphs = c->graphs;
    d->prime_pp = c->prime_pp;
    d->prime_pipe = c->prime_pipe;
    d->batch_pp = c->batch_pp;
    d->spec_pp = c->spec_pp;
    d->allow_unsplit_batch = !c->batch_pp || !c->spec_pp; /* the unsplit walk is a reference arm: run it everywhere */
    if (c->spread) {
        d->n_devices = c->n;
        memcpy(d->devices, c->devs, sizeof(int) * (size_t)c->n);
    }
}

/* The model to run c on: the work model with c published, or a fresh load for a multi-device placement. */
static ppn_status model_for(gate *G, const config *c, ppn_model **out, int *owned)
{
    ppn_door d;
    door_of(c, &d);
    *owned = 0;
    if (!c->spread) {
        *out = G->work;
        return ppn_model_publish_door(G->work, &d);
    }
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = G->a.dtype;
    lo.ctx = G->rows + 8;
    lo.door = &d;
    *owned = 1;
    return ppn_model_load(G->rt, G->a.model, &lo, out);
}

static void row_print(const char *arm, const config *c, const char *result, const char *detail)
{
    char flags[64];
    snprintf(flags, sizeof flags, "%s%s%s%s", c->overlap ? "overlap " : "", c->streams ? "" : "one-stream ",
             c->shard ? "" : "unsharded ", c->graphs ? "" : "eager");
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", arm, c->n, c->placement, flags[0] ? flags : "-", result, detail);
    fflush(stdout);
}

/* Free m where the row loaded it (owned: a placement over several devices). Its failure (a block retired by the
 * free) is a FAIL row of its own under the row that used it; the arm goes on, the model being freed all the same. */
static void row_model_free(gate *G, const char *arm, const config *c, ppn_model *m, int owned)
{
    ppn_status st = owned ? ppn_model_free(m) : PPN_OK;
    if (st == PPN_OK) return;
    char detail[512];
    snprintf(detail, sizeof detail, "model teardown: %s: %s", ppn_status_name(st), ppn_last_error());
    row_print(arm, c, "FAIL", detail);
    G->fails++;
}

/* An unsharded map over devices that cannot reach the primary's weights cannot exist, nor can the unsplit prime
 * walk on stage 0's device reach the other stages' memory without peer access (the runtime refuses both). */
static int config_possible(const gate *G, const config *c)
{
    for (int s = 0; !c->shard && c->spread && s < c->n; s++)
        if (!ppn_rt_peer_possible(G->rt, c->devs[s], 0)) return 0;
    for (int s = 1; (!c->prime_pp || !c->batch_pp || !c->spec_pp) && c->spread && s < c->n; s++)
        if (!ppn_rt_peer_possible(G->rt, c->devs[0], c->devs[s])) return 0;
    return 1;
}

/* Run c against the reference rows; checks bits and the liveness counters. Returns 1 on pass. */
static int run_config(gate *G, const char *arm, const config *c, const int *ids, const float *ref, int deferred,
                      uint64_t *overlap_seen)
{
    if (!config_possible(G, c)) { /* reported, neither passed nor failed */
        row_print(arm, c, "n/a", "no peer grant to the primary: unsharded placement impossible (refused by design)");
        return 1;
    }
    ppn_model *m = NULL;
    int owned = 0, ok = 1;
    char detail[512] = "";
    size_t vocab = (size_t)G->mi.vocab, nrow = (size_t)G->rows;
    float *rows = malloc(sizeof(float) * vocab * nrow);
    ppn_stats before, after;
    ppn_status st = rows ? model_for(G, c, &m, &owned) : PPN_ENOMEM;
    if (st == PPN_OK) {
        ppn_model_get_stats(m, &before);
        st = trace(m, ids, G->rows, deferred, rows, G->mi.vocab);
        ppn_model_get_stats(m, &after);
    }
    if (st != PPN_OK) {
        ok = 0;
        snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
        G->broken = st;
    }
    for (int t = 0; ok && t < G->rows; t++)
        if (memcmp(rows + (size_t)t * vocab, ref + (size_t)t * vocab, sizeof(float) * vocab)) {
            ok = 0;
            snprintf(detail, sizeof detail, "logits of step %d differ from the unsplit run", t);
        }
    for (int s = 0; ok && s < c->n; s++)
        if (after.walker_runs[s] - before.walker_runs[s] < (uint64_t)G->rows) {
            ok = 0;
            snprintf(detail, sizeof detail, "liveness: stage %d's walker ran %llu of %d steps", s,
                     (unsigned long long)(after.walker_runs[s] - before.walker_runs[s]), G->rows);
        }
    if (ok && overlap_seen) *overlap_seen += after.overlap_observed - before.overlap_observed;
    if (ok) snprintf(detail, sizeof detail, "%d steps bit-identical", G->rows);
    row_print(arm, c, ok ? "PASS" : "FAIL", detail);
    G->fails += !ok;
    row_model_free(G, arm, c, m, owned);
    free(rows);
    return ok;
}

/* Placements for n stages: all on the primary; one device per stage; repeated devices (0,1,0,1..). */
static int placements(const gate *G, int n, config *out)
{
    int k = 0;
    out[k++] = (config){.n = n, .placement = "all on device 0"};
    if (G->n_dev < 2) return k;
    config spread = {.n = n, .spread = 1, .placement = "one device per stage"};
    for (int s = 0; s < n; s++) spread.devs[s] = s % G->n_dev;
    out[k++] = spread;
    if (G->n_dev > 2 && n > 2) {
        config rep = {.n = n, .spread = 1, .placement = "repeated devices 0,1,0,1.."};
        for (int s = 0; s < n; s++) rep.devs[s] = s % 2;
        out[k++] = rep;
    }
    return k;
}

static void seams(config *c, int i)
{
    c->prime_pp = c->prime_pipe = c->batch_pp = c->spec_pp = 1;
    c->micro = 0;
    c->streams = 1;
    c->shard = 1;
    c->overlap = 0;
    c->graphs = i != 3;
    if (i == 1) c->overlap = 1;
    if (i == 2 && !c->spread) c->streams = 0;
    if (i == 2 && c->spread) c->shard = 0;
}

static void arm_maps(gate *G, const char *arm, const int *ids, const float *ref, int deferred)
{
    uint64_t overlap = 0;
    int top = G->mi.n_layers < G->a.max_stages ? G->mi.n_layers : G->a.max_stages;
    for (int n = 2; n <= top && !G->broken; n++) {
        config pl[3];
        int np = placements(G, n, pl);
        for (int p = 0; p < np && !G->broken; p++)
            for (int i = 0; i < 4 && !G->broken; i++) {
                config c = pl[p];
                seams(&c, i);
                if (deferred && !c.overlap && i != 0) continue; /* pipelined: default and overlap maps */
                run_config(G, arm, &c, ids, ref, deferred, &overlap);
            }
    }
    if (deferred && !G->broken) {
        int ok = overlap > 0;
        printf("%-10s      pipeline overlap observed %llu times: %s\n", arm, (unsigned long long)overlap,
               ok ? "PASS" : "FAIL (the stages never issued concurrently)");
        G->fails += !ok;
    }
}

/* ids: a seeded prompt, then the reference's greedy continuation; ref: its rows (eager, door shut). */
static ppn_status reference(gate *G, uint64_t seed, int *ids, float *ref)
{
    for (int t = 0; t < G->a.prompt; t++) ids[t] = (int)(mix(seed * 1000003u + (uint64_t)t) % (uint64_t)G->mi.vocab);
    ppn_seq *q = NULL;
    PPN_CHECK(ppn_seq_create(G->ref, &q));
    ppn_status st = PPN_OK;
    ppn_sampler sp;
    ppn_sampler_init(&sp, 0, 0, 1, 0);
    for (int t = 0; t < G->rows && st == PPN_OK; t++) {
        float *row = ref + (size_t)t * (size_t)G->mi.vocab;
        st = ppn_decode_step(q, ids[t], row);
        if (st == PPN_OK && t + 1 < G->rows && t + 1 >= G->a.prompt) st = ppn_sample(&sp, row, G->mi.vocab, &ids[t + 1]);
    }
    return cli_seq_destroy_after(q, st);
}

static void arm_soak(gate *G, int *ids, float *ref)
{
    for (int r = 0; r < G->a.runs && !G->broken; r++) {
        uint64_t seed = (uint64_t)r + 1, h = mix(seed ^ 0xabcdef);
        ppn_status st = reference(G, seed, ids, ref);
        if (st != PPN_OK) {
            printf("soak       run %d: reference failed: %s\n", r, ppn_last_error());
            G->fails++;
            G->broken = st;
            continue;
        }
        int top = G->mi.n_layers < G->a.max_stages ? G->mi.n_layers : G->a.max_stages;
        config pl[3];
        int n = 2 + (int)(h % (uint64_t)(top - 1));
        int np = placements(G, n, pl);
        config c = pl[(h >> 8) % (uint64_t)np];
        seams(&c, 0);
        c.overlap = (int)((h >> 16) & 1);
        char name[64];
        snprintf(name, sizeof name, "soak #%d", r);
        run_config(G, name, &c, ids, ref, 1, NULL);
    }
}

/* The prime arm ----------------------------------------------------------------------------------------- */

/* The rows of prompt i of the count prime_rows cuts from G->rows ids (in order, the remainder to the first ones). */
static int prompt_rows(const gate *G, int count, int i) { return G->rows / count + (i < G->rows % count); }

/* count prompts cut from ids[0..G->rows) primed on fresh sequences of m, every row's logits into rows (in row
 * order): together (ppn_prefill_batch) or one after another. */
static ppn_status prime_rows(gate *G, ppn_model *m, const int *ids, int count, int together, float *rows)
{
    ppn_seq *q[4] = {0};
    const int *p[4];
    int n[4], at = 0;
    ppn_prefill_opts o = {.chunk = G->a.chunk, .all_logits = 1};
    ppn_status st = PPN_OK;
    for (int i = 0; i < count; i++) {
        n[i] = prompt_rows(G, count, i);
        p[i] = ids + at;
        at += n[i];
        if (st == PPN_OK) st = ppn_seq_create(m, &q[i]);
    }
    if (st == PPN_OK && together) st = ppn_prefill_batch(q, p, n, count, &o, rows);
    for (int i = 0, r = 0; st == PPN_OK && !together && i < count; r += n[i], i++)
        st = ppn_prefill(q[i], p[i], n[i], &o, rows + (size_t)r * (size_t)G->mi.vocab);
    for (int i = 0; i < count; i++) st = cli_seq_destroy_after(q[i], st);
    return st;
}

static const char *prime_seam(const config *c)
{
    return !c->prime_pp ? "unsplit walk" : c->prime_pipe ? "split, pipelined" : "split, serial";
}

/* c's prime against ref: bits, and the split-chunk counter for a split walk. Returns 1 on pass. */
static int run_prime(gate *G, const config *c, const int *ids, const float *ref, uint64_t *overlaps)
{
    if (!config_possible(G, c)) { /* reported, neither passed nor failed */
        printf("%-10s %3d  %-28s %-22s %-5s %s\n", "prime", c->n, c->placement, prime_seam(c), "n/a",
               "no peer access from stage 0's device: the unsplit walk is refused by design");
        return 1;
    }
    int chunks = (G->rows + G->a.chunk - 1) / G->a.chunk, owned = 0, ok = 1;
    size_t v = (size_t)G->mi.vocab;
    char detail[512] = "";
    float *rows = malloc(sizeof(float) * v * (size_t)G->rows);
    ppn_model *m = NULL;
    ppn_stats before, after;
    ppn_status st = rows ? model_for(G, c, &m, &owned) : PPN_ENOMEM;
    if (st == PPN_OK) {
        ppn_model_get_stats(m, &before);
        st = prime_rows(G, m, ids, 1, 0, rows);
        ppn_model_get_stats(m, &after);
    }
    if (st != PPN_OK) {
        ok = 0;
        snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
        G->broken = st;
    }
    for (int t = 0; ok && t < G->rows; t++)
        if (memcmp(rows + (size_t)t * v, ref + (size_t)t * v, sizeof(float) * v)) {
            ok = 0;
            snprintf(detail, sizeof detail, "logits of prompt row %d differ from the door-shut prime", t);
        }
    uint64_t split = ok ? after.prime_split_chunks - before.prime_split_chunks : 0;
    if (ok && c->prime_pp && split < (uint64_t)chunks) {
        ok = 0;
        snprintf(detail, sizeof detail, "liveness: PRIME_SPLIT_CHUNKS advanced by %llu for %d chunks",
                 (unsigned long long)split, chunks);
    }
    if (ok && !c->prime_pp && split) {
        ok = 0;
        snprintf(detail, sizeof detail, "the unsplit walk counted %llu split chunks", (unsigned long long)split);
    }
    if (ok && c->prime_pipe && c->prime_pp) *overlaps += after.prime_pipe_overlaps - before.prime_pipe_overlaps;
    if (ok) snprintf(detail, sizeof detail, "%d rows in %d chunks bit-identical", G->rows, chunks);
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "prime", c->n, c->placement, prime_seam(c), ok ? "PASS" : "FAIL",
           detail);
    G->fails += !ok;
    row_model_free(G, "prime", c, m, owned);
    free(rows);
    return ok;
}

/* The size of the chunk that holds row r of rows cut into chunks of up to chunk (as ppn_prefill_batch cuts them). */
static int chunk_at(int r, int rows, int chunk)
{
    if (chunk > rows) chunk = rows;
    int start = r / chunk * chunk;
    return rows - start < chunk ? rows - start : chunk;
}

/* Which rows of the count prompts prime_rows cuts (in row order) must be bit-identical primed together and alone:
 * row t of prompt i, as every earlier row of its prompt, sits in chunks whose sizes the model sums alike
 * (ppn_model_rows_same_bits); exact[r] 1 for those. Returns the first row that is not, or -1. */
static int batch_exact_rows(const gate *G, ppn_model *m, int count, unsigned char *exact, int *size_a, int *size_b)
{
    int first = -1;
    for (int i = 0, base = 0; i < count; i++) {
        int n = prompt_rows(G, count, i), same = 1;
        for (int t = 0; t < n; t++) {
            int a = chunk_at(t, n, G->a.chunk), b = chunk_at(base + t, G->rows, G->a.chunk);
            same = same && ppn_model_rows_same_bits(m, a, b);
            exact[base + t] = (unsigned char)same;
            if (!same && first < 0) first = base + t, *size_a = a, *size_b = b;
        }
        base += n;
    }
    return first;
}

/* Row t of all against one: -1 where it is within 2e-2 x max(1, max|row of one|) (the bf16 fixtures' tolerance,
 * docs/VALIDATION.md), else the first column that is not; *ratio the worst |difference| over that bound. */
static long row_within(const float *one, const float *all, size_t v, double *ratio)
{
    double top = 1.0, worst = 0.0;
    for (size_t j = 0; j < v; j++) top = fabs(one[j]) > top ? fabs(one[j]) : top;
    for (size_t j = 0; j < v; j++) {
        double d = fabs((double)all[j] - (double)one[j]) / (2e-2 * top);
        if (!(d <= 1.0)) return (long)j; /* NaN too */
        worst = d > worst ? d : worst;
    }
    *ratio = worst > *ratio ? worst : *ratio;
    return -1;
}

/* Three prompts primed together against each primed alone, on c's map: bit-identical on every row whose chunks
 * sum alike at both sizes (ppn_model_rows_same_bits; all rows at the gate's default sizes), within the bf16
 * tolerance on the rows after one that is not; the batch counters must advance. */
static void run_prime_batch(gate *G, const config *c, const int *ids)
{
    size_t v = (size_t)G->mi.vocab, bytes = sizeof(float) * v * (size_t)G->rows;
    float *one = malloc(bytes), *all = malloc(bytes);
    unsigned char *exact = malloc((size_t)G->rows);
    ppn_model *m = NULL;
    int owned = 0, ok = 1, n_exact = 0, n_same = 0, size_a = 0, size_b = 0;
    double ratio = 0.0;
    char detail[512] = "";
    ppn_stats before, after;
    ppn_status st = one && all && exact ? model_for(G, c, &m, &owned) : PPN_ENOMEM;
    if (st == PPN_OK) st = prime_rows(G, m, ids, 3, 0, one);
    if (st == PPN_OK) {
        ppn_model_get_stats(m, &before);
        st = prime_rows(G, m, ids, 3, 1, all);
        ppn_model_get_stats(m, &after);
    }
    if (st != PPN_OK) ok = 0, G->broken = st, snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    int first = ok ? batch_exact_rows(G, m, 3, exact, &size_a, &size_b) : -1;
    for (int r = 0; ok && r < G->rows; r++) {
        const float *o = one + (size_t)r * v, *a = all + (size_t)r * v;
        long j = -1;
        if (exact[r] && memcmp(o, a, sizeof(float) * v))
            ok = 0, snprintf(detail, sizeof detail, "batched row %d differs from one by one, where its chunks sum alike", r);
        else if (!exact[r] && !memcmp(o, a, sizeof(float) * v))
            n_same++;
        else if (!exact[r] && (j = row_within(o, a, v, &ratio)) >= 0)
            ok = 0, snprintf(detail, sizeof detail, "batched row %d, logit %ld: %g against %g one by one, past the bf16 "
                             "tolerance", r, j, (double)a[j], (double)o[j]);
        n_exact += exact[r];
    }
    if (ok && after.prime_batches == before.prime_batches)
        ok = 0, snprintf(detail, sizeof detail, "liveness: STEP35_PRIME_BATCHES did not advance");
    if (ok && c->n > 1 && after.prime_batch_splits == before.prime_batch_splits)
        ok = 0, snprintf(detail, sizeof detail, "liveness: STEP35_PRIME_BATCH_SPLITS did not advance");
    unsigned long long splits = (unsigned long long)(after.prime_batch_splits - before.prime_batch_splits);
    if (ok && first < 0)
        snprintf(detail, sizeof detail, "3 prompts together = one by one; batch chunks split %llu", splits);
    else if (ok)
        snprintf(detail, sizeof detail, "3 prompts together = one by one on %d rows; %d rows from row %d within "
                 "tolerance (%d of them bit-identical, the worst %.3f of it; chunks of %d rows alone, %d together sum "
                 "otherwise); batch chunks split %llu", n_exact, G->rows - n_exact, first, n_same, ratio, size_a, size_b,
                 splits);
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "prime", c->n, c->placement, "3 prompts batched", ok ? "PASS" : "FAIL",
           detail);
    G->fails += !ok;
    row_model_free(G, "prime", c, m, owned);
    free(one);
    free(all);
    free(exact);
}

#define GATE_OVERLAP_TRIES 8

static void arm_prime(gate *G, const int *ids)
{
    size_t v = (size_t)G->mi.vocab;
    float *ref = malloc(sizeof(float) * v * (size_t)G->rows);
    ppn_status st = ref ? prime_rows(G, G->ref, ids, 1, 0, ref) : PPN_ENOMEM;
    if (st != PPN_OK) {
        printf("prime      reference (door shut) failed: %s\n", ppn_last_error());
        G->fails++;
        G->broken = st;
        free(ref);
        return;
    }
    uint64_t overlaps = 0;
    int top = G->mi.n_layers < G->a.max_stages ? G->mi.n_layers : G->a.max_stages;
    for (int n = 2; n <= top && !G->broken; n++) {
        config pl[3];
        int np = placements(G, n, pl);
        for (int p = 0; p < np && !G->broken; p++)
            for (int i = 0; i < 3 && !G->broken; i++) {
                config c = pl[p];
                seams(&c, 0);
                c.prime_pp = i != 2;
                c.prime_pipe = i == 1;
                run_prime(G, &c, ids, ref, &overlaps);
            }
    }
    if (G->broken) {
        free(ref);
        return;
    }
    /* Two stage threads' walks meet when stage 1 issues chunk k while stage 0 issues chunk k + 1: with few chunks
     * the host's timing may keep them apart in every run (seen with 2 chunks on the sim), so the pipelined run on
     * two stages is repeated, up to GATE_OVERLAP_TRIES more times, until one meets; red if none ever does. */
    int chunks = (G->rows + G->a.chunk - 1) / G->a.chunk, again = 0;
    if (top >= 2 && chunks >= 2) {
        config pl[3];
        placements(G, 2, pl);
        seams(&pl[0], 0);
        pl[0].prime_pp = pl[0].prime_pipe = 1;
        while (!overlaps && !G->broken && again < GATE_OVERLAP_TRIES && run_prime(G, &pl[0], ids, ref, &overlaps))
            again++;
    }
    int ok = overlaps > 0 || chunks < 2 || top < 2;
    printf("%-10s      prime pipeline overlap observed %llu times%s: %s\n", "prime", (unsigned long long)overlaps,
           again ? " (the 2-stage pipelined run repeated)" : "",
           ok ? (chunks < 2 ? "n/a (one chunk)" : top < 2 ? "n/a (one stage)" : "PASS")
              : "FAIL (no stage walked a chunk while another did)");
    G->fails += !ok;
    config c1 = {.n = 1, .placement = "door shut"}, c2[3];
    seams(&c1, 0);
    c1.prime_pp = c1.prime_pipe = 1;
    run_prime_batch(G, &c1, ids);
    int np = placements(G, 2, c2);
    for (int p = 0; p < np && !G->broken; p++) {
        seams(&c2[p], 0);
        c2[p].prime_pp = c2[p].prime_pipe = 1;
        run_prime_batch(G, &c2[p], ids);
    }
    free(ref);
}

/* The batch arm ----------------------------------------------------------------------------------------- */

#define GATE_B 4

/* GATE_B sequences of m primed with prompts of 1 .. GATE_B ids (cut from ids), then steps batched steps, row i
 * fed ids[prompt_i + t]: every row's logits into rows [steps][GATE_B][vocab]. */
/* GATE_B fresh sequences of m into q (all NULL first), sequence i primed with ids[0 .. i) for 0 < i < primed. */
static ppn_status batch_seqs(ppn_model *m, const int *ids, int primed, ppn_seq **q)
{
    ppn_status st = PPN_OK;
    for (int i = 0; i < GATE_B && st == PPN_OK; i++) {
        st = ppn_seq_create(m, &q[i]);
        if (st == PPN_OK && i > 0 && i < primed) st = ppn_prefill(q[i], ids, i, NULL, NULL);
    }
    return st;
}

static ppn_status batch_rows(gate *G, ppn_model *m, const int *ids, const ppn_batch_opts *o, float *rows)
{
    ppn_seq *q[GATE_B] = {0};
    int steps = G->rows - GATE_B, tok[GATE_B];
    ppn_status st = batch_seqs(m, ids, GATE_B, q);
    for (int t = 0; t < steps && st == PPN_OK; t++) {
        for (int i = 0; i < GATE_B; i++) tok[i] = ids[i + t];
        st = ppn_decode_batch_ex(q, tok, GATE_B, o, rows + (size_t)t * GATE_B * (size_t)G->mi.vocab, NULL);
    }
    for (int i = 0; i < GATE_B; i++) st = cli_seq_destroy_after(q[i], st);
    return st;
}

/* GATE_B sequences of m primed as batch_rows primes them, then steps greedy steps from ids[0 .. GATE_B): through a
 * host loop of ppn_decode_batch_ex that feeds each step's ids back (device 0), or through the device greedy loop
 * (ppn_decode_batch_greedy, device 1); out [steps][GATE_B]. */
static ppn_status batch_greedy_ids(gate *G, ppn_model *m, const int *ids, const ppn_batch_opts *o, int device, int *out)
{
    ppn_seq *q[GATE_B] = {0};
    int steps = G->rows - GATE_B, tok[GATE_B];
    ppn_status st = batch_seqs(m, ids, GATE_B, q);
    memcpy(tok, ids, sizeof tok);
    if (st == PPN_OK && device) st = ppn_decode_batch_greedy(q, tok, GATE_B, steps, o, out);
    for (int t = 0; !device && t < steps && st == PPN_OK; t++) {
        st = ppn_decode_batch_ex(q, tok, GATE_B, o, NULL, out + (size_t)t * GATE_B);
        memcpy(tok, out + (size_t)t * GATE_B, sizeof tok);
    }
    for (int i = 0; i < GATE_B; i++) st = cli_seq_destroy_after(q[i], st);
    return st;
}

/* A mixed step (ppn_batch_opts.n_prime): sequences 0 .. GATE_B - 2 primed as batch_rows primes them decode
 * ids[i] beside sequence GATE_B - 1's prompt slice ids[0 .. GATE_B + 1) in one forward, then one plain step of all
 * GATE_B rows reads the KV the mixed walk wrote: rows [2 GATE_B][vocab] (the decode rows, the slice's last row,
 * the plain step's rows). */
static ppn_status mixed_rows(gate *G, ppn_model *m, const int *ids, int micro, float *rows)
{
    ppn_seq *q[GATE_B] = {0};
    size_t v = (size_t)G->mi.vocab;
    int tok[GATE_B], np = GATE_B + 1;
    ppn_status st = batch_seqs(m, ids, GATE_B - 1, q);
    memcpy(tok, ids, sizeof tok);
    if (st == PPN_OK) {
        const int *pid[1] = {ids};
        float *pl[1] = {rows + (size_t)(GATE_B - 1) * v};
        ppn_batch_opts o = {.micro = micro, .n_prime = 1, .prime_seqs = &q[GATE_B - 1], .prime_ids = pid,
                            .prime_n = &np, .prime_logits = pl};
        st = ppn_decode_batch_ex(q, tok, GATE_B - 1, &o, rows, NULL);
    }
    for (int i = 0; i < GATE_B; i++) tok[i] = ids[i + 1];
    tok[GATE_B - 1] = ids[np];
    if (st == PPN_OK) {
        ppn_batch_opts o = {.micro = micro};
        st = ppn_decode_batch_ex(q, tok, GATE_B, &o, rows + (size_t)GATE_B * v, NULL);
    }
    for (int i = 0; i < GATE_B; i++) st = cli_seq_destroy_after(q[i], st);
    return st;
}

/* The mixed step on m (c's map) against the door-shut model's: bit-identical (the same rows in one walk, so the
 * same GEMM tiles), red unless mixed_steps advanced by one and, on the split, every stage walked it. */
static int run_batch_mixed(gate *G, const config *c, ppn_model *m, const int *ids, const float *ref_mixed)
{
    int ok = 1;
    size_t n = (size_t)2 * GATE_B * (size_t)G->mi.vocab;
    float *got = malloc(sizeof(float) * n);
    char detail[512] = "";
    ppn_stats before, after;
    int micro = c->micro == 1 ? 1 : 0;
    ppn_model_get_stats(m, &before);
    ppn_status st = got ? mixed_rows(G, m, ids, micro, got) : PPN_ENOMEM;
    ppn_model_get_stats(m, &after);
    if (st != PPN_OK) ok = 0, G->broken = st, snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    if (ok && memcmp(got, ref_mixed, sizeof(float) * n))
        ok = 0, snprintf(detail, sizeof detail, "logits of the mixed step or the step after differ from the door-shut "
                                                "model's");
    uint64_t mixed = after.mixed_steps - before.mixed_steps;
    if (ok && mixed != 1)
        ok = 0, snprintf(detail, sizeof detail, "liveness: mixed_steps advanced by %llu for one mixed step",
                         (unsigned long long)mixed);
    for (int s = 0; ok && c->batch_pp && s < c->n; s++)
        if (after.batch_walks[s] - before.batch_walks[s] < 1)
            ok = 0, snprintf(detail, sizeof detail, "liveness: stage %d's batch walker did not walk the mixed step", s);
    if (ok) snprintf(detail, sizeof detail, "%d decode rows + a %d-id prompt slice in one forward, and the step after, "
                     "bit-identical (counter %llu)", GATE_B - 1, GATE_B + 1, (unsigned long long)mixed);
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "batch", c->n, c->placement,
           !c->batch_pp ? "mixed, unsplit" : "mixed, split", ok ? "PASS" : "FAIL", detail);
    fflush(stdout);
    G->fails += !ok;
    free(got);
    return ok;
}

/* The device greedy loop on m (c's map, mb micro-batches a step) against ref_ids; a row of the table. */
static int run_batch_greedy(gate *G, const config *c, ppn_model *m, const int *ids, const int *ref_ids, int mb)
{
    int steps = G->rows - GATE_B, ok = 1;
    int *got = malloc(sizeof(int) * GATE_B * (size_t)steps);
    char detail[512] = "", seam[64];
    ppn_stats before, after;
    ppn_batch_opts o = {.micro = c->micro};
    ppn_model_get_stats(m, &before);
    ppn_status st = got ? batch_greedy_ids(G, m, ids, &o, 1, got) : PPN_ENOMEM;
    ppn_model_get_stats(m, &after);
    if (st != PPN_OK) ok = 0, G->broken = st, snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    for (int t = 0; ok && t < steps; t++)
        if (memcmp(got + (size_t)t * GATE_B, ref_ids + (size_t)t * GATE_B, sizeof(int) * GATE_B))
            ok = 0, snprintf(detail, sizeof detail, "ids of greedy step %d differ from the door-shut step-by-step batch", t);
    uint64_t greedy = after.batch_greedy_steps - before.batch_greedy_steps;
    uint64_t split = after.batch_split_steps - before.batch_split_steps, walks = (uint64_t)steps * (uint64_t)mb;
    if (ok && greedy != (uint64_t)steps)
        ok = 0, snprintf(detail, sizeof detail, "liveness: batch_greedy_steps advanced by %llu for %d steps",
                         (unsigned long long)greedy, steps);
    if (ok && c->batch_pp && split != walks)
        ok = 0, snprintf(detail, sizeof detail, "liveness: the batch split counter advanced by %llu for %llu "
                                                "greedy micro-batches", (unsigned long long)split, (unsigned long long)walks);
    if (ok) snprintf(detail, sizeof detail, "%d rows x %d greedy steps fed on the device = step by step (counter %llu)",
                     GATE_B, steps, (unsigned long long)greedy);
    snprintf(seam, sizeof seam, "greedy, %s", !c->batch_pp ? "unsplit" : c->micro == 1 ? "1 micro-batch" : "micro-batches");
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "batch", c->n, c->placement, seam, ok ? "PASS" : "FAIL", detail);
    fflush(stdout);
    G->fails += !ok;
    free(got);
    return ok;
}

static const char *batch_seam(const config *c)
{
    return !c->batch_pp ? "unsplit walk" : c->micro == 1 ? "split, 1 micro-batch" : "split, micro-batches";
}

/* Distinct devices of c (the micro-batches the split cuts a step into by default). */
static int config_devices(const config *c)
{
    if (!c->spread) return 1;
    int n = 0;
    for (int s = 0; s < c->n; s++) {
        int seen = 0;
        for (int t = 0; t < s; t++) seen |= c->devs[t] == c->devs[s];
        n += !seen;
    }
    return n > GATE_B ? GATE_B : n;
}

static int run_batch(gate *G, const config *c, const int *ids, const float *ref, const int *ref_ids,
                     const float *ref_mixed, uint64_t *overlaps)
{
    if (!config_possible(G, c)) {
        printf("%-10s %3d  %-28s %-22s %-5s %s\n", "batch", c->n, c->placement, batch_seam(c), "n/a",
               "no peer access from stage 0's device: the unsplit walk is refused by design");
        return 1;
    }
    int steps = G->rows - GATE_B, owned = 0, ok = 1;
    int mb = !c->batch_pp ? 1 : c->micro ? c->micro : config_devices(c);
    size_t bytes = sizeof(float) * (size_t)G->mi.vocab * GATE_B * (size_t)steps;
    char detail[512] = "";
    float *rows = malloc(bytes);
    ppn_model *m = NULL;
    ppn_stats before, after;
    ppn_batch_opts o = {.micro = c->micro};
    ppn_status st = rows ? model_for(G, c, &m, &owned) : PPN_ENOMEM;
    if (st == PPN_OK) {
        ppn_model_get_stats(m, &before);
        st = batch_rows(G, m, ids, &o, rows);
        ppn_model_get_stats(m, &after);
    }
    if (st != PPN_OK) ok = 0, G->broken = st, snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    for (int t = 0; ok && t < steps; t++)
        if (memcmp(rows + (size_t)t * GATE_B * G->mi.vocab, ref + (size_t)t * GATE_B * G->mi.vocab,
                   sizeof(float) * GATE_B * (size_t)G->mi.vocab))
            ok = 0, snprintf(detail, sizeof detail, "logits of batched step %d differ from the door-shut batch", t);
    uint64_t walks = (uint64_t)steps * (uint64_t)mb, split = after.batch_split_steps - before.batch_split_steps;
    for (int s = 0; ok && c->batch_pp && s < c->n; s++)
        if (after.batch_walks[s] - before.batch_walks[s] != walks)
            ok = 0, snprintf(detail, sizeof detail, "liveness: stage %d's batch walker ran %llu of %llu micro-batches",
                             s, (unsigned long long)(after.batch_walks[s] - before.batch_walks[s]),
                             (unsigned long long)walks);
    if (ok && c->batch_pp && split != walks)
        ok = 0, snprintf(detail, sizeof detail, "liveness: the batch split counter advanced by %llu for %llu "
                                                "micro-batches", (unsigned long long)split, (unsigned long long)walks);
    if (ok && !c->batch_pp && split)
        ok = 0, snprintf(detail, sizeof detail, "the unsplit walk counted %llu split walks", (unsigned long long)split);
    if (ok && mb > 1) *overlaps += after.batch_pipe_overlaps - before.batch_pipe_overlaps;
    if (ok) snprintf(detail, sizeof detail, "%d rows x %d steps bit-identical (%d micro-batch%s)", GATE_B, steps, mb,
                     mb == 1 ? "" : "es");
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "batch", c->n, c->placement, batch_seam(c), ok ? "PASS" : "FAIL",
           detail);
    fflush(stdout);
    G->fails += !ok;
    if (st == PPN_OK) ok &= run_batch_greedy(G, c, m, ids, ref_ids, mb);
    if (st == PPN_OK && !G->broken) ok &= run_batch_mixed(G, c, m, ids, ref_mixed);
    row_model_free(G, "batch", c, m, owned);
    free(rows);
    return ok;
}

static void arm_batch(gate *G, const int *ids)
{
    if (G->rows < GATE_B + 2) { /* the mixed step's slice and the step after take GATE_B + 2 ids */
        printf("batch      needs at least %d rows (--prompt + --steps)\n", GATE_B + 2);
        G->fails++;
        return;
    }
    size_t bytes = sizeof(float) * (size_t)G->mi.vocab * GATE_B * (size_t)(G->rows - GATE_B);
    float *ref = malloc(bytes);
    int *ref_ids = malloc(sizeof(int) * GATE_B * (size_t)(G->rows - GATE_B));
    float *ref_mixed = malloc(sizeof(float) * 2 * GATE_B * (size_t)G->mi.vocab);
    ppn_status st = ref && ref_ids && ref_mixed ? batch_rows(G, G->ref, ids, NULL, ref) : PPN_ENOMEM;
    if (st == PPN_OK) st = batch_greedy_ids(G, G->ref, ids, NULL, 0, ref_ids);
    if (st == PPN_OK) st = mixed_rows(G, G->ref, ids, 0, ref_mixed);
    if (st != PPN_OK) {
        printf("batch      reference (door shut) failed: %s\n", ppn_last_error());
        G->fails++;
        G->broken = st;
        free(ref);
        free(ref_ids);
        free(ref_mixed);
        return;
    }
    uint64_t overlaps = 0;
    int spread = 0, top = G->mi.n_layers < G->a.max_stages ? G->mi.n_layers : G->a.max_stages;
    for (int n = 2; n <= top && !G->broken; n++) {
        config pl[3];
        int np = placements(G, n, pl);
        for (int p = 0; p < np && !G->broken; p++)
            for (int i = 0; i < 3 && !G->broken; i++) {
                config c = pl[p];
                seams(&c, 0);
                c.batch_pp = i != 2;
                c.micro = i == 1 ? 1 : 0;
                spread |= c.batch_pp && !c.micro && config_devices(&c) > 1;
                run_batch(G, &c, ids, ref, ref_ids, ref_mixed, &overlaps);
            }
    }
    free(ref_ids);
    free(ref_mixed);
    if (G->broken) {
        free(ref);
        return;
    }
    int ok = overlaps > 0 || !spread;
    printf("%-10s      micro-batch overlap observed %llu times: %s\n", "batch", (unsigned long long)overlaps,
           ok ? (!spread ? "n/a (one device)" : "PASS") : "FAIL (no stage walked a micro-batch while another did)");
    G->fails += !ok;
    free(ref);
}

/* The spec arm ------------------------------------------------------------------------------------------ */

#define GATE_K 4

/* Greedy ids after the prompt ids[0 .. P) through verify rounds on a fresh sequence of m: out [steps], with the
 * drafts given and accepted counted. truth: the plain greedy ids (a round in three drafts truth's next id, then a
 * wrong one), NULL: prompt lookup only. */
static ppn_status spec_ids(gate *G, ppn_model *m, const int *ids, const int *truth, int *out, int *drafted,
                           int *accepted)
{
    int P = G->a.prompt, steps = G->rows - P, h = P, made = 0, round = 0;
    int *hist = malloc(sizeof(int) * (size_t)(G->rows + GATE_K + 1)), draft[GATE_K], got[GATE_K + 1];
    ppn_seq *q = NULL;
    ppn_status st = hist ? ppn_seq_create(m, &q) : PPN_ENOMEM;
    if (st == PPN_OK && P > 1) st = ppn_prefill(q, ids, P - 1, NULL, NULL);
    if (hist) memcpy(hist, ids, sizeof(int) * (size_t)P);
    while (st == PPN_OK && made < steps) {
        int room = steps - made - 1, want = GATE_K < room ? GATE_K : room, nd = 0, ng = 0;
        if (truth && want >= 2 && round % 3 == 2) {
            draft[0] = truth[made];
            draft[1] = (truth[made + 1] + 1) % G->mi.vocab;
            nd = 2;
        } else if (want > 0) {
            nd = ppn_draft_lookup(hist, h, want, 3, draft);
        }
        st = ppn_spec_verify(q, hist[h - 1], draft, nd, got, &ng);
        *drafted += nd, *accepted += ng - 1;
        for (int j = 0; st == PPN_OK && j < ng && made < steps; j++) out[made++] = got[j], hist[h++] = got[j];
        round++;
    }
    st = cli_seq_destroy_after(q, st);
    free(hist);
    return st;
}

static void run_spec(gate *G, const config *c, const int *ids, const int *truth)
{
    const char *seam = c->n == 1 ? "one stage" : c->spec_pp ? "verify split" : "unsplit walk";
    if (!config_possible(G, c)) {
        printf("%-10s %3d  %-28s %-22s %-5s %s\n", "spec", c->n, c->placement, seam, "n/a",
               "no peer access from stage 0's device: the unsplit walk is refused by design");
        return;
    }
    int steps = G->rows - G->a.prompt, owned = 0, ok = 1, drafted = 0, accepted = 0;
    int *got = malloc(sizeof(int) * (size_t)steps);
    char detail[512] = "";
    ppn_model *m = NULL;
    ppn_stats before, after;
    ppn_status st = got ? model_for(G, c, &m, &owned) : PPN_ENOMEM;
    if (st == PPN_OK) {
        ppn_model_get_stats(m, &before);
        st = spec_ids(G, m, ids, truth, got, &drafted, &accepted);
        ppn_model_get_stats(m, &after);
    }
    if (st != PPN_OK) ok = 0, G->broken = st, snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    for (int t = 0; ok && t < steps; t++)
        if (got[t] != truth[t]) ok = 0, snprintf(detail, sizeof detail, "id %d: %d, plain greedy %d", t, got[t], truth[t]);
    uint64_t verifies = after.spec_verifies - before.spec_verifies;
    uint64_t split = after.spec_split_verifies - before.spec_split_verifies;
    if (ok && (accepted == 0 || accepted == drafted))
        ok = 0, snprintf(detail, sizeof detail, "%d of %d drafts accepted: acceptance and rollback both must run",
                         accepted, drafted);
    if (ok && c->n > 1 && c->spec_pp && split != verifies)
        ok = 0, snprintf(detail, sizeof detail, "liveness: %llu of %llu verifies walked the split",
                         (unsigned long long)split, (unsigned long long)verifies);
    if (ok && !c->spec_pp && split)
        ok = 0, snprintf(detail, sizeof detail, "the unsplit walk counted %llu split verifies", (unsigned long long)split);
    if (ok) snprintf(detail, sizeof detail, "%d ids = plain greedy; %llu verifies, %d of %d drafts accepted", steps,
                     (unsigned long long)verifies, accepted, drafted);
    printf("%-10s %3d  %-28s %-22s %-5s %s\n", "spec", c->n, c->placement, seam, ok ? "PASS" : "FAIL", detail);
    fflush(stdout);
    G->fails += !ok;
    row_model_free(G, "spec", c, m, owned);
    free(got);
}

/* Greedy through verifies of no draft: one row per forward, the many-rows kernels. */
static ppn_status rows_greedy(gate *G, ppn_model *m, const int *ids, int *out)
{
    int P = G->a.prompt, steps = G->rows - P, tok = ids[P - 1], n = 0;
    ppn_seq *q = NULL;
    ppn_status st = ppn_seq_create(m, &q);
    if (st == PPN_OK && P > 1) st = ppn_prefill(q, ids, P - 1, NULL, NULL);
    for (int t = 0; st == PPN_OK && t < steps; t++) st = ppn_spec_verify(q, tok, NULL, 0, &out[t], &n), tok = out[t];
    return cli_seq_destroy_after(q, st);
}

static void arm_spec(gate *G, const int *ids)
{
    int P = G->a.prompt, steps = G->rows - P, *truth = malloc(sizeof(int) * (size_t)steps);
    int *plain = malloc(sizeof(int) * (size_t)steps), f32 = G->mi.dtype == PPN_DTYPE_F32;
    ppn_seq *q = NULL;
    ppn_status st = truth && plain ? ppn_seq_create(G->ref, &q) : PPN_ENOMEM;
    for (int t = 0; st == PPN_OK && t < P - 1; t++) st = ppn_decode_step(q, ids[t], NULL);
    if (st == PPN_OK) st = ppn_decode_greedy(q, ids[P - 1], steps, plain);
    st = cli_seq_destroy_after(q, st);
    if (st == PPN_OK && f32) memcpy(truth, plain, sizeof(int) * (size_t)steps);
    if (st == PPN_OK && !f32) {
        st = rows_greedy(G, G->ref, ids, truth);
        int same = 0;
        while (same < steps && truth[same] == plain[same]) same++;
        printf("%-10s      %s weights: reference = greedy through verifies of no draft; plain greedy agrees on the "
               "first %d of %d ids\n", "spec", ppn_dtype_name(G->mi.dtype), same, steps);
    }
    free(plain);
    if (st != PPN_OK || steps < 3) {
        printf("spec       reference (door shut, plain greedy) failed: %s\n", steps < 3 ? "needs --steps >= 3" : ppn_last_error());
        G->fails++;
        G->broken = st;
        free(truth);
        return;
    }
    config c1 = {.n = 1, .placement = "door shut"};
    seams(&c1, 0);
    run_spec(G, &c1, ids, truth);
    int top = G->mi.n_layers < G->a.max_stages ? G->mi.n_layers : G->a.max_stages;
    for (int n = 2; n <= top && !G->broken; n++) {
        config pl[3];
        int np = placements(G, n, pl);
        for (int p = 0; p < np && !G->broken; p++)
            for (int i = 0; i < 2 && !G->broken; i++) {
                config c = pl[p];
                seams(&c, 0);
                c.spec_pp = i == 0;
                run_spec(G, &c, ids, truth);
            }
    }
    free(truth);
}

static int parse(int argc, char **argv, gate_args *a)
{
    *a = (gate_args){.dtype = PPN_DTYPE_DEFAULT, .steps = 24, .prompt = 8, .runs = 10, .max_stages = 8, .chunk = 7};
    int any = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        int rc = 0;
        if (!strcmp(f, "split")) a->split = any = 1;
        else if (!strcmp(f, "pipelined")) a->pipelined = any = 1;
        else if (!strcmp(f, "soak")) a->soak = any = 1;
        else if (!strcmp(f, "prime")) a->prime = any = 1;
        else if (!strcmp(f, "batch")) a->batch = any = 1;
        else if (!strcmp(f, "spec")) a->spec = any = 1;
        else if (!strcmp(f, "all")) a->split = a->pipelined = a->soak = a->prime = a->batch = a->spec = any = 1;
        else if (!strcmp(f, "--help")) {
            puts("usage: ppn gate --model PATH [--backend B] [--dtype D] [--steps T] [--prompt P] [--runs K]\n"
                 "                [--max-stages N] [--chunk C] [split|pipelined|soak|prime|batch|spec|all]");
            exit(0);
        } else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--backend")) rc = cli_backend(f, v), a->backend = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &a->dtype);
        else if (!strcmp(f, "--steps")) rc = cli_int(f, v, 1, 100000, &x), a->steps = (int)x;
        else if (!strcmp(f, "--prompt")) rc = cli_int(f, v, 1, 100000, &x), a->prompt = (int)x;
        else if (!strcmp(f, "--runs")) rc = cli_int(f, v, 1, 1000000, &x), a->runs = (int)x;
        else if (!strcmp(f, "--max-stages")) rc = cli_int(f, v, 2, PPN_MAX_STAGES, &x), a->max_stages = (int)x;
        else if (!strcmp(f, "--chunk")) rc = cli_int(f, v, 1, PPN_PREFILL_MAX_CHUNK, &x), a->chunk = (int)x;
        else return cli_fail("gate: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (!any) a->split = a->pipelined = a->soak = a->prime = a->batch = a->spec = 1;
    if (!a->model) return cli_fail("gate: --model PATH is required"), 2;
    return 0;
}

/* The reference (door shut, eager) and work (door shut) models on G->rt. */
static ppn_status gate_models(gate *G)
{
    ppn_door shut = ppn_door_default(), eager = shut;
    eager.graphs = 0;
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = G->a.dtype;
    lo.door = &eager;
    G->rows = G->a.prompt + G->a.steps;
    lo.ctx = G->rows + 8;
    PPN_CHECK(ppn_model_load(G->rt, G->a.model, &lo, &G->ref));
    lo.door = &shut;
    PPN_CHECK(ppn_model_load(G->rt, G->a.model, &lo, &G->work));
    ppn_model_get_info(G->ref, &G->mi);
    return PPN_OK;
}

static ppn_status gate_open(gate *G)
{
    PPN_CHECK(ppn_rt_create(G->a.backend, &G->rt));
    G->n_dev = ppn_rt_device_count(G->rt);
    return gate_models(G);
}

/* A teardown of what every arm shares (what: the object): its failure (a block retired by a model's free, the
 * runtime's destroy returning the first failure of its own teardown) is a FAIL row and counts against the gate. */
static void teardown_row(gate *G, const char *what, ppn_status st)
{
    if (st == PPN_OK) return;
    char detail[512];
    snprintf(detail, sizeof detail, "%s: %s", ppn_status_name(st), ppn_last_error());
    printf("%-10s %3s  %-28s %-22s %-5s %s\n", "teardown", "-", what, "-", "FAIL", detail);
    fflush(stdout);
    G->fails++;
    G->teardown_fails++;
}

/* Free both models (each freed whatever the other's free returned). */
static void gate_free_models(gate *G)
{
    teardown_row(G, "model (door shut)", ppn_model_free(G->work));
    teardown_row(G, "reference model (eager)", ppn_model_free(G->ref));
    G->work = G->ref = NULL;
}

static void gate_close(gate *G)
{
    gate_free_models(G);
    teardown_row(G, "runtime", ppn_rt_destroy(G->rt));
    G->rt = NULL;
}

/* After an arm stopped at an error: fresh models for the next arm, on the same runtime when it still loads them
 * (a failed model does not spoil its runtime), else on a new one. */
static ppn_status gate_reopen(gate *G, const char *arm)
{
    printf("ppn gate: arm '%s' stopped at its first error (the FAIL row above names it); the next arm runs on "
           "freshly loaded models\n", arm);
    fflush(stdout);
    G->broken = PPN_OK;
    gate_free_models(G);
    if (gate_models(G) == PPN_OK) return PPN_OK;
    fprintf(stderr, "ppn gate: the runtime refused the fresh models (%s): opening a new runtime\n", ppn_last_error());
    gate_close(G);
    return gate_open(G);
}

typedef void (*gate_arm_fn)(gate *G, const char *arm, int *ids, float *ref);

static void arm_split(gate *G, const char *arm, int *ids, float *ref) { arm_maps(G, arm, ids, ref, 0); }
static void arm_pipelined(gate *G, const char *arm, int *ids, float *ref) { arm_maps(G, arm, ids, ref, 1); }
static void arm_soak_fn(gate *G, const char *arm, int *ids, float *ref) { (void)arm, arm_soak(G, ids, ref); }
static void arm_prime_fn(gate *G, const char *arm, int *ids, float *ref) { (void)arm, (void)ref, arm_prime(G, ids); }
static void arm_batch_fn(gate *G, const char *arm, int *ids, float *ref) { (void)arm, (void)ref, arm_batch(G, ids); }
static void arm_spec_fn(gate *G, const char *arm, int *ids, float *ref) { (void)arm, (void)ref, arm_spec(G, ids); }

/* Run the chosen arms in order; failed (cap bytes) lists the arms with a failure. Returns PPN_OK, or the error
 * that left no runtime to run the next arm on. */
static ppn_status gate_arms(gate *G, int *ids, float *ref, char *failed, size_t cap)
{
    const struct { const char *name; int on; gate_arm_fn fn; } arms[] = {
        {"split", G->a.split, arm_split},  {"pipelined", G->a.pipelined, arm_pipelined},
        {"soak", G->a.soak, arm_soak_fn},  {"prime", G->a.prime, arm_prime_fn},
        {"batch", G->a.batch, arm_batch_fn}, {"spec", G->a.spec, arm_spec_fn},
    };
    int n = (int)(sizeof arms / sizeof arms[0]), last = n - 1;
    while (last >= 0 && !arms[last].on) last--;
    for (int i = 0; i <= last; i++) {
        if (!arms[i].on) continue;
        int before = G->fails;
        arms[i].fn(G, arms[i].name, ids, ref);
        if (G->fails > before) {
            size_t used = strlen(failed);
            snprintf(failed + used, cap - used, "%s%s", used ? ", " : "", arms[i].name);
        }
        if (G->broken && i < last) PPN_CHECK(gate_reopen(G, arms[i].name));
    }
    return PPN_OK;
}

int cmd_gate(int argc, char **argv)
{
    gate G = {0};
    int rc = parse(argc, argv, &G.a);
    if (rc) return rc;
    ppn_status st = gate_open(&G);
    if (st != PPN_OK) {
        rc = cli_fail_status(st, "gate");
        goto out;
    }
    if (G.mi.n_layers < 2) {
        rc = cli_fail("gate: the model has %d layer: nothing to split", G.mi.n_layers);
        goto out;
    }
    printf("ppn gate: %s (%s, %d layers), backend %s, %d device(s), %d steps per run\n", G.a.model, G.mi.arch,
           G.mi.n_layers, ppn_rt_backend(G.rt), G.n_dev, G.rows);
    printf("%-10s %3s  %-28s %-22s %-5s %s\n", "arm", "N", "placement", "seams", "", "detail");
    int *ids = malloc(sizeof(int) * (size_t)G.rows);
    float *ref = malloc(sizeof(float) * (size_t)G.rows * (size_t)G.mi.vocab);
    if (!ids || !ref || (st = reference(&G, 0, ids, ref)) != PPN_OK) {
        rc = ids && ref ? cli_fail_status(st, "gate: reference run") : cli_fail("out of memory");
        free(ids);
        free(ref);
        goto out;
    }
    char failed[128] = "";
    st = gate_arms(&G, ids, ref, failed, sizeof failed);
    free(ids);
    free(ref);
    if (st != PPN_OK) {
        rc = cli_fail_status(st, "gate: no runtime for the next arm");
        goto out;
    }
    gate_close(&G); /* before the verdict: a failed teardown makes it red */
    if (G.teardown_fails) {
        size_t used = strlen(failed);
        snprintf(failed + used, sizeof failed - used, "%steardown", used ? ", " : "");
    }
    printf("ppn gate: %s (%d failure%s%s%s)\n", G.fails ? "FAIL" : "PASS", G.fails, G.fails == 1 ? "" : "s",
           G.fails ? "; failed arms: " : "", failed);
    return G.fails ? 1 : 0;
out: /* rc is 1 or 2 already: a teardown's failure is printed (cli.h) */
    rc = cli_model_free(G.work, rc);
    rc = cli_model_free(G.ref, rc);
    return cli_rt_destroy(G.rt, rc);
}
