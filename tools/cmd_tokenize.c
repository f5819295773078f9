/* cmd_tokenize.c - `ppn tokenize` (UTF-8 text on stdin -> comma-separated ids on stdout) and `ppn detokenize`
 * (ids -> the text, exactly, with no newline added), for scripts. --model names a directory holding
 * tokenizer.json (and tokenizer_config.json): a checkpoint's, or one holding only the tokenizer files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tools/cli.h"

static int tok_usage(FILE *f, const char *cmd)
{
    if (!strcmp(cmd, "tokenize"))
        fputs("usage: ppn tokenize --model DIR [--special] < text\n"
              "  reads UTF-8 text on stdin (every byte, a final newline included) and prints its ids, comma-separated\n"
              "  --special  add the special tokens the tokenizer's config asks for (BOS, EOS)\n",
              f);
    else
        fputs("usage: ppn detokenize --model DIR --ids 1,2,3\n"
              "  prints the text of the ids (special tokens included), with no newline added\n",
              f);
    return f == stdout ? 0 : 2;
}

/* All of stdin (malloc'd, *n bytes); NULL when it cannot be read. */
static char *read_stdin(size_t *n)
{
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    *n = 0;
    while (buf) {
        size_t k = fread(buf + *n, 1, cap - *n, stdin);
        *n += k;
        if (k == 0) break;
        if (*n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    if (buf && ferror(stdin)) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int print_ids(const ppn_tokenizer *t, const char *text, size_t len, int special)
{
    int n = 0;
    ppn_status st = ppn_tokenize(t, text, len, special, NULL, 0, &n);
    if (st != PPN_OK && n == 0) return cli_fail_status(st, "tokenize");
    int *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    if (!ids) return cli_fail("tokenize: out of memory for %d ids", n);
    st = ppn_tokenize(t, text, len, special, ids, n, &n);
    if (st != PPN_OK) {
        free(ids);
        return cli_fail_status(st, "tokenize");
    }
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

static int print_text(const ppn_tokenizer *t, const int *ids, int n)
{
    size_t len = 0;
    ppn_status st = ppn_detokenize(t, ids, n, NULL, 0, &len);
    if (st != PPN_OK && len == 0 && n) return cli_fail_status(st, "detokenize");
    char *buf = malloc(len + 1);
    if (!buf) return cli_fail("detokenize: out of memory for %zu bytes", len);
    st = ppn_detokenize(t, ids, n, buf, len + 1, &len);
    if (st == PPN_OK) fwrite(buf, 1, len, stdout);
    free(buf);
    return st == PPN_OK ? 0 : cli_fail_status(st, "detokenize");
}

/* Both commands: the same flags, parsed strictly (a flag the command does not take is a usage error). */
int cmd_tokenize(int argc, char **argv)
{
    const char *cmd = argv[0], *model = NULL;
    int detok = !strcmp(cmd, "detokenize"), special = 0, n_ids = 0, *ids = NULL, rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *f = argv[i], *v;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            free(ids);
            return tok_usage(stdout, cmd);
        } else if (!strcmp(f, "--model")) rc = (v = cli_value(argc, argv, &i)) ? (model = v, 0) : 2;
        else if (!detok && !strcmp(f, "--special")) special = 1;
        else if (detok && !strcmp(f, "--ids")) {
            rc = (v = cli_value(argc, argv, &i)) ? (free(ids), ids = NULL, cli_ids(f, v, &ids, &n_ids)) : 2;
        } else {
            cli_fail("%s: unknown option '%s'", cmd, f);
            rc = 2;
        }
    }
    if (!rc && (!model || (detok && !ids))) {
        cli_fail("%s: %s is required", cmd, !model ? "--model" : "--ids");
        rc = 2;
    }
    if (rc) {
        free(ids);
        if (rc == 2) tok_usage(stderr, cmd);
        return rc;
    }
    ppn_tokenizer *t = NULL;
    ppn_status st = ppn_tokenizer_load(model, &t);
    if (st != PPN_OK) {
        free(ids);
        return cli_fail_status(st, "loading the tokenizer");
    }
    if (detok) rc = print_text(t, ids, n_ids);
    else {
        size_t len;
        char *text = read_stdin(&len);
        rc = text ? print_ids(t, text, len, special) : cli_fail("tokenize: cannot read stdin");
        free(text);
    }
    free(ids);
    ppn_tokenizer_free(t);
    return rc;
}
