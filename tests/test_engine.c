/* test_engine.c - the engine (ppn_engine_*) on the sim backend: concurrent requests give the ids each prompt gives
 * alone (greedy), and those of the plain API (prefill, then one step at a time); submit and cancel from many
 * threads; cancel mid-stream; stop ids, stop strings, max tokens; requests waiting for KV blocks and finishing
 * later; requests refused alone; the bounded queue; polling; destroy under load. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ppn.h"
#include "tests/util/tutil.h"

#define NP 12     /* prompts */
#define NEW 12    /* ids generated for each */

static ppn_rt *rt;
static int prompts[NP][96], plen[NP];
static int ref[NP][NEW];

/* ---- one request's record, filled by the callback -------------------------------------------------------- */

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ids[512], n, finals, finish, n_events_after_final;
    ppn_status why;
    char text[4096];
    size_t text_len;
    uint64_t cancel_at_id;   /* cancel this request from the callback after cancel_after ids */
    int cancel_after;
    ppn_engine *e;
} rec;

static void rec_init(rec *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static void rec_fini(rec *r)
{
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

static void on_event(void *arg, const ppn_engine_event *ev)
{
    rec *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->finals) r->n_events_after_final++;
    if (ev->text_len && r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
        r->text[r->text_len] = 0;
    }
    if (ev->finish == PPN_FINISH_NONE) {
        if (r->n < 512) r->ids[r->n++] = ev->token;
    } else {
        r->finals++, r->finish = ev->finish, r->why = ev->status;
        pthread_cond_broadcast(&r->cv);
    }
    int cancel = r->cancel_at_id && r->n == r->cancel_after && ev->finish == PPN_FINISH_NONE;
    pthread_mutex_unlock(&r->mu);
    if (cancel) assert_int_equal(ppn_engine_cancel(r->e, r->cancel_at_id), PPN_OK); /* from the callback */
}

static void rec_wait(rec *r)
{
    pthread_mutex_lock(&r->mu);
    while (!r->finals) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

static ppn_request greedy_req(int p, int max_tokens, rec *r)
{
    ppn_request q = ppn_request_default();
    q.ids = prompts[p], q.n_ids = plen[p];
    q.max_tokens = max_tokens;
    q.ignore_eos = 1;
    q.cb = on_event, q.cb_arg = r;
    return q;
}

static ppn_model *load(int ctx, int kv_tokens)
{
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = ctx;
    o.kv_tokens = kv_tokens;
    return tu_model_load(rt, tu_fixture("hf/llama-tiny"), &o);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* The plain API's greedy ids for every prompt: prefill, then one step at a time. */
static int group_setup(void **state)
{
    (void)state;
    if (ppn_rt_create("sim", &rt) != PPN_OK) return -1;
    uint64_t x = 12345;
    for (int p = 0; p < NP; p++) {
        plen[p] = 1 + (p * 37) % 90;
        for (int i = 0; i < plen[p]; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            prompts[p][i] = 3 + (int)((x >> 33) % 250);
        }
    }
    ppn_model *m = load(128, 0);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *lg = malloc(sizeof(float) * (size_t)mi.vocab);
    for (int p = 0; p < NP; p++) {
        ppn_seq *s = NULL;
        if (ppn_seq_create(m, &s) != PPN_OK || ppn_prefill(s, prompts[p], plen[p], NULL, lg) != PPN_OK) return -1;
        for (int t = 0; t < NEW; t++) {
            ref[p][t] = argmax(lg, mi.vocab);
            if (t + 1 < NEW && ppn_decode_step(s, ref[p][t], lg) != PPN_OK) return -1;
        }
        ppn_seq_destroy(s);
    }
    free(lg);
    return ppn_model_free(m) == PPN_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    return ppn_rt_destroy(rt) == PPN_OK ? 0 : -1;
}

static ppn_engine *engine_sep(ppn_model *m, int max_batch, int max_queue, int chunk, int separate, int step_rows)
{
    ppn_engine_opts o = ppn_engine_opts_default();
    o.max_batch = max_batch, o.max_queue = max_queue, o.chunk = chunk, o.separate = separate, o.step_rows = step_rows;
    ppn_engine *e = NULL;
    if (ppn_engine_create(m, &o, &e) != PPN_OK) fail_msg("engine: %s", ppn_last_error());
    return e;
}

static ppn_engine *engine(ppn_model *m, int max_batch, int max_queue, int chunk)
{
    return engine_sep(m, max_batch, max_queue, chunk, 0, 0);
}

#define SUBMIT_OK(e, q, id)                                                                                  \
    do {                                                                                                       \
        ppn_status st_ = ppn_engine_submit(e, q, id);                                                          \
        if (st_ != PPN_OK) fail_msg("submit: %s: %s", ppn_status_name(st_), ppn_last_error());                 \
    } while (0)

static void check_ref(const rec *r, int p, int n)
{
    assert_int_equal(r->finals, 1);
    assert_int_equal(r->n_events_after_final, 0);
    assert_int_equal(r->n, n);
    for (int t = 0; t < n; t++)
        if (r->ids[t] != ref[p][t]) fail_msg("prompt %d: id %d is %d, alone %d", p, t, r->ids[t], ref[p][t]);
}

/* st is PPN_ESTATE and this thread's message holds text. */
static void expect_refused(ppn_status st, const char *text)
{
    assert_int_equal(st, PPN_ESTATE);
    if (!strstr(ppn_last_error(), text)) fail_msg("expected \"%s\" in: %s", text, ppn_last_error());
}

/* Polls request id (no callback) until it ends: NEW ids, prompt p's one-at-a-time ones, finish LENGTH. */
static void poll_ref(ppn_engine *e, uint64_t id, int p)
{
    int got[NEW], n = 0, fin = PPN_FINISH_NONE;
    ppn_status why;
    while (fin == PPN_FINISH_NONE) {
        int k;
        assert_int_equal(ppn_engine_poll(e, id, 1000, got + n, NEW - n, &k, &fin, &why), PPN_OK);
        n += k;
    }
    assert_int_equal(fin, PPN_FINISH_LENGTH);
    assert_int_equal(why, PPN_OK);
    assert_int_equal(n, NEW);
    assert_memory_equal(got, ref[p], sizeof got);
}

/* Every prompt at once (batch 8, chunks of 40 rows: long prompts over several iterations beside the decodes),
 * then one at a time: the plain API's ids both ways; with the prompt rows and the decode rows in one forward
 * (mixed steps, the default) and in two; with the prompt rows cut beside the decodes (step_rows 20: 16 to 19
 * rows beside 1 to 4 decodes) or not (-1). Returns the prompt chunks. */
static uint64_t concurrent_equals_alone(int separate, int step_rows)
{
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine_sep(m, 8, 0, 40, separate, step_rows);
    rec r[NP];
    uint64_t id;
    for (int p = 0; p < NP; p++) {
        rec_init(&r[p]);
        ppn_request q = greedy_req(p, NEW, &r[p]);
        SUBMIT_OK(e, &q, &id);
        assert_true(id > 0);
    }
    for (int p = 0; p < NP; p++) rec_wait(&r[p]), check_ref(&r[p], p, NEW), assert_int_equal(r[p].finish, PPN_FINISH_LENGTH);
    for (int p = 0; p < NP; p++) {
        rec_fini(&r[p]), rec_init(&r[p]);
        ppn_request q = greedy_req(p, NEW, &r[p]);
        SUBMIT_OK(e, &q, &id);
        rec_wait(&r[p]);
        check_ref(&r[p], p, NEW);
        rec_fini(&r[p]);
    }
    ppn_engine_stats st;
    ppn_engine_get_stats(e, &st);
    assert_int_equal(st.submitted, 2 * NP);
    assert_int_equal(st.finished, 2 * NP);
    assert_int_equal(st.generated_tokens, 2 * NP * NEW);
    assert_int_equal(st.ttft.count, 2 * NP);
    assert_int_equal(st.itl.count, 2 * NP * (NEW - 1));
    assert_true(st.decode_batches < 2 * NP * NEW); /* rows were batched */
    ppn_stats ms;
    ppn_model_get_stats(m, &ms);
    printf("# separate %d, step_rows %d: %llu iterations, %llu decode batches, %llu prompt chunks, %llu mixed "
           "(model: %llu)\n", separate, step_rows, (unsigned long long)st.iterations, (unsigned long long)st.decode_batches,
           (unsigned long long)st.prefill_chunks, (unsigned long long)st.mixed_steps,
           (unsigned long long)ms.mixed_steps);
    if (separate) assert_true(st.mixed_steps == 0 && ms.mixed_steps == 0);
    else assert_true(st.mixed_steps > 0 && ms.mixed_steps == st.mixed_steps);
    ppn_engine_destroy(e);
    assert_int_equal(ppn_model_free(m), PPN_OK); /* every sequence destroyed */
    return st.prefill_chunks;
}

static void test_engine_concurrent_equals_alone(void **s) { (void)s, concurrent_equals_alone(0, 0); }
static void test_engine_concurrent_separate(void **s) { (void)s, concurrent_equals_alone(1, 0); }
static void test_engine_concurrent_step_rows(void **s)
{
    (void)s;
    uint64_t whole = concurrent_equals_alone(0, -1), cut = concurrent_equals_alone(0, 20);
    assert_true(cut > whole); /* the same prompt rows in smaller chunks */
}

/* A scrape between two loads reads exact busy counters: once the engine is idle, its stats' stage busy time is the
 * model's whole sum (ppn_engine_destroy's ppn_model_time_stages(m, 0) drains and sums every walk), not short of the
 * last walks, which a server's next load would count in its own window (busy fraction over 1: the CI failure of
 * stop 37's serve_bench under TSan). */
static void test_engine_busy_exact_when_idle(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine(m, 4, 0, 40);
    rec r[3];
    uint64_t id;
    for (int p = 0; p < 3; p++) {
        rec_init(&r[p]);
        ppn_request q = greedy_req(p, 5, &r[p]);
        SUBMIT_OK(e, &q, &id);
    }
    for (int p = 0; p < 3; p++) rec_wait(&r[p]), rec_fini(&r[p]);
    ppn_engine_stats st;
    int waited = 0;
    for (ppn_engine_get_stats(e, &st); st.running || st.queued; ppn_engine_get_stats(e, &st)) {
        usleep(1000);
        if (++waited > 60000) fail_msg("the engine did not go idle in 60 s (running %d, queued %d)", st.running, st.queued);
    }
    ppn_engine_destroy(e);
    ppn_stats ms;
    ppn_model_get_stats(m, &ms);
    assert_true(ms.n_stages >= 1 && st.n_stages == ms.n_stages);
    for (int s = 0; s < ms.n_stages; s++) {
        printf("# stage %d: %llu walks, %.6f s busy; the idle engine's stats %.6f s\n", s,
               (unsigned long long)ms.stage_busy_walks[s], (double)ms.stage_busy_ns[s] / 1e9, st.stage_busy_s[s]);
        assert_true(ms.stage_busy_walks[s] > 0 && ms.stage_busy_ns[s] > 0);
        assert_true(st.stage_busy_s[s] == (double)ms.stage_busy_ns[s] / 1e9);
    }
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* 8 threads submit 6 requests each; every other one is cancelled at once or from its callback after 3 ids. */
typedef struct thr {
    ppn_engine *e;
    int t;
    rec r[6];
} thr;

static void *thread_main(void *arg)
{
    thr *a = arg;
    for (int k = 0; k < 6; k++) {
        int p = (a->t * 6 + k) % NP;
        rec_init(&a->r[k]);
        a->r[k].e = a->e;
        ppn_request q = greedy_req(p, NEW, &a->r[k]);
        uint64_t id = 0;
        ppn_status st;
        while ((st = ppn_engine_submit(a->e, &q, &id)) == PPN_EBUSY) usleep(1000);
        assert_int_equal(st, PPN_OK);
        if (k % 4 == 1) assert_int_equal(ppn_engine_cancel(a->e, id), PPN_OK);
        if (k % 4 == 3) {
            pthread_mutex_lock(&a->r[k].mu);
            a->r[k].cancel_after = 3, a->r[k].cancel_at_id = id;
            if (a->r[k].n >= 3) a->r[k].cancel_at_id = 0; /* already past: let it run */
            pthread_mutex_unlock(&a->r[k].mu);
        }
    }
    return NULL;
}

static void test_engine_threads(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine(m, 6, 8, 64);
    thr t[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) t[i].e = e, t[i].t = i, pthread_create(&th[i], NULL, thread_main, &t[i]);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    int cancelled = 0;
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 6; k++) {
            rec *r = &t[i].r[k];
            int p = (i * 6 + k) % NP;
            rec_wait(r);
            assert_int_equal(r->finals, 1);
            assert_int_equal(r->n_events_after_final, 0);
            for (int j = 0; j < r->n; j++) assert_int_equal(r->ids[j], ref[p][j]); /* what came is right */
            if (r->finish == PPN_FINISH_CANCELLED) cancelled++, assert_true(r->n < NEW);
            else assert_int_equal(r->n, NEW);
            if (k % 2 == 0) assert_int_equal(r->finish, PPN_FINISH_LENGTH);
            rec_fini(r);
        }
    assert_true(cancelled >= 8); /* the k % 4 == 1 ones, cancelled before their first decode at the latest */
    ppn_engine_destroy(e);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* Cancel mid-stream from another thread; stop ids; max tokens. */
static void test_engine_cancel_stop_length(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine(m, 4, 0, 0);
    rec r;
    rec_init(&r);
    uint64_t id;
    ppn_request q = greedy_req(0, 0, &r); /* until the context is full */
    SUBMIT_OK(e, &q, &id);
    for (;;) {
        pthread_mutex_lock(&r.mu);
        int n = r.n;
        pthread_mutex_unlock(&r.mu);
        if (n >= 4) break;
        usleep(200);
    }
    assert_int_equal(ppn_engine_cancel(e, id), PPN_OK);
    rec_wait(&r);
    assert_int_equal(r.finish, PPN_FINISH_CANCELLED);
    assert_true(r.n < 128 - plen[0] + 1);
    assert_int_equal(ppn_engine_cancel(e, id), PPN_EINVAL); /* forgotten */
    rec_fini(&r);

    for (int p = 0; p < 4; p++) { /* stop at the first id equal to ref[p][5] */
        rec_init(&r);
        q = greedy_req(p, NEW, &r);
        int stop = ref[p][5], first = 0;
        while (ref[p][first] != stop) first++;
        q.stop_ids = &stop, q.n_stop_ids = 1;
        SUBMIT_OK(e, &q, &id);
        rec_wait(&r);
        assert_int_equal(r.finish, PPN_FINISH_STOP);
        check_ref(&r, p, first);
        rec_fini(&r);
    }
    rec_init(&r);
    q = greedy_req(3, 7, &r);
    SUBMIT_OK(e, &q, &id);
    rec_wait(&r);
    assert_int_equal(r.finish, PPN_FINISH_LENGTH);
    check_ref(&r, 3, 7);
    rec_fini(&r);
    /* a prompt filling the context exactly: one id, then LENGTH */
    int full[64];
    for (int i = 0; i < 64; i++) full[i] = 5 + i;
    ppn_engine_destroy(e);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    m = load(64, 0);
    e = engine(m, 4, 0, 0);
    rec_init(&r);
    q = greedy_req(0, 0, &r);
    q.ids = full, q.n_ids = 64;
    SUBMIT_OK(e, &q, &id);
    rec_wait(&r);
    assert_int_equal(r.finish, PPN_FINISH_LENGTH);
    assert_int_equal(r.n, 1);
    rec_fini(&r);
    ppn_engine_destroy(e);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* 256 KV positions (16 blocks) for requests of 5 blocks each: 3 run at once, the others wait and finish later
 * with the same ids. A request larger than the pools is refused alone, and bad requests too. */
static void test_engine_kv_exhaustion_and_refusals(void **state)
{
    (void)state;
    ppn_model *m = load(512, 256);
    ppn_kv_info kv;
    ppn_model_get_kv_info(m, &kv);
    assert_int_equal(kv.blocks_total, 16);
    ppn_engine *e = engine(m, 8, 0, 0);
    rec r[NP];
    uint64_t id;
    int n = 0, maxrun = 0;
    for (int p = 0; p < NP; p++) {
        if (plen[p] + NEW - 1 > 5 * 16 || plen[p] + NEW - 1 <= 4 * 16) continue; /* exactly 5 blocks */
        rec_init(&r[n]);
        ppn_request q = greedy_req(p, NEW, &r[n]);
        SUBMIT_OK(e, &q, &id);
        n++;
    }
    for (int p = 0; p < NP; p++) { /* and every other prompt */
        if (plen[p] + NEW - 1 > 4 * 16 || n >= NP) continue;
        rec_init(&r[n]);
        ppn_request q = greedy_req(p, NEW, &r[n]);
        SUBMIT_OK(e, &q, &id);
        n++;
    }
    int big[600];
    for (int i = 0; i < 600; i++) big[i] = 7;
    ppn_request q = ppn_request_default();
    q.ids = big, q.n_ids = 300;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_ENOMEM); /* 19 blocks > 16 */
    q.n_ids = 600;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_ESTATE); /* past the context */
    big[3] = 256;
    q.n_ids = 10;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_EINVAL); /* outside the vocabulary */
    big[3] = 7;
    q.n_ids = 0;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_EINVAL);
    q.n_ids = 10, q.temperature = -1;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_EINVAL);
    q.temperature = 0, q.top_p = 0;
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_EINVAL);
    q.top_p = 1, q.text = "hi";
    assert_int_equal(ppn_engine_submit(e, &q, &id), PPN_EINVAL); /* two prompts; and no tokenizer */
    for (int k = 0; k < n; k++) {
        ppn_engine_stats st;
        ppn_engine_get_stats(e, &st);
        if (st.running > maxrun) maxrun = st.running;
        assert_true(st.kv_blocks_used <= 16);
        rec_wait(&r[k]);
    }
    for (int k = 0; k < n; k++) assert_int_equal(r[k].finish, PPN_FINISH_LENGTH), assert_int_equal(r[k].n, NEW);
    for (int k = 0; k < n; k++) rec_fini(&r[k]);
    ppn_engine_stats st;
    ppn_engine_get_stats(e, &st);
    assert_int_equal(st.refused, 7);
    assert_int_equal(st.finished, n);
    ppn_engine_destroy(e);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* The queue's bound, polling, and destroy with requests queued and running. */
