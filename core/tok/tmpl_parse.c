/* tmpl_parse.c - a chat template's source into a tree (tmpl.h). The lexer follows Jinja's with transformers'
 * settings: newlines normalized and one trailing newline dropped (keep_trailing_newline off), `-` markers strip
 * all whitespace beside a tag, trim_blocks drops the newline after a block or comment tag, lstrip_blocks drops
 * the blanks between a line's start and a block or comment tag, `+` turns either off. The parser is Jinja's
 * grammar (filters and tests bind to the unary operand, tighter than any operator). Everything it accepts is
 * something tmpl_eval.c renders: another statement, filter, test, method or function is refused here, named
 * with its line (PPN_EUNSUPPORTED); bad syntax is PPN_EFORMAT with the line and what was found. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/base/err.h"
#include "core/tok/tmpl.h"

typedef enum { T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } ttype;

typedef struct tok {
    ttype type;
    int line;
    const char *s;   /* T_TEXT, T_NAME, T_OP: into the source */
    size_t n;
    json_t *val;     /* T_STR, T_INT, T_FLOAT */
} tok;

typedef struct parser {
    ppn_tmpl *t;
    tok *v;
    int n, cap, i;
} parser;

static ppn_status syntax(const parser *p, int line, const char *fmt, const char *what)
{
    return ppn_err(PPN_EFORMAT, "%s line %d: %s%s", p->t->name, line, fmt, what);
}

static ppn_status nomem(void) { return ppn_err(PPN_ENOMEM, "chat template: out of memory"); }

static ppn_status push(parser *p, ttype type, int line, const char *s, size_t n, json_t *val)
{
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        tok *v = realloc(p->v, (size_t)cap * sizeof *v);
        if (!v) {
            json_decref(val);
            return nomem();
        }
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tok){type, line, s, n, val};
    return PPN_OK;
}

/* ---- source normalization: Python's splitlines() breaks become \n; one trailing newline goes ---- */

static size_t line_break(const unsigned char *s, size_t n)
{
    if (s[0] == '\r') return n > 1 && s[1] == '\n' ? 2 : 1;
    if (s[0] == '\n' || s[0] == '\v' || s[0] == '\f' || (s[0] >= 0x1c && s[0] <= 0x1e)) return 1;
    if (n > 1 && s[0] == 0xc2 && s[1] == 0x85) return 2;
    if (n > 2 && s[0] == 0xe2 && s[1] == 0x80 && (s[2] == 0xa8 || s[2] == 0xa9)) return 3;
    return 0;
}

static ppn_status normalize(ppn_tmpl *t, const char *src, size_t len)
{
    if (!(t->src = malloc(len + 1))) return nomem();
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = line_break((const unsigned char *)src + i, len - i);
        if (k) {
            t->src[o++] = '\n';
            i += k;
        } else {
            t->src[o++] = src[i++];
        }
    }
    if (o && t->src[o - 1] == '\n') o--;
    t->src[o] = '\0';
    return PPN_OK;
}

/* ---- the lexer ---- */

typedef struct lexer {
    parser *p;
    const char *s;
    size_t n, pos;
    int line;
    int line_starting;   /* the last tag's end consumed a newline (Jinja's rule for lstrip_blocks) */
} lexer;

static int count_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Where the next tag starts at or after pos (n if none); *kind is '{', '%' or '#'. */
static size_t next_tag(const lexer *L, size_t pos, char *kind)
{
    for (size_t i = pos; i + 1 < L->n; i++)
        if (L->s[i] == '{' && (L->s[i + 1] == '{' || L->s[i + 1] == '%' || L->s[i + 1] == '#')) {
            *kind = L->s[i + 1];
            return i;
        }
    return L->n;
}

/* The text before a tag, with the tag's left whitespace control applied. */
static ppn_status lex_text(lexer *L, size_t end, char kind, char sign)
{
    const char *s = L->s + L->pos;
    size_t n = end - L->pos;
    if (sign == '-') {
        size_t k;
        while (n && (k = ppn_tmpl_ws_back(s, n))) n -= k;
    } else if (sign != '+' && kind != '{' && end < L->n) {   /* lstrip_blocks */
        size_t l = n;
        while (l && s[l - 1] != '\n') l--;
        if (l > 0 || L->line_starting) {
            size_t j = l, k;
            while (j < n && (k = ppn_tmpl_ws(s + j, n - j))) j += k;
            if (j == n && j > l) n = l;
        }
    }
    int line = L->line;
    L->line += count_lines(L->s + L->pos, end - L->pos);
    L->pos = end;
    return n ? push(L->p, T_TEXT, line, s, n, NULL) : PPN_OK;
}

/* After a tag's end: `-` strips all whitespace, trim_blocks one newline after a block or comment tag. */
static void after_tag(lexer *L, char sign, char kind)
{
    size_t start = L->pos, k;
    if (sign == '-') {
        while (L->pos < L->n && (k = ppn_tmpl_ws(L->s + L->pos, L->n - L->pos))) L->pos += k;
    } else if (sign != '+' && kind != '{' && L->pos < L->n && L->s[L->pos] == '\n') {
        L->pos++;
    }
    L->line_starting = L->pos > start && L->s[L->pos - 1] == '\n';
    L->line += count_lines(L->s + start, L->pos - start);
}

