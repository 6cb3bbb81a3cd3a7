#!/usr/bin/python3
"""Trains the small Clover model (tools/train/README.md has the recipe and the results).

Objectives, every step, on the same batch of B windows of T tokens from the training split:
  L = L_ar + L_diff + 0.01 * L_balance
  L_ar      causal next-token cross-entropy at every position (commit pass).
  L_diff    block diffusion: NB block starts p_j drawn uniformly (distinct, p_j + 32 <= T, shared by
            the batch); block j = tokens p_j .. p_j+31 with each row replaced by <|mask|> with
            probability r ~ U(0,1) drawn per (window, block) (at least one row masked); one preview
            pass per block over the clean causal prefix state (clover-diffusion.md §3, computed in
            the same forward as the commit pass); cross-entropy on the masked rows only, no shift
            (row i predicts token p_j+i), averaged over masked rows.
  L_balance Switch-style expert load balance (E * sum_e f_e * mean P_e), averaged over layers.
With --distill D.npz (make_distill.py: real prefixes + the model's own greedy continuations) a
second batch each step adds  w_d * L_diff' + w_a * L_ar'  on it: the block-diffusion loss with NB
of the blocks that start at the prefix end, +32, +64 (the positions the LowConfidence decoder
fills), and the causal loss on the continuation tokens (--distill-ar-weight, default 0: the causal
head keeps learning real text only). Use --text-diff-weight 0 with it: a block after a real-text
prefix looks the same to the preview pass whether its target is real text (high entropy) or the
greedy continuation (low entropy), so the two diffusion targets conflict and the text one teaches
the preview pass to hedge exactly where it should commit. Part 3 measured this: with both at
weight 1, 5 % of held-out distillation rows reached p >= 0.95 after 5 minutes.
Schedule: AdamW (0.9, 0.95), weight decay 0.1 on matrices, grad clip 1.0, linear warm-up, then
cosine to 10% over the WALL-CLOCK budget (--minutes), so a run under CPU contention still ends
annealed. Checkpoints (latest and best held-out) go to --out every --eval-every seconds.
"""
import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe
import data
from clover_ref import CloverModel, Config
from export_gguf import load_gguf_model

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKEN_CACHE = "/tmp/clover_small_tokens.npz"  # the tokenized split, shared by every script here


def load_tokens(tok, cache):
    if os.path.exists(cache):
        d = np.load(cache)
        return d["train"], d["held"]
    train, held = data.load_split()
    eot = tok.special("<|endoftext|>")

    def enc(docs):
        out = []
        for _, t in docs:
            out += tok.encode(t) + [eot]
        return np.array(out, dtype=np.int16)
    tr, he = enc(train), enc(held)
    np.savez(cache, train=tr, held=he)
    return tr, he


def model_config(args, tok):
    return Config(n_vocab=tok.n_vocab, n_embd=args.d, n_layer=args.layers, n_head=4, n_head_kv=2, head_dim=64,
                  n_rot=16, sections=(3, 3, 2, 0), rope_theta=10000.0, qk_heads=4, v_heads=8, dk=32, dv=32,
                  n_expert=args.experts, n_expert_used=2, ff_exp=args.ff_exp, ff_shexp=args.ff_sh,
                  mask_id=tok.special("<|mask|>"), block_size=32)


def make_batch(stream, B, T, NB, Bk, mask_id, gen):
    off = torch.randint(0, len(stream) - T - 1, (B,), generator=gen)
    ids = torch.stack([torch.from_numpy(stream[o:o + T + 1].astype(np.int64)) for o in off.tolist()])
    starts = sorted(torch.randperm(T - Bk + 1, generator=gen)[:NB].tolist())
    blocks = torch.stack([ids[:, s:s + Bk] for s in starts], 1)         # [B, NB, Bk] targets
    r = torch.rand(B, NB, 1, generator=gen)
    m = torch.rand(B, NB, Bk, generator=gen) < r
    force = torch.randint(0, Bk, (B, NB), generator=gen)
    m.scatter_(2, force[..., None], True)
    inp = blocks.masked_fill(m, mask_id)
    return ids, starts, blocks, inp, m


def losses(model, ids, starts, blocks, inp, m, diffusion=True):
    """diffusion=False runs the commit pass only (l_d is 0): with --text-diff-weight 0 the preview
    blocks on real text feed a loss nobody uses. Measured on one core with --distill: 6.3 s/step
    without them, against 6.5 s/step in part 3 with them (the distillation batch dominates)."""
    lc, lb, aux = model(ids[:, :-1], inp if diffusion else None, starts if diffusion else ())
    l_ar = F.cross_entropy(lc.reshape(-1, lc.shape[-1]), ids[:, 1:].reshape(-1))
    l_d = F.cross_entropy(lb[m], blocks[m]) if diffusion else torch.zeros(())
    return l_ar, l_d, aux, lb


