/* test_spec.c - speculative decoding on the sim backend: the prompt-lookup drafter's matches; verify rounds give
 * the ids of plain greedy decode on every fixture, on one stage, through the split over 4 devices and through
 * the unsplit walk (MEMRA_SPEC_PP=0), with drafts both accepted and rejected (so rollback runs) and the verify
 * counters advancing; a verify's rows against single steps; truncate; and bad calls refused before anything
 * moves. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "tests/util/tutil.h"

static ppn_model *load(const char *path, const ppn_door *door, int ctx)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = ctx;
    o.door = door;
    return tu_model_load(tu_sim_rt(), path, &o);
}

static void test_spec_draft_lookup(void **state)
{
    (void)state;
    int d[8];
    const int h1[] = {5, 6, 7, 8, 9, 5, 6, 7};  /* suffix 5,6,7 occurred at 0: 8, 9, 5 follow */
    assert_int_equal(ppn_draft_lookup(h1, 8, 3, 3, d), 3);
    assert_int_equal(d[0], 8), assert_int_equal(d[1], 9), assert_int_equal(d[2], 5);
    assert_int_equal(ppn_draft_lookup(h1, 8, 8, 3, d), 5); /* only what history holds after the match */
    const int h2[] = {1, 2, 3, 4, 2, 9, 2};        /* no 3-gram or 2-gram match; the 1-gram 2: most recent at 4 */
    assert_int_equal(ppn_draft_lookup(h2, 7, 2, 3, d), 2);
    assert_int_equal(d[0], 9), assert_int_equal(d[1], 2);
    const int h3[] = {1, 2, 3, 4};                 /* nothing repeats */
    assert_int_equal(ppn_draft_lookup(h3, 4, 4, 3, d), 0);
    assert_int_equal(ppn_draft_lookup(h1, 1, 4, 3, d), 0);
    assert_int_equal(ppn_draft_lookup(NULL, 8, 4, 3, d), 0);
    assert_int_equal(ppn_draft_lookup(h1, 8, 0, 3, d), 0);
}

/* Plain greedy: prompt ids[0 .. n) fed token by token, then steps argmax ids. */
static void plain_greedy(ppn_model *m, const int *ids, int n, int steps, int *out)
{
    ppn_seq *q;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    for (int t = 0; t < n - 1; t++) assert_int_equal(ppn_decode_step(q, ids[t], NULL), PPN_OK);
    assert_int_equal(ppn_decode_greedy(q, ids[n - 1], steps, out), PPN_OK);
    ppn_seq_destroy(q);
}

/* Greedy through verify rounds: drafts from prompt lookup, and every third round a draft the caller makes up
 * (the right next id, then a wrong one: one accepted, one rejected). */
static void spec_greedy(ppn_model *m, const int *ids, int n, int steps, int k, const int *truth, int *out,
                        int *rejected, int *accepted)
{
    ppn_seq *q;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    assert_int_equal(ppn_prefill(q, ids, n - 1, NULL, NULL), PPN_OK);
    int *hist = malloc(sizeof(int) * (size_t)(n + steps + k + 1)), draft[16], got[17], h = n, made = 0, round = 0;
    assert_non_null(hist);
    memcpy(hist, ids, sizeof(int) * (size_t)n);
    while (made < steps) {
        int room = steps - made - 1, want = k < room ? k : room, nd = 0;
        if (want > 0 && round % 3 == 2 && made + 1 < steps) { /* right, then wrong */
            draft[0] = truth[made];
            nd = 1;
            if (want > 1) draft[1] = (truth[made + 1] + 1) % 7, nd = 2;
        } else if (want > 0) {
            nd = ppn_draft_lookup(hist, h, want, 3, draft);
        }
        int pos = ppn_seq_pos(q), ng = 0;
        if (ppn_spec_verify(q, hist[h - 1], draft, nd, got, &ng) != PPN_OK) fail_msg("verify: %s", ppn_last_error());
        assert_true(ng >= 1 && ng <= nd + 1);
        assert_int_equal(ppn_seq_pos(q), pos + ng); /* the token and the accepted drafts stand */
        *accepted += ng - 1;
        *rejected += nd - (ng - 1);
        for (int j = 0; j < ng && made < steps; j++) out[made++] = got[j], hist[h++] = got[j];
        round++;
    }
    free(hist);
    ppn_seq_destroy(q);
}

