"""Context parallelism over torch.distributed ranks with a k3compile KDA layer.

    torchrun --nproc-per-node 2 examples/cp_torchrun.py --device cpu     # gloo, Triton's interpreter
    torchrun --nproc-per-node 2 examples/cp_torchrun.py --device cuda --heads 16 --dim 128 --tokens-per-rank 65536

A varlen batch is packed into one token stream (B = 1, cu_seqlens) and split evenly over the
ranks: rank r holds tokens r*T .. (r+1)*T - 1. Every rank calls the compiled module's `chunk`
with its slice, the global cu_seqlens and `cp_group`; sequences may span ranks. A rank passes
the initial states of the sequences that start on it and gets back the final states of the
sequences that end on it. Inside, each rank computes the summary (M, N) of its piece that
continues into the next rank, one all_gather of fixed size exchanges them, and every rank
finishes its tokens from their true entering states (docs/context-parallel.md).

The batch is drawn identically on every rank (one seed) so that each rank can check its slice
against the plain single-device call over the whole stream.
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--tokens-per-rank", type=int, default=64)
    parser.add_argument("--segments", type=int, default=1, help="split each rank's pieces further (on-device CP)")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import k3compile
    from k3compile.spec import spec_from_table

    dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())

    H, D, T = args.heads, args.dim, args.tokens_per_rank
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    spec = spec_from_table(dict(name="kda_cp_demo", kind="kda", num_heads=H, head_k_dim=D, head_v_dim=D,
                                dtype="float32" if args.device == "cpu" else "bfloat16"))
    layer = k3compile.compile(spec, out_dir=tempfile.mkdtemp(prefix=f"k3c_cp_rank{rank}_"))  # one folder per rank

    # the whole packed batch: 4 sequences, cut at 10%, 45%, 80% of the stream (so some span ranks)
    total = world * T
    cu = sorted({0, total, *(int(total * f) for f in (0.10, 0.45, 0.80))})
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    q = F.normalize(randn(1, total, H, D), dim=-1).to(dtype)
    k = F.normalize(randn(1, total, H, D), dim=-1).to(dtype)
    v = randn(1, total, H, D).to(dtype)
    g = F.logsigmoid(randn(1, total, H, D)).clamp(min=-5) / 10  # slow decays: states carry far
    beta = torch.sigmoid(randn(1, total, H)).to(dtype)
    h0 = 0.1 * randn(len(cu) - 1, H, D, D)
    cu_seqlens = torch.tensor(cu, dtype=torch.int64, device=device)

    # this rank's share: its tokens, the states of the sequences that start here
    lo, hi = rank * T, (rank + 1) * T
    starting = [n for n, s in enumerate(cu[:-1]) if lo <= s < hi]
    ending = [n for n, e in enumerate(cu[1:]) if lo < e <= hi]
    mine = [x[:, lo:hi].contiguous() for x in (q, k, v, g, beta)]
    o, final = layer.chunk(*mine, initial_state=h0[starting].contiguous(), output_final_state=True,
                           cu_seqlens=cu_seqlens, cp_group=dist.group.WORLD, segments=args.segments)

    # the check: the plain call over the whole stream on one device
    ref_o, ref_final = layer.chunk(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)

    def rms(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item() if b.numel() else 0.0

    print(f"rank {rank}/{world}: tokens {lo}..{hi - 1} of cu_seqlens {cu}; sequences starting here {starting}, "
          f"ending here {ending}; RMS vs one device: o {rms(o, ref_o[:, lo:hi]):.1e}, "
          f"final states {rms(final, ref_final[ending]):.1e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
