// Experiment (not part of ppn's build): two questions about gemm_tc_w (kernels/gemm.cu) at 16-128 tokens.
//  1. Inside a step it took ~51 us a launch against 33.6 in the decode table's bursts (docs/PERF.md, 2026-12-06
//     night). Is that the bursts' doing? Each kernel here comes with and without programmatic dependent launch
//     (PDL: launch_dependents at entry, W's first ring stages before the launch wait, as gemm_tc_w does) and with
//     and without a residual epilogue (f32 out = sums + f32 res, as the forward's o and down), and the harness
//     times it alone in bursts and behind a small predecessor (wk_pre, an RMS norm of m rows writing x, as the
//     forward's q|k|v and gate|up have).
//  2. gemm_tc_w gives the 8B's q|k|v, o and down 64-96 CTAs of 64 weight rows on 132 SMs, one an SM. Does a K split
//     over a thread-block cluster (ks CTAs a tile, each a range of whole k-tiles, partial sums added in k order
//     through distributed shared memory: no workspace, no counter; gemm_ws's workspace split lost 2-5x) with a
//     shallower ring (2-3 CTAs an SM) move W faster?
// y[m, N] = x[m, K] . W[N, K]^T, x and W bf16 row-major, f32 sums; K % 64 == 0, N % (64 WG) == 0.
//
// A CTA of 128 WG + 32 threads: WG consumer warpgroups (64 W rows each), then one producer warp whose lane 0 streams
// W's 64 WG x 64 box and x's BT x 64 box of each of its k-tiles through the tensor memory accelerator into a ring
// of S stages (gemm_ws's loop). Grid: x = ks (one cluster of ks CTAs, %cluster_ctarank = the k-range), y = W tile,
// z = token tile. The k-ranges are ceil(K / 64 / ks) k-tiles each, as ppn's split-K tiles cut them. With ks > 1 each
// CTA puts its sums in its ring after a block barrier ([float4 q][consumer thread], the accumulator's order), a
// cluster barrier, then each CTA adds a 1 / ks share from all ks CTAs in rank order and stores it, and a second
// cluster barrier keeps the rings alive until every peer has read them.
//
// Built by tools/device/exp/gemm_wk.py on the GPU machine: nvcc -cubin -arch=sm_90a.
#define GEMM_WS_HELPERS_ONLY
#include "gemm_ws.cu"

struct wk_params {
    void *y;          // [m, n]: bf16, or with RES f32 = sums + res
    const float *res; // [m, n] f32 (RES)
    int m, n, k;
};

__device__ __forceinline__ unsigned wk_sreg_rank(void)
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned wk_sreg_ctas(void)
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ void wk_cluster_sync(void)
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The float4 at shared address a of cluster rank r.
__device__ __forceinline__ float4 wk_peer(uint32_t a, unsigned r)
{
    uint32_t ra;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(r));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(ra)
                 : "memory");
    return v;
}

