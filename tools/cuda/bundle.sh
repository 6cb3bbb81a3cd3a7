#!/usr/bin/env bash
# Builds what the GPU machine runs and packs it into device-bundle/ (gitignored), for a machine
# that is bare: no compiler, cmake or packages, only the repository's working tree and the paths
# a run carries (64 MiB in all). Run it HERE (a CPU machine with nvcc), from anywhere:
#     tools/cuda/bundle.sh
# then on the GPU machine, with carry ["device-bundle"]:  bash tools/cuda/device_check.sh
#
# The bundle: tests_cuda, clover_cuda_logits and the clover CLI (both backends: --device) of a
# `cuda` preset build in build-cuda-bundle/, stripped, plus every shared library ldd lists beyond glibc and the GPU driver
# (libstdc++, libgcc_s, libpcre2-8, ...: the bare machine may lack them or hold older ones).
# The CUDA targets link cudart statically (cuda/CMakeLists.txt), so no libcudart travels; the
# driver's libcuda is the GPU machine's own. Compiles take the house build lock
# ($CLOVER_BUILD_LOCK, default /tmp/clover-build.lock) when flock exists.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${BUILD:-build-cuda-bundle}"
BUNDLE="${BUNDLE:-device-bundle}"
LOCK="${CLOVER_BUILD_LOCK:-/tmp/clover-build.lock}"
LIMIT_MIB="${LIMIT_MIB:-64}"
JOBS="${JOBS:-2}"

# Its own build folder, not build-cuda: the host code must run on the GPU machine's CPU, which is
# not this one, so no -march=native (CLOVER_NATIVE, on by default, could emit instructions that
# CPU lacks: SIGILL instead of results). x86-64-v3 (AVX2, FMA, F16C) runs on every x86 server an
# H200 is sold in; the CPU paths it compiles are the tested AVX2 ones.
portable=-march=x86-64-v3
[ -f "$BUILD/CMakeCache.txt" ] || cmake --preset cuda -B "$BUILD" -DCLOVER_NATIVE=OFF -DCLOVER_BUILD_TESTS=ON \
    -DCMAKE_CXX_FLAGS="$portable" -DCMAKE_CUDA_FLAGS="-Xcompiler=$portable" > /dev/null
build=(cmake --build "$BUILD" -j "$JOBS" --target tests_cuda clover_cuda_logits clover_cli)
if command -v flock > /dev/null; then flock "$LOCK" "${build[@]}"; else "${build[@]}"; fi

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE"
bins=("$BUILD/cuda/tests_cuda" "$BUILD/clover_cuda_logits" "$BUILD/clover")
for b in "${bins[@]}"; do
    [ -x "$b" ] || { echo "bundle: $b was not built" >&2; exit 1; }
    cp "$b" "$BUNDLE/"
done

# Shared libraries to carry: all but the C library family, the dynamic loader and the driver.
base='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libcuda|libnvidia)[.-]'
for b in "${bins[@]}"; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    if [[ "$name" =~ $base ]]; then continue; fi
    cp -L "$path" "$BUNDLE/$name"
done
if ls "$BUNDLE" | grep -q '^libcudart'; then
    echo "bundle: a binary links libcudart dynamically (expected CUDA::cudart_static)" >&2; exit 1
fi
strip --strip-unneeded "$BUNDLE"/* 2> /dev/null || true
# tests_cuda writes its synthesized models under the folder compiled into it (CLOVER_TEST_TMP,
# this build's cuda/tmp); device_check.sh creates that path there.
echo "$PWD/$BUILD/cuda/tmp" > "$BUNDLE/test_tmp_dir.txt"
chmod +x "$BUNDLE"/tests_cuda "$BUNDLE"/clover_cuda_logits "$BUNDLE"/clover

# Each binary must resolve every library from the bundle or the base set alone.
for b in tests_cuda clover_cuda_logits clover; do
    if LD_LIBRARY_PATH="$PWD/$BUNDLE" ldd "$BUNDLE/$b" | grep -q 'not found'; then
        echo "bundle: $b has unresolved libraries:" >&2
        LD_LIBRARY_PATH="$PWD/$BUNDLE" ldd "$BUNDLE/$b" | grep 'not found' >&2
        exit 1
    fi
done

bytes=$(du -cb "$BUNDLE"/* | tail -1 | cut -f1)
ls -l "$BUNDLE"
echo "bundle: $BUNDLE holds $(ls "$BUNDLE" | wc -l) files, $bytes bytes ($((bytes / 1048576)) MiB; limit ${LIMIT_MIB} MiB)"
if [ "$bytes" -ge $((LIMIT_MIB * 1048576)) ]; then
    echo "bundle: $bytes bytes exceed the ${LIMIT_MIB} MiB a device run can carry" >&2
    exit 1
fi
