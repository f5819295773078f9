/* serve_http.c - `ppn serve`'s HTTP side on libmicrohttpd: a thread per connection (a handler may block waiting
 * for its request's tokens), the routes, the non-streaming answers and the server-sent events of streaming
 * ones. A client that goes away is noticed by polling its socket while its request waits (POLLRDHUP), and by a
 * failed write; either cancels the request. A connection's record is freed only after its request's final event
 * (the engine's callback writes into it until then). */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "tools/serve.h"

enum { SSE_START, SSE_TEXT, SSE_DONE };

typedef struct conn {
    serve_ctx *s;
    char *body;
    size_t len, cap;
    int too_big, fd;
    serve_req req;
    uint64_t id;
    int submitted;
    char rid[48];
    long created;
    pthread_mutex_t mu;     /* the fields below: written by the engine's callback */
    pthread_cond_t cv;
    char *text;
    size_t text_len, text_cap, text_sent;
    int n_gen, n_prompt, done, finish;
    ppn_status why;
    char err[256];
    /* server-sent events: the bytes formatted and not yet given to the daemon */
    char *sse;
    size_t sse_len, sse_off;
    int sse_state;
} conn;

static void on_event(void *arg, const ppn_engine_event *ev)
{
    conn *c = arg;
    pthread_mutex_lock(&c->mu);
    if (c->text_len + ev->text_len + 1 > c->text_cap) {
        size_t cap = (c->text_len + ev->text_len + 1) * 2;
        char *t = realloc(c->text, cap);
        if (t) c->text = t, c->text_cap = cap;
    }
    if (c->text_len + ev->text_len + 1 <= c->text_cap) {
        memcpy(c->text + c->text_len, ev->text, ev->text_len);
        c->text_len += ev->text_len;
        c->text[c->text_len] = 0;
    }
    c->n_gen = ev->n_generated, c->n_prompt = ev->n_prompt;
    if (ev->finish != PPN_FINISH_NONE) {
        c->done = 1, c->finish = ev->finish, c->why = ev->status;
        snprintf(c->err, sizeof c->err, "%s", ev->error);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void cancel(conn *c)
{
    pthread_rwlock_rdlock(&c->s->lock);
    if (c->s->engine) ppn_engine_cancel(c->s->engine, c->id);
    pthread_rwlock_unlock(&c->s->lock);
}

static int client_gone(const conn *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLRDHUP};
    return c->fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* Under c->mu: wait until more text, the end, or a departed client (cancelled then; the wait goes on to the
 * final event). Returns 1 when the client is gone. */
static int wait_more(conn *c, int whole)
{
    int gone = 0;
    while (!c->done && (whole || c->text_sent == c->text_len)) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 50 * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&c->cv, &c->mu, &dl);
        if (!gone && !c->done && client_gone(c)) {
            gone = 1;
            pthread_mutex_unlock(&c->mu);
            cancel(c);
            pthread_mutex_lock(&c->mu);
        }
    }
    return gone;
}

static void conn_free(conn *c)
{
    if (c->submitted) {
        pthread_mutex_lock(&c->mu);
        int done = c->done;
        pthread_mutex_unlock(&c->mu);
        if (!done) cancel(c);
        pthread_mutex_lock(&c->mu);
        while (!c->done) pthread_cond_wait(&c->cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    serve_req_free(&c->req);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->body);
    free(c->text);
    free(c->sse);
    free(c);
}

static void completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode code)
{
    if (*con_cls) conn_free(*con_cls);
    *con_cls = NULL;
}

