# shellcheck shell=bash
# common.sh - the part the GPU-machine scripts share (validate, perf, pipeline, multigpu, microbench); sourced
# by each, never run. Run the scripts from the repository root (the device machine's command runs there).
#
# Sets: OUT (results folder, default ./out, made here), S ($OUT/summary.txt), FIX (fixtures: $FIXTURES or
# .devcarry/fixtures), PPN (the binary: $PPN or build/ppn; exported to tools/device/hf_compare.py as
# PPN_BIN), LD_LIBRARY_PATH with build/lib first (build/lib/libcmocka.so.0, copied in for tests/gpu), fail=0.
# Functions:
#   log MSG...            "== MSG" to stdout and the summary ("== HH:MM:SS MSG" when LOG_TIME=1)
#   begin [-a] [-h] Q     the summary's head: the UTC date (-a: appended to an existing summary, else a new
#                         one), then nvidia-smi --query-gpu=Q (-h: with the CSV header line)
#   summarize JSON...     one line per configuration of each `ppn bench --json` file
#   find_ncu              the path of Nsight Compute's ncu, or nothing
#   batch_args CONFIG     ppn bench's words for a batch step: b16 (--batch 16 --prompt 128), b64 (--batch 64), mix
#                         (--batch 16 --mixed 64 --prompt 512: one serving iteration); fails on another name
#   ids16 FILE            16 prompts of 8-39 ids in [1, 32000), seeded (the same file every time), one a line, into
#                         FILE: `ppn run --ids-file`'s batch for the A/B scripts' bit checks
#   idslong FILE          two seeded prompts of 1,500 and 600 ids, one a line (the same bit checks on prompt chunks
#                         of hundreds to thousands of rows: what PPN_GEMM_W=3 takes)
#   finish                log the verdict ("overall: PASS|FAIL"), pack every file of $OUT into $OUT/all.tar.gz (a
#                         device call returns 8 files; that one sorts first) and exit with $fail
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
S="$OUT/summary.txt"
# shellcheck disable=SC2034 # read by the scripts that source this
FIX=${FIXTURES:-.devcarry/fixtures}
PPN=${PPN:-build/ppn}
export PPN_BIN=$PPN LD_LIBRARY_PATH=build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fail=0

log() {
    if [ "${LOG_TIME:-0}" = 1 ]; then echo "== $(date -u +%T) $*"; else echo "== $*"; fi | tee -a "$S"
}

begin() {
    local append=0 fmt=csv,noheader
    while [ $# -gt 1 ]; do
        case $1 in -a) append=1 ;; -h) fmt=csv ;; *) break ;; esac
        shift
    done
    if [ $append = 1 ]; then date -u +%FT%TZ >> "$S"; else date -u +%FT%TZ > "$S"; fi
    nvidia-smi --query-gpu="$1" --format="$fmt" | tee -a "$S"
}

# Nsight Compute's ncu: on PATH, else the newest under /opt/nvidia/nsight-compute; nothing when absent.
find_ncu() {
    # shellcheck disable=SC2012 # the newest installed version, by name
    command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1
}

batch_args() {
    case $1 in
    b16) echo --batch 16 --prompt 128 ;;
    b64) echo --batch 64 --prompt 128 ;;
    mix) echo --batch 16 --mixed 64 --prompt 512 ;;
    *) return 1 ;;
    esac
}

ids16() {
    python3 -c "import random; random.seed(16); [print(','.join(str(random.randrange(1, 32000)) for _ in range(random.randrange(8, 40)))) for _ in range(16)]" > "$1"
}

idslong() {
    python3 -c "import random; random.seed(1500); [print(','.join(str(random.randrange(1, 32000)) for _ in range(n))) for n in (1500, 600)]" > "$1"
}

summarize() {
    python3 - "$@" <<'PY' | tee -a "$S"
import json, os, sys
for p in sys.argv[1:]:
    f = os.path.basename(p)
    try: d = json.load(open(p))
    except Exception as e: print(f, "unreadable:", e); continue
    for c in d["configs"]:
        print("%s N=%d median %.3f ms p99 %.3f ms %.1f tok/s floor %.3f ms ratio %.3f allocs %d peak %.2f GB" % (
            f, c["stages"], c["median_ms"], c["p99_ms"], c["tok_s"], d["floor_ms"],
            c["floor_ratio"], c["driver_allocs_timed"], c["pool_peak"] / 1e9))
PY
}

finish() {
    log "overall: $([ "$fail" = 0 ] && echo PASS || echo FAIL)"
    # A device call brings back at most 8 files of $OUT: all.tar.gz (it sorts first) holds every one of them.
    local t
    if ! { t=$(mktemp /tmp/ppn-all.XXXXXX) && tar -czf "$t" -C "$OUT" --exclude=./all.tar.gz . &&
        mv "$t" "$OUT/all.tar.gz"; }; then
        log "could not pack $OUT into all.tar.gz"
    fi
    exit "$fail"
}
