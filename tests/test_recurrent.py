"""The compiled `recurrent` entry of every KDA-family member, in both state layouts, against the
float64 token recurrence of k3compile.ir.reference (Triton interpreter, fp32, small shapes)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_causal
from conftest import (
    RECURRENCE_KINDS,
    RecurrenceShape,
    assert_matches,
    layer_op,
    recurrence_inputs,
    recurrence_table,
)
from k3compile.ir import reference

LAYOUTS = ("kv", "vk")
CASES = [(kind, layout) for kind in RECURRENCE_KINDS for layout in LAYOUTS]
IDS = [f"{kind}-{layout}" for kind, layout in CASES]

H, K, V = 2, 16, 16
RECURRENT = "lower-recurrent"  # the pipeline that derives the `recurrent` entry


@pytest.fixture(params=CASES, ids=IDS)
def member(request):
    return request.param


@pytest.fixture
def base_layer(member, compile_layer):
    kind, layout = member
    return compile_layer(pipeline=RECURRENT, **recurrence_table(kind, layout, H=H, K=K, V=V))


def run_both(layer, inputs, **kwargs):
    out = layer.recurrent(**inputs, **kwargs)
    ref = reference.recurrence(layer_op(layer), **inputs, **kwargs)
    return out, ref


def check(layer, inputs, **kwargs):
    (o, final), (ref_o, ref_final) = run_both(layer, inputs, output_final_state=True, **kwargs)
    assert o.dtype == inputs["q"].dtype
    assert final is not None and final.dtype == torch.float32
    assert_matches(o, ref_o, "o")
    assert_matches(final, ref_final, "final_state")
    return o, final


def test_batch_odd_length_initial_state(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=11, H=H, HV=H, K=K, V=V))
    check(base_layer, inputs)


def test_no_initial_state(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=3, T=5, H=H, HV=H, K=K, V=V), initial_state=False)
    check(base_layer, inputs)


def test_single_token(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=1, H=H, HV=H, K=K, V=V))
    check(base_layer, inputs)


@pytest.mark.parametrize("offsets", ["int64", "int32"])
def test_varlen_with_empty_and_single_token_sequences(member, base_layer, offsets):
    kind, layout = member
    seqlens = (4, 0, 1, 6)
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=sum(seqlens), H=H, HV=H, K=K, V=V, seqlens=seqlens))
    inputs["cu_seqlens"] = inputs["cu_seqlens"].to(getattr(torch, offsets))
    o, final = check(base_layer, inputs)
    assert final.shape[0] == len(seqlens)
    # the empty sequence's final state is its initial state, untouched
    torch.testing.assert_close(final[1], inputs["initial_state"][1], rtol=0, atol=0)


def test_grouped_value_heads(member, compile_layer):
    kind, layout = member
    layer = compile_layer(pipeline=RECURRENT, **recurrence_table(kind, layout, H=H, HV=2 * H, K=K, V=V))
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=7, H=H, HV=2 * H, K=K, V=V))
    check(layer, inputs)


def test_grouped_value_heads_varlen(member, compile_layer):
    kind, layout = member
    layer = compile_layer(pipeline=RECURRENT, **recurrence_table(kind, layout, H=1, HV=2, K=K, V=V))
    seqlens = (3, 5)
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=8, H=1, HV=2, K=K, V=V, seqlens=seqlens))
    check(layer, inputs)


def test_non_power_of_two_dims_several_value_blocks(member, compile_layer):
    kind, layout = member
    Kn, Vn = 20, 36
    layer = compile_layer(pipeline="lower-recurrent{block-v=16}", **recurrence_table(kind, layout, H=1, HV=2, K=Kn, V=Vn))
    assert "BV = 16" in layer.compilation.source  # the pipeline option reached the kernel: 3 value blocks
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=5, H=1, HV=2, K=Kn, V=Vn))
    check(layer, inputs)


def test_scale_override(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=5, H=H, HV=H, K=K, V=V))
    scale = 0.7  # not the default K ** -0.5
    o, _ = check(base_layer, inputs, scale=scale)
    o_default, _ = base_layer.recurrent(**inputs)
    assert_matches(o, o_default.to(torch.float64) * (scale / K ** -0.5), "o is linear in scale", rms_tol=1e-5)


def test_scale_from_spec(member, compile_layer):
    kind, layout = member
    layer = compile_layer(pipeline=RECURRENT,
                          **recurrence_table(kind, layout, H=1, K=8, V=8, name=f"{kind}_{layout}_scaled", scale=1.5))
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=4, H=1, HV=1, K=8, V=8))
    (o, _), (ref_o, _) = run_both(layer, inputs)
    assert_matches(o, ref_o, "o")
    ref_default, _ = reference.recurrence(layer_op(layer), **inputs, scale=8 ** -0.5)
    assert not torch.allclose(ref_o, ref_default), "the spec's scale must matter"


def test_no_final_state_unless_asked(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=3, H=H, HV=H, K=K, V=V))
    out = base_layer.recurrent(**inputs, output_final_state=False)
    assert isinstance(out, tuple) and len(out) == 2
    o, final = out
    assert final is None
    ref_o, _ = reference.recurrence(layer_op(base_layer), **inputs)
    assert_matches(o, ref_o, "o")
    o2, final2 = base_layer.recurrent(**inputs)  # the default
    assert final2 is None


def test_causal(member, base_layer):
    """Changing every input at t >= t0 leaves o[:, :t0] bit-identical."""
    kind, layout = member
    T, t0 = 10, 4
    assert_causal(base_layer.recurrent, kind, layout, RecurrenceShape(B=2, T=T, H=H, HV=H, K=K, V=V), t0)


def test_varlen_sequences_independent(member, base_layer):
    """NaN in one sequence's inputs reaches neither the outputs nor the states of the others."""
    kind, layout = member
    seqlens = (3, 0, 4, 5)
    T = sum(seqlens)
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=T, H=H, HV=H, K=K, V=V, seqlens=seqlens))
    poisoned = dict(inputs)
    start, end = 3, 7  # sequence 2
    for name in ("q", "k", "v", "g", "beta"):
        if name in inputs:
            poisoned[name] = inputs[name].clone()
            poisoned[name][:, start:end] = float("nan")
    initial = inputs["initial_state"].clone()
    initial[2] = float("nan")
    poisoned["initial_state"] = initial
    o, final = base_layer.recurrent(**poisoned, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(base_layer), **inputs, output_final_state=True)
    others = torch.ones(T, dtype=torch.bool)
    others[start:end] = False
    assert_matches(o[:, others], ref_o[:, others], "o of the other sequences")
    for n in (0, 1, 3):
        assert_matches(final[n], ref_final[n], f"final_state of sequence {n}")
    assert torch.isnan(o[:, start:end]).any(), "the poisoned sequence itself should be NaN"


