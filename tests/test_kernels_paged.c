/* test_kernels_paged.c - paged KV (kparams.h "KV caches", ops.h ppn_kv_view) and the batched decode ops.
 *
 * Paged: every KV op through a scrambled block table (blocks of 1, 16 and 64 positions, not in pool order, some
 * pool blocks held by nobody) gives the bits the identity layout holding the same values gives; its stores land
 * only in the sequence's blocks (the others keep their sentinel); its reads never touch another block (those
 * hold NaN, and the outputs stay bit-equal); and it declares exactly the held blocks (every byte of them, for
 * every KV head, in both pools, and not one byte more) plus the table as read. A table entry outside the pool is
 * refused by the ops and ignored by the kernels. A run on the sim backend goes through its checker.
 *
 * Batched decode (ppn_op_rope_kv_batch, ppn_op_attn_batch): against a double-precision reference written here for
 * f32, bf16 and f16 caches, head_dim 48, 64 and 128, GQA 1, 4 and 8, contexts crossing blocks; a row's bits do not
 * depend on the batch (the same row in batches of 1, 3 and 17), and equal the single-sequence op's. The
 * tensor-core form (ppn_op_attn_batch_tc): against that reference with its roundings and within their bound of the
 * exact attention, the caches only read, its refusals.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/base/dtype.h"
#include "core/base/err.h"
#include "kernels/ktable.h"
#include "kernels/ops.h"
#include "tests/util/tkern.h"
#include "tests/util/trand.h"

#define EXPECT_ST(want, call) assert_int_equal((call), (want))

static void *zmem(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void *dup_mem(const void *src, size_t bytes)
{
    void *p = zmem(bytes);
    memcpy(p, src, bytes);
    return p;
}

static void inv_freq_fill(float *inv, int hd)
{
    for (int i = 0; i < hd / 2; i++) inv[i] = (float)(1.0 / pow(10000.0, (2.0 * i) / hd));
}

/* ---------------------------------------------------------------------------------------------------------
 * A paged cache next to an identity one holding the same values */

typedef struct paged {
    int nkv, hd, L, n_tbl, n_blocks, kvdt, ctx, cap; /* ctx = n_tbl << L: the identity caches' positions */
    size_t es;
    unsigned char *k, *v;   /* the pools [nkv, cap, hd] */
    unsigned char *ik, *iv; /* the identity caches [nkv, ctx, hd] */
    int32_t *tbl;
    ppn_kv_view view, ident;
} paged;

/* NaN in the cache's dtype: what the blocks nobody holds are filled with. */
static void put_nan(unsigned char *p, int kvdt)
{
    if (kvdt == PPN_DTYPE_F32) {
        uint32_t u = 0x7fc00000u;
        memcpy(p, &u, 4);
    } else {
        uint16_t u = kvdt == PPN_DTYPE_BF16 ? 0x7fc0u : 0x7e00u;
        memcpy(p, &u, 2);
    }
}

static size_t pool_at(const paged *c, int g, int pos)
{
    int32_t pp = (c->tbl[pos >> c->L] << c->L) | (pos & ((1 << c->L) - 1));
    return (((size_t)g * (size_t)c->cap + (size_t)pp) * (size_t)c->hd) * c->es;
}

static size_t ident_at(const paged *c, int g, int pos)
{
    return (((size_t)g * (size_t)c->ctx + (size_t)pos) * (size_t)c->hd) * c->es;
}

/* 1 when pool block b is in the table */
static int held(const paged *c, int b)
{
    for (int i = 0; i < c->n_tbl; i++)
        if (c->tbl[i] == b) return 1;
    return 0;
}

/* Table entry b = (7 b + 3) mod n_blocks (n_blocks prime to 7 and > 7: not monotone), random values in the held
 * blocks (the same as the identity caches'), NaN in the others. */
static paged paged_new(int nkv, int hd, int L, int n_tbl, int n_blocks, int kvdt)
{
    paged c = {.nkv = nkv, .hd = hd, .L = L, .n_tbl = n_tbl, .n_blocks = n_blocks, .kvdt = kvdt};
    assert_true(n_blocks % 7 != 0 && n_tbl <= n_blocks);
    c.ctx = n_tbl << L, c.cap = n_blocks << L, c.es = ppn_dtype_size(kvdt);
    size_t pn = (size_t)nkv * c.cap * hd, in = (size_t)nkv * c.ctx * hd;
    c.k = zmem(pn * c.es), c.v = zmem(pn * c.es);
    for (size_t i = 0; i < pn; i++) put_nan(c.k + i * c.es, kvdt), put_nan(c.v + i * c.es, kvdt);
    c.tbl = zmem((size_t)n_tbl * 4);
    for (int b = 0; b < n_tbl; b++) c.tbl[b] = (int32_t)((7 * b + 3) % n_blocks);
    c.ik = tu_wrand(kvdt, in, NULL), c.iv = tu_wrand(kvdt, in, NULL);
    size_t row = (size_t)hd * c.es;
    for (int g = 0; g < nkv; g++)
        for (int p = 0; p < c.ctx; p++) {
            memcpy(c.k + pool_at(&c, g, p), c.ik + ident_at(&c, g, p), row);
            memcpy(c.v + pool_at(&c, g, p), c.iv + ident_at(&c, g, p), row);
        }
    c.view = (ppn_kv_view){.pool = {.k = D(c.k), .v = D(c.v), .cap = c.cap, .block_log2 = L, .kvdt = kvdt},
                           .tbl = D(c.tbl), .tbl_h = c.tbl, .n_tbl = n_tbl};
    c.ident = ppn_kv_view_identity(D(c.ik), D(c.iv), c.ctx, kvdt);
    return c;
}

static void paged_free(paged *c) { free(c->k), free(c->v), free(c->ik), free(c->iv), free(c->tbl); }

/* The pools hold the identity caches' bytes at every position through the table, and the blocks nobody holds
 * are untouched (NaN). */
static void paged_expect_same(const paged *c)
{
    size_t row = (size_t)c->hd * c->es;
    for (int g = 0; g < c->nkv; g++)
        for (int p = 0; p < c->ctx; p++) {
            assert_memory_equal(c->k + pool_at(c, g, p), c->ik + ident_at(c, g, p), row);
            assert_memory_equal(c->v + pool_at(c, g, p), c->iv + ident_at(c, g, p), row);
        }
    unsigned char nan[4];
    put_nan(nan, c->kvdt);
    size_t blk = row << c->L;
    for (int g = 0; g < c->nkv; g++)
        for (int b = 0; b < c->n_blocks; b++) {
            if (held(c, b)) continue;
            size_t at = ((size_t)g * c->cap * c->hd) * c->es + (size_t)b * blk;
            for (size_t i = 0; i < blk; i += c->es) {
                assert_memory_equal(c->k + at + i, nan, c->es);
                assert_memory_equal(c->v + at + i, nan, c->es);
            }
        }
}

/* The captured launch declares, in each pool, exactly the bytes of table blocks b0 .. b1 - 1 for every KV head
 * (each with a mode having mode's bits), and the table as read. */
