"""bf16 in Triton's interpreter (k3compile/checking/interpreter_bf16.py, installed by conftest and by
`k3c verify --device cpu`): ops on bf16 tiles compute on their values and round to bf16 as the GPU
does, not on the uint16 bits the interpreter stores them as. The references are torch's: the
values in fp32 (or float64), the op, one rounding to bf16 (to nearest even)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

N = 64


def bits(x: torch.Tensor) -> torch.Tensor:
    """bf16 tensors' bits (NaNs all alike: the GPU's and torch's NaN payloads differ)."""
    return torch.where(torch.isnan(x), torch.full_like(x, float("nan")), x).view(torch.int16)


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype == torch.bfloat16
    wrong = (bits(got) != bits(want)).nonzero().flatten().tolist()
    assert not wrong, f"{what}: {len(wrong)} differ, e.g. got {got[wrong[:3]].tolist()}, want {want[wrong[:3]].tolist()}"


def operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three bf16 vectors of N: mostly random of both signs and several scales, with zeros of both
    signs, equal pairs, inf, NaN and values whose sum or product overflows."""
    a, b, c = (torch.randn(N) * torch.exp2(torch.randint(-6, 7, (N,)).float()) for _ in range(3))
    a[:8] = torch.tensor([0.0, -0.0, 1.5, -2.25, float("inf"), float("nan"), 3e38, -3e38])
    b[:8] = torch.tensor([-0.0, 0.0, 1.5, -2.25, 2.0, 1.0, 3e38, 3e38])
    return a.bfloat16(), b.bfloat16(), c.bfloat16()


def by_fp32(op, *xs: torch.Tensor) -> torch.Tensor:
    """op on the values in fp32, rounded once to bf16: what the GPU's bf16 op gives."""
    return op(*(x.float() for x in xs)).bfloat16()


@triton.jit
def _arithmetic_kernel(a, b, c, add, sub, mul, div, neg, fma, mx, mn, N: tl.constexpr):
    o = tl.arange(0, N)
    x, y, z = tl.load(a + o), tl.load(b + o), tl.load(c + o)
    tl.store(add + o, x + y)
    tl.store(sub + o, x - y)
    tl.store(mul + o, x * y)
    tl.store(div + o, x / y)  # in fp32 (Triton divides bf16 there), stored rounded to bf16
    tl.store(neg + o, -x)
    tl.store(fma + o, tl.fma(x, y, z))
    tl.store(mx + o, tl.maximum(x, y))
    tl.store(mn + o, tl.minimum(x, y))


def test_arithmetic_rounds_each_op():
    """+, -, *, /, negation, fma, max and min of bf16 tiles: each bit for bit the fp32 op on the
    values rounded once to bf16 (fma: exact, rounded once), negatives, zeros, inf and NaN included."""
    a, b, c = operands()
    names = ("add", "sub", "mul", "div", "neg", "fma", "max", "min")
    out = {name: torch.full((N,), float("nan"), dtype=torch.bfloat16) for name in names}
    _arithmetic_kernel[(1,)](a, b, c, *out.values(), N)
    want = {"add": by_fp32(torch.add, a, b), "sub": by_fp32(torch.sub, a, b), "mul": by_fp32(torch.mul, a, b),
            "div": by_fp32(torch.div, a, b), "neg": -a,
            "fma": (a.double() * b.double() + c.double()).bfloat16(),
            "max": by_fp32(torch.fmax, a, b), "min": by_fp32(torch.fmin, a, b)}
    for name in names:
        if name in ("max", "min"):  # of -0 and +0, either (a zero's sign is no value)
            out[name], want[name] = (torch.where(t == 0, torch.zeros_like(t), t) for t in (out[name], want[name]))
        assert_bits(out[name], want[name], name)


@triton.jit
def _compare_kernel(a, b, lt, le, eq, ne, gt, N: tl.constexpr):
    o = tl.arange(0, N)
    x, y = tl.load(a + o), tl.load(b + o)
    tl.store(lt + o, (x < y).to(tl.int8))
    tl.store(le + o, (x <= y).to(tl.int8))
    tl.store(eq + o, (x == y).to(tl.int8))
    tl.store(ne + o, (x != y).to(tl.int8))
    tl.store(gt + o, tl.where(x > y, x, y))


