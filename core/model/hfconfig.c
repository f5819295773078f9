/* hfconfig.c - parse a Hugging Face config.json into ppn_model_config.
 *
 * Both spellings of rotary settings are accepted: transformers 4.x (rope_theta and rope_scaling at the top
 * level) and 5.x (rope_parameters {rope_theta, rope_type, ...}). Absent optional fields take the defaults of
 * the transformers config classes; the sizes that fix tensor shapes are required. Features the forward pass
 * does not implement (sliding windows, other rotary scalings, biases ppn has no slot for, other activations)
 * are refused by name rather than silently computed wrong.
 */
#include <jansson.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include "core/model/ckpt.h"
#include "core/base/err.h"

typedef struct arch_desc {
    const char *name;
    int arch;
    int max_pos_default;   /* the transformers config class default */
} arch_desc;

static const arch_desc k_archs[] = {
    {"LlamaForCausalLM", PPN_ARCH_LLAMA, 2048},
    {"MistralForCausalLM", PPN_ARCH_MISTRAL, 4096 * 32},
    {"Qwen2ForCausalLM", PPN_ARCH_QWEN2, 32768},
    {"Qwen3ForCausalLM", PPN_ARCH_QWEN3, 32768},
};

/* Parser state for one config text: the root object and the file name for messages. */
typedef struct cfg_ctx {
    const json_t *root;
    const char *where;
    const arch_desc *arch;
} cfg_ctx;

/* ---- typed field readers: absent or null takes the default; a wrong type is malformed ---------------- */

static ppn_status get_int(const cfg_ctx *x, const json_t *obj, const char *pfx, const char *key, int required,
                          long long dflt, long long lo, long long hi, int *out)
{
    const json_t *v = json_object_get(obj, key);
    long long n;
    if (!v || json_is_null(v)) {
        if (required) return ppn_err(PPN_EFORMAT, "%s: required field '%s%s' is missing", x->where, pfx, key);
        *out = (int)dflt;   /* defaults are in range or a marker (head_dim 0: derive it) */
        return PPN_OK;
    }
    if (json_is_integer(v)) {
        n = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 1e15) {
        n = (long long)json_real_value(v);   /* e.g. 64.0 written by a float-happy exporter */
    } else {
        return ppn_err(PPN_EFORMAT, "%s: field '%s%s' must be an integer", x->where, pfx, key);
    }
    if (n < lo || n > hi)
        return ppn_err(PPN_EFORMAT, "%s: field '%s%s' = %lld is out of range [%lld, %lld]", x->where, pfx, key, n,
                       lo, hi);
    *out = (int)n;
    return PPN_OK;
}

/* A finite number > 0. */
static ppn_status get_pos_num(const cfg_ctx *x, const json_t *obj, const char *pfx, const char *key,
                              int required, double dflt, double *out)
{
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return ppn_err(PPN_EFORMAT, "%s: required field '%s%s' is missing", x->where, pfx, key);
        *out = dflt;
        return PPN_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) <= 0)
        return ppn_err(PPN_EFORMAT, "%s: field '%s%s' must be a positive number", x->where, pfx, key);
    *out = json_number_value(v);
    return PPN_OK;
}

static ppn_status get_bool(const cfg_ctx *x, const char *key, int dflt, int *out)
{
    const json_t *v = json_object_get(x->root, key);
    if (!v || json_is_null(v)) *out = dflt;
    else if (json_is_boolean(v)) *out = json_is_true(v);
    else return ppn_err(PPN_EFORMAT, "%s: field '%s' must be true or false", x->where, key);
    return PPN_OK;
}

/* bos/eos: null, an integer, or a list of integers (the first is taken); -1 when absent. */
static ppn_status get_token(const cfg_ctx *x, const char *key, int *out)
{
    const json_t *v = json_object_get(x->root, key);
    *out = -1;
    if (json_is_array(v)) v = json_array_size(v) ? json_array_get(v, 0) : NULL;
    if (!v || json_is_null(v)) return PPN_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
        return ppn_err(PPN_EFORMAT, "%s: field '%s' must be null, a token id or a list of token ids", x->where,
                       key);
    *out = (int)json_integer_value(v);
    return PPN_OK;
}

/* ---- sections ----------------------------------------------------------------------------------------- */

