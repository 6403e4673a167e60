"""Block AttnRes's phase 1 forward in blocks of columns (derive-block-attnres{partials-schedule=columns},
docs/attnres.md): the call's queries folded once by a kernel of their own, then a program per
group of token rows with all the call's queries and all of a row's representatives, sweeping the
hidden columns twice: the Gram matrix and the queries' dots on the first sweep, the softmax
between the sweeps, each (row, query)'s mix written on the second. `<R x S ..>` tiles hold the
group's (row, representative) pairs, `<R x Q ..>` its (row, query) pairs.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.irdl import (irdl_op_definition, operand_def, opt_prop_def, opt_result_def, prop_def, result_def, traits_def,
                       var_operand_def)
from xdsl.traits import HasParent, MemoryReadEffect, MemoryWriteEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.attnres import ColumnLoopOp
from k3compile.ir.k3s.attnres_blocks import _expect, _expect_rank
from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface
from k3compile.ir.k3s.types import TensorType, TileType, tile_dims
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class FoldQueriesSplitOp(KeywordSyntax, RuntimeSizesInterface):
    """q_j = w_j * gain_j for every query j of the call over the program's block of `columns`
    hidden columns (a kernel of its own, grid input_block), stored split to `folded` ([2, Q,
    hidden_size] in the activations' dtype): folded[0] = q rounded to that dtype, folded[1] = the
    rest q - folded[0] rounded, so that a product with a row of the activations' dtype sums two
    exact products (q to 2^-17 of itself at bf16; at fp32 folded[0] is q and folded[1] zero)."""

    name = "k3s.fold_queries_split"
    hidden_size = prop_def(IntegerAttr[I64])
    columns = prop_def(IntegerAttr[I64])
    queries = operand_def(TensorType)
    gains = operand_def(TensorType)
    folded = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect(), MemoryWriteEffect())

    def verify_(self) -> None:
        for what, tensor, rank in (("queries", self.queries, 2), ("gains", self.gains, 2), ("folded", self.folded, 3)):
            _expect_rank(self, what, tensor, rank)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("Q",)


@irdl_op_definition
class LoadGroupSourcesOp(KeywordSyntax, RuntimeSizesInterface):
    """The program's `rows` token rows' representatives (at most `sources` a row; masked ones,
    and rows past the call's, read 0) over the column loop's block of columns, in their dtype:
    a `<R x S x D>` tile. `last_use`: the second read of these rows (a cache hint: they need not
    stay in L2); absent, they are read again later (kept there if they can be)."""

    name = "k3s.load_group_sources"
    hidden_size = prop_def(IntegerAttr[I64])
    rows = prop_def(IntegerAttr[I64])
    sources = prop_def(IntegerAttr[I64])
    last_use = opt_prop_def(BoolAttr)
    representatives = operand_def(TensorType)
    tile = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("the rows", self.tile, ("R", "S", "D")))
        _expect_rank(self, "representatives", self.representatives, 4)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R")


@irdl_op_definition
class LoadFoldedQueriesOp(KeywordSyntax, RuntimeSizesInterface):
    """The call's folded queries over the column loop's block of columns, both parts of their
    split (k3s.fold_queries_split), in their dtype: two `<Q x D>` tiles (masked queries read 0)."""

    name = "k3s.load_folded_queries"
    folded = operand_def(TensorType)
    high = result_def(TileType)
    low = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("the high part", self.high, ("Q", "D")), ("the low part", self.low, ("Q", "D")))
        _expect_rank(self, "folded", self.folded, 3)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("Q",)


@irdl_op_definition
class GroupColumnDotsOp(KeywordSyntax):
    """The group's sums over its columns, one block further (in place): the Gram matrix of its
    (row, representative) rows, `<R x S x R x S>` (a row's sum of squares is its diagonal entry;
    products of rows of different token rows are computed and unused), and every query's dot with
    every (row, representative) row, `<Q x R x S>` (high and low parts of the folded queries
    summed). Products of rows in their dtype (exact) with fp32 sums: no rescaling, so a sum of
    squares past fp32's range is caught later (k3s.group_scores)."""

    name = "k3s.group_column_dots"
    rows = operand_def(TileType)
    high = operand_def(TileType)
    low = operand_def(TileType)
    gram = operand_def(TileType)
    query_dots = operand_def(TileType)
    new_gram = result_def(TileType)
    new_query_dots = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 3, 1: 4}

    def verify_(self) -> None:
        _expect(self, ("the rows", self.rows, ("R", "S", "D")), ("the high part", self.high, ("Q", "D")),
                ("the low part", self.low, ("Q", "D")), ("the Gram matrix", self.gram, ("R", "S", "R", "S")),
                ("q . x", self.query_dots, ("Q", "R", "S")), ("the Gram matrix", self.new_gram, ("R", "S", "R", "S")),
                ("q . x", self.new_query_dots, ("Q", "R", "S")))


@irdl_op_definition
class GroupScoresOp(KeywordSyntax, RuntimeSizesInterface):
    """Every (row, representative, query)'s score q . x / rho, rho = sqrt(mean(x^2) + eps), from
    the Gram matrix's diagonal and the dots (`<R x S x Q>`). Right for every finite row: where a
    row's sum of squares is past 2^100 or its mean plus eps below 2^-100 (squares that overflowed,
    or underflowed where eps does not outweigh them), the program's rows are read again
    (`representatives`, `folded`) and summed scaled by their running max-abs, as
    k3s.column_dots does."""

    name = "k3s.group_scores"
    eps = prop_def(FloatAttr)
    gram = operand_def(TileType)
    query_dots = operand_def(TileType)
    representatives = operand_def(TensorType)
    folded = operand_def(TensorType)
    score = result_def(TileType)
    # where asked for (the backward's coefficients divide by it), rho itself: `<R x S>`, from the
    # sums of squares, or from the scaled sums where the program's rows were read again
    rms = opt_result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect(self, ("the Gram matrix", self.gram, ("R", "S", "R", "S")), ("q . x", self.query_dots, ("Q", "R", "S")),
                ("the scores", self.score, ("R", "S", "Q")))
        if self.rms is not None:
            _expect(self, ("the RMS", self.rms, ("R", "S")))

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S", "R", "Q")


@irdl_op_definition
class GroupSoftmaxOp(KeywordSyntax, RuntimeSizesInterface):
    """Per row and query the softmax over the row's representatives (masked ones weigh 0): its
    max m and normaliser z = sum_i exp(s_i - m) (`<R x Q>` each) and the mix's weights as a
    block-diagonal `<R x Q x R x S>` tile (row (r, j), column (r', i): the weight of
    representative i of row r in query j's mix if r' = r, else 0), so the group's mixes are one
    product with its `<R x S x D>` rows. `normalised`: p = exp(s - m) / z; absent, exp(s - m)
    (the un-normalised mix, k3s.store_partials' numerator)."""

    name = "k3s.group_softmax"
    normalised = opt_prop_def(BoolAttr)
    score = operand_def(TileType)
    running_max = result_def(TileType)
    normaliser = result_def(TileType)
    weights = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())

    def verify_(self) -> None:
        _expect(self, ("the scores", self.score, ("R", "S", "Q")), ("the max", self.running_max, ("R", "Q")),
                ("the normaliser", self.normaliser, ("R", "Q")), ("the weights", self.weights, ("R", "Q", "R", "S")))

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("S",)


