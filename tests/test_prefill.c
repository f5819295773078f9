/* test_prefill.c - prompts primed many rows at a time (ppn_prefill, ppn_prefill_batch) on the sim backend: every
 * row's logits against transformers (the HF fixtures) and llama2.c (stories260K) at chunk sizes 1, 7, 64 and the
 * whole prompt; the same bits at every chunk size on the CPU references; a primed prompt continued by decode
 * gives the token-by-token run's greedy ids; split, pipelined and batched primes bit-identical to one stage;
 * and every bad call refused before anything moves. The gates (`ppn gate prime`) run in test_pipeline. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "ppn.h"
#include "core/model/ckpt.h"
#include "core/rt.h"
#include "tests/util/tutil.h"

#define TOL_F32 1e-3 /* the fixtures README's f32 rule */
#define MARGIN 1e-3

static ppn_model *load(const char *path, const ppn_door *door)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 512;
    o.door = door;
    return tu_model_load(tu_sim_rt(), path, &o);
}

/* Every row's logits of ids[0..n) primed chunk rows at a time on a fresh sequence of m. */
static float *prime_rows(ppn_model *m, const int *ids, int n, int chunk, int vocab)
{
    float *rows = malloc(sizeof(float) * (size_t)vocab * (size_t)n);
    assert_non_null(rows);
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    ppn_prefill_opts o = {.chunk = chunk, .all_logits = 1};
    if (ppn_prefill(q, ids, n, &o, rows) != PPN_OK) fail_msg("prefill, chunk %d: %s", chunk, ppn_last_error());
    assert_int_equal(ppn_seq_pos(q), n);
    ppn_seq_destroy(q);
    return rows;
}

/* ids and reference rows of an HF fixture (reference.json, logits.f32). */
static int *hf_fixture(const char *name, char *dir, size_t cap, float **ref, int *n, int *vocab)
{
    char refp[4200], logp[4200];
    snprintf(dir, cap, "%s/%s", tu_fixture("hf"), name);
    snprintf(refp, sizeof refp, "%s/reference.json", dir);
    snprintf(logp, sizeof logp, "%s/logits.f32", dir);
    int np = 0, *ids = tu_ref_ids(refp, "all_ids", n), *shape = tu_ref_ids(refp, "logits_shape", &np);
    if (!ids || !shape) fail_msg("fixture missing: %s", refp);
    size_t nb = 0;
    *ref = tu_read_file(logp, &nb);
    if (!*ref) fail_msg("fixture missing: %s", logp);
    assert_int_equal(shape[0], *n);
    assert_int_equal(nb, sizeof(float) * (size_t)shape[0] * (size_t)shape[1]);
    *vocab = shape[1];
    free(shape);
    return ids;
}

/* The fixture primed at chunk sizes 1, 7, 64 and whole: within the f32 tolerance of transformers with greedy
 * agreement where the reference margin allows, and the same bits at every chunk size. */
static void check_hf(const char *name)
{
    char dir[4096];
    float *ref;
    int n, vocab;
    int *ids = hf_fixture(name, dir, sizeof dir, &ref, &n, &vocab);
    ppn_model *m = load(dir, NULL);
    static const int chunks[] = {1, 7, 64, 0};
    float *first = NULL;
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        int chunk = chunks[k] ? chunks[k] : n;
        float *rows = prime_rows(m, ids, n, chunk, vocab);
        tu_cmp c = {0};
        for (int t = 0; t < n; t++)
            tu_cmp_row(&c, t, rows + (size_t)t * (size_t)vocab, ref + (size_t)t * (size_t)vocab, vocab, TOL_F32, MARGIN);
        printf("# %s chunk %d: worst row %d at %.4f of tolerance, greedy %d/%d rows match\n", name, chunk,
               c.worst_row, c.worst_ratio, c.greedy_checked - c.greedy_mismatch, c.greedy_checked);
        assert_true(c.worst_ratio <= 1.0);
        assert_int_equal(c.greedy_mismatch, 0);
        if (!first) first = rows;
        else {
            assert_memory_equal(first, rows, sizeof(float) * (size_t)vocab * (size_t)n);
            free(rows);
        }
    }
    free(first);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
    free(ref);
}

static void test_prefill_llama_tiny(void **s) { (void)s, check_hf("llama-tiny"); }
static void test_prefill_qwen2_tiny(void **s) { (void)s, check_hf("qwen2-tiny"); }
static void test_prefill_qwen3_tiny(void **s) { (void)s, check_hf("qwen3-tiny"); }

