/* test_template.c - chat templates against ../shared/fixtures/chat: every case of cases.jsonl rendered byte for
 * byte as transformers' apply_chat_template rendered it (the template errors refused with exactly their text),
 * and the render's ids through the family's tokenizer fixture equal the recorded ids; the refusals (an unknown
 * filter, test, method, function or statement named with its line, malformed syntax, raise_exception's message,
 * an undefined operand); loading from a checkpoint folder (tokenizer_config.json's chat_template and special
 * tokens, chat_template.jinja before it); the Jinja details the six templates do not reach; `ppn template`. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/util/tutil.h"

static ppn_template *parse_fixture(const char *family)
{
    char rel[64];
    snprintf(rel, sizeof rel, "chat/%s.jinja", family);
    size_t len;
    char *src = tu_read_file(tu_fixture(rel), &len);
    assert_non_null(src);
    ppn_template *t = NULL;
    ppn_status st = ppn_template_parse(src, len, rel, &t);
    free(src);
    if (st != PPN_OK) fail_msg("%s: %s: %s", rel, ppn_status_name(st), ppn_last_error());
    return t;
}

/* The tokenizer fixture each family's ids were made with (README: mistral uses Llama 2's as a stand-in). */
static const char *tok_of(const char *family)
{
    if (!strcmp(family, "llama3") || !strcmp(family, "llama31")) return "tok/llama3";
    if (!strcmp(family, "llama2") || !strcmp(family, "mistral")) return "tok/llama2";
    return "tok/qwen2";
}

static int same_ids(const ppn_tokenizer *tok, const char *text, json_t *want)
{
    int n = 0;
    (void)ppn_tokenize(tok, text, strlen(text), 0, NULL, 0, &n);   /* sizing: PPN_EINVAL with the count */
    int *ids = malloc((size_t)(n + 1) * sizeof *ids);
    EXPECT_OK(ppn_tokenize(tok, text, strlen(text), 0, ids, n + 1, &n));
    int same = (int)json_array_size(want) == n;
    for (int i = 0; same && i < n; i++) same = json_integer_value(json_array_get(want, (size_t)i)) == ids[i];
    free(ids);
    return same;
}

/* One case: the variables as the README's render call passes them, then the text (or the error) exact. */
static int check_case(const ppn_template *t, const ppn_tokenizer *tok, json_t *c)
{
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *vars = json_object();
    const char *keys[] = {"bos_token", "eos_token"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(c, keys[i]);
        if (json_is_string(v)) json_object_set(vars, keys[i], v);
    }
    if (json_object_get(c, "tools")) json_object_set(vars, "tools", json_object_get(c, "tools"));
    if (json_object_get(c, "template_kwargs")) json_object_update(vars, json_object_get(c, "template_kwargs"));
    char *msgs = json_dumps(json_object_get(c, "messages"), JSON_PRESERVE_ORDER);
    char *vj = json_dumps(vars, JSON_PRESERVE_ORDER);
    char *out = NULL;
    ppn_status st = ppn_template_render_json(t, msgs, vj, json_is_true(json_object_get(c, "add_generation_prompt")),
                                             &out);
    const char *want = json_string_value(json_object_get(c, "rendered"));
    const char *err = json_string_value(json_object_get(c, "error"));
    int ok = 1;
    if (want && st != PPN_OK) {
        print_message("  %s: %s: %s\n", name, ppn_status_name(st), ppn_last_error());
        ok = 0;
    } else if (want && strcmp(out, want)) {
        print_message("  %s: rendered\n----\n%s\n---- want\n%s\n----\n", name, out, want);
        ok = 0;
    } else if (want && !same_ids(tok, out, json_object_get(c, "ids"))) {
        print_message("  %s: the render's ids differ\n", name);
        ok = 0;
    } else if (err && (st != PPN_EINVAL || out || strcmp(ppn_last_error(), err))) {
        print_message("  %s: want the error '%s', got %s '%s'\n", name, err, ppn_status_name(st),
                      st ? ppn_last_error() : out);
        ok = 0;
    }
    free(out);
    free(msgs);
    free(vj);
    json_decref(vars);
    return ok;
}

