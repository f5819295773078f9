/* test_cli.c - the ppn command line's handling of bad input, run as a subprocess (tu_run_ppn) on the sim
 * backend: integers as plain digits, one-line errors whatever a value holds, the exit rule (2: usage, syntax,
 * an environment value breaking its rule; 1: a failure while running), door-only flags refused while the door
 * is shut and door-only variables noted, no leak on any refusal of `ppn run` (the ASan build runs this same
 * test: LeakSanitizer makes the process fail), transport-bench's small sim defaults, mkmodel --tokenizer, and
 * every failed record of a `ppn run` reported with exit 1 (the teardowns' too).
 *
 * The values with control characters are made by printf(1) in the shell, so the argv ppn sees holds them raw. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include "ppn.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/model/ckpt.h"
#include "tests/util/tutil.h"

/* The tiny checkpoint every case runs against (made once). */
static char *g_dir;
static char g_model[1200];

static int setup(void **state)
{
    (void)state;
    g_dir = tu_tmpdir();
    if (!g_dir) return -1;
    snprintf(g_model, sizeof g_model, "%s/tiny", g_dir);
    return ppn_mkmodel("tiny", PPN_DTYPE_F32, g_model, 1) == PPN_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* Lines in s (each ending in '\n'). */
static int lines(const char *s)
{
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

/* `ppn <args>` (env: assignments before it, may be "") must exit want, its stderr holding every needle (NULL ends
 * the list) and no leak report. Returns stderr (malloc'd) for more checks. */
static char *expect_exit(const char *env, const char *args, int want, ...)
{
    char *out = NULL, *err = NULL;
    int rc = tu_run_ppn(env, args, &out, &err, NULL);
    if (rc != want || !err) fail_msg("'%s ppn %s': exit %d (want %d), stderr: %s", env, args, rc, want, err ? err : "");
    if (strstr(err, "LeakSanitizer") || strstr(err, "AddressSanitizer"))
        fail_msg("'%s ppn %s': sanitizer report:\n%s", env, args, err);
    va_list ap;
    va_start(ap, want);
    for (const char *n; (n = va_arg(ap, const char *)) != NULL;)
        if (!strstr(err, n)) fail_msg("'%s ppn %s': stderr lacks \"%s\": %s", env, args, n, err);
    va_end(ap);
    free(out);
    return err;
}

/* A refusal of `ppn run` on the tiny model: exit 2, "ppn: error:" and needle in one line of stderr. */
static void run_refused(const char *env, const char *flags, const char *needle)
{
    char args[2048];
    snprintf(args, sizeof args, "run --model '%s' --backend sim %s", g_model, flags);
    char *err = expect_exit(env, args, 2, "ppn: error: ", needle, NULL);
    if (lines(err) != 1) fail_msg("'ppn %s': %d lines of stderr, want 1: %s", args, lines(err), err);
    free(err);
}

static void run_ok(const char *env, const char *flags)
{
    char args[2048];
    snprintf(args, sizeof args, "run --model '%s' --backend sim --quiet %s", g_model, flags);
    free(expect_exit(env, args, 0, NULL));
}

/* ids parsed, then a refusal: every error path of `ppn run` after --ids frees them (the ASan build's
 * LeakSanitizer fails the process otherwise). */
static void test_cli_run_refusals_free_ids(void **state)
{
    (void)state;
    run_refused("", "--ids 1,2 -n x", "-n: 'x' is not an integer");
    run_refused("", "--ids 1,2 --ids 3 -n x", "-n: 'x'");
    run_refused("", "--ids 1,2 --bogus 1", "unknown option '--bogus'");
    run_refused("", "--ids 1,2 --overlap 1", "--overlap needs --stages N >= 2");
    run_refused("", "--ids 1,2 --temp 1 --device-greedy", "--device-greedy");
    run_refused("", "--ids 1,2 --ids x", "--ids: 'x'");
    run_refused("", "--ids 1,2 --stages", "--stages needs a value");
    free(expect_exit("", "run --ids 1,2 --backend sim", 2, "--model PATH is required", NULL));
    run_ok("", "--ids 1 --ids 2,3 -n 1"); /* the second list replaces the first */
}

/* Integers are digits only (a '-' where negatives make sense), numbers [-]digits[.digits][e[+-]digits]; the
 * refusal names the flag and the value. */
static void test_cli_plain_numbers(void **state)
{
    (void)state;
    static const struct { const char *flags, *needle; } bad[] = {
        {"--ids ' 1'", "--ids: ' 1'"},       {"--ids +1", "--ids: '+1'"},       {"--ids '1 '", "--ids: '1 '"},
        {"--ids 1,,2", "--ids: '1,,2'"},     {"--ids 1,", "--ids: '1,'"},       {"--ids -1", "--ids: '-1'"},
        {"--ids 2147483648", "--ids: '2147483648'"},                            {"--ids 0x10", "--ids: '0x10'"},
        {"--ids 1 -n +2", "-n: '+2'"},       {"--ids 1 -n ' 2'", "-n: ' 2'"},   {"--ids 1 -n 2x", "-n: '2x'"},
        {"--ids 1 -n -0", "-n: '-0'"},       {"--ids 1 --seed -1", "--seed: '-1'"},
        {"--ids 1 --seed +1", "--seed: '+1'"},                                  {"--ids 1 --ctx ' 8'", "--ctx: ' 8'"},
        {"--ids 1 --chunk 1e2", "--chunk: '1e2'"},                              {"--ids 1 --top-k 0x3", "--top-k: '0x3'"},
        {"--ids 1 --temp ' 1'", "--temp: ' 1'"},                                {"--ids 1 --temp +1", "--temp: '+1'"},
        {"--ids 1 --temp inf", "--temp: 'inf'"},                                {"--ids 1 --temp nan", "--temp: 'nan'"},
        {"--ids 1 --temp 0x1p1", "--temp: '0x1p1'"},                            {"--ids 1 --temp 1e", "--temp: '1e'"},
        {"--ids 1 --top-p .", "--top-p: '.'"},                                  {"--ids 1 --stages ' 2'", "--stages"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) run_refused("", bad[i].flags, bad[i].needle);
    run_ok("", "--ids 0,07,300 -n 1 --temp 0.5 --top-p 1e-1 --top-k 3 --seed 7 --ctx 64 --chunk 0");
    run_ok("", "--ids 1 -n 1 --temp .5 --top-p 1.0E0");
    static const char *const tb[] = {"--iters +4", "--iters ' 4'", "--warmup -1", "--batch 1.0", "--devices +0,1",
                                     "--devices ' 0,1'", "--devices 0,-1", "--devices 0,1,2", "--sizes +4K",
                                     "--sizes ' 4K'", "--sizes 4K,-8K"};
    for (size_t i = 0; i < sizeof tb / sizeof tb[0]; i++) {
        char args[256];
        snprintf(args, sizeof args, "transport-bench --backend sim %s", tb[i]);
        free(expect_exit("", args, 2, "ppn: error: ", NULL));
    }
}

/* A value's control characters are escaped in the message, which stays one line. */
static void test_cli_control_chars_escaped(void **state)
{
    (void)state;
    run_refused("", "--ids \"$(printf '1\\n2')\"", "--ids: '1\\n2'");
    run_refused("", "--ids \"$(printf '\\001\\033[31m\\t')\"", "--ids: '\\x01\\x1b[31m\\t'");
    run_refused("", "--ids 1 -n \"$(printf '3\\r')\"", "-n: '3\\r'");
    run_refused("MEMRA_PP_STAGES=\"$(printf '2\\n3')\"", "--ids 1", "MEMRA_PP_STAGES='2\\n3'");
    /* a runtime failure quoting a path: exit 1, one line too */
    char *err = expect_exit("", "run --backend sim --ids 1 --model \"$(printf '/nonexistent/a\\nb\\177')\"", 1,
                            "ppn: error: load: /nonexistent/a\\nb\\x7f", NULL);
    assert_int_equal(lines(err), 1);
    free(err);
}

/* Exit 2 for usage and syntax, the environment included (every value refused before anything runs, whatever
 * the command); 1 for a failure while running. */
static void test_cli_exit_rule(void **state)
{
    (void)state;
    static const struct { const char *env, *needle; } env_bad[] = {
        {"MEMRA_PP_STAGES=x", "MEMRA_PP_STAGES='x'"},       {"MEMRA_PP_STAGES=99", "MEMRA_PP_STAGES='99'"},
        {"PPN_SIM_DEVICES=100", "PPN_SIM_DEVICES='100'"},   {"PPN_SIM_DEVICES=x", "PPN_SIM_DEVICES='x'"},
        {"PPN_SIM_MEM=0", "PPN_SIM_MEM='0'"},               {"PPN_PDL=2", "PPN_PDL='2'"},
        {"PPN_PIN=far2", "PPN_PIN='far2'"},                 {"PPN_SIM_LATENCY=5000", "PPN_SIM_LATENCY='5000'"},
        {"PPN_BACKEND=gpu", "PPN_BACKEND='gpu'"},           {"PPN_SIM_PEER=zz", "PPN_SIM_PEER='zz'"},
        {"PPN_SIM_FAIL=zz", "PPN_SIM_FAIL='zz'"},           {"MEMRA_PP_STAGES=2 MEMRA_PP_OVERLAP=7", "MEMRA_PP_OVERLAP='7'"},
    };
    for (size_t i = 0; i < sizeof env_bad / sizeof env_bad[0]; i++) run_refused(env_bad[i].env, "--ids 1", env_bad[i].needle);
    free(expect_exit("PPN_SIM_DEVICES=100", "topo --backend sim", 2, "PPN_SIM_DEVICES='100'", NULL));
    free(expect_exit("PPN_SIM_FAIL=zz", "transport-bench --backend sim --sizes 4K", 2, "PPN_SIM_FAIL='zz'", NULL));
    free(expect_exit("PPN_PDL=2", "run --help", 0, NULL)); /* help is printed whatever the environment holds */
    run_refused("", "--backend gpu --ids 1", "--backend: 'gpu' is not one of auto, cuda or sim");
    free(expect_exit("", "frobnicate", 2, "unknown command 'frobnicate'", NULL));
    { /* ppn --version: the library's version, exit 0 */
        char *out = NULL, *err = NULL, want[64];
        snprintf(want, sizeof want, "ppn %d.%d.%d\n", PPN_VERSION_MAJOR, PPN_VERSION_MINOR, PPN_VERSION_PATCH);
        int rc = tu_run_ppn("", "--version", &out, &err, NULL);
        if (rc != 0 || !out || strcmp(out, want))
            fail_msg("ppn --version: exit %d, stdout '%s' (want '%s')", rc, out ? out : "", want);
        free(out), free(err);
    }
    /* runtime failures */
    free(expect_exit("", "run --backend sim --ids 1 --model /nonexistent/ppn", 1, "ppn: error: load:", NULL));
    char args[1400];
    snprintf(args, sizeof args, "run --model '%s' --backend sim --ids 1", g_model);
    free(expect_exit("MEMRA_PP_STAGES=2 MEMRA_PP_SPLITS=9", args, 1, "each cut must be in (0, n_layers=4)", NULL));
    snprintf(args, sizeof args, "run --model '%s' --backend sim --ids 1 --ctx 4 -n 8", g_model);
    free(expect_exit("", args, 1, "exceed the context", NULL));
}

/* Door-only flags (their variables are read only with the door open) need --stages N >= 2; the others do not. */
static void test_cli_door_flags_need_stages(void **state)
{
    (void)state;
    static const char *const door_only[] = {"--splits 2", "--split 2", "--devices 0,1", "--shard 0", "--streams 0",
                                            "--overlap 1"};
    for (size_t i = 0; i < sizeof door_only / sizeof door_only[0]; i++) {
        char flags[128], needle[128];
        snprintf(flags, sizeof flags, "--ids 1 %s", door_only[i]);
        snprintf(needle, sizeof needle, "%.*s needs --stages N >= 2 (the door is shut)",
                 (int)strcspn(door_only[i], " "), door_only[i]);
        run_refused("", flags, needle);
        snprintf(flags, sizeof flags, "--ids 1 --stages 1 %s", door_only[i]);
        run_refused("", flags, needle);
        snprintf(flags, sizeof flags, "--ids 1 --stages 2 %s --stages 0", door_only[i]); /* the last one counts */
        run_refused("", flags, needle);
    }
    run_refused("MEMRA_PP_STAGES=2", "--ids 1 --stages 1 --overlap 1", "--overlap needs --stages");
    run_ok("", "--ids 1 -n 1 --overlap 1 --stages 2");       /* before --stages: the whole line counts */
    run_ok("", "--ids 1 -n 1 --stages 2 --devices 0,1 --streams 1 --shard 1 --splits 2");
    run_ok("MEMRA_PP_STAGES=2", "--ids 1 -n 1 --overlap 1"); /* the environment opened the door */
    run_ok("", "--ids 1 -n 1 --spin 0 --graphs 0 --fuse 0 --check-unsplit"); /* not door-only */
}

/* A door-only variable set while MEMRA_PP_STAGES keeps the door shut: a one-line notice, not an error. */
static void test_cli_door_env_notice(void **state)
{
    (void)state;
    char args[1400];
    snprintf(args, sizeof args, "run --model '%s' --backend sim --quiet --ids 1 -n 1", g_model);
    char *err = expect_exit("MEMRA_PP_OVERLAP=1", args, 0,
                            "ppn: note: MEMRA_PP_OVERLAP is ignored: it is read only while MEMRA_PP_STAGES >= 2", NULL);
    assert_int_equal(lines(err), 1);
    free(err);
    err = expect_exit("MEMRA_PP_STAGES=1 MEMRA_PP_SPLITS=9 MEMRA_PP_SHARD=0", args, 0,
                      "ppn: note: MEMRA_PP_SPLITS, MEMRA_PP_SHARD are ignored", NULL);
    assert_int_equal(lines(err), 1);
    free(err);
    err = expect_exit("MEMRA_PP_STAGES=2 MEMRA_PP_OVERLAP=1", args, 0, NULL);
    assert_null(strstr(err, "note"));
    free(err);
    err = expect_exit("PPN_SPIN=1 PPN_GRAPHS=0", args, 0, NULL); /* not door-only: read with the door shut */
    assert_null(strstr(err, "note"));
    free(err);
    /* the batch and verify seams are wired now: set with the door open, they say nothing */
    err = expect_exit("MEMRA_PP_STAGES=2 MEMRA_SPEC_PP=0 MEMRA_BATCH_PP=0", args, 0, NULL);
    assert_null(strstr(err, "note"));
    free(err);
}

/* transport-bench on sim with nothing chosen: small defaults, said in the output, done in seconds. */
static void test_cli_transport_bench_sim_defaults(void **state)
{
    (void)state;
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "timeout 120 '%s' transport-bench --backend sim --json", bin());
    int rc = tu_run(cmd, &out, &err);
    if (rc != 0 || !out) fail_msg("transport-bench --backend sim: exit %d (124: it ran past 120 s): %s", rc, err ? err : "");
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    if (!j) fail_msg("not JSON (%s): %s", je.text, out);
    const char *note = json_string_value(json_object_get(j, "sim_defaults"));
    if (!note || !strstr(note, "sizes 4K..1M")) fail_msg("no sim_defaults note: %s", out);
    assert_int_equal((int)num(j, "iters"), 50);
    json_t *res = json_object_get(j, "results");
    assert_true(json_array_size(res) > 0);
    for (size_t i = 0; i < json_array_size(res); i++) assert_true(num(json_array_get(res, i), "size") <= (1 << 20));
    assert_null(strstr(err, "case 1:")); /* progress only when stderr is a terminal */
    json_decref(j);
    free(out);
    free(err);
    /* everything chosen: no sim defaults */
    snprintf(cmd, sizeof cmd, "'%s' transport-bench --backend sim --devices 0,0 --sizes 8K --iters 3 --warmup 1 "
             "--batch 2 --json", bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    j = json_loads(out, 0, &je);
    assert_non_null(j);
    assert_null(json_object_get(j, "sim_defaults"));
    assert_int_equal((int)num(j, "iters"), 3);
    json_decref(j);
    free(out);
    free(err);
    /* the table says so too; with stderr on a terminal (script(1) gives it one), progress lines */
    snprintf(cmd, sizeof cmd, "'%s' transport-bench --backend sim --devices 0,0 --sizes 4K", bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "sim backend: small defaults"));
    free(out);
    free(err);
    rc = tu_run("command -v script", &out, &err);
    free(out);
    free(err);
    if (rc != 0) skip(); /* no script(1) here: the terminal case is not checked */
    snprintf(cmd, sizeof cmd, "script -qec \"'%s' transport-bench --backend sim --devices 0,0 --sizes 4K --iters 2 "
             ">/dev/null\" /dev/null", bin());
    rc = tu_run(cmd, &out, &err);
    if (rc != 0 || !out || !strstr(out, "transport-bench: case 1: inplace"))
        fail_msg("no progress on a terminal (exit %d): %s", rc, out ? out : "");
    free(out);
    free(err);
}

/* `ppn mkmodel --tokenizer DIR`: the model takes that tokenizer's vocabulary (Llama 2's 32,000 ids, BOS 1, EOS
 * 2) and carries its files, byte for byte; the result loads as a model, a tokenizer and a chat template. */
static void test_cli_mkmodel_tokenizer(void **state)
{
    (void)state;
    char *tok = tu_tmpdir(), *out = tu_tmpdir(), cmd[16384], args[8192], *o = NULL, *e = NULL;
    char fx[4096];   /* tu_fixture's buffer is reused by the next call */
    snprintf(fx, sizeof fx, "%s", tu_fixture("tok/llama2"));
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/special_tokens_map.json' '%s/'"
             " && cp '%s' '%s/chat_template.jinja'", fx, fx, fx, tok, tu_fixture("chat/llama2.jinja"), tok);
    assert_int_equal(tu_run(cmd, &o, &e), 0);
    free(o), free(e);
    snprintf(args, sizeof args, "mkmodel --shape tiny --out '%s/m' --tokenizer '%s'", out, tok);
    int rc = tu_run_ppn("", args, &o, &e, NULL);
    if (rc) fail_msg("ppn mkmodel: exit %d: %s", rc, e);
    free(o), free(e);
    const char *files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"};
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "cmp '%s/%s' '%s/m/%s'", tok, files[i], out, files[i]);
        if (tu_run(cmd, &o, &e)) fail_msg("%s differs or is missing: %s%s", files[i], o, e);
        free(o), free(e);
    }
    char model[4200];
    snprintf(model, sizeof model, "%s/m", out);
    ppn_rt *rt = NULL;
    EXPECT_OK(ppn_rt_create("sim", &rt));
    ppn_model *m = tu_model_load(rt, model, NULL);
    ppn_model_info info;
    ppn_model_get_info(m, &info);
    assert_int_equal(info.vocab, 32000);
    assert_int_equal(info.bos_id, 1);
    assert_int_equal(info.eos_id, 2);
    EXPECT_OK(ppn_model_free(m));
    EXPECT_OK(ppn_rt_destroy(rt));
    ppn_tokenizer *t = NULL;
    EXPECT_OK(ppn_tokenizer_load(model, &t));
    assert_int_equal(ppn_tokenizer_n_ids(t), 32000);
    ppn_tokenizer_free(t);
    ppn_template *tp = NULL;
    char *text = NULL;
    ppn_chat_msg msg = {"user", "hi"};
    EXPECT_OK(ppn_template_load(model, &tp));
    EXPECT_OK(ppn_template_render(tp, &msg, 1, 1, &text));
    assert_string_equal(text, "<s>[INST] hi [/INST]");
    free(text);
    ppn_template_free(tp);
    snprintf(args, sizeof args, "mkmodel --shape tiny --out '%s/n' --tokenizer /nonexistent", out);
    assert_int_equal(tu_run_ppn("", args, &o, &e, NULL), 1);
    assert_non_null(strstr(e, "/nonexistent/tokenizer.json"));
    free(o), free(e);
    tu_rmrf(tok);
    tu_rmrf(out);
    free(tok);
    free(out);
}

