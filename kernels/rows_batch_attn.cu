// rows_batch_attn.cu - the batched decode attention on tensor cores (ppn_k_attn_batch_tc).
// The build compiles every kernels/*.cu but gemm.cu as one translation unit in name order, so this file sees
// ppn_kernels.cu's attention helpers (ppn_attn_span, ppn_attn_put, ppn_attn_weight, ppn_attn_merge).
//
// CTA (kvh, j, i): split j of row i's KV head kvh, as ppn_k_attn_batch's grid, over a bf16 cache. Each of the
// PPN_ATC_WARPS warps walks 16-position tiles of the split's span (warp w: tiles w, w + W, ...) with an online
// softmax per query head, on mma.sync m16n8k16 (bf16 in, f32 accumulate):
//   scores  S [16 x 8]  = Q [16 x 16] . K^T [16 x 8], per 16 dims: A rows are the group's G <= 8 query heads
//           (rows G..15 zero), B columns 8 positions. A dims chunk of 32 is two mmas: thread tq of a quad loads
//           dims 32 c + 8 tq .. + 7 of its position in one 16-byte load, and its k slots {2 tq, 2 tq + 1} and
//           {2 tq + 8, 2 tq + 9} of mma h hold dims 32 c + 8 tq + 4 h + {0, 1} and + {2, 3}; q's A fragment
//           takes the same dims (any order of the dims gives the dot product, given A and B agree).
//   output  O [16 x 8] += P [16 x 16] . V [16 x 8] per 8 dims: P's A fragment is the two score tiles' C
//           fragments (positions tb + k for k slot k), rounded to bf16; B's column n of tile u is dim
//           64 (u / 8) + 8 n + u % 8, so a thread's V loads are 16 bytes (dims 64 h + 8 g .. + 7 of a position) and
//           each tile's pair is two 16-bit halves of two of them (__byte_perm).
// So q and the softmax weights are rounded to bf16 (K and V are bf16 already) and the products summed in the
// tensor cores' order: other bits than ppn_k_attn's, within the fixtures' tolerance (docs/VALIDATION.md). The
// warps' (max, sum, output) are merged in warp order through shared memory; with several splits, into the
// partial records and the last block's merge of ppn_k_attn (ppn_attn_merge). The rotary and the k/v store come
// before, from ppn_k_rope_kv_batch: this kernel only reads the caches. (Inside, every block's sincosf for q cost
// more than the launch it saved: docs/PERF.md, 2026-12-05.)

#define PPN_ATC_WARPS 4 // 128 threads
#ifndef PPN_ATC_MINB
#define PPN_ATC_MINB 3 // CTAs an SM: 170 registers a thread at most
#endif
#define PPN_ATC_MAXD 128
#define PPN_ATC_PAD 4 // floats after each (warp, head) row of shared memory: a quad's stores in distinct banks
#define PPN_ATC_TBL 256 // block-table entries of a span held in shared memory (4,096 positions in blocks of 16)

struct ppn_atc_smem {
    float o[PPN_ATC_WARPS * 8 * (PPN_ATC_MAXD + PPN_ATC_PAD)]; // per warp and head: its outputs; then the merge's
    float m[PPN_ATC_WARPS * 8], l[PPN_ATC_WARPS * 8];
    int32_t tbl[PPN_ATC_TBL];
    int last;
};
static_assert(PPN_ATC_WARPS * 8 * (PPN_ATC_MAXD + PPN_ATC_PAD) >= PPN_ATC_WARPS * (PPN_ATTN_MAX_SPLIT + 1),
              "the merge's weights fit the output array");

