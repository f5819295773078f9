// Experiment (not part of ppn's build): layer_stream.cu's persistent weight stream with what stands between a decode
// layer's GEMMs in ppn's forward done inside the same launch, and sums whose order does not depend on timing. It
// asks whether the ~97% of the copy floor layer_stream's chain reached on an H100 (2026-12-08) survives the passes a
// real layer needs between its GEMMs.
//
// One launch walks L layers of, at m <= 16 tokens (bf16 x, f32 sums; attention and the rotary left out: o's input
// stands in for attention's output as the q columns of q|k|v's, rounded to bf16):
//   qkv = xn . Wqkv^T            xa = bf16(qkv[:, :n_o_in])
//   res += xa . Wo^T             x2 = bf16(rmsnorm(res) * wn)
//   gu = x2 . Wgu^T              xh = bf16(silu(gu[:, :F]) * gu[:, F:])     (Wgu: F gate rows, then F up rows)
//   res += xh . Wd^T             xn = bf16(rmsnorm(res) * wn)               (the next layer's input)
// Each GEMM as layer_stream's (stream-K shares of its (128-row tile, k-tile) pairs, one a CTA, ring of S stages fed
// by a W producer warp that never waits for data and an x producer warp that waits for the GEMM's input), but every
// share writes its partial sums of each tile it touches to a workspace slot of its own; after a grid-wide barrier
// the consumer threads of all CTAs add each output's partials in CTA order (so the bits do not depend on timing)
// and apply the epilogue (bf16 x, the residual add, SwiGLU); the norms take a warp a token row. Ten grid-wide
// barriers a layer (counters zero before the launch; each a release add and an acquire spin).
//
// Built by tools/device/exp/layer_chain.py on the GPU machine: nvcc -cubin -arch=sm_90a.
#define LS_HELPERS_ONLY
#include "layer_stream.cu"

#define LC_MAXT 4 // tiles a share may touch (the 8B's matrices over 132 CTAs touch at most 3)

struct lc_gemm {
    uint64_t w; // [n, k] bf16
    int n, k;
};

struct lc_params {
    const lc_gemm *g; // 4 a layer: q|k|v, o, gate|up, down
    int L, m, d, f;   // layers, tokens, model width (o's and down's rows), SwiGLU width (F)
    uint64_t xn, xa, x2, xh; // bf16 [16, d], [16, d], [16, d], [16, f]
    float *res;              // [16, d]
    const float *wn;         // [d] the norms' weights (one for all: a timing experiment)
    float *ws;               // [G][LC_MAXT][16][BN] partial sums
    unsigned *bar;           // 10 L counters, zero before the launch
    float eps;
};

__device__ __forceinline__ unsigned lc_ld_acquire(const unsigned *a)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
    return v;
}

// The consumers' grid-wide barrier i: every consumer thread of every CTA has arrived before any leaves.
template <int WARPS> __device__ __forceinline__ void lc_grid_sync(unsigned *bar, int i)
{
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * WARPS) : "memory");
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar + i, 1u);
        while (lc_ld_acquire(bar + i) < gridDim.x) {
        }
        __threadfence();
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * WARPS) : "memory");
}

// Output (token, row) of a GEMM of T k-tiles, kts a tile: its tile's partials from every CTA whose share touches it,
// added in CTA order.
template <int BN>
__device__ __forceinline__ float lc_sum(const float *ws, int T, int kts, int G, int tok, int row)
{
    const int tile = row / BN, x0 = tile * kts, x1 = x0 + kts;
    int c = (int)((long long)x0 * G / T);
    while (c + 1 < G && (int)((long long)T * (c + 1) / G) <= x0) c++;
    while (c > 0 && (int)((long long)T * c / G) > x0) c--;
    float v = 0.f;
    for (; c < G; c++) {
        const int w0 = (int)((long long)T * c / G);
        if (w0 >= x1) break;
        const int slot = tile - w0 / kts;
        v += __ldcg(ws + (((size_t)c * LC_MAXT + slot) * 16 + tok) * BN + row % BN);
    }
    return v;
}

