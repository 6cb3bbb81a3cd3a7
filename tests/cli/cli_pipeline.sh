#!/usr/bin/env bash
# cli_pipeline.sh MODE CLOVER MODEL TMPDIR NUMPROC_FLAG MPIEXEC [MPIEXEC ARGS...]
# `clover ... --pipeline N` under mpiexec against the same command in one process (registered by
# tests/cli/CMakeLists.txt, one ctest per MODE, when CMake found MPI):
#   logits    the logits file is byte-identical to the one-process run: 2 ranks, 3 ranks with a
#             --layer-split, and a preview pass (--block-ids)
#   generate  greedy ids equal the one-process run's, one prompt and --parallel over several
#   errors    each bad use is one error line (from rank 0 only) and a non-zero exit
#   serve     a completion served by `serve --pipeline 2` equals the one-process server's; after
#             rank 1 is killed (mpiexec --enable-recovery keeps the job), the server answers 503
#             naming stage 1 and /health says so
set -uo pipefail
mode=$1 clover=$2 model=$3 tmp=$4 np=$5
shift 5
mpiexec=("$@")
d="$tmp/$mode"
rm -rf "$d" && mkdir -p "$d" || exit 1
fails=0
bad() {
    echo "cli_pipeline $mode: FAIL: $*" >&2
    fails=$((fails + 1))
}
# mpi N CLOVER ARGS: the command under mpiexec -np N.
mpi() {
    local n=$1
    shift
    "${mpiexec[@]}" "$np" "$n" "$clover" "$@"
}
ids=3,1,4,1,5,9,2,6,5,3,5

case $mode in
logits)
    "$clover" logits -m "$model" --ids $ids -t 1 -o "$d/plain.bin" || bad "plain logits failed"
    mpi 2 logits -m "$model" --ids $ids -t 1 --pipeline 2 -o "$d/p2.bin" || bad "--pipeline 2 failed"
    cmp "$d/plain.bin" "$d/p2.bin" || bad "--pipeline 2 logits differ"
    mpi 3 logits -m "$model" --ids $ids -t 1 --pipeline 3 --layer-split 3,2,3 -o "$d/p3.bin" || bad "--pipeline 3 failed"
    cmp "$d/plain.bin" "$d/p3.bin" || bad "--pipeline 3 --layer-split 3,2,3 logits differ"
    "$clover" logits -m "$model" --ids $ids --block-ids 7,8,9,10 -t 1 -o "$d/plain_pv.bin" || bad "plain preview failed"
    mpi 2 logits -m "$model" --ids $ids --block-ids 7,8,9,10 -t 1 --pipeline 2 -o "$d/p2_pv.bin" || bad "--pipeline 2 preview failed"
    cmp "$d/plain_pv.bin" "$d/p2_pv.bin" || bad "--pipeline 2 preview logits differ"
    [ -s "$d/plain.bin" ] && [ -s "$d/plain_pv.bin" ] || bad "empty logits"
    ;;
generate)
    g=(generate -m "$model" -n 12 --greedy --ignore-eos -t 1)
    plain=$("$clover" "${g[@]}" --ids $ids 2>"$d/plain.err") || bad "plain generate failed"
    p2=$(mpi 2 "${g[@]}" --ids $ids --pipeline 2 2>"$d/p2.err") || bad "--pipeline 2 generate failed"
    [ -n "$plain" ] && [ "$plain" = "$p2" ] || bad "--pipeline 2 ids differ: '$plain' vs '$p2'"
    printf '1,2,3\n9,8,7,6,5\n42\n' >"$d/prompts.txt"
    plain=$("$clover" "${g[@]}" --ids-file "$d/prompts.txt" --parallel 3 2>"$d/plain_par.err") || bad "plain --parallel failed"
    p2=$(mpi 2 "${g[@]}" --ids-file "$d/prompts.txt" --parallel 3 --pipeline 2 2>"$d/p2_par.err") || bad "--pipeline 2 --parallel failed"
    [ "$(wc -l <<<"$plain")" -eq 3 ] && [ "$plain" = "$p2" ] || bad "--parallel --pipeline 2 ids differ: '$plain' vs '$p2'"
    ;;