def test_comparisons_are_of_values():
    """Comparisons of bf16 tiles order their values: negatives below positives, -0 == +0, NaN
    unordered (the bits, as unsigned integers, order none of these)."""
    a, b, _ = operands()
    out = [torch.full((N,), -1, dtype=torch.int8) for _ in range(4)]
    select = torch.full((N,), float("nan"), dtype=torch.bfloat16)
    _compare_kernel[(1,)](a, b, *out, select, N)
    for got, op in zip(out, (torch.lt, torch.le, torch.eq, torch.ne)):
        assert torch.equal(got, op(a, b).to(torch.int8)), op.__name__
    assert_bits(select, torch.where(a > b, a, b), "where(x > y, x, y)")


@triton.jit
def _cast_kernel(x, y, z, w, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o).to(tl.bfloat16))
    tl.store(z + o, (o * 4099 + 2**20).to(tl.bfloat16))
    tl.store(w + o, tl.load(x + o).to(tl.bfloat16).to(tl.float16))


def test_casts_round_to_nearest_even():
    """fp32 -> bf16 rounds to nearest even (the interpreter's own cast truncates), ties, subnormals,
    overflow to inf and NaN included; int32 -> bf16 and bf16 -> fp16 likewise."""
    x = torch.randn(N) * torch.exp2(torch.randint(-20, 20, (N,)).float())
    x[:10] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-12), 1e-40, -3e-39, 3.3999e38, -3.4e38,
                           float("inf"), float("nan"), -0.0])
    y, z = torch.empty(N, dtype=torch.bfloat16), torch.empty(N, dtype=torch.bfloat16)
    w = torch.empty(N, dtype=torch.float16)
    _cast_kernel[(1,)](x, y, z, w, N)
    assert_bits(y, x.bfloat16(), "fp32 -> bf16")
    assert_bits(z, (torch.arange(N) * 4099 + 2**20).double().bfloat16(), "int32 -> bf16")
    assert torch.equal(w.view(torch.int16)[~x.isnan()], x.bfloat16().half().view(torch.int16)[~x.isnan()])


