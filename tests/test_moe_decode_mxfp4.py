"""The MXFP4 `words` layout (pack_expert_weights(..., layout="words"), runtime/mxfp4.py): the
kernels' few-instruction dequantisation (_e2m1_words, _mxfp4_scaled) run in the interpreter
is bit-exact against the E2M1 / E8M0 definitions for every code at every input position and
every scale byte 2..252; the words layout holds the nibbles layout's codes. And the plan that
reads it, lower-moe-experts{decode=warp} on an mxfp4 layer (its moe_prefill too), in the
interpreter in fp32 against dequantise-then-reference, with its refusal of the other layout."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from conftest import assert_matches, layer_op
from k3compile.backends.triton.runtime import mxfp4
from k3compile.ir import reference
from test_moe import layer_name, moe_inputs
from test_moe_mxfp4 import MX_LAYERS, compile_mx

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)


def e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The definition: sign bit 3, magnitude codes 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6."""
    return E2M1[codes.long() % 8] * torch.where(codes >= 8, -1.0, 1.0).double()


@triton.jit
def dequantize_words(words_ptr, scales_ptr, out_ptr, n, BB: tl.constexpr):
    """BB blocks a program: each block's four words, extraction i's two lanes to inputs 16 h + 4 i
    + q (the printed kernels' _e2m1_words and _mxfp4_scaled)."""
    o_b = tl.program_id(0) * BB + tl.arange(0, BB)
    m_b = o_b < n
    o_q = tl.arange(0, 4)
    b_words = tl.load(words_ptr + o_b[:, None] * 4 + o_q[None, :], mask=m_b[:, None], other=0).to(tl.uint32,
                                                                                                  bitcast=True)
    b_scale = tl.load(scales_ptr + o_b, mask=m_b, other=0)[:, None]
    for i in tl.static_range(4):
        lo, hi = mxfp4._e2m1_words(b_words, i)
        at = out_ptr + o_b[:, None] * 32 + 4 * i + o_q[None, :]
        tl.store(at, mxfp4._mxfp4_scaled(lo, b_scale), mask=m_b[:, None])
        tl.store(at + 16, mxfp4._mxfp4_scaled(hi, b_scale), mask=m_b[:, None])


