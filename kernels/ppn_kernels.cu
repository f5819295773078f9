// ppn_kernels.cu - the CUDA kernels of the kernel table (kernels/ktable.h), built into the embedded fatbin.
//
// Every kernel is extern "C" __global__ void ppn_k_<name>(const ppn_kp_<name> p): one params struct by value,
// the symbol the table names. Math matches the CPU reference (cpu_ref.c) in f32; where the CPU reference
// sums in double, these sum in f32 with fmaf.
//
// Determinism: no atomics in any reduction (attention counts its blocks with one, but merges in a fixed
// order); every reduction has a fixed shape - each thread sums a fixed strided subset in
// index order, warps combine with an xor butterfly (commutative pairs, so every lane ends with the same
// bits), then the warp totals in warp order. The geometry is chosen by ops.c from the sizes alone, so the
// same inputs give the same bits on every run. The matvec's 16-byte loads are taken only when aligned, but
// each lane accumulates the same elements in the same order on either path, so alignment never shows in
// the bits.
//
// Geometry contract with ops.c: blockDim.x is a multiple of 32, at most 1024; attention uses at most
// PPN_ATTN_WARPS warps per block, head_dim <= 32 * PPN_ATTN_MAXJ and gridDim.y = n_split <= PPN_ATTN_MAX_SPLIT.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kparams.h"

#define PPN_FULL_MASK 0xffffffffu
#define PPN_ATTN_WARPS 16
#define PPN_ATTN_MAXJ 8
#define PPN_ATTN_MAX_SPLIT 64

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
// matvec: a group of G warps per row, blockDim.x / (32 G) rows per block. G = ppn_mv_split(cols, dtype): the
// fewest warps (a power of 2, at most 8) that have a whole row in flight at once. The row is cut into chunks
// of V elements (16 bytes of weights); thread t of the group owns chunks t, t + 32G, ... and accumulates
// their elements in index order with fmaf; the group's warps then combine in warp order. So a row's bits
// depend on its weights, x, cols and the dtype alone - not on the block size, the grid, how many rows the
// launch has, nor on where x is read from (a row of a stacked [wq; wk; wv] is reduced exactly as on its own).
//
// Bandwidth at batch 1: a thread issues its PPN_MV_U 16-byte weight loads (streamed past L1) before it uses
// the first. x is staged in shared memory once per block when the launch gives it at least cols * 4 bytes of
// dynamic shared memory (ops.c does while that and s_part fit in the default 48 KB), else read through the
// read-only cache. A block loops over rows (striding by the grid), so a grid of one resident wave streams.
//
// Geometry contract with ops.c: blockDim.x a multiple of 256 (= 32 x the largest G), at most 1024; any
// grid.x; dynamic shared memory 0 or >= cols * 4 bytes.

#define PPN_MV_U 8
#define PPN_MV_MAX_SPLIT 8

// G for rows of cols elements of es bytes (ops.c mirrors this only to size its grid).
__device__ __forceinline__ int ppn_mv_split(int cols, int es)
{
    long long chunks = ((long long)cols * es + 15) / 16;
    int g = 1;
    while (g < PPN_MV_MAX_SPLIT && chunks > 32LL * PPN_MV_U * g) g *= 2;
    return g;
}

// A 16-byte weight load that is used once: read-only, not kept in L1 (x stays there). Predicated in the
// instruction itself (no branch around it, so a batch's loads issue back to back); zeros when off, and p is
// not touched then.
__device__ __forceinline__ uint4 ppn_ld_stream_if(const uint4 *p, bool on)
{
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    asm("{\n\t.reg .pred q;\n\tsetp.ne.b32 q, %5, 0;\n\t"
        "@q ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
        : "l"(p), "r"((int)on));
    return v;
}

__device__ __forceinline__ unsigned ppn_dyn_smem_bytes(void)
{
    unsigned n;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
    return n;
}

// The low half of a 32-bit word holds the lower index (little endian).
__device__ __forceinline__ float ppn_bf16_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float ppn_bf16_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float ppn_f16_lo(unsigned u) { return ppn_f16_bits((unsigned short)(u & 0xffffu)); }
__device__ __forceinline__ float ppn_f16_hi(unsigned u) { return ppn_f16_bits((unsigned short)(u >> 16)); }

