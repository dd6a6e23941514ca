# Shared helpers of the integration tests: a private state folder per test, pass/fail counting,
# and cleanup that always stops the cluster.
set -u
BIN=${STRATA_BIN:?STRATA_BIN must point at build/bin}
S="$BIN/strata"
TMP=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/it.XXXXXX" 2>/dev/null || mktemp -d)
export STRATA_STATE="$TMP/state"
export UCX_TLS=${UCX_TLS:-tcp}
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; return 1; fi; } # status: whether it passed
cleanup() {
  "$S" down >/dev/null 2>&1
  if [ "$fail" -gt 0 ] && [ -d "$STRATA_STATE" ]; then
    for f in "$STRATA_STATE"/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 25 "$f"; }; done
  fi
  [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]; exit $?; }
http() { cat "$STRATA_STATE/cluster.env" | sed -n 's/^http=//p'; }
