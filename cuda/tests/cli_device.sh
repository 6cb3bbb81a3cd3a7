#!/usr/bin/env bash
# The clover command of a CUDA build (label cuda): --device and --n-cpu-moe reach backend::cuda.
#   cli_device.sh CLOVER TMPDIR
# Without a GPU (CI): --device cuda is one clear error line naming the missing device, --device
# auto falls back to the CPU and gives the CPU's ids. With a GPU: generate on the device (plain
# and --n-cpu-moe) gives the same greedy ids as the CPU, bench reports the CUDA backend, and the
# trace over backend::cuda shows one read-back per pass.
set -u
clover=$1
tmp=$2
mkdir -p "$tmp"
fail() { echo "cli_device: $*" >&2; exit 1; }
model=$tmp/cli_device_tiny.gguf
"$clover" gguf synth --arch clover_moe --preset tiny --seed 11 -o "$model" > /dev/null || fail "gguf synth failed"
gen=(generate -m "$model" --ids 5,6,7,8 -n 12 --greedy --ignore-eos)
cpu_ids=$("$clover" "${gen[@]}" --device cpu 2> /dev/null) || fail "generate --device cpu failed"
[ -n "$cpu_ids" ] || fail "generate --device cpu printed nothing"

if ! out=$("$clover" "${gen[@]}" --device cuda 2> "$tmp/cli_device_err.txt"); then
    err=$(cat "$tmp/cli_device_err.txt")
    [ "$(grep -c . "$tmp/cli_device_err.txt")" = 1 ] || fail "--device cuda without a GPU: expected one stderr line, got: $err"
    case "$err" in
        "error: backend::cuda: no CUDA device is available"*) ;;
        *) fail "--device cuda without a GPU: unexpected error: $err" ;;
    esac
    auto_ids=$("$clover" "${gen[@]}" --device auto 2> /dev/null) || fail "generate --device auto failed without a GPU"
    [ "$auto_ids" = "$cpu_ids" ] || fail "--device auto without a GPU gave other ids than the CPU"
    bench=$("$clover" bench -m "$model" -p 0 -n 2 -r 1 --json 2> /dev/null) || fail "bench without a GPU failed"
    grep -q '"backend":"CPU"' <<< "$bench" || fail "bench without a GPU did not run on the CPU: $bench"
    echo "cli_device: no CUDA device: --device cuda refused with one clear line; --device auto ran on the CPU"
    exit 0
fi

[ "$out" = "$cpu_ids" ] || fail "greedy ids differ: CPU $cpu_ids, CUDA $out"
moe_ids=$("$clover" "${gen[@]}" --device cuda --n-cpu-moe 1 2> /dev/null) || fail "generate --n-cpu-moe 1 failed"
[ "$moe_ids" = "$cpu_ids" ] || fail "--n-cpu-moe 1: greedy ids differ: CPU $cpu_ids, CUDA $moe_ids"
bench=$("$clover" bench -m "$model" -p 16 -n 4 -r 1 --json --device cuda) || fail "bench --device cuda failed"
[ "$(grep -c '"backend":"CUDA"' <<< "$bench")" = 2 ] || fail "bench --device cuda did not report the CUDA backend: $bench"
trace=$("$clover" bench -m "$model" --trace --parallel 2 --device cuda) || fail "bench --trace --device cuda failed"
[ "$(grep -c '"readbacks":1}' <<< "$trace")" = 4 ] || fail "trace over backend::cuda: not one read-back per pass: $trace"
err=$("$clover" "${gen[@]}" --device cuda:4096 2>&1 > /dev/null) && fail "--device cuda:4096 ran"
case "$err" in *"device 4096 does not exist"*) ;; *) fail "--device cuda:4096: unexpected error: $err" ;; esac
echo "cli_device: CUDA: greedy ids equal the CPU's (plain and --n-cpu-moe 1); bench reports CUDA; trace: 1 read-back per pass"
