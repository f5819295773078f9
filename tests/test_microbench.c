/* test_microbench.c - `ppn transport-bench` and `ppn sched-bench` run as subprocesses ($PPN_BIN) on the sim
 * backend with its latency model on (PPN_SIM_LATENCY=1), small sizes and few iterations:
 *   - the JSON parses; every transport (inplace, dtod, kernel_add, peer and host on a pair; host alone with PPN_SIM_PEER=none) appears for
 *     every size asked, with positive, ordered statistics;
 *   - the latency model's order holds: host-staged slower than peer, peer slower than inplace, checked on the
 *     modelled copy time per hand-off the bench reports on sim (model_copy_us), never on the measured wall
 *     times (speed belongs in benchmarks): deterministic, so it runs in every build, sanitizers included;
 *   - sched-bench reports every configuration with positive numbers, the pinning knob took effect (unpinned:
 *     cores -1; pinned: real cores), the seams are what each configuration says (graphs on everywhere but the
 *     two no-graphs arms); under the latency model (a kernel 4 us through a stream, 1 us replayed from a graph)
 *     the graph arms are faster than their no-graphs twins, checked on the modelled launch time per step the
 *     bench reports on sim (model_launch_us), never on wall times: it runs in every build, sanitizers included;
 *   - the --plot files are standalone SVG documents naming what they draw;
 *   - bad arguments and a bad PPN_PIN fail with a message naming the culprit; PPN_PIN=none|near|far reach the
 *     published stage map (through `ppn run`).
 * Sizes stay at or below 256K: the runs stay short, sanitizer builds included. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/util/tutil.h"

#define SIM_ENV "PPN_SIM_LATENCY=1 PPN_SIM_DEVICES=2"
static const size_t sizes[] = {4096, 16384, 65536, 262144};
#define N_SIZES (sizeof sizes / sizeof sizes[0])
#define LARGEST 262144

/* Run cmd; it must exit 0 with one JSON object on stdout. */
static json_t *run_json(const char *cmd)
{
    char *out = NULL, *err = NULL;
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0) print_error("command: %s\nexit %d\nstderr:\n%s\n", cmd, rc, err ? err : "");
    assert_int_equal(rc, 0);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    if (!j) print_error("stdout is not JSON (%s): %s\n", out ? je.text : "no output", out ? out : "");
    assert_non_null(j);
    assert_true(json_is_object(j));
    free(out);
    free(err);
    return j;
}

static const char *str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) fail_msg("key '%s' is missing or not a string", key);
    return json_string_value(v);
}

