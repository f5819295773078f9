/* engine.c - the thread-safe engine: requests from any thread, one scheduler thread running continuous batching
 * over the public runtime API (ppn_prefill_batch, ppn_decode_batch_ex, ppn_sample, the tokenizer).
 *
 * Who touches what. A request's prompt, sampler, sequence, detokenizer and held text belong to the submitter
 * until it is queued, then to the scheduler thread alone. The fields marked "mu" are shared: cancel flags, the
 * poll buffer, the final state, the queue, the live list and the stats. The scheduler never calls a callback
 * or the model with mu held. The model and every sequence are used by the scheduler thread only, from its start
 * to its join (both hand-offs declared to the sim checker, which gives each host thread its own clock). */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ppn.h"
#include "core/base/err.h"
#include "core/rt.h" /* the model's thread hand-offs, for the sim checker */

#define ENGINE_STOP_MAX_LEN 256

typedef enum { R_QUEUED, R_PRIME, R_DECODE } req_state;

typedef struct req {
    struct req *qnext;             /* mu: the queue */
    struct req *lprev, *lnext;     /* mu: the live list (every request not yet forgotten) */
    uint64_t id;
    ppn_engine_cb cb;
    void *cb_arg;
    /* the scheduler's (the submitter's before it is queued) */
    req_state state;
    int *prompt, n_prompt, primed;
    int max_tokens, n_gen, reserve, next_token, greedy, eos[2];
    int hit;                       /* ended by a stop string: the text from it on is dropped */
    int *stop_ids, n_stop_ids;
    char *stop[PPN_ENGINE_MAX_STOP];
    size_t stop_len[PPN_ENGINE_MAX_STOP];
    int n_stop;
    ppn_sampler sp;
    ppn_detok_stream *ds;
    char *held;                    /* text held back while it may begin a stop string */
    size_t held_len, held_cap;
    ppn_seq *seq;
    double t_submit, t_last;
    /* mu */
    int cancel, done, finish;
    ppn_status why;
    char err[256];
    int *out, out_n, out_taken, out_cap; /* poll mode: every id generated; taken by ppn_engine_poll */
} req;

struct ppn_engine {
    ppn_model *m;
    const ppn_tokenizer *tok;
    const ppn_template *tmpl;
    int max_batch, max_queue, chunk, separate, step_rows, vocab, ctx, eos;
    int blocks_total;
    double t0;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake;           /* the scheduler sleeps here with nothing to do */
    pthread_cond_t polled;         /* pollers sleep here; broadcast on every id and final state */
    /* mu */
    req *qhead, *qtail;
    int n_queued;
    req *live;
    int stopping;
    ppn_status sticky;             /* the model's failure: every later submit gets it */
    uint64_t next_id;
    ppn_engine_stats st;
    /* the scheduler's */
    req **run;                     /* running requests, in admission order */
    int n_run, reserved;
    ppn_seq **free_seqs;
    int n_free;
    float *logits;                 /* max_batch rows of vocab: the decode rows', then the prompt slices' */
    int *ids_out, *toks;
    ppn_seq **bseqs;               /* prompt slices: sequence, ids, count, request, where their logits go */
    const int **bids;
    int *bn;
    req **who;
    float **plog;
    ppn_seq **dseqs;               /* decode rows: sequence, request (toks: their tokens) */
    req **dwho;
};

static const double hist_bounds_ms[PPN_ENGINE_HIST_N - 1] = PPN_ENGINE_HIST_BOUNDS_MS;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

const char *ppn_finish_name(int finish)
{
    static const char *const names[] = {"none", "stop", "length", "cancelled", "error"};
    return finish >= 0 && finish <= PPN_FINISH_ERROR ? names[finish] : "?";
}

ppn_request ppn_request_default(void)
{
    return (ppn_request){.top_p = 1.0f};
}

ppn_engine_opts ppn_engine_opts_default(void)
{
    return (ppn_engine_opts){0};
}

static void hist_add(ppn_engine_hist *h, double s)
{
    int i = 0;
    while (i < PPN_ENGINE_HIST_N - 1 && s * 1e3 > hist_bounds_ms[i]) i++;
    h->bucket[i]++;
    h->count++;
    h->sum_s += s;
}

/* ---- requests: built and checked on the submitter's thread ------------------------------------------- */

