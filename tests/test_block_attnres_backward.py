"""The backward of Block AttnRes's two phases (derive-block-attnres-backward):
`block_partials_backward` and `block_merge_backward` against float64 torch autograd of the
two-phase reference semantics, and, through k3compile.ops.attnres, the two-phase composition's
gradients against float64 autograd of the one-phase reference over
torch.cat([representatives, partial_sum[None]]); a wrong saved log-sum-exp must break them; the
rounded saved outputs; finite differences of the compiled forward against the compiled backward;
the custom ops (opcheck, torch.compile); the refusals; `k3c verify`'s rows.

Fresh random inputs every run (conftest's seed), fp32 in Triton's interpreter; the modules
allocate their outputs NaN-filled (conftest sets K3C_POISON_OUTPUTS), so a gradient element a
kernel never writes is NaN. D = 48 and 40 (not powers of two: masked columns), Q = 3 queries (in
one program, and in blocks of 2 with a partial last: several programs add a representative's
cotangent), n = 1 to 3 representatives, row counts that are not multiples of the rows a program
takes (4 here: several programs add the queries' cotangents).
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import layer_op, one_line
from k3compile.ir import reference

Q, NUM_BLOCKS, EPS = 3, 3, 1e-5
RTOL = 1e-4  # relative norm per gradient; the interpreter's fp32 gets ~1e-7 .. 1e-6
PASSES = "fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward{%s},outline-kernels"
PIPELINES = {
    # phase 1's backward in blocks of 16 columns (D = 48: three; D = 40: two and a partial one),
    # all the call's queries a program, groups of 4 rows
    "columns-of-16": PASSES % "partials-backward=columns block-columns=16 rows-per-program=4",
    # the other form: blocks of 2 of the 3 queries (the last partial), groups of 4 rows
    "query-blocks": PASSES % "partials-backward=query-blocks queries-per-program=2 rows-per-program=4",
}


@pytest.fixture(scope="module", params=[(48, "columns-of-16"), (40, "columns-of-16"), (40, "query-blocks")],
                ids=["D48-columns", "D40-columns", "D40-query-blocks"])
def layer(request, compile_layer):
    D, pipeline = request.param
    return compile_layer(name=f"block_attnres_bw_d{D}_{pipeline.replace('-', '_')}", kind="attnres", hidden_size=D,
                         num_blocks=NUM_BLOCKS, block_size=3, eps=EPS, dtype="float32", pipeline=PIPELINES[pipeline])


def inputs(n: int, B: int, T: int, D: int, score_scale: float = 3.0, queries: int = Q):
    """Representatives of growing scale (block sums grow with depth) sharing a direction, a
    partial sum, `queries` queries large enough that the softmaxes are far from uniform, gains not 1."""
    scales = torch.linspace(0.5, 4.0, n + 1)[:, None, None, None]
    sources = torch.randn(n + 1, B, T, D) * scales + 0.3 * torch.randn(n + 1, 1, 1, D)
    queries = torch.randn(queries, D) * score_scale / math.sqrt(D)
    gains = 1 + 0.3 * torch.randn(queries.shape[0], D)
    return sources[:n].contiguous(), sources[n].contiguous(), queries, gains


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def assert_gradient(name: str, got: torch.Tensor, want: torch.Tensor, dtype=torch.float32, rtol: float = RTOL) -> None:
    assert got.shape == want.shape, f"{name}: shape {list(got.shape)}, expected {list(want.shape)}"
    assert got.dtype == dtype, f"{name}: dtype {got.dtype}"
    assert torch.isfinite(got).all(), f"{name}: {(~torch.isfinite(got)).sum().item()} non-finite (unwritten?)"
    err = relative_error(got, want)
    assert err < rtol, f"{name}: relative error {err:.2e}"


def partials_reference_gradients(op, representatives, queries, gains, dlse, dmix):
    """float64 autograd of <dlse, lse> + <dmix, mix> over the normalised partials' reference."""
    leaves = [x.detach().double().requires_grad_() for x in (representatives, queries, gains)]
    lse, mix = reference.attnres_normalised_partials(*reference.attnres_block_partials(op, *leaves))
    ((lse * dlse.double()).sum() + (mix * dmix.double()).sum()).backward()
    return [x.grad for x in leaves]


