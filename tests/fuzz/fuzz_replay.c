/* fuzz_replay.c - a main() for the harnesses where libFuzzer is absent (gcc builds): run each file named, or each
 * file in each directory named, through LLVMFuzzerTestOneInput once. CTest runs every harness over its corpus
 * this way (fuzz_replay_<target>), so the normal, ASan and TSan builds all replay the corpus, crash cases
 * included. Exit 0 when every input ran; a finding aborts through the sanitizer or the harness's own checks. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_util.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, n;
    do {
        if (len == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096))) fz_die("realloc");
        n = fread(buf + len, 1, cap - len, f);
        len += n;
    } while (n);
    fclose(f);
    /* libFuzzer hands each input in a buffer of exactly its size: do the same, so overreads are caught. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) fz_die("malloc");
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

/* A directory's files in name order (so a failure names the same input on every run). */
static int run_dir(const char *dir, int *count)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, alphasort), fail = 0;
    if (n < 0) {
        perror(dir);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, ents[i]->d_name);
        if (ents[i]->d_name[0] != '.' && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            fail |= run_file(path);
            ++*count;
        }
        free(ents[i]);
    }
    free(ents);
    return fail;
}

int main(int argc, char **argv)
{
    int fail = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            perror(argv[i]);
            fail = 1;
        } else if (S_ISDIR(sb.st_mode)) {
            fail |= run_dir(argv[i], &count);
        } else {
            fail |= run_file(argv[i]);
            count++;
        }
    }
    printf("fuzz_replay: %d input(s) ran\n", count);
    if (count == 0) {
        fprintf(stderr, "fuzz_replay: no inputs (an empty corpus proves nothing)\n");
        return 1;
    }
    return fail;
}
