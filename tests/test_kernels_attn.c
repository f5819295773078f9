/* test_kernels_attn.c - the rotary (both conventions, its KV store), decode attention (GQA, the position
 * splits, emulated here in f32 as the CUDA kernel computes them) and attention with the rotary fused in: the
 * CPU references against naive double-precision computations written here, and their ops (ppn_op_rope_kv,
 * ppn_op_attn, ppn_op_attn_rope, the KV cache dtypes, the scratch and split rules) through the fake device.
 *
 * Tolerances (stated per check): the references round to f32 at the same points HF does, so each result is
 * within a few f32 ulps (~6e-8 relative each) of the exact value; the checks allow 1e-6 relative to the sum
 * of absolute terms, except where an f32 rounding is part of the spec (rope's angle) and is mirrored here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/dtype.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

/* ---------------------------------------------------------------------------------------------------------
 * rope and its KV store */

static void rope_case(int interleaved, int32_t pos)
{
    const int nh = 3, hd = 64, half = hd / 2;
    float inv[32];
    for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    float *x = tu_frand((size_t)nh * hd, -2, 2), *x0 = malloc((size_t)nh * hd * 4), *first = malloc(nh * hd * 4);
    assert_non_null(x0);
    assert_non_null(first);
    memcpy(x0, x, (size_t)nh * hd * 4);
    ppn_step_hdr hdr = {.pos = pos, .token = 3, .seq = 0, .step = 0};
    ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = nh, .head_dim = hd,
                     .interleaved = interleaved};
    tu_kernel_run(PPN_K_ROPE, &p);
    for (int h = 0; h < nh; h++) {
        for (int i = 0; i < half; i++) {
            /* the spec rounds the angle pos * inv_freq to f32; cos/sin and the rotation are exact here */
            float ang = (float)pos * inv[i];
            double c = cos((double)ang), s = sin((double)ang);
            int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
            double x0a = x0[h * hd + a], x0b = x0[h * hd + b];
            double tol = 1e-6 * (fabs(x0a) + fabs(x0b));
            tu_check_close(x[h * hd + a], x0a * c - x0b * s, tol, interleaved ? "rope(il) a" : "rope(hf) a", (size_t)i);
            tu_check_close(x[h * hd + b], x0b * c + x0a * s, tol, interleaved ? "rope(il) b" : "rope(hf) b", (size_t)i);
        }
    }
    if (pos == 0) assert_memory_equal(x, x0, (size_t)nh * hd * 4); /* angle 0 is the identity */
    memcpy(first, x, (size_t)nh * hd * 4);
    memcpy(x, x0, (size_t)nh * hd * 4);
    tu_kernel_run(PPN_K_ROPE, &p);
    assert_memory_equal(first, x, (size_t)nh * hd * 4);
    free(x), free(x0), free(first);
}

static void test_rope_reference(void **state)
{
    (void)state;
    static const int32_t poss[] = {0, 1, 2, 7, 100, 1000, 4095, 131071};
    for (int il = 0; il < 2; il++)
        for (size_t i = 0; i < TU_LEN(poss); i++) rope_case(il, poss[i]);
}

/* The two conventions pair different elements: at pos 1 with a one-hot vector, HF moves element 0's weight
 * to element hd/2, interleaved to element 1. */
static void test_rope_reference_pairing(void **state)
{
    (void)state;
    float inv[4] = {1.0f, 0.5f, 0.25f, 0.125f}, x[8];
    ppn_step_hdr hdr = {.pos = 1};
    for (int il = 0; il < 2; il++) {
        memset(x, 0, sizeof x);
        x[0] = 1.0f;
        ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = 1, .head_dim = 8,
                         .interleaved = il};
        tu_kernel_run(PPN_K_ROPE, &p);
        tu_check_close(x[0], cos(1.0), 1e-7, "rope pair cos", 0);
        int partner = il ? 1 : 4;
        tu_check_close(x[partner], sin(1.0), 1e-7, "rope pair sin", (size_t)partner);
        for (int i = 0; i < 8; i++)
            if (i != 0 && i != partner) assert_true(x[i] == 0.0f);
    }
}

/* rope with caches (what ppn_op_rope_kv launches): the rotated k heads (the last n_kv of x) and v land in row pos
 * of each KV head's cache, every other row untouched; a position outside the cache stores nothing. */
