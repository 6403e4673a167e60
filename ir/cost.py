"""What one execution of a k3s stage costs: the bytes it moves between HBM and a program, and
the floating-point operations it does (a multiply-add counts 2), given the sizes of the tile
dimensions in the kernel it runs in. One rule per op class, registered like `@semantics`;
k3compile/checking/cost.py sums them over a kernel's loops and grid (`k3c cost`).

The model is a roofline's: every load and store reaches HBM (no L2 reuse between programs), and
a stage's FLOPs are its contractions' (2 m n k each). Register-only stages (elementwise
arithmetic, cumulative sums, masks, rescales by a row or column) are free: on Hopper a chunk's
elementwise work is a few percent of its dots' and hides under them. A Gram counts one dense
C x C x K product whatever its diagonal form (the factored form's sub-chunk blocks are that
product cut in pieces); a triangular solve or inverse counts C^3 / 3 multiply-adds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from k3compile.ir import k3s
from k3compile.ir.k3s import TensorType, TileType
from k3compile.ir.k3s.types import tile_dims


@dataclass(frozen=True)
class StageCost:
    bytes: float = 0.0
    flops: float = 0.0

    def __add__(self, other: StageCost) -> StageCost:
        return StageCost(self.bytes + other.bytes, self.flops + other.flops)

    def __mul__(self, times: float) -> StageCost:
        return StageCost(self.bytes * times, self.flops * times)


@dataclass(frozen=True)
class Sizes:
    """The sizes a kernel's tile dimensions stand for (C, NB, K, V, ...) and the bytes of an
    element of each tensor dtype class ("float": the inputs' dtype)."""

    dims: dict[str, int]
    dtype_bytes: dict[str, int]

    def elements(self, value: SSAValue) -> int:
        if not isinstance(value.type, TileType):
            return 1
        return math.prod(self.dims[d] for d in tile_dims(value))

    def element_bytes(self, tensor: SSAValue) -> int:
        assert isinstance(tensor.type, TensorType), tensor
        return self.dtype_bytes[tensor.type.dtype_class]


CostRule = Callable[[Operation, Sizes], StageCost]
COST_RULES: dict[type[Operation], CostRule] = {}


def cost_of(*op_types: type[Operation]):
    """Register the cost rule of these op classes."""

    def register(rule: CostRule) -> CostRule:
        for op_type in op_types:
            COST_RULES[op_type] = rule
        return rule

    return register


# register-only stages, and structure whose cost lies in the ops it holds
FREE = (k3s.AddOp, k3s.SubOp, k3s.MulOp, k3s.NegOp, k3s.ScaleOp, k3s.MaskOp, k3s.DiagonalOp, k3s.ReduceSumOp,
        k3s.GateCumsumOp, k3s.GateTotalOp, k3s.ChunkDecayOp, k3s.BlockGatesOp, k3s.BlockRescaleOp,
        k3s.BlockSpanCheckOp, k3s.GateApplyOp, k3s.ReverseCumsumOp, k3s.OntoLastRowOp, k3s.PairDecayOp,
        k3s.NextChunkOp, k3s.ChunkTileOp, k3s.SumValueBlocksOp, k3s.ExitUnlessOp, k3s.RecordCheckOp, k3s.RecordedCheckOp,
        k3s.DecayOp, k3s.NextTokenOp, k3s.DecayProductStartOp, k3s.DecayProductOp, k3s.FlagOp)
for _free in FREE:
    COST_RULES[_free] = lambda op, sizes: StageCost()


@cost_of(k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp, k3s.LoadTokenOp, k3s.ReloadOp)
def _load(op: Operation, sizes: Sizes) -> StageCost:
    return StageCost(bytes=sizes.elements(op.results[0]) * sizes.element_bytes(op.operands[0]))


@cost_of(k3s.SpillOp)
def _spill(op: k3s.SpillOp, sizes: Sizes) -> StageCost:
    workspace, value = op.operands
    return StageCost(bytes=sizes.elements(value) * sizes.element_bytes(workspace))


@cost_of(k3s.StoreStateOp, k3s.StoreCotangentOp, k3s.StoreTransitionOp)
def _store(op: Operation, sizes: Sizes) -> StageCost:
    value, target = op.operands[0], op.operands[1]
    return StageCost(bytes=sizes.elements(value) * sizes.element_bytes(target))


@cost_of(k3s.SpillValueBlockPartOp)
def _spill_part(op: k3s.SpillValueBlockPartOp, sizes: Sizes) -> StageCost:
    return StageCost(bytes=sizes.elements(op.part) * sizes.element_bytes(op.workspace))


@cost_of(k3s.SumValueBlockPartsOp)
def _sum_parts(op: k3s.SumValueBlockPartsOp, sizes: Sizes) -> StageCost:
    """Every value block's part read: the workspace's block count sits before the part's own
    dimensions (those after its rows, for a tile of chunk rows)."""
    dims = tile_dims(op.total)
    own = len(dims) - 1 if dims[:1] == ("C",) else len(dims)
    blocks = int(op.workspace.type.dims[-(own + 1)])
    return StageCost(bytes=sizes.elements(op.total) * blocks * sizes.element_bytes(op.workspace))


@cost_of(k3s.StateTileOp)
def _state_tile(op: k3s.StateTileOp, sizes: Sizes) -> StageCost:
    """The state a program starts from: read from its home, if it has one (else zeros)."""
    homes = [t for t in op.operands if isinstance(t.type, TensorType)]
    return StageCost(bytes=sizes.elements(op.results[0]) * sizes.element_bytes(homes[0]) if homes else 0.0)


@cost_of(k3s.StoreCheckpointOp)
def _checkpoint(op: Operation, sizes: Sizes) -> StageCost:
    return StageCost()  # only when checkpoint_every is given: not the entry's default


@cost_of(k3s.DotOp)
def _dot(op: k3s.DotOp, sizes: Sizes) -> StageCost:
    """m n k from the operands: |lhs| |rhs| = m k k n and |result| = m n, whatever the transposes."""
    lhs, rhs = sizes.elements(op.operands[0]), sizes.elements(op.operands[1])
    result = sizes.elements(op.results[0])
    return StageCost(flops=2 * result * math.sqrt(lhs * rhs / result))


def contracting(dim: str) -> CostRule:
    """2 |result| n: each result element a sum of n products over the dimension `dim`."""
    return lambda op, sizes: StageCost(flops=2 * sizes.elements(op.results[0]) * sizes.dims[dim])


# the dimension each product stage sums over: a Gram's keys (one dense C x C x K product whatever
# its diagonal form), W S's keys; T's rows in W = T K and U = T V, the chunk's tokens in K^T vr and
# in a gated contraction
CONTRACTED = {k3s.GramOp: "K", k3s.DeltaResidualOp: "K", k3s.WYApplyOp: "C", k3s.StateAdvanceOp: "C",
              k3s.GatedContractionOp: "C"}
for _op_type, _dim in CONTRACTED.items():
    COST_RULES[_op_type] = contracting(_dim)


@cost_of(k3s.ChunkOutputOp)
def _chunk_output(op: k3s.ChunkOutputOp, sizes: Sizes) -> StageCost:
    """o = QG S + P vr, stored."""
    output = op.results[0]
    stored = next(t for t in op.operands if isinstance(t.type, TensorType))
    return StageCost(bytes=sizes.elements(output) * sizes.element_bytes(stored),
                     flops=2 * sizes.elements(output) * (sizes.dims["K"] + sizes.dims["C"]))


@cost_of(k3s.DeltaCorrectOp, k3s.Rank1UpdateOp)
def _state_vector(op: Operation, sizes: Sizes) -> StageCost:
    """A token's product with the K x V state: S^T k, or the rank-one update k u^T."""
    return StageCost(flops=2 * sizes.dims["K"] * sizes.dims["V"])


@cost_of(k3s.ReadoutOp)
def _readout(op: k3s.ReadoutOp, sizes: Sizes) -> StageCost:
    """o = S^T q, stored."""
    stored = next(t for t in op.operands if isinstance(t.type, TensorType))
    return StageCost(bytes=sizes.elements(op.results[0]) * sizes.element_bytes(stored),
                     flops=2 * sizes.dims["K"] * sizes.dims["V"])


@cost_of(k3s.ForwardSubstitutionOp, k3s.UnitLowerInverseOp)
def _triangular(op: Operation, sizes: Sizes) -> StageCost:
    return StageCost(flops=2 * sizes.dims["C"] ** 3 / 3)


def stage_cost(op: Operation, sizes: Sizes) -> StageCost:
    rule = COST_RULES.get(type(op))
    if rule is None:
        raise LookupError(f"no cost rule for {op.name} (ir/cost.py)")
    return rule(op, sizes)
