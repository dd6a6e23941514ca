#!/usr/bin/env bash
# Every role answers --help (usage on stdout, rc 0) and --version, and takes host names wherever it
# takes HOST:PORT: a cluster started by hand with localhost for the coordinator's --grpc/--http and
# the workers' --coordinator/--listen serves a generation.
. "$(dirname "$0")/lib.sh"
for r in strata-coordinator strata-attn strata-expert; do
  out=$("$BIN/$r" --help 2>/dev/null); rc=$?
  check "[$r] --help: usage on stdout, rc 0 (rc $rc)" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q '^usage: $r'"
  v=$("$BIN/$r" --version 2>/dev/null)
  check "[$r] --version ($v)" "echo '$v' | grep -Eq '^$r [0-9]+\.[0-9]+'"
done
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 3 >/dev/null 2>&1 || { bad "checkpoint"; finish; }
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap 'stop; cleanup' EXIT
"$BIN/strata-coordinator" --ckpt "$TMP/ck" --grpc localhost:0 --http localhost:0 --expect-workers 1 --expect-experts 1 \
  --ready-file "$TMP/ready" --insecure >"$TMP/coord.log" 2>&1 & pids+=($!)
for _ in $(seq 1 100); do [ -s "$TMP/ready" ] && break; sleep 0.1; done
GP=$(sed -n 's/^grpc=.*:\([0-9]*\)$/\1/p' "$TMP/ready"); HP=$(sed -n 's/^http=.*:\([0-9]*\)$/\1/p' "$TMP/ready")
check "[names] the coordinator listens on localhost:0 (grpc $GP, http $HP)" "[ -n '$GP' ] && [ -n '$HP' ]"
[ -n "$GP" ] || finish
"$BIN/strata-expert" --coordinator "localhost:$GP" --ckpt "$TMP/ck" --listen localhost:0 --name e0 --insecure \
  >"$TMP/expert.log" 2>&1 & pids+=($!)
"$BIN/strata-attn" --coordinator "localhost:$GP" --ckpt "$TMP/ck" --listen localhost:0 --name a0 --insecure \
  >"$TMP/attn.log" 2>&1 & pids+=($!)
for _ in $(seq 1 150); do [ "$(curl -s "http://localhost:$HP/readyz")" = ready ] && break; sleep 0.1; done
check "[names] the cluster is ready" "[ \"\$(curl -s http://localhost:$HP/readyz)\" = ready ]"
out=$(timeout 30 "$S" generate --coordinator "localhost:$GP" --prompt-tokens 1,2,3 --max-tokens 4 --print-tokens 2>/dev/null)
check "[names] a generation through --coordinator localhost:$GP ($out)" \
  "[ \$(echo '$out' | tr ',' '\n' | grep -c '^[0-9]') -eq 4 ]"
finish
