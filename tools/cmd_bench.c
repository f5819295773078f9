/* cmd_bench.c - `ppn bench`: batch-1 decode latency per stage count, against the weight-streaming floor.
 *
 * One load; each configuration (one door, or every N of --stages-sweep published in-process) runs warm-up reps
 * and timed reps. A rep is a fresh sequence fed a fixed prompt (timed per step as prefill), then -n greedy
 * decode steps, each timed alone with the monotonic clock around ppn_decode_step (which returns after the
 * logits readback, so a step's time is the whole token latency as a caller sees it). Medians and p99 come
 * from every timed decode step of every timed rep. The floor is weight bytes over the measured device copy
 * bandwidth: batch-1 decode must stream every weight once per token, so no step can beat it.
 * --device-greedy: the decode steps are one ppn_decode_greedy call (the argmax on the device, each step fed by
 * the previous one there, up to 4 in flight); the steps overlap, so each is given the call's time / n and the
 * median is that mean.
 *
 * With PPN_KPROF=1, the kernel-by-kernel account of the timed decode steps follows each configuration: the
 * profile is read just before a rep's first decode step and after its last (every kernel of a step has
 * completed when ppn_decode_step returns), and the differences are summed over the timed reps, so prompt
 * steps and sequence setup are left out. Each --prompt length's timed primes get their own account the same
 * way (read just before and after each timed prime), under its prompt line and in its "prompts" JSON entry.
 * Profiling brackets every launch with an event pair: the step times of a profiled run are slower and not the
 * record.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "tools/cli.h"
#include "tools/bench_batch.h"
#include "core/base/env.h"
#include "core/model/ckpt.h"

/* The H200 device-to-device copy bandwidth measured on the lent machine (docs: DESIGN.md), in GB/s. */
#define BENCH_DEFAULT_BW_GBS 4280.0

typedef struct bench_args {
    const char *model, *shape, *backend;
    int dtype, ctx, n_new, prompt, reps, warmup, json, device_greedy;
    int chunk;                /* prompt rows per prefill chunk (ppn_prefill); 0: token by token */
    int *lens, n_lens;        /* --prompt L1,L2,..: each length's prompt timed alone (lens[0] also before decode) */
    double bw_gbs;
    ppn_door door;
    int stages_flag;          /* --stages was given */
    int *sweep, n_sweep;      /* --stages-sweep (malloc'd), else NULL */
    int kprof;                /* PPN_KPROF=1 (the runtime has validated the variable) */
    int *batch, n_batch;      /* --batch B1,B2,..: batched decode per B instead of the one-sequence reps */
    int spec;                 /* --spec K: the verify step's cost against a decode step */
    int mixed;                /* --mixed P: each batched step also feeds P prompt rows (a mixed step) */
} bench_args;

/* A kernel account: totals over a configuration's timed decode steps, or over the timed primes of one --prompt
 * length, one entry per kernel name. */
typedef struct bench_kern {
    ppn_kernel_time k[PPN_KERNEL_PROFILE_MAX];
    int n;
    int steps;                /* timed decode steps (or primes) the totals cover */
} bench_kern;

/* The measurements of one configuration. */
#define BENCH_MAX_LENS 8

typedef struct bench_result {
    int stages;
    double pp_ms[BENCH_MAX_LENS], pp_tok_s[BENCH_MAX_LENS]; /* per --prompt length: median prompt time, tok/s */
    double median_ms, p99_ms, tok_s, prefill_ms, gbs, floor_ratio;
    size_t pool_peak, pool_reserved;
    uint64_t driver_allocs_timed;
    char *stage_map_json;     /* cli_json_stage_map's text (malloc'd) */
    bench_kern kern;          /* PPN_KPROF=1 only */
    bench_kern pp_kern[BENCH_MAX_LENS]; /* PPN_KPROF=1 only: each --prompt length's timed primes */
} bench_result;

static void bench_usage(FILE *f)
{
    fputs("usage: ppn bench (--model PATH | --shape tiny|qwen3-tiny|llama-1b|llama-8b|qwen2-7b)\n"
          "                 [--backend auto|sim|cuda] [--dtype f32|bf16|f16] [--stages N | --stages-sweep 1,2,4,8]\n"
          "                 [--splits c1,..] [--devices d0,..] [--overlap 0|1] [--streams 0|1] [--shard 0|1] [--spin 0|1]\n"
          "                 [--graphs 0|1] [--fuse 0|1] [--attn-tc 0|1]\n"
          "                 [-n 128] [--prompt 16 | --prompt 512,4096] [--chunk 2048] [--ctx C] [--reps 3] [--warmup 1]\n"
          "                 [--bw-gbs 4280] [--json] [--device-greedy] [--batch 1,4,16,64 [--mixed P]] [--spec K]\n"
          "--shape writes a random checkpoint (seed 1; bf16 unless --dtype) into a temporary directory, removed at exit.\n"
          "Each rep: a fresh sequence, the first --prompt length of fixed ids primed --chunk rows at a time (ppn_prefill;\n"
          "--chunk 0: token by token) and timed, then -n greedy decode steps, each timed. Every --prompt length is also\n"
          "primed alone (warm-up, then --reps timed): prompt tok/s (llama-bench's ppN) and time to first token.\n"
          "floor = weight bytes / --bw-gbs (default 4280 GB/s: the measured H200 device-to-device copy bandwidth).\n"
          "--stages-sweep publishes each N in-process, all stages on the primary device (no --devices, no --splits).\n"
          "--batch: for each B, B sequences primed together with --prompt ids, then -n batched greedy steps timed (like\n"
          "llama-batched-bench's S_TG): aggregate tok/s = B / median step, per-sequence tok/s, and the weight floor;\n"
          "with --device-greedy also the batch's device greedy loop (ppn_decode_batch_greedy: -n steps in one call, up\n"
          "to 4 in flight, each fed on the device): its step time and aggregate tok/s beside the synchronous step's.\n"
          "--mixed P (with --batch): each timed step is a mixed step, one `ppn serve` iteration: the B decode rows and up\n"
          "to P rows of one more sequence's --prompt ids (chunked prefill beside the decodes; it starts over once fed).\n"
          "--spec K: -n rounds of one greedy decode step and one verify of K drafts (K + 1 rows), medians and ratio.\n",
          f);
}

