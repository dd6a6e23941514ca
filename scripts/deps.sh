#!/usr/bin/env bash
# Installs what Strata needs to build and test on Debian 12 (Debian packages only). The npm packages
# of the tokenizer's test oracle are installed by tests/npm_pinned.sh (through tests/tokenizer/setup_oracle.sh and tests/integration/sdk/setup_sdk.sh) when those tests run;
# python3-jinja2 renders the official chat template for tests/coordinator/test_chat.
# usage: deps.sh [--test]; --test adds what only the test suite needs: PyTorch, matplotlib and python3-regex for
# tools/train's tests (test_train_tools, test_chat_format).
set -euo pipefail
pkgs=(build-essential cmake pkgconf git ca-certificates python3 python3-numpy python3-jinja2
      libopenblas-dev libjansson-dev libpcre2-dev
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libucx-dev ucx-utils libuv1-dev node-llhttp
      procps curl openssl libssl-dev clang libclang-rt-14-dev)
[ "${1:-}" = --test ] && pkgs+=(python3-torch python3-matplotlib python3-regex)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# node + npm run the tokenizer oracle (tests/tokenizer): Debian's, unless the machine already has a Node.js
# (one that bundles npm would conflict with Debian's npm package)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
