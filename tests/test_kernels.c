/* test_kernels.c - the CPU reference kernels against naive double-precision computations written here, the
 * bf16/f16 conversions against known bit patterns and an independent rounding, the kernel table, and the
 * launch wrappers (params, declared accesses, argument checks) through a capturing fake device.
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

#define D(p) ((uint64_t)(uintptr_t)(p))
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------------------------------------------------
 * helpers: a deterministic generator, independent decoders, buffers */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float rndf(float lo, float hi) { return lo + (hi - lo) * (float)(rnd32() & 0xffffff) / 16777216.0f; }

static float *frand(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = rndf(lo, hi);
    return p;
}

static float bits_to_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The value of an f16 bit pattern by its definition (written independently of ktable.c). */
static double t_f16(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double t_bf16(uint16_t h) { return bits_to_f((uint32_t)h << 16); }

/* A weight array of dtype dt with values in about [-1, 1], and its values as doubles. */
static void *wrand(int dt, size_t n, double *vals)
{
    void *p = malloc(n * (dt == PPN_DTYPE_F32 ? 4 : 2));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        if (dt == PPN_DTYPE_F32) {
            ((float *)p)[i] = rndf(-1, 1);
            vals[i] = ((float *)p)[i];
        } else if (dt == PPN_DTYPE_BF16) {
            uint16_t h = (uint16_t)(f_to_bits(rndf(-1, 1)) >> 16);
            ((uint16_t *)p)[i] = h;
            vals[i] = t_bf16(h);
        } else { /* exponent 8..15: |v| in [2^-7, 2) */
            uint16_t h = (uint16_t)(((rnd32() & 1) << 15) | ((8 + rnd32() % 8) << 10) | (rnd32() & 1023));
            ((uint16_t *)p)[i] = h;
            vals[i] = t_f16(h);
        }
    }
    return p;
}

static const char *dt_name(int dt) { return dt == PPN_DTYPE_F32 ? "f32" : dt == PPN_DTYPE_BF16 ? "bf16" : "f16"; }

static void run(int id, const void *params) { ppn_kernels[id].cpu(params); }

static void check_close(double got, double want, double tol, const char *what, size_t i)
{
    if (!(fabs(got - want) <= tol)) {
        fail_msg("%s[%zu]: got %.9g want %.9g (tol %.3g)", what, i, got, want, tol);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the table */

static void test_table(void **state)
{
    (void)state;
    static const size_t sizes[PPN_K_COUNT] = {
        [PPN_K_EMBED] = sizeof(ppn_kp_embed),     [PPN_K_RMSNORM] = sizeof(ppn_kp_rmsnorm),
        [PPN_K_MATVEC] = sizeof(ppn_kp_matvec),   [PPN_K_ROPE] = sizeof(ppn_kp_rope),
        [PPN_K_HEAD_RMSNORM] = sizeof(ppn_kp_head_rmsnorm),
        [PPN_K_ATTN] = sizeof(ppn_kp_attn),       [PPN_K_ATTN_BF16] = sizeof(ppn_kp_attn_bf16),
        [PPN_K_ATTN_F16] = sizeof(ppn_kp_attn_f16),
        [PPN_K_SWIGLU] = sizeof(ppn_kp_swiglu),
        [PPN_K_ADD] = sizeof(ppn_kp_add),         [PPN_K_ARGMAX] = sizeof(ppn_kp_argmax),
        [PPN_K_FILL] = sizeof(ppn_kp_fill),       [PPN_K_SET_HDR] = sizeof(ppn_kp_set_hdr),
        [PPN_K_MATMAT] = sizeof(ppn_kp_matmat),
    };
    static const char *const names[PPN_K_COUNT] = {
        "ppn_k_embed", "ppn_k_rmsnorm", "ppn_k_matvec", "ppn_k_rope", "ppn_k_head_rmsnorm", "ppn_k_attn",
        "ppn_k_attn_bf16", "ppn_k_attn_f16", "ppn_k_swiglu", "ppn_k_add", "ppn_k_argmax", "ppn_k_fill", "ppn_k_set_hdr",
        "ppn_k_matmat",
    };
    for (int i = 0; i < PPN_K_COUNT; i++) {
        const ppn_gpu_kernel *k = &ppn_kernels[i];
        assert_non_null(k->name);
        assert_int_equal(strncmp(k->name, "ppn_k_", 6), 0);
        assert_string_equal(k->name, names[i]);
        assert_true(k->params_size > 0);
        assert_int_equal(k->params_size, sizes[i]);
        assert_non_null(k->cpu);
        for (int j = 0; j < i; j++) assert_string_not_equal(k->name, ppn_kernels[j].name);
    }
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_F32), 4);
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_BF16), 2);
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_F16), 2);
    assert_int_equal(ppn_dtype_size(7), 0);
    assert_int_equal(ppn_dtype_size(-1), 0);
}

/* ---------------------------------------------------------------------------------------------------------
 * conversions */

/* Nearest of two neighbours lo < hi (bit patterns a, b with values va, vb) to v, ties to the even pattern. */
static uint16_t nearest_even(double v, uint16_t a, double va, uint16_t b, double vb)
{
    double da = fabs(v - va), db = fabs(vb - v);
    if (da < db) return a;
    if (db < da) return b;
    return (a & 1) ? b : a;
}

