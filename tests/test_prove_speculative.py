"""`k3c prove` of speculative decoding's schedules: derive-replay's replay and spec step, and
lower-speculative{verify=chunked}'s round of drafts as one chunk, hold for every accepted count
in exact arithmetic; deliberately wrong ones do not."""

from __future__ import annotations

import pytest

from conftest import EXAMPLES, RECURRENCE_KINDS
from k3compile.checking.prove import prove_chunked_verify, prove_replay, prove_spec_step
from k3compile.ir import k3s
from k3compile.passes.common import make, props
from k3compile.spec import load_spec


def spec_of(kind: str):
    return load_spec(EXAMPLES / f"{kind}.toml")



@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
@pytest.mark.parametrize("draft_tokens", [1, 2, 5])
def test_replay_proof_holds_for_every_accepted_count(kind, draft_tokens, fresh_seed):
    results = prove_replay(spec_of(kind), draft_tokens, seed=fresh_seed)
    assert [r.schedule.rsplit(" ", 1)[-1] for r in results] == [str(m) for m in range(draft_tokens + 1)]
    assert all(r.holds for r in results), [r.first_mismatch for r in results if not r.holds]


def patch_replay(monkeypatch, mutate):
    from k3compile.passes import derive_replay

    original = derive_replay.speculative_schedule

    def wrong(*args):
        schedule = original(*args)
        mutate(schedule)
        return schedule

    monkeypatch.setattr(derive_replay, "speculative_schedule", wrong)


def replay_ignores_the_gate(schedule):
    for op in schedule.walk():
        if isinstance(op, k3s.ReplayOp):
            op.properties.update(props(k3s.ReplayOp, gate="none"))


def verify_caches_nothing(schedule):
    for op in list(schedule.walk()):
        if isinstance(op, k3s.CacheUpdateOp):
            op.detach()
            op.erase()


def cache_before_the_correction(schedule):
    """Cache v as it is before the delta rule corrects it: the replay then adds beta-less raw values."""
    for op in list(schedule.walk()):
        if isinstance(op, k3s.CacheUpdateOp):
            loop = op.parent_op()
            correction = next(o for o in loop.body.ops if isinstance(o, k3s.DeltaCorrectOp))
            op.detach()
            loop.body.block.insert_op_before(op, correction)
            op.operands = (*op.operands[:2], correction.values, *op.operands[3:])  # (cache, k, u, g)


@pytest.mark.parametrize("kind, mutate", [
    ("kda", replay_ignores_the_gate),
    ("gated_deltanet", replay_ignores_the_gate),
    ("gla", replay_ignores_the_gate),
    ("deltanet", verify_caches_nothing),
    ("kda", cache_before_the_correction),
])
def test_wrong_replay_schedule_fails_the_proof(monkeypatch, kind, mutate, fresh_seed):
    patch_replay(monkeypatch, mutate)
    results = prove_replay(spec_of(kind), 3, seed=fresh_seed)
    assert results[0].state_equal  # nothing accepted: the committed state, whatever the schedule
    assert not all(r.holds for r in results[1:])


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_spec_step_proof_holds_for_every_accepted_count(kind, draft_tokens, fresh_seed):
    results = prove_spec_step(spec_of(kind), draft_tokens, seed=fresh_seed)
    assert [r.schedule.rsplit(" ", 1)[-1] for r in results] == [str(m) for m in range(draft_tokens + 1)]
    assert all(r.holds for r in results), [r.first_mismatch for r in results if not r.holds]


def patch_spec_step(monkeypatch, mutate):
    """lower-speculative with `mutate` applied to the body of the spec_step kernel it builds."""
    from k3compile.passes import lower_speculative

    original = lower_speculative.serving_entries

    def wrong(*args):
        entries = original(*args)
        step = next(e for e in entries if e.sym_name.data == "spec_step")
        mutate(next(op for op in step.body.ops if isinstance(op, k3s.KernelOp)).body.block)
        return entries

    monkeypatch.setattr(lower_speculative, "serving_entries", wrong)


def commit_after_verifying(block):
    store = next(op for op in block.ops if isinstance(op, k3s.StoreStateOp))
    store.detach()
    block.add_op(store)
    store.operands[0] = next(op for op in block.ops if isinstance(op, k3s.TokenLoopOp)).final


