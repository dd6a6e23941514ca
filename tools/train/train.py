"""Trains a model of the Strata family (model.py) on the corpus of corpus.py and writes it in K3's
layout (export.py), with, beside it: training_log.txt, loss_curve.png, heldout.json (held-out loss
of the stored weights: nats/token, bits/byte, next-token accuracy, by the protocol of
`strata eval`) and reference/ (PyTorch fp32 logits of a few prompts for the engine check).

  python3 train.py --preset tiny --corpus CORPUS_DIR --out DIR [--minutes 18] [--threads 1]
  python3 train.py eval --ckpt DIR --text FILE [--ctx 512]      (the held-out protocol alone)
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

import export
import model as M
import tokenizer as tokmod

REF_PROMPTS = [
    "It is a truth universally acknowledged, that a single man in possession",
    "The capital of France is",
    "Emma Woodhouse, handsome, clever, and rich,",
    "def fib(n):\n    ",
    "HACKER, n. One who",
]


# ---------------------------------------------------------------- the held-out protocol
# The text's ids are cut into windows of ctx tokens; window [i, i+ctx) is fed as BOS + ids[i:i+ctx-1]
# and predicts ids[i:i+ctx], so every id of the text is predicted exactly once, each window from a
# fresh state. nats/token = Σ NLL / #ids; bits/byte = Σ NLL / (ln 2 · UTF-8 bytes of the text);
# accuracy = share of ids that are their row's argmax (ties: the lower id). strata eval does the same.

def windows(ids, ctx, bos):
    out = []
    for i in range(0, len(ids), ctx):
        chunk = ids[i:i + ctx]
        out.append(([bos] + chunk[:-1], chunk))
    return out


@torch.no_grad()
def heldout(m, ids, nbytes, ctx, batch=8):
    m.eval()
    dev = next(m.parameters()).device
    nll, correct, n = 0.0, 0, 0
    ws = windows(ids, ctx, m.c.bos_token_id)
    for b in range(0, len(ws), batch):
        group = ws[b:b + batch]
        by_len = {}
        for inp, tgt in group:  # windows of one length go in one batch (only the last is shorter)
            by_len.setdefault(len(inp), []).append((inp, tgt))
        for L, g in by_len.items():
            x = torch.tensor([a for a, _ in g], device=dev)
            y = torch.tensor([t for _, t in g], device=dev)
            logits = m(x).double()
            lp = torch.log_softmax(logits, -1)
            nll -= lp.gather(-1, y.unsqueeze(-1)).sum().item()
            correct += (logits.argmax(-1) == y).sum().item()
            n += y.numel()
    return {"tokens": n, "bytes": nbytes, "ctx": ctx, "nats_per_token": nll / n,
            "bits_per_byte": nll / math.log(2) / nbytes, "accuracy": correct / n}


# ---------------------------------------------------------------- training

def lr_at(step, frac, peak, warm):
    """Linear warm-up over the first `warm` steps, then cosine to peak/10 over the run's fraction
    `frac` (of its steps or of its time budget, whichever binds)."""
    return peak * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def batch_of(data, B, T, bos, gen):
    off = torch.randint(0, len(data) - T, (B,), generator=gen)
    x = torch.stack([data[o:o + T] for o in off.tolist()])
    inp = torch.cat([torch.full((B, 1), bos, dtype=torch.long), x[:, :-1]], 1)
    return inp, x


def chat_rows(samples, n, T, bos, gen):
    """n rows of T targets packed from random chat samples (chat.py), each row fed after BOS."""
    rows = []
    for _ in range(n):
        r = []
        while len(r) < T:
            r.extend(samples[int(torch.randint(0, len(samples), (1,), generator=gen))])
        rows.append(r[:T])
    x = torch.tensor(rows, dtype=torch.long)
    return torch.cat([torch.full((n, 1), bos, dtype=torch.long), x[:, :-1]], 1), x


def plot(path, steps, losses, evals):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, losses, lw=0.8, label="train (per step)")
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], "o-", label="held-out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def routing_margin(m, ids):
    """Smallest gap, over MoE layers and positions, between the k-th and (k+1)-th biased score:
    a routing decision closer than rounding could go either way in another implementation."""
    gaps = []

    def hook(mod, inp, out):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        s = torch.sigmoid(x.float() @ mod.gate.weight.t()) + mod.gate.e_score_correction_bias
        top = torch.topk(s, mod.k + 1, dim=-1).values
        gaps.append((top[:, mod.k - 1] - top[:, mod.k]).min().item())

    hs = [mm.register_forward_hook(hook) for mm in m.moe_layers()]
    with torch.no_grad():
        m(torch.tensor([ids]))
    for h in hs:
        h.remove()
    return min(gaps)


def write_reference(m, tok, out_dir, prompts):
    """reference/prompts.json + reference/logits.npy: fp32 logits of every position of each prompt
    (BOS + the prompt's ids), rows concatenated in prompt order."""
    import numpy as np
    rd = os.path.join(out_dir, "reference")
    os.makedirs(rd, exist_ok=True)
    rows, meta = [], []
    with torch.no_grad():
        for p in prompts:
            ids = [m.c.bos_token_id] + tok.encode(p)
            lg = m(torch.tensor([ids]))[0].float()
            rows.append(lg.numpy())
            meta.append({"text": p, "ids": ids, "routing_margin": routing_margin(m, ids),
                         "max_abs_logit": float(lg.abs().max())})
    np.save(os.path.join(rd, "logits.npy"), np.concatenate(rows, 0).astype("<f4"))
    with open(os.path.join(rd, "prompts.json"), "w") as f:
        json.dump({"vocab": m.c.vocab_size, "prompts": meta}, f, indent=1)
    return meta


@torch.no_grad()
def sample(m, tok, prompt, n, temperature=0.0):
    ids = [m.c.bos_token_id] + tok.encode(prompt)
    for _ in range(n):
        lg = m(torch.tensor([ids]))[0, -1]
        nxt = int(lg.argmax()) if temperature == 0 else int(torch.multinomial(torch.softmax(lg / temperature, -1), 1))
        if nxt == m.c.eos_token_id:
            break
        ids.append(nxt)
    return tok.decode(ids[1:])


def train(a):
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda":  # training matmuls in TF32; the stored numbers are computed without it
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    tok = tokmod.load(a.tokenizer)
    pre = dict(M.PRESETS[a.preset])
    c = M.Config(**pre)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "training_log.txt"), "w")

    def say(s):
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    t0 = time.time()
    train_text = open(os.path.join(a.corpus, "train.txt"), encoding="utf-8").read()
    held_text = open(os.path.join(a.corpus, "heldout.txt"), encoding="utf-8").read()
    if a.heldout_chars:
        j = held_text.find("\n\n", a.heldout_chars)
        held_text = held_text[:j if j > 0 else a.heldout_chars]
    data = torch.tensor(tok.encode(train_text), dtype=torch.long)
    chat_samples = []
    if a.chat_frac > 0 and tok.kind == "bpe":
        import chat
        chat_samples = chat.samples(tok, train_text, a.seed)
        assert chat_samples, "--chat-frac: the corpus has no dictionary entries for chat.py"
        say(f"chat: {len(chat_samples)} one-turn exchanges in K3's chat format (chat.py), "
            f"{a.chat_frac:.0%} of every batch's rows")
    held_ids = tok.encode(held_text)
    say(f"corpus: {len(train_text.encode())} bytes -> {len(data)} training tokens; held-out {len(held_ids)} tokens "
        f"({time.time() - t0:.0f} s to tokenize)")
    m = M.Model(c).to(dev)
    total, active = M.count_params(m)
    say(f"preset {a.preset}: {total / 1e6:.2f}M parameters ({active / 1e6:.2f}M active per token); "
        f"config {json.dumps(c.to_text_config(), sort_keys=True)}")
    say(f"training: batch {a.batch} x seq {a.seq}, peak lr {a.lr}, {a.steps} steps max, {a.minutes} min max, "
        f"bias rate {a.bias_rate}, QAT (MXFP4 experts) for the last {a.qat_frac:.0%}, threads {a.threads}, "
        f"device {a.device}, torch {torch.__version__}")
    decay, no_decay = [], []
    for n_, p in m.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in n_ else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed)
    steps_log, losses, evals = [], [], []
    budget = a.minutes * 60
    step, t_train = 0, time.time()
    qat_on = False
    while step < a.steps:
        elapsed = time.time() - t_train
        # the schedule follows wall time when the time budget binds first
        frac = max(step / a.steps, elapsed / budget if budget else 0)
        if frac >= 1:
            break
        if not qat_on and frac >= 1 - a.qat_frac:
            for mm in m.moe_layers():
                mm.fake_quant = True
            qat_on = True
            say(f"step {step}: MXFP4 fake quantisation of the routed experts on")
        lr = lr_at(step, frac, a.lr, a.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch_of(data, a.batch, a.seq, c.bos_token_id, gen)
        n_chat = int(round(a.batch * a.chat_frac)) if chat_samples else 0
        if n_chat:
            x[:n_chat], y[:n_chat] = chat_rows(chat_samples, n_chat, a.seq, c.bos_token_id, gen)
        x, y = x.to(dev), y.to(dev)
        m.train()
        logits = m(x)
        loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        m.update_bias(a.bias_rate)
        steps_log.append(step)
        losses.append(loss.item())
        if step % a.log_every == 0:
            loads = [mm.last_load.float() for mm in m.moe_layers()]
            imb = max((l.max() / l.mean()).item() for l in loads)
            say(f"step {step} loss {loss.item():.4f} lr {lr:.2e} gnorm {gn:.2f} max-load/mean {imb:.2f} "
                f"elapsed {time.time() - t_train:.0f}s tok/s {(step + 1) * a.batch * a.seq / (time.time() - t_train):.0f}")
        if a.eval_every and step % a.eval_every == 0 and step > 0:
            r = heldout(m, held_ids[:a.eval_every_tokens], 1, a.seq)
            m.train()
            evals.append((step, r["nats_per_token"]))
            say(f"step {step} held-out (first {len(held_ids[:a.eval_every_tokens])} tokens) {r['nats_per_token']:.4f}")
        step += 1
    say(f"trained {step} steps in {time.time() - t_train:.0f} s")
    m = m.cpu()
    payload = export.export(m, a.out, tok if tok.kind == "bpe" else None)
    say(f"exported to {a.out}: {payload} payload bytes")
    stored = export.load(a.out)
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held_text)
    # NOTE: the stored numbers are fp32 (no TF32 on the GPU): they are what strata eval must match
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    r = heldout(stored.to(dev), held_ids, len(held_text.encode()), a.eval_ctx)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    stored = stored.cpu()
    r["text"] = "heldout.txt"
    with open(os.path.join(a.out, "heldout.json"), "w") as f:
        json.dump(r, f, indent=2)
    say(f"held-out (stored weights, {r['tokens']} tokens, ctx {a.eval_ctx}): {r['nats_per_token']:.4f} nats/token, "
        f"{r['bits_per_byte']:.4f} bits/byte, accuracy {r['accuracy']:.4f}")
    meta = write_reference(stored, tok, a.out, REF_PROMPTS)
    say("reference logits: " + ", ".join(f"{len(p['ids'])} positions (routing margin {p['routing_margin']:.1e})" for p in meta))
    for p in REF_PROMPTS[:3]:
        say(f"greedy: {p!r} -> {sample(stored, tok, p, 48)!r}")
    plot(os.path.join(a.out, "loss_curve.png"), steps_log, losses, evals + [(step, r["nats_per_token"])])
    log.close()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        ap = argparse.ArgumentParser(prog="train.py eval")
        ap.add_argument("--ckpt", required=True)
        ap.add_argument("--text", required=True)
        ap.add_argument("--ctx", type=int, default=512)
        ap.add_argument("--tokenizer", default="bytes")
        a = ap.parse_args(sys.argv[2:])
        torch.set_num_threads(1)
        m = export.load(a.ckpt)
        text = open(a.text, encoding="utf-8").read()
        tok = tokmod.load(a.tokenizer)
        print(json.dumps(heldout(m, tok.encode(text), len(text.encode()), a.ctx), indent=2))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", choices=sorted(M.PRESETS))
    ap.add_argument("--corpus", required=True, help="corpus.py's output folder (train.txt, heldout.txt)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="bytes", help="bytes, or bpe:RANKFILE:N")
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--minutes", type=float, default=0, help="wall-time budget for the training loop (0 = none)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--qat-frac", type=float, default=0.15)
    ap.add_argument("--chat-frac", type=float, default=0.1,
                    help="BPE models: share of each batch's rows that are chat-format exchanges (chat.py)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-every-tokens", type=int, default=16384)
    ap.add_argument("--eval-ctx", type=int, default=512)
    ap.add_argument("--heldout-chars", type=int, default=0, help="keep only this much of heldout.txt (0 = all)")
    train(ap.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
