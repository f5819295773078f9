/* issue.c - per-stage issue threads (see issue.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setname_np */
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <urcu/urcu-qsbr.h>
#include "sched/issue.h"
#include "core/base/err.h"

static void futex_wait(_Atomic uint32_t *w, uint32_t seen)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) { __builtin_ia32_pause(); }

static int reached(uint32_t have, uint32_t want) { return (int32_t)(have - want) >= 0; }

void ppn_gen_wait(_Atomic uint32_t *w, uint32_t want, int spin)
{
    uint32_t v;
    /* acquire pairs with the release in ppn_gen_post(): what the poster did before posting is visible */
    while (!reached(v = atomic_load_explicit(w, memory_order_acquire), want)) {
        if (spin) cpu_relax();
        else futex_wait(w, v);
    }
}

void ppn_gen_post(_Atomic uint32_t *w, uint32_t v)
{
    atomic_store_explicit(w, v, memory_order_release);
    futex_wake_all(w);
}

void ppn_issue_done(ppn_cmd *c) { ppn_gen_post(&c->done, c->seqno + 1); }

/* Sleep (offline for RCU) until the queue has work or the thread is told to stop. */
static struct cds_wfcq_node *next_cmd(ppn_issue_thread *t)
{
    struct cds_wfcq_node *n = __cds_wfcq_dequeue_nonblocking(&t->head, &t->tail);
    if (n && n != CDS_WFCQ_WOULDBLOCK) return n;
    urcu_qsbr_thread_offline();
    for (;;) {
        uint32_t seen = atomic_load_explicit(&t->wake, memory_order_acquire);
        n = __cds_wfcq_dequeue_nonblocking(&t->head, &t->tail);
        if (n && n != CDS_WFCQ_WOULDBLOCK) break;
        if (atomic_load_explicit(&t->stop, memory_order_acquire)) {
            n = NULL;
            break;
        }
        if (t->spin) cpu_relax();
        else futex_wait(&t->wake, seen);
    }
    urcu_qsbr_thread_online();
    return n;
}

/* Take the place repin (or start) left, once per generation: name, then CPU and memory binding. */
static void apply_place(ppn_issue_thread *t)
{
    /* acquire pairs with the release in set_place(): the fields written before the bump are visible */
    uint32_t gen = atomic_load_explicit(&t->place_gen, memory_order_acquire);
    if (gen == t->applied_gen) return;
    t->applied_gen = gen;
    int stage = atomic_load_explicit(&t->stage, memory_order_relaxed);
    int dev = atomic_load_explicit(&t->dev, memory_order_relaxed);
    int pu = atomic_load_explicit(&t->pu, memory_order_relaxed);
    int node = atomic_load_explicit(&t->node, memory_order_relaxed);
    char name[16]; /* the kernel keeps 15 characters and the NUL */
    snprintf(name, sizeof name, "ppn-s%d-dev%d", stage, dev);
    pthread_setname_np(pthread_self(), name); /* before the binding: its notices name the thread */
    if (!t->topo || (pu < 0 && node < 0 && !t->bound)) return; /* unpinned from birth: keeps the creator's mask */
    t->bound = pu >= 0 || node >= 0;
    ppn_status st = ppn_topo_bind_self(t->topo, pu, node);
    if (st == PPN_EIO) /* pinned, memory not bound: a node this machine lacks (PPN_TOPO_XML) */
        fprintf(stderr, "ppn: notice: %s: %s\n", name, ppn_last_error());
    else if (st != PPN_OK)
        fprintf(stderr, "ppn: warning: %s: %s (issue thread stays where it is)\n", name, ppn_last_error());
    int got = -1;
    if (ppn_topo_self_mem_node(t->topo, &got) != PPN_OK) got = -1;
    atomic_store_explicit(&t->mem_node, got, memory_order_relaxed); /* published by ready / the next command */
}

