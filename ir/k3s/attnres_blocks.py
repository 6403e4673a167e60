"""Block AttnRes's two phases: where the aggregate's online softmax stops and where it resumes.

Phase 1 (`block_partials`) runs the aggregate's loop over a block's completed representatives
for the program's block of the block's queries and stores what the loop carries instead of
normalising it: per query and token row the running max, the normaliser and the un-normalised
mix (k3s.store_partials). Phase 2 (`block_merge`) starts the aggregate's loop from one query's
stored partials instead of from nothing (k3s.load_partials, in place of k3s.softmax_start) and
takes it over the block's current partial sum: one step of the online softmax from the partials
is split-KV attention's merge. derive-block-attnres derives both from fuse-attnres's aggregate.
The partials are stored in one of two forms: as the loop carries them (m, z, a; fp32), or
normalised (the log-sum-exp and a / z in the activations' dtype: k3s.store_normalised_partials).

Their backward (derive-block-attnres-backward) is the aggregate's backward with the same splits:
phase 1's batched over the program's block of queries, each query's saved rows loaded
(k3s.load_query_rows), the log-sum-exp's cotangent taken into the softmax's (k3s.lse_adjoint), a
representative's cotangent summed over the block's queries and added to the other blocks'
(k3s.add_source_cotangent); phase 2's with the partials as one more source before the partial
sum, whose score is their log-sum-exp and whose row their mix (k3s.partials_adjoint,
k3s.store_partials_cotangent).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import HasParent, MemoryReadEffect, MemoryWriteEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.attnres import AtRowEndOp, RowLoopOp, RowSourceLoopOp, SourceLoopOp
from k3compile.ir.k3s.kernels import KernelOp
from k3compile.ir.k3s.types import expect_dims, tile_dims, TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


def _expect_partials(op: IRDLOperation, running_max, normaliser, mix, rows: tuple[str, ...]) -> None:
    """The running max and normaliser one number per query (`rows`), the mix a row of D per query."""
    expect_dims(op, "the running max", tile_dims(running_max), rows)
    expect_dims(op, "the normaliser", tile_dims(normaliser), rows)
    expect_dims(op, "the mix", tile_dims(mix), (*rows, "D"))


def _expect_rank(op: IRDLOperation, what: str, tensor, rank: int) -> None:
    got = len(tensor.type.dims)
    if got != rank:
        raise VerifyException(f"{op.name}: {what} must have {rank} dimensions, got {got} ({tensor.type.pattern})")


@irdl_op_definition
class StorePartialsOp(KeywordSyntax):
    """Phase 1's end: the online softmax over the completed representatives, for the program's
    block of queries (`<Q>`, `<Q>`, `<Q x D>` tiles), stored as it stands instead of normalised:
    the running max m to `block_max` and the normaliser z = sum_i exp(s_i - m) to
    `block_normaliser` ([Q, B, T] fp32 each), the un-normalised mix a = sum_i exp(s_i - m) x_i to
    `block_numerator` ([Q, B, T, D] fp32): a's terms are the sources scaled by weights in (0, 1],
    so it is held as exactly as the aggregate's loop holds it."""

    name = "k3s.store_partials"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    mix = operand_def(TileType)
    block_max = operand_def(TensorType)
    block_normaliser = operand_def(TensorType)
    block_numerator = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp, AtRowEndOp), MemoryWriteEffect())

    def verify_(self) -> None:
        _expect_partials(self, self.running_max, self.normaliser, self.mix, ("Q",))
        for what, tensor, rank in (("block_max", self.block_max, 3), ("block_normaliser", self.block_normaliser, 3),
                                   ("block_numerator", self.block_numerator, 4)):
            _expect_rank(self, what, tensor, rank)


@irdl_op_definition
class LoadPartialsOp(KeywordSyntax):
    """Phase 2's start: one query's partials of this token row, the online softmax over the
    completed representatives as phase 1 left it (running max m, normaliser z: `<>`; the
    un-normalised mix a: `<D>`), from `block_max`, `block_normaliser` ([B, T] fp32) and
    `block_numerator` ([B, T, D] fp32). What the loop over the remaining sources starts from, in
    place of k3s.softmax_start's (-inf, 0, 0)."""

    name = "k3s.load_partials"
    block_max = operand_def(TensorType)
    block_normaliser = operand_def(TensorType)
    block_numerator = operand_def(TensorType)
    running_max = result_def(TileType)
    normaliser = result_def(TileType)
    mix = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, RowSourceLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect_partials(self, self.running_max, self.normaliser, self.mix, ())
        for what, tensor, rank in (("block_max", self.block_max, 2), ("block_normaliser", self.block_normaliser, 2),
                                   ("block_numerator", self.block_numerator, 3)):
            _expect_rank(self, what, tensor, rank)


