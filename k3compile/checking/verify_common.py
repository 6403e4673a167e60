"""What the layer families' verifications share (verify.py, verify_attnres.py): a forward
entry's RMS-ratio tolerance, and the spec variants their cases run on."""

from __future__ import annotations

import dataclasses

import torch

from k3compile.spec import LayerSpec

# RMS-ratio tolerances per input dtype. bf16: fla's 5e-3. fp32: the kernels use fp32
# arithmetic throughout (fp32 dots are exact-precision, not tf32), so only rounding of the sums
# remains; the chunked form reassociates them and inverts a triangular system, hence 1e-4.
RMS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 5e-3}
CHUNK_FP32_TOLERANCE = 1e-4


CHUNKED_ENTRIES = ("chunk", "segment_summary")  # reassociated sums and a triangular solve


def tolerance(entry: str, dtype) -> float:
    return CHUNK_FP32_TOLERANCE if entry in CHUNKED_ENTRIES and dtype == torch.float32 else RMS_TOLERANCE[dtype]


def variant(spec: LayerSpec, suffix: str, **changes) -> LayerSpec:
    params = {**spec.params, **changes}
    return dataclasses.replace(spec, name=f"{spec.name}_{suffix}", params=params)


def not_power_of_two(dim: int) -> int:
    """A nearby size that is not a power of two (exercises the masks)."""
    return max(3, dim - dim // 4 - 1)
