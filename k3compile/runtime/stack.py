"""A K3-style block stack as one torch.nn.Module, built from a `[model]` spec (docs/block-stack.md):

    from k3compile.runtime.stack import build_stack
    model = build_stack("examples/models/k3_stack.toml")   # or a ModelSpec
    y = model(x)                                             # x [B, T, D] (token ids [B, T] with vocab_size)

Layers follow the spec's pattern (KDA through k3compile.ops.kda.chunk_kda, attention through
torch's causal SDPA), each a mixer and an FFN (dense SwiGLU, or LatentMoE through
k3compile.ops.moe), each of the two behind a Block AttnRes
aggregation point: its input is the softmax-weighted mix (k3compile.ops.attnres) of the completed
block representatives b_0 (the embedding), b_1, ... and its block's partial sum (the sum of the
block's sublayer outputs so far), RMS-normalised for the sublayer. At a block's last layer the
partial sum becomes the block's representative: the same tensor, kept in a list, one tensor a
block. The stack's final output is one more aggregation point over everything.

Training: each point's aggregate and pre-norm run under torch.utils.checkpoint (non-reentrant), so
what the backward keeps of a point is what the checkpoint holds, the representatives and the
partial sum (which exist anyway), and the aggregate is recomputed from them in the backward.
Activation memory is that of the same stack with plain residuals (attnres = "none") plus the
representatives (tests/test_block_stack.py measures it). attnres = "two_phase" runs Block
AttnRes's phase 1 once for a block's points and recomputes it once in the backward
(k3compile.runtime.stack_two_phase: the same floor, no torch checkpoint in eager; under torch.compile a
traced path, docs/block-stack.md); "torch" is the aggregate's
definition in torch ops (the baseline).
"""

from __future__ import annotations

from functools import partial as bind
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

from k3compile.runtime.stack_spec import ModelSpec, load_model_spec
from k3compile.runtime.stack_two_phase import BlockPartials

