#!/usr/bin/env bash
# `strata tokenize` end to end on a small vocabulary written here: text and file to ids, ids to text,
# specials allowed and as text, the byte fallback's warning, and errors with their exit codes.
set -uo pipefail
bin=${STRATA_BIN:?}/strata
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/tokcli-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() { # check WHAT EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1: want [$2] got [$3]" >&2; fi
}
python3 - "$tmp/tok" <<'PY'
import base64, json, os, sys
d = sys.argv[1]; os.makedirs(d)
toks = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b" world"]
with open(os.path.join(d, "tiktoken.model"), "w") as f:
    for r, t in enumerate(toks): f.write(f"{base64.b64encode(t).decode()} {r}\n")
n = len(toks)
json.dump({"added_tokens_decoder": {str(n + 2): {"content": "<|im_end|>", "special": True},
                                    str(n + 1): {"content": "[EOS]", "special": True}},
           "eos_token": "[EOS]"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
PY
d=$tmp/tok
check "encode" "259,263" "$("$bin" tokenize --ckpt "$d" "hello world")"
check "specials allowed by default" "259,266" "$("$bin" tokenize --ckpt "$d" "hello<|im_end|>")"
check "--no-special" "259,60,124,105,109,95,101,110,100,124,62" "$("$bin" tokenize --ckpt "$d" --no-special "hello<|im_end|>")"
printf 'hello world\n' > "$tmp/f.txt"
check "--file: bytes as they are (newline kept)" "259,263,10" "$("$bin" tokenize --ckpt "$d" --file "$tmp/f.txt")"
check "--file -" "259,263,10" "$("$bin" tokenize --ckpt "$d" --file - < "$tmp/f.txt")"
check "--decode" "hello world<|im_end|>" "$("$bin" tokenize --ckpt "$d" --decode 259,263,266)"
check "--decode --skip-special" "hello world" "$("$bin" tokenize --ckpt "$d" --decode 259,263,266 --skip-special)"
ids=$("$bin" tokenize --ckpt "$d" "héllo wörld 你好 😀")
check "round trip" "héllo wörld 你好 😀" "$("$bin" tokenize --ckpt "$d" --decode "$ids")"
check "--info" "tiktoken tokenizer: 522 ids, bos -1, pad -1, eos 265" \
  "$("$bin" tokenize --ckpt "$d" --info "x" 2>&1 >/dev/null)"
"$bin" tokenize --ckpt "$d" --decode 1,999999 >/dev/null 2>"$tmp/err"
check "an id out of range: exit 1" "1" "$?"
check "  with the reason" "1" "$(grep -c 'out of range' "$tmp/err")"
"$bin" tokenize --ckpt "$d" --decode 1,x >/dev/null 2>&1
check "a malformed id list: exit 2" "2" "$?"
"$bin" tokenize --ckpt "$tmp/nowhere" "x" >/dev/null 2>&1
check "a missing folder: exit 1" "1" "$?"
"$bin" tokenize --ckpt "$d" >/dev/null 2>&1
check "nothing to do: exit 2" "2" "$?"
"$bin" tokenize --help >/dev/null 2>&1
check "--help: exit 0" "0" "$?"
mkdir "$tmp/bytes"
echo '{"vocab_size": 300, "bos_token_id": 256, "eos_token_id": 257}' > "$tmp/bytes/config.json"
check "byte fallback" "104,105" "$("$bin" tokenize --ckpt "$tmp/bytes" "hi" 2>"$tmp/warn")"
check "  warns" "1" "$(grep -c 'no tiktoken.model' "$tmp/warn")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
