"""Differential verification of the AttnRes layer (`k3c verify` on an attnres spec): the
aggregate against reference.attnres, its fused backward's gradients against float64 autograd of
it, Block AttnRes's two phases (block_partials, then block_merge of each query's partials with
the partial sum) against reference.attnres_block_partials and the one-pass reference, and the two
phases' backward (block_partials_backward, block_merge_backward): every gradient against float64
autograd of the two-phase reference semantics on the same inputs (the stored partials, as the
kernels got them).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from k3compile.checking.verify_backward import GRADIENT_FP32_TOLERANCE
from k3compile.checking.verify_common import not_power_of_two, tolerance, variant
from k3compile.ir import reference
from k3compile.spec import LayerSpec


@dataclass(frozen=True)
class AttnResCase:
    name: str
    sources: int
    batch: int
    length: int


TWO_PHASE_ENTRIES = ("block_merge", "block_partials_backward", "block_merge_backward")


def quick_attnres_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[AttnResCase]]]:
    """`k3c verify --quick`: the most sources (all blocks + the partial one), an odd row count."""
    most = spec.params["num_blocks"] + 1
    yield spec, "aggregate", [AttnResCase(f"S={most} (all blocks + partial), B3 T5", most, 3, 5)]
    yield spec, "aggregate_backward", [AttnResCase(f"S={most} (all blocks + partial), B3 T5", most, 3, 5)]
    if most > 1:
        for entry in TWO_PHASE_ENTRIES:
            yield spec, entry, [AttnResCase(f"two phases: {most - 1} blocks + partial, Q={BLOCK_QUERIES}, B3 T5",
                                            most, 3, 5)]


def attnres_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[AttnResCase]]]:
    most = spec.params["num_blocks"] + 1
    length = 1023 if on_gpu else 5
    # on a GPU also 4092 rows: from 2048 (fuse-attnres's grouped-from-rows) the entry launches
    # its kernel over groups of rows, below its kernel of a program per row
    many_rows = [AttnResCase(f"S={most}, B4 T{length} (groups of rows)", most, 4, length)] if on_gpu else []
    yield spec, "aggregate", [
        AttnResCase(f"S={most} (all blocks + partial), B2 T{length}", most, 2, length),
        *many_rows,
        AttnResCase("S=1 (first block)", 1, 1, 3),
        AttnResCase(f"S={max(1, most // 2)}, B3 T7", max(1, most // 2), 3, 7),
    ]
    yield spec, "aggregate_backward", [  # the fused backward: d sources, d query, d gain
        AttnResCase(f"S={most} (all blocks + partial), B2 T{length}", most, 2, length),
        AttnResCase("S=1 (first block)", 1, 1, 3),
    ]
    D = not_power_of_two(spec.params["hidden_size"])
    npow2 = variant(spec, "npow2", hidden_size=D)
    yield npow2, "aggregate", [AttnResCase(f"D={D} (not a power of two), S={most}", most, 2, 3)]
    yield npow2, "aggregate_backward", [AttnResCase(f"D={D} (not a power of two), S={most}", most, 2, 3)]
    if most > 1:  # Block AttnRes's two phases: the completed blocks, then the partial sum
        for entry in TWO_PHASE_ENTRIES:
            yield spec, entry, [
                AttnResCase(f"two phases: {most - 1} blocks + partial, Q={BLOCK_QUERIES}, B2 T{length}", most, 2,
                            length),
                AttnResCase(f"two phases: 1 block + partial, Q={BLOCK_QUERIES}, B1 T3", 2, 1, 3),
            ]
        for entry in TWO_PHASE_ENTRIES[1:]:  # the backward at the non-power-of-two width too
            yield npow2, entry, [AttnResCase(f"D={D} (not a power of two), two phases: {most - 1} blocks + partial, "
                                             f"Q={BLOCK_QUERIES}", most, 2, 3)]


BLOCK_QUERIES = 3  # the pseudo-queries of a block in a two-phase case: more than a program's block of them


def run_attnres_case(layer, entry: str, layer_op, case, dtype, device, gen):
    """aggregate: the one pass over the case's sources against reference.attnres.
    aggregate_backward: the gradients of <dout, out> (dout random) for sources, query and gain,
    from the fused backward fed by aggregate's out and log-sum-exp, against float64 autograd of
    reference.attnres. The two-phase entries take all sources but the last as the completed
    blocks and the last as the partial sum, with BLOCK_QUERIES queries; block_merge: block_partials
    then block_merge of each query's partials with the partial sum, the partials against
    reference.attnres_block_partials, each query's h against the one-pass reference.attnres over
    all the sources; the backward entries: two_phase_gradient_rows."""
    D = layer_op.hidden_size.value.data
    queries = BLOCK_QUERIES if entry in TWO_PHASE_ENTRIES else 1

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    # sources of different scales, as block sums grow with depth; non-zero queries so the
    # softmax is not uniform
    scales = torch.linspace(0.5, 4.0, case.sources, dtype=torch.float64)[:, None, None, None]
    sources = (randn(case.sources, case.batch, case.length, D) * scales).to(device, dtype)
    query = (randn(queries, D) * 2 / math.sqrt(D)).to(device, dtype)
    gain = (1 + 0.1 * randn(queries, D)).to(device, dtype)
    if entry == "aggregate":
        out = layer.aggregate(sources, query[0], gain[0])[0]
        return [("out", out, reference.attnres(layer_op, sources, query[0], gain[0]))]
    if entry == "aggregate_backward":
        out, lse = layer.aggregate(sources, query[0], gain[0], output_lse=True)
        dout = randn(case.batch, case.length, D).to(device, dtype)
        got = layer.aggregate_backward(sources, query[0], gain[0], out, lse, dout)
        leaves = [x.detach().double().requires_grad_() for x in (sources, query[0], gain[0])]
        reference.attnres(layer_op, *leaves).backward(dout.double().cpu())
        return [(name, grad, leaf.grad) for name, grad, leaf in zip(("dsources", "dquery", "dgain"), got, leaves,
                                                                     strict=True)]
    completed, partial_sum = sources[:-1], sources[-1]
    partials = layer.block_partials(completed, query, gain)
    if entry != "block_merge":
        return two_phase_gradient_rows(layer, entry, layer_op, completed, partial_sum, query, gain, partials, randn)
    want = reference.attnres_block_partials(layer_op, completed, query, gain)
    # the module's form of the partials: the merge's arguments after partial_sum, query and gain
    names = [name for name in list(inspect.signature(layer.block_merge).parameters)[3:] if name != "output_lse"]
    if names == ["block_lse", "block_mix"]:
        want = reference.attnres_normalised_partials(*want)
    rows = [(name, got, ref) for name, got, ref in zip(names, partials, want, strict=True)]
    merged = torch.stack([layer.block_merge(partial_sum[None], query[j], gain[j], *(x[j] for x in partials))[0]
                          for j in range(queries)])
    one_pass = torch.stack([reference.attnres(layer_op, sources, query[j], gain[j]) for j in range(queries)])
    return [*rows, ("out", merged, one_pass)]


def two_phase_gradient_rows(layer, entry: str, layer_op, completed, partial_sum, query, gain, partials, randn):
    """block_partials_backward: with random cotangents of the stored partials (d block_lse,
    d block_mix), d representatives, d queries and d gains against float64 autograd of
    reference.attnres_normalised_partials(reference.attnres_block_partials(...)).
    block_merge_backward: per query its merge (output and log-sum-exp saved) and a random d h;
    d partial_sum, d query, d gain, d block_lse and d block_mix (the queries' stacked) against
    float64 autograd of reference.attnres_block_merge over the stored partials (lse, 1, mix)."""
    block_lse, block_mix = partials
    device, dtype = block_mix.device, block_mix.dtype
    if entry == "block_partials_backward":
        dlse, dmix = randn(*block_lse.shape).to(device, torch.float32), randn(*block_mix.shape).to(device, dtype)
        got = layer.block_partials_backward(completed, query, gain, block_lse, block_mix, dlse, dmix)
        leaves = [x.detach().double().requires_grad_() for x in (completed, query, gain)]
        lse, mix = reference.attnres_normalised_partials(*reference.attnres_block_partials(layer_op, *leaves))
        ((lse * dlse.double().cpu()).sum() + (mix * dmix.double().cpu()).sum()).backward()
        return [(name, grad, leaf.grad) for name, grad, leaf in
                zip(("drepresentatives", "dqueries", "dgains"), got, leaves, strict=True)]
    names = ("dpartial_sum", "dquery", "dgain", "dblock_lse", "dblock_mix")
    got, want = {name: [] for name in names}, {name: [] for name in names}
    for j in range(query.shape[0]):
        inputs = (partial_sum, query[j], gain[j], block_lse[j], block_mix[j])
        out, lse = layer.block_merge(partial_sum[None], *inputs[1:], output_lse=True)
        dout = randn(*out.shape).to(device, dtype)
        grads = layer.block_merge_backward(partial_sum[None], *inputs[1:], out, lse, dout)
        leaves = [x.detach().double().requires_grad_() for x in inputs]
        x, w, g, partials_lse, mix = leaves
        h = reference.attnres_block_merge(layer_op, partials_lse, torch.ones_like(partials_lse), mix, x, w, g)
        (h * dout.double().cpu()).sum().backward()
        for name, grad, leaf in zip(names, (grads[0][0], *grads[1:]), leaves, strict=True):
            got[name].append(grad)
            want[name].append(leaf.grad)
    return [(name, torch.stack(got[name]), torch.stack(want[name])) for name in names]


# AttnRes gradients in half precision, by fla's per-gradient tolerances for the like: a row's
# cotangent (d sources, d representatives, d partial_sum, d block_mix) per element as dv; d query
# and d gain, sums over every row and source, as dg; d block_lse, a softmax's score cotangent, as dg
ATTNRES_GRADIENT_HALF_TOLERANCE = {"dsources": 8e-3, "dquery": 2e-2, "dgain": 2e-2, "drepresentatives": 8e-3,
                                   "dqueries": 2e-2, "dgains": 2e-2, "dpartial_sum": 8e-3, "dblock_lse": 2e-2,
                                   "dblock_mix": 8e-3}


def attnres_tolerance(entry: str, tensor: str, dtype) -> float:
    if not entry.endswith("_backward"):
        return tolerance(entry, dtype)
    return GRADIENT_FP32_TOLERANCE if dtype == torch.float32 else ATTNRES_GRADIENT_HALF_TOLERANCE[tensor]
