"""The compiled AttnRes `aggregate(sources, query, gain)` against reference.attnres."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_matches, layer_op
from k3compile.ir import reference

NUM_BLOCKS = 4
MAX_SOURCES = NUM_BLOCKS + 1


@pytest.fixture(scope="module", params=[100, 64, 7], ids=["D100", "D64", "D7"])
def layer(request, compile_layer):
    D = request.param
    return compile_layer(name=f"attnres_d{D}", kind="attnres", hidden_size=D, num_blocks=NUM_BLOCKS, block_size=3,
                         dtype="float32")


def inputs(S: int, B: int, T: int, D: int):
    """Sources of different scales (block sums grow with depth), a gain that is not 1, and a random
    query moved (with S > 1) so that the first row's last source scores 1 above its first: the
    softmax is far from uniform on every draw. Its weights spread at least 1 / (2 S), 0.1 at S = 5:
    if the first source's weight w is below 1 / (2 S), the largest is at least 1 / S; if not, the
    last source's, w e, exceeds w by more than that."""
    scales = torch.linspace(0.5, 4.0, S)[:, None, None, None]
    sources = torch.randn(S, B, T, D) * scales + 0.3 * torch.randn(S, 1, 1, D)
    query = torch.randn(D) * 3 / math.sqrt(D)
    gain = 1 + 0.3 * torch.randn(D)
    if S > 1:
        first_row = keys(sources[:, 0, 0], gain)
        gap = first_row[-1] - first_row[0]
        query = (query + (1 - query.double() @ gap) * gap / gap.pow(2).sum()).float()
    return sources, query, gain


def keys(sources, gain, eps: float = 1e-6):
    """The sources' keys in float64; eps is the spec's default, every layer's here."""
    x = sources.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain.double()


def softmax_weights(op, sources, query, gain):
    return torch.softmax(keys(sources, gain, op.eps.value.data) @ query.double(), dim=0)


@pytest.mark.parametrize("S", [1, 3, MAX_SOURCES])
@pytest.mark.parametrize("B,T", [(3, 5), (1, 1), (2, 3)])
def test_matches_reference(layer, S, B, T):
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    sources, query, gain = inputs(S, B, T, D)
    result = layer.aggregate(sources, query, gain)
    assert isinstance(result, tuple) and len(result) == 2
    out, lse = result
    assert lse is None, "the log-sum-exp only when asked for (output_lse=True)"
    assert out.dtype == sources.dtype
    ref = reference.attnres(op, sources, query, gain)
    assert_matches(out, ref, "out")
    if S > 1:
        weights = softmax_weights(op, sources, query, gain)
        spread = (weights.max(0).values - weights.min(0).values).max().item()
        assert spread > 0.05, "test inputs should give a non-uniform softmax (inputs() bounds it)"
        assert not torch.allclose(ref, sources.double().mean(0), atol=1e-3), "not trivially the mean"


def test_single_source_is_identity(layer):
    D = layer.spec.params["hidden_size"]
    sources, query, gain = inputs(1, 2, 3, D)
    out, _ = layer.aggregate(sources, query, gain)
    assert_matches(out, sources[0].double(), "out with one source")


def test_softmax_is_shift_safe(layer):
    """Scores far beyond exp's fp32 range (~200 here, exp overflows past 88) that differ by O(1):
    the online softmax must subtract the running max."""
    D = layer.spec.params["hidden_size"]
    u = torch.randn(D)
    sources = u + 0.3 * torch.randn(MAX_SOURCES, 2, 3, D)
    query = 200 * u / (u.pow(2).sum() / u.pow(2).mean().sqrt())  # score_i = 200 cos(u, x_i) ~ 190
    gain = torch.ones(D)
    op = layer_op(layer)
    scores = torch.log(softmax_weights(op, sources, query, gain))
    assert (scores.max(0).values - scores.min(0).values).max() > 0.1, "scores should differ between sources"
    out, _ = layer.aggregate(sources, query, gain)
    ref = reference.attnres(op, sources, query, gain)
    # fp32 scores of size ~200 carry ~1e-5 absolute error: a looser tolerance than elsewhere
    assert_matches(out, ref, "out, large scores", rms_tol=1e-4, atol=1e-4, rtol=1e-4)


def test_eps_from_spec_is_used(compile_layer):
    """Tiny rows: with a large eps the RMS is dominated by eps, so a wrong eps shows."""
    D = 12
    layer = compile_layer(name="attnres_big_eps", kind="attnres", hidden_size=D, num_blocks=2, block_size=1,
                          eps=0.5, dtype="float32")
    sources = 0.2 * torch.randn(3, 1, 4, D)
    query, gain = torch.randn(D) * 4, 1 + 0.3 * torch.randn(D)
    out, _ = layer.aggregate(sources, query, gain)
    ref = reference.attnres(layer_op(layer), sources, query, gain)
    assert_matches(out, ref, "out with eps = 0.5")


def test_gain_matters(layer):
    D = layer.spec.params["hidden_size"]
    sources, query, gain = inputs(3, 1, 2, D)
    a, _ = layer.aggregate(sources, query, gain)
    b, _ = layer.aggregate(sources, query, torch.ones(D))
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert not torch.allclose(a, b)
    assert_matches(b, reference.attnres(layer_op(layer), sources, query, torch.ones(D)), "out with unit gain")


