"""The MoE routing's stages, as ops on values: the router logits of a block of token rows, their
sigmoid scores and the scores' store (the scores kernel), then the scores' load, the top-k
selection by score + bias, the routing weights and their store (the top-k kernel).

A scores kernel's program owns a block of token rows (tile dimension R) against a block of
experts (E: those of its expert_block grid axis); a top-k kernel's program owns a block of rows
whole: every expert of each row (E) and its top-k slots (KS). They hand the scores over in the
entry's `scores` workspace, [R, num_experts] fp32."""

from __future__ import annotations

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.traits import HasParent, MemoryReadEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.core import KernelOp, TileType
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class RouterLogitsOp(KeywordSyntax):
    """logits[r, e] = sum_c x[r, c] W_r[e, c] for c < hidden_size: the block's rows of x [R, d]
    against the router rows (router_weight [num_experts, d]) of the program's block of experts
    (its expert_block grid axis), accumulated in fp32."""

    name = "k3s.router_logits"
    hidden_size = prop_def(IntegerAttr[I64])
    num_experts = prop_def(IntegerAttr[I64])
    logits = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class RouterSigmoidOp(KeywordSyntax):
    """s = sigmoid(logits) = 1 / (1 + exp(-logits)): each expert's routing score, in (0, 1)."""

    name = "k3s.router_sigmoid"
    logits = operand_def(TileType)
    scores = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class StoreScoresOp(KeywordSyntax):
    """scores[r, e] = s[r, e] (fp32) for the block's rows and the program's block of experts:
    the entry's `scores` workspace [R, num_experts], which a later kernel loads."""

    name = "k3s.store_scores"
    scores = operand_def(TileType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class LoadScoresOp(KeywordSyntax):
    """s[r, e] = scores[r, e] for the block's rows and every expert e < num_experts: the entry's
    `scores` workspace [R, num_experts] fp32, written by an earlier kernel (k3s.store_scores)."""

    name = "k3s.load_scores"
    num_experts = prop_def(IntegerAttr[I64])
    scores = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class SelectTopKOp(KeywordSyntax):
    """The top_k experts of each row by s + b, b the selection bias (router_bias [num_experts],
    fp32, read here): ids[r, j] is the expert of rank j in decreasing order of s[r, e] + b[e];
    equal values rank the lower expert id first (the order of a stable sort, deterministic).
    weights[r, j] = s[r, ids[r, j]]: the chosen experts' unbiased scores."""

    name = "k3s.select_top_k"
    top_k = prop_def(IntegerAttr[I64])
    scores = operand_def(TileType)
    ids = result_def(TileType)
    weights = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        if self.top_k.value.data < 1:
            raise VerifyException(f"{self.name}: top_k must be positive, got {self.top_k.value.data}")


@irdl_op_definition
class RoutingWeightsOp(KeywordSyntax):
    """w'[r, j] = scale * w[r, j] / sum_i w[r, i] (sum over the top_k slots) with normalize,
    else scale * w[r, j]: the weights the experts' outputs are combined with."""

    name = "k3s.routing_weights"
    normalize = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    weights = operand_def(TileType)
    scaled = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class StoreRoutingOp(KeywordSyntax):
    """topk_ids[r, j] = ids[r, j] (int32) and topk_weights[r, j] = w[r, j] (fp32) for the
    block's rows and the top_k slots."""

    name = "k3s.store_routing"
    ids = operand_def(TileType)
    weights = operand_def(TileType)
    traits = traits_def(HasParent(KernelOp))


MOE_ROUTING_STAGES = [RouterLogitsOp, RouterSigmoidOp, StoreScoresOp, LoadScoresOp, SelectTopKOp, RoutingWeightsOp,
                      StoreRoutingOp]
