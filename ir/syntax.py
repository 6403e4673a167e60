"""The custom assembly format shared by k3 and k3s ops.

Every op prints as

    %result = k3s.op_name @symbol %operand, ... <key = value, ...> { region } : result types

where the results, symbol, operands, region and types are present only if the op has them, and
the keyword list holds the op's properties in declaration order. Operands are values defined
before their use (earlier ops of the block, or block arguments of an enclosing region): the
syntax prints no operand types, so an operand takes the type of its definition. An op with
several optional or variadic operands (AttrSizedOperandSegments) prints them in order without
their segment sizes; its `operand_segment_sizes` reads them back from the operands and the
properties. Values are integers, floats (always printed with a
'.', so they re-parse as floats), booleans, bare identifiers (enum values), quoted strings,
references to symbols of the module (`kernel = @kda_chunk_prepare`), types in their own syntax
(`type = !k3s.tensor<B x T x 32 x 128, float>`), lists (`grid = [chunk, value_head]`) and
dictionaries of them (`flags = {SPILL_P_QG = true}`). An op whose symbol is a reference (a
launch's kernel) prints it in the symbol's place: `k3s.launch @kda_chunk_prepare %q, ...`.
The parser rejects a repeated key, and reads each value as its property's declared constraint
asks: a word for an enum property is that enum attribute, an integer literal for a float
property is that float; anything else that does not fit is a parse error naming the op and the
property (and, for an enum or a list of enum values, the words it takes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    ArrayAttr,
    ArrayOfConstraint,
    BoolAttr,
    DenseArrayBase,
    DictionaryAttr,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    IntegerType,
    StringAttr,
    SymbolRefAttr,
    f64,
    i32,
    i64,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, ParametrizedAttribute, Region, SSAValue, TypeAttribute
from xdsl.irdl import AttrConstraint, AttrSizedOperandSegments, IRDLOperation
from xdsl.parser import Parser
from xdsl.printer import Printer


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")
# MLIR lexes `1e-06` as the integer 1 and an identifier: a float literal needs its '.'
_FLOAT_WITHOUT_DOT = re.compile(r"(-?[0-9]+)([eE][-+]?[0-9]+)")
# A literal of each kind, to name what a property's constraint accepts in errors.
_LITERAL_KINDS = (
    ("an integer", IntegerAttr(0, i64)),
    ("a float", FloatAttr(0.0, f64)),
    ("true or false", BoolAttr.from_bool(False)),
    ("a string or keyword", StringAttr("")),
    ("a list [...] of sizes", ArrayAttr([IntAttr(1)])),
)


def attr_to_literal(attr: Attribute) -> str:
    if isinstance(attr, IntAttr):  # a size (a list of them: a shape)
        return str(attr.data)
    if isinstance(attr, IntegerAttr):
        if attr.type == IntegerType(1):
            return "true" if attr.value.data else "false"
        return str(attr.value.data)
    if isinstance(attr, EnumAttribute):
        return attr.data.value
    if isinstance(attr, FloatAttr):
        text = repr(float(attr.value.data))
        mantissa, _, exponent = text.partition("e")
        if "." not in mantissa and mantissa.lstrip("-").isdigit():  # 1e-06 -> 1.0e-06: lexes as a float
            text = mantissa + ".0" + ("e" + exponent if exponent else "")
        return text
    if isinstance(attr, ParametrizedAttribute) and attr.name.startswith("k3s."):  # its own syntax: `#k3s.layout<...>`
        return str(attr)
    if isinstance(attr, TypeAttribute):  # its type syntax: `!k3s.tensor<B x T x 32 x 128, float>`
        return str(attr)
    if isinstance(attr, StringAttr):
        bare = _IDENTIFIER.fullmatch(attr.data) and attr.data not in ("true", "false")
        return attr.data if bare else json.dumps(attr.data)
    if isinstance(attr, SymbolRefAttr):
        return str(attr)  # `@name`, quoted where the name is no bare identifier
    if isinstance(attr, ArrayAttr):
        return "[" + ", ".join(attr_to_literal(item) for item in attr.data) + "]"
    if isinstance(attr, DictionaryAttr):
        return "{" + ", ".join(f"{key} = {attr_to_literal(value)}" for key, value in attr.data.items()) + "}"
    raise TypeError(f"no keyword syntax for attribute {attr}")


def literal_to_attr(parser: Parser) -> Attribute:
    start = parser.pos
    if (match := _FLOAT_WITHOUT_DOT.match(parser.lexer.input.content, start)) is not None:
        parser.raise_error(
            f"float literals need a '.': write {match[1]}.0{match[2]}", start, start + len(match[0])
        )
    number = parser.parse_optional_number()
    if number is not None:
        return FloatAttr(number, f64) if isinstance(number, float) else IntegerAttr(number, i64)
    if parser.lexer.input.content.startswith("!", start):  # a dialect type, read by its own parser
        return parser.parse_type()
    if parser.lexer.input.content.startswith("#", start):  # a dialect attribute, read by its own parser
        return parser.parse_attribute()
    if (symbol := parser.parse_optional_symbol_name()) is not None:
        return SymbolRefAttr(symbol)
    if (items := parser.parse_optional_comma_separated_list(parser.Delimiter.SQUARE,
                                                            lambda: literal_to_attr(parser))) is not None:
        return ArrayAttr(items)
    if parser.parse_optional_punctuation("{") is not None:
        items: dict[str, Attribute] = {}

        def parse_item() -> None:
            key_start = parser.pos
            key = parser.parse_identifier(" (a dictionary key)")
            if key in items:
                parser.raise_error(f"dictionary key '{key}' is given twice", key_start, parser.pos)
            parser.parse_punctuation("=")
            items[key] = literal_to_attr(parser)

        parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_item)
        parser.parse_punctuation("}")
        return DictionaryAttr(items)
    text = parser.parse_optional_str_literal()
    if text is not None:
        return StringAttr(text)
    word = parser.parse_identifier(" (a number, a string, true/false, an enum keyword, a @symbol or a [list])")
    if word in ("true", "false"):
        return BoolAttr.from_bool(word == "true")
    return StringAttr(word)


def _enum_of(constraint: AttrConstraint) -> type[EnumAttribute] | None:
    """The enum attribute a property's constraint takes (all its words or some), if any."""
    return next((base for base in constraint.get_bases() or () if issubclass(base, EnumAttribute)), None)


