"""The types of the k3s schedule dialect: tiles (a value in one program's registers) and tensors
(an entry's argument: shape pattern and dtype class), with the vocabularies they use."""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, IntAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, ParametrizedAttribute, SpacedOpaqueSyntaxAttribute, TypeAttribute
from xdsl.irdl import AnyOf, irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Gate, Word
from k3compile.ir.k3 import GateAttr


class ArgDtype(Word):
    FLOAT = "float"
    FLOAT32 = "float32"
    OFFSETS = "offsets"
    STATE = "state"
    INDEX = "index"
    FP4X2 = "fp4x2"
    FP4X8 = "fp4x8"
    E8M0 = "e8m0"


@irdl_attr_definition
class ArgDtypeAttr(EnumAttribute[ArgDtype], SpacedOpaqueSyntaxAttribute):
    name = "k3s.arg_dtype"


# the gate of stages that exist only with one (k3.gate's words but none)
GATED = AnyOf.get(GateAttr(Gate.CHANNEL), GateAttr(Gate.SCALAR))


class ShapeSymbol(Word):
    """A tensor dimension the compiled entry learns from its arguments at run time (TensorType)."""

    B = "B"  # batch
    T = "T"  # tokens per sequence
    N = "N"  # sequences: B, or len(cu_seqlens) - 1
    N_PLUS_1 = "N+1"  # the sequence offsets
    S = "S"  # AttnRes sources
    P = "P"  # state pool rows
    NC = "NC"  # per-chunk slots
    R = "R"  # token rows of a [tokens, hidden] input
    PP = "PP"  # positions of an MoE dispatch plan's expert-sorted pair list (k3s.sort_pairs)
    PB = "PB"  # its blocks
    HS = "HS"  # the MoE router's hidden slices at this call (k3s.launch_by_rows <hidden_slices>)
    Q = "Q"  # the queries of a Block AttnRes block


@irdl_attr_definition
class ShapeSymbolAttr(EnumAttribute[ShapeSymbol], SpacedOpaqueSyntaxAttribute):
    name = "k3s.shape_symbol"


Dim = int | ShapeSymbol
"""A tensor dimension: a fixed size or a shape symbol."""


class TileDim(Word):
    """A dimension of a tile (TileType), a symbol for a size its kernel fixes."""

    C = "C"  # a chunk's token rows
    NB = "NB"  # its row blocks, k3s.block_gates
    K = "K"  # key channels
    V = "V"  # the program's value columns
    D = "D"  # AttnRes's hidden columns
    R = "R"  # the program's block of token rows, MoE routing
    E = "E"  # the program's experts: a block of them on an expert_block grid axis, else every expert
    KS = "KS"  # the top-k slots of a row
    M = "M"  # an MoE projection's rows: token rows, sorted (token, slot) pairs, or one
    N = "N"  # its block of output columns
    Q = "Q"  # the program's block of a Block AttnRes block's queries, k3s.fold_query <queries>
    S = "S"  # a row's Block AttnRes representatives, all of them: k3s.load_source_columns


@irdl_attr_definition
class TileDimAttr(EnumAttribute[TileDim], SpacedOpaqueSyntaxAttribute):
    name = "k3s.tile_dim"


@irdl_attr_definition
class TileType(ParametrizedAttribute, TypeAttribute):
    """A value held in one program's registers: `!k3s.tile<C x K>` over TileDim's symbols; `<C>`
    one number per row, `<>` one number. Stages compute in fp32; loads keep the input dtype until
    a stage upcasts."""

    name = "k3s.tile"
    dims: ArrayAttr[TileDimAttr]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[ArrayAttr[TileDimAttr]]:
        parser.parse_punctuation("<")
        dims: list[TileDimAttr] = []
        if parser.parse_optional_punctuation(">") is None:
            dims.append(cls._parse_dim(parser))
            while parser.parse_optional_keyword("x") is not None:
                dims.append(cls._parse_dim(parser))
            parser.parse_punctuation(">")
        return [ArrayAttr(dims)]

    @classmethod
    def _parse_dim(cls, parser: AttrParser) -> TileDimAttr:
        start = parser.pos
        word = parser.parse_identifier(f" (a tile dimension: one of {', '.join(TileDim)})")
        if word not in list(TileDim):
            parser.raise_error(f"{cls.name}: unknown dimension {word!r}; allowed: {', '.join(TileDim)}",
                               start, parser.pos)
        return TileDimAttr(TileDim(word))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<" + " x ".join(d.data for d in self.dims.data) + ">")


# An op whose result i takes the storage of its operand j declares IN_PLACE = {i: j} (a state
# advanced, a running softmax updated): backends keep the two in one register or buffer.


