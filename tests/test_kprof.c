/* test_kprof.c - the kernel-by-kernel account (PPN_KPROF) on the sim backend, through the public API: the calls
 * of each kernel per decode step against what a llama forward issues (counted here from the fixture's
 * config.json, not from ppn), times above zero, the matvec bytes against the weight matrices, the account of
 * a two-stage pipeline (two issue threads) equal to the one-stage one, reset, the switch off, strict values
 * refused by name, and `ppn bench --json` carrying a "kernels" account only when asked. */
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
#include "ppn.h"
#include "core/model/ckpt.h"
#include "tests/util/tutil.h"

#define STEPS 3

/* A fixture's shape (llama-tiny's unless named), read from its config.json with jansson. */
typedef struct shape {
    int layers, dim, heads, kv_heads, head_dim, ffn, vocab;
} shape;

static int cfg_int(json_t *c, const char *key)
{
    json_t *v = json_object_get(c, key);
    if (!json_is_integer(v)) fail_msg("config.json: '%s' is missing or not an integer", key);
    return (int)json_integer_value(v);
}

static shape read_shape_of(const char *fixture)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", tu_fixture(fixture));
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    if (!c) fail_msg("cannot read %s: %s", path, je.text);
    shape s = {cfg_int(c, "num_hidden_layers"), cfg_int(c, "hidden_size"), cfg_int(c, "num_attention_heads"),
               cfg_int(c, "num_key_value_heads"), cfg_int(c, "head_dim"), cfg_int(c, "intermediate_size"),
               cfg_int(c, "vocab_size")};
    json_decref(c);
    return s;
}

static shape read_shape(void) { return read_shape_of("hf/llama-tiny"); }

/* A sim runtime created with PPN_KPROF set to value (NULL: unset). */
/* PPN_TMA, PPN_GEMM_KX, PPN_GEMM_W and PPN_GEMM_W_SWIGLU for the runtimes rt_with creates (NULL: unset). */
static const char *rt_tma, *rt_kx, *rt_w, *rt_wsw;

static ppn_rt *rt_with(const char *value)
{
    tu_env_set("PPN_KPROF", value);
    if (rt_tma) tu_env_set("PPN_TMA", rt_tma);
    if (rt_kx) tu_env_set("PPN_GEMM_KX", rt_kx);
    if (rt_w) tu_env_set("PPN_GEMM_W", rt_w);
    if (rt_wsw) tu_env_set("PPN_GEMM_W_SWIGLU", rt_wsw);
    ppn_rt *rt = NULL;
    ppn_status st = ppn_rt_create("sim", &rt);
    tu_env_restore();
    if (st != PPN_OK) fail_msg("ppn_rt_create(sim) with PPN_KPROF=%s: %s", value ? value : "<unset>", ppn_last_error());
    return rt;
}

static ppn_model *load(ppn_rt *rt, int stages)
{
    ppn_door d = ppn_door_default();
    d.n_stages = stages;
    d.graphs = 0; /* the profile times launches one by one: refused with graphs (pipeline's test) */
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 32;
    o.door = &d;
    return tu_model_load(rt, tu_fixture("hf/llama-tiny"), &o);
}

/* Reset the account, then n decode steps of a fresh sequence (its creation is not counted). */
static void steps_after_reset(ppn_rt *rt, ppn_model *m, int n)
{
    ppn_seq *q = NULL;
    assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
    ppn_rt_kernel_profile_reset(rt);
    for (int t = 0; t < n; t++)
        if (ppn_decode_step(q, 1 + 5 * t, NULL) != PPN_OK) fail_msg("step %d: %s", t, ppn_last_error());
    ppn_seq_destroy(q);
}

static const ppn_kernel_time *find(const ppn_kernel_time *e, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(e[i].name, name)) return &e[i];
    return NULL;
}

/* What one llama decode step issues, per kernel (symbols are "ppn_k_<name>", kernels/ktable.h), with the
 * default door (PPN_FUSE=1): the step header and the embedding row; per layer four projections (q|k|v stacked
 * with the attention norm computed in its input, o, gate|up stacked with the MLP norm in its input, down),
 * attention with the rotary and the k/v store inside, and the SwiGLU; then the lm head with
 * the final norm in its input (docs/PERF.md: the launch plan). */
typedef struct want {
    const char *name;
    long per_step;
} want;

static int wants(const shape *s, want *w)
{
    long L = s->layers;
    int n = 0;
    w[n++] = (want){"ppn_k_set_hdr", 1};
    w[n++] = (want){"ppn_k_embed", 1};
    w[n++] = (want){"ppn_k_matvec", 4 * L + 1};
    w[n++] = (want){"ppn_k_attn", L};
    w[n++] = (want){"ppn_k_swiglu", L};
    return n;
}

/* The profile holds exactly the kernels of w, each with steps * per_step calls and a positive time. */
static void check_counts(const ppn_kernel_time *e, int n, const want *w, int nw, int steps)
{
    if (n != nw) {
        for (int i = 0; i < n; i++) fprintf(stderr, "  %s: %llu calls\n", e[i].name, (unsigned long long)e[i].calls);
        fail_msg("%d kernels in the profile, expected %d", n, nw);
    }
    for (int i = 0; i < nw; i++) {
        const ppn_kernel_time *k = find(e, n, w[i].name);
        if (!k) fail_msg("no entry for %s", w[i].name);
        if ((long)k->calls != w[i].per_step * steps)
            fail_msg("%s: %llu calls over %d steps, expected %ld", w[i].name, (unsigned long long)k->calls, steps,
                     w[i].per_step * steps);
        if (!(k->ms > 0)) fail_msg("%s: time %g ms", w[i].name, k->ms);
        if (!(k->bytes > 0)) fail_msg("%s: %g bytes", w[i].name, k->bytes);
    }
}

/* Matvec streams every weight matrix once per step: its declared bytes are the matrices plus, per call, at
 * most its input, output, residual and bias vectors. */
