/* test_tok.c - the tokenizer against ../shared/fixtures/tok: real Llama 3, Llama 2 and Qwen2 vocabularies with
 * the ids Hugging Face tokenizers produces (cases.jsonl): ids exact with and without the special tokens, decode
 * exact, the streaming decode (every piece whole UTF-8 characters, the pieces and the flush together the full
 * decode), special-token text in the input, the errors (a missing or malformed tokenizer.json named), and the
 * `ppn tokenize` / `ppn detokenize` commands. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tests/util/tcheck.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tests/util/tutil.h"

#define MAX_IDS 4096

/* One family's tokenizer, loaded once for its tests. */
static ppn_tokenizer *load(const char *family)
{
    char rel[64];
    snprintf(rel, sizeof rel, "tok/%s", family);
    ppn_tokenizer *t = NULL;
    ppn_status st = ppn_tokenizer_load(tu_fixture(rel), &t);
    if (st != PPN_OK) fail_msg("load %s: %s: %s", family, ppn_status_name(st), ppn_last_error());
    return t;
}

/* cases.jsonl of a family, one JSON object per line (a malloc'd array of n). */
static json_t **read_cases(const char *family, int *n)
{
    char rel[64];
    snprintf(rel, sizeof rel, "tok/%s/cases.jsonl", family);
    size_t len;
    char *text = tu_read_file(tu_fixture(rel), &len);
    assert_non_null(text);
    json_t **cases = calloc(len + 1, sizeof *cases);
    *n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *c = json_loads(line, JSON_ALLOW_NUL, &je);
        if (!c) fail_msg("%s line %d: %s", rel, *n + 1, je.text);
        cases[(*n)++] = c;
    }
    free(text);
    return cases;
}

static int same_ids(const int *a, int na, json_t *want)
{
    if (!json_is_array(want) || (int)json_array_size(want) != na) return 0;
    for (int i = 0; i < na; i++)
        if (json_integer_value(json_array_get(want, (size_t)i)) != a[i]) return 0;
    return 1;
}

static void print_ids(const char *what, const int *ids, int n, json_t *want)
{
    char *w = json_dumps(want, JSON_COMPACT);
    print_message("    %s: got [", what);
    for (int i = 0; i < n; i++) print_message("%s%d", i ? "," : "", ids[i]);
    print_message("] want %s\n", w);
    free(w);
}

/* Whether s[0, n) is whole UTF-8 characters. */
static int whole_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

/* Push ids one at a time: each piece whole characters, all pieces and the flush the full decode. */
static int stream_ok(const ppn_tokenizer *t, const int *ids, int n, const char *full, size_t full_len)
{
    ppn_detok_stream *s = NULL;
    EXPECT_OK(ppn_detok_stream_create(t, &s));
    char *acc = malloc(full_len + 4096);
    size_t got = 0;
    int ok = 1;
    for (int i = 0; i <= n && ok; i++) {
        const char *piece;
        size_t len;
        EXPECT_OK(i < n ? ppn_detok_stream_push(s, ids[i], &piece, &len) : ppn_detok_stream_flush(s, &piece, &len));
        if (!whole_utf8(piece, len)) {
            print_message("    stream: piece %d is not whole UTF-8 characters\n", i);
            ok = 0;
        }
        if (got + len > full_len + 4000) ok = 0;
        if (ok) memcpy(acc + got, piece, len), got += len;
    }
    if (ok && (got != full_len || memcmp(acc, full, got))) {
        print_message("    stream: %zu bytes '%.*s', full decode %zu '%s'\n", got, (int)got, acc, full_len, full);
        ok = 0;
    }
    free(acc);
    ppn_detok_stream_free(s);
    return ok;
}

