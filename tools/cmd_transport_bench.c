/* cmd_transport_bench.c - `ppn transport-bench`: the cost of one stage hand-off through the runtime's own
 * boundary code (transport/boundary.c: ppn_boundary_init / send / recv / release with its ev_tx / ev_rx chain),
 * per transport and slot size.
 *
 * Transports measured, per device pair:
 *   inplace    same device: the consumer uses the slot itself; the hand-off is the producer's copy into the slot
 *              plus the event chain (nothing is enqueued on the consumer but its waits and the release)
 *   dtod       same device: the consumer copies the slot out (the PPN_XPORT_SAME=dtod rollback)
 *   kernel_add same device: ppn has no copy kernel, so the consumer runs ppn_op_add(dst, slot, zeros) on the
 *              in-place chain: an element-wise kernel over the slot that reads two buffers and writes one
 *              (1.5x the traffic of a copy). It is a bandwidth stand-in, not a transport the runtime uses.
 *   peer/host  different devices: peer when both devices can access each other (peer_can_access, exactly as
 *              the stage map decides), and always host-staged, the runtime's fallback without a peer grant
 *              (PPN_SIM_PEER=none leaves only it on sim)
 * Host-staged slots, the node dimension (--host-slot): the slot's pinned memory on the consumer's NUMA node (the
 * runtime's rule), the producer's, or interleaved over every node. On a machine of one node the three are the
 * same memory: only the rule's is measured, and the output says so in one line.
 * Driving: one host thread plays both sides alternately (send, then recv, then release), so the host-side
 * generation waits never block: what is measured is the device-side chain and the copies, without the
 * cross-thread wake-up of a real pipeline (ppn sched-bench measures that).
 *   latency     host wall clock of one hand-off + a sync of the consumer stream, over --iters, after warm-up
 *   throughput  --batch hand-offs queued back to back (slots alternating, as MEMRA_PP_OVERLAP=1), one sync,
 *               divided by the batch; the median over the batches
 *   bandwidth   slot bytes (256 B header + the size) / the throughput time per hand-off
 *   model       sim backend only: the latency model's time for the copies of one hand-off of the latency loop
 *               (ppn_sim_counts.copy_model_ns over the loop / --iters: the copies run one after another through
 *               the event chain). Deterministic, so tests check the model's order on it, never on the wall
 *               times above; it is the model whether or not PPN_SIM_LATENCY applies it to them.
 */
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
#include "kernels/ops.h"

#define TB_MAX_SIZES 64
#define TB_MAX_SIZE ((size_t)1 << 30)

enum { TB_INPLACE, TB_DTOD, TB_KERNEL, TB_PEER, TB_HOST, TB_KINDS };
static const char *const tb_names[TB_KINDS] = {"inplace", "dtod", "kernel_add", "peer", "host"};
static const int tb_xport[TB_KINDS] = {PPN_XPORT_INPLACE, PPN_XPORT_DTOD, PPN_XPORT_INPLACE, PPN_XPORT_PEER,
                                       PPN_XPORT_HOST};

/* The defaults on a GPU, and the small ones the sim backend takes (its copies run on the host's cores: the GPU
 * defaults took over five minutes there, silently). */
#define TB_SIZES "4K..64M"
#define TB_ITERS 200
#define TB_WARMUP 10
#define TB_BATCH 32
#define TB_SIM_SIZES "4K..1M"
#define TB_SIM_ITERS 50
#define TB_SIM_WARMUP 2
#define TB_SIM_BATCH 8
#define TB_STR_(x) #x
#define TB_STR(x) TB_STR_(x)

enum { SLOT_CONSUMER, SLOT_PRODUCER, SLOT_INTERLEAVE, SLOT_KINDS };
static const char *const slot_names[SLOT_KINDS] = {"consumer", "producer", "interleave"};

typedef struct tb_args {
    const char *backend, *plot;
    int slots;                                       /* bit k: measure host-staging with slot placement k */
    int set_slots, one_node;                         /* --host-slot given; the machine has one NUMA node */
    int json, iters, warmup, batch;
    size_t sizes[TB_MAX_SIZES];
    int n_sizes;
    int devs[2], have_devs;
    int set_sizes, set_iters, set_warmup, set_batch; /* given on the command line */
    int sim_defaults;                                /* the sim backend's small defaults took over */
    int sim;                                         /* the sim backend: report its modelled copy time */
} tb_args;

