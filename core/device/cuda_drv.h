/* cuda_drv.h - the CUDA driver entry-point table: libcuda is dlopen'ed at run time, never linked.
 *
 * Every entry point is resolved through cuGetProcAddress at a pinned ABI version: the version written next to
 * each symbol below is the CUDA release that introduced the variant whose prototype we call (the suffix of its
 * PFN_ typedef in <cudaTypedefs.h>), so a newer driver can never hand us a function with another ABI
 * (cuMemAlloc at 3020 is cuMemAlloc_v2 with size_t sizes; at 2000 it would be the 32-bit one).
 * Default-stream flavour: legacy (we only use explicit non-blocking streams, so it never matters).
 *
 * Thread safety: a loaded table is immutable; calls through it are as thread-safe as the driver.
 */
#ifndef PPN_CUDA_DRV_H
#define PPN_CUDA_DRV_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include "core/base/err.h"

/* X(base symbol, ABI version). The field of ppn_cuda_drv is named after the symbol, so call sites read like
 * plain driver code: d->cuMemAlloc(&p, n). (cuda.h maps some names to _v2 spellings by macro; fields and
 * call sites go through the same macro, so they agree, and #name below still yields the base name.)
 * cuEventElapsedTime is pinned at 2000, not at its 12080 _v2: same prototype, and 12.0-12.7 drivers lack _v2. */
#define PPN_CUDA_DRV_ENTRIES(X)            \
    X(cuInit, 2000)                        \
    X(cuDriverGetVersion, 2020)            \
    X(cuGetErrorName, 6000)                \
    X(cuGetErrorString, 6000)              \
    X(cuDeviceGet, 2000)                   \
    X(cuDeviceGetCount, 2000)              \
    X(cuDeviceGetName, 2000)               \
    X(cuDeviceTotalMem, 3020)              \
    X(cuDeviceGetAttribute, 2000)          \
    X(cuDeviceGetPCIBusId, 4010)           \
    X(cuDeviceCanAccessPeer, 4000)         \
    X(cuDevicePrimaryCtxRetain, 7000)      \
    X(cuDevicePrimaryCtxRelease, 11000)    \
    X(cuCtxSetCurrent, 4000)               \
    X(cuCtxEnablePeerAccess, 4000)         \
    X(cuMemGetInfo, 3020)                  \
    X(cuMemAlloc, 3020)                    \
    X(cuMemFree, 3020)                     \
    X(cuMemHostAlloc, 2020)                \
    X(cuMemFreeHost, 2000)                 \
    X(cuMemHostRegister, 6050)             \
    X(cuMemHostUnregister, 4000)           \
    X(cuStreamCreate, 2000)                \
    X(cuStreamDestroy, 4000)               \
    X(cuStreamSynchronize, 2000)           \
    X(cuStreamWaitEvent, 3020)             \
    X(cuEventCreate, 2000)                 \
    X(cuEventDestroy, 4000)                \
    X(cuEventRecord, 2000)                 \
    X(cuEventQuery, 2000)                  \
    X(cuEventSynchronize, 2000)            \
    X(cuEventElapsedTime, 2000)            \
    X(cuMemcpyHtoDAsync, 3020)             \
    X(cuMemcpyDtoHAsync, 3020)             \
    X(cuMemcpyDtoDAsync, 3020)             \
    X(cuMemcpyPeerAsync, 4000)             \
    X(cuMemsetD8Async, 3020)               \
    X(cuModuleLoadData, 2000)              \
    X(cuModuleUnload, 2000)                \
    X(cuModuleGetFunction, 2000)           \
    X(cuLaunchKernel, 4000)                \
    X(cuLaunchKernelEx, 11060)             \
    X(cuFuncSetAttribute, 9000)            \
    X(cuFuncGetAttribute, 2020)            \
    X(cuLaunchHostFunc, 10000)             \
    X(cuStreamBeginCapture, 10010)         \
    X(cuStreamEndCapture, 10000)           \
    X(cuGraphInstantiateWithFlags, 11040)  \
    X(cuGraphLaunch, 10000)                \
    X(cuGraphExecDestroy, 10000)           \
    X(cuGraphDestroy, 10000)           \
    X(cuTensorMapEncodeTiled, 12000)

/* The oldest driver we accept: cuGetProcAddress_v2 (with its symbolStatus out-param) appeared in 12.0. */
#define PPN_CUDA_MIN_DRIVER 12000

typedef struct ppn_cuda_drv {
    void *lib;          /* dlopen handle of libcuda.so.1 */
    int driver_version; /* cuDriverGetVersion, e.g. 13000 */
#define PPN_CUDA_DRV_FIELD_(name, ver) PFN_##name##_v##ver name;
    PPN_CUDA_DRV_ENTRIES(PPN_CUDA_DRV_FIELD_)
#undef PPN_CUDA_DRV_FIELD_
} ppn_cuda_drv;

/* Load libcuda.so.1, resolve every entry point, check the driver version and call cuInit(0).
 * On failure d is left closed (nothing to release).
 * @return PPN_OK, PPN_ENODEV (no libcuda, driver too old, a symbol missing, cuInit failed: e.g. no device). */
ppn_status ppn_cuda_drv_open(ppn_cuda_drv *d);
/* Drop the reference taken by ppn_cuda_drv_open (libcuda itself stays mapped: see cuda_drv.c). */
void ppn_cuda_drv_close(ppn_cuda_drv *d);

/* Turn a failed CUresult into a status with a message naming the driver error, the call and its site.
 * @return PPN_ENOMEM (CUDA_ERROR_OUT_OF_MEMORY), PPN_EDRIVER (anything else). */
ppn_status ppn_cuda_fail(const ppn_cuda_drv *d, CUresult r, const char *call, const char *file, int line);

static inline ppn_status ppn_cuda_result(const ppn_cuda_drv *d, CUresult r, const char *call, const char *file,
                                         int line)
{
    return r == CUDA_SUCCESS ? PPN_OK : ppn_cuda_fail(d, r, call, file, line);
}

#ifdef __FILE_NAME__
#define PPN_CU_FILE_ __FILE_NAME__
#else
#define PPN_CU_FILE_ __FILE__
#endif

/* A checked driver call, as an expression of type ppn_status: PPN_CU(d, cuMemAlloc, &p, n).
 * On failure the message reads "cuda: cuMemAlloc(&p, n) failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)
 * at gpu_cuda.c:123". */
#define PPN_CU(d, fn, ...) \
    ppn_cuda_result((d), (d)->fn(__VA_ARGS__), #fn "(" #__VA_ARGS__ ")", PPN_CU_FILE_, __LINE__)

#endif
