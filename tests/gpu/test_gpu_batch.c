/* test_gpu_batch.c - many sequences per step, speculative verify and paged KV through the runtime on a real GPU
 * (the cuda backend), against the same model's single-sequence steps:
 *   - f32 fixtures: 5 sequences at different lengths decoded together, every row against the sequence decoded
 *     alone (1e-4 relative to the row's largest logit: the GEMM and the matvec sum the same f32 products in
 *     different orders), the device argmax of each row = the host argmax of its logits;
 *   - the batched split (2 and 3 stages on device 0, micro-batches 1) bit-identical to the door-shut batch;
 *   - verify rounds (prompt lookup plus forced accept/reject drafts) = plain greedy ids on the f32 fixtures;
 *   - bf16 weights (qwen3-tiny): batch rows against the single steps within 2e-2 of the row's largest logit (the
 *     GEMM rounds activations to bf16, the matvec keeps them f32), reported;
 *   - the batch's device greedy loop (ppn_decode_batch_greedy) = a host loop of ppn_decode_batch_ex(ids) feeding the
 *     ids back, bit-identical, f32 and bf16, door shut, 2 stages on device 0, and 2 stages on 2 devices with 2
 *     micro-batches where a second GPU exists; a deferred batch step = ppn_decode_batch_ex (logits and ids).
 * Runs only where a CUDA driver and GPU exist. */
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
#include "tests/util/tutil.h"

#define B 5
static const int plen[B] = {1, 3, 7, 12, 20};
static ppn_rt *rt;

