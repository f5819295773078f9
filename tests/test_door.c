/* test_door.c - the door (include/ppn.h): defaults, the shut door ignoring everything else, every refusal of
 * every variable and flag (status and message), even-split fences worked out by hand, explicit cuts, the N=2
 * spelling, devices, the 0/1 seams, and CLI flags overriding the environment. The flags are the command line's
 * (tools/cli_door.c, compiled into this test). Every test starts and ends with every door variable unset. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "tools/cli.h"

static const char *const door_vars[] = {
    "MEMRA_PP_STAGES", "MEMRA_PP_SPLITS", "MEMRA_PP_SPLIT", "MEMRA_PP_DEVICES", "MEMRA_PP_SHARD",
    "MEMRA_PP_STREAMS", "MEMRA_PP_OVERLAP", "MEMRA_BATCH_PP", "MEMRA_SPEC_PP", "MEMRA_PRIME_PP",
    "MEMRA_PRIME_PIPE", "MEMRA_PP_ALLOW_UNSPLIT_BATCH", "PPN_SPIN",
    "PPN_GRAPHS", "PPN_FUSE", "PPN_ATTN_TC",
};
#define N_VARS (sizeof door_vars / sizeof door_vars[0])

/* The seams read only with the door open, with the field each sets. */
typedef struct seam { const char *var; size_t off; int def; } seam;
static const seam seams[] = {
    {"MEMRA_PP_SHARD", offsetof(ppn_door, shard), 1},
    {"MEMRA_PP_STREAMS", offsetof(ppn_door, streams), 1},
    {"MEMRA_PP_OVERLAP", offsetof(ppn_door, overlap), 0},
    {"MEMRA_BATCH_PP", offsetof(ppn_door, batch_pp), 1},
    {"MEMRA_SPEC_PP", offsetof(ppn_door, spec_pp), 1},
    {"MEMRA_PRIME_PP", offsetof(ppn_door, prime_pp), 1},
    {"MEMRA_PRIME_PIPE", offsetof(ppn_door, prime_pipe), 1},
    {"MEMRA_PP_ALLOW_UNSPLIT_BATCH", offsetof(ppn_door, allow_unsplit_batch), 0},
};
#define N_SEAMS (sizeof seams / sizeof seams[0])

static const seam flag_bits[] = {
    {"--shard", offsetof(ppn_door, shard), 1},
    {"--streams", offsetof(ppn_door, streams), 1},
    {"--overlap", offsetof(ppn_door, overlap), 0},
    {"--spin", offsetof(ppn_door, spin), 0},
    {"--graphs", offsetof(ppn_door, graphs), 1},
    {"--fuse", offsetof(ppn_door, fuse), 1},
    {"--attn-tc", offsetof(ppn_door, attn_tc), 1},
};
#define N_FLAG_BITS (sizeof flag_bits / sizeof flag_bits[0])

static const char *const bad_bits[] = {"yes", "2", "-1", "01", " 1", "1 ", "true", "0x1", "10"};
#define N_BAD_BITS (sizeof bad_bits / sizeof bad_bits[0])

static const char *const bad_numbers[] = {"abc", "-1", "+2", " 2", "2 ", "2x", "0x2", "1.5", "2,",
                                          "99999999999999999999", "2147483648"};
#define N_BAD_NUMBERS (sizeof bad_numbers / sizeof bad_numbers[0])

static const char *const bad_lists[] = {"a", "1,,2", "1,", ",1", ",", "-1,2", "1, 2", "1;2", "1,2x", "+1",
                                        "1,99999999999999999999"};
#define N_BAD_LISTS (sizeof bad_lists / sizeof bad_lists[0])

static int clear_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_VARS; i++) unsetenv(door_vars[i]);
    return 0;
}

static int field(const ppn_door *d, size_t off) { return *(const int *)((const char *)d + off); }

/* Fails unless the last error message contains s. */
static void msg_has(const char *s)
{
    const char *m = ppn_last_error();
    if (!strstr(m, s)) fail_msg("message \"%s\" lacks \"%s\"", m, s);
}

