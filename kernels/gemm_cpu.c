/* gemm_cpu.c - the CPU reference of the prefill GEMM (ppn_kp_gemm, kparams.h): what the sim backend runs for
 * every gemm kernel, and what the CUDA kernels are checked against.
 *
 * The math the kernels compute, not a more accurate one: for bf16 / f16 weights x is rounded to the weight
 * dtype first (nearest even) and the products, exact in f32, are summed in f32; f32 weights are f32 throughout.
 * The sum over k runs in GEMM_LANES f32 partial sums (element k goes to lane k % GEMM_LANES, each lane in k
 * order), then the lanes pairwise in a fixed tree: a fixed order, so the same inputs give the same bits on every
 * run, and loops the compiler can vectorize without reassociating anything. Reentrant: no static mutable state.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/dtype.h"
#include "core/device/gpu.h"
#include "kernels/kparams.h"

#include "kernels/cpu_ref.h"

#define PTR(type, p) ((type *)(uintptr_t)(p))
#define GEMM_LANES 16

/* Element i of a weight array of dtype wdt, widened to f32 (exact). */
static float gemm_w_at(uint64_t w, int wdt, size_t i)
{
    switch (wdt) {
    case PPN_DTYPE_BF16: return ppn_bf16_to_f32(PTR(const uint16_t, w)[i]);
    case PPN_DTYPE_F16: return ppn_f16_to_f32(PTR(const uint16_t, w)[i]);
    default: return PTR(const float, w)[i];
    }
}

/* v as the tensor cores take it: rounded to wdt and widened back (f32 weights: v itself). */
static float gemm_x_round(float v, int wdt)
{
    switch (wdt) {
    case PPN_DTYPE_BF16: return ppn_bf16_to_f32(ppn_f32_to_bf16(v));
    case PPN_DTYPE_F16: return ppn_f16_to_f32(ppn_f32_to_f16(v));
    default: return v;
    }
}

static float gemm_dot(const float *w, const float *x, int n)
{
    float a[GEMM_LANES] = {0};
    int c = 0;
    for (; c + GEMM_LANES <= n; c += GEMM_LANES)
        for (int k = 0; k < GEMM_LANES; k++) a[k] += w[c + k] * x[c + k];
    for (; c < n; c++) a[c % GEMM_LANES] += w[c] * x[c];
    for (int h = GEMM_LANES / 2; h > 0; h /= 2)
        for (int k = 0; k < h; k++) a[k] += a[k + h];
    return a[0];
}

/* p's out, m x rows f32, all NaN: a reference's loud answer where the kernel could not have run. */
static void gemm_out_nan(const ppn_kp_gemm *p)
{
    float *out = PTR(float, p->out);
    for (size_t i = 0; i < (size_t)p->m * (size_t)p->rows; i++) out[i] = NAN;
}

/* x16's forms of x: f32 (rounded here), bf16 in gemm_tc_kw16's layout, bf16 row-major (gemm_tc_w). */
enum { GEMM_X_F32, GEMM_X_X16, GEMM_X_ROWS };

/* Each weight row is widened once and met with every (rounded) x row; out[i, r] = res[i, r] + (dot + bias),
 * res read before out is written (they may alias). x16: x is given in bf16, already rounded, in gemm_tc_kw16's layout
 * (GEMM_X_X16: kparams.h, PPN_X16_POS) or row-major (GEMM_X_ROWS: gemm_tc_w), so widened as it is (bf16 weights and
 * cols % 64 == 0 only: otherwise the output is NaN, as the op refuses them). Without host
 * memory for the rounded x the output is NaN (loud, as the other references' faults). */