static void test_bf16_known(void **state)
{
    (void)state;
    assert_int_equal(ppn_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(ppn_f32_to_bf16(-2.0f), 0xC000);
    assert_int_equal(ppn_f32_to_bf16(bits_to_f(0x3F808000u)), 0x3F80); /* tie, even stays */
    assert_int_equal(ppn_f32_to_bf16(bits_to_f(0x3F818000u)), 0x3F82); /* tie, odd rounds up */
    assert_int_equal(ppn_f32_to_bf16(bits_to_f(0x3F808001u)), 0x3F81); /* above the half */
    assert_int_equal(ppn_f32_to_bf16(bits_to_f(0x3F807FFFu)), 0x3F80); /* below the half */
    assert_int_equal(ppn_f32_to_bf16(bits_to_f(0x7F7FFFFFu)), 0x7F80); /* max float rounds to inf */
    assert_int_equal(ppn_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(ppn_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(ppn_f32_to_bf16(-0.0f), 0x8000);
    uint16_t n = ppn_f32_to_bf16(NAN);
    assert_true((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    /* a NaN whose payload lives only in the low 16 bits must stay NaN, not become inf */
    n = ppn_f32_to_bf16(bits_to_f(0x7F800001u));
    assert_true((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    assert_true(ppn_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(ppn_bf16_to_f32(0xC049) == bits_to_f(0xC0490000u));
    assert_true(isinf(ppn_bf16_to_f32(0xFF80)) && ppn_bf16_to_f32(0xFF80) < 0);
    assert_true(isnan(ppn_bf16_to_f32(0x7FC0)));
}

static void test_bf16_roundtrip_and_rne(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ppn_bf16_to_f32((uint16_t)h);
        assert_true(f_to_bits(f) == h << 16);
        if (isnan(f)) continue;
        assert_int_equal(ppn_f32_to_bf16(f), h);
    }
    /* random finite floats against the nearest-even neighbour chosen in double */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rnd32();
        float f = bits_to_f(u);
        if (!isfinite(f)) continue;
        uint16_t a = (uint16_t)(u >> 16), b = (uint16_t)(a + 1); /* |v| between a and b (same sign) */
        double va = t_bf16(a), vb = (b & 0x7F80) == 0x7F80 && (b & 0x7F) == 0 ? INFINITY : t_bf16(b);
        uint16_t want;
        if ((u & 0xFFFF) == 0) want = a;
        else if (isinf(vb)) want = (u & 0xFFFF) >= 0x8000 ? b : a; /* rounding past max is overflow */
        else want = nearest_even(fabs((double)f), a & 0x7FFF, fabs(va), b & 0x7FFF, fabs(vb)) |
                    (uint16_t)(a & 0x8000);
        if (ppn_f32_to_bf16(f) != want) fail_msg("bf16(0x%08x) = 0x%04x want 0x%04x", u, ppn_f32_to_bf16(f), want);
    }
}

static void test_f16_known(void **state)
{
    (void)state;
    assert_int_equal(ppn_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(ppn_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(ppn_f32_to_f16(65504.0f), 0x7BFF);     /* max f16 */
    assert_int_equal(ppn_f32_to_f16(65519.99f), 0x7BFF);    /* below the half to 65536 */
    assert_int_equal(ppn_f32_to_f16(65520.0f), 0x7C00);     /* tie with odd max -> inf */
    assert_int_equal(ppn_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(ppn_f32_to_f16(-1e10f), 0xFC00);
    assert_int_equal(ppn_f32_to_f16(INFINITY), 0x7C00);
    assert_int_equal(ppn_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(ppn_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(ppn_f32_to_f16(0x1p-14f), 0x0400);     /* smallest normal */
    assert_int_equal(ppn_f32_to_f16(0x1p-24f), 0x0001);     /* smallest subnormal */
    assert_int_equal(ppn_f32_to_f16(1023 * 0x1p-24f), 0x03FF); /* largest subnormal */
    assert_int_equal(ppn_f32_to_f16(0x1p-25f), 0x0000);     /* tie to even zero */
    assert_int_equal(ppn_f32_to_f16(-0x1p-25f), 0x8000);
    assert_int_equal(ppn_f32_to_f16(0x1.000002p-25f), 0x0001); /* just above the half */
    assert_int_equal(ppn_f32_to_f16(3 * 0x1p-25f), 0x0002); /* 1.5 units: tie -> even 2 */
    assert_int_equal(ppn_f32_to_f16(5 * 0x1p-25f), 0x0002); /* 2.5 units: tie -> even 2 */
    assert_int_equal(ppn_f32_to_f16(2047 * 0x1p-25f), 0x0400); /* 1023.5 units: carry into the normal */
    assert_int_equal(ppn_f32_to_f16(1e-30f), 0x0000);
    assert_int_equal(ppn_f32_to_f16(1.0f + 0x1p-11f), 0x3C00); /* tie, even stays */
    assert_int_equal(ppn_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02); /* tie, odd rounds up */
    uint16_t n = ppn_f32_to_f16(NAN);
    assert_true((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0);
    n = ppn_f32_to_f16(bits_to_f(0x7F800001u)); /* payload below the kept bits: still NaN */
    assert_true((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0);

    assert_true(ppn_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(ppn_f16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    assert_true(ppn_f16_to_f32(0x8001) == -0x1p-24f);
    assert_true(ppn_f16_to_f32(0x3C00) == 1.0f);
    assert_true(ppn_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(isinf(ppn_f16_to_f32(0x7C00)) && ppn_f16_to_f32(0x7C00) > 0);
    assert_true(isinf(ppn_f16_to_f32(0xFC00)) && ppn_f16_to_f32(0xFC00) < 0);
    assert_true(isnan(ppn_f16_to_f32(0x7E00)) && isnan(ppn_f16_to_f32(0x7C01)));
    float z = ppn_f16_to_f32(0x8000);
    assert_true(z == 0.0f && signbit(z));
}

static void test_f16_roundtrip_and_rne(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ppn_f16_to_f32((uint16_t)h);
        double want = t_f16((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(f));
            continue;
        }
        if ((double)f != want) fail_msg("f16 0x%04x -> %.9g want %.9g", h, f, want);
        assert_int_equal(ppn_f32_to_f16(f), h);
    }
    /* random floats of f16 range (and some past it) against the nearest-even neighbour found by a binary
     * search over the monotonic positive patterns 0x0000..0x7C00, decoded by t_f16 */
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf(rndf(1.0f, 2.0f), (int)(rnd32() % 46) - 30) * ((rnd32() & 1) ? -1.0f : 1.0f);
        double v = fabs((double)f);
        uint16_t lo = 0, hi = 0x7C00; /* t_f16(lo) <= v < t_f16(hi) */
        if (v >= t_f16(0x7BFF)) lo = 0x7BFF;
        else
            while (hi - lo > 1) {
                uint16_t mid = (uint16_t)((lo + hi) / 2);
                if (t_f16(mid) <= v) lo = mid;
                else hi = mid;
            }
        uint16_t want;
        if (lo == 0x7BFF) want = v >= 65520.0 ? 0x7C00 : 0x7BFF;
        else want = t_f16(lo) == v ? lo : nearest_even(v, lo, t_f16(lo), hi, t_f16(hi));
        want |= signbit(f) ? 0x8000 : 0;
        if (ppn_f32_to_f16(f) != want) fail_msg("f16(%a) = 0x%04x want 0x%04x", f, ppn_f32_to_f16(f), want);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * matvec */

typedef struct mv_case {
    int dt, rows, cols, bias, res, alias; /* alias: res and out are the same buffer */
} mv_case;

static void matvec_case(const mv_case *c)
{
    size_t R = (size_t)c->rows, C = (size_t)c->cols;
    double *wv = malloc(R * C * sizeof *wv), *bv = malloc(R * sizeof *bv), *want = malloc(R * sizeof *want);
    double *tol = malloc(R * sizeof *tol);
    void *w = wrand(c->dt, R * C, wv);
    void *b = wrand(c->dt, R, bv);
    float *x = frand(C, -1, 1), *res = frand(R, -4, 4), *out = frand(R, -9, 9), *out2 = malloc(R * 4);
    float *res_copy = malloc(R * 4);
    assert_non_null(wv);
    assert_non_null(want);
    assert_non_null(out2);
    memcpy(res_copy, res, R * 4);
    for (size_t r = 0; r < R; r++) {
        double s = 0, a = 0;
        for (size_t k = 0; k < C; k++) s += wv[r * C + k] * x[k], a += fabs(wv[r * C + k] * x[k]);
        if (c->bias) s += bv[r], a += fabs(bv[r]);
        if (c->res) s += res[r], a += fabs(res[r]);
        want[r] = s;
        tol[r] = 1e-6 * a + 1e-30;
    }
    float *o = c->alias ? res : out;
    ppn_kp_matvec p = {.out = D(o), .w = D(w), .x = D(x), .bias = c->bias ? D(b) : 0,
                       .res = c->res ? D(res) : 0, .rows = c->rows, .cols = c->cols, .wdt = c->dt};
    run(PPN_K_MATVEC, &p);
    char what[64];
    snprintf(what, sizeof what, "matvec %s %dx%d bias=%d res=%d alias=%d", dt_name(c->dt), c->rows, c->cols,
             c->bias, c->res, c->alias);
    for (size_t r = 0; r < R; r++) check_close(o[r], want[r], tol[r], what, r);
    /* determinism: the same inputs again give the same bits */
    memcpy(out2, o, R * 4);
    if (c->alias) memcpy(res, res_copy, R * 4);
    run(PPN_K_MATVEC, &p);
    assert_memory_equal(out2, o, R * 4);
    free(wv), free(bv), free(want), free(tol), free(w), free(b), free(x), free(res), free(out), free(out2);
    free(res_copy);
}

static void test_matvec(void **state)
{
    (void)state;
    for (int dt = 0; dt < 3; dt++) {
        mv_case cs[] = {
            {dt, 37, 133, 0, 0, 0}, {dt, 37, 133, 1, 0, 0}, {dt, 37, 133, 0, 1, 0}, {dt, 37, 133, 1, 1, 0},
            {dt, 37, 133, 1, 1, 1}, {dt, 64, 256, 0, 1, 1}, {dt, 1, 1, 1, 1, 0},    {dt, 5, 4099, 0, 0, 0},
        };
        for (size_t i = 0; i < ARRAY_LEN(cs); i++) matvec_case(&cs[i]);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * rmsnorm, head_rmsnorm */

/* expected out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] in double; f32 rounding of the mean, the scale and
 * two products stays within 1e-6 relative. */
static void rms_expect(const float *x, const double *w, int n, float eps, double *want)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) want[i] = x[i] * r * w[i];
}

static void test_rmsnorm(void **state)
{
    (void)state;
    const int n = 1000;
    for (int dt = 0; dt < 3; dt++) {
        for (int inplace = 0; inplace < 2; inplace++) {
            double *wv = malloc(n * sizeof *wv), *want = malloc(n * sizeof *want);
            void *w = wrand(dt, n, wv);
            float *x = frand(n, -3, 3), *out = malloc(n * 4), *first = malloc(n * 4), *x0 = malloc(n * 4);
            assert_non_null(want);
            assert_non_null(out);
            memcpy(x0, x, n * 4);
            rms_expect(x, wv, n, 1e-5f, want);
            float *o = inplace ? x : out;
            ppn_kp_rmsnorm p = {.out = D(o), .in = D(x), .w = D(w), .n = n, .wdt = dt, .eps = 1e-5f};
            run(PPN_K_RMSNORM, &p);
            for (int i = 0; i < n; i++) check_close(o[i], want[i], 1e-6 * fabs(want[i]) + 1e-30, "rmsnorm", i);
            memcpy(first, o, n * 4);
            memcpy(x, x0, n * 4);
            run(PPN_K_RMSNORM, &p);
            assert_memory_equal(first, o, n * 4);
            free(wv), free(want), free(w), free(x), free(out), free(first), free(x0);
        }
    }
    /* eps matters: an all-zero vector gives zeros (not NaN) and a tiny vector is damped by eps */
    float z[4] = {0, 0, 0, 0}, wz[4] = {1, 1, 1, 1}, oz[4];
    ppn_kp_rmsnorm p = {.out = D(oz), .in = D(z), .w = D(wz), .n = 4, .wdt = PPN_DTYPE_F32, .eps = 1e-6f};
    run(PPN_K_RMSNORM, &p);
    for (int i = 0; i < 4; i++) assert_true(oz[i] == 0.0f);
    float t[2] = {1e-3f, -1e-3f};
    p.in = D(t), p.n = 2, p.eps = 1e-6f;
    run(PPN_K_RMSNORM, &p);
    check_close(oz[0], 1e-3 / sqrt(1e-6 + 1e-6), 1e-6, "rmsnorm eps", 0);
}

static void test_head_rmsnorm(void **state)
{
    (void)state;
    const int nh = 4, hd = 32;
    for (int dt = 0; dt < 3; dt++) {
        double wv[32], want[32];
        void *w = wrand(dt, hd, wv);
        float *x = frand((size_t)nh * hd, -2, 2), *x0 = malloc((size_t)nh * hd * 4), *first = malloc(nh * hd * 4);
        assert_non_null(x0);
        assert_non_null(first);
        for (int h = 0; h < nh; h++) /* give each head a different scale so per-head norms differ */
            for (int i = 0; i < hd; i++) x[h * hd + i] *= (float)(h + 1);
        memcpy(x0, x, (size_t)nh * hd * 4);
        ppn_kp_head_rmsnorm p = {.x = D(x), .w = D(w), .n_heads = nh, .head_dim = hd, .wdt = dt, .eps = 1e-6f};
        run(PPN_K_HEAD_RMSNORM, &p);
        for (int h = 0; h < nh; h++) {
            rms_expect(x0 + h * hd, wv, hd, 1e-6f, want);
            for (int i = 0; i < hd; i++)
                check_close(x[h * hd + i], want[i], 1e-6 * fabs(want[i]) + 1e-30, "head_rmsnorm", (size_t)(h * hd + i));
        }
        memcpy(first, x, (size_t)nh * hd * 4);
        memcpy(x, x0, (size_t)nh * hd * 4);
        run(PPN_K_HEAD_RMSNORM, &p);
        assert_memory_equal(first, x, (size_t)nh * hd * 4);
        free(w), free(x), free(x0), free(first);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * rope */

static void rope_case(int interleaved, int32_t pos)
{
    const int nh = 3, hd = 64, half = hd / 2;
    float inv[32];
    for (int i = 0; i < half; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    float *x = frand((size_t)nh * hd, -2, 2), *x0 = malloc((size_t)nh * hd * 4), *first = malloc(nh * hd * 4);
    assert_non_null(x0);
    assert_non_null(first);
    memcpy(x0, x, (size_t)nh * hd * 4);
    ppn_step_hdr hdr = {.pos = pos, .token = 3, .seq = 0, .step = 0};
    ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = nh, .head_dim = hd,
                     .interleaved = interleaved};
    run(PPN_K_ROPE, &p);
    for (int h = 0; h < nh; h++) {
        for (int i = 0; i < half; i++) {
            /* the spec rounds the angle pos * inv_freq to f32; cos/sin and the rotation are exact here */
            float ang = (float)pos * inv[i];
            double c = cos((double)ang), s = sin((double)ang);
            int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
            double x0a = x0[h * hd + a], x0b = x0[h * hd + b];
            double tol = 1e-6 * (fabs(x0a) + fabs(x0b));
            check_close(x[h * hd + a], x0a * c - x0b * s, tol, interleaved ? "rope(il) a" : "rope(hf) a", (size_t)i);
            check_close(x[h * hd + b], x0b * c + x0a * s, tol, interleaved ? "rope(il) b" : "rope(hf) b", (size_t)i);
        }
    }
    if (pos == 0) assert_memory_equal(x, x0, (size_t)nh * hd * 4); /* angle 0 is the identity */
    memcpy(first, x, (size_t)nh * hd * 4);
    memcpy(x, x0, (size_t)nh * hd * 4);
    run(PPN_K_ROPE, &p);
    assert_memory_equal(first, x, (size_t)nh * hd * 4);
    free(x), free(x0), free(first);
}

static void test_rope(void **state)
{
    (void)state;
    static const int32_t poss[] = {0, 1, 2, 7, 100, 1000, 4095, 131071};
    for (int il = 0; il < 2; il++)
        for (size_t i = 0; i < ARRAY_LEN(poss); i++) rope_case(il, poss[i]);
}

/* The two conventions pair different elements: at pos 1 with a one-hot vector, HF moves element 0's weight
 * to element hd/2, interleaved to element 1. */
static void test_rope_pairing(void **state)
{
    (void)state;
    float inv[4] = {1.0f, 0.5f, 0.25f, 0.125f}, x[8];
    ppn_step_hdr hdr = {.pos = 1};
    for (int il = 0; il < 2; il++) {
        memset(x, 0, sizeof x);
        x[0] = 1.0f;
        ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = 1, .head_dim = 8,
                         .interleaved = il};
        run(PPN_K_ROPE, &p);
        check_close(x[0], cos(1.0), 1e-7, "rope pair cos", 0);
        int partner = il ? 1 : 4;
        check_close(x[partner], sin(1.0), 1e-7, "rope pair sin", (size_t)partner);
        for (int i = 0; i < 8; i++)
            if (i != 0 && i != partner) assert_true(x[i] == 0.0f);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * rope's KV store, attn */

/* rope with caches (what ppn_op_rope_kv launches): the rotated k heads (the last n_kv of x) and v land in row pos
 * of each KV head's cache, every other row untouched; a position outside the cache stores nothing. */
static void test_rope_kv_store(void **state)
{
    (void)state;
    const int nq = 1, nkv = 2, hd = 16, ctx = 8, nh = nq + nkv;
    size_t csz = (size_t)nkv * ctx * hd;
    float inv[8];
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
    float *kc = malloc(csz * 4), *vc = malloc(csz * 4), *x = frand((size_t)nh * hd, -1, 1),
          *v = frand((size_t)nkv * hd, -1, 1);
    assert_non_null(kc);
    assert_non_null(vc);
    for (size_t i = 0; i < csz; i++) kc[i] = -100.0f - (float)i, vc[i] = 100.0f + (float)i;
    ppn_step_hdr hdr = {.pos = 5};
    ppn_kp_rope p = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .kc = D(kc), .vc = D(vc), .v = D(v),
                     .n_heads = nh, .head_dim = hd, .n_kv = nkv, .ctx = ctx};
    run(PPN_K_ROPE, &p);
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
    run(PPN_K_ROPE, &p);
    hdr.pos = -1;
    run(PPN_K_ROPE, &p);
    assert_memory_equal(kc0, kc, csz * 4);
    free(kc), free(vc), free(x), free(v), free(kc0);
}

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
    float *q = frand(qsz, -1, 1), *kc = frand(csz, -1, 1), *vc = frand(csz, -1, 1);
    float *out = malloc(qsz * 4), *first = malloc(qsz * 4), *emu = malloc(qsz * 4);
    unsigned char *part = calloc(pb, 1), *zero = calloc(pb, 1);
    double *want = malloc(qsz * sizeof *want);
    assert_true(out && first && emu && part && zero && want);
    float scale = 1.0f / sqrtf((float)hd);
    for (size_t i = 0; i < qsz; i++) q[i] *= 3.0f; /* sharpen the softmax a little */
    attn_expect(q, kc, vc, nh, nkv, hd, ctx, pos, scale, want);
    ppn_step_hdr hdr = {.pos = pos};
    ppn_kp_attn p = {.out = D(out), .q = D(q), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr), .part = D(part),
                     .n_heads = nh, .n_kv = nkv, .head_dim = hd, .ctx = ctx, .n_split = ns, .scale = scale};
    run(PPN_K_ATTN, &p);
    char what[80];
    snprintf(what, sizeof what, "attn nh=%d nkv=%d hd=%d pos=%d n_split=%d", nh, nkv, hd, pos, ns);
    /* out is a convex combination of v values in [-1, 1]: 1e-6 absolute is a few f32 ulps of it */
    for (size_t i = 0; i < qsz; i++) check_close(out[i], want[i], 1e-6, what, i);
    memcpy(first, out, qsz * 4);
    run(PPN_K_ATTN, &p);
    assert_memory_equal(first, out, qsz * 4);
    assert_memory_equal(part, zero, pb); /* the reference leaves the scratch (and its counters) alone */
    /* the split in f32: up to ~300 f32 terms per sum, held to 1e-5 absolute like the GPU test */
    attn_split_emulate(q, kc, vc, nh, nkv, hd, ctx, pos, scale, ns, emu);
    snprintf(what, sizeof what, "attn split emulation nh=%d nkv=%d pos=%d n_split=%d", nh, nkv, pos, ns);
    for (size_t i = 0; i < qsz; i++) check_close(emu[i], want[i], 1e-5, what, i);
    free(q), free(kc), free(vc), free(out), free(first), free(emu), free(part), free(zero), free(want);
}

static void test_attn(void **state)
{
    (void)state;
    static const int poss[] = {0, 1, 5, 15}, splits[] = {1, 3, 8, 32};
    for (size_t k = 0; k < ARRAY_LEN(splits); k++) { /* pos < n_split: empty tail splits */
        int ns = splits[k];
        for (size_t i = 0; i < ARRAY_LEN(poss); i++) attn_case(8, 2, 32, 16, poss[i], ns);
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
static void test_attn_gqa_map(void **state)
{
    (void)state;
    const int nh = 8, nkv = 2, hd = 4, ctx = 3;
    float q[8 * 4], kc[2 * 3 * 4], vc[2 * 3 * 4], out[8 * 4];
    for (int i = 0; i < nh * hd; i++) q[i] = (float)i;
    for (int i = 0; i < nkv * ctx * hd; i++) kc[i] = 0.5f, vc[i] = (float)(1000 + i);
    float part[8 * 3 * (4 + 2) + 8]; /* ppn_op_attn_scratch_bytes(8, 3, 4) */
    ppn_step_hdr hdr = {.pos = 0};
    ppn_kp_attn p = {.out = D(out), .q = D(q), .kc = D(kc), .vc = D(vc), .hdr = D(&hdr), .part = D(part),
                     .n_heads = nh, .n_kv = nkv, .head_dim = hd, .ctx = ctx, .n_split = 3, .scale = 0.5f};
    assert_int_equal(ppn_op_attn_scratch_bytes(nh, 3, hd), sizeof part);
    run(PPN_K_ATTN, &p);
    for (int h = 0; h < nh; h++)
        for (int i = 0; i < hd; i++) assert_true(out[h * hd + i] == vc[(h / 4) * ctx * hd + i]);
    /* pos outside the cache: NaN output, no read past the cache */
    hdr.pos = ctx;
    run(PPN_K_ATTN, &p);
    for (int i = 0; i < nh * hd; i++) assert_true(isnan(out[i]));
}

/* ---------------------------------------------------------------------------------------------------------
 * embed, swiglu, add, argmax, fill */

static void test_embed(void **state)
{
    (void)state;
    const int vocab = 50, dim = 24;
    for (int dt = 0; dt < 3; dt++) {
        double *tv = malloc((size_t)vocab * dim * sizeof *tv);
        assert_non_null(tv);
        void *table = wrand(dt, (size_t)vocab * dim, tv);
        float out[24], first[24];
        ppn_step_hdr hdr = {.token = 37};
        ppn_kp_embed p = {.out = D(out), .table = D(table), .hdr = D(&hdr), .dim = dim, .vocab = vocab,
                          .wdt = dt};
        run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true((double)out[i] == tv[37 * dim + i]);
        memcpy(first, out, sizeof out);
        run(PPN_K_EMBED, &p);
        assert_memory_equal(first, out, sizeof out);
        hdr.token = vocab; /* out of range: NaN, no read past the table */
        run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true(isnan(out[i]));
        hdr.token = -1;
        memset(out, 0, sizeof out);
        run(PPN_K_EMBED, &p);
        for (int i = 0; i < dim; i++) assert_true(isnan(out[i]));
        free(tv), free(table);
    }
}

static void test_swiglu(void **state)
{
    (void)state;
    const int n = 777;
    float *g = frand(n, -12, 12), *u = frand(n, -3, 3), *out = malloc(n * 4), *first = malloc(n * 4);
    assert_non_null(out);
    assert_non_null(first);
    g[0] = 0.0f, g[1] = -90.0f, g[2] = 90.0f;
    ppn_kp_swiglu p = {.out = D(out), .gate = D(g), .up = D(u), .n = n};
    run(PPN_K_SWIGLU, &p);
    for (int i = 0; i < n; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        check_close(out[i], want, 1e-6 * fabs(want) + 1e-30, "swiglu", (size_t)i);
    }
    memcpy(first, out, n * 4);
    run(PPN_K_SWIGLU, &p);
    assert_memory_equal(first, out, n * 4);
    free(g), free(u), free(out), free(first);
}

static void test_add(void **state)
{
    (void)state;
    const int n = 300;
    float *a = frand(n, -5, 5), *b = frand(n, -5, 5), *out = malloc(n * 4), *a0 = malloc(n * 4);
    assert_non_null(out);
    assert_non_null(a0);
    memcpy(a0, a, n * 4);
    ppn_kp_add p = {.out = D(out), .a = D(a), .b = D(b), .n = n};
    run(PPN_K_ADD, &p);
    for (int i = 0; i < n; i++) assert_true(out[i] == (float)((double)a[i] + b[i])); /* exact rounding */
    p.out = D(a); /* out aliases a */
    run(PPN_K_ADD, &p);
    assert_memory_equal(a, out, n * 4);
    memcpy(a, a0, n * 4);
    run(PPN_K_ADD, &p);
    assert_memory_equal(a, out, n * 4);
    free(a), free(b), free(out), free(a0);
}

static int32_t argmax_of(const float *x, int n)
{
    int32_t out = -7;
    ppn_kp_argmax p = {.out = D(&out), .x = D(x), .n = n};
    run(PPN_K_ARGMAX, &p);
    return out;
}

static void test_argmax(void **state)
{
    (void)state;
    float a[] = {1, 3, 2, 3, -1};
    assert_int_equal(argmax_of(a, 5), 1); /* tie: lowest index */
    float b[] = {NAN, 0.5f, NAN, 0.5f, 0.25f};
    assert_int_equal(argmax_of(b, 5), 1); /* NaN first never wins */
    float c[] = {-INFINITY, -INFINITY, -3, NAN};
    assert_int_equal(argmax_of(c, 4), 2);
    float d[] = {-INFINITY, -INFINITY};
    assert_int_equal(argmax_of(d, 2), 0);
    float e[] = {NAN, NAN, NAN};
    assert_int_equal(argmax_of(e, 3), -1); /* nothing but NaN */
    float f[] = {-0.0f, 0.0f};
    assert_int_equal(argmax_of(f, 2), 0); /* -0 == +0: a tie */
    float g1[] = {42};
    assert_int_equal(argmax_of(g1, 1), 0);
    float h[] = {1, 2, INFINITY, NAN, INFINITY};
    assert_int_equal(argmax_of(h, 5), 2);
    /* a large random vector: compare with a naive scan */
    const int n = 50000;
    float *x = frand(n, -10, 10);
    for (int i = 0; i < n; i += 97) x[i] = NAN;
    x[31337] = 11.0f, x[40000] = 11.0f;
    assert_int_equal(argmax_of(x, n), 31337);
    free(x);
}

static void test_fill(void **state)
{
    (void)state;
    uint32_t buf[70];
    for (int i = 0; i < 70; i++) buf[i] = 0x11111111u;
    ppn_kp_fill p = {.out = D(buf), .value = 0xDEADBEEFu, .n = 65};
    run(PPN_K_FILL, &p);
    for (int i = 0; i < 70; i++) assert_true(buf[i] == (i < 65 ? 0xDEADBEEFu : 0x11111111u));
}

static void test_set_hdr(void **state)
{
    (void)state;
    ppn_step_hdr h[2] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}};
    ppn_kp_set_hdr p = {.hdr = D(&h[0]), .v = {.pos = 41, .token = 7, .seq = 3, .step = 99}};
    run(PPN_K_SET_HDR, &p);
    assert_int_equal(h[0].pos, 41);
    assert_int_equal(h[0].token, 7);
    assert_int_equal(h[0].seq, 3);
    assert_int_equal(h[0].step, 99);
    assert_int_equal(h[1].pos, -1); /* nothing past the header */
}

/* matmat: each token's row is bit-identical to a matvec of that token, and close to the double reference. */
static void test_matmat(void **state)
{
    (void)state;
    enum { R = 37, C = 70, M = 5 };
    for (int dt = PPN_DTYPE_F32; dt <= PPN_DTYPE_F16; dt++) {
        double wv[R * C], bv[R];
        void *w = wrand(dt, (size_t)R * C, wv), *b = wrand(dt, R, bv);
        float *x = frand((size_t)M * C, -1, 1), *res = frand((size_t)M * R, -2, 2);
        float out[M * R], row[R];
        ppn_kp_matmat p = {.out = D(out), .w = D(w), .x = D(x), .bias = D(b), .res = D(res), .rows = R, .cols = C,
                           .m = M, .wdt = dt};
        run(PPN_K_MATMAT, &p);
        for (int t = 0; t < M; t++) {
            ppn_kp_matvec v = {.out = D(row), .w = D(w), .x = D(x + t * C), .bias = D(b), .res = D(res + t * R),
                               .rows = R, .cols = C, .wdt = dt};
            run(PPN_K_MATVEC, &v);
            assert_memory_equal(row, out + t * R, sizeof row);
            for (int r = 0; r < R; r += 9) {
                double s = res[t * R + r] + bv[r], mag = fabs(res[t * R + r]) + fabs(bv[r]);
                for (int c = 0; c < C; c++) s += wv[r * C + c] * x[t * C + c], mag += fabs(wv[r * C + c] * x[t * C + c]);
                check_close(out[t * R + r], s, 1e-6 * mag + 1e-6, "matmat", r);
            }
        }
        free(w), free(b), free(x), free(res);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the wrappers, through a fake device that captures the launch and runs the CPU reference (as sim does) */

static struct {
    ppn_launch l;
    unsigned char params[256];
    int calls;
    int dry; /* capture only: the pointers are not real buffers (geometry checks of model-sized shapes) */
} cap;

static ppn_status fake_launch(ppn_gpu *g, ppn_gstream *s, const ppn_launch *l)
{
    (void)g, (void)s;
    assert_true(l->params_size <= sizeof cap.params);
    cap.l = *l;
    memcpy(cap.params, l->params, l->params_size);
    cap.l.params = cap.params;
    cap.calls++;
    if (!cap.dry) ppn_kernels[l->kernel].cpu(cap.params);
    return PPN_OK;
}

static const struct ppn_gpu_ops fake_ops = {.name = "fake", .launch = fake_launch};
static ppn_gpu fake_gpu = {.ops = &fake_ops};
static ppn_gstream *const fake_stream = (ppn_gstream *)&fake_gpu;

static void expect_acc(int i, const void *p, size_t bytes, int mode)
{
    assert_true(i < cap.l.nacc);
    assert_true(cap.l.acc[i].ptr == D(p));
    assert_int_equal(cap.l.acc[i].bytes, bytes);
    assert_int_equal(cap.l.acc[i].mode, mode);
}

/* Is [p, p+bytes) covered by a declared access with this mode bit? */
static int declared(const void *p, size_t bytes, int mode)
{
    for (int i = 0; i < cap.l.nacc; i++) {
        const ppn_access *a = &cap.l.acc[i];
        if ((a->mode & mode) && a->ptr <= D(p) && D(p) + bytes <= a->ptr + a->bytes) return 1;
    }
    return 0;
}

static void expect_geometry(unsigned min_threads)
{
    unsigned b = cap.l.block[0];
    assert_true(b >= 32 && b <= 1024 && b % 32 == 0);
    assert_true(cap.l.block[1] == 1 && cap.l.block[2] == 1 && cap.l.grid[1] == 1 && cap.l.grid[2] == 1);
    assert_true(cap.l.grid[0] >= 1);
    assert_true((unsigned long long)cap.l.grid[0] * b >= min_threads);
}

/* m above PPN_MATMAT_MAX_M goes in contiguous chunks, each launch declaring exactly its rows. */
static void test_op_matmat_chunks(void **state)
{
    (void)state;
    enum { R = 9, C = 16, M = PPN_MATMAT_MAX_M + 3 };
    double wv[R * C];
    void *w = wrand(PPN_DTYPE_BF16, (size_t)R * C, wv);
    float *x = frand((size_t)M * C, -1, 1), out[M * R];
    cap.calls = 0;
    assert_int_equal(ppn_op_matmat(&fake_gpu, fake_stream, D(out), D(w), PPN_DTYPE_BF16, D(x), M, R, C, 0, 0), PPN_OK);
    assert_int_equal(cap.calls, 2);
    assert_int_equal(cap.l.kernel, PPN_K_MATMAT);
    const ppn_kp_matmat *p = (const ppn_kp_matmat *)cap.params; /* the last launch: tokens 8..10 */
    assert_int_equal(p->m, 3);
    assert_true(p->x == D(x + PPN_MATMAT_MAX_M * C) && p->out == D(out + PPN_MATMAT_MAX_M * R));
    assert_true(declared(x + PPN_MATMAT_MAX_M * C, (size_t)3 * C * 4, PPN_ACC_R));
    assert_true(declared(out + PPN_MATMAT_MAX_M * R, (size_t)3 * R * 4, PPN_ACC_W));
    for (int t = 0; t < M; t++) { /* every token computed (through the reference) */
        double s = 0;
        for (int c = 0; c < C; c++) s += wv[2 * C + c] * x[t * C + c];
        check_close(out[t * R + 2], s, 1e-5, "op matmat", t);
    }
    assert_int_equal(ppn_op_matmat(&fake_gpu, fake_stream, D(out), D(w), PPN_DTYPE_BF16, D(x), 0, R, C, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_matmat"));
    free(w), free(x);
}


/* The fused matvec input gives, on the reference, the bits of the separate rmsnorm launch followed by a plain
 * matvec (the reference shares their arithmetic); declared accesses cover the norm weight; bad modes (2, the
 * SwiGLU input that is gone, among them), a missing norm weight, a fused input wider than shared memory and
 * an out overlapping x are refused by name before any launch. */
static void test_op_matvec_fused(void **state)
{
    (void)state;
    const int rows = 24, cols = 40;
    double wv[24 * 40], nv[40];
    void *w = wrand(PPN_DTYPE_BF16, (size_t)rows * cols, wv), *nw = wrand(PPN_DTYPE_BF16, cols, nv);
    float *x = frand((size_t)cols, -2, 2), xn[40], a[24], b[24];
    ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = D(x), .nw = D(nw), .eps = 1e-5f};
    cap.calls = 0;
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0), PPN_OK);
    assert_true(declared(nw, (size_t)cols * 2, PPN_ACC_R) && declared(x, (size_t)cols * 4, PPN_ACC_R));
    assert_true(cap.l.smem >= (unsigned)cols * 4); /* a fused input is staged */
    assert_int_equal(ppn_op_rmsnorm(&fake_gpu, fake_stream, D(xn), D(x), D(nw), PPN_DTYPE_BF16, cols, 1e-5f), PPN_OK);
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(b), D(w), PPN_DTYPE_BF16, D(xn), rows, cols, 0, 0), PPN_OK);
    assert_memory_equal(a, b, sizeof a);

    cap.calls = 0;
    in.mode = 7;
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "mode 7"));
    in.mode = 2;
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "mode 2"));
    in = (ppn_mv_input){.mode = PPN_MV_X_RMSNORM, .x = D(x)};
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "norm weight"));
    in.nw = D(nw);
    int wide = (int)(PPN_DYN_SMEM_MAX / 4);
    assert_false(ppn_op_matvec_fusable(wide));
    assert_true(ppn_op_matvec_fusable(wide - 64));
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(a), D(w), PPN_DTYPE_BF16, in, rows, wide, 0, 0),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "shared memory"));
    /* out inside x: the overlap check holds for a fused input too */
    assert_int_equal(ppn_op_matvec_in(&fake_gpu, fake_stream, D(x + 4), D(w), PPN_DTYPE_BF16, in, 8, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "overlaps"));
    assert_int_equal(cap.calls, 0);
    free(w), free(nw), free(x);
}

/* rope_kv = the rotation of every q and k head (the plain rope's bits), then the rotated k and v stored at pos:
 * one launch of the rope kernel with the caches. */
static void test_op_rope_kv(void **state)
{
    (void)state;
    const int nq = 4, nkv = 2, hd = 16, ctx = 6, nh = nq + nkv;
    float inv[8], qk[6 * 16], qk2[6 * 16], v[2 * 16], kc[2 * 6 * 16], vc[2 * 6 * 16], kc2[2 * 6 * 16],
        vc2[2 * 6 * 16];
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    float *r = frand((size_t)nh * hd, -1, 1), *rv = frand((size_t)nkv * hd, -1, 1);
    memcpy(qk, r, sizeof qk), memcpy(qk2, r, sizeof qk2), memcpy(v, rv, sizeof v);
    for (int i = 0; i < 2 * 6 * 16; i++) kc[i] = kc2[i] = vc[i] = vc2[i] = (float)i;
    ppn_step_hdr hdr = {.pos = 3};
    for (int il = 0; il < 2; il++) {
        assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qk), nq, nkv, hd, D(inv), il, D(&hdr), D(kc),
                                        D(vc), D(v), ctx, PPN_DTYPE_F32), PPN_OK);
        assert_int_equal(cap.l.kernel, PPN_K_ROPE);
        assert_int_equal(cap.l.grid[0], nh); /* a block per head, q and k */
        assert_true(declared(kc, sizeof kc, PPN_ACC_W) && declared(v, sizeof v, PPN_ACC_R));
        ppn_kp_rope plain = {.x = D(qk2), .inv_freq = D(inv), .hdr = D(&hdr), .n_heads = nh, .head_dim = hd,
                             .interleaved = il};
        run(PPN_K_ROPE, &plain);
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
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qk), nq, nkv, 15, D(inv), 0, D(&hdr), D(kc), D(vc),
                                    D(v), ctx, PPN_DTYPE_F32), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    free(r), free(rv);
}

/* attn_rope = rope_kv then attn, in one launch: the same output and caches, bit for bit, and the projection
 * only read; in and outside the cache, both rotary conventions, and its own argument checks. */
static void test_op_attn_rope(void **state)
{
    (void)state;
    enum { NH = 4, NKV = 2, HD = 16, CTX = 6, QKV = (NH + 2 * NKV) * HD, CSZ = NKV * CTX * HD };
    float inv[HD / 2], qkv[QKV], qkv0[QKV], qkv2[QKV], kc[CSZ], vc[CSZ], kc2[CSZ], vc2[CSZ], out[NH * HD],
        out2[NH * HD];
    unsigned char part[4096];
    assert_true(ppn_op_attn_scratch_bytes(NH, 2, HD) <= sizeof part);
    memset(part, 0, sizeof part);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
    float *r = frand(QKV, -2, 2), *rc = frand(CSZ, -1, 1);
    memcpy(qkv0, r, sizeof qkv0);
    memcpy(kc, rc, sizeof kc), memcpy(kc2, rc, sizeof kc2), memcpy(vc, rc, sizeof vc), memcpy(vc2, rc, sizeof vc2);
    ppn_step_hdr hdr = {.pos = 3};
    float sc = 0.25f;
    for (int k = 0; k < 4; k++) {
        int il = k & 1;
        if (k == 2) hdr.pos = CTX; /* outside the cache: NaN out, nothing stored (as rope_kv) */
        memcpy(qkv, qkv0, sizeof qkv), memcpy(qkv2, qkv0, sizeof qkv2);
        assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, HD, CTX, sc,
                                          D(&hdr), D(part), 2, D(inv), il, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(cap.l.kernel, PPN_K_ATTN);
        assert_int_equal(cap.l.grid[0], NKV);
        assert_int_equal(cap.l.grid[1], 2);
        assert_true(declared(qkv, sizeof qkv, PPN_ACC_R) && !declared(qkv, 4, PPN_ACC_W));
        assert_true(declared(kc, sizeof kc, PPN_ACC_R) && declared(kc, sizeof kc, PPN_ACC_W));
        assert_true(declared(vc, sizeof vc, PPN_ACC_R) && declared(vc, sizeof vc, PPN_ACC_W));
        assert_true(declared(inv, sizeof inv, PPN_ACC_R) && declared(&hdr, sizeof hdr, PPN_ACC_R));
        assert_true(declared(out, sizeof out, PPN_ACC_W));
        assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv2), NH, NKV, HD, D(inv), il, D(&hdr), D(kc2),
                                        D(vc2), D(qkv2 + (NH + NKV) * HD), CTX, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out2), D(qkv2), D(kc2), D(vc2), NH, NKV, HD, CTX, sc,
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
    cap.calls = 0;
    assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, 15, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_non_null(strstr(ppn_last_error(), "even"));
    assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, HD, CTX, sc,
                                      D(&hdr), D(part), 2, 0, 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "inv_freq"));
    assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kc), D(vc), NH, NKV, 96, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EUNSUPPORTED); /* halves 48 apart: not in one lane */
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_non_null(strstr(ppn_last_error(), "96"));
    assert_non_null(strstr(ppn_last_error(), "rope_kv"));
    assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kc), D(vc), 6, 4, HD, CTX, sc,
                                      D(&hdr), D(part), 2, D(inv), 0, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn_rope"));
    assert_int_equal(cap.calls, 0);
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
static void test_op_kv_dtypes(void **state)
{
    (void)state;
    enum { NH = 4, NKV = 2, HD = 16, CTX = 6, QKV = (NH + 2 * NKV) * HD, CSZ = NKV * CTX * HD };
    float inv[HD / 2], qkv[QKV], qkv2[QKV], kf[CSZ], vf[CSZ], out[NH * HD], out2[NH * HD];
    uint16_t kh[CSZ], vh[CSZ], kh2[CSZ], vh2[CSZ];
    unsigned char part[4096];
    memset(part, 0, sizeof part);
    for (int i = 0; i < HD / 2; i++) inv[i] = powf(10000.0f, -2.0f * (float)i / (float)HD);
    float *r = frand(QKV, -2, 2), *rc = frand(CSZ, -1, 1);
    static const int dts[] = {PPN_DTYPE_BF16, PPN_DTYPE_F16};
    for (size_t k = 0; k < ARRAY_LEN(dts); k++) {
        int dt = dts[k];
        uint16_t (*to16)(float) = dt == PPN_DTYPE_BF16 ? ppn_f32_to_bf16 : ppn_f32_to_f16;
        float (*to32)(uint16_t) = dt == PPN_DTYPE_BF16 ? ppn_bf16_to_f32 : ppn_f16_to_f32;
        for (int i = 0; i < CSZ; i++) kh[i] = vh[i] = kh2[i] = vh2[i] = to16(rc[i]), kf[i] = vf[i] = rc[i];
        ppn_step_hdr hdr = {.pos = 4};
        /* rope_kv into an f32 cache and a 2-byte one: the 2-byte row is the f32 row rounded */
        memcpy(qkv, r, sizeof qkv), memcpy(qkv2, r, sizeof qkv2);
        assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kf), D(vf),
                                        D(qkv + (NH + NKV) * HD), CTX, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv2), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh),
                                        D(vh), D(qkv2 + (NH + NKV) * HD), CTX, dt),
                         PPN_OK);
        assert_true(declared(kh, sizeof kh, PPN_ACC_W) && !declared(kh, sizeof kh + 2, PPN_ACC_W));
        for (int i = 0; i < CSZ; i++) {
            assert_int_equal(kh[i], to16(kf[i]));
            assert_int_equal(vh[i], to16(vf[i]));
        }
        /* attention over the 2-byte cache = over an f32 cache of its widened values */
        for (int i = 0; i < CSZ; i++) kf[i] = to32(kh[i]), vf[i] = to32(vh[i]);
        assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(qkv2), D(kh), D(vh), NH, NKV, HD, CTX, 0.25f,
                                     D(&hdr), D(part), 2, dt),
                         PPN_OK);
        assert_int_equal(cap.l.kernel, dt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BF16 : PPN_K_ATTN_F16);
        assert_true(declared(kh, sizeof kh, PPN_ACC_R) && !declared(kh, sizeof kh + 2, PPN_ACC_R));
        assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out2), D(qkv2), D(kf), D(vf), NH, NKV, HD, CTX, 0.25f,
                                     D(&hdr), D(part), 2, PPN_DTYPE_F32),
                         PPN_OK);
        assert_int_equal(cap.l.kernel, PPN_K_ATTN);
        assert_memory_equal(out, out2, sizeof out);
        /* the fused rotary in this dtype: rope_kv + attn's output and caches */
        for (int i = 0; i < CSZ; i++) kh[i] = vh[i] = kh2[i] = vh2[i] = to16(rc[i]);
        memcpy(qkv, r, sizeof qkv), memcpy(qkv2, r, sizeof qkv2);
        assert_int_equal(ppn_op_attn_rope(&fake_gpu, fake_stream, D(out), D(qkv), D(kh), D(vh), NH, NKV, HD, CTX,
                                          0.25f, D(&hdr), D(part), 2, D(inv), 0, dt),
                         PPN_OK);
        assert_int_equal(cap.l.kernel, dt == PPN_DTYPE_BF16 ? PPN_K_ATTN_BF16 : PPN_K_ATTN_F16);
        assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv2), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh2),
                                        D(vh2), D(qkv2 + (NH + NKV) * HD), CTX, dt),
                         PPN_OK);
        assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out2), D(qkv2), D(kh2), D(vh2), NH, NKV, HD, CTX, 0.25f,
                                     D(&hdr), D(part), 2, dt),
                         PPN_OK);
        assert_memory_equal(out, out2, sizeof out);
        assert_memory_equal(kh, kh2, sizeof kh);
        assert_memory_equal(vh, vh2, sizeof vh);
    }
    cap.calls = 0;
    ppn_step_hdr hdr = {.pos = 1};
    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(qkv), D(kh), D(vh), NH, NKV, HD, CTX, 0.25f,
                                 D(&hdr), D(part), 2, 7),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "KV cache dtype 7"));
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh), D(vh),
                                    D(qkv), CTX, -1),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    assert_non_null(strstr(ppn_last_error(), "KV cache dtype -1"));
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(qkv), NH, NKV, HD, D(inv), 0, D(&hdr), D(kh), D(vh),
                                    D(qkv), CTX, 3),
                     PPN_EINVAL);
    assert_int_equal(cap.calls, 0);
    free(r), free(rc);
}