def tile(*dims: str) -> TileType:
    """`tile("C", "K")`: a tile over these TileDim words (ValueError for any other word)."""
    return TileType(ArrayAttr([TileDimAttr(TileDim(d)) for d in dims]))


def is_power_of_two(value: int) -> bool:
    return value > 0 and not value & (value - 1)  # 0 & -1 is 0 as well: 0 needs the sign test


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """An entry's tensor argument: `!k3s.tensor<B x T x 32 x 128, float>`, its shape pattern and
    dtype class. A dimension is a positive integer or a ShapeSymbol (B, T, N, N+1, S, P, NC, R,
    PP, PB, HS, Q); the dtype class is one of ArgDtype's words (what each takes: TensorArgOp).
    The compiled entry checks an argument against it at run time."""

    name = "k3s.tensor"
    shape: ArrayAttr[IntAttr | ShapeSymbolAttr]
    dtype: ArgDtypeAttr

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        parser.parse_punctuation("<")
        shape = [cls._parse_dim(parser)]
        while parser.parse_optional_keyword("x") is not None:
            shape.append(cls._parse_dim(parser))
        parser.parse_punctuation(",", " (then the dtype class)")
        start = parser.pos
        word = parser.parse_identifier(" (a dtype class)")
        if word not in list(ArgDtype):
            parser.raise_error(f"{cls.name}: the dtype class must be one of {', '.join(ArgDtype)}; got {word}",
                               start, parser.pos)
        parser.parse_punctuation(">")
        return [ArrayAttr(shape), ArgDtypeAttr(ArgDtype(word))]

    @classmethod
    def _parse_dim(cls, parser: AttrParser) -> IntAttr | ShapeSymbolAttr:
        """`32`, `B`, or a symbol plus a number (`N+1`: the lexer reads `N`, `+`, `1`)."""
        number = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
        if number is not None:
            return IntAttr(number)
        start = parser.pos
        symbol = parser.parse_identifier(f" (a dimension: a positive integer or one of {', '.join(ShapeSymbol)})")
        if parser.parse_optional_punctuation("+") is not None:
            symbol += f"+{parser.parse_integer(allow_boolean=False, allow_negative=False)}"
        if symbol not in list(ShapeSymbol):
            parser.raise_error(f"{cls.name}: bad dimension {symbol!r}; a positive integer or one of "
                               f"{', '.join(ShapeSymbol)}", start, parser.pos)
        return ShapeSymbolAttr(ShapeSymbol(symbol))

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{' x '.join(map(str, self.dims))}, {self.dtype_class}>")

    def verify(self) -> None:
        if not self.shape.data:
            raise VerifyException(f"{self.name}: a tensor has at least one dimension")
        if bad := [dim.data for dim in self.shape.data if isinstance(dim, IntAttr) and dim.data <= 0]:
            raise VerifyException(f"{self.name}: bad dimension {bad[0]}; a positive integer or one of "
                                  f"{', '.join(ShapeSymbol)}")

    @property
    def dims(self) -> tuple[Dim, ...]:
        """The dimensions, each a fixed size or a shape symbol: ("B", "T", 32, 128)."""
        return tuple(dim.data for dim in self.shape.data)

    @property
    def pattern(self) -> str:
        """The dimensions as the runtime's shape pattern: "B,T,32,128"."""
        return ",".join(map(str, self.dims))

    @property
    def dtype_class(self) -> str:
        return self.dtype.data.value

    def with_dtype(self, dtype: str) -> TensorType:
        return tensor(*self.dims, dtype=dtype)


def tensor(*dims: int | str, dtype: str) -> TensorType:
    """`tensor("B", "T", 32, 128, dtype="float")`: a number is a fixed size, a word a shape symbol
    (ValueError for any other word)."""
    shape = [IntAttr(d) if isinstance(d, int) else ShapeSymbolAttr(ShapeSymbol(d)) for d in dims]
    return TensorType(ArrayAttr(shape), ArgDtypeAttr(ArgDtype(dtype)))


def tile_dims(value) -> tuple[TileDim, ...]:
    """The dimension symbols of a tile value's type, e.g. ("C", "K")."""
    return tuple(d.data for d in value.type.dims.data)


def dims_text(dims: tuple[str, ...]) -> str:
    """Tile dimensions as the type prints them: <C x K>."""
    return "<" + " x ".join(dims) + ">"


def expect_dims(op, what: str, got: tuple[str, ...], want: tuple[str, ...]) -> None:
    """A verifier's check that a tile has the dimensions it must: a one-line VerifyException."""
    if got != want:
        raise VerifyException(f"{op.name}: {what} must be {dims_text(want)}, got {dims_text(got)}")
