/* env.c - the table of every environment variable ppn reads, and the one place that reads and parses them
 * (the contract is in env.h). The only getenv of ppn is env_text below.
 *
 * Grammar shared by every kind: an empty value is unset; a whole number is digits only (leading zeros
 * allowed, no sign, space or junk, no overflow); a refusal reads "NAME='value': must be RULE", the value cut
 * at ENV_QUOTE_MAX characters so the rule survives the 1 KiB message buffer. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/env.h"
#include "core/base/err.h"

/* Longest value quoted in a message. */
#define ENV_QUOTE_MAX 200
/* Room for the longest rule of the table (an enum's words, a TEXT syntax). */
#define ENV_RULE_MAX 256

static const char *const pin_words[] = {"near", "far", "none", NULL};
static const char *const xport_words[] = {"inplace", "dtod", NULL};
static const char *const host_slot_words[] = {"consumer", "producer", "interleave", NULL};
static const char *const backend_words[] = {"auto", "cuda", "sim", NULL};

#define FLAG(n, area, gated, def, doc) {n, PPN_ENV_FLAG, area, gated, 0, 1, NULL, def, NULL, doc}
#define INT(n, area, gated, lo, hi, def, doc) {n, PPN_ENV_INT, area, gated, lo, hi, NULL, def, NULL, doc}
#define ENUM(n, area, words, def, doc) {n, PPN_ENV_ENUM, area, 0, 0, 0, words, def, NULL, doc}
#define INTS(n, area, gated, most, def, doc) {n, PPN_ENV_INTS, area, gated, 0, most, NULL, def, NULL, doc}
#define TEXT(n, area, def, syntax, doc) {n, PPN_ENV_TEXT, area, 0, 0, 0, NULL, def, syntax, doc}

/* Every variable ppn reads. The door's defaults must match ppn_door_default() and the sim's ranges its
 * limits (tests/test_env.c and a static assertion in gpu_sim.c hold them together). */
