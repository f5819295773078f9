#!/usr/bin/env bash
# pipeline.sh - the pipeline's GPU run (device machine, one GPU): tests/gpu, fixtures on cuda, the gates
# (split, pipelined, and a 1,000-run pipelined soak), and the cost of the split (ppn bench) on the llama-1b and
# llama-8b shapes. Results go to $OUT. Expects build/ and .devcarry/fixtures (see validate.sh). Run from the
# repository root. Common part: tools/device/common.sh.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin name,driver_version,memory.total
for t in build/gpu/gpu_test_*; do
    log "$t"; timeout 120 "$t" > "$OUT/$(basename "$t").log" 2>&1 || fail=1; tail -n 1 "$OUT/$(basename "$t").log" | tee -a "$S"
done
for m in llama-tiny qwen2-tiny qwen3-tiny; do
    log "fixture $m f32"; timeout 60 python3 tools/device/hf_compare.py fixture "$FIX/hf/$m" --dtype f32 --tol 1e-3 | tee -a "$S" || fail=1
done
timeout 60 "$PPN" mkmodel --shape tiny --out /tmp/tiny >/dev/null 2>&1
log "gate all, tiny shape (4 layers, bf16), soak 1000 runs"
timeout 240 "$PPN" gate --model /tmp/tiny --backend cuda --runs 1000 > "$OUT/gate_tiny.txt" 2>&1 || fail=1
grep -v "^soak #" "$OUT/gate_tiny.txt" | tail -n 40 >> "$S"; grep -c "^soak #.*PASS" "$OUT/gate_tiny.txt" | sed 's/^/soak runs passed: /' | tee -a "$S"
timeout 120 "$PPN" mkmodel --shape llama-1b --out /tmp/l1b >/dev/null 2>&1
log "gate split+pipelined+soak(50), llama-1b shape, N=2..8 on one GPU"
timeout 300 "$PPN" gate --model /tmp/l1b --backend cuda --max-stages 8 --steps 24 --runs 50 > "$OUT/gate_1b.txt" 2>&1 || fail=1
grep -v "^soak #" "$OUT/gate_1b.txt" >> "$S"; grep -c "^soak #.*PASS" "$OUT/gate_1b.txt" | sed 's/^/soak runs passed: /' | tee -a "$S"
log "run --stages 4 --check-unsplit, llama-1b"
timeout 120 "$PPN" run --model /tmp/l1b --backend cuda --ids 1,2,3,4 -n 32 --stages 4 --check-unsplit 2>&1 | tail -n 3 | tee -a "$S" || fail=1
log "bench llama-1b N=1,2,4,8"
timeout 300 "$PPN" bench --model /tmp/l1b --backend cuda --stages-sweep 1,2,4,8 -n 128 --prompt 16 --reps 3 --json > "$OUT/bench_1b.json" 2>>"$S" || fail=1
rm -rf /tmp/l1b
timeout 120 "$PPN" mkmodel --shape llama-8b --out /tmp/l8b >/dev/null 2>&1
log "bench llama-8b N=1,2,4,8"
timeout 300 "$PPN" bench --model /tmp/l8b --backend cuda --stages-sweep 1,2,4,8 -n 128 --prompt 16 --reps 3 --json > "$OUT/bench_8b.json" 2>>"$S" || fail=1
summarize "$OUT/bench_1b.json" "$OUT/bench_8b.json"
finish