static void check_family(const char *family)
{
    ppn_template *t = parse_fixture(family);
    ppn_tokenizer *tok = NULL;
    EXPECT_OK(ppn_tokenizer_load(tu_fixture(tok_of(family)), &tok));
    size_t len;
    char *text = tu_read_file(tu_fixture("chat/cases.jsonl"), &len);
    assert_non_null(text);
    int n = 0, bad = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *c = json_loads(line, 0, &je);
        if (!c) fail_msg("cases.jsonl: %s", je.text);
        if (!strcmp(json_string_value(json_object_get(c, "family")), family)) {
            n++;
            bad += !check_case(t, tok, c);
        }
        json_decref(c);
    }
    free(text);
    ppn_tokenizer_free(tok);
    ppn_template_free(t);
    print_message("%s: %d/%d cases pass\n", family, n - bad, n);
    assert_true(n >= 13);
    if (bad) fail_msg("%s: %d of %d cases differ from transformers", family, bad, n);
}

static void test_template_llama3(void **state) { (void)state, check_family("llama3"); }
static void test_template_llama2(void **state) { (void)state, check_family("llama2"); }
static void test_template_mistral(void **state) { (void)state, check_family("mistral"); }
static void test_template_qwen2(void **state) { (void)state, check_family("qwen2"); }
static void test_template_llama31(void **state) { (void)state, check_family("llama31"); }
static void test_template_qwen25(void **state) { (void)state, check_family("qwen25"); }

/* Render src with messages_json / vars_json; return the text (malloc'd) or NULL with *st set. */
static char *render(const char *src, const char *msgs, const char *vars, int agp, ppn_status *st)
{
    ppn_template *t = NULL;
    char *out = NULL;
    *st = ppn_template_parse(src, strlen(src), "t", &t);
    if (*st == PPN_OK) *st = ppn_template_render_json(t, msgs ? msgs : "[{\"role\":\"user\",\"content\":\"hi\"}]",
                                                      vars, agp, &out);
    ppn_template_free(t);
    return out;
}

static void expect_render(const char *src, const char *vars, const char *want)
{
    ppn_status st;
    char *out = render(src, NULL, vars, 0, &st);
    if (st != PPN_OK) fail_msg("'%s': %s: %s", src, ppn_status_name(st), ppn_last_error());
    if (strcmp(out, want)) fail_msg("'%s': got '%s' want '%s'", src, out, want);
    free(out);
}

/* src is refused with st, and the message holds each of the NULL-terminated words. */
static void expect_refused(const char *src, ppn_status want, ...)
{
    ppn_status st;
    char *out = render(src, NULL, NULL, 0, &st);
    if (st != want) fail_msg("'%s': want %s, got %s (%s)", src, ppn_status_name(want), ppn_status_name(st),
                             st ? ppn_last_error() : out);
    assert_null(out);
    va_list ap;
    va_start(ap, want);
    for (const char *w; (w = va_arg(ap, const char *));)
        if (!strstr(ppn_last_error(), w)) fail_msg("'%s': the message '%s' lacks '%s'", src, ppn_last_error(), w);
    va_end(ap);
}

