/* test_api.c - the public contract as ppn.h states it, on the sim backend: teardown order refused with
 * PPN_ESTATE (and nothing freed), deferred steps named by ppn_step_id and waited on their own sequence in any
 * order, dropped steps freeing their in-flight room through ppn_seq_reset, NULL handles at destroy, and a model
 * handed between two threads with and without the hand-off declared to the sim checker. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "tests/util/tutil.h"

typedef struct api_fix {
    ppn_rt *rt;
    ppn_model *m;
    int vocab;
} api_fix;

static int setup(void **state)
{
    api_fix *f = calloc(1, sizeof *f);
    if (!f || ppn_rt_create("sim", &f->rt) != PPN_OK) return -1;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    if (ppn_model_load(f->rt, tu_fixture("hf/llama-tiny"), &o, &f->m) != PPN_OK) return -1;
    ppn_model_info mi;
    ppn_model_get_info(f->m, &mi);
    f->vocab = mi.vocab;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    api_fix *f = *state;
    int bad = ppn_model_free(f->m) != PPN_OK || ppn_rt_destroy(f->rt) != PPN_OK;
    free(f);
    return bad ? -1 : 0;
}

/* Children before parents: each destroy refuses while its children live, names the count, frees nothing. */
static void test_api_teardown_order_refused(void **state)
{
    api_fix *f = *state;
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(f->m, &q), PPN_OK);
    assert_int_equal(ppn_rt_destroy(f->rt), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "1 model(s) still loaded"));
    assert_int_equal(ppn_model_free(f->m), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "1 sequence(s) still live"));
    float *row = malloc(sizeof(float) * (size_t)f->vocab);
    assert_int_equal(ppn_decode_step(q, 1, row), PPN_OK); /* the refusals left everything usable */
    free(row);
    ppn_seq_destroy(q);
    ppn_seq_destroy(NULL);
    assert_int_equal(ppn_model_free(NULL), PPN_OK);
    assert_int_equal(ppn_rt_destroy(NULL), PPN_OK);
}

/* Deferred steps waited out of order: the logits match the eager run's, row for row. The step issued after the
 * newest was waited takes that step's ring entry, not the entry after the last one issued (still in flight). */
static void test_api_steps_waited_in_any_order(void **state)
{
    api_fix *f = *state;
    size_t v = (size_t)f->vocab;
    enum { N = PPN_MAX_INFLIGHT + 1 };
    float *eager = malloc(sizeof(float) * v * N), *got = malloc(sizeof(float) * v * N);
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(f->m, &q), PPN_OK);
    for (int t = 0; t < N; t++) assert_int_equal(ppn_decode_step(q, 1 + 5 * t, eager + (size_t)t * v), PPN_OK);
    assert_int_equal(ppn_seq_reset(q), PPN_OK);
    ppn_step_id id[N];
    for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_step_deferred(q, 1 + 5 * t, &id[t]), PPN_OK);
    ppn_step_id extra = 123;
    assert_int_equal(ppn_decode_step_deferred(q, 1, &extra), PPN_ESTATE); /* the in-flight room is full */
    assert_true(extra == 0);
    int last = PPN_MAX_INFLIGHT - 1;
    assert_int_equal(ppn_pending_wait(q, id[last], got + (size_t)last * v), PPN_OK);
    assert_int_equal(ppn_decode_step_deferred(q, 1 + 5 * last + 5, &id[N - 1]), PPN_OK);
    static const int order[N] = {1, N - 1, 0, 2};
    for (int i = 0; i < N - 1; i++) {
        int t = order[i];
        assert_int_equal(ppn_pending_wait(q, id[t], got + (size_t)t * v), PPN_OK);
    }
    assert_memory_equal(eager, got, sizeof(float) * v * N);
    assert_int_equal(ppn_pending_wait(q, id[0], NULL), PPN_EINVAL); /* waited once */
    assert_int_equal(ppn_pending_wait(q, 0, NULL), PPN_EINVAL);     /* never a step */
    ppn_seq_destroy(q);
    free(eager);
    free(got);
}

/* Steps never waited: a reset drops them and frees the room; their ids are refused afterwards; the sequence
 * then decodes as a fresh one. A step id of one sequence is refused by another. */
