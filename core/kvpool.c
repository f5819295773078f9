/* kvpool.c - paged KV: one K pool and one V pool per layer ([n_kv, cap, head_dim] of the cache dtype, on the
 * device of the stage that runs the layer), cut into blocks of 2^PPN_KV_BLOCK_LOG2 positions; one block id
 * names the same positions in every layer's pools, so a sequence holds one block table for the whole model.
 *
 * Blocks are taken by the caller's thread as a sequence grows (before anything is issued: running out is a clean
 * refusal naming the sequence) and returned on reset, truncate and destroy. Each stage keeps a device copy of
 * every sequence's table (in the sequence's stage scratch); the thread that issues a stage's work copies the
 * entries added since its last copy onto the stage's stream before the walk that reads them, from the pinned
 * host table (entries are only appended between drains, so the source stays put until the copy has run; a reset
 * or a truncate, which rewrite entries, first wait for the steps they drop: ppn_seq_drop_inflight). A
 * block is reused only through the stream that owns its layer (or the unsplit walk, after every stream drained),
 * so a freed block is rewritten in stream order after its last reader. */
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"
#include "kernels/ops.h"

static int blocks_for_pos(int pos) { return (pos + PPN_KV_BLOCK - 1) >> PPN_KV_BLOCK_LOG2; }

int ppn_kv_max_blocks(const ppn_model *m) { return blocks_for_pos(m->ctx); }

/* One layer's pools (none held: nothing to do); both freed whatever the first meets, its failure returned. */
static ppn_status layer_pools_free(ppn_model *m, int l)
{
    ppn_err_first first = {0};
    if (m->kv.dev[l] < 0) return PPN_OK;
    ppn_err_first_add(&first, ppn_model_block_free(m, m->kv.dev[l], &m->kv.k[l]));
    ppn_err_first_add(&first, ppn_model_block_free(m, m->kv.dev[l], &m->kv.v[l]));
    m->kv.dev[l] = -1;
    return ppn_err_first_done(&first);
}

static ppn_status pools_free(ppn_model *m)
{
    ppn_err_first first = {0};
    for (int l = 0; l < m->cfg.n_layers && m->kv.dev; l++) ppn_err_first_add(&first, layer_pools_free(m, l));
    return ppn_err_first_done(&first);
}

/* Every layer's pools on the device map runs it on (moved only while no block is held). */
static ppn_status pools_fit(ppn_model *m, const ppn_stage_map *map)
{
    const ppn_model_config *c = &m->cfg;
    int moved = 0;
    size_t bytes = ppn_op_kv_cache_bytes(c->n_kv_heads, c->head_dim, m->kv.cap, m->kvdt);
    for (int l = 0; l < c->n_layers; l++) {
        int want = map->dev[ppn_layer_stage(map, l)];
        if (m->kv.dev[l] == want) continue;
        PPN_CHECK(layer_pools_free(m, l));
        PPN_CHECK(ppn_model_block_alloc(m, want, bytes, "k pool", &m->kv.k[l]));
        m->kv.dev[l] = want; /* from here pools_free returns what was taken */
        PPN_CHECK(ppn_model_block_alloc(m, want, bytes, "v pool", &m->kv.v[l]));
        moved = 1;
    }
    ppn_gpu *g = m->rt->g;
    for (int d = 0; moved && d < PPN_MAX_DEVICES; d++) /* allocations are ordered on the device streams */
        if (m->dev_stream[d]) PPN_CHECK(g->ops->stream_sync(g, m->dev_stream[d]));
    return PPN_OK;
}

ppn_status ppn_kv_init(ppn_model *m, int tokens)
{
    int n = blocks_for_pos(tokens);
    m->kv.n_blocks = n;
    m->kv.cap = n << PPN_KV_BLOCK_LOG2;
    m->kv.free = ppn_hcalloc((size_t)n, sizeof *m->kv.free);
    m->kv.k = ppn_hcalloc((size_t)m->cfg.n_layers, sizeof *m->kv.k);
    m->kv.v = ppn_hcalloc((size_t)m->cfg.n_layers, sizeof *m->kv.v);
    m->kv.dev = ppn_hcalloc((size_t)m->cfg.n_layers, sizeof *m->kv.dev);
    if (!m->kv.free || !m->kv.k || !m->kv.v || !m->kv.dev) return ppn_err(PPN_ENOMEM, "KV pool: host out of memory");
    for (int l = 0; l < m->cfg.n_layers; l++) m->kv.dev[l] = -1;
    for (int b = 0; b < n; b++) m->kv.free[b] = n - 1 - b; /* block 0 on top: the first sequence gets 0, 1, .. */
    m->kv.n_free = n;
    return PPN_OK;
}

ppn_status ppn_kv_fini(ppn_model *m)
{
    ppn_status st = pools_free(m);
    ppn_hfree(m->kv.free);
    ppn_hfree(m->kv.k);
    ppn_hfree(m->kv.v);
    ppn_hfree(m->kv.dev);
    memset(&m->kv, 0, sizeof m->kv);
    return st;
}

