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

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ppn: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_fail_status(ppn_status st, const char *what)
{
    return cli_fail("%s: %s (%s)", what, ppn_last_error(), ppn_status_name(st));
}

int cli_int(const char *flag, const char *v, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < min || x > max)
        return cli_fail("%s: '%s' is not an integer in [%ld, %ld]", flag, v, min, max), 2;
    *out = x;
    return 0;
}

int cli_float(const char *flag, const char *v, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!*v || *end || errno || !(x >= min && x <= max))
        return cli_fail("%s: '%s' is not a number in [%g, %g]", flag, v, min, max), 2;
    *out = x;
    return 0;
}

int cli_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || errno || *v == '-') return cli_fail("%s: '%s' is not a non-negative integer", flag, v), 2;
    *out = x;
    return 0;
}

int cli_ids(const char *flag, const char *v, int **ids, int *n)
{
    int cap = 16, k = 0;
    int *a = malloc(sizeof *a * (size_t)cap);
    if (!a) return cli_fail("out of memory"), 1;
    const char *p = v;
    while (1) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT_MAX || (*end && *end != ',')) {
            free(a);
            return cli_fail("%s: '%s' is not a comma-separated list of token ids", flag, v), 2;
        }
        if (k == cap) {
            int *b = realloc(a, sizeof *a * (size_t)(cap *= 2));
            if (!b) return free(a), cli_fail("out of memory"), 1;
            a = b;
        }
        a[k++] = (int)x;
        if (!*end) break;
        p = end + 1;
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
    if (!si.door.fuse) fprintf(f, "       (PPN_FUSE=0: the norms and the rotary in their own launches)\n");
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
    fprintf(f, "],\"threads\":%s,\"overlap\":%d,\"streams\":%d,\"shard\":%d,\"graphs\":%d,\"fuse\":%d}",
            si.threads ? "true" : "false", si.door.overlap, si.door.streams, si.door.shard, si.door.graphs,
            si.door.fuse);
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
