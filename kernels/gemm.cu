// gemm.cu - the prefill GEMM's kernels (ppn_kp_gemm, kparams.h): out[m, rows] = x[m, cols] . W[rows, cols]^T
// (+ bias)(+ res), x and out f32, W in bf16 / f16 / f32.
//
//   ppn_k_gemm        SIMT tiles of 64 x 64 outputs, 256 threads of 4 x 4: any shape, dtype and alignment.
//   ppn_k_gemm_tc_l   tensor cores, f32 accumulators, bf16 / f16 W, cols % 8 == 0, w and x 16-byte aligned;
//   ppn_k_gemm_tc_m   128 x 256, 64 x 128 and 128 x 128 output tiles. sm_90a: warpgroup MMA (gemm_h below).
//   ppn_k_gemm_tc_s   Elsewhere
//                     (the sm_80 SASS, and the PTX a later GPU compiles): mma.sync m16n8k16 (gemm_tc): W streams
//                     into shared memory through a cp.async ring of STAGES k-tiles (32 columns each); x is
//                     loaded as f32 into registers one tile ahead, rounded to W's dtype (cvt.rn) and stored
//                     beside it, so no converted copy of x ever reaches global memory. Fragments come out
//                     through ldmatrix from rows of 64 bytes whose four 16-byte chunks are XOR-swizzled by
//                     (row / 2) % 4, so every 8-row ldmatrix phase hits 8 distinct bank groups.
//
// Few tokens (batched decode): ppn_k_gemm_tc_k, at the end of this file (split K over a cluster).
//
// Determinism: no atomics. Each output of the tiles above is one thread's sum in k order: a fmaf chain (SIMT),
// or one f32 accumulator through k16 steps in k order (tensor cores; the zero-filled tail adds exact zeros).
// On the H200 both tiles, and mma.sync against wgmma, gave the same bits (tests/gpu/test_gpu_gemm.c). CTAs
// walk the output in groups of GEMM_GROUP tile rows (tokens) so that the CTAs resident together share their x
// and W tiles in L2.
//
// Programmatic dependent launch (see ppn_kernels.cu): every kernel lets its successor launch first thing and
// waits for its predecessors before it touches x, bias, res or out; the tensor-core kernels issue their first
// STAGES - 1 weight tiles before the wait (weights are immutable). This file is compiled in one translation
// unit with the other kernels/*.cu, so its helpers are all prefixed gemm_.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "kernels/kparams.h"
#include "kernels/kdev.cuh"

#define GEMM_GROUP 8 // tile rows (of BM tokens) a group of CTAs walks before moving to the next weight tiles

// The (token, weight) tile of this CTA: blockIdx.x walks GEMM_GROUP tile rows down a tile column, then the next
// column; the last group may be shorter.
__device__ __forceinline__ void gemm_tile_at(int pid, int m, int rows, int bm, int bn, int *tm, int *tn)
{
    int nm = (m + bm - 1) / bm, nn = (rows + bn - 1) / bn;
    int group = GEMM_GROUP * nn;
    int first = pid / group * GEMM_GROUP, gm = min(nm - first, GEMM_GROUP), in = pid % group;
    *tm = first + in % gm;
    *tn = in / gm;
}

__device__ __forceinline__ void gemm_tile(int m, int rows, int bm, int bn, int *tm, int *tn)
{
    gemm_tile_at((int)blockIdx.x, m, rows, bm, bn, tm, tn);
}

// out[i, r] = res[i, r] + (v + bias[r]), as the CPU reference adds them (res may alias out).
__device__ __forceinline__ void gemm_store(const ppn_kp_gemm &p, int i, int r, float v)
{
    if (i >= p.m || r >= p.rows) return;
    size_t o = (size_t)i * (size_t)p.rows + (size_t)r;
    if (p.bias) v = v + ppn_wload(p.bias, p.wdt, (size_t)r);
    if (p.res) v = ((const float *)p.res)[o] + v;
    ((float *)p.out)[o] = v;
}

// gemm_store of N outputs (i[j], r[j], v[j]) of one thread, with every res element read before any output is stored.
// res may alias out, so the compiler must keep gemm_store's load of res behind the store before it: one memory round
// trip an output. With the residual, gemm_tc_w on the 8B's o at 128 tokens took 39.74 us a launch that way and 23.49
// reading first (tests/gpu's decode table, an H100, 2026-12-07 08:41 UTC, docs/PERF.md). Reading first gives the same
// result: a thread's N outputs are distinct elements, each read and then written by this thread alone, and the sums
// are gemm_store's (the same adds in the same order).
template <int N>
__device__ __forceinline__ void gemm_store_n(const ppn_kp_gemm &p, const int (&i)[N], const int (&r)[N],
                                             const float (&v)[N])
{
    float rv[N];
#pragma unroll
    for (int j = 0; j < N; j++)
        rv[j] = p.res && i[j] < p.m && r[j] < p.rows ? ((const float *)p.res)[(size_t)i[j] * (size_t)p.rows + (size_t)r[j]]
                                                    : 0.0f;
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (i[j] >= p.m || r[j] >= p.rows) continue;
        float u = v[j];
        if (p.bias) u = u + ppn_wload(p.bias, p.wdt, (size_t)r[j]);
        if (p.res) u = rv[j] + u;
        ((float *)p.out)[(size_t)i[j] * (size_t)p.rows + (size_t)r[j]] = u;
    }
}

// gemm_store_n of 16 outputs of a warpgroup MMA accumulator with tokens as M: acc[4 j .. 4 j + 3] (j < 4) are tokens row,
// row, row + 8, row + 8 at weight rows r + 8 j, r + 8 j + 1, r + 8 j, r + 8 j + 1.
__device__ __forceinline__ void gemm_store_j4(const ppn_kp_gemm &p, int row, int r, const float *acc)
{
    int i[16], c[16];
    float v[16];
#pragma unroll
    for (int a = 0; a < 16; a++)
        i[a] = row + 8 * ((a >> 1) & 1), c[a] = r + 8 * (a >> 2) + (a & 1), v[a] = acc[a];
    gemm_store_n(p, i, c, v);
}

// gemm_store_n of a float4's four outputs.
__device__ __forceinline__ void gemm_store4(const ppn_kp_gemm &p, const int (&i)[4], const int (&r)[4], float4 v)
{
    const float u[4] = {v.x, v.y, v.z, v.w};
    gemm_store_n(p, i, r, u);
}

// ---------------------------------------------------------------------------------------------------------
// SIMT: a 64 x 64 tile per CTA, k-tiles of 16 staged k-major in shared memory; thread (tx, ty) of 16 x 16 owns
// tokens ty + 16 i and weight rows tx + 16 j (i, j < 4), one fmaf chain each in k order.

#define GEMM_SIMT_BK 16
static_assert(PPN_GEMM_SIMT_BM == 64 && PPN_GEMM_SIMT_BN == 64 && PPN_GEMM_SIMT_THREADS == 256,
              "the SIMT kernel's thread layout is 16 x 16 threads of 4 x 4 outputs");

extern "C" __global__ void __launch_bounds__(PPN_GEMM_SIMT_THREADS) ppn_k_gemm(const ppn_kp_gemm p)
{
    __shared__ float xs[GEMM_SIMT_BK][PPN_GEMM_SIMT_BM + 4], ws[GEMM_SIMT_BK][PPN_GEMM_SIMT_BN + 4];
    ppn_pdl_trigger();
    int tm, tn;
    gemm_tile(p.m, p.rows, PPN_GEMM_SIMT_BM, PPN_GEMM_SIMT_BN, &tm, &tn);
    const int tid = (int)threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int i0 = tm * PPN_GEMM_SIMT_BM, r0 = tn * PPN_GEMM_SIMT_BN;
    const float *x = (const float *)p.x;
    float acc[4][4] = {};
    ppn_pdl_wait();
    for (int k0 = 0; k0 < p.cols; k0 += GEMM_SIMT_BK) {
#pragma unroll
        for (int e = 0; e < 4; e++) { // 64 rows x 16 k of each operand: 4 elements a thread, k fastest
            int idx = tid + e * PPN_GEMM_SIMT_THREADS, r = idx >> 4, k = idx & 15, gk = k0 + k;
            float xv = 0.0f, wv = 0.0f;
            if (i0 + r < p.m && gk < p.cols)
                xv = ppn_dt_round(p.wdt, x[(size_t)(i0 + r) * (size_t)p.cols + (size_t)gk]);
            if (r0 + r < p.rows && gk < p.cols) wv = ppn_wload(p.w, p.wdt, (size_t)(r0 + r) * (size_t)p.cols + gk);
            xs[k][r] = xv;
            ws[k][r] = wv;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < GEMM_SIMT_BK; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = xs[k][ty + 16 * i], b[i] = ws[k][tx + 16 * i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) gemm_store(p, i0 + ty + 16 * i, r0 + tx + 16 * j, acc[i][j]);
}

// ---------------------------------------------------------------------------------------------------------
// tensor cores

__device__ __forceinline__ uint32_t gemm_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Byte offset of 16-byte chunk c (0..3) of row r in a tile of 64-byte rows (32 bf16 / f16 of k).
__device__ __forceinline__ uint32_t gemm_swz(int r, int c) { return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }

__device__ __forceinline__ void gemm_cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void gemm_cp_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N> __device__ __forceinline__ void gemm_cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void gemm_ldsm4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// Two floats rounded to the weight dtype, packed low-first as the mma's 16-bit pairs are.
template <bool BF16> __device__ __forceinline__ uint32_t gemm_pack(float lo, float hi)
{
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
}

template <bool BF16> __device__ __forceinline__ void gemm_mma(float *d, const uint32_t *a, const uint32_t *b)
{
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One CTA of BM tokens x BN weight rows; WM x WN warps of (BM / WM) x (BN / WN) outputs each. Shared memory:
// STAGES x [x tile BM x 32 (16-bit), W tile BN x 32], each 64-byte rows swizzled (gemm_swz).
// XH (gemm_tc_kw16's fallback): x arrives in bf16 already (its producer rounded it), in gemm_tc_kw16's layout
// (kparams.h, PPN_X16_POS), so its pairs are gathered and copied as they are instead of rounded here: the same
// elements in the same places.
template <int BM, int BN, int WM, int WN, int STAGES, bool BF16, bool XH = false> struct gemm_tc {
    static constexpr int THREADS = WM * WN * 32, BK = PPN_GEMM_TC_BK;
    static constexpr int MI = BM / WM / 16, NI = BN / WN / 8; // m16 and n8 tiles a warp holds
    static constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
    static constexpr int XPT = BM * BK / 4 / THREADS; // float4 of x a thread loads per k-tile
    static constexpr int WPT = BN * BK / 8 / THREADS; // 16-byte chunks of W a thread copies per k-tile
    static_assert(BK == 32, "64-byte rows of 16-bit elements: four swizzled chunks");
    static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0 && BM % (16 * WM) == 0 && BN % (16 * WN) == 0, "warp tile");
    static_assert(XPT >= 1 && WPT >= 1 && XPT * THREADS * 4 == BM * BK && WPT * THREADS * 8 == BN * BK, "loads");
    static_assert(STAGE_BYTES * STAGES == (int)PPN_GEMM_TC_SMEM(BM, BN, STAGES), "kparams.h's shared memory");

    const ppn_kp_gemm &p;
    uint32_t s0;  // shared memory base
    int i0, r0;   // first token and first weight row of the tile
    float4 xr[XPT];
    uint2 xh[XPT]; // XH: the same pieces, 16-bit

    __device__ gemm_tc(const ppn_kp_gemm &p_, unsigned char *smem) : p(p_), s0(gemm_smem_addr(smem))
    {
        int tm, tn;
        gemm_tile(p.m, p.rows, BM, BN, &tm, &tn);
        i0 = tm * BM, r0 = tn * BN;
    }

    // The tile at token i0_, weight row r0_ (gemm_tc_kw's fallback lays out its own grid).
    __device__ gemm_tc(const ppn_kp_gemm &p_, unsigned char *smem, int i0_, int r0_)
        : p(p_), s0(gemm_smem_addr(smem)), i0(i0_), r0(r0_)
    {
    }

    // W k-tile kt into stage st; rows past the matrix and chunks past cols are zero-filled.
    __device__ __forceinline__ void load_w(int st, int kt)
    {
#pragma unroll
        for (int e = 0; e < WPT; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 2, c = idx & 3, gk = kt * BK + c * 8;
            bool ok = r0 + r < p.rows && gk < p.cols;
            const unsigned short *src = (const unsigned short *)p.w;
            if (ok) src += (size_t)(r0 + r) * (size_t)p.cols + (size_t)gk;
            gemm_cp16(s0 + (uint32_t)(st * STAGE_BYTES + A_BYTES) + gemm_swz(r, c), src, ok);
        }
    }

    // x k-tile kt into registers (zeros past m and cols; cols % 8 == 0, so a float4 is all in or all out).
    __device__ __forceinline__ void load_x(int kt)
    {
#pragma unroll
        for (int e = 0; e < XPT; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 3, gk = kt * BK + (idx & 7) * 4;
            size_t o = (size_t)(i0 + r) * (size_t)p.cols + (size_t)gk;
            if constexpr (XH) { // gemm_tc_kw16's layout (PPN_X16_POS): the two pairs apart
                xh[e] = make_uint2(0u, 0u);
                const unsigned short *xrow = (const unsigned short *)p.x + (o - (size_t)gk);
                if (i0 + r < p.m && gk < p.cols)
                    xh[e] = make_uint2(*(const uint32_t *)(xrow + PPN_X16_POS(gk)),
                                       *(const uint32_t *)(xrow + PPN_X16_POS(gk + 2)));
            } else {
                xr[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (i0 + r < p.m && gk < p.cols) xr[e] = *(const float4 *)((const float *)p.x + o);
            }
        }
    }

    // The registers' x tile, rounded to the weight dtype, into stage st.
    __device__ __forceinline__ void store_x(int st)
    {
#pragma unroll
        for (int e = 0; e < XPT; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 3, q = idx & 7;
            uint32_t lo = XH ? xh[e].x : gemm_pack<BF16>(xr[e].x, xr[e].y);
            uint32_t hi = XH ? xh[e].y : gemm_pack<BF16>(xr[e].z, xr[e].w);
            uint32_t a = s0 + (uint32_t)(st * STAGE_BYTES) + gemm_swz(r, q >> 1) + (uint32_t)((q & 1) * 8);
            asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(a), "r"(lo), "r"(hi) : "memory");
        }
    }

    // The two k16 steps of stage st into acc.
    __device__ __forceinline__ void compute(int st, float (&acc)[MI][NI][4])
    {
        const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
        const int wm = warp / WN, wn = warp % WN;
        const uint32_t sa = s0 + (uint32_t)(st * STAGE_BYTES), sb = sa + (uint32_t)A_BYTES;
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            uint32_t a[MI][4], b[NI][2];
#pragma unroll
            for (int mi = 0; mi < MI; mi++) {
                int row = wm * (BM / WM) + mi * 16 + (lane & 15);
                gemm_ldsm4(sa + gemm_swz(row, kk * 2 + (lane >> 4)), a[mi][0], a[mi][1], a[mi][2], a[mi][3]);
            }
#pragma unroll
            for (int nj = 0; nj < NI / 2; nj++) {
                int row = wn * (BN / WN) + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
                gemm_ldsm4(sb + gemm_swz(row, kk * 2 + ((lane >> 3) & 1)), b[2 * nj][0], b[2 * nj][1],
                           b[2 * nj + 1][0], b[2 * nj + 1][1]);
            }
#pragma unroll
            for (int mi = 0; mi < MI; mi++)
#pragma unroll
                for (int ni = 0; ni < NI; ni++) gemm_mma<BF16>(acc[mi][ni], a[mi], b[ni]);
        }
    }

    __device__ __forceinline__ void run(void)
    {
        const int kts = (p.cols + BK - 1) / BK;
        float acc[MI][NI][4];
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;
        // the ring's first STAGES - 1 weight tiles before the wait: weights are immutable
#pragma unroll
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < kts) load_w(s, s);
            gemm_cp_commit();
        }
        ppn_pdl_wait();
        for (int s = 0; s < STAGES - 1 && s < kts; s++) load_x(s), store_x(s);
        for (int kt = 0; kt < kts; kt++) {
            gemm_cp_wait<STAGES - 2>(); // k-tile kt's weights have landed (this thread's copies) ...
            __syncthreads();            // ... everyone's, and its x; stage (kt - 1) % STAGES is free again
            int nk = kt + STAGES - 1;
            if (nk < kts) load_w(nk % STAGES, nk), load_x(nk);
            gemm_cp_commit(); // one group per iteration, empty or not, so the wait above counts right
            compute(kt % STAGES, acc);
            if (nk < kts) store_x(nk % STAGES); // x's loads had the compute to land
        }
        gemm_cp_wait<0>();
        const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
        const int wm = warp / WN, wn = warp % WN;
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
            for (int ni = 0; ni < NI; ni++) {
                int i = i0 + wm * (BM / WM) + mi * 16 + (lane >> 2);
                int r = r0 + wn * (BN / WN) + ni * 8 + (lane & 3) * 2;
                gemm_store(p, i, r, acc[mi][ni][0]);
                gemm_store(p, i, r + 1, acc[mi][ni][1]);
                gemm_store(p, i + 8, r, acc[mi][ni][2]);
                gemm_store(p, i + 8, r + 1, acc[mi][ni][3]);
            }
    }
};


