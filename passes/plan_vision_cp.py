"""plan-vision-cp: a batch's images and P ranks -> the vision encoder's context-parallel plan.

A planner run once per batch (its input is the batch, not the layer, so it is no IR pass of a
pipeline): `plan_vision_cp(images, ranks)` returns a `VisionCPPlan`, verified before it is
returned; `k3c plan-vision` prints one. docs/vision.md has the algorithm and figures.

- An image is `frames x height x width` patches (a bare count n is 1 x n x 1; a video's frames are
  one attention unit). Its patches are packed frame by frame, row by row. A piece of an image is
  a contiguous range of its patches; pieces start at multiples of the image's granule
  (`rows_per_cut` rows of width patches: 2 by default, so MoonViT's 2x2 patch merger after the
  encoder never spans two ranks; 1 patch for a bare count).
- Cost of m patches of an n-patch image, one layer forward: m (attention n + linear): each query
  meets n keys (gather-KV: a piece's queries attend to the whole image), and every patch goes
  through the projections and the MLP. Summed over an image's pieces it is the image's own cost,
  so splitting moves compute without adding any: the lower bound of the makespan is
  max(total / P, the costliest granule), since no plan can cut below a granule. With a gather
  cost (VisionCost.gather, `with_link`), a split image's member also pays for the n - m rows of K
  and V it receives, so the planner weighs a larger sub-group's traffic against its balance.
- Sub-groups are aligned blocks of ranks (sizes 2, 4, 8, ... starting at multiples of their size,
  and the whole group): at most 2P groups, the same for every batch, so a trainer makes each
  process group once (k3compile.vision.gather_kv.subgroups) and a plan only picks among them.
- Placement, images by decreasing cost: an image goes whole onto the least-loaded rank if that
  keeps the rank under the target U = (1 + slack) x lower bound; otherwise it is split over the
  smallest block (then the one of its size) whose busiest member stays under U once the shares are
  rounded to granules (else the block whose busiest member is least), its rows shared so that the
  block's loads rise to one level (every member at least one granule). The
  whole group always fits (its level is at most total / P), so the makespan is at most U up to a
  granule a member. With a gather cost the block is chosen on compute alone (the smallest that
  fits: every member gathers about n rows whatever the size, so a larger block only adds
  traffic), the shares count each member's traffic, and U grows by the traffic's average.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace

import numpy as np

from k3compile.errors import ArgumentError


@dataclass(frozen=True)
class VisionCost:
    """Forward FLOPs of one encoder layer: `attention` per (query, key) pair (QK^T and PV over the
    heads: 4 heads x head_dim), `linear` per patch (QKV, output projection, the MLP's two);
    `gather`: receiving one patch's K and V row, in the FLOPs the rank would do meanwhile (a split
    image's member pays it for every row it gathers from the others; 0: communication is free)."""

    attention: float
    linear: float
    gather: float = 0.0

    def with_link(self, gbps: float, tflops: float, value_bytes: int = 2) -> VisionCost:
        """gather for K and V rows of bf16 (value_bytes) arriving at gbps GB/s on a rank that does
        tflops TFLOP/s."""
        row_bytes = 2 * (self.attention / 4) * value_bytes
        return replace(self, gather=row_bytes / (gbps * 1e9) * tflops * 1e12)

    @classmethod
    def from_dims(cls, hidden_size: int, num_heads: int, head_dim: int, mlp_dim: int) -> VisionCost:
        inner = num_heads * head_dim
        return cls(attention=4.0 * inner, linear=2.0 * (hidden_size * 3 * inner + inner * hidden_size
                                                        + 2 * hidden_size * mlp_dim))

    @classmethod
    def from_params(cls, params: dict) -> VisionCost:
        """From a vision spec's parameters (k3compile.spec: LayerSpec.params)."""
        return cls.from_dims(params["hidden_size"], params["num_heads"], params["head_dim"], params["mlp_dim"])

    def of(self, patches: int, image_patches: int) -> float:
        return patches * (self.attention * image_patches + self.linear)

    def piece(self, patches: int, image_patches: int, split: bool) -> float:
        """A piece's compute, and the rows it gathers if its image is split."""
        return self.of(patches, image_patches) + (self.gather * (image_patches - patches) if split else 0.0)


# MoonViT's dims (the vision spec's defaults): hidden 1152, 16 heads of 72, MLP 4304
MOONVIT_COST = VisionCost.from_dims(1152, 16, 72, 4304)


@dataclass(frozen=True)
class Image:
    frames: int
    height: int
    width: int
    granule: int  # pieces start at multiples of this many patches

    @functools.cached_property
    def patches(self) -> int:
        return self.frames * self.height * self.width

    def describe(self) -> str:
        if self.height * self.frames == self.patches:  # a bare count
            return str(self.patches)
        return f"{self.frames}x{self.height}x{self.width}" if self.frames > 1 else f"{self.height}x{self.width}"


_IMAGE = re.compile(r"^\s*(\d+)(?:\s*x\s*(\d+))?(?:\s*x\s*(\d+))?\s*$")


def parse_image(text: str, rows_per_cut: int = 2) -> Image:
    """'n' (n patches), 'HxW' (an image of H rows of W patches) or 'FxHxW' (a video)."""
    match = _IMAGE.match(str(text))
    if not match:
        raise ArgumentError(f"image {text!r}: expected N, HxW or FxHxW (positive integers), got {text!r}")
    numbers = [int(g) for g in match.groups() if g is not None]
    if min(numbers) <= 0:
        raise ArgumentError(f"image {text!r}: every size must be positive, got {text!r}")
    if len(numbers) == 1:
        return Image(1, numbers[0], 1, 1)
    frames, height, width = ([1] + numbers)[-3:]
    return Image(frames, height, width, width * rows_per_cut)


def as_image(item, rows_per_cut: int) -> Image:
    if isinstance(item, Image):
        return item
    if isinstance(item, bool) or not isinstance(item, (int, str, tuple, list)):
        raise ArgumentError(f"images: expected patch counts, 'HxW' / 'FxHxW' strings or (F, H, W) tuples, "
                            f"got {type(item).__name__} {item!r}")
    if isinstance(item, int):
        if item <= 0:
            raise ArgumentError(f"image {item!r}: every size must be positive, got {item!r}")
        return Image(1, item, 1, 1)
    if isinstance(item, (tuple, list)):
        if not (1 <= len(item) <= 3 and all(isinstance(x, int) and not isinstance(x, bool) for x in item)):
            raise ArgumentError(f"images: a tuple must be (N,), (H, W) or (F, H, W) integers, got {item!r}")
        item = "x".join(map(str, item))
    return parse_image(str(item), rows_per_cut)


@dataclass(frozen=True)
class Piece:
    """Patches [start, stop) of image `image` computed on rank `rank`."""

    image: int
    rank: int
    start: int
    stop: int


@dataclass(frozen=True)
class VisionCPPlan:
    ranks: int
    images: tuple[Image, ...]
    cost: VisionCost
    slack: float
    groups: tuple[tuple[int, int], ...]  # per image: (first rank, size) of its sub-group; size 1: whole
    pieces: tuple[tuple[Piece, ...], ...]  # per image, in rank order

    @property
    def loads(self) -> list[float]:
        loads = [0.0] * self.ranks
        for image, pieces in zip(self.images, self.pieces):
            for piece in pieces:
                loads[piece.rank] += self.cost.piece(piece.stop - piece.start, image.patches, len(pieces) > 1)
        return loads

    @property
    def makespan(self) -> float:
        return max(self.loads)

    @property
    def total(self) -> float:
        return sum(self.cost.of(image.patches, image.patches) for image in self.images)

    @property
    def indivisible(self) -> float:
        """The costliest granule: no plan cuts below it."""
        return max((self.cost.of(min(image.granule, image.patches), image.patches) for image in self.images),
                   default=0.0)

    @property
    def lower_bound(self) -> float:
        return max(self.total / self.ranks, self.indivisible)

    def for_rank(self, rank: int) -> list[tuple[int, Piece, tuple[int, int], tuple[int, ...]]]:
        """This rank's pieces in the order its packed sequence holds them (by image): (image, its
        piece here, the image's sub-group (first, size), the sizes of every member's piece)."""
        return [(index, piece, self.groups[index], tuple(p.stop - p.start for p in pieces))
                for index, pieces in enumerate(self.pieces) for piece in pieces if piece.rank == rank]

    def format(self, unit: float = 1e9, unit_name: str = "GFLOP") -> str:
        """The plan as text: the bound, each rank's load, every split image's pieces."""
        loads, bound = self.loads, self.lower_bound
        split = [i for i, (_, size) in enumerate(self.groups) if size > 1]
        lines = [f"vision context-parallel plan: {len(self.images)} images "
                 f"({sum(i.patches for i in self.images):,} patches) over {self.ranks} ranks; cost a layer forward: "
                 f"{self.cost.attention:g} FLOP a (query, key) pair + {self.cost.linear:,.0f} FLOP a patch"
                 + (f" + {self.cost.gather:,.0f} FLOP-time a gathered K/V row" if self.cost.gather else ""),
                 f"makespan {self.makespan / unit:,.3f} {unit_name} = {self.makespan / bound:.4f} x lower bound "
                 f"{bound / unit:,.3f} {unit_name} (max of total / P = {self.total / self.ranks / unit:,.3f}, "
                 f"costliest granule = {self.indivisible / unit:,.3f}); target {1 + self.slack:g} x bound"
                 + (" (raised by the traffic's average)" if self.cost.gather else ""),
                 f"images: {len(self.images) - len(split)} whole on one rank, {len(split)} split over sub-groups "
                 f"(aligned blocks: {', '.join(str(s) for s in sorted({self.groups[i][1] for i in split})) or '-'})",
                 "", f"{'rank':>4}  {'load':>12}  {'/ bound':>7}  {'whole':>5}  {'patches':>9}  gathered"]
        for rank in range(self.ranks):
            mine = self.for_rank(rank)
            whole = sum(1 for _, _, group, _ in mine if group[1] == 1)
            patches = sum(piece.stop - piece.start for _, piece, _, _ in mine)
            gathered = sum(sum(sizes) for _, _, group, sizes in mine if group[1] > 1)  # K/V rows it gathers
            lines.append(f"{rank:>4}  {loads[rank] / unit:>12,.3f}  {loads[rank] / bound:>7.4f}  {whole:>5}  "
                         f"{patches:>9,}  {gathered:,}")
        if split:
            lines += ["", "split images (patches [start, stop) per rank of the sub-group):"]
        for index in split:
            first, size = self.groups[index]
            ranges = " ".join(f"{p.rank}:[{p.start},{p.stop})" for p in self.pieces[index])
            lines.append(f"  image {index} ({self.images[index].describe()}, {self.images[index].patches:,} patches) "
                         f"on ranks {first}..{first + size - 1}: {ranges}")
        return "\n".join(lines)

    def verify(self) -> None:
        """Every patch computed exactly once, pieces on granules and inside their image's aligned
        sub-group (one piece a member), the makespan at least the lower bound. ValueError if not."""
        layout = set(subgroup_layout(self.ranks))
        for index, (image, pieces, group) in enumerate(zip(self.images, self.pieces, self.groups)):
            where = f"plan: image {index} ({image.describe()})"
            if group not in layout:
                raise ValueError(f"{where}: sub-group {group} is not an aligned block of the {self.ranks} ranks")
            first, size = group
            if size == 1 and len(pieces) == 1 and (pieces[0].rank, pieces[0].start, pieces[0].stop) == (
                    first, 0, image.patches):
                continue  # whole on one rank
            if [p.rank for p in pieces] != list(range(first, first + size)):
                raise ValueError(f"{where}: pieces on ranks {[p.rank for p in pieces]}, expected one on each of "
                                 f"{first}..{first + size - 1}")
            bounds = [p.start for p in pieces] + [pieces[-1].stop]
            if bounds[0] != 0 or bounds[-1] != image.patches or any(p.stop != q.start for p, q in
                                                                  zip(pieces, pieces[1:])):
                raise ValueError(f"{where}: pieces {[(p.start, p.stop) for p in pieces]} do not cover "
                                 f"0..{image.patches} once")
            if any(p.stop <= p.start for p in pieces) or any(b % image.granule for b in bounds[1:-1]):
                raise ValueError(f"{where}: an empty piece or a cut off the granule of {image.granule} patches")
        if self.makespan < self.lower_bound * (1 - 1e-12):
            raise ValueError(f"plan: makespan {self.makespan:.6g} below the lower bound {self.lower_bound:.6g}")


def subgroup_layout(ranks: int) -> list[tuple[int, int]]:
    """The sub-groups a plan may use: (first, size) of each rank, each aligned block of 2, 4, 8,
    ... ranks that fits, and the whole group."""
    layout = [(r, 1) for r in range(ranks)]
    size = 2
    while size < ranks:
        layout += [(first, size) for first in range(0, ranks - size + 1, size)]
        size *= 2
    return layout + ([(0, ranks)] if ranks > 1 else [])


def _water_levels(blocks: np.ndarray, work: float) -> np.ndarray:
    """Per row of `blocks` (loads of a block's ranks): the level they rise to when `work` is
    poured over them (sum of (level - load)+ = work): the least (work + sum of the k lowest) / k."""
    lowest = np.sort(blocks, axis=1)
    counts = np.arange(1, blocks.shape[1] + 1)
    return ((work + np.cumsum(lowest, axis=1)) / counts).min(axis=1)


def _shares(image: Image, loads: np.ndarray, level: float, per_patch: float) -> list[int]:
    """Patches of `image` per member so the members' loads rise to `level`: whole granules, at
    least one each, summing to the image; the granules left after rounding down go one by one to
    the member whose load stays least (and any excess leaves the most loaded). The image's last
    granule may be partial and lies on the last member, so that member's granules weigh less."""
    units = math.ceil(image.patches / image.granule)
    granule = per_patch * image.granule
    short = np.zeros(len(loads))
    short[-1] = per_patch * (units * image.granule - image.patches)  # the partial granule's missing patches
    wanted = np.maximum(level - loads + short, 0.0) / granule
    count = np.maximum(np.floor(wanted).astype(int), 1)
    while count.sum() > units:
        count[np.argmax(np.where(count > 1, loads + count * granule - short, -np.inf))] -= 1
    while count.sum() < units:
        count[np.argmin(loads + (count + 1) * granule - short)] += 1
    sizes = [int(c) * image.granule for c in count]
    sizes[-1] -= units * image.granule - image.patches
    return sizes


def _split(image: Image, loads: np.ndarray, work: float, cost: VisionCost) -> tuple[float, list[int]]:
    """The image split over a block of ranks with these loads: (the block's highest load after,
    patches per member). Each member's load grows by gather n, then by (per patch - gather) a row
    it holds; the rows are shared so that the loads rise to the water level, in whole granules."""
    gathered = cost.gather * image.patches * (len(loads) - 1)
    level = float(_water_levels(loads[None, :], work + gathered)[0])
    members = loads + cost.gather * image.patches
    shares = _shares(image, members, level, cost.of(1, image.patches) - cost.gather)
    return max(load + cost.piece(s, image.patches, True) for load, s in zip(loads, shares)), shares


def plan_vision_cp(images, ranks: int, cost: VisionCost = MOONVIT_COST, slack: float = 0.02,
                   rows_per_cut: int = 2) -> VisionCPPlan:
    """The context-parallel plan of a batch's images over `ranks` ranks (module docstring)."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ArgumentError(f"ranks: expected a positive integer, got {ranks!r}")
    if isinstance(rows_per_cut, bool) or not isinstance(rows_per_cut, int) or rows_per_cut < 1:
        raise ArgumentError(f"rows_per_cut: expected a positive integer, got {rows_per_cut!r}")
    if not isinstance(slack, (int, float)) or isinstance(slack, bool) or not 0 <= slack < 1:
        raise ArgumentError(f"slack: expected a number in [0, 1), got {slack!r}")
    if not isinstance(cost, VisionCost) or not 0 <= cost.gather < cost.linear:
        raise ArgumentError(f"cost: expected a VisionCost with 0 <= gather < linear, got {cost!r}")
    if isinstance(images, (str, bytes)) or not hasattr(images, "__iter__"):
        raise ArgumentError(f"images: expected a sequence of images, got {type(images).__name__}")
    images = tuple(as_image(item, rows_per_cut) for item in images)
    if not images:
        raise ArgumentError("images: expected at least one image, got none")
    costs = [cost.of(image.patches, image.patches) for image in images]
    total = sum(costs)
    bound = max(total / ranks, max(cost.of(min(i.granule, i.patches), i.patches) for i in images))
    # the target: the bound's average with the traffic of the splits so far (none without a gather cost)
    traffic, target = 0.0, bound * (1 + slack)
    sizes = sorted({size for _, size in subgroup_layout(ranks) if size > 1})
    loads = np.zeros(ranks)
    groups: list[tuple[int, int] | None] = [None] * len(images)
    pieces: list[tuple[Piece, ...] | None] = [None] * len(images)
    for index in sorted(range(len(images)), key=lambda i: -costs[i]):
        image, work = images[index], costs[index]
        rank = int(np.argmin(loads))
        units = math.ceil(image.patches / image.granule)
        if loads[rank] + work <= target or units == 1 or ranks == 1:
            groups[index], pieces[index] = (rank, 1), (Piece(index, rank, 0, image.patches),)
            loads[rank] += work
            continue
        # per block: the makespan it promises at least, max(its busiest member, the average with its
        # traffic: n (size - 1) rows gathered over the block); the smallest block within the target
        # (which that traffic raises), else the one promising least
        best = None  # (promise, first, size, shares)
        for size in sizes:
            if size > units:
                break
            count = ranks // size  # the aligned blocks of this size: loads[:count size] in rows
            first = size * int(np.argmin(_water_levels(loads[:count * size].reshape(count, size), work)))
            peak, shares = _split(image, loads[first:first + size], work, cost)
            average = (total + traffic + cost.gather * image.patches * (size - 1)) / ranks
            promise = max(peak, average)
            if best is None or promise < best[0]:
                best = (promise, first, size, shares)
            if peak <= max(target, average * (1 + slack)):
                break
        _, first, size, shares = best
        traffic += cost.gather * image.patches * (size - 1)
        target = max(target, (total + traffic) / ranks * (1 + slack))
        starts = np.concatenate([[0], np.cumsum(shares)]).astype(int)
        groups[index] = (first, size)
        pieces[index] = tuple(Piece(index, first + j, int(starts[j]), int(starts[j + 1])) for j in range(size))
        loads[first:first + size] += [cost.piece(s, image.patches, True) for s in shares]
    plan = VisionCPPlan(ranks, images, cost, float(slack), tuple(groups), tuple(pieces))
    plan.verify()
    return plan
