/* cmd_serve.c - `ppn serve`: an OpenAI-compatible HTTP server over the engine. The shutdown order on SIGINT or
 * SIGTERM: stop accepting connections; give the requests in flight --drain seconds to finish; destroy the
 * engine (what still runs is cancelled, each connection gets its answer); close the connections; free the model. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tools/cli.h"
#include "tools/serve.h"

typedef struct serve_args {
    const char *model, *backend, *host, *name;
    int dtype, ctx, kv_tokens, port, max_batch, max_queue, chunk, separate, step_rows;
    long max_body;
    double drain;
    ppn_door door;
} serve_args;

static void serve_usage(FILE *f)
{
    fputs("usage: ppn serve --model PATH [--host 127.0.0.1] [--port 8080] [--name NAME] [--backend auto|sim|cuda]\n"
          "                 [--dtype f32|bf16|f16] [--ctx C] [--kv-tokens T] [--max-batch 16] [--max-queue 256]\n"
          "                 [--chunk 256] [--step-rows 128] [--separate] [--max-body 1048576] [--drain 5]\n"
          "                 [door flags as for ppn run]\n"
          "OpenAI-compatible HTTP: POST /v1/completions and /v1/chat/completions (\"stream\": true for server-sent\n"
          "events), GET /v1/models, /health, /metrics (Prometheus). --port 0 takes a free port; the address is printed\n"
          "on stderr as 'ppn serve: listening on http://HOST:PORT'. SIGINT or SIGTERM stops it: no new connections,\n"
          "--drain seconds for the requests in flight, then the rest cancelled.\n"
          "--max-batch: requests decoded together; --chunk: prompt rows primed per engine iteration, in the same\n"
          "forward as the decodes (--separate: in a forward of their own, for measurement), cut beside running\n"
          "decodes to --step-rows minus their rows (at least 16; 0: no cut); --kv-tokens: KV\n"
          "positions for all requests together (a request waits until its prompt + max_tokens fit).\n",
          f);
}

static int parse(int argc, char **argv, serve_args *a)
{
    *a = (serve_args){.dtype = PPN_DTYPE_DEFAULT, .host = "127.0.0.1", .port = 8080, .max_body = 1 << 20, .drain = 5};
    if (ppn_door_from_env(&a->door) != PPN_OK) return cli_fail("%s", ppn_last_error()), 2;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        long x;
        int rc = cli_door_flag(&a->door, argc, argv, &i);
        if (rc < 0) return 2;
        if (rc > 0) continue;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            serve_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--separate")) {
            a->separate = 1;
            continue;
        } else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(f, "--model")) a->model = v;
        else if (!strcmp(f, "--host")) a->host = v;
        else if (!strcmp(f, "--name")) a->name = v;
        else if (!strcmp(f, "--backend")) rc = cli_backend(f, v), a->backend = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &a->dtype);
        else if (!strcmp(f, "--port")) rc = cli_int(f, v, 0, 65535, &x), a->port = (int)x;
        else if (!strcmp(f, "--ctx")) rc = cli_int(f, v, 1, 1 << 30, &x), a->ctx = (int)x;
        else if (!strcmp(f, "--kv-tokens")) rc = cli_int(f, v, 1, 1 << 30, &x), a->kv_tokens = (int)x;
        else if (!strcmp(f, "--max-batch")) rc = cli_int(f, v, 1, 256, &x), a->max_batch = (int)x;
        else if (!strcmp(f, "--max-queue")) rc = cli_int(f, v, 1, 1 << 20, &x), a->max_queue = (int)x;
        else if (!strcmp(f, "--chunk")) rc = cli_int(f, v, 1, PPN_PREFILL_MAX_CHUNK, &x), a->chunk = (int)x;
        else if (!strcmp(f, "--step-rows"))
            rc = cli_int(f, v, 0, PPN_PREFILL_MAX_CHUNK, &x), a->step_rows = x ? (int)x : -1; /* 0 here: off */
        else if (!strcmp(f, "--max-body")) rc = cli_int(f, v, 64, 1L << 30, &a->max_body);
        else if (!strcmp(f, "--drain")) rc = cli_float(f, v, 0, 3600, &a->drain);
        else return cli_fail("serve: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (!a->model) return cli_fail("serve: --model PATH is required"), 2;
    return 0;
}