/* Parsing ------------------------------------------------------------------------------------------------- */

static int parse_value(bench_args *a, const char *f, const char *v)
{
    long x;
    int rc;
    if (!strcmp(f, "--model")) return a->model = v, 0;
    if (!strcmp(f, "--shape")) return a->shape = v, 0;
    if (!strcmp(f, "--backend")) return a->backend = v, cli_backend(f, v);
    if (!strcmp(f, "--dtype")) return cli_dtype(f, v, &a->dtype);
    if (!strcmp(f, "--bw-gbs")) return cli_float(f, v, 1e-3, 1e9, &a->bw_gbs);
    if (!strcmp(f, "--prompt")) {
        free(a->lens);
        a->lens = NULL;
        if ((rc = cli_ids(f, v, &a->lens, &a->n_lens))) return rc;
        for (int k = 0; k < a->n_lens; k++)
            if (a->lens[k] < 1 || a->n_lens > BENCH_MAX_LENS)
                return cli_fail("%s: '%s': lengths >= 1, at most %d of them", f, v, BENCH_MAX_LENS), 2;
        a->prompt = a->lens[0];
        return 0;
    }
    if (!strcmp(f, "--chunk")) {
        if ((rc = cli_int(f, v, 0, PPN_PREFILL_MAX_CHUNK, &x))) return rc;
        a->chunk = (int)x;
        return 0;
    }
    if (!strcmp(f, "--batch")) {
        free(a->batch);
        a->batch = NULL;
        if ((rc = cli_ids(f, v, &a->batch, &a->n_batch))) return rc;
        for (int k = 0; k < a->n_batch; k++)
            if (a->batch[k] < 1 || a->batch[k] > 4096) return cli_fail("%s: '%s': each B in [1, 4096]", f, v), 2;
        return 0;
    }
    if (!strcmp(f, "--spec")) {
        if ((rc = cli_int(f, v, 1, PPN_SPEC_MAX_DRAFT, &x))) return rc;
        a->spec = (int)x;
        return 0;
    }
    if (!strcmp(f, "--mixed")) {
        if ((rc = cli_int(f, v, 1, PPN_PREFILL_MAX_CHUNK, &x))) return rc;
        a->mixed = (int)x;
        return 0;
    }
    if (!strcmp(f, "--stages-sweep")) {
        free(a->sweep);
        a->sweep = NULL;
        if ((rc = cli_ids(f, v, &a->sweep, &a->n_sweep))) return rc;
        for (int k = 0; k < a->n_sweep; k++)
            if (a->sweep[k] < 1 || a->sweep[k] > PPN_MAX_STAGES)
                return cli_fail("%s: '%s': each N must be in [1, %d]", f, v, PPN_MAX_STAGES), 2;
        return 0;
    }
    int *dst = !strcmp(f, "-n") ? &a->n_new : !strcmp(f, "--ctx") ? &a->ctx
             : !strcmp(f, "--reps") ? &a->reps : !strcmp(f, "--warmup") ? &a->warmup : NULL;
    if (!dst) return cli_fail("bench: unknown option '%s'", f), 2;
    if ((rc = cli_int(f, v, dst == &a->warmup ? 0 : 1, 1 << 30, &x))) return rc;
    *dst = (int)x;
    return 0;
}

/* Rules that involve several flags (and the door read from the environment). */
static int parse_check(const bench_args *a)
{
    if (!a->model == !a->shape) return cli_fail("bench: give exactly one of --model PATH and --shape NAME"), 2;
    if ((a->batch || a->spec) && (a->sweep || a->n_lens > 1))
        return cli_fail("bench: --batch takes one configuration and one --prompt length (no --stages-sweep)"), 2;
    if (a->spec && a->device_greedy)
        return cli_fail("bench: --spec times greedy decode on the device already (no --device-greedy)"), 2;
    if (a->mixed && (!a->batch || a->device_greedy || a->spec))
        return cli_fail("bench: --mixed P times host-fed batched steps: it needs --batch, and takes no --device-greedy "
                        "or --spec"), 2;
    if (!a->sweep) return 0;
    if (a->stages_flag) return cli_fail("bench: --stages and --stages-sweep are exclusive"), 2;
    if (a->door.n_devices)
        return cli_fail("bench: --stages-sweep publishes every N in-process with all stages on the primary device; "
                        "a placement (--devices or MEMRA_PP_DEVICES) needs a reload per N: run one bench per N "
                        "with --stages N --devices ..."), 2;
    if (a->door.n_cuts)
        return cli_fail("bench: --stages-sweep uses the even split of each N; explicit cuts (--splits/--split or "
                        "MEMRA_PP_SPLITS/MEMRA_PP_SPLIT) fit one N only"), 2;
    return 0;
}