static ppn_status parse_arch(cfg_ctx *x, ppn_model_config *cfg)
{
    const json_t *a = json_object_get(x->root, "architectures");
    if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_string(json_array_get(a, 0)))
        return ppn_err(PPN_EUNSUPPORTED, "%s: field 'architectures' is missing or empty; ppn needs one of "
                       "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM", x->where);
    const char *name = json_string_value(json_array_get(a, 0));
    for (size_t i = 0; i < PPN_ARRAY_LEN(k_archs); i++)
        if (strcmp(k_archs[i].name, name) == 0) x->arch = &k_archs[i];
    if (!x->arch)
        return ppn_err(PPN_EUNSUPPORTED, "%s: architecture '%.100s' is not supported (LlamaForCausalLM, "
                       "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM are)", x->where, name);
    cfg->arch = x->arch->arch;
    snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name);
    return PPN_OK;
}

/* Limits are generous (far beyond any real model) but keep every product of two of them inside int64. */
static ppn_status parse_sizes(const cfg_ctx *x, ppn_model_config *cfg)
{
    const json_t *r = x->root;
    PPN_CHECK(get_int(x, r, "", "hidden_size", 1, 0, 1, 1 << 20, &cfg->dim));
    PPN_CHECK(get_int(x, r, "", "num_hidden_layers", 1, 0, 1, 1 << 16, &cfg->n_layers));
    PPN_CHECK(get_int(x, r, "", "num_attention_heads", 1, 0, 1, 1 << 16, &cfg->n_heads));
    PPN_CHECK(get_int(x, r, "", "num_key_value_heads", 0, cfg->n_heads, 1, 1 << 16, &cfg->n_kv_heads));
    PPN_CHECK(get_int(x, r, "", "intermediate_size", 1, 0, 1, 1 << 24, &cfg->ffn_dim));
    PPN_CHECK(get_int(x, r, "", "vocab_size", 1, 0, 1, 1 << 26, &cfg->vocab));
    PPN_CHECK(get_int(x, r, "", "max_position_embeddings", 0, x->arch->max_pos_default, 1, 1 << 30,
                      &cfg->max_pos));
    PPN_CHECK(get_int(x, r, "", "head_dim", 0, 0, 1, 1 << 16, &cfg->head_dim));
    double eps;
    PPN_CHECK(get_pos_num(x, r, "", "rms_norm_eps", 0, 1e-6, &eps));
    /* A float32 in the kernels: 1e-300 would round to 0 there, and an eps of 1 or more is no epsilon. */
    if (!(eps < 1) || (float)eps < FLT_MIN)
        return ppn_err(PPN_EFORMAT, "%s: field 'rms_norm_eps' = %g is out of range: it must be in (0, 1) and at "
                       "least %g (float32's smallest normal)", x->where, eps, (double)FLT_MIN);
    cfg->norm_eps = (float)eps;
    return PPN_OK;
}

static ppn_status check_sizes(const cfg_ctx *x, ppn_model_config *cfg)
{
    if (cfg->head_dim == 0) {   /* absent: transformers derives it */
        if (cfg->dim % cfg->n_heads != 0)
            return ppn_err(PPN_EFORMAT, "%s: hidden_size %d is not a multiple of num_attention_heads %d (and "
                           "head_dim is absent)", x->where, cfg->dim, cfg->n_heads);
        cfg->head_dim = cfg->dim / cfg->n_heads;
    }
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ppn_err(PPN_EFORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                       x->where, cfg->n_heads, cfg->n_kv_heads);
    if (cfg->head_dim % 2 != 0)
        return ppn_err(PPN_EFORMAT, "%s: head_dim %d is odd (rotary embedding rotates pairs)", x->where,
                       cfg->head_dim);
    if ((long long)cfg->n_heads * cfg->head_dim > INT_MAX)
        return ppn_err(PPN_EFORMAT, "%s: num_attention_heads x head_dim overflows", x->where);
    return PPN_OK;
}