typedef struct tb_result {
    int kind, from, to;
    int slot;                                   /* SLOT_* for host-staging, -1 otherwise */
    int slot_node;                              /* where the slot's pages are, read back (-1 none, -2 several) */
    size_t size, bytes;
    double lat_min, lat_med, lat_p99, lat_mean; /* us */
    double tput_us;                             /* us per hand-off, back to back */
    double model_copy_us;                       /* sim: the model's copy time per hand-off (-1 elsewhere) */
} tb_result;

typedef struct tb_run {
    const tb_args *a;
    ppn_rt *rt;
    tb_result *res;
    int n_res, cap_res;
    int n_cases; /* started, for the progress line */
} tb_run;

/* Arguments ------------------------------------------------------------------------------------------------ */

static void tb_usage(FILE *f)
{
    fputs("usage: ppn transport-bench [--backend auto|sim|cuda] [--devices a,b] [--sizes 4K..64M]\n"
          "                           [--iters N] [--warmup W] [--batch K] [--json] [--plot FILE.svg]\n"
          "  --devices a,b  one pair (a == b: the same-device transports on a); default: the same-device\n"
          "                 transports on device 0 and every pair a < b of distinct devices\n"
          "  --sizes        payload bytes: a list (4K,1M) or a range lo..hi stepping by 4x; suffix K, M, G\n"
          "                 (binary); each a multiple of 4. Default 4K..64M (sim backend: 4K..1M)\n"
          "  --iters N      latency samples per case (default 200, sim 50); --warmup W hand-offs first\n"
          "                 (default 10, sim 2)\n"
          "  --batch K      hand-offs queued per throughput sample (default 32, sim 8)\n"
          "  --host-slot W  where a host-staged slot lives: consumer (the runtime's rule), producer, interleave,\n"
          "                 or all (default: all on a machine of several NUMA nodes; consumer on one node)\n"
          "One host thread drives producer and consumer alternately through the real boundary code\n"
          "(ppn_boundary_send/recv/release with the ev_tx/ev_rx chain): latency = one hand-off + a consumer\n"
          "stream sync; throughput = K queued hand-offs then one sync; bandwidth = slot bytes / that time.\n",
          f);
}

/* One size: digits with an optional K/M/G suffix (binary). Returns 0 or -1. */
static int parse_size(const char *s, const char *end, size_t *out)
{
    char buf[32];
    size_t n = (size_t)(end - s);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *e;
    if (buf[0] < '0' || buf[0] > '9') return -1;   /* digits first: strtoull would take " 4K" and "+4K" */
    unsigned long long v = strtoull(buf, &e, 10);
    size_t mul = 1;
    if (*e == 'K' || *e == 'k') mul = 1 << 10, e++;
    else if (*e == 'M' || *e == 'm') mul = 1 << 20, e++;
    else if (*e == 'G' || *e == 'g') mul = 1 << 30, e++;
    if (*e || v == 0 || v > TB_MAX_SIZE / mul || (v * mul) % 4) return -1;
    *out = (size_t)v * mul;
    return 0;
}

static int add_size(tb_args *a, size_t v, const char *spec)
{
    if (a->n_sizes == TB_MAX_SIZES) return cli_fail("--sizes '%s': more than %d sizes", spec, TB_MAX_SIZES), 2;
    a->sizes[a->n_sizes++] = v;
    return 0;
}

static int parse_sizes(tb_args *a, const char *spec)
{
    a->n_sizes = 0;
    for (const char *p = spec; *p;) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p), *dots = strstr(p, "..");
        size_t lo, hi;
        if (dots && dots < end) {
            if (parse_size(p, dots, &lo) || parse_size(dots + 2, end, &hi) || lo > hi) goto bad;
            for (size_t v = lo; v <= hi; v *= 4)
                if (add_size(a, v, spec)) return 2;
        } else {
            if (parse_size(p, end, &lo)) goto bad;
            if (add_size(a, lo, spec)) return 2;
        }
        p = comma ? comma + 1 : end;
        if (comma && !*p) goto bad;
    }
    if (a->n_sizes) return 0;
