/* ktable.h - the kernel table: one id per kernel, its name (the CUDA symbol, extern "C"), the size of its
 * parameter struct, and the CPU reference the sim backend runs. */
#ifndef PPN_KTABLE_H
#define PPN_KTABLE_H

#include <stddef.h>
#include "kernels/kparams.h"

typedef enum ppn_kernel_id {
    PPN_K_EMBED,
    PPN_K_RMSNORM,
    PPN_K_MATVEC,
    PPN_K_ROPE,
    PPN_K_HEAD_RMSNORM,
    PPN_K_KV_STORE,
    PPN_K_ATTN,
    PPN_K_ATTN_BF16,
    PPN_K_ATTN_F16,
    PPN_K_SWIGLU,
    PPN_K_ADD,
    PPN_K_ARGMAX,
    PPN_K_FILL,
    PPN_K_SET_HDR,
    PPN_K_MATMAT,
    PPN_K_COUNT
} ppn_kernel_id;

typedef struct ppn_kernel_desc {
    const char *name;                  /* CUDA symbol: "ppn_k_<name>" */
    size_t params_size;
    void (*cpu)(const void *params);   /* CPU reference: computes the whole op */
} ppn_kernel_desc;

extern const ppn_kernel_desc ppn_kernels[PPN_K_COUNT];

/* bf16 / f16 <-> f32 on the host (round to nearest even), shared by loaders and the CPU reference. */
float ppn_bf16_to_f32(uint16_t h);
uint16_t ppn_f32_to_bf16(float f);
float ppn_f16_to_f32(uint16_t h);
uint16_t ppn_f32_to_f16(float f);
size_t ppn_dtype_size(int dt);

#endif
