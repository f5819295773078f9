/* fuzz_util.h - what the libFuzzer harnesses of tests/fuzz share: the loaders read paths, not buffers, so each
 * input is written to a file first (a memfd for one file, a private directory under $TMPDIR for a checkpoint or
 * tokenizer directory; both live in memory on tmpfs, so a run costs no disk).
 *
 * Every harness defines LLVMFuzzerTestOneInput and nothing else the fuzzer needs; fuzz_replay.c gives the same
 * harness a main() that runs corpus files once, so gcc builds (and the ASan CI run) replay the corpus as tests. */
#ifndef PPN_FUZZ_UTIL_H
#define PPN_FUZZ_UTIL_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A harness bug or a full disk, not a finding: stop loudly so it is not mistaken for one. */
static inline void fz_die(const char *what)
{
    perror(what);
    abort();
}

/* One memfd reused by every input; its /proc/self/fd path opens like a regular file. */
static inline const char *fz_memfd(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ppn-fuzz", MFD_CLOEXEC);
        if (fd < 0) fz_die("memfd_create");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) fz_die("ftruncate");
    if (size && pwrite(fd, data, size, 0) != (ssize_t)size) fz_die("pwrite");
    return path;
}

/* The files fz_put made, removed with their directory at exit (a crash leaves them for a look). */
static char fz_names[8][64];
static char fz_dir_path[512];

static inline void fz_cleanup(void)
{
    char path[1024];
    for (int i = 0; i < 8 && fz_names[i][0]; i++) {
        snprintf(path, sizeof path, "%s/%s", fz_dir_path, fz_names[i]);
        unlink(path);
    }
    rmdir(fz_dir_path);
}

/* A private directory for this process (made once; the harness rewrites its files each input): under $TMPDIR,
 * else /dev/shm, else /tmp. Memory matters: on ext4, rewriting a file through O_TRUNC forces its data out at
 * close (auto_da_alloc), which made a run 30 times slower. */
static inline const char *fz_dir(void)
{
    if (!fz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fz_dir_path, sizeof fz_dir_path, "%s/ppn-fuzz-XXXXXX", tmp);
        if (!mkdtemp(fz_dir_path)) fz_die("mkdtemp");
        atexit(fz_cleanup);
    }
    return fz_dir_path;
}

/* Write (or, data NULL, remove) dir/name. */
static inline void fz_put(const char *name, const void *data, size_t size)
{
    char path[1024];
    int i = 0;
    while (i < 8 && fz_names[i][0] && strcmp(fz_names[i], name)) i++;
    if (i == 8 || strlen(name) >= sizeof fz_names[0]) fz_die("fz_put: too many or too long names");
    snprintf(fz_names[i], sizeof fz_names[i], "%s", name);
    snprintf(path, sizeof path, "%s/%s", fz_dir(), name);
    if (!data) {
        unlink(path);
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) fz_die(path);
    if (size && write(fd, data, size) != (ssize_t)size) fz_die(path);
    close(fd);
}

/* Split an input at its first NUL byte into a and b (b NULL when there is none): two files from one input.
 * JSON text never holds a raw NUL, so a NUL is free to serve as the separator. */
static inline void fz_split(const uint8_t *data, size_t size, const uint8_t **b, size_t *a_len, size_t *b_len)
{
    const uint8_t *nul = memchr(data, 0, size);
    *a_len = nul ? (size_t)(nul - data) : size;
    *b = nul ? nul + 1 : NULL;
    *b_len = nul ? size - *a_len - 1 : 0;
}

#endif
