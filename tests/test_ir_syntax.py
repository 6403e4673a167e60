"""The custom syntax of k3s.gram, whose operands are named definitions (AttrSizedOperandSegments)
printed in order without their names or segment sizes: every form re-parses to the same text and
the same named operands, a Gram built by name is the Gram parsed, and a missing operand is named
by the verifier (or, in text, by the parse error listing the tiles the properties take). The
parser reads operands through xDSL's supported API: no DeprecationWarning."""

from __future__ import annotations

import io
import warnings

import pytest
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from k3compile.ir import k3s
from k3compile.ir.dialects import make_context
from k3compile.ir.k3s.gram import GRAM_OPERANDS

TEXT = """\
builtin.module {
  k3.recurrence @r <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 2, head_k_dim = 8, head_v_dim = 4, scale = 0.25, state_layout = kv, dtype = float32>
  k3s.entry @chunk <source = @r> {
    %q = k3s.tensor_arg @q <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %k = k3s.tensor_arg @k <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %g = k3s.tensor_arg @g <role = input> : !k3s.tensor<B x T x 2 x 8, float>
    %gs = k3s.tensor_arg @gs <role = input> : !k3s.tensor<B x T x 2, float>
    %beta = k3s.tensor_arg @beta <role = input> : !k3s.tensor<B x T x 2, float>
    %A_log = k3s.tensor_arg @A_log <role = input> : !k3s.tensor<2, float>
    %dt_bias = k3s.tensor_arg @dt_bias <role = input> : !k3s.tensor<16, float>
    %W = k3s.tensor_arg @W <role = workspace> : !k3s.tensor<B x T x 2 x 16, float>
    k3s.kernel @r_chunk_prepare <grid = [chunk, value_head], num_warps = 4> {
      k3s.chunk_tile <chunk_size = 16, head_k_dim = 8, head_v_dim = 4>
      %qt = k3s.load_chunk %q : !k3s.tile<C x K>
      %kt = k3s.load_chunk %k : !k3s.tile<C x K>
      %bt = k3s.load_beta %beta <input = probability> : !k3s.tile<C>
      %gst = k3s.load_gate %gs <gate = scalar, input = log, lower_bound = -5.0> : !k3s.tile<C>
      %Gs = k3s.gate_cumsum %gst <gate = scalar> : !k3s.tile<C>
      %gt = k3s.load_gate %g <gate = channel, input = log, lower_bound = -5.0> : !k3s.tile<C x K>
      %G = k3s.gate_cumsum %gt <gate = channel> : !k3s.tile<C x K>
      %Gstart, %Gend = k3s.block_gates %G <sub_chunk = 4> : !k3s.tile<NB x K>, !k3s.tile<NB x K>
      %kr = k3s.block_rescale %kt, %G, %Gend <decay = reference_over_row> : !k3s.tile<C x K>
      %kd = k3s.block_rescale %kt, %G, %Gstart <decay = reference_over_row> : !k3s.tile<C x K>
      %kl = k3s.block_rescale %kt, %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
      %ql = k3s.block_rescale %qt, %G, %Gstart <decay = row_over_reference> : !k3s.tile<C x K>
      %factorable = k3s.block_span_check %Gstart, %Gend <limit = 80.0> : i1
      %P_none = k3s.gram %qt, %kt <mask = inclusive, gate = none, beta = false> : !k3s.tile<C x C>
      %A_none = k3s.gram %kt, %kt, %bt <mask = strict, gate = none, beta = true> : !k3s.tile<C x C>
      %P_scalar = k3s.gram %qt, %kt, %Gs <mask = inclusive, gate = scalar, beta = false> : !k3s.tile<C x C>
      %A_scalar = k3s.gram %kt, %kt, %Gs, %bt <mask = strict, gate = scalar, beta = true> : !k3s.tile<C x C>
      %P_factored = k3s.gram %qt, %kt, %G, %Gstart, %Gend, %ql, %kr, %kd <mask = inclusive, gate = channel, beta = false, diagonal = factored> : !k3s.tile<C x C>
      %A_factored = k3s.gram %kt, %kt, %G, %Gstart, %Gend, %kl, %kr, %kd, %bt <mask = strict, gate = channel, beta = true, diagonal = factored> : !k3s.tile<C x C>
      %P_elementwise = k3s.gram %qt, %kt, %G, %Gstart, %Gend, %ql, %kr, %k, %g <mask = inclusive, gate = channel, beta = false, diagonal = elementwise> : !k3s.tile<C x C>
      %A_elementwise = k3s.gram %kt, %kt, %G, %Gstart, %Gend, %kl, %kr, %bt, %k, %g, %A_log, %dt_bias <mask = strict, gate = channel, beta = true, diagonal = elementwise> : !k3s.tile<C x C>
      %P_guarded = k3s.gram %qt, %kt, %G, %Gstart, %Gend, %ql, %kr, %kd, %factorable, %k, %g <mask = inclusive, gate = channel, beta = false, diagonal = guarded> : !k3s.tile<C x C>
      %A_guarded = k3s.gram %kt, %kt, %G, %Gstart, %Gend, %kl, %kr, %kd, %bt, %factorable, %k, %g, %A_log, %dt_bias <mask = strict, gate = channel, beta = true, diagonal = guarded> : !k3s.tile<C x C>
      k3s.spill %W, %A_guarded
    }
  }
}
"""

