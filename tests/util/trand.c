/* trand.c - deterministic random inputs and float decoding for the tests (see trand.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ppn.h"
#include "tests/util/trand.h"

#define TU_SEED 0x9e3779b97f4a7c15ull

static uint64_t rng_state = TU_SEED;

void tu_rand_seed(uint64_t seed) { rng_state = seed ? seed : TU_SEED; }

uint32_t tu_rand32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

float tu_randf(float lo, float hi) { return lo + (hi - lo) * (float)(tu_rand32() & 0xffffff) / 16777216.0f; }

float *tu_frand(size_t n, float lo, float hi)
{
    float *p = malloc(n ? n * sizeof *p : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = tu_randf(lo, hi);
    return p;
}

/* One weight of dtype dt stored at p[i]. */
static void wrand_one(int dt, void *p, size_t i)
{
    if (dt == PPN_DTYPE_F32) {
        ((float *)p)[i] = tu_randf(-1, 1);
    } else if (dt == PPN_DTYPE_BF16) {
        ((uint16_t *)p)[i] = (uint16_t)(tu_f32_bits(tu_randf(-1, 1)) >> 16);
    } else { /* exponent 8..14: |v| in [2^-7, 1) */
        uint32_t s = tu_rand32() & 1, e = 8 + tu_rand32() % 7, m = tu_rand32() & 1023;
        ((uint16_t *)p)[i] = (uint16_t)(s << 15 | e << 10 | m);
    }
}

void *tu_wrand(int dt, size_t n, double *vals)
{
    void *p = malloc(n ? n * (dt == PPN_DTYPE_F32 ? 4 : 2) : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) {
        wrand_one(dt, p, i);
        if (vals) vals[i] = tu_wval(p, dt, i);
    }
    return p;
}

/* memcpy: w may be any address (a tensor inside a mapped file). */
double tu_wval(const void *w, int dt, size_t i)
{
    const unsigned char *b = w;
    if (dt == PPN_DTYPE_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, b + 2 * i, 2);
    return dt == PPN_DTYPE_BF16 ? tu_bf16_value(h) : tu_f16_value(h);
}

double tu_bf16_value(uint16_t h) { return tu_bits_f32((uint32_t)h << 16); }

double tu_f16_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

uint32_t tu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

float tu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
