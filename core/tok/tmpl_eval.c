/* tmpl_eval.c - rendering a parsed chat template. Values are jansson values with Python's semantics (equality
 * across int/float/bool, truthiness, negative indices, slices, `in`); NULL is Jinja's undefined: it prints as
 * nothing, is false, iterates as empty, and fails any operator or attribute access, as jinja2's Undefined does.
 * Scopes: the globals (the caller's variables; a top-level `set` goes there), then one frame per loop
 * iteration holding `loop`, the loop targets and the body's `set`s. A template's raise_exception() surfaces as
 * PPN_EINVAL with exactly its message; other runtime errors (a type error, an undefined operand) are PPN_EINVAL
 * with the line. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>
#include "core/base/err.h"
#include "core/tok/tmpl.h"

typedef struct rctx {
    const ppn_tmpl *t;
    json_t **frames;     /* frames[0]: the globals */
    int n_frames, cap_frames;
    json_t *namespaces;  /* every namespace() made: only these take `set ns.attr` */
    json_t *undef;       /* stored in a frame for a variable set to an undefined value */
    int ctl;             /* 1 break, 2 continue: pending loop control */
} rctx;

static ppn_status fail(const rctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ppn_status fail(const rctx *c, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ppn_err(PPN_EINVAL, "%s line %d: %s", c->t->name, line, msg);
}

static ppn_status refuse(const rctx *c, int line, const char *what)
{
    return ppn_err(PPN_EUNSUPPORTED, "%s line %d: %s is not implemented", c->t->name, line, what);
}

static ppn_status nomem(void) { return ppn_err(PPN_ENOMEM, "chat template: out of memory"); }

/* Python's integers have no bound; ppn's are 64-bit: a result past them is refused, never wrapped. */
static ppn_status int_overflow(const rctx *c, int line, const char *op)
{
    return ppn_err(PPN_EUNSUPPORTED, "%s line %d: an integer result of '%s' beyond 64 bits is not implemented",
                   c->t->name, line, op);
}

/* A float result as a value: Python's inf and nan have no JSON form here (jansson refuses them), so a result
 * that is not finite is refused by name rather than reported as a lack of memory. */
static ppn_status make_real(const rctx *c, int line, const char *op, double d, json_t **out)
{
    if (!isfinite(d))
        return ppn_err(PPN_EUNSUPPORTED, "%s line %d: a float result of '%s' that is not finite (%g) is not implemented",
                       c->t->name, line, op, d);
    return (*out = json_real(d)) ? PPN_OK : nomem();
}

/* The largest string (bytes) or list (items) a repetition or range builds: a template renders a prompt. */
#define TMPL_MAX_BUILD 1000000

static const char *type_name(const json_t *v)
{
    if (!v) return "Undefined";
    switch (json_typeof(v)) {
    case JSON_STRING: return "str";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    case JSON_NULL: return "NoneType";
    case JSON_ARRAY: return "list";
    default: return "dict";
    }
}

/* ---- Python semantics ---- */

static int truthy(const json_t *v)
{
    if (!v) return 0;
    switch (json_typeof(v)) {
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_TRUE: return 1;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_OBJECT: return json_object_size(v) > 0;
    default: return 0;
    }
}

/* Whether v is a number (bool counts, as in Python); *f set when it is a float. */
static int number(const json_t *v, int *f, json_int_t *i, double *d)
{
    if (!v) return 0;
    *f = json_is_real(v);
    if (json_is_boolean(v)) *i = json_is_true(v);
    else if (json_is_integer(v)) *i = json_integer_value(v);
    else if (!*f) return 0;
    *d = *f ? json_real_value(v) : (double)*i;
    return 1;
}

static int py_eq(const json_t *a, const json_t *b)
{
    if (!a || !b) return a == b;
    int fa, fb;
    json_int_t ia, ib;
    double da, db;
    if (number(a, &fa, &ia, &da) && number(b, &fb, &ib, &db)) return fa || fb ? da == db : ia == ib;
    if (json_typeof(a) != json_typeof(b)) return 0;
    if (json_is_string(a))
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!py_eq(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return 0;
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)a, k, x) if (!py_eq(x, json_object_get(b, k))) return 0;
        return 1;
    }
    return 1;   /* null */
}

/* The code points of a string as byte offsets: off[i] is where character i starts, off[n] the end. */
static ppn_status char_offsets(const json_t *s, size_t **off, size_t *n)
{
    const unsigned char *p = (const unsigned char *)json_string_value(s);
    size_t len = json_string_length(s), k = 0;
    if (!(*off = malloc((len + 1) * sizeof **off))) return nomem();
    for (size_t i = 0; i < len;) {
        (*off)[k++] = i;
        int l = ppn_tok_utf8_len(p + i, len - i);
        i += l ? (size_t)l : 1;
    }
    (*off)[k] = len;
    *n = k;
    return PPN_OK;
}

static json_t *substr(const json_t *s, size_t from, size_t to)
{
    return json_stringn_nocheck(json_string_value(s) + from, to - from);
}

/* A list to iterate: a list itself, a dict's keys, a string's characters; undefined is empty. */
static ppn_status iter_list(const rctx *c, int line, json_t *v, json_t **out)
{
    *out = NULL;
    if (!v) return (*out = json_array()) ? PPN_OK : nomem();
    if (json_is_array(v)) {
        *out = json_incref(v);
        return PPN_OK;
    }
    json_t *a = json_array();
    if (!a) return nomem();
    if (json_is_object(v)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) json_array_append_new(a, json_string_nocheck(k));
    } else if (json_is_string(v)) {
        size_t *off, n;
        if (char_offsets(v, &off, &n) != PPN_OK) {
            json_decref(a);
            return nomem();
        }
        for (size_t i = 0; i < n; i++) json_array_append_new(a, substr(v, off[i], off[i + 1]));
        free(off);
    } else {
        json_decref(a);
        return fail(c, line, "'%s' object is not iterable", type_name(v));
    }
    *out = a;
    return PPN_OK;
}

/* Python's slice.indices for a sequence of n. */
static void slice_indices(json_t *start, json_t *stop, json_t *step, long n, long *s0, long *s1, long *st)
{
    *st = step && json_is_integer(step) ? (long)json_integer_value(step) : 1;
    long lo = *st < 0 ? -1 : 0, hi = *st < 0 ? n - 1 : n;
    long def0 = *st < 0 ? hi : lo, def1 = *st < 0 ? lo : hi;
    long v[2] = {def0, def1};
    json_t *in[2] = {start, stop};
    for (int i = 0; i < 2; i++) {
        if (!in[i] || !json_is_integer(in[i])) continue;
        long x = (long)json_integer_value(in[i]);
        if (x < 0) x += n;
        v[i] = x < lo ? lo : x > hi ? hi : x;
    }
    *s0 = v[0];
    *s1 = v[1];
}

