#!/usr/bin/env bash
# The GPU session's checklist for the CUDA backend, as one script (run it on a machine with an
# NVIDIA GPU, e.g. an H200, from the repository root). It
#   1. configures and builds the `cuda` preset (tests_cuda, clover_cuda_logits) with -j$JOBS,
#   2. runs tests_cuda: every kernel against its CPU twin, whole-model logits CUDA vs CPU,
#   3. benchmarks clover_cuda_logits (prefill/decode, CUDA vs CPU, max logit difference) on the
#      tiny synthetic model and on a synthesized full-width model with few layers (256 experts,
#      4 layers, vocabulary cut to 32768, Q8_0: ~3.5 GB; QUICK=1 skips it).
# Output goes to $OUT (default ./out/cuda_check): build.log, tests.log, bench.log, summary.txt.
# Everything is bounded by `timeout`, so a hang still leaves the logs behind.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out/cuda_check}"
JOBS="${JOBS:-$(nproc)}"
BUILD="${BUILD:-build-cuda}"
mkdir -p "$OUT"
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

# The machine may start bare: name what is missing instead of failing half-way through a build.
missing=""
for tool in cmake ninja /usr/local/cuda/bin/nvcc g++ pkg-config; do command -v "$tool" > /dev/null || missing="$missing $tool"; done
for hdr in /usr/include/eigen3/Eigen/Core /usr/include/doctest/doctest.h /usr/include/CLI/CLI.hpp; do [ -e "$hdr" ] || missing="$missing $hdr"; done
pkg-config --exists libpcre2-8 2>/dev/null || missing="$missing libpcre2-8"
[ -z "$missing" ] || { summary "missing:$missing (scripts/setup.sh installs them where apt is reachable)"; exit 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"

start=$(date +%s)
if cmake --preset cuda -B "$BUILD" > "$OUT/build.log" 2>&1 &&
   timeout 900 cmake --build "$BUILD" -j "$JOBS" --target clover_cuda_all clover_cli >> "$OUT/build.log" 2>&1; then
    summary "build: ok ($(( $(date +%s) - start )) s, -j$JOBS)"
else
    summary "build: FAILED (see build.log)"; tail -40 "$OUT/build.log"; exit 1
fi

start=$(date +%s)
timeout 1200 "$BUILD/cuda/tests_cuda" --duration=true > "$OUT/tests.log" 2>&1
rc=$?
summary "tests_cuda: rc=$rc ($(( $(date +%s) - start )) s): $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/tests.log" | tr '\n' ' ')"
[ $rc -ne 0 ] && grep -B2 -A12 -E 'ERROR|FATAL' "$OUT/tests.log" | head -120

# Benchmarks: synthetic models written by the clover command (tiny; full width with 4 layers).
mkdir -p "$BUILD/bench"
tiny="$BUILD/bench/tiny.gguf"; wide="$BUILD/bench/wide_q8_0.gguf"
[ -f "$tiny" ] || "$BUILD/clover" gguf synth --preset tiny -o "$tiny" >> "$OUT/bench.log" 2>&1
[ "${QUICK:-0}" = 1 ] || [ -f "$wide" ] || "$BUILD/clover" gguf synth --preset clover-35b-a3b --layers 4 --vocab 32768 --type q8_0 -o "$wide" >> "$OUT/bench.log" 2>&1
for m in "$tiny" "$wide"; do
    [ -f "$m" ] || { summary "bench: $m missing (clover gguf synth failed, see bench.log)"; continue; }
    echo "== $m" >> "$OUT/bench.log"
    timeout 600 "$BUILD/clover_cuda_logits" "$m" --prompt 128 --decode 16 >> "$OUT/bench.log" 2>&1
    summary "bench $(basename "$m"): rc=$? $(grep -E 'CUDA +prefill|max \|CUDA' "$OUT/bench.log" | tail -2 | tr '\n' ' ')"
done
[ -f "$wide" ] && { echo "== $wide --n-cpu-moe 2" >> "$OUT/bench.log";
    timeout 600 "$BUILD/clover_cuda_logits" "$wide" --prompt 64 --decode 8 --n-cpu-moe 2 --no-cpu >> "$OUT/bench.log" 2>&1;
    summary "bench n-cpu-moe 2: rc=$? $(grep -E 'CUDA +prefill' "$OUT/bench.log" | tail -1)"; }
cat "$OUT/summary.txt"
