"""block_partials_backward in blocks of columns (derive-block-attnres-backward{partials-backward=
columns}: the fold kernel, a program per group of rows with its products on tl.dot, the queries'
cotangents summed over parts of the rows by a kernel of their own) against float64 torch autograd
of the normalised partials' reference, at K3's number of representatives (num_blocks = 8, so
BS = 8 and groups of 2 rows: 16 (row, representative) pairs a product).

D = 40 (blocks of 16 columns: two and a partial one), Q = 12 and 3 (not powers of two; BQ = 16),
n = 1 and 8 representatives, 37 token rows (odd: a partial last group; the queries' kernel in
parts of 32 rows, so two parts add their shares), fp32, bf16 and fp16 (the interpreter rounds bf16
as the GPU does: conftest). Outputs and workspaces are allocated NaN-filled (conftest's
K3C_POISON_OUTPUTS): an element no kernel writes, or one read before it is written, is NaN. A
row whose sum of squares leaves the products' safe range takes k3s.group_scores' rescan (its rho
made off by 1.5x fails the float64 check: checked by hand).
"""

from __future__ import annotations

import pytest
import torch

from conftest import layer_op
from test_block_attnres_backward import EPS, PASSES, assert_gradient, inputs, partials_reference_gradients

D, B, T = 40, 1, 37
PIPELINE = PASSES % ("partials-backward=columns block-columns=16 columns-rows=1 query-rows=32 query-pairs=16 "
                     "query-columns=16")
# relative norm error per gradient (d representatives; dqueries and dgains): the representatives'
# are rounded to their dtype (seen: 1.8e-3 at bf16, 2.1e-4 at fp16), the queries' (fp32) carry
# the two-part splits' 2^-16 (seen: at most 3.3e-6 in every dtype; 2.3e-6 at fp32)
RTOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (5e-3, 2e-5), torch.float16: (1e-3, 2e-5)}


@pytest.fixture(scope="module")
def layer(compile_layer):
    return compile_layer(name="block_attnres_bw_columns_k3", kind="attnres", hidden_size=D, num_blocks=8, block_size=3,
                         eps=EPS, dtype="float32", pipeline=PIPELINE)


def test_the_schedule_the_options_ask_for(layer):
    """Groups of 2 rows (columns-rows=1 raised to 16 pairs), blocks of 16 columns, the queries'
    kernel in parts of 32 rows and 16 columns, 16 pairs a product; no loop over a group's rows and
    no atomics but the queries' kernel's."""
    source = layer.path.read_text()
    columns = source[source.index("_block_partials_backward_columns_kernel("):]
    columns = columns[:columns.index("\n\n\n")]
    queries = source[source.index("_block_partials_backward_queries_kernel("):]
    queries = queries[:queries.index("\n\n\n")]
    host = source[source.index("def block_partials_backward("):]
    assert "for i_r in" not in columns and "tl.atomic_add" not in columns and "tl.dot(" in columns
    assert queries.count("tl.atomic_add(") == 2
    assert all(f"{name}\n" in host for name in ("BR = 2", "BD = 16", "BS = 8", "BR = 32", "BK = 16"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("num_queries", [12, 3])
def test_matches_float64_autograd(layer, dtype, n, num_queries):
    op = layer_op(layer)
    representatives, _, queries, gains = (x.to(dtype) for x in inputs(n, B, T, D, queries=num_queries))
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(num_queries, B, T), torch.randn(num_queries, B, T, D).to(dtype)
    got = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    want = partials_reference_gradients(op, representatives, queries, gains, dlse, dmix)
    rows_rtol, weights_rtol = RTOL[dtype]
    for name, g, w, out_dtype, rtol in zip(("drepresentatives", "dqueries", "dgains"), got, want,
                                           (dtype, torch.float32, torch.float32),
                                           (rows_rtol, weights_rtol, weights_rtol), strict=True):
        assert_gradient(f"{name} ({dtype}, n = {n}, Q = {num_queries})", g, w, out_dtype, rtol)
    if n == 1:  # one representative: its weight is 1, yet lse's cotangent reaches the queries
        assert got[1].norm() > 1e-3 * want[1].norm().item()


def test_rows_past_the_products_safe_range(layer):
    """A representative row of scale 1e18 (its sum of squares past 2^100): k3s.group_scores reads
    the group's rows again scaled, its rho feeds the coefficients, and every gradient still
    matches float64 autograd (fp32)."""
    op = layer_op(layer)
    representatives, _, queries, gains = inputs(2, B, T, D, queries=3)
    representatives[1, 0, 5] *= 1e18
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(3, B, T), torch.randn(3, B, T, D)
    got = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    want = partials_reference_gradients(op, representatives, queries, gains, dlse, dmix)
    for name, g, w in zip(("drepresentatives", "dqueries", "dgains"), got, want, strict=True):
        assert_gradient(name, g, w, torch.float32, RTOL[torch.float32][0])
    # the huge row's own cotangent, relative to itself (its scale 1e-18 of the others')
    assert_gradient("its row", got[0][1, 0, 5], want[0][1, 0, 5], torch.float32, RTOL[torch.float32][0])


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # d representatives at 1e5
@pytest.mark.parametrize("scale", [1e-6, 1e5], ids=["tiny", "loss-scaled"])
def test_fp16_coefficients_of_any_scale(layer, scale):
    """t = s_bar / rho has the cotangents' scale: split in two fp16 parts as it stands it would
    fall into fp16's subnormals (cotangents of scale 1e-6: dqueries 2.4e-3 off) or past 65504
    (1e5: NaN); over a power of two (k3s.split_weights' scale, the queries' kernel's per product)
    dqueries and dgains (fp32) keep their accuracy at both. (d representatives are fp16 here:
    at 1e5 they overflow it, at 1e-6 they round as its subnormals; not checked.)"""
    op = layer_op(layer)
    representatives, _, queries, gains = (x.half() for x in inputs(8, B, T, D, queries=12))
    block_lse, block_mix = layer.block_partials(representatives, queries, gains)
    dlse, dmix = torch.randn(12, B, T) * scale, (torch.randn(12, B, T, D) * min(scale, 1.0)).half()
    got = layer.block_partials_backward(representatives, queries, gains, block_lse, block_mix, dlse, dmix)
    want = partials_reference_gradients(op, representatives, queries, gains, dlse, dmix)
    for name, g, w in zip(("dqueries", "dgains"), got[1:], want[1:], strict=True):
        assert_gradient(f"{name} (cotangents of scale {scale:g})", g, w, torch.float32, RTOL[torch.float16][1])