static int hexval(int c) { return isdigit(c) ? c - '0' : tolower(c) - 'a' + 10; }

/* Python's unicode-escape on a string literal's body: known escapes decoded, an unknown one kept as is. */
static ppn_status unescape(lexer *L, const char *s, size_t n, ppn_tok_buf *b)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 == n) {
            PPN_CHECK(ppn_tok_buf_put(b, &c, 1));
            continue;
        }
        char e = s[++i], out = 0;
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        switch (e) {
        case 'n': out = '\n'; break;
        case 't': out = '\t'; break;
        case 'r': out = '\r'; break;
        case 'b': out = '\b'; break;
        case 'f': out = '\f'; break;
        case 'v': out = '\v'; break;
        case 'a': out = '\a'; break;
        case '\\': case '\'': case '"': out = e; break;
        case '\n': continue;   /* a backslash-newline joins lines */
        default: break;
        }
        if (out) {
            PPN_CHECK(ppn_tok_buf_put(b, &out, 1));
        } else if (e >= '0' && e <= '7') {
            unsigned cp = 0;
            int k = 0;
            for (; k < 3 && i < n && s[i] >= '0' && s[i] <= '7'; k++, i++) cp = cp * 8 + (unsigned)(s[i] - '0');
            i--;
            char u[4];
            PPN_CHECK(ppn_tok_buf_put(b, u, (size_t)ppn_tok_utf8_put(u, cp)));
        } else if (digits) {
            uint32_t cp = 0;
            for (int k = 1; k <= digits; k++) {
                if (i + (size_t)k >= n || !isxdigit((unsigned char)s[i + (size_t)k]))
                    return ppn_err(PPN_EFORMAT, "%s line %d: a truncated \\%c escape", L->p->t->name, L->line, e);
                cp = cp * 16 + (uint32_t)hexval((unsigned char)s[i + (size_t)k]);
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp < 0xe000))
                return ppn_err(PPN_EUNSUPPORTED, "%s line %d: escape \\%c for code point %x", L->p->t->name, L->line, e,
                               cp);
            i += (size_t)digits;
            char u[4];
            PPN_CHECK(ppn_tok_buf_put(b, u, (size_t)ppn_tok_utf8_put(u, cp)));
        } else {
            PPN_CHECK(ppn_tok_buf_put(b, s + i - 1, 2));
        }
    }
    return PPN_OK;
}

static ppn_status lex_string(lexer *L)
{
    char q = L->s[L->pos];
    size_t i = L->pos + 1;
    while (i < L->n && L->s[i] != q) i += L->s[i] == '\\' ? 2 : 1;
    if (i >= L->n) return syntax(L->p, L->line, "a string literal is not closed", "");
    ppn_tok_buf b = {0};
    ppn_status st = unescape(L, L->s + L->pos + 1, i - L->pos - 1, &b);
    json_t *v = st == PPN_OK ? json_stringn_nocheck(b.len ? b.p : "", b.len) : NULL;
    free(b.p);
    if (st != PPN_OK) return st;
    if (!v) return nomem();
    st = push(L->p, T_STR, L->line, NULL, 0, v);
    L->line += count_lines(L->s + L->pos, i - L->pos);
    L->pos = i + 1;
    return st;
}

static ppn_status lex_number(lexer *L)
{
    const char *s = L->s + L->pos;
    size_t i = 0;
    int is_float = 0;
    while (isdigit((unsigned char)s[i]) || s[i] == '_') i++;
    if (s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        is_float = 1;
        for (i++; isdigit((unsigned char)s[i]) || s[i] == '_'; i++) {}
    }
    if ((s[i] == 'e' || s[i] == 'E') &&
        (isdigit((unsigned char)s[i + 1]) || ((s[i + 1] == '+' || s[i + 1] == '-') && isdigit((unsigned char)s[i + 2])))) {
        is_float = 1;
        for (i += 2; isdigit((unsigned char)s[i]); i++) {}
    }
    char buf[64];
    size_t k = 0;
    for (size_t j = 0; j < i; j++) {
        if (s[j] == '_') continue;
        if (k + 1 >= sizeof buf) return syntax(L->p, L->line, "a number literal longer than 63 digits", "");
        buf[k++] = s[j];
    }
    buf[k] = '\0';
    errno = 0;
    long long iv = is_float ? 0 : strtoll(buf, NULL, 10);
    if (errno == ERANGE) /* Python's integers have no bound; ppn's are 64-bit */
        return ppn_err(PPN_EUNSUPPORTED, "%s line %d: the integer literal %s is beyond 64 bits: not implemented",
                       L->p->t->name, L->line, buf);
    double fv = is_float ? strtod(buf, NULL) : 0.0;
    if (is_float && !isfinite(fv)) /* Python reads it as inf; jansson holds no inf */
        return ppn_err(PPN_EUNSUPPORTED, "%s line %d: the float literal %s is beyond the double range: not implemented",
                       L->p->t->name, L->line, buf);
    json_t *v = is_float ? json_real(fv) : json_integer(iv);
    if (!v) return nomem();
    L->pos += i;
    return push(L->p, is_float ? T_FLOAT : T_INT, L->line, NULL, 0, v);
}

