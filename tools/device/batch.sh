#!/usr/bin/env bash
# batch.sh - many sequences per step on the GPU machine (docs/PERF.md, docs/VALIDATION.md: batched decode,
# paged KV, speculative verify). Phases (default: check gate bench):
#   check   tests/gpu: test_gpu_batch (runtime, f32 + bf16 fixtures), test_gpu_rows (paged cases), test_gpu_kernels
#   gate    ppn gate batch spec on qwen2-tiny (f32, bf16) and the llama-1b shape (bf16), cuda backend
#   bench   ppn bench --batch 1,4,16,64 (128-token prompts, 128 steps) on the llama-1b and llama-8b shapes, one GPU,
#           N = 1 and N = 4 stages on it (8b: B = 16); the single-sequence device-greedy bench beside it; --spec 7
#   kprof   the kernel account of the timed batch steps (PPN_KPROF=1, graphs off): llama-8b B = 16, 64, llama-1b B = 64
#   old     the single-sequence device-greedy bench with $OLD (a build from before paged KV) and with ppn, one
#           after the other, 3 times each (the paged batch-1 path against the contiguous caches)
# Results: $OUT/summary.txt and one file per run; env: PHASES, REPS (default 3).
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-check gate bench}
export PPN_FIXTURES=$FIX
REPS=${REPS:-3}
begin -h name,driver_version,memory.total
for ph in $PHASES; do
    case $ph in
    check)
        for t in test_gpu_batch test_gpu_kernels; do
            log "tests/gpu $t"
            ${GPUBIN:-build/gpu}/gpu_$t > "$OUT/$t.txt" 2>&1 || { fail=1; log "FAIL $t"; }
            grep -E '^#|PASSED|FAILED' "$OUT/$t.txt" | tee -a "$S"
        done
        log "tests/gpu test_gpu_rows (paged)"
        PPN_GPU_TEST_FILTER='*paged*' ${GPUBIN:-build/gpu}/gpu_test_gpu_rows > "$OUT/test_gpu_rows_paged.txt" 2>&1 || { fail=1; log "FAIL rows paged"; }
        grep -E 'PASSED|FAILED' "$OUT/test_gpu_rows_paged.txt" | tee -a "$S"
        ;;
    gate)
        for spec in "$FIX/hf/qwen2-tiny:f32" "$FIX/hf/qwen2-tiny:bf16"; do
            mdl=${spec%%:*} dt=${spec##*:}
            log "gate batch spec $(basename "$mdl") $dt"
            $PPN gate --model "$mdl" --backend cuda --dtype "$dt" batch spec > "$OUT/gate_$(basename "$mdl")_$dt.txt" 2>&1 || { fail=1; log "FAIL gate"; }
            tail -1 "$OUT/gate_$(basename "$mdl")_$dt.txt" | tee -a "$S"
        done
        $PPN mkmodel --shape llama-1b --out /tmp/l1b --dtype bf16 > /dev/null
        log "gate batch spec llama-1b bf16 (N <= 4)"
        $PPN gate --model /tmp/l1b --backend cuda batch spec --max-stages 4 --steps 16 > "$OUT/gate_llama1b.txt" 2>&1 || { fail=1; log "FAIL gate 1b"; }
        tail -1 "$OUT/gate_llama1b.txt" | tee -a "$S"
        ;;
    bench)
        for shape in ${SHAPES:-llama-1b llama-8b}; do
            [ -d /tmp/m-$shape ] || $PPN mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
            log "bench --batch $shape"
            $PPN bench --model /tmp/m-$shape --backend cuda --batch 1,4,16,64 --prompt 128 -n 128 --reps "$REPS" --json \
                > "$OUT/batch_$shape.json" 2> "$OUT/batch_$shape.err" || { fail=1; log "FAIL bench $shape"; }
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], r) for r in d['batch']]" \
                "$OUT/batch_$shape.json" $shape | tee -a "$S"
            log "bench single-sequence device greedy $shape"
            $PPN bench --model /tmp/m-$shape --backend cuda --prompt 128 -n 128 --reps "$REPS" --device-greedy --json \
                > "$OUT/single_$shape.json" 2>&1 || { fail=1; log "FAIL single $shape"; }
            summarize "$OUT/single_$shape.json"
            log "bench --spec 7 $shape"
            $PPN bench --model /tmp/m-$shape --backend cuda --spec 7 --prompt 128 -n 64 --reps "$REPS" > "$OUT/spec_$shape.txt" 2>&1 || { fail=1; log "FAIL spec $shape"; }
            grep verify "$OUT/spec_$shape.txt" | tee -a "$S"
        done
        log "bench --batch 16 llama-8b, 4 stages on one GPU"
        [ -d /tmp/m-llama-8b ] || $PPN mkmodel --shape llama-8b --out /tmp/m-llama-8b --dtype bf16 > /dev/null
        $PPN bench --model /tmp/m-llama-8b --backend cuda --batch 16 --prompt 128 -n 128 --reps "$REPS" --stages 4 --json \
            > "$OUT/batch_8b_n4.json" 2>&1 || { fail=1; log "FAIL bench 8b N=4"; }
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print('8b N=4', r) for r in d['batch']]" "$OUT/batch_8b_n4.json" | tee -a "$S"
        ;;
    kprof)
        for spec in llama-8b:16,64 llama-1b:64; do
            shape=${spec%%:*} bs=${spec##*:}
            [ -d /tmp/m-$shape ] || $PPN mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
            log "kernel account $shape B=$bs"
            PPN_KPROF=1 PPN_GRAPHS=0 $PPN bench --model /tmp/m-$shape --backend cuda --batch "$bs" --prompt 128 -n 64 --reps 1 \
                > "$OUT/kprof_$shape.txt" 2>&1 || { fail=1; log "FAIL kprof $shape"; }
        done
        ;;
    old)
        for shape in ${SHAPES:-llama-1b llama-8b}; do
            [ -d /tmp/m-$shape ] || $PPN mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
            for k in 1 2 3; do
                for b in "${OLD:-.devcarry/ppn-old}" "$PPN"; do
                    log "decode $shape $(basename "$b") #$k"
                    "$b" bench --model /tmp/m-$shape --backend cuda --prompt 128 -n 128 --reps "$REPS" --device-greedy \
                        --json > "$OUT/old_${shape}_$(basename "$b")_$k.json" 2>&1 || { fail=1; log "FAIL"; }
                    summarize "$OUT/old_${shape}_$(basename "$b")_$k.json"
                done
            done
        done
        ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
