"""The segment-scan schedule (context parallelism)."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import BoolAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    AnyOf,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, NoTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3s.chunk_loops import ChunkedOp, ChunkLoopOp
from k3compile.ir.k3s.core import EntryOp
from k3compile.ir.k3s.kernels import KernelOp
from k3compile.ir.k3s.types import TensorType, TileType, tile_dims
from k3compile.ir.syntax import KeywordSyntax

# --- the segment-scan schedule (context parallelism) ---------------------------------------
# Every token is an affine map of the state, S_t = A_t S_{t-1} + B_t with A_t = (I - beta_t k_t
# k_t^T) Diag(a_t) and B_t = beta_t k_t v_t^T (A_t = Diag(a_t), B_t = k_t v_t^T without the delta
# rule). A segment of consecutive tokens of one sequence and value head composes to its summary
# (M, N): S_end = M S_start + N, M the product of its A_t and N its state from a zero start.
# Summaries compose associatively: (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2). The transition
# form is how M is held: full (K x K), diagonal (K numbers), scalar (one number) or identity (no M).


class Transition(Word):
    FULL = "full"
    DIAGONAL = "diagonal"
    SCALAR = "scalar"
    IDENTITY = "identity"


@irdl_attr_definition
class TransitionAttr(EnumAttribute[Transition], SpacedOpaqueSyntaxAttribute):
    name = "k3s.transition"


# the transitions that are a product of decays (from a decay_product_start, a decay_product multiplies
# up, a store_transition writes)
DECAY_TRANSITIONS = AnyOf.get(TransitionAttr(Transition.DIAGONAL), TransitionAttr(Transition.SCALAR))


@irdl_op_definition
class SegmentScanOp(KeywordSyntax):
    """The segments of a sequence run in parallel. Its body, in order: segment_summary (every
    segment's (M, N)), summary_combine (each segment's initial state from the summaries before
    it) and the chunked schedule that finishes every segment from that state."""

    name = "k3s.segment_scan"
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        ops = list(self.body.ops)
        if [type(op) for op in ops] != [SegmentSummaryOp, SummaryCombineOp, ChunkedOp]:
            got = ", ".join(op.name for op in ops) or "nothing"
            raise VerifyException(f"{self.name}: body must be segment_summary, summary_combine, chunked; got {got}")
        if ops[0].transition.data != ops[1].transition.data:
            raise VerifyException(f"{self.name}: summary and combine disagree on the transition form "
                                  f"({ops[0].transition.data} vs {ops[1].transition.data})")


@irdl_op_definition
class SegmentSummaryOp(KeywordSyntax):
    """Every segment's summary (M, N), all segments in parallel. N is the state the chunked
    schedule beside it leaves from a zero start, by its state pass alone (the chunked
    schedule without its output, and so without what only the output reads). A full M rides
    along in the same pass as K more state columns: [M | N] from [I | 0] with values [0 | V] (the columns evolve independently); a
    diagonal or scalar M is the segment's product of decays; identity has no M."""

    name = "k3s.segment_summary"
    transition = prop_def(TransitionAttr)
    traits = traits_def(HasParent(SegmentScanOp))


