/* ppn.h - the one public header of ppn, a pipeline-parallel LLM inference runtime.
 *
 * Every function returns a ppn_status. On failure, ppn_last_error() holds a message (thread-local) that
 * names the culprit: the file, tensor, variable, driver call or op that caused it.
 */
#ifndef PPN_H
#define PPN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ppn_status {
    PPN_OK = 0,
    PPN_EINVAL,        /* an argument or configuration value is invalid */
    PPN_ENOMEM,        /* host or device memory exhausted (the object stays usable) */
    PPN_EIO,           /* a file could not be opened, read or mapped */
    PPN_EFORMAT,       /* a checkpoint or data file is malformed */
    PPN_EUNSUPPORTED,  /* a valid input that ppn does not handle (architecture, field, dtype) */
    PPN_ENODEV,        /* no such device, or no driver */
    PPN_EDRIVER,       /* a device driver call failed (message has the driver's error name and call site) */
    PPN_ENOKERNELS,    /* the cuda backend has no kernels (built without nvcc) */
    PPN_ERACE,         /* sim checker: two accesses on different streams with no event chain between them */
    PPN_EPLACEMENT,    /* sim checker: a device touched another device's memory without a peer grant */
    PPN_EUSEAFTERFREE, /* sim checker: an access to a freed block */
    PPN_EDOUBLEFREE,   /* a block freed twice */
    PPN_EBOUNDS,       /* sim checker: an access outside its block */
    PPN_EREFUSED,      /* a guard refused a path (named in the message) */
    PPN_EMISMATCH,     /* a gate found different results */
    PPN_ESTATE,        /* call made in the wrong state (e.g. sequence full) */
} ppn_status;

/* The message of the last failing call on this thread ("" if none). */
const char *ppn_last_error(void);
/* A constant name for a status, e.g. "PPN_ENOMEM". */
const char *ppn_status_name(ppn_status st);


/* ---------------------------------------------------------------------------------------------------------
 * Runtime, model, sequence.
 *
 * Threading contract: a ppn_rt, its models and sequences may be used from one thread at a time (the caller's);
 * ppn's own issue threads are internal. Different sequences of one model must not be stepped concurrently.
 * --------------------------------------------------------------------------------------------------------- */

typedef struct ppn_rt ppn_rt;
typedef struct ppn_model ppn_model;
typedef struct ppn_seq ppn_seq;

/* Create a runtime on a backend: "auto" (cuda when a driver, a device and kernels are present, else sim),
 * "cuda" or "sim"; NULL or "" reads PPN_BACKEND (default auto).
 * @return PPN_OK, PPN_EINVAL (unknown backend name or bad PPN_SIM_* value), PPN_ENODEV (cuda asked for, no
 *         driver or device), PPN_ENOKERNELS (cuda asked for, built without kernels), PPN_EDRIVER, PPN_ENOMEM. */
ppn_status ppn_rt_create(const char *backend, ppn_rt **out);
void ppn_rt_destroy(ppn_rt *rt);
/* "cuda" or "sim". */
const char *ppn_rt_backend(const ppn_rt *rt);

enum { PPN_DTYPE_DEFAULT = -1, PPN_DTYPE_F32 = 0, PPN_DTYPE_BF16 = 1, PPN_DTYPE_F16 = 2 };

typedef struct ppn_load_opts {
    int dtype;      /* PPN_DTYPE_*: weight storage; default bf16 on cuda, f32 on sim */
    int ctx;        /* KV positions; 0 = the model's maximum, capped to what fits on the device */
    int device;     /* device of a one-stage model (default 0) */
    /* Called as the weights upload (done/total bytes); may be NULL. */
    void (*progress)(void *arg, size_t done, size_t total);
    void *progress_arg;
} ppn_load_opts;

/* Default options: dtype default, ctx 0, device 0, no progress. */
ppn_load_opts ppn_load_opts_default(void);

/* Load a checkpoint (HF directory or llama2.c .bin) onto the runtime's device(s).
 * @return PPN_OK, PPN_EIO / PPN_EFORMAT / PPN_EUNSUPPORTED (the checkpoint; message names file and tensor),
 *         PPN_EINVAL (bad option: dtype, ctx, device), PPN_ENOMEM (device or host full: message names which
 *         and how much; nothing stays allocated), PPN_EDRIVER, PPN_ENOKERNELS. */
ppn_status ppn_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *opts, ppn_model **out);
void ppn_model_free(ppn_model *m);

typedef struct ppn_model_info {
    char arch[64];
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_pos;
    int ctx;             /* KV positions of each sequence */
    int dtype;           /* weight storage dtype */
    int bos_id, eos_id;  /* -1 if absent */
    size_t weight_bytes; /* on the device(s) */
} ppn_model_info;
void ppn_model_get_info(const ppn_model *m, ppn_model_info *out);

/* A sequence with its own KV cache of info.ctx positions.
 * @return PPN_OK, PPN_ENOMEM (device full: message says how much was asked), PPN_EDRIVER. */
ppn_status ppn_seq_create(ppn_model *m, ppn_seq **out);
void ppn_seq_destroy(ppn_seq *s);
/* Start over at position 0 (the cache is overwritten as positions are fed again). */
void ppn_seq_reset(ppn_seq *s);
/* Positions fed so far. */
int ppn_seq_pos(const ppn_seq *s);

/* Feed one token at the next position and compute the next-token logits.
 * logits: vocab floats written on return (NULL: skip the readback).
 * @return PPN_OK, PPN_EINVAL (token outside [0, vocab)), PPN_ESTATE (the sequence is full: ctx positions),
 *         PPN_EDRIVER (a device call failed: message names it), PPN_ERACE / PPN_EPLACEMENT / PPN_EUSEAFTERFREE /
 *         PPN_EBOUNDS / PPN_EDOUBLEFREE (sim checker report, printed and in the message). */
ppn_status ppn_decode_step(ppn_seq *s, int token, float *logits);

/* Sampling on the host from a logits row. temperature 0 = greedy (lowest index on ties). top_k 0 = off;
 * top_p 1 = off. rng: caller-owned state, seeded by ppn_rng_seed; the same seed gives the same ids. */
typedef struct ppn_sampler {
    float temperature;
    int top_k;
    float top_p;
    uint64_t rng[2];
} ppn_sampler;
void ppn_sampler_init(ppn_sampler *sp, float temperature, int top_k, float top_p, uint64_t seed);
/* @return PPN_OK, PPN_EINVAL (vocab <= 0, temperature < 0, top_p outside (0, 1]), PPN_ENOMEM. */
ppn_status ppn_sample(ppn_sampler *sp, const float *logits, int vocab, int *out_id);

#ifdef __cplusplus
}
#endif
#endif /* PPN_H */