/* stories260K (interleaved rotary, hidden 172): primed against llama2.c's logits. */
static void test_prefill_stories(void **state)
{
    (void)state;
    char bin[4096], idp[4096], logp[4096];
    snprintf(bin, sizeof bin, "%s", tu_fixture("llama2c/stories260K.bin"));
    snprintf(idp, sizeof idp, "%s", tu_fixture("llama2c/stories260K.bos.ids"));
    snprintf(logp, sizeof logp, "%s", tu_fixture("llama2c/stories260K.bos.logits.f32"));
    int n = 0, *ids = tu_read_ids_text(idp, &n);
    size_t nb = 0;
    float *ref = tu_read_file(logp, &nb);
    if (!ids || !ref) fail_msg("fixture missing: %s or %s", idp, logp);
    int rows = (int)(nb / (sizeof(float) * 512));
    ppn_model *m = load(bin, NULL);
    float *got = prime_rows(m, ids, rows, 64, 512);
    tu_cmp c = {0};
    for (int t = 0; t < rows; t++) tu_cmp_row(&c, t, got + (size_t)t * 512, ref + (size_t)t * 512, 512, TOL_F32, MARGIN);
    printf("# stories260K chunk 64: worst row %d at %.4f of tolerance over %d rows\n", c.worst_row, c.worst_ratio, rows);
    assert_true(c.worst_ratio <= 1.0);
    assert_int_equal(c.greedy_mismatch, 0);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(got);
    free(ids);
    free(ref);
}

/* Greedy continuation after a primed prompt: the same ids as after the token-by-token feed (the fixture's margin
 * rule holds on every row here, so no near-tie can flip one). */
static void test_prefill_then_decode(void **state)
{
    (void)state;
    char dir[4096];
    float *ref;
    int n, vocab;
    int *ids = hf_fixture("llama-tiny", dir, sizeof dir, &ref, &n, &vocab);
    ppn_model *m = load(dir, NULL);
    int prompt = 9, gen = 16, a[16], b[16];
    ppn_seq *p = NULL, *t = NULL;
    assert_int_equal(ppn_seq_create(m, &p), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &t), PPN_OK);
    ppn_prefill_opts o = {.chunk = 4};
    assert_int_equal(ppn_prefill(p, ids, prompt - 1, &o, NULL), PPN_OK); /* no logits asked */
    for (int i = 0; i < prompt - 1; i++) assert_int_equal(ppn_decode_step(t, ids[i], NULL), PPN_OK);
    assert_int_equal(ppn_decode_greedy(p, ids[prompt - 1], gen, a), PPN_OK);
    assert_int_equal(ppn_decode_greedy(t, ids[prompt - 1], gen, b), PPN_OK);
    assert_memory_equal(a, b, sizeof a);
    ppn_seq_destroy(p);
    ppn_seq_destroy(t);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
    free(ref);
}

/* dir's config.json with max_position_embeddings set to n. */
static void set_max_pos(const char *dir, int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t e;
    json_t *c = json_load_file(path, 0, &e);
    assert_non_null(c);
    assert_int_equal(json_object_set_new(c, "max_position_embeddings", json_integer(n)), 0);
    assert_int_equal(json_dump_file(c, path, JSON_INDENT(2)), 0);
    json_decref(c);
}

/* wide-tiny (dim 64, q|k|v 4096 rows, ffn 2048) with a context of 8,192 positions (128 MB of f32 KV) on a sim device
 * that holds its weights, the 64 MB every load keeps free, its rows scratch at the default chunk
 * (ppn_rows_scratch_bytes: 135 MB with every row's logits) and one and a half contexts: the default pools (four
 * contexts, capped to the room) stop short of the scratch, so 16 prompts of 64 ids primed together (one chunk of
 * 1,024 rows: 83 MB of scratch) and a batched step after them run. Before (2026-12-06, the 8B's 16 prompts on an 80
 * GB H100) the pools took all but the 64 MB and the prefill ran out of device memory (here: 20,528 positions, 64 MB
 * free, the check below). */
