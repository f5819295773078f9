/* err.c - thread-local error messages behind ppn_last_error(). */
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include "core/base/err.h"

static _Thread_local char last_msg[PPN_ERR_MSG_CAP];

ppn_status ppn_err(ppn_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return st;
}

ppn_status ppn_err_ctx(ppn_status st, const char *fmt, ...)
{
    char prefix[512], old[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_msg, sizeof old);
    size_t k = strlen(prefix);
    if (k > sizeof last_msg - 3) k = sizeof last_msg - 3;
    memcpy(last_msg, prefix, k);
    memcpy(last_msg + k, ": ", 2);
    size_t room = sizeof last_msg - k - 3;
    size_t o = strnlen(old, room);
    memcpy(last_msg + k + 2, old, o);
    last_msg[k + 2 + o] = '\0';
    return st;
}

void ppn_err_clear(void) { last_msg[0] = '\0'; }

void ppn_err_first_add(ppn_err_first *f, ppn_status st)
{
    if (st == PPN_OK || f->st != PPN_OK) return;
    f->st = st;
    memcpy(f->msg, last_msg, sizeof f->msg);
}

ppn_status ppn_err_first_done(const ppn_err_first *f)
{
    if (f->st != PPN_OK) memcpy(last_msg, f->msg, sizeof last_msg);
    return f->st;
}

/* Set by ppn_gpu_open from PPN_TRACE (every runtime opens its device first, and a bad value is refused there):
 * this floor reads no environment itself, so the environment table can report through it. */
static _Atomic int trace_enabled;

void ppn_trace_enable(int on) { atomic_store_explicit(&trace_enabled, on != 0, memory_order_relaxed); }

void ppn_trace(const char *fmt, ...)
{
    if (!atomic_load_explicit(&trace_enabled, memory_order_relaxed)) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("ppn trace: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

const char *ppn_last_error(void) { return last_msg; }

#define PPN_STR_(x) #x
#define PPN_STR(x) PPN_STR_(x)
const char *ppn_version(void)
{
    return PPN_STR(PPN_VERSION_MAJOR) "." PPN_STR(PPN_VERSION_MINOR) "." PPN_STR(PPN_VERSION_PATCH);
}

const char *ppn_status_name(ppn_status st)
{
    static const char *const names[] = {
        [PPN_OK] = "PPN_OK",
        [PPN_EINVAL] = "PPN_EINVAL",
        [PPN_ENOMEM] = "PPN_ENOMEM",
        [PPN_EIO] = "PPN_EIO",
        [PPN_EFORMAT] = "PPN_EFORMAT",
        [PPN_EUNSUPPORTED] = "PPN_EUNSUPPORTED",
        [PPN_ENODEV] = "PPN_ENODEV",
        [PPN_EDRIVER] = "PPN_EDRIVER",
        [PPN_ENOKERNELS] = "PPN_ENOKERNELS",
        [PPN_ERACE] = "PPN_ERACE",
        [PPN_EPLACEMENT] = "PPN_EPLACEMENT",
        [PPN_EUSEAFTERFREE] = "PPN_EUSEAFTERFREE",
        [PPN_EDOUBLEFREE] = "PPN_EDOUBLEFREE",
        [PPN_EBOUNDS] = "PPN_EBOUNDS",
        [PPN_EREFUSED] = "PPN_EREFUSED",
        [PPN_EMISMATCH] = "PPN_EMISMATCH",
        [PPN_ESTATE] = "PPN_ESTATE",
        [PPN_EBUSY] = "PPN_EBUSY",
        [PPN_ENONFINITE] = "PPN_ENONFINITE",
    };
    if ((unsigned)st < PPN_ARRAY_LEN(names) && names[st]) return names[st];
    return "PPN_E?";
}
