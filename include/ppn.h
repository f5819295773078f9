/* ppn.h - the one public header of ppn, a pipeline-parallel LLM inference runtime.
 *
 * Objects and their order. A runtime (ppn_rt: one backend, its devices and pools) owns the models loaded on it
 * (ppn_model: weights, stage map, stage threads); a model owns its sequences (ppn_seq: KV caches, scratch, the
 * logits ring). Create parent before child; free child before parent: ppn_rt_destroy refuses while a model is
 * loaded and ppn_model_free refuses while a sequence lives (PPN_ESTATE, nothing freed). Every handle is opaque
 * and valid from its successful create until its destroy; every destroy accepts NULL.
 *
 * Errors. Functions that can fail return a ppn_status; the others say what they return. On failure,
 * ppn_last_error() holds a message naming the culprit (the file, tensor, variable, driver call or op). The
 * message is per thread and stays valid until the next ppn call on that thread fails; a success does not
 * clear it. Bad input (a malformed checkpoint, an invalid environment value, a missing or full device) is a
 * status, never a crash; after a failed call the object is either still usable or refuses every later call
 * with the same status, as each function says.
 *
 * Threading. A runtime, its models and their sequences are used from one thread at a time (the caller's);
 * ppn's stage issue threads are internal. Different sequences of one model must not be stepped concurrently.
 * A program that hands a model from one of its threads to another declares the hand-off to the sim checker
 * (ppn_model_handoff_release / ppn_model_handoff_acquire).
 *
 * The environment. ppn reads the variables `ppn env` lists (the door below, backend and diagnostics); an invalid
 * value is refused by the call that reads it, with PPN_EINVAL naming the variable, the value and the rule.
 *
 * Versions and the ABI. Before 1.0 each minor version may change the ABI (a struct grows, a return type
 * changes), so the shared library's SONAME carries major.minor (libppn.so.0.2): a program built against another
 * minor version does not load this one. Patch versions keep the ABI. From 1.0 on, the SONAME is libppn.so.MAJOR.
 */
#ifndef PPN_H
#define PPN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header belongs to (CMakeLists.txt reads it from here: the one place it is written). */
#define PPN_VERSION_MAJOR 0
#define PPN_VERSION_MINOR 2
#define PPN_VERSION_PATCH 0

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
    PPN_EBUSY,         /* a bounded queue is full: try again later (nothing was taken) */
    PPN_ENONFINITE,    /* a step's logits hold NaN or Inf (message names the sequence, position and stage) */
} ppn_status;

/* The message of the last failing call on this thread ("" if none); valid until the next failure on this thread. */
const char *ppn_last_error(void);
/* A constant name for a status, e.g. "PPN_ENOMEM". */
const char *ppn_status_name(ppn_status st);
/* The loaded library's version, "MAJOR.MINOR.PATCH" (a constant string): compare it with the PPN_VERSION_*
 * this program was compiled with. */
const char *ppn_version(void);



/* ---------------------------------------------------------------------------------------------------------
 * The door: how a model is cut into pipeline stages.
 *
 *   MEMRA_PP_STAGES=N          unset, 0 or 1: the door is shut and nothing behaves differently anywhere
 *   MEMRA_PP_SPLITS=c1,..,cN-1 explicit cuts, strictly increasing, each in (0, n_layers)
 *   MEMRA_PP_SPLIT=i           the N=2 spelling of the cut list
 *   (default cuts: the even split, cut s = s * n_layers / N)
 *   MEMRA_PP_DEVICES=d0,..     the device of each stage (default: all stages on the primary device)
 *   MEMRA_PP_SHARD=0           weights all on the primary device (remote stages peer-read); default 1
 *   MEMRA_PP_STREAMS=0         rollback: one stream, plain copies, no per-stage threads; default 1
 *   MEMRA_PP_OVERLAP=1         alternate the double-buffered boundary slots per step; default 0
 *   MEMRA_BATCH_PP, MEMRA_SPEC_PP, MEMRA_PRIME_PP, MEMRA_PRIME_PIPE = 0: A/B seams of later paths; default 1
 *   MEMRA_PP_ALLOW_UNSPLIT_BATCH=1   measurement override of the fail-closed guard; default 0
 *   PPN_SPIN=1                 issue threads busy-poll instead of sleeping on a futex; default 0
 *   PPN_GRAPHS=0               issue every kernel through the stream instead of replaying each stage's
 *                              captured graph; default 1 (PPN_KPROF=1 needs 0: its timing is per launch)
 *   PPN_FUSE=0                 give the RMSNorms their own launches instead of computing them in the next
 *                              matvec's input, the rotary its own instead of attention's, and the many-rows
 *                              GEMMs f32 x instead of bf16 x written by the norm and SwiGLU before them (the
 *                              same bits either way); default 1 (docs/PERF.md measures each)
 *   PPN_ATTN_TC=0              a batch step's attention (bf16 cache, head_dim 64 or 128, at most 8 query heads a
 *                              KV head) on the decode kernel per row instead of tensor cores: each row's attention
 *                              then has the decode kernel's arithmetic (q and the softmax weights in f32) at the
 *                              batch's split; default 1 (tensor cores, q and the weights rounded to bf16)
 * CLI flags --stages --splits --split --devices --shard --streams --overlap --spin --graphs --fuse --attn-tc say the
 * same.
 * --------------------------------------------------------------------------------------------------------- */

#define PPN_MAX_STAGES 64

typedef struct ppn_door {
    int n_stages;                /* 0 or 1: shut */
    int n_cuts;                  /* 0: even split; else n_stages - 1 explicit cuts */
    int cuts[PPN_MAX_STAGES];
    int n_devices;               /* 0: all stages on the primary device; else n_stages entries */
    int devices[PPN_MAX_STAGES];
    int shard, streams, overlap; /* 1, 1, 0 by default */
    int batch_pp, spec_pp, prime_pp, prime_pipe; /* 1 by default */
    int allow_unsplit_batch;     /* 0 by default */
    int spin;                    /* 0 by default */
    int graphs;                  /* 1 by default: each stage's step replays a captured graph (PPN_GRAPHS) */
    int fuse;                    /* 1 by default: the norms computed in the next matvec's input (PPN_FUSE) */
    int attn_tc;                 /* 1 by default: a batch step's attention on tensor cores (PPN_ATTN_TC) */
} ppn_door;

/* The door with every default (shut). */
ppn_door ppn_door_default(void);
/* Read the door from the environment (syntax only: numbers, lists, 0/1 flags).
 * @return PPN_OK, PPN_EINVAL (message names the variable, its value and the rule). */
ppn_status ppn_door_from_env(ppn_door *d);
/* Resolve the door against a model and machine: the fence [0, c1, .., cN-1, n_layers] (n_out + 1 entries)
 * and the device of each stage. A shut door resolves to one stage on the primary device.
 * @return PPN_OK, PPN_EINVAL (N above n_layers, cuts not increasing or out of range, wrong count of cuts or
 *         devices, a device that does not exist: the message names the variable, value and rule). */
ppn_status ppn_door_resolve(const ppn_door *d, int n_layers, int n_devices, int primary, int *fence,
                            int *stage_dev, int *n_out);

/* ---------------------------------------------------------------------------------------------------------
 * Runtime, model, sequence (ownership and threading: see the top of this file).
 * --------------------------------------------------------------------------------------------------------- */

typedef struct ppn_rt ppn_rt;
typedef struct ppn_model ppn_model;
typedef struct ppn_seq ppn_seq;

/* Create a runtime on a backend: "auto" (cuda when a driver, a device and kernels are present, else sim),
 * "cuda" or "sim"; NULL or "" reads PPN_BACKEND (default auto).
 * @return PPN_OK, PPN_EINVAL (unknown backend name or bad PPN_SIM_* value), PPN_ENODEV (cuda asked for, no
 *         driver or device), PPN_ENOKERNELS (cuda asked for, built without kernels), PPN_EDRIVER, PPN_ENOMEM. */
ppn_status ppn_rt_create(const char *backend, ppn_rt **out);
/* Destroy a runtime whose models were all freed (NULL: nothing to do). A device free that fails does not stop it:
 * everything else is freed, the backend closed (which reclaims what the driver refused) and the first failure
 * returned; the runtime is gone either way.
 * @return PPN_OK, PPN_ESTATE (models still loaded on it: the message says how many; nothing is freed),
 *         PPN_EDRIVER (a device free failed: the message names it). */
