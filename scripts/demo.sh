#!/usr/bin/env bash
# The main job: installs dependencies, builds, starts a local Strata cluster on the built-in tiny
# model (coordinator, 2 expert servers, 1 attention worker on loopback), completes a prompt through
# the OpenAI-compatible HTTP API, streams one through gRPC, prints the status summary, shuts down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD_DIR=build bash scripts/build.sh
export STRATA_STATE=${STRATA_STATE:-$PWD/build/cluster}
S=build/bin/strata
$S down >/dev/null 2>&1 || true
trap '$S down >/dev/null 2>&1 || true' EXIT
$S up --preset tiny --experts 2 --workers 1
http=$(sed -n 's/^http=//p' "$STRATA_STATE/cluster.env")
prompt=${1:-Hello, Strata}
echo "== POST http://$http/v1/completions"
curl -s -X POST "http://$http/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\": \"$prompt\", \"max_tokens\": 24, \"temperature\": 0}" | python3 -m json.tool
echo "== strata generate --stream (gRPC)"
$S generate --prompt "$prompt" --max-tokens 24 --stream --print-tokens
echo "== strata status"
$S status
$S down
trap - EXIT
