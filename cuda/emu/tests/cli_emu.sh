#!/usr/bin/env bash
# The clover command of the emulated-device build (build-cuda-emu/clover, test cuda_emu_cli_small_model):
# --device cuda runs backend::cuda's kernels on the emulated device; every answer is compared with
# --device cpu on the same model.
#   cli_emu.sh CLOVER MODEL TMPDIR
# Checked: logits (F32 KV, the command's default) within 1e-5 of the CPU's (max |d| / (1 + max |cpu|),
# the measure of cuda/tests/test_model.cu: both backends compute every primitive to a few float ulps);
# greedy ids equal to the CPU's for the AR, diffusion and speculative decoders; --n-cpu-moe 1 gives
# the CPU's ids; generate --parallel 3 gives each sequence's ids alone; bench reports the CUDA backend;
# small synthesized qwen35moe models (F32, Q8_0, Q4_K, Q6_K): logits and greedy ids against the CPU's.
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

# Small synthesized qwen35moe models (attention and GDN layers, MoE with a shared expert): F32
# weights within 1e-4 of the CPU's logits (the issue's bound); Q8_0 and K-quant weights quantise
# their activations, where one code on the other side of a rounding boundary moves a logit by ~1e-2
# (cuda/tests/test_model.cu's diagnosis), so 5e-2 there; greedy ids equal for every type.
rel_of() {
    paste <(od -An -v -f -w4 "$1") <(od -An -v -f -w4 "$2") |
        awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > md) md = d; a = $1 < 0 ? -$1 : $1; if (a > mx) mx = a; n++ }
             END { if (n == 0) print "empty"; else printf "%.3g\n", md / (1 + mx) }'
}
synth_rels=""
for ty in f32 q8_0 q4_k q6_k; do
    m="$tmp/qwen35moe_tiny_$ty.gguf"
    "$clover" gguf synth --arch qwen35moe --preset tiny --type "$ty" --seed 5 -o "$m" > /dev/null 2> "$tmp/err.txt" ||
        fail "gguf synth $ty: $(cat "$tmp/err.txt")"
    for dev in cpu cuda; do
        "$clover" logits -m "$m" --ids 3,14,15,92,65 -o "$tmp/$ty.$dev.f32" --device $dev 2> "$tmp/err.txt" ||
            fail "logits $ty --device $dev: $(cat "$tmp/err.txt")"
    done
    r=$(rel_of "$tmp/$ty.cpu.f32" "$tmp/$ty.cuda.f32")
    bound=5e-2
    [ "$ty" = f32 ] && bound=1e-4
    awk -v r="$r" -v b="$bound" 'BEGIN { exit !(r != "empty" && r + 0 <= b + 0) }' || fail "logits $ty: CUDA differs from the CPU by $r (> $bound)"
    g=(generate -m "$m" --ids 3,14,15,92,65 -n 5 --greedy --ignore-eos)
    c=$("$clover" "${g[@]}" --device cpu 2> "$tmp/err.txt") || fail "generate $ty --device cpu: $(cat "$tmp/err.txt")"
    d=$("$clover" "${g[@]}" --device cuda 2> "$tmp/err.txt") || fail "generate $ty --device cuda: $(cat "$tmp/err.txt")"
    [ "$c" = "$d" ] || fail "generate $ty: greedy ids differ: CPU $c, CUDA $d"
    synth_rels+=" $ty $r"
done

bench=$("$clover" bench -m "$model" -p 4 -n 2 -r 1 --json --device cuda 2> "$tmp/err.txt") || fail "bench --device cuda: $(cat "$tmp/err.txt")"
grep -q '"backend":"CUDA"' <<< "$bench" || fail "bench --device cuda did not report the CUDA backend: $bench"
echo "cli_emu: --device cuda on the emulated device: logits within $rel of the CPU's; greedy ids equal (ar, diffusion, speculative, --n-cpu-moe 1); --parallel 3 equals alone; bench reports CUDA; synthesized qwen35moe (logits rel:$synth_rels) ids equal"
