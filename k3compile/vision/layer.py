"""The vision encoder layer in torch: k3.vision's semantics (ir/k3.py: VisionOp; reference:
k3compile.ir.vision) with attention on torch's kernels, on one device or context-parallel
(gather-KV over the sub-groups of a plan: k3compile.vision.gather_kv)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from k3compile.spec import load_spec
from k3compile.vision.attention import BACKENDS
from k3compile.vision.gather_kv import Segment, segment_attention, whole_images


def rope_2d_angles(segments, head_dim: int, theta: float, device) -> torch.Tensor:
    """[N, head_dim // 2] angles of the packed patches of `segments`: pair 2i by the patch's column,
    pair 2i + 1 by its row, times theta ** (-4 i / head_dim) (MoonViT's Rope2DPosEmb)."""
    index = torch.cat([torch.arange(s.start, s.stop, device=device) for s in segments])
    width = torch.cat([torch.full((s.rows,), s.grid[2], device=device) for s in segments])
    height = torch.cat([torch.full((s.rows,), s.grid[1], device=device) for s in segments])
    within = index % (width * height)
    rows, cols = (within // width).double(), (within % width).double()
    freqs = theta ** (-4.0 * torch.arange(head_dim // 4, device=device, dtype=torch.float64) / head_dim)
    return torch.stack((cols[:, None] * freqs, rows[:, None] * freqs), dim=-1).flatten(1)


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [N, H, D] with pair (2j, 2j+1) rotated by angles[:, j], computed in fp32 (or x's wider dtype)."""
    wide = torch.promote_types(x.dtype, torch.float32)
    a, b = x.to(wide).unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = torch.cos(angles).to(wide)[:, None], torch.sin(angles).to(wide)[:, None]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)


def check_segments(segments, grids) -> list[Segment]:
    if (segments is None) == (grids is None):
        raise ValueError("grids / segments: give exactly one (grids: whole images on this device; segments: this "
                         "rank's pieces of a context-parallel plan)")
    if grids is not None:
        grids = [tuple(g) for g in grids]
        if not grids or any(len(g) != 3 or min(g) <= 0 for g in grids):
            raise ValueError(f"grids: expected (frames, height, width) of positive integers per image, got {grids}")
        return whole_images(grids)
    segments = list(segments)
    if not segments or not all(isinstance(s, Segment) and 0 <= s.start < s.stop <= math.prod(s.grid)
                               for s in segments):
        raise ValueError(f"segments: expected Segments with 0 <= start < stop <= the image's patches, got {segments}")
    return segments


class VisionLayer(nn.Module):
    """One pre-norm ViT layer over packed images: x + attn(LN(x)), then + MLP(LN(.)) (gelu-tanh),
    biases on every projection. forward(x [N, hidden_size], grids=[(frames, height, width), ...])
    on one device, or forward(x, segments=...) for a rank's part of a context-parallel plan."""

    def __init__(self, hidden_size: int = 1152, num_heads: int = 16, head_dim: int = 72, mlp_dim: int = 4304,
                 position: str = "rope_2d", rope_theta: float = 10000.0, eps: float = 1e-5, device=None,
                 dtype=None) -> None:
        super().__init__()
        if position not in ("rope_2d", "none"):
            raise ValueError(f"position: expected rope_2d or none, got {position!r}")
        if position == "rope_2d" and head_dim % 4:
            raise ValueError(f"head_dim: rope_2d needs a multiple of 4, got {head_dim}")
        self.num_heads, self.head_dim, self.position, self.rope_theta = num_heads, head_dim, position, rope_theta
        inner, kw = num_heads * head_dim, {"device": device, "dtype": dtype}
        self.norm0 = nn.LayerNorm(hidden_size, eps=eps, **kw)
        self.qkv = nn.Linear(hidden_size, 3 * inner, **kw)
        self.proj = nn.Linear(inner, hidden_size, **kw)
        self.norm1 = nn.LayerNorm(hidden_size, eps=eps, **kw)
        self.fc1 = nn.Linear(hidden_size, mlp_dim, **kw)
        self.fc2 = nn.Linear(mlp_dim, hidden_size, **kw)

    @classmethod
    def from_spec(cls, spec, device=None, dtype=None) -> VisionLayer:
        """From a vision LayerSpec (or its .toml path); dtype defaults to the spec's."""
        spec = spec if hasattr(spec, "params") else load_spec(spec)
        if spec.kind != "vision":
            raise ValueError(f"spec: expected kind 'vision', got {spec.kind!r}")
        p = spec.params
        return cls(p["hidden_size"], p["num_heads"], p["head_dim"], p["mlp_dim"], p["position"], p["rope_theta"],
                   p["eps"], device=device, dtype=dtype or getattr(torch, p["dtype"]))

    def forward(self, x: torch.Tensor, grids=None, segments=None, backend: str = "sdpa") -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.norm0.normalized_shape[0]:
            raise ValueError(f"x: expected a tensor [N, {self.norm0.normalized_shape[0]}], got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype != self.qkv.weight.dtype or x.device != self.qkv.weight.device:
            raise ValueError(f"x: expected {self.qkv.weight.dtype} on {self.qkv.weight.device} (the layer's), got "
                             f"{x.dtype} on {x.device}")
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
        segments = check_segments(segments, grids)
        if sum(s.rows for s in segments) != x.shape[0]:
            raise ValueError(f"x: expected {sum(s.rows for s in segments)} rows (the patches of grids / segments), "
                             f"got {x.shape[0]}")
        q, k, v = self.qkv(self.norm0(x)).unflatten(-1, (3, self.num_heads, self.head_dim)).unbind(1)
        if self.position == "rope_2d":
            angles = rope_2d_angles(segments, self.head_dim, self.rope_theta, x.device)
            q, k = rotate_pairs(q, angles), rotate_pairs(k, angles)
        attended = segment_attention(q, k, v, segments, backend)
        x = x + self.proj(attended.flatten(1))
        return x + self.fc2(F.gelu(self.fc1(self.norm1(x)), approximate="tanh"))
