#!/usr/bin/env bash
# One whole GPU run on the device machine: the gpu-labelled tests through ctest, then every
# bench/gpu program, full logs under results/gpu-<stamp>/ and a summary table at the end.
# Usage (repo root, build made elsewhere for sm_90 and carried): scripts/gpu-run.sh [build-dir]
# Env: ST_BENCH="bench_gpu_kda ..." limits the benchmarks; ST_SKIP_TESTS=1 skips ctest;
# ST_TESTS=regex limits the gpu tests (ctest -R); ST_SKIP_PEERS=1 skips bench/gpu/peers.py;
# ST_K3MINI=1 also runs the slow gpu tests (test_gpu_engine_k3mini: SPEC §8 on k3-mini, ~7 GB).
# The build dir may be a slim copy (CMakeCache.txt, CTestTestfile.cmake files, tests/test_gpu_*,
# bin/bench_gpu_*) to stay under the device machine's 64 MiB transfer limit; see docs/perf.md.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
RES=results/gpu-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RES"
export LD_LIBRARY_PATH=$PWD/devlibs/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi >"$RES/nvidia-smi.txt" 2>&1
# ctest records absolute paths of the machine that configured the build: make them resolve here.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$PWD" ] && [ ! -e "$src" ]; then
    mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"
fi
mkdir -p "$BUILD/test-tmp" # ctest points STRATA_TEST_TMP here (made at configure time, absent in a slim copy)
if [ -z "${ST_SKIP_TESTS:-}" ]; then
    slow="-LE slow"; [ -n "${ST_K3MINI:-}" ] && slow=""
    (cd "$BUILD" && ctest -L gpu $slow ${ST_TESTS:+-R "$ST_TESTS"} -V --timeout 600) >"$RES/ctest.log" 2>&1
    echo "ctest rc=$?" >>"$RES/ctest.log"
fi
for b in ${ST_BENCH:-$(cd "$BUILD/bin" && ls bench_gpu_* 2>/dev/null)}; do
    echo "== $b" >&2
    timeout 400 "$BUILD/bin/$b" >"$RES/$b.log" 2>&1
    echo "rc=$?" >>"$RES/$b.log"
done
if [ -f bench/gpu/peers.py ] && [ -z "${ST_SKIP_PEERS:-}" ]; then
    PYTHONUNBUFFERED=1 python3 bench/gpu/peers.py >"$RES/peers.log" 2>&1
fi
{
    echo "## GPU run $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    echo
    echo "| test | result |"
    echo "|---|---|"
    [ -f "$RES/ctest.log" ] && grep -E "^ *[0-9]+/[0-9]+ Test +#" "$RES/ctest.log" | sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: ([^ ]+) \.+ *([^0-9]*)([0-9.]+ sec)?/| \1 | \2 \3 |/'
    [ -f "$RES/ctest.log" ] && grep -hE "passed, [0-9]+ failed|tests passed" "$RES/ctest.log" | sed 's/^/    /'
    echo
    echo "| figure |"
    echo "|---|"
    grep -h "^RESULT" "$RES"/*.log | sed -E 's/^RESULT (.*)/| \1 |/'
} | tee "$RES/summary.md"
echo "logs: $RES"
