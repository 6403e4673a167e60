"""One rank of the gather-KV tests (tests/test_vision_gather_kv.py).

    python tests/vision_worker.py RANK WORLD WORKDIR

Joins a gloo group (rendezvous through a file in WORKDIR), makes the plan layout's sub-groups
once, reads WORKDIR/cases.pt and, per case, plans the case's images over WORLD ranks
(passes/plan_vision_cp.py), takes this rank's rows of the packed single-device inputs and runs:
"attention": segment_attention on q, k, v, then backward of <o, do>; "layer": a VisionLayer
with the case's weights on x, then backward of <y, dy>; "pipeline": a tiny encoder + text model
under a ViT/1F1B schedule run by k3compile.vision.runner over PP rows x CP ranks (the loss and
every parameter's gradient summed over the ranks). Writes WORKDIR/out<RANK>.pt: per case the
outputs and gradients of this rank's rows (and the parameter gradients), or the error's message.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist


def my_rows(plan, rank: int) -> torch.Tensor:
    """The packed single-device rows of this rank's pieces, in its order."""
    offsets = [0]
    for image in plan.images:
        offsets.append(offsets[-1] + image.patches)
    return torch.cat([torch.arange(offsets[i] + p.start, offsets[i] + p.stop) for i, p, _, _ in plan.for_rank(rank)])


class TextStage(torch.nn.Module):
    """A token-local text stage: x + W2 tanh(W1 x)."""

    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.w1, self.w2 = torch.nn.Linear(width, hidden, dtype=torch.float64), torch.nn.Linear(
            hidden, width, dtype=torch.float64)

    def forward(self, x):
        return x + self.w2(torch.tanh(self.w1(x)))


def pipeline_models(case: dict):
    """The case's encoder layers, projection and text stages, with its weights."""
    from k3compile.vision import VisionLayer

    vit = torch.nn.ModuleList(VisionLayer(**case["vit_config"], dtype=torch.float64) for _ in range(case["layers"]))
    project = torch.nn.Linear(case["vit_config"]["hidden_size"], case["text_width"], dtype=torch.float64)
    stages = torch.nn.ModuleList(TextStage(case["text_width"], case["text_hidden"]) for _ in range(case["stages"]))
    for module, name in ((vit, "vit"), (project, "project"), (stages, "stages")):
        module.load_state_dict(case["weights"][name])
    return vit, project, stages


def run_pipeline(case: dict, rank: int, row_groups: list):
    from k3compile.vision.runner import MicroBatch, ScheduleRunner

    vit, project, stages = pipeline_models(case)
    batches = [MicroBatch(**batch) for batch in case["microbatches"]]
    runner = ScheduleRunner(case["schedule"], case["cp"], vit, project, stages[rank // case["cp"]], batches,
                            row_groups)
    loss = runner.run()
    dist.all_reduce(loss)
    grads = {}
    for prefix, module in (("vit", vit), ("project", project), ("stages", stages)):
        for name, p in module.named_parameters():
            grad = torch.zeros_like(p) if p.grad is None else p.grad
            dist.all_reduce(grad)  # each rank's share: the sum is the gradient
            grads[f"{prefix}.{name}"] = grad
    return {"loss": loss, "grads": grads}


def run_case(case: dict, rank: int, world: int, groups: dict):
    from k3compile.passes.plan_vision_cp import plan_vision_cp
    from k3compile.vision import VisionLayer, segment_attention, segments_of

    plan = plan_vision_cp(case["images"], world)
    segments, rows = segments_of(plan, rank, groups), my_rows(plan, rank)
    if case["call"] == "attention":
        q, k, v = (case[name][rows].clone().requires_grad_(True) for name in ("q", "k", "v"))
        o = segment_attention(q, k, v, segments)
        (o * case["do"][rows]).sum().backward()
        return {"rows": rows, "o": o.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
                "groups": plan.groups}
    layer = VisionLayer(**case["config"], dtype=torch.float32)
    layer.load_state_dict(case["weights"])
    x = case["x"][rows].clone().requires_grad_(True)
    y = layer(x, segments=segments)
    (y * case["dy"][rows]).sum().backward()
    return {"rows": rows, "y": y.detach(), "dx": x.grad, "groups": plan.groups,
            "params": {name: p.grad for name, p in layer.named_parameters()}}


def main(rank: int, world: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    from k3compile.vision import subgroups

    groups, row_groups = subgroups(world), {}
    results = []
    for case in torch.load(os.path.join(workdir, "cases.pt"), weights_only=False):
        try:
            if case["call"] == "pipeline":
                from k3compile.vision.runner import row_subgroups

                shape = (case["stages"], case["cp"])
                if shape not in row_groups:  # every rank makes them in the same order
                    row_groups[shape] = row_subgroups(*shape)
                results.append(run_pipeline(case, rank, row_groups[shape]))
                continue
            results.append(run_case(case, rank, world, groups))
        except ValueError as error:
            results.append(str(error))
    torch.save(results, os.path.join(workdir, f"out{rank}.pt"))
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
