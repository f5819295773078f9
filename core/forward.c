/* forward.c - the pieces of one decode step: embed, one transformer layer, final norm + lm head.
 * io is [ppn_step_hdr (PPN_IO_HDR_BYTES)][x: dim floats]; every kernel reads the position and token from the
 * header in device memory, so they are ordered by the same stream/event chain as the hidden state. */
#include <math.h>
#include "core/rt.h"
#include "core/base/dtype.h"
#include "core/base/err.h"
#include "kernels/ops.h"

static ppn_dptr io_x(ppn_dptr io) { return io + PPN_IO_HDR_BYTES; }

ppn_status ppn_fwd_embed(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io)
{
    return ppn_op_embed(m->rt->g, s, io_x(io), m->embed, m->wdt, m->cfg.vocab, m->cfg.dim, io);
}

/* out = W rmsnorm(x): the norm fused into the matvec's input when it fits, else its own launch into xb (scratch
 * of dim floats). */
static ppn_status norm_matvec(ppn_model *m, ppn_gstream *s, ppn_dptr xb, ppn_dptr out, ppn_dptr w, int rows,
                              ppn_dptr x, ppn_dptr nw, ppn_dptr bias)
{
    ppn_gpu *g = m->rt->g;
    const ppn_model_config *c = &m->cfg;
    if (m->map->door.fuse && ppn_op_matvec_fusable(c->dim)) {
        ppn_mv_input in = {.mode = PPN_MV_X_RMSNORM, .x = x, .nw = nw, .eps = c->norm_eps};
        return ppn_op_matvec_in(g, s, out, w, m->wdt, in, rows, c->dim, bias, 0);
    }
    PPN_CHECK(ppn_op_rmsnorm(g, s, xb, x, nw, m->wdt, c->dim, c->norm_eps));
    return ppn_op_matvec(g, s, out, w, m->wdt, xb, rows, c->dim, bias, 0);
}

/* x += attn(norm(x)); x += mlp(norm(x)) for layer l, on a stage whose stream is on device dev: 6 launches
 * (norm+qkv, rope+kv store+attention, o+residual, norm+gate|up, SwiGLU, down+residual), 2 more with q/k
 * norms; PPN_FUSE=0 gives the norms and the rotary their own launches again (9: rmsnorm, qkv, rope+kv store,
 * attention, o, rmsnorm, gate|up, SwiGLU, down). */
ppn_status ppn_fwd_layer(ppn_seq *q, ppn_gstream *s, int dev, ppn_stage_scratch *r, ppn_dptr io, int l)
{
    ppn_model *m = q->m;
    const ppn_model_config *c = &m->cfg;
    const ppn_dev_layer *w = &m->layers[l];
    ppn_gpu *g = m->rt->g;
    ppn_dptr x = io_x(io), hdr = io;
    int wdt = m->wdt, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim;
    /* q, k, v from one matvec over the stacked [wq; wk; wv]: every row is reduced exactly as on its own */
    ppn_dptr qv = r->qkv, kv = qv + sizeof(float) * (size_t)(nh * hd), vv = kv + sizeof(float) * (size_t)(nkv * hd);
    ppn_dptr gate = r->gu, up = gate + sizeof(float) * (size_t)ffn;
    PPN_CHECK(norm_matvec(m, s, r->xb, qv, w->wqkv, (nh + 2 * nkv) * hd, x, w->attn_norm, w->bqkv));
    if (c->qk_norm) {
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, qv, nh, hd, w->q_norm, wdt, c->norm_eps));
        PPN_CHECK(ppn_op_head_rmsnorm(g, s, kv, nkv, hd, w->k_norm, wdt, c->norm_eps));
    }
    float scale = 1.0f / sqrtf((float)hd);
    /* the pools of layer l through this stage's copy of the block table (the stage syncs it before the walk) */
    ppn_kv_view cache = {.pool = ppn_kv_pool_of(m, l), .tbl = r->kvt, .tbl_h = q->tbl_h, .n_tbl = r->kvt_synced};
    if (m->map->door.fuse && ppn_op_attn_rope_fits(hd, c->rope_interleaved)) { /* the rotary and the k/v store inside */
        PPN_CHECK(ppn_op_attn_rope(g, s, r->att, qv, &cache, nh, nkv, hd, scale, hdr, r->attp, m->attn_split,
                                   m->inv_freq[dev], c->rope_interleaved));
    } else { /* q and k are adjacent heads at one position: one rotary launch covers both, and stores k and v */
        PPN_CHECK(ppn_op_rope_kv(g, s, qv, nh, nkv, hd, m->inv_freq[dev], c->rope_interleaved, hdr, &cache, vv));
        PPN_CHECK(ppn_op_attn(g, s, r->att, qv, &cache, nh, nkv, hd, scale, hdr, r->attp, m->attn_split));
    }
    PPN_CHECK(ppn_op_matvec(g, s, x, w->wo, wdt, r->att, dim, nh * hd, 0, x));
    PPN_CHECK(norm_matvec(m, s, r->xb, gate, w->wgu, 2 * ffn, x, w->ffn_norm, 0));
    /* SwiGLU keeps its own launch: computed in down's input it cost more than the launch (PERF.md: every block
     * re-reads all of gate and up) */
    PPN_CHECK(ppn_op_swiglu(g, s, gate, gate, up, ffn));
    return ppn_op_matvec(g, s, x, w->w_down, wdt, gate, dim, ffn, 0, x);
}

