"""Per-kernel GPU time of a generated `chunk` entry (torch.profiler), to see where time goes.

    python3 bench/chunk_profile.py --module bench/generated/kda_h96_clamped.py --batch 1 --tokens 8192 --heads 96
    python3 bench/chunk_profile.py --module bench/generated/kda_h16_clamped.py --tokens 131072 --heads 16 --segments 8
    python3 bench/chunk_profile.py --module bench/generated/gdn_h32_log.py --batch 4 --tokens 4096 --heads 32 --scalar-gate
    python3 bench/chunk_profile.py --module bench/generated/gla_h32_log.py --batch 4 --tokens 4096 --heads 32 --no-beta

Also prints the wall time of a call (synchronised): above the sum of the kernels, the GPU waited
for the host (Python, synchronising copies).
"""

import argparse
import importlib.util
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from common import wall_then_profile  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=96)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--segments", type=int, default=None, help="chunk(..., segments=P): context parallelism")
    parser.add_argument("--scalar-gate", action="store_true", help="g of shape [B, T, H] (Gated DeltaNet)")
    parser.add_argument("--no-beta", action="store_true", help="no beta argument (GLA: no delta rule)")
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("generated", args.module)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    B, T, H, D = args.batch, args.tokens, args.heads, args.dim
    dev = "cuda"
    q = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).bfloat16()
    k = F.normalize(torch.randn(B, T, H, D, device=dev), dim=-1).bfloat16()
    v = torch.randn(B, T, H, D, device=dev).bfloat16()
    g = F.logsigmoid(torch.randn(B, T, H, *(() if args.scalar_gate else (D,)), device=dev)).clamp(min=-5)
    beta = None if args.no_beta else torch.sigmoid(torch.randn(B, T, H, device=dev)).bfloat16()
    h0 = 0.1 * torch.randn(B, H, D, D, device=dev)
    run = lambda: module.chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True,  # noqa: E731
                                   **({} if args.segments is None else {"segments": args.segments}))
    wall, prof = wall_then_profile(torch, run, args.iters, warmup=3)
    wall_us = wall * 1e6
    totals = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / args.iters
    print(f"{args.module} B{B} T{T} H{H} D{D} segments={args.segments}: per-call GPU time by kernel (us); "
          f"kernels {sum(totals.values()):.1f} us, wall {wall_us:.1f} us")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {us:10.1f}  {name[:90]}")


if __name__ == "__main__":
    main()
