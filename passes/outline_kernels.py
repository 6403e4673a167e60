"""outline-kernels: each kernel built inside an entry becomes a symbol of the module, and the entry
launches it.

The lowering passes build a kernel where it runs, its stages reading the entry's arguments (the
values of its k3s.tensor_arg and k3s.scalar_arg ops) directly. Outlining gives the kernel one
block argument per entry value its stages use (in the entry's argument order, named and typed
as the argument), so its parameters are exactly what it reads and writes; moves it before the
entry; and leaves `k3s.launch @kernel %values...` in its place. Later passes and the backend see
kernels only as symbols: a kernel's code no longer depends on the entry that launches it, so
entries can share one (merge-identical-kernels). Kernels already outlined are left alone, so the
pass may run again.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.passes.common import make


def captured_values(kernel: k3s.KernelOp) -> list[SSAValue]:
    """The values defined outside kernel that its stages use, in the order they are defined."""
    used = {operand for op in kernel.walk() for operand in op.operands if not defined_in(kernel, operand)}
    entry_values = [value for op in kernel.parent_block().ops for value in op.results]
    return [value for value in entry_values if value in used]


def defined_in(kernel: k3s.KernelOp, value: SSAValue) -> bool:
    owner = value.owner if isinstance(value.owner, Operation) else value.owner.parent_op()
    return owner is not None and kernel.is_ancestor(owner)


def outline(kernel: k3s.KernelOp) -> None:
    entry = kernel.parent_op()
    values = captured_values(kernel)
    block = kernel.body.block
    for value in values:
        arg = block.insert_arg(value.type, len(block.args))
        arg.name_hint = value.name_hint
        value.replace_uses_with_if(arg, lambda use: kernel.is_ancestor(use.operation))
    launch = make(k3s.LaunchOp, kernel=SymbolRefAttr(kernel.sym_name), operands=values)
    Rewriter.insert_op(launch, InsertPoint.before(kernel))
    kernel.detach()
    Rewriter.insert_op(kernel, InsertPoint.before(entry))


@dataclass(frozen=True)
class OutlineKernelsPass(ModulePass):
    """Make every kernel built in an entry a module symbol launched by its entry."""

    name = "outline-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernels = [k for entry in op.ops if isinstance(entry, k3s.EntryOp)
                   for k in entry.body.ops if isinstance(k, k3s.KernelOp)]
        names = [k.sym_name.data for k in op.ops if isinstance(k, k3s.KernelOp)] + [k.sym_name.data for k in kernels]
        if clash := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"outline-kernels: kernels of different entries share the names {clash}; "
                             "module symbols must be unique")
        for kernel in kernels:
            outline(kernel)
