"""Our runner of a bubble-filled schedule (k3compile.vision.bubbles) on torch.distributed.

torch.distributed.pipelining's runtime executes per-rank lists of stage computations (forward,
backward, weight gradient, send / receive, each of a stage index and a microbatch); the encoder's
pieces are not a stage — each runs on every pipeline rank between the text stage's actions, on a
share of a microbatch's images, and feeds the first stage through a gather — so this runner
executes the lists itself:

- Ranks: S pipeline rows of C ranks (rank = s C + c). Text stage s runs on row s, the sequence's
  tokens split into C contiguous parts (the stage module must be token-local: the text model's
  own context parallelism is not wired here). The encoder is replicated on every rank.
- A microbatch's images are shared among the rows that its schedule gives ViT forward pieces, in
  proportion to those pieces' time (whole images, largest first to the row furthest below its
  share); within a row they are planned over its C ranks (passes/plan_vision_cp.py) and split
  images run gather-KV over the row's sub-groups. A row's VF pieces of a microbatch run the layers
  in consecutive groups (in proportion to the pieces' time) without keeping activations. Its ViT
  backward is shared the same way by the VB pieces' time, among the rows that have them, and
  recomputes: the VB pieces run the layers again (keeping their activations), then their backward
  in reverse. So the VB pieces may sit on other rows than the VF pieces, and no microbatch's
  encoder activations live from its forward to its backward (the costs' vit_backward should
  count the recomputation).
- An image's embedding is the mean of its patches' outputs: each rank sends the partial sums of its
  pieces to every rank of row 0, whose F(0, m) waits for them; B(0, m)'s gradient of the embeddings
  goes back to every rank that holds a piece, whose VB pieces wait for it. Text activations and
  their gradients go rank (s, c) -> (s +/- 1, c). Point-to-point sends are non-blocking (a sender
  never waits for its receiver), so the lists run in any order the schedule gives them.
The loss is sum over microbatches of <last stage's output, target>; parameter gradients stay
per rank (sum them over the ranks that hold each module: `reduce_gradients`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from k3compile.vision.gather_kv import segments_of, subgroups


@dataclass
class MicroBatch:
    grids: list  # (frames, height, width) of its images, in packed order
    patches: torch.Tensor  # [patches, vit width], packed
    text: torch.Tensor  # [tokens, text width]
    target: torch.Tensor  # [images + tokens, text width]


def share_images(grids, shares: dict[int, float]) -> dict[int, list[int]]:
    """Images (indices) per row: whole images, largest first, to the row furthest below its share
    of the microbatch's patches; rows without a share get none."""
    sizes = [f * h * w for f, h, w in grids]
    rows = sorted(r for r, share in shares.items() if share > 0)
    total = sum(shares[r] for r in rows)
    held = {r: 0 for r in rows}
    out: dict[int, list[int]] = {r: [] for r in rows}
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        row = min(rows, key=lambda r: (held[r] - shares[r] / total * sum(sizes), r))
        out[row].append(index)
        held[row] += sizes[index]
    return {r: sorted(images) for r, images in out.items() if images}


def split(count: int, weights: list[float]) -> list[range]:
    """`count` items in consecutive ranges in proportion to weights (each range may be empty)."""
    edges, total, run = [0], sum(weights), 0.0
    for w in weights:
        run += w
        edges.append(round(count * run / total) if total > 0 else count)
    edges[-1] = count
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def packed_offsets(grids) -> list[int]:
    offsets = [0]
    for f, h, w in grids:
        offsets.append(offsets[-1] + f * h * w)
    return offsets


