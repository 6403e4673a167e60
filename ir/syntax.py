"""The custom assembly format shared by k3 and k3s ops.

Every op prints as

    k3.op_name @symbol <key = value, ...> { region }

where the symbol and region are present only if the op has them, and the keyword list holds
the op's properties in declaration order. Values are integers, floats (always printed with a
'.' or an exponent, so they re-parse as floats), booleans bare identifiers (enum values) and
quoted strings.
"""

from __future__ import annotations

import json
import re
from typing import ClassVar

from xdsl.dialects.builtin import (
    BoolAttr,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Region
from xdsl.irdl import IRDLOperation
from xdsl.parser import Parser
from xdsl.printer import Printer


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")


def attr_to_literal(attr: Attribute) -> str:
    if isinstance(attr, IntegerAttr):
        if attr.type == IntegerType(1):
            return "true" if attr.value.data else "false"
        return str(attr.value.data)
    if isinstance(attr, FloatAttr):
        text = repr(float(attr.value.data))
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa and mantissa.lstrip("-").isdigit():  # 1e-06 -> 1.0e-06: lexes as a float
            text = mantissa + ".0" + ("e" + exponent if exponent else "")
        return text
    if isinstance(attr, StringAttr):
        bare = _IDENTIFIER.fullmatch(attr.data) and attr.data not in ("true", "false")
        return attr.data if bare else json.dumps(attr.data)
    raise TypeError(f"no keyword syntax for attribute {attr}")


def literal_to_attr(parser: Parser) -> Attribute:
    number = parser.parse_optional_number()
    if number is not None:
        return FloatAttr(number, f64) if isinstance(number, float) else IntegerAttr(number, i64)
    text = parser.parse_optional_str_literal()
    if text is not None:
        return StringAttr(text)
    word = parser.parse_identifier(" (a number, a string, true/false, or an enum keyword)")
    if word in ("true", "false"):
        return BoolAttr.from_bool(word == "true")
    return StringAttr(word)


class KeywordSyntax(IRDLOperation):
    """Mixin giving an op the `@symbol <key = value, ...> {region}` syntax."""

    SYMBOL_PROP: ClassVar[str] = "sym_name"

    def print(self, printer: Printer) -> None:
        symbol = self.properties.get(self.SYMBOL_PROP)
        if isinstance(symbol, StringAttr):
            printer.print_string(" ")
            printer.print_symbol_name(symbol.data)
        items = [(k, v) for k, v in self.properties.items() if k != self.SYMBOL_PROP]
        if items:
            printer.print_string(" <")
            printer.print_list(
                items, lambda kv: printer.print_string(f"{kv[0]} = {attr_to_literal(kv[1])}")
            )
            printer.print_string(">")
        for region in self.regions:
            printer.print_string(" ")
            printer.print_region(region)

    @classmethod
    def parse(cls, parser: Parser):
        properties: dict[str, Attribute] = {}
        symbol = parser.parse_optional_symbol_name()
        if symbol is not None:
            properties[cls.SYMBOL_PROP] = symbol
        if parser.parse_optional_punctuation("<") is not None:

            def parse_item() -> None:
                key = parser.parse_identifier(" (a property name)")
                parser.parse_punctuation("=")
                properties[key] = literal_to_attr(parser)

            parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_item)
            parser.parse_punctuation(">")
        regions: list[Region] = []
        while (region := parser.parse_optional_region()) is not None:
            regions.append(region)
        return cls.create(properties=properties, regions=regions)
