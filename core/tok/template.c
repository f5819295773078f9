/* template.c - the public chat-template calls (ppn.h): a checkpoint's template found the way transformers finds
 * it (chat_template.jinja beside the tokenizer, else tokenizer_config.json's "chat_template"), parsed once, and
 * rendered with transformers' variables: messages (null-valued keys dropped), add_generation_prompt, tools and
 * documents (none unless given), the special tokens the config sets, then the caller's extra variables. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/base/err.h"
#include "core/tok/tmpl.h"
#include "core/tok/tok.h"

struct ppn_template {
    ppn_tmpl tmpl;
    json_t *vars;   /* the special tokens from the config: bos_token, eos_token ... */
    /* Renders take references to the parsed template's JSON constants and vars, and jansson's reference check
     * (json_incref reads the count without an atomic) races with another thread's atomic decrement: one render
     * at a time (ThreadSanitizer found it under ppn serve's concurrent chat requests). */
    pthread_mutex_t mu;
};

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                            "sep_token", "cls_token", "mask_token"};

static ppn_status nomem(void) { return ppn_err(PPN_ENOMEM, "chat template: out of memory"); }

static ppn_status make(const char *src, size_t len, const char *name, ppn_template **out)
{
    ppn_template *t = calloc(1, sizeof *t);
    if (t) pthread_mutex_init(&t->mu, NULL);
    if (!t || !(t->vars = json_object()) || !(t->tmpl.name = strdup(name))) {
        ppn_template_free(t);
        return nomem();
    }
    ppn_status st = ppn_tmpl_parse(&t->tmpl, src, len);
    if (st != PPN_OK) {
        ppn_template_free(t);
        return st;
    }
    *out = t;
    return PPN_OK;
}

ppn_status ppn_template_parse(const char *source, size_t len, const char *name, ppn_template **out)
{
    if (!out) return ppn_err(PPN_EINVAL, "ppn_template_parse: NULL argument");
    *out = NULL;
    if (!source) return ppn_err(PPN_EINVAL, "ppn_template_parse: NULL argument");
    if (!name) name = "chat template";
    for (size_t i = 0; i < len;) {
        int k = ppn_tok_utf8_len((const unsigned char *)source + i, len - i);
        if (!k || !source[i]) return ppn_err(PPN_EFORMAT, "%s: byte %zu is %s", name, i, k ? "NUL" : "not UTF-8");
        i += (size_t)k;
    }
    return make(source, len, name, out);
}

static ppn_status read_file(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return ppn_err(PPN_EIO, "%s: %s", path, strerror(errno));
    ppn_tok_buf b = {0};
    char chunk[65536];
    size_t n;
    ppn_status st = PPN_OK;
    while (st == PPN_OK && (n = fread(chunk, 1, sizeof chunk, f)) > 0) st = ppn_tok_buf_put(&b, chunk, n);
    if (st == PPN_OK && ferror(f)) st = ppn_err(PPN_EIO, "%s: read error", path);
    fclose(f);
    if (st == PPN_OK) st = ppn_tok_buf_put(&b, "", 1);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    *text = b.p;
    *len = b.len - 1;
    return PPN_OK;
}

static int is_file(const char *path)
{
    struct stat sb;
    return !stat(path, &sb) && S_ISREG(sb.st_mode);
}

/* A special token's text: a string, or an added-token object's "content". */
static const char *token_text(json_t *v)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

/* The special tokens tokenizer_config.json sets (special_tokens_map.json fills the ones it leaves out). */
static ppn_status read_specials(ppn_template *t, json_t *config, const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    json_t *map = is_file(path) ? json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL) : NULL;
    ppn_status st = PPN_OK;
    for (size_t i = 0; st == PPN_OK && i < PPN_ARRAY_LEN(special_names); i++) {
        const char *s = token_text(json_object_get(config, special_names[i]));
        if (!s) s = token_text(json_object_get(map, special_names[i]));
        if (s && json_object_set_new(t->vars, special_names[i], json_string(s))) st = nomem();
    }
    json_decref(map);
    return st;
}

