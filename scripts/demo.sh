#!/usr/bin/env bash
# The demo: the bundled small Clover model (models/clover-small.gguf, trained here on Python
# standard-library sources; see tools/train/README.md) completes a piece of Python, first
# causally (AR), then by block diffusion — the summary line on stderr shows passes and TPF.
set -euo pipefail
build=${BUILD:-build}
clover="$build/clover"
"$clover" gguf info models/clover-small.gguf | tail -3
prompt='def read_config(path):
    """Read a configuration file and return a dict."""
'
for decoder in ar diffusion speculative; do
    echo "--- clover run --raw --decoder $decoder"
    "$clover" run --raw -p "$prompt" -n 64 --decoder "$decoder"
    echo
done