static void test_rope_reference_kv_store(void **state)
{
    (void)state;
    const int nq = 1, nkv = 2, hd = 16, ctx = 8, nh = nq + nkv;
    size_t csz = (size_t)nkv * ctx * hd;
    float inv[8];
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    float *kc = malloc(csz * 4), *vc = malloc(csz * 4), *x = tu_frand((size_t)nh * hd, -1, 1),
          *v = tu_frand((size_t)nkv * hd, -1, 1);
    assert_non_null(kc);
    assert_non_null(vc);
    for (size_t i = 0; i < csz; i++) kc[i] = -100.0f - (float)i, vc[i] = 100.0f + (float)i;
    ppn_step_hdr hdr = {.pos = 5};
    ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .kc = D(kc), .vc = D(vc), .v = D(v),
                     .n_heads = nh, .head_dim = hd, .n_kv = nkv, .cap = ctx};
    tu_kernel_run(PPN_K_ROPE, &p);
    const float *k = x + (size_t)nq * hd; /* the k heads, rotated */
    for (int h = 0; h < nkv; h++)
        for (int t = 0; t < ctx; t++)
            for (int i = 0; i < hd; i++) {
                size_t at = ((size_t)h * ctx + t) * hd + i;
                float wk = t == 5 ? k[h * hd + i] : -100.0f - (float)at;
                float wv = t == 5 ? v[h * hd + i] : 100.0f + (float)at;
                assert_true(kc[at] == wk);
                assert_true(vc[at] == wv);
            }
    /* a position outside the cache writes nothing */
    float *kc0 = malloc(csz * 4);
    assert_non_null(kc0);
    memcpy(kc0, kc, csz * 4);
    hdr.pos = ctx;
    tu_kernel_run(PPN_K_ROPE, &p);
    hdr.pos = -1;
    tu_kernel_run(PPN_K_ROPE, &p);
    assert_memory_equal(kc0, kc, csz * 4);
    free(kc), free(vc), free(x), free(v), free(kc0);
}

/* ---------------------------------------------------------------------------------------------------------
 * attention */

/* softmax(q.k * scale) . v over positions [0, pos] in double; head h reads kv head h / (nh / nkv). */
static void attn_expect(const float *q, const float *kc, const float *vc, int nh, int nkv, int hd, int ctx,
                        int pos, double scale, double *want)
{
    double *s = malloc((size_t)(pos + 1) * sizeof *s);
    assert_non_null(s);
    for (int h = 0; h < nh; h++) {
        int g = h / (nh / nkv);
        const float *K = kc + (size_t)g * ctx * hd, *V = vc + (size_t)g * ctx * hd;
        double mx = -INFINITY, sum = 0;
        for (int t = 0; t <= pos; t++) {
            double d = 0;
            for (int i = 0; i < hd; i++) d += (double)q[h * hd + i] * K[(size_t)t * hd + i];
            s[t] = d * scale;
            mx = fmax(mx, s[t]);
        }
        for (int t = 0; t <= pos; t++) sum += (s[t] = exp(s[t] - mx));
        for (int i = 0; i < hd; i++) {
            double o = 0;
            for (int t = 0; t <= pos; t++) o += s[t] * V[(size_t)t * hd + i];
            want[h * hd + i] = o / sum;
        }
    }
    free(s);
}

/* The CUDA kernel's scheme (ppn_kp_attn), emulated in f32 on the host to check its math independently of a
 * GPU: CTA (g, j) takes KV head g's query heads over split j of ns, [j c, min((j + 1) c, pos + 1)) with
 * c = ceil((pos + 1) / ns); each of its EMU_W warps walks tiles of EMU_P positions (warp w's i-th tile at
 * t0 + (w + i EMU_W) EMU_P), reading each k, v row once for all the group's heads, and keeps per head an
 * online softmax {max, sum, o} from the neutral {-inf, 0, 0} updated once per tile; the warps' partials merge
 * in warp order, then the splits' in j order, an empty one weighing 0. Every position must be read exactly
 * once per KV head, and nothing may turn into NaN. */
enum { EMU_W = 8, EMU_P = 4 };

/* Merge n partials {m, l, o[hd]} (stride rec floats) in order: *mx, *den and num[hd], an empty one weighing 0. */
static void attn_emu_merge(const float *m, const float *l, const float *o, int n, int rec, int hd, float *mx,
                           float *den, float *num)
{
    *mx = -INFINITY, *den = 0.0f;
    for (int i = 0; i < n; i++) *mx = fmaxf(*mx, m[i * rec]);
    for (int d = 0; d < hd; d++) num[d] = 0.0f;
    for (int i = 0; i < n; i++) {
        float f = m[i * rec] == -INFINITY ? 0.0f : expf(m[i * rec] - *mx);
        *den = fmaf(l[i * rec], f, *den);
        for (int d = 0; d < hd; d++) num[d] = fmaf(o[(size_t)i * rec + d], f, num[d]);
    }
}

