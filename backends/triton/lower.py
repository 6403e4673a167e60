"""lower-to-triton: how the Triton backend runs each stage, written on the stages as typed
properties before printing (legalize-triton beside it fixes the block sizes), so that the
printer reads every choice off the IR and decides nothing:

- a kernel's products: `k3s.kernel <dots = input>` (the precision of the input dtype, chosen at
  launch by the runtime prelude's _DOT_OF_DTYPE) on a kernel with matrix products whose pass
  chose none;
- the triangular inverse's products at least tf32 (`accurate`: an fp32 intermediate whose error
  the later products multiply) and its number of squarings;
- the dtype a load keeps its rows in: fp32 for one token's row and for rows it normalises, the
  input dtype for a chunk's rows (half the registers of fp32 for bf16 inputs; stages upcast);
- the loops over value blocks unrolled (ptxas spills a dynamic loop that large).

An op that already has a property keeps it: a pass that chose knows better.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from k3compile.backends.triton.printer.common import chunk_rows
from k3compile.ir import k3s
from k3compile.passes.common import props

# the stages whose kernels multiply matrices (the runtime prelude's _mm, at the kernel's DOT)
MATMUL_STAGE_TYPES = (k3s.ChunkTileOp, k3s.ChunkLoopOp, k3s.RouterLogitsOp, k3s.ProjectOp, k3s.ProjectInputGradOp,
                      k3s.ProjectWeightGradOp)


def inverse_squarings(op: k3s.ForwardSubstitutionOp | k3s.UnitLowerInverseOp) -> int:
    """The (I + M^(2^i)) factors after (I - M) that make (I + M)^-1 exact: M^blocks = 0 for the
    blocks of op.block rows of its kernel's chunk, so log2(blocks) - 1 of them (none for one or
    two blocks)."""
    return max((chunk_rows(op) // op.block.value.data).bit_length() - 2, 0)


def kernel_choices(kernel: k3s.KernelOp) -> dict[str, object]:
    """The kernel's own properties: the products' precision where it has products."""
    if kernel.dots is None and any(isinstance(op, MATMUL_STAGE_TYPES) for op in kernel.walk()):
        return dict(dots=k3s.KernelDots.INPUT)
    return {}


def stage_choices(op: Operation, kernel: k3s.KernelOp) -> dict[str, object]:
    """The properties lower-to-triton writes on a stage of kernel (none for most)."""
    if isinstance(op, (k3s.ForwardSubstitutionOp, k3s.UnitLowerInverseOp)):
        return dict(accurate=True, squarings=inverse_squarings(op))
    if isinstance(op, k3s.LoadTokenOp):
        return dict(dtype=k3s.RegisterDtype.FP32)
    if isinstance(op, k3s.LoadChunkOp):
        return dict(dtype=k3s.RegisterDtype.FP32 if k3s.normalises(op) else k3s.RegisterDtype.INPUT)
    if isinstance(op, k3s.ValueBlockLoopOp) and k3s.GridAxis.VALUE_BLOCK in kernel.axes:
        return {}  # one block a program: no loop
    if isinstance(op, (k3s.ValueBlockLoopOp, k3s.SumValueBlockPartsOp)):
        return dict(unroll=True)
    return {}


def write_choices(op: Operation, choices: dict[str, object]) -> None:
    """choices as op's properties, those it has kept."""
    op.properties.update({key: value for key, value in props(type(op), **choices).items() if key not in op.properties})


@dataclass(frozen=True)
class LowerToTritonPass(ModulePass):
    """Write how the Triton backend runs each kernel and stage on them (the module docstring)."""

    name = "lower-to-triton"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            write_choices(kernel, kernel_choices(kernel))
            for stage in kernel.walk():
                write_choices(stage, stage_choices(stage, kernel))