static ppn_status do_slice(const rctx *c, int line, json_t *v, json_t *a, json_t *b, json_t *step, json_t **out)
{
    if (step && json_is_integer(step) && !json_integer_value(step)) return fail(c, line, "slice step cannot be zero");
    for (int i = 0; i < 3; i++) {
        json_t *x = i == 0 ? a : i == 1 ? b : step;
        if (x && !json_is_integer(x) && !json_is_null(x))
            return fail(c, line, "slice indices must be integers or None, not %s", type_name(x));
    }
    long s0, s1, st;
    if (json_is_array(v)) {
        slice_indices(a, b, step, (long)json_array_size(v), &s0, &s1, &st);
        if (!(*out = json_array())) return nomem();
        for (long i = s0; st > 0 ? i < s1 : i > s1;) {
            json_array_append(*out, json_array_get(v, (size_t)i));
            if (__builtin_add_overflow(i, st, &i)) break; /* a step past 64 bits: past the end too */
        }
        return PPN_OK;
    }
    if (json_is_string(v)) {
        size_t *off, n;
        PPN_CHECK(char_offsets(v, &off, &n));
        slice_indices(a, b, step, (long)n, &s0, &s1, &st);
        ppn_tok_buf buf = {0};
        ppn_status s = PPN_OK;
        for (long i = s0; s == PPN_OK && (st > 0 ? i < s1 : i > s1);) {
            s = ppn_tok_buf_put(&buf, json_string_value(v) + off[i], off[i + 1] - off[i]);
            if (__builtin_add_overflow(i, st, &i)) break;
        }
        if (s == PPN_OK && !(*out = json_stringn_nocheck(buf.len ? buf.p : "", buf.len))) s = nomem();
        free(buf.p);
        free(off);
        return s;
    }
    if (!v) return fail(c, line, "a slice of an undefined value");
    return fail(c, line, "'%s' object is not subscriptable", type_name(v));
}

/* v[key]: a dict's item, a list's or string's index (negative from the end); missing is undefined. */
static ppn_status do_item(const rctx *c, int line, json_t *v, json_t *key, json_t **out)
{
    *out = NULL;
    if (!v) return fail(c, line, "an item of an undefined value");
    if (json_is_object(v)) {
        if (key && json_is_string(key)) *out = json_incref(json_object_get(v, json_string_value(key)));
        return PPN_OK;
    }
    int f;
    json_int_t i;
    double d;
    if (!(json_is_array(v) || json_is_string(v)) || !key || !number(key, &f, &i, &d) || f) return PPN_OK;
    if (json_is_array(v)) {
        json_int_t n = (json_int_t)json_array_size(v);
        if (i < 0) i += n;
        if (i >= 0 && i < n) *out = json_incref(json_array_get(v, (size_t)i));
        return PPN_OK;
    }
    size_t *off, n;
    PPN_CHECK(char_offsets(v, &off, &n));
    if (i < 0) i += (json_int_t)n;
    if (i >= 0 && i < (json_int_t)n && !(*out = substr(v, off[i], off[i + 1]))) {
        free(off);
        return nomem();
    }
    free(off);
    return PPN_OK;
}

/* ---- arguments of calls, filters and tests ---- */

#define MAX_ARGS 8
typedef struct args {
    json_t *v[MAX_ARGS];
    const char *kw[MAX_ARGS];
    int n, n_pos;
} args;

static void args_free(args *a)
{
    for (int i = 0; i < a->n; i++) json_decref(a->v[i]);
}

/* The positional argument at pos or the keyword argument name; NULL (undefined) when absent. */
static json_t *arg(const args *a, int pos, const char *name)
{
    if (pos >= 0 && pos < a->n_pos) return a->v[pos];
    for (int i = a->n_pos; i < a->n; i++)
        if (name && !strcmp(a->kw[i], name)) return a->v[i];
    return NULL;
}

static int has_arg(const args *a, int pos, const char *name)
{
    if (pos >= 0 && pos < a->n_pos) return 1;
    for (int i = a->n_pos; i < a->n; i++)
        if (name && !strcmp(a->kw[i], name)) return 1;
    return 0;
}

static ppn_status eval(rctx *c, const tmpl_expr *e, json_t **out);

/* Evaluate e's arguments from index first (positional before keyword, as Python requires). */
static ppn_status eval_args(rctx *c, const tmpl_expr *e, int first, args *a)
{
    *a = (args){0};
    if (e->n_args - first > MAX_ARGS) return refuse(c, e->line, "a call with more than 8 arguments");
    for (int i = first; i < e->n_args; i++) {
        const char *kw = e->kw ? e->kw[i] : NULL;
        if (!kw && a->n > a->n_pos) {
            args_free(a);   /* the keyword arguments already evaluated (LeakSanitizer, fuzz_template) */
            return fail(c, e->line, "positional argument follows keyword argument");
        }
        ppn_status st = eval(c, e->args[i], &a->v[a->n]);
        if (st != PPN_OK) {
            args_free(a);
            return st;
        }
        a->kw[a->n++] = kw;
        if (!kw) a->n_pos++;
    }
    return PPN_OK;
}

static const char *str_arg(const json_t *v) { return v && json_is_string(v) ? json_string_value(v) : NULL; }

/* ---- strings ---- */

static ppn_status make_string(ppn_tok_buf *b, json_t **out)
{
    *out = json_stringn_nocheck(b->len ? b->p : "", b->len);
    free(b->p);
    *b = (ppn_tok_buf){0};
    return *out ? PPN_OK : nomem();
}

static ppn_status to_str(json_t *v, json_t **out)
{
    if (v && json_is_string(v)) {
        *out = json_incref(v);
        return PPN_OK;
    }
    ppn_tok_buf b = {0};
    ppn_status st = ppn_tmpl_str(&b, v);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    return make_string(&b, out);
}

/* The length of the character at the start (back: the end) of s[0, n) when it is one of chars (NULL: any
 * whitespace), else 0. */
static size_t strip_len(const char *s, size_t n, const char *chars, int back)
{
    if (!chars) return back ? ppn_tmpl_ws_back(s, n) : ppn_tmpl_ws(s, n);
    size_t k = 1;
    if (back) {
        size_t st = n - 1;
        while (st > 0 && n - st < 4 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        k = n - st;
    } else {
        int l = ppn_tok_utf8_len((const unsigned char *)s, n);
        if (l) k = (size_t)l;
    }
    const char *ch = back ? s + n - k : s;
    for (const char *p = chars; *p;) {
        int l = ppn_tok_utf8_len((const unsigned char *)p, strlen(p));
        size_t pl = l ? (size_t)l : 1;
        if (pl == k && !memcmp(p, ch, k)) return k;
        p += pl;
    }
    return 0;
}

/* str.strip / lstrip / rstrip (which: 3, 1, 2) with chars (NULL: whitespace). */
static ppn_status strip(json_t *v, const char *chars, int which, json_t **out)
{
    json_t *s;
    PPN_CHECK(to_str(v, &s));
    const char *p = json_string_value(s);
    size_t a = 0, b = json_string_length(s), k;
    if (which & 1)
        while (a < b && (k = strip_len(p + a, b - a, chars, 0))) a += k;
    if (which & 2)
        while (b > a && (k = strip_len(p + a, b - a, chars, 1))) b -= k;
    *out = substr(s, a, b);
    json_decref(s);
    return *out ? PPN_OK : nomem();
}

/* Case mapping through utf8proc: mode 0 lower, 1 upper, 2 capitalize (first upper, the rest lower). */
static ppn_status recase(json_t *v, int mode, json_t **out)
{
    json_t *s;
    PPN_CHECK(to_str(v, &s));
    const unsigned char *p = (const unsigned char *)json_string_value(s);
    size_t n = json_string_length(s);
    ppn_tok_buf b = {0};
    ppn_status st = PPN_OK;
    for (size_t i = 0, first = 1; st == PPN_OK && i < n; first = 0) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) {   /* not a character (strings here are valid UTF-8, so this does not happen) */
            st = ppn_tok_buf_put(&b, p + i, 1);
            i++;
            continue;
        }
        int up = mode == 1 || (mode == 2 && first);
        char u[4];
        st = ppn_tok_buf_put(&b, u, (size_t)ppn_tok_utf8_put(u, (uint32_t)(up ? utf8proc_toupper(cp) : utf8proc_tolower(cp))));
        i += (size_t)k;
    }
    json_decref(s);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    return make_string(&b, out);
}