ppn_status ppn_fwd_head(ppn_model *m, ppn_gstream *s, ppn_stage_scratch *r, ppn_dptr io, ppn_dptr logits)
{
    return norm_matvec(m, s, r->xb, logits, m->lm_head, m->cfg.vocab, io_x(io), m->final_norm, 0);
}

/* Many rows (a prefill chunk) ------------------------------------------------------------------------------
 * x [c, dim] in place, as one decode step's x: the same layer, each op over every row of the chunk; only the
 * rotary, the KV store and attention are per sequence (a chunk may hold rows of several). */

static ppn_dptr row_at(ppn_dptr base, int row, size_t row_floats)
{
    return base + sizeof(float) * row_floats * (size_t)row;
}

ppn_status ppn_fwd_rows_embed(ppn_model *m, ppn_gstream *s, const ppn_rows_scratch *r, ppn_dptr x, int c)
{
    return ppn_op_embed_rows(m->rt->g, s, x, m->embed, m->wdt, m->cfg.vocab, m->cfg.dim, r->tok, c);
}

/* Attention's position splits for nb rows: as many as leave about per_sm (row, KV head, split) blocks an SM, at most
 * the model's (its scratch holds those) and at least one; the model's where the SM count is unknown. A function of
 * nb alone. */
static int attn_splits(const ppn_model *m, int per_sm, int nb, int nkv)
{
    int split = m->attn_split, per = per_sm * m->sm_count / (nb * nkv);
    if (m->sm_count > 0 && split > per) split = per > 1 ? per : 1;
    return split;
}

/* A batch's rows (one per sequence; a mixed walk's rows [brow0, rows)): the rotary with the KV store and attention
 * of every row. On tensor cores where the door lets them (PPN_ATTN_TC) and the cache and heads fit
 * (ppn_op_rope_kv_batch then ppn_op_attn_batch_tc; each row's bits its own but not the decode kernel's). Else in one
 * launch where the door fuses, the shape fits and the blocks fit a wave
 * (ppn_op_attn_rope_batch, the same bits), else one launch each, through the row descriptors the walk uploaded:
 * this stage's in the first slot of r->segs in the split, stage st's in slot st of stage 0's in the unsplit walk
 * (r is then stage 0's scratch). Attention's position splits: as many as leave about one (row, KV head, split)
 * block per SM, SMs / (B x n_kv), at most the model's (the decode step's) and at least one: more are mostly idle
 * blocks (a split takes 64 positions at least) that cost more than they hide (H200: llama-1b at B = 64, and the
 * 8B at B = 16, where the model's 33 splits took 1.5x one's time: docs/PERF.md). A function of B alone: a captured
 * graph never meets another; the scratch's counters are untouched with one split. */
