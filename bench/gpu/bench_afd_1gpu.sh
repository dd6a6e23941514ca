#!/usr/bin/env bash
# Attention–expert disaggregation on ONE H200: the attention worker and the expert server as two
# processes on the same GPU, against the one-process engine measured in the same run.
#   one process : bench_gpu_e2e (prefill of one 8K prompt; greedy decode steps at batch 1, 32, 256)
#   two process : strata up --preset small --attn-device cuda:0 --expert-device cuda:0, the same loads,
#                 mean step from the coordinator's /status (what the worker reports per step); decode
#                 over the window where every step decodes the whole batch (see load below)
# Prints RESULT afd_1gpu_step_ratio_b1 / _b32 / _b256 / _prefill8k (two processes / one process) and
# where the worker's step goes (/status step_ms): per MoE layer (small: 11 of its 12 layers) plan, send
# (pack + post), wait (all of it; of which server compute and transfer) and unpack in µs; per step its
# own layers (the host's wait for the device), the launches and the rest, in ms. When a worker's wait
# times out it writes the roles' thread stacks to OUTDIR/stacks*.txt (cuda-gdb, where installed).
# usage (device machine, slim build carried as in scripts/gpu-run.sh): bench/gpu/bench_afd_1gpu.sh BUILD OUTDIR
# Env: MB=n (--micro-batches), GEN (decode tokens per request, default 64), MPS=1 (both processes
# under the CUDA MPS daemon: one GPU context, no time-slicing between them), E2E_LOG=FILE (reuse the
# one-process figures of an earlier bench_gpu_e2e run: diagnosis only), TAG (a label for the lines),
# LOADS (which loads, default "prefill 1 32 256").
set -u
cd "$(dirname "$0")/../.."
BUILD=${1:-build-slim}; OUT=${2:-/tmp/afd}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$BUILD/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/$BUILD/lib/ucx
B=$PWD/$BUILD/bin GEN=${GEN:-64} MOE_LAYERS=11
export STRATA_STATE=/tmp/st-afd
E2E=${E2E_LOG:-$OUT/e2e.log} TAG=${TAG:-}
if [ -z "${E2E_LOG:-}" ]; then timeout 400 $B/bench_gpu_e2e > "$E2E" 2>&1; echo "bench_gpu_e2e rc=$?"; fi
one() { sed -n "s/^RESULT e2e_small_$1 .*(step \([0-9.]*\) ms mean.*/\1/p; s/^RESULT e2e_small_$1 .*(\([0-9.]*\) ms for .*/\1/p" "$E2E" | head -1; }
mps_stop() { [ -n "${MPS:-}" ] && echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; }
if [ -n "${MPS:-}" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/afd-mps CUDA_MPS_LOG_DIRECTORY=/tmp/afd-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d || { echo "MPS=1: nvidia-cuda-mps-control -d failed"; exit 1; }
fi
trap mps_stop EXIT
rm -rf $STRATA_STATE
timeout 200 $B/strata up --preset small --experts 1 --workers 1 --attn-device cuda:0 --expert-device cuda:0 \
    --max-seqs 256 --max-batch-tokens 8192 --max-ctx 8448 ${MB:+--micro-batches $MB} > "$OUT/up$TAG.log" 2>&1 || { echo "strata up failed"; cat "$OUT/up$TAG.log"; exit 1; }
rm -f "$OUT/up$TAG.log"
http=$(sed -n 's/^http=//p' $STRATA_STATE/cluster.env)
# a stall (a worker's wait timed out): the roles' thread stacks while it lasts, into stacks$TAG.txt
stall_watch() {
  command -v cuda-gdb > /dev/null || return 0
  while sleep 0.5; do
    grep -qE "did not (signal|answer)|not released" $STRATA_STATE/attn-*.log 2>/dev/null || continue
    for p in $(pgrep -f "$B/strata-(expert|attn)"); do
      echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-160)"
      timeout 60 cuda-gdb -batch -p "$p" -ex 'set pagination off' -ex 'thread apply all bt 25' 2>&1 | grep -v '^\[New Thread'
    done > "$OUT/stacks$TAG.txt" 2>&1
    return 0
  done
}
stall_watch & watcher=$!
trap 'kill $watcher 2> /dev/null; mps_stop' EXIT
# $1 key, $2 concurrent requests, $3 prompt tokens, $4 generated tokens, $5 one-process ms (step or prefill);
# the load comes from one process (bench/load.py): 256 client processes would compete with the servers.
# /status is read before and after the load and, for a decode load of more than 2·R tokens a request,
# while it runs: the window from R tokens a request generated to R before the end, where every step
# decodes the whole batch (admission, the prompts' prefill and the last stragglers left out), which is
# what the one-process figure is (greedy decode steps at that batch); its tokens per step are printed.
load() {
  python3 - "$http" "$2" "$3" "$4" $((100 * $3)) "$OUT/load$TAG.err" "$TAG$1" "$5" "$MOE_LAYERS" <<'PY' | tee -a "$OUT/afd$TAG.txt"
import json, subprocess, sys, time, urllib.request
http, B, P, G, seed, err, key, one, L = sys.argv[1:10]
B, G, L, R = int(B), int(G), int(L), 12
KEYS = ("step", "attention", "dispatch", "wait", "network", "expert", "combine", "thresholds", "launch", "plan", "unpack", "other")
def snap():
    s = json.load(urllib.request.urlopen(f"http://{http}/status"))
    m = s["step_ms"]
    return [m["steps"], s["throughput"]["tokens_total"]] + [m.get(k, 0) * m["steps"] for k in KEYS]
b = snap()
with open(err, "a") as ef:
    p = subprocess.Popen([sys.executable, "bench/load.py", http, str(B), P, str(G), seed], stdout=ef, stderr=ef)
    lo = hi = None
    while G > 2 * R and p.poll() is None:
        s = snap()
        if lo is None and s[1] - b[1] >= B * R: lo = s
        if s[1] - b[1] >= B * (G - R):
            hi = s
            break
        time.sleep(0.002)
    p.wait()
time.sleep(0.3)
a = snap()
prefill = key.endswith("prefill8k")
us = lambda v: 1e3 * v / L
def show(x, y, what):
    d = [q - r for q, r in zip(y, x)]
    steps = max(d[0], 1)
    step, att, dis, wait, net, exp, comb, thr, lau, plan, unp, oth = (v / steps for v in d[2:14])
    two = step * steps if prefill else step  # prefill: all steps of the one prompt
    print(f"afd {key} ({what}): two processes {two:.3f} ms ({steps:.0f} steps, {d[1] / steps:.1f} tokens a step), per MoE layer: "
          f"plan {us(plan):.1f} us, send {us(dis):.1f} us, wait {us(wait):.1f} us (server compute {us(exp):.1f}, transfer {us(net):.1f}), "
          f"unpack {us(unp):.1f} us; per step: own layers (device wait) {att:.3f} ms, launches {lau:.3f} ms, other {oth:.3f} ms, "
          f"thresholds {thr:.3f} ms")
    return two
two = show(b, a, "whole load")
if lo and hi and hi[0] > lo[0]:
    two = show(lo, hi, "decode window")
if one:  # warm-up loads pass none
    print(f"RESULT afd_1gpu_step_ratio_{key} {two / float(one):.2f} (two processes {two:.3f} ms / one process {float(one):.3f} ms)")
PY
}
LOADS=${LOADS:-prefill 1 32 256}
if [[ " $LOADS " == *" prefill "* ]]; then
  load warm_prefill8k 1 8192 1 "" # warms the worker (allocations, cuBLAS)
  load prefill8k 1 8192 1 "$(one prefill_8k)"
fi
for b in ${LOADS//prefill/}; do
  load warm$b "$b" 16 24 "" > /dev/null # graphs captured, kernels loaded, the micro-batch count tuned (mbtune.h)
  load b$b "$b" 16 "$GEN" "$(one decode_b${b}_greedy)"
done
{ echo "== loads (ok, failed, errors)"; cat "$OUT/load$TAG.err"
  for f in $STRATA_STATE/*.log; do echo "== $f: warnings"; grep -E "WARN|ERROR" "$f" | tail -8; echo "== $f: last lines"; tail -4 "$f"; done
} >> "$OUT/afd$TAG.txt"; rm -f "$OUT/load$TAG.err"
timeout 30 $B/strata down
# the expert server's dispatches served by a CUDA graph replay (its stop line)
grep -h "now run as" $STRATA_STATE/*.log | sed "s/^/micro-batches: /" >> "$OUT/afd$TAG.txt" || true
grep -h "by a graph replay" $STRATA_STATE/*.log | sed 's/^.*stopping/expert server: stopping/' >> "$OUT/afd$TAG.txt" || true
