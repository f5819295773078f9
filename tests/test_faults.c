/* test_faults.c - fault paths on the sim backend: every injected failure (PPN_SIM_FAIL kind:K for each kind the
 * sim can fail: alloc, copy, launch, record, wait, memset, hostfn, free, stream, event) on three placements: 4
 * stages on 4 devices with overlap (peer copies), 3 stages on one device (in-place slots, released after the walk)
 * and 2 stages on 2 devices without peer access (host-staged), through a model load, a prime, greedy decode,
 * deferred steps waited out of order, the sequence's reset and destroy, the model's free and the runtime's
 * destroy; a fourth run covers the other step paths on the first placement (wl_paths: a published door, an eager
 * step, a batch in micro-batches, a mixed step, a spec verify). A clean run per placement counts the calls of each
 * kind (ppn_sim_counts.fault_calls); the sweep of a kind injects K = 1 .. that count (up to CAP of them: see
 * fault_stride), then past it while the failures continue (the frees of ppn_rt_destroy come after the count).
 * For each K:
 *   - the first error any call reports names the injected failure (no checker report and no secondary error
 *     comes first), and a failed model stays refused with that cause and status;
 *   - the deferred steps a failure left unwaited (up to the whole in-flight room) are dropped by ppn_seq_reset
 *     without hanging on what a failed stage abandoned, and their in-flight room is free again;
 *   - the failed model and its sequence free cleanly, the checker reports nothing (no race, no use after free,
 *     nothing sticky), the pools hold no live block once every model is freed, and a fresh model loaded on the
 *     same runtime runs the workload to the same bits as a run that never failed (100% of the K);
 *   - a failed free (or a failure anywhere in ppn_rt_destroy) is returned by ppn_rt_destroy, which still frees
 *     everything else (the backend reclaims what its driver refused to free when it closes);
 *   - a failed record at a pool free (the block retired: alloc/pool.h) is returned by what freed it, the
 *     sequence's destroy and the model's free included, which still complete: every record K visited is reported.
 * Every record of a sequence's destroy failed in turn: returned, and a retired block shows in ppn_stats
 * (pool_retired, pool_retired_bytes); every record of an engine's destroy (its spare sequence): returned by
 * ppn_engine_destroy.
 * Host functions: the runtime issues none (hostfn's count is 0 on every path), so its sweep only proves that.
 * Also the non-finite scan that guards weights and logits (core/base/dtype.c): every position, every dtype. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "core/base/dtype.h"
#include "core/device/gpu.h"
#include "core/rt.h"
#include "tests/util/tutil.h"

enum { PROMPT = 3, GREEDY = 4, DEFERRED = PPN_MAX_INFLIGHT, TAIL = 2, N_IDS = 16, ROWS = 1 + DEFERRED + 6 };

/* PPN_SIM_FAIL's kinds, in ppn_sim_counts.fault_calls' order */
enum { F_ALLOC, F_COPY, F_LAUNCH, F_RECORD, F_WAIT, F_MEMSET, F_HOSTFN, F_FREE, F_STREAM, F_EVENT };
static const char *const k_kinds[PPN_SIM_FAIL_KINDS] = {"alloc", "copy",   "launch", "record", "wait",
                                                       "memset", "hostfn", "free",   "stream", "event"};

typedef struct wl_out { /* what the workload computes */
    int ids[N_IDS];
    float *logits;      /* ROWS * vocab: the prime's last row, then the deferred steps' (the paths: see wl_paths) */
} wl_out;

typedef struct wl_err { /* the first failure the workload met */
    ppn_status st;
    char msg[1024];
    const char *where;
} wl_err;

static void wl_note(wl_err *e, ppn_status st, const char *where)
{
    if (st == PPN_OK || e->st != PPN_OK) return;
    e->st = st;
    e->where = where;
    snprintf(e->msg, sizeof e->msg, "%s", ppn_last_error());
}