// x[k .. k+3] of a chunk: from shared memory (a plain load) or global memory (read-only cache).
template <bool XS> __device__ __forceinline__ float4 ppn_mv_x4(const float *x, size_t k);
template <> __device__ __forceinline__ float4 ppn_mv_x4<true>(const float *x, size_t k)
{
    return *(const float4 *)(x + k);
}
template <> __device__ __forceinline__ float4 ppn_mv_x4<false>(const float *x, size_t k)
{
    return __ldg((const float4 *)(x + k));
}

__device__ __forceinline__ float ppn_fma4(float4 w, float4 x, float acc)
{
    acc = fmaf(w.x, x.x, acc);
    acc = fmaf(w.y, x.y, acc);
    acc = fmaf(w.z, x.z, acc);
    return fmaf(w.w, x.w, acc);
}

template <int DT> struct ppn_mv;

template <> struct ppn_mv<PPN_DT_F32> {
    static constexpr int V = 4;
    static __device__ __forceinline__ float at(const char *row, int c) { return ((const float *)row)[c]; }
    // acc += the chunk's 4 products in index order; x points at the chunk's first element.
    template <bool XS> static __device__ __forceinline__ float fma_chunk(uint4 w, const float *x, int, float acc)
    {
        float4 wf = make_float4(__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z),
                                __uint_as_float(w.w));
        return ppn_fma4(wf, ppn_mv_x4<XS>(x, 0), acc);
    }
};

// 8 elements of 2 bytes: 32 bytes of x per chunk. sw (0 or 1) picks which half of it a lane reads first:
// lanes 4-7 of each 8 start with the upper half, so a quarter warp's 16-byte reads of shared memory cover
// all 32 banks once instead of half of them twice. The products are still taken in index order.
template <int DT> struct ppn_mv16 {
    static constexpr int V = 8;
    static __device__ __forceinline__ float at(const char *row, int c)
    {
        unsigned short u = ((const unsigned short *)row)[c];
        return DT == PPN_DT_BF16 ? ppn_bf16_bits(u) : ppn_f16_bits(u);
    }
    static __device__ __forceinline__ float lo(unsigned u)
    {
        return DT == PPN_DT_BF16 ? ppn_bf16_lo(u) : ppn_f16_lo(u);
    }
    static __device__ __forceinline__ float hi(unsigned u)
    {
        return DT == PPN_DT_BF16 ? ppn_bf16_hi(u) : ppn_f16_hi(u);
    }
    template <bool XS> static __device__ __forceinline__ float fma_chunk(uint4 w, const float *x, int sw, float acc)
    {
        float4 a = ppn_mv_x4<XS>(x, (size_t)(4 * sw)), b = ppn_mv_x4<XS>(x, (size_t)(4 - 4 * sw));
        float4 x0 = sw ? b : a, x1 = sw ? a : b;
        acc = ppn_fma4(make_float4(lo(w.x), hi(w.x), lo(w.y), hi(w.y)), x0, acc);
        return ppn_fma4(make_float4(lo(w.z), hi(w.z), lo(w.w), hi(w.w)), x1, acc);
    }
};
template <> struct ppn_mv<PPN_DT_BF16> : ppn_mv16<PPN_DT_BF16> {};
template <> struct ppn_mv<PPN_DT_F16> : ppn_mv16<PPN_DT_F16> {};

// Issue the loads of this thread's chunks j0, j0 + nt, ... (PPN_MV_U of them, those below nfull).
__device__ __forceinline__ void ppn_mv_issue(uint4 (&wv)[PPN_MV_U], const uint4 *row, int j0, int nt, int nfull)
{
#pragma unroll
    for (int u = 0; u < PPN_MV_U; u++) wv[u] = ppn_ld_stream_if(row + j0 + u * nt, j0 + u * nt < nfull);
}

// This thread's partial dot product over its whole chunks, 16-byte path; wv holds the first batch, issued
// by the caller (before x was staged). x is 16-byte aligned. A batch whose chunks all exist takes the
// unchecked loop; the last one may be partial.
template <int DT, bool XS>
__device__ __forceinline__ float ppn_mv_vec(uint4 (&wv)[PPN_MV_U], const uint4 *row, const float *x, int t,
                                            int nt, int nfull)
{
    typedef ppn_mv<DT> T;
    const int sw = XS ? (t >> 2) & 1 : 0; // chunk j = t (mod 32): the lane's place in its quarter warp
    float acc = 0.0f;
    for (int j0 = t; j0 < nfull;) {
        if (j0 + (PPN_MV_U - 1) * nt < nfull) {
#pragma unroll
            for (int u = 0; u < PPN_MV_U; u++)
                acc = T::template fma_chunk<XS>(wv[u], x + (size_t)(j0 + u * nt) * T::V, sw, acc);
        } else {
#pragma unroll
            for (int u = 0; u < PPN_MV_U; u++) {
                int j = j0 + u * nt;
                if (j < nfull) acc = T::template fma_chunk<XS>(wv[u], x + (size_t)j * T::V, sw, acc);
            }
        }
        j0 += PPN_MV_U * nt;
        if (j0 < nfull) ppn_mv_issue(wv, row, j0, nt, nfull);
    }
    return acc;
}

