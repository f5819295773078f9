/* test_env.c - the environment table (core/base/env.h): every kind refuses a bad value with a message naming the
 * variable, the value and the rule, and leaves the output alone; the defaults, and the door's agreeing with
 * ppn_door_default(); empty = unset; the same rules under a flag's name; the check of what is set (gated
 * variables ignored while the door is shut); the fixed defects (PPN_TRACE=x and PPN_PDL=x refused by a sim
 * runtime); `ppn env` (every entry printed, exit status, --json); and no getenv outside core/base/env.c.
 * Every test starts and ends with every variable of the table unset. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/base/env.h"
#include "tests/util/tutil.h"

#ifndef PPN_SOURCE_DIR
#error "CMakeLists.txt passes PPN_SOURCE_DIR, the source tree test_no_getenv_elsewhere scans"
#endif

/* The table's variables are unset around every test (the ppn child processes inherit this environment). */
static int clear_env(void **state)
{
    (void)state;
    for (int i = 0; i < ppn_env_count(); i++) unsetenv(ppn_env_at(i)->name);
    return 0;
}

/* Fails unless the last error message contains s. */
static void msg_has(const char *s)
{
    const char *m = ppn_last_error();
    if (!strstr(m, s)) fail_msg("message \"%s\" lacks \"%s\"", m, s);
}

/* The refusal every kind gives: PPN_EINVAL and "NAME='value': must be RULE". */
static void refused_as(ppn_status st, const char *name, const char *value, const char *rule)
{
    char want[512];
    if (st != PPN_EINVAL) fail_msg("%s='%s': %s, not PPN_EINVAL", name, value, ppn_status_name(st));
    snprintf(want, sizeof want, "%s='%s': must be %s", name, value, rule);
    msg_has(want);
}

/* ---- defaults and empty values ----------------------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    int i = -1, list[PPN_MAX_STAGES], n = -1;
    size_t z = 0;
    const char *s = "x";
    assert_int_equal(ppn_env_int("PPN_SIM_DEVICES", &i), PPN_OK);
    assert_int_equal(i, 4);
    assert_int_equal(ppn_env_size("PPN_SIM_MEM", &z), PPN_OK);
    assert_true(z == (size_t)8 << 30);
    assert_int_equal(ppn_env_int("PPN_SIM_LATENCY", &i), PPN_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ppn_env_flag("PPN_PDL", &i), PPN_OK);
    assert_int_equal(i, 1);
    assert_int_equal(ppn_env_flag("PPN_TRACE", &i), PPN_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ppn_env_flag("PPN_KPROF", &i), PPN_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ppn_env_enum("PPN_PIN", &i), PPN_OK);
    assert_int_equal(i, 0); /* near */
    assert_int_equal(ppn_env_enum("PPN_XPORT_SAME", &i), PPN_OK);
    assert_int_equal(i, 0); /* inplace */
    assert_int_equal(ppn_env_int("MEMRA_PP_STAGES", &i), PPN_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ppn_env_ints("MEMRA_PP_DEVICES", list, PPN_MAX_STAGES, &n), PPN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ppn_env_str("TMPDIR", &s), PPN_OK);
    assert_null(s);
    i = 77; /* MEMRA_PP_SPLIT has no default value: unset leaves the output alone */
    assert_int_equal(ppn_env_int("MEMRA_PP_SPLIT", &i), PPN_OK);
    assert_int_equal(i, 77);
}

/* Every typed default of the table follows its own rule (a bad one would abort in the getter). */
static void test_every_default_parses(void **state)
{
    (void)state;
    for (int k = 0; k < ppn_env_count(); k++) {
        const ppn_env_var *v = ppn_env_at(k);
        int i;
        size_t z;
        assert_non_null(v->doc);
        assert_true(strlen(v->doc) > 0);
        assert_ptr_equal(ppn_env_find(v->name), v);
        if (v->kind == PPN_ENV_FLAG) assert_int_equal(ppn_env_flag(v->name, &i), PPN_OK);
        if (v->kind == PPN_ENV_INT) assert_int_equal(ppn_env_int(v->name, &i), PPN_OK);
        if (v->kind == PPN_ENV_SIZE) assert_int_equal(ppn_env_size(v->name, &z), PPN_OK);
        if (v->kind == PPN_ENV_ENUM) assert_int_equal(ppn_env_enum(v->name, &i), PPN_OK);
        if (v->kind == PPN_ENV_TEXT) assert_non_null(v->syntax);
    }
    assert_null(ppn_env_find("PPN_NOT_A_VARIABLE"));
}

