"""AttnRes's RMSNorm over the whole finite fp32 range: sources near 1e30 (whose squares overflow
fp32), near 1e-30 (whose squares underflow it) and past 2^126 (max-abs 1.6e38), through the aggregate, its fused
backward and Block AttnRes's two phases, against float64 torch (reference.attnres and its
autograd).

Two layers: the default eps (1e-6, which a row near 1e-30 cannot outweigh: its scores are ~0) and
eps = 1e-70 (below fp32's range, while sqrt(eps) is not), where a row near 1e-30 outweighs eps and
its scores are those of the unit row. Fresh random inputs (conftest's seed), fp32 in Triton's
interpreter, NaN-poisoned outputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import layer_op
from k3compile.ir import reference

D, NUM_BLOCKS, Q = 100, 4, 3
RTOL = 1e-5  # relative norm; the interpreter's fp32 gets ~1e-7
EPS = {"default": 1e-6, "tiny": 1e-70}


@pytest.fixture(scope="module", params=list(EPS), ids=[f"eps_{name}" for name in EPS])
def layer(request, compile_layer):
    return compile_layer(name=f"attnres_range_{request.param}", kind="attnres", hidden_size=D,
                         num_blocks=NUM_BLOCKS, block_size=3, eps=EPS[request.param], dtype="float32")


def unit_inputs(S: int, B: int, T: int):
    """Sources of different scales sharing a direction, a query that makes the softmax far from
    uniform at unit scale, a gain that is not 1."""
    scales = torch.linspace(0.5, 4.0, S)[:, None, None, None]
    sources = torch.randn(S, B, T, D) * scales + 0.3 * torch.randn(S, 1, 1, D)
    return sources, torch.randn(D) * 3 / math.sqrt(D), 1 + 0.3 * torch.randn(D)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, f"shape {list(got.shape)}, expected {list(want.shape)}"
    assert torch.isfinite(got).all(), f"{(~torch.isfinite(got)).sum().item()} non-finite elements"
    return ((got.double() - want).norm() / want.norm()).item()


def scores_spread(op, sources, query, gain) -> float:
    x = sources.double()
    keys = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + op.eps.value.data) * gain.double()
    weights = torch.softmax(keys @ query.double(), dim=0)
    return (weights.max(0).values - weights.min(0).values).max().item()


def scaled(unit: torch.Tensor, scale: float) -> torch.Tensor:
    """unit's sources in fp32 with max-abs `scale`."""
    return (unit.double() * (scale / unit.abs().max().item())).float()


@pytest.mark.parametrize("scale,S", [(1e30, 3), (1e-30, 3), (1.6e38, 2)], ids=["1e30", "1e-30", "1.6e38"])
def test_aggregate_at_any_scale(layer, scale, S):
    """1.6e38: rows whose max-abs passes 2^126 (two sources, so the unnormalised mix stays finite)."""
    op = layer_op(layer)
    unit, query, gain = unit_inputs(S, 2, 3)
    sources = scaled(unit, scale)
    out, _ = layer.aggregate(sources, query, gain)
    assert relative_error(out, reference.attnres(op, sources, query, gain)) < RTOL
    if op.eps.value.data < 1e-60 or scale > 1:  # then the scores are the unit rows': not a uniform mix
        assert scores_spread(op, sources, query, gain) > 0.05


def float64_gradients(op, sources, query, gain, dout):
    leaves = [x.detach().double().requires_grad_() for x in (sources, query, gain)]
    (reference.attnres(op, *leaves) * dout.double()).sum().backward()
    return [x.grad for x in leaves]


@pytest.mark.parametrize("scale", [1e30, 1e-30], ids=["1e30", "1e-30"])
def test_backward_at_any_scale(layer, scale):
    op = layer_op(layer)
    if scale < 1 and op.eps.value.data > 1e-60:
        pytest.skip("with eps = 1e-6 the query's and gain's gradients of rows near 1e-30 are ~1e-57: "
                    "below fp32's range")
    unit, query, gain = unit_inputs(3, 2, 3)
    sources, dout = scaled(unit, scale), torch.randn(2, 3, D)
    out, lse = layer.aggregate(sources, query, gain, output_lse=True)
    got = layer.aggregate_backward(sources, query, gain, out, lse, dout)
    # the query's cotangent is a covariance over the sources: it keeps fewer of fp32's digits
    for name, g, want, rtol in zip(("dsources", "dquery", "dgain"), got, float64_gradients(op, sources, query, gain,
                                                                                          dout), (RTOL, 1e-4, 1e-4)):
        error = relative_error(g, want)
        assert error < rtol, f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("scale", [1e30, 1e-30], ids=["1e30", "1e-30"])
def test_block_attnres_at_any_scale(layer, scale):
    op = layer_op(layer)
    n = 3
    unit, _, _ = unit_inputs(n + 1, 1, 5)
    sources = scaled(unit, scale)
    representatives, partial_sum = sources[:n].contiguous(), sources[n].contiguous()
    queries, gains = torch.randn(Q, D) * 3 / math.sqrt(D), 1 + 0.3 * torch.randn(Q, D)
    partials = layer.block_partials(representatives, queries, gains)
    for j in range(Q):
        out = layer.block_merge(partial_sum[None], queries[j], gains[j], *(p[j] for p in partials))[0]
        want = reference.attnres(op, sources, queries[j], gains[j])
        assert relative_error(out, want) < RTOL, f"query {j}"
