"""The vision encoder (docs/vision.md): the layer in torch (VisionLayer), packed-image attention
on torch's kernels, gather-KV attention for images split over ranks, and the planners
(context-parallel: k3compile.passes.plan_vision_cp; pipeline bubbles: k3compile.vision.bubbles,
whose schedules k3compile.vision.runner executes)."""

import importlib

# name -> the submodule defining it, imported on first use (PEP 562): the CLI's `k3c plan-vision`
# imports k3compile.vision.plan_cli, and every `k3c` call would otherwise import torch (1.7 s)
_DEFINED_IN = {"BACKENDS": "attention", "packed_attention": "attention", "Segment": "gather_kv",
               "gather_kv_attention": "gather_kv", "segment_attention": "gather_kv", "segments_of": "gather_kv",
               "subgroups": "gather_kv", "VisionLayer": "layer"}

__all__ = sorted(_DEFINED_IN)


def __getattr__(name: str):
    if name not in _DEFINED_IN:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}"), name)