// The same sum element by element, for rows or x not 16-byte aligned: the same elements in the same order.
template <int DT> __device__ float ppn_mv_scalar(const char *row, const float *x, int t, int nt, int nfull)
{
    typedef ppn_mv<DT> T;
    float acc = 0.0f;
    for (int j = t; j < nfull; j += nt)
#pragma unroll
        for (int k = 0; k < T::V; k++) acc = fmaf(T::at(row, j * T::V + k), x[j * T::V + k], acc);
    return acc;
}

// Copy x into shared memory, every thread of the block taking part.
__device__ __forceinline__ void ppn_mv_stage(float *xs, const float *x, int cols)
{
    int nth = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
    int c0 = 0;
    if (((uintptr_t)x & 15u) == 0) {
        c0 = cols & ~3;
        for (int i = tid; i < cols / 4; i += nth) ((float4 *)xs)[i] = __ldg((const float4 *)x + i);
    }
    for (int c = c0 + tid; c < cols; c += nth) xs[c] = x[c];
}

__device__ __forceinline__ bool ppn_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// xin (kparams.h, PPN_MV_X_*) into shared memory, every thread of the block taking part; the caller's barrier
// publishes it. The norm sums x^2 over the staged copy with the rmsnorm kernel's shape (a strided fmaf per
// thread, then the block sum) and each thread scales the elements it summed; SwiGLU is the swiglu kernel's
// expression. sh: 32 floats of shared memory (ppn_block_sum leaves them free again).
__device__ void ppn_mv_stage_in(const ppn_kp_matvec &p, float *xs, float *sh)
{
    const float *x = (const float *)p.x;
    const int nth = blockDim.x, tid = threadIdx.x, cols = p.cols;
    if (p.xmode == PPN_MV_X_SWIGLU) {
        for (int c = tid; c < cols; c += nth) {
            float g = x[c];
            xs[c] = (g / (1.0f + expf(-g))) * x[cols + c];
        }
        return;
    }
    ppn_mv_stage(xs, x, cols);
    if (p.xmode != PPN_MV_X_RMSNORM) return;
    __syncthreads(); // the float4 copy and the strided sum own different elements per thread
    float ss = 0.0f;
    for (int c = tid; c < cols; c += nth) ss = fmaf(xs[c], xs[c], ss);
    float var = ppn_block_sum(ss, sh) / (float)cols;
    float r = 1.0f / sqrtf(var + p.eps);
    for (int c = tid; c < cols; c += nth) xs[c] = (xs[c] * r) * ppn_wload(p.nw, p.wdt, (size_t)c);
}