static void attn_split_emulate(const float *q, const float *kc, const float *vc, int nh, int nkv, int hd,
                               int ctx, int pos, float scale, int ns, float *out)
{
    int G = nh / nkv, c = (pos + ns) / ns, rec = hd + 2;
    float *wp = malloc((size_t)EMU_W * G * rec * sizeof *wp); /* per warp, head: {m, l, o[hd]} */
    float *sp = malloc((size_t)ns * G * rec * sizeof *sp);    /* per split, head: the CTA's partial */
    int *seen = calloc((size_t)nkv * (pos + 1), sizeof *seen);
    assert_true(wp && sp && seen);
    for (int g = 0; g < nkv; g++) {
        const float *K = kc + (size_t)g * ctx * hd, *V = vc + (size_t)g * ctx * hd;
        for (int j = 0; j < ns; j++) {
            int t0 = j * c < pos + 1 ? j * c : pos + 1, t1 = t0 + c < pos + 1 ? t0 + c : pos + 1;
            for (int w = 0; w < EMU_W; w++) {
                float *ww = wp + (size_t)w * G * rec;
                for (int hh = 0; hh < G; hh++) {
                    ww[hh * rec] = -INFINITY, ww[hh * rec + 1] = 0.0f;
                    memset(ww + hh * rec + 2, 0, (size_t)hd * sizeof *ww);
                }
                for (int tb = t0 + w * EMU_P; tb < t1; tb += EMU_W * EMU_P) {
                    int np = t1 - tb < EMU_P ? t1 - tb : EMU_P;
                    for (int t = 0; t < np; t++) seen[(size_t)g * (pos + 1) + tb + t]++;
                    for (int hh = 0; hh < G; hh++) { /* the tile's rows, once for every head of the group */
                        const float *qh = q + (size_t)(g * G + hh) * hd;
                        float *m = ww + hh * rec, *l = m + 1, *o = m + 2, sc[EMU_P], e[EMU_P], tm = -INFINITY, es = 0;
                        for (int t = 0; t < np; t++) {
                            float dot = 0.0f;
                            for (int i = 0; i < hd; i++) dot = fmaf(qh[i], K[(size_t)(tb + t) * hd + i], dot);
                            sc[t] = dot * scale;
                            tm = fmaxf(tm, sc[t]);
                        }
                        float mn = fmaxf(*m, tm), corr = *m == -INFINITY ? 0.0f : expf(*m - mn);
                        for (int t = 0; t < np; t++) es += e[t] = expf(sc[t] - mn);
                        *l = fmaf(*l, corr, es);
                        *m = mn;
                        for (int i = 0; i < hd; i++) {
                            o[i] *= corr;
                            for (int t = 0; t < np; t++) o[i] = fmaf(e[t], V[(size_t)(tb + t) * hd + i], o[i]);
                        }
                    }
                }
            }
            for (int hh = 0; hh < G; hh++) { /* the CTA's partial per head: warps in order */
                float *r = sp + ((size_t)j * G + hh) * rec;
                attn_emu_merge(wp + hh * rec, wp + hh * rec + 1, wp + hh * rec + 2, EMU_W, G * rec, hd, &r[0], &r[1],
                               r + 2);
            }
        }
        for (int hh = 0; hh < G; hh++) { /* the last CTA's merge: splits in order */
            float mx, den, *o = out + (size_t)(g * G + hh) * hd;
            attn_emu_merge(sp + hh * rec, sp + hh * rec + 1, sp + hh * rec + 2, ns, G * rec, hd, &mx, &den, o);
            for (int i = 0; i < hd; i++) o[i] /= den;
        }
    }
    for (size_t t = 0; t < (size_t)nkv * (pos + 1); t++) assert_int_equal(seen[t], 1);
    free(wp), free(sp), free(seen);
}

static void attn_case(int nh, int nkv, int hd, int ctx, int pos, int ns)
{
    size_t csz = (size_t)nkv * ctx * hd, qsz = (size_t)nh * hd, pb = ppn_op_attn_scratch_bytes(nh, ns, hd);
    float *q = tu_frand(qsz, -1, 1), *kc = tu_frand(csz, -1, 1), *vc = tu_frand(csz, -1, 1);
    float *out = malloc(qsz * 4), *first = malloc(qsz * 4), *emu = malloc(qsz * 4);
    unsigned char *part = calloc(pb, 1), *zero = calloc(pb, 1);
    double *want = malloc(qsz * sizeof *want);
    assert_true(out && first && emu && part && zero && want);
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t i = 0; i < qsz; i++) q[i] *= 3.0f; /* sharpen the softmax a little */
    attn_expect(q, kc, vc, nh, nkv, hd, ctx, pos, scale, want);
    ppn_step_hdr hdr = {.pos = pos};
    ppn_kp_attn p = {.out = D(out), .q = D(q), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr), .part = D(part),
                     .n_heads = nh, .n_kv = nkv, .head_dim = hd, .cap = ctx, .n_split = ns, .scale = scale};
    tu_kernel_run(PPN_K_ATTN, &p);
    char what[80];
    snprintf(what, sizeof what, "attn nh=%d nkv=%d hd=%d pos=%d n_split=%d", nh, nkv, hd, pos, ns);
    /* out is a convex combination of v values in [-1, 1]: 1e-6 absolute is a few f32 ulps of it */
    for (size_t i = 0; i < qsz; i++) tu_check_close(out[i], want[i], 1e-6, what, i);
    memcpy(first, out, qsz * 4);
    tu_kernel_run(PPN_K_ATTN, &p);
    assert_memory_equal(first, out, qsz * 4);
    assert_memory_equal(part, zero, pb); /* the reference leaves the scratch (and its counters) alone */
    /* the split in f32: up to ~300 f32 terms per sum, held to 1e-5 absolute like the GPU test */
    attn_split_emulate(q, kc, vc, nh, nkv, hd, ctx, pos, scale, ns, emu);
    snprintf(what, sizeof what, "attn split emulation nh=%d nkv=%d pos=%d n_split=%d", nh, nkv, pos, ns);
    for (size_t i = 0; i < qsz; i++) tu_check_close(emu[i], want[i], 1e-5, what, i);
    free(q), free(kc), free(vc), free(out), free(first), free(emu), free(part), free(zero), free(want);
}

