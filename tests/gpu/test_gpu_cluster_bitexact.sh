#!/usr/bin/env bash
# The GPU cluster (attention worker and expert servers on cuda:0) against the one-process GPU engine
# (`strata run --device cuda:0`), with 1 and 3 expert servers: the rule of docs/architecture.md
# ("Bit-exact expert results") end to end: the servers weight and sum their experts' rows into tree
# nodes (st_cuda_moe_tree_reduce), the worker's engine finishes each token's summation tree from those
# rows where they lie (mapped reply slots, read by its combine kernel), and the engine, which sums
# the whole tree itself in one process, gets the same bits. Prompts of 1 and 2 tokens prefill per row, longer ones
# grouped; every decode step runs per row (tiny: 16 experts, 4 per token). Requests run one at a time
# (the GPU engine's GEMMs are not batch-invariant), and the rows compared are the generated tokens'
# logits: the prefill row differs in how many logit rows share its lm_head GEMM (all prompt rows in
# `strata run --dump-logits`, one in the cluster), which says nothing about the experts.
# Exit 77 without a GPU.
. "$(dirname "$0")/../integration/lib.sh"
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then echo "no GPU: skipped"; exit 77; fi
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 5 >/dev/null 2>&1
prompts=("300" "7,8" "5,6,7" "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40")
# a prompt of 2 100 tokens, prefilled in one step (4 per token: 8 400 routed slots), which the worker
# plans on the device (st_engine_mb_plan, from 8 192 slots) and the servers serve with their leaf
# table built on the device (from 4 096 pairs): compared on a cluster of its own below
long=$(python3 -c "print(','.join(str(1 + (i * 37) % 250) for i in range(2100)))")
prompts+=("$long")
for i in "${!prompts[@]}"; do
  "$S" run --ckpt "$TMP/ck" --device cuda:0 --prompt-tokens "${prompts[$i]}" --max-tokens 16 --ignore-eos \
    --dump-logits "$TMP/ref$i.npy" >"$TMP/run$i.txt" 2>&1 || { bad "one-process GPU run $i"; cat "$TMP/run$i.txt"; }
done
# ref rows from n (the first generated token's step) == cluster rows from 1, bit for bit
decode_same() {
  python3 - "$1" "$2" "$3" <<'PY'
import ast, struct, sys
def load(path):  # float32 C-order 2-D .npy (as tests/npytool.py reads it)
    d = open(path, "rb").read()
    n = struct.unpack("<H", d[8:10])[0]
    r, c = ast.literal_eval(d[10:10 + n].decode())["shape"]
    return r, c, d[10 + n:]
ra, ca, a = load(sys.argv[1]); rb, cb, b = load(sys.argv[2]); n = int(sys.argv[3])
ok = ca == cb and ra - n == rb - 1 and rb > 1 and a[n * ca * 4:] == b[ca * 4:]
print(f"  A {ra}x{ca} from row {n}, B {rb}x{cb} from row 1: {'equal' if ok else 'DIFFERENT'}; prefill row "
      f"{'equal' if a[(n - 1) * ca * 4:n * ca * 4] == b[:ca * 4] else 'differs (lm_head rows)'}")
sys.exit(0 if ok else 1)
PY
}
# 1 and 3 servers with chunks of 128 tokens (the short prompts); 1 and 3 with the long prompt in one
# micro-batch of one step (GEMMs are not batch-invariant: the one-process run prefills it whole)
for conf in "1 128" "3 128" "1 4096" "3 4096"; do
  read -r n_exp mbt <<<"$conf"
  if ! "$S" up --ckpt "$TMP/ck" --experts "$n_exp" --workers 1 --attn-device cuda:0 --expert-device cuda:0 \
       --max-seqs 4 --max-batch-tokens "$mbt" --max-ctx 4096 --micro-batches 1 >"$TMP/up.txt" 2>&1; then
    bad "GPU cluster with $n_exp expert servers ($mbt tokens a step) starts"; cat "$TMP/up.txt"; continue
  fi
  ok "GPU cluster with $n_exp expert servers ($mbt tokens a step) starts"
  for i in "${!prompts[@]}"; do
    (( (${#prompts[$i]} >= 1000) == (mbt > 128) )) || continue
    n=$(echo "${prompts[$i]}" | tr ',' '\n' | wc -l)
    "$S" generate --prompt-tokens "${prompts[$i]}" --max-tokens 16 --ignore-eos --dump-logits "$TMP/got$i.npy" \
      >"$TMP/gen$i.txt" 2>&1
    check "[$n_exp servers] prompt of $n: generated tokens' logits == one-process GPU engine, bit for bit" \
      "decode_same $TMP/ref$i.npy $TMP/got$i.npy $n"
  done
  "$S" down >/dev/null 2>&1
done
finish