/* The door's 0/1 variables default to what ppn_door_default() says: the table and the struct agree. */
static void test_door_defaults_agree(void **state)
{
    (void)state;
    ppn_door d = ppn_door_default();
    static const struct { const char *name; size_t off; } bits[] = {
        {"MEMRA_PP_SHARD", offsetof(ppn_door, shard)},
        {"MEMRA_PP_STREAMS", offsetof(ppn_door, streams)},
        {"MEMRA_PP_OVERLAP", offsetof(ppn_door, overlap)},
        {"MEMRA_BATCH_PP", offsetof(ppn_door, batch_pp)},
        {"MEMRA_SPEC_PP", offsetof(ppn_door, spec_pp)},
        {"MEMRA_PRIME_PP", offsetof(ppn_door, prime_pp)},
        {"MEMRA_PRIME_PIPE", offsetof(ppn_door, prime_pipe)},
        {"MEMRA_PP_ALLOW_UNSPLIT_BATCH", offsetof(ppn_door, allow_unsplit_batch)},
        {"PPN_SPIN", offsetof(ppn_door, spin)},
        {"PPN_GRAPHS", offsetof(ppn_door, graphs)},
        {"PPN_FUSE", offsetof(ppn_door, fuse)},
        {"PPN_ATTN_TC", offsetof(ppn_door, attn_tc)},
    };
    for (size_t k = 0; k < sizeof bits / sizeof bits[0]; k++) {
        int v = -1;
        assert_int_equal(ppn_env_flag(bits[k].name, &v), PPN_OK);
        if (v != *(const int *)((const char *)&d + bits[k].off))
            fail_msg("%s: the table's default %d is not ppn_door_default()'s", bits[k].name, v);
    }
    int n = -1;
    assert_int_equal(ppn_env_int("MEMRA_PP_STAGES", &n), PPN_OK);
    assert_int_equal(n, d.n_stages);
}

/* An empty value is unset: every variable of the table set to "" reads as its default and checks clean. */
static void test_empty_is_unset(void **state)
{
    (void)state;
    for (int k = 0; k < ppn_env_count(); k++) setenv(ppn_env_at(k)->name, "", 1);
    setenv("MEMRA_PP_STAGES", "2", 1); /* open, so the gated ones are read too */
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    int i = -1, list[PPN_MAX_STAGES], n = -1;
    size_t z = 0;
    const char *s = "x";
    assert_int_equal(ppn_env_flag("PPN_GRAPHS", &i), PPN_OK);
    assert_int_equal(i, 1);
    assert_int_equal(ppn_env_int("PPN_SIM_DEVICES", &i), PPN_OK);
    assert_int_equal(i, 4);
    assert_int_equal(ppn_env_size("PPN_SIM_MEM", &z), PPN_OK);
    assert_true(z == (size_t)8 << 30);
    assert_int_equal(ppn_env_enum("PPN_PIN", &i), PPN_OK);
    assert_int_equal(i, 0);
    assert_int_equal(ppn_env_ints("MEMRA_PP_SPLITS", list, PPN_MAX_STAGES, &n), PPN_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ppn_env_str("PPN_SIM_PEER", &s), PPN_OK);
    assert_null(s);
    ppn_door d;
    assert_int_equal(ppn_door_from_env(&d), PPN_OK);
    assert_int_equal(d.n_stages, 2);
    assert_int_equal(d.n_cuts, 0);
}

/* ---- every kind refuses ------------------------------------------------------------------------------ */