// Every row r = blockIdx.x * rows_per_block + group (+ k * gridDim.x * rows_per_block): the loop count is the
// same for the whole block, so its barriers are reached by every thread. A row's first batch of weights is
// issued before the previous row's reduction and store (and before x is staged), so a thread has its next
// loads in flight while it finishes the last row. Not inlined, and G a constant: one function per dtype and
// G keeps the compiler from merging the paths into one with the registers of all (104 against 64).
template <int DT, int G>
__device__ __noinline__ void ppn_mv_rows(const ppn_kp_matvec p, float *xs, float (*part)[32])
{
    typedef ppn_mv<DT> T;
    constexpr int V = T::V, g = G, nt = 32 * G;
    constexpr size_t es = DT == PPN_DT_F32 ? 4 : 2;
    const int nfull = p.cols / V;
    if (blockDim.x % nt) __trap(); // ops.c broke the contract: no result rather than other bits
    const int t = threadIdx.x % nt, grp = threadIdx.x / nt, rpb = blockDim.x / nt;
    const int step = gridDim.x * rpb;
    const bool staged = (unsigned)p.cols <= ppn_dyn_smem_bytes() / 4u;
    if (p.xmode != PPN_MV_X_PLAIN && !staged) __trap(); // a fused input exists only in shared memory
    const float *xg = (const float *)p.x;
    const bool xal = staged || ppn_al16(xg); // x as the 16-byte path reads it
    const size_t pitch = (size_t)p.cols * es;
    uint4 wv[PPN_MV_U];
    int r = blockIdx.x * rpb + grp;
    const char *row = (const char *)p.w + (size_t)r * pitch;
    if (r < p.rows && xal && ppn_al16(row)) ppn_mv_issue(wv, (const uint4 *)row, t, nt, nfull);
    if (staged) {
        ppn_mv_stage_in(p, xs, part[0]);
        __syncthreads();
    }
    const float *x = staged ? xs : xg;
    for (int base = blockIdx.x * rpb, it = 0; base < p.rows; base += step, it ^= 1) {
        r = base + grp;
        row = (const char *)p.w + (size_t)r * pitch;
        const bool live = r < p.rows, vec = xal && ppn_al16(row);
        float acc = 0.0f;
        if (live) {
            if (!vec) acc = ppn_mv_scalar<DT>(row, x, t, nt, nfull);
            else if (staged) acc = ppn_mv_vec<DT, true>(wv, (const uint4 *)row, xs, t, nt, nfull);
            else acc = ppn_mv_vec<DT, false>(wv, (const uint4 *)row, xg, t, nt, nfull);
            if (t == nfull % nt) // the partial last chunk belongs to the thread that would own chunk nfull
                for (int c = nfull * V; c < p.cols; c++) acc = fmaf(T::at(row, c), x[c], acc);
        }
        const char *next = row + (size_t)step * pitch;
        if (r + step < p.rows && xal && ppn_al16(next)) ppn_mv_issue(wv, (const uint4 *)next, t, nt, nfull);
        acc = ppn_warp_sum(acc);
        if (g > 1) { // the group's warps in warp order; part[it] alternates, so one barrier per row suffices
            if ((t & 31) == 0) part[it][threadIdx.x >> 5] = acc;
            __syncthreads();
            if (t == 0) {
                acc = part[it][grp * g];
                for (int k = 1; k < g; k++) acc += part[it][grp * g + k];
            }
        }
        if (t != 0 || !live) continue;
        // As HF: (x W^T + bias), then the residual added; res may alias out (read before the write).
        if (p.bias) acc = __fadd_rn(acc, ppn_wload(p.bias, p.wdt, (size_t)r));
        if (p.res) acc = __fadd_rn(((const float *)p.res)[r], acc);
        ((float *)p.out)[r] = acc;
    }
}

template <int DT> __device__ __forceinline__ void ppn_mv_by_split(const ppn_kp_matvec &p, float *xs, float (*part)[32])
{
    switch (ppn_mv_split(p.cols, DT == PPN_DT_F32 ? 4 : 2)) {
    case 1: ppn_mv_rows<DT, 1>(p, xs, part); break;
    case 2: ppn_mv_rows<DT, 2>(p, xs, part); break;
    case 4: ppn_mv_rows<DT, 4>(p, xs, part); break;
    default: ppn_mv_rows<DT, PPN_MV_MAX_SPLIT>(p, xs, part); break;
    }
}

// At most 1024 threads (the contract), so at most 64 registers: 4 blocks of 256 on an SM.
extern "C" __global__ void __launch_bounds__(1024) ppn_k_matvec(const ppn_kp_matvec p)
{
    extern __shared__ float4 ppn_mv_xs[]; // cols floats when staged (16-byte aligned)
    __shared__ float s_part[2][32];
    float *xs = (float *)ppn_mv_xs;
    if (p.wdt == PPN_DT_BF16) ppn_mv_by_split<PPN_DT_BF16>(p, xs, s_part);
    else if (p.wdt == PPN_DT_F16) ppn_mv_by_split<PPN_DT_F16>(p, xs, s_part);
    else ppn_mv_by_split<PPN_DT_F32>(p, xs, s_part);
}

// ---------------------------------------------------------------------------------------------------------
// rope: one block per head; thread i rotates pair i. Explicit _rn ops keep each product rounded as HF does.

