/* cmd_run.c - `ppn run`: greedy or sampled decode of a prompt (ids, or text through the checkpoint's tokenizer and
 * chat template); ids or text on stdout; logits to a file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tools/cli.h"
#include "tools/run_batch.h"
#include "tools/run_spec.h"
#include "tools/run_text.h"

typedef struct run_args {
    const char *model, *backend, *logits_out;
    const char *prompt, *system; /* --prompt TEXT, --system TEXT */
    int chat;                  /* --chat: the prompt as a user message through the chat template */
    int dtype, ctx, n_new, n_set, json, quiet, top_k, check_unsplit, device_greedy;
    int chunk;                 /* prompt rows per prefill chunk; 0: fed token by token */
    int spec;                  /* --spec K: greedy through verify rounds of up to K prompt-lookup drafts */
    ppn_door door;
    int *ids, n_ids;
    double temp, top_p;
    uint64_t seed;
    run_prompts more;          /* --ids given again, or --ids-file: every prompt, decoded as one batch */
} run_args;

static void run_usage(FILE *f)
{
    fputs("usage: ppn run --model PATH [--backend auto|sim|cuda] [--dtype f32|bf16|f16] --ids 1,300,401 [--ids ..]\n"
          "               [--ids-file FILE] [--spec K] | --prompt TEXT [--chat] [--system TEXT]\n"
          "               [-n 150] [--temp 0] [--top-k K] [--top-p P] [--seed S] [--ctx C]\n"
          "               [--logits-out FILE] [--json] [--quiet] [--check-unsplit] [--device-greedy] [--chunk C]\n"
          "               [--stages N] [--splits c1,..] [--devices d0,..] [--overlap 0|1] [--streams 0|1]\n"
          "               [--shard 0|1] [--spin 0|1] [--graphs 0|1] [--fuse 0|1] [--attn-tc 0|1]   (the door;\n"
          "               MEMRA_PP_*, PPN_SPIN, PPN_GRAPHS, PPN_FUSE and PPN_ATTN_TC in the environment say the same)\n"
          "stdout: the generated ids (not the prompt), comma-separated; --json: one object.\n"
          "--prompt TEXT: the text through the tokenizer beside the model (its tokenizer.json), with the special\n"
          "tokens its config adds (BOS or not); --chat: as one user message (after a --system message, if given)\n"
          "through the checkpoint's chat template with the generation prompt. Generation (-n, default 256 here)\n"
          "stops at an end token: the model config's eos id, the tokenizer config's eos_token, or the token the chat\n"
          "template ends an assistant turn with (e.g. <|im_end|>, <|eot_id|>). stdout: the generated text, streamed,\n"
          "without the end token, then a newline; --json adds \"text\" and \"stop_ids\" (\"ids\" has the end token).\n"
          "--logits-out: float32 [T, vocab], row t = logits after feeding ids[0..t], prompt and generated.\n"
          "--chunk C: the prompt is primed C rows at a time (ppn_prefill; default 2048); 0 feeds it token by token.\n"
          "Several prompts (--ids repeated, or --ids-file with one comma-separated prompt a line) are primed together\n"
          "and decoded as one batch (ppn_decode_batch_ex): one output line per prompt, in order.\n"
          "--spec K: greedy decode through speculative verify rounds (ppn_spec_verify) of up to K drafts from prompt\n"
          "lookup (ppn_draft_lookup): the same ids as plain greedy, fewer forwards when the text repeats itself.\n",
          f);
}