static void expect_decl(const paged *c, int b0, int b1, int mode)
{
    size_t pbytes = (size_t)c->nkv * c->cap * c->hd * c->es, blk = ((size_t)c->hd * c->es) << c->L;
    unsigned char *want = zmem(pbytes), *got[2] = {zmem(pbytes), zmem(pbytes)};
    for (int g = 0; g < c->nkv; g++)
        for (int b = b0; b < b1; b++)
            memset(want + (size_t)g * c->cap * c->hd * c->es + (size_t)c->tbl[b] * blk, 1, blk);
    const unsigned char *pools[2] = {c->k, c->v};
    int tbl_read = 0;
    for (int i = 0; i < tu_cap.l.nacc + tu_cap.l.nxacc; i++) {
        const ppn_access *a = tu_acc(i);
        if (a->ptr == D(c->tbl) && a->bytes == (size_t)c->n_tbl * 4 && a->mode == PPN_ACC_R) tbl_read = 1;
        for (int k = 0; k < 2; k++) {
            ppn_dptr base = D(pools[k]);
            if (a->ptr + a->bytes <= base || a->ptr >= base + pbytes) continue;
            assert_true(a->ptr >= base && a->ptr + a->bytes <= base + pbytes); /* inside the pool */
            assert_int_equal(a->mode & mode, mode);
            size_t off = (size_t)(a->ptr - base);
            for (size_t j = 0; j < a->bytes; j++) {
                assert_int_equal(want[off + j], 1); /* never a byte of a block not in b0 .. b1 - 1 */
                got[k][off + j] = 1;
            }
        }
    }
    assert_true(tbl_read);
    assert_memory_equal(got[0], want, pbytes);
    assert_memory_equal(got[1], want, pbytes);
    free(want), free(got[0]), free(got[1]);
}

typedef struct pshape {
    int nq, nkv, hd, L, n_tbl, n_blocks, kvdt;
} pshape;

/* blocks of 1, 16 and 64 positions; every dtype; GQA 1, 2, 4 */
static const pshape PSHAPES[] = {
    {4, 2, 16, 0, 37, 45, PPN_DTYPE_F32},  {4, 1, 32, 4, 5, 9, PPN_DTYPE_BF16}, {8, 2, 64, 6, 3, 5, PPN_DTYPE_F16},
    {2, 2, 8, 4, 4, 6, PPN_DTYPE_F32},     {4, 4, 16, 0, 20, 23, PPN_DTYPE_BF16},
};

/* positions that start, end and straddle blocks */
static int positions(const paged *c, int *out)
{
    int bs = 1 << c->L, n = 0, cand[] = {0, bs - 1, bs, bs + 1, 2 * bs - 1, c->ctx / 2, c->ctx - bs, c->ctx - 1};
    for (size_t i = 0; i < TU_LEN(cand); i++)
        if (cand[i] >= 0 && cand[i] < c->ctx) out[n++] = cand[i];
    return n;
}

/* ---------------------------------------------------------------------------------------------------------
 * the decode ops */

static void test_paged_rope_kv(void **state)
{
    (void)state;
    for (size_t k = 0; k < TU_LEN(PSHAPES); k++) {
        const pshape *s = &PSHAPES[k];
        paged c = paged_new(s->nkv, s->hd, s->L, s->n_tbl, s->n_blocks, s->kvdt);
        float inv[64];
        inv_freq_fill(inv, s->hd);
        int pos[8], np = positions(&c, pos);
        for (int i = 0; i < np; i++) {
            size_t xn = (size_t)(s->nq + 2 * s->nkv) * s->hd;
            float *x = tu_frand(xn, -1, 1), *y = dup_mem(x, xn * 4);
            ppn_step_hdr hdr = {.pos = pos[i]};
            ppn_dptr vx = D(x + (size_t)(s->nq + s->nkv) * s->hd), vy = D(y + (size_t)(s->nq + s->nkv) * s->hd);
            EXPECT_ST(PPN_OK, ppn_op_rope_kv(&tu_fake, tu_fake_stream, D(x), s->nq, s->nkv, s->hd, D(inv), i & 1,
                                             D(&hdr), &c.ident, vx));
            EXPECT_ST(PPN_OK, ppn_op_rope_kv(&tu_fake, tu_fake_stream, D(y), s->nq, s->nkv, s->hd, D(inv), i & 1,
                                             D(&hdr), &c.view, vy));
            expect_decl(&c, 0, c.n_tbl, PPN_ACC_W); /* hdr->pos is on the device: every held block */
            assert_memory_equal(x, y, xn * 4);
            paged_expect_same(&c);
            free(x), free(y);
        }
        paged_free(&c);
    }
}

static void test_paged_attn(void **state)
{
    (void)state;
    for (size_t k = 0; k < TU_LEN(PSHAPES); k++) {
        const pshape *s = &PSHAPES[k];
        paged c = paged_new(s->nkv, s->hd, s->L, s->n_tbl, s->n_blocks, s->kvdt);
        float inv[64];
        inv_freq_fill(inv, s->hd);
        int pos[8], np = positions(&c, pos), ns = 3;
        size_t qn = (size_t)(s->nq + 2 * s->nkv) * s->hd, on = (size_t)s->nq * s->hd;
        unsigned char *part = zmem(ppn_op_attn_scratch_bytes(s->nq, ns, s->hd));
        for (int i = 0; i < np; i++) {
            float *q = tu_frand(qn, -1, 1), *o1 = zmem(on * 4), *o2 = zmem(on * 4);
            ppn_step_hdr hdr = {.pos = pos[i]};
            EXPECT_ST(PPN_OK, ppn_op_attn(&tu_fake, tu_fake_stream, D(o1), D(q), &c.ident, s->nq, s->nkv, s->hd, 0.3f,
                                          D(&hdr), D(part), ns));
            EXPECT_ST(PPN_OK, ppn_op_attn(&tu_fake, tu_fake_stream, D(o2), D(q), &c.view, s->nq, s->nkv, s->hd, 0.3f,
                                          D(&hdr), D(part), ns));
            expect_decl(&c, 0, c.n_tbl, PPN_ACC_R);
            assert_memory_equal(o1, o2, on * 4); /* and no NaN from a block the table does not hold */
            for (size_t j = 0; j < on; j++) assert_false(isnan(o2[j]));
            /* the fused rotary: the same output and the same stored row */
            if (ppn_op_attn_rope_fits(s->hd, i & 1)) {
                EXPECT_ST(PPN_OK, ppn_op_attn_rope(&tu_fake, tu_fake_stream, D(o1), D(q), &c.ident, s->nq, s->nkv,
                                                   s->hd, 0.3f, D(&hdr), D(part), ns, D(inv), i & 1));
                EXPECT_ST(PPN_OK, ppn_op_attn_rope(&tu_fake, tu_fake_stream, D(o2), D(q), &c.view, s->nq, s->nkv,
                                                   s->hd, 0.3f, D(&hdr), D(part), ns, D(inv), i & 1));
                expect_decl(&c, 0, c.n_tbl, PPN_ACC_RW);
                assert_memory_equal(o1, o2, on * 4);
                paged_expect_same(&c);
            }
            free(q), free(o1), free(o2);
        }
        free(part);
        paged_free(&c);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * the rows ops: chunks that start, end and cross blocks */

static void test_paged_rows(void **state)
{
    (void)state;
    for (size_t k = 0; k < TU_LEN(PSHAPES); k++) {
        const pshape *s = &PSHAPES[k];
        paged c = paged_new(s->nkv, s->hd, s->L, s->n_tbl, s->n_blocks, s->kvdt);
        float inv[64];
        inv_freq_fill(inv, s->hd);
        int bs = 1 << s->L;
        int spans[][2] = {{0, 1}, {0, c.ctx}, {bs - 1, 2}, {bs, bs}, {c.ctx - bs - 1, bs + 1}, {1, c.ctx - 1}};
        size_t row = (size_t)(s->nq + 2 * s->nkv) * s->hd;
        for (size_t i = 0; i < TU_LEN(spans); i++) {
            int pos0 = spans[i][0], n = spans[i][1];
            if (pos0 < 0 || n < 1 || pos0 + n > c.ctx) continue;
            float *x = tu_frand((size_t)n * row, -1, 1), *y = dup_mem(x, (size_t)n * row * 4);
            float *o1 = zmem((size_t)n * s->nq * s->hd * 4), *o2 = zmem((size_t)n * s->nq * s->hd * 4);
            int lo = pos0 >> s->L, hi = ((pos0 + n - 1) >> s->L) + 1;
            EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(x), s->nq, s->nkv, s->hd, D(inv), 0,
                                                  &c.ident, pos0, n));
            EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(y), s->nq, s->nkv, s->hd, D(inv), 0,
                                                  &c.view, pos0, n));
            expect_decl(&c, lo, hi, PPN_ACC_W); /* the blocks of the chunk's positions */
            assert_memory_equal(x, y, (size_t)n * row * 4);
            paged_expect_same(&c);
            EXPECT_ST(PPN_OK, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(o1), D(x), &c.ident, s->nq, s->nkv, s->hd,
                                               0.25f, pos0, n));
            EXPECT_ST(PPN_OK, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(o2), D(y), &c.view, s->nq, s->nkv, s->hd,
                                               0.25f, pos0, n));
            expect_decl(&c, 0, hi, PPN_ACC_R); /* positions 0 .. pos0 + n - 1 */
            assert_memory_equal(o1, o2, (size_t)n * s->nq * s->hd * 4);
            free(x), free(y), free(o1), free(o2);
        }
        paged_free(&c);
    }
}