ppn_status ppn_rt_destroy(ppn_rt *rt);
/* "cuda" or "sim". */
const char *ppn_rt_backend(const ppn_rt *rt);
/* Devices the runtime can place stages on (at least 1). */
int ppn_rt_device_count(const ppn_rt *rt);
/* 1 if kernels on device dev can be granted access to peer's memory (0 if not, or on a bad ordinal). */
int ppn_rt_peer_possible(const ppn_rt *rt, int dev, int peer);

/* Element types of weights and KV caches. DEFAULT: bf16 on cuda, f32 on sim (ppn_load_opts.dtype). */
typedef enum ppn_dtype { PPN_DTYPE_DEFAULT = -1, PPN_DTYPE_F32 = 0, PPN_DTYPE_BF16 = 1, PPN_DTYPE_F16 = 2 } ppn_dtype;
/* "f32", "bf16", "f16", "default"; "?" for a value outside the enum. Static storage. */
const char *ppn_dtype_name(ppn_dtype dt);

typedef struct ppn_load_opts {
    int dtype;      /* PPN_DTYPE_*: weight storage; default bf16 on cuda, f32 on sim */
    int ctx;        /* KV positions of one sequence; 0 = the model's maximum, capped to what fits on the device */
    int kv_tokens;  /* paged KV: positions the pools hold for all sequences together (rounded up to blocks of
                     * 16); 0 = 4 * ctx (at least 1024), capped to the whole blocks that fit next to the weights,
                     * leaving each stage's many-rows scratch for PPN_PREFILL_CHUNK rows free where a context fits
                     * beside it (a ctx of 0 shrinks to them where one sequence would not fit; a given ctx is
                     * refused) */
    int device;     /* the primary device (default 0): stages go here unless the door places them */
    const ppn_door *door; /* NULL: read the door from the environment (MEMRA_PP_*) */
    /* Called as the weights upload (done/total bytes); may be NULL. */
    void (*progress)(void *arg, size_t done, size_t total);
    void *progress_arg;
} ppn_load_opts;

/* Default options: dtype default, ctx 0, kv_tokens 0, device 0, no progress. */
ppn_load_opts ppn_load_opts_default(void);

/* Load a checkpoint (HF directory or llama2.c .bin) onto the runtime's device(s). Every file is untrusted input:
 * anything but a regular file is refused (PPN_EIO), and so is a tensor the config does not use (PPN_EFORMAT:
 * layers past num_hidden_layers, biases or norms the architecture has not, unknown names), and so is a weight
 * that is NaN or Inf (PPN_EFORMAT) or that the chosen dtype cannot hold (PPN_EUNSUPPORTED: 1e30 as f16).
 * @return PPN_OK, PPN_EIO / PPN_EFORMAT / PPN_EUNSUPPORTED (the checkpoint; message names file and tensor),
 *         PPN_EINVAL (NULL, bad option: dtype, ctx, device), PPN_ESTATE (an engine runs on a model of rt: load
 *         on a runtime of its own), PPN_ENOMEM (device or host full: message names which and how much; nothing
 *         stays allocated), PPN_EDRIVER, PPN_ENOKERNELS. */
ppn_status ppn_model_load(ppn_rt *rt, const char *path, const ppn_load_opts *opts, ppn_model **out);
/* Free a model whose sequences were all destroyed (NULL: nothing to do): stage threads stopped, streams drained,
 * weights returned to the pools. A model that failed (a sticky stage failure) is freed the same way. A device
 * free that fails does not stop it: the model is gone and the first failure returned.
 * @return PPN_OK, PPN_ESTATE (an engine runs on it or on another model of its runtime, or sequences are still
 *         live on it: the message says which and how many; nothing is freed),
 *         PPN_EDRIVER (a block's free could not be ordered on its stream: the block is kept out of use until
 *         ppn_rt_destroy, which frees it; the message names it). */
ppn_status ppn_model_free(ppn_model *m);

typedef struct ppn_model_info {
    char arch[64];
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, vocab, max_pos;
    int ctx;             /* KV positions of each sequence */
    int dtype;           /* weight storage dtype */
    int kv_dtype;        /* KV cache element dtype: the weights' (f32 values rounded to it on the store) */
    int bos_id, eos_id;  /* -1 if absent */
    size_t weight_bytes; /* on the device(s) */
} ppn_model_info;
/* The loaded model's shape and storage, as placed. Never fails. */
void ppn_model_get_info(const ppn_model *m, ppn_model_info *out);

/* A model handed from one of the embedder's threads to another (the API allows one thread at a time; see the top of
 * this file), declared to the sim checker. Thread A calls ppn_model_handoff_release before the signal that hands the
 * model over (a queue, a mutex, a flag, a pthread_create or join), thread B ppn_model_handoff_acquire after the wait,
 * both with the same key: any address of the embedder's that names this hand-off (the flag, the queue entry), never
 * NULL. For the checker, what A had done and waited for on the model, its runtime and its sequences before the release
 * (its calls, and the device work they waited out: steps, readbacks, drains) then happens before what B does on them
 * after the acquire; work A left in flight (a deferred step) stays ordered only by its own wait, whoever makes it.
 * Matters with a checker clock per host thread (PPN_SIM_THREAD_CLOCKS=1, the sim's default), where a sync orders only
 * the syncing thread's later work: without the declaration, B's work may be reported (PPN_ERACE) against what only A
 * waited for. Releases under a key accumulate; an acquire of a key never released adopts nothing. Nothing on cuda or
 * with PPN_SIM_THREAD_CLOCKS=0 (one clock shared by every thread); nothing on the devices either, so a model that has
 * failed declares too. The sim's records are kept until the runtime is destroyed (its running out of host memory for
 * one is its sticky report, as any other).
 * @return PPN_OK, PPN_EINVAL (m or key NULL: nothing declared). */
ppn_status ppn_model_handoff_release(ppn_model *m, const void *key);
/* The acquiring side of ppn_model_handoff_release: after the wait, on the thread that takes the model over.
 * @return PPN_OK, PPN_EINVAL (m or key NULL: nothing declared). */
ppn_status ppn_model_handoff_acquire(ppn_model *m, const void *key);

/* A sequence of up to info.ctx positions; its KV lives in blocks of the model's paged pools, taken as it grows
 * (ppn_kv_info). A step that finds no free block is refused with PPN_ENOMEM naming the sequence.
 * @return PPN_OK, PPN_ENOMEM (device full: message says how much was asked; nothing stays allocated),
 *         PPN_EDRIVER, the model's sticky failure. */
ppn_status ppn_seq_create(ppn_model *m, ppn_seq **out);
/* Destroy a sequence (NULL: nothing to do). Its steps still in flight are drained first and their results
 * dropped (a failure they met stays the model's); its ppn_step_id values die with it. The sequence is gone
 * whatever the status: a device free that fails does not stop the rest.
 * @return PPN_OK, PPN_EDRIVER (a block's free could not be ordered on its stream: the block is kept out of use
 *         until ppn_rt_destroy, which frees it; the message names it). */
ppn_status ppn_seq_destroy(ppn_seq *s);
/* Start over at position 0 (its KV blocks go back to the pools). Deferred steps still in flight are drained
 * first and their results dropped, so their in-flight room is free again.
 * @return PPN_OK, or the failure one of those steps met (the sequence is reset all the same). */
ppn_status ppn_seq_reset(ppn_seq *s);
/* KV blocks s holds (each PPN_KV_BLOCK_POSITIONS positions; taken as it grows, returned by reset, truncate and
 * destroy). 0 for NULL. */
int ppn_seq_kv_blocks(const ppn_seq *s);

#define PPN_KV_BLOCK_POSITIONS 16

/* The paged KV pools: one pool per layer on its stage's device, shared by every sequence in blocks. A step that
 * needs a block when none is free is refused with PPN_ENOMEM naming the sequence, before anything is issued. */