/* The matvec geometry the H200 runs chose (ops.c matvec_geometry; docs/PERF.md): 256-thread blocks, four an SM,
 * while x is staged under 16 KB; 512-thread blocks from 16 KB of staged x (x copied half as often) and where a
 * large x leaves room for fewer blocks; never more blocks than one resident wave of 132 SMs; x over the
 * shared-memory opt-in read unstaged. Captured only (model-sized shapes, no buffers behind the pointers). */
static void test_op_matvec_geometry(void **state)
{
    (void)state;
    static const struct { int rows, cols; unsigned block, max_grid, smem; } g[] = {
        {3072, 2048, 256, 528, 8192},     /* llama-1b q|k|v: x of 8 KB */
        {16384, 2048, 256, 528, 8192},    /* llama-1b gate|up */
        {2048, 8192, 512, 264, 32768},    /* llama-1b down: x of 32 KB */
        {6144, 4096, 512, 264, 16384},    /* llama-8b q|k|v: x of 16 KB */
        {4096, 14336, 512, 264, 57344},   /* llama-8b down: 2 x 512 threads fit beside 57 KB, not 4 x 256 */
        {128256, 4096, 512, 264, 16384},  /* llama-8b lm head */
        {64, 30000, 256, 528, 0},         /* x of 120 KB: over the opt-in, read unstaged */
    };
    cap.dry = 1;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        ppn_dptr w = 0x100000, x = 0x10000000, out = 0x20000000;
        assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, out, w, PPN_DTYPE_BF16, x, g[i].rows, g[i].cols, 0, 0),
                         PPN_OK);
        if (cap.l.block[0] != g[i].block || cap.l.grid[0] > g[i].max_grid || cap.l.smem != g[i].smem)
            fail_msg("%d x %d: block %u grid %u smem %u, expected block %u grid <= %u smem %u", g[i].rows, g[i].cols,
                     cap.l.block[0], cap.l.grid[0], cap.l.smem, g[i].block, g[i].max_grid, g[i].smem);
        expect_geometry(1);
    }
}

