"""Module passes over the k3/k3s IR, registered by name and imported lazily.

Each pass is one idea, named for what it derives:
- lower-recurrent: k3.recurrence -> a token-by-token schedule with the state on chip;
- lower-decode: the same token stages over a slot-indexed state pool, updated in place;
- fuse-attnres: k3.attnres -> one kernel that scores and mixes each row in a single read;
- derive-attnres-backward: k3.attnres -> the aggregate's fused backward (the softmax recomputed
  from the forward's saved log-sum-exp; d sources, d query, d gain in one kernel);
- derive-block-attnres: k3.attnres -> Block AttnRes's two phases, split from the aggregate's loop
  over sources: `block_partials` (a block's queries over its completed representatives, each
  representative row read once, the online softmax's partials stored) and `block_merge` (one
  query's partials taken one source further, over the block's partial sum);
- lower-moe-routing: k3.latent_moe -> a `route` entry from x to each token's top-k experts and
  their weights: a scores kernel (router GEMM and sigmoid, tiled over rows and experts), then a
  top-k kernel (top-k by score + bias, normalisation);
- lower-moe-experts: k3.latent_moe -> `moe_prefill` (expert-centric: pairs grouped by expert on
  the device, grouped GEMMs), `moe_decode` (token-centric: no sorting, slots combined in
  registers; the other decode plan's entry where the dispatch table runs it) and `moe` (picks by
  token count through its dispatch table, passes/moe_dispatch.py): routing, latent projections
  with the fused RMSNorm, GLU experts, shared experts;
- derive-moe-backward: k3.latent_moe -> `moe_forward` (the expert-centric forward returning what
  its backward reads) and `moe_backward`, derived from it by one adjoint rule per stage (dgrad and
  wgrad GEMMs over the expert-sorted pair list, the GLU's adjoint in the dgrad's epilogue);
- derive-chunkwise: k3.recurrence -> its chunkwise (WY/UT) schedule of stages;
- fuse-chunkwise: a chunkwise schedule -> kernels (which stages run together, what is spilled);
- derive-backward: k3.recurrence -> the reverse-mode derivative of its chunkwise schedule (each
  stage's adjoint rule, a state scan forward and a cotangent scan back), proved;
- lower-backward: that derivative -> kernels (the forward's prepare, a state scan, a cotangent
  scan in reverse, a chunk-parallel gradients kernel);
- save-forward-values: where the backward's prepare kernel is the forward's, a training forward
  (`chunk_saving`) that returns what that kernel spills and a backward (`chunk_backward_saved`)
  that takes it instead of recomputing it;
- derive-replay: k3.recurrence -> its speculative-decoding schedule (verify with a cache of the
  projected updates, replay of any accepted prefix), proved;
- lower-speculative: that schedule -> a `verify` entry (outputs + cache), a `commit` entry
  (replay of the accepted tokens into the pool) and a `spec_step` entry (both in one launch:
  the previous round's commit, then the next round's verify).
- derive-segment-scan: k3.recurrence -> its segment-scan schedule (context parallelism: segment
  summaries (M, N), their associative combine, each segment finished chunkwise), proved;
- derive-segment-scan-backward: its backward (chunk_backward_segments): chunk_backward's kernels per
  segment, the leaving cotangents from the forward combine's adjoint (the combine transposed, in
  reverse);
- outline-kernels: every kernel built inside an entry becomes a symbol of the module whose
  arguments are the entry's values its stages use, and the entry launches it (k3s.launch);
- overlap-launches: an entry's consecutive launches that share no tensor either writes run side by
  side, the first on a side stream (the backward's state and cotangent scans).

The Triton backend's own passes (guard-spill-only-stages, merge-identical-kernels) live in
backends/triton/ and are registered there (BACKEND_PASSES).

plan_vision_cp.py is no pass of a pipeline: a planner run per batch (its input is the batch's
images, not the layer), `k3c plan-vision` (docs/vision.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from xdsl.passes import ModulePass

# pass name -> (module in k3compile.passes, class): imported only when a pipeline names it
_WHERE = {
    "lower-recurrent": ("lower_recurrent", "LowerRecurrentPass"),
    "lower-decode": ("lower_decode", "LowerDecodePass"),
    "fuse-attnres": ("fuse_attnres", "FuseAttnResPass"),
    "derive-attnres-backward": ("derive_attnres_backward", "DeriveAttnResBackwardPass"),
    "derive-block-attnres": ("derive_block_attnres", "DeriveBlockAttnResPass"),
    "derive-block-attnres-backward": ("derive_block_attnres_backward", "DeriveBlockAttnResBackwardPass"),
    "lower-moe-routing": ("lower_moe_routing", "LowerMoeRoutingPass"),
    "lower-moe-experts": ("lower_moe_experts", "LowerMoeExpertsPass"),
    "derive-moe-backward": ("derive_moe_backward", "DeriveMoeBackwardPass"),
    "derive-chunkwise": ("derive_chunkwise", "DeriveChunkwisePass"),
    "fuse-chunkwise": ("fuse_chunkwise", "FuseChunkwisePass"),
    "derive-backward": ("derive_backward", "DeriveBackwardPass"),
    "lower-backward": ("lower_backward", "LowerBackwardPass"),
    "save-forward-values": ("save_forward_values", "SaveForwardValuesPass"),
    "derive-replay": ("derive_replay", "DeriveReplayPass"),
    "lower-speculative": ("lower_speculative", "LowerSpeculativePass"),
    "derive-segment-scan": ("derive_segment_scan", "DeriveSegmentScanPass"),
    "lower-segment-scan": ("lower_segment_scan", "LowerSegmentScanPass"),
    "derive-segment-scan-backward": ("derive_segment_scan_backward", "DeriveSegmentScanBackwardPass"),
    "overlap-launches": ("overlap_launches", "OverlapLaunchesPass"),
    "outline-kernels": ("outline_kernels", "OutlineKernelsPass"),
}


def _loader(module: str, cls: str) -> Callable[[], type[ModulePass]]:
    return lambda: getattr(importlib.import_module(f"k3compile.passes.{module}"), cls)


PASSES: dict[str, Callable[[], type[ModulePass]]] = {name: _loader(*where) for name, where in _WHERE.items()}
