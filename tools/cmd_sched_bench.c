/* cmd_sched_bench.c - `ppn sched-bench`: decode steps per second, and where the host's time goes, under each way
 * the runtime can issue a step's stages. Everything runs through the public API (a door published with
 * ppn_model_publish_door or given to the load) plus PPN_PIN, the placement knob of core/stagemap.c.
 *
 * Configurations:
 *   one-thread   MEMRA_PP_STREAMS=0: the caller's thread issues every stage, on stage 0's stream. This seam keeps
 *                the N-stage cut and its boundary copies, so it is the honest "one host thread issues all
 *                stages" arm; it needs every stage on one device, so it runs on the first stage's device
 *   unsplit      the door shut (N = 1), same device: the reference without any boundary
 *   unpinned     PPN_PIN=none: one issue thread per stage, floating (pu -1)
 *   pinned-near  one issue thread per stage, pinned near its device (the default; PPN_PIN=near), futex wake
 *   pinned-far   PPN_PIN=far: pinned outside the device's cpuset (equal to near on a single-NUMA machine:
 *                the report says so)
 *   spin         pinned near, PPN_SPIN=1: the threads busy-poll instead of sleeping on a futex
 *   no-graphs    pinned near, PPN_GRAPHS=0: every kernel launched through the stream, not replayed from the
 *                stage's captured graph (every arm above replays graphs, the runtime's default)
 *   unsplit-no-graphs   the door shut, PPN_GRAPHS=0: the one-stage reference without graphs
 *   slot-producer / slot-interleave   pinned near, PPN_HOST_SLOT=producer|interleave: host-staged boundary
 *                slots on the producer's NUMA node, or interleaved over every node, instead of the consumer's (the
 *                rule, every other arm). They differ only where boundaries are host-staged (no peer access, e.g.
 *                PPN_SIM_PEER=none) on a machine of several nodes: the report says when they cannot differ
 * The threaded arms place stage s on device s % devices (or --devices); a configuration the runtime refuses is
 * reported as refused, with the runtime's reason.
 *
 * A step: ppn_decode_step_deferred (host issue time) then ppn_pending_wait with the logits (wait time), with
 * --inflight steps in flight (default 1: a decode step needs the previous step's token). wall = the whole loop
 * over the timed steps; other = wall - issue - wait (the loop itself).
 *
 * model (sim backend only): the latency model's launch time per timed step, from the sim's account of the kernels
 * accepted over the timed loop (ppn_sim_counts.launch_model_ns: 4 us per kernel launched through a stream, 1 us
 * per kernel replayed from a graph), with the kernels of each kind per step. Deterministic, so tests check the
 * graph arms' order on it, never on the wall times above; it is the model whether or not PPN_SIM_LATENCY applies
 * it to them.
 */
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "tools/cli.h"
#include "tools/plot_svg.h"
#include "core/rt.h"
#include "core/base/err.h"
#include "core/model/ckpt.h"

enum { G_ONE, G_SPREAD };

typedef struct sb_arm {
    const char *name, *what;
    int group;      /* G_ONE: every stage on one device; G_SPREAD: stage s on its own device */
    int streams, spin, shut, graphs;
    const char *pin;
    const char *host_slot; /* PPN_HOST_SLOT (NULL: consumer, the rule) */
} sb_arm;

