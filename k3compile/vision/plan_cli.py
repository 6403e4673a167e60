"""`k3c plan-vision`: print the vision encoder's context-parallel plan of a batch (docs/vision.md)."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

from k3compile.errors import ArgumentError
from k3compile.vision.batches import synthetic_images


def add_parser(sub) -> None:
    p = sub.add_parser("plan-vision", help="plan the vision encoder's context parallelism for a batch of images "
                                           "(which images split over which ranks) and print it")
    p.add_argument("batch", nargs="?", help="a TOML file with [batch] ranks = P and images = [...] (instead of the "
                                            "flags)")
    p.add_argument("--ranks", type=int, help="ranks of the vision encoder's group (P)")
    p.add_argument("--images", help="comma-separated images: N patches, HxW patch grids or FxHxW videos")
    p.add_argument("--synthetic", type=int, metavar="COUNT",
                   help="plan a synthetic batch of COUNT images (log-normal 256 .. 65,536 patches) instead")
    p.add_argument("--videos", type=int, default=0, help="long videos added to --synthetic (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of --synthetic (default 0)")
    p.add_argument("--spec", help="a vision layer spec (.toml) whose dims give the cost model (default: MoonViT's)")
    p.add_argument("--link-gbps", type=float, help="charge a split image's members for the K/V rows they gather, "
                                                    "at this many GB/s (with --tflops; default: traffic is free)")
    p.add_argument("--tflops", type=float, help="what a rank computes meanwhile, TFLOP/s (with --link-gbps)")
    p.add_argument("--slack", type=float, default=0.02, help="target makespan over the lower bound, minus 1 "
                                                              "(default 0.02)")
    p.add_argument("--rows-per-cut", type=int, default=2,
                   help="an image splits only between groups of this many patch rows (default 2: the 2x2 patch merger)")
    p.set_defaults(run=cmd_plan_vision)


def batch_from_toml(path: str) -> tuple[int | None, list]:
    try:
        document = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError:
        raise ArgumentError(f"{path}: no such batch file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ArgumentError(f"{path}: cannot read batch file ({err})") from None
    except tomllib.TOMLDecodeError as err:
        raise ArgumentError(f"{path}: not valid TOML ({err})") from None
    table = document.get("batch")
    if not isinstance(table, dict) or set(document) != {"batch"}:
        raise ArgumentError(f"{path}: expected one [batch] table (ranks = P, images = [...]), got "
                            f"{', '.join(sorted(document)) or 'nothing'}")
    unknown = sorted(set(table) - {"ranks", "images"})
    if unknown:
        raise ArgumentError(f"{path}: [batch]: unknown key '{unknown[0]}'; allowed: ranks, images")
    images = table.get("images")
    if not isinstance(images, list):
        raise ArgumentError(f"{path}: [batch]: key 'images': expected a list of N / 'HxW' / 'FxHxW', got {images!r}")
    return table.get("ranks"), images


def cmd_plan_vision(args) -> int:
    # the passes package imports xDSL: k3c builds this parser on every call
    from k3compile.passes.plan_vision_cp import MOONVIT_COST, VisionCost, plan_vision_cp

    sources = [name for name, given in (("a batch file", args.batch), ("--images", args.images),
                                        ("--synthetic", args.synthetic is not None)) if given]
    if len(sources) != 1:
        raise ArgumentError(f"give the images one way: a batch file, --images or --synthetic, got "
                            f"{' and '.join(sources) or 'none'}")
    ranks = args.ranks
    if args.batch:
        ranks_in_file, images = batch_from_toml(args.batch)
        if ranks is None:
            ranks = ranks_in_file
    elif args.images is not None:
        images = [text.strip() for text in args.images.split(",")]
    else:
        if args.synthetic < 1 or args.videos < 0:
            raise ArgumentError(f"--synthetic: expected a positive count and --videos >= 0, got {args.synthetic} "
                                f"and {args.videos}")
        images = synthetic_images(args.synthetic, args.seed, args.videos)
    if ranks is None:
        raise ArgumentError("--ranks: how many ranks? (or ranks = P in the batch file)")
    cost = MOONVIT_COST
    if args.spec:
        # tomllib and the schemas: k3c builds this parser on every call
        from k3compile.spec import load_spec

        spec = load_spec(args.spec)
        if spec.kind != "vision":
            raise ArgumentError(f"--spec {args.spec}: expected a vision layer spec, got kind '{spec.kind}'")
        cost = VisionCost.from_params(spec.params)
    if (args.link_gbps is None) != (args.tflops is None):
        raise ArgumentError("--link-gbps and --tflops: give both (the traffic's cost is bytes at one over FLOPs at "
                            "the other) or neither")
    if args.link_gbps is not None:
        if not (args.link_gbps > 0 and args.tflops > 0):
            raise ArgumentError(f"--link-gbps, --tflops: expected positive numbers, got {args.link_gbps} and "
                                f"{args.tflops}")
        cost = cost.with_link(args.link_gbps, args.tflops)
    start = time.perf_counter()
    plan = plan_vision_cp(images, ranks, cost, slack=args.slack, rows_per_cut=args.rows_per_cut)
    took = time.perf_counter() - start
    print(plan.format())
    print(f"\nplanned and verified in {took * 1e3:.1f} ms")
    return 0