// With p.kc, the blocks of the k heads also store the rotated pair and their v head (the fused kv_store).
extern "C" __global__ void ppn_k_rope(const ppn_kp_rope p)
{
    float *xh = (float *)p.x + (size_t)blockIdx.x * (size_t)p.head_dim;
    const float *inv = (const float *)p.inv_freq;
    int32_t pos = ppn_hdr(p.hdr)->pos;
    int half = p.head_dim / 2, kh = (int)blockIdx.x - (p.n_heads - p.n_kv);
    bool store = p.kc && kh >= 0 && pos >= 0 && pos < p.ctx;
    size_t dst = store ? ((size_t)kh * (size_t)p.ctx + (size_t)pos) * (size_t)p.head_dim : 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float s, c;
        sincosf(__fmul_rn((float)pos, inv[i]), &s, &c);
        int a = p.interleaved ? 2 * i : i, b = p.interleaved ? 2 * i + 1 : i + half;
        float x0 = xh[a], x1 = xh[b];
        float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
        xh[a] = y0;
        xh[b] = y1;
        if (store) ((float *)p.kc)[dst + a] = y0, ((float *)p.kc)[dst + b] = y1;
    }
    if (!store) return;
    const float *vh = (const float *)p.v + (size_t)kh * (size_t)p.head_dim;
    for (int i = threadIdx.x; i < p.head_dim; i += blockDim.x) ((float *)p.vc)[dst + i] = vh[i];
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
// attn: block (h, j) takes query head h over the positions of split j (ppn_attn_span). Warp w takes the
// split's positions t0 + w, t0 + w + nw, ... with an online softmax (running max, running sum, running
// output with lane l holding dims l, l+32, ...); the warps' results are merged in warp order into the
// block's partial. With one split that is the output. Otherwise each block stores its partial in p.part,
// and the last block of the head to arrive (a device-scope counter) merges the head's n_split partials in
// split order: which block came last changes who merges, never the bits.

struct ppn_attn_part {
    float m, l;                       // running max score, running sum of exp(s - m)
    float acc[PPN_ATTN_MAXJ];         // running sum of exp(s - m) * v[d], d = lane + 32 j
};

// Split j of n over positions [0, pos]: [t0, t1) in chunks of ceil((pos + 1) / n); empty when t0 == t1.
__device__ __forceinline__ void ppn_attn_span(int pos, int n, int j, int *t0, int *t1)
{
    int c = pos / n + 1; // = ceil((pos + 1) / n) without overflowing
    *t0 = min(j * c, pos + 1);
    *t1 = min(*t0 + c, pos + 1);
}

