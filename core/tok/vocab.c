/* vocab.c - tokenizer.json and tokenizer_config.json into the tables of tok.h: the token table and its string
 * map, the merges as an id-pair map, the added tokens, and each stage's steps. What the files hold that ppn does
 * not handle is refused with PPN_EUNSUPPORTED naming the file and the field, never silently skipped. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/base/err.h"
#include "core/tok/tok.h"

/* What the loader reads: the file for messages, and its parsed root. */
typedef struct load_ctx {
    ppn_tokenizer *t;
    char path[4096];
} load_ctx;

static ppn_status bad(const load_ctx *c, ppn_status st, const char *what)
{
    return ppn_err(st, "%s: %s", c->path, what);
}

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint32_t table_mask(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    return (uint32_t)(cap - 1);
}

int ppn_tok_lookup(const ppn_tokenizer *t, const char *s, size_t n)
{
    const ppn_tok_strmap *m = &t->vocab;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t v = m->slot[i];
        if (!v) return -1;
        int id = v - 1;
        if (t->piece_len[id] == n && !memcmp(t->piece[id], s, n)) return id;
    }
}

/* Map id's piece to id (a later id with the same text replaces it, as a JSON object's last key would). */
static void strmap_put(ppn_tokenizer *t, int id)
{
    ppn_tok_strmap *m = &t->vocab;
    for (uint32_t i = (uint32_t)hash_bytes(t->piece[id], t->piece_len[id]) & m->mask;; i = (i + 1) & m->mask) {
        int32_t v = m->slot[i];
        if (!v || (t->piece_len[v - 1] == t->piece_len[id] && !memcmp(t->piece[v - 1], t->piece[id],
                                                                       t->piece_len[id]))) {
            m->slot[i] = id + 1;
            return;
        }
    }
}

int ppn_tok_pair(const ppn_tokenizer *t, int a, int b, int *merged)
{
    const ppn_tok_pairmap *m = &t->merges;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (uint32_t i = (uint32_t)hash_u64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (!m->key[i]) return -1;
        if (m->key[i] == k) {
            *merged = m->merged[i];
            return m->rank[i];
        }
    }
}

/* A repeated pair keeps its last rank, as tokenizers' map built from the merge list does. */
static void pair_put(ppn_tokenizer *t, int a, int b, int rank, int merged)
{
    ppn_tok_pairmap *m = &t->merges;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    uint32_t i = (uint32_t)hash_u64(k) & m->mask;
    while (m->key[i] && m->key[i] != k) i = (i + 1) & m->mask;
    m->key[i] = k;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

/* A JSON string's text and length (NUL bytes kept), or NULL. */
static const char *jstr(const json_t *v, size_t *n)
{
    if (!json_is_string(v)) return NULL;
    *n = json_string_length(v);
    return json_string_value(v);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* Set the table's piece for id (the first text given for an id stays). */
static ppn_status set_piece(load_ctx *c, int id, const char *s, size_t n)
{
    ppn_tokenizer *t = c->t;
    if (t->piece[id]) return PPN_OK;
    if (!(t->piece[id] = dup_n(s, n))) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    t->piece_len[id] = (uint32_t)n;
    return PPN_OK;
}

/* The largest id named by model.vocab and added_tokens, checking both are well formed. */
/* Ids are below 2^24 (ppn_mkmodel_tok's limit too): the token table is sized by the largest id, so a file naming
 * one token with id 2^30 asked for 12 GB of tables (fuzz_tokenizer, out of memory); real vocabularies stay
 * under 2^18. */
#define MAX_TOKEN_ID (1 << 24)

static ppn_status max_id(load_ctx *c, const json_t *vocab, const json_t *added, int *out)
{
    const char *k;
    json_t *v;
    long long hi = -1;
    if (!json_is_object(vocab)) return bad(c, PPN_EFORMAT, "model.vocab is not an object");
    json_object_foreach((json_t *)vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_TOKEN_ID)
            return ppn_err(PPN_EFORMAT, "%s: model.vocab: token '%.64s' has no valid id (0 to %d)", c->path, k,
                           MAX_TOKEN_ID - 1);
        if (json_integer_value(v) > hi) hi = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        size_t n;
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= MAX_TOKEN_ID ||
            !jstr(json_object_get(v, "content"), &n) || !n)
            return ppn_err(PPN_EFORMAT, "%s: added_tokens[%zu]: needs an id and a non-empty content", c->path, i);
        if (json_integer_value(id) > hi) hi = json_integer_value(id);
    }
    *out = (int)(hi + 1);
    return PPN_OK;
}

