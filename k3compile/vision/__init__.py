"""The vision encoder (docs/vision.md): the layer in torch (VisionLayer), packed-image attention
on torch's kernels, gather-KV attention for images split over ranks, and the planners
(context-parallel: k3compile.passes.plan_vision_cp; pipeline bubbles: k3compile.vision.bubbles,
whose schedules k3compile.vision.runner executes)."""

from k3compile.vision.attention import BACKENDS, packed_attention
from k3compile.vision.gather_kv import Segment, gather_kv_attention, segment_attention, segments_of, subgroups
from k3compile.vision.layer import VisionLayer

__all__ = ["BACKENDS", "Segment", "VisionLayer", "gather_kv_attention", "packed_attention", "segment_attention",
           "segments_of", "subgroups"]
