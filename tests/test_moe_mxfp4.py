"""MXFP4 expert weights (expert_weight_format = "mxfp4"): pack_expert_weights (runtime/mxfp4.py,
imported directly) against reference.dequantize_mxfp4 and OCP's rules; the kernels' in-register
dequantisation of every byte at every scale; and moe_decode / moe_prefill in the interpreter in
fp32 against dequantise-then-reference (reference.latent_moe on the packed weights)."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from conftest import assert_matches, layer_op
from k3compile.backends.triton.runtime import emitted, mxfp4
from k3compile.ir import reference
from test_moe import decode_path, layer_name, moe_inputs

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)


def pack_one(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    packed = mxfp4.pack_expert_weights(weight, weight[:, :, :32])
    return packed["expert_gate_up_packed"], packed["expert_gate_up_scales"]


def unpacked(weight: torch.Tensor) -> torch.Tensor:
    return reference.dequantize_mxfp4(*pack_one(weight))


def test_layout_low_nibble_then_high_sixteen_further():
    """In each block of 32 inputs, byte j holds input j (low nibble) and input j + 16 (high): one
    row of codes 0..15 then 15..0, at scale 1 (amax 6)."""
    codes = torch.cat([torch.arange(16), torch.arange(15, -1, -1)])
    codes[codes == 8] = 0  # -0 packs as +0
    values = E2M1[codes % 8] * torch.where(codes >= 8, -1.0, 1.0)  # amax 6: scale 2^0
    packed, scales = pack_one(values.float().reshape(1, 1, 32))
    assert scales.tolist() == [[[127]]]
    assert packed[0, 0].tolist() == [int(codes[j] | codes[j + 16] << 4) for j in range(16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_exact_on_the_e2m1_grid(dtype):
    """Weights that are E2M1 values times a power of two per block come back exactly, zeros and
    signs included; the scales are those powers of two as OCP's rule finds them."""
    E, rows, blocks = 3, 5, 4
    codes = torch.randint(0, 16, (E, rows, blocks, 32))
    exponents = torch.randint(-20, 20, (E, rows, blocks, 1))
    weight = E2M1[codes % 8] * torch.where(codes >= 8, -1.0, 1.0) * 2.0 ** exponents
    weight = weight.reshape(E, rows, blocks * 32).to(dtype)
    assert torch.equal(unpacked(weight), weight.double())
    amax = weight.double().reshape(E, rows, blocks, 32).abs().amax(-1)
    scales = pack_one(weight)[1]
    nonzero = amax > 0
    assert torch.equal(scales[nonzero].double(), torch.floor(torch.log2(amax[nonzero])) - 2 + 127)


def test_rounds_to_nearest_ties_to_even_and_saturates():
    """Over a scale of 1 (amax in [4, 8)): midpoints go to the even code (mantissa 0), beyond 6
    saturates to 6, the sign stays."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    rounded = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    row = ties + [-t for t in ties] + [7.0, -7.5, 6.9, 0.3, -0.2, 5.1]
    expected = rounded + [-r for r in rounded] + [6.0, -6.0, 6.0, 0.5, -0.0, 6.0]
    row += [0.0] * (32 - len(row))
    expected += [0.0] * (32 - len(expected))
    out = unpacked(torch.tensor(row).reshape(1, 1, 32))
    assert out.flatten().tolist() == expected


def test_error_is_the_nearest_e2m1_value_at_the_block_scale():
    """Any weights: each comes back as the E2M1 value nearest to it over its block's scale
    2^(floor(log2 amax) - 2) (saturating), so at most a quarter of the block's amax away."""
    weight = torch.randn(4, 6, 64) * torch.logspace(-3, 3, 6)[None, :, None]
    weight[0, 0, :32] = 0.0  # an all-zero block
    out = unpacked(weight)
    blocks = weight.double().reshape(4, 6, 2, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, 2.0 ** (torch.floor(torch.log2(amax)) - 2), 1.0)
    over = (blocks / scale).abs()
    nearest = (over[..., None] - E2M1).abs().min(-1).values
    error = (out.reshape(blocks.shape) - blocks).abs() / scale
    assert (error <= nearest + 1e-12).all()
    assert (error * scale <= amax / 4).all()
    assert torch.equal(out[0, 0, :32], torch.zeros(32, dtype=torch.float64))
    assert reference.dequantize_mxfp4(*pack_one(weight)).sub(weight.double()).norm() / weight.norm() < 0.2


