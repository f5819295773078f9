/* safetensors.h - validated read-only views of .safetensors files, single or sharded through
 * model.safetensors.index.json.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then
 * the data section; offsets are relative to its start. Every entry is checked against the mapping when the
 * file is opened (types, dims, overflow, range, overlap, size = shape x dtype), so a view handed out never
 * reaches outside the file whatever the header says.
 */
#ifndef PPN_SAFETENSORS_H
#define PPN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include "ppn.h"

#define PPN_ST_MAX_DIM 8
#define PPN_ST_MAX_HEADER (100u << 20)  /* real headers are < 1 MB; more is corruption or an attack */

typedef struct ppn_st_tensor {
    char *name;
    char dtype[16];           /* as written: "F32", "BF16", "F64", ... */
    int ppn_dtype;            /* PPN_DTYPE_* or -1: a valid dtype ppn does not load */
    int ndim;
    int64_t shape[PPN_ST_MAX_DIM];
    const uint8_t *data;      /* inside the mapping */
    size_t nbytes;
} ppn_st_tensor;

typedef struct ppn_st_file {
    char path[1024];
    const uint8_t *map;       /* whole file, PROT_READ / MAP_PRIVATE */
    size_t map_len;
    ppn_st_tensor *tensors;   /* sorted by name */
    size_t n_tensors;
} ppn_st_file;

typedef struct ppn_st_route {
    char *name;
    size_t file;              /* index into ppn_st_set.files */
} ppn_st_route;

/* A checkpoint's weights: one file, or the shards an index names. Immutable once opened. */
typedef struct ppn_st_set {
    ppn_st_file **files;
    size_t n_files;
    char index_path[1024];    /* "" for a single model.safetensors */
    ppn_st_route *routes;     /* sharded only: weight_map sorted by name */
    size_t n_routes;
} ppn_st_set;

/* Map and validate one file. Returns PPN_OK, PPN_EIO (open/stat/mmap), PPN_EFORMAT (names the file and the
 * tensor or the header defect), PPN_EUNSUPPORTED (sub-byte dtypes), PPN_ENOMEM. *out NULL on failure. */
ppn_status ppn_st_file_open(const char *path, ppn_st_file **out);
void ppn_st_file_close(ppn_st_file *f);
const ppn_st_tensor *ppn_st_file_find(const ppn_st_file *f, const char *name);

/* Open dir/model.safetensors, or else dir/model.safetensors.index.json and every shard it names (each
 * validated; each tensor it routes must be in its shard). Returns PPN_OK, PPN_EIO (neither present, or a
 * file missing), PPN_EFORMAT, PPN_EUNSUPPORTED, PPN_ENOMEM. *out NULL on failure. */
ppn_status ppn_st_set_open(const char *dir, ppn_st_set **out);
void ppn_st_set_close(ppn_st_set *s);

/* Find a tensor; NULL if absent. *file gets the path that holds it, or the one to name when it is
 * missing (the single file or the index). */
const ppn_st_tensor *ppn_st_set_find(const ppn_st_set *s, const char *name, const char **file);

#endif
