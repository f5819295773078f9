/* safetensors.c - map and validate .safetensors files (single or sharded); see safetensors.h.
 *
 * Everything in a header is untrusted: the header length, every offset and every shape. A file is accepted
 * only when each entry's byte range lies inside the data section, matches shape x dtype size exactly, and no
 * two ranges overlap; only then do views into the mapping exist.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/model/ckpt_internal.h"
#include "core/base/err.h"
#include "core/model/safetensors.h"

#define PPN_ST_MAX_INDEX (100u << 20)

/* ---- mapping and small files -------------------------------------------------------------------------- */

/* What a non-regular file is, for the refusal. */
static const char *file_kind(mode_t m)
{
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

/* O_NONBLOCK: opening a FIFO for reading blocks until a writer appears (forever, for a stray mkfifo), and a
 * device may block too. Nothing is read before fstat says the file is regular, where O_NONBLOCK changes
 * nothing; checking the opened descriptor (not a stat of the path first) leaves no window for a swap. */
ppn_status ppn_map_readonly(const char *path, const uint8_t **base, size_t *len)
{
    ppn_status st = PPN_OK;
    struct stat sb;
    *base = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return ppn_err(PPN_EIO, "%s: open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0) {
        st = ppn_err(PPN_EIO, "%s: fstat: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = ppn_err(PPN_EIO, "%s: is %s, not a regular file", path, file_kind(sb.st_mode));
        goto out;
    }
    if (sb.st_size == 0) goto out;   /* mmap refuses length 0; callers see a 0-byte file and say why */
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        st = ppn_err(PPN_EIO, "%s: mmap of %lld bytes: %s", path, (long long)sb.st_size, strerror(errno));
        goto out;
    }
    *base = m;
    *len = (size_t)sb.st_size;
out:
    close(fd);
    return st;
}

void ppn_unmap(const uint8_t *base, size_t len)
{
    if (base) munmap((void *)base, len);
}

ppn_status ppn_read_text(const char *path, size_t max_len, char **text, size_t *len)
{
    ppn_status st = PPN_OK;
    const uint8_t *m;
    size_t n;
    *text = NULL;
    *len = 0;
    PPN_CHECK(ppn_map_readonly(path, &m, &n));
    if (n > max_len) {
        st = ppn_err(PPN_EFORMAT, "%s: %zu bytes, more than the %zu a config or index file may have", path, n,
                     max_len);
        goto out;
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        st = ppn_err(PPN_ENOMEM, "%s: cannot allocate %zu bytes to read it", path, n + 1);
        goto out;
    }
    if (n) memcpy(buf, m, n);
    buf[n] = '\0';
    *text = buf;
    *len = n;
out:
    ppn_unmap(m, n);
    return st;
}

/* ---- dtypes ------------------------------------------------------------------------------------------- */

typedef struct st_dtype {
    const char *name;
    size_t size;      /* bytes per element; 0 = sub-byte packing that ppn cannot even size-check */
    int ppn;          /* PPN_DTYPE_* or -1 */
} st_dtype;

/* The dtypes of the safetensors format. Unknown strings are malformed; known ones ppn does not load are
 * refused later, only if an expected tensor uses one (extra tensors may be of any valid dtype). */
static const st_dtype k_dtypes[] = {
    {"F32", 4, PPN_DTYPE_F32}, {"BF16", 2, PPN_DTYPE_BF16}, {"F16", 2, PPN_DTYPE_F16},
    {"F64", 8, -1},         {"I64", 8, -1},           {"I32", 4, -1},       {"I16", 2, -1},
    {"I8", 1, -1},          {"U64", 8, -1},           {"U32", 4, -1},       {"U16", 2, -1},
    {"U8", 1, -1},          {"BOOL", 1, -1},          {"F8_E4M3", 1, -1},   {"F8_E5M2", 1, -1},
    {"F8_E8M0", 1, -1},     {"F4", 0, -1},            {"F6_E2M3", 0, -1},   {"F6_E3M2", 0, -1},
};

static const st_dtype *dtype_find(const char *s)
{
    for (size_t i = 0; i < PPN_ARRAY_LEN(k_dtypes); i++)
        if (strcmp(k_dtypes[i].name, s) == 0) return &k_dtypes[i];
    return NULL;
}

/* ---- one header entry --------------------------------------------------------------------------------- */

/* A JSON integer that is >= 0, else -1 (the header's counts and offsets are never negative). */
static int64_t json_nonneg(const json_t *v)
{
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x;
}

static ppn_status entry_dtype(const ppn_st_file *f, const char *name, const json_t *e, ppn_st_tensor *t,
                              size_t *elsize)
{
    const json_t *dt = json_object_get(e, "dtype");
    if (!json_is_string(dt))
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': 'dtype' is missing or not a string", f->path, name);
    const st_dtype *d = dtype_find(json_string_value(dt));
    if (!d)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': unknown dtype \"%.32s\"", f->path, name,
                       json_string_value(dt));
    if (d->size == 0)
        return ppn_err(PPN_EUNSUPPORTED, "%s: tensor '%s': sub-byte dtype %s is not supported", f->path, name,
                       d->name);
    snprintf(t->dtype, sizeof t->dtype, "%s", d->name);
    t->ppn_dtype = d->ppn;
    *elsize = d->size;
    return PPN_OK;
}

