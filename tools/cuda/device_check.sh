#!/usr/bin/env bash
# The CUDA backend's checks on the GPU machine, as it is: bare (no compiler, cmake, packages or
# network), given the repository's working tree plus device-bundle/ (carried; built HERE by
# tools/cuda/bundle.sh). It never builds anything. Run from the repository root:
#     bash tools/cuda/device_check.sh          (results under $OUT, default ./out/cuda_check)
# In order, most important first (a run cut short still reports the early steps):
#   1. tests_cuda: the kernel twins, launch checks, device state pool and primitive twins;
#   2. tests_cuda: the model tests (CUDA vs CPU logits, speculative == AR on the device);
#   3. tests_cuda: the backend conformance table (primitive x segment mix x weight type, CUDA
#      against the CPU backend), the one the emulated device runs in CI;
#   4. compute-sanitizer's four tools (memcheck, racecheck, synccheck, initcheck) over the
#      conformance table's small shapes, when the machine has compute-sanitizer (this project's
#      toolkit has none to carry: the step says "skipped" where it is missing);
#   5. the clover command on the device (cuda/tests/cli_device.sh: greedy ids equal the CPU's,
#      --n-cpu-moe, bench's backend, one read-back per pass in the trace over backend::cuda);
#   6. models written by the carried `clover gguf synth`: tiny, and full-width 2- and 4-layer
#      Q4_K_M files (each only if it writes within its budget);
#   7. `clover bench --device cuda` (issue 16's table): AR pp512 / tg128, the diffusion decoder's
#      tg128, one 32-row preview pass with coreset 16 and without (pv32c16, pv32c0), JSON lines;
#      on the bundled model and on the wide ones;
#   8. the speed goals on the 40-layer shape (AR >= 600 tok/s, a 32-row preview < 2x an AR step),
#      estimated from the 2- and 4-layer files: a step costs head + L x layer, so the per-layer
#      cost is the difference of the two files' times over 2 layers (a 40-layer file, ~20 GB, does
#      not synthesize within the budget); speed_goals.json;
#   9. clover_cuda_logits: CUDA against CPU logits (max difference) and timings, wide.
# Every step runs under `timeout` and the budgets add up to 375 s (each step adds at most 5 s of
# kill grace), under the 420 s one device command may take. Results: summary.json (one object
# per step: name, rc, seconds, detail), each step's log, bench.jsonl (every bench line) and
# speed_goals.json.
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
step tests_kernels 70 tests_kernels.log "$BUNDLE/tests_cuda" --duration=true \
    --source-file='*test_kernels*,*test_launch*,*test_state*,*test_pass*,*test_quant_dot*,*test_defects*,*test_offload*'
step tests_model 45 tests_model.log "$BUNDLE/tests_cuda" --duration=true --source-file='*test_model*'

# 3. The conformance table (cuda/tests/test_conformance.cu) on the real device.
step conformance 25 conformance.log "$BUNDLE/tests_cuda" --duration=true --source-file='*test_conformance*'

# 4. compute-sanitizer over the conformance table's small shapes: each tool's own report (an
#    error summary line with 0 errors, or the kernel, address and thread it names).
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1 || true)
if [ -n "$sanitizer" ]; then
    for tool in memcheck racecheck synccheck initcheck; do
        step "sanitizer_$tool" 10 "sanitizer_$tool.log" "$sanitizer" --tool "$tool" --error-exitcode 3 \
            "$BUNDLE/tests_cuda" --source-file='*test_conformance*' --test-case='*small shapes*'
    done
else
    steps+=("{\"name\": \"sanitizers\", \"rc\": \"skipped\", \"detail\": \"compute-sanitizer is not on this machine (and this project's toolkit has none to carry)\"}")
    write_summary
    echo "sanitizers: skipped: no compute-sanitizer on this machine"
fi

# 5. The clover command on the device.
step cli_device 20 cli_device.log bash cuda/tests/cli_device.sh "$BUNDLE/clover" "$MODELS"

# 6. Benchmark models, written by the carried clover (the wide ones only if they write in time).
tiny="$MODELS/tiny.gguf" wide="$MODELS/wide_2l_q4_k_m.gguf" wide4="$MODELS/wide_4l_q4_k_m.gguf"
[ -s "$tiny" ] || step synth_tiny 10 synth_tiny.log "$BUNDLE/clover" gguf synth --preset tiny -o "$tiny"
[ -s "$wide" ] || step synth_wide 35 synth_wide.log "$BUNDLE/clover" gguf synth --preset clover-35b-a3b --layers 2 \
    --type q4_k_m -o "$wide" || rm -f "$wide"