static ppn_status read_vocab(load_ctx *c, const json_t *vocab)
{
    ppn_tokenizer *t = c->t;
    const char *k;
    json_t *v;
    t->vocab.mask = table_mask(json_object_size(vocab));
    if (!(t->vocab.slot = calloc((size_t)t->vocab.mask + 1, sizeof *t->vocab.slot)))
        return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    json_object_foreach((json_t *)vocab, k, v) {
        int id = (int)json_integer_value(v);
        if (t->piece[id]) return ppn_err(PPN_EFORMAT, "%s: model.vocab: id %d given twice", c->path, id);
        PPN_CHECK(set_piece(c, id, k, strlen(k)));
        strmap_put(t, id);
    }
    return PPN_OK;
}

/* One merge, "a b" (tokenizers < 0.20) or ["a", "b"], into its two halves. */
static int merge_halves(const json_t *m, const char **a, size_t *na, const char **b, size_t *nb)
{
    size_t n;
    const char *s = jstr(m, &n);
    if (s) {
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s))) return 0;
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = n - *na - 1;
        return 1;
    }
    if (!json_is_array(m) || json_array_size(m) != 2) return 0;
    *a = jstr(json_array_get(m, 0), na);
    *b = jstr(json_array_get(m, 1), nb);
    return *a && *b;
}

static ppn_status read_merges(load_ctx *c, const json_t *merges)
{
    ppn_tokenizer *t = c->t;
    if (!json_is_array(merges)) return bad(c, PPN_EFORMAT, "model.merges is not an array");
    size_t n = json_array_size(merges), i;
    ppn_tok_pairmap *m = &t->merges;
    m->mask = table_mask(n);
    size_t cap = (size_t)m->mask + 1;
    m->key = calloc(cap, sizeof *m->key);
    m->rank = malloc(cap * sizeof *m->rank);
    m->merged = malloc(cap * sizeof *m->merged);
    if (!m->key || !m->rank || !m->merged) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    char *cat = NULL;
    size_t cat_cap = 0;
    json_t *v;
    ppn_status st = PPN_OK;
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t na, nb;
        if (!merge_halves(v, &a, &na, &b, &nb)) {
            st = ppn_err(PPN_EFORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", c->path, i);
            break;
        }
        if (na + nb > cat_cap) {
            cat_cap = 2 * (na + nb);
            free(cat);
            if (!(cat = malloc(cat_cap))) {
                st = ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
                break;
            }
        }
        memcpy(cat, a, na);
        memcpy(cat + na, b, nb);
        int ia = ppn_tok_lookup(t, a, na), ib = ppn_tok_lookup(t, b, nb), im = ppn_tok_lookup(t, cat, na + nb);
        if (ia < 0 || ib < 0 || im < 0) {
            st = ppn_err(PPN_EFORMAT, "%s: model.merges[%zu] ('%.*s' + '%.*s'): a token not in the vocabulary",
                         c->path, i, (int)na, a, (int)nb, b);
            break;
        }
        pair_put(t, ia, ib, (int)i, im);
    }
    free(cat);
    return st;
}

/* A string field that must be null, absent or "" (a feature ppn does not implement otherwise). */
static ppn_status must_be_empty(load_ctx *c, const json_t *model, const char *key)
{
    json_t *v = json_object_get(model, key);
    size_t n;
    if (!v || json_is_null(v) || (jstr(v, &n) && n == 0)) return PPN_OK;
    return ppn_err(PPN_EUNSUPPORTED, "%s: model.%s is set (not handled)", c->path, key);
}

static ppn_status read_model(load_ctx *c, const json_t *model)
{
    ppn_tokenizer *t = c->t;
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return ppn_err(PPN_EUNSUPPORTED, "%s: model.type '%s' (only BPE is handled)", c->path, type ? type : "?");
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout)) return bad(c, PPN_EUNSUPPORTED, "model.dropout is set (not handled)");
    PPN_CHECK(must_be_empty(c, model, "continuing_subword_prefix"));
    PPN_CHECK(must_be_empty(c, model, "end_of_word_suffix"));
    PPN_CHECK(read_vocab(c, json_object_get(model, "vocab")));
    PPN_CHECK(read_merges(c, json_object_get(model, "merges")));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    size_t n;
    const char *unk = jstr(json_object_get(model, "unk_token"), &n);
    t->unk_id = unk ? ppn_tok_lookup(t, unk, n) : -1;
    if (unk && t->unk_id < 0) return bad(c, PPN_EFORMAT, "model.unk_token is not in the vocabulary");
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->byte_id[b] = ppn_tok_lookup(t, s, 6);
    }
    return PPN_OK;
}

