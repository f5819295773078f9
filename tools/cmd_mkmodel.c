/* cmd_mkmodel.c - `ppn mkmodel`: write a random-weight checkpoint in HF layout. */
#include <stdio.h>
#include <string.h>
#include "tools/cli.h"
#include "core/model/ckpt.h"

int cmd_mkmodel(int argc, char **argv)
{
    const char *shape = NULL, *out = NULL;
    int dtype = PPN_DTYPE_BF16;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v;
        int rc = 0;
        if (!strcmp(f, "--help")) {
            puts("usage: ppn mkmodel --shape tiny|qwen3-tiny|llama-1b|llama-8b|qwen2-7b --out DIR [--dtype bf16]"
                 " [--seed S]");
            return 0;
        }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(f, "--shape")) shape = v;
        else if (!strcmp(f, "--out")) out = v;
        else if (!strcmp(f, "--dtype")) rc = cli_dtype(f, v, &dtype);
        else if (!strcmp(f, "--seed")) rc = cli_u64(f, v, &seed);
        else return cli_fail("mkmodel: unknown option '%s'", f), 2;
        if (rc) return rc;
    }
    if (!shape || !out) return cli_fail("mkmodel: --shape and --out are required"), 2;
    ppn_status st = ppn_mkmodel(shape, dtype, out, seed);
    if (st != PPN_OK) return cli_fail_status(st, "mkmodel");
    fprintf(stderr, "ppn: wrote %s (%s, %s)\n", out, shape, ppn_dtype_name(dtype));
    return 0;
}
