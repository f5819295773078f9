// rows_batch.cu - kernels of a batched decode step (many sequences, one row each).
// The build compiles every kernels/*.cu as one translation unit in name order, so this file sees
// ppn_kernels.cu's argmax helpers (ppn_argmax_block) and rows.cu's.

// ---------------------------------------------------------------------------------------------------------
// argmax rows: block i reduces row i with the one-block argmax (the (value, index) total order of ppn_k_argmax,
// so a row's winner is the one ppn_k_argmax gives for it alone; -1 where the row holds a NaN or an infinity).

// Elements k .. k + 3 of a row, as candidates.
__device__ __forceinline__ void ppn_argmax_elem4(float &bv, int &bi, float4 v, int k)
{
    ppn_argmax_elem(bv, bi, v.x, k), ppn_argmax_elem(bv, bi, v.y, k + 1);
    ppn_argmax_elem(bv, bi, v.z, k + 2), ppn_argmax_elem(bv, bi, v.w, k + 3);
}

extern "C" __global__ void ppn_k_argmax_rows(const ppn_kp_argmax_rows p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x;
    if (i >= p.rows) return;
    float bv = 0.0f;
    int bi = -1;
    const float *x = (const float *)p.x + (size_t)i * (size_t)p.n;
    if (p.vec) { // float4 j holds elements 4 j .. 4 j + 3; four of them in flight a thread
        const float4 *x4 = (const float4 *)x;
        const int n4 = p.n / 4, bd = (int)blockDim.x;
        int j = (int)threadIdx.x;
        for (; j + 3 * bd < n4; j += 4 * bd) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = __ldg(x4 + j + u * bd);
#pragma unroll
            for (int u = 0; u < 4; u++) ppn_argmax_elem4(bv, bi, v[u], 4 * (j + u * bd));
        }
        for (; j < n4; j += bd) ppn_argmax_elem4(bv, bi, __ldg(x4 + j), 4 * j);
        ppn_argmax_block_reduce(bv, bi);
    } else {
        ppn_argmax_block(x, p.n, threadIdx.x, blockDim.x, bv, bi);
    }
    if (threadIdx.x == 0) ((int32_t *)p.out)[i] = ppn_argmax_result(bi);
}
