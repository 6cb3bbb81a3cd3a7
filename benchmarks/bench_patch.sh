#!/usr/bin/env bash
# `clover gguf patch` throughput against `cp` of the same file on the same disk.
#
#   benchmarks/bench_patch.sh [BUILD_DIR] [--reps N] [--layers L] [--dir D] [--keep] [--no-sync]
#
# Synthesizes a multi-GB clover_moe file (real 35B-A3B shapes, L layers, Q8_0; about 4.7 GB at
# L = 4), then alternates `cp IN OUT` and `clover gguf patch IN OUT` — each timed until its
# data is on disk (the command, then `sync`, unless --no-sync) — and prints the medians, GB/s
# and the ratio as a table and one JSON line. Two patch cases:
#   vendor : --norms add-one --ssm-a from-a-log: the small tensors rewritten, every other tensor
#            copied as it is (what fixing the vendor's file costs);
#   v-heads: also --v-heads grouped: every GDN projection's V rows/columns reordered.
# The big files are deleted at the end (unless --keep). Goal (issue #8): patch >= 80 % of cp.
set -euo pipefail

build=build
reps=5
layers=4
dir=""
keep=0
sync_after=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --reps) reps="$2"; shift 2 ;;
        --layers) layers="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-sync) sync_after=0; shift ;;
        -h|--help) sed -n 2,14p "$0"; exit 0 ;;
        *) build="$1"; shift ;;
    esac
done
clover="$build/clover"
[[ -x "$clover" ]] || { echo "error: $clover not found (build the clover_cli target first)" >&2; exit 1; }
dir="${dir:-$build/bench_patch}"
mkdir -p "$dir"
in="$dir/synth.gguf"
out="$dir/out.gguf"
cleanup() { rm -f "$out" "$out.partial"; [[ $keep == 1 ]] || rm -f "$in"; }
trap cleanup EXIT

if [[ ! -f "$in" ]]; then
    echo "synthesizing $in (clover-35b-a3b shapes, $layers layers, Q8_0) ..." >&2
    "$clover" gguf synth --arch clover_moe --preset clover-35b-a3b --layers "$layers" --type q8_0 -o "$in" >&2
fi
bytes=$(stat -c %s "$in")
echo "file: $in, $(awk -v b="$bytes" 'BEGIN{printf "%.2f GB", b/1e9}')" >&2
cat "$in" > /dev/null  # both tools start with the input in the page cache

now() { date +%s.%N; }
# time_one CMD...: seconds until the output is written (and synced), then removes it.
time_one() {
    sync
    local t0 t1
    t0=$(now)
    "$@" > /dev/null 2>&1
    [[ $sync_after == 1 ]] && sync
    t1=$(now)
    rm -f "$out"
    sync
    awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.4f", b-a}'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{n=NR; if(n%2) print a[(n+1)/2]; else printf "%.4f\n", (a[n/2]+a[n/2+1])/2}'; }

cp_t=(); vendor_t=(); vheads_t=()
run_case() {
    case "$1" in
        cp) cp_t+=("$(time_one cp "$in" "$out")") ;;
        vendor) vendor_t+=("$(time_one "$clover" gguf patch "$in" "$out" --norms add-one --ssm-a from-a-log)") ;;
        vheads) vheads_t+=("$(time_one "$clover" gguf patch "$in" "$out" --norms add-one --ssm-a from-a-log --v-heads grouped)") ;;
    esac
}
order=(cp vendor vheads)
for ((r = 1; r <= reps; r++)); do
    # Rotate the order each repetition, so no tool always runs right after another.
    for ((k = 0; k < 3; k++)); do run_case "${order[(r + k) % 3]}"; done
    echo "rep $r: cp ${cp_t[-1]} s, patch (vendor) ${vendor_t[-1]} s, patch (v-heads) ${vheads_t[-1]} s" >&2
done
m_cp=$(echo "${cp_t[*]}" | median)
m_vendor=$(echo "${vendor_t[*]}" | median)
m_vheads=$(echo "${vheads_t[*]}" | median)
gbps() { awk -v b="$bytes" -v s="$1" 'BEGIN{printf "%.2f", b/1e9/s}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", 100*a/b}'; }

printf '\n| tool | median s | GB/s | vs cp |\n|---|---|---|---|\n'
printf '| cp | %s | %s | 100.0 %% |\n' "$m_cp" "$(gbps "$m_cp")"
printf '| clover gguf patch (vendor: norms, ssm_a) | %s | %s | %s %% |\n' "$m_vendor" "$(gbps "$m_vendor")" "$(ratio "$m_cp" "$m_vendor")"
printf '| clover gguf patch (+ V-head reorder) | %s | %s | %s %% |\n' "$m_vheads" "$(gbps "$m_vheads")" "$(ratio "$m_cp" "$m_vheads")"
printf '{"bench":"gguf_patch","bytes":%s,"reps":%s,"synced":%s,"cp_s":%s,"patch_vendor_s":%s,"patch_vheads_s":%s,"cp_gbps":%s,"patch_vendor_gbps":%s,"patch_vheads_gbps":%s,"patch_vendor_vs_cp_pct":%s,"patch_vheads_vs_cp_pct":%s}\n' \
    "$bytes" "$reps" "$([[ $sync_after == 1 ]] && echo true || echo false)" "$m_cp" "$m_vendor" "$m_vheads" \
    "$(gbps "$m_cp")" "$(gbps "$m_vendor")" "$(gbps "$m_vheads")" "$(ratio "$m_cp" "$m_vendor")" "$(ratio "$m_cp" "$m_vheads")"
