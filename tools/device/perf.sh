#!/usr/bin/env bash
# perf.sh - one device session's build-check-measure loop for the speed work (issue 5) and the graph
# arm of sched-bench (issue 6). Phases run in the order given (default: check bench1b):
#   check    tests/gpu, the fixtures against transformers (f32), the gates on the tiny and llama-1b shapes
#   bench1b  ppn bench llama-1b: N=1,2,4,8 with the defaults; N=1 with each lever switched in turn (PPN_GRAPHS=0,
#            PPN_FUSE=0, PPN_PDL=0)
#   bench8b  the same on llama-8b
#   long     decode after a 4,096-token prompt, llama-1b and llama-8b (N=1, graphs)
#   greedy   ppn_decode_greedy: ids equal to the host-sampled run (llama-1b, 1 and 4 stages), then ppn bench
#            --device-greedy on llama-1b and llama-8b (N = 1, 4)
#   greedy2  ppn bench --device-greedy: llama-8b N = 1, 2, 4, 8; decode after a 4,096-token prompt (1b, 8b)
#   sched    ppn sched-bench llama-1b, 4 stages (graph and no-graph arms), with its plot
#   kprof    the kernel account (PPN_KPROF=1 PPN_GRAPHS=0 ppn bench llama-1b and llama-8b, N=1)
#   ncu      each kernel of the graph-replayed decode step timed alone by Nsight Compute (llama-1b and llama-8b,
#            N=1, --device-greedy, 8 steps), tabled by tools/device/ncu_step.py beside the bench's own median
#            step
#   alt      A/B of experiment builds: for each build/alt/ppn-NAME (the same source with one constant changed,
#            made on the build machine: tools/device/alt_builds.sh), then build/ppn ($PPN) again, bench llama-1b
#            and llama-8b N=1, host-fed (host) and --device-greedy (dg), or the modes in ALT_MODES, after the
#            prompt lengths in ALT_PROMPTS (16; over 1024: one timed rep); ALT_ROUNDS (2) interleaved rounds so
#            drift shows
# Results go to $OUT (summary.txt, appended to, plus one file per run; all but the summary and the plots packed
# into results.tgz at the end, since the device tool returns a few files only). Expects build/ (Release, static
# deps, build/lib/libcmocka.so.0) and .devcarry/fixtures (a copy of ../shared/fixtures), made on the build
# machine. Run from the repository root. Common part: tools/device/common.sh.
LOG_TIME=1
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin -a name,driver_version,memory.total

model() { # shape -> /tmp/<shape> (written once per machine)
    [ -f "/tmp/$1/config.json" ] || timeout 200 "$PPN" mkmodel --shape "$1" --out "/tmp/$1" >/dev/null 2>&1
    echo "/tmp/$1"
}

bench() { # name shape args...
    local name=$1 shape=$2; shift 2
    local m; m=$(model "$shape")
    log "bench $name: ppn bench --model $shape $*"
    timeout 300 "$PPN" bench --model "$m" --backend cuda "$@" --json > "$OUT/bench_$name.json" 2>>"$S" || fail=1
    summarize "$OUT/bench_$name.json"
}

