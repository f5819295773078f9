#!/usr/bin/env bash
# ab.sh - A/B of ppn builds on the batched decode bench (docs/PERF.md): each binary in $BINS (default
# .devcarry/ab/ppn-*) runs `ppn bench --batch $BATCH` on the llama-8b and llama-1b shapes (bf16), in $ROUNDS
# alternating rounds, and a kernel account (PPN_KPROF=1, graphs off) on the 8B at each B of $KPROF_B (a comma
# list, default 16; its attention, norm, rotary and SwiGLU lines go to the summary).
# Results: $OUT/summary.txt, one JSON per run.
. "$(dirname "$0")/common.sh"
BINS=$(echo ${BINS:-.devcarry/ab/ppn-*})
BATCH=${BATCH:-16,64}
ROUNDS=${ROUNDS:-2}
begin -h name,driver_version,memory.total
first=${BINS%% *}
for shape in llama-8b llama-1b; do
    [ -d /tmp/m-$shape ] || $first mkmodel --shape $shape --out /tmp/m-$shape --dtype bf16 > /dev/null
done
for r in $(seq 1 "$ROUNDS"); do
    for b in $BINS; do
        for shape in llama-8b llama-1b; do
            j="$OUT/$(basename "$b")_${shape}_$r.json"
            "$b" bench --model /tmp/m-$shape --backend cuda --batch "$BATCH" --prompt 128 -n 128 --reps 3 --json > "$j" 2>&1 ||
                { fail=1; log "FAIL $b $shape"; }
            python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(sys.argv[2], sys.argv[3], 'B', r['B'], 'step_ms', r['step_ms'], 'agg_tok_s', r['agg_tok_s']) for r in d['batch']]" \
                "$j" "$(basename "$b")" $shape | tee -a "$S"
        done
    done
done
if [ -n "${PREFILL:-}" ]; then # prompt speed, 8B, 4,096-token prompt at 2048-row chunks, each binary twice
    for r in 1 2; do
        for b in $BINS; do
            j="$OUT/prefill_$(basename "$b")_$r.txt"
            "$b" bench --model /tmp/m-llama-8b --backend cuda --prompt 4096 --chunk 2048 -n 16 --reps 3 > "$j" 2>&1 ||
                { fail=1; log "FAIL prefill $b"; }
            grep -E "^ +[0-9]+ |prompt" "$j" | sed "s|^|$(basename "$b") |" | tee -a "$S"
        done
    done
fi
for kb in $(echo "${KPROF_B:-16}" | tr , ' '); do
    for b in $BINS; do
        k="$OUT/kprof_$(basename "$b")_B$kb.txt"
        PPN_KPROF=1 PPN_GRAPHS=0 "$b" bench --model /tmp/m-llama-8b --backend cuda --batch "$kb" --prompt 128 -n 64 \
            --reps 1 > "$k" 2>&1 || { fail=1; log "FAIL kprof $b B=$kb"; }
        grep -E "rmsnorm_rows|swiglu_rows|rope_kv_batch|attn_batch" "$k" | sed "s|^|$(basename "$b") |" | tee -a "$S"
    done
done
finish
