/* decode.c - ids back to text: each id's token, then tokenizer.json's decoder steps over the list of tokens
 * (tokenizers' decode_chain: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), then joined. Invalid
 * UTF-8 becomes U+FFFD as Rust's from_utf8_lossy makes it, so the text is always valid UTF-8. The streaming
 * decoder re-decodes a short window and emits only what a full decode would add, held back while the window's
 * text ends in U+FFFD (a character whose bytes have not all come). */
#include <stdlib.h>
#include <string.h>
#include "core/base/err.h"
#include "core/tok/tok.h"

#define REPLACEMENT "\xef\xbf\xbd" /* U+FFFD */

/* How many bytes at s form a valid prefix of one UTF-8 sequence (the maximal subpart), and in *full its
 * length when complete. */
static int utf8_prefix(const unsigned char *s, size_t n, int *full)
{
    unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xbf;
    *full = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (*full <= 1) return *full;
    if (c == 0xe0) lo = 0xa0;
    else if (c == 0xed) hi = 0x9f;
    else if (c == 0xf0) lo = 0x90;
    else if (c == 0xf4) hi = 0x8f;
    int k = 1;
    for (; k < *full && (size_t)k < n; k++) {
        if (s[k] < lo || s[k] > hi) break;
        lo = 0x80, hi = 0xbf;
    }
    return k;
}

int ppn_tok_utf8_len(const unsigned char *s, size_t n)
{
    int full, k = n ? utf8_prefix(s, n, &full) : 0;
    return k && k == full ? k : 0;
}

int ppn_tok_one_char(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n && ppn_tok_utf8_len((const unsigned char *)s, n) == (int)n;
}

int ppn_tok_utf8_put(char *dst, uint32_t cp)
{
    unsigned char *d = (unsigned char *)dst;
    if (cp < 0x80) return d[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return d[0] = (unsigned char)(0xc0 | cp >> 6), d[1] = (unsigned char)(0x80 | (cp & 0x3f)), 2;
    if (cp < 0x10000) {
        d[0] = (unsigned char)(0xe0 | cp >> 12);
        d[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        d[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    d[0] = (unsigned char)(0xf0 | cp >> 18);
    d[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    d[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    d[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

static uint32_t utf8_cp(const unsigned char *s, int k)
{
    if (k == 1) return s[0];
    uint32_t cp = s[0] & (0x7f >> k);
    for (int i = 1; i < k; i++) cp = cp << 6 | (s[i] & 0x3f);
    return cp;
}

/* Append s[0, n) to b, each invalid maximal subpart as one U+FFFD. */
static ppn_status put_lossy(ppn_tok_buf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        int full, k = utf8_prefix((const unsigned char *)s + i, n - i, &full);
        if (k && k == full) PPN_CHECK(ppn_tok_buf_put(b, s + i, (size_t)k));
        else PPN_CHECK(ppn_tok_buf_put(b, REPLACEMENT, 3));
        i += k ? (size_t)k : 1;
    }
    return PPN_OK;
}

/* A token list under construction: token i is out->text[off[2i], +off[2i+1]). */
static ppn_status tok_add(ppn_tok_pieces *out, const char *s, size_t n)
{
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)out->text.len));
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)n));
    return ppn_tok_buf_put(&out->text, s, n);
}

/* Close the token started at start (its text is what was appended since). The text buffer is made even when
 * nothing was appended: readers add a piece's offset to text.p, and NULL + 0 is undefined (UBSan, fuzz_tokenizer:
 * a ByteLevel decoder over no ids). */
static ppn_status tok_close(ppn_tok_pieces *out, size_t start)
{
    PPN_CHECK(ppn_tok_buf_put(&out->text, "", 0));
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)start));
    return ppn_tok_ints_push(&out->off, (int)(out->text.len - start));
}

/* ByteLevel: every token's characters back to bytes (a token with a character outside the alphabet, such as
 * an added token's, keeps its own bytes), all of them then one lossy UTF-8 token. */
static ppn_status dec_bytelevel(const char *s, size_t n, ppn_tok_buf *raw)
{
    size_t mark = raw->len;
    for (size_t i = 0; i < n;) {
        int k = ppn_tok_utf8_len((const unsigned char *)s + i, n - i);
        int b = k ? ppn_tok_cp_byte((int)utf8_cp((const unsigned char *)s + i, k)) : -1;
        if (b < 0) {
            raw->len = mark;
            return ppn_tok_buf_put(raw, s, n);
        }
        unsigned char c = (unsigned char)b;
        PPN_CHECK(ppn_tok_buf_put(raw, &c, 1));
        i += (size_t)k;
    }
    return PPN_OK;
}

