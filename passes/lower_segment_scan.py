"""lower-segment-scan: a segment-scan schedule -> two entries, `segment_summary` and `chunk_segments`.

The summary (M, N) of every segment runs the chunked schedule's state pass only (the schedule
without its output, and so, by the values, without the query Gram and the decayed queries that
only the output reads), grouped as fuse-chunkwise groups the chunk entry:
- a token-parallel prepare kernel for the chunk-local stages the state depends on;
- a scan from a zero state that stores each segment's N (segments are the sequences of
  cu_seqlens); with a diagonal or scalar transition it also multiplies up the chunk decays into M;
- with a full transition, a second scan over K more state columns that start at the identity
  with a zero value input (Vr = -W S): their final state is M.
`segment_summary` is that alone. `chunk_segments` is the whole schedule with one prepare: the
chunk entry's prepare kernel over every segment, the summary scans reading its workspaces (the
state pass spills a subset of what the full prepare spills, under the same names), the combine
as a host step whose scan order the caller gives (a prefix per sequence on one device, an
all-gather across ranks), and the chunk entry's scan finishing every segment from its entering
state.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import region_dce

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    argument_values,
    check_num_warps,
    check_power_of_two,
    make,
    rebind,
    recurrence_arguments,
    tensor_arg,
)
from k3compile.passes.derive_chunkwise import checkpoint_argument
from k3compile.passes.fuse_chunkwise import split_kernels

SUMMARY_INPUTS = ("k", "v", "g", "beta", "cu_seqlens", "A_log", "dt_bias")


def with_props(op: Operation, **changes) -> Operation:
    """A copy of a stage (or an argument) with some properties set: the same operands, results
    of the same names and types."""
    kept = {name: attr for name, attr in op.properties.items() if name not in changes}
    return make(type(op), operands=op.operands, results=[(r.name_hint, r.type) for r in op.results], **kept,
                **changes)


def starting_at(tile: k3s.StateTileOp, start: str, **changes) -> k3s.StateTileOp:
    """A copy of a state tile that starts at `start` (zero, identity), reading no tensor."""
    copy = with_props(tile, start=start, **changes)
    copy.operands = []
    return copy


def state_pass_schedule(chunked: k3s.ChunkedOp) -> k3s.ChunkedOp:
    """The chunked schedule cut down to what the carried state depends on: without its output,
    whatever only the output read is dead."""
    state_pass = chunked.clone()
    for output in [op for op in state_pass.walk() if isinstance(op, k3s.ChunkOutputOp)]:
        output.detach()
        output.erase()
    region_dce(state_pass.body)
    return state_pass


def multiplying_decays(loop: k3s.ChunkLoopOp, form: str) -> tuple[k3s.DecayProductStartOp, k3s.ChunkLoopOp]:
    """The chunk loop (of the N scan) carrying, after its state, the product M of its chunks'
    decays (gamma_C, which its state advance reads), from 1: (M's start, the new loop, which
    takes the old one's body; the old one is erased)."""
    block = loop.body.block
    decay = next(op for op in block.ops if isinstance(op, k3s.StateAdvanceOp)).decay
    start = make(k3s.DecayProductStartOp, transition=form, result=("M", decay.type))
    carried = block.insert_arg(decay.type, len(block.args))
    carried.name_hint = "M"
    product = make(k3s.DecayProductOp, operands=[carried, decay], transition=form, result=("M", decay.type))
    Rewriter.insert_op(product, InsertPoint.before(block.last_op))
    block.last_op.operands = [*block.last_op.operands, product.multiplied]
    loop.body.detach_block(block)
    reverse = loop.reverse is not None and bool(loop.reverse.value.data)
    carrying = k3s.ChunkLoopOp([*loop.initial, start.product], loop.offsets, block,
                               chunk_size=loop.chunk_size.value.data, reverse=reverse)
    loop.erase()
    return start, carrying


def summary_scans(layer: RecurrenceOp, scan: k3s.KernelOp, form: str,
                  values: dict[str, SSAValue]) -> list[k3s.KernelOp]:
    """From the state pass's scan kernel: the N scan (zero start, N stored; a diagonal/scalar M
    multiplied up alongside) and, for a full M, the scan of the identity columns, storing to the
    N and M of `values` (their entry's)."""
    K = layer.head_k_dim.value.data
    tile, loop, _ = list(scan.body.ops)

    def summary_loop(start: k3s.StateTileOp) -> k3s.ChunkLoopOp:
        """The chunk loop from the state tile `start`, keeping no checkpoints."""
        copy = loop.clone()
        copy.operands[0] = start.state
        for store in [op for op in copy.walk() if isinstance(op, k3s.StoreCheckpointOp)]:
            store.detach()
            store.erase()
        return copy

    def kernel(suffix: str, starts, chunk_loop, stores):
        return make(
            k3s.KernelOp,
            [*starts, chunk_loop, *stores],
            sym_name=f"{scan.sym_name.data}_{suffix}",
            grid=scan.grid,
            num_warps=scan.num_warps.value.data,
            num_stages=scan.num_stages.value.data,
        )

    layout = layer.state_layout.data
    n_tile = starting_at(tile, "zero")
    n_loop = summary_loop(n_tile)
    if form in ("diagonal", "scalar"):  # M, the product of the decays, carried alongside N
        m_start, n_loop = multiplying_decays(n_loop, form)
        N, M = n_loop.final
        kernels = [kernel("N", [n_tile, m_start], n_loop, [
            make(k3s.StoreStateOp, operands=[N, values["N"]], layout=layout),
            make(k3s.StoreTransitionOp, operands=[M, values["M"]], transition=form)])]
    else:
        (N,) = n_loop.final
        kernels = [kernel("N", [n_tile], n_loop, [make(k3s.StoreStateOp, operands=[N, values["N"]], layout=layout)])]
    if form == "full":
        m_tile = starting_at(tile, "identity", head_v_dim=K, layout="kv")
        m_loop = summary_loop(m_tile)
        for residual in [op for op in m_loop.walk() if isinstance(op, k3s.DeltaResidualOp)]:  # zero values: U = 0
            without_values = make(k3s.DeltaResidualOp, operands=[residual.state, residual.keys_factor],
                                  result=(residual.residual.name_hint, residual.residual.type))
            Rewriter.replace_op(residual, without_values)
        region_dce(m_loop.body)
        (M,) = m_loop.final
        kernels.append(kernel("M", [m_tile], m_loop, [make(k3s.StoreStateOp, operands=[M, values["M"]], layout="kv")]))
    return kernels


def summary_outputs(layer: RecurrenceOp, form: str, role: str = "output") -> list[Operation]:
    HV, K, V = (layer.num_v_heads.value.data, layer.head_k_dim.value.data, layer.head_v_dim.value.data)
    n_shape = ("N", HV, K, V) if layer.state_layout.data == "kv" else ("N", HV, V, K)
    m_shape = {"full": ("N", HV, K, K), "diagonal": ("N", HV, K), "scalar": ("N", HV)}.get(form)

    def output(sym_name: str, shape: tuple[str | int, ...]) -> Operation:
        return tensor_arg(sym_name, k3s.tensor(*shape, dtype="float32"), role)

    return [*([output("M", m_shape)] if m_shape else []), output("N", n_shape)]


def summary_entry(layer: RecurrenceOp, entry: k3s.EntryOp, chunked: k3s.ChunkedOp, form: str, block_v: int,
                  num_warps: int) -> k3s.EntryOp:
    """segment_summary(k, v, g, beta, cu_seqlens) -> (M, N): the summaries alone."""
    arguments = [a for a in recurrence_arguments(layer) if a.sym_name.data in SUMMARY_INPUTS]
    outputs = summary_outputs(layer, form)
    values = argument_values([*arguments, *outputs])
    # a segment is a sequence of cu_seqlens: its summary is the state its sequence leaves
    workspaces, (prepare, scan_kernel) = split_kernels(
        layer, entry, state_pass_schedule(chunked), values, block_v, num_warps, scan_stages=2,
        kernel_prefix=f"{entry.source.string_value()}_summary")
    return make(
        k3s.EntryOp,
        [*arguments, *outputs, *workspaces, prepare, *summary_scans(layer, scan_kernel, form, values)],
        # derive-segment-scan named it segment_scan (layer-prefixed in a module of several)
        sym_name=entry.sym_name.data.replace("segment_scan", "segment_summary"),
        source=entry.source,
    )


def segments_entry(layer: RecurrenceOp, entry: k3s.EntryOp, chunked: k3s.ChunkedOp, combine: k3s.SummaryCombineOp,
                   form: str, block_v: int, num_warps: int, scan_stages: int) -> k3s.EntryOp:
    """chunk_segments(q, k, v, g, beta, ..., cu_seqlens, entering_states) -> (o, final_state): the
    chunk entry over segments (the sequences of cu_seqlens), whose initial states the combine
    makes from the summaries after the one prepare."""
    prefix = f"{entry.source.string_value()}_segments"
    arguments = [tensor_arg(a.sym_name.data, a.type, "combined") if a.sym_name.data == "initial_state" else a
                 for a in recurrence_arguments(layer)]
    summaries = summary_outputs(layer, form, role="workspace")
    values = argument_values([*arguments, *summaries])
    read, (_, state_scan) = split_kernels(layer, entry, state_pass_schedule(chunked), values, block_v, num_warps,
                                          scan_stages, kernel_prefix=f"{prefix}_summary")
    workspaces, (prepare, finish) = split_kernels(layer, entry, chunked, values, block_v, num_warps, scan_stages,
                                                  kernel_prefix=prefix)
    missing = {w.sym_name.data for w in read} - {w.sym_name.data for w in workspaces}
    if missing:  # the derivations disagree: the summary scans would read what no prepare wrote
        raise ValueError(f"lower-segment-scan: the state pass reads {sorted(missing)}, which the prepare of "
                         f"{entry.source}'s chunked schedule does not spill")
    # the host step: M (but the identity's), N -> the entering states
    combined = make(k3s.SummaryCombineOp, operands=[values.get("M"), values["N"], values["initial_state"]],
                    transition=combine.transition.data)
    lowered = make(
        k3s.EntryOp,
        [*arguments, checkpoint_argument(layer, chunked.chunk_size.value.data), *workspaces, *summaries,
         prepare, *summary_scans(layer, state_scan, form, values), combined, finish],
        sym_name=entry.sym_name.data.replace("segment_scan", "chunk_segments"),
        source=entry.source,
    )
    # the summary scans reload what the one prepare spilled: its workspaces, by name
    rebind(lowered.body, argument_values(list(lowered.body.ops)))
    return lowered


@dataclass(frozen=True)
class LowerSegmentScanPass(ModulePass):
    """Replace every `segment_scan` entry by its `segment_summary` and `chunk_segments` entries."""

    name = "lower-segment-scan"
    block_v: int = 64
    num_warps: int = 4
    scan_stages: int = 2

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_power_of_two(self.name, "block-v", self.block_v)
        check_num_warps(self.name, self.num_warps)
        for scan in [o for o in op.walk() if isinstance(o, k3s.SegmentScanOp)]:
            entry = scan.parent_op()
            layer = entry.layer()
            summary, combine, chunked = scan.body.ops
            form = summary.transition.data
            lowered = [
                summary_entry(layer, entry, chunked, form, self.block_v, self.num_warps),
                segments_entry(layer, entry, chunked, combine, form, self.block_v, self.num_warps, self.scan_stages),
            ]
            Rewriter.insert_op(lowered, InsertPoint.before(entry))
            entry.detach()
            entry.erase()
