#!/usr/bin/env bash
# prefill.sh - the prefill's GPU run (device machine, one GPU): tests/gpu (the GEMM and row kernels against their
# CPU references), the fixtures primed through ppn_prefill against transformers (f32 and bf16), the prime gate
# on the tiny and llama-1b shapes, and prompt speed (pp512, pp4096) then decode on llama-1b and llama-8b,
# N = 1 and the split. Results go to $OUT. Expects build/ and .devcarry/fixtures (see README.md). Run from the
# repository root. PHASES (default all): any of tests fixtures gate bench1b bench8b.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
PHASES=${PHASES:-tests fixtures gate bench1b bench8b}
LOG_TIME=1
begin name,driver_version,memory.total,clocks.sm
has() { case " $PHASES " in *" $1 "*) return 0 ;; esac; return 1; }
if has tests; then
    for t in build/gpu/gpu_test_*; do
        log "$t"; timeout 180 "$t" > "$OUT/$(basename "$t").log" 2>&1 || fail=1
        grep -E "PASSED|FAILED|TFLOP|tok/s" "$OUT/$(basename "$t").log" | tail -n 12 | tee -a "$S"
    done
fi
if has fixtures; then
    for m in llama-tiny qwen2-tiny qwen3-tiny; do
        for dt in f32 bf16; do
            tol=1e-3; [ $dt = bf16 ] && tol=2e-2
            log "fixture $m $dt (prompt primed by ppn run)"
            timeout 120 python3 tools/device/hf_compare.py fixture "$FIX/hf/$m" --dtype $dt --tol $tol 2>&1 | tee -a "$S" | grep -q '"pass": true' || fail=1
        done
    done
fi
if has fixtures; then
    log "chunk sizes on cuda (bf16 and f32): llama-tiny's 55 ids primed at chunks 1, 7, 64, 55; max |diff| vs chunk 55"
    ids=$(python3 -c "import json; print(','.join(map(str, json.load(open('$FIX/hf/llama-tiny/reference.json'))['all_ids'])))")
    for dt in f32 bf16; do
        for c in 1 7 64 55; do
            "$PPN" run --model "$FIX/hf/llama-tiny" --backend cuda --dtype $dt --ids "$ids" -n 0 --chunk $c \
                --logits-out "$OUT/chunk_${dt}_$c.f32" --quiet > /dev/null 2>&1 || fail=1
        done
        python3 - "$OUT" $dt <<'PY' | tee -a "$S"
import sys, numpy as np
out, dt = sys.argv[1], sys.argv[2]
ref = np.fromfile(f"{out}/chunk_{dt}_55.f32", dtype="<f4")
for c in (1, 7, 64):
    x = np.fromfile(f"{out}/chunk_{dt}_{c}.f32", dtype="<f4")
    same = x.tobytes() == ref.tobytes()
    print(f"{dt} chunk {c} vs 55: {'bit-identical' if same else 'max |diff| %.3g (max |logit| %.3g)' % (np.abs(x - ref).max(), np.abs(ref).max())}")
PY
    done
fi
if has gate; then
    timeout 60 "$PPN" mkmodel --shape tiny --out /tmp/tiny >/dev/null 2>&1
    log "gate prime, tiny shape (bf16)"
    timeout 120 "$PPN" gate --model /tmp/tiny --backend cuda prime --chunk 5 > "$OUT/gate_prime_tiny.txt" 2>&1 || fail=1
    grep -v PASS "$OUT/gate_prime_tiny.txt" | tail -n 8 | tee -a "$S"; grep -c PASS "$OUT/gate_prime_tiny.txt" | sed 's/^/PASS rows: /' | tee -a "$S"
fi
bench() { # shape, extra args...
    local shape=$1; shift
    timeout 200 "$PPN" mkmodel --shape "$shape" --out "/tmp/$shape" >/dev/null 2>&1 || { log "mkmodel $shape failed"; fail=1; return; }
    if has gate && [ "$shape" = llama-1b ]; then
        log "gate prime, llama-1b (N = 2..4, chunk 8)"
        timeout 150 "$PPN" gate --model "/tmp/$shape" --backend cuda prime --max-stages 4 --chunk 8 > "$OUT/gate_prime_1b.txt" 2>&1 || fail=1
        grep -v PASS "$OUT/gate_prime_1b.txt" | tail -n 6 | tee -a "$S"; grep -c PASS "$OUT/gate_prime_1b.txt" | sed 's/^/PASS rows: /' | tee -a "$S"
    fi
    log "bench $shape: pp512, pp4096 (chunk ${CHUNK:-512}), then 128 decode steps (device greedy), N = 1,2,4"
    timeout 280 "$PPN" bench --model "/tmp/$shape" --backend cuda --prompt 512,4096 --chunk "${CHUNK:-512}" -n 128 \
        --reps 3 --device-greedy --stages-sweep 1,2,4 "$@" > "$OUT/bench_$shape.txt" 2>&1 || fail=1
    grep -E "^ +[0-9]+ |prompt|error" "$OUT/bench_$shape.txt" | tee -a "$S"
    rm -rf "/tmp/$shape"
}
has bench1b && bench llama-1b
has bench8b && bench llama-8b
finish
