"""Block AttnRes's phase 1 backward in blocks of columns
(derive-block-attnres-backward{partials-backward=columns}, docs/attnres.md): the forward's
columns form run backwards. The call's queries folded once (k3s.fold_queries_split, the
forward's fold kernel); a program per group of token rows with all the call's queries and all of
a row's representatives, sweeping the hidden columns twice with the products on the tensor
cores: the dots of the softmax's adjoint on the first sweep, each (row, representative)'s
coefficients between the sweeps, the representatives' cotangents written once on the second
(k3s.store_group_rows, the forward's); then a kernel of its own sums the queries' cotangents over
the rows. `<R x S ..>` tiles hold the group's (row, representative) pairs, `<R x Q ..>` its
(row, query) pairs, as the forward's.

Per token row, representative i and query j (rho_i = sqrt(mean(b_i^2) + eps), s_ij = q_j . b_i /
rho_i, lse_j and its cotangent lse_bar_j, dh_j the mix's cotangent):
p_ij = exp(s_ij - lse_j), delta_j = sum_i p_ij (dh_j . b_i), s_bar_ij = p_ij (dh_j . b_i - delta_j +
lse_bar_j), t_ij = s_bar_ij / rho_i, c_i = sum_j s_bar_ij s_ij / (D rho_i^2), and
b_bar_i = sum_j (t_ij q_j + p_ij dh_j) - c_i b_i, q_bar_j = sum over rows and i of t_ij b_i.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def, traits_def
from xdsl.traits import HasParent, MemoryReadEffect, MemoryWriteEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.attnres import ColumnLoopOp
from k3compile.ir.k3s.attnres_blocks import _expect, _expect_rank
from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface
from k3compile.ir.k3s.types import TensorType, TileType, is_power_of_two
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class LoadGroupRowsOp(KeywordSyntax, RuntimeSizesInterface):
    """The group's (row, query) rows of a per-query tensor ([Q, B, T, hidden_size]: the mixes'
    cotangents) over the column loop's block of columns, in their dtype: a `<R x Q x D>` tile
    (masked queries, and rows past the call's, read 0). `last_use`: their second read (a cache
    hint, as k3s.load_group_sources')."""

    name = "k3s.load_group_rows"
    last_use = opt_prop_def(BoolAttr)
    tensor = operand_def(TensorType)
    rows = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("the rows", self.rows, ("R", "Q", "D")))
        _expect_rank(self, "the rows' tensor", self.tensor, 4)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R", "Q")


@irdl_op_definition
class GroupOutBarDotsOp(KeywordSyntax):
    """The mixes' cotangents' dots with the group's representative rows, summed over the columns
    one block further (in place): `<R x Q x R x S>`, entry ((r, j), (r', i)) = dh_rj . b_r'i (the
    entries r' != r computed and unused, as the Gram matrix's are). Products of rows in their
    dtype (exact) with fp32 sums."""

    name = "k3s.group_out_bar_dots"
    out_bar = operand_def(TileType)
    rows = operand_def(TileType)
    dots = operand_def(TileType)
    new_dots = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 2}

    def verify_(self) -> None:
        _expect(self, ("dh", self.out_bar, ("R", "Q", "D")), ("the rows", self.rows, ("R", "S", "D")),
                ("dh . x", self.dots, ("R", "Q", "R", "S")), ("dh . x", self.new_dots, ("R", "Q", "R", "S")))


@irdl_op_definition
class LoadGroupStatsOp(KeywordSyntax, RuntimeSizesInterface):
    """The group's rows of a per-query statistic ([Q, B, T] fp32: the saved log-sum-exps, their
    cotangents) as a `<R x Q>` tile (masked queries and rows read 0)."""

    name = "k3s.load_group_stats"
    tensor = operand_def(TensorType)
    stats = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("the statistics", self.stats, ("R", "Q")))
        _expect_rank(self, "the statistics' tensor", self.tensor, 3)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R", "Q")


@irdl_op_definition
class GroupScoreAdjointOp(KeywordSyntax, RuntimeSizesInterface):
    """Every (row, representative, query)'s softmax adjoint from the scores s and RMS rho
    (k3s.group_scores), the dots dh . x (k3s.group_out_bar_dots' diagonal blocks) and the saved
    lse and its cotangent lse_bar (`<R x Q>`): p = exp(s - lse) (0 for masked representatives,
    queries and rows), delta = sum_i p_i (dh . x_i) per row and query (from the representatives:
    the saved mix is not read, nothing to re-centre), s_bar = p (dh . x - delta + lse_bar).
    Results: p laid out block-diagonally as k3s.group_softmax's weights (`<R x Q x R x S>`, so the
    group's sum_j p_ij dh_j is one product with its `<R x Q x D>` rows), t = s_bar / rho
    (`<R x S x Q>`) and c = sum_j s_bar_j s_j / (D rho^2) (`<R x S>`)."""

    name = "k3s.group_score_adjoint"
    score = operand_def(TileType)
    rms = operand_def(TileType)
    out_bar_dots = operand_def(TileType)
    lse = operand_def(TileType)
    lse_bar = operand_def(TileType)
    weights = result_def(TileType)
    scaled_score_bar = result_def(TileType)
    centre = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())

    def verify_(self) -> None:
        _expect(self, ("the scores", self.score, ("R", "S", "Q")), ("the RMS", self.rms, ("R", "S")),
                ("dh . x", self.out_bar_dots, ("R", "Q", "R", "S")), ("lse", self.lse, ("R", "Q")),
                ("lse_bar", self.lse_bar, ("R", "Q")), ("p", self.weights, ("R", "Q", "R", "S")),
                ("t", self.scaled_score_bar, ("R", "S", "Q")), ("c", self.centre, ("R", "S")))

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R", "Q")