/* Coalescing: a table of consecutive pool blocks declares one range per KV head and pool. */
static void test_paged_decl_coalesced(void **state)
{
    (void)state;
    const int nkv = 3, hd = 8, L = 2, nb = 10;
    float *k = zmem((size_t)nkv * (nb << L) * hd * 4), *v = zmem((size_t)nkv * (nb << L) * hd * 4);
    int32_t tbl[4] = {5, 6, 7, 2}; /* 5..7 meet; 2 stands alone */
    ppn_kv_view w = {.pool = {.k = D(k), .v = D(v), .cap = nb << L, .block_log2 = L, .kvdt = PPN_DTYPE_F32},
                     .tbl = D(tbl), .tbl_h = tbl, .n_tbl = 4};
    float *x = zmem((size_t)16 * (1 + 2 * nkv) * hd * 4), inv[4]; /* 16 rows of 1 q head, nkv k and v heads */
    inv_freq_fill(inv, hd);
    EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(x), 1, nkv, hd, D(inv), 0, &w, 0, 16));
    assert_int_equal(tu_cap.l.nxacc, 2 * nkv * 2 + 1); /* per pool and head: [5, 8) and [2, 3); the table */
    size_t blk = (size_t)hd * 4 << L, head = (size_t)(nb << L) * hd * 4;
    for (int g = 0; g < nkv; g++) {
        assert_true(tu_declared((char *)k + g * head + 5 * blk, 3 * blk, PPN_ACC_W));
        assert_false(tu_declared((char *)k + g * head + 4 * blk, 4 * blk, PPN_ACC_W));
        assert_true(tu_declared((char *)v + g * head + 2 * blk, blk, PPN_ACC_W));
    }
    free(k), free(v), free(x);
}

/* ---------------------------------------------------------------------------------------------------------
 * guards and refusals */

static void test_paged_guard(void **state)
{
    (void)state;
    paged c = paged_new(2, 8, 2, 3, 5, PPN_DTYPE_F32);
    size_t pb = (size_t)c.nkv * c.cap * c.hd * 4;
    unsigned char *k0 = dup_mem(c.k, pb), *v0 = dup_mem(c.v, pb);
    float inv[4], x[(2 + 2 * 2) * 8], out[2 * 8];
    inv_freq_fill(inv, 8);
    for (int i = 0; i < (int)TU_LEN(x); i++) x[i] = (float)i;
    int32_t saved = c.tbl[1];
    c.tbl[1] = c.n_blocks; /* outside the pool: the kernels store nothing and read zeros through it */
    ppn_step_hdr hdr = {.pos = 5};
    ppn_kp_rope r = {.x = D(x), .inv_freq = D(inv), .hdr = D(&hdr), .kc = D(c.k), .vc = D(c.v),
                     .v = D(x + 4 * 8), .tbl = D(c.tbl), .n_heads = 4, .head_dim = 8, .n_kv = 2, .cap = c.cap,
                     .block_log2 = 2};
    tu_kernel_run(PPN_K_ROPE, &r);
    assert_memory_equal(c.k, k0, pb);
    assert_memory_equal(c.v, v0, pb);
    c.tbl[1] = -1;
    tu_kernel_run(PPN_K_ROPE, &r);
    assert_memory_equal(c.k, k0, pb);
    ppn_kp_attn a = {.out = D(out), .q = D(x), .kc = D(c.k), .vc = D(c.v), .hdr = D(&hdr), .tbl = D(c.tbl),
                     .n_heads = 2, .n_kv = 2, .head_dim = 8, .cap = c.cap, .n_split = 1, .block_log2 = 2,
                     .scale = 0.5f};
    tu_kernel_run(PPN_K_ATTN, &a); /* positions 4 .. 5 read as zeros: finite */
    for (int i = 0; i < 16; i++) assert_false(isnan(out[i]));
    /* the ops refuse such a table, and positions past the held blocks */
    EXPECT_ST(PPN_EINVAL, ppn_op_rope_kv(&tu_fake, tu_fake_stream, D(x), 2, 2, 8, D(inv), 0, D(&hdr), &c.view,
                                         D(x + 32)));
    assert_non_null(strstr(ppn_last_error(), "table entry 1"));
    c.tbl[1] = saved;
    EXPECT_ST(PPN_EINVAL, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(x), 2, 2, 8, D(inv), 0, &c.view, 11, 2));
    assert_non_null(strstr(ppn_last_error(), "block table"));
    EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(x), 2, 2, 8, D(inv), 0, &c.view, 11, 1));
    ppn_kv_view w = c.view;
    w.n_tbl = 6; /* more blocks than the pool has */
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(out), D(x), &w, 2, 2, 8, 0.5f, 0, 1));
    w = c.view, w.tbl_h = NULL;
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(out), D(x), &w, 2, 2, 8, 0.5f, 0, 1));
    w = c.view, w.pool.block_log2 = 13;
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(out), D(x), &w, 2, 2, 8, 0.5f, 0, 1));
    w = c.view, w.pool.cap = c.cap - 1; /* not whole blocks */
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(out), D(x), &w, 2, 2, 8, 0.5f, 0, 1));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn(&tu_fake, tu_fake_stream, D(out), D(x), NULL, 2, 2, 8, 0.5f, D(&hdr), D(out), 1));
    free(k0), free(v0);
    paged_free(&c);
}

/* ---------------------------------------------------------------------------------------------------------
 * on the sim backend: the declarations pass its checker, and the results are the fake device's */

static ppn_dptr sim_buf(ppn_gpu *g, ppn_gstream *s, const void *h, size_t n)
{
    ppn_dptr p = 0;
    EXPECT_ST(PPN_OK, g->ops->mem_alloc(g, 0, n, &p));
    EXPECT_ST(PPN_OK, g->ops->copy_htod(g, s, p, h, n));
    return p;
}