def _enum_words(constraint: AttrConstraint) -> tuple[type[EnumAttribute], list[str]] | None:
    """The enum attribute a constraint takes and the words of it that it allows, if any."""
    if (enum := _enum_of(constraint)) is None:
        return None
    return enum, [word for word in enum.enum_type if constraint.verifies(enum(word))]


def fit_to_property(op_type: type[IRDLOperation], key: str, attr: Attribute) -> Attribute:
    """attr as key's declared constraint takes it: unchanged, a word read as the enum attribute
    it declares (a list of words as a list of them), or an integer literal read as the float it
    declares. Raises ValueError naming the op, the property and what it expects."""
    prop = op_type.get_irdl_definition().properties.get(key)
    if prop is None or prop.constr.verifies(attr):
        return attr  # an unknown key is left to the verifier, which names it
    if (words := _enum_words(prop.constr)) is not None:
        enum, allowed = words
        if isinstance(attr, StringAttr) and attr.data in allowed:
            return enum(enum.enum_type(attr.data))
        raise ValueError(f"{op_type.name}: property '{key}' must be one of {', '.join(allowed)}; "
                         f"got {attr_to_literal(attr)}")
    if isinstance(prop.constr, ArrayOfConstraint) and (
            words := _enum_words(prop.constr.elem_range_constraint.constr)) is not None:
        enum, allowed = words
        expected = f"{op_type.name}: property '{key}' takes a list [...] of {', '.join(allowed)}"
        if not isinstance(attr, ArrayAttr):
            raise ValueError(f"{expected}; got {attr_to_literal(attr)}, not a list")
        if unknown := [item for item in attr.data if not (isinstance(item, StringAttr) and item.data in allowed)]:
            raise ValueError(f"{expected}; got {attr_to_literal(unknown[0])}")
        return ArrayAttr([enum(enum.enum_type(item.data)) for item in attr.data])
    if isinstance(attr, ArrayAttr) and all(isinstance(item, IntegerAttr) and item.type == i64 for item in attr.data):
        as_sizes = ArrayAttr([IntAttr(item.value.data) for item in attr.data])  # a shape: `[32, 128, 128]`
        if prop.constr.verifies(as_sizes):
            return as_sizes
    if isinstance(attr, IntegerAttr) and attr.type == i64:  # `scale = 1` is 1.0; true/false only are booleans
        as_float = FloatAttr(float(attr.value.data), f64)
        if prop.constr.verifies(as_float):
            return as_float
    types = [base for base in prop.constr.get_bases() or () if issubclass(base, TypeAttribute)]
    if types:
        raise ValueError(f"{op_type.name}: property '{key}' expects a type "
                         f"{' or '.join(f'!{t.name}<...>' for t in types)}, got {attr_to_literal(attr)}")
    expected = " or ".join(kind for kind, sample in _LITERAL_KINDS if prop.constr.verifies(sample))
    raise ValueError(f"{op_type.name}: property '{key}' expects {expected or prop.constr}, got {attr_to_literal(attr)}")