static void test_engine_queue_poll_destroy(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine(m, 1, 2, 0);
    rec r[6];
    uint64_t id;
    int busy = 0;
    for (int k = 0; k < 6; k++) {
        rec_init(&r[k]);
        ppn_request q = greedy_req(k, 0, &r[k]);
        ppn_status st = ppn_engine_submit(e, &q, &id);
        if (st == PPN_EBUSY) busy++, r[k].finals = -1;
        else assert_int_equal(st, PPN_OK);
    }
    assert_true(busy >= 3); /* at most one running and two waiting */
    ppn_engine_destroy(e);  /* cancels the running one and the queued ones */
    for (int k = 0; k < 6; k++) {
        if (r[k].finals >= 0) assert_int_equal(r[k].finals, 1), assert_int_equal(r[k].finish, PPN_FINISH_CANCELLED);
        rec_fini(&r[k]);
    }

    e = engine(m, 4, 0, 16);
    uint64_t ids[3];
    for (int p = 0; p < 3; p++) {
        ppn_request q = greedy_req(p, NEW, NULL);
        q.cb = NULL;
        assert_int_equal(ppn_engine_submit(e, &q, &ids[p]), PPN_OK);
    }
    for (int p = 0; p < 3; p++) {
        poll_ref(e, ids[p], p);
        int got[NEW], k, fin;
        assert_int_equal(ppn_engine_poll(e, ids[p], 0, got, NEW, &k, &fin, NULL), PPN_EINVAL); /* forgotten */
    }
    /* destroy under load: 24 requests, some running, some queued, a poll-mode one never polled */
    rec lr[24];
    for (int k = 0; k < 24; k++) {
        rec_init(&lr[k]);
        ppn_request q = greedy_req(k % NP, 0, &lr[k]);
        SUBMIT_OK(e, &q, &id);
    }
    ppn_request q = greedy_req(0, 0, NULL);
    q.cb = NULL;
    SUBMIT_OK(e, &q, &id);
    usleep(20000);
    ppn_engine_destroy(e);
    for (int k = 0; k < 24; k++) {
        assert_int_equal(lr[k].finals, 1);
        assert_true(lr[k].finish == PPN_FINISH_CANCELLED || lr[k].finish == PPN_FINISH_LENGTH);
        rec_fini(&lr[k]);
    }
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* Two runtimes in one process, a model and an engine on each, their scheduler threads stepping at once (each
 * runtime its own pools, pinned arenas and, on the sim, its own checker): every answer the one-at-a-time one. One
 * engine a runtime (ppn.h: a runtime's models are driven from one thread at a time): while one runs, an engine on
 * a second model of that runtime, the model's own calls, a load onto the runtime and the model's free are refused
 * by name, and the running engine carries on. */
static void test_engine_two_runtimes(void **state)
{
    (void)state;
    ppn_rt *rt2 = NULL;
    assert_int_equal(ppn_rt_create("sim", &rt2), PPN_OK);
    ppn_load_opts o = ppn_load_opts_default();
    o.ctx = 128;
    ppn_model *m[2] = {load(128, 0), tu_model_load(rt2, tu_fixture("hf/llama-tiny"), &o)}, *same = load(128, 0);
    ppn_engine *e[2] = {engine(m[0], 4, 0, 16), engine(m[1], 4, 0, 16)}, *third = (ppn_engine *)m;
    ppn_engine_opts eo = ppn_engine_opts_default();
    expect_refused(ppn_engine_create(same, &eo, &third), "ppn_engine_create: an engine runs on another model of this "
                   "runtime");
    assert_null(third);
    ppn_seq *s = (ppn_seq *)m;
    expect_refused(ppn_seq_create(same, &s), "ppn_seq_create: an engine runs on another model of this model's runtime");
    assert_null(s);
    expect_refused(ppn_model_free(same), "ppn_model_free: an engine runs on another model");
    ppn_model *more = m[0];
    expect_refused(ppn_model_load(rt, tu_fixture("hf/llama-tiny"), &o, &more),
                   "ppn_model_load: an engine runs on a model of this runtime");
    assert_null(more);
    rec r[NP];
    uint64_t id;
    for (int p = 0; p < NP; p++) {
        rec_init(&r[p]);
        ppn_request q = greedy_req(p, NEW, &r[p]);
        SUBMIT_OK(e[p % 2], &q, &id);
    }
    for (int p = 0; p < NP; p++) rec_wait(&r[p]), check_ref(&r[p], p, NEW), rec_fini(&r[p]);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ppn_engine_destroy(e[k]), PPN_OK);
        assert_int_equal(ppn_model_free(m[k]), PPN_OK);
    }
    assert_int_equal(ppn_seq_create(same, &s), PPN_OK); /* the runtime's engine is gone */
    assert_int_equal(ppn_seq_destroy(s), PPN_OK);
    assert_int_equal(ppn_engine_create(same, &eo, &third), PPN_OK);
    assert_int_equal(ppn_engine_destroy(third), PPN_OK);
    assert_int_equal(ppn_model_free(same), PPN_OK);
    assert_int_equal(ppn_rt_destroy(rt2), PPN_OK);
}

