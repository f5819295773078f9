// ppn_kernels.cu - the CUDA kernels of the kernel table (kernels/ktable.h), built into the embedded fatbin.
//
// Every kernel is extern "C" __global__ void ppn_k_<name>(const ppn_kp_<name> p): one params struct by value,
// the symbol the table names. Math matches the CPU reference (cpu_ref.c) in f32; where the CPU reference
// sums in double, these sum in f32 with fmaf.
//
// Determinism: no atomics; every reduction has a fixed shape - each thread sums a fixed strided subset in
// index order, warps combine with an xor butterfly (commutative pairs, so every lane ends with the same
// bits), then the warp totals in warp order. The geometry is chosen by ops.c from the sizes alone, so the
// same inputs give the same bits on every run. The matvec's 16-byte loads are taken only when aligned, but
// each lane accumulates the same elements in the same order on either path, so alignment never shows in
// the bits.
//
// Geometry contract with ops.c: blockDim.x is a multiple of 32, at most 1024; attention uses at most
// PPN_ATTN_WARPS warps per block and head_dim <= 32 * PPN_ATTN_MAXJ.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kparams.h"

#define PPN_FULL_MASK 0xffffffffu
#define PPN_ATTN_WARPS 16
#define PPN_ATTN_MAXJ 8

// ---------------------------------------------------------------------------------------------------------
// helpers

__device__ __forceinline__ float ppn_bf16_bits(unsigned short u)
{
    return __bfloat162float(__ushort_as_bfloat16(u));
}

__device__ __forceinline__ float ppn_f16_bits(unsigned short u) { return __half2float(__ushort_as_half(u)); }

// Weight element i of dtype wdt, widened to f32.
__device__ __forceinline__ float ppn_wload(uint64_t w, int wdt, size_t i)
{
    if (wdt == PPN_DT_BF16) return ppn_bf16_bits(((const unsigned short *)w)[i]);
    if (wdt == PPN_DT_F16) return ppn_f16_bits(((const unsigned short *)w)[i]);
    return ((const float *)w)[i];
}

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

// ---------------------------------------------------------------------------------------------------------
// embed: grid covers dim

extern "C" __global__ void ppn_k_embed(const ppn_kp_embed p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.dim) return;
    int32_t tok = ppn_hdr(p.hdr)->token;
    float *out = (float *)p.out;
    if (tok < 0 || tok >= p.vocab) { // never read outside the table; make the fault visible
        out[i] = __int_as_float(0x7fc00000);
        return;
    }
    out[i] = ppn_wload(p.table, p.wdt, (size_t)tok * (size_t)p.dim + (size_t)i);
}

// ---------------------------------------------------------------------------------------------------------
// rmsnorm: one block per vector (x may alias out: every read of the sum happens before the barrier)

__device__ void ppn_rmsnorm_block(float *out, const float *x, uint64_t w, int wdt, int n, float eps)
{
    __shared__ float sh[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    float var = ppn_block_sum(ss, sh) / (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = (x[i] * r) * ppn_wload(w, wdt, (size_t)i);
}

extern "C" __global__ void ppn_k_rmsnorm(const ppn_kp_rmsnorm p)
{
    ppn_rmsnorm_block((float *)p.out, (const float *)p.in, p.w, p.wdt, p.n, p.eps);
}

// grid: one block per head
extern "C" __global__ void ppn_k_head_rmsnorm(const ppn_kp_head_rmsnorm p)
{
    float *xh = (float *)p.x + (size_t)blockIdx.x * (size_t)p.head_dim;
    ppn_rmsnorm_block(xh, xh, p.w, p.wdt, p.head_dim, p.eps);
}

// ---------------------------------------------------------------------------------------------------------
// matvec: one warp per row. The row is cut into chunks of V elements (16 bytes of weights); lane l owns
// chunks l, l+32, ... and accumulates their elements in index order with fmaf.

template <int DT> struct ppn_mv;

template <> struct ppn_mv<PPN_DT_F32> {
    static constexpr int V = 4;
    static __device__ __forceinline__ float at(const char *row, int c) { return ((const float *)row)[c]; }
    static __device__ __forceinline__ void chunk(const char *row, int j, float *wv)
    {
        float4 a = __ldg((const float4 *)row + j);
        wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w;
    }
};

template <> struct ppn_mv<PPN_DT_BF16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float at(const char *row, int c)
    {
        return ppn_bf16_bits(((const unsigned short *)row)[c]);
    }
    static __device__ __forceinline__ void chunk(const char *row, int j, float *wv)
    {
        uint4 a = __ldg((const uint4 *)row + j);
        unsigned u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) { // little endian: the low half is the lower index
            wv[2 * k] = ppn_bf16_bits((unsigned short)(u[k] & 0xffffu));
            wv[2 * k + 1] = ppn_bf16_bits((unsigned short)(u[k] >> 16));
        }
    }
};

