/* trand.h - deterministic random inputs for the tests, and the values of the float patterns they hold, decoded
 * here from the formats' definitions (independently of core/base/dtype.c, which the tests check). */
#ifndef PPN_TRAND_H
#define PPN_TRAND_H

#include <stddef.h>
#include <stdint.h>

/* The generator (xorshift64): every test binary starts from the same seed, so its inputs repeat run to run. */
void tu_rand_seed(uint64_t seed);
uint32_t tu_rand32(void);
/* Uniform in [lo, hi) on a 2^-24 grid. */
float tu_randf(float lo, float hi);
/* n floats uniform in [lo, hi), malloc'd (the test fails when out of memory). */
float *tu_frand(size_t n, float lo, float hi);
/* n weights of dtype dt (PPN_DTYPE_F32/BF16/F16) with |value| < 1, malloc'd: f32 uniform in [-1, 1), bf16 the top
 * half of such an f32, f16 random patterns with |value| in [2^-7, 1) (no subnormals). vals (may be NULL)
 * receives their values. */
void *tu_wrand(int dt, size_t n, double *vals);
/* Element i of an array of dtype dt (at any alignment), by tu_bf16_value / tu_f16_value. */
double tu_wval(const void *w, int dt, size_t i);

/* The value of a bf16 / f16 bit pattern by its definition. */
double tu_bf16_value(uint16_t h);
double tu_f16_value(uint16_t h);
/* A float's bits and back. */
uint32_t tu_f32_bits(float f);
float tu_bits_f32(uint32_t u);

#endif