// ---------------------------------------------------------------------------------------------------------
// Hopper (sm_90a): the large and middle tiles on warpgroup MMA. WGS warpgroups of 64 tokens x BN weight rows
// (large: 2 x 256, middle: 1 x 128); W streams through a cp.async ring of GEMM_H_STAGES k-tiles of 64 columns,
// each row 128 bytes in the 128-byte swizzle wgmma reads (16-byte chunk c of row r at chunk c ^ (r % 8)); x
// goes straight from global memory into the A fragments (registers), a k-tile ahead, rounded to W's dtype on
// the way. Each k-tile's four m64nBNk16 steps are one wgmma group, waited for before the next barrier (so the
// ring slot it read may be refilled). The tiles, threads and shared memory are kparams.h's, as on sm_80.

#define GEMM_H_BK 64
#define GEMM_H_STAGES 3
static_assert(GEMM_H_STAGES * PPN_GEMM_TC_L_BN * GEMM_H_BK * 2 ==
                  (int)PPN_GEMM_TC_SMEM(PPN_GEMM_TC_L_BM, PPN_GEMM_TC_L_BN, PPN_GEMM_TC_L_STAGES) &&
              GEMM_H_STAGES * PPN_GEMM_TC_M_BN * GEMM_H_BK * 2 ==
                  (int)PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES) &&
              GEMM_H_STAGES * PPN_GEMM_TC_S_BN * GEMM_H_BK * 2 <=
                  (int)PPN_GEMM_TC_SMEM(PPN_GEMM_TC_S_BM, PPN_GEMM_TC_S_BN, PPN_GEMM_TC_S_STAGES),
              "the wgmma rings fit the shared memory kparams.h gives each tile");