static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**"};

/* The tokens inside one tag up to its end (`}}`, `%}` or `#}` with an optional `-`/`+` before it). */
static ppn_status lex_tag(lexer *L, char kind)
{
    const char close = kind == '{' ? '}' : '%';
    int start_line = L->line;
    for (;;) {
        while (L->pos < L->n && isspace((unsigned char)L->s[L->pos])) L->line += L->s[L->pos++] == '\n';
        if (L->pos >= L->n) return syntax(L->p, start_line, "a tag is not closed", "");
        const char *s = L->s + L->pos;
        size_t left = L->n - L->pos;
        char sign = 0;
        if ((s[0] == '-' || s[0] == '+') && left >= 3 && s[1] == close && s[2] == '}') sign = s[0];
        if (sign || (left >= 2 && s[0] == close && s[1] == '}')) {
            L->pos += sign ? 3 : 2;
            PPN_CHECK(push(L->p, kind == '{' ? T_VEND : T_BEND, L->line, NULL, 0, NULL));
            after_tag(L, sign, kind);
            return PPN_OK;
        }
        if (s[0] == '\'' || s[0] == '"') {
            PPN_CHECK(lex_string(L));
        } else if (isdigit((unsigned char)s[0])) {
            PPN_CHECK(lex_number(L));
        } else if (isalpha((unsigned char)s[0]) || s[0] == '_') {
            size_t k = 1;
            while (isalnum((unsigned char)s[k]) || s[k] == '_') k++;
            PPN_CHECK(push(L->p, T_NAME, L->line, s, k, NULL));
            L->pos += k;
        } else {
            size_t k = 0;
            for (size_t j = 0; j < PPN_ARRAY_LEN(ops2) && left >= 2; j++)
                if (!memcmp(s, ops2[j], 2)) k = 2;
            if (!k && strchr("+-*/%~<>=.,:|()[]{}", s[0])) k = 1;
            if (!k) {
                char what[8] = {s[0], 0};
                return syntax(L->p, L->line, "an unexpected character ", what);
            }
            PPN_CHECK(push(L->p, T_OP, L->line, s, k, NULL));
            L->pos += k;
        }
    }
}

/* A comment: skipped, its whitespace control applied. */
static ppn_status lex_comment(lexer *L)
{
    const char *end = NULL;
    for (size_t i = L->pos; i + 1 < L->n; i++)
        if (L->s[i] == '#' && L->s[i + 1] == '}') {
            end = L->s + i;
            break;
        }
    if (!end) return syntax(L->p, L->line, "a comment is not closed", "");
    char sign = end > L->s + L->pos && (end[-1] == '-' || end[-1] == '+') ? end[-1] : 0;
    size_t to = (size_t)(end - L->s) + 2;
    L->line += count_lines(L->s + L->pos, to - L->pos);
    L->pos = to;
    after_tag(L, sign, '#');
    return PPN_OK;
}

static ppn_status lex(parser *p)
{
    lexer L = {p, p->t->src, strlen(p->t->src), 0, 1, 1};
    while (L.pos < L.n) {
        char kind = 0;
        size_t at = next_tag(&L, L.pos, &kind);
        char sign = at + 2 < L.n && (L.s[at + 2] == '-' || L.s[at + 2] == '+') ? L.s[at + 2] : 0;
        PPN_CHECK(lex_text(&L, at, kind, sign));
        if (at == L.n) break;
        L.pos = at + 2 + (sign ? 1 : 0);
        L.line_starting = 0;
        if (kind == '#') {
            PPN_CHECK(lex_comment(&L));
            continue;
        }
        PPN_CHECK(push(p, kind == '{' ? T_VBEGIN : T_BBEGIN, L.line, NULL, 0, NULL));
        PPN_CHECK(lex_tag(&L, kind));
    }
    return push(p, T_EOF, L.line, NULL, 0, NULL);
}

/* ---- the parser ---- */

static tok *peek(parser *p) { return &p->v[p->i]; }
static tok *take(parser *p) { return &p->v[p->i < p->n - 1 ? p->i++ : p->i]; }

static int is_op(const tok *k, const char *op) { return k->type == T_OP && k->n == strlen(op) && !memcmp(k->s, op, k->n); }
static int is_name(const tok *k, const char *nm)
{
    return k->type == T_NAME && k->n == strlen(nm) && !memcmp(k->s, nm, k->n);
}

static const char *describe(const tok *k, char *buf, size_t cap)
{
    switch (k->type) {
    case T_NAME: case T_OP: snprintf(buf, cap, "'%.*s'", (int)(k->n < 40 ? k->n : 40), k->s); return buf;
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    case T_VEND: case T_BEND: return "the end of the tag";
    case T_EOF: return "the end of the template";
    default: return "text";
    }
}

static ppn_status expect_fail(parser *p, const char *what)
{
    char buf[64], msg[128];
    snprintf(msg, sizeof msg, "expected %s, found ", what);
    return syntax(p, peek(p)->line, msg, describe(peek(p), buf, sizeof buf));
}