static void test_template_refusals(void **state)
{
    (void)state;
    expect_refused("{{ x | wordwrap }}", PPN_EUNSUPPORTED, "filter 'wordwrap'", "line 1", NULL);
    expect_refused("a\n{% macro m() %}{% endmacro %}", PPN_EUNSUPPORTED, "statement 'macro'", "line 2", NULL);
    expect_refused("{% if x is callable %}{% endif %}", PPN_EUNSUPPORTED, "test 'callable'", NULL);
    expect_refused("{{ x.format(1) }}", PPN_EUNSUPPORTED, "method 'format'", NULL);
    expect_refused("{{ lipsum() }}", PPN_EUNSUPPORTED, "function 'lipsum'", NULL);
    expect_refused("{% for x in y recursive %}{% endfor %}", PPN_EUNSUPPORTED, "recursive", NULL);
    expect_refused("{% raw %}x{% endraw %}", PPN_EUNSUPPORTED, "statement 'raw'", NULL);
    expect_refused("{{ 'a %s' % 'b' }}", PPN_EUNSUPPORTED, "'%'", NULL);
    expect_refused("{% if x %}", PPN_EFORMAT, "endif", NULL);
    expect_refused("{{ x + }}", PPN_EFORMAT, "line 1", "expected an expression", NULL);
    expect_refused("{{ 'abc }}", PPN_EFORMAT, "not closed", NULL);
    expect_refused("{% endfor %}", PPN_EFORMAT, "unexpected endfor", NULL);
    expect_refused("\n\n{{ x ! y }}", PPN_EFORMAT, "line 3", NULL);
    expect_refused("{{ raise_exception('No ' ~ 'way') }}", PPN_EINVAL, "No way", NULL);
    expect_refused("x\n{{ undefined_thing + 'a' }}", PPN_EINVAL, "line 2", "undefined", NULL);
    expect_refused("{{ messages[0].role.strip.x }}", PPN_EINVAL, "undefined", NULL);
    /* fuzz_template: the keyword arguments evaluated before the misplaced positional one leaked */
    expect_refused("{{ namespace(n=0, s=[1], 2) }}", PPN_EINVAL, "positional argument follows keyword", NULL);
    /* Python's integers have no bound, ppn's are 64-bit: a literal or result past them is refused by name, never
     * wrapped or saturated (fuzz_template found 7000000043 + 5000000700500000070000 saturated, then overflowing) */
    expect_refused("{{ 7000000043 + 5000000700500000070000 }}", PPN_EUNSUPPORTED, "5000000700500000070000",
                   "beyond 64 bits", NULL);
    expect_refused("{{ 9223372036854775807 + 1 }}", PPN_EUNSUPPORTED, "'+' beyond 64 bits", NULL);
    expect_refused("{{ -9223372036854775807 - 2 }}", PPN_EUNSUPPORTED, "'-' beyond 64 bits", NULL);
    expect_refused("{{ 3037000500 * 3037000500 }}", PPN_EUNSUPPORTED, "'*' beyond 64 bits", NULL);
    expect_refused("{{ 2 ** 63 }}", PPN_EUNSUPPORTED, "'**' beyond 64 bits", NULL);
    expect_refused("{{ (-9223372036854775807 - 1) // -1 }}", PPN_EUNSUPPORTED, "'//' beyond 64 bits", NULL);
    expect_refused("{{ -(-9223372036854775807 - 1) }}", PPN_EUNSUPPORTED, "'-' beyond 64 bits", NULL);
    expect_refused("{{ (-9223372036854775807 - 1) | abs }}", PPN_EUNSUPPORTED, "'abs' beyond 64 bits", NULL);
    expect_refused("{{ '1e300' | int }}", PPN_EUNSUPPORTED, "'int' beyond 64 bits", NULL);
    expect_refused("{{ 1e300 * 1e300 }}", PPN_EUNSUPPORTED, "not finite", NULL);
    expect_refused("{{ 1e400 }}", PPN_EUNSUPPORTED, "1e400", "double range", NULL);
    expect_refused("{{ 1000000000000000000000000000000000000000000000000000000000000000000000 }}", PPN_EFORMAT,
                   "longer than 63 digits", NULL);
    expect_refused("{{ ('ab' * 600000) | length }}", PPN_EINVAL, "more than 1000000", NULL);
    ppn_status st;
    char *out = render("{{ 1 }}", "[]", NULL, 0, &st);
    assert_int_equal(st, PPN_EINVAL);
    assert_null(out);
    assert_string_equal(ppn_last_error(),
                        "Cannot apply chat template to an empty conversation. Provide at least one message.");
}

