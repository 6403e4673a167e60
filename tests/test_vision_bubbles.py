"""ViT work in 1F1B bubbles (k3compile.vision.bubbles): the simulator against 1F1B's closed form,
the filled schedule's invariants checked from its timeline (all ViT work done once, forward before
its microbatch enters the pipeline, backward after its gradient exists, one action at a time a
rank, text order kept), its exposed time against the floor and the issue's target, bad input."""

from __future__ import annotations

import random

import pytest

from k3compile.vision import bubbles as B


def random_costs(stages, microbatches, text=100.0, vit=(20.0, 120.0), seed=0, uneven=False, latency=0.0):
    rng = random.Random(seed)
    forward = tuple(text * (rng.uniform(0.6, 1.4) if uneven else 1.0) for _ in range(stages))
    vf = tuple(rng.uniform(*vit) for _ in range(microbatches))
    return B.PipelineCosts(forward=forward, backward=tuple(2 * f for f in forward), vit_forward=vf,
                           vit_backward=tuple(2 * v for v in vf), chunk=0.5, latency=latency)


@pytest.mark.parametrize("stages, microbatches", [(1, 1), (2, 5), (4, 4), (8, 32), (5, 3)])
def test_one_f_one_b_closed_form(stages, microbatches):
    """Uniform stages, no latency: (M + S - 1) (f + b)."""
    costs = B.PipelineCosts((7.0,) * stages, (11.0,) * stages, (1.0,) * microbatches, (1.0,) * microbatches)
    assert B.text_only(costs).step == pytest.approx((microbatches + stages - 1) * 18.0)


def check_timeline(schedule, costs):
    S, M = costs.stages, costs.microbatches
    at = {}
    vf, vb = [0.0] * M, [0.0] * M
    for rank, (actions, times) in enumerate(zip(schedule.lists, schedule.times)):
        assert len(actions) == len(times)
        for (s0, e0), (s1, _) in zip(times, times[1:]):
            assert e0 <= s1 + 1e-9, f"rank {rank}: two actions at once"
        text = [(a.kind, a.microbatch) for a in actions if a.kind in B.TEXT]
        plain = [(a.kind, a.microbatch) for a in B.one_f_one_b(S, M, lambda s, m: 1, lambda s, m: 1)[rank]]
        assert sorted(text) == sorted(plain) and len(text) == 2 * M
        for a, (start, end) in zip(actions, times):
            assert end - start == pytest.approx(a.duration)
            if a.kind in B.TEXT:
                assert a.stage == rank
                at[(a.kind, rank, a.microbatch)] = (start, end)
            elif a.kind == "VF":
                vf[a.microbatch] += a.duration
            else:
                vb[a.microbatch] += a.duration
    assert vf == pytest.approx(list(costs.vit_forward)) and vb == pytest.approx(list(costs.vit_backward))
    for rank, (actions, times) in enumerate(zip(schedule.lists, schedule.times)):
        for a, (start, end) in zip(actions, times):
            if a.kind == "VF":
                assert end + costs.latency <= at[("F", 0, a.microbatch)][0] + 1e-9
            elif a.kind == "VB":
                assert start >= at[("B", 0, a.microbatch)][1] + costs.latency - 1e-9
    for m in range(M):  # the text dependencies still hold
        for s in range(1, S):
            assert at[("F", s, m)][0] >= at[("F", s - 1, m)][1] + costs.latency - 1e-9
            assert at[("B", s - 1, m)][0] >= at[("B", s, m)][1] + costs.latency - 1e-9


@pytest.mark.parametrize("stages, microbatches, uneven, latency", [
    (8, 32, False, 0.0), (4, 7, True, 0.3), (3, 2, True, 0.0), (16, 64, False, 0.05), (2, 9, True, 1.0)])
def test_filled_schedule_keeps_every_constraint(stages, microbatches, uneven, latency, fresh_seed):
    costs = random_costs(stages, microbatches, seed=fresh_seed, uneven=uneven, latency=latency)
    filled = B.fill_bubbles(costs)
    check_timeline(filled, costs)
    text = B.text_only(costs)
    vit_per_rank = (sum(costs.vit_forward) + sum(costs.vit_backward)) / stages
    exposed = filled.step - text.step
    assert exposed >= B.exposure_floor(costs) * (1 - 1e-9) - 1e-9
    assert filled.step <= B.vit_before_pipeline(costs).step + 1e-6
    assert exposed <= B.exposure_floor(costs) + 0.05 * vit_per_rank, (exposed / vit_per_rank,)


def test_issue_target_pp8_32_microbatches(fresh_seed):
    """ViT work that fits the bubbles (a microbatch's encoder forward 20-120% of a text stage's):
    exposed <= 10% of its compute (unfilled: 100%)."""
    costs = random_costs(8, 32, text=100.0, vit=(20.0, 120.0), seed=fresh_seed, latency=0.05)
    text = B.text_only(costs)
    vit_per_rank = (sum(costs.vit_forward) + sum(costs.vit_backward)) / 8
    assert (B.vit_before_pipeline(costs).step - text.step) / vit_per_rank == pytest.approx(1.0, abs=0.02)
    assert (B.fill_bubbles(costs).step - text.step) / vit_per_rank <= 0.10


def test_reordering_puts_the_lightest_ends_out():
    costs = B.PipelineCosts((100.0,) * 4, (200.0,) * 4, (500.0, 10.0, 300.0, 40.0), (1000.0, 20.0, 600.0, 5.0))
    filled = B.fill_bubbles(costs)
    first_vit = next(a for a in filled.lists[0] if a.kind in ("VF", "F"))
    assert first_vit.microbatch == 1
    assert [a.microbatch for a in filled.lists[0] if a.kind == "B"][-1] == 3
    check_timeline(filled, costs)
    assert filled.step <= B.fill_bubbles(costs, reorder=False).step


def test_heavy_vit_cannot_hide_and_says_so():
    """ViT work far beyond the bubbles: exposure near its floor, above zero."""
    costs = random_costs(4, 16, text=10.0, vit=(200.0, 300.0))
    text, filled = B.text_only(costs), B.fill_bubbles(costs)
    floor = B.exposure_floor(costs)
    assert floor > 0 and filled.step - text.step >= floor * (1 - 1e-9)


def test_live_activations_counted():
    costs = random_costs(4, 6)
    assert B.vit_before_pipeline(costs).live_vit_activations() == 6
    assert 1 <= B.fill_bubbles(costs).live_vit_activations() <= 6


def test_deadlock_is_an_error():
    lists = [[B.Action("B", 0, 0, 1.0), B.Action("F", 0, 0, 1.0)]]
    with pytest.raises(ValueError, match="deadlock"):
        B.simulate("backwards", lists)


@pytest.mark.parametrize("change, match", [
    (dict(forward=(1.0, 2.0), backward=(1.0,)), "one time per stage"),
    (dict(vit_forward=(), vit_backward=()), "one time per microbatch"),
    (dict(vit_forward=(1.0, -1.0)), "finite times"),
    (dict(forward=(float("nan"),), backward=(1.0,)), "finite times"),
    (dict(chunk=0.0), "chunk"),
])
def test_bad_costs_one_line(change, match):
    table = dict(forward=(1.0,), backward=(2.0,), vit_forward=(1.0, 1.0), vit_backward=(2.0, 2.0))
    with pytest.raises(ValueError, match=match) as info:
        B.PipelineCosts(**{**table, **change})
    assert "\n" not in str(info.value)