// Two floats as a bf16 pair, rounded to nearest even, the lower index in the low half (the mma's packing).
__device__ __forceinline__ uint32_t ppn_atc_pack(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// d[0..1] += rows g of A . B (rows g + 8 of A are zero, so their outputs are dropped).
__device__ __forceinline__ void ppn_atc_mma(float &d0, float &d1, uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1)
{
    asm("{\n .reg .f32 x2, x3;\n"
        " mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, x2, x3}, {%2, %7, %3, %7}, {%4, %5}, "
        "{%0, %1, %6, %6};\n}\n"
        : "+f"(d0), "+f"(d1)
        : "r"(a0), "r"(a2), "r"(b0), "r"(b1), "f"(0.0f), "r"(0u));
}

// 16 bytes of the cache at element e (a multiple of 8) of the head's rows, through the read-only path.
__device__ __forceinline__ uint4 ppn_atc_load(const uint16_t *c, size_t e) { return __ldg((const uint4 *)(c + e)); }

__device__ __forceinline__ uint32_t ppn_atc_word(const uint4 &v, int w)
{
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

template <int HD>
__device__ __forceinline__ void ppn_atc_body(const ppn_kp_attn &p, int32_t pos, int kvh, int j, ppn_atc_smem &sm)
{
    constexpr int NC = HD / 32, NH = HD / 64, NT = HD / 8; // 32-dim chunks, 64-dim halves, output tiles
    const int G = p.n_heads / p.n_kv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, tq = lane & 3; // the quad's head (A row) and K's position (B column); thread in quad
    if (pos < 0 || pos >= p.cap) { // uniform over the grid, as ppn_k_attn: NaN rows, no counters touched
        if (j == 0)
            for (int d = threadIdx.x; d < G * HD; d += blockDim.x)
                ppn_attn_put(p, (size_t)kvh * G * HD + d, __int_as_float(0x7fc00000));
        return;
    }
    const int ns = min(p.n_split, pos / PPN_ATTN_MIN_SPAN + 1); // ppn_k_attn's rule: a function of pos alone
    if (j >= ns) return;
    int t0, t1;
    ppn_attn_span(pos, ns, j, &t0, &t1);
    // q of head g (rows g >= G zero) as the A fragments, in K's dims order
    uint32_t qa[NC][2][2];
    const float *qh = (const float *)p.q + ((size_t)kvh * G + (g < G ? g : 0)) * HD;
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float4 v = *(const float4 *)(qh + 32 * c + 8 * tq + 4 * h);
            if (g >= G) v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qa[c][h][0] = ppn_atc_pack(v.x, v.y), qa[c][h][1] = ppn_atc_pack(v.z, v.w);
        }
    const uint16_t *kc = (const uint16_t *)p.kc + (size_t)kvh * (size_t)p.cap * HD;
    const uint16_t *vc = (const uint16_t *)p.vc + (size_t)kvh * (size_t)p.cap * HD;
    // The span's block-table entries in shared memory (one global read each, not one per row a tile): pool
    // position of t as ppn_kv_pool_pos gives it (-1: no block). A span of more blocks reads the table itself.
    const int32_t *tbl = (const int32_t *)p.tbl; // the block table (kparams.h); NULL: identity
    const int L = p.block_log2, blk0 = t0 >> L, nblk = ((t1 - 1) >> L) - blk0 + 1, nbmax = p.cap >> L;
    const bool stbl = tbl && nblk <= PPN_ATC_TBL;
    if (stbl)
        for (int b = threadIdx.x; b < nblk; b += blockDim.x) sm.tbl[b] = tbl[blk0 + b];
    __syncthreads();
    auto pool_pos = [&](int t) -> int32_t {
        if (t >= t1) return -1;
        if (!stbl) return ppn_kv_pool_pos(tbl, L, p.cap, t);
        int32_t b = sm.tbl[(t >> L) - blk0];
        return b < 0 || b >= nbmax ? -1 : (b << L) | (t & ((1 << L) - 1));
    };
    float o[NT][2];
#pragma unroll
    for (int u = 0; u < NT; u++) o[u][0] = o[u][1] = 0.0f;
    float m = -INFINITY, l = 0.0f; // head g's running max (the same on its quad); this thread's share of the sum
    // A tile's loads: K rows tb + 8 u + g, V rows tb + 8 u + 2 tq + e. A position past t1 or without a block reads
    // row 0 and takes zeros (a position without a block weighs as ppn_k_attn's zeros). The next tile's K loads
    // issue once the scores are formed, its V loads once the outputs are: they fly while this tile computes.
    uint4 kr[2][NC], vr[2][2][NH];
    bool kin[2], vin[2][2];
    auto load_k = [&](int tb) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int32_t pp = pool_pos(tb + 8 * u + g);
            kin[u] = pp >= 0;
            size_t at = (size_t)(pp >= 0 ? pp : 0) * HD + 8 * tq;
#pragma unroll
            for (int c = 0; c < NC; c++) kr[u][c] = ppn_atc_load(kc, at + 32 * c);
        }
    };
    auto load_v = [&](int tb) {
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int32_t pp = pool_pos(tb + 8 * u + 2 * tq + e);
                vin[u][e] = pp >= 0;
                size_t at = (size_t)(pp >= 0 ? pp : 0) * HD + 8 * g;
#pragma unroll
                for (int h = 0; h < NH; h++) vr[u][e][h] = ppn_atc_load(vc, at + 64 * h);
            }
    };
    int tb = t0 + 16 * warp;
    if (tb < t1) load_k(tb), load_v(tb);
    for (; tb < t1; tb += 16 * PPN_ATC_WARPS) {
        const int nb = tb + 16 * PPN_ATC_WARPS; // this warp's next tile
        // scores of positions tb + 8 u + 2 tq + e for head g
        float s[2][2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const uint4 z = make_uint4(0u, 0u, 0u, 0u);
            s[u][0] = s[u][1] = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                uint4 k = kin[u] ? kr[u][c] : z;
                ppn_atc_mma(s[u][0], s[u][1], qa[c][0][0], qa[c][0][1], k.x, k.y);
                ppn_atc_mma(s[u][0], s[u][1], qa[c][1][0], qa[c][1][1], k.z, k.w);
            }
        }
        if (nb < t1) load_k(nb);
        float mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                s[u][e] = tb + 8 * u + 2 * tq + e < t1 ? s[u][e] * p.scale : -INFINITY;
                mx = fmaxf(mx, s[u][e]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(PPN_FULL_MASK, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(PPN_FULL_MASK, mx, 2));
        const float mn = fmaxf(m, mx); // finite: position tb < t1 scores
        const float corr = expf(m - mn);
        m = mn;
        float pr[2][2], ls = 0.0f;
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 2; e++) pr[u][e] = expf(s[u][e] - mn), ls += pr[u][e];
        l = fmaf(l, corr, ls);
        const uint32_t pa0 = ppn_atc_pack(pr[0][0], pr[0][1]), pa2 = ppn_atc_pack(pr[1][0], pr[1][1]);
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (!vin[u][e]) // zeros, never a stale row's values times a zero weight (NaN stays out)
#pragma unroll
                    for (int h = 0; h < NH; h++) vr[u][e][h] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int w = 0; w < 8; w++) {
                const uint32_t sel = (w & 1) ? 0x7632u : 0x5410u;
                uint32_t b0 = __byte_perm(ppn_atc_word(vr[0][0][h], w >> 1), ppn_atc_word(vr[0][1][h], w >> 1), sel);
                uint32_t b1 = __byte_perm(ppn_atc_word(vr[1][0][h], w >> 1), ppn_atc_word(vr[1][1][h], w >> 1), sel);
                float &d0 = o[8 * h + w][0], &d1 = o[8 * h + w][1];
                d0 *= corr, d1 *= corr;
                ppn_atc_mma(d0, d1, pa0, pa2, b0, b1);
            }
        if (nb < t1) load_v(nb);
    }
    l += __shfl_xor_sync(PPN_FULL_MASK, l, 1);
    l += __shfl_xor_sync(PPN_FULL_MASK, l, 2);
    // the warps' partials through shared memory: output tile 8 h + w, column 2 tq + e is dim 64 h + 16 tq + 8 e + w
    if (g < G) {
        float *wo = sm.o + (warp * 8 + g) * (HD + PPN_ATC_PAD);
#pragma unroll
        for (int h = 0; h < NH; h++)
#pragma unroll
            for (int w = 0; w < 8; w++)
                wo[64 * h + 16 * tq + w] = o[8 * h + w][0], wo[64 * h + 16 * tq + 8 + w] = o[8 * h + w][1];
        if (tq == 0) sm.m[warp * 8 + g] = m, sm.l[warp * 8 + g] = l;
    }
    __syncthreads();
    for (int x = threadIdx.x; x < G * HD; x += blockDim.x) {
        int gg = x / HD, d = x - gg * HD;
        float mw = -INFINITY, den = 0.0f, num = 0.0f;
        for (int w = 0; w < PPN_ATC_WARPS; w++) mw = fmaxf(mw, sm.m[w * 8 + gg]);
        for (int w = 0; w < PPN_ATC_WARPS; w++) {
            float f = ppn_attn_weight(sm.m[w * 8 + gg], mw);
            den = fmaf(sm.l[w * 8 + gg], f, den);
            num = fmaf(sm.o[(w * 8 + gg) * (HD + PPN_ATC_PAD) + d], f, num);
        }
        size_t hh = (size_t)kvh * G + gg;
        if (ns == 1) {
            ppn_attn_put(p, hh * HD + d, num / den);
        } else {
            float *rec = (float *)p.part + (hh * ns + j) * ((size_t)HD + 2);
            rec[2 + d] = num;
            if (d == 0) rec[0] = mw, rec[1] = den;
        }
    }
    if (ns == 1) return;
    // ppn_k_attn's arrival: the last block of the KV head merges the ns partials of its G heads
    unsigned *cnt = (unsigned *)((float *)p.part + (size_t)p.n_heads * p.n_split * ((size_t)HD + 2)) + kvh;
    if (!ppn_attn_arrive(cnt, ns, sm.last)) return;
    ppn_attn_merge(p, ns, kvh * G, G, sm.o, sm.o + PPN_ATC_WARPS * PPN_ATTN_MAX_SPLIT);
    if (threadIdx.x == 0) *cnt = 0;
}

extern "C" __global__ void __launch_bounds__(32 * PPN_ATC_WARPS, PPN_ATC_MINB) ppn_k_attn_batch_tc(const ppn_kp_attn_batch_tc pb)
{
    __shared__ ppn_atc_smem sm;
    PPN_PDL_ENTER();
    int32_t pos;
    const ppn_kp_attn p = ppn_attn_batch_row(pb, blockIdx.z, &pos);
    if (p.head_dim == 128) ppn_atc_body<128>(p, pos, blockIdx.x, blockIdx.y, sm);
    else ppn_atc_body<64>(p, pos, blockIdx.x, blockIdx.y, sm); // ops_kv.c admits 64 and 128 only
}