static ppn_status replace(json_t *v, const char *old, const char *new_, json_int_t count, json_t **out)
{
    json_t *s;
    PPN_CHECK(to_str(v, &s));
    const char *p = json_string_value(s);
    size_t n = json_string_length(s), ol = strlen(old), nl = strlen(new_);
    ppn_tok_buf b = {0};
    ppn_status st = PPN_OK;
    size_t i = 0;
    for (json_int_t done = 0; st == PPN_OK && i <= n && (count < 0 || done < count); done++) {
        const char *hit = NULL;
        if (!ol) {
            hit = p + i;   /* Python inserts new before every character and at the end */
        } else {
            for (size_t j = i; j + ol <= n && !hit; j++)
                if (!memcmp(p + j, old, ol)) hit = p + j;
        }
        if (!hit) break;
        st = ppn_tok_buf_put(&b, p + i, (size_t)(hit - (p + i)));
        if (st == PPN_OK) st = ppn_tok_buf_put(&b, new_, nl);
        i = (size_t)(hit - p) + ol;
        if (!ol) {
            if (i >= n) {
                i = n + 1;
                break;
            }
            int k = ppn_tok_utf8_len((const unsigned char *)p + i, n - i);
            if (st == PPN_OK) st = ppn_tok_buf_put(&b, p + i, k ? (size_t)k : 1);
            i += k ? (size_t)k : 1;
        }
    }
    if (st == PPN_OK && i < n) st = ppn_tok_buf_put(&b, p + i, n - i);
    json_decref(s);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    return make_string(&b, out);
}

/* str.split(sep=None, maxsplit=-1) */
static ppn_status split(const rctx *c, int line, json_t *v, const char *sep, json_int_t max, json_t **out)
{
    if (sep && !*sep) return fail(c, line, "empty separator");
    const char *p = json_string_value(v);
    size_t n = json_string_length(v), i = 0, k;
    json_t *a = json_array();
    if (!a) return nomem();
    for (json_int_t parts = 0;; parts++) {
        if (!sep)
            while (i < n && (k = ppn_tmpl_ws(p + i, n - i))) i += k;
        if (!sep && i >= n) break;
        size_t j = i;
        if (max >= 0 && parts >= max) {
            j = n;
            if (!sep)
                while (j > i && (k = ppn_tmpl_ws_back(p + i, j - i))) j -= k;
        } else if (sep) {
            size_t sl = strlen(sep);
            while (j + sl <= n && memcmp(p + j, sep, sl)) j++;
            if (j + sl > n) j = n;
        } else {
            while (j < n && !ppn_tmpl_ws(p + j, n - j)) j += (size_t)(ppn_tok_utf8_len((const unsigned char *)p + j, n - j) ?: 1);
        }
        json_array_append_new(a, json_stringn_nocheck(p + i, j - i));
        if (j >= n || (max >= 0 && parts >= max)) break;
        i = j + (sep ? strlen(sep) : 0);
        if (sep && i == n) {
            json_array_append_new(a, json_string(""));
            break;
        }
    }
    *out = a;
    return PPN_OK;
}

static int has_affix(json_t *s, const char *x, int end)
{
    size_t n = json_string_length(s), k = strlen(x);
    return k <= n && !memcmp(json_string_value(s) + (end ? n - k : 0), x, k);
}

/* ---- tests ---- */

static ppn_status run_test(rctx *c, int line, const char *name, json_t *v, const args *a, int *yes)
{
    int f;
    json_int_t i;
    double d;
    int num = number(v, &f, &i, &d);
    json_t *x = arg(a, 0, NULL);
    if (!strcmp(name, "defined")) *yes = v != NULL;
    else if (!strcmp(name, "undefined")) *yes = v == NULL;
    else if (!strcmp(name, "none")) *yes = v && json_is_null(v);
    else if (!strcmp(name, "boolean")) *yes = v && json_is_boolean(v);
    else if (!strcmp(name, "true")) *yes = v && json_is_true(v);
    else if (!strcmp(name, "false")) *yes = v && json_is_false(v);
    else if (!strcmp(name, "number")) *yes = num;
    else if (!strcmp(name, "integer")) *yes = v && json_is_integer(v);
    else if (!strcmp(name, "float")) *yes = v && json_is_real(v);
    else if (!strcmp(name, "string")) *yes = v && json_is_string(v);
    else if (!strcmp(name, "mapping")) *yes = v && json_is_object(v);
    else if (!strcmp(name, "iterable")) *yes = !v || json_is_string(v) || json_is_array(v) || json_is_object(v);
    else if (!strcmp(name, "sequence")) *yes = v && (json_is_string(v) || json_is_array(v) || json_is_object(v));
    else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        json_int_t m = !strcmp(name, "divisibleby") ? (x && json_is_integer(x) ? json_integer_value(x) : 0) : 2;
        if (!num || f || !m) return fail(c, line, "test '%s' on %s", name, type_name(v));
        json_int_t r = m == -1 ? 0 : i % m; /* Python's modulo, without C's overflow at INT64_MIN % -1 */
        if (r && ((r < 0) != (m < 0))) r += m;
        *yes = !strcmp(name, "odd") ? r == 1 : r == 0;
    } else if (!strcmp(name, "eq") || !strcmp(name, "equalto")) *yes = py_eq(v, x);
    else if (!strcmp(name, "ne")) *yes = !py_eq(v, x);
    else if (!strcmp(name, "in")) {
        if (!x || !(json_is_array(x) || json_is_object(x) || json_is_string(x)))
            return fail(c, line, "test 'in' on %s", type_name(x));
        json_t *items;
        PPN_CHECK(iter_list(c, line, x, &items));
        *yes = 0;
        if (json_is_string(x) && v && json_is_string(v)) {
            *yes = strstr(json_string_value(x), json_string_value(v)) != NULL;
        } else {
            for (size_t j = 0; j < json_array_size(items); j++) *yes |= py_eq(v, json_array_get(items, j));
        }
        json_decref(items);
    } else {
        return refuse(c, line, "a test");
    }
    return PPN_OK;
}

static const char *const tests[] = {"defined", "undefined", "none", "boolean", "true", "false", "number",
                                    "integer", "float", "string", "mapping", "iterable", "sequence", "odd",
                                    "even", "divisibleby", "eq", "equalto", "ne", "in"};

int ppn_tmpl_has_test(const char *name)
{
    for (size_t i = 0; i < PPN_ARRAY_LEN(tests); i++)
        if (!strcmp(tests[i], name)) return 1;
    return 0;
}

/* ---- filters ---- */

static ppn_status f_tojson(rctx *c, int line, json_t *v, const args *a, json_t **out)
{
    tmpl_json_opts o = {.indent = -1, .item_sep = ", ", .key_sep = ": "};
    json_t *ind = arg(a, 0, "indent"), *sep = arg(a, -1, "separators");
    if (ind && json_is_integer(ind)) {
        o.indent = (int)json_integer_value(ind);
        if (o.indent < 0) o.indent = 0;
        o.item_sep = ",";
    } else if (ind && json_is_string(ind)) {
        snprintf(o.indent_str, sizeof o.indent_str, "%s", json_string_value(ind));
        o.indent_is_str = 1;
        o.item_sep = ",";
    } else if (ind && !json_is_null(ind)) {
        return fail(c, line, "tojson: indent must be an int or a string");
    }
    if (sep && !json_is_null(sep)) {
        if (!json_is_array(sep) || json_array_size(sep) != 2 || !str_arg(json_array_get(sep, 0)) ||
            !str_arg(json_array_get(sep, 1)))
            return fail(c, line, "tojson: separators must be two strings");
        o.item_sep = json_string_value(json_array_get(sep, 0));
        o.key_sep = json_string_value(json_array_get(sep, 1));
    }
    o.ensure_ascii = truthy(arg(a, -1, "ensure_ascii"));
    o.sort_keys = truthy(arg(a, -1, "sort_keys"));
    ppn_tok_buf b = {0};
    ppn_status st = ppn_tmpl_json(&b, v, &o, 0);
    if (st != PPN_OK) {
        free(b.p);
        return st == PPN_EINVAL ? fail(c, line, "tojson: Object of type Undefined is not JSON serializable") : st;
    }
    return make_string(&b, out);
}

