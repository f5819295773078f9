/* cli.c - shared helpers of the ppn subcommands. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "tools/cli.h"
#include "core/base/env.h"
#include "core/base/err.h"

/* A message is one line whatever it quotes: control characters (a value given as $'1\n2', a file name with
 * an escape sequence) are written escaped, \n \t \r or \xNN. Every error of the CLI goes through here. */
static void put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
}

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    char *msg = NULL;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    fputs("ppn: error: ", stderr);
    if (n >= 0) put_escaped(stderr, msg);
    else fputs("(out of memory formatting the message)", stderr);
    fputc('\n', stderr);
    free(msg);
    return 1;
}

int cli_fail_status(ppn_status st, const char *what)
{
    return cli_fail("%s: %s (%s)", what, ppn_last_error(), ppn_status_name(st));
}

/* A teardown's status folded into the exit status rc: printed when it failed, rc 0 made 1. */
static int teardown_rc(ppn_status st, const char *what, int rc)
{
    if (st == PPN_OK) return rc;
    int r2 = cli_fail_status(st, what);
    return rc ? rc : r2;
}

int cli_seq_destroy(ppn_seq *q, int rc) { return teardown_rc(ppn_seq_destroy(q), "sequence teardown", rc); }
int cli_model_free(ppn_model *m, int rc) { return teardown_rc(ppn_model_free(m), "model teardown", rc); }
int cli_rt_destroy(ppn_rt *rt, int rc) { return teardown_rc(ppn_rt_destroy(rt), "runtime teardown", rc); }

ppn_status cli_seq_destroy_after(ppn_seq *q, ppn_status st)
{
    ppn_err_first first = {0};
    ppn_err_first_add(&first, st); /* keeps st's message: the destroy may set its own */
    ppn_err_first_add(&first, ppn_seq_destroy(q));
    return ppn_err_first_done(&first);
}

/* Digits only, after one '-' where neg allows it. strtol alone would also take " 1", "+1" and "1 "
 * (leading space and sign), which the CLI refuses like the environment does. */