# each Gram of TEXT by its result's name: its named operands (by their values' names), the rest absent
CHANNEL = dict(cumulative_gate="G", gate_start="Gstart", gate_end="Gend", right_factor="kr")
FORMS = {
    "P_none": dict(lhs="qt", keys="kt"),
    "A_none": dict(lhs="kt", keys="kt", row_scale="bt"),
    "P_scalar": dict(lhs="qt", keys="kt", cumulative_gate="Gs"),
    "A_scalar": dict(lhs="kt", keys="kt", cumulative_gate="Gs", row_scale="bt"),
    "P_factored": dict(lhs="qt", keys="kt", **CHANNEL, left_factor="ql", diagonal_factor="kd"),
    "A_factored": dict(lhs="kt", keys="kt", **CHANNEL, left_factor="kl", diagonal_factor="kd", row_scale="bt"),
    "P_elementwise": dict(lhs="qt", keys="kt", **CHANNEL, left_factor="ql", tensors=["k", "g"]),
    "A_elementwise": dict(lhs="kt", keys="kt", **CHANNEL, left_factor="kl", row_scale="bt",
                          tensors=["k", "g", "A_log", "dt_bias"]),
    "P_guarded": dict(lhs="qt", keys="kt", **CHANNEL, left_factor="ql", diagonal_factor="kd",
                      factored_guard="factorable", tensors=["k", "g"]),
    "A_guarded": dict(lhs="kt", keys="kt", **CHANNEL, left_factor="kl", diagonal_factor="kd", row_scale="bt",
                      factored_guard="factorable", tensors=["k", "g", "A_log", "dt_bias"]),
}


def parse(text: str):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated parser API
        module = Parser(make_context(), text).parse_module()
    module.verify()
    return module


def generic(module) -> str:
    stream = io.StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(module)
    return stream.getvalue()


def grams(module) -> dict[str, k3s.GramOp]:
    return {op.gram.name_hint: op for op in module.walk() if isinstance(op, k3s.GramOp)}


def values(module) -> dict:
    return {v.name_hint: v for op in module.walk() for v in op.results}


def test_every_gram_form_round_trips(monkeypatch):
    for method in ("parse_operand", "parse_optional_operand"):  # their untyped forms are deprecated
        typed = getattr(Parser, method)

        def typed_only(self, type=None, *args, _typed=typed, _method=method, **kwargs):
            assert type is not None, f"the deprecated untyped Parser.{_method}()"
            return _typed(self, type, *args, **kwargs)

        monkeypatch.setattr(Parser, method, typed_only)
    module = parse(TEXT)
    assert str(module) == TEXT.rstrip("\n")
    generic_text = generic(module)
    assert "operandSegmentSizes" in generic_text  # the generic form spells the segments out
    again = parse(generic_text)
    assert str(again) == str(module) and generic(again) == generic_text
    assert set(grams(module)) == set(FORMS)


@pytest.mark.parametrize("name", FORMS)
def test_parsed_gram_operands_by_name(name):
    module = parse(TEXT)
    op, named = grams(module)[name], FORMS[name]
    for operand in GRAM_OPERANDS:
        value = getattr(op, operand)
        assert (value and value.name_hint) == named.get(operand), operand
    assert [v.name_hint for v in op.tensors] == named.get("tensors", [])
    assert list(op.operands) == [getattr(op, o) for o in GRAM_OPERANDS if getattr(op, o) is not None] + list(op.tensors)


@pytest.mark.parametrize("name", FORMS)
def test_gram_built_by_name_is_the_gram_parsed(name):
    module = parse(TEXT)
    op, by_name = grams(module)[name], values(module)
    named = {key: [by_name[t] for t in v] if key == "tensors" else by_name[v] for key, v in FORMS[name].items()}
    built = k3s.GramOp(named.pop("lhs"), named.pop("keys"), mask=op.mask.data, gate=op.gate.data,
                       beta=bool(op.beta.value.data), diagonal=op.diagonal and op.diagonal.data,
                       result_type=op.gram.type, **named)
    assert list(built.operands) == list(op.operands)
    assert built.properties == op.properties
    rebuilt = op.rebuilt()
    assert list(rebuilt.operands) == list(op.operands) and rebuilt.properties == op.properties


