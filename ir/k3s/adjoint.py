"""The stages a backward schedule adds to the forward's: tile algebra (products, elementwise
arithmetic, masks, sums, decayed contractions), the transposed triangular solve, and the
store of an input's cotangent. derive-backward writes each forward stage's vector-Jacobian
product with them (passes/adjoint_rules.py); the forward stages it recomputes are the
forward's own ops.

Tiles are over the symbols of types.py: `<C x K>` a chunk's rows of key channels, `<C>` one
number per row, `<K>` one per key channel, `<>` one number. An elementwise op takes tiles of
the same dimensions; a scaling says along which dimension its factor runs."""

from __future__ import annotations

from xdsl.dialects.builtin import I64, BoolAttr, Float32Type, FloatAttr, IntegerAttr, IntegerType
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import SpacedOpaqueSyntaxAttribute
from xdsl.irdl import (
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, MemoryWriteEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3 import BetaInputAttr, GateInputAttr
from k3compile.ir.k3s.chunk_loops import CHUNK_LOCAL_PARENTS, CotangentScanOp
from k3compile.ir.k3s.gram import GramDiagonal, GramDiagonalAttr, MaskAttr
from k3compile.ir.k3s.kernels import argument_name
from k3compile.ir.k3s.target import TensorLayoutAttr, verify_layout
from k3compile.ir.k3s.types import dims_text, expect_dims, tile_dims, TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax

# a backward schedule's chunk-local stages, or its cotangent scan's
ADJOINT_PARENTS = (*CHUNK_LOCAL_PARENTS, CotangentScanOp)


class _Elementwise(KeywordSyntax):
    """Two tiles of the same dimensions, combined entry by entry."""

    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "rhs", tile_dims(self.rhs), tile_dims(self.lhs))
        expect_dims(self, "the result", tile_dims(self.result), tile_dims(self.lhs))


@irdl_op_definition
class AddOp(_Elementwise):
    """lhs + rhs: where two stages read a value, its cotangents add up."""

    name = "k3s.add"


@irdl_op_definition
class SubOp(_Elementwise):
    """lhs - rhs."""

    name = "k3s.sub"


@irdl_op_definition
class MulOp(_Elementwise):
    """lhs * rhs, entry by entry."""

    name = "k3s.mul"


@irdl_op_definition
class NegOp(KeywordSyntax):
    """-x."""

    name = "k3s.neg"
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the result", tile_dims(self.result), tile_dims(self.operand))