static void gemm_ref(const ppn_kp_gemm *p, int x16)
{
    size_t m = (size_t)p->m, rows = (size_t)p->rows, cols = (size_t)p->cols;
    float *out = PTR(float, p->out);
    const float *res = p->res ? PTR(const float, p->res) : NULL, *x = PTR(const float, p->x);
    float *xr = malloc(m * cols * sizeof *xr), *wr = malloc(cols * sizeof *wr);
    if (!xr || !wr || (x16 && (p->wdt != PPN_DTYPE_BF16 || cols % 64))) {
        gemm_out_nan(p);
        free(xr), free(wr);
        return;
    }
    for (size_t i = 0; i < m * cols; i++) /* GEMM_X_X16: row i / cols's element i % cols at PPN_X16_POS of it */
        xr[i] = x16 == GEMM_X_X16    ? ppn_bf16_to_f32(PTR(const uint16_t, p->x)[i - i % cols + PPN_X16_POS(i % cols)])
                : x16 == GEMM_X_ROWS ? ppn_bf16_to_f32(PTR(const uint16_t, p->x)[i])
                                     : gemm_x_round(x[i], p->wdt);
    for (size_t r = 0; r < rows; r++) {
        for (size_t k = 0; k < cols; k++) wr[k] = gemm_w_at(p->w, p->wdt, r * cols + k);
        float b = p->bias ? gemm_w_at(p->bias, p->wdt, r) : 0.0f;
        for (size_t i = 0; i < m; i++) {
            float v = gemm_dot(wr, xr + i * cols, p->cols);
            if (p->bias) v = v + b;
            if (res) v = res[i * rows + r] + v;
            out[i * rows + r] = v;
        }
    }
    free(xr), free(wr);
}

void ppn_cpu_gemm(const void *params) { gemm_ref(params, GEMM_X_F32); }
void ppn_cpu_gemm_tc_kw16(const void *params) { gemm_ref(params, GEMM_X_X16); }
void ppn_cpu_gemm_tc_k16(const void *params) { gemm_ref(params, GEMM_X_X16); }

/* W's tensor map as gemm_tc_kwt, gemm_tc_k16t and gemm_swiglu_t read it (ops_gemm.c encodes it): the sim's encoding
 * of a bf16 [rows, cols] matrix at row pitch cols x 2 bytes in 64 x 64 boxes. Its base (W's address) where it is,
 * else 0. */
static uint64_t gemm_wmap_base(const ppn_tmap *map, const ppn_kp_gemm *g)
{
    ppn_tmap_desc d;
    if (!ppn_tmap_sim_decode(map, &d)) return 0;
    int ok = d.elem_bytes == 2 && g->wdt == PPN_DTYPE_BF16 && d.dim[0] == (uint64_t)g->cols &&
             d.dim[1] == (uint64_t)g->rows && d.row_bytes == (uint64_t)g->cols * 2u &&
             d.box[0] == PPN_GEMM_TC_KWT_BOX && d.box[1] == PPN_GEMM_TC_KWT_BOX;
    return ok ? d.base : 0;
}

/* gemm_tc_kwt: gemm_tc_kw16's reference with W read where the tensor map says, not from p.g.w, so a map that does
 * not describe W gives wrong sums on the sim; a map that is not the sim's, or not the shape, pitch and box the
 * kernel's loads assume, gives NaN. */
void ppn_cpu_gemm_tc_kwt(const void *params)
{
    ppn_kp_gemm_tc_kwt p;
    memcpy(&p, params, sizeof p); /* the sim's copy of the params need not be 64-byte aligned */
    uint64_t w = gemm_wmap_base(&p.wmap, &p.g);
    if (!w) {
        gemm_out_nan(&p.g);
        return;
    }
    p.g.w = w;
    gemm_ref(&p.g, GEMM_X_X16);
}

/* The operands of the forms whose W and x both come through tensor maps (gemm_tc_k16t, gemm_tc_w, gemm_swiglu_w):
 * W's base where wmap says (as gemm_tc_kwt's), x's where xmap says (a bf16 [m, cols] matrix at row pitch cols x 2
 * bytes in boxes of 64 columns x xrows rows), not g's, so maps that do not describe the operands give wrong sums on
 * the sim; 0 where the maps are not the sim's, or not the shape, pitch and boxes the kernel's loads assume. */
