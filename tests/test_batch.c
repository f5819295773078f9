/* test_batch.c - many sequences per step (ppn_decode_batch_ex) on the sim backend: the batched argmax kernel;
 * every row of a batch (sequences at different lengths) against the same sequence decoded alone, on the HF
 * fixtures and stories260K; the split (micro-batches pipelined over 4 devices, or one), the unsplit walk and the
 * door-shut stage give the same bits with the batch liveness counters advancing; and bad calls refused before
 * anything moves. The gate (`ppn gate batch`) runs in test_pipeline.
 *
 * Tolerance: a batch computes every projection and the head with the GEMM kernels, a single step with the
 * matvec kernels: different kernels, the same f32 math in another order, so rows agree to rounding (1e-5
 * relative to the row's largest logit; the prefill test holds the two heads to the same bound). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "kernels/ktable.h"
#include "tests/util/tkern.h"
#include "tests/util/tutil.h"

#define TOL_ROUNDING 1e-5

static ppn_model *load(const char *path, const ppn_door *door, int ctx)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = ctx;
    o.door = door;
    return tu_model_load(tu_sim_rt(), path, &o);
}

static int argmax_host(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

/* The batched argmax: ties to the lowest index, -1 for a row holding a NaN or an infinity (a single one among
 * numbers too: non-finite logits are an error, never a choice), rows independent. */
static void test_batch_argmax_rows_kernel(void **state)
{
    (void)state;
    enum { ROWS = 7, N = 1000 };
    float *x = malloc(sizeof(float) * ROWS * N);
    int32_t out[ROWS];
    assert_non_null(x);
    for (int i = 0; i < ROWS * N; i++) x[i] = (float)((i * 7919) % 1013) / 1013.0f - 0.5f;
    x[0 * N + 17] = 3.0f, x[0 * N + 900] = 3.0f;                  /* a tie: 17 */
    for (int i = 0; i < N; i++) x[1 * N + i] = NAN;               /* every value NaN: -1 */
    x[2 * N + 999] = 9.0f;                                        /* the last one */
    x[3 * N + 500] = NAN;                                         /* one NaN among numbers: -1 */
    x[4 * N + 999] = INFINITY;                                    /* +Inf, the largest: -1 */
    x[5 * N + 3] = -INFINITY;                                     /* -Inf, the smallest: -1 */
    ppn_kp_argmax_rows p = {.out = D(out), .x = D(x), .n = N, .rows = ROWS};
    tu_kernel_run(PPN_K_ARGMAX_ROWS, &p);
    assert_int_equal(out[0], 17);
    assert_int_equal(out[1], -1);
    assert_int_equal(out[2], 999);
    for (int r = 3; r < 6; r++) assert_int_equal(out[r], -1);
    assert_int_equal(out[6], argmax_host(x + 6 * N, N));
    assert_true(out[6] >= 0);
    free(x);
}

#define B 5
static const int prompt_len[B] = {1, 3, 7, 12, 20};

/* B sequences primed with prompts of different lengths, then steps batched steps (row i fed ids[len_i + t]):
 * every row's logits into out [steps][B][vocab] and the device argmax ids into gid [steps][B]. */
static void run_batched(ppn_model *m, const int *ids, int vocab, int steps, const ppn_batch_opts *o, float *out,
                        int *gid)
{
    ppn_seq *q[B];
    for (int i = 0; i < B; i++) {
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        if (ppn_prefill(q[i], ids, prompt_len[i], NULL, NULL) != PPN_OK) fail_msg("prefill: %s", ppn_last_error());
    }
    for (int t = 0; t < steps; t++) {
        int tok[B];
        for (int i = 0; i < B; i++) tok[i] = ids[prompt_len[i] + t];
        float *rows = out + (size_t)t * B * (size_t)vocab;
        if (ppn_decode_batch_ex(q, tok, B, o, rows, gid + t * B) != PPN_OK) fail_msg("batch: %s", ppn_last_error());
        for (int i = 0; i < B; i++) assert_int_equal(ppn_seq_pos(q[i]), prompt_len[i] + t + 1);
    }
    for (int i = 0; i < B; i++) ppn_seq_destroy(q[i]);
}

