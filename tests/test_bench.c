/* test_bench.c - `ppn bench` as a subprocess on the sim backend: the JSON report of a stage sweep (shape, the
 * statistics consistent with each other and with the spec's floor, no driver allocation while timing, each
 * configuration's stage map), the human table, the refusals (exit status and `ppn: error:`), and the temporary
 * checkpoint of --shape removed on success and on failure (TMPDIR points at a directory of the test's own). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/util/tutil.h"

/* Run `ppn bench <args>` (tu_run_ppn: TMPDIR a fresh directory); require that directory empty afterwards. */
static int bench(const char *args, char **out, char **err)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "bench %s", args);
    int left = -1, rc = tu_run_ppn("", cmd, out, err, &left);
    if (left != 0) fail_msg("bench %s left %d entries in its TMPDIR", args, left);
    return rc;
}

/* `ppn bench <args>` that must exit 0: its stdout (the caller's to free). */
static char *bench_ok(const char *args)
{
    char *out = NULL, *err = NULL;
    int rc = bench(args, &out, &err);
    if (rc != 0 || !out) fail_msg("bench %s exited %d:\n%s\n%s", args, rc, out ? out : "", err ? err : "");
    free(err);
    return out;
}

/* `ppn bench <args>` that must exit 0 and print one JSON document: the parsed document (the caller's to decref). */
static json_t *bench_json(const char *args)
{
    char *out = bench_ok(args);
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    if (!r) fail_msg("bench output is not JSON (%s, line %d):\n%s", je.text, je.line, out);
    free(out);
    return r;
}

static void near(double x, double want, double rel, const char *what)
{
    if (!(fabs(x - want) <= rel * fabs(want))) fail_msg("%s: %.9g, expected %.9g (rel tol %g)", what, x, want, rel);
}