static void test_attn_reference(void **state)
{
    (void)state;
    static const int poss[] = {0, 1, 5, 15}, splits[] = {1, 3, 8, 32};
    for (size_t k = 0; k < TU_LEN(splits); k++) { /* pos < n_split: empty tail splits */
        int ns = splits[k];
        for (size_t i = 0; i < TU_LEN(poss); i++) attn_case(8, 2, 32, 16, poss[i], ns);
        attn_case(4, 4, 16, 8, 7, ns);        /* MHA */
        attn_case(6, 1, 160, 300, 299, ns);   /* MQA; head_dim past one output chunk */
        attn_case(8, 2, 64, 301, 300, ns);    /* GQA, long */
        attn_case(4, 4, 48, 301, 300, ns);    /* MHA, long; head_dim not a multiple of 32 */
        attn_case(14, 2, 64, 100, 99, ns);    /* 7 heads a KV head (Qwen2): one padded pass of 8 */
        attn_case(16, 1, 32, 40, 37, ns);     /* 16 heads a KV head: two passes */
    }
    attn_case(4, 2, 32, 70, 64, 64);          /* the largest n_split: chunks of 2, splits 33..63 empty */
}

/* With pos 0 the output is exactly v[kv head, 0]: checks the GQA map h -> h / (nh / nkv) by value. */
static void test_attn_reference_gqa_map(void **state)
{
    (void)state;
    const int nh = 8, nkv = 2, hd = 4, ctx = 3;
    float q[8 * 4], kc[2 * 3 * 4], vc[2 * 3 * 4], out[8 * 4];
    for (int i = 0; i < nh * hd; i++) q[i] = (float)i;
    for (int i = 0; i < nkv * ctx * hd; i++) kc[i] = 0.5f, vc[i] = (float)(1000 + i);
    float part[8 * 3 * (4 + 2) + 8]; /* ppn_op_attn_scratch_bytes(8, 3, 4) */
    ppn_step_hdr hdr = {.pos = 0};
    ppn_kp_attn p = {.out = D(out), .q = D(q), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr), .part = D(part),
                     .n_heads = nh, .n_kv = nkv, .head_dim = hd, .cap = ctx, .n_split = 3, .scale = 0.5f};
    assert_int_equal(ppn_op_attn_scratch_bytes(nh, 3, hd), sizeof part);
    tu_kernel_run(PPN_K_ATTN, &p);
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd; i++) assert_true(out[h * hd + i] == vc[(h / 4) * ctx * hd + i]);
    /* pos outside the cache: NaN output, no read past the cache */
    hdr.pos = ctx;
    tu_kernel_run(PPN_K_ATTN, &p);
    for (int i = 0; i < nh * hd; i++) assert_true(isnan(out[i]));
}

/* ---------------------------------------------------------------------------------------------------------
 * the ops, through the fake device */

/* rope_kv = the rotation of every q and k head (the plain rope's bits), then the rotated k and v stored at pos:
 * one launch of the rope kernel with the caches. */
