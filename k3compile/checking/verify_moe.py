"""Differential verification of the LatentMoE layer (`k3c verify` on a latent_moe spec): its
entries route, moe_decode (and with bf16 weights moe_decode_warp, which the default dispatch
table runs) and moe_prefill against reference.latent_moe_routing and reference.latent_moe in
float64 (computed on the inputs' device, one expert at a time), and the training pair
moe_forward + moe_backward: every gradient against torch autograd of the reference (float64
leaves on a CPU; on a GPU fp32 leaves, the reference's arithmetic still float64). MXFP4 expert
weights are drawn as for bf16 and packed by the module's pack_expert_weights: the kernels are
verified against dequantise-then-reference, so the tolerances are bf16's (the dequantised
weights are exact in every dtype; what MXFP4 loses is the packing's, not the kernels').

On a CPU (the interpreter) the layer runs at small widths of the same structure; on a GPU at the
spec's widths with at most GPU_EXPERTS experts (the float64 reference takes each expert's weights
to float64; the kernels' code is the same at any expert count). Routing inputs are drawn with no
near tie at the top-k boundary (route: between any two ranks down to it), since fp32 logits may
order experts that are within ~1e-6 either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from k3compile.ir import reference
from k3compile.spec import LayerSpec

GPU_EXPERTS = 128
# the backward's GPU layer: the spec's widths with this many experts (the reference's autograd
# holds fp32 copies of every weight and their gradients: 4 GB at K3's widths)
GPU_BACKWARD_EXPERTS = 32
# the outputs pass through four roundings to the input dtype (h, the GLU activations, each
# expert's weighted output, out), each a relative error of up to 2**-8 in bf16
MOE_RMS_TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
# the gradients pass through the forward's roundings and as many again (each cotangent stored in
# the input dtype: the GLU halves' and the per-pair input cotangents; the GEMMs' operands)
MOE_GRAD_RMS_TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 2.5e-2}
DIFFERENTIABLE = ("x", "router_weight", "expert_gate_up", "expert_down", "latent_down", "latent_up",
                  "latent_norm_gain", "shared_gate_up", "shared_down")
TIE_GAP = 1e-4  # in s + bias: far above fp32 accumulation over the hidden width


@dataclass(frozen=True)
class MoeCase:
    name: str
    rows: int
    crowded: bool = False  # a bias sends every token to the same top_k experts, the others idle


def small_layer(spec: LayerSpec, suffix: str = "small", **changes) -> LayerSpec:
    """The spec's structure (latent or not, shared experts or not, activation, router options,
    expert weight format) at widths the interpreter runs in seconds; none a power of two but the
    experts' input widths of MXFP4 weights, whole blocks of 32 (w = 32 or, at full width, d = 64;
    F = 64)."""
    p = spec.params
    mxfp4 = p["expert_weight_format"] == "mxfp4"
    small = {"hidden_size": 40, "latent_dim": (32 if mxfp4 else 24) if p["latent_dim"] else 0,
             "num_experts": min(p["num_experts"], 12), "top_k": min(p["top_k"], 4),
             "expert_ffn_dim": 64 if mxfp4 else 20, "num_shared_experts": min(p["num_shared_experts"], 2),
             "shared_ffn_dim": 12 if p["num_shared_experts"] and p["shared_ffn_dim"] else 0, **changes}
    if mxfp4 and not small["latent_dim"]:  # the experts read the hidden width
        small["hidden_size"] = 64
    return dataclasses.replace(spec, name=f"{spec.name}_{suffix}", params={**p, **small})


def gpu_layer(spec: LayerSpec, experts: int = GPU_EXPERTS) -> LayerSpec:
    E = min(spec.params["num_experts"], experts)
    if E == spec.params["num_experts"]:
        return spec
    return dataclasses.replace(spec, name=f"{spec.name}_{E}experts",
                               params={**spec.params, "num_experts": E, "top_k": min(spec.params["top_k"], E)})


def quick_moe_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[MoeCase]]]:
    layer = gpu_layer(spec) if on_gpu else small_layer(spec)
    yield layer, "route", [MoeCase("R5", 5)]
    yield layer, "moe_decode", [MoeCase("R5", 5)]
    if trains(spec):  # bf16 weights: the default dispatch table runs the warp plan too
        yield layer, "moe_decode_warp", [MoeCase("R3", 3)]
    yield layer, "moe_prefill", [MoeCase("R37, crowded experts", 37, crowded=True)]
    if trains(spec):
        yield gpu_layer(spec, GPU_BACKWARD_EXPERTS) if on_gpu else layer, "moe_backward", [MoeCase("R37", 37)]


def trains(spec: LayerSpec) -> bool:
    """Whether the spec's module has moe_backward (MXFP4 expert weights have none)."""
    return spec.params["expert_weight_format"] == "bf16"


