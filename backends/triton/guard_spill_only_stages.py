"""guard-spill-only-stages: a kernel whose body is another kernel's minus stages that only feed
spills runs the other's code, with those stages under a constexpr flag its launch turns off.

segment_summary's prepare is the chunk prepare without the stages that only the output needs: the
query loads, the query Gram P, the gated queries QG and their spills (the summary scans read
neither). For a kernel A and a kernel B of another entry, B's extra stages are its spills of
values A does not spill and every stage whose results only they read (transitively). When
erasing them from B leaves A's body exactly (xDSL's structural equivalence: the same ops,
properties and use-def chains) and the kernels' code properties agree, the extra stages go into
one `k3s.when <flag = SPILL_P_QG>` (the flag named for the spills it guards): B and every kernel
with B's body get the guarded body with the flag on, A and every kernel with A's body the same
body with it off. merge-identical-kernels, run next, finds them all one code (a flag's value is
launch-only). It works on outlined kernels (outline-kernels): their arguments compare by name,
and a kernel given another's body is launched with its entry's values of its new arguments' names,
a tensor the entry lacks (the summary prepare's q, read only by the guarded stages) as a
k3s.absent_tensor of the entry.

Only a kernel's top-level stages count, and only extra stages that are one run of ops: one guard
holds them, and moving stages to make a run would change B's code. Kernels with flags are left
as they are, so running the pass again changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, DictionaryAttr, ModuleOp
from xdsl.ir import Operation, Region
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.backends.triton.merge_identical_kernels import code_properties, equivalent, launching_entries
from k3compile.ir import k3s
from k3compile.passes.common import make


def spilled(kernel: k3s.KernelOp) -> set[str]:
    """The workspaces a kernel spills to, by name."""
    return {k3s.argument_name(op.workspace) for op in kernel.body.ops if isinstance(op, k3s.SpillOp)}


def spill_only_stages(kernel: k3s.KernelOp, kept: set[str]) -> list[Operation]:
    """The top-level stages of kernel that exist only for its spills of values not in `kept`:
    those spills, and every stage whose results are read, and read only, by them (transitively)."""
    block = kernel.body.block
    extra: set[Operation] = set()
    for op in reversed(list(block.ops)):  # a stage's readers come after it
        readers = {block.find_ancestor_op_in_block(use.operation) for result in op.results for use in result.uses}
        if ((isinstance(op, k3s.SpillOp) and k3s.argument_name(op.workspace) not in kept)
                or (readers and readers <= extra)):
            extra.add(op)
    return [op for op in block.ops if op in extra]


def is_one_run(kernel: k3s.KernelOp, stages: list[Operation]) -> bool:
    ops = list(kernel.body.ops)
    first = ops.index(stages[0])
    return ops[first:first + len(stages)] == stages


def same_body(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    """The same body, launch properties inside it included (a kernel given another's body loses
    none of its own), and the same code properties."""
    return (code_properties(kernel) == code_properties(other)
            and equivalent(kernel.body, other.body))


def guarded_body(kernel: k3s.KernelOp, stages: list[Operation], flag: str) -> Region:
    """A copy of kernel's body with the stages (one run of its top-level ops) in a k3s.when on flag."""
    body = kernel.body.clone()
    copies = [copy for copy, op in zip(body.block.ops, kernel.body.ops, strict=True) if op in stages]
    when = make(k3s.WhenOp, [], flag=flag)
    Rewriter.insert_op(when, InsertPoint.before(copies[0]))
    for op in copies:
        op.detach()
        when.body.block.add_op(op)
    return body


def run_guarded(kernel: k3s.KernelOp, body: Region, flag: str, on: bool) -> None:
    """Give kernel (a copy of) the guarded body, its launch passing flag = on and its entry's
    values of the body's arguments. A tensor its entry lacks (read only by the guarded
    stages, which its launch skips) becomes a k3s.absent_tensor of the entry."""
    kernel.body.erase_block(kernel.body.block)
    body.clone_into(kernel.body)
    kernel.properties["flags"] = DictionaryAttr({flag: BoolAttr.from_bool(on)})
    relaunch(kernel)


def relaunch(kernel: k3s.KernelOp) -> None:
    """Pass an outlined kernel given another's body the values its arguments now name: its
    entry's arguments of those names; a tensor the entry lacks (read only by stages the launch
    skips) as a k3s.absent_tensor of the argument's type."""
    launch = k3s.launch_site(kernel)
    values = {op.sym_name.data: op.results[0] for op in launch.parent_block().ops
              if isinstance(op, (k3s.TensorArgOp, k3s.ScalarArgOp))}
    operands = []
    for arg in kernel.body.block.args:
        if arg.name_hint not in values:
            absent = make(k3s.AbsentTensorOp, result=(arg.name_hint, arg.type))
            Rewriter.insert_op(absent, InsertPoint.before(launch))
            values[arg.name_hint] = absent.results[0]
        operands.append(values[arg.name_hint])
    launch.operands = operands


@dataclass(frozen=True)
class GuardSpillOnlyStagesPass(ModulePass):
    """Let a kernel that is another's minus spill-only stages run the other's code, those stages
    guarded by a flag it turns off."""

    name = "guard-spill-only-stages"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernels = k3s.outlined_kernels(op, self.name)
        entry_of = launching_entries(op)  # once: no kernel changes entry here
        for narrow in kernels:
            for wide in kernels:
                if (narrow.flags is not None or wide.flags is not None or entry_of[narrow] is entry_of[wide]
                        # cheap necessary conditions first: the same code properties, and extra stages to drop
                        or code_properties(wide) != code_properties(narrow)
                        or len(wide.body.block.ops) <= len(narrow.body.block.ops)):
                    continue
                extra = spill_only_stages(wide, spilled(narrow))
                if not (extra and is_one_run(wide, extra) and equivalent(wide.body, narrow.body, without=extra)):
                    continue
                flag = "SPILL_" + "_".join(k3s.argument_name(s.workspace).upper()
                                           for s in extra if isinstance(s, k3s.SpillOp))
                body = guarded_body(wide, extra, flag)
                # the kernels of either body, found before any of them changes
                runs = [(k, True) for k in kernels if k.flags is None and same_body(k, wide)]
                runs += [(k, False) for k in kernels if k.flags is None and same_body(k, narrow)]
                for kernel, on in runs:
                    run_guarded(kernel, body, flag, on)