static void test_rope_op_kv(void **state)
{
    (void)state;
    const int nq = 4, nkv = 2, hd = 16, ctx = 6, nh = nq + nkv;
    float inv[8], qk[6 * 16], qk2[6 * 16], v[2 * 16], kc[2 * 6 * 16], vc[2 * 6 * 16], kc2[2 * 6 * 16],
        vc2[2 * 6 * 16];
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    float *r = tu_frand((size_t)nh * hd, -1, 1), *rv = tu_frand((size_t)nkv * hd, -1, 1);
    memcpy(qk, r, sizeof qk), memcpy(qk2, r, sizeof qk2), memcpy(v, rv, sizeof v);
    for (int i = 0; i < 2 * 6 * 16; i++) kc[i] = kc2[i] = vc[i] = vc2[i] = (float)i;
    ppn_step_hdr hdr = {.pos = 3};
    for (int il = 0; il < 2; il++) {
        assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qk), nq, nkv, hd, D(inv), il, D(&hdr), D(kc),
                                        D(vc), D(v), ctx, PPN_DTYPE_F32), PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_ROPE);
        assert_int_equal(tu_cap.l.grid[0], nh); /* a block per head, q and k */
        assert_true(tu_declared(kc, sizeof kc, PPN_ACC_W) && tu_declared(v, sizeof v, PPN_ACC_R));
        ppn_kp_rope plain = {.x = D(qk2), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = nh, .head_dim = hd,
                             .interleaved = il};
        tu_kernel_run(PPN_K_ROPE, &plain);
        if (hdr.pos < ctx) /* the store, written out here */
            for (int h = 0; h < nkv; h++) {
                memcpy(kc2 + ((size_t)h * ctx + hdr.pos) * hd, qk2 + (size_t)(nq + h) * hd, (size_t)hd * 4);
                memcpy(vc2 + ((size_t)h * ctx + hdr.pos) * hd, v + (size_t)h * hd, (size_t)hd * 4);
            }
        assert_memory_equal(qk, qk2, sizeof qk);
        assert_memory_equal(kc, kc2, sizeof kc);
        assert_memory_equal(vc, vc2, sizeof vc);
        hdr.pos = ctx; /* outside the cache: rotated, nothing stored */
    }
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qk), nq, nkv, 15, D(inv), 0, D(&hdr), D(kc), D(vc),
                                    D(v), ctx, PPN_DTYPE_F32), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    free(r), free(rv);
}

/* The unfused attention path of a layer: rope_kv (q and k rotated, k and v stored), then attn. */
static void test_attn_op_unfused_path(void **state)
{
    (void)state;
    const int nh = 8, nkv = 2, hd = 16, ctx = 10;
    size_t csz = (size_t)nkv * ctx * hd, qsz = (size_t)nh * hd, qksz = qsz + (size_t)nkv * hd;
    float *kc = calloc(csz, 4), *vc = calloc(csz, 4), *q = tu_frand(qksz, -1, 1), *out = malloc(qsz * 4);
    float *v = tu_frand((size_t)nkv * hd, -1, 1), inv[8];
    const float *k = q + qsz; /* q|k: the k heads follow the q heads */
    double *want = malloc(qsz * sizeof *want);
    size_t pb = ppn_op_attn_scratch_bytes(nh, 3, hd);
    void *part = calloc(pb, 1);
    assert_non_null(kc);
    assert_non_null(out);
    assert_non_null(want);
    assert_non_null(part);
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / hd);
    ppn_step_hdr hdr = {.pos = 3};

    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(q), nh, nkv, hd, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_OK);
    assert_int_equal(tu_cap.l.kernel, PPN_K_ROPE);
    assert_true(tu_declared(kc, csz * 4, PPN_ACC_W)); /* whole caches: the row comes from device memory */
    assert_true(tu_declared(vc, csz * 4, PPN_ACC_W));
    assert_true(tu_declared(v, (size_t)nkv * hd * 4, PPN_ACC_R));
    assert_true(tu_declared(q, qksz * 4, PPN_ACC_R) && tu_declared(q, qksz * 4, PPN_ACC_W));
    assert_true(tu_declared(inv, (size_t)hd / 2 * 4, PPN_ACC_R));
    assert_true(tu_declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_true(kc[(size_t)ctx * hd + 3 * hd] == k[hd]); /* KV head 1, row 3: its rotated k */
    assert_true(vc[(size_t)ctx * hd + 3 * hd] == v[hd]);

    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 0.25f,
                                 D(&hdr), D(part), 3, PPN_DTYPE_F32),
                     PPN_OK);
    assert_int_equal(tu_cap.l.kernel, PPN_K_ATTN);
    assert_int_equal(tu_cap.l.grid[0], (unsigned)nkv); /* a CTA per KV head serves its query heads */
    assert_int_equal(tu_cap.l.grid[1], 3); /* n_split, never pos: one launch serves every step */
    assert_int_equal(tu_cap.l.grid[2], 1);
    assert_int_equal(((const ppn_kp_attn *)tu_cap.l.params)->n_split, 3);
    assert_true(((const ppn_kp_attn *)tu_cap.l.params)->part == D(part));
    assert_true(tu_declared(part, pb, PPN_ACC_R) && tu_declared(part, pb, PPN_ACC_W));
    assert_true(tu_declared(kc, csz * 4, PPN_ACC_R) && tu_declared(vc, csz * 4, PPN_ACC_R));
    assert_true(tu_declared(q, qsz * 4, PPN_ACC_R) && tu_declared(out, qsz * 4, PPN_ACC_W));
    assert_true(tu_declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_false(tu_declared(kc, csz * 4, PPN_ACC_W));
    attn_expect(q, kc, vc, nh, nkv, hd, ctx, 3, 0.25, want);
    for (size_t i = 0; i < qsz; i++) tu_check_close(out[i], want[i], 1e-6, "op attn", i);

    /* argument checks */
    tu_cap.calls = 0;
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(q), nh, nkv, 7, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    assert_non_null(strstr(ppn_last_error(), "7"));
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(q), 0, nkv, hd, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), 6, 4, hd, ctx, 1, D(&hdr),
                                 D(part), 3, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn"));
    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, 512, ctx, 1,
                                 D(&hdr), D(part), 3, PPN_DTYPE_F32),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "512"));
    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, 0, 1, D(&hdr),
                                 D(part), 3, PPN_DTYPE_F32),
                     PPN_EINVAL);
    static const int bad_splits[] = {0, -1, 65};
    for (size_t i = 0; i < TU_LEN(bad_splits); i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", bad_splits[i]);
        assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 1,
                                     D(&hdr), D(part), bad_splits[i], PPN_DTYPE_F32),
                         PPN_EINVAL);
        assert_non_null(strstr(ppn_last_error(), "ppn_op_attn"));
        assert_non_null(strstr(ppn_last_error(), "n_split"));
        assert_non_null(strstr(ppn_last_error(), num));
    }
    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 1,
                                 D(&hdr), 0, 1, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "part"));
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(q), nh, nkv, hd, D(inv), 0, 0, D(kc), D(vc), D(v), ctx,
                                    PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "hdr"));
    assert_int_equal(tu_cap.calls, 0);
    free(kc), free(vc), free(q), free(out), free(v), free(want), free(part);
}