/* `ppn run --prompt`: refused without a tokenizer beside the model (exit 1, naming the file), with --ids or
 * --spec, and --chat / --system without it (exit 2); on a random model carrying Llama 2's tokenizer and chat
 * template, the text printed is the detokenized ids (the end token left out), the same bytes through 4 stages,
 * and --json holds the prompt ids the template and tokenizer make. */
/* Rows of out (lines) that start with arm and hold word. */
static int arm_rows(const char *out, const char *arm, const char *word)
{
    int n = 0;
    for (const char *l = out; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char row[4096];
        snprintf(row, sizeof row, "%.*s", (int)(len < sizeof row ? len : sizeof row - 1), l);
        n += !strncmp(row, arm, strlen(arm)) && row[strlen(arm)] == ' ' && strstr(row, word);
        l = e ? e + 1 : l + len;
    }
    return n;
}

/* A fault injected into a step of the split arm: that arm stops at one FAIL row naming the injected failure (no
 * cascade of rows repeating it), the gate says so, the next arm runs all its rows on fresh models and passes,
 * and the last line names the failed arm. The K that lands in a split step is searched (the loads' record
 * counts are the code's business, not this test's). */
static void test_cli_gate_fault_stops_its_arm(void **state)
{
    (void)state;
    char args[2048];
    snprintf(args, sizeof args, "gate --model '%s' --backend sim split pipelined --steps 4 --prompt 2 --max-stages 3",
             g_model);
    char *out = NULL, *err = NULL;
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 0);
    int clean_split = arm_rows(out, "split", "PASS"), clean_pipe = arm_rows(out, "pipelined", "PASS");
    assert_true(clean_split > 4 && clean_pipe > 4);
    free(out);
    free(err);
    int found = 0;
    for (int k = 100; k <= 600 && !found; k += 10) {
        char env[64];
        snprintf(env, sizeof env, "PPN_SIM_FAIL=record:%d", k);
        int rc = tu_run_ppn(env, args, &out, &err, NULL);
        found = arm_rows(out, "split", "stage") == 1; /* a step's failure names its stage */
        if (found) {
            if (rc != 1) fail_msg("%s: exit %d, want 1:\n%s%s", env, rc, out, err);
            if (arm_rows(out, "split", "FAIL") != 1 || arm_rows(out, "split", "injected failure") != 1)
                fail_msg("%s: want one FAIL row naming the injected failure in the split arm:\n%s", env, out);
            if (!strstr(out, "arm 'split' stopped at its first error"))
                fail_msg("%s: the gate does not say the split arm stopped:\n%s", env, out);
            if (arm_rows(out, "pipelined", "PASS") != clean_pipe || arm_rows(out, "pipelined", "FAIL"))
                fail_msg("%s: the pipelined arm did not run clean after the split arm's failure:\n%s", env, out);
            if (!strstr(out, "FAIL (1 failure; failed arms: split)"))
                fail_msg("%s: the last line does not name the failed arm:\n%s", env, out);
        }
        free(out);
        free(err);
    }
    assert_true(found);
}