/* One case: ids exact (with and without the special tokens), decode exact, stream decode. */
static int check_case(const ppn_tokenizer *t, json_t *c, int idx)
{
    const char *text = json_string_value(json_object_get(c, "text"));
    size_t text_len = json_string_length(json_object_get(c, "text"));
    const char *dec = json_string_value(json_object_get(c, "decoded"));
    size_t dec_len = json_string_length(json_object_get(c, "decoded"));
    static int ids[MAX_IDS];
    static char buf[1 << 16];
    int n, ok = 1;
    size_t len;
    EXPECT_OK(ppn_tokenize(t, text, text_len, 1, ids, MAX_IDS, &n));
    if (!same_ids(ids, n, json_object_get(c, "ids_with_special")))
        print_ids("ids_with_special", ids, n, json_object_get(c, "ids_with_special")), ok = 0;
    EXPECT_OK(ppn_tokenize(t, text, text_len, 0, ids, MAX_IDS, &n));
    if (!same_ids(ids, n, json_object_get(c, "ids"))) print_ids("ids", ids, n, json_object_get(c, "ids")), ok = 0;
    /* Decode the reference ids, so a wrong encode does not hide a right decode. */
    json_t *want = json_object_get(c, "ids");
    n = (int)json_array_size(want);
    for (int i = 0; i < n; i++) ids[i] = (int)json_integer_value(json_array_get(want, (size_t)i));
    EXPECT_OK(ppn_detokenize(t, ids, n, buf, sizeof buf, &len));
    if (len != dec_len || memcmp(buf, dec, len)) {
        print_message("    decoded: got '%s' want '%s'\n", buf, dec);
        ok = 0;
    }
    if (!stream_ok(t, ids, n, dec, dec_len)) ok = 0;
    if (!ok) print_message("  case %d failed: text '%s'\n", idx, text);
    return ok;
}

static void check_family(const char *family)
{
    ppn_tokenizer *t = load(family);
    int n, bad = 0;
    json_t **cases = read_cases(family, &n);
    for (int i = 0; i < n; i++) {
        bad += !check_case(t, cases[i], i);
        json_decref(cases[i]);
    }
    free(cases);
    ppn_tokenizer_free(t);
    print_message("%s: %d/%d cases pass\n", family, n - bad, n);
    assert_true(n >= 46);
    if (bad) fail_msg("%s: %d of %d cases differ from tokenizers", family, bad, n);
}

static void test_tok_llama3(void **state) { (void)state, check_family("llama3"); }
static void test_tok_llama2(void **state) { (void)state, check_family("llama2"); }
static void test_tok_qwen2(void **state) { (void)state, check_family("qwen2"); }

/* Encode text (no special tokens added) and compare with want (terminated by -2). */
static void expect_ids(const ppn_tokenizer *t, const char *text, int add_special, const int *want)
{
    int ids[256], n, k = 0;
    EXPECT_OK(ppn_tokenize(t, text, strlen(text), add_special, ids, 256, &n));
    while (want[k] != -2) k++;
    int same = n == k;
    for (int i = 0; same && i < n; i++) same = ids[i] == want[i];
    if (!same) {
        print_message("'%s': got", text);
        for (int i = 0; i < n; i++) print_message(" %d", ids[i]);
        print_message("\n");
        fail_msg("'%s': ids differ (want %d ids)", text, k);
    }
}

/* Special-token text in the input is its id (matched before normalization), with or without add_special; in
 * Llama 2 the Prepend normalizer runs on each segment between added tokens. BOS / EOS as the config says. */