class KeywordSyntax(IRDLOperation):
    """Mixin giving an op the `@symbol <key = value, ...> {region}` syntax."""

    SYMBOL_PROP: ClassVar[str] = "sym_name"

    def keyword_items(self) -> list[tuple[str, Attribute]]:
        """The properties but the symbol, in declaration order, so an op prints one way whatever
        order it was written or built in; undeclared keys (the verifier rejects them) come last."""
        declared = type(self).get_irdl_definition().properties
        order = [*declared, *(k for k in self.properties if k not in declared)]
        unprinted = (self.SYMBOL_PROP, AttrSizedOperandSegments.attribute_name)  # the segments: by the operands
        return [(k, self.properties[k]) for k in order if k in self.properties and k not in unprinted]

    def print(self, printer: Printer) -> None:
        symbol = self.properties.get(self.SYMBOL_PROP)
        if isinstance(symbol, StringAttr):
            printer.print_string(" ")
            printer.print_symbol_name(symbol.data)
        elif isinstance(symbol, SymbolRefAttr):  # a reference in the symbol's place (a launch's kernel)
            printer.print_string(" ")
            printer.print_attribute(symbol)
        if self.operands:
            printer.print_string(" ")
            printer.print_list(self.operands, printer.print_operand)
        items = self.keyword_items()
        if items:
            printer.print_string(" <")
            printer.print_list(
                items, lambda kv: printer.print_string(f"{kv[0]} = {attr_to_literal(kv[1])}")
            )
            printer.print_string(">")
        for region in self.regions:
            printer.print_string(" ")
            printer.print_region(region)
        if self.results:
            printer.print_string(" : ")
            printer.print_list(self.result_types, printer.print_attribute)

    @classmethod
    def parse(cls, parser: Parser):
        properties: dict[str, Attribute] = {}
        symbol = parser.parse_optional_symbol_name()
        if symbol is not None:
            symbol_prop = cls.get_irdl_definition().properties.get(cls.SYMBOL_PROP)
            is_reference = symbol_prop is not None and SymbolRefAttr in (symbol_prop.constr.get_bases() or ())
            properties[cls.SYMBOL_PROP] = SymbolRefAttr(symbol) if is_reference else symbol
        operands_start = parser.pos
        operands = []
        if (first := parse_defined_operand(parser)) is not None:
            operands.append(first)
            while parser.parse_optional_punctuation(",") is not None:
                operands.append(parse_defined_operand(parser, required=True))
        operands_end = parser.pos
        if parser.parse_optional_punctuation("<") is not None:

            def parse_item() -> None:
                key_start = parser.pos
                key = parser.parse_identifier(" (a property name)")
                if key in properties:  # a dict would silently keep the last value
                    parser.raise_error(f"{cls.name}: property '{key}' is given twice", key_start, key_start + len(key))
                parser.parse_punctuation("=")
                value_start = parser.pos
                value = literal_to_attr(parser)
                try:
                    properties[key] = fit_to_property(cls, key, value)
                except ValueError as err:
                    parser.raise_error(str(err), value_start, parser.pos)

            parser.parse_comma_separated_list(parser.Delimiter.NONE, parse_item)
            parser.parse_punctuation(">")
        regions: list[Region] = []
        while (region := parser.parse_optional_region()) is not None:
            regions.append(region)
        result_types = []
        if parser.parse_optional_punctuation(":") is not None:
            result_types = parser.parse_comma_separated_list(parser.Delimiter.NONE, parser.parse_type)
        if any(isinstance(o, AttrSizedOperandSegments) for o in cls.get_irdl_definition().options):
            try:
                sizes = cls.operand_segment_sizes(operands, properties)
            except ValueError as err:
                parser.raise_error(str(err), operands_start, operands_end)
            properties[AttrSizedOperandSegments.attribute_name] = DenseArrayBase.from_list(i32, sizes)
        return cls.create(operands=operands, result_types=result_types, properties=properties, regions=regions)

    @classmethod
    def operand_segment_sizes(cls, operands: Sequence[SSAValue], properties: Mapping[str, Attribute]) -> list[int]:
        """An op with AttrSizedOperandSegments: how many of `operands` (printed in order, without
        their names) each of its operand definitions takes, given its parsed `properties`. Raises
        ValueError (a parse error at the operands) where they cannot say."""
        raise NotImplementedError(f"{cls.name}: an op with operand segments says how its printed operands split")


def parse_defined_operand(parser: Parser, required: bool = False) -> SSAValue | None:
    """`%name`, a value defined before this use: our syntax prints no operand types, so the
    operand is resolved with the type of its definition (a use before the definition, which
    would need the type written, is an error)."""
    start = parser.pos
    operand = parser.parse_optional_unresolved_operand()
    if operand is None:
        if required:
            parser.raise_error("expected an operand (%name)", start, parser.pos)
        return None
    defined = parser.ssa_values.get(operand.operand_name)
    if defined is None:
        parser.raise_error("SSA value used before assignment", operand.span)
    if operand.index >= len(defined):
        parser.raise_error(f"SSA value tuple index out of bounds. Tuple is of size {len(defined)} but tried to "
                           f"access element {operand.index}.", operand.span)
    return parser.resolve_operand(operand, defined[operand.index].type)
