"""A block stack's stages for torch.distributed.pipelining, sending only new block representatives
(docs/block-stack.md, "Pipeline parallelism"):

    plan = plan_pipeline(model.spec, ranks=P, stages_per_rank=v)
    schedule = build_schedule(model, plan, rank, microbatches=M, example=x[:B // M], loss_fn=loss)
    schedule.step(x, target=y)          # rank 0 passes x, the last stage's rank the target

Each stage is a torch.distributed.pipelining.PipelineStage around a StageModule that runs the
stage's layers of the shared BlockStack (k3compile.runtime.stack) on (representatives, partial sum).
A boundary's tensors are those of k3compile.runtime.pipeline_plan: the partial sum where the cut is
inside a block, and the representatives the receiving rank does not hold yet; the rest come from
the rank's RankCache, where its earlier stages left the representatives they received or made.
A cached representative enters a later stage as a leaf of its own (the stages' graphs stay
apart, as PipelineStage runs one stage's backward at a time); its gradient there is added, by
the stage that received or made it, to the representative's own gradient (`ReturnCachedGrads`),
so the backward of a boundary returns exactly the gradients of what it sent, and each block's
gradient accumulates where the block was produced.
"""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B, ScheduleLoopedBFS

from k3compile.errors import ArgumentError
from k3compile.runtime.pipeline_plan import PipelinePlan
from k3compile.runtime.stack import DTYPES, BlockStack