static void check_matvec_bytes(const ppn_kernel_time *e, int n, const shape *s, int dtype, int steps)
{
    double es = dtype == PPN_DTYPE_F32 ? 4 : 2, L = s->layers, d = s->dim, q = (double)s->heads * s->head_dim,
           kv = (double)s->kv_heads * s->head_dim, f = s->ffn, v = s->vocab;
    double mats = L * (d * q + 2 * d * kv + q * d + 3 * d * f) + v * d;
    double rows_cols = L * ((q + d) + 2 * (kv + d) + (d + q) + 2 * (f + d) + (d + f)) + (v + d); /* per step */
    const ppn_kernel_time *k = find(e, n, "ppn_k_matvec");
    assert_non_null(k);
    double lo = steps * mats * es, hi = lo + steps * rows_cols * 3 * 4;
    if (!(k->bytes > lo && k->bytes <= hi)) fail_msg("matvec bytes %.0f, expected in (%.0f, %.0f]", k->bytes, lo, hi);
}

static void test_kprof_counts_match_forward(void **st)
{
    (void)st;
    shape s = read_shape();
    want w[16];
    int nw = wants(&s, w);
    ppn_rt *rt = rt_with("1");
    ppn_model *m = load(rt, 1);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    assert_int_equal(mi.n_layers, s.layers);
    steps_after_reset(rt, m, STEPS);
    ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
    int n = ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
    check_counts(e, n, w, nw, STEPS);
    check_matvec_bytes(e, n, &s, mi.dtype, STEPS);
    /* max caps the entries written */
    ppn_kernel_time two[2];
    assert_int_equal(ppn_rt_kernel_profile(rt, two, 2), 2);
    /* reset zeroes; one more step is counted alone */
    ppn_rt_kernel_profile_reset(rt);
    assert_int_equal(ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX), 0);
    steps_after_reset(rt, m, 1);
    n = ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
    check_counts(e, n, w, nw, 1);
    ppn_model_free(m);
    ppn_rt_destroy(rt);
}

/* Two stages on two devices: two issue threads and streams feed the account at once; it adds up the same. */
static void test_kprof_pipelined_counts(void **st)
{
    (void)st;
    shape s = read_shape();
    want w[16];
    int nw = wants(&s, w);
    ppn_rt *rt = rt_with("1");
    ppn_door d = ppn_door_default();
    d.n_stages = 2;
    d.graphs = 0;
    d.n_devices = 2;
    d.devices[0] = 0;
    d.devices[1] = 1;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 32;
    o.door = &d;
    ppn_model *m = tu_model_load(rt, tu_fixture("hf/llama-tiny"), &o);
    ppn_stage_info si;
    ppn_model_get_stage_map(m, &si);
    assert_int_equal(si.n_stages, 2);
    steps_after_reset(rt, m, STEPS);
    ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
    int n = ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
    check_counts(e, n, w, nw, STEPS);
    ppn_model_free(m);
    ppn_rt_destroy(rt);
}

/* A model at path for the batch tests below: graphs off (the profile times launches one by one), PPN_FUSE as fuse,
 * ctx 32, kv_tokens and dtype as given (0 / PPN_DTYPE_DEFAULT: the defaults). */
static ppn_model *load_fuse(ppn_rt *rt, const char *path, int fuse, int kv_tokens, int dtype)
{
    ppn_door d = ppn_door_default();
    d.graphs = 0;
    d.fuse = fuse;
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 32;
    o.kv_tokens = kv_tokens;
    o.dtype = dtype;
    o.door = &d;
    return tu_model_load(rt, path, &o);
}

/* One batch step of q with the account reset before it: its entries into e, their count returned. o: NULL, or a
 * mixed step's prompt slices. */
static int batch_step_profiled_ex(ppn_rt *rt, ppn_seq **q, const int *tok, int nb, const ppn_batch_opts *o,
                                  float *logits, ppn_kernel_time *e)
{
    ppn_rt_kernel_profile_reset(rt);
    if (ppn_decode_batch_ex(q, tok, nb, o, logits, NULL) != PPN_OK) fail_msg("batch step: %s", ppn_last_error());
    return ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
}

static int batch_step_profiled(ppn_rt *rt, ppn_seq **q, const int *tok, int nb, float *logits, ppn_kernel_time *e)
{
    return batch_step_profiled_ex(rt, q, tok, nb, NULL, logits, e);
}

/* A batch step's launch plan per door: with the fusion on (the default), each layer's rows take their rotary and
 * k/v store inside the batched attention (ppn_k_attn_batch, no ppn_k_rope_kv_batch); with PPN_FUSE=0 both launch.
 * The logits are the same bits either way. */
static void test_kprof_batch_rotary_fused(void **st)
{
    (void)st;
    shape s = read_shape();
    enum { NB = 3 };
    static const int prompt[NB][3] = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, tok[NB] = {11, 12, 13};
    float *logits[2];
    ppn_rt *rt = rt_with("1");
    for (int fuse = 1; fuse >= 0; fuse--) {
        ppn_model *m = load_fuse(rt, tu_fixture("hf/llama-tiny"), fuse, 0, PPN_DTYPE_DEFAULT);
        ppn_seq *q[NB];
        for (int i = 0; i < NB; i++) {
            assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
            assert_int_equal(ppn_prefill(q[i], prompt[i], 1 + i, NULL, NULL), PPN_OK);
        }
        logits[fuse] = malloc(sizeof(float) * NB * (size_t)s.vocab);
        ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
        int n = batch_step_profiled(rt, q, tok, NB, logits[fuse], e);
        const ppn_kernel_time *a = find(e, n, "ppn_k_attn_batch"), *r = find(e, n, "ppn_k_rope_kv_batch");
        if (!a || (long)a->calls != s.layers) fail_msg("fuse %d: ppn_k_attn_batch %llu calls, want %d", fuse,
                                                       a ? (unsigned long long)a->calls : 0ull, s.layers);
        if (fuse ? r != NULL : !r || (long)r->calls != s.layers)
            fail_msg("fuse %d: ppn_k_rope_kv_batch %llu calls, want %d", fuse, r ? (unsigned long long)r->calls : 0ull,
                     fuse ? 0 : s.layers);
        for (int i = 0; i < NB; i++) ppn_seq_destroy(q[i]);
        assert_int_equal(ppn_model_free(m), PPN_OK);
    }
    assert_memory_equal(logits[0], logits[1], sizeof(float) * NB * (size_t)s.vocab);
    free(logits[0]), free(logits[1]);
    ppn_rt_destroy(rt);
}