static void test_prefill_kv_leaves_rows_scratch(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    assert_int_equal(ppn_mkmodel("wide-tiny", PPN_DTYPE_F32, dir, 4), PPN_OK);
    set_max_pos(dir, 8192);
    ppn_load_opts o = ppn_load_opts_default();
    o.kv_tokens = 16;
    ppn_model *probe = tu_model_load(tu_sim_rt(), dir, &o); /* the bytes of everything but the pools */
    ppn_kv_info ki;
    ppn_model_get_kv_info(probe, &ki);
    size_t free_b = 0, total_b = 0, per_pos = ki.bytes / (size_t)ki.positions;
    assert_int_equal(probe->rt->g->ops->mem_get_info(probe->rt->g, probe->primary, &free_b, &total_b), PPN_OK);
    size_t rest = total_b - free_b - ki.bytes, rows_b = ppn_rows_scratch_bytes(&probe->cfg, PPN_PREFILL_CHUNK, 1);
    assert_int_equal(probe->ctx, 8192);
    assert_int_equal(ppn_model_free(probe), PPN_OK);
    assert_true(rows_b > ((size_t)64 << 20));
    char mem[64];
    snprintf(mem, sizeof mem, "%zu", rest + ((size_t)64 << 20) + rows_b + 3 * 4096 * per_pos);
    tu_env_set("PPN_SIM_MEM", mem);
    ppn_rt *rt = NULL;
    ppn_status st = ppn_rt_create("sim", &rt);
    tu_env_restore();
    assert_int_equal(st, PPN_OK);
    ppn_model *m = tu_model_load(rt, dir, NULL);
    ppn_model_get_kv_info(m, &ki);
    assert_int_equal(m->rt->g->ops->mem_get_info(m->rt->g, m->primary, &free_b, &total_b), PPN_OK);
    if (ki.positions < 8192 || ki.positions >= 4 * 8192 || free_b < rows_b)
        fail_msg("%d positions (ctx %d), %zu B free for a %zu B rows scratch", ki.positions, m->ctx, free_b, rows_b);
    enum { NP = 16, LEN = 64 };
    ppn_seq *q[NP];
    int ids[NP][LEN], n[NP], tok[NP];
    const int *p[NP];
    for (int i = 0; i < NP; i++) {
        for (int t = 0; t < LEN; t++) ids[i][t] = 1 + (i * 131 + t * 17) % 4000;
        p[i] = ids[i], n[i] = LEN, tok[i] = 7 + i;
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    }
    if (ppn_prefill_batch(q, p, n, NP, NULL, NULL) != PPN_OK) fail_msg("prefill: %s", ppn_last_error());
    if (ppn_decode_batch_ex(q, tok, NP, NULL, NULL, NULL) != PPN_OK) fail_msg("batch step: %s", ppn_last_error());
    for (int i = 0; i < NP; i++) assert_int_equal(ppn_seq_destroy(q[i]), PPN_OK);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    tu_rmrf(dir);
    free(dir);
}

/* ppn_model_rows_same_bits on qwen2-tiny (q|k|v 128 rows, o 64, gate|up 320, down 64 over 160 columns, head 256,
 * all over 64 columns but down): with bf16 weights every GEMM splits K the same way up to 32 rows (gemm_tc_k), its
 * own way from 33 to 256 (gemm_tc_kw), then not (the middle tile); f32 weights have one order at every size. */
static void test_prefill_rows_same_bits(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_fixture("hf/qwen2-tiny"));
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 512;
    o.dtype = PPN_DTYPE_BF16;
    ppn_model *h = tu_model_load(tu_sim_rt(), dir, &o), *f = load(dir, NULL);
    static const int pairs[][3] = {{1, 32, 1}, {20, 33, 0}, {33, 40, 1}, {33, 256, 1}, {256, 257, 0}, {1, 512, 0},
                                   {300, 512, 1}, {7, 7, 1}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        if (ppn_model_rows_same_bits(h, pairs[i][0], pairs[i][1]) != pairs[i][2] ||
            ppn_model_rows_same_bits(h, pairs[i][1], pairs[i][0]) != pairs[i][2])
            fail_msg("bf16, %d and %d rows: want %d", pairs[i][0], pairs[i][1], pairs[i][2]);
        assert_int_equal(ppn_model_rows_same_bits(f, pairs[i][0], pairs[i][1]), 1);
    }
    assert_int_equal(ppn_model_rows_same_bits(NULL, 1, 1), 0);
    assert_int_equal(ppn_model_rows_same_bits(f, 0, 1), 0);
    assert_int_equal(ppn_model_rows_same_bits(h, 4, -1), 0);
    assert_int_equal(ppn_model_free(h), PPN_OK);
    assert_int_equal(ppn_model_free(f), PPN_OK);
}