static const sb_arm sb_arms[] = {
    {"one-thread", "MEMRA_PP_STREAMS=0: the caller's thread issues every stage on stage 0's stream", G_ONE, 0, 0, 0,
     1, "near", NULL},
    {"unsplit", "door shut (N=1): one stage, no boundary (reference)", G_ONE, 1, 0, 1, 1, "near", NULL},
    {"unsplit-no-graphs", "door shut (N=1), PPN_GRAPHS=0: every kernel launched through the stream", G_ONE, 1, 0, 1,
     0, "near", NULL},
    /* unpinned runs first in its group, while the threads are as the load started them (a later repin to -1
     * also unpins them: it binds to the whole machine). */
    {"unpinned", "one issue thread per stage, unpinned (PPN_PIN=none), futex wake", G_SPREAD, 1, 0, 0, 1, "none", NULL},
    {"pinned-near", "one issue thread per stage, pinned near its device (PPN_PIN=near), futex wake", G_SPREAD, 1, 0,
     0, 1, "near", NULL},
    {"pinned-far", "one issue thread per stage, pinned outside its device's cpuset (PPN_PIN=far), futex wake",
     G_SPREAD, 1, 0, 0, 1, "far", NULL},
    {"spin", "one issue thread per stage, pinned near, busy-poll wake (PPN_SPIN=1)", G_SPREAD, 1, 1, 0, 1, "near", NULL},
    {"no-graphs", "one issue thread per stage, pinned near, futex wake, PPN_GRAPHS=0: every kernel launched "
     "through the stream", G_SPREAD, 1, 0, 0, 0, "near", NULL},
    {"slot-producer", "pinned near, host-staged slots on the producer's NUMA node (PPN_HOST_SLOT=producer)",
     G_SPREAD, 1, 0, 0, 1, "near", "producer"},
    {"slot-interleave", "pinned near, host-staged slots interleaved over every node (PPN_HOST_SLOT=interleave)",
     G_SPREAD, 1, 0, 0, 1, "near", "interleave"},
};
#define SB_N_ARMS ((int)(sizeof sb_arms / sizeof sb_arms[0]))

typedef struct sb_args {
    const char *backend, *model, *shape, *plot;
    int json, steps, warmup, inflight, n_stages, dtype, ctx;
    int devs[PPN_MAX_STAGES], n_devs;
} sb_args;

typedef struct sb_stat {
    double mean, median, p99;
} sb_stat;

typedef struct sb_result {
    const char *status;  /* "ok", "refused" */
    char msg[512];       /* why refused */
    ppn_stage_info map;
    double wall_s, steps_per_s, wall_us, other_us;
    sb_stat issue, wait;
    double model_launch_us;   /* sim: the model's launch time per step (-1 elsewhere) ... */
    double launches, replayed; /* ... and the kernels per step launched through a stream / replayed from a graph */
} sb_result;

typedef struct sb_run {
    const sb_args *a;
    ppn_rt *rt;
    char model_path[512];
    char tmpdir[64];     /* "" unless --shape wrote a model */
    ppn_model_info mi;
    sb_result res[SB_N_ARMS];
    int far_equals_near, numa_nodes, cores;
    int sim; /* the sim backend: report its modelled launch time */
} sb_run;

/* Arguments ------------------------------------------------------------------------------------------------ */

static void sb_usage(FILE *f)
{
    fputs("usage: ppn sched-bench [--backend auto|sim|cuda] [--model PATH | --shape NAME] [--stages N]\n"
          "                       [--devices d0,..] [-n steps] [--warmup W] [--inflight K] [--dtype f32|bf16|f16]\n"
          "                       [--ctx C] [--json] [--plot FILE.svg]\n"
          "  --shape NAME   a random-weight model (ppn mkmodel shapes; default tiny) written to a temp dir\n"
          "  --stages N     pipeline stages (default 2); --devices: the threaded arms' stage devices\n"
          "  -n steps       timed decode steps per configuration (default 64), after --warmup W (default 4)\n"
          "  --inflight K   deferred steps in flight, 1..4 (default 1: each step waits for the previous one)\n"
          "Configurations: one-thread (MEMRA_PP_STREAMS=0), unsplit (N=1), unpinned, pinned-near, pinned-far\n"
          "(PPN_PIN=none|near|far), spin (PPN_SPIN=1), all replaying captured graphs; no-graphs and\n"
          "unsplit-no-graphs (PPN_GRAPHS=0). Per step: steps/s, wall,\n"
          "host issue time (in ppn_decode_step_deferred), wait time (in ppn_pending_wait); on the sim backend\n"
          "also the latency model's launch time (model_launch_us) and the kernels launched and replayed.\n",
          f);
}

