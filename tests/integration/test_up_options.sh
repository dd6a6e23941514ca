#!/usr/bin/env bash
# strata up passes --coordinator-arg on to the coordinator (here --http with a host name, which
# the coordinator resolves) and --set LOG_FORMAT=json to every role: the API answers on the port
# asked for, and the roles' log lines are dated JSON objects.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 5 >/dev/null 2>&1 || { bad "checkpoint"; finish; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$S" up --ckpt "$TMP/ck" --experts 1 --workers 1 --max-seqs 4 --set LOG_FORMAT=json \
  --coordinator-arg --http --coordinator-arg "localhost:$PORT" >"$TMP/up.txt" 2>&1 ||
  { bad "cluster starts"; cat "$TMP/up.txt"; finish; }
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")
check "[passthrough] the coordinator serves on --http localhost:$PORT ($code)" "[ '$code' = 200 ]"
out=$(timeout 30 "$S" generate --prompt-tokens 3,4,5 --max-tokens 4 --print-tokens 2>/dev/null)
check "[passthrough] the cluster generates ($out)" "[ \$(echo '$out' | tr ',' '\n' | grep -c '^[0-9]') -eq 4 ]"
python3 - "$STRATA_STATE" <<'PY' >"$TMP/logs.txt" 2>&1
import glob, json, re, sys
n = 0
for f in glob.glob(sys.argv[1] + "/*.log"):
    for line in open(f, encoding="utf-8", errors="strict"):
        if not line.startswith("{"):
            continue  # UCX's own lines
        o = json.loads(line)
        assert set(o) == {"time", "level", "role", "src", "msg"}, o
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", o["time"]), o["time"]
        n += 1
assert n >= 3, n
print(n, "JSON lines")
PY
check "[logs] the roles' lines are dated JSON objects ($(cat "$TMP/logs.txt" | tail -n 1))" "grep -q 'JSON lines' '$TMP/logs.txt'"
finish