/* A callback runs on the scheduler thread: ppn_engine_destroy there (it would join its own thread) and a poll that
 * may wait (for ids only that thread makes) are refused by name; a poll with timeout 0 is answered. The engine
 * carries on: the callback's request and a polled one get their one-at-a-time ids. */
typedef struct cbtry {
    rec r; /* on_event's record */
    ppn_engine *e;
    uint64_t other; /* a polled request */
    int tried;
    ppn_status destroy_st, wait_st, nowait_st;
    char destroy_msg[512], wait_msg[512];
} cbtry;

static void on_event_try(void *arg, const ppn_engine_event *ev)
{
    cbtry *t = arg;
    if (!t->tried) {
        int n, fin;
        t->tried = 1;
        t->destroy_st = ppn_engine_destroy(t->e);
        snprintf(t->destroy_msg, sizeof t->destroy_msg, "%s", ppn_last_error());
        t->wait_st = ppn_engine_poll(t->e, t->other, 50, NULL, 0, &n, &fin, NULL);
        snprintf(t->wait_msg, sizeof t->wait_msg, "%s", ppn_last_error());
        t->nowait_st = ppn_engine_poll(t->e, t->other, 0, NULL, 0, &n, &fin, NULL);
    }
    on_event(&t->r, ev);
}

