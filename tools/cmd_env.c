/* cmd_env.c - `ppn env`: every environment variable ppn reads (the table of core/base/env.c), and what this
 * environment sets, each value checked against its rule. Exit 0 when every set value is valid, 1 when one is
 * not (or the door's variables disagree with each other), 2 for a usage error. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"
#include "core/base/env.h"
#include "core/base/err.h"

/* Room for a rule: every rule of the table fits in 256 bytes (env.h). */
#define ENV_RULE_CHARS 256

/* What this environment says of one variable. */
typedef enum { SEEN_UNSET, SEEN_OK, SEEN_INVALID, SEEN_IGNORED, SEEN_UNCHECKED } env_seen;

static const char *const seen_names[] = {
    [SEEN_UNSET] = "unset", [SEEN_OK] = "ok", [SEEN_INVALID] = "invalid", [SEEN_IGNORED] = "ignored",
    [SEEN_UNCHECKED] = "unchecked",
};

static const char *kind_name(ppn_env_kind k)
{
    static const char *const names[] = {
        [PPN_ENV_FLAG] = "flag", [PPN_ENV_INT] = "int",   [PPN_ENV_SIZE] = "size",
        [PPN_ENV_ENUM] = "enum", [PPN_ENV_INTS] = "ints", [PPN_ENV_TEXT] = "text",
    };
    return names[k];
}

/* The variable's state; *value its raw text (NULL when unset or empty). An invalid one leaves its message in
 * ppn_last_error(). */
static env_seen seen(const ppn_env_var *v, const char **value)
{
    ppn_env_str(v->name, value);
    if (!*value) return SEEN_UNSET;
    if (ppn_env_ignored(v)) return SEEN_IGNORED;
    if (v->kind == PPN_ENV_TEXT) return SEEN_UNCHECKED;
    return ppn_env_check(v) == PPN_OK ? SEEN_OK : SEEN_INVALID;
}

static const char *def_text(const ppn_env_var *v) { return v->def ? v->def : "-"; }

/* The door's variables valid one by one may still disagree (MEMRA_PP_SPLIT with MEMRA_PP_STAGES=3): the
 * door's own reading says so. NULL when it agrees; else its message (static until the next ppn call). */
static const char *door_disagrees(void)
{
    ppn_door d;
    return ppn_door_from_env(&d) == PPN_OK ? NULL : ppn_last_error();
}

static void print_table(void)
{
    char rule[ENV_RULE_CHARS];
    printf("Every environment variable ppn reads. Unset or empty: the default; a value that breaks its rule is\n"
           "refused with the variable, the value and the rule.\n\n");
    printf("%-29s %-12s %-20s %s\n", "VARIABLE", "READ BY", "DEFAULT", "MUST BE");
    for (int i = 0; i < ppn_env_count(); i++) {
        const ppn_env_var *v = ppn_env_at(i);
        printf("%-29s %-12s %-20s %s\n", v->name, ppn_env_area_name(v->area), def_text(v),
               ppn_env_rule(v, rule, sizeof rule));
        printf("%-29s %s%s\n", "", v->doc, v->gated ? " (read only while the door is open)" : "");
    }
}

/* The variables set here, each with its state; returns 1 if one is invalid. */
static int print_set(void)
{
    int bad = 0, any = 0;
    printf("\nset in this environment:\n");
    for (int i = 0; i < ppn_env_count(); i++) {
        const ppn_env_var *v = ppn_env_at(i);
        const char *value;
        env_seen s = seen(v, &value);
        if (s == SEEN_UNSET) continue;
        any = 1;
        printf("  %s=%s\n    ", v->name, value);
        if (s == SEEN_OK) printf("ok\n");
        else if (s == SEEN_INVALID) printf("INVALID: %s\n", ppn_last_error()), bad = 1;
        else if (s == SEEN_IGNORED) printf("ignored: the door is shut (MEMRA_PP_STAGES unset, 0 or 1)\n");
        else printf("not checked here: its reader (%s) checks it when it reads it\n", ppn_env_area_name(v->area));
    }
    if (!any) printf("  (none of them)\n");
    const char *door = bad ? NULL : door_disagrees();
    if (door) printf("\nthe door: INVALID: %s\n", door), bad = 1;
    return bad;
}

static json_t *var_json(const ppn_env_var *v, int *bad)
{
    char rule[ENV_RULE_CHARS];
    const char *value;
    env_seen s = seen(v, &value);
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:s, s:s, s:s, s:s, s:b, s:s?}", "name", v->name, "kind",
                          kind_name(v->kind), "area", ppn_env_area_name(v->area), "gated", v->gated, "rule",
                          ppn_env_rule(v, rule, sizeof rule), "default", def_text(v), "doc", v->doc, "state",
                          seen_names[s], "set", s != SEEN_UNSET, "value", value);
    if (s == SEEN_INVALID) *bad = 1;
    if (!o) /* jansson takes UTF-8 only: a value (and the message quoting it) that is not stays out */
        return json_pack("{s:s, s:s, s:b}", "name", v->name, "state", seen_names[s], "value_not_utf8", 1);
    if (s == SEEN_INVALID) json_object_set_new(o, "error", json_string(ppn_last_error()));
    return o;
}

static int print_json(void)
{
    int bad = 0;
    json_t *vars = json_array();
    for (int i = 0; i < ppn_env_count(); i++) json_array_append_new(vars, var_json(ppn_env_at(i), &bad));
    const char *door = bad ? NULL : door_disagrees();
    json_t *root = json_pack("{s:o, s:s?, s:b}", "variables", vars, "door_error", door, "valid", !bad && !door);
    char *text = json_dumps(root, JSON_INDENT(1));
    if (!text) return json_decref(root), cli_fail("env: out of memory");
    puts(text);
    free(text);
    json_decref(root);
    return bad || door;
}

static void env_usage(FILE *f)
{
    fputs("usage: ppn env [--json]\n"
          "Every environment variable ppn reads: who reads it, its default, what it must be and what it does;\n"
          "then each one set in this environment with its value, checked against its rule. Unset and empty\n"
          "mean the default. Exit status 0 when every set value is valid, 1 when one is not (or the door's\n"
          "variables disagree with each other).\n",
          f);
}

int cmd_env(int argc, char **argv)
{
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return env_usage(stdout), 0;
        else return cli_fail("env: unknown option '%s'", argv[i]), env_usage(stderr), 2;
    }
    if (json) return print_json();
    print_table();
    return print_set();
}
