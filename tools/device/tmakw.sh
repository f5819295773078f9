#!/usr/bin/env bash
# tmakw.sh - the middle split-K tile behind the tensor memory accelerator (gemm_tc_kwt for gemm_tc_kw16,
# gemm_swiglu_t for gemm_swiglu; PPN_TMA=2) on the GPU machine, against PPN_TMA unset (level 1: gemm_tc_kw16,
# gemm_swiglu) in one binary: the same bits are required, the speed decides whether level 2 becomes the default.
# Written 2026-12-05 in a session whose device loans stopped before it could run (docs/PERF.md). Phases (default:
# check ids bench mixed table gate; each stops the script on a hang: every command has a timeout):
#   check   test_gpu_gemm's correctness cases: gemm_tc_kwt forced must give gemm_tc_kw's bits ("kwt(=kw)"; the
#           case line FAILs otherwise); then test_gpu_gemm_swiglu under PPN_TMA=2 (gemm_swiglu_t against
#           ppn_op_gemm_x16, now gemm_tc_kwt, then swiglu rows: the same bytes, and both timed)
#   ids     16 prompts as one batch on llama-8b (24 greedy ids each; $IDS, one prompt a line, made if absent),
#           PPN_TMA 1 and 2 with PPN_FUSE 1 and 0: all four outputs the same bytes (at PPN_GEMM_W=3: the default, 4,
#           takes gemm_tc_w with the large tiles' sums where the fusion's off runs the split-K tiles)
#   bench   ppn bench --batch $BATCH on $SHAPES (default llama-8b llama-1b), PPN_TMA 1 / 2 in $ROUNDS alternating rounds
#   mixed   the serving iteration, --batch 16 --mixed 64 --prompt 512 on llama-8b, both levels, $ROUNDS rounds
#   table   test_gpu_gemm_decode's table (gemm_tc_kwt beside gemm_tc_kw16 per shape and m; % of the copy floor)
#   gate    ppn gate batch on llama-8b under PPN_TMA=2 (split against unsplit, N <= 2)
# Results: $OUT/summary.txt and one file per run.
. "$(dirname "$0")/common.sh"
PHASES=${PHASES:-check ids bench mixed table gate}
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-1,16,64}
SHAPES=${SHAPES:-llama-8b llama-1b}
GB=${GPUBIN:-build/gpu}
IDS=${IDS:-$OUT/ids16.txt}
begin -h name,driver_version,memory.total
model() { [ -d /tmp/m-"$1" ] || $PPN mkmodel --shape "$1" --out /tmp/m-"$1" --dtype bf16 > /dev/null; }
stop() { log "FAIL $*: stopping"; fail=1; finish; }
for ph in $PHASES; do
    case $ph in
    check)
        f="$OUT/gemm_correct.txt"
        PPN_GPU_TEST_FILTER=test_gpu_gemm_correct timeout 300 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 || stop "test_gpu_gemm_correct (rc $?)"
        log "gemm correct: $(grep -c 'kwt(=kw)' "$f") cases kwt(=kw), $(grep -c 'kwt(!=kw)' "$f") kwt(!=kw)"
        grep -q 'kwt(=kw)' "$f" || stop "gemm_tc_kwt did not run"
        f="$OUT/gemm_swiglu_t.txt"
        PPN_TMA=2 PPN_GPU_TEST_FILTER=test_gpu_gemm_swiglu timeout 200 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 ||
            stop "test_gpu_gemm_swiglu under PPN_TMA=2 (rc $?)"
        grep -E 'gate\|up' "$f" | tee -a "$S" ;;
    ids)
        model llama-8b
        [ -f "$IDS" ] || ids16 "$IDS"
        for a in "1 1" "2 1" "1 0" "2 0"; do
            read -r lv fu <<< "$a"
            f="$OUT/ids_tma${lv}_fuse$fu.txt"
            PPN_GEMM_W=3 PPN_TMA=$lv PPN_FUSE=$fu timeout 180 $PPN run --model /tmp/m-llama-8b --backend cuda --ctx 512 --ids-file "$IDS" \
                -n 24 > "$f" 2> "${f%.txt}.err" || stop "ids PPN_TMA=$lv PPN_FUSE=$fu"
            log "ids PPN_TMA=$lv PPN_FUSE=$fu: $(md5sum < "$f" | cut -c1-12), $(wc -l < "$f") lines"
        done
        for f in "$OUT"/ids_tma2_fuse1.txt "$OUT"/ids_tma1_fuse0.txt "$OUT"/ids_tma2_fuse0.txt; do
            cmp -s "$OUT/ids_tma1_fuse1.txt" "$f" || { fail=1; log "FAIL $(basename "$f") differs from ids_tma1_fuse1.txt"; }
        done ;;
    bench)
        for shape in $SHAPES; do model "$shape"; done
        for r in $(seq 1 "$ROUNDS"); do
            for lv in 1 2; do
                for shape in $SHAPES; do
                    j="$OUT/bench_tma${lv}_${shape}_$r.json"
                    PPN_TMA=$lv timeout 240 $PPN bench --model /tmp/m-$shape --backend cuda --batch "$BATCH" --prompt 128 -n 128 \
                        --reps 3 --json > "$j" 2> "${j%.json}.err" || stop "bench PPN_TMA=$lv $shape"
                    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], ' '.join('B%d %.4f ms' % (r['B'], r['step_ms']) for r in d['batch']))" \
                        "$j" "PPN_TMA=$lv" $shape | tee -a "$S"
                done
            done
        done ;;
    mixed)
        model llama-8b
        for r in $(seq 1 "$ROUNDS"); do
            for lv in 1 2; do
                j="$OUT/mixed_tma${lv}_$r.json"
                PPN_TMA=$lv timeout 240 $PPN bench --model /tmp/m-llama-8b --backend cuda --batch 16 --mixed 64 --prompt 512 -n 64 \
                    --reps 3 --json > "$j" 2> "${j%.json}.err" || stop "mixed PPN_TMA=$lv"
                python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('mixed 16 + 64 rows', sys.argv[2], ' '.join('%.4f ms' % r['step_ms'] for r in d['batch']))" \
                    "$j" "PPN_TMA=$lv" | tee -a "$S"
            done
        done ;;
    table)
        f="$OUT/gemm_decode.txt"
        PPN_GPU_TEST_FILTER=test_gpu_gemm_decode timeout 400 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 || stop "test_gpu_gemm_decode (rc $?)"
        grep -E 'copy floor|m=(16|32|64|128) ' "$f" | sed -E 's/ +/ /g' | tee -a "$S" ;;
    gate)
        model llama-8b
        f="$OUT/gate_batch.txt"
        PPN_TMA=2 timeout 300 $PPN gate --model /tmp/m-llama-8b --backend cuda batch --max-stages 2 --steps 8 > "$f" 2>&1 ||
            { fail=1; log "FAIL gate batch under PPN_TMA=2"; }
        tail -1 "$f" | tee -a "$S" ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
