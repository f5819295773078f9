/* fuzz_index.c - a sharded checkpoint's model.safetensors.index.json through ppn_st_set_open. The directory holds
 * two valid shards (a.safetensors: x, y; b.safetensors: z, w) that the index may name; the part of the input
 * after its first NUL byte, when there is one, becomes a third shard, c.safetensors. Every tensor the set routes
 * must come back from ppn_st_set_find inside its shard's mapping. */
#include "core/model/safetensors.h"
#include "fuzz_util.h"

/* A safetensors file: header length, header, then data bytes (zeros). */
static void put_shard(const char *name, const char *header, size_t data_len)
{
    size_t hlen = strlen(header);
    uint8_t buf[512] = {0};
    if (8 + hlen + data_len > sizeof buf) abort();
    uint64_t h = hlen;
    memcpy(buf, &h, 8);   /* little-endian host: the loaders assume it too */
    memcpy(buf + 8, header, hlen);
    fz_put(name, buf, 8 + hlen + data_len);
}

static void setup(void)
{
    static int done;
    if (done) return;
    done = 1;
    put_shard("a.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"y\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}}", 12);
    put_shard("b.safetensors", "{\"z\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                               "\"w\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]},"
                               "\"__metadata__\":{\"format\":\"pt\"}}", 12);
}

static void check(const ppn_st_set *s)
{
    for (size_t i = 0; i < s->n_routes; i++) {
        const char *file = NULL;
        const ppn_st_tensor *t = ppn_st_set_find(s, s->routes[i].name, &file);
        if (!t || !file || s->routes[i].file >= s->n_files) abort();
        const ppn_st_file *f = s->files[s->routes[i].file];
        if (t->data < f->map || t->nbytes > (size_t)(f->map + f->map_len - t->data)) abort();
    }
    const char *file = NULL;
    if (ppn_st_set_find(s, "no such tensor", &file) || !file) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *shard;
    size_t index_len, shard_len;
    setup();
    fz_split(data, size, &shard, &index_len, &shard_len);
    fz_put("model.safetensors.index.json", data, index_len);
    fz_put("c.safetensors", shard, shard_len);
    ppn_st_set *s = NULL;
    if (ppn_st_set_open(fz_dir(), &s) == PPN_OK) {
        check(s);
        ppn_st_set_close(s);
    }
    return 0;
}
