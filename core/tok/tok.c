/* tok.c - the public tokenizer calls (ppn.h): load, encode (added tokens split out of the raw text first, then
 * normalizer, pre-tokenizer and BPE on each segment between them, then the special tokens around), decode and
 * the streaming decoder. */
#include <stdlib.h>
#include <string.h>
#include "core/base/err.h"
#include "core/tok/tok.h"

ppn_status ppn_tokenizer_load(const char *dir, ppn_tokenizer **out)
{
    if (!dir || !out) return ppn_err(PPN_EINVAL, "ppn_tokenizer_load: NULL argument");
    *out = NULL;
    ppn_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->dir = strdup(dir))) {
        free(t);
        return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    }
    ppn_status st = ppn_tok_load_json(t, dir);
    if (st != PPN_OK) {
        ppn_tokenizer_free(t);
        return st;
    }
    *out = t;
    return PPN_OK;
}

void ppn_tokenizer_free(ppn_tokenizer *tok)
{
    if (!tok) return;
    ppn_tok_tables_free(tok);
    free(tok->dir);
    free(tok);
}

int ppn_tokenizer_bos(const ppn_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int ppn_tokenizer_eos(const ppn_tokenizer *tok) { return tok ? tok->eos_id : -1; }
int ppn_tokenizer_n_ids(const ppn_tokenizer *tok) { return tok ? tok->n_ids : 0; }

/* The added token matching at s (the longest one), or NULL. */
static const ppn_tok_added *added_at(const ppn_tokenizer *t, const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    if (!(t->added_first[c >> 3] & (1u << (c & 7)))) return NULL;
    const ppn_tok_added *best = NULL;
    for (int i = 0; i < t->n_added; i++) {
        const ppn_tok_added *a = &t->added[i];
        if (a->len <= n && (!best || a->len > best->len) && !memcmp(s, a->content, a->len)) best = a;
    }
    return best;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Normalizer, pre-tokenizer and BPE on one segment of text between added tokens. */
static ppn_status encode_segment(const ppn_tokenizer *t, const char *s, size_t n, int first, ppn_tok_ints *ids)
{
    if (!n) return PPN_OK;
    ppn_tok_buf norm = {0};
    ppn_tok_pieces pieces = {0};
    ppn_status st = ppn_tok_normalize(t, s, n, &norm);
    if (st == PPN_OK) st = ppn_tok_pretokenize(t, norm.p, norm.len, first, &pieces);
    for (int i = 0; st == PPN_OK && i < pieces.off.n; i += 2)
        st = ppn_tok_bpe_word(t, pieces.text.p + pieces.off.v[i], (size_t)pieces.off.v[i + 1], ids);
    free(norm.p);
    ppn_tok_pieces_free(&pieces);
    return st;
}

/* Leftmost-longest added-token matches split the raw text (tokenizers' default, split_special_tokens false);
 * lstrip / rstrip take the whitespace beside a match into it. */
static ppn_status encode_text(const ppn_tokenizer *t, const char *s, size_t n, ppn_tok_ints *ids)
{
    size_t seg = 0;
    for (size_t i = 0; i < n;) {
        const ppn_tok_added *a = added_at(t, s + i, n - i);
        if (!a) {
            i++;
            continue;
        }
        size_t end = i, next = i + a->len;
        if (a->lstrip)
            while (end > seg && is_space(s[end - 1])) end--;
        PPN_CHECK(encode_segment(t, s + seg, end - seg, seg == 0, ids));
        PPN_CHECK(ppn_tok_ints_push(ids, a->id));
        if (a->rstrip)
            while (next < n && is_space(s[next])) next++;
        seg = i = next;
    }
    return encode_segment(t, s + seg, n - seg, seg == 0, ids);
}

static ppn_status check_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int k = ppn_tok_utf8_len((const unsigned char *)s + i, n - i);
        if (!k) return ppn_err(PPN_EINVAL, "tokenize: the text is not valid UTF-8 (byte %zu)", i);
        i += (size_t)k;
    }
    return PPN_OK;
}