/* The SVG file: a standalone document, closed, mentioning every name in want. */
static void check_svg(const char *path, const char *const *want, int n_want)
{
    size_t n = 0;
    char *s = tu_read_file(path, &n);
    if (!s) fail_msg("--plot did not write %s", path);
    assert_true(n > 200);
    assert_true(!strncmp(s, "<?xml", 5) || !strncmp(s, "<svg", 4));
    assert_non_null(strstr(s, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(s, "</svg>"));
    for (int i = 0; i < n_want; i++)
        if (!strstr(s, want[i])) fail_msg("%s does not mention '%s'", path, want[i]);
    free(s);
}

/* transport-bench ------------------------------------------------------------------------------------------ */

/* The result of transport t for pair from->to at size, after checking its numbers; fails if absent. */
static json_t *find_result(json_t *root, const char *t, int from, int to, size_t size)
{
    json_t *res = json_object_get(root, "results"), *r;
    size_t i;
    assert_true(json_is_array(res));
    json_array_foreach(res, i, r) {
        if (strcmp(str(r, "transport"), t) || num(r, "from") != from || num(r, "to") != to || num(r, "size") != size)
            continue;
        json_t *lat = json_object_get(r, "latency_us");
        assert_non_null(lat);
        double mn = num(lat, "min"), med = num(lat, "median"), p99 = num(lat, "p99"), mean = num(lat, "mean");
        assert_true(mn > 0 && mn <= med && med <= p99 && mn <= mean && mean <= p99 * 1.0001);
        assert_true(num(r, "throughput_us_per_handoff") > 0);
        assert_true(num(r, "handoffs_per_s") > 0);
        assert_true(num(r, "bandwidth_GBps") > 0);
        assert_true(num(r, "bytes") > (double)size); /* the slot carries the step header too */
        assert_true(num(r, "model_copy_us") > 0);    /* the sim's account of the modelled copies */
        return r;
    }
    fail_msg("transport-bench: no result for %s %d->%d at %zu B", t, from, to, size);
    return NULL;
}

static int count_transport(json_t *root, const char *t)
{
    json_t *res = json_object_get(root, "results"), *r;
    size_t i;
    int n = 0;
    json_array_foreach(res, i, r) n += !strcmp(str(r, "transport"), t);
    return n;
}

static void test_transport_bench(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char cmd[2048], svg_peer[600], svg_host[600];
    snprintf(svg_peer, sizeof svg_peer, "%s/peer.svg", dir);
    snprintf(svg_host, sizeof svg_host, "%s/host.svg", dir);
    /* default pairs: the same-device transports on device 0 and the one pair 0->1 of the two sim devices */
    snprintf(cmd, sizeof cmd, SIM_ENV " PPN_SIM_PEER=all '%s' transport-bench --backend sim --sizes 4K..256K "
             "--iters 40 --warmup 5 --batch 8 --json --plot '%s'", bin(), svg_peer);
    json_t *a = run_json(cmd);
    snprintf(cmd, sizeof cmd, SIM_ENV " PPN_SIM_PEER=none '%s' transport-bench --backend sim --devices 0,1 "
             "--sizes 4K,16K,64K,256K --iters 40 --warmup 5 --batch 8 --json --plot '%s'", bin(), svg_host);
    json_t *b = run_json(cmd);
    assert_string_equal(str(a, "tool"), "transport-bench");
    assert_string_equal(str(a, "backend"), "sim");
    assert_int_equal((int)num(a, "iters"), 40);
    for (size_t i = 0; i < N_SIZES; i++) {
        find_result(a, "inplace", 0, 0, sizes[i]);
        find_result(a, "dtod", 0, 0, sizes[i]);
        find_result(a, "kernel_add", 0, 0, sizes[i]);
        find_result(a, "peer", 0, 1, sizes[i]);
        find_result(a, "host", 0, 1, sizes[i]);
        find_result(b, "host", 0, 1, sizes[i]);
    }
    /* peer is possible on the first run: peer and the host-staged fallback are both measured on the pair; the
     * second run has no peer grant, so only host-staging */
    assert_int_equal(count_transport(a, "host"), (int)N_SIZES);
    assert_int_equal(count_transport(a, "peer"), (int)N_SIZES);
    assert_int_equal(count_transport(b, "peer"), 0);
    assert_int_equal(count_transport(b, "inplace"), 0); /* --devices 0,1: only that pair */
    assert_int_equal(count_transport(b, "host"), (int)N_SIZES);
    const char *want_a[] = {"inplace 0-&gt;0", "dtod 0-&gt;0", "kernel_add 0-&gt;0", "peer 0-&gt;1", "host 0-&gt;1",
                            "latency"};
    const char *want_b[] = {"host 0-&gt;1", "256K"};
    check_svg(svg_peer, want_a, 6);
    check_svg(svg_host, want_b, 2);
    json_decref(a);
    json_decref(b);
    tu_rmrf(dir);
    free(dir);
}

/* The model's figure of result r: present and positive on the sim backend. */
static double model_us(json_t *r)
{
    double m = num(r, "model_copy_us");
    if (!(m > 0)) fail_msg("model_copy_us %.4f of %s %d->%d: want > 0", m, str(r, "transport"), (int)num(r, "from"),
                           (int)num(r, "to"));
    return m;
}

/* The latency model's order: host-staged > peer > inplace at every size, checked on transport-bench's
 * model_copy_us (the sim's account of the modelled copy time of one hand-off, ppn_sim_counts.copy_model_ns) and
 * never on the measured wall times, which CPU load or a sanitizer's memmove reorder. The account does not depend
 * on time, load, build or PPN_SIM_LATENCY: the first run leaves the model off (quick), the second applies it,
 * and the host-staged figures of the two must agree exactly. */
static void test_transport_order(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "PPN_SIM_LATENCY=0 PPN_SIM_DEVICES=2 PPN_SIM_PEER=all '%s' transport-bench "
             "--backend sim --sizes 64K,256K --iters 3 --warmup 1 --batch 2 --json", bin());
    json_t *a = run_json(cmd);
    snprintf(cmd, sizeof cmd, SIM_ENV " PPN_SIM_PEER=none '%s' transport-bench --backend sim --devices 0,1 "
             "--sizes 64K,256K --iters 3 --warmup 1 --batch 2 --json", bin());
    json_t *b = run_json(cmd);
    const size_t order_sizes[] = {65536, LARGEST};
    for (size_t i = 0; i < 2; i++) {
        size_t n = order_sizes[i];
        double inplace = model_us(find_result(a, "inplace", 0, 0, n));
        double peer = model_us(find_result(a, "peer", 0, 1, n));
        double host = model_us(find_result(a, "host", 0, 1, n));
        double host_on = model_us(find_result(b, "host", 0, 1, n));
        if (!(host > peer && peer > inplace))
            fail_msg("latency model order broken at %zu B: host %.4f us, peer %.4f us, inplace %.4f us (modelled "
                     "copy time per hand-off)", n, host, peer, inplace);
        if (host != host_on)
            fail_msg("model_copy_us of host 0->1 at %zu B: %.4f us with PPN_SIM_LATENCY=0, %.4f us with 1 (want "
                     "the same: the account is the model's, applied or not)", n, host, host_on);
    }
    json_decref(a);
    json_decref(b);
}

