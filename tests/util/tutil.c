/* tutil.c - test helpers (see tutil.h). */
#include <ctype.h>
#include <sys/wait.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include "tests/util/tutil.h"

const char *tu_fixture(const char *rel)
{
    static _Thread_local char buf[4096];
    const char *root = getenv("PPN_FIXTURES");
    snprintf(buf, sizeof buf, "%s/%s", root && *root ? root : "../shared/fixtures", rel);
    return buf;
}

void *tu_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "test: cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[sz] = 0;
    if (n) *n = (size_t)sz;
    return b;
}

int *tu_ref_ids(const char *path, const char *key, int *n)
{
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e);
    if (!root) {
        fprintf(stderr, "test: %s: %s\n", path, e.text);
        return NULL;
    }
    json_t *arr = json_object_get(root, key);
    int *ids = NULL;
    if (json_is_array(arr)) {
        *n = (int)json_array_size(arr);
        ids = malloc(sizeof(int) * (size_t)(*n ? *n : 1));
        for (int i = 0; i < *n; i++) ids[i] = (int)json_integer_value(json_array_get(arr, (size_t)i));
    }
    json_decref(root);
    return ids;
}

int *tu_read_ids_text(const char *path, int *n)
{
    char *t = tu_read_file(path, NULL);
    if (!t) return NULL;
    int cap = 64, k = 0;
    int *ids = malloc(sizeof(int) * (size_t)cap);
    for (char *p = t; *p;) {
        if (!isdigit((unsigned char)*p) && *p != '-') {
            p++;
            continue;
        }
        long v = strtol(p, &p, 10);
        if (k == cap) ids = realloc(ids, sizeof(int) * (size_t)(cap *= 2));
        ids[k++] = (int)v;
    }
    free(t);
    *n = k;
    return ids;
}

static int top1(const float *x, int n, float *margin)
{
    int b = 0, s = -1;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    for (int i = 0; i < n; i++)
        if (i != b && (s < 0 || x[i] > x[s])) s = i;
    *margin = s < 0 ? INFINITY : x[b] - x[s];
    return b;
}

void tu_cmp_row(tu_cmp *c, int row, const float *x, const float *ref, int vocab, double tol_rel, double margin)
{
    double maxref = 1, maxdiff = 0;
    for (int i = 0; i < vocab; i++) {
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        double d = fabs((double)x[i] - (double)ref[i]);
        if (!(d <= maxdiff)) maxdiff = d; /* NaN propagates as a failure */
    }
    double ratio = maxdiff / (tol_rel * maxref);
    if (isnan(ratio)) ratio = INFINITY;
    if (ratio > c->worst_ratio || row == 0) {
        c->worst_ratio = ratio > c->worst_ratio ? ratio : c->worst_ratio;
        c->worst_row = ratio >= c->worst_ratio ? row : c->worst_row;
    }
    float m_ref, m_x;
    int r1 = top1(ref, vocab, &m_ref), x1 = top1(x, vocab, &m_x);
    if (margin < 0) margin = 2 * tol_rel * maxref; /* any result within tolerance keeps these rows' top-1 */
    if (m_ref > margin) {
        c->greedy_checked++;
        if (r1 != x1) c->greedy_mismatch++;
    }
}

int tu_run(const char *cmd, char **out, char **err)
{
    char of[] = "/tmp/ppn-test-outXXXXXX", ef[] = "/tmp/ppn-test-errXXXXXX";
    int fo = mkstemp(of), fe = mkstemp(ef);
    if (fo < 0 || fe < 0) return -1;
    char *full = malloc(strlen(cmd) + 128);
    sprintf(full, "%s >%s 2>%s", cmd, of, ef);
    int rc = system(full);
    free(full);
    *out = tu_read_file(of, NULL);
    *err = tu_read_file(ef, NULL);
    remove(of);
    remove(ef);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

char *tu_tmpdir(void)
{
    char t[] = "/tmp/ppn-testXXXXXX";
    char *d = mkdtemp(t);
    return d ? strdup(d) : NULL;
}

void tu_rmrf(const char *path)
{
    char *cmd = malloc(strlen(path) + 16);
    sprintf(cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "test: could not remove %s\n", path);
    free(cmd);
}
