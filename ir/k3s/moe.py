"""The MoE routing's stages, as ops on values: the router logits of a block of token rows over a
slice of the hidden columns and their store as partial logits (the scores kernel), then the sum
of the partial logits, their sigmoid scores, the top-k selection by score + bias, the routing
weights and their store (the top-k kernel).

A scores kernel's program owns a block of token rows (tile dimension R) against a block of
experts (E: those of its expert_block grid axis) over one slice of the hidden columns (its
hidden_slice grid axis); a top-k kernel's program owns a block of rows whole: every expert of
each row (E) and its top-k slots (KS). They hand the logits over in the entry's
`partial_logits` workspace, [HS, R, num_experts] fp32: one [R, num_experts] plane per hidden
slice, HS the call's slice count (the shape symbol, chosen by its rows: k3s.launch_by_rows
<hidden_slices>). Slicing the hidden columns lets a few rows spread the router weight over many
programs without atomics: the sum over the slices is in a fixed order, so deterministic."""

from __future__ import annotations

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.traits import HasParent, MemoryReadEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.kernels import GridAxis, KernelOp, RuntimeSizesInterface
from k3compile.ir.k3s.types import TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class RouterLogitsOp(KeywordSyntax, RuntimeSizesInterface):
    """logits[r, e] = sum_{c in C_i} x[r, c] W_r[e, c], accumulated in fp32: the block's rows of
    x [R, d] (`input`) against the router rows (`weight` [num_experts, d]) of the program's block of
    experts (its expert_block grid axis), over the columns C_i of the program's hidden slice i
    (its hidden_slice grid axis). C_0, ..., C_{HS-1} are contiguous runs of the columns
    0..hidden_size-1, in order, that partition them (HS the call's slice count; with HS = 1,
    C_0 is every column): a backend picks the runs (Triton: whole blocks of block_d columns,
    as many to each slice as it can, counts differing by at most one)."""

    name = "k3s.router_logits"
    hidden_size = prop_def(IntegerAttr[I64])
    num_experts = prop_def(IntegerAttr[I64])
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    logits = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        kernel = self.parent_op()
        if isinstance(kernel, KernelOp) and GridAxis.HIDDEN_SLICE not in kernel.axes:
            raise VerifyException(f"{self.name} in @{kernel.sym_name.data}: its kernel's grid has no hidden_slice "
                                  "axis (the slice of the hidden columns its programs sum over)")

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("HS",)  # the call's slices of the hidden columns


@irdl_op_definition
class StorePartialLogitsOp(KeywordSyntax):
    """partial_logits[i, r, e] = logits[r, e] (fp32) for the block's rows, the program's block
    of experts and its hidden slice i: `partial_logits`, a workspace [HS, R, num_experts],
    which a later kernel sums (k3s.sum_partial_logits)."""

    name = "k3s.store_partial_logits"
    logits = operand_def(TileType)
    partial_logits = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class SumPartialLogitsOp(KeywordSyntax, RuntimeSizesInterface):
    """logits[r, e] = (..((0 + p[0, r, e]) + p[1, r, e]) + ..) + p[HS-1, r, e] in fp32, p the
    `partial_logits` workspace [HS, R, num_experts] (k3s.store_partial_logits), for the
    block's rows and every expert e < num_experts: the slices summed in increasing order, a
    fixed order whatever the launch, so the same inputs give the same logits."""

    name = "k3s.sum_partial_logits"
    num_experts = prop_def(IntegerAttr[I64])
    partial_logits = operand_def(TensorType)
    logits = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("HS",)  # the slices it sums


@irdl_op_definition
class RouterSigmoidOp(KeywordSyntax):
    """s = sigmoid(logits) = 1 / (1 + exp(-logits)): each expert's routing score, in (0, 1)."""

    name = "k3s.router_sigmoid"
    logits = operand_def(TileType)
    scores = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class SelectTopKOp(KeywordSyntax):
    """The top_k experts of each row by s + b, b the selection bias (`bias` [num_experts], fp32,
    read here): ids[r, j] is the expert of rank j in decreasing order of s[r, e] + b[e];
    equal values rank the lower expert id first (the order of a stable sort, deterministic).
    weights[r, j] = s[r, ids[r, j]]: the chosen experts' unbiased scores."""

    name = "k3s.select_top_k"
    top_k = prop_def(IntegerAttr[I64])
    scores = operand_def(TileType)
    bias = operand_def(TensorType)
    ids = result_def(TileType)
    weights = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        if self.top_k.value.data < 1:
            raise VerifyException(f"{self.name}: top_k must be positive, got {self.top_k.value.data}")


@irdl_op_definition
class RoutingWeightsOp(KeywordSyntax):
    """w'[r, j] = scale * w[r, j] / (sum_i w[r, i] + 1e-20) (sum over the top_k slots) with
    normalize, else scale * w[r, j]: the weights the experts' outputs are combined with (zero,
    not 0/0, where every chosen score underflowed)."""

    name = "k3s.routing_weights"
    normalize = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    weights = operand_def(TileType)
    scaled = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class StoreRoutingOp(KeywordSyntax):
    """topk_ids[r, j] = ids[r, j] (int32) and topk_weights[r, j] = w[r, j] (fp32) for the
    block's rows and the top_k slots: the tensors `topk_ids` and `topk_weights` [R, top_k]."""

    name = "k3s.store_routing"
    ids = operand_def(TileType)
    weights = operand_def(TileType)
    topk_ids = operand_def(TensorType)
    topk_weights = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


MOE_ROUTING_STAGES = [RouterLogitsOp, StorePartialLogitsOp, SumPartialLogitsOp, RouterSigmoidOp, SelectTopKOp,
                      RoutingWeightsOp, StoreRoutingOp]