static void expect_usage_error(const char *args, const char *needle)
{
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "'%s' %s", bin(), args);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 2 || !err || !strstr(err, needle))
        fail_msg("'%s': exit %d (want 2), stderr '%s' (want it to name '%s')", args, rc, err ? err : "", needle);
    free(out);
    free(err);
}

static void test_microbench_bad_arguments(void **state)
{
    (void)state;
    expect_usage_error("transport-bench --backend sim --sizes 3", "--sizes '3'");      /* not a multiple of 4 */
    expect_usage_error("transport-bench --backend sim --sizes 64M..4K", "--sizes");    /* range upside down */
    expect_usage_error("transport-bench --backend sim --sizes 4K,", "--sizes '4K,'");
    expect_usage_error("transport-bench --backend sim --sizes 2G", "--sizes '2G'");    /* above 1G */
    expect_usage_error("transport-bench --backend sim --devices 1", "--devices '1'");
    expect_usage_error("transport-bench --backend sim --iters 0", "--iters");
    expect_usage_error("transport-bench --bogus", "--bogus");
    expect_usage_error("sched-bench --backend sim --stages 1", "--stages");
    expect_usage_error("sched-bench --backend sim --inflight 5", "--inflight");
    expect_usage_error("sched-bench --backend sim --model x --shape tiny", "not both");
    expect_usage_error("sched-bench --backend sim --stages 2 --devices 0", "--devices has 1 entries");
}

static void test_transport_bad_device(void **state)
{
    (void)state;
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "PPN_SIM_DEVICES=2 '%s' transport-bench --backend sim --devices 0,5 --sizes 4K "
             "--iters 2", bin());
    int rc = tu_run(cmd, &out, &err);
    assert_int_equal(rc, 1);
    assert_non_null(err);
    if (!strstr(err, "device 5 does not exist")) fail_msg("stderr does not name device 5: %s", err);
    free(out);
    free(err);
}

/* sched-bench ---------------------------------------------------------------------------------------------- */

static const char *const configs[] = {"one-thread", "unsplit", "unsplit-no-graphs", "unpinned", "pinned-near",
                                      "pinned-far", "spin", "no-graphs", "slot-producer",
                                      "slot-interleave"};
#define N_CONFIGS (sizeof configs / sizeof configs[0])

static json_t *find_config(json_t *root, const char *name)
{
    json_t *cf = json_object_get(root, "configs"), *c;
    size_t i;
    assert_true(json_is_array(cf));
    json_array_foreach(cf, i, c) if (!strcmp(str(c, "name"), name)) return c;
    fail_msg("sched-bench: configuration '%s' is missing", name);
    return NULL;
}

/* Every core of c's stage map is >= 0 (want_pinned) or -1. */
static void check_cores(json_t *c, int want_pinned)
{
    json_t *cores = json_object_get(c, "cores"), *v;
    size_t i;
    assert_int_equal(json_array_size(cores), 2);
    json_array_foreach(cores, i, v) {
        json_int_t pu = json_integer_value(v);
        if (want_pinned ? pu < 0 : pu != -1)
            fail_msg("stage %zu core %lld (want %s)", i, (long long)pu, want_pinned ? "a core" : "-1");
    }
}