static void test_tok_special_text(void **state)
{
    (void)state;
    ppn_tokenizer *l3 = load("llama3"), *l2 = load("llama2"), *q = load("qwen2");
    assert_int_equal(ppn_tokenizer_bos(l3), 128000);
    assert_int_equal(ppn_tokenizer_eos(l3), 128001);
    assert_int_equal(ppn_tokenizer_bos(l2), 1);
    assert_int_equal(ppn_tokenizer_eos(l2), 2);
    assert_int_equal(ppn_tokenizer_bos(q), -1);
    assert_int_equal(ppn_tokenizer_eos(q), 151643);
    int hi = ppn_tokenizer_n_ids(l3);
    assert_int_equal(hi, 128256);
    int id_hi[] = {128000, 128000, 13347, 128001, -2};   /* "Hi" is 13347 */
    expect_ids(l3, "<|begin_of_text|>Hi<|end_of_text|>", 1, id_hi);
    int q_chat[] = {151644, 872, 198, 151645, -2};   /* <|im_start|>user\n<|im_end|> */
    expect_ids(q, "<|im_start|>user\n<|im_end|>", 1, q_chat);
    int l2_seg[] = {1, 1, 29871, 13, 2, -2};         /* <s> <s> "▁\n" </s>: Prepend on the segment "\n" */
    expect_ids(l2, "<s>\n</s>", 1, l2_seg);
    ppn_tokenizer_free(l3);
    ppn_tokenizer_free(l2);
    ppn_tokenizer_free(q);
}

/* Byte-level tokens that split a character: the stream holds the first bytes back and emits the character whole;
 * the full decode of the unfinished character is U+FFFD. Buffers too small are refused with the size. */
static void test_tok_stream_split_char(void **state)
{
    (void)state;
    ppn_tokenizer *t = load("llama3");
    int ids[16], n;
    const char *text = "\xf0\x9f\xa6\x99 llama";   /* U+1F999 is several byte-level tokens */
    EXPECT_OK(ppn_tokenize(t, text, strlen(text), 0, ids, 16, &n));
    assert_true(n >= 3);
    ppn_detok_stream *s;
    EXPECT_OK(ppn_detok_stream_create(t, &s));
    const char *piece;
    size_t len;
    EXPECT_OK(ppn_detok_stream_push(s, ids[0], &piece, &len));
    assert_int_equal(len, 0);   /* the first token is only part of the emoji */
    char buf[64];
    size_t blen;
    EXPECT_OK(ppn_detokenize(t, ids, 1, buf, sizeof buf, &blen));
    assert_string_equal(buf, "\xef\xbf\xbd");
    EXPECT_ST(PPN_EINVAL, ppn_detokenize(t, ids, n, buf, 3, &blen));
    assert_int_equal(blen, strlen(text));
    EXPECT_ST(PPN_EINVAL, ppn_tokenize(t, text, strlen(text), 0, ids, 1, &n));
    assert_true(n >= 3);
    EXPECT_ST(PPN_EINVAL, ppn_tokenize(t, "\xff", 1, 0, ids, 16, &n));
    MSG_HAS("not valid UTF-8");
    int bad_id = 999999;
    EXPECT_ST(PPN_EINVAL, ppn_detok_stream_push(s, bad_id, &piece, &len));
    ppn_detok_stream_free(s);
    ppn_tokenizer_free(t);
}

static void write_file(const char *path, const char *text) { tu_write_file(path, text, strlen(text)); }

/* dir/tokenizer.json: a BPE vocabulary and a decoder chain (its JSON list), loaded. */
static ppn_tokenizer *chain(const char *dir, const char *vocab, const char *decoders)
{
    char path[1024], json[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {%s}, \"merges\": []},"
             " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [%s]}}", vocab, decoders);
    write_file(path, json);
    ppn_tokenizer *t = NULL;
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    return t;
}

/* ids whole and streamed: the pieces add up to the whole decode, which is want. */
static void stream_is(const ppn_tokenizer *t, const int *ids, int n, const char *want)
{
    char buf[256];
    size_t len;
    EXPECT_OK(ppn_detokenize(t, ids, n, buf, sizeof buf, &len));
    assert_string_equal(buf, want);
    assert_true(stream_ok(t, ids, n, buf, len));
}

/* Decoder chains whose text changes once later ids come (fuzz_tokenizer, 2026-12-07: the stream's pieces did not
 * add up to the whole decode). ByteFallback decodes a run of byte tokens all or nothing, so a run is held until a
 * token ends it; a chain that is not window-exact (after a Fuse: a Replace of several characters, a Strip of two
 * from the start or any from the end) holds every id until the flush. */
