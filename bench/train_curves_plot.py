"""Plot the loss curves bench/train_curves_gpu.py recorded: both runs on one axis, and their
difference below it.

    python3 bench/train_curves_plot.py DIR/train_curves.json OUT.png

Needs matplotlib (a plotting tool of the benchmarks, not a dependency of k3compile).
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source: str, target: str) -> None:
    result = json.loads(open(source).read())
    runs, a = result["runs"], result["args"]
    figure, (curves, difference) = plt.subplots(2, 1, figsize=(8, 6), sharex=True,
                                                gridspec_kw={"height_ratios": [3, 1]})
    for side, run in runs.items():
        curves.plot(run["losses"], label=f"{side} ({run['seconds_per_step'] * 1e3:.0f} ms/step)", linewidth=1)
    curves.set_ylabel("cross-entropy")
    curves.set_title(f"KDA LM ({a['layers']} layers, {a['heads']} heads of {a['head_dim']}, hidden {a['hidden']}), "
                     f"B{a['batch']} T{a['tokens']}, bf16 op; {result['gpu']}", fontsize=9)
    curves.legend()
    ours, theirs = runs["k3compile"]["losses"], runs["fla"]["losses"]
    difference.plot([x - y for x, y in zip(ours, theirs)], color="gray", linewidth=1)
    difference.axhline(0, color="black", linewidth=0.5)
    difference.set_ylabel("k3compile - fla")
    difference.set_xlabel("optimizer step")
    figure.tight_layout()
    figure.savefig(target, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