/* Shape: an array of non-negative integers whose product (in elements) does not overflow. */
static ppn_status entry_shape(const ppn_st_file *f, const char *name, const json_t *e, ppn_st_tensor *t,
                              uint64_t *count)
{
    const json_t *sh = json_object_get(e, "shape");
    if (!json_is_array(sh))
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': 'shape' is missing or not an array", f->path, name);
    size_t nd = json_array_size(sh);
    if (nd > PPN_ST_MAX_DIM)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", f->path, name, nd,
                       PPN_ST_MAX_DIM);
    uint64_t prod = 1;
    for (size_t i = 0; i < nd; i++) {
        int64_t d = json_nonneg(json_array_get(sh, i));
        if (d < 0)
            return ppn_err(PPN_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", f->path,
                           name, i);
        if (__builtin_mul_overflow(prod, (uint64_t)d, &prod))
            return ppn_err(PPN_EFORMAT, "%s: tensor '%s': shape product overflows", f->path, name);
        t->shape[i] = d;
    }
    t->ndim = (int)nd;
    *count = prod;
    return PPN_OK;
}

/* data_offsets [begin, end] inside the data section, and exactly count x elsize bytes long. */
static ppn_status entry_range(const ppn_st_file *f, const char *name, const json_t *e, uint64_t count,
                              size_t elsize, const uint8_t *data, size_t data_len, ppn_st_tensor *t)
{
    const json_t *off = json_object_get(e, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': 'data_offsets' is missing or not a [begin, end] pair",
                       f->path, name);
    int64_t b = json_nonneg(json_array_get(off, 0)), en = json_nonneg(json_array_get(off, 1));
    if (b < 0 || en < 0)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': data_offsets must be non-negative integers", f->path,
                       name);
    if (b > en)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': data_offsets begin %lld > end %lld", f->path, name,
                       (long long)b, (long long)en);
    if ((uint64_t)en > data_len)
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s': data_offsets end %lld is past the data section (%zu bytes)",
                       f->path, name, (long long)en, data_len);
    uint64_t want;
    if (__builtin_mul_overflow(count, (uint64_t)elsize, &want) || want != (uint64_t)(en - b))
        return ppn_err(PPN_EFORMAT,
                       "%s: tensor '%s': shape x %s size is %llu elements but data_offsets span %lld bytes",
                       f->path, name, t->dtype, (unsigned long long)count, (long long)(en - b));
    t->data = data + b;
    t->nbytes = (size_t)(en - b);
    return PPN_OK;
}

static ppn_status entry_parse(const ppn_st_file *f, const char *name, const json_t *e, const uint8_t *data,
                              size_t data_len, ppn_st_tensor *t)
{
    size_t elsize = 0;
    uint64_t count = 0;
    if (!json_is_object(e)) return ppn_err(PPN_EFORMAT, "%s: tensor '%s': entry is not an object", f->path, name);
    PPN_CHECK(entry_dtype(f, name, e, t, &elsize));
    PPN_CHECK(entry_shape(f, name, e, t, &count));
    PPN_CHECK(entry_range(f, name, e, count, elsize, data, data_len, t));
    t->name = strdup(name);
    if (!t->name) return ppn_err(PPN_ENOMEM, "%s: tensor '%s': out of memory", f->path, name);
    return PPN_OK;
}

/* ---- whole-file checks -------------------------------------------------------------------------------- */