/* `ppn run` reports every failed record: for each K from 1 until a run that meets no failure (past the run's
 * last record), PPN_SIM_FAIL=record:K makes it exit 1 with a message naming record #K, from the load and the
 * steps through the teardowns (a block retired by the sequence's destroy or the model's free: "sequence
 * teardown", "model teardown"), which a tool must not drop. */
static void test_cli_run_reports_every_failed_record(void **state)
{
    (void)state;
    char args[2048], env[64], want[64];
    snprintf(args, sizeof args, "run --model '%s' --backend sim --ids 1,2,3 -n 4", g_model);
    int k = 1, seq_td = 0, model_td = 0;
    for (;; k++) {
        char *out = NULL, *err = NULL;
        snprintf(env, sizeof env, "PPN_SIM_FAIL=record:%d", k);
        snprintf(want, sizeof want, "injected failure of record #%d", k);
        int rc = tu_run_ppn(env, args, &out, &err, NULL);
        int clean = rc == 0 && err && !strstr(err, "injected failure");
        if (!clean && (rc != 1 || !err || !strstr(err, want)))
            fail_msg("%s: exit %d (want 1), stderr does not name record #%d:\n%s", env, rc, k, err ? err : "");
        seq_td += err && strstr(err, "sequence teardown") != NULL;
        model_td += err && strstr(err, "model teardown") != NULL;
        free(out);
        free(err);
        if (clean) break;
        if (k == 5000) fail_msg("5000 records each failed `ppn run`: the sweep never reached a clean run");
    }
    printf("ppn run: records 1 .. %d each failed once and were reported (%d in the sequence's destroy, %d in the "
           "model's free); record:%d is past the run\n", k - 1, seq_td, model_td, k);
    assert_true(k > 20 && seq_td > 0 && model_td > 0);
}

