"""lower-moe-experts{decode=warp}: moe_decode split by output neurons (the token's slots a tile
axis of the GLU kernel, teams of slots reduced in registers in the down kernel) against
reference.latent_moe in float64, in the interpreter in fp32 (K3's structure in bf16 too), outputs
and workspaces poisoned (NaN, conftest); and the plan's options."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_matches, assert_rms, layer_op
from k3compile.ir import k3s, reference
from test_moe import LAYERS, inputs_of, layer_name

# teams of 2 slots (top_k 3, 5: a partial last team), blocks of 8 output and 16 input columns
# (several of each at these widths); the GLU tile holds all top_k slots padded to a power of two
WARP = "lower-moe-routing,lower-moe-experts{decode=warp warp-slots=2 warp-block-n=8 warp-block-d=16}"


@pytest.fixture(scope="module", params=LAYERS, ids=layer_name)
def layer(request, compile_layer):
    d, l, E, k, F, S, Fs, activation = request.param  # noqa: E741
    return compile_layer(pipeline=WARP, name=layer_name(request.param) + "_warp", kind="latent_moe", hidden_size=d,
                         latent_dim=l, num_experts=E, top_k=k, expert_ffn_dim=F, num_shared_experts=S,
                         shared_ffn_dim=Fs, activation=activation, dtype="float32")


def assert_decode(layer, arguments: dict) -> None:
    (out,) = layer.moe_decode(**arguments)
    ref = reference.latent_moe(layer_op(layer), **arguments)
    assert out.dtype == arguments["x"].dtype and out.shape == arguments["x"].shape
    assert_matches(out, ref, "moe_decode out (warp)", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


# one token, and several (R = 5; 3 and 7 took the same launches: the warp plan's launch_by_rows
# buckets start at 16 rows; test_warp_decode_repeated_experts runs 7)
@pytest.mark.parametrize("R", [1, 5])
def test_warp_decode_matches_reference(layer, R):
    torch.manual_seed(100 + R)
    assert_decode(layer, inputs_of(layer.spec.params, R))


def test_warp_decode_repeated_experts(layer):
    """Every token routed to the same top_k experts (a bias for them, distinct: no ties): each
    expert's rows streamed by every token's programs, the other experts idle."""
    torch.manual_seed(7)
    p = layer.spec.params
    arguments = inputs_of(p, 7)
    chosen = torch.randperm(p["num_experts"])[:p["top_k"]]
    arguments["router_bias"][chosen] += 10 + torch.arange(p["top_k"], dtype=torch.float32)
    assert_decode(layer, arguments)


def test_warp_kernels_are_the_plan(layer):
    """moe_decode runs the warp plan's two kernels and no per-pair kernel: the GLU's slot tile
    holds every slot (top_k padded to a power of two), the down projection's teams are 2."""
    k = layer.spec.params["top_k"]
    # moe_decode's kernels (the default dispatch table's split bucket adds moe_decode_split's beside them)
    name = layer.spec.name
    kernels = [op for op in layer.compilation.scheduled.walk() if isinstance(op, k3s.KernelOp)
               and op.sym_name.data.startswith(f"{name}_decode_")
               and not op.sym_name.data.startswith(f"{name}_decode_split_")]
    ops = {type(op): op for kernel in kernels for op in kernel.walk()
           if isinstance(op, (k3s.ProjectTokenSlotsOp, k3s.SumExpertRowsOp, k3s.ProjectSlotsOp))}
    assert k3s.ProjectSlotsOp not in ops
    assert ops[k3s.ProjectTokenSlotsOp].slots.value.data == 1 << (k - 1).bit_length()
    assert ops[k3s.SumExpertRowsOp].slots.value.data == 2
    # every launch by rows of moe_decode takes 2..7 rows in one bucket: test_warp_decode_matches_reference's R = 5
    # runs what 3 and 7 would
    decode = [op for op in layer.compilation.scheduled.walk() if isinstance(op, k3s.LaunchByRowsOp)
              and op.kernel.string_value().startswith(f"{name}_decode_")
              and not op.kernel.string_value().startswith(f"{name}_decode_split_")]
    assert decode and min(op.max_rows.value.data for op in decode) >= 7


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_warp_decode_k3_structure(compile_layer, dtype):
    """K3's structure made tiny: top-16 of 32 experts (the GLU's slot tile 16 wide, the down
    projection's teams 8 of 2 slots), the latent half of d, two shared experts, SiTU-GLU. In
    bf16 too (the router's bias stays fp32): the float64 reference on the same bf16 inputs, with
    no near ties among their scores, at fla's bf16 RMS ratio 5e-3 (60 seeds: 3.5e-3 on average,
    at most 4.2e-3; the output's own rounding is 1.9e-3)."""
    layer = compile_layer(pipeline=WARP, name="moe_warp_k3", kind="latent_moe", hidden_size=64, latent_dim=32,
                          num_experts=32, top_k=16, expert_ffn_dim=48, num_shared_experts=2, shared_ffn_dim=16,
                          activation="situ_glu", dtype="float32")
    torch.manual_seed(11)
    p = layer.spec.params
    if dtype == torch.float32:
        assert_decode(layer, inputs_of(p, 3))
        return
    from test_moe_route import selection_gaps

    for _ in range(100):
        arguments = {n: t if n == "router_bias" else t.to(dtype) for n, t in inputs_of(p, 3).items()}
        gaps = selection_gaps(arguments["x"], arguments["router_weight"], arguments["router_bias"], p["top_k"])
        if (gaps > 1e-4).all():
            break
    (out,) = layer.moe_decode(**arguments)
    assert out.dtype == dtype and out.shape == arguments["x"].shape
    assert_rms(out, reference.latent_moe(layer_op(layer), **arguments), "moe_decode out (warp, bf16)", 5e-3)


@pytest.mark.parametrize("options, words", [
    ("decode=fast", "decode must be split or warp, got fast"),
    ("decode=warp warp-slots=3", "warp-slots must be a power of two"),
    ("decode=warp warp-block-d=0", "warp-block-d must be a power of two"),
])
def test_bad_options_are_refused(compile_layer, options, words):
    with pytest.raises(Exception, match=words):
        compile_layer(pipeline=f"lower-moe-routing,lower-moe-experts{{{options}}}", name="moe_warp_bad",
                      kind="latent_moe", hidden_size=40, latent_dim=0, num_experts=6, top_k=3, expert_ffn_dim=20,
                      num_shared_experts=0, shared_ffn_dim=0, activation="swiglu", dtype="float32")
