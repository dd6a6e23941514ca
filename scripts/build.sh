#!/usr/bin/env bash
# Configures and builds Strata into build/ (or $BUILD_DIR); extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
bdir=${BUILD_DIR:-build}
cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$bdir" -j"$(nproc)"
