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
// Geometry contract with ops.c: blockDim.x is a multiple of 32, at most 1024; attention runs exactly
// PPN_ATTN_WARPS warps per block (256 threads, two blocks per SM), grid (n_kv, n_split), head_dim <= 32 *
// PPN_ATTN_MAXJ and n_split <= PPN_ATTN_MAX_SPLIT; any n_heads / n_kv (passes of up to PPN_ATTN_MAXG heads).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kernels/kparams.h"
#include "kernels/kdev.cuh"

#define PPN_ATTN_WARPS 8
#define PPN_ATTN_MAXJ 8
#define PPN_ATTN_MAXG 8
#define PPN_ATTN_MAX_SPLIT 64
#define PPN_ATTN_ROPE_MAXJ 4 // the fused rotary up to head_dim 128: with 8 dims a lane it would spill
#define PPN_ATTN_MIN_SPAN 64 // positions a split gets at least (two tile rounds of 8 warps x 4 positions)

// ---------------------------------------------------------------------------------------------------------
// helpers: the ones every kernel file shares are in kernels/kdev.cuh

// ---------------------------------------------------------------------------------------------------------
// embed: grid covers dim

extern "C" __global__ void ppn_k_embed(const ppn_kp_embed p)
{
    PPN_PDL_ENTER();
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
    PPN_PDL_ENTER();
    ppn_rmsnorm_block((float *)p.out, (const float *)p.in, p.w, p.wdt, p.n, p.eps);
}

// grid: one block per head
extern "C" __global__ void ppn_k_head_rmsnorm(const ppn_kp_head_rmsnorm p)
{
    PPN_PDL_ENTER();
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

template <> struct ppn_mv<PPN_DTYPE_F32> {
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
        return DT == PPN_DTYPE_BF16 ? ppn_bf16_bits(u) : ppn_f16_bits(u);
    }
    static __device__ __forceinline__ float lo(unsigned u)
    {
        return DT == PPN_DTYPE_BF16 ? ppn_bf16_lo(u) : ppn_f16_lo(u);
    }
    static __device__ __forceinline__ float hi(unsigned u)
    {
        return DT == PPN_DTYPE_BF16 ? ppn_bf16_hi(u) : ppn_f16_hi(u);
    }
    template <bool XS> static __device__ __forceinline__ float fma_chunk(uint4 w, const float *x, int sw, float acc)
    {
        float4 a = ppn_mv_x4<XS>(x, (size_t)(4 * sw)), b = ppn_mv_x4<XS>(x, (size_t)(4 - 4 * sw));
        float4 x0 = sw ? b : a, x1 = sw ? a : b;
        acc = ppn_fma4(make_float4(lo(w.x), hi(w.x), lo(w.y), hi(w.y)), x0, acc);
        return ppn_fma4(make_float4(lo(w.z), hi(w.z), lo(w.w), hi(w.w)), x1, acc);
    }
};
template <> struct ppn_mv<PPN_DTYPE_BF16> : ppn_mv16<PPN_DTYPE_BF16> {};
template <> struct ppn_mv<PPN_DTYPE_F16> : ppn_mv16<PPN_DTYPE_F16> {};

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
    if (((uintptr_t)x & 15u) == 0) { // two float4 loads in flight per thread
        int n4 = cols / 4;
        c0 = cols & ~3;
        for (int i = tid; i < n4; i += 2 * nth) {
            float4 a = __ldg((const float4 *)x + i), b = a;
            if (i + nth < n4) b = __ldg((const float4 *)x + i + nth);
            ((float4 *)xs)[i] = a;
            if (i + nth < n4) ((float4 *)xs)[i + nth] = b;
        }
    }
    for (int c = c0 + tid; c < cols; c += nth) xs[c] = x[c];
}

__device__ __forceinline__ bool ppn_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// xin (kparams.h, PPN_MV_X_*) into shared memory, every thread of the block taking part; the caller's barrier
// publishes it. Staging is on every block's critical path, so the common case (x 16-byte aligned, cols a
// multiple of 4) moves float4 groups with PPN_STAGE_U of them in flight per thread, and the norm's weights are
// prefetched into L1 before the block's reduction so the scaling pass does not wait on L2. Thread t owns the
// groups t, t + nth, ...: it sums their squares (in that order, then the block sum: a fixed shape) and scales
// them, so only the block sum needs barriers. Other alignments take the element loops (the same math).
// sh: 32 floats of shared memory (ppn_block_sum leaves them free again).
#define PPN_STAGE_U 4

// Weights 4j .. 4j+3 of nw (16-byte aligned for f32, 8-byte for the 2-byte dtypes).
__device__ __forceinline__ float4 ppn_nw4(uint64_t nw, int wdt, int j)
{
    if (wdt == PPN_DTYPE_F32) return __ldg((const float4 *)nw + j);
    uint2 u = __ldg((const uint2 *)nw + j);
    if (wdt == PPN_DTYPE_BF16) return make_float4(ppn_bf16_lo(u.x), ppn_bf16_hi(u.x), ppn_bf16_lo(u.y), ppn_bf16_hi(u.y));
    return make_float4(ppn_f16_lo(u.x), ppn_f16_hi(u.x), ppn_f16_lo(u.y), ppn_f16_hi(u.y));
}

