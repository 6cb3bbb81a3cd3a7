#!/usr/bin/python3
"""Estimates tokens per forward pass (TPF) of LowConfidence block diffusion with the PyTorch
model (clover-diffusion.md §4), against greedy AR on the same prompts.

Usage: /usr/bin/python3 tools/train/diffusion_eval.py CKPT.pt [--prompts 6] [--n 64] [--tau 0.95]
(--n should be a multiple of the block size 32: whole blocks are generated.)
Prompts: windows of the held-out split (data.py), 64 tokens each, at fixed offsets.
Counts: every preview pass is one pass, and every finished block adds one commit pass.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
from export_gguf import load_checkpoint
from train import TOKEN_CACHE, load_tokens

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@torch.no_grad()
def ar_greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        lc, _, _ = model(torch.tensor([ids]))
        ids.append(int(lc[0, -1].argmax()))
    return ids[len(prompt):], n


@torch.no_grad()
def fill_block(model, cfg, ids, tau=0.95, B=32):
    """One LowConfidence block (greedy) after each row of ids [n, p], batched: every row keeps its
    own mask state; per preview pass, commit every masked row with p >= tau, or else the most
    confident one (the mask token itself is never picked). Returns the block [n, B] and the
    preview passes summed over the rows (a row that is already full needs no more passes)."""
    M = cfg.mask_id
    block = torch.full((len(ids), B), M, dtype=torch.long)
    passes = 0
    while (block == M).any():
        _, lb, _ = model(ids, block[:, None], [ids.shape[1]])
        logits = lb[:, 0].clone()
        logits[..., M] = float("-inf")
        conf, pick = torch.softmax(logits, -1).max(-1)            # [n, B]
        masked = block == M
        conf = conf.masked_fill(~masked, -1.0)
        hit = masked & (conf >= tau)
        none = ~hit.any(-1) & masked.any(-1)
        hit[none, conf.argmax(-1)[none]] = True
        block = torch.where(hit, pick, block)
        passes += int(masked.any(-1).sum())
    return block, passes


@torch.no_grad()
def low_confidence(model, cfg, prompt, n, B=32, tau=0.95):
    ids = list(prompt)
    passes = 0
    while len(ids) - len(prompt) < n:
        block, p = fill_block(model, cfg, torch.tensor([ids]), tau, B)
        ids += block[0].tolist()
        passes += p + 1  # + the commit pass over the finished block
    return ids[len(prompt):], passes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tau", type=float, default=0.95)
    a = ap.parse_args()
    torch.set_num_threads(1)
    model, cfg, _ = load_checkpoint(a.ckpt)
    model.eval()
    tok = bpe.Tokenizer.load(os.path.join(ROOT, "models", "clover-small", "tokenizer.json"))
    _, held = load_tokens(tok, TOKEN_CACHE)
    tot_tok = tot_pass = agree = 0
    for i in range(a.prompts):
        off = (i * 7919 * 13) % (len(held) - 200)
        prompt = held[off:off + 64].astype(int).tolist()
        ar, _ = ar_greedy(model, prompt, a.n)
        dg, passes = low_confidence(model, cfg, prompt, a.n, tau=a.tau)
        same = sum(x == y for x, y in zip(ar, dg))
        tot_tok += len(dg)
        tot_pass += passes
        agree += same
        print(f"prompt {i}: TPF {len(dg) / passes:.2f}  ({len(dg)} tokens, {passes} passes)  same-as-AR {same}/{a.n}")
        print("   AR  :", repr(tok.decode(ar)[:160]))
        print("   diff:", repr(tok.decode(dg)[:160]))
    print(f"overall TPF {tot_tok / tot_pass:.2f} at tau {a.tau}; tokens equal to greedy AR {agree}/{a.n * a.prompts}")


if __name__ == "__main__":
    main()