static ppn_status f_length(const rctx *c, int line, json_t *v, json_t **out)
{
    size_t n = 0;
    if (!v) n = 0;
    else if (json_is_array(v)) n = json_array_size(v);
    else if (json_is_object(v)) n = json_object_size(v);
    else if (json_is_string(v)) {
        size_t *off;
        PPN_CHECK(char_offsets(v, &off, &n));
        free(off);
    } else return fail(c, line, "object of type '%s' has no len()", type_name(v));
    return (*out = json_integer((json_int_t)n)) ? PPN_OK : nomem();
}

static ppn_status f_join(rctx *c, int line, json_t *v, const args *a, json_t **out)
{
    json_t *items, *attr = arg(a, 1, "attribute");
    PPN_CHECK(iter_list(c, line, v, &items));
    const char *sep = str_arg(arg(a, 0, "d"));
    ppn_tok_buf b = {0};
    ppn_status st = PPN_OK;
    for (size_t i = 0; st == PPN_OK && i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i);
        if (attr && json_is_object(x)) x = json_object_get(x, json_string_value(attr));
        if (i && sep) st = ppn_tok_buf_put(&b, sep, strlen(sep));
        if (st == PPN_OK) st = ppn_tmpl_str(&b, x);
    }
    json_decref(items);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    return make_string(&b, out);
}

/* select / reject (test on the item) and selectattr / rejectattr (on its attribute; no test: truthiness). */
static ppn_status f_select(rctx *c, int line, json_t *v, const args *a, int keep, int by_attr, json_t **out)
{
    json_t *items;
    int t0 = by_attr ? 1 : 0;
    const char *attr = by_attr ? str_arg(arg(a, 0, NULL)) : NULL;
    const char *test = str_arg(arg(a, t0, NULL));
    if (by_attr && !attr) return fail(c, line, "selectattr/rejectattr need an attribute name");
    if (test && !ppn_tmpl_has_test(test)) return refuse(c, line, "a test passed to select/reject");
    if (!test && !by_attr) return fail(c, line, "select/reject need a test name here");
    args rest = {0};
    for (int i = t0 + 1; i < a->n_pos; i++) rest.v[rest.n++] = a->v[i];
    rest.n_pos = rest.n;
    PPN_CHECK(iter_list(c, line, v, &items));
    json_t *res = json_array();
    ppn_status st = res ? PPN_OK : nomem();
    for (size_t i = 0; st == PPN_OK && i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i), *y = x;
        if (attr) y = json_is_object(x) ? json_object_get(x, attr) : NULL;
        int yes = 0;
        if (test) st = run_test(c, line, test, y, &rest, &yes);
        else yes = truthy(y);
        if (st == PPN_OK && yes == keep) json_array_append(res, x);
    }
    json_decref(items);
    if (st != PPN_OK) {
        json_decref(res);
        return st;
    }
    *out = res;
    return PPN_OK;
}

static ppn_status f_items(const rctx *c, int line, json_t *v, json_t **out)
{
    if (v && !json_is_object(v)) return fail(c, line, "items: %s is not a mapping", type_name(v));
    json_t *a = json_array();
    if (!a) return nomem();
    const char *k;
    json_t *x;
    if (v) json_object_foreach(v, k, x) json_array_append_new(a, json_pack("[sO]", k, x));
    *out = a;
    return PPN_OK;
}

static ppn_status f_map(rctx *c, int line, json_t *v, const args *a, json_t **out)
{
    const char *attr = str_arg(arg(a, -1, "attribute"));
    if (!attr || a->n_pos) return refuse(c, line, "map() other than map(attribute=...)");
    json_t *items, *dflt = arg(a, -1, "default");
    PPN_CHECK(iter_list(c, line, v, &items));
    json_t *res = json_array();
    for (size_t i = 0; res && i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i), *y = json_is_object(x) ? json_object_get(x, attr) : NULL;
        if (!y) y = dflt;
        if (!y) {
            json_decref(items);
            json_decref(res);
            return refuse(c, line, "map(attribute=...) yielding an undefined item");
        }
        json_array_append(res, y);
    }
    json_decref(items);
    return (*out = res) ? PPN_OK : nomem();
}

static ppn_status f_first_last(rctx *c, int line, json_t *v, int last, json_t **out)
{
    json_t *items;
    PPN_CHECK(iter_list(c, line, v, &items));
    size_t n = json_array_size(items);
    *out = n ? json_incref(json_array_get(items, last ? n - 1 : 0)) : NULL;
    json_decref(items);
    return PPN_OK;
}

/* int(d) for the int filter: NaN gives the default (Python's ValueError, which the filter catches), an infinity
 * fails as Python's OverflowError does, a finite value past 64 bits is refused (Python's integers have no bound). */
static ppn_status float_to_int(const rctx *c, int line, double d, json_t *dflt, json_t **out)
{
    if (isnan(d)) *out = dflt ? json_incref(dflt) : json_integer(0);
    else if (isinf(d)) return fail(c, line, "cannot convert float infinity to integer");
    else if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return int_overflow(c, line, "int");
    else *out = json_integer((json_int_t)d);
    return *out ? PPN_OK : nomem();
}

static ppn_status f_int(const rctx *c, int line, json_t *v, const args *a, int to_float, json_t **out)
{
    int f;
    json_int_t i;
    double d;
    json_t *dflt = arg(a, 0, "default");
    if (number(v, &f, &i, &d)) {
        if (!to_float && f) return float_to_int(c, line, d, dflt, out);
        *out = to_float ? json_real(d) : json_integer(i);
    } else if (v && json_is_string(v)) {
        char *end;
        const char *s = json_string_value(v);
        errno = 0;
        long long n = to_float ? 0 : strtoll(s, &end, 10); /* an integer's digits: exact, past 2^53 too */
        if (!to_float && end != s && !*end) {
            if (errno == ERANGE) return int_overflow(c, line, "int");
            return (*out = json_integer(n)) ? PPN_OK : nomem();
        }
        d = strtod(s, &end);
        if (end == s || *end) *out = dflt ? json_incref(dflt) : to_float ? json_real(0) : json_integer(0);
        else if (!to_float) return float_to_int(c, line, d, dflt, out);
        else return make_real(c, line, "float", d, out);
    } else {
        *out = dflt ? json_incref(dflt) : to_float ? json_real(0) : json_integer(0);
    }
    return *out ? PPN_OK : nomem();
}