static int parse(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){.dtype = PPN_DTYPE_DEFAULT, .n_new = 128, .prompt = 16, .reps = 3, .warmup = 1,
                      .bw_gbs = BENCH_DEFAULT_BW_GBS, .chunk = PPN_PREFILL_CHUNK};
    if (ppn_door_from_env(&a->door) != PPN_OK) return cli_fail("%s", ppn_last_error()), 2;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--stages")) a->stages_flag = 1;
        int rc = cli_door_flag(&a->door, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            bench_usage(stdout);
            free(a->sweep);
            exit(0);
        }
        if (!strcmp(f, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(f, "--device-greedy")) {
            a->device_greedy = 1;
            continue;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if ((rc = parse_value(a, f, v))) return rc;
    }
    return parse_check(a);
}

/* The temporary checkpoint of --shape ----------------------------------------------------------------------- */

/* The directory is flat (mkmodel writes files only). Removing it uses only calls that are safe in a signal
 * handler, so an interrupted bench does not leave gigabytes of random weights behind. */
static char g_tmpdir[512];
static volatile sig_atomic_t g_tmp_live;

static void rm_flat_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        char buf[4096];
        int removed = 1;
        while (removed) { /* unlinking while reading can skip entries: read again until a pass removes none */
            removed = 0;
            ssize_t n;
            lseek(fd, 0, SEEK_SET);
            while ((n = getdents64(fd, buf, sizeof buf)) > 0) {
                for (ssize_t off = 0; off < n;) {
                    struct dirent64 *e = (struct dirent64 *)(buf + off);
                    off += e->d_reclen;
                    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && unlinkat(fd, e->d_name, 0) == 0)
                        removed = 1;
                }
            }
        }
        close(fd);
    }
    rmdir(dir);
}

static void on_signal(int sig)
{
    if (g_tmp_live) rm_flat_dir(g_tmpdir);
    signal(sig, SIG_DFL);
    raise(sig);
}

static const int k_signals[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_old_sa[3];

static void tmp_remove(void)
{
    if (!g_tmp_live) return;
    rm_flat_dir(g_tmpdir);
    g_tmp_live = 0;
    for (int k = 0; k < 3; k++) sigaction(k_signals[k], &g_old_sa[k], NULL);
}

/* Write the random checkpoint of a->shape into a fresh directory under $TMPDIR (default /tmp). */
static int tmp_checkpoint(const bench_args *a)
{
    const char *base;
    ppn_env_str("TMPDIR", &base);
    if (!base) base = "/tmp"; /* unset or empty: the default the table prints */
    if (snprintf(g_tmpdir, sizeof g_tmpdir, "%s/ppn-bench-XXXXXX", base) >= (int)sizeof g_tmpdir)
        return cli_fail("bench: TMPDIR '%s' is too long", base);
    if (!mkdtemp(g_tmpdir))
        return cli_fail("bench: cannot create a temporary directory in '%s': %s", base, strerror(errno));
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++) sigaction(k_signals[k], &sa, &g_old_sa[k]);
    g_tmp_live = 1;
    int dt = a->dtype == PPN_DTYPE_DEFAULT ? PPN_DTYPE_BF16 : a->dtype == PPN_DTYPE_F32 ? PPN_DTYPE_F32
           : a->dtype == PPN_DTYPE_F16 ? PPN_DTYPE_F16 : PPN_DTYPE_BF16;
    ppn_status st = ppn_mkmodel(a->shape, dt, g_tmpdir, 1);
    if (st != PPN_OK) return cli_fail_status(st, "bench: --shape");
    return 0;
}

/* Timing ------------------------------------------------------------------------------------------------- */

static double now_ms(void) { return cli_now_us() / 1e3; }

/* Kernel account ------------------------------------------------------------------------------------------ */

/* Add sign * the profile snapshot e[0..n) into kn, matching kernels by name. */
static void kern_add(bench_kern *kn, const ppn_kernel_time *e, int n, int sign)
{
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < kn->n && strcmp(kn->k[j].name, e[i].name)) j++;
        if (j == kn->n) {
            if (kn->n == PPN_KERNEL_PROFILE_MAX) continue; /* cannot happen: names are the kernel table's */
            kn->k[kn->n++] = (ppn_kernel_time){.name = e[i].name};
        }
        if (sign > 0) kn->k[j].calls += e[i].calls;
        else kn->k[j].calls -= e[i].calls; /* unsigned: the later snapshot's addition makes it whole again */
        kn->k[j].ms += sign * e[i].ms;
        kn->k[j].bytes += sign * e[i].bytes;
    }
}

/* Subtract (sign -1, before a rep's decode steps) or add (sign +1, after them) the profile read from rt. */
static void kern_snap(ppn_rt *rt, bench_kern *kn, int sign)
{
    ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
    kern_add(kn, e, ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX), sign);
}

/* Reps ---------------------------------------------------------------------------------------------------- */

/* The fixed prompt's id at t. */
static int prompt_id(int t, int vocab) { return (int)(((long long)t * 7919 + 13) % vocab); }

