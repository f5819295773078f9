/* test_loader.c - checkpoint loaders (HF safetensors single/sharded, llama2.c .bin), config parsing, mkmodel.
 *
 * Expected values come from outside the code under test: the fixtures' config.json and safetensors headers are
 * read here with jansson, the llama2.c layout is recomputed here from its format, and the mkmodel shapes are
 * the ones the issue specifies. Malformed inputs are made from a valid generated checkpoint in a temp dir,
 * then corrupted one defect at a time; each must fail with its status, a message naming the file and the
 * tensor or field, *out NULL, and no leak (the ASan build runs this same test).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/model/ckpt.h"
#include "core/rt.h"
#include "tests/util/trand.h"
#include "tests/util/tutil.h"

/* ---- files and temp dirs ------------------------------------------------------------------------------ */

static void path_join(char *buf, size_t cap, const char *a, const char *b)
{
    int n = snprintf(buf, cap, "%s/%s", a, b);
    assert_true(n > 0 && (size_t)n < cap);
}

/* tu_fixture's path into buf; the test fails when the fixture is missing. */
static void fixture_path(char *buf, size_t cap, const char *rel)
{
    struct stat sb;
    int n = snprintf(buf, cap, "%s", tu_fixture(rel));
    assert_true(n > 0 && (size_t)n < cap);
    if (stat(buf, &sb) != 0) fail_msg("fixture missing: %s (set PPN_FIXTURES)", buf);
}

/* The whole file (NUL-terminated); the test fails when it cannot be read. */
static uint8_t *read_all(const char *path, size_t *len)
{
    uint8_t *buf = tu_read_file(path, len);
    if (!buf) fail_msg("cannot read %s", path);
    return buf;
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    uint8_t *b = read_all(from, &n);
    tu_write_file(to, b, n);
    free(b);
}

/* Each TMP_TEST gets a fresh temp dir as its state, removed after. */
static int setup_tmp(void **state)
{
    *state = tu_tmpdir();
    return *state ? 0 : -1;
}

static int teardown_tmp(void **state)
{
    tu_rmrf(*state);
    free(*state);
    return 0;
}

/* A subdirectory of the test's temp dir. */
static void sub_dir(char *buf, size_t cap, void **state, const char *name)
{
    path_join(buf, cap, (const char *)*state, name);
}

/* ---- safetensors images, parsed here independently of the loader ------------------------------------- */

typedef struct st_img {
    json_t *hdr;
    uint8_t *data;      /* the data section */
    size_t data_len;
} st_img;

static st_img st_load(const char *path)
{
    size_t n;
    uint8_t *b = read_all(path, &n);
    uint64_t hlen;
    json_error_t jerr;
    assert_true(n >= 8);
    memcpy(&hlen, b, 8);
    assert_true(hlen <= n - 8);
    st_img im = {.hdr = json_loadb((const char *)b + 8, hlen, 0, &jerr)};
    if (!im.hdr) fail_msg("%s: test could not parse the header: %s", path, jerr.text);
    im.data_len = n - 8 - hlen;
    im.data = malloc(im.data_len + 1);
    assert_non_null(im.data);
    memcpy(im.data, b + 8 + hlen, im.data_len);
    free(b);
    return im;
}

/* Write hdr (compact JSON, then pad spaces) + data. */
static void st_save(const char *path, json_t *hdr, const uint8_t *data, size_t data_len, size_t pad)
{
    char *s = json_dumps(hdr, JSON_COMPACT);
    assert_non_null(s);
    size_t k = strlen(s);
    uint64_t hlen = k + pad;
    size_t total = 8 + hlen + data_len;
    uint8_t *b = malloc(total);
    assert_non_null(b);
    memcpy(b, &hlen, 8);
    memcpy(b + 8, s, k);
    memset(b + 8 + k, ' ', pad);
    memcpy(b + 8 + hlen, data, data_len);
    tu_write_file(path, b, total);
    free(b);
    free(s);
}

static void st_free(st_img *im)
{
    json_decref(im->hdr);
    free(im->data);
}

static json_t *st_entry(st_img *im, const char *name)
{
    json_t *e = json_object_get(im->hdr, name);
    if (!e) fail_msg("test: tensor %s not in header", name);
    return e;
}

static int64_t st_off(st_img *im, const char *name, int i)
{
    return json_integer_value(json_array_get(json_object_get(st_entry(im, name), "data_offsets"), (size_t)i));
}

/* ---- checking an open checkpoint --------------------------------------------------------------------- */

/* Open must fail with st, *out NULL, and a message holding every given substring. */
static void expect_open_fails(const char *path, ppn_status st, const char *sub1, const char *sub2)
{
    ppn_ckpt *c = (ppn_ckpt *)(uintptr_t)1;
    ppn_status got = ppn_ckpt_open(path, &c);
    const char *msg = ppn_last_error();
    if (got != st) fail_msg("open %s: got %s (%s), expected %s", path, ppn_status_name(got), msg,
                            ppn_status_name(st));
    assert_null(c);
    if (sub1 && !strstr(msg, sub1)) fail_msg("message '%s' does not name '%s'", msg, sub1);
    if (sub2 && !strstr(msg, sub2)) fail_msg("message '%s' does not name '%s'", msg, sub2);
}

static ppn_ckpt *open_ok(const char *path)
{
    ppn_ckpt *c = NULL;
    ppn_status st = ppn_ckpt_open(path, &c);
    if (st != PPN_OK) fail_msg("open %s: %s: %s", path, ppn_status_name(st), ppn_last_error());
    assert_non_null(c);
    return c;
}

static void expect_shape(const ppn_tensor *t, const char *what, int ndim, int64_t d0, int64_t d1)
{
    if (!t->data) fail_msg("%s: not bound", what);
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        fail_msg("%s: shape [%lld, %lld] (ndim %d), expected [%lld, %lld] (ndim %d)", what,
                 (long long)t->shape[0], (long long)t->shape[1], t->ndim, (long long)d0, (long long)d1, ndim);
}

/* The layer tensors as the test knows them: HF suffix, ppn field, expected dims. */
typedef struct layer_spec {
    const char *suffix;
    size_t field;
    int ndim;
    int64_t d0, d1;
} layer_spec;

static size_t layer_specs(const ppn_model_config *g, int bias, int qknorm, layer_spec out[16])
{
    int64_t q = (int64_t)g->n_heads * g->head_dim, kv = (int64_t)g->n_kv_heads * g->head_dim;
    size_t n = 0;
#define SPEC(s, f, nd, a, b) out[n++] = (layer_spec){s, offsetof(ppn_layer_tensors, f), nd, a, b}
    SPEC("input_layernorm.weight", attn_norm, 1, g->dim, 0);
    SPEC("self_attn.q_proj.weight", wq, 2, q, g->dim);
    SPEC("self_attn.k_proj.weight", wk, 2, kv, g->dim);
    SPEC("self_attn.v_proj.weight", wv, 2, kv, g->dim);
    SPEC("self_attn.o_proj.weight", wo, 2, g->dim, q);
    SPEC("post_attention_layernorm.weight", ffn_norm, 1, g->dim, 0);
    SPEC("mlp.gate_proj.weight", w_gate, 2, g->ffn_dim, g->dim);
    SPEC("mlp.up_proj.weight", w_up, 2, g->ffn_dim, g->dim);
    SPEC("mlp.down_proj.weight", w_down, 2, g->dim, g->ffn_dim);
    if (bias) {
        SPEC("self_attn.q_proj.bias", bq, 1, q, 0);
        SPEC("self_attn.k_proj.bias", bk, 1, kv, 0);
        SPEC("self_attn.v_proj.bias", bv, 1, kv, 0);
    }
    if (qknorm) {
        SPEC("self_attn.q_norm.weight", q_norm, 1, g->head_dim, 0);
        SPEC("self_attn.k_norm.weight", k_norm, 1, g->head_dim, 0);
    }
#undef SPEC
    return n;
}

