"""The compiled MoE router `route(x, router_weight, router_bias) -> (topk_ids, topk_weights)`
against reference.latent_moe_routing: the chosen experts exactly, in order, and their weights;
its logits kernel's blocks of rows, experts and hidden columns and its slices of the hidden
columns at every launch by rows, partial ones included."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_matches, layer_op
from k3compile.ir import k3s, reference

# (hidden_size, num_experts, top_k, norm_topk_prob, routed_scaling_factor): d not a power of two
# (40, 48), experts below tl.dot's 16 (8) and padded (12), and K3's 896 experts, top-16
LAYERS = [(48, 12, 3, True, 2.5), (40, 8, 1, True, 1.0), (40, 12, 4, False, 0.5), (48, 8, 4, False, 1.0),
          (64, 896, 16, True, 2.5)]


@pytest.fixture(scope="module", params=LAYERS, ids=lambda p: "d{}_e{}_k{}_{}_x{}".format(
    p[0], p[1], p[2], "norm" if p[3] else "raw", p[4]))
def layer(request, compile_layer):
    d, E, k, norm, scale = request.param
    return compile_layer(name=f"moe_d{d}_e{E}_k{k}_{'norm' if norm else 'raw'}_{str(scale).replace('.', '_')}",
                         kind="latent_moe", hidden_size=d, num_experts=E, top_k=k, expert_ffn_dim=16,
                         norm_topk_prob=norm, routed_scaling_factor=scale, dtype="float32")


def dims(layer) -> tuple[int, int, int]:
    params = layer.spec.params
    return params["hidden_size"], params["num_experts"], params["top_k"]


def selection_gaps(x, router_weight, router_bias, top_k: int) -> torch.Tensor:
    """Per row, the least gap between s + bias of neighbouring ranks down to rank top_k (the
    first expert not chosen): how far the row is from a tie that would make its order ambiguous."""
    scores = torch.sigmoid(x.double() @ router_weight.double().T) + router_bias.double()
    ranked = scores.sort(dim=-1, descending=True).values[:, :top_k + 1]
    if ranked.shape[1] == 1:  # all experts chosen by one: no order to get wrong
        return torch.full((x.shape[0],), math.inf)
    return (ranked[:, :-1] - ranked[:, 1:]).min(-1).values


def inputs(R: int, d: int, E: int, top_k: int):
    """Fresh random inputs whose rankings have no near ties (fp32 logits are off by ~1e-6): rows
    of x near one are drawn again."""
    x = torch.randn(R, d)
    router_weight = torch.randn(E, d) * 2 / math.sqrt(d)
    router_bias = 0.1 * torch.randn(E)
    for _ in range(100):
        near = selection_gaps(x, router_weight, router_bias, top_k) <= 1e-4
        if not near.any():
            return x, router_weight, router_bias
        x[near] = torch.randn(int(near.sum()), d)
    raise AssertionError("no draw without near ties in 100 tries")


def assert_routes(layer, x, router_weight, router_bias) -> None:
    result = layer.route(x, router_weight, router_bias)
    assert isinstance(result, tuple) and len(result) == 2
    ids, weights = result
    ref_ids, ref_weights = reference.latent_moe_routing(layer_op(layer), x, router_weight, router_bias)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long(), ref_ids), f"experts {ids.tolist()} != reference {ref_ids.tolist()}"
    assert_matches(weights, ref_weights, "topk_weights")


@pytest.mark.parametrize("R", [1, 5, 33])
def test_matches_reference(layer, R):
    d, E, k = dims(layer)
    assert_routes(layer, *inputs(R, d, E, k))


def test_bias_selects_but_does_not_weigh(layer):
    """A large bias on experts the scores rank last makes them chosen, with their small scores."""
    d, E, k = dims(layer)
    x, router_weight, router_bias = inputs(4, d, E, k)
    last = torch.sigmoid(x @ router_weight.T).mean(0).argsort()[:k]
    router_bias[last] += 10 + torch.arange(k, dtype=torch.float32)  # distinct: no ties among them
    ids, _ = layer.route(x, router_weight, router_bias)
    assert set(ids.flatten().tolist()) <= set(last.tolist())
    assert_routes(layer, x, router_weight, router_bias)


def test_underflowed_scores_give_zero_weights_not_nan(layer):
    """A row whose logits are all far below zero: every sigmoid underflows to 0 in fp32 (and in
    float64 below -745), and the normalised weights are 0, as the reference's, not 0/0."""
    d, E, k = dims(layer)
    x, router_weight, router_bias = inputs(5, d, E, k)
    router_weight = router_weight.abs() + 0.1
    x[2] = -1e4 * torch.rand(d).add(0.5)  # row 2: logits below -800 for every expert
    ids, weights = layer.route(x, router_weight, router_bias)
    assert torch.isfinite(weights).all(), weights
    assert torch.equal(weights[2], torch.zeros(k)), weights[2]
    assert_routes(layer, x, router_weight, router_bias)


