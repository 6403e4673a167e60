"""The AttnRes aggregate's fused backward (derive-attnres-backward): `aggregate(...,
output_lse=True)`'s log-sum-exp and `aggregate_backward`'s gradients (d sources, d query, d gain)
against float64 torch autograd of k3compile.ir.reference.attnres, with the loss <dout, h>; a
wrong saved log-sum-exp must break them (the softmax is recomputed from it); the entry's
refusals; k3compile.ops.attnres.attnres_aggregate as a torch custom op (opcheck, training through
autograd and torch.compile).

Fresh random inputs every run (conftest's seed), fp32 in Triton's interpreter; the modules
allocate their outputs NaN-filled (conftest sets K3C_POISON_OUTPUTS), so a gradient element a
kernel never writes is NaN. Hidden sizes 7 and 100 (not powers of two: masked columns), 1 to 5
sources (the most the layer allows), row counts that are not multiples of the program's group of
rows (4 rows a group here, so several programs add their share of dquery and dgain).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import layer_op, one_line
from k3compile.ir import reference

NUM_BLOCKS = 4
MAX_SOURCES = NUM_BLOCKS + 1
ROWS = 4  # rows a program takes: a group of rows smaller than the row counts below
PIPELINE = f"fuse-attnres,derive-attnres-backward{{rows-per-program={ROWS}}},outline-kernels"
RTOL = 1e-4  # relative norm per gradient; the interpreter's fp32 gets ~1e-7


@pytest.fixture(scope="module", params=[7, 100], ids=["D7", "D100"])
def layer(request, compile_layer):
    D = request.param
    return compile_layer(name=f"attnres_bw_d{D}", kind="attnres", hidden_size=D, num_blocks=NUM_BLOCKS, block_size=3,
                         eps=1e-5, dtype="float32", pipeline=PIPELINE)


def inputs(S: int, B: int, T: int, D: int, score_scale: float = 3.0):
    """Sources of different scales (block sums grow with depth) and a shared direction, a query
    large enough that the softmax is far from uniform, a gain that is not 1."""
    scales = torch.linspace(0.5, 4.0, S)[:, None, None, None]
    sources = torch.randn(S, B, T, D) * scales + 0.3 * torch.randn(S, 1, 1, D)
    query = torch.randn(D) * score_scale / math.sqrt(D)
    gain = 1 + 0.3 * torch.randn(D)
    return sources, query, gain


def reference_gradients(op, sources, query, gain, dout):
    """out and the float64 gradients of <dout, out> by torch autograd of reference.attnres."""
    leaves = [x.detach().double().requires_grad_() for x in (sources, query, gain)]
    out = reference.attnres(op, *leaves)
    (out * dout.double()).sum().backward()
    return out.detach(), [x.grad for x in leaves]


def fp32_floor(op, sources, query, gain, dout, want) -> list[float]:
    """Each gradient's relative error in torch's own fp32 autograd of the definition: a query's
    cotangent is a covariance over the sources, which cancels where one weight dominates or the
    weights' cotangents agree (a single row's can lose most of fp32's digits); ours must be within
    10x of it there."""
    leaves = [x.detach().float().requires_grad_() for x in (sources, query, gain)]
    x, w, g = leaves
    keys = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + op.eps.value.data) * g
    ((torch.softmax(keys @ w, dim=0)[..., None] * x).sum(0) * dout).sum().backward()
    return [((x.grad.double() - r).norm() / r.norm().clamp_min(1e-30)).item() for x, r in zip(leaves, want)]


def scores(op, sources, query, gain):
    x = sources.double()
    keys = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + op.eps.value.data) * gain.double()
    return keys @ query.double()


def assert_gradient(name: str, got: torch.Tensor, like: torch.Tensor, want: torch.Tensor, dtype=None,
                    rtol: float = RTOL) -> None:
    assert got.shape == like.shape, f"{name}: shape {list(got.shape)}, expected {list(like.shape)}"
    assert got.dtype == (dtype or like.dtype), f"{name}: dtype {got.dtype}"
    assert torch.isfinite(got).all(), f"{name}: {(~torch.isfinite(got)).sum().item()} non-finite (unwritten?)"
    err = ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()
    assert err < rtol, f"{name}: relative error {err:.2e}"


def run_backward(layer, sources, query, gain, dout, lse=None):
    out, saved = layer.aggregate(sources, query, gain, output_lse=True)
    return layer.aggregate_backward(sources, query, gain, out, saved if lse is None else lse, dout)


@pytest.mark.parametrize("S", [1, 2, 3, MAX_SOURCES])
@pytest.mark.parametrize("B,T", [(3, 5), (1, 1), (2, 9)], ids=["R15", "R1", "R18"])
def test_gradients_match_float64_autograd(layer, S, B, T):
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    sources, query, gain = inputs(S, B, T, D)
    dout = torch.randn(B, T, D)
    _, want = reference_gradients(op, sources, query, gain, dout)
    floor = fp32_floor(op, sources, query, gain, dout, want)
    dsources, dquery, dgain = run_backward(layer, sources, query, gain, dout)
    for name, got, like, w, f in zip(("dsources", "dquery", "dgain"), (dsources, dquery, dgain), (sources, query, gain),
                                     want, floor, strict=True):
        assert_gradient(name, got, like, w, torch.float32, rtol=max(RTOL, 10 * f))
    if S == 1:  # the one source's weight is 1 whatever its score: the mix passes dout through
        torch.testing.assert_close(dsources[0], dout, rtol=1e-6, atol=1e-6)
        assert dquery.abs().max() < 1e-5 and dgain.abs().max() < 1e-5
    elif B * T > 1:  # the score's path matters: not just the weighted dout
        weights = torch.softmax(scores(op, sources, query, gain), dim=0)
        through_scores = dsources.double() - weights[..., None] * dout.double()
        assert through_scores.norm() > 1e-3 * dsources.norm()


def test_lse_is_the_rows_log_sum_exp(layer):
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    sources, query, gain = inputs(3, 2, 7, D)
    out, lse = layer.aggregate(sources, query, gain, output_lse=True)
    assert lse.shape == (2, 7) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores(op, sources, query, gain), dim=0),
                               rtol=1e-5, atol=1e-5)
    plain, none = layer.aggregate(sources, query, gain)
    assert none is None and torch.equal(plain, out), "the log-sum-exp's store changes nothing else"


def test_large_scores_are_shift_safe(layer):
    """Scores of ~200 (exp overflows fp32 past 88) that differ by O(1): the weights come from
    exp(score - L), never from exp(score). Source i is a unit-RMS direction u plus a random
    direction orthogonal to it, sigma_i times as long, so its score is 200 cos(u, x_i) =
    200 / sqrt(1 + sigma_i^2) on every draw: from 199.0 down to 185.7."""
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    u = torch.randn(D, dtype=torch.float64)
    u = u / u.pow(2).mean().sqrt()
    noise = torch.randn(MAX_SOURCES, 2, 3, D, dtype=torch.float64)
    noise = noise - (noise @ u)[..., None] * u / D
    sigma = torch.linspace(0.1, 0.4, MAX_SOURCES, dtype=torch.float64)[:, None, None, None]
    sources = (u + sigma * u.norm() * noise / noise.norm(dim=-1, keepdim=True)).float()
    query = (200 * u / D).float()
    gain = torch.ones(D)
    spread = scores(op, sources, query, gain)
    assert spread.min() > 100 and (spread.max(0).values - spread.min(0).values).min() > 0.1
    dout = torch.randn(2, 3, D)
    _, (want_sources, want_query, want_gain) = reference_gradients(op, sources, query, gain, dout)
    dsources, dquery, dgain = run_backward(layer, sources, query, gain, dout)
    # fp32 scores of ~200 carry ~1e-5 absolute error, amplified by the score's cotangent
    assert_gradient("dsources", dsources, sources, want_sources, rtol=1e-3)
    assert_gradient("dquery", dquery, query, want_query, torch.float32, rtol=1e-3)
    assert_gradient("dgain", dgain, gain, want_gain, torch.float32, rtol=1e-3)


def test_softmax_is_recomputed_from_the_saved_lse(layer):
    """A log-sum-exp off by 0.1 scales every weight by exp(-0.1): every gradient goes wrong."""
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    sources, query, gain = inputs(3, 2, 5, D)
    dout = torch.randn(2, 5, D)
    _, want = reference_gradients(op, sources, query, gain, dout)
    _, lse = layer.aggregate(sources, query, gain, output_lse=True)
    got = run_backward(layer, sources, query, gain, dout, lse=lse + 0.1)
    for name, g, w in zip(("dsources", "dquery", "dgain"), got, want, strict=True):
        assert ((g.double() - w).norm() / w.norm()).item() > 1e-2, f"{name} ignores the saved log-sum-exp"


def test_query_gradients_do_not_read_the_rounded_output(layer):
    """A bf16 forward stores its output rounded: the sources' gradients take the softmax's row
    correction dh . h from it (FlashAttention's), but the query's cotangent is re-centred so that
    the scores' cotangents sum to zero (as the softmax's do), so an output rounded to bf16 leaves
    dquery and dgain at fp32 accuracy (without the re-centring: ~6e-3 off in bf16 on the H200)."""
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    sources, query, gain = inputs(3, 4, 16, D)
    dout = torch.randn(4, 16, D)
    _, (want_sources, want_query, want_gain) = reference_gradients(op, sources, query, gain, dout)
    out, lse = layer.aggregate(sources, query, gain, output_lse=True)
    rounded = out.to(torch.bfloat16).float()
    dsources, dquery, dgain = layer.aggregate_backward(sources, query, gain, rounded, lse, dout)
    assert_gradient("dquery", dquery, query, want_query, torch.float32)
    assert_gradient("dgain", dgain, gain, want_gain, torch.float32)
    off = ((dsources.double() - want_sources).norm() / want_sources.norm()).item()
    assert 1e-5 < off < 2e-2, f"dsources with a rounded output: relative error {off:.1e}"


def test_default_pipeline_groups_rows_by_16(compile_layer):
    """The default pipeline's group of 16 rows: 21 rows are a full group and a partial one."""
    layer = compile_layer(name="attnres_bw_default", kind="attnres", hidden_size=24, num_blocks=2, block_size=1,
                          dtype="float32")
    assert "BR = 16" in layer.path.read_text()
    op = layer_op(layer)
    sources, query, gain = inputs(3, 3, 7, 24)
    dout = torch.randn(3, 7, 24)
    _, (want_sources, want_query, want_gain) = reference_gradients(op, sources, query, gain, dout)
    dsources, dquery, dgain = run_backward(layer, sources, query, gain, dout)
    assert_gradient("dsources", dsources, sources, want_sources)
    assert_gradient("dquery", dquery, query, want_query, torch.float32)
    assert_gradient("dgain", dgain, gain, want_gain, torch.float32)