/* The tokenizer and chat template beside the checkpoint, when there are (a llama2.c file has neither). */
static void load_text(const char *model, ppn_tokenizer **tok, ppn_template **tmpl)
{
    char tj[4096];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", model);
    if (access(tj, R_OK) != 0) {
        fprintf(stderr, "ppn serve: no tokenizer.json beside the model: prompts are token ids only\n");
        return;
    }
    if (ppn_tokenizer_load(model, tok) != PPN_OK) {
        fprintf(stderr, "ppn serve: the tokenizer does not load (%s): prompts are token ids only\n", ppn_last_error());
        return;
    }
    if (ppn_template_load(model, tmpl) != PPN_OK)
        fprintf(stderr, "ppn serve: no chat template (%s): /v1/chat/completions answers 400\n", ppn_last_error());
}

/* Block the stop signals in every thread (the daemon's and the engine's inherit the mask), wait for one here. */
static void wait_signal(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    fprintf(stderr, "ppn serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
}

static void drain(serve_ctx *s, double seconds)
{
    double end = serve_now_s() + seconds;
    for (;;) {
        ppn_engine_stats st;
        ppn_engine_get_stats(s->engine, &st);
        if ((st.queued == 0 && st.running == 0) || serve_now_s() >= end) return;
        usleep(10000);
    }
}

static int serve(const serve_args *a, ppn_model *m, ppn_tokenizer *tok, ppn_template *tmpl)
{
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    const char *name = a->name ? a->name : a->model;
    serve_ctx s = {.name = name, .ctx = mi.ctx, .vocab = mi.vocab, .max_body = (size_t)a->max_body};
    pthread_rwlock_init(&s.lock, NULL);
    pthread_mutex_init(&s.mu, NULL);
    s.t0 = s.last_scrape_s = serve_now_s();
    ppn_engine_opts eo = ppn_engine_opts_default();
    eo.max_batch = a->max_batch, eo.max_queue = a->max_queue, eo.chunk = a->chunk, eo.separate = a->separate;
    eo.step_rows = a->step_rows;
    eo.tok = tok, eo.tmpl = tmpl;
    ppn_status st = ppn_engine_create(m, &eo, &s.engine);
    if (st != PPN_OK) return cli_fail_status(st, "engine");
    int port = 0;
    struct MHD_Daemon *d = serve_http_start(&s, a->host, a->port, &port);
    if (!d) {
        if ((st = ppn_engine_destroy(s.engine)) != PPN_OK) cli_fail_status(st, "engine teardown");
        return 1;
    }
    fprintf(stderr, "ppn serve: listening on http://%s:%d (model %s: %s, ctx %d)\n", a->host, port, name, mi.arch,
            mi.ctx);
    wait_signal();
    serve_http_quiesce(d);
    drain(&s, a->drain);
    pthread_rwlock_wrlock(&s.lock);
    st = ppn_engine_destroy(s.engine); /* what still runs is cancelled: every connection gets its final event */
    int rc = st == PPN_OK ? 0 : cli_fail_status(st, "engine teardown"); /* a block retired: said, exit 1 */
    s.engine = NULL;
    pthread_rwlock_unlock(&s.lock);
    serve_http_stop(d);
    pthread_rwlock_destroy(&s.lock);
    pthread_mutex_destroy(&s.mu);
    fprintf(stderr, "ppn serve: stopped\n");
    return rc;
}

int cmd_serve(int argc, char **argv)
{
    serve_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    ppn_rt *rt = NULL;
    ppn_model *m = NULL;
    ppn_tokenizer *tok = NULL;
    ppn_template *tmpl = NULL;
    if ((rc = cli_rt_create(a.backend, &rt)) != 0) return rc;
    ppn_load_opts lo = ppn_load_opts_default();
    lo.dtype = a.dtype, lo.ctx = a.ctx, lo.kv_tokens = a.kv_tokens, lo.door = &a.door;
    ppn_status st = ppn_model_load(rt, a.model, &lo, &m);
    if (st != PPN_OK) rc = cli_fail_status(st, "load");
    if (rc == 0) {
        load_text(a.model, &tok, &tmpl);
        rc = serve(&a, m, tok, tmpl);
    }
    ppn_template_free(tmpl);
    ppn_tokenizer_free(tok);
    rc = cli_model_free(m, rc);
    rc = cli_rt_destroy(rt, rc);
    return rc;
}