template <> struct ppn_mv<PPN_DT_F16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float at(const char *row, int c)
    {
        return ppn_f16_bits(((const unsigned short *)row)[c]);
    }
    static __device__ __forceinline__ void chunk(const char *row, int j, float *wv)
    {
        uint4 a = __ldg((const uint4 *)row + j);
        unsigned u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[2 * k] = ppn_f16_bits((unsigned short)(u[k] & 0xffffu));
            wv[2 * k + 1] = ppn_f16_bits((unsigned short)(u[k] >> 16));
        }
    }
};

// This lane's partial dot product of row r with x.
template <int DT> __device__ float ppn_matvec_lane(const ppn_kp_matvec &p, int r, int lane)
{
    typedef ppn_mv<DT> T;
    constexpr int V = T::V;
    constexpr size_t es = DT == PPN_DT_F32 ? 4 : 2;
    const char *row = (const char *)p.w + (size_t)r * (size_t)p.cols * es;
    const float *x = (const float *)p.x;
    int nfull = p.cols / V;
    float acc = 0.0f;
    if (((uintptr_t)row & 15u) == 0 && ((uintptr_t)x & 15u) == 0) {
#pragma unroll 4
        for (int j = lane; j < nfull; j += 32) {
            float wv[V], xv[V];
            T::chunk(row, j, wv);
#pragma unroll
            for (int k = 0; k < V; k += 4) {
                float4 b = __ldg((const float4 *)(x + (size_t)j * V + k));
                xv[k] = b.x, xv[k + 1] = b.y, xv[k + 2] = b.z, xv[k + 3] = b.w;
            }
#pragma unroll
            for (int k = 0; k < V; k++) acc = fmaf(wv[k], xv[k], acc);
        }
    } else {
        for (int j = lane; j < nfull; j += 32) {
#pragma unroll
            for (int k = 0; k < V; k++) acc = fmaf(T::at(row, j * V + k), x[j * V + k], acc);
        }
    }
    if (lane == nfull % 32) // the partial last chunk belongs to the lane that would own chunk nfull
        for (int c = nfull * V; c < p.cols; c++) acc = fmaf(T::at(row, c), x[c], acc);
    return acc;
}

extern "C" __global__ void ppn_k_matvec(const ppn_kp_matvec p)
{
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= p.rows) return; // whole warp leaves together; no block barrier follows
    float acc;
    if (p.wdt == PPN_DT_BF16) acc = ppn_matvec_lane<PPN_DT_BF16>(p, r, lane);
    else if (p.wdt == PPN_DT_F16) acc = ppn_matvec_lane<PPN_DT_F16>(p, r, lane);
    else acc = ppn_matvec_lane<PPN_DT_F32>(p, r, lane);
    acc = ppn_warp_sum(acc);
    if (lane != 0) return;
    // As HF: (x W^T + bias), then the residual added; res may alias out (read before the write).
    if (p.bias) acc = __fadd_rn(acc, ppn_wload(p.bias, p.wdt, (size_t)r));
    if (p.res) acc = __fadd_rn(((const float *)p.res)[r], acc);
    ((float *)p.out)[r] = acc;
}