template <bool PDL> __device__ __forceinline__ void wk_trigger(void)
{
    if constexpr (PDL) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

template <bool PDL> __device__ __forceinline__ void wk_wait(void)
{
    if constexpr (PDL) asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

template <bool RES> __device__ __forceinline__ void wk_put(const wk_params &p, int t, int r, float v)
{
    if (t >= p.m) return;
    const size_t o = (size_t)t * p.n + r;
    if constexpr (RES) ((float *)p.y)[o] = v + p.res[o];
    else ((__nv_bfloat16 *)p.y)[o] = __float2bfloat16(v);
}

// Float4 q of consumer thread u: acc[4 q .. 4 q + 3], W rows rb, rb + 8 (rb: warp u / 32's 16, lane / 4) and tokens
// 8 q + 2 (lane % 4) + {0, 1} of the token tile.
template <bool RES>
__device__ __forceinline__ void wk_put4(const wk_params &p, int tile, int bm, int t0, int q, int u, float4 v)
{
    const int w = u >> 5, l = u & 31, rb = tile * bm + (w >> 2) * 64 + (w & 3) * 16 + (l >> 2);
    const int t = t0 + 8 * q + 2 * (l & 3);
    wk_put<RES>(p, t, rb, v.x);
    wk_put<RES>(p, t + 1, rb, v.y);
    wk_put<RES>(p, t, rb + 8, v.z);
    wk_put<RES>(p, t + 1, rb + 8, v.w);
}

template <int BT, int S, int WG, bool PDL, bool RES>
__device__ __forceinline__ void gemm_wk_body(const CUtensorMap *wmap, const CUtensorMap *xmap, const wk_params &p)
{
    constexpr int BM = 64 * WG, CT = 128 * WG, W_BYTES = BM * 64 * 2, X_BYTES = BT * 64 * 2, STAGE = W_BYTES + X_BYTES;
    constexpr int STAGE_AL = (STAGE + 1023) / 1024 * 1024, NQ = BT / 8; // float4s of sums a consumer thread holds
    static_assert(NQ * CT * 16 <= S * STAGE_AL, "the partial sums fit the ring");
    wk_trigger<PDL>();
    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char *ring = (unsigned char *)(((uintptr_t)smem + 1023) & ~(uintptr_t)1023);
    __shared__ __align__(8) uint64_t full[S], empty[S];

    const int ks = (int)wk_sreg_ctas(), part = (int)wk_sreg_rank(), tile = blockIdx.y, t0 = blockIdx.z * BT;
    const int kt_all = p.k / 64, per = (kt_all + ks - 1) / ks;
    const int kt0 = min(kt_all, part * per), kt1 = min(kt_all, kt0 + per), nkt = kt1 - kt0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = warp >> 2;

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mb_init(smem_u32(&full[s]), 1), mb_init(smem_u32(&empty[s]), 4 * WG);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    float acc[BT / 2];
#pragma unroll
    for (int j = 0; j < BT / 2; j++) acc[j] = 0.f;
    if (warp == 4 * WG) { // the producer: W's first S stages before the launch wait (weights are immutable)
        if (lane == 0) {
            auto weights = [&](int i) {
                const uint32_t fb = smem_u32(&full[i % S]);
                mb_expect(fb, STAGE);
                tma_2d(smem_u32(ring + (i % S) * STAGE_AL), wmap, (kt0 + i) * 64, tile * BM, fb);
            };
            const int pre = nkt < S ? nkt : S;
            for (int i = 0; i < pre; i++) weights(i);
            wk_wait<PDL>(); // x: the predecessor's
            for (int i = 0; i < nkt; i++) {
                if (i >= S) {
                    mb_wait(smem_u32(&empty[i % S]), (unsigned)((i / S - 1) & 1));
                    weights(i);
                }
                tma_2d(smem_u32(ring + (i % S) * STAGE_AL) + W_BYTES, xmap, (kt0 + i) * 64, t0,
                       smem_u32(&full[i % S]));
            }
        }
        __syncwarp();
    } else {
        ws_consume<BT, S, STAGE_AL, W_BYTES>(acc, ring, full, empty, nkt, g, lane);
    }
    wk_wait<PDL>(); // y and res: the predecessor's to read and overwrite
    const int u = threadIdx.x;
    if (ks == 1) {
        if (u < CT)
#pragma unroll
            for (int q = 0; q < NQ; q++)
                wk_put4<RES>(p, tile, BM, t0, q, u, make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
        return;
    }
    __syncthreads(); // every warpgroup is done with the ring: the partial sums go there
    float4 *pp = (float4 *)ring;
    if (u < CT)
#pragma unroll
        for (int q = 0; q < NQ; q++) pp[q * CT + u] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
    wk_cluster_sync(); // every CTA's partials written
    const int share = NQ * CT / ks;
    const uint32_t base = smem_u32(ring);
    if (u < CT)
        for (int e = part * share + u; e < (part + 1) * share; e += CT) {
            const uint32_t a = base + (uint32_t)e * 16u;
            float4 v = wk_peer(a, 0);
            for (int r = 1; r < ks; r++) {
                const float4 w = wk_peer(a, (unsigned)r);
                v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
            }
            wk_put4<RES>(p, tile, BM, t0, e / CT, e % CT, v);
        }
    wk_cluster_sync(); // no CTA leaves while a peer may still read its partials
}

#define WK_KERNEL(BT, S, WG, PDL, RES)                                                                              \
    extern "C" __global__ void __launch_bounds__(128 * WG + 32, 1)                                                  \
        gemm_wk_##BT##_##S##_##WG##_##PDL##RES(const __grid_constant__ CUtensorMap wmap,                            \
                                               const __grid_constant__ CUtensorMap xmap, const wk_params p)         \
    {                                                                                                               \
        gemm_wk_body<BT, S, WG, PDL, RES>(&wmap, &xmap, p);                                                         \
    }
#define WK_FORMS(BT, S, WG) WK_KERNEL(BT, S, WG, 0, 0) WK_KERNEL(BT, S, WG, 1, 0) WK_KERNEL(BT, S, WG, 1, 1)

// (BT, S, WG): gemm_tc_w's forms (kparams.h: 32 / 16, 64 / 12, 128 / 8, one warpgroup: 192 KB, one CTA an SM) and
// shallower rings that let 2-4 CTAs share an SM (for ks > 1: each CTA walks 1 / ks of K).
WK_FORMS(32, 16, 1)
WK_FORMS(32, 4, 1)
WK_FORMS(64, 12, 1)
WK_FORMS(64, 4, 1)
WK_FORMS(128, 8, 1)
WK_FORMS(128, 3, 1)
WK_FORMS(128, 4, 2)
WK_FORMS(128, 3, 2)

// The predecessor: x[t, :] = bf16(h[t, :] / rms(h[t, :])), a CTA of 256 threads a token row (the forward's RMS norm
// before q|k|v and gate|up, without the weight). With pdl: launch_dependents at entry, then the launch wait (x is
// the previous GEMM's to read).
extern "C" __global__ void __launch_bounds__(256) wk_pre(const float *h, __nv_bfloat16 *x, int k, int pdl)
{
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
        asm volatile("griddepcontrol.wait;\n" ::: "memory");
    }
    __shared__ float part[8];
    const float *row = h + (size_t)blockIdx.x * k;
    float s = 0.f;
    for (int i = threadIdx.x; i < k; i += 256) s += row[i] * row[i];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < 8; w++) s += part[w];
    const float inv = rsqrtf(s / (float)k + 1e-5f);
    for (int i = threadIdx.x; i < k; i += 256) x[(size_t)blockIdx.x * k + i] = __float2bfloat16(row[i] * inv);
}
