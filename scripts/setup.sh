#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test clover: compilers, CMake, the
# header libraries (Debian packages only), Doxygen (the API reference), Boost.Context (the fibers of
# the emulated CUDA device, cuda/emu), Open MPI (optional: clover::dist over MPI ranks), Node.js/npm for the peers,
# then the peers themselves.
# The fuzz targets (tests/fuzz) need clang 16 with its sanitizer/libFuzzer runtimes (clang 14 cannot
# compile the engine headers) and llvm-symbolizer for readable reports.
set -euo pipefail
pkgs="build-essential cmake ninja-build pkg-config git libeigen3-dev doctest-dev nlohmann-json3-dev doxygen libboost-context-dev
      libcpp-httplib-dev libpcre2-dev libcli11-dev clang-16 libclang-rt-16-dev llvm-16
      libopenmpi-dev openmpi-bin"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# Node.js may come from elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's
# npm package): only ask Debian for it when there is no npm at all.
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
    sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends $missing
fi
bash "$(dirname "$0")/../tools/peers/setup.sh"
