/* issue.h - one host issue thread per pipeline stage, fed through a lock-free queue (liburcu wfcqueue),
 * and the generation words the stages use to wait for each other on the host.
 *
 * Placement: each thread is named ppn-s<stage>-dev<device> (pthread_setname_np: ps -L, top -H), pinned to one PU
 * and its memory bound to one NUMA node (ppn_topo_bind_self), as its ppn_issue_place says; a new place (a new
 * stage map) is applied before the next command the thread runs.
 *
 * Commands are preallocated by the caller (no malloc per step); a command is handed to exactly one thread
 * and handed back by ppn_issue_done(): its done word then holds the command's sequence number + 1.
 * Threads are liburcu QSBR readers: online while they run a command, offline while they sleep, and they
 * report a quiescent state after every command, so a stage map can be freed after synchronize_rcu().
 *
 * Waiting: PPN_SPIN=1 busy-polls (DPDK style); otherwise threads sleep on a futex of the 32-bit word.
 */
#ifndef PPN_ISSUE_H
#define PPN_ISSUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <urcu/wfcqueue.h>
#include "sched/topo.h"

typedef struct ppn_cmd {
    struct cds_wfcq_node node;
    uint32_t seqno;           /* caller's sequence number of this use of the command */
    _Atomic uint32_t posted;  /* seqno + 1 once the caller filled it (release, in ppn_issue_post) */
    _Atomic uint32_t done;    /* seqno + 1 once the thread finished it (release) */
    void *arg;                /* the caller's payload */
} ppn_cmd;

typedef void (*ppn_issue_fn)(void *ctx, ppn_cmd *c);

/* Where a stage's issue thread runs: its name's stage and device, its PU (-1: unpinned), its memory node (-1:
 * the default policy). */
typedef struct ppn_issue_place {
    int stage, dev, pu, node;
} ppn_issue_place;

typedef struct ppn_issue_thread {
    /* Hot, written by the caller on every post: on its own cache line. */
    _Alignas(64) struct cds_wfcq_head head;
    struct cds_wfcq_tail tail;
    _Atomic uint32_t wake;    /* futex word: bumped by every post and by stop */
    /* Set before start, read-only afterwards (the place changes only while the thread is idle, via repin). */
    _Alignas(64) pthread_t th;
    ppn_issue_fn fn;
    void *ctx;
    int spin;
    _Atomic int stage, dev, pu, node; /* the place to take (ppn_issue_place): applied before the next command */
    _Atomic uint32_t place_gen;       /* bumped by repin after the fields above (release) */
    uint32_t applied_gen;             /* thread-private: the place generation it took */
    int bound;                        /* thread-private: a binding was applied (a later -1 must undo it) */
    _Atomic int tid;                  /* the thread's kernel id (gettid), 0 until it runs */
    _Atomic uint32_t ready;           /* 1 once tid is set and the first place taken (ppn_issue_start waits) */
    _Atomic int mem_node;             /* its memory binding as the OS said after the last place (-1: none) */
    ppn_topo *topo;
    _Atomic int stop;
    int started;
} ppn_issue_thread;

/* Start a thread that runs fn(ctx, cmd) for every posted command, in order, placed as pl says (topo NULL: not
 * pinned, only named); it returns once the thread is named and has taken its place. Returns PPN_OK, PPN_ENOMEM (pthread_create failed: message has the error). */
ppn_status ppn_issue_start(ppn_issue_thread *t, ppn_issue_fn fn, void *ctx, ppn_topo *topo,
                           const ppn_issue_place *pl, int spin);
/* Hand c to the thread (any thread may post; commands run in post order per poster). */
void ppn_issue_post(ppn_issue_thread *t, ppn_cmd *c);
/* Finish: process what is queued, then join. */
void ppn_issue_stop(ppn_issue_thread *t);
/* Move (and rename) the thread before its next command; call it while the thread is idle. */
void ppn_issue_repin(ppn_issue_thread *t, const ppn_issue_place *pl);
/* The thread's kernel id (0 before it started running). */
int ppn_issue_tid(ppn_issue_thread *t);
/* The node its memory is bound to, as the thread read it back from the OS after taking its place (only the
 * thread itself can ask the kernel); -1: the default policy, several nodes, or no topology. */
int ppn_issue_mem_node(ppn_issue_thread *t);
/* The thread's name as the kernel holds it (pthread_getname_np); "" when it cannot be read. */
void ppn_issue_name(ppn_issue_thread *t, char *buf, size_t cap);

/* Generation words: wait until (int32)(*w - want) >= 0, i.e. *w has reached want (wrap-safe). */
void ppn_gen_wait(_Atomic uint32_t *w, uint32_t want, int spin);
/* Store v with release order and wake every waiter. Pairs with the acquire in ppn_gen_wait(). */
void ppn_gen_post(_Atomic uint32_t *w, uint32_t v);
/* Mark c done (its done word = seqno + 1). */
void ppn_issue_done(ppn_cmd *c);

#endif