typedef struct placement {
    const char *name, *peer; /* peer: PPN_SIM_PEER */
    int n, spread, overlap;  /* spread: stage s on device s (else all on device 0) */
    int paths;               /* 1: wl_paths' workload (the other step paths) instead of wl_steps' */
} placement;

static const placement k_places[] = {
    {"4 stages on 4 devices, overlap", "all", 4, 1, 1, 0},
    {"3 stages on device 0, in place", "all", 3, 0, 0, 0},
    {"2 stages on 2 devices, host-staged", "none", 2, 1, 1, 0},
    {"4 stages on 4 devices; publish, eager, batch, mixed, verify", "all", 4, 1, 1, 1},
};
enum { N_PLACES = sizeof k_places / sizeof k_places[0] };

static ppn_load_opts split_opts(const placement *pl, ppn_door *d)
{
    *d = ppn_door_default();
    d->n_stages = pl->n;
    d->n_devices = pl->spread ? pl->n : 0;
    for (int s = 0; pl->spread && s < pl->n; s++) d->devices[s] = s;
    d->overlap = pl->overlap;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    o.door = d;
    return o;
}

/* The other step paths, on q (primed) with two more sequences: a new door published (no overlap, no graphs), an
 * eager step, a batch of two in two micro-batches, a mixed step (a third sequence's prompt beside the two decode
 * rows), a spec verify of two drafts. Logits rows 1.. and ids 0.. in that order; stops at the first failure.
 * qs[1], qs[2]: the extra sequences (NULL when not created), for the caller to destroy. */
static void wl_paths(ppn_model *m, const placement *pl, ppn_seq *q, int vocab, wl_out *out, wl_err *e,
                     ppn_seq **qs)
{
    static const int prompt[PROMPT] = {4, 5, 6};
    size_t v = (size_t)vocab;
    ppn_door d;
    (void)split_opts(pl, &d);
    d.overlap = 0;
    d.graphs = 0;
    wl_note(e, ppn_model_publish_door(m, &d), "publish_door");
    if (e->st == PPN_OK) wl_note(e, ppn_decode_step(q, 9, out->logits + v), "decode_step");
    for (int i = 1; i < 3 && e->st == PPN_OK; i++) wl_note(e, ppn_seq_create(m, &qs[i]), "seq_create");
    if (e->st == PPN_OK) wl_note(e, ppn_prefill(qs[1], prompt, PROMPT, NULL, NULL), "prefill");
    ppn_seq *rows[2] = {q, qs[1]};
    int tok[2] = {11, 12};
    ppn_batch_opts o = ppn_batch_opts_default();
    o.micro = 2;
    if (e->st == PPN_OK) wl_note(e, ppn_decode_batch_ex(rows, tok, 2, &o, out->logits + 2 * v, out->ids), "batch");
    ppn_seq *const pseq[1] = {qs[2]};
    const int *const pids[1] = {prompt};
    const int pn[1] = {PROMPT};
    float *const plog[1] = {out->logits + 6 * v};
    o = ppn_batch_opts_default();
    o.n_prime = 1;
    o.prime_seqs = pseq;
    o.prime_ids = pids;
    o.prime_n = pn;
    o.prime_logits = plog;
    if (e->st == PPN_OK) wl_note(e, ppn_decode_batch_ex(rows, tok, 2, &o, out->logits + 4 * v, out->ids + 2), "mixed");
    static const int draft[2] = {3, 4};
    int n_out = 0;
    if (e->st == PPN_OK) wl_note(e, ppn_spec_verify(q, 13, draft, 2, out->ids + 4, &n_out), "verify");
    if (e->st == PPN_OK) out->ids[7] = n_out;
}