static int sb_parse(int argc, char **argv, sb_args *a)
{
    *a = (sb_args){.steps = 64, .warmup = 4, .inflight = 1, .n_stages = 2, .dtype = PPN_DTYPE_DEFAULT};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        int rc = 0;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            sb_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--json")) a->json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(f, "--backend")) rc = cli_backend(f, v), a->backend = v;
        else if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--shape")) a->shape = v;
        else if (!strcmp(f, "--plot")) a->plot = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &a->dtype);
        else if (!strcmp(f, "--stages")) rc = cli_int(f, v, 2, PPN_MAX_STAGES, &x), a->n_stages = (int)x;
        else if (!strcmp(f, "-n")) rc = cli_int(f, v, 1, 1 << 24, &x), a->steps = (int)x;
        else if (!strcmp(f, "--warmup")) rc = cli_int(f, v, 0, 1 << 24, &x), a->warmup = (int)x;
        else if (!strcmp(f, "--inflight")) rc = cli_int(f, v, 1, PPN_MAX_INFLIGHT, &x), a->inflight = (int)x;
        else if (!strcmp(f, "--ctx")) rc = cli_int(f, v, 1, 1 << 30, &x), a->ctx = (int)x;
        else if (!strcmp(f, "--devices")) {
            ppn_door d = ppn_door_default(); /* the door's own parser: same syntax and messages */
            if (cli_door_set_flag(&d, "--devices", v) != PPN_OK) return cli_fail("%s", ppn_last_error()), 2;
            a->n_devs = d.n_devices;
            memcpy(a->devs, d.devices, sizeof a->devs);
        } else return cli_fail("sched-bench: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (a->model && a->shape) return cli_fail("sched-bench: give --model or --shape, not both"), 2;
    if (!a->model && !a->shape) a->shape = "tiny";
    if (a->n_devs && a->n_devs != a->n_stages)
        return cli_fail("sched-bench: --devices has %d entries for %d stages", a->n_devs, a->n_stages), 2;
    return 0;
}

/* Timing --------------------------------------------------------------------------------------------------- */

static double now_us(void) { return cli_now_us(); }

static sb_stat stat_of(double *v, int n)
{
    sb_stat s = {0};
    for (int i = 0; i < n; i++) s.mean += v[i] / n;
    cli_sort(v, n);
    s.median = cli_rank(v, n, 0.50);
    s.p99 = cli_rank(v, n, 0.99);
    return s;
}

/* The sim latency model's launch account so far (all zero on another backend). */
static struct ppn_sim_counts sim_counts(const sb_run *run)
{
    struct ppn_sim_counts k;
    ppn_gpu_sim_counts(run->rt->g, &k);
    return k;
}

/* r's model figures from the account before (k0) and after (k1) the timed loop of n steps: every launch between
 * them belongs to those steps, since each step is waited for before the loop ends and the warm-up before it
 * starts. */
static void model_of(const sb_run *run, const struct ppn_sim_counts *k0, const struct ppn_sim_counts *k1, int n,
                     sb_result *r)
{
    r->model_launch_us = -1;
    if (!run->sim) return;
    uint64_t ns = 0;
    for (int i = 0; i < PPN_SIM_LAUNCH_KINDS; i++) ns += k1->launch_model_ns[i] - k0->launch_model_ns[i];
    r->model_launch_us = (double)ns / 1e3 / n;
    r->launches = (double)(k1->launches[PPN_SIM_LAUNCH_STREAM] - k0->launches[PPN_SIM_LAUNCH_STREAM]) / n;
    r->replayed = (double)(k1->launches[PPN_SIM_LAUNCH_GRAPH] - k0->launches[PPN_SIM_LAUNCH_GRAPH]) / n;
}

/* Decode loop ---------------------------------------------------------------------------------------------- */

typedef struct sb_loop {
    double *issue, *wait;  /* per step (us), NULL: not recorded */
    float *logits;
} sb_loop;

/* n steps on q with up to k in flight; the sequence starts over when its context is full. Returns the first
 * failure, with its message, after draining what is in flight. */
static ppn_status decode_steps(ppn_seq *q, const ppn_model_info *mi, int n, int k, sb_loop *lp)
{
    ppn_step_id p[PPN_MAX_INFLIGHT];
    int issued = 0, waited = 0;
    ppn_status st = PPN_OK;
    while (waited < n && st == PPN_OK) {
        if (issued == waited && ppn_seq_pos(q) >= mi->ctx) st = ppn_seq_reset(q);
        if (st != PPN_OK) break;
        double t0 = now_us();
        if (issued < n && issued - waited < k && ppn_seq_pos(q) < mi->ctx) {
            ppn_step_id *pp = &p[issued % PPN_MAX_INFLIGHT];
            st = ppn_decode_step_deferred(q, (issued * 7 + 1) % mi->vocab, pp);
            if (lp->issue) lp->issue[issued] = now_us() - t0;
            issued += *pp != 0; /* a refused step was never issued */
        } else {
            st = ppn_pending_wait(q, p[waited % PPN_MAX_INFLIGHT], lp->logits);
            if (lp->wait) lp->wait[waited] = now_us() - t0;
            waited++;
        }
    }
    if (st == PPN_OK) return PPN_OK;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ppn_last_error());
    (void)ppn_seq_reset(q); /* drop what is still in flight */
    return ppn_err(st, "%s", msg);
}