/* One `ppn gate` of the teardown sweep with PPN_SIM_FAIL=record:k: returns 0 when no record failed (exit 0, the
 * gate PASS), else 1 after checking the failure was reported (exit 1, a FAIL row naming record #k, the verdict
 * FAIL); *out keeps stdout (free it). */
static int gate_record(const char *args, int k, char **out)
{
    char env[64], want[64], *err = NULL;
    snprintf(env, sizeof env, "PPN_SIM_FAIL=record:%d", k);
    snprintf(want, sizeof want, "injected failure of record #%d", k);
    int rc = tu_run_ppn(env, args, out, &err, NULL);
    const char *o = *out ? *out : "";
    int hit = strstr(o, "injected failure") || (err && strstr(err, "injected failure"));
    if (rc == 0 && !hit && strstr(o, "ppn gate: PASS")) {
        free(err);
        return 0;
    }
    if (rc != 1 || !strstr(o, want) || !strstr(o, "ppn gate: FAIL ("))
        fail_msg("%s: exit %d (want 1 with a FAIL row naming record #%d and a FAIL verdict):\n%s%s", env, rc, k, o,
                 err ? err : "");
    free(err);
    return 1;
}

/* `ppn gate` reports a failed record at a teardown: a block retired by the free of the model a row loaded for its
 * placement (a FAIL row of its arm, "model teardown"), or of the shared models (FAIL rows of "teardown", named
 * among the failed arms), turns the gate red and its exit status 1. The run's last record is found by bisection
 * (every probe checked: a failure reported, or a clean PASS), then the records from the end back are failed one by
 * one for the last few and every 8th further, until a row's model teardown is reached: the shared models' frees
 * come last, after the last row's. */
