/* cli_door.c - the door's CLI flags (--stages --splits --split --devices --shard --streams --overlap --spin
 * --graphs --fuse --attn-tc). Each flag spells a variable of the environment table (core/base/env.c) and is parsed by
 * that variable's rule, so a flag and its variable accept the same text; the messages name the flag. The CLI
 * reads the door from the environment first (ppn_door_from_env), then applies its flags over it. */
#include <stddef.h>
#include <string.h>
#include "tools/cli.h"
#include "core/base/env.h"
#include "core/base/err.h"

/* Longest flag name quoted in a message. */
#define FLAG_QUOTE_MAX 200

/* What a flag sets: an int field, the one cut, the cut list, the device list, a 0/1 field. */
enum { DOOR_INT, DOOR_CUT, DOOR_CUTS, DOOR_DEVICES, DOOR_BIT };

/* Each flag: the variable whose rule it follows, and what it sets. */
static const struct door_flag {
    const char *flag, *var;
    int how;
    size_t off; /* DOOR_INT, DOOR_BIT: the int field set */
} door_flags[] = {
    {"--stages", "MEMRA_PP_STAGES", DOOR_INT, offsetof(ppn_door, n_stages)},
    {"--splits", "MEMRA_PP_SPLITS", DOOR_CUTS, 0},
    {"--split", "MEMRA_PP_SPLIT", DOOR_CUT, 0},
    {"--devices", "MEMRA_PP_DEVICES", DOOR_DEVICES, 0},
    {"--shard", "MEMRA_PP_SHARD", DOOR_BIT, offsetof(ppn_door, shard)},
    {"--streams", "MEMRA_PP_STREAMS", DOOR_BIT, offsetof(ppn_door, streams)},
    {"--overlap", "MEMRA_PP_OVERLAP", DOOR_BIT, offsetof(ppn_door, overlap)},
    {"--spin", "PPN_SPIN", DOOR_BIT, offsetof(ppn_door, spin)},
    {"--graphs", "PPN_GRAPHS", DOOR_BIT, offsetof(ppn_door, graphs)},
    {"--fuse", "PPN_FUSE", DOOR_BIT, offsetof(ppn_door, fuse)},
    {"--attn-tc", "PPN_ATTN_TC", DOOR_BIT, offsetof(ppn_door, attn_tc)},
};

static const struct door_flag *flag_find(const char *flag)
{
    for (size_t i = 0; i < PPN_ARRAY_LEN(door_flags); i++)
        if (strcmp(flag, door_flags[i].flag) == 0) return &door_flags[i];
    return NULL;
}

static int *field(ppn_door *t, size_t off) { return (int *)((char *)t + off); }

/* Apply f's value v to t (a copy: a refusal may have written part of it). */
static ppn_status flag_apply(ppn_door *t, const struct door_flag *f, const char *v)
{
    int cap = PPN_MAX_STAGES;
    switch (f->how) {
    case DOOR_INT: return ppn_env_parse_int(f->var, f->flag, v, field(t, f->off));
    case DOOR_CUT:
        t->n_cuts = 1; /* the 2-stage spelling of --splits: resolve checks the count against --stages */
        return ppn_env_parse_int(f->var, f->flag, v, &t->cuts[0]);
    case DOOR_CUTS: return ppn_env_parse_ints(f->var, f->flag, v, t->cuts, cap, &t->n_cuts);
    case DOOR_DEVICES: return ppn_env_parse_ints(f->var, f->flag, v, t->devices, cap, &t->n_devices);
    default: return ppn_env_parse_flag(f->var, f->flag, v, field(t, f->off));
    }
}

/* @return PPN_OK, PPN_EINVAL (NULL argument, unknown flag, empty value, or a value breaking the flag's rule).
 * *d changes only on success. */
ppn_status cli_door_set_flag(ppn_door *d, const char *flag, const char *value)
{
    if (!d || !flag) return ppn_err(PPN_EINVAL, "cli_door_set_flag: %s is NULL", d ? "flag" : "d");
    const char *ell = strlen(flag) > FLAG_QUOTE_MAX ? "..." : "";
    const struct door_flag *f = flag_find(flag);
    if (!f)
        return ppn_err(PPN_EINVAL, "unknown door flag '%.*s%s' (known: --stages --splits --split --devices "
                       "--shard --streams --overlap --spin --graphs --fuse --attn-tc)", FLAG_QUOTE_MAX, flag, ell);
    if (!value || !*value) return ppn_err(PPN_EINVAL, "%s='': a door flag needs a value", flag);
    ppn_door t = *d;
    PPN_CHECK(flag_apply(&t, f, value));
    *d = t;
    return PPN_OK;
}

/* Whether the door ends up open for this command line: the last --stages says N >= 2, or with none the
 * environment's MEMRA_PP_STAGES did (d->n_stages as ppn_door_from_env read it), or bench's --stages-sweep
 * publishes each N itself. The whole argv is read so that a door-only flag may come before --stages. A --stages
 * whose value breaks the rule counts as open: its own refusal follows, naming it. */
static int door_opens(const ppn_door *d, int argc, char **argv)
{
    int n = d->n_stages;
    for (int j = 1; j < argc; j++) {
        if (!strcmp(argv[j], "--stages-sweep")) return 1;
        if (strcmp(argv[j], "--stages") != 0 || j + 1 >= argc) continue;
        if (ppn_env_parse_int("MEMRA_PP_STAGES", "--stages", argv[++j], &n) != PPN_OK) return 1;
    }
    return n >= 2;
}

int cli_door_flag(ppn_door *d, int argc, char **argv, int *i)
{
    const struct door_flag *f = flag_find(argv[*i]);
    if (!f) return 0;
    const char *flag = argv[*i], *v = cli_value(argc, argv, i);
    if (!v) return -1;
    if (cli_door_set_flag(d, flag, v) != PPN_OK) return cli_fail("%s", ppn_last_error()), -1;
    /* A door-only flag (its variable is read only while the door is open) would be dropped without a word. */
    if (ppn_env_find(f->var)->gated && !door_opens(d, argc, argv))
        return cli_fail("%s needs --stages N >= 2 (the door is shut)", flag), -1;
    return 1;
}
