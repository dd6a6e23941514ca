#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, ASan + UBSan) into build-fuzz/ (or $FUZZ_BUILD_DIR)
# and runs each for SECONDS (default 60) on a copy of its seed corpus fuzz/corpus/<name>/, two at a
# time ($FUZZ_JOBS); logs and artifacts go to $FUZZ_RUN_DIR (default build-fuzz/fuzz-run). Fails if any
# harness crashes, leaks, times out or breaks an invariant, and prints where the input was written.
# Usage: scripts/fuzz.sh [SECONDS] [fuzz_NAME...]   (docs/fuzzing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
[ $# -gt 0 ] && shift
bdir=${FUZZ_BUILD_DIR:-build-fuzz}
jobs=${FUZZ_JOBS:-2}

echo "== fuzz build ($bdir)"
cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DSTRATA_FUZZ=ON \
  -DSTRATA_WITH_CUDA=OFF >/dev/null
cmake --build "$bdir" --target fuzz_all -j"$(nproc)"

if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  harnesses=()
  for src in fuzz/fuzz_*.c; do harnesses+=("$(basename "$src" .c)"); done
fi
run=${FUZZ_RUN_DIR:-$bdir/fuzz-run}
rm -rf "$run"
mkdir -p "$run"
# NOTE: detect_leaks: a leak is a failure too. abort_on_error + handle_abort make libFuzzer write the
# input that tripped a sanitizer. -close_fd_mask=2 silences the product's own error log lines (every
# rejected input logs one); libFuzzer and the sanitizers keep reporting on a duplicate of stderr.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:handle_abort=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export STRATA_LOG=error

run_one() { # name: runs one harness, writes $run/<name>/{log,rc}
  local exe=$1 name=${1#fuzz_} dir="$run/$1"
  mkdir -p "$dir/corpus"
  if [ -d "fuzz/corpus/$name" ]; then cp -r "fuzz/corpus/$name/." "$dir/corpus/"; fi
  local dict=()
  [ -f "fuzz/dict/$name.dict" ] && dict=(-dict="fuzz/dict/$name.dict")
  local rc=0
  "$bdir/fuzz/$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -close_fd_mask=2 -artifact_prefix="$dir/" "${dict[@]}" "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
  echo "$rc" >"$dir/rc"
}

pids=()
for h in "${harnesses[@]}"; do
  if [ ! -x "$bdir/fuzz/$h" ]; then
    echo "fuzz: no harness $bdir/fuzz/$h" >&2
    mkdir -p "$run/$h" && echo 127 >"$run/$h/rc" && echo "not built" >"$run/$h/log"
    continue
  fi
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  echo "fuzz: $h for ${secs}s"
  run_one "$h" &
done
wait || true

pass=0 fail=0
for h in "${harnesses[@]}"; do
  dir="$run/$h"
  rc=$(cat "$dir/rc" 2>/dev/null || echo 1)
  stats=$(grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' "$dir/log" 2>/dev/null |
    sed 's/stat:://' | tr '\n' ' ')
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$dir/log" 2>/dev/null | tail -1)
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    echo "ok   $h: $stats$cov"
  else
    fail=$((fail + 1))
    echo "FAIL $h (exit $rc): $stats$cov"
    tail -n 40 "$dir/log" | sed 's/^/    /'
    crash=$(ls "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-* 2>/dev/null | head -1 || true)
    [ -n "$crash" ] && echo "    crashing input: $crash (replay: $bdir/fuzz/$h $crash)"
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
