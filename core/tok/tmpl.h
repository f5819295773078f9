/* tmpl.h - chat templates' internals: the Jinja subset Hugging Face chat templates use, parsed once into a tree
 * and rendered with transformers' environment (trim_blocks, lstrip_blocks, no trailing newline, loop controls,
 * raise_exception, namespace, Python's json.dumps as tojson).
 *
 * Files: tmpl_parse.c (source -> tokens -> tree; every statement, filter, test, method and function the tree
 * names is checked against what tmpl_eval.c implements, so a template outside the subset is refused at load, by
 * name and line), tmpl_eval.c (values are jansson values, NULL standing for Jinja's undefined; scopes, operators
 * with Python's semantics, filters, tests, methods), tmpl_str.c (Python's str(), repr() and json.dumps, Unicode
 * whitespace), template.c (the public ppn_template_* calls). Floor 1 with the rest of core/tok. */
#ifndef PPN_TMPL_H
#define PPN_TMPL_H

#include <jansson.h>
#include <stddef.h>
#include "ppn.h"
#include "core/tok/tok.h"

typedef enum {
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS, E_BIN,
    E_AND, E_OR, E_COND
} tmpl_ekind;

typedef struct tmpl_expr tmpl_expr;
struct tmpl_expr {
    tmpl_ekind kind;
    int line;
    char op[3];         /* E_BIN: "+", "==", "in", "ni" (not in), "//" ... */
    int negate;         /* E_TEST: `is not` */
    json_t *lit;        /* E_LIT */
    char *name;         /* E_NAME, E_ATTR, E_FILTER, E_TEST; E_CALL: the function or method */
    tmpl_expr *a, *b, *c;   /* operands; E_ATTR/E_ITEM/E_CALL(method)/E_FILTER/E_TEST: a = the object;
                             * E_ITEM: b = key; E_SLICE: a object, b/c/args[0] start/stop/step; E_COND: b if a else c */
    tmpl_expr **args;   /* E_LIST/E_CALL/E_FILTER/E_TEST arguments; E_DICT: key, value, key, value ... */
    char **kw;          /* keyword names of args (NULL entries for positional ones); NULL when none */
    int n_args;
};

typedef enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BLOCK, S_BREAK, S_CONTINUE } tmpl_skind;

typedef struct tmpl_stmt tmpl_stmt;
typedef struct tmpl_body {
    tmpl_stmt **v;
    int n, cap;
} tmpl_body;

struct tmpl_stmt {
    tmpl_skind kind;
    int line;
    const char *text;   /* S_TEXT: into the template's source */
    size_t len;
    tmpl_expr *e;       /* S_OUT, S_IF condition, S_FOR iterable, S_SET value */
    tmpl_expr *cond;    /* S_FOR: `if` filter */
    char **names;       /* S_FOR / S_SET targets (n_names); S_SET with attr: names[0].attr */
    int n_names;
    char *attr;
    tmpl_body body, other;   /* S_IF: then / else (an elif is an S_IF in other); S_FOR: body / else */
};

typedef struct ppn_tmpl {
    char *name;         /* for messages: where the template came from */
    char *src;          /* the normalized source (S_TEXT points into it) */
    tmpl_body root;
} ppn_tmpl;

/* tmpl_parse.c */
ppn_status ppn_tmpl_parse(ppn_tmpl *t, const char *src, size_t len);
void ppn_tmpl_clear(ppn_tmpl *t);

/* tmpl_eval.c: render with vars (a JSON object: the template's globals; not modified) into out. */
ppn_status ppn_tmpl_render(const ppn_tmpl *t, json_t *vars, ppn_tok_buf *out);
/* What the parser accepts: whether tmpl_eval.c implements the filter / test / global function / method. */
int ppn_tmpl_has_filter(const char *name);
int ppn_tmpl_has_test(const char *name);
int ppn_tmpl_has_function(const char *name);
int ppn_tmpl_has_method(const char *name);

/* tmpl_str.c */
/* The byte length of the Unicode whitespace character (Python's str.isspace) at s[0, n), or 0. */
size_t ppn_tmpl_ws(const char *s, size_t n);
/* The same for the character that ends at s + n. */
size_t ppn_tmpl_ws_back(const char *s, size_t n);
/* Python's str(v) appended to b (v NULL, undefined: nothing). */
ppn_status ppn_tmpl_str(ppn_tok_buf *b, const json_t *v);
/* Python's repr(v). */
ppn_status ppn_tmpl_repr(ppn_tok_buf *b, const json_t *v);
/* json.dumps(v, ensure_ascii, indent (< 0: None), separators (NULL: the default), sort_keys). */
typedef struct tmpl_json_opts {
    int ensure_ascii, indent, sort_keys;
    const char *item_sep, *key_sep;
    char indent_str[64];   /* indent as a string (Python accepts either); used when indent_is_str */
    int indent_is_str;
} tmpl_json_opts;
ppn_status ppn_tmpl_json(ppn_tok_buf *b, const json_t *v, const tmpl_json_opts *o, int depth);

#endif
