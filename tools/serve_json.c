/* serve_json.c - `ppn serve`'s JSON: OpenAI request bodies into a ppn_request (every known field checked for
 * its type and range; unknown fields ignored, as OpenAI's own server does), error bodies, and /metrics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tools/serve.h"

double serve_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

char *serve_error_json(const char *msg, const char *type, const char *param)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:n}}", "error", "message", msg, "type", type, "param",
                          param ? json_string(param) : json_null(), "code");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

typedef struct perr {
    char *msg;
    size_t cap;
    const char **param;
} perr;

static int bad(perr *e, const char *param, const char *fmt, const char *what)
{
    snprintf(e->msg, e->cap, fmt, param, what);
    *e->param = param;
    return 400;
}

/* An optional number field in [lo, hi] (integer: whole numbers only). */
static int num_field(json_t *root, const char *key, double lo, double hi, int integer, double *out, perr *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        return bad(e, key, "'%s' must be %s", integer ? "an integer" : "a number");
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi) || !isfinite(x)) return bad(e, key, "'%s' is out of range (%s)", "see the API reference");
    *out = x;
    return 0;
}

static int bool_field(json_t *root, const char *key, int *out, perr *e)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad(e, key, "'%s' must be %s", "a boolean");
    *out = json_is_true(v);
    return 0;
}

static int stop_field(json_t *root, serve_req *r, perr *e)
{
    json_t *v = json_object_get(root, "stop");
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) v = json_pack("[O]", v);
    else if (json_is_array(v)) json_incref(v);
    else return bad(e, "stop", "'%s' must be %s", "a string or a list of strings");
    json_object_set_new(root, "stop", v); /* root keeps the strings */
    size_t n = json_array_size(v);
    if (n > PPN_ENGINE_MAX_STOP) return bad(e, "stop", "'%s' holds %s", "more than 16 strings");
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(v, i));
        if (!s || !*s || strlen(s) > 256) return bad(e, "stop", "'%s' must hold %s", "strings of 1 to 256 bytes");
        r->stop[i] = s;
    }
    r->q.stop = r->stop, r->q.n_stop = (int)n;
    return 0;
}

static int prompt_field(json_t *root, serve_req *r, perr *e)
{
    json_t *p = json_object_get(root, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0))) p = json_array_get(p, 0);
    if (json_is_string(p)) {
        r->q.text = json_string_value(p);
        r->q.add_special = 1;
        if (!*r->q.text) return bad(e, "prompt", "'%s' is %s", "empty");
        return 0;
    }
    size_t n = json_array_size(p);
    if (!json_is_array(p) || n == 0) return bad(e, "prompt", "'%s' must be %s", "a string or a non-empty list of token ids");
    if (!(r->ids = malloc(sizeof(int) * n))) return bad(e, "prompt", "'%s': %s", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(p, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return bad(e, "prompt", "'%s' must be %s", "a string or a list of token ids");
        r->ids[i] = (int)json_integer_value(x);
    }
    r->q.ids = r->ids, r->q.n_ids = (int)n;
    return 0;
}

static int messages_field(json_t *root, serve_req *r, perr *e)
{
    json_t *m = json_object_get(root, "messages");
    size_t n = json_array_size(m);
    if (!json_is_array(m) || n == 0) return bad(e, "messages", "'%s' must be %s", "a non-empty list of messages");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(m, i);
        if (!json_is_object(x) || !json_is_string(json_object_get(x, "role")) ||
            !json_is_string(json_object_get(x, "content")))
            return bad(e, "messages", "'%s' must hold %s", "objects with a string role and a string content");
    }
    if (!(r->messages_json = json_dumps(m, JSON_COMPACT))) return bad(e, "messages", "'%s': %s", "out of memory");
    r->q.messages_json = r->messages_json;
    return 0;
}

static int sampling_fields(json_t *root, serve_req *r, perr *e)
{
    double t = 1.0, p = 1.0, k = 0, seed = 0, n = 1, mt = r->chat ? 0 : 16;
    int rc = num_field(root, "temperature", 0, 2, 0, &t, e);
    if (!rc) rc = num_field(root, "top_p", 1e-9, 1, 0, &p, e);
    if (!rc) rc = num_field(root, "top_k", -1, 1e9, 1, &k, e);
    if (!rc) rc = num_field(root, "seed", -9.2e18, 9.2e18, 1, &seed, e);
    if (!rc) rc = num_field(root, "n", 1, 1, 1, &n, e);
    if (!rc) rc = num_field(root, "max_tokens", 1, 1e9, 1, &mt, e);
    if (!rc && r->chat) rc = num_field(root, "max_completion_tokens", 1, 1e9, 1, &mt, e);
    if (!rc) rc = bool_field(root, "stream", &r->stream, e);
    if (!rc) rc = bool_field(root, "ignore_eos", &r->q.ignore_eos, e);
    json_t *model = json_object_get(root, "model");
    if (!rc && model && !json_is_string(model)) rc = bad(e, "model", "'%s' must be %s", "a string");
    r->q.temperature = (float)t, r->q.top_p = (float)p, r->q.top_k = k < 0 ? 0 : (int)k;
    r->q.seed = (uint64_t)(int64_t)seed;
    r->q.max_tokens = (int)mt;
    return rc;
}