typedef struct ppn_kv_info {
    int block_positions;   /* positions per block */
    int blocks_total, blocks_used;
    int positions;         /* blocks_total * block_positions */
    size_t bytes;          /* device memory of every layer's K and V pools */
} ppn_kv_info;
/* Never fails. */
void ppn_model_get_kv_info(const ppn_model *m, ppn_kv_info *out);
/* Positions fed so far (steps issued, waited or not). */
int ppn_seq_pos(const ppn_seq *s);

/* Feed one token at the next position and compute the next-token logits.
 * logits: vocab floats written on return (NULL: skip the readback).
 * @return PPN_OK, PPN_EINVAL (token outside [0, vocab)), PPN_ESTATE (the sequence is full: ctx positions),
 *         PPN_EDRIVER (a device call failed: message names it), PPN_ERACE / PPN_EPLACEMENT / PPN_EUSEAFTERFREE /
 *         PPN_EBOUNDS / PPN_EDOUBLEFREE (sim checker report, printed and in the message), PPN_ENONFINITE (the
 *         logits read back hold NaN or Inf: the message names the sequence, the step's position and the stage
 *         that computed them; the logits are written all the same, and the model is not failed). */
ppn_status ppn_decode_step(ppn_seq *s, int token, float *logits);


/* Publish a new door for the model, between steps: the stage map (fence, devices, transports, flags) is
 * rebuilt and published with RCU; flags and seams switch live. In-flight deferred steps are drained first.
 * @return PPN_OK, PPN_EINVAL (a door value, or a map that needs weights elsewhere than they were loaded:
 *         moving weights needs a reload), PPN_ESTATE (a live sequence holds KV on a device the new map does
 *         not run its layers on), PPN_ENOMEM, PPN_EDRIVER. */
ppn_status ppn_model_publish_door(ppn_model *m, const ppn_door *d);

/* Deferred steps a sequence may have in flight at once. */
#define PPN_MAX_INFLIGHT 4

/* A deferred step of one sequence, whose logits are still on the last stage's device. 0 is never a step. */
typedef uint64_t ppn_step_id;

/* Issue one step without waiting for its logits; later steps may be issued while it drains (up to
 * PPN_MAX_INFLIGHT per sequence). The token of each step must be known (prompt, replay, or a device-side
 * choice). Each step must be waited with ppn_pending_wait (any order), or dropped by ppn_seq_reset or
 * ppn_seq_destroy, before its in-flight room is free again.
 * @return PPN_OK (*out names the step), PPN_EINVAL (token or NULL out), PPN_ESTATE (sequence full, or
 *         PPN_MAX_INFLIGHT steps in flight: *out = 0, nothing issued), the model's sticky failure, PPN_EDRIVER.
 *         A failure after the step was issued still sets *out: wait it to free its room. */
ppn_status ppn_decode_step_deferred(ppn_seq *s, int token, ppn_step_id *out);
/* Drain a deferred step of s through the dedicated readback stream; logits (vocab floats) may be NULL.
 * @return PPN_OK, PPN_EINVAL (not a step of s in flight: already waited, dropped, or never issued), a stage's
 *         failure (sticky for the model: the message names the stage, the step and the cause), the sim
 *         checker's statuses, PPN_ENONFINITE (as ppn_decode_step). */
ppn_status ppn_pending_wait(ppn_seq *s, ppn_step_id step, float *logits);

/* Greedy decode without a host round trip per token: feed token, then n - 1 more steps, each fed the argmax of
 * the previous step's logits by the device itself (lowest index on ties); ids[i] = the argmax
 * after step i, so ids[n - 1] is the next token to feed. The host keeps up to 4 steps in flight and reads back
 * 4 bytes per step, never the logits. Through the same stages, transports and graphs as the other steps.
 * @return PPN_OK, PPN_EINVAL (NULL, n <= 0, token), PPN_ESTATE (deferred steps in flight, or fewer than n
 *         positions left: nothing is issued then), a stage's failure (sticky), PPN_EDRIVER, PPN_ENONFINITE (a
 *         step with a logit that is NaN or infinite: the device argmax returns -1 for it, so no token is chosen
 *         among them; the message names the position and the stage). */
ppn_status ppn_decode_greedy(ppn_seq *s, int token, int n, int *ids);

/* ---------------------------------------------------------------------------------------------------------
 * Prompts, many rows at a time (prefill).
 * --------------------------------------------------------------------------------------------------------- */

#define PPN_PREFILL_CHUNK 2048     /* rows per chunk when the options say 0 (docs/PERF.md: why 2048) */
#define PPN_PREFILL_MAX_CHUNK 8192

typedef struct ppn_prefill_opts {
    int chunk;      /* rows per chunk, 1 .. PPN_PREFILL_MAX_CHUNK; 0: PPN_PREFILL_CHUNK */
    int all_logits; /* 1: every prompt row's logits; 0: each prompt's last row's only */
} ppn_prefill_opts;

/* chunk 0, last rows only. */
ppn_prefill_opts ppn_prefill_opts_default(void);

/* Feed n prompt ids to s at its next positions, in chunks of up to o->chunk rows (o NULL: the defaults): each
 * chunk is one walk through the layers (every weight read once for all its rows), its K/V written on each
 * owning stage. With the door open the chunks walk the stage split (MEMRA_PRIME_PP=1, the default) with up to
 * PPN_MAX_INFLIGHT chunks in flight so the stages work at once (MEMRA_PRIME_PIPE=1, the default); MEMRA_PRIME_PP=0
 * walks every layer on stage 0's stream. Afterwards the sequence continues with ppn_decode_* at position +n.
 * logits: NULL, vocab floats (the last row's), or n * vocab floats with o->all_logits (row t = the logits after
 * ids[0..t]).
 * @return PPN_OK, PPN_EINVAL (NULL seq or ids, n < 1, an id outside the vocabulary, chunk out of range),
 *         PPN_ESTATE (deferred steps in flight on s, or n positions past its context: named, nothing fed),
 *         PPN_EUNSUPPORTED (MEMRA_PRIME_PP=0 over devices without peer access), PPN_ENOMEM (growing the chunk
 *         room failed: the model is refused afterwards), the model's sticky failure, PPN_EDRIVER, the sim
 *         checker's statuses. A failure after rows were issued is sticky for the model. PPN_ENONFINITE: a row
 *         of logits returned holds NaN or Inf (named: prompt, sequence, position, stage; the prompt was fed;
 *         sticky for the model when several prompts were primed together, as after any failure once issued). */
ppn_status ppn_prefill(ppn_seq *s, const int *ids, int n, const ppn_prefill_opts *o, float *logits);
/* Several sequences' prompts (count, of one model) primed together: chunks hold rows of different sequences, each
 * attending only to its own cache, so every weight is read once per chunk for all of them. ids[i] holds n[i]
 * ids for seqs[i] (distinct sequences). logits: NULL, count * vocab floats (each prompt's last row, in order),
 * or (n[0] + .. + n[count-1]) * vocab floats with o->all_logits (the prompts' rows in order).
 * @return as ppn_prefill, naming the prompt (also PPN_EINVAL for a sequence given twice or of another model). */
ppn_status ppn_prefill_batch(ppn_seq *const *seqs, const int *const *ids, const int *n, int count,
                             const ppn_prefill_opts *o, float *logits);
/* Whether a prompt row primed in a chunk of a rows gets exactly the bits it gets in a chunk of b rows (and so
 * every later row of its prompt, whose attention reads its K/V): 1 where every GEMM of m's layers and head sums its
 * outputs in the same order at a rows as at b; 0 where one does not (a chunk of 16 rows and one of 100 take other
 * kernels for bf16 weights: docs/VALIDATION.md, "batch invariance"), or for NULL m, a < 1 or b < 1. Several
 * prompts primed together share chunks of other sizes than each alone would: their rows have the bits of each
 * primed alone where each row's two chunk sizes agree so (ppn gate prime's batched arm checks that). */
int ppn_model_rows_same_bits(const ppn_model *m, int a, int b);

/* ---------------------------------------------------------------------------------------------------------
 * Many sequences per step (batched decode).
 * --------------------------------------------------------------------------------------------------------- */

