"""lower-to-triton: how the Triton backend runs each stage, written on the stages as typed
properties before printing (legalize-triton beside it fixes the block sizes), so that the
printer reads these choices off the IR rather than making them:

- a kernel's products: `k3s.kernel <dots = input>` (the precision of the input dtype, chosen at
  launch by the runtime prelude's _DOT_OF_DTYPE) on a kernel with matrix products whose pass
  chose none;
- the triangular inverse's products at least tf32 (`accurate`: an fp32 intermediate whose error
  the later products multiply) and its number of squarings;
- the dtype a load keeps its rows in: fp32 for one token's row and for rows it normalises, the
  input dtype for a chunk's rows (half the registers of fp32 for bf16 inputs; stages upcast);
- the loops over value blocks unrolled (ptxas spills a dynamic loop that large);
- a channel-gated Gram's loop over the blocks below the diagonal unrolled (NB - 1 steps, NB =
  C / sub_chunk: a few), and its elementwise diagonal's rows reloaded from memory (key rows and
  log-decays, cache-resident: cheaper than picking a row out of the [NB, SUB, BK] tiles).

Each op type's part is one function, registered with @choices_of. An op that already has a
property keeps it: a pass that chose knows better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, IntegerAttr, ModuleOp, i64
from xdsl.ir import Attribute, Operation
from xdsl.passes import ModulePass

from k3compile.backends.triton.printer.common import chunk_rows
from k3compile.ir import k3s
from k3compile.ir.choices import Gate

# the stages whose kernels multiply matrices (the runtime prelude's _mm, at the kernel's DOT)
MATMUL_STAGE_TYPES = (k3s.ChunkTileOp, k3s.ChunkLoopOp, k3s.RouterLogitsOp, k3s.ProjectOp, k3s.ProjectInputGradOp,
                      k3s.ProjectWeightGradOp)
TRUE = BoolAttr.from_bool(True)
RELOAD_ROWS = k3s.DiagonalRowsAttr(k3s.DiagonalRows.RELOAD)
IN_FP32, IN_INPUT_DTYPE = k3s.RegisterDtypeAttr(k3s.RegisterDtype.FP32), k3s.RegisterDtypeAttr(k3s.RegisterDtype.INPUT)

# --- each op's choices: one function per op type (as legalize-triton's @block_sizes_of) ---------
STAGE_CHOICES: dict[type[Operation], Callable[[Operation, k3s.KernelOp], dict[str, Attribute]]] = {}


def choices_of(*op_types: type[Operation]) -> Callable:
    """Register f(op, kernel) -> the properties lower-to-triton writes on op, a stage of kernel."""
    def register(function: Callable) -> Callable:
        STAGE_CHOICES.update(dict.fromkeys(op_types, function))
        return function

    return register


@choices_of(k3s.ForwardSubstitutionOp, k3s.UnitLowerInverseOp)
def inverse_choices(op: k3s.ForwardSubstitutionOp | k3s.UnitLowerInverseOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Products at least tf32, and the (I + M^(2^i)) factors after (I - M) that make (I + M)^-1
    exact: M^blocks = 0 for the blocks of op.block rows of the kernel's chunk, so log2(blocks) - 1
    of them (none for one or two blocks)."""
    squarings = max((chunk_rows(op) // op.block.value.data).bit_length() - 2, 0)
    return dict(accurate=TRUE, squarings=IntegerAttr(squarings, i64))


@choices_of(k3s.LoadTokenOp)
def load_token_choices(op: k3s.LoadTokenOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    return dict(dtype=IN_FP32)


@choices_of(k3s.LoadChunkOp)
def load_chunk_choices(op: k3s.LoadChunkOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    return dict(dtype=IN_FP32 if k3s.normalises(op) else IN_INPUT_DTYPE)


@choices_of(k3s.ValueBlockLoopOp, k3s.SumValueBlockPartsOp)
def value_blocks_choices(op: Operation, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Unrolled, where there is a loop: one block a program (a value_block grid axis) has none."""
    looped = isinstance(op, k3s.SumValueBlockPartsOp) or k3s.GridAxis.VALUE_BLOCK not in kernel.axes
    return dict(unroll=TRUE) if looped else {}


@choices_of(k3s.GramOp)
def gram_choices(op: k3s.GramOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """A channel gate's block loop unrolled; an elementwise (or guarded) diagonal's rows reloaded."""
    if op.gate.data != Gate.CHANNEL:
        return {}
    choices: dict[str, Attribute] = dict(unroll=TRUE)
    if op.diagonal.data.reloads:
        choices["diagonal_rows"] = RELOAD_ROWS
    return choices


def write_choices(op: Operation, choices: dict[str, Attribute]) -> None:
    """choices as op's properties, those it has kept."""
    op.properties.update({key: value for key, value in choices.items() if key not in op.properties})


@dataclass(frozen=True)
class LowerToTritonPass(ModulePass):
    """Write how the Triton backend runs each kernel and stage on them (the module docstring)."""

    name = "lower-to-triton"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            has_products = False
            for stage in kernel.walk():
                has_products = has_products or isinstance(stage, MATMUL_STAGE_TYPES)
                if (of_op := STAGE_CHOICES.get(type(stage))) is not None:
                    write_choices(stage, of_op(stage, kernel))
            if has_products:  # the products' precision: the input dtype's, where no pass chose
                write_choices(kernel, dict(dots=k3s.KernelDotsAttr(k3s.KernelDots.INPUT)))
