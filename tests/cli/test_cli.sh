#!/usr/bin/env bash
# The `strata` command end to end on the tiny preset: ckpt init/inspect, run with text and tokens,
# --dump-logits shapes, text through the checkpoint's tokenizer, --batch-file gives each prompt exactly the logits it gets alone, sampling is
# reproducible with a seed, and bad inputs give clear errors (exit 1/2, no crash).
set -u
bin=${STRATA_BIN:?}/strata
npy="python3 $(dirname "$0")/../npytool.py"
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/cli.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

"$bin" ckpt init --preset tiny --out "$tmp/ck" --seed 3 >/dev/null 2>&1
check "ckpt init writes config, index and several shards" \
  "[ -f $tmp/ck/config.json ] && [ -f $tmp/ck/model.safetensors.index.json ] && [ \$(ls $tmp/ck/*.safetensors | wc -l) -ge 3 ]"
out=$("$bin" ckpt inspect "$tmp/ck" 2>&1)
check "inspect prints parameters and bytes" "echo \"\$out\" | grep -q 'active per token' && echo \"\$out\" | grep -q 'attention worker'"

out=$("$bin" run --ckpt "$tmp/ck" --prompt "Hello" --max-tokens 6 --ignore-eos 2>"$tmp/err")
check "run prints tokens/s" "grep -q 'tokens/s' $tmp/err"
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 5,6,7,8 --max-tokens 5 --print-tokens --ignore-eos \
  --dump-logits "$tmp/one.npy" >"$tmp/one.txt" 2>/dev/null
check "dump-logits is [prompt + generated - 1, vocab] float32, all finite" \
  "[ \"\$($npy shape $tmp/one.npy)\" = '8 512' ] && $npy finite $tmp/one.npy"
check "printed tokens are the greedy argmax of the dumped logits" \
  "[ \"\$($npy argmax $tmp/one.npy 3)\" = \"\$(cut -d, -f1-5 $tmp/one.txt)\" ]"

# batch: each prompt gets exactly the logits it gets alone
printf 'tokens: 5,6,7,8\nHello there, a longer prompt of many bytes\ntokens: 9\n' > "$tmp/batch.txt"
"$bin" run --ckpt "$tmp/ck" --batch-file "$tmp/batch.txt" --max-tokens 4 --ignore-eos --dump-logits "$tmp/b.npy" >/dev/null 2>&1
"$bin" run --ckpt "$tmp/ck" --prompt "Hello there, a longer prompt of many bytes" --max-tokens 4 --ignore-eos --dump-logits "$tmp/a1.npy" >/dev/null 2>&1
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 9 --max-tokens 4 --ignore-eos --dump-logits "$tmp/a2.npy" >/dev/null 2>&1
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 5,6,7,8 --max-tokens 4 --ignore-eos --dump-logits "$tmp/a0.npy" >/dev/null 2>&1
check "batch-file prompt 0 logits == alone (bitwise)" "cmp -s $tmp/b.0.npy $tmp/a0.npy"
check "batch-file prompt 1 logits == alone (bitwise)" "cmp -s $tmp/b.1.npy $tmp/a1.npy"
check "batch-file prompt 2 logits == alone (bitwise)" "cmp -s $tmp/b.2.npy $tmp/a2.npy"