/* nb + 1 sequences of m (q[nb]: a mixed walk's prompt slice's), each primed with 2 ids; the batch's next ids into tok
 * and the slice's slice ids into pid. */
static void prime_rows(ppn_model *m, int vocab, ppn_seq **q, int nb, int *tok, int *pid, int slice)
{
    for (int i = 0; i <= nb; i++) {
        int prompt[2] = {(3 * i + 1) % vocab, (5 * i + 2) % vocab};
        assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
        assert_int_equal(ppn_prefill(q[i], prompt, 2, NULL, NULL), PPN_OK);
        if (i < nb) tok[i] = (7 * i + 3) % vocab;
    }
    for (int i = 0; i < slice; i++) pid[i] = (11 * i + 5) % vocab;
}

/* One walk's kernel account for a fuse_walk check: the profile, the model's shape, the arm (fuse), the prompt slice's
 * rows (0: a batch walk alone) and the caller's expectations (ctx). */
typedef void (*walk_check)(const ppn_kernel_time *e, int n, const ppn_model_info *mi, int fuse, int slice,
                           const void *ctx);

/* nb batch rows (and a prompt slice of `slice` rows beside them in one mixed walk, ppn_batch_opts.n_prime, where
 * slice > 0) on a `ppn mkmodel` shape's bf16 weights (seed 11), on a runtime rt_with("1") makes (rt_tma, rt_kx and rt_w
 * as the caller set them), with the fusion on and then off: check reads each arm's kernel account; the slice's logits
 * come back finite and not all zero; both arms' logits are the same bits. The sim's checker holds every launch to its
 * declared accesses. */
static void fuse_walk(const char *shape_name, int nb, int slice, walk_check check, const void *ctx)
{
    enum { NB = 40 };
    assert_true(nb >= 1 && nb <= NB && slice >= 0 && slice <= 16);
    char *dir = tu_tmpdir();
    assert_int_equal(ppn_mkmodel(shape_name, PPN_DTYPE_BF16, dir, 11), PPN_OK);
    int tok[NB], pid[16];
    ppn_seq *q[NB + 1]; /* the batch's nb, then the slice's sequence at q[nb] */
    float *logits[2] = {0};
    ppn_rt *rt = rt_with("1");
    for (int fuse = 1; fuse >= 0; fuse--) {
        ppn_model *m = load_fuse(rt, dir, fuse, (NB + 1) * 32, PPN_DTYPE_BF16);
        ppn_model_info mi;
        ppn_model_get_info(m, &mi);
        prime_rows(m, mi.vocab, q, nb, tok, pid, slice);
        size_t v = (size_t)mi.vocab, bytes = sizeof(float) * (size_t)(nb + 1) * v;
        logits[fuse] = calloc((size_t)(nb + 1) * v, sizeof(float));
        assert_non_null(logits[fuse]);
        float *pout = logits[fuse] + (size_t)nb * v;
        const int *pids = pid;
        ppn_batch_opts o = {.n_prime = 1, .prime_seqs = &q[nb], .prime_ids = &pids, .prime_n = &slice,
                            .prime_logits = &pout};
        ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
        int n = batch_step_profiled_ex(rt, q, tok, nb, slice ? &o : NULL, logits[fuse], e);
        check(e, n, &mi, fuse, slice, ctx);
        if (slice) {
            int nz = 0; /* the slice's logits came back: finite, not the zeros put there */
            for (size_t k = 0; k < v; k++) assert_true(isfinite(pout[k])), nz += pout[k] != 0.0f;
            assert_true(nz > 0);
        }
        for (int i = 0; i <= nb; i++) ppn_seq_destroy(q[i]);
        assert_int_equal(ppn_model_free(m), PPN_OK);
        if (!fuse) assert_memory_equal(logits[0], logits[1], bytes);
    }
    free(logits[0]), free(logits[1]);
    ppn_rt_destroy(rt);
    tu_rmrf(dir);
    free(dir);
}

/* A batch of 40 rows on bf16 weights of a `ppn mkmodel` shape whose GEMMs of 4096 rows take the middle split-K tile
 * gemm_tc_kw (kernels/ops_gemm.c): with the fusion on (the default) their x's producers write it in bf16 and they
 * run gemm_tc_kw16: wide-tiny's q|k|v, gate|up and head over 64 columns (the rows norms; its o and down have 64 rows:
 * gemm_tc_kwx, f32 x), wide-dim-tiny's o and down (the batch's attention, SwiGLU; its other matrices have fewer
 * rows). Where gate|up takes it (wide-tiny), SwiGLU runs in its epilogue (gemm_swiglu, no ppn_k_swiglu_rows: the
 * sim runs TMA kernels). With PPN_FUSE=0 all take f32 x through gemm_tc_kw and SwiGLU its own kernel. The sim's
 * checker holds every launch to its declared accesses (2 bytes an element of x there), and the logits are the same
 * bits (fuse_walk). per_layer: gemm_tc_kw16's launches a layer besides gate|up's, gu: 1 where gate|up takes bf16 x.
 * slice: 0, or the rows of a prompt slice fed beside the batch in one mixed walk (ppn_batch_opts.n_prime): there o
 * keeps f32 x (core/forward.c: a mixed step was level with attn_rows' bf16 out), one f32 launch a layer with the fusion
 * on too; its logits too are the same bits. nb: the batch (40; at 8 rows the tiny shape's GEMMs take gemm_tc_k, so
 * gemm_tc_k16 with the fusion on: names the kernels counted). */
typedef struct x16_want {
    const char *shape, *x16_name, *f32_name;
    long per_layer, head, gu;
} x16_want;

