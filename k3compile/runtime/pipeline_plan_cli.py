"""`k3c plan-pipeline SPEC --ranks P [--stages-per-rank V]`: k3compile.runtime.pipeline_plan's plan of a
[model] block stack printed as a table (docs/block-stack.md). Bad input is a K3Error or an
argparse error: one line, exit 2, as every k3c subcommand's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from k3compile.arguments import named_positive
from k3compile.errors import ArgumentError


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def read_layer_costs(path: str) -> list:
    try:
        costs = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ArgumentError(f"{path}: cannot read a JSON list of layer costs ({err})") from None
    if not isinstance(costs, list):
        raise ArgumentError(f"{path}: expected a JSON list of one cost a layer, got {type(costs).__name__}")
    return costs


def cmd_plan_pipeline(args) -> int:
    # ~30 ms: k3c builds this subcommand's parser on every call
    from k3compile.runtime.pipeline_plan import plan_pipeline
    from k3compile.runtime.stack_spec import load_model_spec

    spec = load_model_spec(args.spec)
    costs = read_layer_costs(args.layer_costs) if args.layer_costs else dict(args.cost) if args.cost else None
    print(plan_pipeline(spec, args.ranks, args.stages_per_rank, costs=costs).table(args.tokens))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plan-pipeline", help="cut a [model] block stack into pipeline stages and print which block "
                                             "representatives each boundary sends (docs/block-stack.md)")
    p.add_argument("spec", help="model spec (.toml with a [model] table)")
    p.add_argument("--ranks", type=positive_int, required=True, help="pipeline ranks P (at least 2)")
    p.add_argument("--stages-per-rank", type=positive_int, default=1, help="stages a rank holds, v (default 1; stage s on rank s mod P)")
    p.add_argument("--tokens", type=positive_int, default=4096, help="tokens a microbatch (batch x sequence) for the bytes (default 4096)")
    costs = p.add_mutually_exclusive_group()
    costs.add_argument("--cost", type=named_positive("KIND=COST", "a mixer of the pattern and a number"), action="append", metavar="KIND=COST",
                       help="a mixer's relative cost, e.g. kda=1.0 attn=1.4 (repeatable; default every layer 1)")
    costs.add_argument("--layer-costs", metavar="JSON",
                       help="a JSON file of one cost a layer (e.g. k3compile.runtime.stack_pipeline.measure_layer_costs's)")
    p.set_defaults(run=cmd_plan_pipeline)