static ppn_status batch_attention(ppn_model *m, ppn_gstream *s, int dev, const ppn_rows_scratch *r,
                                  const ppn_step_cmd *c, int l, int odt)
{
    const ppn_model_config *cf = &m->cfg;
    int hd = cf->head_dim, nh = cf->n_heads, nkv = cf->n_kv_heads, st = ppn_layer_stage(m->map, l);
    int slot = r == &m->stages[st].rs ? 0 : st, b0 = c->brow0, nb = c->rows - c->brow0;
    size_t stride = (size_t)(nh + 2 * nkv) * (size_t)hd;
    ppn_dptr qkv = row_at(r->qkv, b0, stride);
    ppn_dptr att = r->att + (ppn_dptr)b0 * (size_t)nh * (size_t)hd * (odt == PPN_DTYPE_F32 ? 4u : 2u);
    float scale = 1.0f / sqrtf((float)hd);
    ppn_kv_pool pool = ppn_kv_pool_of(m, l);
    ppn_dptr segs_d = r->segs + sizeof(ppn_kseg) * (size_t)slot * (size_t)nb;
    const ppn_kseg *segs_h = c->ksegs_h + (size_t)st * (size_t)nb;
    if (m->map->door.attn_tc && ppn_op_attn_batch_tc_fits(nh, nkv, hd, pool.kvdt)) {
        /* Tensor cores (PPN_ATTN_TC): the rotary and the k/v store first, in their own launch. Not inside (tried in
         * 46599d0, the same bits): on the H200 (2026-12-05) every block's sincosf for q made the 8B's B=16 step
         * 5.80 ms against 5.39-5.44 with the two launches, B=64 7.50 against 6.95. Its 128-thread blocks fit three
         * an SM. */
        int split = attn_splits(m, 3, nb, nkv);
        PPN_CHECK(ppn_op_rope_kv_batch(m->rt->g, s, qkv, nh, nkv, hd, m->inv_freq[dev], cf->rope_interleaved, &pool,
                                       segs_d, segs_h, c->tbl_hs, c->n_tbls, nb));
        return ppn_op_attn_batch_tc(m->rt->g, s, att, odt, qkv, nh, nkv, hd, scale, &pool, segs_d, segs_h, c->tbl_hs,
                                    c->n_tbls, nb, r->attp, split);
    }
    int split = attn_splits(m, 1, nb, nkv); /* about one (row, KV head, split) block an SM */
    /* The rotary inside attention while the rows' (row, KV head) blocks fit one wave of the SMs: there it saves a
     * launch (H200, 2026-12-02: llama-1b B=16 1.568 -> 1.541 ms, 8B B=16 unchanged); past a wave every block carries
     * the rotary's code and the launch it saves is cheaper (8B B=64 7.510 -> 7.588 ms). A function of B alone, so a
     * captured graph never meets the other form; the bits are the same either way. The sim reports one SM and no
     * timing: it takes the fused form at every B, so the checker watches it (PPN_FUSE=0 takes the other). */
    int wave = m->sm_count <= 1 || nb * nkv <= m->sm_count;
    if (m->map->door.fuse && wave && ppn_op_attn_rope_fits(hd, cf->rope_interleaved))
        return ppn_op_attn_rope_batch_to(m->rt->g, s, att, odt, qkv, nh, nkv, hd, scale, &pool, segs_d, segs_h,
                                         c->tbl_hs, c->n_tbls, nb, r->attp, split, m->inv_freq[dev],
                                         cf->rope_interleaved);
    PPN_CHECK(ppn_op_rope_kv_batch(m->rt->g, s, qkv, nh, nkv, hd, m->inv_freq[dev], cf->rope_interleaved, &pool,
                                   segs_d, segs_h, c->tbl_hs, c->n_tbls, nb));
    return ppn_op_attn_batch_to(m->rt->g, s, att, odt, qkv, nh, nkv, hd, scale, &pool, segs_d, segs_h, c->tbl_hs,
                                c->n_tbls, nb, r->attp, split);
}

/* The rotary with the KV store, then causal attention over the sequence's cache, for each segment; a batch's
 * rows (and a mixed walk's decode rows, after its prompt segments) in one launch each. odt: the output's dtype,
 * f32, or PPN_DTYPE_BF16 (o's x for gemm_tc_kw16) in every segment's rows and the batch's alike. */
