#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (release and ASan+UBSan), runs ctest on both,
# then every libFuzzer harness for a bounded time (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
echo "== release build"
BUILD_DIR=build bash scripts/build.sh
(cd build && ctest --output-on-failure -j2 --timeout 900)
echo "== sanitizer build (ASan + UBSan)"
BUILD_DIR=build-asan bash scripts/build.sh -DSTRATA_SANITIZE=ON -DSTRATA_WITH_CUDA=OFF
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
(cd build-asan && ctest --output-on-failure -j2 --timeout 1800 -LE slow)
echo "== fuzzing (libFuzzer, ASan + UBSan; STRATA_FUZZ_SECONDS per harness, two at a time)"
bash scripts/fuzz.sh "${STRATA_FUZZ_SECONDS:-45}"
