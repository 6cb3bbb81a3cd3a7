#!/usr/bin/python3
"""Writes benchmarks/data/heldout_prompts.txt: prompts for bench_diffusion from the held-out split
(data.py), never seen in training. Prompt i is the (at most) 64 tokens that end at a line break near the
fixed offset (i * 6151 * 13) mod len(held) -- ending on a line break, as a user's prompt would;
cut after an <|endoftext|> so that a prompt stays inside one file.
One prompt per line, ids separated by spaces; the text of each is in heldout_prompts.jsonl.
Usage: /usr/bin/python3 tools/train/make_prompts.py [N=24]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
from train import TOKEN_CACHE, load_tokens

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    tok = bpe.Tokenizer.load(os.path.join(ROOT, "models", "clover-small", "tokenizer.json"))
    _, held = load_tokens(tok, TOKEN_CACHE)
    eot = tok.special("<|endoftext|>")
    out_dir = os.path.join(ROOT, "benchmarks", "data")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "heldout_prompts.txt"), "w") as f, \
         open(os.path.join(out_dir, "heldout_prompts.jsonl"), "w") as fj:
        for i in range(n):
            end = 64 + (i * 6151 * 13) % (len(held) - 400)
            # move the end forward to just after a token that ends with a line break
            while not tok.decode([int(held[end - 1])]).endswith("\n"):
                end += 1
            ids = [int(x) for x in held[end - 64:end]]
            if eot in ids:  # keep prompts inside one file
                ids = ids[len(ids) - ids[::-1].index(eot):]
            f.write(" ".join(map(str, ids)) + "\n")
            fj.write(json.dumps({"prompt": tok.decode(ids)}) + "\n")


if __name__ == "__main__":
    main()
