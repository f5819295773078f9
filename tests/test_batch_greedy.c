/* test_batch_greedy.c - the device greedy loop of a batch (ppn_decode_batch_greedy) and deferred batch steps
 * (ppn_decode_batch_deferred, ppn_decode_batch_wait) on the sim backend with its checker:
 *   - the greedy loop's ids bit-identical to a host loop of ppn_decode_batch_ex(ids) feeding them back, and the
 *     step after it (logits) bit-identical too (the loop left the same caches), on every arm: one stage, the split
 *     over 4 devices (4 micro-batches), 2 micro-batches over 4 devices, 3 stages on 2 devices, 2 stages on one
 *     device, the unsplit walk; sequences at different lengths; counters say which path ran;
 *   - deferred steps: several in flight on the same sequences and on others, waited in any order, bit-identical
 *     to ppn_decode_batch_ex's logits and ids; reset, truncate and destroy of a row with steps in flight (the room
 *     comes back, the other rows' results stay, the KV blocks and the in-flight room balance at the end);
 *   - refusals before anything moves (positions, KV blocks, steps in flight, NULLs, prompt slices, ids of the
 *     other kind);
 *   - NaN logits: the loop names row, step, sequence, position and stage, and the model is refused after;
 *   - injected faults (PPN_SIM_FAIL) through a greedy loop and deferred steps: the first error names the
 *     injected failure, a model failed after issue stays refused, and a fresh model gives the clean run's bits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "tests/util/tutil.h"

#define B 5
static const int plen[B] = {1, 3, 7, 12, 20};

typedef struct arm {
    const char *name;
    int n_stages, devs[4], micro, batch_pp, mb; /* mb: the micro-batches the split walks per step (0: unsplit) */
} arm;

static const arm k_arms[] = {
    {"one stage", 1, {0}, 0, 1, 1},
    {"4 stages on 4 devices", 4, {0, 1, 2, 3}, 0, 1, 4},
    {"4 stages on 4 devices, micro 2", 4, {0, 1, 2, 3}, 2, 1, 2},
    {"3 stages on devices 0,1,1", 3, {0, 1, 1}, 0, 1, 2},
    {"2 stages on device 0", 2, {0, 0}, 0, 1, 1},
    {"unsplit walk (MEMRA_BATCH_PP=0)", 4, {0, 1, 2, 3}, 0, 0, 0},
};
enum { N_ARMS = sizeof k_arms / sizeof k_arms[0] };

static ppn_model *arm_load(const char *dir, const arm *a, int ctx)
{
    ppn_door d = ppn_door_default();
    d.n_stages = a->n_stages;
    d.n_devices = a->n_stages > 1 ? a->n_stages : 0;
    for (int s = 0; s < a->n_stages; s++) d.devices[s] = a->devs[s];
    d.batch_pp = a->batch_pp;
    d.allow_unsplit_batch = !a->batch_pp;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = ctx;
    o.door = a->n_stages > 1 ? &d : NULL;
    return tu_model_load(tu_sim_rt(), dir, &o);
}

/* B fresh sequences of m, sequence i primed with ids[0 .. plen[i]). */
static void primed(ppn_model *m, const int *ids, ppn_seq **q)
{
    for (int i = 0; i < B; i++) {
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        if (ppn_prefill(q[i], ids, plen[i], NULL, NULL) != PPN_OK) fail_msg("prefill: %s", ppn_last_error());
    }
}

/* primed, and each sequence's next token (the id after its prompt) into tok [B]: a batch's fresh start. */
static void start(ppn_model *m, const int *ids, ppn_seq **q, int *tok)
{
    primed(m, ids, q);
    for (int i = 0; i < B; i++) tok[i] = ids[plen[i]];
}

static void destroy_all(ppn_seq **q, int n)
{
    for (int i = 0; i < n; i++) ppn_seq_destroy(q[i]);
}

/* The greedy loop --------------------------------------------------------------------------------------------- */

#define STEPS 9 /* past twice the in-flight room: ring entries and plans are reused */

