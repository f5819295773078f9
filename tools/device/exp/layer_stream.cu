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
#define GEMM_WS_HELPERS_ONLY
#include "gemm_ws.cu" // smem_u32 and the mbarrier helpers

struct ls_phase {
    uint64_t w, x, y; // W [n, k], x [m, k] bf16; y [m, n] f32
    int n, k;
};

struct ls_params {
    const ls_phase *ph; // nph phases, in device memory
    unsigned *count;    // a counter a phase, zero before the launch
    int nph, m, barrier;
};

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

// A GEMM of a walk as the loops below take it: W [n, k] and x [m, k] bf16 row-major; wait, where not null: a counter
// its x is read only once it reaches the grid's CTA count.
struct ls_gemm {
    const __nv_bfloat16 *w, *x;
    int n, k;
    const unsigned *wait;
};

// The acquire spin of a lane until *a reaches n.
__device__ __forceinline__ void ls_wait_count(const unsigned *a, unsigned n)
{
    unsigned v;
    do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(a) : "memory");
    } while (v < n);
}

// A ring row: 128 bytes (64 bf16), 16-byte chunk ch of row r at ch ^ (r % 8).
__device__ __forceinline__ uint32_t ls_sw(int r, int ch) { return (uint32_t)(r * 128 + ((ch ^ (r & 7)) << 4)); }

// A lane's copies of k-tile kt of rows r0 .. r0 + ROWS - 1 of a row-major bf16 matrix of k columns into dst (rows from
// `valid` on zero-filled), then its arrival on full barrier b when they land.
template <int ROWS>
__device__ __forceinline__ void ls_fill(uint32_t dst, const __nv_bfloat16 *a, int k, int r0, int valid, int kt, int lane,
                                        uint32_t b)
{
#pragma unroll
    for (int e = 0; e < ROWS * 8 / 32; e++) {
        const int idx = lane + 32 * e, r = idx >> 3, ch = idx & 7;
        const bool ok = r < valid;
        ls_cp16(dst + ls_sw(r, ch), a + (size_t)(r0 + (ok ? r : 0)) * k + kt * 64 + ch * 8, ok);
    }
    ls_cp_arrive(b);
}