static void test_flag_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {"x", "2", "-1", "01", " 1", "1 ", "yes", "true", "0x1", "10"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int v = 42;
        setenv("PPN_PDL", bad[k], 1);
        refused_as(ppn_env_flag("PPN_PDL", &v), "PPN_PDL", bad[k], "0 or 1");
        assert_int_equal(v, 42);
    }
    int v = -1;
    setenv("PPN_PDL", "0", 1);
    assert_int_equal(ppn_env_flag("PPN_PDL", &v), PPN_OK);
    assert_int_equal(v, 0);
    setenv("PPN_PDL", "1", 1);
    assert_int_equal(ppn_env_flag("PPN_PDL", &v), PPN_OK);
    assert_int_equal(v, 1);
}

static void test_int_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {"0", "65", "2x", "-1", "+2", " 2", "2 ", "0x2", "1.5", "",
                                      "99999999999999999999", "18446744073709551617"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int v = 42;
        if (!*bad[k]) continue; /* empty is unset: see test_empty_is_unset */
        setenv("PPN_SIM_DEVICES", bad[k], 1);
        refused_as(ppn_env_int("PPN_SIM_DEVICES", &v), "PPN_SIM_DEVICES", bad[k], "a whole number from 1 to 64");
        assert_int_equal(v, 42);
    }
    int v = -1;
    setenv("PPN_SIM_DEVICES", "064", 1); /* leading zeros are digits too */
    assert_int_equal(ppn_env_int("PPN_SIM_DEVICES", &v), PPN_OK);
    assert_int_equal(v, 64);
    /* A floor of 0 reads "at most", as the door's messages always have. */
    setenv("MEMRA_PP_STAGES", "65", 1);
    refused_as(ppn_env_int("MEMRA_PP_STAGES", &v), "MEMRA_PP_STAGES", "65", "a whole number at most 64");
    setenv("PPN_SIM_LATENCY", "1001", 1);
    refused_as(ppn_env_int("PPN_SIM_LATENCY", &v), "PPN_SIM_LATENCY", "1001", "a whole number at most 1000");
    setenv("PPN_SIM_LATENCY", "1000", 1);
    assert_int_equal(ppn_env_int("PPN_SIM_LATENCY", &v), PPN_OK);
    assert_int_equal(v, 1000);
}

static void test_size(void **state)
{
    (void)state;
    static const struct { const char *text; size_t bytes; } good[] = {
        {"8", 8}, {"64k", 64 << 10}, {"64K", 64 << 10}, {"3m", (size_t)3 << 20}, {"2G", (size_t)2 << 30},
        {"1t", (size_t)1 << 40}, {"0008G", (size_t)8 << 30},
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        size_t z = 0;
        setenv("PPN_SIM_MEM", good[k].text, 1);
        assert_int_equal(ppn_env_size("PPN_SIM_MEM", &z), PPN_OK);
        if (z != good[k].bytes) fail_msg("PPN_SIM_MEM=%s: %zu bytes, not %zu", good[k].text, z, good[k].bytes);
    }
    static const char *const bad[] = {"12X", "0", "0G", "G", "1GG", "1 G", "-1", "1.5G", "8E", "9999999999T",
                                      "99999999999999999999", "8G "};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        size_t z = 42;
        setenv("PPN_SIM_MEM", bad[k], 1);
        refused_as(ppn_env_size("PPN_SIM_MEM", &z), "PPN_SIM_MEM", bad[k], "a positive number of bytes");
        msg_has("K, M, G or T");
        assert_true(z == 42);
    }
}