__device__ void ppn_attn_warp(const ppn_kp_attn &p, const float *q, const float *kc, const float *vc,
                              int t0, int t1, ppn_attn_part *pt)
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
    for (int t = t0 + warp; t < t1; t += nw) {
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

// Merge weight of a partial with max m under the overall max mx; an empty partial (m = -inf) weighs 0, so
// its {0, 0..} adds nothing (and -inf - -inf never makes a NaN).
__device__ __forceinline__ float ppn_attn_weight(float m, float mx) { return m == -INFINITY ? 0.0f : expf(m - mx); }

// The last block of head h to arrive merges the head's partials in split order. Every thread computes the
// same max and sum (same inputs, same order); reads go through L2 (__ldcg): other blocks wrote them.
__device__ void ppn_attn_merge(const ppn_kp_attn &p, const float *ph, float *out)
{
    __shared__ float s_w[PPN_ATTN_MAX_SPLIT], s_pl[PPN_ATTN_MAX_SPLIT];
    int ns = p.n_split, hd = p.head_dim;
    int rec = hd + 2; // <= 258 (int keeps ptxas from spilling the 64-bit index on sm_90a)
    if (threadIdx.x < ns) {
        s_w[threadIdx.x] = __ldcg(ph + threadIdx.x * rec);
        s_pl[threadIdx.x] = __ldcg(ph + threadIdx.x * rec + 1);
    }
    __syncthreads();
    float mx = -INFINITY, den = 0.0f;
    for (int j = 0; j < ns; j++) mx = fmaxf(mx, s_w[j]);
    __syncthreads(); // every max read s_w before it is overwritten with the weights
    if (threadIdx.x < ns) s_w[threadIdx.x] = ppn_attn_weight(s_w[threadIdx.x], mx);
    __syncthreads();
    for (int j = 0; j < ns; j++) den = fmaf(s_pl[j], s_w[j], den);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
        const float *o = ph + 2 + d;
        for (int j = 0; j < ns; j++, o += rec) num = fmaf(__ldcg(o), s_w[j], num);
        out[d] = num / den; // den > 0: split 0 always holds position 0
    }
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS) ppn_k_attn(const ppn_kp_attn p)
{
    __shared__ float s_acc[PPN_ATTN_WARPS][32 * PPN_ATTN_MAXJ];
    __shared__ float s_m[PPN_ATTN_WARPS], s_l[PPN_ATTN_WARPS];
    __shared__ int s_last;
    int h = blockIdx.x, j = blockIdx.y, ns = p.n_split, hd = p.head_dim, lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float *out = (float *)p.out + (size_t)h * hd;
    int32_t pos = ppn_hdr(p.hdr)->pos;
    if (pos < 0 || pos >= p.ctx) { // uniform over the grid: no block counts, so the counters stay 0
        if (j == 0)
            for (int d = threadIdx.x; d < hd; d += blockDim.x) out[d] = __int_as_float(0x7fc00000);
        return;
    }
    int t0, t1;
    ppn_attn_span(pos, ns, j, &t0, &t1);
    size_t kv_off = (size_t)(h / (p.n_heads / p.n_kv)) * (size_t)p.ctx * hd;
    ppn_attn_part pt;
    ppn_attn_warp(p, (const float *)p.q + (size_t)h * hd, (const float *)p.kc + kv_off,
                  (const float *)p.vc + kv_off, t0, t1, &pt);
#pragma unroll
    for (int k = 0; k < PPN_ATTN_MAXJ; k++) s_acc[warp][lane + 32 * k] = pt.acc[k];
    if (lane == 0) s_m[warp] = pt.m, s_l[warp] = pt.l;
    __syncthreads();
    // the block's partial: an empty split gives {-inf, 0, 0..}, as every warp's is
    float *rec = (float *)p.part + ((size_t)h * ns + j) * ((size_t)hd + 2);
    float mx = -INFINITY, den = 0.0f;
    for (int w = 0; w < nw; w++) mx = fmaxf(mx, s_m[w]);
    for (int w = 0; w < nw; w++) {
        float f = ppn_attn_weight(s_m[w], mx);
        den = fmaf(s_l[w], f, den);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float num = 0.0f;
        for (int w = 0; w < nw; w++) num = fmaf(s_acc[w][d], ppn_attn_weight(s_m[w], mx), num);
        if (ns == 1) out[d] = num / den;
        else rec[2 + d] = num;
    }
    if (ns == 1) return;
    if (threadIdx.x == 0) rec[0] = mx, rec[1] = den;
    // Release: every thread's stores are visible device-wide before thread 0 counts the block in.
    __threadfence();
    __syncthreads();
    unsigned *cnt = (unsigned *)((float *)p.part + (size_t)p.n_heads * ns * ((size_t)hd + 2)) + h;
    if (threadIdx.x == 0) {
        s_last = atomicAdd(cnt, 1u) == (unsigned)(ns - 1);
        __threadfence(); // acquire: the merge's reads come after seeing every other block's count
    }
    __syncthreads();
    if (!s_last) return;
    ppn_attn_merge(p, (const float *)p.part + (size_t)h * ns * ((size_t)hd + 2), out);
    if (threadIdx.x == 0) *cnt = 0; // every block of h has counted; the next launch starts from 0
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

// ---------------------------------------------------------------------------------------------------------
// matmat: one warp per row, one register accumulator per token; each lane sums its strided columns in order,
// then a fixed xor tree: deterministic, and independent of the grid.

extern "C" __global__ void ppn_k_matmat(const ppn_kp_matmat p)
{
    int r = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (r >= p.rows) return; // a whole warp leaves together: the shuffles below see full warps
    float acc[PPN_MATMAT_MAX_M];
#pragma unroll
    for (int t = 0; t < PPN_MATMAT_MAX_M; t++) acc[t] = 0.0f;
    const float *x = (const float *)p.x;
    size_t row = (size_t)r * (size_t)p.cols;
    for (int c = lane; c < p.cols; c += 32) {
        float wv = ppn_wload(p.w, p.wdt, row + (size_t)c);
#pragma unroll
        for (int t = 0; t < PPN_MATMAT_MAX_M; t++)
            if (t < p.m) acc[t] = fmaf(wv, x[(size_t)t * p.cols + c], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < PPN_MATMAT_MAX_M; t++) {
        if (t >= p.m) break;
        float v = ppn_warp_sum(acc[t]);
        if (lane != 0) continue;
        if (p.bias) v = v + ppn_wload(p.bias, p.wdt, (size_t)r);
        size_t o = (size_t)t * p.rows + (size_t)r;
        if (p.res) v = ((const float *)p.res)[o] + v;
        ((float *)p.out)[o] = v;
    }
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