static ppn_status run_filter(rctx *c, int line, const char *name, json_t *v, const args *a, json_t **out)
{
    *out = NULL;
    if (!strcmp(name, "trim")) return strip(v, str_arg(arg(a, 0, "chars")), 3, out);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return f_length(c, line, v, out);
    if (!strcmp(name, "tojson")) return f_tojson(c, line, v, a, out);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        int use = !v || (truthy(arg(a, 1, "boolean")) && !truthy(v));
        json_t *d = arg(a, 0, "default_value");
        if (!use) *out = json_incref(v);
        else *out = has_arg(a, 0, "default_value") ? json_incref(d) : json_string("");
        return PPN_OK;
    }
    if (!strcmp(name, "join")) return f_join(c, line, v, a, out);
    if (!strcmp(name, "lower")) return recase(v, 0, out);
    if (!strcmp(name, "upper")) return recase(v, 1, out);
    if (!strcmp(name, "capitalize")) return recase(v, 2, out);
    if (!strcmp(name, "string")) return to_str(v, out);
    if (!strcmp(name, "safe")) return to_str(v, out);
    if (!strcmp(name, "first") || !strcmp(name, "last")) return f_first_last(c, line, v, name[0] == 'l', out);
    if (!strcmp(name, "list")) return iter_list(c, line, v, out);
    if (!strcmp(name, "items")) return f_items(c, line, v, out);
    if (!strcmp(name, "select") || !strcmp(name, "reject")) return f_select(c, line, v, a, name[0] == 's', 0, out);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return f_select(c, line, v, a, name[0] == 's', 1, out);
    if (!strcmp(name, "map")) return f_map(c, line, v, a, out);
    if (!strcmp(name, "int") || !strcmp(name, "float")) return f_int(c, line, v, a, name[0] == 'f', out);
    if (!strcmp(name, "replace")) {
        const char *o = str_arg(arg(a, 0, "old")), *n = str_arg(arg(a, 1, "new"));
        json_t *cnt = arg(a, 2, "count");
        if (!o || !n) return fail(c, line, "replace needs two strings");
        return replace(v, o, n, cnt && json_is_integer(cnt) ? json_integer_value(cnt) : -1, out);
    }
    if (!strcmp(name, "abs")) {
        int f;
        json_int_t i;
        double d;
        if (!number(v, &f, &i, &d)) return fail(c, line, "abs of %s", type_name(v));
        if (!f && i == INT64_MIN) return int_overflow(c, line, "abs");
        *out = f ? json_real(d < 0 ? -d : d) : json_integer(i < 0 ? -i : i);
        return *out ? PPN_OK : nomem();
    }
    return refuse(c, line, "a filter");
}

static const char *const filters[] = {"trim", "length", "count", "tojson", "default", "d", "join", "lower",
                                      "upper", "capitalize", "string", "safe", "first", "last", "list", "items",
                                      "select", "reject", "selectattr", "rejectattr", "map", "int", "float",
                                      "replace", "abs"};

int ppn_tmpl_has_filter(const char *name)
{
    for (size_t i = 0; i < PPN_ARRAY_LEN(filters); i++)
        if (!strcmp(filters[i], name)) return 1;
    return 0;
}

/* ---- methods and global functions ---- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith",
                                          "lower", "upper", "capitalize", "replace", "join"};
static const char *const dict_methods[] = {"items", "keys", "values", "get"};
static const char *const functions[] = {"raise_exception", "namespace", "range", "dict", "strftime_now"};

static int in_list(const char *const *l, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(l[i], name)) return 1;
    return 0;
}

int ppn_tmpl_has_method(const char *name)
{
    return in_list(str_methods, PPN_ARRAY_LEN(str_methods), name) ||
           in_list(dict_methods, PPN_ARRAY_LEN(dict_methods), name);
}

int ppn_tmpl_has_function(const char *name) { return in_list(functions, PPN_ARRAY_LEN(functions), name); }

static ppn_status affix(rctx *c, int line, json_t *v, json_t *x, int end, json_t **out)
{
    int yes = 0;
    if (x && json_is_string(x)) yes = has_affix(v, json_string_value(x), end);
    else if (x && json_is_array(x))
        for (size_t i = 0; i < json_array_size(x); i++) {
            if (!str_arg(json_array_get(x, i))) return fail(c, line, "startswith/endswith: a tuple of strings");
            yes |= has_affix(v, json_string_value(json_array_get(x, i)), end);
        }
    else return fail(c, line, "startswith/endswith: a string or a tuple of strings");
    *out = json_boolean(yes);
    return PPN_OK;
}

static ppn_status str_method(rctx *c, int line, const char *m, json_t *v, const args *a, json_t **out)
{
    json_t *x = arg(a, 0, NULL);
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (x && !json_is_null(x) && !json_is_string(x)) return fail(c, line, "%s: chars must be a string", m);
        return strip(v, str_arg(x), m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, out);
    }
    if (!strcmp(m, "split")) {
        json_t *mx = arg(a, 1, "maxsplit"), *sep = arg(a, 0, "sep");
        return split(c, line, v, str_arg(sep), mx && json_is_integer(mx) ? json_integer_value(mx) : -1, out);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) return affix(c, line, v, x, m[0] == 'e', out);
    if (!strcmp(m, "lower") || !strcmp(m, "upper") || !strcmp(m, "capitalize"))
        return recase(v, m[0] == 'l' ? 0 : m[0] == 'u' ? 1 : 2, out);
    if (!strcmp(m, "replace")) {
        const char *o = str_arg(x), *n = str_arg(arg(a, 1, NULL));
        json_t *cnt = arg(a, 2, NULL);
        if (!o || !n) return fail(c, line, "replace needs two strings");
        return replace(v, o, n, cnt && json_is_integer(cnt) ? json_integer_value(cnt) : -1, out);
    }
    /* join */
    json_t *items;
    PPN_CHECK(iter_list(c, line, x, &items));
    ppn_tok_buf b = {0};
    ppn_status st = PPN_OK;
    for (size_t i = 0; st == PPN_OK && i < json_array_size(items); i++) {
        json_t *it = json_array_get(items, i);
        if (!json_is_string(it)) st = fail(c, line, "join: item %zu is %s, not str", i, type_name(it));
        if (st == PPN_OK && i) st = ppn_tok_buf_put(&b, json_string_value(v), json_string_length(v));
        if (st == PPN_OK) st = ppn_tok_buf_put(&b, json_string_value(it), json_string_length(it));
    }
    json_decref(items);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    return make_string(&b, out);
}

static ppn_status dict_method(rctx *c, int line, const char *m, json_t *v, const args *a, json_t **out)
{
    if (!strcmp(m, "items")) return f_items(c, line, v, out);
    if (!strcmp(m, "get")) {
        json_t *k = arg(a, 0, NULL), *x = k && json_is_string(k) ? json_object_get(v, json_string_value(k)) : NULL;
        json_t *d = arg(a, 1, NULL);
        *out = json_incref(x ? x : d ? d : json_null());
        return PPN_OK;
    }
    json_t *r = json_array();
    if (!r) return nomem();
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) json_array_append_new(r, m[0] == 'k' ? json_string_nocheck(k) : json_incref(x));
    *out = r;
    return PPN_OK;
}

static ppn_status call_method(rctx *c, const tmpl_expr *e, json_t **out)
{
    json_t *v;
    PPN_CHECK(eval(c, e->a, &v));
    if (!v) return fail(c, e->line, "'%s' called on an undefined value", e->name);
    args a;
    ppn_status st = eval_args(c, e, 0, &a);
    if (st == PPN_OK) {
        if (json_is_string(v) && in_list(str_methods, PPN_ARRAY_LEN(str_methods), e->name))
            st = str_method(c, e->line, e->name, v, &a, out);
        else if (json_is_object(v) && in_list(dict_methods, PPN_ARRAY_LEN(dict_methods), e->name))
            st = dict_method(c, e->line, e->name, v, &a, out);
        else
            st = fail(c, e->line, "'%s' object has no attribute '%s'", type_name(v), e->name);
        args_free(&a);
    }
    json_decref(v);
    return st;
}

