#!/usr/bin/env bash
# expect_output.sh REGEX COMMAND [ARGS...]: runs the command; passes when it exits 0 AND its
# stdout+stderr match the extended regex (ctest's PASS_REGULAR_EXPRESSION alone ignores the exit
# status, so a crash after the expected line would pass).
set -uo pipefail
re=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then echo "expect_output: '$1' exited with $rc" >&2; exit 1; fi
if ! grep -Eq -- "$re" <<<"$out"; then echo "expect_output: no line of '$1' matches: $re" >&2; exit 1; fi