@irdl_op_definition
class StoreGroupStatsOp(KeywordSyntax, RuntimeSizesInterface):
    """The group's softmax statistics per row and query: to `block_lse` ([Q, B, T] fp32) the
    log-sum-exp m + log z (one tensor: the normalised partials), or m to `block_max` and z to
    `block_normaliser` (two: the numerator form)."""

    name = "k3s.store_group_stats"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    stats = var_operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp), MemoryWriteEffect())

    def verify_(self) -> None:
        _expect(self, ("the max", self.running_max, ("R", "Q")), ("the normaliser", self.normaliser, ("R", "Q")))
        if len(self.stats) not in (1, 2):
            raise VerifyException(f"{self.name}: stores to block_lse, or to block_max and block_normaliser; "
                                  f"got {len(self.stats)} tensors")
        for tensor in self.stats:
            _expect_rank(self, "a statistic", tensor, 3)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R", "Q")


@irdl_op_definition
class SplitWeightsOp(KeywordSyntax):
    """fp32 coefficients of a product with the group's rows (the mix's weights `<R x Q x R x S>`;
    in the backward also t, `<R x S x Q>`) as two tiles in the dtype of `representatives` (its
    dtype only is read): the coefficients rounded, and the rest rounded, so that their products
    with the rows sum to the fp32 coefficients' to 2^-17 at bf16 (at fp32 the first is the
    coefficients, the second zero). With a `scale` result (`<>`: coefficients of no fixed range,
    as t, the mixes' and log-sum-exps' cotangents' scale) the coefficients are divided first by
    scale = 2^ceil(log2(max |w|)) (at least 2^-100), so that both parts stay in fp16's normal
    range, and the parts' products are to be multiplied back by it."""

    name = "k3s.split_weights"
    weights = operand_def(TileType)
    representatives = operand_def(TensorType)
    high = result_def(TileType)
    low = result_def(TileType)
    scale = opt_result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())

    def verify_(self) -> None:
        dims = tile_dims(self.weights)
        if dims not in (("R", "Q", "R", "S"), ("R", "S", "Q")):
            raise VerifyException(f"{self.name}: the weights must be <R x Q x R x S> or <R x S x Q>, got "
                                  f"<{' x '.join(dims)}>")
        _expect(self, ("the high part", self.high, dims), ("the low part", self.low, dims))
        if self.scale is not None:
            _expect(self, ("the scale", self.scale, ()))