static void check_fixture(const char *name)
{
    char dir[4096];
    int n, steps = 40, prompt = 6;
    int *ids = tu_fixture_ids(name, dir, sizeof dir, &n);
    int *want = malloc(sizeof(int) * (size_t)steps), *got = malloc(sizeof(int) * (size_t)steps);
    assert_true(want && got && n >= prompt);
    ppn_model *ref = load(dir, NULL, 128);
    plain_greedy(ref, ids, prompt, steps, want);
    static const struct { int n_stages, spec_pp; } arms[] = {{1, 1}, {4, 1}, {4, 0}};
    for (size_t a = 0; a < sizeof arms / sizeof arms[0]; a++) {
        ppn_door d = ppn_door_default();
        if (arms[a].n_stages > 1) {
            d.n_stages = d.n_devices = arms[a].n_stages;
            for (int s = 0; s < d.n_stages; s++) d.devices[s] = s;
        }
        d.spec_pp = arms[a].spec_pp;
        d.allow_unsplit_batch = !arms[a].spec_pp;
        ppn_model *m = arms[a].n_stages > 1 ? load(dir, &d, 128) : ref;
        ppn_stats s0, s1;
        ppn_model_get_stats(m, &s0);
        int rej = 0, acc = 0;
        spec_greedy(m, ids, prompt, steps, 5, want, got, &rej, &acc);
        ppn_model_get_stats(m, &s1);
        printf("# %s, %d stage(s), spec_pp %d: %llu verifies, %d accepted, %d rejected\n", name, arms[a].n_stages,
               arms[a].spec_pp, (unsigned long long)(s1.spec_verifies - s0.spec_verifies), acc, rej);
        assert_memory_equal(want, got, sizeof(int) * (size_t)steps);
        assert_true(rej > 0 && acc > 0); /* rollback ran, and drafts stood */
        assert_true(s1.spec_accepted - s0.spec_accepted == (uint64_t)acc);
        uint64_t split = s1.spec_split_verifies - s0.spec_split_verifies;
        if (arms[a].n_stages > 1 && arms[a].spec_pp) assert_true(split == s1.spec_verifies - s0.spec_verifies);
        else assert_true(split == 0);
        if (m != ref) assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    assert_int_equal(ppn_model_free(ref), PPN_OK);
    free(want);
    free(got);
    free(ids);
}

static void test_spec_llama_tiny(void **s) { (void)s, check_fixture("llama-tiny"); }
static void test_spec_qwen2_tiny(void **s) { (void)s, check_fixture("qwen2-tiny"); }
static void test_spec_qwen3_tiny(void **s) { (void)s, check_fixture("qwen3-tiny"); }
static void test_spec_stories(void **s) { (void)s, check_fixture("stories260K.bin"); }

/* Truncate forgets positions: decoding again from the cut gives the first run's logits. */
static void test_spec_truncate(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("qwen3-tiny", dir, sizeof dir, &n);
    ppn_model *m = load(dir, NULL, 64);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *a = malloc(sizeof(float) * (size_t)mi.vocab), *b = malloc(sizeof(float) * (size_t)mi.vocab);
    ppn_seq *q;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    for (int t = 0; t < 5; t++) assert_int_equal(ppn_decode_step(q, ids[t], t == 4 ? a : NULL), PPN_OK);
    for (int t = 0; t < 3; t++) assert_int_equal(ppn_decode_step(q, 7 + t, NULL), PPN_OK); /* to be forgotten */
    assert_int_equal(ppn_seq_truncate(q, 9), PPN_EINVAL);
    assert_int_equal(ppn_seq_truncate(q, -1), PPN_EINVAL);
    assert_int_equal(ppn_seq_pos(q), 8);
    assert_int_equal(ppn_seq_truncate(q, 4), PPN_OK);
    assert_int_equal(ppn_decode_step(q, ids[4], b), PPN_OK);
    assert_memory_equal(a, b, sizeof(float) * (size_t)mi.vocab);
    ppn_seq_destroy(q);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(a);
    free(b);
    free(ids);
}

static void test_spec_refusals(void **state)
{
    (void)state;
    char dir[4096];
    int n;
    int *ids = tu_fixture_ids("llama-tiny", dir, sizeof dir, &n);
    ppn_model *m = load(dir, NULL, 8);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    ppn_seq *q;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    int d[PPN_SPEC_MAX_DRAFT + 2] = {0}, out[PPN_SPEC_MAX_DRAFT + 2], no;
    assert_int_equal(ppn_spec_verify(q, 1, d, PPN_SPEC_MAX_DRAFT + 1, out, &no), PPN_EINVAL);
    assert_int_equal(ppn_spec_verify(q, 1, NULL, 2, out, &no), PPN_EINVAL);
    assert_int_equal(ppn_spec_verify(q, 1, d, 2, NULL, &no), PPN_EINVAL);
    int bad[2] = {1, mi.vocab};
    assert_int_equal(ppn_spec_verify(q, 1, bad, 2, out, &no), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "draft 1"));
    assert_int_equal(ppn_spec_verify(q, mi.vocab, d, 1, out, &no), PPN_EINVAL);
    assert_int_equal(ppn_spec_verify(q, 1, d, 8, out, &no), PPN_ESTATE); /* 9 rows, ctx 8 */
    assert_non_null(strstr(ppn_last_error(), "context"));
    ppn_step_id id;
    assert_int_equal(ppn_decode_step_deferred(q, 1, &id), PPN_OK);
    assert_int_equal(ppn_spec_verify(q, 1, d, 1, out, &no), PPN_ESTATE);
    assert_int_equal(ppn_pending_wait(q, id, NULL), PPN_OK);
    assert_int_equal(ppn_seq_pos(q), 1); /* nothing but the deferred step was fed */
    assert_int_equal(ppn_spec_verify(q, 1, d, 6, out, &no), PPN_OK); /* up to the context exactly */
    assert_true(no >= 1 && ppn_seq_pos(q) == 1 + no);
    ppn_seq_destroy(q);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_draft_lookup), cmocka_unit_test(test_spec_llama_tiny),
        cmocka_unit_test(test_spec_qwen2_tiny),   cmocka_unit_test(test_spec_qwen3_tiny),
        cmocka_unit_test(test_spec_stories),      cmocka_unit_test(test_spec_truncate),
        cmocka_unit_test(test_spec_refusals),
    };
    return cmocka_run_group_tests(tests, tu_sim_rt_setup, tu_sim_rt_teardown);
}
