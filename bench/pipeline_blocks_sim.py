"""Pipeline parallelism of a K3-sized Block AttnRes stack, simulated on the CPU: bytes per stage
boundary and activation memory per rank, sending only new blocks (k3compile.runtime.pipeline_plan) against
resending every completed block at every boundary and against full AttnRes (every sublayer's
output a source: O(L d) per token).

    python bench/pipeline_blocks_sim.py --out bench/results      # pipeline_blocks_sim.md, .json, .png

The model (docs/block-stack.md, "Simulation"): 93 layers (3 KDA : 1 attention), blocks of 12,
hidden 7168, bf16; one microbatch = one sequence of T tokens, so a [T, 7168] tensor X is
T x 14 KiB. P ranks x v stages (stage s on rank s mod P), cut by k3compile.runtime.pipeline_plan at equal
layer costs, run by torch.distributed.pipelining's schedule (Schedule1F1B for v = 1,
ScheduleInterleaved1F1B otherwise; its action order from torch's own schedule builder), 2P
microbatches a step. Memory counts the residual-state tensors a stage keeps per in-flight
microbatch, from its forward to its backward:

- floor: the plain-residual stack's, one X per aggregation point (2 a layer: the partial sum the
  checkpoint holds, as plain residuals hold the stream); common to every scheme;
- ours: + the representatives the stage received that its rank did not hold (a rank holds each
  block once a microbatch, whichever of its stages received or made it);
- resend-all: + every completed representative each stage receives (each stage its own copy);
- full AttnRes: + every earlier sublayer output each stage receives (1 + 2 x first layer).

A rank's figure is its peak over the schedule of the in-flight stages' sums; the table gives the
largest over ranks. Bytes are per boundary per microbatch, forward (the backward returns as many).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from k3compile.runtime.pipeline_plan import plan_pipeline  # noqa: E402
from k3compile.runtime.stack_spec import model_spec_from_table  # noqa: E402

K3 = dict(name="k3", hidden_size=7168, num_layers=93, block_size=12, layer_pattern="kda,kda,kda,attn", kda_heads=64,
          kda_head_dim=128, attn_heads=64, attn_head_dim=128, ffn_hidden_size=18432, dtype="bfloat16")
SCHEMES = ("ours", "resend-all", "full AttnRes")


def schedule_actions(ranks: int, stages_per_rank: int, microbatches: int) -> list[list[tuple[str, int]]]:
    """Per rank, its compute actions in order as (F or B, stage): ScheduleInterleaved1F1B's own
    action lists (torch's builder); Schedule1F1B's order written out (P - r - 1 warm-up forwards,
    then a forward and a backward in turn): torch runs it without an action list."""
    if stages_per_rank == 1:
        orders = []
        for rank in range(ranks):
            warmup = min(ranks - rank - 1, microbatches)
            steady = [kind for _ in range(microbatches - warmup) for kind in ("F", "B")]
            orders.append([(kind, rank) for kind in ["F"] * warmup + steady + ["B"] * warmup])
        return orders
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops("Interleaved1F1B", ranks, microbatches, stages_per_rank)
    return [[(a.computation_type.value, a.stage_index) for a in rank_ops
             if a is not None and a.computation_type.value in ("F", "B")] for rank_ops in ops]


def per_stage_tensors(plan) -> dict[str, list[int]]:
    """Tensors X a stage keeps per microbatch, by scheme (floor included)."""
    floor = [2 * (s.stop - s.start) for s in plan.stages]
    incoming = [None, *plan.boundaries]
    return {
        "floor": floor,
        "ours": [f + (len(b.sent) if b else 0) for f, b in zip(floor, incoming)],
        "resend-all": [f + (len(b.sent) + len(b.cached) if b else 0) for f, b in zip(floor, incoming)],
        "full AttnRes": [f + (1 + 2 * s.start if s.index else 0) for f, s in zip(floor, plan.stages)],
    }


def peak_per_rank(actions: list[list[tuple[str, int]]], tensors: list[int]) -> list[int]:
    """Each rank's most tensors alive at once: a stage's from its forward of a microbatch to its backward."""
    peaks = []
    for rank_actions in actions:
        alive = peak = 0
        for kind, stage in rank_actions:
            alive += tensors[stage] if kind == "F" else -tensors[stage]
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


def simulate(tokens: int, ranks: int, stages_per_rank: int) -> dict:
    spec = model_spec_from_table(K3)
    plan = plan_pipeline(spec, ranks, stages_per_rank)
    X = plan.tensor_bytes(tokens)
    actions = schedule_actions(ranks, stages_per_rank, 2 * ranks)
    memory = {scheme: max(peak_per_rank(actions, sizes)) * X for scheme, sizes in per_stage_tensors(plan).items()}
    # full AttnRes: the embedding and both sublayer outputs of every layer before the cut
    full = [1 + 2 * plan.stages[b.source].stop for b in plan.boundaries]
    sends = {"ours": [b.tensors for b in plan.boundaries],
             "resend-all": [b.resend_all_tensors for b in plan.boundaries],
             "full AttnRes": full}
    return {"tokens": tokens, "ranks": ranks, "stages_per_rank": stages_per_rank, "tensor_bytes": X,
            "boundary_max": {k: max(v) * X for k, v in sends.items()},
            "boundary_mean": {k: sum(v) / len(v) * X for k, v in sends.items()},
            "memory_per_rank": memory}


def gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def write_table(results: list[dict], path: Path) -> None:
    lines = ["# Block AttnRes pipeline at K3's scale (simulated; bench/pipeline_blocks_sim.py)", "",
             "93 layers, blocks of 12, hidden 7168, bf16; a microbatch = one sequence of T tokens; 2P microbatches; "
             "GiB. Boundary: forward bytes per microbatch (the backward returns as many), the largest boundary and "
             "the mean. Memory: the residual-state tensors of the worst rank at its peak (floor = plain residuals; "
             "docs/block-stack.md).", "",
             "| T | P | v | boundary max: ours | resend-all | full AttnRes | boundary mean: ours | resend-all | "
             "full AttnRes | memory/rank: floor | ours | resend-all | full AttnRes | ours / floor |",
             "|" + "---|" * 14]
    for r in results:
        bm, bmean, mem = r["boundary_max"], r["boundary_mean"], r["memory_per_rank"]
        lines.append("| " + " | ".join([
            f"{r['tokens'] // 1024}K", str(r["ranks"]), str(r["stages_per_rank"]),
            *(gib(bm[k]) for k in SCHEMES), *(gib(bmean[k]) for k in SCHEMES),
            gib(mem["floor"]), *(gib(mem[k]) for k in SCHEMES), f"{mem['ours'] / mem['floor']:.2f}"]) + " |")
    path.write_text("\n".join(lines) + "\n")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"ours": "-o", "resend-all": "--s", "full AttnRes": ":^"}
    tokens = 32 * 1024
    for v, color in zip((1, 2, 4), ("tab:blue", "tab:orange", "tab:green")):
        rows = [r for r in results if r["tokens"] == tokens and r["stages_per_rank"] == v]
        for scheme in SCHEMES:
            left.plot([r["ranks"] for r in rows], [r["boundary_mean"][scheme] / 2**30 for r in rows], styles[scheme],
                      color=color, label=f"{scheme}, v = {v}")
    left.set(xlabel="pipeline ranks P", ylabel="GiB per boundary per microbatch (mean)", yscale="log",
             title=f"bytes per boundary, T = {tokens // 1024}K")
    left.set_xscale("log", base=2)
    left.legend(fontsize=7, ncol=3)
    for v, color in zip((1, 2, 4), ("tab:blue", "tab:orange", "tab:green")):
        rows = [r for r in results if r["tokens"] == tokens and r["stages_per_rank"] == v]
        for scheme in SCHEMES:
            right.plot([r["ranks"] for r in rows],
                       [r["memory_per_rank"][scheme] / r["memory_per_rank"]["floor"] for r in rows], styles[scheme],
                       color=color, label=f"{scheme}, v = {v}")
    right.set(xlabel="pipeline ranks P", ylabel="worst rank's peak / plain-residual floor", yscale="log",
              title="residual-state activation memory per rank (any T: all scale with T)")
    right.set_xscale("log", base=2)
    right.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for pipeline_blocks_sim.md, .json and .png")
    parser.add_argument("--tokens", default="8192,32768,131072", help="sequence lengths (comma-separated)")
    parser.add_argument("--ranks", default="4,8,16", help="pipeline ranks P (comma-separated)")
    parser.add_argument("--stages-per-rank", default="1,2,4", help="stages a rank v (comma-separated)")
    args = parser.parse_args()
    results = [simulate(t, p, v) for t in map(int, args.tokens.split(",")) for p in map(int, args.ranks.split(","))
               for v in map(int, args.stages_per_rank.split(","))]
    args.out.mkdir(parents=True, exist_ok=True)
    write_table(results, args.out / "pipeline_blocks_sim.md")
    (args.out / "pipeline_blocks_sim.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "pipeline_blocks_sim.png")
    print((args.out / "pipeline_blocks_sim.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
