/* test_gpu_open.c - backend selection (ppn_gpu_open) and the cuda backend's behaviour where libcuda is absent.
 *
 * Whether a driver exists is decided here independently of ppn: by dlopen'ing libcuda.so.1 ourselves. On a
 * machine without it, cuda must fail with PPN_ENODEV and the loader's own reason; with it, cuda may succeed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/device/gpu.h"
#include "kernels/ktable.h"
#include "tests/util/tcheck.h"
#include "tests/util/tutil.h"

#ifndef PPN_HAVE_FATBIN
#define PPN_HAVE_FATBIN 0
#endif

static int have_driver;
static char dl_reason[512]; /* dlerror() of our own failed dlopen */

static void probe_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) {
        have_driver = 1;
        dlclose(h);
    } else {
        snprintf(dl_reason, sizeof dl_reason, "%s", dlerror());
    }
}


/* Each test starts with PPN_BACKEND unset; its teardown puts back what the environment held. */
static int env_clear(void **state)
{
    (void)state;
    tu_env_set("PPN_BACKEND", NULL);
    return 0;
}

static int env_restore(void **state)
{
    (void)state;
    tu_env_restore();
    return 0;
}

static void test_gpu_open_bogus_name(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open("bogus", ppn_kernel_set(), &g));
    MSG_HAS("bogus");
    MSG_HAS("auto, cuda, sim");
    assert_null(strstr(ppn_last_error(), "PPN_BACKEND"));
    assert_null(g);
}

static void test_gpu_open_bogus_env(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    tu_env_set("PPN_BACKEND", "bogus");
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open(NULL, ppn_kernel_set(), &g));
    MSG_HAS("PPN_BACKEND=bogus");
    MSG_HAS("auto, cuda, sim");
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open("", ppn_kernel_set(), &g));
    MSG_HAS("PPN_BACKEND=bogus");
    assert_null(g);
}

/* An explicit name wins over the environment; the environment wins over auto. */
static void test_gpu_open_precedence(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    tu_env_set("PPN_BACKEND", "bogus");
    EXPECT_ST(PPN_OK, ppn_gpu_open("sim", ppn_kernel_set(), &g));
    assert_string_equal(g->ops->name, "sim");
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_BACKEND", "sim");
    EXPECT_ST(PPN_OK, ppn_gpu_open(NULL, ppn_kernel_set(), &g));
    assert_string_equal(g->ops->name, "sim");
    assert_true(g->ops->device_count(g) >= 1);
    ppn_gpu_close(g);
}

static void test_gpu_open_cuda_create(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    ppn_status st = ppn_gpu_cuda_create(ppn_kernel_set(), &g);
    if (!have_driver) {
        char want[700];
        snprintf(want, sizeof want, "cuda: cannot dlopen libcuda.so.1: %s", dl_reason);
        if (st != PPN_ENODEV) fail_msg("cuda without libcuda: %s: %s", ppn_status_name(st), ppn_last_error());
        assert_string_equal(ppn_last_error(), want);
        assert_null(g);
        return;
    }
    /* A driver is here: a device may or may not be. */
    if (st == PPN_OK) {
        assert_string_equal(g->ops->name, "cuda");
        assert_true(g->ops->device_count(g) >= 1);
        ppn_gpu_close(g);
    } else {
        if (st != PPN_ENODEV) fail_msg("cuda with a driver: %s: %s", ppn_status_name(st), ppn_last_error());
        MSG_HAS("cuda");
    }
}

static void test_gpu_open_cuda_forced(void **state)
{
    (void)state;
    ppn_gpu *g = NULL;
    if (!have_driver) {
        EXPECT_ST(PPN_ENODEV, ppn_gpu_open("cuda", ppn_kernel_set(), &g));
        MSG_HAS("cannot dlopen libcuda.so.1");
        assert_null(g);
        tu_env_set("PPN_BACKEND", "cuda");
        EXPECT_ST(PPN_ENODEV, ppn_gpu_open(NULL, ppn_kernel_set(), &g));
        MSG_HAS("PPN_BACKEND=cuda");
        MSG_HAS("cannot dlopen libcuda.so.1");
        assert_null(g);
        return;
    }
    ppn_status st = ppn_gpu_open("cuda", ppn_kernel_set(), &g);
    if (st == PPN_OK) {
        assert_true(PPN_HAVE_FATBIN);
        assert_string_equal(g->ops->name, "cuda");
        ppn_gpu_close(g);
    } else if (st != PPN_ENODEV && !(st == PPN_ENOKERNELS && !PPN_HAVE_FATBIN)) {
        fail_msg("forced cuda: %s: %s", ppn_status_name(st), ppn_last_error());
    }
}

