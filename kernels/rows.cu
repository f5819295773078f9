// rows.cu - the many-rows kernels (kparams.h, "Many rows per launch"; ops: kernels/ops_rows.c): a prefill
// chunk's c rows per launch. Each row computes the decode kernel's formula (ppn_kernels.cu): the rotary takes
// the same angle and rotation expressions (bit-identical to decode's rope on the GPU), the KV store rounds to
// nearest even, the norms sum in f32 with fmaf over fixed strided subsets and fixed shuffle trees.
//
// Compiled in one translation unit with ppn_kernels.cu (CMakeLists), and alone (nvcc -cubin rows.cu): so its
// helpers carry their own ppn_rw_ names and never lean on ppn_kernels.cu's.
//
// Determinism: no atomics; every reduction has a fixed shape for a given launch, and ops_rows.c picks the
// geometry from the sizes alone.
//
// Geometry contract with ops_rows.c: the row index is blockIdx.x (elementwise kernels take column blocks in
// blockIdx.y); rmsnorm any whole-warp block; head norms 8 warps a block, a warp per (row, head); rope a block per
// (row, head); attention 4 warps (PPN_RA_WARPS) with the dynamic shared memory ops_rows.c computes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kernels/kparams.h"

#define PPN_RW_MASK 0xffffffffu

// ---------------------------------------------------------------------------------------------------------
// helpers (the expressions of ppn_kernels.cu's, under their own names)

__device__ __forceinline__ void ppn_rw_pdl_enter(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ float ppn_rw_wload(uint64_t w, int wdt, size_t i)
{
    if (wdt == PPN_DTYPE_BF16) return __bfloat162float(__ushort_as_bfloat16(((const unsigned short *)w)[i]));
    if (wdt == PPN_DTYPE_F16) return __half2float(__ushort_as_half(((const unsigned short *)w)[i]));
    return ((const float *)w)[i];
}

__device__ __forceinline__ void ppn_rw_kv_put(uint64_t c, int kd, size_t i, float v)
{
    if (kd == PPN_DTYPE_BF16) ((__nv_bfloat16 *)c)[i] = __float2bfloat16_rn(v);
    else if (kd == PPN_DTYPE_F16) ((__half *)c)[i] = __float2half_rn(v);
    else ((float *)c)[i] = v;
}

__device__ __forceinline__ float ppn_rw_warp_sum(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(PPN_RW_MASK, v, m);
    return v;
}

__device__ __forceinline__ float ppn_rw_warp_max(float v)
{
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(PPN_RW_MASK, v, m));
    return v;
}

// Block sum (every thread gets the same bits); sh: 32 floats.
__device__ float ppn_rw_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ppn_rw_warp_sum(v);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    t = ppn_rw_warp_sum(t);
    __syncthreads();
    return t;
}

// The rotary: ppn_rope_angle's and ppn_rope_rot's expressions (ppn_kernels.cu), so the bits are decode's.
__device__ __forceinline__ void ppn_rw_rope_angle(int32_t pos, float inv, float *s, float *c)
{
    sincosf(__fmul_rn((float)pos, inv), s, c);
}

__device__ __forceinline__ float ppn_rw_rope_rot(float self, float other, float c, float s, bool second)
{
    float xc = __fmul_rn(self, c), os = __fmul_rn(other, s);
    return second ? __fadd_rn(xc, os) : __fsub_rn(xc, os);
}

// ---------------------------------------------------------------------------------------------------------
// embed rows: block (row, column block)

extern "C" __global__ void ppn_k_embed_rows(const ppn_kp_embed_rows p)
{
    ppn_rw_pdl_enter();
    int i = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= p.dim) return;
    int32_t tok = ((const int32_t *)p.tok)[i];
    float *out = (float *)p.out + (size_t)i * p.dim;
    out[d] = tok < 0 || tok >= p.vocab ? 0.0f : ppn_rw_wload(p.table, p.wdt, (size_t)tok * p.dim + d);
}

// ---------------------------------------------------------------------------------------------------------
// rmsnorm rows: a block per row (out may alias in: the sum is taken before any write, behind the barrier)

extern "C" __global__ void ppn_k_rmsnorm_rows(const ppn_kp_rmsnorm_rows p)
{
    __shared__ float sh[32];
    ppn_rw_pdl_enter();
    const float *x = (const float *)p.in + (size_t)blockIdx.x * p.n;
    float *out = (float *)p.out + (size_t)blockIdx.x * p.n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    float var = ppn_rw_block_sum(ss, sh) / (float)p.n;
    float r = 1.0f / sqrtf(var + p.eps);
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) out[i] = (x[i] * r) * ppn_rw_wload(p.w, p.wdt, (size_t)i);
}

