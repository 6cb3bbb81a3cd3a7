#!/usr/bin/env bash
# expect_failure.sh [--any-exit] SECONDS REGEX... -- COMMAND...
# Passes when COMMAND exits non-zero in under SECONDS and its output (stdout and stderr) matches
# every REGEX (grep -E). A command that succeeds, hangs (it is stopped at SECONDS) or fails
# without saying the expected words fails. --any-exit: the exit status is not checked (Open MPI's
# mpirun --enable-recovery exits 0 whatever its ranks do). The output is echoed for the test log.
set -u
any_exit=0
if [ "${1:-}" = "--any-exit" ]; then any_exit=1; shift; fi
limit=$1; shift
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do patterns+=("$1"); shift; done
[ $# -gt 0 ] || { echo "expect_failure.sh: no '--' before the command" >&2; exit 2; }
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
timeout --kill-after=5 "$limit" "$@" >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$out"
echo "expect_failure.sh: exit status $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ] && [ "$any_exit" -eq 0 ]; then echo "FAIL: the command succeeded; it should have failed"; exit 1; fi
if [ "$rc" -eq 124 ] || [ "$elapsed_ms" -ge $(( limit * 1000 )) ]; then
    echo "FAIL: the command did not end within ${limit} s (a hang)"; exit 1
fi
for p in "${patterns[@]}"; do
    grep -Eq -- "$p" "$out" || { echo "FAIL: the output does not match: $p"; exit 1; }
done
echo "PASS: failed as expected in ${elapsed_ms} ms"
