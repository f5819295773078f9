/* tcheck.h - status checks for cmocka tests that name the call, the status and ppn's message on failure.
 * Include after <cmocka.h>. */
#ifndef PPN_TCHECK_H
#define PPN_TCHECK_H

#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "ppn.h"

/* call must return want */
#define EXPECT_ST(want, call)                                                                       \
    do {                                                                                            \
        ppn_status st_ = (call);                                                                    \
        if (st_ != (want))                                                                          \
            fail_msg("%s -> %s (wanted %s): %s", #call, ppn_status_name(st_), ppn_status_name(want), \
                     ppn_last_error());                                                             \
    } while (0)

/* call must return PPN_OK */
#define EXPECT_OK(call) EXPECT_ST(PPN_OK, call)

/* the last error message contains s */
#define MSG_HAS(s)                                                                                  \
    do {                                                                                            \
        if (!strstr(ppn_last_error(), (s))) fail_msg("message lacks '%s': %s", (s), ppn_last_error()); \
    } while (0)

/* The ppn binary under test (ctest sets PPN_BIN). */
static inline const char *bin(void)
{
    const char *b = getenv("PPN_BIN");
    if (!b || !*b) fail_msg("PPN_BIN is not set (ctest sets it to the ppn binary)");
    return b;
}

/* A number field of a JSON object; fails the test when it is missing or not a number. */
static inline double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) fail_msg("JSON field '%s' is missing or not a number", key);
    return json_number_value(v);
}

#endif