typedef struct ppn_batch_opts {
    int micro; /* micro-batches the rows are cut into, 1 .. PPN_MAX_INFLIGHT; 0: one per distinct device of the
                * stage map (1 on one device, where more would only read the weights more often) */
    /* A mixed step: n_prime prompt slices fed in the same forward as the decode rows (chunked prefill beside
     * running decodes, so every weight is read once for both). prime_seqs[i] (distinct, none of them a decode
     * row's sequence) takes the prime_n[i] ids prime_ids[i] at its next positions, as ppn_prefill_batch would;
     * prime_logits: NULL, or an entry per slice, NULL or vocab floats for the logits after that slice's last id.
     * The prompt rows come first in the walk; with them the step is one walk (micro 0 or 1), never captured as a
     * graph, and all its rows together are at most PPN_PREFILL_MAX_CHUNK. n_prime 0: a plain batch. */
    int n_prime;
    ppn_seq *const *prime_seqs;
    const int *const *prime_ids;
    const int *prime_n;
    float *const *prime_logits;
} ppn_batch_opts;

/* micro 0, no prompt slices. */
ppn_batch_opts ppn_batch_opts_default(void);

/* Decode one token for each of n distinct sequences of one model in one forward: row i feeds tokens[i] to seqs[i]
 * at its next position; every weight is read once per micro-batch for all its rows, each row attends only to its
 * own sequence's cache (sequences may be at different lengths). With the door open the step walks the stage split
 * (MEMRA_BATCH_PP=1, the default), its micro-batches pipelined over the stages' devices; MEMRA_BATCH_PP=0 walks
 * every layer on stage 0's stream. Row i's logits equal its single-sequence step's within the fixture tolerance
 * (docs/VALIDATION.md says which kernels differ in bits).
 * logits: NULL or n * vocab floats (row i's at i * vocab); ids: NULL or n ints, row i's argmax taken on the
 * device (lowest index on ties; -1, reported as PPN_ENONFINITE, where a logit is NaN or infinite): only those 4
 * bytes a row are read back. o: NULL for defaults.
 * A batch of one (on the split or one stage) without prompt slices is issued as a decode step: ppn_decode_step's
 * kernels and bits. With prompt slices (o->n_prime) a decode row's logits are the batch's within the fixture
 * tolerance, not its bits: the GEMMs' tiles follow the walk's row count.
 * @return PPN_OK, PPN_EINVAL (NULL, n <= 0, a token, a sequence given twice, sequences of different models,
 *         micro out of range; a prompt slice: NULL, empty, an id outside the vocabulary, its sequence also a
 *         decode row's or given twice, micro above 1, more than PPN_PREFILL_MAX_CHUNK rows in all: named),
 *         PPN_ESTATE (a sequence full or with deferred steps in flight, or a slice past its context: named,
 *         nothing issued), PPN_EREFUSED (MEMRA_BATCH_PP=0 while the door places weights on several devices, so the walk
 *         would read them over the link every step; MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 overrides, for measurement),
 *         PPN_ENOMEM (growing the rows room failed: the model is refused afterwards), the model's sticky failure,
 *         PPN_EDRIVER, the sim checker's statuses. A failure after rows were issued is sticky for the model:
 *         so is PPN_ENONFINITE (a row's logits or its device argmax were NaN or Inf: named) for n > 1; a batch of
 *         one reports it as ppn_decode_step does. */
ppn_status ppn_decode_batch_ex(ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *o,
                               float *logits, int *ids);
/* ppn_decode_batch_ex with the default options and no ids. */
ppn_status ppn_decode_batch(ppn_seq **seqs, const int *tokens, int n, float *logits);

/* Greedy decode of a batch without a host round trip per step: row i is fed tokens[i], then steps - 1 more steps,
 * each fed row i's argmax of the previous step by the device itself (ppn_decode_batch_ex's argmax: lowest index on
 * ties); ids[t * n + i] = row i's argmax after step t, so ids[(steps - 1) * n + i] is the next
 * token to feed seqs[i]. Every step walks as ppn_decode_batch_ex(seqs, .., o, NULL, ids) would (the same arm,
 * micro-batches and graphs: the same bits as that call in a host loop feeding its ids back); the host keeps up to
 * PPN_MAX_INFLIGHT steps in flight and reads back 4 bytes a row a step, never the logits. With MEMRA_BATCH_PP=0
 * (the unsplit walk, synchronous) one step is in flight at a time, its tokens still fed on the device. A batch of
 * one on the split (or one stage) is ppn_decode_greedy. Counted in ppn_stats.batch_greedy_steps (and batch_steps).
 * Checks come first, for all steps: nothing is issued when they fail, and every KV block the steps need is reserved
 * before the first one (PPN_ENOMEM naming the sequence when the pools run out: nothing moved).
 * @return PPN_OK, PPN_EINVAL (as ppn_decode_batch_ex; ids NULL, steps <= 0, prompt slices), PPN_ESTATE (a sequence
 *         with deferred steps in flight, or with fewer than steps positions left: named, nothing issued),
 *         PPN_EREFUSED and PPN_EUNSUPPORTED (the unsplit walk, as ppn_decode_batch_ex), PPN_ENOMEM (KV blocks: named,
 *         nothing moved; growing the rows room: the model is refused afterwards; the device token blocks or host
 *         memory: nothing issued), the model's sticky failure, PPN_EDRIVER, the sim checker's statuses. A failure
 *         after the first step was issued is sticky for the model (the ids of the steps before it are written), so
 *         is PPN_ENONFINITE for n > 1: a row with a logit that is NaN or infinite (its device argmax is -1, which
 *         the next step's embedding reads as zeros), named by row, step, sequence, position and stage. A batch of
 *         one reports it as ppn_decode_greedy does. PPN_EDRIVER after every step ran (ids all written, not sticky):
 *         a device token block's free could not be ordered (the block is kept out of use until ppn_rt_destroy). */
ppn_status ppn_decode_batch_greedy(ppn_seq *const *seqs, const int *tokens, int n, int steps, const ppn_batch_opts *o,
                                   int *ids);

/* Issue a batch step as ppn_decode_batch_ex(seqs, tokens, n, o, logits, ids) does (the same walk and bits) without
 * waiting for it, so the caller can do host work meanwhile; *out names it for ppn_decode_batch_wait. logits (n *
 * vocab floats) and ids (n ints), each NULL or the caller's, are written by the time the wait returns PPN_OK and
 * must stay valid until then (or until the step is dropped). The rows' positions advance at issue. Each row's
 * sequence counts the step in its in-flight room (PPN_MAX_INFLIGHT, shared with ppn_decode_step_deferred) until it
 * is waited or dropped: deferred steps of a row may be in flight already, and later ones may follow (tokens known).
 * ppn_seq_reset, ppn_seq_truncate and ppn_seq_destroy of a row drop it from the step: the step's walks are waited
 * first (no readback), that row's room is free again, and the other rows keep their results for their wait; a step
 * whose every row dropped it is gone. With MEMRA_BATCH_PP=0 the step runs at issue (the unsplit walk is
 * synchronous). No prompt slices (o->n_prime 0).
 * @return PPN_OK (*out names the step), PPN_EINVAL (as ppn_decode_batch_ex; out NULL; prompt slices), PPN_ESTATE (a
 *         row full, or with PPN_MAX_INFLIGHT steps in flight: named, *out = 0, nothing issued), PPN_EREFUSED,
 *         PPN_EUNSUPPORTED, PPN_ENOMEM (as ppn_decode_batch_ex; *out = 0), the model's sticky failure, PPN_EDRIVER,
 *         the sim checker's statuses. A failure after the step was issued is sticky for the model and still sets
 *         *out: wait it (or drop it) to free the rows' room. */
ppn_status ppn_decode_batch_deferred(ppn_seq *const *seqs, const int *tokens, int n, const ppn_batch_opts *o,
                                     float *logits, int *ids, ppn_step_id *out);
/* Wait for a deferred batch step (any order, any row's sequence s naming it) and check its rows, as
 * ppn_decode_batch_ex does at its end; the rows' room is free after, whatever the status. Rows whose sequence
 * dropped the step are written too (what the walk computed) but not checked.
 * @return PPN_OK, PPN_EINVAL (s NULL, or step not a batch step of s in flight: already waited, dropped by a reset,
 *         truncate or destroy of s, never issued, or a ppn_decode_step_deferred id), the failure its issue or its
 *         walks met (sticky for the model), PPN_ENONFINITE (a row's logits or device argmax NaN or Inf: named; the
 *         model's failure for n > 1, a batch of one as ppn_pending_wait reports it). */