/* On one arm: steps of ppn_decode_batch_ex(ids) in a host loop feeding the ids back, then one step with logits; the
 * same from the same start through ppn_decode_batch_greedy, then the same step. Ids and that step's logits and ids
 * bit-identical; the counters of the path advanced. Returns the greedy ids in out [STEPS][B]. */
static void greedy_arm(const char *dir, const int *ids, const arm *a, int *out)
{
    ppn_model *m = arm_load(dir, a, 64);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    size_t vb = sizeof(float) * (size_t)mi.vocab * B;
    float *want = malloc(vb), *got = malloc(vb);
    int ref[STEPS * B], nid[2][B], tok[B];
    assert_true(want && got);
    ppn_batch_opts o = {.micro = a->micro};
    ppn_seq *q[B];
    start(m, ids, q, tok);
    for (int t = 0; t < STEPS; t++) {
        if (ppn_decode_batch_ex(q, tok, B, &o, NULL, ref + t * B) != PPN_OK) fail_msg("batch: %s", ppn_last_error());
        memcpy(tok, ref + t * B, sizeof tok);
    }
    assert_int_equal(ppn_decode_batch_ex(q, tok, B, &o, want, nid[0]), PPN_OK);
    destroy_all(q, B);

    start(m, ids, q, tok);
    ppn_stats s0, s1;
    ppn_model_get_stats(m, &s0);
    if (ppn_decode_batch_greedy(q, tok, B, STEPS, &o, out) != PPN_OK) fail_msg("%s: greedy: %s", a->name, ppn_last_error());
    ppn_model_get_stats(m, &s1);
    for (int i = 0; i < B; i++) assert_int_equal(ppn_seq_pos(q[i]), plen[i] + STEPS);
    memcpy(tok, out + (STEPS - 1) * B, sizeof tok);
    assert_int_equal(ppn_decode_batch_ex(q, tok, B, &o, got, nid[1]), PPN_OK);
    destroy_all(q, B);
    int distinct = 0;
    for (int t = 0; t < STEPS * B; t++) distinct += out[t] != out[0];
    printf("# %s: %d rows x %d steps, %d ids unlike the first; greedy steps %llu, split walks %llu, overlaps %llu\n",
           a->name, B, STEPS, distinct, (unsigned long long)(s1.batch_greedy_steps - s0.batch_greedy_steps),
           (unsigned long long)(s1.batch_split_steps - s0.batch_split_steps),
           (unsigned long long)(s1.batch_pipe_overlaps - s0.batch_pipe_overlaps));
    assert_true(distinct > 0); /* the ids vary: a token fed from the wrong place would show */
    assert_memory_equal(ref, out, sizeof ref);
    assert_memory_equal(want, got, vb);
    assert_memory_equal(nid[0], nid[1], sizeof nid[0]);
    assert_true(s1.batch_greedy_steps - s0.batch_greedy_steps == STEPS);
    assert_true(s1.batch_steps - s0.batch_steps == STEPS);
    uint64_t walks = (uint64_t)STEPS * (uint64_t)a->mb;
    if (a->n_stages > 1) assert_true(s1.batch_split_steps - s0.batch_split_steps == walks);
    for (int s = 0; a->mb && s < a->n_stages; s++) assert_true(s1.batch_walks[s] - s0.batch_walks[s] == walks);
    /* liveness: whether one stage's walker enters while another's runs depends on the threads' timing (CI's loaded
     * 2-core machine saw none in one greedy run of 36 walks, 2026-12-06): up to 8 more runs, each the same ids */
    int more = 0;
    for (; a->mb > 1 && a->n_stages > 1 && more < 8 && s1.batch_pipe_overlaps == s0.batch_pipe_overlaps; more++) {
        int again[STEPS * B];
        start(m, ids, q, tok);
        if (ppn_decode_batch_greedy(q, tok, B, STEPS, &o, again) != PPN_OK)
            fail_msg("%s: greedy again: %s", a->name, ppn_last_error());
        destroy_all(q, B);
        assert_memory_equal(again, out, sizeof again);
        ppn_model_get_stats(m, &s1);
    }
    if (more) printf("# %s: %d more greedy runs for an overlap\n", a->name, more);
    if (a->mb > 1 && a->n_stages > 1) assert_true(s1.batch_pipe_overlaps > s0.batch_pipe_overlaps);
    free(want);
    free(got);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

static void test_bgreedy_arms(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen2-tiny", dir, sizeof dir, &n);
    assert_true(n > plen[B - 1]);
    int first[STEPS * B], got[STEPS * B];
    for (int k = 0; k < N_ARMS; k++) {
        greedy_arm(dir, ids, &k_arms[k], k ? got : first);
        if (k) assert_memory_equal(first, got, sizeof got); /* every arm the one stage's ids (f32 on the sim) */
    }
    free(ids);
}

/* A batch of one is ppn_decode_greedy's loop: the same ids as that call on a twin sequence. */
static void test_bgreedy_one_row(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_model *m = arm_load(dir, &k_arms[1], 64);
    ppn_seq *a, *b;
    assert_int_equal(ppn_seq_create(m, &a), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &b), PPN_OK);
    int want[6], got[6];
    assert_int_equal(ppn_decode_greedy(a, ids[0], 6, want), PPN_OK);
    ppn_stats s0, s1;
    ppn_model_get_stats(m, &s0);
    assert_int_equal(ppn_decode_batch_greedy(&b, ids, 1, 6, NULL, got), PPN_OK);
    ppn_model_get_stats(m, &s1);
    assert_memory_equal(want, got, sizeof got);
    assert_true(s1.batch_greedy_steps - s0.batch_greedy_steps == 6);
    ppn_seq_destroy(a);
    ppn_seq_destroy(b);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

/* Refused before anything moves, named; the model stays usable. */
static void test_bgreedy_refusals(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_load_opts lo = ppn_load_opts_default();
    lo.ctx = 32;
    lo.kv_tokens = 48; /* 3 blocks of 16 */
    ppn_model *m = tu_model_load(tu_sim_rt(), dir, &lo);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    ppn_seq *q[3];
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    int tok[3] = {1, 2, 3}, out[3 * 32];
    assert_int_equal(ppn_prefill(q[1], ids, 20, NULL, NULL), PPN_OK); /* 2 blocks, 12 positions left, 1 free */
    ppn_kv_info k0, k1;
    ppn_model_get_kv_info(m, &k0);
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 3, 13, NULL, out), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "row 1"));
    assert_non_null(strstr(ppn_last_error(), "13 steps from position 20"));
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 3, 12, NULL, out), PPN_ENOMEM); /* 1 + 0 + 1 blocks, 1 free */
    assert_non_null(strstr(ppn_last_error(), "KV blocks exhausted"));
    ppn_model_get_kv_info(m, &k1);
    assert_int_equal(k1.blocks_used, k0.blocks_used); /* all or none */
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 3, 0, NULL, out), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 3, 4, NULL, NULL), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_greedy(NULL, tok, 3, 4, NULL, out), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_greedy(q, NULL, 3, 4, NULL, out), PPN_EINVAL);
    int bad[3] = {1, mi.vocab, 3};
    assert_int_equal(ppn_decode_batch_greedy(q, bad, 3, 4, NULL, out), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "row 1"));
    const int *pid = ids;
    int pn = 2;
    ppn_batch_opts po = {.n_prime = 1, .prime_seqs = &q[2], .prime_ids = &pid, .prime_n = &pn};
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 2, 4, &po, out), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "prompt slices"));
    ppn_step_id id;
    assert_int_equal(ppn_decode_step_deferred(q[1], 4, &id), PPN_OK); /* in its held blocks */
    assert_int_equal(ppn_decode_batch_greedy(q, tok, 3, 4, NULL, out), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "in flight"));
    assert_int_equal(ppn_pending_wait(q[1], id, NULL), PPN_OK);
    assert_int_equal(ppn_seq_pos(q[0]), 0); /* nothing fed */
    assert_int_equal(ppn_seq_pos(q[1]), 21);
    assert_int_equal(ppn_seq_pos(q[2]), 0);
    ppn_model_get_kv_info(m, &k1);
    assert_int_equal(k1.blocks_used, k0.blocks_used);
    ppn_seq *two[2] = {q[0], q[1]};
    assert_int_equal(ppn_decode_batch_greedy(two, tok, 2, 5, NULL, out), PPN_OK); /* still usable */
    assert_int_equal(ppn_seq_pos(q[0]), 5);
    assert_int_equal(ppn_seq_pos(q[1]), 26);
    destroy_all(q, 3);
    ppn_model_get_kv_info(m, &k1);
    assert_int_equal(k1.blocks_used, 0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

/* Deferred steps ----------------------------------------------------------------------------------------------- */

#define DSTEPS 3

/* On one arm: DSTEPS batch steps of the B sequences with known tokens, all in flight at once (and a batch of two
 * other sequences beside them), waited newest first through different rows, against ppn_decode_batch_ex of the
 * same tokens on a twin set: logits and ids bit-identical. */
static void deferred_arm(const char *dir, const int *ids, const arm *a)
{
    ppn_model *m = arm_load(dir, a, 64);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    size_t v = (size_t)mi.vocab, vb = sizeof(float) * v * B;
    float *want = malloc(vb * DSTEPS), *got = malloc(vb * DSTEPS), *w2 = malloc(vb), *g2 = malloc(vb);
    int wid[DSTEPS][B], gid[DSTEPS][B], tok[DSTEPS][B], wid2[2], gid2[2];
    assert_true(want && got && w2 && g2);
    ppn_batch_opts o = {.micro = a->micro};
    for (int t = 0; t < DSTEPS; t++)
        for (int i = 0; i < B; i++) tok[t][i] = ids[plen[i] + t];
    ppn_seq *q[B], *x[2];
    primed(m, ids, q);
    for (int t = 0; t < DSTEPS; t++)
        assert_int_equal(ppn_decode_batch_ex(q, tok[t], B, &o, want + (size_t)t * v * B, wid[t]), PPN_OK);
    for (int j = 0; j < 2; j++) assert_int_equal(ppn_seq_create(m, &x[j]), PPN_OK);
    assert_int_equal(ppn_decode_batch_ex(x, tok[0], 2, &o, w2, wid2), PPN_OK);
    destroy_all(q, B);
    destroy_all(x, 2);

    primed(m, ids, q);
    for (int j = 0; j < 2; j++) assert_int_equal(ppn_seq_create(m, &x[j]), PPN_OK);
    ppn_step_id id[DSTEPS], id2;
    for (int t = 0; t < DSTEPS; t++)
        if (ppn_decode_batch_deferred(q, tok[t], B, &o, got + (size_t)t * v * B, gid[t], &id[t]) != PPN_OK)
            fail_msg("%s: deferred %d: %s", a->name, t, ppn_last_error());
    assert_int_equal(ppn_decode_batch_deferred(x, tok[0], 2, &o, g2, gid2, &id2), PPN_OK);
    for (int i = 0; i < B; i++) assert_int_equal(ppn_seq_pos(q[i]), plen[i] + DSTEPS); /* advanced at issue */
    assert_int_equal(ppn_decode_batch_ex(q, tok[0], B, &o, NULL, NULL), PPN_ESTATE); /* in flight */
    assert_int_equal(ppn_decode_batch_wait(x[1], id2), PPN_OK);
    for (int t = DSTEPS - 1; t >= 0; t--)
        if (ppn_decode_batch_wait(q[t % B], id[t]) != PPN_OK) fail_msg("%s: wait %d: %s", a->name, t, ppn_last_error());
    assert_int_equal(ppn_decode_batch_wait(q[0], id[0]), PPN_EINVAL); /* waited already */
    assert_memory_equal(want, got, vb * DSTEPS);
    assert_memory_equal(wid, gid, sizeof gid);
    assert_memory_equal(w2, g2, vb / B * 2);
    assert_memory_equal(wid2, gid2, sizeof gid2);
    /* nothing is in flight any more: the room is whole on every row */
    ppn_step_id r[PPN_MAX_INFLIGHT + 1];
    for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_batch_deferred(q, tok[0], B, &o, NULL, NULL, &r[t]), PPN_OK);
    assert_int_equal(ppn_decode_batch_deferred(q, tok[0], B, &o, NULL, NULL, &r[PPN_MAX_INFLIGHT]), PPN_ESTATE);
    assert_true(r[PPN_MAX_INFLIGHT] == 0);
    assert_non_null(strstr(ppn_last_error(), "in flight"));
    for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_batch_wait(q[B - 1], r[t]), PPN_OK);
    printf("# %s: %d deferred steps in flight on %d rows beside a batch of 2, waited in reverse: bit-identical\n",
           a->name, DSTEPS, B);
    destroy_all(q, B);
    destroy_all(x, 2);
    free(want);
    free(got);
    free(w2);
    free(g2);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

