/* test_fixtures.c - ppn against references nobody here wrote: the HF fixtures (transformers 5.17 logits) and
 * llama2.c's stories260K (reference ids from run.c), on the sim backend. */
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

/* The fixtures README's fp32 tolerance: max|logit - ref| <= 1e-3 * max(1, max|ref row|). */
#define TOL_F32 1e-3
/* bf16 weights: each weight is rounded to 8 significant bits (relative error <= 2^-9 = 0.2%). The rounding
 * errors of a dot product are independent and add like a random walk, and 4-6 layers compound them, so a logit
 * may move by a few times 2^-9 of the row's scale: 2e-2 of max(1, max|ref|) bounds that with room (measured
 * worst rows sit at about half of it: docs/VALIDATION.md), while any real bug (a wrong rope, norm, bias or
 * head) moves logits by the order of the row itself and still fails. Greedy ids are checked where the
 * reference margin exceeds twice that bound, the largest gap a result within tolerance could close. */
#define TOL_BF16 2e-2
#define MARGIN 1e-3

static ppn_rt *rt;

static int group_setup(void **state)
{
    return ppn_rt_create("sim", &rt) == PPN_OK ? 0 : (fprintf(stderr, "%s\n", ppn_last_error()), -1);
}

static int group_teardown(void **state)
{
    ppn_rt_destroy(rt);
    return 0;
}

/* Teacher-force ids[0..n_rows) through ppn and compare every row with ref [n_rows, vocab]. */
static tu_cmp run_rows(const char *model, int dtype, const int *ids, int n_rows, const float *ref, int vocab,
                       double tol, double margin)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.dtype = dtype;
    o.ctx = 512;
    ppn_model *m = tu_model_load(rt, model, &o);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    assert_int_equal(mi.vocab, vocab);
    ppn_seq *s = NULL;
    assert_int_equal(ppn_seq_create(m, &s), PPN_OK);
    float *x = malloc(sizeof(float) * (size_t)vocab);
    tu_cmp c = {0};
    for (int t = 0; t < n_rows; t++) {
        ppn_status st = ppn_decode_step(s, ids[t], x);
        if (st != PPN_OK) fail_msg("step %d: %s", t, ppn_last_error());
        tu_cmp_row(&c, t, x, ref + (size_t)t * (size_t)vocab, vocab, tol, margin);
    }
    free(x);
    ppn_seq_destroy(s);
    ppn_model_free(m);
    return c;
}

static void check_hf(const char *name, int dtype, double tol)
{
    char dir[4096], refp[4200], logp[4200];
    snprintf(dir, sizeof dir, "%s", tu_fixture("hf"));
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", name);
    snprintf(refp, sizeof refp, "%s/reference.json", dir);
    snprintf(logp, sizeof logp, "%s/logits.f32", dir);
    int n = 0, np = 0, *ids = tu_ref_ids(refp, "all_ids", &n), *shape = tu_ref_ids(refp, "logits_shape", &np);
    if (!ids || !shape) fail_msg("fixture missing: %s", refp);
    size_t nb = 0;
    float *ref = tu_read_file(logp, &nb);
    if (!ref) fail_msg("fixture missing: %s", logp);
    assert_int_equal(nb, sizeof(float) * (size_t)shape[0] * (size_t)shape[1]);
    assert_int_equal(shape[0], n);
    tu_cmp c = run_rows(dir, dtype, ids, n, ref, shape[1], tol, dtype == PPN_DTYPE_BF16 ? -1 : MARGIN);
    printf("# %s %s: worst row %d at %.3f of tolerance, greedy %d/%d rows match\n", name,
           dtype == PPN_DTYPE_BF16 ? "bf16" : "f32", c.worst_row, c.worst_ratio,
           c.greedy_checked - c.greedy_mismatch, c.greedy_checked);
    assert_true(c.worst_ratio <= 1.0);
    assert_true(c.greedy_checked > n / 3); /* the margin rule left enough rows to mean something */
    assert_int_equal(c.greedy_mismatch, 0);
    free(ids);
    free(shape);
    free(ref);
}