# --- reference sanity: independent identities ------------------------------------------------


@pytest.mark.parametrize("S", [1, 2, 5])
def test_reference_zero_query_is_mean(layer, S):
    D = layer.spec.params["hidden_size"]
    sources, _, gain = inputs(S, 2, 3, D)
    ref = reference.attnres(layer_op(layer), sources, torch.zeros(D), gain)
    torch.testing.assert_close(ref, sources.double().mean(0), rtol=1e-12, atol=1e-12)


def test_reference_is_scale_invariant_in_scores(layer):
    """RMSNorm keys: scaling one source scales its contribution but not its score."""
    D = layer.spec.params["hidden_size"]
    sources, query, gain = inputs(3, 1, 2, D)
    op = layer_op(layer)
    w1 = softmax_weights(op, sources, query, gain)
    scaled = sources.clone()
    scaled[1] *= 7.0
    ref = reference.attnres(op, scaled, query, gain)
    expected = (w1[..., None] * scaled.double()).sum(0)
    # exact only for eps = 0: eps perturbs each score by about eps / mean(x^2), relatively
    eps = op.eps.value.data
    score_drift = eps / sources.double().pow(2).mean(-1).min().item() * query.double().abs().sum().item()
    tol = max(1e-9, 10 * score_drift) * scaled.double().abs().max().item()
    torch.testing.assert_close(ref, expected, rtol=0, atol=tol)


def test_reference_picks_dominant_source(layer):
    """A query aligned with one source's direction puts almost all weight on it."""
    D = layer.spec.params["hidden_size"]
    sources = -(torch.randn(3, 1, 1, D).abs() + 0.5)  # all-negative rows: negative scores
    sources[2] = -sources[2]  # the one all-positive row: a large positive score
    query = torch.ones(D) * 100.0 / math.sqrt(D)
    ref = reference.attnres(layer_op(layer), sources, query, torch.ones(D))
    torch.testing.assert_close(ref, sources[2].double(), rtol=1e-4, atol=1e-4)


# fuse-attnres{rows-per-program}: a program walks its group's (row, source) pairs as one loop,
# restarting the softmax at each row; groups of 2 (the last one partial at 15 rows) and of 5, a
# single row in a group, one source and the most; 1: a program per row, its own source loop (the
# default, 8, is what the other tests compile)
@pytest.mark.parametrize("rows", [1, 2, 5])
@pytest.mark.parametrize("S", [1, 2, MAX_SOURCES])
@pytest.mark.parametrize("B,T", [(3, 5), (1, 1)])
def test_rows_per_program_matches_reference(compile_layer, rows, S, B, T):
    from k3compile.pipeline import DEFAULT_PIPELINES

    pipeline = DEFAULT_PIPELINES["attnres"].replace("fuse-attnres", f"fuse-attnres{{rows-per-program={rows} grouped-from-rows=0}}")
    layer = compile_layer(pipeline, name="attnres_d100", kind="attnres", hidden_size=100, num_blocks=NUM_BLOCKS,
                          block_size=3, dtype="float32")
    # the aggregate's kernel: the grouped one's loop over (row, source) pairs, or a program per row
    assert ("def attnres_d100_aggregate_groups_kernel(" in layer.path.read_text()) == (rows > 1)
    op = layer_op(layer)
    sources, query, gain = inputs(S, B, T, 100)
    out, lse = layer.aggregate(sources, query, gain, output_lse=True)
    assert_matches(out, reference.attnres(op, sources, query, gain), "out")
    x = sources.double()
    scores = (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + op.eps.value.data) * gain.double()) @ query.double()
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=0), rtol=1e-5, atol=1e-5)


# fuse-attnres{grouped-from-rows}: the entry launches its per-row kernel for calls of fewer rows,
# its grouped kernel from that many on; with groups of 4 from 8 rows: 5 and 7 rows per row, 8 and
# 15 rows in groups (the last one partial)
@pytest.mark.parametrize("B,T,launched", [(1, 5, "aggregate"), (1, 7, "aggregate"), (2, 4, "aggregate_groups"),
                                          (3, 5, "aggregate_groups")])
def test_kernel_by_rows(compile_layer, monkeypatch, B, T, launched):
    from k3compile.pipeline import DEFAULT_PIPELINES

    pipeline = DEFAULT_PIPELINES["attnres"].replace("fuse-attnres", "fuse-attnres{rows-per-program=4 grouped-from-rows=8}")
    layer = compile_layer(pipeline, name="attnres_d100_split", kind="attnres", hidden_size=100, num_blocks=NUM_BLOCKS,
                          block_size=3, dtype="float32")
    grids = {}
    for form in ("aggregate", "aggregate_groups"):
        name = f"attnres_d100_split_{form}_kernel"

        class RecordingKernel:  # the launch's grid, then the kernel's own launch
            def __getitem__(self, grid, form=form, kernel=getattr(layer.module, name)):
                grids[form] = grid
                return kernel[grid]

        monkeypatch.setattr(layer.module, name, RecordingKernel())
    sources, query, gain = inputs(3, B, T, 100)
    out, _ = layer.aggregate(sources, query, gain)
    rows = B * T
    assert grids == {launched: (rows if launched == "aggregate" else -(-rows // 4),)}, f"launched {grids}"
    assert_matches(out, reference.attnres(layer_op(layer), sources, query, gain), "out")