ppn_status ppn_decode_batch_wait(ppn_seq *s, ppn_step_id step);

/* ---------------------------------------------------------------------------------------------------------
 * Speculative decoding: verify drafts in one forward, roll back what was rejected.
 * --------------------------------------------------------------------------------------------------------- */

#define PPN_SPEC_MAX_DRAFT 64

/* Move s back to position pos (0 .. its length): the positions after it are forgotten (their KV rows are
 * overwritten by the next feed). Steps in flight are dropped first.
 * @return PPN_OK, PPN_EINVAL (NULL, pos out of range: nothing changes), the model's sticky failure. */
ppn_status ppn_seq_truncate(ppn_seq *s, int pos);
/* Greedy verify of k draft tokens (0 .. PPN_SPEC_MAX_DRAFT) in one forward of k + 1 rows: token at s's next
 * position, then draft[0 .. k). Row j's argmax a_j is taken on the device; draft j is accepted while it equals
 * a_j, so acc (0 .. k) drafts stand; out[0 .. acc] = a_0 .. a_acc (the accepted drafts, then the next token to
 * feed) and *n_out = acc + 1, exactly the ids plain greedy decode gives from token on (to rounding of the
 * many-rows kernels: docs/VALIDATION.md). s ends at position + 1 + acc: the rejected rows are rolled back on every
 * owning stage. With the door open the forward walks the stage split (MEMRA_SPEC_PP=1, the default);
 * MEMRA_SPEC_PP=0 walks every layer on stage 0's stream. out holds k + 1 ints.
 * @return PPN_OK, PPN_EINVAL (NULL, k or an id out of range), PPN_ESTATE (deferred steps in flight, or k + 1
 *         positions past the context: nothing fed), PPN_EREFUSED (MEMRA_SPEC_PP=0 with weights sharded over several
 *         devices; MEMRA_PP_ALLOW_UNSPLIT_BATCH=1 overrides, for measurement), PPN_ENOMEM (growing the rows room
 *         failed: the model is refused afterwards), the model's sticky failure, PPN_EDRIVER. */
ppn_status ppn_spec_verify(ppn_seq *s, int token, const int *draft, int k, int *out, int *n_out);
/* The prompt-lookup drafter (no second model): the longest suffix of hist[0 .. n) of at most ngram_max ids that
 * also occurs earlier in hist, and up to k ids that followed its most recent earlier occurrence, into draft.
 * Returns how many (0: no match; also for NULL or non-positive arguments). */
int ppn_draft_lookup(const int *hist, int n, int k, int ngram_max, int *draft);

/* Liveness counters and memory statistics. */
typedef struct ppn_stats {
    int n_stages;
    uint64_t walker_runs[PPN_MAX_STAGES];      /* steps each stage's layer walker executed */
    uint64_t overlap_observed;                 /* a walker started while another stage's walker was active */
    uint64_t boundary_sends[PPN_MAX_STAGES];   /* hand-offs per boundary */
    uint64_t boundary_overlap_steps[PPN_MAX_STAGES]; /* hand-offs on the second slot (MEMRA_PP_OVERLAP=1) */
    uint64_t steps;                            /* steps issued */
    uint64_t driver_allocs;                    /* raw device allocations so far (backend counter) */
    uint64_t host_staged;                      /* peer copies staged through the host */
    uint64_t cross_waits;                      /* pool waits inserted for cross-stream reuse */
    size_t pool_in_use, pool_peak, pool_reserved; /* summed over devices */
    uint64_t graph_captures;                   /* stage bodies captured into graphs (PPN_GRAPHS=1) */
    uint64_t graph_launches;                   /* graph replays (backend counter) */
    uint64_t prime_split_chunks;               /* prefill chunks that walked the per-stage split */
    uint64_t prime_pipe_overlaps;              /* a stage's prefill walker entered while another stage's ran */
    uint64_t prime_batches;                    /* prefill calls that primed several sequences together */
    uint64_t prime_batch_splits;               /* chunks of those (several sequences' rows) that walked the split */
    uint64_t batch_walks[PPN_MAX_STAGES];      /* batched decode walks (micro-batches) each stage executed */
    uint64_t batch_steps;                      /* batched decode steps done */
    uint64_t batch_split_steps;                /* micro-batches that walked the per-stage split */
    uint64_t batch_pipe_overlaps;              /* a stage's batch walker entered while another stage's ran */
    uint64_t mixed_steps;                      /* batched steps that also fed prompt slices (ppn_batch_opts) */
    uint64_t spec_verifies, spec_drafted, spec_accepted; /* ppn_spec_verify calls, draft ids given, accepted */
    uint64_t spec_split_verifies;              /* verify forwards that walked the per-stage split */
    uint64_t batch_greedy_steps;               /* steps of ppn_decode_batch_greedy done (fed on the device) */
    /* pool blocks retired, summed over devices: a free whose ordering failed (PPN_EDRIVER from ppn_seq_destroy,
     * ppn_model_free ...) keeps its block out of use until ppn_rt_destroy frees it. The runtime's pools, which
     * every model on it shares, like pool_in_use. */
    uint64_t pool_retired;
    size_t pool_retired_bytes;                 /* their bytes (size classes; still counted in pool_reserved) */
    /* With ppn_model_time_stages on: the device time each stage's stream spent in its walks (its kernels between
     * the boundary ops, from timing events around each walk), and how many walks that sums. Counted as the walks
     * complete (the running ones not yet); one stream (MEMRA_PP_STREAMS=0) or the unsplit walk counts on stage 0. */
    uint64_t stage_busy_ns[PPN_MAX_STAGES];
    uint64_t stage_busy_walks[PPN_MAX_STAGES];
} ppn_stats;
/* A snapshot of the counters (relaxed reads: exact between steps). Never fails. */
void ppn_model_get_stats(const ppn_model *m, ppn_stats *out);
/* Per-stage busy time (ppn_stats.stage_busy_ns) on or off; off at load. On, every walk on a stage stream is
 * bracketed by two timing events on that stream (recorded outside any graph), so the steps change nothing else.
 * Drains the model first and sums every walk done so far, so the counters are exact when it returns (call it
 * with the current setting to bring them up to date). The caller's thread, like a step.
 * @return PPN_OK, PPN_EINVAL (m NULL), the model's failure, a driver error naming the event. */
ppn_status ppn_model_time_stages(ppn_model *m, int on);

/* The published stage map. */
typedef struct ppn_stage_info {
    int n_stages;
    int fence[PPN_MAX_STAGES + 1];
    int dev[PPN_MAX_STAGES];
    int xport[PPN_MAX_STAGES];  /* boundary b: see ppn_transport_name */
    int pu[PPN_MAX_STAGES];     /* core of each stage's issue thread (-1: the caller's thread issues) */
    int shared_cores, threads;
    int same_device_streams;    /* 2+ stage streams on one device (allowed: docs/PIPELINE.md says why it is safe) */
    ppn_door door;
} ppn_stage_info;
/* A copy of the published stage map. Never fails. */
void ppn_model_get_stage_map(const ppn_model *m, ppn_stage_info *out);
/* "inplace", "dtod", "peer" or "host". */
const char *ppn_transport_name(int xport);

/* Where a stage of the published map runs, read back from the OS when asked (docs/PIPELINE.md, host memory).
 * Nodes are hwloc logical indexes of NUMA nodes. */
typedef struct ppn_stage_place {
    int dev;
    char pci[32];           /* the device's PCI bus id ("" when it has none) */
    int dev_node;           /* the device's local NUMA node; -1: not located (every node) */
    int threaded;           /* 1: the stage has its own issue thread; 0: the caller's thread issues */
    char thread_name[16];   /* ppn-s<stage>-dev<device> ("" without a thread) */
    char thread_cpus[64];   /* the PUs the thread is bound to, as the OS says (hwloc list, "" without a thread) */
    int thread_node;        /* the node its memory is bound to, as the thread read back from the OS after binding
                             * (-1: the default policy, or a binding the OS refused) */
    int host_buffers;       /* the stage's pinned host buffers: host-staged slots it receives through, and on
                             * the last stage every sequence's logits and token readback */
    int host_node;          /* where their resident pages are, as the OS says: a node; -1 none resident (or no
                             * buffer); -2 on several nodes; -3 on a node the topology does not know */
    char host_os_nodes[32]; /* the OS node indexes of those pages (hwloc list) */
} ppn_stage_place;
/* Stage stage's place. @return PPN_OK, PPN_EINVAL (no such stage), PPN_EIO (the OS refused a query: message
 * says which), PPN_ENOMEM. */