/* ---- answers ----------------------------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *mc, unsigned code, char *body, const char *type)
{
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) return free(body), MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(mc, code, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result reply_json(struct MHD_Connection *mc, unsigned code, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return reply(mc, code, s, "application/json");
}

static enum MHD_Result reply_error(struct MHD_Connection *mc, unsigned code, const char *msg, const char *param)
{
    const char *type = code == 400 ? "invalid_request_error" : code == 404 ? "not_found_error"
                       : code == 429 || code == 503 ? "server_busy" : "server_error";
    return reply(mc, code, serve_error_json(msg, type, param), "application/json");
}

static const char *finish_reason(int finish)
{
    return finish == PPN_FINISH_STOP ? "stop" : finish == PPN_FINISH_LENGTH ? "length" : ppn_finish_name(finish);
}

static json_t *choice(const conn *c, const char *text, const char *finish, int delta)
{
    json_t *fr = finish ? json_string(finish) : json_null();
    if (!c->req.chat) return json_pack("{s:i, s:s, s:o, s:n}", "index", 0, "text", text, "finish_reason", fr, "logprobs");
    json_t *msg = text ? json_pack("{s:s, s:s}", "role", "assistant", "content", text) : json_object();
    if (delta && c->sse_state != SSE_START) json_object_del(msg, "role");
    return json_pack("{s:i, s:o, s:o}", "index", 0, delta ? "delta" : "message", msg, "finish_reason", fr);
}

static json_t *envelope(const conn *c, json_t *choice_obj, int chunk)
{
    const char *obj = c->req.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    return json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", c->rid, "object", obj, "created", (json_int_t)c->created,
                     "model", c->s->name, "choices", choice_obj);
}

static json_t *usage(const conn *c)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", c->n_prompt, "completion_tokens", c->n_gen,
                     "total_tokens", c->n_prompt + c->n_gen);
}

/* A non-streaming request: wait for its end, then one JSON answer. */
static enum MHD_Result answer_whole(conn *c, struct MHD_Connection *mc)
{
    pthread_mutex_lock(&c->mu);
    wait_more(c, 1);
    pthread_mutex_unlock(&c->mu);
    if (c->finish == PPN_FINISH_ERROR) return reply_error(mc, 500, c->err, NULL);
    if (c->finish == PPN_FINISH_CANCELLED) return reply_error(mc, 503, "the request was cancelled (the server is stopping)", NULL);
    json_t *o = envelope(c, choice(c, c->text ? c->text : "", finish_reason(c->finish), 0), 0);
    json_object_set_new(o, "usage", usage(c));
    return reply_json(mc, 200, o);
}

static int sse_add(conn *c, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return -1;
    size_t need = c->sse_len + strlen(s) + 16;
    char *b = realloc(c->sse, need);
    if (!b) return free(s), -1;
    c->sse = b;
    c->sse_len += (size_t)sprintf(c->sse + c->sse_len, "data: %s\n\n", s);
    free(s);
    return 0;
}