/* Prime seq with the first n prompt ids, --chunk rows at a time; last receives the last row's logits. */
static int prime(ppn_seq *seq, const bench_args *a, int n, int vocab, float *last)
{
    int *ids = calloc((size_t)n, sizeof(int));
    if (!ids) return cli_fail("bench: out of memory for %d prompt ids", n);
    for (int t = 0; t < n; t++) ids[t] = prompt_id(t, vocab);
    ppn_status st = cli_feed(seq, ids, n, a->chunk, vocab, NULL, last);
    free(ids);
    return st == PPN_OK ? 0 : cli_fail_status(st, "bench: prefill");
}

/* One rep: a fresh sequence, the prompt, then n_new greedy steps. pre/dec receive each step's time in ms
 * (NULL for a warm-up rep). kn (NULL: none) receives the kernel account of the decode steps, read from rt.
 * The prompt ids are fixed so that every rep and every configuration does the same work. */
static int one_rep(ppn_model *m, const bench_args *a, int vocab, float *logits, double *pre, double *dec, ppn_rt *rt,
                   bench_kern *kn)
{
    ppn_seq *seq = NULL;
    ppn_sampler sp;
    ppn_sampler_init(&sp, 0.0f, 0, 1.0f, 0);
    ppn_status st = ppn_seq_create(m, &seq);
    if (st != PPN_OK) return cli_fail_status(st, "bench: sequence");
    int rc = 0, tok = 0, *ids = NULL, start = 0;
    int last = a->device_greedy ? a->prompt : a->prompt + a->n_new; /* host-fed steps */
    if (a->chunk > 0) { /* the prompt primed: one time for all of it */
        double t0 = now_ms();
        if ((rc = prime(seq, a, a->prompt, vocab, logits)) != 0) last = 0;
        if (pre) pre[0] = now_ms() - t0;
        if (rc == 0 && (st = ppn_sample(&sp, logits, vocab, &tok)) != PPN_OK) rc = cli_fail_status(st, "bench: sample");
        start = a->prompt;
    }
    for (int t = start; t < last && rc == 0; t++) {
        int in = t < a->prompt ? prompt_id(t, vocab) : tok;
        if (kn && t == a->prompt) kern_snap(rt, kn, -1); /* outside the timed window */
        double t0 = now_ms();
        st = ppn_decode_step(seq, in, logits);
        double dt = now_ms() - t0;
        if (st != PPN_OK) {
            rc = cli_fail_status(st, "bench: decode step");
            break;
        }
        if (t < a->prompt && pre) pre[t] = dt;
        if (t >= a->prompt && dec) dec[t - a->prompt] = dt;
        if ((st = ppn_sample(&sp, logits, vocab, &tok)) != PPN_OK) rc = cli_fail_status(st, "bench: sample");
    }
    if (a->device_greedy && rc == 0) {
        if (!(ids = malloc(sizeof(int) * (size_t)a->n_new))) rc = cli_fail("bench: out of memory for %d ids", a->n_new);
        if (kn && rc == 0) kern_snap(rt, kn, -1);
        double t0 = now_ms();
        if (rc == 0 && (st = ppn_decode_greedy(seq, tok, a->n_new, ids)) != PPN_OK)
            rc = cli_fail_status(st, "bench: device greedy decode");
        double per = (now_ms() - t0) / a->n_new;
        for (int t = 0; t < a->n_new && dec && rc == 0; t++) dec[t] = per;
        free(ids);
    }
    if (kn && rc == 0) {
        kern_snap(rt, kn, +1);
        kn->steps += a->n_new;
    }
    return cli_seq_destroy(seq, rc);
}

