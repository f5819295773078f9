#!/usr/bin/env bash
# tune.sh - the split-K GEMM tiles' K split and ring depth on the GPU machine, and the checks that go with their
# kernels (docs/PERF.md, docs/VALIDATION.md). Phases (default: check sweep bench):
#   check   tests/gpu: test_gpu_kernels (argmax's non-finite rule among them), test_gpu_batch (the batch greedy
#           loop and deferred steps), test_gpu_gemm's correctness cases (every K split and depth forced)
#   sweep   test_gpu_gemm_sweep: gemm_tc_k / gemm_tc_kw at every K split and depth, % of the copy floor
#   decode  test_gpu_gemm_decode: the op's choice per shape and m, and the tiles forced
#   pp      prompt speed (pp512, pp4096 at 2048-row chunks) of each binary in $BINS, $ROUNDS alternating rounds
#   bench   ppn bench --batch $BATCH --device-greedy on the llama-8b (and $SHAPES) shape, bf16: the synchronous
#           step and the batch greedy loop
#   san     compute-sanitizer through san.sh: memcheck over tests/gpu ($SAN_TESTS), racecheck per test case
#           ($RACE_CASES: test:filter), synccheck over test_gpu_batch
# Results: $OUT/summary.txt and one file per run; env: PHASES, REPS (default 3), BATCH (default 1,16,64).
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-check sweep bench}
export PPN_FIXTURES=$FIX
REPS=${REPS:-3}
GB=${GPUBIN:-build/gpu}
begin -h name,driver_version,memory.total
for ph in $PHASES; do
    case $ph in
    check)
        for t in test_gpu_kernels test_gpu_batch; do
            log "tests/gpu $t"
            $GB/gpu_$t > "$OUT/$t.txt" 2>&1 || { fail=1; log "FAIL $t"; }
            grep -E '^#|PASSED|FAILED' "$OUT/$t.txt" | tee -a "$S"
        done
        log "tests/gpu test_gpu_gemm (correctness)"
        PPN_GPU_TEST_FILTER='*correct*' $GB/gpu_test_gpu_gemm > "$OUT/test_gpu_gemm_correct.txt" 2>&1 || { fail=1; log "FAIL gemm"; }
        grep -E 'FAIL|PASSED|FAILED' "$OUT/test_gpu_gemm_correct.txt" | tee -a "$S"
        ;;
    sweep | decode)
        log "tests/gpu test_gpu_gemm_$ph"
        PPN_GPU_TEST_FILTER="*_$ph" $GB/gpu_test_gpu_gemm > "$OUT/gemm_$ph.txt" 2>&1 || { fail=1; log "FAIL $ph"; }
        grep -E 'best|PASSED|FAILED' "$OUT/gemm_$ph.txt" | tee -a "$S"
        ;;
    bench)
        for shape in ${SHAPES:-llama-8b}; do
            [ -d /tmp/m-$shape ] || $PPN mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
            log "bench --batch ${BATCH:-1,16,64} --device-greedy $shape"
            $PPN bench --model /tmp/m-$shape --backend cuda --batch "${BATCH:-1,16,64}" --device-greedy --prompt 128 \
                -n 128 --reps "$REPS" --json > "$OUT/batch_$shape.json" 2> "$OUT/batch_$shape.err" || { fail=1; log "FAIL bench $shape"; }
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], r) for r in d['batch']]" \
                "$OUT/batch_$shape.json" $shape | tee -a "$S"
        done
        ;;
    pp)
        # prompt speed A/B: each binary of $BINS (default build/ppn) primes a 4,096-token prompt (and 512) on the
        # llama-8b and $PP_SHAPES shapes at 2048-row chunks, in $ROUNDS alternating rounds
        for shape in ${PP_SHAPES:-llama-8b}; do
            [ -d /tmp/m-$shape ] || $PPN mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
        done
        for r in $(seq 1 "${ROUNDS:-2}"); do
            for b in ${BINS:-$PPN}; do
                for shape in ${PP_SHAPES:-llama-8b}; do
                    j="$OUT/pp_$(basename "$b")_${shape}_$r.json"
                    "$b" bench --model /tmp/m-$shape --backend cuda --prompt 512,4096 --chunk 2048 -n 16 --reps "$REPS" \
                        --json > "$j" 2> "${j%.json}.err" || { fail=1; log "FAIL pp $b $shape"; }
                    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], sys.argv[3], 'N', c['stages'], 'pp', r['len'], 'tok/s', r['tok_s'], 'ttft_ms', r['ttft_ms'], 'decode_ms', c['median_ms']) for c in d['configs'] for r in c['prompts']]" \
                        "$j" "$(basename "$b")" $shape | tee -a "$S"
                done
            done
        done
        ;;
    san)
        # tools/device/san.sh runs them (at once, each its own limit; planted out-of-memory errors not counted),
        # into $OUT/san/: memcheck over $SAN_TESTS, racecheck per case of $RACE_CASES (test:filter; racecheck is
        # slow: test_gpu_batch whole did not finish in 330 s), synccheck over test_gpu_batch
        runs=
        set -f # '*' is a cmocka pattern here, not a file name
        for t in ${SAN_TESTS:-test_gpu_kernels test_gpu_batch test_gpu_rows test_gpu_stream test_gpu_pool test_gpu_numa}; do
            runs="$runs memcheck:$t:*"
        done
        for c in ${RACE_CASES:-test_gpu_batch:test_gpu_batch_llama_tiny test_gpu_batch:test_gpu_batch_greedy test_gpu_kernels:*}; do
            runs="$runs racecheck:$c"
        done
        set +f
        log "compute-sanitizer:$runs synccheck:test_gpu_batch:*"
        OUT="$OUT/san" GPUBIN=$GB SAN_TIMEOUT=${SAN_TIMEOUT:-300} RUNS="$runs synccheck:test_gpu_batch:*" \
            "$(dirname "$0")/san.sh" > /dev/null || fail=1
        grep -E '^(== san_|== FAIL|\[|=========)' "$OUT/san/summary.txt" | tee -a "$S" # its runs, not its head
        ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
