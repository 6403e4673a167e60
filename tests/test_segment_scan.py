"""derive-segment-scan (context parallelism): the schedule follows from the op, `k3c prove`
proves it for every member (the combine's associativity symbolically, split + combine + finish
in exact rationals), deliberately wrong derivations fail, and the float64 segment summaries of
ir/reference.py (the oracle of the CP kernels to come) agree with the recurrence and with the
exact semantics."""

from __future__ import annotations

import random

import pytest
import torch
from xdsl.dialects.builtin import BoolAttr

import k3compile.passes.derive_segment_scan as derive_segment_scan
import k3compile.passes.lower_segment_scan as lower_segment_scan
import k3compile.checking.prove as prove
from conftest import EXAMPLES, RecurrenceShape, as_tensor, exact_as_torch, recurrence_inputs, recurrence_table, run_cli
from k3compile.errors import IRError
from k3compile.frontend import spec_to_module
from k3compile.checking import exact
from k3compile.ir import k3s, reference
from k3compile.pipeline import run_pipeline
from k3compile.checking.prove import prove_segment_scan
from k3compile.spec import load_spec, spec_from_table

f64 = torch.float64

# Every transition form: the four members, plus the op's two members the spec loader has no kind
# for (a scalar gate without the delta rule; no gate and no delta rule: linear attention), made
# by turning the delta rule off on a member's op.
MEMBERS = {  # name -> (kind, delta rule turned off, transition form)
    "kda": ("kda", False, "full"),
    "gated_deltanet": ("gated_deltanet", False, "full"),
    "deltanet": ("deltanet", False, "full"),
    "gla": ("gla", False, "diagonal"),
    "scalar_gla": ("gated_deltanet", True, "scalar"),
    "linear": ("deltanet", True, "identity"),
}


def without_delta_rule(module):
    layer = next(iter(module.ops))
    layer.properties["delta_rule"] = BoolAttr.from_bool(False)
    layer.verify()
    return module


def member_spec(monkeypatch, member: str):
    """The spec to prove for a member; for the two without a spec kind, prove.small_op is made
    to build the member's op from its kind's."""
    kind, no_delta, _ = MEMBERS[member]
    if no_delta:
        small_op = prove.small_op
        monkeypatch.setattr(prove, "small_op", lambda spec: without_delta_rule(small_op(spec)))
    return load_spec(EXAMPLES / f"{kind}.toml")


def member_op(member: str, layout: str = "kv", **shape):
    kind, no_delta, _ = MEMBERS[member]
    module = spec_to_module(spec_from_table(recurrence_table(kind, layout, name=f"{member}_{layout}", **shape)))
    return next(iter((without_delta_rule(module) if no_delta else module).ops))


def derived(module, pipeline: str = "derive-segment-scan{chunk-size=4}") -> k3s.SegmentScanOp:
    run_pipeline(module, pipeline)
    return next(op for op in module.walk() if isinstance(op, k3s.SegmentScanOp))


# --- the derivation ---------------------------------------------------------------------------


@pytest.mark.parametrize("member", MEMBERS)
def test_transition_form_follows_from_the_op(member):
    scan = derived(member_op(member).parent_op())
    summary, combine, chunked = scan.body.ops
    assert summary.transition.data == combine.transition.data == MEMBERS[member][2]
    assert isinstance(chunked, k3s.ChunkedOp) and chunked.chunk_size.value.data == 4


@pytest.mark.parametrize("member", MEMBERS)
def test_segments_finish_with_the_chunk_schedule(member):
    """The chunked schedule inside the segment scan is derive-chunkwise's, stage for stage."""
    module = member_op(member).parent_op()
    run_pipeline(module, "derive-chunkwise{chunk-size=4},derive-segment-scan{chunk-size=4}")
    chunk, inner = [op for op in module.walk() if isinstance(op, k3s.ChunkedOp)]
    assert isinstance(inner.parent_op(), k3s.SegmentScanOp)
    assert str(inner) == str(chunk)


@pytest.mark.parametrize("member", MEMBERS)
def test_state_pass_is_what_the_state_depends_on(member):
    """A summary runs exactly the stages the carried state depends on, in program order: the
    chunked schedule without its output, whose dead values are gone; the query Gram (with the
    queries' Gram factor) and the decayed queries, which only the output read, are left out."""
    chunked = derived(member_op(member).parent_op()).body.ops.last
    state_pass = lower_segment_scan.state_pass_schedule(chunked)
    kept = [op.name for op in state_pass.walk()]
    assert kept == [op.name for op in chunked.walk() if op.name in kept and not (
        isinstance(op, k3s.ChunkOutputOp) or op.results and op.results[0].name_hint in ("P", "QG", "q", "ql"))]
    for op in state_pass.walk():  # each value is read: nothing dead remains
        for value in op.results:
            assert value.uses, f"{op.name} makes %{value.name_hint}, which nothing reads"
    assert not any(isinstance(op, k3s.ChunkOutputOp) or op.results and op.results[0].name_hint in ("P", "QG")
                   for op in state_pass.walk())
    assert any(isinstance(op, k3s.ForwardSubstitutionOp) for op in state_pass.walk()) == (MEMBERS[member][2] == "full")