def test_ties_rank_the_lower_expert_first(layer):
    """Exact ties: zero rows score every expert 0.5, so with a zero bias they choose experts
    0..k-1; experts in pairs of equal router rows and biases rank the lower id of a pair first."""
    d, E, k = dims(layer)
    x = torch.randn(6, d)
    x[[0, 3]] = 0.0
    bias = torch.zeros(E)
    ids, weights = layer.route(x, torch.randn(E, d), bias)
    assert ids[[0, 3]].tolist() == [list(range(k))] * 2
    op = layer_op(layer)
    share = 1 / k if op.norm_topk_prob.value.data else 0.5
    torch.testing.assert_close(weights[[0, 3]], torch.full((2, k), share * op.routed_scaling_factor.value.data))
    pairs = torch.arange(E) // 2
    # biases 2 apart, scores in (0, 1): different pairs are never near a tie
    group_weight, group_bias = torch.randn(E, d), 2 * torch.randperm(E).float()
    ids, _ = layer.route(x, group_weight[pairs], group_bias[pairs])
    for row in ids.tolist():
        for a, b in zip(row, row[1:]):
            if a // 2 == b // 2:  # both experts of one pair: the lower id first
                assert a < b, f"tied experts {a}, {b} in the wrong order: {row}"
    assert_routes(layer, x, group_weight[pairs], group_bias[pairs])


def logit_tiles(layer) -> list[tuple[int | None, int, int, int, int]]:
    """(at most this many rows, None for any; BR, BE, BD, HS) of the logits kernel's launches, as
    legalize-triton fixed them: its k3s.launch_by_rows ops, then its own block sizes and slices."""
    ops = list(layer.compilation.scheduled.walk())
    kernel = next(op for op in ops if isinstance(op, k3s.KernelOp) and op.sym_name.data.endswith("_router_logits"))
    sizes = ("block_r", "block_e", "block_d", "hidden_slices")
    launches = [(op.max_rows.value.data, *(op.properties[key].value.data for key in sizes))
                for op in ops if isinstance(op, k3s.LaunchByRowsOp) and op.applies_to(kernel)]
    return [*launches, (None, *(kernel.properties[key].value.data for key in sizes))]


def rows_of_each_launch(layer) -> list[tuple[int, tuple]]:
    """Row counts in each launch's range with that launch's tiles: its least rows, and where
    those are not already several row blocks with a partial last one, the fewest rows that are
    (least + BR + 1), or the range's bound - 1 where it allows no more blocks. (The least rows
    of a launch past the first are the previous bound + 1: several blocks of a BR that divides
    the bound, the last of them one row.)"""
    rows, least = [], 1
    for tiles in logit_tiles(layer):
        most, BR = tiles[0], tiles[1]
        rows.append((least, tiles))
        if least <= BR or not least % BR:
            R = least + BR + 1 if most is None else min(least + BR + 1, most - 1)
            assert least <= R and R % BR, f"R = {R}: in {least}..{most}, a partial block of {BR}"
            assert R > BR or most <= BR + 1, f"R = {R}: several blocks of {BR} where {least}..{most} allows"
            rows += [(R, tiles)] if least < R else []
        least = (most or 0) + 1
    return rows


