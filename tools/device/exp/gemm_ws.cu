// Experiment (not part of ppn's build): a GEMM in the shape of the fastest library kernels at 16-2,048 tokens
// (docs/PERF.md, 2026-12-06 evening: cuBLAS's nvjet kernels 1.1-2.8x ahead of ppn's tiles from 64 tokens on).
// y[m, N] = x[m, K] . W[N, K]^T, bf16 in, f32 sums, bf16 out; x and W row-major, K % 64 == 0, N % (64 WG) == 0.
//
// A CTA of 128 WG + 32 threads: warps 0 .. 4 WG - 1 are WG consumer warpgroups, warp 4 WG the producer. The CTA
// owns 64 WG rows of W (64 a warpgroup), a range of K's 64-column k-tiles (one of ks) and BT tokens (32-256). The
// producer's one lane streams W's 64 WG x 64 box and x's BT x 64 box of each k-tile through the tensor memory
// accelerator into a ring of S stages (128-byte swizzle), each stage's full barrier counting its bytes; each
// consumer warpgroup issues the k-tile's four m64nBTk16 steps over its 64 rows as one wgmma group with W as A and x
// as B (both from shared memory), keeps that group in flight while waiting for the previous one, then hands the
// previous stage back on its empty barrier (a lane a warp). With ks > 1 each CTA writes its f32 partial sums to a
// workspace; the last CTA of a tile to finish (a counter per tile) adds the ks partials in k order and writes y, so
// the bits do not depend on which CTA finishes last. Where there are several token tiles the grid can put a W
// tile's token tiles next to each other (tok_fast), so they share W through L2.
//
// Built by tools/device/exp/gemm_ws.py on the GPU machine: nvcc -cubin -arch=sm_90a.
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mb_init(uint32_t b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(count) : "memory");
}

