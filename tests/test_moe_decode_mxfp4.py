"""The MXFP4 `words` layout (pack_expert_weights(..., layout="words"), runtime/mxfp4.py): the
kernels' few-instruction dequantisation (_e2m1_words, _mxfp4_scaled) run in the interpreter
is bit-exact against the E2M1 / E8M0 definitions for every code at every input position and
every scale byte 2..252; the words layout holds the nibbles layout's codes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3compile.backends.triton.runtime import mxfp4
from k3compile.ir import reference

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