class Distill:
    """Rows [prefix P | cont] per P (make_distill.py); the last `held` rows of each P are held out."""

    def __init__(self, path, held=48):
        d = np.load(path)
        self.cont = int(d["cont"])
        self.sets = {int(k[4:]): d[k].astype(np.int64) for k in d.files if k.startswith("ids_")}
        self.held = held

    def batch(self, B, NB, Bk, mask_id, gen, split="train", decode_share=0.0):
        Ps = sorted(self.sets)
        P = Ps[int(torch.randint(0, len(Ps), (1,), generator=gen))]
        rows = self.sets[P][:-self.held] if split == "train" else self.sets[P][-self.held:]
        pick = torch.randint(0, len(rows), (B,), generator=gen)
        ids = torch.from_numpy(rows[pick.numpy()])                    # [B, P + cont]
        cand = list(range(P, P + self.cont - Bk + 1, Bk))            # block starts the decoder uses
        starts = sorted(cand[i] for i in torch.randperm(len(cand), generator=gen)[:NB].tolist())
        blocks = torch.stack([ids[:, s:s + Bk] for s in starts], 1)
        r = torch.rand(B, len(starts), 1, generator=gen)
        m = torch.rand(B, len(starts), Bk, generator=gen) < r
        m.scatter_(2, torch.randint(0, Bk, (B, len(starts)), generator=gen)[..., None], True)
        if decode_share > 0:
            m = torch.where(torch.rand(B, len(starts), 1, generator=gen) < decode_share,
                            decode_order_masks(B, len(starts), Bk, gen), m)
        return P, ids, starts, blocks, blocks.masked_fill(m, mask_id), m


def decode_order_masks(B, NB, Bk, gen):
    """Masks shaped like the states the LowConfidence decoder visits: rows 0..k-1 committed
    (k ~ U{0..Bk-1}), row k and most later rows masked, a few later rows (share q ~ U(0, 0.3))
    already committed out of order. Why: with a uniform mask ratio most masked rows have
    committed neighbours on both sides, which the decoder never offers -- it starts from an
    all-mask block and fills it mostly left to right -- so the preview pass learned to infill
    and stayed unsure exactly on the rows the decoder asks about (C++ decode on the part-3
    model: about one row per preview pass while 28 % of uniformly masked rows were confident)."""
    pos = torch.arange(Bk)
    k = torch.randint(0, Bk, (B, NB, 1), generator=gen)
    q = 0.3 * torch.rand(B, NB, 1, generator=gen)
    early = (torch.rand(B, NB, Bk, generator=gen) < q) & (pos > k)
    return (pos >= k) & ~early


def distill_losses(model, P, ids, starts, blocks, inp, m):
    lc, lb, aux = model(ids, inp, starts)
    l_ar = F.cross_entropy(lc[:, P - 1:-1].reshape(-1, lc.shape[-1]), ids[:, P:].reshape(-1))
    return l_ar, F.cross_entropy(lb[m], blocks[m]), aux, lb


@torch.no_grad()
def evaluate_distill(model, dist, cfg, n_batches=4):
    """On held-out continuations: diffusion loss, share of masked rows with p >= 0.95, their accuracy."""
    gen = torch.Generator().manual_seed(778)
    model.eval()
    ld = conf = acc = 0.0
    for _ in range(n_batches):
        P, ids, starts, blocks, inp, m = dist.batch(8, 2, 32, cfg.mask_id, gen, "held")
        _, l_d, _, lb = distill_losses(model, P, ids, starts, blocks, inp, m)
        pmax, am = torch.softmax(lb[m], -1).max(-1)
        ld += float(l_d)
        conf += float((pmax >= 0.95).float().mean())
        acc += float((am == blocks[m]).float().mean())
    model.train()
    out = {"d_diff": ld / n_batches, "d_conf": conf / n_batches, "d_acc": acc / n_batches}
    out.update(simulate_decoder(model, dist, cfg))
    return out