s1=$("$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,2 --max-tokens 12 --temperature 1.0 --top-p 0.9 --seed 42 --print-tokens --ignore-eos 2>/dev/null)
s2=$("$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,2 --max-tokens 12 --temperature 1.0 --top-p 0.9 --seed 42 --print-tokens --ignore-eos 2>/dev/null)
s3=$("$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,2 --max-tokens 12 --temperature 1.0 --top-p 0.9 --seed 43 --print-tokens --ignore-eos 2>/dev/null)
check "sampling with a seed is reproducible" "[ -n \"$s1\" ] && [ \"$s1\" = \"$s2\" ]"
check "a different seed samples differently" "[ \"$s1\" != \"$s3\" ]"
# the engine samples (st_seq_chunk_t.sample): with --dump-logits the first token is drawn from the
# prefill's rows by the same rule, so the tokens do not change; prompt i of a batch samples with seed + i
s4=$("$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,2 --max-tokens 12 --temperature 1.0 --top-p 0.9 --seed 42 --print-tokens --ignore-eos \
  --dump-logits "$tmp/s4.npy" 2>/dev/null)
check "sampled tokens are the same with --dump-logits" "[ \"$s1\" = \"$s4\" ] && [ \"\$($npy shape $tmp/s4.npy)\" = '13 512' ]"
printf 'tokens: 5,6\ntokens: 1,2\n' > "$tmp/sb.txt"
sb=$("$bin" run --ckpt "$tmp/ck" --batch-file "$tmp/sb.txt" --max-tokens 12 --temperature 1.0 --top-p 0.9 --seed 41 --print-tokens \
  --ignore-eos 2>/dev/null | sed -n 's/^\[1\] //p')
check "prompt 1 of a batch samples as alone with seed + 1" "[ \"$sb\" = \"$s1\" ]"
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,2 --max-tokens 2 --temperature -1 >/dev/null 2>"$tmp/err"; rc=$?
check "negative temperature: usage error naming it" "[ $rc -eq 2 ] && grep -q temperature $tmp/err"

# bad inputs
"$bin" run --ckpt "$tmp/nope" --prompt x --max-tokens 1 >/dev/null 2>"$tmp/err"; rc=$?
check "missing checkpoint: exit 1 with a message" "[ $rc -eq 1 ] && grep -q 'nope' $tmp/err"
cp -r "$tmp/ck" "$tmp/ck2"
python3 -c "import json; p='$tmp/ck2/config.json'; c=json.load(open(p)); del c['text_config']['hidden_size']; json.dump(c, open(p,'w'))"
"$bin" run --ckpt "$tmp/ck2" --prompt x --max-tokens 1 >/dev/null 2>"$tmp/err"; rc=$?
check "config without hidden_size: error names the key" "[ $rc -eq 1 ] && grep -q 'hidden_size' $tmp/err"
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,99999 --max-tokens 1 >/dev/null 2>"$tmp/err"; rc=$?
check "token id out of range: clear error" "[ $rc -eq 1 ] && grep -q 'vocabulary' $tmp/err"
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 1,x --max-tokens 1 >/dev/null 2>&1; rc=$?
check "malformed token list: usage error" "[ $rc -eq 2 ]"
"$bin" ckpt init --preset huge --out "$tmp/h" >/dev/null 2>"$tmp/err"; rc=$?
check "unknown preset: clear error" "[ $rc -ne 0 ] && grep -qi 'preset' $tmp/err"

# the configuration table: strata config lists every entry with its source; flag > environment > default
out=$(env -u STRATA_THREADS "$bin" config 2>&1); rc=$?
check "config lists the table (default source)" \
  "[ $rc -eq 0 ] && echo \"\$out\" | grep -Eq '^STRATA_THREADS +0 +default' && echo \"\$out\" | grep -q '^UCX_NET_DEVICES'"
out=$(STRATA_THREADS=3 "$bin" config 2>&1)
check "config: a STRATA_ variable is read through the table" "echo \"\$out\" | grep -Eq '^STRATA_THREADS +3 +env'"
out=$(STRATA_THREADS=3 "$bin" config --set THREADS=5 2>&1)
check "config: --set wins over the environment" "echo \"\$out\" | grep -Eq '^STRATA_THREADS +5 +flag'"
out=$(STRATA_API_KEY=sekrit-value "$bin" config 2>&1)
check "config: a secret shows its length, never its value" \
  "echo \"\$out\" | grep -Eq '^STRATA_API_KEY +<12 characters> +env' && ! echo \"\$out\" | grep -q sekrit"
STRATA_THREADS=many "$bin" config >/dev/null 2>"$tmp/err"; rc=$?
check "config: a malformed STRATA_ variable is refused, named" "[ $rc -eq 2 ] && grep -q 'STRATA_THREADS' $tmp/err"
"$bin" run --set NOPE=1 --ckpt "$tmp/ck" --prompt x --max-tokens 1 >/dev/null 2>"$tmp/err"; rc=$?
check "--set of an unknown entry: exit 2, named" "[ $rc -eq 2 ] && grep -q 'NOPE' $tmp/err"
"$bin" run --ckpt "$tmp/ck" --prompt-tokens 5,6 --max-tokens 2 --ignore-eos --set THREADS=1 --set LOG=error \
  >/dev/null 2>"$tmp/err"; rc=$?
check "--set works on any command (run, LOG=error silences INFO)" "[ $rc -eq 0 ] && ! grep -q ' INFO ' $tmp/err"

# a checkpoint that ships a tokenizer: text prompts are its ids (merges applied), not bytes
cp -r "$tmp/ck" "$tmp/bpe"
python3 - "$tmp/bpe" <<'PY'
import base64, sys
d = sys.argv[1]
lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
lines += [f"{base64.b64encode(t).decode()} {256 + i}" for i, t in enumerate([b"th", b"he", b"the"])]
open(d + "/tiktoken.model", "w").write("\n".join(lines) + "\n")
open(d + "/tokenizer_config.json", "w").write('{"added_tokens_decoder": {"259": {"content": "<|im_end|>", "special": true}}}')
PY
"$bin" run --ckpt "$tmp/bpe" --prompt "the the" --max-tokens 1 --routing-out "$tmp/bpe.rt" >/dev/null 2>"$tmp/err"; rc=$?
check "run encodes a text prompt with the checkpoint's tokenizer (the the -> 258,32,258)" \
  "[ $rc -eq 0 ] && [ \"\$(awk '!/^#/ && NR > 2 && \$2 < 3 {print \$2 \":\" \$3}' $tmp/bpe.rt | sort -u | tr '\n' ' ')\" = '0:258 1:32 2:258 ' ]"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