static ppn_status parse_llama3(const cfg_ctx *x, const json_t *p, const char *pfx, ppn_model_config *cfg)
{
    cfg->rope_type = PPN_ROPE_LLAMA3;
    PPN_CHECK(get_pos_num(x, p, pfx, "factor", 1, 0, &cfg->rope_factor));
    PPN_CHECK(get_pos_num(x, p, pfx, "low_freq_factor", 1, 0, &cfg->rope_low_freq_factor));
    PPN_CHECK(get_pos_num(x, p, pfx, "high_freq_factor", 1, 0, &cfg->rope_high_freq_factor));
    PPN_CHECK(get_int(x, p, pfx, "original_max_position_embeddings", 1, 0, 1, 1 << 30, &cfg->rope_orig_max_pos));
    /* llama3 interpolates between the two wavelengths: equal factors would divide by zero. */
    if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
        return ppn_err(PPN_EFORMAT, "%s: %shigh_freq_factor %g must be greater than low_freq_factor %g", x->where,
                       pfx, cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
    return PPN_OK;
}

/* rope_theta: the base of the rotary wavelengths theta^(2i/d); at 1 or below every pair rotates alike or
 * faster than position 1's angle (1e-300 sends theta^(-2i/d) to infinity). */
static ppn_status get_theta(const cfg_ctx *x, const json_t *obj, const char *pfx, double dflt, double *out)
{
    double t = dflt;
    PPN_CHECK(get_pos_num(x, obj, pfx, "rope_theta", 0, dflt, &t));
    if (!(t > 1))
        return ppn_err(PPN_EFORMAT, "%s: field '%srope_theta' = %g is out of range: it must be a finite number "
                       "greater than 1", x->where, pfx, t);
    *out = t;
    return PPN_OK;
}

/* 5.x rope_parameters wins when present; else 4.x rope_theta + rope_scaling. */
static ppn_status parse_rope(const cfg_ctx *x, ppn_model_config *cfg)
{
    const json_t *p = json_object_get(x->root, "rope_parameters");
    const char *pfx = "rope_parameters.";
    if (!p || json_is_null(p)) {
        p = json_object_get(x->root, "rope_scaling");
        pfx = "rope_scaling.";
    }
    PPN_CHECK(get_theta(x, x->root, "", 10000.0, &cfg->rope_theta));
    cfg->rope_type = PPN_ROPE_DEFAULT;
    if (!p || json_is_null(p)) return PPN_OK;
    if (!json_is_object(p)) return ppn_err(PPN_EFORMAT, "%s: field '%.*s' is not an object", x->where,
                                           (int)strlen(pfx) - 1, pfx);
    PPN_CHECK(get_theta(x, p, pfx, cfg->rope_theta, &cfg->rope_theta));
    const json_t *t = json_object_get(p, "rope_type");
    if (!t) t = json_object_get(p, "type");   /* older 4.x spelling */
    if (t && !json_is_string(t)) return ppn_err(PPN_EFORMAT, "%s: %srope_type is not a string", x->where, pfx);
    const char *type = t ? json_string_value(t) : "default";
    if (strcmp(type, "default") == 0) return PPN_OK;
    if (strcmp(type, "llama3") == 0) return parse_llama3(x, p, pfx, cfg);
    return ppn_err(PPN_EUNSUPPORTED, "%s: rope_type '%.64s' is not supported (default and llama3 are)", x->where,
                   type);
}

/* layer_types (transformers 4.5x+): absent or null, else one string per layer, each full_attention (ppn has no
 * other attention). A malformed list is refused rather than skipped: it may be the only place a checkpoint
 * says that some layers slide. */
static ppn_status check_layer_types(const cfg_ctx *x, const ppn_model_config *cfg)
{
    const json_t *lt = json_object_get(x->root, "layer_types");
    if (!lt || json_is_null(lt)) return PPN_OK;
    if (!json_is_array(lt))
        return ppn_err(PPN_EFORMAT, "%s: field 'layer_types' is not a list (it must list %d strings, one per "
                       "layer)", x->where, cfg->n_layers);
    if (json_array_size(lt) != (size_t)cfg->n_layers)
        return ppn_err(PPN_EFORMAT, "%s: field 'layer_types' is a list of %zu, but num_hidden_layers is %d (it "
                       "must hold one string per layer)", x->where, json_array_size(lt), cfg->n_layers);
    for (size_t i = 0; i < json_array_size(lt); i++)
        if (!json_is_string(json_array_get(lt, i)))
            return ppn_err(PPN_EFORMAT, "%s: field 'layer_types[%zu]' is not a string (layer_types must be a list "
                           "of %d strings)", x->where, i, cfg->n_layers);
    for (size_t i = 0; i < json_array_size(lt); i++) {
        const char *s = json_string_value(json_array_get(lt, i));
        if (strcmp(s, "full_attention") != 0)
            return ppn_err(PPN_EUNSUPPORTED, "%s: layer_types[%zu] is '%.40s'; only full_attention is supported",
                           x->where, i, s);
    }
    return PPN_OK;
}

/* Every layer must be full attention: ppn has no sliding-window attention. */
static ppn_status check_window(const cfg_ctx *x, const ppn_model_config *cfg)
{
    int use_sw = 0;
    PPN_CHECK(get_bool(x, "use_sliding_window", 0, &use_sw));
    if (use_sw && cfg->arch != PPN_ARCH_MISTRAL)
        return ppn_err(PPN_EUNSUPPORTED, "%s: sliding window attention (use_sliding_window=true) is not supported",
                       x->where);
    if (cfg->arch == PPN_ARCH_MISTRAL) {
        int sw = 0;
        PPN_CHECK(get_int(x, x->root, "", "sliding_window", 0, INT_MAX, 1, INT_MAX, &sw));
        if (sw < cfg->max_pos)
            return ppn_err(PPN_EUNSUPPORTED, "%s: sliding window attention (sliding_window=%d) is not supported",
                           x->where, sw);
    }
    return check_layer_types(x, cfg);
}

/* Biases: Qwen2 always has q/k/v bias (and no o bias). Llama/Qwen3 attention_bias=true also puts a bias on
 * o_proj, which ppn_layer_tensors has no slot for, so it is refused rather than dropped. */
static ppn_status parse_features(const cfg_ctx *x, ppn_model_config *cfg)
{
    int attn_bias = 0, mlp_bias = 0;
    PPN_CHECK(get_bool(x, "attention_bias", 0, &attn_bias));
    PPN_CHECK(get_bool(x, "mlp_bias", 0, &mlp_bias));
    PPN_CHECK(get_bool(x, "tie_word_embeddings", 0, &cfg->tied_embeddings));
    if (mlp_bias) return ppn_err(PPN_EUNSUPPORTED, "%s: mlp_bias=true is not supported", x->where);
    if (attn_bias && (cfg->arch == PPN_ARCH_LLAMA || cfg->arch == PPN_ARCH_QWEN3))
        return ppn_err(PPN_EUNSUPPORTED, "%s: attention_bias=true is not supported (it adds an o_proj bias)",
                       x->where);
    cfg->qkv_bias = cfg->arch == PPN_ARCH_QWEN2;
    cfg->qk_norm = cfg->arch == PPN_ARCH_QWEN3;
    const json_t *act = json_object_get(x->root, "hidden_act");
    if (act && !json_is_string(act))
        return ppn_err(PPN_EFORMAT, "%s: field 'hidden_act' is not a string", x->where);
    if (act && strcmp(json_string_value(act), "silu") != 0)
        return ppn_err(PPN_EUNSUPPORTED, "%s: hidden_act '%.40s' is not supported (silu is)", x->where,
                       json_string_value(act));
    const json_t *q = json_object_get(x->root, "quantization_config");
    if (q && !json_is_null(q))
        return ppn_err(PPN_EUNSUPPORTED, "%s: quantized checkpoints (quantization_config) are not supported",
                       x->where);
    PPN_CHECK(get_token(x, "bos_token_id", &cfg->bos_id));
    PPN_CHECK(get_token(x, "eos_token_id", &cfg->eos_id));
    return PPN_OK;
}

static ppn_status parse_root(cfg_ctx *x, ppn_model_config *cfg)
{
    PPN_CHECK(parse_arch(x, cfg));
    PPN_CHECK(parse_sizes(x, cfg));
    PPN_CHECK(check_sizes(x, cfg));
    PPN_CHECK(parse_rope(x, cfg));
    PPN_CHECK(parse_features(x, cfg));
    PPN_CHECK(check_window(x, cfg));
    return PPN_OK;
}

ppn_status ppn_config_parse(const char *json_text, size_t len, const char *where, ppn_model_config *cfg)
{
    json_error_t jerr;
    memset(cfg, 0, sizeof *cfg);
    cfg->bos_id = cfg->eos_id = -1;
    json_t *root = json_loadb(json_text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ppn_err(PPN_EFORMAT, "%s: not valid JSON (line %d: %s)", where, jerr.line, jerr.text);
    ppn_status st;
    cfg_ctx x = {.root = root, .where = where};
    if (!json_is_object(root)) st = ppn_err(PPN_EFORMAT, "%s: not a JSON object", where);
    else st = parse_root(&x, cfg);
    json_decref(root);
    return st;
}
