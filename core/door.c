/* door.c - the door: reading, checking and resolving how a model is cut into pipeline stages.
 *
 * The rules (from the seed module and the door issue; the public contract is in include/ppn.h):
 *
 *  - MEMRA_PP_STAGES=N. Unset, empty, 0 or 1: the door is shut, and then NO other MEMRA_* variable is read or
 *    checked, so garbage left in MEMRA_PP_SPLITS (say) changes nothing anywhere. N is a whole decimal number
 *    (digits only: no sign, space, junk or overflow) and at most PPN_MAX_STAGES.
 *  - MEMRA_PP_SPLITS=c1,..,cN-1: whole numbers separated by commas, no empty element, at most PPN_MAX_STAGES-1
 *    of them. MEMRA_PP_SPLIT=i is the N=2 spelling: set with an open door of N != 2 it is refused, and setting
 *    both spellings is refused. The semantic rules (exactly N-1 cuts, each in (0, n_layers), strictly
 *    increasing) need n_layers, so ppn_door_resolve checks them. No cuts: the even split s * n_layers / N.
 *  - MEMRA_PP_DEVICES=d0,..,dN-1: whole numbers, at most PPN_MAX_STAGES; resolve checks the count (N) and that
 *    each device exists. Unset: every stage on the primary device. A repeated device is allowed.
 *  - The 0/1 seams (MEMRA_PP_SHARD, _STREAMS, _OVERLAP, MEMRA_BATCH_PP, MEMRA_SPEC_PP, MEMRA_PRIME_PP,
 *    MEMRA_PRIME_PIPE, MEMRA_PP_ALLOW_UNSPLIT_BATCH) are read only with the door open; PPN_SPIN, PPN_GRAPHS and
 *    PPN_FUSE are ppn's own and are always read (they matter with one stage too). Unset or empty: the default;
 *    otherwise exactly "0" or "1".
 *  - The syntax of each variable (and its default) is its entry in the environment table, core/base/env.c;
 *    this file adds the rules between variables. The CLI flags (--stages --splits --split --devices --shard
 *    --streams --overlap --spin --graphs --fuse) are the command line's (tools/cli_door.c): they follow the
 *    same table rules and override the environment. Flags may come in any order, so --split cannot be checked
 *    against --stages when it is set: resolve catches it through the cut count. The struct does not record
 *    where a value came from, so resolve names both spellings ("MEMRA_PP_SPLITS/--splits=3,2: ...").
 *  - Every failure returns PPN_EINVAL with a message naming the variable or flag, its value and the rule, and
 *    leaves the caller's door and outputs untouched. Nothing here allocates.
 */
#include <string.h>
#include "core/base/env.h"
#include <stdio.h>
#include "core/base/err.h"

/* Longest value quoted in a message: the rule after it must survive the 1 KiB message buffer. */
#define DOOR_QUOTE_MAX 200
/* A rendered int list: up to PPN_MAX_STAGES entries of at most 11 characters and a comma each. */
#define DOOR_LIST_CHARS (PPN_MAX_STAGES * 12 + 1)

ppn_door ppn_door_default(void)
{
    ppn_door d;
    memset(&d, 0, sizeof d);
    d.shard = 1;
    d.streams = 1;
    d.batch_pp = d.spec_pp = d.prime_pp = d.prime_pipe = 1;
    d.graphs = 1;
    d.fuse = 1;
    d.attn_tc = 1;
    return d;
}

/* "..." when a quoted value had to be cut short, else "". */
static const char *ell(const char *v) { return strlen(v) > DOOR_QUOTE_MAX ? "..." : ""; }

/* ---- the environment ---------------------------------------------------------------------------------- */

/* The cuts of an open door of t->n_stages stages: MEMRA_PP_SPLITS, or MEMRA_PP_SPLIT when N == 2. */
static ppn_status env_cuts(ppn_door *t)
{
    const char *many, *one;
    PPN_CHECK(ppn_env_str("MEMRA_PP_SPLITS", &many));
    PPN_CHECK(ppn_env_str("MEMRA_PP_SPLIT", &one));
    if (many && one)
        return ppn_err(PPN_EINVAL, "MEMRA_PP_SPLIT='%.*s%s' and MEMRA_PP_SPLITS='%.*s%s' are both set: use one "
                       "(MEMRA_PP_SPLIT is the 2-stage spelling of MEMRA_PP_SPLITS)", DOOR_QUOTE_MAX, one,
                       ell(one), DOOR_QUOTE_MAX, many, ell(many));
    if (many) return ppn_env_ints("MEMRA_PP_SPLITS", t->cuts, (int)PPN_ARRAY_LEN(t->cuts), &t->n_cuts);
    if (!one) return PPN_OK;
    if (t->n_stages != 2)
        return ppn_err(PPN_EINVAL, "MEMRA_PP_SPLIT='%.*s%s': MEMRA_PP_SPLIT is the 2-stage spelling; with "
                       "MEMRA_PP_STAGES=%d use MEMRA_PP_SPLITS", DOOR_QUOTE_MAX, one, ell(one), t->n_stages);
    t->n_cuts = 1;
    return ppn_env_int("MEMRA_PP_SPLIT", &t->cuts[0]);
}

