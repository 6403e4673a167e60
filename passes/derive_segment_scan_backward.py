"""derive-segment-scan-backward: the backward of context parallelism, `chunk_backward_segments`.

The forward (lower-segment-scan's chunk_segments) runs the segments of a sequence in parallel:
every segment's summary (M, N), S -> M S + N, a scan of the combine for each segment's entering
state, the finish. Its derivative, segment by segment, is chunk_backward on the segment from its
entering state, with dht the cotangent of the state it leaves. That cotangent is the next
segment's entering cotangent, which is linear in its own leaving cotangent:

    dS_enter = M^T dS_leave + N_bar,   N_bar = the entering cotangent from the segment's own do alone

So the cotangents come from the same combine, transposed and run backwards: the adjoint of the
forward's `k3s.summary_combine` (`adjoint = true`, the same transition form; M^T held in M's
form). This pass derives it from the forward's combine and builds the entry from kernels the
module already has:

- chunk_backward's prepare (lower-backward): every workspace the scans read;
- chunk_segments' summary scans on that prepare's workspaces (the same names): M and N;
- the cotangent summary: chunk_backward's cotangent scan from a zero cotangent (dht, which the
  adjoint combine makes after it: absent), storing the cotangent of each segment's entering state
  (N_bar) and spilling nothing;
- the forward combine (entering states, as chunk_segments'), then its adjoint (each segment's
  leaving cotangent, from the final-state cotangents): host steps, their scan order the caller's
  (a suffix per sequence on one device; across ranks one all-gather);
- chunk_backward's state scan, cotangent scan and gradients kernel, from those.

merge-identical-kernels later finds all the same code as the kernels they were cloned from, the
cotangent summary once guard-spill-only-stages has guarded what it and the cotangent scan write
apart. Runs after lower-backward and lower-segment-scan, before outline-kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import argument_values, layer_entry, make, rebind, tensor_arg
from k3compile.passes.lower_segment_scan import summary_outputs, with_props

NAME = "derive-segment-scan-backward"


def adjoint_combine(combine: k3s.SummaryCombineOp, M, N_bar, leaving) -> k3s.SummaryCombineOp:
    """The forward combine's adjoint: the same op and transition form, transposed and in the
    reverse direction (`adjoint = true`), on the cotangents: (M, N_bar) -> the leaving cotangents."""
    return make(k3s.SummaryCombineOp, operands=[M, N_bar, leaving], transition=combine.transition, adjoint=True)


def backward_kernels(entry: k3s.EntryOp) -> tuple[k3s.KernelOp, k3s.KernelOp, k3s.KernelOp, list[k3s.KernelOp]]:
    """chunk_backward's (prepare, state scan, cotangent scan, gradients kernels: one, two where
    lower-backward split guarded forms, twice that where it cut the kernel after its value-block
    loop), as lower-backward builds them."""
    kernels = [op for op in entry.body.ops if isinstance(op, k3s.KernelOp)]
    scans = [k for k in kernels if any(isinstance(op, k3s.ChunkLoopOp) for op in k.body.ops)]
    reverse = [k for k in scans if any(op.reverse is not None and op.reverse.value.data
                                       for op in k.body.ops if isinstance(op, k3s.ChunkLoopOp))]
    if len(kernels) < 4 or len(scans) != 2 or len(reverse) != 1 or kernels[0] in scans or kernels[-1] in scans:
        raise ValueError(f"{NAME}: @{entry.sym_name.data} of {entry.source} has kernels "
                         f"{[k.sym_name.data for k in kernels]}; expected lower-backward's prepare, state scan, "
                         f"cotangent scan and gradients kernels (run it after lower-backward, before outline-kernels)")
    state_scan = next(k for k in scans if k not in reverse)
    return kernels[0], state_scan, reverse[0], kernels[3:]


def summary_kernels(entry: k3s.EntryOp) -> list[k3s.KernelOp]:
    """chunk_segments' summary scans: the kernels whose state starts at zero or the identity."""
    return [op for op in entry.body.ops if isinstance(op, k3s.KernelOp)
            and any(isinstance(s, k3s.StateTileOp) and s.start is not None for s in op.body.ops)]


def renamed(kernel: k3s.KernelOp, name: str) -> k3s.KernelOp:
    copy = kernel.clone()
    copy.properties["sym_name"] = StringAttr(name)
    return copy