static void req_free(req *r)
{
    if (!r) return;
    free(r->prompt);
    free(r->stop_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    ppn_detok_stream_free(r->ds);
    free(r->held);
    free(r->out);
    free(r);
}

static ppn_status tokenize_text(const ppn_engine *e, const char *text, int add_special, req *r)
{
    size_t len = strlen(text);
    int n = -1;
    ppn_status st = ppn_tokenize(e->tok, text, len, add_special, NULL, 0, &n); /* counting: EINVAL with *n set */
    if (st != PPN_OK && (st != PPN_EINVAL || n <= 0)) return n == 0 ? ppn_err(PPN_EINVAL, "engine: an empty prompt") : st;
    if (n < 1) return ppn_err(PPN_EINVAL, "engine: the prompt text gives no ids");
    if (!(r->prompt = malloc(sizeof(int) * (size_t)n))) return ppn_err(PPN_ENOMEM, "engine: prompt of %d ids", n);
    r->n_prompt = n;
    return ppn_tokenize(e->tok, text, len, add_special, r->prompt, n, &n);
}

static ppn_status prompt_chat(const ppn_engine *e, const ppn_request *q, req *r)
{
    if (!e->tmpl || !e->tok) return ppn_err(PPN_EINVAL, "engine: a chat request needs a tokenizer and a template");
    char *text = NULL;
    ppn_status st = q->msgs ? ppn_template_render(e->tmpl, q->msgs, q->n_msgs, 1, &text)
                            : ppn_template_render_json(e->tmpl, q->messages_json, NULL, 1, &text);
    if (st == PPN_OK) st = tokenize_text(e, text, 0, r);
    free(text);
    return st;
}

static ppn_status prompt_ids(const ppn_engine *e, const ppn_request *q, req *r)
{
    int given = !!q->ids + !!q->text + !!q->msgs + !!q->messages_json;
    if (given != 1) return ppn_err(PPN_EINVAL, "engine: a request needs exactly one prompt (ids, text or messages)");
    if (q->text) {
        if (!e->tok) return ppn_err(PPN_EINVAL, "engine: a text prompt needs a tokenizer (ppn_engine_opts.tok)");
        PPN_CHECK(tokenize_text(e, q->text, q->add_special, r));
    } else if (q->msgs || q->messages_json) {
        PPN_CHECK(prompt_chat(e, q, r));
    } else {
        if (q->n_ids < 1) return ppn_err(PPN_EINVAL, "engine: an empty prompt (n_ids %d)", q->n_ids);
        if (!(r->prompt = malloc(sizeof(int) * (size_t)q->n_ids))) return ppn_err(PPN_ENOMEM, "engine: prompt");
        memcpy(r->prompt, q->ids, sizeof(int) * (size_t)q->n_ids);
        r->n_prompt = q->n_ids;
    }
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->vocab)
            return ppn_err(PPN_EINVAL, "engine: prompt id %d at %d is outside the vocabulary [0, %d)", r->prompt[i],
                           i, e->vocab);
    return PPN_OK;
}

static ppn_status check_sampling(const ppn_request *q)
{
    if (!(q->temperature >= 0) || !isfinite(q->temperature))
        return ppn_err(PPN_EINVAL, "engine: temperature %g must be finite and >= 0", (double)q->temperature);
    if (!(q->top_p > 0 && q->top_p <= 1)) return ppn_err(PPN_EINVAL, "engine: top_p %g outside (0, 1]", (double)q->top_p);
    if (q->top_k < 0) return ppn_err(PPN_EINVAL, "engine: top_k %d < 0", q->top_k);
    if (q->max_tokens < 0) return ppn_err(PPN_EINVAL, "engine: max_tokens %d < 0", q->max_tokens);
    if (q->n_stop_ids < 0 || (q->n_stop_ids > 0 && !q->stop_ids))
        return ppn_err(PPN_EINVAL, "engine: stop ids (%d) without a list", q->n_stop_ids);
    if (q->n_stop < 0 || q->n_stop > PPN_ENGINE_MAX_STOP || (q->n_stop > 0 && !q->stop))
        return ppn_err(PPN_EINVAL, "engine: %d stop strings (at most %d)", q->n_stop, PPN_ENGINE_MAX_STOP);
    return PPN_OK;
}

static ppn_status copy_stops(const ppn_engine *e, const ppn_request *q, req *r)
{
    if (q->n_stop_ids) {
        if (!(r->stop_ids = malloc(sizeof(int) * (size_t)q->n_stop_ids))) return ppn_err(PPN_ENOMEM, "engine: stops");
        memcpy(r->stop_ids, q->stop_ids, sizeof(int) * (size_t)q->n_stop_ids);
        r->n_stop_ids = q->n_stop_ids;
    }
    if (q->n_stop && !e->tok) return ppn_err(PPN_EINVAL, "engine: stop strings need a tokenizer");
    for (int i = 0; i < q->n_stop; i++) {
        size_t len = q->stop[i] ? strlen(q->stop[i]) : 0;
        if (len < 1 || len > ENGINE_STOP_MAX_LEN)
            return ppn_err(PPN_EINVAL, "engine: stop string %d has %zu bytes (1 .. %d)", i, len, ENGINE_STOP_MAX_LEN);
        if (!(r->stop[i] = strdup(q->stop[i]))) return ppn_err(PPN_ENOMEM, "engine: stops");
        r->stop_len[i] = len;
        r->n_stop = i + 1;
    }
    return PPN_OK;
}

/* The request's positions: max_tokens clamped to the context, its KV blocks reserved for admission. */
static ppn_status size_request(const ppn_engine *e, const ppn_request *q, req *r)
{
    if (r->n_prompt > e->ctx)
        return ppn_err(PPN_ESTATE, "engine: a prompt of %d ids leaves no room in the context of %d positions",
                       r->n_prompt, e->ctx);
    int most = e->ctx - r->n_prompt + 1; /* the last id generated is never fed */
    r->max_tokens = q->max_tokens == 0 || q->max_tokens > most ? most : q->max_tokens;
    int positions = r->n_prompt + r->max_tokens - 1;
    r->reserve = (positions + PPN_KV_BLOCK_POSITIONS - 1) / PPN_KV_BLOCK_POSITIONS;
    if (r->reserve > e->blocks_total)
        return ppn_err(PPN_ENOMEM, "engine: %d prompt + %d new ids need %d KV blocks; the pools hold %d",
                       r->n_prompt, r->max_tokens, r->reserve, e->blocks_total);
    return PPN_OK;
}