__device__ __forceinline__ void gemm_fence_async(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void gemm_wg_fence(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void gemm_wg_commit_wait(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// The K-major 128-byte-swizzle descriptor of 8-row groups 1024 bytes apart, starting at shared address a.
__device__ __forceinline__ uint64_t gemm_desc(uint32_t a)
{
    return (uint64_t)((a & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// The accumulators of a warpgroup MMA as inline-asm operands: %0 .. %(N - 1) in the instruction's list, and the
// matching "+f" operands of d[0 .. N - 1] (N = 64 for m64n128, 128 for m64n256).
#define GEMM_ACC_REGS64                                                                                           \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "    \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "    \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define GEMM_ACC_REGS128                                                                                          \
    GEMM_ACC_REGS64 ", "                                                                                          \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, "    \
    "%85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "    \
    "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, " \
    "%123, %124, %125, %126, %127"
#define GEMM_ACC_OPS8(d, i)                                                                                       \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]),   \
        "+f"(d[i + 7])
#define GEMM_ACC_OPS32(d, i)                                                                                      \
    GEMM_ACC_OPS8(d, i), GEMM_ACC_OPS8(d, i + 8), GEMM_ACC_OPS8(d, i + 16), GEMM_ACC_OPS8(d, i + 24)
#define GEMM_ACC_OPS64(d) GEMM_ACC_OPS32(d, 0), GEMM_ACC_OPS32(d, 32)
#define GEMM_ACC_OPS128(d) GEMM_ACC_OPS64(d), GEMM_ACC_OPS32(d, 64), GEMM_ACC_OPS32(d, 96)

// One m64nNk16 step of a warpgroup (N = 256 or 128): d (this thread's N / 2 accumulators) = (keep ? d : 0) + A . B,
// A in 4 registers (the mma.m16n8k16 A fragment of the warp's 16 rows), B N x 16 in shared memory (descriptor db).
template <int N, bool BF16>
__device__ __forceinline__ void gemm_wgmma(float *d, const uint32_t *a, uint64_t db, int keep = 1)
{
    static_assert(N == 256 || N == 128, "the two widths the tiles use");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (N == 256 && BF16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %132, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" GEMM_ACC_REGS128
                     "}, {%128, %129, %130, %131}, %133, p, 1, 1, 0;\n}\n"
                     : GEMM_ACC_OPS128(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(keep), "l"(db));
    else if (N == 256)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %132, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" GEMM_ACC_REGS128
                     "}, {%128, %129, %130, %131}, %133, p, 1, 1, 0;\n}\n"
                     : GEMM_ACC_OPS128(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(keep), "l"(db));
    else if (BF16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" GEMM_ACC_REGS64
                     "}, {%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"
                     : GEMM_ACC_OPS64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(keep), "l"(db));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" GEMM_ACC_REGS64
                     "}, {%64, %65, %66, %67}, %69, p, 1, 1, 0;\n}\n"
                     : GEMM_ACC_OPS64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(keep), "l"(db));
#endif
}

extern __shared__ __align__(1024) unsigned char gemm_dyn_smem[];

// XR (gemm_tc_kwx): x comes through the ring too. Each stage holds W's k-tile, then x's BM rows of the k-tile as
// f32 (PPN_GEMM_TC_KWX_XROW floats a row), copied S - 1 k-tiles ahead as W is, in whole 16-byte pieces, and the
// fragments are read from there; otherwise each thread loads its fragments' x (8-byte pieces of 8 rows a warp
// instruction) from global memory one k-tile ahead, into registers. XH (gemm_tc_kw16; not with XR): x is bf16
// already (its producer rounded it), in the layout that puts a thread's fragments of a k-tile together
// (kparams.h, PPN_X16_POS): two 16-byte loads a row, used as they are.
// GU (gemm_swiglu): W is a gate|up matrix (gate rows [0, rows / 2), up rows after them), and the tile at weight
// row r0 reads gate rows r0 / 2 + [0, BN / 2) into its first half and the up rows rows / 2 further into its
// second, so a thread's accumulator j < NQ / 2 (gate) pairs with j + NQ / 2 (up) of the same output column.
template <int WGS, int BN, bool BF16, int S = GEMM_H_STAGES, bool XR = false, bool XH = false, bool GU = false>
struct gemm_h {
    static constexpr int BM = 64 * WGS, BK = GEMM_H_BK, W_BYTES = BN * BK * 2, XROW = PPN_GEMM_TC_KWX_XROW;
    static constexpr int NS = S, BN_ = BN; // the ring's depth, the tile's weight rows
    static constexpr bool IS_GU = GU;
    static constexpr int STAGE_BYTES = W_BYTES + (XR ? BM * XROW * 4 : 0);
    static constexpr int THREADS = 128 * WGS, WPT = BN * BK / 8 / THREADS, NACC = BN / 2;
    static_assert(WPT * THREADS * 8 == BN * BK && BN % 64 == 0, "whole 8-row swizzle atoms, whole copies");
    static_assert(STAGE_BYTES % 1024 == 0 && XROW % 32 == 8, "stages on swizzle atoms; x rows 8 mod 32 words apart");
    static_assert(!(XR && XH), "the ring's x is f32");
    static_assert(!GU || WGS == 1, "gate|up tiles: one warpgroup");

    const ppn_kp_gemm &p;
    uint32_t s0;
    int i0, r0, row; // row: this thread's first token (its fragment rows are row and row + 8)
    int kt0, kt1;    // the k-tiles summed: all of K, or gemm_tc_kw's range
    float2 raw[16];  // the next k-tile's x: [k16 step][k half][row half]
    uint32_t rawh[16]; // XH: the same, as 16-bit pairs

    __device__ gemm_h(const ppn_kp_gemm &p_, unsigned char *smem) : p(p_), s0(gemm_smem_addr(smem))
    {
        int tm, tn;
        gemm_tile(p.m, p.rows, BM, BN, &tm, &tn);
        init(tm * BM, tn * BN, 0, (p.cols + BK - 1) / BK);
    }

    // The tile at token i0_, weight row r0_, k-tiles [kt0_, kt1_) (gemm_tc_kw).
    __device__ gemm_h(const ppn_kp_gemm &p_, unsigned char *smem, int i0_, int r0_, int kt0_, int kt1_)
        : p(p_), s0(gemm_smem_addr(smem))
    {
        init(i0_, r0_, kt0_, kt1_);
    }

    __device__ __forceinline__ void init(int i0_, int r0_, int kt0_, int kt1_)
    {
        int t = (int)threadIdx.x;
        i0 = i0_, r0 = r0_, kt0 = kt0_, kt1 = kt1_;
        row = i0 + (t >> 7) * 64 + ((t >> 5) & 3) * 16 + ((t & 31) >> 2);
    }

    __device__ __forceinline__ void load_w(int st, int kt)
    {
#pragma unroll
        for (int e = 0; e < WPT; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 3, c = idx & 7, gk = kt * BK + c * 8;
            int wr = r0 + r; // the weight row tile row r holds
            bool ok = wr < p.rows;
            if constexpr (GU) {
                int f = r0 / 2 + (r & (BN / 2 - 1)); // its output column
                wr = (r < BN / 2 ? 0 : p.rows / 2) + f, ok = f < p.rows / 2;
            }
            ok = ok && gk < p.cols;
            const unsigned short *src = (const unsigned short *)p.w;
            if (ok) src += (size_t)wr * (size_t)p.cols + (size_t)gk;
            gemm_cp16(s0 + (uint32_t)(st * STAGE_BYTES + r * 128 + ((c ^ (r & 7)) << 4)), src, ok);
        }
    }

    // XR: x k-tile kt into stage st as f32, BM rows of XROW (zeros past m and cols; cols % 8 == 0).
    __device__ __forceinline__ void load_xs(int st, int kt)
    {
        const uint32_t xs = s0 + (uint32_t)(st * STAGE_BYTES + W_BYTES);
#pragma unroll
        for (int e = 0; e < BM * BK / 4 / THREADS; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 4, q = idx & 15, gk = kt * BK + q * 4;
            bool ok = i0 + r < p.m && gk < p.cols;
            const float *src = (const float *)p.x;
            if (ok) src += (size_t)(i0 + r) * (size_t)p.cols + (size_t)gk;
            gemm_cp16(xs + (uint32_t)(r * XROW * 4 + q * 16), src, ok);
        }
    }

    // XR: this thread's fragments of stage st's x, rounded to W's dtype: the elements load_x gives raw, in the
    // same places (so the same bits).
    __device__ __forceinline__ void frag_xs(int st, uint32_t (&a)[16]) const
    {
        const float *xs = (const float *)(gemm_dyn_smem + (size_t)st * STAGE_BYTES + W_BYTES);
        const int lr = row - i0, q = ((int)threadIdx.x & 3) * 2;
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int rh = 0; rh < 2; rh++) {
                    float2 v = *(const float2 *)(xs + (lr + 8 * rh) * XROW + 16 * s + 8 * h + q);
                    a[s * 4 + h * 2 + rh] = gemm_pack<BF16>(v.x, v.y);
                }
    }

    // x k-tile kt's fragment elements: (row + 8 rh, kt BK + 16 s + 8 h + 2 (lane % 4) + {0, 1}); cols % 8 == 0,
    // so a pair is all in or all out.
    __device__ __forceinline__ void load_x(int kt)
    {
        if constexpr (XH) {
            load_xh(kt);
            return;
        }
        const int q = ((int)threadIdx.x & 3) * 2;
#pragma unroll
        for (int s = 0; s < 4; s++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int rh = 0; rh < 2; rh++) {
                    int i = row + 8 * rh, k = kt * BK + 16 * s + 8 * h + q;
                    float2 v = make_float2(0.0f, 0.0f);
                    if (i < p.m && k < p.cols) v = *(const float2 *)((const float *)p.x + (size_t)i * p.cols + k);
                    raw[s * 4 + h * 2 + rh] = v;
                }
    }

    // XH: the same elements from x in gemm_tc_kw16's layout (kparams.h, PPN_X16_POS; cols % 64 == 0): this thread's
    // 16 of a row's k-tile lie together at 16 (lane % 4), two 16-byte loads a row; into rawh, or d.
    __device__ __forceinline__ void load_xh(int kt) { load_xh(kt, rawh); }

    __device__ __forceinline__ void load_xh(int kt, uint32_t (&d)[16]) const
    {
        const unsigned short *xh = (const unsigned short *)p.x;
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
            int i = row + 8 * rh;
            uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
            if (i < p.m && kt * BK < p.cols) {
                size_t o = (size_t)i * p.cols + (size_t)kt * BK + (size_t)(((int)threadIdx.x & 3) * 16);
                const uint4 *src = (const uint4 *)(xh + o);
                a = src[0], b = src[1];
            }
            // [s][h] pairs in order: a holds s = 0, 1 and b s = 2, 3 (PPN_X16_POS)
            d[0 + rh] = a.x, d[2 + rh] = a.y, d[4 + rh] = a.z, d[6 + rh] = a.w;
            d[8 + rh] = b.x, d[10 + rh] = b.y, d[12 + rh] = b.z, d[14 + rh] = b.w;
        }
    }

    // XR: k-tiles [kt0, kt1) into acc (zeroed by the caller), x through the ring: the ring's first S - 1 weight
    // tiles before the wait (weights are immutable), each its own group; then their x tiles as one group, so the
    // first k-tile waits for all of them.
    __device__ __forceinline__ void mainloop_xs(float (&acc)[NACC])
    {
        const int n = kt1 - kt0;
        if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
#pragma unroll
        for (int s = 0; s < S - 1; s++) {
            if (s < n) load_w(s, kt0 + s);
            gemm_cp_commit();
        }
        ppn_pdl_wait();
        for (int s = 0; s < S - 1 && s < n; s++) load_xs(s, kt0 + s);
        gemm_cp_commit();
        for (int i = 0; i < n; i++) {
            if (i == 0) gemm_cp_wait<0>();
            else gemm_cp_wait<S - 2>(); // k-tile i's group is the oldest of the S - 1 in flight
            gemm_fence_async(); // the cp.async writes (generic proxy) before wgmma's reads (async proxy)
            __syncthreads();    // every thread's copies of k-tile i landed; every warp's wgmma of i - 1 done
            int ni = i + S - 1;
            if (ni < n) load_w(ni % S, kt0 + ni), load_xs(ni % S, kt0 + ni);
            gemm_cp_commit();
            uint32_t a[16];
            frag_xs(i % S, a);
            const uint32_t sb = s0 + (uint32_t)((i % S) * STAGE_BYTES);
            gemm_wg_fence();
#pragma unroll
            for (int s = 0; s < 4; s++) gemm_wgmma<BN, BF16>(acc, a + 4 * s, gemm_desc(sb + 32u * (uint32_t)s));
            gemm_wg_commit_wait();
        }
        gemm_cp_wait<0>();
    }

    // k-tiles [kt0, kt1) into acc (zeroed by the caller).
    __device__ __forceinline__ void mainloop(float (&acc)[NACC])
    {
        if constexpr (XR) {
            mainloop_xs(acc);
            return;
        }
        const int n = kt1 - kt0;
        if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
#pragma unroll
        for (int s = 0; s < S - 1; s++) {
            if (s < n) load_w(s, kt0 + s);
            gemm_cp_commit();
        }
        ppn_pdl_wait();
        if (n > 0) load_x(kt0);
        for (int i = 0; i < n; i++) {
            gemm_cp_wait<S - 2>();
            gemm_fence_async(); // the cp.async writes (generic proxy) before wgmma's reads (async proxy)
            __syncthreads();    // every thread's copies of k-tile i landed; every warp's wgmma of i - 1 done
            int ni = i + S - 1;
            if (ni < n) load_w(ni % S, kt0 + ni);
            gemm_cp_commit();
            uint32_t a[16];
#pragma unroll
            for (int j = 0; j < 16; j++) a[j] = XH ? rawh[j] : gemm_pack<BF16>(raw[j].x, raw[j].y);
            if (i + 1 < n) load_x(kt0 + i + 1); // lands while the tensor cores work on this one
            const uint32_t sb = s0 + (uint32_t)((i % S) * STAGE_BYTES);
            gemm_wg_fence();
#pragma unroll
            for (int s = 0; s < 4; s++) gemm_wgmma<BN, BF16>(acc, a + 4 * s, gemm_desc(sb + 32u * (uint32_t)s));
            gemm_wg_commit_wait();
        }
        gemm_cp_wait<0>();
    }

    __device__ __forceinline__ void store(const float (&acc)[NACC])
    {
        const int r = r0 + ((int)threadIdx.x & 3) * 2;
        static_assert(BN % 32 == 0, "16 outputs at a time");
#pragma unroll
        for (int j = 0; j < BN / 8; j += 4) gemm_store_j4(p, row, r + 8 * j, acc + 4 * j); // res read first
    }

    __device__ __forceinline__ void run(void)
    {
        float acc[NACC];
#pragma unroll
        for (int j = 0; j < NACC; j++) acc[j] = 0.0f;
        mainloop(acc);
        store(acc);
    }
};

template <int BM, int BN, int WM, int WN, int STAGES> __device__ __forceinline__ void gemm_tc_run(const ppn_kp_gemm &p)
{
    ppn_pdl_trigger();
    if (p.wdt == PPN_DTYPE_BF16) {
        gemm_tc<BM, BN, WM, WN, STAGES, true> k(p, gemm_dyn_smem);
        k.run();
    } else {
        gemm_tc<BM, BN, WM, WN, STAGES, false> k(p, gemm_dyn_smem);
        k.run();
    }
}

template <int WGS, int BN> __device__ __forceinline__ void gemm_h_run(const ppn_kp_gemm &p)
{
    ppn_pdl_trigger();
    if (p.wdt == PPN_DTYPE_BF16) {
        gemm_h<WGS, BN, true> k(p, gemm_dyn_smem);
        k.run();
    } else {
        gemm_h<WGS, BN, false> k(p, gemm_dyn_smem);
        k.run();
    }
}

// Warpgroup MMA where the build has sm_90a's features, mma.sync elsewhere (sm_80 SASS, and the PTX a later GPU
// compiles): the same tile, threads and shared memory either way.
extern "C" __global__ void __launch_bounds__(PPN_GEMM_TC_L_THREADS, 1) ppn_k_gemm_tc_l(const ppn_kp_gemm_tc_l p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(PPN_GEMM_TC_L_THREADS == 256 && PPN_GEMM_TC_L_BM == 128, "two warpgroups");
    gemm_h_run<2, PPN_GEMM_TC_L_BN>(p);
#else
    static_assert(PPN_GEMM_TC_L_THREADS == 2 * 4 * 32, "2 x 4 warps of 64 x 64");
    gemm_tc_run<PPN_GEMM_TC_L_BM, PPN_GEMM_TC_L_BN, 2, 4, PPN_GEMM_TC_L_STAGES>(p);
#endif
}

extern "C" __global__ void __launch_bounds__(PPN_GEMM_TC_M_THREADS, 2) ppn_k_gemm_tc_m(const ppn_kp_gemm_tc_m p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(PPN_GEMM_TC_M_THREADS == 128 && PPN_GEMM_TC_M_BM == 64, "one warpgroup");
    gemm_h_run<1, PPN_GEMM_TC_M_BN>(p);
#else
    static_assert(PPN_GEMM_TC_M_THREADS == 2 * 2 * 32, "2 x 2 warps of 32 x 64");
    gemm_tc_run<PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, 2, 2, PPN_GEMM_TC_M_STAGES>(p);
#endif
}

extern "C" __global__ void __launch_bounds__(PPN_GEMM_TC_S_THREADS, 1) ppn_k_gemm_tc_s(const ppn_kp_gemm_tc_s p)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    static_assert(PPN_GEMM_TC_S_THREADS == 256 && PPN_GEMM_TC_S_BM == 128, "two warpgroups");
    gemm_h_run<2, PPN_GEMM_TC_S_BN>(p);
#else
    static_assert(PPN_GEMM_TC_S_THREADS == 2 * 4 * 32, "2 x 4 warps of 64 x 32");
    gemm_tc_run<PPN_GEMM_TC_S_BM, PPN_GEMM_TC_S_BN, 2, 4, PPN_GEMM_TC_S_STAGES>(p);
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Hopper, warp-specialized (gemm_tc_h, kparams.h): the large tile with its operands brought in by the tensor
// memory accelerator. Warpgroup 0 is the producer: after lowering its registers, one thread walks the k-tiles
// and, for each, waits until the ring slot is empty (its mbarrier), arms the slot's full mbarrier with the
// stage's bytes and issues three bulk tensor copies: W's 256 x 64 16-bit box and x's two 128 x 32 f32 boxes, in
// the 128-byte swizzle (16-byte chunk c of a 128-byte row r lands at chunk c ^ (r % 8)), zeros past the matrix.
// Warpgroups 1 and 2 consume 64 tokens each: wait for the slot's full mbarrier, read their A fragments from x
// (f32, rounded to W's dtype as the other tiles round it) into one of two register sets, and issue the k-tile's
// four m64n256k16 steps as one wgmma group; then wait until at most that group is in flight, so the previous
// k-tile's group is done with its W slot, which one lane of each consumer warp hands back (the empty mbarrier
// counts 8 arrivals). The tensor cores so always have the next group queued while the fragments of the one
// after are built. The weights' first STAGES k-tiles are issued before the programmatic-launch wait.

#define GEMM_TH_BM PPN_GEMM_TC_H_BM
#define GEMM_TH_BN PPN_GEMM_TC_H_BN
#define GEMM_TH_BK PPN_GEMM_TC_H_BK
#define GEMM_TH_S ((int)PPN_GEMM_TC_H_STAGES)
#define GEMM_TH_W_BYTES (GEMM_TH_BN * GEMM_TH_BK * 2)
#define GEMM_TH_XBOX_BYTES (GEMM_TH_BM * PPN_GEMM_TC_H_XBOX * 4)
static_assert(GEMM_TH_W_BYTES + 2 * GEMM_TH_XBOX_BYTES == (int)PPN_GEMM_TC_H_STAGE_BYTES &&
                  GEMM_TH_BK == 2 * PPN_GEMM_TC_H_XBOX && PPN_GEMM_TC_H_THREADS == 384 && GEMM_TH_BM == 128 &&
                  GEMM_TH_BN == 256,
              "kparams.h's stage: W's box, then x's two; a producer and two consumer warpgroups");

__device__ __forceinline__ void gemm_mbar_init(uint32_t bar, unsigned count)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void gemm_mbar_expect(uint32_t bar, unsigned bytes)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void gemm_mbar_arrive(uint32_t bar)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Until the phase of parity `parity` of the mbarrier at bar has completed.
__device__ __forceinline__ void gemm_mbar_wait(uint32_t bar, unsigned parity)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
#endif
}

// A ring's mbarriers, a full and an empty one (8 bytes each) for each of its stages, set up by thread 0 and made
// visible before a block barrier: full counts one arrive (the issuing thread's, with the copies' bytes), empty the
// `empties` arrivals of the consumers handing the slot back.
__device__ __forceinline__ void gemm_ring_init(uint32_t full, uint32_t empty, int stages, unsigned empties)
{
    if (threadIdx.x == 0) {
        for (int st = 0; st < stages; st++) {
            gemm_mbar_init(full + 8u * st, 1);
            gemm_mbar_init(empty + 8u * st, empties);
        }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
    }
    __syncthreads();
}

// The 2-D box at (c0 elements along a row, c1 rows) of the tensor map at map into shared memory at dst,
// completing its bytes on the mbarrier at bar.
__device__ __forceinline__ void gemm_tma_2d(uint32_t dst, const ppn_tmap *map, int c0, int c1, uint32_t bar)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
#endif
}

// Consumer warpgroup c's 128 threads (named barrier 1 + c; 0 is __syncthreads').
__device__ __forceinline__ void gemm_bar_wg(int c)
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + c) : "memory");
}