static ppn_status expect_op(parser *p, const char *op)
{
    if (!is_op(peek(p), op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        return expect_fail(p, w);
    }
    take(p);
    return PPN_OK;
}

static char *tok_name(const tok *k)
{
    char *s = malloc(k->n + 1);
    if (s) {
        memcpy(s, k->s, k->n);
        s[k->n] = '\0';
    }
    return s;
}

static void expr_free(tmpl_expr *e);

static tmpl_expr *expr_new(tmpl_ekind kind, int line)
{
    tmpl_expr *e = calloc(1, sizeof *e);
    if (e) {
        e->kind = kind;
        e->line = line;
    }
    return e;
}

static void expr_free(tmpl_expr *e)
{
    if (!e) return;
    json_decref(e->lit);
    free(e->name);
    expr_free(e->a);
    expr_free(e->b);
    expr_free(e->c);
    for (int i = 0; i < e->n_args; i++) {
        expr_free(e->args[i]);
        if (e->kw) free(e->kw[i]);
    }
    free(e->args);
    free(e->kw);
    free(e);
}

static ppn_status add_arg(tmpl_expr *e, tmpl_expr *arg, char *kw)
{
    tmpl_expr **args = realloc(e->args, (size_t)(e->n_args + 1) * sizeof *args);
    char **kws = args ? realloc(e->kw, (size_t)(e->n_args + 1) * sizeof *kws) : NULL;
    if (args) e->args = args;
    if (!kws) {
        expr_free(arg);
        free(kw);
        return nomem();
    }
    e->kw = kws;
    e->args[e->n_args] = arg;
    e->kw[e->n_args++] = kw;
    return PPN_OK;
}

static ppn_status parse_expr(parser *p, tmpl_expr **out);
static ppn_status parse_or(parser *p, tmpl_expr **out);
static ppn_status parse_unary(parser *p, int with_filter, tmpl_expr **out);
static ppn_status parse_primary(parser *p, tmpl_expr **out);
static ppn_status parse_postfix(parser *p, tmpl_expr **e);

static ppn_status unsupported(parser *p, int line, const char *what, const char *name)
{
    return ppn_err(PPN_EUNSUPPORTED, "%s line %d: %s '%s' is not implemented", p->t->name, line, what, name);
}

/* One expression appended to e's arguments (kw: its keyword, taken over); on failure nothing leaks. */
static ppn_status parse_arg(parser *p, tmpl_expr *e, char *kw)
{
    tmpl_expr *a = NULL;
    ppn_status st = parse_expr(p, &a);
    if (st != PPN_OK) {
        expr_free(a);
        free(kw);
        return st;
    }
    return add_arg(e, a, kw);
}

/* `(a, b, key=c)` into e's arguments (the '(' already taken). */
static ppn_status parse_args(parser *p, tmpl_expr *e)
{
    while (!is_op(peek(p), ")")) {
        if (e->n_args) PPN_CHECK(expect_op(p, ","));
        if (is_op(peek(p), ")")) break;
        char *kw = NULL;
        if (peek(p)->type == T_NAME && is_op(&p->v[p->i + 1], "=")) {
            if (!(kw = tok_name(take(p)))) return nomem();
            take(p);
        } else if (is_op(peek(p), "*") || is_op(peek(p), "**")) {
            return unsupported(p, peek(p)->line, "syntax", "*args/**kwargs");
        }
        PPN_CHECK(parse_arg(p, e, kw));
    }
    take(p);
    return PPN_OK;
}

/* A list, tuple or dict display; close is ']' or ')' or '}'. */
static ppn_status parse_display(parser *p, tmpl_expr *e, const char *close, int dict)
{
    int n = 0;
    while (!is_op(peek(p), close)) {
        if (n++) {
            PPN_CHECK(expect_op(p, ","));
            if (is_op(peek(p), close)) break;
        }
        PPN_CHECK(parse_arg(p, e, NULL));
        if (dict) {
            PPN_CHECK(expect_op(p, ":"));
            PPN_CHECK(parse_arg(p, e, NULL));
        }
    }
    take(p);
    return PPN_OK;
}

static ppn_status parse_literal_name(parser *p, tok *k, tmpl_expr **out)
{
    static const struct { const char *name; int v; } kw[] = {
        {"true", 1}, {"True", 1}, {"false", 0}, {"False", 0}, {"none", 2}, {"None", 2}};
    for (size_t j = 0; j < PPN_ARRAY_LEN(kw); j++)
        if (is_name(k, kw[j].name)) {
            if (!(*out = expr_new(E_LIT, k->line))) return nomem();
            (*out)->lit = kw[j].v == 2 ? json_null() : json_boolean(kw[j].v);
            return PPN_OK;
        }
    if (!(*out = expr_new(E_NAME, k->line)) || !((*out)->name = tok_name(k))) return nomem();
    (void)p;
    return PPN_OK;
}

static ppn_status parse_primary(parser *p, tmpl_expr **out)
{
    tok *k = take(p);
    if (k->type == T_NAME) return parse_literal_name(p, k, out);
    if (k->type == T_STR || k->type == T_INT || k->type == T_FLOAT) {
        if (!(*out = expr_new(E_LIT, k->line))) return nomem();
        if (k->type != T_STR || peek(p)->type != T_STR) {
            (*out)->lit = json_incref(k->val);
            return PPN_OK;
        }
        ppn_tok_buf b = {0};   /* adjacent string literals join, as in Python */
        ppn_status st = ppn_tok_buf_put(&b, json_string_value(k->val), json_string_length(k->val));
        while (st == PPN_OK && peek(p)->type == T_STR) {
            tok *s = take(p);
            st = ppn_tok_buf_put(&b, json_string_value(s->val), json_string_length(s->val));
        }
        if (st == PPN_OK && !((*out)->lit = json_stringn_nocheck(b.p, b.len))) st = nomem();
        free(b.p);
        return st;
    }
    if (is_op(k, "(")) {
        PPN_CHECK(parse_expr(p, out));
        if (is_op(peek(p), ",")) return unsupported(p, k->line, "syntax", "tuple");
        return expect_op(p, ")");
    }
    if (is_op(k, "[") || is_op(k, "{")) {
        int dict = is_op(k, "{");
        if (!(*out = expr_new(dict ? E_DICT : E_LIST, k->line))) return nomem();
        return parse_display(p, *out, dict ? "}" : "]", dict);
    }
    p->i--;
    return expect_fail(p, "an expression");
}

/* [a], [a:b:c] after an object. */
static ppn_status parse_subscript(parser *p, tmpl_expr **e, int line)
{
    tmpl_expr *parts[3] = {0};
    int colons = 0;
    ppn_status st = PPN_OK;
    while (st == PPN_OK && !is_op(peek(p), "]")) {
        if (is_op(peek(p), ":")) {
            take(p);
            if (++colons > 2) st = expect_fail(p, "']'");
        } else if (parts[colons]) {
            st = expect_fail(p, "':' or ']'");
        } else {
            st = parse_expr(p, &parts[colons]);
        }
    }
    tmpl_expr *n = st == PPN_OK ? expr_new(colons ? E_SLICE : E_ITEM, line) : NULL;
    if (st == PPN_OK && !n) st = nomem();
    if (st == PPN_OK && !colons && !parts[0]) st = expect_fail(p, "a subscript");
    if (st != PPN_OK) {
        for (int j = 0; j < 3; j++) expr_free(parts[j]);
        expr_free(n);
        return st;
    }
    take(p);
    n->a = *e;
    n->b = parts[0];
    n->c = parts[1];
    if (colons && (st = add_arg(n, parts[2], NULL)) != PPN_OK) {
        *e = n;
        return st;
    }
    if (!colons) expr_free(parts[2]);
    *e = n;
    return PPN_OK;
}

/* A call: a global function by name, or a method on an object. */
static ppn_status parse_call(parser *p, tmpl_expr **e, int line)
{
    tmpl_expr *f = *e;
    if (f->kind != E_NAME && f->kind != E_ATTR) return unsupported(p, line, "call of", "an expression");
    if (f->kind == E_NAME && !ppn_tmpl_has_function(f->name)) return unsupported(p, line, "function", f->name);
    if (f->kind == E_ATTR && !ppn_tmpl_has_method(f->name)) return unsupported(p, line, "method", f->name);
    tmpl_expr *c = expr_new(E_CALL, line);
    if (!c) return nomem();
    c->name = f->name;
    f->name = NULL;
    c->a = f->a;   /* the method's object (NULL for a function) */
    f->a = NULL;
    expr_free(f);
    *e = c;
    return parse_args(p, c);
}

static ppn_status parse_postfix(parser *p, tmpl_expr **e)
{
    for (;;) {
        tok *k = peek(p);
        if (is_op(k, ".")) {
            take(p);
            tok *nm = take(p);
            tmpl_expr *n = NULL;
            if (nm->type == T_NAME) {
                if (!(n = expr_new(E_ATTR, k->line)) || !(n->name = tok_name(nm))) {
                    expr_free(n);
                    return nomem();
                }
            } else if (nm->type == T_INT) {   /* x.0 is x[0] */
                if (!(n = expr_new(E_ITEM, k->line)) || !(n->b = expr_new(E_LIT, k->line))) {
                    expr_free(n);
                    return nomem();
                }
                n->b->lit = json_incref(nm->val);
            } else {
                p->i--;
                return expect_fail(p, "a name after '.'");
            }
            n->a = *e;
            *e = n;
        } else if (is_op(k, "[")) {
            take(p);
            PPN_CHECK(parse_subscript(p, e, k->line));
        } else if (is_op(k, "(")) {
            take(p);
            PPN_CHECK(parse_call(p, e, k->line));
        } else {
            return PPN_OK;
        }
    }
}

/* Whether the token can start a test's single argument written without parentheses. */
static int starts_test_arg(const tok *k)
{
    if (k->type == T_STR || k->type == T_INT || k->type == T_FLOAT || is_op(k, "[") || is_op(k, "{")) return 1;
    return k->type == T_NAME && !is_name(k, "else") && !is_name(k, "or") && !is_name(k, "and") &&
           !is_name(k, "is") && !is_name(k, "in") && !is_name(k, "if") && !is_name(k, "not");
}

/* `| name(args)` and `is [not] name args` after a unary operand. */
static ppn_status parse_filters(parser *p, tmpl_expr **e)
{
    for (;;) {
        tok *k = peek(p);
        int filter = is_op(k, "|"), test = is_name(k, "is");
        if (!filter && !test) return PPN_OK;
        take(p);
        tmpl_expr *f = expr_new(filter ? E_FILTER : E_TEST, k->line);
        if (!f) return nomem();
        f->a = *e;
        *e = f;
        if (test && is_name(peek(p), "not")) {
            take(p);
            f->negate = 1;
        }
        tok *nm = take(p);
        if (nm->type != T_NAME) {
            p->i--;
            return expect_fail(p, filter ? "a filter name" : "a test name");
        }
        if (!(f->name = tok_name(nm))) return nomem();
        if (filter && !ppn_tmpl_has_filter(f->name)) return unsupported(p, nm->line, "filter", f->name);
        if (test && !ppn_tmpl_has_test(f->name)) return unsupported(p, nm->line, "test", f->name);
        if (is_op(peek(p), "(")) {
            take(p);
            PPN_CHECK(parse_args(p, f));
        } else if (test && starts_test_arg(peek(p))) {
            tmpl_expr *a = NULL;
            ppn_status st = parse_primary(p, &a);
            if (st == PPN_OK) st = parse_postfix(p, &a);
            if (st != PPN_OK) {
                expr_free(a);
                return st;
            }
            PPN_CHECK(add_arg(f, a, NULL));
        }
    }
}

static ppn_status parse_unary(parser *p, int with_filter, tmpl_expr **out)
{
    tok *k = peek(p);
    if (is_op(k, "-") || is_op(k, "+")) {
        take(p);
        tmpl_expr *e = expr_new(is_op(k, "-") ? E_NEG : E_POS, k->line);
        if (!e) return nomem();
        *out = e;
        PPN_CHECK(parse_unary(p, 0, &e->a));
    } else {
        PPN_CHECK(parse_primary(p, out));
        PPN_CHECK(parse_postfix(p, out));
    }
    return with_filter ? parse_filters(p, out) : PPN_OK;
}

/* Wrap *left as the left operand of a new node (its right operand parsed next into (*left)->b). */
static ppn_status binary(tmpl_expr **left, tmpl_ekind kind, const char *op, int line)
{
    tmpl_expr *e = expr_new(kind, line);
    if (!e) return nomem();
    snprintf(e->op, sizeof e->op, "%s", op);
    e->a = *left;
    *left = e;
    return PPN_OK;
}

/* One level of left-associative binary operators: ops is a NULL-ended list; next parses the operands. */
static ppn_status parse_level(parser *p, tmpl_expr **out, const char *const *ops,
                              ppn_status (*next)(parser *, tmpl_expr **))
{
    PPN_CHECK(next(p, out));
    for (;;) {
        tok *k = peek(p);
        const char *op = NULL;
        for (int j = 0; ops[j]; j++)
            if (is_op(k, ops[j])) op = ops[j];
        if (!op) return PPN_OK;
        take(p);
        PPN_CHECK(binary(out, E_BIN, op, k->line));
        PPN_CHECK(next(p, &(*out)->b));
    }
}

static ppn_status parse_unary_f(parser *p, tmpl_expr **out) { return parse_unary(p, 1, out); }
static ppn_status parse_pow(parser *p, tmpl_expr **out)
{
    static const char *const ops[] = {"**", NULL};
    return parse_level(p, out, ops, parse_unary_f);
}
static ppn_status parse_mul(parser *p, tmpl_expr **out)
{
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    return parse_level(p, out, ops, parse_pow);
}
static ppn_status parse_add(parser *p, tmpl_expr **out)
{
    static const char *const ops[] = {"+", "-", NULL};
    return parse_level(p, out, ops, parse_mul);
}
static ppn_status parse_concat(parser *p, tmpl_expr **out)
{
    static const char *const ops[] = {"~", NULL};
    return parse_level(p, out, ops, parse_add);
}

static ppn_status parse_compare(parser *p, tmpl_expr **out)
{
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    PPN_CHECK(parse_concat(p, out));
    for (;;) {
        tok *k = peek(p);
        const char *op = NULL;
        for (size_t j = 0; j < PPN_ARRAY_LEN(ops); j++)
            if (is_op(k, ops[j])) op = ops[j];
        if (is_name(k, "in")) op = "in";
        if (is_name(k, "not") && is_name(&p->v[p->i + 1], "in")) {
            take(p);
            op = "ni";
        }
        if (!op) return PPN_OK;
        take(p);
        PPN_CHECK(binary(out, E_BIN, op, k->line));
        PPN_CHECK(parse_concat(p, &(*out)->b));
    }
}

static ppn_status parse_not(parser *p, tmpl_expr **out)
{
    tok *k = peek(p);
    if (!is_name(k, "not")) return parse_compare(p, out);
    take(p);
    tmpl_expr *e = expr_new(E_NOT, k->line);
    if (!e) return nomem();
    *out = e;
    return parse_not(p, &e->a);
}

static ppn_status parse_logic(parser *p, tmpl_expr **out, const char *word, tmpl_ekind kind,
                              ppn_status (*next)(parser *, tmpl_expr **))
{
    PPN_CHECK(next(p, out));
    while (is_name(peek(p), word)) {
        int line = take(p)->line;
        PPN_CHECK(binary(out, kind, word, line));
        PPN_CHECK(next(p, &(*out)->b));
    }
    return PPN_OK;
}

static ppn_status parse_and(parser *p, tmpl_expr **out) { return parse_logic(p, out, "and", E_AND, parse_not); }
static ppn_status parse_or(parser *p, tmpl_expr **out) { return parse_logic(p, out, "or", E_OR, parse_and); }

/* or_expr [if or_expr [else expr]] */
static ppn_status parse_expr(parser *p, tmpl_expr **out)
{
    *out = NULL;
    PPN_CHECK(parse_or(p, out));
    while (is_name(peek(p), "if")) {
        int line = take(p)->line;
        tmpl_expr *c = expr_new(E_COND, line);
        if (!c) return nomem();
        c->b = *out;
        *out = c;
        PPN_CHECK(parse_or(p, &c->a));
        if (is_name(peek(p), "else")) {
            take(p);
            PPN_CHECK(parse_or(p, &c->c));
        }
    }
    return PPN_OK;
}

/* ---- statements ---- */

static void stmt_free(tmpl_stmt *s);

static void body_free(tmpl_body *b)
{
    for (int i = 0; i < b->n; i++) stmt_free(b->v[i]);
    free(b->v);
    *b = (tmpl_body){0};
}

static void stmt_free(tmpl_stmt *s)
{
    if (!s) return;
    expr_free(s->e);
    expr_free(s->cond);
    for (int i = 0; i < s->n_names; i++) free(s->names[i]);
    free(s->names);
    free(s->attr);
    body_free(&s->body);
    body_free(&s->other);
    free(s);
}

static ppn_status body_add(tmpl_body *b, tmpl_stmt *s)
{
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        tmpl_stmt **v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) {
            stmt_free(s);
            return nomem();
        }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = s;
    return PPN_OK;
}

