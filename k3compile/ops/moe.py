"""The LatentMoE layer, compiled on demand and differentiable:

    from k3compile.ops.moe import MoeKey, latent_moe
    layer = MoeKey.of("examples/latent_moe.toml")          # or a LayerSpec, or MoeKey(...)
    out = latent_moe(x, router_weight, router_bias, expert_gate_up, expert_down,
                     latent_down, latent_up, latent_norm_gain, shared_gate_up, shared_down, layer=layer)

Shapes and semantics are reference.latent_moe's (docs/moe.md): x [R, d], the weights in their
layouts, None for the stages the layer has not. Each layer (its widths and router options) is
compiled once, cached in process and on disk as k3compile.ops' other layers, and runs in the
dtype of its inputs.

Training: when an input requires grad (or under torch.compile) the call goes through a
`torch.library` custom op per compiled layer (`k3compile::latent_moe_<layer>`) running the
module's `moe_forward` (the expert-centric plan, returning what the backward reads), whose
autograd formula is a second custom op running `moe_backward` (derive-moe-backward). Both have
fake implementations, so torch.compile(fullgraph=True) captures a training step through them.
Gradients come back in each input's dtype: x, router_weight, the experts', the latent
projections' and norm gain's, the shared experts'. router_bias has none (the selection bias only
ranks experts; DeepSeek-V3 updates it by load balancing, not by gradient): it must not require grad.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path

import torch

from k3compile.ops.autograd import needs_grad
from k3compile.ops.layers import compiler_fingerprint, layer_module

__all__ = ["MoeKey", "latent_moe"]

# the layer's tensor arguments, in the entries' order
ARGUMENTS = ("x", "router_weight", "router_bias", "expert_gate_up", "expert_down", "latent_down", "latent_up",
             "latent_norm_gain", "shared_gate_up", "shared_down")
# derive-moe-backward's block-rows in the default pipeline: the pair list's blocks (its length,
# for the fake implementation's shapes; tests/test_moe_backward.py checks the two agree)
BLOCK_ROWS = 128
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class MoeKey:
    """What a LatentMoE layer's kernels depend on: a latent_moe spec table without name and dtype."""

    hidden_size: int
    num_experts: int
    top_k: int
    expert_ffn_dim: int
    latent_dim: int = 0
    num_shared_experts: int = 0
    shared_ffn_dim: int = 0
    activation: str = "swiglu"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    eps: float = 1e-6

    kind = "latent_moe"

    def __post_init__(self) -> None:
        # the name of its custom op (not a field): what a traced call reads of the key, a string,
        # which torch.compile keeps constant where it may make a changed integer field symbolic
        object.__setattr__(self, "operator", f"latent_moe_{self.module_name()}")
        _KEYS[self.operator] = self

    @classmethod
    def of(cls, spec) -> MoeKey:
        """The key of a latent_moe spec: a LayerSpec, a path to its TOML, or a MoeKey."""
        # a warm start reads no spec (tomllib and the schemas)
        from k3compile.spec import LayerSpec, load_spec

        if isinstance(spec, MoeKey):
            return spec
        if isinstance(spec, (str, Path)):
            spec = load_spec(spec)
        if not isinstance(spec, LayerSpec) or spec.kind != "latent_moe":
            got = f"a {spec.kind} spec" if isinstance(spec, LayerSpec) else type(spec).__name__
            raise ValueError(f"layer: expected a latent_moe spec (LayerSpec, TOML path or MoeKey), got {got}")
        if spec.params["expert_weight_format"] != "bf16":
            raise ValueError(f"layer: expert_weight_format = {spec.params['expert_weight_format']!r} has no backward "
                             "(MXFP4 weights are packed for serving); train with bf16 expert weights")
        return cls(**{f.name: spec.params[f.name] for f in fields(cls)})

    def module_name(self) -> str:
        text = json.dumps({**asdict(self), "kind": self.kind, "compiler": compiler_fingerprint()}, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return f"latent_moe_d{self.hidden_size}_e{self.num_experts}_k{self.top_k}_{digest}"

    def table(self) -> dict:
        """The `[layer]` table of k3compile.spec.spec_from_table (dtype is the inputs' at run time)."""
        return {"name": self.module_name(), "kind": self.kind, **asdict(self)}

    def shapes(self) -> dict[str, tuple]:
        """Each argument's shape over R (the token rows); None for a stage the layer has not."""
        d, E, F, S, Fs = self.hidden_size, self.num_experts, self.expert_ffn_dim, self.num_shared_experts, \
            self.shared_ffn_dim
        w, latent, shared = self.latent_dim or d, self.latent_dim > 0, S > 0 and Fs > 0
        return {"x": ("R", d), "router_weight": (E, d), "router_bias": (E,), "expert_gate_up": (E, 2 * F, w),
                "expert_down": (E, w, F), "latent_down": (w, d) if latent else None,
                "latent_up": (d, w) if latent else None, "latent_norm_gain": (w,) if latent else None,
                "shared_gate_up": (S, 2 * Fs, d) if shared else None, "shared_down": (S, d, Fs) if shared else None}

    def saved_shapes(self, R) -> dict[str, tuple]:
        """The shapes of moe_forward's outputs at R rows (R may be symbolic under torch.compile)."""
        d, E, F, k, S, Fs = self.hidden_size, self.num_experts, self.expert_ffn_dim, self.top_k, \
            self.num_shared_experts, self.shared_ffn_dim
        w = self.latent_dim or d
        blocks = (R * k + BLOCK_ROWS - 1) // BLOCK_ROWS + torch.sym_min(R * k, E)
        return {"out": (R, d), "topk_ids": (R, k), "topk_weights": (R, k), "h": (R, w), "expert_offsets": (E + 1,),
                "sorted_pairs": (blocks * BLOCK_ROWS,), "block_expert": (blocks,),
                "expert_gu": (blocks * BLOCK_ROWS, 2 * F), "expert_act": (blocks * BLOCK_ROWS, F), "combined": (R, w),
                "shared_act": (R, S * Fs), "shared_gu": (R, 2 * S * Fs)}


DTYPE_CLASSES = {"float32": torch.float32, "index": torch.int32}
_KEYS: dict[str, MoeKey] = {}  # the keys made in this process, by their operator's name


@cache
def moe_operator(key: MoeKey):
    """The custom op of the layer of `key`: its tensors -> [out, *what the backward reads],
    differentiable through a second op running moe_backward."""
    name = key.module_name()

    def named(tensors) -> dict:
        return {n: t for n, t in zip(ARGUMENTS, tensors, strict=True) if t is not None}

    @torch.library.custom_op(f"k3compile::latent_moe_{name}", mutates_args=())
    def forward(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor,
                expert_gate_up: torch.Tensor, expert_down: torch.Tensor, latent_down: torch.Tensor | None,
                latent_up: torch.Tensor | None, latent_norm_gain: torch.Tensor | None,
                shared_gate_up: torch.Tensor | None, shared_down: torch.Tensor | None) -> list[torch.Tensor]:
        tensors = (x, router_weight, router_bias, expert_gate_up, expert_down, latent_down, latent_up,
                   latent_norm_gain, shared_gate_up, shared_down)
        return list(layer_module(key).moe_forward(**named(tensors)))

    @forward.register_fake
    def _(x, *weights):
        shapes = key.saved_shapes(x.shape[0])
        declared = layer_module(key).OUTPUT_DTYPES["moe_forward"]
        return [x.new_empty(shapes[n], dtype=DTYPE_CLASSES.get(c, x.dtype)) for n, c in declared.items()]

    @torch.library.custom_op(f"k3compile::latent_moe_backward_{name}", mutates_args=())
    def backward_op(tensors: list[torch.Tensor | None], saved: list[torch.Tensor], dout: torch.Tensor
                    ) -> list[torch.Tensor]:
        """The gradients of the layer's differentiable inputs it has (dx fp32, dlatent_norm_gain fp32)."""
        names = [n for n in layer_module(key).OUTPUT_DTYPES["moe_forward"] if n != "out"]
        return list(layer_module(key).moe_backward(**named(tensors), **dict(zip(names, saved, strict=True)), dout=dout))

    @backward_op.register_fake
    def _(tensors, saved, dout):
        given = named(tensors)
        declared = layer_module(key).OUTPUT_DTYPES["moe_backward"]
        return [given[n[1:]].new_empty(given[n[1:]].shape, dtype=DTYPE_CLASSES.get(c, dout.dtype))
                for n, c in declared.items()]

    def setup_context(ctx, inputs, output):
        ctx.present = [t is not None for t in inputs]
        ctx.save_for_backward(*(t for t in inputs if t is not None), *output[1:])
        ctx.mark_non_differentiable(*output[1:])  # what the backward reads: never a loss's input

    def backward(ctx, cotangents):
        dout = cotangents[0]  # the saved tensors are non-differentiable
        given = iter(ctx.saved_tensors)
        tensors = [next(given) if present else None for present in ctx.present]
        saved = list(given)
        grads = iter(backward_op(tensors, saved, dout.contiguous()))
        return tuple(None if t is None or n == "router_bias" else next(grads).to(t.dtype)
                     for n, t in zip(ARGUMENTS, tensors, strict=True))

    forward.register_autograd(backward, setup_context=setup_context)
    return forward


def operator_name(name: str) -> str:
    """`name` (a MoeKey's operator), its ops registered under torch.ops.k3compile (run, not
    traced, by torch.compile)."""
    moe_operator(_KEYS[name])
    return name


# torch.compiler.assume_constant_result without importing torch._dynamo, as
# k3compile.ops.autograd.operator_name (tests/test_ops_training.py checks the mark)
operator_name._dynamo_marked_constant = True


def check_arguments(key: MoeKey, tensors: dict) -> None:
    """A one-line ValueError naming the first tensor that is not what the layer takes."""
    x = tensors["x"]
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        got = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a tensor [R, {key.hidden_size}], got {got}")
    for name, shape in key.shapes().items():
        t = tensors[name]
        if shape is None:
            if t is not None:
                raise ValueError(f"{name}: the layer has no such stage (latent_dim = {key.latent_dim}, "
                                 f"num_shared_experts = {key.num_shared_experts}); pass None, got a tensor")
            continue
        expected = [x.shape[0] if s == "R" else s for s in shape]
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a tensor {expected}, got {type(t).__name__}")
        if list(t.shape) != expected:
            raise ValueError(f"{name}: expected shape {expected}, got {list(t.shape)}")
        dtype = torch.float32 if name == "router_bias" else x.dtype
        if t.dtype != dtype or dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name}: expected dtype {dtype if dtype in FLOAT_DTYPES else 'bf16, fp16 or fp32'}, "
                             f"got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected a tensor on {x.device} (as x), got {t.device}")
    if tensors["router_bias"].requires_grad and torch.is_grad_enabled():
        raise ValueError("router_bias: requires grad, but the selection bias has no gradient (it only ranks experts; "
                         "update it by load balancing): pass it detached")


def latent_moe(x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor,
               expert_gate_up: torch.Tensor, expert_down: torch.Tensor, latent_down: torch.Tensor | None = None,
               latent_up: torch.Tensor | None = None, latent_norm_gain: torch.Tensor | None = None,
               shared_gate_up: torch.Tensor | None = None, shared_down: torch.Tensor | None = None, *,
               layer) -> torch.Tensor:
    """out [R, d] in x's dtype: k3.latent_moe of `layer` (a MoeKey, a latent_moe LayerSpec or its
    TOML path) on tokens x [R, d]. Differentiable in every tensor but router_bias."""
    key = MoeKey.of(layer)
    tensors = dict(zip(ARGUMENTS, (x, router_weight, router_bias, expert_gate_up, expert_down, latent_down, latent_up,
                                   latent_norm_gain, shared_gate_up, shared_down), strict=True))
    check_arguments(key, tensors)
    tensors = {n: t.contiguous() if t is not None else None for n, t in tensors.items()}
    if needs_grad(*tensors.values()) or torch.compiler.is_compiling():
        op = getattr(torch.ops.k3compile, operator_name(key.operator))
        return op(*tensors.values())[0]
    return layer_module(key).moe(**{n: t for n, t in tensors.items() if t is not None})[0]