/* A door full of values no parse produces, to prove a refusal leaves it untouched. */
static ppn_door sentinel_door(void)
{
    ppn_door d;
    memset(&d, 0x5a, sizeof d);
    return d;
}

static void assert_door_untouched(const ppn_door *d)
{
    ppn_door s = sentinel_door();
    assert_memory_equal(d, &s, sizeof s);
}

/* from_env must refuse, name every string in names and val in its message, and leave the door as it was. */
static void env_refused(const char *val, const char *name1, const char *name2)
{
    ppn_door d = sentinel_door();
    assert_int_equal(ppn_door_from_env(&d), PPN_EINVAL);
    msg_has(name1);
    if (name2) msg_has(name2);
    msg_has(val);
    assert_door_untouched(&d);
}

static void flag_refused(const char *flag, const char *val)
{
    ppn_door d = sentinel_door();
    assert_int_equal(cli_door_set_flag(&d, flag, val), PPN_EINVAL);
    msg_has(flag);
    msg_has(val);
    assert_door_untouched(&d);
}

/* Resolve must succeed with exactly the fence and devices given. */
static void resolves_to(const ppn_door *d, int n_layers, int n_devices, int primary, int n, const int *fence,
                        const int *devs)
{
    int f[PPN_MAX_STAGES + 1], sd[PPN_MAX_STAGES], n_out = -1;
    ppn_status st = ppn_door_resolve(d, n_layers, n_devices, primary, f, sd, &n_out);
    if (st != PPN_OK) fail_msg("resolve: %s: %s", ppn_status_name(st), ppn_last_error());
    assert_int_equal(n_out, n);
    assert_memory_equal(f, fence, (size_t)(n + 1) * sizeof *f);
    assert_memory_equal(sd, devs, (size_t)n * sizeof *sd);
}

/* Resolve must refuse with PPN_EINVAL, the message holding a and b, and write no output. */
static void resolve_refused(const ppn_door *d, int n_layers, int n_devices, int primary, const char *a,
                            const char *b)
{
    int f[PPN_MAX_STAGES + 1], sd[PPN_MAX_STAGES], n_out = -7;
    memset(f, 0x5a, sizeof f);
    memset(sd, 0x5a, sizeof sd);
    assert_int_equal(ppn_door_resolve(d, n_layers, n_devices, primary, f, sd, &n_out), PPN_EINVAL);
    msg_has(a);
    if (b) msg_has(b);
    assert_int_equal(n_out, -7);
    for (size_t i = 0; i < PPN_MAX_STAGES; i++) assert_int_equal(sd[i], 0x5a5a5a5a);
    for (size_t i = 0; i <= PPN_MAX_STAGES; i++) assert_int_equal(f[i], 0x5a5a5a5a);
}

static ppn_door env_door(void)
{
    ppn_door d = sentinel_door();
    ppn_status st = ppn_door_from_env(&d);
    if (st != PPN_OK) fail_msg("from_env: %s: %s", ppn_status_name(st), ppn_last_error());
    return d;
}

static void set_flag_ok(ppn_door *d, const char *flag, const char *v)
{
    ppn_status st = cli_door_set_flag(d, flag, v);
    if (st != PPN_OK) fail_msg("set_flag %s %s: %s: %s", flag, v, ppn_status_name(st), ppn_last_error());
}

/* ---- defaults and the shut door ------------------------------------------------------------------------ */

/* Every field at its default except n_stages, which a shut door leaves at 0 or 1 as spelled. */
static void assert_shut(const ppn_door *d, int n_stages)
{
    assert_int_equal(d->n_stages, n_stages);
    assert_int_equal(d->n_cuts, 0);
    assert_int_equal(d->n_devices, 0);
    for (size_t i = 0; i < N_SEAMS; i++) assert_int_equal(field(d, seams[i].off), seams[i].def);
    assert_int_equal(d->spin, 0);
    assert_int_equal(d->graphs, 1);
    assert_int_equal(d->fuse, 1);
}

