/* tcheck.h - status checks for cmocka tests that name the call, the status and ppn's message on failure.
 * Include after <cmocka.h>. */
#ifndef PPN_TCHECK_H
#define PPN_TCHECK_H

#include <string.h>
#include "ppn.h"

/* call must return want */
#define EXPECT_ST(want, call)                                                                       \
    do {                                                                                            \
        ppn_status st_ = (call);                                                                    \
        if (st_ != (want))                                                                          \
            fail_msg("%s -> %s (wanted %s): %s", #call, ppn_status_name(st_), ppn_status_name(want), \
                     ppn_last_error());                                                             \
    } while (0)

/* the last error message contains s */
#define MSG_HAS(s)                                                                                  \
    do {                                                                                            \
        if (!strstr(ppn_last_error(), (s))) fail_msg("message lacks '%s': %s", (s), ppn_last_error()); \
    } while (0)

#endif
