"""What the Triton backend's lower-to-triton pass (backends/triton/lower.py) writes on stages
before printing, as typed attributes: the passes that build the stages leave them absent, and
the printer reads them."""

from __future__ import annotations

from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import SpacedOpaqueSyntaxAttribute
from xdsl.irdl import irdl_attr_definition

from k3compile.ir.choices import Word


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
