/* dtype.c - element types on the host: sizes and the bf16 / f16 <-> f32 conversions (round to nearest even)
 * shared by the loaders, mkmodel and the CPU reference kernels. */
#include <string.h>
#include "core/base/dtype.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float ppn_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* Round to nearest even on the 16 dropped bits; a NaN stays a NaN (quieted) instead of rounding to inf. */
uint16_t ppn_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ppn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* Shift m right by sh (1..24) rounding to nearest even. */
static uint32_t shift_rne(uint32_t m, unsigned sh)
{
    uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return q;
}

/* Round to nearest even, with f16 subnormals, overflow to inf, and NaN kept a (quiet) NaN. */
uint16_t ppn_f32_to_f16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 (and inf) rounds to inf */
    if (a >= 0x38800000u) {                                    /* normal f16: rebias, round 13 bits */
        return (uint16_t)(sign | shift_rne(a - (112u << 23), 13));
    }
    if (a <= 0x33000000u) return sign;                         /* <= 2^-25 rounds to (signed) zero */
    /* Subnormal: value = (mant | 1<<23) * 2^(e-150); in units of 2^-24 that is a right shift by 126-e. A
     * carry out of the mantissa yields 0x400, the smallest normal, which is the right encoding. */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | shift_rne(m, 126u - e));
}

size_t ppn_dtype_size(int dt)
{
    switch (dt) {
    case PPN_DTYPE_F32: return 4;
    case PPN_DTYPE_BF16: return 2;
    case PPN_DTYPE_F16: return 2;
    default: return 0;
    }
}

const char *ppn_dtype_name(ppn_dtype dt)
{
    switch (dt) {
    case PPN_DTYPE_F32: return "f32";
    case PPN_DTYPE_BF16: return "bf16";
    case PPN_DTYPE_F16: return "f16";
    case PPN_DTYPE_DEFAULT: return "default";
    }
    return "?";
}

/* Non-finite values ------------------------------------------------------------------------------------- *
 * NaN and Inf have every exponent bit set; adding one at the exponent's lowest bit then carries into the
 * sign bit, and into nothing above it. So an OR of ((word & exponent) + lowest) over the data collects, in the
 * sign bits, whether any element was NaN or Inf. A 32-bit word holds one f32 or two 16-bit elements, whose
 * fields do not carry into each other, so one loop of 32-bit lanes serves every dtype. The lanes are GCC/Clang
 * vector extensions: plain -O2 does not vectorise the reduction on its own (6x slower than memcpy). */

typedef uint32_t ppn_u32x4 __attribute__((vector_size(16)));

typedef struct nf_consts {
    uint32_t exp, low, sign;
} nf_consts;

static nf_consts nf_of(int dt)
{
    if (dt == PPN_DTYPE_F32) return (nf_consts){0x7f800000u, 0x00800000u, 0x80000000u};
    if (dt == PPN_DTYPE_F16) return (nf_consts){0x7c007c00u, 0x04000400u, 0x80008000u};
    return (nf_consts){0x7f807f80u, 0x00800080u, 0x80008000u}; /* bf16 */
}

int ppn_copy_nonfinite(void *dst, const void *src, size_t n, int dt)
{
    nf_consts c = nf_of(dt);
    size_t bytes = n * ppn_dtype_size(dt), i = 0;
    const unsigned char *s = src;
    unsigned char *d = dst;
    const ppn_u32x4 exp = {c.exp, c.exp, c.exp, c.exp}, low = {c.low, c.low, c.low, c.low};
    ppn_u32x4 a0 = {0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;
    for (; i + 64 <= bytes; i += 64) {
        ppn_u32x4 v[4];
        memcpy(v, s + i, sizeof v);
        if (d) memcpy(d + i, v, sizeof v);
        a0 |= (v[0] & exp) + low;
        a1 |= (v[1] & exp) + low;
        a2 |= (v[2] & exp) + low;
        a3 |= (v[3] & exp) + low;
    }
    ppn_u32x4 a = a0 | a1 | a2 | a3;
    uint32_t bad = a[0] | a[1] | a[2] | a[3];
    for (; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, s + i, 4);
        if (d) memcpy(d + i, &w, 4);
        bad |= (w & c.exp) + c.low;
    }
    if (i < bytes) { /* one 16-bit element left: in the low half of a word */
        uint16_t h;
        memcpy(&h, s + i, 2);
        if (d) memcpy(d + i, &h, 2);
        bad |= ((uint32_t)h & c.exp) + c.low;
    }
    return (bad & c.sign) != 0;
}

size_t ppn_first_nonfinite(const void *x, size_t n, int dt)
{
    nf_consts c = nf_of(dt);
    for (size_t i = 0; i < n; i++) {
        uint32_t w = 0;
        if (dt == PPN_DTYPE_F32) memcpy(&w, (const char *)x + 4 * i, 4);
        else memcpy(&w, (const char *)x + 2 * i, 2); /* the low half (little-endian) */
        if (((w & c.exp) + c.low) & c.sign) return i; /* a 16-bit word's empty high half never carries */
    }
    return n;
}