static ppn_status block_end(parser *p)
{
    if (peek(p)->type != T_BEND) return expect_fail(p, "the end of the tag");
    take(p);
    return PPN_OK;
}

static ppn_status parse_body(parser *p, tmpl_body *b, const char *const *stops, const char **stopped);

/* Target names: `a` or `a, b` (for and set); with_attr: also `ns.attr`. */
static ppn_status parse_targets(parser *p, tmpl_stmt *s, int with_attr)
{
    do {
        if (s->n_names) take(p);
        tok *k = take(p);
        if (k->type != T_NAME) {
            p->i--;
            return expect_fail(p, "a name");
        }
        char **v = realloc(s->names, (size_t)(s->n_names + 1) * sizeof *v);
        if (!v) return nomem();
        s->names = v;
        if (!(s->names[s->n_names++] = tok_name(k))) return nomem();
        if (with_attr && s->n_names == 1 && is_op(peek(p), ".")) {
            take(p);
            tok *a = take(p);
            if (a->type != T_NAME) {
                p->i--;
                return expect_fail(p, "an attribute name");
            }
            if (!(s->attr = tok_name(a))) return nomem();
            return PPN_OK;
        }
    } while (is_op(peek(p), ","));
    return PPN_OK;
}

static ppn_status parse_if(parser *p, tmpl_stmt *s)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    const char *stopped = NULL;
    PPN_CHECK(parse_expr(p, &s->e));
    PPN_CHECK(block_end(p));
    PPN_CHECK(parse_body(p, &s->body, stops, &stopped));
    if (!strcmp(stopped, "elif")) {
        tmpl_stmt *e = calloc(1, sizeof *e);
        if (!e) return nomem();
        e->kind = S_IF;
        e->line = p->v[p->i - 1].line;
        PPN_CHECK(body_add(&s->other, e));
        return parse_if(p, e);   /* it takes the endif */
    }
    if (!strcmp(stopped, "else")) {
        static const char *const end[] = {"endif", NULL};
        PPN_CHECK(block_end(p));
        PPN_CHECK(parse_body(p, &s->other, end, &stopped));
    }
    return block_end(p);
}