/* Steps on a loaded model; stops at the first failure (recorded in e). Returns the sequence (or NULL). */
static ppn_seq *wl_steps(ppn_model *m, const placement *pl, int vocab, wl_out *out, wl_err *e, ppn_seq **qs)
{
    static const int prompt[PROMPT] = {1, 2, 3};
    ppn_seq *q = NULL;
    ppn_status st = ppn_seq_create(m, &q);
    wl_note(e, st, "seq_create");
    if (st != PPN_OK) return NULL;
    wl_note(e, ppn_prefill(q, prompt, PROMPT, NULL, out->logits), "prefill");
    if (pl->paths) {
        if (e->st == PPN_OK) wl_paths(m, pl, q, vocab, out, e, qs);
        return q;
    }
    if (e->st == PPN_OK) wl_note(e, ppn_decode_greedy(q, 5, GREEDY, out->ids), "greedy");
    ppn_step_id id[DEFERRED] = {0};
    for (int t = 0; t < DEFERRED && e->st == PPN_OK; t++) /* the room filled; after a failure, left unwaited */
        wl_note(e, ppn_decode_step_deferred(q, 7 + t, &id[t]), "deferred");
    for (int t = DEFERRED - 1; t >= 0 && e->st == PPN_OK; t--) /* newest first */
        wl_note(e, ppn_pending_wait(q, id[t], out->logits + (size_t)(1 + t) * (size_t)vocab), "pending_wait");
    return q;
}

/* Load, run, and free; e records the first failure (the frees' too). Returns 1 when the model freed (a failed
 * device free does not stop that: it is only reported). */
static int wl_run(ppn_rt *rt, const placement *pl, const char *path, int vocab, wl_out *out, wl_err *e)
{
    ppn_door d;
    ppn_load_opts o = split_opts(pl, &d);
    ppn_model *m = NULL;
    ppn_status st = ppn_model_load(rt, path, &o, &m);
    wl_note(e, st, "load");
    if (st != PPN_OK) return 1;
    ppn_seq *qs[3] = {NULL, NULL, NULL};
    ppn_seq *q = wl_steps(m, pl, vocab, out, e, qs);
    /* a failed model stays refused, with its cause; the reset frees the room (a sequence that could not be
     * created failed nothing but itself) */
    if (e->st != PPN_OK && q && strcmp(e->where, "seq_create")) {
        (void)ppn_seq_reset(q);
        if (q->issued != q->waited)
            fail_msg("after '%s', the reset left %llu deferred steps holding the in-flight room", e->msg,
                     (unsigned long long)(q->issued - q->waited));
        for (int r = 0; r < PPN_MAX_INFLIGHT; r++)
            if (q->ring_step[r]) fail_msg("after '%s', the reset left ring entry %d busy", e->msg, r);
        ppn_step_id id = 0;
        ppn_status again = ppn_decode_step_deferred(q, 1, &id);
        if (again != e->st || !strstr(ppn_last_error(), "injected failure"))
            fail_msg("after '%s' (%s) failed, a new step got %s: %s", e->msg, ppn_status_name(e->st),
                     ppn_status_name(again), ppn_last_error());
    }
    /* a free that fails in a teardown (a pool block retired: its event record failed) is reported, and the
     * teardown still completes */
    wl_note(e, ppn_seq_destroy(qs[2]), "seq_destroy");
    wl_note(e, ppn_seq_destroy(qs[1]), "seq_destroy");
    wl_note(e, ppn_seq_destroy(q), "seq_destroy");
    st = ppn_model_free(m);
    wl_note(e, st, "model_free");
    return st != PPN_ESTATE;
}

typedef struct sweep_fix {
    char path[4096];
    int vocab;
    wl_out ref[N_PLACES];                            /* a run that never failed, per placement */
    uint64_t calls[N_PLACES][PPN_SIM_FAIL_KINDS];    /* its calls of each kind, up to ppn_rt_destroy */
} sweep_fix;

/* Before ppn_rt_destroy: the checker reported nothing (nothing sticky either) and no pool block is live (every
 * model was freed, the failed one too). Returns 0 and fails the test with spec's name otherwise. */
