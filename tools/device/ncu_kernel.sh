#!/usr/bin/env bash
# ncu_kernel.sh - Nsight Compute on one launch of one kernel of the batched decode, per binary: why a kernel
# takes the time the kernel account (PPN_KPROF=1) gives it (docs/PERF.md, 2026-12-02 afternoon: the batched
# attention is issue-bound). Each binary in $BINS (default build/ppn) runs `ppn bench --batch $B --prompt 128
# -n 16 --reps 1` on the llama-8b shape (or $SHAPE; bf16; graphs off, so ncu sees each launch) under `ncu
# --kernel-name regex:$KERNEL --launch-skip $SKIP --launch-count 1` with the sections below. Results:
# $OUT/ncu_<binary>.txt, and the headline metrics of each in the summary.
#   KERNEL  a regex of the kernel's name (default attn_batch)   B      the batch size (default 64)
#   SKIP    launches of it to skip first (default 300: past the prompt and the warm-up steps)
. "$(dirname "$0")/common.sh"
BINS=$(echo ${BINS:-build/ppn})
KERNEL=${KERNEL:-attn_batch} B=${B:-64} SKIP=${SKIP:-300} SHAPE=${SHAPE:-llama-8b}
NCU=$(find_ncu)
begin -h name,driver_version,memory.total
[ -n "$NCU" ] || { log "ncu: not found"; fail=1; finish; }
first=${BINS%% *}
[ -d "/tmp/m-$SHAPE" ] || $first mkmodel --shape "$SHAPE" --out "/tmp/m-$SHAPE" --dtype bf16 > /dev/null
for b in $BINS; do
    f="$OUT/ncu_$(basename "$b").txt"
    PPN_GRAPHS=0 timeout 400 "$NCU" --kernel-name "regex:$KERNEL" --launch-skip "$SKIP" --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats \
        --section MemoryWorkloadAnalysis \
        "$b" bench --model "/tmp/m-$SHAPE" --backend cuda --batch "$B" --prompt 128 -n 16 --reps 1 > "$f" 2>&1 ||
        { fail=1; log "FAIL $b"; continue; }
    log "$(basename "$b"): $KERNEL at B=$B on $SHAPE"
    grep -E "^ +(Duration|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Executed Instructions|Eligible Warps Per Scheduler|Active Warps Per Scheduler|Warp Cycles Per Issued Instruction|Registers Per Thread|Achieved Occupancy) " "$f" |
        sed "s|^ *|  |" | tee -a "$S"
done
finish
