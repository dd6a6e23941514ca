#!/usr/bin/env bash
# Load and faults on loopback, bounded (issue: security and reliability):
#  1. 1,000 concurrent streaming completions against one worker (16 slots): each finishes or gets 429,
#     none is lost or 500; with a small queue the overflow is 429 with Retry-After.
#  2. 1,000 slow-client connections (partial headers, trickled bytes) while normal requests keep
#     being served; the server closes the slow ones.
#  3. kill -9 and SIGSTOP of each role in turn, then restart/continue it: the cluster serves again
#     (a restarted coordinator listens on a new port and the members find it through its ready file).
#  4. SIGTERM drains a worker: no new requests, the one in flight finishes, the worker exits.
. "$(dirname "$0")/../integration/lib.sh"
LG="python3 $(dirname "$0")/loadgen.py"
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -Hn)"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 5 >/dev/null 2>&1
KEY=test-key-$$
url() { echo "http://$(sed -n 's/^http=//p' "$STRATA_STATE/coordinator.ready")"; } # follows a restarted coordinator
served() { # one short completion succeeds within ~20 s (retried while the cluster recovers)
  for _ in $(seq 1 40); do $LG one "$(url)" "$KEY" >/dev/null 2>&1 && return 0; sleep 0.5; done
  return 1
}
pid_of() { pgrep -f -- "--ckpt $TMP/ck .*--name $1( |$)" | head -n 1; }
coord_pid() { pgrep -f -- "strata-coordinator --ckpt $TMP/ck " | head -n 1; }
# restart a process exactly as it was started: same arguments, same environment
respawn() {
  local pid=$1 log=$2
  local -a args env
  mapfile -d '' args <"/proc/$pid/cmdline"
  mapfile -d '' env <"/proc/$pid/environ"
  kill -9 "$pid" 2>/dev/null
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  env -i "${env[@]}" setsid "${args[@]}" >>"$log" 2>&1 </dev/null &
}

# ---- 1. a thousand concurrent streams
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --max-seqs 16 --api-key "$KEY" --max-queue 2000 \
  >"$TMP/up.txt" 2>&1 || { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
$LG streams "$(url)" 1000 4 "$KEY" >"$TMP/streams.json"
cat "$TMP/streams.json"
check "[1000 streams, queue 2000] every stream finishes (none lost, none 500, none 429)" \
  "python3 -c 'import json,sys; j=json.load(open(\"$TMP/streams.json\")); sys.exit(0 if j[\"ok\"]==1000 else 1)'"
curl -s "$(url)/metrics" >"$TMP/metrics.txt"
check "[1000 streams] /metrics reports the loop's longest stall" "grep -q '^strata_loop_stall_max_seconds' $TMP/metrics.txt"
"$S" down >/dev/null 2>&1
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --max-seqs 16 --api-key "$KEY" --max-queue 64 \
  >"$TMP/up.txt" 2>&1 || { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
$LG streams "$(url)" 1000 4 "$KEY" >"$TMP/streams2.json"
cat "$TMP/streams2.json"
check "[1000 streams, queue 64] each finishes or gets 429, none lost or 500, some of each" \
  "python3 -c 'import json,sys; j=json.load(open(\"$TMP/streams2.json\")); sys.exit(0 if j[\"ok\"]+j[\"429\"]==1000 and j[\"ok\"]>=80 and j[\"429\"]>0 and not j[\"other\"] and j[\"lost\"]==0 else 1)'"
check "[auth] a request without the key is 401" \
  "[ \"\$(curl -s -o /dev/null -w '%{http_code}' $(url)/v1/completions -d '{\"prompt\":\"x\",\"max_tokens\":1}')\" = 401 ]"

# ---- 2. a thousand slow clients
$LG slow "$(url)" 1000 14 "$KEY" >"$TMP/slow.json"
cat "$TMP/slow.json"
check "[1000 slow clients] normal requests keep being served" \
  "python3 -c 'import json,sys; j=json.load(open(\"$TMP/slow.json\")); sys.exit(0 if j[\"normal_ok\"]>=20 and j[\"normal_fail\"]==0 else 1)'"
check "[1000 slow clients] the server closed the stalled requests (read deadline)" \
  "python3 -c 'import json,sys; j=json.load(open(\"$TMP/slow.json\")); sys.exit(0 if j[\"closed_by_server\"]>=900 else 1)'"
check "[1000 slow clients] the control plane still accepts: a member registers afterwards (members alive)" \
  "curl -s $(url)/status | python3 -c 'import sys,json; m=json.load(sys.stdin)[\"members\"]; assert sum(1 for x in m if x[\"alive\"])==3'"
"$S" down >/dev/null 2>&1

# ---- 3. each role killed / stopped in turn, then restarted / continued
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --replicas 2 --max-seqs 8 --heartbeat-ms 200 --api-key "$KEY" \
  >"$TMP/up.txt" 2>&1 || { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
check "[faults] serving at start" served
for role in expert-0 attn-0 coordinator; do
  for how in KILL STOP; do
    if [ "$role" = coordinator ]; then p=$(coord_pid); else p=$(pid_of "$role"); fi
    [ -n "$p" ] || { bad "[$role $how] process found"; continue; }
    if [ "$how" = KILL ]; then
      respawn "$p" "$STRATA_STATE/$role.log"
    else
      kill -STOP "$p"; sleep 1.5; kill -CONT "$p"
    fi
    sleep 1
    check "[$role $how] the cluster serves again" served
  done
done
# the pids in cluster.env are stale after the respawns: stop what carries this checkpoint
pkill -9 -f -- "--ckpt $TMP/ck " 2>/dev/null; sleep 0.5

# ---- 4. SIGTERM drains a worker
"$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --max-seqs 8 --api-key "$KEY" \
  >"$TMP/up.txt" 2>&1 || { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
STRATA_API_KEY=$KEY timeout 120 "$S" generate --prompt-tokens 3,4,5 --max-tokens 600 --ignore-eos --print-tokens \
  >"$TMP/drain.out" 2>"$TMP/drain.err" &
gp=$!
sleep 1
w=$(pid_of attn-0)
kill -TERM "$w"
sleep 0.3
code=$(curl -s -m 3 -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$(url)/v1/completions" -d '{"prompt":"x","max_tokens":1}')
wait "$gp"; rc=$?
check "[drain] the request in flight finishes ($(tr ',' '\n' <"$TMP/drain.out" | wc -l) tokens)" "[ $rc -eq 0 ] && [ \$(tr ',' '\n' <$TMP/drain.out | wc -l) -eq 600 ]"
check "[drain] a new request is not taken by the draining worker (got $code: queued then 429/503, never 500)" "[ $code != 500 ] && [ $code != 200 ]"
for _ in $(seq 1 100); do kill -0 "$w" 2>/dev/null || break; sleep 0.1; done
check "[drain] the worker exits once drained" "! kill -0 $w 2>/dev/null"
"$S" down >/dev/null 2>&1
finish