static void test_enum_refused(void **state)
{
    (void)state;
    static const char *const pins[] = {"near", "far", "none"};
    for (int k = 0; k < 3; k++) {
        int v = -1;
        setenv("PPN_PIN", pins[k], 1);
        assert_int_equal(ppn_env_enum("PPN_PIN", &v), PPN_OK);
        assert_int_equal(v, k);
    }
    static const char *const bad[] = {"bogus", "NEAR", "near ", "0", "nearfar"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        int v = 42;
        setenv("PPN_PIN", bad[k], 1);
        refused_as(ppn_env_enum("PPN_PIN", &v), "PPN_PIN", bad[k], "near, far or none");
        assert_int_equal(v, 42);
    }
    int v = -1;
    setenv("PPN_XPORT_SAME", "dtod", 1);
    assert_int_equal(ppn_env_enum("PPN_XPORT_SAME", &v), PPN_OK);
    assert_int_equal(v, 1);
    setenv("PPN_XPORT_SAME", "copy", 1);
    refused_as(ppn_env_enum("PPN_XPORT_SAME", &v), "PPN_XPORT_SAME", "copy", "inplace or dtod");
    setenv("PPN_BACKEND", "gpu", 1);
    refused_as(ppn_env_check(ppn_env_find("PPN_BACKEND")), "PPN_BACKEND", "gpu", "auto, cuda or sim");
}

static void test_ints_refused(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    int list[PPN_MAX_STAGES], n = -1;
    setenv("MEMRA_PP_DEVICES", "3,1,0003", 1);
    assert_int_equal(ppn_env_ints("MEMRA_PP_DEVICES", list, PPN_MAX_STAGES, &n), PPN_OK);
    assert_int_equal(n, 3);
    assert_int_equal(list[0], 3);
    assert_int_equal(list[1], 1);
    assert_int_equal(list[2], 3);
    static const char *const bad[] = {"a", "1,,2", "1,", ",1", ",", "-1,2", "1, 2", "1;2", "1,2x", "+1",
                                      "1,99999999999999999999", "2147483648"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        n = 42;
        setenv("MEMRA_PP_DEVICES", bad[k], 1);
        refused_as(ppn_env_ints("MEMRA_PP_DEVICES", list, PPN_MAX_STAGES, &n), "MEMRA_PP_DEVICES", bad[k],
                   "a comma-separated list of at most 64 whole numbers");
        assert_int_equal(n, 42);
    }
    /* 63 cuts are the most MEMRA_PP_SPLITS holds. */
    char cuts[PPN_MAX_STAGES * 4] = "1";
    for (int k = 2; k < PPN_MAX_STAGES; k++) sprintf(cuts + strlen(cuts), ",%d", k);
    setenv("MEMRA_PP_SPLITS", cuts, 1);
    assert_int_equal(ppn_env_ints("MEMRA_PP_SPLITS", list, PPN_MAX_STAGES, &n), PPN_OK);
    assert_int_equal(n, PPN_MAX_STAGES - 1);
    strcat(cuts, ",64");
    setenv("MEMRA_PP_SPLITS", cuts, 1);
    refused_as(ppn_env_ints("MEMRA_PP_SPLITS", list, PPN_MAX_STAGES, &n), "MEMRA_PP_SPLITS", cuts,
               "a comma-separated list of at most 63 whole numbers");
}