@pytest.mark.parametrize("name,bad", [("lse", lambda t: t.double()), ("lse", lambda t: t[:, :-1].contiguous()),
                                      ("dout", lambda t: t[:, :, :-1].contiguous()), ("out", lambda t: t[:1])])
def test_backward_refuses_bad_arguments(layer, name, bad):
    D = layer.spec.params["hidden_size"]
    sources, query, gain = inputs(2, 2, 3, D)
    out, lse = layer.aggregate(sources, query, gain, output_lse=True)
    args = dict(sources=sources, query=query, gain=gain, out=out, lse=lse, dout=torch.randn(2, 3, D))
    args[name] = bad(args[name])
    with pytest.raises(ValueError) as err:
        layer.aggregate_backward(**args)
    assert one_line(str(err.value)) and str(err.value).startswith(f"{name}:")


# --- k3compile.ops: the custom op --------------------------------------------------------------


@pytest.fixture
def ops_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "k3c_cache"))


def test_custom_op_passes_opcheck(ops_cache):
    from k3compile.ops.attnres import AttnResKey, aggregate_operator

    S, D = 3, 12
    sources, query, gain = inputs(S, 2, 3, D)
    op = aggregate_operator(AttnResKey(D, 1e-6, 8))
    torch.library.opcheck(op, tuple(x.requires_grad_() for x in (sources, query, gain)),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


def aggregate_step(sources, query, gain):
    from k3compile.ops.attnres import attnres_aggregate

    h = attnres_aggregate(sources, query, gain)
    return (h * h).sum()


def grads_of(step, tensors):
    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    loss = step(*leaves)
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


def test_training_through_autograd_and_torch_compile(ops_cache):
    from k3compile.ops.attnres import attnres_aggregate

    S, B, T, D = 5, 2, 3, 20
    tensors = inputs(S, B, T, D)
    loss, grads = grads_of(aggregate_step, tensors)
    # float64 autograd of the definition, written out (not the reference's code)
    x, w, gamma = (t.detach().double().requires_grad_() for t in tensors)
    keys = gamma * x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)
    h = (torch.softmax(keys @ w, dim=0)[..., None] * x).sum(0)
    (h * h).sum().backward()
    for name, got, want in zip(("sources", "query", "gain"), grads, (x.grad, w.grad, gamma.grad), strict=True):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        assert ((got.double() - want).norm() / want.norm()).item() < RTOL, name
    compiled_loss, compiled_grads = grads_of(torch.compile(aggregate_step, fullgraph=True, backend="aot_eager"),
                                             tensors)
    assert torch.equal(compiled_loss, loss)
    for name, a, b in zip(("sources", "query", "gain"), compiled_grads, grads, strict=True):
        assert torch.equal(a, b), name
    # no input that needs grad: the plain entry (no log-sum-exp), the same output
    with torch.no_grad():
        plain = attnres_aggregate(*tensors)
    through_op = attnres_aggregate(*(t.clone().requires_grad_() for t in tensors))
    assert through_op.requires_grad and torch.equal(plain, through_op.detach())