/* On a refusal a->ids may hold a list parsed before it: the caller frees it (cmd_run's one exit). */
static int parse(int argc, char **argv, run_args *a)
{
    *a = (run_args){.dtype = PPN_DTYPE_DEFAULT, .n_new = 16, .top_p = 1.0, .chunk = PPN_PREFILL_CHUNK};
    if (ppn_door_from_env(&a->door) != PPN_OK) return cli_fail("%s", ppn_last_error()), 2;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        int rc = cli_door_flag(&a->door, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            run_usage(stdout);
            free(a->ids);
            exit(0);
        } else if (!strcmp(f, "--json")) a->json = 1;
        else if (!strcmp(f, "--check-unsplit")) a->check_unsplit = 1;
        else if (!strcmp(f, "--device-greedy")) a->device_greedy = 1;
        else if (!strcmp(f, "--quiet")) a->quiet = 1;
        else if (!strcmp(f, "--chat")) a->chat = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--backend")) rc = cli_backend(f, v), a->backend = v;
        else if (!strcmp(f, "--logits-out")) a->logits_out = v;
        else if (!strcmp(f, "--prompt")) a->prompt = v;
        else if (!strcmp(f, "--system")) a->system = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &a->dtype);
        else if (!strcmp(f, "--ids") && !a->ids) rc = cli_ids(f, v, &a->ids, &a->n_ids);
        else if (!strcmp(f, "--ids")) {
            int *ids = NULL, n = 0;
            if (!(rc = cli_ids(f, v, &ids, &n))) rc = run_prompts_add(&a->more, ids, n);
        } else if (!strcmp(f, "--ids-file")) rc = run_prompts_file(&a->more, f, v);
        else if (!strcmp(f, "-n")) rc = cli_int(f, v, 0, 1 << 30, &x), a->n_new = (int)x, a->n_set = 1;
        else if (!strcmp(f, "--ctx")) rc = cli_int(f, v, 1, 1 << 30, &x), a->ctx = (int)x;
        else if (!strcmp(f, "--chunk")) rc = cli_int(f, v, 0, PPN_PREFILL_MAX_CHUNK, &x), a->chunk = (int)x;
        else if (!strcmp(f, "--spec")) rc = cli_int(f, v, 1, PPN_SPEC_MAX_DRAFT, &x), a->spec = (int)x;
        else if (!strcmp(f, "--top-k")) rc = cli_int(f, v, 0, 1 << 30, &x), a->top_k = (int)x;
        else if (!strcmp(f, "--temp")) rc = cli_float(f, v, 0, 1e6, &a->temp);
        else if (!strcmp(f, "--top-p")) rc = cli_float(f, v, 1e-9, 1, &a->top_p);
        else if (!strcmp(f, "--seed")) rc = cli_u64(f, v, &a->seed);
        else return cli_fail("run: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (!a->model) return cli_fail("run: --model PATH is required"), 2;
    if ((a->chat || a->system) && !a->prompt) return cli_fail("run: --chat and --system need --prompt TEXT"), 2;
    if (a->prompt && (a->ids || a->more.count || a->spec || a->device_greedy))
        return cli_fail("run: --prompt TEXT is the prompt: it takes no --ids, --ids-file, --spec or --device-greedy"), 2;
    if (a->system && !a->chat) return cli_fail("run: --system needs --chat (it is a chat message)"), 2;
    if (a->prompt && !a->n_set) a->n_new = 256;
    if (a->spec && (a->temp != 0 || a->top_k || a->top_p != 1.0 || a->logits_out || a->check_unsplit ||
                    a->device_greedy || a->more.count))
        return cli_fail("run: --spec K is greedy decoding of one prompt through verify rounds: it takes no --temp, "
                        "--top-k, --top-p, --logits-out, --check-unsplit, --device-greedy or several prompts"), 2;
    if (a->more.count && (a->logits_out || a->check_unsplit || a->device_greedy))
        return cli_fail("run: several prompts decode as one batch: --logits-out, --check-unsplit and "
                        "--device-greedy take one prompt"), 2;
    if (a->device_greedy && (a->temp != 0 || a->top_k || a->top_p != 1.0 || a->logits_out || a->check_unsplit))
        return cli_fail("run: --device-greedy is greedy decoding on the device: it takes no --temp, --top-k, "
                        "--top-p, --logits-out or --check-unsplit (no logits reach the host)"), 2;
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void print_ids(FILE *f, const int *ids, int n)
{
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", ids[i]);
}

typedef struct run_out {
    int *gen;
    int n_gen;
    double prefill_s, decode_s;
    float *rows;   /* every fed id's logits, with --check-unsplit */
    int n_rows;
    int stopped;   /* generation ended at an end id (--prompt), the last of gen */
} run_out;

/* --device-greedy: the prompt but its last id fed (primed with --chunk), then ppn_decode_greedy from it. */
static int decode_device_greedy(ppn_seq *seq, const run_args *a, const ppn_model_info *mi, run_out *o)
{
    ppn_status st = PPN_OK;
    if (a->n_ids < 1) return cli_fail("run: --device-greedy needs at least one prompt id (--ids)");
    if (!(o->gen = malloc(sizeof(int) * (size_t)(a->n_new + 1)))) return cli_fail("out of memory");
    double t0 = now_s();
    st = cli_feed(seq, a->ids, a->n_ids - 1, a->chunk, mi->vocab, NULL, NULL);
    o->prefill_s = now_s() - t0;
    if (st == PPN_OK && a->n_new > 0) st = ppn_decode_greedy(seq, a->ids[a->n_ids - 1], a->n_new, o->gen);
    o->decode_s = now_s() - t0 - o->prefill_s;
    if (st != PPN_OK) return cli_fail_status(st, "device greedy decode");
    o->n_gen = a->n_new;
    return 0;
}

/* Feed the prompt, then generate; every logits row goes to lf (if any). */
/* Every row of logits r[0..n) to the --logits-out file (lf may be NULL) and to o->rows (with --check-unsplit). */
static int keep_rows(const run_args *a, FILE *lf, run_out *o, const float *r, int n, int vocab)
{
    size_t v = (size_t)vocab;
    if (o->rows && r != o->rows + (size_t)o->n_rows * v) memcpy(o->rows + (size_t)o->n_rows * v, r, sizeof(float) * v * (size_t)n);
    if (o->rows) o->n_rows += n;
    if (lf && fwrite(r, sizeof(float), v * (size_t)n, lf) != v * (size_t)n)
        return cli_fail("--logits-out %s: write failed", a->logits_out);
    return 0;
}

/* Feed the prompt (primed --chunk rows at a time, or token by token), then generate; every logits row goes to lf
 * (if any). */
/* --spec K: greedy through verify rounds; the verify counts on stderr. */
static int decode_spec(ppn_seq *seq, const run_args *a, const ppn_model_info *mi, run_out *o)
{
    if (a->n_ids < 1) return cli_fail("run: --spec needs at least one prompt id (--ids)");
    if (!(o->gen = malloc(sizeof(int) * (size_t)(a->n_new + 1)))) return cli_fail("out of memory");
    run_spec_stats rs;
    double t0 = now_s();
    ppn_status st = run_spec_decode(seq, a->ids, a->n_ids, a->n_new, a->spec, a->chunk, mi->vocab, o->gen, &rs);
    o->decode_s = now_s() - t0;
    if (st != PPN_OK) return cli_fail_status(st, "speculative decode");
    o->n_gen = a->n_new;
    if (!a->quiet && !a->json)
        fprintf(stderr, "ppn: --spec %d: %d verify forwards for %d ids, %d of %d drafts accepted\n", a->spec,
                rs.verifies, a->n_new, rs.accepted, rs.drafted);
    return 0;
}

/* text (may be NULL): each sampled id's text streamed; an end id stops generation (with --logits-out and
 * --check-unsplit it is fed too, so every id has its row). */
static int decode(ppn_seq *seq, const ppn_model_info *mi, const run_args *a, FILE *lf, run_text *text, run_out *o)
{
    if (a->device_greedy) return decode_device_greedy(seq, a, mi, o);
    if (a->spec) return decode_spec(seq, a, mi, o);
    size_t v = (size_t)mi->vocab;
    int keep = lf || a->check_unsplit;
    /* With --logits-out the last generated id is fed too, so every id has its row (the fixtures' rule). */
    int feeds = a->n_ids + a->n_new - (keep ? 0 : 1);
    float *logits = malloc(sizeof(float) * v);
    o->gen = malloc(sizeof(int) * (size_t)(a->n_new + 1));
    if (a->check_unsplit) o->rows = malloc(sizeof(float) * v * (size_t)(feeds > a->n_ids ? feeds : a->n_ids));
    float *prompt_rows = !keep ? NULL : o->rows ? o->rows : malloc(sizeof(float) * v * (size_t)a->n_ids);
    if (!logits || !o->gen || (a->check_unsplit && !o->rows) || (keep && !prompt_rows)) {
        if (prompt_rows != o->rows) free(prompt_rows);
        return free(logits), cli_fail("out of memory");
    }
    ppn_sampler sp;
    ppn_sampler_init(&sp, (float)a->temp, a->top_k, (float)a->top_p, a->seed);
    int rc = 0, tok = 0;
    double t0 = now_s();
    ppn_status st = cli_feed(seq, a->ids, a->n_ids, a->chunk, mi->vocab, prompt_rows, logits);
    o->prefill_s = now_s() - t0;
    if (st != PPN_OK) rc = cli_fail_status(st, "prompt");
    if (rc == 0 && keep) rc = keep_rows(a, lf, o, prompt_rows, a->n_ids, mi->vocab);
    for (int t = a->n_ids - 1; t < feeds && rc == 0; t++) {
        if (t >= a->n_ids) {
            if ((st = ppn_decode_step(seq, o->gen[t - a->n_ids], logits)) != PPN_OK) {
                rc = cli_fail_status(st, "decode");
                break;
            }
            if (keep && (rc = keep_rows(a, lf, o, logits, 1, mi->vocab)) != 0) break;
        }
        if (o->n_gen < a->n_new && !o->stopped) {
            if ((st = ppn_sample(&sp, logits, mi->vocab, &tok)) != PPN_OK) rc = cli_fail_status(st, "sample");
            o->gen[o->n_gen++] = tok;
            if (rc == 0 && text && run_text_is_stop(text, tok)) {
                o->stopped = 1;
                feeds = a->n_ids + o->n_gen - (keep ? 0 : 1);
            } else if (rc == 0 && text) {
                rc = run_text_push(text, tok);
            }
        }
    }
    if (rc == 0 && text) rc = run_text_finish(text);
    o->decode_s = now_s() - t0 - o->prefill_s;
    if (prompt_rows != o->rows) free(prompt_rows);
    free(logits);
    return rc;
}

static void report(const run_args *a, const ppn_model *m, const ppn_model_info *mi, const char *backend,
                   const run_text *text, const run_out *o, double load_s)
{
    double tps = o->n_gen > 1 && o->decode_s > 0 ? (o->n_gen - 1) / o->decode_s : 0;
    if (a->json) {
        printf("{\"backend\":\"%s\",\"model\":\"%s\",\"arch\":\"%s\",\"dtype\":\"%s\",\"prompt_ids\":[", backend,
               a->model, mi->arch, ppn_dtype_name(mi->dtype));
        print_ids(stdout, a->ids, a->n_ids);
        printf("],\"ids\":[");
        print_ids(stdout, o->gen, o->n_gen);
        printf("],");
        if (text) {
            run_text_json(text, stdout);
            printf(",\"stopped\":%s,", o->stopped ? "true" : "false");
        }
        printf("\"timing\":{\"load_s\":%.3f,\"prefill_s\":%.6f,\"decode_s\":%.6f,\"tok_per_s\":%.2f},\"stage_map\":",
               load_s, o->prefill_s, o->decode_s, tps);
        cli_json_stage_map(stdout, m);
        printf("}\n");
    } else {
        if (!text) print_ids(stdout, o->gen, o->n_gen), putchar('\n');   /* text: streamed already */
        if (!a->quiet)
            fprintf(stderr, "ppn: %s %s (%s, %d layers), %d prompt + %d generated%s, prompt %.1f tok/s, decode %.1f "
                    "tok/s\n", backend, mi->arch, ppn_dtype_name(mi->dtype), mi->n_layers, a->n_ids, o->n_gen,
                    o->stopped ? " (stopped at an end token)" : "", o->prefill_s > 0 ? a->n_ids / o->prefill_s : 0,
                    tps);
    }
}

/* --check-unsplit: feed the same ids through the unsplit (door shut, one stage) model and require every logits
 * row to be bit-identical. The shut door is published in-process when the weights allow it (one device),
 * else a second model is loaded with the door shut. */
static int check_unsplit(ppn_rt *rt, ppn_model **mp, const run_args *a, const ppn_model_info *mi, const run_out *o)
{
    ppn_door shut = ppn_door_default();
    ppn_model *ref = NULL, *use = *mp;
    ppn_status st = ppn_model_publish_door(use, &shut);
    if (st != PPN_OK) {
        ppn_load_opts lo = ppn_load_opts_default();
        lo.dtype = a->dtype;
        lo.ctx = a->ctx;
        lo.door = &shut;
        if ((st = ppn_model_load(rt, a->model, &lo, &ref)) != PPN_OK) return cli_fail_status(st, "unsplit load");
        use = ref;
    }
    ppn_seq *q = NULL;
    float *x = malloc(sizeof(float) * (size_t)mi->vocab);
    int rc = 0, bad = -1;
    if (!x || (st = ppn_seq_create(use, &q)) != PPN_OK) rc = x ? cli_fail_status(st, "unsplit sequence") : 1;
    size_t v = (size_t)mi->vocab;
    float *prompt = rc == 0 ? malloc(sizeof(float) * v * (size_t)a->n_ids) : NULL;
    if (rc == 0 && !prompt) rc = cli_fail("out of memory");
    /* the prompt fed as the run fed it (primed with the same chunk), then the generated ids one by one */
    if (rc == 0 && (st = cli_feed(q, a->ids, a->n_ids, a->chunk, mi->vocab, prompt, NULL)) != PPN_OK)
        rc = cli_fail_status(st, "unsplit prompt");
    for (int t = 0; t < a->n_ids && rc == 0 && bad < 0; t++)
        if (memcmp(prompt + (size_t)t * v, o->rows + (size_t)t * v, sizeof(float) * v)) bad = t;
    for (int t = a->n_ids; t < o->n_rows && rc == 0 && bad < 0; t++) {
        if ((st = ppn_decode_step(q, o->gen[t - a->n_ids], x)) != PPN_OK) rc = cli_fail_status(st, "unsplit decode");
        else if (memcmp(x, o->rows + (size_t)t * v, sizeof(float) * v)) bad = t;
    }
    free(prompt);
    if (rc == 0 && bad >= 0) rc = cli_fail("unsplit check: logits row %d differs from the unsplit run", bad);
    else if (rc == 0 && !a->quiet)
        fprintf(stderr, "ppn: unsplit check: all %d logits rows bit-identical to the unsplit (1-stage) run\n", o->n_rows);
    rc = cli_seq_destroy(q, rc);
    rc = cli_model_free(ref, rc);
    free(x);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    run_args a;
    ppn_rt *rt = NULL;
    ppn_model *m = NULL;
    ppn_seq *seq = NULL;
    FILE *lf = NULL;
    run_out o = {0};
    run_text text = {0};
    ppn_status st;
    double t0 = now_s();
    int rc = parse(argc, argv, &a);
    if (rc) goto out;
    if (a.prompt && (rc = run_text_open(&text, a.model, a.prompt, a.system, a.chat, !a.json, &a.ids, &a.n_ids)))
        goto out;
    if ((rc = cli_rt_create(a.backend, &rt)) != 0) goto out;
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = a.dtype;
    lo.ctx = a.ctx;
    lo.door = &a.door;
    if (!a.quiet && !a.json) lo.progress = cli_progress;
    if ((st = ppn_model_load(rt, a.model, &lo, &m)) != PPN_OK) {
        rc = cli_fail_status(st, "load");
        goto out;
    }
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    if (a.prompt) run_text_add_stop(&text, mi.eos_id);
    if (a.more.count) { /* several prompts: the first --ids (if any) leads */
        if (a.ids) {
            int *first = a.ids, fn = a.n_ids;
            a.ids = NULL; /* the list owns it now (freed by the add on failure) */
            if ((rc = run_prompts_add(&a.more, first, fn)) != 0) goto out;
            memmove(a.more.ids + 1, a.more.ids, sizeof(int *) * (size_t)(a.more.count - 1));
            memmove(a.more.n + 1, a.more.n, sizeof(int) * (size_t)(a.more.count - 1));
            a.more.ids[0] = first, a.more.n[0] = fn;
        }
        if (!a.quiet && !a.json) cli_print_stage_map(stderr, m);
        run_batch_opts bo = {.n_new = a.n_new, .chunk = a.chunk, .json = a.json, .quiet = a.quiet, .temp = a.temp,
                             .top_p = a.top_p, .top_k = a.top_k, .seed = a.seed};
        rc = run_batch(m, &mi, &a.more, &bo);
        goto out;
    }
    if (!a.ids) {
        if (mi.bos_id < 0) {
            rc = cli_fail("run: --ids is required (the model has no bos_token_id)");
            goto out;
        }
        if (!(a.ids = malloc(sizeof(int)))) {
            rc = cli_fail("out of memory");
            goto out;
        }
        a.ids[0] = mi.bos_id;
        a.n_ids = 1;
    }
    if (a.n_ids + a.n_new > mi.ctx) {
        rc = cli_fail("run: %d prompt + %d new tokens exceed the context of %d positions (--ctx)", a.n_ids, a.n_new,
                      mi.ctx);
        goto out;
    }
    if ((st = ppn_seq_create(m, &seq)) != PPN_OK) {
        rc = cli_fail_status(st, "sequence");
        goto out;
    }
    if (a.logits_out && !(lf = fopen(a.logits_out, "wb"))) {
        rc = cli_fail("--logits-out %s: cannot open for writing", a.logits_out);
        goto out;
    }
    double load_s = now_s() - t0;
    if (!a.quiet && !a.json) cli_print_stage_map(stderr, m);
    run_text *tp = a.prompt ? &text : NULL;
    if ((rc = decode(seq, &mi, &a, lf, tp, &o)) == 0) report(&a, m, &mi, ppn_rt_backend(rt), tp, &o, load_s);
    if (rc == 0 && a.check_unsplit) {
        rc = cli_seq_destroy(seq, rc);
        seq = NULL;
        if (rc == 0) rc = check_unsplit(rt, &m, &a, &mi, &o);
    }
out:
    if (lf && fclose(lf) != 0 && rc == 0) rc = cli_fail("--logits-out %s: write failed", a.logits_out);
    rc = cli_seq_destroy(seq, rc);
    rc = cli_model_free(m, rc);
    rc = cli_rt_destroy(rt, rc);
    free(a.ids);
    run_prompts_free(&a.more);
    run_text_close(&text);
    free(o.gen);
    free(o.rows);
    return rc;
}
