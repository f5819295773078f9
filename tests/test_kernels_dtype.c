/* test_kernels_dtype.c - the dtype sizes, and the bf16/f16 conversions (core/base/dtype.c) the kernels' CPU
 * references and the KV caches round with: against known bit patterns, every 16-bit pattern round trip, and
 * random floats against the nearest-even neighbour chosen here in double from the formats' definitions.
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
#include "tests/util/trand.h"

static void test_dtype_sizes(void **state)
{
    (void)state;
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_F32), 4);
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_BF16), 2);
    assert_int_equal(ppn_dtype_size(PPN_DTYPE_F16), 2);
    assert_int_equal(ppn_dtype_size(7), 0);
    assert_int_equal(ppn_dtype_size(-1), 0);
}

/* Nearest of two neighbours lo < hi (bit patterns a, b with values va, vb) to v, ties to the even pattern. */
static uint16_t nearest_even(double v, uint16_t a, double va, uint16_t b, double vb)
{
    double da = fabs(v - va), db = fabs(vb - v);
    if (da < db) return a;
    if (db < da) return b;
    return (a & 1) ? b : a;
}

static void test_dtype_bf16_known(void **state)
{
    (void)state;
    assert_int_equal(ppn_f32_to_bf16(1.0f), 0x3F80);
    assert_int_equal(ppn_f32_to_bf16(-2.0f), 0xC000);
    assert_int_equal(ppn_f32_to_bf16(tu_bits_f32(0x3F808000u)), 0x3F80); /* tie, even stays */
    assert_int_equal(ppn_f32_to_bf16(tu_bits_f32(0x3F818000u)), 0x3F82); /* tie, odd rounds up */
    assert_int_equal(ppn_f32_to_bf16(tu_bits_f32(0x3F808001u)), 0x3F81); /* above the half */
    assert_int_equal(ppn_f32_to_bf16(tu_bits_f32(0x3F807FFFu)), 0x3F80); /* below the half */
    assert_int_equal(ppn_f32_to_bf16(tu_bits_f32(0x7F7FFFFFu)), 0x7F80); /* max float rounds to inf */
    assert_int_equal(ppn_f32_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(ppn_f32_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(ppn_f32_to_bf16(-0.0f), 0x8000);
    uint16_t n = ppn_f32_to_bf16(NAN);
    assert_true((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    /* a NaN whose payload lives only in the low 16 bits must stay NaN, not become inf */
    n = ppn_f32_to_bf16(tu_bits_f32(0x7F800001u));
    assert_true((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);
    assert_true(ppn_bf16_to_f32(0x3F80) == 1.0f);
    assert_true(ppn_bf16_to_f32(0xC049) == tu_bits_f32(0xC0490000u));
    assert_true(isinf(ppn_bf16_to_f32(0xFF80)) && ppn_bf16_to_f32(0xFF80) < 0);
    assert_true(isnan(ppn_bf16_to_f32(0x7FC0)));
}

static void test_dtype_bf16_roundtrip_and_rne(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ppn_bf16_to_f32((uint16_t)h);
        assert_true(tu_f32_bits(f) == h << 16);
        if (isnan(f)) continue;
        assert_int_equal(ppn_f32_to_bf16(f), h);
    }
    /* random finite floats against the nearest-even neighbour chosen in double */
    for (int i = 0; i < 200000; i++) {
        uint32_t u = tu_rand32();
        float f = tu_bits_f32(u);
        if (!isfinite(f)) continue;
        uint16_t a = (uint16_t)(u >> 16), b = (uint16_t)(a + 1); /* |v| between a and b (same sign) */
        double va = tu_bf16_value(a), vb = (b & 0x7F80) == 0x7F80 && (b & 0x7F) == 0 ? INFINITY : tu_bf16_value(b);
        uint16_t want;
        if ((u & 0xFFFF) == 0) want = a;
        else if (isinf(vb)) want = (u & 0xFFFF) >= 0x8000 ? b : a; /* rounding past max is overflow */
        else want = nearest_even(fabs((double)f), a & 0x7FFF, fabs(va), b & 0x7FFF, fabs(vb)) |
                    (uint16_t)(a & 0x8000);
        if (ppn_f32_to_bf16(f) != want) fail_msg("bf16(0x%08x) = 0x%04x want 0x%04x", u, ppn_f32_to_bf16(f), want);
    }
}

static void test_dtype_f16_known(void **state)
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
    n = ppn_f32_to_f16(tu_bits_f32(0x7F800001u)); /* payload below the kept bits: still NaN */
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

static void test_dtype_f16_roundtrip_and_rne(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ppn_f16_to_f32((uint16_t)h);
        double want = tu_f16_value((uint16_t)h);
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
        float f = ldexpf(tu_randf(1.0f, 2.0f), (int)(tu_rand32() % 46) - 30) * ((tu_rand32() & 1) ? -1.0f : 1.0f);
        double v = fabs((double)f);
        uint16_t lo = 0, hi = 0x7C00; /* tu_f16_value(lo) <= v < tu_f16_value(hi) */
        if (v >= tu_f16_value(0x7BFF)) lo = 0x7BFF;
        else
            while (hi - lo > 1) {
                uint16_t mid = (uint16_t)((lo + hi) / 2);
                if (tu_f16_value(mid) <= v) lo = mid;
                else hi = mid;
            }
        uint16_t want;
        if (lo == 0x7BFF) want = v >= 65520.0 ? 0x7C00 : 0x7BFF;
        else want = tu_f16_value(lo) == v ? lo : nearest_even(v, lo, tu_f16_value(lo), hi, tu_f16_value(hi));
        want |= signbit(f) ? 0x8000 : 0;
        if (ppn_f32_to_f16(f) != want) fail_msg("f16(%a) = 0x%04x want 0x%04x", f, ppn_f32_to_f16(f), want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_sizes),
        cmocka_unit_test(test_dtype_bf16_known),
        cmocka_unit_test(test_dtype_bf16_roundtrip_and_rne),
        cmocka_unit_test(test_dtype_f16_known),
        cmocka_unit_test(test_dtype_f16_roundtrip_and_rne),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