/* Format the next events: the role (chat), new text, or the end. Returns -1 for a departed client. */
static int sse_refill(conn *c)
{
    c->sse_len = c->sse_off = 0;
    if (c->sse_state == SSE_START && c->req.chat) {
        c->sse_state = SSE_START;
        int rc = sse_add(c, envelope(c, choice(c, "", NULL, 1), 1));
        c->sse_state = SSE_TEXT;
        return rc;
    }
    c->sse_state = SSE_TEXT;
    pthread_mutex_lock(&c->mu);
    int gone = wait_more(c, 0);
    size_t from = c->text_sent, to = c->text_len;
    c->text_sent = to;
    int done = c->done, finish = c->finish;
    char *piece = to > from ? strndup(c->text + from, to - from) : NULL;
    pthread_mutex_unlock(&c->mu);
    if (gone) return free(piece), -1;
    int rc = piece ? sse_add(c, envelope(c, choice(c, piece, NULL, 1), 1)) : 0;
    free(piece);
    if (!done || rc) return rc;
    if (finish == PPN_FINISH_ERROR || finish == PPN_FINISH_CANCELLED) {
        char *es = serve_error_json(finish == PPN_FINISH_ERROR ? c->err : "the request was cancelled", "server_error",
                                    NULL);
        rc = sse_add(c, es ? json_loads(es, 0, NULL) : NULL);
        free(es);
    } else {
        json_t *o = envelope(c, choice(c, c->req.chat ? NULL : "", finish_reason(finish), 1), 1);
        json_object_set_new(o, "usage", usage(c));
        rc = sse_add(c, o);
    }
    const char *fin = "data: [DONE]\n\n";
    char *b = rc ? NULL : realloc(c->sse, c->sse_len + strlen(fin) + 1);
    if (!b) return -1;
    c->sse = b;
    memcpy(c->sse + c->sse_len, fin, strlen(fin) + 1);
    c->sse_len += strlen(fin);
    c->sse_state = SSE_DONE;
    return 0;
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn *c = cls;
    while (c->sse_off == c->sse_len) {
        if (c->sse_state == SSE_DONE) return MHD_CONTENT_READER_END_OF_STREAM;
        if (sse_refill(c) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = c->sse_len - c->sse_off < max ? c->sse_len - c->sse_off : max;
    memcpy(buf, c->sse + c->sse_off, n);
    c->sse_off += n;
    return (ssize_t)n;
}

static enum MHD_Result answer_stream(conn *c, struct MHD_Connection *mc)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, c, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(mc, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static unsigned submit_status(ppn_status st)
{
    return st == PPN_EBUSY ? 429 : st == PPN_EINVAL || st == PPN_ESTATE || st == PPN_ENOMEM ? 400 : 500;
}

static enum MHD_Result generate(conn *c, struct MHD_Connection *mc, int chat)
{
    char msg[512];
    const char *param = NULL;
    if (c->too_big) {
        snprintf(msg, sizeof msg, "the body exceeds %zu bytes", c->s->max_body);
        return reply_error(mc, 400, msg, NULL);
    }
    if (serve_parse(c->body ? c->body : "", c->len, chat, &c->req, msg, sizeof msg, &param))
        return reply_error(mc, 400, msg, param);
    c->req.q.cb = on_event, c->req.q.cb_arg = c;
    pthread_rwlock_rdlock(&c->s->lock);
    ppn_status st = c->s->engine ? ppn_engine_submit(c->s->engine, &c->req.q, &c->id) : PPN_ESTATE;
    const char *why = c->s->engine ? ppn_last_error() : "the server is stopping";
    pthread_rwlock_unlock(&c->s->lock);
    if (st != PPN_OK) return reply_error(mc, c->s->engine ? submit_status(st) : 503, why, NULL);
    c->submitted = 1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    c->fd = ci ? ci->connect_fd : -1;
    snprintf(c->rid, sizeof c->rid, "%s-%llu", chat ? "chatcmpl" : "cmpl", (unsigned long long)c->id);
    c->created = (long)time(NULL);
    return c->req.stream ? answer_stream(c, mc) : answer_whole(c, mc);
}

static enum MHD_Result models(serve_ctx *s, struct MHD_Connection *mc)
{
    return reply_json(mc, 200, json_pack("{s:s, s:[{s:s, s:s, s:i, s:s, s:i}]}", "object", "list", "data", "id",
                                         s->name, "object", "model", "created", 0, "owned_by", "ppn", "max_model_len",
                                         s->ctx));
}

static enum MHD_Result route(conn *c, struct MHD_Connection *mc, const char *url, const char *method)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) return get ? reply(mc, 200, strdup("{\"status\":\"ok\"}"), "application/json")
                                            : reply_error(mc, 405, "use GET", NULL);
    if (!strcmp(url, "/v1/models")) return get ? models(c->s, mc) : reply_error(mc, 405, "use GET", NULL);
    if (!strcmp(url, "/metrics"))
        return get ? reply(mc, 200, serve_metrics(c->s), "text/plain; version=0.0.4") : reply_error(mc, 405, "use GET", NULL);
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) return post ? generate(c, mc, chat) : reply_error(mc, 405, "use POST", NULL);
    return reply_error(mc, 404, "no such route", NULL);
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    conn *c = *con_cls;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return MHD_NO;
        c->s = cls, c->fd = -1;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        *con_cls = c;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (c->too_big || c->len + n > c->s->max_body) return c->too_big = 1, MHD_YES;
        if (c->len + n + 1 > c->cap) {
            size_t cap = (c->len + n + 1) * 2;
            char *b = realloc(c->body, cap);
            if (!b) return MHD_NO;
            c->body = b, c->cap = cap;
        }
        memcpy(c->body + c->len, upload, n);
        c->len += n;
        return MHD_YES;
    }
    return route(c, mc, url, method);
}

struct MHD_Daemon *serve_http_start(serve_ctx *s, const char *host, int port, int *bound)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "ppn: error: serve: --host %s is not an IPv4 address\n", host);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG |
            MHD_USE_POLL,
        (uint16_t)port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
        MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "ppn: error: serve: cannot listen on %s:%d\n", host, port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *bound = di ? di->port : port;
    return d;
}

void serve_http_quiesce(struct MHD_Daemon *d)
{
    MHD_socket fd = MHD_quiesce_daemon(d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void serve_http_stop(struct MHD_Daemon *d)
{
    MHD_stop_daemon(d);
}