static void assert_defaults(const ppn_door *d) { assert_shut(d, 0); }

static void test_defaults(void **state)
{
    (void)state;
    ppn_door d = ppn_door_default();
    assert_defaults(&d);
    assert_int_equal(d.shard, 1);
    assert_int_equal(d.streams, 1);
    assert_int_equal(d.overlap, 0);
    ppn_door e = env_door();
    assert_defaults(&e);
    int fence[] = {0, 6}, dev[] = {2};
    resolves_to(&d, 6, 4, 2, 1, fence, dev);
    resolves_to(&e, 6, 4, 2, 1, fence, dev);
}

/* With MEMRA_PP_STAGES unset, empty, 0 or 1, garbage everywhere else is neither read nor checked. */
static void test_shut_ignores_garbage(void **state)
{
    (void)state;
    const char *shut[] = {NULL, "", "0", "1", "00", "01"};
    const int n_shut[] = {0, 0, 0, 1, 0, 1};
    for (size_t k = 0; k < sizeof shut / sizeof shut[0]; k++) {
        clear_env(NULL);
        if (shut[k]) setenv("MEMRA_PP_STAGES", shut[k], 1);
        setenv("MEMRA_PP_SPLITS", "junk,,", 1);
        setenv("MEMRA_PP_SPLIT", "x", 1);
        setenv("MEMRA_PP_DEVICES", "-3", 1);
        for (size_t i = 0; i < N_SEAMS; i++) setenv(seams[i].var, "yes", 1);
        ppn_door d = env_door();
        assert_shut(&d, n_shut[k]);
        int fence[] = {0, 5}, dev[] = {0};
        resolves_to(&d, 5, 1, 0, 1, fence, dev);
    }
    /* Even valid values are ignored while shut. */
    clear_env(NULL);
    setenv("MEMRA_PP_STAGES", "1", 1);
    setenv("MEMRA_PP_SPLITS", "2", 1);
    setenv("MEMRA_PP_DEVICES", "1", 1);
    setenv("MEMRA_PP_OVERLAP", "1", 1);
    ppn_door d = env_door();
    assert_shut(&d, 1);
}

/* PPN_SPIN and PPN_GRAPHS are ppn's own: read (and checked) whether the door is open or shut. */
static void test_spin_always_read(void **state)
{
    (void)state;
    setenv("PPN_GRAPHS", "0", 1);
    ppn_door g = env_door();
    assert_int_equal(g.graphs, 0);
    assert_int_equal(g.n_stages, 0);
    for (size_t i = 0; i < N_BAD_BITS; i++) {
        setenv("PPN_GRAPHS", bad_bits[i], 1);
        env_refused(bad_bits[i], "PPN_GRAPHS", "must be 0 or 1");
    }
    unsetenv("PPN_GRAPHS");
    setenv("PPN_FUSE", "0", 1);
    assert_int_equal(env_door().fuse, 0);
    setenv("PPN_FUSE", "yes", 1);
    env_refused("yes", "PPN_FUSE", "must be 0 or 1");
    unsetenv("PPN_FUSE");
    setenv("PPN_ATTN_TC", "0", 1);
    assert_int_equal(env_door().attn_tc, 0);
    assert_int_equal(env_door().n_stages, 0);
    setenv("PPN_ATTN_TC", "2", 1);
    env_refused("2", "PPN_ATTN_TC", "must be 0 or 1");
    unsetenv("PPN_ATTN_TC");
    assert_int_equal(env_door().attn_tc, 1);
    setenv("PPN_SPIN", "1", 1);
    ppn_door d = env_door();
    assert_int_equal(d.spin, 1);
    assert_int_equal(d.n_stages, 0);
    setenv("PPN_SPIN", "0", 1);
    d = env_door();
    assert_int_equal(d.spin, 0);
    for (size_t i = 0; i < N_BAD_BITS; i++) {
        setenv("PPN_SPIN", bad_bits[i], 1);
        env_refused(bad_bits[i], "PPN_SPIN", "must be 0 or 1");
    }
    setenv("MEMRA_PP_STAGES", "2", 1);
    setenv("PPN_SPIN", "on", 1);
    env_refused("on", "PPN_SPIN", NULL);
}