static void test_tok_stream_decoder_chains(void **state)
{
    (void)state;
    char *dir = tu_tmpdir();
    const char *piece;
    size_t len;
    /* Llama 2's chain: "<0x41>" reads "A" until "<0xC3>" joins its run, which then is two U+FFFD */
    ppn_tokenizer *t = chain(dir, "\"<unk>\": 0, \"\u2581\": 1, \"a\": 2, \"<0x41>\": 3, \"<0xC3>\": 4,"
                             " \"<0xA9>\": 5, \"\u2581b\": 6",
                             "{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, \"content\": \" \"},"
                             " {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"},"
                             " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}");
    stream_is(t, (int[]){3, 4, 2}, 3, "\xef\xbf\xbd\xef\xbf\xbd" "a");
    stream_is(t, (int[]){3}, 1, "A");
    stream_is(t, (int[]){6, 4, 5, 6, 3, 3}, 6, "b\xc3\xa9 bAA");
    stream_is(t, (int[]){2, 3, 4, 5, 1, 2}, 6, "aA\xc3\xa9 a");
    ppn_detok_stream *s = NULL;
    EXPECT_OK(ppn_detok_stream_create(t, &s));
    EXPECT_OK(ppn_detok_stream_push(s, 2, &piece, &len));
    assert_int_equal(len, 1);                 /* "a": no byte token, out at once */
    EXPECT_OK(ppn_detok_stream_push(s, 3, &piece, &len));
    assert_int_equal(len, 0);                 /* a run: held */
    EXPECT_OK(ppn_detok_stream_push(s, 6, &piece, &len));
    assert_int_equal(len, 3);                 /* ended: "A b" */
    assert_memory_equal(piece, "A b", 3);
    ppn_detok_stream_free(s);
    ppn_tokenizer_free(t);
    /* after a Fuse, "aa" -> "X": "a" may still become part of an "X" */
    t = chain(dir, "\"a\": 0, \"b\": 1", "{\"type\": \"Fuse\"},"
              " {\"type\": \"Replace\", \"pattern\": {\"String\": \"aa\"}, \"content\": \"X\"}");
    stream_is(t, (int[]){0, 0, 1, 0}, 4, "Xba");
    stream_is(t, (int[]){0, 1, 0, 0, 0}, 5, "abXa");
    EXPECT_OK(ppn_detok_stream_create(t, &s));
    EXPECT_OK(ppn_detok_stream_push(s, 0, &piece, &len));
    assert_int_equal(len, 0);
    EXPECT_OK(ppn_detok_stream_push(s, 0, &piece, &len));
    assert_int_equal(len, 0);
    EXPECT_OK(ppn_detok_stream_flush(s, &piece, &len));
    assert_int_equal(len, 1);
    assert_memory_equal(piece, "X", 1);
    ppn_detok_stream_free(s);
    ppn_tokenizer_free(t);
    /* after a Fuse, Strip two spaces from the start and one from the end */
    t = chain(dir, "\" \": 0, \"a\": 1", "{\"type\": \"Fuse\"},"
              " {\"type\": \"Strip\", \"content\": \" \", \"start\": 2, \"stop\": 1}");
    stream_is(t, (int[]){0, 0, 0, 1, 0, 0, 1, 0}, 8, " a  a");
    stream_is(t, (int[]){1, 0, 1, 0, 0}, 5, "a a ");
    ppn_tokenizer_free(t);
    /* two leading strips: Metaspace's first space of the first token, then a Strip after the Fuse (a window whose
     * old id is a lone U+2581 decodes it to nothing, and the Strip then took the new id's space) */
    t = chain(dir, "\"\u2581\": 0, \"\u2581a\": 1, \"x\": 2", "{\"type\": \"Metaspace\", \"replacement\": \"\u2581\","
              " \"prepend_scheme\": \"first\"}, {\"type\": \"Fuse\"},"
              " {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}");
    stream_is(t, (int[]){2, 0, 1}, 3, "x  a");
    stream_is(t, (int[]){0, 0, 1, 0}, 4, " a ");
    ppn_tokenizer_free(t);
    tu_rmrf(dir);
    free(dir);
}

