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

// The consumers' grid-wide barrier i: every consumer thread of every CTA has arrived before any leaves.
template <int WARPS> __device__ __forceinline__ void lc_grid_sync(unsigned *bar, int i)
{
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * WARPS) : "memory");
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar + i, 1u);
        ls_wait_count(bar + i, gridDim.x);
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
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) uint64_t bars[3 * S];
    const ls_stream<WARPS, S> st(smem, bars);
    constexpr int BN = ls_stream<WARPS, S>::BN;
    const int nph = 4 * p.L, c = st.c, G = st.G, warp = st.warp, lane = st.lane;
    if (st.producer()) { // GEMM j of layer l reads its x once the barrier after the pass that writes it is whole
        st.produce(nph, p.m, [&](int ph) {
            const lc_gemm P = p.g[ph];
            const int l = ph / 4, j = ph % 4, b = j == 0 ? 10 * l - 1 : j == 1 ? 10 * l + 1 : j == 2 ? 10 * l + 4 : 10 * l + 6;
            const uint64_t x = j == 0 ? p.xn : j == 1 ? p.xa : j == 2 ? p.x2 : p.xh;
            return ls_gemm{(const __nv_bfloat16 *)P.w, (const __nv_bfloat16 *)x, P.n, P.k, b >= 0 ? p.bar + b : nullptr};
        });
        return;
    }
    const int g = lane >> 2, t = lane & 3, tid = threadIdx.x, nt = 32 * WARPS;
    int i = 0;
    for (int ph = 0; ph < nph; ph++) {
        const lc_gemm P = p.g[ph];
        const int l = ph / 4, j = ph % 4, kts = P.k / 64, T = P.n / BN * kts;
        i = st.consume(i, P.n, P.k, [&](int tile, int first, const float(&acc)[2][4]) { // into this share's slot
            const int slot = tile - first;
            if (slot >= LC_MAXT) __trap();
            float *o = p.ws + ((size_t)c * LC_MAXT + slot) * 16 * BN;
            const int r = warp * 16 + g;
#pragma unroll
            for (int jj = 0; jj < 2; jj++) {
                const int t0 = 8 * jj + 2 * t;
                o[t0 * BN + r] = acc[jj][0], o[(t0 + 1) * BN + r] = acc[jj][1];
                o[t0 * BN + r + 8] = acc[jj][2], o[(t0 + 1) * BN + r + 8] = acc[jj][3];
            }
        });
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
