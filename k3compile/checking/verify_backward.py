"""Gradient verification of a recurrence's `chunk_backward` (derive-backward, lower-backward):
every gradient it returns against float64 torch autograd of `k3compile.ir.reference.recurrence`,
for the loss L = <do, o> + <dht, final_state> with random cotangents do and dht.

The measure is fla's, the RMS ratio rms(ours - ref) / rms(ref) of each gradient, with fla's
tolerances for its backward tests in half precision. `k3c verify` runs these cases as its
`chunk_backward` rows (k3compile/checking/verify.py draws the inputs and picks the cases); the tests use
the oracle and the named gradients directly.
"""

from __future__ import annotations

import torch

from k3compile.ir import reference

# the inputs chunk_backward differentiates, in the order it returns their gradients (then dh0)
DIFFERENTIABLE = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")

# RMS-ratio tolerances per gradient. fp32: the chunk forward's 1e-4 (the same sums
# reassociated and a triangular solve; the interpreter gets ~1e-7). bf16 and fp16: fla's for
# its backward tests: the gate's gradients sum a cotangent over many tokens and channels, and
# dh0 is a sum over the whole sequence of one rounding each.
GRADIENT_FP32_TOLERANCE = 1e-4
GRADIENT_HALF_TOLERANCE = {"dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dg": 2e-2, "dbeta": 2e-2, "dA_log": 2e-2,
                           "ddt_bias": 2e-2, "dh0": 5e-3}


def gradient_tolerance(gradient: str, dtype: torch.dtype) -> float:
    """The RMS ratio allowed for `gradient` ("dk", "dh0", ...) with inputs of `dtype`."""
    return GRADIENT_FP32_TOLERANCE if dtype == torch.float32 else GRADIENT_HALF_TOLERANCE[gradient]


def state_shape(op, sequences: int) -> tuple[int, ...]:
    """The shape of a state (and of dht, dh0) of `sequences` sequences, in the op's layout."""
    HV, K, V = op.num_v_heads.value.data, op.head_k_dim.value.data, op.head_v_dim.value.data
    return (sequences, HV, K, V) if op.state_layout.data == "kv" else (sequences, HV, V, K)


def draw_cotangents(op, inputs: dict, with_dht: bool, gen: torch.Generator | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random do (o's layout, in q's dtype and device) and dht (fp32, or None), from `gen` (or
    torch's default generator)."""
    B, T = inputs["q"].shape[:2]
    cu_seqlens = inputs.get("cu_seqlens")
    sequences = B if cu_seqlens is None else len(cu_seqlens) - 1
    device = inputs["q"].device
    do = torch.randn(B, T, op.num_v_heads.value.data, op.head_v_dim.value.data, generator=gen, dtype=torch.float64)
    dht = torch.randn(*state_shape(op, sequences), generator=gen, dtype=torch.float64) if with_dht else None
    return do.to(device, inputs["q"].dtype), None if dht is None else dht.to(device, torch.float32)


def reference_gradients(op, inputs: dict, do: torch.Tensor, dht: torch.Tensor | None) -> dict:
    """d<do, o> + <dht, final_state> by float64 autograd of the token recurrence, on the inputs
    as given (already rounded to the kernels' dtype): each differentiable input's gradient by name,
    and "h0" (None without an initial state). Returned on the CPU, as the reference's outputs."""
    leaves = {n: inputs[n].double().requires_grad_() for n in DIFFERENTIABLE if inputs.get(n) is not None}
    h0 = inputs.get("initial_state")
    h0 = None if h0 is None else h0.double().requires_grad_()
    o, final = reference.recurrence(op, **{**inputs, **leaves, "initial_state": h0}, output_final_state=True)
    loss = (o * do.to(o.device, torch.float64)).sum()
    if dht is not None:
        loss = loss + (final * dht.to(final.device, torch.float64)).sum()
    loss.backward()
    return {**{n: t.grad for n, t in leaves.items()}, "h0": None if h0 is None else h0.grad}


def chunk_backward_gradients(module, inputs: dict, do: torch.Tensor, dht: torch.Tensor | None,
                             output_dh0: bool) -> dict:
    """A compiled module's chunk_backward on `inputs`: each differentiable input's gradient by
    name, and "h0" (None unless output_dh0). ValueError if it returns another number of values."""
    out = module.chunk_backward(**inputs, do=do, dht=dht, output_dh0=output_dh0)
    names = [n for n in DIFFERENTIABLE if inputs.get(n) is not None]
    if len(out) != len(names) + 1:
        raise ValueError(f"chunk_backward returned {len(out)} values for the gradients of {names} and dh0")
    return {**dict(zip(names, out[:-1])), "h0": out[-1]}


def gradient_rows(module, op, inputs: dict, with_dht: bool, gen: torch.Generator) -> list[tuple]:
    """(gradient name, chunk_backward's, the reference's) for every gradient of one case: dh0 is
    asked for where the case has an initial state. A gradient the entry does not return (None)
    is compared as missing and fails."""
    do, dht = draw_cotangents(op, inputs, with_dht, gen)
    output_dh0 = inputs.get("initial_state") is not None
    got = chunk_backward_gradients(module, inputs, do, dht, output_dh0)
    want = reference_gradients(op, inputs, do, dht)
    names = [n for n in want if n != "h0" or output_dh0]
    return [(f"d{n}", got[n] if got[n] is not None else torch.full_like(want[n], torch.nan), want[n])
            for n in names]