/* A missing tokenizer.json is PPN_EIO, a malformed one PPN_EFORMAT, an unknown model PPN_EUNSUPPORTED, a FIFO as
 * tokenizer.json or tokenizer_config.json PPN_EIO without blocking; each message names the file. */
static void test_tok_errors(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), path[1024];
    ppn_tokenizer *t = (ppn_tokenizer *)dir;
    EXPECT_ST(PPN_EIO, ppn_tokenizer_load(dir, &t));
    assert_null(t);
    MSG_HAS("tokenizer.json");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,}}}");
    EXPECT_ST(PPN_EFORMAT, ppn_tokenizer_load(dir, &t));
    MSG_HAS("tokenizer.json:1:");
    write_file(path, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    EXPECT_ST(PPN_EUNSUPPORTED, ppn_tokenizer_load(dir, &t));
    MSG_HAS("WordPiece");
    /* fuzz_tokenizer: one token with a huge id sized the token table by it (12 GB for id 2^30) */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 16777216}, \"merges\": []}}");
    EXPECT_ST(PPN_EFORMAT, ppn_tokenizer_load(dir, &t));
    MSG_HAS("no valid id");
    /* fuzz_tokenizer: a refused normalizer left the freed step list for the pre-tokenizer's loop to read and free
     * again (heap-use-after-free, double free) */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     " \"normalizer\": {\"type\": \"Lowercase\"}, \"pre_tokenizer\": null}");
    EXPECT_ST(PPN_EUNSUPPORTED, ppn_tokenizer_load(dir, &t));
    MSG_HAS("Lowercase");
    /* a Strip decoder strips one character a counted number of times (tokenizers: a char, two usize) */
    static const char *const strips[][2] = {{"\"ab\", \"start\": 1", "its content is not one character"},
                                           {"\" \", \"start\": -1", "start and stop are counts"}};
    for (int i = 0; i < 2; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                 " \"decoder\": {\"type\": \"Strip\", \"content\": %s, \"stop\": 0}}", strips[i][0]);
        write_file(path, json);
        EXPECT_ST(PPN_EFORMAT, ppn_tokenizer_load(dir, &t));
        MSG_HAS(strips[i][1]);
    }
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    EXPECT_ST(PPN_EFORMAT, ppn_tokenizer_load(dir, &t));
    MSG_HAS("merges[0]");
    /* The smallest valid one, both merge spellings, no decoder: tokens joined by spaces. */
    write_file(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"abb\": 3},"
                     " \"merges\": [\"a b\", [\"ab\", \"b\"]]}}");
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    int want[] = {3, 0, -2};
    expect_ids(t, "abba", 0, want);
    char buf[32];
    size_t len;
    int ids[] = {3, 0};
    EXPECT_OK(ppn_detokenize(t, ids, 2, buf, sizeof buf, &len));
    assert_string_equal(buf, "abb a");
    ppn_tokenizer_free(t);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"bos_token\": \"zz\"}");
    EXPECT_ST(PPN_EFORMAT, ppn_tokenizer_load(dir, &t));
    MSG_HAS("tokenizer_config.json");
    /* a FIFO as either file is refused at once (opening it would wait for a writer: the alarm fails the test) */
    alarm(20);
    unlink(path);
    assert_int_equal(mkfifo(path, 0644), 0);
    EXPECT_ST(PPN_EIO, ppn_tokenizer_load(dir, &t));
    MSG_HAS("tokenizer_config.json: is a FIFO, not a regular file");
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    unlink(path);
    assert_int_equal(mkfifo(path, 0644), 0);
    EXPECT_ST(PPN_EIO, ppn_tokenizer_load(dir, &t));
    MSG_HAS("tokenizer.json: is a FIFO, not a regular file");
    alarm(0);
    tu_rmrf(dir);
    free(dir);
}