__device__ __forceinline__ void mb_expect(uint32_t b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mb_arrive(uint32_t b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
}

__device__ __forceinline__ void mb_wait(uint32_t b, unsigned parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT_%=;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

// K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t a)
{
    return (uint64_t)((a & 0x3ffffu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

#define WS_R0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define WS_R1 WS_R0 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define WS_R2 WS_R1 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define WS_R3 WS_R2 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define WS_R4 WS_R3 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define WS_R5 WS_R4 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define WS_R6 WS_R5 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define WS_R7 WS_R6 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define WS_R15 WS_R7 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, "    \
    "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, "     \
    "%121, %122, %123, %124, %125, %126, %127"
#define O8(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
#define WS_MMA(NS, REGS, IA, IB, IK, ...)                                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " IK ", 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n" NS "k16.f32.bf16.bf16 {" REGS "}, " IA ", " IB                 \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                            \
                 : __VA_ARGS__                                                                                      \
                 : "l"(da), "l"(db), "r"(keep))

template <int N> __device__ __forceinline__ void mma(float *d, uint64_t da, uint64_t db, int keep)
{
    if constexpr (N == 32) {
        WS_MMA("32", WS_R1, "%16", "%17", "%18", O8(d, 0), O8(d, 8));
    } else if constexpr (N == 64) {
        WS_MMA("64", WS_R3, "%32", "%33", "%34", O8(d, 0), O8(d, 8), O8(d, 16), O8(d, 24));
    } else if constexpr (N == 80) {
        WS_MMA("80", WS_R4, "%40", "%41", "%42", O8(d, 0), O8(d, 8), O8(d, 16), O8(d, 24), O8(d, 32));
    } else if constexpr (N == 128) {
        WS_MMA("128", WS_R7, "%64", "%65", "%66", O8(d, 0), O8(d, 8), O8(d, 16), O8(d, 24), O8(d, 32), O8(d, 40),
               O8(d, 48), O8(d, 56));
    } else if constexpr (N == 256) {
        WS_MMA("256", WS_R15, "%128", "%129", "%130", O8(d, 0), O8(d, 8), O8(d, 16), O8(d, 24), O8(d, 32), O8(d, 40),
               O8(d, 48), O8(d, 56), O8(d, 64), O8(d, 72), O8(d, 80), O8(d, 88), O8(d, 96), O8(d, 104), O8(d, 112),
               O8(d, 120));
    } else {
        static_assert(N == 32, "the token tiles built here: 32, 64, 80, 128, 256");
    }
}

// Consumer warpgroup g's walk over nkt k-tiles of the ring (S stages STAGE_AL bytes apart, W's box first): each
// stage's four m64nBTk16 steps as one wgmma group into acc, kept in flight while the previous one is waited for, whose
// stage a lane of each warp then hands back on its empty barrier; every group waited for on return.
template <int BT, int S, int STAGE_AL, int W_BYTES>
__device__ __forceinline__ void ws_consume(float *acc, unsigned char *ring, uint64_t *full, uint64_t *empty, int nkt,
                                           int g, int lane)
{
    for (int i = 0; i < nkt; i++) {
        const int s = i % S;
        mb_wait(smem_u32(&full[s]), (unsigned)((i / S) & 1));
        const uint32_t st = smem_u32(ring + s * STAGE_AL);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int q = 0; q < 4; q++)
            mma<BT>(acc, desc_sw128(st + (uint32_t)g * 8192u + 32u * q), desc_sw128(st + W_BYTES + 32u * q), 1);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (i > 0 && lane == 0) mb_arrive(smem_u32(&empty[(i - 1) % S]));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

struct ws_params {
    __nv_bfloat16 *y; // [m, n]
    float *ws;        // [ks, m, n] partial sums (ks > 1)
    unsigned *count;  // a counter per (W tile, token tile), zero before the launch; left zero after it
    int m, n, k, ks;
    int tok_fast; // 1: blockIdx.x is the token tile and blockIdx.z the W tile (a W tile's token tiles run together)
};

template <int BT, int S, int WG>
__device__ __forceinline__ void gemm_ws_body(const CUtensorMap *wmap, const CUtensorMap *xmap, const ws_params &p)
{
    constexpr int BM = 64 * WG, CT = 128 * WG; // W rows a CTA (64 a consumer warpgroup); consumer threads
    constexpr int W_BYTES = BM * 64 * 2, X_BYTES = BT * 64 * 2, STAGE = W_BYTES + X_BYTES;
    constexpr int STAGE_AL = (STAGE + 1023) / 1024 * 1024;
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char *ring = (unsigned char *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full[S], empty[S];
    __shared__ int last;

    const int tile = p.tok_fast ? blockIdx.z : blockIdx.x, ttile = p.tok_fast ? blockIdx.x : blockIdx.z;
    const int ntiles = p.tok_fast ? gridDim.z : gridDim.x;
    const int split = blockIdx.y, t0 = ttile * BT;
    const int kt_all = p.k / 64, per = (kt_all + p.ks - 1) / p.ks;
    const int kt0 = split * per, kt1 = min(kt_all, kt0 + per), nkt = kt1 - kt0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = warp >> 2;

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mb_init(smem_u32(&full[s]), 1), mb_init(smem_u32(&empty[s]), 4 * WG);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == 4 * WG) { // the producer
        if (lane == 0) {
            for (int i = 0; i < nkt; i++) {
                const int s = i % S;
                if (i >= S) mb_wait(smem_u32(&empty[s]), (unsigned)((i / S - 1) & 1));
                const uint32_t st = smem_u32(ring + s * STAGE_AL), fb = smem_u32(&full[s]);
                mb_expect(fb, STAGE);
                tma_2d(st, wmap, (kt0 + i) * 64, tile * BM, fb);
                tma_2d(st + W_BYTES, xmap, (kt0 + i) * 64, t0, fb);
            }
        }
        return;
    }

    float acc[BT / 2];
#pragma unroll
    for (int j = 0; j < BT / 2; j++) acc[j] = 0.f;
    ws_consume<BT, S, STAGE_AL, W_BYTES>(acc, ring, full, empty, nkt, g, lane);

    // acc[j]: W row 16 (warp % 4) + lane / 4 + 8 ((j / 2) % 2) of the warpgroup's 64,
    //        token 8 (j / 4) + 2 (lane % 4) + j % 2
    const int r_base = tile * BM + g * 64 + (warp & 3) * 16 + (lane >> 2);
    if (p.ks == 1) {
#pragma unroll
        for (int j = 0; j < BT / 2; j++) {
            const int r = r_base + 8 * ((j >> 1) & 1), t = t0 + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
            if (t < p.m) p.y[(size_t)t * p.n + r] = __float2bfloat16(acc[j]);
        }
        return;
    }
    float *mine = p.ws + (size_t)split * p.m * p.n;
#pragma unroll
    for (int j = 0; j < BT / 2; j++) {
        const int r = r_base + 8 * ((j >> 1) & 1), t = t0 + 8 * (j >> 2) + 2 * (lane & 3) + (j & 1);
        if (t < p.m) mine[(size_t)t * p.n + r] = acc[j];
    }
    __threadfence();
    asm volatile("bar.sync 1, %0;\n" ::"n"(CT) : "memory");
    unsigned *c = p.count + (size_t)ttile * ntiles + tile;
    if (threadIdx.x == 0) last = atomicAdd(c, 1u) == (unsigned)(p.ks - 1);
    asm volatile("bar.sync 1, %0;\n" ::"n"(CT) : "memory");
    if (!last) return;
    __threadfence();
    // the last CTA of the tile: every split's sums in k order, coalesced over the tile's BM rows
    for (int e = threadIdx.x; e < BM * BT; e += CT) {
        const int t = t0 + e / BM, r = tile * BM + e % BM;
        if (t >= p.m) continue;
        float v = 0.f;
        for (int q = 0; q < p.ks; q++) v += __ldcg(p.ws + ((size_t)q * p.m + t) * p.n + r);
        p.y[(size_t)t * p.n + r] = __float2bfloat16(v);
    }
    if (threadIdx.x == 0) *c = 0;
}

#ifndef GEMM_WS_HELPERS_ONLY // gemm_wk.cu takes the helpers above, not these kernels
#define WS_KERNEL(BT, S, WG)                                                                                        \
    extern "C" __global__ void __launch_bounds__(128 * WG + 32, 1)                                                  \
        gemm_ws_##BT##_##S##_##WG(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, \
                                  const ws_params p)                                                                \
    {                                                                                                               \
        gemm_ws_body<BT, S, WG>(&wmap, &xmap, p);                                                                   \
    }

WS_KERNEL(32, 8, 1)
WS_KERNEL(32, 16, 1)
WS_KERNEL(64, 4, 1)
WS_KERNEL(64, 8, 1)
WS_KERNEL(64, 12, 1)
WS_KERNEL(80, 8, 1)
WS_KERNEL(128, 4, 1)
WS_KERNEL(128, 6, 1)
WS_KERNEL(128, 8, 1)
WS_KERNEL(256, 5, 1)
WS_KERNEL(128, 6, 2)
WS_KERNEL(256, 4, 2)
#endif