@pytest.mark.parametrize("weight, words", [
    (torch.randn(2, 4, 48), "in a multiple of 32"),
    (torch.randn(4, 64), "expected shape [E, rows, in]"),
    (torch.randint(0, 5, (2, 4, 32)), "expected a float tensor"),
    (torch.full((2, 4, 32), math.inf), "non-finite"),
])
def test_packing_names_a_bad_weight(weight, words):
    with pytest.raises(ValueError) as error:
        mxfp4.pack_expert_weights(torch.randn(2, 8, 32), weight)
    assert str(error.value).startswith("expert_down: ") and words in str(error.value)


@triton.jit
def dequant_kernel(packed, scales, lo, hi):
    o = tl.program_id(0) * 256 + tl.arange(0, 256)
    b_lo, b_hi = mxfp4._mxfp4_dequant(tl.load(packed + o), tl.load(scales + o))
    tl.store(lo + o, b_lo)
    tl.store(hi + o, b_hi)


def test_kernel_dequantisation_is_exact_for_every_byte_and_scale():
    """The kernels' _mxfp4_dequant (fp32 bits built from the codes and the scale) against the
    reference's table: every byte at every scale the packer writes (2..252)."""
    scale_bytes = torch.arange(2, 253)
    packed = torch.arange(256, dtype=torch.uint8).repeat(len(scale_bytes))
    scales = scale_bytes.to(torch.uint8).repeat_interleave(256)
    lo, hi = torch.empty(packed.numel()), torch.empty(packed.numel())
    dequant_kernel[(len(scale_bytes),)](packed, scales, lo, hi)
    # a block of 32 whose 16 bytes are b, b, ...: the reference's inputs j and j + 16 of it
    ref = reference.dequantize_mxfp4(packed[:, None].expand(-1, 16).contiguous(), scales[:, None])
    assert torch.equal(lo.double(), ref[:, 0]) and torch.equal(hi.double(), ref[:, 16])


# (hidden d, latent l, experts E, top_k, expert FFN F, shared experts S, shared FFN Fs, activation):
# w and F in blocks of 32, d not; full width (d = w = 64) without shared experts
MX_LAYERS = [(40, 32, 6, 3, 64, 2, 12, "situ_glu"), (64, 0, 8, 2, 32, 0, 0, "swiglu")]
PIPELINES = [None, "lower-moe-routing,lower-moe-experts{block-rows=16}"]


def compile_mx(compile_layer, p, pipeline=None):
    d, l, E, k, F, S, Fs, activation = p  # noqa: E741
    return compile_layer(pipeline=pipeline, name=layer_name(p) + "_mxfp4", kind="latent_moe", hidden_size=d,
                         latent_dim=l, num_experts=E, top_k=k, expert_ffn_dim=F, num_shared_experts=S,
                         shared_ffn_dim=Fs, activation=activation, dtype="float32", expert_weight_format="mxfp4")


def case_id(q) -> str:
    return layer_name(q[0]) + ("_blocks16" if q[1] else "")


# block-rows reaches moe_prefill only (test_block_rows_leave_the_decode_path_alone): the decode
# schedule runs on the default pipeline's layers, the prefill schedule on both
CASES = [(p, pipe) for p in MX_LAYERS for pipe in PIPELINES]
SCHEDULES = [pytest.param(q, "prefill", id=case_id(q) + "-prefill") for q in CASES] + [
    pytest.param(q, "decode", id=case_id(q) + "-decode") for q in CASES if q[1] is None]


@pytest.fixture(scope="module")
def layer(request, compile_layer):
    return compile_mx(compile_layer, *request.param)


def mx_inputs(layer, R: int) -> dict:
    """moe_inputs with the experts' weights packed by the module's own pack_expert_weights."""
    arguments = moe_inputs(layer, R)
    return arguments | layer.pack_expert_weights(arguments.pop("expert_gate_up"), arguments.pop("expert_down"))