/* Qwen2 normalizes to NFC: an NFD input has the ids of its NFC form and decodes to it; Llama 3 has no normalizer,
 * so there the two forms differ. */
static void test_tok_nfc(void **state)
{
    (void)state;
    ppn_tokenizer *q = load("qwen2"), *l3 = load("llama3");
    const char *nfd = "Cafe\xcc\x81 fran\xc3\xa7" "ais", *nfc = "Caf\xc3\xa9 fran\xc3\xa7" "ais";
    int a[64], b[64], na, nb;
    EXPECT_OK(ppn_tokenize(q, nfd, strlen(nfd), 0, a, 64, &na));
    EXPECT_OK(ppn_tokenize(q, nfc, strlen(nfc), 0, b, 64, &nb));
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    char buf[64];
    size_t len;
    EXPECT_OK(ppn_detokenize(q, a, na, buf, sizeof buf, &len));
    assert_string_equal(buf, nfc);
    EXPECT_OK(ppn_tokenize(l3, nfd, strlen(nfd), 0, a, 64, &na));
    EXPECT_OK(ppn_detokenize(l3, a, na, buf, sizeof buf, &len));
    assert_string_equal(buf, nfd);
    ppn_tokenizer_free(q);
    ppn_tokenizer_free(l3);
}

/* A small tokenizer.json in a fresh directory; returns the directory (malloc'd). */
static char *tiny_tokenizer(const char *json)
{
    char *dir = tu_tmpdir(), path[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, json);
    return dir;
}

/* Added tokens match leftmost-longest: "<xy" is one token though "<x" is also one. */
static void test_tok_added_longest(void **state)
{
    (void)state;
    char *dir = tiny_tokenizer("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"x\": 0, \"y\": 1}, \"merges\": []},"
                               " \"added_tokens\": [{\"id\": 2, \"content\": \"<x\"}, {\"id\": 3, \"content\": \"<xy\"}]}");
    ppn_tokenizer *t;
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    int want[] = {0, 3, 2, 0, -2};
    expect_ids(t, "x<xy<xx", 0, want);
    ppn_tokenizer_free(t);
    tu_rmrf(dir);
    free(dir);
}

/* No ids through a ByteLevel decoder is the empty text (fuzz_tokenizer: the decoder's one empty piece had no text
 * buffer, and the decode added its offset to a NULL pointer, which UBSan reports). */
static void test_tok_decode_empty(void **state)
{
    (void)state;
    char *dir = tiny_tokenizer("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"x\": 0}, \"merges\": []},"
                               " \"decoder\": {\"type\": \"ByteLevel\"}}");
    ppn_tokenizer *t;
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    char buf[8] = "?";
    size_t len = 1;
    EXPECT_OK(ppn_detokenize(t, NULL, 0, buf, sizeof buf, &len));
    assert_int_equal(len, 0);
    assert_string_equal(buf, "");
    ppn_tokenizer_free(t);
    tu_rmrf(dir);
    free(dir);
}

/* GPT-2's pre-tokenizer (ByteLevel with use_regex, as SmolLM2's tokenizer.json has it): words split before the
 * model, so with ignore_merges each whole word in the vocabulary is one token; the byte-level decoder undoes
 * the mapping (Ġ is the space). */