def cotangent_summary(scan: k3s.KernelOp, N_bar, name: str) -> k3s.KernelOp:
    """The cotangent scan from a zero cotangent, storing the cotangent of each segment's entering
    state to N_bar and spilling nothing (the real cotangent scan spills, after the combine). Its
    state tile reads dht, as the cotangent scan's does: the entry's dht is combined, made by the
    adjoint combine after this kernel, so it is absent here and the scan starts from zero (and
    the kernel is the cotangent scan but for what it writes: guard-spill-only-stages lets it run
    the cotangent scan's code)."""
    kernel = renamed(scan, name)
    for spill in [op for op in kernel.walk() if isinstance(op, k3s.SpillOp)]:
        spill.detach()
        spill.erase()
    stores = [op for op in kernel.body.ops if isinstance(op, k3s.StoreStateOp)]
    if len(stores) != 1:
        raise ValueError(f"{NAME}: the cotangent scan @{scan.sym_name.data} stores {len(stores)} states; expected "
                         "one (dh0)")
    stores[0].operands = [stores[0].state, N_bar]
    return kernel


def backward_segments_entry(layer: RecurrenceOp, backward: k3s.EntryOp, segments: k3s.EntryOp) -> k3s.EntryOp:
    """chunk_backward_segments(q, k, v, g, beta, ..., cu_seqlens, do, output_dh0, entering_states,
    leaving_cotangents) -> chunk_backward's gradients: the segments are the sequences of cu_seqlens,
    their entering states and leaving cotangents made by the two host steps."""
    source = layer.sym_name.data
    prefix = f"{source}_backward_segments"
    combine = next(op for op in segments.body.ops if isinstance(op, k3s.SummaryCombineOp))
    form = combine.transition.data
    made = {"initial_state", "dht"}  # by the combine and its adjoint, not passed in
    arguments = [with_props(op, role="combined") if op.sym_name.data in made else op.clone()
                 for op in backward.body.ops if isinstance(op, (k3s.TensorArgOp, k3s.ScalarArgOp))]
    summaries = summary_outputs(layer, form, role="workspace")
    N = summaries[-1]
    N_bar = tensor_arg("N_bar", N.results[0].type, "workspace")
    values = argument_values([*arguments, *summaries, N_bar])
    prepare, state_scan, cotangent_scan, gradients = backward_kernels(backward)
    summary_scans = summary_kernels(segments)
    read = {k3s.argument_name(v) for kernel in summary_scans for op in kernel.walk() for v in op.operands} - {None}
    if missing := sorted(read - set(values)):  # the derivations disagree: no prepare here spills them
        raise ValueError(f"{NAME}: the summary scans of @{segments.sym_name.data} read {missing}, which "
                         f"@{backward.sym_name.data}'s prepare does not spill")
    kernels_before = [
        renamed(prepare, f"{prefix}_prepare"),
        *(renamed(k, k.sym_name.data.replace(f"{source}_segments_", f"{prefix}_")) for k in summary_scans),
        cotangent_summary(cotangent_scan, values["N_bar"], f"{prefix}_cotangent_summary"),
    ]
    steps: list[Operation] = [
        combine.clone(),  # the entering states, as the forward's
        adjoint_combine(combine, values.get("M"), values["N_bar"], values["dht"]),  # the leaving cotangents
    ]
    kernels_after = [renamed(k, k.sym_name.data.replace(f"{source}_backward_", f"{prefix}_"))
                     for k in (state_scan, cotangent_scan, *gradients)]
    lowered = make(
        k3s.EntryOp,
        [*arguments, *summaries, N_bar, *kernels_before, *steps, *kernels_after],
        sym_name=backward.sym_name.data.replace("chunk_backward", "chunk_backward_segments"),
        source=SymbolRefAttr(layer.sym_name),
    )
    rebind(lowered.body, argument_values(list(lowered.body.ops)))
    return lowered


@dataclass(frozen=True)
class DeriveSegmentScanBackwardPass(ModulePass):
    """Add a `chunk_backward_segments` entry after the `chunk_backward` entry of every recurrence
    that also has a `chunk_segments` entry."""

    name = NAME

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for layer in [o for o in op.ops if isinstance(o, RecurrenceOp)]:
            backward, segments = (layer_entry(op, layer, n) for n in ("chunk_backward", "chunk_segments"))
            if backward is None or segments is None:
                continue
            if any(isinstance(o, k3s.LaunchOp) for e in (backward, segments) for o in e.body.ops):
                raise ValueError(f"{NAME}: the kernels of @{layer.sym_name.data}'s entries are outlined already; "
                                 "run it before outline-kernels")
            if layer_entry(op, layer, "chunk_backward_segments") is None:
                Rewriter.insert_op(backward_segments_entry(layer, backward, segments), InsertPoint.after(backward))
