#!/usr/bin/env bash
# Runs the libFuzzer targets for a bounded time each, over their seed corpora, under ASan+UBSan,
# and prints per target: executions, exec/s, coverage (cov: edges, ft: features), corpus size,
# peak RSS. Exits non-zero when any target crashes, leaks, hangs, runs out of memory, or fails
# to start. See README.md here.
#
#   tests/fuzz/run.sh [SECONDS [TARGET...]]     default: 30 s, every target
#
# Environment:
#   FUZZ_BUILD    build folder of the `fuzz` preset (default: build-fuzz)
#   FUZZ_OUT      where logs, new corpus units and crash inputs go (default: $FUZZ_BUILD/fuzz-out;
#                 emptied first)
#   FUZZ_JOBS     targets run at once (default 1; each target is one process on one core)
#   FUZZ_RSS_MB   memory limit per target, also the largest single allocation (default 2048)
#   FUZZ_TIMEOUT  seconds one input may run before it counts as a hang (default 10; a machine
#                 busy with other work starves the fuzzer: a 0.7 s input once "hung" for 10 s
#                 while a build ran beside a niced run)
#   FUZZ_SEED     libFuzzer's -seed (default: random). CI sets one so that a local run of the same
#                 commit with the same seed walks the same mutations (one process per target), and
#                 a CI failure can be replayed; a random seed explores more and is for local runs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seconds="${1:-30}"
shift || true
all_targets="gguf safetensors hf_index hf_config tokenizer_json tokenizer chat_parse server_request"
targets="${*:-$all_targets}"
build="${FUZZ_BUILD:-$root/build-fuzz}"
out="${FUZZ_OUT:-$build/fuzz-out}"
jobs="${FUZZ_JOBS:-1}"
rss="${FUZZ_RSS_MB:-2048}"
hang="${FUZZ_TIMEOUT:-10}"
seed=()
[ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")

case "$seconds" in ''|*[!0-9]*) echo "run.sh: SECONDS must be a whole number (got '$seconds')" >&2; exit 2 ;; esac
for t in $targets; do
    [ -x "$build/tests/fuzz/fuzz_$t" ] || { echo "run.sh: $build/tests/fuzz/fuzz_$t is missing: build the fuzz preset first (cmake --workflow --preset fuzz)" >&2; exit 2; }
done
case "$(realpath -m "$out")" in /|"$root"|"$HOME"|"$here") echo "run.sh: FUZZ_OUT=$out would be emptied; pick a folder of its own" >&2; exit 2 ;; esac
rm -rf "$out" && mkdir -p "$out"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Reports with file:line need llvm-symbolizer (Debian: llvm-16; any version reads clang 16's DWARF 5).
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ]; then
    for s in llvm-symbolizer-16 llvm-symbolizer llvm-symbolizer-14; do
        command -v "$s" >/dev/null 2>&1 && { export ASAN_SYMBOLIZER_PATH="$(command -v "$s")"; break; }
    done
fi

run_one() {
    local t="$1" dir="$out/$1"
    mkdir -p "$dir/corpus" "$dir/tmp"
    local dict=()
    [ -f "$here/dict/$t.dict" ] && dict=(-dict="$here/dict/$t.dict")
    # New units go to the first corpus folder (ours, not the committed seeds); crash inputs to
    # -artifact_prefix. -timeout: one input running longer than FUZZ_TIMEOUT s is a hang.
    CLOVER_FUZZ_TMP="$dir/tmp" "$build/tests/fuzz/fuzz_$t" "$dir/corpus" "$here/corpus/$t" "${dict[@]}" "${seed[@]}" \
        -max_total_time="$seconds" -rss_limit_mb="$rss" -malloc_limit_mb="$rss" -timeout="$hang" \
        -print_final_stats=1 -artifact_prefix="$dir/" > "$dir/log" 2>&1
    echo $? > "$dir/rc"
    rm -rf "$dir/tmp"
}

running=0
for t in $targets; do
    echo "fuzz: $t for ${seconds}s"
    if [ "$jobs" -gt 1 ]; then
        run_one "$t" &
        running=$((running + 1))
        if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    else
        run_one "$t"
    fi
done
wait

failed=0
printf '\n%-15s %-8s %12s %9s %7s %7s %7s %8s\n' target result execs exec/s cov ft corpus rss_mb
for t in $targets; do
    dir="$out/$t"
    rc="$(cat "$dir/rc" 2>/dev/null || echo 99)"
    final_stat() { grep -o "^stat::$1: *[0-9]*" "$dir/log" | tail -1 | grep -o '[0-9]*$'; }
    last="$(grep -E '^#[0-9]+.*cov: [0-9]+ ft: [0-9]+' "$dir/log" | tail -1)"
    cov="$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*')"
    ft="$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*')"
    corp="$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*')"
    result=ok
    [ "$rc" = 0 ] || { result=FAILED; failed=1; }
    printf '%-15s %-8s %12s %9s %7s %7s %7s %8s\n' "$t" "$result" "$(final_stat number_of_executed_units)" \
        "$(final_stat average_exec_per_sec)" "${cov:--}" "${ft:--}" "${corp:--}" "$(final_stat peak_rss_mb)"
done

for t in $targets; do
    dir="$out/$t"
    [ "$(cat "$dir/rc" 2>/dev/null || echo 99)" = 0 ] && continue
    echo
    echo "==== fuzz_$t failed (exit $(cat "$dir/rc" 2>/dev/null)); the end of $dir/log:"
    grep -v -E '^#[0-9]+ +(NEW|REDUCE|pulse|INITED)' "$dir/log" | tail -60
    for a in "$dir"/crash-* "$dir"/leak-* "$dir"/oom-* "$dir"/timeout-* "$dir"/slow-unit-*; do
        [ -f "$a" ] || continue
        echo "---- input $a ($(stat -c %s "$a") bytes; reproduce: $build/tests/fuzz/fuzz_$t $a)"
        # Inputs up to 16 KiB in the log too, so a CI failure can be reproduced from the log alone
        # (a 4,292-byte tokenizer.json once was not, at a 4 KiB limit).
        [ "$(stat -c %s "$a")" -le 16384 ] && { echo "base64:"; base64 -w 76 "$a"; }
    done
done
exit "$failed"
