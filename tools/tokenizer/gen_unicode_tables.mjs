#!/usr/bin/env node
// Generates include/clover/tokenizer/unicode_data.hpp: the Unicode facts the tokenizer needs
// (general-category classes for the pre-tokenizer, and the NFC data), taken from this node's
// own ICU. Run:  node tools/tokenizer/gen_unicode_tables.mjs > include/clover/tokenizer/unicode_data.hpp
//
// Why node: the project's oracle for token ids is the JavaScript encoder, which splits with JS
// regular expressions (\p{L}, \p{M}, \p{N}, \s) and normalises with String.prototype.normalize.
// Deriving the tables from the same engine makes the C++ tokenizer agree with it on every code
// point, including ones newer than PCRE2's or Debian's Unicode data. The Unicode version used
// is written into the header.
//
// JS does not expose canonical combining classes, so they are recovered from NFD's canonical
// reordering: a mark c has ccc(c) != 0 iff NFD moves it past U+0334 (ccc 1) or U+0345 (ccc 240),
// and the order between two marks is whether NFD swaps them. NFC only ever compares classes
// (and tests them against zero), so dense ranks in the same order are stored instead of the
// published numbers. The script then re-implements NFC from the derived tables and checks it
// against String.prototype.normalize on every code point and on random sequences; it refuses
// to write a header that disagrees.

const MAX = 0x110000;
const isSurrogate = (c) => c >= 0xd800 && c <= 0xdfff;
const S = (c) => String.fromCodePoint(c);
const cps = (s) => Array.from(s, (ch) => ch.codePointAt(0));
const SBase = 0xac00, LBase = 0x1100, VBase = 0x1161, TBase = 0x11a7;
const LCount = 19, VCount = 21, TCount = 28, NCount = VCount * TCount, SCount = LCount * NCount;
const isHangulSyllable = (c) => c >= SBase && c < SBase + SCount;

// ---- general-category classes, as the JS regex engine sees them ----
const reL = /^\p{L}$/u, reM = /^\p{M}$/u, reN = /^\p{N}$/u, reS = /^\s$/u;
const F_L = 1, F_M = 2, F_N = 4, F_WS = 8, F_NFC = 16;
const flags = new Uint8Array(MAX);
for (let c = 0; c < MAX; c++) {
  if (isSurrogate(c)) continue;
  const ch = S(c);
  let f = 0;
  if (reL.test(ch)) f |= F_L;
  if (reM.test(ch)) f |= F_M;
  if (reN.test(ch)) f |= F_N;
  if (reS.test(ch)) f |= F_WS;
  flags[c] = f;
}

// ---- NFC data ----
const decomp = new Map();  // cp -> full canonical decomposition (array of cps), Hangul excluded
for (let c = 0; c < MAX; c++) {
  if (isSurrogate(c) || isHangulSyllable(c)) continue;
  const d = S(c).normalize("NFD");
  if (d !== S(c)) decomp.set(c, cps(d));
}

// Combining classes (as ranks). Only non-decomposable code points occur after decomposition.
const nonzero = [];
for (let c = 0; c < MAX; c++) {
  if (isSurrogate(c) || decomp.has(c) || isHangulSyllable(c)) continue;
  const ch = S(c);
  if (c === 0x0345 || c === 0x0334) { nonzero.push(c); continue; }
  const a = "\u0345" + ch, b = ch + "\u0334";
  if (a.normalize("NFD") !== a || b.normalize("NFD") !== b) nonzero.push(c);
}
const cmp = (x, y) => {
  const xy = S(x) + S(y), yx = S(y) + S(x);
  if (xy.normalize("NFD") === yx) return 1;   // ccc(x) > ccc(y)
  if (yx.normalize("NFD") === xy) return -1;  // ccc(x) < ccc(y)
  return 0;
};
nonzero.sort(cmp);
const ccc = new Map();
let rank = 0;
for (let i = 0; i < nonzero.length; i++) {
  if (i === 0 || cmp(nonzero[i - 1], nonzero[i]) !== 0) rank++;
  ccc.set(nonzero[i], rank);
}
if (rank > 255) throw new Error("too many combining classes");
const cccOf = (c) => ccc.get(c) ?? 0;

