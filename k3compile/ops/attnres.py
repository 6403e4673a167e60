"""The AttnRes aggregate, compiled on demand and differentiable:

    from k3compile.ops.attnres import attnres_aggregate
    h = attnres_aggregate(sources, query, gain)     # sources [S, B, T, D], query and gain [D]

h = sum_i softmax_i(query . RMSNorm_gain(sources_i)) sources_i (k3.attnres; the sources
un-normalised in the mix, no temperature). Each call derives the layer from the shapes (the
hidden size D) and eps, compiles it once — cached in process and on disk, as the recurrence
functions' layers (k3compile.ops.layers) — and runs its `aggregate` entry.

Training: when an input requires grad (or under torch.compile) the call goes through a
`torch.library` custom op per compiled layer (`k3compile::attnres_aggregate_<layer>`), whose
forward also saves each row's log-sum-exp (fp32) and whose autograd formula calls a second
custom op running the layer's `aggregate_backward` (derive-attnres-backward: the softmax
recomputed from the log-sum-exp; d sources, d query, d gain in one kernel). Both have fake
implementations, so torch.compile(fullgraph=True) captures a training step through them.
Gradients come back in each input's dtype and shape.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, astuple, dataclass
from functools import cache

import torch

from k3compile.ops.autograd import needs_grad
from k3compile.ops.layers import compiler_fingerprint, layer_module

__all__ = ["attnres_aggregate"]

# the spec's bound on the sources is only a check of the entries; the layers compiled here allow
# K3's 8 stored blocks plus the partial sum, or as many as a call passes
NUM_BLOCKS = 8


@dataclass(frozen=True)
class AttnResKey:
    """What an AttnRes layer's kernels depend on: its hidden size, eps, and the sources it allows."""

    hidden_size: int
    eps: float
    num_blocks: int

    kind = "attnres"

    def module_name(self) -> str:
        """A Python identifier naming the layer and, by a digest, its key and the compiler."""
        text = json.dumps({**asdict(self), "kind": self.kind, "compiler": compiler_fingerprint()}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return f"attnres_d{self.hidden_size}_n{self.num_blocks}_{digest}"

    def table(self) -> dict:
        """The `[layer]` table of k3compile.spec.spec_from_table (block_size only documents the
        layer; dtype is the inputs' at run time)."""
        return {"name": self.module_name(), "kind": self.kind, "hidden_size": self.hidden_size,
                "num_blocks": self.num_blocks, "block_size": 1, "eps": self.eps}


@cache
def aggregate_operator(key: AttnResKey):
    """The custom op of the layer of `key`: sources, query, gain -> (out, lse), differentiable in
    sources, query and gain through a second op running aggregate_backward."""
    name = key.module_name()

    @torch.library.custom_op(f"k3compile::attnres_aggregate_{name}", mutates_args=())
    def aggregate(sources: torch.Tensor, query: torch.Tensor, gain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return layer_module(key).aggregate(sources, query, gain, output_lse=True)

    @aggregate.register_fake
    def _(sources, query, gain):
        _, B, T, D = sources.shape
        return sources.new_empty((B, T, D)), sources.new_empty((B, T), dtype=torch.float32)

    @torch.library.custom_op(f"k3compile::attnres_aggregate_backward_{name}", mutates_args=())
    def aggregate_backward(sources: torch.Tensor, query: torch.Tensor, gain: torch.Tensor, out: torch.Tensor,
                           lse: torch.Tensor, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """dsources (the sources' dtype), dquery and dgain (fp32)."""
        return layer_module(key).aggregate_backward(sources, query, gain, out, lse, dout)

    @aggregate_backward.register_fake
    def _(sources, query, gain, out, lse, dout):
        return (sources.new_empty(sources.shape), query.new_empty(query.shape, dtype=torch.float32),
                gain.new_empty(gain.shape, dtype=torch.float32))

    def setup_context(ctx, inputs, output):
        out, lse = output
        ctx.save_for_backward(*inputs, out, lse)
        ctx.mark_non_differentiable(lse)  # a by-product saved for the backward: never a loss's input

    def backward(ctx, dout, _dlse):
        sources, query, gain, out, lse = ctx.saved_tensors
        dsources, dquery, dgain = aggregate_backward(sources, query, gain, out, lse, dout.contiguous())
        return dsources, dquery.to(query.dtype), dgain.to(gain.dtype)

    aggregate.register_autograd(backward, setup_context=setup_context)
    return aggregate


def operator_name(*fields) -> str:
    """The name of the aggregate op of the layer whose AttnResKey has these fields, under
    torch.ops.k3compile, registering its ops (run, not traced, by torch.compile)."""
    key = AttnResKey(*fields)
    aggregate_operator(key)
    return f"attnres_aggregate_{key.module_name()}"


# torch.compiler.assume_constant_result without importing torch._dynamo, as
# k3compile.ops.autograd.operator_name (tests/test_ops_training.py checks the mark)
operator_name._dynamo_marked_constant = True


def attnres_aggregate(sources: torch.Tensor, query: torch.Tensor, gain: torch.Tensor, eps: float = 1e-6
                      ) -> torch.Tensor:
    """h [B, T, D] in the sources' dtype, from sources [S, B, T, D], the pseudo-query w [D] and
    the RMSNorm gain [D]: sum_i softmax_i(w . (gain * x_i / sqrt(mean(x_i^2) + eps))) x_i.
    Differentiable in all three."""
    if not isinstance(sources, torch.Tensor) or sources.dim() != 4:
        raise ValueError(f"sources: expected a tensor [S, B, T, D], got "
                         f"{list(sources.shape) if isinstance(sources, torch.Tensor) else type(sources).__name__}")
    key = AttnResKey(int(sources.shape[-1]), float(eps), max(NUM_BLOCKS, int(sources.shape[0]) - 1))
    sources, query, gain = (x.contiguous() if isinstance(x, torch.Tensor) else x for x in (sources, query, gain))
    if needs_grad(sources, query, gain) or torch.compiler.is_compiling():
        op = getattr(torch.ops.k3compile, operator_name(*astuple(key)))
        return op(sources, query, gain)[0]
    return layer_module(key).aggregate(sources, query, gain)[0]
