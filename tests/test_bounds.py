"""The interpreter's bounds checks (k3compile/checking/interpreter_bounds.py, installed by conftest and by
`k3c verify --device cpu`) catch what they must."""

from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from k3compile.checking.interpreter_bounds import OutOfBounds, raised_by


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
    with pytest.raises(Exception, match="add_one_kernel: masked_store of .* outside the launch's tensors, the first .* past the end") as caught:
        add_one_kernel[(1,)](x, 8, stored, BLOCK=16)
    assert isinstance(raised_by(caught.value), OutOfBounds)  # the interpreter wraps what a kernel raises


def test_store_past_a_view_into_its_neighbour_is_caught():
    """A view's own elements bound it, not its storage: a slot of a pool is not the next slot."""
    pool = torch.randn(3, 8)
    add_one_kernel[(1,)](pool[1], 8, 8, BLOCK=16)  # in bounds
    with pytest.raises(Exception, match="add_one_kernel: masked_store of 1 element"):
        add_one_kernel[(1,)](pool[1], 8, 9, BLOCK=16)


def test_unmasked_gather_before_the_start_is_caught():
    x, out = torch.randn(8), torch.full((4,), float("nan"))
    index = torch.tensor([0, 3, -1, 2], dtype=torch.int32)
    with pytest.raises(Exception, match="gather_kernel: masked_load of 1 element.* before the start of the nearest tensor"):
        gather_kernel[(1,)](x, out, index, BLOCK=4)


def test_verify_fails_the_case_whose_kernel_leaves_its_tensors(monkeypatch, tmp_path):
    """k3c verify on the CPU turns an access outside a launch's tensors into a failed case (the
    rest of the grid still runs), whatever the numbers would have said."""
    import dataclasses

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    family = verify_module.FAMILIES["gla"]
    calls = []

    def leaking_case(layer, entry, layer_op, case, dtype, device, gen):
        calls.append(case.name)
        if len(calls) == 1:  # the first case's kernel stores one element past its tensor
            add_one_kernel[(1,)](torch.randn(8), 8, 9, BLOCK=16)
        ref = torch.randn(4, dtype=torch.float64)
        return [("o", ref.clone(), ref)]

    monkeypatch.setitem(verify_module.FAMILIES, "gla", dataclasses.replace(family, run=leaking_case))
    spec = load_spec(Path(__file__).resolve().parent.parent / "examples" / "gla.toml")
    results = verify_module.verify(spec, device="cpu", quick=True, out_dir=tmp_path)
    assert len(calls) > 1 and len(results) == len(calls)
    first, *rest = results
    assert not first.passed and first.tensor.startswith("out of bounds: add_one_kernel: masked_store of 1 element")
    assert all(r.passed for r in rest)