/* A value longer than the message can quote is cut with "...", and the rule still ends the message. */
static void test_long_value_quoted_short(void **state)
{
    (void)state;
    char v[700];
    memset(v, 'x', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    setenv("PPN_PIN", v, 1);
    int i;
    assert_int_equal(ppn_env_enum("PPN_PIN", &i), PPN_EINVAL);
    msg_has("PPN_PIN='xxx");
    msg_has("...': must be near, far or none");
}

/* The rule of a variable applied to a flag's text names the flag, not the variable. */
static void test_parse_as_flag(void **state)
{
    (void)state;
    int v = 42, list[PPN_MAX_STAGES], n = 42;
    refused_as(ppn_env_parse_int("MEMRA_PP_STAGES", "--stages", "x", &v), "--stages", "x",
               "a whole number at most 64");
    assert_null(strstr(ppn_last_error(), "MEMRA_PP_STAGES"));
    refused_as(ppn_env_parse_int("MEMRA_PP_STAGES", "--stages", "", &v), "--stages", "", "a whole number");
    refused_as(ppn_env_parse_flag("PPN_SPIN", "--spin", "on", &v), "--spin", "on", "0 or 1");
    refused_as(ppn_env_parse_ints("MEMRA_PP_DEVICES", "--devices", "1,,2", list, PPN_MAX_STAGES, &n), "--devices",
               "1,,2", "a comma-separated list");
    assert_int_equal(v, 42);
    assert_int_equal(n, 42);
    assert_int_equal(ppn_env_parse_int("MEMRA_PP_STAGES", "--stages", "3", &v), PPN_OK);
    assert_int_equal(v, 3);
    /* The environment is not read: the flag's text is all there is. */
    setenv("MEMRA_PP_STAGES", "junk", 1);
    assert_int_equal(ppn_env_parse_int("MEMRA_PP_STAGES", "--stages", "5", &v), PPN_OK);
    assert_int_equal(v, 5);
}

/* ---- checking what is set ---------------------------------------------------------------------------- */

static void test_check_all(void **state)
{
    (void)state;
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    /* Gated variables are not read while the door is shut, so their garbage is not refused either. */
    setenv("MEMRA_PP_SPLITS", "junk", 1);
    setenv("MEMRA_PP_OVERLAP", "yes", 1);
    assert_true(ppn_env_ignored(ppn_env_find("MEMRA_PP_SPLITS")));
    assert_false(ppn_env_ignored(ppn_env_find("PPN_SPIN")));
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    setenv("MEMRA_PP_STAGES", "1", 1);
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    setenv("MEMRA_PP_STAGES", "2", 1);
    assert_false(ppn_env_ignored(ppn_env_find("MEMRA_PP_SPLITS")));
    refused_as(ppn_env_check_all(), "MEMRA_PP_SPLITS", "junk", "a comma-separated list");
    unsetenv("MEMRA_PP_SPLITS");
    refused_as(ppn_env_check_all(), "MEMRA_PP_OVERLAP", "yes", "0 or 1");
    unsetenv("MEMRA_PP_OVERLAP");
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    /* TEXT values are their readers' to check. */
    setenv("PPN_SIM_PEER", "junk", 1);
    setenv("TMPDIR", "/nonexistent", 1);
    assert_int_equal(ppn_env_check_all(), PPN_OK);
    setenv("PPN_TRACE", "x", 1);
    refused_as(ppn_env_check_all(), "PPN_TRACE", "x", "0 or 1");
}

/* ---- the defects fixed ------------------------------------------------------------------------------- */

/* A runtime is refused with the variable's message, and none is returned. */
static void rt_refused(const char *name, const char *value)
{
    ppn_rt *rt = (ppn_rt *)0x1;
    setenv(name, value, 1);
    ppn_status st = ppn_rt_create("sim", &rt);
    unsetenv(name);
    refused_as(st, name, value, "0 or 1");
    assert_null(rt);
}

static void rt_accepted(const char *name, const char *value)
{
    ppn_rt *rt = NULL;
    setenv(name, value, 1);
    ppn_status st = ppn_rt_create("sim", &rt);
    unsetenv(name);
    if (st != PPN_OK) fail_msg("%s=%s: %s: %s", name, value, ppn_status_name(st), ppn_last_error());
    ppn_rt_destroy(rt);
}

/* PPN_TRACE accepted anything (and "x" turned tracing on). */
static void test_trace_refused(void **state)
{
    (void)state;
    static const char *const bad[] = {"x", "yes", "2", " 1"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) rt_refused("PPN_TRACE", bad[k]);
    rt_accepted("PPN_TRACE", "0");
    rt_accepted("PPN_TRACE", "");
}

/* PPN_PDL was read by the cuda backend only: the sim took PPN_PDL=x. */
static void test_pdl_refused_on_sim(void **state)
{
    (void)state;
    rt_refused("PPN_PDL", "x");
    rt_refused("PPN_PDL", "on");
    rt_accepted("PPN_PDL", "0");
    rt_accepted("PPN_PDL", "1");
}

/* ---- ppn env ----------------------------------------------------------------------------------------- */

/* `ppn env <args>` with the environment prefix env (the test's own environment has every variable unset). */
static int ppn_env(const char *env, const char *args, char **out, char **err)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s '%s' env %s", env, bin(), args);
    int rc = tu_run(cmd, out, err);
    if (!*out || !*err) fail_msg("%s: no output captured", cmd);
    return rc;
}

