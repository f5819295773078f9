/* pretok.c - the normalizer (NFC through utf8proc, Prepend, Replace) and the pre-tokenizer (regex Split and
 * ByteLevel through PCRE2 with UTF and Unicode properties, Metaspace): one text segment into the pieces BPE
 * merges within. The regexes are tokenizer.json's own (Llama 3, Qwen2) or GPT-2's (ByteLevel's use_regex). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "core/base/err.h"
#include "core/tok/tok.h"

const char ppn_tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define METASPACE "\xe2\x96\x81" /* U+2581, SentencePiece's space */

ppn_status ppn_tok_buf_put(ppn_tok_buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory (%zu bytes)", cap);
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return PPN_OK;
}

ppn_status ppn_tok_ints_push(ppn_tok_ints *a, int x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 16;
        int *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = x;
    return PPN_OK;
}

void ppn_tok_pieces_free(ppn_tok_pieces *p)
{
    free(p->text.p);
    free(p->off.v);
    memset(p, 0, sizeof *p);
}

ppn_status ppn_tok_regex_compile(const char *pattern, ppn_tok_pre *p)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return ppn_err(PPN_EUNSUPPORTED, "regex '%s' at offset %zu: %s", pattern, (size_t)at, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* faster where JIT exists; the interpreter otherwise */
    p->re = re;
    return PPN_OK;
}

void ppn_tok_pre_free(ppn_tok_pre *p)
{
    pcre2_code_free(p->re);
    p->re = NULL;
}

/* ------------------------------------------------------------------------------------------------------------
 * Normalizers */

static ppn_status nfc(ppn_tok_buf *b)
{
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)b->p, (utf8proc_ssize_t)b->len, &out,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return ppn_err(PPN_EINVAL, "tokenizer: NFC: %s", utf8proc_errmsg(n));
    b->len = 0;
    ppn_status st = ppn_tok_buf_put(b, out, (size_t)n);
    free(out);
    return st;
}

static ppn_status replace_all(ppn_tok_buf *b, const char *from, const char *to)
{
    ppn_tok_buf r = {0};
    size_t nf = strlen(from), nt = strlen(to), i = 0;
    ppn_status st = PPN_OK;
    while (st == PPN_OK && i < b->len) {
        const char *hit = nf <= b->len - i ? memmem(b->p + i, b->len - i, from, nf) : NULL;
        size_t upto = hit ? (size_t)(hit - b->p) : b->len;
        st = ppn_tok_buf_put(&r, b->p + i, upto - i);
        if (st == PPN_OK && hit) st = ppn_tok_buf_put(&r, to, nt);
        i = hit ? upto + nf : b->len;
    }
    if (st == PPN_OK) st = ppn_tok_buf_put(&r, "", 0);
    if (st != PPN_OK) {
        free(r.p);
        return st;
    }
    free(b->p);
    *b = r;
    return PPN_OK;
}

/* Prepend only to a non-empty text, as tokenizers' Prepend does. */
static ppn_status prepend(ppn_tok_buf *b, const char *s)
{
    if (!b->len) return PPN_OK;
    ppn_tok_buf r = {0};
    ppn_status st = ppn_tok_buf_put(&r, s, strlen(s));
    if (st == PPN_OK) st = ppn_tok_buf_put(&r, b->p, b->len);
    if (st != PPN_OK) {
        free(r.p);
        return st;
    }
    free(b->p);
    *b = r;
    return PPN_OK;
}

ppn_status ppn_tok_normalize(const ppn_tokenizer *t, const char *s, size_t n, ppn_tok_buf *dst)
{
    dst->len = 0;
    PPN_CHECK(ppn_tok_buf_put(dst, s, n));
    for (int i = 0; i < t->n_norm; i++) {
        const ppn_tok_norm *m = &t->norm[i];
        if (m->kind == PPN_NORM_NFC) PPN_CHECK(nfc(dst));
        else if (m->kind == PPN_NORM_PREPEND) PPN_CHECK(prepend(dst, m->a));
        else PPN_CHECK(replace_all(dst, m->a, m->b));
    }
    return PPN_OK;
}

/* ------------------------------------------------------------------------------------------------------------
 * Pre-tokenizers: each step maps the list of pieces to a new list. */

static ppn_status emit(ppn_tok_pieces *out, const char *s, size_t n)
{
    if (!n) return PPN_OK;
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)out->text.len));
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)n));
    return ppn_tok_buf_put(&out->text, s, n);
}

