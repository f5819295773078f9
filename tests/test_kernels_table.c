/* test_kernels_table.c - the kernel table (kernels/ktable.c): one entry per id, named as its CUDA symbol
 * "ppn_k_<name>" (the cuda backend resolves it by that name), each name once, its params struct's size, and a
 * CPU reference for the sim backend.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/ktable.h"

static void test_table_kernels(void **state)
{
    (void)state;
    static const size_t sizes[PPN_K_COUNT] = {
        [PPN_K_EMBED] = sizeof(ppn_kp_embed),     [PPN_K_RMSNORM] = sizeof(ppn_kp_rmsnorm),
        [PPN_K_MATVEC] = sizeof(ppn_kp_matvec),   [PPN_K_ROPE] = sizeof(ppn_kp_rope),
        [PPN_K_HEAD_RMSNORM] = sizeof(ppn_kp_head_rmsnorm),
        [PPN_K_ATTN] = sizeof(ppn_kp_attn),       [PPN_K_ATTN_BF16] = sizeof(ppn_kp_attn_bf16),
        [PPN_K_ATTN_F16] = sizeof(ppn_kp_attn_f16),
        [PPN_K_SWIGLU] = sizeof(ppn_kp_swiglu),
        [PPN_K_ADD] = sizeof(ppn_kp_add),         [PPN_K_ARGMAX] = sizeof(ppn_kp_argmax),
        [PPN_K_FILL] = sizeof(ppn_kp_fill),       [PPN_K_SET_HDR] = sizeof(ppn_kp_set_hdr),
        [PPN_K_MATMAT] = sizeof(ppn_kp_matmat),
        [PPN_K_GEMM] = sizeof(ppn_kp_gemm),       [PPN_K_GEMM_TC_L] = sizeof(ppn_kp_gemm_tc_l),
        [PPN_K_GEMM_TC_M] = sizeof(ppn_kp_gemm_tc_m), [PPN_K_GEMM_TC_S] = sizeof(ppn_kp_gemm_tc_s),
        [PPN_K_GEMM_TC_K] = sizeof(ppn_kp_gemm_tc_k), [PPN_K_GEMM_TC_KW] = sizeof(ppn_kp_gemm_tc_kw),
        [PPN_K_GEMM_TC_KWX] = sizeof(ppn_kp_gemm_tc_kwx), [PPN_K_GEMM_TC_KW16] = sizeof(ppn_kp_gemm_tc_kw16),
        [PPN_K_GEMM_TC_H] = sizeof(ppn_kp_gemm_tc_h),
        [PPN_K_EMBED_ROWS] = sizeof(ppn_kp_embed_rows), [PPN_K_RMSNORM_ROWS] = sizeof(ppn_kp_rmsnorm_rows),
        [PPN_K_HEAD_RMSNORM_ROWS] = sizeof(ppn_kp_head_rmsnorm_rows),
        [PPN_K_ROPE_KV_ROWS] = sizeof(ppn_kp_rope_kv_rows), [PPN_K_ATTN_ROWS] = sizeof(ppn_kp_attn_rows),
        [PPN_K_ATTN_ROWS_BF16] = sizeof(ppn_kp_attn_rows_bf16), [PPN_K_ATTN_ROWS_F16] = sizeof(ppn_kp_attn_rows_f16),
        [PPN_K_SWIGLU_ROWS] = sizeof(ppn_kp_swiglu_rows), [PPN_K_ARGMAX_ROWS] = sizeof(ppn_kp_argmax_rows),
        [PPN_K_ROPE_KV_BATCH] = sizeof(ppn_kp_rope_kv_batch), [PPN_K_ATTN_BATCH] = sizeof(ppn_kp_attn_batch),
        [PPN_K_ATTN_BATCH_BF16] = sizeof(ppn_kp_attn_batch_bf16), [PPN_K_ATTN_BATCH_F16] = sizeof(ppn_kp_attn_batch_f16),
        [PPN_K_GEMM_SWIGLU] = sizeof(ppn_kp_gemm_swiglu), [PPN_K_ATTN_BATCH_TC] = sizeof(ppn_kp_attn_batch_tc),
        [PPN_K_GEMM_TC_K16] = sizeof(ppn_kp_gemm_tc_k16), [PPN_K_GEMM_TC_KWT] = sizeof(ppn_kp_gemm_tc_kwt),
        [PPN_K_GEMM_SWIGLU_T] = sizeof(ppn_kp_gemm_swiglu_t), [PPN_K_GEMM_TC_K16T] = sizeof(ppn_kp_gemm_tc_k16t),
        [PPN_K_GEMM_TC_KX] = sizeof(ppn_kp_gemm_tc_kx), [PPN_K_GEMM_SWIGLU_X] = sizeof(ppn_kp_gemm_swiglu_x),
        [PPN_K_GEMM_TC_W] = sizeof(ppn_kp_gemm_tc_w), [PPN_K_GEMM_SWIGLU_W] = sizeof(ppn_kp_gemm_swiglu_w),
    };
    static const char *const names[PPN_K_COUNT] = {
        "ppn_k_embed", "ppn_k_rmsnorm", "ppn_k_matvec", "ppn_k_rope", "ppn_k_head_rmsnorm", "ppn_k_attn",
        "ppn_k_attn_bf16", "ppn_k_attn_f16", "ppn_k_swiglu", "ppn_k_add", "ppn_k_argmax", "ppn_k_fill", "ppn_k_set_hdr",
        "ppn_k_matmat", "ppn_k_gemm", "ppn_k_gemm_tc_l", "ppn_k_gemm_tc_m", "ppn_k_gemm_tc_s", "ppn_k_gemm_tc_k",
        "ppn_k_gemm_tc_kw", "ppn_k_gemm_tc_kwx", "ppn_k_gemm_tc_kw16", "ppn_k_gemm_tc_h",
        "ppn_k_embed_rows", "ppn_k_rmsnorm_rows", "ppn_k_head_rmsnorm_rows", "ppn_k_rope_kv_rows", "ppn_k_attn_rows",
        "ppn_k_attn_rows_bf16", "ppn_k_attn_rows_f16", "ppn_k_swiglu_rows", "ppn_k_argmax_rows", "ppn_k_rope_kv_batch",
        "ppn_k_attn_batch", "ppn_k_attn_batch_bf16", "ppn_k_attn_batch_f16", "ppn_k_gemm_swiglu",
        "ppn_k_attn_batch_tc", "ppn_k_gemm_tc_k16", "ppn_k_gemm_tc_kwt", "ppn_k_gemm_swiglu_t", "ppn_k_gemm_tc_k16t",
        "ppn_k_gemm_tc_kx", "ppn_k_gemm_swiglu_x", "ppn_k_gemm_tc_w", "ppn_k_gemm_swiglu_w",
    };
    for (int i = 0; i < PPN_K_COUNT; i++) {
        const ppn_gpu_kernel *k = &ppn_kernels[i];
        assert_non_null(k->name);
        assert_int_equal(strncmp(k->name, "ppn_k_", 6), 0);
        assert_string_equal(k->name, names[i]);
        assert_true(k->params_size > 0);
        assert_int_equal(k->params_size, sizes[i]);
        assert_non_null(k->cpu);
        for (int j = 0; j < i; j++) assert_string_not_equal(k->name, ppn_kernels[j].name);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