static int dry_off(void **state) /* also after a failed check, so later tests run the reference again */
{
    (void)state;
    cap.dry = 0;
    return 0;
}

static void test_op_matvec(void **state)
{
    (void)state;
    const int rows = 20, cols = 33;
    double wv[20 * 33], bv[20];
    void *w = wrand(PPN_DTYPE_BF16, (size_t)rows * cols, wv), *b = wrand(PPN_DTYPE_BF16, rows, bv);
    float *x = frand(cols, -1, 1), *res = frand(rows, -1, 1);
    cap.calls = 0;
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, cols, 0,
                                   D(res)),
                     PPN_OK);
    assert_int_equal(cap.calls, 1);
    assert_int_equal(cap.l.kernel, PPN_K_MATVEC);
    assert_int_equal(cap.l.params_size, sizeof(ppn_kp_matvec));
    const ppn_kp_matvec *p = (const ppn_kp_matvec *)cap.params;
    assert_true(p->out == D(res) && p->w == D(w) && p->x == D(x) && p->bias == 0 && p->res == D(res));
    assert_true(p->rows == rows && p->cols == cols && p->wdt == PPN_DTYPE_BF16);
    assert_int_equal(cap.l.nacc, 4); /* no access for the absent bias */
    expect_acc(0, w, (size_t)rows * cols * 2, PPN_ACC_R);
    expect_acc(1, x, (size_t)cols * 4, PPN_ACC_R);
    expect_acc(2, res, (size_t)rows * 4, PPN_ACC_R);
    expect_acc(3, res, (size_t)rows * 4, PPN_ACC_W);
    /* one warp per row: enough warps for every row */
    assert_true((unsigned long long)cap.l.grid[0] * (cap.l.block[0] / 32) >= (unsigned)rows);
    expect_geometry(32);
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, cols, D(b), 0),
                     PPN_OK);
    assert_int_equal(cap.l.nacc, 4);
    assert_true(declared(b, (size_t)rows * 2, PPN_ACC_R));
    assert_true(declared(res, (size_t)rows * 4, PPN_ACC_W));
    /* the result went through the reference: check one row */
    double s = bv[3];
    for (int c = 0; c < cols; c++) s += wv[3 * cols + c] * x[c];
    check_close(res[3], s, 1e-5, "op matvec", 3);

    /* argument checks: name the op and the value; nothing launched */
    cap.calls = 0;
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), 0, cols, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_matvec"));
    assert_non_null(strstr(ppn_last_error(), "rows"));
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(res), D(w), PPN_DTYPE_BF16, D(x), rows, -3, 0, 0),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "-3"));
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(res), D(w), 9, D(x), rows, cols, 0, 0), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "9"));
    assert_int_equal(ppn_op_matvec(&fake_gpu, fake_stream, D(x), D(w), PPN_DTYPE_BF16, D(x), rows, cols, 0, 0),
                     PPN_EINVAL); /* out overlapping x */
    assert_non_null(strstr(ppn_last_error(), "overlaps"));
    assert_int_equal(cap.calls, 0);
    free(w), free(b), free(x), free(res);
}

