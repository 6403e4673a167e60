"""`k3c cost`: what each kernel of a recurrence's entries moves and computes at a shape, read off
the scheduled IR (ir/cost.py's rule per stage, times the kernel's loops and grid), and the time
that would take at a GPU's measured ceilings: the roof a kernel cannot beat, and which of HBM or
the tensor cores binds it. Beside a measured time it says how far from that roof a kernel runs,
which is the table issue 35 asks for each benchmark case (docs/chunk-performance.md).

Assumed: dense batches (B sequences of T tokens, no varlen), every chunk factorable (gates
bounded, or mild: the steep launch of a backward kernel exits after its check), no checkpoints."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation

from k3compile.errors import UnsupportedError
from k3compile.ir import k3s
from k3compile.ir.cost import Sizes, StageCost, stage_cost
from k3compile.ir.k3 import RecurrenceOp
from k3compile.ir.k3s import GridAxis


@dataclass(frozen=True)
class Ceiling:
    """A GPU's ceilings as measured on the device tool's machines (../.library/device/KINDS.md:
    a device-to-device copy counting read and written bytes; an 8192^3 bf16 product on random
    data)."""

    name: str
    bytes_per_s: float
    flops_per_s: float


CEILINGS = {"h200": Ceiling("H200 (4.3 TB/s copy, 788 TFLOP/s bf16)", 4.3e12, 788e12),
            "h100": Ceiling("H100 (3.0 TB/s copy, 798 TFLOP/s bf16)", 3.0e12, 798e12)}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class KernelCost:
    kernel: str
    programs: int
    total: StageCost

    def roof_seconds(self, ceiling: Ceiling) -> float:
        return max(self.total.bytes / ceiling.bytes_per_s, self.total.flops / ceiling.flops_per_s)

    def bound(self, ceiling: Ceiling) -> str:
        return "HBM" if self.total.bytes / ceiling.bytes_per_s >= self.total.flops / ceiling.flops_per_s else "tensor cores"


def _first(kernel: k3s.KernelOp, op_type: type[Operation]) -> Operation | None:
    return next((op for op in kernel.walk() if isinstance(op, op_type)), None)


class KernelSizes:
    """The sizes of one kernel's tile dimensions and grid at a shape (batch, tokens)."""

    def __init__(self, kernel: k3s.KernelOp, layer: RecurrenceOp, batch: int, tokens: int, dtype: str):
        self.kernel, self.batch, self.tokens = kernel, batch, tokens
        self.heads = layer.num_v_heads.value.data
        self.head_v_dim = layer.head_v_dim.value.data
        loop = _first(kernel, k3s.ChunkLoopOp) or _first(kernel, k3s.ChunkTileOp)
        self.chunk = loop.chunk_size.value.data if loop is not None else 1
        state = _first(kernel, k3s.StateTileOp)
        self.block_v = state.block_v.value.data if state is not None and GridAxis.VALUE_BLOCK in kernel.axes \
            else self.head_v_dim
        gates = _first(kernel, k3s.BlockGatesOp)
        dims = {"C": self.chunk, "K": layer.head_k_dim.value.data, "V": self.block_v,
                "NB": self.chunk // gates.sub_chunk.value.data if gates is not None else 1}
        self.sizes = Sizes(dims, {"float": DTYPE_BYTES[dtype], "float32": 4, "state": 4, "offsets": 4, "index": 4})

    def programs(self) -> int:
        chunks = self.batch * math.ceil(self.tokens / self.chunk)
        per_axis = {GridAxis.CHUNK: chunks, GridAxis.VALUE_HEAD: self.heads,
                    GridAxis.VALUE_BLOCK: math.ceil(self.head_v_dim / self.block_v),
                    GridAxis.SEQUENCE_HEAD: self.batch * self.heads}
        unknown = [axis for axis in self.kernel.axes if axis not in per_axis]
        if unknown:
            raise UnsupportedError(f"kernel @{self.kernel.sym_name.data}'s grid axis {unknown[0]} has no "
                                   f"program count (recurrence kernels only)")
        return math.prod(per_axis[axis] for axis in self.kernel.axes)

    def block(self, block: Block, sizes: Sizes) -> StageCost:
        """One pass over block's ops (loops times their trips), up to an exit a factorable chunk takes."""
        total = StageCost()
        for op in block.ops:
            if isinstance(op, k3s.ExitUnlessOp) and not op.holds.value.data:
                break  # the steep launch: every chunk factorable, so it stops here
            if isinstance(op, k3s.WhenOp):
                if op.is_on():
                    total += self.block(op.body.block, sizes)
                    if any(isinstance(o, k3s.ExitUnlessOp) and not o.holds.value.data for o in op.body.ops):
                        break  # the steep launch of a gradients kernel: as the exit above
            elif isinstance(op, k3s.ChunkLoopOp):
                total += self.block(op.body.block, sizes) * math.ceil(self.tokens / self.chunk)
            elif isinstance(op, k3s.TokenLoopOp):
                total += self.block(op.body.block, sizes) * self.tokens
            elif isinstance(op, k3s.ValueBlockLoopOp):
                block_v = op.block_v.value.data
                inner = Sizes({**sizes.dims, "V": block_v}, sizes.dtype_bytes)
                total += self.block(op.body.block, inner) * math.ceil(self.head_v_dim / block_v)
            else:
                try:
                    total += stage_cost(op, sizes)
                except LookupError as error:
                    raise UnsupportedError(f"kernel @{self.kernel.sym_name.data}: {error}") from None
        return total

    def cost(self) -> KernelCost:
        programs = self.programs()
        return KernelCost(self.kernel.sym_name.data, programs, self.block(self.kernel.body.block, self.sizes) * programs)


def entry_costs(module: ModuleOp, entry: str, batch: int, tokens: int, dtype: str = "bfloat16") -> list[KernelCost]:
    """The cost of each kernel the entry `entry` launches, in launch order."""
    entries = {op.sym_name.data: op for op in module.ops if isinstance(op, k3s.EntryOp)}
    if entry not in entries:
        raise UnsupportedError(f"no entry '{entry}'; the module has {', '.join(entries)}")
    kernels = {op.sym_name.data: op for op in module.ops if isinstance(op, k3s.KernelOp)}
    layer = next((op for op in module.ops if isinstance(op, RecurrenceOp)), None)
    if layer is None:
        raise UnsupportedError("recurrence layers only (kda, gated_deltanet, deltanet, gla)")
    launches = [op for op in entries[entry].walk() if isinstance(op, k3s.LaunchOp)]
    return [KernelSizes(kernels[launch.kernel.root_reference.data], layer, batch, tokens, dtype).cost()
            for launch in launches]


def format_costs(entry: str, costs: list[KernelCost], ceiling: Ceiling, measured_ms: dict[str, float]) -> str:
    """A markdown table: each kernel's bytes, FLOPs, roof time and binding roof, and with a
    measured time its fraction of the roof."""
    lines = [f"entry {entry} on {ceiling.name}", "",
             "| kernel | programs | MB moved | GFLOP | FLOP/byte | roof ms | bound | measured ms | of roof |",
             "|---|---|---|---|---|---|---|---|---|"]
    for cost in [*costs, KernelCost("total", sum(c.programs for c in costs),
                                    sum((c.total for c in costs), StageCost()))]:
        roof = cost.roof_seconds(ceiling) * 1e3
        measured = measured_ms.get(cost.kernel)
        timed = [c for c in costs if c.total.bytes or c.total.flops]  # a twin that exits at once needs no time
        if cost.kernel == "total" and measured is None and measured_ms and all(c.kernel in measured_ms for c in timed):
            measured = sum(measured_ms[c.kernel] for c in timed)
        lines.append(f"| {cost.kernel} | {cost.programs:,} | {cost.total.bytes / 1e6:,.1f} | {cost.total.flops / 1e9:,.2f} | "
                     f"{cost.total.flops / max(cost.total.bytes, 1):.1f} | {roof:.3f} | {cost.bound(ceiling)} | "
                     + (f"{measured:.3f} | {roof / measured:.0%} |" if measured else "- | - |"))
    return "\n".join(lines)
