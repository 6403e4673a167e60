"""The LatentMoE layer's derived backward (derive-moe-backward): moe_forward + moe_backward against
float64 torch autograd of reference.latent_moe, in the interpreter in fp32, outputs and
workspaces NaN-poisoned (conftest); each adjoint op's printed formula against autograd in
float64; k3compile.ops.moe.latent_moe as a differentiable custom op (torch.compile included)
and its refusals."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from conftest import assert_matches, layer_op
from k3compile.ir import k3s, reference
from k3compile.passes.common import make
from test_moe import inputs_of

# (hidden d, latent l, experts E, top_k, expert FFN F, shared experts S, shared FFN Fs, activation):
# no power of two; full width without shared experts; every expert chosen by every token; full
# width with shared experts and more experts than pairs at one token (idle experts)
LAYERS = [(40, 24, 6, 3, 20, 2, 12, "situ_glu"), (48, 0, 8, 2, 24, 0, 0, "swiglu"),
          (36, 20, 5, 5, 17, 1, 10, "swiglu"), (40, 0, 12, 4, 16, 2, 8, "situ_glu")]
# blocks of 16 pairs (several per expert at 37 tokens), partial row dots over two column blocks
# of 16 and dense weight gradients in steps of 16 rows: every loop of the backward runs more
# than once; the default options (one block) on the first layer
SMALL_BLOCKS = ("lower-moe-routing,lower-moe-experts,derive-moe-backward{block-rows=16 dgrad-block-n=16 "
                "dgrad-block-d=16 wgrad-block-r=16 wgrad-block-n=16 wgrad-block-d=16 row-block=4},outline-kernels")
DIFFERENTIABLE = ("x", "router_weight", "expert_gate_up", "expert_down", "latent_down", "latent_up",
                  "latent_norm_gain", "shared_gate_up", "shared_down")


def layer_name(p) -> str:
    return "moe_bwd_d{}_l{}_e{}_k{}_f{}_s{}x{}_{}".format(*p)


# the GLU's adjoint in a row kernel of its own and the routed experts' weight gradients on
# contiguous copies of their gathered rows (two column blocks of the row kernels: two partials)
KERNEL_FORMS = SMALL_BLOCKS.replace("row-block=4", "row-block=4 glu-adjoint=kernel sorted-wgrad-rows=copy "
                                    "row-kernel-block-n=16")


def pipeline_name(pipeline: str | None) -> str:
    return {None: "", SMALL_BLOCKS: "_blocks16", KERNEL_FORMS: "_blocks16_glu_kernel_wgrad_copy"}[pipeline]


# (layer, pipeline): the small blocks for every structure, the default blocks for the first, the
# small blocks with the GLU's adjoint kernel and the weight gradients' row copies for every structure
CASES = [pytest.param((p, pipeline), id=layer_name(p) + pipeline_name(pipeline))
         for p, pipeline in [*((p, SMALL_BLOCKS) for p in LAYERS), (LAYERS[0], None),
                             *((p, KERNEL_FORMS) for p in LAYERS)]]


@pytest.fixture(scope="module")
def layer(request, compile_layer):
    (d, l, E, k, F, S, Fs, activation), pipeline = request.param  # noqa: E741
    return compile_layer(pipeline=pipeline, name=layer_name(request.param[0]) + pipeline_name(pipeline),
                         kind="latent_moe", hidden_size=d,
                         latent_dim=l, num_experts=E, top_k=k, expert_ffn_dim=F, num_shared_experts=S,
                         shared_ffn_dim=Fs, activation=activation, dtype="float32")


def reference_gradients(op, arguments: dict, dout: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """reference.latent_moe in float64 and every differentiable input's gradient by autograd."""
    leaves = {n: v.detach().double().requires_grad_(n in DIFFERENTIABLE) for n, v in arguments.items()}
    out = reference.latent_moe(op, **leaves)
    out.backward(dout.double())
    return out.detach(), {n: v.grad for n, v in leaves.items() if n in DIFFERENTIABLE}


