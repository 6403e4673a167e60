"""The decode entry: a slot table over a state pool, updated in place (issue 4's serving path).

Interpreter, fp32, small dims: H=2, HV=4 (grouped), K=24, V=40 (not powers of two), block-v 16.
"""

from __future__ import annotations

import pytest
import torch

from conftest import MEMBERS_AND_LAYOUTS, compile_member
from k3compile.ir import reference
from k3compile.verify import RecurrenceCase, compare, recurrence_inputs

PIPELINE = "lower-decode{block-v=16}"


@pytest.fixture(scope="module", params=MEMBERS_AND_LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def layer(request, tmp_path_factory):
    return compile_member(*request.param, PIPELINE, tmp_path_factory.mktemp("decode"), "decode")


def pool_and_inputs(op, batch, tokens, pool_rows, seed):
    gen = torch.Generator().manual_seed(seed)
    inputs = recurrence_inputs(op, RecurrenceCase("decode", batch, tokens), torch.float32, "cpu", gen)
    state = inputs.pop("initial_state")
    pool = torch.randn((pool_rows, *state.shape[1:]), generator=gen)
    return inputs, pool


@pytest.mark.parametrize("tokens", [1, 3])
def test_decode_matches_reference_and_leaves_other_slots_alone(layer, tokens, fresh_seed):
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 4, tokens, 7, fresh_seed)
    slots = torch.tensor([5, -1, 0, 3])
    before = pool.clone()
    starts = torch.stack([before[i] if i >= 0 else torch.zeros_like(before[0]) for i in slots.tolist()])
    (o,) = compiled.decode(**inputs, state=pool, state_indices=slots)
    ref_o, ref_final = reference.recurrence(op, **inputs, initial_state=starts, output_final_state=True)
    assert torch.isfinite(o).all()
    assert compare(o, ref_o)[1] < 1e-5
    assert compare(pool[[5, 0, 3]], ref_final[[0, 2, 3]])[1] < 1e-5
    assert torch.equal(pool[[1, 2, 4, 6]], before[[1, 2, 4, 6]])  # untouched rows, bit for bit


def test_decode_steps_chain_like_one_call(layer, fresh_seed):
    """Two single-token steps through the pool equal one two-token step."""
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 2, 2, 3, fresh_seed)
    slots = torch.tensor([2, 0])
    stepped = pool.clone()
    for t in range(2):
        compiled.decode(**{k: (v[:, t:t + 1].contiguous() if k in ("q", "k", "v", "g", "beta") else v)
                           for k, v in inputs.items()}, state=stepped, state_indices=slots)
    compiled.decode(**inputs, state=pool, state_indices=slots)
    assert compare(stepped, pool)[1] < 1e-6


def test_slots_outside_the_pool_are_never_written(layer, fresh_seed):
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 2, 1, 3, fresh_seed)
    guarded = torch.randn((5, *pool.shape[1:]))  # rows 3, 4 lie past the pool the kernel sees
    view = guarded[:3]
    before = guarded.clone()
    (o,) = compiled.decode(**inputs, state=view, state_indices=torch.tensor([3, 7]))
    assert torch.isfinite(o).all()
    assert torch.equal(guarded, before)


@pytest.mark.parametrize("change, name", [
    (lambda a: a.update(state_indices=a["state_indices"].float()), "state_indices"),
    (lambda a: a.update(state_indices=a["state_indices"][:1]), "state_indices"),
    (lambda a: a.update(state=a["state"].half()), "state"),
    (lambda a: a.update(state=a["state"][:, :, :5]), "state"),
    (lambda a: a.update(state=a["state"].transpose(0, 1)), "state"),
])
def test_bad_arguments_name_the_tensor(layer, change, name, fresh_seed):
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 2, 1, 3, fresh_seed)
    args = dict(inputs, state=pool, state_indices=torch.tensor([0, 1]))
    change(args)
    with pytest.raises(ValueError, match=rf"^{name}:"):
        compiled.decode(**args)