/* The build's kernel images: two fatbins (kernels/gemm.cu's and the rest's) in a build with nvcc, none without.
 * Each begins with the fatbin container's magic (0xba55ed50, little-endian, as cuda.h's loaders expect). A table
 * naming more images than a backend holds, or an empty one, is refused by name. */
static void test_gpu_open_kernel_images(void **state)
{
    (void)state;
    const ppn_gpu_kernels *ks = ppn_kernel_set();
    if (!PPN_HAVE_FATBIN) {
        assert_int_equal(ks->n_images, 0);
    } else {
        assert_int_equal(ks->n_images, 2);
        assert_string_equal(ks->images[0].name, "main");
        assert_string_equal(ks->images[1].name, "gemm");
        for (int i = 0; i < 2; i++) {
            const unsigned char *p = ks->images[i].data;
            assert_true(ks->images[i].size > 16);
            uint32_t magic = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            assert_int_equal(magic, 0xba55ed50u);
        }
    }
    ppn_gpu_kernels bad = *ks;
    ppn_gpu_image im[PPN_GPU_MAX_IMAGES + 1] = {{"x", "\x50\xed\x55\xba", 4}};
    for (int i = 1; i <= PPN_GPU_MAX_IMAGES; i++) im[i] = im[0];
    ppn_gpu *g = NULL;
    bad.images = im;
    bad.n_images = PPN_GPU_MAX_IMAGES + 1;
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open("sim", &bad, &g));
    MSG_HAS("5 kernel images (at most 4)");
    assert_null(g);
    bad.n_images = 2;
    im[1] = (ppn_gpu_image){"empty", NULL, 0};
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open("sim", &bad, &g));
    MSG_HAS("kernel image 1 (empty) is empty");
    assert_null(g);
    bad.images = NULL;
    EXPECT_ST(PPN_EINVAL, ppn_gpu_open("sim", &bad, &g));
    MSG_HAS("2 kernel images at NULL");
    assert_null(g);
    bad.n_images = 1;
    bad.images = im;
    EXPECT_ST(PPN_OK, ppn_gpu_open("sim", &bad, &g));
    ppn_gpu_close(g);
}

/* auto is cuda exactly when cuda can be created and the build has kernels; sim otherwise. An empty name
 * with PPN_BACKEND unset means auto too. */
static void test_gpu_open_auto(void **state)
{
    (void)state;
    const char *want = "sim";
    ppn_gpu *g = NULL;
    if (have_driver && PPN_HAVE_FATBIN && ppn_gpu_cuda_create(ppn_kernel_set(), &g) == PPN_OK) {
        want = "cuda";
        ppn_gpu_close(g);
        g = NULL;
    }
    EXPECT_ST(PPN_OK, ppn_gpu_open("auto", ppn_kernel_set(), &g));
    assert_string_equal(g->ops->name, want);
    ppn_gpu_close(g);
    g = NULL;
    EXPECT_ST(PPN_OK, ppn_gpu_open(NULL, ppn_kernel_set(), &g));
    assert_string_equal(g->ops->name, want);
    ppn_gpu_close(g);
    g = NULL;
    tu_env_set("PPN_BACKEND", "");
    EXPECT_ST(PPN_OK, ppn_gpu_open("", ppn_kernel_set(), &g));
    assert_string_equal(g->ops->name, want);
    ppn_gpu_close(g);
}

int main(void)
{
    probe_driver();
    printf("libcuda.so.1: %s\n", have_driver ? "present" : dl_reason);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gpu_open_bogus_name, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_bogus_env, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_precedence, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_cuda_create, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_cuda_forced, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_auto, env_clear, env_restore),
        cmocka_unit_test_setup_teardown(test_gpu_open_kernel_images, env_clear, env_restore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
