"""The fused AttnRes schedule's stages, as ops on values.

Forward (`aggregate`): the folded query, the online softmax's start, the loop over sources
carrying it (its running max and normaliser and the mix), the score, the softmax step, the mix,
the normalised store and, for training, the row's log-sum-exp.

Backward (`aggregate_backward`, derive-attnres-backward): a program's group of rows, one after
another, carrying the query's cotangent; per row the loads of the saved output, its cotangent and
log-sum-exp, the softmax's row correction; per source the forward's score recomputed, the
softmax weight recomputed from the log-sum-exp, the weight's and the score's cotangents, the
adjoints of the score and of the mix, the source's cotangent stored, and the query's side of the
score's adjoint; after the sources, the query's cotangent re-centred; after the rows, the fold's
adjoint into the query's and gain's gradients.

A loop's carried values are its operands (the values they enter the first iteration with), its
block arguments (what each iteration starts from, passed on by its terminator) and its results
(after the last iteration), as MLIR's scf.for iter_args.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import HasParent, IsTerminator, MemoryReadEffect, MemoryWriteEffect, NoTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface
from k3compile.ir.k3s.types import expect_dims, is_power_of_two, tile_dims, TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


def _verify_carried(op: IRDLOperation, loop: str) -> None:
    """A loop's operands, block arguments and results: one of each per carried value, of one type."""
    initial = [v.type for v in op.initial]
    carried = [a.type for a in op.body.block.args]
    results = [r.type for r in op.results]
    if not initial == carried == results:
        raise VerifyException(f"{op.name}: the {loop}'s initial values, block arguments and results must have the "
                              f"same types, got ({', '.join(map(str, initial))}), ({', '.join(map(str, carried))}) "
                              f"and ({', '.join(map(str, results))})")


@irdl_op_definition
class ColumnLoopOp(KeywordSyntax):
    """Loop over the hidden columns of a program's rows in blocks of `columns` (a power of two;
    the last block partial), carrying values across blocks as a source loop does (sums over the
    columns: the rows' dots and sums of squares), or writing a block's rows before the next block
    is read (Block AttnRes's phase 1 in blocks of columns, both directions). Inside it a `<D>`
    tile is the block's columns; its kernel's num_stages pipelines it."""

    name = "k3s.column_loop"
    columns = prop_def(IntegerAttr[I64])
    # the blocks last to first (absent: first to last): a second sweep over rows the first sweep
    # just read finds its last blocks, the most recent, still in the L2 cache
    reverse = opt_prop_def(BoolAttr)
    initial = var_operand_def(TileType)
    body = region_def("single_block")
    carried = var_result_def(TileType)

    def verify_(self) -> None:
        if not is_power_of_two(self.columns.value.data):
            raise VerifyException(f"{self.name}: columns must be a power of two, got {self.columns.value.data}")
        _verify_carried(self, "column loop")


@irdl_op_definition
class NextColumnOp(KeywordSyntax):
    """The carried values the next block of columns starts from."""

    name = "k3s.next_column"
    carried = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(ColumnLoopOp))


