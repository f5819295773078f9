/* tmpl_str.c - Python's text forms of template values: str() (what {{ }} prints), repr() (inside lists and
 * dicts), json.dumps (transformers' tojson: insertion order, ensure_ascii off, ", " / ": " separators), float
 * repr (the shortest string that reads back), and Unicode whitespace as str.isspace() sees it (the `-` markers
 * and trim strip it all). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/err.h"
#include "core/tok/tmpl.h"

static int is_ws_cp(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static uint32_t cp_at(const unsigned char *s, int k)
{
    if (k == 1) return s[0];
    uint32_t c = s[0] & (0xff >> (k + 1));
    for (int i = 1; i < k; i++) c = c << 6 | (s[i] & 0x3f);
    return c;
}

size_t ppn_tmpl_ws(const char *s, size_t n)
{
    if (!n) return 0;
    int k = ppn_tok_utf8_len((const unsigned char *)s, n);
    return k && is_ws_cp(cp_at((const unsigned char *)s, k)) ? (size_t)k : 0;
}

size_t ppn_tmpl_ws_back(const char *s, size_t n)
{
    size_t start = n;
    while (start > 0 && n - start < 4 && ((unsigned char)s[start - 1] & 0xc0) == 0x80) start--;
    if (start > 0) start--;
    return ppn_tmpl_ws(s + start, n - start) == n - start ? n - start : 0;
}

static ppn_status put(ppn_tok_buf *b, const char *s) { return ppn_tok_buf_put(b, s, strlen(s)); }

/* Python's repr(float): the shortest digits that read back, fixed between 1e-4 and 1e16, else exponent. */
static ppn_status put_float(ppn_tok_buf *b, double x, int json)
{
    if (isnan(x)) return put(b, json ? "NaN" : "nan");
    if (isinf(x)) return put(b, x > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    char digits[24];   /* e is [-]d[.ddd]e[+-]xx */
    int nd = 0, neg = e[0] == '-';
    const char *q = e + neg;
    for (; *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    int exp = atoi(q + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = -1; i > exp; i--) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp + 1)
                for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    return put(b, out);
}

static ppn_status put_int(ppn_tok_buf *b, json_int_t v)
{
    char s[32];
    snprintf(s, sizeof s, "%" JSON_INTEGER_FORMAT, v);
    return put(b, s);
}

ppn_status ppn_tmpl_str(ppn_tok_buf *b, const json_t *v)
{
    if (!v) return PPN_OK;
    if (json_is_string(v)) return ppn_tok_buf_put(b, json_string_value(v), json_string_length(v));
    return ppn_tmpl_repr(b, v);
}

static ppn_status repr_string(ppn_tok_buf *b, const char *s, size_t n)
{
    int has_single = memchr(s, '\'', n) != NULL, has_double = memchr(s, '"', n) != NULL;
    char q = has_single && !has_double ? '"' : '\'';
    PPN_CHECK(ppn_tok_buf_put(b, &q, 1));
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8] = {0};
        if (c == '\\' || c == (unsigned char)q) snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\x%02x", c);
        PPN_CHECK(esc[0] ? put(b, esc) : ppn_tok_buf_put(b, s + i, 1));
    }
    return ppn_tok_buf_put(b, &q, 1);
}

ppn_status ppn_tmpl_repr(ppn_tok_buf *b, const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return repr_string(b, json_string_value(v), json_string_length(v));
    case JSON_INTEGER: return put_int(b, json_integer_value(v));
    case JSON_REAL: return put_float(b, json_real_value(v), 0);
    case JSON_TRUE: return put(b, "True");
    case JSON_FALSE: return put(b, "False");
    case JSON_NULL: return put(b, "None");
    case JSON_ARRAY: {
        PPN_CHECK(put(b, "["));
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) PPN_CHECK(put(b, ", "));
            PPN_CHECK(ppn_tmpl_repr(b, json_array_get(v, i)));
        }
        return put(b, "]");
    }
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        PPN_CHECK(put(b, "{"));
        json_object_foreach((json_t *)v, k, x) {
            if (!first) PPN_CHECK(put(b, ", "));
            first = 0;
            PPN_CHECK(repr_string(b, k, strlen(k)));
            PPN_CHECK(put(b, ": "));
            PPN_CHECK(ppn_tmpl_repr(b, x));
        }
        return put(b, "}");
    }
    }
    return PPN_OK;
}