static ppn_status req_build(const ppn_engine *e, const ppn_request *q, req **out)
{
    *out = NULL;
    PPN_CHECK(check_sampling(q));
    req *r = calloc(1, sizeof *r);
    if (!r) return ppn_err(PPN_ENOMEM, "engine: request");
    ppn_status st = prompt_ids(e, q, r);
    if (st == PPN_OK) st = copy_stops(e, q, r);
    if (st == PPN_OK) st = size_request(e, q, r);
    if (st == PPN_OK && e->tok) st = ppn_detok_stream_create(e->tok, &r->ds);
    if (st == PPN_OK && !q->cb && !(r->out = malloc(sizeof(int) * (size_t)r->max_tokens)))
        st = ppn_err(PPN_ENOMEM, "engine: %d ids of output", r->max_tokens);
    if (st != PPN_OK) return req_free(r), st;
    r->out_cap = q->cb ? 0 : r->max_tokens;
    r->cb = q->cb, r->cb_arg = q->cb_arg;
    r->greedy = q->temperature == 0;
    ppn_sampler_init(&r->sp, q->temperature, q->top_k, q->top_p, q->seed);
    r->eos[0] = q->ignore_eos ? -1 : e->eos;
    r->eos[1] = q->ignore_eos || !e->tok ? -1 : ppn_tokenizer_eos(e->tok);
    r->t_submit = now_s();
    *out = r;
    return PPN_OK;
}

static void live_unlink(ppn_engine *e, req *r)
{
    if (r->lprev) r->lprev->lnext = r->lnext;
    else e->live = r->lnext;
    if (r->lnext) r->lnext->lprev = r->lprev;
}

static req *live_find(ppn_engine *e, uint64_t id)
{
    for (req *r = e->live; r; r = r->lnext)
        if (r->id == id) return r;
    return NULL;
}

ppn_status ppn_engine_submit(ppn_engine *e, const ppn_request *q, uint64_t *id)
{
    if (!e || !q || !id) return ppn_err(PPN_EINVAL, "ppn_engine_submit: NULL argument");
    *id = 0;
    req *r = NULL;
    ppn_status st = req_build(e, q, &r);
    pthread_mutex_lock(&e->mu);
    if (st == PPN_OK && e->stopping) st = ppn_err(PPN_ESTATE, "engine: stopping, no more requests");
    if (st == PPN_OK && e->sticky != PPN_OK)
        st = ppn_err(e->sticky, "engine: the model failed earlier (%s)", ppn_status_name(e->sticky));
    if (st == PPN_OK && e->n_queued >= e->max_queue)
        st = ppn_err(PPN_EBUSY, "engine: the queue holds %d requests (its bound)", e->n_queued);
    if (st != PPN_OK) {
        e->st.refused++;
        pthread_mutex_unlock(&e->mu);
        req_free(r);
        return st;
    }
    r->id = *id = e->next_id++;
    if (e->qtail) e->qtail->qnext = r;
    else e->qhead = r;
    e->qtail = r;
    e->n_queued++;
    r->lnext = e->live;
    if (e->live) e->live->lprev = r;
    e->live = r;
    e->st.submitted++;
    e->st.queued = e->n_queued;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return PPN_OK;
}

ppn_status ppn_engine_cancel(ppn_engine *e, uint64_t id)
{
    if (!e) return ppn_err(PPN_EINVAL, "ppn_engine_cancel: NULL engine");
    pthread_mutex_lock(&e->mu);
    req *r = live_find(e, id);
    if (r) r->cancel = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return r ? PPN_OK : ppn_err(PPN_EINVAL, "engine: no request %llu (finished, or never submitted)",
                                (unsigned long long)id);
}

ppn_status ppn_engine_poll(ppn_engine *e, uint64_t id, int timeout_ms, int *ids, int cap, int *n, int *finish,
                           ppn_status *why)
{
    if (!e || !n || !finish || cap < 0 || (cap > 0 && !ids)) return ppn_err(PPN_EINVAL, "ppn_engine_poll: bad argument");
    if (timeout_ms != 0 && ppn_model_on_engine_thread(e->m)) /* a callback: the ids come from this very thread */
        return ppn_err(PPN_EINVAL, "ppn_engine_poll: a callback (the engine's scheduler thread) polls with timeout 0 "
                                   "only (it asked for %d ms: it would wait for itself)", timeout_ms);
    *n = 0, *finish = PPN_FINISH_NONE;
    if (why) *why = PPN_OK;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    long long ns = (long long)dl.tv_nsec + (long long)(timeout_ms > 0 ? timeout_ms : 0) * 1000000LL;
    dl.tv_sec += (time_t)(ns / 1000000000LL), dl.tv_nsec = (long)(ns % 1000000000LL);
    pthread_mutex_lock(&e->mu);
    req *r = live_find(e, id);
    ppn_status st = PPN_OK;
    if (!r || r->cb) {
        st = ppn_err(PPN_EINVAL, "engine: no polled request %llu", (unsigned long long)id);
        goto out;
    }
    while (r->out_n == r->out_taken && !r->done && timeout_ms != 0) {
        if (timeout_ms < 0) pthread_cond_wait(&e->polled, &e->mu);
        else if (pthread_cond_timedwait(&e->polled, &e->mu, &dl) == ETIMEDOUT) break;
    }
    int k = r->out_n - r->out_taken < cap ? r->out_n - r->out_taken : cap;
    if (k > 0) memcpy(ids, r->out + r->out_taken, sizeof(int) * (size_t)k);
    r->out_taken += k;
    *n = k;
    if (r->done && r->out_taken == r->out_n) {
        *finish = r->finish;
        if (why) *why = r->why;
        if (r->why != PPN_OK) ppn_err(r->why, "%s", r->err);
        live_unlink(e, r);
        req_free(r);
    }
out:
    pthread_mutex_unlock(&e->mu);
    return st;
}

