#!/usr/bin/python3
"""Writes the parity fixtures of the bundled model (tests/data/clover_small/) from the literal
float64 reference (clover_ref.ref_commit / ref_preview) over the tensors stored in the GGUF.

Usage:
  /usr/bin/python3 tools/train/make_fixtures.py models/clover-small.gguf tests/data/clover_small
  /usr/bin/python3 tools/train/make_fixtures.py --check build/clover models/clover-small.gguf tests/data/clover_small

Layout of OUTDIR:
  cases.json   {"model": "models/clover-small.gguf", "model_sha256": ..., "n_vocab": V,
                "mask_token_id": M, "tolerance": 1e-4, "cases": [CASE, ...]}
  CASE (commit)  {"name": "commit_0", "kind": "commit", "ids": [...], "rows": n, "logits": "commit_0.f32le"}
  CASE (preview) {"name": ..., "kind": "preview", "prefix": [...], "block": [...], "coreset": C,
                  "rows": len(block), "logits": "<name>.f32le"}
  *.f32le      float32 little-endian, row-major [rows, n_vocab]:
               commit:  row i = logits after ids[0..i] (same as `clover logits --ids`);
               preview: row i = preview logits of block position i (no shift), the prefix
                        committed first (same as `clover logits --ids PREFIX --block-ids B --coreset C`).
Pass criterion: max |clover - fixture| <= tolerance * max |fixture| per case.
--check runs `clover logits` for every case (preview cases too; they are reported as skipped if
the binary does not know --block-ids yet) and prints the relative errors.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
from clover_ref import Config, ref_commit, ref_preview
from gguf_read import read_gguf

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def config_from_kv(kv):
    p = kv["general.architecture"] + "."
    return Config(n_vocab=len(kv["tokenizer.ggml.tokens"]), n_embd=kv[p + "embedding_length"], n_layer=kv[p + "block_count"],
                  interval=kv[p + "full_attention_interval"], n_head=kv[p + "attention.head_count"],
                  n_head_kv=kv[p + "attention.head_count_kv"], head_dim=kv[p + "attention.key_length"],
                  n_rot=kv[p + "rope.dimension_count"], sections=tuple(kv[p + "rope.dimension_sections"]),
                  rope_theta=kv[p + "rope.freq_base"], eps=kv[p + "attention.layer_norm_rms_epsilon"],
                  conv=kv[p + "ssm.conv_kernel"], qk_heads=kv[p + "ssm.group_count"], v_heads=kv[p + "ssm.time_step_rank"],
                  dk=kv[p + "ssm.state_size"], dv=kv[p + "ssm.inner_size"] // kv[p + "ssm.time_step_rank"],
                  n_expert=kv[p + "expert_count"], n_expert_used=kv[p + "expert_used_count"],
                  ff_exp=kv[p + "expert_feed_forward_length"], ff_shexp=kv[p + "expert_shared_feed_forward_length"],
                  mask_id=kv[p + "diffusion.mask_token_id"], block_size=kv[p + "diffusion.block_size"])


def load_model(path):
    kv, T = read_gguf(path)
    cfg = config_from_kv(kv)
    W = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in T.items()}
    return cfg, W, kv


def cases_for(cfg, tok):
    """Fixed inputs: held-out stdlib text (data.py split) so the model is in-distribution."""
    text = open("/usr/lib/python3.11/copy.py").read()          # a held-out file
    ids = tok.encode(text[text.index("def deepcopy"):])[:120]
    M = cfg.mask_id
    cases = [
        {"name": "commit_0", "kind": "commit", "ids": ids[:1]},
        {"name": "commit_1", "kind": "commit", "ids": ids[:13]},
        {"name": "commit_2", "kind": "commit", "ids": ids[:48]},
    ]
    # block of 32 after a 13-token prefix, every other row masked from row 3 on
    blk32 = [t if (i < 3 or i % 2 == 1) else M for i, t in enumerate(ids[13:45])]
    blk8 = [M, ids[2], M, M, ids[5], M, M, M]                    # p = 1 < K-1: ring partly zero
    blk_all = [M] * 32                                           # a fresh block, all masks
    for C in (0, 2, cfg.n_expert):
        cases.append({"name": f"preview_p13_b32_c{C}", "kind": "preview", "prefix": ids[:13], "block": blk32, "coreset": C})
    for C in (0, 2, cfg.n_expert):
        cases.append({"name": f"preview_p1_b8_c{C}", "kind": "preview", "prefix": ids[:1], "block": blk8, "coreset": C})
    cases.append({"name": "preview_p48_mask32_c2", "kind": "preview", "prefix": ids[:48], "block": blk_all, "coreset": 2})
    return cases


def write(model_path, outdir):
    cfg, W, kv = load_model(model_path)
    tok = bpe.Tokenizer.load(os.path.join(ROOT, "models", "clover-small", "tokenizer.json"))
    assert tok.tokens == kv["tokenizer.ggml.tokens"]
    os.makedirs(outdir, exist_ok=True)
    cases = cases_for(cfg, tok)
    for c in cases:
        if c["kind"] == "commit":
            lg, _ = ref_commit(W, cfg, c["ids"])
        else:
            _, st = ref_commit(W, cfg, c["prefix"])
            lg = ref_preview(W, cfg, st, c["block"], c["coreset"])
        c["rows"] = int(lg.shape[0])
        c["logits"] = c["name"] + ".f32le"
        lg.to(torch.float32).numpy().astype("<f4").tofile(os.path.join(outdir, c["logits"]))
        print(c["name"], tuple(lg.shape), f"max|logit| {float(lg.abs().max()):.3f}")
    sha = hashlib.sha256(open(model_path, "rb").read()).hexdigest()
    manifest = {"model": os.path.relpath(os.path.abspath(model_path), ROOT), "model_sha256": sha, "n_vocab": cfg.n_vocab,
                "mask_token_id": cfg.mask_id, "tolerance": 1e-4, "cases": cases}
    with open(os.path.join(outdir, "cases.json"), "w") as f:
        json.dump(manifest, f, indent=1)


def check(clover, model_path, outdir):
    man = json.load(open(os.path.join(outdir, "cases.json")))
    V = man["n_vocab"]
    worst = 0.0
    for c in man["cases"]:
        ref = np.fromfile(os.path.join(outdir, c["logits"]), dtype="<f4").reshape(c["rows"], V)
        with tempfile.TemporaryDirectory() as td:
            out = os.path.join(td, "o.f32")
            if c["kind"] == "commit":
                cmd = [clover, "logits", "-m", model_path, "--ids", ",".join(map(str, c["ids"])), "-o", out]
            else:
                cmd = [clover, "logits", "-m", model_path, "--ids", ",".join(map(str, c["prefix"])),
                       "--block-ids", ",".join(map(str, c["block"])), "--coreset", str(c["coreset"]), "-o", out]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{c['name']}: clover failed ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
                continue
            got = np.fromfile(out, dtype="<f4").reshape(-1, V)
        if got.shape != ref.shape:
            print(f"{c['name']}: shape {got.shape} != {ref.shape}")
            continue
        rel = float(np.abs(got - ref).max() / np.abs(ref).max())
        worst = max(worst, rel) if c["kind"] == "commit" else worst
        print(f"{c['name']}: rel err {rel:.2e} {'OK' if rel <= man['tolerance'] else 'FAIL'}")
    return worst


if __name__ == "__main__":
    a = sys.argv[1:]
    if a and a[0] == "--check":
        check(a[1], a[2], a[3])
    else:
        write(a[0], a[1])