static int rt_clean(ppn_rt *rt, const char *spec)
{
    char msg[1024] = "";
    struct ppn_sim_counts c;
    ppn_status st = ppn_gpu_sim_take_error(rt->g, msg, sizeof msg);
    ppn_gpu_sim_counts(rt->g, &c);
    uint64_t reports = c.race + c.placement + c.use_after_free + c.double_free + c.bounds + c.stale + c.undeclared;
    if (st != PPN_OK || reports) fail_msg("%s: the checker reported %llu: %s", spec, (unsigned long long)reports, msg);
    for (int d = 0; d < PPN_MAX_DEVICES; d++) {
        ppn_pool_stats ps;
        if (!rt->pool[d]) continue;
        ppn_pool_get_stats(rt->pool[d], &ps);
        if (ps.in_use) fail_msg("%s: %zu B of device %d's pool still live after every model was freed", spec, ps.in_use, d);
    }
    return 1;
}

static ppn_status rt_for(const placement *pl, const char *fail, ppn_rt **rt)
{
    tu_env_set("PPN_SIM_PEER", pl->peer);
    tu_env_set("PPN_SIM_FAIL", fail);
    ppn_status st = ppn_rt_create("sim", rt);
    tu_env_restore();
    return st;
}

static int setup(void **state)
{
    sweep_fix *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->path, sizeof f->path, "%s", tu_fixture("hf/llama-tiny"));
    tu_env_set("PPN_SIM_FAIL", NULL);
    ppn_rt *rt = NULL;
    if (ppn_rt_create("sim", &rt) != PPN_OK) return -1;
    ppn_model *m = tu_model_load(rt, f->path, NULL);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    f->vocab = mi.vocab;
    ppn_model_free(m);
    if (ppn_rt_destroy(rt) != PPN_OK) return -1;
    for (int p = 0; p < N_PLACES; p++) {
        f->ref[p].logits = calloc((size_t)ROWS * (size_t)f->vocab, sizeof(float));
        wl_err e = {PPN_OK, "", NULL};
        if (rt_for(&k_places[p], NULL, &rt) != PPN_OK) return -1;
        int freed = wl_run(rt, &k_places[p], f->path, f->vocab, &f->ref[p], &e);
        struct ppn_sim_counts c;
        ppn_gpu_sim_counts(rt->g, &c);
        memcpy(f->calls[p], c.fault_calls, sizeof f->calls[p]);
        if (e.st != PPN_OK || !freed || !rt_clean(rt, "reference") || ppn_rt_destroy(rt) != PPN_OK) {
            fprintf(stderr, "%s: reference run failed at %s: %s\n", k_places[p].name, e.where ? e.where : "free",
                    e.msg);
            return -1;
        }
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    sweep_fix *f = *state;
    tu_env_restore();
    for (int p = 0; p < N_PLACES; p++) free(f->ref[p].logits);
    free(f);
    return 0;
}