// ---------------------------------------------------------------------------------------------------------
// head norms rows: a warp per (row, head), item = row * n_heads + head

extern "C" __global__ void ppn_k_head_rmsnorm_rows(const ppn_kp_head_rmsnorm_rows p)
{
    ppn_rw_pdl_enter();
    int lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= (long)p.c * p.n_heads) return; // whole warps leave together
    int i = (int)(item / p.n_heads), h = (int)(item - (long)i * p.n_heads), hd = p.head_dim;
    float *x = (float *)p.x + (size_t)i * p.stride + (size_t)(p.h0 + h) * hd;
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) ss = fmaf(x[d], x[d], ss);
    float var = ppn_rw_warp_sum(ss) / (float)hd;
    float r = 1.0f / sqrtf(var + p.eps);
    for (int d = lane; d < hd; d += 32) x[d] = (x[d] * r) * ppn_rw_wload(p.w, p.wdt, (size_t)d);
}

// ---------------------------------------------------------------------------------------------------------
// rope + KV store rows: block (row i, head h of the n_q + n_kv rotated ones); a k head's block also stores its
// rotated pairs and its v head into the caches at pos0 + i (ppn_k_rope with caches, per row)

extern "C" __global__ void ppn_k_rope_kv_rows(const ppn_kp_rope_kv_rows p)
{
    ppn_rw_pdl_enter();
    const int hd = p.head_dim, half = hd / 2, i = blockIdx.x, h = blockIdx.y, nqk = p.n_q + p.n_kv;
    float *row = (float *)p.qkv + (size_t)i * (size_t)(nqk + p.n_kv) * hd, *xh = row + (size_t)h * hd;
    const float *inv = (const float *)p.inv_freq;
    const int32_t pos = p.pos0 + i;
    const int kh = h - p.n_q;
    size_t dst = kh >= 0 ? ((size_t)kh * (size_t)p.ctx + (size_t)pos) * (size_t)hd : 0;
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
        float s, c;
        ppn_rw_rope_angle(pos, inv[k], &s, &c);
        int a = p.interleaved ? 2 * k : k, b = p.interleaved ? 2 * k + 1 : k + half;
        float x0 = xh[a], x1 = xh[b];
        float y0 = ppn_rw_rope_rot(x0, x1, c, s, false), y1 = ppn_rw_rope_rot(x1, x0, c, s, true);
        xh[a] = y0, xh[b] = y1;
        if (kh >= 0) ppn_rw_kv_put(p.kc, p.kvdt, dst + a, y0), ppn_rw_kv_put(p.kc, p.kvdt, dst + b, y1);
    }
    if (kh < 0) return;
    const float *vh = row + (size_t)(nqk + kh) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) ppn_rw_kv_put(p.vc, p.kvdt, dst + d, vh[d]);
}

// ---------------------------------------------------------------------------------------------------------
// swiglu rows: block (row, column block)

extern "C" __global__ void ppn_k_swiglu_rows(const ppn_kp_swiglu_rows p)
{
    ppn_rw_pdl_enter();
    int i = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= p.n) return;
    const float *gu = (const float *)p.gu + (size_t)i * 2 * p.n;
    float g = gu[d], u = gu[p.n + d];
    float s = g / (1.0f + expf(-g));
    ((float *)p.out)[(size_t)i * p.n + d] = s * u;
}

// ---------------------------------------------------------------------------------------------------------
// attention rows, SIMT path (f32 caches; any even head_dim <= 256; any cache dtype): block (row i, KV head g).
// The block stages tiles of PPN_RA_TILE positions of k (widened to f32, rows padded by a float so lane t reading
// row t hits its own bank) and v in shared memory; warp w takes query heads w, w + 4, ... of the group. Per tile
// lane t scores position t (a dot in dim order with fmaf), the warp keeps an online softmax (running max, sum,
// rescaled accumulators: lane l holds dims l + 32 j) and adds the tile's weighted v rows in position order.

#define PPN_RA_WARPS 4
#define PPN_RA_TILE 32
#define PPN_RA_MAXJ 8 // head_dim <= 256