def add_to_kernel(module, op) -> None:
    spill = next(o for o in module.walk() if isinstance(o, k3s.SpillOp))
    spill.parent_block().insert_op_before(op, spill)


def built_wrong(module, name: str, **changes):
    """A Gram of TEXT built again with `changes`, next to it in its kernel."""
    op = grams(module)[name].rebuilt(**changes)
    add_to_kernel(module, op)
    return op


@pytest.mark.parametrize("name, changes, message", [
    ("A_none", dict(row_scale=None), r"k3s.gram: with beta = true it takes row_scale \(beta, the rows' scale\); "
                                     r"it has none"),
    ("P_scalar", dict(cumulative_gate=None), r"with gate = scalar or channel it takes cumulative_gate \(G, "),
    ("P_factored", dict(diagonal_factor=None), r"with diagonal = factored or guarded it takes diagonal_factor "),
    ("P_guarded", dict(left_factor=None), r"with gate = channel it takes left_factor "),
    ("P_guarded", dict(factored_guard=None), r"takes a k3s.block_span_check operand \(factored_guard\); got 0"),
    ("P_elementwise", dict(tensors=[]), r"an elementwise diagonal reads k and g .*got 0 tensor operands"),
])
def test_missing_operand_is_named_by_the_verifier(name, changes, message):
    module = parse(TEXT)
    built_wrong(module, name, **changes)
    with pytest.raises(VerifyException, match=message):
        module.verify()


def test_operand_the_properties_do_not_take_is_named_by_the_verifier():
    module = parse(TEXT)
    built_wrong(module, "P_none", cumulative_gate=values(module)["Gs"])
    with pytest.raises(VerifyException, match=r"cumulative_gate \(G, .*\) is an operand only with gate = scalar or "
                                              r"channel; it has one with mask = inclusive, gate = none, beta = false"):
        module.verify()


def test_missing_keys_is_named_by_the_verifier():
    module = parse(TEXT)
    op = grams(module)["P_none"]
    keyless = k3s.GramOp.create(operands=[op.lhs], result_types=[op.gram.type], properties={
        **op.properties, "operandSegmentSizes": type(op.properties["operandSegmentSizes"]).from_list(
            op.properties["operandSegmentSizes"].elt_type, [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])})
    add_to_kernel(module, keyless)
    with pytest.raises(VerifyException, match="expected 1 value for keys, but got 0"):
        module.verify()


@pytest.mark.parametrize("old, new, message", [
    ("%ql, %kr, %kd <mask = inclusive", "%ql, %kr <mask = inclusive",
     r"k3s.gram: its properties take 8 tile operands \(lhs, keys, cumulative_gate, gate_start, gate_end, "
     r"left_factor, right_factor, diagonal_factor\), got 7"),
    ("%P_none = k3s.gram %qt, %kt <", "%P_none = k3s.gram %qt <",
     r"k3s.gram: its properties take 2 tile operands \(lhs, keys\), got 1"),
    ("%bt, %factorable, %k, %g, %A_log", "%bt, %k, %g, %factorable, %A_log",
     "k3s.gram: its operands are its tiles, then a guard, then tensors"),
    ("%P_none = k3s.gram %qt, %kt <", "%P_none = k3s.gram %qt, %k_9 <", "SSA value used before assignment"),
])
def test_malformed_gram_text_is_a_parse_error(old, new, message):
    assert TEXT.count(old) == 1
    with pytest.raises(ParseError, match=message):
        parse(TEXT.replace(old, new))


@pytest.mark.parametrize("name, changes, message", [
    ("P_factored", dict(diagonal_rows="reload"), r"diagonal_rows is a choice of an elementwise or guarded "
                                                 r"diagonal only; got it with .*diagonal = factored"),
    ("P_scalar", dict(unroll=True), r"unroll is a choice of a channel gate's loop over the blocks below the "
                                    r"diagonal only; got it with .*gate = scalar"),
])
def test_a_backend_choice_the_gram_does_not_take_is_named_by_the_verifier(name, changes, message):
    """lower-to-triton's choices on a Gram (unroll, diagonal_rows) only where it has what they choose."""
    module = parse(TEXT)
    built_wrong(module, name, **changes)
    with pytest.raises(VerifyException, match=message):
        module.verify()


def test_backend_choices_on_a_gram_print_and_parse_back():
    text = TEXT.replace("diagonal = guarded>", "diagonal = guarded, unroll = true, diagonal_rows = extract>")
    module = parse(text)
    module.verify()
    guarded = grams(module)["P_guarded"]
    assert guarded.unroll.value.data and guarded.diagonal_rows.data == k3s.DiagonalRows.EXTRACT
    assert guarded.rebuilt().diagonal_rows == guarded.diagonal_rows
    assert "diagonal = guarded, unroll = true, diagonal_rows = extract>" in str(module)