/* The unfused attention path of a layer: rope_kv (q and k rotated, k and v stored), then attn. */
static void test_op_attention_path(void **state)
{
    (void)state;
    const int nh = 8, nkv = 2, hd = 16, ctx = 10;
    size_t csz = (size_t)nkv * ctx * hd, qsz = (size_t)nh * hd, qksz = qsz + (size_t)nkv * hd;
    float *kc = calloc(csz, 4), *vc = calloc(csz, 4), *q = frand(qksz, -1, 1), *out = malloc(qsz * 4);
    float *v = frand((size_t)nkv * hd, -1, 1), inv[8];
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

    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(q), nh, nkv, hd, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_OK);
    assert_int_equal(cap.l.kernel, PPN_K_ROPE);
    assert_true(declared(kc, csz * 4, PPN_ACC_W)); /* whole caches: the row comes from device memory */
    assert_true(declared(vc, csz * 4, PPN_ACC_W));
    assert_true(declared(v, (size_t)nkv * hd * 4, PPN_ACC_R));
    assert_true(declared(q, qksz * 4, PPN_ACC_R) && declared(q, qksz * 4, PPN_ACC_W));
    assert_true(declared(inv, (size_t)hd / 2 * 4, PPN_ACC_R));
    assert_true(declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_true(kc[(size_t)ctx * hd + 3 * hd] == k[hd]); /* KV head 1, row 3: its rotated k */
    assert_true(vc[(size_t)ctx * hd + 3 * hd] == v[hd]);

    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 0.25f,
                                 D(&hdr), D(part), 3, PPN_DTYPE_F32),
                     PPN_OK);
    assert_int_equal(cap.l.kernel, PPN_K_ATTN);
    assert_int_equal(cap.l.grid[0], (unsigned)nkv); /* a CTA per KV head serves its query heads */
    assert_int_equal(cap.l.grid[1], 3); /* n_split, never pos: one launch serves every step */
    assert_int_equal(cap.l.grid[2], 1);
    assert_int_equal(((const ppn_kp_attn *)cap.l.params)->n_split, 3);
    assert_true(((const ppn_kp_attn *)cap.l.params)->part == D(part));
    assert_true(declared(part, pb, PPN_ACC_R) && declared(part, pb, PPN_ACC_W));
    assert_true(declared(kc, csz * 4, PPN_ACC_R) && declared(vc, csz * 4, PPN_ACC_R));
    assert_true(declared(q, qsz * 4, PPN_ACC_R) && declared(out, qsz * 4, PPN_ACC_W));
    assert_true(declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_false(declared(kc, csz * 4, PPN_ACC_W));
    attn_expect(q, kc, vc, nh, nkv, hd, ctx, 3, 0.25, want);
    for (size_t i = 0; i < qsz; i++) check_close(out[i], want[i], 1e-6, "op attn", i);

    /* argument checks */
    cap.calls = 0;
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(q), nh, nkv, 7, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_rope_kv"));
    assert_non_null(strstr(ppn_last_error(), "7"));
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(q), 0, nkv, hd, D(inv), 0, D(&hdr), D(kc), D(vc), D(v),
                                    ctx, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), 6, 4, hd, ctx, 1, D(&hdr),
                                 D(part), 3, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "ppn_op_attn"));
    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, 512, ctx, 1,
                                 D(&hdr), D(part), 3, PPN_DTYPE_F32),
                     PPN_EUNSUPPORTED);
    assert_non_null(strstr(ppn_last_error(), "512"));
    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, 0, 1, D(&hdr),
                                 D(part), 3, PPN_DTYPE_F32),
                     PPN_EINVAL);
    static const int bad_splits[] = {0, -1, 65};
    for (size_t i = 0; i < ARRAY_LEN(bad_splits); i++) {
        char num[16];
        snprintf(num, sizeof num, "%d", bad_splits[i]);
        assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 1,
                                     D(&hdr), D(part), bad_splits[i], PPN_DTYPE_F32),
                         PPN_EINVAL);
        assert_non_null(strstr(ppn_last_error(), "ppn_op_attn"));
        assert_non_null(strstr(ppn_last_error(), "n_split"));
        assert_non_null(strstr(ppn_last_error(), num));
    }
    assert_int_equal(ppn_op_attn(&fake_gpu, fake_stream, D(out), D(q), D(kc), D(vc), nh, nkv, hd, ctx, 1,
                                 D(&hdr), 0, 1, PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "part"));
    assert_int_equal(ppn_op_rope_kv(&fake_gpu, fake_stream, D(q), nh, nkv, hd, D(inv), 0, 0, D(kc), D(vc), D(v), ctx,
                                    PPN_DTYPE_F32),
                     PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "hdr"));
    assert_int_equal(cap.calls, 0);
    free(kc), free(vc), free(q), free(out), free(v), free(want), free(part);
}