static ppn_status read_added(load_ctx *c, const json_t *added)
{
    ppn_tokenizer *t = c->t;
    size_t i, n = json_array_size(added);
    json_t *v;
    if (!(t->added = calloc(n ? n : 1, sizeof *t->added))) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    json_array_foreach(added, i, v) {
        ppn_tok_added *a = &t->added[t->n_added++];
        const char *s = jstr(json_object_get(v, "content"), &a->len);
        a->id = (int)json_integer_value(json_object_get(v, "id"));
        a->special = json_is_true(json_object_get(v, "special"));
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        if (json_is_true(json_object_get(v, "single_word")))
            return ppn_err(PPN_EUNSUPPORTED, "%s: added_tokens[%zu]: single_word (not handled)", c->path, i);
        if (!(a->content = dup_n(s, a->len))) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
        t->added_first[(unsigned char)s[0] >> 3] |= (uint8_t)(1u << ((unsigned char)s[0] & 7));
        PPN_CHECK(set_piece(c, a->id, s, a->len));   /* the vocabulary's text for an id it has stays */
    }
    return PPN_OK;
}

/* The steps of a stage: a Sequence's list, a single step as a list of one, or none for null. */
static ppn_status steps_of(load_ctx *c, const json_t *stage, const char *list_key, json_t **list)
{
    *list = NULL;
    if (!stage || json_is_null(stage)) return PPN_OK;
    const char *type = json_string_value(json_object_get(stage, "type"));
    if (type && !strcmp(type, "Sequence")) {
        *list = json_incref(json_object_get(stage, list_key));
        if (!json_is_array(*list)) return ppn_err(PPN_EFORMAT, "%s: a Sequence without %s", c->path, list_key);
        return PPN_OK;
    }
    *list = json_array();
    json_array_append(*list, (json_t *)stage);
    return PPN_OK;
}

/* A Replace's or Split's pattern: {"String": s} or {"Regex": r}. */
static const char *pattern_of(const json_t *step, int *regex)
{
    json_t *p = json_object_get(step, "pattern");
    const char *s = json_string_value(json_object_get(p, "String"));
    *regex = !s;
    return s ? s : json_string_value(json_object_get(p, "Regex"));
}

static ppn_status norm_step(load_ctx *c, const json_t *step, ppn_tok_norm *n)
{
    const char *type = json_string_value(json_object_get(step, "type"));
    int regex;
    if (!type) return bad(c, PPN_EFORMAT, "a normalizer without a type");
    if (!strcmp(type, "NFC")) {
        n->kind = PPN_NORM_NFC;
        return PPN_OK;
    }
    if (!strcmp(type, "Prepend") && json_string_value(json_object_get(step, "prepend"))) {
        n->kind = PPN_NORM_PREPEND;
        n->a = strdup(json_string_value(json_object_get(step, "prepend")));
        return n->a ? PPN_OK : ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    }
    if (!strcmp(type, "Replace")) {
        const char *from = pattern_of(step, &regex), *to = json_string_value(json_object_get(step, "content"));
        if (regex || !from || !*from || !to) return bad(c, PPN_EUNSUPPORTED, "normalizer Replace: only a string");
        n->kind = PPN_NORM_REPLACE;
        n->a = strdup(from);
        n->b = strdup(to);
        return n->a && n->b ? PPN_OK : ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    }
    return ppn_err(PPN_EUNSUPPORTED, "%s: normalizer '%s' (handled: NFC, Prepend, Replace)", c->path, type);
}

/* Metaspace's prepend_scheme (or the older add_prefix_space): 0 never, 1 always, 2 first. */
static int metaspace_scheme(const json_t *step)
{
    const char *s = json_string_value(json_object_get(step, "prepend_scheme"));
    if (s) return !strcmp(s, "never") ? 0 : !strcmp(s, "first") ? 2 : 1;
    json_t *a = json_object_get(step, "add_prefix_space");
    return !a || json_is_true(a);
}

static ppn_status metaspace_check(load_ctx *c, const json_t *step)
{
    const char *r = json_string_value(json_object_get(step, "replacement"));
    json_t *split = json_object_get(step, "split");
    if (r && strcmp(r, "\xe2\x96\x81")) return bad(c, PPN_EUNSUPPORTED, "Metaspace: replacement other than U+2581");
    if (json_is_true(split)) return bad(c, PPN_EUNSUPPORTED, "pre-tokenizer Metaspace with split: true");
    return PPN_OK;
}