static void test_bdefer_arms(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen3-tiny", dir, sizeof dir, &n);
    assert_true(n > plen[B - 1] + DSTEPS);
    for (int k = 0; k < N_ARMS; k++) deferred_arm(dir, ids, &k_arms[k]);
    free(ids);
}

/* Deferred single steps and batch steps share each row's room; the ids of each kind are refused by the other's
 * wait. */
static void test_bdefer_mixed_room(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_model *m = arm_load(dir, &k_arms[1], 64);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *row = malloc(sizeof(float) * (size_t)mi.vocab);
    ppn_seq *q[2];
    for (int i = 0; i < 2; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    int tok[2] = {1, 2}, got[2];
    ppn_step_id s1, s2, b1, b2, b3, none = 0;
    const int *pid = ids;
    int pn = 2;
    ppn_seq *other;
    assert_int_equal(ppn_seq_create(m, &other), PPN_OK);
    ppn_batch_opts po = {.n_prime = 1, .prime_seqs = &other, .prime_ids = &pid, .prime_n = &pn};
    assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, &po, NULL, NULL, &none), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "prompt slices"));
    assert_int_equal(ppn_decode_batch_deferred(&other, tok, 0, NULL, NULL, NULL, &none), PPN_EINVAL);
    assert_int_equal(ppn_decode_step_deferred(q[1], 7, &s1), PPN_OK);
    assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, NULL, NULL, got, &b1), PPN_OK);
    assert_int_equal(ppn_decode_step_deferred(q[1], 8, &s2), PPN_OK);
    assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, NULL, NULL, NULL, &b2), PPN_OK); /* q[1]: 4 in flight */
    assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, NULL, NULL, NULL, &b3), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "row 1"));
    assert_int_equal(ppn_decode_step_deferred(q[1], 9, &b3), PPN_ESTATE);
    assert_int_equal(ppn_pending_wait(q[1], b1, NULL), PPN_EINVAL); /* a batch id */
    assert_int_equal(ppn_decode_batch_wait(q[1], s1), PPN_EINVAL);  /* a single step's id */
    assert_int_equal(ppn_decode_batch_wait(NULL, b1), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, NULL, NULL, NULL, NULL), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_deferred(NULL, tok, 2, NULL, NULL, NULL, &none), PPN_EINVAL);
    assert_true(none == 0);
    assert_int_equal(ppn_pending_wait(q[1], s2, row), PPN_OK); /* any order */
    assert_int_equal(ppn_decode_batch_wait(q[0], b2), PPN_OK);
    assert_int_equal(ppn_decode_batch_wait(q[1], b1), PPN_OK);
    assert_int_equal(ppn_pending_wait(q[1], s1, NULL), PPN_OK);
    assert_int_equal(ppn_seq_pos(q[0]), 2);
    assert_int_equal(ppn_seq_pos(q[1]), 4);
    /* a batch of one deferred: a decode step's, with the ids the argmax of its logits */
    int one;
    assert_int_equal(ppn_decode_batch_deferred(&other, tok, 1, NULL, row, &one, &b3), PPN_OK);
    assert_int_equal(ppn_decode_batch_wait(other, b3), PPN_OK);
    int best = 0;
    for (int i = 1; i < mi.vocab; i++) best = row[i] > row[best] ? i : best;
    assert_int_equal(one, best);
    ppn_seq_destroy(other);
    destroy_all(q, 2);
    free(row);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

