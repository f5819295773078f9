/* fuzz_config.c - a Hugging Face config.json text through ppn_config_parse. An accepted config must satisfy what
 * the loaders and the forward pass rely on without checking again (hfconfig.c's promises). */
#include <math.h>
#include "core/model/ckpt.h"
#include "fuzz_util.h"

static void check(const ppn_model_config *c)
{
    if (c->dim < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim < 1 ||
        c->ffn_dim < 1 || c->vocab < 1 || c->max_pos < 1)
        abort();
    if (c->n_heads % c->n_kv_heads || c->head_dim % 2 || (long long)c->n_heads * c->head_dim > 0x7fffffff) abort();
    if (!(c->norm_eps > 0 && c->norm_eps < 1) || !(c->rope_theta > 1) || !isfinite(c->rope_theta)) abort();
    if (c->rope_type == PPN_ROPE_LLAMA3 && !(c->rope_high_freq_factor > c->rope_low_freq_factor)) abort();
    if (memchr(c->arch_name, 0, sizeof c->arch_name) == NULL) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ppn_model_config cfg;
    if (ppn_config_parse((const char *)data, size, "config.json", &cfg) == PPN_OK) check(&cfg);
    return 0;
}