static ppn_status fn_range(const rctx *c, int line, const args *a, json_t **out)
{
    json_int_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3) return fail(c, line, "range takes 1 to 3 arguments");
    for (int i = 0; i < a->n_pos; i++) {
        if (!json_is_integer(a->v[i])) return fail(c, line, "range: %s is not an integer", type_name(a->v[i]));
        v[a->n_pos == 1 ? 1 : i] = json_integer_value(a->v[i]);
    }
    if (!v[2]) return fail(c, line, "range() arg 3 must not be zero");
    json_t *r = json_array();
    for (json_int_t i = v[0]; r && (v[2] > 0 ? i < v[1] : i > v[1]);) {
        if (json_array_size(r) >= TMPL_MAX_BUILD) {
            json_decref(r);
            return fail(c, line, "range: more than %d items", TMPL_MAX_BUILD);
        }
        json_array_append_new(r, json_integer(i));
        if (__builtin_add_overflow(i, v[2], &i)) break; /* the next item would be past 64 bits: past the stop too */
    }
    return (*out = r) ? PPN_OK : nomem();
}

static ppn_status call_function(rctx *c, const tmpl_expr *e, json_t **out)
{
    args a;
    PPN_CHECK(eval_args(c, e, 0, &a));
    ppn_status st = PPN_OK;
    if (!strcmp(e->name, "raise_exception")) {
        ppn_tok_buf b = {0};
        st = ppn_tmpl_str(&b, arg(&a, 0, NULL));
        if (st == PPN_OK) st = ppn_err(PPN_EINVAL, "%.*s", (int)b.len, b.len ? b.p : "");
        free(b.p);
    } else if (!strcmp(e->name, "namespace") || !strcmp(e->name, "dict")) {
        json_t *o = a.n_pos == 1 && json_is_object(a.v[0]) ? json_copy(a.v[0]) : json_object();
        if (!o) st = nomem();
        else if (a.n_pos > (a.n_pos == 1 && json_is_object(a.v[0]) ? 1 : 0))
            st = fail(c, e->line, "%s() takes keyword arguments or one mapping", e->name);
        for (int i = a.n_pos; st == PPN_OK && i < a.n; i++) json_object_set(o, a.kw[i], a.v[i] ? a.v[i] : json_null());
        if (st == PPN_OK && e->name[0] == 'n') json_array_append(c->namespaces, o);
        if (st == PPN_OK) *out = o;
        else json_decref(o);
    } else if (!strcmp(e->name, "range")) {
        st = fn_range(c, e->line, &a, out);
    } else {   /* strftime_now, as transformers defines it: local time now */
        const char *fmt = str_arg(arg(&a, 0, NULL));
        char buf[256];
        time_t now = time(NULL);
        struct tm tm;
        if (!fmt) st = fail(c, e->line, "strftime_now needs a format string");
        else if (!localtime_r(&now, &tm) || (!strftime(buf, sizeof buf, fmt, &tm) && *fmt))
            st = fail(c, e->line, "strftime_now: the format gives no text");
        else if (!(*out = json_string(buf))) st = nomem();
    }
    args_free(&a);
    return st;
}

/* ---- expressions ---- */

static json_t *lookup(const rctx *c, const char *name)
{
    for (int i = c->n_frames - 1; i >= 0; i--) {
        json_t *v = json_object_get(c->frames[i], name);
        if (v) return v == c->undef ? NULL : v;
    }
    return NULL;
}

static ppn_status arith(rctx *c, const tmpl_expr *e, json_t *x, json_t *y, json_t **out)
{
    const char *op = e->op;
    if (!strcmp(op, "~")) {
        ppn_tok_buf b = {0};
        ppn_status st = ppn_tmpl_str(&b, x);
        if (st == PPN_OK) st = ppn_tmpl_str(&b, y);
        if (st != PPN_OK) {
            free(b.p);
            return st;
        }
        return make_string(&b, out);
    }
    if (!x || !y) return fail(c, e->line, "an undefined value in '%s'", op);
    if (!strcmp(op, "+") && json_is_string(x) && json_is_string(y)) {
        ppn_tok_buf b = {0};
        ppn_status st = ppn_tok_buf_put(&b, json_string_value(x), json_string_length(x));
        if (st == PPN_OK) st = ppn_tok_buf_put(&b, json_string_value(y), json_string_length(y));
        if (st != PPN_OK) {
            free(b.p);
            return st;
        }
        return make_string(&b, out);
    }
    if (!strcmp(op, "+") && json_is_array(x) && json_is_array(y)) {
        if (!(*out = json_copy(x))) return nomem();
        json_array_extend(*out, y);
        return PPN_OK;
    }
    if (!strcmp(op, "%") && json_is_string(x)) return refuse(c, e->line, "string formatting with '%'");
    int fx, fy;
    json_int_t ix, iy;
    double dx, dy;
    if (!strcmp(op, "*") && (json_is_string(x) || json_is_array(x)) && number(y, &fy, &iy, &dy) && !fy) {
        size_t unit = json_is_string(x) ? json_string_length(x) : json_array_size(x);
        if (iy > 0 && unit > TMPL_MAX_BUILD / (size_t)iy)
            return fail(c, e->line, "'*' would repeat %zu %s %lld times: more than %d", unit,
                        json_is_string(x) ? "bytes" : "items", (long long)iy, TMPL_MAX_BUILD);
        json_t *r = json_is_string(x) ? NULL : json_array();
        ppn_tok_buf b = {0};
        for (json_int_t i = 0; i < iy; i++)
            if (r) json_array_extend(r, x);
            else if (ppn_tok_buf_put(&b, json_string_value(x), json_string_length(x)) != PPN_OK) return nomem();
        if (r) return (*out = r) ? PPN_OK : nomem();
        return make_string(&b, out);
    }
    if (!number(x, &fx, &ix, &dx) || !number(y, &fy, &iy, &dy))
        return fail(c, e->line, "unsupported operand type(s) for %s: '%s' and '%s'", op, type_name(x), type_name(y));
    int fl = fx || fy;
    if ((!strcmp(op, "/") || !strcmp(op, "//") || !strcmp(op, "%")) && (fl ? dy == 0.0 : iy == 0))
        return fail(c, e->line, "division by zero");
    json_int_t ir = 0; /* the result: ir for integers, fr for floats (fl) */
    double fr = 0.0;
    switch (op[0]) {
    case '+':
        if (fl) fr = dx + dy;
        else if (__builtin_add_overflow(ix, iy, &ir)) return int_overflow(c, e->line, op);
        break;
    case '-':
        if (fl) fr = dx - dy;
        else if (__builtin_sub_overflow(ix, iy, &ir)) return int_overflow(c, e->line, op);
        break;
    case '*':
        if (op[1] == '*') {
            if (fl || iy < 0) fl = 1, fr = pow(dx, dy);
            else { /* by squaring: log2(iy) steps, each checked */
                json_int_t b = ix;
                ir = 1;
                for (json_int_t n = iy; n; n >>= 1) {
                    if ((n & 1) && __builtin_mul_overflow(ir, b, &ir)) return int_overflow(c, e->line, op);
                    if (n > 1 && __builtin_mul_overflow(b, b, &b)) return int_overflow(c, e->line, op);
                }
            }
        } else if (fl) {
            fr = dx * dy;
        } else if (__builtin_mul_overflow(ix, iy, &ir)) {
            return int_overflow(c, e->line, op);
        }
        break;
    case '/':
        if (op[1] == '/') {
            if (fl) fr = floor(dx / dy);
            else if (iy == -1 && ix == INT64_MIN) return int_overflow(c, e->line, op);
            else ir = ix / iy - ((ix % iy) && ((ix < 0) != (iy < 0)));
        } else {
            fl = 1, fr = dx / dy;
        }
        break;
    default: /* % */
        if (fl) {
            fr = fmod(dx, dy);
            if (fr && ((fr < 0) != (dy < 0))) fr += dy;
        } else {
            ir = iy == -1 ? 0 : ix % iy; /* INT64_MIN % -1 overflows in C; it is 0 */
            if (ir && ((ir < 0) != (iy < 0))) ir += iy;
        }
    }
    if (fl) return make_real(c, e->line, op, fr, out);
    return (*out = json_integer(ir)) ? PPN_OK : nomem();
}

