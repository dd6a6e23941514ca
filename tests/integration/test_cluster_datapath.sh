#!/usr/bin/env bash
# The same-host data path (common/xfer channels, docs/architecture.md "Data path"): on one host every
# worker-server pair moves its dispatches through shared memory (both sides say so) and requests
# complete; a server killed with -9 fails the requests it holds within a second, naming it, though the
# expert timeout is 20 s, and its channel is unmapped and freed once the map is republished, after
# which new requests complete; a killed worker's channels are closed by the servers.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 21 >/dev/null 2>&1
pid_of() { pgrep -f -- "--ckpt $TMP/ck .*--name $1( |$)" | head -n 1; }
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --max-seqs 8 --expert-timeout-ms 20000 --heartbeat-ms 200 \
   >"$TMP/up.txt" 2>&1 || { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
L=$STRATA_STATE
"$S" generate --prompt-tokens 1,2,3,4 --max-tokens 12 --print-tokens >"$TMP/a.out" 2>"$TMP/a.err"; rc=$?
check "a request completes" "[ $rc -eq 0 ] && [ -s $TMP/a.out ]"
# the second server may join the map after the first request ran: give the hellos up to 10 s
both_shm() { [ "$(grep -c 'dispatches go through shared memory' "$L/attn-0.log")" -eq 2 ] &&
  grep -q 'gets a shared-memory channel' "$L/expert-0.log" && grep -q 'gets a shared-memory channel' "$L/expert-1.log"; }
for _ in $(seq 100); do both_shm && break; sleep 0.1; done
check "the worker put both servers on shared memory" \
  "[ \$(grep -c 'dispatches go through shared memory' $L/attn-0.log) -eq 2 ]"
check "each server made a channel for the worker" \
  "grep -q 'gets a shared-memory channel' $L/expert-0.log && grep -q 'gets a shared-memory channel' $L/expert-1.log"
pids=()
for i in 0 1 2 3; do
  timeout 120 "$S" generate --prompt-tokens "$((i+1)),5,6" --max-tokens 2000 --print-tokens >"$TMP/k$i.out" 2>"$TMP/k$i.err" &
  pids+=($!)
done
sleep 1.0
t0=$(date +%s.%N)
kill -9 "$(pid_of expert-1)"
failed=0; named=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  if [ $rc -ne 0 ]; then failed=$((failed+1)); grep -q "expert-1" "$TMP/k$i.err" && named=$((named+1)); fi
done
t1=$(date +%s.%N)
check "requests on the killed server fail, each naming it ($failed failed, $named named)" "[ $failed -ge 1 ] && [ $named -eq $failed ]"
check "they fail fast, not at the 20 s expert timeout ($(python3 -c "print(f'{$t1 - $t0:.2f}')") s)" \
  "python3 -c 'import sys; sys.exit(0 if $t1 - $t0 < 10 else 1)'"
# two heartbeat periods: the coordinator drops the member and republishes the map (a loaded machine
# may take longer: up to 10 s)
for _ in $(seq 20); do
  sleep 0.5
  "$S" generate --prompt-tokens 7,8,9 --max-tokens 8 --print-tokens >"$TMP/b.out" 2>"$TMP/b.err"; rc=$?
  [ $rc -eq 0 ] && break
done
check "a new request completes after the map is republished" "[ $rc -eq 0 ]"
check "the dead server's channel was unmapped and freed" "grep -q 'channel of expert server expert-1 freed' $L/attn-0.log"
kill -9 "$(pid_of attn-0)"
sleep 1.0
check "the surviving server closed the dead worker's channel" "grep -q 'same-host link to a worker closed' $L/expert-0.log"
finish
