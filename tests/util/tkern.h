/* tkern.h - what the kernel tests (tests/test_kernels_*.c) share: a kernel's CPU reference by id, a closeness
 * check, and a fake device that captures each launch of the ops (kernel, params, declared accesses, geometry)
 * and runs the CPU reference on it, as the sim backend does. Include after <cmocka.h>. */
#ifndef PPN_TKERN_H
#define PPN_TKERN_H

#include <stddef.h>
#include <stdint.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"

/* A host pointer as a kernel's device address: the CPU references read host memory. */
#define D(p) ((uint64_t)(uintptr_t)(p))
#define TU_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Run kernel id's CPU reference on params. */
void tu_kernel_run(int id, const void *params);
/* Fails the test, naming what[i], unless |got - want| <= tol (NaN fails). */
void tu_check_close(double got, double want, double tol, const char *what, size_t i);

/* The fake device: tu_fake's launch copies the launch and its params into tu_cap, counts it, and (unless dry)
 * runs the kernel's CPU reference. */
typedef struct tu_capture {
    ppn_launch l; /* the last launch; l.params points at params */
    unsigned char params[256];
    int calls;
    int dry; /* capture only: the pointers are not real buffers (geometry checks of model-sized shapes) */
} tu_capture;
extern tu_capture tu_cap;
extern ppn_gpu tu_fake;
extern ppn_gstream *const tu_fake_stream;

/* The captured launch's access i is exactly (p, bytes, mode). */
void tu_expect_acc(int i, const void *p, size_t bytes, int mode);
/* 1 when [p, p + bytes) is covered by one declared access with this mode bit. */
int tu_declared(const void *p, size_t bytes, int mode);
/* A 1-D geometry within the kernels' contract (whole warps, at most 1024 threads) with at least min_threads. */
void tu_expect_geometry(unsigned min_threads);

#endif