static const ppn_tensor *field(const ppn_layer_tensors *L, size_t off)
{
    return (const ppn_tensor *)((const char *)L + off);
}

/* The view must hold exactly the bytes the header says, with the header's shape and dtype. */
static void expect_matches_file(const ppn_tensor *t, st_img *im, const char *name)
{
    json_t *e = st_entry(im, name), *sh = json_object_get(e, "shape");
    assert_string_equal(json_string_value(json_object_get(e, "dtype")), "F32");
    assert_int_equal(t->dtype, PPN_DTYPE_F32);
    assert_int_equal(t->ndim, (int)json_array_size(sh));
    for (int i = 0; i < t->ndim; i++) assert_int_equal(t->shape[i], json_integer_value(json_array_get(sh, (size_t)i)));
    int64_t b = st_off(im, name, 0), en = st_off(im, name, 1);
    assert_int_equal(t->nbytes, (size_t)(en - b));
    if (memcmp(t->data, im->data + b, t->nbytes) != 0) fail_msg("%s: view bytes differ from the file", name);
}

/* ---- HF fixtures -------------------------------------------------------------------------------------- */

static int jint(json_t *cfg, const char *key, int dflt)
{
    json_t *v = json_object_get(cfg, key);
    return v && !json_is_null(v) ? (int)json_integer_value(v) : dflt;
}

static int jtoken(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_array(v)) v = json_array_get(v, 0);
    return v && json_is_integer(v) ? (int)json_integer_value(v) : -1;
}

static void check_fixture_config(const ppn_model_config *g, json_t *j, int arch)
{
    assert_int_equal(g->arch, arch);
    assert_string_equal(g->arch_name, json_string_value(json_array_get(json_object_get(j, "architectures"), 0)));
    assert_int_equal(g->dim, jint(j, "hidden_size", -1));
    assert_int_equal(g->n_layers, jint(j, "num_hidden_layers", -1));
    assert_int_equal(g->n_heads, jint(j, "num_attention_heads", -1));
    assert_int_equal(g->n_kv_heads, jint(j, "num_key_value_heads", g->n_heads));
    assert_int_equal(g->head_dim, jint(j, "head_dim", jint(j, "hidden_size", 0) / jint(j, "num_attention_heads", 1)));
    assert_int_equal(g->ffn_dim, jint(j, "intermediate_size", -1));
    assert_int_equal(g->vocab, jint(j, "vocab_size", -1));
    assert_int_equal(g->max_pos, jint(j, "max_position_embeddings", -1));
    assert_float_equal(g->norm_eps, json_number_value(json_object_get(j, "rms_norm_eps")), 1e-12);
    json_t *rp = json_object_get(j, "rope_parameters");
    assert_non_null(rp);
    assert_float_equal(g->rope_theta, json_number_value(json_object_get(rp, "rope_theta")), 1e-9);
    assert_int_equal(g->rope_type, PPN_ROPE_DEFAULT);
    assert_int_equal(g->rope_interleaved, 0);
    assert_int_equal(g->tied_embeddings, json_is_true(json_object_get(j, "tie_word_embeddings")));
    assert_int_equal(g->qkv_bias, arch == PPN_ARCH_QWEN2);
    assert_int_equal(g->qk_norm, arch == PPN_ARCH_QWEN3);
    assert_int_equal(g->bos_id, jtoken(j, "bos_token_id"));
    assert_int_equal(g->eos_id, jtoken(j, "eos_token_id"));
}

static void check_fixture(const char *name, int arch)
{
    char dir[1024], p[1200];
    size_t n;
    fixture_path(dir, sizeof dir, name);
    path_join(p, sizeof p, dir, "config.json");
    char *text = (char *)read_all(p, &n);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr);
    free(text);
    assert_non_null(j);
    path_join(p, sizeof p, dir, "model.safetensors");
    st_img im = st_load(p);

    ppn_ckpt *c = open_ok(dir);
    check_fixture_config(&c->cfg, j, arch);
    const ppn_model_config *g = &c->cfg;
    expect_matches_file(&c->embed, &im, "model.embed_tokens.weight");
    expect_shape(&c->embed, "embed", 2, g->vocab, g->dim);
    expect_matches_file(&c->final_norm, &im, "model.norm.weight");
    expect_shape(&c->final_norm, "final_norm", 1, g->dim, 0);
    if (g->tied_embeddings) {
        assert_ptr_equal(c->lm_head.data, c->embed.data);
    } else {
        assert_ptr_not_equal(c->lm_head.data, c->embed.data);
        expect_matches_file(&c->lm_head, &im, "lm_head.weight");
    }
    expect_shape(&c->lm_head, "lm_head", 2, g->vocab, g->dim);

    layer_spec spec[16];
    size_t ns = layer_specs(g, arch == PPN_ARCH_QWEN2, arch == PPN_ARCH_QWEN3, spec);
    for (int l = 0; l < g->n_layers; l++)
        for (size_t i = 0; i < ns; i++) {
            char tname[160];
            snprintf(tname, sizeof tname, "model.layers.%d.%s", l, spec[i].suffix);
            const ppn_tensor *t = field(&c->layers[l], spec[i].field);
            expect_shape(t, tname, spec[i].ndim, spec[i].d0, spec[i].d1);
            expect_matches_file(t, &im, tname);
        }
    /* Optional tensors the architecture does not have stay absent. */
    if (arch != PPN_ARCH_QWEN2) assert_null(c->layers[0].bq.data);
    if (arch != PPN_ARCH_QWEN3) assert_null(c->layers[0].q_norm.data);
    ppn_ckpt_close(c);
    st_free(&im);
    json_decref(j);
}

static void test_loader_fixture_llama(void **state) { check_fixture("hf/llama-tiny", PPN_ARCH_LLAMA); }
static void test_loader_fixture_qwen2(void **state) { check_fixture("hf/qwen2-tiny", PPN_ARCH_QWEN2); }
static void test_loader_fixture_qwen3(void **state) { check_fixture("hf/qwen3-tiny", PPN_ARCH_QWEN3); }

/* ---- llama2.c ----------------------------------------------------------------------------------------- */

static void expect_bytes_at(const ppn_tensor *t, const uint8_t *file, size_t off, const char *what)
{
    if (memcmp(t->data, file + off, t->nbytes) != 0) fail_msg("%s: view differs from file bytes at %zu", what, off);
}