/* The 0/1 seams read only while the door is open. */
static ppn_status env_seams(ppn_door *t)
{
    const struct { const char *name; int *field; } seams[] = {
        {"MEMRA_PP_SHARD", &t->shard},       {"MEMRA_PP_STREAMS", &t->streams},
        {"MEMRA_PP_OVERLAP", &t->overlap},   {"MEMRA_BATCH_PP", &t->batch_pp},
        {"MEMRA_SPEC_PP", &t->spec_pp},      {"MEMRA_PRIME_PP", &t->prime_pp},
        {"MEMRA_PRIME_PIPE", &t->prime_pipe}, {"MEMRA_PP_ALLOW_UNSPLIT_BATCH", &t->allow_unsplit_batch},
    };
    for (size_t i = 0; i < PPN_ARRAY_LEN(seams); i++) PPN_CHECK(ppn_env_flag(seams[i].name, seams[i].field));
    return PPN_OK;
}

/* @return PPN_OK, PPN_EINVAL (d is NULL, or a variable breaks its rule: named with its value and the rule).
 * *d is replaced only on success. */
ppn_status ppn_door_from_env(ppn_door *d)
{
    if (!d) return ppn_err(PPN_EINVAL, "ppn_door_from_env: d is NULL");
    ppn_door t = ppn_door_default();
    PPN_CHECK(ppn_env_int("MEMRA_PP_STAGES", &t.n_stages));
    PPN_CHECK(ppn_env_flag("PPN_SPIN", &t.spin));
    PPN_CHECK(ppn_env_flag("PPN_GRAPHS", &t.graphs));
    PPN_CHECK(ppn_env_flag("PPN_FUSE", &t.fuse));
    PPN_CHECK(ppn_env_flag("PPN_ATTN_TC", &t.attn_tc));
    if (t.n_stages >= 2) {
        PPN_CHECK(env_cuts(&t));
        PPN_CHECK(ppn_env_ints("MEMRA_PP_DEVICES", t.devices, (int)PPN_ARRAY_LEN(t.devices), &t.n_devices));
        PPN_CHECK(env_seams(&t));
    }
    *d = t;
    return PPN_OK;
}

/* ---- resolve ------------------------------------------------------------------------------------------ */

/* "a,b,c" into buf (DOOR_LIST_CHARS). */
static const char *list_str(const int *v, int n, char *buf)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < DOOR_LIST_CHARS; i++)
        k += (size_t)snprintf(buf + k, DOOR_LIST_CHARS - k, i ? ",%d" : "%d", v[i]);
    return buf;
}

/* The arguments and the door's own counts (the struct is public: a caller may have filled it by hand). */
static ppn_status resolve_args(const ppn_door *d, int n_layers, int n_devices, int primary, const int *fence,
                               const int *stage_dev, const int *n_out)
{
    if (!d || !fence || !stage_dev || !n_out)
        return ppn_err(PPN_EINVAL, "ppn_door_resolve: d, fence, stage_dev and n_out must not be NULL");
    if (n_layers < 1) return ppn_err(PPN_EINVAL, "n_layers=%d: a model needs at least one layer", n_layers);
    if (n_devices < 1 || primary < 0 || primary >= n_devices)
        return ppn_err(PPN_EINVAL, "primary device %d does not exist (%d devices)", primary, n_devices);
    if (d->n_stages < 0 || d->n_stages > PPN_MAX_STAGES || d->n_cuts < 0 || d->n_cuts > PPN_MAX_STAGES - 1 ||
        d->n_devices < 0 || d->n_devices > PPN_MAX_STAGES)
        return ppn_err(PPN_EINVAL, "ppn_door: n_stages=%d, n_cuts=%d or n_devices=%d out of range (at most %d "
                       "stages)", d->n_stages, d->n_cuts, d->n_devices, PPN_MAX_STAGES);
    return PPN_OK;
}