/* Each row of a batch against its sequence decoded alone (prompt fed token by token, then the same steps). */
static void check_rows_alone(const char *name, int steps)
{
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids(name, dir, sizeof dir, &n);
    assert_true(n >= prompt_len[B - 1] + steps);
    ppn_model *m = load(dir, NULL, 64);
    ppn_model_info info;
    ppn_model_get_info(m, &info);
    int vocab = info.vocab;
    float *got = malloc(sizeof(float) * (size_t)steps * B * (size_t)vocab), *alone = malloc(sizeof(float) * (size_t)vocab);
    int *gid = malloc(sizeof(int) * (size_t)steps * B);
    assert_true(got && alone && gid);
    ppn_stats a, b;
    ppn_model_get_stats(m, &a);
    run_batched(m, ids, vocab, steps, NULL, got, gid);
    ppn_model_get_stats(m, &b);
    assert_true(b.batch_steps - a.batch_steps == (uint64_t)steps);
    assert_true(b.batch_walks[0] - a.batch_walks[0] == (uint64_t)steps);
    double worst = 0;
    for (int i = 0; i < B; i++) {
        ppn_seq *q;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        for (int t = 0; t < prompt_len[i]; t++) assert_int_equal(ppn_decode_step(q, ids[t], NULL), PPN_OK);
        for (int t = 0; t < steps; t++) {
            assert_int_equal(ppn_decode_step(q, ids[prompt_len[i] + t], alone), PPN_OK);
            const float *row = got + ((size_t)t * B + (size_t)i) * (size_t)vocab;
            tu_cmp c = {0};
            tu_cmp_row(&c, 0, row, alone, vocab, TOL_ROUNDING, -1);
            if (c.worst_ratio > worst) worst = c.worst_ratio;
            assert_int_equal(gid[t * B + i], argmax_host(row, vocab)); /* the device argmax of those logits */
        }
        ppn_seq_destroy(q);
    }
    printf("# %s: %d sequences x %d batched steps, worst row at %.3g of %g (against each decoded alone)\n", name, B,
           steps, worst, TOL_ROUNDING);
    assert_true(worst <= 1.0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(got);
    free(alone);
    free(gid);
    free(ids);
}

static void test_batch_llama_tiny(void **s) { (void)s, check_rows_alone("llama-tiny", 6); }
static void test_batch_qwen2_tiny(void **s) { (void)s, check_rows_alone("qwen2-tiny", 6); }
static void test_batch_qwen3_tiny(void **s) { (void)s, check_rows_alone("qwen3-tiny", 6); }
static void test_batch_stories(void **s) { (void)s, check_rows_alone("stories260K.bin", 6); }

/* An arm's door: n stages on devs, the batched split or (batch_pp 0) the unsplit walk, allowed for comparison. */
static ppn_door arm_door(int n_stages, const int *devs, int batch_pp)
{
    ppn_door d = ppn_door_default();
    d.n_stages = n_stages;
    d.n_devices = n_stages;
    for (int s = 0; s < n_stages; s++) d.devices[s] = devs[s];
    d.batch_pp = batch_pp;
    d.allow_unsplit_batch = !batch_pp;
    return d;
}

/* Over four devices: the split with one micro-batch per device (pipelined), with one, and the unsplit walk give
 * the door-shut model's bits, with the counters of each arm advancing and the others' not. Then 3 stages on 2
 * devices (micro-batches: 2) and 2 stages on one device (1). */
static void test_batch_split_unsplit_micro(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen2-tiny", dir, sizeof dir, &n);
    const int steps = 5;
    ppn_model *shut = load(dir, NULL, 64);
    ppn_model_info info;
    ppn_model_get_info(shut, &info);
    size_t vocab = (size_t)info.vocab, bytes = sizeof(float) * (size_t)steps * B * vocab;
    float *want = malloc(bytes), *got = malloc(bytes);
    int *wid = malloc(sizeof(int) * steps * B), *gid = malloc(sizeof(int) * steps * B);
    assert_true(want && got && wid && gid);
    run_batched(shut, ids, info.vocab, steps, NULL, want, wid);
    assert_int_equal(ppn_model_free(shut), PPN_OK);

    static const struct { int n_stages, devs[4], micro, batch_pp, expect_mb; } arms[] = {
        {4, {0, 1, 2, 3}, 0, 1, 4}, /* one micro-batch per device, pipelined */
        {4, {0, 1, 2, 3}, 1, 1, 1}, /* serial */
        {4, {0, 1, 2, 3}, 0, 0, 1}, /* the unsplit walk (allowed for the comparison) */
        {3, {0, 1, 1}, 0, 1, 2},    /* repeated devices: one micro-batch per distinct device */
        {2, {0, 0}, 0, 1, 1},       /* one device: one micro-batch */
    };
    for (size_t k = 0; k < sizeof arms / sizeof arms[0]; k++) {
        ppn_door d = arm_door(arms[k].n_stages, arms[k].devs, arms[k].batch_pp);
        ppn_model *m = load(dir, &d, 64);
        ppn_batch_opts o = {.micro = arms[k].micro};
        ppn_stats a, b;
        ppn_model_get_stats(m, &a);
        run_batched(m, ids, info.vocab, steps, &o, got, gid);
        ppn_model_get_stats(m, &b);
        printf("# arm %zu: %d stages, micro %d, batch_pp %d: split walks %llu, overlaps %llu\n", k, d.n_stages,
               arms[k].micro, d.batch_pp, (unsigned long long)(b.batch_split_steps - a.batch_split_steps),
               (unsigned long long)(b.batch_pipe_overlaps - a.batch_pipe_overlaps));
        assert_memory_equal(want, got, bytes);
        assert_memory_equal(wid, gid, sizeof(int) * steps * B);
        uint64_t walks = (uint64_t)steps * (uint64_t)arms[k].expect_mb;
        assert_true(b.batch_steps - a.batch_steps == (uint64_t)steps);
        if (arms[k].batch_pp) {
            assert_true(b.batch_split_steps - a.batch_split_steps == walks);
            for (int s = 0; s < d.n_stages; s++) assert_true(b.batch_walks[s] - a.batch_walks[s] == walks);
        } else {
            assert_true(b.batch_split_steps == a.batch_split_steps); /* nothing walked the split */
            assert_true(b.batch_walks[1] == a.batch_walks[1]);
        }
        /* liveness: whether one stage's walker enters while another's runs depends on the threads' timing (as
         * test_batch_greedy's): up to 8 more runs on a loaded machine, each the same bits */
        int more = 0;
        for (; arms[k].expect_mb == 4 && more < 8 && b.batch_pipe_overlaps == a.batch_pipe_overlaps; more++) {
            run_batched(m, ids, info.vocab, steps, &o, got, gid);
            assert_memory_equal(want, got, bytes);
            assert_memory_equal(wid, gid, sizeof(int) * steps * B);
            ppn_model_get_stats(m, &b);
        }
        if (more) printf("# arm %zu: %d more runs for an overlap\n", k, more);
        if (arms[k].expect_mb == 4) assert_true(b.batch_pipe_overlaps > a.batch_pipe_overlaps);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    free(want);
    free(got);
    free(wid);
    free(gid);
    free(ids);
}

/* Bad calls are refused before anything moves; the model stays usable. */
static void test_batch_refusals(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_model *m = load(dir, NULL, 8);
    ppn_model_info info;
    ppn_model_get_info(m, &info);
    ppn_seq *q[3];
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    int tok[3] = {1, 2, 3};
    ppn_batch_opts o = {.micro = PPN_MAX_INFLIGHT + 1};
    assert_int_equal(ppn_decode_batch_ex(q, tok, 3, &o, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "micro"));
    assert_int_equal(ppn_decode_batch_ex(q, tok, 0, NULL, NULL, NULL), PPN_EINVAL);
    assert_int_equal(ppn_decode_batch_ex(NULL, tok, 3, NULL, NULL, NULL), PPN_EINVAL);
    ppn_seq *twice[2] = {q[0], q[0]};
    assert_int_equal(ppn_decode_batch_ex(twice, tok, 2, NULL, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "twice"));
    int bad[3] = {1, info.vocab, 3};
    assert_int_equal(ppn_decode_batch_ex(q, bad, 3, NULL, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "row 1"));
    ppn_step_id id;
    assert_int_equal(ppn_decode_step_deferred(q[2], 4, &id), PPN_OK);
    assert_int_equal(ppn_decode_batch_ex(q, tok, 3, NULL, NULL, NULL), PPN_ESTATE); /* in flight on q[2] */
    assert_int_equal(ppn_pending_wait(q[2], id, NULL), PPN_OK);
    for (int t = 0; t < 7; t++) assert_int_equal(ppn_decode_step(q[1], 5, NULL), PPN_OK); /* q[1] full at 8 */
    assert_int_equal(ppn_decode_batch_ex(q, tok, 3, NULL, NULL, NULL), PPN_OK);
    assert_int_equal(ppn_decode_batch_ex(q, tok, 3, NULL, NULL, NULL), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "full"));
    assert_int_equal(ppn_seq_pos(q[0]), 1); /* the refusals fed nothing */
    assert_int_equal(ppn_seq_pos(q[1]), 8);
    assert_int_equal(ppn_seq_pos(q[2]), 2);
    ppn_seq *two[2] = {q[0], q[2]};
    assert_int_equal(ppn_decode_batch_ex(two, tok, 2, NULL, NULL, NULL), PPN_OK); /* still usable */
    for (int i = 0; i < 3; i++) ppn_seq_destroy(q[i]);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

/* Mixed steps (ppn_batch_opts.n_prime): a prompt fed in two slices beside three decoding sequences, then all four
 * decoding. Against the same calls made apart (ppn_prefill for the slice, ppn_decode_batch_ex for the rows) on
 * the same arm: the decode rows' logits and ids, the slices' logits and the step after (which reads the KV the
 * mixed walks wrote) are bit-identical on the sim (its GEMM rows do not depend on the walk's row count). Arms: one
 * stage, the split over 4 devices, 2 stages on one device, and the unsplit walk; the counters show the path. */
#define MIX_D 3
static const int mix_len[MIX_D] = {3, 7, 12};
static const int mix_slice[2] = {5, 4};

/* mixed 0: the calls apart. Fills logits [3 steps][MIX_D + 1][vocab] (row MIX_D of steps 0, 1: the slice's),
 * ids [3][MIX_D + 1]. */
static void run_mixed(ppn_model *m, const int *ids, int vocab, int mixed, float *logits, int *gid)
{
    ppn_seq *q[MIX_D + 1];
    for (int i = 0; i <= MIX_D; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    for (int i = 0; i < MIX_D; i++)
        if (ppn_prefill(q[i], ids, mix_len[i], NULL, NULL) != PPN_OK) fail_msg("prefill: %s", ppn_last_error());
    size_t row = (size_t)vocab;
    int fed = 0;
    for (int t = 0; t < 2; t++) {
        int tok[MIX_D];
        for (int i = 0; i < MIX_D; i++) tok[i] = ids[mix_len[i] + t];
        float *out = logits + (size_t)t * (MIX_D + 1) * row, *pout = out + MIX_D * row;
        const int *pid = ids + 20 + fed; /* the prompt: ids from 20 on */
        if (mixed) {
            ppn_seq *ps = q[MIX_D];
            ppn_batch_opts o = {.n_prime = 1, .prime_seqs = &ps, .prime_ids = &pid, .prime_n = &mix_slice[t],
                                .prime_logits = &pout};
            if (ppn_decode_batch_ex(q, tok, MIX_D, &o, out, gid + t * (MIX_D + 1)) != PPN_OK)
                fail_msg("mixed step %d: %s", t, ppn_last_error());
        } else {
            if (ppn_prefill(q[MIX_D], pid, mix_slice[t], NULL, pout) != PPN_OK) fail_msg("prefill: %s", ppn_last_error());
            if (ppn_decode_batch_ex(q, tok, MIX_D, NULL, out, gid + t * (MIX_D + 1)) != PPN_OK)
                fail_msg("batch: %s", ppn_last_error());
        }
        gid[t * (MIX_D + 1) + MIX_D] = -1;
        fed += mix_slice[t];
    }
    assert_int_equal(ppn_seq_pos(q[MIX_D]), fed);
    for (int i = 0; i < MIX_D; i++) assert_int_equal(ppn_seq_pos(q[i]), mix_len[i] + 2);
    int tok[MIX_D + 1];
    for (int i = 0; i < MIX_D; i++) tok[i] = ids[mix_len[i] + 2];
    tok[MIX_D] = ids[20 + fed];
    ppn_batch_opts one = {.micro = 1}; /* one walk on every arm: the counters below count it once */
    if (ppn_decode_batch_ex(q, tok, MIX_D + 1, &one, logits + 2 * (MIX_D + 1) * row, gid + 2 * (MIX_D + 1)) != PPN_OK)
        fail_msg("batch after: %s", ppn_last_error());
    for (int i = 0; i <= MIX_D; i++) ppn_seq_destroy(q[i]);
}

static void test_batch_mixed(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen2-tiny", dir, sizeof dir, &n);
    assert_true(n >= 20 + mix_slice[0] + mix_slice[1] + 1);
    static const struct { int n_stages, devs[4], batch_pp; } arms[] = {
        {1, {0}, 1}, {4, {0, 1, 2, 3}, 1}, {2, {0, 0}, 1}, {4, {0, 1, 2, 3}, 0},
    };
    for (size_t k = 0; k < sizeof arms / sizeof arms[0]; k++) {
        ppn_door d = arm_door(arms[k].n_stages, arms[k].devs, arms[k].batch_pp);
        ppn_model *m = load(dir, arms[k].n_stages > 1 ? &d : NULL, 64);
        ppn_model_info info;
        ppn_model_get_info(m, &info);
        size_t bytes = sizeof(float) * 3 * (MIX_D + 1) * (size_t)info.vocab;
        float *want = calloc(1, bytes), *got = calloc(1, bytes);
        int wid[3 * (MIX_D + 1)], gid[3 * (MIX_D + 1)];
        assert_true(want && got);
        run_mixed(m, ids, info.vocab, 0, want, wid);
        ppn_stats a, b;
        ppn_model_get_stats(m, &a);
        run_mixed(m, ids, info.vocab, 1, got, gid);
        ppn_model_get_stats(m, &b);
        printf("# mixed arm %zu (%d stages, batch_pp %d): mixed steps %llu, split walks %llu, split chunks %llu\n", k,
               arms[k].n_stages, arms[k].batch_pp, (unsigned long long)(b.mixed_steps - a.mixed_steps),
               (unsigned long long)(b.batch_split_steps - a.batch_split_steps),
               (unsigned long long)(b.prime_split_chunks - a.prime_split_chunks));
        assert_memory_equal(want, got, bytes);
        assert_memory_equal(wid, gid, sizeof wid);
        for (int t = 0; t < 3; t++) /* the ids are the logits' argmax */
            for (int i = 0; i < MIX_D + (t == 2); i++)
                assert_int_equal(gid[t * (MIX_D + 1) + i],
                                 argmax_host(got + ((size_t)t * (MIX_D + 1) + (size_t)i) * (size_t)info.vocab, info.vocab));
        assert_true(b.mixed_steps - a.mixed_steps == 2);
        assert_true(b.batch_steps - a.batch_steps == 1); /* the step after: a plain batch */
        if (arms[k].n_stages > 1 && arms[k].batch_pp) {
            assert_true(b.batch_split_steps - a.batch_split_steps == 3);
            /* the decode rows' prompts (one chunk each), then the two mixed walks */
            assert_true(b.prime_split_chunks - a.prime_split_chunks == MIX_D + 2);
            for (int s = 0; s < arms[k].n_stages; s++) assert_true(b.batch_walks[s] - a.batch_walks[s] == 3);
        } else {
            assert_true(b.batch_split_steps == a.batch_split_steps);
        }
        free(want);
        free(got);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    free(ids);
}

/* A mixed step's bad prompt slices are refused before anything moves, by name; the model stays usable. */
static void test_batch_mixed_refusals(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_model *m = load(dir, NULL, 16);
    ppn_model_info info;
    ppn_model_get_info(m, &info);
    ppn_seq *q[3];
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    int tok[2] = {1, 2}, pn = 4, p17 = 17, bad_ids[4] = {1, 2, info.vocab, 3};
    const int *pid = ids, *pbad = bad_ids;
    ppn_batch_opts o = {.n_prime = 1, .prime_seqs = &q[0], .prime_ids = &pid, .prime_n = &pn};
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, NULL), PPN_EINVAL); /* q[0] both */
    assert_non_null(strstr(ppn_last_error(), "both decode row 0 and prompt slice 0"));
    o.prime_seqs = &q[2];
    o.micro = 2;
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "micro 2"));
    o.micro = 0;
    o.prime_ids = &pbad;
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "prompt slice 0, id"));
    o.prime_ids = &pid;
    o.prime_n = &p17; /* past the context of 16 */
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, NULL), PPN_ESTATE);
    assert_non_null(strstr(ppn_last_error(), "prompt slice 0"));
    o.prime_seqs = NULL;
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, NULL), PPN_EINVAL);
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_pos(q[i]), 0); /* nothing fed */
    o.prime_seqs = &q[2];
    o.prime_n = &pn;
    int got[2];
    assert_int_equal(ppn_decode_batch_ex(q, tok, 2, &o, NULL, got), PPN_OK); /* still usable */
    assert_int_equal(ppn_seq_pos(q[0]), 1);
    assert_int_equal(ppn_seq_pos(q[2]), 4);
    for (int i = 0; i < 3; i++) ppn_seq_destroy(q[i]);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