static const ppn_env_var env_table[] = {
    /* The door (core/door.c), read per call. Names kept from the seed module. */
    INT("MEMRA_PP_STAGES", PPN_ENV_DOOR, 0, 0, PPN_MAX_STAGES, "0",
        "pipeline stages N; unset, 0 or 1: the door is shut and no other MEMRA_* variable is read"),
    INTS("MEMRA_PP_SPLITS", PPN_ENV_DOOR, 1, PPN_MAX_STAGES - 1, "the even split",
         "the N-1 cuts: first layer of stages 1..N-1, strictly increasing, each in (0, n_layers)"),
    INT("MEMRA_PP_SPLIT", PPN_ENV_DOOR, 1, 0, INT_MAX, NULL,
        "the cut of a 2-stage door (the N=2 spelling of MEMRA_PP_SPLITS: set one, not both)"),
    INTS("MEMRA_PP_DEVICES", PPN_ENV_DOOR, 1, PPN_MAX_STAGES, "all on the primary",
         "the device of each stage, N entries (a device may repeat)"),
    FLAG("MEMRA_PP_SHARD", PPN_ENV_DOOR, 1, "1", "0: every weight on the primary device (remote stages peer-read)"),
    FLAG("MEMRA_PP_STREAMS", PPN_ENV_DOOR, 1, "1", "0: rollback to one stream, plain copies, no per-stage threads"),
    FLAG("MEMRA_PP_OVERLAP", PPN_ENV_DOOR, 1, "0", "1: alternate the double-buffered boundary slots per step"),
    FLAG("MEMRA_BATCH_PP", PPN_ENV_DOOR, 1, "1",
         "0: the batched decode step walks every layer on stage 0's stream (refused across devices unless "
         "MEMRA_PP_ALLOW_UNSPLIT_BATCH=1); 1: the batched stage split"),
    FLAG("MEMRA_SPEC_PP", PPN_ENV_DOOR, 1, "1",
         "0: the speculative verify walks every layer on stage 0's stream (the same refusal); 1: the verify split"),
    FLAG("MEMRA_PRIME_PP", PPN_ENV_DOOR, 1, "1", "0: A/B seam of the prime path"),
    FLAG("MEMRA_PRIME_PIPE", PPN_ENV_DOOR, 1, "1", "0: A/B seam of the pipelined prime"),
    FLAG("MEMRA_PP_ALLOW_UNSPLIT_BATCH", PPN_ENV_DOOR, 1, "0",
         "1: measurement override of the fail-closed guard on unsplit batches"),
    FLAG("PPN_SPIN", PPN_ENV_DOOR, 0, "0", "1: issue threads busy-poll instead of sleeping on a futex"),
    FLAG("PPN_GRAPHS", PPN_ENV_DOOR, 0, "1",
         "0: launch every kernel through the stream instead of replaying each stage's captured graph"),
    FLAG("PPN_FUSE", PPN_ENV_DOOR, 0, "1",
         "0: the RMSNorms and the rotary in their own launches instead of fused into their neighbours"),
    FLAG("PPN_ATTN_TC", PPN_ENV_DOOR, 0, "1",
         "0: a batch step's attention on the decode kernel per row (q and the softmax weights in f32) instead of "
         "tensor cores (both rounded to bf16); bf16 caches of head_dim 64 or 128, at most 8 query heads a KV head"),
    /* The stage map (core/stagemap.c), read when a map is built. */
    ENUM("PPN_PIN", PPN_ENV_SCHED, pin_words, "near",
         "stage issue threads pinned near their device, far from it, or not at all (far, none: measurement arms)"),
    ENUM("PPN_XPORT_SAME", PPN_ENV_SCHED, xport_words, "inplace",
         "hand-off between stages on one device: in place, or a device copy (the rollback, a benchmark arm)"),
    ENUM("PPN_HOST_SLOT", PPN_ENV_SCHED, host_slot_words, "consumer",
         "where a host-staged boundary slot lives: the consumer's NUMA node (the rule), the producer's, or "
         "interleaved over every node (producer, interleave: measurement arms)"),
    TEXT("PPN_TOPO_XML", PPN_ENV_SCHED, "this machine's own discovery", "an hwloc XML topology file",
         "the topology from this file, taken as this machine's (binding reaches the OS): tests of multi-socket "
         "placement"),
    /* The device layer, read when a backend is created. */
    ENUM("PPN_BACKEND", PPN_ENV_DEVICE, backend_words, "auto",
         "the backend when none is named; auto: cuda when a driver, a device and kernels are present, else sim"),
    FLAG("PPN_PDL", PPN_ENV_DEVICE, 0, "1",
         "0: no programmatic dependent launch (cuda, compute capability 9.0+); checked on every backend"),
    INT("PPN_TMA", PPN_ENV_DEVICE, 0, 0, 3, "1",
        "0: no kernels fed by the tensor memory accelerator (cuda: compute capability 9.x; sim: its encoding); the "
        "prefill's large tile then runs without it, to the same bits: an A/B arm. 2: also the split-K tiles on "
        "bf16 x and gemm_swiglu (gemm_tc_k16t, gemm_tc_kwt, gemm_swiglu_t: the same bits; the last two 18-40% slower "
        "a launch on an H100, 2026-12-06, so not the default). 3: of those gemm_tc_k16t alone"),
    INT("PPN_GEMM_KX", PPN_ENV_DEVICE, 0, 0, 2, "2",
        "the middle split-K tile on bf16 x and gemm_swiglu with the operands swapped (gemm_tc_kx, gemm_swiglu_x: the "
        "same bits, one pass over W up to 128 tokens) where the device runs TMA kernels and PPN_TMA is not 2: 2 at "
        "up to 16 and 65-80 tokens, where it was faster on an H100 (2026-12-06); 1 wherever the others would run; 0 "
        "never"),
    INT("PPN_GEMM_W", PPN_ENV_DEVICE, 0, 0, 4, "4",
        "the forward's GEMMs on gemm_tc_w (no K split, W and x through the tensor memory accelerator, x in bf16 "
        "row-major from its producer) where the device runs TMA kernels and the fusion is on: 4 as 2 but where the "
        "op runs gemm_tc_k (the B=16 step) or gemm_tc_kx (65-80 tokens): the 8B's B=64 step 3.9% and 16 + "
        "112-row iteration 8.5% faster than 3 on an H100 (2026-12-07), the large tiles' sums there; 3 prompt "
        "chunks (from 256 tokens, where its grid fills the device and the op's own tile has its sums: level 0's "
        "bits); 2 from 16 tokens where its grid fills the device (ppn_op_gemm_rows16_takes); 1 at every m it "
        "fits; 0 never"),
    INT("PPN_GEMM_W_SWIGLU", PPN_ENV_DEVICE, 0, 0, 2, "2",
        "the gate|up GEMM of up to 128 rows on gemm_swiglu_w, SwiGLU in its epilogue (gemm_tc_w's sums, two "
        "warpgroups a CTA: gate and up): 2 also where level 4 of PPN_GEMM_W leaves gate|up to gemm_tc_kx but level "
        "2 would take it (16 and 65-80 rows on the 8B: its B=16 step 3.3% faster than 1 on an H100, 2026-12-07); "
        "1 where PPN_GEMM_W's level takes it (B=32 8.0%, B=64 2.9% faster than 0); 0 the split-K gemm_swiglu there "
        "instead (its own sums), the forward before: an A/B arm"),
    TEXT("CUDA_VISIBLE_DEVICES", PPN_ENV_DEVICE, "every device", "the CUDA driver's device list",
         "read by the CUDA driver; ppn only quotes it when the driver sees no device"),
    INT("PPN_SIM_DEVICES", PPN_ENV_SIM, 0, 1, 64, "4", "the number of simulated devices"),
    {"PPN_SIM_MEM", PPN_ENV_SIZE, PPN_ENV_SIM, 0, 1, LLONG_MAX, NULL, "8G", NULL,
     "the capacity of each simulated device (host memory is taken per allocation, not up front)"},
    TEXT("PPN_SIM_PEER", PPN_ENV_SIM, "all", "all, none, or pairs of devices below PPN_SIM_DEVICES like 0-1,2-3",
         "which peer grants are possible between simulated devices (symmetric)"),
    TEXT("PPN_SIM_FAIL", PPN_ENV_SIM, "no failure",
         "a comma-separated list of kind:K with kind alloc, copy, launch, record, wait, memset, hostfn, free, "
         "stream or event and K >= 1",
         "fault injection: the K-th sim call of that kind fails (alloc:3,launch:10)"),
    INT("PPN_SIM_LATENCY", PPN_ENV_SIM, 0, 0, 1000, "0",
        "0: sim ops run as fast as they can; 1: each takes a modelled time; K: K times it"),
    FLAG("PPN_SIM_THREAD_CLOCKS", PPN_ENV_SIM, 0, "1",
         "1: the sim checker gives each host thread its own clock (a sync orders only that thread's later ops; a "
         "hand-off between threads counts only where declared: the runtime's own, an embedder's through "
         "ppn_model_handoff_release / _acquire); 0: one clock shared by every thread (opt-out)"),
    /* Diagnostics. */
    FLAG("PPN_TRACE", PPN_ENV_DIAG, 0, "0", "1: print the phases of load and step on stderr"),
    FLAG("PPN_KPROF", PPN_ENV_DIAG, 0, "0",
         "1: per-kernel time account (ppn bench prints it; needs PPN_GRAPHS=0)"),
    /* The command line. A system variable, listed so that nothing else reads the environment. */
    TEXT("TMPDIR", PPN_ENV_CLI, "/tmp", "a directory",
         "where ppn bench --shape writes its temporary checkpoint"),
};