@irdl_op_definition
class StoreGroupScoreBarsOp(KeywordSyntax, RuntimeSizesInterface):
    """The group's t (`<R x S x Q>`) to `score_bars` ([S, B, T, Q] fp32, a workspace): what the
    queries' cotangents are summed from (k3s.group_query_cotangent)."""

    name = "k3s.store_group_score_bars"
    scaled_score_bar = operand_def(TileType)
    score_bars = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp), MemoryWriteEffect())

    def verify_(self) -> None:
        _expect(self, ("t", self.scaled_score_bar, ("R", "S", "Q")))
        _expect_rank(self, "score_bars", self.score_bars, 4)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R", "Q")


@irdl_op_definition
class GroupSourcesAdjointOp(KeywordSyntax):
    """The group's representatives' cotangents over the block of columns, every query's share
    summed: b_bar_i = sum_j (t_ij q_j + p_ij dh_j) - c_i b_i (`<R x S x D>`, fp32), as products:
    t (both parts of t / t_scale, k3s.split_weights') with the folded queries (both parts; the
    product of the two rests left out: 2^-16 of t q at bf16) times t_scale, the block-diagonal p
    (both parts) transposed with the group's (row, query) rows dh, less c b."""

    name = "k3s.group_sources_adjoint"
    rows = operand_def(TileType)
    high = operand_def(TileType)
    low = operand_def(TileType)
    out_bar = operand_def(TileType)
    score_bar_high = operand_def(TileType)
    score_bar_low = operand_def(TileType)
    score_bar_scale = operand_def(TileType)
    weight_high = operand_def(TileType)
    weight_low = operand_def(TileType)
    centre = operand_def(TileType)
    rows_bar = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), Pure())

    def verify_(self) -> None:
        _expect(self, ("the rows", self.rows, ("R", "S", "D")), ("the high part", self.high, ("Q", "D")),
                ("the low part", self.low, ("Q", "D")), ("dh", self.out_bar, ("R", "Q", "D")),
                ("t's high part", self.score_bar_high, ("R", "S", "Q")),
                ("t's low part", self.score_bar_low, ("R", "S", "Q")), ("t's scale", self.score_bar_scale, ()),
                ("p's high part", self.weight_high, ("R", "Q", "R", "S")),
                ("p's low part", self.weight_low, ("R", "Q", "R", "S")), ("c", self.centre, ("R", "S")),
                ("the rows' cotangents", self.rows_bar, ("R", "S", "D")))


@irdl_op_definition
class GroupQueryCotangentOp(KeywordSyntax, RuntimeSizesInterface):
    """The queries' cotangents over the program's block of `columns` hidden columns, summed over
    its part of the call's token rows (`rows` of them, all their representatives):
    q_bar_j = sum_(row, i) t_ij b_i (`<Q x D>`, fp32), from `score_bars` ([S, B, T, Q] fp32:
    k3s.store_group_score_bars') and the representatives, `pairs` (row, representative) pairs a
    product (their t split in two parts of the representatives' dtype over a power of two, as
    k3s.split_weights with a scale: in fp16's range whatever the cotangents' scale)."""

    name = "k3s.group_query_cotangent"
    hidden_size = prop_def(IntegerAttr[I64])
    columns = prop_def(IntegerAttr[I64])
    rows = prop_def(IntegerAttr[I64])
    pairs = prop_def(IntegerAttr[I64])
    score_bars = operand_def(TensorType)
    representatives = operand_def(TensorType)
    query_bar = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("q_bar", self.query_bar, ("Q", "D")))
        columns, rows, pairs = (p.value.data for p in (self.columns, self.rows, self.pairs))
        if not is_power_of_two(columns) or not is_power_of_two(pairs) or pairs < 16 or rows % pairs:
            raise VerifyException(f"{self.name}: columns and pairs must be powers of two, pairs at least 16 "
                                  f"(tl.dot's least) and rows a multiple of pairs; got columns = {columns}, "
                                  f"rows = {rows}, pairs = {pairs}")
        for what, tensor in (("score_bars", self.score_bars), ("representatives", self.representatives)):
            _expect_rank(self, what, tensor, 4)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R", "Q")


BLOCK_ATTNRES_COLUMNS_BACKWARD_STAGES = [LoadGroupRowsOp, GroupOutBarDotsOp, LoadGroupStatsOp, GroupScoreAdjointOp,
                                         StoreGroupScoreBarsOp, GroupSourcesAdjointOp, GroupQueryCotangentOp]
