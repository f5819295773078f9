#!/usr/bin/env bash
# tma.sh - gemm_tc_h (the prefill's large tile behind the tensor memory accelerator) on the GPU machine: its
# checks, its speed per shape, and the prompt speed A/B against gemm_tc_l in one binary (PPN_TMA=0 gives the
# large tile without TMA: the same bits). Phases (default: check timing pp bits):
#   check   test_gpu_gemm's correctness cases: every tile forced, gemm_tc_h's rows required equal to gemm_tc_l's
#   timing  test_gpu_gemm_timing: TFLOP/s per llama-1b / 8b matrix and m, every tile forced (h among them)
#   pp      ppn bench --prompt 512,4096 --chunk 2048 on llama-8b and $PP_SHAPES, PPN_TMA unset and 0 in
#           $ROUNDS alternating rounds
#   bits    every logits row of a 600-token prompt on llama-1b (gate|up and the head take gemm_tc_h), PPN_TMA
#           unset against 0: the same bytes; then 32 greedy ids after a 2,048-token prompt on llama-8b, both ways
# Results: $OUT/summary.txt and one file per run.
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-check timing pp bits}
REPS=${REPS:-3}
GB=${GPUBIN:-build/gpu}
begin -h name,driver_version,memory.total
model() { [ -d /tmp/m-$1 ] || $PPN mkmodel --shape "$1" --out /tmp/m-"$1" --dtype bf16 > /dev/null; }
ids() { python3 -c "import random,sys; random.seed(int(sys.argv[2])); print(','.join(str(random.randrange(1, 32000)) for _ in range(int(sys.argv[1]))))" "$@"; }
pp() { # $1 label, $2 shape, rest: env assignments
    local label=$1 shape=$2 j
    shift 2
    j="$OUT/pp_${label}_${shape}_$r.json"
    timeout 240 env "$@" $PPN bench --model /tmp/m-$shape --backend cuda --prompt 512,4096 --chunk 2048 -n 16 --reps "$REPS" \
        --json > "$j" 2> "${j%.json}.err" || { fail=1; log "FAIL pp $label $shape"; }
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], sys.argv[3], 'pp', p['len'], 'tok/s', p['tok_s'], 'ttft_ms', p['ttft_ms'], 'decode_ms', c['median_ms']) for c in d['configs'] for p in c['prompts']]" \
        "$j" "$label" "$shape" | tee -a "$S"
}
for ph in $PHASES; do
    case $ph in
    check)
        log "tests/gpu test_gpu_gemm (correctness)"
        timeout 300 env PPN_GPU_TEST_FILTER='*correct*' $GB/gpu_test_gpu_gemm > "$OUT/gemm_correct.txt" 2>&1 || { fail=1; log "FAIL gemm"; }
        grep -E 'FAIL|PASSED|FAILED' "$OUT/gemm_correct.txt" | tee -a "$S"
        grep -c '(=l)' "$OUT/gemm_correct.txt" | sed 's/^/cases where gemm_tc_h gave gemm_tc_l bits: /' | tee -a "$S"
        ;;
    timing)
        log "tests/gpu test_gpu_gemm_timing"
        timeout 300 env PPN_GPU_TEST_FILTER='*timing*' $GB/gpu_test_gpu_gemm > "$OUT/gemm_timing.txt" 2>&1 || { fail=1; log "FAIL timing"; }
        grep -E '=>|PASSED|FAILED' "$OUT/gemm_timing.txt" | tee -a "$S"
        ;;
    pp)
        for shape in llama-8b ${PP_SHAPES:-}; do model $shape; done
        for r in $(seq 1 "${ROUNDS:-2}"); do
            for shape in llama-8b ${PP_SHAPES:-}; do
                pp tma $shape PPN_TMA=1
                pp notma $shape PPN_TMA=0
            done
        done
        ;;
    bits)
        model llama-1b
        model llama-8b
        p=$(ids 600 1)
        for t in 1 0; do
            PPN_TMA=$t timeout 240 $PPN run --model /tmp/m-llama-1b --backend cuda --ids "$p" -n 1 --chunk 2048 --quiet \
                --logits-out /tmp/logits_$t.f32 > "$OUT/bits_1b_$t.txt" 2>&1 || { fail=1; log "FAIL bits 1b $t"; }
        done
        if cmp -s /tmp/logits_1.f32 /tmp/logits_0.f32; then
            log "llama-1b 600-token prompt: every logits row the same bytes with and without TMA ($(stat -c %s /tmp/logits_1.f32) B)"
        else fail=1; log "FAIL llama-1b logits differ with PPN_TMA"; fi
        p=$(ids 2048 2)
        for t in 1 0; do
            PPN_TMA=$t timeout 240 $PPN run --model /tmp/m-llama-8b --backend cuda --ids "$p" -n 32 --chunk 2048 --quiet \
                > "$OUT/bits_8b_$t.txt" 2> "$OUT/bits_8b_$t.err" || { fail=1; log "FAIL bits 8b $t"; }
        done
        if cmp -s "$OUT/bits_8b_1.txt" "$OUT/bits_8b_0.txt"; then log "llama-8b 2048-token prompt: the same 32 greedy ids"
        else fail=1; log "FAIL llama-8b ids differ with PPN_TMA"; fi
        ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