/* "<0xAB>" -> 0xAB, else -1. */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    char hex[3] = {s[3], s[4], 0}, *end;
    long v = strtol(hex, &end, 16);
    return *end || !((hex[0] >= '0' && hex[0] <= '9') || (hex[0] >= 'A' && hex[0] <= 'F') ||
                     (hex[0] >= 'a' && hex[0] <= 'f')) ? -1 : (int)v;
}

/* ByteFallback: a run of byte tokens becomes its text when it is valid UTF-8, else one U+FFFD per byte. */
static ppn_status flush_bytes(ppn_tok_pieces *out, ppn_tok_buf *run)
{
    if (!run->len) return PPN_OK;
    size_t start = out->text.len;
    int valid = 1;
    for (size_t i = 0; valid && i < run->len;) {
        int k = ppn_tok_utf8_len((const unsigned char *)run->p + i, run->len - i);
        valid = k > 0;
        i += (size_t)k;
    }
    if (valid) PPN_CHECK(ppn_tok_buf_put(&out->text, run->p, run->len));
    for (size_t i = 0; !valid && i < run->len; i++) PPN_CHECK(ppn_tok_buf_put(&out->text, REPLACEMENT, 3));
    run->len = 0;
    return tok_close(out, start);
}

static ppn_status dec_bytefallback(const ppn_tok_pieces *in, ppn_tok_pieces *out)
{
    ppn_tok_buf run = {0};
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < in->off.n; i += 2) {
        const char *s = in->text.p + in->off.v[i];
        size_t n = (size_t)in->off.v[i + 1];
        int b = byte_token(s, n);
        unsigned char c = (unsigned char)b;
        if (b >= 0) st = ppn_tok_buf_put(&run, &c, 1);
        else if ((st = flush_bytes(out, &run)) == PPN_OK) st = tok_add(out, s, n);
    }
    if (st == PPN_OK) st = flush_bytes(out, &run);
    free(run.p);
    return st;
}

/* Strip: up to start copies of the character from the front of each token, up to stop from its end. */
static ppn_status dec_strip(const ppn_tok_dec *d, const char *s, size_t n, ppn_tok_pieces *out)
{
    size_t k = strlen(d->a);
    for (int i = 0; i < d->start && n >= k && !memcmp(s, d->a, k); i++) s += k, n -= k;
    for (int i = 0; i < d->stop && n >= k && !memcmp(s + n - k, d->a, k); i++) n -= k;
    return tok_add(out, s, n);
}

/* Replace (and Metaspace): every occurrence of from in the token becomes to. */
static ppn_status dec_replace(const char *from, const char *to, const char *s, size_t n, ppn_tok_pieces *out)
{
    size_t start = out->text.len, nf = strlen(from);
    for (size_t i = 0; i < n;) {
        const char *hit = memmem(s + i, n - i, from, nf);
        size_t upto = hit ? (size_t)(hit - s) : n;
        PPN_CHECK(ppn_tok_buf_put(&out->text, s + i, upto - i));
        if (hit) PPN_CHECK(ppn_tok_buf_put(&out->text, to, strlen(to)));
        i = hit ? upto + nf : n;
    }
    return tok_close(out, start);
}

static ppn_status dec_metaspace(const ppn_tok_dec *d, int first, const char *s, size_t n, ppn_tok_pieces *out)
{
    if (first && d->start && n >= 3 && !memcmp(s, "\xe2\x96\x81", 3)) s += 3, n -= 3;
    return dec_replace("\xe2\x96\x81", " ", s, n, out);
}