def compiled_gradients(layer, arguments: dict, dout: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """moe_forward, then moe_backward on what it saved: (out, {input: gradient})."""
    forward = dict(zip(layer.module.OUTPUT_DTYPES["moe_forward"], layer.moe_forward(**arguments), strict=True))
    out = forward.pop("out")
    grads = layer.moe_backward(**arguments, **forward, dout=dout)
    return out, {n[1:]: g for n, g in zip(layer.module.OUTPUT_DTYPES["moe_backward"], grads, strict=True)}


def assert_gradients(layer, arguments: dict, what: str) -> dict:
    """The compiled out and gradients against float64 autograd; returns the compiled gradients."""
    dout = torch.randn_like(arguments["x"])
    out, grads = compiled_gradients(layer, arguments, dout)
    ref, ref_grads = reference_gradients(layer_op(layer), arguments, dout)
    assert_matches(out, ref, f"{what}: out", rms_tol=1e-5, atol=1e-4, rtol=1e-4)
    assert set(grads) == set(ref_grads), f"{what}: gradients of {sorted(grads)}, the layer reads {sorted(ref_grads)}"
    for name, grad in grads.items():
        assert grad.shape == arguments[name].shape, f"{what}: d{name} shape"
        assert_matches(grad, ref_grads[name], f"{what}: d{name}", rms_tol=2e-5, atol=2e-4, rtol=2e-4)
    return grads


@pytest.mark.parametrize("layer", CASES, indirect=True)
@pytest.mark.parametrize("R", [1, 7, 37])
def test_gradients_match_float64_autograd(layer, R):
    torch.manual_seed(100 + R)
    assert_gradients(layer, inputs_of(layer.spec.params, R), f"R={R}")


@pytest.mark.parametrize("layer", CASES[:4] + CASES[5:], indirect=True)
def test_crowded_and_idle_experts(layer):
    """A bias that sends every token to the same top_k experts: those get every pair (runs of
    several blocks), the others none (no block, no gradient rows: their weights' gradients are 0)."""
    torch.manual_seed(3)
    p = layer.spec.params
    arguments = inputs_of(p, 37)
    chosen = torch.randperm(p["num_experts"])[:p["top_k"]]
    arguments["router_bias"][chosen] += 10 + torch.arange(p["top_k"], dtype=torch.float32)
    grads = assert_gradients(layer, arguments, "crowded")
    if p["top_k"] < p["num_experts"]:
        idle = [e for e in range(p["num_experts"]) if e not in chosen.tolist()]
        assert grads["expert_down"][idle].abs().max() == 0 and grads["expert_gate_up"][idle].abs().max() == 0


@pytest.mark.parametrize("layer", CASES[:4], indirect=True)
def test_extreme_gate_values(layer):
    """Large inputs: the GLU's gates far in both tails (sigmoid, tanh saturated), still finite and matching."""
    torch.manual_seed(5)
    arguments = inputs_of(layer.spec.params, 7)
    arguments["expert_gate_up"] = arguments["expert_gate_up"] * 8
    assert_gradients(layer, arguments, "large gates")


@pytest.mark.parametrize("layer", CASES[:2], indirect=True)
def test_backward_is_deterministic(layer):
    torch.manual_seed(6)
    arguments = inputs_of(layer.spec.params, 37)
    dout = torch.randn_like(arguments["x"])
    first, again = (compiled_gradients(layer, arguments, dout)[1] for _ in range(2))
    for name in first:
        assert torch.equal(first[name], again[name]), f"d{name} differs between two runs"


@pytest.mark.parametrize("layer", CASES[:1], indirect=True)
@pytest.mark.parametrize("crowded", [False, True])
def test_training_pair_list_is_in_pair_order(layer, crowded):
    """moe_forward's sorted pair list (k3s.rank_pairs, k3s.chunk_offsets): every pair once, in a block
    of its expert, each expert's run holding its pairs in increasing order (the order the weight
    gradients sum in: no atomic decides it), runs in expert order, padded to whole blocks."""
    torch.manual_seed(9)
    p = layer.spec.params
    arguments = inputs_of(p, 37)
    if crowded:  # runs of several blocks: more than one chunk of pairs counts towards an expert
        arguments["router_bias"][:p["top_k"]] += 10
    saved = dict(zip(layer.module.OUTPUT_DTYPES["moe_forward"], layer.moe_forward(**arguments), strict=True))
    ids = saved["topk_ids"].flatten().long()
    sorted_pairs, block_expert, offsets = (saved[n].long() for n in ("sorted_pairs", "block_expert", "expert_offsets"))
    BM = sorted_pairs.numel() // block_expert.numel()
    for e in range(p["num_experts"]):
        run = sorted_pairs[offsets[e]:offsets[e + 1]]
        expected = torch.nonzero(ids == e).flatten()
        assert torch.equal(run[:expected.numel()], expected), f"expert {e}'s run is not its pairs in order"
        assert (run[expected.numel():] == -1).all() and run.numel() == -(-expected.numel() // BM) * BM
        assert (block_expert[offsets[e] // BM:offsets[e + 1] // BM] == e).all()
    assert (sorted_pairs[offsets[-1]:] == -1).all()


# --- each adjoint op's printed formula, in float64 ---------------------------------------


def fake_tl() -> types.SimpleNamespace:
    """The triton.language functions the elementwise adjoints print, on float64 numpy arrays."""
    return types.SimpleNamespace(sigmoid=lambda x: 1 / (1 + np.exp(-x)), sum=lambda x, axis: x.sum(axis=axis),
                                 where=np.where, zeros=lambda shape, dtype: np.zeros(shape), float32=None)


def run_printed(op, registers: dict, **names) -> dict:
    """Execute the Triton the printer writes for op with numpy in float64; the registers after."""
    from k3compile.backends.triton.printer import TritonPrinter

    printer = TritonPrinter()
    getattr(printer, "print_" + op.name.replace(".", "_"))(op)
    scope = {"tl": fake_tl(), **{f"b_{n}": v for n, v in registers.items()}, **names}
    exec(printer.code.text(), scope)  # noqa: S102 - the printer's own output
    return scope


def tiles(*names: str, dims=("M", "N")) -> list:
    return [make(k3s.ZerosOp, result=(name, k3s.tile(*dims))).results[0] for name in names]


@pytest.mark.parametrize("activation", ["swiglu", "situ_glu"])
def test_glu_adjoint_is_the_glu_derivative(activation):
    torch.manual_seed(7)
    g, u, bar = (torch.randn(5, 9, dtype=torch.float64) * 6 for _ in range(3))
    g.requires_grad_(), u.requires_grad_()
    reference.glu(activation, g, u).backward(bar)
    op = make(k3s.GluAdjointOp, operands=tiles("g", "u", "act_bar"), activation=activation,
              results=[("g_bar", k3s.tile("M", "N")), ("u_bar", k3s.tile("M", "N"))])
    scope = run_printed(op, {"g": g.detach().numpy(), "u": u.detach().numpy(), "act_bar": bar.numpy()})
    np.testing.assert_allclose(scope["b_g_bar"], g.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(scope["b_u_bar"], u.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalize", [True, False])
def test_router_adjoints_are_the_routing_derivative(normalize):
    """The router's chain past the selection: the chosen scores' cotangent through the
    normalisation, scattered to their experts, through the sigmoid, against autograd."""
    torch.manual_seed(8)
    R, E, k, BKS, scale = 3, 7, 3, 4, 2.5
    logits = torch.randn(R, E, dtype=torch.float64, requires_grad=True)
    ids = torch.stack([torch.randperm(E)[:k] for _ in range(R)])
    s = torch.sigmoid(logits)
    w = s.gather(1, ids)
    weights = scale * (w / (w.sum(1, keepdim=True) + reference.ROUTING_SUM_EPS) if normalize else w)
    bar = torch.randn(R, k, dtype=torch.float64)
    weights.backward(bar)
    pad = lambda t, v: np.concatenate([t, np.full((R, BKS - k), v)], axis=1)  # noqa: E731 - the padded slots
    w_t, s_t, ids_t, bar_t = tiles("w", "s", "ids", "weights_bar", dims=("R", "KS"))
    names = dict(o_ks=np.arange(BKS), o_e=np.arange(E), TOP_K=k, BR=R, BE=E)
    adjoint = make(k3s.RoutingWeightsAdjointOp, operands=[w_t, bar_t], normalize=normalize, scale=scale,
                   result=("w_bar", k3s.tile("R", "KS")))
    scope = run_printed(adjoint, {"w": pad(w.detach().numpy(), 0.0), "weights_bar": pad(bar.numpy(), 0.0)})
    scatter = make(k3s.SelectTopKAdjointOp, operands=[ids_t, adjoint.results[0]], result=("s_bar", k3s.tile("R", "E")))
    scope = run_printed(scatter, {"ids": pad(ids.numpy(), 0), "w_bar": scope["b_w_bar"]}, **names)
    sigmoid = make(k3s.RouterSigmoidAdjointOp, operands=[s_t, scatter.results[0]], result=("logits_bar", k3s.tile("R", "E")))
    scope = run_printed(sigmoid, {"s": s.detach().numpy(), "s_bar": scope["b_s_bar"]})
    np.testing.assert_allclose(scope["b_logits_bar"], logits.grad.numpy(), rtol=1e-12, atol=1e-12)