static ppn_status rows_attention(ppn_model *m, ppn_gstream *s, int dev, const ppn_rows_scratch *r,
                                 const ppn_step_cmd *cmd, int l, int odt)
{
    if (cmd->kind == PPN_ROWS_BATCH) return batch_attention(m, s, dev, r, cmd, l, odt);
    const ppn_model_config *c = &m->cfg;
    int hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, st = ppn_layer_stage(m->map, l);
    size_t stride = (size_t)(nh + 2 * nkv) * (size_t)hd;
    float scale = 1.0f / sqrtf((float)hd);
    int mixed = cmd->kind == PPN_ROWS_MIXED;
    int nseg = mixed ? cmd->nseg - (cmd->rows - cmd->brow0) : cmd->nseg; /* the decode rows' segments come last */
    for (int i = 0; i < nseg; i++) {
        const ppn_rowseg *g = &cmd->segs[i];
        ppn_dptr qkv = row_at(r->qkv, g->r0, stride);
        ppn_dptr att = r->att + (ppn_dptr)g->r0 * (size_t)nh * (size_t)hd * (odt == PPN_DTYPE_F32 ? 4u : 2u);
        ppn_kv_view cache = ppn_kv_view_of(m, g->seq, st, l, g->n_tbl);
        PPN_CHECK(ppn_op_rope_kv_rows(m->rt->g, s, qkv, nh, nkv, hd, m->inv_freq[dev], c->rope_interleaved, &cache,
                                      g->pos0, g->n));
        PPN_CHECK(ppn_op_attn_rows_to(m->rt->g, s, att, odt, qkv, &cache, nh, nkv, hd, scale, g->pos0, g->n));
    }
    return mixed ? batch_attention(m, s, dev, r, cmd, l, odt) : PPN_OK;
}

/* out = x . W^T (+ bias)(+ res) over m rows, x in the form xf (x_form's): bf16 row-major (ppn_op_gemm_rows16), bf16
 * in gemm_tc_kw16's layout (ppn_op_gemm_x16) or f32. */
static ppn_status gemm_of(ppn_gpu *g, ppn_gstream *s, int xf, ppn_dptr out, ppn_dptr w, int wdt, ppn_dptr x, int m,
                          int rows, int cols, ppn_dptr bias, ppn_dptr res)
{
    if (xf == PPN_ODT_BF16_ROWS) return ppn_op_gemm_rows16(g, s, out, w, wdt, x, m, rows, cols, bias, res);
    return xf == PPN_DTYPE_BF16 ? ppn_op_gemm_x16(g, s, out, w, wdt, x, m, rows, cols, bias, res)
                                : ppn_op_gemm(g, s, out, w, wdt, x, m, rows, cols, bias, res);
}

/* The GEMM of m rows over a rows x cols matrix takes bf16 x from its producer (the door's fusion on, and
 * ppn_op_gemm_x16_fits or ppn_op_gemm_k16_fits: functions of the shape): where the op runs gemm_tc_kw and, for few
 * rows, gemm_tc_k (gemm_tc_k16 then; H200 2026-12-05, docs/PERF.md: at m = 16 the 8B's o 68.3% of the copy floor
 * against 62.3%, down 85.1 against 79.2, lm head 96.2 against 87.8; B=16 step 5.391, 5.408 -> 5.376, 5.341 ms; the
 * same ids). */
static int x16_takes(const ppn_model *m, int rows_m, int rows, int cols)
{
    return m->map->door.fuse &&
           (ppn_op_gemm_x16_fits(rows_m, rows, cols, m->wdt) || ppn_op_gemm_k16_fits(rows_m, rows, cols, m->wdt));
}

/* The form of x the GEMM of m rows over a rows x cols matrix reads on s's device, which its producer writes (its
 * odt): bf16 row-major where gemm_tc_w takes the shape (the door's fusion on and ppn_op_gemm_rows16_takes: PPN_GEMM_W's
 * rule), else bf16 in gemm_tc_kw16's layout where x16_takes, else f32. A function of the shape and the device, so a
 * captured graph never meets another form. */
static int x_form(const ppn_model *m, ppn_gstream *s, int rows_m, int rows, int cols)
{
    if (m->map->door.fuse && ppn_op_gemm_rows16_takes(m->rt->g, s, rows_m, rows, cols, m->wdt))
        return PPN_ODT_BF16_ROWS;
    return x16_takes(m, rows_m, rows, cols) ? PPN_DTYPE_BF16 : PPN_DTYPE_F32;
}

/* rmsnorm(x; nw) of m rows of dim into r->xb, in the form xf (x_form's, for the GEMM after it). */
static ppn_status norm_rows(ppn_model *m, ppn_gstream *s, const ppn_rows_scratch *r, ppn_dptr x, ppn_dptr nw, int xf,
                            int rows_m)
{
    return ppn_op_rmsnorm_rows_to(m->rt->g, s, r->xb, xf, x, nw, m->wdt, m->cfg.dim, m->cfg.norm_eps, rows_m);
}

