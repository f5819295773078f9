#!/usr/bin/env bash
# multigpu.sh - the cross-device run on a 2-GPU machine (nvidia-h200-x2): topology, gates with stages on
# both GPUs (a 1,000-run pipelined soak), transports across the pair, and the 8B shape split over 2 GPUs.
# Usage (from the repository root): [PPN=path/to/ppn] tools/device/multigpu.sh ; results in $OUT.
# Common part: tools/device/common.sh.
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
begin index,name,driver_version,pci.bus_id
nvidia-smi topo -m 2>&1 | head -8 | tee -a "$S"
log "ppn topo"; timeout 60 "$PPN" topo --backend cuda 2>&1 | tee -a "$S"
timeout 60 "$PPN" mkmodel --shape tiny --out /tmp/tiny >/dev/null 2>&1
log "gate all, tiny shape, 2 GPUs: N=2..4, placements, overlap/shard seams, soak 1000 runs"
timeout 200 "$PPN" gate --model /tmp/tiny --backend cuda --runs 1000 > "$OUT/gate_x2.txt" 2>&1 || fail=1
grep -v "^soak #.*PASS" "$OUT/gate_x2.txt" | tee -a "$S"
grep -c "^soak #.*PASS" "$OUT/gate_x2.txt" | sed 's/^/soak runs passed: /' | tee -a "$S"
log "transport-bench across the pair, 4K..64M"
timeout 120 "$PPN" transport-bench --backend cuda --sizes 4K..64M --iters 100 --plot "$OUT/transport_x2.svg" \
    > "$OUT/transport_x2.txt" 2>&1 || fail=1
grep -E "^(transport|peer|host)" "$OUT/transport_x2.txt" | tee -a "$S"
timeout 120 "$PPN" mkmodel --shape llama-8b --out /tmp/l8b >/dev/null 2>&1
for cfg in "--stages 1" "--stages 2" "--stages 2 --devices 0,1" "--stages 4 --devices 0,0,1,1"; do
    log "bench llama-8b $cfg"
    # shellcheck disable=SC2086 # $cfg is several arguments
    timeout 150 "$PPN" bench --model /tmp/l8b --backend cuda $cfg -n 128 --prompt 16 --reps 3 2>&1 | grep -E "^ +[0-9]|stage map" | tee -a "$S" || fail=1
done
finish
