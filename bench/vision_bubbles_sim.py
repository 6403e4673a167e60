"""ViT work in the text pipeline's 1F1B bubbles, simulated (k3compile.vision.bubbles) at K3-like
scale, against the ViT before the pipeline, in the first stage, and as its own stage. CPU only:

    python3 bench/vision_bubbles_sim.py --out bench/results      # with matplotlib: the PNG too

Costs are analytic (FLOPs at 40% of H100's bf16 peak for text and ViT alike; no GPU measured them):
- text: 32B activated parameters a token (Kimi K2's public figure; K3's is not public), --tokens
  a microbatch (8,192 and 32,768), forward 2 x params x tokens split evenly over the PP stages,
  backward 2x;
- ViT: MoonViT (27 layers of k3compile.vision's cost model: hidden 1152, 16 x 72 heads, MLP 4304),
  each microbatch's images drawn from the synthetic distribution (log-normal 256 .. 65,536
  patches; a video in some) until it holds --patches patches; backward 3x forward (2x, and the
  forward recomputed: k3compile.vision.runner keeps no encoder activations between VF and VB);
- a bubble takes pieces of at least a layer over an eighth of a microbatch's images.
With --layer-costs DIR/vision_layer.json (bench/vision_layer_gpu.py on the GPU) the ViT's times are
the measured layer's instead (a n + b n^2 a layer, fitted per image). Writes
OUT/vision_bubbles_sim.md and .json, and OUT/vision_bubbles_sim.png if matplotlib imports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KINDS = {"F": ("text forward", "#4878cf"), "B": ("text backward", "#6acc65"), "VF": ("ViT forward", "#ee854a"),
         "VB": ("ViT backward", "#d65f5f")}


def fitted(records: list[dict], key: str):
    """ms(n) = a n + b n^2, least squares over measured one-image layer times (bench/vision_layer_gpu.py)."""
    import numpy as np

    n = np.array([r["patches"] for r in records if key in r], dtype=float)
    ms = np.array([r[key] for r in records if key in r], dtype=float)
    if len(n) < 2:
        raise SystemExit(f"--layer-costs: need {key} at two sizes at least, got {len(n)}")
    (a, b), *_ = np.linalg.lstsq(np.stack([n, n * n], axis=1), ms, rcond=None)
    return lambda patches: max(a, 0.0) * patches + max(b, 0.0) * patches * patches


def microbatch_vit_ms(count: int, args, flops_per_ms: float, layers: int = 27):
    """Per microbatch: (ViT forward ms, ViT backward ms), its images drawn until --patches patches.
    From --layer-costs (measured): forward = layers x the fitted forward; backward (recomputing)
    = layers x the fitted forward + backward. Else analytic FLOPs, backward --vit-backward x."""
    import random

    from k3compile.passes.plan_vision_cp import MOONVIT_COST, parse_image
    from k3compile.vision.batches import synthetic_images

    if args.layer_costs:
        measured = json.loads(Path(args.layer_costs).read_text())
        layers, records = measured["layers"], measured["records"]
        forward, both = fitted(records, "forward_ms"), fitted(records, "forward_backward_ms")
    else:
        forward = both = None
    rng, out = random.Random(args.seed), []
    for m in range(count):
        images, held = [], 0
        while held < args.patches:
            image = parse_image(synthetic_images(1, seed=rng.randrange(1 << 30), videos=int(rng.random() < 0.05))[-1])
            images.append(image)
            held += image.patches
        if forward is None:
            vf = layers * sum(MOONVIT_COST.of(i.patches, i.patches) for i in images) / flops_per_ms
            out.append((vf, args.vit_backward * vf))
        else:
            out.append((layers * sum(forward(i.patches) for i in images), layers * sum(both(i.patches) for i in images)))
    return out


def costs_for(stages: int, microbatches: int, tokens: int, args):
    from k3compile.vision.bubbles import PipelineCosts

    flops_per_ms = args.peak_tflops * 1e9 * args.mfu
    text_forward = 2 * args.active_params * tokens / flops_per_ms / stages
    vit = microbatch_vit_ms(microbatches, args, flops_per_ms)
    return PipelineCosts(forward=(text_forward,) * stages, backward=(2 * text_forward,) * stages,
                         vit_forward=tuple(f for f, _ in vit), vit_backward=tuple(b for _, b in vit),
                         chunk=min(f for f, _ in vit) / 27 / 8, latency=args.latency)


def compare(costs) -> dict:
    from k3compile.vision import bubbles

    text = bubbles.text_only(costs)
    vit_per_rank = (sum(costs.vit_forward) + sum(costs.vit_backward)) / costs.stages
    out = {"stages": costs.stages, "microbatches": costs.microbatches, "text_step_ms": text.step,
           "vit_per_rank_ms": vit_per_rank, "text_stage_forward_ms": costs.forward[0],
           "vit_forward_ms_mean": sum(costs.vit_forward) / costs.microbatches}
    schedules = {}
    for key, make in (("before", bubbles.vit_before_pipeline), ("first_stage", bubbles.vit_in_first_stage),
                      ("own_stage", bubbles.vit_own_stage), ("bubbles", bubbles.fill_bubbles)):
        schedule = schedules[key] = make(costs)
        out[f"{key}_step_ms"] = schedule.step
        out[f"{key}_exposed"] = (schedule.step - text.step) / vit_per_rank
    out["bubbles_live_vit_microbatches"] = schedules["bubbles"].live_vit_activations()
    out["floor_exposed"] = bubbles.exposure_floor(costs) / vit_per_rank
    return out, schedules


def plot(schedules: dict, path: Path, title: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(schedules), 1, figsize=(14, 2.2 + 0.42 * sum(len(s.lists) for s in schedules.values())),
                             sharex=True)
    for ax, schedule in zip(axes, schedules.values()):
        for rank, (actions, times) in enumerate(zip(schedule.lists, schedule.times)):
            for action, (start, end) in zip(actions, times):
                ax.barh(rank, (end - start) / 1e3, left=start / 1e3, height=0.8, color=KINDS[action.kind][1],
                        edgecolor="none")
        ax.set_yticks(range(len(schedule.lists)))
        ax.invert_yaxis()
        ax.set_ylabel("rank")
        ax.set_title(f"{schedule.name}: step {schedule.step / 1e3:.2f} s", fontsize=10, loc="left")
    axes[-1].set_xlabel("time (s)")
    fig.legend(handles=[Patch(color=c, label=label) for label, c in KINDS.values()], loc="upper right", ncol=4)
    fig.suptitle(title, x=0.01, ha="left", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def row(r: dict, tokens: int) -> str:
    def step(key: str, share: str = ".0%") -> str:
        return f"{r[key + '_step_ms'] / 1e3:.2f} ({r[key + '_exposed']:{share}})"

    return (f"| {tokens:,} | {r['stages']} | {r['microbatches']} | {r['text_stage_forward_ms']:.0f} | "
            f"{r['vit_forward_ms_mean']:.0f} | {r['text_step_ms'] / 1e3:.2f} | {r['vit_per_rank_ms'] / 1e3:.2f} | "
            f"{step('before')} | {step('first_stage')} | {step('own_stage')} | **{step('bubbles', '.1%')}** | "
            f"{r['floor_exposed']:.1%} | {r['bubbles_live_vit_microbatches']} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", default="8,16")
    parser.add_argument("--microbatches", default="16,32,64")
    parser.add_argument("--active-params", type=float, default=32e9)
    parser.add_argument("--tokens", default="8192,32768", help="text tokens a microbatch (comma-separated: each a table "
                                                               "block)")
    parser.add_argument("--patches", type=int, default=16384, help="ViT patches a microbatch (at least)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100 SXM)")
    parser.add_argument("--mfu", type=float, default=0.4)
    parser.add_argument("--latency", type=float, default=0.05, help="ms to send embeddings / their gradient")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layer-costs", help="vision_layer.json of bench/vision_layer_gpu.py: measured ViT layer times "
                                               "instead of analytic FLOPs")
    parser.add_argument("--vit-backward", type=float, default=3.0,
                        help="ViT backward over forward time (default 3: 2 and the recomputed forward)")
    args = parser.parse_args(argv)
    rows, records, shown = [], [], None
    for tokens in (int(t) for t in args.tokens.split(",")):
        for stages in (int(s) for s in args.stages.split(",")):
            for microbatches in (int(m) for m in args.microbatches.split(",")):
                record, schedules = compare(costs_for(stages, microbatches, tokens, args))
                records.append(record | {"tokens": tokens})
                if shown is None or (stages, microbatches, tokens) == (8, 32, 32768):
                    shown = (stages, microbatches, tokens, schedules)
                rows.append(row(record, tokens))
    table = ["Step time in seconds (exposed ViT time: step minus text-only step, over the ViT's compute per rank "
             "if spread evenly; floor: k3compile.vision.bubbles.exposure_floor); own stage uses S + 1 GPUs. "
             + " ".join(__doc__.split("\n\n")[2].split("With --layer-costs")[0].split())
             + (f" ViT times measured instead ({args.layer_costs}: {json.loads(Path(args.layer_costs).read_text())['header']})."
                if args.layer_costs else ""),
             "", "| text tokens / microbatch | PP | microbatches | text stage fwd ms | ViT fwd ms / microbatch | text only "
                 "| ViT per rank | ViT before pipeline | ViT in first stage | ViT own stage | ViT in bubbles | floor "
                 "| live ViT microbatches |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"] + rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vision_bubbles_sim.md").write_text("\n".join(table) + "\n")
    (args.out / "vision_bubbles_sim.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                                  "records": records}, indent=1))
    print("\n".join(table))
    stages, microbatches, tokens, schedules = shown
    picked = {key: schedules[key] for key in ("before", "bubbles")}
    if plot(picked, args.out / "vision_bubbles_sim.png",
            f"PP {stages}, {microbatches} microbatches of {tokens:,} text tokens and >= {args.patches:,} ViT patches, 1F1B"):
        print(f"wrote {args.out / 'vision_bubbles_sim.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
