#!/usr/bin/env bash
# clover vs llama.cpp v0.5.0 (the prebuilt CPU libraries of @node-llama-cpp/linux-x64@3.22.1,
# driven by tools/llama_bench_peer) on the same GGUF files, side by side in one run:
#   * pp512 and tg128 tokens/s per engine and thread count; the two engines ALTERNATE (one
#     invocation each per round, the order swapped every round), ROUNDS rounds, medians;
#   * this machine's memory read bandwidth (membw at the start, after every round and at the
#     end; the best per thread count)
#     and each engine's share of the generation roofline BW / (weight bytes per token);
#   * a markdown table on stdout (and every raw JSON line in $OUT/results.jsonl).
#
#   benchmarks/bench_cpu_vs_llama.sh [MODEL.gguf ...]
#
# Without models it synthesizes the two of the README (real Clover-35B-A3B dimensions, $LAYERS
# layers, $TYPES) into $MODELS_DIR once. Environment (defaults):
#   LAYERS=8  TYPES="q8_0 q4_k_m"  (benchmarks/bench_full_size.sh: LAYERS=40, the real model)
#   LLAMA_WARM=0   1: read the file into the page cache before each llama.cpp run (untimed)
#   BUILD=build  THREADS="1 2"  ROUNDS=3  P=512  N=128  OUT=bench-out  MODELS_DIR=bench-models
#   LLAMA_POLL=0   llama.cpp's threadpool polling level. Its default (50) spin-waits, and on this
#                  shared 2-core machine that made -t 2 several times slower than -t 1 (measured:
#                  pp64 27 vs 117 t/s with poll 0), so llama.cpp gets its best setting here.
#   LLAMA_ARGS=""  extra llama_bench_peer flags (e.g. --no-repack, -ctk f32)
#   CLOVER_ARGS="" extra clover bench flags
#   PARALLEL="1 2 4 8"  parallel decode: N sequences after PAR_P-token prompts, PAR_N steps of N
#                  rows (llama.cpp: one llama_batch of N rows per step, llama-batched-bench's
#                  method; clover: one pass over N segments); aggregate t/s. "" skips it.
#   PAR_P=32 PAR_N=64
#   BASE_CLOVER=""  a clover binary of an earlier commit: its pp/tg run in the same rounds
#                  (engine "clover-base"), for the "not slower than before" check
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$here/build}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
P=${P:-512}
N=${N:-128}
OUT=${OUT:-$here/bench-out}
MODELS_DIR=${MODELS_DIR:-$here/bench-models}
LLAMA_POLL=${LLAMA_POLL:-0}
LLAMA_ARGS=${LLAMA_ARGS:-}
CLOVER_ARGS=${CLOVER_ARGS:-}
PARALLEL=${PARALLEL-"1 2 4 8"}
PAR_P=${PAR_P:-32}
PAR_N=${PAR_N:-64}
BASE_CLOVER=${BASE_CLOVER:-}
LAYERS=${LAYERS:-8}
LLAMA_WARM=${LLAMA_WARM:-0}
TYPES=${TYPES:-"q8_0 q4_k_m"}
clover=$BUILD/clover
peer=$BUILD/llama_bench_peer
membw=$BUILD/membw
for b in "$clover" "$peer" "$membw"; do
    [ -x "$b" ] || { echo "bench: $b not built (cmake --build $BUILD --target clover_cli llama_bench_peer membw)" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "bench: python3 is needed for the summary" >&2; exit 1; }