/* Jinja and Python behaviour the fixture templates do not reach. */
static void test_template_semantics(void **state)
{
    (void)state;
    expect_render("{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e20 }}|{{ [1, 'a', none] }}|{{ {'k': 0.5} }}", NULL,
                  "None|True|1.0|1e+20|[1, 'a', None]|{'k': 0.5}");
    expect_render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 2 }}", NULL,
                  "3 -4 2 3.5 1024 abab");
    /* the 64-bit edges Python computes exactly; ** by squaring (1 ** 10^18 in 60 steps) */
    expect_render("{{ 2 ** 62 }} {{ (-9223372036854775807 - 1) % -1 }} {{ 1 ** 1000000000000000000 }} {{ 7 % -2 }}"
                  " {{ 7.5 % -2 }} {{ 2 ** -1 }} {{ '9007199254740993' | int }} {{ -3.7 | int }}",
                  NULL, "4611686018427387904 0 1 -1 -0.5 0.5 9007199254740993 -3");
    expect_render("{{ range(9223372036854775800, 9223372036854775807, 5) | list }}", NULL,
                  "[9223372036854775800, 9223372036854775805]");
    expect_render("{{ [1,2,3][1::9223372036854775807] }} {{ 'abc'[1::9223372036854775807] }}"
                  " {{ [1,2,3][::-9223372036854775807 - 1] }} {{ 7 is divisibleby(-2) }} {{ -3 is odd }}"
                  " {{ (-9223372036854775807 - 1) is divisibleby(-1) }}",
                  NULL, "[2] b [3] False True True");
    expect_render("{% set ns = namespace(n=0) %}{% for x in [1,2,3] if x != 2 %}{% set ns.n = ns.n + x %}"
                  "{{ loop.index }}/{{ loop.length }}{% endfor %}={{ ns.n }}",
                  NULL, "1/22/2=4");
    expect_render("{% for x in [] %}a{% else %}empty{% endfor %}", NULL, "empty");
    expect_render("{% for k, v in {'a': 1, 'b': 2} | items %}{{ k }}{{ v }}{% if loop.last %}.{% endif %}{% endfor %}",
                  NULL, "a1b2.");
    expect_render("{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}"
                  "{% endif %}{{ x }}{% endfor %}",
                  NULL, "02");
    expect_render("{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}",
                  NULL, "a b|a|['a', 'b', '', 'c']|['a', 'b']");
    expect_render("{{ 'Hello'.startswith('He') }}{{ 'ÉCOLE' | lower }}{{ 'x' if false else 'y' }}{{ 'abc'[::-1] }}",
                  NULL, "Trueécoleycba");
    expect_render("{{ {'b': 'é\"\\n', 'a': [1, 2.5, true, none]} | tojson }}", NULL,
                  "{\"b\": \"é\\\"\\n\", \"a\": [1, 2.5, true, null]}");
    expect_render("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}", NULL,
                  "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    expect_render("{{ x | default('d') }}{{ '' | default('e', true) }}{{ [1,2] | length }}{{ 'héllo' | length }}", NULL,
                  "de25");
    expect_render("{{ ['a', 'b'] | join(', ') }}|{{ [{'n': 1}, {'n': 2}] | map(attribute='n') | list }}", NULL,
                  "a, b|[1, 2]");
    expect_render("{{ [1, 2, 3, 4] | select('even') | list }}{{ [1, 2, 3] | reject('equalto', 2) | list }}", NULL,
                  "[2, 4][1, 3]");
    /* whitespace control: lstrip_blocks only from a line's start, trim_blocks one newline, + turns them off */
    expect_render("a\n  {% if true %}\nb\n  {%+ if true %}c{% endif %}{% endif %}\n", NULL, "a\nb\n  c");
    expect_render("x {% if true %}y{% endif %}  \n  {{- 'z' }}{# c #}\nw", NULL, "x yzw");
    expect_render("{{ v }}", "{\"v\": \"from vars\"}", "from vars");
    expect_render("{% set x %}in{{ 1 }}{% endset %}{{ x }}", NULL, "in1");
}

/* A checkpoint folder: tokenizer_config.json's chat_template with its special tokens, and a chat_template.jinja
 * beside it taking precedence (transformers' order). */