/* attn_rope = rope_kv then attn, in one launch: the same output and caches, bit for bit, and the projection
 * only read; in and outside the cache, both rotary conventions, and its own argument checks. */
static void test_attn_op_rope(void **state)
{
    (void)state;
    enum { NH = 4, NKV = 2, HD = 16, CTX = 6, QKV = (NH + 2 * NKV) * HD, CSZ = NKV * CTX * HD };
    float inv[HD / 2], qkv[QKV], qkv0[QKV], qkv2[QKV], kc[CSZ], vc[CSZ], kc2[CSZ], vc2[CSZ], out[NH * HD],
        out2[NH * HD];
    unsigned char part[4096];
    assert_true(ppn_op_attn_scratch_bytes(NH, 2, HD) <= sizeof part);
    memset(part, 0, sizeof part);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
    float *r = tu_frand(QKV, -2, 2), *rc = tu_frand(CSZ, -1, 1);
    memcpy(qkv0, r, sizeof qkv0);
    memcpy(kc, rc, sizeof kc), memcpy(kc2, rc, sizeof kc2), memcpy(vc, rc, sizeof vc), memcpy(vc2, rc, sizeof vc2);
    ppn_step_hdr hdr = {.pos = 3};
    float sc = 0.25f;
    for (int k = 0; k < 4; k++) {
        int il = k & 1;
        if (k == 2) hdr.pos = CTX; /* outside the cache: NaN out, nothing stored (as rope_kv) */
        memcpy(qkv, qkv0, sizeof qkv), memcpy(qkv2, qkv0, sizeof qkv2);
        assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, HD, CTX, sc,
                                          D(&hdr), D(part), 2, D(inv), il, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_ATTN);
        assert_int_equal(tu_cap.l.grid[0], NKV);
        assert_int_equal(tu_cap.l.grid[1], 2);
        assert_true(tu_declared(qkv, sizeof qkv, PPN_ACC_R) && !tu_declared(qkv, 4, PPN_ACC_W));
        assert_true(tu_declared(kc, sizeof kc, PPN_ACC_R) && tu_declared(kc, sizeof kc, PPN_ACC_W));
        assert_true(tu_declared(vc, sizeof vc, PPN_ACC_R) && tu_declared(vc, sizeof vc, PPN_ACC_W));
        assert_true(tu_declared(inv, sizeof inv, PPN_ACC_R) && tu_declared(&hdr, sizeof hdr, PPN_ACC_R));
        assert_true(tu_declared(out, sizeof out, PPN_ACC_W));
        assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv2), NH, NKV, HD, D(inv), il, D(&hdr), D(kc2),
                                        D(vc2), D(qkv2 + (NH + NKV) * HD), CTX, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out2), D(qkv2), D(kc2), D(vc2), NH, NKV, HD, CTX, sc,
                                     D(&hdr), D(part), 2, PPN_DTYPE_F32),
                         PPN_OK);
        assert_memory_equal(out, out2, sizeof out);
        assert_memory_equal(kc, kc2, sizeof kc);
        assert_memory_equal(vc, vc2, sizeof vc);
        assert_memory_equal(qkv, qkv0, sizeof qkv); /* only read */
        if (k < 2) assert_memory_not_equal(kc, rc, sizeof kc); /* the store happened */
        else assert_true(isnan(out[0]) && isnan(out[NH * HD - 1]));
    }
    assert_memory_not_equal(kc, rc, sizeof kc);
    /* its own checks, each refused before any launch */
    tu_cap.calls = 0;
    assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, 15, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_non_null(strstr(ppn_last_error(), "even"));
    assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, HD, CTX, sc,
                                      D(&hdr), D(part), 2, 0, 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "inv_freq"));
    assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, 96, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EUNSUPPORTED); /* halves 48 apart: not in one lane */
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_non_null(strstr(ppn_last_error(), "96"));
    assert_non_null(strstr(ppn_last_error(), "rope_kv"));
    assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kc), D(vc), 6, 4, HD, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_int_equal(tu_cap.calls, 0);
    assert_true(ppn_op_attn_rope_fits(64, 0) && ppn_op_attn_rope_fits(128, 0) && ppn_op_attn_rope_fits(8, 0));
    assert_true(ppn_op_attn_rope_fits(16, 0) && ppn_op_attn_rope_fits(32, 0) && ppn_op_attn_rope_fits(2, 0));
    assert_true(ppn_op_attn_rope_fits(16, 1) && ppn_op_attn_rope_fits(48, 1) && ppn_op_attn_rope_fits(128, 1));
    assert_false(ppn_op_attn_rope_fits(24, 0) || ppn_op_attn_rope_fits(96, 0) || ppn_op_attn_rope_fits(256, 0));
    assert_false(ppn_op_attn_rope_fits(48, 0) || ppn_op_attn_rope_fits(15, 1) || ppn_op_attn_rope_fits(0, 1));
    assert_false(ppn_op_attn_rope_fits(160, 1) || ppn_op_attn_rope_fits(256, 1));
    free(r), free(rc);
}

