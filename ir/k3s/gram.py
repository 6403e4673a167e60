"""The chunkwise schedule's gate and Gram stages, as ops on tile values: the gates' cumulative
sums, totals and decays, their application to keys and queries, the row blocks' reference gates
and factors, and the Gram matrices (key-key with beta for the delta rule, query-key for the
output) that those factors make safe for any gate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr, i1
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
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
from xdsl.traits import HasParent, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Gate, Word
from k3compile.ir.k3 import GateAttr
from k3compile.ir.k3s.chunk_loops import CHUNK_LOCAL_PARENTS
from k3compile.ir.k3s.target import DiagonalRows, DiagonalRowsAttr
from k3compile.ir.k3s.types import GATED, TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax, attr_to_literal


class Mask(Word):
    STRICT = "strict"
    INCLUSIVE = "inclusive"


@irdl_attr_definition
class MaskAttr(EnumAttribute[Mask], SpacedOpaqueSyntaxAttribute):
    name = "k3s.mask"


class GateAnchor(Word):
    START = "start"
    END = "end"


@irdl_attr_definition
class GateAnchorAttr(EnumAttribute[GateAnchor], SpacedOpaqueSyntaxAttribute):
    name = "k3s.gate_anchor"


class GramDiagonal(Word):
    """How a channel-gated Gram evaluates its diagonal sub-chunk blocks: factored (two
    tensor-core factors, exponents up to sub_chunk tokens of decay: needs a bounded gate),
    elementwise (exp of differences, exponents <= 0 for any gate) or guarded (factored in the
    chunks whose k3s.block_span_check holds, elementwise in the others: any gate, and tensor
    cores wherever the decays allow them)."""

    FACTORED = "factored"
    ELEMENTWISE = "elementwise"
    GUARDED = "guarded"

    @property
    def has_factor(self) -> bool:
        return self is not GramDiagonal.ELEMENTWISE

    @property
    def reloads(self) -> bool:
        return self is not GramDiagonal.FACTORED


@irdl_attr_definition
class GramDiagonalAttr(EnumAttribute[GramDiagonal], SpacedOpaqueSyntaxAttribute):
    name = "k3s.gram_diagonal"


class BlockDecay(Word):
    """How k3s.block_rescale decays a row relative to its block's reference."""

    ROW_OVER_REFERENCE = "row_over_reference"  # X_i Gamma_i / Gamma_ref
    REFERENCE_OVER_ROW = "reference_over_row"  # X_i Gamma_ref / Gamma_i


@irdl_attr_definition
class BlockDecayAttr(EnumAttribute[BlockDecay], SpacedOpaqueSyntaxAttribute):
    name = "k3s.block_decay"


@irdl_op_definition
class GateCumsumOp(KeywordSyntax):
    """G_r = sum_{i<=r} g_i within the chunk (per key channel or per head)."""

    name = "k3s.gate_cumsum"
    gate = prop_def(GATED)
    log_gate = operand_def(TileType)
    cumulative = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


@irdl_op_definition
class BlockGatesOp(KeywordSyntax):
    """The references a channel-gated Gram splits its decays at, per row block of `sub_chunk`
    rows ([NB, K], NB = C / sub_chunk): G just before the block's first row (gate_start; 0 for the
    first block) and at its last row (gate_end). A row only meets references at or before itself,
    so no output depends on a later gate."""

    name = "k3s.block_gates"
    sub_chunk = prop_def(IntegerAttr[I64])
    cumulative_gate = operand_def(TileType)
    gate_start = result_def(TileType)
    gate_end = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        if self.sub_chunk.value.data <= 0:
            raise VerifyException(f"{self.name}: sub_chunk must be positive, got {self.sub_chunk.value.data}")


@irdl_op_definition
class BlockSpanCheckOp(KeywordSyntax):
    """Whether no row block of the chunk spans more than `limit` nats of decay in any key channel
    (G_start - G_end <= limit for every block and channel, k3s.block_gates' references): where
    it holds, a diagonal factor (the keys rescaled by up to e^limit) stays inside the range of
    the dtype it is formed in, so a guarded Gram may factor its diagonal blocks."""

    name = "k3s.block_span_check"
    limit = prop_def(FloatAttr)
    gate_start = operand_def(TileType)
    gate_end = operand_def(TileType)
    fits = result_def(i1)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        if not self.limit.value.data > 0:
            raise VerifyException(f"{self.name}: limit must be positive, got {self.limit.value.data}")