static void test_tok_gpt2_regex(void **state)
{
    (void)state;
    char *dir = tiny_tokenizer(
        "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"merges\": [],"
        " \"vocab\": {\"Hello\": 0, \"\u0120world\": 1, \"'s\": 2, \"\u01202024\": 3, \"!\": 4}},"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
        " \"decoder\": {\"type\": \"ByteLevel\"}}");
    ppn_tokenizer *t;
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    int want[] = {0, 1, 2, 3, 4, -2};
    expect_ids(t, "Hello world's 2024!", 0, want);
    char buf[64];
    size_t len;
    int ids[] = {0, 1, 2, 3, 4};
    EXPECT_OK(ppn_detokenize(t, ids, 5, buf, sizeof buf, &len));
    assert_string_equal(buf, "Hello world's 2024!");
    ppn_tokenizer_free(t);
    tu_rmrf(dir);
    free(dir);
}

/* tokenizers' Digits pre-tokenizer (SmolLM2's first step, before GPT-2's ByteLevel): individual_digits splits
 * every numeric character off alone, else runs of them; Unicode numerics (\p{N}) count. */
static void test_tok_digits(void **state)
{
    (void)state;
    const char *fmt = "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"merges\": [],"
                      " \"vocab\": {\"a\": 0, \"1\": 1, \"2\": 2, \"12\": 3, \"\u0120\": 4, \"\u00c2\u00bd\": 5}},"
                      " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\","
                      " \"individual_digits\": %s}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]},"
                      " \"decoder\": {\"type\": \"ByteLevel\"}}";
    char json[1024];
    for (int indiv = 0; indiv < 2; indiv++) {
        snprintf(json, sizeof json, fmt, indiv ? "true" : "false");
        char *dir = tiny_tokenizer(json);
        ppn_tokenizer *t;
        EXPECT_OK(ppn_tokenizer_load(dir, &t));
        int want_one[] = {0, 1, 2, 4, 5, -2}, want_run[] = {0, 3, 4, 5, -2};   /* "a12 ½": ½ is numeric (No) */
        expect_ids(t, "a12 \u00bd", 0, indiv ? want_one : want_run);
        ppn_tokenizer_free(t);
        tu_rmrf(dir);
        free(dir);
    }
}

/* Issue 19: SmolLM2-135M-Instruct's own tokenizer.json (Digits + GPT-2 ByteLevel, 49,152 ids, no BOS) and chat
 * template against the fixture's reference.json: the chat prompts' template text and every prompt's ids exact,
 * the greedy ids decoding to greedy_text; with the README's traps (a whitespace run before a digit, bytes
 * without a token dropped). */
static void test_tok_smollm2(void **state)
{
    (void)state;
    const char *dir = tu_smollm2();
    if (!dir) skip();
    ppn_tokenizer *t = NULL;
    ppn_template *tp = NULL;
    EXPECT_OK(ppn_tokenizer_load(dir, &t));
    EXPECT_OK(ppn_template_load(dir, &tp));
    assert_int_equal(ppn_tokenizer_n_ids(t), 49152);
    json_error_t je;
    json_t *ref = json_load_file(tu_fixture("real/smollm2/reference.json"), 0, &je);
    if (!ref) fail_msg("reference.json: %s", je.text);
    json_t *prompts = json_object_get(ref, "prompts"), *p;
    size_t k;
    static int ids[MAX_IDS];
    static char buf[1 << 16];
    json_array_foreach(prompts, k, p) {
        const char *text = json_string_value(json_object_get(p, "text"));
        char *rendered = NULL;
        if (json_is_true(json_object_get(p, "chat"))) {
            char *msgs = json_dumps(json_object_get(p, "messages"), JSON_PRESERVE_ORDER);
            EXPECT_OK(ppn_template_render_json(tp, msgs, NULL, 1, &rendered));
            free(msgs);
            assert_string_equal(rendered, json_string_value(json_object_get(p, "rendered")));
            text = rendered;
        }
        int n;
        EXPECT_OK(ppn_tokenize(t, text, strlen(text), 0, ids, MAX_IDS, &n));
        if (!same_ids(ids, n, json_object_get(p, "prompt_ids"))) {
            print_ids("prompt_ids", ids, n, json_object_get(p, "prompt_ids"));
            fail_msg("prompt %zu: ids differ", k);
        }
        EXPECT_OK(ppn_tokenize(t, text, strlen(text), 1, ids, MAX_IDS, &n));   /* add_bos_token false: the same */
        assert_true(same_ids(ids, n, json_object_get(p, "prompt_ids")));
        free(rendered);
        json_t *g = json_object_get(p, "greedy_ids");
        n = (int)json_array_size(g);
        for (int i = 0; i < n; i++) ids[i] = (int)json_integer_value(json_array_get(g, (size_t)i));
        size_t len;
        EXPECT_OK(ppn_detokenize(t, ids, n, buf, sizeof buf, &len));
        assert_string_equal(buf, json_string_value(json_object_get(p, "greedy_text")));
    }
    assert_int_equal(k, 3);
    json_decref(ref);
    int ws_digit[] = {10835, 22665, 13675, 39892, 32, 30, -2};   /* "\n\n  " whole, then "0" (llama.cpp's split) */
    expect_ids(t, "CONDITIONS\n\n  0.", 0, ws_digit);
    int dropped[] = {81, 82, -2};                                  /* 0x04 has no token: dropped, as HF does */
    expect_ids(t, "a\x04" "b", 0, dropped);
    int digits[] = {33, 34, 35, 36, 37, 43239, 216, 35, 30, 33, 36, -2};
    expect_ids(t, "12345 abc 3.14", 0, digits);
    ppn_template_free(tp);
    ppn_tokenizer_free(t);
}

