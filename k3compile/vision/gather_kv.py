"""Gather-KV attention: a large image split over a sub-group of ranks, each holding a contiguous
piece of its patches (q, k, v of those rows). K and V are all-gathered within the sub-group, so
each rank attends its queries to the whole image; the backward reduce-scatters dK and dV back to
the ranks that own those rows (the sum of every member's contribution). docs/vision.md.

The collectives run on torch.distributed process groups made once (`subgroups`): the aligned
blocks of passes/plan_vision_cp.py's layout, so a new batch's plan needs no new group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from k3compile.vision.attention import check_qkv, packed_attention


class GatherRows(torch.autograd.Function):
    """Forward: the members' row blocks (sizes[i] rows on member i) concatenated in member order,
    on every member. Backward: each member gets the sum over members of the gradient of its rows
    (a reduce-scatter). Blocks are padded to the largest for the collectives."""

    @staticmethod
    def forward(ctx, x, group, sizes):
        ctx.group, ctx.sizes = group, sizes
        most = max(sizes)
        padded = x.new_zeros((most, *x.shape[1:]))
        padded[: x.shape[0]] = x
        blocks = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(blocks, padded.contiguous(), group=group)
        return torch.cat([block[:n] for block, n in zip(blocks, sizes)])

    @staticmethod
    def backward(ctx, grad):
        most, mine = max(ctx.sizes), ctx.sizes[dist.get_rank(ctx.group)]
        blocks = []
        for part in grad.split(list(ctx.sizes)):
            block = grad.new_zeros((most, *grad.shape[1:]))
            block[: part.shape[0]] = part
            blocks.append(block)
        out = torch.empty_like(blocks[0])
        dist.reduce_scatter(out, blocks, group=ctx.group)
        return out[:mine], None, None


def gather_kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, sizes,
                        scale: float | None = None) -> torch.Tensor:
    """Bidirectional attention of this rank's piece of an image (q, k, v [m, H, D]) over the whole
    image, whose pieces lie on the members of `group` (sizes: each member's rows, in group rank
    order; this rank's is m). Returns [m, H, D]; differentiable in q, k, v."""
    sizes = tuple(int(n) for n in sizes)
    check_qkv(q, k, v, [q.shape[0]])
    members = dist.get_world_size(group)
    if len(sizes) != members or min(sizes) <= 0 or sizes[dist.get_rank(group)] != q.shape[0]:
        raise ValueError(f"sizes: expected {members} positive row counts (one a member of the group), this rank's "
                         f"{q.shape[0]}, got {list(sizes)} on rank {dist.get_rank(group)} of the group")
    kv = GatherRows.apply(torch.stack((k, v), dim=1), group, sizes)
    keys, values = kv.unbind(dim=1)
    return F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1),
                                          scale=scale).transpose(0, 1)


@dataclass(frozen=True)
class Segment:
    """Patches [start, stop) of an image of grid (frames, height, width) in a rank's packed
    sequence; group and sizes when the image is split (the members' rows), else None and ()."""

    grid: tuple[int, int, int]
    start: int
    stop: int
    group: object = None
    sizes: tuple[int, ...] = ()

    @property
    def rows(self) -> int:
        return self.stop - self.start


def whole_images(grids) -> list[Segment]:
    """Segments of whole images, (frames, height, width) each (single device)."""
    return [Segment(tuple(grid), 0, grid[0] * grid[1] * grid[2]) for grid in grids]


def subgroups(ranks: int, global_ranks=None) -> dict[tuple[int, int], object]:
    """A process group for every block of size > 1 of the plan layout of `ranks` ranks (their
    global ranks: global_ranks[i], default i). Every rank calls it, in the same order."""
    # the passes package imports xDSL: only for a planned split
    from k3compile.passes.plan_vision_cp import subgroup_layout

    global_ranks = list(range(ranks)) if global_ranks is None else list(global_ranks)
    return {(first, size): dist.new_group(global_ranks[first:first + size])
            for first, size in subgroup_layout(ranks) if size > 1}


def segments_of(plan, rank: int, groups: dict) -> list[Segment]:
    """This rank's segments of a VisionCPPlan (passes/plan_vision_cp.py), its pieces in order."""
    segments = []
    for index, piece, group, sizes in plan.for_rank(rank):
        image = plan.images[index]
        grid = (image.frames, image.height, image.width)
        segments.append(Segment(grid, piece.start, piece.stop, groups[group], sizes) if group[1] > 1
                        else Segment(grid, piece.start, piece.stop))
    return segments


def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments, backend: str = "sdpa",
                      scale: float | None = None) -> torch.Tensor:
    """Attention of a rank's packed sequence: its whole images together on `backend`
    (k3compile.vision.attention), each split piece by gather-KV over its sub-group."""
    starts = [0]
    for segment in segments:
        starts.append(starts[-1] + segment.rows)
    if starts[-1] != q.shape[0]:
        raise ValueError(f"segments: expected their rows to sum to q's {q.shape[0]}, got {starts[-1]}")
    whole = [i for i, s in enumerate(segments) if s.group is None]
    outs = [None] * len(segments)
    if whole:
        rows = torch.cat([torch.arange(starts[i], starts[i + 1], device=q.device) for i in whole])
        done = packed_attention(q[rows], k[rows], v[rows], [segments[i].rows for i in whole], backend, scale)
        for i, part in zip(whole, done.split([segments[i].rows for i in whole])):
            outs[i] = part
    for i, segment in enumerate(segments):
        if segment.group is not None:
            rows = slice(starts[i], starts[i + 1])
            outs[i] = gather_kv_attention(q[rows], k[rows], v[rows], segment.group, segment.sizes, scale)
    return torch.cat(outs)