class RowGroupLoop(KeywordSyntax):
    """What the loops over a program's group of `rows` token rows (fewer in the last group) share:
    the count, and values carried through the loop (its operands, block arguments and results)."""

    rows = prop_def(IntegerAttr[I64])
    initial = var_operand_def(TileType)
    body = region_def("single_block")
    carried = var_result_def(TileType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        if self.rows.value.data < 1:
            raise VerifyException(f"{self.name}: rows must be positive, got {self.rows.value.data}")
        _verify_carried(self, self.name.removeprefix("k3s.").replace("_", " "))


@irdl_op_definition
class FoldQueryOp(KeywordSyntax):
    """q = w * gain: the RMSNorm gain folded into the pseudo-query, so normalised sources
    are never materialised; w and gain are the tensors it reads ([hidden_size] each, a `<D>`
    tile). With `queries` (Block AttnRes's phase 1) they are a block's queries and gains
    ([Q, hidden_size] each) and it folds the program's block of that many of them (a power of
    two; fewer in the last block): a `<Q x D>` tile."""

    name = "k3s.fold_query"
    hidden_size = prop_def(IntegerAttr[I64])
    queries = opt_prop_def(IntegerAttr[I64])
    pseudo_query = operand_def(TensorType)
    gain = operand_def(TensorType)
    query = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        if self.queries is not None and not is_power_of_two(self.queries.value.data):
            raise VerifyException(f"{self.name}: queries must be a power of two, got {self.queries.value.data}")
        expect_dims(self, "the folded query", tile_dims(self.query), ("D",) if self.queries is None else ("Q", "D"))


@irdl_op_definition
class SoftmaxStartOp(KeywordSyntax):
    """The online softmax before any source: running max = -inf, normaliser = 0, mix = 0."""

    name = "k3s.softmax_start"
    running_max = result_def(TileType)
    normaliser = result_def(TileType)
    mix = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class RowLoopOp(RowGroupLoop):
    """Loop over the program's group of `rows` token rows (fewer in the last group), one row
    after another, carrying values across rows (the query's cotangent, summed over the group):
    they enter the first row as its operands, each row starts from its block arguments and
    passes them on by `next_row`; its results are their values after the group's last row."""

    name = "k3s.row_loop"


@irdl_op_definition
class ZerosOp(KeywordSyntax):
    """A tile of zeros (fp32): where a sum starts (the query's cotangent over a group of rows,
    what re-centres a row's share of it)."""

    name = "k3s.zeros"
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, RowLoopOp), Pure())


@irdl_op_definition
class NextRowOp(KeywordSyntax):
    """The carried values the next row starts from."""

    name = "k3s.next_row"
    carried = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(RowLoopOp))


@irdl_op_definition
class SourceLoopOp(KeywordSyntax, RuntimeSizesInterface):
    """Loop over the depth sources of one row, reading each source row once, carrying values
    across sources: they enter the first source as its operands (the online softmax's start in
    the forward, the query's cotangent so far in the backward), each source starts from its
    block arguments and passes them on by `next_source`; its results are their values after
    the last source."""

    name = "k3s.source_loop"
    initial = var_operand_def(TileType)
    body = region_def("single_block")
    carried = var_result_def(TileType)
    traits = traits_def(HasParent(KernelOp, RowLoopOp))

    def verify_(self) -> None:
        _verify_carried(self, "source loop")

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R")  # the call's sources, each of R rows


@irdl_op_definition
class RowSourceLoopOp(RowGroupLoop, RuntimeSizesInterface):
    """The source loops of the program's group of `rows` token rows (fewer in the last group) as
    one loop over (row, source) pairs, sources innermost, so that a row's first sources are read
    while the row before is scored and stored (one pipelined loop has no gap between rows). It
    carries the online softmax as a source loop does; `row_start` restarts it at a row's first
    source and `at_row_end` holds what follows a row's last source."""

    name = "k3s.row_source_loop"

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R")  # the call's sources, each of R rows


@irdl_op_definition
class RowStartOp(KeywordSyntax):
    """The running max at a row's first source -inf, at its other sources as carried: the online
    softmax then rescales what came before by exp(-inf) = 0, so the normaliser and the mix of the
    row before restart with it."""

    name = "k3s.row_start"
    running_max = operand_def(TileType)
    started_max = result_def(TileType)
    traits = traits_def(HasParent(RowSourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}


@irdl_op_definition
class AtRowEndOp(KeywordSyntax):
    """Its body runs after a row's last source only (the row's stores)."""

    name = "k3s.at_row_end"
    body = region_def("single_block")
    traits = traits_def(HasParent(RowSourceLoopOp), NoTerminator())


@irdl_op_definition
class NextSourceOp(KeywordSyntax):
    """The carried values the next source starts from (forward: the running max, normaliser
    and mix)."""

    name = "k3s.next_source"
    carried = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(SourceLoopOp, RowSourceLoopOp))


@irdl_op_definition
class LoadSourceOp(KeywordSyntax):
    """This source's row of `sources` ([S, .., hidden_size]: a row of hidden_size columns per
    source and token), in fp32."""

    name = "k3s.load_source"
    sources = operand_def(TensorType)
    row = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp, RowSourceLoopOp), MemoryReadEffect())


