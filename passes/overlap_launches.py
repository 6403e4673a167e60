"""overlap-launches: two consecutive launches of an entry that share no tensor one of them writes
run side by side, the first on a side stream (k3s.fork_streams, the launch <side_stream = true>,
k3s.join_streams after the second).

Which launches may overlap follows from the kernels: a kernel's block arguments are exactly the
tensors it uses (outline-kernels), and a tensor is only read by it when every stage that takes it
reads memory and writes none (the MemoryReadEffect loads and reloads, and the chunk and token
loops' offsets); any other use counts as a write. The backward's state scan and cotangent scan
are such a pair: both reload the prepare's spills, one spills the states and the other their
cotangents. Each alone fills few SMs where the sequences are long and the heads few (a program
per value block, sequence and head, a chain over every chunk), so side by side they take about
the time of the longer one.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import MemoryReadEffect, MemoryWriteEffect

from k3compile.ir import k3s
from k3compile.passes.common import make

# stages whose tensor operand is the sequence offsets they read (they carry no effect trait)
OFFSET_READERS = (k3s.ChunkLoopOp, k3s.ChunkTileOp, k3s.TokenLoopOp)


def only_reads(use: Operation) -> bool:
    if isinstance(use, OFFSET_READERS):
        return True
    return use.has_trait(MemoryReadEffect) and not use.has_trait(MemoryWriteEffect)


def written(kernel: k3s.KernelOp) -> set[int]:
    """The positions of the kernel's tensor arguments that a stage may write."""
    return {arg.index for arg in kernel.body.block.args if isinstance(arg.type, k3s.TensorType)
            and not all(only_reads(use.operation) for use in arg.uses)}


def independent(first: k3s.LaunchOp, second: k3s.LaunchOp) -> bool:
    """Whether no value passed to both launches is written by either kernel."""
    def writes(launch: k3s.LaunchOp) -> set[SSAValue]:
        return {launch.arguments[i] for i in written(launch.callee())}

    shared = set(first.arguments) & set(second.arguments)
    return not shared & (writes(first) | writes(second)) and not writes(first) & writes(second)


def overlap(entry: k3s.EntryOp) -> None:
    """Pair the entry's consecutive independent launches, each launch in one pair at most (an
    entry already overlapped is left as it is)."""
    if any(isinstance(op, k3s.ForkStreamsOp) for op in entry.body.ops):
        return
    ops = list(entry.body.ops)
    at = 0
    while at + 1 < len(ops):
        first, second = ops[at], ops[at + 1]
        if isinstance(first, k3s.LaunchOp) and isinstance(second, k3s.LaunchOp) and independent(first, second):
            first.properties["side_stream"] = BoolAttr.from_bool(True)
            Rewriter.insert_op(make(k3s.ForkStreamsOp), InsertPoint.before(first))
            Rewriter.insert_op(make(k3s.JoinStreamsOp), InsertPoint.after(second))
            at += 2
        else:
            at += 1


@dataclass(frozen=True)
class OverlapLaunchesPass(ModulePass):
    """Run each entry's consecutive independent launches side by side (after outline-kernels)."""

    name = "overlap-launches"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for entry in [o for o in op.ops if isinstance(o, k3s.EntryOp)]:
            overlap(entry)