template <int N> __device__ __forceinline__ void gemm_wg_wait(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

__device__ __forceinline__ void gemm_wg_commit(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// gemm_tc_kwt and gemm_swiglu_t (XH): gemm_h's k-tiles [kt0, kt1) into acc with W brought in by the tensor memory
// accelerator, and no block-wide barrier in the loop. Thread 0 issues each ring slot's W k-tile as two 64 x 64
// boxes of the map (rows r0 and r0 + 64; GU: gate rows r0 / 2, up rows rows / 2 + r0 / 2), landing in the
// 128-byte swizzle load_w writes, and arms the slot's full mbarrier with their bytes; the ring's S slots go
// before the programmatic-launch wait (weights are immutable). Each warp waits on the slot's full mbarrier,
// issues the k-tile's four k16 steps as one wgmma group and waits until at most that group is in flight, so the
// previous k-tile's slot is free: a lane of each warp hands it back (the empty mbarrier counts 4), and thread 0
// refills it S k-tiles on once all four have. The tensor cores so keep a group queued while the next k-tile's
// fragments are built. The same k16 steps in the same order on the same fragments as gemm_h::mainloop: the
// accumulators start from the first step (scale-d 0: never defined by another instruction, which would have
// ptxas serialize the pipeline), and -0 becomes +0 after the last, as zeroed accumulators give. The mbarriers
// sit after the ring (16 bytes a stage: PPN_GEMM_TC_KWT_SMEM).
template <class H> __device__ __forceinline__ void gemm_h_mainloop_tma(H &k, float (&acc)[H::NACC], const ppn_tmap *map)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int S = H::NS;
    const int n = k.kt1 - k.kt0, t = (int)threadIdx.x;
    const uint32_t full = k.s0 + (uint32_t)(S * H::STAGE_BYTES), empty = full + 8u * S;
    if (k.s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
    if (n <= 0) { // a cluster's tile past the matrix: nothing summed
#pragma unroll
        for (int j = 0; j < H::NACC; j++) acc[j] = 0.0f;
        ppn_pdl_wait();
        return;
    }
    gemm_ring_init(full, empty, S, 4); // empty: a lane of each warp
    // Slot st gets k-tile kt: its two 64-row boxes.
    auto issue = [&](int st, int kt) {
        const uint32_t d = k.s0 + (uint32_t)(st * H::STAGE_BYTES), bar = full + 8u * st;
        const int ra = H::IS_GU ? k.r0 / 2 : k.r0, rb = H::IS_GU ? k.p.rows / 2 + k.r0 / 2 : k.r0 + 64;
        gemm_mbar_expect(bar, (unsigned)H::W_BYTES);
        gemm_tma_2d(d, map, kt * H::BK, ra, bar);
        gemm_tma_2d(d + (uint32_t)(H::W_BYTES / 2), map, kt * H::BK, rb, bar);
    };
    if (t == 0)
        for (int s = 0; s < S && s < n; s++) issue(s, k.kt0 + s);
    ppn_pdl_wait();
    // k-tile i's group reads its A fragments (x) from registers until a wait retires it (PTX: a write to them
    // before is undefined), and one group stays in flight: so two register sets (even k-tiles' xa, odd ones' xb),
    // k-tile i + 1's loaded into the other set only after the wait that retires k-tile i - 1's group.
    uint32_t xa[16], xb[16];
    k.load_xh(k.kt0, xa);
    auto step = [&](int i, const uint32_t(&cur)[16], uint32_t(&nxt)[16]) {
        const int st = i % S;
        gemm_mbar_wait(full + 8u * st, (unsigned)((i / S) & 1));
        const uint32_t sb = k.s0 + (uint32_t)(st * H::STAGE_BYTES);
        gemm_wg_fence();
#pragma unroll
        for (int s = 0; s < 4; s++)
            gemm_wgmma<H::BN_, true>(acc, cur + 4 * s, gemm_desc(sb + 32u * (uint32_t)s), i > 0 || s > 0);
        gemm_wg_commit();
        gemm_wg_wait<1>(); // k-tile i - 1's group is done with its slot and its fragments (nxt)
        if (i > 0) {
            const int pi = i - 1, ps = pi % S;
            __syncwarp();
            if ((t & 31) == 0) gemm_mbar_arrive(empty + 8u * ps);
            if (t == 0 && pi + S < n) {
                gemm_mbar_wait(empty + 8u * ps, (unsigned)((pi / S) & 1));
                issue(ps, k.kt0 + pi + S);
            }
        }
        // after the slot's refill (the loads' first use waits for them); lands while the tensor cores work on i
        if (i + 1 < n) k.load_xh(k.kt0 + i + 1, nxt);
    };
    for (int i = 0; i < n; i += 2) {
        step(i, xa, xb);
        if (i + 1 < n) step(i + 1, xb, xa);
    }
    gemm_wg_wait<0>();
#pragma unroll
    for (int j = 0; j < H::NACC; j++) acc[j] += 0.0f; // -0 to +0: gemm_h::mainloop's sums start from +0
#else
    (void)k, (void)acc, (void)map;
    __trap();
#endif
}

// One m64n256k16 step of a warpgroup with both operands in shared memory: d (this thread's 128 accumulators) =
// (keep ? d : 0) + A . B, A 64 x 16 (descriptor da), B 256 x 16 (descriptor db).
template <bool BF16> __device__ __forceinline__ void gemm_wgmma_ss(float *d, uint64_t da, uint64_t db, int keep)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (BF16)
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" GEMM_ACC_REGS128
                     "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : GEMM_ACC_OPS128(d)
                     : "l"(da), "l"(db), "r"(keep));
    else
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" GEMM_ACC_REGS128
                     "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                     : GEMM_ACC_OPS128(d)
                     : "l"(da), "l"(db), "r"(keep));
#endif
}

template <bool BF16> struct gemm_th {
    const ppn_kp_gemm_tc_h &p;
    uint32_t s0, full, empty; // the ring; its full and empty mbarriers (8 bytes a stage each)
    int kts, tiles;           // k-tiles a tile; output tiles, walked gridDim.x apart from blockIdx.x

    __device__ gemm_th(const ppn_kp_gemm_tc_h &p_) : p(p_)
    {
        s0 = gemm_smem_addr(gemm_dyn_smem);
        full = s0 + (uint32_t)(GEMM_TH_S * PPN_GEMM_TC_H_STAGE_BYTES), empty = full + 8u * GEMM_TH_S;
        kts = (p.g.cols + GEMM_TH_BK - 1) / GEMM_TH_BK;
        tiles = ((p.g.m + GEMM_TH_BM - 1) / GEMM_TH_BM) * ((p.g.rows + GEMM_TH_BN - 1) / GEMM_TH_BN);
    }

    // Tile t's first token and first weight row (gemm_tile's order).
    __device__ __forceinline__ void tile(int t, int &i0, int &r0) const
    {
        int tm, tn;
        gemm_tile_at(t, p.g.m, p.g.rows, GEMM_TH_BM, GEMM_TH_BN, &tm, &tn);
        i0 = tm * GEMM_TH_BM, r0 = tn * GEMM_TH_BN;
    }

    __device__ __forceinline__ uint32_t stage(int st) const { return s0 + (uint32_t)(st * PPN_GEMM_TC_H_STAGE_BYTES); }

    __device__ __forceinline__ void load_w(int st, int kt, int r0) const
    {
        gemm_tma_2d(stage(st), &p.wmap, kt * GEMM_TH_BK, r0, full + 8u * st);
    }

    __device__ __forceinline__ void load_x(int st, int kt, int i0) const
    {
        uint32_t xs = stage(st) + GEMM_TH_W_BYTES;
        gemm_tma_2d(xs, &p.xmap, kt * GEMM_TH_BK, i0, full + 8u * st);
        gemm_tma_2d(xs + GEMM_TH_XBOX_BYTES, &p.xmap, kt * GEMM_TH_BK + PPN_GEMM_TC_H_XBOX, i0, full + 8u * st);
    }

    // One thread: every k-tile of every tile of this CTA, slot it % S for the it-th. The first tile's first S
    // weight k-tiles go before the programmatic-launch wait (weights are immutable; the slots start empty).
    __device__ __forceinline__ void produce(void)
    {
        int it = 0, i0, r0;
        const int t0 = (int)blockIdx.x, pre = kts < GEMM_TH_S ? kts : GEMM_TH_S;
        if (t0 < tiles) {
            tile(t0, i0, r0);
            for (int kt = 0; kt < pre; kt++) {
                gemm_mbar_expect(full + 8u * kt, PPN_GEMM_TC_H_STAGE_BYTES);
                load_w(kt, kt, r0);
            }
        }
        ppn_pdl_wait();
        for (int t = t0; t < tiles; t += (int)gridDim.x) {
            tile(t, i0, r0);
            for (int kt = 0; kt < kts; kt++, it++) {
                const int st = it % GEMM_TH_S;
                if (it < pre) { // armed and its weights issued above
                    load_x(st, kt, i0);
                    continue;
                }
                if (it >= GEMM_TH_S) gemm_mbar_wait(empty + 8u * st, (unsigned)((it / GEMM_TH_S - 1) & 1));
                gemm_mbar_expect(full + 8u * st, PPN_GEMM_TC_H_STAGE_BYTES);
                load_w(st, kt, r0);
                load_x(st, kt, i0);
            }
        }
    }

    // Consumer c's 64 rows of x in slot st, f32 in two 128-byte-swizzled boxes of 32 columns, rewritten in place
    // as W's dtype (rounded as the other tiles round x) in the 128-byte swizzle of 64-column rows: rows c 64 ..
    // c 64 + 63 of the first box's region, which only this warpgroup reads. Every read lands before any write
    // (a named barrier of the warpgroup's 128 threads), and the writes reach the tensor cores' proxy before the
    // MMA (a proxy fence, then the barrier again).
    __device__ __forceinline__ void convert(int st, int c) const
    {
        const int t = (int)threadIdx.x & 127;
        const uint32_t xs = stage(st) + GEMM_TH_W_BYTES + (uint32_t)(c * 64 * 128);
        uint32_t v[4][4]; // packed as they are read: 16 registers, not 32
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int idx = t + 128 * e, r = idx >> 3, cb = idx & 7, sw = r & 7; // 16-byte chunk cb of row r (bf16)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int fj = 2 * (cb & 3) + h; // its f32 chunk in box cb / 4
                uint32_t ad = xs + (uint32_t)((cb >> 2) * GEMM_TH_XBOX_BYTES + r * 128 + ((fj ^ sw) << 4));
                float4 f;
                asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                             : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w)
                             : "r"(ad)
                             : "memory");
                v[e][2 * h] = gemm_pack<BF16>(f.x, f.y), v[e][2 * h + 1] = gemm_pack<BF16>(f.z, f.w);
            }
        }
        gemm_bar_wg(c);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int idx = t + 128 * e, r = idx >> 3, cb = idx & 7;
            uint32_t ad = xs + (uint32_t)(r * 128 + ((cb ^ (r & 7)) << 4));
            asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(ad), "r"(v[e][0]), "r"(v[e][1]),
                         "r"(v[e][2]), "r"(v[e][3])
                         : "memory");
        }
        gemm_fence_async();
        gemm_bar_wg(c);
    }

    // Pins the accumulators in their registers here: no copy of them moves across this point (a copy made while
    // a group is in flight would have ptxas serialize the warpgroup MMAs).
    __device__ __forceinline__ static void pin(float (&acc)[128])
    {
#pragma unroll
        for (int j = 0; j < 128; j++) asm volatile("" : "+f"(acc[j])::"memory");
    }

    // The four k16 steps of slot st as one group; a tile's first k-tile (first) starts its sums from nothing
    // (the accumulators are never zeroed: ptxas serializes the MMAs of a pipeline whose accumulators another
    // instruction defined).
    __device__ __forceinline__ void mma(int st, int first, int c, float (&acc)[128]) const
    {
        const uint32_t sb = stage(st), sa = sb + GEMM_TH_W_BYTES + (uint32_t)(c * 64 * 128);
        pin(acc);
        gemm_wg_fence();
#pragma unroll
        for (int s = 0; s < 4; s++)
            gemm_wgmma_ss<BF16>(acc, gemm_desc(sa + 32u * (uint32_t)s), gemm_desc(sb + 32u * (uint32_t)s),
                                s > 0 || !first);
        gemm_wg_commit();
    }

    // Slot it % S's lane of a consumer warp hands it back to the producer.
    __device__ __forceinline__ void release(int it) const
    {
        __syncwarp();
        if (((int)threadIdx.x & 31) == 0) gemm_mbar_arrive(empty + 8u * (it % GEMM_TH_S));
    }

    // The it-th k-tile (the tile's kt-th) into acc; the previous one's slot handed back once its group is done.
    __device__ __forceinline__ void step(int it, int kt, int c, float (&acc)[128]) const
    {
        const int st = it % GEMM_TH_S;
        gemm_mbar_wait(full + 8u * st, (unsigned)((it / GEMM_TH_S) & 1));
        convert(st, c);
        mma(st, kt == 0, c, acc);
        gemm_wg_wait<1>(); // k-tile it - 1's group is done with its slot
        pin(acc);
        if (kt > 0) release(it - 1);
    }

    __device__ __forceinline__ void consume(int c) // c: 0 or 1, the consumer warpgroup
    {
        const int t = (int)threadIdx.x & 127, lrow = c * 64 + (t >> 5) * 16 + ((t & 31) >> 2);
        float acc[128]; // a tile's first k-tile writes them all before anything reads them (mma)
        ppn_pdl_wait();
        int it = 0, i0, r0;
        for (int tl = (int)blockIdx.x; tl < tiles; tl += (int)gridDim.x) {
            tile(tl, i0, r0);
            for (int kt = 0; kt < kts; kt++, it++) step(it, kt, c, acc);
            gemm_wg_wait<0>();
            pin(acc);
            release(it - 1); // the tile's last slot: the producer may be filling the next tile's first ones
#pragma unroll
            for (int j = 0; j < 128; j++) acc[j] += 0.0f; // -0 to +0: gemm_tc_l's sums start from +0
            const int row = i0 + lrow, r = r0 + (t & 3) * 2;
            static_assert(GEMM_TH_BN % 32 == 0, "16 outputs at a time");
#pragma unroll
            for (int j = 0; j < GEMM_TH_BN / 8; j += 4) gemm_store_j4(p.g, row, r + 8 * j, acc + 4 * j); // res first
        }
    }

    __device__ __forceinline__ void run(void)
    {
        const int wg = (int)threadIdx.x >> 7;
        if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
        gemm_ring_init(full, empty, GEMM_TH_S, 8); // empty: a lane of each consumer warp
        if (wg == 0) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
#endif
            if (threadIdx.x == 0) produce();
            else ppn_pdl_wait();
        } else {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
            asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
#endif
            consume(wg - 1);
        }
    }
};

// Only where warpgroup MMA and the tensor memory accelerator are (sm_90a): the op takes it where the device and
// this build have them (tma_ok, gpu.h), and gemm_tc_l elsewhere; a launch anywhere else traps.
extern "C" __global__ void __launch_bounds__(PPN_GEMM_TC_H_THREADS, 1)
    ppn_k_gemm_tc_h(const __grid_constant__ ppn_kp_gemm_tc_h p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt == PPN_DTYPE_BF16) {
        gemm_th<true> k(p);
        k.run();
    } else {
        gemm_th<false> k(p);
        k.run();
    }
#else
    __trap();
#endif
}

// ---------------------------------------------------------------------------------------------------------
// Few tokens (batched decode, m up to a few dozen): the time is reading W once, so the kernel is built for
// weight bandwidth. A CTA owns BN = 64 weight rows (a warp 16 of them, the M of m16n8k16: W is the A operand,
// from shared memory through ldmatrix) and a group of up to MG tokens (the N: n8 tiles, only those holding
// tokens computed), and streams its k-range of the tile through a cp.async ring of STAGES(m) k-tiles (W, and x as
// f32, rounded to W's dtype as the B fragments are built). A cluster of CLUSTER CTAs holds CLUSTER / ks tiles,
// each split over K into ks ranges (ks = KS(rows), kparams.h: 8 for the 1B's 2048-row matrices, so they still
// spread over 256 CTAs; 1 for the lm heads). x (read once per CTA from L2) costs 2 MG / BN of W's bytes at most.
// Partial sums meet in k order: each CTA writes its own to shared memory; after a cluster barrier each of a
// tile's ks CTAs adds a 1 / ks share of the outputs from all ks (distributed shared memory), and a second
// barrier keeps every CTA's memory alive until all have read it. The k-ranges are whole k-tiles,
// ceil(ceil(cols / KT) / ks) a range: they depend on rows and cols alone, so a token's bits do not depend on m;
// with ks = 1 the sum is the tiles' (one accumulator, k16 steps in k order). Without clusters (the sm_80 SASS)
// the first CTA of each tile sums all of K and the others return.

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GEMM_K_CLUSTER 1
#define GEMM_K_CLUSTER_DIMS __cluster_dims__(PPN_GEMM_TC_K_CLUSTER, 1, 1)
#else
#define GEMM_K_CLUSTER 0
#define GEMM_K_CLUSTER_DIMS
#endif