@irdl_op_definition
class SummaryCombineOp(KeywordSyntax):
    """The initial state of segment p: (sigma_{p-1} o ... o sigma_0)(S_0) from the summaries
    sigma before it and the sequence's initial state, with (M2, N2) o (M1, N1) = (M2 M1, M2 N1 +
    N2) in the transition form (diagonal: elementwise; identity: N1 + N2). Associative, so any
    scan order (serial, tree, one prefix per rank after an all-gather) gives the same states.

    `adjoint = true` (a backward entry, derive-segment-scan-backward): the same combine, transposed
    and run in the reverse direction. The map S -> M S + N has the adjoint D -> M^T D, so the
    cotangent of the state a segment enters is M^T (the cotangent of the state it leaves) + N_bar,
    N_bar the cotangent from the segment's own outputs (from a zero cotangent of the state it
    leaves). Each segment's leaving cotangent is then the adjoint summaries (M^T, N_bar) of the
    segments after it, last first, applied to the sequence's final-state cotangent and composed by
    the same combine; M^T is held in M's form (a diagonal, scalar or identity M is its own
    transpose)."""

    name = "k3s.summary_combine"
    transition = prop_def(TransitionAttr)
    adjoint = opt_prop_def(BoolAttr)  # absent: false
    # in a lowered entry (lower-segment-scan): the host step between the summary kernels and the
    # finish, its scan order the caller's (one device: a prefix per sequence; ranks: an all-gather),
    # and its operands the entry's tensors it reads and makes: M (but for the identity transition),
    # N and the entering states (`k3s.summary_combine %M, %N, %initial_state`); adjoint: M, N_bar
    # and the leaving states' cotangents (`k3s.summary_combine %M, %N_bar, %dht <..., adjoint =
    # true>`); in a segment scan, none
    tensors = var_operand_def(TensorType)
    traits = traits_def(HasParent(SegmentScanOp, EntryOp))

    def is_adjoint(self) -> bool:
        return self.adjoint is not None and bool(self.adjoint.value.data)

    def verify_(self) -> None:
        if isinstance(self.parent_op(), EntryOp):
            N, made = ("N_bar", "the leaving cotangents") if self.is_adjoint() else ("N", "the entering states")
            want, what = (2, f"{N} and {made}") if self.transition.data == "identity" else (3, f"M, {N} and {made}")
        elif self.is_adjoint():
            raise VerifyException(f"{self.name}: an adjoint combine is a host step of a lowered entry, not of a "
                                  "segment scan")
        else:
            want, what = 0, "no tensors (in a segment scan)"
        if len(self.tensors) != want:
            raise VerifyException(f"{self.name} <transition = {self.transition.data}>: takes {what}, "
                                  f"got {len(self.tensors)} operands")


def _verify_decay_form(op, tile: SSAValue) -> None:
    """A decay product's tile has its transition's form: a diagonal's K numbers, a scalar's one."""
    want = {Transition.DIAGONAL: ("K",), Transition.SCALAR: ()}[op.transition.data]
    if tile_dims(tile) != want:
        raise VerifyException(f"{op.name}: a {op.transition.data} transition's M is a <{' x '.join(want)}> tile, "
                              f"got {tile.type}")


@irdl_op_definition
class DecayProductStartOp(KeywordSyntax):
    """`%M = k3s.decay_product_start <transition = diagonal> : !k3s.tile<K>`: the decay product
    M of no chunks, 1 (K ones for a diagonal transition, one for a scalar): where a chunk loop
    that multiplies up a segment's decays starts."""

    name = "k3s.decay_product_start"
    transition = prop_def(DECAY_TRANSITIONS)
    product = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())

    def verify_(self) -> None:
        _verify_decay_form(self, self.product)


@irdl_op_definition
class DecayProductOp(KeywordSyntax):
    """`%M_2 = k3s.decay_product %M_1, %gamma_C <transition = diagonal>`: M <- Diag(gamma_C) M, the
    decay product of a segment's chunks so far (a chunk loop carries it) times this chunk's
    decay, for a diagonal or scalar transition."""

    name = "k3s.decay_product"
    transition = prop_def(DECAY_TRANSITIONS)
    product = operand_def(TileType)  # M before this chunk
    decay = operand_def(TileType)  # gamma_C
    multiplied = result_def(TileType)  # M after it
    traits = traits_def(HasParent(ChunkLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # M is updated where it is held

    def verify_(self) -> None:
        for tile in (self.product, self.decay, self.multiplied):
            _verify_decay_form(self, tile)


@irdl_op_definition
class StoreTransitionOp(KeywordSyntax):
    """`k3s.store_transition %M_final, %M`: write a segment's decay product (its first operand)
    to the entry's tensor M ([N, HV, K] or [N, HV])."""

    name = "k3s.store_transition"
    transition = prop_def(DECAY_TRANSITIONS)
    product = operand_def(TileType)
    output = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _verify_decay_form(self, self.product)


SEGMENT_SCAN_OPS = [SegmentScanOp, SegmentSummaryOp, SummaryCombineOp, DecayProductStartOp, DecayProductOp,
                    StoreTransitionOp]