static ppn_status dec_step(const ppn_tok_dec *d, const ppn_tok_pieces *in, ppn_tok_pieces *out)
{
    if (d->kind == PPN_DEC_BYTEFALLBACK) return dec_bytefallback(in, out);
    ppn_tok_buf whole = {0};
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < in->off.n; i += 2) {
        const char *s = in->text.p + in->off.v[i];
        size_t n = (size_t)in->off.v[i + 1];
        switch (d->kind) {
        case PPN_DEC_BYTELEVEL: st = dec_bytelevel(s, n, &whole); break;
        case PPN_DEC_FUSE: st = ppn_tok_buf_put(&whole, s, n); break;
        case PPN_DEC_STRIP: st = dec_strip(d, s, n, out); break;
        case PPN_DEC_REPLACE: st = dec_replace(d->a, d->b, s, n, out); break;
        case PPN_DEC_METASPACE: st = dec_metaspace(d, i == 0, s, n, out); break;
        default: PPN_ASSERT(0);
        }
    }
    if (st == PPN_OK && d->kind == PPN_DEC_FUSE) st = tok_add(out, whole.p ? whole.p : "", whole.len);
    if (st == PPN_OK && d->kind == PPN_DEC_BYTELEVEL) {
        size_t start = out->text.len;
        st = put_lossy(&out->text, whole.p ? whole.p : "", whole.len);
        if (st == PPN_OK) st = tok_close(out, start);
    }
    free(whole.p);
    return st;
}

ppn_status ppn_tok_decode(const ppn_tokenizer *t, const int *ids, int n, ppn_tok_buf *out)
{
    ppn_tok_pieces cur = {0}, next = {0};
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->piece[ids[i]])
            st = ppn_err(PPN_EINVAL, "detokenize: id %d (position %d) is no token of %s", ids[i], i, t->dir);
        else st = tok_add(&cur, t->piece[ids[i]], t->piece_len[ids[i]]);
    }
    for (int i = 0; st == PPN_OK && i < t->n_dec; i++) {
        st = dec_step(&t->dec[i], &cur, &next);
        ppn_tok_pieces_free(&cur);
        cur = next;
        memset(&next, 0, sizeof next);
    }
    out->len = 0;
    for (int i = 0; st == PPN_OK && i < cur.off.n; i += 2) {
        if (!t->has_decoder && i) st = ppn_tok_buf_put(out, " ", 1);
        if (st == PPN_OK) st = put_lossy(out, cur.text.p + cur.off.v[i], (size_t)cur.off.v[i + 1]);
    }
    if (st == PPN_OK) st = ppn_tok_buf_put(out, "", 0);   /* NUL-terminated even when empty */
    ppn_tok_pieces_free(&cur);
    ppn_tok_pieces_free(&next);
    return st;
}

/* ------------------------------------------------------------------------------------------------------------
 * Streaming (tokenizers' DecodeStream): the window holds the ids whose text is prefix, then the new ones. Each
 * new id's text is the window's decode past prefix. That is exact (the pieces add up to the whole decode) when a
 * token's text does not change once later ids come and a window's edge decodes as it does inside the whole:
 * per-token steps; ByteLevel (a character still missing bytes ends the text in U+FFFD: held until it comes);
 * ByteFallback, whose run of byte tokens is all-or-nothing (valid UTF-8, else one U+FFFD per byte: "<0x41>" reads
 * "A" until "<0xC3>" follows, then both are U+FFFD), so a run is held until a token that ends it; after a Fuse,
 * one-character Replace, Metaspace, Strip from the start; at most one leading character stripped in all (Llama 2's
 * Strip). Every other chain (after a Fuse: a Replace of several characters, a Strip from the end; two or more
 * leading characters stripped; byte tokens that an earlier step could make or unmake) holds every id until a
 * flush: exact, at the flush (fuzz_tokenizer found both kinds of gap, FUZZING.md). */

/* A string that an earlier step could turn a byte token ("<0xAB>") into another text with, or any into one. */
static int touches_byte_tokens(const char *s)
{
    return s && strpbrk(s, "<>x0123456789ABCDEFabcdef") != NULL;
}

/* Which of the two holds a stream over t needs. Leading characters stripped from the text's start (after a Fuse,
 * or a ByteLevel, which also makes one token: a Strip's start, a Metaspace's first space; before one, a Metaspace's
 * first space of the first token) are safe up to one in all: the window's old ids added at least one character
 * when they went out, so one strip cannot reach the new ids' text; two could. */