static void test_paged_sim(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    ppn_gstream *s = NULL;
    EXPECT_ST(PPN_OK, ppn_gpu_open("sim", ppn_kernel_set(), &g));
    EXPECT_ST(PPN_OK, g->ops->stream_create(g, 0, &s));
    const int nq = 4, nkv = 2, hd = 16, n = 9;
    paged c = paged_new(nkv, hd, 2, 4, 6, PPN_DTYPE_BF16);
    size_t row = (size_t)(nq + 2 * nkv) * hd, pb = (size_t)nkv * c.cap * hd * 2, ob = (size_t)n * nq * hd * 4;
    float inv[8], *x = tu_frand((size_t)n * row, -1, 1), *y = dup_mem(x, (size_t)n * row * 4);
    float *o = zmem(ob), *go = zmem(ob);
    inv_freq_fill(inv, hd);
    unsigned char *gk = zmem(pb), *gv = zmem(pb);
    ppn_dptr dk = sim_buf(g, s, c.k, pb), dv = sim_buf(g, s, c.v, pb), dt = sim_buf(g, s, c.tbl, 16);
    ppn_dptr dx = sim_buf(g, s, x, (size_t)n * row * 4), dinv = sim_buf(g, s, inv, sizeof inv);
    ppn_dptr dout = sim_buf(g, s, o, ob);
    ppn_kv_view w = c.view;
    w.pool.k = dk, w.pool.v = dv, w.tbl = dt;
    EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(g, s, dx, nq, nkv, hd, dinv, 0, &w, 3, n));
    EXPECT_ST(PPN_OK, ppn_op_attn_rows(g, s, dout, dx, &w, nq, nkv, hd, 0.25f, 3, n));
    EXPECT_ST(PPN_OK, g->ops->copy_dtoh(g, s, go, dout, ob));
    EXPECT_ST(PPN_OK, g->ops->copy_dtoh(g, s, gk, dk, pb));
    EXPECT_ST(PPN_OK, g->ops->copy_dtoh(g, s, gv, dv, pb));
    EXPECT_ST(PPN_OK, g->ops->stream_sync(g, s)); /* the checker's verdict */
    EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(y), nq, nkv, hd, D(inv), 0, &c.view, 3, n));
    EXPECT_ST(PPN_OK, ppn_op_attn_rows(&tu_fake, tu_fake_stream, D(o), D(y), &c.view, nq, nkv, hd, 0.25f, 3, n));
    assert_memory_equal(go, o, ob);
    assert_memory_equal(gk, c.k, pb);
    assert_memory_equal(gv, c.v, pb);
    EXPECT_ST(PPN_OK, g->ops->stream_destroy(g, s));
    ppn_gpu_close(g);
    free(x), free(y), free(o), free(go), free(gk), free(gv);
    paged_free(&c);
}

/* ---------------------------------------------------------------------------------------------------------
 * batched decode */

/* B sequences in one pool: sequence i holds blocks tbl[i] (scrambled, disjoint), n_tbl[i] of them, and attends
 * at pos[i]. */
typedef struct batch {
    int B, nq, nkv, hd, L, kvdt, cap;
    size_t es;
    unsigned char *k, *v;
    ppn_kseg *segs;
    int32_t **tbl;
    int *n_tbl;
    const int32_t **tbl_c;
} batch;

static batch batch_new(int B, int nq, int nkv, int hd, int L, int kvdt, const int *npos)
{
    batch b = {.B = B, .nq = nq, .nkv = nkv, .hd = hd, .L = L, .kvdt = kvdt, .es = ppn_dtype_size(kvdt)};
    int total = 0, bs = 1 << L;
    b.n_tbl = zmem((size_t)B * sizeof(int)), b.tbl = zmem((size_t)B * sizeof(int32_t *));
    b.tbl_c = zmem((size_t)B * sizeof(int32_t *)), b.segs = zmem((size_t)B * sizeof(ppn_kseg));
    for (int i = 0; i < B; i++) b.n_tbl[i] = (npos[i] + bs - 1) / bs, total += b.n_tbl[i];
    int nb = total + 2;
    while (nb % 7 == 0) nb++;
    b.cap = nb << L;
    size_t pn = (size_t)nkv * b.cap * hd;
    b.k = tu_wrand(kvdt, pn, NULL), b.v = tu_wrand(kvdt, pn, NULL);
    int next = 0;
    for (int i = 0; i < B; i++) {
        b.tbl[i] = zmem((size_t)b.n_tbl[i] * 4);
        for (int j = 0; j < b.n_tbl[i]; j++) b.tbl[i][j] = (int32_t)((7 * (next++) + 3) % nb);
        b.tbl_c[i] = b.tbl[i];
        b.segs[i] = (ppn_kseg){.pos = npos[i] - 1, .tbl = D(b.tbl[i])};
    }
    return b;
}

static void batch_free(batch *b)
{
    for (int i = 0; i < b->B; i++) free(b->tbl[i]);
    free(b->tbl), free(b->tbl_c), free(b->n_tbl), free(b->segs), free(b->k), free(b->v);
}

static int batch_holds(const batch *b, int blk)
{
    for (int i = 0; i < b->B; i++)
        for (int j = 0; j < b->n_tbl[i]; j++)
            if (b->tbl[i][j] == blk) return 1;
    return 0;
}

static ppn_kv_pool batch_pool(const batch *b)
{
    return (ppn_kv_pool){.k = D(b->k), .v = D(b->v), .cap = b->cap, .block_log2 = b->L, .kvdt = b->kvdt};
}

static double bf16_of(double x) { return ppn_bf16_to_f32(ppn_f32_to_bf16((float)x)); }

/* The double-precision attention of row i: softmax(q . K * scale) V over positions 0 .. pos through its table.
 * tc: the tensor-core form's roundings too (q to bf16; each weight to bf16 where it multiplies v, the sum it is
 * divided by unrounded): got is within a few f32 ulps of that, and within the roundings' bound of the exact
 * attention (2^-8 of the magnitude for the weights, and the scores' change from q's rounding, d, moving each
 * weight by at most a factor e^(2d)). */
static void batch_expect(const batch *b, int i, const float *q, float scale, const float *got, int tc)
{
    int pos = b->segs[i].pos, hd = b->hd, group = b->nq / b->nkv;
    double *s = malloc(sizeof(double) * (size_t)(pos + 1)), *x = malloc(sizeof(double) * (size_t)(pos + 1));
    assert_non_null(s);
    assert_non_null(x);
    for (int h = 0; h < b->nq; h++) {
        int g = h / group;
        double mx = -INFINITY, xmx = -INFINITY, den = 0.0, xden = 0.0, dq = 0.0;
        for (int t = 0; t <= pos; t++) {
            int32_t pp = (b->tbl[i][t >> b->L] << b->L) | (t & ((1 << b->L) - 1));
            size_t at = ((size_t)g * b->cap + (size_t)pp) * hd;
            double d = 0.0, dx = 0.0, dd = 0.0;
            for (int e = 0; e < hd; e++) {
                double qe = q[h * hd + e], k = tu_wval(b->k, b->kvdt, at + (size_t)e), qr = tc ? bf16_of(qe) : qe;
                d += qr * k, dx += qe * k, dd += fabs(qe - qr) * fabs(k);
            }
            s[t] = d * scale, x[t] = dx * scale;
            if (dd * scale > dq) dq = dd * scale;
            if (s[t] > mx) mx = s[t];
            if (x[t] > xmx) xmx = x[t];
        }
        for (int t = 0; t <= pos; t++) s[t] = exp(s[t] - mx), den += s[t], x[t] = exp(x[t] - xmx), xden += x[t];
        for (int e = 0; e < hd; e++) {
            double num = 0.0, mag = 0.0, xnum = 0.0;
            for (int t = 0; t <= pos; t++) {
                int32_t pp = (b->tbl[i][t >> b->L] << b->L) | (t & ((1 << b->L) - 1));
                double v = tu_wval(b->v, b->kvdt, ((size_t)g * b->cap + (size_t)pp) * hd + (size_t)e);
                num += (tc ? bf16_of(s[t]) : s[t]) * v, mag += s[t] * fabs(v), xnum += x[t] * v;
            }
            /* the reference sums in double and rounds once: a few f32 ulps of the magnitude */
            tu_check_close(got[h * hd + e], num / den, 1e-6 * (mag / den) + 1e-30, "attn_batch", (size_t)e);
            if (tc)
                tu_check_close(got[h * hd + e], xnum / xden, (mag / den) * (1.0 / 256 + expm1(4 * dq)) + 1e-30,
                               "attn_batch_tc against the exact attention", (size_t)e);
        }
    }
    free(s), free(x);
}

