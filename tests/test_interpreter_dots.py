"""The interpreter's bf16 products (k3compile/interpreter_dots.py, installed by conftest and by
`k3c verify --device cpu`): a bf16 tl.dot in Triton's interpreter gives the product of the
values, as the GPU does, not of their stored bits."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl


@triton.jit
def _product_kernel(a, b, c, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    o_m, o_k, o_n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    b_a = tl.load(a + o_m[:, None] * K + o_k[None, :])
    b_b = tl.load(b + o_k[:, None] * N + o_n[None, :])
    tl.store(c + o_m[:, None] * N + o_n[None, :], tl.dot(b_a, b_b, tl.zeros([M, N], dtype=tl.float32)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_products_are_of_values(dtype):
    a, b = torch.randn(16, 32).to(dtype), torch.randn(32, 16).to(dtype)
    c = torch.full((16, 16), float("nan"))
    _product_kernel[(1,)](a, b, c, 16, 32, 16)
    want = a.double() @ b.double()  # bf16 and fp16 values are exact in fp32: only the sums round
    assert (c.double() - want).abs().max().item() <= 1e-5 * want.abs().max().item()
