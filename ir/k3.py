"""The `k3` dialect: what a layer computes, one op per layer family.

Ops here carry only verified attributes; how they run is decided by passes (see passes/).
Reference semantics for every op live in `k3compile.ir.reference`.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr, StringAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Dialect, SpacedOpaqueSyntaxAttribute
from xdsl.irdl import irdl_attr_definition, irdl_op_definition, opt_prop_def, prop_def, traits_def
from xdsl.traits import SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import (BetaInput, Dtype, Gate, GateInput, GluActivation, StateLayout, VisionPosition,
                                  WeightFormat)
from k3compile.ir.syntax import KeywordSyntax

# The shared vocabularies (ir/choices.py) as enum attributes: a property declared with one takes
# only its words (k3s ops use them too).


@irdl_attr_definition
class DtypeAttr(EnumAttribute[Dtype], SpacedOpaqueSyntaxAttribute):
    name = "k3.dtype"


@irdl_attr_definition
class StateLayoutAttr(EnumAttribute[StateLayout], SpacedOpaqueSyntaxAttribute):
    name = "k3.state_layout"


@irdl_attr_definition
class GateAttr(EnumAttribute[Gate], SpacedOpaqueSyntaxAttribute):
    name = "k3.gate"


@irdl_attr_definition
class GluActivationAttr(EnumAttribute[GluActivation], SpacedOpaqueSyntaxAttribute):
    name = "k3.glu_activation"


@irdl_attr_definition
class WeightFormatAttr(EnumAttribute[WeightFormat], SpacedOpaqueSyntaxAttribute):
    name = "k3.weight_format"


@irdl_attr_definition
class GateInputAttr(EnumAttribute[GateInput], SpacedOpaqueSyntaxAttribute):
    name = "k3.gate_input"


@irdl_attr_definition
class BetaInputAttr(EnumAttribute[BetaInput], SpacedOpaqueSyntaxAttribute):
    name = "k3.beta_input"


@irdl_attr_definition
class VisionPositionAttr(EnumAttribute[VisionPosition], SpacedOpaqueSyntaxAttribute):
    name = "k3.vision_position"


def _int(op, name: str) -> int:
    return getattr(op, name).value.data


def _require_positive(op, *names: str) -> None:
    for name in names:
        if _int(op, name) <= 0:
            raise VerifyException(f"{op.name} @{op.sym_name.data}: {name} must be positive, got {_int(op, name)}")


def _require_float_in(op, name: str, low: float, high: float | None = None) -> None:
    value = getattr(op, name).value.data
    if not (value > low and (high is None or value <= high)):
        bound = f"in ({low}, {high}]" if high is not None else f"> {low}"
        raise VerifyException(f"{op.name} @{op.sym_name.data}: {name} must be {bound}, got {value}")


@irdl_op_definition
class RecurrenceOp(KeywordSyntax):
    """A gated delta-rule recurrence over a sequence (the KDA family).

    Per value head, with state S in R^{K x V}:
        S_t = (I - b_t k_t k_t^T) Diag(exp g_t) S_{t-1} + b_t k_t v_t^T     (delta_rule = true)
        S_t = Diag(exp g_t) S_{t-1} + k_t v_t^T                             (delta_rule = false)
        o_t = S_t^T (scale q_t)
    `gate` is channel ([K] per token and value head: KDA, GLA), scalar (Gated DeltaNet) or none
    (g = 0: DeltaNet, linear attention). Value head h reads query/key head
    h // (num_v_heads / num_heads). `state_layout` is the memory order of a head's state:
    kv = [K, V] (fla), vk = [V, K] (serving stacks).

    What the inputs mean: qk_l2norm normalises q and k per head (x / sqrt(|x|^2 + 1e-6));
    gate_input log takes g as the log-decay, clamped takes max(g, gate_lower_bound) (fla's
    safe_gate contract, enforced), softplus computes g = -exp(A_log) softplus(g + dt_bias),
    bounded g = gate_lower_bound sigmoid(exp(A_log) (g + dt_bias)); beta_input logits
    takes beta = sigmoid(beta), logits_neg_eigval beta = 2 sigmoid(beta) (in (0, 2): the
    transition I - beta k k^T may have a negative eigenvalue, fla's allow_neg_eigval).
    """

    name = "k3.recurrence"
    sym_name = prop_def(StringAttr)
    gate = prop_def(GateAttr)
    delta_rule = prop_def(BoolAttr)
    num_heads = prop_def(IntegerAttr[I64])
    num_v_heads = prop_def(IntegerAttr[I64])
    head_k_dim = prop_def(IntegerAttr[I64])
    head_v_dim = prop_def(IntegerAttr[I64])
    scale = prop_def(FloatAttr)
    state_layout = prop_def(StateLayoutAttr)
    dtype = prop_def(DtypeAttr)
    # what the inputs mean; absent means the default (fla's plain inputs)
    qk_l2norm = opt_prop_def(BoolAttr)
    gate_input = opt_prop_def(GateInputAttr)
    gate_lower_bound = opt_prop_def(FloatAttr)
    beta_input = opt_prop_def(BetaInputAttr)
    traits = traits_def(SymbolOpInterface())

    INPUT_DEFAULTS: ClassVar[dict] = {"qk_l2norm": False, "gate_input": GateInput.LOG, "gate_lower_bound": -5.0,
                                      "beta_input": BetaInput.PROBABILITY}

    def input_option(self, name: str):
        """The value of an input-meaning property, or its default when absent."""
        attr = self.properties.get(name)
        if attr is None:
            return self.INPUT_DEFAULTS[name]
        if isinstance(attr, EnumAttribute):
            return attr.data
        if isinstance(self.INPUT_DEFAULTS[name], bool):  # i1 stores true as -1
            return bool(attr.value.data)
        return attr.value.data

    def verify_(self) -> None:
        where = f"{self.name} @{self.sym_name.data}"
        gate_input, beta_input = self.input_option("gate_input"), self.input_option("beta_input")
        if self.gate.data == "none" and gate_input != "log":
            raise VerifyException(f"{where}: gate_input must be log without a gate, got {gate_input!r}")
        if not self.delta_rule.value.data and beta_input != "probability":
            raise VerifyException(f"{where}: beta_input must be probability without the delta rule (no beta)")
        if self.input_option("gate_lower_bound") >= 0:
            raise VerifyException(f"{where}: gate_lower_bound must be < 0, got {self.input_option('gate_lower_bound')}")
        _require_positive(self, "num_heads", "num_v_heads", "head_k_dim", "head_v_dim")
        if _int(self, "num_v_heads") % _int(self, "num_heads"):
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: num_v_heads ({_int(self, 'num_v_heads')}) must be "
                f"a multiple of num_heads ({_int(self, 'num_heads')})"
            )
        _require_float_in(self, "scale", 0.0)


@irdl_op_definition
class AttnResOp(KeywordSyntax):
    """Attention-Residual aggregation over depth (Block AttnRes).

        h = sum_i softmax_i( w . RMSNorm_gain(x_i) ) x_i

    over up to num_blocks + 1 sources (the stored block representatives plus the current
    partial sum), each of width hidden_size. The pseudo-query w and the RMSNorm gain are
    weights (kernel inputs); RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gain. Softmax in fp32,
    no temperature. block_size is the number of layers summed into one block.
    """

    name = "k3.attnres"
    sym_name = prop_def(StringAttr)
    hidden_size = prop_def(IntegerAttr[I64])
    num_blocks = prop_def(IntegerAttr[I64])
    block_size = prop_def(IntegerAttr[I64])
    eps = prop_def(FloatAttr)
    dtype = prop_def(DtypeAttr)
    traits = traits_def(SymbolOpInterface())

    def verify_(self) -> None:
        _require_positive(self, "hidden_size", "num_blocks", "block_size")
        _require_float_in(self, "eps", 0.0)

    @property
    def max_sources(self) -> int:
        return _int(self, "num_blocks") + 1


@irdl_op_definition
class LatentMoEOp(KeywordSyntax):
    """A (Latent) mixture-of-experts layer with a DeepSeek-V3 style sigmoid router.

    Router: s = sigmoid(x W_r^T); experts chosen by top-k of s + bias, in decreasing order of
    s + bias, equal values ranking the lower expert id first (deterministic); weights are the
    unbiased s of the chosen experts, normalised over the top-k if norm_topk_prob, times
    routed_scaling_factor. With latent_dim > 0 the routed experts run in the latent width:
    x -> x W_down^T (d -> latent), experts, weighted combine, RMSNorm(gain, eps), -> W_up^T
    (latent -> d); latent_dim = 0 runs them at full width. Each expert is a GLU:
    down( act(gate(x), up(x)) ) with act swiglu (silu(g) * u) or situ_glu
    (4 tanh(g/4) sigmoid(g) * 25 tanh(u/25)). Shared experts (full width) are added.
    expert_weight_format mxfp4 stores the routed experts' weights as OCP MX (E2M1 values, an
    E8M0 scale per 32 consecutive weights of a row's input columns; absent: bf16, the layer's
    dtype), so the experts' input widths (latent_dim, or hidden_size without it, and
    expert_ffn_dim) are multiples of 32.
    """

    name = "k3.latent_moe"
    sym_name = prop_def(StringAttr)
    hidden_size = prop_def(IntegerAttr[I64])
    latent_dim = prop_def(IntegerAttr[I64])
    num_experts = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    expert_ffn_dim = prop_def(IntegerAttr[I64])
    num_shared_experts = prop_def(IntegerAttr[I64])
    shared_ffn_dim = prop_def(IntegerAttr[I64])
    activation = prop_def(GluActivationAttr)
    norm_topk_prob = prop_def(BoolAttr)
    routed_scaling_factor = prop_def(FloatAttr)
    eps = prop_def(FloatAttr)
    dtype = prop_def(DtypeAttr)
    expert_weight_format = opt_prop_def(WeightFormatAttr)
    traits = traits_def(SymbolOpInterface())

    # the frontend leaves an optional property out at its default (so a bf16 layer prints as before)
    INPUT_DEFAULTS: ClassVar[dict] = {"expert_weight_format": WeightFormat.BF16}

    @property
    def weight_format(self) -> WeightFormat:
        attr = self.expert_weight_format
        return WeightFormat.BF16 if attr is None else attr.data

    def verify_(self) -> None:
        _require_positive(self, "hidden_size", "num_experts", "top_k", "expert_ffn_dim")
        for name in ("latent_dim", "num_shared_experts", "shared_ffn_dim"):
            if _int(self, name) < 0:
                raise VerifyException(f"{self.name} @{self.sym_name.data}: {name} must be >= 0, got {_int(self, name)}")
        if _int(self, "top_k") > _int(self, "num_experts"):
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: top_k ({_int(self, 'top_k')}) must not exceed "
                f"num_experts ({_int(self, 'num_experts')})"
            )
        if _int(self, "latent_dim") >= _int(self, "hidden_size"):
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: latent_dim ({_int(self, 'latent_dim')}) must be "
                f"smaller than hidden_size ({_int(self, 'hidden_size')}), or 0 for no latent projection"
            )
        if _int(self, "num_shared_experts") > 0 and _int(self, "shared_ffn_dim") <= 0:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: shared_ffn_dim must be positive when num_shared_experts > 0"
            )
        _require_float_in(self, "routed_scaling_factor", 0.0)
        _require_float_in(self, "eps", 0.0)
        if self.weight_format == WeightFormat.MXFP4:
            # one E8M0 scale per 32 weights along each input: the gate/up weights' (w) and the down's (F)
            inputs = ("latent_dim" if _int(self, "latent_dim") else "hidden_size", "expert_ffn_dim")
            for name in inputs:
                if _int(self, name) % 32:
                    raise VerifyException(
                        f"{self.name} @{self.sym_name.data}: expert_weight_format = mxfp4 scales blocks of 32 "
                        f"weights along each expert input, so {name} must be a multiple of 32, got {_int(self, name)}"
                    )


@irdl_op_definition
class VisionOp(KeywordSyntax):
    """One pre-norm ViT encoder layer over images packed in one sequence (MoonViT's block).

        h = x + W_o attn(LayerNorm_0(x)) + b_o,   y = h + W_2 gelu_tanh(W_1 LayerNorm_1(h) + b_1) + b_2
    with q, k, v = LayerNorm_0(x) W_qkv + b_qkv split into num_heads heads of head_dim. Attention
    is bidirectional within an image and absent between images: the packed sequence's mask is
    block-diagonal over the images (a video is one block of frames x patches), softmax scale
    head_dim ** -0.5. position rope_2d rotates the pairs (2i, 2i+1) of q and k by the patch's
    column and row times rope_theta ** (-4 i / head_dim) (pair 2i by the column, 2i+1 by the
    row), so head_dim is a multiple of 4. num_layers and patch_size describe the encoder the
    layer belongs to (the cost model of the context-parallel plan: docs/vision.md).
    Reference semantics: k3compile.ir.vision.
    """

    name = "k3.vision"
    sym_name = prop_def(StringAttr)
    hidden_size = prop_def(IntegerAttr[I64])
    num_heads = prop_def(IntegerAttr[I64])
    head_dim = prop_def(IntegerAttr[I64])
    mlp_dim = prop_def(IntegerAttr[I64])
    patch_size = prop_def(IntegerAttr[I64])
    num_layers = prop_def(IntegerAttr[I64])
    position = prop_def(VisionPositionAttr)
    rope_theta = prop_def(FloatAttr)
    eps = prop_def(FloatAttr)
    dtype = prop_def(DtypeAttr)
    traits = traits_def(SymbolOpInterface())

    def verify_(self) -> None:
        _require_positive(self, "hidden_size", "num_heads", "head_dim", "mlp_dim", "patch_size", "num_layers")
        _require_float_in(self, "eps", 0.0)
        _require_float_in(self, "rope_theta", 1.0)
        if self.position.data == VisionPosition.ROPE_2D and _int(self, "head_dim") % 4:
            raise VerifyException(f"{self.name} @{self.sym_name.data}: position = rope_2d rotates pairs of channels "
                                  f"by row and column in turn, so head_dim must be a multiple of 4, got "
                                  f"{_int(self, 'head_dim')}")


K3 = Dialect(
    "k3",
    [RecurrenceOp, AttnResOp, LatentMoEOp, VisionOp],
    [DtypeAttr, StateLayoutAttr, GateAttr, GluActivationAttr, GateInputAttr, BetaInputAttr, WeightFormatAttr,
     VisionPositionAttr],
)
