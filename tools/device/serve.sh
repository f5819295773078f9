#!/usr/bin/env bash
# serve.sh - `ppn serve` under load on the GPU machine (docs/PERF.md, issue 17's load): a llama-8b-shaped random
# model with Llama 3's tokenizer ($TOK, default .devcarry/tok/llama3), served on loopback, driven by
# tools/serve_bench.py: 1 client, then 16 concurrent streaming clients in closed loop, 512-token prompts,
# 128-token outputs, end-of-sequence ignored. Env: SHAPE (llama-8b), CHUNK (server's --chunk, 512), REQS (64),
# CONFIGS (below).
. "$(dirname "$0")/common.sh"
TOK=${TOK:-.devcarry/tok/llama3}
SHAPE=${SHAPE:-llama-8b}
CHUNK=${CHUNK:-512}
REQS=${REQS:-64}
PORT=18080
begin -h name,driver_version,memory.total
M=/tmp/serve-$SHAPE
[ -d "$M" ] || $PPN mkmodel --shape "$SHAPE" --out "$M" --dtype bf16 --tokenizer "$TOK" > /dev/null
# CONFIGS: the servers to run one after another, each CHUNK[:sep][:rN] (sep: --separate, prompt rows and decode
# rows in two forwards an iteration; rN: --step-rows N, r0 no cut); 1 client only on the first.
CONFIGS=${CONFIGS:-$CHUNK}
first=1
for cfg in $CONFIGS; do
    IFS=: read -r chunk opt1 opt2 <<< "$cfg"
    flags=()
    for o in $opt1 $opt2; do
        case $o in sep) flags+=(--separate) ;; r*) flags+=(--step-rows "${o#r}") ;; esac
    done
    tag=c${cfg//:/-}
    log "serve $SHAPE (chunk $chunk ${flags[*]})"
    $PPN serve --model "$M" --backend cuda --port $PORT --ctx 1024 --kv-tokens 24576 --max-batch 64 --chunk "$chunk" \
        "${flags[@]}" > "$OUT/server_$tag.log" 2>&1 &
    srv=$!
    for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 1; done
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || { log "FAIL server did not come up"; fail=1; kill $srv; finish; }
    clients="16"
    [ $first = 1 ] && clients="1 16"
    first=0
    for c in $clients; do
        n=$([ "$c" = 1 ] && echo 8 || echo "$REQS")
        log "serve_bench $c client(s), $n requests"
        python3 tools/serve_bench.py --url "http://127.0.0.1:$PORT" --clients "$c" --requests "$n" --prompt-len 512 \
            --output-len 128 --vocab 128000 > "$OUT/bench_${tag}_c$c.json" || { fail=1; log "FAIL serve_bench $c"; }
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['mode'], 'out tok/s', d['output_tok_per_s'], 'ttft', d['ttft_ms'], 'itl', d['itl_ms'], 'errors', d['errors'], 'stage busy', d.get('stage_busy_fraction'))" "$OUT/bench_${tag}_c$c.json" | tee -a "$S"
    done
    curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics_$tag.txt"
    grep -E "^ppn_(mixed_steps|decode_batches|prefill_chunks)_total" "$OUT/metrics_$tag.txt" | tee -a "$S"
    kill -TERM $srv; wait $srv; log "server exit $?"
done
finish