void ppn_engine_get_stats(ppn_engine *e, ppn_engine_stats *out)
{
    if (!e || !out) return;
    pthread_mutex_lock(&e->mu);
    *out = e->st;
    out->uptime_s = now_s() - e->t0;
    pthread_mutex_unlock(&e->mu);
}

/* ---- the scheduler thread ------------------------------------------------------------------------------ */

static void emit(const req *r, int token, const char *text, size_t len, int finish, ppn_status why, const char *err)
{
    if (!r->cb) return;
    ppn_engine_event ev = {.id = r->id, .token = token, .text = text ? text : "", .text_len = text ? len : 0,
                           .finish = finish, .status = why, .error = err ? err : "", .n_prompt = r->n_prompt,
                           .n_generated = r->n_gen};
    r->cb(r->cb_arg, &ev);
}

static void run_remove(ppn_engine *e, req *r)
{
    for (int i = 0; i < e->n_run; i++)
        if (e->run[i] == r) {
            memmove(e->run + i, e->run + i + 1, sizeof(req *) * (size_t)(e->n_run - i - 1));
            e->n_run--;
            return;
        }
}

/* Room for len more bytes of held text. */
static int held_grow(req *r, size_t len)
{
    if (r->held_len + len + 8 <= r->held_cap) return 1;
    size_t cap = (r->held_len + len + 8) * 2;
    char *h = realloc(r->held, cap);
    if (!h) return 0;
    r->held = h, r->held_cap = cap;
    return 1;
}

static size_t held_release(req *r, int *hit);

/* End r: the held text goes out with the final event, its sequence back to the free list, its blocks back to the
 * pool of reservations. The last thing done with r: a polled request may be freed by its poller right after. */
static void finish_req(ppn_engine *e, req *r, int finish, ppn_status why, const char *err)
{
    if (r->ds && !r->hit) { /* a stop string dropped the rest; else what the detokenizer holds goes out too */
        const char *t;
        size_t tl;
        if (ppn_detok_stream_flush(r->ds, &t, &tl) == PPN_OK && tl && held_grow(r, tl)) {
            memcpy(r->held + r->held_len, t, tl);
            r->held_len += tl;
            /* the flush may complete a stop string (text the detokenizer held: a byte run, a decoder that holds
             * all): the text ends before it, as it would have had the string come earlier */
            int hit;
            size_t go = held_release(r, &hit);
            if (hit) {
                r->held_len = go;
                if (finish == PPN_FINISH_LENGTH) finish = PPN_FINISH_STOP;
            }
        }
    }
    if (r->seq) {
        ppn_seq_reset(r->seq);
        e->free_seqs[e->n_free++] = r->seq;
        r->seq = NULL;
        e->reserved -= r->reserve;
        run_remove(e, r);
    }
    int polled = !r->cb; /* then r may be freed by its poller as soon as mu is released */
    pthread_mutex_lock(&e->mu);
    r->done = 1, r->finish = finish, r->why = why;
    snprintf(r->err, sizeof r->err, "%s", err ? err : "");
    e->st.finished += finish == PPN_FINISH_STOP || finish == PPN_FINISH_LENGTH;
    e->st.cancelled += finish == PPN_FINISH_CANCELLED;
    e->st.failed += finish == PPN_FINISH_ERROR;
    if (r->cb) live_unlink(e, r);
    pthread_cond_broadcast(&e->polled);
    pthread_mutex_unlock(&e->mu);
    if (polled) return;
    emit(r, -1, r->held, r->held_len, finish, why, r->err);
    req_free(r);
}

static void fail_req(ppn_engine *e, req *r, ppn_status st)
{
    finish_req(e, r, PPN_FINISH_ERROR, st, ppn_last_error());
}

/* How much of the held text may go out: all but the longest tail that begins a stop string. *hit: a stop string
 * was found (the text before it goes out, the rest is dropped). */
static size_t held_release(req *r, int *hit)
{
    *hit = 0;
    if (!r->n_stop) return r->held_len;
    size_t first = r->held_len;
    for (int i = 0; i < r->n_stop; i++) {
        char *p = memmem(r->held, r->held_len, r->stop[i], r->stop_len[i]);
        if (p && (size_t)(p - r->held) < first) first = (size_t)(p - r->held), *hit = 1;
    }
    if (*hit) return first;
    size_t keep = 0;
    for (int i = 0; i < r->n_stop; i++)
        for (size_t k = r->stop_len[i] - 1; k > keep; k--)
            if (k <= r->held_len && !memcmp(r->held + r->held_len - k, r->stop[i], k)) {
                keep = k;
                break;
            }
    return r->held_len - keep;
}

static int is_stop_id(const req *r, int tok)
{
    if (tok == r->eos[0] || tok == r->eos[1]) return 1;
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == tok) return 1;
    return 0;
}

static void account_token(ppn_engine *e, req *r, int tok)
{
    double t = now_s();
    pthread_mutex_lock(&e->mu);
    if (r->n_gen == 1) hist_add(&e->st.ttft, t - r->t_submit);
    else hist_add(&e->st.itl, t - r->t_last);
    e->st.generated_tokens++;
    if (r->out && r->out_n < r->out_cap) r->out[r->out_n++] = tok;
    pthread_cond_broadcast(&e->polled);
    pthread_mutex_unlock(&e->mu);
    r->t_last = t;
}