static void test_engine_callback_refusals(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_engine *e = engine(m, 4, 0, 16);
    cbtry t = {.e = e};
    rec_init(&t.r);
    ppn_request q = greedy_req(2, NEW, NULL);
    q.cb = NULL;
    SUBMIT_OK(e, &q, &t.other);
    q = greedy_req(3, NEW, NULL);
    q.cb = on_event_try, q.cb_arg = &t;
    uint64_t id;
    SUBMIT_OK(e, &q, &id);
    rec_wait(&t.r);
    assert_true(t.tried);
    assert_int_equal(t.destroy_st, PPN_ESTATE);
    if (!strstr(t.destroy_msg, "ppn_engine_destroy: called from a callback")) fail_msg("destroy: %s", t.destroy_msg);
    assert_int_equal(t.wait_st, PPN_EINVAL);
    if (!strstr(t.wait_msg, "polls with timeout 0 only (it asked for 50 ms")) fail_msg("poll: %s", t.wait_msg);
    assert_int_equal(t.nowait_st, PPN_OK);
    check_ref(&t.r, 3, NEW);
    rec_fini(&t.r);
    poll_ref(e, t.other, 2);
    assert_int_equal(ppn_engine_destroy(e), PPN_OK);
    assert_int_equal(ppn_model_free(m), PPN_OK);
}