/* tokenizer_config.json's "chat_template": a string, or a list of {name, template} (the one named "default"). */
static ppn_status config_template(json_t *config, const char *path, const char **src)
{
    json_t *v = json_object_get(config, "chat_template");
    if (json_is_string(v)) {
        *src = json_string_value(v);
        return PPN_OK;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) if (!strcmp(json_string_value(json_object_get(x, "name")) ?: "", "default")) {
            if ((*src = json_string_value(json_object_get(x, "template")))) return PPN_OK;
        }
        return ppn_err(PPN_EUNSUPPORTED, "%s: chat_template is a list of named templates without 'default'", path);
    }
    if (v && !json_is_null(v)) return ppn_err(PPN_EFORMAT, "%s: chat_template is neither a string nor a list", path);
    return ppn_err(PPN_EIO, "%s has no chat_template, and there is no chat_template.jinja beside it", path);
}

ppn_status ppn_template_load(const char *model_dir, ppn_template **out)
{
    if (!model_dir || !out) return ppn_err(PPN_EINVAL, "ppn_template_load: NULL argument");
    *out = NULL;
    char cfg_path[4096], jinja_path[4096], name[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", model_dir);
    snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", model_dir);
    json_t *config = NULL;
    if (is_file(cfg_path)) {
        json_error_t je;
        if (!(config = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je)))   /* model_max_length may be 1e30 */
            return ppn_err(PPN_EFORMAT, "%s line %d: %s", cfg_path, je.line, je.text);
    }
    ppn_status st = PPN_OK;
    char *text = NULL;
    size_t len = 0;
    if (is_file(jinja_path)) {
        snprintf(name, sizeof name, "%s", jinja_path);
        st = read_file(jinja_path, &text, &len);
        if (st == PPN_OK) st = ppn_template_parse(text, len, name, out);
    } else if (!config) {
        st = ppn_err(PPN_EIO, "%s: no chat template (neither chat_template.jinja nor tokenizer_config.json)", model_dir);
    } else {
        const char *src = NULL;
        snprintf(name, sizeof name, "%s chat_template", cfg_path);
        st = config_template(config, cfg_path, &src);
        if (st == PPN_OK) st = make(src, strlen(src), name, out);
    }
    if (st == PPN_OK && config) st = read_specials(*out, config, model_dir);
    if (st != PPN_OK) {
        ppn_template_free(*out);
        *out = NULL;
    }
    free(text);
    json_decref(config);
    return st;
}

void ppn_template_free(ppn_template *t)
{
    if (!t) return;
    ppn_tmpl_clear(&t->tmpl);
    json_decref(t->vars);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* The messages as the template sees them: a list of objects, each without its null-valued keys. */
static ppn_status clean_messages(json_t *msgs, json_t **out)
{
    if (!json_is_array(msgs)) return ppn_err(PPN_EINVAL, "chat template: the messages are not a JSON list");
    if (!json_array_size(msgs))
        return ppn_err(PPN_EINVAL, "Cannot apply chat template to an empty conversation. Provide at least one message.");
    json_t *r = json_array();
    if (!r) return nomem();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m)) {
            json_decref(r);
            return ppn_err(PPN_EINVAL, "chat template: message %zu is not a JSON object", i);
        }
        json_t *c = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) if (!json_is_null(v)) json_object_set(c, k, v);
        json_array_append_new(r, c);
    }
    *out = r;
    return PPN_OK;
}

static ppn_status render_locked(const ppn_template *t, json_t *msgs, json_t *extra, int agp, char **out)
{
    json_t *vars = json_pack("{sOsbsnsn}", "messages", msgs, "add_generation_prompt", agp != 0, "tools", "documents");
    if (!vars) return nomem();
    json_object_update(vars, t->vars);
    ppn_status st = PPN_OK;
    if (extra) {
        if (json_object_get(extra, "messages") || json_object_get(extra, "add_generation_prompt"))
            st = ppn_err(PPN_EINVAL, "chat template: the extra variables may not set messages or add_generation_prompt");
        else
            json_object_update(vars, extra);
    }
    ppn_tok_buf b = {0};
    if (st == PPN_OK) st = ppn_tmpl_render(&t->tmpl, vars, &b);
    if (st == PPN_OK) st = ppn_tok_buf_put(&b, "", 1);
    json_decref(vars);
    if (st != PPN_OK) {
        free(b.p);
        return st;
    }
    *out = b.p;
    return PPN_OK;
}