static void test_api_dropped_steps_free_their_room(void **state)
{
    api_fix *f = *state;
    ppn_seq *q = NULL, *r = NULL;
    assert_int_equal(ppn_seq_create(f->m, &q), PPN_OK);
    assert_int_equal(ppn_seq_create(f->m, &r), PPN_OK);
    ppn_step_id id[PPN_MAX_INFLIGHT];
    for (int round = 0; round < 3; round++) { /* without the drop, round 1 would find no room */
        for (int t = 0; t < PPN_MAX_INFLIGHT; t++)
            assert_int_equal(ppn_decode_step_deferred(q, 2 + t, &id[t]), PPN_OK);
        assert_int_equal(ppn_pending_wait(r, id[0], NULL), PPN_EINVAL); /* not r's */
        assert_int_equal(ppn_seq_reset(q), PPN_OK);
        assert_int_equal(ppn_seq_pos(q), 0);
        assert_int_equal(ppn_pending_wait(q, id[1], NULL), PPN_EINVAL);
        assert_non_null(strstr(ppn_last_error(), "dropped"));
    }
    size_t v = (size_t)f->vocab;
    float *a = malloc(sizeof(float) * v), *b = malloc(sizeof(float) * v);
    assert_int_equal(ppn_decode_step(q, 7, a), PPN_OK);
    assert_int_equal(ppn_decode_step(r, 7, b), PPN_OK);
    assert_memory_equal(a, b, sizeof(float) * v); /* q starts over as r does: position 0, token 7 */
    ppn_seq_destroy(q);
    ppn_seq_destroy(r);
    free(a);
    free(b);
}

/* Destroying a sequence with steps in flight drops them; the model frees cleanly afterwards (teardown). */
static void test_api_destroy_with_steps_in_flight(void **state)
{
    api_fix *f = *state;
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(f->m, &q), PPN_OK);
    ppn_step_id id;
    for (int t = 0; t < 3; t++) assert_int_equal(ppn_decode_step_deferred(q, 3, &id), PPN_OK);
    ppn_seq_destroy(q);
    ppn_stats st;
    ppn_model_get_stats(f->m, &st);
    assert_true(st.steps >= 3);
}

/* ppn_version() is the header's PPN_VERSION_* (what the embedder compiled with) as "MAJOR.MINOR.PATCH". */
static void test_api_version(void **state)
{
    (void)state;
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", PPN_VERSION_MAJOR, PPN_VERSION_MINOR, PPN_VERSION_PATCH);
    assert_non_null(ppn_version());
    assert_string_equal(ppn_version(), want);
}

static void test_api_dtype_names(void **state)
{
    (void)state;
    assert_string_equal(ppn_dtype_name(PPN_DTYPE_F32), "f32");
    assert_string_equal(ppn_dtype_name(PPN_DTYPE_BF16), "bf16");
    assert_string_equal(ppn_dtype_name(PPN_DTYPE_F16), "f16");
    assert_string_equal(ppn_dtype_name(PPN_DTYPE_DEFAULT), "default");
    assert_string_equal(ppn_dtype_name((ppn_dtype)7), "?");
}

static ppn_status load_at(ppn_rt *rt, const char *dir, int dtype, int stages, ppn_model **m)
{
    ppn_door d = ppn_door_default();
    d.n_stages = stages;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    o.dtype = dtype;
    o.door = &d;
    return ppn_model_load(rt, dir, &o, m);
}

/* A weight that is NaN or Inf is refused at load, naming the tensor, its layer and the element; so is a finite
 * weight that the chosen dtype cannot hold. Nothing stays loaded (the runtime frees). */
