#!/usr/bin/env bash
# The model split by layers over 2 MPI ranks against the whole model in one process, on the same
# 2 cores (issue 40 item 6), in one run:
#   * one process with 2 threads (taskset to CORES) and `mpirun -np 2` with 1 thread per rank
#     (--cpu-set CORES --bind-to core: one rank per core, as the single process's two threads);
#   * N = 1 and N = 8 sequences decoding together (greedy AR, P prompt tokens, G generated, through
#     decode::engine on both sides: bench_pipeline.cpp);
#   * a markdown table: tokens/s, ms per token, each rank's time blocked on messages (% of the
#     decode time) beside the pipeline's own fill, bytes sent per token, VmHWM per rank, and the
#     issue's goals (N = 8 >= 0.7x, wait beyond the fill <= 5 %, VmHWM per rank <= 0.6x).
#
#   benchmarks/bench_pipeline.sh MODEL.gguf
#
# Environment (defaults): BUILD=build CORES=0,1 P=64 G=64 SEQS="1 8" MICRO=0 (micro-batches per
# pass; 0: one per stage) OUT=benchmarks/results. Writes $OUT/<date>-pipeline.jsonl (raw JSON,
# one line per configuration) and $OUT/<date>-pipeline.md (the table).
#
# Binding: --bind-to core keeps each rank on its own core for the whole run, so the two ranks
# never share a core while the other idles and their caches stay warm; --bind-to none would let
# the scheduler move them (and the single process's threads are not pinned one per core either,
# only to the same 2 cores). No --oversubscribe: 2 ranks on 2 cores fit, and oversubscribed Open
# MPI ranks yield in their waits, which would change what is measured.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$here/build}
CORES=${CORES:-0,1}
P=${P:-64}
G=${G:-64}
SEQS=${SEQS-"1 8"}
MICRO=${MICRO:-0}
OUT=${OUT:-$here/benchmarks/results}
bin=$BUILD/benchmarks/bench_pipeline
[ -x "$bin" ] || { echo "bench_pipeline: $bin is not built (cmake --build $BUILD --target bench_pipeline; it needs MPI)" >&2; exit 1; }
[ $# -eq 1 ] || { echo "usage: benchmarks/bench_pipeline.sh MODEL.gguf" >&2; exit 1; }
model=$1
[ -f "$model" ] || { echo "bench_pipeline: no such model file: $model" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "bench_pipeline: mpirun not found (Debian: openmpi-bin)" >&2; exit 1; }
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
# Containers that deny ptrace have no single-copy mechanism; the copy-in/copy-out path works everywhere.
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
mkdir -p "$OUT"
stamp=$(date -u +%Y-%m-%d-%H%M)
jsonl=$OUT/$stamp-pipeline.jsonl
md=$OUT/$stamp-pipeline.md
: > "$jsonl"
common=(-m "$model" -p "$P" -n "$G" --micro-batches "$MICRO" --json "$jsonl")
for n in $SEQS; do
    echo "bench_pipeline: N = $n, 1 process with 2 threads" >&2
    taskset -c "$CORES" "$bin" --mode single -t 2 -N "$n" "${common[@]}" > /dev/null
    echo "bench_pipeline: N = $n, 2 ranks with 1 thread each" >&2
    mpirun -np 2 --cpu-set "$CORES" --bind-to core "$bin" --mode pipeline -t 1 -N "$n" "${common[@]}" > /dev/null
done
{
    echo "# bench_pipeline $(date -u +%Y-%m-%d) $(basename "$model") P=$P G=$G micro-batches=$MICRO cores=$CORES"
    echo
    "$bin" --report "$jsonl"
} | tee "$md"
echo "bench_pipeline: raw JSON in $jsonl, the table in $md" >&2