def assert_moe(layer, arguments: dict, schedule: str) -> None:
    (out,) = layer.moe(**arguments, schedule=schedule)
    ref = reference.latent_moe(layer_op(layer), **arguments)  # dequantise, then the float64 reference
    assert_matches(out, ref, f"moe out ({schedule})", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("p", MX_LAYERS, ids=layer_name)
def test_block_rows_leave_the_decode_path_alone(compile_layer, p):
    """The packed layers' decode path (entries, kernels, router, dispatch) prints the same with
    block-rows=16: the decode schedule need not run on both pipelines."""
    want, got = (decode_path(compile_mx(compile_layer, p, pipe)) for pipe in PIPELINES)
    assert {"moe", "moe_decode"} <= set(want) and len(want) > 4, sorted(want)  # no warp decode for mxfp4
    assert got == want


@pytest.mark.parametrize("layer", CASES, ids=case_id, indirect=True)
def test_module_carries_the_packing_and_exports_it(layer):
    source = layer.path.read_text()
    assert "\n".join(emitted("mxfp4")) in source and "from k3compile" not in source
    assert "pack_expert_weights" in layer.entries
    assert "expert_gate_up_packed, expert_gate_up_scales, expert_down_packed, expert_down_scales" in source


@pytest.mark.parametrize("layer, schedule", SCHEDULES, indirect=["layer"])
@pytest.mark.parametrize("R", [1, 5, 37])
def test_matches_dequantised_reference(layer, R, schedule):
    torch.manual_seed(R)
    assert_moe(layer, mx_inputs(layer, R), schedule)


@pytest.mark.parametrize("layer, schedule", SCHEDULES, indirect=["layer"])
def test_crowded_and_idle_experts(layer, schedule):
    torch.manual_seed(1)
    arguments = mx_inputs(layer, 37)
    k = layer.spec.params["top_k"]
    chosen = torch.randperm(layer.spec.params["num_experts"])[:k]
    arguments["router_bias"][chosen] += 10 + torch.arange(k, dtype=torch.float32)
    assert_moe(layer, arguments, schedule)


@pytest.mark.parametrize("name, change, words", [
    ("expert_gate_up_packed", lambda a: {**a, "expert_gate_up_packed": a["expert_gate_up_packed"].float()},
     "expected a torch.uint8 tensor (two E2M1 codes a byte"),
    ("expert_down_scales", lambda a: {**a, "expert_down_scales": a["expert_down_scales"].to(torch.int32)},
     "expected a torch.uint8 tensor (E8M0 scales"),
    ("expert_gate_up_scales", lambda a: {**a, "expert_gate_up_scales": a["expert_gate_up_scales"][..., :-1]},
     "dim 2 of shape [6,128,1] must be size 1"),
    ("expert_down_packed", lambda a: {**a, "expert_down_packed": a["expert_down_packed"][:, :, :16]},
     "dim 2 of shape [6,32,32]"),
    ("expert_down_packed", lambda a: {**a, "expert_down_packed": a["expert_down_packed"].transpose(1, 2)},
     "must be contiguous"),
    ("expert_gate_up_scales", lambda a: {**a, "expert_gate_up_scales": None}, "required, got None"),
])
@pytest.mark.parametrize("schedule", ["decode", "prefill"])
def test_bad_packed_inputs_name_the_tensor(compile_layer, name, change, words, schedule):
    layer = compile_mx(compile_layer, MX_LAYERS[0])
    arguments = change(mx_inputs(layer, 4))
    with pytest.raises(ValueError) as error:
        layer.moe(**arguments, schedule=schedule)
    message = str(error.value)
    assert message.startswith(f"{name}: ") and words in message and "\n" not in message


def test_dense_weights_are_refused_by_name(compile_layer):
    """bf16 weights passed to an mxfp4 layer under the packed names: the dtype says what to do."""
    layer = compile_mx(compile_layer, MX_LAYERS[0])
    arguments = mx_inputs(layer, 2)
    dense = moe_inputs(layer, 2)
    with pytest.raises(ValueError, match="^expert_gate_up_packed: expected a torch.uint8 tensor .*pack_expert_weights"):
        layer.moe(**arguments | {"expert_gate_up_packed": dense["expert_gate_up"]})


def test_layer_widths_must_hold_whole_blocks(compile_layer):
    from k3compile.errors import SpecError

    with pytest.raises(SpecError, match="expert_weight_format = mxfp4 .* expert_ffn_dim must be a multiple of 32, got 20"):
        compile_mx(compile_layer, (40, 32, 6, 3, 20, 0, 0, "swiglu"))
    with pytest.raises(SpecError, match="so hidden_size must be a multiple of 32, got 40"):  # full width: w = d
        compile_mx(compile_layer, (40, 0, 6, 3, 32, 0, 0, "swiglu"))