static void x16_check(const ppn_kernel_time *e, int n, const ppn_model_info *mi, int fuse, int slice, const void *ctx)
{
    const x16_want *w = ctx;
    const ppn_kernel_time *h = find(e, n, w->x16_name), *f32 = find(e, n, w->f32_name);
    const int kx = rt_kx && !strcmp(rt_kx, "1"); /* PPN_GEMM_KX=1: gemm_swiglu_x (a mixed walk's o stays f32) */
    const char *fn = rt_tma && !strcmp(rt_tma, "2") ? "ppn_k_gemm_swiglu_t"
                     : kx                           ? "ppn_k_gemm_swiglu_x"
                                                    : "ppn_k_gemm_swiglu";
    const ppn_kernel_time *f = find(e, n, fn), *r = find(e, n, "ppn_k_swiglu_rows");
    long hc = h ? (long)h->calls : 0, wc = f32 ? (long)f32->calls : 0, n_x16 = w->per_layer * mi->n_layers + w->head;
    long fc = f ? (long)f->calls : 0, rc = r ? (long)r->calls : 0, n_gu = w->gu * mi->n_layers;
    long o32 = slice ? mi->n_layers : 0; /* a mixed walk's o on f32 x, whatever PPN_GEMM_KX says */
    if (hc != (fuse ? n_x16 - o32 : 0) || wc != (fuse ? o32 : n_x16 + n_gu))
        fail_msg("%s, fuse %d: %s %ld calls, %s %ld (want %ld and %ld)", w->shape, fuse, w->x16_name, hc, w->f32_name,
                 wc, fuse ? n_x16 - o32 : 0, fuse ? o32 : n_x16 + n_gu);
    if (fc != (fuse ? n_gu : 0) || rc != (fuse ? mi->n_layers - n_gu : mi->n_layers))
        fail_msg("%s, fuse %d: gemm_swiglu %ld calls, swiglu_rows %ld (want %ld and %ld)", w->shape, fuse, fc, rc,
                 fuse ? n_gu : 0, fuse ? mi->n_layers - n_gu : (long)mi->n_layers);
    if (slice) { /* the walk was mixed: its attention rows and the batch's, one launch of each a layer */
        static const char *const ak[] = {"ppn_k_attn_rows", "ppn_k_attn_rows_bf16", "ppn_k_attn_rows_f16"};
        long ac = 0;
        for (int k = 0; k < 3; k++) ac += find(e, n, ak[k]) ? (long)find(e, n, ak[k])->calls : 0L;
        if (ac != mi->n_layers)
            fail_msg("%s, slice %d: ppn_k_attn_rows* %ld calls, want %d", w->shape, slice, ac, mi->n_layers);
    }
}

static void batch_x16_rows(const char *shape_name, int nb, const char *x16_name, const char *f32_name, long per_layer,
                           long head, long gu, int slice)
{
    const x16_want w = {shape_name, x16_name, f32_name, per_layer, head, gu};
    fuse_walk(shape_name, nb, slice, x16_check, &w);
}

/* With PPN_TMA=2 the same GEMMs run gemm_tc_kwt and gate|up gemm_swiglu_t (W through tensor maps the sim's
 * references read back), the same counts and bits; with PPN_GEMM_KX=1 gemm_tc_kx and gemm_swiglu_x (a mixed walk's o
 * still gemm_tc_kw on f32 x), the same bits. */
static void batch_x16_case(const char *shape_name, long per_layer, long head, long gu, int slice)
{
    rt_w = "0"; /* the split-K tiles' forms whatever the environment says (at 1 and 2 gemm_tc_w takes wide grids) */
    batch_x16_rows(shape_name, 40, "ppn_k_gemm_tc_kw16", "ppn_k_gemm_tc_kw", per_layer, head, gu, slice);
    rt_tma = "2";
    batch_x16_rows(shape_name, 40, "ppn_k_gemm_tc_kwt", "ppn_k_gemm_tc_kw", per_layer, head, gu, slice);
    rt_tma = "3"; /* PPN_TMA=3 (gemm_tc_k16t alone) leaves the middle tile as at level 1 */
    batch_x16_rows(shape_name, 40, "ppn_k_gemm_tc_kw16", "ppn_k_gemm_tc_kw", per_layer, head, gu, slice);
    rt_tma = NULL;
    rt_kx = "1";
    batch_x16_rows(shape_name, 40, "ppn_k_gemm_tc_kx", "ppn_k_gemm_tc_kw", per_layer, head, gu, slice);
    rt_kx = NULL;
    rt_w = NULL;
}

static void test_kprof_batch_x16(void **st)
{
    (void)st;
    batch_x16_case("wide-tiny", 1, 1, 1, 0);
}

static void test_kprof_batch_x16_attention(void **st)
{
    (void)st;
    batch_x16_case("wide-dim-tiny", 2, 0, 0, 0);
}

/* The same in a mixed walk (a prompt slice of 8 rows beside the 40 decode rows): down takes bf16 x, o f32 (one
 * launch of each a layer, under PPN_GEMM_KX=1 too), the same bits as with the fusion off. */
static void test_kprof_mixed_x16_attention(void **st)
{
    (void)st;
    batch_x16_case("wide-dim-tiny", 2, 0, 0, 8);
}

/* Few rows (8, and 8 beside a 4-row prompt slice), where the op runs gemm_tc_k on every GEMM of the tiny shape (its
 * columns whole 64-element blocks): with the fusion on all take bf16 x through gemm_tc_k16 (q|k|v, o, gate|up and
 * down a layer, and the head; the mixed walk's o on f32), with it off gemm_tc_k on f32; the same bits. */
static void test_kprof_batch_k16(void **st)
{
    (void)st;
    rt_w = "0";
    batch_x16_rows("tiny", 8, "ppn_k_gemm_tc_k16", "ppn_k_gemm_tc_k", 4, 1, 0, 0);
    batch_x16_rows("tiny", 8, "ppn_k_gemm_tc_k16", "ppn_k_gemm_tc_k", 4, 1, 0, 4);
    rt_tma = "2"; /* PPN_TMA=2: gemm_tc_k16t (W and x through tensor maps), the same counts and bits */
    batch_x16_rows("tiny", 8, "ppn_k_gemm_tc_k16t", "ppn_k_gemm_tc_k", 4, 1, 0, 0);
    batch_x16_rows("tiny", 8, "ppn_k_gemm_tc_k16t", "ppn_k_gemm_tc_k", 4, 1, 0, 4);
    rt_tma = "3"; /* PPN_TMA=3: gemm_tc_k16t alone of the TMA forms, the same again */
    batch_x16_rows("tiny", 8, "ppn_k_gemm_tc_k16t", "ppn_k_gemm_tc_k", 4, 1, 0, 4);
    rt_tma = NULL;
    rt_w = NULL;
}

