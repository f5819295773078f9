/* env.h - every environment variable ppn reads, in one table (env.c): name, kind, range, default, who reads it
 * and what it does. `ppn env` prints the table and checks what is set.
 *
 * The getters read the variable when they are called and parse it then: nothing is cached, because the door
 * is read per call on purpose (the gates toggle it in-process). An empty value is unset. An invalid value is
 * refused with PPN_EINVAL and a message naming the variable, the value and the rule ("PPN_PDL='x': must be 0
 * or 1"). A name that is not in the table, or a getter of the wrong kind, is a bug in ppn (PPN_ASSERT).
 * No other file of ppn calls getenv: tests/test_env.c scans the tree for it. */
#ifndef PPN_ENV_H
#define PPN_ENV_H

#include <stddef.h>
#include "ppn.h"

typedef enum ppn_env_kind {
    PPN_ENV_FLAG, /* "0" or "1" */
    PPN_ENV_INT,  /* a whole number (digits only: no sign, space or junk) in [min, max] */
    PPN_ENV_SIZE, /* a whole number of bytes with an optional K, M, G or T suffix (binary), in [min, max] */
    PPN_ENV_ENUM, /* one of words; the getter gives the word's index */
    PPN_ENV_INTS, /* comma-separated whole numbers (each at most INT_MAX), at most max of them */
    PPN_ENV_TEXT, /* free text, or a list whose reader checks it (syntax says what the reader accepts) */
} ppn_env_kind;

/* Who reads a variable. */
typedef enum ppn_env_area {
    PPN_ENV_DOOR,   /* core/door.c: how the model is cut into stages */
    PPN_ENV_DEVICE, /* core/device: backend choice and the cuda backend */
    PPN_ENV_SIM,    /* core/device/gpu_sim.c: the simulated devices */
    PPN_ENV_SCHED,  /* core/stagemap.c: transports and issue threads of a stage map */
    PPN_ENV_DIAG,   /* diagnostics: traces and the kernel profile */
    PPN_ENV_CLI,    /* the ppn command line only */
} ppn_env_area;

typedef struct ppn_env_var {
    const char *name;
    ppn_env_kind kind;
    ppn_env_area area;
    int gated;                /* read only while the door is open (MEMRA_PP_STAGES >= 2); ignored when shut */
    long long min, max;       /* INT, SIZE: the range; INTS: max is the most elements */
    const char *const *words; /* ENUM: the allowed words, NULL-terminated */
    const char *def;          /* FLAG, INT, SIZE, ENUM: the value unset stands for, in the variable's syntax (the
                               * getters parse it); NULL where unset is no value (the getter leaves *out alone).
                               * INTS, TEXT: what unset means, in words, for printing */
    const char *syntax;       /* TEXT: what its reader accepts (the other kinds derive their rule) */
    const char *doc;          /* one line: what it does */
} ppn_env_var;

/* The table, in the order `ppn env` prints it: ppn_env_at(i) for i in [0, ppn_env_count()). */
int ppn_env_count(void);
const ppn_env_var *ppn_env_at(int i);
/* The entry of name, or NULL when the table has none (for the CLI; the getters assert instead). */
const ppn_env_var *ppn_env_find(const char *name);
/* "door", "device", "sim", "sched", "diagnostics", "cli". */
const char *ppn_env_area_name(ppn_env_area a);
/* The rule a value must follow, as messages print it after "must be" ("0 or 1", "near, far or none"), into
 * buf of cap bytes (256 hold every rule of the table); returns buf. */
const char *ppn_env_rule(const ppn_env_var *v, char *buf, size_t cap);

/* The typed getters. Unset or empty: *out = the table's default.
 * @return PPN_OK, PPN_EINVAL (the value breaks the rule: named with the value and the rule; *out untouched). */
ppn_status ppn_env_flag(const char *name, int *out);
/* Unset or empty with no default in the table (def NULL): *out is left as it was. */
ppn_status ppn_env_int(const char *name, int *out);
ppn_status ppn_env_size(const char *name, size_t *out);
/* *out = the index of the word in the entry's words (PPN_PIN: near 0, far 1, none 2). */
ppn_status ppn_env_enum(const char *name, int *out);
/* The numbers into out[0..*n), out holding cap >= the entry's max; unset or empty: *n = 0. */
ppn_status ppn_env_ints(const char *name, int *out, int cap, int *n);
/* The raw value, NULL when unset or empty; it checks nothing. For TEXT variables, whose reader checks them,
 * and for a reader that quotes a value in a message or shares its check with another source of the same
 * words (PPN_BACKEND and ppn_rt_create's backend argument). @return PPN_OK. */
ppn_status ppn_env_str(const char *name, const char **out);

/* The rule of variable name applied to text from elsewhere (a CLI flag that spells the variable: --stages for
 * MEMRA_PP_STAGES), refused under the name as. text must not be NULL; an empty text is refused.
 * @return PPN_OK, PPN_EINVAL (named as, with the text and the rule; outputs untouched). */
ppn_status ppn_env_parse_flag(const char *name, const char *as, const char *text, int *out);
ppn_status ppn_env_parse_int(const char *name, const char *as, const char *text, int *out);
ppn_status ppn_env_parse_ints(const char *name, const char *as, const char *text, int *out, int cap, int *n);

/* 1 when v is gated and the door is shut (MEMRA_PP_STAGES unset, 0, 1 or invalid): its value is not read. */
int ppn_env_ignored(const ppn_env_var *v);
/* v's current value against its rule. Unset, empty, ignored (gated, door shut) and TEXT values pass: a TEXT
 * reader checks its own syntax when it reads it.
 * @return PPN_OK, PPN_EINVAL (as the getter of v's kind would). */
ppn_status ppn_env_check(const ppn_env_var *v);
/* Every variable of the table, in table order; stops at the first invalid one.
 * @return PPN_OK, PPN_EINVAL (the first variable set in the environment that breaks its rule, named). */
ppn_status ppn_env_check_all(void);

#endif