static ppn_status compare(rctx *c, const tmpl_expr *e, json_t *x, json_t *y, json_t **out)
{
    const char *op = e->op;
    int r;
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        r = py_eq(x, y) == (op[0] == '=');
    } else if (!strcmp(op, "in") || !strcmp(op, "ni")) {
        if (y && json_is_string(y)) {
            if (!x || !json_is_string(x))
                return fail(c, e->line, "'in <string>' requires string as left operand, not %s", type_name(x));
            r = strstr(json_string_value(y), json_string_value(x)) != NULL;
        } else if (y && json_is_object(y)) {
            r = x && json_is_string(x) && json_object_get(y, json_string_value(x));
        } else if (!y || json_is_array(y)) {
            r = 0;
            for (size_t i = 0; y && i < json_array_size(y); i++) r |= py_eq(x, json_array_get(y, i));
        } else {
            return fail(c, e->line, "argument of type '%s' is not iterable", type_name(y));
        }
        r = r == (op[0] == 'i');
    } else {
        int fx, fy;
        json_int_t ix, iy;
        double dx, dy, d;
        if (number(x, &fx, &ix, &dx) && number(y, &fy, &iy, &dy)) {
            d = fx || fy ? (dx > dy) - (dx < dy) : (ix > iy) - (ix < iy);
        } else if (x && y && json_is_string(x) && json_is_string(y)) {
            d = strcmp(json_string_value(x), json_string_value(y));
        } else {
            return fail(c, e->line, "'%s' not supported between '%s' and '%s'", op, type_name(x), type_name(y));
        }
        r = op[0] == '<' ? (op[1] ? d <= 0 : d < 0) : (op[1] ? d >= 0 : d > 0);
    }
    *out = json_boolean(r);
    return PPN_OK;
}

static ppn_status eval_bin(rctx *c, const tmpl_expr *e, json_t **out)
{
    json_t *x = NULL, *y = NULL;
    ppn_status st = eval(c, e->a, &x);
    if (st == PPN_OK) st = eval(c, e->b, &y);
    if (st == PPN_OK) {
        const char *op = e->op;
        int cmp = !strcmp(op, "==") || !strcmp(op, "!=") || op[0] == '<' || op[0] == '>' || !strcmp(op, "in") ||
                  !strcmp(op, "ni");
        st = cmp ? compare(c, e, x, y, out) : arith(c, e, x, y, out);
    }
    json_decref(x);
    json_decref(y);
    return st;
}

static ppn_status eval_display(rctx *c, const tmpl_expr *e, json_t **out)
{
    json_t *r = e->kind == E_LIST ? json_array() : json_object();
    if (!r) return nomem();
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < e->n_args; i += e->kind == E_LIST ? 1 : 2) {
        json_t *k = NULL, *v = NULL;
        if (e->kind == E_DICT) st = eval(c, e->args[i], &k);
        if (st == PPN_OK) st = eval(c, e->args[i + (e->kind == E_DICT)], &v);
        if (st == PPN_OK && !v) st = refuse(c, e->line, "an undefined value inside a list or dict display");
        if (st == PPN_OK && e->kind == E_DICT && (!k || !json_is_string(k)))
            st = refuse(c, e->line, "a dict key that is not a string");
        if (st == PPN_OK) {
            if (e->kind == E_LIST) json_array_append(r, v);
            else json_object_set(r, json_string_value(k), v);
        }
        json_decref(k);
        json_decref(v);
    }
    if (st != PPN_OK) {
        json_decref(r);
        return st;
    }
    *out = r;
    return PPN_OK;
}

static ppn_status eval_filter_test(rctx *c, const tmpl_expr *e, json_t **out)
{
    json_t *v;
    PPN_CHECK(eval(c, e->a, &v));
    args a;
    ppn_status st = eval_args(c, e, 0, &a);
    if (st == PPN_OK) {
        if (e->kind == E_FILTER) {
            st = run_filter(c, e->line, e->name, v, &a, out);
        } else {
            int yes = 0;
            st = run_test(c, e->line, e->name, v, &a, &yes);
            if (st == PPN_OK) *out = json_boolean(yes != e->negate);
        }
        args_free(&a);
    }
    json_decref(v);
    return st;
}

static ppn_status eval_access(rctx *c, const tmpl_expr *e, json_t **out)
{
    json_t *v = NULL, *k = NULL, *k2 = NULL, *k3 = NULL;
    ppn_status st = eval(c, e->a, &v);
    if (st == PPN_OK && e->kind == E_ATTR) {
        if (!v) st = fail(c, e->line, "attribute '%s' of an undefined value", e->name);
        else if (json_is_object(v)) *out = json_incref(json_object_get(v, e->name));
    } else if (st == PPN_OK && e->kind == E_ITEM) {
        st = eval(c, e->b, &k);
        if (st == PPN_OK) st = do_item(c, e->line, v, k, out);
    } else if (st == PPN_OK) {
        if (e->b) st = eval(c, e->b, &k);
        if (st == PPN_OK && e->c) st = eval(c, e->c, &k2);
        if (st == PPN_OK && e->args[0]) st = eval(c, e->args[0], &k3);
        if (st == PPN_OK) st = do_slice(c, e->line, v, k, k2, k3, out);
    }
    json_decref(v);
    json_decref(k);
    json_decref(k2);
    json_decref(k3);
    return st;
}

static ppn_status eval(rctx *c, const tmpl_expr *e, json_t **out)
{
    *out = NULL;
    json_t *x = NULL;
    ppn_status st = PPN_OK;
    switch (e->kind) {
    case E_LIT: *out = json_incref(e->lit); return PPN_OK;
    case E_NAME: *out = json_incref(lookup(c, e->name)); return PPN_OK;
    case E_LIST: case E_DICT: return eval_display(c, e, out);
    case E_ATTR: case E_ITEM: case E_SLICE: return eval_access(c, e, out);
    case E_CALL: return e->a ? call_method(c, e, out) : call_function(c, e, out);
    case E_FILTER: case E_TEST: return eval_filter_test(c, e, out);
    case E_BIN: return eval_bin(c, e, out);
    case E_NOT:
        PPN_CHECK(eval(c, e->a, &x));
        *out = json_boolean(!truthy(x));
        json_decref(x);
        return PPN_OK;
    case E_NEG: case E_POS: {
        int f;
        json_int_t i;
        double d;
        PPN_CHECK(eval(c, e->a, &x));
        if (!number(x, &f, &i, &d)) st = fail(c, e->line, "bad operand type for unary %c: '%s'",
                                              e->kind == E_NEG ? '-' : '+', type_name(x));
        else if (e->kind == E_POS) *out = f ? json_real(d) : json_integer(i);
        else if (!f && i == INT64_MIN) st = int_overflow(c, e->line, "-");
        else *out = f ? json_real(-d) : json_integer(-i);
        json_decref(x);
        return st;
    }
    case E_AND: case E_OR:
        PPN_CHECK(eval(c, e->a, &x));
        if (truthy(x) == (e->kind == E_OR)) {
            *out = x;
            return PPN_OK;
        }
        json_decref(x);
        return eval(c, e->b, out);
    case E_COND:
        PPN_CHECK(eval(c, e->a, &x));
        st = truthy(x) ? eval(c, e->b, out) : e->c ? eval(c, e->c, out) : PPN_OK;
        json_decref(x);
        return st;
    }
    return PPN_OK;
}

