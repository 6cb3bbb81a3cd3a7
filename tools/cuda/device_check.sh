#!/usr/bin/env bash
# The CUDA backend's checks on the GPU machine, as it is: bare (no compiler, cmake, packages or
# network), given the repository's working tree plus device-bundle/ (carried; built HERE by
# tools/cuda/bundle.sh). It never builds anything. Run from the repository root:
#     bash tools/cuda/device_check.sh          (results under $OUT, default ./out/cuda_check)
# In order, most important first (a run cut short still reports the early steps):
#   1. tests_cuda: the kernel twins, launch checks, device state pool and primitive twins;
#   2. tests_cuda: the model tests (CUDA vs CPU logits, speculative == AR on the device);
#   3. the clover command on the device (cuda/tests/cli_device.sh: greedy ids equal the CPU's,
#      --n-cpu-moe, bench's backend, one read-back per pass in the trace over backend::cuda);
#   4. models written by the carried `clover gguf synth`: tiny, and a full-width 2-layer Q4_K_M
#      file (only if it writes within its budget);
#   5. `clover bench --device cuda` (issue 16's table): AR pp512 / tg128, the diffusion decoder's
#      tg128, one 32-row preview pass with coreset 16 and without (pv32c16, pv32c0), JSON lines;
#      on the bundled model and on the wide one;
#   6. clover_cuda_logits: CUDA against CPU logits (max difference) and timings, tiny and wide.
# Every step runs under `timeout` and the budgets add up to 360 s (405 s with each step's 5 s
# kill grace, 415 s with nvidia-smi's 10 s), under the 420 s one device command may take. Results: summary.json (one object
# per step: name, rc, seconds, detail), each step's log, and bench.jsonl (every bench line).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/out/cuda_check}"
BUNDLE="$PWD/device-bundle"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BUNDLE${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
MODELS="${TMPDIR:-/tmp}/clover-device-models"
mkdir -p "$MODELS"

steps=()  # JSON objects, one per step
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/ }; s=${s//$'\t'/ }; printf '"%s"' "$s"; }
write_summary() {
    { printf '{\n  "gpu": %s,\n  "steps": [\n' "$(json_str "${gpu:-unknown}")"
      local i
      for i in "${!steps[@]}"; do printf '    %s%s\n' "${steps[$i]}" "$([ "$i" -lt $((${#steps[@]} - 1)) ] && echo ,)"; done
      printf '  ]\n}\n'; } > "$OUT/summary.json"
}
# step NAME BUDGET_S LOG CMD...: runs CMD under timeout, appends its record, returns its rc.
step() {
    local name=$1 budget=$2 log=$3; shift 3
    local t0 rc
    t0=$(date +%s.%N)
    timeout --kill-after=5 "$budget" "$@" > "$OUT/$log" 2>&1
    rc=$?
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    local detail
    detail=$(grep -E '^\[doctest\] (test cases|assertions)|CUDA +(prefill|decode)|max \||no CUDA device|error|^cli_device|"test":"[a-z0-9]+","n_prompt"' "$OUT/$log" |
             sed -E 's/.*"test":"([a-z0-9]+)".*"avg_ts":([0-9.]+).*"tokens_per_pass":([0-9.e+-]+).*"ms_per_pass":([0-9.]+).*/\1 \2 t\/s, \3 tok\/pass, \4 ms\/pass/' |
             head -8 | tr '\n' ';')
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && detail="timed out after ${budget} s; $detail"
    steps+=("{\"name\": $(json_str "$name"), \"rc\": $rc, \"seconds\": $secs, \"budget_s\": $budget, \"log\": $(json_str "$log"), \"detail\": $(json_str "$detail")}")
    write_summary
    echo "$name: rc=$rc ${secs}s $detail"
    return $rc
}

for b in tests_cuda clover_cuda_logits clover; do
    [ -x "$BUNDLE/$b" ] || { echo "device_check: $BUNDLE/$b missing: run tools/cuda/bundle.sh here, then carry device-bundle" >&2
                             steps+=("{\"name\": \"bundle\", \"rc\": 1, \"detail\": $(json_str "$b missing from device-bundle")}")
                             write_summary; exit 1; }
done

# tests_cuda writes its synthesized models under the folder compiled into it (bundle.sh notes it).
[ -s "$BUNDLE/test_tmp_dir.txt" ] && mkdir -p "$(cat "$BUNDLE/test_tmp_dir.txt")"

gpu=$(timeout 10 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
echo "gpu: $gpu"
write_summary

# 1-2. Kernel and primitive twins and host-side checks, then the model tests (doctest's order).
step tests_kernels 100 tests_kernels.log "$BUNDLE/tests_cuda" --duration=true \
    --source-file='*test_kernels*,*test_launch*,*test_state*,*test_pass*,*test_quant_dot*'
step tests_model 70 tests_model.log "$BUNDLE/tests_cuda" --duration=true --source-file='*test_model*'

# 3. The clover command on the device.
step cli_device 20 cli_device.log bash cuda/tests/cli_device.sh "$BUNDLE/clover" "$MODELS"

# 4. Benchmark models, written by the carried clover (the wide one only if it writes in time).
tiny="$MODELS/tiny.gguf" wide="$MODELS/wide_2l_q4_k_m.gguf"
[ -s "$tiny" ] || step synth_tiny 10 synth_tiny.log "$BUNDLE/clover" gguf synth --preset tiny -o "$tiny"
[ -s "$wide" ] || step synth_wide 40 synth_wide.log "$BUNDLE/clover" gguf synth --preset clover-35b-a3b --layers 2 \
    --type q4_k_m -o "$wide" || rm -f "$wide"

# 5. clover bench on the device: AR, the diffusion decoder, one preview pass with and without
#    the coreset. One JSON line per test into bench.jsonl (the step's log keeps stderr too).
bench_all() {
    local model=$1 reps=$2
    "$BUNDLE/clover" bench --device cuda -m "$model" -p 512 -n 128 -r "$reps" --json &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 128 -r "$reps" --json --decoder diffusion &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 0 -r "$reps" --json --preview 32 --coreset 16 &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 0 -r "$reps" --json --preview 32 --coreset 0
}
export BUNDLE
export -f bench_all
bench_step() {  # bench_step NAME BUDGET MODEL REPS
    step "$1" "$2" "$1.log" bash -c 'bench_all "$0" "$1"' "$3" "$4"
    grep -h '^{"engine"' "$OUT/$1.log" | sed "s|^{|{\"step\":\"$1\",|" >> "$OUT/bench.jsonl"
}
: > "$OUT/bench.jsonl"
bench_step bench_bundled 20 models/clover-small.gguf 3
[ -s "$wide" ] && bench_step bench_wide 45 "$wide" 3

# 6. Prefill/decode, CUDA against CPU (max logit difference and timings).
[ -s "$tiny" ] && step logits_tiny 20 logits_tiny.log "$BUNDLE/clover_cuda_logits" "$tiny" --prompt 128 --decode 16
[ -s "$wide" ] && step logits_wide 35 logits_wide.log "$BUNDLE/clover_cuda_logits" "$wide" --prompt 64 --decode 8

write_summary
cat "$OUT/summary.json"