// ---------------------------------------------------------------------------------------------------------
// rope: one block per head; thread i rotates pair i. Explicit _rn ops keep each product rounded as HF does.

extern "C" __global__ void ppn_k_rope(const ppn_kp_rope p)
{
    float *xh = (float *)p.x + (size_t)blockIdx.x * (size_t)p.head_dim;
    const float *inv = (const float *)p.inv_freq;
    int32_t pos = ppn_hdr(p.hdr)->pos;
    int half = p.head_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(__fmul_rn((float)pos, inv[i]), &s, &c);
        int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + half;
        float x0 = xh[a], x1 = xh[b];
        xh[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        xh[b] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    }
}

// ---------------------------------------------------------------------------------------------------------
// kv_store: one block per kv head; a position outside the cache writes nothing.

extern "C" __global__ void ppn_k_kv_store(const ppn_kp_kv_store p)
{
    int32_t pos = ppn_hdr(p.hdr)->pos;
    if (pos < 0 || pos >= p.ctx) return;
    size_t hd = (size_t)p.head_dim, h = blockIdx.x;
    size_t dst = (h * (size_t)p.ctx + (size_t)pos) * hd, src = h * hd;
    for (int i = threadIdx.x; i < p.head_dim; i += blockDim.x) {
        ((float *)p.kc)[dst + i] = ((const float *)p.k)[src + i];
        ((float *)p.vc)[dst + i] = ((const float *)p.v)[src + i];
    }
}

// ---------------------------------------------------------------------------------------------------------
// attn: one block per query head. Warp w takes positions w, w+nw, ... with an online softmax (running max,
// running sum, running output with lane l holding dims l, l+32, ...); the warps' partial results are then
// merged in warp order by one pass per output dim.

struct ppn_attn_part {
    float m, l;                       // running max score, running sum of exp(s - m)
    float acc[PPN_ATTN_MAXJ];         // running sum of exp(s - m) * v[d], d = lane + 32 j
};

__device__ void ppn_attn_warp(const ppn_kp_attn &p, const float *q, const float *kc, const float *vc,
                              int pos, ppn_attn_part *pt)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, hd = p.head_dim;
    float qr[PPN_ATTN_MAXJ];
#pragma unroll
    for (int j = 0; j < PPN_ATTN_MAXJ; j++) {
        int d = lane + 32 * j;
        qr[j] = d < hd ? q[d] : 0.0f;
        pt->acc[j] = 0.0f;
    }
    pt->m = -INFINITY, pt->l = 0.0f;
    for (int t = warp; t <= pos; t += nw) {
        const float *kt = kc + (size_t)t * hd, *vt = vc + (size_t)t * hd;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < PPN_ATTN_MAXJ; j++)
            if (lane + 32 * j < hd) dot = fmaf(qr[j], kt[lane + 32 * j], dot);
        float s = ppn_warp_sum(dot) * p.scale;
        float m_new = fmaxf(pt->m, s);
        float corr = pt->m == -INFINITY ? 0.0f : expf(pt->m - m_new);
        float e = expf(s - m_new);
        pt->l = fmaf(pt->l, corr, e);
