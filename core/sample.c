/* sample.c - token sampling on the host: greedy, temperature, top-k, top-p; deterministic for a seed. */
#include <math.h>
#include <stdlib.h>
#include "ppn.h"
#include "core/base/err.h"
#include "alloc/host.h"

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

/* xoroshiro128+ */
static uint64_t rng_next(uint64_t s[2])
{
    uint64_t s0 = s[0], s1 = s[1], r = s0 + s1;
    s1 ^= s0;
    s[0] = rotl(s0, 24) ^ s1 ^ (s1 << 16);
    s[1] = rotl(s1, 37);
    return r;
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void ppn_sampler_init(ppn_sampler *sp, float temperature, int top_k, float top_p, uint64_t seed)
{
    sp->temperature = temperature;
    sp->top_k = top_k;
    sp->top_p = top_p;
    sp->rng[0] = splitmix(&seed);
    sp->rng[1] = splitmix(&seed);
}

static int argmax(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}

typedef struct cand { float p; int id; } cand;

/* Descending probability; ties by ascending id so the order is total and the result deterministic. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

ppn_status ppn_sample(ppn_sampler *sp, const float *logits, int vocab, int *out_id)
{
    if (vocab <= 0) return ppn_err(PPN_EINVAL, "sample: vocab %d", vocab);
    if (!(sp->temperature >= 0)) return ppn_err(PPN_EINVAL, "sample: temperature %g is negative", sp->temperature);
    if (!(sp->top_p > 0 && sp->top_p <= 1)) return ppn_err(PPN_EINVAL, "sample: top-p %g is not in (0, 1]", sp->top_p);
    if (sp->top_k < 0) return ppn_err(PPN_EINVAL, "sample: top-k %d is negative", sp->top_k);
    if (sp->temperature == 0) {
        *out_id = argmax(logits, vocab);
        return PPN_OK;
    }
    cand *c = ppn_halloc(sizeof *c * (size_t)vocab);
    if (!c) return ppn_err(PPN_ENOMEM, "sample: host out of memory");
    float mx = logits[argmax(logits, vocab)];
    for (int i = 0; i < vocab; i++) {
        float p = isnan(logits[i]) ? 0.f : expf((logits[i] - mx) / sp->temperature);
        c[i] = (cand){p, i};
    }
    qsort(c, (size_t)vocab, sizeof *c, cand_cmp);
    int n = sp->top_k > 0 && sp->top_k < vocab ? sp->top_k : vocab;
    double kept = 0;
    for (int i = 0; i < n; i++) kept += c[i].p;
    if (sp->top_p < 1) { /* smallest prefix whose mass reaches top_p of the kept mass */
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += c[i].p;
            if (acc >= sp->top_p * kept) {
                n = i + 1;
                kept = acc;
                break;
            }
        }
    }
    double u = (double)(rng_next(sp->rng) >> 11) * 0x1.0p-53 * kept, acc = 0;
    *out_id = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) {
            *out_id = c[i].id;
            break;
        }
    }
    ppn_hfree(c);
    return PPN_OK;
}
