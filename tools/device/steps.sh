#!/usr/bin/env bash
# steps.sh - where a batch step's time goes on the GPU machine, in the step as it runs (graphs, programmatic
# dependent launch) against each kernel timed alone: for the 8B at B=16 (issue 16's unmet target), the serving
# iteration (16 decode rows + 64 prompt rows, issue 17) and B=64. $CONFIGS picks among:
#   b16  ppn bench --batch 16 --prompt 128        mix  ppn bench --batch 16 --mixed 64 --prompt 512
#   b64  ppn bench --batch 64 --prompt 128
# Phases (default: bench ncu):
#   bench   each config's median step (-n 64 --reps 3, JSON; the step is the batch's step_ms)
#   ncu     each config under Nsight Compute (--clock-control none --cache-control none, the kernels' durations
#           only), tabled by tools/device/ncu_rows.py beside the bench's median: what each kernel costs a step,
#           and the step minus the kernels' sum (what the boundaries between launches cost)
#   detail  $DETAIL ("kernel-regex:config:skip" items): one launch each under ncu's SpeedOfLight, Occupancy,
#           LaunchStats, WarpStateStats, SchedulerStats, MemoryWorkloadAnalysis sections
# Results: $OUT/summary.txt and one file per run. $SHAPE (default llama-8b) is made with ppn mkmodel --dtype bf16.
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-bench ncu}
CONFIGS=${CONFIGS:-b16 mix}
SHAPE=${SHAPE:-llama-8b}
DETAIL=${DETAIL:-gemm_tc_kx:mix:200 attn_batch_tc:b16:100}
M=/tmp/m-$SHAPE
begin -h name,driver_version,memory.total,clocks.max.sm
[ -d "$M" ] || $PPN mkmodel --shape "$SHAPE" --out "$M" --dtype bf16 > /dev/null || { fail=1; finish; }
NCU=$(find_ncu)
for ph in $PHASES; do
    for c in $CONFIGS; do
        a=$(batch_args "$c") || { log "unknown config $c"; fail=1; continue; }
        case $ph in
        bench)
            # shellcheck disable=SC2086 # the config's words
            timeout 240 "$PPN" bench --model "$M" --backend cuda $a -n 64 --reps 3 --json > "$OUT/bench_$c.json" \
                2>> "$S" || { fail=1; log "FAIL bench $c"; continue; }
            python3 -c 'import json,sys; b=json.load(open(sys.argv[1]))["batch"][0]; print("%s: step %.3f ms (p99 %.3f), %.1f tok/s" % (sys.argv[2], b["step_ms"], b["p99_ms"], b["agg_tok_s"]))' \
                "$OUT/bench_$c.json" "$c" | tee -a "$S" ;;
        ncu)
            [ -n "$NCU" ] || { log "ncu: not found"; fail=1; break; }
            f="$OUT/ncu_$c.csv"
            # shellcheck disable=SC2086
            timeout 400 "$NCU" --clock-control none --cache-control none --csv --page raw --print-units base \
                --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
                "$PPN" bench --model "$M" --backend cuda $a -n 6 --reps 1 --warmup 0 > "$f" 2>> "$S" ||
                { fail=1; log "FAIL ncu $c"; continue; }
            ms=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["batch"][0]["step_ms"])' \
                "$OUT/bench_$c.json" 2> /dev/null)
            log "ncu: $SHAPE $a, each kernel alone, against the bench's median step ${ms:-(not run)} ms"
            python3 tools/device/ncu_rows.py "$f" "${ms:-}" | tee -a "$S" || fail=1
            gzip -f "$f" ;;
        detail) ;;
        *) log "unknown phase $ph"; fail=1 ;;
        esac
    done
    [ "$ph" = detail ] || continue
    [ -n "$NCU" ] || { log "ncu: not found"; fail=1; continue; }
    for d in $DETAIL; do
        IFS=: read -r k c skip <<< "$d"
        a=$(batch_args "$c") || { log "unknown config $c"; fail=1; continue; }
        f="$OUT/detail_$(echo "$k" | tr -c "[:alnum:]_\n" _)_${c}_$skip.txt"
        # shellcheck disable=SC2086
        PPN_GRAPHS=0 timeout 300 "$NCU" --kernel-name "regex:$k" --launch-skip "${skip:-100}" --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis \
            "$PPN" bench --model "$M" --backend cuda $a -n 16 --reps 1 --warmup 0 > "$f" 2>&1 ||
            { fail=1; log "FAIL detail $k $c"; continue; }
        log "detail: $k in $c, launch $skip"
        grep -E "^ +(Duration|DRAM Throughput|Memory Throughput|Grid Size|Block Size|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Eligible Warps Per Scheduler|Active Warps Per Scheduler|Warp Cycles Per Issued Instruction|Waves Per SM|Dynamic Shared Memory Per Block) " \
            "$f" | sed "s|^ *|  |" | tee -a "$S"
    done
done
finish