/* ---- syntax refusals ------------------------------------------------------------------------------------ */

static void test_bad_stages(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_BAD_NUMBERS; i++) {
        setenv("MEMRA_PP_STAGES", bad_numbers[i], 1);
        env_refused(bad_numbers[i], "MEMRA_PP_STAGES", "whole number");
        flag_refused("--stages", bad_numbers[i]);
    }
    setenv("MEMRA_PP_STAGES", "65", 1);
    env_refused("65", "MEMRA_PP_STAGES", "at most 64");
    flag_refused("--stages", "65");
    setenv("MEMRA_PP_STAGES", "64", 1);
    ppn_door d = env_door();
    assert_int_equal(d.n_stages, 64);
}

static void test_bad_splits(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "3", 1);
    for (size_t i = 0; i < N_BAD_LISTS; i++) {
        setenv("MEMRA_PP_SPLITS", bad_lists[i], 1);
        env_refused(bad_lists[i], "MEMRA_PP_SPLITS", "whole number");
        flag_refused("--splits", bad_lists[i]);
    }
    /* 63 cuts are the most a 64-stage door has; 64 are refused by syntax alone. */
    char list[PPN_MAX_STAGES * 4] = "";
    for (int i = 1; i < PPN_MAX_STAGES; i++) sprintf(list + strlen(list), i > 1 ? ",%d" : "%d", i);
    setenv("MEMRA_PP_SPLITS", list, 1);
    ppn_door d = env_door();
    assert_int_equal(d.n_cuts, PPN_MAX_STAGES - 1);
    assert_int_equal(d.cuts[PPN_MAX_STAGES - 2], PPN_MAX_STAGES - 1);
    strcat(list, ",64");
    setenv("MEMRA_PP_SPLITS", list, 1);
    env_refused(list, "MEMRA_PP_SPLITS", "at most 63");
    flag_refused("--splits", list);
}

static void test_bad_split(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    for (size_t i = 0; i < N_BAD_NUMBERS; i++) {
        setenv("MEMRA_PP_SPLIT", bad_numbers[i], 1);
        env_refused(bad_numbers[i], "MEMRA_PP_SPLIT", "whole number");
        flag_refused("--split", bad_numbers[i]);
    }
}

static void test_bad_devices(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    for (size_t i = 0; i < N_BAD_LISTS; i++) {
        setenv("MEMRA_PP_DEVICES", bad_lists[i], 1);
        env_refused(bad_lists[i], "MEMRA_PP_DEVICES", "whole number");
        flag_refused("--devices", bad_lists[i]);
    }
    char list[PPN_MAX_STAGES * 4] = "0";
    for (int i = 1; i <= PPN_MAX_STAGES; i++) strcat(list, ",0");
    setenv("MEMRA_PP_DEVICES", list, 1);
    env_refused(list, "MEMRA_PP_DEVICES", "at most 64");
    flag_refused("--devices", list);
}

static void test_bad_seams(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    for (size_t s = 0; s < N_SEAMS; s++) {
        for (size_t i = 0; i < N_BAD_BITS; i++) {
            setenv(seams[s].var, bad_bits[i], 1);
            env_refused(bad_bits[i], seams[s].var, "must be 0 or 1");
        }
        unsetenv(seams[s].var);
    }
    for (size_t s = 0; s < N_FLAG_BITS; s++)
        for (size_t i = 0; i < N_BAD_BITS; i++) flag_refused(flag_bits[s].var, bad_bits[i]);
}