static void test_sched_bench(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    assert_non_null(dir);
    char cmd[2048], svg[600];
    snprintf(svg, sizeof svg, "%s/sched.svg", dir);
    snprintf(cmd, sizeof cmd, SIM_ENV " '%s' sched-bench --backend sim --shape tiny --stages 2 -n 8 --warmup 2 "
             "--json --plot '%s'", bin(), svg);
    json_t *j = run_json(cmd);
    assert_string_equal(str(j, "tool"), "sched-bench");
    assert_int_equal((int)num(j, "stages"), 2);
    assert_int_equal((int)num(j, "steps"), 8);
    assert_true(json_is_boolean(json_object_get(j, "far_equals_near")));
    assert_int_equal(json_array_size(json_object_get(j, "configs")), N_CONFIGS);
    for (size_t i = 0; i < N_CONFIGS; i++) {
        json_t *c = find_config(j, configs[i]);
        assert_string_equal(str(c, "status"), "ok");
        assert_int_equal((int)num(c, "graphs"), strstr(configs[i], "no-graphs") ? 0 : 1);
        double wall = num(c, "wall_us_per_step"), sps = num(c, "steps_per_s"), other = num(c, "other_us_per_step");
        double issue = num(json_object_get(c, "issue_us"), "mean"), wait = num(json_object_get(c, "wait_us"), "mean");
        if (!(sps > 0 && wall > 0 && issue > 0 && wait > 0))
            fail_msg("%s: steps/s %g, wall %g us, issue %g us, wait %g us: not all positive", configs[i], sps, wall,
                     issue, wait);
        /* Laws, whatever the load (tools/cmd_sched_bench.c): each issue and wait time is one interval of the same
         * monotonic clock, all disjoint and inside the timed loop that wall measures, and both means and wall
         * divide by the same step count, so issue + wait <= wall and other = wall - issue - wait >= 0; steps/s
         * is steps / wall. The slack is the JSON's 6 significant digits (a relative 5e-6 per number) and the
         * clock's double rounding (under 1e-3 us a step), far inside it. */
        if (issue + wait > wall * 1.0001 || other < -1e-3)
            fail_msg("%s: issue %g + wait %g us > wall %g us (other %g us)", configs[i], issue, wait, wall, other);
        if (sps * wall < 0.999e6 || sps * wall > 1.001e6) fail_msg("%s: steps/s %g vs wall %g us", configs[i], sps, wall);
        assert_true(num(c, "model_launch_us") > 0); /* the sim's account of the modelled launches */
    }
    json_t *one = find_config(j, "one-thread");
    assert_false(json_is_true(json_object_get(one, "threads")));
    assert_int_equal((int)num(one, "streams"), 0);
    assert_int_equal((int)num(one, "n_stages"), 2);
    assert_int_equal((int)num(find_config(j, "unsplit"), "n_stages"), 1);
    json_t *unp = find_config(j, "unpinned"), *near = find_config(j, "pinned-near"), *spin = find_config(j, "spin");
    assert_true(json_is_true(json_object_get(unp, "threads")));
    assert_true(json_is_true(json_object_get(near, "threads")));
    check_cores(unp, 0);
    check_cores(near, 1);
    check_cores(find_config(j, "pinned-far"), 1);
    assert_int_equal((int)num(spin, "spin"), 1);
    assert_int_equal((int)num(near, "spin"), 0);
    const char *want[] = {"one-thread", "unsplit", "unsplit-no-graphs", "unpinned", "pinned-near", "pinned-far",
                          "spin", "no-graphs", "steps / s"};
    check_svg(svg, want, 9);
    json_decref(j);
    tu_rmrf(dir);
    free(dir);
}

/* One device: the threaded configurations put two stage streams on it (the seed's pp_multi_stream_same_device,
 * which ppn runs since its pipelined arm was proven); every configuration is measured. */
static void test_sched_one_device(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "PPN_SIM_DEVICES=1 '%s' sched-bench --backend sim --shape tiny -n 2 --warmup 0 --json",
             bin());
    json_t *j = run_json(cmd);
    for (size_t i = 0; i < N_CONFIGS; i++) {
        json_t *c = find_config(j, configs[i]);
        assert_string_equal(str(c, "status"), "ok");
        assert_true(num(c, "steps_per_s") > 0);
    }
    json_decref(j);
}

/* The model figures of sched-bench configuration name in j: present, and the launch time what the documented
 * costs make of the kernel counts (4 us per kernel launched through a stream, 1 us per kernel replayed). */
static double model_launch(json_t *j, const char *name, double *launched, double *replayed)
{
    json_t *c = find_config(j, name);
    double m = num(c, "model_launch_us");
    *launched = num(c, "model_launches_per_step");
    *replayed = num(c, "model_replayed_per_step");
    if (!(m > 0) || m != 4 * *launched + *replayed)
        fail_msg("%s: model_launch_us %.4f for %.4f kernels launched and %.4f replayed per step (want 4 us and 1 us "
                 "each, > 0)", name, m, *launched, *replayed);
    return m;
}

