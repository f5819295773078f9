#!/usr/bin/env bash
# sanity.sh - one call's check of a merged tree on the GPU machine: tests/gpu ($TESTS), the batch, verify and
# prime gates on qwen2-tiny (f32, bf16), compute-sanitizer (memcheck, racecheck, synccheck) over the batch, verify,
# split, pipelined and prime gates of a tiny bf16 model (N <= 4), and a short decode bench on the llama-1b shape
# (single sequence, device greedy; batch 16) against the figures in docs/PERF.md. Results: $OUT/summary.txt.
. "$(dirname "$0")/common.sh"
export PPN_FIXTURES=$FIX
TESTS=${TESTS:-test_gpu_numa test_gpu_batch test_gpu_kernels}
begin -h name,driver_version,memory.total
for t in $TESTS; do
    log "tests/gpu $t"
    ${GPUBIN:-build/gpu}/gpu_$t > "$OUT/$t.txt" 2>&1 || { fail=1; log "FAIL $t"; }
    grep -E '^#|PASSED|FAILED|NOT CHECKED' "$OUT/$t.txt" | tee -a "$S"
done
for dt in f32 bf16; do
    log "gate batch spec split prime qwen2-tiny $dt"
    $PPN gate --model "$FIX/hf/qwen2-tiny" --backend cuda --dtype $dt batch spec split prime > "$OUT/gate_$dt.txt" 2>&1 ||
        { fail=1; log "FAIL gate $dt"; }
    tail -1 "$OUT/gate_$dt.txt" | tee -a "$S"
done
$PPN mkmodel --shape tiny --out /tmp/tiny --dtype bf16 > /dev/null
SAN=${SAN:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
for tool in memcheck racecheck synccheck; do
    log "compute-sanitizer --tool $tool: gate batch spec split pipelined prime, tiny bf16, N <= 4"
    timeout "${SAN_TIMEOUT:-240}" "$SAN" --tool $tool --error-exitcode 9 $PPN gate --model /tmp/tiny --backend cuda \
        batch spec split pipelined prime --max-stages 4 --steps 8 --prompt 4 --runs 1 > "$OUT/san_$tool.txt" 2>&1 ||
        { fail=1; log "FAIL $tool (exit $?)"; }
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|ppn gate:" "$OUT/san_$tool.txt" | tee -a "$S"
done
$PPN mkmodel --shape llama-1b --out /tmp/l1b --dtype bf16 > /dev/null
log "bench llama-1b: single sequence (device greedy), batch 16"
$PPN bench --model /tmp/l1b --backend cuda --prompt 128 -n 128 --reps 3 --device-greedy --json > "$OUT/single_1b.json" 2>&1 ||
    { fail=1; log "FAIL bench single"; }
summarize "$OUT/single_1b.json"
$PPN bench --model /tmp/l1b --backend cuda --batch 16 --prompt 128 -n 128 --reps 3 --json > "$OUT/batch_1b.json" 2>&1 ||
    { fail=1; log "FAIL bench batch"; }
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print('1b', r) for r in d['batch']]" "$OUT/batch_1b.json" | tee -a "$S"
finish
