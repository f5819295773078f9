/* cuda_drv.c - load libcuda.so.1 with dlopen and fill the entry-point table through cuGetProcAddress. */
#include <dlfcn.h>
#include <string.h>
#include "core/device/cuda_drv.h"

/* Flavour of the stream-taking entry points: legacy default stream. ppn never uses the NULL stream, so this
 * only pins the choice instead of letting the driver pick from the environment. */
#define PPN_CUDA_PROC_FLAGS CU_GET_PROC_ADDRESS_LEGACY_STREAM

static const char *cu_sym_status_name(CUdriverProcAddressQueryResult s)
{
    switch (s) {
    case CU_GET_PROC_ADDRESS_SUCCESS: return "found";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: return "symbol not found";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: return "not available at that ABI version";
    }
    return "unknown symbolStatus";
}

/* Resolve one entry point at its pinned ABI version. A null pointer with CUDA_SUCCESS is how the driver says
 * "no such symbol", so both the result and symbolStatus are checked. */
static ppn_status cu_resolve(PFN_cuGetProcAddress_v12000 gpa, const char *sym, int ver, void **out)
{
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = gpa(sym, out, ver, PPN_CUDA_PROC_FLAGS, &status);
    if (r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || !*out) {
        *out = NULL;
        return ppn_err(PPN_ENODEV, "cuda: the driver lacks %s at ABI %d (cuGetProcAddress returned %d, %s)",
                       sym, ver, (int)r, cu_sym_status_name(status));
    }
    return PPN_OK;
}

static ppn_status cu_resolve_all(ppn_cuda_drv *d, PFN_cuGetProcAddress_v12000 gpa)
{
    void *p;
#define PPN_CUDA_DRV_RESOLVE_(name, ver)             \
    PPN_CHECK(cu_resolve(gpa, #name, ver, &p));      \
    d->name = (PFN_##name##_v##ver)p;
    PPN_CUDA_DRV_ENTRIES(PPN_CUDA_DRV_RESOLVE_)
#undef PPN_CUDA_DRV_RESOLVE_
    return PPN_OK;
}

/* Version first: a message saying "driver 11.4, need 12.0" beats one about a missing symbol.
 * cuDriverGetVersion works before cuInit. */
static ppn_status cu_check_version(ppn_cuda_drv *d, PFN_cuGetProcAddress_v12000 gpa)
{
    void *p;
    PPN_CHECK(cu_resolve(gpa, "cuDriverGetVersion", 2020, &p));
    d->cuDriverGetVersion = (PFN_cuDriverGetVersion_v2020)p;
    PPN_CHECK(PPN_CU(d, cuDriverGetVersion, &d->driver_version));
    if (d->driver_version < PPN_CUDA_MIN_DRIVER)
        return ppn_err(PPN_ENODEV, "cuda: driver supports CUDA %d.%d, ppn needs %d.%d or newer",
                       d->driver_version / 1000, d->driver_version % 1000 / 10, PPN_CUDA_MIN_DRIVER / 1000,
                       PPN_CUDA_MIN_DRIVER % 1000 / 10);
    return PPN_OK;
}

/* cuInit must precede every other call but the version query; it is cheap to repeat, and the driver makes it
 * process-wide, so each table calls it once. Any failure (CUDA_ERROR_NO_DEVICE, a driver/kernel-module
 * mismatch...) means no usable device: PPN_ENODEV, with the driver's error name kept in the message. */
static ppn_status cu_init(ppn_cuda_drv *d)
{
    ppn_status st = PPN_CU(d, cuInit, 0);
    if (st != PPN_OK) return ppn_err_ctx(PPN_ENODEV, "no usable device");
    return PPN_OK;
}

ppn_status ppn_cuda_drv_open(ppn_cuda_drv *d)
{
    ppn_status st = PPN_OK;
    memset(d, 0, sizeof *d);
    /* RTLD_NODELETE: the driver starts threads (host-function and event workers) that may outlive our last
     * context release; unmapping libcuda under them would crash. dlclose only drops our reference. */
    d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!d->lib) return ppn_err(PPN_ENODEV, "cuda: cannot dlopen libcuda.so.1: %s", dlerror());
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(d->lib, "cuGetProcAddress_v2");
    if (!gpa) {
        st = ppn_err(PPN_ENODEV, "cuda: libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12.0)");
        goto out;
    }
    PPN_CHECK_GOTO(cu_check_version(d, gpa), st, out);
    PPN_CHECK_GOTO(cu_resolve_all(d, gpa), st, out);
    PPN_CHECK_GOTO(cu_init(d), st, out);
out:
    if (st != PPN_OK) ppn_cuda_drv_close(d);
    return st;
}

void ppn_cuda_drv_close(ppn_cuda_drv *d)
{
    if (d->lib) dlclose(d->lib);
    memset(d, 0, sizeof *d);
}

ppn_status ppn_cuda_fail(const ppn_cuda_drv *d, CUresult r, const char *call, const char *file, int line)
{
    const char *name = NULL, *desc = NULL;
    /* These two only fail on an unknown code; fall back to the number rather than recurse. */
    if (d->cuGetErrorName && d->cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (d->cuGetErrorString && d->cuGetErrorString(r, &desc) != CUDA_SUCCESS) desc = NULL;
    char num[32];
    if (!name) {
        snprintf(num, sizeof num, "CUresult %d", (int)r);
        name = num;
    }
    ppn_status st = r == CUDA_ERROR_OUT_OF_MEMORY ? PPN_ENOMEM : PPN_EDRIVER;
    return ppn_err(st, "cuda: %s failed: %s (%s) at %s:%d", call, name, desc ? desc : "no description", file,
                   line);
}