// Primary composites: P is stable under NFC and decomposes; its pair is (NFC(rest), last).
const compose = new Map();  // "first,second" -> composite
for (const [p, d] of decomp) {
  if (d.length < 2 || S(p).normalize("NFC") !== S(p)) continue;
  const second = d[d.length - 1];
  const first = cps(String.fromCodePoint(...d.slice(0, -1)).normalize("NFC"));
  if (first.length !== 1 || (S(first[0]) + S(second)).normalize("NFC") !== S(p))
    throw new Error(`cannot recover the pair of U+${p.toString(16)}`);
  compose.set(`${first[0]},${second}`, p);
}
const seconds = new Set([...compose.keys()].map((k) => +k.split(",")[1]));

// Quick-check flag: a code point that is not a safe NFC boundary (ccc != 0, NFC_QC = No, or
// NFC_QC = Maybe because it can combine with what precedes it).
for (let c = 0; c < MAX; c++) {
  if (isSurrogate(c)) continue;
  const unsafe = cccOf(c) !== 0 || S(c).normalize("NFC") !== S(c) || seconds.has(c) ||
                 (c >= VBase && c < VBase + VCount) || (c > TBase && c < TBase + TCount);
  if (unsafe) flags[c] |= F_NFC;
}

// ---- self-check: NFC from these tables against String.prototype.normalize ----
function nfc(input) {
  const d = [];
  for (const c of input) {
    if (isHangulSyllable(c)) {
      const s = c - SBase;
      d.push(LBase + Math.floor(s / NCount), VBase + Math.floor((s % NCount) / TCount));
      if (s % TCount) d.push(TBase + (s % TCount));
    } else if (decomp.has(c)) d.push(...decomp.get(c));
    else d.push(c);
  }
  for (let i = 1; i < d.length; i++) {  // canonical ordering (insertion sort, stable)
    const k = cccOf(d[i]);
    if (k === 0) continue;
    let j = i;
    while (j > 0 && cccOf(d[j - 1]) > k) { [d[j - 1], d[j]] = [d[j], d[j - 1]]; j--; }
  }
  const out = [];
  let starter = -1, lastCcc = 0;
  for (const c of d) {
    const k = cccOf(c);
    if (starter >= 0 && (lastCcc < k || (lastCcc === 0 && out.length - 1 === starter))) {
      const s = out[starter];
      let comp;
      if (s >= LBase && s < LBase + LCount && c >= VBase && c < VBase + VCount)
        comp = SBase + ((s - LBase) * VCount + (c - VBase)) * TCount;
      else if (isHangulSyllable(s) && (s - SBase) % TCount === 0 && c > TBase && c < TBase + TCount)
        comp = s + (c - TBase);
      else comp = compose.get(`${s},${c}`);
      if (comp !== undefined) { out[starter] = comp; continue; }
    }
    if (k === 0) { starter = out.length; lastCcc = 0; } else lastCcc = k;
    out.push(c);
  }
  return out;
}
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
let checked = 0;
for (let c = 0; c < MAX; c++) {
  if (isSurrogate(c)) continue;
  if (!same(nfc([c]), cps(S(c).normalize("NFC")))) throw new Error(`NFC mismatch at U+${c.toString(16)}`);
  checked++;
}
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) >>> 0; return (seed >>> 8) % n; };
const marks = nonzero.concat([...seconds], [0x1161, 0x1175, 0x11a8, 0x11c2]);
const starters = [0x41, 0x61, 0x45, 0x4f, 0x55, 0x3b1, 0x3c9, 0x1100, 0x1112, 0xac00, 0xd7a3, 0x928, 0x915,
                  0x9c7, 0xb47, 0x1025, 0x1b05, 0x11099, 0x1e0a, 0x212b, 0x0344, 0x0f73, 0xfb1d];
for (const p of compose.keys()) starters.push(+p.split(",")[0]);
for (let t = 0; t < 200000; t++) {
  const n = 1 + rnd(6), seq = [];
  for (let i = 0; i < n; i++) seq.push(rnd(3) ? marks[rnd(marks.length)] : starters[rnd(starters.length)]);
  if (!same(nfc(seq), cps(String.fromCodePoint(...seq).normalize("NFC"))))
    throw new Error(`NFC mismatch on [${seq.map((c) => c.toString(16))}]`);
}