/* While an engine runs on a model its scheduler thread alone drives the model. Each call that would create, step,
 * wait, reset, truncate or destroy a sequence, publish a door or time the stages, made from another thread (here the
 * test's), is refused by name, PPN_ESTATE, before anything changes: a sequence made before the engine keeps its
 * position, the engine's request gets its one-at-a-time ids, and once the engine is destroyed that sequence is the
 * caller's again and decodes on from where it was. */
static void test_engine_owns_the_model(void **state)
{
    (void)state;
    ppn_model *m = load(128, 0);
    ppn_model_info mi;
    ppn_model_get_info(m, &mi);
    float *lg = malloc(sizeof(float) * (size_t)mi.vocab);
    assert_non_null(lg);
    ppn_seq *pre = NULL;
    assert_int_equal(ppn_seq_create(m, &pre), PPN_OK);
    assert_int_equal(ppn_prefill(pre, prompts[0], plen[0], NULL, lg), PPN_OK);
    assert_int_equal(argmax(lg, mi.vocab), ref[0][0]);
    ppn_engine *e = engine(m, 4, 0, 16);
    rec r;
    rec_init(&r);
    ppn_request q = greedy_req(1, NEW, &r);
    uint64_t id;
    SUBMIT_OK(e, &q, &id);
#define REFUSED(call, name) expect_refused((call), name ": an engine runs on this model")
    ppn_seq *s = pre; /* a value the refusal must clear */
    REFUSED(ppn_seq_create(m, &s), "ppn_seq_create");
    assert_null(s);
    const int tok = ref[0][0];
    ppn_step_id sid = 7;
    int ids[4], out[4], n_out = -1;
    REFUSED(ppn_decode_step(pre, tok, lg), "ppn_decode_step");
    REFUSED(ppn_decode_step_deferred(pre, tok, &sid), "ppn_decode_step");
    assert_int_equal(sid, 0);
    REFUSED(ppn_pending_wait(pre, 1, lg), "ppn_pending_wait");
    REFUSED(ppn_decode_greedy(pre, tok, 2, ids), "ppn_decode_greedy");
    REFUSED(ppn_decode_batch(&pre, &tok, 1, lg), "ppn_decode_batch");
    REFUSED(ppn_decode_batch_deferred(&pre, &tok, 1, NULL, lg, NULL, &sid), "ppn_decode_batch_deferred");
    REFUSED(ppn_decode_batch_greedy(&pre, &tok, 1, 2, NULL, ids), "ppn_decode_batch_greedy");
    REFUSED(ppn_decode_batch_wait(pre, 1), "ppn_decode_batch_wait");
    REFUSED(ppn_prefill(pre, prompts[1], 3, NULL, lg), "ppn_prefill");
    REFUSED(ppn_spec_verify(pre, tok, ref[0] + 1, 2, out, &n_out), "ppn_spec_verify");
    REFUSED(ppn_seq_truncate(pre, 0), "ppn_seq_truncate");
    REFUSED(ppn_seq_reset(pre), "ppn_seq_reset");
    REFUSED(ppn_seq_destroy(pre), "ppn_seq_destroy");
    ppn_door d = ppn_door_default();
    REFUSED(ppn_model_publish_door(m, &d), "ppn_model_publish_door");
    REFUSED(ppn_model_time_stages(m, 0), "ppn_model_time_stages");
#undef REFUSED
    assert_int_equal(ppn_seq_pos(pre), plen[0]); /* nothing moved */
    rec_wait(&r);
    check_ref(&r, 1, NEW); /* the engine carried on */
    rec_fini(&r);
    assert_int_equal(ppn_engine_destroy(e), PPN_OK);
    for (int t = 1; t < NEW; t++) { /* the caller's again, from where it was */
        assert_int_equal(ppn_decode_step(pre, ref[0][t - 1], lg), PPN_OK);
        assert_int_equal(argmax(lg, mi.vocab), ref[0][t]);
    }
    assert_int_equal(ppn_seq_destroy(pre), PPN_OK);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    free(lg);
}

