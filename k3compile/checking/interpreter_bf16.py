"""bf16 arithmetic in Triton's interpreter (`k3c verify --device cpu`, the tests), as the GPU does it.

The interpreter (Triton 3.x) holds bf16 tensors as their raw bits in uint16 arrays and computes on
those arrays as they are: a bf16 product, sum, quotient or comparison is one of integers, a max of
negative numbers picks the wrong one, and its fp32 -> bf16 cast truncates instead of rounding. A
kernel with any arithmetic on a bf16 tile computes garbage there while the GPU is right.

`install()` makes every op whose operands are bf16 compute on their values: the bits are widened to
fp32 exactly (bf16 is fp32's upper half), the op runs in fp32 and a bf16 result is rounded back to
nearest even (NaN and inf kept). For +, -, *, /, sqrt and fma that is the correctly rounded bf16
result (fp32 has more than 2 * 8 + 2 significant bits, so rounding twice is rounding once): what
the GPU's native bf16 ops give, and what it gives where it runs them in fp32 and rounds.
Comparisons, min/max, negation, unary math, casts to and from bf16, tl.dot (bf16 operands into an
fp32 accumulator, as tensor cores take them), tl.atomic_add (which the interpreter refused for
bf16) and the reductions and scans (tl.sum, tl.cumsum, tl.cumprod, tl.max / tl.argmax of bf16)
follow. tl.sum and the scans round after every add, as the GPU's bf16 reductions do; a sum adds in
butterfly order (the order of the GPU's lanes), not the GPU's order within a thread, so its bits
may differ from the GPU's where the order changes the rounding. An fp16 tl.sum likewise rounds to
fp16 after every add (numpy's adds in fp32); fp16's other ops numpy rounds per op already, as the
GPU does. Ops that move bits (loads, stores, tl.where, reshapes, bitcasts, abs) were right already.

And a float kernel argument is an fp32 scalar, as on the GPU: the interpreter passed the Python
float, weakly typed, so `bf16 tile * scale` multiplied in bf16 there. Left as they are: tl.dot's
tf32 (fp16 inputs' products here) runs in full fp32, finer than the GPU's tensor cores.
"""

from __future__ import annotations

import numpy as np
from triton import language as tl
from triton.runtime import interpreter
from triton.runtime.interpreter import _ir

_TensorHandle = interpreter.TensorHandle

# the numpy functions the interpreter's binary_op computes float arithmetic, min/max and comparisons
# with; the rest of its binary ops (and, or, xor, shifts) move bits and take none of bf16's
_VALUE_OPS = {np.add, np.subtract, np.multiply, np.divide, np.fmod, np.minimum, np.maximum, np.fmin, np.fmax,
              np.less, np.greater, np.less_equal, np.greater_equal, np.equal, np.not_equal}


def _is_bf16(handle) -> bool:
    """Whether a handle holds bf16 bits (a comparison's bools are not bf16 whatever its dtype says)."""
    return handle.dtype.scalar == tl.bfloat16 and handle.data.dtype == np.uint16