static ppn_status pre_step(load_ctx *c, const json_t *step, ppn_tok_pre *p)
{
    const char *type = json_string_value(json_object_get(step, "type"));
    int regex;
    if (!type) return bad(c, PPN_EFORMAT, "a pre-tokenizer without a type");
    if (!strcmp(type, "Split")) {
        const char *pat = pattern_of(step, &regex), *beh = json_string_value(json_object_get(step, "behavior"));
        if (!pat || !regex || !beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(step, "invert")))
            return bad(c, PPN_EUNSUPPORTED, "pre-tokenizer Split: only a Regex, Isolated, not inverted");
        p->kind = PPN_PRE_SPLIT;
        return ppn_err_ctx(ppn_tok_regex_compile(pat, p), "%s: pre-tokenizer Split", c->path);
    }
    if (!strcmp(type, "ByteLevel")) {
        p->kind = PPN_PRE_BYTELEVEL;
        p->prefix_space = json_is_true(json_object_get(step, "add_prefix_space"));
        json_t *use = json_object_get(step, "use_regex");
        if (use && !json_is_true(use)) return PPN_OK;
        return ppn_err_ctx(ppn_tok_regex_compile(ppn_tok_gpt2_regex, p), "%s: pre-tokenizer ByteLevel", c->path);
    }
    if (!strcmp(type, "Digits")) {   /* numeric characters (Rust's char::is_numeric: \p{N}) split off, alone or runs */
        p->kind = PPN_PRE_SPLIT;
        const char *pat = json_is_true(json_object_get(step, "individual_digits")) ? "\\p{N}" : "\\p{N}+";
        return ppn_err_ctx(ppn_tok_regex_compile(pat, p), "%s: pre-tokenizer Digits", c->path);
    }
    if (!strcmp(type, "Metaspace")) {
        p->kind = PPN_PRE_METASPACE;
        p->prefix_space = metaspace_scheme(step);
        return metaspace_check(c, step);
    }
    return ppn_err(PPN_EUNSUPPORTED, "%s: pre-tokenizer '%s' (handled: Split, ByteLevel, Metaspace, Digits)", c->path,
                   type);
}

static ppn_status dec_string(ppn_tok_dec *d, const char *a, const char *b)
{
    d->a = a ? strdup(a) : NULL;
    d->b = b ? strdup(b) : NULL;
    return (a && !d->a) || (b && !d->b) ? ppn_err(PPN_ENOMEM, "tokenizer: out of memory") : PPN_OK;
}

static ppn_status dec_step(load_ctx *c, const json_t *step, ppn_tok_dec *d)
{
    const char *type = json_string_value(json_object_get(step, "type"));
    int regex;
    if (!type) return bad(c, PPN_EFORMAT, "a decoder without a type");
    if (!strcmp(type, "ByteLevel")) d->kind = PPN_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->kind = PPN_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->kind = PPN_DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        const char *from = pattern_of(step, &regex), *to = json_string_value(json_object_get(step, "content"));
        if (regex || !from || !*from || !to) return bad(c, PPN_EUNSUPPORTED, "decoder Replace: only a string");
        d->kind = PPN_DEC_REPLACE;
        return dec_string(d, from, to);
    } else if (!strcmp(type, "Strip")) {
        const char *ch = json_string_value(json_object_get(step, "content"));
        /* tokenizers' Strip strips a char (serde refuses a longer string) a usize number of times */
        if (!ch || !*ch) return bad(c, PPN_EFORMAT, "decoder Strip without content");
        if (!ppn_tok_one_char(ch)) return bad(c, PPN_EFORMAT, "decoder Strip: its content is not one character");
        json_int_t start = json_integer_value(json_object_get(step, "start"));
        json_int_t stop = json_integer_value(json_object_get(step, "stop"));
        if (start < 0 || stop < 0 || start > 1000000 || stop > 1000000)
            return bad(c, PPN_EFORMAT, "decoder Strip: start and stop are counts (0 to 1000000)");
        d->kind = PPN_DEC_STRIP;
        d->start = (int)start;
        d->stop = (int)stop;
        return dec_string(d, ch, NULL);
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = PPN_DEC_METASPACE;
        d->start = metaspace_scheme(step) != 0;
        return metaspace_check(c, step);
    } else
        return ppn_err(PPN_EUNSUPPORTED, "%s: decoder '%s' (handled: ByteLevel, ByteFallback, Fuse, Replace, "
                       "Strip, Metaspace)", c->path, type);
    return PPN_OK;
}

