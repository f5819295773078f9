// rows.cu - the many-rows kernels (kparams.h, "Many rows per launch"; ops: kernels/ops_rows.c): a prefill
// chunk's c rows per launch. Each row computes the decode kernel's formula (ppn_kernels.cu): the rotary takes
// the same angle and rotation expressions (bit-identical to decode's rope on the GPU), the KV store rounds to
// nearest even, the norms sum in f32 with fmaf over fixed strided subsets and fixed shuffle trees.
//
// Compiled in one translation unit with ppn_kernels.cu (CMakeLists), and alone (nvcc -cubin rows.cu): the helpers
// it shares with the decode kernels (weights widened, caches stored, warp and block sums, the rotary, PDL) come
// from kernels/kdev.cuh, so a row's rotary and store are decode's by construction; its own carry ppn_rw_ names.
//
// Determinism: no atomics; every reduction has a fixed shape for a given launch, and ops_rows.c picks the
// geometry from the sizes alone.
//
// Geometry contract with ops_rows.c: the row index is blockIdx.x (elementwise kernels take column blocks in
// blockIdx.y); rmsnorm any whole-warp block; head norms 8 warps a block, a warp per (row, head); rope a block per
// row; attention 4 warps (PPN_RA_WARPS) with the dynamic shared memory ops_rows.c computes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kernels/kparams.h"
#include "kernels/kdev.cuh"

// ---------------------------------------------------------------------------------------------------------
// embed rows: block (row, column block)

extern "C" __global__ void ppn_k_embed_rows(const ppn_kp_embed_rows p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    if (d >= p.dim) return;
    int32_t tok = ((const int32_t *)p.tok)[i];
    float *out = (float *)p.out + (size_t)i * p.dim;
    out[d] = tok < 0 || tok >= p.vocab ? 0.0f : ppn_wload(p.table, p.wdt, (size_t)tok * p.dim + d);
}

// ---------------------------------------------------------------------------------------------------------
// rmsnorm rows: a block per row (out may alias in: the sum is taken before any write, behind the barrier)

extern "C" __global__ void ppn_k_rmsnorm_rows(const ppn_kp_rmsnorm_rows p)
{
    __shared__ float sh[32];
    PPN_PDL_ENTER();
    const float *x = (const float *)p.in + (size_t)blockIdx.x * p.n;
    float *out = (float *)p.out + (size_t)blockIdx.x * p.n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
    float var = ppn_block_sum(ss, sh) / (float)p.n;
    float r = 1.0f / sqrtf(var + p.eps);
    if (p.odt != PPN_DTYPE_F32) { // for the bf16 GEMM after it (its layout: odt): rounded as that GEMM rounds
        __nv_bfloat16 *o16 = (__nv_bfloat16 *)p.out + (size_t)blockIdx.x * p.n;
        for (int i = threadIdx.x; i < p.n; i += blockDim.x)
            o16[PPN_X16_AT(p.odt, i)] = __float2bfloat16_rn((x[i] * r) * ppn_wload(p.w, p.wdt, (size_t)i));
        return;
    }
    for (int i = threadIdx.x; i < p.n; i += blockDim.x) out[i] = (x[i] * r) * ppn_wload(p.w, p.wdt, (size_t)i);
}

// ---------------------------------------------------------------------------------------------------------
// head norms rows: a warp per (row, head), item = row * n_heads + head

extern "C" __global__ void ppn_k_head_rmsnorm_rows(const ppn_kp_head_rmsnorm_rows p)
{
    PPN_PDL_ENTER();
    int lane = threadIdx.x & 31;
    long item = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (item >= (long)p.c * p.n_heads) return; // whole warps leave together
    int i = (int)(item / p.n_heads), h = (int)(item - (long)i * p.n_heads), hd = p.head_dim;
    float *x = (float *)p.x + (size_t)i * p.stride + (size_t)(p.h0 + h) * hd;
    float ss = 0.0f;
    for (int d = lane; d < hd; d += 32) ss = fmaf(x[d], x[d], ss);
    float var = ppn_warp_sum(ss) / (float)hd;
    float r = 1.0f / sqrtf(var + p.eps);
    for (int d = lane; d < hd; d += 32) x[d] = (x[d] * r) * ppn_wload(p.w, p.wdt, (size_t)d);
}

