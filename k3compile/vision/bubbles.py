"""ViT work in the bubbles of the text model's 1F1B pipeline: a planner and its simulator.

The text model runs 1F1B over S pipeline ranks and M microbatches. The vision encoder is
replicated on every pipeline rank and its work is divisible across them (a microbatch's images,
or pieces of one image, context-parallel: passes/plan_vision_cp.py), so any rank may do any
part of any microbatch's ViT forward (VF) or backward (VB). Constraints: all of microbatch m's VF
ends (and its embeddings reach rank 0, `latency` later) before the first text stage's forward
F(0, m) starts; its VB starts after B(0, m) produced their gradient (plus `latency`).

`fill_bubbles` simulates the plain 1F1B schedule, reads each rank's idle intervals (warm-up,
cool-down, and any an uneven stage leaves), and pours ViT work into them in time order: in each
interval, the forward of the microbatch with the earliest deadline still after the interval's
time, else the backward of the earliest released microbatch; a piece is at least `chunk` ms (a
layer over a slice of images) unless it ends its work. What does not fit is spread over all
ranks: leftover forward before the pipeline, leftover backward after it. The result is
per-rank action lists (what a runner executes, in order) re-simulated with every dependency, so
its step time includes whatever the leftovers delayed. Baselines: ViT before the pipeline (all
VF, then 1F1B, then all VB, spread over the ranks), ViT in the first stage's rank, ViT as its
own stage (S + 1 ranks). docs/vision.md has the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TEXT = ("F", "B")


@dataclass(frozen=True)
class PipelineCosts:
    """Milliseconds: per text stage, one microbatch's forward and backward; per microbatch, the
    whole encoder's forward and backward on one GPU."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    vit_forward: tuple[float, ...]
    vit_backward: tuple[float, ...]
    chunk: float = 1.0
    latency: float = 0.0

    def __post_init__(self):
        if not self.forward or len(self.forward) != len(self.backward):
            raise ValueError(f"forward, backward: expected one time per stage each, got {len(self.forward)} and "
                             f"{len(self.backward)}")
        if not self.vit_forward or len(self.vit_forward) != len(self.vit_backward):
            raise ValueError(f"vit_forward, vit_backward: expected one time per microbatch each, got "
                             f"{len(self.vit_forward)} and {len(self.vit_backward)}")
        times = (*self.forward, *self.backward, *self.vit_forward, *self.vit_backward)
        if not all(isinstance(t, (int, float)) and t >= 0 and t == t and t != float("inf") for t in times):
            raise ValueError("forward, backward, vit_forward, vit_backward: expected finite times >= 0")
        if not self.chunk > 0 or not self.latency >= 0:
            raise ValueError(f"chunk, latency: expected chunk > 0 and latency >= 0, got {self.chunk}, {self.latency}")

    @property
    def stages(self) -> int:
        return len(self.forward)

    @property
    def microbatches(self) -> int:
        return len(self.vit_forward)


@dataclass(frozen=True)
class Action:
    """F / B: text stage `stage`'s forward / backward of a microbatch; VF / VB: a piece of that
    microbatch's ViT forward / backward (stage -1)."""

    kind: str
    microbatch: int
    stage: int
    duration: float

    def __str__(self) -> str:
        return (f"{self.kind}{self.microbatch}" if self.kind in TEXT
                else f"{self.kind}{self.microbatch}[{self.duration:.3g}ms]")