__device__ __forceinline__ void gemm_cluster_sync(void)
{
#if GEMM_K_CLUSTER
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

// The float4 at shared address a in cluster rank r's shared memory.
__device__ __forceinline__ float4 gemm_ld_peer(uint32_t a, unsigned r)
{
    float4 v;
#if GEMM_K_CLUSTER
    uint32_t ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(ra)
                 : "memory");
#else
    (void)r;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a)
                 : "memory");
#endif
    return v;
}

// XH (gemm_tc_k16, W bf16): x given in bf16 in gemm_tc_kw16's layout (kparams.h, PPN_X16_POS; cols % 64 == 0),
// copied as it is: an x row of a k-tile is 128 bytes, its 16-byte chunk c at c ^ (row % 2), and a thread's two
// fragments of k16 steps 2 h and 2 h + 1 are chunk 2 (lane % 4) + h of its token's row (one 16-byte load, no
// bank conflict within a quarter warp). The producer rounded x as gemm_pack rounds the f32: the same bits.
// TM (gemm_tc_k16t; XH): W and x come in through the tensor memory accelerator (maps at wmap, xmap) in the
// 128-byte swizzle (an x row's 16-byte chunk c at c ^ (r % 8) instead of c ^ (r % 2): the fragments' loads stay free
// of bank conflicts), and the k-loop has no block-wide barrier (mainloop_tma).
template <bool BF16, int S, bool XH = false, bool TM = false> struct gemm_k {
    static constexpr int BN = PPN_GEMM_TC_K_BN, MG = PPN_GEMM_TC_K_MG, KT = PPN_GEMM_TC_K_KT;
    static constexpr int XSW = TM ? 7 : 1; // an x row's chunk swizzle: c ^ (r & XSW)
    static_assert(!TM || XH, "the TMA loop takes x in bf16");
    static constexpr int THREADS = PPN_GEMM_TC_K_THREADS, XROW = PPN_GEMM_TC_K_XROW;
    static constexpr int CL = PPN_GEMM_TC_K_CLUSTER;
    static constexpr int NT = MG / 8, W_BYTES = BN * KT * 2, WPT = BN * KT / 8 / THREADS;
    static constexpr int X_ROW_BYTES = XH ? KT * 2 : XROW * 4; // an x row of a stage
    static_assert(!XH || (BF16 && KT == 64), "bf16 x: bf16 W, 64-column k-tiles (PPN_X16_POS's blocks)");
    static_assert(BN == 16 * (THREADS / 32) && KT == 64 && WPT * THREADS * 8 == BN * KT, "a warp's 16 rows");
    static_assert(XROW % 32 == 8 && MG % 8 == 0, "x rows 8 mod 32 words apart; whole n8 tiles");
    static_assert(NT * (THREADS / 32) * 32 * 16 <= S * W_BYTES && S >= 2, "partials fit in the ring");

    const ppn_kp_gemm &p;
    uint32_t s0, stage_bytes;
    int ks, part, lead, r0, i0, mg, kt0, kt1; // k-ranges a tile, this CTA's, its tile's first rank; tile; ranges
    const ppn_tmap *wmap = nullptr, *xmap = nullptr; // TM: W's and x's tensor maps

    __device__ gemm_k(const ppn_kp_gemm &p_, unsigned char *smem, int rank) : p(p_), s0(gemm_smem_addr(smem))
    {
        const int kl = p.ks; // the grid's layout (the op's choice); without clusters one CTA sums all
        ks = GEMM_K_CLUSTER ? kl : 1;
        int groups = (p.m + MG - 1) / MG, c = (int)blockIdx.x / CL;
        part = rank % ks, lead = rank - rank % kl;
        r0 = (c / groups * (CL / kl) + rank / kl) * BN, i0 = c % groups * MG, mg = min(p.m - i0, MG);
        stage_bytes = (uint32_t)W_BYTES + PPN_GEMM_TC_K_MP(p.m) * (uint32_t)X_ROW_BYTES;
        int kts = (p.cols + KT - 1) / KT, per = (kts + ks - 1) / ks;
        kt0 = min(kts, part * per), kt1 = min(kts, kt0 + per);
        if (r0 >= p.rows) kt1 = kt0; // a cluster's tiles past the matrix: no loads, only the barriers
    }

    // W k-tile kt into stage st: 64 rows of 128 bytes, 16-byte chunk c of row r at c ^ (r % 8).
    __device__ __forceinline__ void load_w(int st, int kt)
    {
#pragma unroll
        for (int e = 0; e < WPT; e++) {
            int idx = (int)threadIdx.x + e * THREADS, r = idx >> 3, c = idx & 7, gk = kt * KT + c * 8;
            bool ok = r0 + r < p.rows && gk < p.cols;
            const unsigned short *src = (const unsigned short *)p.w;
            if (ok) src += (size_t)(r0 + r) * (size_t)p.cols + (size_t)gk;
            gemm_cp16(s0 + (uint32_t)st * stage_bytes + (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4)), src, ok);
        }
    }

    // x k-tile kt into stage st as f32: ceil8(mg) rows of XROW (zeros past mg and cols; cols % 8 == 0). XH: as
    // bf16, the row's 16-byte chunks as they lie (swizzled by the row's parity).
    __device__ __forceinline__ void load_x(int st, int kt)
    {
        if constexpr (XH) {
            const int n = ((mg + 7) & ~7) * (KT / 8);
            const uint32_t xs = s0 + (uint32_t)st * stage_bytes + (uint32_t)W_BYTES;
            for (int idx = (int)threadIdx.x; idx < n; idx += THREADS) {
                int r = idx >> 3, c = idx & 7, gk = kt * KT + c * 8;
                bool ok = r < mg && gk < p.cols;
                const unsigned short *src = (const unsigned short *)p.x;
                if (ok) src += (size_t)(i0 + r) * (size_t)p.cols + (size_t)gk;
                gemm_cp16(xs + (uint32_t)(r * X_ROW_BYTES + ((c ^ (r & 1)) << 4)), src, ok);
            }
            return;
        }
        const int n = ((mg + 7) & ~7) * (KT / 4);
        const uint32_t xs = s0 + (uint32_t)st * stage_bytes + (uint32_t)W_BYTES;
        for (int idx = (int)threadIdx.x; idx < n; idx += THREADS) {
            int r = idx >> 4, q = idx & 15, gk = kt * KT + q * 4;
            bool ok = r < mg && gk < p.cols;
            const float *src = (const float *)p.x;
            if (ok) src += (size_t)(i0 + r) * (size_t)p.cols + (size_t)gk;
            gemm_cp16(xs + (uint32_t)(r * XROW * 4 + q * 16), src, ok);
        }
    }

    // Stage st's four k16 steps into acc (n8 tiles below nt only).
    __device__ __forceinline__ void compute(int st, int nt, float (&acc)[NT][4])
    {
        const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
        const uint32_t sw = s0 + (uint32_t)st * stage_bytes;
        const float *xs = (const float *)(gemm_dyn_smem + (size_t)st * stage_bytes + W_BYTES);
        const int row = warp * 16 + (lane & 15), tok = lane >> 2, kq = (lane & 3) * 2;
        uint4 xh[XH ? NT : 1]; // XH: the fragments of k16 steps kk and kk + 1 (kk even), one 16-byte load a tile
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            if constexpr (XH) {
                if (!(kk & 1)) {
                    const unsigned char *xb = gemm_dyn_smem + (size_t)st * stage_bytes + W_BYTES;
#pragma unroll
                    for (int j = 0; j < NT; j++)
                        if (j < nt) {
                            int r = j * 8 + tok;
                            xh[j] = *(const uint4 *)(xb + r * X_ROW_BYTES + (((kq + (kk >> 1)) ^ (r & XSW)) << 4));
                        }
                }
            }
            uint32_t a[4];
            int c = kk * 2 + (lane >> 4);
            gemm_ldsm4(sw + (uint32_t)(row * 128 + ((c ^ (row & 7)) << 4)), a[0], a[1], a[2], a[3]);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                if (j < nt) {
                    uint32_t b[2];
                    if constexpr (XH) {
                        b[0] = kk & 1 ? xh[j].z : xh[j].x, b[1] = kk & 1 ? xh[j].w : xh[j].y;
                    } else {
                        const float *xr = xs + (j * 8 + tok) * XROW + kk * 16 + kq;
                        float2 lo = *(const float2 *)xr, hi = *(const float2 *)(xr + 8);
                        b[0] = gemm_pack<BF16>(lo.x, lo.y), b[1] = gemm_pack<BF16>(hi.x, hi.y);
                    }
                    gemm_mma<BF16>(acc[j], a, b);
                }
            }
        }
    }

    // TM: k-tiles [kt0, kt1) into acc. Thread 0 issues each ring slot's W k-tile (a 64 x 64 box) and x k-tile (a
    // 64-column box of MP(m) rows from token i0, zeros past m) and arms the slot's full mbarrier with their bytes;
    // the ring's S slots' W before the programmatic-launch wait (weights are immutable), their x after it. Each warp
    // waits on the slot's full mbarrier, computes the k-tile and hands the slot back (a lane of each warp on its
    // empty mbarrier, counting 4); after its own k-tile i, thread 0 waits until k-tile i - 1's slot is free and
    // refills it S k-tiles on, so S - 1 k-tiles are in flight beyond the one computed, as in run()'s ring. The
    // mbarriers sit after the ring (PPN_GEMM_TC_K16T_SMEM_S).
    __device__ __forceinline__ void mainloop_tma(float (&acc)[NT][4], int nt)
    {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        const int n = kt1 - kt0, t = (int)threadIdx.x;
        const uint32_t full = s0 + (uint32_t)S * stage_bytes, empty = full + 8u * S;
        if (n <= 0) {
            ppn_pdl_wait();
            return;
        }
        if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
        gemm_ring_init(full, empty, S, 4); // empty: a lane of each warp
        auto issue_w = [&](int st, int kt) {
            const uint32_t bar = full + 8u * st;
            gemm_mbar_expect(bar, stage_bytes);
            gemm_tma_2d(s0 + (uint32_t)st * stage_bytes, wmap, kt * KT, r0, bar);
        };
        auto issue_x = [&](int st, int kt) {
            gemm_tma_2d(s0 + (uint32_t)st * stage_bytes + (uint32_t)W_BYTES, xmap, kt * KT, i0, full + 8u * st);
        };
        if (t == 0)
            for (int s = 0; s < S && s < n; s++) issue_w(s, kt0 + s);
        ppn_pdl_wait();
        if (t == 0)
            for (int s = 0; s < S && s < n; s++) issue_x(s, kt0 + s);
        for (int i = 0; i < n; i++) {
            const int st = i % S;
            gemm_mbar_wait(full + 8u * st, (unsigned)((i / S) & 1));
            compute(st, nt, acc);
            __syncwarp();
            if ((t & 31) == 0) gemm_mbar_arrive(empty + 8u * st);
            const int pi = i - 1, ps = pi < 0 ? 0 : pi % S;
            if (t == 0 && pi >= 0 && pi + S < n) {
                gemm_mbar_wait(empty + 8u * ps, (unsigned)((pi / S) & 1));
                issue_w(ps, kt0 + pi + S);
                issue_x(ps, kt0 + pi + S);
            }
        }
        // every box issued was for a k-tile below n, and every thread waited for each: none is in flight here, so
        // the partial sums may take the ring after the epilogue's barrier
#else
        (void)acc, (void)nt;
        __trap();
#endif
    }

    __device__ __forceinline__ void run(void)
    {
        const int n = kt1 - kt0, nt = (mg + 7) >> 3;
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
        if constexpr (TM) {
            mainloop_tma(acc, nt);
        } else {
            // the ring's first S - 1 weight tiles before the wait (weights are immutable), each its own group;
            // then their x tiles as one group, so the first k-tile waits for all of them
#pragma unroll
            for (int s = 0; s < S - 1; s++) {
                if (s < n) load_w(s, kt0 + s);
                gemm_cp_commit();
            }
            ppn_pdl_wait();
            for (int s = 0; s < S - 1 && s < n; s++) load_x(s, kt0 + s);
            gemm_cp_commit();
            for (int i = 0; i < n; i++) {
                if (i == 0) gemm_cp_wait<0>();
                else gemm_cp_wait<S - 2>(); // k-tile i's group is the oldest of the S - 1 in flight
                __syncthreads();            // everyone's copies landed; stage (i - 1) % S is free again
                int ni = i + S - 1;
                if (ni < n) load_w(ni % S, kt0 + ni), load_x(ni % S, kt0 + ni);
                gemm_cp_commit();
                compute(i % S, nt, acc);
            }
        }
        gemm_cp_wait<0>();
        if (ks == 1) { // the whole sum is here: no partials
            if (r0 < p.rows) store(acc, nt);
            return;
        }
        __syncthreads(); // the ring is free: the partial sums go there, [n8 tile][warp][lane] float4s
        const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
        float4 *pp = (float4 *)gemm_dyn_smem;
#pragma unroll
        for (int j = 0; j < NT; j++)
            if (j < nt) pp[(j * (THREADS / 32) + warp) * 32 + lane] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        gemm_cluster_sync(); // every CTA's partials written
        const int per = nt * THREADS / ks; // float4s a CTA adds: a contiguous share of its tile's
        for (int e = part * per + (int)threadIdx.x; e < (part + 1) * per && r0 < p.rows; e += THREADS) {
            uint32_t a = s0 + (uint32_t)e * 16u;
            float4 v = gemm_ld_peer(a, (unsigned)lead);
            for (int q = 1; q < ks; q++) {
                float4 u = gemm_ld_peer(a, (unsigned)(lead + q));
                v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
            }
            int j = e / THREADS, w = e / 32 % (THREADS / 32), l = e % 32;
            put(j, w, l, v);
        }
        gemm_cluster_sync(); // no CTA leaves while a peer may still read its partials
    }

    // Float4 (n8 tile j, warp w, lane l) of the tile: tokens 2 (l % 4) + {0, 1} of tile j, rows l / 4 + {0, 8}
    // of warp w's 16 (the m16n8 accumulator's layout, W rows as M).
    __device__ __forceinline__ void put(int j, int w, int l, float4 v)
    {
        int r = r0 + w * 16 + (l >> 2), i = i0 + j * 8 + (l & 3) * 2;
        gemm_store4(p, {i, i + 1, i, i + 1}, {r, r, r + 8, r + 8}, v);
    }

    __device__ __forceinline__ void store(const float (&acc)[NT][4], int nt)
    {
        const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
#pragma unroll
        for (int j = 0; j < NT; j++)
            if (j < nt) put(j, warp, lane, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
    }
};