@irdl_op_definition
class StoreNormalisedPartialsOp(KeywordSyntax):
    """Phase 1's end in the normalised form: the online softmax's state (m, z, a) stored as its
    log-sum-exp lse = m + log z to `block_lse` ([Q, B, T] fp32) and its normalised mix a / z to
    `block_mix` ([Q, B, T, D] in the activations' dtype). (lse, 1, a / z) is the same state as
    (m, z, a): with M = max(lse, s), e^(lse - M) = z e^(m - M), so the merge's numerator and
    normaliser are unchanged. a / z is a convex mix of the representatives, bounded by them (no
    overflow in fp16), and takes half the bytes of an fp32 row at bf16."""

    name = "k3s.store_normalised_partials"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    mix = operand_def(TileType)
    block_lse = operand_def(TensorType)
    block_mix = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp, AtRowEndOp), MemoryWriteEffect())

    def verify_(self) -> None:
        _expect_partials(self, self.running_max, self.normaliser, self.mix, ("Q",))
        for what, tensor, rank in (("block_lse", self.block_lse, 3), ("block_mix", self.block_mix, 4)):
            _expect_rank(self, what, tensor, rank)


@irdl_op_definition
class LoadNormalisedPartialsOp(KeywordSyntax):
    """Phase 2's start from the normalised partials of one query and token row: the state
    (running max, normaliser, mix) = (lse, 1, a / z), from `block_lse` ([B, T] fp32) and
    `block_mix` ([B, T, D], the activations' dtype), read as fp32."""

    name = "k3s.load_normalised_partials"
    block_lse = operand_def(TensorType)
    block_mix = operand_def(TensorType)
    running_max = result_def(TileType)
    normaliser = result_def(TileType)
    mix = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, RowSourceLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _expect_partials(self, self.running_max, self.normaliser, self.mix, ())
        for what, tensor, rank in (("block_lse", self.block_lse, 2), ("block_mix", self.block_mix, 3)):
            _expect_rank(self, what, tensor, rank)