/* PPN_GEMM_W: the GEMMs of a mixed walk (40 batch rows + 8 prompt rows) on wide-tiny that gemm_tc_w
 * takes, x in bf16 row-major from its producer (the rows norm for q|k|v and the head, attention for o over the prompt's
 * rows and the batch's alike, gemm_swiglu_w's epilogue for down), and the logits the same bits as with the fusion
 * off (f32 x, the op's tiles); the sim's checker holds each launch to its declared accesses (gemm_tc_w and
 * gemm_swiglu_w read their operands where their tensor maps say). per_layer: gemm_tc_w's launches a layer (plus the
 * head's); gu_w: gate|up on gemm_swiglu_w (where gemm_tc_w takes its shape, up to 128 rows, and PPN_GEMM_W_SWIGLU
 * is on: core/forward.c), else on the split-K gemm_swiglu. At 1 every GEMM; at 2 q|k|v, gate|up and the head (4,096
 * rows: 64 CTAs) but not o and down (64 rows); at 3 (prompt chunks, from 256 tokens) none; at 4 (the default) level
 * 2's (48 rows: the op runs neither gemm_tc_k nor gemm_tc_kx there); at 4 with PPN_GEMM_W_SWIGLU=0 gate|up on
 * gemm_swiglu again (its default, 2, and 1 take gemm_swiglu_w alike at 48 rows). (A batch walk alone and level 0 ran here too until ThreadSanitizer's
 * run of the whole test passed 900 s on CI's 2-core machine: the mixed walk holds the batch's rows.) */
typedef struct w_want {
    const char *level;
    long per_layer;
    int gu_w;
} w_want;

static void w_check(const ppn_kernel_time *e, int n, const ppn_model_info *mi, int fuse, int slice, const void *ctx)
{
    const w_want *w = ctx;
    const char *level = w->level ? w->level : "<unset>";
    const ppn_kernel_time *t = find(e, n, "ppn_k_gemm_tc_w"), *f = find(e, n, "ppn_k_gemm_swiglu"),
                          *sw = find(e, n, "ppn_k_gemm_swiglu_w");
    long wc = t ? (long)t->calls : 0, fc = f ? (long)f->calls : 0, swc = sw ? (long)sw->calls : 0;
    long wantc = fuse && w->per_layer ? w->per_layer * mi->n_layers + 1 : 0;
    long want_f = fuse && !w->gu_w ? mi->n_layers : 0, want_sw = fuse && w->gu_w ? mi->n_layers : 0;
    if (wc != wantc || fc != want_f || swc != want_sw)
        fail_msg("PPN_GEMM_W=%s, slice %d, fuse %d: gemm_tc_w %ld calls, gemm_swiglu %ld, gemm_swiglu_w %ld (want %ld, "
                 "%ld and %ld)", level, slice, fuse, wc, fc, swc, wantc, want_f, want_sw);
    if (fuse && w->per_layer == 3 && (find(e, n, "ppn_k_gemm_tc_kw16") || find(e, n, "ppn_k_gemm_tc_kw")))
        fail_msg("PPN_GEMM_W=%s, slice %d: a split-K tile ran beside gemm_tc_w (%s %s)", level, slice,
                 find(e, n, "ppn_k_gemm_tc_kw16") ? "kw16" : "", find(e, n, "ppn_k_gemm_tc_kw") ? "kw" : "");
}

static void gemm_w_rows(const char *w_level, int slice, long want_w, int gu_w)
{
    const w_want w = {w_level, want_w, gu_w};
    rt_w = w_level;
    fuse_walk("wide-tiny", 40, slice, w_check, &w);
    rt_w = NULL;
}

/* A 300-token prompt on wide-tiny: under PPN_GEMM_W=1 every layer's four GEMMs on gemm_tc_w; under the default (4:
 * level 2's rule there) q|k|v and gate|up (4,096 rows: 64 CTAs) but not o and down (64 rows: 2); gate|up's f32 output
 * through SwiGLU rows (no fused SwiGLU at 300 rows); each arm's logits the bytes of the fusion off (f32 x, the op's
 * tiles: on the sim every tile's sums are the reference's one sum). */
static void gemm_w_prompt(void)
{
    enum { N = 300 };
    static const struct {
        const char *level;
        int fuse, per_layer;
    } arm[] = {{"1", 1, 4}, {NULL, 1, 2}, {NULL, 0, 0}};
    enum { ARMS = sizeof arm / sizeof arm[0] };
    char *dir = tu_tmpdir();
    assert_int_equal(ppn_mkmodel("wide-tiny", PPN_DTYPE_BF16, dir, 13), PPN_OK);
    float *logits[ARMS] = {0};
    int ids[N];
    for (int a = 0; a < ARMS; a++) {
        rt_w = arm[a].level;
        ppn_rt *rt = rt_with("1");
        rt_w = NULL;
        ppn_door d = ppn_door_default();
        d.graphs = 0;
        d.fuse = arm[a].fuse;
        ppn_load_opts o = ppn_load_opts_default();
        o.ctx = N + 4;
        o.dtype = PPN_DTYPE_BF16;
        o.door = &d;
        ppn_model *m = tu_model_load(rt, dir, &o);
        ppn_model_info mi;
        ppn_model_get_info(m, &mi);
        for (int i = 0; i < N; i++) ids[i] = (13 * i + 7) % mi.vocab;
        logits[a] = malloc(sizeof(float) * (size_t)mi.vocab);
        assert_non_null(logits[a]);
        ppn_seq *q;
        assert_int_equal(ppn_seq_create(m, &q), PPN_OK);
        ppn_rt_kernel_profile_reset(rt);
        assert_int_equal(ppn_prefill(q, ids, N, NULL, logits[a]), PPN_OK);
        ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
        int n = ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX);
        const ppn_kernel_time *w = find(e, n, "ppn_k_gemm_tc_w"), *r = find(e, n, "ppn_k_swiglu_rows");
        long wc = w ? (long)w->calls : 0, rc = r ? (long)r->calls : 0, L = mi.n_layers;
        if (wc != arm[a].per_layer * L || rc != L)
            fail_msg("a %d-token prompt, PPN_GEMM_W=%s, fuse %d: gemm_tc_w %ld calls, swiglu_rows %ld (want %ld and "
                     "%ld)", N, arm[a].level ? arm[a].level : "<unset>", arm[a].fuse, wc, rc, arm[a].per_layer * L, L);
        ppn_seq_destroy(q);
        assert_int_equal(ppn_model_free(m), PPN_OK);
        ppn_rt_destroy(rt);
        if (a) assert_memory_equal(logits[0], logits[a], sizeof(float) * (size_t)mi.vocab);
    }
    for (int a = 0; a < ARMS; a++) free(logits[a]);
    tu_rmrf(dir);
    free(dir);
}