static void test_bad_flag_names_and_empty(void **state)
{
    (void)state;
    const char *flags[] = {"--stages", "--splits", "--split", "--devices", "--shard", "--streams", "--overlap",
                           "--spin"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        ppn_door d = sentinel_door();
        assert_int_equal(cli_door_set_flag(&d, flags[i], ""), PPN_EINVAL);
        msg_has(flags[i]);
        assert_door_untouched(&d);
        assert_int_equal(cli_door_set_flag(&d, flags[i], NULL), PPN_EINVAL);
        assert_door_untouched(&d);
    }
    const char *unknown[] = {"--stage", "--bogus", "stages", "", "--STAGES", "--batch-pp"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        ppn_door d = sentinel_door();
        assert_int_equal(cli_door_set_flag(&d, unknown[i], "1"), PPN_EINVAL);
        msg_has("unknown");
        msg_has(unknown[i]);
        assert_door_untouched(&d);
    }
    ppn_door d = ppn_door_default();
    assert_int_equal(cli_door_set_flag(&d, NULL, "1"), PPN_EINVAL);
    assert_int_equal(cli_door_set_flag(NULL, "--stages", "2"), PPN_EINVAL);
    assert_int_equal(ppn_door_from_env(NULL), PPN_EINVAL);
}

/* ---- fences --------------------------------------------------------------------------------------------- */

/* Even-split fences worked out by hand from cut s = floor(s * L / N). */
static void test_even_split(void **state)
{
    (void)state;
    static const struct { int n, layers; int fence[8]; } cases[] = {
        {4, 6, {0, 1, 3, 4, 6}},         /* 1.5, 3, 4.5 */
        {2, 6, {0, 3, 6}},
        {6, 6, {0, 1, 2, 3, 4, 5, 6}},
        {3, 7, {0, 2, 4, 7}},            /* 2.33, 4.67 */
        {5, 32, {0, 6, 12, 19, 25, 32}}, /* 6.4, 12.8, 19.2, 25.6 */
        {3, 10, {0, 3, 6, 10}},          /* 3.33, 6.67 */
        {2, 2, {0, 1, 2}},
        {2, 5, {0, 2, 5}},               /* 2.5 */
        {7, 8, {0, 1, 2, 3, 4, 5, 6, 8}}, /* 8/7 = 1.14 .. 48/7 = 6.86 */
    };
    const int primary[] = {3, 3, 3, 3, 3, 3, 3, 3};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char v[16];
        snprintf(v, sizeof v, "%d", cases[i].n);
        setenv("MEMRA_PP_STAGES", v, 1);
        ppn_door d = env_door();
        assert_int_equal(d.n_stages, cases[i].n);
        resolves_to(&d, cases[i].layers, 4, 3, cases[i].n, cases[i].fence, primary);
        ppn_door f = ppn_door_default();
        set_flag_ok(&f, "--stages", v);
        resolves_to(&f, cases[i].layers, 4, 3, cases[i].n, cases[i].fence, primary);
    }
}

/* 64 stages over 1000 layers: every stage gets 15 or 16 layers, in order, last cut floor(63000/64) = 984. */
static void test_even_split_wide(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "64", 1);
    ppn_door d = env_door();
    int f[PPN_MAX_STAGES + 1], sd[PPN_MAX_STAGES], n = 0;
    assert_int_equal(ppn_door_resolve(&d, 1000, 1, 0, f, sd, &n), PPN_OK);
    assert_int_equal(n, 64);
    assert_int_equal(f[0], 0);
    assert_int_equal(f[1], 15);
    assert_int_equal(f[63], 984);
    assert_int_equal(f[64], 1000);
    for (int s = 0; s < 64; s++) {
        int size = f[s + 1] - f[s];
        assert_true(size == 15 || size == 16);
        assert_int_equal(sd[s], 0);
    }
    /* 64 stages over 64 layers: one layer each. */
    assert_int_equal(ppn_door_resolve(&d, 64, 1, 0, f, sd, &n), PPN_OK);
    for (int s = 0; s <= 64; s++) assert_int_equal(f[s], s);
}