/* Text in and out with a real tokenizer (a tiny random model with Llama 2's vocabulary): the streamed text is the
 * detokenized ids; a stop string ends the text before it; a chat request goes through the template; sampling
 * with a seed repeats. */
static void test_engine_text(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), args[1024], *out = NULL, *err = NULL;
    snprintf(args, sizeof args, "mkmodel --shape tiny --tokenizer %s --out %s", tu_fixture("tok/llama2"), dir);
    int rc = tu_run_ppn("", args, &out, &err, NULL);
    if (rc) fail_msg("ppn %s: exit %d: %s", args, rc, err);
    free(out), free(err);
    ppn_tokenizer *tok = NULL;
    ppn_template *tmpl = NULL;
    assert_int_equal(ppn_tokenizer_load(dir, &tok), PPN_OK);
    size_t tl = 0; /* the Llama 2 chat template beside it, with the config's special tokens */
    char *src = tu_read_file(tu_fixture("chat/llama2.jinja"), &tl), path[1024];
    assert_non_null(src);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    tu_write_file(path, src, tl);
    free(src);
    assert_int_equal(ppn_template_load(dir, &tmpl), PPN_OK);
    ppn_load_opts lo = ppn_load_opts_default();
    lo.ctx = 256;
    ppn_model *m = tu_model_load(rt, dir, &lo);
    ppn_engine_opts eo = ppn_engine_opts_default();
    eo.tok = tok, eo.tmpl = tmpl;
    ppn_engine *e = NULL;
    assert_int_equal(ppn_engine_create(m, &eo, &e), PPN_OK);

    rec r;
    rec_init(&r);
    uint64_t id;
    ppn_request q = ppn_request_default();
    q.text = "Once upon a time", q.add_special = 1, q.max_tokens = 24, q.ignore_eos = 1;
    q.cb = on_event, q.cb_arg = &r;
    SUBMIT_OK(e, &q, &id);
    rec_wait(&r);
    assert_int_equal(r.n, 24);
    char whole[4096];
    size_t wl = 0;
    assert_int_equal(ppn_detokenize(tok, r.ids, r.n, whole, sizeof whole, &wl), PPN_OK);
    assert_int_equal(wl, r.text_len);
    assert_memory_equal(whole, r.text, wl);
    /* stop string: a piece from the middle of that text */
    char stop[8] = {0};
    size_t at = wl / 2;
    while (at < wl && ((unsigned char)whole[at] & 0xC0) == 0x80) at++;
    memcpy(stop, whole + at, 3);
    int n_before = (int)(strstr(whole, stop) - whole);
    rec s;
    rec_init(&s);
    const char *stops[1] = {stop};
    q.cb_arg = &s, q.stop = stops, q.n_stop = 1;
    SUBMIT_OK(e, &q, &id);
    rec_wait(&s);
    assert_int_equal(s.finish, PPN_FINISH_STOP);
    assert_int_equal((int)s.text_len, n_before);
    assert_memory_equal(s.text, whole, s.text_len);
    rec_fini(&s);
    rec_fini(&r);

    /* chat, and seeded sampling twice */
    ppn_chat_msg msgs[1] = {{"user", "Hello there"}};
    rec c[2];
    for (int k = 0; k < 2; k++) {
        rec_init(&c[k]);
        q = ppn_request_default();
        q.msgs = msgs, q.n_msgs = 1, q.max_tokens = 10, q.ignore_eos = 1;
        q.temperature = 0.8f, q.top_k = 40, q.top_p = 0.9f, q.seed = 42;
        q.cb = on_event, q.cb_arg = &c[k];
        SUBMIT_OK(e, &q, &id);
    }
    for (int k = 0; k < 2; k++) rec_wait(&c[k]), assert_int_equal(c[k].n, 10);
    assert_memory_equal(c[0].ids, c[1].ids, sizeof(int) * 10);
    for (int k = 0; k < 2; k++) rec_fini(&c[k]);
    /* one engine a model: its scheduler thread uses the model alone */
    ppn_engine *other = (ppn_engine *)dir;
    expect_refused(ppn_engine_create(m, &eo, &other), "the model has an engine already");
    assert_null(other);
    expect_refused(ppn_model_free(m), "an engine runs on this model"); /* nor is the model freed under it */
    ppn_engine_destroy(e);

    /* A decoder that holds all its text until the flush (after the Fuse, a Replace of several characters: never
     * matched here, so the text is the same): the stop string comes out only at the finish, and still ends the
     * text before it, finish STOP. */
    char *dir2 = tu_tmpdir(), *tj = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_non_null(tj = tu_read_file(path, &tl));
    char *fuse = strstr(tj, "\"type\": \"Fuse\"");
    assert_non_null(fuse);
    char *after = strchr(fuse, '}') + 1;
    static const char more[] =
        ", {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u0001\\u0002\"}, \"content\": \"?\"}";
    snprintf(path, sizeof path, "%s/tokenizer.json", dir2);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(tj, 1, (size_t)(after - tj), f), (size_t)(after - tj));
    assert_int_equal(fwrite(more, 1, sizeof more - 1, f), sizeof more - 1);
    assert_int_equal(fwrite(after, 1, tl - (size_t)(after - tj), f), tl - (size_t)(after - tj));
    assert_int_equal(fclose(f), 0);
    free(tj);
    ppn_tokenizer *tok2 = NULL;
    assert_int_equal(ppn_tokenizer_load(dir2, &tok2), PPN_OK);
    ppn_engine_opts eo2 = ppn_engine_opts_default();
    eo2.tok = tok2;
    ppn_engine *e2 = NULL;
    assert_int_equal(ppn_engine_create(m, &eo2, &e2), PPN_OK); /* the first one destroyed */
    for (int with_stop = 0; with_stop < 2; with_stop++) {
        rec_init(&s);
        q = ppn_request_default();
        q.text = "Once upon a time", q.add_special = 1, q.max_tokens = 24, q.ignore_eos = 1;
        q.cb = on_event, q.cb_arg = &s, q.stop = stops, q.n_stop = with_stop;
        SUBMIT_OK(e2, &q, &id);
        rec_wait(&s);
        assert_int_equal(s.n, 24); /* every id was generated: the text was held */
        assert_int_equal(s.finish, with_stop ? PPN_FINISH_STOP : PPN_FINISH_LENGTH);
        assert_int_equal((int)s.text_len, with_stop ? n_before : (int)wl);
        assert_memory_equal(s.text, whole, s.text_len);
        rec_fini(&s);
    }
    ppn_engine_destroy(e2);
    ppn_tokenizer_free(tok2);
    tu_rmrf(dir2);
    free(dir2);
    assert_int_equal(ppn_model_free(m), PPN_OK);
    ppn_template_free(tmpl);
    ppn_tokenizer_free(tok);
    tu_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_concurrent_equals_alone),
        cmocka_unit_test(test_engine_concurrent_separate),
        cmocka_unit_test(test_engine_concurrent_step_rows),
        cmocka_unit_test(test_engine_busy_exact_when_idle),
        cmocka_unit_test(test_engine_threads),
        cmocka_unit_test(test_engine_cancel_stop_length),
        cmocka_unit_test(test_engine_kv_exhaustion_and_refusals),
        cmocka_unit_test(test_engine_queue_poll_destroy),
        cmocka_unit_test(test_engine_owns_the_model),
        cmocka_unit_test(test_engine_two_runtimes),
        cmocka_unit_test(test_engine_callback_refusals),
        cmocka_unit_test(test_engine_text),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