/* One configuration on m (its door already published): warm-up, then the timed steps. */
static ppn_status measure(sb_run *run, ppn_model *m, sb_result *r)
{
    const sb_args *a = run->a;
    ppn_seq *q = NULL;
    sb_loop lp = {.issue = malloc(sizeof(double) * (size_t)a->steps), .wait = malloc(sizeof(double) * (size_t)a->steps),
                  .logits = malloc(sizeof(float) * (size_t)run->mi.vocab)};
    ppn_status st = PPN_OK;
    if (!lp.issue || !lp.wait || !lp.logits) st = ppn_err(PPN_ENOMEM, "sched-bench: host out of memory");
    if (st == PPN_OK) st = ppn_seq_create(m, &q);
    sb_loop warm = {.logits = lp.logits};
    if (st == PPN_OK && a->warmup) st = decode_steps(q, &run->mi, a->warmup, a->inflight, &warm);
    struct ppn_sim_counts k0 = sim_counts(run);
    double t0 = now_us();
    if (st == PPN_OK) st = decode_steps(q, &run->mi, a->steps, a->inflight, &lp);
    double wall = now_us() - t0;
    struct ppn_sim_counts k1 = sim_counts(run);
    if (st == PPN_OK) {
        model_of(run, &k0, &k1, a->steps, r);
        r->status = "ok";
        r->wall_s = wall * 1e-6;
        r->wall_us = wall / a->steps;
        r->steps_per_s = a->steps / r->wall_s;
        r->issue = stat_of(lp.issue, a->steps);
        r->wait = stat_of(lp.wait, a->steps);
        r->other_us = r->wall_us - r->issue.mean - r->wait.mean;
        ppn_model_get_stage_map(m, &r->map);
    }
    st = cli_seq_destroy_after(q, st);
    free(lp.issue);
    free(lp.wait);
    free(lp.logits);
    return st;
}

/* Configurations ------------------------------------------------------------------------------------------- */

static void door_of(const sb_run *run, const sb_arm *arm, ppn_door *d)
{
    const sb_args *a = run->a;
    int nd = ppn_rt_device_count(run->rt);
    *d = ppn_door_default();
    d->graphs = arm->graphs;
    if (arm->shut) return;
    d->n_stages = a->n_stages;
    d->streams = arm->streams;
    d->spin = arm->spin;
    if (arm->group != G_SPREAD) return; /* every stage on the primary (the first stage's device) */
    d->n_devices = a->n_stages;
    for (int s = 0; s < a->n_stages; s++) d->devices[s] = a->n_devs ? a->devs[s] : s % nd;
}

static ppn_status set_pin(const char *pin)
{
    if (setenv("PPN_PIN", pin, 1) != 0) return ppn_err(PPN_ENOMEM, "sched-bench: setenv PPN_PIN failed");
    return PPN_OK;
}

/* Run arm i on m (publishing its door first); a refusal is a result, not a failure. */
static ppn_status run_arm(sb_run *run, ppn_model *m, int i)
{
    const sb_arm *arm = &sb_arms[i];
    sb_result *r = &run->res[i];
    ppn_door d;
    door_of(run, arm, &d);
    PPN_CHECK(set_pin(arm->pin));
    if (setenv("PPN_HOST_SLOT", arm->host_slot ? arm->host_slot : "consumer", 1) != 0)
        return ppn_err(PPN_ENOMEM, "sched-bench: setenv PPN_HOST_SLOT failed");
    ppn_status st = ppn_model_publish_door(m, &d);
    if (st == PPN_OK) st = measure(run, m, r);
    if (st == PPN_EREFUSED) {
        r->status = "refused";
        snprintf(r->msg, sizeof r->msg, "refused: %s", ppn_last_error());
        ppn_model_get_stage_map(m, &r->map);
        return PPN_OK;
    }
    if (!run->a->json && isatty(STDERR_FILENO)) fprintf(stderr, "sched-bench: %s done\n", arm->name);
    return st == PPN_OK ? PPN_OK : ppn_err_ctx(st, "sched-bench %s", arm->name);
}