/* KV caches in the weights' dtype: rope_kv rounds each f32 to bf16 / f16 (ppn_f32_to_*); attention
 * over a 2-byte cache (a kernel per dtype, ppn_k_attn_bf16 / _f16) equals attention over an f32 cache holding the widened
 * values; the fused rotary gives rope_kv + attn's bits in each dtype; an unknown dtype is refused. */
static void test_attn_op_kv_dtypes(void **state)
{
    (void)state;
    enum { NH = 4, NKV = 2, HD = 16, CTX = 6, QKV = (NH + 2 * NKV) * HD, CSZ = NKV * CTX * HD };
    float inv[HD / 2], qkv[QKV], qkv2[QKV], kf[CSZ], vf[CSZ], out[NH * HD], out2[NH * HD];
    uint16_t kh[CSZ], vh[CSZ], kh2[CSZ], vh2[CSZ];
    unsigned char part[4096];
    memset(part, 0, sizeof part);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
    float *r = tu_frand(QKV, -2, 2), *rc = tu_frand(CSZ, -1, 1);
    static const int dts[] = {PPN_DTYPE_BF16, PPN_DTYPE_F16};
    for (size_t k = 0; k < TU_LEN(dts); k++) {
        int dt = dts[k];
        uint16_t (*to16)(float) = dt == PPN_DTYPE_BF16 ? ppn_f32_to_bf16 : ppn_f32_to_f16;
        float (*to32)(uint16_t) = dt == PPN_DTYPE_BF16 ? ppn_bf16_to_f32 : ppn_f16_to_f32;
        for (int i = 0; i < CSZ; i++) kh[i] = vh[i] = kh2[i] = vh2[i] = to16(rc[i]), kf[i] = vf[i] = rc[i];
        ppn_step_hdr hdr = {.pos = 4};
        /* rope_kv into an f32 cache and a 2-byte one: the 2-byte row is the f32 row rounded */
        memcpy(qkv, r, sizeof qkv), memcpy(qkv2, r, sizeof qkv2);
        assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kf), D(vf),
                                        D(qkv + (NH + NKV) * HD), CTX, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv2), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh),
                                        D(vh), D(qkv2 + (NH + NKV) * HD), CTX, dt),
                         PPN_OK);
        assert_true(tu_declared(kh, sizeof kh, PPN_ACC_W) && !tu_declared(kh, sizeof kh + 2, PPN_ACC_W));
        for (int i = 0; i < CSZ; i++) {
            assert_int_equal(kh[i], to16(kf[i]));
            assert_int_equal(vh[i], to16(vf[i]));
        }
        /* attention over the 2-byte cache = over an f32 cache of its widened values */
        for (int i = 0; i < CSZ; i++) kf[i] = to32(kh[i]), vf[i] = to32(vh[i]);
        assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(qkv2), D(kh), D(vh), NH, NKV, HD, CTX, 0.25f,
                                     D(&hdr), D(part), 2, dt),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, dt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BF16 : PPN_K_ATTN_F16);
        assert_true(tu_declared(kh, sizeof kh, PPN_ACC_R) && !tu_declared(kh, sizeof kh + 2, PPN_ACC_R));
        assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out2), D(qkv2), D(kf), D(vf), NH, NKV, HD, CTX, 0.25f,
                                     D(&hdr), D(part), 2, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, PPN_K_ATTN);
        assert_memory_equal(out, out2, sizeof out);
        /* the fused rotary in this dtype: rope_kv + attn's output and caches */
        for (int i = 0; i < CSZ; i++) kh[i] = vh[i] = kh2[i] = vh2[i] = to16(rc[i]);
        memcpy(qkv, r, sizeof qkv), memcpy(qkv2, r, sizeof qkv2);
        assert_int_equal(tu_op_attn_rope(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kh), D(vh), NH, NKV, HD, CTX,
                                          0.25f, D(&hdr), D(part), 2, D(inv), 0, dt),
                         PPN_OK);
        assert_int_equal(tu_cap.l.kernel, dt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BF16 : PPN_K_ATTN_F16);
        assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv2), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh2),
                                        D(vh2), D(qkv2 + (NH + NKV) * HD), CTX, dt),
                         PPN_OK);
        assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out2), D(qkv2), D(kh2), D(vh2), NH, NKV, HD, CTX,
                                     0.25f, D(&hdr), D(part), 2, dt),
                         PPN_OK);
        assert_memory_equal(out, out2, sizeof out);
        assert_memory_equal(kh, kh2, sizeof kh);
        assert_memory_equal(vh, vh2, sizeof vh);
    }
    tu_cap.calls = 0;
    ppn_step_hdr hdr = {.pos = 1};
    assert_int_equal(tu_op_attn(&tu_fake, tu_fake_stream, D(out), D(qkv), D(kh), D(vh), NH, NKV, HD, CTX, 0.25f,
                                 D(&hdr), D(part), 2, 7),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "KV cache dtype 7"));
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh), D(vh),
                                    D(qkv), CTX, -1),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    assert_non_null(strstr(ppn_last_error(), "KV cache dtype -1"));
    assert_int_equal(tu_op_rope_kv(&tu_fake, tu_fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh), D(vh),
                                    D(qkv), CTX, 3),
                     PPN_EINVAL);
    assert_int_equal(tu_cap.calls, 0);
    free(r), free(rc);
}

