#!/usr/bin/env bash
# ctest entry of test_chat: a Kimi tokenizer folder (kimi_tokenizer.py), the reference renderings
# of data/chat_cases.json by Jinja2 from the official template text (render_chat.py), then the C
# renderer against them (test_chat).
#   test_chat.sh PATH/TO/test_chat
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/chat-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 "$here/kimi_tokenizer.py" "$tmp"
python3 "$here/render_chat.py" "$here/data/kimi-k2-instruct-0905.jinja" "$here/data/chat_cases.json" "$tmp/expected.json"
"$1" "$tmp" "$here/data/chat_cases.json" "$tmp/expected.json"
