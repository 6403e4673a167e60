"""The pipeline plan of a block stack: where to cut its layers into P ranks x v stages, and which
block representatives each stage boundary carries (docs/block-stack.md, "The pipeline plan").

    plan = plan_pipeline(spec, ranks=4, stages_per_rank=2, costs={"kda": 1.0, "attn": 1.3})
    print(plan.table(tokens=4096))                 # k3c plan-pipeline examples/models/k3_stack.toml --ranks 4 ...

Stages are placed as torch.distributed.pipelining's looped schedules place them (stage s on rank
s mod P: ScheduleInterleaved1F1B, ScheduleLoopedBFS; Schedule1F1B with v = 1). The cut points
minimise the most expensive stage (a linear partition over the per-layer costs, the first
stage paying for the embedding and the last for the final point and head). The send rule: a
stage holds the representatives completed before it (b_0 the embedding, b_j at the end of layer
j * block_size - 1); a rank keeps those its earlier stages received or produced, so a boundary
sends the partial sum (where the cut is inside a block) and only the representatives the
receiving rank does not hold yet, and the backward returns exactly their gradients. No torch:
`k3c plan-pipeline` imports only the spec.
"""

from __future__ import annotations

from dataclasses import dataclass

from k3compile.errors import ArgumentError
from k3compile.runtime.stack_spec import ModelSpec

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Stage:
    index: int
    rank: int
    start: int  # its layers: start .. stop - 1
    stop: int
    cost: float
    held: int  # representatives it starts with: b_0 .. b_{held - 1}
    made: int  # representatives completed at its end (it produces b_held .. b_{made - 1})


@dataclass(frozen=True)
class Boundary:
    """What stage `source` sends stage `source + 1` per microbatch (and the backward returns)."""

    source: int
    source_rank: int
    target_rank: int
    cached: tuple[int, ...]  # representatives the receiving rank holds already: not sent
    sent: tuple[int, ...]  # representatives sent
    partial: bool  # the current block's partial sum sent (a cut inside a block)

    @property
    def tensors(self) -> int:
        return len(self.sent) + self.partial

    @property
    def resend_all_tensors(self) -> int:
        """What the boundary would carry sending every completed representative."""
        return len(self.cached) + len(self.sent) + self.partial


@dataclass(frozen=True)
class PipelinePlan:
    spec: ModelSpec
    ranks: int
    stages_per_rank: int
    stages: tuple[Stage, ...]
    boundaries: tuple[Boundary, ...]

    def tensor_bytes(self, tokens: int) -> int:
        """Bytes of one [tokens, hidden_size] activation in the spec's dtype (a microbatch's rep)."""
        return tokens * self.spec.hidden_size * BYTES[self.spec.dtype]

    def table(self, tokens: int) -> str:
        """The plan as a markdown table: one row a stage, what crosses its boundary a microbatch."""
        one = self.tensor_bytes(tokens)
        rows = [f"pipeline plan of {self.spec.source}: {len(self.spec.layers)} layers, blocks of "
                f"{self.spec.block_size}, {self.ranks} ranks x {self.stages_per_rank} stages; a boundary's "
                f"bytes per microbatch of {tokens} tokens ({human(one)} a tensor), forward (the backward returns "
                "as many)", "",
                "| stage | rank | layers | cost | reps held | -> rank | cached there | sent reps | partial sum | "
                "sent | resending all |", "|" + "---|" * 11]
        for stage in self.stages:
            cells = [str(stage.index), str(stage.rank), f"{stage.start}-{stage.stop - 1}", f"{stage.cost:g}",
                     span(0, stage.held)]
            if stage.index < len(self.boundaries):
                b = self.boundaries[stage.index]
                cells += [str(b.target_rank), names(b.cached), names(b.sent), "yes" if b.partial else "no",
                          human(b.tensors * one), human(b.resend_all_tensors * one)]
            else:
                cells += ["-"] * 6
            rows.append("| " + " | ".join(cells) + " |")
        sent = sum(b.tensors for b in self.boundaries)
        resent = sum(b.resend_all_tensors for b in self.boundaries)
        rows += ["", f"total per microbatch: {human(sent * one)} sent, {human(resent * one)} resending every block "
                     f"({sent}/{resent} tensors)"]
        return "\n".join(rows)


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def span(first: int, stop: int) -> str:
    return "-" if stop <= first else f"b{first}" if stop - first == 1 else f"b{first}-b{stop - 1}"


def names(reps: tuple[int, ...]) -> str:
    return span(reps[0], reps[-1] + 1) if reps else "-"


def layer_costs(spec: ModelSpec, costs: dict[str, float] | list[float] | None) -> list[float]:
    """Per-layer costs: a list (one a layer, e.g. measured), a mapping of mixer kind to cost, or
    None (every layer 1)."""
    if costs is None:
        return [1.0] * len(spec.layers)
    if isinstance(costs, dict):
        unknown = sorted(set(costs) - set(spec.layers))
        if unknown:
            raise ArgumentError(f"costs: {unknown[0]!r} is not a mixer of the pattern "
                                f"({', '.join(sorted(set(spec.layers)))})")
        missing = sorted(set(spec.layers) - set(costs))
        if missing:
            raise ArgumentError(f"costs: no cost for mixer {missing[0]!r} (the pattern has {', '.join(sorted(set(spec.layers)))})")
        values = [costs[kind] for kind in spec.layers]
    else:
        values = list(costs)
        if len(values) != len(spec.layers):
            raise ArgumentError(f"costs: expected one cost a layer ({len(spec.layers)}), got {len(values)}")
    if not all(isinstance(c, (int, float)) and c > 0 and c < float("inf") for c in values):
        raise ArgumentError(f"costs: expected positive finite numbers, got {values}")
    return [float(c) for c in values]