/* Paged KV: sequences share the pools; running out refuses the step by name before anything moves, and blocks
 * come back on reset, truncate and destroy. */
static void test_batch_kv_exhaustion(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 40;
    o.kv_tokens = 40; /* rounded up to 3 blocks of 16 */
    ppn_model *m = tu_model_load(tu_sim_rt(), dir, &o);
    ppn_kv_info ki;
    ppn_model_get_kv_info(m, &ki);
    assert_int_equal(ki.block_positions, PPN_KV_BLOCK_POSITIONS);
    assert_int_equal(ki.blocks_total, 3);
    assert_int_equal(ki.blocks_used, 0);
    assert_int_equal(ki.positions, 48);
    ppn_seq *q[3];
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    assert_int_equal(ppn_prefill(q[0], ids, 17, NULL, NULL), PPN_OK); /* 2 blocks */
    assert_int_equal(ppn_seq_kv_blocks(q[0]), 2);
    int tok[3] = {1, 2, 3};
    assert_int_equal(ppn_decode_batch_ex(q, tok, 3, NULL, NULL, NULL), PPN_ENOMEM); /* 2 more blocks, 1 free */
    assert_non_null(strstr(ppn_last_error(), "KV blocks exhausted"));
    assert_non_null(strstr(ppn_last_error(), "sequence"));
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_pos(q[i]), i == 0 ? 17 : 0); /* nothing moved */
    ppn_model_get_kv_info(m, &ki);
    assert_int_equal(ki.blocks_used, 2); /* all or none: the refusal took nothing */
    assert_int_equal(ppn_decode_step(q[1], 5, NULL), PPN_OK); /* the last block */
    assert_int_equal(ppn_decode_step(q[2], 5, NULL), PPN_ENOMEM);
    assert_int_equal(ppn_seq_truncate(q[0], 16), PPN_OK); /* back to one block */
    assert_int_equal(ppn_seq_kv_blocks(q[0]), 1);
    assert_int_equal(ppn_decode_step(q[2], 5, NULL), PPN_OK);
    assert_int_equal(ppn_seq_reset(q[1]), PPN_OK);
    assert_int_equal(ppn_seq_kv_blocks(q[1]), 0);
    ppn_seq_destroy(q[2]);
    ppn_model_get_kv_info(m, &ki);
    assert_int_equal(ki.blocks_used, 1);
    /* the freed blocks serve the others, and the cache they held is rewritten: the first run's logits again */
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *a = malloc(sizeof(float) * (size_t)mi.vocab), *b = malloc(sizeof(float) * (size_t)mi.vocab);
    assert_int_equal(ppn_prefill(q[1], ids, 30, NULL, a), PPN_OK);
    assert_int_equal(ppn_seq_reset(q[1]), PPN_OK);
    assert_int_equal(ppn_seq_reset(q[0]), PPN_OK);
    assert_int_equal(ppn_decode_step(q[0], 9, NULL), PPN_OK); /* q[0] takes a block q[1] held */
    assert_int_equal(ppn_prefill(q[1], ids, 30, NULL, b), PPN_OK);
    assert_memory_equal(a, b, sizeof(float) * (size_t)mi.vocab);
    ppn_seq_destroy(q[0]);
    ppn_seq_destroy(q[1]);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(a);
    free(b);
    free(ids);
}