static void test_explicit_cuts(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "4", 1);
    setenv("MEMRA_PP_SPLITS", "1,2,5", 1);
    ppn_door d = env_door();
    int fence[] = {0, 1, 2, 5, 6}, dev[] = {1, 1, 1, 1};
    resolves_to(&d, 6, 2, 1, 4, fence, dev);
    /* Uneven on purpose: the explicit list wins over the even split (which would be 0,1,3,4,6). */
    setenv("MEMRA_PP_SPLITS", "4,5,0007", 1);
    d = env_door();
    int fence2[] = {0, 4, 5, 7, 9};
    resolves_to(&d, 9, 2, 1, 4, fence2, dev);
}

static void test_split_two_stages(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    setenv("MEMRA_PP_SPLIT", "5", 1);
    ppn_door d = env_door();
    int fence[] = {0, 5, 6}, dev[] = {0, 0};
    resolves_to(&d, 6, 1, 0, 2, fence, dev);
    /* The same cut through MEMRA_PP_SPLITS and through --split. */
    unsetenv("MEMRA_PP_SPLIT");
    setenv("MEMRA_PP_SPLITS", "5", 1);
    d = env_door();
    resolves_to(&d, 6, 1, 0, 2, fence, dev);
    ppn_door f = ppn_door_default();
    set_flag_ok(&f, "--stages", "2");
    set_flag_ok(&f, "--split", "5");
    resolves_to(&f, 6, 1, 0, 2, fence, dev);
    /* An empty MEMRA_PP_SPLIT is unset: the even split. */
    unsetenv("MEMRA_PP_SPLITS");
    setenv("MEMRA_PP_SPLIT", "", 1);
    d = env_door();
    int even[] = {0, 3, 6};
    resolves_to(&d, 6, 1, 0, 2, even, dev);
    /* Range of the single cut. */
    setenv("MEMRA_PP_SPLIT", "0", 1);
    d = env_door();
    resolve_refused(&d, 6, 1, 0, "MEMRA_PP_SPLIT", "(0, n_layers=6)");
    setenv("MEMRA_PP_SPLIT", "6", 1);
    d = env_door();
    resolve_refused(&d, 6, 1, 0, "MEMRA_PP_SPLIT", "--split=6:");
}

static void test_split_needs_two_stages(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "3", 1);
    setenv("MEMRA_PP_SPLIT", "2", 1);
    env_refused("2", "MEMRA_PP_SPLIT", "MEMRA_PP_SPLITS");
    msg_has("MEMRA_PP_STAGES=3");
    msg_has("2-stage");
    /* Through the flags the order is free, so resolve catches it by the count. */
    ppn_door f = ppn_door_default();
    set_flag_ok(&f, "--split", "2");
    set_flag_ok(&f, "--stages", "3");
    resolve_refused(&f, 6, 1, 0, "--split", "2-stage");
    msg_has("needs 2 cuts, got 1");
}

static void test_split_and_splits_refused(void **state)
{
    (void)state;
    const char *n[] = {"2", "3"};
    for (size_t i = 0; i < 2; i++) {
        setenv("MEMRA_PP_STAGES", n[i], 1);
        setenv("MEMRA_PP_SPLIT", "4", 1);
        setenv("MEMRA_PP_SPLITS", "1,3", 1);
        env_refused("'4'", "MEMRA_PP_SPLIT=", "MEMRA_PP_SPLITS='1,3'");
    }
}

static void test_cut_semantics_refused(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "3", 1);
    static const struct { const char *cuts, *want; } bad[] = {
        {"3,2", "strictly increasing"},
        {"3,3", "strictly increasing"},
        {"0,3", "each cut must be in (0, n_layers=6)"},
        {"3,6", "each cut must be in (0, n_layers=6)"},
        {"2,7", "each cut must be in (0, n_layers=6)"},
        {"2", "MEMRA_PP_STAGES/--stages=3 needs 2 cuts, got 1"},
        {"1,2,3", "needs 2 cuts, got 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MEMRA_PP_SPLITS", bad[i].cuts, 1);
        ppn_door d = env_door();
        char named[64];
        snprintf(named, sizeof named, "MEMRA_PP_SPLITS/--splits=%s:", bad[i].cuts);
        resolve_refused(&d, 6, 1, 0, named, bad[i].want);
    }
}

