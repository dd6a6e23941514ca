#!/usr/bin/env bash
# The coordinator's client front door under attack and load (issue 13): the client API key (401
# OpenAI-shaped, health open, --auth-all), numeric range checks (400, never a truncated cast),
# strict UTF-8 (no 500 and no lost stream chunk on any completion), errors before a stream's first
# byte as real statuses, the bounded queue (429 + Retry-After beyond it, waits bounded, a client
# that leaves leaves the queue), a frozen worker or one that goes quiet ends its streams with an
# error naming it, and the loop's longest stall in /metrics and /status. The roles are started by
# hand (strata up does not pass coordinator flags).
. "$(dirname "$0")/lib.sh"
SRC=$(cd "$(dirname "$0")/../.." && pwd)
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 13 >/dev/null 2>&1 || { bad "checkpoint"; finish; }
(umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/cluster.secret")
export STRATA_CLUSTER_SECRET_FILE="$TMP/cluster.secret" UCX_WARN_UNUSED_ENV_VARS=n
KEY=sk-test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  PIDS=()
}
trap 'stop_all; cleanup' EXIT
py() { python3 -c "$@"; }
waitall() { for p in "$@"; do wait "$p"; done; } # never a bare wait: the roles are children too

# start_cluster NAME SEQS "WORKER FLAGS" COORDINATOR FLAGS...: a coordinator, two expert servers and
# one attention worker (attn-0) on loopback; sets H (http), GRPC, CPID, WPID, XPID (expert-0)
start_cluster() {
  local name=$1 seqs=$2 wflags=$3
  shift 3
  stop_all
  LOG="$TMP/$name"
  mkdir -p "$LOG"
  "$BIN/strata-coordinator" --ckpt "$TMP/ck" --grpc 127.0.0.1:0 --http 127.0.0.1:0 --heartbeat-ms 200 \
    --ready-file "$LOG/coord.ready" "$@" >"$LOG/coordinator.log" 2>&1 &
  CPID=$!
  PIDS+=("$CPID")
  for _ in $(seq 200); do [ -s "$LOG/coord.ready" ] && break; sleep 0.05; done
  GRPC=$(sed -n 's/^grpc=//p' "$LOG/coord.ready" 2>/dev/null)
  H=$(sed -n 's/^http=//p' "$LOG/coord.ready" 2>/dev/null)
  [ -n "$H" ] || { cat "$LOG/coordinator.log"; return 1; }
  for i in 0 1; do
    "$BIN/strata-expert" --coordinator "$GRPC" --ckpt "$TMP/ck" --listen 127.0.0.1:0 --name "expert-$i" \
      --max-rows 16384 --slots 4 >"$LOG/expert-$i.log" 2>&1 &
    PIDS+=($!)
    [ "$i" = 0 ] && XPID=$!
  done
  # shellcheck disable=SC2086
  "$BIN/strata-attn" --coordinator "$GRPC" --ckpt "$TMP/ck" --listen 127.0.0.1:0 --name attn-0 --max-seqs "$seqs" \
    --routing topk --micro-batches 2 --min-mb-tokens 64 $wflags >"$LOG/attn-0.log" 2>&1 &
  WPID=$!
  PIDS+=("$WPID")
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$H/readyz")" = 200 ] && return 0
    sleep 0.05
  done
  tail -n 5 "$LOG"/*.log
  return 1
}
AUTH=(-H "Authorization: Bearer $KEY")
# post BODY [curl args...]: prints the HTTP status; the body lands in $TMP/body
post() { local b=$1; shift; curl -s -o "$TMP/body" -D "$TMP/hdr" -w '%{http_code}' "$@" "http://$H/v1/completions" -d "$b"; }
# settle: until /status shows attn-0, expert-0 and expert-1 alive and serving (after a freeze, a member
# that was dropped re-registers, and placement moves back) and a short request completes (the worker
# has the new map too), at most 15 s
settle() {
  for _ in $(seq 150); do
    curl -s "${AUTH[@]}" "http://$H/status" | py '
import json, sys
j = json.load(sys.stdin)
live = {m["name"] for m in j["members"] if m["alive"]}
ok = j["ready"] and j["placement"]["complete"] and {"attn-0", "expert-0", "expert-1"} <= live
ok = ok and all(m.get("experts_held", 1) > 0 for m in j["members"] if m["alive"])
sys.exit(0 if ok else 1)' 2>/dev/null &&
      [ "$(curl -s -o /dev/null -w '%{http_code}' "${AUTH[@]}" "http://$H/v1/completions" -d '{"prompt":[3],"max_tokens":2}')" = 200 ] &&
      return 0
    sleep 0.1
  done
  return 1
}
metric() { curl -s "${AUTH[@]}" "http://$H/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 { print $2 }'; }

# ---------------------------------------------------------------- 1: API key, ranges, UTF-8
STRATA_API_KEY=$KEY start_cluster c1 8 "--max-batch-tokens 256 --max-ctx 1024" || { bad "cluster 1 starts"; finish; }

st=$(post '{"prompt":"hi","max_tokens":4}')
check "[auth] no key: 401" "[ $st = 401 ]"
check "[auth] 401 carries WWW-Authenticate: Bearer" "grep -qi '^WWW-Authenticate: Bearer' $TMP/hdr"
check "[auth] 401 body is OpenAI-shaped (invalid_api_key)" "py 'import json; e=json.load(open(\"$TMP/body\"))[\"error\"]; assert e[\"code\"]==\"invalid_api_key\" and e[\"type\"]==\"invalid_request_error\" and e[\"param\"] is None and e[\"message\"]'"
st=$(post '{"prompt":"hi","max_tokens":4}' -H "Authorization: Bearer ${KEY}x")
check "[auth] wrong key: 401" "[ $st = 401 ]"
st=$(post '{"prompt":"hi","max_tokens":4}' -H "Authorization: Basic $KEY")
check "[auth] another scheme: 401" "[ $st = 401 ]"
st=$(post '{"prompt":"hi","max_tokens":4}' "${AUTH[@]}")
check "[auth] the key: 200" "[ $st = 200 ]"
check "[auth] /v1/models without the key: 401" "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/v1/models) = 401 ]"
for p in healthz readyz metrics status; do
  check "[auth] /$p open without --auth-all" "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/$p) = 200 ]"
done
env -u STRATA_API_KEY "$S" generate --coordinator "$GRPC" --prompt-tokens 1,2,3 --max-tokens 3 >/dev/null 2>"$TMP/gen.err"
check "[auth] gRPC Generate without the key is refused" "grep -qi 'API key' $TMP/gen.err"
STRATA_API_KEY=$KEY "$S" generate --coordinator "$GRPC" --prompt-tokens 1,2,3 --max-tokens 3 >/dev/null 2>"$TMP/gen.err"
check "[auth] gRPC Generate with the key (strata generate, STRATA_API_KEY)" "[ $? = 0 ]"

# every numeric field is range-checked before any cast (4294967297 was served as 1 token)
for f in '"max_tokens":4294967297' '"max_tokens":4294967296' '"max_tokens":0' '"max_tokens":1e30' '"top_k":4294967301' \
         '"temperature":1e300' '"seed":-1' '"top_p":2'; do
  st=$(post "{\"prompt\":[1,2,3],$f}" "${AUTH[@]}")
  check "[range] {$f} → 400 with a message" "[ $st = 400 ] && grep -q '\"message\":\"' $TMP/body"
done

# strict UTF-8: byte-level sampling produces every kind of ill-formed sequence; none may break a reply
codes="$TMP/utf8.codes"; : >"$codes"
cp=()
for i in $(seq 1 40); do
  ( st=$(curl -s -o "$TMP/u$i.json" -w '%{http_code}' "${AUTH[@]}" "http://$H/v1/completions" \
           -d "{\"prompt\":[$((i % 200 + 1)),7,9],\"max_tokens\":256,\"temperature\":1,\"seed\":$i,\"ignore_eos\":true}")
    echo "$st" >>"$codes" ) &
  cp+=($!)
  [ $((i % 8)) = 0 ] && { waitall "${cp[@]}"; cp=(); }
done
check "[utf8] 40 sampled 256-token completions all 200 ($(sort "$codes" | uniq -c | tr '\n' ' '))" "[ \$(grep -c '^200$' $codes) = 40 ]"
check "[utf8] every completion's text is valid JSON text" \
  "py 'import json,sys; [json.load(open(\"$TMP/u%d.json\" % i))[\"choices\"][0][\"text\"] for i in range(1,41)]'"
cp=()
for i in 1 2 3 4; do
  body="{\"prompt\":[$i,5,5],\"max_tokens\":256,\"temperature\":1,\"seed\":$((i+100)),\"ignore_eos\":true"
  curl -s "${AUTH[@]}" "http://$H/v1/completions" -d "$body}" >"$TMP/s$i.json" &
  cp+=($!)
  curl -sN "${AUTH[@]}" "http://$H/v1/completions" -d "$body,\"stream\":true}" >"$TMP/s$i.sse" &
  cp+=($!)
done
waitall "${cp[@]}"
same=0
for i in 1 2 3 4; do
  py "
import json
whole = json.load(open('$TMP/s$i.json'))['choices'][0]['text']
parts = []
for line in open('$TMP/s$i.sse', encoding='utf-8'):
    if line.startswith('data: ') and line.strip() != 'data: [DONE]':
        parts.append(json.loads(line[6:])['choices'][0]['text'])
assert ''.join(parts) == whole, (len(''.join(parts)), len(whole))
" 2>>"$TMP/stream.err" && same=$((same+1))
done
check "[utf8] a stream's events add up to the same request's whole text (4 seeds: $same)" "[ $same = 4 ]"

# an error before a stream's first byte is a status, not an event inside a 200 (here the worker
# refuses a prompt + max_tokens over its 1024-token context before any token; a prompt over its
# 256-token step budget is prefilled in pieces, not refused)
long=$(seq -s, 1 300)
st=$(post "{\"prompt\":[$long],\"max_tokens\":900,\"stream\":true}" "${AUTH[@]}")
check "[status] a stream refused before its first byte gets a status ($st), not 200 or 500" \
  "[ $st != 200 ] && [ $st != 500 ] && py 'import json; assert \"1024\" in json.load(open(\"$TMP/body\"))[\"error\"][\"message\"]'"
st=$(post "{\"prompt\":[$long],\"max_tokens\":900}" "${AUTH[@]}")
check "[status] the same without streaming: $st, not 500" "[ $st != 200 ] && [ $st != 500 ]"
st=$(post "{\"prompt\":[$long],\"max_tokens\":4}" "${AUTH[@]}")
check "[status] a prompt over the step budget is served (chunked prefill): $st" "[ $st = 200 ]"

# the loop's longest stall: freeze the coordinator for 1 s (last in this cluster: members drop)
kill -STOP "$CPID"; sleep 1; kill -CONT "$CPID"; sleep 0.1
v=$(metric strata_loop_stall_max_seconds)
check "[stall] strata_loop_stall_max_seconds saw the 1 s freeze ($v)" "py 'assert float(\"${v:-0}\") >= 0.8'"
check "[stall] /status loop.stall_max_s_last_60s too" \
  "curl -s http://$H/status | py 'import json,sys; assert json.load(sys.stdin)[\"loop\"][\"stall_max_s_last_60s\"] >= 0.8'"

# ---------------------------------------------------------------- 2: the queue
start_cluster c2 2 "" --max-queue 3 || { bad "cluster 2 starts"; finish; }
cp=()
for i in $(seq 1 9); do
  curl -s -o "$TMP/q$i.body" -D "$TMP/q$i.hdr" -w '%{http_code}\n' "http://$H/v1/completions" \
    -d "{\"prompt\":[$i,2,3],\"max_tokens\":500,\"temperature\":0,\"ignore_eos\":true}" >"$TMP/q$i.code" &
  cp+=($!)
done
seen=0
for _ in $(seq 40); do [ "$(metric strata:num_requests_waiting)" = 3 ] && { seen=1; break; }; sleep 0.05; done
check "[queue] strata:num_requests_waiting shows the 3 queued requests" "[ $seen = 1 ]"
check "[queue] /status shows them too" "curl -s http://$H/status | py 'import json,sys; q=json.load(sys.stdin)[\"queue\"]; assert q[\"waiting\"]==3 and q[\"max\"]==3, q'"
waitall "${cp[@]}"
n200=$(cat "$TMP"/q*.code | grep -c '^200$'); n429=$(cat "$TMP"/q*.code | grep -c '^429$')
check "[queue] 2 running + 3 queued are served, 4 get 429 ($n200 × 200, $n429 × 429)" "[ $n200 = 5 ] && [ $n429 = 4 ]"
ra=0; for i in $(seq 1 9); do grep -q '^429$' "$TMP/q$i.code" && grep -qi '^Retry-After: [0-9]' "$TMP/q$i.hdr" && ra=$((ra+1)); done
check "[queue] every 429 carries Retry-After" "[ $ra = $n429 ] && [ $ra -gt 0 ]"
check "[queue] the served ones completed every token" \
  "for i in \$(seq 1 9); do grep -q '^200$' $TMP/q\$i.code || continue; py 'import json,sys; assert json.load(open(sys.argv[1]))[\"usage\"][\"completion_tokens\"]==500' $TMP/q\$i.body || exit 1; done"

# a queued client that leaves leaves the queue
cp=()
for i in 1 2; do curl -s -o /dev/null "http://$H/v1/completions" -d '{"prompt":[4,4],"max_tokens":800,"ignore_eos":true}' & cp+=($!); done
sleep 0.3
curl -s -o /dev/null --max-time 0.5 "http://$H/v1/completions" -d '{"prompt":[5,5],"max_tokens":8}'
left=0
for _ in $(seq 40); do [ "$(metric strata:num_requests_waiting)" = 0 ] && { left=1; break; }; sleep 0.05; done
check "[queue] a client gone while queued leaves the queue (waiting back to 0 while both slots run)" \
  "[ $left = 1 ] && [ \$(metric strata:num_requests_running) = 2 ]"
waitall "${cp[@]}"
settle
st=$(post '{"prompt":[6,6],"max_tokens":8}')
check "[queue] and its place is not leaked: a new request is served ($st)" "[ $st = 200 ]" || { cat "$TMP/body"; echo; tail -n 8 "$LOG"/*.log; }

# ---------------------------------------------------------------- 3: waits and watchdogs bounded
echo "$KEY" >"$TMP/api.key"
start_cluster c3 1 "--expert-timeout-ms 30000" --api-key-file "$TMP/api.key" --auth-all --max-queue 4 \
  --queue-timeout-s 1 --stream-idle-timeout-s 1.5 || { bad "cluster 3 starts"; finish; }
check "[auth-all] /metrics needs the key" "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/metrics) = 401 ]"
check "[auth-all] /status needs the key" "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/status) = 401 ]"
check "[auth-all] /metrics with the key" "[ \$(curl -s -o /dev/null -w '%{http_code}' ${AUTH[*]@Q} http://$H/metrics) = 200 ]"
check "[auth-all] /healthz and /readyz stay open" \
  "[ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/healthz) = 200 ] && [ \$(curl -s -o /dev/null -w '%{http_code}' http://$H/readyz) = 200 ]"

curl -s -o /dev/null "${AUTH[@]}" "http://$H/v1/completions" -d '{"prompt":[4,4],"max_tokens":1200,"ignore_eos":true}' &
long_pid=$!
sleep 0.3
t0=$(date +%s.%N)
st=$(post '{"prompt":[5,5],"max_tokens":8}' "${AUTH[@]}")
dt=$(py "print($(date +%s.%N) - $t0)")
check "[queue] a queue wait is bounded: 503 after ~1 s ($st after ${dt} s)" \
  "[ $st = 503 ] && py 'assert 0.8 <= $dt <= 3' && grep -qi '^Retry-After' $TMP/hdr && grep -q 'within 1 s' $TMP/body"
wait "$long_pid"

# a worker that goes quiet (its expert server frozen: the step waits 30 s) is cut off after 1.5 s
curl -sN --max-time 20 "${AUTH[@]}" "http://$H/v1/completions" \
  -d '{"prompt":[7,7],"max_tokens":3000,"ignore_eos":true,"stream":true}' >"$TMP/idle.sse" &
idle_pid=$!
sleep 0.4
kill -STOP "$XPID"
t0=$(date +%s.%N); wait "$idle_pid"; rc=$?; dt=$(py "print($(date +%s.%N) - $t0)")
kill -CONT "$XPID"
check "[idle] the stream ends with an error event naming the worker within the idle timeout (rc $rc, ${dt} s)" \
  "[ $rc = 0 ] && py 'assert $dt < 6' && grep -q '\"error\"' $TMP/idle.sse && grep -q 'attn-0' $TMP/idle.sse && grep -q 'DONE' $TMP/idle.sse"
settle || bad "[idle] the frozen expert server rejoins"

# a frozen worker (no heartbeat): its clients hear about it at once, naming it
curl -sN --max-time 20 "${AUTH[@]}" "http://$H/v1/completions" \
  -d '{"prompt":[8,8],"max_tokens":3000,"ignore_eos":true,"stream":true}' >"$TMP/lost.sse" &
lost_pid=$!
sleep 0.4
kill -STOP "$WPID"
t0=$(date +%s.%N); wait "$lost_pid"; rc=$?; dt=$(py "print($(date +%s.%N) - $t0)")
check "[lost] a frozen worker's stream ends with an error naming it, not a hang (rc $rc, ${dt} s)" \
  "[ $rc = 0 ] && py 'assert $dt < 4' && grep -q 'attn-0 was lost' $TMP/lost.sse && grep -q 'DONE' $TMP/lost.sse" ||
  { tail -c 600 "$TMP/lost.sse"; echo; tail -n 8 "$LOG"/*.log; }
check "[lost] the coordinator keeps serving /status" "curl -s ${AUTH[*]@Q} http://$H/status | py 'import json,sys; json.load(sys.stdin)'"
kill -CONT "$WPID"
stop_all
finish