ppn_status ppn_model_get_stage_place(ppn_model *m, int stage, ppn_stage_place *out);

/* The kernel-by-kernel account (PPN_KPROF=1, read once when the runtime is created: unset, empty or 0 = off,
 * 1 = on, anything else makes ppn_rt_create fail with PPN_EINVAL naming the variable). On cuda each launch is
 * bracketed by a pair of timing events (this slows steps: profiled step times are not the record); on sim
 * the time is the CPU wall time of the reference kernel, not a device time. */
#define PPN_KERNEL_PROFILE_MAX 48 /* at least the number of kernels */
typedef struct ppn_kernel_time {
    const char *name; /* the kernel's name (static storage) */
    uint64_t calls;   /* launches completed and counted */
    double ms;        /* total time of those launches */
    double bytes;     /* their declared access bytes (embed, rope and attn declare the whole table or
                       * KV cache, so theirs exceed the bytes they move) */
} ppn_kernel_time;
/* One entry per kernel launched since the last reset (calls > 0), in a fixed kernel order, at most max of them
 * (PPN_KERNEL_PROFILE_MAX gets all). Launches still in flight are counted once they complete.
 * @return the number of entries written; 0 when profiling is off. */
int ppn_rt_kernel_profile(ppn_rt *rt, ppn_kernel_time *out, int max);
/* Zero the account (call it between steps: a launch in flight at the reset may still be counted on sim). */
void ppn_rt_kernel_profile_reset(ppn_rt *rt);

/* ---------------------------------------------------------------------------------------------------------
 * Tokenizer: a checkpoint's tokenizer.json (Hugging Face `tokenizers` format) and tokenizer_config.json. Handled:
 * BPE models (byte-level, as Llama 3, Qwen2 and GPT-2-style; SentencePiece-style with byte fallback, as Llama 2
 * and Mistral), added and special tokens (matched in the text before anything else, as tokenizers does), the
 * NFC / Prepend / Replace normalizers, the Split / ByteLevel / Metaspace / Digits pre-tokenizers, the template
 * post-processor. The ids are those tokenizers produces. A tokenizer is read-only once loaded: several threads
 * may encode and decode with it at once; a ppn_detok_stream is used by one thread at a time. A model does not
 * need one: ppn_model_load and the decode calls work with ids alone. */
typedef struct ppn_tokenizer ppn_tokenizer;
typedef struct ppn_detok_stream ppn_detok_stream;

/* Load dir/tokenizer.json and, when present, dir/tokenizer_config.json (BOS, EOS, add_bos_token and
 * add_eos_token: where the config sets them they decide what add_special adds, else the post-processor does).
 * @return PPN_OK, PPN_EINVAL (NULL argument), PPN_EIO (tokenizer.json cannot be opened: the message names it),
 *         PPN_EFORMAT (malformed JSON or a malformed field: the message names the file, line or field),
 *         PPN_EUNSUPPORTED (a model, normalizer, pre-tokenizer, decoder or option ppn does not handle: named),
 *         PPN_ENOMEM. On failure *out is NULL. */
ppn_status ppn_tokenizer_load(const char *dir, ppn_tokenizer **out);
/* Accepts NULL. Free every ppn_detok_stream of tok first. */
void ppn_tokenizer_free(ppn_tokenizer *tok);
/* The BOS / EOS ids tokenizer_config.json names; -1 when it names none (or tok is NULL). */
int ppn_tokenizer_bos(const ppn_tokenizer *tok);
int ppn_tokenizer_eos(const ppn_tokenizer *tok);
/* One past the largest id (vocabulary and added tokens); 0 for NULL. */
int ppn_tokenizer_n_ids(const ppn_tokenizer *tok);

/* Encode len bytes of UTF-8 text into ids[0, cap); *n = the number of ids. Special-token text in the input
 * becomes its id. add_special: add what the config says (BOS and EOS, see ppn_tokenizer_load). ids may be NULL
 * with cap 0 to count.
 * @return PPN_OK, PPN_EINVAL (NULL tok or n, NULL text with len > 0, cap < 0 or NULL ids with cap > 0; text not
 *         valid UTF-8: the byte named; more than cap ids: *n holds the count, ids the first cap), PPN_ENOMEM. */
ppn_status ppn_tokenize(const ppn_tokenizer *tok, const char *text, size_t len, int add_special, int *ids, int cap,
                        int *n);
/* Decode n ids (special tokens included) into buf, NUL-terminated; *len = the text's length in bytes. The text
 * is valid UTF-8: bytes that form no character become U+FFFD, as tokenizers' decode does. buf may be NULL with
 * cap 0 to measure.
 * @return PPN_OK, PPN_EINVAL (NULL tok or len, NULL ids with n > 0, n < 0, NULL buf with cap > 0; an id that is
 *         no token: named with its position; cap <= *len: *len holds the length, buf the first cap - 1 bytes),
 *         PPN_ENOMEM. */
ppn_status ppn_detokenize(const ppn_tokenizer *tok, const int *ids, int n, char *buf, size_t cap, size_t *len);

/* Streaming decode, one id at a time as they are generated: each push gives the text that id adds, never part
 * of a UTF-8 character (text whose bytes are still incomplete is held until they come), and the pushes and a
 * final flush together give exactly ppn_detokenize of all the ids. Text that later ids could still change is held
 * too: a run of ByteFallback byte tokens until a token ends it (the run decodes all or nothing), and, for a
 * decoder chain whose earlier text later ids can change (after a Fuse: a Replace of several characters, a Strip
 * from the end; more than one leading character stripped in all; no real tokenizer has one), everything until the
 * flush. The text returned stays valid until the next call on s; it may be empty (*len 0).
 * @return PPN_OK, PPN_EINVAL (NULL argument), PPN_ENOMEM. */
ppn_status ppn_detok_stream_create(const ppn_tokenizer *tok, ppn_detok_stream **out);
/* @return PPN_OK, PPN_EINVAL (NULL argument, or an id that is no token: nothing changes), PPN_ENOMEM. */
ppn_status ppn_detok_stream_push(ppn_detok_stream *s, int id, const char **text, size_t *len);
/* Emit whatever is held (a trailing incomplete character as U+FFFD). Pushing may continue after.
 * @return PPN_OK, PPN_EINVAL (NULL argument), PPN_ENOMEM. */
ppn_status ppn_detok_stream_flush(ppn_detok_stream *s, const char **text, size_t *len);
/* Accepts NULL. */
void ppn_detok_stream_free(ppn_detok_stream *s);

/* ---------------------------------------------------------------------------------------------------------
 * Chat templates: a checkpoint's Jinja chat_template rendered as transformers' apply_chat_template renders it
 * (jinja2 with trim_blocks, lstrip_blocks, no trailing newline; raise_exception, namespace, range, dict,
 * strftime_now; tojson as Python's json.dumps). The Jinja subset: {{ }}, {# #}, if/elif/else, for (with else,
 * `if` filter, unpacking, loop.index/index0/first/last/length/revindex/previtem/nextitem), set (names,
 * namespace attributes, blocks), break/continue, generation; literals, lists, dicts, attribute, subscript and
 * slice access, arithmetic, ~, comparisons, in / not in, and/or/not, inline if; the filters trim, length, count,
 * tojson, default, join, lower, upper, capitalize, string, safe, first, last, list, items, select, reject,
 * selectattr, rejectattr, map(attribute=), int, float, replace, abs; the tests defined, undefined, none,
 * boolean, true, false, number, integer, float, string, mapping, iterable, sequence, odd, even, divisibleby, eq,
 * equalto, ne, in; the string methods strip, lstrip, rstrip, split, startswith, endswith, lower, upper,
 * capitalize, replace, join and the dict methods items, keys, values, get. A template using anything else is
 * refused when it is loaded, by name and line. A template is read-only once loaded: threads may share it. */