/* The matches of re in s, and the text between them, as pieces (tokenizers' Split, behavior Isolated). */
static ppn_status split_isolated(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n,
                                 ppn_tok_pieces *out)
{
    size_t pos = 0, last = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return ppn_err(PPN_EINVAL, "tokenizer: regex match failed (PCRE2 error %d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {   /* an empty match: step over one character */
            int k = ppn_tok_utf8_len((const unsigned char *)s + ov[0], n - ov[0]);
            pos = ov[0] + (k ? (size_t)k : 1);
            continue;
        }
        PPN_CHECK(emit(out, s + last, ov[0] - last));
        PPN_CHECK(emit(out, s + ov[0], ov[1] - ov[0]));
        last = pos = ov[1];
    }
    return emit(out, s + last, n - last);
}

/* Each byte as its character of the byte-level alphabet. */
static ppn_status byte_map(ppn_tok_pieces *out, const char *s, size_t n)
{
    char tmp[8];
    PPN_CHECK(ppn_tok_ints_push(&out->off, (int)out->text.len));
    for (size_t i = 0; i < n; i++) {
        int k = ppn_tok_utf8_put(tmp, (uint32_t)ppn_tok_byte_cp((unsigned char)s[i]));
        PPN_CHECK(ppn_tok_buf_put(&out->text, tmp, (size_t)k));
    }
    return ppn_tok_ints_push(&out->off, (int)out->text.len - out->off.v[out->off.n - 1]);
}

/* ByteLevel on one piece: a space before it (add_prefix_space), GPT-2's split (use_regex), then the mapping. */
static ppn_status byte_level(const ppn_tok_pre *p, pcre2_match_data *md, const char *s, size_t n,
                             ppn_tok_pieces *out)
{
    ppn_tok_buf spaced = {0};
    ppn_tok_pieces split = {0};
    ppn_status st = PPN_OK;
    if (p->prefix_space && n && s[0] != ' ') {
        st = ppn_tok_buf_put(&spaced, " ", 1);
        if (st == PPN_OK) st = ppn_tok_buf_put(&spaced, s, n);
        s = spaced.p, n = spaced.len;
    }
    if (st == PPN_OK && p->re) st = split_isolated(p->re, md, s, n, &split);
    else if (st == PPN_OK) st = emit(&split, s, n);
    for (int i = 0; st == PPN_OK && i < split.off.n; i += 2)
        st = byte_map(out, split.text.p + split.off.v[i], (size_t)split.off.v[i + 1]);
    free(spaced.p);
    ppn_tok_pieces_free(&split);
    return st;
}

/* Metaspace: spaces become U+2581, and one goes in front where the scheme says (not twice). */
static ppn_status metaspace(const ppn_tok_pre *p, int first, const char *s, size_t n, ppn_tok_pieces *out)
{
    ppn_tok_buf b = {0};
    ppn_status st = ppn_tok_buf_put(&b, s, n);
    if (st == PPN_OK) st = replace_all(&b, " ", METASPACE);
    int add = p->prefix_space == 1 || (p->prefix_space == 2 && first);
    if (st == PPN_OK && add && b.len && (b.len < 3 || memcmp(b.p, METASPACE, 3))) st = prepend(&b, METASPACE);
    if (st == PPN_OK) st = emit(out, b.p, b.len);
    free(b.p);
    return st;
}

static ppn_status pre_step(const ppn_tok_pre *p, int first, const ppn_tok_pieces *in, ppn_tok_pieces *out)
{
    pcre2_match_data *md = p->re ? pcre2_match_data_create_from_pattern(p->re, NULL) : NULL;
    if (p->re && !md) return ppn_err(PPN_ENOMEM, "tokenizer: out of memory");
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < in->off.n; i += 2) {
        const char *s = in->text.p + in->off.v[i];
        size_t n = (size_t)in->off.v[i + 1];
        if (p->kind == PPN_PRE_SPLIT) st = split_isolated(p->re, md, s, n, out);
        else if (p->kind == PPN_PRE_BYTELEVEL) st = byte_level(p, md, s, n, out);
        else st = metaspace(p, first && i == 0, s, n, out);
    }
    pcre2_match_data_free(md);
    return st;
}

ppn_status ppn_tok_pretokenize(const ppn_tokenizer *t, const char *s, size_t n, int first, ppn_tok_pieces *out)
{
    ppn_tok_pieces cur = {0}, next = {0};
    ppn_status st = emit(&cur, s, n);
    for (int i = 0; st == PPN_OK && i < t->n_pre; i++) {
        st = pre_step(&t->pre[i], first, &cur, &next);
        ppn_tok_pieces_free(&cur);
        cur = next;
        memset(&next, 0, sizeof next);
    }
    ppn_tok_pieces_free(&next);
    if (st != PPN_OK) {
        ppn_tok_pieces_free(&cur);
        return st;
    }
    ppn_tok_pieces_free(out);
    *out = cur;
    return PPN_OK;
}
