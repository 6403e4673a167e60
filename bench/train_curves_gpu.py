"""Train a small KDA language model with our kernels and with fla's, same seed, and record both
loss curves (issue: a training run a user can look at).

    python3 -P bench/train_curves_gpu.py --out DIR [--steps 300]
    python3 bench/train_curves_plot.py DIR/train_curves.json DIR/train_curves.png

The model: token embedding, `--layers` blocks of (RMSNorm, q/k/v/gate/beta projections, KDA with
q/k L2-normalised in the kernel and the gate computed in the kernel from A_log and dt_bias, beta
as logits, output projection, residual; RMSNorm, a SwiGLU MLP, residual), RMSNorm and the output
head. The data: sequences of a fixed random Markov chain over `--vocab` tokens whose next-token
distribution depends on the previous two tokens (an entropy floor the loss approaches). Both
runs start from the same weights and see the same batches; only the chunk_kda call differs
(k3compile.ops.kda.chunk_kda against fla.ops.kda.chunk_kda, the same keyword arguments). The op
runs in bf16 (its inputs cast to bf16; parameters and the rest in fp32). Writes
DIR/train_curves.json: per run the loss at every step, the seconds per step, and the largest
difference between the curves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def markov_batches(vocab: int, batch: int, tokens: int, steps: int, seed: int):
    """`steps` batches [batch, tokens + 1] of a second-order Markov chain with a sparse random
    transition table (each (a, b) pair has 4 likely successors)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.full((vocab, vocab, vocab), -4.0)
    likely = torch.randint(0, vocab, (vocab, vocab, 4), generator=gen)
    logits.scatter_(2, likely, 2.0)
    table = logits.softmax(-1).reshape(vocab * vocab, vocab)
    for _ in range(steps):
        seq = torch.randint(0, vocab, (batch, 2), generator=gen)
        for _ in range(tokens - 1):
            rows = table[seq[:, -2] * vocab + seq[:, -1]]
            seq = torch.cat([seq, torch.multinomial(rows, 1, generator=gen)], dim=1)
        yield seq


class KDABlock(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, head_dim: int, chunk_kda) -> None:
        super().__init__()
        self.heads, self.head_dim, self.chunk_kda = heads, head_dim, chunk_kda
        width = heads * head_dim
        self.norm, self.mlp_norm = torch.nn.RMSNorm(hidden), torch.nn.RMSNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * width, bias=False)
        self.gate = torch.nn.Linear(hidden, width, bias=False)
        self.beta = torch.nn.Linear(hidden, heads, bias=False)
        self.A_log = torch.nn.Parameter(torch.log(torch.empty(heads).uniform_(1, 16)))
        self.dt_bias = torch.nn.Parameter(torch.zeros(width))
        self.out = torch.nn.Linear(width, hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 4 * hidden, bias=False)
        self.down = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        h = self.norm(x)
        q, k, v = (t.reshape(shape).to(torch.bfloat16) for t in self.qkv(h).chunk(3, dim=-1))
        g = self.gate(h).reshape(shape).to(torch.bfloat16)
        o, _ = self.chunk_kda(q, k, v, g, self.beta(h).to(torch.bfloat16), A_log=self.A_log, dt_bias=self.dt_bias,
                              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        x = x + self.out(o.reshape(B, T, -1).float())
        a, b = self.up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(a) * b)


class LanguageModel(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, head_dim: int, chunk_kda) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(KDABlock(hidden, heads, head_dim, chunk_kda) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(chunk_kda, args, batches) -> dict:
    torch.manual_seed(args.seed)
    model = LanguageModel(args.vocab, args.hidden, args.layers, args.heads, args.head_dim, chunk_kda).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, args.lr, total_steps=args.steps, pct_start=0.1)
    losses, start = [], None
    for step, seq in enumerate(batches):
        if step == 1:  # after the first step's compiles
            torch.cuda.synchronize()
            start = time.perf_counter()
        seq = seq.cuda()
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), seq[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if not torch.isfinite(loss):
            break
    torch.cuda.synchronize()
    return {"losses": losses, "seconds_per_step": (time.perf_counter() - start) / max(1, len(losses) - 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import fla.ops.kda
    import k3compile.ops.kda

    batches = list(markov_batches(args.vocab, args.batch, args.tokens, args.steps, args.seed))
    runs = {}
    for side, function in (("k3compile", k3compile.ops.kda.chunk_kda), ("fla", fla.ops.kda.chunk_kda)):
        runs[side] = train(function, args, batches)
        print(side, "first", runs[side]["losses"][:3], "last", runs[side]["losses"][-3:],
              f"{runs[side]['seconds_per_step'] * 1e3:.1f} ms/step", flush=True)
    ours, theirs = (torch.tensor(runs[s]["losses"]) for s in ("k3compile", "fla"))
    result = {"args": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": runs,
              "max_abs_difference": (ours - theirs).abs().max().item() if len(ours) == len(theirs) else None,
              "last_10_mean": {s: sum(r["losses"][-10:]) / 10 for s, r in runs.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_curves.json").write_text(json.dumps(result, indent=1))
    print({k: v for k, v in result.items() if k != "runs"})
    finite = all(torch.isfinite(torch.tensor(r["losses"])).all() for r in runs.values())
    return 0 if finite and len(ours) == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
