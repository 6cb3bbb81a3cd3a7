#!/usr/bin/python3
"""Exports a checkpoint of tools/train/train.py as a clover_moe GGUF (architecture.md §3,
clover-diffusion.md §6), written with struct + numpy (GGUF v3, alignment 32).

Usage: /usr/bin/python3 tools/train/export_gguf.py CKPT.pt OUT.gguf [--type f32|f16]
Matrices (2-D/3-D weights) are written as --type (default f16); vectors and the conv /
block-diffusion tensors are always F32. The internal parameterisation already is the GGUF one
(tiled V heads, folded norms; see clover_ref.py), so tensors are written as they are, except
ssm_a = -exp(A_log).
"""
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
from clover_ref import CloverModel, Config

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
F32_ONLY = ("ssm_conv1d.weight", "ssm_conv1d_right.weight")


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


class Writer:
    def __init__(self):
        self.kv = []
        self.tensors = []

    def u32(self, k, v): self.kv.append(_str(k) + struct.pack("<II", GGUF_U32, int(v)))
    def f32(self, k, v): self.kv.append(_str(k) + struct.pack("<If", GGUF_F32, float(v)))
    def bool(self, k, v): self.kv.append(_str(k) + struct.pack("<IB", GGUF_BOOL, 1 if v else 0))
    def str(self, k, v): self.kv.append(_str(k) + struct.pack("<I", GGUF_STRING) + _str(v))

    def i32_array(self, k, vals):
        self.kv.append(_str(k) + struct.pack("<IIQ", GGUF_ARRAY, GGUF_I32, len(vals)) + struct.pack(f"<{len(vals)}i", *vals))

    def str_array(self, k, vals):
        self.kv.append(_str(k) + struct.pack("<IIQ", GGUF_ARRAY, GGUF_STRING, len(vals)) + b"".join(_str(v) for v in vals))

    def tensor(self, name, arr):
        """arr: numpy array whose shape is the reversed ggml ne (row-major = ggml layout)."""
        arr = np.ascontiguousarray(arr)
        t = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}[arr.dtype]
        self.tensors.append((name, arr, t))

    def write(self, path, align=32):
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)) + b"".join(self.kv)
        infos, off, blobs = b"", 0, []
        for name, arr, t in self.tensors:
            ne = list(reversed(arr.shape))
            infos += _str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", t, off)
            data = arr.tobytes()
            pad = (-len(data)) % align
            blobs.append(data + b"\0" * pad)
            off += len(data) + pad
        meta = head + infos
        meta += b"\0" * ((-len(meta)) % align)
        with open(path, "wb") as f:
            f.write(meta)
            for b in blobs:
                f.write(b)


def rounded_tensors(model, mtype="f16"):
    """GGUF-named float32 tensors exactly as they will be stored (matrices rounded to f16)."""
    out = {}
    for name, t in model.gguf_tensors().items():
        a = t.numpy().astype(np.float32)
        if mtype == "f16" and a.ndim >= 2 and not name.endswith(F32_ONLY):
            a = a.astype(np.float16)
        out[name] = a
    return out


def load_checkpoint(path):
    ck = torch.load(path, map_location="cpu")
    cfg = Config(**ck["config"])
    model = CloverModel(cfg)
    model.load_state_dict(ck["model"])
    return model, cfg, ck


def config_from_gguf(kv):
    """The Config export() wrote into these keys (its inverse)."""
    p = "clover_moe."
    v_heads = kv[p + "ssm.time_step_rank"]
    return Config(n_vocab=len(kv["tokenizer.ggml.tokens"]), n_embd=kv[p + "embedding_length"],
                  n_layer=kv[p + "block_count"], interval=kv[p + "full_attention_interval"],
                  n_head=kv[p + "attention.head_count"], n_head_kv=kv[p + "attention.head_count_kv"],
                  head_dim=kv[p + "attention.key_length"], n_rot=kv[p + "rope.dimension_count"],
                  sections=tuple(kv[p + "rope.dimension_sections"]), rope_theta=kv[p + "rope.freq_base"],
                  eps=float(f"{kv[p + 'attention.layer_norm_rms_epsilon']:.6g}"), conv=kv[p + "ssm.conv_kernel"],
                  qk_heads=kv[p + "ssm.group_count"], v_heads=v_heads, dk=kv[p + "ssm.state_size"],
                  dv=kv[p + "ssm.inner_size"] // v_heads, n_expert=kv[p + "expert_count"],
                  n_expert_used=kv[p + "expert_used_count"], ff_exp=kv[p + "expert_feed_forward_length"],
                  ff_shexp=kv[p + "expert_shared_feed_forward_length"], mask_id=kv[p + "diffusion.mask_token_id"],
                  block_size=kv[p + "diffusion.block_size"], ctx=kv[p + "context_length"])