# --- the proof holds ----------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 3])
@pytest.mark.parametrize("member", MEMBERS)
def test_segment_scan_proved(monkeypatch, member, chunk_size, fresh_seed):
    results = prove_segment_scan(member_spec(monkeypatch, member), chunk_size, seed=fresh_seed)
    assert results[0].length is None and "associative" in results[0].schedule
    splits = [r.schedule.rsplit(" ", 1)[-1] for r in results[1:]]
    length = 2 * chunk_size + 3
    assert splits[0] == str(length) and splits[1] == f"1+{length - 1}" and splits[-1] == "+".join(["1"] * length)
    assert len(splits[2].split("+")) == 3 and "1" in splits[3].split("+")  # three random segments; one token inside
    for r in results:
        assert r.holds, f"{r.schedule}: {r.first_mismatch}"


@pytest.mark.parametrize("member", ["kda", "gla"])
def test_segment_scan_proved_at_chunk_boundaries_and_inside_chunks(monkeypatch, member, fresh_seed):
    cuts = [[4], [4, 8], [2, 5, 11], [3, 4, 5]]
    results = prove_segment_scan(member_spec(monkeypatch, member), 4, length=13, cuts=cuts, seed=fresh_seed)
    assert [r.schedule.rsplit(" ", 1)[-1] for r in results[1:]] == ["4+9", "4+4+5", "2+3+6+2", "3+1+1+8"]
    assert all(r.holds for r in results), [r.first_mismatch for r in results if not r.holds]


# --- deliberately wrong derivations fail ----------------------------------------------------------


def swapped_product_order(combine, later, earlier):
    """(M1 M2, M2 N1 + N2): the transition product in the wrong order."""
    (M2, N2), (M1, N1) = later, earlier
    form = combine.transition.data
    return exact.transition_apply(form, M1, M2), exact.transition_apply(form, M2, N1) + N2


@pytest.mark.parametrize("member", ["kda", "gated_deltanet", "deltanet"])
def test_swapped_product_order_fails_for_the_delta_rule(monkeypatch, member, fresh_seed):
    monkeypatch.setattr(exact, "combine_summaries", swapped_product_order)
    results = prove_segment_scan(member_spec(monkeypatch, member), 3, seed=fresh_seed)
    associative, unsplit, *split = results
    # only non-commutative symbols tell M1 M2 from M2 M1
    assert not associative.holds and "differs" in associative.first_mismatch
    assert unsplit.holds  # one segment: nothing is combined
    # small random rationals can make one split's states commute by chance: most must fail, and
    # the split into single tokens (the most combines) always
    assert sum(not r.holds for r in split) >= len(split) - 1 and not split[-1].holds


@pytest.mark.parametrize("member", ["gla", "scalar_gla"])
def test_swapped_product_order_is_harmless_when_transitions_commute(monkeypatch, member, fresh_seed):
    """Diagonal and scalar transitions commute: the proof must not fail where nothing is wrong."""
    monkeypatch.setattr(exact, "combine_summaries", swapped_product_order)
    results = prove_segment_scan(member_spec(monkeypatch, member), 3, seed=fresh_seed)
    assert all(r.holds for r in results)


WRONG_FORMS = [
    ("kda", "diagonal"),  # drops the delta rule's rank-one corrections from M
    ("kda", "scalar"),
    ("gated_deltanet", "scalar"),
    ("deltanet", "identity"),
    ("gla", "identity"),  # drops the decay
    ("gla", "scalar"),  # one decay for every channel
    ("scalar_gla", "identity"),
]


@pytest.mark.parametrize("member, wrong", WRONG_FORMS, ids=[f"{m}-as-{w}" for m, w in WRONG_FORMS])
def test_wrong_transition_form_fails(monkeypatch, member, wrong, fresh_seed):
    monkeypatch.setattr(derive_segment_scan, "transition_form", lambda op: wrong)
    results = prove_segment_scan(member_spec(monkeypatch, member), 3, seed=fresh_seed)
    assert results[0].schedule.endswith(f"({prove.SYMBOLS_OF_FORM[wrong]})")
    assert results[0].holds  # the wrong form's combine is associative all the same...
    assert not any(r.holds for r in results[1:])  # ...but its summaries are not the segments'
    assert not any(r.state_equal for r in results[1:])


