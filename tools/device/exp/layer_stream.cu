// Experiment (not part of ppn's build): how close to the copy floor can a decode layer's four GEMMs come at 16
// tokens when the weight stream never stops at a kernel boundary? docs/PERF.md (2026-12-07) lists "a persistent
// kernel per stage" as the lever not built: at B=16 the 8B's GEMMs take 175 us a layer alone on an H100 against
// their 147 us copy floor, the two small matrices (q|k|v, o) furthest off (74% and 59%), since each launch pays
// its ring's start and its tail while the bus idles.
//
// ls_layer: one launch walks phases (GEMMs) y_p[m, n_p] += x_p[m, k_p] . W_p[n_p, k_p]^T, m <= 16, bf16 x and W
// row-major, f32 y (zero before the launch), n_p % BN == 0, k_p % 64 == 0. One CTA an SM, all resident. A phase's
// work is its (BN-row tile, 64-column k-tile) pairs in tile-major order, cut into equal contiguous shares, one a
// CTA (stream-K): every CTA moves the same bytes a phase. A CTA is WARPS consumer warps (16 W rows each, mma.sync
// m16n8k16, W's fragments by ldmatrix), one W producer warp and one x producer warp over a ring of S stages (a W
// k-tile of BN x 64 and an x k-tile of 16 x 64, bf16, 16-byte chunk c of row r at c ^ (r % 8)), each stage with a
// full barrier for W, one for x (cp.async, each lane's copies arriving on it) and one empty barrier (a lane a
// consumer warp). The W producer never waits for data: its next phase's first k-tiles enter the ring while the
// current phase ends. With barrier = 1 the x producer starts phase p + 1 only after every CTA has finished phase p
// (a counter a phase, release / acquire), as the forward's next GEMM depends on the last one's output (through
// attention or a norm, left out here: their cost is not in this measure). A share's partial sums go to y by
// atomic adds where its tile changes or ends (f32, order not fixed: a timing experiment, not ppn's bits).
//
// Built by tools/device/exp/layer_stream.py on the GPU machine: nvcc -cubin -arch=sm_90a.
#include <cuda_bf16.h>
#include <stdint.h>

struct ls_phase {
    uint64_t w, x, y; // W [n, k], x [m, k] bf16; y [m, n] f32
    int n, k;
};

struct ls_params {
    const ls_phase *ph; // nph phases, in device memory
    unsigned *count;    // a counter a phase, zero before the launch
    int nph, m, barrier;
};

__device__ __forceinline__ uint32_t ls_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ls_mb_init(uint32_t b, unsigned n)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(n) : "memory");
}

__device__ __forceinline__ void ls_mb_arrive(uint32_t b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(b) : "memory");
}

__device__ __forceinline__ void ls_mb_wait(uint32_t b, unsigned parity)
{
    asm volatile("{\n.reg .pred p;\nLS_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra LS_WAIT_%=;\n}\n" ::"r"(b),
                 "r"(parity)
                 : "memory");
}

__device__ __forceinline__ void ls_cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// This lane's earlier cp.async copies arrive on barrier b when they land (counted in its expected arrivals).
__device__ __forceinline__ void ls_cp_arrive(uint32_t b)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(b) : "memory");
}

// CTA c's share of a phase of T k-tiles over G CTAs: [*w0, *w1).
__device__ __forceinline__ void ls_share(int T, int c, int G, int *w0, int *w1)
{
    *w0 = (int)((long long)T * c / G), *w1 = (int)((long long)T * (c + 1) / G);
}