mkdir -p "$OUT"
models=("$@")
if [ ${#models[@]} -eq 0 ]; then
    mkdir -p "$MODELS_DIR"
    for ty in $TYPES; do
        f=$MODELS_DIR/clover-35b-a3b-L$LAYERS-$ty.gguf
        if [ ! -f "$f" ]; then
            echo "bench: synthesizing $f" >&2
            "$clover" gguf synth --arch qwen35moe --preset clover-35b-a3b --layers "$LAYERS" --type $ty -o "$f" >&2
        fi
        models+=("$f")
    done
fi
res=$OUT/results.jsonl
: > "$res"
echo "bench: $(date -u +%FT%TZ) $(uname -n), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# Memory bandwidth first (and again at the end: the machine is shared; the best counts).
"$membw" -t "$(echo $THREADS | tr ' ' ',')" -r 7 --mib 2048 --json | sed 's/^{/{"phase":"start",/' >> "$res"
for m in "${models[@]}"; do
    for t in $THREADS; do
        for r in $(seq 1 "$ROUNDS"); do
            run_llama() {
                # llama.cpp maps the file: with LLAMA_WARM=1 its pages are read into the page
                # cache first (untimed), so its timed runs never wait on the disk — clover's copy
                # of a file that nearly fills memory drops the file's cache behind it.
                [ "$LLAMA_WARM" = 1 ] && cat "$m" > /dev/null
                "$peer" -m "$m" -p "$P" -n "$N" -t "$t" -r 1 --poll "$LLAMA_POLL" --json $LLAMA_ARGS |
                    sed "s|^{|{\"file\":\"$m\",\"round\":$r,|" >> "$res"
            }
            run_clover() {
                "$clover" bench -m "$m" -p "$P" -n "$N" -t "$t" -r 1 --json $CLOVER_ARGS |
                    sed "s|^{|{\"file\":\"$m\",\"round\":$r,|" >> "$res"
            }
            run_base() {
                [ -n "$BASE_CLOVER" ] || return 0
                "$BASE_CLOVER" bench -m "$m" -p "$P" -n "$N" -t "$t" -r 1 --json $CLOVER_ARGS |
                    sed "s|^{|{\"file\":\"$m\",\"round\":$r,|; s|\"engine\":\"clover\"|\"engine\":\"clover-base\"|" >> "$res"
            }
            if [ $((r % 2)) -eq 1 ]; then run_llama; run_clover; run_base; else run_base; run_clover; run_llama; fi
            for np in $PARALLEL; do
                run_llama_par() {
                    [ "$LLAMA_WARM" = 1 ] && cat "$m" > /dev/null
                    "$peer" -m "$m" -p 0 -n "$PAR_N" -t "$t" -r 1 --poll "$LLAMA_POLL" --parallel "$np" --parallel-prompt "$PAR_P" --json $LLAMA_ARGS |
                        sed "s|^{|{\"file\":\"$m\",\"round\":$r,|" >> "$res"
                }
                run_clover_par() {
                    "$clover" bench -m "$m" -p 0 -n "$PAR_N" -t "$t" -r 1 --parallel "$np" --parallel-prompt "$PAR_P" --json $CLOVER_ARGS |
                        sed "s|^{|{\"file\":\"$m\",\"round\":$r,|" >> "$res"
                }
                if [ $((r % 2)) -eq 1 ]; then run_llama_par; run_clover_par; else run_clover_par; run_llama_par; fi
            done
            # the bandwidth again every round: on a shared machine a single measurement at the
            # start once read 14.8 GB/s while clover's generation in the same run sustained 20,
            # and one 5-round run read anything from 17.8 to 33.8 GB/s. The summary gives both
            # the share of the best reading and the median share of the same round's reading.
            "$membw" -t "$t" -r 3 --mib 2048 --json | sed "s|^{|{\"phase\":\"round\",\"file\":\"$m\",\"round\":$r,|" >> "$res"
            echo "bench: $(basename "$m") t=$t round $r/$ROUNDS done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
        done
    done
done
"$membw" -t "$(echo $THREADS | tr ' ' ',')" -r 7 --mib 2048 --json | sed 's/^{/{"phase":"end",/' >> "$res"

python3 - "$res" "$P" "$N" "$PAR_N" <<'EOF'
import json, statistics, sys, os
path, P, N, PAR_N = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(path) if l.strip()]
bw = {}
for r in rows:
    if r.get("test") == "membw_read":
        bw[r["threads"]] = max(bw.get(r["threads"], 0), r["best_gbs"])
round_bw = {(r["file"], r["threads"], r["round"]): r["best_gbs"] for r in rows
            if r.get("test") == "membw_read" and r.get("phase") == "round"}
runs = [r for r in rows if r.get("test", "").startswith(("pp", "tg"))]
gen_bytes = {}
for r in runs:
    if r["engine"] == "clover": gen_bytes[r["file"]] = r["gen_bytes_per_token"]
key = lambda r: (r["file"], r["threads"], r["test"], r["engine"])
groups = {}
for r in runs: groups.setdefault(key(r), []).extend(r["samples_ts"])
variant = next((r.get("cpu_variant") for r in runs if r["engine"] == "llama.cpp"), "?")
isa = next((r.get("isa") for r in runs if r["engine"] == "clover"), "?")
by_round = {}  # (file, threads, test, round) -> {engine: t/s}
for r in runs:
    if "round" in r: by_round.setdefault((r["file"], r["threads"], r["test"], r["round"]), {})[r["engine"]] = r["samples_ts"][0]
print("| model | threads | test | llama.cpp t/s | clover t/s | clover / llama.cpp | same-round ratio (median) "
      "| roofline t/s | llama.cpp % | clover % | llama.cpp % of same round | clover % of same round |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
files = sorted({r["file"] for r in runs})
for f in files:
    for t in sorted({r["threads"] for r in runs if r["file"] == f}):
        for test in (f"pp{P}", f"tg{N}"):
            l = groups.get((f, t, test, "llama.cpp"), []); c = groups.get((f, t, test, "clover"), [])
            if not l or not c: continue
            ml, mc = statistics.median(l), statistics.median(c)
            pairs = [(v["llama.cpp"], v["clover"], k[3]) for k, v in by_round.items()
                     if k[:3] == (f, t, test) and len(v) == 2]
            ratio = f"{statistics.median(cv / lv for lv, cv, _ in pairs):.2f}x" if pairs else ""
            roof = lshare = cshare = lround = cround = ""
            if test.startswith("tg") and f in gen_bytes and bw.get(t):
                rt = bw[t] * 1e9 / gen_bytes[f]
                roof, lshare, cshare = f"{rt:.1f}", f"{100 * ml / rt:.0f}%", f"{100 * mc / rt:.0f}%"
                # engine GB/s over the bandwidth measured right after that round's two runs
                sh = [(lv * gen_bytes[f] / 1e9 / round_bw[(f, t, k)], cv * gen_bytes[f] / 1e9 / round_bw[(f, t, k)])
                      for lv, cv, k in pairs if (f, t, k) in round_bw]
                if sh:
                    lround = f"{100 * statistics.median(x for x, _ in sh):.0f}%"
                    cround = f"{100 * statistics.median(y for _, y in sh):.0f}%"
            name = os.path.basename(f).replace(".gguf", "")
            print(f"| {name} | {t} | {test} | {ml:.2f} (n={len(l)}) | {mc:.2f} (n={len(c)}) | {mc / ml:.2f}x | {ratio} "
                  f"| {roof} | {lshare} | {cshare} | {lround} | {cround} |")
print()
print(f"llama.cpp CPU variant: {variant}; clover kernels: {isa}; medians of per-run t/s.")
print("memory read bandwidth (membw, best): " + ", ".join(f"{t} thread(s) {b:.1f} GB/s" for t, b in sorted(bw.items()))
      + "; roofline = that bandwidth / weight bytes per generated token (" +
      ", ".join(f"{os.path.basename(f).replace('.gguf', '')} {gen_bytes[f] / 1e6:.0f} MB" for f in files if f in gen_bytes) + ")")

# Single sequence against an earlier clover build (BASE_CLOVER), same rounds.
base = [k for k in groups if k[3] == "clover-base"]
if base:
    print()
    print("| model | threads | test | clover (earlier commit) t/s | clover t/s | ratio | same-round ratio (median) |")
    print("|---|---|---|---|---|---|---|")
    for (f, t, test, _) in sorted(base):
        b, c = groups[(f, t, test, "clover-base")], groups.get((f, t, test, "clover"), [])
        if not c: continue
        pairs = [v["clover"] / v["clover-base"] for k, v in by_round.items() if k[:3] == (f, t, test) and "clover" in v and "clover-base" in v]
        print(f"| {os.path.basename(f).replace('.gguf', '')} | {t} | {test} | {statistics.median(b):.2f} | {statistics.median(c):.2f} "
              f"| {statistics.median(c) / statistics.median(b):.2f}x | {statistics.median(pairs):.2f}x |")

# Parallel decode: N sequences together, aggregate t/s.
par = sorted({(k[0], k[1], k[2]) for k in groups if k[2].startswith(f"tg{PAR_N}x")})
if par:
    print()
    print("| model | threads | sequences | llama.cpp t/s | clover t/s | clover / llama.cpp | same-round ratio (median) | clover vs its N=1 |")
    print("|---|---|---|---|---|---|---|---|")
    for (f, t, test) in sorted(par, key=lambda x: (x[0], x[1], int(x[2].split("x")[1]))):
        l, c = groups.get((f, t, test, "llama.cpp"), []), groups.get((f, t, test, "clover"), [])
        if not l or not c: continue
        one = groups.get((f, t, f"tg{PAR_N}x1", "clover"), [])
        pairs = [v["clover"] / v["llama.cpp"] for k, v in by_round.items() if k[:3] == (f, t, test) and len(v) == 2]
        scale = f"{statistics.median(c) / statistics.median(one):.2f}x" if one else ""
        print(f"| {os.path.basename(f).replace('.gguf', '')} | {t} | {test.split('x')[1]} | {statistics.median(l):.2f} | "
              f"{statistics.median(c):.2f} | {statistics.median(c) / statistics.median(l):.2f}x | "
              f"{statistics.median(pairs):.2f}x | {scale} |")

# Load time, resident memory and page faults in the timed runs (medians over the rounds; clover
# reports faults and RSS, llama_bench_peer its load seconds). A steady decode of weights that fit
# in memory takes no faults (issue 41).
loads = [r for r in runs if "load_s" in r]
if loads:
    print()
    print("| model | engine | test | load s | resident MiB | page faults in the timed runs (minor / major) "
          "| in a steady decode (second half of tg) |")
    print("|---|---|---|---|---|---|---|")
    for (f, test, eng) in sorted({(r["file"], r["test"], r["engine"]) for r in loads}):
        sel = [r for r in loads if (r["file"], r["test"], r["engine"]) == (f, test, eng)]
        med = lambda k: statistics.median([r[k] for r in sel]) if all(k in r for r in sel) else None
        ld, rss, fmin, fmaj = med("load_s"), med("rss_mib"), med("faults_minor"), med("faults_major")
        smin, smaj = med("steady_faults_minor"), med("steady_faults_major")
        print(f"| {os.path.basename(f).replace('.gguf', '')} | {eng} | {test} | {ld:.2f} | "
              f"{'' if rss is None else f'{rss:.0f}'} | {'' if fmin is None else f'{fmin:.0f} / {fmaj:.0f}'} | "
              f"{'' if smin is None else f'{smin:.0f} / {smaj:.0f}'} |")
EOF