/* The scratch's size (records of head_dim + 2 floats, then a u32 counter per head) and the split rule. */
static void test_op_attn_split(void **state)
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

static void test_op_small(void **state)
{
    (void)state;
    const int n = 600;
    float *a = frand(n, -1, 1), *b = frand(n, -1, 1), *out = malloc(n * 4), w[600];
    int32_t idx = -5;
    size_t amx_bytes = ppn_op_argmax_scratch_bytes();
    unsigned char *amx = calloc(amx_bytes, 1); /* the argmax's scratch; the CPU reference leaves it alone */
    uint16_t tab[4 * 600];
    assert_non_null(out);
    for (int i = 0; i < n; i++) w[i] = 1.0f;
    for (int i = 0; i < 4 * n; i++) tab[i] = ppn_f32_to_f16((float)(i % 7));
    ppn_step_hdr hdr = {.token = 2};

    assert_int_equal(ppn_op_embed(&fake_gpu, fake_stream, D(out), D(tab), PPN_DTYPE_F16, 4, n, D(&hdr)), PPN_OK);
    expect_geometry((unsigned)n);
    assert_true(declared(tab, sizeof tab, PPN_ACC_R) && declared(&hdr, sizeof hdr, PPN_ACC_R));
    assert_true(declared(out, (size_t)n * 4, PPN_ACC_W));
    assert_true(out[5] == (float)((2 * n + 5) % 7));

    assert_int_equal(ppn_op_rmsnorm(&fake_gpu, fake_stream, D(out), D(a), D(w), PPN_DTYPE_F32, n, 1e-5f), PPN_OK);
    assert_true(declared(a, (size_t)n * 4, PPN_ACC_R) && declared(w, (size_t)n * 4, PPN_ACC_R));
    assert_true(declared(out, (size_t)n * 4, PPN_ACC_W));

    assert_int_equal(ppn_op_head_rmsnorm(&fake_gpu, fake_stream, D(out), 10, 60, D(w), PPN_DTYPE_F32, 1e-6f), PPN_OK);
    assert_int_equal(cap.l.grid[0], 10);
    assert_true(declared(out, (size_t)n * 4, PPN_ACC_RW) && declared(w, 60 * 4, PPN_ACC_R));

    assert_int_equal(ppn_op_swiglu(&fake_gpu, fake_stream, D(out), D(a), D(b), n), PPN_OK);
    expect_geometry((unsigned)n);
    check_close(out[9], a[9] / (1.0 + exp(-(double)a[9])) * b[9], 1e-6, "op swiglu", 9);

    assert_int_equal(ppn_op_add(&fake_gpu, fake_stream, D(a), D(a), D(b), n), PPN_OK);
    expect_geometry((unsigned)n);
    assert_true(declared(a, (size_t)n * 4, PPN_ACC_R) && declared(a, (size_t)n * 4, PPN_ACC_W));

    a[123] = 50.0f;
    assert_int_equal(ppn_op_argmax_wide(&fake_gpu, fake_stream, D(&idx), D(a), n, D(amx)), PPN_OK);
    assert_int_equal(idx, 123);
    assert_true(declared(&idx, 4, PPN_ACC_W) && declared(a, (size_t)n * 4, PPN_ACC_R));
    assert_true(declared(amx, amx_bytes, PPN_ACC_R) && declared(amx, amx_bytes, PPN_ACC_W));
    assert_true(cap.l.grid[0] > 1); /* many blocks, merging through the scratch */

    cap.calls = 0;
    assert_int_equal(ppn_op_add(&fake_gpu, fake_stream, D(out), D(a), D(b), -1), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "-1"));
    assert_int_equal(ppn_op_swiglu(&fake_gpu, fake_stream, D(out), D(a), 0, n), PPN_EINVAL);
    assert_int_equal(ppn_op_argmax_wide(&fake_gpu, fake_stream, D(&idx), D(a), 0, D(amx)), PPN_EINVAL);
    assert_int_equal(ppn_op_argmax_wide(&fake_gpu, fake_stream, D(&idx), D(a), n, 0), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "part"));
    assert_int_equal(ppn_op_embed(&fake_gpu, fake_stream, D(out), D(tab), PPN_DTYPE_F16, 0, n, D(&hdr)), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "vocab"));
    assert_int_equal(ppn_op_head_rmsnorm(&fake_gpu, fake_stream, D(out), 10, 0, D(w), PPN_DTYPE_F32, 1e-6f),
                     PPN_EINVAL);
    assert_int_equal(ppn_op_rmsnorm(&fake_gpu, fake_stream, D(out), D(a), D(w), 3, n, 1e-5f), PPN_EINVAL);
    assert_int_equal(cap.calls, 0);
    free(a), free(b), free(out), free(amx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_bf16_known),
        cmocka_unit_test(test_bf16_roundtrip_and_rne),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_f16_roundtrip_and_rne),
        cmocka_unit_test(test_matvec),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_head_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_pairing),
        cmocka_unit_test(test_rope_kv_store),
        cmocka_unit_test(test_attn),
        cmocka_unit_test(test_attn_gqa_map),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_set_hdr),
        cmocka_unit_test(test_matmat),
        cmocka_unit_test(test_op_matmat_chunks),
        cmocka_unit_test(test_op_matvec),
        cmocka_unit_test_teardown(test_op_matvec_geometry, dry_off),
        cmocka_unit_test(test_op_matvec_fused),
        cmocka_unit_test(test_op_rope_kv),
        cmocka_unit_test(test_op_attn_rope),
        cmocka_unit_test(test_op_kv_dtypes),
        cmocka_unit_test(test_op_attention_path),
        cmocka_unit_test(test_op_attn_split),
        cmocka_unit_test(test_op_small),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