@dataclass(frozen=True)
class Schedule:
    name: str
    lists: tuple[tuple[Action, ...], ...]  # per rank, in the order it runs them
    times: tuple[tuple[tuple[float, float], ...], ...]  # per rank, (start, end) of each action

    @property
    def step(self) -> float:
        return max((times[-1][1] for times in self.times if times), default=0.0)

    def live_vit_activations(self) -> int:
        """The most microbatches whose ViT forward has begun and backward not ended, at any time."""
        first, last = {}, {}
        for actions, times in zip(self.lists, self.times):
            for action, (start, end) in zip(actions, times):
                if action.kind == "VF":
                    first[action.microbatch] = min(first.get(action.microbatch, start), start)
                elif action.kind == "VB":
                    last[action.microbatch] = max(last.get(action.microbatch, end), end)
        events = sorted([(t, 1) for t in first.values()] + [(t, -1) for t in last.values()])
        live = most = 0
        for _, change in events:
            live += change
            most = max(most, live)
        return most

    def action_lists(self) -> list[str]:
        return [f"rank {rank}: " + " ".join(map(str, actions)) for rank, actions in enumerate(self.lists)]


def one_f_one_b(stages: int, microbatches: int, forward, backward) -> list[list[Action]]:
    """1F1B (PipeDream-flush): rank s runs min(S - s - 1, M) warm-up forwards, then one forward
    and one backward in turn, then the rest of its backwards. forward(s, m), backward(s, m): ms."""
    lists = []
    for s in range(stages):
        warm = min(stages - s - 1, microbatches)
        order = [("F", m) for m in range(warm)]
        for i in range(microbatches - warm):
            order += [("F", warm + i), ("B", i)]
        order += [("B", m) for m in range(microbatches - warm, microbatches)]
        lists.append([Action(kind, m, s, (forward if kind == "F" else backward)(s, m)) for kind, m in order])
    return lists


def simulate(name: str, lists, latency: float = 0.0) -> Schedule:
    """Run the per-rank lists in order, each action when its rank is free and its inputs are there:
    F(s, m) after F(s-1, m) (F(0, m) after every VF piece of m), B(s, m) after B(s+1, m) (the last
    stage's after its F), VB pieces of m after B(0, m); `latency` ms for each crossing. ValueError
    if the lists deadlock."""
    last_stage = max((a.stage for actions in lists for a in actions), default=0)
    vf_left = {}
    for actions in lists:
        for a in actions:
            if a.kind == "VF":
                vf_left[a.microbatch] = vf_left.get(a.microbatch, 0) + 1
    done: dict[tuple[str, int, int], float] = {}
    vf_end: dict[int, float] = {}
    times = [[] for _ in lists]
    free = [0.0] * len(lists)
    position = [0] * len(lists)

    def ready(a: Action):
        """When a's inputs are there, or None if they are not yet made."""
        if a.kind == "VF":
            return 0.0
        if a.kind == "VB":
            end = done.get(("B", 0, a.microbatch))
            return None if end is None else end + latency
        if a.kind == "F":
            if a.stage == 0:
                return vf_end.get(a.microbatch, -latency) + latency if vf_left.get(a.microbatch, 0) == 0 else None
            end = done.get(("F", a.stage - 1, a.microbatch))
        else:
            end = done.get(("F", a.stage, a.microbatch) if a.stage == last_stage else ("B", a.stage + 1, a.microbatch))
            if a.stage == last_stage:
                return end
        return None if end is None else end + latency

    remaining = sum(map(len, lists))
    while remaining:
        progressed = False
        for rank, actions in enumerate(lists):
            while position[rank] < len(actions):
                a = actions[position[rank]]
                at = ready(a)
                if at is None:
                    break
                start = max(free[rank], at)
                end = free[rank] = start + a.duration
                times[rank].append((start, end))
                if a.kind in TEXT:
                    done[(a.kind, a.stage, a.microbatch)] = end
                elif a.kind == "VF":
                    vf_left[a.microbatch] -= 1
                    vf_end[a.microbatch] = max(vf_end.get(a.microbatch, 0.0), end)
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(actions[position[r]]) for r, actions in enumerate(lists) if position[r] < len(actions)]
            raise ValueError(f"{name}: the action lists deadlock (next on each rank: {', '.join(stuck)})")
    return Schedule(name, tuple(map(tuple, lists)), tuple(map(tuple, times)))