static int cmp_by_begin(const void *a, const void *b)
{
    const ppn_st_tensor *x = *(const ppn_st_tensor *const *)a, *y = *(const ppn_st_tensor *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int cmp_by_name(const void *a, const void *b)
{
    return strcmp(((const ppn_st_tensor *)a)->name, ((const ppn_st_tensor *)b)->name);
}

/* Two views sharing bytes would let a corrupt file alias weights; holes are tolerated (they cost nothing). */
static ppn_status check_overlap(const ppn_st_file *f)
{
    ppn_status st = PPN_OK;
    if (f->n_tensors < 2) return PPN_OK;
    const ppn_st_tensor **by = malloc(f->n_tensors * sizeof *by);
    if (!by) return ppn_err(PPN_ENOMEM, "%s: out of memory checking offsets", f->path);
    for (size_t i = 0; i < f->n_tensors; i++) by[i] = &f->tensors[i];
    qsort(by, f->n_tensors, sizeof *by, cmp_by_begin);
    const ppn_st_tensor *prev = NULL;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ppn_st_tensor *t = by[i];
        if (t->nbytes == 0) continue;
        if (prev && t->data < prev->data + prev->nbytes) {
            st = ppn_err(PPN_EFORMAT, "%s: tensor '%s' overlaps tensor '%s' in the data section", f->path,
                         t->name, prev->name);
            break;
        }
        if (!prev || t->data + t->nbytes > prev->data + prev->nbytes) prev = t;
    }
    free(by);
    return st;
}

static ppn_status parse_entries(ppn_st_file *f, json_t *root, const uint8_t *data, size_t data_len)
{
    const char *key;
    json_t *val;
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) return ppn_err(PPN_ENOMEM, "%s: out of memory for %zu tensor entries", f->path, n);
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;   /* free-form strings; nothing ppn needs */
        PPN_CHECK(entry_parse(f, key, val, data, data_len, &f->tensors[f->n_tensors]));
        f->n_tensors++;
    }
    PPN_CHECK(check_overlap(f));
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, cmp_by_name);
    return PPN_OK;
}

static ppn_status parse_header(ppn_st_file *f)
{
    ppn_status st;
    json_error_t jerr;
    if (f->map_len < 8)
        return ppn_err(PPN_EFORMAT, "%s: file is %zu bytes, shorter than the 8-byte safetensors header length",
                       f->path, f->map_len);
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);   /* little-endian on disk and on every host ppn builds for */
    if (hlen > PPN_ST_MAX_HEADER)
        return ppn_err(PPN_EFORMAT, "%s: header length %llu is absurd (limit %u)", f->path,
                       (unsigned long long)hlen, PPN_ST_MAX_HEADER);
    if (hlen > f->map_len - 8)
        return ppn_err(PPN_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", f->path,
                       (unsigned long long)hlen, f->map_len);
    json_t *root = json_loadb((const char *)f->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ppn_err(PPN_EFORMAT, "%s: header is not valid JSON (byte %d: %s)", f->path, jerr.position,
                       jerr.text);
    if (!json_is_object(root)) {
        st = ppn_err(PPN_EFORMAT, "%s: header is not a JSON object", f->path);
        goto out;
    }
    st = parse_entries(f, root, f->map + 8 + hlen, f->map_len - 8 - (size_t)hlen);
out:
    json_decref(root);
    return st;
}

ppn_status ppn_st_file_open(const char *path, ppn_st_file **out)
{
    ppn_status st;
    *out = NULL;
    ppn_st_file *f = calloc(1, sizeof *f);
    if (!f) return ppn_err(PPN_ENOMEM, "%s: out of memory", path);
    if (strlen(path) >= sizeof f->path) {
        st = ppn_err(PPN_EIO, "%s: path too long", path);
        goto fail;
    }
    strcpy(f->path, path);
    PPN_CHECK_GOTO(ppn_map_readonly(path, &f->map, &f->map_len), st, fail);
    PPN_CHECK_GOTO(parse_header(f), st, fail);
    *out = f;
    return PPN_OK;
fail:
    ppn_st_file_close(f);
    return st;
}

void ppn_st_file_close(ppn_st_file *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    ppn_unmap(f->map, f->map_len);
    free(f);
}

const ppn_st_tensor *ppn_st_file_find(const ppn_st_file *f, const char *name)
{
    ppn_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof *f->tensors, cmp_by_name);
}

/* ---- sets: one file or an index of shards ------------------------------------------------------------- */

static int cmp_route(const void *a, const void *b)
{
    return strcmp(((const ppn_st_route *)a)->name, ((const ppn_st_route *)b)->name);
}

/* A shard name from the index must stay inside the checkpoint directory. */
static int shard_name_ok(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static ppn_status join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) return ppn_err(PPN_EIO, "%s/%s: path too long", dir, name);
    return PPN_OK;
}

/* Index of shard name in s->files (opening it the first time it is named). */
static ppn_status set_shard(ppn_st_set *s, const char *dir, const char *shard, const char *tensor, size_t *idx)
{
    char path[1024];
    PPN_CHECK(join(path, sizeof path, dir, shard));
    for (size_t i = 0; i < s->n_files; i++)
        if (strcmp(s->files[i]->path, path) == 0) {
            *idx = i;
            return PPN_OK;
        }
    ppn_st_file **grown = realloc(s->files, (s->n_files + 1) * sizeof *grown);
    if (!grown) return ppn_err(PPN_ENOMEM, "%s: out of memory", s->index_path);
    s->files = grown;
    ppn_status st = ppn_st_file_open(path, &s->files[s->n_files]);
    if (st != PPN_OK)
        return ppn_err_ctx(st, "%s names shard '%s' (for tensor '%s')", s->index_path, shard, tensor);
    *idx = s->n_files++;
    return PPN_OK;
}

