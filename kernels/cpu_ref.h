/* cpu_ref.h - the CPU reference of every kernel (cpu_ref.c); the kernel table (ktable.c) names them, and the
 * sim backend runs them through it. Each computes the whole op from its params struct (kparams.h). */
#ifndef PPN_CPU_REF_H
#define PPN_CPU_REF_H

void ppn_cpu_embed(const void *params);
void ppn_cpu_rmsnorm(const void *params);
void ppn_cpu_matvec(const void *params);
void ppn_cpu_rope(const void *params);
void ppn_cpu_head_rmsnorm(const void *params);
void ppn_cpu_attn(const void *params);
void ppn_cpu_attn_bf16(const void *params); /* = ppn_cpu_attn (it reads kvdt) */
void ppn_cpu_attn_f16(const void *params);  /* = ppn_cpu_attn */
void ppn_cpu_swiglu(const void *params);
void ppn_cpu_add(const void *params);
void ppn_cpu_argmax(const void *params);
void ppn_cpu_fill(const void *params);
void ppn_cpu_set_hdr(const void *params);
void ppn_cpu_matmat(const void *params);
void ppn_cpu_gemm(const void *params); /* gemm_cpu.c */
void ppn_cpu_gemm_tc_l(const void *params); /* = ppn_cpu_gemm (one math for every gemm kernel) */
void ppn_cpu_gemm_tc_m(const void *params); /* = ppn_cpu_gemm */
void ppn_cpu_gemm_tc_s(const void *params); /* = ppn_cpu_gemm */
void ppn_cpu_gemm_tc_k(const void *params); /* = ppn_cpu_gemm */
void ppn_cpu_gemm_tc_kw(const void *params); /* = ppn_cpu_gemm */
void ppn_cpu_gemm_tc_kwx(const void *params); /* = ppn_cpu_gemm */
void ppn_cpu_gemm_tc_kw16(const void *params); /* ppn_cpu_gemm on x given in bf16 */
void ppn_cpu_gemm_tc_kwt(const void *params);  /* ppn_cpu_gemm_tc_kw16 with W read through its tensor map */
void ppn_cpu_gemm_tc_k16t(const void *params); /* ppn_cpu_gemm_tc_k16 with W and x read through their tensor maps */
void ppn_cpu_gemm_tc_k16(const void *params);  /* the same (gemm_tc_k's tile on that x) */
void ppn_cpu_gemm_swiglu(const void *params);  /* ppn_cpu_gemm_tc_kw16 into gate|up, then ppn_cpu_swiglu_rows */
void ppn_cpu_gemm_swiglu_t(const void *params); /* ppn_cpu_gemm_swiglu with W read through its tensor map */
void ppn_cpu_gemm_tc_kx(const void *params);    /* = ppn_cpu_gemm_tc_kw16 (its sums, 128-token groups) */
void ppn_cpu_gemm_swiglu_x(const void *params); /* = ppn_cpu_gemm_swiglu (on gemm_tc_kx's tile) */
void ppn_cpu_gemm_tc_w(const void *params);     /* the tiles' sums on row-major bf16 x, through its maps */
void ppn_cpu_gemm_swiglu_w(const void *params); /* gemm_tc_w's reference over gate|up, then swiglu rows' */
void ppn_cpu_gemm_tc_h(const void *params);  /* ppn_cpu_gemm on the operands its tensor maps (sim) describe */
/* the many-rows kernels (kernels/rows_cpu.c): the decode references above, row by row */
void ppn_cpu_embed_rows(const void *params);
void ppn_cpu_rmsnorm_rows(const void *params);
void ppn_cpu_head_rmsnorm_rows(const void *params);
void ppn_cpu_rope_kv_rows(const void *params);
void ppn_cpu_attn_rows(const void *params);
void ppn_cpu_attn_rows_bf16(const void *params); /* = ppn_cpu_attn_rows (it reads kvdt) */
void ppn_cpu_attn_rows_f16(const void *params);  /* = ppn_cpu_attn_rows */
void ppn_cpu_swiglu_rows(const void *params);
void ppn_cpu_argmax_rows(const void *params);
/* batched decode (kernels/rows_cpu.c): the decode references above, row by row at each row's position and table */
void ppn_cpu_rope_kv_batch(const void *params);
void ppn_cpu_attn_batch(const void *params);
void ppn_cpu_attn_batch_bf16(const void *params); /* = ppn_cpu_attn_batch (it reads kvdt) */
void ppn_cpu_attn_batch_f16(const void *params);  /* = ppn_cpu_attn_batch */
void ppn_cpu_attn_batch_tc(const void *params);   /* each row by ppn_cpu_attn_tc */
/* One decode attention with ppn_k_attn_batch_tc's roundings (q and the weights to bf16): a helper, not a kernel. */
void ppn_cpu_attn_tc(const ppn_kp_attn *p);

#endif
