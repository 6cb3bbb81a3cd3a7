#!/usr/bin/env bash
# The CUDA backend's checks on the GPU machine, as it is: bare (no compiler, cmake, packages or
# network), given the repository's working tree plus device-bundle/ (carried; built HERE by
# tools/cuda/bundle.sh). It never builds anything. Run from the repository root:
#     bash tools/cuda/device_check.sh          (results under $OUT, default ./out/cuda_check)
# In order: tests_cuda (kernel twins, then the model tests), synthesis of the benchmark models
# with the carried `clover gguf synth` (tiny; a full-width 2-layer Q8_0 model only if it writes
# within its budget), clover_cuda_logits prefill/decode on each. Every step runs under `timeout`
# and the budgets add up to 375 s (410 s with each step's 5 s kill grace), under the 420 s one
# device command may take. Results:
# summary.json (one object per step: name, rc, seconds, detail) and each step's log.
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
    detail=$(grep -E '^\[doctest\] (test cases|assertions)|CUDA +(prefill|decode)|max \||no CUDA device|error' "$OUT/$log" | head -6 | tr '\n' ';')
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

# 1. Kernel twins and host-side checks, then the model tests (doctest's order: by file).
step tests_kernels 100 tests_kernels.log "$BUNDLE/tests_cuda" --duration=true --source-file='*test_kernels*,*test_launch*'
step tests_model 90 tests_model.log "$BUNDLE/tests_cuda" --duration=true --source-file='*test_model*'

# 2. Benchmark models, written by the carried clover (the wide one only if it writes in time).
tiny="$MODELS/tiny.gguf" wide="$MODELS/wide_2l_q8_0.gguf"
[ -s "$tiny" ] || step synth_tiny 10 synth_tiny.log "$BUNDLE/clover" gguf synth --preset tiny -o "$tiny"
[ -s "$wide" ] || step synth_wide 60 synth_wide.log "$BUNDLE/clover" gguf synth --preset clover-35b-a3b --layers 2 \
    --vocab 32768 --type q8_0 -o "$wide" || rm -f "$wide"

# 3. Prefill/decode, CUDA against CPU (max logit difference and timings).
[ -s "$tiny" ] && step bench_tiny 30 bench_tiny.log "$BUNDLE/clover_cuda_logits" "$tiny" --prompt 128 --decode 16
[ -s "$wide" ] && step bench_wide 75 bench_wide.log "$BUNDLE/clover_cuda_logits" "$wide" --prompt 64 --decode 8

write_summary
cat "$OUT/summary.json"