/* One K of one kind: returns 1 when the fault was met (the workload failed), 0 when it ran clean. */
static int sweep_one(const sweep_fix *f, int p, const char *kind, int k)
{
    const placement *pl = &k_places[p];
    const wl_out *ref = &f->ref[p];
    char spec[128];
    snprintf(spec, sizeof spec, "%s, %s:%d", pl->name, kind, k);
    ppn_rt *rt = NULL;
    ppn_status st = rt_for(pl, spec + strlen(pl->name) + 2, &rt);
    if (st != PPN_OK) { /* the fault hit the runtime's own setup: it must say so, and nothing stays */
        if (!strstr(ppn_last_error(), "injected failure"))
            fail_msg("%s: ppn_rt_create: %s: %s", spec, ppn_status_name(st), ppn_last_error());
        return 1;
    }
    size_t lb = sizeof(float) * (size_t)ROWS * (size_t)f->vocab;
    wl_out got = {{0}, calloc(1, lb)};
    wl_err e = {PPN_OK, "", NULL};
    if (!wl_run(rt, pl, f->path, f->vocab, &got, &e)) fail_msg("%s: the failed model did not free: %s", spec, ppn_last_error());
    int hit = e.st != PPN_OK;
    if (hit && !strstr(e.msg, "injected failure"))
        fail_msg("%s: the first error (%s, at %s) is not the injected one: %s", spec, ppn_status_name(e.st), e.where,
                 e.msg);
    if (!hit && (memcmp(got.ids, ref->ids, sizeof got.ids) || memcmp(got.logits, ref->logits, lb)))
        fail_msg("%s: a run the fault left alone differs from the reference", spec);
    if (hit) { /* the same runtime, a fresh model: the reference's bits */
        wl_err e2 = {PPN_OK, "", NULL};
        memset(got.logits, 0, lb);
        memset(got.ids, 0, sizeof got.ids);
        if (!wl_run(rt, pl, f->path, f->vocab, &got, &e2) || e2.st != PPN_OK)
            fail_msg("%s: after '%s', a fresh model on the same runtime failed at %s: %s: %s", spec, e.msg,
                     e2.where ? e2.where : "free", ppn_status_name(e2.st), e2.msg);
        if (memcmp(got.ids, ref->ids, sizeof got.ids) || memcmp(got.logits, ref->logits, lb))
            fail_msg("%s: after '%s', the fresh model's results differ from the reference", spec, e.msg);
    }
    free(got.logits);
    rt_clean(rt, spec);
    st = ppn_rt_destroy(rt);
    if (st != PPN_OK && (hit || !strstr(ppn_last_error(), "injected failure")))
        fail_msg("%s: ppn_rt_destroy: %s: %s", spec, ppn_status_name(st), ppn_last_error());
    return hit || st != PPN_OK; /* a failed free in the destroy: reported, and the rest freed */
}

/* How many K a kind's sweep visits per placement: every K up to CAP, else CAP of them evenly spaced over the
 * whole run (load, prime, steps, reset, destroy, free), placement p starting at 1 + p % stride so that the
 * placements together reach more of the residues. The kinds counted in the hundreds (launch, record, event,
 * copy) repeat a few call sites per layer and per block, and a sweep of every K of every kind took four minutes
 * of the suite; CAP keeps it near a minute and a half. PPN_TEST_FAULT_STRIDE=S visits S times fewer (the
 * sanitizer builds' setting, build.sh, where every load costs ten times as much); PPN_TEST_FAULT_ALL=1 every K. */
enum { CAP = 60 };

static int fault_stride(uint64_t n)
{
    const char *s = getenv("PPN_TEST_FAULT_STRIDE"), *all = getenv("PPN_TEST_FAULT_ALL");
    if (all && atoi(all) == 1) return 1;
    int div = s && atoi(s) >= 1 ? atoi(s) : 1;
    uint64_t cap = CAP / (uint64_t)div > 0 ? CAP / (uint64_t)div : 1;
    return (int)((n + cap - 1) / cap > 0 ? (n + cap - 1) / cap : 1);
}

