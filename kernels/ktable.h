/* ktable.h - the kernel table: one id per kernel, its name (the CUDA symbol, extern "C"), the size of its
 * parameter struct, and the CPU reference the sim backend runs; the device layer receives it at open. */
#ifndef PPN_KTABLE_H
#define PPN_KTABLE_H

#include <stddef.h>
#include "core/device/gpu.h"
#include "kernels/kparams.h"

typedef enum ppn_kernel_id {
    PPN_K_EMBED,
    PPN_K_RMSNORM,
    PPN_K_MATVEC,
    PPN_K_ROPE,
    PPN_K_HEAD_RMSNORM,
    PPN_K_ATTN,
    PPN_K_ATTN_BF16,
    PPN_K_ATTN_F16,
    PPN_K_SWIGLU,
    PPN_K_ADD,
    PPN_K_ARGMAX,
    PPN_K_FILL,
    PPN_K_SET_HDR,
    PPN_K_MATMAT,
    PPN_K_GEMM,
    PPN_K_GEMM_TC_L,
    PPN_K_GEMM_TC_M,
    PPN_K_GEMM_TC_S,
    PPN_K_GEMM_TC_K,
    PPN_K_GEMM_TC_KW,
    PPN_K_GEMM_TC_KWX,
    PPN_K_GEMM_TC_KW16,
    PPN_K_GEMM_TC_H,
    PPN_K_EMBED_ROWS,
    PPN_K_RMSNORM_ROWS,
    PPN_K_HEAD_RMSNORM_ROWS,
    PPN_K_ROPE_KV_ROWS,
    PPN_K_ATTN_ROWS,
    PPN_K_ATTN_ROWS_BF16,
    PPN_K_ATTN_ROWS_F16,
    PPN_K_SWIGLU_ROWS,
    PPN_K_ARGMAX_ROWS,
    PPN_K_ROPE_KV_BATCH,
    PPN_K_ATTN_BATCH,
    PPN_K_ATTN_BATCH_BF16,
    PPN_K_ATTN_BATCH_F16,
    PPN_K_GEMM_SWIGLU,
    PPN_K_ATTN_BATCH_TC,
    PPN_K_GEMM_TC_K16,
    PPN_K_GEMM_TC_KWT,
    PPN_K_GEMM_SWIGLU_T,
    PPN_K_GEMM_TC_K16T,
    PPN_K_GEMM_TC_KX,
    PPN_K_GEMM_SWIGLU_X,
    PPN_K_GEMM_TC_W,
    PPN_K_GEMM_SWIGLU_W,
    PPN_K_COUNT
} ppn_kernel_id;

/* Each entry: the CUDA symbol "ppn_k_<name>", its params struct's size, its CPU reference (cpu_ref.h). */
extern const ppn_gpu_kernel ppn_kernels[PPN_K_COUNT];

/* The table with the embedded image (no image in a build without nvcc), for ppn_gpu_open. */
const ppn_gpu_kernels *ppn_kernel_set(void);

#endif
