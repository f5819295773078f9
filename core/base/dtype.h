/* dtype.h - element types on the host (ppn_dtype, from ppn.h): sizes and bf16 / f16 <-> f32 conversions. */
#ifndef PPN_DTYPE_H
#define PPN_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include "ppn.h"

/* Round to nearest even; a NaN stays a (quiet) NaN; f16 keeps subnormals and overflows to inf. */
float ppn_bf16_to_f32(uint16_t h);
uint16_t ppn_f32_to_bf16(float f);
float ppn_f16_to_f32(uint16_t h);
uint16_t ppn_f32_to_f16(float f);
/* Bytes of one element of dt (a PPN_DTYPE_* other than DEFAULT); 0 for anything else. */
size_t ppn_dtype_size(int dt);
/* dst = src, n elements of dt (f32, bf16 or f16); returns 1 when any of them is NaN or Inf. One pass, vectorised:
 * about the cost of the memcpy it replaces. dst may be NULL (only check src). */
int ppn_copy_nonfinite(void *dst, const void *src, size_t n, int dt);
/* The index of the first NaN or Inf among x[0..n) of dt, or n. */
size_t ppn_first_nonfinite(const void *x, size_t n, int dt);

#endif