#undef FLAG
#undef INT
#undef ENUM
#undef INTS
#undef TEXT

int ppn_env_count(void) { return (int)PPN_ARRAY_LEN(env_table); }

const ppn_env_var *ppn_env_at(int i)
{
    PPN_ASSERT(i >= 0 && i < ppn_env_count());
    return &env_table[i];
}

const ppn_env_var *ppn_env_find(const char *name)
{
    for (size_t i = 0; name && i < PPN_ARRAY_LEN(env_table); i++)
        if (strcmp(env_table[i].name, name) == 0) return &env_table[i];
    return NULL;
}

const char *ppn_env_area_name(ppn_env_area a)
{
    static const char *const names[] = {
        [PPN_ENV_DOOR] = "door",   [PPN_ENV_DEVICE] = "device", [PPN_ENV_SIM] = "sim",
        [PPN_ENV_SCHED] = "sched", [PPN_ENV_DIAG] = "diagnostics", [PPN_ENV_CLI] = "cli",
    };
    PPN_ASSERT((unsigned)a < PPN_ARRAY_LEN(names));
    return names[a];
}

/* A getter asking for a variable the table lacks, or for the wrong kind, is a bug in the caller. */
static const ppn_env_var *lookup(const char *name, ppn_env_kind kind)
{
    const ppn_env_var *v = ppn_env_find(name);
    PPN_ASSERT(v && "an environment variable missing from core/base/env.c");
    PPN_ASSERT(v->kind == kind);
    return v;
}

