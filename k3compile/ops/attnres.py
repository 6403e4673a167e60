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

Block AttnRes's two phases (derive-block-attnres; docs/attnres.md, "Block AttnRes: two phases"):

    partials = attnres_block_partials(representatives, queries, gains)    # once per block
    h_j = attnres_block_merge([p[j] for p in partials], partial_sum, queries[j], gains[j])

equal, up to rounding, to attnres_aggregate over the representatives and the partial sum with
query j, and differentiable as it is: each phase is a custom op (`k3compile::attnres_block_partials_<layer>`,
`k3compile::attnres_block_merge_<layer>`) whose autograd formula runs the layer's
`block_partials_backward` or `block_merge_backward` (derive-block-attnres-backward) through a
second custom op; the merge also saves its log-sum-exp (marked non-differentiable).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, astuple, dataclass
from functools import cache

import torch

from k3compile.ops.autograd import needs_grad
from k3compile.ops.layers import compiler_fingerprint, layer_module

__all__ = ["attnres_aggregate", "attnres_block_merge", "attnres_block_partials"]

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


# --- Block AttnRes's two phases -------------------------------------------------------------

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def zeros_if_none(grad: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An output's cotangent, zeros where autograd passes none (the output was not used)."""
    return torch.zeros_like(like) if grad is None else grad.contiguous()


@cache
def block_partials_operator(key: AttnResKey):
    """The custom op of phase 1 of the layer of `key`: representatives, queries, gains ->
    (block_lse, block_mix), differentiable in all three through a second op running
    block_partials_backward."""
    name = key.module_name()

    @torch.library.custom_op(f"k3compile::attnres_block_partials_{name}", mutates_args=())
    def block_partials(representatives: torch.Tensor, queries: torch.Tensor, gains: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        return layer_module(key).block_partials(representatives, queries, gains)

    @block_partials.register_fake
    def _(representatives, queries, gains):
        _, B, T, D = representatives.shape
        Q = queries.shape[0]
        return (representatives.new_empty((Q, B, T), dtype=torch.float32),
                representatives.new_empty((Q, B, T, D)))

    @torch.library.custom_op(f"k3compile::attnres_block_partials_backward_{name}", mutates_args=())
    def block_partials_backward(representatives: torch.Tensor, queries: torch.Tensor, gains: torch.Tensor,
                                block_lse: torch.Tensor, block_mix: torch.Tensor, dblock_lse: torch.Tensor,
                                dblock_mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """drepresentatives (in the dtype the module declares: their own where partials-backward=columns
        stores each element once, fp32 where query-blocks adds them up by atomics), dqueries and
        dgains (fp32: every program adds its share)."""
        return layer_module(key).block_partials_backward(representatives, queries, gains, block_lse, block_mix,
                                                         dblock_lse, dblock_mix)

    @block_partials_backward.register_fake
    def _(representatives, queries, gains, block_lse, block_mix, dblock_lse, dblock_mix):
        # the form the pass options chose decides drepresentatives' dtype: the module declares it
        declared = layer_module(key).OUTPUT_DTYPES["block_partials_backward"]["drepresentatives"]
        dtype = representatives.dtype if declared == "float" else getattr(torch, declared)
        return (representatives.new_empty(representatives.shape, dtype=dtype),
                *(x.new_empty(x.shape, dtype=torch.float32) for x in (queries, gains)))

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, *output)

    def backward(ctx, dblock_lse, dblock_mix):
        representatives, queries, gains, block_lse, block_mix = ctx.saved_tensors
        grads = block_partials_backward(representatives, queries, gains, block_lse, block_mix,
                                        zeros_if_none(dblock_lse, block_lse), zeros_if_none(dblock_mix, block_mix))
        return tuple(grad.to(x.dtype) for grad, x in zip(grads, (representatives, queries, gains), strict=True))

    block_partials.register_autograd(backward, setup_context=setup_context)
    return block_partials


@cache
def block_merge_operator(key: AttnResKey):
    """The custom op of phase 2 of the layer of `key`: partial_sum [B, T, D], query, gain, block_lse,
    block_mix -> (out, lse), differentiable in all five through a second op running
    block_merge_backward."""
    name = key.module_name()

    @torch.library.custom_op(f"k3compile::attnres_block_merge_{name}", mutates_args=())
    def block_merge(partial_sum: torch.Tensor, query: torch.Tensor, gain: torch.Tensor, block_lse: torch.Tensor,
                    block_mix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return layer_module(key).block_merge(partial_sum[None], query, gain, block_lse, block_mix, output_lse=True)

    @block_merge.register_fake
    def _(partial_sum, query, gain, block_lse, block_mix):
        return partial_sum.new_empty(partial_sum.shape), block_lse.new_empty(block_lse.shape)

    @torch.library.custom_op(f"k3compile::attnres_block_merge_backward_{name}", mutates_args=())
    def block_merge_backward(partial_sum: torch.Tensor, query: torch.Tensor, gain: torch.Tensor,
                             block_lse: torch.Tensor, block_mix: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                             dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
        """dpartial_sum (its dtype), dquery and dgain (fp32), dblock_lse (fp32), dblock_mix (the
        partial sum's dtype)."""
        dpartial_sum, *grads = layer_module(key).block_merge_backward(partial_sum[None], query, gain, block_lse,
                                                                      block_mix, out, lse, dout)
        return dpartial_sum[0], *grads

    @block_merge_backward.register_fake
    def _(partial_sum, query, gain, block_lse, block_mix, out, lse, dout):
        return (partial_sum.new_empty(partial_sum.shape), query.new_empty(query.shape, dtype=torch.float32),
                gain.new_empty(gain.shape, dtype=torch.float32), block_lse.new_empty(block_lse.shape),
                partial_sum.new_empty(block_mix.shape))

    def setup_context(ctx, inputs, output):
        out, lse = output
        ctx.save_for_backward(*inputs, out, lse)
        ctx.mark_non_differentiable(lse)  # a by-product saved for the backward: never a loss's input

    def backward(ctx, dout, _dlse):
        partial_sum, query, gain, block_lse, block_mix, out, lse = ctx.saved_tensors
        grads = block_merge_backward(partial_sum, query, gain, block_lse, block_mix, out, lse,
                                     zeros_if_none(dout, out))
        return tuple(grad.to(x.dtype) for grad, x in zip(grads, (partial_sum, query, gain, block_lse, block_mix),
                                                          strict=True))

    block_merge.register_autograd(backward, setup_context=setup_context)
    return block_merge


def block_operator_name(phase: str, *fields) -> str:
    """The name under torch.ops.k3compile of phase ("block_partials" or "block_merge") of the layer
    whose AttnResKey has these fields, registering its ops (run, not traced, by torch.compile)."""
    key = AttnResKey(*fields)
    (block_partials_operator if phase == "block_partials" else block_merge_operator)(key)
    return f"attnres_{phase}_{key.module_name()}"


block_operator_name._dynamo_marked_constant = True  # as operator_name's


def check_tensor(name: str, x, layout: str, sizes: dict[str, int], dtypes: tuple,
                 like: tuple[str, torch.Tensor] | None = None) -> None:
    """A one-line ValueError naming `name` unless x is a tensor of the shape `layout` ("B,T,D": a
    symbol in `sizes` must have that size, the others are bound there), of one of `dtypes`, on
    the device of the tensor `like` names (None: any)."""
    symbols = layout.split(",")
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor [{', '.join(symbols)}], got {type(x).__name__}")
    known = {symbol: sizes[symbol] for symbol in symbols if symbol in sizes}
    if x.dim() != len(symbols) or any(size != known.get(symbol, size) for symbol, size in zip(symbols, x.shape)):
        bound = f" with {', '.join(f'{symbol} = {size}' for symbol, size in known.items())}" if known else ""
        raise ValueError(f"{name}: expected shape [{', '.join(symbols)}]{bound}, got {list(x.shape)}")
    sizes.update(zip(symbols, x.shape))
    if x.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {x.dtype}")
    if like is not None and x.device != like[1].device:
        raise ValueError(f"{name}: expected a tensor on {like[1].device} (as {like[0]}), got {x.device}")


def attnres_block_partials(representatives: torch.Tensor, queries: torch.Tensor, gains: torch.Tensor,
                           eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Block AttnRes's phase 1, once per block: the softmax of each of the block's Q queries over
    its n completed block representatives, kept in parts. representatives [n, B, T, D] (1 <= n),
    queries and gains [Q, D] (query j's pseudo-query and RMSNorm gain). Returns per query and
    token the log-sum-exp of the scores, lse = log sum_i exp(s_i) [Q, B, T] fp32, and the
    softmax's mix of the representatives, sum_i softmax(s)_i b_i [Q, B, T, D] in their dtype
    (derive-block-attnres's normalised partials). Differentiable in the three inputs (through
    both results)."""
    sizes: dict[str, int] = {}
    check_tensor("representatives", representatives, "n,B,T,D", sizes, FLOAT_DTYPES)
    for name, x in (("queries", queries), ("gains", gains)):
        check_tensor(name, x, "Q,D", sizes, FLOAT_DTYPES, ("representatives", representatives))
    key = AttnResKey(sizes["D"], float(eps), max(NUM_BLOCKS, sizes["n"]))
    inputs = tuple(x.contiguous() for x in (representatives, queries, gains))
    if needs_grad(*inputs) or torch.compiler.is_compiling():
        return getattr(torch.ops.k3compile, block_operator_name("block_partials", *astuple(key)))(*inputs)
    return layer_module(key).block_partials(*inputs)


def attnres_block_merge(partials, partial_sum: torch.Tensor, query: torch.Tensor, gain: torch.Tensor,
                        eps: float = 1e-6) -> torch.Tensor:
    """Block AttnRes's phase 2, at one aggregation point: its query's partials (block_lse [B, T]
    fp32, block_mix [B, T, D]: row j of each of attnres_block_partials's results, with the same
    eps) merged with the block's current partial sum [B, T, D] under its pseudo-query and RMSNorm
    gain ([D] each). Returns h [B, T, D] in the partial sum's dtype. Differentiable in the five
    inputs."""
    if not isinstance(partials, (tuple, list)) or len(partials) != 2:
        got = f"a {type(partials).__name__} of {len(partials)}" if isinstance(partials, (tuple, list)) else \
            type(partials).__name__
        raise ValueError(f"partials: expected (block_lse, block_mix) of one query, got {got}")
    sizes: dict[str, int] = {}
    check_tensor("partial_sum", partial_sum, "B,T,D", sizes, FLOAT_DTYPES)
    for name, x in (("query", query), ("gain", gain)):
        check_tensor(name, x, "D", sizes, FLOAT_DTYPES, ("partial_sum", partial_sum))
    block_lse, block_mix = partials
    check_tensor("block_lse", block_lse, "B,T", sizes, (torch.float32,), ("partial_sum", partial_sum))
    check_tensor("block_mix", block_mix, "B,T,D", sizes, FLOAT_DTYPES, ("partial_sum", partial_sum))
    key = AttnResKey(sizes["D"], float(eps), NUM_BLOCKS)
    inputs = tuple(x.contiguous() for x in (partial_sum, query, gain, block_lse, block_mix))
    if needs_grad(*inputs) or torch.compiler.is_compiling():
        return getattr(torch.ops.k3compile, block_operator_name("block_merge", *astuple(key)))(*inputs)[0]
    partial_sum, *rest = inputs
    return layer_module(key).block_merge(partial_sum[None], *rest)[0]