@torch.no_grad()
def simulate_decoder(model, dist, cfg, rows=8, tau=0.95):
    """LowConfidence (clover-diffusion.md §4, greedy) on the first block after held-out prefixes
    of 64 and 192 tokens, `rows` of each, batched (every row keeps its own mask state):
    sim_tpf = 32 / (preview passes + 1 commit pass) per block, the number the benchmark reports,
    and sim_agree = share of committed rows equal to the distillation target (greedy AR)."""
    from diffusion_eval import fill_block  # here, not at the top: diffusion_eval imports train
    model.eval()
    Bk = cfg.block_size
    passes = agree = n = 0
    for P in (64, 192):
        if P not in dist.sets:
            continue
        rows_P = torch.from_numpy(dist.sets[P][-rows:])                  # [rows, P + cont]
        block, p = fill_block(model, cfg, rows_P[:, :P], tau, Bk)
        passes += p
        agree += int((block == rows_P[:, P:P + Bk]).sum())
        n += len(rows_P)
    model.train()
    return {"sim_tpf": n * Bk / (passes + n), "sim_agree": agree / (n * Bk)}


@torch.no_grad()
def evaluate(model, held, args, cfg, n_batches=4):
    gen = torch.Generator().manual_seed(777)
    model.eval()
    tot = {"ar": 0.0, "diff": 0.0, "conf": 0.0, "conf_acc": 0.0, "acc": 0.0}
    nconf = 0
    for _ in range(n_batches):
        ids, starts, blocks, inp, m = make_batch(held, 8, args.T, args.NB, 32, cfg.mask_id, gen)
        l_ar, l_d, _, lb = losses(model, ids, starts, blocks, inp, m)
        tot["ar"] += float(l_ar)
        tot["diff"] += float(l_d)
        p = torch.softmax(lb[m], -1)
        pmax, am = p.max(-1)
        ok = am == blocks[m]
        conf = pmax >= 0.95
        tot["conf"] += float(conf.float().mean())
        tot["acc"] += float(ok.float().mean())
        if conf.any():
            tot["conf_acc"] += float(ok[conf].float().mean())
            nconf += 1
    model.train()
    out = {k: v / n_batches for k, v in tot.items()}
    out["conf_acc"] = tot["conf_acc"] / max(1, nconf)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=70)
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "clover-small", "run"))
    ap.add_argument("--log", default=os.path.join(ROOT, "models", "clover-small", "train_log.csv"))
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--B", type=int, default=12)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--NB", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--ff-exp", type=int, default=128)
    ap.add_argument("--ff-sh", type=int, default=256)
    ap.add_argument("--eval-every", type=float, default=300, help="seconds")
    ap.add_argument("--bench", type=int, default=0, help="time N steps and exit")
    ap.add_argument("--init", default="", help="start from this checkpoint's weights (and optimizer state when saved), "
                    "or from a GGUF written by export_gguf.py (weights only; its shape replaces --d etc.)")
    ap.add_argument("--distill", default="", help="make_distill.py data: adds the self-distillation batch")
    ap.add_argument("--distill-weight", type=float, default=1.0, help="weight of the distillation diffusion loss")
    ap.add_argument("--distill-ar-weight", type=float, default=0.0,
                    help="weight of the causal loss on the distillation continuations")
    ap.add_argument("--decode-masks", type=float, default=0.0,
                    help="share of distillation blocks masked in decoder order (decode_order_masks), the rest uniform")
    ap.add_argument("--text-diff-weight", type=float, default=1.0,
                    help="weight of the diffusion loss on training text (0 with --distill: see the docstring)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    tok = bpe.Tokenizer.load(os.path.join(ROOT, "models", "clover-small", "tokenizer.json"))
    train_stream, held_stream = load_tokens(tok, TOKEN_CACHE)
    cfg = model_config(args, tok)
    model = CloverModel(cfg)
    init_ck = None
    if args.init.endswith(".gguf"):
        model, cfg = load_gguf_model(args.init)
        init_ck = {"from_gguf": args.init}
    elif args.init:
        init_ck = torch.load(args.init, map_location="cpu")
    dist = Distill(args.distill) if args.distill else None
    if init_ck and "model" in init_ck:
        assert init_ck["config"] == dataclasses.asdict(cfg), "--init checkpoint has another shape"
        model.load_state_dict(init_ck["model"])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params}  train tokens {len(train_stream)}  held-out tokens {len(held_stream)}", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith(("conv", "conv_right"))]
    nodecay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith(("conv", "conv_right")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if init_ck and "optimizer" in init_ck:
        opt.load_state_dict(init_ck["optimizer"])
    os.makedirs(args.out, exist_ok=True)
    budget = args.minutes * 60
    t0 = time.time()
    last_eval = t0
    best = float("inf")
    step, tokens = 0, 0
    logf = None
    if not args.bench:
        logf = open(args.log, "w", newline="")
        logw = csv.writer(logf)
        logw.writerow(["step", "seconds", "tokens", "lr", "loss_ar", "loss_diff", "balance",
                       "heldout_ar", "heldout_ppl", "heldout_diff", "heldout_conf95", "heldout_conf95_acc", "heldout_diff_acc",
                       "loss_distill_ar", "loss_distill_diff", "distill_held_diff", "distill_held_conf95", "distill_held_acc",
                       "sim_tpf", "sim_agree"])
    ema = None

    def save(tag, ev):
        ck = {"config": dataclasses.asdict(cfg), "model": model.state_dict(), "step": step, "tokens": tokens,
              "seconds": time.time() - t0, "eval": ev, "args": vars(args)}
        if tag == "latest":
            ck["optimizer"] = opt.state_dict()
        torch.save(ck, os.path.join(args.out, tag + ".pt"))

    while True:
        el = time.time() - t0
        frac = min(1.0, el / budget)
        if step < args.warmup and not (init_ck and "optimizer" in init_ck):
            lr = args.lr * (step + 1) / args.warmup
        else:
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, starts, blocks, inp, m = make_batch(train_stream, args.B, args.T, args.NB, 32, cfg.mask_id, gen)
        l_ar, l_d, aux, _ = losses(model, ids, starts, blocks, inp, m, args.text_diff_weight != 0)
        loss = l_ar + args.text_diff_weight * l_d + 0.01 * aux
        dcur = ("", "")
        if dist:
            P, *db = dist.batch(args.B, args.NB, 32, cfg.mask_id, gen, decode_share=args.decode_masks)
            dl_ar, dl_d, daux, _ = distill_losses(model, P, *db)
            loss = loss + args.distill_ar_weight * dl_ar + args.distill_weight * dl_d + 0.01 * daux
            dcur = (f"{float(dl_ar):.4f}", f"{float(dl_d):.4f}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += args.B * args.T
        cur = (float(l_ar), float(l_d), float(aux))
        ema = cur if ema is None else tuple(0.95 * a + 0.05 * b for a, b in zip(ema, cur))
        if args.bench:
            if step == 2:
                tb = time.time()
            if step == args.bench:
                dt = (time.time() - tb) / (args.bench - 2)
                print(f"params {n_params}: {dt:.2f} s/step, {args.B * args.T / dt:.0f} tok/s, loss {cur}")
                return
            continue
        now = time.time()
        do_eval = now - last_eval >= args.eval_every or now - t0 >= budget
        row = [step, round(now - t0, 1), tokens, f"{lr:.3e}", f"{cur[0]:.4f}", f"{cur[1]:.4f}", f"{cur[2]:.4f}"]
        if do_eval:
            ev = evaluate(model, held_stream, args, cfg)
            row += [f"{ev['ar']:.4f}", f"{math.exp(ev['ar']):.3f}", f"{ev['diff']:.4f}", f"{ev['conf']:.4f}",
                    f"{ev['conf_acc']:.4f}", f"{ev['acc']:.4f}"]
            dev = evaluate_distill(model, dist, cfg) if dist else {}
            ev.update(dev)
            print(f"step {step} {now - t0:.0f}s tok {tokens} lr {lr:.2e} train ar {ema[0]:.3f} diff {ema[1]:.3f} | "
                  f"held ar {ev['ar']:.3f} ppl {math.exp(ev['ar']):.2f} diff {ev['diff']:.3f} conf95 {ev['conf']:.3f} "
                  f"acc@conf {ev['conf_acc']:.3f} acc {ev['acc']:.3f}"
                  + (f" | distill diff {dev['d_diff']:.3f} conf95 {dev['d_conf']:.3f} acc {dev['d_acc']:.3f}"
                     f" | decoder sim TPF {dev['sim_tpf']:.2f} agree {dev['sim_agree']:.3f}" if dev else ""),
                  flush=True)
            save("latest", ev)
            score = ev["ar"] + (ev["d_diff"] if dist else ev["diff"])
            if score < best:
                best = score
                save("best", ev)
            last_eval = now
        else:
            row += [""] * 6
        row += list(dcur) + ([f"{ev[k]:.4f}" for k in ("d_diff", "d_conf", "d_acc", "sim_tpf", "sim_agree")]
                        if do_eval and dist else [""] * 5)
        if step % 10 == 0 or do_eval:
            logw.writerow(row)
            logf.flush()
        if step % 50 == 0:
            print(f"step {step} {now - t0:.0f}s lr {lr:.2e} ar {ema[0]:.3f} diff {ema[1]:.3f} bal {ema[2]:.3f}", flush=True)
        if now - t0 >= budget:
            break
    logf.close()
    print("done", step, "steps", tokens, "tokens", f"{time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