SCHEDULES = {"1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B, "looped-bfs": ScheduleLoopedBFS}


class CachedRep:
    """One representative of one microbatch on a rank: its value, and the leaves that later stages
    of the rank used it through (each gets its share of the gradient in that stage's backward)."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value.detach()
        self.leaves: list[torch.Tensor] = []

    def leaf(self) -> torch.Tensor:
        leaf = self.value.detach().requires_grad_(self.value.is_floating_point())
        self.leaves.append(leaf)
        return leaf

    def later_grads(self) -> torch.Tensor | None:
        grads = [leaf.grad for leaf in self.leaves if leaf.grad is not None]
        self.leaves = []
        return None if not grads else grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)


class RankCache:
    """The representatives a rank holds, by (microbatch, block): written by the stage that received
    or made one, read by the rank's later stages, dropped by the backward of its writer."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], CachedRep] = {}

    def keep(self, microbatch: int, block: int, value: torch.Tensor) -> CachedRep:
        entry = self.entries[microbatch, block] = CachedRep(value)
        return entry

    def use(self, microbatch: int, block: int) -> torch.Tensor:
        try:
            return self.entries[microbatch, block].leaf()
        except KeyError:
            raise RuntimeError(f"rank cache: microbatch {microbatch} block b{block} was never received or made "
                               "on this rank (a plan that does not match the stages?)") from None

    def drop(self, entry: CachedRep) -> None:
        self.entries = {key: value for key, value in self.entries.items() if value is not entry}


class ReturnCachedGrads(torch.autograd.Function):
    """The identity on a representative, whose backward adds the gradients the rank's later stages
    left on their leaves of it (they ran their backward first: they come after it in the pipeline)."""

    @staticmethod
    def forward(ctx, rep: torch.Tensor, entry: CachedRep, cache: RankCache) -> torch.Tensor:
        ctx.entry, ctx.cache = entry, cache
        return rep.view_as(rep)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        later = ctx.entry.later_grads()
        ctx.cache.drop(ctx.entry)
        return (grad if later is None else grad + later), None, None


class StageModule(nn.Module):
    """One stage of a plan: forward(*received) -> what the next stage receives (the last stage:
    the stack's output). received: stage 0 the stack's input; another, the partial sum (if the
    plan sends one) then the representatives sent, in block order."""

    def __init__(self, stack: BlockStack, plan: PipelinePlan, index: int, cache: RankCache, microbatches: int):
        super().__init__()
        self.stack, self.plan, self.index, self.cache, self.microbatches = stack, plan, index, cache, microbatches
        self.stage = plan.stages[index]
        self.incoming = plan.boundaries[index - 1] if index > 0 else None
        self.outgoing = plan.boundaries[index] if index < len(plan.boundaries) else None
        self.calls = 0

    def forward(self, *received: torch.Tensor):
        microbatch = self.calls % self.microbatches  # every stage runs its microbatches in order
        self.calls += 1
        plain = self.stack.spec.attnres == "none"
        if self.incoming is None:
            reps, partial = self.stack.begin(*received)
            if plain:
                reps = []
        else:
            partial, sent = (received[0], received[1:]) if self.incoming.partial else (None, received)
            reps = [self.cache.use(microbatch, block) for block in self.incoming.cached]
            reps += [self.hold(microbatch, block, rep) for block, rep in zip(self.incoming.sent, sent)]
        made_from = len(reps)
        reps, partial = self.stack.run_layers(self.stage.start, self.stage.stop, reps, partial)
        if self.outgoing is None:
            return self.stack.finish(reps, partial)
        # what this stage made is this rank's from now on (the embedding b_0 too, at stage 0)
        reps = reps[:made_from] + [self.hold(microbatch, block, reps[block]) for block in range(made_from, len(reps))]
        if self.incoming is None and not plain:
            reps[0] = self.hold(microbatch, 0, reps[0])
        out = [reps[block] for block in self.outgoing.sent]
        return tuple([partial, *out] if self.outgoing.partial else out)

    def hold(self, microbatch: int, block: int, rep: torch.Tensor) -> torch.Tensor:
        """Keep `rep` in the rank's cache for later stages; returns it behind ReturnCachedGrads."""
        if not self.later_stage_uses(block):
            return rep
        return ReturnCachedGrads.apply(rep, self.cache.keep(microbatch, block, rep), self.cache)

    def later_stage_uses(self, block: int) -> bool:
        return any(b.source + 1 > self.index and b.target_rank == self.stage.rank and block in b.cached
                   for b in self.plan.boundaries)


def measure_layer_costs(stack: BlockStack, x: torch.Tensor, repeats: int = 3) -> list[float]:
    """Each layer's forward + backward time in ms (median of `repeats`, after one warm-up) on the
    residual state the stack's forward gives it for input x: plan_pipeline's `costs`. A layer's
    aggregation points cost more the more blocks precede it, so the layers are timed one by one."""
    with torch.no_grad():
        states, (reps, partial) = [], stack.begin(x)
        for index in range(len(stack.layers)):
            states.append((reps, partial))
            reps, partial = stack.run_layers(index, index + 1, reps, partial)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    costs = []
    for index, (reps, partial) in enumerate(states):
        leaves = [t.detach().requires_grad_(True) for t in reps]
        start = None if partial is None else partial.detach().requires_grad_(True)
        times = []
        for _ in range(repeats + 1):
            sync()
            began = time.perf_counter()
            out_reps, out_partial = stack.run_layers(index, index + 1, leaves, start)
            (out_partial if out_partial is not None else out_reps[-1]).float().sum().backward()
            sync()
            times.append((time.perf_counter() - began) * 1e3)
        costs.append(sorted(times[1:])[len(times[1:]) // 2])
    stack.zero_grad(set_to_none=True)
    return costs


def stage_shapes(plan: PipelinePlan, index: int, example: torch.Tensor) -> tuple[tuple, tuple]:
    """(inputs, outputs) of stage `index` as example tensors on the meta device, for a microbatch
    like `example` (the stack's input): PipelineStage's static metadata, so no stage is traced."""
    spec = plan.spec
    B, T = example.shape[:2]
    dtype = DTYPES[spec.dtype]

    def hidden(count: int) -> tuple:
        # requires_grad: PipelineStage allocates its receive buffers (and the gradients it sends back) by it
        return tuple(torch.empty(B, T, spec.hidden_size, dtype=dtype, device="meta", requires_grad=True)
                     for _ in range(count))

    inputs = (example.to("meta"),) if index == 0 else hidden(plan.boundaries[index - 1].tensors)
    if index == len(plan.stages) - 1:
        width = spec.vocab_size or spec.hidden_size
        outputs = (torch.empty(B, T, width, dtype=dtype, device="meta", requires_grad=True),)
    else:
        outputs = hidden(plan.boundaries[index].tensors)
    return inputs, outputs


def build_schedule(stack: BlockStack, plan: PipelinePlan, rank: int, microbatches: int, example: torch.Tensor,
                   loss_fn, group=None, schedule: str | None = None, scale_grads: bool = True):
    """The torch.distributed.pipelining schedule of this rank's stages (stage s on rank s mod P):
    Schedule1F1B with one stage a rank, else ScheduleInterleaved1F1B (or `schedule`: one of
    SCHEDULES). `example`: one microbatch of the stack's input (for the stages' shapes).
    scale_grads: torch's, the gradients divided by the microbatches (the mean of their losses);
    False: their sum."""
    if not 0 <= rank < plan.ranks:
        raise ArgumentError(f"rank: expected 0 .. {plan.ranks - 1} (the plan's ranks), got {rank}")
    name = schedule or ("1f1b" if plan.stages_per_rank == 1 else "interleaved-1f1b")
    if name not in SCHEDULES:
        raise ArgumentError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {name!r}")
    if name == "1f1b" and plan.stages_per_rank != 1:
        raise ArgumentError(f"schedule: 1f1b runs one stage a rank, the plan has {plan.stages_per_rank}")
    cache = RankCache()
    device = example.device
    stages = []
    for stage in plan.stages:
        if stage.rank != rank:
            continue
        inputs, outputs = stage_shapes(plan, stage.index, example)
        module = StageModule(stack, plan, stage.index, cache, microbatches)
        stages.append(PipelineStage(module, stage.index, len(plan.stages), device, input_args=inputs,
                                    output_args=outputs, group=group))
    if name == "1f1b":
        return SCHEDULES[name](stages[0], microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
    return SCHEDULES[name](stages, microbatches, loss_fn=loss_fn, scale_grads=scale_grads)
