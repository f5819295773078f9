// rows_batch.cu - kernels of a batched decode step (many sequences, one row each).
// The build compiles every kernels/*.cu as one translation unit in name order, so this file sees
// ppn_kernels.cu's argmax helpers (ppn_argmax_block) and rows.cu's.

// ---------------------------------------------------------------------------------------------------------
// argmax rows: block i reduces row i with the one-block argmax (the (value, index) total order of ppn_k_argmax,
// so a row's winner is the one ppn_k_argmax gives for it alone; -1 where the row holds a NaN or an infinity).

extern "C" __global__ void ppn_k_argmax_rows(const ppn_kp_argmax_rows p)
{
    PPN_PDL_ENTER();
    int i = blockIdx.x;
    if (i >= p.rows) return;
    float bv;
    int bi;
    ppn_argmax_block((const float *)p.x + (size_t)i * (size_t)p.n, p.n, threadIdx.x, blockDim.x, bv, bi);
    if (threadIdx.x == 0) ((int32_t *)p.out)[i] = ppn_argmax_result(bi);
}
