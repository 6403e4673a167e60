"""Bounds checking for kernels run in Triton's interpreter (`k3c verify --device cpu`, the tests).

On the GPU a load or store past a buffer is an illegal memory access at best and a silent wrong
answer at worst; the interpreter reads and writes host memory through raw addresses and checks
nothing. `install()` makes every masked-in address of a load, store or atomic lie inside one of
the tensors the kernel was launched with (each view's own elements), before the access, and raises
`OutOfBounds` naming the kernel, the operation and how far past the nearest tensor the address
is otherwise. Triton re-raises it as an InterpreterError whose __cause__ it is (`raised_by`).
"""

from __future__ import annotations

import numpy as np
from triton.runtime import interpreter

from k3compile.errors import VerificationError


class OutOfBounds(VerificationError):
    """A kernel run in the interpreter addressed memory outside its launch's tensors."""


def raised_by(error: BaseException) -> OutOfBounds | None:
    """The OutOfBounds that `error` (as Triton's interpreter re-raises it) came from, if any."""
    while error is not None and not isinstance(error, OutOfBounds):
        error = error.__cause__
    return error


class _Launch:
    """The memory of the running launch: sorted, disjoint [start, end) byte ranges, the kernel's name."""

    kernel = "?"
    starts = np.zeros(0, dtype=np.uint64)
    ends = np.zeros(0, dtype=np.uint64)


def _extents(args) -> list[tuple[int, int]]:
    """The bytes each tensor argument spans: from its first element to one past its last (a view's
    own elements, not the rest of its storage; an empty tensor spans none)."""
    found = []
    for arg in args:
        if isinstance(arg, (tuple, list)):
            found += _extents(arg)
        elif hasattr(arg, "untyped_storage") and arg.numel():
            last = sum((size - 1) * stride for size, stride in zip(arg.shape, arg.stride()))
            found.append((arg.data_ptr(), arg.data_ptr() + (last + 1) * arg.element_size()))
    return found


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of byte ranges as sorted disjoint ones (views may overlap)."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def _check(op: str, ptrs, mask) -> None:
    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    if mask is not None:
        addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)]
    if addresses.size == 0:
        return
    width = np.uint64(interpreter._get_np_dtype(ptrs.get_element_ty()).itemsize)
    slot = np.searchsorted(_Launch.starts, addresses, side="right").astype(np.int64) - 1
    inside = slot >= 0
    inside[inside] = addresses[inside] + width <= _Launch.ends[slot[inside]]
    if inside.all():
        return
    raise OutOfBounds(f"{_Launch.kernel}: {op} of {int((~inside).sum())} element(s) outside the launch's tensors, "
                      f"the first {_nearest(int(addresses[~inside][0]), int(width))}")


def _nearest(address: int, width: int) -> str:
    """Where an address outside the launch's tensors lies, against the nearest of them."""
    if not _Launch.starts.size:
        return "with no tensor arguments"
    gaps = [(start - address, "before the start") if address < start else (address + width - end, "past the end")
            for start, end in zip(_Launch.starts.tolist(), _Launch.ends.tolist())]
    gap, side = min(gaps)
    return f"{gap} bytes {side} of the nearest tensor"


def install() -> None:
    """Patch the interpreter (idempotent) so that every launch checks its addresses."""
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    if getattr(executor, "_k3c_bounds", False):
        return
    init_args = executor._init_args_hst

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        ranges = _merged(_extents([*args_hst, *kwargs_hst.values()]))
        _Launch.kernel = getattr(self.fn, "__name__", "?")
        _Launch.starts = np.array([r[0] for r in ranges], dtype=np.uint64)
        _Launch.ends = np.array([r[1] for r in ranges], dtype=np.uint64)
        return args_hst, kwargs_hst

    def checked(name: str, ptr_at: int, mask_at: int | None):
        original = getattr(builder, name)

        def method(self, *args):
            _check(name.removeprefix("create_"), args[ptr_at], args[mask_at] if mask_at is not None else None)
            return original(self, *args)

        return method

    executor._init_args_hst = init_args_checked
    for name, ptr_at, mask_at in (("create_masked_load", 0, 1), ("create_masked_store", 0, 2),
                                  ("create_atomic_rmw", 1, 3), ("create_atomic_cas", 0, None)):
        setattr(builder, name, checked(name, ptr_at, mask_at))
    executor._k3c_bounds = True