def run_words(words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The kernels' dequantisation of words-layout blocks, words [n, 4] (int32), scales [n]."""
    out = torch.full((words.shape[0], 32), float("nan"))
    dequantize_words[(triton.cdiv(words.shape[0], 256),)](words.contiguous(), scales.to(torch.int32), out,
                                                          words.shape[0], BB=256)
    return out


def test_every_code_at_every_position_and_scale_is_exact():
    """Rows of 32 codes: each code 0..15 at each input position (16 rows of rotations), at every
    scale byte 2..252 (-0 packs as a sign bit with magnitude 0: the value is -0.0)."""
    rotations = (torch.arange(32)[None, :] + torch.arange(16)[:, None]) % 16
    scale_bytes = torch.arange(2, 253, dtype=torch.uint8)
    codes = rotations.repeat(len(scale_bytes), 1).to(torch.uint8)
    scales = scale_bytes.repeat_interleave(16)
    got = run_words(mxfp4._mxfp4_words(codes).view(torch.int32), scales)
    want = e2m1(codes) * torch.pow(2.0, scales.double() - 127)[:, None]
    assert torch.equal(got.double(), want), (got.double() - want).abs().max()
    assert torch.equal(torch.signbit(got), codes >= 8), "a sign bit lost (the -0 code)"


def test_words_hold_the_nibbles_codes():
    """pack_expert_weights' two layouts, the same random weights (scales over 2^-100..2^100):
    the same scales, words as int32 [E, rows, in / 8], and the words dequantised by the kernels'
    code equal the nibbles decoded by the reference, bit for bit."""
    torch.manual_seed(5)
    weight = torch.randn(3, 4, 64) * torch.pow(2.0, torch.randint(-100, 100, (3, 4, 2)).float()).repeat_interleave(
        32, dim=2)
    nibbles = mxfp4.pack_expert_weights(weight, weight[:, :, :32])
    words = mxfp4.pack_expert_weights(weight, weight[:, :, :32], layout="words")
    assert torch.equal(nibbles["expert_gate_up_scales"], words["expert_gate_up_scales"])
    packed = words["expert_gate_up_packed"]
    assert packed.dtype == torch.int32 and packed.shape == (3, 4, 8)
    got = run_words(packed.reshape(-1, 4), words["expert_gate_up_scales"].reshape(-1))
    want = reference.dequantize_mxfp4(nibbles["expert_gate_up_packed"], nibbles["expert_gate_up_scales"])
    assert torch.equal(got.double().reshape(3, 4, 64), want)


def test_a_bad_layout_is_refused():
    weight = torch.randn(1, 2, 32)
    try:
        mxfp4.pack_expert_weights(weight, weight, layout="bytes")
    except ValueError as error:
        assert str(error) == "layout: expected 'nibbles' or 'words', got 'bytes'"
    else:
        raise AssertionError("layout='bytes' accepted")


# --- the warp plan over MXFP4 weights (lower-moe-experts{decode=warp}: packing = words) ---------

# teams of 2 slots, blocks of 16 output columns and one block of 32 inputs a step (w = 32: one
# step, F = 64: two); the layer's moe_prefill reads the words too (tl.dot, blocks of 16 pairs)
WARP = "lower-moe-routing,lower-moe-experts{decode=warp warp-slots=2 warp-block-n=16 warp-block-d=32 block-rows=16}"


@pytest.fixture(scope="module", params=MX_LAYERS, ids=lambda p: layer_name(p) + "_warp")
def warp_layer(request, compile_layer):
    return compile_mx(compile_layer, request.param, WARP)


def words_and_reference(layer, R: int) -> tuple[dict, torch.Tensor]:
    """The layer's inputs at R tokens with the experts' weights packed by the module's own
    pack_expert_weights (its default: words), and the float64 reference on the same codes in the
    nibbles layout (reference.latent_moe dequantises those)."""
    arguments = moe_inputs(layer, R)
    gate_up, down = arguments.pop("expert_gate_up"), arguments.pop("expert_down")
    nibbles = layer.pack_expert_weights(gate_up, down, layout="nibbles")
    return arguments | layer.pack_expert_weights(gate_up, down), reference.latent_moe(layer_op(layer), **arguments,
                                                                                      **nibbles)


@pytest.mark.parametrize("R", [1, 5])
def test_warp_decode_reads_words(warp_layer, R):
    """moe_decode (outputs and workspaces NaN-poisoned, conftest) against dequantise-then-reference."""
    torch.manual_seed(200 + R)
    arguments, ref = words_and_reference(warp_layer, R)
    assert arguments["expert_gate_up_packed"].dtype == torch.int32  # the module packs what it reads
    (out,) = warp_layer.moe_decode(**arguments)
    assert_matches(out, ref, "moe_decode out (warp, words)", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


def test_warp_layer_prefill_reads_words(warp_layer):
    """moe at 37 tokens runs moe_prefill: the expert-centric tl.dot projections over the words."""
    torch.manual_seed(37)
    arguments, ref = words_and_reference(warp_layer, 37)
    (out,) = warp_layer.moe(**arguments)
    assert_matches(out, ref, "moe out (prefill, words)", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


def test_nibbles_are_refused_by_the_words_module(warp_layer):
    """The words module's entries given a nibbles-packed weight: a one-line ValueError naming the
    tensor, the layout expected and the one got."""
    arguments, _ = words_and_reference(warp_layer, 2)
    weights = moe_inputs(warp_layer, 2)
    nibbles = warp_layer.pack_expert_weights(weights["expert_gate_up"], weights["expert_down"], layout="nibbles")
    for entry in (warp_layer.moe_decode, warp_layer.moe_prefill, warp_layer.moe):
        with pytest.raises(ValueError) as error:
            entry(**arguments | {"expert_down_packed": nibbles["expert_down_packed"]})
        assert str(error.value) == (
            "expert_down_packed: expected a torch.int32 tensor (the words layout: eight E2M1 codes a word: "
            "pack_expert_weights makes them), got torch.uint8 (the nibbles layout; this module reads words: "
            "pack_expert_weights(..., layout='words'))")


def test_words_are_refused_by_the_nibbles_module(compile_layer):
    """The split plan's module (nibbles) given a words-packed weight: named the same way."""
    layer = compile_mx(compile_layer, MX_LAYERS[0])
    arguments = moe_inputs(layer, 2)
    words = layer.pack_expert_weights(arguments.pop("expert_gate_up"), arguments.pop("expert_down"), layout="words")
    with pytest.raises(ValueError) as error:
        layer.moe_decode(**arguments, **words)
    assert str(error.value) == (
        "expert_gate_up_packed: expected a torch.uint8 tensor (two E2M1 codes a byte: pack_expert_weights makes "
        "them), got torch.int32 (the words layout; this module reads nibbles: "
        "pack_expert_weights(..., layout='nibbles'))")