def merge_reference_gradients(op, partial_sum, query, gain, block_lse, block_mix, dout):
    """float64 autograd of <dout, h> over the merge's reference from the partials (lse, 1, mix)."""
    leaves = [x.detach().double().requires_grad_() for x in (partial_sum, query, gain, block_lse, block_mix)]
    x, w, g, lse, mix = leaves
    h = reference.attnres_block_merge(op, lse, torch.ones_like(lse), mix, x, w, g)
    (h * dout.double()).sum().backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("n", [1, 2, NUM_BLOCKS])
@pytest.mark.parametrize("B,T", [(1, 7), (3, 5)], ids=["R7", "R15"])
@pytest.mark.parametrize("num_queries", [Q, 5], ids=["Q3", "Q5"])
def test_block_partials_backward_matches_float64_autograd(layer, n, B, T, num_queries):
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    representatives, _, queries, gains = inputs(n, B, T, D, queries=num_queries)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(num_queries, B, T), torch.randn(num_queries, B, T, D)
    got = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    want = partials_reference_gradients(op, representatives, queries, gains, dlse, dmix)
    for name, g, w in zip(("drepresentatives", "dqueries", "dgains"), got, want, strict=True):
        assert_gradient(name, g, w)
    if n == 1:  # one representative: its weight is 1, the mix passes d mix through, lse = its score
        assert got[1].norm() > 1e-3 * want[1].norm().item()  # ... whose cotangent reaches the queries


