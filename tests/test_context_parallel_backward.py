"""The backward of context parallelism (docs/context-parallel.md, "The backward"): the adjoint of
the segment combine (its transpose, run from the last segment back) proved in exact arithmetic;
`chunk_backward(..., segments=P)` and the differentiable `chunk(..., segments=P)` on one device;
`chunk_backward(..., cp_group=group)` and `chunk(..., cp_group=group)` under torch.autograd over
real gloo groups of 2 and 3 processes on the CPU (each group runs tests/test_context_parallel.py's
forward cases too: one spawn a world size). Every gradient and dh0 against the
single-process chunk_backward of the unsplit input (fp32, Triton's interpreter, NaN-poisoned
outputs); fresh random inputs, initial states and final-state cotangents every run
(K3C_TEST_SEED replays one)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import sympy
import torch

import k3compile.checking.prove as prove
from conftest import assert_rms, one_line, recurrence_table
from k3compile.checking import exact, exact_backward
from k3compile.ir import k3s
from test_context_parallel import (C, H, HV, K, V, ending_on, rank_inputs, run_ranks, three_ranks_forward,
                                   two_ranks_forward, varlen)
from test_segment_scan import MEMBERS, member_spec

PIPELINE = (f"derive-chunkwise{{chunk-size={C}}},fuse-chunkwise{{block-v=16}},derive-segment-scan{{chunk-size={C}}},"
            f"lower-segment-scan{{block-v=16}},derive-backward{{chunk-size={C}}},lower-backward{{block-v=16}},"
            "derive-segment-scan-backward")
TOL = 1e-5  # fp32 kernels against the unsplit fp32 chunk_backward (measured: <= 4e-7)
GRADIENTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")  # chunk_backward's order (then dh0)


def cp_layer(compile_layer, kind: str, layout: str = "kv", **options):
    name = "_".join([kind, layout, "bwd", *options])
    layer = compile_layer(pipeline=PIPELINE, **recurrence_table(kind, layout, H=H, HV=HV, K=K, V=V, name=name,
                                                                **options))
    layer.module.POISON_OUTPUTS = True
    return layer


# --- the math, in exact arithmetic -------------------------------------------------------------


@pytest.mark.parametrize("form", ["full", "diagonal", "scalar", "identity"])
def test_adjoint_combine_is_the_transpose(form):
    """<D, M S> = <M^T D, S> for symbols, with M^T as the adjoint combine holds it (k3compile/checking/exact.py:
    transition_transpose), in every transition form."""
    Kx, Vx = 2, 3
    S, D = (sympy.Matrix(Kx, Vx, lambda i, j: sympy.Symbol(f"{n}{i}{j}")) for n in "SD")
    M = {"full": sympy.Matrix(Kx, Kx, lambda i, j: sympy.Symbol(f"m{i}{j}")),
         "diagonal": sympy.Matrix(Kx, 1, lambda i, _: sympy.Symbol(f"m{i}")), "scalar": sympy.Symbol("m"),
         "identity": None}[form]
    forward = exact.transition_apply(form, M, S)
    adjoint = exact.transition_apply(form, exact.transition_transpose(form, M), D)
    assert sympy.expand(sum(D.multiply_elementwise(forward)) - sum(adjoint.multiply_elementwise(S))) == 0


def split_backward(scan, backward, x, cuts: list[int], transposed: bool = True) -> dict:
    """chunk_backward of every segment of x (cut before each token in cuts) from its entering
    state (the forward combine of the summaries before it) with dht its leaving cotangent: the
    adjoint combine of the adjoint summaries (M^T, N_bar) after it, from x.dht; N_bar is the
    segment's dh0 from a zero dht. The gradients concatenated, and dh0 the first segment's."""
    _, combine, _ = scan.body.ops
    form = combine.transition.data
    edges = [0, *cuts, x.q.rows]
    segments = list(zip(edges, edges[1:]))
    sigma = [exact.segment_summary(scan, x.tokens(s, e)) for s, e in segments]
    entering = [x.S0]
    for summary in sigma[:-1]:
        entering.append(exact.apply_summary(form, summary, entering[-1]))
    N_bar = [exact_backward.run_backward(backward, replace(x.tokens(s, e), dht=None))["h0"] for s, e in segments]
    leaving = [x.dht]
    for summary, n_bar in reversed(list(zip(sigma[1:], N_bar[1:]))):
        adjoint = exact.adjoint_summary(combine, (summary[0], n_bar)) if transposed else (summary[0], n_bar)
        leaving.insert(0, exact.apply_summary(form, adjoint, leaving[0]))
    runs = [exact_backward.run_backward(backward, replace(x.tokens(s, e, S), dht=D))
            for (s, e), S, D in zip(segments, entering, leaving)]
    return {name: sympy.Matrix.vstack(*(run[name] for run in runs)) if name != "h0" else runs[0]["h0"]
            for name in runs[0]}


@pytest.mark.parametrize("member", list(MEMBERS))
def test_split_backward_is_exact(monkeypatch, member):
    """Every transition form (the four members, a scalar gate without the delta rule, linear
    attention), K = 2, V = 3, chunks of 2, 2C + 3 tokens cut into a one-token segment, an odd
    one and a two-chunk one: the segments' backward from the combined states and the adjoint
    combine's cotangents equals the unsplit backward, every gradient and dh0 exactly."""
    spec = member_spec(monkeypatch, member)
    layer_op, module = prove.derived(spec, "derive-segment-scan{chunk-size=2},derive-backward{chunk-size=2}")
    scan, backward = prove.first_op(module, k3s.SegmentScanOp), prove.first_op(module, k3s.ChunkedBackwardOp)
    rng = random.Random(sum(map(ord, member)))
    T = 7
    x = replace(prove.proof_inputs(rng, layer_op, T), do=prove.random_matrix(rng, T, prove.PROOF_V, 5),
                dht=prove.random_matrix(rng, prove.PROOF_K, prove.PROOF_V, 3))
    whole = exact_backward.run_backward(backward, x)
    got = split_backward(scan, backward, x, [1, 4])
    for name, want in whole.items():
        assert sympy.expand(got[name] - want) == sympy.zeros(*want.shape), f"{member}: d{name} differs"
    if MEMBERS[member][2] == "full":  # M not transposed: the cotangents go wrong (not for a symmetric form)
        wrong = split_backward(scan, backward, x, [1, 4], transposed=False)
        assert sympy.expand(wrong["h0"] - whole["h0"]) != sympy.zeros(*whole["h0"].shape)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_runtime_transpose_is_the_adjoint(layout):
    """The runtime's adjoint combine (apply with transpose(M)) is the transpose of its combine in
    both state layouts and every transition form: <D, M S> = <M^T D, S> in float64."""
    from k3compile.backends.triton.runtime.context_parallel import _ContextParallel

    shape = (HV, K, V) if layout == "kv" else (HV, V, K)
    for form, M in (("full", torch.randn(HV, K, K)), ("diagonal", torch.rand(HV, K)), ("scalar", torch.rand(HV)),
                    ("identity", None)):
        cp = _ContextParallel(None, None, form, layout == "vk", shape, C, 1, None)
        M = None if M is None else M.double()
        S, D, zero = torch.randn(*shape).double(), torch.randn(*shape).double(), torch.zeros(*shape).double()
        lhs = (D * cp.apply(M, zero, S)).sum()
        rhs = (cp.apply(cp.transpose(M), zero, D) * S).sum()
        assert torch.allclose(lhs, rhs, rtol=1e-12), f"{form}, {layout}: {lhs} vs {rhs}"