template <int S, bool XH = false> __device__ __forceinline__ void gemm_k_run(const ppn_kp_gemm &p, int rank)
{
    if constexpr (XH) { // bf16 W only (ops_gemm.c takes no other)
        gemm_k<true, S, true> k(p, gemm_dyn_smem, rank);
        k.run();
    } else if (p.wdt == PPN_DTYPE_BF16) {
        gemm_k<true, S> k(p, gemm_dyn_smem, rank);
        k.run();
    } else {
        gemm_k<false, S> k(p, gemm_dyn_smem, rank);
        k.run();
    }
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_K_THREADS)
    ppn_k_gemm_tc_k(const ppn_kp_gemm_tc_k p)
{
    ppn_pdl_trigger();
    int rank = (int)(blockIdx.x % PPN_GEMM_TC_K_CLUSTER); // = %cluster_ctarank: clusters are CLUSTER x 1 x 1
    if (!GEMM_K_CLUSTER && rank % p.ks != 0) return; // the tile's first CTA sums all of K
    // The ring's depth, as the op sized it: 3 or 4 (ops_gemm.c takes no other). Deeper rings (6, 8) were built
    // and timed on the H200 (docs/PERF.md, 2026-12-01 night): they won nowhere that matters and more paths in one
    // kernel risk its registers (gemm_tc_kw lost a third of its speed that way).
    if (p.stages == 4) gemm_k_run<4>(p, rank);
    else gemm_k_run<3>(p, rank);
}

// gemm_tc_k16t: gemm_tc_k16 with W and x brought in by the tensor memory accelerator (p.wmap: 64 x 64 boxes of W;
// p.xmap: 64-column boxes of MP(m) rows of x) and no block-wide barrier in its k-loop (gemm_k::mainloop_tma): the
// same grid, split, ring depths, fragments and sums, so gemm_tc_k16's bits. sm_90a only (the op takes it where
// the device runs the middle tile's TMA kernels: PPN_TMA=2).
template <int S> __device__ __forceinline__ void gemm_k16t_run(const ppn_kp_gemm_tc_k16t &p, int rank)
{
    gemm_k<true, S, true, true> k(p.g, gemm_dyn_smem, rank);
    k.wmap = &p.wmap, k.xmap = &p.xmap;
    k.run();
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_K_THREADS, 5)
    ppn_k_gemm_tc_k16t(const __grid_constant__ ppn_kp_gemm_tc_k16t p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const int rank = (int)(blockIdx.x % PPN_GEMM_TC_K_CLUSTER);
    if (p.g.stages == 4) gemm_k16t_run<4>(p, rank);
    else gemm_k16t_run<3>(p, rank);
#else
    __trap();
#endif
}

// gemm_tc_k on x given in bf16 (gemm_tc_kw16's layout, W bf16, cols % 64 == 0): the same tile, split, ring depths
// and bits, half of x's bytes through L2 and shared memory, and no rounding in the inner loop.
// Five CTAs a multiprocessor, as gemm_tc_k's 96 registers allow (118 without the bound, sm_80): the lm head's
// thousands of CTAs come in as few waves.
extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_K_THREADS, 5)
    ppn_k_gemm_tc_k16(const ppn_kp_gemm_tc_k16 p)
{
    ppn_pdl_trigger();
    int rank = (int)(blockIdx.x % PPN_GEMM_TC_K_CLUSTER);
    if (!GEMM_K_CLUSTER && rank % p.ks != 0) return;
    if (p.stages == 4) gemm_k_run<4, true>(p, rank);
    else gemm_k_run<3, true>(p, rank);
}

// ---------------------------------------------------------------------------------------------------------
// A few dozen tokens (batched decode at m = 32 .. 128): the middle tile's warpgroup MMA (64 tokens x 128 weight
// rows, gemm_h<1, 128>), its K split over the CTAs of a cluster as gemm_tc_k splits it, so narrow matrices still
// spread over about a wave of CTAs, and x is read once per CTA for 128 weight rows (gemm_tc_k: 64). A cluster
// holds CLUSTER / ks tiles (ks = KW_KS(rows), kparams.h), each summed over ks k-ranges of whole 64-column
// k-tiles (they depend on rows and cols alone, so a token's bits do not depend on m). Each CTA writes its
// partial sums to its ring ([float4 j][thread], the accumulator's layout); after a cluster barrier each of a
// tile's ks CTAs adds a 1 / ks share of them from all ks in k order (distributed shared memory), and a second
// barrier keeps every CTA's memory alive until all have read it. Without warpgroup MMA (the sm_80 SASS, the
// PTX) the first CTA of each tile sums all of K on mma.sync (gemm_tc, the middle tile's warps) and the others
// return.
// gemm_tc_kwx is the same with x copied through the ring beside W (gemm_h's XR), S - 1 k-tiles ahead, in whole
// 16-byte pieces: fewer, wider loads than gemm_tc_kw's 8-byte fragments from global memory, at 102 KB of shared
// memory a CTA (2 an SM). It reads the same elements into the same fragments, so it gives gemm_tc_kw's bits.

// gemm_swiglu's epilogue: out column f and f + 1 (f even) of token i = silu(gate) * up, as ppn_k_swiglu_rows
// computes them from gemm_tc_kw16's f32 outputs; odt a bf16 form: rounded into its layout (PPN_X16_AT: a pair stays
// together in either). out is [m, rows / 2].
__device__ __forceinline__ void gemm_gu_put(const ppn_kp_gemm &p, int odt, int i, int f, float g0, float u0, float g1,
                                            float u1)
{
    const int n = p.rows / 2;
    if (i >= p.m || f >= n) return;
    const float v0 = ppn_swish(g0) * u0, v1 = ppn_swish(g1) * u1;
    const size_t o = (size_t)i * (size_t)n;
    if (odt != PPN_DTYPE_F32)
        *(__nv_bfloat162 *)((__nv_bfloat16 *)p.out + o + PPN_X16_AT(odt, f)) = __floats2bfloat162_rn(v0, v1);
    else
        *(float2 *)((float *)p.out + o + f) = make_float2(v0, v1);
}

// gemm_gu_put of one output: out column f of token i = silu(g) u (gemm_swiglu_x, gemm_swiglu_w).
__device__ __forceinline__ void gemm_gu_put1(const ppn_kp_gemm &p, int odt, int i, int f, float g, float u)
{
    const int n = p.rows / 2;
    if (i >= p.m || f >= n) return;
    const float v = ppn_swish(g) * u;
    const size_t o = (size_t)i * (size_t)n;
    if (odt != PPN_DTYPE_F32) ((__nv_bfloat16 *)p.out)[o + PPN_X16_AT(odt, f)] = __float2bfloat16_rn(v);
    else ((float *)p.out)[o + f] = v;
}