static int setup(void **state)
{
    (void)state;
    if (ppn_rt_create("cuda", &rt) != PPN_OK) {
        fprintf(stderr, "no CUDA device: %s\n", ppn_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return ppn_rt_destroy(rt) == PPN_OK ? 0 : -1;
}

static ppn_model *load(const char *dir, int dtype, const ppn_door *d)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 96;
    o.dtype = dtype;
    o.door = d;
    return tu_model_load(rt, dir, &o);
}

static int *ids_of(const char *name, char *dir, size_t cap, int *n)
{
    char refp[4200];
    snprintf(dir, cap, "%s/%s", tu_fixture("hf"), name);
    snprintf(refp, sizeof refp, "%s/reference.json", dir);
    int *ids = tu_ref_ids(refp, "all_ids", n);
    if (!ids) fail_msg("fixture missing: %s", refp);
    return ids;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* steps batched steps of B sequences primed with plen[i] ids; rows [steps][B][vocab], gid [steps][B]. */
static void batched(ppn_model *m, const int *ids, int vocab, int steps, float *rows, int *gid)
{
    ppn_seq *q[B];
    for (int i = 0; i < B; i++) {
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        assert_int_equal(ppn_prefill(q[i], ids, plen[i], NULL, NULL), PPN_OK);
    }
    for (int t = 0; t < steps; t++) {
        int tok[B];
        for (int i = 0; i < B; i++) tok[i] = ids[plen[i] + t];
        if (ppn_decode_batch_ex(q, tok, B, NULL, rows + (size_t)t * B * vocab, gid + t * B) != PPN_OK)
            fail_msg("batch: %s", ppn_last_error());
    }
    for (int i = 0; i < B; i++) ppn_seq_destroy(q[i]);
}

static double rows_vs_alone(ppn_model *m, const int *ids, int vocab, int steps, const float *rows, const int *gid,
                            double tol)
{
    double worst = 0;
    float *alone = malloc(sizeof(float) * (size_t)vocab);
    for (int i = 0; i < B; i++) {
        ppn_seq *q;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        for (int t = 0; t < plen[i]; t++) assert_int_equal(ppn_decode_step(q, ids[t], NULL), PPN_OK);
        for (int t = 0; t < steps; t++) {
            assert_int_equal(ppn_decode_step(q, ids[plen[i] + t], alone), PPN_OK);
            const float *row = rows + ((size_t)t * B + i) * vocab;
            tu_cmp c = {0};
            tu_cmp_row(&c, 0, row, alone, vocab, tol, -1);
            if (c.worst_ratio > worst) worst = c.worst_ratio;
            assert_int_equal(gid[t * B + i], argmax(row, vocab));
        }
        ppn_seq_destroy(q);
    }
    free(alone);
    return worst;
}

static void check_f32(const char *name)
{
    char dir[4096];
    int n, steps = 8;
    int *ids = ids_of(name, dir, sizeof dir, &n);
    ppn_model *m = load(dir, PPN_DTYPE_F32, NULL);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    size_t bytes = sizeof(float) * (size_t)steps * B * mi.vocab;
    float *rows = malloc(bytes), *rows2 = malloc(bytes);
    int gid[64 * B], gid2[64 * B];
    batched(m, ids, mi.vocab, steps, rows, gid);
    double worst = rows_vs_alone(m, ids, mi.vocab, steps, rows, gid, 1e-4);
    printf("# %s f32: %d x %d batched rows vs alone: worst %.3g of 1e-4\n", name, B, steps, worst);
    assert_true(worst <= 1.0);
    for (int ns = 2; ns <= 3; ns++) { /* the split on one device, bit-identical */
        ppn_door d = ppn_door_default();
        d.n_stages = ns;
        assert_int_equal(ppn_model_publish_door(m, &d), PPN_OK);
        ppn_stats a, b;
        ppn_model_get_stats(m, &a);
        batched(m, ids, mi.vocab, steps, rows2, gid2);
        ppn_model_get_stats(m, &b);
        assert_memory_equal(rows, rows2, bytes);
        assert_true(b.batch_split_steps - a.batch_split_steps == (uint64_t)steps);
    }
    /* verify rounds = plain greedy, through the split */
    int want[40], got[40], hist[96], draft[8], out[9], h = 6, made = 0, round = 0, acc = 0, rej = 0;
    ppn_door shut = ppn_door_default();
    assert_int_equal(ppn_model_publish_door(m, &shut), PPN_OK);
    ppn_seq *q;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    for (int t = 0; t < 5; t++) assert_int_equal(ppn_decode_step(q, ids[t], NULL), PPN_OK);
    assert_int_equal(ppn_decode_greedy(q, ids[5], 40, want), PPN_OK);
    ppn_seq_destroy(q);
    ppn_door d2 = ppn_door_default();
    d2.n_stages = 2;
    assert_int_equal(ppn_model_publish_door(m, &d2), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    assert_int_equal(ppn_prefill(q, ids, 5, NULL, NULL), PPN_OK);
    memcpy(hist, ids, sizeof(int) * 6);
    while (made < 40) {
        int room = 40 - made - 1, k = room < 5 ? room : 5, nd = 0, ng = 0;
        if (k >= 2 && round % 3 == 2) draft[0] = want[made], draft[1] = (want[made + 1] + 1) % mi.vocab, nd = 2;
        else if (k > 0) nd = ppn_draft_lookup(hist, h, k, 3, draft);
        assert_int_equal(ppn_spec_verify(q, hist[h - 1], draft, nd, out, &ng), PPN_OK);
        acc += ng - 1, rej += nd - (ng - 1);
        for (int j = 0; j < ng && made < 40; j++) got[made++] = out[j], hist[h++] = out[j];
        round++;
    }
    ppn_seq_destroy(q);
    printf("# %s f32: spec = plain greedy over 40 ids (%d drafts accepted, %d rejected)\n", name, acc, rej);
    assert_memory_equal(want, got, sizeof want);
    assert_true(acc > 0 && rej > 0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(rows);
    free(rows2);
    free(ids);
}

static void test_gpu_batch_llama_tiny(void **s) { (void)s, check_f32("llama-tiny"); }
static void test_gpu_batch_qwen2_tiny(void **s) { (void)s, check_f32("qwen2-tiny"); }
static void test_gpu_batch_qwen3_tiny(void **s) { (void)s, check_f32("qwen3-tiny"); }

static void test_gpu_batch_bf16(void **state)
{
    (void)state;
    char dir[4096];
    int n, steps = 8;
    int *ids = ids_of("qwen3-tiny", dir, sizeof dir, &n);
    ppn_model *m = load(dir, PPN_DTYPE_BF16, NULL);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *rows = malloc(sizeof(float) * (size_t)steps * B * mi.vocab);
    int gid[64 * B];
    batched(m, ids, mi.vocab, steps, rows, gid);
    double worst = rows_vs_alone(m, ids, mi.vocab, steps, rows, gid, 2e-2);
    printf("# qwen3-tiny bf16: %d x %d batched rows vs alone: worst %.3g of 2e-2\n", B, steps, worst);
    assert_true(worst <= 1.0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(rows);
    free(ids);
}

/* The greedy loop against the host loop of batch steps on m's published map (micro: ppn_batch_opts.micro), and one
 * deferred step against ppn_decode_batch_ex after it. */
static void greedy_vs_steps(ppn_model *m, const int *ids, int vocab, int micro, const char *what)
{
    enum { STEPS = 12 };
    ppn_batch_opts o = {.micro = micro};
    ppn_seq *q[B];
    int want[STEPS * B], got[STEPS * B], tok[B], wid[B], gid[B];
    size_t vb = sizeof(float) * (size_t)vocab * B;
    float *wl = malloc(vb), *gl = malloc(vb);
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < B; i++) {
            assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
            assert_int_equal(ppn_prefill(q[i], ids, plen[i], NULL, NULL), PPN_OK);
            tok[i] = ids[plen[i]];
        }
        ppn_stats a, b;
        ppn_model_get_stats(m, &a);
        if (run == 1 && ppn_decode_batch_greedy(q, tok, B, STEPS, &o, got) != PPN_OK)
            fail_msg("%s: greedy: %s", what, ppn_last_error());
        for (int t = 0; run == 0 && t < STEPS; t++) {
            assert_int_equal(ppn_decode_batch_ex(q, tok, B, &o, NULL, want + t * B), PPN_OK);
            memcpy(tok, want + t * B, sizeof tok);
        }
        ppn_model_get_stats(m, &b);
        if (run == 1) assert_true(b.batch_greedy_steps - a.batch_greedy_steps == STEPS);
        memcpy(tok, (run ? got : want) + (STEPS - 1) * B, sizeof tok);
        if (run == 0) {
            assert_int_equal(ppn_decode_batch_ex(q, tok, B, &o, wl, wid), PPN_OK);
        } else {
            ppn_step_id id;
            assert_int_equal(ppn_decode_batch_deferred(q, tok, B, &o, gl, gid, &id), PPN_OK);
            assert_int_equal(ppn_decode_batch_wait(q[B - 1], id), PPN_OK);
        }
        for (int i = 0; i < B; i++) ppn_seq_destroy(q[i]);
    }
    printf("# %s: %d rows x %d greedy steps fed on the device = the step loop; a deferred step = the batch step\n",
           what, B, STEPS);
    assert_memory_equal(want, got, sizeof want);
    assert_memory_equal(wl, gl, vb);
    assert_memory_equal(wid, gid, sizeof gid);
    free(wl);
    free(gl);
}

static void check_greedy(const char *name, int dtype)
{
    char dir[4096], what[160];
    int n;
    int *ids = ids_of(name, dir, sizeof dir, &n);
    ppn_model *m = load(dir, dtype, NULL);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    snprintf(what, sizeof what, "%s %s, door shut", name, ppn_dtype_name(mi.dtype));
    greedy_vs_steps(m, ids, mi.vocab, 0, what);
    ppn_door d = ppn_door_default();
    d.n_stages = 2;
    assert_int_equal(ppn_model_publish_door(m, &d), PPN_OK);
    snprintf(what, sizeof what, "%s %s, 2 stages on device 0", name, ppn_dtype_name(mi.dtype));
    greedy_vs_steps(m, ids, mi.vocab, 0, what);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    if (ppn_rt_device_count(rt) >= 2) {
        d.n_devices = 2;
        d.devices[0] = 0, d.devices[1] = 1;
        m = load(dir, dtype, &d);
        snprintf(what, sizeof what, "%s %s, 2 stages on 2 devices, 2 micro-batches", name, ppn_dtype_name(mi.dtype));
        greedy_vs_steps(m, ids, mi.vocab, 2, what);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    free(ids);
}

static void test_gpu_batch_greedy(void **state)
{
    (void)state;
    check_greedy("llama-tiny", PPN_DTYPE_F32);
    check_greedy("qwen2-tiny", PPN_DTYPE_F32);
    check_greedy("qwen3-tiny", PPN_DTYPE_BF16);
}

int main(void)
{
    const char *only = getenv("PPN_GPU_TEST_FILTER"); /* a cmocka pattern of test names (tools/device/tune.sh) */
    if (only && *only) cmocka_set_test_filter(only);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_batch_llama_tiny), cmocka_unit_test(test_gpu_batch_qwen2_tiny),
        cmocka_unit_test(test_gpu_batch_qwen3_tiny), cmocka_unit_test(test_gpu_batch_bf16),
        cmocka_unit_test(test_gpu_batch_greedy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