/* The variable's value, or NULL when unset or empty (both mean the default). */
static const char *env_text(const ppn_env_var *v)
{
    const char *t = getenv(v->name);
    return t && *t ? t : NULL;
}

/* ---- rules ---------------------------------------------------------------------------------------------- */

static void rule_words(const char *const *w, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; w[i] && k < cap; i++) {
        const char *sep = i == 0 ? "" : w[i + 1] ? ", " : " or ";
        k += (size_t)snprintf(buf + k, cap - k, "%s%s", sep, w[i]);
    }
}

static void rule_size(const ppn_env_var *v, char *buf, size_t cap)
{
    char hi[48] = "";
    if (v->max < LLONG_MAX) snprintf(hi, sizeof hi, " at most %lld", v->max);
    if (v->min == 1)
        snprintf(buf, cap, "a positive number of bytes%s with an optional K, M, G or T suffix (binary, e.g. 8G)",
                 hi);
    else
        snprintf(buf, cap, "a number of bytes from %lld%s with an optional K, M, G or T suffix (binary, e.g. "
                 "8G)", v->min, hi);
}

const char *ppn_env_rule(const ppn_env_var *v, char *buf, size_t cap)
{
    switch (v->kind) {
    case PPN_ENV_FLAG: snprintf(buf, cap, "0 or 1"); break;
    case PPN_ENV_INT:
        /* "at most" alone when the floor is 0: the door's messages have always said "at most 64". */
        if (v->min == 0) snprintf(buf, cap, "a whole number at most %lld", v->max);
        else snprintf(buf, cap, "a whole number from %lld to %lld", v->min, v->max);
        break;
    case PPN_ENV_SIZE: rule_size(v, buf, cap); break;
    case PPN_ENV_ENUM: rule_words(v->words, buf, cap); break;
    case PPN_ENV_INTS: snprintf(buf, cap, "a comma-separated list of at most %lld whole numbers", v->max); break;
    case PPN_ENV_TEXT: snprintf(buf, cap, "%s", v->syntax); break;
    }
    return buf;
}

/* ---- parsers -------------------------------------------------------------------------------------------- */

/* "..." when a quoted value had to be cut short, else "". */
static const char *ell(const char *t) { return strlen(t) > ENV_QUOTE_MAX ? "..." : ""; }

static ppn_status refuse(const ppn_env_var *v, const char *as, const char *text)
{
    char rule[ENV_RULE_MAX];
    return ppn_err(PPN_EINVAL, "%s='%.*s%s': must be %s", as, ENV_QUOTE_MAX, text, ell(text),
                   ppn_env_rule(v, rule, sizeof rule));
}