/* Paged KV soak: sequences created, grown (steps, prefills, batches, verifies), truncated, reset and destroyed at
 * random for 2,000 operations over 3 stages on 3 devices with the checker on; every so often a sequence's next
 * logits are checked against its whole history replayed token by token on a fresh sequence of a door-shut model
 * (so blocks reused after others freed them hold the right K/V; within rounding, as the history was fed through
 * GEMMs and matvecs alike); the block count always equals what the sequences hold, and nothing is left when they
 * are gone. */
#define SOAK_SEQS 6
static void test_batch_kv_soak(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen3-tiny", dir, sizeof dir, &n);
    ppn_door d = ppn_door_default();
    d.n_stages = d.n_devices = 3;
    for (int s = 0; s < 3; s++) d.devices[s] = s;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 64;
    o.kv_tokens = 64; /* 4 blocks for 6 sequences of up to 4: exhaustion happens */
    o.door = &d;
    ppn_model *m = tu_model_load(tu_sim_rt(), dir, &o);
    ppn_model *ref = load(dir, NULL, 64);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    ppn_stats s0;
    ppn_model_get_stats(m, &s0);
    ppn_seq *q[SOAK_SEQS] = {0};
    int hist[SOAK_SEQS][64], len[SOAK_SEQS] = {0}, refused = 0, checks = 0;
    float *a = malloc(sizeof(float) * (size_t)mi.vocab), *b = malloc(sizeof(float) * (size_t)mi.vocab);
    uint64_t r = 12345;
    for (int it = 0; it < 2000; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((r >> 33) % SOAK_SEQS), op = (int)((r >> 40) % 8), tok = (int)((r >> 20) % (uint64_t)mi.vocab);
        ppn_status st = PPN_OK;
        if (!q[i]) {
            assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
            len[i] = 0;
            continue;
        }
        int room = 64 - len[i];
        if (op == 0 && room > 0) { /* one step, its logits checked against the replayed history now and then */
            float *out = (r >> 50) % 3 == 0 ? a : NULL;
            st = ppn_decode_step(q[i], tok, out);
            if (st == PPN_OK) hist[i][len[i]++] = tok;
            if (st == PPN_OK && out) {
                ppn_seq *c;
                assert_int_equal(ppn_seq_create(ref, &c), PPN_OK);
                for (int t = 0; t < len[i]; t++) assert_int_equal(ppn_decode_step(c, hist[i][t], t + 1 == len[i] ? b : NULL), PPN_OK);
                ppn_seq_destroy(c);
                tu_cmp cm = {0}; /* the history was fed by GEMMs and matvecs alike: rounding apart */
                tu_cmp_row(&cm, 0, a, b, mi.vocab, TOL_ROUNDING, -1);
                assert_true(cm.worst_ratio <= 1.0);
                checks++;
            }
        } else if (op == 1 && room > 8) { /* a prefill */
            int k = 1 + (int)((r >> 12) % 8);
            st = ppn_prefill(q[i], ids, k, NULL, NULL);
            for (int t = 0; st == PPN_OK && t < k; t++) hist[i][len[i]++] = ids[t];
        } else if (op == 2) { /* a batch of every live sequence with room */
            ppn_seq *bq[SOAK_SEQS];
            int bt[SOAK_SEQS], who[SOAK_SEQS], nb = 0;
            for (int j = 0; j < SOAK_SEQS; j++)
                if (q[j] && len[j] < 64) bq[nb] = q[j], bt[nb] = (tok + j) % mi.vocab, who[nb++] = j;
            st = nb ? ppn_decode_batch_ex(bq, bt, nb, NULL, NULL, NULL) : PPN_OK;
            for (int j = 0; st == PPN_OK && j < nb; j++) hist[who[j]][len[who[j]]++] = bt[j];
        } else if (op == 3 && room > 4) { /* a verify of 3 made-up drafts */
            int dr[3] = {tok, (tok + 1) % mi.vocab, (tok + 2) % mi.vocab}, out[4], no = 0;
            st = ppn_spec_verify(q[i], tok, dr, 3, out, &no);
            if (st == PPN_OK) {
                hist[i][len[i]++] = tok;
                for (int j = 0; j + 1 < no; j++) hist[i][len[i]++] = dr[j];
            }
        } else if (op == 4 && len[i] > 0) {
            int keep = (int)((r >> 8) % (uint64_t)len[i]);
            assert_int_equal(ppn_seq_truncate(q[i], keep), PPN_OK);
            len[i] = keep;
        } else if (op == 5) {
            assert_int_equal(ppn_seq_reset(q[i]), PPN_OK);
            len[i] = 0;
        } else if (op == 6) {
            ppn_seq_destroy(q[i]);
            q[i] = NULL;
        }
        if (st == PPN_ENOMEM) refused++;
        else assert_int_equal(st, PPN_OK);
        if (q[i]) assert_int_equal(ppn_seq_pos(q[i]), len[i]);
        ppn_kv_info ki;
        ppn_model_get_kv_info(m, &ki);
        int held = 0;
        for (int j = 0; j < SOAK_SEQS; j++) held += q[j] ? ppn_seq_kv_blocks(q[j]) : 0;
        assert_int_equal(ki.blocks_used, held);
    }
    printf("# soak: 2,000 operations, %d refused for want of blocks, %d logits checks against a replay\n", refused,
           checks);
    assert_true(refused > 0 && checks > 0);
    for (int j = 0; j < SOAK_SEQS; j++) ppn_seq_destroy(q[j]);
    ppn_kv_info ki;
    ppn_model_get_kv_info(m, &ki);
    assert_int_equal(ki.blocks_used, 0);
    ppn_stats s1;
    ppn_model_get_stats(m, &s1);
    assert_true(s1.pool_in_use <= s0.pool_in_use + (size_t)(64u << 20)); /* rows scratch grew once, nothing per step */
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_model_free(ref), PPN_OK);
    free(a);
    free(b);
    free(ids);
}

