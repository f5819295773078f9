/* test_faults.c - fault paths on the sim backend: every injected failure (PPN_SIM_FAIL kind:K for each kind and
 * each K the workload reaches) on three placements: 4 stages on 4 devices with overlap (peer copies), 3 stages
 * on one device (in-place slots, released after the walk) and 2 stages on 2 devices without peer access
 * (host-staged), through a prime, greedy decode and deferred steps waited out of order. For each K:
 *   - the first error any call reports names the injected failure (no checker report and no secondary error
 *     comes first), and a failed model stays refused with that cause;
 *   - the deferred steps a failure left unwaited (up to the whole in-flight room) are dropped by ppn_seq_reset
 *     without hanging on what a failed stage abandoned (test_api checks the room they free on a sound model);
 *   - the failed model and its sequence free cleanly, and a fresh model loaded on the same runtime runs the
 *     workload to the same bits as a run that never failed (the runtime recovers: 100% of the K).
 * The sweep of a kind ends when STREAK consecutive K pass without a failure (K past the workload's calls).
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
#include "tests/util/tutil.h"

enum { PROMPT = 3, GREEDY = 4, DEFERRED = PPN_MAX_INFLIGHT, STREAK = 24, MAX_K = 4000 };

typedef struct wl_out { /* what the workload computes */
    int ids[GREEDY];
    float *logits;      /* (1 + DEFERRED) * vocab: the prime's last row, then the deferred steps' */
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
} placement;

static const placement k_places[] = {
    {"4 stages on 4 devices, overlap", "all", 4, 1, 1},
    {"3 stages on device 0, in place", "all", 3, 0, 0},
    {"2 stages on 2 devices, host-staged", "none", 2, 1, 1},
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

/* Steps on a loaded model; stops at the first failure (recorded in e). Returns the sequence (or NULL). */
static ppn_seq *wl_steps(ppn_model *m, int vocab, wl_out *out, wl_err *e)
{
    static const int prompt[PROMPT] = {1, 2, 3};
    ppn_seq *q = NULL;
    ppn_status st = ppn_seq_create(m, &q);
    wl_note(e, st, "seq_create");
    if (st != PPN_OK) return NULL;
    wl_note(e, ppn_prefill(q, prompt, PROMPT, NULL, out->logits), "prefill");
    if (e->st == PPN_OK) wl_note(e, ppn_decode_greedy(q, 5, GREEDY, out->ids), "greedy");
    ppn_step_id id[DEFERRED] = {0};
    for (int t = 0; t < DEFERRED && e->st == PPN_OK; t++) /* the room filled; after a failure, left unwaited */
        wl_note(e, ppn_decode_step_deferred(q, 7 + t, &id[t]), "deferred");
    for (int t = DEFERRED - 1; t >= 0 && e->st == PPN_OK; t--) /* newest first */
        wl_note(e, ppn_pending_wait(q, id[t], out->logits + (size_t)(1 + t) * (size_t)vocab), "pending_wait");
    return q;
}

/* Load, run, and free; e records the first failure. Returns 1 when the model freed. */
static int wl_run(ppn_rt *rt, const placement *pl, const char *path, int vocab, wl_out *out, wl_err *e)
{
    ppn_door d;
    ppn_load_opts o = split_opts(pl, &d);
    ppn_model *m = NULL;
    ppn_status st = ppn_model_load(rt, path, &o, &m);
    wl_note(e, st, "load");
    if (st != PPN_OK) return 1;
    ppn_seq *q = wl_steps(m, vocab, out, e);
    if (e->st != PPN_OK && q) { /* a failed model stays refused, with its cause; the reset frees the room */
        (void)ppn_seq_reset(q);
        ppn_step_id id = 0;
        ppn_status again = ppn_decode_step_deferred(q, 1, &id);
        if (again == PPN_OK || !strstr(ppn_last_error(), "injected failure"))
            fail_msg("after '%s' failed, a new step got %s: %s", e->msg, ppn_status_name(again), ppn_last_error());
    }
    ppn_seq_destroy(q);
    return ppn_model_free(m) == PPN_OK;
}

typedef struct sweep_fix {
    char path[4096];
    int vocab;
    wl_out ref[N_PLACES]; /* a run that never failed, per placement */
} sweep_fix;

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
        f->ref[p].logits = calloc((size_t)(1 + DEFERRED) * (size_t)f->vocab, sizeof(float));
        wl_err e = {PPN_OK, "", NULL};
        if (rt_for(&k_places[p], NULL, &rt) != PPN_OK) return -1;
        int freed = wl_run(rt, &k_places[p], f->path, f->vocab, &f->ref[p], &e);
        if (e.st != PPN_OK || !freed || ppn_rt_destroy(rt) != PPN_OK) {
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
    size_t lb = sizeof(float) * (size_t)(1 + DEFERRED) * (size_t)f->vocab;
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
    if (ppn_rt_destroy(rt) != PPN_OK) fail_msg("%s: ppn_rt_destroy: %s", spec, ppn_last_error());
    return hit;
}

/* PPN_TEST_FAULT_STRIDE=S sweeps every S-th K (1, 1 + S, ...): the sanitizer builds' setting (build.sh), where
 * every load costs ten times as much; the plain suite sweeps every K. */
static int fault_stride(void)
{
    const char *s = getenv("PPN_TEST_FAULT_STRIDE");
    int v = s ? atoi(s) : 1;
    return v >= 1 ? v : 1;
}

static void sweep_kind(void **state, const char *kind, int min_hits)
{
    const sweep_fix *f = *state;
    int stride = fault_stride();
    for (int p = 0; p < N_PLACES; p++) {
        int hits = 0, clean = 0, k = 1;
        for (; k <= MAX_K && clean < STREAK; k += stride) {
            int hit = sweep_one(f, p, kind, k);
            hits += hit;
            clean = hit ? 0 : clean + 1;
        }
        printf("%s: PPN_SIM_FAIL=%s:1..%d (every %d): %d failures injected, every one reported first and recovered\n",
               k_places[p].name, kind, k - stride, stride, hits);
        assert_true(clean == STREAK); /* the sweep reached past the workload's calls */
        assert_true(hits * stride >= min_hits); /* and was not vacuous */
    }
}

static void test_faults_record(void **state) { sweep_kind(state, "record", 30); }
static void test_faults_copy(void **state) { sweep_kind(state, "copy", 30); }
static void test_faults_launch(void **state) { sweep_kind(state, "launch", 30); }
static void test_faults_alloc(void **state) { sweep_kind(state, "alloc", 3); }

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
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