// TM (gemm_tc_kwt, gemm_swiglu_t; XH): the k-tiles through gemm_h_mainloop_tma, W by the tensor map at map.
template <bool XR, bool BF16, int S, bool XH = false, bool GU = false, bool TM = false>
__device__ __forceinline__ void gemm_kw_run(const ppn_kp_gemm &p, int odt = PPN_DTYPE_F32,
                                            const ppn_tmap *map = nullptr)
{
    constexpr int BM = PPN_GEMM_TC_M_BM, BN = PPN_GEMM_TC_M_BN, CL = PPN_GEMM_TC_K_CLUSTER;
    const int rank = (int)(blockIdx.x % CL), kl = p.ks; // = %cluster_ctarank; the op's K split
    const int groups = (p.m + BM - 1) / BM, c = (int)blockIdx.x / CL;
    const int part = rank % kl, lead = rank - part;
    const int i0 = c % groups * BM, r0 = (c / groups * (CL / kl) + rank / kl) * BN;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int T = PPN_GEMM_TC_M_THREADS, NQ = BN / 8; // float4s of partial sums a thread holds
    static_assert(T == 128 && BM == 64 && NQ * T * 16 <= S * BN * GEMM_H_BK * 2, "partials fit the ring");
    const int ks = kl, kts = (p.cols + GEMM_H_BK - 1) / GEMM_H_BK, per = (kts + ks - 1) / ks;
    int kt0 = min(kts, part * per), kt1 = min(kts, kt0 + per);
    if (r0 >= p.rows) kt1 = kt0; // a cluster's tiles past the matrix: no loads, only the barriers
    gemm_h<1, BN, BF16, S, XR, XH, GU> k(p, gemm_dyn_smem, i0, r0, kt0, kt1);
    float acc[NQ * 4];
    if constexpr (TM) {
        static_assert(XH && !XR, "the TMA loop reads x as gemm_tc_kw16 does");
        gemm_h_mainloop_tma(k, acc, map);
    } else {
        (void)map;
#pragma unroll
        for (int j = 0; j < NQ * 4; j++) acc[j] = 0.0f;
        k.mainloop(acc);
    }
    if (ks == 1) { // the whole sum is here: no partials
        if (r0 >= p.rows) return;
        if constexpr (GU) {
            const int f = r0 / 2 + ((int)threadIdx.x & 3) * 2;
#pragma unroll
            for (int j = 0; j < NQ / 2; j++) {
                const float *g = acc + 4 * j, *u = acc + 4 * (j + NQ / 2);
                gemm_gu_put(p, odt, k.row, f + 8 * j, g[0], u[0], g[1], u[1]);
                gemm_gu_put(p, odt, k.row + 8, f + 8 * j, g[2], u[2], g[3], u[3]);
            }
        } else {
            k.store(acc);
        }
        return;
    }
    __syncthreads(); // the ring is free (every warp's wgmma waited for): the partial sums go there
    const int t = (int)threadIdx.x;
    float4 *pp = (float4 *)gemm_dyn_smem;
#pragma unroll
    for (int j = 0; j < NQ; j++)
        pp[j * T + t] = make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
    gemm_cluster_sync(); // every CTA's partials written
    const uint32_t s0 = gemm_smem_addr(gemm_dyn_smem);
    if constexpr (GU) { // a gate float4 (j < NQ / 2) and its up float4 (j + NQ / 2) together, each summed as below
        const int share = NQ / 2 * T / ks;
        for (int e = part * share + t; e < (part + 1) * share && r0 < p.rows; e += T) {
            uint32_t a = s0 + (uint32_t)e * 16u, b = a + (uint32_t)(NQ / 2 * T) * 16u;
            float4 g = gemm_ld_peer(a, (unsigned)lead), u = gemm_ld_peer(b, (unsigned)lead);
            for (int q = 1; q < ks; q++) {
                float4 x = gemm_ld_peer(a, (unsigned)(lead + q)), y = gemm_ld_peer(b, (unsigned)(lead + q));
                g.x += x.x, g.y += x.y, g.z += x.z, g.w += x.w;
                u.x += y.x, u.y += y.y, u.z += y.z, u.w += y.w;
            }
            int j = e / T, w = e % T, row = i0 + (w >> 5) * 16 + ((w & 31) >> 2), f = r0 / 2 + (w & 3) * 2 + 8 * j;
            gemm_gu_put(p, odt, row, f, g.x, u.x, g.y, u.y);
            gemm_gu_put(p, odt, row + 8, f, g.z, u.z, g.w, u.w);
        }
        gemm_cluster_sync(); // no CTA leaves while a peer may still read its partials
        return;
    }
    const int share = NQ * T / ks;
    for (int e = part * share + t; e < (part + 1) * share && r0 < p.rows; e += T) {
        uint32_t a = s0 + (uint32_t)e * 16u;
        float4 v = gemm_ld_peer(a, (unsigned)lead);
        for (int q = 1; q < ks; q++) {
            float4 u = gemm_ld_peer(a, (unsigned)(lead + q));
            v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
        }
        // float4 j of thread u: tokens row, row + 8; weight rows r, r + 1 (gemm_h's accumulator layout)
        int j = e / T, u = e % T, row = i0 + (u >> 5) * 16 + ((u & 31) >> 2), r = r0 + (u & 3) * 2 + 8 * j;
        gemm_store4(p, {row, row, row + 8, row + 8}, {r, r + 1, r, r + 1}, v);
    }
    gemm_cluster_sync(); // no CTA leaves while a peer may still read its partials
#else
    (void)lead, (void)odt;
    if constexpr (GU) {
        __trap(); // gemm_swiglu runs only on sm_90a code (ppn_op_gemm_swiglu_fits: the device's TMA kernels)
    } else {
        if (part != 0) return; // the tile's first CTA sums all of K
        gemm_tc<BM, BN, 2, 2, PPN_GEMM_TC_M_STAGES, BF16, XH> k(p, gemm_dyn_smem, i0, r0);
        k.run();
    }
#endif
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_tc_kw(const ppn_kp_gemm_tc_kw p)
{
    ppn_pdl_trigger();
    // One ring depth (GEMM_H_STAGES, p.stages says 3): with depths 3, 4 and 6 instantiated in this kernel it ran
    // the 8B's gate|up at m = 64 at 52% of the copy floor against 76% with one (H200, 2026-12-01 night: the
    // registers of the widest path, so fewer CTAs an SM; docs/PERF.md).
    if (p.wdt == PPN_DTYPE_BF16) gemm_kw_run<false, true, GEMM_H_STAGES>(p);
    else gemm_kw_run<false, false, GEMM_H_STAGES>(p);
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_tc_kwx(const ppn_kp_gemm_tc_kwx p)
{
    static_assert(PPN_GEMM_TC_KWX_SMEM == PPN_GEMM_TC_KWX_STAGES * (PPN_GEMM_TC_M_BN * GEMM_H_BK * 2u +
                                                                    PPN_GEMM_TC_M_BM * PPN_GEMM_TC_KWX_XROW * 4u),
                  "kparams.h's ring");
    static_assert(PPN_GEMM_TC_KWX_SMEM >= PPN_GEMM_TC_SMEM(PPN_GEMM_TC_M_BM, PPN_GEMM_TC_M_BN, PPN_GEMM_TC_M_STAGES),
                  "it also holds the sm_80 fallback's");
    ppn_pdl_trigger();
    if (p.wdt == PPN_DTYPE_BF16) gemm_kw_run<true, true, PPN_GEMM_TC_KWX_STAGES>(p);
    else gemm_kw_run<true, false, PPN_GEMM_TC_KWX_STAGES>(p);
}

// gemm_tc_kw16: gemm_tc_kw on x already in bf16 (the norm and SwiGLU write it so for the GEMM after them:
// kernels/ops_rows.c), so a token's x costs half the bytes and no conversion. The producers round as gemm_tc_kw
// rounds (nearest even), so it gives gemm_tc_kw's bits on the f32 x they rounded. bf16 weights only (the op
// refuses others).
extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_tc_kw16(const ppn_kp_gemm_tc_kw16 p)
{
    ppn_pdl_trigger();
    if (p.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kw_run<false, true, GEMM_H_STAGES, true>(p);
}

// gemm_swiglu: gemm_tc_kw16 over a gate|up matrix with SwiGLU in its epilogue: each tile holds 64 gate rows and
// their 64 up rows (gemm_h's GU), so the [m, 2 n] f32 gate|up never reaches memory; out is [m, n] in odt (f32, or
// bf16 in gemm_tc_kw16's layout for the down projection). The same K split (KW_KS of 2 n rows), k-ranges and sums as
// gemm_tc_kw16, and ppn_k_swiglu_rows' arithmetic after them: the same bits as the two kernels. sm_90a only.
extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_swiglu(const ppn_kp_gemm_swiglu p)
{
    ppn_pdl_trigger();
    if (p.g.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kw_run<false, true, GEMM_H_STAGES, true, true>(p.g, p.odt);
}

// gemm_swiglu_t: gemm_swiglu on gemm_tc_kwt's k-loop (p.wmap: 64 x 64 boxes of the gate|up matrix): the same bits.
extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_swiglu_t(const __grid_constant__ ppn_kp_gemm_swiglu_t p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kw_run<false, true, (int)PPN_GEMM_TC_KWT_STAGES, true, true, true>(p.g, p.odt, &p.wmap);
#else
    __trap();
#endif
}

// gemm_tc_kwt: gemm_tc_kw16 with W brought in by the tensor memory accelerator (p.wmap: 64 x 64 boxes of W) and
// no block-wide barrier in the k-loop (gemm_h_mainloop_tma): the same grid, split, fragments, k16 steps and sums,
// so gemm_tc_kw16's bits. sm_90a only (the op takes it at PPN_TMA=2 where the device runs TMA kernels).
static_assert(PPN_GEMM_TC_KWT_SMEM == PPN_GEMM_TC_KWT_STAGES * (PPN_GEMM_TC_M_BN * GEMM_H_BK * 2u + 16u),
              "kparams.h's ring and mbarriers");
extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS)
    ppn_k_gemm_tc_kwt(const __grid_constant__ ppn_kp_gemm_tc_kwt p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kw_run<false, true, (int)PPN_GEMM_TC_KWT_STAGES, true, false, true>(p.g, PPN_DTYPE_F32, &p.wmap);
#else
    __trap();
#endif
}

// ---------------------------------------------------------------------------------------------------------
// gemm_tc_kx and gemm_swiglu_x (sm_90a): gemm_tc_kw16's and gemm_swiglu's sums with the operands swapped, so up to
// 128 tokens take one pass over W. W is the A operand (a tile's 128 weight rows as two m64 halves) and the tokens
// are N (NX = the group's tokens rounded up to 16, at most 128), both read by the tensor cores from shared memory.
// A ring of PPN_GEMM_TC_KX_STAGES k-tiles holds W's 128 x 64 (16-byte copies into the 128-byte swizzle, as
// gemm_h::load_w) and x's NX rows of the k-tile in the same swizzle: x comes in gemm_tc_kw16's layout (kparams.h,
// PPN_X16_POS), so each 4-byte pair of it is copied to its place in k order (lane l of a warp takes the pair at
// k 2 l of a row, so a warp reads one row's 128 bytes a copy); tokens past the group are not loaded (their
// columns of the product are never stored). Loads run S - 2 k-tiles ahead of the one computed, and one k-tile's
// wgmma group stays in flight while the next is issued. The grid, the K split (KW_KS(rows) ranges of whole
// 64-column k-tiles), the k16 steps in k order and the partial sums added in k order through distributed shared
// memory are gemm_tc_kw's, so a token's output has gemm_tc_kw16's (gemm_swiglu's) bits; groups are 128 tokens
// wide, not 64.

// The accumulator registers of an m64nNk16 step, 8 at a time: %0 .. %(N / 2 - 1) of the instruction.
#define GEMM_KR0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define GEMM_KR1 GEMM_KR0 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define GEMM_KR2 GEMM_KR1 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define GEMM_KR3 GEMM_KR2 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define GEMM_KR4 GEMM_KR3 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define GEMM_KR5 GEMM_KR4 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define GEMM_KR6 GEMM_KR5 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define GEMM_KR7 GEMM_KR6 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define GEMM_KX_ASM(NS, REGS, IA, IB, IK, ...)                                                                    \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IK ", 0;\n"                                                  \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k16.f32.bf16.bf16 {" REGS "}, " IA ", " IB               \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                          \
                 : __VA_ARGS__                                                                                    \
                 : "l"(da), "l"(db), "r"(keep))

// One m64nNk16 step, both operands in shared memory: d (N / 2 accumulators) = (keep ? d : 0) + A . B, A 64 x 16
// (descriptor da: weight rows), B N x 16 (descriptor db: tokens), bf16.
template <int N> __device__ __forceinline__ void gemm_wgmma_kx(float *d, uint64_t da, uint64_t db, int keep)
{
    static_assert(N % 16 == 0 && N >= 16 && N <= 128, "the token widths gemm_tc_kx takes");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if constexpr (N == 16) {
        GEMM_KX_ASM("16", GEMM_KR0, "%8", "%9", "%10", GEMM_ACC_OPS8(d, 0));
    } else if constexpr (N == 32) {
        GEMM_KX_ASM("32", GEMM_KR1, "%16", "%17", "%18", GEMM_ACC_OPS8(d, 0), GEMM_ACC_OPS8(d, 8));
    } else if constexpr (N == 48) {
        GEMM_KX_ASM("48", GEMM_KR2, "%24", "%25", "%26", GEMM_ACC_OPS8(d, 0), GEMM_ACC_OPS8(d, 8),
                    GEMM_ACC_OPS8(d, 16));
    } else if constexpr (N == 64) {
        GEMM_KX_ASM("64", GEMM_KR3, "%32", "%33", "%34", GEMM_ACC_OPS32(d, 0));
    } else if constexpr (N == 80) {
        GEMM_KX_ASM("80", GEMM_KR4, "%40", "%41", "%42", GEMM_ACC_OPS32(d, 0), GEMM_ACC_OPS8(d, 32));
    } else if constexpr (N == 96) {
        GEMM_KX_ASM("96", GEMM_KR5, "%48", "%49", "%50", GEMM_ACC_OPS32(d, 0), GEMM_ACC_OPS8(d, 32),
                    GEMM_ACC_OPS8(d, 40));
    } else if constexpr (N == 112) {
        GEMM_KX_ASM("112", GEMM_KR6, "%56", "%57", "%58", GEMM_ACC_OPS32(d, 0), GEMM_ACC_OPS8(d, 32),
                    GEMM_ACC_OPS8(d, 40), GEMM_ACC_OPS8(d, 48));
    } else {
        GEMM_KX_ASM("128", GEMM_KR7, "%64", "%65", "%66", GEMM_ACC_OPS64(d));
    }
#else
    (void)d, (void)da, (void)db, (void)keep;
#endif
}

__device__ __forceinline__ void gemm_cp4(uint32_t dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

template <int NX, bool GU> struct gemm_kx {
    static constexpr int BN = PPN_GEMM_TC_M_BN, BK = 64, S = (int)PPN_GEMM_TC_KX_STAGES, T = PPN_GEMM_TC_M_THREADS;
    static constexpr int W_BYTES = BN * BK * 2, STAGE = W_BYTES + NX * BK * 2, NA = NX / 2, NQ = NX / 4;
    static_assert(BN == 128 && T == 128 && S >= 3, "two m64 halves, one warpgroup, loads at least a k-tile ahead");
    static_assert(STAGE % 1024 == 0, "stages on swizzle atoms");

    const ppn_kp_gemm &p;
    uint32_t s0;
    int i0, r0, mg, kt0, kt1;

    __device__ gemm_kx(const ppn_kp_gemm &p_, int i0_, int r0_, int mg_, int kt0_, int kt1_)
        : p(p_), s0(gemm_smem_addr(gemm_dyn_smem)), i0(i0_), r0(r0_), mg(mg_), kt0(kt0_), kt1(kt1_)
    {
    }

    // W k-tile kt into stage st: gemm_h::load_w's rows (GU: gate rows r0 / 2 + [0, 64), then their up rows).
    __device__ __forceinline__ void load_w(int st, int kt) const
    {
#pragma unroll
        for (int e = 0; e < BN * BK / 8 / T; e++) {
            int idx = (int)threadIdx.x + e * T, r = idx >> 3, c = idx & 7, gk = kt * BK + c * 8, wr = r0 + r;
            bool ok = wr < p.rows;
            if constexpr (GU) {
                int f = r0 / 2 + (r & (BN / 2 - 1));
                wr = (r < BN / 2 ? 0 : p.rows / 2) + f, ok = f < p.rows / 2;
            }
            const unsigned short *src = (const unsigned short *)p.w;
            if (ok) src += (size_t)wr * (size_t)p.cols + (size_t)gk;
            gemm_cp16(s0 + (uint32_t)(st * STAGE + r * 128 + ((c ^ (r & 7)) << 4)), src, ok);
        }
    }

    // x k-tile kt's rows below mg into stage st in k order: lane l's pair is k 2 l .. 2 l + 1 of the k-tile
    // (k = 16 s + 8 h + 2 q: PPN_X16_POS puts it at 16 q + 4 s + 2 h), 16-byte chunk l / 4 of the row.
    __device__ __forceinline__ void load_x(int st, int kt) const
    {
        const int t = (int)threadIdx.x, l = t & 31, s = l >> 3, h = (l >> 2) & 1, q = l & 3;
        const uint32_t xs = s0 + (uint32_t)(st * STAGE + W_BYTES) + (uint32_t)((l & 3) * 4);
        const unsigned short *src = (const unsigned short *)p.x + (size_t)i0 * (size_t)p.cols + (size_t)kt * BK +
                                    (size_t)(16 * q + 4 * s + 2 * h);
        for (int n = t >> 5; n < mg; n += T / 32)
            gemm_cp4(xs + (uint32_t)(n * 128 + (((l >> 2) ^ (n & 7)) << 4)), src + (size_t)n * (size_t)p.cols);
    }

    // k-tiles [kt0, kt1) into a (weight rows 0-63) and b (64-127): m64nNXk16 steps in k order, the first one's
    // accumulators from nothing (never defined by another instruction: ptxas would serialize the pipeline).
    __device__ __forceinline__ void mainloop(float (&a)[NA], float (&b)[NA])
    {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        const int n = kt1 - kt0;
        if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
        if (n <= 0) {
#pragma unroll
            for (int j = 0; j < NA; j++) a[j] = b[j] = 0.0f;
            ppn_pdl_wait();
            return;
        }
#pragma unroll
        for (int s = 0; s < S - 2; s++) {
            if (s < n) load_w(s, kt0 + s);
            gemm_cp_commit();
        }
        ppn_pdl_wait();
        for (int s = 0; s < S - 2 && s < n; s++) load_x(s, kt0 + s);
        gemm_cp_commit();
        for (int i = 0; i < n; i++) {
            if (i == 0) gemm_cp_wait<0>();
            else gemm_cp_wait<S - 3>(); // k-tile i's group: the oldest of the S - 2 in flight
            gemm_fence_async();         // the cp.async writes (generic proxy) before wgmma's reads (async proxy)
            __syncthreads();            // k-tile i landed for all; every thread's group i - 2 is done: its slot free
            const int ni = i + S - 2;
            if (ni < n) load_w(ni % S, kt0 + ni), load_x(ni % S, kt0 + ni);
            gemm_cp_commit();
            const uint32_t sw = s0 + (uint32_t)((i % S) * STAGE), sx = sw + (uint32_t)W_BYTES;
            gemm_wg_fence();
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const uint64_t db = gemm_desc(sx + 32u * (uint32_t)s);
                gemm_wgmma_kx<NX>(a, gemm_desc(sw + 32u * (uint32_t)s), db, i > 0 || s > 0);
                gemm_wgmma_kx<NX>(b, gemm_desc(sw + 8192u + 32u * (uint32_t)s), db, i > 0 || s > 0);
            }
            gemm_wg_commit();
            gemm_wg_wait<1>(); // k-tile i - 1's group is done with its slot
        }
        gemm_wg_wait<0>();
        gemm_cp_wait<0>();
#pragma unroll
        for (int j = 0; j < NA; j++) a[j] += 0.0f, b[j] += 0.0f; // -0 to +0: gemm_tc_kw16's sums start from +0
#else
        (void)a, (void)b;
        __trap();
#endif
    }

    // Float4 j of thread u (j < NQ / 2: rows 0-63, else 64-127; the m64nN accumulator's layout, W rows as M):
    // weight rows R, R + 8 of the half, tokens c, c + 1.
    __device__ __forceinline__ void put4(int odt, int j, int u, float4 v, float4 w) const
    {
        const int jj = j % (NQ / 2), R = (u >> 5) * 16 + ((u & 31) >> 2), c = i0 + jj * 8 + (u & 3) * 2;
        if constexpr (GU) { // v: the gate float4, w: its up float4
            const int f = r0 / 2 + R;
            gemm_gu_put1(p, odt, c, f, v.x, w.x);
            gemm_gu_put1(p, odt, c + 1, f, v.y, w.y);
            gemm_gu_put1(p, odt, c, f + 8, v.z, w.z);
            gemm_gu_put1(p, odt, c + 1, f + 8, v.w, w.w);
        } else {
            (void)odt, (void)w;
            const int r = r0 + (j / (NQ / 2)) * 64 + R;
            gemm_store4(p, {c, c + 1, c, c + 1}, {r, r, r + 8, r + 8}, v);
        }
    }

    __device__ __forceinline__ void run(int ks, int part, int lead, int odt)
    {
        float a[NA], b[NA];
        mainloop(a, b);
        const int t = (int)threadIdx.x;
        if (ks == 1) { // the whole sum is here: no partials
            if (r0 >= p.rows) return;
#pragma unroll
            for (int j = 0; j < NQ / 2; j++) {
                const float4 va = make_float4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]);
                const float4 vb = make_float4(b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]);
                if constexpr (GU) {
                    put4(odt, j, t, va, vb);
                } else {
                    put4(odt, j, t, va, va);
                    put4(odt, j + NQ / 2, t, vb, vb);
                }
            }
            return;
        }
        __syncthreads(); // the ring is free (every wgmma and copy waited for): the partial sums go there
        float4 *pp = (float4 *)gemm_dyn_smem;
#pragma unroll
        for (int j = 0; j < NQ / 2; j++) {
            pp[j * T + t] = make_float4(a[4 * j], a[4 * j + 1], a[4 * j + 2], a[4 * j + 3]);
            pp[(j + NQ / 2) * T + t] = make_float4(b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]);
        }
        gemm_cluster_sync(); // every CTA's partials written
        const uint32_t base = gemm_smem_addr(gemm_dyn_smem);
        const int tot = (GU ? NQ / 2 : NQ) * T, share = tot / ks; // GU: a gate float4 with its up float4
        for (int e = part * share + t; e < (part + 1) * share && r0 < p.rows; e += T) {
            const uint32_t ea = base + (uint32_t)e * 16u, eb = ea + (uint32_t)(NQ / 2 * T) * 16u;
            float4 v = gemm_ld_peer(ea, (unsigned)lead), w = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if constexpr (GU) w = gemm_ld_peer(eb, (unsigned)lead);
            for (int q = 1; q < ks; q++) {
                const float4 x = gemm_ld_peer(ea, (unsigned)(lead + q));
                v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
                if constexpr (GU) {
                    const float4 y = gemm_ld_peer(eb, (unsigned)(lead + q));
                    w.x += y.x, w.y += y.y, w.z += y.z, w.w += y.w;
                }
            }
            put4(odt, e / T, e % T, v, w);
        }
        gemm_cluster_sync(); // no CTA leaves while a peer may still read its partials
    }
};