static void test_stages_above_layers(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "9", 1);
    ppn_door d = env_door();
    resolve_refused(&d, 6, 1, 0, "MEMRA_PP_STAGES/--stages=9", "exceeds n_layers=6");
    msg_has("at least one layer");
    /* Explicit cuts do not get around it. */
    setenv("MEMRA_PP_STAGES", "3", 1);
    setenv("MEMRA_PP_SPLITS", "1,2", 1);
    d = env_door();
    resolve_refused(&d, 2, 1, 0, "MEMRA_PP_STAGES/--stages=3", "exceeds n_layers=2");
}

/* ---- devices -------------------------------------------------------------------------------------------- */

static void test_devices(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    setenv("MEMRA_PP_DEVICES", "3,1", 1);
    ppn_door d = env_door();
    int fence[] = {0, 3, 6}, dev[] = {3, 1};
    resolves_to(&d, 6, 4, 0, 2, fence, dev);

    setenv("MEMRA_PP_DEVICES", "0,7", 1);
    d = env_door();
    resolve_refused(&d, 6, 4, 0, "MEMRA_PP_DEVICES/--devices=0,7", "device 7 does not exist (4 devices)");
    setenv("MEMRA_PP_DEVICES", "4,0", 1);
    d = env_door();
    resolve_refused(&d, 6, 4, 0, "MEMRA_PP_DEVICES/--devices=4,0", "device 4 does not exist");

    setenv("MEMRA_PP_DEVICES", "0", 1);
    d = env_door();
    resolve_refused(&d, 6, 4, 0, "MEMRA_PP_DEVICES/--devices=0:", "needs 2 devices, got 1");
    setenv("MEMRA_PP_DEVICES", "0,1,2", 1);
    d = env_door();
    resolve_refused(&d, 6, 4, 0, "MEMRA_PP_DEVICES/--devices=0,1,2", "needs 2 devices, got 3");
}

static void test_repeated_devices(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "3", 1);
    setenv("MEMRA_PP_DEVICES", "1,1,0", 1);
    ppn_door d = env_door();
    int fence[] = {0, 2, 4, 6}, dev[] = {1, 1, 0};
    resolves_to(&d, 6, 2, 0, 3, fence, dev);
}

static void test_resolve_arguments(void **state)
{
    (void)state;
    ppn_door d = ppn_door_default();
    resolve_refused(&d, 0, 1, 0, "n_layers=0", "at least one layer");
    resolve_refused(&d, -3, 1, 0, "n_layers=-3", NULL);
    resolve_refused(&d, 6, 4, 4, "primary device 4", "(4 devices)");
    resolve_refused(&d, 6, 4, -1, "primary device -1", NULL);
    resolve_refused(&d, 6, 0, 0, "does not exist", "(0 devices)");
    int f[PPN_MAX_STAGES + 1], sd[PPN_MAX_STAGES], n;
    assert_int_equal(ppn_door_resolve(NULL, 6, 1, 0, f, sd, &n), PPN_EINVAL);
    assert_int_equal(ppn_door_resolve(&d, 6, 1, 0, NULL, sd, &n), PPN_EINVAL);
    assert_int_equal(ppn_door_resolve(&d, 6, 1, 0, f, NULL, &n), PPN_EINVAL);
    assert_int_equal(ppn_door_resolve(&d, 6, 1, 0, f, sd, NULL), PPN_EINVAL);
    /* A hand-filled door with counts beyond the arrays is refused, not read out of bounds. */
    d.n_stages = PPN_MAX_STAGES + 1;
    resolve_refused(&d, 100, 1, 0, "n_stages=65", NULL);
    d = ppn_door_default();
    d.n_stages = 2;
    d.n_devices = -1;
    resolve_refused(&d, 6, 1, 0, "n_devices=-1", NULL);
}

/* ---- the 0/1 seams and flags ---------------------------------------------------------------------------- */