/* out = rmsnorm(x; nw) . W^T (+ bias) over m rows of dim: the norm into r->xb, in the form the GEMM takes. */
static ppn_status norm_gemm(ppn_model *m, ppn_gstream *s, const ppn_rows_scratch *r, ppn_dptr x, ppn_dptr nw,
                            ppn_dptr out, ppn_dptr w, int rows, ppn_dptr bias, int rows_m)
{
    int xf = x_form(m, s, rows_m, rows, m->cfg.dim);
    PPN_CHECK(norm_rows(m, s, r, x, nw, xf, rows_m));
    return gemm_of(m->rt->g, s, xf, out, w, m->wdt, r->xb, rows_m, rows, m->cfg.dim, bias, 0);
}

/* The gate|up GEMM of m rows (its SwiGLU after it) on s's device: GU_W gemm_swiglu_w, SwiGLU in gemm_tc_w's epilogue
 * (ppn_op_gemm_swiglu_rows16_takes: PPN_GEMM_W_SWIGLU's level); GU_SPLIT the split-K gemm_swiglu, SwiGLU in its
 * epilogue (where gemm_tc_w does not take gate|up, or PPN_GEMM_W_SWIGLU=0 keeps it); GU_GEMM the GEMM in x_form's
 * form, then SwiGLU rows. A function of the shape and the device, as x_form. */
enum { GU_W, GU_SPLIT, GU_GEMM };
static int gu_path(const ppn_model *m, ppn_gstream *s, int rows_m)
{
    ppn_gpu *g = m->rt->g;
    const int ffn = m->cfg.ffn_dim, dim = m->cfg.dim, fuse = m->map->door.fuse;
    if (fuse && ppn_op_gemm_swiglu_rows16_takes(g, s, rows_m, ffn, dim, m->wdt)) return GU_W;
    const int tiles = g->gemm_w_swiglu && x_form(m, s, rows_m, 2 * ffn, dim) == PPN_ODT_BF16_ROWS;
    return fuse && !tiles && ppn_op_gemm_swiglu_fits(g, s, rows_m, ffn, dim, m->wdt) ? GU_SPLIT : GU_GEMM;
}

/* A layer over the walk's rows. Where the GEMM after the norm, SwiGLU or attention runs the middle split-K tile on
 * bf16 weights (ppn_op_gemm_x16_fits: a function of the shape, so a captured graph never meets the other form),
 * they write its x in bf16, rounded as the GEMM would round the f32 (the same bits, half of x's bytes; the bf16
 * rows sit in the front half of xb, act and att). Attention writes it so in a batch walk. A prompt segment's rows
 * (attn_rows) can be written so too (ppn_op_attn_rows_to; tests/gpu attn_case passed on an H100, 2026-12-05), which
 * gives a mixed walk's, a verify's and a short chunk's o bf16 x, but a mixed step of 64 or 80 rows was level with it
 * (docs/PERF.md), so those walks' o keeps f32 x (of below; test_kprof's mixed cases count it), also where PPN_GEMM_KX's
 * level takes their rows: there gemm_tc_kw's one launch on f32 x beat gemm_tc_kx's on bf16 x (an H100, 2026-12-06:
 * 36.9 us alone against 43.2, the 8B's 16 + 64-row step 10.57 -> 10.41 ms; the same bits either way). Where
 * gate|up takes bf16 x on a device that runs the TMA kernels, SwiGLU runs in its epilogue (ppn_op_gemm_swiglu: the same
 * bits, no gate|up round trip). Where gemm_tc_w takes a GEMM (x_form: PPN_GEMM_W's rule on the device), its producer
 * writes x in bf16 row-major instead, in every kind of walk (a prompt segment's attention rows too); its sums are the
 * large tiles'. gate|up goes its own way (gu_path): gemm_swiglu_w up to 128 tokens where PPN_GEMM_W_SWIGLU's level
 * takes it (two warpgroups a CTA, gate and up, over one ring; docs/PERF.md has its figures), the tiles' sums; where
 * gemm_tc_w takes it past that, its f32 output through SwiGLU rows; else the split-K gemm_swiglu where it fits (with
 * PPN_GEMM_W_SWIGLU=0, the A/B arm, also where gemm_tc_w takes the shape: the forward before it) or SwiGLU rows.
 * PPN_FUSE=0 keeps x f32 everywhere (the GEMM rounds it) and SwiGLU its own kernel. */
