/* run_text.c - the text side of `ppn run --prompt`: the tokenizer and chat template beside the checkpoint, the
 * prompt's ids, the stop ids, and the generated text streamed as the ids come. */
#include <jansson.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "tools/cli.h"
#include "tools/run_text.h"

/* The folder the tokenizer files sit in: model itself when it is a folder, else the folder holding it
 * (malloc'd; NULL when out of memory). */
static char *model_folder(const char *model)
{
    struct stat sb;
    if (!stat(model, &sb) && S_ISDIR(sb.st_mode)) return strdup(model);
    char *copy = strdup(model), *dir = copy ? strdup(dirname(copy)) : NULL;
    free(copy);
    return dir;
}

void run_text_add_stop(run_text *t, int id)
{
    if (id < 0 || run_text_is_stop(t, id) || t->n_stop == RUN_TEXT_MAX_STOP) return;
    t->stop[t->n_stop++] = id;
}

int run_text_is_stop(const run_text *t, int id)
{
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop[i] == id) return 1;
    return 0;
}

/* The prompt's text: with chat, the template's rendering of [system,] user with the generation prompt (*text
 * malloc'd); else prompt itself (*text NULL). The template's end of turn joins the stop ids. */
static int prompt_text(run_text *t, const char *dir, const char *prompt, const char *system, int chat, char **text)
{
    ppn_template *tp = NULL;
    ppn_status st = ppn_template_load(dir, &tp);
    *text = NULL;
    if (st != PPN_OK) return chat ? cli_fail_status(st, "run: --chat needs the checkpoint's chat template") : 0;
    run_text_add_stop(t, ppn_template_end_of_turn(tp, t->tok));
    ppn_chat_msg msgs[2] = {{"system", system}, {"user", prompt}};
    if (chat && (st = ppn_template_render(tp, system ? msgs : msgs + 1, system ? 2 : 1, 1, text)) != PPN_OK) {
        ppn_template_free(tp);
        return cli_fail_status(st, "run: chat template");
    }
    ppn_template_free(tp);
    return 0;
}

static int tokenize(const run_text *t, const char *text, int add_special, int **ids, int *n)
{
    size_t len = strlen(text);
    ppn_status st = ppn_tokenize(t->tok, text, len, add_special, NULL, 0, n);
    if (st != PPN_OK && *n == 0) return cli_fail_status(st, "run: tokenize the prompt");
    if (!(*ids = malloc(sizeof(int) * (size_t)(*n ? *n : 1)))) return cli_fail("run: out of memory");
    if ((st = ppn_tokenize(t->tok, text, len, add_special, *ids, *n, n)) != PPN_OK)
        return cli_fail_status(st, "run: tokenize the prompt");
    if (*n == 0) return cli_fail("run: the prompt has no tokens");
    return 0;
}

int run_text_open(run_text *t, const char *model, const char *prompt, const char *system, int chat, int to_stdout,
                  int **ids, int *n_ids)
{
    *t = (run_text){.to_stdout = to_stdout};
    *ids = NULL;
    char *dir = model_folder(model), path[4096], *text = NULL;
    if (!dir) return cli_fail("run: out of memory");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    int rc = 0;
    ppn_status st;
    if (stat(path, &sb))
        rc = cli_fail("run: --prompt needs the checkpoint's tokenizer, and %s does not exist (give the prompt as "
                      "--ids)", path);
    else if ((st = ppn_tokenizer_load(dir, &t->tok)) != PPN_OK) rc = cli_fail_status(st, "run: tokenizer");
    else if ((st = ppn_detok_stream_create(t->tok, &t->ds)) != PPN_OK) rc = cli_fail_status(st, "run: detokenizer");
    if (rc == 0) run_text_add_stop(t, ppn_tokenizer_eos(t->tok));
    if (rc == 0) rc = prompt_text(t, dir, prompt, system, chat, &text);
    if (rc == 0) rc = tokenize(t, text ? text : prompt, !chat, ids, n_ids);
    free(text);
    free(dir);
    return rc;
}

/* Keep or print n bytes of text. */
static int emit(run_text *t, const char *s, size_t n)
{
    if (!n) return 0;
    if (t->to_stdout) {
        fwrite(s, 1, n, stdout);
        fflush(stdout);
        return 0;
    }
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *b = realloc(t->buf, cap);
        if (!b) return cli_fail("run: out of memory for the text");
        t->buf = b, t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->buf[t->len += n] = 0;
    return 0;
}

int run_text_push(run_text *t, int id)
{
    const char *s;
    size_t n;
    ppn_status st = ppn_detok_stream_push(t->ds, id, &s, &n);
    return st != PPN_OK ? cli_fail_status(st, "run: detokenize") : emit(t, s, n);
}

int run_text_finish(run_text *t)
{
    const char *s;
    size_t n;
    ppn_status st = ppn_detok_stream_flush(t->ds, &s, &n);
    if (st != PPN_OK) return cli_fail_status(st, "run: detokenize");
    int rc = emit(t, s, n);
    if (rc == 0 && t->to_stdout) putchar('\n');
    return rc;
}

void run_text_json(const run_text *t, FILE *f)
{
    fputs("\"stop_ids\":[", f);
    for (int i = 0; i < t->n_stop; i++) fprintf(f, "%s%d", i ? "," : "", t->stop[i]);
    json_t *s = json_stringn(t->buf ? t->buf : "", t->len);
    char *q = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    fprintf(f, "],\"text\":%s", q ? q : "null");
    free(q);
    json_decref(s);
}

void run_text_close(run_text *t)
{
    ppn_detok_stream_free(t->ds);
    ppn_tokenizer_free(t->tok);
    free(t->buf);
    *t = (run_text){0};
}
