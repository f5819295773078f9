/* test_layers.c - the house's floors, checked on the source tree: every #include "..." of the library points
 * down (or within its own folder), never up and never sideways into another folder of the same floor, and no
 * header includes itself back through a chain. docs/ARCHITECTURE.md draws the same floors.
 *
 * The tree is read from PPN_SOURCE_DIR (the CMake source directory, compiled in).
 */
#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#ifndef PPN_SOURCE_DIR
#error "PPN_SOURCE_DIR must name the source tree"
#endif

/* Folders bottom up; a file may include its own folder and any folder of a lower floor. */
static const struct floor {
    const char *dir;
    int floor;
} floors[] = {
    {"include", 0}, {"core/base", 0},  {"core/device", 1}, {"core/model", 1}, {"core/tok", 1}, {"kernels", 2},
    {"alloc", 2},   {"sched", 2},      {"transport", 3},   {"core", 4},       {"tools", 5},
    {"tests/util", 5}, {"tests", 6},   {"tests/gpu", 6},   {"examples", 6},
};

#define MAX_FILES 512
#define MAX_INC 48

typedef struct src_file {
    char path[256];       /* relative to the source dir */
    char inc[MAX_INC][256];
    int n_inc;
} src_file;

static src_file files[MAX_FILES];
static int n_files;

static const char *dir_of(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    char *slash = strrchr(buf, '/');
    if (slash) *slash = '\0';
    else buf[0] = '\0';
    return buf;
}

/* The floor of a file's folder; -1 for a folder the table does not know. */
static int floor_of(const char *path)
{
    char d[256];
    dir_of(path, d, sizeof d);
    for (size_t i = 0; i < sizeof floors / sizeof floors[0]; i++)
        if (!strcmp(d, floors[i].dir)) return floors[i].floor;
    return -1;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* An include "x" resolves against the source dir (the project's style) or, for ppn.h, include/. */
static void resolve(const char *name, char *out, size_t cap)
{
    if (!strcmp(name, "ppn.h")) snprintf(out, cap, "include/ppn.h");
    else snprintf(out, cap, "%s", name);
}

static void read_includes(src_file *f)
{
    char full[1024], line[512];
    snprintf(full, sizeof full, "%s/%s", PPN_SOURCE_DIR, f->path);
    FILE *fp = fopen(full, "r");
    assert_non_null(fp);
    while (fgets(line, sizeof line, fp)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, "#include \"", 10) != 0) continue;
        char *name = p + 10, *end = strchr(name, '"');
        assert_non_null(end);
        *end = '\0';
        assert_true(f->n_inc < MAX_INC);
        resolve(name, f->inc[f->n_inc++], sizeof f->inc[0]);
    }
    fclose(fp);
}

static void scan(const char *rel)
{
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", PPN_SOURCE_DIR, rel);
    DIR *d = opendir(full);
    if (!d) return; /* examples/ may be absent in an old tree */
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char child[256];
        if ((size_t)snprintf(child, sizeof child, "%s/%s", rel, e->d_name) >= sizeof child) fail_msg("path too long");
        if (e->d_type == DT_DIR) {
            if (floor_of(strcat(strcpy(full, child), "/x")) >= 0) scan(child); /* only folders the table names */
            continue;
        }
        if (!has_suffix(e->d_name, ".c") && !has_suffix(e->d_name, ".h") && !has_suffix(e->d_name, ".cu")) continue;
        assert_true(n_files < MAX_FILES);
        snprintf(files[n_files].path, sizeof files[0].path, "%s", child);
        read_includes(&files[n_files++]);
    }
    closedir(d);
}

static int setup(void **state)
{
    (void)state;
    static const char *const tops[] = {"include", "core", "kernels", "alloc", "sched", "transport", "tools",
                                       "tests", "examples"};
    for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++) scan(tops[i]);
    return n_files > 0 ? 0 : -1;
}

/* The walk found the library's known files: a scan that silently read nothing would prove nothing. */
static void test_layers_scan_finds_the_tree(void **state)
{
    (void)state;
    static const char *const must[] = {"include/ppn.h", "core/base/err.h", "core/device/gpu.h", "core/rt.h",
                                       "kernels/ktable.h", "transport/boundary.h", "core/step.c"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
        int found = 0;
        for (int k = 0; k < n_files; k++) found |= !strcmp(files[k].path, must[i]);
        if (!found) fail_msg("the scan of %s did not find %s", PPN_SOURCE_DIR, must[i]);
    }
}

static void test_layers_includes_point_down(void **state)
{
    (void)state;
    int bad = 0;
    for (int i = 0; i < n_files; i++) {
        const src_file *f = &files[i];
        char fd[256], id[256];
        int ff = floor_of(f->path);
        if (ff < 0) {
            print_error("%s: its folder has no floor in test_layers.c's table\n", f->path);
            bad++;
            continue;
        }
        dir_of(f->path, fd, sizeof fd);
        for (int k = 0; k < f->n_inc; k++) {
            int fi = floor_of(f->inc[k]);
            dir_of(f->inc[k], id, sizeof id);
            if (!strcmp(fd, id)) continue;
            if (fi < 0 || fi > ff || (fi == ff && strcmp(id, "include") && strcmp(id, "core/base"))) {
                print_error("%s (floor %d) includes %s (floor %d): includes must point down\n", f->path, ff,
                            f->inc[k], fi);
                bad++;
            }
        }
    }
    assert_int_equal(bad, 0);
}

static int index_of(const char *path)
{
    for (int i = 0; i < n_files; i++)
        if (!strcmp(files[i].path, path)) return i;
    return -1;
}

/* Depth-first over headers: 1 = on the current path, 2 = done. */
static int visit(int i, int *mark, int depth)
{
    if (mark[i] == 1) {
        print_error("include circle through %s\n", files[i].path);
        return 1;
    }
    if (mark[i] == 2 || depth > 64) return 0;
    mark[i] = 1;
    int bad = 0;
    for (int k = 0; k < files[i].n_inc && !bad; k++) {
        int j = index_of(files[i].inc[k]);
        if (j >= 0) bad = visit(j, mark, depth + 1);
    }
    mark[i] = 2;
    return bad;
}

static void test_layers_no_include_circle(void **state)
{
    (void)state;
    int mark[MAX_FILES] = {0};
    for (int i = 0; i < n_files; i++) assert_int_equal(visit(i, mark, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_scan_finds_the_tree),
        cmocka_unit_test(test_layers_includes_point_down),
        cmocka_unit_test(test_layers_no_include_circle),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