template <int KD> __device__ __forceinline__ float ppn_rw_kv_at(uint64_t c, size_t i)
{
    if constexpr (KD == PPN_DTYPE_F32) return __ldg((const float *)c + i);
    else if constexpr (KD == PPN_DTYPE_BF16) return __bfloat162float(__ushort_as_bfloat16(__ldg((const unsigned short *)c + i)));
    else return __half2float(__ushort_as_half(__ldg((const unsigned short *)c + i)));
}

template <int KD, int NJ> __device__ void ppn_rw_attn_simt(const ppn_kp_attn_rows &p)
{
    extern __shared__ float ppn_rw_smem[];
    const int hd = p.head_dim, hs = hd + 1, i = blockIdx.x, kvh = blockIdx.y, G = p.n_heads / p.n_kv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *s_k = ppn_rw_smem, *s_v = s_k + PPN_RA_TILE * hs, *s_q = s_v + PPN_RA_TILE * hd + warp * hd;
    const int npos = p.pos0 + i + 1; // positions 0 .. pos0 + i
    const size_t kv0 = (size_t)kvh * (size_t)p.ctx * hd;
    const float *qrow = (const float *)p.qkv + (size_t)i * (size_t)(p.n_heads + 2 * p.n_kv) * hd;
    for (int h0 = kvh * G; h0 < (kvh + 1) * G; h0 += PPN_RA_WARPS) { // a round: warp w takes head h0 + w
        const int h = h0 + warp;
        const bool on = h < (kvh + 1) * G; // warp-uniform; an idle warp still stages tiles
        if (on)
            for (int d = lane; d < hd; d += 32) s_q[d] = qrow[(size_t)h * hd + d];
        float acc[NJ], m = -INFINITY, l = 0.0f;
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j] = 0.0f;
        for (int t0 = 0; t0 < npos; t0 += PPN_RA_TILE) {
            const int nt = min(PPN_RA_TILE, npos - t0);
            __syncthreads(); // the previous tile (and s_q) is consumed / written
            for (int x = threadIdx.x; x < nt * hd; x += blockDim.x) {
                int t = x / hd, d = x - t * hd;
                size_t at = kv0 + (size_t)(t0 + t) * hd + d;
                s_k[t * hs + d] = ppn_rw_kv_at<KD>(p.kc, at);
                s_v[t * hd + d] = ppn_rw_kv_at<KD>(p.vc, at);
            }
            __syncthreads();
            if (!on) continue;
            float sc = -INFINITY;
            if (lane < nt) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot = fmaf(s_q[d], s_k[lane * hs + d], dot);
                sc = dot * p.scale;
            }
            float m_new = fmaxf(m, ppn_rw_warp_max(sc)); // finite: lane 0 always scores
            float corr = expf(m - m_new), e = lane < nt ? expf(sc - m_new) : 0.0f; // expf(-inf) = 0
            l = fmaf(l, corr, ppn_rw_warp_sum(e));
            m = m_new;
#pragma unroll
            for (int j = 0; j < NJ; j++) acc[j] *= corr;
            for (int t = 0; t < nt; t++) {
                float w = __shfl_sync(PPN_RW_MASK, e, t);
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    int d = lane + 32 * j;
                    if (d < hd) acc[j] = fmaf(w, s_v[t * hd + d], acc[j]);
                }
            }
        }
        if (on) {
            float *out = (float *)p.out + (size_t)i * p.n_heads * hd + (size_t)h * hd;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int d = lane + 32 * j;
                if (d < hd) out[d] = acc[j] / l;
            }
        }
        __syncthreads(); // s_q of the next round
    }
}

template <int KD> __device__ void ppn_rw_attn_simt_by_hd(const ppn_kp_attn_rows &p)
{
    if (p.head_dim <= 64) ppn_rw_attn_simt<KD, 2>(p);
    else if (p.head_dim <= 128) ppn_rw_attn_simt<KD, 4>(p);
    else ppn_rw_attn_simt<KD, PPN_RA_MAXJ>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS) ppn_k_attn_rows(const ppn_kp_attn_rows p)
{
    ppn_rw_pdl_enter();
    ppn_rw_attn_simt_by_hd<PPN_DTYPE_F32>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS) ppn_k_attn_rows_bf16(const ppn_kp_attn_rows_bf16 p)
{
    ppn_rw_pdl_enter();
    ppn_rw_attn_simt_by_hd<PPN_DTYPE_BF16>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS) ppn_k_attn_rows_f16(const ppn_kp_attn_rows_f16 p)
{
    ppn_rw_pdl_enter();
    ppn_rw_attn_simt_by_hd<PPN_DTYPE_F16>(p);
}
