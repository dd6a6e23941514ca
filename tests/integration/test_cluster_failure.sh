#!/usr/bin/env bash
# Killing an expert server during generation: with --replicas 2 every request completes; with
# --replicas 1 the affected requests end with an error naming the lost server, nothing hangs, and the
# cluster serves new requests once the coordinator has republished the map; through same-host channels
# and over UCX as across hosts (XFER_SHM=0). A stopped (SIGSTOP) server over UCX: the requests that
# need it fail within the expert timeout, naming it, and the worker serves on once it is gone.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 13 >/dev/null 2>&1
expert_pid() { # pid of this cluster's expert-1 (the checkpoint path makes it unique on the machine)
  pgrep -f -- "--ckpt $TMP/ck .*--name expert-1( |$)" | head -n 1
}
settle() { # $1 = the requests' stderr prefix: waits for pids[]; sets failed, named (expert-1), hung
  failed=0; named=0; hung=0
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    [ $rc -eq 124 ] && hung=$((hung+1))
    if [ $rc -ne 0 ]; then failed=$((failed+1)); grep -q "expert-1" "$1$i.err" && named=$((named+1)); fi
  done
}
for cfg in "2 1" "1 1" "1 0"; do
  set -- $cfg
  R=$1
  tag="replicas $R, $([ "$2" = 1 ] && echo shm || echo UCX)"
  "$S" up --set XFER_SHM="$2" --ckpt "$TMP/ck" --experts 3 --workers 1 --replicas "$R" --max-seqs 8 --expert-timeout-ms 2000 \
     --heartbeat-ms 200 >"$TMP/up.txt" 2>&1 || { bad "cluster ($tag) starts"; cat "$TMP/up.txt"; continue; }
  pids=()
  for i in 0 1 2 3; do
    timeout 120 "$S" generate --prompt-tokens "$((i+1)),2,3,4,5" --max-tokens 1500 --ignore-eos --print-tokens >"$TMP/r$R-$i.out" 2>"$TMP/r$R-$i.err" &
    pids+=($!)
  done
  sleep 1.0
  kill -9 "$(expert_pid)"
  settle "$TMP/r$R-"
  check "[$tag] no request hangs" "[ $hung -eq 0 ]"
  if [ "$R" = 2 ]; then
    check "[$tag] every request completes after losing a server" "[ $failed -eq 0 ]"
  else
    check "[$tag] affected requests fail, each naming the lost server ($failed failed, $named named)" "[ $failed -ge 1 ] && [ $named -eq $failed ]"
  fi
  sleep 1.0 # two heartbeat periods: the coordinator drops the member and republishes
  "$S" generate --prompt-tokens 7,8,9 --max-tokens 8 --print-tokens >"$TMP/after$R.out" 2>"$TMP/after$R.err"; rc=$?
  check "[$tag] a new request completes after the map is republished" "[ $rc -eq 0 ]"
  check "[$tag] /status shows the server dead and the placement complete" \
    "curl -s http://$(http)/status | python3 -c 'import sys,json; j=json.load(sys.stdin); m=j[\"members\"]; assert sum(1 for x in m if x[\"role\"]==\"expert\" and not x[\"alive\"])==1 and j[\"placement\"][\"complete\"]'"
  "$S" down >/dev/null 2>&1
done
# a stopped server over UCX: alive to TCP, silent to the worker. The requests that need it then fail
# at the expert timeout naming it (bounded waits on the compute thread's loop); one whose tokens avoid
# it until the coordinator has dropped it (no heartbeats) and republished the map completes; new
# requests complete.
"$S" up --set XFER_SHM=0 --ckpt "$TMP/ck" --experts 3 --workers 1 --max-seqs 8 --expert-timeout-ms 1000 \
   --heartbeat-ms 200 >"$TMP/up.txt" 2>&1 || { bad "cluster (UCX, stopped server) starts"; cat "$TMP/up.txt"; }