static void test_api_nonfinite_weights_refused(void **state)
{
    (void)state;
    static const struct {
        const char *tensor;
        float v;
        int dtype;
        ppn_status st;
        const char *says[3];
    } cases[] = {
        {"model.norm.weight", NAN, PPN_DTYPE_F32, PPN_EFORMAT, {"final_norm", "element 0 of 64 is NaN", NULL}},
        {"model.layers.2.mlp.down_proj.weight", INFINITY, PPN_DTYPE_F32, PPN_EFORMAT, {"layer 2", "w_down", "is Inf"}},
        {"model.layers.1.self_attn.k_proj.weight", -INFINITY, PPN_DTYPE_BF16, PPN_EFORMAT, {"layer 1", "wq|wk|wv", "Inf"}},
        {"model.norm.weight", 1e30f, PPN_DTYPE_F16, PPN_EUNSUPPORTED, {"final_norm", "past the range of f16", NULL}},
    };
    ppn_rt *rt = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = tu_patched_tiny(cases[i].tensor, cases[i].v, 1);
        ppn_model *m = NULL;
        ppn_status st = load_at(rt, dir, cases[i].dtype, 1, &m);
        if (st != cases[i].st) fail_msg("case %zu: %s, want %s: %s", i, ppn_status_name(st), ppn_status_name(cases[i].st),
                                       ppn_last_error());
        for (int k = 0; k < 3 && cases[i].says[k]; k++)
            if (!strstr(ppn_last_error(), cases[i].says[k]))
                fail_msg("case %zu: the message lacks '%s': %s", i, cases[i].says[k], ppn_last_error());
        tu_rmrf(dir);
        free(dir);
    }
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK); /* no model stayed loaded */
}

/* Finite weights whose products overflow (the final norm's weights at 3e38): the logits are NaN or Inf. Every
 * path that returns them (a step's readback, a prime's rows, device greedy's ids, a batch's rows or ids, a
 * verify's ids) fails with PPN_ENONFINITE
 * naming the sequence, the position and the stage that computed them; the model itself is not failed. */
static void test_api_nonfinite_logits_named(void **state)
{
    (void)state;
    char *dir = tu_patched_tiny("model.norm.weight", 3e38f, 64);
    ppn_rt *rt = NULL;
    ppn_model *m = NULL;
    ppn_seq *q = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt), PPN_OK);
    assert_int_equal(load_at(rt, dir, PPN_DTYPE_F32, 2, &m), PPN_OK);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *row = malloc(sizeof(float) * (size_t)mi.vocab * 3);
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    assert_int_equal(ppn_decode_step(q, 1, NULL), PPN_OK); /* nothing read back, nothing to check */
    assert_int_equal(ppn_decode_step(q, 2, row), PPN_ENONFINITE);
    const char *e = ppn_last_error();
    assert_non_null(strstr(e, "the step at position 1"));
    assert_non_null(strstr(e, "stage 1 of 2"));
    assert_non_null(strstr(e, "not finite"));
    assert_int_equal(ppn_seq_reset(q), PPN_OK); /* not the model's failure */
    int ids[4];
    assert_int_equal(ppn_decode_greedy(q, 1, 4, ids), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "device argmax found a logit that is NaN or infinite"));
    assert_non_null(strstr(ppn_last_error(), "stage 1 of 2"));
    assert_int_equal(ppn_seq_reset(q), PPN_OK);
    static const int prompt[3] = {1, 2, 3};
    assert_int_equal(ppn_prefill(q, prompt, 3, NULL, row), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "prefill: prompt 0"));
    assert_non_null(strstr(ppn_last_error(), "position 2"));
    ppn_seq *two[2] = {q, NULL};
    assert_int_equal(ppn_seq_create(m, &two[1]), PPN_OK);
    static const int toks[2] = {4, 5};
    ppn_status st = PPN_OK;
    int out[1], n_out = 0;
    assert_int_equal(ppn_seq_reset(q), PPN_OK); /* verify rounds of no draft: the id of each row */
    for (int t = 0; t < 8 && st == PPN_OK; t++) st = ppn_spec_verify(q, 1, NULL, 0, out, &n_out);
    assert_int_equal(st, PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "ppn_spec_verify: sequence"));
    assert_int_equal(ppn_seq_reset(q), PPN_OK);
    /* a batch of two ran before its rows were checked: the failure is the model's (no caller can retry rows) */
    assert_int_equal(ppn_decode_batch_ex(two, toks, 2, NULL, NULL, (int[2]){0}), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "ppn_decode_batch: sequence"));
    assert_non_null(strstr(ppn_last_error(), "device argmax found a logit that is NaN or infinite"));
    assert_int_equal(ppn_decode_step(q, 1, NULL), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "earlier failure"));
    ppn_seq_destroy(two[1]);
    ppn_seq_destroy(q);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    /* the same with the logits returned, on a fresh model */
    assert_int_equal(load_at(rt, dir, PPN_DTYPE_F32, 2, &m), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[0]), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[1]), PPN_OK);
    assert_int_equal(ppn_decode_batch_ex(two, toks, 2, NULL, row, NULL), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "ppn_decode_batch: sequence"));
    assert_non_null(strstr(ppn_last_error(), "stage 1 of 2"));
    ppn_seq_destroy(two[0]);
    ppn_seq_destroy(two[1]);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    /* a mixed step's prompt slice, its decode row's ids unasked: the slice's logits named, the model's failure */
    assert_int_equal(load_at(rt, dir, PPN_DTYPE_F32, 2, &m), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[0]), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[1]), PPN_OK);
    {
        const int *pid = prompt;
        static const int p3 = 3;
        float *plog = row;
        ppn_batch_opts o = {.n_prime = 1, .prime_seqs = &two[1], .prime_ids = &pid, .prime_n = &p3,
                            .prime_logits = &plog};
        assert_int_equal(ppn_decode_batch_ex(two, toks, 1, &o, NULL, NULL), PPN_ENONFINITE);
        assert_non_null(strstr(ppn_last_error(), "ppn_decode_batch (prompt slice): sequence"));
        assert_non_null(strstr(ppn_last_error(), "position 2"));
    }
    ppn_seq_destroy(two[0]);
    ppn_seq_destroy(two[1]);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    /* two prompts primed together: named, and the model's failure */
    assert_int_equal(load_at(rt, dir, PPN_DTYPE_F32, 2, &m), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[0]), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &two[1]), PPN_OK);
    const int *ps[2] = {prompt, prompt};
    static const int pn[2] = {3, 2};
    assert_int_equal(ppn_prefill_batch(two, ps, pn, 2, NULL, row), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "prefill: prompt 0"));
    assert_int_equal(ppn_decode_step(two[1], 1, NULL), PPN_ENONFINITE);
    assert_non_null(strstr(ppn_last_error(), "earlier failure"));
    ppn_seq_destroy(two[0]);
    ppn_seq_destroy(two[1]);
    free(row);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_rmrf(dir);
    free(dir);
}