void serve_req_free(serve_req *r)
{
    json_decref(r->root);
    free(r->messages_json);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

int serve_parse(const char *body, size_t len, int chat, serve_req *r, char *msg, size_t cap, const char **param)
{
    memset(r, 0, sizeof *r);
    r->q = ppn_request_default();
    r->chat = chat;
    *param = NULL;
    perr e = {msg, cap, param};
    json_error_t je;
    if (!(r->root = json_loadb(body, len, 0, &je)))
        return snprintf(msg, cap, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column), 400;
    if (!json_is_object(r->root)) return serve_req_free(r), bad(&e, "body", "the %s must be %s", "a JSON object");
    int rc = chat ? messages_field(r->root, r, &e) : prompt_field(r->root, r, &e);
    if (!rc) rc = sampling_fields(r->root, r, &e);
    if (!rc) rc = stop_field(r->root, r, &e);
    if (rc) serve_req_free(r);
    return rc;
}

/* ---- /metrics ---------------------------------------------------------------------------------------- */

static void hist(FILE *f, const char *name, const char *help, const ppn_engine_hist *h)
{
    static const double b[] = PPN_ENGINE_HIST_BOUNDS_MS;
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t c = 0;
    for (int i = 0; i < PPN_ENGINE_HIST_N - 1; i++) {
        c += h->bucket[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, b[i] / 1e3, (unsigned long long)c);
    }
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name,
            h->sum_s, name, (unsigned long long)h->count);
}

static void gauge(FILE *f, const char *name, const char *type, const char *help, double v)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

char *serve_metrics(serve_ctx *s)
{
    ppn_engine_stats st = {0};
    pthread_rwlock_rdlock(&s->lock);
    if (s->engine) ppn_engine_get_stats(s->engine, &st);
    pthread_rwlock_unlock(&s->lock);
    double now = serve_now_s(), tps;
    pthread_mutex_lock(&s->mu);
    double dt = now - s->last_scrape_s;
    tps = dt > 0 ? (double)(st.generated_tokens - s->last_scrape_tokens) / dt : 0;
    s->last_scrape_s = now, s->last_scrape_tokens = st.generated_tokens;
    pthread_mutex_unlock(&s->mu);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    gauge(f, "ppn_requests_queued", "gauge", "requests waiting for admission", st.queued);
    gauge(f, "ppn_requests_running", "gauge", "requests in the running batch", st.running);
    gauge(f, "ppn_kv_blocks_used", "gauge", "KV blocks held by sequences", st.kv_blocks_used);
    gauge(f, "ppn_kv_blocks_reserved", "gauge", "KV blocks reserved by running requests", st.kv_blocks_reserved);
    gauge(f, "ppn_kv_blocks_total", "gauge", "KV blocks in the pools", st.kv_blocks_total);
    gauge(f, "ppn_generation_tokens_per_second", "gauge", "tokens generated per second since the previous scrape", tps);
    gauge(f, "ppn_prompt_tokens_total", "counter", "prompt tokens primed", (double)st.prompt_tokens);
    gauge(f, "ppn_generation_tokens_total", "counter", "tokens generated", (double)st.generated_tokens);
    gauge(f, "ppn_decode_batches_total", "counter", "batched decode steps", (double)st.decode_batches);
    gauge(f, "ppn_prefill_chunks_total", "counter", "prompt chunks primed", (double)st.prefill_chunks);
    gauge(f, "ppn_mixed_steps_total", "counter", "iterations that primed and decoded in one forward",
          (double)st.mixed_steps);
    fprintf(f, "# HELP ppn_requests_total requests by outcome\n# TYPE ppn_requests_total counter\n"
               "ppn_requests_total{outcome=\"finished\"} %llu\nppn_requests_total{outcome=\"cancelled\"} %llu\n"
               "ppn_requests_total{outcome=\"failed\"} %llu\nppn_requests_total{outcome=\"refused\"} %llu\n",
            (unsigned long long)st.finished, (unsigned long long)st.cancelled, (unsigned long long)st.failed,
            (unsigned long long)st.refused);
    hist(f, "ppn_time_to_first_token_seconds", "submit to the first generated token", &st.ttft);
    hist(f, "ppn_inter_token_latency_seconds", "between two tokens of one request", &st.itl);
    fprintf(f, "# HELP ppn_stage_busy_seconds_total device time each pipeline stage's stream spent running its "
               "walks (its layers; the walks still running not yet counted)\n"
               "# TYPE ppn_stage_busy_seconds_total counter\n");
    for (int i = 0; i < st.n_stages; i++)
        fprintf(f, "ppn_stage_busy_seconds_total{stage=\"%d\"} %.6f\n", i, st.stage_busy_s[i]);
    gauge(f, "ppn_uptime_seconds", "gauge", "seconds since the engine started", st.uptime_s);
    fclose(f);
    return buf;
}
