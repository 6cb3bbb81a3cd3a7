#!/usr/bin/python3
"""Prompts for bench_diffusion that the model never saw in training, from two sources:

  heldout  (default) benchmarks/data/heldout_prompts.txt: the held-out split of data.py. Prompt i
           is the (at most) 64 tokens that end at a line break near the fixed offset
           (i * 6151 * 13) mod len(held); cut after an <|endoftext|> so that it stays in one file.
  unseen   benchmarks/data/unseen_prompts.txt: Python from another corpus and other authors,
           Debian's /usr/lib/python3/dist-packages (data.py excludes every dist-packages path).
           Files sorted by path, cleaned like the training text (data.clean_text); prompt i is
           the 64 tokens ending at the first line break after the middle of file
           (i * 7919) mod n_files, skipping files under 2,000 characters.
Each prompt ends on a line break, as a user's prompt would. One prompt per line, ids separated
by spaces; the text of each is in the matching .jsonl.
Usage: /usr/bin/python3 tools/train/make_prompts.py [N=24] [heldout|unseen]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
import data
from train import TOKEN_CACHE, load_tokens

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UNSEEN_ROOT = "/usr/lib/python3/dist-packages"


def ends_line(tok, ids, end):
    return tok.decode([int(ids[end - 1])]).endswith("\n")


def heldout_prompts(tok, n):
    _, held = load_tokens(tok, TOKEN_CACHE)
    eot = tok.special("<|endoftext|>")
    out = []
    for i in range(n):
        end = 64 + (i * 6151 * 13) % (len(held) - 400)
        while not ends_line(tok, held, end):  # forward to just after a line break
            end += 1
        ids = [int(x) for x in held[end - 64:end]]
        if eot in ids:  # keep prompts inside one file
            ids = ids[len(ids) - ids[::-1].index(eot):]
        out.append(ids)
    return out


def unseen_prompts(tok, n):
    files = []
    for dirpath, dirnames, filenames in os.walk(UNSEEN_ROOT):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    files.sort()
    out, i = [], 0
    while len(out) < n and i < 50 * n:
        path = files[(i * 7919) % len(files)]
        i += 1
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            text = data.clean_text(fh.read())
        if len(text) < 2000:
            continue
        ids = tok.encode(text)
        end = len(ids) // 2
        while end < len(ids) and not ends_line(tok, ids, end):
            end += 1
        if end < 64 or end >= len(ids):
            continue
        out.append(ids[end - 64:end])
    assert len(out) == n, f"only {len(out)} prompts from {UNSEEN_ROOT}"
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    which = sys.argv[2] if len(sys.argv) > 2 else "heldout"
    tok = bpe.Tokenizer.load(os.path.join(ROOT, "models", "clover-small", "tokenizer.json"))
    prompts = {"heldout": heldout_prompts, "unseen": unseen_prompts}[which](tok, n)
    out_dir = os.path.join(ROOT, "benchmarks", "data")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{which}_prompts.txt"), "w") as f, \
         open(os.path.join(out_dir, f"{which}_prompts.jsonl"), "w") as fj:
        for ids in prompts:
            f.write(" ".join(map(str, ids)) + "\n")
            fj.write(json.dumps({"prompt": tok.decode(ids)}) + "\n")


if __name__ == "__main__":
    main()