/* PPN_GEMM_W_SWIGLU on wide-tiny's 40 + 8-row mixed walk under PPN_GEMM_KX=1 (gemm_tc_kx wherever the middle split-K
 * tile runs): level 4 leaves its matrices to the op's gemm_tc_kx (gate|up on gemm_swiglu_x), but level 2's rule takes
 * gate|up (4,096 rows: 64 CTAs), so at 2 (the default) gate|up runs gemm_swiglu_w, a launch a layer, and at 1 none; no
 * gemm_tc_w either way; the logits the bytes of the fusion off. On a 16-row batch walk the op runs gemm_tc_k on
 * gate|up, which 2 leaves alone too. */
static void wsw_check(const ppn_kernel_time *e, int n, const ppn_model_info *mi, int fuse, int slice, const void *ctx)
{
    const int takes = *(const int *)ctx; /* 1: gate|up on gemm_swiglu_w */
    const ppn_kernel_time *sw = find(e, n, "ppn_k_gemm_swiglu_w"), *t = find(e, n, "ppn_k_gemm_tc_w");
    long swc = sw ? (long)sw->calls : 0, want_sw = fuse && takes ? mi->n_layers : 0;
    if (swc != want_sw || t)
        fail_msg("PPN_GEMM_W_SWIGLU=%s, slice %d, fuse %d: gemm_swiglu_w %ld calls (want %ld), gemm_tc_w %ld",
                 rt_wsw ? rt_wsw : "<unset>", slice, fuse, swc, want_sw, t ? (long)t->calls : 0L);
}

static void test_kprof_gemm_w(void **st)
{
    (void)st;
    gemm_w_rows("1", 8, 3, 1);  /* q|k|v, o and down a layer, and the head; gate|up on gemm_swiglu_w */
    gemm_w_rows("2", 8, 1, 1);  /* level 2's rule: q|k|v, gate|up and the head */
    gemm_w_rows("3", 8, 0, 0);  /* prompt chunks, from 256 tokens: none in 48 rows */
    gemm_w_rows(NULL, 8, 1, 1); /* the default, 4: level 2's rule at 48 rows */
    rt_wsw = "0";
    gemm_w_rows(NULL, 8, 1, 0); /* the A/B arm: gate|up on the split-K gemm_swiglu, the rest as at 4 */
    rt_kx = "1";
    for (int takes = 0; takes <= 1; takes++) {
        rt_wsw = takes ? NULL : "1";
        fuse_walk("wide-tiny", 40, 8, wsw_check, &takes);
    }
    rt_kx = NULL;
    const int none = 0; /* at the default, 2, as at 1 where the op runs gemm_tc_k */
    rt_wsw = NULL;
    fuse_walk("wide-tiny", 16, 0, wsw_check, &none);
    gemm_w_prompt();
}

/* The batch step's attention on tensor cores (PPN_ATTN_TC, the default) where the cache is bf16 and the heads fit
 * (qwen3-tiny: head_dim 64, 2 query heads a KV head): per layer ppn_k_rope_kv_batch then ppn_k_attn_batch_tc, with
 * PPN_FUSE 1 and 0 alike (the fused form is slower: core/forward.c), the same logits bits; with PPN_ATTN_TC=0 the
 * decode kernel per row with the rotary inside (ppn_k_attn_batch_bf16 alone). Rows at different positions; each row's logits
 * against the same sequence decoded alone (ppn_decode_step, f32 attention) within the bf16 fixtures' tolerance
 * (tests/test_fixtures.c: 2e-2 of max(1, max|row|)) in every arm, and the tensor-core and decode kernels' logits not
 * the same bits (q and the weights rounded). The sim's checker holds every launch to its declared accesses. */