static void check_config(json_t *c, int stages, double weight_bytes, double floor_ms, int n_layers)
{
    assert_true(json_is_object(c));
    assert_int_equal((int)num(c, "stages"), stages);
    double med = num(c, "median_ms"), p99 = num(c, "p99_ms");
    assert_true(med > 0);
    assert_true(p99 >= med);
    near(num(c, "tok_s"), 1000.0 / med, 1e-4, "tok_s vs 1000/median_ms");
    assert_true(num(c, "prefill_ms") > 0);
    near(num(c, "gbs"), weight_bytes / (med * 1e-3) / 1e9, 1e-4, "gbs vs weight_bytes/median");
    near(num(c, "floor_ratio"), floor_ms / med, 1e-4, "floor_ratio vs floor_ms/median");
    assert_true(num(c, "pool_peak") > 0);
    assert_true(num(c, "pool_reserved") > 0);
    json_t *da = json_object_get(c, "driver_allocs_timed");
    assert_true(json_is_integer(da));
    assert_int_equal(json_integer_value(da), 0);
    json_t *sm = json_object_get(c, "stage_map");
    assert_true(json_is_object(sm));
    assert_int_equal((int)num(sm, "n_stages"), stages);
    json_t *fence = json_object_get(sm, "fence");
    assert_true(json_is_array(fence));
    assert_int_equal(json_array_size(fence), (size_t)stages + 1);
    assert_int_equal(json_integer_value(json_array_get(fence, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(fence, (size_t)stages)), n_layers);
}

static void test_bench_sweep_json(void **s)
{
    (void)s;
    json_t *r = bench_json("--shape tiny --backend sim -n 8 --prompt 4 --reps 2 --stages-sweep 1,2 --json");
    assert_string_equal(json_string_value(json_object_get(r, "backend")), "sim");
    assert_non_null(json_string_value(json_object_get(r, "model")));
    assert_non_null(json_string_value(json_object_get(r, "dtype")));
    /* the KV caches keep the weights' dtype (f32 on sim by default; a bf16 load below) */
    assert_non_null(json_string_value(json_object_get(r, "kv_dtype")));
    assert_string_equal(json_string_value(json_object_get(r, "kv_dtype")), json_string_value(json_object_get(r, "dtype")));
    double wb = num(r, "weight_bytes"), floor_ms = num(r, "floor_ms");
    assert_true(wb > 0);
    near(floor_ms, wb / 4.28e12 * 1e3, 1e-6, "floor_ms vs weight_bytes / 4.28e12 B/s");
    int n_layers = (int)num(r, "n_layers");
    assert_true(n_layers >= 2);
    json_t *cfgs = json_object_get(r, "configs");
    assert_true(json_is_array(cfgs));
    assert_int_equal(json_array_size(cfgs), 2);
    check_config(json_array_get(cfgs, 0), 1, wb, floor_ms, n_layers);
    check_config(json_array_get(cfgs, 1), 2, wb, floor_ms, n_layers);
    json_decref(r);
}


/* --device-greedy: the decode steps are one ppn_decode_greedy call; the JSON says so and every figure is as
 * consistent as the per-step mode's (check_config), over 2 stages too. With bf16 weights, so bf16 KV caches. */
static void test_bench_device_greedy_json(void **s)
{
    (void)s;
    json_t *r = bench_json("--shape tiny --backend sim --dtype bf16 -n 8 --prompt 4 --reps 2 --stages-sweep 1,2 "
                           "--device-greedy --json");
    assert_true(json_is_true(json_object_get(r, "device_greedy")));
    assert_string_equal(json_string_value(json_object_get(r, "dtype")), "bf16");
    assert_string_equal(json_string_value(json_object_get(r, "kv_dtype")), "bf16");
    double wb = num(r, "weight_bytes"), floor_ms = num(r, "floor_ms");
    json_t *cfgs = json_object_get(r, "configs");
    check_config(json_array_get(cfgs, 0), 1, wb, floor_ms, (int)num(r, "n_layers"));
    check_config(json_array_get(cfgs, 1), 2, wb, floor_ms, (int)num(r, "n_layers"));
    json_decref(r);
}

/* --batch with --device-greedy: every B's row has the batch greedy loop's step time and rate beside the
 * synchronous step's (rate = B / step, both positive), in the JSON and in the table's columns; without the flag,
 * neither. */
static void test_bench_batch_device_greedy(void **s)
{
    (void)s;
    json_t *r = bench_json("--shape tiny --backend sim -n 4 --prompt 3 --reps 1 --warmup 0 --stages 2 --batch 1,3 "
                           "--device-greedy --json");
    json_t *rows = json_object_get(r, "batch");
    assert_int_equal(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *row = json_array_get(rows, i);
        double B = num(row, "B"), ms = num(row, "greedy_step_ms"), rate = num(row, "greedy_agg_tok_s");
        assert_true(ms > 0 && num(row, "step_ms") > 0);
        near(rate, B * 1e3 / ms, 1e-4, "greedy_agg_tok_s");
    }
    json_decref(r);
    char *out = bench_ok("--shape tiny --backend sim -n 2 --prompt 2 --reps 1 --warmup 0 --batch 2 --device-greedy");
    assert_non_null(strstr(out, "greedy_ms"));
    free(out);
    out = bench_ok("--shape tiny --backend sim -n 2 --prompt 2 --reps 1 --warmup 0 --batch 2");
    assert_null(strstr(out, "greedy_ms"));
    free(out);
}

/* --batch with --mixed P: each timed step also feeds a slice of up to P rows of one more sequence's --prompt ids (a
 * `ppn serve` iteration), which starts over once fed: the JSON row names P and the mean rows a step fed (10 ids in
 * slices of 4: 4, 4, 2, 4, 4, 2 over 6 steps, 3 a step), and the kernel account (PPN_KPROF=1) shows the slices'
 * attention rows (ppn_k_attn_rows*), which a plain batched step never launches. */
static void test_bench_batch_mixed(void **s)
{
    (void)s;
    json_t *r = bench_json("--shape tiny --backend sim -n 6 --prompt 10 --reps 1 --warmup 0 --batch 2 --mixed 4 --json");
    json_t *row = json_array_get(json_object_get(r, "batch"), 0);
    assert_non_null(row);
    assert_true(num(row, "mixed") == 4 && num(row, "prompt_rows_per_step") == 3 && num(row, "step_ms") > 0);
    json_decref(r);
    for (int mixed = 1; mixed >= 0; mixed--) {
        char *out = NULL, *err = NULL;
        int left = -1, rc = tu_run_ppn("PPN_KPROF=1 PPN_GRAPHS=0", mixed ? "bench --shape tiny --backend sim -n 6 --prompt 10 --reps 1 --warmup 0 "
                                               "--batch 2 --mixed 4"
                                             : "bench --shape tiny --backend sim -n 6 --prompt 10 --reps 1 --warmup 0 "
                                               "--batch 2",
                        &out, &err, &left);
        if (rc != 0 || !out) fail_msg("bench exited %d:\n%s\n%s", rc, out ? out : "", err ? err : "");
        assert_non_null(strstr(out, "B=2 ppn_k_gemm")); /* the account is there */
        if (!strstr(out, "B=2 ppn_k_attn_rows") != !mixed)
            fail_msg("--mixed %d: attention rows %s in the account:\n%s", mixed, mixed ? "missing" : "present", out);
        assert_int_equal(!strstr(out, "prompt rows a step"), !mixed);
        free(out);
        free(err);
    }
}

/* The default output: the header naming the floor's bandwidth, one row and a stage map line per config. */
static void test_bench_table(void **s)
{
    (void)s;
    char *out = bench_ok("--shape tiny --backend sim -n 4 --prompt 2 --reps 1 --stages 2 --bw-gbs 1000");
    assert_non_null(strstr(out, "backend sim"));
    assert_non_null(strstr(out, "/ 1000 GB/s"));
    assert_non_null(strstr(out, "per-stage time: not measured"));
    assert_non_null(strstr(out, "stage map: 2 stages"));
    assert_null(strstr(out, "stage map: 1 stage:"));
    free(out);
}

static void test_bench_refusals(void **s)
{
    (void)s;
    static const struct { const char *args, *needle; int usage; } cases[] = {
        {"--shape tiny --backend sim --reps 0", "--reps", 1},
        {"--shape nosuch --backend sim", "nosuch", 0},
        {"--backend sim", "--shape", 1},
        {"--shape tiny --backend sim --stages-sweep 1,2 --devices 0,1", "--devices", 1},
        {"--shape tiny --backend sim --stages-sweep 1,8", "N=8", 0},
        {"--shape tiny --backend sim --ctx 4 -n 8 --prompt 2", "--ctx", 0},
        {"--shape tiny --backend sim --bogus", "--bogus", 1},
        /* a door-only flag with the door shut: --stages-sweep would open it (test_bench_door_flag_sweep) */
        {"--shape tiny --backend sim --overlap 1", "--overlap needs --stages N >= 2 (the door is shut)", 1},
        {"--shape tiny --backend sim --stages 1 --streams 0", "--streams needs --stages N >= 2", 1},
        {"--shape tiny --backend sim --prompt ' 2'", "--prompt: ' 2'", 1},
        {"--shape tiny --backend sim --stages-sweep 1,+2", "--stages-sweep: '1,+2'", 1},
        {"--shape tiny --backend sim --mixed 4", "--mixed P times host-fed batched steps", 1},
        {"--shape tiny --backend sim --batch 2 --mixed 4 --device-greedy", "takes no --device-greedy", 1},
        {"--shape tiny --backend sim --batch 2 --mixed 0", "--mixed: '0'", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL, *err = NULL;
        int rc = bench(cases[i].args, &out, &err);
        if (rc != (cases[i].usage ? 2 : 1) || !err || !strstr(err, "ppn: error:") || !strstr(err, cases[i].needle))
            fail_msg("case '%s': rc %d (want %d), stderr: %s", cases[i].args, rc, cases[i].usage ? 2 : 1,
                     err ? err : "");
        free(out);
        free(err);
    }
}

/* --stages-sweep opens the door itself: a door-only flag goes with it, and every N >= 2 gets it. */
static void test_bench_door_flag_sweep(void **s)
{
    (void)s;
    json_t *r = bench_json("--shape tiny --backend sim -n 2 --prompt 2 --reps 1 --stages-sweep 1,2 --overlap 1 --json");
    json_t *c2 = json_array_get(json_object_get(r, "configs"), 1);
    assert_int_equal((int)num(json_object_get(c2, "stage_map"), "n_stages"), 2);
    assert_int_equal((int)num(json_object_get(c2, "stage_map"), "overlap"), 1);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bench_sweep_json),
        cmocka_unit_test(test_bench_device_greedy_json),
        cmocka_unit_test(test_bench_table),
        cmocka_unit_test(test_bench_batch_device_greedy),
        cmocka_unit_test(test_bench_batch_mixed),
        cmocka_unit_test(test_bench_refusals),
        cmocka_unit_test(test_bench_door_flag_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
