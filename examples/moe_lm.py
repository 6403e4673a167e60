"""A small MoE language model trained with our LatentMoE layer and with the same layer written in
torch (torch._grouped_mm on a GPU, a loop over the experts on a CPU), same seed, same data: the
two loss curves, to JSON and a PNG.

The model: token embedding, then per block RMSNorm -> causal self-attention (torch SDPA) ->
residual, RMSNorm -> LatentMoE FFN -> residual; a final RMSNorm and a tied output projection.
The data: sequences of a fixed random bigram process (each token's successor drawn from a sparse
distribution of its own), which a model learns down to that process's entropy, printed.

    python examples/moe_lm.py --device cpu --steps 20        # tiny, Triton's interpreter, < 1 min
    python examples/moe_lm.py --device cuda --size gpu --steps 300 --out moe_lm

Writes OUT/moe_lm.json (both runs' losses per step) and OUT/moe_lm.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

SIZES = {
    # the interpreter runs every kernel in numpy, a fraction of a second a launch: one block, tiny
    # widths, no shared experts (six launches fewer a step)
    "tiny": dict(vocab=32, d=32, heads=2, layers=1, seq=16, batch=1, moe=dict(
        hidden_size=32, latent_dim=16, num_experts=4, top_k=2, expert_ffn_dim=16, activation="situ_glu")),
    "gpu": dict(vocab=4096, d=1024, heads=8, layers=4, seq=512, batch=16, moe=dict(
        hidden_size=1024, latent_dim=512, num_experts=32, top_k=4, expert_ffn_dim=512, num_shared_experts=2,
        shared_ffn_dim=512, activation="situ_glu")),
}


def build(torch, size: dict, use_ours: bool, grouped: bool):
    """The model class over torch.nn, its FFN our latent_moe or the torch layer."""
    from torch import nn
    from torch.nn import functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from moe_train_gpu import TorchLatentMoe

    from k3compile.ops.moe import MoeKey, latent_moe

    key = MoeKey(**size["moe"])

    class MoeFFN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, l, E, Fe = key.hidden_size, key.latent_dim, key.num_experts, key.expert_ffn_dim
            S, Fs = key.num_shared_experts, key.shared_ffn_dim
            w = l or d

            def weight(*shape, scale, shift=0.0):
                return nn.Parameter(torch.randn(*shape) * scale + shift)

            self.router_weight = weight(E, d, scale=d**-0.5)
            self.register_buffer("router_bias", torch.zeros(E))  # the selection bias: load balancing's, no gradient
            self.expert_gate_up, self.expert_down = weight(E, 2 * Fe, w, scale=w**-0.5), weight(E, w, Fe, scale=Fe**-0.5)
            if l:
                self.latent_down, self.latent_up = weight(l, d, scale=d**-0.5), weight(d, l, scale=l**-0.5)
                self.latent_norm_gain = weight(l, scale=0.0, shift=1.0)
            if S:
                self.shared_gate_up = weight(S, 2 * Fs, d, scale=d**-0.5)
                self.shared_down = weight(S, d, Fs, scale=Fs**-0.5)
            self.torch_layer = TorchLatentMoe(torch, key)

        def forward(self, x):
            tensors = {name: getattr(self, name, None) for name in ("router_weight", "router_bias", "expert_gate_up",
                                                                     "expert_down", "latent_down", "latent_up",
                                                                     "latent_norm_gain", "shared_gate_up",
                                                                     "shared_down")}
            rows = x.reshape(-1, x.shape[-1])
            if use_ours:
                out = latent_moe(rows, **tensors, layer=key)
            else:
                out = self.torch_layer({"x": rows, **tensors}, grouped)
            return out.reshape(x.shape)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = size["d"]
            self.attention_norm, self.ffn_norm = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.ffn = MoeFFN()

        def forward(self, x):
            B, T, d = x.shape
            q, k, v = self.qkv(self.attention_norm(x)).reshape(B, T, 3, size["heads"], -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attended.transpose(1, 2).reshape(B, T, d))
            return x + self.ffn(self.ffn_norm(x))

    class MoeLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(size["vocab"], size["d"])
            nn.init.normal_(self.embed.weight, std=size["d"] ** -0.5)  # tied: unit-RMS rows give O(1) logits
            self.blocks = nn.ModuleList(Block() for _ in range(size["layers"]))
            self.norm = nn.RMSNorm(size["d"])

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.T

    return MoeLM()


def bigram_data(torch, vocab: int, seed: int):
    """A random bigram process: each token's successors, 4 of them with fixed probabilities.
    Returns (sample(batch, seq, generator) -> tokens, the process's entropy in nats)."""
    gen = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(vocab, generator=gen)[:4] for _ in range(vocab)])
    probabilities = torch.tensor([0.55, 0.25, 0.15, 0.05])
    entropy = -(probabilities * probabilities.log()).sum().item()

    def sample(batch: int, seq: int, generator):
        tokens = torch.empty(batch, seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab, (batch,), generator=generator)
        for t in range(seq):
            choice = torch.multinomial(probabilities.expand(batch, -1), 1, generator=generator)[:, 0]
            tokens[:, t + 1] = successors[tokens[:, t], choice]
        return tokens

    return sample, entropy