/* kind: F_*; min_calls: what a clean run must reach at least (the sweep is not vacuous; 0 for hostfn). */
static void sweep_kind(void **state, int kind, uint64_t min_calls)
{
    const sweep_fix *f = *state;
    for (int p = 0; p < N_PLACES; p++) {
        uint64_t n = f->calls[p][kind];
        int stride = fault_stride(n), hits = 0, runs = 0, clean = 0;
        uint64_t k = 1 + (uint64_t)(p % stride);
        for (; k <= n; k += (uint64_t)stride, runs++) {
            int hit = sweep_one(f, p, k_kinds[kind], (int)k);
            hits += hit;
            /* every record is reported when it fails: a pool free's too (its block retired), from a teardown */
            if (kind == F_RECORD && !hit)
                fail_msg("%s: PPN_SIM_FAIL=record:%llu failed a call that nothing reported", k_places[p].name,
                         (unsigned long long)k);
        }
        for (k = n + 1; clean < TAIL; k++, runs++) { /* past the count: ppn_rt_destroy's frees, then nothing */
            int hit = sweep_one(f, p, k_kinds[kind], (int)k);
            hits += hit;
            clean = hit ? 0 : clean + 1;
        }
        printf("%s: PPN_SIM_FAIL=%s:K, %d K in 1..%llu (every %d from %d, then each past %llu): %d failures "
               "injected, every one reported first and recovered\n",
               k_places[p].name, k_kinds[kind], runs, (unsigned long long)(k - 1), stride, 1 + p % stride,
               (unsigned long long)n, hits);
        if (n < min_calls) fail_msg("%s: a clean run reached %llu %s calls, fewer than %llu", k_places[p].name,
                                    (unsigned long long)n, k_kinds[kind], (unsigned long long)min_calls);
    }
}

static void test_faults_record(void **state) { sweep_kind(state, F_RECORD, 100); }
static void test_faults_copy(void **state) { sweep_kind(state, F_COPY, 60); }
static void test_faults_launch(void **state) { sweep_kind(state, F_LAUNCH, 300); }
static void test_faults_alloc(void **state) { sweep_kind(state, F_ALLOC, 3); }
static void test_faults_wait(void **state) { sweep_kind(state, F_WAIT, 20); }
static void test_faults_memset(void **state) { sweep_kind(state, F_MEMSET, 3); }
static void test_faults_hostfn(void **state) { sweep_kind(state, F_HOSTFN, 0); }
static void test_faults_free(void **state) { sweep_kind(state, F_FREE, 0); }
static void test_faults_stream(void **state) { sweep_kind(state, F_STREAM, 5); }
static void test_faults_event(void **state) { sweep_kind(state, F_EVENT, 100); }

/* A teardown's retired block in the public stats: a model on one device, a sequence primed, then its destroy. A
 * clean run counts the records up to the destroy (n0) and through it (n1); each K in n0+1 .. n1 fails one of the
 * destroy's records, which the destroy must return (PPN_EDRIVER, the injected failure named). Where that record
 * was a pool free's (the message says "retired"), ppn_model_get_stats reports the block: pool_retired 1 and its
 * bytes, 0 before; and ppn_rt_destroy still frees everything. At least one K must retire a block. */
static uint64_t records(ppn_rt *rt)
{
    struct ppn_sim_counts c;
    ppn_gpu_sim_counts(rt->g, &c);
    return c.fault_calls[F_RECORD];
}

/* Load path on a fresh runtime with PPN_SIM_FAIL=fail (NULL: none), prime a sequence; returns it. */
static ppn_seq *primed_seq(const char *path, const char *fail, ppn_rt **rt, ppn_model **m)
{
    static const int prompt[PROMPT] = {1, 2, 3};
    ppn_seq *q = NULL;
    tu_env_set("PPN_SIM_FAIL", fail);
    assert_int_equal(ppn_rt_create("sim", rt), PPN_OK);
    tu_env_restore();
    *m = tu_model_load(*rt, path, NULL);
    assert_int_equal(ppn_seq_create(*m, &q), PPN_OK);
    assert_int_equal(ppn_prefill(q, prompt, PROMPT, NULL, NULL), PPN_OK);
    return q;
}