def slice_columns(d: int, BD: int, HS: int) -> list[range]:
    """The hidden columns of each of HS slices: an even share of the cdiv(d, BD) blocks of BD
    columns each, in order (k3s.router_logits: whole blocks, counts differing by at most one)."""
    blocks = -(-d // BD)
    return [range(i * blocks // HS * BD, min((i + 1) * blocks // HS * BD, d)) for i in range(HS)]


def test_no_hidden_slice_without_columns(layer):
    """legalize-triton slices the hidden columns no finer than its blocks of BD columns: the
    small layers here (d <= 64, one block) take one slice at every row count."""
    d = dims(layer)[0]
    for most, _, _, BD, HS in logit_tiles(layer):
        assert 1 <= HS <= -(-d // BD), f"{HS} slices of {-(-d // BD)} blocks of {BD} columns at R <= {most}"


@pytest.fixture(scope="module")
def blocks_layer(compile_layer):
    """200 experts: a partial block of experts at every BE from 16 to 128 (K3's 896 divides by
    all); 1100 hidden columns: a partial block at every BD from 64 to 256, and for a few rows
    slices of different block counts (1100 is no multiple of slices x BD)."""
    return compile_layer(name="moe_blocks", kind="latent_moe", hidden_size=1100, num_experts=200, top_k=5,
                         expert_ffn_dim=16, norm_topk_prob=True, routed_scaling_factor=1.5, dtype="float32")


def test_blocks_of_rows_experts_and_hidden_slices(blocks_layer, monkeypatch):
    """At row counts of every launch by rows: several blocks of rows and of experts, the last of
    each partial, and the hidden columns in HS slices; the partial logits' workspace (NaN-filled
    when allocated) written whole, each slice's plane with x W_r^T over that slice's columns,
    and the routes exact."""
    module = blocks_layer.module
    assert module.POISON_OUTPUTS, "the tests allocate every output and workspace NaN-filled (conftest)"
    allocated, alloc = [], module._alloc

    def keep(*args):  # every tensor the entry allocates, the workspace among them
        allocated.append(alloc(*args))
        return allocated[-1]

    monkeypatch.setattr(module, "_alloc", keep)
    d, E, k = dims(blocks_layer)
    tiles = logit_tiles(blocks_layer)
    assert len(tiles) > 1, "the logits kernel launches by rows"
    assert any(HS > 1 and d % (HS * BD) and -(-d // BD) % HS for _, _, _, BD, HS in tiles), \
        "a launch whose slices hold different block counts, the last block partial"
    for R, (_, BR, BE, BD, HS) in rows_of_each_launch(blocks_layer):
        assert E % BE and E > BE, f"E = {E} must leave a partial block of {BE} experts"
        x, router_weight, router_bias = inputs(R, d, E, k)
        allocated.clear()
        assert_routes(blocks_layer, x, router_weight, router_bias)
        partial = next(t for t in allocated if t.dim() == 3)
        assert tuple(partial.shape) == (HS, R, E) and partial.dtype == torch.float32
        for i, columns in enumerate(slice_columns(d, BD, HS)):
            assert len(columns), f"slice {i} of {HS} has no columns at R = {R}"
            expected = x.double()[:, columns] @ router_weight.double()[:, columns].T
            assert_matches(partial[i], expected, f"partial logits of slice {i} of {HS} at R = {R}")


@pytest.mark.parametrize("name, change, words", [
    ("x", lambda a: {**a, "x": a["x"][:, :-1]}, "dim 1 of shape [R,"),
    ("x", lambda a: {**a, "x": a["x"].t().contiguous().t()}, "must be contiguous"),
    ("x", lambda a: {**a, "x": a["x"].double()}, "expected dtype"),
    ("router_weight", lambda a: {**a, "router_weight": a["router_weight"][:-1]}, "dim 0 of shape"),
    ("router_weight", lambda a: {**a, "router_weight": a["router_weight"].to(torch.int32)}, "expected dtype"),
    ("router_bias", lambda a: {**a, "router_bias": a["router_bias"].to(torch.bfloat16)}, "expected dtype torch.float32"),
    ("router_bias", lambda a: {**a, "router_bias": a["router_bias"][None]}, "expected shape"),
    ("router_bias", lambda a: {**a, "router_bias": None}, "required, got None"),
])
def test_bad_inputs_name_the_tensor(compile_layer, name, change, words):
    layer = compile_layer(name="moe_checks", kind="latent_moe", hidden_size=40, num_experts=12, top_k=3,
                          expert_ffn_dim=16, dtype="float32")
    x, router_weight, router_bias = inputs(5, 40, 12, 3)
    arguments = change({"x": x, "router_weight": router_weight, "router_bias": router_bias})
    with pytest.raises(ValueError) as error:
        layer.route(**arguments)
    message = str(error.value)
    assert message.startswith(f"{name}: ") and words in message and "\n" not in message