/* ---- an embedder's hand-off of a model between its threads ------------------------------------------------ */

typedef struct adopter {
    ppn_model *m;
    ppn_seq *q;
    int declare;          /* the hand-offs declared (ppn_model_handoff_*) */
    _Atomic int posted;   /* the embedder's own means: a flag (its address is the key of the hand-off to B) */
    int back;             /* the key of the hand-off back, after the join */
    ppn_status st;
    char err[1024];       /* B's ppn_last_error() (per thread) */
} adopter;

/* Thread B: takes the model over once the flag is up, primes the sequence further and steps it. */
static void *adopter_main(void *arg)
{
    adopter *a = arg;
    while (!atomic_load(&a->posted)) sched_yield();
    if (a->declare) a->st = ppn_model_handoff_acquire(a->m, (const void *)&a->posted);
    static const int more[2] = {5, 6};
    if (a->st == PPN_OK) a->st = ppn_prefill(a->q, more, 2, NULL, NULL);
    if (a->st == PPN_OK) a->st = ppn_decode_step(a->q, 7, NULL);
    if (a->st != PPN_OK) snprintf(a->err, sizeof a->err, "%s", ppn_last_error());
    if (a->declare) (void)ppn_model_handoff_release(a->m, &a->back);
    return NULL;
}

/* Thread A loads a model and primes a sequence, then hands both to thread B through a flag. The sim gives each
 * host thread its own checker clock: B's prefill writes its tokens into pinned bytes A used before (the pinned
 * arena hands them out again: A's upload staging, its prefill's tokens), ordered before B's write by what A
 * waited for, which B has not seen unless the hand-off is declared. With the hand-off
 * declared (release before the flag, acquire after it; and back, around the join) the run is clean; without, B's
 * first call fails with the checker's race; with one clock shared by every thread (PPN_SIM_THREAD_CLOCKS=0, the
 * opt-out) it is clean undeclared. */