static int gemm_maps(const ppn_kp_gemm *g, const ppn_tmap *wmap, const ppn_tmap *xmap, unsigned xrows, uint64_t *w,
                     uint64_t *x)
{
    ppn_tmap_desc xd;
    *w = gemm_wmap_base(wmap, g);
    int ok = *w && ppn_tmap_sim_decode(xmap, &xd) && xd.elem_bytes == 2 && xd.dim[0] == (uint64_t)g->cols &&
             xd.dim[1] == (uint64_t)g->m && xd.row_bytes == (uint64_t)g->cols * 2u && xd.box[0] == 64u &&
             xd.box[1] == xrows;
    *x = ok ? xd.base : 0;
    return ok;
}

/* g's sums in x's form xf with W and x read through the maps (gemm_maps); NaN where they do not fit. */
static void gemm_ref_maps(ppn_kp_gemm g, const ppn_tmap *wmap, const ppn_tmap *xmap, unsigned xrows, int xf)
{
    if (!gemm_maps(&g, wmap, xmap, xrows, &g.w, &g.x)) {
        gemm_out_nan(&g);
        return;
    }
    gemm_ref(&g, xf);
}

/* gemm_tc_k16t: gemm_tc_k16's reference through its maps (x's boxes PPN_GEMM_TC_K_KT = 64 columns x
 * PPN_GEMM_TC_K_MP(m) rows, in gemm_tc_kw16's layout). */
void ppn_cpu_gemm_tc_k16t(const void *params)
{
    ppn_kp_gemm_tc_k16t p;
    memcpy(&p, params, sizeof p); /* the sim's copy of the params need not be 64-byte aligned */
    _Static_assert(PPN_GEMM_TC_K_KT == 64, "x's box is 64 columns wide");
    gemm_ref_maps(p.g, &p.wmap, &p.xmap, (unsigned)PPN_GEMM_TC_K_MP(p.g.m), GEMM_X_X16);
}

/* gemm_swiglu: the gate|up sums of W at w over x at x (in the form xf) as gemm_ref gives them (into host memory),
 * then swiglu rows' reference over them into g's out (odt). The kernels add no bias or res, nor does this. Without
 * host memory for the sums, an odd row count or no W (w 0: a map refused), out is NaN (loud, as the other
 * references' faults). */
static void gemm_swiglu_ref(const ppn_kp_gemm *g, int odt, uint64_t w, uint64_t x, int xf)
{
    size_t m = (size_t)g->m, n = (size_t)g->rows / 2;
    float *gu = g->rows % 2 || !w ? NULL : malloc(m * 2u * n * sizeof *gu);
    if (!gu) {
        for (size_t i = 0; i < m * n; i++) {
            if (odt != PPN_DTYPE_F32) PTR(uint16_t, g->out)[i] = 0x7fc0u;
            else PTR(float, g->out)[i] = NAN;
        }
        return;
    }
    ppn_kp_gemm q = *g;
    q.out = (uint64_t)(uintptr_t)gu, q.bias = 0, q.res = 0, q.w = w, q.x = x;
    gemm_ref(&q, xf);
    ppn_kp_swiglu_rows r = {.out = g->out, .gu = (uint64_t)(uintptr_t)gu, .n = (int32_t)n, .c = g->m, .vec = 0,
                            .odt = odt};
    ppn_cpu_swiglu_rows(&r);
    free(gu);
}

void ppn_cpu_gemm_swiglu(const void *params)
{
    const ppn_kp_gemm_swiglu *p = params;
    gemm_swiglu_ref(&p->g, p->odt, p->g.w, p->g.x, GEMM_X_X16);
}

/* gemm_swiglu_t: gemm_swiglu's reference with W read where its tensor map says (gemm_tc_kwt's check). */
void ppn_cpu_gemm_swiglu_t(const void *params)
{
    ppn_kp_gemm_swiglu_t pt;
    memcpy(&pt, params, sizeof pt); /* the sim's copy of the params need not be 64-byte aligned */
    gemm_swiglu_ref(&pt.g, pt.odt, gemm_wmap_base(&pt.wmap, &pt.g), pt.g.x, GEMM_X_X16);
}

