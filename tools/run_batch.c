/* run_batch.c - `ppn run` with several prompts: primed together, then decoded as one batch per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"
#include "tools/run_batch.h"

int run_prompts_add(run_prompts *p, int *ids, int n)
{
    if (p->count == p->cap) {
        int cap = p->cap ? 2 * p->cap : 8;
        int **a = realloc(p->ids, sizeof *a * (size_t)cap);
        if (a) p->ids = a;
        int *b = a ? realloc(p->n, sizeof *b * (size_t)cap) : NULL;
        if (b) p->n = b;
        if (!a || !b) return free(ids), cli_fail("out of memory");
        p->cap = cap;
    }
    p->ids[p->count] = ids;
    p->n[p->count++] = n;
    return 0;
}

int run_prompts_file(run_prompts *p, const char *flag, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return cli_fail("%s %s: cannot open", flag, path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        char what[64];
        snprintf(what, sizeof what, "%s line %d", flag, lineno);
        int *ids = NULL, n = 0;
        rc = cli_ids(what, line, &ids, &n);
        if (rc == 0) rc = run_prompts_add(p, ids, n);
    }
    if (rc == 0 && ferror(f)) rc = cli_fail("%s %s: read failed", flag, path);
    if (rc == 0 && lineno > 0 && p->count == 0) rc = cli_fail("%s %s: no prompt in the file", flag, path), rc = 2;
    free(line);
    fclose(f);
    return rc;
}

void run_prompts_free(run_prompts *p)
{
    for (int i = 0; i < p->count; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n);
    memset(p, 0, sizeof *p);
}

static void print_ids(FILE *f, const int *ids, int n)
{
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", ids[i]);
}

/* Every prompt but its last id primed together (prompts of one id prime nothing). */
static ppn_status prime_all(ppn_seq **seqs, const run_prompts *p, int chunk)
{
    const int **ids = malloc(sizeof *ids * (size_t)p->count);
    int *n = malloc(sizeof *n * (size_t)p->count);
    ppn_seq **q = malloc(sizeof *q * (size_t)p->count);
    ppn_status st = PPN_OK;
    int k = 0;
    if (!ids || !n || !q) st = PPN_ENOMEM;
    for (int i = 0; st == PPN_OK && i < p->count; i++) {
        if (p->n[i] < 2) continue;
        ids[k] = p->ids[i], n[k] = p->n[i] - 1, q[k++] = seqs[i];
    }
    ppn_prefill_opts o = {.chunk = chunk};
    if (st == PPN_OK && k > 0 && chunk > 0) st = ppn_prefill_batch(q, ids, n, k, &o, NULL);
    for (int i = 0; st == PPN_OK && chunk == 0 && i < k; i++)
        for (int t = 0; st == PPN_OK && t < n[i]; t++) st = ppn_decode_step(q[i], ids[i][t], NULL);
    free(ids);
    free(n);
    free(q);
    return st;
}

int run_batch(ppn_model *m, const ppn_model_info *mi, const run_prompts *p, const run_batch_opts *o)
{
    int B = p->count, rc = 0;
    size_t v = (size_t)mi->vocab;
    int greedy = o->temp == 0;
    ppn_seq **seqs = calloc((size_t)B, sizeof *seqs);
    int *tok = malloc(sizeof(int) * (size_t)B), *gen = malloc(sizeof(int) * (size_t)B * (size_t)(o->n_new + 1));
    float *logits = greedy ? NULL : malloc(sizeof(float) * v * (size_t)B);
    ppn_sampler *sp = greedy ? NULL : malloc(sizeof *sp * (size_t)B);
    if (!seqs || !tok || !gen || (!greedy && (!logits || !sp))) rc = cli_fail("out of memory");
    for (int i = 0; rc == 0 && i < B; i++) {
        if (p->n[i] < 1) rc = cli_fail("run: prompt %d is empty", i);
        else if (p->n[i] + o->n_new > mi->ctx)
            rc = cli_fail("run: prompt %d: %d ids + %d new tokens exceed the context of %d positions (--ctx)", i,
                          p->n[i], o->n_new, mi->ctx);
    }
    ppn_status st = PPN_OK;
    for (int i = 0; rc == 0 && i < B; i++)
        if ((st = ppn_seq_create(m, &seqs[i])) != PPN_OK) rc = cli_fail_status(st, "sequence");
    for (int i = 0; rc == 0 && !greedy && i < B; i++)
        ppn_sampler_init(&sp[i], (float)o->temp, o->top_k, (float)o->top_p, o->seed + (uint64_t)i);
    double t0 = cli_now_us(), t1 = t0;
    if (rc == 0 && (st = prime_all(seqs, p, o->chunk)) != PPN_OK) rc = cli_fail_status(st, "prompts");
    t1 = cli_now_us();
    for (int i = 0; i < B && rc == 0; i++) tok[i] = p->ids[i][p->n[i] - 1];
    for (int t = 0; t < o->n_new && rc == 0; t++) {
        int *ids = gen + (size_t)t * (size_t)B;
        if ((st = ppn_decode_batch_ex(seqs, tok, B, NULL, logits, greedy ? ids : NULL)) != PPN_OK) {
            rc = cli_fail_status(st, "batched decode");
            break;
        }
        for (int i = 0; i < B && !greedy && rc == 0; i++)
            if ((st = ppn_sample(&sp[i], logits + (size_t)i * v, mi->vocab, &ids[i])) != PPN_OK)
                rc = cli_fail_status(st, "sample");
        memcpy(tok, ids, sizeof(int) * (size_t)B);
    }
    double t2 = cli_now_us();
    if (rc == 0) {
        double dec_s = (t2 - t1) * 1e-6, tps = o->n_new > 0 && dec_s > 0 ? (double)B * o->n_new / dec_s : 0;
        if (o->json) printf("{\"prompts\":%d,\"outputs\":[", B);
        for (int i = 0; i < B; i++) {
            printf(o->json ? "%s{\"prompt_ids\":[" : "", i ? "," : "");
            if (o->json) print_ids(stdout, p->ids[i], p->n[i]), printf("],\"ids\":[");
            for (int t = 0; t < o->n_new; t++) printf("%s%d", t ? "," : "", gen[(size_t)t * (size_t)B + (size_t)i]);
            printf(o->json ? "]}" : "\n");
        }
        if (o->json)
            printf("],\"timing\":{\"prefill_s\":%.6f,\"decode_s\":%.6f,\"tok_per_s\":%.2f},\"stage_map\":",
                   (t1 - t0) * 1e-6, dec_s, tps), cli_json_stage_map(stdout, m), printf("}\n");
        else if (!o->quiet)
            fprintf(stderr, "ppn: %d prompts as one batch: %d tokens each, decode %.1f tok/s aggregate\n", B,
                    o->n_new, tps);
    }
    for (int i = 0; seqs && i < B; i++) rc = cli_seq_destroy(seqs[i], rc);
    free(seqs);
    free(tok);
    free(gen);
    free(logits);
    free(sp);
    return rc;
}
