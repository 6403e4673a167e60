"""Small builders shared by the lowering passes."""

from __future__ import annotations

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, StringAttr, f64, i64
from xdsl.ir import Attribute, Block, Operation, Region


def props(**values) -> dict[str, Attribute]:
    """Python values -> property attributes (str, int, float)."""
    out: dict[str, Attribute] = {}
    for key, value in values.items():
        if isinstance(value, str):
            out[key] = StringAttr(value)
        elif isinstance(value, int):
            out[key] = IntegerAttr(value, i64)
        else:
            out[key] = FloatAttr(value, f64)
    return out


def region(ops: list[Operation]) -> Region:
    return Region(Block(ops))


def make(op_type: type[Operation], body: list[Operation] | None = None, **values) -> Operation:
    """Create a k3s op from keyword properties (`sym_name` for the symbol) and an optional body."""
    return op_type.create(properties=props(**values), regions=[region(body)] if body is not None else [])
