/* err.h - internal error plumbing: set the thread's message and return a status; checked-call macros. */
#ifndef PPN_ERR_H
#define PPN_ERR_H

#include <stdio.h>
#include <stdlib.h>
#include "ppn.h"

/* Record a formatted message for ppn_last_error() and return st. */
ppn_status ppn_err(ppn_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefix the current message with context ("while loading x: <old message>"); returns st. */
ppn_status ppn_err_ctx(ppn_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ppn_err_clear(void);

/* The first failure of a teardown that carries on past failures (issue 14's rule for free and destroy paths:
 * release everything, return the first failure), with its message: a later failure overwrites the thread's
 * message, ppn_err_first_done puts the first one's back. Zero-initialise; one per function, so nested teardowns
 * each keep their own. */
#define PPN_ERR_MSG_CAP 1024
typedef struct ppn_err_first {
    ppn_status st;
    char msg[PPN_ERR_MSG_CAP];
} ppn_err_first;
/* Note st (PPN_OK: nothing); only the first failure is kept. */
void ppn_err_first_add(ppn_err_first *f, ppn_status st);
/* The kept failure (PPN_OK if none), its message the thread's again. */
ppn_status ppn_err_first_done(const ppn_err_first *f);
/* With PPN_TRACE=1, print "ppn trace: <msg>" on stderr (phases of load and step; for field diagnosis). */
void ppn_trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Turn the trace on or off (ppn_gpu_open, from PPN_TRACE). */
void ppn_trace_enable(int on);

/* Propagate a failing status unchanged (the callee already set the message). */
#define PPN_CHECK(call)                                   \
    do {                                                  \
        ppn_status st_ = (call);                          \
        if (st_ != PPN_OK) return st_;                    \
    } while (0)

/* Store the failing status in st and jump to the function's one cleanup label. */
#define PPN_CHECK_GOTO(call, st, label)                   \
    do {                                                  \
        (st) = (call);                                    \
        if ((st) != PPN_OK) goto label;                   \
    } while (0)

/* Invariants: a bug in ppn aborts with the site; bad input never reaches here. */
#define PPN_ASSERT(cond)                                                              \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "ppn: internal assertion failed: %s at %s:%d\n", #cond,   \
                    __FILE__, __LINE__);                                              \
            abort();                                                                  \
        }                                                                             \
    } while (0)

#define PPN_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#endif
