// kdev.cuh - device helpers every kernel file shares (ppn_kernels.cu, gemm.cu, rows.cu): one definition each,
// so the decode kernels and the prefill kernels widen weights, round to a cache dtype, reduce a warp, order
// themselves under programmatic dependent launch and rotate a rotary pair with the same expressions, and a
// prefill row's bits are a decode step's by construction.
#ifndef PPN_KDEV_CUH
#define PPN_KDEV_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kernels/kparams.h"

#define PPN_FULL_MASK 0xffffffffu


__device__ __forceinline__ float ppn_bf16_bits(unsigned short u)
{
    return __bfloat162float(__ushort_as_bfloat16(u));
}

__device__ __forceinline__ float ppn_f16_bits(unsigned short u) { return __half2float(__ushort_as_half(u)); }

// Weight element i of dtype wdt, widened to f32.
__device__ __forceinline__ float ppn_wload(uint64_t w, int wdt, size_t i)
{
    if (wdt == PPN_DTYPE_BF16) return ppn_bf16_bits(((const unsigned short *)w)[i]);
    if (wdt == PPN_DTYPE_F16) return ppn_f16_bits(((const unsigned short *)w)[i]);
    return ((const float *)w)[i];
}

// v rounded to dtype kd (nearest even) and widened back; f32: v itself. KV cache elements are stored so
// (kparams.h, KV caches), and the GEMM rounds x so before its products.
__device__ __forceinline__ float ppn_dt_round(int kd, float v)
{
    if (kd == PPN_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(v));
    if (kd == PPN_DTYPE_F16) return __half2float(__float2half_rn(v));
    return v;
}

__device__ __forceinline__ void ppn_kv_put(uint64_t c, int kd, size_t i, float v)
{
    if (kd == PPN_DTYPE_BF16) ((__nv_bfloat16 *)c)[i] = __float2bfloat16_rn(v);
    else if (kd == PPN_DTYPE_F16) ((__half *)c)[i] = __float2half_rn(v);
    else ((float *)c)[i] = v;
}

// silu(g) = g / (1 + e^-g), as the CPU reference computes it (the swiglu kernels).
__device__ __forceinline__ float ppn_swish(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ float ppn_warp_sum(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(PPN_FULL_MASK, v, m);
    return v;
}

// Sum over the block; every thread gets the same bits. sh: 32 floats of shared memory.
__device__ float ppn_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ppn_warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    t = ppn_warp_sum(t);
    __syncthreads(); // sh may be reused after return
    return t;
}

__device__ __forceinline__ const ppn_step_hdr *ppn_hdr(uint64_t p) { return (const ppn_step_hdr *)p; }

// Programmatic dependent launch (sm_90+; the cuda backend sets the launch attribute, PPN_PDL). A kernel may
// then be running while its predecessor on the stream drains, so every kernel
//   - lets its own successor launch as early as possible (launch_dependents, first thing: the successor's
//     blocks are scheduled only once every block of this grid has run this, so they never take the place of
//     a block of ours that has yet to start), and
//   - waits for its predecessors to complete, their writes visible (wait), before it reads or writes any
//     memory but immutable weights: PPN_PDL_ENTER at the top of every kernel; the matvec issues its first
//     weight loads before waiting (the whole point). Without the attribute both are no-ops.
__device__ __forceinline__ void ppn_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void ppn_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#define PPN_PDL_ENTER() (ppn_pdl_trigger(), ppn_pdl_wait())

__device__ __forceinline__ float ppn_warp_max(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(PPN_FULL_MASK, v, m));
    return v;
}

// The rotary's angle pos * inv, and one element of a rotated pair (a, b): a' = a c - b s (second = false,
// self = a), b' = b c + a s (second = true, self = b), each product rounded as HF rounds it. The rope kernel
// and the fused rotary in attention both take these, so they give the same bits.
__device__ __forceinline__ void ppn_rope_angle(int32_t pos, float inv, float *s, float *c)
{
    sincosf(__fmul_rn((float)pos, inv), s, c);
}

__device__ __forceinline__ float ppn_rope_rot(float self, float other, float c, float s, bool second)
{
    float xc = __fmul_rn(self, c), os = __fmul_rn(other, s);
    return second ? __fadd_rn(xc, os) : __fsub_rn(xc, os);
}

#endif