/* Load the model with the group's first door (so the weights sit where every arm of the group wants them),
 * run the group's arms, free it. */
static ppn_status run_group(sb_run *run, int group)
{
    int first = -1;
    for (int i = 0; i < SB_N_ARMS && first < 0; i++)
        if (sb_arms[i].group == group && !sb_arms[i].shut) first = i;
    ppn_door d;
    door_of(run, &sb_arms[first], &d);
    PPN_CHECK(set_pin(sb_arms[first].pin));
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = run->a->dtype;
    lo.ctx = run->a->ctx;
    lo.door = &d;
    if (group == G_ONE && run->a->n_devs) lo.device = run->a->devs[0];
    ppn_model *m = NULL;
    PPN_CHECK(ppn_model_load(run->rt, run->model_path, &lo, &m));
    ppn_model_get_info(m, &run->mi);
    ppn_status st = PPN_OK;
    for (int i = 0; i < SB_N_ARMS && st == PPN_OK; i++)
        if (sb_arms[i].group == group) st = run_arm(run, m, i);
    ppn_err_first fe = {0};
    ppn_err_first_add(&fe, st); /* keeps st's message: the free may set its own */
    ppn_status fs = ppn_model_free(m);
    ppn_err_first_add(&fe, fs == PPN_OK ? fs : ppn_err_ctx(fs, "model teardown"));
    return ppn_err_first_done(&fe);
}

static int same_cores(const ppn_stage_info *a, const ppn_stage_info *b)
{
    if (a->n_stages != b->n_stages) return 0;
    for (int s = 0; s < a->n_stages; s++)
        if (a->pu[s] != b->pu[s]) return 0;
    return 1;
}

static ppn_status run_all(sb_run *run)
{
    ppn_topo *t;
    PPN_CHECK(ppn_rt_topo(run->rt, &t));
    run->numa_nodes = ppn_topo_n_numa(t);
    run->cores = ppn_topo_n_cores(t);
    for (int i = 0; i < SB_N_ARMS; i++) run->res[i].status = "not run";
    PPN_CHECK(run_group(run, G_ONE));
    PPN_CHECK(run_group(run, G_SPREAD));
    const sb_result *near = NULL, *far = NULL;
    for (int i = 0; i < SB_N_ARMS; i++) {
        if (!strcmp(sb_arms[i].name, "pinned-near")) near = &run->res[i];
        if (!strcmp(sb_arms[i].name, "pinned-far")) far = &run->res[i];
    }
    run->far_equals_near = near && far && same_cores(&near->map, &far->map);
    return PPN_OK;
}

/* Model source --------------------------------------------------------------------------------------------- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static ppn_status model_source(sb_run *run)
{
    if (run->a->model) {
        snprintf(run->model_path, sizeof run->model_path, "%s", run->a->model);
        return PPN_OK;
    }
    snprintf(run->tmpdir, sizeof run->tmpdir, "/tmp/ppn-sched-bench-XXXXXX");
    if (!mkdtemp(run->tmpdir)) {
        run->tmpdir[0] = 0;
        return ppn_err(PPN_EIO, "sched-bench: cannot create a temporary directory under /tmp");
    }
    snprintf(run->model_path, sizeof run->model_path, "%s", run->tmpdir);
    return ppn_mkmodel(run->a->shape, PPN_DTYPE_BF16, run->tmpdir, 1);
}

/* Reports -------------------------------------------------------------------------------------------------- */

