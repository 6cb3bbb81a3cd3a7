#!/usr/bin/env bash
# The model people run: Clover-35B-A3B's real shapes at all 40 layers (issue 41), side by side
# with llama.cpp v0.5.0 in one run — tg / pp / N = 4 sequences, the bandwidth against membw of
# the same run, load time, resident memory and page faults in the timed runs. The 8-layer files
# of bench_cpu_vs_llama.sh hide per-layer costs (40 × barriers, small ops, the GDN state) and
# give the 248k-row head half of a token's bytes; here it is a tenth.
#
#   benchmarks/bench_full_size.sh [MODEL.gguf ...]
#
# Without models it synthesizes the 40-layer file at Q4_K_M (llama.cpp's quantizer mix: Q6_K
# head, Q6_K share of ffn_down / attn_v; ~18.2 GiB) and at Q4_K into $MODELS_DIR (~19 GiB each:
# mind the disk). The files nearly fill a 24 GiB machine, so nothing else may run meanwhile.
# Everything else as bench_cpu_vs_llama.sh; defaults here: THREADS=2 ROUNDS=3 P=128 N=32
# PARALLEL="1 4" PAR_P=32 PAR_N=32 LAYERS=40 TYPES="q4_k_m q4_k" LLAMA_WARM=1 (llama.cpp maps the
# file; clover's private copy drops the file's page cache, so llama.cpp's file is read back into
# the cache before each of its runs, untimed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export THREADS=${THREADS:-2} ROUNDS=${ROUNDS:-3} P=${P:-128} N=${N:-32}
export PARALLEL=${PARALLEL-"1 4"} PAR_P=${PAR_P:-32} PAR_N=${PAR_N:-32}
export LAYERS=${LAYERS:-40} TYPES=${TYPES:-"q4_k_m q4_k"} LLAMA_WARM=${LLAMA_WARM:-1}
exec bash "$here/bench_cpu_vs_llama.sh" "$@"
