"""examples/prefix_cache_sim.py in a tiny mode (a few dozen requests a trace, no plot): the
invariants that relate its policies, which a wrong trace, policy or simulation would break."""

from __future__ import annotations

import importlib.util
import sys
import tempfile

import pytest

from conftest import EXAMPLES

_spec = importlib.util.spec_from_file_location("prefix_cache_sim", EXAMPLES / "prefix_cache_sim.py")
sim = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = sim  # dataclasses look their module up while the file runs
_spec.loader.exec_module(sim)

REQUESTS = 40
EVERY = (4, 8)
ALIGNED = (2112, 8320)
CHECKPOINT_BYTES = 48 * sim.STATE_BYTES_PER_LAYER
SHARED_TRACES = ("chat", "agent", "template")


def run_all(trace: str, budget_bytes: int | None = None) -> dict[str, object]:
    requests = sim.TRACES[trace](REQUESTS, 7)
    return {policy.name: sim.simulate(trace, requests, policy, CHECKPOINT_BYTES, budget_bytes)
            for policy in sim.policies(list(EVERY), list(ALIGNED))}


@pytest.fixture(scope="module")
def unbounded():
    return {trace: run_all(trace) for trace in (*SHARED_TRACES, "unique")}


@pytest.mark.parametrize("trace", SHARED_TRACES)
def test_every_block_resumes_at_least_as_far_and_holds_more(unbounded, trace):
    every = unbounded[trace]["every-block"]
    for n in EVERY:
        sparse = unbounded[trace][f"ours-n{n}"]
        assert sparse.hit_rate > 0.5  # the trace shares prefixes: the comparisons below are not vacuous
        assert every.matched == sparse.matched  # same 512-token blocks, none evicted
        assert all(e >= s for e, s in zip(every.resumed, sparse.resumed))
        assert sparse.peak_bytes < every.peak_bytes


@pytest.mark.parametrize("trace", SHARED_TRACES)
def test_resume_points_follow_the_policy(unbounded, trace):
    """Without a budget every-block resumes at the match, ours-nN within N - 1 blocks of it, and
    for every policy recompute = matched - resumed, on block boundaries."""
    for name, outcome in unbounded[trace].items():
        block = outcome.policy.block_tokens
        for matched, resumed, recomputed in zip(outcome.matched, outcome.resumed, outcome.recomputed):
            assert recomputed == matched - resumed
            assert 0 <= resumed <= matched and matched % block == 0 and resumed % block == 0
            assert recomputed <= (outcome.policy.every_blocks - 1) * block, name
    assert unbounded[trace]["every-block"].resumed == unbounded[trace]["every-block"].matched


@pytest.mark.parametrize("trace", SHARED_TRACES)
def test_aligned_never_hits_a_prompt_shorter_than_its_block(unbounded, trace):
    for size in ALIGNED:
        outcome = unbounded[trace][f"aligned-{size}"]
        for length, matched in zip(outcome.prompt_tokens, outcome.matched):
            if length - 1 < size:  # the lookup sees all but the last token
                assert matched == 0


def test_no_shared_prefix_no_hit(unbounded):
    for outcome in unbounded["unique"].values():
        assert outcome.hits == 0 and sum(outcome.matched) == 0 and sum(outcome.resumed) == 0


def test_budget_bounds_the_bytes_and_not_the_matches(unbounded):
    """A budget of 8 checkpoints: held bytes never exceed it, checkpoints get evicted, and the
    blocks (hits, matched tokens) are the same as without it."""
    budget = 8 * CHECKPOINT_BYTES
    for name, outcome in run_all("agent", budget).items():
        free = unbounded["agent"][name]
        assert outcome.peak_bytes <= budget
        assert outcome.matched == free.matched
        assert sum(outcome.resumed) <= sum(free.resumed)
        if free.peak_bytes > budget:
            assert outcome.evicted_checkpoints > 0


def test_traces_are_seeded():
    first, again, other = sim.chat_trace(20, 3), sim.chat_trace(20, 3), sim.chat_trace(20, 4)
    assert [r.tokens().tolist() for r in first] == [r.tokens().tolist() for r in again]
    assert [r.tokens().tolist() for r in first] != [r.tokens().tolist() for r in other]


def test_command_line_writes_the_table(tmp_path, capsys):
    sim.main(["--requests", "12", "--budget-gib", "1", "--no-plot", "--out", str(tmp_path / "sim")])
    text = (tmp_path / "sim" / "prefix_cache_sim.md").read_text()
    assert text in capsys.readouterr().out
    for trace in SHARED_TRACES:
        for policy in ("ours-n4", "ours-n8", "every-block", "aligned-2112", "aligned-8320"):
            assert text.count(f"| {trace} | {policy} |") == 2  # without a budget and under 1 GiB
    assert "Not measured separately" in text and "96 MiB" in text


def test_writes_to_a_temporary_folder_unless_told(tmp_path, monkeypatch, capsys):
    """With no --out nothing is written where the script runs (from the repository root that
    overwrote the tracked results): the table and the plot go to a new temporary folder, named."""
    for folder in ("temporary", "checkout"):
        (tmp_path / folder).mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    monkeypatch.chdir(tmp_path / "checkout")
    drawn = []
    monkeypatch.setattr(sim, "plot", lambda outcomes, path: drawn.append(path) or True)
    sim.main(["--requests", "12", "--budget-gib", "1"])
    [folder] = (tmp_path / "temporary").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["prefix_cache_sim.md"]
    assert drawn == [folder / "prefix_cache_sim.png"]
    assert not any((tmp_path / "checkout").iterdir()), "nothing written where it ran"
    assert f"wrote {folder / 'prefix_cache_sim.md'}" in capsys.readouterr().out
