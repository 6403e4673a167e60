"""One rank of the block stack's pipeline tests (tests/test_block_stack_pipeline.py).

    python tests/pipeline_worker.py RANK WORLD WORKDIR

Joins a gloo process group (rendezvous through a file in WORKDIR), reads WORKDIR/cases.pt (a list
of cases, each: the [model] table, the state dict, the batch and target, stages per rank, cuts,
microbatches, schedule, and the test process's compiler fingerprint, whose compiled modules it
imports), and per case, in order, all ranks together: builds the stack and this rank's stages of
the plan with k3compile.runtime.stack_pipeline.build_schedule and runs one training step. Writes
WORKDIR/out<RANK>.pt: per case the losses (last stage's rank), every parameter gradient this rank
computed, and the bytes each of its stages' send ops carried, forward and backward, per stage
(counted on the P2P ops torch.distributed.pipelining builds, not on the stage modules). One group
runs every case: a rank's process spends seconds importing torch.distributed.pipelining.
"""

from __future__ import annotations

import datetime
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def count_sends(stage, sent: dict, direction: str) -> None:
    """Wrap the stage's send-op builder: every isend's bytes added to sent[direction][stage]."""
    name = f"get_{direction}_send_ops"
    build = getattr(stage, name)

    def counted(chunk_id):
        ops = build(chunk_id)
        total = sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        sent[direction][stage.stage_index] = sent[direction].get(stage.stage_index, 0) + total
        return ops

    setattr(stage, name, counted)


def pin_compiler(fingerprint: str) -> None:
    """Name k3compile.ops' layers by the test process's compiler fingerprint, so this rank imports
    the modules that process compiled (from the disk cache) rather than compiling the source as
    it is now, which another engineer may be editing."""
    from k3compile.ops import attnres, layers

    layers.compiler_fingerprint = attnres.compiler_fingerprint = lambda: fingerprint


def run_case(case: dict, rank: int, world: int) -> dict:
    from k3compile.runtime.pipeline_plan import plan_pipeline
    from k3compile.runtime.stack import build_stack
    from k3compile.runtime.stack_pipeline import build_schedule
    from k3compile.runtime.stack_spec import model_spec_from_table

    spec = model_spec_from_table(case["table"])
    model = build_stack(spec)
    model.load_state_dict(case["state"])
    plan = plan_pipeline(spec, world, case["stages_per_rank"], cuts=case["cuts"])
    x, target, microbatches = case["x"], case["target"], case["microbatches"]
    schedule = build_schedule(model, plan, rank, microbatches, x[: x.shape[0] // microbatches],
                              loss_fn=lambda out, tgt: ((out - tgt) ** 2).sum(), schedule=case["schedule"],
                              scale_grads=False)  # the sum of the microbatches' losses: the whole batch's
    sent = {"fwd": {}, "bwd": {}}
    for stage in getattr(schedule, "_stages", None) or [schedule._stage]:
        count_sends(stage, sent, "fwd")
        count_sends(stage, sent, "bwd")
    last = plan.stages[-1].rank == rank
    losses: list[torch.Tensor] = []
    args = (x,) if rank == 0 else ()
    schedule.step(*args, target=target if last else None, losses=losses if last else None)
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return {"losses": [loss.detach() for loss in losses], "grads": grads, "sent": sent}


def main(rank: int, world: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    cases = torch.load(os.path.join(workdir, "cases.pt"))
    results = []
    for case in cases:
        pin_compiler(case["compiler"])
        results.append(run_case(case, rank, world))
        dist.barrier()  # the next case's stages start from a quiet group
    torch.save(results, os.path.join(workdir, f"out{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