template <int WARPS, int S> __device__ __forceinline__ void lc_body(const lc_params &p)
{
    constexpr int BN = 16 * WARPS, W_BYTES = BN * 128, X_BYTES = 16 * 128, STAGE = W_BYTES + X_BYTES;
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) uint64_t full_w[S], full_x[S], empty[S];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = blockIdx.x, G = gridDim.x;
    const uint32_t ring = ls_smem(smem);
    const int nph = 4 * p.L;

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++)
            ls_mb_init(ls_smem(&full_w[s]), 32), ls_mb_init(ls_smem(&full_x[s]), 32),
                ls_mb_init(ls_smem(&empty[s]), WARPS);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp >= WARPS) { // producers: warp WARPS streams W, warp WARPS + 1 the GEMMs' x
        const bool wp = warp == WARPS;
        int i = 0;
        for (int ph = 0; ph < nph; ph++) {
            const lc_gemm P = p.g[ph];
            const int l = ph / 4, j = ph % 4, kts = P.k / 64, T = P.n / BN * kts;
            int w0, w1;
            ls_share(T, c, G, &w0, &w1);
            const __nv_bfloat16 *X = (const __nv_bfloat16 *)(j == 0 ? p.xn : j == 1 ? p.xa : j == 2 ? p.x2 : p.xh);
            if (!wp) { // the barrier after the pass that writes this GEMM's x
                const int b = j == 0 ? 10 * l - 1 : j == 1 ? 10 * l + 1 : j == 2 ? 10 * l + 4 : 10 * l + 6;
                if (b >= 0)
                    while (lc_ld_acquire(p.bar + b) < (unsigned)G) {
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

    const int g = lane >> 2, t = lane & 3, tid = threadIdx.x, nt = 32 * WARPS;
    float acc[2][4];
    int i = 0;
    for (int ph = 0; ph < nph; ph++) {
        const lc_gemm P = p.g[ph];
        const int l = ph / 4, j = ph % 4, kts = P.k / 64, T = P.n / BN * kts;
        int w0, w1;
        ls_share(T, c, G, &w0, &w1);
#pragma unroll
        for (int q = 0; q < 2; q++) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.f;
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
                for (int jj = 0; jj < 2; jj++) {
                    const int tok = 8 * jj + g;
                    const uint32_t b0 = *(const uint32_t *)(xs + tok * 128 + (((2 * q) ^ (tok & 7)) << 4) + 4 * t);
                    const uint32_t b1 = *(const uint32_t *)(xs + tok * 128 + (((2 * q + 1) ^ (tok & 7)) << 4) + 4 * t);
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                                 : "+f"(acc[jj][0]), "+f"(acc[jj][1]), "+f"(acc[jj][2]), "+f"(acc[jj][3])
                                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                }
            }
            __syncwarp();
            if (lane == 0) ls_mb_arrive(ls_smem(&empty[s]));
            if (kt == kts - 1 || w == w1 - 1) { // this share's sums of the tile into its slot (every token row)
                const int slot = tile - w0 / kts;
                if (slot >= LC_MAXT) __trap();
                float *o = p.ws + ((size_t)c * LC_MAXT + slot) * 16 * BN;
                const int r = warp * 16 + g;
#pragma unroll
                for (int jj = 0; jj < 2; jj++) {
                    const int t0 = 8 * jj + 2 * t;
                    o[t0 * BN + r] = acc[jj][0], o[(t0 + 1) * BN + r] = acc[jj][1];
                    o[t0 * BN + r + 8] = acc[jj][2], o[(t0 + 1) * BN + r + 8] = acc[jj][3];
                    acc[jj][0] = acc[jj][1] = acc[jj][2] = acc[jj][3] = 0.f;
                }
            }
        }
        const int b = 10 * l + (j == 0 ? 0 : j == 1 ? 2 : j == 2 ? 5 : 7);
        lc_grid_sync<WARPS>(p.bar, b); // every partial of this GEMM is in the workspace
        // the epilogue pass: each output's partials added in CTA order, over every consumer thread of the grid
        const int gt = c * nt + tid, gn = G * nt;
        if (j == 0) { // o's input: q|k|v's first d columns in bf16 (attention's stand-in)
            __nv_bfloat16 *xa = (__nv_bfloat16 *)p.xa;
            for (int e = gt; e < p.m * p.d; e += gn)
                xa[e] = __float2bfloat16(lc_sum<BN>(p.ws, T, kts, G, e / p.d, e % p.d));
        } else if (j == 2) { // SwiGLU: gate row r and up row f + r
            __nv_bfloat16 *xh = (__nv_bfloat16 *)p.xh;
            for (int e = gt; e < p.m * p.f; e += gn) {
                const int tok = e / p.f, r = e % p.f;
                const float gv = lc_sum<BN>(p.ws, T, kts, G, tok, r), uv = lc_sum<BN>(p.ws, T, kts, G, tok, p.f + r);
                xh[e] = __float2bfloat16(gv / (1.f + __expf(-gv)) * uv);
            }
        } else { // o and down: the residual add
            for (int e = gt; e < p.m * p.d; e += gn) p.res[e] = __ldcg(p.res + e) + lc_sum<BN>(p.ws, T, kts, G, e / p.d, e % p.d);
        }
        lc_grid_sync<WARPS>(p.bar, b + 1);
        if (j == 1 || j == 3) { // the norm: a warp a token row, the next GEMM's x
            const int row = c * WARPS + warp;
            if (row < p.m) {
                const float *rr = p.res + (size_t)row * p.d;
                float ss = 0.f;
                for (int e = lane; e < p.d; e += 32) {
                    const float v = __ldcg(rr + e);
                    ss = fmaf(v, v, ss);
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                const float rs = rsqrtf(ss / (float)p.d + p.eps);
                __nv_bfloat16 *x = (__nv_bfloat16 *)(j == 1 ? p.x2 : p.xn) + (size_t)row * p.d;
                for (int e = lane; e < p.d; e += 32) x[e] = __float2bfloat16(__ldcg(rr + e) * rs * p.wn[e]);
            }
            lc_grid_sync<WARPS>(p.bar, b + 2);
        }
    }
}

#define LC_KERNEL(WARPS, S)                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * (WARPS) + 64, 1) lc_layer_##WARPS##_##S(const lc_params p)   \
    {                                                                                                               \
        lc_body<WARPS, S>(p);                                                                                       \
    }

LC_KERNEL(8, 6)
LC_KERNEL(8, 12)
