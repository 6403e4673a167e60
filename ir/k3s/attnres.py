"""The fused AttnRes schedule's stages."""

from __future__ import annotations

from xdsl.dialects.builtin import I64, FloatAttr, IntegerAttr
from xdsl.irdl import irdl_op_definition, prop_def, region_def, traits_def
from xdsl.traits import HasParent, NoTerminator

from k3compile.ir.k3s.core import KernelOp
from k3compile.ir.syntax import KeywordSyntax

# --- stages of the fused AttnRes schedule --------------------------------------------------


@irdl_op_definition
class FoldQueryOp(KeywordSyntax):
    """q = w * gain: the RMSNorm gain folded into the pseudo-query, so normalised sources
    are never materialised."""

    name = "k3s.fold_query"
    hidden_size = prop_def(IntegerAttr[I64])
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class SourceLoopOp(KeywordSyntax):
    """Loop over the depth sources of one row, reading each source row once."""

    name = "k3s.source_loop"
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), HasParent(KernelOp))


@irdl_op_definition
class RmsScoreOp(KeywordSyntax):
    """score_i = q . x_i / sqrt(mean(x_i^2) + eps): the RMS folded into the score."""

    name = "k3s.rms_score"
    eps = prop_def(FloatAttr)
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class OnlineSoftmaxOp(KeywordSyntax):
    """Running max and normaliser of the softmax over sources (fp32)."""

    name = "k3s.online_softmax"
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class MixAccumulateOp(KeywordSyntax):
    """acc <- acc * rescale + p_i x_i: the mix of un-normalised sources."""

    name = "k3s.mix_accumulate"
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class NormalizeStoreOp(KeywordSyntax):
    """h = acc / normaliser, stored in the output dtype."""

    name = "k3s.normalize_store"
    traits = traits_def(HasParent(KernelOp))
