/* cmd_mkmodel.c - `ppn mkmodel`: write a random-weight checkpoint in HF layout. With --tokenizer DIR the model's
 * vocabulary is that tokenizer's (its embedding and head rows, BOS / EOS in config.json), and the tokenizer's
 * files are copied beside the weights, so the result is a checkpoint ppn tokenize, ppn template and ppn run all
 * take. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "tools/cli.h"
#include "core/model/ckpt.h"

/* The files of a tokenizer folder a checkpoint carries (the first is required). */
static const char *const tok_files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "chat_template.jinja"};

static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    if (out && fclose(out)) ok = 0;
    if (in) fclose(in);
    return ok ? 0 : cli_fail("mkmodel: copying %s to %s: %s", from, to, strerror(errno ? errno : EIO));
}

static int copy_tokenizer(const char *src, const char *dst)
{
    char from[4096], to[4096];
    struct stat sb;
    for (size_t i = 0; i < sizeof tok_files / sizeof tok_files[0]; i++) {
        snprintf(from, sizeof from, "%s/%s", src, tok_files[i]);
        snprintf(to, sizeof to, "%s/%s", dst, tok_files[i]);
        if (stat(from, &sb) || !S_ISREG(sb.st_mode)) continue;   /* only tokenizer.json is required: loaded first */
        if (!strcmp(from, to)) continue;
        if (copy_file(from, to)) return 1;
    }
    return 0;
}

/* The tokenizer's numbers, loaded through the public API (so only a tokenizer ppn reads is accepted). */
static int tokenizer_numbers(const char *dir, ppn_mk_tok *tok)
{
    ppn_tokenizer *t = NULL;
    ppn_status st = ppn_tokenizer_load(dir, &t);
    if (st != PPN_OK) return cli_fail_status(st, "mkmodel: loading the tokenizer");
    *tok = (ppn_mk_tok){ppn_tokenizer_n_ids(t), ppn_tokenizer_bos(t), ppn_tokenizer_eos(t)};
    ppn_tokenizer_free(t);
    return 0;
}

int cmd_mkmodel(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL, *tokdir = NULL;
    int dtype = PPN_DTYPE_BF16;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        int rc = 0;
        if (!strcmp(f, "--help")) {
            puts("usage: ppn mkmodel --shape tiny|qwen3-tiny|wide-tiny|wide-dim-tiny|llama-1b|llama-8b|qwen2-7b --out DIR"
                 " [--dtype bf16] [--seed S] [--tokenizer TOKDIR]\n"
                 "  --tokenizer TOKDIR  the vocabulary of TOKDIR's tokenizer.json (and its BOS / EOS), its tokenizer\n"
                 "                      files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,\n"
                 "                      chat_template.jinja: those present) copied into DIR");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(f, "--shape")) shape = v;
        else if (!strcmp(f, "--out")) out = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &dtype);
        else if (!strcmp(f, "--seed")) rc = cli_u64(f, v, &seed);
        else if (!strcmp(f, "--tokenizer")) tokdir = v;
        else return cli_fail("mkmodel: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (!shape || !out) return cli_fail("mkmodel: --shape and --out are required"), 2;
    ppn_mk_tok tok;
    if (tokdir && tokenizer_numbers(tokdir, &tok)) return 1;
    ppn_status st = ppn_mkmodel_tok(shape, dtype, out, seed, 0, tokdir ? &tok : NULL);
    if (st != PPN_OK) return cli_fail_status(st, "mkmodel");
    if (tokdir && copy_tokenizer(tokdir, out)) return 1;
    if (tokdir)
        fprintf(stderr, "ppn: wrote %s (%s, %s, vocabulary %d from %s)\n", out, shape, ppn_dtype_name(dtype), tok.vocab,
                tokdir);
    else
        fprintf(stderr, "ppn: wrote %s (%s, %s)\n", out, shape, ppn_dtype_name(dtype));
    return 0;
}
