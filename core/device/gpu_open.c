/* gpu_open.c - backend selection: an explicit name, else PPN_BACKEND, else auto (cuda when usable, else sim). */
#include <string.h>
#include "core/base/env.h"
#include "core/base/err.h"
#include "core/device/gpu.h"

#define PPN_BACKENDS "auto, cuda, sim"

/* Forced cuda: unusable means an error, never a quiet switch to sim. A build without kernels cannot run a
 * model, so it is refused here rather than at the first launch deep inside a forward pass. (Tools that only
 * need device ops, such as the pool tests, call ppn_gpu_cuda_create directly.) */
static ppn_status gpu_open_cuda(const ppn_gpu_kernels *kern, ppn_gpu **out)
{
    ppn_gpu *g = NULL;
    PPN_CHECK(ppn_gpu_cuda_create(kern, &g));
    if (!kern || !kern->n_images) {
        ppn_gpu_close(g);
        return ppn_err(PPN_ENOKERNELS, "backend cuda: this build has no kernels (built without nvcc; rebuild "
                                       "with nvcc on PATH and PPN_CUDA_KERNELS=ON, or use the sim backend)");
    }
    *out = g;
    return PPN_OK;
}

/* auto: cuda when a driver loads, sees a device and the build has kernels; else sim. A missing driver or
 * device (PPN_ENODEV) is the ordinary CI case and falls back silently. A GPU present in a build without
 * kernels falls back with a note on stderr, since running on the simulator there surprises. Any other
 * failure of a driver that did load (PPN_EDRIVER, PPN_ENOMEM) is returned: hiding a broken GPU setup
 * behind the simulator would be worse. */
static ppn_status gpu_open_auto(const ppn_gpu_kernels *kern, ppn_gpu **out)
{
    ppn_gpu *g = NULL;
    ppn_status st = ppn_gpu_cuda_create(kern, &g);
    if (st == PPN_OK && kern && kern->n_images) {
        *out = g;
        return PPN_OK;
    }
    if (st == PPN_OK) {
        ppn_gpu_close(g);
        fprintf(stderr, "ppn: backend auto: a CUDA device is present but this build has no kernels (built "
                        "without nvcc): using the sim backend\n");
    } else if (st != PPN_ENODEV) {
        return ppn_err_ctx(st, "backend auto: the cuda driver loaded but failed (PPN_BACKEND=sim forces the "
                               "simulator)");
    }
    return ppn_gpu_sim_create(kern, out);
}

/* Returns PPN_OK, PPN_EINVAL (unknown name, naming PPN_BACKEND when it came from there; a bad PPN_TRACE), and
 * whatever the chosen backend's constructor returns: PPN_ENODEV, PPN_ENOKERNELS, PPN_EDRIVER, PPN_ENOMEM,
 * PPN_EINVAL. */
ppn_status ppn_gpu_open(const char *name, const ppn_gpu_kernels *kern, ppn_gpu **out)
{
    /* every runtime opens its device here first: PPN_TRACE is read (a bad value refused) and applied here */
    int trace = 0;
    PPN_CHECK(ppn_env_flag("PPN_TRACE", &trace));
    ppn_trace_enable(trace);
    const char *from_env = NULL;
    if (!name || !*name) {
        /* The raw text: the variable names the same backends as the argument; one check below serves both. */
        PPN_CHECK(ppn_env_str("PPN_BACKEND", &from_env));
        name = from_env ? from_env : "auto";
    }
    ppn_status st;
    if (strcmp(name, "auto") == 0)
        st = gpu_open_auto(kern, out);
    else if (strcmp(name, "cuda") == 0)
        st = gpu_open_cuda(kern, out);
    else if (strcmp(name, "sim") == 0)
        st = ppn_gpu_sim_create(kern, out);
    else if (from_env)
        return ppn_err(PPN_EINVAL, "PPN_BACKEND=%s: unknown backend (allowed: %s)", name, PPN_BACKENDS);
    else
        return ppn_err(PPN_EINVAL, "backend '%s': unknown backend (allowed: %s)", name, PPN_BACKENDS);
    /* Say where the choice came from, so a stray variable in the environment is easy to spot. */
    if (st != PPN_OK && from_env) return ppn_err_ctx(st, "PPN_BACKEND=%s", name);
    return st;
}