template <int WARPS, int S> __device__ __forceinline__ void ls_body(const ls_params &p)
{
    constexpr int BN = 16 * WARPS, W_BYTES = BN * 128, X_BYTES = 16 * 128, STAGE = W_BYTES + X_BYTES;
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) uint64_t full_w[S], full_x[S], empty[S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = blockIdx.x, G = gridDim.x;
    const uint32_t ring = ls_smem(smem);

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++)
            ls_mb_init(ls_smem(&full_w[s]), 32), ls_mb_init(ls_smem(&full_x[s]), 32),
                ls_mb_init(ls_smem(&empty[s]), WARPS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= WARPS) { // producers: warp WARPS streams W, warp WARPS + 1 streams x
        const bool wp = warp == WARPS;
        int i = 0;
        for (int ph = 0; ph < p.nph; ph++) {
            const ls_phase P = p.ph[ph];
            const int kts = P.k / 64, T = P.n / BN * kts;
            int w0, w1;
            ls_share(T, c, G, &w0, &w1);
            if (!wp && p.barrier && ph > 0) { // x of this phase: only once every CTA has finished the last one
                if (lane == 0) {
                    unsigned v;
                    do {
                        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p.count + ph - 1) : "memory");
                    } while (v < (unsigned)G);
                }
                __syncwarp();
            }
            for (int w = w0; w < w1; w++, i++) {
                const int s = i % S, tile = w / kts, kt = w % kts;
                if (i >= S) ls_mb_wait(ls_smem(&empty[s]), (unsigned)((i / S - 1) & 1));
                const uint32_t st = ring + (uint32_t)(s * STAGE);
                if (wp) {
                    const __nv_bfloat16 *W = (const __nv_bfloat16 *)P.w;
#pragma unroll
                    for (int e = 0; e < BN * 8 / 32; e++) {
                        const int idx = lane + 32 * e, r = idx >> 3, ch = idx & 7;
                        ls_cp16(st + (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4)),
                                W + (size_t)(tile * BN + r) * P.k + kt * 64 + ch * 8, true);
                    }
                    ls_cp_arrive(ls_smem(&full_w[s]));
                } else {
                    const __nv_bfloat16 *X = (const __nv_bfloat16 *)P.x;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int idx = lane + 32 * e, r = idx >> 3, ch = idx & 7;
                        const bool ok = r < p.m;
                        ls_cp16(st + (uint32_t)(W_BYTES + r * 128 + ((ch ^ (r & 7)) << 4)),
                                X + (size_t)(ok ? r : 0) * P.k + kt * 64 + ch * 8, ok);
                    }
                    ls_cp_arrive(ls_smem(&full_x[s]));
                }
            }
        }
        return;
    }

    // consumers: warp's 16 W rows of each k-tile, 16 tokens in two n8 tiles
    const int g = lane >> 2, t = lane & 3;
    float acc[2][4];
#pragma unroll
    for (int j = 0; j < 2; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    int i = 0;
    for (int ph = 0; ph < p.nph; ph++) {
        const ls_phase P = p.ph[ph];
        const int kts = P.k / 64, T = P.n / BN * kts;
        int w0, w1;
        ls_share(T, c, G, &w0, &w1);
        float *Y = (float *)P.y;
        for (int w = w0; w < w1; w++, i++) {
            const int s = i % S, tile = w / kts, kt = w % kts;
            const unsigned par = (unsigned)((i / S) & 1);
            ls_mb_wait(ls_smem(&full_w[s]), par);
            ls_mb_wait(ls_smem(&full_x[s]), par);
            const uint32_t st = ring + (uint32_t)(s * STAGE);
            const unsigned char *xs = smem + s * STAGE + W_BYTES;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t a0, a1, a2, a3;
                {
                    const int mj = lane >> 3, r = warp * 16 + (lane & 7) + 8 * (mj & 1), ch = 2 * q + (mj >> 1);
                    const uint32_t ad = st + (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4));
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                                 : "r"(ad));
                }
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tok = 8 * j + g;
                    const uint32_t b0 = *(const uint32_t *)(xs + tok * 128 + (((2 * q) ^ (tok & 7)) << 4) + 4 * t);
                    const uint32_t b1 = *(const uint32_t *)(xs + tok * 128 + (((2 * q + 1) ^ (tok & 7)) << 4) + 4 * t);
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                                 : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                }
            }
            __syncwarp();
            if (lane == 0) ls_mb_arrive(ls_smem(&empty[s]));
            if (kt == kts - 1 || w == w1 - 1) { // the share leaves this tile: its partial sums into y
                const int r = tile * BN + warp * 16 + g;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int t0 = 8 * j + 2 * t;
                    if (t0 < p.m) atomicAdd(Y + (size_t)t0 * P.n + r, acc[j][0]), atomicAdd(Y + (size_t)t0 * P.n + r + 8, acc[j][2]);
                    if (t0 + 1 < p.m)
                        atomicAdd(Y + (size_t)(t0 + 1) * P.n + r, acc[j][1]),
                            atomicAdd(Y + (size_t)(t0 + 1) * P.n + r + 8, acc[j][3]);
                    acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
                }
            }
        }
        // this CTA's share of the phase is in y: count it (the consumers' threads first, then one release)
        asm volatile("bar.sync 1, %0;\n" ::"n"(32 * WARPS) : "memory");
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(p.count + ph, 1u);
        }
    }
}

#ifndef LS_HELPERS_ONLY // layer_chain.cu takes the helpers above, not these kernels
#define LS_KERNEL(WARPS, S)                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * (WARPS) + 64, 1) ls_layer_##WARPS##_##S(const ls_params p)   \
    {                                                                                                               \
        ls_body<WARPS, S>(p);                                                                                       \
    }

LS_KERNEL(4, 16)
LS_KERNEL(8, 6)
LS_KERNEL(8, 9)
LS_KERNEL(8, 12)
LS_KERNEL(16, 6)
#endif
