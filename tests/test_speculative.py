"""Speculative decoding without snapshots (derive-replay + lower-speculative): verify reads the
committed pool state and caches (k, log-decay, u) per token; commit replays the accepted tokens
into the pool in place. Checked against the token recurrence over several rounds.

Interpreter, fp32, H=2, HV=4, K=24, V=40, block-v 16 (three value blocks), draft depth 4.
"""

from __future__ import annotations

import os

import pytest
import torch

from conftest import MEMBERS_AND_LAYOUTS, assert_rms, compile_member, recurrence_table
from k3compile.driver import compile as compile_layer
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import spec_from_table
from k3compile.verify import RecurrenceCase, recurrence_inputs

DEPTH = 4
PIPELINE = f"derive-replay{{draft-tokens={DEPTH}}},lower-speculative{{block-v=16}}"
TOKEN_INPUTS = ("q", "k", "v", "g", "beta")


@pytest.fixture(scope="module", params=MEMBERS_AND_LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def layer(request, tmp_path_factory):
    return compile_member(*request.param, PIPELINE, tmp_path_factory.mktemp("speculative"), "speculative")


def test_rounds_of_verify_and_commit_follow_the_accepted_tokens(layer, fresh_seed):
    compiled, op = layer
    gen = torch.Generator().manual_seed(fresh_seed)
    pool_rows, batch = 5, 3
    state_shape = (4, 24, 40) if op.state_layout.data == "kv" else (4, 40, 24)
    pool = torch.randn((pool_rows, *state_shape), generator=gen)
    cache = torch.full((pool_rows, DEPTH, 4, 2 * 24 + 40), float("nan"))
    slots = torch.tensor([4, -1, 1])
    for accepted in ([2, 3, 4], [0, 1, DEPTH], [DEPTH, 0, 1]):  # partial, none, all, mixed
        inputs = recurrence_inputs(op, RecurrenceCase("round", batch, DEPTH), torch.float32, "cpu", gen)
        inputs.pop("initial_state")
        before = pool.clone()
        starts = torch.stack([before[i] if i >= 0 else torch.zeros(state_shape) for i in slots.tolist()])
        (o,) = compiled.verify(**inputs, state=pool, state_indices=slots, cache=cache)
        assert torch.equal(pool, before), "verify must not write the committed state"
        assert_rms(o, reference.recurrence(op, **inputs, initial_state=starts)[0], "verify o", 1e-5)
        compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=torch.tensor(accepted))
        for b, (slot, m) in enumerate(zip(slots.tolist(), accepted)):
            if slot < 0:
                continue
            prefix = {k: v[b:b + 1, :m] for k, v in inputs.items() if k in TOKEN_INPUTS and v is not None}
            rest = {k: v for k, v in inputs.items() if k not in TOKEN_INPUTS}
            want = before[slot:slot + 1].double() if m == 0 else reference.recurrence(
                op, **prefix, **rest, initial_state=before[slot:slot + 1], output_final_state=True)[1]
            assert_rms(pool[slot:slot + 1], want, f"slot {slot} after {m} accepted", 1e-5)
        untouched = [i for i in range(pool_rows) if i not in slots.tolist()]
        assert torch.equal(pool[untouched], before[untouched])


def test_more_tokens_than_the_cache_holds_is_refused(layer, fresh_seed):
    compiled, op = layer
    inputs = recurrence_inputs(op, RecurrenceCase("long", 1, DEPTH + 1), torch.float32, "cpu",
                               torch.Generator().manual_seed(fresh_seed))
    inputs.pop("initial_state")
    pool = torch.zeros((1, 4, 24, 40) if op.state_layout.data == "kv" else (1, 4, 40, 24))
    cache = torch.zeros((1, DEPTH, 4, 88))
    with pytest.raises(ValueError, match="at most 4 tokens"):
        compiled.verify(**inputs, state=pool, state_indices=torch.tensor([0]), cache=cache)