@irdl_op_definition
class DotOp(KeywordSyntax):
    """A product of two 2-d tiles, either transposed first: `k3s.dot %a, %b <transpose_rhs = true>`
    is a b^T. The contracted dimensions agree; the result's are the outer ones."""

    name = "k3s.dot"
    transpose_lhs = opt_prop_def(BoolAttr)  # absent: false
    transpose_rhs = opt_prop_def(BoolAttr)
    accurate = opt_prop_def(BoolAttr)  # at least tf32, finer than a bf16 dot: a product read as is (a gradient)
    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def oriented(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The operands' dimensions as multiplied (after the transposes)."""
        lhs, rhs = tile_dims(self.lhs), tile_dims(self.rhs)
        flip = [bool(a and a.value.data) for a in (self.transpose_lhs, self.transpose_rhs)]
        return lhs[::-1] if flip[0] else lhs, rhs[::-1] if flip[1] else rhs

    def verify_(self) -> None:
        lhs, rhs = self.oriented()
        if len(lhs) != 2 or len(rhs) != 2:
            raise VerifyException(f"{self.name}: multiplies 2-d tiles, got {dims_text(lhs)} and {dims_text(rhs)}")
        if lhs[1] != rhs[0]:
            raise VerifyException(f"{self.name}: contracts {lhs[1]} with {rhs[0]} ({dims_text(lhs)} by {dims_text(rhs)})")
        expect_dims(self, "the result", tile_dims(self.result), (lhs[0], rhs[1]))


class Along(Word):
    ROWS = "rows"  # the factor has one number per row (the first dimension)
    COLUMNS = "columns"  # one per column (the last dimension)
    ALL = "all"  # one number for the whole tile


@irdl_attr_definition
class AlongAttr(EnumAttribute[Along], SpacedOpaqueSyntaxAttribute):
    name = "k3s.along"


def _factor_dims(dims: tuple[str, ...], along: str) -> tuple[str, ...]:
    return {"rows": dims[:1], "columns": dims[-1:], "all": ()}[along]


@irdl_op_definition
class ScaleOp(KeywordSyntax):
    """x times a factor that runs `along` its rows (Diag(f) x), its columns (x Diag(f)), or is one
    number for all of it (a `<>` tile or the entry's f32 scale)."""

    name = "k3s.scale"
    along = prop_def(AlongAttr)
    operand = operand_def(TileType)
    factor = operand_def(TileType | Float32Type)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        want = _factor_dims(tile_dims(self.operand), self.along.data)
        got = tile_dims(self.factor) if isinstance(self.factor.type, TileType) else ()
        expect_dims(self, f"a factor along {self.along.data} of {dims_text(tile_dims(self.operand))}", got, want)
        expect_dims(self, "the result", tile_dims(self.result), tile_dims(self.operand))


@irdl_op_definition
class ReduceSumOp(KeywordSyntax):
    """The sums of a tile's entries `along` its rows (one per row: over the columns), its columns
    (one per column: over the rows) or all of it."""

    name = "k3s.reduce_sum"
    along = prop_def(AlongAttr)
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the result", tile_dims(self.result), _factor_dims(tile_dims(self.operand), self.along.data))


@irdl_op_definition
class MaskOp(KeywordSyntax):
    """A `<C x C>` tile with the entries above (strict: on and above) its diagonal zeroed."""

    name = "k3s.mask"
    mask = prop_def(MaskAttr)
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the operand", tile_dims(self.operand), ("C", "C"))
        expect_dims(self, "the result", tile_dims(self.result), ("C", "C"))


@irdl_op_definition
class DiagonalOp(KeywordSyntax):
    """The diagonal of a `<C x C>` tile, one number per row."""

    name = "k3s.diagonal"
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the operand", tile_dims(self.operand), ("C", "C"))
        expect_dims(self, "the result", tile_dims(self.result), ("C",))


class Side(Word):
    ROWS = "rows"  # the cotangent of the Gram's rows: contracted with its keys
    KEYS = "keys"  # the cotangent of its keys: contracted with its rows


@irdl_attr_definition
class SideAttr(EnumAttribute[Side], SpacedOpaqueSyntaxAttribute):
    name = "k3s.side"


@irdl_op_definition
class GatedContractionOp(KeywordSyntax):
    """A channel-gated Gram's cotangent M_bar (lower triangular, masked as the Gram) contracted
    with one of its sides under the Gram's decays:

        side = rows: X_ic = sum_j M_bar_ij R_jc exp(G_ic - G_jc)   (R the keys)
        side = keys: X_jc = sum_i M_bar_ij R_ic exp(G_ic - G_jc)   (R the rows)

    Every exponent M_bar meets is <= 0. `form` is the Gram's diagonal form: factored (exp(G)
    and exp(-G) as two tensor-core operands, in range while the chunk's decay spans at most the
    factored limit: a gate bounded below), elementwise (exp of each difference: any gate) or
    guarded (factored where the chunk's k3s.block_span_check holds, its last operand)."""

    name = "k3s.gated_contraction"
    side = prop_def(SideAttr)
    form = prop_def(GramDiagonalAttr)
    cotangent = operand_def(TileType)
    rows = operand_def(TileType)
    cumulative_gate = operand_def(TileType)
    guard = opt_operand_def(IntegerType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the cotangent", tile_dims(self.cotangent), ("C", "C"))
        expect_dims(self, "the cumulative gate", tile_dims(self.cumulative_gate), ("C", "K"))
        expect_dims(self, "the rows", tile_dims(self.rows), ("C", "K"))
        expect_dims(self, "the result", tile_dims(self.result), ("C", "K"))
        if (self.guard is not None) != (self.form.data == GramDiagonal.GUARDED):
            raise VerifyException(f"{self.name}: a guarded form (and only it) takes the span check, got form "
                                  f"{self.form.data} with {'a' if self.guard is not None else 'no'} guard")


@irdl_op_definition
class PairDecayOp(KeywordSyntax):
    """`<C x C>`: exp(G_i - G_j) of a scalar gate's cumulative G below the diagonal (mask
    inclusive: and on it), 0 above: the decay from token j to token i, never > 1."""

    name = "k3s.pair_decay"
    mask = prop_def(MaskAttr)
    cumulative_gate = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the cumulative gate", tile_dims(self.cumulative_gate), ("C",))
        expect_dims(self, "the result", tile_dims(self.result), ("C", "C"))


@irdl_op_definition
class ReverseCumsumOp(KeywordSyntax):
    """x_r + x_{r+1} + ... + x_{C-1} along the chunk's rows: the adjoint of a cumulative sum."""

    name = "k3s.reverse_cumsum"
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        if tile_dims(self.operand)[:1] != ("C",):
            raise VerifyException(f"{self.name}: sums along a chunk's rows, got {dims_text(tile_dims(self.operand))}")
        expect_dims(self, "the result", tile_dims(self.result), tile_dims(self.operand))


@irdl_op_definition
class OntoLastRowOp(KeywordSyntax):
    """A chunk's rows that are zero but the last (the chunk's last valid token), which is x: the
    adjoint of reading the last row (k3s.gate_total)."""

    name = "k3s.onto_last_row"
    operand = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "the result", tile_dims(self.result), ("C", *tile_dims(self.operand)))


@irdl_op_definition
class UnitLowerInverseOp(KeywordSyntax):
    """(I + A)^{-1} for A lower triangular, as k3s.forward_substitution reads it and with its
    `block` (diagonal blocks row by row, the rest by products). The backward holds it as a value:
    its T is this inverse scaled by beta along the columns, and the forward substitution's adjoint
    multiplies by its transpose, so one inverse serves both."""

    name = "k3s.unit_lower_inverse"
    block = prop_def(IntegerAttr[I64])
    accurate = opt_prop_def(BoolAttr)  # products at least tf32 (the Triton backend's, as squarings)
    squarings = opt_prop_def(IntegerAttr[I64])  # (I + M^2^i) factors after I - M: log2(C / block) - 1
    gram = operand_def(TileType)
    inverse = result_def(TileType)
    traits = traits_def(HasParent(*ADJOINT_PARENTS), Pure())

    def verify_(self) -> None:
        expect_dims(self, "A", tile_dims(self.gram), ("C", "C"))
        expect_dims(self, "the result", tile_dims(self.inverse), ("C", "C"))


class LoadedInput(Word):
    """A recurrence input a chunk's loads read, whose cotangent the backward stores."""

    Q = "q"
    K = "k"
    V = "v"
    G = "g"
    BETA = "beta"


@irdl_attr_definition
class LoadedInputAttr(EnumAttribute[LoadedInput], SpacedOpaqueSyntaxAttribute):
    name = "k3s.loaded_input"


@irdl_op_definition
class StoreCotangentOp(KeywordSyntax):
    """`k3s.store_cotangent %q_bar, %dq, %q <of = q, l2norm = true>`: the cotangent of a loaded
    input (the tile: the cotangent of the load's result), taken back through what the load did
    (l2norm; the gate's and beta's input forms, the load's properties, copied) and stored. Its
    tensors are the gradients, then the inputs they are of, pair by pair (g's input form: dg,
    dA_log, ddt_bias, then g, A_log, dt_bias). Inputs shared by several value heads (q and k of
    a group) sum their heads' cotangents."""

    name = "k3s.store_cotangent"
    of = prop_def(LoadedInputAttr)
    l2norm = opt_prop_def(BoolAttr)
    gate_input = opt_prop_def(GateInputAttr)
    lower_bound = opt_prop_def(FloatAttr)
    floor = opt_prop_def(FloatAttr)  # the gate load's: no cotangent where the form's g lies below it
    beta_input = opt_prop_def(BetaInputAttr)
    # the Triton backend's (lower-to-triton): where its rows are in the first gradient and input
    layout = opt_prop_def(TensorLayoutAttr)
    cotangent = operand_def(TileType)
    tensors = var_operand_def(TensorType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), MemoryWriteEffect())

    def verify_(self) -> None:
        if not self.tensors or len(self.tensors) % 2:
            raise VerifyException(f"{self.name}: takes gradient tensors and the inputs they are of, pair by pair; "
                                  f"got {len(self.tensors)} tensor(s)")
        verify_layout(self, self.tensors[0])
        names = [argument_name(t) for t in self.tensors]
        if None in names:
            return  # not (yet) an entry's or kernel's arguments: nothing to match by name
        gradients, inputs = names[: len(names) // 2], names[len(names) // 2:]
        if inputs[0] != self.of.data or gradients != [f"d{name}" for name in inputs]:
            raise VerifyException(f"{self.name}: of = {self.of.data} stores d<input> for each input read, first "
                                  f"{self.of.data}; got gradients {', '.join(gradients)} of {', '.join(inputs)}")

    @property
    def gradients(self):
        return self.tensors[: len(self.tensors) // 2]

    @property
    def inputs(self):
        return self.tensors[len(self.tensors) // 2:]


ADJOINT_STAGES = [AddOp, SubOp, MulOp, NegOp, DotOp, ScaleOp, ReduceSumOp, MaskOp, DiagonalOp, GatedContractionOp, PairDecayOp,
                  ReverseCumsumOp, OntoLastRowOp, UnitLowerInverseOp, StoreCotangentOp]