@irdl_op_definition
class BlockRescaleOp(KeywordSyntax):
    """Rows decayed relative to their row block's reference (a k3s.block_gates result): a factor
    of a channel-gated Gram, a tensor-core operand.

        row_over_reference:  X_i Gamma_i / Gamma_ref(I)   (left factor, reference gate_start: <= 1)
        reference_over_row:  X_i Gamma_ref(I) / Gamma_i   (right factor, reference gate_end: <= 1;
                                                           diagonal factor, gate_start: >= 1)
    """

    name = "k3s.block_rescale"
    decay = prop_def(BlockDecayAttr)
    rows = operand_def(TileType)
    cumulative_gate = operand_def(TileType)
    reference = operand_def(TileType)
    factor = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


# the operands a Gram takes besides lhs and keys, in order, each with what it is and the
# properties under which (and only under which) it is present
_OPTIONAL_TILES = (
    ("cumulative_gate", "G, the gate's cumulative sum", "gate = scalar or channel"),
    ("gate_start", "the row blocks' references at their start, k3s.block_gates'", "gate = channel"),
    ("gate_end", "the row blocks' references at their end, k3s.block_gates'", "gate = channel"),
    ("left_factor", "lhs rescaled row_over_reference from gate_start", "gate = channel"),
    ("right_factor", "the keys rescaled reference_over_row to gate_end", "gate = channel"),
    ("diagonal_factor", "the keys rescaled reference_over_row to gate_start", "diagonal = factored or guarded"),
    ("row_scale", "beta, the rows' scale", "beta = true"),
)


def _gram_takes(gate: str | None, beta: bool, diagonal: GramDiagonal | None) -> dict[str, bool]:
    """Which of a Gram's optional tile operands its properties ask for."""
    channel = gate == Gate.CHANNEL
    return {"cumulative_gate": gate in (Gate.SCALAR, Gate.CHANNEL), "gate_start": channel, "gate_end": channel,
            "left_factor": channel, "right_factor": channel,
            "diagonal_factor": channel and diagonal is not None and diagonal.has_factor, "row_scale": beta}