static void test_template_load(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"bos_token\": {\"content\": \"<s>\", \"special\": true}, \"eos_token\": \"</s>\",\n"
          " \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
          "{{ eos_token }}{{ unk_token is defined }}\"}\n",
          f);
    fclose(f);
    ppn_template *t = NULL;
    EXPECT_OK(ppn_template_load(dir, &t));
    ppn_chat_msg m[2] = {{"user", "hi"}, {"assistant", "yo"}};
    char *out = NULL;
    EXPECT_OK(ppn_template_render(t, m, 2, 1, &out));
    assert_string_equal(out, "<s>[user:hi][assistant:yo]</s>False");
    free(out);
    ppn_template_free(t);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    f = fopen(path, "w");
    fputs("{{ eos_token }}{% if add_generation_prompt %}G{% endif %}\n", f);
    fclose(f);
    EXPECT_OK(ppn_template_load(dir, &t));
    EXPECT_OK(ppn_template_render(t, m, 1, 1, &out));
    assert_string_equal(out, "</s>G");
    free(out);
    ppn_template_free(t);
    f = fopen(path, "w");
    fputs("ok\n{{ x | nosuch }}", f);
    fclose(f);
    assert_int_equal(ppn_template_load(dir, &t), PPN_EUNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(ppn_last_error(), "chat_template.jinja line 2: filter 'nosuch'"));
    tu_rmrf(dir);
    free(dir);
    char *empty = tu_tmpdir();
    assert_int_equal(ppn_template_load(empty, &t), PPN_EIO);
    tu_rmrf(empty);
    free(empty);
    assert_int_equal(ppn_template_load(NULL, &t), PPN_EINVAL);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tu_write_file(path, text, strlen(text));
}

/* The first case of cases.jsonl named name (the caller decrefs it). */
static json_t *fixture_case(const char *name)
{
    size_t len;
    char *text = tu_read_file(tu_fixture("chat/cases.jsonl"), &len);
    assert_non_null(text);
    json_t *found = NULL;
    for (char *line = strtok(text, "\n"); line && !found; line = strtok(NULL, "\n")) {
        json_t *c = json_loads(line, 0, NULL);
        if (c && !strcmp(json_string_value(json_object_get(c, "name")), name)) found = c;
        else json_decref(c);
    }
    free(text);
    if (!found) fail_msg("cases.jsonl has no case '%s'", name);
    return found;
}

/* `ppn template`: a checkpoint folder with Llama 2's template and its tokens; the conversation on stdin (a list,
 * or an object with extra variables); the template's own error exits 1 with its message; usage errors exit 2. */
static void test_template_cli(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), args[8192], *out = NULL, *err = NULL;
    size_t len;
    char *src = tu_read_file(tu_fixture("chat/llama2.jinja"), &len);
    assert_non_null(src);
    json_t *cfg = json_pack("{ssssss}", "bos_token", "<s>", "eos_token", "</s>", "chat_template", src);
    free(src);
    char *cfg_text = json_dumps(cfg, 0);
    write_file(dir, "tokenizer_config.json", cfg_text);
    free(cfg_text);
    json_decref(cfg);
    json_t *c = fixture_case("llama2/multi_turn");
    char *msgs = json_dumps(json_object_get(c, "messages"), 0);
    write_file(dir, "conv.json", msgs);
    free(msgs);
    snprintf(args, sizeof args, "template --model %s %s < %s/conv.json", dir,
             json_is_true(json_object_get(c, "add_generation_prompt")) ? "--add-generation-prompt" : "", dir);
    int rc = tu_run_ppn("", args, &out, &err, NULL);
    if (rc) fail_msg("ppn template: exit %d: %s", rc, err);
    assert_string_equal(out, json_string_value(json_object_get(c, "rendered")));
    free(out), free(err);
    json_decref(c);
    /* an object with messages and a variable the template reads */
    write_file(dir, "conv.json", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"bos_token\": \"B\"}");
    snprintf(args, sizeof args, "template --model %s < %s/conv.json", dir, dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 0);
    assert_string_equal(out, "B[INST] x [/INST]");
    free(out), free(err);
    c = fixture_case("llama2/error_user_user");
    msgs = json_dumps(json_object_get(c, "messages"), 0);
    write_file(dir, "conv.json", msgs);
    free(msgs);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 1);
    assert_string_equal(out, "");
    if (!strstr(err, json_string_value(json_object_get(c, "error")))) fail_msg("stderr '%s'", err);
    free(out), free(err);
    json_decref(c);
    snprintf(args, sizeof args, "template --model %s --bogus < /dev/null", dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 2);
    assert_non_null(strstr(err, "unknown option '--bogus'"));
    free(out), free(err);
    assert_int_equal(tu_run_ppn("", "template < /dev/null", &out, &err, NULL), 2);
    free(out), free(err);
    assert_int_equal(tu_run_ppn("", "template --model /nonexistent < /dev/null", &out, &err, NULL), 1);
    free(out), free(err);
    snprintf(args, sizeof args, "template --model %s < /dev/null", dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 1);   /* no JSON on stdin */
    free(out), free(err);
    tu_rmrf(dir);
    free(dir);
}

