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
rc=0
bash "$here/setup_oracle.sh" || rc=$?
if [ "$rc" = 3 ]; then
  echo "test_tokenizer_oracle: SKIPPED: the npm registry is unreachable from this machine, so the oracle" \
       "(npm tiktoken, gpt-tokenizer) cannot be installed" >&2
  exit 77
fi
[ "$rc" = 0 ] || exit "$rc"
"$bin" --ranges "$tmp/ranges.txt"
node "$here/oracle.mjs" --out "$tmp" --ranges "$tmp/ranges.txt"
"$bin" "$tmp"