__all__ = ["BlockStack", "build_stack"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class KDAMixer(nn.Module):
    """q, k, v, gate and beta projections, KDA (q and k L2-normalised, the gate
    -exp(A_log) softplus(g + dt_bias) and beta = sigmoid(logits) in the kernel: fla's options), an
    output projection. k3compile.ops.kda.chunk_kda: compiled once per head shape, differentiable."""

    def __init__(self, hidden: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        width = heads * head_dim
        self.qkvg = nn.Linear(hidden, 4 * width, bias=False)
        self.beta = nn.Linear(hidden, heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.dt_bias = nn.Parameter(torch.zeros(width))
        self.out = nn.Linear(width, hidden, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        # the compiled ops (triton): only for a stack with this layer
        from k3compile.ops.kda import chunk_kda

        B, T, _ = u.shape
        q, k, v, g = (t.reshape(B, T, self.heads, self.head_dim) for t in self.qkvg(u).chunk(4, dim=-1))
        o, _ = chunk_kda(q, k, v, g, self.beta(u), A_log=self.A_log, dt_bias=self.dt_bias,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        return self.out(o.reshape(B, T, -1))


class AttentionMixer(nn.Module):
    """Causal multi-head attention: torch's scaled_dot_product_attention between projections."""

    def __init__(self, hidden: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(hidden, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        B, T, _ = u.shape
        q, k, v = (t.reshape(B, T, self.heads, self.head_dim).transpose(1, 2) for t in self.qkv(u).chunk(3, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).reshape(B, T, -1))


class DenseFFN(nn.Module):
    """SwiGLU: down(silu(gate(u)) * up(u))."""

    def __init__(self, hidden: int, ffn_hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * ffn_hidden, bias=False)
        self.down = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(u).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class LatentMoeFFN(nn.Module):
    """The LatentMoE layer (k3compile.ops.moe.latent_moe: compiled forward and derived backward) on
    the stack's rows [B, T, D] taken as B T tokens. Its weights in the layouts MoeKey.shapes()
    gives, drawn with variance 1 / fan-in (gains 1); router_bias a buffer of zeros (the selection
    bias has no gradient: load balancing updates it), kept and passed in fp32."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        from k3compile.ops.moe import MoeKey  # the compiled op, only for a stack that has one

        self.key = MoeKey(hidden_size=spec.hidden_size, num_experts=spec.num_experts, top_k=spec.top_k,
                          expert_ffn_dim=spec.expert_ffn_dim, latent_dim=spec.latent_dim,
                          num_shared_experts=spec.num_shared_experts, shared_ffn_dim=spec.shared_ffn_dim,
                          activation=spec.moe_activation, eps=spec.eps)
        self.weights = [name for name, shape in self.key.shapes().items()
                        if shape is not None and name not in ("x", "router_bias")]
        for name in self.weights:
            shape = self.key.shapes()[name]
            init = torch.ones(shape) if name == "latent_norm_gain" else torch.randn(shape) * shape[-1] ** -0.5
            self.register_parameter(name, nn.Parameter(init))
        self.register_buffer("router_bias", torch.zeros(spec.num_experts))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        # the compiled ops (triton): only for a stack with this layer
        from k3compile.ops.moe import latent_moe

        weights = {name: getattr(self, name) for name in self.weights}
        out = latent_moe(u.reshape(-1, u.shape[-1]), router_bias=self.router_bias.float(), layer=self.key, **weights)
        return out.view(u.shape)


def make_ffn(spec: ModelSpec) -> nn.Module:
    return DenseFFN(spec.hidden_size, spec.ffn_hidden_size) if spec.ffn == "dense" else LatentMoeFFN(spec)


class Point(nn.Module):
    """An aggregation point's weights: the AttnRes pseudo-query (zero at init: the mean of the
    sources, as the paper starts) and RMSNorm gain of the scores, and the sublayer's pre-norm."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(hidden))
        self.gain = nn.Parameter(torch.ones(hidden))
        self.norm = nn.Parameter(torch.ones(hidden))


class Layer(nn.Module):
    def __init__(self, spec: ModelSpec, mixer: str) -> None:
        super().__init__()
        D = spec.hidden_size
        self.kind = mixer
        self.mixer = (KDAMixer(D, spec.kda_heads, spec.kda_head_dim) if mixer == "kda"
                      else AttentionMixer(D, spec.attn_heads, spec.attn_head_dim))
        self.ffn = make_ffn(spec)
        self.points = nn.ModuleList([Point(D), Point(D)])


class BlockStack(nn.Module):
    """The stack of a ModelSpec. forward(x) runs every layer; run_layers(start, stop, reps, partial)
    runs a range of them on the residual state (the pipeline's stages, k3compile.runtime.stack_pipeline):
    reps, the list of completed block representatives (b_0 the embedding), and partial, the
    current block's partial sum (None at a block's start). With attnres = "none" the state is the
    plain residual stream, held in `partial`, and reps stays [b_0]."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        D = spec.hidden_size
        self.layers = nn.ModuleList([Layer(spec, mixer) for mixer in spec.layers])
        self.final = Point(D)
        self.embed = nn.Embedding(spec.vocab_size, D) if spec.vocab_size else None
        self.head = nn.Linear(D, spec.vocab_size, bias=False) if spec.vocab_size else None
        self.to(DTYPES[spec.dtype])

    # --- the residual state -------------------------------------------------------------------

    def begin(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """(reps, partial) before layer 0: b_0 = the embedding (x itself without a vocabulary)."""
        h0 = self.embed(x) if self.embed is not None else x
        return ([h0], h0) if self.spec.attnres == "none" else ([h0], None)

    def finish(self, reps: list[torch.Tensor], partial: torch.Tensor | None) -> torch.Tensor:
        """The final point's output (hidden states, or logits with a vocabulary)."""
        if self.spec.attnres == "two_phase":
            u = BlockPartials(reps, [self.final], self.spec.eps, self.spec.checkpoint_attnres).point_input(0, partial)
        else:
            u = self.point_input(self.final, reps, partial)
        return self.head(u) if self.head is not None else u

    def run_layers(self, start: int, stop: int, reps: list[torch.Tensor], partial: torch.Tensor | None):
        """Layers start .. stop - 1 on the state (reps, partial); returns the state after them."""
        S = self.spec.block_size
        block = None
        for index in range(start, stop):
            layer = self.layers[index]
            if self.spec.attnres == "two_phase" and block is None:  # phase 1 for the block's points in this run
                points = [p for later in self.layers[index:min(stop, (index // S + 1) * S)] for p in later.points]
                block, k = BlockPartials(reps, points, self.spec.eps, self.spec.checkpoint_attnres), 0
            for point, sublayer in zip(layer.points, (layer.mixer, layer.ffn)):
                if block is not None:
                    u, k = block.point_input(k, partial), k + 1
                else:
                    u = self.point_input(point, reps, partial)
                out = sublayer(u)
                partial = out if partial is None else partial + out
            if block is not None and ((index + 1) % S == 0 or index + 1 == stop):
                block.end_forward()
                block = None
            if self.spec.attnres != "none" and (index + 1) % S == 0:
                reps, partial = [*reps, partial], None  # the block's representative: its partial sum, kept
        return reps, partial

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(self.spec, x)
        reps, partial = self.run_layers(0, len(self.layers), *self.begin(x))
        return self.finish(reps, partial)

    # --- one aggregation point ----------------------------------------------------------------

    def point_input(self, point: Point, reps: list[torch.Tensor], partial: torch.Tensor | None) -> torch.Tensor:
        """The sublayer input of `point`: RMSNorm(AttnRes(reps, partial)), under activation
        checkpointing when training (recomputed from reps and partial in the backward)."""
        if self.spec.attnres == "none":
            return rms_norm(partial, point.norm, self.spec.eps)
        compute = bind(aggregate_and_norm, self.spec.attnres, self.spec.eps)
        if self.spec.checkpoint_attnres and torch.is_grad_enabled():
            # looked up at call time: tests/test_block_stack.py records what the checkpoints hold
            return torch_checkpoint.checkpoint(compute, point.query, point.gain, point.norm, reps, partial,
                                               use_reentrant=False)
        return compute(point.query, point.gain, point.norm, reps, partial)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def aggregate_and_norm(form: str, eps: float, query, gain, norm, reps, partial) -> torch.Tensor:
    sources = [*reps] if partial is None else [*reps, partial]
    return rms_norm(ATTNRES[form](sources, query, gain, eps), norm, eps)


def one_phase(sources: list[torch.Tensor], query, gain, eps: float) -> torch.Tensor:
    """attnres_aggregate over the sources gathered into its [S, B, T, D] input (a transient
    copy inside the checkpoint, freed after the call: not an activation)."""
    # the compiled ops (triton): only for a stack with this layer
    from k3compile.ops.attnres import attnres_aggregate

    return attnres_aggregate(torch.stack(sources), query, gain, eps)


def torch_ops(sources: list[torch.Tensor], query, gain, eps: float) -> torch.Tensor:
    """The aggregate's definition in torch ops (autograd saves its intermediates: under the
    checkpoint they are recomputed too): the baseline the compiled forms are measured against, and
    a fast stand-in where Triton's interpreter is too slow (the multi-process pipeline tests)."""
    x = torch.stack(sources)
    scores = (rms_norm(x, gain, eps) * query).sum(-1)
    return (torch.softmax(scores.float(), dim=0).to(x.dtype)[..., None] * x).sum(0)


ATTNRES = {"aggregate": one_phase, "torch": torch_ops}


def check_input(spec: ModelSpec, x) -> None:
    if spec.vocab_size:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.int32, torch.int64):
            got = f"{list(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x: expected token ids [B, T] (int64 or int32), got {got}")
        return
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != spec.hidden_size:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected hidden states [B, T, D] with D = {spec.hidden_size}, got {got}")
    if x.dtype != DTYPES[spec.dtype]:
        raise ValueError(f"x: expected dtype {DTYPES[spec.dtype]} (the spec's dtype), got {x.dtype}")


def build_stack(spec: ModelSpec | str | Path) -> BlockStack:
    """The BlockStack of a ModelSpec or a model spec file (a bad file: SpecError, one line naming the key)."""
    if isinstance(spec, (str, Path)):
        spec = load_model_spec(spec)
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec: expected a ModelSpec or a path to a [model] spec, got {type(spec).__name__}")
    return BlockStack(spec)