static void test_loader_llama2c_stories(void **state)
{
    char p[1024];
    size_t n;
    fixture_path(p, sizeof p, "llama2c/stories260K.bin");
    uint8_t *file = read_all(p, &n);
    int32_t h[7];
    memcpy(h, file, sizeof h);
    ppn_ckpt *c = open_ok(p);
    const ppn_model_config *g = &c->cfg;
    /* README values */
    assert_int_equal(g->arch, PPN_ARCH_LLAMA2C);
    assert_string_equal(g->arch_name, "llama2.c");
    assert_int_equal(g->dim, 64);
    assert_int_equal(g->ffn_dim, 172);
    assert_int_equal(g->n_layers, 5);
    assert_int_equal(g->n_heads, 8);
    assert_int_equal(g->n_kv_heads, 4);
    assert_int_equal(g->vocab, 512);
    assert_int_equal(g->max_pos, 512);
    assert_int_equal(g->head_dim, 8);
    assert_int_equal(g->tied_embeddings, 1);
    assert_int_equal(g->rope_interleaved, 1);
    assert_int_equal(g->bos_id, 1);
    assert_int_equal(g->eos_id, -1);
    assert_float_equal(g->rope_theta, 10000.0, 0);
    assert_float_equal(g->norm_eps, 1e-5, 1e-12);
    assert_int_equal(h[5], 512);   /* positive: shared classifier */
    /* first floats of the embedding are the bytes right after the 28-byte header */
    assert_int_equal(memcmp(c->embed.data, file + 28, 16 * sizeof(float)), 0);
    assert_ptr_equal(c->lm_head.data, c->embed.data);
    expect_shape(&c->embed, "embed", 2, 512, 64);

    /* The layout recomputed from the format: offsets in floats after the header. */
    size_t D = 64, F = 172, L = 5, KV = 32, V = 512, off = 7 * 4, f4 = 4;
    size_t rms_att = off + V * D * f4, wq = rms_att + L * D * f4, wk = wq + L * D * D * f4;
    size_t wv = wk + L * KV * D * f4, wo = wv + L * KV * D * f4, rms_ffn = wo + L * D * D * f4;
    size_t w1 = rms_ffn + L * D * f4, w2 = w1 + L * F * D * f4, w3 = w2 + L * D * F * f4;
    size_t fin = w3 + L * F * D * f4;
    assert_int_equal(fin + D * f4 + 2 * 512 * 4 * f4, n);   /* + freq_cis real/imag [seq, hs/2] */
    for (size_t l = 0; l < L; l++) {
        const ppn_layer_tensors *y = &c->layers[l];
        expect_shape(&y->wk, "wk", 2, (int64_t)KV, (int64_t)D);
        expect_shape(&y->w_down, "w2", 2, (int64_t)D, (int64_t)F);
        expect_bytes_at(&y->attn_norm, file, rms_att + l * D * f4, "rms_att");
        expect_bytes_at(&y->wq, file, wq + l * D * D * f4, "wq");
        expect_bytes_at(&y->wk, file, wk + l * KV * D * f4, "wk");
        expect_bytes_at(&y->wv, file, wv + l * KV * D * f4, "wv");
        expect_bytes_at(&y->wo, file, wo + l * D * D * f4, "wo");
        expect_bytes_at(&y->ffn_norm, file, rms_ffn + l * D * f4, "rms_ffn");
        expect_bytes_at(&y->w_gate, file, w1 + l * F * D * f4, "w1");
        expect_bytes_at(&y->w_down, file, w2 + l * D * F * f4, "w2");
        expect_bytes_at(&y->w_up, file, w3 + l * F * D * f4, "w3");
    }
    expect_bytes_at(&c->final_norm, file, fin, "rms_final");
    ppn_ckpt_close(c);
    free(file);
}

static void test_loader_llama2c_malformed(void **state)
{
    char src[1024], p[1200];
    size_t n;
    fixture_path(src, sizeof src, "llama2c/stories260K.bin");
    uint8_t *file = read_all(src, &n);
    sub_dir(p, sizeof p, state, "m.bin");
    /* cut inside w3: the header, token_embedding .. w2 (floats, README sizes), and a little more */
    tu_write_file(p, file, 28 + 4 * (32768 + 320 + 20480 + 10240 + 10240 + 20480 + 320 + 55040 + 55040) + 100);
    expect_open_fails(p, PPN_EFORMAT, "m.bin", "'w3'");
    tu_write_file(p, file, 20);
    expect_open_fails(p, PPN_EFORMAT, "m.bin", "28-byte");
    uint8_t *longer = calloc(1, n + 4);
    assert_non_null(longer);
    memcpy(longer, file, n);
    tu_write_file(p, longer, n + 4);
    expect_open_fails(p, PPN_EFORMAT, "m.bin", "4 bytes follow");
    int32_t unshared = -512;   /* claims a classifier the file does not have */
    memcpy(longer + 20, &unshared, 4);
    tu_write_file(p, longer, n);
    expect_open_fails(p, PPN_EFORMAT, "m.bin", "'wcls'");
    int32_t heads = 7;         /* 64 % 7 != 0 */
    memcpy(longer, file, 28);
    memcpy(longer + 12, &heads, 4);
    tu_write_file(p, longer, n);
    expect_open_fails(p, PPN_EFORMAT, "m.bin", "n_heads 7");
    free(longer);
    free(file);
}

/* ---- config parsing ----------------------------------------------------------------------------------- */

static const char *k_cfg4 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2048, \"intermediate_size\": 8192,"
    " \"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
    " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 128000,"
    " \"eos_token_id\": [128001, 128008, 128009], \"torch_dtype\": \"bfloat16\"}";

static const char *k_cfg5 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2048, \"intermediate_size\": 8192,"
    " \"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"head_dim\": 64,"
    " \"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"
    " \"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", \"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192},"
    " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 128000,"
    " \"eos_token_id\": 128001, \"dtype\": \"bfloat16\"}";

static void expect_same_config(const ppn_model_config *a, const ppn_model_config *b)
{
    assert_int_equal(a->arch, b->arch);
    assert_string_equal(a->arch_name, b->arch_name);
    assert_int_equal(a->n_layers, b->n_layers);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->n_heads, b->n_heads);
    assert_int_equal(a->n_kv_heads, b->n_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->ffn_dim, b->ffn_dim);
    assert_int_equal(a->vocab, b->vocab);
    assert_int_equal(a->max_pos, b->max_pos);
    assert_true(a->norm_eps == b->norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->rope_type, b->rope_type);
    assert_true(a->rope_factor == b->rope_factor);
    assert_true(a->rope_low_freq_factor == b->rope_low_freq_factor);
    assert_true(a->rope_high_freq_factor == b->rope_high_freq_factor);
    assert_int_equal(a->rope_orig_max_pos, b->rope_orig_max_pos);
    assert_int_equal(a->rope_interleaved, b->rope_interleaved);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->tied_embeddings, b->tied_embeddings);
    assert_int_equal(a->bos_id, b->bos_id);
    assert_int_equal(a->eos_id, b->eos_id);
}

static void test_loader_config_spellings(void **state)
{
    ppn_model_config a, b;
    assert_int_equal(ppn_config_parse(k_cfg4, strlen(k_cfg4), "v4/config.json", &a), PPN_OK);
    assert_int_equal(ppn_config_parse(k_cfg5, strlen(k_cfg5), "v5/config.json", &b), PPN_OK);
    expect_same_config(&a, &b);
    assert_int_equal(a.arch, PPN_ARCH_LLAMA);
    assert_int_equal(a.head_dim, 64);             /* derived in 4.x, explicit in 5.x */
    assert_int_equal(a.rope_type, PPN_ROPE_LLAMA3);
    assert_float_equal(a.rope_theta, 500000.0, 0);
    assert_float_equal(a.rope_factor, 32.0, 0);
    assert_float_equal(a.rope_low_freq_factor, 1.0, 0);
    assert_float_equal(a.rope_high_freq_factor, 4.0, 0);
    assert_int_equal(a.rope_orig_max_pos, 8192);
    assert_int_equal(a.eos_id, 128001);           /* first of the list */
    assert_int_equal(a.bos_id, 128000);
    assert_int_equal(a.tied_embeddings, 1);
    assert_float_equal(a.norm_eps, 1e-5, 1e-12);
}

/* One config case: patches applied to a valid base (value NULL deletes the key). */
typedef struct cfg_case {
    const char *key[3], *val[3];
    ppn_status st;
    const char *sub;
} cfg_case;

static const char *k_base =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"vocab_size\": 256,"
    " \"max_position_embeddings\": 512}";

