"""The LatentMoE backward's stages (derive-moe-backward), and the training forward's pair-order
dispatch plan (k3s.rank_pairs, k3s.chunk_offsets), as ops on values: the adjoints of the
forward's projections (the input's gradient, a product with the weight transposed; the weight's,
a sum over the rows of cotangent x input), of the GLU (with the forward's saved pre-activations),
of the routing weights' combine and of the latent RMSNorm, and the router's adjoints.

Rows and their indexing are the forward's words (k3s.rows, k3s.row_index; ir/k3s/experts.py).
A weight-gradient program owns a [BN, BD] tile of one weight (of one expert for rows =
sorted_block) and loops over every row that touches it, in a fixed order: the dense weights'
token rows in blocks, an expert's run of the expert-sorted pair list block by block. No
atomics: every gradient element is written once, by one program.
"""

from __future__ import annotations

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.ir import SSAValue
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, MemoryReadEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3 import GluActivationAttr
from k3compile.ir.k3s.experts import ROW_TENSORS, RowIndexAttr, Rows, RowsAttr, WeightLayout, WeightLayoutAttr
from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface
from k3compile.ir.k3s.types import TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


def _positive(op, *names: str) -> None:
    for name in names:
        value = getattr(op, name)
        if value is not None and value.value.data < 1:
            raise VerifyException(f"{op.name}: {name} must be positive, got {value.value.data}")


