"""What the Triton backend's passes (backends/triton/lower.py, legalize.py) write on stages and
kernels before printing, as typed attributes (a load's register dtype, a workspace's layout, a
block sized at launch): the passes that build them leave them absent, and the printer reads them."""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, Operation, ParametrizedAttribute, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3s.types import ShapeSymbol, ShapeSymbolAttr


class RegisterDtype(Word):
    """The dtype a load keeps its rows in, in registers."""

    INPUT = "input"  # the tensor's own (bf16 inputs: half the registers of fp32); the stages upcast
    FP32 = "fp32"  # converted as loaded


@irdl_attr_definition
class RegisterDtypeAttr(EnumAttribute[RegisterDtype], SpacedOpaqueSyntaxAttribute):
    name = "k3s.register_dtype"


class DiagonalRows(Word):
    """Where the elementwise blocks of a Gram's diagonal (k3s.gram <diagonal = elementwise or
    guarded>) take column r of every block from: its key row and log-decay."""

    RELOAD = "reload"  # from memory, as the key and gate loads read them (the Gram's tensors)
    EXTRACT = "extract"  # picked out of the keys and G, [NB, SUB, BK] tiles in registers


@irdl_attr_definition
class DiagonalRowsAttr(EnumAttribute[DiagonalRows], SpacedOpaqueSyntaxAttribute):
    name = "k3s.diagonal_rows"


class LayoutAxis(Word):
    """An axis of a tensor's layout (TensorLayoutAttr): what indexes it in a program."""

    TOKEN = "token"  # a row per token of the batch's sequences (B x T as one axis): the chunk's rows
    CHUNK = "chunk"  # a row per chunk of every sequence (NC): the program's chunk
    HEAD = "head"  # the value head (HV)
    KEY_HEAD = "key_head"  # the query and key head (H) that the program's value head reads
    PART = "part"  # the value block whose part of a sum the row holds (a fixed count)
    CHECKPOINT = "checkpoint"  # a checkpoint of the call's sequences (NCK of them): the slot a chunk's state fills
    COLUMN = "column"  # a dimension of the tile stored there (K, V or C): the tile's own offsets


@irdl_attr_definition
class LayoutAxisAttr(EnumAttribute[LayoutAxis], SpacedOpaqueSyntaxAttribute):
    name = "k3s.layout_axis"


@irdl_attr_definition
class TensorLayoutAttr(ParametrizedAttribute):
    """Where a kernel finds its rows in a tensor: `#k3s.layout<token[T], head[HV], column[K]>`,
    the axes outermost first, each with its extent (a symbol or a fixed count), row-major: an
    axis's stride is the product of the extents after it (strides()). lower-to-triton writes it on
    each stage that stores tiles in a workspace or loads them from it (k3s.spill, k3s.reload, ...);
    the printer prints the address from it (one helper), deciding nothing."""

    name = "k3s.layout"
    axes: ArrayAttr[LayoutAxisAttr]
    extents: ArrayAttr[StringAttr]

    @staticmethod
    def of(*axes: tuple[str, str | int]) -> TensorLayoutAttr:
        """of(("token", "T"), ("head", "HV"), ("column", "K"))."""
        return TensorLayoutAttr(ArrayAttr([LayoutAxisAttr(LayoutAxis(axis)) for axis, _ in axes]),
                                ArrayAttr([StringAttr(str(extent)) for _, extent in axes]))

    @property
    def items(self) -> tuple[tuple[LayoutAxis, str], ...]:
        """((axis, extent), ...), outermost first."""
        return tuple((axis.data, extent.data) for axis, extent in zip(self.axes.data, self.extents.data, strict=True))

    def axes_words(self) -> tuple[LayoutAxis, ...]:
        """The axes, outermost first."""
        return tuple(axis.data for axis in self.axes.data)

    def strides(self) -> tuple[str, ...]:
        """Each axis's stride as a product of symbols: ("HV * K", "K", "1") for token, head, column."""
        extents = [extent for _, extent in self.items]
        return tuple(" * ".join(extents[i + 1:]) or "1" for i in range(len(extents)))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        def parse_axis() -> tuple[str, str]:
            start = parser.pos
            word = parser.parse_identifier(" (a layout axis)")
            if word not in list(LayoutAxis):
                parser.raise_error(f"{cls.name}: an axis is one of {', '.join(LayoutAxis)}; got {word}", start, parser.pos)
            parser.parse_punctuation("[")
            extent = parser.parse_optional_integer(allow_boolean=False, allow_negative=False)
            extent = str(extent) if extent is not None else parser.parse_identifier(" (an extent)")
            parser.parse_punctuation("]")
            return word, extent

        items = parser.parse_comma_separated_list(parser.Delimiter.ANGLE, parse_axis)
        layout = cls.of(*items)
        return [layout.axes, layout.extents]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<" + ", ".join(f"{axis}[{extent}]" for axis, extent in self.items) + ">")

    def verify_fits(self, op_name: str, dims: tuple) -> None:
        """A VerifyException unless the layout fits a tensor of these dimensions: an axis a
        dimension (token: B x T), a fixed extent its dimension's size."""
        items, rows = self.items, [dim for dim in dims if dim != "B"]
        if (len(rows) != len(items) or any(extent.isdigit() and str(dim) != extent for dim, (_, extent) in zip(rows, items))
                or (items[0][0] == LayoutAxis.TOKEN) != (tuple(dims[:2]) == ("B", "T"))):
            raise VerifyException(f"{op_name}: layout {self} does not fit its tensor <{' x '.join(map(str, dims))}>")

    def verify(self) -> None:
        if len(self.axes.data) != len(self.extents.data):
            raise VerifyException(f"{self.name}: {len(self.axes.data)} axes but {len(self.extents.data)} extents")
        kinds = [axis for axis, _ in self.items]
        rows = [axis for axis in kinds if axis != LayoutAxis.COLUMN]
        if kinds[:len(rows)] != rows or len(set(rows)) != len(rows):
            raise VerifyException(f"{self.name}: each row axis at most once, before the columns; got {', '.join(kinds)}")


