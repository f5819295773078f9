#!/usr/bin/env bash
# smollm2.sh [stash] - SmolLM2-135M-Instruct on the GPU machine (issue 19): the real model's text in and text out,
# its logits rows and greedy ids against the fixture's references (f32 and bf16, 1 and 4 stages on one GPU, the
# prompt primed in chunks and fed token by token), `ppn run --prompt --chat` and `ppn bench` speed. Run from the
# repository root; results in $OUT (summary.txt, bench JSON, the CLI runs' stderr).
#
# What crosses (tools/device/smollm2_prep.sh makes it on the build machine; the f32 checkpoint is too big): one
# xz-compressed tar (the GGUF, the references, convert.py, the gguf wheel, a stripped ppn) in two halves, each in
# its own call to the SAME warm machine, because a call carries at most 64 MiB with the tree:
#   call 1  carry [".devcarry/smollm2/a"]   command: OUT=$OUT tools/device/smollm2.sh stash
#   call 2  carry [".devcarry/smollm2/b"]   command: OUT=$OUT tools/device/smollm2.sh
# Each call checks its half against its SHA256SUMS and copies it into $SMOLLM2_STASH (default /tmp/ppn-smollm2,
# outside the working tree, which the next call's copy replaces). The second joins the halves (sha256 checked),
# unpacks them (python's lzma: no xz needed) and checks every file, converts the GGUF (sha256 checked) with the
# fixture's convert.py and the gguf wheel (numpy and PyYAML from the machine's python3), checks model.safetensors'
# sha256 against fetch.sh's, then runs PHASES. The converted checkpoint stays in the stash for later calls.
#
# PHASES (default "checks cli bench"): checks (tools/device/smollm2_check.py for f32 and bf16 x 1 and 4 stages x
# chunk 2048 and token by token: every prompt teacher-forced and free-running greedy), cli (the France question,
# the answer must be the reference's in f32), bench (ppn bench --prompt 128 -n 128: bf16 at 1 and 4 stages, host-fed
# and --device-greedy, and f32 at 1 stage; decode ms/token against the weight floor, prompt tok/s).
# Environment: BACKEND (default cuda; sim runs the same checks on a machine without a GPU), PPN (default the
# carried ppn, else build/ppn), SMOLLM2_CARRY (default .devcarry/smollm2), SMOLLM2_STASH, DTYPES (default
# "f32 bf16"), STAGES (default "1 4"), CHUNKS (default "2048 0"), PROMPTS (default 0,1,2).
# shellcheck source-path=SCRIPTDIR source=common.sh
CARRY=${SMOLLM2_CARRY:-.devcarry/smollm2}
STASH=${SMOLLM2_STASH:-/tmp/ppn-smollm2}
F=$STASH/files   # the halves as carried
P=$STASH/payload # what they hold
if [ -z "${PPN:-}" ]; then
    if [ -d "$CARRY/b" ] || [ -x "$P/ppn" ]; then PPN=$P/ppn; else PPN=build/ppn; fi   # the carried one
fi
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BACKEND=${BACKEND:-cuda}
PHASES=${PHASES:-checks cli bench}
M=$STASH/model
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_SHA256=aaa076558d5b9b5f06bd60604a5a332b7311b52f4079be2aa6f34a8317ec93c3
QUESTION="What is the capital of France?"
ANSWER="The capital of France is Paris."
LOG_TIME=1
sha() { sha256sum "$1" | cut -d' ' -f1; }
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }

