/* tok.h - the tokenizer's internals: a Hugging Face tokenizer.json read into a pipeline of stages (added tokens,
 * normalizer, pre-tokenizer, BPE model, post-processor, decoder; the layout of `tokenizers`' Tokenizer), each
 * stage a small table of steps filled at load. Floor 2: only core/base and ppn.h below it.
 *
 * Files: vocab.c (tokenizer.json, tokenizer_config.json, the string and pair tables), pretok.c (normalizers
 * and the regex pre-tokenizers, PCRE2 with UTF and UCP; NFC through utf8proc), bpe.c (merges by rank, the
 * byte-level alphabet, byte fallback), decode.c (the decoder steps and the streaming decoder), tok.c (the
 * public ppn_tokenizer_* calls: added tokens split out first, then the pipeline on each piece between them). */
#ifndef PPN_TOK_H
#define PPN_TOK_H

#include <stddef.h>
#include <stdint.h>
#include "ppn.h"

/* A growable byte buffer (the pipeline's scratch). */
typedef struct ppn_tok_buf {
    char *p;
    size_t len, cap;
} ppn_tok_buf;
ppn_status ppn_tok_buf_put(ppn_tok_buf *b, const void *s, size_t n);

/* A growable list of ints (ids, offsets). */
typedef struct ppn_tok_ints {
    int *v;
    int n, cap;
} ppn_tok_ints;
ppn_status ppn_tok_ints_push(ppn_tok_ints *a, int x);

/* Pieces of one string: piece i is text[off[2i], off[2i] + off[2i+1]). */
typedef struct ppn_tok_pieces {
    ppn_tok_buf text;
    ppn_tok_ints off;
} ppn_tok_pieces;
void ppn_tok_pieces_free(ppn_tok_pieces *p);

/* string -> id, open addressing over the token table (slots hold id + 1; 0 is empty). */
typedef struct ppn_tok_strmap {
    uint32_t mask;
    int32_t *slot;
} ppn_tok_strmap;

/* (left id, right id) -> (rank, merged id). */
typedef struct ppn_tok_pairmap {
    uint32_t mask;
    uint64_t *key;   /* (left << 32 | right) + 1; 0 is empty */
    int32_t *rank, *merged;
} ppn_tok_pairmap;

/* One added token (tokenizer.json's added_tokens): matched in the raw text before anything else runs. */
typedef struct ppn_tok_added {
    int id;
    char *content;
    size_t len;
    int special, lstrip, rstrip;
} ppn_tok_added;

typedef enum { PPN_NORM_NFC, PPN_NORM_PREPEND, PPN_NORM_REPLACE } ppn_norm_kind;
typedef struct ppn_tok_norm {
    ppn_norm_kind kind;
    char *a, *b;   /* PREPEND: a; REPLACE: a -> b */
} ppn_tok_norm;

typedef enum { PPN_PRE_SPLIT, PPN_PRE_BYTELEVEL, PPN_PRE_METASPACE } ppn_pre_kind;
typedef struct ppn_tok_pre {
    ppn_pre_kind kind;
    void *re;           /* SPLIT, and BYTELEVEL with use_regex: a compiled pcre2_code_8 (match data per call,
                         * so one tokenizer can serve several threads) */
    int prefix_space;   /* BYTELEVEL: add_prefix_space; METASPACE: prepend (0 never, 1 always, 2 first) */
} ppn_tok_pre;

typedef enum {
    PPN_DEC_BYTELEVEL, PPN_DEC_REPLACE, PPN_DEC_BYTEFALLBACK, PPN_DEC_FUSE, PPN_DEC_STRIP, PPN_DEC_METASPACE
} ppn_dec_kind;
typedef struct ppn_tok_dec {
    ppn_dec_kind kind;
    char *a, *b;        /* REPLACE: a -> b; STRIP: a = the character */
    int start, stop;    /* STRIP: how many from each end; METASPACE: start = strip the first token's space */
} ppn_tok_dec;

#define PPN_TOK_MAX_STEPS 8