def test_batches_independent(member, base_layer):
    """Without cu_seqlens, batch rows are separate sequences: NaN in row 0 stays in row 0."""
    kind, layout = member
    shape = RecurrenceShape(B=2, T=4, H=H, HV=H, K=K, V=V)
    inputs = recurrence_inputs(kind, layout, shape)
    poisoned = {name: t.clone() for name, t in inputs.items()}
    poisoned["v"][0] = float("nan")
    o, final = base_layer.recurrent(**poisoned, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(base_layer), **inputs, output_final_state=True)
    assert_matches(o[1], ref_o[1], "o of row 1")
    assert_matches(final[1], ref_final[1], "final_state of row 1")


def test_state_carries_over_between_calls(member, base_layer):
    """Running [0, t) then [t, T) from the returned state equals one run over [0, T)."""
    kind, layout = member
    shape = RecurrenceShape(B=1, T=7, H=H, HV=H, K=K, V=V)
    inputs = recurrence_inputs(kind, layout, shape)
    split = 3
    first = {n: (x[:, :split].contiguous() if n != "initial_state" else x) for n, x in inputs.items()}
    o1, s1 = base_layer.recurrent(**first, output_final_state=True)
    second = {n: (x[:, split:].contiguous() if n != "initial_state" else s1) for n, x in inputs.items()}
    o2, s2 = base_layer.recurrent(**second, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(base_layer), **inputs, output_final_state=True)
    assert_matches(torch.cat([o1, o2], dim=1), ref_o, "o over two calls")
    assert_matches(s2, ref_final, "final_state over two calls")


def test_default_pipeline_has_recurrent_entry(member, compile_layer):
    """The kind's default pipeline (what `k3c compile` runs) also yields a correct `recurrent`."""
    kind, layout = member
    layer = compile_layer(**recurrence_table(kind, layout, H=1, K=8, V=8, name=f"{kind}_{layout}_default"))
    assert "recurrent" in layer.entries
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=3, H=1, HV=1, K=8, V=8))
    check(layer, inputs)


def test_outputs_poisoned_in_tests(base_layer):
    """conftest sets K3C_POISON_OUTPUTS=1: outputs start NaN-filled, so an unwritten element
    would fail the isfinite checks above."""
    assert base_layer.module.POISON_OUTPUTS is True
    empty = base_layer.module._alloc((3, 2), torch.float32, torch.device("cpu"))
    assert torch.isnan(empty).all()


def test_unpoisoned_outputs_also_right(member, base_layer):
    kind, layout = member
    inputs = recurrence_inputs(kind, layout, RecurrenceShape(B=2, T=4, H=H, HV=H, K=K, V=V))
    module = base_layer.module
    saved = module.POISON_OUTPUTS
    module.POISON_OUTPUTS = False
    try:
        o, final = base_layer.recurrent(**inputs, output_final_state=True)
    finally:
        module.POISON_OUTPUTS = saved
    ref_o, ref_final = reference.recurrence(layer_op(base_layer), **inputs, output_final_state=True)
    assert_matches(o, ref_o, "o")
    assert_matches(final, ref_final, "final_state")