void ppn_tok_stream_mode(const ppn_tokenizer *t, int *hold_all, int *hold_bytes)
{
    int fused = 0, bytes_safe = 1, lead = 0;
    *hold_all = *hold_bytes = 0;
    for (int i = 0; i < t->n_dec; i++) {
        const ppn_tok_dec *d = &t->dec[i];
        switch (d->kind) {
        case PPN_DEC_BYTEFALLBACK:
            if (fused || !bytes_safe) *hold_all = 1;
            *hold_bytes = 1;
            break;
        case PPN_DEC_BYTELEVEL:
            if (*hold_bytes) *hold_all = 1; /* bytes from both: no real tokenizer does this */
            bytes_safe = 0;
            fused = 1;
            break;
        case PPN_DEC_FUSE: fused = 1; break;
        case PPN_DEC_STRIP:
            if (fused && d->stop > 0) *hold_all = 1;
            if (fused) lead += d->start;
            bytes_safe &= !touches_byte_tokens(d->a);
            break;
        case PPN_DEC_REPLACE:
            if (fused && !ppn_tok_one_char(d->a)) *hold_all = 1;
            bytes_safe &= !touches_byte_tokens(d->a) && !touches_byte_tokens(d->b);
            break;
        case PPN_DEC_METASPACE: lead += d->start != 0; break; /* U+2581 -> ' ', and the first one of the text */
        }
    }
    if (lead > 1) *hold_all = 1;
    if (*hold_all) *hold_bytes = 0;
}

static int ends_replacement(const ppn_tok_buf *b)
{
    return b->len >= 3 && !memcmp(b->p + b->len - 3, REPLACEMENT, 3);
}

/* The window's text begins with prefix (an empty prefix may have no buffer yet: memcmp takes none). */
static int text_extends_prefix(const ppn_detok_stream *s)
{
    return s->text.len >= s->prefix.len && (!s->prefix.len || !memcmp(s->text.p, s->prefix.p, s->prefix.len));
}

/* Emit text past prefix; the window then starts at the ids that were new last time. */
static ppn_status stream_emit(ppn_detok_stream *s)
{
    ppn_tok_ints *w = &s->ids;
    int keep = w->n - s->prefix_index;
    s->out.len = 0;
    PPN_CHECK(ppn_tok_buf_put(&s->out, s->text.p + s->prefix.len, s->text.len - s->prefix.len));
    memmove(w->v, w->v + s->prefix_index, (size_t)keep * sizeof *w->v);
    w->n = keep;
    PPN_CHECK(ppn_tok_decode(s->tok, w->v, w->n, &s->prefix));
    s->prefix_index = keep;
    return PPN_OK;
}

/* hold_all: every id is kept and nothing goes out before a flush, which emits the whole decode past what earlier
 * flushes emitted (prefix holds it; ids[0, prefix_index) are the ids flushed). A chain that changed the flushed
 * text's end gives the later ids' own decode: a flush in the middle is final for what it emitted. */
static ppn_status stream_flush_all(ppn_detok_stream *s)
{
    PPN_CHECK(ppn_tok_decode(s->tok, s->ids.v, s->ids.n, &s->text));
    if (text_extends_prefix(s))
        PPN_CHECK(ppn_tok_buf_put(&s->out, s->text.p + s->prefix.len, s->text.len - s->prefix.len));
    else {
        ppn_tok_buf late = {0};
        ppn_status st = ppn_tok_decode(s->tok, s->ids.v + s->prefix_index, s->ids.n - s->prefix_index, &late);
        if (st == PPN_OK) st = ppn_tok_buf_put(&s->out, late.p, late.len);
        free(late.p);
        PPN_CHECK(st);
    }
    s->prefix.len = 0;
    PPN_CHECK(ppn_tok_buf_put(&s->prefix, s->text.p, s->text.len));
    s->prefix_index = s->ids.n;
    return ppn_tok_buf_put(&s->out, "", 0);
}

ppn_status ppn_tok_stream_step(ppn_detok_stream *s, int id, int flush)
{
    s->out.len = 0;
    PPN_CHECK(ppn_tok_buf_put(&s->out, "", 0));
    if (!flush) {
        if (id < 0 || id >= s->tok->n_ids || !s->tok->piece[id])
            return ppn_err(PPN_EINVAL, "detokenize: id %d is no token of %s", id, s->tok->dir);
        PPN_CHECK(ppn_tok_ints_push(&s->ids, id));
        if (s->hold_all) return PPN_OK;
        if (s->hold_bytes && byte_token(s->tok->piece[id], (size_t)s->tok->piece_len[id]) >= 0) return PPN_OK;
    } else if (s->hold_all)
        return stream_flush_all(s);
    PPN_CHECK(ppn_tok_decode(s->tok, s->ids.v, s->ids.n, &s->text));
    if (s->text.len <= s->prefix.len || (!flush && ends_replacement(&s->text))) return PPN_OK;
    if (!text_extends_prefix(s)) return PPN_OK; /* a decoder whose earlier text changed: hold on */
    return stream_emit(s);
}