__device__ __noinline__ void ppn_mv_stage_in(const ppn_kp_matvec p, float *xs, float *sh)
{
    const float *x = (const float *)p.x;
    const int nth = blockDim.x, tid = threadIdx.x, cols = p.cols, n4 = cols / 4;
    float4 *xs4 = (float4 *)xs;
    const bool v4 = ppn_al16(x) && cols % 4 == 0;
    if (p.xmode == PPN_MV_X_PLAIN) {
        ppn_mv_stage(xs, x, cols);
        return;
    }
    // PPN_MV_X_RMSNORM
    const bool wv4 = v4 && ((uintptr_t)p.nw & (p.wdt == PPN_DTYPE_F32 ? 15u : 7u)) == 0;
    float ss = 0.0f;
    if (wv4) {
        const float4 *x4 = (const float4 *)x;
        const char *nwb = (const char *)p.nw;
        const int wb = p.wdt == PPN_DTYPE_F32 ? 16 : 8; // weight bytes per group of 4
        for (int i = tid; i < n4; i += PPN_STAGE_U * nth) {
            float4 v[PPN_STAGE_U];
#pragma unroll
            for (int k = 0; k < PPN_STAGE_U; k++) {
                int j = i + k * nth;
                v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (j < n4) {
                    v[k] = __ldg(x4 + j);
                    asm volatile("prefetch.global.L1 [%0];" ::"l"(nwb + (size_t)j * wb));
                }
            }
#pragma unroll
            for (int k = 0; k < PPN_STAGE_U; k++) {
                int j = i + k * nth;
                if (j >= n4) continue;
                xs4[j] = v[k];
                ss = fmaf(v[k].x, v[k].x, ss), ss = fmaf(v[k].y, v[k].y, ss);
                ss = fmaf(v[k].z, v[k].z, ss), ss = fmaf(v[k].w, v[k].w, ss);
            }
        }
    } else {
        for (int c = tid; c < cols; c += nth) xs[c] = x[c], ss = fmaf(x[c], x[c], ss);
    }
    float var = ppn_block_sum(ss, sh) / (float)cols;
    float r = 1.0f / sqrtf(var + p.eps);
    if (wv4) {
        for (int j = tid; j < n4; j += nth) {
            float4 v = xs4[j], w = ppn_nw4(p.nw, p.wdt, j);
            xs4[j] = make_float4((v.x * r) * w.x, (v.y * r) * w.y, (v.z * r) * w.z, (v.w * r) * w.w);
        }
    } else {
        for (int c = tid; c < cols; c += nth) xs[c] = (xs[c] * r) * ppn_wload(p.nw, p.wdt, (size_t)c);
    }
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
    constexpr size_t es = DT == PPN_DTYPE_F32 ? 4 : 2;
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
    // A fused input is staged first, in its own frame, so its registers never add to the loop's (its loads
    // then do not overlap the first weights'); a plain x is staged with the first weights in flight.
    // Under PDL the first weights (immutable) are in flight before the wait for the predecessor's x.
    if (p.xmode != PPN_MV_X_PLAIN) ppn_pdl_wait(), ppn_mv_stage_in(p, xs, part[0]);
    if (r < p.rows && xal && ppn_al16(row)) ppn_mv_issue(wv, (const uint4 *)row, t, nt, nfull);
    if (p.xmode == PPN_MV_X_PLAIN) ppn_pdl_wait();
    if (staged) {
        if (p.xmode == PPN_MV_X_PLAIN) ppn_mv_stage(xs, xg, p.cols);
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
    switch (ppn_mv_split(p.cols, DT == PPN_DTYPE_F32 ? 4 : 2)) {
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
    ppn_pdl_trigger(); // the wait is in ppn_mv_rows, after the first weight loads
    if (p.wdt == PPN_DTYPE_BF16) ppn_mv_by_split<PPN_DTYPE_BF16>(p, xs, s_part);
    else if (p.wdt == PPN_DTYPE_F16) ppn_mv_by_split<PPN_DTYPE_F16>(p, xs, s_part);
    else ppn_mv_by_split<PPN_DTYPE_F32>(p, xs, s_part);
}

// ---------------------------------------------------------------------------------------------------------
// rope: one block per head; thread i rotates pair i. Explicit _rn ops keep each product rounded as HF does.

// Pair i of head xh rotated (pair (i, i + half), or (2i, 2i + 1) interleaved).
__device__ __forceinline__ void ppn_rope_pair(const float *xh, int i, int half, int interleaved, int32_t pos,
                                              float inv, int *a, int *b, float *y0, float *y1)
{
    float s, c;
    ppn_rope_angle(pos, inv, &s, &c);
    *a = interleaved ? 2 * i : i, *b = interleaved ? 2 * i + 1 : i + half;
    float x0 = xh[*a], x1 = xh[*b];
    *y0 = ppn_rope_rot(x0, x1, c, s, false);
    *y1 = ppn_rope_rot(x1, x0, c, s, true);
}

// With p.kc, the blocks of the k heads also store the rotated pair and their v head into the KV caches.
extern "C" __global__ void ppn_k_rope(const ppn_kp_rope p)
{
    PPN_PDL_ENTER();
    float *xh = (float *)p.x + (size_t)blockIdx.x * (size_t)p.head_dim;
    const float *inv = (const float *)p.inv_freq;
    int32_t pos = ppn_hdr(p.hdr)->pos;
    int half = p.head_dim / 2, kh = (int)blockIdx.x - (p.n_heads - p.n_kv);
    int32_t pp = p.kc && kh >= 0 ? ppn_kv_pool_pos((const int32_t *)p.tbl, p.block_log2, p.cap, pos) : -1;
    bool store = pp >= 0; // the pool position through the table (kparams.h); -1 stores nothing
    size_t dst = store ? ((size_t)kh * (size_t)p.cap + (size_t)pp) * (size_t)p.head_dim : 0;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        int a, b;
        float y0, y1;
        ppn_rope_pair(xh, i, half, p.interleaved, pos, inv[i], &a, &b, &y0, &y1);
        xh[a] = y0;
        xh[b] = y1;
        if (store) ppn_kv_put(p.kc, p.kvdt, dst + a, y0), ppn_kv_put(p.kc, p.kvdt, dst + b, y1);
    }
    if (!store) return;
    const float *vh = (const float *)p.v + (size_t)kh * (size_t)p.head_dim;
    for (int i = threadIdx.x; i < p.head_dim; i += blockDim.x) ppn_kv_put(p.vc, p.kvdt, dst + i, vh[i]);
}

// ---------------------------------------------------------------------------------------------------------
// attn: block (g, j) takes KV head g and the G = n_heads / n_kv query heads that share it over the positions
// of split j (ppn_attn_span), so each k and v row is read once per block, not once per query head. The heads
// go in passes of HP (a power of two; a short pass pads with zero queries that are never stored). Lane l of a
// warp holds dims l + 32 i (i < NJ) of the pass's q and output accumulators in registers; the warp walks
// tiles of P consecutive positions (warp w's i-th tile starts at t0 + (w + i W) P) and loads a whole tile's k
// and v rows before using them, so P rows per warp are in flight. The tile's P x HP partial dots are summed
// over the warp at once (ppn_warp_sum_n: one score per lane) and each head keeps an online softmax (running
// max, running sum, rescaled output). The warps' results are merged in warp order into one partial per query
// head; with one split that is the output. Otherwise each block stores its partials in p.part and the last
// block of the KV head to arrive (a device-scope counter per KV head) merges the n_split partials of all G
// heads in split order: which block came last changes who merges, never the bits. Every sum has a fixed shape
// (register order, fixed shuffle trees, warp order, split order), so the bits are the same on every run.

// Split j of n over positions [0, pos]: [t0, t1) in chunks of ceil((pos + 1) / n); empty when t0 == t1.
__device__ __forceinline__ void ppn_attn_span(int pos, int n, int j, int *t0, int *t1)
{
    int c = pos / n + 1; // = ceil((pos + 1) / n) without overflowing
    *t0 = min(j * c, pos + 1);
    *t1 = min(*t0 + c, pos + 1);
}

__host__ __device__ constexpr int ppn_log2(int n) { return n > 1 ? 1 + ppn_log2(n / 2) : 0; }

// Positions per warp tile for NJ dims per lane and HP heads per pass: the largest power of two with P HP <= 32
// (one score per lane after the sum) and k and v tiles of at most 32 registers (4 KB per warp in flight)
// such that those tiles (2 P NJ), q and the accumulators (2 HP NJ) and the partial dots (P HP) fit in 96
// registers, under the 128 of two 256-thread blocks per SM.
__host__ __device__ constexpr int ppn_attn_tile(int nj, int hp, int p = 16)
{
    return p > 1 && (p * hp > 32 || p * nj > 16 || 2 * p * nj + 2 * hp * nj + p * hp > 96)
               ? ppn_attn_tile(nj, hp, p / 2)
               : p;
}

// Warp sum of N values per lane at once (N a power of two <= 32): each of the first log2 N xor steps keeps
// half of a lane's values, adding the partner's copies, and hands the other half over; plain butterfly steps
// finish. Lane l ends with the total of value l >> (5 - log2 N) (lanes holding the same value hold the same
// bits) after N - 1 + 5 - log2 N shuffles instead of 5 N. One template per step: with loops bounded by a
// variable, nvcc left 32-value arrays in local memory.
template <int N, int H> __device__ __forceinline__ void ppn_warp_halve(float (&a)[N], int lane)
{
    if constexpr (H >= 1) {
        constexpr int m = 32 * H / N;
        bool hi = lane & m;
#pragma unroll
        for (int i = 0; i < H; i++) {
            float lo = a[i], up = a[i + H];
            a[i] = (hi ? up : lo) + __shfl_xor_sync(PPN_FULL_MASK, hi ? lo : up, m);
        }
        ppn_warp_halve<N, H / 2>(a, lane);
    }
}

template <int N> __device__ __forceinline__ float ppn_warp_sum_n(float (&a)[N])
{
    ppn_warp_halve<N, N / 2>(a, threadIdx.x & 31);
    float s = a[0];
#pragma unroll
    for (int m = 16 / N; m > 0; m /= 2) s += __shfl_xor_sync(PPN_FULL_MASK, s, m);
    return s;
}

// Merge weight of a partial with max m under the overall max mx; an empty partial (m = -inf) weighs 0, so
// its {0, 0..} adds nothing (and -inf - -inf never makes a NaN).
__device__ __forceinline__ float ppn_attn_weight(float m, float mx) { return m == -INFINITY ? 0.0f : expf(m - mx); }

// The raw bits of element i of a cache of dtype KD, through the read-only path, predicated (0 when off: +0 in
// every dtype); ppn_kv_widen makes the f32 value. A tile's loads all issue before the first is widened (one
// kernel converting each value as it loaded it ran the 2-byte caches at a quarter of the f32 bandwidth on the
// H200, 2026-11-29 15:18), and each dtype is its own kernel (a run-time bf16/f16 choice spilled).
template <int KD> __device__ __forceinline__ unsigned ppn_kv_raw(const void *c, size_t i, bool on)
{
    if constexpr (KD == PPN_DTYPE_F32) return on ? __float_as_uint(__ldg((const float *)c + i)) : 0u;
    else return on ? (unsigned)__ldg((const unsigned short *)c + i) : 0u;
}

template <int KD> __device__ __forceinline__ float ppn_kv_widen(unsigned u)
{
    if constexpr (KD == PPN_DTYPE_F32) return __uint_as_float(u);
    else if constexpr (KD == PPN_DTYPE_BF16) return ppn_bf16_lo(u);
    else return ppn_f16_lo(u);
}

// The fused rotary (p.inv_freq set, kparams.h) on a row held as attention holds it: lane l has dims l + 32 i.
// ppn_op_attn_rope admits only shapes whose pairs are in reach: a pair is either on lanes l and l ^ m (m = 1
// for interleaved pairs (2i, 2i + 1); m = head_dim / 2 for halves when head_dim <= 32 is a power of two), or
// elements i and i ^ NJ / 2 of one lane (halves with head_dim = 32 NJ; m = 0). The angle and the expression
// are ppn_rope_angle's and ppn_rope_rot's, so the bits are the rope kernel's. Compiled for NJ <= PPN_ATTN_ROPE_MAXJ only
// (head_dim <= 128).
template <int NJ>
__device__ __forceinline__ void ppn_attn_angles(const ppn_kp_attn &p, int32_t pos, int lane, float (&c)[NJ],
                                                float (&s)[NJ])
{
    const float *inv = (const float *)p.inv_freq;
    const int hd = p.head_dim, half = hd / 2;
#pragma unroll
    for (int i = 0; i < NJ; i++) {
        int d = lane + 32 * i, pi = p.interleaved ? d >> 1 : d < half ? d : d - half;
        c[i] = 1.0f, s[i] = 0.0f;
        if (d < hd) ppn_rope_angle(pos, inv[pi], &s[i], &c[i]);
    }
}

__device__ __forceinline__ int ppn_attn_pair_lanes(const ppn_kp_attn &p)
{
    return p.interleaved ? 1 : p.head_dim / 2 < 32 ? p.head_dim / 2 : 0;
}

template <int NJ>
__device__ __forceinline__ void ppn_attn_rotate(float (&x)[NJ], const float (&c)[NJ], const float (&s)[NJ], int m,
                                                int lane)
{
    float y[NJ];
#pragma unroll
    for (int i = 0; i < NJ; i++) {
        float o = m ? __shfl_xor_sync(PPN_FULL_MASK, x[i], m) : x[i ^ (NJ / 2)];
        bool second = m ? (lane & m) != 0 : i >= NJ / 2; // this element is b of its pair (a, b)
        y[i] = ppn_rope_rot(x[i], o, c[i], s[i], second);
    }
#pragma unroll
    for (int i = 0; i < NJ; i++) x[i] = y[i];
}

// Element k of attention's output row: f32, or (p.odt a bf16 form, batched rows for the o GEMM on bf16 x) rounded
// to nearest even at PPN_X16_AT(odt, k), as the GEMM rounds the f32.
__device__ __forceinline__ void ppn_attn_put(const ppn_kp_attn &p, size_t k, float v)
{
    if (p.odt != PPN_DTYPE_F32) ((__nv_bfloat16 *)p.out)[PPN_X16_AT(p.odt, k)] = __float2bfloat16_rn(v);
    else ((float *)p.out)[k] = v;
}

// ppn_k_attn's arrival, after a block wrote its partials: released device-wide (every thread's stores) before
// thread 0 counts the block in on cnt; true in the block that counts last, whose merge then reads the others'
// partials (acquire: after seeing every other block's count). s_last: the block's shared flag.
__device__ __forceinline__ bool ppn_attn_arrive(unsigned *cnt, int ns, int &s_last)
{
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        s_last = atomicAdd(cnt, 1u) == (unsigned)(ns - 1);
        __threadfence();
    }
    __syncthreads();
    return s_last;
}