#pragma unroll
        for (int j = 0; j < PPN_ATTN_MAXJ; j++)
            if (lane + 32 * j < hd) pt->acc[j] = fmaf(e, vt[lane + 32 * j], pt->acc[j] * corr);
        pt->m = m_new;
    }
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS) ppn_k_attn(const ppn_kp_attn p)
{
    __shared__ float s_acc[PPN_ATTN_WARPS][32 * PPN_ATTN_MAXJ];
    __shared__ float s_m[PPN_ATTN_WARPS], s_l[PPN_ATTN_WARPS];
    int h = blockIdx.x, hd = p.head_dim, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nw = blockDim.x >> 5;
    float *out = (float *)p.out + (size_t)h * hd;
    int32_t pos = ppn_hdr(p.hdr)->pos;
    if (pos < 0 || pos >= p.ctx) { // uniform over the block: no barrier is skipped by some threads only
        for (int d = threadIdx.x; d < hd; d += blockDim.x) out[d] = __int_as_float(0x7fc00000);
        return;
    }
    size_t kv_off = (size_t)(h / (p.n_heads / p.n_kv)) * (size_t)p.ctx * hd;
    ppn_attn_part pt;
    ppn_attn_warp(p, (const float *)p.q + (size_t)h * hd, (const float *)p.kc + kv_off,
                  (const float *)p.vc + kv_off, pos, &pt);
#pragma unroll
    for (int j = 0; j < PPN_ATTN_MAXJ; j++) s_acc[warp][lane + 32 * j] = pt.acc[j];
    if (lane == 0) s_m[warp] = pt.m, s_l[warp] = pt.l;
    __syncthreads();
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float mx = -INFINITY;
        for (int w = 0; w < nw; w++) mx = fmaxf(mx, s_m[w]);
        float num = 0.0f, den = 0.0f;
        for (int w = 0; w < nw; w++) {
            if (s_m[w] == -INFINITY) continue; // a warp that saw no position
            float f = expf(s_m[w] - mx);
            num = fmaf(s_acc[w][d], f, num);
            den = fmaf(s_l[w], f, den);
        }
        out[d] = num / den;
    }
}

// ---------------------------------------------------------------------------------------------------------
// elementwise: the grid covers n, one element per thread

extern "C" __global__ void ppn_k_swiglu(const ppn_kp_swiglu p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    float g = ((const float *)p.gate)[i];
    float s = g / (1.0f + expf(-g));
    ((float *)p.out)[i] = s * ((const float *)p.up)[i];
}

extern "C" __global__ void ppn_k_add(const ppn_kp_add p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    ((float *)p.out)[i] = ((const float *)p.a)[i] + ((const float *)p.b)[i];
}

extern "C" __global__ void ppn_k_set_hdr(const ppn_kp_set_hdr p)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) *(ppn_step_hdr *)p.hdr = p.v;
}

extern "C" __global__ void ppn_k_fill(const ppn_kp_fill p)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    ((uint32_t *)p.out)[i] = p.value;
}

// ---------------------------------------------------------------------------------------------------------
// argmax: one block. (value, index) pairs are totally ordered (larger value, then lower index; NaN never
// taken), so the winner does not depend on the reduction shape; -1 when every value is NaN.

__device__ __forceinline__ void ppn_argmax_take(float &bv, int &bi, float v, int i)
{
    if (i < 0) return;
    if (bi < 0 || v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

__device__ __forceinline__ void ppn_argmax_warp(float &bv, int &bi)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        float v = __shfl_xor_sync(PPN_FULL_MASK, bv, m);
        int i = __shfl_xor_sync(PPN_FULL_MASK, bi, m);
        ppn_argmax_take(bv, bi, v, i);
    }
}

extern "C" __global__ void ppn_k_argmax(const ppn_kp_argmax p)
{
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    const float *x = (const float *)p.x;
    float bv = 0.0f;
    int bi = -1;
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) {
        float v = x[i];
        if (!isnan(v)) ppn_argmax_take(bv, bi, v, i);
    }
    ppn_argmax_warp(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_v[warp] = bv, s_i[warp] = bi;
    __syncthreads();
    if (warp != 0) return;
    bv = lane < (int)(blockDim.x >> 5) ? s_v[lane] : 0.0f;
    bi = lane < (int)(blockDim.x >> 5) ? s_i[lane] : -1;
    ppn_argmax_warp(bv, bi);
    if (lane == 0) *(int32_t *)p.out = bi;
}