static const cfg_case k_cases[] = {
    {{"hidden_size"}, {NULL}, PPN_EFORMAT, "'hidden_size' is missing"},
    {{"vocab_size"}, {NULL}, PPN_EFORMAT, "'vocab_size' is missing"},
    {{"hidden_size"}, {"\"64\""}, PPN_EFORMAT, "'hidden_size' must be an integer"},
    {{"hidden_size"}, {"-64"}, PPN_EFORMAT, "hidden_size"},
    {{"num_hidden_layers"}, {"0"}, PPN_EFORMAT, "num_hidden_layers"},
    {{"hidden_size"}, {"100"}, PPN_EFORMAT, "not a multiple of num_attention_heads"},
    {{"num_key_value_heads"}, {"3"}, PPN_EFORMAT, "num_key_value_heads 3"},
    {{"head_dim"}, {"7"}, PPN_EFORMAT, "head_dim 7 is odd"},
    {{"architectures"}, {NULL}, PPN_EUNSUPPORTED, "'architectures'"},
    {{"architectures"}, {"[\"GPT2LMHeadModel\"]"}, PPN_EUNSUPPORTED, "GPT2LMHeadModel"},
    {{"rope_scaling"}, {"{\"rope_type\": \"yarn\", \"factor\": 4.0}"}, PPN_EUNSUPPORTED, "'yarn'"},
    {{"rope_parameters"}, {"{\"rope_type\": \"dynamic\"}"}, PPN_EUNSUPPORTED, "'dynamic'"},
    {{"rope_scaling"}, {"{\"type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
                        " \"original_max_position_embeddings\": 8192}"}, PPN_EFORMAT, "rope_scaling.factor"},
    {{"architectures", "sliding_window", "max_position_embeddings"}, {"[\"MistralForCausalLM\"]", "4096", "32768"},
     PPN_EUNSUPPORTED, "sliding window attention (sliding_window=4096) is not supported"},
    {{"architectures", "sliding_window"}, {"[\"MistralForCausalLM\"]", "null"}, PPN_OK, NULL},
    {{"architectures", "sliding_window"}, {"[\"MistralForCausalLM\"]", "512"}, PPN_OK, NULL},
    {{"architectures", "use_sliding_window"}, {"[\"Qwen2ForCausalLM\"]", "true"}, PPN_EUNSUPPORTED,
     "use_sliding_window"},
    {{"architectures", "layer_types"}, {"[\"Qwen3ForCausalLM\"]", "[\"full_attention\", \"sliding_attention\"]"},
     PPN_EUNSUPPORTED, "layer_types[1]"},
    {{"hidden_act"}, {"\"gelu\""}, PPN_EUNSUPPORTED, "'gelu'"},
    {{"mlp_bias"}, {"true"}, PPN_EUNSUPPORTED, "mlp_bias"},
    {{"attention_bias"}, {"true"}, PPN_EUNSUPPORTED, "attention_bias"},
    {{"quantization_config"}, {"{\"quant_method\": \"gptq\"}"}, PPN_EUNSUPPORTED, "quantization_config"},
    {{"bos_token_id"}, {"\"one\""}, PPN_EFORMAT, "bos_token_id"},
    /* layer_types: absent or null, else one string per layer (num_hidden_layers = 2), each full_attention */
    {{"layer_types"}, {"null"}, PPN_OK, NULL},
    {{"layer_types"}, {"[\"full_attention\", \"full_attention\"]"}, PPN_OK, NULL},
    {{"layer_types"}, {"\"full_attention\""}, PPN_EFORMAT, "'layer_types' is not a list"},
    {{"layer_types"}, {"{\"0\": \"full_attention\"}"}, PPN_EFORMAT, "'layer_types' is not a list"},
    {{"layer_types"}, {"[\"full_attention\"]"}, PPN_EFORMAT, "'layer_types' is a list of 1, but num_hidden_layers is 2"},
    {{"layer_types"}, {"[\"full_attention\", \"full_attention\", \"full_attention\"]"}, PPN_EFORMAT,
     "'layer_types' is a list of 3"},
    {{"layer_types"}, {"[\"full_attention\", 3]"}, PPN_EFORMAT, "'layer_types[1]' is not a string"},
    {{"layer_types"}, {"[\"full_attention\", \"linear_attention\"]"}, PPN_EUNSUPPORTED, "layer_types[1]"},
    /* rms_norm_eps in (0, 1) and a float32 normal; rope_theta finite and > 1 (both spellings) */
    {{"rms_norm_eps"}, {"1e-5"}, PPN_OK, NULL},
    {{"rms_norm_eps"}, {"1e300"}, PPN_EFORMAT, "'rms_norm_eps' = 1e+300 is out of range: it must be in (0, 1)"},
    {{"rms_norm_eps"}, {"1"}, PPN_EFORMAT, "'rms_norm_eps' = 1 is out of range"},
    {{"rms_norm_eps"}, {"1e-300"}, PPN_EFORMAT, "'rms_norm_eps' = 1e-300 is out of range"},
    {{"rms_norm_eps"}, {"0"}, PPN_EFORMAT, "'rms_norm_eps' must be a positive number"},
    {{"rope_theta"}, {"500000.0"}, PPN_OK, NULL},
    {{"rope_theta"}, {"1e-300"}, PPN_EFORMAT, "'rope_theta' = 1e-300 is out of range: it must be a finite number greater than 1"},
    {{"rope_theta"}, {"1"}, PPN_EFORMAT, "'rope_theta' = 1 is out of range"},
    {{"rope_parameters"}, {"{\"rope_type\": \"default\", \"rope_theta\": 0.5}"}, PPN_EFORMAT,
     "'rope_parameters.rope_theta' = 0.5 is out of range"},
};

static char *patched(const cfg_case *k)
{
    json_error_t jerr;
    json_t *j = json_loads(k_base, 0, &jerr);
    assert_non_null(j);
    for (int i = 0; i < 3 && k->key[i]; i++) {
        if (!k->val[i]) {
            json_object_del(j, k->key[i]);
            continue;
        }
        json_t *v = json_loads(k->val[i], JSON_DECODE_ANY, &jerr);
        if (!v) fail_msg("test case value '%s': %s", k->val[i], jerr.text);
        json_object_set_new(j, k->key[i], v);
    }
    char *s = json_dumps(j, 0);
    json_decref(j);
    return s;
}

static void test_loader_config_cases(void **state)
{
    ppn_model_config cfg;
    assert_int_equal(ppn_config_parse(k_base, strlen(k_base), "base/config.json", &cfg), PPN_OK);
    assert_int_equal(cfg.head_dim, 8);
    assert_float_equal(cfg.rope_theta, 10000.0, 0);   /* HF defaults */
    assert_float_equal(cfg.norm_eps, 1e-6, 1e-12);
    assert_int_equal(cfg.tied_embeddings, 0);
    assert_int_equal(cfg.bos_id, -1);
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const cfg_case *k = &k_cases[i];
        char *s = patched(k);
        ppn_status st = ppn_config_parse(s, strlen(s), "case/config.json", &cfg);
        free(s);
        if (st != k->st)
            fail_msg("case %zu (%s): got %s (%s), expected %s", i, k->key[0], ppn_status_name(st),
                     ppn_last_error(), ppn_status_name(k->st));
        if (st == PPN_OK) continue;
        const char *m = ppn_last_error();
        if (!strstr(m, "case/config.json") || !strstr(m, k->sub))
            fail_msg("case %zu: message '%s' does not name the file and '%s'", i, m, k->sub);
    }
    const char *bad[] = {"{\"hidden_size\": ", "[1, 2]", ""};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(ppn_config_parse(bad[i], strlen(bad[i]), "bad/config.json", &cfg), PPN_EFORMAT);
        assert_non_null(strstr(ppn_last_error(), "bad/config.json"));
    }
    cfg_case tok = {{"bos_token_id", "eos_token_id"}, {"[5, 6]", "null"}, PPN_OK, NULL};
    char *s = patched(&tok);
    assert_int_equal(ppn_config_parse(s, strlen(s), "tok/config.json", &cfg), PPN_OK);
    free(s);
    assert_int_equal(cfg.bos_id, 5);
    assert_int_equal(cfg.eos_id, -1);
}

/* ---- mkmodel ------------------------------------------------------------------------------------------ */

/* Element i of a tensor, decoded independently of the loader (tests/util/trand.h). */
static float elem(const ppn_tensor *t, size_t i) { return (float)tu_wval(t->data, t->dtype, i); }

static size_t numel(const ppn_tensor *t)
{
    return (size_t)t->shape[0] * (size_t)(t->ndim == 2 ? t->shape[1] : 1);
}