def test_fifty_rounds_do_not_drift(tmp_path, fresh_seed):
    """State drift over many rounds stays at fp32 rounding: the pool after 50 verify/commit rounds
    with random acceptance equals the float64 recurrence over the accepted tokens."""
    spec = spec_from_table(recurrence_table("kda", "kv", H=1, HV=2, K=16, V=16, name="drift"))
    compiled = compile_layer(spec, out_dir=tmp_path, pipeline=PIPELINE)
    op = next(iter(spec_to_module(spec).ops))
    gen = torch.Generator().manual_seed(fresh_seed)
    pool = 0.5 * torch.randn((2, 2, 16, 16), generator=gen)
    cache = torch.zeros((2, DEPTH, 2, 48))
    slots = torch.tensor([1])
    exact = pool[1:2].double()
    for _ in range(50):
        inputs = recurrence_inputs(op, RecurrenceCase("round", 1, DEPTH), torch.float32, "cpu", gen)
        inputs.pop("initial_state")
        m = int(torch.randint(0, DEPTH + 1, (1,), generator=gen))
        compiled.verify(**inputs, state=pool, state_indices=slots, cache=cache)
        compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=torch.tensor([m]))
        if m:
            prefix = {k: v[:, :m] for k, v in inputs.items() if k in TOKEN_INPUTS and v is not None}
            exact = reference.recurrence(op, **prefix, initial_state=exact, output_final_state=True)[1]
    assert_rms(pool[1:2], exact, "state after 50 rounds", 1e-5)


def test_worked_example_runs(tmp_path):
    """docs/speculative-decoding.md's example: a full draft/verify/accept loop, checked at the end."""
    import subprocess
    import sys

    from conftest import REPO

    env = dict(os.environ, K3C_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, str(REPO / "examples" / "speculative_loop.py"), "--rounds", "3"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    worst = float(done.stdout.strip().splitlines()[-1].rsplit(" ", 1)[-1])
    assert worst < 1e-5


def test_snapshot_baseline_gives_the_same_states(tmp_path, fresh_seed):
    """mode=snapshot (today's engines: a state written after every token) from the same schedule
    commits the same states as the replay."""
    spec = spec_from_table(recurrence_table("kda", "vk", H=2, HV=4, K=24, V=40, name="baseline"))
    replay = compile_layer(spec, out_dir=tmp_path / "replay", pipeline=PIPELINE)
    snapshot = compile_layer(spec, out_dir=tmp_path / "snapshot",
                             pipeline=f"derive-replay{{draft-tokens={DEPTH}}},lower-speculative{{block-v=16 mode=snapshot}}")
    op = next(iter(spec_to_module(spec).ops))
    gen = torch.Generator().manual_seed(fresh_seed)
    pools = [torch.randn((4, 4, 40, 24), generator=gen)] * 2
    pools = [p.clone() for p in pools]
    cache = torch.zeros((4, DEPTH, 4, 88))
    snaps = torch.full((4, DEPTH, 4, 40, 24), float("nan"))
    slots = torch.tensor([2, -1, 0])
    for accepted in ([1, 2, DEPTH], [0, 3, 2]):
        inputs = recurrence_inputs(op, RecurrenceCase("round", 3, DEPTH), torch.float32, "cpu", gen)
        inputs.pop("initial_state")
        (o1,) = replay.verify(**inputs, state=pools[0], state_indices=slots, cache=cache)
        (o2,) = snapshot.verify(**inputs, state=pools[1], state_indices=slots, snapshots=snaps)
        assert torch.equal(o1, o2)
        replay.commit(state=pools[0], state_indices=slots, cache=cache, accepted=torch.tensor(accepted))
        snapshot.commit(state=pools[1], state_indices=slots, snapshots=snaps, accepted=torch.tensor(accepted))
        assert_rms(pools[1], pools[0].double(), "snapshot vs replay", 1e-6)
