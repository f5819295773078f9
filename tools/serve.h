/* serve.h - `ppn serve`: the OpenAI-compatible HTTP front of the engine (serve_http.c: libmicrohttpd, routing,
 * server-sent events; serve_json.c: request bodies into ppn_request, error bodies, /metrics; cmd_serve.c: flags,
 * loading, signals and the shutdown order). */
#ifndef PPN_SERVE_H
#define PPN_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include "ppn.h"

typedef struct serve_ctx {
    pthread_rwlock_t lock;   /* read: a handler using engine; write: the shutdown destroying it */
    ppn_engine *engine;      /* lock: NULL once the server stops */
    const char *name;        /* the model's name in responses and /v1/models */
    int ctx, vocab;
    size_t max_body;         /* bytes of a request body, at most */
    pthread_mutex_t mu;      /* the fields below */
    uint64_t next_id;
    double last_scrape_s;    /* the tokens/s gauge: tokens since the previous scrape */
    uint64_t last_scrape_tokens;
    double t0;
} serve_ctx;

/* A parsed request body: q points into root (strings) and the arrays here. */
typedef struct serve_req {
    int chat, stream;
    ppn_request q;
    json_t *root;
    char *messages_json;
    int *ids;
    const char *stop[PPN_ENGINE_MAX_STOP];
} serve_req;

/* Parse a /v1/completions (chat 0) or /v1/chat/completions (chat 1) body into r. Returns 0, or 400 with the
 * message in msg and the offending field's name in *param (NULL for none); r holds nothing then. */
int serve_parse(const char *body, size_t len, int chat, serve_req *r, char *msg, size_t cap, const char **param);
void serve_req_free(serve_req *r);
/* {"error": {"message", "type", "param", "code"}} as a malloc'd string. */
char *serve_error_json(const char *msg, const char *type, const char *param);
/* The Prometheus text of /metrics (malloc'd). */
char *serve_metrics(serve_ctx *s);
double serve_now_s(void);

/* The HTTP daemon on host:port (port 0: any free one, *bound says which). Returns the daemon or NULL after the
 * message. */
struct MHD_Daemon *serve_http_start(serve_ctx *s, const char *host, int port, int *bound);
/* Stop accepting connections (the requests in flight go on). */
void serve_http_quiesce(struct MHD_Daemon *d);
/* Close every connection and join their threads. */
void serve_http_stop(struct MHD_Daemon *d);

int cmd_serve(int argc, char **argv);

#endif
