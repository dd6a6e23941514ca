#!/usr/bin/env bash
# Slim copy of a CUDA build for the GPU machine (64 MiB transfer limit, none of our Debian libraries
# there): bin/ (strata*, bench_gpu_*), tests/test_gpu_*, CMakeCache.txt and every CTestTestfile.cmake
# with the build path rewritten (so `ctest -L gpu` runs there), stripped, and lib/ with the non-system
# shared libraries they need plus UCX's transport modules.
# usage: scripts/gpu-slim.sh BUILD_DIR SLIM_DIR  (SLIM_DIR should match build*/ so git ignores it)
# on the GPU machine: export LD_LIBRARY_PATH=$PWD/SLIM_DIR/lib:/usr/local/cuda/lib64 UCX_MODULE_DIR=$PWD/SLIM_DIR/lib/ucx
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(cd "$1" && pwd); dst=$PWD/$2
rm -rf "$dst"; mkdir -p "$dst/bin" "$dst/tests" "$dst/lib"
cp "$src/CMakeCache.txt" "$dst/"
sed -i "s#$src#$dst#g" "$dst/CMakeCache.txt"
(cd "$src" && find . -name CTestTestfile.cmake) | while read -r f; do
    mkdir -p "$dst/$(dirname "$f")"; sed "s#$src#$dst#g" "$src/$f" >"$dst/$f"
done
for f in "$src"/bin/strata* "$src"/bin/bench_gpu_*; do [ -f "$f" ] && cp "$f" "$dst/bin/"; done
cp "$src"/tests/test_gpu_* "$dst/tests/" 2>/dev/null || true
[ -d "$src/tests/gpu" ] && find "$src/tests/gpu" -maxdepth 1 -name '*.sh' -exec cp {} "$dst/tests/" \;
strip --strip-unneeded "$dst"/bin/* "$dst"/tests/test_gpu_* 2>/dev/null || true
for b in "$dst"/bin/* "$dst"/tests/test_gpu_*; do ldd "$b" 2>/dev/null; done | awk '/=>/ {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|libz|libgomp|libcrypto|libssl)\.so|cuda|cublas' |
    xargs -r -I{} cp -L {} "$dst/lib/"
cp -r /usr/lib/x86_64-linux-gnu/ucx "$dst/lib/"
du -sh "$dst"
# The libraries travel packed (openblas alone is 35 MB): unpack on the GPU machine with
#   tar -C SLIM_DIR -xJf SLIM_DIR/lib.tar.xz
tar -C "$dst" -cJf "$dst/lib.tar.xz" lib && rm -rf "$dst/lib"
du -sh "$dst"
