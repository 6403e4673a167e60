"""Decode time against token count from bench/moe_gpu.py's moe.json: our token-centric and
expert-centric schedules (in CUDA graphs), torch._grouped_mm and torch's per-expert loop, and
the weight-bytes floor. Needs matplotlib (not the GPU):

    python3 bench/moe_plot.py --json DIR/moe.json --out bench/results/moe_decode_h200.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SERIES = (("ours_decode_graph_ms", "ours, token-centric (moe_decode), CUDA graph"),
          ("ours_prefill_graph_ms", "ours, expert-centric (moe_prefill), CUDA graph"),
          ("torch_grouped_mm_ms", "torch._grouped_mm pipeline"),
          ("torch_loop_ms", "torch, loop over experts"),
          ("floor_ms", "weight-bytes floor (copy bandwidth)"))


def main(argv=None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    rows = [r for r in data["rows"] if r["phase"] == "decode"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in SERIES:
        points = [(r["T"], r[key]) for r in rows if key in r]
        if points:
            ax.plot(*zip(*points), marker="o", linestyle="--" if key == "floor_ms" else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens T")
    ax.set_ylabel("ms per layer call")
    ax.set_title("LatentMoE decode at K3's dims, bf16", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, data["head"][:160], fontsize=5)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=130)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
