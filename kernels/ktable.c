/* ktable.c - the kernel table (CUDA symbol name, params size, CPU reference) and the embedded image the
 * cuda backend loads them from, handed to the device layer as one ppn_gpu_kernels. */
#include <pthread.h>
#include "kernels/ktable.h"

#include "kernels/cpu_ref.h"

/* The name is the extern "C" symbol in kernels/ppn_kernels.cu; the cuda backend resolves it with
 * cuModuleGetFunction, so the two must stay spelled alike. */
#define PPN_KDESC(id, nm) [id] = {"ppn_k_" #nm, sizeof(ppn_kp_##nm), ppn_cpu_##nm}

const ppn_gpu_kernel ppn_kernels[PPN_K_COUNT] = {
    PPN_KDESC(PPN_K_EMBED, embed),
    PPN_KDESC(PPN_K_RMSNORM, rmsnorm),
    PPN_KDESC(PPN_K_MATVEC, matvec),
    PPN_KDESC(PPN_K_ROPE, rope),
    PPN_KDESC(PPN_K_HEAD_RMSNORM, head_rmsnorm),
    PPN_KDESC(PPN_K_ATTN, attn),
    PPN_KDESC(PPN_K_ATTN_BF16, attn_bf16),
    PPN_KDESC(PPN_K_ATTN_F16, attn_f16),
    PPN_KDESC(PPN_K_SWIGLU, swiglu),
    PPN_KDESC(PPN_K_ADD, add),
    PPN_KDESC(PPN_K_ARGMAX, argmax),
    PPN_KDESC(PPN_K_FILL, fill),
    PPN_KDESC(PPN_K_SET_HDR, set_hdr),
    PPN_KDESC(PPN_K_MATMAT, matmat),
    PPN_KDESC(PPN_K_GEMM, gemm),
    PPN_KDESC(PPN_K_GEMM_TC_L, gemm_tc_l),
    PPN_KDESC(PPN_K_GEMM_TC_M, gemm_tc_m),
    PPN_KDESC(PPN_K_GEMM_TC_S, gemm_tc_s),
    PPN_KDESC(PPN_K_GEMM_TC_K, gemm_tc_k),
    PPN_KDESC(PPN_K_GEMM_TC_KW, gemm_tc_kw),
    PPN_KDESC(PPN_K_GEMM_TC_KWX, gemm_tc_kwx),
    PPN_KDESC(PPN_K_GEMM_TC_KW16, gemm_tc_kw16),
    PPN_KDESC(PPN_K_GEMM_TC_H, gemm_tc_h),
    PPN_KDESC(PPN_K_EMBED_ROWS, embed_rows),
    PPN_KDESC(PPN_K_RMSNORM_ROWS, rmsnorm_rows),
    PPN_KDESC(PPN_K_HEAD_RMSNORM_ROWS, head_rmsnorm_rows),
    PPN_KDESC(PPN_K_ROPE_KV_ROWS, rope_kv_rows),
    PPN_KDESC(PPN_K_ATTN_ROWS, attn_rows),
    PPN_KDESC(PPN_K_ATTN_ROWS_BF16, attn_rows_bf16),
    PPN_KDESC(PPN_K_ATTN_ROWS_F16, attn_rows_f16),
    PPN_KDESC(PPN_K_SWIGLU_ROWS, swiglu_rows),
    PPN_KDESC(PPN_K_ARGMAX_ROWS, argmax_rows),

    PPN_KDESC(PPN_K_ROPE_KV_BATCH, rope_kv_batch),
    PPN_KDESC(PPN_K_ATTN_BATCH, attn_batch),
    PPN_KDESC(PPN_K_ATTN_BATCH_BF16, attn_batch_bf16),
    PPN_KDESC(PPN_K_ATTN_BATCH_F16, attn_batch_f16),
    PPN_KDESC(PPN_K_GEMM_SWIGLU, gemm_swiglu),
    PPN_KDESC(PPN_K_ATTN_BATCH_TC, attn_batch_tc),
    PPN_KDESC(PPN_K_GEMM_TC_K16, gemm_tc_k16),
    PPN_KDESC(PPN_K_GEMM_TC_KWT, gemm_tc_kwt),
    PPN_KDESC(PPN_K_GEMM_SWIGLU_T, gemm_swiglu_t),
    PPN_KDESC(PPN_K_GEMM_TC_K16T, gemm_tc_k16t),
    PPN_KDESC(PPN_K_GEMM_TC_KX, gemm_tc_kx),
    PPN_KDESC(PPN_K_GEMM_SWIGLU_X, gemm_swiglu_x),
    PPN_KDESC(PPN_K_GEMM_TC_W, gemm_tc_w),
    PPN_KDESC(PPN_K_GEMM_SWIGLU_W, gemm_swiglu_w),
};

#if PPN_HAVE_FATBIN
/* The build's embedded fatbins (CMakeLists): kernels/gemm.cu's, and the other kernel sources'. */
extern const unsigned char ppn_fatbin_main_data[], ppn_fatbin_main_end[];
extern const unsigned char ppn_fatbin_gemm_data[], ppn_fatbin_gemm_end[];
#endif

/* The kernels that need more dynamic shared memory than the set's opt-in (PPN_DYN_SMEM_MAX). */
static const unsigned kernel_smem[PPN_K_COUNT] = {[PPN_K_GEMM_TC_H] = PPN_GEMM_TC_H_SMEM,
                                                  [PPN_K_GEMM_TC_KWX] = PPN_GEMM_TC_KWX_SMEM,
                                                  [PPN_K_GEMM_TC_KX] = PPN_GEMM_TC_KX_SMEM_MAX,
                                                  [PPN_K_GEMM_SWIGLU_X] = PPN_GEMM_TC_KX_SMEM_MAX,
                                                  [PPN_K_GEMM_TC_W] = PPN_GEMM_TC_W_SMEM_MAX,
                                                  [PPN_K_GEMM_SWIGLU_W] = PPN_GEMM_SWIGLU_W_SMEM_MAX};

static ppn_gpu_kernels kernel_set;
#if PPN_HAVE_FATBIN
static ppn_gpu_image kernel_images[2];
#endif
static pthread_once_t kernel_set_once = PTHREAD_ONCE_INIT;

static void kernel_set_init(void)
{
    kernel_set = (ppn_gpu_kernels){.k = ppn_kernels, .n = PPN_K_COUNT, .dyn_smem_max = PPN_DYN_SMEM_MAX,
                                   .smem_max = kernel_smem};
#if PPN_HAVE_FATBIN
    kernel_set.sm90a = PPN_FATBIN_SM90A;
    kernel_images[0] = (ppn_gpu_image){"main", ppn_fatbin_main_data,
                                       (size_t)(ppn_fatbin_main_end - ppn_fatbin_main_data)};
    kernel_images[1] = (ppn_gpu_image){"gemm", ppn_fatbin_gemm_data,
                                       (size_t)(ppn_fatbin_gemm_end - ppn_fatbin_gemm_data)};
    kernel_set.images = kernel_images;
    kernel_set.n_images = 2;
#endif
}

const ppn_gpu_kernels *ppn_kernel_set(void)
{
    pthread_once(&kernel_set_once, kernel_set_init);
    return &kernel_set;
}
