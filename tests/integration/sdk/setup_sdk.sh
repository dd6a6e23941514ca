#!/usr/bin/env bash
# Installs the official OpenAI Node SDK (npm `openai`) into tests/integration/sdk/node_modules, pinned
# and integrity-checked by package-lock.json, for test_openai_api. Same contract as
# tests/tokenizer/setup_oracle.sh: exit 3 when the npm registry cannot be reached.
# Idempotent; node and npm come from scripts/deps.sh.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_sdk: node and npm are needed (bash scripts/deps.sh installs Debian's nodejs and npm)" >&2
  exit 1
fi
installed() {
  node -e '
    const lock = require("./package-lock.json").packages;
    for (const p of ["node_modules/openai"])
      if (require("./" + p + "/package.json").version !== lock[p].version) process.exit(1);' 2>/dev/null
}
installed && exit 0
# NOTE: the release and sanitizer test runs may both get here; one installs, the other waits
exec 9>node_modules.lock
flock 9
installed && exit 0
# exit 3: the registry cannot be reached from this machine (no route, DNS, or TLS interception by a
# proxy whose CA this machine does not trust); any other npm failure is an error
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
installed
