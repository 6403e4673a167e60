"""A sweep of legalize-triton's MoE decode tiles on the GPU: each candidate compiles a latent_moe
spec with the tables patched, then times every kernel of `moe_decode` at T tokens with
torch.profiler (mean GPU µs of 10 calls) and checks the output against the first candidate's.
Needs k3compile (compiles on the device):

    python3 -P bench/moe_tiles_gpu.py --spec examples/latent_moe.toml --out DIR [--tokens 1]

Writes DIR/moe_tiles_<spec>.md (also printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/moe_gpu.py
from moe_gpu import profile  # noqa: E402

# (name, dense projections at R <= 16, one-row (pair) projections, token-centric down at R <= 2)
CANDIDATES = (
    ("current", None, None, None),
    ("dense BN32", dict(block_r=16, block_n=32, block_d=128, num_warps=4), None, None),
    ("dense BD256", dict(block_r=16, block_n=16, block_d=256, num_warps=4), dict(block_n=32, block_d=256),
     dict(block_n=16, block_d=256)),
    ("pair BN16 BD512", None, dict(block_n=16, block_d=512), dict(block_n=8, block_d=512)),
    ("dense 8 warps", dict(block_r=16, block_n=32, block_d=256, num_warps=8), dict(block_n=128, block_d=64),
     dict(block_n=4, block_d=512)),
)


def main(argv=None) -> int:
    import torch

    from k3compile import compile as compile_spec
    from k3compile.backends.triton import legalize

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args(argv)
    dense, pair, slots = legalize.DENSE_PROJECTION_TILES, legalize.PAIR_PROJECTION_TILE, legalize.SLOT_PROJECTION_TILES
    results, reference = [], None
    for name, dense_small, pair_tile, slot_small in CANDIDATES:
        legalize.DENSE_PROJECTION_TILES = ((16, dense_small), *dense[1:]) if dense_small else dense
        legalize.PAIR_PROJECTION_TILE = {fmt: pair_tile for fmt in pair} if pair_tile else pair
        legalize.SLOT_PROJECTION_TILES = ((2, slot_small), *slots[1:]) if slot_small else slots
        layer = compile_spec(args.spec, out_dir=args.out / name.replace(" ", "_"))
        module = layer.module
        weights = bench_weights(torch, module, layer)
        x = torch.randn(args.tokens, layer.spec.params["hidden_size"], device="cuda", dtype=torch.bfloat16,
                        generator=torch.Generator(device="cuda").manual_seed(1))
        (out,) = module.moe_decode(**weights, x=x)
        reference = out if reference is None else reference
        same = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
        _, _, kernels = profile(torch, module, weights, x, "decode")
        results.append((name, sum(us for _, us in kernels), same, kernels))
        del weights
        torch.cuda.empty_cache()
    lines = [f"moe_decode of {args.spec} at T = {args.tokens}, {torch.cuda.get_device_name()}: GPU µs per call "
             "(torch.profiler, mean of 10), RMS ratio of out against the first candidate", "",
             "| candidate | total µs | out vs first | per kernel µs |", "|---|---|---|---|"]
    for name, total, same, kernels in results:
        lines.append(f"| {name} | {total:.1f} | {same:.1e} | "
                     + ", ".join(f"{k.split('_decode_')[-1].split('_prefill_')[-1]} {us:.0f}" for k, us in kernels) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"moe_tiles_{args.spec.stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def bench_weights(torch, module, layer) -> dict:
    """Random bf16 weights at the layer's dims (packed with the module's own packing for mxfp4)."""
    p = layer.spec.params
    d, l, E, F, S, Fs = (p[k] for k in ("hidden_size", "latent_dim", "num_experts", "expert_ffn_dim",
                                        "num_shared_experts", "shared_ffn_dim"))
    w = l or d
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0, shift=0.0, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype).mul_(scale).add_(shift)

    out = {"router_weight": randn(E, d, scale=2 / d**0.5), "router_bias": randn(E, scale=0.1, dtype=torch.float32)}
    experts = (randn(E, 2 * F, w, scale=w**-0.5), randn(E, w, F, scale=F**-0.5))
    if p.get("expert_weight_format") == "mxfp4":
        out |= module.pack_expert_weights(*experts)
    else:
        out |= {"expert_gate_up": experts[0], "expert_down": experts[1]}
    if l:
        out |= {"latent_down": randn(l, d, scale=d**-0.5), "latent_up": randn(d, l, scale=l**-0.5),
                "latent_norm_gain": randn(l, scale=0.2, shift=1.0)}
    if S and Fs:
        out |= {"shared_gate_up": randn(S, 2 * Fs, d, scale=d**-0.5), "shared_down": randn(S, d, Fs, scale=Fs**-0.5)}
    return out


if __name__ == "__main__":
    sys.exit(main())
