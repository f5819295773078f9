/* cmd_template.c - `ppn template --model DIR [--add-generation-prompt]`: a JSON conversation on stdin, the
 * checkpoint's chat template rendered on stdout exactly (no newline added). stdin holds a list of messages, or an
 * object {"messages": [...], and any extra variables: "tools", "date_string" ...}. Exit 2 for a usage error, 1 for
 * a failure (the template's own raise_exception message printed as it is). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "tools/cli.h"

static int template_usage(FILE *f)
{
    fputs("usage: ppn template --model DIR [--add-generation-prompt] < conversation.json\n"
          "  renders DIR's chat template (chat_template.jinja, else tokenizer_config.json's chat_template) for the\n"
          "  conversation on stdin: a JSON list of messages ({\"role\": ..., \"content\": ...}), or an object with\n"
          "  \"messages\" and extra template variables (\"tools\", ...); prints the text with no newline added\n"
          "  --add-generation-prompt  end with the assistant's header, as for generation\n",
          f);
    return f == stdout ? 0 : 2;
}

/* stdin's JSON split into the messages and the extra variables (both malloc'd JSON text; vars may be NULL). */
static int read_conversation(char **msgs, char **vars)
{
    json_error_t je;
    json_t *in = json_loadf(stdin, 0, &je), *m = in, *extra = NULL;
    *msgs = *vars = NULL;
    if (!in) return cli_fail("template: stdin, line %d: %s", je.line, je.text);
    if (json_is_object(in)) {
        m = json_object_get(in, "messages");
        if (!m) {
            json_decref(in);
            return cli_fail("template: the object on stdin has no \"messages\"");
        }
        extra = json_copy(in);
        json_object_del(extra, "messages");
    }
    *msgs = json_dumps(m, JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    if (extra) *vars = json_dumps(extra, JSON_PRESERVE_ORDER);
    json_decref(extra);
    json_decref(in);
    return *msgs ? 0 : cli_fail("template: out of memory");
}

int cmd_template(int argc, char **argv)
{
    const char *model = NULL, *v;
    int agp = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) return template_usage(stdout);
        if (!strcmp(f, "--model")) {
            if (!(v = cli_value(argc, argv, &i))) return template_usage(stderr);
            model = v;
        } else if (!strcmp(f, "--add-generation-prompt")) {
            agp = 1;
        } else {
            cli_fail("template: unknown option '%s'", f);
            return template_usage(stderr);
        }
    }
    if (!model) {
        cli_fail("template: --model is required");
        return template_usage(stderr);
    }
    ppn_template *t = NULL;
    ppn_status st = ppn_template_load(model, &t);
    if (st != PPN_OK) return cli_fail_status(st, "loading the chat template");
    char *msgs = NULL, *vars = NULL, *out = NULL;
    int rc = read_conversation(&msgs, &vars);
    if (!rc && (st = ppn_template_render_json(t, msgs, vars, agp, &out)) != PPN_OK) rc = cli_fail("%s", ppn_last_error());
    if (!rc) fwrite(out, 1, strlen(out), stdout);
    free(out);
    free(msgs);
    free(vars);
    ppn_template_free(t);
    return rc;
}