/* The whole number spelled by [s, end): digits only, at least one, at most lim. Returns 1, or 0 if not. */
static int whole(const char *s, const char *end, unsigned long long lim, unsigned long long *out)
{
    unsigned long long n = 0;
    if (s == end) return 0;
    for (const char *p = s; p < end; p++) {
        if (*p < '0' || *p > '9') return 0;
        unsigned d = (unsigned)(*p - '0');
        if (n > lim / 10 || n * 10 + d > lim) return 0; /* no wrap: every lim is at most LLONG_MAX */
        n = n * 10 + d;
    }
    *out = n;
    return 1;
}

static ppn_status parse_flag(const ppn_env_var *v, const char *as, const char *t, int *out)
{
    if (strcmp(t, "0") != 0 && strcmp(t, "1") != 0) return refuse(v, as, t);
    *out = t[0] - '0';
    return PPN_OK;
}

static ppn_status parse_int(const ppn_env_var *v, const char *as, const char *t, int *out)
{
    unsigned long long n;
    if (!whole(t, t + strlen(t), (unsigned long long)v->max, &n) || n < (unsigned long long)v->min)
        return refuse(v, as, t);
    *out = (int)n;
    return PPN_OK;
}

/* The binary multiplier of a size suffix; 0 for anything else. */
static unsigned long long size_unit(char c)
{
    switch (c) {
    case 'K': case 'k': return 1ull << 10;
    case 'M': case 'm': return 1ull << 20;
    case 'G': case 'g': return 1ull << 30;
    case 'T': case 't': return 1ull << 40;
    default: return 0;
    }
}

static ppn_status parse_size(const ppn_env_var *v, const char *as, const char *t, size_t *out)
{
    const char *end = t;
    while (*end >= '0' && *end <= '9') end++;
    unsigned long long n, unit = *end ? size_unit(*end) : 1;
    if (!unit || (*end && end[1]) || !whole(t, end, (unsigned long long)v->max, &n) ||
        __builtin_mul_overflow(n, unit, &n) || n < (unsigned long long)v->min || n > (unsigned long long)v->max ||
        n > SIZE_MAX)
        return refuse(v, as, t);
    *out = (size_t)n;
    return PPN_OK;
}

static ppn_status parse_enum(const ppn_env_var *v, const char *as, const char *t, int *out)
{
    for (int i = 0; v->words[i]; i++)
        if (strcmp(t, v->words[i]) == 0) {
            *out = i;
            return PPN_OK;
        }
    return refuse(v, as, t);
}

/* Into out[0..*n); out holds at least v->max numbers. Written on failure too: callers parse into a copy. */
static ppn_status parse_ints(const ppn_env_var *v, const char *as, const char *t, int *out, int *n)
{
    int k = 0;
    for (const char *p = t;; k++) {
        const char *end = strchr(p, ',');
        unsigned long long x;
        if (!end) end = p + strlen(p);
        if (k == v->max || !whole(p, end, INT_MAX, &x)) return refuse(v, as, t);
        out[k] = (int)x;
        if (*end == '\0') break;
        p = end + 1;
    }
    *n = k + 1;
    return PPN_OK;
}

/* ---- getters -------------------------------------------------------------------------------------------- */

/* What a typed getter parses: the value, else the table's default (*is_def set); NULL when neither. */
static const char *typed_text(const ppn_env_var *v, int *is_def)
{
    const char *t = env_text(v);
    *is_def = !t;
    return t ? t : v->def;
}

/* A table default that breaks its own rule is a bug in the table. */
static ppn_status checked(ppn_status st, int is_def)
{
    PPN_ASSERT(st == PPN_OK || !is_def);
    return st;
}