phases=("$@"); [ $# -gt 0 ] || phases=(check bench1b)
for phase in "${phases[@]}"; do
    case $phase in
    check)
        for t in build/gpu/gpu_test_*; do
            log "$t"; timeout 120 "$t" > "$OUT/$(basename "$t").log" 2>&1 || fail=1
            grep -E "FAILED|PASSED|ERROR" "$OUT/$(basename "$t").log" | head -n 8 | tee -a "$S"
        done
        for m in llama-tiny qwen2-tiny qwen3-tiny; do
            log "fixture $m f32"
            timeout 60 python3 tools/device/hf_compare.py fixture "$FIX/hf/$m" --dtype f32 --tol 1e-3 2>&1 | tail -n 2 | tee -a "$S" || fail=1
        done
        log "gate all, tiny shape, soak 200 runs"
        timeout 200 "$PPN" gate --model "$(model tiny)" --backend cuda --runs 200 > "$OUT/gate_tiny.txt" 2>&1 || fail=1
        grep -v "^soak #" "$OUT/gate_tiny.txt" | tail -n 6 >> "$S"; grep -c "FAIL" "$OUT/gate_tiny.txt" | sed 's/^/gate tiny FAIL lines: /' | tee -a "$S"
        grep -c "^soak #.*PASS" "$OUT/gate_tiny.txt" | sed 's/^/soak runs passed: /' | tee -a "$S"
        log "gate split+pipelined, llama-1b shape, N=2..8"
        timeout 240 "$PPN" gate --model "$(model llama-1b)" --backend cuda --max-stages 8 --steps 16 --runs 10 \
            > "$OUT/gate_1b.txt" 2>&1 || fail=1
        grep -c "PASS" "$OUT/gate_1b.txt" | sed 's/^/gate 1b PASS lines: /' | tee -a "$S"
        grep "FAIL" "$OUT/gate_1b.txt" | head -n 5 | tee -a "$S"
        ;;
    bench1b|bench8b)
        sh=llama-${phase#bench}; t=${phase#bench}
        bench "${t}_default" "$sh" --stages-sweep 1,2,4,8 -n 128 --prompt 16 --reps 3
        bench "${t}_nographs" "$sh" --graphs 0 -n 128 --prompt 16 --reps 3
        bench "${t}_nofuse" "$sh" --fuse 0 -n 128 --prompt 16 --reps 3
        PPN_PDL=0 bench "${t}_nopdl" "$sh" -n 128 --prompt 16 --reps 3
        ;;
    long)
        bench 1b_long llama-1b -n 128 --prompt 4096 --reps 2
        bench 8b_long llama-8b -n 128 --prompt 4096 --reps 1
        ;;
    greedy)
        for st in 1 4; do
            log "device greedy ids vs host greedy, llama-1b, $st stage(s), 64 tokens"
            a=$(timeout 120 "$PPN" run --model "$(model llama-1b)" --backend cuda --ids 1,2,3,4,5,6,7,8 -n 64 --stages $st --quiet 2>>"$S")
            b=$(timeout 120 "$PPN" run --model "$(model llama-1b)" --backend cuda --ids 1,2,3,4,5,6,7,8 -n 64 --stages $st --device-greedy --quiet 2>>"$S")
            if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "equal: $a" | cut -c1-120 | tee -a "$S"; else echo "DIFFERENT: host $a / device $b" | tee -a "$S"; fail=1; fi
        done
        bench 1b_device_greedy llama-1b --stages-sweep 1,4 -n 128 --prompt 16 --reps 3 --device-greedy
        bench 8b_device_greedy llama-8b --stages-sweep 1,4 -n 128 --prompt 16 --reps 3 --device-greedy
        ;;
    greedy2)
        bench 8b_device_greedy_sweep llama-8b --stages-sweep 1,2,4,8 -n 128 --prompt 16 --reps 3 --device-greedy
        bench 1b_long_device_greedy llama-1b -n 128 --prompt 4096 --reps 2 --device-greedy
        bench 8b_long_device_greedy llama-8b -n 128 --prompt 4096 --reps 1 --device-greedy
        ;;
    sched)
        log "sched-bench llama-1b, 4 stages, 128 steps"
        timeout 240 "$PPN" sched-bench --backend cuda --model "$(model llama-1b)" --stages 4 -n 128 \
            --plot "$OUT/sched.svg" > "$OUT/sched.txt" 2>&1 || fail=1
        cat "$OUT/sched.txt" >> "$S"
        ;;
    kprof)
        for sh in llama-1b llama-8b; do
            log "kernel account: PPN_KPROF=1 PPN_GRAPHS=0 ppn bench $sh N=1"
            PPN_KPROF=1 PPN_GRAPHS=0 timeout 240 "$PPN" bench --model "$(model $sh)" --backend cuda -n 64 \
                --prompt 16 --reps 2 > "$OUT/kprof_$sh.txt" 2>&1 || fail=1
            cat "$OUT/kprof_$sh.txt" >> "$S"
        done
        ;;
    ncu)
        NCU=$(find_ncu)
        [ -n "$NCU" ] || { log "ncu: not found"; fail=1; continue; }
        for sh in llama-1b llama-8b; do
            m=$(model $sh)
            timeout 120 "$PPN" bench --model "$m" --backend cuda -n 128 --prompt 16 --reps 3 --device-greedy \
                --json > "$OUT/ncu_bench_$sh.json" 2>>"$S" || fail=1
            summarize "$OUT/ncu_bench_$sh.json"
            log "ncu: $sh, N=1, --device-greedy, 8 steps, each kernel alone (--cache-control none --clock-control none)"
            timeout 400 "$NCU" --clock-control none --cache-control none --csv --page raw --print-units base \
                --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
                "$PPN" bench --model "$m" --backend cuda -n 8 --prompt 16 --reps 1 --warmup 0 --device-greedy \
                > "$OUT/ncu_$sh.csv" 2>>"$S" || fail=1
            ms=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["configs"][0]["median_ms"])' \
                "$OUT/ncu_bench_$sh.json" 2>/dev/null)
            python3 tools/device/ncu_step.py "$OUT/ncu_$sh.csv" ${ms:+"$ms"} | tee -a "$S" || fail=1
        done
        ;;
    alt)
        for rnd in $(seq 1 "${ALT_ROUNDS:-2}"); do
            for bin in build/alt/ppn-* "$PPN"; do
                [ -x "$bin" ] || continue
                n=$(basename "$bin")
                for sh in llama-1b llama-8b; do
                    for pr in ${ALT_PROMPTS:-16}; do
                        for mode in ${ALT_MODES:-host dg}; do
                            f="$OUT/alt_${n}_${sh}_p${pr}_${mode}_$rnd.json"
                            reps=3; [ "$pr" -gt 1024 ] && reps=1
                            dg=(); [ "$mode" = dg ] && dg=(--device-greedy)
                            log "alt round $rnd: $n bench $sh N=1 prompt $pr ($mode)"
                            timeout 200 "$bin" bench --model "$(model $sh)" --backend cuda -n 128 --prompt "$pr" \
                                --reps "$reps" --json "${dg[@]}" > "$f" 2>>"$S" || fail=1
                            summarize "$f"
                        done
                    done
                done
            done
        done
        ;;
    *) log "unknown phase $phase"; fail=1 ;;
    esac
done
# the device tool returns a few files only: everything but the summary goes in one archive
tar czf /tmp/ppn-results.tgz -C "$OUT" --exclude summary.txt . && mv /tmp/ppn-results.tgz "$OUT/results.tgz" &&
    (cd "$OUT" && find . -type f ! -name results.tgz ! -name summary.txt ! -name '*.svg' -delete)
finish