/* `ppn tokenize` reads stdin and prints comma-separated ids; `ppn detokenize` prints the text back. */
static void test_tok_cli(void **state)
{
    (void)state;
    char args[4096], *out = NULL, *err = NULL;
    const char *dir = tu_fixture("tok/llama3");
    snprintf(args, sizeof args, "tokenize --model '%s' --special < /dev/null", dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 0);
    assert_string_equal(out, "128000\n");
    free(out), free(err);
    char *tmp = tu_tmpdir(), in[1024];
    snprintf(in, sizeof in, "%s/in.txt", tmp);
    write_file(in, "ied 4 ½ months\n");
    snprintf(args, sizeof args, "tokenize --model '%s' < '%s'", dir, in);
    int rc = tu_run_ppn("", args, &out, &err, NULL);
    tu_rmrf(tmp);
    free(tmp);
    if (rc) fail_msg("ppn tokenize: exit %d: %s", rc, err);
    assert_string_equal(out, "1142,220,19,220,27154,4038,198\n");   /* the newline is 198 */
    free(out), free(err);
    snprintf(args, sizeof args, "detokenize --model '%s' --ids 128000,1142,220,19,220,27154,4038", dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 0);
    assert_string_equal(out, "<|begin_of_text|>ied 4 ½ months");
    free(out), free(err);
    snprintf(args, sizeof args, "detokenize --model '%s' --ids 1,x", dir);
    assert_int_equal(tu_run_ppn("", args, &out, &err, NULL), 2);
    free(out), free(err);
    assert_int_equal(tu_run_ppn("", "tokenize --model /nonexistent < /dev/null", &out, &err, NULL), 1);
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
    free(out), free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok_llama3),
        cmocka_unit_test(test_tok_llama2),
        cmocka_unit_test(test_tok_qwen2),
        cmocka_unit_test(test_tok_special_text),
        cmocka_unit_test(test_tok_stream_split_char),
        cmocka_unit_test(test_tok_stream_decoder_chains),
        cmocka_unit_test(test_tok_errors),
        cmocka_unit_test(test_tok_nfc),
        cmocka_unit_test(test_tok_added_longest),
        cmocka_unit_test(test_tok_decode_empty),
        cmocka_unit_test(test_tok_gpt2_regex),
        cmocka_unit_test(test_tok_digits),
        cmocka_unit_test(test_tok_smollm2),
        cmocka_unit_test(test_tok_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