struct ppn_tokenizer {
    char *dir;                /* for messages */
    /* The token table, indexed by id (vocab and added tokens); NULL where no token has that id. */
    int n_ids;
    char **piece;
    uint32_t *piece_len;
    ppn_tok_strmap vocab;     /* the model's vocabulary (not the added tokens) */
    ppn_tok_pairmap merges;
    int ignore_merges, byte_fallback, fuse_unk, unk_id;
    int byte_id[256];         /* "<0xXX>" ids for byte fallback; -1 where absent */
    ppn_tok_added *added;
    int n_added;
    uint8_t added_first[32];  /* bitmap of the first bytes of added tokens */
    ppn_tok_norm norm[PPN_TOK_MAX_STEPS];
    int n_norm;
    ppn_tok_pre pre[PPN_TOK_MAX_STEPS];
    int n_pre;
    ppn_tok_dec dec[PPN_TOK_MAX_STEPS];
    int n_dec;
    int has_decoder;          /* 0: tokens joined with spaces (tokenizers' default) */
    ppn_tok_ints pre_ids, post_ids;   /* what add_special puts before and after */
    int bos_id, eos_id;       /* -1 when the config names none */
};

struct ppn_detok_stream {
    const ppn_tokenizer *tok;
    ppn_tok_ints ids;         /* the window: the ids behind prefix, then the ones not yet emitted */
    int prefix_index;         /* ids[0, prefix_index) decode to prefix */
    ppn_tok_buf prefix, text, out;
    int hold_all;             /* the decoder is not window-exact: every id is held until a flush (decode.c) */
    int hold_bytes;           /* a ByteFallback step: a run of byte tokens is held until a token that ends it */
};

/* decode.c: how a stream over t must hold text back so that its pieces add up to the whole decode. */
void ppn_tok_stream_mode(const ppn_tokenizer *t, int *hold_all, int *hold_bytes);

/* vocab.c */
ppn_status ppn_tok_load_json(ppn_tokenizer *t, const char *dir);
int ppn_tok_lookup(const ppn_tokenizer *t, const char *s, size_t n);   /* vocab id or -1 */
int ppn_tok_pair(const ppn_tokenizer *t, int a, int b, int *merged);   /* rank or -1 */
void ppn_tok_tables_free(ppn_tokenizer *t);

/* pretok.c: normalize src into dst (replacing its content); split into pre-tokens (ends byte-mapped when a
 * ByteLevel step is present). */
ppn_status ppn_tok_normalize(const ppn_tokenizer *t, const char *s, size_t n, ppn_tok_buf *dst);
ppn_status ppn_tok_pretokenize(const ppn_tokenizer *t, const char *s, size_t n, int first, ppn_tok_pieces *out);
ppn_status ppn_tok_regex_compile(const char *pattern, ppn_tok_pre *p);
void ppn_tok_pre_free(ppn_tok_pre *p);
extern const char ppn_tok_gpt2_regex[];

/* bpe.c */
ppn_status ppn_tok_bpe_word(const ppn_tokenizer *t, const char *w, size_t n, ppn_tok_ints *ids);
/* The byte-level alphabet: byte b is the code point ppn_tok_byte_cp(b); -1 for a code point that is no byte. */
int ppn_tok_byte_cp(int b);
int ppn_tok_cp_byte(int cp);

/* decode.c */
ppn_status ppn_tok_decode(const ppn_tokenizer *t, const int *ids, int n, ppn_tok_buf *out);
/* Push id (or, flush != 0, no id: emit everything held); s->out then holds the text to emit (may be empty). */
ppn_status ppn_tok_stream_step(ppn_detok_stream *s, int id, int flush);

/* UTF-8 helpers (decode.c): the length of the sequence at s (1..4), or 0 if it is not valid there. */
int ppn_tok_utf8_len(const unsigned char *s, size_t n);
int ppn_tok_one_char(const char *s);   /* s is exactly one valid UTF-8 character */
int ppn_tok_utf8_put(char *dst, uint32_t cp);

#endif