static void cores_str(const ppn_stage_info *m, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    if (!m->threads) {
        snprintf(buf, cap, "caller");
        return;
    }
    for (int s = 0; s < m->n_stages && n < cap; s++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", s ? "," : "", m->pu[s]);
}

static const char *far_note(const sb_run *run)
{
    static char note[256];
    if (run->far_equals_near)
        snprintf(note, sizeof note, "pinned-far picked the same cores as pinned-near: no CPU of this process lies "
                 "outside the devices' cpusets (%d NUMA node%s), so far equals near here", run->numa_nodes,
                 run->numa_nodes == 1 ? "" : "s");
    else snprintf(note, sizeof note, "pinned-far runs on cores outside the devices' cpusets");
    return note;
}

static int host_staged(const ppn_stage_info *m)
{
    for (int b = 0; b + 1 < m->n_stages; b++)
        if (!strcmp(ppn_transport_name(m->xport[b]), "host")) return 1;
    return 0;
}

static const char *slot_note(const sb_run *run)
{
    static char note[256];
    const ppn_stage_info *m = NULL;
    for (int i = 0; i < SB_N_ARMS; i++)
        if (!strcmp(sb_arms[i].name, "pinned-near")) m = &run->res[i].map;
    if (run->numa_nodes == 1)
        snprintf(note, sizeof note, "one NUMA node here: slot-producer and slot-interleave place the same memory as "
                 "pinned-near");
    else if (m && !host_staged(m))
        snprintf(note, sizeof note, "no boundary is host-staged (peer access): slot-producer and slot-interleave "
                 "run as pinned-near");
    else snprintf(note, sizeof note, "slot-*: host-staged slots on the producer's node / interleaved; the other "
                  "arms put them on the consumer's");
    return note;
}

static void print_table(const sb_run *run)
{
    const sb_args *a = run->a;
    printf("sched-bench: backend %s, %s (%d layers), %d stages, %d timed steps (+%d warm-up), %d in flight; "
           "machine %d cores, %d NUMA node(s)\n",
           ppn_rt_backend(run->rt), a->model ? a->model : a->shape, run->mi.n_layers, a->n_stages, a->steps,
           a->warmup, a->inflight, run->cores, run->numa_nodes);
    if (run->sim)
        printf("model: the sim latency model's launch time per step (us: 4 per kernel launched, 1 per kernel "
               "replayed from a graph), whether or not PPN_SIM_LATENCY applies it\n");
    printf("%-17s %-8s %10s %11s %19s %19s %9s %s %s\n", "config", "status", "steps/s", "wall us/st",
           "issue us mean/p99", "wait us mean/p99", "other us", run->sim ? "   model" : "", "cores");
    for (int i = 0; i < SB_N_ARMS; i++) {
        const sb_result *r = &run->res[i];
        char c[128];
        if (strcmp(r->status, "ok")) {
            printf("%-17s %s\n", sb_arms[i].name, r->msg[0] ? r->msg : sb_arms[i].what);
            continue;
        }
        cores_str(&r->map, c, sizeof c);
        char model[16] = "";
        if (r->model_launch_us >= 0) snprintf(model, sizeof model, "%8.1f", r->model_launch_us);
        printf("%-17s %-8s %10.1f %11.1f %9.1f/%9.1f %9.1f/%9.1f %9.1f %s %s\n", sb_arms[i].name, r->status,
               r->steps_per_s, r->wall_us, r->issue.mean, r->issue.p99, r->wait.mean, r->wait.p99, r->other_us, model,
               c);
    }
    printf("notes: one-thread = %s; it keeps the %d-stage cut and its boundary copies but runs on one device.\n"
           "       %s.\n       %s.\n",
           sb_arms[0].what, a->n_stages, far_note(run), slot_note(run));
}

static json_t *stat_json(const sb_stat *s)
{
    json_t *o = json_object();
    json_object_set_new(o, "mean", json_real(s->mean));
    json_object_set_new(o, "median", json_real(s->median));
    json_object_set_new(o, "p99", json_real(s->p99));
    return o;
}

static json_t *ints_json(const int *v, int n)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(arr, json_integer(v[i]));
    return arr;
}

