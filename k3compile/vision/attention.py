"""Bidirectional attention over images packed in one sequence (a block-diagonal mask), on torch's
kernels. q, k, v are [N, H, D] (N patches of the packed images, H heads), lengths the images'
patch counts in order; the result is [N, H, D].

Backends (bench/vision_attention_gpu.py measures them):
- sdpa: F.scaled_dot_product_attention per image (flash / memory-efficient kernels on a GPU, no
  mask: each call is one image); a Python loop of one launch per image.
- flex: flex_attention with a block mask from the images' ids (one call; blocks of 128 that
  straddle two images are partial). Forward only on the CPU (torch has no CPU flex backward).
- varlen: torch.nn.attention.varlen.varlen_attn (flash attention over cu_seqlens, one call; CUDA).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

BACKENDS = ("sdpa", "flex", "varlen")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths) -> list[int]:
    """The lengths as ints; one-line errors for a bad call."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor [N, H, D], got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name}: expected [N, H, D] (3 dims), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if k.shape != q.shape or v.shape[:2] != q.shape[:2] or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k, v: expected k of q's shape {tuple(q.shape)} and v [N, H, *], all of dtype {q.dtype}, "
                         f"got k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    lengths = [int(n) for n in lengths]
    if any(n <= 0 for n in lengths) or sum(lengths) != q.shape[0]:
        raise ValueError(f"lengths: expected positive patch counts summing to q's {q.shape[0]} rows, got {lengths}")
    return lengths


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths, backend: str = "sdpa",
                     scale: float | None = None) -> torch.Tensor:
    """Attention within each image of the packed sequence (module docstring)."""
    lengths = check_qkv(q, k, v, lengths)
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    return {"sdpa": sdpa_per_image, "flex": flex_block_mask, "varlen": varlen}[backend](q, k, v, lengths, scale)


def sdpa_per_image(q, k, v, lengths, scale=None) -> torch.Tensor:
    outs, start = [], 0
    for n in lengths:
        rows = slice(start, start + n)
        outs.append(F.scaled_dot_product_attention(q[rows].transpose(0, 1), k[rows].transpose(0, 1),
                                                   v[rows].transpose(0, 1), scale=scale).transpose(0, 1))
        start += n
    return torch.cat(outs)


@functools.cache
def _compiled_flex():
    # torch's attention backends: only the one a call picks is loaded
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def image_block_mask(lengths, device):
    # torch's attention backends: only the one a call picks is loaded
    from torch.nn.attention.flex_attention import create_block_mask

    image = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                    torch.tensor(lengths, device=device))

    def same_image(b, h, q_idx, kv_idx):
        return image[q_idx] == image[kv_idx]

    total = sum(lengths)
    # compiled on a GPU: the mask is evaluated block by block, never as a total x total tensor
    return create_block_mask(same_image, None, None, total, total, device=device,
                             _compile=torch.device(device).type == "cuda")


def flex_block_mask(q, k, v, lengths, scale=None, block_mask=None) -> torch.Tensor:
    """flex_attention (compiled on a GPU, eager on the CPU) with the images' block mask."""
    # torch's attention backends: only the one a call picks is loaded
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = image_block_mask(lengths, q.device) if block_mask is None else block_mask
    run = _compiled_flex() if q.is_cuda else flex_attention
    out = run(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], block_mask=block_mask,
              scale=scale)
    return out[0].transpose(0, 1)


def varlen(q, k, v, lengths, scale=None) -> torch.Tensor:
    # torch's attention backends: only the one a call picks is loaded
    from torch.nn.attention.varlen import varlen_attn

    cu = torch.tensor([0] + lengths, device=q.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths), scale=scale)