/* Random weights within their law: finite; norms near 1; matrices centred with std near 0.5/sqrt(fan_in). */
static void check_values(const ppn_tensor *t, const char *what, int is_norm)
{
    size_t n = numel(t);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        float v = elem(t, i);
        if (!isfinite(v)) fail_msg("%s[%zu] is not finite", what, i);
        if (is_norm && fabsf(v - 1.0f) > 0.11f) fail_msg("%s[%zu] = %g: a norm weight far from 1", what, i, v);
        sum += v;
        sq += (double)v * v;
    }
    if (is_norm) return;
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    double want = 0.5 / sqrt((double)t->shape[1]);
    if (fabs(sd - want) > 0.1 * want || fabs(mean) > 0.1 * want)
        fail_msg("%s: mean %g std %g, expected ~0 and ~%g", what, mean, sd, want);
}

typedef struct mk_expect {
    const char *shape, *arch;
    int dim, layers, heads, kv, hd, ffn, vocab, tied, qknorm;
    double theta;
} mk_expect;

/* The shapes as the issue specifies them. */
static const mk_expect k_tiny = {"tiny", "LlamaForCausalLM", 128, 4, 4, 2, 32, 384, 512, 0, 0, 1e4};
static const mk_expect k_qwen3 = {"qwen3-tiny", "Qwen3ForCausalLM", 128, 4, 4, 2, 64, 256, 512, 1, 1, 1e6};

static void check_generated(const ppn_ckpt *c, const mk_expect *e, int dtype)
{
    const ppn_model_config *g = &c->cfg;
    assert_string_equal(g->arch_name, e->arch);
    assert_int_equal(g->dim, e->dim);
    assert_int_equal(g->n_layers, e->layers);
    assert_int_equal(g->n_heads, e->heads);
    assert_int_equal(g->n_kv_heads, e->kv);
    assert_int_equal(g->head_dim, e->hd);
    assert_int_equal(g->ffn_dim, e->ffn);
    assert_int_equal(g->vocab, e->vocab);
    assert_int_equal(g->tied_embeddings, e->tied);
    assert_float_equal(g->rope_theta, e->theta, 0);
    assert_int_equal(g->rope_type, PPN_ROPE_DEFAULT);
    assert_int_equal(c->embed.dtype, dtype);
    check_values(&c->embed, "embed", 0);
    check_values(&c->final_norm, "final_norm", 1);
    if (e->tied) assert_ptr_equal(c->lm_head.data, c->embed.data);
    else check_values(&c->lm_head, "lm_head", 0);
    layer_spec spec[16];
    size_t ns = layer_specs(g, 0, e->qknorm, spec);
    for (int l = 0; l < g->n_layers; l++)
        for (size_t i = 0; i < ns; i++) {
            const ppn_tensor *t = field(&c->layers[l], spec[i].field);
            expect_shape(t, spec[i].suffix, spec[i].ndim, spec[i].d0, spec[i].d1);
            assert_int_equal(t->dtype, dtype);
            check_values(t, spec[i].suffix, spec[i].ndim == 1);
        }
}

/* The same seed in another dtype is the same model, rounded (bf16: truncated, f16: rounded). */
static void expect_close(const ppn_tensor *ref, const ppn_tensor *t, const char *what)
{
    double rel = t->dtype == PPN_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
    for (size_t i = 0; i < numel(ref); i++) {
        float a = elem(ref, i), b = elem(t, i);
        if (fabsf(a - b) > rel * fabsf(a) + 3e-8f) fail_msg("%s[%zu]: f32 %g vs %g", what, i, a, b);
    }
}

static void mk_roundtrip(void **state, const mk_expect *e)
{
    const int dts[3] = {PPN_DTYPE_F32, PPN_DTYPE_BF16, PPN_DTYPE_F16};
    ppn_ckpt *c[3];
    char dir[1200];
    for (int d = 0; d < 3; d++) {
        snprintf(dir, sizeof dir, "%s/%s-%d", (const char *)*state, e->shape, d);
        assert_int_equal(ppn_mkmodel(e->shape, dts[d], dir, 1234), PPN_OK);
        c[d] = open_ok(dir);
        check_generated(c[d], e, dts[d]);
    }
    for (int d = 1; d < 3; d++) {
        expect_close(&c[0]->embed, &c[d]->embed, "embed");
        expect_close(&c[0]->layers[3].w_down, &c[d]->layers[3].w_down, "w_down");
        expect_close(&c[0]->layers[1].attn_norm, &c[d]->layers[1].attn_norm, "attn_norm");
    }
    for (int d = 0; d < 3; d++) ppn_ckpt_close(c[d]);
}

static void test_loader_mkmodel_tiny(void **state) { mk_roundtrip(state, &k_tiny); }
static void test_loader_mkmodel_qwen3_tiny(void **state) { mk_roundtrip(state, &k_qwen3); }

static void test_loader_mkmodel_seed_and_args(void **state)
{
    char a[1200], b[1200], c[1200], p[1300], q[1300];
    size_t na, nb, nc;
    sub_dir(a, sizeof a, state, "a");
    sub_dir(b, sizeof b, state, "b/nested");   /* created with its parent */
    sub_dir(c, sizeof c, state, "c");
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_BF16, a, 9), PPN_OK);
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_BF16, b, 9), PPN_OK);
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_BF16, c, 10), PPN_OK);
    path_join(p, sizeof p, a, "model.safetensors");
    path_join(q, sizeof q, b, "model.safetensors");
    uint8_t *fa = read_all(p, &na), *fb = read_all(q, &nb);
    path_join(q, sizeof q, c, "model.safetensors");
    uint8_t *fc = read_all(q, &nc);
    assert_int_equal(na, nb);
    assert_int_equal(memcmp(fa, fb, na), 0);       /* same seed, same bytes */
    assert_int_equal(na, nc);
    assert_int_not_equal(memcmp(fa, fc, na), 0);   /* another seed, other weights */
    free(fa);
    free(fb);
    free(fc);
    assert_int_equal(ppn_mkmodel("huge", PPN_DTYPE_F32, a, 1), PPN_EINVAL);
    assert_non_null(strstr(ppn_last_error(), "huge"));
    assert_non_null(strstr(ppn_last_error(), "qwen2-7b"));
    assert_int_equal(ppn_mkmodel("tiny", 7, a, 1), PPN_EINVAL);
}

/* ---- sharded ------------------------------------------------------------------------------------------ */

static int count_shards(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, "model-", 6) == 0;
    closedir(d);
    return n;
}

static void expect_same_tensor(const ppn_tensor *a, const ppn_tensor *b, const char *what)
{
    assert_int_equal(a->ndim, b->ndim);
    assert_int_equal(a->shape[0], b->shape[0]);
    assert_int_equal(a->shape[1], b->shape[1]);
    assert_int_equal(a->dtype, b->dtype);
    assert_int_equal(a->nbytes, b->nbytes);
    if (memcmp(a->data, b->data, a->nbytes) != 0) fail_msg("%s differs", what);
}

static void test_loader_sharded(void **state)
{
    char sh[1200], one[1200], p[1300];
    struct stat sb;
    sub_dir(sh, sizeof sh, state, "sharded");
    sub_dir(one, sizeof one, state, "single");
    assert_int_equal(ppn_mkmodel_ex("tiny", PPN_DTYPE_F32, sh, 77, 1 << 20), PPN_OK);
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_F32, one, 77), PPN_OK);
    path_join(p, sizeof p, sh, "model.safetensors.index.json");
    assert_int_equal(stat(p, &sb), 0);
    path_join(p, sizeof p, sh, "model.safetensors");
    assert_int_not_equal(stat(p, &sb), 0);
    assert_true(count_shards(sh) >= 3);   /* ~3.6 MB in 1 MiB shards */
    ppn_ckpt *a = open_ok(sh), *b = open_ok(one);
    expect_same_tensor(&a->embed, &b->embed, "embed");
    expect_same_tensor(&a->final_norm, &b->final_norm, "final_norm");
    expect_same_tensor(&a->lm_head, &b->lm_head, "lm_head");
    layer_spec spec[16];
    size_t ns = layer_specs(&a->cfg, 0, 0, spec);
    for (int l = 0; l < a->cfg.n_layers; l++)
        for (size_t i = 0; i < ns; i++)
            expect_same_tensor(field(&a->layers[l], spec[i].field), field(&b->layers[l], spec[i].field),
                               spec[i].suffix);
    ppn_ckpt_close(a);
    ppn_ckpt_close(b);
    /* rewriting unsharded over a sharded dir must not leave the old index in charge */
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_F32, sh, 78), PPN_OK);
    path_join(p, sizeof p, sh, "model.safetensors.index.json");
    assert_int_not_equal(stat(p, &sb), 0);
}

