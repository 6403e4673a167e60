"""The interpreter's bounds checks (tests/bounds.py, installed by conftest) catch what they must."""

import pytest
import torch
import triton
import triton.language as tl
from bounds import OutOfBounds


@triton.jit
def add_one_kernel(x, n, stored, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    value = tl.load(x + offsets, mask=offsets < n, other=0.0)
    tl.store(x + offsets, value + 1, mask=offsets < stored)


@triton.jit
def gather_kernel(x, out, index, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + tl.load(index + offsets)))


def test_in_bounds_launch_runs():
    x = torch.randn(8)
    add_one_kernel[(1,)](x.clone(), 8, 8, BLOCK=16)


@pytest.mark.parametrize("stored", [9, 16])
def test_store_past_the_end_is_caught(stored):
    x = torch.randn(8)
    with pytest.raises(Exception, match="add_one_kernel: masked_store of .* outside the launch's tensors") as caught:
        add_one_kernel[(1,)](x, 8, stored, BLOCK=16)
    assert isinstance(caught.value.__cause__, OutOfBounds)  # the interpreter wraps what a kernel raises


def test_unmasked_gather_before_the_start_is_caught():
    x, out = torch.randn(8), torch.full((4,), float("nan"))
    index = torch.tensor([0, 3, -1, 2], dtype=torch.int32)
    with pytest.raises(Exception, match="gather_kernel: masked_load of 1 element"):
        gather_kernel[(1,)](x, out, index, BLOCK=4)