def _values(handle) -> np.ndarray:
    """A bf16 handle's values in fp32 (its bits the upper half of each fp32's); others' data as it is."""
    if not _is_bf16(handle):
        return handle.data
    return (handle.data.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _fp32_rounded_to_odd(x: np.ndarray) -> np.ndarray:
    """float64 values as fp32, rounded to odd (truncated, the last bit set where inexact): rounding
    that to bf16 is rounding the float64 to bf16 once."""
    with np.errstate(over="ignore"):
        narrow = x.astype(np.float32)
    back = narrow.astype(np.float64)
    inexact = np.isfinite(x) & (back != x)
    bits = narrow.view(np.uint32).copy()
    bits[inexact & (np.abs(back) > np.abs(x))] -= np.uint32(1)  # rounded away from zero: one step back
    bits[inexact] |= np.uint32(1)
    return bits.view(np.float32)


def bf16_bits(values) -> np.ndarray:
    """Values (any float or integer dtype) as bf16 bits in uint16, rounded to nearest even once;
    NaN stays NaN (quiet), inf stays inf, what overflows becomes inf."""
    x = np.asarray(values)
    if x.dtype in (np.float32, np.float16):
        x = x.astype(np.float32)  # fp16 is exact in fp32
    else:
        x = _fp32_rounded_to_odd(x.astype(np.float64))
    bits = np.ascontiguousarray(x).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(np.isnan(x), nan, rounded).astype(np.uint16)


def _rounded(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16's, in fp32 (an op's result as bf16 holds it)."""
    return (bf16_bits(values).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _as_fp32(handle) -> _TensorHandle:
    """A bf16 handle as an fp32 one of the same values; others as they are."""
    return _TensorHandle(_values(handle), tl.float32) if _is_bf16(handle) else handle


def _bf16(values) -> _TensorHandle:
    return _TensorHandle(bf16_bits(values), tl.bfloat16)


# --- reductions and scans: rounded after every combine --------------------------------------


def _tree_sum(values: np.ndarray, axis: int, rounded) -> np.ndarray:
    """The sum along `axis`, each add rounded (`rounded`), element i added to i + n/2 (a butterfly)."""
    v = np.moveaxis(values, axis, 0)
    while v.shape[0] > 1:
        half = v.shape[0] // 2
        folded = rounded(v[:half] + v[half:2 * half])
        v = np.concatenate([folded, v[2 * half:]]) if v.shape[0] % 2 else folded
    return v[0]


def _sequential_scan(values: np.ndarray, axis: int, op, rounded) -> np.ndarray:
    """The running `op` along `axis`, each step rounded (`rounded`)."""
    v = np.moveaxis(values, axis, 0)
    out = np.empty_like(v)
    for i in range(v.shape[0]):
        out[i] = v[i] if i == 0 else rounded(op(out[i - 1], v[i]))
    return np.moveaxis(out, 0, axis)


def _install_reductions() -> None:
    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    reduce_sum, min_max = reduce_ops.sum, reduce_ops.min_max
    cumsum, cumprod = scan_ops.cumsum, scan_ops.cumprod

    def sum_by_value(self, input):
        handle = input.handle
        if _is_bf16(handle):
            rounded, packed = _rounded, bf16_bits
        elif handle.data.dtype == np.float16:  # numpy's own fp16 sum adds in fp32
            rounded, packed = (lambda v: v.astype(np.float16).astype(np.float32)), (lambda v: v.astype(np.float16))
        else:
            return reduce_sum(self, input)
        values = _values(handle).astype(np.float32)
        axis = self.axis
        if axis is None:
            values, axis = values.reshape(-1), 0
        total = _tree_sum(values, axis, rounded)
        if self.keep_dims:
            total = np.expand_dims(total, axis) if self.axis is not None else total.reshape([1] * handle.data.ndim)
        return self.to_tensor(packed(total), input.dtype)

    def min_max_by_value(self, input, val_reduce_op, idx_reduce_op=None):
        tensor = input[0] if isinstance(input, tuple) else input
        if not _is_bf16(tensor.handle):
            return min_max(self, input, val_reduce_op, idx_reduce_op)
        values = _values(tensor.handle)
        val = idx = None
        if val_reduce_op:
            val = self.to_tensor(bf16_bits(val_reduce_op(values, axis=self.axis, keepdims=self.keep_dims)),
                                 tensor.dtype)
        if idx_reduce_op:
            idx = self.to_tensor(idx_reduce_op(values, axis=self.axis, keepdims=self.keep_dims), tl.int32)
        if val is not None and idx is not None:
            return val, idx
        return val if val is not None else idx

    def scan_by_value(original, op):
        def scan(self, input):
            if not _is_bf16(input.handle):
                return original(self, input)
            running = _sequential_scan(_values(input.handle), self.axis, op, _rounded)
            return [self.to_tensor(bf16_bits(running), input.dtype)]

        return scan

    reduce_ops.sum = sum_by_value
    reduce_ops.min_max = min_max_by_value
    scan_ops.cumsum = scan_by_value(cumsum, np.add)
    scan_ops.cumprod = scan_by_value(cumprod, np.multiply)


# --- the builder's elementwise ops, casts and products -----------------------------------------


def _install_builder() -> None:
    builder = interpreter.InterpreterBuilder
    binary_op, unary_op, cast_impl = builder.binary_op, builder.unary_op, builder.cast_impl
    create_fma, create_clampf, create_dot = builder.create_fma, builder.create_clampf, builder.create_dot
    create_erf, create_rsqrt = builder.create_erf, builder.create_rsqrt
    create_atomic_rmw = builder.create_atomic_rmw

    def binary_op_by_value(self, lhs, rhs, op):
        if op not in _VALUE_OPS or not (_is_bf16(lhs) or _is_bf16(rhs)):
            return binary_op(self, lhs, rhs, op)
        with np.errstate(all="ignore"):  # overflow to inf and NaN, as on the GPU
            out = op(_values(lhs), _values(rhs))
        if out.dtype == np.bool_:
            return _TensorHandle(out, tl.int1)
        return _bf16(out) if _is_bf16(lhs) else _TensorHandle(out.astype(lhs.data.dtype), lhs.dtype.scalar)

    def unary_op_by_value(self, arg, op):
        if not _is_bf16(arg):
            return unary_op(self, arg, op)
        with np.errstate(all="ignore"):
            return _bf16(op(_values(arg)))

    def cast_by_value(self, src, dst_type):
        dst = dst_type.scalar
        if dst == tl.bfloat16:
            return _bf16(_values(src))
        if _is_bf16(src):
            return cast_impl(self, _as_fp32(src), dst_type)
        return cast_impl(self, src, dst_type)

    def fma_by_value(self, x, y, z):
        if not _is_bf16(z):
            return create_fma(self, x, y, z)
        return _bf16(create_fma(self, _as_fp32(x), _as_fp32(y), _as_fp32(z)).data)

    def clampf_by_value(self, arg, lo, hi, propagate_nans):
        if not _is_bf16(arg):
            return create_clampf(self, arg, lo, hi, propagate_nans)
        return _bf16(create_clampf(self, _as_fp32(arg), _as_fp32(lo), _as_fp32(hi), propagate_nans).data)

    def by_value(original):
        def op(self, arg):
            return _bf16(original(self, _as_fp32(arg)).data) if _is_bf16(arg) else original(self, arg)

        return op

    def atomic_add_by_value(self, rmwOp, ptr, val, mask, sem, scope):
        if rmwOp != _ir.ATOMIC_OP.FADD or not _is_bf16(val):
            return create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope)
        # the interpreter's own refuses bf16; one element at a time (the same address may recur),
        # each add rounded, as the GPU's atomics serialise them
        ptrs, values = np.broadcast_arrays(ptr.data, _values(val))
        masks = np.broadcast_to(mask.data, ptrs.shape)
        old = np.zeros(ptrs.shape, dtype=np.uint16)
        on = _TensorHandle(np.ones(1, dtype=bool), tl.int1)
        for index in zip(*np.nonzero(masks)):
            at = _TensorHandle(ptrs[index].reshape(1), ptr.dtype)
            before = self.create_masked_load(at, on, None, None, True)
            old[index] = before.data[0]
            self.create_masked_store(at, _bf16(_values(before) + values[index]), on, None)
        return _TensorHandle(old, tl.bfloat16)

    def dot_by_value(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = create_dot(self, _as_fp32(a), _as_fp32(b), _as_fp32(d), input_precision, max_num_imprecise_acc)
        return _bf16(out.data) if _is_bf16(d) else out

    builder.binary_op = binary_op_by_value
    builder.unary_op = unary_op_by_value
    builder.cast_impl = cast_by_value
    builder.create_fma = fma_by_value
    builder.create_clampf = clampf_by_value
    builder.create_erf = by_value(create_erf)
    builder.create_rsqrt = by_value(create_rsqrt)
    builder.create_dot = dot_by_value
    builder.create_atomic_rmw = atomic_add_by_value


def _install_float_arguments() -> None:
    """A kernel's float argument (not constexpr) as an fp32 scalar, as the GPU compiles it: the
    interpreter passes the Python float, a weakly typed constant, so `tile * scale` of a bf16 or
    fp16 tile was a bf16 or fp16 product there and an fp32 one on the GPU."""
    implicit_cvt = interpreter._implicit_cvt

    def implicit_cvt_floats(arg):
        if isinstance(arg, float):
            return tl.tensor(_TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return implicit_cvt(arg)

    interpreter._implicit_cvt = implicit_cvt_floats


def install() -> None:
    """Patch the interpreter (idempotent) to compute on bf16 values, not their bits, and to type
    float arguments as the GPU does."""
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_k3c_bf16_by_value", False):
        return
    _install_builder()
    _install_reductions()
    _install_float_arguments()
    builder._k3c_bf16_by_value = True
