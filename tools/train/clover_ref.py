#!/usr/bin/python3
"""PyTorch reference of the Clover hybrid MoE (architecture.md §2, clover-diffusion.md §3).

Two implementations of the same math, over the same parameters:

* `CloverModel` (nn.Module): the batched/vectorised forms used for training — chunked (WY/UT)
  Gated DeltaNet, masked attention, gathered MoE — for the commit (causal) pass and for the
  preview (block) pass with the clean prefix state captured inside the same forward.
* `ref_commit` / `ref_preview`: literal, token-by-token float64 forms written line by line from
  the spec (GDN recurrence, per-row MoE routing with the expert coreset). These produce the test
  fixtures; `selftest()` checks the training forms against them.

Internal parameterisation = the GGUF one, so export needs no reordering:
* norms are plain RMSNorm weights (the "+1" of the zero-centred HF form is already folded in);
* GDN V-head slot h pairs with QK head h % n_qk_heads ("tiled", architecture.md §3.5);
* the GDN decay parameter is A_log (exported as ssm_a = -exp(A_log));
* every weight is stored PyTorch-style [out, in] (GGUF ne = {in, out}).
Run `/usr/bin/python3 tools/train/clover_ref.py` for the self-test.
"""
import dataclasses
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    n_vocab: int = 3072
    n_embd: int = 256
    n_layer: int = 8
    interval: int = 4               # full_attention_interval: layer i is attention iff (i+1) % interval == 0
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_rot: int = 16
    sections: tuple = (3, 3, 2, 0)  # interleaved MRoPE sections (sum <= n_rot/2)
    rope_theta: float = 10000.0
    eps: float = 1e-6
    conv: int = 4                   # GDN conv kernel K
    qk_heads: int = 4
    v_heads: int = 8
    dk: int = 32
    dv: int = 32
    n_expert: int = 8
    n_expert_used: int = 2
    ff_exp: int = 128
    ff_shexp: int = 256
    mask_id: int = -1
    block_size: int = 32
    ctx: int = 4096

    def is_attn(self, il):
        return (il + 1) % self.interval == 0

    @property
    def conv_channels(self):
        return 2 * self.qk_heads * self.dk + self.v_heads * self.dv