/* ppn_template_end_of_turn: the special token each family's template closes an assistant turn with, the template
 * loaded from a folder holding it and the family tokenizer's config (the bos_token / eos_token variables: Llama
 * 2's </s> is its eos_token). */
static void test_template_end_of_turn(void **state)
{
    (void)state;
    static const struct { const char *family; int want; } c[] = {
        {"llama3", 128009}, {"llama31", 128009}, {"qwen2", 151645}, {"qwen25", 151645}, {"llama2", 2},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        ppn_tokenizer *tok = NULL;
        EXPECT_OK(ppn_tokenizer_load(tu_fixture(tok_of(c[i].family)), &tok));
        ppn_template *t = NULL;
        char *dir = tu_tmpdir(), rel[256];
        size_t n;
        snprintf(rel, sizeof rel, "%s/tokenizer_config.json", tok_of(c[i].family));
        char *cfg = tu_read_file(tu_fixture(rel), &n);
        snprintf(rel, sizeof rel, "chat/%s.jinja", c[i].family);
        char *src = tu_read_file(tu_fixture(rel), &n);
        assert_non_null(cfg), assert_non_null(src);
        write_file(dir, "tokenizer_config.json", cfg);
        write_file(dir, "chat_template.jinja", src);
        free(cfg), free(src);
        EXPECT_OK(ppn_template_load(dir, &t));
        if (ppn_template_end_of_turn(t, tok) != c[i].want)
            fail_msg("%s: end of turn %d, wanted %d", c[i].family, ppn_template_end_of_turn(t, tok), c[i].want);
        assert_int_equal(ppn_template_end_of_turn(t, NULL), -1);
        ppn_template_free(t);
        ppn_tokenizer_free(tok);
        tu_rmrf(dir);
        free(dir);
    }
    ppn_template *t = NULL;   /* a template that closes the turn with plain text: none */
    const char *plain = "{% for m in messages %}{{ m.content }}\n{% endfor %}";
    EXPECT_OK(ppn_template_parse(plain, strlen(plain), NULL, &t));
    ppn_tokenizer *tok = NULL;
    EXPECT_OK(ppn_tokenizer_load(tu_fixture("tok/qwen2"), &tok));
    assert_int_equal(ppn_template_end_of_turn(t, tok), -1);
    ppn_template_free(t);
    ppn_tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_template_llama3),   cmocka_unit_test(test_template_llama2),
        cmocka_unit_test(test_template_mistral),  cmocka_unit_test(test_template_qwen2),
        cmocka_unit_test(test_template_llama31),  cmocka_unit_test(test_template_qwen25),
        cmocka_unit_test(test_template_refusals), cmocka_unit_test(test_template_semantics),
        cmocka_unit_test(test_template_load),     cmocka_unit_test(test_template_cli),
        cmocka_unit_test(test_template_end_of_turn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