// ---------------------------------------------------------------------------------------------------------
// rope + KV store rows: a block per row i. Thread t takes pair k of head h for the (h, k) = divmod(x, half) with
// x = t, t + blockDim, ...: with blockDim a multiple of half (ops_rows.c sees to it where it can) k never changes,
// so its angle (sincosf: the row's costliest step) is computed once for all the heads. A k head's rotated pair is
// also stored into kc at pos0 + i, and the row's v heads into vc (ppn_k_rope with caches, per row).

// Row i of the chunk (or of a batch) at position pos through table tbl; a position the table maps nowhere is
// rotated and stores nothing.
template <typename P> __device__ __forceinline__ void ppn_rw_rope_kv_row(const P &p, int i, int32_t pos, uint64_t tbl)
{
    const int hd = p.head_dim, half = hd / 2, nqk = p.n_q + p.n_kv;
    float *row = (float *)p.qkv + (size_t)i * (size_t)(nqk + p.n_kv) * hd;
    const float *inv = (const float *)p.inv_freq;
    const int32_t pp = ppn_kv_pool_pos((const int32_t *)tbl, p.block_log2, p.cap, pos);
    const size_t dst0 = (size_t)(pp < 0 ? 0 : pp) * (size_t)hd; // pool row of KV head 0; head g adds g cap hd
    int kk = -1;
    float s = 0.0f, c = 1.0f;
    for (int x = threadIdx.x; x < nqk * half; x += blockDim.x) {
        int h = x / half, k = x - h * half;
        if (k != kk) ppn_rope_angle(pos, inv[k], &s, &c), kk = k;
        float *xh = row + (size_t)h * hd;
        int a = p.interleaved ? 2 * k : k, b = p.interleaved ? 2 * k + 1 : k + half;
        float x0 = xh[a], x1 = xh[b];
        float y0 = ppn_rope_rot(x0, x1, c, s, false), y1 = ppn_rope_rot(x1, x0, c, s, true);
        xh[a] = y0, xh[b] = y1;
        const int kh = h - p.n_q;
        if (kh >= 0 && pp >= 0) {
            size_t dst = dst0 + (size_t)kh * (size_t)p.cap * hd;
            ppn_kv_put(p.kc, p.kvdt, dst + a, y0), ppn_kv_put(p.kc, p.kvdt, dst + b, y1);
        }
    }
    if (pp < 0) return;
    const float *v = row + (size_t)nqk * hd;
    for (int x = threadIdx.x; x < p.n_kv * hd; x += blockDim.x) {
        int g = x / hd, d = x - g * hd;
        ppn_kv_put(p.vc, p.kvdt, dst0 + (size_t)g * (size_t)p.cap * hd + d, v[x]);
    }
}

extern "C" __global__ void ppn_k_rope_kv_rows(const ppn_kp_rope_kv_rows p)
{
    PPN_PDL_ENTER();
    ppn_rw_rope_kv_row(p, blockIdx.x, p.pos0 + (int)blockIdx.x, p.tbl);
}

// Batched decode: row i at segs[i].pos through segs[i].tbl (the chunk's row with a position and table of its own).
extern "C" __global__ void ppn_k_rope_kv_batch(const ppn_kp_rope_kv_batch p)
{
    PPN_PDL_ENTER();
    const ppn_kseg seg = ((const ppn_kseg *)p.segs)[blockIdx.x];
    ppn_rw_rope_kv_row(p, blockIdx.x, seg.pos, seg.tbl);
}

// ---------------------------------------------------------------------------------------------------------
// swiglu rows: block (row, column block)

