#!/usr/bin/env bash
# usage (on nvidia-h200-x2, with a slim build carried as in scripts/gpu-run.sh): GPU_BUILD=DIR OUT=DIR scripts/gpu-cluster-2gpu.sh
# two GPUs: attention worker on cuda:0, expert server on cuda:1; output vs the one-process GPU engine; step split
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/${GPU_BUILD:-build-gpu5s}/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/${GPU_BUILD:-build-gpu5s}/lib/ucx
B=$PWD/${GPU_BUILD:-build-gpu5s}/bin
P="The history of the expert server begins"
export STRATA_STATE=/tmp/st6
nvidia-smi -L
timeout 200 $B/strata up --preset small --experts 1 --workers 1 --attn-device cuda:0 --expert-device cuda:1 --max-seqs 16 --max-batch-tokens 2048 > $OUT/up.log 2>&1; echo "up rc=$?"
timeout 90 $B/strata run --ckpt $STRATA_STATE/ckpt-small --device cuda:0 --prompt "$P" --max-tokens 32 --ignore-eos --print-tokens > $OUT/run.txt 2>$OUT/run.err; echo "run rc=$?"
timeout 90 $B/strata generate --prompt "$P" --max-tokens 32 --ignore-eos --print-tokens > $OUT/gen.txt 2>$OUT/gen.err; echo "gen rc=$?"
echo "one-process GPU: $(cat $OUT/run.txt)"; echo "cluster 2 GPUs : $(cat $OUT/gen.txt)"
cmp -s $OUT/run.txt $OUT/gen.txt && echo "TOKENS MATCH" || echo "TOKENS DIFFER"
# load: 16 concurrent requests, 128-token prompts, 64 tokens each
for i in $(seq 1 16); do
  toks=$(python3 -c "import random; random.seed($i); print(','.join(str(random.randrange(32768)) for _ in range(128)))")
  timeout 120 $B/strata generate --prompt-tokens $toks --max-tokens 64 --ignore-eos --print-tokens > /dev/null 2>>$OUT/load.err &
done
t0=$(date +%s.%N); wait; t1=$(date +%s.%N)
http=$(sed -n 's/^http=//p' $STRATA_STATE/cluster.env)
python3 - "$http" "$t0" "$t1" <<'PY' | tee $OUT/split.txt
import json, sys, urllib.request
s = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/status"))["step_ms"]
n = s["steps"]; tot = sum(s[k] for k in ("attention", "dispatch", "wait", "combine", "thresholds"))
print(f"steps {n}; per step ms: " + ", ".join(f"{k} {s[k]:.3f}" for k in ("attention","dispatch","wait","network","expert","combine","thresholds")))
print(f"share of step time waiting on the expert server: {100*s['wait']/tot:.1f}%  (of it, transfers (network): {100*s['network']/tot:.1f}% of the step)")
print(f"bytes: dispatch {s['dispatch_bytes']}, reply {s['reply_bytes']}, messages {s['messages']}; load wall {float(sys.argv[3])-float(sys.argv[2]):.2f} s for 16x(128+64) tokens")
PY
tail -3 $STRATA_STATE/expert-0.log > $OUT/expert_tail.txt; tail -3 $STRATA_STATE/attn-0.log > $OUT/attn_tail.txt
timeout 30 $B/strata down
