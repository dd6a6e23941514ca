#!/usr/bin/env bash
# SIGTERM drains an attention worker of a running cluster (strata up, two workers): the generation
# in flight on it completes with every token, the cluster keeps serving new requests (on the other
# worker), and the drained worker exits once done, saying so. SIGINT still stops a worker at once:
# its generation ends with an error instead of running to the end.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 21 >/dev/null 2>&1
pid_of() { pgrep -f -- "--ckpt $TMP/ck .*--name $1( |$)" | head -n 1; }
gone() { # exited (a zombie of a parent that does not reap counts as exited)
  [ ! -e "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]
}
wait_busy() { # the worker the coordinator has just given a request (polled in one process, ~10 s at most)
  python3 - "http://$(http)/status" <<'PY'
import json, sys, time, urllib.request
for _ in range(200):
    try:
        for m in json.load(urllib.request.urlopen(sys.argv[1], timeout=2))["members"]:
            if m["role"] == "attention" and m["alive"] and m["active_requests"] > 0:
                print(m["name"]); sys.exit(0)
    except Exception:
        pass
    time.sleep(0.05)
PY
}
N=1000 # ~5 s on one core (release), ~15 s under ASan: in flight for the whole check, well within the 30 s grace

"$S" up --ckpt "$TMP/ck" --experts 2 --workers 2 --max-seqs 4 --heartbeat-ms 200 >"$TMP/up.txt" 2>&1 ||
  { bad "cluster starts"; cat "$TMP/up.txt"; finish; }

# ---- SIGTERM: drain
timeout 60 "$S" generate --prompt-tokens 3,4,5 --max-tokens $N --ignore-eos --print-tokens >"$TMP/long.out" 2>"$TMP/long.err" &
gp=$!
name=$(wait_busy)
check "[drain] the long generation is running on a worker (${name:-none})" "[ -n '$name' ]"
[ -n "$name" ] || finish
w=$(pid_of "$name")
kill -TERM "$w"
check "[drain] the generation is still in flight at SIGTERM" "kill -0 $gp 2>/dev/null"
sleep 0.5 # the coordinator sees the draining worker full (its next heartbeat)
timeout 20 "$S" generate --prompt-tokens 7,8,9 --max-tokens 8 --print-tokens >"$TMP/late.out" 2>"$TMP/late.err"; late_rc=$?
check "[drain] a new request is served meanwhile (by the other worker; rc $late_rc)" \
  "[ $late_rc -eq 0 ] && [ \$(tr ',' '\n' <$TMP/late.out | grep -c .) -eq 8 ]"
wait "$gp"; rc=$?
n=$(tr ',' '\n' <"$TMP/long.out" | grep -c .)
check "[drain] the generation in flight completes on the draining worker (rc $rc, $n of $N tokens)" "[ $rc -eq 0 ] && [ $n -eq $N ]"
for _ in $(seq 1 100); do gone "$w" && break; sleep 0.1; done
check "[drain] the drained worker exits" "gone $w"
check "[drain] its log says it drained (not stopped)" "grep -q 'drained; exiting' '$STRATA_STATE/$name.log'"

# ---- SIGINT: stop at once
timeout 60 "$S" generate --prompt-tokens 4,5,6 --max-tokens $N --ignore-eos --print-tokens >"$TMP/int.out" 2>"$TMP/int.err" &
gp=$!
name2=$(wait_busy)
check "[stop] the second generation runs on the other worker (${name2:-none})" "[ -n '$name2' ] && [ '$name2' != '$name' ]"
w2=$(pid_of "${name2:-none}")
if [ -n "$w2" ]; then
  t0=$(date +%s.%N)
  kill -INT "$w2"
  for _ in $(seq 1 50); do gone "$w2" && break; sleep 0.1; done
  t1=$(date +%s.%N)
  check "[stop] SIGINT stops the worker promptly ($(python3 -c "print(round($t1-$t0,2))") s)" "gone $w2"
fi
wait "$gp"; rc=$?
check "[stop] its generation ends early with an error (rc $rc)" "[ $rc -ne 0 ] && [ $rc -ne 124 ]"
"$S" down >/dev/null 2>&1
finish