/* A generated id: a stop, or delivered (with its text) and fed at the next decode unless the request is done. */
static void on_token(ppn_engine *e, req *r, int tok)
{
    if (is_stop_id(r, tok)) return finish_req(e, r, PPN_FINISH_STOP, PPN_OK, NULL);
    const char *t = NULL;
    size_t tl = 0;
    ppn_status st = r->ds ? ppn_detok_stream_push(r->ds, tok, &t, &tl) : PPN_OK;
    if (st == PPN_OK && !held_grow(r, tl)) st = ppn_err(PPN_ENOMEM, "engine: held text");
    if (st != PPN_OK) return fail_req(e, r, st);
    if (tl) memcpy(r->held + r->held_len, t, tl);
    r->held_len += tl;
    int hit;
    size_t go = held_release(r, &hit);
    r->n_gen++;
    account_token(e, r, tok);
    emit(r, tok, r->held, go, PPN_FINISH_NONE, PPN_OK, NULL);
    if (hit) return r->hit = 1, r->held_len = 0, finish_req(e, r, PPN_FINISH_STOP, PPN_OK, NULL);
    memmove(r->held, r->held + go, r->held_len - go);
    r->held_len -= go;
    if (r->n_gen >= r->max_tokens) return finish_req(e, r, PPN_FINISH_LENGTH, PPN_OK, NULL);
    r->next_token = tok;
    r->state = R_DECODE;
}

/* The model failed for good: every request ends with its status, and every later submit gets it. */
static void fail_model(ppn_engine *e, ppn_status st)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", ppn_last_error());
    pthread_mutex_lock(&e->mu);
    e->sticky = st;
    pthread_mutex_unlock(&e->mu);
    while (e->n_run) finish_req(e, e->run[0], PPN_FINISH_ERROR, st, msg);
}

/* Under mu: pop the cancelled requests out of the queue into *cancelled, then admit from its head (FIFO) while
 * the batch has room and the head's blocks fit beside the running reservations. */
static req *admit(ppn_engine *e, req **cancelled)
{
    req *adm = NULL, **at = &adm, **pp = &e->qhead, *last = NULL;
    *cancelled = NULL;
    while (*pp) {
        req *r = *pp;
        if (!r->cancel) {
            last = r, pp = &r->qnext;
            continue;
        }
        *pp = r->qnext, e->n_queued--;
        r->qnext = *cancelled, *cancelled = r;
    }
    e->qtail = last;
    int room = e->max_batch - e->n_run, resv = e->reserved;
    while (e->qhead && room > 0 && resv + e->qhead->reserve <= e->blocks_total) {
        req *r = e->qhead;
        e->qhead = r->qnext;
        if (!e->qhead) e->qtail = NULL;
        r->qnext = NULL, *at = r, at = &r->qnext;
        e->n_queued--, room--, resv += r->reserve;
    }
    return adm;
}

static ppn_status take_seq(ppn_engine *e, ppn_seq **s)
{
    if (e->n_free) {
        *s = e->free_seqs[--e->n_free];
        return PPN_OK;
    }
    return ppn_seq_create(e->m, s);
}

static void start_admitted(ppn_engine *e, req *adm)
{
    while (adm) {
        req *r = adm;
        adm = r->qnext;
        r->qnext = NULL;
        ppn_status st = take_seq(e, &r->seq);
        if (st != PPN_OK) {
            fail_req(e, r, st);
            continue;
        }
        r->state = R_PRIME;
        e->reserved += r->reserve;
        e->run[e->n_run++] = r;
    }
}

/* A sampled id from a row of logits (the first id of every request, and every id of a sampled one). */
static void sample_token(ppn_engine *e, req *r, const float *logits)
{
    int tok = 0;
    ppn_status st = ppn_sample(&r->sp, logits, e->vocab, &tok);
    if (st != PPN_OK) return fail_req(e, r, st);
    on_token(e, r, tok);
}

/* A batched call failed before anything was issued: find the culprits by running each row alone (retry(i)),
 * fail those alone; if every row fails, the model itself is broken. Returns how many rows succeeded alone. */
static int isolate(ppn_engine *e, req *const *who, int n, ppn_status (*retry)(ppn_engine *, int),
                   void (*ok)(ppn_engine *, int))
{
    int good = 0;
    ppn_status last = PPN_OK;
    for (int i = 0; i < n; i++) {
        ppn_status st = retry(e, i);
        if (st == PPN_OK) good++, ok(e, i);
        else fail_req(e, who[i], last = st);
    }
    if (!good && last != PPN_OK && last != PPN_EINVAL && last != PPN_ESTATE && last != PPN_ENOMEM)
        fail_model(e, last);
    return good;
}

static ppn_status prime_one(ppn_engine *e, int i)
{
    ppn_prefill_opts o = {.chunk = e->chunk};
    return ppn_prefill(e->bseqs[i], e->bids[i], e->bn[i], &o, e->plog[i]);
}

static void primed(ppn_engine *e, int i)
{
    req *r = e->who[i];
    r->primed += e->bn[i];
    if (r->primed == r->n_prompt) sample_token(e, r, e->plog[i]);
}

/* An iteration's prompt rows: chunk, cut beside base decode rows to step_rows - base (at least min(16, chunk)). */
static int prime_budget(const ppn_engine *e, int base)
{
    if (!base || !e->step_rows || e->step_rows - base >= e->chunk) return e->chunk;
    int least = e->chunk < 16 ? e->chunk : 16;
    return e->step_rows - base > least ? e->step_rows - base : least;
}

