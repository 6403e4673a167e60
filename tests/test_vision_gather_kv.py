"""Gather-KV attention and the context-parallel vision layer over real torch.distributed gloo
groups (one process per rank, tests/vision_worker.py): each rank holds the pieces a plan gives
it; forward and backward equal the single-device float64 reference (ir/vision.py) on fresh
random inputs, for whole and split images (uneven pieces, several sub-groups a rank), P = 2, 3, 4."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from conftest import run_worker_ranks
from k3compile.frontend import spec_to_module
from k3compile.ir import vision as reference
from k3compile.passes.plan_vision_cp import parse_image, plan_vision_cp
from k3compile.spec import spec_from_table
from k3compile.vision import VisionLayer

WORKER = Path(__file__).resolve().parent / "vision_worker.py"
HEADS, DIM = 2, 8
# per P, images whose plan splits some (uneven pieces, one-patch pieces, a rank in two sub-groups)
BATCHES = {
    2: ["9x6", "4x3", 5, "2x3x4"],
    3: [17, "8x8", "2x4x4", "10x7", 3],
    4: ["12x9", "5x7", 3, "3x3x4", 13, 6],
}
CONFIG = dict(hidden_size=12, num_heads=HEADS, head_dim=DIM, mlp_dim=10, rope_theta=100.0)


def run_ranks(world: int, cases: list[dict], workdir: Path) -> list[list]:
    torch.save(cases, workdir / "cases.pt")
    return run_worker_ranks(WORKER, world, workdir, {**os.environ, "OMP_NUM_THREADS": "1"})


def lengths_of(images) -> list[int]:
    return [parse_image(str(i)).patches for i in images]


def grids_of(images) -> list[tuple[int, int, int]]:
    return [(i.frames, i.height, i.width) for i in map(lambda t: parse_image(str(t)), images)]


def attention_case(images) -> tuple[dict, dict]:
    n = sum(lengths_of(images))
    q, k, v, do = (torch.randn(n, HEADS, DIM, dtype=torch.float64) for _ in range(4))
    q64, k64, v64 = (t.clone().requires_grad_(True) for t in (q, k, v))
    o = reference.packed_attention(q64, k64, v64, lengths_of(images), DIM ** -0.5)
    (o * do).sum().backward()
    case = {"call": "attention", "images": images, **{name: t.float() for name, t in
                                                       (("q", q), ("k", k), ("v", v), ("do", do))}}
    return case, {"o": o.detach(), "dq": q64.grad, "dk": k64.grad, "dv": v64.grad}


def layer_case(images) -> tuple[dict, dict]:
    spec = spec_from_table(dict(name="vit", kind="vision", **CONFIG))
    op = next(iter(spec_to_module(spec).ops))
    layer = VisionLayer(**CONFIG, dtype=torch.float32)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.4)
    weights = {name: t.detach().clone() for name, t in layer.state_dict().items()}
    n = sum(lengths_of(images))
    x, dy = torch.randn(n, CONFIG["hidden_size"]), torch.randn(n, CONFIG["hidden_size"])
    x64 = x.double().requires_grad_(True)
    w64 = {name: t.double().requires_grad_(True) for name, t in weights.items()}
    y = reference.vision_layer(op, x64, w64, grids_of(images))
    (y * dy.double()).sum().backward()
    case = {"call": "layer", "images": images, "config": CONFIG, "weights": weights, "x": x, "dy": dy}
    return case, {"y": y.detach(), "dx": x64.grad, "params": {name: t.grad for name, t in w64.items()}}


def check(results: list, expected: dict, images, world: int) -> None:
    """Each rank's rows against the reference's, every row exactly once over the ranks."""
    seen = torch.zeros(sum(lengths_of(images)), dtype=torch.long)
    for rank, got in enumerate(results):
        assert isinstance(got, dict), f"rank {rank}: {got}"
        seen[got["rows"]] += 1
        for name, tensor in got.items():
            if name in expected and name != "params":
                want = expected[name][got["rows"]]
                assert torch.isfinite(tensor).all(), f"rank {rank}: {name} not finite"
                torch.testing.assert_close(tensor.double(), want, atol=1e-5, rtol=1e-5,
                                           msg=lambda m, name=name, rank=rank: f"rank {rank} {name}: {m}")
    assert (seen == 1).all(), "a row computed on no rank or on two"
    assert any(size > 1 for _, size in results[0]["groups"]), "the case split no image"
    if "params" in expected:  # each rank's parameter gradients are its rows' share: their sum is the gradient
        for name, want in expected["params"].items():
            total = sum(got["params"][name].double() for got in results)
            torch.testing.assert_close(total, want, atol=1e-4, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gather_kv_matches_single_device(world, tmp_path):
    images = BATCHES[world]
    attention, attention_want = attention_case(images)
    layer, layer_want = layer_case(images)
    out = run_ranks(world, [attention, layer], tmp_path)
    check([rank[0] for rank in out], attention_want, images, world)
    check([rank[1] for rank in out], layer_want, images, world)


def test_plans_of_the_cases_split_over_several_groups():
    """The P = 4 batch puts a rank in more than one sub-group (collective order across groups)."""
    plan = plan_vision_cp(BATCHES[4], 4)
    split = [g for g in plan.groups if g[1] > 1]
    assert len(set(split)) >= 2 and any(size == 4 for _, size in split)
    assert any(len({p.stop - p.start for p in pieces}) > 1 for pieces, g in zip(plan.pieces, plan.groups) if g[1] > 1)