def text_only(costs: PipelineCosts) -> Schedule:
    lists = one_f_one_b(costs.stages, costs.microbatches, lambda s, m: costs.forward[s], lambda s, m: costs.backward[s])
    return simulate("text only", lists, costs.latency)


def vit_before_pipeline(costs: PipelineCosts) -> Schedule:
    """Every rank encodes 1/S of each microbatch's images before the pipeline, and runs their
    backward after it."""
    S, M = costs.stages, costs.microbatches
    lists = one_f_one_b(S, M, lambda s, m: costs.forward[s], lambda s, m: costs.backward[s])
    for actions in lists:
        actions[:0] = [Action("VF", m, -1, costs.vit_forward[m] / S) for m in range(M)]
        actions += [Action("VB", m, -1, costs.vit_backward[m] / S) for m in range(M)]
    return simulate("ViT before the pipeline", lists, costs.latency)


def vit_in_first_stage(costs: PipelineCosts) -> Schedule:
    """The encoder on the first stage's rank: its forward and backward grow by the ViT's."""
    lists = one_f_one_b(costs.stages, costs.microbatches,
                        lambda s, m: costs.forward[s] + (costs.vit_forward[m] if s == 0 else 0.0),
                        lambda s, m: costs.backward[s] + (costs.vit_backward[m] if s == 0 else 0.0))
    return simulate("ViT in the first stage", lists, costs.latency)


def vit_own_stage(costs: PipelineCosts) -> Schedule:
    """The encoder as a pipeline stage of its own, on one more rank (S + 1 ranks)."""
    lists = one_f_one_b(costs.stages + 1, costs.microbatches,
                        lambda s, m: costs.vit_forward[m] if s == 0 else costs.forward[s - 1],
                        lambda s, m: costs.vit_backward[m] if s == 0 else costs.backward[s - 1])
    return simulate("ViT as its own stage (S + 1 ranks)", lists, costs.latency)


def idle_intervals(schedule: Schedule) -> list[tuple[float, int, float]]:
    """(start, rank, end) of every gap in each rank's timeline up to the step's end."""
    gaps = []
    for rank, times in enumerate(schedule.times):
        edges = [0.0] + [t for pair in times for t in pair] + [schedule.step]
        gaps += [(a, rank, b) for a, b in zip(edges[::2], edges[1::2]) if b > a]
    return sorted(gaps)


def fill_bubbles(costs: PipelineCosts, reorder: bool = True) -> Schedule:
    """The 1F1B schedule with ViT work in its bubbles (module docstring), re-simulated. reorder:
    run first the microbatch with the lightest ViT forward and last the one (of the others) with
    the lightest ViT backward: nothing idles before the first's forward is needed or after the
    last's backward is released, so those two are the floor of the exposed time (a step's
    microbatches may run in any order). Actions name the microbatches as `costs` numbers them."""
    M = costs.microbatches
    order = list(range(M))
    if reorder and M > 1:
        first, last = lightest_ends(costs)
        order = [first] + [m for m in order if m not in (first, last)] + [last]
    permuted = replace(costs, vit_forward=tuple(costs.vit_forward[m] for m in order),
                       vit_backward=tuple(costs.vit_backward[m] for m in order))
    schedule = _fill(permuted)
    lists = tuple(tuple(replace(a, microbatch=order[a.microbatch]) for a in actions) for actions in schedule.lists)
    return replace(schedule, lists=lists)


def lightest_ends(costs: PipelineCosts) -> tuple[int, int]:
    """The first and last microbatch (two, unless M = 1) with the least ViT forward of the first
    plus ViT backward of the last."""
    forward, backward = costs.vit_forward, costs.vit_backward
    by_forward = sorted(range(costs.microbatches), key=forward.__getitem__)[:2]
    by_backward = sorted(range(costs.microbatches), key=backward.__getitem__)[:2]
    pairs = [(f, b) for f in by_forward for b in by_backward if f != b] or [(0, 0)]
    return min(pairs, key=lambda pair: forward[pair[0]] + backward[pair[1]])