static ppn_status parse_for(parser *p, tmpl_stmt *s)
{
    static const char *const stops[] = {"else", "endfor", NULL};
    const char *stopped = NULL;
    PPN_CHECK(parse_targets(p, s, 0));
    if (!is_name(peek(p), "in")) return expect_fail(p, "'in'");
    take(p);
    PPN_CHECK(parse_or(p, &s->e));
    if (is_name(peek(p), "if")) {
        take(p);
        PPN_CHECK(parse_or(p, &s->cond));
    }
    if (is_name(peek(p), "recursive")) return unsupported(p, peek(p)->line, "loop option", "recursive");
    PPN_CHECK(block_end(p));
    PPN_CHECK(parse_body(p, &s->body, stops, &stopped));
    if (!strcmp(stopped, "else")) {
        static const char *const end[] = {"endfor", NULL};
        PPN_CHECK(block_end(p));
        PPN_CHECK(parse_body(p, &s->other, end, &stopped));
    }
    return block_end(p);
}

static ppn_status parse_set(parser *p, tmpl_stmt *s)
{
    PPN_CHECK(parse_targets(p, s, 1));
    if (is_op(peek(p), "=")) {
        take(p);
        PPN_CHECK(parse_expr(p, &s->e));
        if (is_op(peek(p), ",")) return unsupported(p, peek(p)->line, "syntax", "tuple");
        return block_end(p);
    }
    if (s->n_names != 1 || s->attr) return expect_fail(p, "'='");
    if (is_op(peek(p), "|")) return unsupported(p, peek(p)->line, "syntax", "filtered block set");
    static const char *const end[] = {"endset", NULL};
    const char *stopped;
    s->kind = S_SETBLOCK;
    PPN_CHECK(block_end(p));
    PPN_CHECK(parse_body(p, &s->body, end, &stopped));
    return block_end(p);
}