/* PPN_GEMM_W=1 (gemm_tc_w wherever it fits: the large tiles' sums at every m) on wide-tiny, whose matrices all fit it
 * (bf16, columns whole 64-element blocks): a row has one order at every chunk size; at PPN_GEMM_W=0, with the fusion
 * off (no producer writes bf16 x, so no gemm_tc_w), and at 3 (prompt chunks: gemm_tc_w only where the op's own tile
 * has the same sums), the op's ranges again (20 and 33 rows apart). */
static void test_prefill_rows_same_bits_w(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    assert_int_equal(ppn_mkmodel("wide-tiny", PPN_DTYPE_BF16, dir, 3), PPN_OK);
    static const char *const level[] = {"1", "0", "1", "3"};
    for (int arm = 0; arm < 4; arm++) {
        tu_env_set("PPN_GEMM_W", level[arm]);
        ppn_rt *rt = NULL;
        ppn_status st = ppn_rt_create("sim", &rt);
        tu_env_restore();
        assert_int_equal(st, PPN_OK);
        ppn_door d = ppn_door_default();
        d.fuse = arm != 2;
        ppn_load_opts o = ppn_load_opts_default();
        o.ctx = 512;
        o.dtype = PPN_DTYPE_BF16;
        o.door = &d;
        ppn_model *m = tu_model_load(rt, dir, &o);
        const int one = arm == 0;
        static const int pairs[][3] = {{1, 32, 1}, {20, 33, 0}, {33, 40, 1}, {1, 512, 0}, {7, 7, 1}};
        for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
            int want = one || pairs[i][2];
            if (ppn_model_rows_same_bits(m, pairs[i][0], pairs[i][1]) != want)
                fail_msg("PPN_GEMM_W=%s fuse %d, %d and %d rows: want %d", level[arm], d.fuse, pairs[i][0],
                         pairs[i][1], want);
        }
        assert_int_equal(ppn_model_free(m), PPN_OK);
        assert_int_equal(ppn_rt_destroy(rt), PPN_OK);
    }
    tu_rmrf(dir);
    free(dir);
}

/* The split over 4 devices, serial and pipelined, the unsplit walk, and three prompts batched: the door-shut
 * prime's bits, with the liveness counters advancing. */
static void test_prefill_split_and_batch(void **state)
{
    (void)state;
    char dir[4096];
    float *ref;
    int n, vocab;
    int *ids = hf_fixture("qwen2-tiny", dir, sizeof dir, &ref, &n, &vocab);
    ppn_model *shut = load(dir, NULL);
    float *want = prime_rows(shut, ids, n, 8, vocab);
    ppn_door d = ppn_door_default();
    d.n_stages = 4;
    d.n_devices = 4;
    for (int s = 0; s < 4; s++) d.devices[s] = s;
    ppn_model *m = load(dir, &d);
    for (int arm = 0; arm < 3; arm++) {
        d.prime_pp = arm != 2;
        d.prime_pipe = arm == 1;
        assert_int_equal(ppn_model_publish_door(m, &d), PPN_OK);
        ppn_stats a, b;
        ppn_model_get_stats(m, &a);
        float *got = prime_rows(m, ids, n, 8, vocab);
        ppn_model_get_stats(m, &b);
        assert_memory_equal(want, got, sizeof(float) * (size_t)vocab * (size_t)n);
        uint64_t chunks = (uint64_t)(n + 7) / 8;
        assert_true(b.prime_split_chunks - a.prime_split_chunks == (arm == 2 ? 0 : chunks));
        /* liveness: whether one stage's walker enters while another's runs depends on the threads' timing (an
         * ASan run on a loaded 2-core machine saw no overlap in one prime): up to 8 more primes */
        for (int t = 0; arm == 1 && t < 8 && b.prime_pipe_overlaps == a.prime_pipe_overlaps; t++) {
            free(prime_rows(m, ids, n, 8, vocab));
            ppn_model_get_stats(m, &b);
        }
        if (arm == 1) assert_true(b.prime_pipe_overlaps > a.prime_pipe_overlaps);
        free(got);
    }
    /* three prompts together vs one by one, on the split */
    d.prime_pp = d.prime_pipe = 1;
    assert_int_equal(ppn_model_publish_door(m, &d), PPN_OK);
    ppn_seq *q[3];
    const int *p[3] = {ids, ids + 10, ids + 30};
    int len[3] = {10, 20, n - 30};
    float *together = malloc(sizeof(float) * (size_t)vocab * 3), *alone = malloc(sizeof(float) * (size_t)vocab * 3);
    for (int i = 0; i < 3; i++) assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
    ppn_stats a, b;
    ppn_model_get_stats(m, &a);
    ppn_prefill_opts o = {.chunk = 16};
    assert_int_equal(ppn_prefill_batch(q, p, len, 3, &o, together), PPN_OK);
    ppn_model_get_stats(m, &b);
    assert_true(b.prime_batches == a.prime_batches + 1);
    assert_true(b.prime_batch_splits > a.prime_batch_splits);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ppn_seq_pos(q[i]), len[i]);
        ppn_seq_destroy(q[i]);
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        assert_int_equal(ppn_prefill(q[i], p[i], len[i], &o, alone + (size_t)i * (size_t)vocab), PPN_OK);
        ppn_seq_destroy(q[i]);
    }
    assert_memory_equal(together, alone, sizeof(float) * (size_t)vocab * 3);
    /* a prompt's last-row logits (the decode head's kernels on that row) agree with its all-rows run's last row
     * (the GEMM head) to rounding: different kernels, so not bit for bit */
    float *third = prime_rows(m, p[2], len[2], 16, vocab);
    tu_cmp c = {0};
    tu_cmp_row(&c, 0, alone + 2 * (size_t)vocab, third + (size_t)(len[2] - 1) * (size_t)vocab, vocab, 1e-5, -1);
    printf("# last row by the decode head vs the GEMM head: %.3g of 1e-5\n", c.worst_ratio);
    assert_true(c.worst_ratio <= 1.0);
    free(third);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    assert_int_equal(ppn_model_free(shut), PPN_OK);
    free(together);
    free(alone);
    free(want);
    free(ids);
    free(ref);
}

