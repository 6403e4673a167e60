"""save-forward-values (passes/save_forward_values.py): chunk_saving returns chunk's outputs and
what the backward's prepare would recompute; chunk_backward_saved, given those, returns
chunk_backward's gradients without its prepare; the premise is proved exactly (k3c prove) and the
proof can fail; bad saved tensors are one-line errors; where the prepares differ, nothing is added."""

from __future__ import annotations

import pytest
import torch

from conftest import RecurrenceShape, compile_member, recurrence_inputs
from k3compile.ir import k3s
from k3compile.passes.save_forward_values import SaveForwardValuesPass
from k3compile.pipeline import RECURRENCE_PIPELINE

SHAPE = RecurrenceShape(1, 45, 2, 4, 24, 40, seqlens=(17, 0, 1, 27))
SAVED = {"kda": ["KG", "P", "QG", "U", "W", "gamma_C"], "gated_deltanet": ["KG", "P", "QG", "U", "W", "gamma_C"],
         "deltanet": ["P", "U", "W"], "gla": ["KG", "QG", "gamma_C"]}


@pytest.fixture(scope="module", params=list(SAVED))
def member(request, tmp_path_factory):
    layer, _ = compile_member(request.param, "kv", RECURRENCE_PIPELINE, tmp_path_factory.mktemp("saving"), "saving")
    return request.param, layer.module


def cotangents(o: torch.Tensor, state: torch.Tensor) -> dict:
    return dict(do=torch.randn_like(o), dht=torch.randn_like(state))


def test_the_saving_forward_returns_chunks_outputs_and_the_prepares_values(member):
    kind, module = member
    x = recurrence_inputs(kind, "kv", SHAPE)
    o, state = module.chunk(**x, output_final_state=True)
    o2, state2, *saved = module.chunk_saving(**x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(state, state2)
    assert list(module.OUTPUT_DTYPES["chunk_saving"])[2:] == SAVED[kind]
    for name, tensor in zip(SAVED[kind], saved, strict=True):
        assert torch.isfinite(tensor).all(), f"{name}: a slot left unwritten (outputs are NaN-poisoned)"


def test_the_saved_backward_gives_the_recomputing_backwards_gradients(member):
    kind, module = member
    x = recurrence_inputs(kind, "kv", SHAPE)
    o, state, *saved = module.chunk_saving(**x, output_final_state=True)
    dy = cotangents(o, state)
    want = module.chunk_backward(**x, **dy, output_dh0=True)
    got = module.chunk_backward_saved(**x, **dy, output_dh0=True, **dict(zip(SAVED[kind], saved)))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert torch.isfinite(a).all() and torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()


def test_bad_saved_tensors_are_one_line_errors(member):
    kind, module = member
    x = recurrence_inputs(kind, "kv", SHAPE)
    o, state, *saved = module.chunk_saving(**x, output_final_state=True)
    given = dict(zip(SAVED[kind], saved))
    dy = cotangents(o, state)
    last = SAVED[kind][-1]
    for wrong, match in ((given[last][:-1], "must be"), (given[last].double(), "dtype")):
        with pytest.raises(ValueError, match=match) as info:
            module.chunk_backward_saved(**x, **dy, **{**given, last: wrong})
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError):
        module.chunk_backward_saved(**x, **dy, **{**given, SAVED[kind][0]: None})


def test_nothing_is_added_where_the_prepares_differ(tmp_path):
    """derive-backward at chunks of 32 beside a forward at 16: the backward's prepare writes other
    chunks, so the forward's values are not its values."""
    pipeline = RECURRENCE_PIPELINE.replace("derive-backward", "derive-backward{chunk-size=32}")
    layer, _ = compile_member("kda", "kv", pipeline, tmp_path, "differ")
    assert "chunk_saving" not in layer.module.OUTPUT_DTYPES
    assert not hasattr(layer.module, "chunk_backward_saved")


def test_the_pass_runs_before_outline_kernels(capsys):
    from conftest import EXAMPLES, bad_input

    pipeline = RECURRENCE_PIPELINE.replace("save-forward-values,outline-kernels", "outline-kernels,save-forward-values")
    assert "run it before outline-kernels" in bad_input(capsys, "ir", EXAMPLES / "kda.toml", "-p", pipeline)


@pytest.mark.parametrize("kind", list(SAVED))
def test_the_premise_is_proved_and_the_proof_can_fail(monkeypatch, kind):
    """prove_saved_forward_values holds for every member; with the forward's prepare spilling the
    negative of one saved value, it fails and names that value."""
    import k3compile.checking.prove as prove
    from conftest import EXAMPLES
    from k3compile.passes.common import make
    from k3compile.spec import load_spec

    spec = load_spec(EXAMPLES / f"{kind}.toml")
    assert all(r.holds for r in prove.prove_saved_forward_values(spec, 3, seed=5))
    derived = prove.derived
    broken = SAVED[kind][-1]

    def negated(spec, pipeline):
        layer_op, module = derived(spec, pipeline)
        forward = next(e for e in module.ops if isinstance(e, k3s.EntryOp) and e.sym_name.data == "chunk")
        spill = next(op for op in k3s.entry_kernels(forward)[0].walk()
                     if isinstance(op, k3s.SpillOp) and op.operands[0].name_hint == broken)
        value = spill.operands[1]
        negative = make(k3s.NegOp, operands=[value], result=("wrong", value.type))
        spill.parent_block().insert_op_before(negative, spill)
        spill.operands = [spill.operands[0], negative.results[0]]
        return layer_op, module

    monkeypatch.setattr(prove, "derived", negated)
    results = prove.prove_saved_forward_values(spec, 3, seed=5)
    assert results and not any(r.holds for r in results)
    assert results[0].first_mismatch == f"{broken} differ"


def test_saving_entries_are_added_once():
    from k3compile.driver import schedule
    from k3compile.spec import spec_from_table
    from conftest import recurrence_table

    spec = spec_from_table(recurrence_table("kda", "kv", H=2, HV=2, K=16, V=16, name="once"))
    module = schedule(spec, RECURRENCE_PIPELINE.replace(",outline-kernels", ""), verify="off").scheduled
    SaveForwardValuesPass().apply(None, module)
    names = [e.sym_name.data for e in module.ops if isinstance(e, k3s.EntryOp)]
    assert names.count("chunk_saving") == 1 and names.count("chunk_backward_saved") == 1