static int plain_int(const char *v, int neg)
{
    const char *p = v + (neg && *v == '-');
    if (!*p) return 0;
    for (; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* [-]digits[.digits][e[+-]digits], at least one digit before the exponent: no space, '+', hex, inf or nan. */
static int plain_float(const char *v, int neg)
{
    const char *p = v + (neg && *v == '-');
    int digits = 0, dot = 0;
    for (; (*p >= '0' && *p <= '9') || (*p == '.' && !dot); p++) {
        if (*p == '.') dot = 1;
        else digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        p += (p[1] == '-' || p[1] == '+') ? 2 : 1;
        if (*p < '0' || *p > '9') return 0;
        while (*p >= '0' && *p <= '9') p++;
    }
    return *p == '\0';
}

int cli_int(const char *flag, const char *v, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long x = plain_int(v, min < 0) ? strtol(v, &end, 10) : 0;
    if (!plain_int(v, min < 0) || *end || errno || x < min || x > max)
        return cli_fail("%s: '%s' is not an integer in [%ld, %ld]", flag, v, min, max), 2;
    *out = x;
    return 0;
}

int cli_float(const char *flag, const char *v, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double x = plain_float(v, min < 0) ? strtod(v, &end) : 0;
    if (!plain_float(v, min < 0) || *end || errno || !(x >= min && x <= max))
        return cli_fail("%s: '%s' is not a number in [%g, %g]", flag, v, min, max), 2;
    *out = x;
    return 0;
}

int cli_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = plain_int(v, 0) ? strtoull(v, &end, 10) : 0;
    if (!plain_int(v, 0) || *end || errno) return cli_fail("%s: '%s' is not a non-negative integer", flag, v), 2;
    *out = x;
    return 0;
}

/* One id of a list: digits only up to the next ',' or the end, at most INT_MAX; *end after it. */
static int one_id(const char *p, const char **end, int *out)
{
    long x = 0;
    const char *q = p;
    for (; *q >= '0' && *q <= '9'; q++)
        if ((x = x * 10 + (*q - '0')) > INT_MAX) return 0;
    if (q == p || (*q && *q != ',')) return 0;
    *end = q;
    *out = (int)x;
    return 1;
}

int cli_ids(const char *flag, const char *v, int **ids, int *n)
{
    int cap = 16, k = 0;
    int *a = malloc(sizeof *a * (size_t)cap);
    if (!a) return cli_fail("out of memory"), 1;
    for (const char *p = v;; p++) {
        const char *end;
        if (k == cap) {
            int *b = realloc(a, sizeof *a * (size_t)(cap *= 2));
            if (!b) return free(a), cli_fail("out of memory"), 1;
            a = b;
        }
        if (!one_id(p, &end, &a[k++])) {
            free(a);
            return cli_fail("%s: '%s' is not a comma-separated list of token ids (digits only, each at most %d)",
                            flag, v, INT_MAX), 2;
        }
        if (!*end) break;
        p = end;
    }
    *ids = a;
    *n = k;
    return 0;
}

int cli_dtype(const char *flag, const char *v, int *out)
{
    if (!strcmp(v, "f32")) *out = PPN_DTYPE_F32;
    else if (!strcmp(v, "bf16")) *out = PPN_DTYPE_BF16;
    else if (!strcmp(v, "f16")) *out = PPN_DTYPE_F16;
    else return cli_fail("%s: '%s' is not one of f32, bf16, f16", flag, v), 2;
    return 0;
}

int cli_backend(const char *flag, const char *v)
{
    const ppn_env_var *e = ppn_env_find("PPN_BACKEND");   /* the words ppn_rt_create takes */
    for (int i = 0; e->words[i]; i++)
        if (!strcmp(v, e->words[i])) return 0;
    char rule[256];
    return cli_fail("%s: '%s' is not one of %s", flag, v, ppn_env_rule(e, rule, sizeof rule)), 2;
}

int cli_rt_create(const char *backend, ppn_rt **rt)
{
    ppn_status st = ppn_rt_create(backend, rt);
    if (st == PPN_OK) return 0;
    cli_fail_status(st, "backend");
    return st == PPN_EINVAL ? 2 : 1;
}

/* The door-only variables set while MEMRA_PP_STAGES keeps the door shut, in one line: nothing reads them. */
static void door_notice(void)
{
    char names[512];
    size_t k = 0;
    int n = 0;
    names[0] = '\0';
    for (int i = 0; i < ppn_env_count(); i++) {
        const ppn_env_var *e = ppn_env_at(i);
        const char *val;
        ppn_env_str(e->name, &val);
        if (!val || !ppn_env_ignored(e) || k >= sizeof names) continue;
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", n++ ? ", " : "", e->name);
    }
    if (n)
        fprintf(stderr, "ppn: note: %s %s ignored: %s read only while MEMRA_PP_STAGES >= 2 (the door is shut in "
                "the environment)\n", names, n > 1 ? "are" : "is", n > 1 ? "they are" : "it is");
}

int cli_env_check(int door)
{
    if (ppn_env_check_all() != PPN_OK) return cli_fail("%s", ppn_last_error()), 2;
    if (door) door_notice();
    return 0;
}

const char *cli_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_fail("%s needs a value", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

void cli_progress(void *arg, size_t done, size_t total)
{
    (void)arg;
    static int last = -1;
    if (!isatty(STDERR_FILENO) || total == 0) return;
    int pct = (int)(100.0 * (double)done / (double)total);
    if (pct == last) return;
    last = pct;
    int w = 40, fill = pct * w / 100;
    fprintf(stderr, "\rloading [%.*s%*s] %3d%% %.2f GB", fill, "########################################",
            w - fill, "", pct, (double)done / 1e9);
    if (done >= total) {
        fputc('\n', stderr);
        last = -1;
    }
}

void cli_print_stage_map(FILE *f, const ppn_model *m)
{
    ppn_stage_info si;
    ppn_model_get_stage_map(m, &si);
    fprintf(f, "stage map: %d stage%s:", si.n_stages, si.n_stages > 1 ? "s" : "");
    for (int s = 0; s < si.n_stages; s++) {
        fprintf(f, " layers %d-%d @dev%d", si.fence[s], si.fence[s + 1] - 1, si.dev[s]);
        if (s + 1 < si.n_stages) fprintf(f, " -[%s]->", ppn_transport_name(si.xport[s]));
    }
    if (si.threads) {
        fprintf(f, "; issue threads on cores");
        for (int s = 0; s < si.n_stages; s++) fprintf(f, "%s%d", s ? "," : " ", si.pu[s]);
    } else {
        fprintf(f, "; issued from the caller's thread");
    }
    fprintf(f, "%s%s%s%s\n", si.door.overlap ? "; overlap" : "", si.door.streams ? "" : "; one stream",
            si.door.shard ? "" : "; unsharded", si.door.graphs ? "; graphs" : "; no graphs");
    if (!si.door.fuse)
        fprintf(f, "       (PPN_FUSE=0: the norms and the rotary in their own launches, f32 x into every GEMM)\n");
    if (!si.door.attn_tc)
        fprintf(f, "       (PPN_ATTN_TC=0: a batch step's attention on the decode kernel per row, not tensor cores)\n");
    for (int s = 0; s < si.n_stages; s++) {
        ppn_stage_place p;
        char node[64];
        if (ppn_model_get_stage_place((ppn_model *)m, s, &p) != PPN_OK) {
            fprintf(f, "       stage %d: placement unreadable: %s\n", s, ppn_last_error());
            continue;
        }
        fprintf(f, "       stage %d: dev%d%s%s, NUMA node %s", s, p.dev, p.pci[0] ? " pci " : "", p.pci,
                p.dev_node >= 0 ? (snprintf(node, sizeof node, "%d", p.dev_node), node) : "any (not located)");
        if (p.threaded && p.thread_node >= 0)
            fprintf(f, "; thread %s on PUs %s, memory node %d", p.thread_name, p.thread_cpus, p.thread_node);
        else if (p.threaded) fprintf(f, "; thread %s on PUs %s, memory not bound", p.thread_name, p.thread_cpus);
        fprintf(f, "; host buffers: %s\n", cli_host_node(&p, node, sizeof node));
    }
}

const char *cli_host_node(const ppn_stage_place *p, char *buf, size_t cap)
{
    if (!p->host_buffers) snprintf(buf, cap, "none");
    else if (p->host_node >= 0) snprintf(buf, cap, "%d on node %d", p->host_buffers, p->host_node);
    else if (p->host_node == -1) snprintf(buf, cap, "%d, no page resident yet", p->host_buffers);
    else if (p->host_node == -2) snprintf(buf, cap, "%d on nodes (OS) %s", p->host_buffers, p->host_os_nodes);
    else snprintf(buf, cap, "%d on OS node %s (not in the topology)", p->host_buffers, p->host_os_nodes);
    return buf;
}

void cli_json_stage_map(FILE *f, const ppn_model *m)
{
    ppn_stage_info si;
    ppn_model_get_stage_map(m, &si);
    fprintf(f, "{\"n_stages\":%d,\"fence\":[", si.n_stages);
    for (int s = 0; s <= si.n_stages; s++) fprintf(f, "%s%d", s ? "," : "", si.fence[s]);
    fprintf(f, "],\"devices\":[");
    for (int s = 0; s < si.n_stages; s++) fprintf(f, "%s%d", s ? "," : "", si.dev[s]);
    fprintf(f, "],\"transports\":[");
    for (int s = 0; s + 1 < si.n_stages; s++) fprintf(f, "%s\"%s\"", s ? "," : "", ppn_transport_name(si.xport[s]));
    fprintf(f, "],\"cores\":[");
    for (int s = 0; s < si.n_stages; s++) fprintf(f, "%s%d", s ? "," : "", si.pu[s]);
    fprintf(f, "],\"threads\":%s,\"overlap\":%d,\"streams\":%d,\"shard\":%d,\"graphs\":%d,\"fuse\":%d,\"attn_tc\":%d",
            si.threads ? "true" : "false", si.door.overlap, si.door.streams, si.door.shard, si.door.graphs,
            si.door.fuse, si.door.attn_tc);
    fprintf(f, ",\"placement\":[");
    for (int s = 0; s < si.n_stages; s++) {
        ppn_stage_place p;
        if (ppn_model_get_stage_place((ppn_model *)m, s, &p) != PPN_OK) {
            fprintf(f, "%snull", s ? "," : "");
            continue;
        }
        fprintf(f, "%s{\"stage\":%d,\"dev\":%d,\"pci\":\"%s\",\"dev_node\":%d,\"thread\":\"%s\",\"thread_cpus\":\"%s\","
                   "\"thread_node\":%d,\"host_buffers\":%d,\"host_node\":%d,\"host_os_nodes\":\"%s\"}",
                s ? "," : "", s, p.dev, p.pci, p.dev_node, p.thread_name, p.thread_cpus, p.thread_node, p.host_buffers,
                p.host_node, p.host_os_nodes);
    }
    fprintf(f, "]}");
}

double cli_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e6 * (double)t.tv_sec + 1e-3 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void cli_sort(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_double); }

double cli_rank(const double *v, int n, double q)
{
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

double cli_median(const double *v, int n) { return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

/* Feed ids[0..n) to seq: primed chunk rows at a time (chunk > 0) or token by token; rows (may be NULL) receives
 * every row's logits, last (may be NULL) the last row's. */
ppn_status cli_feed(ppn_seq *seq, const int *ids, int n, int chunk, int vocab, float *rows, float *last)
{
    if (n < 1) return PPN_OK;
    if (chunk > 0) {
        ppn_prefill_opts po = {.chunk = chunk, .all_logits = rows != NULL};
        ppn_status st = ppn_prefill(seq, ids, n, &po, rows ? rows : last);
        if (st != PPN_OK) return st;
        if (rows && last) memcpy(last, rows + (size_t)(n - 1) * (size_t)vocab, sizeof(float) * (size_t)vocab);
        return PPN_OK;
    }
    for (int t = 0; t < n; t++) {
        float *row = rows ? rows + (size_t)t * (size_t)vocab : t == n - 1 ? last : NULL;
        ppn_status st = ppn_decode_step(seq, ids[t], row);
        if (st != PPN_OK) return st;
        if (rows && last && t == n - 1) memcpy(last, row, sizeof(float) * (size_t)vocab);
    }
    return PPN_OK;
}
