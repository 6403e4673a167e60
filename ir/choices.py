"""The vocabularies of the IR's enum properties shared by k3 and the spec, in one place (no xDSL
import, so the spec checker and the CLI can read them cheaply). Each enum lists what a property
may say; ir/k3.py makes each an xDSL enum attribute."""

from enum import StrEnum


class Word(StrEnum):
    """A vocabulary's word: a str that also reprs as the plain string, so `!r` in messages and
    printed code reads the same as for the words the IR held as strings."""

    __repr__ = str.__repr__


class Dtype(Word):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class StateLayout(Word):
    """A head's state as [K, V] (fla) or [V, K] (serving stacks)."""

    KV = "kv"
    VK = "vk"


class Gate(Word):
    CHANNEL = "channel"
    SCALAR = "scalar"
    NONE = "none"


class GluActivation(Word):
    SWIGLU = "swiglu"
    SITU_GLU = "situ_glu"


class WeightFormat(Word):
    """How a layer's routed experts' weights are stored: bf16, in the layer's float dtype whatever
    it is; mxfp4, as OCP MX (E2M1 values two a byte, an E8M0 scale per 32 of a row's input
    columns: docs/moe.md)."""

    BF16 = "bf16"
    MXFP4 = "mxfp4"


class GateInput(Word):
    """What g means: the log-decay as given; max(g, gate_lower_bound) (fla's safe_gate contract);
    -exp(A_log) softplus(g + dt_bias); gate_lower_bound sigmoid(exp(A_log) (g + dt_bias))."""

    LOG = "log"
    CLAMPED = "clamped"
    SOFTPLUS = "softplus"
    BOUNDED = "bounded"


BOUNDED_GATE_INPUTS = (GateInput.CLAMPED, GateInput.BOUNDED)  # g >= gate_lower_bound by construction

# The log-decay below which the decay is zero: exp(-110) ~ 1.7e-48 rounds to 0 in fp32 (below half
# of 2^-149), so every g <= -110, -inf included, is the same full reset, and a gate load may raise
# g to it without changing the fp32 recurrence. A chunk's cumulative log-decays then stay within
# 110 x chunk size, where fp32 keeps the differences of two of them accurate (at -1e9 they are
# multiples of 64; at -inf, NaN).
ZERO_DECAY_FLOOR = -110.0
GATE_INPUTS_WITH_PARAMETERS = (GateInput.SOFTPLUS, GateInput.BOUNDED)  # computed in-kernel from A_log, dt_bias


class BetaInput(Word):
    """What beta means: beta as given; sigmoid(beta); 2 sigmoid(beta) (fla's allow_neg_eigval: beta
    in (0, 2), so I - beta k k^T may have a negative eigenvalue)."""

    PROBABILITY = "probability"
    LOGITS = "logits"
    LOGITS_NEG_EIGVAL = "logits_neg_eigval"


class VisionPosition(Word):
    """Where a vision layer's patches learn their place: 2D rotary embedding of (row, column) on
    the queries and keys (MoonViT's Rope2DPosEmb), or none (the caller adds positions)."""

    ROPE_2D = "rope_2d"
    NONE = "none"


# The words as tuples for checks of plain strings (the spec's values): `str in EnumClass` raises
# on Python 3.11.
DTYPES = tuple(Dtype)
STATE_LAYOUTS = tuple(StateLayout)
GLU_ACTIVATIONS = tuple(GluActivation)
WEIGHT_FORMATS = tuple(WeightFormat)
GATE_INPUTS = tuple(GateInput)
BETA_INPUTS = tuple(BetaInput)
VISION_POSITIONS = tuple(VisionPosition)