extern "C" __global__ void ppn_k_swiglu_rows(const ppn_kp_swiglu_rows p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x, d = blockIdx.y * blockDim.x + threadIdx.x;
    const float *gu = (const float *)p.gu + (size_t)i * 2 * p.n;
    float *out = (float *)p.out + (size_t)i * p.n;
    __nv_bfloat16 *o16 = (__nv_bfloat16 *)p.out + (size_t)i * p.n; // odt bf16 (for the bf16 GEMM after it)
    if (p.vec) { // four columns a thread, 16-byte loads (n % 4 == 0, rows aligned: the op's check)
        if (4 * d >= p.n) return;
        float4 g = __ldg((const float4 *)gu + d), u = __ldg((const float4 *)(gu + p.n) + d);
        float4 v = make_float4(ppn_swish(g.x) * u.x, ppn_swish(g.y) * u.y, ppn_swish(g.z) * u.z, ppn_swish(g.w) * u.w);
        if (p.odt != PPN_DTYPE_F32) { // pairs stay together in either bf16 layout (PPN_X16_AT)
            __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
            *(__nv_bfloat162 *)(o16 + PPN_X16_AT(p.odt, 4 * d)) = lo;
            *(__nv_bfloat162 *)(o16 + PPN_X16_AT(p.odt, 4 * d + 2)) = hi;
        } else {
            ((float4 *)out)[d] = v;
        }
        return;
    }
    if (d >= p.n) return;
    float v = ppn_swish(gu[d]) * gu[p.n + d];
    if (p.odt != PPN_DTYPE_F32) o16[PPN_X16_AT(p.odt, d)] = __float2bfloat16_rn(v);
    else out[d] = v;
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
    const size_t kv0 = (size_t)kvh * (size_t)p.cap * hd;
    const int32_t *tbl = (const int32_t *)p.tbl; // the block table (kparams.h); NULL: identity
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
                int32_t pp = ppn_kv_pool_pos(tbl, p.block_log2, p.cap, t0 + t); // -1: a row of zeros
                size_t at = kv0 + (size_t)(pp < 0 ? 0 : pp) * hd + d;
                s_k[t * hs + d] = pp < 0 ? 0.0f : ppn_rw_kv_at<KD>(p.kc, at);
                s_v[t * hd + d] = pp < 0 ? 0.0f : ppn_rw_kv_at<KD>(p.vc, at);
            }
            __syncthreads();
            if (!on) continue;
            float sc = -INFINITY;
            if (lane < nt) {
                float dot = 0.0f;
                for (int d = 0; d < hd; d++) dot = fmaf(s_q[d], s_k[lane * hs + d], dot);
                sc = dot * p.scale;
            }
            float m_new = fmaxf(m, ppn_warp_max(sc)); // finite: lane 0 always scores
            float corr = expf(m - m_new), e = lane < nt ? expf(sc - m_new) : 0.0f; // expf(-inf) = 0
            l = fmaf(l, corr, ppn_warp_sum(e));
            m = m_new;
