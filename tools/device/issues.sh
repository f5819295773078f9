#!/usr/bin/env bash
# issues.sh - the open issues' figures on the card that comes, in one call (well inside the 600 s a call may run):
# issue 16's 8B steps at B=16 and B=64 (`ppn bench --batch 16,64 --prompt 128 -n 64 --reps 2`, $ROUNDS rounds), the
# 16 + 112-row serving iteration (`--batch 16 --mixed 112 --prompt 512 -n 16 --reps 2`), then issue 17's load
# (serve.sh: one client, then 16 streaming clients of 512-token prompts and 128-token outputs). Each figure is set
# beside its H200 target in the summary (the targets are the H200's: on another card they are context, not a
# verdict). Env: PPN (the binary), TOK (Llama 3's tokenizer folder, serve.sh's default), ROUNDS (2), SERVE (1: run
# serve.sh; 0: not). Results: $OUT/summary.txt, one JSON per bench, serve.sh's folder under $OUT/serve.
# Before (the build machine): ./build.sh; mkdir -p .devcarry/tok && cp -r ../shared/fixtures/tok/llama3 .devcarry/tok/
# Then: run, carry ["build/ppn", ".devcarry/tok"], command: OUT=$OUT tools/device/issues.sh
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-2}
M=/tmp/m-llama-8b
begin -h name,driver_version,memory.total
[ -d "$M" ] || $PPN mkmodel --shape llama-8b --out "$M" --dtype bf16 > /dev/null || { fail=1; finish; }
# One line a bench row: B (and prompt rows), the step, aggregate tok/s, and the target where the issue names one.
steps() {
    python3 - "$1" <<'PY' | tee -a "$S"
import json, sys
p = sys.argv[1]
want = {16: 3300, 64: 9000}  # issue 16, the 8B on the H200, aggregate decode tok/s
try: d = json.load(open(p))
except Exception as e: print(p.split("/")[-1], "unreadable:", e); sys.exit(0)
for r in d["batch"]:
    mixed = r.get("mixed", 0)
    tag = "16 + %d rows" % mixed if mixed else "B=%d" % r["B"]
    goal = "" if mixed or r["B"] not in want else " (issue 16: >= %d, %s)" % (
        want[r["B"]], "met" if r["agg_tok_s"] >= want[r["B"]] else "not met")
    print("%s %s: step %.4f ms, %.1f tok/s%s" % (p.split("/")[-1], tag, r["step_ms"], r["agg_tok_s"], goal))
PY
}
for r in $(seq 1 "$ROUNDS"); do
    log "8B B=16,64 round $r"
    timeout 60 "$PPN" bench --model "$M" --backend cuda --batch 16,64 --prompt 128 -n 64 --reps 2 --json \
        > "$OUT/batch_$r.json" 2> "$OUT/batch_$r.err" || { fail=1; log "FAIL bench round $r"; }
    steps "$OUT/batch_$r.json"
    log "8B 16 + 112 rows round $r"
    timeout 60 "$PPN" bench --model "$M" --backend cuda --batch 16 --mixed 112 --prompt 512 -n 16 --reps 2 --json \
        > "$OUT/mixed112_$r.json" 2> "$OUT/mixed112_$r.err" || { fail=1; log "FAIL mixed round $r"; }
    steps "$OUT/mixed112_$r.json"
done
if [ "${SERVE:-1}" = 1 ]; then
    log "issue 17's load (serve.sh; the issue on the H200: >= 3,000 output tok/s, ITL p99 <= 8 ms, TTFT p50 < 150 ms)"
    OUT="$OUT/serve" timeout 240 bash "$(dirname "$0")/serve.sh" > "$OUT/serve.txt" 2>&1 || { fail=1; log "FAIL serve"; }
    grep -E "clients out tok/s|FAIL" "$OUT/serve.txt" | tee -a "$S"
fi
finish
