"""k3compile.ops.moe.latent_moe: the LatentMoE layer as a differentiable torch operator (custom op,
fake implementations, autograd through the derived moe_backward), eager and under
torch.compile(fullgraph=True), against float64 autograd of reference.latent_moe; its refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import assert_matches, one_line
from k3compile.ops.moe import BLOCK_ROWS, MoeKey, latent_moe
from k3compile.passes.derive_moe_backward import DeriveMoeBackwardPass
from k3compile.spec import spec_from_table
from test_moe import inputs_of
from test_moe_backward import DIFFERENTIABLE, reference_gradients

pytestmark = pytest.mark.usefixtures("own_ops_cache")

# latent and shared experts, SiTU-GLU; full width without shared experts, SwiGLU
KEYS = [MoeKey(hidden_size=40, num_experts=6, top_k=3, expert_ffn_dim=20, latent_dim=24, num_shared_experts=2,
               shared_ffn_dim=12, activation="situ_glu"),
        MoeKey(hidden_size=36, num_experts=7, top_k=2, expert_ffn_dim=18, activation="swiglu")]


def reference_op(key: MoeKey):
    from k3compile.frontend import spec_to_module

    return next(iter(spec_to_module(spec_from_table(key.table(), source="<test>")).ops))


def arguments(key: MoeKey, R: int) -> dict:
    tensors = inputs_of(dataclasses.asdict(key), R)
    return {name: tensors.get(name) for name in ("x", "router_weight", "router_bias", *DIFFERENTIABLE[2:])}


def grads_of(function, tensors: dict, dout: torch.Tensor) -> tuple[torch.Tensor, dict]:
    leaves = {n: t.clone().requires_grad_(n in DIFFERENTIABLE) if t is not None else None for n, t in tensors.items()}
    out = function(leaves)
    out.backward(dout)
    return out.detach(), {n: t.grad for n, t in leaves.items() if t is not None and n in DIFFERENTIABLE}


@pytest.mark.parametrize("key", KEYS, ids=["latent_shared", "full_width"])
def test_gradients_eager_and_compiled(key):
    torch.manual_seed(11)
    tensors = arguments(key, 9)
    dout = torch.randn_like(tensors["x"])
    ref, ref_grads = reference_gradients(reference_op(key), {n: t for n, t in tensors.items() if t is not None}, dout)

    def step(leaves):
        return latent_moe(**leaves, layer=key)

    for function, what in ((step, "eager"), (torch.compile(step, fullgraph=True, backend="aot_eager"), "compiled")):
        out, grads = grads_of(function, tensors, dout)
        assert_matches(out, ref, f"{what} out", rms_tol=1e-5, atol=1e-4, rtol=1e-4)
        assert set(grads) == set(ref_grads)
        for name, grad in grads.items():
            assert grad.dtype == tensors[name].dtype, f"{what} d{name} dtype"
            assert_matches(grad, ref_grads[name], f"{what} d{name}", rms_tol=2e-5, atol=2e-4, rtol=2e-4)
    with torch.no_grad():  # the inference path: moe, decode or prefill by the rows
        assert_matches(latent_moe(**tensors, layer=key), ref, "no_grad out", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


def test_compiled_step_over_token_counts():
    """torch.compile(fullgraph) over calls of 5, 17 and 40 tokens: after the first, the token count
    is symbolic in the fake implementations (the pair list's length from it), each call's gradients
    still autograd's."""
    key = KEYS[1]
    compiled = torch.compile(lambda leaves: latent_moe(**leaves, layer=key), fullgraph=True, backend="aot_eager")
    for R in (5, 17, 40):
        torch.manual_seed(R)
        tensors = arguments(key, R)
        dout = torch.randn_like(tensors["x"])
        ref, ref_grads = reference_gradients(reference_op(key), {n: t for n, t in tensors.items() if t is not None},
                                             dout)
        out, grads = grads_of(compiled, tensors, dout)
        assert_matches(out, ref, f"R={R} out", rms_tol=1e-5, atol=1e-4, rtol=1e-4)
        for name, grad in grads.items():
            assert_matches(grad, ref_grads[name], f"R={R} d{name}", rms_tol=2e-5, atol=2e-4, rtol=2e-4)


def test_fake_shapes_follow_the_pass():
    """The fake implementation sizes the pair list by derive-moe-backward's block rows."""
    assert BLOCK_ROWS == DeriveMoeBackwardPass.block_rows


def test_a_spec_file_gives_its_key(tmp_path):
    path = tmp_path / "moe.toml"
    path.write_text('[layer]\nname = "m"\nkind = "latent_moe"\nhidden_size = 40\nnum_experts = 6\ntop_k = 3\n'
                    'expert_ffn_dim = 20\nlatent_dim = 24\nnum_shared_experts = 2\nshared_ffn_dim = 12\n'
                    'activation = "situ_glu"\n')
    assert MoeKey.of(path) == KEYS[0]


def refusal(key: MoeKey, change: dict) -> str:
    tensors = arguments(key, 5) | change
    with pytest.raises(ValueError) as error:
        latent_moe(**tensors, layer=key)
    assert one_line(str(error.value))
    return str(error.value)


@pytest.mark.parametrize("change, words", [
    (lambda t: {"x": t["x"][:, :-1]}, "x: expected shape [5, 40], got [5, 39]"),
    (lambda t: {"x": t["x"][None]}, "x: expected a tensor [R, 40], got [1, 5, 40]"),
    (lambda t: {"expert_down": t["expert_down"].transpose(1, 2)}, "expert_down: expected shape [6, 24, 20]"),
    (lambda t: {"latent_up": t["latent_up"].double()}, "latent_up: expected dtype torch.float32"),
    (lambda t: {"router_bias": t["router_bias"].half()}, "router_bias: expected dtype torch.float32"),
    (lambda t: {"shared_down": None}, "shared_down: expected a tensor"),
    (lambda t: {"router_bias": t["router_bias"].requires_grad_()}, "router_bias: requires grad"),
    (lambda t: {"x": t["x"].to(torch.int64)}, "x: expected dtype"),
])
def test_bad_input_is_refused_in_one_line(change, words):
    tensors = arguments(KEYS[0], 5)
    assert words in refusal(KEYS[0], change(tensors))


def test_stages_the_layer_has_not_are_refused():
    tensors = arguments(KEYS[0], 5)
    message = refusal(KEYS[1], {"x": torch.randn(5, 36), "latent_up": tensors["latent_up"]})
    assert message.startswith("latent_up: the layer has no such stage")


def test_a_spec_of_another_kind_or_mxfp4_is_refused():
    with pytest.raises(ValueError, match="layer: expected a latent_moe spec"):
        MoeKey.of(spec_from_table({"name": "a", "kind": "attnres", "hidden_size": 16, "num_blocks": 2,
                                   "block_size": 1}))
    mxfp4 = spec_from_table({**KEYS[0].table(), "name": "m", "expert_weight_format": "mxfp4", "latent_dim": 32,
                             "expert_ffn_dim": 32})
    with pytest.raises(ValueError, match="has no backward"):
        MoeKey.of(mxfp4)