static void test_faults_retired_block_in_stats(void **state)
{
    const sweep_fix *f = *state;
    ppn_rt *rt;
    ppn_model *m;
    ppn_stats ms;
    ppn_seq *q = primed_seq(f->path, NULL, &rt, &m);
    uint64_t n0 = records(rt);
    assert_int_equal(ppn_seq_destroy(q), PPN_OK);
    uint64_t n1 = records(rt);
    ppn_model_get_stats(m, &ms);
    assert_int_equal(ms.pool_retired, 0);
    assert_int_equal(ms.pool_retired_bytes, 0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    assert_true(n1 > n0);
    int retired = 0;
    for (uint64_t k = n0 + 1; k <= n1; k++) {
        char fail[64];
        snprintf(fail, sizeof fail, "record:%llu", (unsigned long long)k);
        q = primed_seq(f->path, fail, &rt, &m);
        if (records(rt) != n0) fail_msg("%s: %llu records before the destroy, %llu in the clean run", fail,
                                        (unsigned long long)records(rt), (unsigned long long)n0);
        ppn_model_get_stats(m, &ms);
        assert_int_equal(ms.pool_retired, 0);
        ppn_status st = ppn_seq_destroy(q);
        if (st != PPN_EDRIVER || !strstr(ppn_last_error(), "injected failure of record"))
            fail_msg("%s: ppn_seq_destroy returned %s: %s", fail, ppn_status_name(st), ppn_last_error());
        int was_pool = strstr(ppn_last_error(), "retired") != NULL;
        ppn_model_get_stats(m, &ms);
        if (ms.pool_retired != (uint64_t)was_pool || (ms.pool_retired_bytes > 0) != was_pool)
            fail_msg("%s: the destroy said '%s'; the model's stats say %llu retired blocks, %zu B", fail,
                     ppn_last_error(), (unsigned long long)ms.pool_retired, ms.pool_retired_bytes);
        retired += was_pool;
        assert_int_equal(ppn_model_free(m), PPN_OK);
        if (ppn_rt_destroy(rt) != PPN_OK) fail_msg("%s: ppn_rt_destroy: %s", fail, ppn_last_error());
    }
    printf("ppn_seq_destroy: records %llu .. %llu each failed once: every one returned, %d retired a pool block "
           "(seen in ppn_stats.pool_retired)\n", (unsigned long long)n0 + 1, (unsigned long long)n1, retired);
    assert_true(retired > 0);
}

/* ppn_engine_destroy returns what destroying its spare sequences met: a request runs to its end (its sequence is
 * then the engine's spare), a clean run counts the records up to the destroy and through it, and each K in
 * between fails one: the destroy returns PPN_EDRIVER naming it, and the runtime still frees everything. */
static ppn_engine *engine_run(ppn_model *m)
{
    static const int prompt[PROMPT] = {1, 2, 3};
    ppn_engine *e = NULL;
    assert_int_equal(ppn_engine_create(m, NULL, &e), PPN_OK);
    ppn_request r = ppn_request_default();
    r.ids = prompt, r.n_ids = PROMPT, r.max_tokens = 2;
    uint64_t id = 0;
    assert_int_equal(ppn_engine_submit(e, &r, &id), PPN_OK);
    int ids[8], n = 0, finish = PPN_FINISH_NONE;
    while (finish == PPN_FINISH_NONE) assert_int_equal(ppn_engine_poll(e, id, -1, ids, 8, &n, &finish, NULL), PPN_OK);
    assert_int_equal(finish, PPN_FINISH_LENGTH);
    return e;
}

static void test_faults_engine_destroy_reports(void **state)
{
    const sweep_fix *f = *state;
    ppn_rt *rt;
    tu_env_set("PPN_SIM_FAIL", NULL);
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    tu_env_restore();
    ppn_model *m = tu_model_load(rt, f->path, NULL);
    ppn_engine *e = engine_run(m);
    uint64_t n0 = records(rt);
    assert_int_equal(ppn_engine_destroy(e), PPN_OK);
    uint64_t n1 = records(rt);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    assert_true(n1 > n0);
    for (uint64_t k = n0 + 1; k <= n1; k++) {
        char fail[64];
        snprintf(fail, sizeof fail, "record:%llu", (unsigned long long)k);
        tu_env_set("PPN_SIM_FAIL", fail);
        assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
        tu_env_restore();
        m = tu_model_load(rt, f->path, NULL);
        e = engine_run(m);
        if (records(rt) != n0) fail_msg("%s: %llu records before the destroy, %llu in the clean run", fail,
                                        (unsigned long long)records(rt), (unsigned long long)n0);
        ppn_status st = ppn_engine_destroy(e);
        if (st != PPN_EDRIVER || !strstr(ppn_last_error(), "injected failure of record"))
            fail_msg("%s: ppn_engine_destroy returned %s: %s", fail, ppn_status_name(st), ppn_last_error());
        assert_int_equal(ppn_model_free(m), PPN_OK);
        if (ppn_rt_destroy(rt) != PPN_OK) fail_msg("%s: ppn_rt_destroy: %s", fail, ppn_last_error());
    }
}

/* ppn_copy_nonfinite / ppn_first_nonfinite: NaN, +Inf and -Inf found at every position of rows of every length
 * up to 70 (the vector body and each tail), for f32, bf16 and f16, the copy exact; the largest finite values of
 * each dtype, both signs, are not flagged. */
static void test_faults_nonfinite_scan(void **state)
{
    (void)state;
    static const struct {
        int dt;
        uint32_t bad[3], big[2];
    } kinds[] = {
        {PPN_DTYPE_F32, {0x7fc00000u, 0x7f800000u, 0xff800000u}, {0x7f7fffffu, 0xff7fffffu}},
        {PPN_DTYPE_BF16, {0x7fc0u, 0x7f80u, 0xff80u}, {0x7f7fu, 0xff7fu}},
        {PPN_DTYPE_F16, {0x7e00u, 0x7c00u, 0xfc00u}, {0x7bffu, 0xfbffu}},
    };
    unsigned char src[70 * 4], dst[70 * 4];
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int dt = kinds[k].dt;
        size_t esz = ppn_dtype_size(dt);
        for (size_t n = 1; n <= 70; n++) {
            for (size_t i = 0; i < n; i++) memcpy(src + i * esz, &kinds[k].big[i & 1], esz); /* little-endian */
            memset(dst, 0, sizeof dst);
            assert_int_equal(ppn_copy_nonfinite(dst, src, n, dt), 0);
            assert_memory_equal(dst, src, n * esz);
            assert_int_equal(ppn_first_nonfinite(src, n, dt), n);
            for (size_t p = 0; p < n; p++)
                for (int b = 0; b < 3; b++) {
                    unsigned char keep[4];
                    memcpy(keep, src + p * esz, esz);
                    memcpy(src + p * esz, &kinds[k].bad[b], esz);
                    if (!ppn_copy_nonfinite(dst, src, n, dt) || ppn_first_nonfinite(src, n, dt) != p)
                        fail_msg("dtype %s, n %zu: 0x%x at %zu not found", ppn_dtype_name((ppn_dtype)dt), n,
                                 kinds[k].bad[b], p);
                    assert_memory_equal(dst, src, n * esz);
                    assert_int_equal(ppn_copy_nonfinite(NULL, src, n, dt), 1);
                    memcpy(src + p * esz, keep, esz);
                }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_faults_nonfinite_scan),
        cmocka_unit_test(test_faults_record),
        cmocka_unit_test(test_faults_copy),
        cmocka_unit_test(test_faults_launch),
        cmocka_unit_test(test_faults_alloc),
        cmocka_unit_test(test_faults_wait),
        cmocka_unit_test(test_faults_memset),
        cmocka_unit_test(test_faults_hostfn),
        cmocka_unit_test(test_faults_free),
        cmocka_unit_test(test_faults_stream),
        cmocka_unit_test(test_faults_event),
        cmocka_unit_test(test_faults_retired_block_in_stats),
        cmocka_unit_test(test_faults_engine_destroy_reports),
    };
    if (getenv("PPN_TEST_FILTER")) cmocka_set_test_filter(getenv("PPN_TEST_FILTER")); /* e.g. test_faults_wait */
    return cmocka_run_group_tests(tests, setup, teardown);
}