# ----------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2_norm(x, eps):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def rope_tables(cfg, pos, dtype=torch.float32):
    """cos/sin [len(pos), n_rot/2] with the interleaved-section rule of architecture.md §2.3
    (llama.cpp ggml_mrope_cache_init): slot i uses sector s = i % sum(sections); it rotates with the
    text position when (s%3==0 and s<3*sec0) or (s%3==1 and s<3*sec1) or (s%3==2 and s<3*sec2);
    otherwise it belongs to the 4th stream, whose position is 0 for text (no rotation)."""
    half = cfg.n_rot // 2
    i = torch.arange(half, dtype=torch.float64)
    inv = cfg.rope_theta ** (-2.0 * i / cfg.n_rot)
    sec = list(cfg.sections)
    tot = sum(sec)
    rot = torch.ones(half, dtype=torch.float64)
    if tot > 0:
        for j in range(half):
            s = j % tot
            ok = (s % 3 == 0 and s < 3 * sec[0]) or (s % 3 == 1 and s < 3 * sec[1]) or (s % 3 == 2 and s < 3 * sec[2])
            rot[j] = 1.0 if ok else 0.0
    ang = pos.to(torch.float64)[:, None] * (inv * rot)[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope_apply(x, cos, sin, n_rot):
    """x [..., T, H, hd]; cos/sin [T, n_rot/2]. NEOX pairs (i, i + n_rot/2)."""
    half = n_rot // 2
    c = cos[:, None, :]
    s = sin[:, None, :]
    x0, x1, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return torch.cat([x0 * c - x1 * s, x1 * c + x0 * s, rest], dim=-1)


def softplus(x):
    return F.softplus(x)  # beta=1, threshold=20 (PyTorch default)


# ----------------------------------------------------------------------------------------------
# the model (training forms)
# ----------------------------------------------------------------------------------------------

class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, nh, nkv, hd = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim
        self.wq = nn.Parameter(torch.empty(nh * 2 * hd, d))   # per head [q | gate]
        self.wk = nn.Parameter(torch.empty(nkv * hd, d))
        self.wv = nn.Parameter(torch.empty(nkv * hd, d))
        self.wo = nn.Parameter(torch.empty(d, nh * hd))
        self.q_norm = nn.Parameter(torch.ones(hd))
        self.k_norm = nn.Parameter(torch.ones(hd))

    def project(self, u, pos):
        cfg = self.cfg
        B, T, _ = u.shape
        nh, nkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        P = (u @ self.wq.t()).view(B, T, nh, 2 * hd)
        q, gate = P[..., :hd], P[..., hd:]
        k = (u @ self.wk.t()).view(B, T, nkv, hd)
        v = (u @ self.wv.t()).view(B, T, nkv, hd)
        q = rms_norm(q, self.q_norm, cfg.eps)
        k = rms_norm(k, self.k_norm, cfg.eps)
        cos, sin = rope_tables(cfg, pos, u.dtype)
        q = rope_apply(q, cos, sin, cfg.n_rot)
        k = rope_apply(k, cos, sin, cfg.n_rot)
        return q, k, v, gate

    def attend(self, q, k, v, gate, mask):
        """q [B,Tq,nh,hd], k/v [B,Tk,nkv,hd], mask [Tq,Tk] bool (True = may attend)."""
        cfg = self.cfg
        B, Tq = q.shape[:2]
        rep = cfg.n_head // cfg.n_head_kv
        k = k.repeat_interleave(rep, dim=2)  # kv head j serves q heads rep*j .. rep*j+rep-1
        v = v.repeat_interleave(rep, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(cfg.head_dim)
        s = s.masked_fill(~mask, float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("bhqk,bkhd->bqhd", a, v)
        o = o * torch.sigmoid(gate)
        return o.reshape(B, Tq, -1) @ self.wo.t()

    def forward(self, u, ub, starts):
        """u: clean rows [B,T,d]; ub: block rows [B,nb,Bk,d] or None; starts: block starts."""
        B, T, _ = u.shape
        pos = torch.arange(T)
        q, k, v, gate = self.project(u, pos)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        out = self.attend(q, k, v, gate, causal)
        if ub is None:
            return out, None
        nb, Bk = ub.shape[1], ub.shape[2]
        qs, ks, vs, gs = [], [], [], []
        for j, p in enumerate(starts):
            qb, kb, vb, gb = self.project(ub[:, j], torch.arange(p, p + Bk))
            qs.append(qb); ks.append(kb); vs.append(vb); gs.append(gb)
        qb, kb, vb, gb = (torch.cat(x, 1) for x in (qs, ks, vs, gs))
        # keys: the clean prefix (positions < p_j) and every row of block j (no mask inside)
        kk = torch.cat([k, kb], 1)
        vv = torch.cat([v, vb], 1)
        mask = torch.zeros(nb * Bk, T + nb * Bk, dtype=torch.bool)
        for j, p in enumerate(starts):
            mask[j * Bk:(j + 1) * Bk, :p] = True
            mask[j * Bk:(j + 1) * Bk, T + j * Bk:T + (j + 1) * Bk] = True
        ob = self.attend(qb, kk, vv, gb, mask)
        return out, ob.view(B, nb, Bk, -1)


def gdn_chunked(q, k, v, g, beta, S0, CS=64):
    """Chunked gated delta rule (architecture.md §2.5). q (already /sqrt(dk)), k: [B,H,T,dk];
    v [B,H,T,dv]; g, beta [B,H,T]; S0 [B,H,dk,dv]. Returns o [B,H,T,dv], S_T."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    if T == 0:
        return v.new_zeros(B, H, 0, dv), S0
    pad = (-T) % CS
    if pad:
        q = F.pad(q, (0, 0, 0, pad)); k = F.pad(k, (0, 0, 0, pad)); v = F.pad(v, (0, 0, 0, pad))
        g = F.pad(g, (0, pad)); beta = F.pad(beta, (0, pad))
    n = (T + pad) // CS
    q = q.view(B, H, n, CS, dk); k = k.view(B, H, n, CS, dk); v = v.view(B, H, n, CS, dv)
    g = g.view(B, H, n, CS); beta = beta.view(B, H, n, CS)
    gam = g.cumsum(-1)
    incl = torch.ones(CS, CS, dtype=torch.bool).tril()
    strict = torch.ones(CS, CS, dtype=torch.bool).tril(-1)
    diff = gam[..., :, None] - gam[..., None, :]
    D = torch.exp(diff.masked_fill(~incl, float("-inf")))
    kk = k @ k.transpose(-1, -2)
    A = (beta[..., :, None] * kk * D).masked_fill(~strict, 0.0)
    eye = torch.eye(CS, dtype=k.dtype)
    Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    U = Tm @ (beta[..., None] * v)
    W = Tm @ ((beta * torch.exp(gam))[..., None] * k)
    QK = (q @ k.transpose(-1, -2) * D).masked_fill(~incl, 0.0)
    eg = torch.exp(gam)
    egl = torch.exp(gam[..., -1:] - gam)
    S = S0
    outs = []
    for c in range(n):
        Delta = U[:, :, c] - W[:, :, c] @ S
        o = (eg[:, :, c, :, None] * q[:, :, c]) @ S + QK[:, :, c] @ Delta
        S = torch.exp(gam[:, :, c, -1])[..., None, None] * S + (egl[:, :, c, :, None] * k[:, :, c]).transpose(-1, -2) @ Delta
        outs.append(o)
    o = torch.stack(outs, 2).reshape(B, H, n * CS, dv)[:, :, :T]
    return o, S


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, C, Hv, dv, K = cfg.n_embd, cfg.conv_channels, cfg.v_heads, cfg.dv, cfg.conv
        self.wqkv = nn.Parameter(torch.empty(C, d))
        self.wz = nn.Parameter(torch.empty(Hv * dv, d))
        self.wb = nn.Parameter(torch.empty(Hv, d))
        self.wa = nn.Parameter(torch.empty(Hv, d))
        self.conv = nn.Parameter(torch.empty(C, K))           # [c, i]: i = 0 multiplies the oldest row
        self.dt_bias = nn.Parameter(torch.empty(Hv))
        self.A_log = nn.Parameter(torch.empty(Hv))
        self.norm = nn.Parameter(torch.ones(dv))
        self.wout = nn.Parameter(torch.empty(d, Hv * dv))
        # block diffusion
        self.conv_right = nn.Parameter(torch.zeros(C, K - 1))  # [c, d-1]: d-1 = 0 is row t+1
        self.bd_scale = nn.Parameter(torch.full((Hv,), 4.0))
        self.bd_bias = nn.Parameter(torch.zeros(Hv))
        self.bd_c = nn.Parameter(torch.ones(Hv))

    def split_heads(self, y):
        cfg = self.cfg
        nq = cfg.qk_heads * cfg.dk
        sh = y.shape[:-1]
        q = y[..., :nq].reshape(*sh, cfg.qk_heads, cfg.dk)
        k = y[..., nq:2 * nq].reshape(*sh, cfg.qk_heads, cfg.dk)
        v = y[..., 2 * nq:].reshape(*sh, cfg.v_heads, cfg.dv)
        q = l2_norm(q, cfg.eps)
        k = l2_norm(k, cfg.eps)
        idx = torch.arange(cfg.v_heads) % cfg.qk_heads   # tiled: V slot h <-> QK head h % Hk
        return q[..., idx, :], k[..., idx, :], v

    def out(self, o, z):
        """o [..., Hv, dv], z [..., Hv*dv] -> [..., d]"""
        cfg = self.cfg
        z = z.reshape(*z.shape[:-1], cfg.v_heads, cfg.dv)
        n = rms_norm(o, self.norm, cfg.eps) * F.silu(z)
        return n.reshape(*n.shape[:-2], -1) @ self.wout.t()

    def forward(self, u, ub, starts):
        cfg = self.cfg
        B, T, _ = u.shape
        K, C = cfg.conv, cfg.conv_channels
        m = u @ self.wqkv.t()                               # pre-conv rows [B,T,C]
        z = u @ self.wz.t()
        b = u @ self.wb.t()
        a = u @ self.wa.t()
        x = F.conv1d(F.pad(m.transpose(1, 2), (K - 1, 0)), self.conv[:, None, :], groups=C).transpose(1, 2)
        y = F.silu(x)
        qh, kh, v = self.split_heads(y)                     # [B,T,Hv,d]
        beta = torch.sigmoid(b)
        g = -torch.exp(self.A_log) * softplus(a + self.dt_bias)
        qt = (qh / math.sqrt(cfg.dk)).transpose(1, 2)
        kt, vt = kh.transpose(1, 2), v.transpose(1, 2)
        gt, bt = g.transpose(1, 2), beta.transpose(1, 2)
        S = u.new_zeros(B, cfg.v_heads, cfg.dk, cfg.dv)
        cuts = sorted(set([0] + list(starts) + [T]))
        states = {}
        outs = []
        for s0, s1 in zip(cuts, cuts[1:]):
            states[s0] = S
            o, S = gdn_chunked(qt[:, :, s0:s1], kt[:, :, s0:s1], vt[:, :, s0:s1], gt[:, :, s0:s1], bt[:, :, s0:s1], S)
            outs.append(o)
        states[T] = S
        o = torch.cat(outs, 2).transpose(1, 2)              # [B,T,Hv,dv]
        out = self.out(o, z)
        if ub is None:
            return out, None
        obs = []
        for j, p in enumerate(starts):
            obs.append(self.preview(ub[:, j], m, p, states[p]))
        return out, torch.stack(obs, 1)

    def preview(self, ub, m_clean, p, S):
        """clover-diffusion.md §3, GDN layer. ub [B,Bk,d]; m_clean: clean pre-conv rows [B,T,C]."""
        cfg = self.cfg
        B, Bk, _ = ub.shape
        K, C = cfg.conv, cfg.conv_channels
        mb = ub @ self.wqkv.t()
        zb = ub @ self.wz.t()
        ring = m_clean[:, max(0, p - (K - 1)):p]
        if ring.shape[1] < K - 1:
            ring = torch.cat([ring.new_zeros(B, K - 1 - ring.shape[1], C), ring], 1)
        ext = torch.cat([ring, mb, mb.new_zeros(B, K - 1, C)], 1)          # [B, K-1+Bk+K-1, C]
        wfull = torch.cat([self.conv, self.conv_right], 1)                  # taps over rows t-K+1 .. t+K-1
        x = F.conv1d(ext.transpose(1, 2), wfull[:, None, :], groups=C).transpose(1, 2)
        y = F.silu(x)
        qh, kh, v = self.split_heads(y)                                     # [B,Bk,Hv,d]
        qh, kh, v = qh.transpose(1, 2), kh.transpose(1, 2), v.transpose(1, 2)  # [B,Hv,Bk,d]
        r = (qh / math.sqrt(cfg.dk)) @ S                                    # S_h^T q~_t
        att = self.bd_scale[None, :, None, None] * (qh @ kh.transpose(-1, -2))   # [B,Hv,Bk,Bk]
        hist = self.bd_bias[None, :, None, None].expand(B, -1, Bk, 1)
        w = torch.softmax(torch.cat([hist, att], -1), -1)
        o = w[..., :1] * self.bd_c[None, :, None, None] * r + w[..., 1:] @ v
        return self.out(o.transpose(1, 2), zb)


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, E, f, fs = cfg.n_embd, cfg.n_expert, cfg.ff_exp, cfg.ff_shexp
        self.router = nn.Parameter(torch.empty(E, d))
        self.gate_exps = nn.Parameter(torch.empty(E, f, d))
        self.up_exps = nn.Parameter(torch.empty(E, f, d))
        self.down_exps = nn.Parameter(torch.empty(E, d, f))
        self.shexp_gate = nn.Parameter(torch.empty(d))
        self.gate_sh = nn.Parameter(torch.empty(fs, d))
        self.up_sh = nn.Parameter(torch.empty(fs, d))
        self.down_sh = nn.Parameter(torch.empty(d, fs))

    def forward(self, u):
        cfg = self.cfg
        sh = u.shape
        x = u.reshape(-1, sh[-1])
        N = x.shape[0]
        P = torch.softmax(x @ self.router.t(), -1)
        topv, topi = P.topk(cfg.n_expert_used, -1)
        w = topv / topv.sum(-1, keepdim=True)
        y = torch.zeros_like(x)
        flat_e = topi.reshape(-1)
        flat_w = w.reshape(-1)
        flat_t = torch.arange(N).repeat_interleave(cfg.n_expert_used)
        for e in range(cfg.n_expert):
            sel = (flat_e == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            t = flat_t[sel]
            xe = x[t]
            he = F.silu(xe @ self.gate_exps[e].t()) * (xe @ self.up_exps[e].t())
            y.index_add_(0, t, (he @ self.down_exps[e].t()) * flat_w[sel, None])
        ys = (F.silu(x @ self.gate_sh.t()) * (x @ self.up_sh.t())) @ self.down_sh.t()
        y = y + torch.sigmoid(x @ self.shexp_gate)[:, None] * ys
        # Switch-style load-balancing statistic: E * sum_e f_e * mean P_e
        frac = torch.bincount(flat_e, minlength=cfg.n_expert).to(x.dtype) / flat_e.numel()
        aux = cfg.n_expert * (frac * P.mean(0)).sum()
        return y.view(sh), aux


class Layer(nn.Module):
    def __init__(self, cfg, il):
        super().__init__()
        self.attn_norm = nn.Parameter(torch.ones(cfg.n_embd))
        self.post_norm = nn.Parameter(torch.ones(cfg.n_embd))
        self.is_attn = cfg.is_attn(il)
        self.mixer = Attention(cfg) if self.is_attn else GatedDeltaNet(cfg)
        self.moe = MoE(cfg)
        self.eps = cfg.eps

    def forward(self, h, hb, starts):
        a, ab = self.mixer(rms_norm(h, self.attn_norm, self.eps),
                           None if hb is None else rms_norm(hb, self.attn_norm, self.eps), starts)
        h = h + a
        if hb is None:
            y, aux = self.moe(rms_norm(h, self.post_norm, self.eps))
            return h + y, None, aux
        hb = hb + ab
        # one MoE call over clean and block rows (plain routing: training does not use a coreset)
        B, T, d = h.shape
        both = torch.cat([h.reshape(-1, d), hb.reshape(-1, d)], 0)
        y, aux = self.moe(rms_norm(both, self.post_norm, self.eps))
        return h + y[:B * T].view_as(h), hb + y[B * T:].view_as(hb), aux


class CloverModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_embd = nn.Parameter(torch.empty(cfg.n_vocab, cfg.n_embd))
        self.layers = nn.ModuleList([Layer(cfg, i) for i in range(cfg.n_layer)])
        self.output_norm = nn.Parameter(torch.ones(cfg.n_embd))
        self.output = nn.Parameter(torch.empty(cfg.n_vocab, cfg.n_embd))
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, std=0.02):
        cfg = self.cfg
        gen = torch.Generator().manual_seed(1234)
        out_std = std / math.sqrt(2 * cfg.n_layer)
        for name, p in self.named_parameters():
            leaf = name.split(".")[-1]
            if leaf in ("attn_norm", "post_norm", "output_norm", "q_norm", "k_norm", "norm", "bd_c"):
                p.fill_(1.0)
            elif leaf == "bd_scale":
                p.fill_(4.0)
            elif leaf in ("bd_bias", "conv_right"):
                p.zero_()
            elif leaf == "conv":
                p.uniform_(-0.5, 0.5, generator=gen)
            elif leaf == "A_log":
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, 16, generator=gen)))
            elif leaf == "dt_bias":
                dt = torch.exp(torch.empty_like(p).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
                p.copy_(dt + torch.log(-torch.expm1(-dt)))    # inverse softplus
            elif leaf in ("wo", "wout", "down_exps", "down_sh"):
                p.normal_(0, out_std, generator=gen)
            else:
                p.normal_(0, std, generator=gen)

    def forward(self, ids, block_ids=None, starts=()):
        """ids [B,T] clean tokens. block_ids [B,nb,Bk] (mask ids allowed) with block j at
        positions starts[j] .. starts[j]+Bk-1 previewed over the clean prefix ids[:, :starts[j]].
        Returns (commit logits [B,T,V], preview logits [B,nb,Bk,V] or None, aux loss)."""
        h = self.tok_embd[ids]
        hb = None if block_ids is None else self.tok_embd[block_ids]
        aux = 0.0
        for layer in self.layers:
            h, hb, a = layer(h, hb, list(starts))
            aux = aux + a
        out = lambda x: rms_norm(x, self.output_norm, self.cfg.eps) @ self.output.t()
        return out(h), (None if hb is None else out(hb)), aux / len(self.layers)

    # -- GGUF view: name -> parameter; ssm_a is the one stored transformed (-exp(A_log)) ----------
    def gguf_params(self):
        T = {}
        T["token_embd.weight"] = self.tok_embd
        T["output_norm.weight"] = self.output_norm
        T["output.weight"] = self.output
        for il, L in enumerate(self.layers):
            b = f"blk.{il}."
            T[b + "attn_norm.weight"] = L.attn_norm
            T[b + "post_attention_norm.weight"] = L.post_norm
            M = L.mixer
            if L.is_attn:
                T[b + "attn_q.weight"] = M.wq
                T[b + "attn_k.weight"] = M.wk
                T[b + "attn_v.weight"] = M.wv
                T[b + "attn_output.weight"] = M.wo
                T[b + "attn_q_norm.weight"] = M.q_norm
                T[b + "attn_k_norm.weight"] = M.k_norm
            else:
                T[b + "attn_qkv.weight"] = M.wqkv
                T[b + "attn_gate.weight"] = M.wz
                T[b + "ssm_beta.weight"] = M.wb
                T[b + "ssm_alpha.weight"] = M.wa
                T[b + "ssm_conv1d.weight"] = M.conv
                T[b + "ssm_dt.bias"] = M.dt_bias
                T[b + "ssm_a"] = M.A_log
                T[b + "ssm_norm.weight"] = M.norm
                T[b + "ssm_out.weight"] = M.wout
                T[b + "ssm_conv1d_right.weight"] = M.conv_right
                T[b + "ssm_bd_logit_scale"] = M.bd_scale
                T[b + "ssm_bd_history_bias"] = M.bd_bias
                T[b + "ssm_bd_history_c"] = M.bd_c
            E = L.moe
            T[b + "ffn_gate_inp.weight"] = E.router
            T[b + "ffn_gate_exps.weight"] = E.gate_exps
            T[b + "ffn_up_exps.weight"] = E.up_exps
            T[b + "ffn_down_exps.weight"] = E.down_exps
            T[b + "ffn_gate_inp_shexp.weight"] = E.shexp_gate
            T[b + "ffn_gate_shexp.weight"] = E.gate_sh
            T[b + "ffn_up_shexp.weight"] = E.up_sh
            T[b + "ffn_down_shexp.weight"] = E.down_sh
        return T

    def gguf_tensors(self, dtype=torch.float32):
        """name -> tensor in GGUF semantics (numpy shape = reversed ggml ne)."""
        out = {}
        for name, p in self.gguf_params().items():
            x = -torch.exp(p) if name.endswith(".ssm_a") else p
            out[name] = x.detach().to(dtype).contiguous()
        return out

    @torch.no_grad()
    def load_gguf_tensors(self, tensors):
        """The inverse of gguf_tensors: every parameter from GGUF-named arrays (shapes checked)."""
        params = self.gguf_params()
        missing = sorted(set(params) - set(tensors))
        assert not missing, f"GGUF lacks tensors: {missing[:5]}"
        for name, p in params.items():
            x = torch.from_numpy(np.asarray(tensors[name], dtype=np.float32).copy())
            assert tuple(x.shape) == tuple(p.shape), f"{name}: GGUF {tuple(x.shape)} vs model {tuple(p.shape)}"
            p.copy_(torch.log(-x) if name.endswith(".ssm_a") else x)


# ----------------------------------------------------------------------------------------------
# literal float64 reference over GGUF-named tensors (fixtures)
# ----------------------------------------------------------------------------------------------

def _row_topk(p, idx_pool, k):
    """top-k of p over the candidate experts idx_pool; ties: lower index first."""
    cand = sorted(idx_pool, key=lambda e: (-float(p[e]), e))
    return cand[:k]


def ref_moe_rows(W, b, cfg, U, coreset=0):
    """U [R, d] float64 rows of one pass. coreset: 0 or >= E -> plain top-k routing."""
    E, k = cfg.n_expert, cfg.n_expert_used
    P = torch.softmax(U @ W[b + "ffn_gate_inp.weight"].t(), -1)
    if coreset <= 0 or coreset >= E:
        pool = list(range(E))
    else:
        score = P.sum(0)
        pool = sorted(range(E), key=lambda e: (-float(score[e]), e))[:coreset]
    kk = min(k, len(pool))
    Y = torch.zeros_like(U)
    for t in range(U.shape[0]):
        chosen = _row_topk(P[t], pool, kk)
        ws = torch.stack([P[t, e] for e in chosen])
        ws = ws / ws.sum()
        for e, we in zip(chosen, ws):
            G = W[b + "ffn_gate_exps.weight"][e]; Up = W[b + "ffn_up_exps.weight"][e]; D = W[b + "ffn_down_exps.weight"][e]
            Y[t] += we * ((F.silu(G @ U[t]) * (Up @ U[t])) @ D.t())
        ys = (F.silu(W[b + "ffn_gate_shexp.weight"] @ U[t]) * (W[b + "ffn_up_shexp.weight"] @ U[t])) @ W[b + "ffn_down_shexp.weight"].t()
        Y[t] += torch.sigmoid(W[b + "ffn_gate_inp_shexp.weight"] @ U[t]) * ys
    return Y


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _l2(x, eps):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def _attn_qkv(W, b, cfg, u, pos):
    """one row u [d] at position pos -> q [nh,hd], gate [nh,hd], k,v [nkv,hd] (normed, roped)."""
    nh, nkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    P = (W[b + "attn_q.weight"] @ u).view(nh, 2 * hd)
    q, gate = P[:, :hd], P[:, hd:]
    k = (W[b + "attn_k.weight"] @ u).view(nkv, hd)
    v = (W[b + "attn_v.weight"] @ u).view(nkv, hd)
    q = _rms(q, W[b + "attn_q_norm.weight"], cfg.eps)
    k = _rms(k, W[b + "attn_k_norm.weight"], cfg.eps)
    cos, sin = rope_tables(cfg, torch.tensor([pos]), torch.float64)
    q = rope_apply(q[None], cos, sin, cfg.n_rot)[0]
    k = rope_apply(k[None], cos, sin, cfg.n_rot)[0]
    return q, gate, k, v


def _attn_out(W, b, cfg, q, gate, Ks, Vs):
    """q [nh,hd]; Ks/Vs lists of [nkv,hd] that the row may attend to."""
    nh, nkv, hd = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rep = nh // nkv
    K = torch.stack(Ks)  # [n, nkv, hd]
    V = torch.stack(Vs)
    o = torch.zeros(nh, hd, dtype=q.dtype)
    for h in range(nh):
        j = h // rep
        s = (K[:, j] @ q[h]) / math.sqrt(hd)
        a = torch.softmax(s, 0)
        o[h] = a @ V[:, j]
    o = o * torch.sigmoid(gate)
    return W[b + "attn_output.weight"] @ o.reshape(-1)


def _gdn_split(cfg, y):
    nq = cfg.qk_heads * cfg.dk
    q = _l2(y[:nq].view(cfg.qk_heads, cfg.dk), cfg.eps)
    k = _l2(y[nq:2 * nq].view(cfg.qk_heads, cfg.dk), cfg.eps)
    v = y[2 * nq:].view(cfg.v_heads, cfg.dv)
    return q, k, v


def _gdn_out(W, b, cfg, o, z):
    z = z.view(cfg.v_heads, cfg.dv)
    n = _rms(o, W[b + "ssm_norm.weight"], cfg.eps) * F.silu(z)
    return W[b + "ssm_out.weight"] @ n.reshape(-1)


def new_state(cfg):
    st = {"p": 0}
    for il in range(cfg.n_layer):
        if cfg.is_attn(il):
            st[il] = {"K": [], "V": []}
        else:
            st[il] = {"S": torch.zeros(cfg.v_heads, cfg.dk, cfg.dv, dtype=torch.float64),
                      "ring": torch.zeros(cfg.conv - 1, cfg.conv_channels, dtype=torch.float64)}
    return st


def ref_commit(W, cfg, ids, st=None):
    """Literal commit pass, one token at a time. W: GGUF-named float64 tensors. Returns logits
    [n, V] (row i predicts position p+i+1) and the state after the last id."""
    st = st or new_state(cfg)
    eps = cfg.eps
    logits = []
    for tok in ids:
        pos = st["p"]
        h = W["token_embd.weight"][tok].clone()
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            u = _rms(h, W[b + "attn_norm.weight"], eps)
            L = st[il]
            if cfg.is_attn(il):
                q, gate, k, v = _attn_qkv(W, b, cfg, u, pos)
                L["K"].append(k); L["V"].append(v)
                h = h + _attn_out(W, b, cfg, q, gate, L["K"], L["V"])
            else:
                m = W[b + "attn_qkv.weight"] @ u
                z = W[b + "attn_gate.weight"] @ u
                bb = W[b + "ssm_beta.weight"] @ u
                a = W[b + "ssm_alpha.weight"] @ u
                win = torch.cat([L["ring"], m[None]], 0)        # [K, C], oldest first
                x = (W[b + "ssm_conv1d.weight"] * win.t()).sum(1)
                L["ring"] = win[1:]
                q, k, v = _gdn_split(cfg, F.silu(x))
                q = q / math.sqrt(cfg.dk)
                beta = torch.sigmoid(bb)
                g = W[b + "ssm_a"] * softplus(a + W[b + "ssm_dt.bias"])
                o = torch.zeros(cfg.v_heads, cfg.dv, dtype=torch.float64)
                for hv in range(cfg.v_heads):
                    kh = hv % cfg.qk_heads
                    S = L["S"][hv] * torch.exp(g[hv])
                    kv = S.t() @ k[kh]
                    delta = beta[hv] * (v[hv] - kv)
                    S = S + torch.outer(k[kh], delta)
                    o[hv] = S.t() @ q[kh]
                    L["S"][hv] = S
                h = h + _gdn_out(W, b, cfg, o, z)
            u = _rms(h, W[b + "post_attention_norm.weight"], eps)
            h = h + ref_moe_rows(W, b, cfg, u[None])[0]
        y = _rms(h, W["output_norm.weight"], eps)
        logits.append(W["output.weight"] @ y)
        st["p"] = pos + 1
    if not logits:
        return torch.zeros(0, cfg.n_vocab, dtype=torch.float64), st
    return torch.stack(logits), st


def ref_preview(W, cfg, st, block, coreset=0):
    """Literal preview pass (clover-diffusion.md §3) over block ids at positions p..p+B-1 on top
    of the clean state st (not modified). Returns logits [B, V] (no shift)."""
    eps = cfg.eps
    p = st["p"]
    Bn = len(block)
    K = cfg.conv
    H = torch.stack([W["token_embd.weight"][t] for t in block])      # [B, d]
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        U = _rms(H, W[b + "attn_norm.weight"], eps)
        L = st[il]
        out = torch.zeros_like(H)
        if cfg.is_attn(il):
            rows = [_attn_qkv(W, b, cfg, U[t], p + t) for t in range(Bn)]
            Ks = L["K"] + [r[2] for r in rows]
            Vs = L["V"] + [r[3] for r in rows]
            for t in range(Bn):
                out[t] = _attn_out(W, b, cfg, rows[t][0], rows[t][1], Ks, Vs)
        else:
            M = U @ W[b + "attn_qkv.weight"].t()                      # [B, C] pre-conv rows
            Z = U @ W[b + "attn_gate.weight"].t()
            wc, wr = W[b + "ssm_conv1d.weight"], W[b + "ssm_conv1d_right.weight"]
            C = M.shape[1]

            def mrow(tau):
                if tau < 0:
                    return L["ring"][K - 1 + tau]                     # ring is oldest first: ring[-1] = row p-1
                if tau >= Bn:
                    return torch.zeros(C, dtype=torch.float64)
                return M[tau]
            qs, ks, vs = [], [], []
            for t in range(Bn):
                x = torch.zeros(C, dtype=torch.float64)
                for i in range(K):
                    x += wc[:, i] * mrow(t - K + 1 + i)
                for d in range(1, K):
                    x += wr[:, d - 1] * mrow(t + d)
                q, k, v = _gdn_split(cfg, F.silu(x))
                qs.append(q); ks.append(k); vs.append(v)
            lam, hb, hc = W[b + "ssm_bd_logit_scale"], W[b + "ssm_bd_history_bias"], W[b + "ssm_bd_history_c"]
            for t in range(Bn):
                o = torch.zeros(cfg.v_heads, cfg.dv, dtype=torch.float64)
                for hv in range(cfg.v_heads):
                    kh = hv % cfg.qk_heads
                    r = L["S"][hv].t() @ (qs[t][kh] / math.sqrt(cfg.dk))
                    logit = [hb[hv]] + [lam[hv] * (qs[t][kh] @ ks[s][kh]) for s in range(Bn)]
                    w = torch.softmax(torch.stack(logit), 0)
                    o[hv] = w[0] * hc[hv] * r
                    for s in range(Bn):
                        o[hv] += w[1 + s] * vs[s][hv]
                out[t] = _gdn_out(W, b, cfg, o, Z[t])
        H = H + out
        U = _rms(H, W[b + "post_attention_norm.weight"], eps)
        H = H + ref_moe_rows(W, b, cfg, U, coreset)
    Y = _rms(H, W["output_norm.weight"], eps)
    return Y @ W["output.weight"].t()


# ----------------------------------------------------------------------------------------------
# self-test
# ----------------------------------------------------------------------------------------------

def gdn_recurrent(q, k, v, g, beta, S):
    """literal recurrence over [B,H,T,.] tensors (for testing gdn_chunked)."""
    T = q.shape[2]
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, :, t])[..., None, None]
        kv = (S * k[:, :, t, :, None]).sum(-2)
        delta = beta[:, :, t, None] * (v[:, :, t] - kv)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, 2), S


def selftest():
    torch.manual_seed(0)
    # 1. chunked GDN vs recurrence (with initial state, odd length, several chunk sizes)
    B, H, T, dk, dv = 2, 3, 77, 8, 6
    q = _l2(torch.randn(B, H, T, dk, dtype=torch.float64), 1e-6) / math.sqrt(dk)
    k = _l2(torch.randn(B, H, T, dk, dtype=torch.float64), 1e-6)
    v = torch.randn(B, H, T, dv, dtype=torch.float64)
    g = -torch.rand(B, H, T, dtype=torch.float64)
    beta = torch.rand(B, H, T, dtype=torch.float64)
    S0 = torch.randn(B, H, dk, dv, dtype=torch.float64)
    o1, s1 = gdn_recurrent(q, k, v, g, beta, S0)
    for cs in (16, 64):
        o2, s2 = gdn_chunked(q, k, v, g, beta, S0, CS=cs)
        print(f"gdn chunked(CS={cs}) vs recurrent: out {float((o1 - o2).abs().max()):.2e} state {float((s1 - s2).abs().max()):.2e}")
        assert torch.allclose(o1, o2, atol=1e-10) and torch.allclose(s1, s2, atol=1e-10)
    # 2. whole model: training forms vs literal reference (float64, random weights incl. bd tensors)
    cfg = Config(n_vocab=97, n_embd=32, n_layer=4, n_head=4, n_head_kv=2, head_dim=16, n_rot=8,
                 sections=(2, 1, 1, 0), qk_heads=2, v_heads=4, dk=8, dv=8, n_expert=6, n_expert_used=2,
                 ff_exp=16, ff_shexp=16, mask_id=96)
    model = CloverModel(cfg).double()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("conv_right", "bd_bias", "bd_c", "bd_scale")):
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if n.endswith(("bd_c", "bd_scale")) else 0.0))
            elif p.dim() >= 2:
                p.normal_(0, 0.3)
    W = model.gguf_tensors(torch.float64)
    ids = torch.randint(0, 96, (1, 40))
    starts = [0, 3, 17]
    Bk = 8
    blocks = torch.stack([ids[0, s:s + Bk] for s in starts])[None].clone()
    blocks[0, :, 1::3] = cfg.mask_id
    with torch.no_grad():
        lc, lb, _ = model(ids, blocks, starts)
    ref, _ = ref_commit(W, cfg, ids[0].tolist())
    err = float((lc[0] - ref).abs().max() / ref.abs().max())
    print(f"commit: vectorised vs literal rel err {err:.2e}")
    assert err < 1e-10
    for j, s in enumerate(starts):
        _, st = ref_commit(W, cfg, ids[0, :s].tolist())
        rp = ref_preview(W, cfg, st, blocks[0, j].tolist(), 0)
        err = float((lb[0, j] - rp).abs().max() / rp.abs().max())
        print(f"preview p={s}: vectorised vs literal rel err {err:.2e}")
        assert err < 1e-10
    # 3. coreset: C >= E equals plain; C < E differs; the state is left unchanged by preview
    _, st = ref_commit(W, cfg, ids[0, :5].tolist())
    Sbefore = st[0]["S"].clone()
    a = ref_preview(W, cfg, st, blocks[0, 1].tolist(), 0)
    bE = ref_preview(W, cfg, st, blocks[0, 1].tolist(), cfg.n_expert)
    b2 = ref_preview(W, cfg, st, blocks[0, 1].tolist(), 2)
    b1 = ref_preview(W, cfg, st, blocks[0, 1].tolist(), 1)
    assert torch.equal(a, bE) and not torch.allclose(a, b2) and not torch.allclose(b1, b2)
    assert torch.equal(Sbefore, st[0]["S"])
    # 4. commit chained over two calls equals one call
    l1, st = ref_commit(W, cfg, ids[0, :7].tolist())
    l2, _ = ref_commit(W, cfg, ids[0, 7:12].tolist(), st)
    lall, _ = ref_commit(W, cfg, ids[0, :12].tolist())
    assert torch.allclose(torch.cat([l1, l2]), lall, atol=1e-12)
    print("selftest ok")


if __name__ == "__main__":
    selftest()