/* Up to prime_budget prompt rows over the priming requests, in admission order; their logits (only where a slice
 * ends its prompt) at e->logits rows base + i. Returns the slices. */
static int collect_prime(ppn_engine *e, int base, int *rows)
{
    int count = 0, full = prime_budget(e, base), budget = full;
    for (int i = 0; i < e->n_run && budget > 0; i++) {
        req *r = e->run[i];
        if (r->state != R_PRIME) continue;
        int take = r->n_prompt - r->primed < budget ? r->n_prompt - r->primed : budget;
        e->bseqs[count] = r->seq, e->bids[count] = r->prompt + r->primed, e->bn[count] = take;
        e->plog[count] = r->primed + take == r->n_prompt ? e->logits + (size_t)(base + count) * (size_t)e->vocab : NULL;
        e->who[count++] = r;
        budget -= take;
    }
    *rows = full - budget;
    return count;
}

/* Every decoding request's next token. Returns the rows; *sampled: some row samples (needs its logits). */
static int collect_decode(ppn_engine *e, int *sampled)
{
    int n = 0;
    *sampled = 0;
    for (int i = 0; i < e->n_run; i++) {
        req *r = e->run[i];
        if (r->state != R_DECODE) continue;
        e->dseqs[n] = r->seq, e->toks[n] = r->next_token, e->dwho[n++] = r;
        *sampled |= !r->greedy;
    }
    return n;
}

static void count_prime(ppn_engine *e, int rows)
{
    pthread_mutex_lock(&e->mu);
    e->st.prefill_chunks++;
    e->st.prompt_tokens += (uint64_t)rows;
    pthread_mutex_unlock(&e->mu);
}

/* The slices in one ppn_prefill_batch (each slice's logits only where it ends its prompt: a batch call writes
 * every slice's, so it gets the rows and the slices that do not end take them for nothing). */
static void prime_run(ppn_engine *e, int count, int rows)
{
    ppn_prefill_opts o = {.chunk = e->chunk};
    ppn_status st = ppn_prefill_batch(e->bseqs, e->bids, e->bn, count, &o, e->logits);
    count_prime(e, rows);
    for (int i = 0; i < count; i++) e->plog[i] = e->logits + (size_t)i * (size_t)e->vocab;
    if (st != PPN_OK) {
        isolate(e, e->who, count, prime_one, primed);
        return;
    }
    for (int i = 0; i < count; i++) primed(e, i);
}

static ppn_status decode_one(ppn_engine *e, int i)
{
    req *r = e->dwho[i];
    return ppn_decode_batch_ex(&e->dseqs[i], &e->toks[i], 1, NULL,
                               r->greedy ? NULL : e->logits + (size_t)i * (size_t)e->vocab, &e->ids_out[i]);
}

static void decoded(ppn_engine *e, int i)
{
    req *r = e->dwho[i];
    if (r->greedy) return on_token(e, r, e->ids_out[i]);
    sample_token(e, r, e->logits + (size_t)i * (size_t)e->vocab);
}

static void count_decode(ppn_engine *e, int mixed)
{
    pthread_mutex_lock(&e->mu);
    e->st.decode_batches++;
    e->st.mixed_steps += (uint64_t)mixed;
    pthread_mutex_unlock(&e->mu);
}

static void decode_run(ppn_engine *e, int n, int sampled)
{
    ppn_status st = ppn_decode_batch_ex(e->dseqs, e->toks, n, NULL, sampled ? e->logits : NULL, e->ids_out);
    count_decode(e, 0);
    if (st != PPN_OK) {
        isolate(e, e->dwho, n, decode_one, decoded);
        return;
    }
    for (int i = 0; i < n; i++) decoded(e, i);
}

/* One iteration's forward(s): the prompt rows and the decode rows in one mixed step when there are both (the
 * decode rows' logits at e->logits rows [0, n), the slices' after them), else whichever there is. A mixed step
 * refused before anything moved (a sequence out of KV, a bad row) falls back to the two calls, whose isolation
 * finds the culprit; a model failure fails them too. */
static void step(ppn_engine *e)
{
    int sampled, n = collect_decode(e, &sampled), rows, count = collect_prime(e, n, &rows);
    if (count && n && !e->separate) {
        ppn_batch_opts o = ppn_batch_opts_default();
        o.n_prime = count, o.prime_seqs = e->bseqs, o.prime_ids = e->bids, o.prime_n = e->bn, o.prime_logits = e->plog;
        ppn_status st = ppn_decode_batch_ex(e->dseqs, e->toks, n, &o, sampled ? e->logits : NULL, e->ids_out);
        if (st == PPN_OK) {
            count_prime(e, rows);
            count_decode(e, 1);
            for (int i = 0; i < count; i++) primed(e, i);
            for (int i = 0; i < n; i++) decoded(e, i);
            return;
        }
        count = collect_prime(e, 0, &rows); /* the two calls' layout: slices' logits from row 0 (the full chunk) */
    }
    if (count) prime_run(e, count, rows);
    if (n) decode_run(e, n, sampled);
}

static void cancel_running(ppn_engine *e, int all)
{
    for (int i = 0; i < e->n_run;) {
        req *r = e->run[i];
        pthread_mutex_lock(&e->mu);
        int c = all || r->cancel;
        pthread_mutex_unlock(&e->mu);
        if (c) finish_req(e, r, PPN_FINISH_CANCELLED, PPN_OK, NULL);
        else i++;
    }
}

