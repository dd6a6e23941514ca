#!/usr/bin/env bash
# ctest entry of the tokenizer oracle test: installs the oracle from npm (setup_oracle.sh), has it
# write the ids OpenAI's tiktoken core gives (oracle.mjs), and compares Strata's tokenizer with them
# (test_tokenizer_oracle.c). Fails when any id differs.
#   test_tokenizer_oracle.sh PATH/TO/test_tokenizer_oracle
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
tmp=${STRATA_TEST_TMP:-${TMPDIR:-/tmp}}/tokenizer-oracle-$$
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"
bash "$here/setup_oracle.sh"
"$bin" --ranges "$tmp/ranges.txt"
node "$here/oracle.mjs" --out "$tmp" --ranges "$tmp/ranges.txt"
"$bin" "$tmp"