/* The scratch's size (records of head_dim + 2 floats, then a u32 counter per head) and the split rule. */
static void test_attn_op_split(void **state)
{
    (void)state;
    assert_int_equal(ppn_op_attn_scratch_bytes(32, 9, 128), (size_t)32 * 9 * 130 * 4 + 32 * 4);
    assert_int_equal(ppn_op_attn_scratch_bytes(8, 1, 64), (size_t)8 * 66 * 4 + 8 * 4);
    assert_int_equal(ppn_op_attn_scratch_bytes(0, 1, 64), 0);
    /* by KV heads (the grid's x): two CTAs per SM */
    assert_int_equal(ppn_op_attn_split(8, 132), 33); /* H200, llama 8B: ceil(264 / 8) */
    assert_int_equal(ppn_op_attn_split(32, 132), 9); /* MHA, 32 heads */
    assert_int_equal(ppn_op_attn_split(5, 132), 53);
    assert_int_equal(ppn_op_attn_split(4, 132), 64); /* capped */
    assert_int_equal(ppn_op_attn_split(1, 132), 64);
    assert_int_equal(ppn_op_attn_split(8, 1), 1);    /* sim reports one SM */
    assert_int_equal(ppn_op_attn_split(8, 0), 1);    /* unknown */
    assert_int_equal(ppn_op_attn_split(0, 132), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_reference),
        cmocka_unit_test(test_rope_reference_pairing),
        cmocka_unit_test(test_rope_reference_kv_store),
        cmocka_unit_test(test_attn_reference),
        cmocka_unit_test(test_attn_reference_gqa_map),
        cmocka_unit_test(test_rope_op_kv),
        cmocka_unit_test(test_attn_op_unfused_path),
        cmocka_unit_test(test_attn_op_rope),
        cmocka_unit_test(test_attn_op_kv_dtypes),
        cmocka_unit_test(test_attn_op_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