def test_summary_reading_what_no_stage_produced_is_refused(monkeypatch, fresh_seed):
    """A schedule whose triangular solve is gone while its T is still read is not well formed:
    the verifier after derive-segment-scan refuses it before any proof."""
    original = derive_segment_scan.derive_chunkwise.chunkwise_schedule

    def without_solve(*args, **kwargs):
        chunked = original(*args, **kwargs)
        solve = next(op for op in chunked.walk() if isinstance(op, k3s.ForwardSubstitutionOp))
        solve.detach()
        solve.erase(safe_erase=False)
        return chunked

    monkeypatch.setattr(derive_segment_scan.derive_chunkwise, "chunkwise_schedule", without_solve)
    with pytest.raises(IRError, match="derive-segment-scan.*Erased SSA value"):
        prove_segment_scan(load_spec(EXAMPLES / "kda.toml"), 3, seed=fresh_seed)


# --- k3c prove ----------------------------------------------------------------------------------


def segment_scan_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if "derive-segment-scan" in line]


def test_cli_prove_shows_the_segment_scan(capsys, fresh_seed):
    code, out, err = run_cli(capsys, "prove", EXAMPLES / "kda.toml", "--chunk-size", 4, "--chunk-size", 2,
                             "--draft-tokens", 1, "--seed", fresh_seed)
    assert code == 0, f"{out}\n{err}"
    rows = segment_scan_rows(out)
    assert len(rows) == 6 and all("proved" in row for row in rows)  # associativity, 5 splits
    assert "combine associative (non-commutative M, N)" in rows[0] and "│ - │ -" in rows[0]
    assert "derive-segment-scan{chunk-size=2}, segments 7 " in rows[1]  # the smallest chunk size, T = 2C + 3


def test_cli_prove_wrong_segment_scan_exits_1(capsys, monkeypatch, fresh_seed):
    monkeypatch.setattr(derive_segment_scan, "transition_form", lambda op: "identity")
    code, out, err = run_cli(capsys, "prove", EXAMPLES / "gla.toml", "--chunk-size", 3, "--draft-tokens", 1,
                             "--seed", fresh_seed)
    assert code == 1 and "Traceback" not in err
    rows = segment_scan_rows(out)
    assert "proved" in rows[0] and all("FAILED" in row for row in rows[1:])
    assert sum("FAILED" in line for line in out.splitlines()) == 5  # nothing else fails


# --- the float64 oracle of the CP kernels ---------------------------------------------------------


def random_segments(sequence_edges: list[int], rng: random.Random) -> list[int]:
    """Segment offsets through every sequence edge, with random cuts inside sequences."""
    cuts = {t for start, end in zip(sequence_edges, sequence_edges[1:]) for t in range(start + 1, end)
            if rng.random() < 0.4}
    return sorted(set(sequence_edges) | cuts)


