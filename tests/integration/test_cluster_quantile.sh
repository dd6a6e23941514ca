#!/usr/bin/env bash
# Quantile balancing (SPEC §7) on a --skew-router checkpoint: top-k routing overloads the hot experts;
# quantile routing, once the coordinator's thresholds settle (<= 20 steps), gives every expert
# (k/n)·N ± 10% of the tokens. N: the load summed over the last 5 prefill steps of ~2000 tokens.
. "$(dirname "$0")/lib.sh"
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 9 --skew-router 4 >/dev/null 2>&1
run_mode() { # $1 = topk|quantile → prints max/mean and min/mean over experts and layers of the summed load
  "$S" up --ckpt "$TMP/ck" --experts 2 --workers 1 --routing "$1" --max-seqs 4 --max-batch-tokens 2100 --max-ctx 2200 \
      --micro-batches 1 >"$TMP/up.txt" 2>&1 || { cat "$TMP/up.txt"; return 1; }
  h=$(http)
  python3 - "$h" "$S" "$1" <<'PY'
import json, random, subprocess, sys, time, urllib.request
h, strata, mode = sys.argv[1], sys.argv[2], sys.argv[3]
def status():
    return json.load(urllib.request.urlopen(f"http://{h}/status", timeout=10))
def worker_step(s):
    return max([m["step"] for m in s["members"] if m["role"] == "attention"] + [0])
random.seed(1)
sums, steps = None, 25
for i in range(steps):
    toks = ",".join(str(random.randrange(512)) for _ in range(2000))
    r = subprocess.run([strata, "generate", "--prompt-tokens", toks, "--max-tokens", "1", "--print-tokens"], capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        print("generate failed:", r.stderr); sys.exit(1)
    t0 = time.time()
    while True:  # the step's report reaches the coordinator asynchronously
        s = status()
        if worker_step(s) >= i + 1 and (mode == "topk" or s["thresholds"]["version"] >= 1 or i == 0): break
        if time.time() - t0 > 10: print("no report for step", i + 1); sys.exit(1)
        time.sleep(0.05)
    load = [row["tokens"] for row in s["expert_load_last_step"]]
    if i >= steps - 5:
        sums = load if sums is None else [[a + b for a, b in zip(x, y)] for x, y in zip(sums, load)]
worst_hi, worst_lo = 0.0, 9.0
for row in sums:
    mean = sum(row) / len(row)
    worst_hi, worst_lo = max(worst_hi, max(row) / mean), min(worst_lo, min(row) / mean)
print(f"{worst_hi:.3f} {worst_lo:.3f}")
PY
  rc=$?
  "$S" down >/dev/null 2>&1
  return $rc
}
topk=$(run_mode topk); rc1=$?
echo "top-k:    max/mean min/mean = $topk"
quant=$(run_mode quantile); rc2=$?
echo "quantile: max/mean min/mean = $quant"
check "top-k run completes" "[ $rc1 -eq 0 ]"
check "quantile run completes" "[ $rc2 -eq 0 ]"
check "top-k on the skewed checkpoint overloads hot experts (max/mean >= 2)" "python3 -c 'import sys; sys.exit(0 if float(\"${topk% *}\") >= 2 else 1)'"
check "quantile: every expert within ±10% of k/n·N" "python3 -c 'import sys; hi,lo=map(float,\"$quant\".split()); sys.exit(0 if hi <= 1.10 and lo >= 0.90 else 1)'"
finish