errors)
    # expect REGEX COMMAND...: non-zero exit, and exactly one "error:" line, which matches.
    expect() {
        local re=$1
        shift
        local out rc
        out=$("$@" 2>&1 </dev/null)
        rc=$?
        local lines
        lines=$(grep -c '^error: ' <<<"$out")
        if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -Eq -- "^error: .*$re" <<<"$out"; then
            bad "expected one error line matching '$re' and a failure (exit $rc, $lines error lines) from: $*"
            printf '%s\n' "$out" >&2
        fi
    }
    l=(logits -m "$model" --ids $ids -t 1 -o "$d/x.bin")
    expect "--layer-split needs --pipeline N" "$clover" "${l[@]}" --layer-split 4,4
    expect "--pipeline 1 is the whole model in one process" "$clover" "${l[@]}" --pipeline 1
    expect "the MPI world has 1 rank; run under mpirun -np 2" mpi 1 "${l[@]}" --pipeline 2
    expect "the MPI world has 3 ranks; run under mpirun -np 2" mpi 3 "${l[@]}" --pipeline 2
    expect "the layer split gives 3 stages but there are 2 ranks" mpi 2 "${l[@]}" --pipeline 2 --layer-split 3,2,3
    expect "bad layer split '4,x'" mpi 2 "${l[@]}" --pipeline 2 --layer-split 4,x
    expect "the layer split adds up to 6 layers but the model has 8" mpi 2 "${l[@]}" --pipeline 2 --layer-split 3,3
    expect "--pipeline runs its stages on the CPU" mpi 2 "${l[@]}" --pipeline 2 --device cuda
    expect "--trace runs one process" mpi 2 bench -m "$model" -t 1 --trace --pipeline 2
    [ -e "$d/x.bin" ] && bad "an output was written"
    ;;
serve)
    # serve_start LOG COMMAND...: starts a server in the background (COMMAND an executable, so
    # that pid is its process: mpiexec, or clover); sets pid, ranks (its children) and port.
    serve_start() {
        local log=$1
        shift
        "$@" >"$d/stdout.txt" 2>"$log" </dev/null &
        pid=$!
        ranks=
        port=
        for _ in $(seq 300); do
            port=$(sed -n 's|.*http://127\.0\.0\.1:\([0-9]*\)/v1.*|\1|p' "$log")
            ranks=$(pgrep -P $pid)
            [ -n "$port" ] && return 0
            kill -0 $pid 2>/dev/null || break
            sleep 0.1
        done
        bad "no server started: $(cat "$log")"
        return 1
    }
    # Stops the server, and kills whatever of it is left after 10 s (never an orphan rank).
    serve_stop() {
        kill -TERM $pid 2>/dev/null
        for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
        kill -KILL $pid $ranks 2>/dev/null
        wait $pid 2>/dev/null
    }
    trap 'kill -KILL ${pid:-} ${ranks:-} 2>/dev/null' EXIT
    body='{"prompt": "The pipeline", "max_tokens": 8, "temperature": 0}'
    ask() { curl -s --max-time 30 -o "$d/answer.json" -w '%{http_code}' -H 'Content-Type: application/json' -d "$body" "http://127.0.0.1:$port/v1/completions"; }
    text() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$d/answer.json"; }
    s=(serve -m "$model" -t 1 --port 0 -q --parallel 2)
    if serve_start "$d/plain.log" "$clover" "${s[@]}"; then
        [ "$(ask)" = 200 ] || bad "plain server: $(cat "$d/answer.json")"
        want=$(text)
        serve_stop
    fi
    if serve_start "$d/p2.log" "${mpiexec[@]}" --enable-recovery "$np" 2 "$clover" "${s[@]}" --pipeline 2; then
        [ "$(ask)" = 200 ] || bad "--pipeline 2 server: $(cat "$d/answer.json")"
        got=$(text)
        [ -n "${want:-}" ] && [ "$got" = "$want" ] || bad "--pipeline 2 answered '$got', one process '${want:-}'"
        # Rank 1: the child of this mpiexec whose MPI rank is 1.
        victim=
        for p in $ranks; do
            tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$p
        done
        if [ -z "$victim" ]; then
            bad "rank 1 not found"
        else
            kill -KILL "$victim"
            sleep 4  # the heartbeats declare a rank silent for 3 s dead
            code=$(ask)
            [ "$code" = 503 ] && grep -q 'stage 1' "$d/answer.json" || bad "after rank 1 died: HTTP $code $(cat "$d/answer.json")"
            code=$(ask)
            [ "$code" = 503 ] && grep -q 'the model cannot run: pipeline: stage 1' "$d/answer.json" ||
                bad "a new request after rank 1 died: HTTP $code $(cat "$d/answer.json")"
            code=$(curl -s --max-time 10 -o "$d/health.json" -w '%{http_code}' "http://127.0.0.1:$port/health")
            [ "$code" = 503 ] && grep -q '"status": *"error"' "$d/health.json" && grep -q 'stage 1' "$d/health.json" ||
                bad "/health after rank 1 died: HTTP $code $(cat "$d/health.json")"
        fi
        serve_stop
    fi
    ;;
*)
    echo "cli_pipeline: unknown mode '$mode'" >&2
    exit 2
    ;;
esac
if [ "$fails" -ne 0 ]; then
    echo "cli_pipeline $mode: $fails check(s) failed" >&2
    exit 1
fi
echo "cli_pipeline $mode: ok"