/* One {% ... %} statement (the BBEGIN taken, the keyword at peek). */
static ppn_status parse_statement(parser *p, tmpl_body *b)
{
    tok *k = take(p);
    if (k->type != T_NAME) {
        p->i--;
        return expect_fail(p, "a statement");
    }
    tmpl_stmt *s = calloc(1, sizeof *s);
    if (!s) return nomem();
    s->line = k->line;
    PPN_CHECK(body_add(b, s));
    if (is_name(k, "if")) {
        s->kind = S_IF;
        return parse_if(p, s);
    }
    if (is_name(k, "for")) {
        s->kind = S_FOR;
        return parse_for(p, s);
    }
    if (is_name(k, "set")) {
        s->kind = S_SET;
        return parse_set(p, s);
    }
    if (is_name(k, "break") || is_name(k, "continue")) {
        s->kind = is_name(k, "break") ? S_BREAK : S_CONTINUE;
        return block_end(p);
    }
    if (is_name(k, "generation")) {   /* transformers' assistant-mask marker: renders its body */
        static const char *const end[] = {"endgeneration", NULL};
        const char *stopped;
        s->kind = S_BLOCK;
        PPN_CHECK(block_end(p));
        PPN_CHECK(parse_body(p, &s->body, end, &stopped));
        return block_end(p);
    }
    char *nm = tok_name(k);
    ppn_status st = nm ? unsupported(p, k->line, "statement", nm) : nomem();
    free(nm);
    return st;
}

