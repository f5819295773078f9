/* model.c - what every part of a loaded model shares: a stream per device (loads, frees, the unsplit walk), the
 * sticky failure a stage thread leaves for the caller, and the drain of every command handed to the threads. */
#include <stdio.h>
#include <string.h>
#include "core/rt.h"
#include "core/base/err.h"

ppn_status ppn_model_dev_stream(ppn_model *m, int dev, ppn_gstream **out)
{
    if (!m->dev_stream[dev]) PPN_CHECK(m->rt->g->ops->stream_create(m->rt->g, dev, &m->dev_stream[dev]));
    *out = m->dev_stream[dev];
    return PPN_OK;
}

void ppn_model_fail(ppn_model *m, ppn_status st)
{
    int expected = PPN_OK;
    /* the message is written before the status is published (release); readers acquire the status */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (atomic_load_explicit(&m->err, memory_order_relaxed) == PPN_OK) {
        snprintf(m->err_msg, sizeof m->err_msg, "%s", ppn_last_error());
        atomic_compare_exchange_strong_explicit(&m->err, &expected, (int)st, memory_order_release,
                                                memory_order_relaxed);
    }
    pthread_mutex_unlock(&mu);
}

/* The model whose engine's scheduler thread this thread is (NULL: none). */
static _Thread_local const ppn_model *sched_of;

void ppn_model_engine_thread(const ppn_model *m) { sched_of = m; }

int ppn_model_on_engine_thread(const ppn_model *m) { return sched_of == m; }

ppn_status ppn_model_caller(ppn_model *m, const char *op)
{
    int e = atomic_load_explicit(&m->engine_on, memory_order_acquire);
    if (e == PPN_ENGINE_NONE && atomic_load_explicit(&m->rt->engine_on, memory_order_acquire))
        return ppn_err(PPN_ESTATE, "%s: an engine runs on another model of this model's runtime, whose models are "
                       "driven from one thread at a time: give this model a runtime of its own, or destroy the engine "
                       "first", op);
    if (e != PPN_ENGINE_RUNS || sched_of == m) return PPN_OK;
    return ppn_err(PPN_ESTATE, "%s: an engine runs on this model, and its scheduler thread alone creates, steps and "
                   "destroys the model's sequences: submit requests to the engine, or ppn_engine_destroy it first", op);
}

ppn_status ppn_model_failed(ppn_model *m)
{
    int st = atomic_load_explicit(&m->err, memory_order_acquire);
    if (st == PPN_OK) return PPN_OK;
    return ppn_err((ppn_status)st, "model unusable after an earlier failure: %s", m->err_msg);
}

/* Every command handed to a stage thread has finished. */
ppn_status ppn_model_drain(ppn_model *m)
{
    const ppn_stage_map *map = m->map;
    if (!map) return PPN_OK;
    for (int s = 0; s < PPN_MAX_STAGES; s++) {
        ppn_stage_rt *sr = &m->stages[s];
        if (!sr->thr_started) continue;
        for (int k = 0; k < PPN_CMD_RING; k++) {
            if (!sr->cmds[k].used) continue;
            ppn_gen_wait(&sr->cmds[k].cmd.done, sr->cmds[k].cmd.seqno + 1, map->door.spin);
            m->rt->g->ops->host_acquire(m->rt->g, &sr->cmds[k].cmd.done); /* the sim checker's view of it */
        }
    }
    return PPN_OK;
}

/* ppn.h: the hand-off of a model between caller threads (the engine's too: its scheduler thread's start and join),
 * gpu.h's host_release / host_acquire under the caller's key. */
ppn_status ppn_model_handoff_release(ppn_model *m, const void *key)
{
    if (!m || !key) return ppn_err(PPN_EINVAL, "ppn_model_handoff_release: %s is NULL", !m ? "model" : "key");
    m->rt->g->ops->host_release(m->rt->g, key);
    return PPN_OK;
}

ppn_status ppn_model_handoff_acquire(ppn_model *m, const void *key)
{
    if (!m || !key) return ppn_err(PPN_EINVAL, "ppn_model_handoff_acquire: %s is NULL", !m ? "model" : "key");
    m->rt->g->ops->host_acquire(m->rt->g, key);
    return PPN_OK;
}

int ppn_layer_stage(const ppn_stage_map *map, int l)
{
    for (int s = 0; s < map->n_stages; s++)
        if (l >= map->fence[s] && l < map->fence[s + 1]) return s;
    PPN_ASSERT(!"layer outside the fence");
    return -1;
}

ppn_status ppn_model_block_alloc(ppn_model *m, int dev, size_t n, const char *tag, ppn_dptr *out)
{
    ppn_pool *pool;
    ppn_gstream *s;
    PPN_CHECK(ppn_rt_pool(m->rt, dev, &pool));
    PPN_CHECK(ppn_model_dev_stream(m, dev, &s));
    return ppn_pool_alloc(pool, n, s, tag, out);
}

ppn_status ppn_model_block_free(ppn_model *m, int dev, ppn_dptr *p)
{
    ppn_pool *pool;
    ppn_gstream *s;
    if (!*p) return PPN_OK;
    ppn_status st = ppn_rt_pool(m->rt, dev, &pool);
    if (st == PPN_OK) st = ppn_model_dev_stream(m, dev, &s);
    if (st == PPN_OK) st = ppn_pool_free(pool, *p, s); /* a failed record retires the block: reported */
    *p = 0;
    return st;
}