// One pass: query heads h0 .. h0 + ng - 1 (ng <= HP) over the block's positions [t0, t1), into the block's
// partial per head (the output when n_split is 1). s_acc: per warp, HP x NJ x 32 accumulators; s_m, s_l: per
// warp, PPN_ATTN_MAXG maxima and sums. With the fused rotary, q is rotated in registers as it is loaded, and
// the row of position pos is read from this step's k and v (rotated and rounded as the cache holds them) in
// shared memory (s_kv, ppn_attn_rope_row). Nothing reads the cache's row pos in this launch, so its loads
// keep the read-only path.
template <int NJ, int HP, int KD>
__device__ void ppn_attn_pass(const ppn_kp_attn &p, const float *q, int kvh, int h0, int ng, int ns, int j, int t0,
                              int t1, int32_t pos, const float *s_kv, float *s_acc, float *s_m, float *s_l)
{
    constexpr int P = ppn_attn_tile(NJ, HP), N = P * HP, SH = 5 - ppn_log2(N), LHP = ppn_log2(HP);
    static_assert(HP * NJ <= 32 && HP <= PPN_ATTN_MAXG && NJ <= PPN_ATTN_MAXJ, "attn pass shape");
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = p.head_dim;
    size_t kv_off = (size_t)kvh * (size_t)p.cap * hd; // elements
    constexpr size_t KB = KD == PPN_DTYPE_F32 ? 4 : 2;
    const char *kc = (const char *)p.kc + kv_off * KB, *vc = (const char *)p.vc + kv_off * KB;
    const int32_t *tbl = (const int32_t *)p.tbl; // the block table (kparams.h); NULL: identity
    const bool rope = NJ <= PPN_ATTN_ROPE_MAXJ && p.inv_freq != 0; // ops.c admits no wider head
    const int sub = rope ? pos : -1; // the position whose k, v rows come from s_kv
    float qr[HP][NJ], acc[HP][NJ];
#pragma unroll
    for (int g = 0; g < HP; g++)
#pragma unroll
        for (int i = 0; i < NJ; i++) {
            int d = lane + 32 * i;
            qr[g][i] = g < ng && d < hd ? q[g * hd + d] : 0.0f;
            acc[g][i] = 0.0f;
        }
    if constexpr (NJ <= PPN_ATTN_ROPE_MAXJ) if (rope) {
        float cs[NJ], sn[NJ];
        ppn_attn_angles<NJ>(p, pos, lane, cs, sn);
#pragma unroll
        for (int g = 0; g < HP; g++) ppn_attn_rotate<NJ>(qr[g], cs, sn, ppn_attn_pair_lanes(p), lane);
    }
    int me = lane >> SH;           // this lane's score after the sum: tile position me / HP, head me % HP
    float m = -INFINITY, l = 0.0f; // running max and sum of head me % HP, the same bits on each lane holding it
    for (int tb = t0 + warp * P; tb < t1; tb += PPN_ATTN_WARPS * P) {
        float kr[P][NJ], vr[P][NJ], s[N]; // the raw bits first, widened in place once all are in flight
        int32_t pp[P]; // the tile's pool positions through the table (-1: read as zeros)
#pragma unroll
        for (int t = 0; t < P; t++) pp[t] = tb + t < t1 ? ppn_kv_pool_pos(tbl, p.block_log2, p.cap, tb + t) : -1;
#pragma unroll
        for (int t = 0; t < P; t++)
#pragma unroll
            for (int i = 0; i < NJ; i++) {
                int d = lane + 32 * i;
                bool in = pp[t] >= 0 && d < hd && tb + t != sub;
                size_t at = (size_t)(in ? pp[t] : 0) * hd + d;
                kr[t][i] = __uint_as_float(ppn_kv_raw<KD>(kc, at, in));
                vr[t][i] = __uint_as_float(ppn_kv_raw<KD>(vc, at, in));
            }
#pragma unroll
        for (int t = 0; t < P; t++)
#pragma unroll
            for (int i = 0; i < NJ; i++) {
                kr[t][i] = ppn_kv_widen<KD>(__float_as_uint(kr[t][i]));
                vr[t][i] = ppn_kv_widen<KD>(__float_as_uint(vr[t][i]));
            }
        // warp-uniform: this step's row, from shared memory (ppn_attn_rope_row). Only inside the block's span:
        // a block's last tile can reach past t1 to pos (a one-position last split), and its s_kv is unwritten.
        if (sub >= tb && sub < tb + P && sub < t1)
#pragma unroll
            for (int t = 0; t < P; t++)
#pragma unroll
                for (int i = 0; i < NJ; i++) {
                    int d = lane + 32 * i;
                    if (tb + t == sub && d < hd) kr[t][i] = s_kv[d], vr[t][i] = s_kv[hd + d];
                }
#pragma unroll
        for (int t = 0; t < P; t++)
#pragma unroll
            for (int g = 0; g < HP; g++) {
                float dot = 0.0f;
#pragma unroll
                for (int i = 0; i < NJ; i++) dot = fmaf(qr[g][i], kr[t][i], dot);
                s[t * HP + g] = dot;
            }
        float sc = ppn_warp_sum_n<N>(s);
        sc = tb + (me >> LHP) < t1 ? sc * p.scale : -INFINITY; // a position past t1 weighs 0
        // the tile's max and sum per head: over the lanes holding its P positions
        float tm = sc;
#pragma unroll
        for (int b = SH + LHP; b < 5; b++) tm = fmaxf(tm, __shfl_xor_sync(PPN_FULL_MASK, tm, 1 << b));
        float m_new = fmaxf(m, tm); // finite: position tb < t1 scores for every head
        float corr = m == -INFINITY ? 0.0f : expf(m - m_new), e = expf(sc - m_new), es = e;
#pragma unroll
        for (int b = SH + LHP; b < 5; b++) es += __shfl_xor_sync(PPN_FULL_MASK, es, 1 << b);
        l = fmaf(l, corr, es);
        m = m_new;
#pragma unroll
        for (int g = 0; g < HP; g++) {
            float c = __shfl_sync(PPN_FULL_MASK, corr, g << SH);
#pragma unroll
            for (int i = 0; i < NJ; i++) acc[g][i] *= c;
        }
#pragma unroll
        for (int t = 0; t < P; t++)
#pragma unroll
            for (int g = 0; g < HP; g++) {
                float w = __shfl_sync(PPN_FULL_MASK, e, (t * HP + g) << SH);
#pragma unroll
                for (int i = 0; i < NJ; i++) acc[g][i] = fmaf(w, vr[t][i], acc[g][i]);
            }
    }
    float *wa = s_acc + warp * HP * NJ * 32;
#pragma unroll
    for (int g = 0; g < HP; g++)
#pragma unroll
        for (int i = 0; i < NJ; i++) wa[(g * NJ + i) * 32 + lane] = acc[g][i];
    if (me < HP && (lane & ((1 << SH) - 1)) == 0)
        s_m[warp * PPN_ATTN_MAXG + me] = m, s_l[warp * PPN_ATTN_MAXG + me] = l;
    __syncthreads();
    // the block's partial per head: an empty split gives {-inf, 0, 0..}, as every warp's is
    for (int x = threadIdx.x; x < ng * hd; x += blockDim.x) {
        int g = x / hd, d = x - g * hd;
        float mx = -INFINITY, den = 0.0f, num = 0.0f;
        for (int w = 0; w < PPN_ATTN_WARPS; w++) mx = fmaxf(mx, s_m[w * PPN_ATTN_MAXG + g]);
        for (int w = 0; w < PPN_ATTN_WARPS; w++) {
            float f = ppn_attn_weight(s_m[w * PPN_ATTN_MAXG + g], mx);
            den = fmaf(s_l[w * PPN_ATTN_MAXG + g], f, den);
            num = fmaf(s_acc[(w * HP + g) * NJ * 32 + d], f, num);
        }
        size_t h = (size_t)h0 + g;
        if (ns == 1) {
            ppn_attn_put(p, h * hd + d, num / den);
        } else {
            float *rec = (float *)p.part + (h * ns + j) * ((size_t)hd + 2);
            rec[2 + d] = num;
            if (d == 0) rec[0] = mx, rec[1] = den;
        }
    }
    __syncthreads(); // the next pass (or the merge) reuses the shared arrays
}