static void test_ppn_env_prints_every_entry(void **state)
{
    (void)state;
    char *out, *err, rule[256];
    assert_int_equal(ppn_env("", "", &out, &err), 0);
    for (int k = 0; k < ppn_env_count(); k++) {
        const ppn_env_var *v = ppn_env_at(k);
        if (!strstr(out, v->name)) fail_msg("ppn env lacks %s", v->name);
        if (!strstr(out, v->doc)) fail_msg("ppn env lacks the doc of %s", v->name);
        if (!strstr(out, ppn_env_rule(v, rule, sizeof rule))) fail_msg("ppn env lacks the rule of %s", v->name);
    }
    assert_non_null(strstr(out, "(none of them)"));
    free(out);
    free(err);
    /* `ppn help env` is the same command. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' help env", bin());
    assert_int_equal(tu_run(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "PPN_SIM_LATENCY"));
    free(out);
    free(err);
}

static void test_ppn_env_checks_what_is_set(void **state)
{
    (void)state;
    char *out, *err;
    assert_int_equal(ppn_env("PPN_SIM_DEVICES=2 PPN_SIM_PEER=0-1 MEMRA_PP_SPLITS=junk", "", &out, &err), 0);
    assert_non_null(strstr(out, "PPN_SIM_DEVICES=2\n    ok"));
    assert_non_null(strstr(out, "PPN_SIM_PEER=0-1\n    not checked here"));
    assert_non_null(strstr(out, "MEMRA_PP_SPLITS=junk\n    ignored"));
    free(out);
    free(err);
    assert_int_equal(ppn_env("PPN_PDL=x PPN_SIM_DEVICES=2", "", &out, &err), 1);
    assert_non_null(strstr(out, "PPN_PDL=x\n    INVALID: PPN_PDL='x': must be 0 or 1"));
    free(out);
    free(err);
    /* Each variable valid, the door's reading of them not. */
    assert_int_equal(ppn_env("MEMRA_PP_STAGES=3 MEMRA_PP_SPLIT=2", "", &out, &err), 1);
    assert_non_null(strstr(out, "the door: INVALID: MEMRA_PP_SPLIT='2'"));
    free(out);
    free(err);
    assert_int_equal(ppn_env("", "--bogus", &out, &err), 2);
    assert_non_null(strstr(err, "ppn: error: env: unknown option '--bogus'"));
    free(out);
    free(err);
}

static json_t *env_json(const char *env, int want_rc)
{
    char *out, *err;
    assert_int_equal(ppn_env(env, "--json", &out, &err), want_rc);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j) fail_msg("ppn env --json: %s: %s", e.text, out);
    free(out);
    free(err);
    return j;
}

static void test_ppn_env_json(void **state)
{
    (void)state;
    json_t *j = env_json("", 0);
    json_t *vars = json_object_get(j, "variables");
    assert_int_equal((int)json_array_size(vars), ppn_env_count());
    for (int k = 0; k < ppn_env_count(); k++) {
        json_t *o = json_array_get(vars, (size_t)k);
        assert_string_equal(json_string_value(json_object_get(o, "name")), ppn_env_at(k)->name);
        assert_string_equal(json_string_value(json_object_get(o, "state")), "unset");
        assert_true(json_is_null(json_object_get(o, "value")));
    }
    assert_true(json_is_true(json_object_get(j, "valid")));
    assert_true(json_is_null(json_object_get(j, "door_error")));
    json_decref(j);
    j = env_json("PPN_KPROF=2", 1);
    assert_true(json_is_false(json_object_get(j, "valid")));
    vars = json_object_get(j, "variables");
    for (size_t k = 0; k < json_array_size(vars); k++) {
        json_t *o = json_array_get(vars, k);
        if (strcmp(json_string_value(json_object_get(o, "name")), "PPN_KPROF")) continue;
        assert_string_equal(json_string_value(json_object_get(o, "state")), "invalid");
        assert_string_equal(json_string_value(json_object_get(o, "value")), "2");
        assert_string_equal(json_string_value(json_object_get(o, "error")), "PPN_KPROF='2': must be 0 or 1");
    }
    json_decref(j);
}