@triton.jit
def _math_kernel(a, e, s, ab, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(a + o)
    tl.store(e + o, tl.exp(x.to(tl.float32)).to(tl.bfloat16))  # tl.math takes fp32 only
    tl.store(s + o, tl.sqrt(tl.abs(x).to(tl.float32)).to(tl.bfloat16))
    tl.store(ab + o, tl.abs(x))


def test_unary_math():
    """exp and sqrt of bf16 values (through fp32, as tl.math requires) round to the nearest bf16;
    abs clears the sign. The builder's unary ops on bf16 handles (which tl.math does not reach)
    compute on the values too."""
    a = (torch.randn(N) * 3).bfloat16()
    e, s, ab = (torch.empty(N, dtype=torch.bfloat16) for _ in range(3))
    _math_kernel[(1,)](a, e, s, ab, N)
    want_e = torch.exp(a.float()).bfloat16()  # exp is not correctly rounded in fp32: within one bf16 step
    assert ((e.float() - want_e.float()).abs() <= want_e.float().abs() * 2**-7).all(), "exp"
    assert_bits(s, torch.sqrt(a.abs().float()).bfloat16(), "sqrt")
    assert_bits(ab, a.abs(), "abs")

    builder = interpreter.InterpreterBuilder()
    handle = interpreter.TensorHandle(a.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
    for method, op in (("create_exp", torch.exp), ("create_sqrt", torch.sqrt), ("create_fneg", torch.neg),
                       ("create_floor", torch.floor), ("create_rsqrt", torch.rsqrt)):
        got = getattr(builder, method)(handle)
        assert got.dtype == tl.bfloat16 and got.data.dtype == np.uint16, method
        got = torch.from_numpy(got.data.view(np.int16).copy()).view(torch.bfloat16)
        want = op(a.float()).bfloat16()
        close = (got.float() - want.float()).abs() <= want.float().abs() * 2**-7
        assert (close | (got.isnan() & want.isnan())).all(), method


@triton.jit
def _reduce_kernel(x, sums, maxes, mins, argmaxes, cumsums, R: tl.constexpr, C: tl.constexpr):
    o_r, o_c = tl.arange(0, R), tl.arange(0, C)
    b = tl.load(x + o_r[:, None] * C + o_c[None, :])
    tl.store(sums + o_r, tl.sum(b, axis=1))  # in bf16: each add rounded
    tl.store(maxes + o_r, tl.max(b, axis=1))
    tl.store(mins + o_r, tl.min(b, axis=1))
    tl.store(argmaxes + o_r, tl.argmax(b, axis=1))
    tl.store(cumsums + o_r[:, None] * C + o_c[None, :], tl.cumsum(b, axis=1))


def butterfly_sum(x: torch.Tensor) -> torch.Tensor:
    """Rows of x summed in x's dtype, element i added to i + n/2 (torch rounds each add)."""
    while x.shape[1] > 1:
        x = x[:, :x.shape[1] // 2] + x[:, x.shape[1] // 2:]
    return x[:, 0]


@pytest.mark.parametrize("values", ["integers", "random"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_reductions(values, dtype):
    """tl.sum, tl.max, tl.min, tl.argmax and tl.cumsum of bf16 (and fp16) tiles, all-negative rows
    included. Sums of small integers are exact in bf16, so bit for bit; random ones round after
    every add, as the GPU's do (numpy's own fp16 sum adds in fp32): bit for bit a butterfly's,
    and within 2**-p per level of the tree of the exact sum."""
    R, C = 4, 16
    if values == "integers":
        x = torch.randint(-8, 9, (R, C)).float()
    else:
        x = torch.randn(R, C) * torch.exp2(torch.randint(-3, 4, (R, 1)).float())
    x[1] = -x[1].abs() - 0.5  # a row of negatives only
    x = x.to(dtype)
    sums, maxes, mins = (torch.full((R,), float("nan"), dtype=dtype) for _ in range(3))
    argmaxes = torch.full((R,), -1, dtype=torch.int32)
    cumsums = torch.full((R, C), float("nan"), dtype=dtype)
    _reduce_kernel[(1,)](x, sums, maxes, mins, argmaxes, cumsums, R, C)
    same = assert_bits if dtype == torch.bfloat16 else (lambda got, want, what: torch.testing.assert_close(
        got, want, rtol=0, atol=0, equal_nan=True, msg=what))
    same(maxes, x.amax(dim=1), "tl.max")
    same(mins, x.amin(dim=1), "tl.min")
    assert torch.equal(argmaxes, x.float().argmax(dim=1).int()), "tl.argmax"
    exact = x.double().sum(dim=1)
    same(sums, butterfly_sum(x), "tl.sum")
    if values == "integers":
        same(sums, exact.to(dtype), "tl.sum")
        same(cumsums.flatten(), x.double().cumsum(dim=1).to(dtype).flatten(), "tl.cumsum")
    else:
        step = 2**-8 if dtype == torch.bfloat16 else 2**-11
        bound = 4 * step * x.double().abs().sum(dim=1)  # four levels of a tree of 16
        assert ((sums.double() - exact).abs() <= bound).all(), f"tl.sum {sums.tolist()} vs {exact.tolist()}"
        cum_bound = C * step * x.double().abs().cumsum(dim=1)
        assert ((cumsums.double() - x.double().cumsum(dim=1)).abs() <= cum_bound).all(), "tl.cumsum"


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


@triton.jit
def _scale_kernel(x, y, scale, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o) * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_float_arguments_are_fp32(dtype):
    """A half-precision tile times a float kernel argument is an fp32 product, as on the GPU (an
    fp32 scalar there; the interpreter's own Python float is weakly typed: a half product)."""
    x = torch.randn(N).to(dtype)
    y = torch.full((N,), float("nan"))
    scale = 0.1234567
    _scale_kernel[(1,)](x, y, scale, N)
    assert torch.equal(y, x.float() * torch.tensor(scale, dtype=torch.float32))



@triton.jit
def _atomic_add_kernel(x, y, old, N: tl.constexpr, M: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(old + o, tl.atomic_add(y + o % M, tl.load(x + o), mask=o < N - 1), mask=o < N - 1)


@pytest.mark.parametrize("M", [N, 4], ids=["distinct", "repeated"])
def test_atomic_add(M):
    """tl.atomic_add of bf16 values (the interpreter's own refuses bf16): each lane's add rounded,
    lanes on one address one after another, the old values returned. Small integers: exact."""
    x = torch.randint(-8, 9, (N,)).bfloat16()
    y = torch.randint(-8, 9, (M,)).bfloat16()
    start, old = y.clone(), torch.full((N,), float("nan"), dtype=torch.bfloat16)
    _atomic_add_kernel[(1,)](x, y, old, N, M)
    lanes = torch.arange(N - 1)  # the last lane masked off
    want = start.double().index_add(0, lanes % M, x[:N - 1].double())
    assert_bits(y, want.bfloat16(), "the sums")
    if M == N:
        assert_bits(old[:N - 1], start[:N - 1], "the old values")
