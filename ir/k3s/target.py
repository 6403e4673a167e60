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