def cut_points(costs: list[float], stages: int, first_extra: float = 0.0, last_extra: float = 0.0,
               block_size: int = 0) -> list[int]:
    """Boundaries 0 = c_0 < c_1 < ... < c_stages = len(costs) minimising the largest stage cost
    (a stage's: the sum of its layers', plus first_extra / last_extra for the first / last
    stage), each stage at least one layer; among the cut sets that reach it, the fewest cuts
    inside a block of `block_size` layers (each sends the block's partial sum), then the
    earliest. Two dynamic programmes over prefixes, O(L^2 S) each."""
    L = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(i: int, j: int, s: int) -> float:  # layers i..j-1 as stage s
        return prefix[j] - prefix[i] + (first_extra if s == 0 else 0.0) + (last_extra if s == stages - 1 else 0.0)

    largest = partition(L, stages, lambda before, i, j, s: max(before, cost(i, j, s)))[-1]
    inside = (lambda j: j % block_size != 0 and j != L) if block_size else (lambda j: False)
    return partition(L, stages, lambda before, i, j, s: before + inside(j)
                     if cost(i, j, s) <= largest * (1 + 1e-12) else float("inf"))[:-1]


def partition(L: int, stages: int, extend) -> list:
    """The cuts of layers 0..L-1 into `stages` non-empty runs minimising a value built stage by
    stage, extend(value before, i, j, s) for layers i..j-1 as stage s (the earliest cuts on ties),
    and that value last."""
    inf = float("inf")
    best = [[inf] * (L + 1) for _ in range(stages + 1)]  # best[s][j]: layers 0..j-1 in s stages
    back = [[0] * (L + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, L - (stages - s) + 1):
            for i in range(s - 1, j):
                value = extend(best[s - 1][i], i, j, s - 1)
                if value < best[s][j] - 1e-12:
                    best[s][j], back[s][j] = value, i
    cuts = [L]
    for s in range(stages, 0, -1):
        cuts.append(back[s][cuts[-1]])
    return [*cuts[::-1], best[stages][L]]


def plan_pipeline(spec: ModelSpec, ranks: int, stages_per_rank: int = 1,
                  costs: dict[str, float] | list[float] | None = None, first_extra: float = 0.0,
                  last_extra: float = 0.0, cuts: list[int] | None = None) -> PipelinePlan:
    """The plan of `spec` over `ranks` x `stages_per_rank` stages: balanced cut points (or the
    given `cuts`, 0 = c_0 < ... < c_S = num_layers) and each boundary's sends."""
    for name, value in (("ranks", ranks), ("stages_per_rank", stages_per_rank)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ArgumentError(f"{name}: expected a positive integer, got {value!r}")
    if ranks < 2:
        raise ArgumentError(f"ranks: expected at least 2 (one rank has no boundary to plan), got {ranks}")
    L, count = len(spec.layers), ranks * stages_per_rank
    if count > L:
        raise ArgumentError(f"ranks x stages_per_rank: {ranks} x {stages_per_rank} = {count} stages for {L} layers; "
                            "every stage needs a layer")
    per_layer = layer_costs(spec, costs)
    if cuts is None:
        cuts = cut_points(per_layer, count, first_extra, last_extra, 0 if spec.attnres == "none" else spec.block_size)
    elif (len(cuts) != count + 1 or cuts[0] != 0 or cuts[-1] != L
          or any(a >= b for a, b in zip(cuts, cuts[1:]))):
        raise ArgumentError(f"cuts: expected {count + 1} increasing layer indices from 0 to {L}, got {cuts}")
    plain = spec.attnres == "none"
    made = [0 if plain else 1 + stop // spec.block_size for stop in cuts]  # completed reps at each cut
    stages = tuple(Stage(s, s % ranks, cuts[s], cuts[s + 1],
                         sum(per_layer[cuts[s]:cuts[s + 1]]) + (first_extra if s == 0 else 0)
                         + (last_extra if s == count - 1 else 0), made[s], made[s + 1])
                   for s in range(count))
    boundaries = []
    for s in range(count - 1):
        target = s + 1
        # the receiving rank's earlier stage (target - ranks) held and made b_0 .. b_{made - 1}
        held = 0 if plain or target < ranks else stages[target - ranks].made
        partial = plain or cuts[s + 1] % spec.block_size != 0
        reps = range(0 if plain else made[s + 1])
        boundaries.append(Boundary(s, s % ranks, target % ranks, tuple(r for r in reps if r < held),
                                   tuple(r for r in reps if r >= held), partial))
    return PipelinePlan(spec, ranks, stages_per_rank, stages, tuple(boundaries))