static void test_batch_attn_reference(void **state)
{
    (void)state;
    static const int dts[] = {PPN_DTYPE_F32, PPN_DTYPE_BF16, PPN_DTYPE_F16};
    static const int hds[] = {48, 64, 128};
    static const int groups[] = {1, 4, 8};
    static const int npos[] = {1, 17, 64, 65, 130, 3};
    for (size_t d = 0; d < TU_LEN(dts); d++)
        for (size_t h = 0; h < TU_LEN(hds); h++)
            for (size_t gi = 0; gi < TU_LEN(groups); gi++) {
                const int nkv = 2, nq = nkv * groups[gi], hd = hds[h], B = (int)TU_LEN(npos), L = (int)(d + h) % 2 ? 4 : 0;
                batch b = batch_new(B, nq, nkv, hd, L, dts[d], npos);
                size_t row = (size_t)(nq + 2 * nkv) * hd, on = (size_t)nq * hd;
                float *qkv = tu_frand((size_t)B * row, -1, 1), *out = zmem((size_t)B * on * 4);
                int ns = 4;
                unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(B, nq, ns, hd));
                ppn_kv_pool pool = batch_pool(&b);
                float scale = 1.0f / sqrtf((float)hd);
                EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(out), D(qkv), nq, nkv, hd, scale,
                                                    &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part), ns));
                assert_int_equal(tu_cap.l.grid[0], nkv);
                assert_int_equal(tu_cap.l.grid[1], ns);
                assert_int_equal(tu_cap.l.grid[2], B);
                for (int i = 0; i < B; i++) batch_expect(&b, i, qkv + (size_t)i * row, scale, out + (size_t)i * on, 0);
                free(qkv), free(out), free(part);
                batch_free(&b);
            }
}

/* Row r of a batch of 17 computed alone, in a batch of 3 and of 17 (at different row indices, beside other
 * rows): the same bits, the single-sequence ppn_op_attn's on its view. */
static void test_batch_attn_invariance(void **state)
{
    (void)state;
    const int nq = 8, nkv = 2, hd = 64, L = 4, B = 17, ns = 5;
    int npos[17];
    for (int i = 0; i < B; i++) npos[i] = 1 + (i * 37) % 150;
    batch b = batch_new(B, nq, nkv, hd, L, PPN_DTYPE_BF16, npos);
    size_t row = (size_t)(nq + 2 * nkv) * hd, on = (size_t)nq * hd;
    float *qkv = tu_frand((size_t)B * row, -1, 1), *all = zmem((size_t)B * on * 4), *few = zmem(3 * on * 4);
    unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(B, nq, ns, hd));
    ppn_kv_pool pool = batch_pool(&b);
    EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(all), D(qkv), nq, nkv, hd, 0.125f, &pool, D(b.segs),
                                        b.segs, b.tbl_c, b.n_tbl, B, D(part), ns));
    for (int r = 0; r < B; r++) {
        /* alone */
        float *one = zmem(on * 4);
        EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(one), D(qkv + (size_t)r * row), nq, nkv, hd,
                                            0.125f, &pool, D(&b.segs[r]), &b.segs[r], &b.tbl_c[r], &b.n_tbl[r], 1,
                                            D(part), ns));
        assert_memory_equal(one, all + (size_t)r * on, on * 4);
        /* in the middle of three: rows r - 1, r, r + 1 (mod B) */
        float *q3 = zmem(3 * row * 4);
        ppn_kseg s3[3];
        const int32_t *t3[3];
        int n3[3];
        for (int j = 0; j < 3; j++) {
            int src = (r + B - 1 + j) % B;
            memcpy(q3 + (size_t)j * row, qkv + (size_t)src * row, row * 4);
            s3[j] = b.segs[src], t3[j] = b.tbl_c[src], n3[j] = b.n_tbl[src];
        }
        EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(few), D(q3), nq, nkv, hd, 0.125f, &pool, D(s3),
                                            s3, t3, n3, 3, D(part), ns));
        assert_memory_equal(few + on, all + (size_t)r * on, on * 4);
        /* the single-sequence op */
        ppn_kv_view w = {.pool = pool, .tbl = b.segs[r].tbl, .tbl_h = b.tbl[r], .n_tbl = b.n_tbl[r]};
        ppn_step_hdr hdr = {.pos = b.segs[r].pos};
        EXPECT_ST(PPN_OK, ppn_op_attn(&tu_fake, tu_fake_stream, D(one), D(qkv + (size_t)r * row), &w, nq, nkv, hd,
                                      0.125f, D(&hdr), D(part), ns));
        assert_memory_equal(one, all + (size_t)r * on, on * 4);
        free(one), free(q3);
    }
    free(qkv), free(all), free(few), free(part);
    batch_free(&b);
}

/* rope_kv_batch: row i is rope_kv_rows's row at its position through its table (same bits, same stores). The
 * declarations: every held block of every row, the tables and segs. */
static void test_batch_rope_kv(void **state)
{
    (void)state;
    static const int dts[] = {PPN_DTYPE_F32, PPN_DTYPE_BF16, PPN_DTYPE_F16};
    for (size_t d = 0; d < TU_LEN(dts); d++) {
        const int nq = 4, nkv = 2, hd = 32, L = (int)d * 2, B = 5;
        int npos[5] = {1, 9, 33, 4, 70};
        batch b = batch_new(B, nq, nkv, hd, L, dts[d], npos);
        size_t row = (size_t)(nq + 2 * nkv) * hd, pb = (size_t)nkv * b.cap * hd * b.es;
        float inv[16], *x = tu_frand((size_t)B * row, -1, 1), *y = dup_mem(x, (size_t)B * row * 4);
        inv_freq_fill(inv, hd);
        unsigned char *k2 = dup_mem(b.k, pb), *v2 = dup_mem(b.v, pb);
        ppn_kv_pool pool = batch_pool(&b);
        EXPECT_ST(PPN_OK, ppn_op_rope_kv_batch(&tu_fake, tu_fake_stream, D(x), nq, nkv, hd, D(inv), 1, &pool, D(b.segs),
                                               b.segs, b.tbl_c, b.n_tbl, B));
        assert_int_equal(tu_cap.l.grid[0], B);
        assert_true(tu_declared(b.segs, (size_t)B * sizeof(ppn_kseg), PPN_ACC_R));
        size_t blk = ((size_t)hd * b.es) << L;
        for (int i = 0; i < B; i++) {
            assert_true(tu_declared(b.tbl[i], (size_t)b.n_tbl[i] * 4, PPN_ACC_R));
            for (int g = 0; g < nkv; g++)
                for (int j = 0; j < b.n_tbl[i]; j++) {
                    size_t at = (size_t)g * b.cap * hd * b.es + (size_t)b.tbl[i][j] * blk;
                    assert_true(tu_declared(b.k + at, blk, PPN_ACC_W) && tu_declared(b.v + at, blk, PPN_ACC_W));
                }
        }
        int spare = 0; /* a block no row holds: not declared */
        while (batch_holds(&b, spare)) spare++;
        assert_true(spare < (b.cap >> L));
        assert_false(tu_declared(b.k + (size_t)spare * blk, blk, PPN_ACC_W));
        /* the same rows, one chunk of one row each, into the copy of the pools */
        ppn_kv_pool p2 = pool;
        p2.k = D(k2), p2.v = D(v2);
        for (int i = 0; i < B; i++) {
            ppn_kv_view w = {.pool = p2, .tbl = b.segs[i].tbl, .tbl_h = b.tbl[i], .n_tbl = b.n_tbl[i]};
            EXPECT_ST(PPN_OK, ppn_op_rope_kv_rows(&tu_fake, tu_fake_stream, D(y + (size_t)i * row), nq, nkv, hd, D(inv),
                                                  1, &w, b.segs[i].pos, 1));
        }
        assert_memory_equal(x, y, (size_t)B * row * 4);
        assert_memory_equal(b.k, k2, pb);
        assert_memory_equal(b.v, v2, pb);
        free(x), free(y), free(k2), free(v2);
        batch_free(&b);
    }
}

