#!/usr/bin/env bash
# Logits through the cluster equal the one-process engine's bit for bit (CPU backend, top-k): with
# 1 and 3 expert servers and 1 and 2 attention workers, for requests of different lengths arriving
# at different times; sampled tokens for a seed equal `strata run`'s. Also: OpenAI HTTP completions (plain and SSE), /v1/models, /status, /metrics.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 5 >/dev/null 2>&1
prompts=("5,6,7" "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40" "300" "99,98,97,96,95,94,93,92,91,90,89,88,87,86,85,84,83,82,81"
         "$(python3 -c 'print(",".join(str(i * 7 % 500) for i in range(600)))')")
# the last prompt (600 tokens) is longer than a step's budget (--max-batch-tokens 256): the workers
# prefill it in pieces over several steps (chunked prefill)
for i in "${!prompts[@]}"; do
  "$S" run --ckpt "$TMP/ck" --prompt-tokens "${prompts[$i]}" --max-tokens 40 --dump-logits "$TMP/ref$i.npy" >/dev/null 2>&1
done
cmp_rows() { # cluster rows == reference rows from the last prompt position on, bit for bit
  python3 "$(dirname "$0")/../npytool.py" same "$1" "$2" $(($3 - 1))
}
# the second configuration also splits every step into up to 3 ping-pong micro-batches, and its
# workers reach the expert servers over UCX as across hosts (XFER_SHM=0), not through same-host channels
for cfg in "1 1 1 1" "3 2 3 0"; do
  set -- $cfg
  if ! "$S" up --set XFER_SHM="$4" --set LOG=debug --ckpt "$TMP/ck" --experts "$1" --workers "$2" --max-seqs 8 \
       --max-batch-tokens 256 --micro-batches "$3" --min-mb-tokens 1 >"$TMP/up.txt" 2>&1; then
    bad "cluster with $1 expert servers and $2 workers starts"; cat "$TMP/up.txt"; continue
  fi
  ok "cluster with $1 expert servers and $2 workers starts"
  pids=()
  for i in "${!prompts[@]}"; do
    "$S" generate --prompt-tokens "${prompts[$i]}" --max-tokens 40 --dump-logits "$TMP/got$i.npy" --print-tokens >"$TMP/gen$i.txt" 2>&1 &
    pids+=($!)
    sleep 0.0$((i * 3))
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    n=$(echo "${prompts[$i]}" | tr ',' '\n' | wc -l)
    check "[$1 experts, $2 workers] request $i (prompt $n) completes" "[ $rc -eq 0 ]"
    if [ "$n" -le 256 ]; then
      check "[$1 experts, $2 workers] request $i logits == one-process engine, bit for bit" "cmp_rows $TMP/ref$i.npy $TMP/got$i.npy $n"
    else # prefilled in pieces: the sums round differently (1e-5), the tokens are the same
      check "[$1 experts, $2 workers] request $i (chunked prefill) logits within 1e-3 of the one-process engine, same tokens" \
        "python3 $(dirname "$0")/../npytool.py close $TMP/ref$i.npy $TMP/got$i.npy $((n - 1)) 1e-3"
    fi
  done
  # sampling is the engine's in both: for a seed, strata run and the server pick the same tokens
  samp="--prompt-tokens 5,6,7 --max-tokens 16 --temperature 0.9 --top-k 40 --top-p 0.95 --seed 7 --print-tokens --ignore-eos"
  a=$("$S" run --ckpt "$TMP/ck" $samp 2>/dev/null)
  b=$("$S" generate $samp 2>/dev/null)
  check "[$1 experts, $2 workers] sampled with a seed: strata run and the server give the same tokens ($a)" \
    "[ -n \"$a\" ] && [ \"$a\" = \"$b\" ]"
  check "[$1 experts, $2 workers] strata up's --set reached every worker (configuration logged)" \
    "[ \$(grep -lE 'STRATA_XFER_SHM +$4 +env' $STRATA_STATE/attn-*.log | wc -l) -eq $2 ]"
  if [ "$4" = 0 ]; then
    check "[$1 experts, $2 workers] dispatches went over UCX only (no same-host channel)" \
      "! grep -q 'dispatches go through shared memory' $STRATA_STATE/attn-*.log && ! grep -q 'shared-memory channel' $STRATA_STATE/expert-*.log"
  else
    check "[$1 experts, $2 workers] dispatches went through the same-host channel" \
      "grep -q 'dispatches go through shared memory' $STRATA_STATE/attn-*.log"
  fi
  if [ "$1" = 3 ]; then
    check "[3 experts, 2 workers] steps ran as ping-pong micro-batches" "grep -q ' [23] micro-batches' $STRATA_STATE/attn-*.log"
    h=$(http)
    r=$(curl -s -X POST "http://$h/v1/completions" -d '{"prompt":"Hello","max_tokens":5,"temperature":0}')
    check "HTTP /v1/completions returns a text_completion with usage" \
      "echo '$r' | python3 -c 'import sys,json; j=json.load(sys.stdin); assert j[\"object\"]==\"text_completion\" and j[\"usage\"][\"completion_tokens\"]>=1 and j[\"usage\"][\"prompt_tokens\"]==5'"
    curl -sN -X POST "http://$h/v1/completions" -d '{"prompt":"Hi","max_tokens":4,"stream":true,"temperature":0}' >"$TMP/sse.txt"
    check "HTTP stream: SSE data events then [DONE]" "grep -c '^data: {' $TMP/sse.txt | grep -qv '^0$' && tail -n 2 $TMP/sse.txt | grep -q '^data: \[DONE\]'"
    code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -X POST "http://$h/v1/completions" -d '{"prompt":')
    check "HTTP malformed JSON: 400 with an error object" "[ $code = 400 ] && grep -q invalid_request_error $TMP/e.json"
    code=$(curl -s -o "$TMP/e.json" -w '%{http_code}' -X POST "http://$h/v1/completions" -d '{"prompt":[1,99999],"max_tokens":2}')
    check "HTTP out-of-vocabulary token: 400 naming the vocabulary" "[ $code = 400 ] && grep -q vocabulary $TMP/e.json"
    check "GET /v1/models lists the model" "curl -s http://$h/v1/models | grep -q '\"object\":\"list\"'"
    check "GET /healthz" "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$h/healthz) = 200 ]"
    check "GET /status shows 3 live expert servers and 2 workers" \
      "curl -s http://$h/status | python3 -c 'import sys,json; j=json.load(sys.stdin); m=j[\"members\"]; assert sum(1 for x in m if x[\"alive\"] and x[\"role\"]==\"expert\")==3 and sum(1 for x in m if x[\"alive\"] and x[\"role\"]==\"attention\")==2 and j[\"placement\"][\"complete\"]'"
    check "GET /status splits the workers' steps: own layers, plan, dispatch, wait, unpack, launch, other add up to the step" \
      "curl -s http://$h/status | python3 -c 'import sys,json; s=json.load(sys.stdin)[\"step_ms\"]; parts=[s[k] for k in (\"attention\",\"dispatch\",\"wait\",\"combine\",\"thresholds\",\"launch\",\"plan\",\"unpack\",\"other\")]; assert s[\"steps\"]>0 and min(parts)>=0 and s[\"attention\"]>0 and s[\"plan\"]>0 and s[\"dispatch\"]>0 and s[\"wait\"]>0 and abs(sum(parts)-s[\"step\"])<=1e-6*s[\"step\"]+1e-9, s'"
    check "GET /metrics has counters and TTFT histogram" "curl -s http://$h/metrics | grep -q 'strata:time_to_first_token_seconds_bucket' && curl -s http://$h/metrics | grep -q '^strata:generation_tokens_total{model_name=\"ck\"} [1-9]'"
    check "strata status prints the summary" "\"$S\" status | grep -q READY"
  fi
  "$S" down >/dev/null 2>&1
  check "strata down stops every process" "! pgrep -f \"$TMP/ck\" >/dev/null"
done
finish