/* ---- no getenv outside env.c --------------------------------------------------------------------------- */

/* Lines of path that call getenv (the name followed by an opening parenthesis), appended to report. */
static int getenv_calls(const char *path, const char *rel, char *report, size_t cap)
{
    size_t n;
    char *text = tu_read_file(path, &n);
    if (!text) fail_msg("cannot read %s", path);
    int calls = 0, line = 1;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n') line++;
        if (strncmp(text + i, "getenv", 6) != 0) continue;
        size_t j = i + 6;
        while (j < n && (text[j] == ' ' || text[j] == '\t')) j++;
        if (j < n && text[j] == '(') {
            calls++;
            size_t k = strlen(report);
            if (snprintf(report + k, cap - k, " %s:%d", rel, line) >= (int)(cap - k)) break; /* full: enough */
        }
    }
    free(text);
    return calls;
}

static int source_file(const char *name)
{
    static const char *const ext[] = {".c", ".h", ".cu", ".cuh", ".cc", ".cpp"};
    size_t l = strlen(name);
    for (size_t k = 0; k < sizeof ext / sizeof ext[0]; k++) {
        size_t e = strlen(ext[k]);
        if (l > e && !strcmp(name + l - e, ext[k])) return 1;
    }
    return 0;
}

/* Walk dir (rel from the source root), adding getenv calls outside env.c to report;
 * *env_c counts env.c's own (there must be one: proof the scan sees calls). */
static void scan(const char *root, const char *rel, char *report, size_t cap, int *env_c, int *files)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    if (!d) return; /* a directory this tree does not have */
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char sub[PATH_MAX], full[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name) >= (int)sizeof sub ||
            snprintf(full, sizeof full, "%s/%s", root, sub) >= (int)sizeof full)
            fail_msg("%s/%s/%s: path too long", root, rel, e->d_name);
        struct stat st;
        if (stat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            scan(root, sub, report, cap, env_c, files);
        } else if (S_ISREG(st.st_mode) && source_file(e->d_name)) {
            char scratch[4096] = "";
            int calls = getenv_calls(full, sub, scratch, sizeof scratch);
            ++*files;
            if (!strcmp(sub, "core/base/env.c")) *env_c += calls;
            else snprintf(report + strlen(report), cap - strlen(report), "%s", scratch);
        }
    }
    closedir(d);
}

static void test_no_getenv_elsewhere(void **state)
{
    (void)state;
    static const char *const dirs[] = {"core", "alloc", "sched", "transport", "kernels", "tools", "include"};
    char report[8192] = "";
    int env_c = 0, files = 0;
    for (size_t k = 0; k < sizeof dirs / sizeof dirs[0]; k++)
        scan(PPN_SOURCE_DIR, dirs[k], report, sizeof report, &env_c, &files);
    assert_true(files > 20);
    assert_int_equal(env_c, 1);
    if (report[0])
        fail_msg("getenv outside core/base/env.c (read the variable through core/base/env.h and add it to the "
                 "table):%s", report);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, clear_env, clear_env)
    const struct CMUnitTest tests[] = {
        T(test_defaults),
        T(test_every_default_parses),
        T(test_door_defaults_agree),
        T(test_empty_is_unset),
        T(test_flag_refused),
        T(test_int_refused),
        T(test_size),
        T(test_enum_refused),
        T(test_ints_refused),
        T(test_long_value_quoted_short),
        T(test_parse_as_flag),
        T(test_check_all),
        T(test_trace_refused),
        T(test_pdl_refused_on_sim),
        T(test_ppn_env_prints_every_entry),
        T(test_ppn_env_checks_what_is_set),
        T(test_ppn_env_json),
        T(test_no_getenv_elsewhere),
    };
#undef T
    return cmocka_run_group_tests(tests, clear_env, clear_env);
}
