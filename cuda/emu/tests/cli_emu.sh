#!/usr/bin/env bash
# The clover command of the emulated-device build (build-cuda-emu/clover, test cuda_emu_cli_small_model):
# --device cuda runs backend::cuda's kernels on the emulated device; every answer is compared with
# --device cpu on the same model.
#   cli_emu.sh CLOVER MODEL TMPDIR
# Checked: logits (F32 KV, the command's default) within 1e-5 of the CPU's (max |d| / (1 + max |cpu|),
# the measure of cuda/tests/test_model.cu: both backends compute every primitive to a few float ulps);
# greedy ids equal to the CPU's for the AR, diffusion and speculative decoders; --n-cpu-moe 1 gives
# the CPU's ids; generate --parallel 3 gives each sequence's ids alone; bench reports the CUDA backend.
# Few ids and tokens: every pass runs its kernels' threads as fibers.
set -u
clover=$1
model=$2
tmp=$3/cli_emu
mkdir -p "$tmp"
fail() { echo "cli_emu: $*" >&2; exit 1; }
[ -f "$model" ] || fail "no model at $model"

ids=1,17,302,45,9,800,12
"$clover" logits -m "$model" --ids $ids -o "$tmp/cpu.f32" --device cpu 2> "$tmp/err.txt" || fail "logits --device cpu: $(cat "$tmp/err.txt")"
"$clover" logits -m "$model" --ids $ids -o "$tmp/cuda.f32" --device cuda 2> "$tmp/err.txt" || fail "logits --device cuda: $(cat "$tmp/err.txt")"
[ "$(stat -c %s "$tmp/cpu.f32")" = "$(stat -c %s "$tmp/cuda.f32")" ] || fail "logits: CPU and CUDA files differ in size"
rel=$(paste <(od -An -v -f -w4 "$tmp/cpu.f32") <(od -An -v -f -w4 "$tmp/cuda.f32") |
      awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > md) md = d; a = $1 < 0 ? -$1 : $1; if (a > mx) mx = a; n++ }
           END { if (n == 0) print "empty"; else printf "%.3g\n", md / (1 + mx) }')
awk -v r="$rel" 'BEGIN { exit !(r != "empty" && r + 0 <= 1e-5) }' || fail "logits: CUDA differs from the CPU by $rel (> 1e-5)"

gen=(generate -m "$model" --ids $ids -n 6 --greedy --ignore-eos)
for dec in ar diffusion speculative; do
    extra=()
    [ "$dec" = ar ] || extra=(--decoder "$dec" --block 4)
    cpu_ids=$("$clover" "${gen[@]}" "${extra[@]}" --device cpu 2> "$tmp/err.txt") || fail "generate $dec --device cpu: $(cat "$tmp/err.txt")"
    [ -n "$cpu_ids" ] || fail "generate $dec --device cpu printed nothing"
    cuda_ids=$("$clover" "${gen[@]}" "${extra[@]}" --device cuda 2> "$tmp/err.txt") || fail "generate $dec --device cuda: $(cat "$tmp/err.txt")"
    [ "$cuda_ids" = "$cpu_ids" ] || fail "generate $dec: greedy ids differ: CPU $cpu_ids, CUDA $cuda_ids"
    [ "$dec" = ar ] && ar_ids=$cpu_ids
done
moe_ids=$("$clover" "${gen[@]}" --device cuda --n-cpu-moe 1 2> "$tmp/err.txt") || fail "generate --n-cpu-moe 1: $(cat "$tmp/err.txt")"
[ "$moe_ids" = "$ar_ids" ] || fail "--n-cpu-moe 1: greedy ids differ: CPU $ar_ids, CUDA $moe_ids"

# Three prompts of different lengths decoded together equal each decoded alone.
printf '%s\n' "$ids" "5,6,7" "300,301,302,303,304" > "$tmp/prompts.txt"
par=$("$clover" generate -m "$model" --ids-file "$tmp/prompts.txt" --parallel 3 -n 4 --greedy --ignore-eos --device cuda 2> "$tmp/err.txt") ||
    fail "generate --parallel 3 --device cuda: $(cat "$tmp/err.txt")"
alone=""
while read -r line; do
    one=$("$clover" generate -m "$model" --ids "$line" -n 4 --greedy --ignore-eos --device cuda 2> "$tmp/err.txt") ||
        fail "generate --device cuda (alone): $(cat "$tmp/err.txt")"
    alone+="$one"$'\n'
done < "$tmp/prompts.txt"
[ "$par" = "${alone%$'\n'}" ] || fail "generate --parallel 3 differs from each sequence alone: batched [$par], alone [${alone%$'\n'}]"

bench=$("$clover" bench -m "$model" -p 4 -n 2 -r 1 --json --device cuda 2> "$tmp/err.txt") || fail "bench --device cuda: $(cat "$tmp/err.txt")"
grep -q '"backend":"CUDA"' <<< "$bench" || fail "bench --device cuda did not report the CUDA backend: $bench"
echo "cli_emu: --device cuda on the emulated device: logits within $rel of the CPU's; greedy ids equal (ar, diffusion, speculative, --n-cpu-moe 1); --parallel 3 equals alone; bench reports CUDA"