@irdl_op_definition
class RowResumeOp(KeywordSyntax):
    """Phase 2 over a group of rows: at a row's first source the online softmax's state becomes
    the row's partials (`max_from`, `sum_from`, `mix_from`: a load of them), at its other sources
    it stays as carried. In place: the results are the carried values' registers."""

    name = "k3s.row_resume"
    running_max = operand_def(TileType)
    normaliser = operand_def(TileType)
    mix = operand_def(TileType)
    max_from = operand_def(TileType)
    sum_from = operand_def(TileType)
    mix_from = operand_def(TileType)
    resumed_max = result_def(TileType)
    resumed_sum = result_def(TileType)
    resumed_mix = result_def(TileType)
    traits = traits_def(HasParent(RowSourceLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0, 1: 1, 2: 2}

    def verify_(self) -> None:
        _expect_partials(self, self.running_max, self.normaliser, self.mix, ())
        _expect_partials(self, self.max_from, self.sum_from, self.mix_from, ())


# --- the backward of the two phases --------------------------------------------------------------


@irdl_op_definition
class LoadQueryRowsOp(KeywordSyntax):
    """This token row of a per-query tensor for the program's block of queries, in fp32: a `<Q>`
    tile of a [Q, B, T] tensor (the saved log-sum-exps, their cotangents) or a `<Q x D>` one of a
    [Q, B, T, hidden_size] tensor (the saved mixes, their cotangents); masked queries read 0."""

    name = "k3s.load_query_rows"
    tensor = operand_def(TensorType)
    rows = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        rank = len(self.tensor.type.dims)
        if rank not in (3, 4):
            raise VerifyException(f"{self.name}: reads a [Q, B, T] or [Q, B, T, hidden_size] tensor, got rank {rank}")
        expect_dims(self, "the rows", tile_dims(self.rows), ("Q", "D") if rank == 4 else ("Q",))


@irdl_op_definition
class LseAdjointOp(KeywordSyntax):
    """The log-sum-exp's cotangent lse_bar: lse = log sum_i exp(s_i) adds p_i lse_bar to each
    score's cotangent p_i (dp_i - delta), which is taking lse_bar from delta (`delta_1`); the
    scores' cotangents then sum to lse_bar, not to 0, so the sum that re-centres the query's
    cotangent starts at -lse_bar (`score_bar_sum`). Per query."""

    name = "k3s.lse_adjoint"
    delta = operand_def(TileType)
    lse_bar = operand_def(TileType)
    shifted_delta = result_def(TileType)
    score_bar_sum = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # delta is shifted where it is held

    def verify_(self) -> None:
        for what, value in (("lse_bar", self.lse_bar), ("delta - lse_bar", self.shifted_delta),
                            ("the score cotangents' sum", self.score_bar_sum)):
            expect_dims(self, what, tile_dims(value), tile_dims(self.delta))


@irdl_op_definition
class AddSourceCotangentOp(KeywordSyntax):
    """This source's row of cotangent, summed over the program's block of queries, added (fp32
    atomics) into the zero-filled fp32 `dsources` ([S, .., hidden_size]): every block of queries
    of the row adds its share."""

    name = "k3s.add_source_cotangent"
    row_bar = operand_def(TileType)
    dsources = operand_def(TensorType)
    traits = traits_def(HasParent(SourceLoopOp), MemoryReadEffect(), MemoryWriteEffect())

    def verify_(self) -> None:
        expect_dims(self, "the row's cotangent", tile_dims(self.row_bar), ("D",))


@irdl_op_definition
class PartialsAdjointOp(KeywordSyntax):
    """Phase 2's partials as a source of the merge's softmax: their score is their log-sum-exp
    L_p, their row the normalised mix m, so with the merged log-sum-exp L (saved by the forward)
    their weight is alpha = exp(L_p - L) and their score's cotangent
    lse_bar = alpha (dh . m - delta), delta = dh . h as the sources' (before the re-centring)."""

    name = "k3s.partials_adjoint"
    partials_lse = operand_def(TileType)
    lse = operand_def(TileType)
    mix = operand_def(TileType)
    out_bar = operand_def(TileType)
    delta = operand_def(TileType)
    weight = result_def(TileType)
    lse_bar = result_def(TileType)
    traits = traits_def(HasParent(RowLoopOp), Pure())

    def verify_(self) -> None:
        for what, value in (("the partials' log-sum-exp", self.partials_lse), ("the log-sum-exp", self.lse),
                            ("delta", self.delta), ("alpha", self.weight), ("lse_bar", self.lse_bar)):
            expect_dims(self, what, tile_dims(value), ())
        expect_dims(self, "the mix", tile_dims(self.mix), ("D",))
        expect_dims(self, "dh", tile_dims(self.out_bar), ("D",))


@irdl_op_definition
class StorePartialsCotangentOp(KeywordSyntax):
    """The cotangents of one query's partials of this token row: lse_bar - alpha sigma to
    `dblock_lse` ([B, T] fp32; sigma, the scores' cotangents' sum over the partials and the
    sources, re-centres it as the query's cotangent is) and alpha dh to `dblock_mix` ([B, T,
    hidden_size], the mix's dtype)."""

    name = "k3s.store_partials_cotangent"
    weight = operand_def(TileType)
    lse_bar = operand_def(TileType)
    score_bar_sum = operand_def(TileType)
    out_bar = operand_def(TileType)
    dblock_lse = operand_def(TensorType)
    dblock_mix = operand_def(TensorType)
    traits = traits_def(HasParent(RowLoopOp), MemoryWriteEffect())

    def verify_(self) -> None:
        for what, value in (("alpha", self.weight), ("lse_bar", self.lse_bar), ("sigma", self.score_bar_sum)):
            expect_dims(self, what, tile_dims(value), ())
        expect_dims(self, "dh", tile_dims(self.out_bar), ("D",))
        for what, tensor, rank in (("dblock_lse", self.dblock_lse, 2), ("dblock_mix", self.dblock_mix, 3)):
            _expect_rank(self, what, tensor, rank)


def _expect(op: IRDLOperation, *expected: tuple[str, object, tuple[str, ...]]) -> None:
    """Each (what, tile, dims): the tile has those dimensions (Block AttnRes's columns forms' ops)."""
    for what, value, dims in expected:
        expect_dims(op, what, tile_dims(value), dims)


BLOCK_ATTNRES_STAGES = [StorePartialsOp, LoadPartialsOp, StoreNormalisedPartialsOp, LoadNormalisedPartialsOp,
                        RowResumeOp, LoadQueryRowsOp, LseAdjointOp, AddSourceCotangentOp, PartialsAdjointOp,
                        StorePartialsCotangentOp]
