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
#   san     compute-sanitizer memcheck over tests/gpu ($SAN_TESTS), racecheck per test case ($RACE_CASES: test:filter),
#           synccheck over test_gpu_batch
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
        SAN=${SAN:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
        for t in ${SAN_TESTS:-test_gpu_kernels test_gpu_batch test_gpu_rows test_gpu_stream test_gpu_pool test_gpu_numa}; do
            log "compute-sanitizer memcheck tests/gpu $t"
            # test_gpu_pool exhausts the device on purpose: its planted out-of-memory is an API error, not a fault
            api=; [ "$t" = test_gpu_pool ] && api="--report-api-errors no"
            # shellcheck disable=SC2086
            timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool memcheck $api --error-exitcode 9 $GB/gpu_$t > "$OUT/san_memcheck_$t.txt" 2>&1
            rc=$?; [ $rc = 0 ] || { fail=1; log "FAIL memcheck $t (exit $rc; 124: the timeout)"; }
            grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san_memcheck_$t.txt" | tee -a "$S"
        done
        # racecheck is slow (test_gpu_batch whole did not finish in 330 s): one run per test case, each its own limit
        for c in ${RACE_CASES:-test_gpu_batch:test_gpu_batch_llama_tiny test_gpu_batch:test_gpu_batch_greedy test_gpu_kernels:'*'}; do
            t=${c%%:*} f=${c#*:}
            log "compute-sanitizer racecheck tests/gpu $t ($f)"
            PPN_GPU_TEST_FILTER="$f" timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool racecheck --error-exitcode 9 $GB/gpu_$t \
                > "$OUT/san_racecheck_${t}_${f//[^a-z_]/}.txt" 2>&1
            rc=$?; [ $rc = 0 ] || { fail=1; log "FAIL racecheck $t $f (exit $rc; 124: the timeout)"; }
            grep -E "RACECHECK SUMMARY|ERROR SUMMARY|PASSED|FAILED" "$OUT/san_racecheck_${t}_${f//[^a-z_]/}.txt" | tee -a "$S"
        done
        log "compute-sanitizer synccheck tests/gpu test_gpu_batch"
        timeout "${SAN_TIMEOUT:-300}" "$SAN" --tool synccheck --error-exitcode 9 $GB/gpu_test_gpu_batch > "$OUT/san_synccheck_batch.txt" 2>&1
        rc=$?; [ $rc = 0 ] || { fail=1; log "FAIL synccheck (exit $rc)"; }
        grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/san_synccheck_batch.txt" | tee -a "$S"
        ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