static ppn_status render(const ppn_template *t, json_t *msgs, json_t *extra, int agp, char **out)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&t->mu; /* the render's only mutable state: the JSON references */
    pthread_mutex_lock(mu);
    ppn_status st = render_locked(t, msgs, extra, agp, out);
    pthread_mutex_unlock(mu);
    return st;
}

ppn_status ppn_template_render(const ppn_template *t, const ppn_chat_msg *msgs, int n, int add_generation_prompt,
                               char **out)
{
    if (!out) return ppn_err(PPN_EINVAL, "ppn_template_render: NULL argument");
    *out = NULL;
    if (!t || n < 0 || (n && !msgs)) return ppn_err(PPN_EINVAL, "ppn_template_render: NULL argument or n < 0");
    json_t *list = json_array(), *clean = NULL;
    if (!list) return nomem();
    ppn_status st = PPN_OK;
    for (int i = 0; st == PPN_OK && i < n; i++) {
        json_t *m = json_object();
        if (!m || json_array_append_new(list, m)) st = nomem();
        for (int j = 0; st == PPN_OK && j < 2; j++) {
            const char *s = j ? msgs[i].content : msgs[i].role;
            json_t *v = s ? json_string(s) : NULL;
            if (s && !v) st = ppn_err(PPN_EINVAL, "ppn_template_render: message %d's %s is not valid UTF-8", i,
                                      j ? "content" : "role");
            else if (v) json_object_set_new(m, j ? "content" : "role", v);
        }
    }
    if (st == PPN_OK) st = clean_messages(list, &clean);
    if (st == PPN_OK) st = render(t, clean, NULL, add_generation_prompt, out);
    json_decref(list);
    json_decref(clean);
    return st;
}

ppn_status ppn_template_render_json(const ppn_template *t, const char *messages_json, const char *vars_json,
                                    int add_generation_prompt, char **out)
{
    if (!out) return ppn_err(PPN_EINVAL, "ppn_template_render_json: NULL argument");
    *out = NULL;
    if (!t || !messages_json) return ppn_err(PPN_EINVAL, "ppn_template_render_json: NULL argument");
    json_error_t je;
    json_t *msgs = json_loads(messages_json, 0, &je), *extra = NULL, *clean = NULL;
    ppn_status st = PPN_OK;
    if (!msgs) st = ppn_err(PPN_EINVAL, "chat template: the messages' JSON, line %d: %s", je.line, je.text);
    if (st == PPN_OK && vars_json && !(extra = json_loads(vars_json, 0, &je)))
        st = ppn_err(PPN_EINVAL, "chat template: the variables' JSON, line %d: %s", je.line, je.text);
    if (st == PPN_OK && extra && !json_is_object(extra))
        st = ppn_err(PPN_EINVAL, "chat template: the variables' JSON is not an object");
    if (st == PPN_OK) st = clean_messages(msgs, &clean);
    if (st == PPN_OK) st = render(t, clean, extra, add_generation_prompt, out);
    json_decref(msgs);
    json_decref(extra);
    json_decref(clean);
    return st;
}

/* The probe: a user message, then an assistant message whose content is this marker; what the template writes
 * after the marker closes the assistant's turn. */
#define EOT_MARK "ppn:end-of-turn:probe"

int ppn_template_end_of_turn(const ppn_template *t, const ppn_tokenizer *tok)
{
    if (!t || !tok) return -1;
    const ppn_chat_msg msgs[2] = {{"user", "Hi"}, {"assistant", EOT_MARK}};
    char *text = NULL;
    if (ppn_template_render(t, msgs, 2, 0, &text) != PPN_OK) return -1;
    const char *after = strstr(text, EOT_MARK), *best = NULL;
    size_t rest = after ? strlen(after += strlen(EOT_MARK)) : 0, best_len = 0;
    int id = -1;
    for (int i = 0; after && i < tok->n_added; i++) {   /* the earliest special token after it; the longest there */
        const ppn_tok_added *a = &tok->added[i];
        const char *at = a->special ? memmem(after, rest, a->content, a->len) : NULL;
        if (at && (!best || at < best || (at == best && a->len > best_len))) best = at, best_len = a->len, id = a->id;
    }
    free(text);
    return id;
}