#pragma unroll
            for (int j = 0; j < NJ; j++) acc[j] *= corr;
            for (int t = 0; t < nt; t++) {
                float w = __shfl_sync(PPN_FULL_MASK, e, t);
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    int d = lane + 32 * j;
                    if (d < hd) acc[j] = fmaf(w, s_v[t * hd + d], acc[j]);
                }
            }
        }
        if (on) {
            const size_t o0 = (size_t)i * p.n_heads * hd, c0 = (size_t)h * hd;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                int d = lane + 32 * j;
                if (d >= hd) continue;
                float v = acc[j] / l;
                if (p.odt != PPN_DTYPE_F32) // for the o GEMM on bf16 x: rounded as that GEMM rounds the f32
                    ((__nv_bfloat16 *)p.out)[o0 + PPN_X16_AT(p.odt, c0 + d)] = __float2bfloat16_rn(v);
                else
                    ((float *)p.out)[o0 + c0 + d] = v;
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

// ---------------------------------------------------------------------------------------------------------
// attention rows on tensor cores (bf16 / f16 caches, head_dim HD = 64 or 128): flash attention with mma.sync
// m16n8k16 (f32 accumulators). A block takes KV head g and GB of its query heads (GB = ppn_rw_tc_gb: the largest
// power of two dividing the group, at most 16) for QP = 64 / GB consecutive query positions: its 64 rows are
// (position, head) pairs, row r = position r / GB, head r % GB, so each KV tile staged in shared memory serves
// every query head that shares it. Warp w owns rows 16 w .. 16 w + 15 and keeps their q (rounded to the cache's
// dtype) as A fragments in registers for the whole sweep. The block walks KV tiles of 64 positions from 0 to its
// last row's position (causal: later tiles hold nothing it attends), k and v double-buffered through cp.async
// (positions past the block's last one zero-filled; 16-byte chunks XOR-swizzled by row so ldmatrix is
// conflict-free). Per tile: S = q K^T (f32), scaled by scale log2 e, masked (position > the row's: -inf), an online
// softmax per row (running max and sum; a quad of lanes holds a row, its max and sum over xor 1, 2), then O += P V
// with P rounded to the cache's dtype. Every sum has a fixed order (k16 steps in order, tiles in order, the final
// quad sum by xor 1 then 2), so the bits repeat. Rows past the chunk's c are computed at the last row's position
// (finite) and never stored. Blocks go heaviest first: blockIdx.y counts position tiles from the chunk's end.

#define PPN_TC_MINB 2 // blocks an SM holds at least (at 3 the registers spill)
#define PPN_TC_BM 64 // rows (position, head) per block: 4 warps x 16
#define PPN_TC_BN 64 // KV positions per tile

__device__ __forceinline__ int ppn_rw_tc_gb(int group)
{
    int gb = 1;
    while (gb < 16 && group % (2 * gb) == 0) gb *= 2;
    return gb;
}

template <int KD> __device__ __forceinline__ uint32_t ppn_rw_pack2(float lo, float hi)
{
    if constexpr (KD == PPN_DTYPE_BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
}

template <int KD> __device__ __forceinline__ void ppn_rw_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if constexpr (KD == PPN_DTYPE_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ppn_rw_ldsm4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ppn_rw_ldsm4t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 16 bytes global -> shared, zero-filled when !on (src is then not read).
__device__ __forceinline__ void ppn_rw_cp16(uint32_t dst, const void *src, bool on)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(on ? 16 : 0) : "memory");
}

__device__ __forceinline__ void ppn_rw_cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N> __device__ __forceinline__ void ppn_rw_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Byte offset of 16-byte chunk ch of row n in a [rows][HD] tile of 2-byte elements, swizzled.
template <int HD> __device__ __forceinline__ uint32_t ppn_rw_swz(int n, int ch)
{
    return (uint32_t)(n * HD * 2 + ((ch ^ (n & 7)) << 4));
}

// KV tile j (positions j BN .. j BN + BN - 1 of KV head kvh, those >= kv_end or mapped nowhere zero-filled) into
// stage sk, sv. Each row's address goes through the block table (a block may be as short as one position).
template <int HD>
__device__ __forceinline__ void ppn_rw_tc_load(const ppn_kp_attn_rows &p, int kvh, int j, int kv_end, uint32_t sk,
                                               uint32_t sv)
{
    constexpr int CH = HD / 8; // 16-byte chunks a row
    const size_t base = (size_t)kvh * (size_t)p.cap * HD;
    const unsigned short *kc = (const unsigned short *)p.kc + base, *vc = (const unsigned short *)p.vc + base;
    const int32_t *tbl = (const int32_t *)p.tbl;
#pragma unroll
    for (int x = threadIdx.x; x < PPN_TC_BN * CH; x += 32 * PPN_RA_WARPS) {
        int n = x / CH, ch = x % CH, t = j * PPN_TC_BN + n;
        int32_t pp = t < kv_end ? ppn_kv_pool_pos(tbl, p.block_log2, p.cap, t) : -1;
        bool on = pp >= 0;
        size_t at = on ? (size_t)pp * HD + ch * 8 : 0;
        uint32_t off = ppn_rw_swz<HD>(n, ch);
        ppn_rw_cp16(sk + off, kc + at, on);
        ppn_rw_cp16(sv + off, vc + at, on);
    }
}

template <int KD, int HD> __device__ void ppn_rw_attn_tc(const ppn_kp_attn_rows &p)
{
    extern __shared__ __align__(16) unsigned char ppn_rw_tc_smem[];
    constexpr int NK = HD / 16, ND = HD / 8, NS = PPN_TC_BN / 8; // k16 steps over dims, n8 tiles of O and of S
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, t4 = lane & 3;
    const int G = p.n_heads / p.n_kv, GB = ppn_rw_tc_gb(G), nsub = G / GB, QP = PPN_TC_BM / GB;
    const int kvh = blockIdx.x / nsub, h_base = kvh * G + (blockIdx.x - kvh * nsub) * GB;
    const int tile = gridDim.y - 1 - blockIdx.y, q0 = tile * QP; // the chunk's rows q0 .. q0 + QP - 1
    const int kv_end = p.pos0 + min(q0 + QP, p.c);               // positions 0 .. kv_end - 1 are attended
    const int p_min = p.pos0 + q0;                               // the block's first row's position
    const size_t qstride = (size_t)(p.n_heads + 2 * p.n_kv) * HD, ostride = (size_t)p.n_heads * HD;
    // this thread's two rows: r = 16 warp + gid (+ 8)
    int qi[2], hh[2], prow[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        int r = 16 * warp + gid + 8 * u;
        qi[u] = q0 + r / GB, hh[u] = h_base + r % GB;
        prow[u] = p.pos0 + min(qi[u], p.c - 1);
    }
    // q as A fragments: reg 0 row gid dims 16k + 2 t4, reg 1 row gid + 8, regs 2, 3 the same at dims + 8
    uint32_t qa[NK][4];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const float *q = (const float *)p.qkv + (size_t)qi[u] * qstride + (size_t)hh[u] * HD;
        bool in = qi[u] < p.c;
#pragma unroll
        for (int k = 0; k < NK; k++) {
            float2 lo = in ? *(const float2 *)(q + 16 * k + 2 * t4) : make_float2(0.0f, 0.0f);
            float2 hi = in ? *(const float2 *)(q + 16 * k + 8 + 2 * t4) : make_float2(0.0f, 0.0f);
            qa[k][u] = ppn_rw_pack2<KD>(lo.x, lo.y);
            qa[k][2 + u] = ppn_rw_pack2<KD>(hi.x, hi.y);
        }
    }
    float o[ND][4];
#pragma unroll
    for (int d = 0; d < ND; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sl2 = p.scale * 1.4426950408889634f; // scores in log2 units: exp(x s) = exp2(x s log2 e)
    const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(ppn_rw_tc_smem);
    constexpr uint32_t TB = PPN_TC_BN * HD * 2; // bytes of one k (or v) tile
    const int nt = (kv_end + PPN_TC_BN - 1) / PPN_TC_BN;
    ppn_rw_tc_load<HD>(p, kvh, 0, kv_end, s0, s0 + TB);
    ppn_rw_cp_commit();
    for (int j = 0; j < nt; j++) {
        const uint32_t sk = s0 + (uint32_t)(j & 1) * 2u * TB, sv = sk + TB;
        if (j + 1 < nt) {
            const uint32_t nk = s0 + (uint32_t)((j + 1) & 1) * 2u * TB;
            ppn_rw_tc_load<HD>(p, kvh, j + 1, kv_end, nk, nk + TB);
            ppn_rw_cp_commit();
            ppn_rw_cp_wait<1>();
        } else {
            ppn_rw_cp_wait<0>();
        }
        __syncthreads();
        // S = q K^T: n8 tile s holds positions 8 s .. 8 s + 7 of the tile
        float sc[NS][4];
#pragma unroll
        for (int s = 0; s < NS; s++) sc[s][0] = sc[s][1] = sc[s][2] = sc[s][3] = 0.0f;
#pragma unroll
        for (int k2 = 0; k2 < NK / 2; k2++)
#pragma unroll
            for (int s = 0; s < NS; s++) {
                uint32_t b[4]; // dims 32 k2 + 8 (lane / 8) of position 8 s + lane % 8
                ppn_rw_ldsm4(b, sk + ppn_rw_swz<HD>(8 * s + (lane & 7), 4 * k2 + (lane >> 3)));
                ppn_rw_mma<KD>(sc[s], qa[2 * k2], b[0], b[1]);
                ppn_rw_mma<KD>(sc[s], qa[2 * k2 + 1], b[2], b[3]);
            }
        // mask, running max and weights: c0, c1 are row gid (u = 0), c2, c3 row gid + 8 (u = 1)
        const int tb = j * PPN_TC_BN;
        const bool mask = tb + PPN_TC_BN - 1 > p_min;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int u = e >> 1, t = tb + 8 * s + 2 * t4 + (e & 1);
                float v = sc[s][e] * sl2;
                if (mask && t > prow[u]) v = -INFINITY;
                sc[s][e] = v;
                mx[u] = fmaxf(mx[u], v);
            }
        float corr[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(PPN_FULL_MASK, mx[u], 1));
            mx[u] = fmaxf(mx[u], __shfl_xor_sync(PPN_FULL_MASK, mx[u], 2)); // finite: position 0 is in tile 0
            corr[u] = exp2f(m[u] - mx[u]);                                 // 0 on the first tile (m = -inf)
            m[u] = mx[u];
            l[u] *= corr[u];
        }
#pragma unroll
        for (int d = 0; d < ND; d++) o[d][0] *= corr[0], o[d][1] *= corr[0], o[d][2] *= corr[1], o[d][3] *= corr[1];
        uint32_t pa[NS / 2][4]; // P as A fragments: k16 step c = S tiles 2c (regs 0, 1) and 2c + 1 (regs 2, 3)
#pragma unroll
        for (int s = 0; s < NS; s++) {
            float e0 = exp2f(sc[s][0] - m[0]), e1 = exp2f(sc[s][1] - m[0]);
            float e2 = exp2f(sc[s][2] - m[1]), e3 = exp2f(sc[s][3] - m[1]);
            l[0] += e0 + e1, l[1] += e2 + e3;
            pa[s / 2][2 * (s & 1)] = ppn_rw_pack2<KD>(e0, e1);
            pa[s / 2][2 * (s & 1) + 1] = ppn_rw_pack2<KD>(e2, e3);
        }
        // O += P V: B fragments of v by ldmatrix.trans (positions 16 c + 8 (lane / 8 % 2) + lane % 8, dims 8 d..)
#pragma unroll
        for (int c = 0; c < NS / 2; c++)
#pragma unroll
            for (int d2 = 0; d2 < ND / 2; d2++) {
                uint32_t b[4];
                ppn_rw_ldsm4t(b, sv + ppn_rw_swz<HD>(16 * c + 8 * ((lane >> 3) & 1) + (lane & 7), 2 * d2 + (lane >> 4)));
                ppn_rw_mma<KD>(o[2 * d2], pa[c], b[0], b[1]);
                ppn_rw_mma<KD>(o[2 * d2 + 1], pa[c], b[2], b[3]);
            }
        __syncthreads(); // this stage is refilled by the next iteration's prefetch
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        l[u] += __shfl_xor_sync(PPN_FULL_MASK, l[u], 1);
        l[u] += __shfl_xor_sync(PPN_FULL_MASK, l[u], 2);
        if (qi[u] >= p.c) continue;
        const size_t o0 = (size_t)qi[u] * ostride, c0 = (size_t)hh[u] * HD + 2 * t4;
        float inv = 1.0f / l[u];
        if (p.odt != PPN_DTYPE_F32) { // a pair stays together in either bf16 layout (its first column even)
            __nv_bfloat16 *out = (__nv_bfloat16 *)p.out + o0;
#pragma unroll
            for (int d = 0; d < ND; d++)
                *(__nv_bfloat162 *)(out + PPN_X16_AT(p.odt, c0 + 8 * d)) =
                    __floats2bfloat162_rn(o[d][2 * u] * inv, o[d][2 * u + 1] * inv);
            continue;
        }
        float *out = (float *)p.out + o0 + c0;
#pragma unroll
        for (int d = 0; d < ND; d++)
            *(float2 *)(out + 8 * d) = make_float2(o[d][2 * u] * inv, o[d][2 * u + 1] * inv);
    }
}