/* json.dumps' string: ", \, and control characters escaped (\u00XX lowercase); ensure_ascii also escapes
 * every non-ASCII character (as a surrogate pair above U+FFFF). */
static ppn_status dump_string(ppn_tok_buf *b, const char *s, size_t n, int ensure_ascii)
{
    PPN_CHECK(put(b, "\""));
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        char esc[16] = {0};
        size_t k = 1;
        if (c == '"') strcpy(esc, "\\\"");
        else if (c == '\\') strcpy(esc, "\\\\");
        else if (c == '\n') strcpy(esc, "\\n");
        else if (c == '\r') strcpy(esc, "\\r");
        else if (c == '\t') strcpy(esc, "\\t");
        else if (c == '\b') strcpy(esc, "\\b");
        else if (c == '\f') strcpy(esc, "\\f");
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else if (c >= 0x80 && ensure_ascii) {
            int len = ppn_tok_utf8_len((const unsigned char *)s + i, n - i);
            k = len ? (size_t)len : 1;
            uint32_t cp = len ? cp_at((const unsigned char *)s + i, len) : 0xfffd;
            if (cp >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
            else
                snprintf(esc, sizeof esc, "\\u%04x", cp);
        }
        PPN_CHECK(esc[0] ? put(b, esc) : ppn_tok_buf_put(b, s + i, 1));
        i += k;
    }
    return put(b, "\"");
}

static ppn_status json_newline(ppn_tok_buf *b, const tmpl_json_opts *o, int depth)
{
    PPN_CHECK(put(b, "\n"));
    for (int i = 0; i < depth; i++) {
        if (o->indent_is_str) PPN_CHECK(put(b, o->indent_str));
        for (int j = 0; !o->indent_is_str && j < o->indent; j++) PPN_CHECK(put(b, " "));
    }
    return PPN_OK;
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static ppn_status json_object_dump(ppn_tok_buf *b, const json_t *v, const tmpl_json_opts *o, int depth)
{
    size_t n = json_object_size(v), i = 0;
    if (!n) return put(b, "{}");
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return ppn_err(PPN_ENOMEM, "chat template: out of memory");
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) keys[i++] = k;
    if (o->sort_keys) qsort(keys, n, sizeof *keys, key_cmp);
    ppn_status st = put(b, "{");
    int pretty = o->indent >= 0 || o->indent_is_str;
    for (i = 0; st == PPN_OK && i < n; i++) {
        if (i) st = put(b, o->item_sep);
        if (st == PPN_OK && pretty) st = json_newline(b, o, depth + 1);
        if (st == PPN_OK) st = dump_string(b, keys[i], strlen(keys[i]), o->ensure_ascii);
        if (st == PPN_OK) st = put(b, o->key_sep);
        if (st == PPN_OK) st = ppn_tmpl_json(b, json_object_get(v, keys[i]), o, depth + 1);
    }
    if (st == PPN_OK && pretty) st = json_newline(b, o, depth);
    if (st == PPN_OK) st = put(b, "}");
    free(keys);
    return st;
}

ppn_status ppn_tmpl_json(ppn_tok_buf *b, const json_t *v, const tmpl_json_opts *o, int depth)
{
    if (!v) return ppn_err(PPN_EINVAL, "tojson: Object of type Undefined is not JSON serializable");
    switch (json_typeof(v)) {
    case JSON_STRING: return dump_string(b, json_string_value(v), json_string_length(v), o->ensure_ascii);
    case JSON_INTEGER: return put_int(b, json_integer_value(v));
    case JSON_REAL: return put_float(b, json_real_value(v), 1);
    case JSON_TRUE: return put(b, "true");
    case JSON_FALSE: return put(b, "false");
    case JSON_NULL: return put(b, "null");
    case JSON_OBJECT: return json_object_dump(b, v, o, depth);
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        if (!n) return put(b, "[]");
        int pretty = o->indent >= 0 || o->indent_is_str;
        PPN_CHECK(put(b, "["));
        for (size_t i = 0; i < n; i++) {
            if (i) PPN_CHECK(put(b, o->item_sep));
            if (pretty) PPN_CHECK(json_newline(b, o, depth + 1));
            PPN_CHECK(ppn_tmpl_json(b, json_array_get(v, i), o, depth + 1));
        }
        if (pretty) PPN_CHECK(json_newline(b, o, depth));
        return put(b, "]");
    }
    }
    return PPN_OK;
}
