"""Tuning the layers k3compile.ops runs, at the shapes it runs them: `with k3compile.ops.tuning():`
makes every chunk call inside tune its layer's shape bucket and dtype on this GPU first — the
forward (`chunk`), and the backward (`chunk_backward`) where the call records gradients — as
`k3c tune` does, into the same cache; the call then runs with the winners, and so does every
later process (k3compile.ops.layers embeds the cache's records of a layer when it loads it).

Outside the block nothing is tuned: the first call of an untuned bucket runs the heuristic
defaults, as it always did, so a training step never stops to time candidates unless asked to.
Calls that torch.compile traces are not tuned either (the tuner runs kernels; tune eagerly
first). docs/autotuning.md, "k3compile.ops".
"""

from __future__ import annotations

import contextvars
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from k3compile.ops import layers
from k3compile.runtime.autotune import BACKWARD_ENTRY, tune
from k3compile.runtime.autotune.space import TUNED_ENTRY

_TUNING = contextvars.ContextVar("k3compile_ops_tuning", default=False)


@contextmanager
def tuning() -> Iterator[None]:
    """Within the block, each chunk call of k3compile.ops (chunk_kda, chunk_gated_delta_rule,
    chunk_gla, ...; fused_recurrent_* where they run as the chunk function, under gradients)
    first tunes its layer for the call's bucket (sequences x value heads, tokens per sequence,
    each rounded up to a power of two) and input dtype where the tuning cache has no record of
    it, then runs with the winners. A cached bucket costs nothing more. GPU only: without one
    the call raises k3compile.runtime.autotune.TuningError. A cold forward tune takes seconds, a cold
    backward tune (32 candidates) minutes: run one step inside the block before training."""
    token = _TUNING.set(True)
    try:
        yield
    finally:
        _TUNING.reset(token)


def tuning_requested() -> bool:
    """Whether a chunk call now tunes its bucket first: inside tuning(), and run eagerly (asked
    first: dynamo cannot trace a context variable's get)."""
    return not torch.compiler.is_compiling() and _TUNING.get()


def tune_call(key: layers.LayerKey, tensors: dict, cu_seqlens, backward: bool) -> None:
    """Tune the layer of `key` for the bucket and dtype of a chunk call on `tensors` (its forward,
    and with `backward` its backward), then drop its loaded module if that changed the cache."""
    q = tensors["q"]
    batch, tokens = q.shape[:2]
    sequences = batch if cu_seqlens is None else len(cu_seqlens) - 1
    if not sequences or not tokens:
        return  # nothing to time
    # the bucket as the module's launches look it up: sequences, and their mean length
    shape = (sequences, batch * tokens // sequences)
    dtype = str(q.dtype).removeprefix("torch.")
    spec = layers.layer_spec(key)
    for entry in (TUNED_ENTRY, BACKWARD_ENTRY) if backward else (TUNED_ENTRY,):
        result = tune(spec, shape, dtype, gpu=layers.gpu_name(), entry=entry)
        for message in result.messages:
            warnings.warn(f"k3compile.ops.tuning: {message}", stacklevel=4)
    layers.forget_if_retuned(key)