def load_gguf_model(path):
    """A clover_moe GGUF written by export() back into a trainable CloverModel (continues a run
    whose checkpoints are gone; the weights are exact for an F32 file)."""
    from gguf_read import read_gguf
    kv, tensors = read_gguf(path)
    cfg = config_from_gguf(kv)
    model = CloverModel(cfg)
    model.load_gguf_tensors(tensors)
    return model, cfg


def export(model, cfg, tok, path, mtype="f16", name="clover-small"):
    w = Writer()
    p = "clover_moe."
    w.str("general.architecture", "clover_moe")
    w.str("general.name", name)
    w.u32("general.file_type", 0 if mtype == "f32" else 1)
    w.u32(p + "block_count", cfg.n_layer)
    w.u32(p + "context_length", cfg.ctx)
    w.u32(p + "embedding_length", cfg.n_embd)
    w.u32(p + "attention.head_count", cfg.n_head)
    w.u32(p + "attention.head_count_kv", cfg.n_head_kv)
    w.u32(p + "attention.key_length", cfg.head_dim)
    w.u32(p + "attention.value_length", cfg.head_dim)
    w.f32(p + "attention.layer_norm_rms_epsilon", cfg.eps)
    w.f32(p + "rope.freq_base", cfg.rope_theta)
    w.u32(p + "rope.dimension_count", cfg.n_rot)
    w.i32_array(p + "rope.dimension_sections", list(cfg.sections))
    w.u32(p + "expert_count", cfg.n_expert)
    w.u32(p + "expert_used_count", cfg.n_expert_used)
    w.u32(p + "expert_feed_forward_length", cfg.ff_exp)
    w.u32(p + "expert_shared_feed_forward_length", cfg.ff_shexp)
    w.u32(p + "expert_shared_count", 1)
    w.u32(p + "ssm.conv_kernel", cfg.conv)
    w.u32(p + "ssm.state_size", cfg.dk)
    w.u32(p + "ssm.group_count", cfg.qk_heads)
    w.u32(p + "ssm.time_step_rank", cfg.v_heads)
    w.u32(p + "ssm.inner_size", cfg.v_heads * cfg.dv)
    w.u32(p + "full_attention_interval", cfg.interval)
    w.u32(p + "diffusion.block_size", cfg.block_size)
    w.f32(p + "diffusion.threshold", 0.95)
    w.u32(p + "diffusion.mask_token_id", cfg.mask_id)
    w.u32(p + "diffusion.expert_coreset", cfg.n_expert)
    # tokenizer (architecture.md §5.4)
    eot = tok.special("<|endoftext|>")
    w.str("tokenizer.ggml.model", "gpt2")
    w.str("tokenizer.ggml.pre", "qwen35")
    w.str_array("tokenizer.ggml.tokens", tok.tokens)
    w.i32_array("tokenizer.ggml.token_type", tok.token_type)
    w.str_array("tokenizer.ggml.merges", [a + " " + b for a, b in tok.merges])
    w.u32("tokenizer.ggml.bos_token_id", eot)
    w.u32("tokenizer.ggml.eos_token_id", eot)
    w.u32("tokenizer.ggml.padding_token_id", eot)
    w.bool("tokenizer.ggml.add_bos_token", False)
    for n, a in rounded_tensors(model, mtype).items():
        w.tensor(n, a)
    w.write(path)


if __name__ == "__main__":
    args = sys.argv[1:]
    mtype = "f16"
    if "--type" in args:
        i = args.index("--type")
        mtype = args[i + 1]
        del args[i:i + 2]
    ckpt, out = args
    model, cfg, ck = load_checkpoint(ckpt)
    here = os.path.dirname(os.path.abspath(__file__))
    tok = bpe.Tokenizer.load(os.path.join(here, "..", "..", "models", "clover-small", "tokenizer.json"))
    assert tok.n_vocab == cfg.n_vocab and tok.special("<|mask|>") == cfg.mask_id
    export(model, cfg, tok, out, mtype)
    print(f"wrote {out} ({os.path.getsize(out) / 1e6:.2f} MB, {sum(p.numel() for p in model.parameters())} params)")