def moe_cases(spec: LayerSpec, on_gpu: bool) -> Iterator[tuple[LayerSpec, str, list[MoeCase]]]:
    """Both schedules at one row, a few rows and more, crowded experts; on the GPU also the
    spec's widths up to 2048 rows."""
    structures = [small_layer(spec), small_layer(spec, "full_width", latent_dim=0),
                  small_layer(spec, "no_shared", num_shared_experts=0, shared_ffn_dim=0)]
    for layer, large in [(gpu_layer(spec), True)] * on_gpu + [(s, False) for s in structures]:
        yield layer, "route", [MoeCase("R33", 33)]
        for decode in ("moe_decode", "moe_decode_warp") if trains(spec) else ("moe_decode",):
            yield layer, decode, [MoeCase(f"R{r}", r) for r in ((1, 16, 32) if large else (1, 5))] + [
                MoeCase("R7, crowded experts", 7, crowded=True)]
        yield layer, "moe_prefill", [MoeCase(f"R{r}", r) for r in ((33, 2048) if large else (1, 37))] + [
            MoeCase(f"R{300 if large else 37}, crowded experts", 300 if large else 37, crowded=True)]
        if trains(spec) and not large:
            yield layer, "moe_backward", [MoeCase("R1", 1), MoeCase("R37", 37),
                                          MoeCase("R37, crowded experts", 37, crowded=True)]
    if trains(spec) and on_gpu:
        yield gpu_layer(spec, GPU_BACKWARD_EXPERTS), "moe_backward", [
            MoeCase("R256", 256), MoeCase("R300, crowded experts", 300, crowded=True)]


def boundary_gaps(scores: torch.Tensor, top_k: int, every_rank: bool) -> torch.Tensor:
    """Per row, the gap in s + bias at the top-k boundary (every_rank: the least gap between
    neighbouring ranks down to it)."""
    if top_k == scores.shape[1]:  # every expert chosen: no boundary
        return torch.full(scores.shape[:1], math.inf, dtype=scores.dtype, device=scores.device)
    ranked = scores.sort(dim=-1, descending=True).values[:, :top_k + 1]
    gaps = ranked[:, :-1] - ranked[:, 1:]
    return gaps.min(-1).values if every_rank else gaps[:, -1]


def routing_inputs(layer_op, case: MoeCase, dtype, device, gen, every_rank: bool) -> dict:
    d, E, k = (getattr(layer_op, n).value.data for n in ("hidden_size", "num_experts", "top_k"))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = randn(case.rows, d)
    router_weight = (randn(E, d) * 2 / math.sqrt(d)).to(device, dtype)
    router_bias = 0.1 * randn(E)
    if case.crowded:
        chosen = torch.randperm(E, generator=gen)[:k]
        router_bias[chosen] += 10 + torch.arange(k, dtype=torch.float64)
    router_bias = router_bias.to(device, torch.float32)
    for _ in range(100):
        cast = x.to(device, dtype)
        scores = torch.sigmoid(cast.double() @ router_weight.double().T) + router_bias.double()
        near = (boundary_gaps(scores, k, every_rank) <= TIE_GAP).cpu()
        if not near.any():
            return {"x": cast, "router_weight": router_weight, "router_bias": router_bias}
        x[near] = randn(int(near.sum()), d)
    raise AssertionError("no routing inputs without near ties in 100 draws")


