"""The decode entry: a slot table over a state pool, updated in place (issue 4's serving path),
and the slot checks of every entry that takes one (decode; verify, commit, spec_step).

Interpreter, fp32, small dims: H=2, HV=4 (grouped), K=24, V=40 (not powers of two), block-v 16.
"""

from __future__ import annotations

import re

import pytest
import torch

from conftest import MEMBERS_AND_LAYOUTS, compile_member, one_line
from k3compile.ir import reference
from k3compile.checking.verify import RecurrenceCase, compare, recurrence_inputs

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
    """With the host's check off (check_indices=False), the kernel's masks alone keep a slot
    outside the pool from reading or writing anything."""
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 2, 1, 3, fresh_seed)
    guarded = torch.randn((5, *pool.shape[1:]))  # rows 3, 4 lie past the pool the kernel sees
    view = guarded[:3]
    before = guarded.clone()
    (o,) = compiled.decode(**inputs, state=view, state_indices=torch.tensor([3, 7]), check_indices=False)
    assert torch.isfinite(o).all()
    assert torch.equal(guarded, before)


BAD_SLOTS = [
    ([0, 6], "row 1 is slot 6, outside the pool of 6 slots (0..5; -1 marks a padding row)"),
    ([10, 0], "row 0 is slot 10, outside the pool of 6 slots"),
    ([-2, 1], "row 0 is slot -2, outside the pool of 6 slots"),
    ([3, 3], "slot 3 is in rows 0 and 1; a pool slot may be advanced by one row per call"),
]


@pytest.mark.parametrize("slots, message", BAD_SLOTS, ids=["past-the-end", "far", "minus-two", "twice"])
def test_bad_slots_are_refused_before_anything_runs(layer, slots, message, fresh_seed):
    """Only -1 means padding: any other slot outside the pool, or a slot twice (two programs
    racing on one row on the GPU), is a ValueError naming state_indices; the pool is untouched."""
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 2, 1, 6, fresh_seed)
    before = pool.clone()
    with pytest.raises(ValueError, match=f"^state_indices: {re.escape(message)}") as info:
        compiled.decode(**inputs, state=pool, state_indices=torch.tensor(slots))
    assert one_line(str(info.value))
    assert torch.equal(pool, before)


def test_padding_rows_pass_the_check(layer, fresh_seed):
    """-1 may repeat (several padding rows): they are no slot."""
    compiled, op = layer
    inputs, pool = pool_and_inputs(op, 3, 1, 2, fresh_seed)
    before = pool.clone()
    (o,) = compiled.decode(**inputs, state=pool, state_indices=torch.tensor([-1, 1, -1]))
    assert torch.isfinite(o).all()
    assert torch.equal(pool[0], before[0]) and not torch.equal(pool[1], before[1])


@pytest.fixture(scope="module")
def speculative(tmp_path_factory):
    return compile_member("kda", "kv", "derive-replay{draft-tokens=4},lower-speculative{block-v=16}",
                          tmp_path_factory.mktemp("speculative_slots"), "slots")


def speculative_calls(compiled, op, slots, accepted, seed):
    """verify, commit and spec_step of one round at B = 2 over a pool of 6 slots."""
    inputs, pool = pool_and_inputs(op, 2, 1, 6, seed)
    # a random cache (a replay of zeros would leave the rows as they were); log-decays <= 0
    cache, next_cache = -torch.rand((2, 6, 4, 4, 2 * 24 + 40), generator=torch.Generator().manual_seed(seed))
    slots, accepted = torch.tensor(slots), torch.tensor(accepted)
    return pool, {
        "verify": lambda **kw: compiled.verify(**inputs, state=pool, state_indices=slots, cache=cache, **kw),
        "commit": lambda **kw: compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=accepted, **kw),
        "spec_step": lambda **kw: compiled.spec_step(**inputs, state=pool, state_indices=slots, cache=cache,
                                                     accepted=accepted, next_cache=next_cache, **kw),
    }


@pytest.mark.parametrize("slots, message", BAD_SLOTS[::3], ids=["past-the-end", "twice"])
def test_speculative_entries_check_slots(speculative, slots, message, fresh_seed):
    compiled, op = speculative
    pool, calls = speculative_calls(compiled, op, slots, [1, 2], fresh_seed)
    before = pool.clone()
    for name, call in calls.items():
        with pytest.raises(ValueError, match=f"^state_indices: {re.escape(message)}"):
            call()
    assert torch.equal(pool, before)


@pytest.mark.parametrize("count", [5, -1])
def test_accepted_counts_past_the_cache_are_refused(speculative, count, fresh_seed):
    """The kernels clamp accepted to 0..draft-tokens: a count outside it is refused by the host
    check, not silently clamped."""
    compiled, op = speculative
    pool, calls = speculative_calls(compiled, op, [0, 4], [2, count], fresh_seed)
    for name in ("commit", "spec_step"):
        with pytest.raises(ValueError, match=rf"^accepted: row 1 accepts {count} tokens; expected 0\.\.4"):
            calls[name]()
    before = pool.clone()
    calls["commit"](check_indices=False)  # the opt-out: clamped by the kernel, rows 0 and 4 written
    assert torch.equal(pool[[1, 2, 3, 5]], before[[1, 2, 3, 5]]) and not torch.equal(pool[0], before[0])


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