// The 2-byte caches: tensor cores for head_dim 64 and 128 (ops_rows.c gives their geometry), else the SIMT path.
template <int KD> __device__ __forceinline__ void ppn_rw_attn_rows16(const ppn_kp_attn_rows &p)
{
    if (p.head_dim == 64) ppn_rw_attn_tc<KD, 64>(p);
    else if (p.head_dim == 128) ppn_rw_attn_tc<KD, 128>(p);
    else ppn_rw_attn_simt_by_hd<KD>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS) ppn_k_attn_rows(const ppn_kp_attn_rows p)
{
    PPN_PDL_ENTER();
    ppn_rw_attn_simt_by_hd<PPN_DTYPE_F32>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS, PPN_TC_MINB) ppn_k_attn_rows_bf16(const ppn_kp_attn_rows_bf16 p)
{
    PPN_PDL_ENTER();
    ppn_rw_attn_rows16<PPN_DTYPE_BF16>(p);
}

extern "C" __global__ void __launch_bounds__(32 * PPN_RA_WARPS, PPN_TC_MINB) ppn_k_attn_rows_f16(const ppn_kp_attn_rows_f16 p)
{
    PPN_PDL_ENTER();
    ppn_rw_attn_rows16<PPN_DTYPE_F16>(p);
}
