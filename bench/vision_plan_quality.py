"""The vision planner's makespan against its lower bound over synthetic batches (docs/vision.md's
table): `python3 bench/vision_plan_quality.py [--batches 10] [--link-gbps 450 --tflops 400]`.
Without a link: compute only. With one: traffic-aware plans against compute-only plans charged
the same traffic (medians)."""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from k3compile.vision.batches import synthetic_images
from k3compile.passes.plan_vision_cp import MOONVIT_COST, plan_vision_cp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--link-gbps", type=float)
    parser.add_argument("--tflops", type=float, default=400.0)
    args = parser.parse_args()
    linked = MOONVIT_COST.with_link(args.link_gbps, args.tflops) if args.link_gbps else None
    if linked:
        print("| images a rank | P | traffic-aware / bound (median) | compute-only charged traffic / bound |")
        print("|---|---|---|---|")
    else:
        print("| images a rank | P | makespan / bound: median | max | split images (median) | largest sub-group |")
        print("|---|---|---|---|---|---|")
    for per_rank in (1, 4, 40):
        for ranks in (8, 16, 64):
            batches = [synthetic_images(per_rank * ranks, seed=s, videos=max(1, ranks // 16))
                       for s in range(args.batches)]
            if linked:
                aware = [plan_vision_cp(b, ranks, linked) for b in batches]
                blind = [dataclasses.replace(plan_vision_cp(b, ranks), cost=linked) for b in batches]
                print(f"| {per_rank} | {ranks} | {statistics.median(p.makespan / p.lower_bound for p in aware):.3f} | "
                      f"{statistics.median(p.makespan / p.lower_bound for p in blind):.3f} |")
                continue
            plans = [plan_vision_cp(b, ranks) for b in batches]
            ratios = [p.makespan / p.lower_bound for p in plans]
            split = [sum(size > 1 for _, size in p.groups) for p in plans]
            print(f"| {per_rank} | {ranks} | {statistics.median(ratios):.4f} | {max(ratios):.4f} | "
                  f"{statistics.median(split):g} | {max(size for p in plans for _, size in p.groups)} |")


if __name__ == "__main__":
    main()
