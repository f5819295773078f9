#!/usr/bin/env bash
# rowsab.sh - A/B of ppn builds whose row kernels (kernels/rows.cu: norms, rotary, ...) differ, on the GPU machine:
# the same bits are required, the batch step's time decides. $BINS: the binaries (the first is the base); $GPUBIN:
# the folder of the new build's tests/gpu binaries. Phases (default: check ids ab; every command has a timeout):
#   check   gpu_test_gpu_rows (the row kernels against their CPU references, rmsnorm_rows bit for bit against its
#           summation order, the rotary against decode's rope_kv and rope_kv_batch against rope_kv_rows)
#   ids     16 prompts as one batch on llama-8b (24 greedy ids each) from every binary: the same bytes
#   ab      ppn bench on llama-8b, each of $CONFIGS (common.sh's batch_args: b16 b64 mix), the binaries alternating, $ROUNDS
#           rounds: the step's median (step_ms)
# Results: $OUT/summary.txt and one file per run.
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-check ids ab}
BINS=$(echo ${BINS:-build/ppn})
GB=${GPUBIN:-build/gpu}
CONFIGS=${CONFIGS:-b16 b64 mix}
ROUNDS=${ROUNDS:-2}
M=/tmp/m-llama-8b
first=${BINS%% *}
begin -h name,driver_version,memory.total
[ -d "$M" ] || $first mkmodel --shape llama-8b --out "$M" --dtype bf16 > /dev/null || { fail=1; finish; }
for ph in $PHASES; do
    case $ph in
    check)
        f="$OUT/gpu_rows.txt"
        timeout 400 "$GB"/gpu_test_gpu_rows > "$f" 2>&1 || { fail=1; log "FAIL gpu_test_gpu_rows (rc $?)"; }
        log "gpu_test_gpu_rows: $(grep -c 'summation order' "$f") norm cases bit for bit, $(grep -c "decode's rope_kv bits" "$f") rotary cases = decode's; $(grep -E '^\[  (PASSED|FAILED) ' "$f" | tr '\n' ' ')"
        grep -E 'FAIL|differ' "$f" | head -20 | tee -a "$S" ;;
    ids)
        ids="$OUT/ids16.txt"
        ids16 "$ids"
        for b in $BINS; do
            f="$OUT/ids_$(basename "$b").txt"
            timeout 180 "$b" run --model "$M" --backend cuda --ctx 512 --ids-file "$ids" -n 24 > "$f" 2> "${f%.txt}.err" ||
                { fail=1; log "FAIL ids $b"; continue; }
            log "ids $(basename "$b"): $(md5sum < "$f" | cut -c1-12), $(wc -l < "$f") lines"
            cmp -s "$OUT/ids_$(basename "$first").txt" "$f" || { fail=1; log "FAIL $(basename "$b")'s ids differ from $(basename "$first")'s"; }
        done ;;
    ab)
        for r in $(seq 1 "$ROUNDS"); do
            for c in $CONFIGS; do
                a=$(batch_args "$c") || { log "unknown config $c"; fail=1; continue; }
                for b in $BINS; do
                    j="$OUT/bench_$(basename "$b")_${c}_$r.json"
                    # shellcheck disable=SC2086 # the config's words
                    timeout 240 "$b" bench --model "$M" --backend cuda $a -n 64 --reps 3 --json > "$j" 2>> "$S" ||
                        { fail=1; log "FAIL bench $b $c"; continue; }
                    python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["batch"][0]; print("round %s %s %s: step %.3f ms (p99 %.3f), %.1f tok/s" % (sys.argv[2], sys.argv[3], sys.argv[4], b["step_ms"], b["p99_ms"], b["agg_tok_s"]))' \
                        "$j" "$r" "$c" "$(basename "$b")" | tee -a "$S"
                done
            done
        done ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