typedef struct ppn_template ppn_template;
typedef struct ppn_chat_msg {
    const char *role;      /* UTF-8; NULL leaves the key out */
    const char *content;   /* UTF-8; NULL leaves the key out */
} ppn_chat_msg;

/* Load model_dir's chat template: chat_template.jinja when present, else tokenizer_config.json's
 * "chat_template" (a string, or the entry named "default" of a list), with the special tokens the config sets
 * (bos_token, eos_token, unk_token, pad_token, sep_token, cls_token, mask_token; special_tokens_map.json fills
 * those it leaves out) as variables.
 * @return PPN_OK, PPN_EINVAL (NULL argument), PPN_EIO (no template there, or a file cannot be read: named),
 *         PPN_EFORMAT (malformed JSON or template syntax: file, line and what was found), PPN_EUNSUPPORTED (a
 *         statement, filter, test, method, function or syntax outside the subset: named with its line),
 *         PPN_ENOMEM. On failure *out is NULL. */
ppn_status ppn_template_load(const char *model_dir, ppn_template **out);
/* A template from its source text (len bytes of UTF-8), with no variables of its own; name is used in
 * messages (NULL: "chat template").
 * @return PPN_OK, PPN_EINVAL (NULL source or out), PPN_EFORMAT (not UTF-8, a NUL byte, bad syntax),
 *         PPN_EUNSUPPORTED (outside the subset, named), PPN_ENOMEM. On failure *out is NULL. */
ppn_status ppn_template_parse(const char *source, size_t len, const char *name, ppn_template **out);
/* Render n messages (role and content) into *out, a NUL-terminated malloc'd string the caller frees with free().
 * @return PPN_OK, PPN_EINVAL (NULL t or out, n < 0, NULL msgs with n > 0, text not UTF-8; n == 0: transformers'
 *         "Cannot apply chat template to an empty conversation. Provide at least one message."; the template's
 *         raise_exception: exactly its message; an error while rendering, e.g. an undefined value in an
 *         operator: the line), PPN_EUNSUPPORTED (a value the subset does not handle, e.g. '%' formatting: named
 *         with its line), PPN_ENOMEM. On failure *out is NULL. */
ppn_status ppn_template_render(const ppn_template *t, const ppn_chat_msg *msgs, int n, int add_generation_prompt,
                               char **out);
/* The same with the messages as a JSON list of objects (any keys: tool_calls, tool results ...; keys whose
 * value is null are dropped, as transformers does) and vars_json, NULL or a JSON object of extra variables
 * (tools, documents, date_string ...; they replace the config's special tokens of the same name).
 * @return as ppn_template_render, and PPN_EINVAL for malformed JSON (the line), messages that are not a list of
 *         objects, vars that are not an object or set messages / add_generation_prompt. */
ppn_status ppn_template_render_json(const ppn_template *t, const char *messages_json, const char *vars_json,
                                    int add_generation_prompt, char **out);
/* The token that ends an assistant's turn under this template: the first special token of tok (an added token
 * marked special) that the template writes after an assistant message's content, found by rendering a user
 * message and an assistant message (no generation prompt). E.g. <|im_end|> for ChatML, <|eot_id|> for Llama 3,
 * </s> for Llama 2, <end_of_turn> for Gemma. Generation under the template stops there (besides the model's EOS).
 * @return the id; -1 when the template writes no special token there, cannot render that conversation, or an
 *         argument is NULL. Never fails otherwise. */
int ppn_template_end_of_turn(const ppn_template *t, const ppn_tokenizer *tok);
/* Accepts NULL. */
void ppn_template_free(ppn_template *t);

/* ---------------------------------------------------------------------------------------------------------
 * The engine: a thread-safe server core over one loaded model. Requests are submitted from any thread; ONE
 * scheduler thread owns every sequence and runs continuous batching: each iteration it admits queued requests
 * as KV blocks allow, primes up to opts.chunk prompt rows (several prompts' slices, long prompts over several
 * iterations) and decodes one token of every running request, both in one forward (a mixed ppn_decode_batch_ex:
 * each weight read once for the prompt rows and the decode rows, so prompts are chunked in beside the decodes
 * instead of stalling them; greedy rows take the device's argmax, sampled rows their logits through
 * ppn_sample) and retires the finished ones alone; their
 * sequences are reset and reused. Between engine create and destroy the model belongs to the engine: no other
 * calls on it or its sequences. Those that would change them from another thread are refused by name with
 * PPN_ESTATE before anything changes (ppn_seq_create, _destroy, _reset, _truncate, every step, wait, prefill and
 * verify, ppn_model_publish_door, ppn_model_time_stages, ppn_model_free), and the engine carries on; a sequence
 * made before the engine keeps its state and is the caller's again after ppn_engine_destroy. The same holds for
 * the runtime's other models (a runtime's models are driven from one thread at a time), and ppn_model_load onto
 * the runtime is refused too: several models are served at once from a runtime each.
 *
 * KV policy (no preemption): a request is admitted only when the blocks of its prompt + max_tokens positions are
 * free of every running request's reservation, so a running request never runs out of KV. A request waits in
 * the queue (FIFO: a large one at the head is not overtaken) until finished requests return their blocks; one
 * that could never fit, even alone, is refused at submit with PPN_ENOMEM.
 *
 * Every accepted request gets exactly one final event (finish != PPN_FINISH_NONE): stopped, at its length,
 * cancelled, or failed on its own (its status and message; the other requests continue). A failure of the model
 * itself (sticky: a device error) fails every request and every later submit with that status.
 * --------------------------------------------------------------------------------------------------------- */

typedef struct ppn_engine ppn_engine;

typedef enum ppn_finish {
    PPN_FINISH_NONE = 0,   /* a token event: the request goes on */
    PPN_FINISH_STOP,       /* a stop id, the EOS id or a stop string (none of which is delivered) */
    PPN_FINISH_LENGTH,     /* max_tokens generated, or the context is full */
    PPN_FINISH_CANCELLED,  /* ppn_engine_cancel, or the engine destroyed */
    PPN_FINISH_ERROR,      /* the request failed on its own: event status and error say why */
} ppn_finish;
/* "none", "stop", "length", "cancelled", "error" ("?" outside the enum). Static storage. */
const char *ppn_finish_name(int finish);

typedef struct ppn_engine_event {
    uint64_t id;           /* the request's, as submit returned it */
    int token;             /* the generated id; -1 on the final event */
    const char *text;      /* the text the token adds (the incremental detokenizer: never a split UTF-8
                            * character; held back while it may begin a stop string); on the final event
                            * whatever was held. "" without a tokenizer. Valid during the callback only. */
    size_t text_len;
    int finish;            /* PPN_FINISH_*: NONE on every token event, set on the final one */
    ppn_status status;     /* PPN_FINISH_ERROR: the failure; else PPN_OK */
    const char *error;     /* PPN_FINISH_ERROR: its message; else "" */
    int n_prompt, n_generated; /* prompt ids; ids delivered so far */
} ppn_engine_event;

/* Called on the scheduler thread, never with an engine lock held. It may call ppn_engine_submit, _cancel,
 * _poll with timeout 0 (a poll that may wait is refused, PPN_EINVAL: only this thread makes ids) and _get_stats,
 * never ppn_engine_destroy (refused, PPN_ESTATE: it would join this thread); it should return quickly (it delays
 * every running request). */
typedef void (*ppn_engine_cb)(void *arg, const ppn_engine_event *ev);

typedef struct ppn_request {
    /* The prompt: exactly one of ids, text, msgs or messages_json. text, msgs and messages_json need the
     * engine's tokenizer; msgs and messages_json its template (rendered with the generation prompt, then
     * tokenized without adding specials: the template places them). */
    const int *ids; int n_ids;
    const char *text; int add_special; /* text: add BOS/EOS as the tokenizer's config says */
    const ppn_chat_msg *msgs; int n_msgs;
    const char *messages_json;         /* a JSON list of message objects (ppn_template_render_json) */
    float temperature;     /* 0: greedy (the device's argmax) */
    int top_k;             /* 0: off */
    float top_p;           /* 1: off; (0, 1] */
    uint64_t seed;
    int max_tokens;        /* ids to generate at most; 0: until the context is full */
    const int *stop_ids; int n_stop_ids;  /* generated ids that end the request (not delivered) */
    const char *const *stop; int n_stop;  /* strings that end it (needs the tokenizer; not delivered); at most
                                           * PPN_ENGINE_MAX_STOP of them, each 1 .. 256 bytes */
    int ignore_eos;        /* 1: the model's EOS id does not end the request */
    ppn_engine_cb cb;      /* NULL: poll the request with ppn_engine_poll instead */
    void *cb_arg;
} ppn_request;