bad:
    return cli_fail("--sizes '%s': want sizes like 4K,1M or a range 4K..64M (each a multiple of 4 bytes, "
                    "at most 1G, a range's low end not above its high end)", spec), 2;
}

/* A device id: digits only, below PPN_MAX_DEVICES, ending at stop; *end after it. Returns 0 or -1. */
static int parse_dev(const char *p, char stop, const char **end, int *out)
{
    int x = 0;
    const char *q = p;
    for (; *q >= '0' && *q <= '9'; q++)
        if ((x = x * 10 + (*q - '0')) >= PPN_MAX_DEVICES) return -1;
    if (q == p || *q != stop) return -1;
    *end = q;
    *out = x;
    return 0;
}

static int parse_devs(tb_args *a, const char *v)
{
    const char *e;
    if (parse_dev(v, ',', &e, &a->devs[0]) || parse_dev(e + 1, '\0', &e, &a->devs[1]))
        return cli_fail("--devices '%s': want two device ids a,b (digits, each below %d)", v, PPN_MAX_DEVICES), 2;
    a->have_devs = 1;
    return 0;
}

static int parse_slots(tb_args *a, const char *v)
{
    a->set_slots = 1;
    a->slots = 0;
    if (!strcmp(v, "all")) a->slots = (1 << SLOT_KINDS) - 1;
    for (int k = 0; k < SLOT_KINDS; k++)
        if (!strcmp(v, slot_names[k])) a->slots = 1 << k;
    if (a->slots) return 0;
    return cli_fail("--host-slot '%s': want consumer, producer, interleave or all", v), 2;
}

/* The node dimension: every placement where there are nodes to choose from, the rule's alone on one node. */
static ppn_status slot_defaults(tb_args *a, ppn_rt *rt)
{
    ppn_topo *t;
    PPN_CHECK(ppn_rt_topo(rt, &t));
    a->one_node = ppn_topo_n_numa(t) == 1;
    if (!a->set_slots) a->slots = a->one_node ? 1 << SLOT_CONSUMER : (1 << SLOT_KINDS) - 1;
    return PPN_OK;
}

static const char *one_node_note(void)
{
    return "one NUMA node here: a host-staged slot on the producer's node, the consumer's or interleaved is the "
           "same memory (measured once, as the runtime places it: the consumer's node)";
}

