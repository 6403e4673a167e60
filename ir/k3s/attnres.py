"""The fused AttnRes schedule's stages, as ops on values: the folded query, the loop over
sources carrying the online softmax (its running max and normaliser and the mix), the score,
the softmax step, the mix, the normalised store."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, FloatAttr, IntegerAttr
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import HasParent, IsTerminator, MemoryReadEffect, Pure

from k3compile.ir.k3s.kernels import KernelOp
from k3compile.ir.k3s.types import TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class FoldQueryOp(KeywordSyntax):
    """q = w * gain: the RMSNorm gain folded into the pseudo-query, so normalised sources
    are never materialised; w and gain are the tensors it reads ([hidden_size] each)."""

    name = "k3s.fold_query"
    hidden_size = prop_def(IntegerAttr[I64])
    pseudo_query = operand_def(TensorType)
    gain = operand_def(TensorType)
    query = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class SourceLoopOp(KeywordSyntax):
    """Loop over the depth sources of one row, reading each source row once. It carries the
    online softmax from max = -inf, normaliser = 0 and mix = 0: its block arguments, passed on
    by `next_source`, and its results after the last source."""

    name = "k3s.source_loop"
    body = region_def("single_block")
    carried = var_result_def(TileType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class NextSourceOp(KeywordSyntax):
    """The running max, normaliser and mix the next source enters with."""

    name = "k3s.next_source"
    carried = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(SourceLoopOp))


@irdl_op_definition
class LoadSourceOp(KeywordSyntax):
    """This source's row of `sources` ([S, .., hidden_size]: a row of hidden_size columns per
    source and token), in fp32."""

    name = "k3s.load_source"
    sources = operand_def(TensorType)
    row = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), MemoryReadEffect())


@irdl_op_definition
class RmsScoreOp(KeywordSyntax):
    """score_i = q . x_i / sqrt(mean(x_i^2) + eps): the RMS folded into the score."""

    name = "k3s.rms_score"
    eps = prop_def(FloatAttr)
    row = operand_def(TileType)
    query = operand_def(TileType)
    score = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())


@irdl_op_definition
class OnlineSoftmaxOp(KeywordSyntax):
    """The softmax over sources, one source further (fp32): from the running max and normaliser
    and this source's score, the new max and normaliser (in place of the old), this source's
    weight p and the factor that rescales what came before."""

    name = "k3s.online_softmax"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    score = operand_def(TileType)
    new_max = result_def(TileType)
    new_normaliser = result_def(TileType)
    weight = result_def(TileType)
    rescale = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0, 1: 1}  # the running max and normaliser are updated where they are held


@irdl_op_definition
class MixAccumulateOp(KeywordSyntax):
    """acc' = acc * rescale + p_i x_i: the mix of un-normalised sources (in place of acc)."""

    name = "k3s.mix_accumulate"
    mix = operand_def(TileType)
    rescale = operand_def(TileType)
    weight = operand_def(TileType)
    row = operand_def(TileType)
    updated = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}


@irdl_op_definition
class NormalizeStoreOp(KeywordSyntax):
    """h = acc / normaliser, stored to the row of `out` in its dtype."""

    name = "k3s.normalize_store"
    mix = operand_def(TileType)
    normaliser = operand_def(TileType)
    out = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))