class ScheduleRunner:
    """Runs one rank's list of a Schedule (module docstring). vit: the encoder's VisionLayers;
    project: vit width -> text width (row 0's); stage: this row's text stage (token-local);
    row_groups: per row, its sub-groups (k3compile.vision.subgroups of the row's ranks)."""

    def __init__(self, schedule, cp: int, vit, project, stage, microbatches, row_groups: list):
        # the passes package imports xDSL: only when a schedule is run
        from k3compile.passes.plan_vision_cp import plan_vision_cp

        self.rank, self.cp = dist.get_rank(), cp
        self.row, self.c = divmod(self.rank, cp)
        self.stages = len(schedule.lists)
        self.actions = schedule.lists[self.row]
        self.vit, self.project, self.stage, self.batches = vit, project, stage, microbatches
        self.width = vit[0].norm0.normalized_shape[0]
        self.holders: dict[tuple[str, int], list[int]] = {}  # (VF / VB, microbatch) -> ranks with a share
        self.mine: dict[tuple[str, int], tuple] = {}  # (VF / VB, microbatch) -> (each segment's image, segments, rows)
        self.groups: dict[tuple[str, int], list] = {}  # (VF / VB, microbatch) -> each piece's layers / steps
        for m, batch in enumerate(microbatches):
            for kind in ("VF", "VB"):
                shares = {row: sum(a.duration for a in actions if a.kind == kind and a.microbatch == m)
                          for row, actions in enumerate(schedule.lists)}
                self.holders[(kind, m)] = []
                for row, images in share_images(batch.grids, shares).items():
                    plan = plan_vision_cp([batch.grids[i] for i in images], cp)
                    self.holders[(kind, m)] += [row * cp + c for c in range(cp) if plan.for_rank(c)]
                    if row == self.row and plan.for_rank(self.c):
                        offsets, pieces = packed_offsets(batch.grids), plan.for_rank(self.c)
                        rows = torch.cat([torch.arange(offsets[images[i]] + p.start, offsets[images[i]] + p.stop)
                                          for i, p, _, _ in pieces])
                        self.mine[(kind, m)] = ([images[i] for i, _, _, _ in pieces],
                                                segments_of(plan, self.c, row_groups[row]), rows)
                # VF: the layers; VB: the layers again (recomputed, activations kept), then their backward
                steps = ([("forward", layer) for layer in range(len(vit))] if kind == "VF" else
                         [("again", layer) for layer in range(len(vit))]
                         + [("backward", layer) for layer in reversed(range(len(vit)))])
                durations = [a.duration for a in self.actions if a.kind == kind and a.microbatch == m]
                self.groups[(kind, m)] = [steps[r.start:r.stop] for r in split(len(steps), durations)]
        self.sent: list = []
        self.mailbox: dict[int, torch.Tensor] = {}  # what this rank sent itself, by tag
        self.state: dict = {}
        self.loss = torch.zeros((), dtype=microbatches[0].text.dtype)

    def tokens(self, m: int) -> slice:
        """This rank's part of microbatch m's sequence (its images' embeddings, then its text)."""
        part = split(len(self.batches[m].grids) + self.batches[m].text.shape[0], [1.0] * self.cp)[self.c]
        return slice(part.start, part.stop)

    def send(self, tensor: torch.Tensor, to: int, tag: int) -> None:
        tensor = tensor.detach().clone()
        if to == self.rank:
            self.mailbox[tag] = tensor
        else:
            self.sent.append(dist.isend(tensor, to, tag=tag))

    def recv(self, like: torch.Tensor, source: int, tag: int) -> torch.Tensor:
        if source == self.rank:
            return self.mailbox.pop(tag)
        buffer = torch.empty_like(like)
        dist.recv(buffer, source, tag=tag)
        return buffer

    def run(self) -> torch.Tensor:
        """Run the list; the sum of this rank's loss terms."""
        pieces: dict[tuple[str, int], int] = {}
        for action in self.actions:
            key = (action.kind, action.microbatch)
            pieces[key] = pieces.get(key, 0) + 1
            getattr(self, f"do_{action.kind}")(action.microbatch, pieces[key] - 1)
        for work in self.sent:
            work.wait()
        return self.loss

    def counts(self, m: int) -> torch.Tensor:
        return torch.tensor([f * h * w for f, h, w in self.batches[m].grids], dtype=self.batches[m].text.dtype)

    # --- the encoder's pieces ---------------------------------------------------------------

    def do_VF(self, m: int, step: int) -> None:
        """A piece of the encoder's forward of this rank's share: no activations kept (VB
        recomputes them); the last piece sends each image's partial sum to row 0."""
        if ("VF", m) not in self.mine:
            return
        image_of, segments, rows = self.mine[("VF", m)]
        h = self.state.pop(("vf", m), None)
        h = self.batches[m].patches[rows] if h is None else h
        with torch.no_grad():
            for _, layer in self.groups[("VF", m)][step]:
                h = self.vit[layer](h, segments=segments)
        if step < len(self.groups[("VF", m)]) - 1:
            self.state[("vf", m)] = h
            return
        sums, start = h.new_zeros((len(self.batches[m].grids), h.shape[1])), 0
        for image, segment in zip(image_of, segments):
            sums[image] += h[start:start + segment.rows].sum(0)
            start += segment.rows
        for c in range(self.cp):  # row 0's ranks
            self.send(sums, c, tag=4 * m)

    def do_VB(self, m: int, step: int) -> None:
        """A piece of the encoder's backward of this rank's share: its layers recomputed with their
        activations, then their backward from the embeddings' gradient (received from row 0)."""
        if ("VB", m) not in self.mine:
            return
        image_of, segments, rows = self.mine[("VB", m)]
        for what, layer in self.groups[("VB", m)][step]:
            if what == "again":
                boundaries = self.state.setdefault(("boundaries", m), {})
                h = boundaries[layer - 1][1] if layer else self.batches[m].patches[rows]
                inp = h.detach().requires_grad_(True)
                boundaries[layer] = (inp, self.vit[layer](inp, segments=segments))
                continue
            if layer == len(self.vit) - 1:
                like = self.batches[m].patches.new_zeros((len(self.batches[m].grids), self.width))
                per_image = sum(self.recv(like, c, tag=4 * m + 1) for c in range(self.cp)) / self.counts(m)[:, None]
                self.state[("grad", m)] = torch.cat([per_image[image].expand(segment.rows, -1)
                                                     for image, segment in zip(image_of, segments)])
            inp, out = self.state[("boundaries", m)].pop(layer)
            out.backward(self.state.pop(("grad", m)))
            if layer:
                self.state[("grad", m)] = inp.grad

    # --- the text stages --------------------------------------------------------------------

    def do_F(self, m: int, step: int) -> None:
        batch, part = self.batches[m], self.tokens(m)
        if self.row == 0:
            like = batch.patches.new_zeros((len(batch.grids), self.width))
            sums = sum(self.recv(like, sender, tag=4 * m) for sender in self.holders[("VF", m)])
            pooled = self.state[("pooled", m)] = (sums / self.counts(m)[:, None]).requires_grad_(True)
            x = torch.cat([self.project(pooled), batch.text])[part]
        else:
            like = batch.text.new_zeros((part.stop - part.start, batch.text.shape[1]))
            x = self.recv(like, self.rank - self.cp, tag=4 * m + 2).requires_grad_(True)
        y = self.stage(x)
        self.state[("text", m)] = (x, y)
        if self.row == self.stages - 1:
            self.loss = self.loss + (y * batch.target[part]).sum().detach()
        else:
            self.send(y, self.rank + self.cp, tag=4 * m + 2)

    def do_B(self, m: int, step: int) -> None:
        x, y = self.state.pop(("text", m))
        if self.row == self.stages - 1:
            grad = self.batches[m].target[self.tokens(m)]
        else:
            grad = self.recv(y, self.rank + self.cp, tag=4 * m + 3)
        y.backward(grad)
        if self.row > 0:
            self.send(x.grad, self.rank - self.cp, tag=4 * m + 3)
        else:
            pooled = self.state.pop(("pooled", m))
            for holder in self.holders[("VB", m)]:
                self.send(pooled.grad, holder, tag=4 * m + 1)


def row_subgroups(stages: int, cp: int) -> list[dict]:
    """Per pipeline row, the plan layout's process groups among its ranks (every rank calls this,
    in the same order)."""
    return [subgroups(cp, range(row * cp, row * cp + cp)) for row in range(stages)]
