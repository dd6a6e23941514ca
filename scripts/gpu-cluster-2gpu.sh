#!/usr/bin/env bash
# usage (on nvidia-h200-x2, with a slim build carried as in scripts/gpu-run.sh): GPU_BUILD=DIR OUT=DIR scripts/gpu-cluster-2gpu.sh
# Two GPUs, disaggregated: attention worker on cuda:0, expert server on cuda:1, `small` preset.
# 1. output check: 32 greedy tokens from the cluster vs the one-process GPU engine (strata run);
# 2. end to end figures: prefill of one 8K prompt, decode at batch 1, 32 and 256 (B concurrent
#    requests, 16-token prompts, GEN generated tokens each), tokens/s by wall clock and by the
#    coordinator's mean step time, and the share of step time spent waiting on the expert server
#    (of it, transfers), from /status deltas.
# Env: MB=n (--micro-batches), GEN (tokens per request), TAG (label prefix), SKIP_PREFILL=1, NOWARM=1 (no
# unmeasured warm-up load before each batch size); any
# STRATA_* variable reaches the services (e.g. STRATA_WORKER_SYNC=1 STRATA_HOST_ROUTE=1 for the
# synchronous hand-off and host routing, to compare).
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/${GPU_BUILD:-build-gpu5s}/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/${GPU_BUILD:-build-gpu5s}/lib/ucx
B=$PWD/${GPU_BUILD:-build-gpu5s}/bin
P="The history of the expert server begins"
GEN=${GEN:-64}
export STRATA_STATE=/tmp/st6
nvidia-smi -L
timeout 200 $B/strata up --preset small --experts 1 --workers 1 --attn-device cuda:0 --expert-device cuda:1 \
    --max-seqs 256 --max-batch-tokens 8192 --max-ctx 8448 ${MB:+--micro-batches $MB} > $OUT/up.log 2>&1; echo "up rc=$?"
timeout 90 $B/strata run --ckpt $STRATA_STATE/ckpt-small --device cuda:0 --prompt "$P" --max-tokens 32 --ignore-eos --print-tokens > $OUT/run.txt 2>$OUT/run.err; echo "run rc=$?"
timeout 90 $B/strata generate --prompt "$P" --max-tokens 32 --ignore-eos --print-tokens > $OUT/gen.txt 2>$OUT/gen.err; echo "gen rc=$?"
echo "one-process GPU: $(cat $OUT/run.txt)"; echo "cluster 2 GPUs : $(cat $OUT/gen.txt)"
cmp -s $OUT/run.txt $OUT/gen.txt && echo "TOKENS MATCH" || echo "TOKENS DIFFER"
http=$(sed -n 's/^http=//p' $STRATA_STATE/cluster.env)
snap() { python3 - "$http" <<'PY'
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/status"))["step_ms"]
n = s["steps"]
print(n, *(s.get(k, 0) * n for k in ("step", "dispatch", "wait", "network", "expert", "combine", "thresholds")))
PY
}
toks() { python3 -c "import random; random.seed($1); print(','.join(str(random.randrange(32768)) for _ in range($2)))"; }
# one figure row: $1 label, $2 concurrent requests, $3 prompt tokens, $4 generated tokens
load() {
  local i b a t0 t1 pids=()
  for i in $(seq 1 "$2"); do toks $((i + 100 * $3)) "$3" > /tmp/p$i; done
  b=$(snap); t0=$(date +%s.%N)
  for i in $(seq 1 "$2"); do
    timeout 300 $B/strata generate --prompt-tokens "$(cat /tmp/p$i)" --max-tokens "$4" --ignore-eos --print-tokens > /dev/null 2>>$OUT/load.err &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  t1=$(date +%s.%N); sleep 0.3; a=$(snap)
  python3 - "$1" "$2" "$3" "$4" "$t0" "$t1" "$b" "$a" <<'PY' | tee -a $OUT/e2e.txt
import sys
lab, n, p, g = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
wall = float(sys.argv[6]) - float(sys.argv[5])
b = list(map(float, sys.argv[7].split())); a = list(map(float, sys.argv[8].split()))
d = [x - y for x, y in zip(a, b)]
steps = max(d[0], 1); step, dis, wait, net, exp, comb, thr = (v / steps for v in d[1:8])
tok = n * (p + g) if g <= 1 else n * g
print(f"RESULT cluster2gpu {lab}: {tok / wall:.0f} tok/s by wall ({n}x({p}+{g}) tokens in {wall:.2f} s), "
      f"{steps:.0f} steps, mean step {step:.3f} ms" + (f" -> {n / step * 1e3:.0f} tok/s by step" if g > 1 else "") +
      f"; waiting on the expert server {100 * wait / step:.1f}% of step time (transfers {100 * net / step:.1f}%, expert compute {100 * exp / step:.1f}%)")
PY
}
if [ -z "${SKIP_PREFILL:-}" ]; then
  load "${TAG:-}prefill 8K prompt" 1 8192 1
  load "${TAG:-}prefill 8K prompt (2nd)" 1 8192 1
fi
# each batch size once unmeasured first (its first steps capture the worker's CUDA graphs); NOWARM=1 skips it
for b in 1 32 256; do
  [ -z "${NOWARM:-}" ] && load "${TAG:-}warm-up batch $b" "$b" 16 4 > /dev/null
  load "${TAG:-}decode batch $b" "$b" 16 "$GEN"
done
grep -m1 "placed experts are resident" $STRATA_STATE/expert-0.log || echo "expert server: placed experts NOT all resident"
tail -3 $STRATA_STATE/expert-0.log > $OUT/expert_tail.txt; tail -3 $STRATA_STATE/attn-0.log > $OUT/attn_tail.txt
timeout 30 $B/strata down