@irdl_op_definition
class GramOp(KeywordSyntax):
    """A gated Gram matrix of the chunk, masked lower-triangular:

        lhs = k: A = Tril_mask( Diag(beta) (Gamma*K) (K/Gamma)^T )     (the delta rule's A)
        lhs = q: P = Tril_mask( (Gamma*Q) (K/Gamma)^T )                 (intra-chunk scores)

    mask strict excludes the diagonal, inclusive keeps it; gate none means Gamma = 1; `beta`
    scales the rows by beta. Operands (each present exactly when the properties ask for it): lhs
    (q or k), the keys, then with a gate G, then with a channel gate the row blocks' references
    (gate_start, gate_end of k3s.block_gates) and the factors: left (lhs rescaled
    row_over_reference from gate_start), right (the keys rescaled reference_over_row to gate_end)
    and, unless the diagonal is elementwise, the diagonal factor (the keys rescaled
    reference_over_row to gate_start); then beta (row_scale) when `beta`; then a guarded
    diagonal's k3s.block_span_check (factored_guard). A block below the diagonal is left_I
    (right_J)^T bridged by the decay Gamma_start(I) / Gamma_end(J) between the two references: no
    exponent is positive. `diagonal` says how the blocks on the diagonal are evaluated
    (GramDiagonal); only a channel gate has it. An elementwise (or guarded) diagonal reloads key
    rows and log-decays from memory as the key and gate loads read them: last, the tensors they
    read (k, g, and A_log, dt_bias when the gate's input form reads them), where lower-to-triton
    chooses (diagonal_rows = reload) to reload them rather than extract them from the tiles in
    registers (extract); `unroll`, also lower-to-triton's, unrolls a channel gate's loop over
    the blocks below the diagonal.

    The custom syntax prints the operands in this order, without their names: the properties
    and the operands' types (tiles, then an i1, then tensors) say which is which.
    """

    name = "k3s.gram"
    mask = prop_def(MaskAttr)
    gate = prop_def(GateAttr)
    beta = prop_def(BoolAttr)
    diagonal = opt_prop_def(GramDiagonalAttr)
    # the Triton backend's (lower-to-triton): a channel gate's loop over the blocks below the
    # diagonal unrolled; where an elementwise diagonal takes its rows from (DiagonalRows)
    unroll = opt_prop_def(BoolAttr)
    diagonal_rows = opt_prop_def(DiagonalRowsAttr)
    lhs = operand_def(TileType)
    keys = operand_def(TileType)
    cumulative_gate = opt_operand_def(TileType)
    gate_start = opt_operand_def(TileType)
    gate_end = opt_operand_def(TileType)
    left_factor = opt_operand_def(TileType)
    right_factor = opt_operand_def(TileType)
    diagonal_factor = opt_operand_def(TileType)
    row_scale = opt_operand_def(TileType)
    factored_guard = opt_operand_def(i1)  # a guarded diagonal's k3s.block_span_check: whether its blocks factor
    tensors = var_operand_def(TensorType)  # what an elementwise diagonal reads: k, g (and A_log, dt_bias)
    gram = result_def(TileType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def __init__(self, lhs: SSAValue, keys: SSAValue, *, mask: str, gate: str, beta: bool,
                 diagonal: str | None = None, result_type: TileType, cumulative_gate: SSAValue | None = None,
                 gate_start: SSAValue | None = None, gate_end: SSAValue | None = None,
                 left_factor: SSAValue | None = None, right_factor: SSAValue | None = None,
                 diagonal_factor: SSAValue | None = None, row_scale: SSAValue | None = None,
                 factored_guard: SSAValue | None = None, tensors: Sequence[SSAValue] = (),
                 unroll: bool | None = None, diagonal_rows: str | None = None):
        properties = {"mask": MaskAttr(Mask(mask)), "gate": GateAttr(Gate(gate)), "beta": BoolAttr.from_bool(beta),
                      "diagonal": GramDiagonalAttr(GramDiagonal(diagonal)) if diagonal is not None else None,
                      "unroll": BoolAttr.from_bool(unroll) if unroll is not None else None,
                      "diagonal_rows": DiagonalRowsAttr(DiagonalRows(diagonal_rows)) if diagonal_rows else None}
        super().__init__(operands=[lhs, keys, cumulative_gate, gate_start, gate_end, left_factor, right_factor,
                                   diagonal_factor, row_scale, factored_guard, tensors],
                         properties=properties, result_types=[result_type])

    def rebuilt(self, value: Callable[[SSAValue], SSAValue] = lambda v: v, **changes) -> GramOp:
        """This Gram again, a new op (not inserted): its operands mapped by `value`, and `changes`
        (properties as __init__ takes them, operands by name, None for an absent one) applied."""
        named = {name: getattr(self, name) for name in GRAM_OPERANDS}
        named = {name: v if v is None else value(v) for name, v in named.items()}
        named["tensors"] = [value(v) for v in self.tensors]
        properties = {"mask": self.mask.data, "gate": self.gate.data, "beta": bool(self.beta.value.data),
                      "diagonal": self.diagonal and self.diagonal.data,
                      "unroll": None if self.unroll is None else bool(self.unroll.value.data),
                      "diagonal_rows": self.diagonal_rows and self.diagonal_rows.data}
        merged = {**named, **properties, **changes}
        return GramOp(merged.pop("lhs"), merged.pop("keys"), result_type=self.gram.type, **merged)

    @classmethod
    def operand_segment_sizes(cls, operands: Sequence[SSAValue], properties: Mapping[str, Attribute]) -> list[int]:
        """The operand segments of a Gram printed with `operands` (by type: tiles, then a
        guard, then tensors) and `properties`: which tiles are which is what the properties ask
        for. Raises ValueError where they cannot say."""
        kinds = [0 if isinstance(v.type, TileType) else 2 if isinstance(v.type, TensorType) else 1 for v in operands]
        if kinds != sorted(kinds):
            raise ValueError(f"{cls.name}: its operands are its tiles, then a guard, then tensors")
        gate, beta, diagonal = (properties.get(key) for key in ("gate", "beta", "diagonal"))
        takes = _gram_takes(gate.data if isinstance(gate, GateAttr) else None,
                            isinstance(beta, IntegerAttr) and bool(beta.value.data),
                            diagonal.data if isinstance(diagonal, GramDiagonalAttr) else None)
        tiles = ["lhs", "keys", *(name for name, _, _ in _OPTIONAL_TILES if takes[name])]
        if kinds.count(0) != len(tiles):
            raise ValueError(f"{cls.name}: its properties take {len(tiles)} tile operands ({', '.join(tiles)}), "
                             f"got {kinds.count(0)}")
        return [1, 1, *(int(takes[name]) for name, _, _ in _OPTIONAL_TILES), kinds.count(1), kinds.count(2)]

    def verify_(self) -> None:
        if (self.diagonal is not None) != (self.gate.data == Gate.CHANNEL):
            raise VerifyException(f"{self.name}: diagonal is set exactly when gate = channel; "
                                  f"got gate {self.gate.data!r}, diagonal {self.diagonal and self.diagonal.data!r}")
        diagonal = self.diagonal and self.diagonal.data
        takes = _gram_takes(self.gate.data, bool(self.beta.value.data), diagonal)
        for name, what, when in _OPTIONAL_TILES:
            if takes[name] and getattr(self, name) is None:
                raise VerifyException(f"{self.name}: with {when} it takes {name} ({what}); it has none")
            if not takes[name] and getattr(self, name) is not None:
                raise VerifyException(f"{self.name}: {name} ({what}) is an operand only with {when}; "
                                      f"it has one with {self.properties_text()}")
        if (self.factored_guard is not None) != (diagonal == GramDiagonal.GUARDED):
            raise VerifyException(f"{self.name}: a guarded diagonal (and only it) takes a k3s.block_span_check "
                                  f"operand (factored_guard); got {int(self.factored_guard is not None)} with "
                                  f"diagonal {diagonal!r}")
        reloads = diagonal is not None and diagonal.reloads
        if reloads and len(self.tensors) not in (2, 4):
            raise VerifyException(f"{self.name}: an elementwise diagonal reads k and g (and A_log, dt_bias with "
                                  f"an in-kernel gate), got {len(self.tensors)} tensor operands")
        if not reloads and self.tensors:
            raise VerifyException(f"{self.name}: only an elementwise or guarded diagonal reads tensors; got "
                                  f"{len(self.tensors)} with {self.properties_text()}")
        if self.diagonal_rows is not None and not reloads:
            raise VerifyException(f"{self.name}: diagonal_rows is a choice of an elementwise or guarded diagonal "
                                  f"only; got it with {self.properties_text()}")
        if self.unroll is not None and self.gate.data != Gate.CHANNEL:
            raise VerifyException(f"{self.name}: unroll is a choice of a channel gate's loop over the blocks "
                                  f"below the diagonal only; got it with {self.properties_text()}")

    def properties_text(self) -> str:
        return ", ".join(f"{key} = {attr_to_literal(value)}" for key, value in self.keyword_items())


GRAM_OPERANDS = ("lhs", "keys", *(name for name, _, _ in _OPTIONAL_TILES), "factored_guard")
"""A Gram's single operands by name, in order (its tensors follow them)."""


@irdl_op_definition
class GateTotalOp(KeywordSyntax):
    """G_C: the chunk's whole log-decay, G at its last row (rows past a sequence's end add 0),
    per key channel or per head."""

    name = "k3s.gate_total"
    gate = prop_def(GATED)
    cumulative_gate = operand_def(TileType)
    total = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


@irdl_op_definition
class GateApplyOp(KeywordSyntax):
    """A chunk operand with the gate's decay applied, for the state pass:

        anchor = start:  QG = Gamma * Q              (decay since the chunk's start)
        anchor = end:    KG = (gamma_C / Gamma) * K  (decay until the chunk's end; G_C an operand)

    Both exponents are <= 0: no overflow for any gate."""

    name = "k3s.gate_apply"
    anchor = prop_def(GateAnchorAttr)
    gate = prop_def(GATED)
    rows = operand_def(TileType)
    cumulative_gate = operand_def(TileType)
    total = opt_operand_def(TileType)
    decayed = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        if (self.total is None) != (self.anchor.data == "start"):
            raise VerifyException(f"{self.name}: G_C is an operand exactly when anchor = end")


@irdl_op_definition
class ChunkDecayOp(KeywordSyntax):
    """gamma_C = exp(G_C): the decay of the whole chunk, per key channel or per head."""

    name = "k3s.chunk_decay"
    gate = prop_def(GATED)
    total = operand_def(TileType)
    decay = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


GATE_AND_GRAM_STAGES = [GateCumsumOp, GateTotalOp, ChunkDecayOp, GateApplyOp, BlockGatesOp, BlockSpanCheckOp,
                        BlockRescaleOp, GramOp]
