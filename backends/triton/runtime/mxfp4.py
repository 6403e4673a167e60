"""MXFP4 expert weights (OCP Microscaling: E2M1 values, an E8M0 scale per 32 of them): the
packing a compiled module exposes as `pack_expert_weights`, the checks of its entries' packed
arguments and the kernels' dequantisation. A real module, imported by the tests; the printer
emits everything below the marker into modules whose layer has expert_weight_format = mxfp4
(after checks.py's part, whose _check_shape it uses).

The layout (docs/moe.md): a weight [E, rows, in] becomes
- packed [E, rows, in / 2] uint8 (layout nibbles, the default): in each block of 32 consecutive
  inputs of a row, byte j (0..15) holds the E2M1 code of input j in its low nibble and of input
  j + 16 in its high one.
  So the low nibbles of a tile of whole blocks multiply one set of activation columns and the
  high nibbles another, each a plain slice of the block: the kernels take two products (or two
  dots of half the depth) instead of interleaving the nibbles back into column order; or
  packed [E, rows, in / 8] int32 (layout words): the same codes, a block's as four 32-bit words
  placed for a few-instruction dequantisation (_e2m1_pair, below);
- scales [E, rows, in / 32] uint8: block b's E8M0 scale s, the block's weights being its codes'
  values times 2^(s - 127).
An E2M1 code is sign (bit 3), exponent e (bits 1-2), mantissa m (bit 0): e = 0 gives m / 2, else
2^(e - 1) (1 + m / 2): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
"""

import torch
import triton
import triton.language as tl

from k3compile.backends.triton.runtime.checks import _check_shape

# the layout pack_expert_weights packs by default: a compiled module prints its own, the one its
# kernels read (their k3s ops' packing), after this file's emitted part
_MXFP4_PACKING = "nibbles"

# --- emitted into every compiled module (above: what this file needs to be imported) ---

# E2M1's rounding thresholds between neighbouring magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: those
# below an even code (a tie rounds down to it) and those below an odd one (a tie rounds up to the
# even code above): round to nearest, ties to even, as OCP's conversion asks
_E2M1_TIES_DOWN = (0.25, 1.25, 2.5, 5.0)
_E2M1_TIES_UP = (0.75, 1.75, 3.5)
# the shared exponents the kernels decode exactly (scale bytes 2..252: every dequantised weight a
# normal fp32 number; see _e2m1); floor(log2(amax)) - 2 exceeds 125 for no finite float32
_MX_MIN_EXPONENT = -125


# layout = "words": each block's 32 codes as four little-endian 32-bit words; word q holds inputs
# c = 16 h + 4 i + q (lane h = 0, 1; extraction i = 0..3) with code c's magnitude bits (e1 e0 m)
# at 9 + 16 h + _WORD_MAGNITUDE_SHIFT[i] and its sign at 15 + 16 h - _WORD_SIGN_SHIFT[i]: so
# (w >> r_i) & 0x0E000E00 | (w << s_i) & 0x80008000 (r < 0: a left shift) puts extraction i's two
# codes into fp16 patterns, sign bit 15, exponent's low bits and mantissa's top bit 11..9, whose
# values are the E2M1 values times 2^-14 (code 1 an fp16 subnormal: exact, as E2M1's is)
# (constexpr: the kernels index them by a static extraction number, _e2m1_words)
_WORD_MAGNITUDE_SHIFT = tl.constexpr((0, 3, -3, -6))
_WORD_SIGN_SHIFT = tl.constexpr((0, 15, 14, 13))


def _mxfp4_words(codes):
    """E2M1 codes [..., 32] (uint8 0..15, a block's inputs in order) -> its 16 bytes of the words
    layout (four little-endian uint32 words)."""
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], 2, 4, 4)  # [.., h, i, q]: input 16 h + 4 i + q
    bits = torch.zeros(*codes.shape[:-1], 4, dtype=torch.int64, device=codes.device)
    for i in range(4):
        for h in range(2):
            code = c[..., h, i, :]
            bits |= (code & 7) << (9 + 16 * h + _WORD_MAGNITUDE_SHIFT[i])
            bits |= (code >> 3) << (15 + 16 * h - _WORD_SIGN_SHIFT[i])
    return torch.stack([(bits >> (8 * b)) & 255 for b in range(4)], dim=-1).to(torch.uint8).reshape(
        *codes.shape[:-1], 16)


