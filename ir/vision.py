"""Float64 reference semantics of `k3.vision` (ir/k3.py: VisionOp), sharing no code with
k3compile.vision: the mask is materialised, LayerNorm, GELU and the rotations are written out.

Images are packed one after another, each frame by frame and row by row; an image's grid is
(frames, height, width). Weights are named as k3compile.vision.VisionLayer's state_dict names them
(norm0, qkv, proj, norm1, fc1, fc2; `.weight` [out, in] and `.bias`)."""

from __future__ import annotations

import math

import torch


def _int(op, name: str) -> int:
    return getattr(op, name).value.data


def grid_positions(grids) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every packed patch, float64."""
    rows, cols = [], []
    for frames, height, width in grids:
        for _ in range(frames):
            for r in range(height):
                rows += [r] * width
                cols += list(range(width))
    return torch.tensor(rows, dtype=torch.float64), torch.tensor(cols, dtype=torch.float64)


def rope_2d(op, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] with the pairs (2j, 2j+1) rotated by angle cols * theta_i (j = 2i) or rows * theta_i
    (j = 2i + 1), theta_i = rope_theta ** (-4 i / D)."""
    dim = x.shape[-1]
    theta = op.rope_theta.value.data
    out = x.clone()
    for j in range(dim // 2):
        i = j // 2
        angle = (cols if j % 2 == 0 else rows) * theta ** (-4.0 * i / dim)
        c, s = torch.cos(angle)[:, None], torch.sin(angle)[:, None]
        a, b = x[:, :, 2 * j], x[:, :, 2 * j + 1]
        out[:, :, 2 * j], out[:, :, 2 * j + 1] = a * c - b * s, a * s + b * c
    return out


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths, scale: float) -> torch.Tensor:
    """softmax(scale q k^T + mask) v per head, q, k, v [N, H, D]; the mask is 0 within an image and
    -inf between two (block-diagonal over `lengths`)."""
    image = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths), dtype=torch.long))
    mask = torch.where(image[:, None] == image[None, :], 0.0, -math.inf).to(torch.float64)
    scores = torch.einsum("nhd,mhd->hnm", q.double(), k.double()) * scale + mask
    weights = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.einsum("hnm,mhd->nhd", weights, v.double())


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def vision_layer(op, x: torch.Tensor, weights: dict, grids) -> torch.Tensor:
    """The layer on packed patches x [N, hidden_size] of images with these grids, float64."""
    w = {name: t.double() for name, t in weights.items()}
    heads, dim, eps = _int(op, "num_heads"), _int(op, "head_dim"), op.eps.value.data
    x = x.double()
    h = _layer_norm(x, w["norm0.weight"], w["norm0.bias"], eps)
    q, k, v = (h @ w["qkv.weight"].T + w["qkv.bias"]).reshape(len(x), 3, heads, dim).unbind(1)
    if op.position.data == "rope_2d":
        rows, cols = grid_positions(grids)
        q, k = rope_2d(op, q, rows, cols), rope_2d(op, k, rows, cols)
    lengths = [f * hh * ww for f, hh, ww in grids]
    attended = packed_attention(q, k, v, lengths, dim ** -0.5).reshape(len(x), heads * dim)
    x = x + attended @ w["proj.weight"].T + w["proj.bias"]
    h = _layer_norm(x, w["norm1.weight"], w["norm1.bias"], eps)
    return x + _gelu_tanh(h @ w["fc1.weight"].T + w["fc1.bias"]) @ w["fc2.weight"].T + w["fc2.bias"]