[ -s "$wide4" ] || step synth_wide4 40 synth_wide4.log "$BUNDLE/clover" gguf synth --preset clover-35b-a3b --layers 4 \
    --type q4_k_m -o "$wide4" || rm -f "$wide4"

# 7. clover bench on the device: AR, the diffusion decoder, one preview pass with and without
#    the coreset. One JSON line per test into bench.jsonl (the step's log keeps stderr too).
bench_all() {
    local model=$1 reps=$2
    "$BUNDLE/clover" bench --device cuda -m "$model" -p 512 -n 128 -r "$reps" --json &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 128 -r "$reps" --json --decoder diffusion &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 0 -r "$reps" --json --preview 32 --coreset 16 &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 0 -r "$reps" --json --preview 32 --coreset 0
}
bench_speed() {  # what the speed goals need: the AR step and the 32-row preview with the coreset
    local model=$1 reps=$2
    "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 128 -r "$reps" --json &&
        "$BUNDLE/clover" bench --device cuda -m "$model" -p 0 -n 0 -r "$reps" --json --preview 32 --coreset 16
}
export BUNDLE
export -f bench_all bench_speed
bench_step() {  # bench_step NAME BUDGET MODEL REPS [FUNCTION]
    step "$1" "$2" "$1.log" bash -c "${5:-bench_all}"' "$0" "$1"' "$3" "$4"
    grep -h '^{"engine"' "$OUT/$1.log" | sed "s|^{|{\"step\":\"$1\",|" >> "$OUT/bench.jsonl"
}
: > "$OUT/bench.jsonl"
bench_step bench_bundled 15 models/clover-small.gguf 3
[ -s "$wide" ] && bench_step bench_wide 35 "$wide" 3
[ -s "$wide4" ] && bench_step bench_wide4 20 "$wide4" 3 bench_speed

# 8. The speed goals at 40 layers, from the 2- and 4-layer files' ms per pass.
ms_of() {  # ms_of STEP TEST: ms_per_pass of one bench line
    grep "\"step\":\"$1\"" "$OUT/bench.jsonl" | grep "\"test\":\"$2\"" | sed -E 's/.*"ms_per_pass":([0-9.]+).*/\1/' | head -1
}
tg2=$(ms_of bench_wide tg128) tg4=$(ms_of bench_wide4 tg128) pv2=$(ms_of bench_wide pv32c16) pv4=$(ms_of bench_wide4 pv32c16)
if [ -n "$tg2" ] && [ -n "$tg4" ] && [ -n "$pv2" ] && [ -n "$pv4" ]; then
    awk -v tg2="$tg2" -v tg4="$tg4" -v pv2="$pv2" -v pv4="$pv4" 'BEGIN {
        tgl = (tg4 - tg2) / 2; pvl = (pv4 - pv2) / 2
        tg40 = tg2 + 38 * tgl; pv40 = pv2 + 38 * pvl
        ar = 1000 / tg40; ratio = pv40 / tg40
        printf "{\"ar_ms_per_step_40l\": %.4f, \"ar_tok_s_40l\": %.1f, \"ar_goal_tok_s\": 600, \"ar_met\": %s, ", tg40, ar, (ar >= 600 ? "true" : "false")
        printf "\"preview32_ms_40l\": %.4f, \"preview_over_ar\": %.3f, \"preview_goal_ratio\": 2, \"preview_met\": %s, ", pv40, ratio, (ratio < 2 ? "true" : "false")
        printf "\"per_layer_ms\": {\"ar\": %.4f, \"preview32\": %.4f}, \"from\": \"2- and 4-layer Q4_K_M files, linear in layers\"}\n", tgl, pvl
    }' > "$OUT/speed_goals.json"
    steps+=("{\"name\": \"speed_goals\", \"rc\": 0, \"detail\": $(json_str "$(cat "$OUT/speed_goals.json")")}")
else
    steps+=("{\"name\": \"speed_goals\", \"rc\": 1, \"detail\": \"a bench line of the 2- or 4-layer file is missing\"}")
fi
write_summary

# 9. Prefill/decode, CUDA against CPU (max logit difference and timings).
[ -s "$wide" ] && step logits_wide 20 logits_wide.log "$BUNDLE/clover_cuda_logits" "$wide" --prompt 64 --decode 8

write_summary
cat "$OUT/summary.json"
