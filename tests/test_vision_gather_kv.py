"""Gather-KV attention and the context-parallel vision layer over real torch.distributed gloo
groups (one process per rank, tests/vision_worker.py): each rank holds the pieces a plan gives
it; forward and backward equal the single-device float64 reference (ir/vision.py) on fresh
random inputs, for whole and split images (uneven pieces, several sub-groups a rank), P = 2, 3, 4."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

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


def gather_kv_cases(world: int) -> tuple[list, Callable]:
    """The attention and layer cases of P = world, and check(their results per rank)."""
    images = BATCHES[world]
    attention, attention_want = attention_case(images)
    layer, layer_want = layer_case(images)

    def check_both(out: list[list]) -> None:
        check([rank[0] for rank in out], attention_want, images, world)
        check([rank[1] for rank in out], layer_want, images, world)

    return [attention, layer], check_both


@pytest.mark.parametrize("world", [2, 3])
def test_gather_kv_matches_single_device(world, tmp_path):
    """P = 4: in test_bubble_schedule_runs_and_matches_one_process's group of 4 processes."""
    cases, check_both = gather_kv_cases(world)
    check_both(run_ranks(world, cases, tmp_path))


def test_plans_of_the_cases_split_over_several_groups():
    """The P = 4 batch puts a rank in more than one sub-group (collective order across groups)."""
    plan = plan_vision_cp(BATCHES[4], 4)
    split = [g for g in plan.groups if g[1] > 1]
    assert len(set(split)) >= 2 and any(size == 4 for _, size in split)
    assert any(len({p.stop - p.start for p in pieces}) > 1 for pieces, g in zip(plan.pieces, plan.groups) if g[1] > 1)


# --- the bubble-filled schedule, run: PP 2 x CP 2 over 4 gloo processes --------------------------

PIPELINE = dict(stages=2, cp=2, layers=3, text_width=6, text_hidden=7,
                vit_config=dict(hidden_size=8, num_heads=2, head_dim=4, mlp_dim=9, rope_theta=30.0))
MICROBATCHES = [["6x5", "2x3"], ["3x4", "1x1", "4x4"], ["2x2x6", "5x2"], ["7x4"], ["3x3", "2x5", "1x6"]]


def pipeline_case(name: str):
    """Weights, microbatches and the schedule (name: before / bubbles) of the pipeline case, and
    the single-process float64 loss and gradients it must reproduce."""
    from k3compile.vision import bubbles
    from vision_worker import TextStage

    cfg, vit_cfg = PIPELINE, PIPELINE["vit_config"]
    vit = torch.nn.ModuleList(VisionLayer(**vit_cfg, dtype=torch.float64) for _ in range(cfg["layers"]))
    project = torch.nn.Linear(vit_cfg["hidden_size"], cfg["text_width"], dtype=torch.float64)
    stages = torch.nn.ModuleList(TextStage(cfg["text_width"], cfg["text_hidden"]) for _ in range(cfg["stages"]))
    for module in (vit, project, stages):
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.4)
    batches = []
    for images in MICROBATCHES:
        grids = grids_of(images)
        tokens = 5 + len(batches)
        batches.append(dict(grids=grids, patches=torch.randn(sum(lengths_of(images)), vit_cfg["hidden_size"],
                                                             dtype=torch.float64),
                            text=torch.randn(tokens, cfg["text_width"], dtype=torch.float64),
                            target=torch.randn(len(grids) + tokens, cfg["text_width"], dtype=torch.float64)))
    vit_ms = [float(sum(lengths_of(images))) for images in MICROBATCHES]
    costs = bubbles.PipelineCosts(forward=(30.0, 30.0), backward=(60.0, 60.0), vit_forward=tuple(vit_ms),
                                  vit_backward=tuple(3 * t for t in vit_ms), chunk=1.0)
    schedule = {"before": bubbles.vit_before_pipeline, "bubbles": bubbles.fill_bubbles}[name](costs)
    loss = torch.zeros((), dtype=torch.float64)
    for batch in batches:  # one process, no schedule: the encoder, the mean per image, the text stages
        h = batch["patches"]
        for layer in vit:
            h = layer(h, grids=batch["grids"])
        pooled = torch.stack([part.mean(0) for part in h.split([f * hh * w for f, hh, w in batch["grids"]])])
        y = torch.cat([project(pooled), batch["text"]])
        for stage in stages:
            y = stage(y)
        loss = loss + (y * batch["target"]).sum()
    loss.backward()
    grads = {f"{prefix}.{name}": p.grad for prefix, module in (("vit", vit), ("project", project), ("stages", stages))
             for name, p in module.named_parameters()}
    case = dict(call="pipeline", schedule=schedule, microbatches=batches, **cfg,
                weights={"vit": vit.state_dict(), "project": project.state_dict(), "stages": stages.state_dict()})
    return case, loss.detach(), grads


def test_bubble_schedule_runs_and_matches_one_process(tmp_path):
    """The issue's CPU run: a tiny encoder + text model, PP 2 x CP 2 (4 gloo processes), the
    bubble-filled schedule (ViT pieces in the warm-up and cool-down, the encoder's backward
    recomputed on other rows than its forward) and ViT-before-the-pipeline give the loss and every
    gradient of one process. The same group first runs gather-KV's P = 4 cases
    (test_gather_kv_matches_single_device's; one spawn of 4 processes, not two)."""
    gather, check_gather = gather_kv_cases(4)
    cases, wants = [], []
    for name in ("bubbles", "before"):
        case, loss, grads = pipeline_case(name)
        cases.append(case)
        wants.append((name, loss, grads))
    lists = cases[0]["schedule"].lists
    assert any(a.kind == "VF" for a in lists[1][: lists[1].index(next(a for a in lists[1] if a.kind == "F"))])
    out = run_ranks(4, gather + cases, tmp_path)
    check_gather([rank[:len(gather)] for rank in out])
    out = [rank[len(gather):] for rank in out]
    for index, (name, loss, grads) in enumerate(wants):
        for rank in range(4):
            got = out[rank][index]
            assert isinstance(got, dict), f"{name} rank {rank}: {got}"
            torch.testing.assert_close(got["loss"], loss, atol=1e-10, rtol=1e-10)
            for key, want in grads.items():
                assert want is not None and torch.isfinite(got["grads"][key]).all()
                torch.testing.assert_close(got["grads"][key], want, atol=1e-10, rtol=1e-9,
                                           msg=lambda m, key=key, name=name: f"{name} {key}: {m}")