static ppn_status read_stages(load_ctx *c, const json_t *root)
{
    ppn_tokenizer *t = c->t;
    json_t *list = NULL, *v;
    size_t i;
    ppn_status st = steps_of(c, json_object_get(root, "normalizer"), "normalizers", &list);
    json_array_foreach(list, i, v) {
        if (st != PPN_OK) break;
        if (t->n_norm == PPN_TOK_MAX_STEPS) st = bad(c, PPN_EUNSUPPORTED, "too many normalizers");
        else st = norm_step(c, v, &t->norm[t->n_norm++]);
    }
    json_decref(list);
    list = NULL;   /* a refused normalizer skips the next steps_of: the loop and decref below must see no list */
    if (st == PPN_OK) st = steps_of(c, json_object_get(root, "pre_tokenizer"), "pretokenizers", &list);
    json_array_foreach(list, i, v) {
        if (st != PPN_OK) break;
        if (t->n_pre == PPN_TOK_MAX_STEPS) st = bad(c, PPN_EUNSUPPORTED, "too many pre-tokenizers");
        else st = pre_step(c, v, &t->pre[t->n_pre++]);
    }
    json_decref(list);
    list = NULL;
    json_t *dec = json_object_get(root, "decoder");
    t->has_decoder = dec && !json_is_null(dec);
    if (st == PPN_OK) st = steps_of(c, dec, "decoders", &list);
    json_array_foreach(list, i, v) {
        if (st != PPN_OK) break;
        if (t->n_dec == PPN_TOK_MAX_STEPS) st = bad(c, PPN_EUNSUPPORTED, "too many decoders");
        else st = dec_step(c, v, &t->dec[t->n_dec++]);
    }
    json_decref(list);
    return st;
}

/* The id of a token given by its text (an added token or the vocabulary), or -1. */
static int id_of_text(const ppn_tokenizer *t, const char *s, size_t n)
{
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n)) return t->added[i].id;
    return ppn_tok_lookup(t, s, n);
}