static void *issue_main(void *arg)
{
    ppn_issue_thread *t = arg;
    urcu_qsbr_register_thread();
    atomic_store_explicit(&t->tid, (int)syscall(SYS_gettid), memory_order_relaxed);
    atomic_store_explicit(&t->mem_node, -1, memory_order_relaxed);
    apply_place(t);
    ppn_gen_post(&t->ready, 1); /* pairs with the wait in ppn_issue_start(): tid and the place are set */
    for (;;) {
        struct cds_wfcq_node *n = next_cmd(t);
        if (!n) break;
        apply_place(t); /* a repin while the thread slept is taken before the command it was woken for */
        ppn_cmd *c = caa_container_of(n, ppn_cmd, node);
        /* acquire pairs with the release in ppn_issue_post(): the command's fields are visible. The queue's own
         * barriers already order them; this pair states it in C11 terms (and lets TSan see it). */
        uint32_t posted = atomic_load_explicit(&c->posted, memory_order_acquire);
        PPN_ASSERT(posted == c->seqno + 1);
        t->fn(t->ctx, c);
        urcu_qsbr_quiescent_state(); /* nothing of the old map is held between commands */
    }
    urcu_qsbr_unregister_thread();
    return NULL;
}

static void set_place(ppn_issue_thread *t, const ppn_issue_place *pl)
{
    atomic_store_explicit(&t->stage, pl->stage, memory_order_relaxed);
    atomic_store_explicit(&t->dev, pl->dev, memory_order_relaxed);
    atomic_store_explicit(&t->pu, pl->pu, memory_order_relaxed);
    atomic_store_explicit(&t->node, pl->node, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->place_gen, 1, memory_order_release); /* pairs with apply_place()'s acquire */
}

ppn_status ppn_issue_start(ppn_issue_thread *t, ppn_issue_fn fn, void *ctx, ppn_topo *topo,
                           const ppn_issue_place *pl, int spin)
{
    memset(t, 0, sizeof *t);
    cds_wfcq_init(&t->head, &t->tail);
    t->fn = fn;
    t->ctx = ctx;
    t->topo = topo;
    t->spin = spin;
    set_place(t, pl);
    int rc = pthread_create(&t->th, NULL, issue_main, t);
    if (rc != 0) return ppn_err(PPN_ENOMEM, "issue thread: pthread_create failed: %s", strerror(rc));
    t->started = 1;
    ppn_gen_wait(&t->ready, 1, 0);
    return PPN_OK;
}

void ppn_issue_post(ppn_issue_thread *t, ppn_cmd *c)
{
    atomic_store_explicit(&c->posted, c->seqno + 1, memory_order_release);
    cds_wfcq_node_init(&c->node);
    cds_wfcq_enqueue(&t->head, &t->tail, &c->node);
    atomic_fetch_add_explicit(&t->wake, 1, memory_order_release);
    if (!t->spin) futex_wake_all(&t->wake);
}

void ppn_issue_stop(ppn_issue_thread *t)
{
    if (!t->started) return;
    atomic_store_explicit(&t->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&t->wake, 1, memory_order_release);
    futex_wake_all(&t->wake);
    pthread_join(t->th, NULL);
    cds_wfcq_destroy(&t->head, &t->tail);
    t->started = 0;
}

void ppn_issue_repin(ppn_issue_thread *t, const ppn_issue_place *pl)
{
    char name[16];
    set_place(t, pl);
    snprintf(name, sizeof name, "ppn-s%d-dev%d", pl->stage, pl->dev);
    pthread_setname_np(t->th, name); /* at once, for reports before its next command (it renames itself too) */
}

int ppn_issue_tid(ppn_issue_thread *t) { return atomic_load_explicit(&t->tid, memory_order_relaxed); }

int ppn_issue_mem_node(ppn_issue_thread *t) { return atomic_load_explicit(&t->mem_node, memory_order_relaxed); }

void ppn_issue_name(ppn_issue_thread *t, char *buf, size_t cap)
{
    char name[16];
    if (!cap) return;
    buf[0] = '\0';
    if (t->started && pthread_getname_np(t->th, name, sizeof name) == 0) snprintf(buf, cap, "%s", name);
}
