#!/usr/bin/env bash
# Installs what Strata needs to build and test on Debian 12 (Debian packages only).
set -euo pipefail
pkgs=(build-essential cmake pkgconf git ca-certificates python3 python3-numpy
      libopenblas-dev libjansson-dev
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libucx-dev ucx-utils libuv1-dev node-llhttp
      procps curl openssl libssl-dev clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
