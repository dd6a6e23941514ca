#!/usr/bin/env bash
# ctest entry of test_chat_k3: a K3 tokenizer folder (kimi_tokenizer.py --k3), then the C renderer
# against the renderings written from K3's encoding_k3.py (test_chat_k3).
#   test_chat_k3.sh PATH/TO/test_chat_k3
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/chat-k3-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 "$here/kimi_tokenizer.py" "$tmp" --k3
"$1" "$tmp"