def expert_weights(layer_op, dtype, device, gen) -> dict:
    """Fresh weights in reference.latent_moe's layouts, scaled so that activations stay O(1);
    drawn on the device (at K3's widths they are gigabytes)."""
    value = lambda name: getattr(layer_op, name).value.data  # noqa: E731
    d, l, E, F = value("hidden_size"), value("latent_dim"), value("num_experts"), value("expert_ffn_dim")
    S, Fs = value("num_shared_experts"), value("shared_ffn_dim")
    w = l or d
    device_gen = torch.Generator(device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))

    def randn(*shape, scale: float, shift: float = 0.0):
        return (torch.randn(*shape, generator=device_gen, device=device) * scale + shift).to(dtype)

    out = {"expert_gate_up": randn(E, 2 * F, w, scale=1 / math.sqrt(w)),
           "expert_down": randn(E, w, F, scale=1 / math.sqrt(F))}
    if l:
        out |= {"latent_down": randn(l, d, scale=1 / math.sqrt(d)), "latent_up": randn(d, l, scale=1 / math.sqrt(l)),
                "latent_norm_gain": randn(l, scale=0.2, shift=1.0)}
    if S and Fs:
        out |= {"shared_gate_up": randn(S, 2 * Fs, d, scale=1 / math.sqrt(d)),
                "shared_down": randn(S, d, Fs, scale=1 / math.sqrt(Fs))}
    return out


def run_moe_case(layer, entry: str, layer_op, case: MoeCase, dtype, device, gen):
    routing = routing_inputs(layer_op, case, dtype, device, gen, every_rank=entry == "route")
    ids, weights = reference.latent_moe_routing(layer_op, **routing)
    if entry == "route":
        out_ids, out_weights = layer.route(**routing)
        # the experts exactly, in order: a wrong one shows as a difference of at least 1
        return [("topk_ids", out_ids, ids.to(out_ids.device, torch.float64)), ("topk_weights", out_weights, weights)]
    arguments = routing | expert_weights(layer_op, dtype, device, gen)
    if entry == "moe_backward":
        return backward_rows(layer, layer_op, arguments, gen)
    if layer_op.weight_format == "mxfp4":  # packed by the module itself; the reference dequantises them
        arguments |= layer.pack_expert_weights(arguments.pop("expert_gate_up"), arguments.pop("expert_down"))
    (out,) = getattr(layer, entry)(**arguments)
    return [("out", out, reference.latent_moe(layer_op, **arguments))]


def backward_rows(layer, layer_op, arguments: dict, gen) -> list:
    """moe_forward, then moe_backward on what it saved and a fresh output cotangent, against
    autograd of reference.latent_moe: the output and every gradient."""
    x = arguments["x"]
    saved = dict(zip(layer.module.OUTPUT_DTYPES["moe_forward"], layer.moe_forward(**arguments), strict=True))
    out = saved.pop("out")
    dout = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.device, x.dtype)
    grads = layer.moe_backward(**arguments, **saved, dout=dout)
    leaf_dtype = torch.float64 if x.device.type == "cpu" else torch.float32
    leaves = {n: t.detach().to(leaf_dtype).requires_grad_(n in DIFFERENTIABLE) for n, t in arguments.items()}
    ref = reference.latent_moe(layer_op, **leaves)
    ref.backward(dout.to(torch.float64))
    names = [n[1:] for n in layer.module.OUTPUT_DTYPES["moe_backward"]]
    return [("out", out, ref.detach()), *((f"d{n}", g, leaves[n].grad.double()) for n, g in zip(names, grads, strict=True))]


def moe_tolerance(entry: str, tensor: str, dtype) -> float:
    """The chosen experts exactly; the routing weights as fp32 arithmetic on the same inputs
    gives them; the layer's output per MOE_RMS_TOLERANCE, the gradients per MOE_GRAD_RMS_TOLERANCE."""
    if entry == "moe_backward" and tensor != "out":
        return MOE_GRAD_RMS_TOLERANCE[dtype]
    return {"topk_ids": 0.0, "topk_weights": 1e-5}.get(tensor, MOE_RMS_TOLERANCE[dtype])
