#!/usr/bin/env bash
# device_microbench.sh - transport-bench, sched-bench (with plots) and the kernel-by-kernel account
# (PPN_KPROF=1 ppn bench) on the GPU machine. Results go to $OUT. Expects build/ made elsewhere.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
S="$OUT/summary.txt"
log() { echo "== $*" | tee -a "$S"; }
date -u +%FT%TZ > "$S"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
fail=0
log "transport-bench (cuda, 4K..64M, 200 iterations)"
timeout 150 build/ppn transport-bench --backend cuda --sizes 4K..64M --iters 200 --plot "$OUT/transport.svg" \
    > "$OUT/transport.txt" 2>&1 || fail=1
cat "$OUT/transport.txt" >> "$S"
timeout 150 build/ppn transport-bench --backend cuda --sizes 16K --iters 200 --json > "$OUT/transport_16k.json" 2>>"$S" || fail=1
log "sched-bench (cuda, llama-1b shape, 4 stages, 128 steps)"
timeout 200 build/ppn sched-bench --backend cuda --shape llama-1b --stages 4 -n 128 --plot "$OUT/sched.svg" \
    > "$OUT/sched.txt" 2>&1 || fail=1
cat "$OUT/sched.txt" >> "$S"
log "kernel account: PPN_KPROF=1 ppn bench llama-1b, N=1 and N=4 (profiling adds an event pair per launch; graphs off)"
PPN_KPROF=1 PPN_GRAPHS=0 timeout 200 build/ppn bench --shape llama-1b --backend cuda --stages-sweep 1,4 -n 64 --prompt 16 \
    --reps 2 > "$OUT/kprof_1b.txt" 2>&1 || fail=1
cat "$OUT/kprof_1b.txt" >> "$S"
log "overall: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
