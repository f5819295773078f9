#!/usr/bin/env bash
# validate.sh - the GPU validation run (device machine): tests/gpu, the shared fixtures on the cuda backend,
# random models built with transformers, and one decode timing (BENCH_SHAPE=llama-1b, say). Results go to $OUT
# (or ./out). Run from the repository root.
#   expects: build/ (Release build made elsewhere, build/lib/libcmocka.so.0), FIXTURES dir (default
#   .devcarry/fixtures, a copy of ../shared/fixtures). Common part: tools/device/common.sh.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin -h name,driver_version,memory.total,clocks.sm
log "ppn topo --backend cuda"; "$PPN" topo --backend cuda 2>&1 | tee -a "$S"
for t in build/gpu/gpu_test_*; do
    log "$t"; timeout 120 "$t" > "$OUT/$(basename "$t").log" 2>&1; rc=$?
    tail -n 4 "$OUT/$(basename "$t").log" | tee -a "$S"; [ $rc = 0 ] || fail=1
done
for m in llama-tiny qwen2-tiny qwen3-tiny; do
    log "fixture $m f32"; timeout 240 python3 tools/device/hf_compare.py fixture "$FIX/hf/$m" --dtype f32 --tol 1e-3 2>&1 | tee -a "$S" || fail=1
    log "fixture $m bf16"; timeout 240 python3 tools/device/hf_compare.py fixture "$FIX/hf/$m" --dtype bf16 --tol 2e-2 2>&1 | tee -a "$S" || fail=1
done
log "llama2c stories260K f32"
timeout 240 python3 tools/device/hf_compare.py llama2c "$FIX/llama2c/stories260K.bin" "$FIX/llama2c/stories260K.bos.ids" \
    "$FIX/llama2c/stories260K.bos.logits.f32" 2>&1 | tee -a "$S" || fail=1
for k in llama qwen3; do
    log "random $k (transformers 5.x, bf16 weights, f32 reference) 64 steps, ppn f32"
    PYTHONUNBUFFERED=1 timeout 240 python3 tools/device/hf_compare.py random $k /tmp/rand-$k --steps 64 --dtype f32 --tol "${RAND_TOL:-1e-3}" 2>&1 | grep -v Warning | tail -n 1 | tee -a "$S" | grep -q '"pass": true' || fail=1
    log "random $k, ppn bf16 (bf16 KV cache)"
    PYTHONUNBUFFERED=1 timeout 240 python3 tools/device/hf_compare.py random $k /tmp/rand-$k --steps 64 --dtype bf16 --tol 2e-2 2>&1 | grep -v Warning | tail -n 1 | tee -a "$S" | grep -q '"pass": true' || fail=1
done
if [ -n "${BENCH_SHAPE:-}" ]; then
    log "timing: mkmodel $BENCH_SHAPE, run -n 128 after a 16-token prompt (cuda, bf16)"
    timeout 120 "$PPN" mkmodel --shape "$BENCH_SHAPE" --out /tmp/bench-model >/dev/null 2>&1
    for _ in 1 2 3; do
        timeout 120 "$PPN" run --model /tmp/bench-model --backend cuda --ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16 -n 128 --ctx 1024 --json --quiet
    done 2>&1 | tee -a "$S"
fi
finish
