#!/usr/bin/python3
"""Trains the BPE on the training split (data.py) and writes models/clover-small/tokenizer.json
(merges only; the vocabulary is derived, see bpe.py). Usage: make_tokenizer.py [N_VOCAB]"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
import data

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

if __name__ == "__main__":
    n_vocab = int(sys.argv[1]) if len(sys.argv) > 1 else 3072
    n_merges = n_vocab - 256 - len(bpe.SPECIALS)
    train, _ = data.load_split()
    t0 = time.time()
    merges = bpe.train_bpe([t for _, t in train], n_merges, log=print)
    tok = bpe.Tokenizer(merges)
    out = os.path.join(ROOT, "models", "clover-small")
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    print(f"{len(merges)} merges, vocab {tok.n_vocab}, {time.time() - t0:.1f}s")
    sample = train[0][1][:400]
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    nchar = sum(len(t) for _, t in train[:50])
    ntok = sum(len(tok.encode(t)) for _, t in train[:50])
    print(f"chars/token on 50 files: {nchar / ntok:.2f}")