pids=()
for i in 0 1; do # a failing request notes when it ended
  ( timeout 120 "$S" generate --prompt-tokens "$((i+1)),2,3" --max-tokens 1500 --ignore-eos --print-tokens >"$TMP/s$i.out" \
      2>"$TMP/s$i.err"; rc=$?; [ $rc -ne 0 ] && date +%s.%N >"$TMP/s$i.fail"; exit $rc ) &
  pids+=($!)
done
for _ in $(seq 50); do # both requests running
  curl -s "http://$(http)/status" | python3 -c 'import sys,json; m=json.load(sys.stdin)["members"]; assert sum(x["active_requests"] for x in m if x["role"]=="attention")==2' 2>/dev/null && break
  sleep 0.1
done
sp=$(expert_pid)
t0=$(date +%s.%N)
kill -STOP "$sp"
settle "$TMP/s"
secs=$(cat "$TMP"/s*.fail 2>/dev/null | python3 -c "import sys; print(f'{max([float(x) for x in sys.stdin] or [0]) - $t0:.1f}')")
check "[UCX, stopped server] the requests that need it fail within the timeout, naming it ($failed failed, $named named, the last ${secs} s after the stop)" \
  "[ $hung -eq 0 ] && [ $failed -ge 1 ] && [ $named -eq $failed ] && python3 -c 'assert $secs < 10'"
sleep 1.0
"$S" generate --prompt-tokens 7,8,9 --max-tokens 8 --print-tokens >/dev/null 2>"$TMP/after-s.err"; rc=$?
check "[UCX, stopped server] a new request completes once the coordinator dropped it" "[ $rc -eq 0 ]"
kill -CONT "$sp" 2>/dev/null
"$S" down >/dev/null 2>&1
# losing an attention worker: its request ends with an error naming it, the other worker's completes,
# and new requests go to the survivor once the coordinator has dropped the dead one
# (heartbeats every 500 ms: at 200 ms a loaded 2-core machine can starve a live worker past two periods)
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 2 --max-seqs 4 --heartbeat-ms 500 >"$TMP/up.txt" 2>&1 ||
  { bad "cluster with two workers starts"; cat "$TMP/up.txt"; finish; }
pids=()
for i in 0 1; do
  timeout 120 "$S" generate --prompt-tokens "$((i+3)),4,5" --max-tokens 3000 --ignore-eos --print-tokens >"$TMP/w$i.out" 2>"$TMP/w$i.err" &
  pids+=($!)
  sleep 0.2
done
# the kill must find one request on each worker: wait until the coordinator shows them so
for _ in $(seq 50); do
  curl -s "http://$(http)/status" | python3 -c 'import sys,json; m=json.load(sys.stdin)["members"]; assert sorted(x["active_requests"] for x in m if x["role"]=="attention" and x["alive"])==[1,1]' 2>/dev/null && break
  sleep 0.2
done
kill -9 "$(pgrep -f -- "--ckpt $TMP/ck .*--name attn-1( |$)" | head -n 1)"
failed=0; named=0
for i in 0 1; do
  wait "${pids[$i]}" || { failed=$((failed+1)); grep -q "attn-1" "$TMP/w$i.err" && named=$((named+1)); }
done
check "[worker lost] exactly one request fails, naming the lost worker ($failed failed, $named named)" "[ $failed -eq 1 ] && [ $named -eq 1 ]"
sleep 1.2 # two heartbeat periods: the coordinator drops the dead worker
"$S" generate --prompt-tokens 9,8,7 --max-tokens 8 --print-tokens >/dev/null 2>"$TMP/after-w.err"; rc=$?
check "[worker lost] new requests are served by the survivor" "[ $rc -eq 0 ]"
check "[worker lost] the coordinator keeps serving /status and shows one live worker" \
  "curl -s http://$(http)/status | python3 -c 'import sys,json; m=json.load(sys.stdin)[\"members\"]; assert sum(1 for x in m if x[\"role\"]==\"attention\" and x[\"alive\"])==1'"
"$S" down >/dev/null 2>&1
finish