ppn_status ppn_kv_check_map(const ppn_model *m, const ppn_stage_map *map)
{
    if (m->kv.n_free == m->kv.n_blocks) return PPN_OK;
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->kv.dev[l] >= 0 && m->kv.dev[l] != map->dev[ppn_layer_stage(map, l)])
            for (const ppn_seq *q = m->seqs; q; q = q->next)
                if (q->n_blk)
                    return ppn_err(PPN_ESTATE, "stage map: sequence %d holds KV blocks of layer %d on device %d; the "
                                               "new map runs that layer on device %d (reset or destroy the sequences "
                                               "first)", q->id, l, m->kv.dev[l], map->dev[ppn_layer_stage(map, l)]);
    return PPN_OK;
}

ppn_status ppn_kv_fit_map(ppn_model *m, const ppn_stage_map *map) { return pools_fit(m, map); }

ppn_status ppn_kv_need(ppn_seq *const *seqs, const int *end, int n)
{
    ppn_model *m = seqs[0]->m;
    int need = 0;
    for (int i = 0; i < n; i++) {
        int want = blocks_for_pos(end[i]) - seqs[i]->n_blk;
        if (want > 0) need += want;
    }
    if (need <= m->kv.n_free) return PPN_OK;
    int first = 0; /* the first sequence the free blocks do not reach, in the call's order */
    for (int i = 0, left = m->kv.n_free; i < n; i++) {
        int want = blocks_for_pos(end[i]) - seqs[i]->n_blk;
        if (want > left) {
            first = i;
            break;
        }
        if (want > 0) left -= want;
    }
    return ppn_err(PPN_ENOMEM, "KV blocks exhausted: sequence %d needs %d more block(s) of %d positions to reach "
                               "position %d, and this call's %d sequence(s) need %d in all; %d of %d blocks are free "
                               "(ppn_model_get_kv_info; load with a larger kv_tokens, or reset or destroy sequences)",
                   seqs[first]->id, blocks_for_pos(end[first]) - seqs[first]->n_blk, PPN_KV_BLOCK, end[first], n, need,
                   m->kv.n_free, m->kv.n_blocks);
}

ppn_status ppn_kv_reserve(ppn_seq *const *seqs, const int *end, int n)
{
    PPN_CHECK(ppn_kv_need(seqs, end, n));
    ppn_model *m = seqs[0]->m;
    ppn_gpu *g = m->rt->g;
    for (int i = 0; i < n; i++) {
        ppn_seq *q = seqs[i];
        int want = blocks_for_pos(end[i]), had = q->n_blk;
        if (want <= had) continue;
        /* the sim checks the rewrite against the stage copies still reading the table (ppn_kv_sync) */
        g->ops->host_access(g, q->tbl_h + had, sizeof(int32_t) * (size_t)(want - had), PPN_ACC_W, "KV block table");
        while (q->n_blk < want) q->tbl_h[q->n_blk++] = m->kv.free[--m->kv.n_free];
    }
    return PPN_OK;
}

ppn_status ppn_kv_reserve_one(ppn_seq *q, int end) { return ppn_kv_reserve(&q, &end, 1); }

void ppn_kv_release(ppn_seq *q, int keep_pos)
{
    ppn_model *m = q->m;
    int keep = blocks_for_pos(keep_pos);
    while (q->n_blk > keep) m->kv.free[m->kv.n_free++] = q->tbl_h[--q->n_blk];
    for (int s = 0; s < PPN_MAX_STAGES; s++) /* the device copies hold stale entries past keep: rewrite them */
        if (q->scr[s].kvt_synced > keep) q->scr[s].kvt_synced = keep;
}

ppn_status ppn_kv_sync(ppn_model *m, ppn_seq *q, int s, ppn_gstream *stream, int n_tbl)
{
    ppn_stage_scratch *r = &q->scr[s];
    if (r->kvt_synced >= n_tbl) return PPN_OK;
    ppn_gpu *g = m->rt->g;
    size_t at = sizeof(int32_t) * (size_t)r->kvt_synced, n = sizeof(int32_t) * (size_t)(n_tbl - r->kvt_synced);
    PPN_CHECK(g->ops->copy_htod(g, stream, r->kvt + at, q->tbl_h + r->kvt_synced, n));
    r->kvt_synced = n_tbl;
    return PPN_OK;
}

ppn_kv_pool ppn_kv_pool_of(const ppn_model *m, int l)
{
    return (ppn_kv_pool){.k = m->kv.k[l], .v = m->kv.v[l], .cap = m->kv.cap, .block_log2 = PPN_KV_BLOCK_LOG2,
                         .kvdt = m->kvdt};
}

ppn_kv_view ppn_kv_view_of(const ppn_model *m, const ppn_seq *q, int s, int l, int n_tbl)
{
    return (ppn_kv_view){.pool = ppn_kv_pool_of(m, l), .tbl = q->scr[s].kvt, .tbl_h = q->tbl_h, .n_tbl = n_tbl};
}

void ppn_model_get_kv_info(const ppn_model *m, ppn_kv_info *out)
{
    memset(out, 0, sizeof *out);
    out->block_positions = PPN_KV_BLOCK;
    out->blocks_total = m->kv.n_blocks;
    out->blocks_used = m->kv.n_blocks - m->kv.n_free;
    out->positions = m->kv.cap;
    out->bytes = 2 * ppn_op_kv_cache_bytes(m->cfg.n_kv_heads, m->cfg.head_dim, m->kv.cap, m->kvdt) *
                 (size_t)m->cfg.n_layers;
}

int ppn_seq_kv_blocks(const ppn_seq *q) { return q ? q->n_blk : 0; }