/* The stage map's JSON text, captured for the final report. */
static char *stage_map_json(const ppn_model *m)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    cli_json_stage_map(f, m);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Prompt length k alone: a warm-up, then --reps timed primes of fresh sequences; r gets the median time and the
 * prompt tok/s (the time to first token: the last row's logits are on the host when ppn_prefill returns), and
 * with PPN_KPROF=1 the timed primes' kernel account (read from rt outside the timed windows). */
static int bench_prompt(ppn_model *m, const bench_args *a, ppn_rt *rt, int vocab, float *logits, int k,
                        bench_result *r)
{
    double t[64];
    int n = a->reps < 64 ? a->reps : 64, rc = 0;
    bench_kern *kn = a->kprof ? &r->pp_kern[k] : NULL;
    for (int i = -1; i < n && rc == 0; i++) {
        ppn_seq *seq = NULL;
        ppn_status st = ppn_seq_create(m, &seq);
        if (st != PPN_OK) return cli_fail_status(st, "bench: sequence");
        if (kn && i >= 0) kern_snap(rt, kn, -1);
        double t0 = now_ms();
        rc = prime(seq, a, a->lens[k], vocab, logits);
        if (i >= 0) t[i] = now_ms() - t0;
        if (kn && i >= 0 && rc == 0) kern_snap(rt, kn, +1), kn->steps++;
        rc = cli_seq_destroy(seq, rc);
    }
    if (rc) return rc;
    cli_sort(t, n);
    r->pp_ms[k] = cli_median(t, n);
    r->pp_tok_s[k] = r->pp_ms[k] > 0 ? 1e3 * a->lens[k] / r->pp_ms[k] : 0;
    return 0;
}

/* Warm-up reps, then timed reps; r gets the statistics of the timed decode steps (and, with PPN_KPROF=1, their
 * kernel account from rt). */
static int bench_config(ppn_model *m, ppn_rt *rt, const bench_args *a, const ppn_model_info *mi, float *logits,
                        bench_result *r)
{
    int per_rep = a->chunk > 0 ? 1 : a->prompt; /* primed: one time per prompt; else one per prompt step */
    int n_dec = a->reps * a->n_new, n_pre = a->reps * per_rep, rc = 0;
    double *dec = malloc(sizeof(double) * (size_t)n_dec), *pre = malloc(sizeof(double) * (size_t)n_pre);
    ppn_stats before, after;
    if (!dec || !pre) {
        rc = cli_fail("bench: out of memory for %d step times", n_dec + n_pre);
        goto out;
    }
    for (int w = 0; w < a->warmup && rc == 0; w++) rc = one_rep(m, a, mi->vocab, logits, NULL, NULL, rt, NULL);
    if (a->kprof) ppn_rt_kernel_profile_reset(rt);
    ppn_model_get_stats(m, &before);
    for (int k = 0; k < a->reps && rc == 0; k++)
        rc = one_rep(m, a, mi->vocab, logits, pre + (size_t)k * (size_t)per_rep, dec + (size_t)k * (size_t)a->n_new,
                     rt, a->kprof ? &r->kern : NULL);
    if (rc) goto out;
    ppn_model_get_stats(m, &after);
    double floor_ms = 1e3 * (double)mi->weight_bytes / (a->bw_gbs * 1e9);
    r->stages = after.n_stages;
    cli_sort(dec, n_dec);
    cli_sort(pre, n_pre);
    r->median_ms = cli_median(dec, n_dec);
    r->p99_ms = cli_rank(dec, n_dec, 0.99);
    r->prefill_ms = cli_median(pre, n_pre);
    r->tok_s = r->median_ms > 0 ? 1e3 / r->median_ms : 0;
    r->gbs = r->median_ms > 0 ? (double)mi->weight_bytes / (r->median_ms * 1e-3) / 1e9 : 0;
    r->floor_ratio = r->median_ms > 0 ? floor_ms / r->median_ms : 0;
    r->pool_peak = after.pool_peak;
    r->pool_reserved = after.pool_reserved;
    r->driver_allocs_timed = after.driver_allocs - before.driver_allocs;
    if (!(r->stage_map_json = stage_map_json(m))) rc = cli_fail("bench: out of memory for the stage map");
    for (int k = 0; k < a->n_lens && rc == 0; k++) rc = bench_prompt(m, a, rt, mi->vocab, logits, k, r);
out:
    free(dec);
    free(pre);
    return rc;
}

/* Reporting ---------------------------------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* A JSON number; null for what JSON cannot spell (inf, nan). */
static void json_num(FILE *f, const char *key, double x)
{
    if (isfinite(x)) fprintf(f, "\"%s\":%.9g,", key, x);
    else fprintf(f, "\"%s\":null,", key);
}

static const char *model_name(const bench_args *a, char *buf, size_t n)
{
    if (a->model) return a->model;
    snprintf(buf, n, "shape:%s", a->shape);
    return buf;
}

/* What a kernel's time is on this backend. */
static const char *kern_clock(const char *backend)
{
    return strcmp(backend, "sim") ? "device time between an event pair around each launch"
                                   : "CPU wall time of the sim reference kernels (not a device time)";
}

/* Why the step times of a profiled run are not the record. */
static const char *kern_note(const char *backend)
{
    return strcmp(backend, "sim") ? "profiling records an event pair around every launch: step times of a "
                                    "PPN_KPROF=1 run are slower and not the record"
                                  : "profiling times every reference kernel: step times of a PPN_KPROF=1 run are "
                                    "not the record";
}

/* Per decode step (or prime): calls, microseconds, share of the median step (prime), declared bytes / kernel
 * time. */
typedef struct kern_row {
    const char *name;
    double calls, us, share, gbs;
} kern_row;

static int cmp_row_us(const void *x, const void *y)
{
    double a = ((const kern_row *)x)->us, b = ((const kern_row *)y)->us;
    return (a < b) - (a > b); /* descending */
}

/* The rows of the kernel account kn, per unit of unit_ms (the median step or prime), most time first; returns
 * their number. */
static int kern_rows(const bench_kern *kn, double unit_ms, kern_row *rows)
{
    double steps = kn->steps > 0 ? kn->steps : 1, step_us = unit_ms * 1e3;
    int n = 0;
    for (int i = 0; i < kn->n; i++) {
        const ppn_kernel_time *k = &kn->k[i];
        if (k->calls == 0) continue;
        double us = k->ms * 1e3 / steps;
        rows[n++] = (kern_row){k->name, (double)k->calls / steps, us, step_us > 0 ? us / step_us : 0,
                               k->ms > 0 ? k->bytes / (k->ms * 1e-3) / 1e9 : 0};
    }
    qsort(rows, (size_t)n, sizeof *rows, cmp_row_us);
    return n;
}

/* The account kn per unit of unit_ms ("step": the median decode step; "prompt": the median prime) as members of a
 * JSON object, each followed by a comma: kernels_us_per_<unit>, kernels_share and the kernels, most time first. */
static void json_account(const bench_kern *kn, double unit_ms, const char *unit)
{
    kern_row rows[PPN_KERNEL_PROFILE_MAX];
    int n = kern_rows(kn, unit_ms, rows);
    char k_us[32], k_calls[32], k_tot[40];
    snprintf(k_us, sizeof k_us, "us_per_%s", unit);
    snprintf(k_calls, sizeof k_calls, "calls_per_%s", unit);
    snprintf(k_tot, sizeof k_tot, "kernels_us_per_%s", unit);
    double us = 0;
    for (int i = 0; i < n; i++) us += rows[i].us;
    json_num(stdout, k_tot, us);
    json_num(stdout, "kernels_share", unit_ms > 0 ? us / (unit_ms * 1e3) : 0);
    printf("\"kernels\":[");
    for (int i = 0; i < n; i++) {
        printf("%s{\"name\":", i ? "," : "");
        json_str(stdout, rows[i].name);
        putchar(',');
        json_num(stdout, k_calls, rows[i].calls);
        json_num(stdout, k_us, rows[i].us);
        json_num(stdout, "share", rows[i].share);
        if (isfinite(rows[i].gbs)) printf("\"gbs\":%.9g}", rows[i].gbs);
        else printf("\"gbs\":null}");
    }
    printf("],");
}

/* The "kernels" members of a configuration's JSON object (each followed by a comma). */
static void json_kernels(const bench_result *r, const char *backend)
{
    printf("\"kernel_steps\":%d,\"kernel_clock\":", r->kern.steps);
    json_str(stdout, kern_clock(backend));
    printf(",\"kernel_note\":");
    json_str(stdout, kern_note(backend));
    printf(",");
    json_account(&r->kern, r->median_ms, "step");
}

/* A prompt length's account as members of its JSON object (each followed by a comma): per timed prime. */
static void json_prompt_kernels(const bench_kern *kn, double pp_ms)
{
    printf("\"kernel_primes\":%d,", kn->steps);
    json_account(kn, pp_ms, "prompt");
}

static void report_json(const bench_args *a, const ppn_model_info *mi, const char *backend, const bench_result *res,
                        int n_res)
{
    char name[600];
    double floor_ms = 1e3 * (double)mi->weight_bytes / (a->bw_gbs * 1e9);
    printf("{\"model\":");
    json_str(stdout, model_name(a, name, sizeof name));
    printf(",\"arch\":");
    json_str(stdout, mi->arch);
    printf(",\"backend\":\"%s\",\"dtype\":\"%s\",\"kv_dtype\":\"%s\",\"n_layers\":%d,\"weight_bytes\":%zu,", backend,
           ppn_dtype_name(mi->dtype), ppn_dtype_name(mi->kv_dtype), mi->n_layers, mi->weight_bytes);
    json_num(stdout, "bw_gbs", a->bw_gbs);
    json_num(stdout, "floor_ms", floor_ms);
    printf("\"chunk\":%d,\"n\":%d,\"prompt\":%d,\"ctx\":%d,\"reps\":%d,\"warmup\":%d,\"device_greedy\":%s,"
           "\"per_stage_time\":\"not measured\",\"configs\":[",
           a->chunk, a->n_new, a->prompt, mi->ctx, a->reps, a->warmup, a->device_greedy ? "true" : "false");
    for (int k = 0; k < n_res; k++) {
        const bench_result *r = &res[k];
        printf("%s{\"stages\":%d,", k ? "," : "", r->stages);
        json_num(stdout, "median_ms", r->median_ms);
        json_num(stdout, "p99_ms", r->p99_ms);
        json_num(stdout, "tok_s", r->tok_s);
        json_num(stdout, "prefill_ms", r->prefill_ms);
        json_num(stdout, "gbs", r->gbs);
        json_num(stdout, "floor_ratio", r->floor_ratio);
        if (a->kprof) json_kernels(r, backend);
        printf("\"prompts\":[");
        for (int j = 0; j < a->n_lens; j++) {
            printf("%s{\"len\":%d,", j ? "," : "", a->lens[j]);
            json_num(stdout, "ms", r->pp_ms[j]);
            json_num(stdout, "ttft_ms", r->pp_ms[j]);
            if (a->kprof) json_prompt_kernels(&r->pp_kern[j], r->pp_ms[j]);
            printf("\"tok_s\":%.9g}", r->pp_tok_s[j]);
        }
        printf("],");
        printf("\"pool_peak\":%zu,\"pool_reserved\":%zu,\"driver_allocs_timed\":%llu,\"stage_map\":%s}", r->pool_peak,
               r->pool_reserved, (unsigned long long)r->driver_allocs_timed, r->stage_map_json);
    }
    printf("]}\n");
}

static void table_header(const bench_args *a, const ppn_model_info *mi, const char *backend)
{
    char name[600];
    double floor_ms = 1e3 * (double)mi->weight_bytes / (a->bw_gbs * 1e9);
    printf("ppn bench: model %s (%s, %d layers), backend %s, dtype %s (KV cache %s), weights %.4f GB\n",
           model_name(a, name, sizeof name), mi->arch, mi->n_layers, backend, ppn_dtype_name(mi->dtype),
           ppn_dtype_name(mi->kv_dtype), (double)mi->weight_bytes / 1e9);
    printf("floor %.4g ms/token = weight bytes / %g GB/s (measured H200 device-to-device copy bandwidth; --bw-gbs)\n",
           floor_ms, a->bw_gbs);
    printf("%d reps x (%d prompt + %d decode steps), %d warm-up rep%s, ctx %d; per-stage time: not measured\n",
           a->reps, a->prompt, a->n_new, a->warmup, a->warmup == 1 ? "" : "s", mi->ctx);
    if (a->device_greedy)
        printf("--device-greedy: the decode steps are one ppn_decode_greedy call; a step's time = the call's / n\n");
    if (a->kprof) printf("PPN_KPROF=1: %s; kernel time = %s\n", kern_note(backend), kern_clock(backend));
    printf("%6s %10s %10s %10s %11s %9s %11s %13s %13s %10s\n", "stages", "median_ms", "p99_ms", "tok/s",
           "prefill_ms", "GB/s", "floor_ratio", "pool_peak_MB", "pool_rsv_MB", "drv_allocs");
    fflush(stdout);
}

/* The account kn per unit of unit_ms ("step": the median decode step; "prompt": the median prime) as table rows. */
static void table_account(const bench_kern *kn, double unit_ms, const char *unit)
{
    kern_row rows[PPN_KERNEL_PROFILE_MAX];
    int n = kern_rows(kn, unit_ms, rows);
    double calls = 0, us = 0, step_us = unit_ms * 1e3;
    printf("       kernels over %d timed %s%s (share = kernel time / median %s; GB/s = declared bytes / kernel time):\n",
           kn->steps, strcmp(unit, "step") ? "prime" : "decode step", kn->steps == 1 ? "" : "s", unit);
    char c1[16], c2[16];
    snprintf(c1, sizeof c1, "calls/%s", unit);
    snprintf(c2, sizeof c2, "us/%s", unit);
    printf("       %-22s %11s %12s %8s %10s\n", "kernel", c1, c2, "share", "GB/s");
    for (int i = 0; i < n; i++) {
        printf("       %-22s %11.2f %12.3f %7.1f%% %10.2f\n", rows[i].name, rows[i].calls, rows[i].us,
               100.0 * rows[i].share, rows[i].gbs);
        calls += rows[i].calls;
        us += rows[i].us;
    }
    printf("       %-22s %11.2f %12.3f %7.1f%%   (median %s %.3f us; kernels of different stages may overlap)\n",
           "all kernels", calls, us, step_us > 0 ? 100.0 * us / step_us : 0.0, unit, step_us);
    printf("       embed, rope and attn declare the whole table or KV cache: their GB/s overstates the traffic\n");
}

/* The kernel account under a configuration's row. */
static void table_kernels(const bench_result *r) { table_account(&r->kern, r->median_ms, "step"); }

static void table_row(const ppn_model *m, const bench_args *a, const bench_result *r)
{
    printf("%6d %10.4f %10.4f %10.1f %11.4f %9.2f %11.4f %13.2f %13.2f %10llu\n", r->stages, r->median_ms, r->p99_ms,
           r->tok_s, r->prefill_ms, r->gbs, r->floor_ratio, (double)r->pool_peak / 1e6, (double)r->pool_reserved / 1e6,
           (unsigned long long)r->driver_allocs_timed);
    for (int j = 0; j < a->n_lens; j++) {
        printf("       prompt %d tokens (pp%d): %.3f ms = %.1f tok/s, time to first token %.3f ms%s\n", a->lens[j],
               a->lens[j], r->pp_ms[j], r->pp_tok_s[j], r->pp_ms[j], a->chunk ? "" : " (token by token: --chunk 0)");
        if (a->kprof) table_account(&r->pp_kern[j], r->pp_ms[j], "prompt");
    }
    fputs("       ", stdout);
    cli_print_stage_map(stdout, m);
    if (a->kprof) table_kernels(r);
    fflush(stdout);
}

/* The run ------------------------------------------------------------------------------------------------- */

static ppn_door door_for(const bench_args *a, int k)
{
    ppn_door d = a->door;
    if (a->sweep) {
        d.n_stages = a->sweep[k];
        d.n_cuts = 0;
    }
    return d;
}

static int load(ppn_rt *rt, const bench_args *a, ppn_model **m)
{
    ppn_door d = door_for(a, 0);
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = a->dtype;
    int longest = a->prompt;
    for (int k = 0; k < a->n_lens; k++) longest = a->lens[k] > longest ? a->lens[k] : longest;
    lo.ctx = a->ctx ? a->ctx : longest + a->n_new + (a->spec ? a->n_new * a->spec + 1 : 0); /* the KV the reps use */
    for (int k = 0; k < a->n_batch; k++) { /* every sequence of the largest batch at full length, in whole blocks */
        int per = (lo.ctx + PPN_KV_BLOCK_POSITIONS - 1) / PPN_KV_BLOCK_POSITIONS * PPN_KV_BLOCK_POSITIONS;
        long need = (long)(a->batch[k] + (a->mixed ? 1 : 0)) * per; /* --mixed: the prompt's sequence too */
        if (need > lo.kv_tokens) lo.kv_tokens = (int)need;
    }
    lo.door = &d;
    if (!a->json) lo.progress = cli_progress;
    ppn_status st = ppn_model_load(rt, a->model ? a->model : g_tmpdir, &lo, m);
    if (st != PPN_OK) return cli_fail_status(st, "bench: load");
    return 0;
}

/* Resolve every N of the sweep up front, so that an N the model cannot take fails before a long sweep runs. */
static int sweep_check(const ppn_rt *rt, const bench_args *a, const ppn_model_info *mi)
{
    int fence[PPN_MAX_STAGES + 1], dev[PPN_MAX_STAGES], n;
    for (int k = 1; a->sweep && k < a->n_sweep; k++) {
        ppn_door d = door_for(a, k);
        ppn_status st = ppn_door_resolve(&d, mi->n_layers, ppn_rt_device_count(rt), 0, fence, dev, &n);
        if (st != PPN_OK) {
            char what[64];
            snprintf(what, sizeof what, "bench: --stages-sweep N=%d", a->sweep[k]);
            return cli_fail_status(st, what);
        }
    }
    return 0;
}

/* Every configuration in turn; results into res (n_res of them filled). */
static int run_all(ppn_model *m, ppn_rt *rt, const bench_args *a, const ppn_model_info *mi, const char *backend,
                   bench_result *res, int *n_res)
{
    int n_cfg = a->sweep ? a->n_sweep : 1, rc = 0;
    float *logits = malloc(sizeof(float) * (size_t)mi->vocab);
    if (!logits) return cli_fail("bench: out of memory for %d logits", mi->vocab);
    if (!a->json) table_header(a, mi, backend);
    for (int k = 0; k < n_cfg && rc == 0; k++) {
        if (k > 0) {
            ppn_door d = door_for(a, k);
            ppn_status st = ppn_model_publish_door(m, &d);
            if (st != PPN_OK) {
                char what[64];
                snprintf(what, sizeof what, "bench: --stages-sweep N=%d", a->sweep[k]);
                rc = cli_fail_status(st, what);
                break;
            }
        }
        if ((rc = bench_config(m, rt, a, mi, logits, &res[k])) == 0) {
            ++*n_res;
            if (!a->json) table_row(m, a, &res[k]);
        }
    }
    free(logits);
    return rc;
}

int cmd_bench(int argc, char **argv)
{
    bench_args a;
    int rc = parse(argc, argv, &a), n_res = 0;
    ppn_rt *rt = NULL;
    ppn_model *m = NULL;
    bench_result *res = NULL;
    if (rc) goto out;
    /* first: a missing backend fails before gigabytes are written */
    if ((rc = cli_rt_create(a.backend, &rt)) != 0) goto out;
    ppn_status st;
    if ((st = ppn_env_flag("PPN_KPROF", &a.kprof)) != PPN_OK) { /* ppn_rt_create has refused a bad one */
        rc = cli_fail_status(st, "bench");
        goto out;
    }
    if (a.shape && (rc = tmp_checkpoint(&a))) goto out;
    if ((rc = load(rt, &a, &m))) goto out;
    tmp_remove(); /* the weights are on the device(s) now */
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    if (a.prompt + a.n_new > mi.ctx) {
        rc = cli_fail("bench: --prompt %d + -n %d steps exceed the context of %d positions (--ctx)", a.prompt,
                      a.n_new, mi.ctx);
        goto out;
    }
    if ((rc = sweep_check(rt, &a, &mi))) goto out;
    if (a.batch || a.spec) {
        bench_batch_opts bo = {.sizes = a.batch, .n_sizes = a.n_batch, .prompt = a.prompt, .n_new = a.n_new,
                               .reps = a.reps, .warmup = a.warmup, .chunk = a.chunk ? a.chunk : PPN_PREFILL_CHUNK,
                               .json = a.json, .bw_gbs = a.bw_gbs, .rt = rt, .kprof = a.kprof,
                               .device_greedy = a.device_greedy, .mixed = a.mixed};
        char name[600];
        if (a.json) {
            printf("{\"model\":");
            json_str(stdout, model_name(&a, name, sizeof name));
            printf(",\"backend\":\"%s\",\"dtype\":\"%s\",\"weight_bytes\":%zu,\"prompt\":%d,\"n\":%d,\"reps\":%d,"
                   "\"stage_map\":", ppn_rt_backend(rt), ppn_dtype_name(mi.dtype), mi.weight_bytes, a.prompt, a.n_new,
                   a.reps);
            cli_json_stage_map(stdout, m);
            printf(",\"batch\":");
        } else {
            printf("ppn bench: model %s (%s, %d layers), backend %s, dtype %s (KV cache %s), weights %.4f GB, ctx %d\n",
                   model_name(&a, name, sizeof name), mi.arch, mi.n_layers, ppn_rt_backend(rt), ppn_dtype_name(mi.dtype),
                   ppn_dtype_name(mi.kv_dtype), (double)mi.weight_bytes / 1e9, mi.ctx);
        }
        if (a.json && !a.batch) printf("null");
        if (a.batch) rc = bench_batch(m, &mi, &bo, stdout);
        if (a.json && a.spec) printf(",\"spec\":");
        if (rc == 0 && a.spec) rc = bench_spec(m, &mi, &bo, a.spec, stdout);
        if (a.json && rc == 0) printf("}\n");
        if (!a.json && rc == 0) fputs("       ", stdout), cli_print_stage_map(stdout, m);
        goto out;
    }
    if (!(res = calloc((size_t)(a.sweep ? a.n_sweep : 1), sizeof *res))) {
        rc = cli_fail("bench: out of memory");
        goto out;
    }
    if ((rc = run_all(m, rt, &a, &mi, ppn_rt_backend(rt), res, &n_res)) == 0 && a.json)
        report_json(&a, &mi, ppn_rt_backend(rt), res, n_res);
    for (int k = 0; k < n_res && rc == 0; k++)
        if (res[k].driver_allocs_timed)
            fprintf(stderr, "ppn: warning: %d stages: %llu driver allocations during the timed reps (the steady state "
                    "must allocate nothing)\n", res[k].stages, (unsigned long long)res[k].driver_allocs_timed);
out:
    for (int k = 0; k < n_res; k++) free(res[k].stage_map_json);
    free(res);
    rc = cli_model_free(m, rc);
    rc = cli_rt_destroy(rt, rc);
    tmp_remove();
    free(a.sweep);
    free(a.lens);
    free(a.batch);
    return rc;
}
