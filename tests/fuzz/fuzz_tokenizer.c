/* fuzz_tokenizer.c - a tokenizer.json (and, after the input's first NUL byte, a tokenizer_config.json) through
 * ppn_tokenizer_load; an accepted tokenizer then encodes a fixed set of texts (ASCII, spaces, multi-byte and
 * invalid UTF-8, its own added tokens), decodes what it produced, every id it has and some it has not, and
 * streams the same ids through the detokenizer. Every id an encode returns must be one the tokenizer has. */
#include "ppn.h"
#include "core/tok/tok.h"
#include "fuzz_util.h"

static const char *const k_texts[] = {
    "Hello world! It's 2024, isn't it?",
    "  leading and   inner spaces\n\ttabs\r\n",
    "\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 \xe2\x96\x81",   /* été 日本語 😀 ▁ */
    "<s>[INST] hi [/INST]</s><|im_start|>user\n<|endoftext|>",
    "\xff\xfe bad \xc3 utf8 \xe2\x82",
    "a",
    "",
};

/* Decode ids whole and streamed. When every id is valid (strict), the stream's pieces must add up to exactly
 * the whole decode, as ppn.h promises. */
static void decode_all(const ppn_tokenizer *t, const int *ids, int n, int strict)
{
    static char whole[1 << 16], streamed[1 << 16];
    size_t len, slen = 0, piece;
    ppn_status st = ppn_detokenize(t, ids, n, whole, sizeof whole, &len);
    ppn_detokenize(t, ids, n, whole + sizeof whole - 3, 3, &piece);   /* too small: says so, never overruns */
    ppn_detok_stream *s = NULL;
    if (ppn_detok_stream_create(t, &s) != PPN_OK) return;
    const char *text;
    for (int i = 0; i <= n; i++) {
        if ((i < n ? ppn_detok_stream_push(s, ids[i], &text, &piece) : ppn_detok_stream_flush(s, &text, &piece)) !=
            PPN_OK)
            continue;
        if (slen + piece < sizeof streamed) memcpy(streamed + slen, text, piece);
        slen += piece;
    }
    ppn_detok_stream_free(s);
    if (strict && st == PPN_OK && slen < sizeof streamed && (slen != len || memcmp(streamed, whole, len))) abort();
}

static void exercise(const ppn_tokenizer *t)
{
    int ids[512], n_ids = ppn_tokenizer_n_ids(t);
    for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
        for (int special = 0; special < 2; special++) {
            int n = 0;
            if (ppn_tokenize(t, k_texts[i], strlen(k_texts[i]), special, ids, 512, &n) != PPN_OK) continue;
            if (n < 0 || n > 512) abort();
            for (int j = 0; j < n; j++)
                if (ids[j] < 0 || ids[j] >= n_ids) abort();
            decode_all(t, ids, n, 1);
        }
    }
    int n = 0;
    for (int id = 0; id < n_ids && n < 256; id++) ids[n++] = id;
    decode_all(t, ids, n, 1); /* every id in order: byte tokens beside each other and beside others */
    ids[n++] = -1;
    ids[n++] = n_ids;
    ids[n++] = 0x7fffffff;
    decode_all(t, ids, n, 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *cfg;
    size_t tok_len, cfg_len;
    fz_split(data, size, &cfg, &tok_len, &cfg_len);
    fz_put("tokenizer.json", data, tok_len);
    fz_put("tokenizer_config.json", cfg, cfg_len);
    ppn_tokenizer *t = NULL;
    if (ppn_tokenizer_load(fz_dir(), &t) == PPN_OK) {
        exercise(t);
        ppn_tokenizer_free(t);
    }
    return 0;
}