ppn_status ppn_env_flag(const char *name, int *out)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_FLAG);
    int is_def;
    const char *t = typed_text(v, &is_def);
    return t ? checked(parse_flag(v, v->name, t, out), is_def) : PPN_OK;
}

ppn_status ppn_env_int(const char *name, int *out)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_INT);
    int is_def;
    const char *t = typed_text(v, &is_def);
    return t ? checked(parse_int(v, v->name, t, out), is_def) : PPN_OK;
}

ppn_status ppn_env_size(const char *name, size_t *out)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_SIZE);
    int is_def;
    const char *t = typed_text(v, &is_def);
    return t ? checked(parse_size(v, v->name, t, out), is_def) : PPN_OK;
}

ppn_status ppn_env_enum(const char *name, int *out)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_ENUM);
    int is_def;
    const char *t = typed_text(v, &is_def);
    return t ? checked(parse_enum(v, v->name, t, out), is_def) : PPN_OK;
}

ppn_status ppn_env_ints(const char *name, int *out, int cap, int *n)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_INTS);
    PPN_ASSERT(cap >= v->max);
    const char *t = env_text(v);
    if (!t) {
        *n = 0;
        return PPN_OK;
    }
    return parse_ints(v, v->name, t, out, n);
}

ppn_status ppn_env_str(const char *name, const char **out)
{
    const ppn_env_var *v = ppn_env_find(name);
    PPN_ASSERT(v && "an environment variable missing from core/base/env.c");
    *out = env_text(v);
    return PPN_OK;
}

/* ---- the same rules for text from elsewhere ------------------------------------------------------------ */

ppn_status ppn_env_parse_flag(const char *name, const char *as, const char *text, int *out)
{
    PPN_ASSERT(as && text);
    return parse_flag(lookup(name, PPN_ENV_FLAG), as, text, out);
}

ppn_status ppn_env_parse_int(const char *name, const char *as, const char *text, int *out)
{
    PPN_ASSERT(as && text);
    return parse_int(lookup(name, PPN_ENV_INT), as, text, out);
}

ppn_status ppn_env_parse_ints(const char *name, const char *as, const char *text, int *out, int cap, int *n)
{
    const ppn_env_var *v = lookup(name, PPN_ENV_INTS);
    PPN_ASSERT(as && text && cap >= v->max);
    return parse_ints(v, as, text, out, n);
}

/* ---- checking what is set ------------------------------------------------------------------------------- */

/* Quietly (no message: a caller's error must survive): is the door open? An invalid MEMRA_PP_STAGES counts as
 * shut, since the door refuses it before reading anything gated. */
static int door_open(void)
{
    const char *t = env_text(lookup("MEMRA_PP_STAGES", PPN_ENV_INT));
    unsigned long long n;
    return t && whole(t, t + strlen(t), PPN_MAX_STAGES, &n) && n >= 2;
}

int ppn_env_ignored(const ppn_env_var *v) { return v->gated && !door_open(); }

ppn_status ppn_env_check(const ppn_env_var *v)
{
    const char *t = env_text(v);
    int i;
    size_t z;
    int list[PPN_MAX_STAGES], n;
    if (!t || ppn_env_ignored(v)) return PPN_OK;
    switch (v->kind) {
    case PPN_ENV_FLAG: return parse_flag(v, v->name, t, &i);
    case PPN_ENV_INT: return parse_int(v, v->name, t, &i);
    case PPN_ENV_SIZE: return parse_size(v, v->name, t, &z);
    case PPN_ENV_ENUM: return parse_enum(v, v->name, t, &i);
    case PPN_ENV_INTS:
        PPN_ASSERT(v->max <= PPN_MAX_STAGES);
        return parse_ints(v, v->name, t, list, &n);
    case PPN_ENV_TEXT: return PPN_OK; /* its reader checks it */
    }
    return PPN_OK;
}

ppn_status ppn_env_check_all(void)
{
    for (int i = 0; i < ppn_env_count(); i++) PPN_CHECK(ppn_env_check(&env_table[i]));
    return PPN_OK;
}