// ---- emit ----
const hex = (x) => "0x" + x.toString(16);
function runs(valueOf) {  // [start, value] whenever the value changes, from 0
  const out = [];
  let prev = -1;
  for (let c = 0; c < MAX; c++) {
    const v = valueOf(c);
    if (v !== prev) { out.push([c, v]); prev = v; }
  }
  return out;
}
function emitArray(type, name, items, perLine = 10) {
  const lines = [];
  for (let i = 0; i < items.length; i += perLine) lines.push("    " + items.slice(i, i + perLine).join(", ") + ",");
  return `inline constexpr ${type} ${name}[] = {\n${lines.join("\n")}\n};\n`;
}
const flagRuns = runs((c) => flags[c]);
const cccRuns = runs((c) => cccOf(c));
const decompKeys = [...decomp.keys()].sort((a, b) => a - b);
const decompData = [], decompOffsets = [];
for (const c of decompKeys) {
  decompOffsets.push(decompData.length);
  decompData.push(...decomp.get(c));
}
decompOffsets.push(decompData.length);
const compKeys = [...compose.entries()].map(([k, p]) => { const [a, b] = k.split(",").map(Number); return [BigInt(a) << 21n | BigInt(b), p]; })
  .sort((x, y) => (x[0] < y[0] ? -1 : 1));

let out = "";
out += `#pragma once
// GENERATED by tools/tokenizer/gen_unicode_tables.mjs from the ICU of node ${process.version}
// (Unicode ${process.versions.unicode}). Do not edit: rerun the script.
//
// flag_runs: (start << 8) | flags for each run of code points sharing the same flags; the run
// lasts until the next start. Flags: 1 letter (\\p{L}), 2 mark (\\p{M}), 4 number (\\p{N}),
// 8 white space (ECMAScript \\s), 16 not an NFC boundary (ccc != 0 or NFC_QC != Yes).
// ccc_runs: (start << 8) | rank of the canonical combining class (0 = starter; ranks keep the
// order of the published classes, which is all that NFC uses).
// decomp_keys: code points with a canonical decomposition (Hangul syllables are algorithmic and
// not listed); the full decomposition of decomp_keys[i] is decomp_data[decomp_offsets[i] ..
// decomp_offsets[i + 1]).
// compose_keys / compose_values: (first << 21) | second -> primary composite.
#include <cstdint>

namespace clover::tok::unicode_data {

inline constexpr const char* unicode_version = "${process.versions.unicode}";
inline constexpr unsigned flag_letter = 1, flag_mark = 2, flag_number = 4, flag_space = 8, flag_nfc_unsafe = 16;

`;
out += emitArray("std::uint32_t", "flag_runs", flagRuns.map(([c, v]) => hex(c * 256 + v)));
out += "\n" + emitArray("std::uint32_t", "ccc_runs", cccRuns.map(([c, v]) => hex(c * 256 + v)));
out += "\n" + emitArray("std::uint32_t", "decomp_keys", decompKeys.map(hex), 10);
out += "\n" + emitArray("std::uint16_t", "decomp_offsets", decompOffsets.map(String), 16);
out += "\n" + emitArray("std::uint32_t", "decomp_data", decompData.map(hex), 12);
out += "\n" + emitArray("std::uint64_t", "compose_keys", compKeys.map(([k]) => "0x" + k.toString(16) + "ull"), 6);
out += "\n" + emitArray("std::uint32_t", "compose_values", compKeys.map(([, p]) => hex(p)), 10);
out += "\n}  // namespace clover::tok::unicode_data\n";
process.stdout.write(out);
process.stderr.write(`unicode ${process.versions.unicode}: ${flagRuns.length} flag runs, ${cccRuns.length} ccc runs (${rank} classes), ` +
                     `${decompKeys.length} decompositions (${decompData.length} cps), ${compKeys.length} compositions; ` +
                     `NFC self-check passed on ${checked} code points and 200000 sequences\n`);