static void test_fixtures_llama_tiny_f32(void **s) { check_hf("llama-tiny", PPN_DTYPE_F32, TOL_F32); }
static void test_fixtures_qwen2_tiny_f32(void **s) { check_hf("qwen2-tiny", PPN_DTYPE_F32, TOL_F32); }
static void test_fixtures_qwen3_tiny_f32(void **s) { check_hf("qwen3-tiny", PPN_DTYPE_F32, TOL_F32); }
static void test_fixtures_llama_tiny_bf16(void **s) { check_hf("llama-tiny", PPN_DTYPE_BF16, TOL_BF16); }
static void test_fixtures_qwen2_tiny_bf16(void **s) { check_hf("qwen2-tiny", PPN_DTYPE_BF16, TOL_BF16); }
static void test_fixtures_qwen3_tiny_bf16(void **s) { check_hf("qwen3-tiny", PPN_DTYPE_BF16, TOL_BF16); }

/* stories260K: run.c's greedy ids from BOS, and its logits after feeding ids[0..t]. */
static void test_fixtures_stories260k(void **state)
{
    const char *bin = tu_fixture("llama2c/stories260K.bin");
    char path[4096];
    snprintf(path, sizeof path, "%s", bin);
    int n = 0, *ids = tu_read_ids_text(tu_fixture("llama2c/stories260K.bos.ids"), &n);
    if (!ids) fail_msg("fixture missing: %s", tu_fixture("llama2c/stories260K.bos.ids"));
    assert_int_equal(n, 256);
    size_t nb = 0;
    float *ref = tu_read_file(tu_fixture("llama2c/stories260K.bos.logits.f32"), &nb);
    if (!ref) fail_msg("fixture missing: %s", tu_fixture("llama2c/stories260K.bos.logits.f32"));
    assert_int_equal(nb, sizeof(float) * 255 * 512);
    tu_cmp c = run_rows(path, PPN_DTYPE_F32, ids, 255, ref, 512, TOL_F32, MARGIN);
    printf("# stories260K: worst row %d at %.3f of tolerance, greedy %d/%d rows match\n", c.worst_row,
           c.worst_ratio, c.greedy_checked - c.greedy_mismatch, c.greedy_checked);
    assert_true(c.worst_ratio <= 1.0);
    assert_int_equal(c.greedy_mismatch, 0);
    assert_true(c.greedy_checked > 200);
    free(ids);
    free(ref);
}

/* Greedy generation through the public API reproduces run.c's 255 ids exactly from BOS. */
static void test_fixtures_stories260k_greedy_ids(void **state)
{
    int n = 0, *ids = tu_read_ids_text(tu_fixture("llama2c/stories260K.bos.ids"), &n);
    if (!ids) fail_msg("fixture missing");
    ppn_model *m = tu_model_load(rt, tu_fixture("llama2c/stories260K.bin"), NULL);
    ppn_seq *s = NULL;
    assert_int_equal(ppn_seq_create(m, &s), PPN_OK);
    float x[512];
    ppn_sampler sp;
    ppn_sampler_init(&sp, 0, 0, 1, 0);
    int tok = ids[0], same = 0;
    for (int t = 0; t < n - 1; t++) {
        assert_int_equal(ppn_decode_step(s, tok, x), PPN_OK);
        assert_int_equal(ppn_sample(&sp, x, 512, &tok), PPN_OK);
        if (tok != ids[t + 1]) break;
        same++;
    }
    printf("# stories260K greedy: %d/%d ids equal\n", same, n - 1);
    assert_int_equal(same, n - 1);
    ppn_seq_destroy(s);
    ppn_model_free(m);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_llama_tiny_f32),
        cmocka_unit_test(test_fixtures_qwen2_tiny_f32),
        cmocka_unit_test(test_fixtures_qwen3_tiny_f32),
        cmocka_unit_test(test_fixtures_llama_tiny_bf16),
        cmocka_unit_test(test_fixtures_qwen2_tiny_bf16),
        cmocka_unit_test(test_fixtures_qwen3_tiny_bf16),
        cmocka_unit_test(test_fixtures_stories260k),
        cmocka_unit_test(test_fixtures_stories260k_greedy_ids),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
