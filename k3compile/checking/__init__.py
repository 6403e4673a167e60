"""Checking: what makes a compiled layer trustworthy, beside the compiler that builds it.

- verify.py (+ verify_common, verify_attnres, verify_backward, verify_moe): `k3c verify`, the generated kernels
  against ir/reference.py's float64 semantics on random inputs (GPU or Triton's interpreter);
- prove.py with exact.py, exact_backward.py: `k3c prove`, the derived schedules against the token
  recurrence in exact arithmetic (one sympy function per stage op);
- interpreter_bf16.py, interpreter_bounds.py: Triton's interpreter made to round bf16 as the GPU
  does and to check every address, so that a CPU run of the kernels checks them.
"""