/* Per-stage busy time (ppn_model_time_stages, ppn_stats.stage_busy_*): off at load; on, every walk a stage stream
 * runs is counted once on that stage with a positive device time (the split over 4 devices: each stage's walks are
 * its walker's; the door shut: stage 0's; one stream, MEMRA_PP_STREAMS=0: every stage's decode walks and the
 * unsplit batch walk on stage 0), exact once ppn_model_time_stages returns; off again, nothing more is counted;
 * and the logits with timing on are the bits of the same steps with it off. */
static void test_batch_stage_busy(void **state)
{
    (void)state;
    enum { STEPS = 5 }; /* one stream: 5 x 4 + 1 walks on stage 0, more than the ring of 16 pairs */
    static const struct { int n_stages, devs[4], streams; } arms[] = {
        {4, {0, 1, 2, 3}, 1}, {1, {0}, 1}, {4, {0, 0, 0, 0}, 0}};
    assert_int_equal(ppn_model_time_stages(NULL, 1), PPN_EINVAL);
    for (size_t k = 0; k < sizeof arms / sizeof arms[0]; k++) {
        ppn_door d = arm_door(arms[k].n_stages, arms[k].devs, 1);
        d.streams = arms[k].streams;
        ppn_model *m = load(tu_fixture("hf/llama-tiny"), arms[k].n_stages > 1 ? &d : NULL, 64);
        ppn_model_info mi;
        ppn_model_get_info(m, &mi);
        size_t v = (size_t)mi.vocab;
        float *on = malloc(sizeof(float) * v * (STEPS + 2)), *off = malloc(sizeof(float) * v * (STEPS + 2));
        assert_non_null(on);
        assert_non_null(off);
        ppn_seq *q[4];
        for (int i = 0; i < 4; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        ppn_stats a, b, c;
        assert_int_equal(ppn_decode_step(q[0], 3, on), PPN_OK); /* before: not counted */
        assert_int_equal(ppn_decode_step(q[2], 3, off), PPN_OK);
        ppn_model_get_stats(m, &a);
        for (int s = 0; s < PPN_MAX_STAGES; s++) assert_true(a.stage_busy_walks[s] == 0 && a.stage_busy_ns[s] == 0);
        /* the same steps twice: timing on (q[0], q[1]), then off (q[2], q[3]) */
        for (int pass = 0; pass < 2; pass++) {
            float *x = pass ? off : on;
            assert_int_equal(ppn_model_time_stages(m, !pass), PPN_OK);
            if (pass) ppn_model_get_stats(m, &b);
            else ppn_model_get_stats(m, &a);
            for (int t = 0; t < STEPS; t++)
                assert_int_equal(ppn_decode_step(q[2 * pass], 5 + 7 * t, x + (size_t)t * v), PPN_OK);
            ppn_seq *two[2] = {q[2 * pass], q[2 * pass + 1]};
            int toks[2] = {11, 13};
            assert_int_equal(ppn_decode_batch(two, toks, 2, x + (size_t)STEPS * v), PPN_OK);
        }
        assert_int_equal(ppn_model_time_stages(m, 0), PPN_OK);
        ppn_model_get_stats(m, &c);
        assert_memory_equal(on, off, sizeof(float) * v * (STEPS + 2));
        int ns = arms[k].n_stages;
        for (int s = 0; s < PPN_MAX_STAGES; s++) {
            uint64_t walks = b.stage_busy_walks[s] - a.stage_busy_walks[s], runs = b.walker_runs[s] - a.walker_runs[s];
            uint64_t want = !arms[k].streams ? (s == 0 ? (uint64_t)STEPS * (uint64_t)ns + 1 : 0) : s < ns ? runs : 0;
            if (s < 4)
                printf("# arm %zu stage %d: %llu walks (walker runs %llu), busy %.1f us\n", k, s,
                       (unsigned long long)walks, (unsigned long long)runs,
                       (double)(b.stage_busy_ns[s] - a.stage_busy_ns[s]) / 1e3);
            assert_true(walks == want);
            if (s < ns && arms[k].streams) assert_true(runs >= STEPS + 1); /* the steps' walks, the batch's (2 on 4 devices) */
            assert_true(want == 0 || b.stage_busy_ns[s] > a.stage_busy_ns[s]);
            assert_true(c.stage_busy_walks[s] == b.stage_busy_walks[s] && c.stage_busy_ns[s] == b.stage_busy_ns[s]);
        }
        for (int i = 0; i < 4; i++) ppn_seq_destroy(q[i]);
        free(on);
        free(off);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_argmax_rows_kernel), cmocka_unit_test(test_batch_llama_tiny),
        cmocka_unit_test(test_batch_qwen2_tiny),         cmocka_unit_test(test_batch_qwen3_tiny),
        cmocka_unit_test(test_batch_stories),            cmocka_unit_test(test_batch_split_unsplit_micro),
        cmocka_unit_test(test_batch_refusals),           cmocka_unit_test(test_batch_kv_exhaustion),
        cmocka_unit_test(test_batch_kv_soak),            cmocka_unit_test(test_batch_mixed),
        cmocka_unit_test(test_batch_mixed_refusals),     cmocka_unit_test(test_batch_stage_busy),
    };
    return cmocka_run_group_tests(tests, tu_sim_rt_setup, tu_sim_rt_teardown);
}