/* The explicit cuts of an open door of N stages: count, range, order. */
static ppn_status check_cuts(const ppn_door *d, int n_layers)
{
    char buf[DOOR_LIST_CHARS];
    /* At N = 2 the cut may have come from either spelling. */
    const char *name = d->n_stages == 2 ? "MEMRA_PP_SPLITS/MEMRA_PP_SPLIT/--splits/--split"
                                        : "MEMRA_PP_SPLITS/--splits";
    int n = d->n_stages;
    if (d->n_cuts != n - 1)
        return ppn_err(PPN_EINVAL, "%s=%s: MEMRA_PP_STAGES/--stages=%d needs %d cuts, got %d%s", name,
                       list_str(d->cuts, d->n_cuts, buf), n, n - 1, d->n_cuts,
                       d->n_cuts == 1 ? " (MEMRA_PP_SPLIT/--split is the 2-stage spelling)" : "");
    for (int i = 0; i < d->n_cuts; i++)
        if (d->cuts[i] <= 0 || d->cuts[i] >= n_layers)
            return ppn_err(PPN_EINVAL, "%s=%s: each cut must be in (0, n_layers=%d)", name,
                           list_str(d->cuts, d->n_cuts, buf), n_layers);
    for (int i = 1; i < d->n_cuts; i++)
        if (d->cuts[i] <= d->cuts[i - 1])
            return ppn_err(PPN_EINVAL, "%s=%s: cuts must be strictly increasing", name,
                           list_str(d->cuts, d->n_cuts, buf));
    return PPN_OK;
}

/* The explicit devices of an open door of N stages: count and existence. */
static ppn_status check_devices(const ppn_door *d, int n_devices)
{
    char buf[DOOR_LIST_CHARS];
    if (d->n_devices != d->n_stages)
        return ppn_err(PPN_EINVAL, "MEMRA_PP_DEVICES/--devices=%s: MEMRA_PP_STAGES/--stages=%d needs %d devices, "
                       "got %d", list_str(d->devices, d->n_devices, buf), d->n_stages, d->n_stages, d->n_devices);
    for (int i = 0; i < d->n_devices; i++)
        if (d->devices[i] < 0 || d->devices[i] >= n_devices)
            return ppn_err(PPN_EINVAL, "MEMRA_PP_DEVICES/--devices=%s: device %d does not exist (%d devices)",
                           list_str(d->devices, d->n_devices, buf), d->devices[i], n_devices);
    return PPN_OK;
}

static ppn_status check_open(const ppn_door *d, int n_layers, int n_devices)
{
    if (d->n_stages > n_layers)
        return ppn_err(PPN_EINVAL, "MEMRA_PP_STAGES/--stages=%d exceeds n_layers=%d: every stage needs at least "
                       "one layer", d->n_stages, n_layers);
    if (d->n_cuts) PPN_CHECK(check_cuts(d, n_layers));
    if (d->n_devices) PPN_CHECK(check_devices(d, n_devices));
    return PPN_OK;
}

/* Fence and devices of a checked door (N = 1 when shut). The even split s * n_layers / N is strictly
 * increasing inside (0, n_layers) because N <= n_layers. */
static void fill(const ppn_door *d, int n, int n_layers, int primary, int *fence, int *stage_dev)
{
    fence[0] = 0;
    fence[n] = n_layers;
    for (int s = 1; s < n; s++)
        fence[s] = d->n_cuts ? d->cuts[s - 1] : (int)((long long)s * n_layers / n);
    for (int s = 0; s < n; s++) stage_dev[s] = d->n_devices ? d->devices[s] : primary;
}

/* fence must hold PPN_MAX_STAGES + 1 entries and stage_dev PPN_MAX_STAGES (n_out is known only after).
 * @return PPN_OK, PPN_EINVAL (NULL argument, n_layers < 1, primary not in [0, n_devices), N above n_layers,
 *         wrong count of cuts or devices, a cut out of (0, n_layers) or out of order, a device that does not
 *         exist). Outputs are written only on success. */
ppn_status ppn_door_resolve(const ppn_door *d, int n_layers, int n_devices, int primary, int *fence,
                            int *stage_dev, int *n_out)
{
    PPN_CHECK(resolve_args(d, n_layers, n_devices, primary, fence, stage_dev, n_out));
    int open = d->n_stages >= 2;
    if (open) PPN_CHECK(check_open(d, n_layers, n_devices));
    int n = open ? d->n_stages : 1;
    ppn_door shut = ppn_door_default();
    fill(open ? d : &shut, n, n_layers, primary, fence, stage_dev);
    *n_out = n;
    return PPN_OK;
}