/* Bad calls are refused before anything is fed, and the model stays usable. */
static void test_prefill_refusals(void **state)
{
    (void)state;
    char dir[4096];
    float *ref;
    int n, vocab;
    int *ids = hf_fixture("llama-tiny", dir, sizeof dir, &ref, &n, &vocab);
    ppn_load_opts lo = ppn_load_opts_default();
    lo.ctx = 16;
    ppn_model *m = tu_model_load(tu_sim_rt(), dir, &lo);
    ppn_seq *q = NULL, *r = NULL;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    assert_int_equal(ppn_seq_create(m, &r), PPN_OK);
    int bad[3] = {1, vocab, 2};
    ppn_prefill_opts o = {.chunk = PPN_PREFILL_MAX_CHUNK + 1};
    assert_int_equal(ppn_prefill(q, ids, 3, &o, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "chunk"));
    assert_int_equal(ppn_prefill(q, bad, 3, NULL, NULL), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "vocabulary"));
    assert_int_equal(ppn_prefill(q, ids, 0, NULL, NULL), PPN_EINVAL);
    assert_int_equal(ppn_prefill(q, ids, 17, NULL, NULL), PPN_ESTATE); /* ctx 16 */
    assert_non_null(strstr(ppn_last_error(), "context"));
    ppn_step_id id;
    assert_int_equal(ppn_decode_step_deferred(q, 1, &id), PPN_OK);
    assert_int_equal(ppn_prefill(q, ids, 3, NULL, NULL), PPN_ESTATE); /* a deferred step in flight */
    assert_int_equal(ppn_pending_wait(q, id, NULL), PPN_OK);
    ppn_seq *twice[2] = {r, r};
    const int *pp[2] = {ids, ids};
    int nn[2] = {2, 2};
    assert_int_equal(ppn_prefill_batch(twice, pp, nn, 2, NULL, NULL), PPN_EINVAL);
    assert_int_equal(ppn_seq_pos(q), 1);
    assert_int_equal(ppn_seq_pos(r), 0); /* nothing was fed by the refusals */
    assert_int_equal(ppn_prefill(q, ids + 1, 15, NULL, NULL), PPN_OK); /* up to the context exactly */
    assert_int_equal(ppn_seq_pos(q), 16);
    ppn_seq_destroy(q);
    ppn_seq_destroy(r);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(ids);
    free(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_llama_tiny),    cmocka_unit_test(test_prefill_qwen2_tiny),
        cmocka_unit_test(test_prefill_qwen3_tiny),    cmocka_unit_test(test_prefill_stories),
        cmocka_unit_test(test_prefill_then_decode),   cmocka_unit_test(test_prefill_split_and_batch),
        cmocka_unit_test(test_prefill_refusals),       cmocka_unit_test(test_prefill_rows_same_bits),
        cmocka_unit_test(test_prefill_rows_same_bits_w),
        cmocka_unit_test(test_prefill_kv_leaves_rows_scratch),
    };
    return cmocka_run_group_tests(tests, tu_sim_rt_setup, tu_sim_rt_teardown);
}
