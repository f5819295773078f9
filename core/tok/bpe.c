/* bpe.c - the BPE model on one pre-token: the whole word when ignore_merges finds it in the vocabulary, else
 * its characters (unknown ones as byte tokens with byte fallback, else the unknown token), merged lowest rank
 * first (leftmost on ties) until no adjacent pair has a merge. The candidates sit in a binary heap over a linked
 * list of symbols, so a long word (SentencePiece's whole segment) costs n log n, not n^2. */
#include <stdlib.h>
#include <string.h>
#include "core/base/err.h"
#include "core/tok/tok.h"

/* GPT-2's byte-level alphabet: the printable Latin-1 bytes stand for themselves, the other 68 bytes take the
 * code points 256.. in byte order. */
static int printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

int ppn_tok_byte_cp(int b)
{
    if (printable(b)) return b;
    int k = 0;
    for (int i = 0; i < b; i++) k += !printable(i);
    return 256 + k;
}

int ppn_tok_cp_byte(int cp)
{
    if (cp < 256) return printable(cp) ? cp : -1;
    for (int b = 0, k = 0; b < 256; b++)
        if (!printable(b) && 256 + k++ == cp) return b;
    return -1;
}

typedef struct sym {
    int id, prev, next;
    int len;   /* bytes of the word it covers; 0 once merged into its left neighbour */
} sym;

typedef struct cand {
    int rank, pos, merged;
} cand;

typedef struct heap {
    cand *v;
    int n, cap;
} heap;

static int cand_less(const cand *a, const cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static ppn_status heap_push(heap *h, cand c)
{
    if (h->n == h->cap) {
        int cap = h->cap ? 2 * h->cap : 64;
        cand *v = realloc(h->v, (size_t)cap * sizeof *v);
        if (!v) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
        h->v = v, h->cap = cap;
    }
    int i = h->n++;
    while (i > 0 && cand_less(&c, &h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = c;
    return PPN_OK;
}

static cand heap_pop(heap *h)
{
    cand top = h->v[0], last = h->v[--h->n];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, m = l;
        if (l >= h->n) break;
        if (l + 1 < h->n && cand_less(&h->v[l + 1], &h->v[l])) m = l + 1;
        if (!cand_less(&h->v[m], &last)) break;
        h->v[i] = h->v[m];
        i = m;
    }
    h->v[i] = last;
    return top;
}

/* Push the merge of symbol i with its right neighbour, if there is one. */
static ppn_status consider(const ppn_tokenizer *t, heap *h, const sym *s, int i)
{
    if (i < 0 || s[i].next < 0) return PPN_OK;
    int merged, rank = ppn_tok_pair(t, s[i].id, s[s[i].next].id, &merged);
    return rank < 0 ? PPN_OK : heap_push(h, (cand){rank, i, merged});
}

static ppn_status merge_all(const ppn_tokenizer *t, sym *s, int n)
{
    heap h = {0};
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i + 1 < n; i++) st = consider(t, &h, s, i);
    while (st == PPN_OK && h.n) {
        cand c = heap_pop(&h);
        sym *a = &s[c.pos];
        int merged;
        /* Stale: a was merged away, lost its neighbour, or the pair changed since c was pushed. */
        if (!a->len || a->next < 0 || ppn_tok_pair(t, a->id, s[a->next].id, &merged) < 0 || merged != c.merged)
            continue;
        sym *b = &s[a->next];
        a->id = c.merged;
        a->len += b->len;
        a->next = b->next;
        b->len = 0;
        if (a->next >= 0) s[a->next].prev = c.pos;
        st = consider(t, &h, s, a->prev);
        if (st == PPN_OK) st = consider(t, &h, s, c.pos);
    }
    free(h.v);
    return st;
}

static ppn_status add_sym(sym **s, int *n, int *cap, int id, int len)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 32;
        sym *v = realloc(*s, (size_t)*cap * sizeof *v);
        if (!v) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
        *s = v;
    }
    (*s)[*n] = (sym){id, *n - 1, -1, len};
    if (*n) (*s)[*n - 1].next = *n;
    (*n)++;
    return PPN_OK;
}

/* One character's symbols: its token, else its bytes' tokens (byte fallback), else the unknown token (one for a
 * run of unknowns with fuse_unk), else nothing (tokenizers drops it when there is no unknown token). */
static ppn_status char_syms(const ppn_tokenizer *t, const char *c, int k, sym **s, int *n, int *cap)
{
    int id = ppn_tok_lookup(t, c, (size_t)k);
    if (id >= 0) return add_sym(s, n, cap, id, k);
    int all_bytes = t->byte_fallback;
    for (int i = 0; all_bytes && i < k; i++) all_bytes = t->byte_id[(unsigned char)c[i]] >= 0;
    if (all_bytes) {
        for (int i = 0; i < k; i++) PPN_CHECK(add_sym(s, n, cap, t->byte_id[(unsigned char)c[i]], 1));
        return PPN_OK;
    }
    if (t->unk_id < 0) return PPN_OK;
    if (t->fuse_unk && *n && (*s)[*n - 1].id == t->unk_id) {
        (*s)[*n - 1].len += k;
        return PPN_OK;
    }
    return add_sym(s, n, cap, t->unk_id, k);
}

ppn_status ppn_tok_bpe_word(const ppn_tokenizer *t, const char *w, size_t n, ppn_tok_ints *ids)
{
    if (t->ignore_merges) {
        int id = ppn_tok_lookup(t, w, n);
        if (id >= 0) return ppn_tok_ints_push(ids, id);
    }
    sym *s = NULL;
    int ns = 0, cap = 0;
    ppn_status st = PPN_OK;
    for (size_t i = 0; st == PPN_OK && i < n;) {
        int k = ppn_tok_utf8_len((const unsigned char *)w + i, n - i);
        if (!k) k = 1;   /* not reached: the text was checked as UTF-8 and the byte-level text is UTF-8 */
        st = char_syms(t, w + i, k, &s, &ns, &cap);
        i += (size_t)k;
    }
    if (st == PPN_OK) st = merge_all(t, s, ns);
    for (int i = 0; st == PPN_OK && i >= 0 && i < ns; i = s[i].next) st = ppn_tok_ints_push(ids, s[i].id);
    free(s);
    return st;
}