static void test_seams_zero_one(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    for (size_t s = 0; s < N_SEAMS; s++) {
        for (int v = 0; v <= 1; v++) {
            setenv(seams[s].var, v ? "1" : "0", 1);
            ppn_door d = env_door();
            assert_int_equal(field(&d, seams[s].off), v);
            for (size_t o = 0; o < N_SEAMS; o++)
                if (o != s) assert_int_equal(field(&d, seams[o].off), seams[o].def);
        }
        setenv(seams[s].var, "", 1); /* empty = the default */
        ppn_door d = env_door();
        assert_int_equal(field(&d, seams[s].off), seams[s].def);
        unsetenv(seams[s].var);
    }
    for (size_t s = 0; s < N_FLAG_BITS; s++) {
        for (int v = 0; v <= 1; v++) {
            ppn_door d = ppn_door_default();
            set_flag_ok(&d, flag_bits[s].var, v ? "1" : "0");
            assert_int_equal(field(&d, flag_bits[s].off), v);
            for (size_t o = 0; o < N_FLAG_BITS; o++)
                if (o != s) assert_int_equal(field(&d, flag_bits[o].off), flag_bits[o].def);
        }
    }
}

/* The CLI reads the environment, then applies its flags: each flag replaces what the variable said. */
static void test_flags_override_env(void **state)
{
    (void)state;
    setenv("MEMRA_PP_STAGES", "2", 1);
    setenv("MEMRA_PP_SPLIT", "3", 1);
    setenv("MEMRA_PP_DEVICES", "0,0", 1);
    setenv("MEMRA_PP_OVERLAP", "0", 1);
    setenv("MEMRA_PP_SHARD", "1", 1);
    setenv("PPN_SPIN", "0", 1);
    ppn_door d = env_door();
    set_flag_ok(&d, "--stages", "3");
    set_flag_ok(&d, "--splits", "1,4");
    set_flag_ok(&d, "--devices", "2,0,1");
    set_flag_ok(&d, "--overlap", "1");
    set_flag_ok(&d, "--shard", "0");
    set_flag_ok(&d, "--spin", "1");
    assert_int_equal(d.overlap, 1);
    assert_int_equal(d.shard, 0);
    assert_int_equal(d.spin, 1);
    int fence[] = {0, 1, 4, 6}, dev[] = {2, 0, 1};
    resolves_to(&d, 6, 3, 0, 3, fence, dev);

    /* --stages 1 shuts the door the environment opened: one stage on the primary. */
    set_flag_ok(&d, "--stages", "1");
    int fence1[] = {0, 6}, dev1[] = {1};
    resolves_to(&d, 6, 3, 1, 1, fence1, dev1);

    /* --stages over an environment cut list of the wrong length is caught at resolve. */
    d = env_door();
    set_flag_ok(&d, "--stages", "4");
    resolve_refused(&d, 6, 1, 0, "needs 3 cuts, got 1", NULL);

    /* A refused flag leaves the environment's door as it was. */
    ppn_door before = env_door();
    d = before;
    assert_int_equal(cli_door_set_flag(&d, "--stages", "x"), PPN_EINVAL);
    assert_memory_equal(&d, &before, sizeof d);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, clear_env, clear_env)
    const struct CMUnitTest tests[] = {
        T(test_defaults),
        T(test_shut_ignores_garbage),
        T(test_spin_always_read),
        T(test_bad_stages),
        T(test_bad_splits),
        T(test_bad_split),
        T(test_bad_devices),
        T(test_bad_seams),
        T(test_bad_flag_names_and_empty),
        T(test_even_split),
        T(test_even_split_wide),
        T(test_explicit_cuts),
        T(test_split_two_stages),
        T(test_split_needs_two_stages),
        T(test_split_and_splits_refused),
        T(test_cut_semantics_refused),
        T(test_stages_above_layers),
        T(test_devices),
        T(test_repeated_devices),
        T(test_resolve_arguments),
        T(test_seams_zero_one),
        T(test_flags_override_env),
    };
#undef T
    return cmocka_run_group_tests(tests, clear_env, clear_env);
}