def test_k3c_verify_checks_the_fused_backward(monkeypatch):
    """`k3c verify` of an attnres spec has aggregate_backward rows (d sources, d query, d gain
    against float64 autograd of the reference, the non-power-of-two width too) that pass, and
    fail when a gradient is wrong (here the reference's query made off by a factor in the
    backward's rows only: the comparison is live)."""
    from k3compile.spec import spec_from_table
    from k3compile.checking.verify import verify

    spec = spec_from_table({"name": "verify_backward", "kind": "attnres", "hidden_size": 48, "num_blocks": 2,
                            "block_size": 4}, source="<test>")
    rows = [r for r in verify(spec, device="cpu", seed=5) if r.entry == "aggregate_backward"]
    assert {(r.layer.endswith("npow2"), r.tensor) for r in rows} == {
        (npow2, t) for npow2 in (False, True) for t in ("dsources", "dquery", "dgain")}
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    attnres = reference.attnres

    def off_in_the_query(op, sources, query, gain):  # only the backward rows' reference: its leaves require grad
        return attnres(op, sources, query * 1.01, gain) if query.requires_grad else attnres(op, sources, query, gain)

    monkeypatch.setattr(reference, "attnres", off_in_the_query)
    broken = [r for r in verify(spec, device="cpu", seed=5, quick=True) if r.entry == "aggregate_backward"]
    assert broken and not any(r.passed for r in broken if r.tensor == "dquery")
