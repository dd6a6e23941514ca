#!/usr/bin/env bash
# The main job on the built-in tiny model: installs dependencies, builds, writes a random tiny
# checkpoint and generates from a prompt with the one-process engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
BUILD_DIR=build bash scripts/build.sh
ck=${STRATA_CKPT:-build/ckpt-tiny}
[ -f "$ck/config.json" ] || build/bin/strata ckpt init --preset tiny --out "$ck" --seed 1
build/bin/strata ckpt inspect "$ck"
build/bin/strata run --ckpt "$ck" --prompt "${1:-Hello, Strata}" --max-tokens 32 --print-tokens