static void test_cli_gate_reports_teardown_records(void **state)
{
    (void)state;
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "gate --model '%s' --backend sim split --steps 2 --prompt 1 --max-stages 2", g_model);
    int lo = 1, hi = 256; /* lo fails (the load records), hi ends clean */
    while (gate_record(args, hi, &out)) {
        free(out);
        lo = hi, hi *= 2;
        if (hi > 1 << 20) fail_msg("ppn gate never ran clean under PPN_SIM_FAIL=record:K");
    }
    free(out);
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        int failed = gate_record(args, mid, &out);
        free(out);
        if (failed) lo = mid;
        else hi = mid;
    }
    int shared = 0, work = 0, row = 0, runs = 0;
    for (int k = lo; k > 0 && !row; k -= k > lo - 4 ? 1 : 8, runs++) {
        if (runs == 40) fail_msg("40 records back from the last (#%d), no row's model teardown was failed", lo);
        if (!gate_record(args, k, &out)) fail_msg("record:%d ran clean, before the last record #%d", k, lo);
        int td = strstr(out, "\nteardown ") != NULL;
        if (td && !strstr(out, "failed arms: teardown)"))
            fail_msg("record:%d: the verdict does not name the teardown:\n%s", k, out);
        shared += td && strstr(out, "reference model") != NULL;
        work += td && strstr(out, "model (door shut)") != NULL;
        row += strstr(out, "\nsplit ") && strstr(out, "FAIL  model teardown: ") && strstr(out, "failed arms: split)");
        free(out);
    }
    printf("ppn gate: record #%d is the last; %d runs back from it failed the reference model's free %d times, the "
           "door-shut model's %d, a row's model %d\n", lo, runs, shared, work, row);
    assert_true(shared > 0 && work > 0 && row > 0);
}