/* The latency model's order for graphs: a step replayed from its stage's captured graph (a kernel at 1 us) beats
 * the same step launched kernel by kernel (4 us each), for the one-stage step (unsplit against
 * unsplit-no-graphs) and the threaded two-stage one (pinned-near against no-graphs). Checked on sched-bench's
 * model_launch_us (the sim's account of the kernels of the timed steps, ppn_sim_counts.launch_model_ns), never on
 * the measured wall times, which a step's thread hand-offs and the machine's load swamp: deterministic, so it
 * runs in every build, sanitizers included. The twins must run the same kernels (the graph arm replays what the
 * eager one launches), and the account must not depend on PPN_SIM_LATENCY: the first run leaves the model off
 * (quick), the second applies it, and every configuration's figures must agree exactly. */
static void test_sched_graph_order(void **state)
{
    (void)state;
    static const char *const twins[][2] = {{"unsplit", "unsplit-no-graphs"}, {"pinned-near", "no-graphs"}};
    json_t *j[2];
    for (int on = 0; on < 2; on++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "PPN_SIM_LATENCY=%d PPN_SIM_DEVICES=2 '%s' sched-bench --backend sim --shape tiny "
                 "-n 4 --warmup 2 --json", on, bin());
        j[on] = run_json(cmd);
    }
    for (int t = 0; t < 2; t++) {
        double gl, gr, el, er;
        double g = model_launch(j[0], twins[t][0], &gl, &gr), e = model_launch(j[0], twins[t][1], &el, &er);
        if (!(gr > 0) || er != 0 || gl + gr != el + er)
            fail_msg("%s replays %.4f and launches %.4f kernels per step, %s replays %.4f and launches %.4f (want the "
                     "same kernels, replayed by the first only)", twins[t][0], gr, gl, twins[t][1], er, el);
        if (!(g < e))
            fail_msg("graph replay (%s: %.4f us/step modelled) is not faster than eager launches (%s: %.4f us/step) "
                     "under the latency model", twins[t][0], g, twins[t][1], e);
    }
    for (size_t i = 0; i < N_CONFIGS; i++) {
        double l[2], r[2], m[2];
        for (int on = 0; on < 2; on++) m[on] = model_launch(j[on], configs[i], &l[on], &r[on]);
        if (m[0] != m[1] || l[0] != l[1] || r[0] != r[1])
            fail_msg("%s: model_launch_us %.4f (%.4f launched, %.4f replayed) with PPN_SIM_LATENCY=0, %.4f (%.4f, "
                     "%.4f) with 1 (want the same: the account is the model's, applied or not)", configs[i], m[0],
                     l[0], r[0], m[1], l[1], r[1]);
    }
    json_decref(j[0]);
    json_decref(j[1]);
}

/* The PPN_PIN knob of the stage map, through `ppn run` with the door open (sched-bench sets it itself). */
static void test_microbench_pin_knob(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), cmd[2048], *out = NULL, *err = NULL;
    assert_non_null(dir);
    snprintf(cmd, sizeof cmd, "'%s' mkmodel --shape tiny --out '%s' --dtype f32", bin(), dir);
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    free(out);
    free(err);
    const char *run = "PPN_SIM_DEVICES=2 '%s' run --backend sim --model '%s' --ids 1,2 -n 2 --stages 2 --devices 0,1 "
                      "--json";
    char fmt[512];
    snprintf(fmt, sizeof fmt, "PPN_PIN=bogus %s", run);
    snprintf(cmd, sizeof cmd, fmt, bin(), dir);
    int rc = tu_run(cmd, &out, &err);
    if (rc != 2 || !err || !strstr(err, "PPN_PIN='bogus': must be near, far or none")) /* refused before running */
        fail_msg("PPN_PIN=bogus: exit %d, stderr '%s'", rc, err ? err : "");
    free(out);
    free(err);
    static const char *const modes[] = {"none", "near", "far"};
    for (int k = 0; k < 3; k++) {
        snprintf(fmt, sizeof fmt, "PPN_PIN=%s %s", modes[k], run);
        snprintf(cmd, sizeof cmd, fmt, bin(), dir);
        json_t *j = run_json(cmd);
        json_t *map = json_object_get(j, "stage_map");
        assert_true(json_is_true(json_object_get(map, "threads")));
        check_cores(map, k != 0);
        json_decref(j);
    }
    tu_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_microbench_bad_arguments),
        cmocka_unit_test(test_transport_bad_device),
        cmocka_unit_test(test_transport_bench),
        cmocka_unit_test(test_transport_order),
        cmocka_unit_test(test_sched_bench),
        cmocka_unit_test(test_sched_one_device),
        cmocka_unit_test(test_sched_graph_order),
        cmocka_unit_test(test_microbench_pin_knob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