#define PPN_ENGINE_MAX_STOP 16

/* Everything empty or off: temperature 0, top_k 0, top_p 1, max_tokens 0, no callback. */
ppn_request ppn_request_default(void);

typedef struct ppn_engine_opts {
    int max_batch;         /* requests decoded together, 1 .. 256; 0: 16 */
    int max_queue;         /* requests waiting for admission; 0: 256; a submit past it gets PPN_EBUSY */
    int chunk;             /* prompt rows primed per iteration (over every priming prompt), 1 ..
                            * PPN_PREFILL_MAX_CHUNK; 0: 256 */
    int separate;          /* 1: an iteration primes and decodes in two forwards (for measurement); 0: in one
                            * mixed step (ppn_batch_opts.n_prime) whenever it has both */
    int step_rows;         /* with decodes running, an iteration's prompt rows are cut to step_rows minus its
                            * decode rows (at least min(16, chunk)), so a mixed step stays near step_rows rows and
                            * the decodes' inter-token time near one such step; 0: 128; -1: off (chunk rows
                            * always). docs/PERF.md measures the trade: on the 8B load, no cut gave the worst
                            * inter-token p99; 128 rows (two full token groups of the GEMMs' split-K tile) 12%
                            * more tokens/s and a lower time to first token than 80, at about 1 ms more
                            * inter-token p99 (an H100, 2026-12-06) */
    const ppn_tokenizer *tok;  /* NULL: ids only. Borrowed: must outlive the engine */
    const ppn_template *tmpl;  /* NULL: no chat. Borrowed: must outlive the engine */
} ppn_engine_opts;

/* All defaults, no tokenizer, no template. */
ppn_engine_opts ppn_engine_opts_default(void);

/* Start an engine on m (its scheduler thread). It turns m's per-stage busy time on (ppn_model_time_stages, for
 * ppn_engine_stats.stage_busy_s), and off again at ppn_engine_destroy. One engine a runtime at a time (its
 * scheduler thread drives the model, and a runtime's models are driven from one thread at a time): to serve
 * several models at once, load each on a runtime of its own (ppn_rt_create), an engine on each.
 * @return PPN_OK, PPN_EINVAL (NULL, an option out of range: named), PPN_ESTATE (m, or another model of its runtime,
 *         has an engine already), PPN_ENOMEM
 * (host memory, or the thread), the model's failure (a model that failed earlier). */
ppn_status ppn_engine_create(ppn_model *m, const ppn_engine_opts *opts, ppn_engine **out);
/* Stop the engine (NULL: nothing to do): no more submits (they get PPN_ESTATE); every queued and running request
 * is cancelled and gets its final event before this returns; the thread is joined, the sequences destroyed
 * (ppn_seq_destroy). The engine is gone and the model is the caller's again whatever the status, but from a
 * callback, where it is refused (PPN_ESTATE) and nothing happens. Call it from one thread.
 * @return PPN_OK, PPN_EDRIVER (destroying a sequence, a block's free could not be ordered on its stream: the
 *         block is kept out of use until ppn_rt_destroy, which frees it; the message names it; the first such
 *         failure is returned, the other sequences destroyed all the same), PPN_ESTATE (from a callback). */
ppn_status ppn_engine_destroy(ppn_engine *e);

/* Queue a request; *id names it (never 0). The prompt is tokenized (or rendered) on the caller's thread, and
 * everything the request points to may be freed when this returns.
 * @return PPN_OK, PPN_EINVAL (NULL, no prompt or two, an empty prompt, an id outside the vocabulary, text or
 *         chat without a tokenizer or template, a sampling value out of range, max_tokens < 0, stop strings
 *         out of range or without a tokenizer; the template's own errors), PPN_ESTATE (the prompt leaves no
 *         position to generate in the context: named with both lengths; or the engine is stopping),
 *         PPN_ENOMEM (the request's KV blocks exceed the pools even alone; or host memory), PPN_EBUSY (the
 *         queue holds max_queue requests), the model's sticky failure. Nothing is queued on failure. */
ppn_status ppn_engine_submit(ppn_engine *e, const ppn_request *r, uint64_t *id);
/* Cancel a request, queued or running, from any thread: it ends with PPN_FINISH_CANCELLED at the scheduler's
 * next iteration (ids already generated stay delivered).
 * @return PPN_OK, PPN_EINVAL (no such request: never submitted, or already finished and forgotten). */
ppn_status ppn_engine_cancel(ppn_engine *e, uint64_t id);
/* A callback-less request's ids generated since the last poll: waits up to timeout_ms (0: not at all; < 0:
 * forever) until there is at least one id or the request has ended; copies up to cap of them into ids, *n
 * their count. *finish: PPN_FINISH_NONE while it runs, its finish once every id was taken (the request is then
 * forgotten: a later poll gets PPN_EINVAL); why (may be NULL): its failure, or PPN_OK.
 * @return PPN_OK (also on a timeout: *n 0, *finish NONE), PPN_EINVAL (NULL, cap < 0, no such request, one
 *         with a callback, or a timeout other than 0 from a callback). */
ppn_status ppn_engine_poll(ppn_engine *e, uint64_t id, int timeout_ms, int *ids, int cap, int *n, int *finish,
                           ppn_status *why);

/* Latency histograms: cumulative buckets at these upper bounds in milliseconds, then +Inf. */
#define PPN_ENGINE_HIST_BOUNDS_MS {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}
#define PPN_ENGINE_HIST_N 14
typedef struct ppn_engine_hist {
    uint64_t bucket[PPN_ENGINE_HIST_N]; /* observations <= bound i (not cumulative); the last: above them all */
    uint64_t count;
    double sum_s;
} ppn_engine_hist;

typedef struct ppn_engine_stats {
    int queued, running;               /* now */
    int kv_blocks_used, kv_blocks_total, kv_blocks_reserved;
    uint64_t submitted, finished, cancelled, failed, refused; /* requests (refused: at submit) */
    uint64_t prompt_tokens, generated_tokens;
    uint64_t iterations, decode_batches, prefill_chunks;
    uint64_t mixed_steps;              /* iterations that primed and decoded in one forward */
    ppn_engine_hist ttft, itl;         /* submit to first id; between two ids of one request */
    int n_stages;                      /* the model's stage map */
    double stage_busy_s[PPN_MAX_STAGES]; /* device time each stage's stream spent in walks (ppn_stats.stage_busy_ns:
                                        * the engine turns ppn_model_time_stages on); short of the walks still
                                        * running, exact in a snapshot with running and queued 0 (an idle engine
                                        * sums its last walks before publishing) */
    double uptime_s;
} ppn_engine_stats;
/* A snapshot (as of the scheduler's last iteration). Never fails. */
void ppn_engine_get_stats(ppn_engine *e, ppn_engine_stats *out);

/* Sampling on the host from a logits row. temperature 0 = greedy (lowest index on ties). top_k 0 = off;
 * top_p 1 = off. rng: caller-owned state, seeded by ppn_sampler_init; the same seed gives the same ids. */
typedef struct ppn_sampler {
    float temperature;
    int top_k;
    float top_p;
    uint64_t rng[2];
} ppn_sampler;
/* Fill sp; the values are checked by ppn_sample. Never fails. */
void ppn_sampler_init(ppn_sampler *sp, float temperature, int top_k, float top_p, uint64_t seed);
/* @return PPN_OK, PPN_EINVAL (vocab <= 0, temperature < 0, top_p outside (0, 1]), PPN_ENOMEM. */
ppn_status ppn_sample(ppn_sampler *sp, const float *logits, int vocab, int *out_id);

#ifdef __cplusplus
}
#endif
#endif /* PPN_H */