ppn_status ppn_tokenize(const ppn_tokenizer *tok, const char *text, size_t len, int add_special, int *ids, int cap,
                        int *n)
{
    if (!tok || (!text && len) || !n || cap < 0 || (cap && !ids))
        return ppn_err(PPN_EINVAL, "ppn_tokenize: NULL argument or negative cap");
    *n = 0;
    PPN_CHECK(check_utf8(text, len));
    ppn_tok_ints v = {0};
    ppn_status st = PPN_OK;
    for (int i = 0; add_special && st == PPN_OK && i < tok->pre_ids.n; i++) st = ppn_tok_ints_push(&v, tok->pre_ids.v[i]);
    if (st == PPN_OK) st = encode_text(tok, text, len, &v);
    for (int i = 0; add_special && st == PPN_OK && i < tok->post_ids.n; i++)
        st = ppn_tok_ints_push(&v, tok->post_ids.v[i]);
    if (st == PPN_OK) {
        *n = v.n;
        if (v.n && cap) memcpy(ids, v.v, (size_t)(v.n < cap ? v.n : cap) * sizeof *ids); /* cap 0: sizing only */
        if (v.n > cap) st = ppn_err(PPN_EINVAL, "ppn_tokenize: %d ids do not fit in %d", v.n, cap);
    }
    free(v.v);
    return st;
}

ppn_status ppn_detokenize(const ppn_tokenizer *tok, const int *ids, int n, char *buf, size_t cap, size_t *len)
{
    if (!tok || (!ids && n) || n < 0 || !len || (cap && !buf))
        return ppn_err(PPN_EINVAL, "ppn_detokenize: NULL argument or negative count");
    *len = 0;
    ppn_tok_buf text = {0};
    ppn_status st = ppn_tok_decode(tok, ids, n, &text);
    if (st == PPN_OK) {
        *len = text.len;
        if (cap) {
            size_t k = text.len < cap - 1 ? text.len : cap - 1;
            if (k) memcpy(buf, text.p, k); /* an empty text may have no buffer */
            buf[k] = '\0';
        }
        if (text.len >= cap)
            st = ppn_err(PPN_EINVAL, "ppn_detokenize: %zu bytes and the NUL do not fit in %zu", text.len, cap);
    }
    free(text.p);
    return st;
}

ppn_status ppn_detok_stream_create(const ppn_tokenizer *tok, ppn_detok_stream **out)
{
    if (!tok || !out) return ppn_err(PPN_EINVAL, "ppn_detok_stream_create: NULL argument");
    if (!(*out = calloc(1, sizeof **out))) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    (*out)->tok = tok;
    ppn_tok_stream_mode(tok, &(*out)->hold_all, &(*out)->hold_bytes);
    return PPN_OK;
}

static ppn_status stream_call(ppn_detok_stream *s, int id, int flush, const char **text, size_t *len)
{
    if (!s || !text || !len) return ppn_err(PPN_EINVAL, "ppn_detok_stream: NULL argument");
    *text = "";
    *len = 0;
    PPN_CHECK(ppn_tok_stream_step(s, id, flush));
    *text = s->out.p;
    *len = s->out.len;
    return PPN_OK;
}

ppn_status ppn_detok_stream_push(ppn_detok_stream *s, int id, const char **text, size_t *len)
{
    return stream_call(s, id, 0, text, len);
}

ppn_status ppn_detok_stream_flush(ppn_detok_stream *s, const char **text, size_t *len)
{
    return stream_call(s, -1, 1, text, len);
}

void ppn_detok_stream_free(ppn_detok_stream *s)
{
    if (!s) return;
    free(s->ids.v);
    free(s->prefix.p);
    free(s->text.p);
    free(s->out.p);
    free(s);
}
