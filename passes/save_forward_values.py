"""save-forward-values: a training forward that keeps what the backward would recompute.

The backward's first kernel (lower-backward's prepare) recomputes the forward's chunk-local
stages and spills them: the decayed keys and queries, the WY factors, the query Gram, the chunk
decays. The forward's prepare has already written each of those values into a workspace of the
same name, type and chunk size (both schedules are derived from one recurrence; `k3c prove`
checks the values equal in exact arithmetic, prove_saved_forward_values). Where that holds, this
pass adds two entries:

- `chunk_saving`: the forward `chunk` with those workspaces as outputs, returned after `o` and
  the final state (what a training forward keeps for its backward);
- `chunk_backward_saved`: `chunk_backward` taking them as inputs, without its prepare kernel.

Nothing new is computed: the two entries run the kernels of `chunk` and `chunk_backward`
(merge-identical-kernels gives them one code). What it trades is memory for time: the saved
tensors live from the forward to the backward (about four times q's bytes at K = V = 128, chunks
of 16), and the backward skips a kernel (`k3c cost`: 1.1 GB of its 9.0 GB of traffic at B4 T4096
H32). k3compile.ops runs it for fla's `disable_recompute=True` (fla's switch for the same trade).
Where the prepares differ (derive-backward at another chunk size than derive-chunkwise) the pass
adds nothing, and the callers recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.copied_entries import SAVED_BACKWARD_ENTRY, SAVING_ENTRY, copied_kernel_name
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import layer_entry


def first_kernel(entry: k3s.EntryOp) -> k3s.KernelOp | None:
    return next((op for op in entry.body.ops if isinstance(op, k3s.KernelOp)), None)


def tensor_args(entry: k3s.EntryOp) -> dict[str, k3s.TensorArgOp]:
    return {op.sym_name.data: op for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)}


def spilled_workspaces(kernel: k3s.KernelOp) -> list[SSAValue]:
    """The workspaces the kernel writes, in the order it first writes them."""
    return list(dict.fromkeys(op.operands[0] for op in kernel.walk() if isinstance(op, k3s.SpillOp)))


def chunk_size(kernel: k3s.KernelOp) -> int | None:
    tile = next((op for op in kernel.body.ops if isinstance(op, k3s.ChunkTileOp)), None)
    return None if tile is None else tile.chunk_size.value.data


def saved_values(forward: k3s.EntryOp, backward: k3s.EntryOp) -> list[str] | None:
    """The workspaces the backward's prepare writes, if the forward's prepare writes each of them
    too, at the same chunk size and with the same type, and no later kernel of the backward
    writes them; else None. That both write the same values is `k3c prove`'s to show
    (prove_saved_forward_values, in exact arithmetic): the two schedules are derived from one
    recurrence, but the backward's forms its stages for their adjoints (the inverse of the
    unscaled Gram, then scaled, where the forward substitutes)."""
    ours, theirs = first_kernel(forward), first_kernel(backward)
    if ours is None or theirs is None or chunk_size(ours) is None or chunk_size(ours) != chunk_size(theirs):
        return None
    written_here = {k3s.argument_name(v): v.type for v in spilled_workspaces(ours)}
    wanted = {k3s.argument_name(v): v.type for v in spilled_workspaces(theirs)}
    later = [kernel for kernel in backward.body.ops if isinstance(kernel, k3s.KernelOp) and kernel is not theirs]
    rewritten = {k3s.argument_name(v) for kernel in later for v in spilled_workspaces(kernel)}
    if not wanted or any(written_here.get(name) != type_ or name in rewritten for name, type_ in wanted.items()):
        return None
    return list(wanted)


def with_roles(entry: k3s.EntryOp, name: str, roles: dict[str, k3s.ArgRole]) -> k3s.EntryOp:
    """A copy of entry named `name`, its arguments of `roles` given those roles, its kernels
    named as a copy names them (copied_kernel_name: module symbols are unique; merge-identical-
    kernels later gives each the code of the kernel it copies). A per-chunk output (NC slots: one
    spare a sequence that no chunk writes) is zero-filled, so that what the entry returns is
    defined everywhere."""
    copy = entry.clone()
    copy.properties["sym_name"] = StringAttr(name)
    for arg_name, arg in tensor_args(copy).items():
        if roles.get(arg_name) == k3s.ArgRole.OUTPUT and "NC" in arg.type.dims:
            arg.properties["fill"] = IntegerAttr(0, i64)
    for kernel in copy.body.ops:
        if isinstance(kernel, k3s.KernelOp):
            kernel.properties["sym_name"] = StringAttr(copied_kernel_name(kernel.sym_name.data, name))
    for arg_name, arg in tensor_args(copy).items():
        if arg_name in roles:
            arg.properties["role"] = k3s.ArgRoleAttr(roles[arg_name])
    return copy


@dataclass(frozen=True)
class SaveForwardValuesPass(ModulePass):
    """Add chunk_saving and chunk_backward_saved after the chunk_backward entry of every
    recurrence whose backward prepare writes only what its forward's prepare writes (module
    docstring). Runs before outline-kernels."""

    name = "save-forward-values"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for layer in [o for o in op.ops if isinstance(o, RecurrenceOp)]:
            forward, backward = (layer_entry(op, layer, n) for n in ("chunk", "chunk_backward"))
            if forward is None or backward is None or layer_entry(op, layer, SAVING_ENTRY) is not None:
                continue
            if any(isinstance(o, k3s.LaunchOp) for e in (forward, backward) for o in e.body.ops):
                raise ValueError(f"{self.name}: the kernels of @{layer.sym_name.data}'s entries are outlined "
                                 "already; run it before outline-kernels")
            saved = saved_values(forward, backward)
            if saved is None:
                continue
            prefix = forward.sym_name.data.removesuffix("chunk")  # a module of several layers prefixes them
            saving = with_roles(forward, prefix + SAVING_ENTRY, dict.fromkeys(saved, k3s.ArgRole.OUTPUT))
            given = with_roles(backward, prefix + SAVED_BACKWARD_ENTRY, dict.fromkeys(saved, k3s.ArgRole.INPUT))
            prepare = first_kernel(given)
            prepare.detach()
            prepare.erase()
            Rewriter.insert_op([saving, given], InsertPoint.after(backward))
