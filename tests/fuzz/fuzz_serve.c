/* fuzz_serve.c - `ppn serve`'s request bodies through serve_parse (tools/serve_json.c): the input's first byte
 * picks the route (even: /v1/completions, odd: /v1/chat/completions), the rest is the body as the daemon
 * collected it. An accepted request must hold what the engine and the chat template are handed (checked here),
 * and a chat request's messages are rendered by a ChatML template, as cmd_serve's engine would.
 * libmicrohttpd parses the request line and headers; ppn has no header parser of its own to fuzz (the handler
 * in serve_http.c only appends body chunks under max_body and matches the URL and method with strcmp). */
#include "tools/serve.h"
#include "fuzz_util.h"

static const char k_chatml[] =
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static void check(const serve_req *r)
{
    if (r->chat) {
        if (!r->q.messages_json || r->q.messages_json != r->messages_json) abort();
    } else if (r->q.text) {
        if (!*r->q.text || r->q.ids) abort();
    } else if (!r->q.ids || r->q.n_ids < 1) {
        abort();
    }
    if (r->q.n_stop < 0 || r->q.n_stop > PPN_ENGINE_MAX_STOP || r->q.max_tokens < 0) abort();
    for (int i = 0; i < r->q.n_stop; i++)
        if (!r->q.stop[i] || !*r->q.stop[i] || strlen(r->q.stop[i]) > 256) abort();
    if (!(r->q.temperature >= 0 && r->q.temperature <= 2) || !(r->q.top_p > 0 && r->q.top_p <= 1)) abort();
}

static void render(const serve_req *r)
{
    static ppn_template *t;
    if (!t && ppn_template_parse(k_chatml, sizeof k_chatml - 1, "chatml", &t) != PPN_OK) abort();
    char *out = NULL;
    ppn_template_render_json(t, r->q.messages_json, NULL, 1, &out);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    serve_req r;
    char msg[512];
    const char *param = NULL;
    int chat = data[0] & 1;
    /* The daemon hands serve_parse a buffer of exactly the body's length (no terminator): so does this. */
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    int rc = serve_parse(body, size - 1, chat, &r, msg, sizeof msg, &param);
    if (rc == 0) {
        check(&r);
        if (chat) render(&r);
        serve_req_free(&r);
    } else if (rc != 400 || !memchr(msg, 0, sizeof msg)) {
        abort();
    }
    free(body);
    return 0;
}
