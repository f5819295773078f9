/* embed.c - a minimal embedder of ppn: only <ppn.h> and the installed library.
 *
 *   cc embed.c $(pkg-config --cflags --libs ppn) -o embed
 *   ./embed MODEL [IDS [N]]        e.g. ./embed /tmp/tiny 1,300,401 8
 *
 * Loads MODEL (an HF directory or llama2.c .bin; `ppn mkmodel --shape tiny --out DIR` writes one) on the
 * default backend (PPN_BACKEND, else cuda where a driver, a device and kernels are present, else sim), feeds the
 * prompt IDS (default 1), decodes N more tokens greedily (default 8) and prints them comma-separated: the same
 * line as `ppn run --model MODEL --ids IDS -n N`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ppn.h>

#define MAX_IDS 256

static int fail(const char *what, ppn_status st)
{
    fprintf(stderr, "embed: %s: %s: %s\n", what, ppn_status_name(st), ppn_last_error());
    return 1;
}

/* "1,300,401" -> ids; returns the count, or -1 on a malformed list. */
static int parse_ids(const char *s, int *ids, int max)
{
    int n = 0;
    for (;;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 30 || n == max) return -1;
        ids[n++] = (int)v;
        if (*end == '\0') return n;
        if (*end != ',') return -1;
        s = end + 1;
    }
}

/* Feed the prompt, then pick each next token greedily from the logits and feed it in turn (the last one picked
 * is printed, not fed). */
static int generate(ppn_seq *seq, int vocab, const int *prompt, int n_prompt, int n_new, int *out)
{
    float *logits = malloc(sizeof(float) * (size_t)vocab);
    if (!logits) return fprintf(stderr, "embed: out of memory\n"), 1;
    ppn_sampler sp;
    ppn_sampler_init(&sp, 0.0f, 0, 1.0f, 0); /* temperature 0: greedy, lowest id on ties */
    ppn_status st = PPN_OK;
    int rc = 0;
    for (int t = 0; t < n_prompt && st == PPN_OK; t++) st = ppn_decode_step(seq, prompt[t], logits);
    if (st != PPN_OK) rc = fail("prompt", st);
    for (int i = 0; i < n_new && rc == 0; i++) {
        if ((st = ppn_sample(&sp, logits, vocab, &out[i])) != PPN_OK) rc = fail("sample", st);
        else if (i + 1 < n_new && (st = ppn_decode_step(seq, out[i], logits)) != PPN_OK) rc = fail("decode", st);
    }
    free(logits);
    return rc;
}

int main(int argc, char **argv)
{
    int prompt[MAX_IDS] = {1}, n_prompt = 1, n_new = 8, out[MAX_IDS];
    if (argc < 2 || argc > 4) {
        fprintf(stderr, "usage: embed MODEL [IDS [N]]   e.g. embed /tmp/tiny 1,300,401 8\n");
        return 2;
    }
    if (argc > 2 && (n_prompt = parse_ids(argv[2], prompt, MAX_IDS)) < 0) {
        fprintf(stderr, "embed: IDS must be comma-separated token ids (at most %d): '%s'\n", MAX_IDS, argv[2]);
        return 2;
    }
    if (argc > 3 && ((n_new = atoi(argv[3])) < 1 || n_new > MAX_IDS)) {
        fprintf(stderr, "embed: N must be in [1, %d]: '%s'\n", MAX_IDS, argv[3]);
        return 2;
    }

    ppn_rt *rt = NULL;
    ppn_model *m = NULL;
    ppn_seq *seq = NULL;
    ppn_status st;
    int rc = 1;
    if ((st = ppn_rt_create(NULL, &rt)) != PPN_OK) {
        fail("runtime", st);
        goto out;
    }
    ppn_load_opts lo = ppn_load_opts_default();
    if ((st = ppn_model_load(rt, argv[1], &lo, &m)) != PPN_OK) {
        fail("load", st);
        goto out;
    }
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    if (n_prompt + n_new > mi.ctx) {
        fprintf(stderr, "embed: %d prompt + %d new ids exceed the context of %d\n", n_prompt, n_new, mi.ctx);
        goto out;
    }
    if ((st = ppn_seq_create(m, &seq)) != PPN_OK) {
        fail("sequence", st);
        goto out;
    }
    if ((rc = generate(seq, mi.vocab, prompt, n_prompt, n_new, out)) != 0) goto out;
    for (int i = 0; i < n_new; i++) printf("%s%d", i ? "," : "", out[i]);
    putchar('\n');
    fprintf(stderr, "embed: %s backend, %s (%d layers), %d prompt + %d generated\n", ppn_rt_backend(rt), mi.arch,
            mi.n_layers, n_prompt, n_new);
out:
    /* Child before parent: the sequence, then its model, then the runtime (each takes NULL). */
    ppn_seq_destroy(seq);
    if ((st = ppn_model_free(m)) != PPN_OK) rc = fail("free model", st);
    if ((st = ppn_rt_destroy(rt)) != PPN_OK) rc = fail("destroy runtime", st);
    return rc;
}
