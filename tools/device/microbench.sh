#!/usr/bin/env bash
# microbench.sh - transport-bench, sched-bench (with plots) and the kernel-by-kernel account
# (PPN_KPROF=1 ppn bench) on the GPU machine. Results go to $OUT. Expects build/ made elsewhere. Run from the
# repository root. Common part: tools/device/common.sh.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin name,driver_version
log "transport-bench (cuda, 4K..64M, 200 iterations)"
timeout 150 "$PPN" transport-bench --backend cuda --sizes 4K..64M --iters 200 --plot "$OUT/transport.svg" \
    > "$OUT/transport.txt" 2>&1 || fail=1
cat "$OUT/transport.txt" >> "$S"
timeout 150 "$PPN" transport-bench --backend cuda --sizes 16K --iters 200 --json > "$OUT/transport_16k.json" 2>>"$S" || fail=1
log "sched-bench (cuda, llama-1b shape, 4 stages, 128 steps)"
timeout 200 "$PPN" sched-bench --backend cuda --shape llama-1b --stages 4 -n 128 --plot "$OUT/sched.svg" \
    > "$OUT/sched.txt" 2>&1 || fail=1
cat "$OUT/sched.txt" >> "$S"
log "kernel account: PPN_KPROF=1 ppn bench llama-1b, N=1 and N=4 (profiling adds an event pair per launch; graphs off)"
PPN_KPROF=1 PPN_GRAPHS=0 timeout 200 "$PPN" bench --shape llama-1b --backend cuda --stages-sweep 1,4 -n 64 --prompt 16 \
    --reps 2 > "$OUT/kprof_1b.txt" 2>&1 || fail=1
cat "$OUT/kprof_1b.txt" >> "$S"
finish
