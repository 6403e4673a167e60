"""Speculative decoding without snapshots (derive-replay + lower-speculative): verify reads the
committed pool state and caches (k, log-decay, u) per token; commit replays the accepted tokens
into the pool in place; spec_step does both in one launch (the previous round's commit, then the
new round's verify, with two caches swapped every round). Checked against the token recurrence
over several rounds.

Interpreter, fp32, H=2, HV=4, K=24, V=40, block-v 32 (two value blocks, the second partial: the
interpreter runs a program per value block, so the fewest that keep a full and a partial one),
draft depth 4.
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
from k3compile.checking.verify import RecurrenceCase, recurrence_inputs

DEPTH = 4
BLOCK_V = 32
PIPELINE = f"derive-replay{{draft-tokens={DEPTH}}},lower-speculative{{block-v={BLOCK_V}}}"
TOKEN_INPUTS = ("q", "k", "v", "g", "beta")


@pytest.fixture(scope="module", params=MEMBERS_AND_LAYOUTS, ids=lambda p: f"{p[0]}-{p[1]}")
def layer(request, tmp_path_factory):
    return compile_member(*request.param, PIPELINE, tmp_path_factory.mktemp("speculative"), "speculative")


def round_inputs(op, batch, gen, tokens=DEPTH):
    inputs = recurrence_inputs(op, RecurrenceCase("round", batch, tokens), torch.float32, "cpu", gen)
    inputs.pop("initial_state")
    return inputs


def advance(op, state, inputs, b, m):
    """The float64 state after the first m tokens of batch row b of inputs, from state."""
    if m == 0:
        return state
    prefix = {k: v[b:b + 1, :m] for k, v in inputs.items() if k in TOKEN_INPUTS and v is not None}
    rest = {k: v for k, v in inputs.items() if k not in TOKEN_INPUTS}
    return reference.recurrence(op, **prefix, **rest, initial_state=state, output_final_state=True)[1]


def state_shape_of(op):
    return (4, 24, 40) if op.state_layout.data == "kv" else (4, 40, 24)


def test_rounds_of_verify_and_commit_follow_the_accepted_tokens(layer, fresh_seed):
    compiled, op = layer
    gen = torch.Generator().manual_seed(fresh_seed)
    pool_rows, batch = 5, 3
    pool = torch.randn((pool_rows, *state_shape_of(op)), generator=gen)
    cache = torch.full((pool_rows, DEPTH, 4, 2 * 24 + 40), float("nan"))
    slots = torch.tensor([4, -1, 1])
    # slot 4 accepts 2 then none, slot 1 all then 1 (the padding's counts are never read): none,
    # partial and all, mixed in each round; the second round verifies from the states the first
    # committed
    for accepted in ([2, 3, DEPTH], [0, DEPTH, 1]):
        inputs = round_inputs(op, batch, gen)
        before = pool.clone()
        starts = torch.stack([before[i] if i >= 0 else torch.zeros(state_shape_of(op)) for i in slots.tolist()])
        (o,) = compiled.verify(**inputs, state=pool, state_indices=slots, cache=cache)
        assert torch.equal(pool, before), "verify must not write the committed state"
        assert_rms(o, reference.recurrence(op, **inputs, initial_state=starts)[0], "verify o", 1e-5)
        compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=torch.tensor(accepted))
        for b, (slot, m) in enumerate(zip(slots.tolist(), accepted)):
            if slot >= 0:
                want = advance(op, before[slot:slot + 1].double(), inputs, b, m)
                assert_rms(pool[slot:slot + 1], want, f"slot {slot} after {m} accepted", 1e-5)
        untouched = [i for i in range(pool_rows) if i not in slots.tolist()]
        assert torch.equal(pool[untouched], before[untouched])


def test_spec_step_rounds_follow_the_accepted_tokens(layer, fresh_seed):
    """Each spec_step commits the previous round's accepted prefix (none in the first round: its
    NaN cache is never read) and verifies the new round from that state; a last commit flushes
    the final round. Against the float64 chain over the accepted tokens, round after round."""
    compiled, op = layer
    gen = torch.Generator().manual_seed(fresh_seed)
    pool_rows, batch = 6, 4
    pool = torch.randn((pool_rows, *state_shape_of(op)), generator=gen)
    caches = torch.full((2, pool_rows, DEPTH, 4, 2 * 24 + 40), float("nan"))  # the pair, in one allocation
    cache, next_cache = caches[0], caches[1]
    slots = torch.tensor([4, -1, 1, 2])
    exact = {s: pool[s:s + 1].double() for s in slots.tolist() if s >= 0}
    unused = [0, 3, 5]
    before_unused = pool[unused].clone()
    accepted = torch.zeros(batch, dtype=torch.int64)
    # two launches (the first commits nothing, the second commits partial, all and none from the
    # cache the first wrote, into the other cache) and the last commit (all, 1, 2)
    for verdict in ([2, 3, DEPTH, 0], [DEPTH, 0, 1, 2]):
        inputs = round_inputs(op, batch, gen)
        starts = torch.cat([exact[s] if s >= 0 else torch.zeros((1, *state_shape_of(op)), dtype=torch.float64)
                            for s in slots.tolist()])
        (o,) = compiled.spec_step(**inputs, state=pool, state_indices=slots, cache=cache, accepted=accepted,
                                  next_cache=next_cache)
        assert_rms(o, reference.recurrence(op, **inputs, initial_state=starts)[0], "spec_step o", 1e-5)
        for s, want in exact.items():
            assert_rms(pool[s:s + 1], want, f"slot {s} committed by spec_step", 1e-5)
        assert torch.equal(pool[unused], before_unused)
        accepted = torch.tensor(verdict)  # the sampler's verdict on this round, committed by the next step
        for b, s in enumerate(slots.tolist()):
            if s >= 0:
                exact[s] = advance(op, exact[s], inputs, b, verdict[b])
        cache, next_cache = next_cache, cache
    compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=accepted)
    for s, want in exact.items():
        assert_rms(pool[s:s + 1], want, f"slot {s} after the last commit", 1e-5)
    assert torch.equal(pool[unused], before_unused)


def assert_spec_step_is_commit_then_verify(compiled, op, pool_dtype, seed: int, width: int) -> None:
    """spec_step of a round gives bit for bit what commit of the previous round followed by
    verify gives: outputs, pool rows and the new cache (slot 3, at batch row 0, accepting 1 to
    DEPTH tokens; -1 is padding)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randn((4, *state_shape_of(op)), generator=gen).to(pool_dtype)
    slots = torch.tensor([3, -1])
    cache, apart_cache, fused_cache = (torch.full((4, DEPTH, 4, width), float("nan")) for _ in range(3))
    compiled.verify(**round_inputs(op, 2, gen), state=pool, state_indices=slots, cache=cache)
    accepted = torch.randint(1, DEPTH + 1, (2,), generator=gen)
    inputs = round_inputs(op, 2, gen)
    apart, fused = pool.clone(), pool.clone()
    compiled.commit(state=apart, state_indices=slots, cache=cache, accepted=accepted)
    (want_o,) = compiled.verify(**inputs, state=apart, state_indices=slots, cache=apart_cache)
    (o,) = compiled.spec_step(**inputs, state=fused, state_indices=slots, cache=cache, accepted=accepted,
                              next_cache=fused_cache)
    assert torch.isfinite(o).all()
    assert torch.equal(o, want_o)
    assert torch.equal(fused, apart)
    torch.testing.assert_close(fused_cache, apart_cache, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32_pool", "bf16_pool"])
def test_spec_step_is_commit_then_verify(layer, pool_dtype, fresh_seed):
    """The fused launch gives bit for bit what commit followed by verify gives (with a bf16 pool
    too: the new round starts from the state as the pool holds it)."""
    compiled, op = layer
    assert_spec_step_is_commit_then_verify(compiled, op, pool_dtype, fresh_seed, width=88)


def test_spec_step_refuses_overlapping_caches(layer, fresh_seed):
    compiled, op = layer
    gen = torch.Generator().manual_seed(fresh_seed)
    pool = torch.randn((2, *state_shape_of(op)), generator=gen)
    storage = torch.zeros((3, DEPTH, 4, 88))
    args = dict(round_inputs(op, 1, gen), state=pool, state_indices=torch.tensor([1]), accepted=torch.tensor([2]))
    for cache, next_cache in ((storage[:2], storage[:2]), (storage[:2], storage[1:])):
        with pytest.raises(ValueError, match=r"^next_cache: must not overlap cache"):
            compiled.spec_step(**args, cache=cache, next_cache=next_cache)


def test_slots_outside_the_pool_touch_no_memory(layer, fresh_seed):
    """Padding (-1) and slots past the pool (the host's check off) read no cache or pool row (the
    rows around the views hold NaN, which would reach o) and write none, whatever their accept
    counts."""
    compiled, op = layer
    gen = torch.Generator().manual_seed(fresh_seed)
    guarded = torch.randn((5, *state_shape_of(op)), generator=gen)  # the pool is rows 1, 2
    caches = torch.randn((2, 5, DEPTH, 4, 88), generator=gen)
    guarded[[0, 3, 4]] = caches[:, [0, 3, 4]] = float("nan")
    before = guarded.clone(), caches.clone()
    slots, accepted = torch.tensor([-1, 3]), torch.tensor([DEPTH, DEPTH])
    compiled.commit(state=guarded[1:3], state_indices=slots, cache=caches[0, 1:3], accepted=accepted,
                    check_indices=False)
    (o,) = compiled.spec_step(**round_inputs(op, 2, gen), state=guarded[1:3], state_indices=slots,
                              cache=caches[0, 1:3], accepted=accepted, next_cache=caches[1, 1:3], check_indices=False)
    assert torch.isfinite(o).all()
    for now, then in zip((guarded, caches), before):
        torch.testing.assert_close(now, then, rtol=0, atol=0, equal_nan=True)


def test_more_tokens_than_the_cache_holds_is_refused(layer, fresh_seed):
    compiled, op = layer
    inputs = round_inputs(op, 1, torch.Generator().manual_seed(fresh_seed), tokens=DEPTH + 1)
    args = dict(inputs, state=torch.zeros((1, *state_shape_of(op))), state_indices=torch.tensor([0]))
    cache, next_cache = torch.zeros((1, DEPTH, 4, 88)), torch.zeros((1, DEPTH, 4, 88))
    with pytest.raises(ValueError, match="at most 4 tokens"):
        compiled.verify(**args, cache=cache)
    with pytest.raises(ValueError, match="at most 4 tokens"):
        compiled.spec_step(**args, cache=cache, accepted=torch.tensor([0]), next_cache=next_cache)


_DRIFT_LAYERS: dict = {}


def drift_layer(tmp_path_factory, pipeline: str):
    """The drift tests' layer compiled with `pipeline`, once per pipeline (its verify_commit and
    spec_step tests share it): (compiled layer, its k3.recurrence op)."""
    if pipeline not in _DRIFT_LAYERS:
        spec = spec_from_table(recurrence_table("kda", "kv", H=1, HV=2, K=16, V=16, name="drift"))
        compiled = compile_layer(spec, out_dir=tmp_path_factory.mktemp("drift"), pipeline=pipeline)
        _DRIFT_LAYERS[pipeline] = compiled, next(iter(spec_to_module(spec).ops))
    return _DRIFT_LAYERS[pipeline]


def drift_rounds(tmp_path_factory, pipeline: str, fused: bool, seed: int, rounds: int = 50):
    """`rounds` rounds with random acceptance (verify then commit, or one spec_step per round and
    a last commit) through `pipeline`'s entries, every count 0..DEPTH among the first DEPTH + 1
    rounds: the pool then equals the float64 recurrence over the accepted tokens at fp32
    rounding. Returns the compiled layer."""
    compiled, op = drift_layer(tmp_path_factory, pipeline)
    gen = torch.Generator().manual_seed(seed)
    pool = 0.5 * torch.randn((2, 2, 16, 16), generator=gen)
    cache, next_cache = torch.zeros((2, DEPTH, 2, 48)), torch.zeros((2, DEPTH, 2, 48))
    slots, accepted = torch.tensor([1]), torch.tensor([0])
    exact = pool[1:2].double()
    every_count = torch.randperm(DEPTH + 1, generator=gen)
    for round_ in range(rounds):
        inputs = round_inputs(op, 1, gen)
        verdict = (every_count[round_:round_ + 1] if round_ <= DEPTH
                   else torch.randint(0, DEPTH + 1, (1,), generator=gen))
        if fused:  # commits the previous round's verdict, then verifies this round
            compiled.spec_step(**inputs, state=pool, state_indices=slots, cache=cache, accepted=accepted,
                               next_cache=next_cache)
            cache, next_cache = next_cache, cache
        else:
            compiled.verify(**inputs, state=pool, state_indices=slots, cache=cache)
            compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=verdict)
        accepted = verdict
        exact = advance(op, exact, inputs, 0, int(verdict))
    if fused:
        compiled.commit(state=pool, state_indices=slots, cache=cache, accepted=accepted)
    assert_rms(pool[1:2], exact, f"state after {rounds} rounds ({pipeline})", 1e-5)
    return compiled


