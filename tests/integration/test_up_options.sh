#!/usr/bin/env bash
# strata up passes --coordinator-arg on to the coordinator (here --http with a host name, which
# the coordinator resolves) and --set LOG_FORMAT=json to every role: the API answers on the port
# asked for, and the roles' log lines are dated JSON objects. Its core split (--cpu-split on: with a
# CPU per role, each role runs on its own CPUs with its kernel threads and spin set to match; off:
# every role on every CPU; a bad value is refused).
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 5 >/dev/null 2>&1 || { bad "checkpoint"; finish; }
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$S" up --ckpt "$TMP/ck" --experts 1 --workers 1 --max-seqs 4 --set LOG_FORMAT=json --cpu-split on \
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

# the roles' CPUs (python: sched_getaffinity): their data-path thread's (a server's st-data, a worker's
# st-compute), their STRATA_THREADS / STRATA_XFER_SPIN_US / STRATA_CONTROL_CPUS at start, their main
# thread's (the control threads'), the coordinator's
roles_cpus() {
  python3 - "$STRATA_STATE/cluster.env" <<'PY'
import os, sys
pids = [int(p) for l in open(sys.argv[1]) if l.startswith("pids=") for p in l[5:].split(",")]
show = lambda s: ",".join(map(str, sorted(s)))
for pid in pids[1:]:  # the coordinator first, then the expert servers and the workers
    env = dict(v.split("=", 1) for v in open(f"/proc/{pid}/environ").read().split("\0") if "=" in v)
    data = [int(t) for t in os.listdir(f"/proc/{pid}/task")
            if open(f"/proc/{pid}/task/{t}/comm").read().strip() in ("st-data", "st-compute")]
    assert len(data) == 1, data
    print(show(os.sched_getaffinity(data[0])), env.get("STRATA_THREADS", "-"), env.get("STRATA_XFER_SPIN_US", "-"),
          env.get("STRATA_CONTROL_CPUS", "-"), show(os.sched_getaffinity(pid)), show(os.sched_getaffinity(pids[0])))
PY
}
ncpu=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
all=$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')
roles_cpus >"$TMP/split.txt"
if [ "$ncpu" -ge 2 ]; then
  check "[split] each role's data path on its own CPUs, threads and spin to match, its control threads on the coordinator's ($(tr '\n' ';' <"$TMP/split.txt"); $ncpu CPUs)" \
    "python3 - '$TMP/split.txt' '${STRATA_THREADS:-}' <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
sets = [set(map(int, c.split(','))) for c, *_ in rows]
assert len(rows) == 2 and all(sets) and not sets[0] & sets[1], rows
for (c, t, spin, control, main, coord), cpus in zip(rows, sets):
    assert t == (sys.argv[2] or str(len(cpus))) and spin == '50000', rows
    # the control threads with the coordinator: its CPU list, as a list of CPUs
    want = ','.join(str(x) for a, _, b in (r.partition('-') for r in control.split(',')) for x in range(int(a), int(b or a) + 1))
    assert want == main == coord, rows
PY"
  check "[split] strata up lists the roles' CPUs" "grep -q '^  cores  *attn-0 .*expert-0 .*coordinator ' '$TMP/up.txt'"
fi
"$S" down >/dev/null 2>&1
# a cluster started on CPUs $1 with more strata up flags; its roles' CPUs into $TMP/$2.txt
up_on() {
  local cpus=$1 name=$2
  shift 2
  taskset -c "$cpus" "$S" up --ckpt "$TMP/ck" --experts 1 --workers 1 --max-seqs 4 "$@" >"$TMP/up-$name.txt" 2>&1 ||
    { bad "cluster starts on CPUs $cpus $*"; cat "$TMP/up-$name.txt"; finish; }
  roles_cpus >"$TMP/$name.txt"
}
up_on "$all" nosplit --cpu-split off
check "[split] --cpu-split off: every role on every CPU, nothing set ($(tr '\n' ';' <"$TMP/nosplit.txt"))" \
  "[ \"\$(sort -u '$TMP/nosplit.txt')\" = '$all ${STRATA_THREADS:--} ${STRATA_XFER_SPIN_US:--} ${STRATA_CONTROL_CPUS:--} $all $all' ]"
out=$(timeout 30 "$S" generate --prompt-tokens 3,4,5 --max-tokens 4 --print-tokens 2>/dev/null)
check "[split] the unsplit cluster generates ($out)" "[ \$(echo '$out' | tr ',' '\n' | grep -c '^[0-9]') -eq 4 ]"
"$S" down >/dev/null 2>&1
# auto (the default): split with a CPU per role but not two, else not (strata up's own CPUs decide)
if [ "$ncpu" -ge 2 ]; then
  up_on "$(echo "$all" | cut -d, -f1-2)" auto2
  check "[split] auto on 2 CPUs, 2 roles: split ($(tr '\n' ';' <"$TMP/auto2.txt"))" \
    "[ \$(cut -d' ' -f1 '$TMP/auto2.txt' | sort -u | wc -l) -eq 2 ] && ! grep -q , '$TMP/auto2.txt'"
  "$S" down >/dev/null 2>&1
fi
one=$(echo "$all" | cut -d, -f1)
up_on "$one" auto1
check "[split] auto on 1 CPU, 2 roles: not split ($(tr '\n' ';' <"$TMP/auto1.txt"))" \
  "[ \"\$(sort -u '$TMP/auto1.txt')\" = '$one ${STRATA_THREADS:--} ${STRATA_XFER_SPIN_US:--} ${STRATA_CONTROL_CPUS:--} $one $one' ] && ! grep -q '^  cores' '$TMP/up-auto1.txt'"
"$S" down >/dev/null 2>&1
up_on "$one" on1 --cpu-split on
check "[split] on with fewer CPUs than roles: says so, no split" \
  "grep -q 'cpu-split on: fewer CPUs than roles' '$TMP/up-on1.txt' && [ \"\$(sort -u '$TMP/on1.txt')\" = '$one ${STRATA_THREADS:--} ${STRATA_XFER_SPIN_US:--} ${STRATA_CONTROL_CPUS:--} $one $one' ]"
"$S" down >/dev/null 2>&1
"$S" up --ckpt "$TMP/ck" --cpu-split maybe >"$TMP/up3.txt" 2>&1
rc=$?
check "[split] --cpu-split maybe is refused (exit $rc: $(head -c 160 "$TMP/up3.txt"))" "[ $rc -eq 2 ] && grep -q 'cpu-split auto|on|off' '$TMP/up3.txt'"
finish
