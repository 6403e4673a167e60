"""What bandwidth a kernel with the AttnRes aggregate's traffic can reach: the generated
`aggregate` (S source rows read, one row written per token) next to torch's sum over the same
sources (the same bytes, the simplest kernel that moves them) and a plain copy, in one process.

    python3 bench/attnres_ceiling_gpu.py --module bench/generated/attnres.py --out DIR   # on the GPU

The module is `k3c compile examples/attnres.toml -o bench/generated` (D from its spec). Each time
is a do_bench median; bandwidth = bytes moved (S + 1 rows of D per token, bf16) over the time.
Writes DIR/attnres_ceiling.md (also printed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py, also under `python -P`
from ab_gpu import layer_of  # noqa: E402
from common import copy_bandwidth, git_commit, import_file  # noqa: E402

SOURCES = (2, 5, 9)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=8192, help="token rows N (default 8192)")
    args = parser.parse_args(argv)
    import torch
    import triton
    import triton.testing

    module = import_file(args.module, "attnres_module")
    D = int(layer_of(module)["hidden_size"])
    N = args.rows

    def bandwidth(nbytes: int, fn) -> tuple[float, float]:
        us = triton.testing.do_bench(fn, return_mode="median") * 1e3
        return us, nbytes / (us * 1e-6) / 1e12

    copy_mib = 2 * N * D * 2 // 2**20  # two activation rows a token: about the bytes the aggregate moves at S = 2
    copy_tbs = copy_bandwidth(torch, lambda fn: triton.testing.do_bench(fn, return_mode="median"), copy_mib) / 1e12
    rows = []
    for S in SOURCES:
        gen = torch.Generator(device="cpu").manual_seed(S)
        sources = torch.randn(S, 1, N, D, generator=gen).to("cuda", torch.bfloat16)
        query = torch.randn(D, generator=gen).to("cuda", torch.bfloat16)
        gain = (1 + 0.1 * torch.randn(D, generator=gen)).to("cuda", torch.bfloat16)
        total = torch.empty(1, N, D, device="cuda", dtype=torch.bfloat16)
        nbytes = (S + 1) * N * D * 2
        ours = bandwidth(nbytes, lambda: module.aggregate(sources, query, gain))
        summed = bandwidth(nbytes, lambda: torch.sum(sources, dim=0, out=total))
        rows.append((S, ours, summed))
    lines = [
        "# The AttnRes aggregate's traffic: the generated kernel against torch's sum of the same sources",
        "",
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, tree {git_commit()}; "
        f"N = {N} rows, D = {D}, bf16; do_bench medians. Copy of {copy_mib} MiB: "
        f"{copy_tbs:.3f} TB/s (read + write).",
        f"Command: `python3 bench/attnres_ceiling_gpu.py --module {args.module} --out DIR --rows {N}`",
        "",
        "| S | bytes (MB) | aggregate µs | aggregate TB/s (of copy) | torch.sum µs | torch.sum TB/s (of copy) | aggregate / torch.sum time |",
        "|---|---|---|---|---|---|---|",
    ]
    for S, (ours_us, ours_tbs), (sum_us, sum_tbs) in rows:
        lines.append(f"| {S} | {(S + 1) * N * D * 2 / 1e6:.0f} | {ours_us:.1f} | {ours_tbs:.3f} ({ours_tbs / copy_tbs:.1%}) | "
                     f"{sum_us:.1f} | {sum_tbs:.3f} ({sum_tbs / copy_tbs:.1%}) | {ours_us / sum_us:.3f} |")
    text = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attnres_ceiling.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