/* Edit weight_map[tensor] in a sharded dir's index. */
static void index_route(const char *dir, const char *tensor, const char *file)
{
    char p[1300];
    json_error_t jerr;
    path_join(p, sizeof p, dir, "model.safetensors.index.json");
    json_t *j = json_load_file(p, 0, &jerr);
    assert_non_null(j);
    json_object_set_new(json_object_get(j, "weight_map"), tensor, json_string(file));
    assert_int_equal(json_dump_file(j, p, 0), 0);
    json_decref(j);
}

static void test_loader_sharded_malformed(void **state)
{
    char sh[1200];
    sub_dir(sh, sizeof sh, state, "sh");
    assert_int_equal(ppn_mkmodel_ex("tiny", PPN_DTYPE_F32, sh, 5, 1 << 20), PPN_OK);
    index_route(sh, "model.norm.weight", "model-00009-of-00009.safetensors");
    expect_open_fails(sh, PPN_EIO, "model-00009-of-00009.safetensors", "model.norm.weight");
    index_route(sh, "model.norm.weight", "model-00001-of-00004.safetensors");   /* not in shard 1 */
    expect_open_fails(sh, PPN_EFORMAT, "does not contain", "model.norm.weight");
    index_route(sh, "model.norm.weight", "../model-00004-of-00004.safetensors");
    expect_open_fails(sh, PPN_EFORMAT, "model.safetensors.index.json", "model.norm.weight");
    char p[1300];
    path_join(p, sizeof p, sh, "model.safetensors.index.json");
    tu_write_file(p, "{\"weight_map\": ", 15);
    expect_open_fails(sh, PPN_EFORMAT, "model.safetensors.index.json", "JSON");
}

/* ---- malformed single files --------------------------------------------------------------------------- */

typedef struct bad_ckpt {
    char dir[1200], st[1300], cfg[1300];
    st_img im;
} bad_ckpt;

/* A valid tiny f32 checkpoint in the temp dir, its header parsed for editing. */
static void bad_init(void **state, bad_ckpt *b, const char *shape)
{
    sub_dir(b->dir, sizeof b->dir, state, "bad");
    assert_int_equal(ppn_mkmodel(shape, PPN_DTYPE_F32, b->dir, 3), PPN_OK);
    path_join(b->st, sizeof b->st, b->dir, "model.safetensors");
    path_join(b->cfg, sizeof b->cfg, b->dir, "config.json");
    b->im = st_load(b->st);
}

static void bad_save(bad_ckpt *b) { st_save(b->st, b->im.hdr, b->im.data, b->im.data_len, 0); }

static void set_offsets(bad_ckpt *b, const char *name, int64_t begin, int64_t end)
{
    json_object_set_new(st_entry(&b->im, name), "data_offsets", json_pack("[I, I]", (json_int_t)begin,
                                                                          (json_int_t)end));
}

static void set_shape(bad_ckpt *b, const char *name, int64_t d0, int64_t d1)
{
    json_object_set_new(st_entry(&b->im, name), "shape", json_pack("[I, I]", (json_int_t)d0, (json_int_t)d1));
}

static void test_loader_bad_truncated(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    size_t n;
    uint8_t *f = read_all(b.st, &n);
    tu_write_file(b.st, f, n - 100);   /* the last tensor in the file is lm_head.weight */
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "lm_head.weight");
    tu_write_file(b.st, f, 5);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "shorter than the 8-byte");
    uint64_t big = n;              /* header length past the end */
    memcpy(f, &big, 8);
    tu_write_file(b.st, f, n);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "runs past the end");
    big = 1ull << 40;
    memcpy(f, &big, 8);
    tu_write_file(b.st, f, n);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "absurd");
    free(f);
    st_free(&b.im);
}

static void test_loader_bad_offsets(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    const char *nrm = "model.norm.weight";
    int64_t b0 = st_off(&b.im, nrm, 0), e0 = st_off(&b.im, nrm, 1);
    set_offsets(&b, nrm, (int64_t)b.im.data_len - 100, (int64_t)b.im.data_len - 100 + (e0 - b0));
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.norm.weight", "past the data section");
    set_offsets(&b, nrm, e0, b0);
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.norm.weight", "begin");
    set_offsets(&b, nrm, b0, e0);
    const char *q = "model.layers.0.self_attn.q_proj.weight", *k = "model.layers.0.self_attn.k_proj.weight";
    int64_t kb = st_off(&b.im, k, 0), ke = st_off(&b.im, k, 1), qb = st_off(&b.im, q, 0);
    set_offsets(&b, k, qb, qb + (ke - kb));   /* k now reads the first half of q */
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "k_proj", "overlaps");
    set_offsets(&b, k, kb, ke);
    json_object_set_new(st_entry(&b.im, k), "data_offsets", json_string("0-10"));
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "k_proj", "data_offsets");
    st_free(&b.im);
}

static void test_loader_bad_entries(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    const char *q = "model.layers.1.self_attn.q_proj.weight";
    json_t *e = st_entry(&b.im, q);
    json_object_set_new(e, "dtype", json_string("F33"));
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "F33");
    json_object_set_new(e, "dtype", json_integer(4));
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "dtype");
    json_object_set_new(e, "dtype", json_string("F32"));
    set_shape(&b, q, 128, 127);           /* shape x size no longer matches the range */
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "data_offsets span");
    set_shape(&b, q, -1, 128);
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "shape[0]");
    set_shape(&b, q, (int64_t)1 << 40, (int64_t)1 << 40);
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "overflow");
    set_shape(&b, q, 128, 128);
    json_object_del(e, "shape");
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, q, "shape");
    st_free(&b.im);
}

static void test_loader_bad_tensors(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    const char *up = "model.layers.2.mlp.up_proj.weight", *gate = "model.layers.3.mlp.gate_proj.weight";
    json_t *saved = json_incref(st_entry(&b.im, up));
    json_object_del(b.im.hdr, up);
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "missing tensor 'model.layers.2.mlp.up_proj.weight'");
    json_object_set_new(b.im.hdr, up, saved);
    set_shape(&b, gate, 128, 384);        /* same size, transposed */
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, gate, "shape [128, 384], expected [384, 128]");
    set_shape(&b, gate, 384, 128);
    const char *q = "model.layers.0.self_attn.q_proj.weight";
    json_object_set_new(st_entry(&b.im, q), "dtype", json_string("F64"));
    set_shape(&b, q, 128, 64);            /* same bytes as [128, 128] F32 */
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EUNSUPPORTED, q, "F64");
    st_free(&b.im);
}

static void test_loader_bad_header_json(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    size_t n;
    uint8_t *f = read_all(b.st, &n);
    uint64_t hlen;
    memcpy(&hlen, f, 8);
    memcpy(f + 8, "{\"x\": [1, ", 10);  /* same length, broken JSON */
    memset(f + 18, ' ', hlen - 10);
    tu_write_file(b.st, f, n);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "not valid JSON");
    memcpy(f + 8, "[1, 2]    ", 10);
    tu_write_file(b.st, f, n);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "not a JSON object");
    free(f);
    st_free(&b.im);
}