@irdl_op_definition
class RmsScoreOp(KeywordSyntax):
    """score_i = q . x_i / sqrt(mean(x_i^2) + eps): the RMS folded into the score."""

    name = "k3s.rms_score"
    eps = prop_def(FloatAttr)
    row = operand_def(TileType)
    query = operand_def(TileType)
    score = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp, RowSourceLoopOp), Pure())


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
    traits = traits_def(HasParent(SourceLoopOp, RowSourceLoopOp), Pure())
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
    traits = traits_def(HasParent(SourceLoopOp, RowSourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}


@irdl_op_definition
class NormalizeStoreOp(KeywordSyntax):
    """h = acc / normaliser, stored to the row of `out` in its dtype."""

    name = "k3s.normalize_store"
    mix = operand_def(TileType)
    normaliser = operand_def(TileType)
    out = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp, AtRowEndOp))


@irdl_op_definition
class StoreLseOp(KeywordSyntax):
    """L = max + log(normaliser), the log-sum-exp of the row's scores over its sources, stored
    (fp32) to the row of `lse` ([B, T]) when the caller asks for it (an optional output): what
    the backward recomputes the softmax weights from, p_i = exp(score_i - L)."""

    name = "k3s.store_lse"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    lse = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp, AtRowEndOp), MemoryWriteEffect())


# --- the backward's stages -----------------------------------------------------------------


@irdl_op_definition
class LoadRowOp(KeywordSyntax):
    """This row of a per-row tensor, in fp32: a `<D>` tile of a [B, T, hidden_size] tensor (the
    saved output h, its cotangent dh) or a `<>` one of a [B, T] tensor (the saved log-sum-exp)."""

    name = "k3s.load_row"
    tensor = operand_def(TensorType)
    row = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        rank = len(self.tensor.type.dims)
        if rank not in (2, 3):
            raise VerifyException(f"{self.name}: reads a [B, T] or [B, T, hidden_size] tensor, got rank {rank}")
        expect_dims(self, "the row", tile_dims(self.row), ("D",) if rank == 3 else ())


@irdl_op_definition
class SoftmaxDeltaOp(KeywordSyntax):
    """delta = dh . h: the softmax's row correction sum_i p_i (dh . x_i), read off the saved
    output h = sum_i p_i x_i and its cotangent dh before the sources (FlashAttention's
    D = rowsum(dO * O)), for the sources' cotangents; h is rounded to its dtype. Per query for a
    block of queries (`<Q x D>` rows, a `<Q>` delta: Block AttnRes's phase 1)."""

    name = "k3s.softmax_delta"
    out_bar = operand_def(TileType)
    out = operand_def(TileType)
    delta = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), Pure())

    def verify_(self) -> None:
        per_query = ("Q",) if len(tile_dims(self.out_bar)) == 2 else ()
        expect_dims(self, "dh", tile_dims(self.out_bar), (*per_query, "D"))
        expect_dims(self, "h", tile_dims(self.out), (*per_query, "D"))
        expect_dims(self, "delta", tile_dims(self.delta), per_query)


@irdl_op_definition
class SoftmaxWeightOp(KeywordSyntax):
    """p_i = exp(score_i - L): this source's softmax weight, recomputed from the row's saved
    log-sum-exp L (never above 1)."""

    name = "k3s.softmax_weight"
    score = operand_def(TileType)
    lse = operand_def(TileType)
    weight = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())


@irdl_op_definition
class WeightCotangentOp(KeywordSyntax):
    """dp_i = dh . x_i: the cotangent of this source's softmax weight, through the mix
    h = sum_i p_i x_i."""

    name = "k3s.weight_cotangent"
    row = operand_def(TileType)
    out_bar = operand_def(TileType)
    weight_bar = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())


@irdl_op_definition
class SoftmaxAdjointOp(KeywordSyntax):
    """score_bar_i = p_i (dp_i - delta): the cotangent of this source's score, the softmax's
    vector-Jacobian product of the weights' cotangents (delta their p-weighted sum)."""

    name = "k3s.softmax_adjoint"
    weight = operand_def(TileType)
    weight_bar = operand_def(TileType)
    delta = operand_def(TileType)
    score_bar = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())


