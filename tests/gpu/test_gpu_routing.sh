#!/usr/bin/env bash
# `strata run --routing-out / --routing-in` on the GPU engine (tiny preset): replaying a GPU run's
# own routing gives its logits bit for bit; a CPU run's routing file replayed on the GPU is the
# routing the GPU run then uses (it writes the CPU's sets back), with finite logits; greedy through
# the device argmax replays to the same tokens. Exit 77 without a GPU (the CPU side:
# tests/cli/test_cli_routing.sh).
set -u
nvidia-smi -L 2>/dev/null | grep -q '^GPU' || { echo "no GPU, skipped"; exit 77; }
bin=${STRATA_BIN:?}/strata
npy="python3 $(dirname "$0")/../npytool.py"
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/gpu-routing.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

"$bin" ckpt init --preset tiny --out "$tmp/ck" --seed 3 >/dev/null 2>&1 || { echo "ckpt init failed"; exit 1; }
printf 'tokens: 5,6,7,8\nHello there, a longer prompt\ntokens: 9\n' >"$tmp/batch.txt"
run() { "$bin" run --ckpt "$tmp/ck" --max-tokens 8 --ignore-eos --print-tokens --batch-file "$tmp/batch.txt" "$@"; }

run --device cuda:0 --dump-logits "$tmp/g.npy" --routing-out "$tmp/g.rt" >"$tmp/g.txt" 2>"$tmp/err"
check "gpu run writes a routing file" "[ \"\$(head -1 $tmp/g.rt)\" = 'strata-routing 1' ] && [ \$(wc -l <$tmp/g.rt) -gt 100 ] || { cat $tmp/err; false; }"
run --device cuda:0 --dump-logits "$tmp/h.npy" --routing-in "$tmp/g.rt" --routing-out "$tmp/h.rt" >"$tmp/h.txt" 2>/dev/null
check "gpu replay of its own routing: logits bit for bit (3 prompts)" \
  "cmp -s $tmp/g.0.npy $tmp/h.0.npy && cmp -s $tmp/g.1.npy $tmp/h.1.npy && cmp -s $tmp/g.2.npy $tmp/h.2.npy"
check "gpu replay of its own routing: same tokens, same routing written" "cmp -s $tmp/g.txt $tmp/h.txt && cmp -s $tmp/g.rt $tmp/h.rt"
run --device cuda:0 --routing-in "$tmp/g.rt" >"$tmp/a.txt" 2>/dev/null
check "gpu greedy through the device argmax: replay gives the same tokens" "cmp -s $tmp/g.txt $tmp/a.txt"

# the replayed sets are the ones the GPU uses: another set at sequence 0, prompt position 2, layer 3
awk '$1==0 && $2==2 && $4==3 { $6=0; $7=1; $8=2; $9=3 } { print }' "$tmp/g.rt" >"$tmp/f.rt"
run --device cuda:0 --dump-logits "$tmp/f.npy" --routing-in "$tmp/f.rt" >/dev/null 2>&1
check "gpu: an edited set changes that prompt's logits" \
  "! cmp -s $tmp/g.rt $tmp/f.rt && [ -s $tmp/f.0.npy ] && ! cmp -s $tmp/g.0.npy $tmp/f.0.npy"

# the CPU's routing forced on the GPU; --max-tokens 1 routes the prompts only, so the CPU's file fits
# the GPU run whichever token each side generates
run --device cpu --max-tokens 1 --dump-logits "$tmp/c.npy" --routing-out "$tmp/c.rt" >/dev/null 2>&1
run --device cuda:0 --max-tokens 1 --dump-logits "$tmp/d.npy" --routing-in "$tmp/c.rt" --routing-out "$tmp/d.rt" >/dev/null 2>"$tmp/err"
check "cpu routing replayed on the gpu: the gpu run's routing is the cpu's" \
  "[ -s $tmp/d.rt ] && cmp -s $tmp/c.rt $tmp/d.rt || { cat $tmp/err; false; }"
check "cpu routing replayed on the gpu: finite logits of the same shape" \
  "$npy finite $tmp/d.1.npy && [ \"\$($npy shape $tmp/d.1.npy)\" = \"\$($npy shape $tmp/c.1.npy)\" ]"
run --device cuda:0 --max-tokens 1 --routing-out "$tmp/e.rt" >/dev/null 2>&1
echo "# gpu own routing vs cpu: $(diff <(tail -n +4 $tmp/c.rt) <(tail -n +4 $tmp/e.rt) | grep -c '^<') of $(tail -n +4 $tmp/c.rt | wc -l) lines differ (flips)"

# a file that does not fit is refused on the GPU as on the CPU (before the engine loads)
{ echo "strata-routing 1"; echo "layers 8 experts 16"; echo "0 0 5 1 4 1 2 3 16"; } >"$tmp/x.rt"
run --device cuda:0 --routing-in "$tmp/x.rt" >/dev/null 2>"$tmp/err"; rc=$?
check "gpu: an expert id out of range is refused" "[ $rc -eq 1 ] && grep -q 'expert id 16' $tmp/err"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
