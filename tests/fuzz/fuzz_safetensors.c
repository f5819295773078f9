/* fuzz_safetensors.c - one .safetensors file (8-byte header length, JSON header, data section) through
 * ppn_st_file_open: every accepted tensor's view must lie inside the mapping and match shape x dtype, and no two
 * views may share bytes (safetensors.c's promises, checked again here, independently). */
#include "core/model/safetensors.h"
#include "fuzz_util.h"

static size_t dtype_size(const char *d)
{
    static const struct { const char *name; size_t size; } k[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"BF16", 2}, {"F16", 2}, {"I16", 2},
        {"U16", 2}, {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(k[i].name, d)) return k[i].size;
    return 0;
}

static void check(const ppn_st_file *f)
{
    const uint8_t *lo = f->map, *hi = f->map + f->map_len;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ppn_st_tensor *t = &f->tensors[i];
        uint64_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (uint64_t)t->shape[d];
        if (t->ndim < 0 || t->ndim > PPN_ST_MAX_DIM || t->data < lo || t->nbytes > (size_t)(hi - t->data) ||
            count * dtype_size(t->dtype) != t->nbytes || ppn_st_file_find(f, t->name) != t)
            abort();
        for (size_t j = 0; j < i; j++) {
            const ppn_st_tensor *u = &f->tensors[j];
            if (t->nbytes && u->nbytes && t->data < u->data + u->nbytes && u->data < t->data + t->nbytes) abort();
        }
        volatile uint8_t sink = 0;   /* touch the view's ends: ASan would see a view past the mapping */
        if (t->nbytes) sink ^= t->data[0] ^ t->data[t->nbytes - 1];
        (void)sink;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ppn_st_file *f = NULL;
    if (ppn_st_file_open(fz_memfd(data, size), &f) == PPN_OK) {
        if (f->n_tensors <= 4096) check(f);   /* the pairwise overlap check is quadratic */
        ppn_st_file_close(f);
    }
    return 0;
}