/* Queued requests ended: cancelled, or failed with the model's failure. */
static void finish_list(ppn_engine *e, req *l, ppn_status sticky)
{
    while (l) {
        req *r = l;
        l = r->qnext;
        if (sticky == PPN_OK) finish_req(e, r, PPN_FINISH_CANCELLED, PPN_OK, NULL);
        else finish_req(e, r, PPN_FINISH_ERROR, sticky, "engine: the model failed earlier");
    }
}

static void publish_stats(ppn_engine *e)
{
    ppn_kv_info kv;
    ppn_model_get_kv_info(e->m, &kv);
    ppn_stats ms;
    ppn_model_get_stats(e->m, &ms);
    pthread_mutex_lock(&e->mu);
    e->st.n_stages = ms.n_stages;
    for (int s = 0; s < PPN_MAX_STAGES; s++) e->st.stage_busy_s[s] = (double)ms.stage_busy_ns[s] / 1e9;
    e->st.queued = e->n_queued;
    e->st.running = e->n_run;
    e->st.kv_blocks_used = kv.blocks_used;
    e->st.kv_blocks_total = kv.blocks_total;
    e->st.kv_blocks_reserved = e->reserved;
    e->st.iterations++;
    pthread_mutex_unlock(&e->mu);
}

/* Returns 0 when the engine stops. */
static int iterate(ppn_engine *e)
{
    req *cancelled, *adm;
    pthread_mutex_lock(&e->mu);
    while (!e->stopping && !e->qhead && !e->n_run) pthread_cond_wait(&e->wake, &e->mu);
    int stopping = e->stopping;
    if (stopping) {
        for (req *r = e->qhead; r; r = r->qnext) r->cancel = 1;
    }
    ppn_status sticky = e->sticky;
    adm = stopping || sticky != PPN_OK ? NULL : admit(e, &cancelled);
    if (stopping || sticky != PPN_OK) {
        cancelled = e->qhead;
        e->qhead = e->qtail = NULL, e->n_queued = 0;
    }
    pthread_mutex_unlock(&e->mu);
    finish_list(e, cancelled, stopping ? PPN_OK : sticky);
    cancel_running(e, stopping);
    if (stopping) return 0;
    start_admitted(e, adm);
    step(e);
    /* Idle (the step waited for its ids; nothing runs): sum the walks' timing pairs that completed, which a next
     * walk would otherwise sum, so the busy counters a scrape reads between two loads are exact, not one load's
     * last walks short (they would land in the next load's window: more busy time than wall time). A model that
     * failed here fails every request from now on, as in a step. */
    if (!e->n_run && e->sticky == PPN_OK) {
        ppn_status st = ppn_model_time_stages(e->m, 1);
        if (st != PPN_OK) fail_model(e, st);
    }
    publish_stats(e);
    return 1;
}

static void *sched_main(void *arg)
{
    ppn_engine *e = arg;
    /* the model is this thread's from here: pairs with the release before pthread_create in ppn_engine_create() */
    (void)ppn_model_handoff_acquire(e->m, &e->thread);
    ppn_model_engine_thread(e->m); /* ppn_model_caller: this thread alone drives the model while the engine runs */
    while (iterate(e)) {}
    publish_stats(e);
    ppn_model_engine_thread(NULL);
    /* and the caller's again: pairs with the acquire after the join */
    (void)ppn_model_handoff_release(e->m, &e->stopping);
    return NULL;
}

/* ---- lifetime ------------------------------------------------------------------------------------------ */

static ppn_status engine_opts(ppn_engine *e, const ppn_engine_opts *o)
{
    e->max_batch = o->max_batch ? o->max_batch : 16;
    e->max_queue = o->max_queue ? o->max_queue : 256;
    e->chunk = o->chunk ? o->chunk : 256;
    e->separate = o->separate;
    e->step_rows = o->step_rows < 0 ? 0 : o->step_rows ? o->step_rows : 128; /* 0 inside: off */
    e->tok = o->tok, e->tmpl = o->tmpl;
    if (e->max_batch < 1 || e->max_batch > 256) return ppn_err(PPN_EINVAL, "engine: max_batch %d outside 1 .. 256", e->max_batch);
    if (e->max_queue < 1) return ppn_err(PPN_EINVAL, "engine: max_queue %d < 1", e->max_queue);
    if (e->separate < 0 || e->separate > 1) return ppn_err(PPN_EINVAL, "engine: separate %d is not 0 or 1", e->separate);
    if (o->step_rows < -1 || o->step_rows > PPN_PREFILL_MAX_CHUNK)
        return ppn_err(PPN_EINVAL, "engine: step_rows %d outside -1 .. %d", o->step_rows, PPN_PREFILL_MAX_CHUNK);
    if (e->chunk < 1 || e->chunk > PPN_PREFILL_MAX_CHUNK)
        return ppn_err(PPN_EINVAL, "engine: chunk %d outside 1 .. %d", e->chunk, PPN_PREFILL_MAX_CHUNK);
    return PPN_OK;
}

/* m has no engine again, nor its runtime (ppn_engine_create's two claims undone). */
static void engine_off(ppn_model *m)
{
    atomic_store(&m->rt->engine_on, 0);
    atomic_store(&m->engine_on, PPN_ENGINE_NONE);
}

/* Free e and its spare sequences; returns the first failure destroying them (PPN_EDRIVER: a block retired, named
 * in the message), everything freed all the same. */