@irdl_op_definition
class ProjectInputGradOp(KeywordSyntax):
    """The input's cotangent of a k3s.project: a_bar[m, c] = sum_n y_bar[m, n] W[n, c] in fp32 for
    the program's rows m (`rows`) and its block of columns c < out_dim, n < in_dim (the forward's
    output width); y_bar is `input`'s row of each m (`input_index`), W is `weight` in the forward's
    `layout` (dense, expert or stacked_in; a GLU's two halves are one [2 out, in] weight read in its
    row order, its cotangent stored so by k3s.store_glu_halves). Operands: input, weight, then the
    tensors its rows come from (k3s.project's ROW_TENSORS)."""

    name = "k3s.project_input_grad"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    rows = prop_def(RowsAttr)
    input_index = prop_def(RowIndexAttr)
    layout = prop_def(WeightLayoutAttr)
    group = opt_prop_def(IntegerAttr[I64])  # stacked_in: the columns per shared expert
    block_rows = opt_prop_def(IntegerAttr[I64])  # rows = sorted_block: the dispatch plan's block
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    tensors = var_operand_def(TensorType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def named_tensors(self) -> dict[str, SSAValue]:
        return dict(zip(ROW_TENSORS.get(self.rows.data, ()), self.tensors, strict=True))

    def verify_(self) -> None:
        _positive(self, "in_dim", "out_dim", "group", "block_rows")
        if len(self.tensors) != len(ROW_TENSORS.get(self.rows.data, ())):
            raise VerifyException(f"{self.name}: rows = {self.rows.data} reads {ROW_TENSORS.get(self.rows.data, ())}")
        if self.layout.data == WeightLayout.STACKED_OUT:
            raise VerifyException(f"{self.name}: a stacked_out weight's gradient is read as dense [G 2 group, in]")
        if (self.group is not None) != (self.layout.data == WeightLayout.STACKED_IN):
            raise VerifyException(f"{self.name}: group is given exactly for layout = stacked_in")
        if (self.block_rows is not None) != (self.rows.data == Rows.SORTED_BLOCK):
            raise VerifyException(f"{self.name}: block_rows is given exactly for rows = sorted_block")


@irdl_op_definition
class ProjectWeightGradOp(KeywordSyntax, RuntimeSizesInterface):
    """A weight's cotangent tile: W_bar[n, c] = sum_m y_bar[m, n] a[m, c] in fp32 for the program's
    block of weight rows n < out_dim (BN) and input columns c < in_dim (BD), m over the rows in a
    fixed order: every token row in blocks of BR (rows = token_block), or the program's expert's
    run of the sorted pair list (whole blocks of block_rows) in steps of BR (rows = sorted_block,
    grid axis expert; BR divides block_rows).
    y_bar is `cotangent`'s row of m (`cotangent_index`), times `row_scale`[pair of m] with
    scale_rows (the routing weight); a is `input`'s row of m (`input_index`; an RMS-normalised
    input is k3s.rms_norm_adjoint's `normed` rows). Operands: cotangent, input, then row_scale
    (scale_rows) and the dispatch plan's expert_offsets, sorted_pairs (rows = sorted_block)."""

    name = "k3s.project_weight_grad"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    rows = prop_def(RowsAttr)
    cotangent_index = prop_def(RowIndexAttr)
    input_index = prop_def(RowIndexAttr)
    scale_rows = prop_def(BoolAttr)
    block_rows = opt_prop_def(IntegerAttr[I64])
    cotangent = operand_def(TensorType)
    input = operand_def(TensorType)
    tensors = var_operand_def(TensorType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def tensor_roles(self) -> list[str]:
        return ((["row_scale"] if self.scale_rows.value.data else [])
                + (["expert_offsets", "sorted_pairs"] if self.rows.data == Rows.SORTED_BLOCK else []))

    def named_tensors(self) -> dict[str, SSAValue]:
        return dict(zip(self.tensor_roles(), self.tensors, strict=True))

    def verify_(self) -> None:
        _positive(self, "in_dim", "out_dim", "block_rows")
        if len(self.tensors) != len(self.tensor_roles()):
            raise VerifyException(f"{self.name}: after cotangent and input it reads {self.tensor_roles()}")
        if self.rows.data not in (Rows.TOKEN_BLOCK, Rows.SORTED_BLOCK):
            raise VerifyException(f"{self.name}: rows is token_block or sorted_block, got {self.rows.data}")
        if (self.block_rows is not None) != (self.rows.data == Rows.SORTED_BLOCK):
            raise VerifyException(f"{self.name}: block_rows is given exactly for rows = sorted_block")

    def runtime_sizes(self) -> tuple[str, ...]:
        """token_block loops over every token row of the call; sorted_block over its expert's run,
        which expert_offsets bounds."""
        return ("R",) if self.rows.data == Rows.TOKEN_BLOCK else ()


@irdl_op_definition
class StoreWeightGradOp(KeywordSyntax):
    """`tensor`[n, c] = W_bar[n, c] (in its dtype) for the program's tile, in the forward weight's
    `layout` (dense [out, in]; expert [E, out, in] of the program's expert; stacked_in [G, out,
    group]: column c = s group + f at [s, n, f]); masked past out_dim, in_dim."""

    name = "k3s.store_weight_grad"
    layout = prop_def(WeightLayoutAttr)
    group = opt_prop_def(IntegerAttr[I64])
    value = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        if (self.group is not None) != (self.layout.data == WeightLayout.STACKED_IN):
            raise VerifyException(f"{self.name}: group is given exactly for layout = stacked_in")


@irdl_op_definition
class LoadRowsOp(KeywordSyntax):
    """t[m, n] = `tensor`[row of m, n] in fp32 for the program's rows (`rows`, `index`) and block
    of columns n < width; 0 on padded rows and columns. In a kernel of rows without a projection
    (the GLU's adjoint of glu-adjoint=kernel, a weight gradient's row copies) the first load is
    the kernel's rows, block_r of them a program (over the sorted pair list: its blocks), and
    takes the tensors they come from after `tensor` (k3s.project's ROW_TENSORS); elsewhere none."""

    name = "k3s.load_rows"
    rows = prop_def(RowsAttr)
    index = prop_def(RowIndexAttr)
    width = prop_def(IntegerAttr[I64])
    tensor = operand_def(TensorType)
    tensors = var_operand_def(TensorType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def named_tensors(self) -> dict[str, SSAValue]:
        return dict(zip(ROW_TENSORS.get(self.rows.data, ()), self.tensors, strict=True))

    def verify_(self) -> None:
        _positive(self, "width")
        if self.tensors and len(self.tensors) != len(ROW_TENSORS.get(self.rows.data, ())):
            raise VerifyException(f"{self.name}: rows = {self.rows.data} reads {ROW_TENSORS.get(self.rows.data, ())}")


@irdl_op_definition
class StoreGluHalvesOp(KeywordSyntax):
    """A GLU's two halves stored in its weight's row order: column n of the program's block
    (n < out, out = G group) goes to `tensor`[row of m, (n // group) 2 group + h group + n % group],
    h = 0 for `gate`, 1 for `up` (one shared expert's gate rows, then its up rows; an expert's
    whole gate half, then its up half, with group = out). The forward saves the pre-activations
    so; the backward stores their cotangents so, which the weight's gradients then read as one
    dense [2 out, in] product."""

    name = "k3s.store_glu_halves"
    rows = prop_def(RowsAttr)
    index = prop_def(RowIndexAttr)
    group = prop_def(IntegerAttr[I64])
    width = prop_def(IntegerAttr[I64])  # 2 out: the tensor's row length
    gate = operand_def(TileType)
    up = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class LoadGluHalvesOp(KeywordSyntax):
    """The (gate, up) pre-activations of the program's rows and block of columns, in fp32, from a
    tensor laid out by k3s.store_glu_halves (the forward's saved halves)."""

    name = "k3s.load_glu_halves"
    rows = prop_def(RowsAttr)
    index = prop_def(RowIndexAttr)
    group = prop_def(IntegerAttr[I64])
    width = prop_def(IntegerAttr[I64])
    tensor = operand_def(TensorType)
    gate = result_def(TileType)
    up = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class GluAdjointOp(KeywordSyntax):
    """(g_bar, u_bar) = act_bar (d act / d g, d act / d u) elementwise in fp32: swiglu
    act = silu(g) u: g_bar = act_bar u sigma(g) (1 + g (1 - sigma(g))), u_bar = act_bar silu(g);
    situ_glu act = A(g) B(u), A = 4 tanh(g / 4) sigma(g), B = 25 tanh(u / 25):
    A' = (1 - tanh^2(g / 4)) sigma(g) + 4 tanh(g / 4) sigma(g) (1 - sigma(g)), B' = 1 - tanh^2(u / 25),
    g_bar = act_bar A' B, u_bar = act_bar A B'."""

    name = "k3s.glu_adjoint"
    activation = prop_def(GluActivationAttr)
    gate = operand_def(TileType)
    up = operand_def(TileType)
    act_bar = operand_def(TileType)
    gate_bar = result_def(TileType)
    up_bar = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class StorePairDotOp(KeywordSyntax):
    """`tensor`[p, i_n] = sum_{n in the program's column block i_n} a[m, n] b[m, n] (fp32) for
    the pair p of each of the program's rows (rows = sorted_block): one partial of a row dot
    product per block of columns, `tensor` [R, top_k, NB] with NB the blocks; the routing weights'
    cotangent is their sum over the blocks in order (k3s.sum_partials), with no atomics."""

    name = "k3s.store_pair_dot"
    a = operand_def(TileType)
    b = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class SumPartialsOp(KeywordSyntax):
    """t[r, j] = sum_i `tensor`[r, j, i] over its partials i = 0, 1, .. in order (fp32), for the
    program's block of token rows and the top_k slots (KS)."""

    name = "k3s.sum_partials"
    tensor = operand_def(TensorType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class RmsNormAdjointOp(KeywordSyntax):
    """The latent RMSNorm's input cotangent for the program's token rows, each row whole (a loop
    over its width columns): with c = `input`'s row, r = 1 / sqrt(mean(c^2) + eps) and
    q = gain * `normed_bar`'s row (the cotangent of c r gain), stores
    `input_bar` = r q - c r^3 mean(c q), `rstd` = r (fp32, read by the gain's gradient) and
    `normed` = c r gain in its dtype (the rows the weight's gradient multiplies, as the forward's
    GEMM rounded them: a plain GEMM operand for the wgrad)."""

    name = "k3s.rms_norm_adjoint"
    eps = prop_def(FloatAttr)
    width = prop_def(IntegerAttr[I64])
    input = operand_def(TensorType)
    gain = operand_def(TensorType)
    normed_bar = operand_def(TensorType)
    input_bar = operand_def(TensorType)
    rstd = operand_def(TensorType)
    normed = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class NormGainGradOp(KeywordSyntax, RuntimeSizesInterface):
    """`gain_bar`[n] = sum_r normed_bar[r, n] input[r, n] rstd[r] (fp32) for the program's block of
    columns, every token row in order (blocks of BR)."""

    name = "k3s.norm_gain_grad"
    width = prop_def(IntegerAttr[I64])
    input = operand_def(TensorType)
    rstd = operand_def(TensorType)
    normed_bar = operand_def(TensorType)
    gain_bar = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R",)  # it loops over every token row of the call


@irdl_op_definition
class RoutingWeightsAdjointOp(KeywordSyntax):
    """The cotangent of the chosen scores w from that of the routing weights w' (k3s.routing_weights):
    with normalize, w' = scale w / (S + 1e-20), S = sum_j w_j, so
    w_bar_j = scale (w'_bar_j / (S + 1e-20) - sum_i w'_bar_i w_i / (S + 1e-20)^2); else scale w'_bar."""

    name = "k3s.routing_weights_adjoint"
    normalize = prop_def(BoolAttr)
    scale = prop_def(FloatAttr)
    weights = operand_def(TileType)
    scaled_bar = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class SelectTopKAdjointOp(KeywordSyntax):
    """s_bar[r, e] = sum_j [ids[r, j] = e] w_bar[r, j]: the chosen scores' cotangents scattered to
    their experts (the choice itself has none; the bias gets none)."""

    name = "k3s.select_top_k_adjoint"
    ids = operand_def(TileType)
    weights_bar = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class RouterSigmoidAdjointOp(KeywordSyntax):
    """logits_bar = s_bar s (1 - s), s = sigmoid(logits)."""

    name = "k3s.router_sigmoid_adjoint"
    scores = operand_def(TileType)
    scores_bar = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class StoreLogitsOp(KeywordSyntax):
    """`tensor`[r, e] = t[r, e] (fp32) for the program's block of token rows and every expert:
    the logits' cotangent [R, num_experts], dense (zero where no slot chose the expert)."""

    name = "k3s.store_logits"
    value = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class RankPairsOp(KeywordSyntax):
    """The training forward's dispatch plan in pair order, step 1, a program per chunk c of
    pairs_per_chunk pairs (grid pair_chunk): chunk_counts[c, e] (zero-filled) counts the chunk's
    pairs routed to e, and pair_rank[p] is the number of the chunk's pairs before p routed to p's
    expert. Integer counts, the same in whatever order the adds land: with k3s.chunk_offsets each
    expert's run holds its pairs in increasing order, so the weight gradients, which sum over a
    run in its order, are the same bits run after run (k3s.count_pairs' atomic ranks are not)."""

    name = "k3s.rank_pairs"
    num_experts = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    pairs_per_chunk = prop_def(IntegerAttr[I64])
    topk_ids = operand_def(TensorType)
    chunk_counts = operand_def(TensorType)
    pair_rank = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _positive(self, "num_experts", "top_k", "pairs_per_chunk")


@irdl_op_definition
class ChunkOffsetsOp(KeywordSyntax, RuntimeSizesInterface):
    """The pair-order plan, step 2, one program: chunk_counts[c, e] becomes the count of expert e's
    pairs in the chunks before c (an exclusive prefix over the chunks, in place) and
    expert_counts[e] the expert's total, which k3s.expert_offsets takes as k3s.count_pairs' counts."""

    name = "k3s.chunk_offsets"
    num_experts = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    pairs_per_chunk = prop_def(IntegerAttr[I64])
    chunk_counts = operand_def(TensorType)
    expert_counts = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _positive(self, "num_experts", "top_k", "pairs_per_chunk")

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R",)  # it loops over every token row of the call


MOE_BACKWARD_STAGES = [RankPairsOp, ChunkOffsetsOp, ProjectInputGradOp, ProjectWeightGradOp, StoreWeightGradOp,
                       LoadRowsOp, StoreGluHalvesOp, LoadGluHalvesOp, GluAdjointOp, StorePairDotOp, SumPartialsOp,
                       RmsNormAdjointOp, NormGainGradOp, RoutingWeightsAdjointOp, SelectTopKAdjointOp,
                       RouterSigmoidAdjointOp, StoreLogitsOp]