static ppn_status set_route(ppn_st_set *s, const char *dir, const char *tensor, const json_t *v)
{
    if (!json_is_string(v) || !shard_name_ok(json_string_value(v)))
        return ppn_err(PPN_EFORMAT, "%s: weight_map['%s'] is not a file name in the checkpoint directory",
                       s->index_path, tensor);
    const char *shard = json_string_value(v);
    ppn_st_route *r = &s->routes[s->n_routes];
    PPN_CHECK(set_shard(s, dir, shard, tensor, &r->file));
    if (!ppn_st_file_find(s->files[r->file], tensor))
        return ppn_err(PPN_EFORMAT, "%s: tensor '%s' is mapped to %s, which does not contain it", s->index_path,
                       tensor, s->files[r->file]->path);
    r->name = strdup(tensor);
    if (!r->name) return ppn_err(PPN_ENOMEM, "%s: out of memory", s->index_path);
    s->n_routes++;
    return PPN_OK;
}

static ppn_status set_parse_index(ppn_st_set *s, const char *dir, json_t *root)
{
    const char *key;
    json_t *val;
    if (!json_is_object(root)) return ppn_err(PPN_EFORMAT, "%s: not a JSON object", s->index_path);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm))
        return ppn_err(PPN_EFORMAT, "%s: 'weight_map' is missing or not an object", s->index_path);
    if (json_object_size(wm) == 0) return ppn_err(PPN_EFORMAT, "%s: 'weight_map' is empty", s->index_path);
    s->routes = calloc(json_object_size(wm), sizeof *s->routes);
    if (!s->routes) return ppn_err(PPN_ENOMEM, "%s: out of memory", s->index_path);
    json_object_foreach(wm, key, val) PPN_CHECK(set_route(s, dir, key, val));
    qsort(s->routes, s->n_routes, sizeof *s->routes, cmp_route);
    return PPN_OK;
}

static ppn_status set_open_index(ppn_st_set *s, const char *dir)
{
    char *text;
    size_t len;
    json_error_t jerr;
    PPN_CHECK(ppn_read_text(s->index_path, PPN_ST_MAX_INDEX, &text, &len));
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return ppn_err(PPN_EFORMAT, "%s: not valid JSON (line %d: %s)", s->index_path, jerr.line, jerr.text);
    ppn_status st = set_parse_index(s, dir, root);
    json_decref(root);
    return st;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

ppn_status ppn_st_set_open(const char *dir, ppn_st_set **out)
{
    ppn_status st;
    char path[1024];
    *out = NULL;
    ppn_st_set *s = calloc(1, sizeof *s);
    if (!s) return ppn_err(PPN_ENOMEM, "%s: out of memory", dir);
    /* Like transformers: a single model.safetensors wins over an index. */
    PPN_CHECK_GOTO(join(path, sizeof path, dir, "model.safetensors"), st, fail);
    if (exists(path)) {
        s->files = calloc(1, sizeof *s->files);
        if (!s->files) {
            st = ppn_err(PPN_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        PPN_CHECK_GOTO(ppn_st_file_open(path, &s->files[0]), st, fail);
        s->n_files = 1;
    } else {
        PPN_CHECK_GOTO(join(s->index_path, sizeof s->index_path, dir, "model.safetensors.index.json"), st, fail);
        if (!exists(s->index_path)) {
            st = ppn_err(PPN_EIO, "%s: no model.safetensors and no model.safetensors.index.json", dir);
            goto fail;
        }
        PPN_CHECK_GOTO(set_open_index(s, dir), st, fail);
    }
    *out = s;
    return PPN_OK;
fail:
    ppn_st_set_close(s);
    return st;
}

void ppn_st_set_close(ppn_st_set *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) ppn_st_file_close(s->files[i]);
    free(s->files);
    for (size_t i = 0; i < s->n_routes; i++) free(s->routes[i].name);
    free(s->routes);
    free(s);
}

const ppn_st_tensor *ppn_st_set_find(const ppn_st_set *s, const char *name, const char **file)
{
    if (!s->index_path[0]) {
        *file = s->files[0]->path;
        return ppn_st_file_find(s->files[0], name);
    }
    ppn_st_route key = {.name = (char *)name};
    const ppn_st_route *r = bsearch(&key, s->routes, s->n_routes, sizeof *s->routes, cmp_route);
    if (!r) {
        *file = s->index_path;
        return NULL;
    }
    *file = s->files[r->file]->path;
    return ppn_st_file_find(s->files[r->file], name);
}