@pytest.mark.parametrize("fused", [False, True], ids=["verify_commit", "spec_step"])
def test_fifty_rounds_do_not_drift(tmp_path_factory, fused, fresh_seed):
    """State drift over many rounds stays at fp32 rounding (the token verify)."""
    drift_rounds(tmp_path_factory, PIPELINE, fused, fresh_seed)


@pytest.mark.parametrize("fused", [False, True], ids=["verify_commit", "spec_step"])
def test_prefetching_token_loops_do_not_drift(tmp_path_factory, fused, fresh_seed):
    """token-stages: the verify and replay loops print as Triton pipelined loops (prefetching the
    next tokens' loads, a GPU-only difference) and compute the same rounds. Triton's interpreter
    runs them as plain loops, the arithmetic of test_fifty_rounds_do_not_drift: 10 rounds (every
    accept count among them) rather than its 50."""
    pipeline = f"derive-replay{{draft-tokens={DEPTH}}},lower-speculative{{block-v={BLOCK_V} token-stages=2}}"
    source = drift_rounds(tmp_path_factory, pipeline, fused, fresh_seed, rounds=10).path.read_text()
    assert source.count("for t in tl.range(bos, eos, num_stages=2):") == 2  # verify, spec_step
    assert source.count("for j in tl.range(0, n_accepted, num_stages=2):") == 2  # commit, spec_step


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
                             pipeline=PIPELINE.replace(f"block-v={BLOCK_V}", f"block-v={BLOCK_V} mode=snapshot"))
    op = next(iter(spec_to_module(spec).ops))
    gen = torch.Generator().manual_seed(fresh_seed)
    pools = [torch.randn((4, 4, 40, 24), generator=gen)] * 2
    pools = [p.clone() for p in pools]
    cache = torch.zeros((4, DEPTH, 4, 88))
    snaps = torch.full((4, DEPTH, 4, 40, 24), float("nan"))
    slots = torch.tensor([2, -1, 0])
    for accepted in ([1, 2, DEPTH], [0, 3, 2]):
        inputs = round_inputs(op, 3, gen)
        (o1,) = replay.verify(**inputs, state=pools[0], state_indices=slots, cache=cache)
        (o2,) = snapshot.verify(**inputs, state=pools[1], state_indices=slots, snapshots=snaps)
        assert torch.equal(o1, o2)
        replay.commit(state=pools[0], state_indices=slots, cache=cache, accepted=torch.tensor(accepted))
        snapshot.commit(state=pools[1], state_indices=slots, snapshots=snaps, accepted=torch.tensor(accepted))
        assert_rms(pools[1], pools[0].double(), "snapshot vs replay", 1e-6)