static ppn_status engine_free(ppn_engine *e)
{
    ppn_err_first first = {0};
    for (int i = 0; i < e->n_free; i++) ppn_err_first_add(&first, ppn_seq_destroy(e->free_seqs[i]));
    while (e->live) {
        req *r = e->live;
        live_unlink(e, r);
        req_free(r);
    }
    free(e->run);
    free(e->free_seqs);
    free(e->logits);
    free(e->ids_out);
    free(e->toks);
    free(e->bseqs);
    free(e->bids);
    free(e->bn);
    free(e->who);
    free(e->plog);
    free(e->dseqs);
    free(e->dwho);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->wake);
    pthread_cond_destroy(&e->polled);
    if (e->m) engine_off(e->m);
    free(e);
    return ppn_err_first_done(&first);
}

ppn_status ppn_engine_create(ppn_model *m, const ppn_engine_opts *opts, ppn_engine **out)
{
    if (!m || !out) return ppn_err(PPN_EINVAL, "ppn_engine_create: NULL argument");
    *out = NULL;
    int none = PPN_ENGINE_NONE; /* the scheduler thread uses the model alone: a second engine would race it */
    if (!atomic_compare_exchange_strong(&m->engine_on, &none, PPN_ENGINE_HANDOVER))
        return ppn_err(PPN_ESTATE, "ppn_engine_create: the model has an engine already (one at a time: destroy it "
                       "first)");
    int free_rt = 0; /* and the runtime's other models would be driven from a second thread */
    if (!atomic_compare_exchange_strong(&m->rt->engine_on, &free_rt, 1))
        return atomic_store(&m->engine_on, PPN_ENGINE_NONE),
               ppn_err(PPN_ESTATE, "ppn_engine_create: an engine runs on another model of this runtime (one engine a "
                       "runtime, whose models are driven from one thread at a time: load this model on a runtime of "
                       "its own)");
    ppn_engine_opts dflt = ppn_engine_opts_default();
    ppn_engine *e = calloc(1, sizeof *e);
    if (!e) return engine_off(m), ppn_err(PPN_ENOMEM, "engine");
    e->m = m;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->polled, NULL);
    ppn_status st = engine_opts(e, opts ? opts : &dflt);
    if (st != PPN_OK) return engine_free(e), st;
    ppn_model_info mi;
    ppn_kv_info kv;
    ppn_model_get_info(m, &mi);
    ppn_model_get_kv_info(m, &kv);
    e->m = m, e->vocab = mi.vocab, e->ctx = mi.ctx, e->eos = mi.eos_id;
    e->blocks_total = kv.blocks_total - kv.blocks_used; /* what sequences outside the engine hold stays theirs */
    e->next_id = 1;
    e->t0 = now_s();
    size_t b = (size_t)e->max_batch;
    e->run = calloc(b, sizeof(req *));
    e->free_seqs = calloc(b, sizeof(ppn_seq *));
    e->logits = malloc(b * (size_t)e->vocab * sizeof(float));
    e->ids_out = calloc(b, sizeof(int));
    e->toks = calloc(b, sizeof(int));
    e->bseqs = calloc(b, sizeof(ppn_seq *));
    e->bids = calloc(b, sizeof(int *));
    e->bn = calloc(b, sizeof(int));
    e->who = calloc(b, sizeof(req *));
    e->plog = calloc(b, sizeof(float *));
    e->dseqs = calloc(b, sizeof(ppn_seq *));
    e->dwho = calloc(b, sizeof(req *));
    if (!e->run || !e->free_seqs || !e->logits || !e->ids_out || !e->toks || !e->bseqs || !e->bids || !e->bn || !e->who ||
        !e->plog || !e->dseqs || !e->dwho)
        return engine_free(e), ppn_err(PPN_ENOMEM, "engine: batch buffers for %d rows", e->max_batch);
    e->st.kv_blocks_total = kv.blocks_total;
    /* what this thread synced on the model (its load) is the scheduler's */
    st = ppn_model_time_stages(m, 1); /* the stages' busy time, for the metrics */
    if (st != PPN_OK) return engine_free(e), st;
    ppn_stats ms;
    ppn_model_get_stats(m, &ms);
    e->st.n_stages = ms.n_stages;
    (void)ppn_model_handoff_release(m, &e->thread);
    atomic_store(&m->engine_on, PPN_ENGINE_RUNS); /* from here only the scheduler thread drives m */
    if (pthread_create(&e->thread, NULL, sched_main, e) != 0)
        return engine_free(e), ppn_err(PPN_ENOMEM, "engine: cannot start the scheduler thread");
    *out = e;
    return PPN_OK;
}

ppn_status ppn_engine_destroy(ppn_engine *e)
{
    if (!e) return PPN_OK;
    if (ppn_model_on_engine_thread(e->m)) /* a callback: it would join the thread it runs on */
        return ppn_err(PPN_ESTATE, "ppn_engine_destroy: called from a callback (the engine's scheduler thread): "
                                   "destroy the engine from another thread");
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    (void)ppn_model_handoff_acquire(e->m, &e->stopping); /* pairs with the release at the end of sched_main() */
    atomic_store(&e->m->engine_on, PPN_ENGINE_HANDOVER); /* this thread drives m again: engine_free ends it */
    (void)ppn_model_time_stages(e->m, 0); /* as loaded (a failed model, which steps no more, keeps it on) */
    return engine_free(e); /* on this thread: a failure's message is the caller's ppn_last_error() */
}