ppn_status ppn_fwd_rows_layer(ppn_model *m, ppn_gstream *s, int dev, const ppn_rows_scratch *r, ppn_dptr x,
                              const ppn_step_cmd *cmd, int l)
{
    int rows = cmd->rows;
    const ppn_model_config *c = &m->cfg;
    const ppn_dev_layer *w = &m->layers[l];
    ppn_gpu *g = m->rt->g;
    int wdt = m->wdt, dim = c->dim, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads, ffn = c->ffn_dim;
    int qkv_cols = (nh + 2 * nkv) * hd;
    PPN_CHECK(norm_gemm(m, s, r, x, w->attn_norm, r->qkv, w->wqkv, qkv_cols, w->bqkv, rows));
    if (c->qk_norm) {
        PPN_CHECK(ppn_op_head_rmsnorm_rows(g, s, r->qkv, qkv_cols, 0, nh, hd, w->q_norm, wdt, c->norm_eps, rows));
        PPN_CHECK(ppn_op_head_rmsnorm_rows(g, s, r->qkv, qkv_cols, nh, nkv, hd, w->k_norm, wdt, c->norm_eps, rows));
    }
    int of = x_form(m, s, rows, dim, nh * hd); /* a mixed or prompt walk's o: bf16 row-major, else f32 (below) */
    if (of == PPN_DTYPE_BF16 && cmd->kind != PPN_ROWS_BATCH) of = PPN_DTYPE_F32;
    PPN_CHECK(rows_attention(m, s, dev, r, cmd, l, of));
    PPN_CHECK(gemm_of(g, s, of, x, w->wo, wdt, r->att, rows, dim, nh * hd, 0, x));
    int adt = x_form(m, s, rows, dim, ffn), gu = gu_path(m, s, rows);
    if (gu == GU_W) {
        PPN_CHECK(norm_rows(m, s, r, x, w->ffn_norm, PPN_ODT_BF16_ROWS, rows)); /* gate|up on gemm_tc_w's x */
        PPN_CHECK(ppn_op_gemm_swiglu_rows16(g, s, r->act, adt, w->wgu, wdt, r->xb, rows, ffn, dim));
    } else if (gu == GU_SPLIT) {
        PPN_CHECK(norm_rows(m, s, r, x, w->ffn_norm, PPN_DTYPE_BF16, rows)); /* gate|up takes bf16 x too */
        PPN_CHECK(ppn_op_gemm_swiglu(g, s, r->act, adt, w->wgu, wdt, r->xb, rows, ffn, dim));
    } else {
        PPN_CHECK(norm_gemm(m, s, r, x, w->ffn_norm, r->gu, w->wgu, 2 * ffn, 0, rows));
        PPN_CHECK(ppn_op_swiglu_rows_to(g, s, r->act, adt, r->gu, ffn, rows));
    }
    return gemm_of(g, s, adt, x, w->w_down, wdt, r->act, rows, dim, ffn, 0, x);
}

/* The order the forward's GEMM of m rows over rows x cols sums in on s's device (NULL: the op's, ppn_op_gemm_sums). */
static int fwd_sums(const ppn_model *m, ppn_gstream *s, int rows_m, int rows, int cols)
{
    if (s && m->map->door.fuse) return ppn_op_gemm_sums_on(m->rt->g, s, rows_m, rows, cols, m->wdt);
    return ppn_op_gemm_sums(rows_m, rows, cols, m->wdt);
}

/* fwd_sums for gate|up, by its path (gu_path): gemm_swiglu_w sums as the tiles, the split-K gemm_swiglu as the op's
 * gemm_tc_kw it takes the place of. */
static int fwd_sums_gu(const ppn_model *m, ppn_gstream *s, int rows_m)
{
    const int rows = 2 * m->cfg.ffn_dim, cols = m->cfg.dim;
    switch (s ? gu_path(m, s, rows_m) : GU_GEMM) {
    case GU_W: return PPN_GEMM_SUMS_TILE;
    case GU_SPLIT: return ppn_op_gemm_sums(rows_m, rows, cols, m->wdt);
    default: return fwd_sums(m, s, rows_m, rows, cols);
    }
}

