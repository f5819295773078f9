#!/usr/bin/env bash
# san.sh - compute-sanitizer over tests/gpu cases, several runs at once on one GPU (each its own process and
# context), so slow tools (racecheck) fit a call's time limit. Each entry of $RUNS is TOOL:TEST:FILTER (FILTER a
# cmocka pattern for PPN_GPU_TEST_FILTER, '*' for the whole test); each run has its own limit ($SAN_TIMEOUT,
# default 420 s) and writes $OUT/san_TOOL_TEST_FILTER.txt. TOOL:gate:GATES (GATES comma-separated, e.g.
# racecheck:gate:split,prime) runs `ppn gate` over a tiny bf16 model instead, N <= 4. A run fails on a reported
# error (exit 9), a failed test or gate row, or the limit (124: named as such). Results: $OUT/summary.txt; env:
# RUNS, SAN_TIMEOUT, GPUBIN, SAN (PPN_GG_MAX_MACS passes through to test_gpu_gemm).
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
GB=${GPUBIN:-build/gpu}
export PPN_FIXTURES=$FIX # test_gpu_batch reads the fixtures' references
SAN=${SAN:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
RUNS=${RUNS:-memcheck:test_gpu_stream:* memcheck:test_gpu_numa:*}
begin -h name,driver_version,memory.total
case " $RUNS " in *:gate:*) $PPN mkmodel --shape tiny --out /tmp/san-tiny --dtype bf16 > /dev/null || fail=1 ;; esac
pids=() names=()
set -f # the filters' '*' are cmocka patterns, not file names
for r in $RUNS; do
    tool=${r%%:*} rest=${r#*:}
    t=${rest%%:*} f=${rest#*:}
    name="san_${tool}_${t}_${f//[^a-z0-9_]/}"
    # test_gpu_pool and test_gpu_stream ask for more memory than the device has on purpose: that planted
    # out-of-memory is an API error the test expects, not a fault
    api=; case $t in test_gpu_pool | test_gpu_stream) api="--report-api-errors no" ;; esac
    if [ "$t" = gate ]; then
        IFS=, read -ra gates <<< "$f"
        cmd=("$PPN" gate --model /tmp/san-tiny --backend cuda "${gates[@]}" --max-stages 4 --steps 8 --prompt 4 --runs 1)
    else
        cmd=("$GB/gpu_$t")
    fi
    # shellcheck disable=SC2086
    (PPN_GPU_TEST_FILTER="$f" timeout "${SAN_TIMEOUT:-420}" "$SAN" --tool "$tool" $api --error-exitcode 9 "${cmd[@]}" \
        > "$OUT/$name.txt" 2>&1) &
    pids+=($!) names+=("$name")
done
set +f
for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    n=${names[$i]}
    if [ $rc = 0 ]; then log "$n: ok"; else fail=1; log "FAIL $n (exit $rc; 9: an error reported, 124: the limit)"; fi
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED|ppn gate:|case\(s\) run" "$OUT/$n.txt" | tee -a "$S"
done
finish