# --- one device ----------------------------------------------------------------------------------


def backward_inputs(kind: str, layout: str, seqlens) -> tuple[dict, torch.Tensor, torch.Tensor]:
    inputs = varlen(kind, layout, seqlens)
    do = torch.randn(1, sum(seqlens), HV, V)
    dht = torch.randn_like(inputs["initial_state"])
    return inputs, do, dht


def check_gradients(got, want, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} results, want {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert_rms(a, b, f"{what}: result {i}", TOL)


def test_segments_backward(compile_layer):
    """KDA with fla's in-kernel options (softplus gate of A_log and dt_bias, beta logits, q/k
    l2norm), varlen (2C + 5 tokens: cut at chunks, 3: one token a segment, an empty one),
    initial states and dht, P = 3: chunk_backward(segments=3) and the gradients of
    chunk(segments=3) under autograd (dA_log, ddt_bias too) equal the plain chunk_backward's."""
    layer = cp_layer(compile_layer, "kda", gate_input="softplus", beta_input="logits", qk_l2norm=True)
    inputs, do, dht = backward_inputs("kda", "kv", (2 * C + 5, 3, 0))
    inputs.update(A_log=torch.randn(HV) / 4 - 1, dt_bias=torch.randn(HV * K) / 4)
    want = layer.chunk_backward(**inputs, do=do, dht=dht, output_dh0=True)
    check_gradients(layer.chunk_backward(**inputs, do=do, dht=dht, output_dh0=True, segments=3), want, "P = 3")
    leaves = {n: x.clone().requires_grad_(True) for n, x in inputs.items() if n in (*GRADIENTS, "initial_state")}
    o, final_state = layer.chunk(**{**inputs, **leaves}, output_final_state=True, segments=3)
    ((o * do).sum() + (final_state * dht).sum()).backward()
    names = [n for n in GRADIENTS if n in leaves] + ["initial_state"]
    check_gradients([leaves[n].grad for n in names], want, "autograd, P = 3")
    assert leaves["initial_state"].grad[2].equal(dht[2]), "the empty sequence passes dht on"


def test_backward_refusals(compile_layer):
    """One-line ValueErrors, before any kernel; a module without the backward entries refuses
    autograd through a split chunk."""
    layer = cp_layer(compile_layer, "kda")
    inputs, do, dht = backward_inputs("kda", "kv", (C + 1, 5))
    for arguments, match in ((dict(segments=0), "segments: expected a positive int"),
                             (dict(segments=2, dht=dht[:1].contiguous()),
                              r"dht: expected 2 states \(one per sequence\)"),
                             (dict(segments=2, cp_group=object()), "cp_group: torch.distributed is not initialized")):
        with pytest.raises(ValueError, match=match) as error:
            layer.chunk_backward(**{**inputs, "do": do, "dht": dht, **arguments})
        assert one_line(str(error.value))
    forward_only = compile_layer(pipeline=PIPELINE.rsplit(",derive-backward", 1)[0],
                                 **recurrence_table("kda", "kv", H=H, HV=HV, K=K, V=V, name="kda_kv_fwd_only"))
    with pytest.raises(NotImplementedError, match="no chunk_backward_segments entry") as error:
        forward_only.chunk(**{**inputs, "q": inputs["q"].clone().requires_grad_(True)}, segments=2)
    assert one_line(str(error.value))


# --- ranks of a gloo group --------------------------------------------------------------------


def backward_case(layer, inputs: dict, world: int, options: dict, call: str, grads=()) -> dict:
    """A case of run_ranks (chunk_backward over cp_group, or chunk under autograd) and what each
    rank must return: the unsplit single-process chunk_backward's gradients of its tokens, dh0 of
    the sequences starting on it."""
    seqlens = len(inputs["cu_seqlens"]) - 1 if "cu_seqlens" in inputs else 1
    do = torch.randn(*inputs["v"].shape)
    state = inputs["initial_state"].shape[1:]
    dht = torch.randn(seqlens, *state)
    want = layer.module._chunk_backward_single(**inputs, do=do, dht=dht, output_dh0=True)
    T = inputs["q"].shape[1] // world
    per_rank = rank_inputs(inputs, world)
    for r, mine in enumerate(per_rank):
        mine["do"] = do[:, r * T:(r + 1) * T].contiguous()
        mine["dht"] = dht[ending_on(inputs, world, r)].contiguous()
    offsets = inputs["cu_seqlens"].tolist() if "cu_seqlens" in inputs else [0, inputs["q"].shape[1]]
    expected = []
    for r in range(world):
        starting = [n for n, s in enumerate(offsets[:-1]) if min(s // T, world - 1) == r]
        token_grads = [g[:, r * T:(r + 1) * T] for g in want[:-1]]
        expected.append([*token_grads, want[-1][starting]])
    options = {**options, "output_dh0": True} if call == "chunk_backward" else options
    case = dict(module=str(layer.path), inputs=per_rank, options=options, call=call, grads=list(grads))
    return dict(case=case, expected=expected)


def check_backward_ranks(expected: list[dict], results: list[list]) -> None:
    for i, e in enumerate(expected):
        for r, want in enumerate(e["expected"]):
            got = results[r][i]
            assert not isinstance(got, str), f"case {i}, rank {r}: {got}"
            check_gradients(got, want, f"case {i} ({e['case']['call']}, {e['case']['options']}), rank {r}")


def autograd_grads(layer) -> list[str]:
    return [n for n in GRADIENTS if f"d{n}" in layer.module._CHUNK_CP.gradients] + ["initial_state"]


@pytest.mark.slow
def test_two_ranks(compile_layer, tmp_path):
    """One group of 2 gloo ranks (one spawn) runs the forward's cases
    (test_context_parallel.two_ranks_forward) and these, of 23 tokens a rank. KDA varlen
    (5, 29, 0, 12): a sequence across the boundary, an empty one on it; initial states and dht:
    chunk_backward(cp_group) (the entering states recomputed by the forward's all-gather, then the
    adjoint's). GLA (diagonal M, vk), one sequence over both ranks without cu_seqlens, each rank's
    piece in 2 segments, under autograd (the forward's entering state kept: the adjoint's
    all-gather only). The bad calls last: the forward's, then a dht of the wrong count on rank 1:
    rank 1 names it, rank 0 names rank 1, neither hangs."""
    world = 2
    forward, forward_bad, check_forward = two_ranks_forward(compile_layer)
    kda, gla = cp_layer(compile_layer, "kda"), cp_layer(compile_layer, "gla", "vk")
    gla_inputs = varlen("gla", "vk", (46,))
    gla_inputs.pop("cu_seqlens")
    expected = [
        backward_case(kda, varlen("kda", "kv", (5, 29, 0, 12)), world, {}, "chunk_backward"),
        backward_case(gla, gla_inputs, world, dict(output_final_state=True, segments=2), "autograd",
                      autograd_grads(gla)),
    ]
    bad = [dict(case) for case in expected[0]["case"]["inputs"]]
    bad[1]["dht"] = bad[1]["dht"][:2].contiguous()
    cases = forward + [e["case"] for e in expected] + forward_bad + [dict(expected[0]["case"], inputs=bad)]
    results = run_ranks(world, cases, tmp_path)
    f, b, fb = len(forward), len(expected), len(forward_bad)
    check_forward([r[:f] for r in results], [r[f + b:f + b + fb] for r in results])
    check_backward_ranks(expected, [r[f:f + b] for r in results])
    last = [r[-1] for r in results]
    assert "dht: expected 3 states (one per sequence ending on this rank), got 2" in last[1], last[1]
    assert "cp_group: rank 1 rejected its arguments" in last[0], last[0]


@pytest.mark.slow
def test_three_ranks(compile_layer, tmp_path):
    """One group of 3 gloo ranks (one spawn) runs the forward's cases
    (test_context_parallel.three_ranks_forward) and these, of 19 tokens a rank. KDA varlen
    (6, 44, 7): a sequence over all three ranks (the middle one inside it, its adjoint summary's
    M^T carried in the all-gather), initial states and dht, each rank in 2 segments, under
    autograd. Gated DeltaNet (vk, scalar gate, full M): a sequence that starts exactly on rank 1's
    first token and ends on rank 2, chunk_backward(cp_group)."""
    world = 3
    forward, check_forward = three_ranks_forward(compile_layer)
    kda, gdn = cp_layer(compile_layer, "kda"), cp_layer(compile_layer, "gated_deltanet", "vk")
    expected = [
        backward_case(kda, varlen("kda", "kv", (6, 44, 7)), world, dict(output_final_state=True, segments=2),
                      "autograd", autograd_grads(kda)),
        backward_case(gdn, varlen("gated_deltanet", "vk", (19, 25, 13)), world, {}, "chunk_backward"),
    ]
    results = run_ranks(world, forward + [e["case"] for e in expected], tmp_path)
    check_forward([r[:len(forward)] for r in results])
    check_backward_ranks(expected, [r[len(forward):] for r in results])