static void rewrite_config(bad_ckpt *b, const char *key, const char *val)
{
    json_error_t jerr;
    json_t *j = json_load_file(b->cfg, 0, &jerr);
    assert_non_null(j);
    if (val) json_object_set_new(j, key, json_loads(val, JSON_DECODE_ANY, &jerr));
    else json_object_del(j, key);
    assert_int_equal(json_dump_file(j, b->cfg, 0), 0);
    json_decref(j);
}

static void test_loader_bad_config(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    size_t n;
    char *orig = (char *)read_all(b.cfg, &n);
    tu_write_file(b.cfg, "{ not json", 10);
    expect_open_fails(b.dir, PPN_EFORMAT, "config.json", "not valid JSON");
    tu_write_file(b.cfg, orig, n);
    rewrite_config(&b, "hidden_size", NULL);
    expect_open_fails(b.dir, PPN_EFORMAT, "config.json", "hidden_size");
    tu_write_file(b.cfg, orig, n);
    rewrite_config(&b, "architectures", "[\"FalconForCausalLM\"]");
    expect_open_fails(b.dir, PPN_EUNSUPPORTED, "config.json", "FalconForCausalLM");
    tu_write_file(b.cfg, orig, n);
    rewrite_config(&b, "architectures", "[\"MistralForCausalLM\"]");
    rewrite_config(&b, "sliding_window", "256");
    expect_open_fails(b.dir, PPN_EUNSUPPORTED, "config.json",
                      "sliding window attention (sliding_window=256) is not supported");
    rewrite_config(&b, "sliding_window", "null");   /* the same Mistral without a window loads */
    ppn_ckpt *c = open_ok(b.dir);
    assert_int_equal(c->cfg.arch, PPN_ARCH_MISTRAL);
    ppn_ckpt_close(c);
    tu_write_file(b.cfg, orig, n);
    rewrite_config(&b, "tie_word_embeddings", "true");  /* tied but lm_head stored: the stored one is used */
    c = open_ok(b.dir);
    assert_ptr_not_equal(c->lm_head.data, c->embed.data);
    assert_int_equal(c->cfg.tied_embeddings, 0);
    ppn_ckpt_close(c);
    unlink(b.cfg);
    expect_open_fails(b.dir, PPN_EIO, "config.json", NULL);
    tu_write_file(b.cfg, orig, n);
    unlink(b.st);
    expect_open_fails(b.dir, PPN_EIO, "model.safetensors", NULL);
    free(orig);
    st_free(&b.im);
}

static void test_loader_bad_untied_without_head(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "qwen3-tiny");   /* tied: no lm_head.weight in the file */
    rewrite_config(&b, "tie_word_embeddings", "false");
    expect_open_fails(b.dir, PPN_EFORMAT, "model.safetensors", "lm_head.weight");
    st_free(&b.im);
}

static void test_loader_bad_qwen2_bias(void **state)
{
    char dir[1200], src[1024], p[1300], q[1300];
    sub_dir(dir, sizeof dir, state, "q2");
    assert_int_equal(mkdir(dir, 0755), 0);
    fixture_path(src, sizeof src, "hf/qwen2-tiny");
    path_join(p, sizeof p, src, "config.json");
    path_join(q, sizeof q, dir, "config.json");
    copy_file(p, q);
    path_join(p, sizeof p, src, "model.safetensors");
    path_join(q, sizeof q, dir, "model.safetensors");
    st_img im = st_load(p);
    json_object_del(im.hdr, "model.layers.3.self_attn.k_proj.bias");
    st_save(q, im.hdr, im.data, im.data_len, 0);
    expect_open_fails(dir, PPN_EFORMAT, "model.safetensors", "model.layers.3.self_attn.k_proj.bias");
    st_free(&im);
}

/* A checkpoint whose config uses fewer tensors than it holds is refused, naming the tensor and the config field
 * that leaves it out: layers past num_hidden_layers, Qwen2's biases under a Llama label, Qwen3's q/k norms
 * under a Llama label, a name ppn does not know. The stored rotary table (inv_freq) is the harmless exception. */
static void relabel_fixture(void **state, const char *fixture, char *dir, size_t cap)
{
    char src[1024], p[1300], q[1300];
    sub_dir(dir, cap, state, fixture + 3);
    assert_int_equal(mkdir(dir, 0755), 0);
    fixture_path(src, sizeof src, fixture);
    path_join(p, sizeof p, src, "model.safetensors");
    path_join(q, sizeof q, dir, "model.safetensors");
    copy_file(p, q);
    path_join(p, sizeof p, src, "config.json");
    path_join(q, sizeof q, dir, "config.json");
    json_error_t jerr;
    json_t *j = json_load_file(p, 0, &jerr);
    assert_non_null(j);
    json_object_set_new(j, "architectures", json_pack("[s]", "LlamaForCausalLM"));
    assert_int_equal(json_dump_file(j, q, 0), 0);
    json_decref(j);
}

