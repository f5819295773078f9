#!/usr/bin/env bash
# kx.sh - the middle split-K tile with the operands swapped (gemm_tc_kx for gemm_tc_kw16, gemm_swiglu_x for
# gemm_swiglu; PPN_GEMM_KX=N: from N tokens on) on the GPU machine, against PPN_GEMM_KX=0 in one binary: the same bits
# are required, the speed decides whether it becomes the default. $ARMS: the PPN_GEMM_KX values the timed phases
# alternate (default "0 1"). Phases (default: check ids table bench mixed serve gate; every
# command has a timeout, and a failed check stops the script):
#   check   test_gpu_gemm's correctness cases: gemm_tc_kx forced must give gemm_tc_kw's bits at every K split
#           ("kx(=kw)"; the case line FAILs otherwise); then test_gpu_gemm_swiglu under PPN_GEMM_KX=1 and 0 (the fused
#           kernel against gemm_tc_kw16 forced + swiglu rows: the same bytes, and both timed)
#   ids     16 prompts as one batch on llama-8b (24 greedy ids each; $IDS, made if absent), PPN_GEMM_KX 0 and
#           $IDS_ON (default 1) with PPN_FUSE 1 and 0: all four outputs the same bytes; then two long prompts (1,500
#           and 600 ids, common.sh's idslong; 16 greedy ids each, --ctx 2048) under 0 and $IDS_ON: the same bytes
#   table   test_gpu_gemm_decode's table (gemm_tc_kx beside the other tiles per shape and m; % of the copy floor)
#   bench   ppn bench --batch $BATCH on $SHAPES, the $ARMS in $ROUNDS alternating rounds
#   mixed   the serving iteration on llama-8b: --batch 16 --mixed P --prompt 512 for P in $MIXED (64 48), the arms,
#           $ROUNDS
#   prompt  prompt speed on llama-8b: a 2,048-token prompt in chunks of each of $CHUNKS (512 2048), the arms, $ROUNDS
#   serve   tools/device/serve.sh (issue 17's load) under each of the $ARMS
#   gate    ppn gate batch on llama-8b under PPN_GEMM_KX=1 (split against unsplit, N <= 2)
# DOOR=PPN_GEMM_W runs the same phases on gemm_tc_w's door instead (ARMS default "0 2 1"; check: gemm_tc_w forced
# must give gemm_tc_l's bits, "w(=l)", on every correctness case; gate under PPN_GEMM_W=1; ids: only level 3 keeps
# level 0's bits, IDS_ON=3). Under another DOOR the ids phase runs at PPN_GEMM_W=3: the default, 4, takes gemm_tc_w
# (the large tiles' sums) where the fusion's off runs the split-K tiles, so fused and unfused would not compare.
# Results: $OUT/summary.txt and one file per run.
. "$(dirname "$0")/common.sh"
DOOR=${DOOR:-PPN_GEMM_KX}
PHASES=${PHASES:-check ids table bench mixed serve gate}
ROUNDS=${ROUNDS:-2}
BATCH=${BATCH:-16,64}
SHAPES=${SHAPES:-llama-8b llama-1b}
GB=${GPUBIN:-build/gpu}
IDS=${IDS:-$OUT/ids16.txt}
if [ "$DOOR" = PPN_GEMM_W ]; then ARMS=${ARMS:-0 2 1}; else ARMS=${ARMS:-0 1}; fi
MIXED=${MIXED:-64 48}
IDS_ON=${IDS_ON:-1}
WPIN=$([ "$DOOR" = PPN_GEMM_W ] || echo PPN_GEMM_W=3) # the ids phase's gemm_tc_w level (above)
CHUNKS=${CHUNKS:-512 2048}
begin -h name,driver_version,memory.total
model() { [ -d /tmp/m-"$1" ] || $PPN mkmodel --shape "$1" --out /tmp/m-"$1" --dtype bf16 > /dev/null; }
stop() { log "FAIL $*: stopping"; fail=1; finish; }
for ph in $PHASES; do
    case $ph in
    check)
        f="$OUT/gemm_correct.txt"
        PPN_GPU_TEST_FILTER=test_gpu_gemm_correct timeout 400 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 || stop "test_gpu_gemm_correct (rc $?)"
        if [ "$DOOR" = PPN_GEMM_W ]; then
            log "gemm correct: $(grep -c ' w(=l)' "$f") cases w(=l), $(grep -c ' w(!=l)' "$f") w(!=l)"
            grep -q ' w(=l)' "$f" || stop "gemm_tc_w did not run"
            continue
        fi
        log "gemm correct: $(grep -c 'kx(=kw)' "$f") cases kx(=kw), $(grep -c 'kx(!=kw)' "$f") kx(!=kw)"
        grep -q 'kx(=kw)' "$f" || stop "gemm_tc_kx did not run"
        for kx in 1 0; do
            f="$OUT/gemm_swiglu_kx$kx.txt"
            PPN_GEMM_KX=$kx PPN_GPU_TEST_FILTER=test_gpu_gemm_swiglu timeout 200 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 ||
                stop "test_gpu_gemm_swiglu under PPN_GEMM_KX=$kx (rc $?)"
            log "swiglu PPN_GEMM_KX=$kx: $(grep -c 'the bytes of' "$f") cases the bytes of gemm_tc_kw16 + swiglu_rows"
            grep -E 'per layer|us \(' "$f" | sed -E 's/ +/ /g' | tee -a "$S"
        done ;;
    ids)
        model llama-8b
        [ -f "$IDS" ] || ids16 "$IDS"
        for a in "0 1" "$IDS_ON 1" "0 0" "$IDS_ON 0"; do
            read -r kx fu <<< "$a"
            f="$OUT/ids_kx${kx}_fuse$fu.txt"
            env $WPIN "$DOOR=$kx" PPN_FUSE=$fu timeout 180 $PPN run --model /tmp/m-llama-8b --backend cuda --ctx 512 --ids-file "$IDS" \
                -n 24 > "$f" 2> "${f%.txt}.err" || stop "ids $DOOR=$kx PPN_FUSE=$fu"
            log "ids $DOOR=$kx PPN_FUSE=$fu: $(md5sum < "$f" | cut -c1-12), $(wc -l < "$f") lines"
        done
        for f in "$OUT/ids_kx${IDS_ON}_fuse1.txt" "$OUT"/ids_kx0_fuse0.txt "$OUT/ids_kx${IDS_ON}_fuse0.txt"; do
            cmp -s "$OUT/ids_kx0_fuse1.txt" "$f" || { fail=1; log "FAIL $(basename "$f") differs from ids_kx0_fuse1.txt"; }
        done
        idslong "$OUT/idslong.txt"
        for kx in 0 "$IDS_ON"; do
            f="$OUT/idslong_kx$kx.txt"
            env $WPIN "$DOOR=$kx" timeout 180 $PPN run --model /tmp/m-llama-8b --backend cuda --ctx 2048 --ids-file "$OUT/idslong.txt" \
                -n 16 > "$f" 2> "${f%.txt}.err" || stop "long ids $DOOR=$kx"
            log "long ids $DOOR=$kx: $(md5sum < "$f" | cut -c1-12), $(wc -l < "$f") lines"
        done
        cmp -s "$OUT/idslong_kx0.txt" "$OUT/idslong_kx$IDS_ON.txt" || { fail=1; log "FAIL idslong_kx$IDS_ON.txt differs from idslong_kx0.txt"; } ;;
    table)
        f="$OUT/gemm_decode.txt"
        PPN_GPU_TEST_FILTER=test_gpu_gemm_decode timeout 500 "$GB"/gpu_test_gpu_gemm > "$f" 2>&1 || stop "test_gpu_gemm_decode (rc $?)"
        grep -E 'copy floor|m=(16|64|80|128) ' "$f" | grep -E 'copy floor|8b' | sed -E 's/ +/ /g' | tee -a "$S" ;;
    bench)
        for shape in $SHAPES; do model "$shape"; done
        for r in $(seq 1 "$ROUNDS"); do
            for kx in $ARMS; do
                for shape in $SHAPES; do
                    j="$OUT/bench_kx${kx}_${shape}_$r.json"
                    env "$DOOR=$kx" timeout 240 $PPN bench --model /tmp/m-$shape --backend cuda --batch "$BATCH" --prompt 128 \
                        -n 64 --reps 2 --json > "$j" 2> "${j%.json}.err" || stop "bench $DOOR=$kx $shape"
                    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], ' '.join('B%d %.4f ms' % (r['B'], r['step_ms']) for r in d['batch']))" \
                        "$j" "$DOOR=$kx" $shape | tee -a "$S"
                done
            done
        done ;;
    mixed)
        model llama-8b
        for r in $(seq 1 "$ROUNDS"); do
            for kx in $ARMS; do
                for p in $MIXED; do
                    j="$OUT/mixed${p}_kx${kx}_$r.json"
                    env "$DOOR=$kx" timeout 240 $PPN bench --model /tmp/m-llama-8b --backend cuda --batch 16 --mixed $p --prompt 512 \
                        -n 64 --reps 2 --json > "$j" 2> "${j%.json}.err" || stop "mixed $p $DOOR=$kx"
                    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('mixed 16 +', sys.argv[3], 'rows', sys.argv[2], ' '.join('%.4f ms' % r['step_ms'] for r in d['batch']))" \
                        "$j" "$DOOR=$kx" $p | tee -a "$S"
                done
            done
        done ;;
    prompt)
        model llama-8b
        for r in $(seq 1 "$ROUNDS"); do
            for kx in $ARMS; do
                for c in $CHUNKS; do
                    f="$OUT/prompt_c${c}_kx${kx}_$r.txt"
                    env "$DOOR=$kx" timeout 240 $PPN bench --model /tmp/m-llama-8b --backend cuda --prompt 2048 --chunk "$c" \
                        -n 16 --reps 3 > "$f" 2>&1 || stop "prompt chunk $c $DOOR=$kx"
                    grep -E "^ +[0-9]+ |prompt" "$f" | sed "s|^|chunk $c $DOOR=$kx |" | tee -a "$S"
                done
            done
        done ;;
    serve)
        for kx in $ARMS; do
            log "serve $DOOR=$kx"
            env "$DOOR=$kx" OUT="$OUT/serve_kx$kx" CONFIGS="${SERVE_CONFIGS:-512}" timeout 400 bash tools/device/serve.sh > "$OUT/serve_kx$kx.txt" 2>&1 ||
                { fail=1; log "FAIL serve $DOOR=$kx"; }
            grep -E 'tok/s|TTFT|ITL|busy' "$OUT/serve_kx$kx.txt" | tee -a "$S"
        done ;;
    gate)
        model llama-8b
        f="$OUT/gate_batch.txt"
        env "$DOOR=1" timeout 300 $PPN gate --model /tmp/m-llama-8b --backend cuda batch --max-stages 2 --steps 8 > "$f" 2>&1 ||
            { fail=1; log "FAIL gate batch under $DOOR=1"; }
        tail -1 "$f" | tee -a "$S" ;;
    *) log "unknown phase $ph"; fail=1 ;;
    esac
done
finish