static void test_kprof_batch_attn_tc(void **st)
{
    (void)st;
    enum { NB = 6 };
    char *dir = tu_tmpdir();
    assert_int_equal(ppn_mkmodel("qwen3-tiny", PPN_DTYPE_BF16, dir, 5), PPN_OK);
    ppn_rt *rt = rt_with("1");
    float *logits[3] = {0};
    for (int arm = 0; arm < 3; arm++) { /* tc + fused, tc + PPN_FUSE=0, PPN_ATTN_TC=0 */
        const int tc = arm < 2, fuse = arm != 1;
        ppn_door d = ppn_door_default();
        d.graphs = 0;
        d.attn_tc = tc;
        d.fuse = fuse;
        ppn_load_opts o = ppn_load_opts_default();
        o.ctx = 32;
        o.dtype = PPN_DTYPE_BF16;
        o.door = &d;
        ppn_model *m = tu_model_load(rt, dir, &o);
        ppn_model_info mi;
        ppn_model_get_info(m, &mi);
        ppn_seq *q[NB];
        int prompt[NB][NB + 1], tok[NB];
        for (int i = 0; i < NB; i++) {
            for (int t = 0; t <= i; t++) prompt[i][t] = (11 * i + 5 * t + 1) % mi.vocab;
            tok[i] = (7 * i + 3) % mi.vocab;
            assert_int_equal(ppn_seq_create(m, &q[i]), PPN_OK);
            assert_int_equal(ppn_prefill(q[i], prompt[i], i + 1, NULL, NULL), PPN_OK);
        }
        logits[arm] = malloc(sizeof(float) * NB * (size_t)mi.vocab);
        assert_non_null(logits[arm]);
        ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
        int n = batch_step_profiled(rt, q, tok, NB, logits[arm], e);
        const ppn_kernel_time *t = find(e, n, "ppn_k_attn_batch_tc"), *r = find(e, n, "ppn_k_rope_kv_batch");
        const ppn_kernel_time *b = find(e, n, "ppn_k_attn_batch_bf16");
        long tcc = t ? (long)t->calls : 0, rc = r ? (long)r->calls : 0, bc = b ? (long)b->calls : 0, L = mi.n_layers;
        if (tcc != (tc ? L : 0) || rc != (tc ? L : 0) || bc != (tc ? 0 : L))
            fail_msg("PPN_ATTN_TC %d PPN_FUSE %d: attn_batch_tc %ld, rope_kv_batch %ld, attn_batch_bf16 %ld calls (%ld "
                     "layers)", tc, fuse, tcc, rc, bc, L);
        float *alone = malloc(sizeof(float) * (size_t)mi.vocab);
        assert_non_null(alone);
        tu_cmp c = {0};
        for (int i = 0; i < NB; i++) {
            ppn_seq *s1;
            assert_int_equal(ppn_seq_create(m, &s1), PPN_OK);
            for (int k = 0; k <= i; k++) assert_int_equal(ppn_decode_step(s1, prompt[i][k], NULL), PPN_OK);
            assert_int_equal(ppn_decode_step(s1, tok[i], alone), PPN_OK);
            tu_cmp_row(&c, i, logits[arm] + (size_t)i * mi.vocab, alone, mi.vocab, 2e-2, -1);
            ppn_seq_destroy(s1);
        }
        printf("# PPN_ATTN_TC=%d PPN_FUSE=%d: %d rows, worst at %.3g of the bf16 tolerance against each decoded alone\n",
               tc, fuse, NB, c.worst_ratio);
        assert_true(c.worst_ratio <= 1.0);
        assert_int_equal(c.greedy_mismatch, 0);
        free(alone);
        for (int i = 0; i < NB; i++) ppn_seq_destroy(q[i]);
        assert_int_equal(ppn_model_free(m), PPN_OK);
        if (arm == 1) assert_memory_equal(logits[0], logits[1], sizeof(float) * NB * (size_t)mi.vocab);
        if (arm == 2 && !memcmp(logits[0], logits[2], sizeof(float) * NB * (size_t)mi.vocab))
            fail_msg("PPN_ATTN_TC 1 and 0 gave the same bits: the tensor-core form did not run");
    }
    free(logits[0]), free(logits[1]), free(logits[2]);
    ppn_rt_destroy(rt);
    tu_rmrf(dir);
    free(dir);
}

/* Unset, empty or 0: no account at all, whatever runs. */
static void test_kprof_off_reads_nothing(void **st)
{
    (void)st;
    const char *values[] = {NULL, "", "0"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        ppn_rt *rt = rt_with(values[i]);
        ppn_model *m = load(rt, 1);
        steps_after_reset(rt, m, 2);
        ppn_kernel_time e[PPN_KERNEL_PROFILE_MAX];
        if (ppn_rt_kernel_profile(rt, e, PPN_KERNEL_PROFILE_MAX) != 0)
            fail_msg("PPN_KPROF=%s: the profile is not empty", values[i] ? values[i] : "<unset>");
        ppn_model_free(m);
        ppn_rt_destroy(rt);
    }
}

static void test_kprof_bad_values_refused(void **st)
{
    (void)st;
    const char *values[] = {"yes", "2", " 1", "1 ", "true"};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        tu_env_set("PPN_KPROF", values[i]);
        ppn_rt *rt = NULL;
        ppn_status s = ppn_rt_create("sim", &rt);
        tu_env_restore();
        if (s != PPN_EINVAL || !strstr(ppn_last_error(), "PPN_KPROF"))
            fail_msg("PPN_KPROF='%s': %s, '%s'", values[i], ppn_status_name(s), ppn_last_error());
        assert_null(rt);
    }
}

/* `ppn bench <args>` after the environment assignments env (tu_run_ppn). */
static int bench(const char *env, const char *args, char **out, char **err)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "bench %s", args);
    return tu_run_ppn(env, cmd, out, err, NULL);
}

static json_t *bench_json(const char *env)
{
    char *out = NULL, *err = NULL;
    int rc = bench(env, "--shape tiny --backend sim -n 4 --prompt 2 --reps 1 --json", &out, &err);
    if (rc != 0 || !out) fail_msg("bench (%s) exited %d:\n%s\n%s", env, rc, out ? out : "", err ? err : "");
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    if (!r) fail_msg("bench output is not JSON (%s):\n%s", je.text, out);
    free(out);
    free(err);
    return r;
}

