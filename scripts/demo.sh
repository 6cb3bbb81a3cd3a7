#!/usr/bin/env bash
# The demo: until the bundled trained Clover model lands, a synthetic tiny model of the real
# architecture (random weights, so the ids are meaningless) shows the pipeline end to end.
set -euo pipefail
build=${BUILD:-build}
clover="$build/clover"
model="$build/demo-tiny.gguf"
"$clover" gguf synth --arch clover_moe --preset tiny -o "$model" 2>/dev/null
"$clover" gguf info "$model" | tail -3
echo "greedy generation of 32 tokens after the prompt 1,2,3 (ids on stdout, stats on stderr):"
"$clover" generate -m "$model" --ids 1,2,3 -n 32 --greedy --ignore-eos