/* Reset, truncate and destroy of rows with deferred steps in flight: the steps' walks finish first, the dropped
 * rows' room comes back at once, the other rows' results are the undisturbed run's, the KV blocks balance and the
 * checker stays clean (a report would fail the next call). */
static void test_bdefer_reset_destroy(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen2-tiny", dir, sizeof dir, &n);
    for (int k = 0; k < N_ARMS; k++) {
        const arm *a = &k_arms[k];
        ppn_model *m = arm_load(dir, a, 64);
        ppn_model_info mi;
        ppn_model_get_info(m, &mi);
        size_t vb = sizeof(float) * (size_t)mi.vocab * B;
        float *want = malloc(2 * vb), *got = malloc(2 * vb);
        int tok[2][B], wid[2][B], gid[2][B];
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < B; i++) tok[t][i] = ids[plen[i] + t];
        ppn_batch_opts o = {.micro = a->micro};
        ppn_seq *q[B];
        primed(m, ids, q);
        for (int t = 0; t < 2; t++) assert_int_equal(ppn_decode_batch_ex(q, tok[t], B, &o, want + t * vb / sizeof(float), wid[t]), PPN_OK);
        destroy_all(q, B);
        primed(m, ids, q);
        ppn_step_id id[2];
        for (int t = 0; t < 2; t++)
            assert_int_equal(ppn_decode_batch_deferred(q, tok[t], B, &o, got + t * vb / sizeof(float), gid[t], &id[t]), PPN_OK);
        /* row 0 (a micro-batch's first row, holding a walk's ring entry) reset, row 3 truncated, row 4 destroyed */
        assert_int_equal(ppn_seq_reset(q[0]), PPN_OK);
        assert_int_equal(ppn_seq_pos(q[0]), 0);
        assert_int_equal(ppn_seq_truncate(q[3], plen[3]), PPN_OK);
        ppn_seq_destroy(q[4]);
        assert_int_equal(ppn_decode_batch_wait(q[0], id[0]), PPN_EINVAL); /* dropped for q[0] */
        ppn_step_id more[PPN_MAX_INFLIGHT]; /* q[0]'s room is whole again */
        for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_step_deferred(q[0], 5 + t, &more[t]), PPN_OK);
        for (int t = PPN_MAX_INFLIGHT - 1; t >= 0; t--) assert_int_equal(ppn_pending_wait(q[0], more[t], NULL), PPN_OK);
        assert_int_equal(ppn_decode_batch_wait(q[2], id[1]), PPN_OK);
        assert_int_equal(ppn_decode_batch_wait(q[1], id[0]), PPN_OK);
        for (int t = 0; t < 2; t++) /* rows 1 and 2 kept their results */
            for (int i = 1; i <= 2; i++) {
                size_t off = ((size_t)t * B + (size_t)i) * (size_t)mi.vocab;
                assert_memory_equal(want + off, got + off, sizeof(float) * (size_t)mi.vocab);
                assert_int_equal(wid[t][i], gid[t][i]);
            }
        /* every live row's room is whole: PPN_MAX_INFLIGHT more each, then refused */
        ppn_seq *live[4] = {q[0], q[1], q[2], q[3]};
        int lt[4] = {1, 2, 3, 4};
        ppn_step_id r[PPN_MAX_INFLIGHT];
        for (int t = 0; t < PPN_MAX_INFLIGHT; t++) assert_int_equal(ppn_decode_batch_deferred(live, lt, 4, &o, NULL, NULL, &r[t]), PPN_OK);
        ppn_step_id over = 1;
        assert_int_equal(ppn_decode_batch_deferred(live, lt, 4, &o, NULL, NULL, &over), PPN_ESTATE);
        for (int i = 0; i < 4; i++) assert_int_equal(ppn_seq_reset(live[i]), PPN_OK); /* every row drops them all */
        assert_int_equal(ppn_decode_batch_wait(q[1], r[0]), PPN_EINVAL);
        ppn_kv_info ki;
        ppn_model_get_kv_info(m, &ki);
        assert_int_equal(ki.blocks_used, 0);
        assert_int_equal(ppn_decode_batch_ex(live, lt, 4, &o, NULL, NULL), PPN_OK); /* clean: no report pending */
        destroy_all(live, 4);
        ppn_model_get_kv_info(m, &ki);
        assert_int_equal(ki.blocks_used, 0);
        printf("# %s: reset, truncate and destroy with 2 deferred steps in flight: room back, results kept\n", a->name);
        free(want);
        free(got);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    free(ids);
}