def test_columns_form_reads_each_representative_in_column_blocks_and_never_the_saved_mix(layer):
    """partials-backward=columns: the printed kernel walks the row in blocks of 16 columns (D = 40:
    two and a partial one; D = 48: three), stores d representatives in their dtype without atomics,
    and takes delta from the representatives: a NaN saved mix leaves every gradient as it was."""
    source = layer.path.read_text()
    if "_block_partials_backward_columns_kernel(" not in source:
        pytest.skip("partials-backward=query-blocks reads the saved mix (delta = dh . mix)")
    columns = source[source.index("_block_partials_backward_columns_kernel("):]
    columns = columns[:columns.index("\n\n\ndef ")]
    assert "BD = 16" in source and "tl.atomic_add(drepresentatives" not in source
    parameters = {line.strip().rstrip(",") for line in columns.split(")")[0].splitlines()[1:]}
    assert "tl.store(drepresentatives" in columns and "dblock_mix" in parameters and "block_mix" not in parameters
    D = layer.spec.params["hidden_size"]
    representatives, _, queries, gains = inputs(2, 1, 7, D, queries=5)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(5, 1, 7), torch.randn(5, 1, 7, D)
    right = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    nan_mix = torch.full_like(block_mix, math.nan)
    unread = layer.block_partials_backward(representatives, queries, gains, block_lse, nan_mix, dlse, dmix)
    for name, a, b in zip(("drepresentatives", "dqueries", "dgains"), unread, right, strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("B,T", [(1, 7), (3, 5)], ids=["R7", "R15"])
def test_block_merge_backward_matches_float64_autograd(layer, B, T):
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    representatives, partial_sum, queries, gains = inputs(2, B, T, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    for j in range(Q):
        args = (partial_sum[None], queries[j], gains[j], block_lse[j], block_mix[j])
        out, lse = layer.block_merge(*args, output_lse=True)
        dout = torch.randn(B, T, D)
        got = layer.block_merge_backward(*args, out, lse, dout)
        want = merge_reference_gradients(op, partial_sum, queries[j], gains[j], block_lse[j], block_mix[j], dout)
        for name, g, w in zip(("dpartial_sum", "dquery", "dgain", "dblock_lse", "dblock_mix"),
                              (got[0][0], *got[1:]), want, strict=True):
            assert_gradient(f"{name} (query {j})", g, w)


def test_merge_saves_the_log_sum_exp_over_partials_and_partial_sum(layer):
    """block_merge(..., output_lse=True)'s lse is log(exp(L_p) + exp(s)): the one-phase
    aggregate's over all the sources."""
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    representatives, partial_sum, queries, gains = inputs(3, 2, 3, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    sources = torch.cat([representatives, partial_sum[None]]).double()
    keys = sources / torch.sqrt(sources.pow(2).mean(-1, keepdim=True) + op.eps.value.data)
    for j in range(Q):
        _, lse = layer.block_merge(partial_sum[None], queries[j], gains[j], block_lse[j], block_mix[j],
                                   output_lse=True)
        want = torch.logsumexp(keys @ (queries[j] * gains[j]).double(), dim=0)
        assert lse.dtype == torch.float32 and (lse.double() - want).abs().max() < 1e-5


def test_grouped_merge_saves_the_log_sum_exp_for_the_backward(compile_layer):
    """With derive-block-attnres{rows-per-program=4} the merge's kernel walks groups of rows (each
    row resumed from its own partials); its saved log-sum-exp feeds the backward as the per-row
    kernel's does: 7 rows, a full group and a partial one."""
    D = 40
    layer = compile_layer(name="block_attnres_bw_groups", kind="attnres", hidden_size=D, num_blocks=NUM_BLOCKS,
                          block_size=3, eps=EPS, dtype="float32",
                          pipeline="fuse-attnres,derive-attnres-backward,derive-block-attnres{rows-per-program=4 "
                                   "grouped-from-rows=0},derive-block-attnres-backward,outline-kernels")
    assert "_block_merge_groups_kernel[grid](" in layer.path.read_text()
    op = layer_op(layer)
    representatives, partial_sum, queries, gains = inputs(2, 1, 7, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    args = (partial_sum[None], queries[1], gains[1], block_lse[1], block_mix[1])
    out, lse = layer.block_merge(*args, output_lse=True)
    dout = torch.randn(1, 7, D)
    got = layer.block_merge_backward(*args, out, lse, dout)
    want = merge_reference_gradients(op, partial_sum, queries[1], gains[1], block_lse[1], block_mix[1], dout)
    for name, g, w in zip(("dpartial_sum", "dquery", "dgain", "dblock_lse", "dblock_mix"), (got[0][0], *got[1:]),
                          want, strict=True):
        assert_gradient(name, g, w)


def test_softmax_is_recomputed_from_the_saved_lse(layer):
    """Both backwards take the softmax's weights from saved log-sum-exps: one off by 0.1 breaks
    every gradient they give."""
    D = layer.spec.params["hidden_size"]
    representatives, partial_sum, queries, gains = inputs(2, 1, 5, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(Q, 1, 5), torch.randn(Q, 1, 5, D)
    right = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    wrong = layer.block_partials_backward(representatives, queries, gains, block_lse + 0.1, block_mix, dlse, dmix)
    for name, a, b in zip(("drepresentatives", "dqueries", "dgains"), wrong, right, strict=True):
        assert relative_error(a, b.double()) > 1e-2, name
    args = (partial_sum[None], queries[0], gains[0], block_lse[0], block_mix[0])
    out, lse = layer.block_merge(*args, output_lse=True)
    dout = torch.randn(1, 5, D)
    right = layer.block_merge_backward(*args, out, lse, dout)
    wrong = layer.block_merge_backward(*args, out, lse + 0.1, dout)
    for name, a, b in zip(("dpartial_sum", "dquery", "dgain", "dblock_lse", "dblock_mix"), wrong, right, strict=True):
        assert relative_error(a, b.double()) > 1e-2, name


def test_query_gradients_do_not_read_the_rounded_saved_outputs(layer):
    """A bf16 forward stores the mix of phase 1 and the merge's output rounded; the softmax's row
    correction dh . h taken from them leaves the scores' cotangents summing to something else
    than they should (0 in the merge, d lse in phase 1). The re-centring takes that out of the
    queries' cotangents and of d block_lse: with the saved outputs rounded to bf16 they stay at
    fp32 accuracy (the rows' cotangents keep it, as the aggregate's d sources do)."""
    D = layer.spec.params["hidden_size"]
    op = layer_op(layer)
    representatives, partial_sum, queries, gains = inputs(3, 4, 8, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    rounded_mix = block_mix.to(torch.bfloat16).float()
    dlse, dmix = torch.randn(Q, 4, 8), torch.randn(Q, 4, 8, D)
    # phase 1's reference over the stored, unrounded partials' inputs: the mix rounded only where it is read back
    want = partials_reference_gradients(op, representatives, queries, gains, dlse, dmix)
    got = layer.block_partials_backward(representatives, queries, gains, block_lse, rounded_mix, dlse, dmix)
    assert_gradient("dqueries", got[1], want[1])
    assert_gradient("dgains", got[2], want[2])
    args = (partial_sum[None], queries[0], gains[0], block_lse[0], block_mix[0])
    out, lse = layer.block_merge(*args, output_lse=True)
    dout = torch.randn(4, 8, D)
    want = merge_reference_gradients(op, partial_sum, queries[0], gains[0], block_lse[0], block_mix[0], dout)
    got = layer.block_merge_backward(*args, out.to(torch.bfloat16).float(), lse, dout)
    for name, g, w in zip(("dquery", "dgain", "dblock_lse"), got[1:4], want[1:4], strict=True):
        assert_gradient(name, g, w)
    off = relative_error(got[0][0], want[0])
    assert 1e-6 < off < 2e-2, f"dpartial_sum with a rounded output: relative error {off:.1e}"


@pytest.mark.parametrize("name,bad", [("block_lse", lambda t: t.double()), ("dblock_lse", lambda t: t[:-1]),
                                      ("dblock_mix", lambda t: t[..., :-1].contiguous()),
                                      ("representatives", lambda t: t[..., :-1].contiguous())])
def test_partials_backward_refuses_bad_arguments(layer, name, bad):
    D = layer.spec.params["hidden_size"]
    representatives, _, queries, gains = inputs(2, 2, 3, D)
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    args = dict(representatives=representatives, queries=queries, gains=gains, block_lse=block_lse,
                block_mix=block_mix, dblock_lse=torch.randn(Q, 2, 3), dblock_mix=torch.randn(Q, 2, 3, D))
    args[name] = bad(args[name])
    with pytest.raises(ValueError) as err:
        layer.block_partials_backward(**args)
    assert one_line(str(err.value)) and str(err.value).startswith(f"{name}:")


# --- k3compile.ops: the two phases as differentiable custom ops ---------------------------------


@pytest.fixture
def ops_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "k3c_cache"))


def two_phase_step(representatives, partial_sum, queries, gains, douts):
    """Block AttnRes's aggregation points of one block: phase 1 once, a merge per query."""
    from k3compile.ops.attnres import attnres_block_merge, attnres_block_partials

    partials = attnres_block_partials(representatives, queries, gains, eps=EPS)
    loss = 0
    for j in range(queries.shape[0]):
        h = attnres_block_merge([p[j] for p in partials], partial_sum, queries[j], gains[j], eps=EPS)
        loss = loss + (h * douts[j]).sum()
    return loss


def one_phase_gradients(representatives, partial_sum, queries, gains, douts):
    """float64 autograd of the one-phase definition over torch.cat([representatives, partial_sum[None]])
    (written out, not the reference's code)."""
    leaves = [t.detach().double().requires_grad_() for t in (representatives, partial_sum, queries, gains)]
    x = torch.cat([leaves[0], leaves[1][None]])
    loss = 0
    for j in range(queries.shape[0]):
        keys = leaves[3][j] * x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)
        h = (torch.softmax(keys @ leaves[2][j], dim=0)[..., None] * x).sum(0)
        loss = loss + (h * douts[j].double()).sum()
    loss.backward()
    return loss.detach(), [t.grad for t in leaves]


def grads_of(step, tensors, douts):
    leaves = [x.detach().clone().requires_grad_() for x in tensors]
    loss = step(*leaves, douts)
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


NAMES = ("representatives", "partial_sum", "queries", "gains")


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("D", [48, 40])
def test_two_phases_train_as_the_one_phase_aggregate(ops_cache, n, D):
    """The composition's gradients (phase 1 once, Q merges, torch autograd between them) equal
    float64 autograd of the one-phase aggregate of each query over the representatives and the
    partial sum."""
    tensors = inputs(n, 1, 5, D)
    douts = torch.randn(Q, 1, 5, D)
    loss, grads = grads_of(two_phase_step, tensors, douts)
    want_loss, want = one_phase_gradients(*tensors, douts)
    assert abs(loss.item() - want_loss.item()) < 1e-4 * abs(want_loss.item())
    for name, g, w in zip(NAMES, grads, want, strict=True):
        assert_gradient(name, g, w)


def test_gradients_by_finite_differences(ops_cache):
    """gradcheck's idea in fp32: along random directions, the compiled forward's central finite
    difference (in float64 arithmetic of the fp32 losses) equals the compiled backward's
    directional derivative, for each input alone."""
    D = 40
    tensors = [t.double().float() for t in inputs(2, 1, 3, D, score_scale=2.0)]
    douts = torch.randn(Q, 1, 3, D)
    _, grads = grads_of(two_phase_step, tensors, douts)
    step = 1e-2
    for i, name in enumerate(NAMES):
        direction = torch.randn_like(tensors[i])
        direction /= direction.norm()
        losses = []
        for sign in (1, -1):
            moved = [t + sign * step * direction if k == i else t for k, t in enumerate(tensors)]
            with torch.no_grad():
                losses.append(two_phase_step(*moved, douts).double().item())
        numeric = (losses[0] - losses[1]) / (2 * step)
        analytic = (grads[i].double() * direction.double()).sum().item()
        assert abs(numeric - analytic) < 2e-2 * max(abs(analytic), grads[i].norm().item() * 0.05), \
            f"{name}: finite difference {numeric:.6f}, backward {analytic:.6f}"


def test_custom_ops_pass_opcheck(ops_cache):
    from k3compile.ops.attnres import AttnResKey, block_merge_operator, block_partials_operator

    D = 12
    representatives, partial_sum, queries, gains = inputs(2, 2, 3, D)
    key = AttnResKey(D, 1e-6, 8)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(block_partials_operator(key), tuple(x.requires_grad_() for x in
                                                              (representatives, queries, gains)), test_utils=utils)
    block_lse, block_mix = block_partials_operator(key)(representatives, queries, gains)
    torch.library.opcheck(block_merge_operator(key), tuple(x.detach().requires_grad_() for x in
                                                           (partial_sum, queries[0], gains[0], block_lse[0],
                                                            block_mix[0])), test_utils=utils)


def test_training_through_torch_compile(ops_cache):
    """torch.compile(fullgraph=True) captures a training step of the two phases: the same loss
    and gradients as eager; without inputs that need grad the plain entries run, the same h."""
    from k3compile.ops.attnres import attnres_block_merge, attnres_block_partials

    tensors = inputs(2, 1, 3, 20)
    douts = torch.randn(Q, 1, 3, 20)
    loss, grads = grads_of(two_phase_step, tensors, douts)
    compiled_loss, compiled_grads = grads_of(torch.compile(two_phase_step, fullgraph=True, backend="aot_eager"),
                                             tensors, douts)
    assert torch.equal(compiled_loss, loss)
    for name, a, b in zip(NAMES, compiled_grads, grads, strict=True):
        assert torch.equal(a, b), name
    representatives, partial_sum, queries, gains = tensors
    with torch.no_grad():
        partials = attnres_block_partials(representatives, queries, gains)
        plain = attnres_block_merge([p[1] for p in partials], partial_sum, queries[1], gains[1])
    leaves = [t.clone().requires_grad_() for t in tensors]
    through = attnres_block_partials(leaves[0], leaves[2], leaves[3])
    through_op = attnres_block_merge([p[1] for p in through], leaves[1], leaves[2][1], leaves[3][1])
    assert through_op.requires_grad and torch.equal(plain, through_op.detach())


def test_half_precision_gradients_come_back_in_the_inputs_dtypes(ops_cache):
    """bf16 inputs (the interpreter computes in fp32 and rounds): every gradient in its input's
    dtype, within bf16's rounding of float64 autograd of the one-phase definition."""
    tensors = [t.to(torch.bfloat16) for t in inputs(2, 1, 3, 24)]
    douts = torch.randn(Q, 1, 3, 24).to(torch.bfloat16)
    _, grads = grads_of(two_phase_step, tensors, douts)
    _, want = one_phase_gradients(*tensors, douts)
    for name, g, w in zip(NAMES, grads, want, strict=True):
        assert_gradient(name, g, w, torch.bfloat16, rtol=3e-2)


def test_refusals_stay_one_line(ops_cache):
    from k3compile.ops.attnres import attnres_block_merge, attnres_block_partials

    representatives, partial_sum, queries, gains = inputs(2, 1, 3, 16)
    with pytest.raises(ValueError) as err:
        attnres_block_partials(representatives.requires_grad_(), queries[:, :-1], gains)
    assert one_line(str(err.value)) and str(err.value).startswith("queries:")
    partials = attnres_block_partials(representatives, queries, gains)
    with pytest.raises(ValueError) as err:
        attnres_block_merge([partials[0][0].double(), partials[1][0]], partial_sum, queries[0], gains[0])
    assert one_line(str(err.value)) and str(err.value).startswith("block_lse:")


def test_backward_needs_the_normalised_partials(capsys):
    from conftest import run_cli

    code, _, err = run_cli(capsys, "ir", "examples/attnres.toml", "-p",
                           "fuse-attnres,derive-block-attnres{partials=numerator},derive-block-attnres-backward")
    assert code != 0 and one_line(err) and "normalised partials" in err, err


def test_k3c_verify_checks_both_phases_gradients(monkeypatch):
    """`k3c verify` of an attnres spec has block_partials_backward and block_merge_backward rows
    (every gradient, the non-power-of-two width too) that pass, and fail when the reference's
    gradient is off (the merge's query scaled in the backward rows only: the comparison is live)."""
    from k3compile.spec import spec_from_table
    from k3compile.checking.verify import verify

    spec = spec_from_table({"name": "verify_block_backward", "kind": "attnres", "hidden_size": 32, "num_blocks": 2,
                            "block_size": 4}, source="<test>")
    rows = [r for r in verify(spec, device="cpu", seed=3) if r.entry.startswith("block_") and
            r.entry.endswith("_backward")]
    assert {(r.layer.endswith("npow2"), r.entry, r.tensor) for r in rows} == {
        (npow2, entry, tensor) for npow2 in (False, True)
        for entry, tensors in (("block_partials_backward", ("drepresentatives", "dqueries", "dgains")),
                               ("block_merge_backward", ("dpartial_sum", "dquery", "dgain", "dblock_lse",
                                                         "dblock_mix")))
        for tensor in tensors}
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    merge = reference.attnres_block_merge

    def off_in_the_query(op, lse, z, mix, x, query, gain):
        return merge(op, lse, z, mix, x, query * 1.01 if query.requires_grad else query, gain)

    monkeypatch.setattr(reference, "attnres_block_merge", off_in_the_query)
    broken = [r for r in verify(spec, device="cpu", seed=3, quick=True) if r.entry == "block_merge_backward"]
    assert broken and not any(r.passed for r in broken if r.tensor == "dquery")


@pytest.mark.parametrize("options", ["", "derive-block-attnres-backward{partials-backward=columns}"])
def test_backward_ops_return_what_their_fakes_say(ops_cache, options):
    """The backward custom ops' results have their fakes' dtypes and shapes in half precision too
    (a compiled graph plans its buffers and casts by the fakes), under either phase 1 backward:
    query-blocks adds d representatives by fp32 atomics, columns stores them in their dtype."""
    from k3compile.ops import pass_options
    from k3compile.ops.attnres import AttnResKey, block_merge_operator, block_partials_operator

    D = 12
    representatives, partial_sum, queries, gains = (x.to(torch.bfloat16) for x in inputs(2, 2, 3, D))
    key = AttnResKey(D, 1e-6, 8)
    name = key.module_name()
    utils = ("test_schema", "test_faketensor")
    with pass_options(options):
        block_lse, block_mix = block_partials_operator(key)(representatives, queries, gains)
        partials_backward = getattr(torch.ops.k3compile, f"attnres_block_partials_backward_{name}")
        torch.library.opcheck(partials_backward, (representatives, queries, gains, block_lse, block_mix,
                                                  torch.randn_like(block_lse), torch.randn_like(block_mix)),
                              test_utils=utils)
        out, lse = block_merge_operator(key)(partial_sum, queries[0], gains[0], block_lse[0], block_mix[0])
        merge_backward = getattr(torch.ops.k3compile, f"attnres_block_merge_backward_{name}")
        torch.library.opcheck(merge_backward, (partial_sum, queries[0], gains[0], block_lse[0], block_mix[0], out,
                                               lse, torch.randn_like(out)), test_utils=utils)