/* attn_rope_batch: the bits of rope_kv_batch then attn_batch (out and both pools), with q|k|v only read; the
 * declarations: all of q|k|v and inv_freq read, every held block of every row read and written. Rotated halves and
 * interleaved pairs, three cache dtypes, identity and paged rows, one and several position splits. */
static void test_batch_attn_rope(void **state)
{
    (void)state;
    static const int dts[] = {PPN_DTYPE_F32, PPN_DTYPE_BF16, PPN_DTYPE_F16};
    for (size_t d = 0; d < TU_LEN(dts); d++)
        for (int il = 0; il < 2; il++) {
            const int nq = 8, nkv = 2, hd = il ? 48 : 64, L = (int)d * 2, B = 5, ns = 1 + 3 * il;
            int npos[5] = {1, 9, 33, 4, 70};
            batch b = batch_new(B, nq, nkv, hd, L, dts[d], npos);
            size_t row = (size_t)(nq + 2 * nkv) * hd, on = (size_t)nq * hd, pb = (size_t)nkv * b.cap * hd * b.es;
            size_t partb = ppn_op_attn_batch_scratch_bytes(B, nq, ns, hd);
            float inv[32], *x = tu_frand((size_t)B * row, -1, 1), *y = dup_mem(x, (size_t)B * row * 4);
            float *o1 = zmem((size_t)B * on * 4), *o2 = zmem((size_t)B * on * 4), scale = 1.0f / sqrtf((float)hd);
            unsigned char *k2 = dup_mem(b.k, pb), *v2 = dup_mem(b.v, pb), *part = zmem(partb);
            inv_freq_fill(inv, hd);
            ppn_kv_pool pool = batch_pool(&b), p2 = pool;
            p2.k = D(k2), p2.v = D(v2);
            EXPECT_ST(PPN_OK, ppn_op_attn_rope_batch(&tu_fake, tu_fake_stream, D(o1), D(x), nq, nkv, hd, scale, &pool,
                                                     D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part), ns, D(inv), il));
            assert_int_equal(tu_cap.l.grid[0], nkv);
            assert_int_equal(tu_cap.l.grid[1], ns);
            assert_int_equal(tu_cap.l.grid[2], B);
            assert_true(tu_declared(x, (size_t)B * row * 4, PPN_ACC_R));
            assert_false(tu_declared(x, (size_t)B * row * 4, PPN_ACC_W));
            assert_true(tu_declared(inv, (size_t)hd / 2 * 4, PPN_ACC_R));
            size_t blk = ((size_t)hd * b.es) << L;
            for (int i = 0; i < B; i++)
                for (int g = 0; g < nkv; g++)
                    for (int j = 0; j < b.n_tbl[i]; j++) {
                        size_t at = (size_t)g * b.cap * hd * b.es + (size_t)b.tbl[i][j] * blk;
                        assert_true(tu_declared(b.k + at, blk, PPN_ACC_RW) && tu_declared(b.v + at, blk, PPN_ACC_RW));
                    }
            /* the two launches on copies */
            EXPECT_ST(PPN_OK, ppn_op_rope_kv_batch(&tu_fake, tu_fake_stream, D(y), nq, nkv, hd, D(inv), il, &p2,
                                                   D(b.segs), b.segs, b.tbl_c, b.n_tbl, B));
            EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(o2), D(y), nq, nkv, hd, scale, &p2,
                                                D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part), ns));
            assert_memory_equal(o1, o2, (size_t)B * on * 4);
            assert_memory_equal(b.k, k2, pb);
            assert_memory_equal(b.v, v2, pb);
            assert_memory_not_equal(x, y, (size_t)B * row * 4); /* rope_kv_batch rotated its copy in place */
            free(x), free(y), free(o1), free(o2), free(k2), free(v2), free(part);
            batch_free(&b);
        }
    /* refused: no inv_freq; a head_dim the fused rotary does not take (rotated halves of 48) */
    int npos[2] = {5, 20};
    batch b = batch_new(2, 4, 2, 48, 2, PPN_DTYPE_F32, npos);
    ppn_kv_pool pool = batch_pool(&b);
    float *x = zmem(2 * 8 * 48 * 4), *out = zmem(2 * 4 * 48 * 4), inv[24];
    unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(2, 4, 1, 48));
    inv_freq_fill(inv, 48);
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_rope_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 48, 0.25f, &pool,
                                                 D(b.segs), b.segs, b.tbl_c, b.n_tbl, 2, D(part), 1, 0, 0));
    assert_non_null(strstr(ppn_last_error(), "inv_freq"));
    EXPECT_ST(PPN_EUNSUPPORTED, ppn_op_attn_rope_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 48, 0.25f, &pool,
                                                       D(b.segs), b.segs, b.tbl_c, b.n_tbl, 2, D(part), 1, D(inv), 0));
    assert_non_null(strstr(ppn_last_error(), "head_dim 48"));
    free(x), free(out), free(part);
    batch_free(&b);
}

/* attn_batch_to / attn_rope_batch_to with a bf16 out (the o projection's x for gemm_tc_kw16): row i's element k is
 * the f32 op's rounded to nearest even at k's block + PPN_X16_POS(k % 64), out declared written for its 2-byte
 * elements only; q|k|v and the pools as the f32 ops leave them. Paged rows, one and several splits, bf16 caches. */