/* Statements until one of stops (NULL: the end of the template); *stopped = the keyword met (taken). */
static ppn_status parse_body(parser *p, tmpl_body *b, const char *const *stops, const char **stopped)
{
    for (;;) {
        tok *k = take(p);
        if (k->type == T_EOF) {
            if (!stops) return PPN_OK;
            int last = 0;
            while (stops[last + 1]) last++;
            char msg[64];
            snprintf(msg, sizeof msg, "'{%% %s %%}' is missing", stops[last]);
            return syntax(p, k->line, msg, "");
        }
        if (k->type == T_TEXT) {
            tmpl_stmt *s = calloc(1, sizeof *s);
            if (!s) return nomem();
            *s = (tmpl_stmt){.kind = S_TEXT, .line = k->line, .text = k->s, .len = k->n};
            PPN_CHECK(body_add(b, s));
        } else if (k->type == T_VBEGIN) {
            tmpl_stmt *s = calloc(1, sizeof *s);
            if (!s) return nomem();
            *s = (tmpl_stmt){.kind = S_OUT, .line = k->line};
            PPN_CHECK(body_add(b, s));
            PPN_CHECK(parse_expr(p, &s->e));
            if (peek(p)->type != T_VEND) return expect_fail(p, "'}}'");
            take(p);
        } else if (k->type == T_BBEGIN) {
            tok *w = peek(p);
            for (int j = 0; stops && stops[j]; j++)
                if (is_name(w, stops[j])) {
                    take(p);
                    *stopped = stops[j];
                    return PPN_OK;
                }
            static const char *const ends[] = {"elif", "else", "endif", "endfor", "endset", "endgeneration"};
            for (size_t j = 0; j < PPN_ARRAY_LEN(ends); j++)
                if (is_name(w, ends[j])) return syntax(p, w->line, "unexpected ", ends[j]);
            PPN_CHECK(parse_statement(p, b));
        } else {
            p->i--;
            return expect_fail(p, "a tag");
        }
    }
}

ppn_status ppn_tmpl_parse(ppn_tmpl *t, const char *src, size_t len)
{
    PPN_CHECK(normalize(t, src, len));
    parser p = {.t = t};
    ppn_status st = lex(&p);
    if (st == PPN_OK) st = parse_body(&p, &t->root, NULL, NULL);
    for (int i = 0; i < p.n; i++) json_decref(p.v[i].val);
    free(p.v);
    return st;
}

void ppn_tmpl_clear(ppn_tmpl *t)
{
    body_free(&t->root);
    free(t->src);
    free(t->name);
    *t = (ppn_tmpl){0};
}