static void test_kprof_bench_json_kernels(void **st)
{
    (void)st;
    json_t *r = bench_json("PPN_KPROF=1 PPN_GRAPHS=0");
    int layers = (int)num(r, "n_layers");
    json_t *c = json_array_get(json_object_get(r, "configs"), 0);
    assert_true(json_is_object(c));
    json_t *ks = json_object_get(c, "kernels");
    if (!json_is_array(ks) || json_array_size(ks) == 0) fail_msg("no \"kernels\" array in the config");
    double median_us = num(c, "median_ms") * 1e3, share_sum = 0, us_sum = 0;
    int saw_matvec = 0;
    for (size_t i = 0; i < json_array_size(ks); i++) {
        json_t *k = json_array_get(ks, i);
        const char *name = json_string_value(json_object_get(k, "name"));
        assert_non_null(name);
        double us = num(k, "us_per_step"), share = num(k, "share");
        assert_true(num(k, "calls_per_step") > 0);
        assert_true(us > 0);
        assert_true(num(k, "gbs") > 0);
        if (fabs(share - us / median_us) > 1e-6 * (1 + share)) fail_msg("%s: share %g vs us/median %g", name, share,
                                                                        us / median_us);
        share_sum += share;
        us_sum += us;
        if (!strcmp(name, "ppn_k_matvec")) {
            saw_matvec = 1;
            if (num(k, "calls_per_step") != 4.0 * layers + 1)
                fail_msg("matvec calls per step %g, expected %d", num(k, "calls_per_step"), 4 * layers + 1);
        }
    }
    assert_true(saw_matvec);
    if (fabs(num(c, "kernels_us_per_step") - us_sum) > 1e-6 * us_sum) fail_msg("kernels_us_per_step is not the sum");
    if (fabs(num(c, "kernels_share") - share_sum) > 1e-6 * share_sum) fail_msg("kernels_share is not the sum");
    assert_int_equal((int)num(c, "kernel_steps"), 4);
    assert_non_null(strstr(json_string_value(json_object_get(c, "kernel_clock")), "CPU"));
    json_decref(r);
    /* off: no account in the report */
    r = bench_json("");
    c = json_array_get(json_object_get(r, "configs"), 0);
    assert_true(json_is_object(c));
    assert_null(json_object_get(c, "kernels"));
    json_decref(r);
}

/* With PPN_KPROF=1 every --prompt length carries the kernel account of its timed primes: one entry per kernel
 * with calls and time per prime, the shares against the median prime, the totals their sums; a prompt of 8 ids
 * in chunks of 4 runs two chunks: two embeddings and the four GEMMs of every layer twice. Off: none. */
static void test_kprof_bench_json_prompt_kernels(void **st)
{
    (void)st;
    const char *args = "--shape tiny --backend sim -n 2 --prompt 2,8 --chunk 4 --reps 2 --json";
    char *out = NULL, *err = NULL;
    int rc = bench("PPN_KPROF=1 PPN_GRAPHS=0", args, &out, &err);
    if (rc != 0 || !out) fail_msg("bench exited %d:\n%s\n%s", rc, out ? out : "", err ? err : "");
    json_error_t je;
    json_t *r = json_loads(out, 0, &je);
    if (!r) fail_msg("bench output is not JSON (%s):\n%s", je.text, out);
    free(out), free(err);
    int layers = (int)num(r, "n_layers");
    json_t *ps = json_object_get(json_array_get(json_object_get(r, "configs"), 0), "prompts");
    assert_int_equal(json_array_size(ps), 2);
    for (size_t j = 0; j < 2; j++) {
        json_t *p = json_array_get(ps, j);
        int len = (int)num(p, "len"), chunks = (len + 3) / 4;
        assert_int_equal((int)num(p, "kernel_primes"), 2);
        json_t *ks = json_object_get(p, "kernels");
        if (!json_is_array(ks) || json_array_size(ks) == 0) fail_msg("prompt %d: no \"kernels\" array", len);
        double pp_us = num(p, "ms") * 1e3, us_sum = 0, share_sum = 0, gemm_calls = 0, embed_calls = 0;
        for (size_t i = 0; i < json_array_size(ks); i++) {
            json_t *k = json_array_get(ks, i);
            const char *name = json_string_value(json_object_get(k, "name"));
            assert_non_null(name);
            double us = num(k, "us_per_prompt"), share = num(k, "share"), calls = num(k, "calls_per_prompt");
            assert_true(calls > 0 && us > 0);
            if (fabs(share - us / pp_us) > 1e-6 * (1 + share)) fail_msg("%s: share %g vs us/prompt %g", name, share,
                                                                        us / pp_us);
            us_sum += us, share_sum += share;
            if (!strncmp(name, "ppn_k_gemm", 10)) gemm_calls += calls;
            if (!strcmp(name, "ppn_k_embed_rows")) embed_calls = calls;
        }
        if (gemm_calls != 4.0 * layers * chunks || embed_calls != chunks)
            fail_msg("prompt %d: %g GEMM and %g embedding calls a prime, expected %d and %d", len, gemm_calls,
                     embed_calls, 4 * layers * chunks, chunks);
        if (fabs(num(p, "kernels_us_per_prompt") - us_sum) > 1e-6 * us_sum) fail_msg("kernels_us_per_prompt: not the sum");
        if (fabs(num(p, "kernels_share") - share_sum) > 1e-6 * share_sum) fail_msg("kernels_share: not the sum");
    }
    json_decref(r);
    rc = bench("", args, &out, &err);
    assert_int_equal(rc, 0);
    r = json_loads(out, 0, &je);
    assert_non_null(r);
    free(out), free(err);
    ps = json_object_get(json_array_get(json_object_get(r, "configs"), 0), "prompts");
    assert_null(json_object_get(json_array_get(ps, 0), "kernels"));
    json_decref(r);
}

static void test_kprof_bench_refuses_bad_value(void **st)
{
    (void)st;
    char *out = NULL, *err = NULL;
    int rc = bench("PPN_KPROF=yes", "--shape tiny --backend sim -n 2 --prompt 1 --reps 1", &out, &err);
    if (rc == 0 || !err || !strstr(err, "ppn: error:") || !strstr(err, "PPN_KPROF"))
        fail_msg("rc %d, stderr: %s", rc, err ? err : "");
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kprof_counts_match_forward),
        cmocka_unit_test(test_kprof_pipelined_counts),
        cmocka_unit_test(test_kprof_batch_rotary_fused),
        cmocka_unit_test(test_kprof_batch_x16),
        cmocka_unit_test(test_kprof_batch_x16_attention),
        cmocka_unit_test(test_kprof_mixed_x16_attention),
        cmocka_unit_test(test_kprof_batch_k16),
        cmocka_unit_test(test_kprof_batch_attn_tc),
        cmocka_unit_test(test_kprof_gemm_w),
        cmocka_unit_test(test_kprof_off_reads_nothing),
        cmocka_unit_test(test_kprof_bad_values_refused),
        cmocka_unit_test(test_kprof_bench_json_kernels),
        cmocka_unit_test(test_kprof_bench_json_prompt_kernels),
        cmocka_unit_test(test_kprof_bench_refuses_bad_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
