#!/usr/bin/env bash
# Issue 16 item 3: the step never waits for the coordinator. The coordinator answers ReportScores and
# GetThresholds only after --test-reply-delay-ms (1.5 s, under the members' 2 s RPC deadline, so the
# tables do arrive, late); the attention worker (quantile routing) must decode at the same rate as with
# a prompt coordinator, routing top-k until the first thresholds arrive and then with the last table
# it has (its reports name that version while newer ones exist). A worker that waited for each reply
# would need >= 1.5 s per step (>= 0.75 s with two reports in flight).
# With a prompt coordinator the worker's table is ~2 versions old (the ReportScores reply carries
# the newest table; heartbeats alone left it 31 behind).
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 3 >/dev/null 2>&1
NTOK=160
PROMPT=$(python3 -c 'print(",".join(str(5 + (7 * i) % 400) for i in range(96)))') # a prefill of 96 tokens feeds the first thresholds
start() { # $1 = reply delay in ms: coordinator, one expert server, one worker, written as a cluster for `strata`
  mkdir -p "$STRATA_STATE"; rm -f "$STRATA_STATE/coord.ready"
  [ -f "$STRATA_STATE/cluster.secret" ] || (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$STRATA_STATE/cluster.secret"; echo >>"$STRATA_STATE/cluster.secret")
  export STRATA_CLUSTER_SECRET_FILE="$STRATA_STATE/cluster.secret"
  "$BIN/strata-coordinator" --ckpt "$TMP/ck" --grpc 127.0.0.1:0 --http 127.0.0.1:0 --routing quantile --heartbeat-ms 200 \
    --ready-file "$STRATA_STATE/coord.ready" --test-reply-delay-ms "$1" >"$STRATA_STATE/coordinator.log" 2>&1 &
  local cp=$! i
  for i in $(seq 100); do [ -f "$STRATA_STATE/coord.ready" ] && break; sleep 0.1; done
  [ -f "$STRATA_STATE/coord.ready" ] || return 1
  local grpc http; grpc=$(sed -n 's/^grpc=//p' "$STRATA_STATE/coord.ready"); http=$(sed -n 's/^http=//p' "$STRATA_STATE/coord.ready")
  "$BIN/strata-expert" --coordinator "$grpc" --ckpt "$TMP/ck" --listen 127.0.0.1:0 --name expert-0 --max-rows 4096 \
    --slots 4 >"$STRATA_STATE/expert-0.log" 2>&1 &
  local ep=$!
  "$BIN/strata-attn" --coordinator "$grpc" --ckpt "$TMP/ck" --listen 127.0.0.1:0 --name attn-0 --max-seqs 4 \
    --max-batch-tokens 256 --max-ctx 512 --routing quantile >"$STRATA_STATE/attn-0.log" 2>&1 &
  local ap=$!
  printf 'grpc=%s\nhttp=%s\nckpt=%s\npids=%s,%s,%s\n' "$grpc" "$http" "$TMP/ck" "$cp" "$ep" "$ap" >"$STRATA_STATE/cluster.env"
  for i in $(seq 300); do curl -sf "http://$http/readyz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
gen_s() { # decode NTOK tokens; prints the wall seconds
  local t0 t1
  t0=$(date +%s.%N)
  "$S" generate --prompt-tokens "$PROMPT" --max-tokens $NTOK --ignore-eos --print-tokens >"$TMP/gen.txt" 2>&1 || { cat "$TMP/gen.txt" >&2; echo 999; return; }
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')"
}
wstat() { # the worker's reported step and threshold version, the coordinator's newest version
  curl -sf "http://$(http)/status" | python3 -c '
import json, sys
s = json.load(sys.stdin)
w = [m for m in s["members"] if m["role"] == "attention" and m["alive"]]
print(w[0]["step"] if w else -1, w[0].get("threshold_version", -1) if w else -1, s["thresholds"]["version"], s["thresholds"]["set"])'
}

check "prompt coordinator: cluster ready" "start 0"
gen_s >/dev/null # warm-up
base=$(gen_s)
echo "prompt coordinator: $NTOK tokens in $base s"
# the table delay: the newest table comes with the worker's ReportScores reply, not after the next
# heartbeat (200 ms here, ~70 steps): sampled while it decodes, published minus routed-with
lags=""
"$S" generate --prompt-tokens "$PROMPT" --max-tokens 600 --ignore-eos >/dev/null 2>&1 & gp=$!
sleep 0.3
for i in $(seq 12); do
  read -r s u p st <<<"$(wstat)"
  [ "$u" -ge 1 ] 2>/dev/null && lags="$lags $((p - u))"
  sleep 0.1
done
wait $gp
echo "prompt coordinator: published minus routed-with version while decoding:$lags"
check "the worker routes with a table a few steps old (median lag <= 6 versions)" \
  "python3 -c 'import statistics, sys; l = [int(x) for x in \"$lags\".split()]; sys.exit(0 if len(l) >= 6 and statistics.median(l) <= 6 else 1)'"
"$S" down >/dev/null 2>&1

check "slow coordinator (replies 1.5 s late): cluster ready" "start 1500"
t_first=$(gen_s)
read -r step1 used1 pub1 set1 <<<"$(wstat)"
echo "slow coordinator, first $NTOK tokens: $t_first s; worker step $step1 routed with version $used1 (coordinator at $pub1)"
check "before any thresholds arrive the worker routes top-k (version 0) and keeps its pace" \
  "[ '$used1' = 0 ] && python3 -c 'import sys; sys.exit(0 if $t_first <= 1.5 * $base + 0.5 else 1)'"
# wait for the first table to reach the worker (one delayed GetThresholds), decoding meanwhile
got=0
for i in $(seq 20); do
  gen_s >/dev/null
  read -r s u p st <<<"$(wstat)"
  [ "$u" -ge 1 ] 2>/dev/null && { got=1; break; }
done
check "the delayed thresholds reach the worker" "[ $got = 1 ]"
t_last=$(gen_s)
read -r step2 used2 pub2 set2 <<<"$(wstat)"
echo "slow coordinator, with thresholds: $NTOK tokens in $t_last s; worker step $step2 routed with version $used2 (coordinator at $pub2, $set2 thresholds set)"
check "with thresholds the steps continue at full rate ($t_last s vs $base s)" \
  "python3 -c 'import sys; sys.exit(0 if $t_last <= 1.5 * $base + 0.5 else 1)'"
check "a step takes far less than one delayed reply (1.5 s)" \
  "python3 -c 'import sys; sys.exit(0 if $t_last / $NTOK < 0.1 else 1)'"
check "the worker routes with the last table it has while the coordinator is ahead (used $used2 <= published $pub2)" \
  "[ '$used2' -ge 1 ] && [ '$used2' -le '$pub2' ] && [ '$set2' -gt 0 ]"
finish