@irdl_op_definition
class GroupMixOp(KeywordSyntax):
    """Every (row, query)'s mix over the block of columns, the block-diagonal weights' (both
    parts) product with the group's rows: `<R x Q x D>`, fp32."""

    name = "k3s.group_mix"
    rows = operand_def(TileType)
    high = operand_def(TileType)
    low = operand_def(TileType)
    mix = result_def(TileType)
    traits = traits_def(HasParent(ColumnLoopOp), Pure())

    def verify_(self) -> None:
        _expect(self, ("the rows", self.rows, ("R", "S", "D")), ("the high part", self.high, ("R", "Q", "R", "S")),
                ("the low part", self.low, ("R", "Q", "R", "S")), ("the mixes", self.mix, ("R", "Q", "D")))


@irdl_op_definition
class StoreGroupRowsOp(KeywordSyntax, RuntimeSizesInterface):
    """The group's rows over the block of columns to `tensor`, each element once (a cache hint:
    not kept in L2): its (row, query) rows (`<R x Q x D>`) to a [Q, B, T, hidden_size] tensor
    (block_mix in the activations' dtype, or block_numerator in fp32), or its (row,
    representative) rows (`<R x S x D>`: the representatives' cotangents) to an [S, B, T,
    hidden_size] one (in its dtype; no atomics)."""

    name = "k3s.store_group_rows"
    rows = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(ColumnLoopOp), MemoryWriteEffect())

    def verify_(self) -> None:
        dims = tile_dims(self.rows)
        if dims not in (("R", "Q", "D"), ("R", "S", "D")):
            raise VerifyException(f"{self.name}: the rows must be <R x Q x D> or <R x S x D>, got <{' x '.join(dims)}>")
        _expect_rank(self, "the rows' tensor", self.tensor, 4)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("R", "Q") if "Q" in tile_dims(self.rows) else ("S", "R")


BLOCK_ATTNRES_COLUMNS_STAGES = [FoldQueriesSplitOp, LoadGroupSourcesOp, LoadFoldedQueriesOp, GroupColumnDotsOp,
                                GroupScoresOp, GroupSoftmaxOp, StoreGroupStatsOp, SplitWeightsOp, GroupMixOp,
                                StoreGroupRowsOp]
