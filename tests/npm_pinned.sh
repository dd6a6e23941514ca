#!/usr/bin/env bash
# Installs npm packages used as test oracles into DIR/node_modules, pinned and integrity-checked by
# DIR/package-lock.json (npm ci). Usage: tests/npm_pinned.sh DIR PACKAGE... (the packages whose
# installed versions must match the lock). Idempotent; node and npm come from scripts/deps.sh.
# Exit 3: the registry cannot be reached from this machine (no route, DNS, or TLS interception by a
# proxy whose CA this machine does not trust); any other npm failure is an error (1).
set -euo pipefail
cd "$1"
shift
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "npm_pinned: node and npm are needed (bash scripts/deps.sh installs Debian's nodejs and npm)" >&2
  exit 1
fi
installed() {
  node -e '
    const lock = require("./package-lock.json").packages;
    for (const p of process.argv.slice(1).map((n) => "node_modules/" + n))
      if (require("./" + p + "/package.json").version !== lock[p].version) process.exit(1);' "$@" 2>/dev/null
}
installed "$@" && exit 0
# NOTE: the release and sanitizer test runs may both get here; one installs, the other waits
exec 9>node_modules.lock
flock 9
installed "$@" && exit 0
log=$(mktemp)
if ! npm ci --no-audit --no-fund --loglevel=error 2>"$log"; then
  cat "$log" >&2
  if grep -qE "SELF_SIGNED_CERT|UNABLE_TO_GET_ISSUER|UNABLE_TO_VERIFY_LEAF|CERT_|ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH" "$log"; then
    rm -f "$log"
    exit 3
  fi
  rm -f "$log"
  exit 1
fi
rm -f "$log"
installed "$@"