def verify_layout(op: Operation, tensor: SSAValue) -> None:
    """op's layout, where lower-to-triton wrote one, fits the tensor whose rows it addresses; a
    key_head axis's heads are its kernel's key_heads, where lower-to-triton wrote them."""
    if op.layout is None:
        return
    op.layout.verify_fits(op.name, tensor.type.dims)
    rows = [dim for dim in tensor.type.dims if dim != "B"]
    heads = [rows[i] for i, (axis, _) in enumerate(op.layout.items) if axis == LayoutAxis.KEY_HEAD]
    if heads and isinstance(heads[0], int) and (key_heads := kernel_key_heads(op)) is not None and heads[0] != key_heads:
        raise VerifyException(f"{op.name}: %{tensor.name_hint} has {heads[0]} key heads, its kernel's key_heads is "
                              f"{key_heads}")


def kernel_key_heads(op: Operation) -> int | None:
    """The key_heads of the k3s.kernel op is in, None where it has none (yet)."""
    while (op := op.parent_op()) is not None:
        if op.name == "k3s.kernel":
            key_heads = op.properties.get("key_heads")
            return None if key_heads is None else key_heads.value.data
    return None


@irdl_attr_definition
class RuntimeBlockAttr(ParametrizedAttribute):
    """A block that holds all of a size known only at run time: `#k3s.runtime_block<Q, least =
    16>`, the next power of two of the call's Q, at least `least` (tl.dot's operands take 16
    rows; absent: 1). Each launch computes it from the call's sizes; legalize-triton writes it
    as a kernel's block size where the kernel takes all of them at once (Block AttnRes's folded
    queries), and the printer prints that expression."""

    name = "k3s.runtime_block"
    size: ShapeSymbolAttr
    least: IntAttr

    @staticmethod
    def of(size: str, least: int = 1) -> RuntimeBlockAttr:
        return RuntimeBlockAttr(ShapeSymbolAttr(ShapeSymbol(size)), IntAttr(least))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        parser.parse_punctuation("<")
        start = parser.pos
        size = parser.parse_identifier(" (a shape symbol)")
        if size not in list(ShapeSymbol):
            parser.raise_error(f"{cls.name}: a shape symbol, one of {', '.join(ShapeSymbol)}; got {size}", start, parser.pos)
        least = 1
        if parser.parse_optional_punctuation(","):
            parser.parse_keyword("least")
            parser.parse_punctuation("=")
            least = parser.parse_integer(allow_boolean=False, allow_negative=False)
        parser.parse_punctuation(">")
        block = cls.of(size, least)
        return [block.size, block.least]

    def print_parameters(self, printer: Printer) -> None:
        least = f", least = {self.least.data}" if self.least.data != 1 else ""
        printer.print_string(f"<{self.size.data.value}{least}>")

    def verify(self) -> None:
        if self.least.data < 1 or self.least.data & (self.least.data - 1):
            raise VerifyException(f"{self.name}: least must be a power of two, got {self.least.data}")
