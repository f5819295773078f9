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

#endif
