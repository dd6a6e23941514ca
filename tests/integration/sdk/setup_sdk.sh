#!/usr/bin/env bash
# Installs the official OpenAI Node SDK (npm `openai`) into tests/integration/sdk/node_modules for
# test_openai_api (tests/npm_pinned.sh: pinned, integrity-checked, exit 3 when the npm registry
# cannot be reached).
here=$(dirname "$0")
exec bash "$here/../../npm_pinned.sh" "$here" openai