static void test_api_model_handoff_between_threads(void **state)
{
    (void)state;
    for (int mode = 0; mode < 3; mode++) { /* 0: declared; 1: undeclared; 2: undeclared, one shared clock */
        tu_env_set("PPN_SIM_THREAD_CLOCKS", mode < 2 ? "1" : "0");
        ppn_rt *rt = NULL;
        ppn_status st = ppn_rt_create("sim", &rt);
        tu_env_restore();
        assert_int_equal(st, PPN_OK);
        ppn_load_opts o = ppn_load_opts_default();
        o.ctx = 64;
        adopter a = {.m = tu_model_load(rt, tu_fixture("hf/llama-tiny"), &o), .declare = mode == 0};
        assert_int_equal(ppn_seq_create(a.m, &a.q), PPN_OK);
        static const int prompt[3] = {1, 2, 3};
        assert_int_equal(ppn_prefill(a.q, prompt, 3, NULL, NULL), PPN_OK);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, adopter_main, &a), 0);
        if (a.declare) assert_int_equal(ppn_model_handoff_release(a.m, (const void *)&a.posted), PPN_OK);
        atomic_store(&a.posted, 1);
        pthread_join(th, NULL);
        if (a.declare) assert_int_equal(ppn_model_handoff_acquire(a.m, &a.back), PPN_OK);
        if (mode == 1) {
            if (a.st != PPN_ERACE) fail_msg("undeclared: expected PPN_ERACE, got %s: %s", ppn_status_name(a.st), a.err);
            if (!strstr(a.err, "RACE on pinned host range") || !strstr(a.err, "host write of prefill tokens"))
                fail_msg("undeclared: not the race on the reused tokens: %s", a.err);
        } else {
            if (a.st != PPN_OK) fail_msg("mode %d: %s", mode, a.err);
            assert_int_equal(ppn_seq_pos(a.q), 6);
            assert_int_equal(ppn_decode_step(a.q, 8, NULL), PPN_OK); /* A again: clean too */
        }
        /* after the race report the backend's error is sticky: the sequence's and the model's teardown return it
         * (and still free all), the runtime's destroy (the backend gone with it) does not; clean runs: clean */
        ppn_status want = mode == 1 ? PPN_ERACE : PPN_OK, st1 = ppn_seq_destroy(a.q), st2 = ppn_model_free(a.m),
                   st3 = ppn_rt_destroy(rt);
        if (st1 != want || st2 != want || st3 != PPN_OK)
            fail_msg("mode %d teardown: seq %s, model %s (want %s), rt %s", mode, ppn_status_name(st1),
                     ppn_status_name(st2), ppn_status_name(want), ppn_status_name(st3));
    }
}

/* NULL model or key: refused, named, nothing declared. */
static void test_api_model_handoff_refuses_null(void **state)
{
    api_fix *f = *state;
    int key = 0;
    assert_int_equal(ppn_model_handoff_release(NULL, &key), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_model_handoff_release: model is NULL"));
    assert_int_equal(ppn_model_handoff_release(f->m, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_model_handoff_release: key is NULL"));
    assert_int_equal(ppn_model_handoff_acquire(NULL, &key), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_model_handoff_acquire: model is NULL"));
    assert_int_equal(ppn_model_handoff_acquire(f->m, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_model_handoff_acquire: key is NULL"));
    assert_int_equal(ppn_model_handoff_acquire(f->m, &key), PPN_OK); /* never released: adopts nothing */
    assert_int_equal(ppn_model_handoff_release(f->m, &key), PPN_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_api_teardown_order_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_steps_waited_in_any_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_dropped_steps_free_their_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_destroy_with_steps_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_model_handoff_refuses_null, setup, teardown),
        cmocka_unit_test(test_api_model_handoff_between_threads),
        cmocka_unit_test(test_api_version),
        cmocka_unit_test(test_api_dtype_names),
        cmocka_unit_test(test_api_nonfinite_weights_refused),
        cmocka_unit_test(test_api_nonfinite_logits_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