static void test_cli_run_prompt(void **state)
{
    (void)state;
    char args[8192], *o = NULL, *e = NULL;
    snprintf(args, sizeof args, "run --model '%s' --backend sim --prompt hi", g_model);
    free(expect_exit("", args, 1, "ppn: error: run: --prompt needs the checkpoint's tokenizer", "/tiny/tokenizer.json",
                     "--ids", NULL));
    run_refused("", "--chat", "--chat and --system need --prompt");
    run_refused("", "--prompt hi --ids 1,2", "takes no --ids");
    run_refused("", "--prompt hi --spec 2", "takes no --ids, --ids-file, --spec");
    run_refused("", "--prompt hi --system x", "--system needs --chat");
    char *tok = tu_tmpdir(), *dir = tu_tmpdir(), fx[4096], cmd[16384];
    snprintf(fx, sizeof fx, "%s", tu_fixture("tok/llama2"));
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/special_tokens_map.json' '%s/'"
             " && cp '%s' '%s/chat_template.jinja'", fx, fx, fx, tok, tu_fixture("chat/llama2.jinja"), tok);
    assert_int_equal(tu_run(cmd, &o, &e), 0);
    free(o), free(e);
    snprintf(args, sizeof args, "mkmodel --shape tiny --out '%s/m' --tokenizer '%s'", dir, tok);
    assert_int_equal(tu_run_ppn("", args, &o, &e, NULL), 0);
    free(o), free(e);
    char text[2][4096];
    for (int stages = 1; stages <= 4; stages += 3) {
        snprintf(args, sizeof args, "run --model '%s/m' --backend sim --prompt 'Hello there' --chat -n 12 --stages %d",
                 dir, stages);
        int rc = tu_run_ppn("", args, &o, &e, NULL);
        if (rc) fail_msg("ppn %s: exit %d: %s", args, rc, e);
        snprintf(text[stages > 1], sizeof text[0], "%s", o);
        free(o), free(e);
    }
    assert_string_equal(text[0], text[1]);
    snprintf(args, sizeof args, "run --model '%s/m' --backend sim --prompt 'Hello there' --chat -n 12 --json", dir);
    assert_int_equal(tu_run_ppn("", args, &o, &e, NULL), 0);
    json_error_t je;
    json_t *j = json_loads(o, 0, &je), *ids = json_object_get(j, "ids");
    if (!j) fail_msg("--json: %s: %s", je.text, o);
    /* "<s>[INST] Hello there [/INST]": BOS from the template, no second one from the tokenizer */
    json_t *pids = json_object_get(j, "prompt_ids");
    assert_int_equal(json_integer_value(json_array_get(pids, 0)), 1);
    assert_int_not_equal(json_integer_value(json_array_get(pids, 1)), 1);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(j, "stop_ids"), 0)), 2);
    size_t n = json_array_size(ids);
    int v[64], stopped = json_is_true(json_object_get(j, "stopped"));
    for (size_t i = 0; i < n; i++) v[i] = (int)json_integer_value(json_array_get(ids, i));
    ppn_tokenizer *t = NULL;
    EXPECT_OK(ppn_tokenizer_load(tok, &t));
    char want[4096];
    size_t len;
    EXPECT_OK(ppn_detokenize(t, v, (int)n - stopped, want, sizeof want, &len));
    ppn_tokenizer_free(t);
    assert_string_equal(json_string_value(json_object_get(j, "text")), want);
    strcat(want, "\n");
    assert_string_equal(text[0], want);
    json_decref(j);
    free(o), free(e);
    tu_rmrf(tok), tu_rmrf(dir);
    free(tok), free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cli_run_refusals_free_ids),
        cmocka_unit_test(test_cli_plain_numbers),
        cmocka_unit_test(test_cli_control_chars_escaped),
        cmocka_unit_test(test_cli_exit_rule),
        cmocka_unit_test(test_cli_door_flags_need_stages),
        cmocka_unit_test(test_cli_door_env_notice),
        cmocka_unit_test(test_cli_transport_bench_sim_defaults),
        cmocka_unit_test(test_cli_mkmodel_tokenizer),
        cmocka_unit_test(test_cli_run_reports_every_failed_record),
        cmocka_unit_test(test_cli_gate_reports_teardown_records),
        cmocka_unit_test(test_cli_run_prompt),
        cmocka_unit_test(test_cli_gate_fault_stops_its_arm),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