static int tb_parse(int argc, char **argv, tb_args *a)
{
    *a = (tb_args){.iters = TB_ITERS, .warmup = TB_WARMUP, .batch = TB_BATCH};
    if (parse_sizes(a, TB_SIZES)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        int rc = 0;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            tb_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--json")) a->json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(f, "--backend")) rc = cli_backend(f, v), a->backend = v;
        else if (!strcmp(f, "--plot")) a->plot = v;
        else if (!strcmp(f, "--devices")) rc = parse_devs(a, v);
        else if (!strcmp(f, "--sizes")) rc = parse_sizes(a, v), a->set_sizes = 1;
        else if (!strcmp(f, "--iters")) rc = cli_int(f, v, 1, 1 << 24, &x), a->iters = (int)x, a->set_iters = 1;
        else if (!strcmp(f, "--warmup")) rc = cli_int(f, v, 0, 1 << 24, &x), a->warmup = (int)x, a->set_warmup = 1;
        else if (!strcmp(f, "--batch")) rc = cli_int(f, v, 1, 1 << 16, &x), a->batch = (int)x, a->set_batch = 1;
        else if (!strcmp(f, "--host-slot")) rc = parse_slots(a, v);
        else return cli_fail("transport-bench: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    return 0;
}

/* On the sim backend, the defaults not given on the command line become the small ones (said in the output). */
static void sim_defaults(tb_args *a, const ppn_rt *rt)
{
    a->sim = strcmp(ppn_rt_backend(rt), "sim") == 0;
    if (!a->sim || (a->set_sizes && a->set_iters && a->set_warmup && a->set_batch)) return;
    a->sim_defaults = 1;
    if (!a->set_sizes) parse_sizes(a, TB_SIM_SIZES);
    if (!a->set_iters) a->iters = TB_SIM_ITERS;
    if (!a->set_warmup) a->warmup = TB_SIM_WARMUP;
    if (!a->set_batch) a->batch = TB_SIM_BATCH;
}

/* What the sim defaults changed, for the table and the JSON. */
static const char *sim_note(void)
{
    return "sim backend: small defaults for what the command line left out (sizes " TB_SIM_SIZES ", iters "
           TB_STR(TB_SIM_ITERS) ", warmup " TB_STR(TB_SIM_WARMUP) ", batch " TB_STR(TB_SIM_BATCH) "); give --sizes, "
           "--iters, --warmup, --batch to choose";
}

/* Measurement ---------------------------------------------------------------------------------------------- */

static double now_us(void) { return cli_now_us(); }

static double pct(const double *v, int n, double p) { return cli_rank(v, n, p / 100.0); }

/* The sim latency model's account of every copy accepted so far (ns; 0 on another backend). */
static uint64_t model_copy_ns(ppn_gpu *g)
{
    struct ppn_sim_counts k;
    uint64_t sum = 0;
    ppn_gpu_sim_counts(g, &k);
    for (int i = 0; i < PPN_SIM_COPY_KINDS; i++) sum += k.copy_model_ns[i];
    return sum;
}

/* One case's device state: the boundary under test and its producer / consumer buffers. */
typedef struct tb_case {
    ppn_gpu *g;
    int kind;
    ppn_gstream *prod, *cons;
    ppn_pool *pfrom, *pto;
    ppn_boundary b;
    int b_init;
    ppn_dptr io, local, zeros; /* io on from (the producer's [hdr][x]); local, zeros on to */
    uint32_t step;
} tb_case;

/* One hand-off of step c->step on slot k, issued from this thread on both sides. */
static ppn_status handoff(tb_case *c, int k)
{
    ppn_gpu *g = c->g;
    uint32_t step = c->step++;
    ppn_dptr got;
    PPN_CHECK(ppn_boundary_send(&c->b, g, c->prod, k, step, c->io, 1, 0));
    PPN_CHECK(ppn_boundary_recv(&c->b, g, c->cons, k, step, c->local, &got, 1, 0));
    if (!ppn_boundary_in_place(&c->b)) return PPN_OK; /* the copy transports released inside recv */
    if (c->kind == TB_KERNEL) PPN_CHECK(ppn_op_add(g, c->cons, c->local, got, c->zeros, (int)(c->b.bytes / 4)));
    return ppn_boundary_release(&c->b, g, c->cons, k, step);
}

/* The arena of a host-staged slot placed as slot says (the unbound one for the device transports). */
static ppn_status slot_arena(tb_case *c, ppn_rt *rt, int slot, ppn_pinned_arena **out)
{
    *out = rt->pinned;
    if (c->kind != TB_HOST) return PPN_OK;
    if (slot == SLOT_INTERLEAVE) return ppn_rt_pinned_on(rt, PPN_PINNED_INTERLEAVE, out);
    return ppn_rt_pinned_for(rt, ppn_pool_device(slot == SLOT_PRODUCER ? c->pfrom : c->pto), out);
}

static ppn_status case_setup(tb_case *c, ppn_rt *rt, size_t size, int slot)
{
    ppn_gpu *g = c->g;
    ppn_pinned_arena *host;
    PPN_CHECK(slot_arena(c, rt, slot, &host));
    PPN_CHECK(ppn_boundary_init(&c->b, g, c->pfrom, c->prod, ppn_pool_device(c->pto), tb_xport[c->kind],
                                (int)(size / 4), 1, host));
    c->b_init = 1;
    size_t n = c->b.bytes;
    PPN_CHECK(ppn_pool_alloc(c->pfrom, n, c->prod, "transport-bench io", &c->io));
    PPN_CHECK(g->ops->memset_d8(g, c->prod, c->io, 0x3c, n));
    PPN_CHECK(ppn_pool_alloc(c->pto, n, c->cons, "transport-bench local", &c->local));
    if (c->kind == TB_KERNEL) {
        PPN_CHECK(ppn_pool_alloc(c->pto, n, c->cons, "transport-bench zeros", &c->zeros));
        PPN_CHECK(g->ops->memset_d8(g, c->cons, c->zeros, 0, n));
    }
    PPN_CHECK(g->ops->stream_sync(g, c->prod));
    return g->ops->stream_sync(g, c->cons);
}

/* Drain both streams, then free what the case allocated (stream-ordered frees behind the host syncs). */
static ppn_status case_teardown(tb_case *c)
{
    ppn_gpu *g = c->g;
    ppn_status st = g->ops->stream_sync(g, c->prod), s2 = g->ops->stream_sync(g, c->cons);
    if (st == PPN_OK) st = s2;
    if (c->b_init && (s2 = ppn_boundary_fini(&c->b, g)) != PPN_OK && st == PPN_OK) st = s2;
    if (c->io && (s2 = ppn_pool_free(c->pfrom, c->io, c->prod)) != PPN_OK && st == PPN_OK) st = s2;
    if (c->local && (s2 = ppn_pool_free(c->pto, c->local, c->cons)) != PPN_OK && st == PPN_OK) st = s2;
    if (c->zeros && (s2 = ppn_pool_free(c->pto, c->zeros, c->cons)) != PPN_OK && st == PPN_OK) st = s2;
    if ((s2 = g->ops->stream_sync(g, c->prod)) != PPN_OK && st == PPN_OK) st = s2;
    if ((s2 = g->ops->stream_sync(g, c->cons)) != PPN_OK && st == PPN_OK) st = s2;
    c->b_init = 0;
    c->io = c->local = c->zeros = 0;
    return st;
}

static ppn_status measure(tb_case *c, const tb_args *a, tb_result *r)
{
    ppn_gpu *g = c->g;
    int nb = (a->iters + a->batch - 1) / a->batch;
    double *lat = malloc(sizeof *lat * (size_t)a->iters), *tput = malloc(sizeof *tput * (size_t)nb);
    ppn_status st = PPN_OK;
    if (!lat || !tput) {
        st = ppn_err(PPN_ENOMEM, "transport-bench: host out of memory");
        goto out;
    }
    for (int i = 0; i < a->warmup && st == PPN_OK; i++) st = handoff(c, i & 1);
    if (st == PPN_OK) st = g->ops->stream_sync(g, c->cons);
    double sum = 0;
    uint64_t model0 = model_copy_ns(g); /* only this thread issues: the loop's copies are the difference */
    for (int i = 0; i < a->iters && st == PPN_OK; i++) {
        double t0 = now_us();
        st = handoff(c, 0);
        if (st == PPN_OK) st = g->ops->stream_sync(g, c->cons);
        lat[i] = now_us() - t0;
        sum += lat[i];
    }
    r->model_copy_us = a->sim ? (double)(model_copy_ns(g) - model0) / 1e3 / a->iters : -1;
    for (int i = 0; i < nb && st == PPN_OK; i++) {
        double t0 = now_us();
        for (int k = 0; k < a->batch && st == PPN_OK; k++) st = handoff(c, k & 1);
        if (st == PPN_OK) st = g->ops->stream_sync(g, c->cons);
        tput[i] = (now_us() - t0) / a->batch;
    }
    if (st != PPN_OK) goto out;
    cli_sort(lat, a->iters);
    cli_sort(tput, nb);
    r->lat_min = lat[0];
    r->lat_med = pct(lat, a->iters, 50);
    r->lat_p99 = pct(lat, a->iters, 99);
    r->lat_mean = sum / a->iters;
    r->tput_us = pct(tput, nb, 50);
out:
    free(lat);
    free(tput);
    return st;
}

static ppn_status push_result(tb_run *run, const tb_result *r)
{
    if (run->n_res == run->cap_res) {
        int cap = run->cap_res ? run->cap_res * 2 : 64;
        tb_result *n = realloc(run->res, sizeof *n * (size_t)cap);
        if (!n) return ppn_err(PPN_ENOMEM, "transport-bench: host out of memory");
        run->res = n;
        run->cap_res = cap;
    }
    run->res[run->n_res++] = *r;
    return PPN_OK;
}

/* Where the slot's pages are after the measurement, as the OS says (host-staging only). */
static int slot_node(tb_case *c, ppn_rt *rt)
{
    ppn_topo *t;
    int node = -1;
    if (c->kind != TB_HOST || ppn_rt_topo(rt, &t) != PPN_OK) return -1;
    if (ppn_topo_area_node(t, c->b.slot[0].host, c->b.bytes, &node, NULL, 0) != PPN_OK) return -1;
    return node;
}

/* Every size of one transport kind (and slot placement) between the streams of c. */
static ppn_status bench_sizes(tb_run *run, tb_case *c, int kind, int slot)
{
    c->kind = kind;
    for (int i = 0; i < run->a->n_sizes; i++) {
        size_t size = run->a->sizes[i];
        tb_result r = {.kind = kind, .from = ppn_pool_device(c->pfrom), .to = ppn_pool_device(c->pto), .size = size,
                       .slot = kind == TB_HOST ? slot : -1, .slot_node = -1};
        if (isatty(STDERR_FILENO)) /* progress: a case can take seconds; \r overwrites the line */
            fprintf(stderr, "\rtransport-bench: case %d: %-10s %d->%d %9zu B %-10s ...  ", ++run->n_cases,
                    tb_names[kind], r.from, r.to, size, kind == TB_HOST ? slot_names[slot] : "");
        ppn_status st = case_setup(c, run->rt, size, slot);
        if (st == PPN_OK) st = measure(c, run->a, &r);
        r.bytes = c->b.bytes;
        r.slot_node = slot_node(c, run->rt);
        ppn_status st2 = case_teardown(c);
        if (st == PPN_OK) st = st2;
        if (st != PPN_OK) return ppn_err_ctx(st, "%s %d->%d, %zu B", tb_names[kind], r.from, r.to, size);
        PPN_CHECK(push_result(run, &r));
    }
    return PPN_OK;
}

static ppn_status bench_kind(tb_run *run, tb_case *c, int kind)
{
    if (kind != TB_HOST) return bench_sizes(run, c, kind, -1);
    for (int k = 0; k < SLOT_KINDS; k++)
        if (run->a->slots & (1 << k)) PPN_CHECK(bench_sizes(run, c, kind, k));
    return PPN_OK;
}

/* The transports of one device pair: the same-device ones when from == to, else the one the stage map would
 * choose (peer when both directions can access, else host-staged), with the grants the runtime would enable. */
static ppn_status bench_pair(tb_run *run, int from, int to)
{
    ppn_gpu *g = run->rt->g;
    tb_case c = {.g = g};
    int kinds[3], nk = 0;
    ppn_status st;
    if (from == to) {
        kinds[nk++] = TB_INPLACE, kinds[nk++] = TB_DTOD, kinds[nk++] = TB_KERNEL;
    } else {
        int ab = 0, ba = 0;
        PPN_CHECK(g->ops->peer_can_access(g, to, from, &ab));
        PPN_CHECK(g->ops->peer_can_access(g, from, to, &ba));
        if (ab && ba) {
            PPN_CHECK(g->ops->peer_enable(g, to, from));
            PPN_CHECK(g->ops->peer_enable(g, from, to));
        }
        if (ab && ba) kinds[nk++] = TB_PEER;
        kinds[nk++] = TB_HOST; /* always possible: what the runtime falls back to without a peer grant */
    }
    PPN_CHECK(ppn_rt_pool(run->rt, from, &c.pfrom));
    PPN_CHECK(ppn_rt_pool(run->rt, to, &c.pto));
    PPN_CHECK_GOTO(g->ops->stream_create(g, from, &c.prod), st, out);
    PPN_CHECK_GOTO(g->ops->stream_create(g, to, &c.cons), st, out);
    for (int k = 0; k < nk; k++) PPN_CHECK_GOTO(bench_kind(run, &c, kinds[k]), st, out);
    st = PPN_OK;
out:
    for (int i = 0; i < 2; i++) {
        ppn_gstream *s = i ? c.cons : c.prod;
        if (!s) continue;
        g->ops->stream_sync(g, s);
        ppn_pool_stream_retired(c.pfrom, s);
        if (c.pto != c.pfrom) ppn_pool_stream_retired(c.pto, s);
        g->ops->stream_destroy(g, s);
    }
    return st;
}

/* Reports -------------------------------------------------------------------------------------------------- */

static double gbps(const tb_result *r) { return (double)r->bytes / (r->tput_us * 1e-6) / 1e9; }

static void print_table(const tb_run *run)
{
    char sz[32];
    printf("transport-bench: backend %s, %d device(s); one host thread drives producer and consumer alternately\n"
           "latency: one hand-off + consumer sync (us); throughput: %d queued hand-offs, slots alternating\n"
           "kernel_add: ppn has no copy kernel; ppn_op_add(dst, slot, zeros) stands in (1.5x a copy's traffic)\n",
           ppn_rt_backend(run->rt), ppn_rt_device_count(run->rt), run->a->batch);
    if (run->a->sim_defaults) printf("%s\n", sim_note());
    if (run->a->one_node) printf("%s\n", one_node_note());
    if (run->a->sim)
        printf("model: the sim latency model's copy time per hand-off (us), whether or not PPN_SIM_LATENCY applies it\n");
    printf("%-10s %-6s %-10s %5s %8s %10s %10s %10s %10s %10s %12s %10s%s\n", "transport", "pair", "host slot", "node",
           "size", "slot B", "lat min", "median", "p99", "mean", "us/handoff", "GB/s", run->a->sim ? "      model" : "");
    for (int i = 0; i < run->n_res; i++) {
        const tb_result *r = &run->res[i];
        char pair[16];
        plot_fmt_bytes((double)r->size, sz, sizeof sz);
        snprintf(pair, sizeof pair, "%d->%d", r->from, r->to);
        char node[16] = "-";
        if (r->slot >= 0 && r->slot_node >= 0) snprintf(node, sizeof node, "%d", r->slot_node);
        else if (r->slot >= 0) snprintf(node, sizeof node, "%s", r->slot_node == -2 ? "many" : "?");
        printf("%-10s %-6s %-10s %5s %8s %10zu %10.2f %10.2f %10.2f %10.2f %12.2f %10.3f", tb_names[r->kind], pair,
               r->slot >= 0 ? slot_names[r->slot] : "-", node, sz, r->bytes, r->lat_min, r->lat_med, r->lat_p99,
               r->lat_mean, r->tput_us, gbps(r));
        if (r->model_copy_us >= 0) printf(" %10.2f", r->model_copy_us);
        putchar('\n');
    }
}

static int print_json(const tb_run *run)
{
    json_t *root = json_object(), *res = json_array();
    json_object_set_new(root, "tool", json_string("transport-bench"));
    json_object_set_new(root, "backend", json_string(ppn_rt_backend(run->rt)));
    json_object_set_new(root, "devices", json_integer(ppn_rt_device_count(run->rt)));
    json_object_set_new(root, "iters", json_integer(run->a->iters));
    json_object_set_new(root, "warmup", json_integer(run->a->warmup));
    json_object_set_new(root, "batch", json_integer(run->a->batch));
    if (run->a->sim_defaults) json_object_set_new(root, "sim_defaults", json_string(sim_note()));
    if (run->a->one_node) json_object_set_new(root, "one_numa_node", json_string(one_node_note()));
    json_object_set_new(root, "driver", json_string("one host thread drives producer and consumer alternately "
                                                    "(send, recv, release): the device-side chain, no cross-thread "
                                                    "wake-up"));
    json_object_set_new(root, "kernel_add_note", json_string("ppn has no copy kernel: ppn_op_add(dst, slot, zeros) "
                                                             "on the in-place chain, reads 2 and writes 1 buffer"));
    for (int i = 0; i < run->n_res; i++) {
        const tb_result *r = &run->res[i];
        json_t *o = json_object(), *lat = json_object();
        json_object_set_new(o, "transport", json_string(tb_names[r->kind]));
        json_object_set_new(o, "from", json_integer(r->from));
        json_object_set_new(o, "to", json_integer(r->to));
        json_object_set_new(o, "size", json_integer((json_int_t)r->size));
        if (r->slot >= 0) {
            json_object_set_new(o, "host_slot", json_string(slot_names[r->slot]));
            json_object_set_new(o, "host_slot_node", json_integer(r->slot_node));
        }
        json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
        json_object_set_new(lat, "min", json_real(r->lat_min));
        json_object_set_new(lat, "median", json_real(r->lat_med));
        json_object_set_new(lat, "p99", json_real(r->lat_p99));
        json_object_set_new(lat, "mean", json_real(r->lat_mean));
        json_object_set_new(o, "latency_us", lat);
        json_object_set_new(o, "throughput_us_per_handoff", json_real(r->tput_us));
        json_object_set_new(o, "handoffs_per_s", json_real(1e6 / r->tput_us));
        json_object_set_new(o, "bandwidth_GBps", json_real(gbps(r)));
        if (r->model_copy_us >= 0) json_object_set_new(o, "model_copy_us", json_real(r->model_copy_us));
        json_array_append_new(res, o);
    }
    json_object_set_new(root, "results", res);
    int rc = json_dumpf(root, stdout, JSON_COMPACT | JSON_REAL_PRECISION(6));
    json_decref(root);
    putchar('\n');
    return rc == 0 ? 0 : cli_fail("transport-bench: writing the JSON failed");
}

/* Median latency vs size, one series per transport and pair. */
static int write_plot(const tb_run *run)
{
    int n = run->n_res, ns = 0, rc = 0;
    plot_series *s = calloc((size_t)(n ? n : 1), sizeof *s);
    double *x = malloc(sizeof *x * (size_t)(n ? n : 1)), *y = malloc(sizeof *y * (size_t)(n ? n : 1));
    char (*names)[48] = calloc((size_t)(n ? n : 1), sizeof *names);
    if (!s || !x || !y || !names) {
        rc = cli_fail("transport-bench: out of memory");
        goto out;
    }
    /* results come grouped: one run of sizes per (transport, pair) */
    for (int i = 0; i < n; i++) {
        const tb_result *r = &run->res[i];
        x[i] = (double)r->size;
        y[i] = r->lat_med;
        if (i == 0 || r->kind != run->res[i - 1].kind || r->from != run->res[i - 1].from || r->to != run->res[i - 1].to ||
            r->slot != run->res[i - 1].slot) {
            if (r->slot >= 0 && run->a->slots != 1 << SLOT_CONSUMER)
                snprintf(names[ns], sizeof names[ns], "%s(%s) %d->%d", tb_names[r->kind], slot_names[r->slot], r->from,
                         r->to);
            else snprintf(names[ns], sizeof names[ns], "%s %d->%d", tb_names[r->kind], r->from, r->to);
            s[ns] = (plot_series){.name = names[ns], .x = x + i, .y = y + i};
            ns++;
        }
        s[ns - 1].n++;
    }
    char title[128];
    snprintf(title, sizeof title, "ppn transport-bench (%s): hand-off latency, median", ppn_rt_backend(run->rt));
    plot_axis ax = {.label = "slot payload (bytes)", .log = 1, .log_base = 4, .fmt = plot_fmt_bytes};
    plot_axis ay = {.label = "latency (us), log scale", .log = 1};
    ppn_status st = plot_svg_lines(run->a->plot, title, &ax, &ay, s, ns);
    if (st != PPN_OK) rc = cli_fail_status(st, "--plot");
out:
    free(s);
    free(x);
    free(y);
    free(names);
    return rc;
}

/* Entry --------------------------------------------------------------------------------------------------- */

static ppn_status bench_all(tb_run *run)
{
    int nd = ppn_rt_device_count(run->rt);
    const tb_args *a = run->a;
    if (a->have_devs) {
        for (int i = 0; i < 2; i++)
            if (a->devs[i] >= nd)
                return ppn_err(PPN_EINVAL, "--devices %d,%d: device %d does not exist (%s backend has %d)",
                               a->devs[0], a->devs[1], a->devs[i], ppn_rt_backend(run->rt), nd);
        return bench_pair(run, a->devs[0], a->devs[1]);
    }
    PPN_CHECK(bench_pair(run, 0, 0));
    for (int from = 0; from < nd; from++)
        for (int to = from + 1; to < nd; to++) PPN_CHECK(bench_pair(run, from, to));
    return PPN_OK;
}

int cmd_transport_bench(int argc, char **argv)
{
    tb_args a;
    int rc = tb_parse(argc, argv, &a);
    if (rc) return rc;
    tb_run run = {.a = &a};
    if ((rc = cli_rt_create(a.backend, &run.rt)) != 0) return rc;
    sim_defaults(&a, run.rt);
    ppn_status st = slot_defaults(&a, run.rt);
    if (st == PPN_OK) st = bench_all(&run);
    if (isatty(STDERR_FILENO)) fputc('\n', stderr);
    if (st != PPN_OK) rc = cli_fail_status(st, "transport-bench");
    else if (a.json) rc = print_json(&run);
    else print_table(&run);
    if (rc == 0 && a.plot) rc = write_plot(&run);
    rc = cli_rt_destroy(run.rt, rc);
    free(run.res);
    return rc;
}