static void test_batch_attn_bf16_out(void **state)
{
    (void)state;
    for (int rope = 0; rope < 2; rope++)
        for (int ns = 1; ns <= 4; ns += 3) {
            const int nq = 8, nkv = 2, hd = 64, L = 2, B = 5;
            int npos[5] = {1, 9, 33, 4, 70};
            batch b = batch_new(B, nq, nkv, hd, L, PPN_DTYPE_BF16, npos);
            size_t row = (size_t)(nq + 2 * nkv) * hd, on = (size_t)nq * hd, pb = (size_t)nkv * b.cap * hd * b.es;
            size_t partb = ppn_op_attn_batch_scratch_bytes(B, nq, ns, hd);
            float inv[32], *x = tu_frand((size_t)B * row, -1, 1), *y = dup_mem(x, (size_t)B * row * 4);
            float *o32 = zmem((size_t)B * on * 4), scale = 1.0f / sqrtf((float)hd);
            uint16_t *o16 = zmem((size_t)B * on * 2 + 64);
            unsigned char *k2 = dup_mem(b.k, pb), *v2 = dup_mem(b.v, pb), *part = zmem(partb);
            inv_freq_fill(inv, hd);
            ppn_kv_pool pool = batch_pool(&b), p2 = pool;
            p2.k = D(k2), p2.v = D(v2);
            ppn_dptr iv = rope ? D(inv) : 0;
            if (rope) {
                EXPECT_ST(PPN_OK, ppn_op_attn_rope_batch(&tu_fake, tu_fake_stream, D(o32), D(x), nq, nkv, hd, scale,
                                                         &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part), ns,
                                                         iv, 0));
                EXPECT_ST(PPN_OK, ppn_op_attn_rope_batch_to(&tu_fake, tu_fake_stream, D(o16), PPN_DTYPE_BF16, D(y), nq,
                                                            nkv, hd, scale, &p2, D(b.segs), b.segs, b.tbl_c, b.n_tbl,
                                                            B, D(part), ns, iv, 0));
            } else {
                EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(o32), D(x), nq, nkv, hd, scale, &pool,
                                                    D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part), ns));
                EXPECT_ST(PPN_OK, ppn_op_attn_batch_to(&tu_fake, tu_fake_stream, D(o16), PPN_DTYPE_BF16, D(y), nq, nkv,
                                                       hd, scale, &p2, D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part),
                                                       ns));
            }
            assert_true(tu_declared(o16, (size_t)B * on * 2, PPN_ACC_W));
            assert_false(tu_declared(o16, (size_t)B * on * 2 + 2, PPN_ACC_W));
            for (size_t k = 0; k < (size_t)B * on; k++) {
                size_t at = k - k % 64 + (size_t)PPN_X16_POS((int)(k % 64));
                if (o16[at] != ppn_f32_to_bf16(o32[k]))
                    fail_msg("rope %d, %d splits: element %zu: 0x%04x, want 0x%04x (of %g)", rope, ns, k, o16[at],
                             ppn_f32_to_bf16(o32[k]), (double)o32[k]);
            }
            for (size_t k = (size_t)B * on; k < (size_t)B * on + 32; k++) assert_int_equal(o16[k], 0);
            assert_memory_equal(x, y, (size_t)B * row * 4);
            assert_memory_equal(b.k, k2, pb);
            assert_memory_equal(b.v, v2, pb);
            free(x), free(y), free(o32), free(o16), free(k2), free(v2), free(part);
            batch_free(&b);
        }
    /* refused: an output dtype other than f32 and bf16; bf16 rows of 2 x 16 elements (not whole 64-element blocks) */
    int npos[2] = {5, 20};
    batch b = batch_new(2, 4, 2, 16, 2, PPN_DTYPE_F32, npos);
    ppn_kv_pool pool = batch_pool(&b);
    float *x = zmem(2 * 8 * 16 * 4), *out = zmem(2 * 4 * 16 * 4);
    unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(2, 4, 1, 16));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch_to(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F16, D(x), 4, 2, 16, 0.25f,
                                               &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, 2, D(part), 1));
    assert_non_null(strstr(ppn_last_error(), "output dtype 2"));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch_to(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_BF16, D(x), 2, 2, 16, 0.25f,
                                               &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, 2, D(part), 1));
    assert_non_null(strstr(ppn_last_error(), "bf16 output rows of 32"));
    EXPECT_ST(PPN_OK, ppn_op_attn_batch_to(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_BF16, D(x), 4, 2, 16, 0.25f,
                                           &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, 2, D(part), 1));
    free(x), free(out), free(part);
    batch_free(&b);
}

/* Whether the captured launch declares a write touching [p, p + bytes). */
static int overlaps_written(const void *p, size_t bytes)
{
    for (int i = 0; i < tu_cap.l.nacc + tu_cap.l.nxacc; i++) {
        const ppn_access *a = tu_acc(i);
        if ((a->mode & PPN_ACC_W) && a->ptr < D(p) + bytes && D(p) < a->ptr + a->bytes) return 1;
    }
    return 0;
}

/* The tensor-core form (ppn_op_attn_batch_tc): every row against the reference with its roundings and against
 * the exact attention (batch_expect), head_dim 64 and 128, GQA 1, 4 and 8, blocks of 1 and 16, one and four
 * splits; a 128-thread CTA per (KV head, split, row); the caches only read and declared so, not one byte written;
 * a row's bits the same alone and in the batch; bf16 out in gemm_tc_kw16's layout as the f32 out rounded; every
 * shape it does not take refused by name, as a misaligned qkv. */