@irdl_op_definition
class RmsScoreAdjointOp(KeywordSyntax):
    """The source's side of the adjoint of score = q . x / rho, rho = sqrt(mean(x^2) + eps)
    (rho recomputed): x_bar = score_bar (q - score x / (D rho)) / rho."""

    name = "k3s.rms_score_adjoint"
    eps = prop_def(FloatAttr)
    row = operand_def(TileType)
    query = operand_def(TileType)
    score = operand_def(TileType)
    score_bar = operand_def(TileType)
    row_bar = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())


@irdl_op_definition
class QueryAdjointOp(KeywordSyntax):
    """The query's side of the score's adjoint, one source further: q_bar += score_bar_i k_i, with
    k_i = x_i / rho_i (rho recomputed); and what re-centres it after the row's last source:
    kbar += p_i k_i, sigma += score_bar_i. Each in place (q_bar the sum over the program's rows so
    far, kbar and sigma the row's)."""

    name = "k3s.query_adjoint"
    eps = prop_def(FloatAttr)
    row = operand_def(TileType)
    weight = operand_def(TileType)
    score_bar = operand_def(TileType)
    query_bar = operand_def(TileType)
    key_mean = operand_def(TileType)
    score_bar_sum = operand_def(TileType)
    updated_query_bar = result_def(TileType)
    updated_key_mean = result_def(TileType)
    updated_score_bar_sum = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 3, 1: 4, 2: 5}


@irdl_op_definition
class RecentreQueryAdjointOp(KeywordSyntax):
    """q_bar -= sigma kbar. The softmax's vector-Jacobian product sums to zero over the sources;
    scores' cotangents made with delta from a rounded saved output sum to sigma instead. Taking
    p_i sigma from each (so that they sum to zero, as delta from the sources themselves would
    give) takes sigma kbar from the row's share of the query's cotangent (in place)."""

    name = "k3s.recentre_query_adjoint"
    query_bar = operand_def(TileType)
    key_mean = operand_def(TileType)
    score_bar_sum = operand_def(TileType)
    updated = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}


@irdl_op_definition
class MixAdjointOp(KeywordSyntax):
    """x_bar' = x_bar + p_i dh: the mix's cotangent of this source added to its cotangent
    through the score (in place of x_bar)."""

    name = "k3s.mix_adjoint"
    row_bar = operand_def(TileType)
    weight = operand_def(TileType)
    out_bar = operand_def(TileType)
    updated = result_def(TileType)
    traits = traits_def(HasParent(SourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}


@irdl_op_definition
class StoreSourceCotangentOp(KeywordSyntax):
    """This source's row of `dsources` ([S, .., hidden_size], the dtype of the sources): each
    element is written once, by the program of its row."""

    name = "k3s.store_source_cotangent"
    row_bar = operand_def(TileType)
    dsources = operand_def(TensorType)
    traits = traits_def(HasParent(SourceLoopOp), MemoryWriteEffect())


@irdl_op_definition
class StoreQueryCotangentOp(KeywordSyntax):
    """The fold's adjoint: q = w * gain, so dw += q_bar * gain and dgain += q_bar * w, where
    q_bar is the query's cotangent summed over the program's rows; added (fp32 atomics) into
    the zero-filled `dquery` and `dgain` ([hidden_size] each), which every program shares."""

    name = "k3s.store_query_cotangent"
    query_bar = operand_def(TileType)
    pseudo_query = operand_def(TensorType)
    gain = operand_def(TensorType)
    dquery = operand_def(TensorType)
    dgain = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect(), MemoryWriteEffect())


ATTNRES_STAGES = [
    ColumnLoopOp, NextColumnOp, FoldQueryOp, SoftmaxStartOp, ZerosOp, RowLoopOp, NextRowOp, SourceLoopOp,
    RowSourceLoopOp, RowStartOp, AtRowEndOp,
    NextSourceOp, LoadSourceOp, RmsScoreOp, OnlineSoftmaxOp, MixAccumulateOp, NormalizeStoreOp, StoreLseOp, LoadRowOp,
    SoftmaxDeltaOp, SoftmaxWeightOp, WeightCotangentOp, SoftmaxAdjointOp, RmsScoreAdjointOp, MixAdjointOp, StoreSourceCotangentOp,
    QueryAdjointOp, RecentreQueryAdjointOp, StoreQueryCotangentOp,
]