// qg: the group's G query heads.
template <int NJ, int HP, int KD>
__device__ void ppn_attn_heads(const ppn_kp_attn &p, const float *qg, int32_t pos, int kvh, int ns, int j, int t0,
                               int t1, const float *s_kv, float *s_acc, float *s_m, float *s_l)
{
    int G = p.n_heads / p.n_kv;
    for (int g0 = 0; g0 < G; g0 += HP)
        ppn_attn_pass<NJ, HP, KD>(p, qg + (size_t)g0 * p.head_dim, kvh, kvh * G + g0, min(HP, G - g0), ns, j, t0,
                                  t1, pos, s_kv, s_acc, s_m, s_l);
}

template <int NJ, int KD>
__device__ void ppn_attn_by_hp(const ppn_kp_attn &p, const float *qg, int32_t pos, int hp, int kvh, int ns, int j,
                               int t0, int t1, const float *s_kv, float *s_acc, float *s_m, float *s_l)
{
    constexpr int HPMAX = 32 / NJ < PPN_ATTN_MAXG ? 32 / NJ : PPN_ATTN_MAXG;
    if (hp == 1) ppn_attn_heads<NJ, 1, KD>(p, qg, pos, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    else if (hp == 2) ppn_attn_heads<NJ, 2, KD>(p, qg, pos, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    else if (hp == 4 || HPMAX == 4) ppn_attn_heads<NJ, 4, KD>(p, qg, pos, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    else ppn_attn_heads<NJ, HPMAX, KD>(p, qg, pos, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
}

// The fused rotary's row for position pos, in the block whose positions hold it: this step's k head rotated
// (ppn_rope_pair, the rope kernel's bits) and v, both rounded to the cache's dtype, into s_kv (k, then v) for
// the block's warps, and stored into the caches at pos as rope_kv stores them. The caller's barrier publishes
// s_kv.
__device__ void ppn_attn_rope_row(const ppn_kp_attn &p, int kvh, int32_t pos, float *s_kv)
{
    const int hd = p.head_dim, half = hd / 2;
    const float *kh = (const float *)p.q + (size_t)(p.n_heads + kvh) * hd, *vh = kh + (size_t)p.n_kv * hd;
    const float *inv = (const float *)p.inv_freq;
    const int32_t pp = ppn_kv_pool_pos((const int32_t *)p.tbl, p.block_log2, p.cap, pos); // -1: stores nothing
    size_t row = ((size_t)kvh * (size_t)p.cap + (size_t)(pp < 0 ? 0 : pp)) * (size_t)hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        int a, b;
        float y0, y1;
        ppn_rope_pair(kh, i, half, p.interleaved, pos, inv[i], &a, &b, &y0, &y1);
        s_kv[a] = ppn_dt_round(p.kvdt, y0), s_kv[b] = ppn_dt_round(p.kvdt, y1);
        if (pp >= 0) ppn_kv_put(p.kc, p.kvdt, row + a, y0), ppn_kv_put(p.kc, p.kvdt, row + b, y1);
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        s_kv[hd + d] = ppn_dt_round(p.kvdt, vh[d]);
        if (pp >= 0) ppn_kv_put(p.vc, p.kvdt, row + d, vh[d]);
    }
}

// The last block of KV head kvh merges each of its G query heads' n_split partials in split order, a head per
// warp at a time: the warp reduces the head's maxima and sums (split j on lane j % 32, a fixed shuffle tree),
// then the block forms num / den per output dim, summing in j order. Reads go through L2 (__ldcg): other
// blocks wrote them. s_w: (blockDim.x / 32) x PPN_ATTN_MAX_SPLIT floats; s_den: blockDim.x / 32 (the block's
// warps take the heads a chunk at a time: PPN_ATTN_WARPS in ppn_attn_body, fewer in ppn_k_attn_batch_tc).
__device__ void ppn_attn_merge(const ppn_kp_attn &p, int ns, int h0, int G, float *s_w, float *s_den)
{
    int hd = p.head_dim, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    int rec = hd + 2; // <= 258 (int keeps ptxas from spilling the 64-bit index on sm_90a)
    const float *part = (const float *)p.part;
    for (int c0 = 0; c0 < G; c0 += nw) {
        int nc = min(nw, G - c0);
        if (warp < nc) {
            const float *ph = part + (size_t)(h0 + c0 + warp) * ns * rec;
            float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
            if (lane < ns) m0 = __ldcg(ph + lane * rec), l0 = __ldcg(ph + lane * rec + 1);
            if (lane + 32 < ns) m1 = __ldcg(ph + (lane + 32) * rec), l1 = __ldcg(ph + (lane + 32) * rec + 1);
            float mx = ppn_warp_max(fmaxf(m0, m1)), w0 = ppn_attn_weight(m0, mx), w1 = ppn_attn_weight(m1, mx);
            s_w[warp * PPN_ATTN_MAX_SPLIT + lane] = w0;
            s_w[warp * PPN_ATTN_MAX_SPLIT + lane + 32] = w1;
            float den = ppn_warp_sum(fmaf(l1, w1, l0 * w0));
            if (lane == 0) s_den[warp] = den; // > 0: split 0 always holds position 0
        }
        __syncthreads();
        for (int x = threadIdx.x; x < nc * hd; x += blockDim.x) {
            int c = x / hd, d = x - c * hd;
            const float *o = part + (size_t)(h0 + c0 + c) * ns * rec + 2 + d, *w = s_w + c * PPN_ATTN_MAX_SPLIT;
            float num = 0.0f;
#pragma unroll 8
            for (int s = 0; s < ns; s++) num = fmaf(__ldcg(o + s * rec), w[s], num);
            ppn_attn_put(p, (size_t)(h0 + c0 + c) * hd + d, num / s_den[c]);
        }
        __syncthreads(); // the next heads reuse s_w, s_den
    }
}

// The body of ppn_k_attn (f32 caches), ppn_k_attn_bf16 and ppn_k_attn_f16: one kernel per cache dtype,
// since one kernel holding two spilled hundreds of bytes. The batched kernels (ppn_k_attn_batch*) run it per
// row with that row's params (q, out, part, tbl) and position: CTA (kvh, j) of one decode attention.
struct ppn_attn_smem {
    // per warp HP NJ 32 <= 1024 accumulators of a pass; the merge then reuses the array for its weights
    float acc[PPN_ATTN_WARPS * 32 * 32];
    float m[PPN_ATTN_WARPS * PPN_ATTN_MAXG], l[PPN_ATTN_WARPS * PPN_ATTN_MAXG];
    float kv[2 * 32 * PPN_ATTN_ROPE_MAXJ]; // the fused rotary's k and v rows at pos
    int last;
};

template <int KD>
__device__ __forceinline__ void ppn_attn_body(const ppn_kp_attn &p, int32_t pos, int kvh, int j, ppn_attn_smem &sm)
{
    float *s_acc = sm.acc, *s_m = sm.m, *s_l = sm.l, *s_kv = sm.kv;
    int hd = p.head_dim, G = p.n_heads / p.n_kv;
    if (pos < 0 || pos >= p.cap) { // uniform over the grid: no block counts, so the counters stay 0
        if (j == 0)
            for (int d = threadIdx.x; d < G * hd; d += blockDim.x)
                ppn_attn_put(p, (size_t)kvh * G * hd + d, __int_as_float(0x7fc00000));
        return;
    }
    // The launch has p.n_split splits for the longest context; this step uses only as many as give each at
    // least PPN_ATTN_MIN_SPAN positions (a function of pos alone, so the bits stay fixed per position): a
    // short context runs in one block per KV head, without partials, counter or merge. The rest leave.
    unsigned *cnt = (unsigned *)((float *)p.part + (size_t)p.n_heads * p.n_split * ((size_t)hd + 2)) + kvh;
    const int ns = min(p.n_split, pos / PPN_ATTN_MIN_SPAN + 1); // this step's splits: the passes and merge take it
    if (j >= ns) return;
    int t0, t1;
    ppn_attn_span(pos, ns, j, &t0, &t1);
    const float *qg = (const float *)p.q + (size_t)kvh * G * hd;
    if (p.inv_freq) { // uniform over the grid
        if (t0 <= pos && pos < t1) ppn_attn_rope_row(p, kvh, pos, s_kv);
        __syncthreads();
    }
    // NJ, HP from the sizes alone (uniform over the grid): registers per lane stay bounded whatever G is
    int nj = hd <= 64 ? 2 : hd <= 128 ? 4 : 8, hp = G == 1 ? 1 : G == 2 ? 2 : G <= 4 ? 4 : PPN_ATTN_MAXG;
    if (nj == 2) ppn_attn_by_hp<2, KD>(p, qg, pos, hp, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    else if (nj == 4) ppn_attn_by_hp<4, KD>(p, qg, pos, hp, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    else ppn_attn_by_hp<PPN_ATTN_MAXJ, KD>(p, qg, pos, hp, kvh, ns, j, t0, t1, s_kv, s_acc, s_m, s_l);
    if (ns == 1) return;
    if (!ppn_attn_arrive(cnt, ns, sm.last)) return;
    ppn_attn_merge(p, ns, kvh * G, G, s_acc, s_acc + PPN_ATTN_WARPS * PPN_ATTN_MAX_SPLIT);
    if (threadIdx.x == 0) *cnt = 0; // every block of kvh has counted; the next launch starts from 0
}

template <int KD> __device__ __forceinline__ void ppn_attn_kernel(const ppn_kp_attn &p)
{
    __shared__ ppn_attn_smem sm;
    PPN_PDL_ENTER();
    ppn_attn_body<KD>(p, ppn_hdr(p.hdr)->pos, blockIdx.x, blockIdx.y, sm);
}

// Batched decode (ppn_kp_attn_batch): CTA (kvh, j, i) is CTA (kvh, j) of row i's decode attention, with row i's q,
// out, scratch, table and position, so a row's bits are ppn_k_attn's whatever the other rows are.
// Row i's params (its q, out, scratch and table) and position (*pos); p.inv_freq as the op set it.
__device__ __forceinline__ ppn_kp_attn ppn_attn_batch_row(const ppn_kp_attn_batch &pb, int i, int32_t *pos)
{
    const ppn_kseg seg = ((const ppn_kseg *)pb.segs)[i];
    ppn_kp_attn p = pb.a;
    const size_t hd = (size_t)p.head_dim;
    p.q += (uint64_t)i * (uint64_t)(p.n_heads + 2 * p.n_kv) * hd * sizeof(float);
    p.out += (uint64_t)i * (uint64_t)p.n_heads * hd * (p.odt != PPN_DTYPE_F32 ? 2u : 4u);
    p.part += (uint64_t)i * ((uint64_t)p.n_heads * p.n_split * (hd + 2) * sizeof(float) + (uint64_t)p.n_heads * 4u);
    p.tbl = seg.tbl;
    *pos = seg.pos;
    return p;
}

template <int KD> __device__ __forceinline__ void ppn_attn_batch_kernel(const ppn_kp_attn_batch &pb)
{
    __shared__ ppn_attn_smem sm;
    PPN_PDL_ENTER();
    int32_t pos;
    const ppn_kp_attn p = ppn_attn_batch_row(pb, blockIdx.z, &pos);
    ppn_attn_body<KD>(p, pos, blockIdx.x, blockIdx.y, sm);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn_batch(const ppn_kp_attn_batch p)
{
    ppn_attn_batch_kernel<PPN_DTYPE_F32>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn_batch_bf16(const ppn_kp_attn_batch_bf16 p)
{
    ppn_attn_batch_kernel<PPN_DTYPE_BF16>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn_batch_f16(const ppn_kp_attn_batch_f16 p)
{
    ppn_attn_batch_kernel<PPN_DTYPE_F16>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn(const ppn_kp_attn p)
{
    ppn_attn_kernel<PPN_DTYPE_F32>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn_bf16(const ppn_kp_attn_bf16 p)
{
    ppn_attn_kernel<PPN_DTYPE_BF16>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATTN_WARPS, 2) ppn_k_attn_f16(const ppn_kp_attn_f16 p)
{
    ppn_attn_kernel<PPN_DTYPE_F16>(p);
}

// ---------------------------------------------------------------------------------------------------------
// elementwise: the grid covers n, one element per thread

extern "C" __global__ void ppn_k_swiglu(const ppn_kp_swiglu p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    ((float *)p.out)[i] = ppn_swish(((const float *)p.gate)[i]) * ((const float *)p.up)[i];
}

extern "C" __global__ void ppn_k_add(const ppn_kp_add p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    ((float *)p.out)[i] = ((const float *)p.a)[i] + ((const float *)p.b)[i];
}

// ---------------------------------------------------------------------------------------------------------
// matmat: one warp per row, one register accumulator per token; each lane sums its strided columns in order,
// then a fixed xor tree: deterministic, and independent of the grid.

extern "C" __global__ void ppn_k_matmat(const ppn_kp_matmat p)
{
    PPN_PDL_ENTER();
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
    PPN_PDL_ENTER();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    ppn_step_hdr v = p.v;
    if (p.tok) v.token = *(const int32_t *)p.tok;
    *(ppn_step_hdr *)p.hdr = v;
}

// No op launches fill: the device-layer tests take it as their simplest write (kparams.h).
extern "C" __global__ void ppn_k_fill(const ppn_kp_fill p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.n) return;
    ((uint32_t *)p.out)[i] = p.value;
}

// ---------------------------------------------------------------------------------------------------------
// argmax: one block. (value, index) pairs are totally ordered (larger value, then lower index), so the winner
// does not depend on the reduction shape. A NaN or an infinity anywhere poisons the result: it is -1, which the
// host reports as non-finite logits (a greedy step never feeds a token chosen among them; the embedding reads
// zeros for -1). During the reduction -1 is "no candidate" and PPN_ARGMAX_POISON a value that was not finite,
// which wins over every candidate.

#define PPN_ARGMAX_POISON (-2)

__device__ __forceinline__ void ppn_argmax_take(float &bv, int &bi, float v, int i)
{
    if (i == -1 || bi == PPN_ARGMAX_POISON) return;
    if (i == PPN_ARGMAX_POISON) {
        bi = PPN_ARGMAX_POISON;
        return;
    }
    if (bi < 0 || v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

// What the kernels write: the winner, or -1 (no finite winner: a value was NaN or infinite).
__device__ __forceinline__ int ppn_argmax_result(int bi) { return bi < 0 ? -1 : bi; }

__device__ __forceinline__ void ppn_argmax_warp(float &bv, int &bi)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        float v = __shfl_xor_sync(PPN_FULL_MASK, bv, m);
        int i = __shfl_xor_sync(PPN_FULL_MASK, bi, m);
        ppn_argmax_take(bv, bi, v, i);
    }
}

// x[i] as a candidate: its index, or PPN_ARGMAX_POISON where it is not finite.
__device__ __forceinline__ void ppn_argmax_elem(float &bv, int &bi, float v, int i)
{
    ppn_argmax_take(bv, bi, v, isfinite(v) ? i : PPN_ARGMAX_POISON);
}

// The block's winner of every thread's (bv, bi), on every thread of warp 0 (the others get -1).
__device__ void ppn_argmax_block_reduce(float &bv, int &bi)
{
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    ppn_argmax_warp(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_v[warp] = bv, s_i[warp] = bi;
    __syncthreads();
    bv = lane < (int)(blockDim.x >> 5) ? s_v[lane] : 0.0f;
    bi = lane < (int)(blockDim.x >> 5) ? s_i[lane] : -1;
    if (warp == 0) ppn_argmax_warp(bv, bi);
    else bi = -1;
}

// The block's (value, index) winner, on every thread of warp 0 (the others return -1). Elements
// i0, i0 + stride, ... of x.
__device__ void ppn_argmax_block(const float *x, int n, int i0, int stride, float &bv, int &bi)
{
    bv = 0.0f, bi = -1;
    for (int i = i0; i < n; i += stride) ppn_argmax_elem(bv, bi, x[i], i);
    ppn_argmax_block_reduce(bv, bi);
}

extern "C" __global__ void ppn_k_argmax(const ppn_kp_argmax p)
{
    PPN_PDL_ENTER();
    __shared__ int s_last;
    float bv;
    int bi;
    if (!p.part) { // one block
        ppn_argmax_block((const float *)p.x, p.n, threadIdx.x, blockDim.x, bv, bi);
        if (threadIdx.x == 0) *(int32_t *)p.out = ppn_argmax_result(bi);
        return;
    }
    ppn_argmax_block((const float *)p.x, p.n, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x, bv, bi);
    float *rv = (float *)p.part;
    int *ri = (int *)(rv + p.nblk);
    unsigned *cnt = (unsigned *)(ri + p.nblk);
    if (threadIdx.x == 0) {
        rv[blockIdx.x] = bv, ri[blockIdx.x] = bi;
        __threadfence(); // release the record before counting in
        s_last = atomicAdd(cnt, 1u) == (unsigned)(p.nblk - 1);
        __threadfence(); // acquire: the records read below come after every block's count
    }
    __syncthreads();
    if (!s_last) return;
    bv = 0.0f, bi = -1;
    for (int b = threadIdx.x; b < p.nblk; b += blockDim.x) {
        ppn_argmax_take(bv, bi, __ldcg(rv + b), __ldcg(ri + b)); // a block's -1: none; POISON: poisoned
    }
    __syncthreads(); // the block reduction's shared arrays are reused
    __shared__ float s_v[32];
    __shared__ int s_i[32];
    ppn_argmax_warp(bv, bi);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) s_v[warp] = bv, s_i[warp] = bi;
    __syncthreads();
    if (warp != 0) return;
    bv = lane < (int)(blockDim.x >> 5) ? s_v[lane] : 0.0f;
    bi = lane < (int)(blockDim.x >> 5) ? s_i[lane] : -1;
    ppn_argmax_warp(bv, bi);
    if (lane == 0) *(int32_t *)p.out = ppn_argmax_result(bi), *cnt = 0; // the next launch starts from 0
}