// The persistent stream both experiments share: one CTA an SM, WARPS consumer warps (16 W rows each), a W producer
// warp and an x producer warp over a ring of S stages (a W k-tile of BN x 64, then an x k-tile of 16 x 64), each
// stage with a full barrier for W, one for x and an empty one (a lane a consumer warp).
template <int WARPS, int S> struct ls_stream {
    static constexpr int BN = 16 * WARPS, W_BYTES = BN * 128, STAGE = W_BYTES + 16 * 128;
    uint64_t *full_w, *full_x, *empty;
    unsigned char *smem;
    uint32_t ring;
    int warp, lane, c, G;

    // The ring's barriers (bars: 3 S of them in shared memory), set before any thread goes on.
    __device__ ls_stream(unsigned char *smem_, uint64_t *bars)
        : full_w(bars), full_x(bars + S), empty(bars + 2 * S), smem(smem_), ring(smem_u32(smem_)),
          warp((int)threadIdx.x >> 5), lane((int)threadIdx.x & 31), c((int)blockIdx.x), G((int)gridDim.x)
    {
        if (threadIdx.x == 0) {
            for (int s = 0; s < S; s++)
                mb_init(smem_u32(&full_w[s]), 32), mb_init(smem_u32(&full_x[s]), 32),
                    mb_init(smem_u32(&empty[s]), WARPS);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
        __syncthreads();
    }

    __device__ bool producer() const { return warp >= WARPS; }

    // The producers' walk over nph GEMMs (gemm(ph): an ls_gemm), each CTA its share of each: warp WARPS streams W and
    // never waits for data, warp WARPS + 1 the x k-tiles, each GEMM's once its wait counter is whole.
    template <class Gemm> __device__ void produce(int nph, int m, Gemm gemm) const
    {
        const bool wp = warp == WARPS;
        int i = 0;
        for (int ph = 0; ph < nph; ph++) {
            const ls_gemm P = gemm(ph);
            const int kts = P.k / 64, T = P.n / BN * kts;
            int w0, w1;
            ls_share(T, c, G, &w0, &w1);
            if (!wp && P.wait) {
                ls_wait_count(P.wait, (unsigned)G);
                __syncwarp();
            }
            for (int w = w0; w < w1; w++, i++) {
                const int s = i % S, tile = w / kts, kt = w % kts;
                if (i >= S) mb_wait(smem_u32(&empty[s]), (unsigned)((i / S - 1) & 1));
                const uint32_t st = ring + (uint32_t)(s * STAGE);
                if (wp) ls_fill<BN>(st, P.w, P.k, tile * BN, BN, kt, lane, smem_u32(&full_w[s]));
                else ls_fill<16>(st + W_BYTES, P.x, P.k, 0, m, kt, lane, smem_u32(&full_x[s]));
            }
        }
    }

    // A consumer warp's part of this CTA's share of one GEMM (n rows of W, k columns), from ring position i (returned
    // past it): each k-tile's 16 of the warp's W rows times the 16 x rows (mma.sync m16n8k16, two n8 tiles) into acc;
    // where the share leaves a tile, flush(tile, w0, acc) takes the sums (acc[j]: W rows warp 16 + lane / 4 (+ 8 for
    // [2], [3]) of the tile, tokens 8 j + 2 (lane % 4) (+ 1 for [1], [3])) and acc starts again from zero.
    template <class Flush> __device__ int consume(int i, int n, int k, Flush flush) const
    {
        const int g = lane >> 2, t = lane & 3, kts = k / 64, T = n / BN * kts;
        int w0, w1;
        ls_share(T, c, G, &w0, &w1);
        float acc[2][4] = {};
        for (int w = w0; w < w1; w++, i++) {
            const int s = i % S, tile = w / kts, kt = w % kts;
            const unsigned par = (unsigned)((i / S) & 1);
            mb_wait(smem_u32(&full_w[s]), par);
            mb_wait(smem_u32(&full_x[s]), par);
            const uint32_t st = ring + (uint32_t)(s * STAGE);
            const unsigned char *xs = smem + s * STAGE + W_BYTES;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                uint32_t a0, a1, a2, a3;
                const int mj = lane >> 3, r = warp * 16 + (lane & 7) + 8 * (mj & 1);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                             : "r"(st + ls_sw(r, 2 * q + (mj >> 1))));
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    const int tok = 8 * j + g;
                    const uint32_t b0 = *(const uint32_t *)(xs + ls_sw(tok, 2 * q) + 4 * t);
                    const uint32_t b1 = *(const uint32_t *)(xs + ls_sw(tok, 2 * q + 1) + 4 * t);
                    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                                 : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
                }
            }
            __syncwarp();
            if (lane == 0) mb_arrive(smem_u32(&empty[s]));
            if (kt == kts - 1 || w == w1 - 1) {
                flush(tile, w0 / kts, acc);
#pragma unroll
                for (int j = 0; j < 2; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            }
        }
        return i;
    }
};

template <int WARPS, int S> __device__ __forceinline__ void ls_body(const ls_params &p)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) uint64_t bars[3 * S];
    const ls_stream<WARPS, S> st(smem, bars);
    constexpr int BN = ls_stream<WARPS, S>::BN;
    if (st.producer()) {
        st.produce(p.nph, p.m, [&](int ph) {
            const ls_phase P = p.ph[ph];
            return ls_gemm{(const __nv_bfloat16 *)P.w, (const __nv_bfloat16 *)P.x, P.n, P.k,
                           p.barrier && ph > 0 ? p.count + ph - 1 : nullptr};
        });
        return;
    }
    const int g = st.lane >> 2, t = st.lane & 3;
    int i = 0;
    for (int ph = 0; ph < p.nph; ph++) {
        const ls_phase P = p.ph[ph];
        float *Y = (float *)P.y;
        i = st.consume(i, P.n, P.k, [&](int tile, int, const float(&acc)[2][4]) { // the share's sums into y
            const int r = tile * BN + st.warp * 16 + g;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int t0 = 8 * j + 2 * t;
                if (t0 < p.m) atomicAdd(Y + (size_t)t0 * P.n + r, acc[j][0]), atomicAdd(Y + (size_t)t0 * P.n + r + 8, acc[j][2]);
                if (t0 + 1 < p.m)
                    atomicAdd(Y + (size_t)(t0 + 1) * P.n + r, acc[j][1]),
                        atomicAdd(Y + (size_t)(t0 + 1) * P.n + r + 8, acc[j][3]);
            }
        });
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