def train(torch, size: dict, use_ours: bool, args, device) -> list[float]:
    torch.manual_seed(args.seed)  # the same initial weights for both runs
    model = build(torch, size, use_ours, grouped=device.type == "cuda" and hasattr(torch, "_grouped_mm"))
    model = model.to(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    for name, buffer in model.named_buffers():  # the selection bias stays fp32
        if name.endswith("router_bias"):
            buffer.data = buffer.data.float()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sample, _ = bigram_data(torch, size["vocab"], args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same batches for both runs
    losses = []
    for step in range(args.steps):
        tokens = sample(size["batch"], size["seq"], gen).to(device)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, size["vocab"]), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            print(f"{'ours' if use_ours else 'torch'} step {step}: loss {losses[-1]:.4f}", flush=True)
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help="default: tiny on cpu, gpu on cuda")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("moe_lm"))
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    import torch

    device = torch.device(args.device)
    size = SIZES[args.size or ("tiny" if device.type == "cpu" else "gpu")]
    _, entropy = bigram_data(torch, size["vocab"], args.seed)
    runs, seconds = {}, {}
    for name, use_ours in (("ours", True), ("torch", False)):
        start = time.perf_counter()
        runs[name] = train(torch, size, use_ours, args, device)
        seconds[name] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    record = {"size": {**size, "moe": dict(size["moe"])}, "device": str(device), "steps": args.steps, "lr": args.lr,
              "seed": args.seed, "entropy": entropy, "seconds": seconds, "losses": runs}
    (args.out / "moe_lm.json").write_text(json.dumps(record, indent=1))
    gap = max(abs(a - b) for a, b in zip(runs["ours"], runs["torch"], strict=True))
    print(f"wrote {args.out}/moe_lm.json; largest loss difference between the runs {gap:.2e}")
    try:
        import matplotlib
    except ImportError:  # not a dependency of k3compile
        print("matplotlib is not installed: no plot (the curves are in the JSON)")
        return 0 if all(math.isfinite(v) for losses in runs.values() for v in losses) else 1
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for name, losses in runs.items():
        axes.plot(losses, label=f"{name} ({seconds[name]:.0f} s)", linestyle="-" if name == "ours" else "--")
    axes.axhline(entropy, color="grey", linewidth=0.8, label=f"the data's entropy ({entropy:.2f})")
    axes.set(xlabel="step", ylabel="cross-entropy (nats)",
             title=f"MoE LM, {size['layers']} layers, LatentMoE {size['moe']['num_experts']} experts top-"
                   f"{size['moe']['top_k']}, {device.type}")
    axes.legend()
    figure.tight_layout()
    figure.savefig(args.out / "moe_lm.png", dpi=120)
    print(f"wrote {args.out}/moe_lm.png")
    return 0 if all(math.isfinite(v) for losses in runs.values() for v in losses) else 1


if __name__ == "__main__":
    sys.exit(main())