def _fill(costs: PipelineCosts) -> Schedule:
    S, M, chunk, latency = costs.stages, costs.microbatches, costs.chunk, costs.latency
    plain = text_only(costs)
    start_of = {(a.kind, a.microbatch): t for a, t in zip(plain.lists[0], plain.times[0])}
    end_of = {(a.kind, a.microbatch): t for a, (_, t) in zip(plain.lists[0], plain.times[0])}
    deadline = [start_of[("F", m)][0] - latency for m in range(M)]
    release = [end_of[("B", m)] + latency for m in range(M)]
    forward, backward = list(costs.vit_forward), list(costs.vit_backward)
    placed: list[list[tuple[float, Action]]] = [[] for _ in range(S)]

    def take(work: list[float], m: int, room: float) -> float:
        piece = min(work[m], room)
        return piece if piece >= min(chunk, work[m]) and piece > 0 else 0.0

    for a, rank, b in idle_intervals(plain):
        t = a
        while t < b - 1e-12:
            due = [m for m in range(M) if forward[m] > 0 and deadline[m] > t]
            if due:
                m = min(due, key=deadline.__getitem__)
                piece = take(forward, m, min(b, deadline[m]) - t)
                if piece:
                    placed[rank].append((t, Action("VF", m, -1, piece)))
                    forward[m] -= piece
                    t += piece
                    continue
            out = [m for m in range(M) if backward[m] > 0]
            now = [m for m in out if release[m] <= t]
            if now:
                piece = take(backward, now[0], b - t)
                if piece:
                    placed[rank].append((t, Action("VB", now[0], -1, piece)))
                    backward[now[0]] -= piece
                    t += piece
                    continue
                break
            later = [release[m] for m in out if t < release[m] < b]
            if not later:
                break
            t = min(later)
    # what did not fit: spread over every rank, forward before the pipeline and backward after it
    # (the same work on every rank shifts the whole schedule, so the bubbles' pieces still fit)
    for m in range(M):
        for rank in range(S):
            if forward[m] > 1e-12:
                placed[rank].append((-float("inf"), Action("VF", m, -1, forward[m] / S)))
            if backward[m] > 1e-12:
                placed[rank].append((float("inf"), Action("VB", m, -1, backward[m] / S)))
    lists = []
    for rank in range(S):
        text = [(start, a) for a, (start, _) in zip(plain.lists[rank], plain.times[rank])]
        # ViT pieces go before a text action that starts at the same time (they were placed to end by it)
        merged = sorted(text + placed[rank], key=lambda item: (item[0], item[1].kind in TEXT))
        lists.append([a for _, a in merged])
    return simulate("ViT in the bubbles", lists, latency)


def exposure_floor(costs: PipelineCosts) -> float:
    """A lower bound of any bubble filling's exposed ViT time (ms a rank, the ViT spread evenly):
    the first microbatch's forward has no idle time before it is due and the last's backward
    none after its release; forward work cannot use idle time after the last microbatch is due,
    backward work none before the first is released, and no work more than all idle time."""
    text, S = text_only(costs), costs.stages
    starts = [start for a, (start, _) in zip(text.lists[0], text.times[0]) if a.kind == "F"]
    ends = [end for a, (_, end) in zip(text.lists[0], text.times[0]) if a.kind == "B"]
    due, released = max(starts) - costs.latency, min(ends) + costs.latency
    gaps = idle_intervals(text)
    before = sum(max(0.0, min(b, due) - a) for a, _, b in gaps)
    after = sum(max(0.0, b - max(a, released)) for a, _, b in gaps)
    forward, backward = sum(costs.vit_forward), sum(costs.vit_backward)
    excess = max(max(0.0, forward - before) + max(0.0, backward - after),
                 forward + backward - sum(b - a for a, _, b in gaps))
    first, last = lightest_ends(costs)
    ends_alone = costs.vit_forward[first] + costs.vit_backward[last]
    return max(excess, ends_alone) / S