/* ---- statements ---- */

static ppn_status exec_body(rctx *c, const tmpl_body *b, ppn_tok_buf *out);

static ppn_status set_var(rctx *c, const char *name, json_t *v)
{
    return json_object_set(c->frames[c->n_frames - 1], name, v ? v : c->undef) ? nomem() : PPN_OK;
}

/* Bind the targets to item: one name takes it whole, several unpack a list of that many. */
static ppn_status bind(rctx *c, const tmpl_stmt *s, json_t *item)
{
    if (s->n_names == 1) return set_var(c, s->names[0], item);
    if (!item || !json_is_array(item) || (int)json_array_size(item) != s->n_names)
        return fail(c, s->line, "cannot unpack %s into %d names", type_name(item), s->n_names);
    for (int i = 0; i < s->n_names; i++) PPN_CHECK(set_var(c, s->names[i], json_array_get(item, (size_t)i)));
    return PPN_OK;
}

static ppn_status push_frame(rctx *c)
{
    if (c->n_frames == c->cap_frames) {
        if (c->cap_frames >= 256) return ppn_err(PPN_EUNSUPPORTED, "%s: loops nested deeper than 256", c->t->name);
        int cap = c->cap_frames ? 2 * c->cap_frames : 8;
        json_t **f = realloc(c->frames, (size_t)cap * sizeof *f);
        if (!f) return nomem();
        c->frames = f;
        c->cap_frames = cap;
    }
    return (c->frames[c->n_frames++] = json_object()) ? PPN_OK : (c->n_frames--, nomem());
}

static void pop_frame(rctx *c) { json_decref(c->frames[--c->n_frames]); }

/* The items a loop walks: the iterable, kept where the `if` filter holds (evaluated with the targets bound). */
static ppn_status loop_items(rctx *c, const tmpl_stmt *s, json_t **items)
{
    json_t *v;
    PPN_CHECK(eval(c, s->e, &v));
    ppn_status st = iter_list(c, s->line, v, items);
    json_decref(v);
    if (st != PPN_OK || !s->cond) return st;
    json_t *kept = json_array();
    if (!kept) st = nomem();
    for (size_t i = 0; st == PPN_OK && i < json_array_size(*items); i++) {
        json_t *it = json_array_get(*items, i), *ok = NULL;
        if ((st = push_frame(c)) != PPN_OK) break;
        st = bind(c, s, it);
        if (st == PPN_OK) st = eval(c, s->cond, &ok);
        if (st == PPN_OK && truthy(ok)) json_array_append(kept, it);
        json_decref(ok);
        pop_frame(c);
    }
    json_decref(*items);
    *items = kept;
    if (st != PPN_OK) {
        json_decref(kept);
        *items = NULL;
    }
    return st;
}

static json_t *loop_object(json_t *items, size_t i)
{
    size_t n = json_array_size(items);
    json_t *l = json_pack("{sIsIsIsIsbsbsI}", "index0", (json_int_t)i, "index", (json_int_t)i + 1, "revindex",
                          (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1), "first", i == 0, "last",
                          i + 1 == n, "length", (json_int_t)n);
    if (l && i > 0) json_object_set(l, "previtem", json_array_get(items, i - 1));
    if (l && i + 1 < n) json_object_set(l, "nextitem", json_array_get(items, i + 1));
    return l;
}

static ppn_status exec_for(rctx *c, const tmpl_stmt *s, ppn_tok_buf *out)
{
    json_t *items;
    PPN_CHECK(loop_items(c, s, &items));
    size_t n = json_array_size(items);
    ppn_status st = PPN_OK;
    for (size_t i = 0; st == PPN_OK && i < n; i++) {
        if ((st = push_frame(c)) != PPN_OK) break;
        json_t *l = loop_object(items, i);
        st = l ? set_var(c, "loop", l) : nomem();
        json_decref(l);
        if (st == PPN_OK) st = bind(c, s, json_array_get(items, i));
        if (st == PPN_OK) st = exec_body(c, &s->body, out);
        pop_frame(c);
        int brk = c->ctl == 1;
        c->ctl = 0;
        if (brk) break;
    }
    json_decref(items);
    if (st == PPN_OK && !n) st = exec_body(c, &s->other, out);
    return st;
}

static ppn_status exec_set(rctx *c, const tmpl_stmt *s, ppn_tok_buf *out)
{
    json_t *v = NULL;
    ppn_status st = PPN_OK;
    (void)out;
    if (s->kind == S_SETBLOCK) {
        ppn_tok_buf b = {0};
        st = exec_body(c, &s->body, &b);
        if (st == PPN_OK) st = make_string(&b, &v);
        else free(b.p);
    } else {
        st = eval(c, s->e, &v);
    }
    if (st == PPN_OK && s->attr) {
        json_t *ns = lookup(c, s->names[0]);
        int is_ns = 0;
        for (size_t i = 0; ns && i < json_array_size(c->namespaces); i++) is_ns |= json_array_get(c->namespaces, i) == ns;
        if (!is_ns) st = fail(c, s->line, "cannot assign attribute on non-namespace object '%s'", s->names[0]);
        else if (json_object_set(ns, s->attr, v ? v : json_null())) st = nomem();
        if (st == PPN_OK && !v) st = refuse(c, s->line, "an undefined value assigned to a namespace attribute");
    } else if (st == PPN_OK) {
        st = bind(c, s, v);
    }
    json_decref(v);
    return st;
}

static ppn_status exec_stmt(rctx *c, const tmpl_stmt *s, ppn_tok_buf *out)
{
    json_t *v = NULL;
    ppn_status st = PPN_OK;
    switch (s->kind) {
    case S_TEXT: return ppn_tok_buf_put(out, s->text, s->len);
    case S_OUT:
        PPN_CHECK(eval(c, s->e, &v));
        st = ppn_tmpl_str(out, v);
        json_decref(v);
        return st;
    case S_IF:
        PPN_CHECK(eval(c, s->e, &v));
        st = exec_body(c, truthy(v) ? &s->body : &s->other, out);
        json_decref(v);
        return st;
    case S_FOR: return exec_for(c, s, out);
    case S_SET: case S_SETBLOCK: return exec_set(c, s, out);
    case S_BLOCK: return exec_body(c, &s->body, out);
    case S_BREAK: case S_CONTINUE:
        if (c->n_frames < 2) return fail(c, s->line, "'%s' outside a loop", s->kind == S_BREAK ? "break" : "continue");
        c->ctl = s->kind == S_BREAK ? 1 : 2;
        return PPN_OK;
    }
    return PPN_OK;
}

static ppn_status exec_body(rctx *c, const tmpl_body *b, ppn_tok_buf *out)
{
    for (int i = 0; i < b->n && !c->ctl; i++) PPN_CHECK(exec_stmt(c, b->v[i], out));
    return PPN_OK;
}

ppn_status ppn_tmpl_render(const ppn_tmpl *t, json_t *vars, ppn_tok_buf *out)
{
    rctx c = {.t = t};
    ppn_status st = push_frame(&c);
    if (st == PPN_OK) {
        json_decref(c.frames[0]);
        c.frames[0] = json_copy(vars);
        c.namespaces = json_array();
        c.undef = json_array();
        if (!c.frames[0] || !c.namespaces || !c.undef) st = nomem();
    }
    if (st == PPN_OK) st = exec_body(&c, &t->root, out);
    while (c.n_frames) pop_frame(&c);
    free(c.frames);
    json_decref(c.namespaces);
    json_decref(c.undef);
    return st;
}
