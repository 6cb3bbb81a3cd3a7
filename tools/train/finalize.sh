#!/bin/sh
# Export the finished run, write the fixtures, check them against the C++ engine, measure TPF.
# Usage: tools/train/finalize.sh [CKPT]   (default models/clover-small/run/best.pt)
set -e
cd "$(dirname "$0")/../.."
CKPT=${1:-models/clover-small/run/best.pt}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
/usr/bin/python3 tools/train/export_gguf.py "$CKPT" models/clover-small.gguf --type f32
build/clover gguf info models/clover-small.gguf | tail -4
/usr/bin/python3 tools/train/make_fixtures.py models/clover-small.gguf tests/data/clover_small
/usr/bin/python3 tools/train/make_fixtures.py --check build/clover models/clover-small.gguf tests/data/clover_small