def _mxfp4_quantize(name, weight, layout="nibbles"):
    """One weight [E, rows, in] -> (packed, scales [E, rows, in / 32] uint8) on its device, packed
    in `layout`: nibbles [E, rows, in / 2] uint8, words [E, rows, in / 8] int32; ValueError naming
    it unless a finite float tensor of whole 32-input blocks."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        got = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"{name}: expected a float tensor (the weights to pack), got {got}")
    if weight.dim() != 3 or weight.shape[2] % 32:
        raise ValueError(f"{name}: expected shape [E, rows, in] with in a multiple of 32 (a scale per 32 inputs), "
                         f"got {list(weight.shape)}")
    E, rows, inputs = weight.shape
    words = layout == "words"
    packed = torch.empty(E, rows, inputs // (8 if words else 2), dtype=torch.int32 if words else torch.uint8,
                         device=weight.device)
    scales = torch.empty(E, rows, inputs // 32, dtype=torch.uint8, device=weight.device)
    ties_down = torch.tensor(_E2M1_TIES_DOWN, device=weight.device)
    ties_up = torch.tensor(_E2M1_TIES_UP, device=weight.device)
    for e in range(E):  # one expert at a time: K3's experts are 59 GB in bf16, 4 bytes a weight here
        blocks = weight[e].float().reshape(rows, inputs // 32, 32)
        if not torch.isfinite(blocks).all():
            raise ValueError(f"{name}: expert {e} has non-finite weights; MXFP4 holds finite ones only")
        # OCP's shared exponent floor(log2(amax)) - 2 (E2M1's largest exponent), exactly: frexp's
        # exponent is floor(log2) + 1; an all-zero block takes any scale (frexp(0) is 0)
        exponent = (torch.frexp(blocks.abs().amax(-1)).exponent - 3).clamp(min=_MX_MIN_EXPONENT)
        # over the scale: times 2^-exponent, built as float32 bits (exact, whatever the device's exp2)
        scaled = blocks * ((127 - exponent) << 23).view(torch.float32)[..., None]
        magnitude = scaled.abs()
        # the E2M1 magnitude code 0..7: thresholds passed, saturating at 6 (code 7)
        codes = (torch.bucketize(magnitude, ties_down) + torch.bucketize(magnitude, ties_up, right=True)).to(torch.uint8)
        codes |= (scaled < 0).to(torch.uint8) << 3
        # words: a block's 16 bytes as four little-endian int32 words
        packed[e] = (_mxfp4_words(codes).reshape(rows, inputs // 2).view(torch.int32) if words
                     else (codes[..., :16] | (codes[..., 16:] << 4)).reshape(rows, inputs // 2))
        scales[e] = (exponent + 127).to(torch.uint8)
    return packed, scales


def pack_expert_weights(expert_gate_up, expert_down, layout=None):
    """The routed experts' weights (any float dtype, reference.latent_moe's layouts: expert_gate_up
    [E, 2F, w], expert_down [E, w, F]) as MXFP4, on their device: a dict of the entries' packed
    arguments (expert_gate_up_packed [E, 2F, w / 2], expert_gate_up_scales [E, 2F, w / 32],
    expert_down_packed, expert_down_scales), so that moe(x, ..., **pack_expert_weights(gate_up,
    down)) runs. Each block of 32 inputs of a row shares the scale 2^(floor(log2(amax)) - 2), amax
    its largest magnitude (OCP's rule); its weights over the scale are rounded to the nearest E2M1
    value, ties to even, saturating at +-6. The layout (docs/moe.md): nibbles (uint8, two codes a
    byte) or words (int32 [.., in / 8], the same codes placed for a few-instruction
    dequantisation, _e2m1_pair); None: the one this module's kernels read (_MXFP4_PACKING, which
    lower-moe-experts chose: words with decode=warp)."""
    layout = _MXFP4_PACKING if layout is None else layout
    if layout not in ("nibbles", "words"):
        raise ValueError(f"layout: expected 'nibbles' or 'words', got {layout!r}")
    out = {}
    for name, weight in (("expert_gate_up", expert_gate_up), ("expert_down", expert_down)):
        out[f"{name}_packed"], out[f"{name}_scales"] = _mxfp4_quantize(name, weight, layout)
    return out


# dtype class -> (torch dtype, what it holds); a packed tensor's dtype says its layout
_MX_DTYPE_CLASSES = {"fp4x2": (torch.uint8, "two E2M1 codes a byte"),
                     "fp4x8": (torch.int32, "the words layout: eight E2M1 codes a word"),
                     "e8m0": (torch.uint8, "E8M0 scales")}
_MX_LAYOUTS = {torch.uint8: "nibbles", torch.int32: "words"}


def _check_mx(name, x, shape, dtype_class, dims, device):
    """_check_tensor for an MXFP4 weight's tensors (dtype classes fp4x2, fp4x8 and e8m0), which
    _check_tensor's dtype table leaves out; packed values in the other layout are named as such."""
    if x is None:
        raise ValueError(f"{name}: required, got None")
    dtype, holds = _MX_DTYPE_CLASSES[dtype_class]
    if not isinstance(x, torch.Tensor) or x.dtype != dtype:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        if dtype_class != "e8m0" and got in _MX_LAYOUTS:  # packed, but in the layout the kernels do not read
            got = f"{got} (the {_MX_LAYOUTS[got]} layout; this module reads {_MX_LAYOUTS[dtype]}: " \
                  f"pack_expert_weights(..., layout={_MX_LAYOUTS[dtype]!r}))"
        raise ValueError(f"{name}: expected a {dtype} tensor ({holds}: pack_expert_weights makes them), got {got}")
    _check_shape(name, x, shape, dims)
    if x.device != device:  # the first argument's device, checked (a CPU one only in the interpreter)
        raise ValueError(f"{name}: expected a tensor on {device} (like the first argument), got {x.device}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (call .contiguous() first)")


