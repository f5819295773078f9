#!/usr/bin/env bash
# alt_builds.sh - experiment builds for the device's `alt` phase (tools/device/perf.sh): each is build/ppn made
# from the working tree with one change applied by a sed expression, copied to build/alt/ppn-NAME; the tree is
# restored after each. Used to place time inside a graph-replayed decode step without a profiler (METHOD.md:
# time variants that do one kernel twice and take the difference).
#
#   tools/device/alt_builds.sh account    one build per decode-step op, issuing it twice:
#                                         ppn-x2qkv ppn-x2attn ppn-x2o ppn-x2gu ppn-x2swiglu ppn-x2down ppn-x2head,
#                                         and the step's own: ppn-x2embed ppn-x2argmax ppn-x2hdr (the header from
#                                         the device token: the --device-greedy path)
#   tools/device/alt_builds.sh NAME FILE SED_EXPR   one build of your own
#   tools/device/alt_builds.sh clean      remove build/alt/
#
# Twice-issued ops whose output feeds their input (o and down add into x, SwiGLU works in place) change the
# numbers, not the launch geometry or the bytes moved, so their timing stands; their outputs are meaningless.
# Switches tried this way and not kept are recorded as patches inside their runs' archives (levers.patch in
# docs/runs/*.tar.xz, docs/runs/README.md: apply it, then build with the switch's #define flipped). Runs on the
# build machine (not the device: it shares nothing of tools/device/common.sh).
# Needs build-alt/ configured like build/ (cmake -S . -B build-alt -DCMAKE_BUILD_TYPE=Release
# -DPPN_STATIC_DEPS=1); made here if missing.
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."

one() { # name file sed-expr
    local name=$1 file=$2 expr=$3 keep
    [ -f build-alt/CMakeCache.txt ] || cmake -S . -B build-alt -DCMAKE_BUILD_TYPE=Release -DPPN_STATIC_DEPS=1 >/dev/null
    keep=$(mktemp)
    cp "$file" "$keep"
    sed -i "$expr" "$file"
    if cmp -s "$file" "$keep"; then
        cp "$keep" "$file"; rm -f "$keep"
        echo "alt_builds: $name: the expression changed nothing in $file" >&2; return 1
    fi
    if ! cmake --build build-alt -j"${JOBS:-2}" --target ppn >/dev/null; then
        cp "$keep" "$file"; rm -f "$keep"
        echo "alt_builds: $name: build failed" >&2; return 1
    fi
    cp "$keep" "$file"; rm -f "$keep"
    mkdir -p build/alt
    cp build-alt/ppn "build/alt/ppn-$name"
    echo "alt_builds: build/alt/ppn-$name ($file: $expr)"
}

case ${1:-} in
account)
    F=core/forward.c
    # each op's statement is issued once more just before itself (a multi-line call is written out whole)
    one x2qkv $F 's|^\(    PPN_CHECK(norm_matvec(m, s, r, qv, w->wqkv, (nh + 2 \* nkv) \* hd, x, w->attn_norm, w->bqkv));\)$|\1\n\1|'
    one x2attn $F 's|^\(        PPN_CHECK(ppn_op_attn_rope(g, s, r->att, qv, q->kc\[l\], q->vc\[l\], nh, nkv, hd, m->ctx, scale, hdr, r->attp,\)$|        PPN_CHECK(ppn_op_attn_rope(g, s, r->att, qv, q->kc[l], q->vc[l], nh, nkv, hd, m->ctx, scale, hdr, r->attp, m->attn_split, m->inv_freq[dev], c->rope_interleaved, m->kvdt));\n\1|'
    one x2o $F 's|^\(    PPN_CHECK(ppn_op_matvec(g, s, x, w->wo, wdt, r->att, dim, nh \* hd, 0, x));\)$|\1\n\1|'
    one x2gu $F 's|^\(    PPN_CHECK(norm_matvec(m, s, r, gate, w->wgu, 2 \* ffn, x, w->ffn_norm, 0));\)$|\1\n\1|'
    one x2swiglu $F 's|^\(    PPN_CHECK(ppn_op_swiglu(g, s, gate, gate, up, ffn));\)$|\1\n\1|'
    one x2down $F 's|^\(    return ppn_op_matvec(g, s, x, w->w_down, wdt, gate, dim, ffn, 0, x);\)$|    PPN_CHECK(ppn_op_matvec(g, s, x, w->w_down, wdt, gate, dim, ffn, 0, x));\n\1|'
    P=core/step.c # the step's own kernels (the account's "rest"): embedding, device argmax, header
    one x2embed $P 's|^\(    if (s == 0) PPN_CHECK(ppn_fwd_embed(m, q, r, io));\)$|\1\n\1|'
    one x2argmax $P 's|^\(    if (o.tok) PPN_CHECK(ppn_op_argmax_wide(m->rt->g, q, o.tok, o.logits, m->cfg.vocab, seq->amx));\)$|\1\n\1|'
    one x2hdr $P 's|^    return ppn_op_set_hdr_dev(g, q, io, c->pos, tok, seq->id, (int)c->step);$|    PPN_CHECK(ppn_op_set_hdr_dev(g, q, io, c->pos, tok, seq->id, (int)c->step));\n&|'
    one x2head $F 's|^\(    return norm_matvec(m, s, r, logits, m->lm_head, m->cfg.vocab, io_x(io), m->final_norm, 0);\)$|    PPN_CHECK(norm_matvec(m, s, r, logits, m->lm_head, m->cfg.vocab, io_x(io), m->final_norm, 0));\n\1|'
    ;;
clean) rm -rf build/alt ;;
"") sed -n '2,20p' "$self"; exit 2 ;;
*) [ $# -eq 3 ] || { echo "usage: $0 NAME FILE SED_EXPR" >&2; exit 2; }; one "$1" "$2" "$3" ;;
esac
