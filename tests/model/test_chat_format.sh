#!/usr/bin/env bash
# ctest entry of test_chat_format: a K3 tokenizer folder (tests/coordinator/kimi_tokenizer.py --k3),
# chat.py's renderings of a few exchanges on it (python3 with python3-regex; exit 77 without it),
# then the C side compares them with the coordinator's renderer.
#   test_chat_format.sh SOURCE_DIR PATH/TO/test_chat_format
set -u
src=${1:?}; exe=${2:?}
if ! python3 -c 'import regex' 2>/dev/null; then echo "python3 has no regex module (python3-regex): skipped"; exit 77; fi
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/chatfmt.XXXXXX" 2>/dev/null || mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$src/tests/coordinator/kimi_tokenizer.py" "$tmp" --k3 || exit 1
PYTHONPATH="$src/tools/train" python3 - "$tmp" <<'PY' || exit 1
import json, sys
import chat, tokenizer
d = sys.argv[1]
n = sum(1 for _ in open(d + "/tiktoken.model"))
tok = tokenizer.BpeTokenizer.from_tiktoken_file(d + "/tiktoken.model", n)
cases = []
for q, a in [("What is a cache?", "Cache, n. A place to hide things."), ("Define \"grok\" & more.", 'grok, vt. To understand "deeply" & fully.'),
             ("Hi", "Hello."), ("<|end_of_msg|> is text here", "So is <|open|> here.")]:
    for thinking in (True, False):
        p, r = chat.render(tok, q, a, thinking)
        cases.append({"messages": [{"role": "user", "content": q}], "thinking": thinking, "prompt": p, "reply": r, "answer": a})
json.dump(cases, open(d + "/cases.json", "w"))
PY
"$exe" "$tmp" "$tmp/cases.json"