/* NaN logits ----------------------------------------------------------------------------------------------- */

/* The final norm's weights at 3e38: logits that are not finite. The loop names the row, its step, sequence, position and the
 * stage; the model is refused after (the device fed the -1 on). A deferred step's wait names it the same way. */
static void test_bgreedy_nonfinite(void **state)
{
    (void)state;
    char *dir = tu_patched_tiny("model.norm.weight", 3e38f, 64);
    for (int deferred = 0; deferred < 2; deferred++) {
        ppn_model *m = arm_load(dir, &k_arms[4], 64);
        ppn_seq *q[2];
        for (int i = 0; i < 2; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        int tok[2] = {1, 2}, out[2 * 3];
        if (!deferred) {
            assert_int_equal(ppn_decode_batch_greedy(q, tok, 2, 3, NULL, out), PPN_ENONFINITE);
            assert_non_null(strstr(ppn_last_error(), "ppn_decode_batch_greedy: row 0, step 0: sequence"));
        } else {
            ppn_step_id id;
            assert_int_equal(ppn_decode_batch_deferred(q, tok, 2, NULL, NULL, out, &id), PPN_OK);
            assert_int_equal(ppn_decode_batch_wait(q[1], id), PPN_ENONFINITE);
            assert_non_null(strstr(ppn_last_error(), "ppn_decode_batch_wait: sequence"));
        }
        const char *e = ppn_last_error();
        assert_non_null(strstr(e, "position 0"));
        assert_non_null(strstr(e, "stage 1 of 2"));
        assert_non_null(strstr(e, "device argmax found a logit that is NaN or infinite"));
        assert_int_equal(ppn_decode_batch_ex(q, tok, 2, NULL, NULL, NULL), PPN_ENONFINITE); /* refused after */
        assert_non_null(strstr(ppn_last_error(), "earlier failure"));
        destroy_all(q, 2);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    tu_rmrf(dir);
    free(dir);
}

/* Injected faults ------------------------------------------------------------------------------------------- */

enum { FSTEPS = 4 };

typedef struct fwl { /* what the fault workload computes */
    int ids[FSTEPS * 3], did[3];
    float logits[3 * 256]; /* llama-tiny's vocabulary */
} fwl;

/* 3 sequences primed, a greedy loop of FSTEPS, then a deferred step waited; the first failure into *first (with its
 * message into msg). Returns 1 when the model refused a later call with the injected cause, 0 when none failed or
 * the failure was a refusal before issue that left the model usable (checked: a step runs). */
static int fwl_run(ppn_rt *r, const char *dir, fwl *out, ppn_status *first, char *msg, size_t cap)
{
    ppn_door d = ppn_door_default();
    d.n_stages = d.n_devices = 2;
    d.devices[0] = 0, d.devices[1] = 1;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 32;
    o.door = &d;
    ppn_model *m = NULL;
    *first = ppn_model_load(r, dir, &o, &m);
    if (*first != PPN_OK) return snprintf(msg, cap, "%s", ppn_last_error()), 0;
    ppn_seq *q[3] = {0};
    static const int prompt[4] = {5, 6, 7, 8};
    ppn_status st = PPN_OK;
    for (int i = 0; i < 3 && st == PPN_OK; i++) {
        st = ppn_seq_create(m, &q[i]);
        if (st == PPN_OK) st = ppn_prefill(q[i], prompt, 1 + i, NULL, NULL);
    }
    int tok[3] = {1, 2, 3};
    if (st == PPN_OK) st = ppn_decode_batch_greedy(q, tok, 3, FSTEPS, NULL, out->ids);
    ppn_step_id id = 0;
    if (st == PPN_OK) st = ppn_decode_batch_deferred(q, tok, 3, NULL, out->logits, out->did, &id);
    if (id) {
        ppn_status w = ppn_decode_batch_wait(q[2], id);
        if (st == PPN_OK) st = w;
    }
    int refused = 0;
    *first = st;
    if (st != PPN_OK) {
        snprintf(msg, cap, "%s", ppn_last_error());
        for (int i = 0; i < 3; i++)
            if (q[i]) (void)ppn_seq_reset(q[i]);
        ppn_status again = q[2] ? ppn_decode_batch_greedy(q, tok, 3, 1, NULL, out->did) : PPN_EINVAL;
        refused = again != PPN_OK;
        if (refused && !strstr(ppn_last_error(), "injected failure"))
            fail_msg("after '%s', the next call got %s: %s", msg, ppn_status_name(again), ppn_last_error());
    }
    destroy_all(q, 3);
    if (ppn_model_free(m) != PPN_OK) fail_msg("the model did not free: %s", ppn_last_error());
    return refused;
}

static void test_bgreedy_faults(void **state)
{
    (void)state;
    const char *dir = tu_fixture("hf/llama-tiny");
    ppn_rt *r0 = NULL;
    tu_env_set("PPN_SIM_FAIL", NULL);
    assert_int_equal(ppn_rt_create("sim", &r0), PPN_OK);
    static fwl ref, got;
    ppn_status st;
    char msg[1024];
    fwl_run(r0, dir, &ref, &st, msg, sizeof msg);
    if (st != PPN_OK) fail_msg("the clean run failed: %s", msg);
    assert_int_equal(ppn_rt_destroy(r0), PPN_OK);
    static const char *kinds[] = {"copy", "launch", "record"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        int hits = 0, refused = 0, clean = 0, K = 1, stride = 5;
        for (; clean < 8 && K < 4000; K += stride) {
            char spec[64];
            snprintf(spec, sizeof spec, "%s:%d", kinds[k], K);
            tu_env_set("PPN_SIM_FAIL", spec);
            ppn_rt *r = NULL;
            st = ppn_rt_create("sim", &r);
            tu_env_restore();
            if (st != PPN_OK) {
                assert_non_null(strstr(ppn_last_error(), "injected failure"));
                hits++, clean = 0;
                continue;
            }
            memset(&got, 0, sizeof got);
            int ref_ = fwl_run(r, dir, &got, &st, msg, sizeof msg);
            if (st == PPN_OK) {
                clean++;
                if (memcmp(&got, &ref, sizeof got)) fail_msg("%s: a run the fault left alone differs", spec);
            } else {
                hits++, clean = 0, refused += ref_;
                if (!strstr(msg, "injected failure"))
                    fail_msg("%s: the first error (%s) is not the injected one: %s", spec, ppn_status_name(st), msg);
                memset(&got, 0, sizeof got); /* a fresh model on the same runtime: the clean run's bits */
                fwl_run(r, dir, &got, &st, msg, sizeof msg);
                if (st != PPN_OK) fail_msg("%s: a fresh model failed: %s", spec, msg);
                if (memcmp(&got, &ref, sizeof got)) fail_msg("%s: the fresh model's results differ", spec);
            }
            if (ppn_rt_destroy(r) != PPN_OK) fail_msg("%s: ppn_rt_destroy: %s", spec, ppn_last_error());
        }
        printf("# PPN_SIM_FAIL=%s:1..%d every %d: %d failures injected (%d left the model refused), each named first "
               "and a fresh model recovered\n", kinds[k], K - stride, stride, hits, refused);
        assert_true(clean == 8 && hits >= 5 && refused >= 1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bgreedy_arms),         cmocka_unit_test(test_bgreedy_one_row),
        cmocka_unit_test(test_bgreedy_refusals),     cmocka_unit_test(test_bdefer_arms),
        cmocka_unit_test(test_bdefer_mixed_room),    cmocka_unit_test(test_bdefer_reset_destroy),
        cmocka_unit_test(test_bgreedy_nonfinite),    cmocka_unit_test(test_bgreedy_faults),
    };
    return cmocka_run_group_tests(tests, tu_sim_rt_setup, tu_sim_rt_teardown);
}
