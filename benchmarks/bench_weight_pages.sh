#!/usr/bin/env bash
# The weights in 2 MiB pages (clover's default on the CPU, io/huge_pages.hpp) against the same
# weights used in place from the file map (`--mmap`), side by side in one run:
#   * per round, one `clover bench` of each placement per test, the order swapped every round;
#   * tests: pp$P and tg$N of one sequence, and tg${PAR_N}x$K for every K in PARALLEL
#     (K sequences decoding together after ${PAR_P}-token prompts: issue 15's parallel decode);
#   * a markdown table of medians with the ratio huge pages / file map, and of each placement's
#     own N = K / N = 1 aggregate; every raw JSON line in $OUT/weight-pages.jsonl.
#
#   benchmarks/bench_weight_pages.sh MODEL.gguf [MODEL.gguf ...]
#
# Environment (defaults): BUILD=build THREADS=2 ROUNDS=3 P=512 N=128 PARALLEL="1 8" PAR_P=32
# PAR_N=64 OUT=bench-out
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$here/build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
P=${P:-512}
N=${N:-128}
PARALLEL=${PARALLEL-"1 8"}
PAR_P=${PAR_P:-32}
PAR_N=${PAR_N:-64}
OUT=${OUT:-$here/bench-out}
clover=$BUILD/clover
[ -x "$clover" ] || { echo "bench_weight_pages: $clover is not built (cmake --build $BUILD --target clover)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: benchmarks/bench_weight_pages.sh MODEL.gguf [MODEL.gguf ...]" >&2; exit 1; }
for m in "$@"; do [ -f "$m" ] || { echo "bench_weight_pages: no such model file: $m" >&2; exit 1; }; done
mkdir -p "$OUT"
jsonl=$OUT/weight-pages.jsonl
: > "$jsonl"

# One clover bench run; each JSON line gets the placement and round.
run() {  # model placement round args...
    local model=$1 placement=$2 round=$3
    shift 3
    local flag=()
    [ "$placement" = mmap ] && flag=(--mmap)
    "$clover" bench -m "$model" -t "$THREADS" -r 1 --json "${flag[@]}" "$@" 2>/dev/null |
        sed "s/}\$/,\"placement\":\"$placement\",\"round\":$round,\"file\":\"$(basename "$model")\"}/" >> "$jsonl"
}

for model in "$@"; do
    for ((r = 1; r <= ROUNDS; r++)); do
        order="huge mmap"
        ((r % 2 == 0)) && order="mmap huge"
        for pl in $order; do
            echo "round $r/$ROUNDS $(basename "$model") $pl" >&2
            run "$model" "$pl" "$r" -p "$P" -n "$N"
            for k in $PARALLEL; do run "$model" "$pl" "$r" -p 0 -n "$PAR_N" --parallel "$k" --gen-prompt "$PAR_P"; done
        done
    done
done

python3 - "$jsonl" <<'EOF'
import json, statistics, sys, platform
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def cpu():
    try:
        return next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except Exception:
        return platform.processor()
print(f"Machine: {cpu()}, {rows[0]['threads'] if rows else '?'} threads; medians of {max(r['round'] for r in rows) if rows else 0} alternating rounds\n")
print("| model file | test | file map (--mmap) t/s | huge pages t/s | huge / map | map: vs its N=1 | huge: vs its N=1 |")
print("|---|---|---|---|---|---|---|")
med = {}
for r in rows:
    med.setdefault((r["file"], r["test"], r["placement"]), []).append(r["avg_ts"])
files = list(dict.fromkeys(r["file"] for r in rows))
for f in files:
    tests = list(dict.fromkeys(r["test"] for r in rows if r["file"] == f))
    one = next((t for t in tests if t.endswith("x1")), None)
    for t in tests:
        m = statistics.median(med.get((f, t, "mmap"), [0]))
        h = statistics.median(med.get((f, t, "huge"), [0]))
        rel = lambda pl, v: (f"{v / statistics.median(med[(f, one, pl)]):.2f}x" if one and "x" in t and med.get((f, one, pl)) else "")
        print(f"| {f} | {t} | {m:.2f} | {h:.2f} | {h / m if m else 0:.2f}x | {rel('mmap', m)} | {rel('huge', h)} |")
loads = {pl: statistics.median([r["load_s"] for r in rows if r["placement"] == pl]) for pl in ("mmap", "huge") if any(r["placement"] == pl for r in rows)}
print("\nload (median): " + ", ".join(f"{pl} {s:.2f} s" for pl, s in loads.items()))
if any(r["placement"] == "huge" and not r.get("huge_pages") for r in rows):
    print("NOTE: some 'huge' runs fell back to the file map (see clover bench's load line)")
EOF