static void test_batch_attn_tc(void **state)
{
    (void)state;
    static const int hds[] = {64, 128};
    static const int groups[] = {1, 4, 8};
    static const int npos[] = {1, 17, 64, 65, 130, 3};
    for (size_t h = 0; h < TU_LEN(hds); h++)
        for (size_t gi = 0; gi < TU_LEN(groups); gi++)
            for (int ns = 1; ns <= 4; ns += 3) {
                const int nkv = 2, nq = nkv * groups[gi], hd = hds[h], B = (int)TU_LEN(npos), L = (int)(h + gi) % 2 ? 4 : 0;
                batch b = batch_new(B, nq, nkv, hd, L, PPN_DTYPE_BF16, npos);
                size_t row = (size_t)(nq + 2 * nkv) * hd, on = (size_t)nq * hd, pb = (size_t)nkv * b.cap * hd * b.es;
                float *qkv = tu_frand((size_t)B * row, -1, 1), *out = zmem((size_t)B * on * 4);
                float *one = zmem(on * 4), *q0 = dup_mem(qkv, (size_t)B * row * 4);
                uint16_t *o16 = zmem((size_t)B * on * 2);
                unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(B, nq, ns, hd));
                unsigned char *k0 = dup_mem(b.k, pb), *v0 = dup_mem(b.v, pb);
                ppn_kv_pool pool = batch_pool(&b);
                float scale = 1.0f / sqrtf((float)hd);
                EXPECT_ST(PPN_OK, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F32, D(qkv), nq, nkv,
                                                       hd, scale, &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, B, D(part),
                                                       ns));
                assert_int_equal(tu_cap.l.kernel, PPN_K_ATTN_BATCH_TC);
                assert_int_equal(tu_cap.l.grid[0], nkv);
                assert_int_equal(tu_cap.l.grid[1], ns);
                assert_int_equal(tu_cap.l.grid[2], B);
                assert_int_equal(tu_cap.l.block[0], 128);
                for (int i = 0; i < b.B; i++)
                    if (b.n_tbl[i]) assert_true(tu_declared(b.k + ((size_t)b.tbl[i][0] << L) * hd * b.es, b.es, PPN_ACC_R));
                assert_false(overlaps_written(b.k, pb));
                assert_false(overlaps_written(b.v, pb));
                assert_memory_equal(b.k, k0, pb);
                assert_memory_equal(b.v, v0, pb);
                assert_memory_equal(qkv, q0, (size_t)B * row * 4);
                for (int i = 0; i < B; i++) batch_expect(&b, i, qkv + (size_t)i * row, scale, out + (size_t)i * on, 1);
                for (int r = 0; r < B; r += 2) { /* alone */
                    EXPECT_ST(PPN_OK, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(one), PPN_DTYPE_F32,
                                                           D(qkv + (size_t)r * row), nq, nkv, hd, scale, &pool,
                                                           D(&b.segs[r]), &b.segs[r], &b.tbl_c[r], &b.n_tbl[r], 1,
                                                           D(part), ns));
                    assert_memory_equal(one, out + (size_t)r * on, on * 4);
                }
                EXPECT_ST(PPN_OK, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(o16), PPN_DTYPE_BF16, D(qkv), nq,
                                                       nkv, hd, scale, &pool, D(b.segs), b.segs, b.tbl_c, b.n_tbl, B,
                                                       D(part), ns));
                assert_true(tu_declared(o16, (size_t)B * on * 2, PPN_ACC_W));
                for (size_t k = 0; k < (size_t)B * on; k++) {
                    size_t at = k - k % 64 + (size_t)PPN_X16_POS((int)(k % 64));
                    if (o16[at] != ppn_f32_to_bf16(out[k]))
                        fail_msg("hd %d, group %d: element %zu: 0x%04x, want 0x%04x", hd, groups[gi], k, o16[at],
                                 ppn_f32_to_bf16(out[k]));
                }
                float inv[64]; /* the check above can fail: the rotary's k/v store is declared written */
                inv_freq_fill(inv, hd);
                EXPECT_ST(PPN_OK, ppn_op_rope_kv_batch(&tu_fake, tu_fake_stream, D(qkv), nq, nkv, hd, D(inv), 0, &pool,
                                                       D(b.segs), b.segs, b.tbl_c, b.n_tbl, B));
                assert_true(overlaps_written(b.k, pb) && overlaps_written(b.v, pb));
                free(qkv), free(out), free(one), free(q0), free(o16), free(part), free(k0), free(v0);
                batch_free(&b);
            }
    /* refused: caches other than bf16, head_dim other than 64 and 128, more than 8 query heads a KV head, the
     * fits rule saying the same; a qkv not 16-byte aligned; no pool */
    static const struct { int nq, nkv, hd, kvdt; const char *word; } no[] = {
        {4, 2, 64, PPN_DTYPE_F32, "f32 cache"}, {4, 2, 64, PPN_DTYPE_F16, "f16 cache"},
        {4, 2, 48, PPN_DTYPE_BF16, "head_dim 48"}, {4, 2, 256, PPN_DTYPE_BF16, "head_dim 256"},
        {32, 2, 64, PPN_DTYPE_BF16, "32 query heads over 2 KV heads"},
    };
    int np2[2] = {5, 20};
    for (size_t k = 0; k < TU_LEN(no); k++) {
        batch b = batch_new(2, no[k].nq, no[k].nkv, no[k].hd, 2, no[k].kvdt, np2);
        ppn_kv_pool pool = batch_pool(&b);
        size_t row = (size_t)(no[k].nq + 2 * no[k].nkv) * no[k].hd;
        float *x = zmem(2 * row * 4 + 16), *out = zmem((size_t)2 * no[k].nq * no[k].hd * 4);
        unsigned char *part = zmem(ppn_op_attn_batch_scratch_bytes(2, no[k].nq, 1, no[k].hd));
        assert_false(ppn_op_attn_batch_tc_fits(no[k].nq, no[k].nkv, no[k].hd, no[k].kvdt));
        EXPECT_ST(PPN_EUNSUPPORTED, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F32, D(x), no[k].nq,
                                                         no[k].nkv, no[k].hd, 0.125f, &pool, D(b.segs), b.segs, b.tbl_c,
                                                         b.n_tbl, 2, D(part), 1));
        if (!strstr(ppn_last_error(), no[k].word)) fail_msg("'%s' does not name %s", ppn_last_error(), no[k].word);
        if (k == 0) { /* the same shape on a bf16 cache is taken; 4 bytes off alignment it is refused */
            b.kvdt = PPN_DTYPE_BF16;
            pool = batch_pool(&b);
            assert_true(ppn_op_attn_batch_tc_fits(no[k].nq, no[k].nkv, no[k].hd, b.kvdt));
            EXPECT_ST(PPN_OK, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F32, D(x), no[k].nq,
                                                   no[k].nkv, no[k].hd, 0.125f, &pool, D(b.segs), b.segs, b.tbl_c,
                                                   b.n_tbl, 2, D(part), 1));
            EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F32, D(x) + 4,
                                                       no[k].nq, no[k].nkv, no[k].hd, 0.125f, &pool, D(b.segs), b.segs,
                                                       b.tbl_c, b.n_tbl, 2, D(part), 1));
            assert_non_null(strstr(ppn_last_error(), "16-byte aligned"));
            EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch_tc(&tu_fake, tu_fake_stream, D(out), PPN_DTYPE_F32, D(x), no[k].nq,
                                                       no[k].nkv, no[k].hd, 0.125f, NULL, D(b.segs), b.segs, b.tbl_c,
                                                       b.n_tbl, 2, D(part), 1));
        }
        free(x), free(out), free(part);
        batch_free(&b);
    }
}

static void test_batch_refusals(void **state)
{
    (void)state;
    int npos[2] = {5, 20};
    batch b = batch_new(2, 4, 2, 16, 2, PPN_DTYPE_F32, npos);
    ppn_kv_pool pool = batch_pool(&b);
    float x[2 * 8 * 16], out[2 * 4 * 16], inv[8];
    unsigned char part[4096];
    inv_freq_fill(inv, 16);
    memset(x, 0, sizeof x);
    assert_true(ppn_op_attn_batch_scratch_bytes(2, 4, 2, 16) <= sizeof part);
    b.segs[1].pos = 20; /* past its 5 blocks of 4 */
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 16, 0.25f, &pool, D(b.segs),
                                            b.segs, b.tbl_c, b.n_tbl, 2, D(part), 2));
    assert_non_null(strstr(ppn_last_error(), "row 1"));
    b.segs[1].pos = 19;
    b.tbl[0][0] = 1000;
    EXPECT_ST(PPN_EINVAL, ppn_op_rope_kv_batch(&tu_fake, tu_fake_stream, D(x), 4, 2, 16, D(inv), 0, &pool, D(b.segs),
                                               b.segs, b.tbl_c, b.n_tbl, 2));
    b.tbl[0][0] = 3;
    EXPECT_ST(PPN_EINVAL, ppn_op_rope_kv_batch(&tu_fake, tu_fake_stream, D(x), 4, 2, 16, D(inv), 0, &pool, D(b.segs),
                                               b.segs, NULL, NULL, 2));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 16, 0.25f, &pool, D(b.segs),
                                            b.segs, b.tbl_c, b.n_tbl, 0, D(part), 2));
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(x), D(x), 4, 2, 16, 0.25f, &pool, D(b.segs),
                                            b.segs, b.tbl_c, b.n_tbl, 2, D(part), 2)); /* out overlaps qkv */
    EXPECT_ST(PPN_EINVAL, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 16, 0.25f, &pool, D(b.segs),
                                            b.segs, b.tbl_c, b.n_tbl, 2, D(part), 65));
    /* identity rows: no tables needed; the whole pools declared */
    ppn_kseg id[2] = {{.pos = 3}, {.pos = 7}};
    EXPECT_ST(PPN_OK, ppn_op_attn_batch(&tu_fake, tu_fake_stream, D(out), D(x), 4, 2, 16, 0.25f, &pool, D(id), id, NULL,
                                        NULL, 2, D(part), 2));
    assert_true(tu_declared(b.k, (size_t)2 * b.cap * 16 * 4, PPN_ACC_R));
    batch_free(&b);
}

int main(void)
{
    tu_rand_seed(0x9a9ed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paged_rope_kv),        cmocka_unit_test(test_paged_attn),
        cmocka_unit_test(test_paged_rows),           cmocka_unit_test(test_paged_decl_coalesced),
        cmocka_unit_test(test_paged_guard),          cmocka_unit_test(test_paged_sim),
        cmocka_unit_test(test_batch_attn_reference), cmocka_unit_test(test_batch_attn_invariance),
        cmocka_unit_test(test_batch_rope_kv),        cmocka_unit_test(test_batch_refusals),
        cmocka_unit_test(test_batch_attn_rope),      cmocka_unit_test(test_batch_attn_bf16_out),
        cmocka_unit_test(test_batch_attn_tc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