@triton.jit
def _e2m1(code, half_scale):
    """E2M1 codes (uint32, 0..15) times a block's scale, as fp32 bit patterns (no conversion, no
    product): half_scale is the bits of 2^(s - 128), the value of code 1 (0.5 times the scale);
    for a magnitude m = code & 7 >= 2, m << 22 adds its exponent bits (m >> 1) to the exponent
    field and its mantissa bit to the mantissa's top bit: 2^(e - 1) (1 + m/2) times the scale."""
    magnitude = code & 7
    bits = tl.where(magnitude < 2, magnitude * half_scale, (magnitude << 22) + half_scale) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_dequant(packed, scales):
    """The weights of packed bytes (low nibble, high nibble) times 2^(s - 127) of their scale bytes
    s (broadcast against them), as two fp32 tensors; exact for s in 2..252."""
    codes = packed.to(tl.uint32)
    half_scale = (scales.to(tl.uint32) - 1) << 23
    return _e2m1(codes & 15, half_scale), _e2m1(codes >> 4, half_scale)


@triton.jit
def _e2m1_pair(words, magnitude_shift: tl.constexpr, sign_shift: tl.constexpr):
    """Extraction i of the words layout (uint32 words; its shifts _WORD_MAGNITUDE_SHIFT[i],
    _WORD_SIGN_SHIFT[i]): lane 0's and lane 1's codes as fp32, E2M1 values times 2^-14. Two shifts
    and a bit-select (one LOP3) give both codes' fp16 patterns; each lane's conversion is exact."""
    if magnitude_shift >= 0:
        magnitudes = (words >> magnitude_shift) & 0x0E000E00
    else:
        magnitudes = (words << -magnitude_shift) & 0x0E000E00
    bits = magnitudes | ((words << sign_shift) & 0x80008000)
    lo = (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (bits >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _e2m1_words(words, i: tl.constexpr):
    """Extraction i (0..3) of the words layout: _e2m1_pair with its shifts."""
    return _e2m1_pair(words, _WORD_MAGNITUDE_SHIFT[i], _WORD_SIGN_SHIFT[i])


@triton.jit
def _mxfp4_block_scale(scales):
    """2^(s - 127) of scale bytes s, built as fp32 bits: a block's factor after _e2m1_pair's
    values are multiplied by 2^14 (their bias; the two products exact for s in 2..252, one product
    2^(s - 113) would overflow from s = 241). A GEMV applies both to a block's partial sum."""
    return (scales.to(tl.uint32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _mxfp4_scaled(partials, scales):
    """Per-block partial sums of _e2m1_pair values (E2M1 values times 2^-14) times their blocks'
    factor, 2^14 then 2^(s - 127) of their scale bytes s: two exact products."""
    return partials * 16384.0 * _mxfp4_block_scale(scales)


@triton.jit
def _mxfp4_words_dequant(words, scales):
    """A [K, N] tile of the words layout (uint32 words k of N weight rows) and its blocks' scale
    bytes (broadcast against it) as two fp32 tiles [4 K, N] for tl.dot: lane 0's and lane 1's
    weights, row 4 k + i extraction i of word k (input columns 32 (k // 4) + 16 h + 4 i + k % 4 of
    lane h). Each weight times its block's factor (2^14, then 2^(s - 127): exact)."""
    factor = 16384.0 * _mxfp4_block_scale(scales)
    lo0, hi0 = _e2m1_words(words, 0)
    lo1, hi1 = _e2m1_words(words, 1)
    lo2, hi2 = _e2m1_words(words, 2)
    lo3, hi3 = _e2m1_words(words, 3)
    # join(join(x0, x1), join(x2, x3)) is [K, N, a, b] with extraction 2 b + a: to [K, b, a, N]
    lo = tl.permute(tl.join(tl.join(lo0 * factor, lo1 * factor), tl.join(lo2 * factor, lo3 * factor)), (0, 3, 2, 1))
    hi = tl.permute(tl.join(tl.join(hi0 * factor, hi1 * factor), tl.join(hi2 * factor, hi3 * factor)), (0, 3, 2, 1))
    return tl.reshape(lo, (4 * words.shape[0], words.shape[1])), tl.reshape(hi, (4 * words.shape[0], words.shape[1]))