static void test_loader_bad_unused_tensors(void **state)
{
    bad_ckpt b;
    char dir[1200];
    bad_init(state, &b, "tiny");   /* 4 layers */
    rewrite_config(&b, "num_hidden_layers", "2");
    expect_open_fails(b.dir, PPN_EFORMAT, "tensor 'model.layers.2.", "num_hidden_layers = 2");
    rewrite_config(&b, "num_hidden_layers", "4");
    json_object_set_new(b.im.hdr, "model.layers.4.mlp.up_proj.weight",
                        json_pack("{s:s, s:[i], s:[i, i]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0));
    bad_save(&b);
    expect_open_fails(b.dir, PPN_EFORMAT, "model.layers.4.mlp.up_proj.weight", "num_hidden_layers = 4");
    json_object_del(b.im.hdr, "model.layers.4.mlp.up_proj.weight");
    static const char *const unknown[] = {"model.layers.0.self_attn.o_proj.bias", "model.extra.weight",
                                          "model.layers.x.mlp.up_proj.weight", "transformer.h.0.attn.weight",
                                          "model.layers.01.mlp.up_proj.weight"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        json_object_set_new(b.im.hdr, unknown[i],
                            json_pack("{s:s, s:[i], s:[i, i]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0));
        bad_save(&b);
        expect_open_fails(b.dir, PPN_EFORMAT, unknown[i], "refuses to drop it");
        json_object_del(b.im.hdr, unknown[i]);
    }
    /* the rotary tables old exporters stored: accepted, whatever their dtype */
    json_object_set_new(b.im.hdr, "model.layers.1.self_attn.rotary_emb.inv_freq",
                        json_pack("{s:s, s:[i], s:[i, i]}", "dtype", "F64", "shape", 0, "data_offsets", 0, 0));
    json_object_set_new(b.im.hdr, "model.rotary_emb.inv_freq",
                        json_pack("{s:s, s:[i], s:[i, i]}", "dtype", "F32", "shape", 0, "data_offsets", 0, 0));
    bad_save(&b);
    ppn_ckpt_close(open_ok(b.dir));
    st_free(&b.im);
    relabel_fixture(state, "hf/qwen2-tiny", dir, sizeof dir);   /* its q/k/v biases under a Llama label */
    expect_open_fails(dir, PPN_EFORMAT, "tensor 'model.layers.0.self_attn.k_proj.bias' is a q/k/v bias",
                      "attention_bias");
    relabel_fixture(state, "hf/qwen3-tiny", dir, sizeof dir);   /* its q/k norms under a Llama label */
    expect_open_fails(dir, PPN_EFORMAT, "tensor 'model.layers.0.self_attn.k_norm.weight' is a q/k norm",
                      "architectures says LlamaForCausalLM");
}

/* A FIFO (or any non-regular file) where the loader expects a file is refused at once, naming the file and what
 * it is: opening a FIFO for reading would wait for a writer forever. The alarm fails the test (SIGALRM ends the
 * process) instead of hanging ctest when a loader blocks. */
static void expect_fifo_refused(const char *ckpt, const char *fifo, const char *what)
{
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    alarm(20);
    expect_open_fails(ckpt, PPN_EIO, what, "is a FIFO, not a regular file");
    alarm(0);
    unlink(fifo);
}

static void test_loader_bad_fifo(void **state)
{
    bad_ckpt b;
    char sh[1200], p[1300], keep[1300];
    bad_init(state, &b, "tiny");
    st_free(&b.im);
    expect_fifo_refused(b.dir, b.cfg, "config.json");
    assert_int_equal(ppn_mkmodel("tiny", PPN_DTYPE_F32, b.dir, 3), PPN_OK);
    expect_fifo_refused(b.dir, b.st, "model.safetensors");
    sub_dir(sh, sizeof sh, state, "sh");
    assert_int_equal(ppn_mkmodel_ex("tiny", PPN_DTYPE_F32, sh, 5, 1 << 20), PPN_OK);
    path_join(p, sizeof p, sh, "model-00002-of-00004.safetensors");
    path_join(keep, sizeof keep, sh, "keep");
    assert_int_equal(rename(p, keep), 0);
    expect_fifo_refused(sh, p, "model-00002-of-00004.safetensors");
    assert_int_equal(rename(keep, p), 0);
    path_join(p, sizeof p, sh, "model.safetensors.index.json");
    expect_fifo_refused(sh, p, "model.safetensors.index.json");
    /* the checkpoint path itself: a llama2.c .bin that is a FIFO */
    path_join(p, sizeof p, (const char *)*state, "stories.bin");
    assert_int_equal(mkfifo(p, 0644), 0);
    alarm(20);
    expect_open_fails(p, PPN_EIO, "stories.bin", "is a FIFO");
    alarm(0);
}

/* Legal but odd: a header padded to leave the data off 4-byte alignment. Views must still be aligned and
 * hold the file's values. */
static void test_loader_misaligned_data(void **state)
{
    bad_ckpt b;
    bad_init(state, &b, "tiny");
    char dir[1200], p[1300];
    sub_dir(dir, sizeof dir, state, "odd");
    assert_int_equal(mkdir(dir, 0755), 0);
    path_join(p, sizeof p, dir, "config.json");
    copy_file(b.cfg, p);
    char *s = json_dumps(b.im.hdr, JSON_COMPACT);
    size_t pad = (9 - strlen(s) % 8) % 8;   /* 8 + hlen = 1 mod 8: data off every alignment */
    free(s);
    path_join(p, sizeof p, dir, "model.safetensors");
    st_save(p, b.im.hdr, b.im.data, b.im.data_len, pad);
    ppn_ckpt *ref = open_ok(b.dir), *c = open_ok(dir);
    assert_int_equal((uintptr_t)c->layers[2].wq.data % 4, 0);
    assert_int_equal((uintptr_t)c->final_norm.data % 4, 0);
    expect_same_tensor(&c->layers[2].wq, &ref->layers[2].wq, "wq");
    expect_same_tensor(&c->final_norm, &ref->final_norm, "final_norm");
    expect_same_tensor(&c->embed, &ref->embed, "embed");
    expect_same_tensor(&c->lm_head, &ref->lm_head, "lm_head");
    ppn_ckpt_close(c);
    ppn_ckpt_close(ref);
    st_free(&b.im);
}

static void test_loader_open_paths(void **state)
{
    char p[1200];
    expect_open_fails("/nonexistent/ppn/ckpt", PPN_EIO, "/nonexistent/ppn/ckpt", NULL);
    fixture_path(p, sizeof p, "hf/llama-tiny/model.safetensors");
    expect_open_fails(p, PPN_EUNSUPPORTED, "model.safetensors", "directory");
    sub_dir(p, sizeof p, state, "empty");
    assert_int_equal(mkdir(p, 0755), 0);
    expect_open_fails(p, PPN_EIO, "config.json", NULL);
}

#define TMP_TEST(f) cmocka_unit_test_setup_teardown(f, setup_tmp, teardown_tmp)

/* The KV pools' size at load (core/load.c ppn_kv_pool_positions): whole blocks of PPN_KV_BLOCK, never past the room
 * the free memory leaves. The 8B on an 80 GB H100 (2026-12-05) had room for 521,121 positions at its chosen
 * context of 131,072: the default (4 contexts) was clamped to the room and then rounded up past it, so the load was
 * refused; it takes the 521,120 the room holds now. A chosen context shrinks to the pool where even that cannot
 * hold one sequence; an asked context, or kv_tokens, past the room is still refused (a result past room). */
static void test_loader_kv_pool_positions(void **state)
{
    (void)state;
    int ctx = 131072;
    assert_int_equal(ppn_kv_pool_positions(521121, &ctx, 1, 0), 521120);
    assert_int_equal(ctx, 131072);
    for (size_t room = 1000; room < 9000; room += 7) /* every remainder mod 16, both sides of 4 contexts */
        for (int free_ctx = 0; free_ctx <= 1; free_ctx++) {
            int c = 1001;
            size_t kv = ppn_kv_pool_positions(room, &c, free_ctx, 0);
            if (kv % PPN_KV_BLOCK) fail_msg("room %zu: %zu positions, not whole blocks", room, kv);
            if (room >= 1008 && (kv > room || kv < (size_t)c || c != 1001))
                fail_msg("room %zu, ctx free %d: %zu positions, ctx %d", room, free_ctx, kv, c);
            if (room >= 4016 && kv != 4016) fail_msg("room %zu: %zu positions, not 4 contexts (4004) in blocks", room, kv);
            if (room < 1008 && free_ctx && (kv > room || (size_t)c != kv)) /* shrunk to the blocks the room holds */
                fail_msg("room %zu: %zu positions, ctx %d", room, kv, c);
            if (room < 1008 && !free_ctx && kv <= room) fail_msg("room %zu: an asked ctx of 1001 not refused", room);
        }
    ctx = 100;
    assert_int_equal(ppn_kv_pool_positions(1 << 20, &ctx, 1, 0), PPN_KV_DEFAULT_MIN); /* short contexts: the minimum */
    assert_int_equal(ppn_kv_pool_positions(1 << 20, &ctx, 1, 40), 48);                /* asked: rounded up */
    assert_true(ppn_kv_pool_positions(40, &ctx, 1, 50) > 40);                         /* asked past the room */
    ctx = 5;
    assert_true(ppn_kv_pool_positions(15, &ctx, 1, 0) > 15); /* not one block: refused */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loader_fixture_llama),
        cmocka_unit_test(test_loader_fixture_qwen2),
        cmocka_unit_test(test_loader_fixture_qwen3),
        cmocka_unit_test(test_loader_llama2c_stories),
        TMP_TEST(test_loader_llama2c_malformed),
        cmocka_unit_test(test_loader_config_spellings),
        cmocka_unit_test(test_loader_config_cases),
        cmocka_unit_test(test_loader_kv_pool_positions),
        TMP_TEST(test_loader_mkmodel_tiny),
        TMP_TEST(test_loader_mkmodel_qwen3_tiny),
        TMP_TEST(test_loader_mkmodel_seed_and_args),
        TMP_TEST(test_loader_sharded),
        TMP_TEST(test_loader_sharded_malformed),
        TMP_TEST(test_loader_bad_truncated),
        TMP_TEST(test_loader_bad_offsets),
        TMP_TEST(test_loader_bad_entries),
        TMP_TEST(test_loader_bad_tensors),
        TMP_TEST(test_loader_bad_header_json),
        TMP_TEST(test_loader_bad_config),
        TMP_TEST(test_loader_bad_untied_without_head),
        TMP_TEST(test_loader_bad_qwen2_bias),
        TMP_TEST(test_loader_bad_unused_tensors),
        TMP_TEST(test_loader_bad_fifo),
        TMP_TEST(test_loader_misaligned_data),
        TMP_TEST(test_loader_open_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
