"""bf16 matrix products in Triton's interpreter (`k3c verify --device cpu`, the tests).

The interpreter (Triton 3.x) holds bf16 tensors as their raw bits in uint16 arrays, and its
tl.dot multiplies those arrays as they are: a bf16 product comes out as a product of integers, a
silent wrong answer (fp8 operands it converts first; bf16 it does not). `install()` converts bf16
operands to fp32 before the product, as a GPU's tensor cores take them: exactly (bf16 is fp32's
upper half), with the fp32 accumulation the kernels ask for.
"""

from __future__ import annotations

import numpy as np
from triton import language as tl
from triton.runtime import interpreter


def _as_fp32(handle) -> interpreter.TensorHandle:
    """A bf16 handle's values in fp32 (its bits the upper half of each fp32's); others as they are."""
    if handle.dtype.scalar != tl.bfloat16:
        return handle
    bits = handle.data.astype(np.uint32) << np.uint32(16)
    return interpreter.TensorHandle(bits.view(np.float32), tl.float32)


def install() -> None:
    """Patch the interpreter's tl.dot (idempotent) to multiply bf16 operands by their values."""
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_k3c_bf16_dots", False):
        return
    create_dot = builder.create_dot

    def create_dot_by_value(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, _as_fp32(a), _as_fp32(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot_by_value
    builder._k3c_bf16_dots = True