def verify_without_committing(block):
    replay = next(op for op in block.ops if isinstance(op, k3s.ReplayOp))
    replay.replayed.replace_all_uses_with(replay.state)
    replay.detach()
    replay.erase()


@pytest.mark.parametrize("mutate", [commit_after_verifying, verify_without_committing])
def test_wrong_spec_step_fails_the_proof(monkeypatch, mutate, fresh_seed):
    patch_spec_step(monkeypatch, mutate)
    results = prove_spec_step(spec_of("kda"), 2, seed=fresh_seed)
    if mutate is commit_after_verifying:  # the row holds the state after round 2, whatever m
        assert not any(r.holds for r in results)
    else:  # nothing accepted needs no replay
        assert results[0].holds and not any(r.holds for r in results[1:])


# --- lower-speculative{verify=chunked}: a round's drafts as one chunk ------------------------


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
@pytest.mark.parametrize("draft_tokens", [1, 2, 5])
def test_chunked_verify_proof_holds_for_every_accepted_count(kind, draft_tokens, fresh_seed):
    results = prove_chunked_verify(spec_of(kind), draft_tokens, seed=fresh_seed)
    assert [r.schedule.rsplit(" ", 1)[-1] for r in results] == [str(m) for m in range(draft_tokens + 1)]
    assert all(r.holds for r in results), [r.first_mismatch for r in results if not r.holds]


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_chunked_spec_step_proof_holds_for_every_accepted_count(kind, draft_tokens, fresh_seed):
    results = prove_spec_step(spec_of(kind), draft_tokens, seed=fresh_seed, verify="chunked")
    assert [r.schedule.rsplit(" ", 1)[-1] for r in results] == [str(m) for m in range(draft_tokens + 1)]
    assert all("verify=chunked" in r.schedule and r.holds for r in results), [r.first_mismatch for r in results]


def patch_chunked_kernels(monkeypatch, mutate):
    """lower-speculative{verify=chunked} with `mutate` applied to every chunked verify it builds
    ((workspaces, prepare kernel, scan kernel))."""
    from k3compile.passes import lower_speculative

    original = lower_speculative.chunked_verify

    def wrong(*args):
        built = original(*args)
        mutate(*built)
        return built

    monkeypatch.setattr(lower_speculative, "chunked_verify", wrong)


def cache_the_raw_values(workspaces, prepare, scan):
    """Cache v instead of the corrected rows of vr: the replay adds beta-less raw values."""
    (loop,) = [op for op in scan.walk() if isinstance(op, k3s.ChunkLoopOp)]
    v = next(op.tensor for op in prepare.walk() if isinstance(op, k3s.LoadChunkOp) and k3s.loads_values(op))
    load_v = make(k3s.LoadChunkOp, operands=[v], result=("v", k3s.tile("C", "V")))
    loop.body.block.insert_op_before(load_v, loop.body.block.first_op)
    for op in scan.walk():
        if isinstance(op, k3s.CacheUpdateOp):
            op.operands = (*op.operands[:2], load_v.results[0], *op.operands[3:])  # (cache, k, u, g)


def spill_no_queries(workspaces, prepare, scan):
    for op in list(prepare.walk()):
        if isinstance(op, k3s.SpillOp) and k3s.argument_name(op.workspace) in ("QG", "P"):
            op.detach()
            op.erase()


@pytest.mark.parametrize("mutate", [cache_the_raw_values, spill_no_queries])
def test_wrong_chunked_verify_fails_the_proof(monkeypatch, mutate, fresh_seed):
    patch_chunked_kernels(monkeypatch, mutate)
    results = prove_chunked_verify(spec_of("kda"), 3, seed=fresh_seed)
    if mutate is cache_the_raw_values:  # the outputs are right; what it caches is not
        assert all(r.outputs_equal for r in results) and results[0].holds
        # (a random k_j of zeros, ~1% per token at K = 2, makes u_j irrelevant to S_j: the last
        # state still carries every earlier token's wrong u)
        assert not results[-1].holds
    else:
        assert not any(r.holds for r in results) and "reloads" in results[0].first_mismatch
    assert not all(r.holds for r in prove_spec_step(spec_of("kda"), 2, seed=fresh_seed, verify="chunked"))