/* A TemplateProcessing's "single" template: the special tokens before and after $A. */
static ppn_status read_template(load_ctx *c, const json_t *pp)
{
    ppn_tokenizer *t = c->t;
    json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens"), *v;
    size_t i, k;
    int seen_a = 0;
    if (!json_is_array(single)) return bad(c, PPN_EFORMAT, "post_processor TemplateProcessing without single");
    json_array_foreach(single, i, v) {
        if (json_object_get(v, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(v, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *id;
        if (!name || !json_is_array(ids))
            return bad(c, PPN_EFORMAT, "post_processor: a template piece without its special_tokens entry");
        json_array_foreach(ids, k, id) {
            int x = (int)json_integer_value(id);
            if (!json_is_integer(id) || x < 0 || x >= t->n_ids)
                return bad(c, PPN_EFORMAT, "post_processor: a special token id outside the table");
            PPN_CHECK(ppn_tok_ints_push(seen_a ? &t->post_ids : &t->pre_ids, x));
        }
    }
    return PPN_OK;
}

static ppn_status read_post(load_ctx *c, const json_t *root)
{
    json_t *list = NULL, *v;
    size_t i;
    ppn_status st = steps_of(c, json_object_get(root, "post_processor"), "processors", &list);
    json_array_foreach(list, i, v) {
        if (st != PPN_OK) break;
        const char *type = json_string_value(json_object_get(v, "type"));
        if (type && !strcmp(type, "TemplateProcessing")) st = read_template(c, v);
        else if (!type || strcmp(type, "ByteLevel"))
            st = ppn_err(PPN_EUNSUPPORTED, "%s: post_processor '%s' (handled: TemplateProcessing, ByteLevel)",
                         c->path, type ? type : "?");
    }
    json_decref(list);
    return st;
}

/* tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}; -1 when absent or null. */
static ppn_status config_token(load_ctx *c, const json_t *cfg, const char *key, int *id)
{
    json_t *v = json_object_get(cfg, key);
    size_t n;
    const char *s = jstr(json_is_object(v) ? json_object_get(v, "content") : v, &n);
    *id = -1;
    if (!v || json_is_null(v)) return PPN_OK;
    if (!s) return ppn_err(PPN_EFORMAT, "%s: %s is neither a string nor {\"content\": ...}", c->path, key);
    if ((*id = id_of_text(c->t, s, n)) < 0)
        return ppn_err(PPN_EFORMAT, "%s: %s '%s' is not a token", c->path, key, s);
    return PPN_OK;
}

/* 1 when path is a regular file, else -errno of the stat, or -EINVAL for anything but a regular file: checked
 * before jansson opens it, since opening a FIFO for reading waits for a writer (forever, for a stray mkfifo). */
static int regular_file(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return -errno;
    return S_ISREG(sb.st_mode) ? 1 : S_ISFIFO(sb.st_mode) ? -ESPIPE : -EINVAL;
}

static ppn_status not_regular(const char *path, int reg)
{
    if (reg == -ESPIPE) return ppn_err(PPN_EIO, "%s: is a FIFO, not a regular file", path);
    if (reg == -EINVAL) return ppn_err(PPN_EIO, "%s: is not a regular file", path);
    return ppn_err(PPN_EIO, "%s: cannot open (%s)", path, strerror(-reg));
}

/* BOS and EOS, and add_bos_token / add_eos_token where the config says them (they replace the template, as
 * transformers' Llama tokenizers rebuild the post-processor from them). A missing file: the template alone. */
static ppn_status read_config(load_ctx *c, const char *dir)
{
    ppn_tokenizer *t = c->t;
    snprintf(c->path, sizeof c->path, "%s/tokenizer_config.json", dir);
    t->bos_id = t->eos_id = -1;
    int reg = regular_file(c->path);
    if (reg == -ENOENT) return PPN_OK;
    if (reg < 0) return not_regular(c->path, reg);
    json_error_t je;
    /* Numbers as reals: model_max_length is often 1e30, beyond jansson's integers (ppn reads none of them). */
    json_t *cfg = json_load_file(c->path, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) return ppn_err(PPN_EFORMAT, "%s:%d:%d: %s", c->path, je.line, je.column, je.text);
    ppn_status st = config_token(c, cfg, "bos_token", &t->bos_id);
    if (st == PPN_OK) st = config_token(c, cfg, "eos_token", &t->eos_id);
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    if (st == PPN_OK && (json_is_boolean(ab) || json_is_boolean(ae))) {
        t->pre_ids.n = t->post_ids.n = 0;
        if (json_is_true(ab) && t->bos_id >= 0) st = ppn_tok_ints_push(&t->pre_ids, t->bos_id);
        if (st == PPN_OK && json_is_true(ae) && t->eos_id >= 0) st = ppn_tok_ints_push(&t->post_ids, t->eos_id);
    }
    json_decref(cfg);
    return st;
}

static ppn_status load_root(load_ctx *c, const json_t *root)
{
    ppn_tokenizer *t = c->t;
    json_t *model = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model)) return bad(c, PPN_EFORMAT, "no model object");
    if (added && !json_is_array(added)) return bad(c, PPN_EFORMAT, "added_tokens is not an array");
    PPN_CHECK(max_id(c, json_object_get(model, "vocab"), added, &t->n_ids));
    t->piece = calloc((size_t)t->n_ids + 1, sizeof *t->piece);
    t->piece_len = calloc((size_t)t->n_ids + 1, sizeof *t->piece_len);
    if (!t->piece || !t->piece_len) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    PPN_CHECK(read_model(c, model));
    PPN_CHECK(read_added(c, added));
    PPN_CHECK(read_stages(c, root));
    return read_post(c, root);
}

ppn_status ppn_tok_load_json(ppn_tokenizer *t, const char *dir)
{
    load_ctx c = {.t = t};
    snprintf(c.path, sizeof c.path, "%s/tokenizer.json", dir);
    int reg = regular_file(c.path);
    if (reg < 0) return not_regular(c.path, reg);
    json_error_t je;
    json_t *root = json_load_file(c.path, JSON_ALLOW_NUL, &je);
    if (!root) return ppn_err(PPN_EFORMAT, "%s:%d:%d: %s", c.path, je.line, je.column, je.text);
    ppn_status st = json_is_object(root) ? load_root(&c, root) : bad(&c, PPN_EFORMAT, "not a JSON object");
    json_decref(root);
    return st == PPN_OK ? read_config(&c, dir) : st;
}

void ppn_tok_tables_free(ppn_tokenizer *t)
{
    for (int i = 0; t->piece && i < t->n_ids; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    free(t->vocab.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.merged);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; i < t->n_pre; i++) ppn_tok_pre_free(&t->pre[i]);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t->pre_ids.v);
    free(t->post_ids.v);
}