// The CTA's group, tile and k-range (gemm_kw_run's, with groups of 128 tokens), then its width's body.
template <bool GU> __device__ __forceinline__ void gemm_kx_run(const ppn_kp_gemm &p, int odt)
{
    constexpr int BN = PPN_GEMM_TC_M_BN, CL = PPN_GEMM_TC_K_CLUSTER, BX = PPN_GEMM_TC_KX_BM;
    const int rank = (int)(blockIdx.x % CL), ks = p.ks, groups = (p.m + BX - 1) / BX, c = (int)blockIdx.x / CL;
    const int part = rank % ks, lead = rank - part;
    const int i0 = c % groups * BX, r0 = (c / groups * (CL / ks) + rank / ks) * BN, mg = min(p.m - i0, BX);
    const int kts = (p.cols + GEMM_H_BK - 1) / GEMM_H_BK, per = (kts + ks - 1) / ks;
    int kt0 = min(kts, part * per), kt1 = min(kts, kt0 + per);
    if (r0 >= p.rows) kt1 = kt0; // a cluster's tiles past the matrix: no loads, only the barriers
    switch ((mg + 15) >> 4) {
#define GEMM_KX_CASE(W)                                                                                           \
    case W / 16: {                                                                                                \
        gemm_kx<W, GU> k(p, i0, r0, mg, kt0, kt1);                                                                \
        k.run(ks, part, lead, odt);                                                                               \
        break;                                                                                                    \
    }
        GEMM_KX_CASE(16)
        GEMM_KX_CASE(32)
        GEMM_KX_CASE(48)
        GEMM_KX_CASE(64)
        GEMM_KX_CASE(80)
        GEMM_KX_CASE(96)
        GEMM_KX_CASE(112)
        GEMM_KX_CASE(128)
#undef GEMM_KX_CASE
    default: __trap();
    }
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS, 1)
    ppn_k_gemm_tc_kx(const ppn_kp_gemm_tc_kx p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kx_run<false>(p, PPN_DTYPE_F32);
#else
    __trap();
#endif
}

extern "C" __global__ void GEMM_K_CLUSTER_DIMS __launch_bounds__(PPN_GEMM_TC_M_THREADS, 1)
    ppn_k_gemm_swiglu_x(const ppn_kp_gemm_swiglu p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt != PPN_DTYPE_BF16) __trap();
    gemm_kx_run<true>(p.g, p.odt);
#else
    __trap();
#endif
}

// ---------------------------------------------------------------------------------------------------------
// gemm_tc_w (kparams.h; sm_90a): no K split. A CTA of WG consumer warpgroups and one producer warp owns 64 WG weight
// rows and BT tokens; blockIdx.x % (token tiles) is its token tile, so a weight tile's token tiles run side by side
// and share W through L2. The producer's lane arms slot i % S's full mbarrier with the stage's bytes and issues W's
// WG 64 x 64 boxes and x's BT x 64 box of k-tile i (zeros past the matrix: tokens past m add nothing and are not
// stored); the first S slots' weights go before the programmatic-launch wait (weights are immutable). Consumer
// warpgroup g waits for the slot, issues its four m64nBTk16 steps over weight rows 64 g .. 64 g + 63 as one wgmma
// group (A: the W box, B: the tokens, both in the 128-byte swizzle), keeps that group in flight while it waits for
// the previous one, and a lane of each warp then hands the previous slot back (the empty mbarrier counts 4 WG).
// The sums: one f32 accumulator from +0 through k16 steps in k order, gemm_tc_l's (and gemm_tc_kx's, whose operands
// sit as here, gave gemm_tc_kw's bits on an H100); the epilogue is gemm_store's.
template <int BT, int WG>
__device__ __forceinline__ void gemm_w_mma(float *acc, uint64_t da, uint64_t db)
{
    if constexpr (BT == 256) gemm_wgmma_ss<true>(acc, da, db, 1);
    else gemm_wgmma_kx<BT>(acc, da, db, 1);
}

// GU (gemm_swiglu_w; WG 2): the CTA's weight rows are gate rows 64 t .. 64 t + 63 (warpgroup 0) and the up rows
// pg.rows / 2 further (warpgroup 1), so thread u of each holds the same outputs' gate and up sums; after the k-loop
// warpgroup 1 puts its sums in the idle ring and warpgroup 0 stores silu(gate) * up (gemm_gu_put's arithmetic) in odt.
template <int BT, int WG, int S, bool GU = false>
__device__ __forceinline__ void gemm_w_run(const ppn_tmap &wmap, const ppn_tmap &xmap, const ppn_kp_gemm &pg,
                                           int odt = PPN_DTYPE_F32)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int BM = 64 * WG, W_BYTES = BM * 64 * 2, STAGE = W_BYTES + BT * 64 * 2;
    static_assert(STAGE % 1024 == 0 && S * STAGE + S * 16 <= (int)PPN_GEMM_TC_W_SMEM_MAX, "kparams.h's ring");
    static_assert(!GU || (WG == 2 && S * STAGE >= 128 * BT * 2), "gate|up: two warpgroups; the ring holds up's sums");
    const uint32_t s0 = gemm_smem_addr(gemm_dyn_smem), full = s0 + (uint32_t)(S * STAGE), empty = full + 8u * S;
    if (s0 & 1023u) __trap(); // the swizzle atoms must sit on 1024-byte boundaries
    const int ntt = (pg.m + BT - 1) / BT, t0 = ((int)blockIdx.x % ntt) * BT;
    const int r0 = ((int)blockIdx.x / ntt) * (GU ? 64 : BM), half = pg.rows / 2;
    const int n = pg.cols / 64, warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
    gemm_ring_init(full, empty, S, 4u * WG); // empty: a lane of each consumer warp
    if (warp == 4 * WG) { // the producer
        if (lane != 0) return;
        auto weights = [&](int st, int kt) {
#pragma unroll
            for (int g = 0; g < WG; g++)
                gemm_tma_2d(s0 + (uint32_t)(st * STAGE + g * 8192), &wmap, kt * 64, GU ? r0 + half * g : r0 + 64 * g,
                            full + 8u * st);
        };
        const int pre = n < S ? n : S;
        for (int i = 0; i < pre; i++) {
            gemm_mbar_expect(full + 8u * i, (unsigned)STAGE);
            weights(i, i);
        }
        ppn_pdl_wait();
        for (int i = 0; i < n; i++) {
            const int st = i % S;
            if (i >= S) {
                gemm_mbar_wait(empty + 8u * st, (unsigned)((i / S - 1) & 1));
                gemm_mbar_expect(full + 8u * st, (unsigned)STAGE);
                weights(st, i);
            }
            gemm_tma_2d(s0 + (uint32_t)(st * STAGE + W_BYTES), &xmap, i * 64, t0, full + 8u * st);
        }
        return;
    }
    const int g = warp >> 2;
    float acc[BT / 2];
#pragma unroll
    for (int j = 0; j < BT / 2; j++) acc[j] = 0.0f;
    for (int i = 0; i < n; i++) {
        const int st = i % S;
        gemm_mbar_wait(full + 8u * st, (unsigned)((i / S) & 1));
        const uint32_t sb = s0 + (uint32_t)(st * STAGE);
        gemm_wg_fence();
#pragma unroll
        for (int q = 0; q < 4; q++)
            gemm_w_mma<BT, WG>(acc, gemm_desc(sb + (uint32_t)(g * 8192 + 32 * q)),
                               gemm_desc(sb + (uint32_t)(W_BYTES + 32 * q)));
        gemm_wg_commit();
        gemm_wg_wait<1>(); // k-tile i - 1's group is done with its slot
        if (i > 0) {
            __syncwarp();
            if (lane == 0) gemm_mbar_arrive(empty + 8u * ((i - 1) % S));
        }
    }
    gemm_wg_wait<0>();
    ppn_pdl_wait(); // res (the residual stream) and out: the previous kernels' to read and to overwrite
    // acc[j]: weight row 16 (warp % 4) + lane / 4 + 8 ((j / 2) % 2) of the warpgroup's 64, token
    // 8 (j / 4) + 2 (lane % 4) + j % 2 of the tile's; stored 16 at a time, each group's res read first
    const int rb = r0 + 64 * g + 16 * (warp & 3) + (lane >> 2), tb = t0 + 2 * (lane & 3);
    if constexpr (GU) {
        // Every consumer's wgmma has read its last slot (the wait above), and the producer issued nothing past
        // the last k-tile, whose full mbarrier every consumer passed: the ring is idle once both warpgroups meet.
        float *up = (float *)gemm_dyn_smem;
        const int u = (int)threadIdx.x & 127;
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (g == 1) {
#pragma unroll
            for (int j = 0; j < BT / 2; j++) up[j * 128 + u] = acc[j];
        }
        asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if (g == 1) return;
#pragma unroll
        for (int j = 0; j < BT / 2; j++)
            gemm_gu_put1(pg, odt, tb + 8 * (j >> 2) + (j & 1), rb + 8 * ((j >> 1) & 1), acc[j], up[j * 128 + u]);
    } else {
#pragma unroll
        for (int c = 0; c < BT / 2; c += 16) {
            int ti[16], ri[16];
            float v[16];
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int a = c + j;
                ti[j] = tb + 8 * (a >> 2) + (a & 1), ri[j] = rb + 8 * ((a >> 1) & 1), v[j] = acc[a];
            }
            gemm_store_n(pg, ti, ri, v);
        }
    }
#else
    (void)wmap, (void)xmap, (void)pg, (void)odt;
    __trap();
#endif
}

// The form kparams.h names for p.g.m (PPN_GEMM_TC_W_BT, _WG, _STAGES); bf16 W only (the op's check).
extern "C" __global__ void __launch_bounds__(PPN_GEMM_TC_W_THREADS_MAX, 1)
    ppn_k_gemm_tc_w(const __grid_constant__ ppn_kp_gemm_tc_w p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt != PPN_DTYPE_BF16 || p.g.cols % 64 || (int)blockDim.x != PPN_GEMM_TC_W_THREADS(p.g.m)) __trap();
    switch (PPN_GEMM_TC_W_BT(p.g.m)) {
    case 32: gemm_w_run<32, PPN_GEMM_TC_W_WG(32), PPN_GEMM_TC_W_STAGES(32)>(p.wmap, p.xmap, p.g); break;
    case 64: gemm_w_run<64, PPN_GEMM_TC_W_WG(64), PPN_GEMM_TC_W_STAGES(64)>(p.wmap, p.xmap, p.g); break;
    case 128: gemm_w_run<128, PPN_GEMM_TC_W_WG(128), PPN_GEMM_TC_W_STAGES(128)>(p.wmap, p.xmap, p.g); break;
    default: gemm_w_run<256, PPN_GEMM_TC_W_WG(256), PPN_GEMM_TC_W_STAGES(256)>(p.wmap, p.xmap, p.g); break;
    }
#else
    __trap();
#endif
}

// gemm_swiglu_w (kparams.h): gemm_tc_w's k-loop over a gate|up matrix, two warpgroups (gate, up) of 64 rows a CTA,
// a ring of about 96 KB (two CTAs an SM), SwiGLU in the epilogue; bf16 W, up to PPN_GEMM_SWIGLU_W_MAX_M tokens.
extern "C" __global__ void __launch_bounds__(PPN_GEMM_SWIGLU_W_THREADS, 2)
    ppn_k_gemm_swiglu_w(const __grid_constant__ ppn_kp_gemm_swiglu_w p)
{
    ppn_pdl_trigger();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (p.g.wdt != PPN_DTYPE_BF16 || p.g.cols % 64 || p.g.rows % 128 || p.g.m > PPN_GEMM_SWIGLU_W_MAX_M ||
        (int)blockDim.x != PPN_GEMM_SWIGLU_W_THREADS)
        __trap();
    switch (PPN_GEMM_SWIGLU_W_BT(p.g.m)) {
    case 32: gemm_w_run<32, 2, PPN_GEMM_SWIGLU_W_STAGES(32), true>(p.wmap, p.xmap, p.g, p.odt); break;
    case 64: gemm_w_run<64, 2, PPN_GEMM_SWIGLU_W_STAGES(64), true>(p.wmap, p.xmap, p.g, p.odt); break;
    default: gemm_w_run<128, 2, PPN_GEMM_SWIGLU_W_STAGES(128), true>(p.wmap, p.xmap, p.g, p.odt); break;
    }
#else
    __trap();
#endif
}