/* gemm_tc_kx and gemm_swiglu_x: gemm_tc_kw16's and gemm_swiglu's sums on another tile (kparams.h). */
void ppn_cpu_gemm_tc_kx(const void *params) { gemm_ref(params, GEMM_X_X16); }
void ppn_cpu_gemm_swiglu_x(const void *params) { ppn_cpu_gemm_swiglu(params); }

void ppn_cpu_gemm_tc_l(const void *params) { ppn_cpu_gemm(params); }
void ppn_cpu_gemm_tc_m(const void *params) { ppn_cpu_gemm(params); }
void ppn_cpu_gemm_tc_s(const void *params) { ppn_cpu_gemm(params); }
void ppn_cpu_gemm_tc_k(const void *params) { ppn_cpu_gemm(params); }
void ppn_cpu_gemm_tc_kw(const void *params) { ppn_cpu_gemm(params); }
void ppn_cpu_gemm_tc_kwx(const void *params) { ppn_cpu_gemm(params); }

/* gemm_tc_h: x and W are read where its tensor maps say (the sim's encoding, gpu.h), not from p.g's x and w, so
 * a map that does not describe the operands gives wrong sums on the sim; a map that is not the sim's, or one
 * whose shape, row pitch or box is not what the kernel's loads assume (ops_gemm.c encodes them), gives NaN. */
void ppn_cpu_gemm_tc_h(const void *params)
{
    ppn_kp_gemm_tc_h p;
    memcpy(&p, params, sizeof p); /* the sim's copy of the params need not be 64-byte aligned */
    ppn_tmap_desc xd, wd;
    int ok = ppn_tmap_sim_decode(&p.xmap, &xd) && ppn_tmap_sim_decode(&p.wmap, &wd);
    ok = ok && xd.elem_bytes == 4 && wd.elem_bytes == 2 && p.g.wdt != PPN_DTYPE_F32;
    ok = ok && xd.dim[0] == (uint64_t)p.g.cols && wd.dim[0] == (uint64_t)p.g.cols && xd.dim[1] == (uint64_t)p.g.m &&
         wd.dim[1] == (uint64_t)p.g.rows && xd.row_bytes == (uint64_t)p.g.cols * 4u &&
         wd.row_bytes == (uint64_t)p.g.cols * 2u;
    ok = ok && xd.box[0] == PPN_GEMM_TC_H_XBOX && xd.box[1] == PPN_GEMM_TC_H_BM && wd.box[0] == PPN_GEMM_TC_H_BK &&
         wd.box[1] == PPN_GEMM_TC_H_BN;
    if (!ok) {
        gemm_out_nan(&p.g);
        return;
    }
    ppn_kp_gemm q = p.g;
    q.x = xd.base, q.w = wd.base;
    ppn_cpu_gemm(&q);
}

/* gemm_tc_w: the tiles' sums on x given in bf16 row-major, through its maps (x's boxes 64 columns x
 * PPN_GEMM_TC_W_BT(m) rows). */
void ppn_cpu_gemm_tc_w(const void *params)
{
    ppn_kp_gemm_tc_w p;
    memcpy(&p, params, sizeof p); /* the sim's copy of the params need not be 64-byte aligned */
    gemm_ref_maps(p.g, &p.wmap, &p.xmap, (unsigned)PPN_GEMM_TC_W_BT(p.g.m), GEMM_X_ROWS);
}

/* gemm_swiglu_w: gemm_tc_w's reference over the gate|up matrix through its maps (x's boxes 64 columns x
 * PPN_GEMM_SWIGLU_W_BT(m) rows), then swiglu rows' into out (odt: f32 or bf16 row-major). */
void ppn_cpu_gemm_swiglu_w(const void *params)
{
    ppn_kp_gemm_swiglu_w p;
    memcpy(&p, params, sizeof p); /* the sim's copy of the params need not be 64-byte aligned */
    uint64_t w, x;
    if (!gemm_maps(&p.g, &p.wmap, &p.xmap, (unsigned)PPN_GEMM_SWIGLU_W_BT(p.g.m), &w, &x)) w = 0;
    gemm_swiglu_ref(&p.g, p.odt, w, x, GEMM_X_ROWS);
}