def as64(inputs: dict) -> dict:
    return {name: t.to(f64) if t.is_floating_point() else t for name, t in inputs.items()}


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("member", MEMBERS)
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_reference_summaries_compose_to_the_recurrence(member, layout, varlen, fresh_seed):
    """Per sequence, folding M S + N over its segments from S0 gives the final state, and every
    segment run from its combined initial state gives the unsplit outputs."""
    kind = MEMBERS[member][0]
    H, HV, K, V = 1, 2, 3, 4
    op = member_op(member, layout, H=H, HV=HV, K=K, V=V)
    shape = (RecurrenceShape(B=1, T=11, H=H, HV=HV, K=K, V=V, seqlens=(6, 1, 4)) if varlen
             else RecurrenceShape(B=2, T=6, H=H, HV=HV, K=K, V=V))
    x = as64(recurrence_inputs(kind, layout, shape))
    if MEMBERS[member][1]:
        x.pop("beta")
    cu = x.pop("cu_seqlens", None)
    x["k"] = torch.randn_like(x["k"])  # un-normalised keys: the affine form needs no |k| = 1
    edges = cu.tolist() if varlen else [b * shape.T for b in range(shape.B + 1)]
    segments = random_segments(edges, random.Random(fresh_seed))
    M, N = reference.segment_summaries(op, x["k"], x["v"], x.get("g"), x.get("beta"), segments, cu_seqlens=cu)
    assert N.shape[0] == len(segments) - 1
    o, final = reference.recurrence(op, **x, cu_seqlens=cu, output_final_state=True)

    starts = []  # the initial state of every segment, from the combined summaries before it
    for n, (first, last) in enumerate(zip(edges, edges[1:])):
        state = x["initial_state"][n]
        for p in range(segments.index(first), segments.index(last)):
            starts.append(state)
            state = reference.apply_summary(op, (None if M is None else M[p], N[p]), state)
        torch.testing.assert_close(state, final[n], rtol=1e-10, atol=1e-10)
    flat = {name: t.reshape(1, -1, *t.shape[2:]) for name, t in x.items() if name != "initial_state"}
    o_segments, _ = reference.recurrence(op, **flat, initial_state=torch.stack(starts),
                                         cu_seqlens=torch.tensor(segments))
    torch.testing.assert_close(o_segments.reshape(o.shape), o, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("member", MEMBERS)
def test_reference_combine_is_the_summary_of_the_union(member, layout):
    kind, _, form = MEMBERS[member]
    H, HV, K, V = 2, 2, 3, 2
    op = member_op(member, layout, H=H, HV=HV, K=K, V=V)
    x = as64(recurrence_inputs(kind, layout, RecurrenceShape(B=1, T=7, H=H, HV=HV, K=K, V=V), initial_state=False))
    if MEMBERS[member][1]:
        x.pop("beta")
    args = (op, x["k"], x["v"], x.get("g"), x.get("beta"))
    (M, N), (M_all, N_all) = reference.segment_summaries(*args, [0, 2, 7]), reference.segment_summaries(*args, [0, 7])
    M_combined, N_combined = reference.combine_summaries(op, (None if M is None else M[1], N[1]),
                                                         (None if M is None else M[0], N[0]))
    torch.testing.assert_close(N_combined, N_all[0], rtol=1e-10, atol=1e-10)
    held = {"full": (HV, K, K), "diagonal": (HV, K), "scalar": (HV,), "identity": None}[form]
    if held is None:
        assert M is None and M_combined is None
    else:
        assert tuple(M_all.shape) == (1, *held)
        torch.testing.assert_close(M_combined, M_all[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("segments", [
    [0, 3, 7, 12],  # the second segment spans both sequences
    [0, 4, 4, 6, 12],  # an empty segment
    [0, 6, 3, 12],  # not rising
    [1, 6, 12],  # not from the first token
    [0, 6],  # not to the last
])
def test_reference_segments_must_respect_sequences(segments):
    op = member_op("kda", H=1, K=2, V=2)
    x = recurrence_inputs("kda", "kv", RecurrenceShape(B=2, T=6, H=1, HV=1, K=2, V=2))
    with pytest.raises(ValueError, match="every sequence boundary"):
        reference.segment_summaries(op, x["k"], x["v"], x["g"], x["beta"], segments)


@pytest.mark.parametrize("member", MEMBERS)
def test_exact_summary_matches_reference(monkeypatch, member, fresh_seed):
    """exact.py's summary (through the chunked state pass, a full M as extra state columns) and
    reference.py's (the product of token transitions, the recurrence from zero): two oracles agree."""
    form = MEMBERS[member][2]
    K, V, T = 2, 3, 7
    op = member_op(member, H=1, K=K, V=V)
    scan = derived(op.parent_op(), "derive-segment-scan{chunk-size=3}")
    x = exact.random_inputs(random.Random(fresh_seed), T, K, V, op.gate.data)
    M_exact, N_exact = exact.segment_summary(scan, x)
    tensors = exact_as_torch(x, op.gate.data, form == "full")
    M, N = reference.segment_summaries(op, tensors["k"], tensors["v"], tensors["g"], tensors["beta"], [0, T])
    torch.testing.assert_close(N[0, 0], as_tensor(N_exact), rtol=1e-10, atol=1e-10)
    if form == "identity":
        assert M is None and M_exact is None
    else:
        want = {"full": lambda: as_tensor(M_exact), "diagonal": lambda: as_tensor(M_exact)[:, 0],
                "scalar": lambda: torch.tensor(float(M_exact), dtype=f64)}[form]()
        torch.testing.assert_close(M[0, 0], want, rtol=1e-10, atol=1e-10)


def test_fuse_chunkwise_leaves_the_segment_scans_schedule_to_its_owner():
    """fuse-chunkwise lowers the chunk entry's schedule and leaves the one nested in a segment
    scan (its finish) in place, in either pass order."""
    from k3compile.spec import load_spec

    for pipeline in ("derive-segment-scan,derive-chunkwise,fuse-chunkwise", "derive-chunkwise,fuse-chunkwise,derive-segment-scan"):
        module = spec_to_module(load_spec(EXAMPLES / "kda.toml"))
        run_pipeline(module, pipeline)
        nested = [op for op in module.walk() if isinstance(op, k3s.ChunkedOp)]
        assert len(nested) == 1 and isinstance(nested[0].parent_op(), k3s.SegmentScanOp), pipeline
        assert sum(isinstance(op, k3s.KernelOp) for op in module.walk()) == 2, pipeline