static json_t *result_json(int i, const sb_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(sb_arms[i].name));
    json_object_set_new(o, "status", json_string(r->status));
    json_object_set_new(o, "what", json_string(sb_arms[i].what));
    if (r->msg[0]) json_object_set_new(o, "message", json_string(r->msg));
    if (strcmp(r->status, "ok")) return o;
    json_object_set_new(o, "n_stages", json_integer(r->map.n_stages));
    json_object_set_new(o, "devices", ints_json(r->map.dev, r->map.n_stages));
    json_object_set_new(o, "cores", ints_json(r->map.pu, r->map.n_stages));
    json_object_set_new(o, "threads", json_boolean(r->map.threads));
    json_object_set_new(o, "spin", json_integer(r->map.door.spin));
    json_object_set_new(o, "streams", json_integer(r->map.door.streams));
    json_object_set_new(o, "graphs", json_integer(r->map.door.graphs));
    json_object_set_new(o, "steps_per_s", json_real(r->steps_per_s));
    json_object_set_new(o, "wall_us_per_step", json_real(r->wall_us));
    json_object_set_new(o, "issue_us", stat_json(&r->issue));
    json_object_set_new(o, "wait_us", stat_json(&r->wait));
    json_object_set_new(o, "other_us_per_step", json_real(r->other_us));
    if (r->model_launch_us < 0) return o;
    json_object_set_new(o, "model_launch_us", json_real(r->model_launch_us));
    json_object_set_new(o, "model_launches_per_step", json_real(r->launches));
    json_object_set_new(o, "model_replayed_per_step", json_real(r->replayed));
    return o;
}

static int print_json(const sb_run *run)
{
    const sb_args *a = run->a;
    json_t *root = json_object(), *cfgs = json_array();
    json_object_set_new(root, "tool", json_string("sched-bench"));
    json_object_set_new(root, "backend", json_string(ppn_rt_backend(run->rt)));
    json_object_set_new(root, "model", json_string(a->model ? a->model : a->shape));
    json_object_set_new(root, "n_layers", json_integer(run->mi.n_layers));
    json_object_set_new(root, "stages", json_integer(a->n_stages));
    json_object_set_new(root, "steps", json_integer(a->steps));
    json_object_set_new(root, "warmup", json_integer(a->warmup));
    json_object_set_new(root, "inflight", json_integer(a->inflight));
    json_object_set_new(root, "machine_cores", json_integer(run->cores));
    json_object_set_new(root, "numa_nodes", json_integer(run->numa_nodes));
    json_object_set_new(root, "far_equals_near", json_boolean(run->far_equals_near));
    json_object_set_new(root, "far_note", json_string(far_note(run)));
    json_object_set_new(root, "slot_note", json_string(slot_note(run)));
    for (int i = 0; i < SB_N_ARMS; i++) json_array_append_new(cfgs, result_json(i, &run->res[i]));
    json_object_set_new(root, "configs", cfgs);
    int rc = json_dumpf(root, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(root);
    putchar('\n');
    return rc == 0 ? 0 : cli_fail("sched-bench: writing the JSON failed");
}

static int write_plot(const sb_run *run)
{
    const char *labels[SB_N_ARMS];
    double v[SB_N_ARMS];
    for (int i = 0; i < SB_N_ARMS; i++) {
        labels[i] = sb_arms[i].name;
        v[i] = strcmp(run->res[i].status, "ok") ? NAN : run->res[i].steps_per_s;
    }
    char title[160];
    snprintf(title, sizeof title, "ppn sched-bench (%s, %d stages): decode steps/s", ppn_rt_backend(run->rt),
             run->a->n_stages);
    ppn_status st = plot_svg_bars(run->a->plot, title, "decode steps / s", labels, v, SB_N_ARMS);
    return st == PPN_OK ? 0 : cli_fail_status(st, "--plot");
}

/* Entry --------------------------------------------------------------------------------------------------- */

int cmd_sched_bench(int argc, char **argv)
{
    sb_args a;
    int rc = sb_parse(argc, argv, &a);
    if (rc) return rc;
    sb_run *run = calloc(1, sizeof *run);
    if (!run) return cli_fail("out of memory");
    run->a = &a;
    ppn_status st = PPN_OK;
    rc = cli_rt_create(a.backend, &run->rt);
    run->sim = rc == 0 && !strcmp(ppn_rt_backend(run->rt), "sim");
    if (rc == 0 && (st = model_source(run)) != PPN_OK) rc = cli_fail_status(st, "sched-bench model");
    if (rc == 0 && (st = run_all(run)) != PPN_OK) rc = cli_fail_status(st, "sched-bench");
    if (rc == 0) rc = a.json ? print_json(run) : (print_table(run), 0);
    if (rc == 0 && a.plot) rc = write_plot(run);
    if (run->tmpdir[0]) nftw(run->tmpdir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    rc = cli_rt_destroy(run->rt, rc);
    free(run);
    return rc;
}