/* The matrices ppn_fwd_rows_layer and the every-row head multiply a chunk's rows by (rows x cols each): where the
 * forward sums each in the same order at a rows as at b (on every device the model uses: ppn_op_gemm_sums_on, which
 * says where gemm_tc_w takes the shape, and for gate|up its path, fwd_sums_gu), the norms, rotary and attention
 * being per row, a prompt row gets the same bits in either chunk. */
int ppn_model_rows_same_bits(const ppn_model *m, int a, int b)
{
    if (!m || a < 1 || b < 1) return 0;
    const ppn_model_config *c = &m->cfg;
    const int mat[][2] = {{(c->n_heads + 2 * c->n_kv_heads) * c->head_dim, c->dim}, {c->dim, c->n_heads * c->head_dim},
                          {c->dim, c->ffn_dim}, {c->vocab, c->dim}}; /* and gate|up: fwd_sums_gu */
    int any = 0;
    for (int d = 0; d <= PPN_MAX_DEVICES; d++) {
        ppn_gstream *s = d < PPN_MAX_DEVICES ? m->dev_stream[d] : NULL;
        if (d < PPN_MAX_DEVICES && !s) continue;
        if (d == PPN_MAX_DEVICES && any) break; /* no stream yet: the op's orders */
        any = 1;
        for (size_t i = 0; i < sizeof mat / sizeof mat[0]; i++)
            if (fwd_sums(m, s, a, mat[i][0], mat[i][1]) != fwd_sums(m, s, b, mat[i][0], mat[i][1])) return 0;
        if (fwd_sums_gu(m, s, a) != fwd_sums_gu(m, s, b)) return 0;
    }
    return 1;
}

ppn_status ppn_fwd_rows_lall(ppn_model *m, ppn_rows_scratch *r)
{
    if (r->lall) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    size_t n = sizeof(float) * (size_t)r->rows * (size_t)m->cfg.vocab;
    PPN_CHECK(ppn_model_block_alloc(m, r->dev, n, "rows logits (every row)", &r->lall));
    ppn_gstream *ds;
    PPN_CHECK(ppn_model_dev_stream(m, r->dev, &ds));
    return g->ops->stream_sync(g, ds); /* the allocation is ordered on the device stream */
}

/* Every row's logits into r->lall [rows, vocab] (allocated on first use, on this stage's device). */
static ppn_status rows_head_all(ppn_model *m, ppn_gstream *s, ppn_rows_scratch *r, ppn_dptr x, int rows)
{
    PPN_CHECK(ppn_fwd_rows_lall(m, r));
    return norm_gemm(m, s, r, x, m->final_norm, r->lall, m->lm_head, m->cfg.vocab, 0, rows);
}

ppn_status ppn_fwd_rows_head_batch(ppn_model *m, ppn_gstream *s, ppn_rows_scratch *r, ppn_dptr x, int rows, int ids)
{
    PPN_CHECK(rows_head_all(m, s, r, x, rows));
    return ids ? ppn_op_argmax_rows(m->rt->g, s, r->ids, r->lall, m->cfg.vocab, rows) : PPN_OK;
}

ppn_status ppn_fwd_rows_head(ppn_model *m, ppn_gstream *s, ppn_rows_scratch *r, ppn_dptr x,
                             const ppn_rowseg *sg, int nseg, int rows)
{
    ppn_gpu *g = m->rt->g;
    size_t v = (size_t)m->cfg.vocab, dim = (size_t)m->cfg.dim;
    int any_all = 0;
    for (int i = 0; i < nseg; i++) any_all |= sg[i].out && sg[i].all_rows;
    if (any_all) PPN_CHECK(rows_head_all(m, s, r, x, rows));
    for (int i = 0; i < nseg; i++) {
        const ppn_rowseg *q = &sg[i];
        if (!q->out) continue;
        if (q->all_rows) {
            PPN_CHECK(g->ops->copy_dtoh(g, s, q->out, row_at(r->lall, q->r0, v), sizeof(float) * v * (size_t)q->n));
            continue;
        }
        /* the last row's logits by the decode head's kernels, as a decode step computes them */
        PPN_CHECK(norm_matvec(m, s, r->xb, r->lrow, m->lm_head, m->cfg.vocab, row_at(x, q->r0 + q->n - 1, dim),
                              m->final_norm, 0));
        PPN_CHECK(g->ops->copy_dtoh(g, s, q->out, r->lrow, sizeof(float) * v));
    }
    return PPN_OK;
}