# Each half present, checked against its list, copied into the stash.
stash() {
    local p
    for p in a b; do
        [ -d "$CARRY/$p" ] || continue
        if (cd "$CARRY/$p" && sha256sum --quiet -c "SHA256SUMS.$p"); then
            if ! { mkdir -p "$F" && cp -f "$CARRY/$p"/* "$F/"; }; then fail=1; return 1; fi
            log "stash: $CARRY/$p -> $F: $(cd "$CARRY/$p" && echo *)"
        else
            log "stash: $CARRY/$p does not match its SHA256SUMS.$p"; fail=1
        fi
    done
    return 0
}

# The halves joined and unpacked into $P, every file checked (skipped when $P already holds this archive's).
unpack() {
    local f want
    for f in payload.part1 payload.part2 PAYLOAD.sha256; do
        if [ ! -f "$F/$f" ]; then
            log "unpack: $F/$f is missing: carry $CARRY/a (call 1: smollm2.sh stash), then $CARRY/b (call 2), to one warm machine"
            return 1
        fi
    done
    want=$(cut -d' ' -f1 "$F/PAYLOAD.sha256")
    if [ -f "$P/.payload" ] && [ "$(cat "$P/.payload")" = "$want" ]; then return 0; fi
    if [ "$(cat "$F/payload.part1" "$F/payload.part2" | sha256sum | cut -d' ' -f1)" != "$want" ]; then
        log "unpack: the joined halves do not match PAYLOAD.sha256 (halves of two different preps? carry both again)"
        return 1
    fi
    rm -rf "$P" && mkdir -p "$P"
    cat "$F/payload.part1" "$F/payload.part2" |
        python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" |
        tar -C "$P" -xf - || { log "unpack: decompression failed"; return 1; }
    (cd "$P" && sha256sum --quiet -c SHA256SUMS) || { log "unpack: a file differs from SHA256SUMS"; return 1; }
    chmod +x "$P/ppn"
    echo "$want" > "$P/.payload"
    log "unpack: $P: $(cd "$P" && echo *)"
}

# The checkpoint in $M: converted and checked (kept for later calls while the machine stays warm).
checkpoint() {
    if [ -f "$M/model.safetensors" ] && [ "$(cat "$M.from" 2>/dev/null)" = "$GGUF_SHA256" ]; then
        log "checkpoint: $M (converted by an earlier call)"
        [ "$(sha "$M/model.safetensors")" = "$MODEL_SHA256" ] || { log "checkpoint: its sha256 is not fetch.sh's"; fail=1; }
        return 0
    fi
    [ "$(sha "$P/model.gguf")" = "$GGUF_SHA256" ] || { log "checkpoint: the GGUF's sha256 differs"; return 1; }
    python3 -c "import numpy, yaml" 2>/dev/null || { log "checkpoint: convert.py needs numpy and PyYAML in python3"; return 1; }
    rm -rf "$STASH/pylib" "$STASH/convert" "$M.from"
    python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
        "$P/gguf-0.19.0-py3-none-any.whl" "$STASH/pylib" || return 1
    PYTHONPATH="$STASH/pylib${PYTHONPATH:+:$PYTHONPATH}" python3 "$P/convert.py" "$P/model.gguf" "$STASH/convert" \
        > "$OUT/convert.log" 2>&1 || { log "checkpoint: convert.py failed: $(tail -n 3 "$OUT/convert.log")"; return 1; }
    local got
    got=$(sha "$STASH/convert/model.safetensors")
    if [ "$got" != "$MODEL_SHA256" ]; then   # the run goes on (its checks say how far off), but cannot pass
        log "checkpoint: model.safetensors sha256 $got, not fetch.sh's $MODEL_SHA256 (this python's numpy?)"; fail=1
    fi
    rm -rf "$M" && mv "$STASH/convert" "$M" && echo "$GGUF_SHA256" > "$M.from"
    log "checkpoint: $M converted (model.safetensors sha256 $got)"
}

# The reference answer through the CLI: text exact in f32; bf16 shown (the README's bf16 rule lets prompt 0 differ
# after a generated position whose reference margin is under 0.5; smollm2_check.py applies it).
cli() {
    local dt st out
    for dt in f32 bf16; do
        for st in 1 4; do
            out=$(timeout 120 "$PPN" run --model "$M" --backend "$BACKEND" --dtype $dt --stages $st \
                --prompt "$QUESTION" --chat -n 64 2> "$OUT/cli_${dt}_$st.err")
            log "cli $dt, $st stage(s): \"$out\""
            grep -E "^stage map|tok/s" "$OUT/cli_${dt}_$st.err" | tee -a "$S"
            if [ $dt = f32 ] && [ "$out" != "$ANSWER" ]; then log "cli: want \"$ANSWER\""; fail=1; fi
        done
    done
}

bench() {
    local name args
    # shellcheck disable=SC2054 # the commas are ppn's list syntax
    for name in bf16_host bf16_device f32_host; do
        case $name in
            bf16_host) args=(--dtype bf16 --stages-sweep 1,4) ;;
            bf16_device) args=(--dtype bf16 --stages-sweep 1,4 --device-greedy) ;;
            f32_host) args=(--dtype f32) ;;
        esac
        log "bench $name: ppn bench --prompt 128 -n 128 ${args[*]}"
        timeout 300 "$PPN" bench --model "$M" --backend "$BACKEND" --prompt 128 -n 128 --json "${args[@]}" \
            > "$OUT/bench_$name.json" 2> "$OUT/bench_$name.err" || { tail -n 3 "$OUT/bench_$name.err" | tee -a "$S"; fail=1; continue; }
        summarize "$OUT/bench_$name.json"
        python3 - "$OUT/bench_$name.json" <<'PY' | tee -a "$S"
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["configs"]:
    p = c["prompts"][0]
    print("  N=%d decode %.3f ms/token (floor %.4f ms: %.1fx) prompt %d: %.0f tok/s (%.2f ms)" % (
        c["stages"], c["median_ms"], d["floor_ms"], c["median_ms"] / d["floor_ms"], p["len"], p["tok_s"], p["ms"]))
PY
    done
}

if [ "${1:-}" = stash ]; then
    date -u +%FT%TZ >> "$S"
    stash
    finish
fi
[ $# -eq 0 ] || { echo "usage: smollm2.sh [stash]" >&2; exit 2; }
if [ "$BACKEND" = sim ]; then date -u +%FT%TZ > "$S"; else begin -h name,driver_version,memory.total,clocks.sm; fi
stash
unpack || { fail=1; finish; }
checkpoint || { fail=1; finish; }
if has checks; then
    for dt in ${DTYPES:-f32 bf16}; do
        for st in ${STAGES:-1 4}; do
            for ch in ${CHUNKS:-2048 0}; do
                log "check $dt, $st stage(s), chunk $ch (0: token by token)"
                timeout 600 python3 "$(dirname "${BASH_SOURCE[0]}")/smollm2_check.py" --ref "$P" --model "$M" \
                    --backend "$BACKEND" --dtype "$dt" --stages "$st" --chunk "$ch" --prompts "${PROMPTS:-0,1,2}" \
                    --work "$STASH" 2>&1 | tee -a "$S"
                [ "${PIPESTATUS[0]}" = 0 ] || fail=1
            done
        done
    done
fi
has cli && cli
has bench && bench
finish
