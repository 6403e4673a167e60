"""derive-segment-scan: k3.recurrence -> its segment-scan schedule (context parallelism).

Every token is an affine map of the state, S_t = A_t S_{t-1} + B_t, with A_t = (I - beta_t k_t
k_t^T) Diag(a_t) under the delta rule and A_t = Diag(a_t) without it. A segment of tokens composes
to one such map, its summary (M, N): M the product of its A_t, N its state from a zero start; and
(M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2) is associative. So the segments of a sequence run in
parallel: every segment's summary, a scan of the combine for each segment's true initial state,
then every segment finished from it by the chunkwise schedule. How M is held follows from the op:
- the delta rule: full (K x K); the rank-one corrections mix the key channels;
- a channel gate alone: diagonal (each key channel's product of decays);
- a scalar gate alone: scalar; no gate and no delta rule: identity (no M: summaries add).
The summary reuses the chunkwise schedule's state pass (a full M as K more state columns).
`k3c prove` checks the combine's associativity symbolically (non-commutative symbols for a full
M) and split + summaries + combine + finish against the token recurrence in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import add_entries, argument_values, make, recurrence_arguments
from k3compile.passes import derive_chunkwise

GATE_TRANSITIONS = {"channel": "diagonal", "scalar": "scalar", "none": "identity"}


def transition_form(op: RecurrenceOp) -> str:
    """How a segment's M is held: full with the delta rule, else the gate's granularity."""
    return "full" if op.delta_rule.value.data else GATE_TRANSITIONS[op.gate.data]


def segment_scan_schedule(op: RecurrenceOp, values: dict[str, SSAValue], chunk_size: int,
                          sub_chunk: int = 16, unbounded_diagonal: str = "guarded") -> k3s.SegmentScanOp:
    form = transition_form(op)
    return make(
        k3s.SegmentScanOp,
        [
            make(k3s.SegmentSummaryOp, transition=form),
            make(k3s.SummaryCombineOp, transition=form),
            # finishes every segment
            derive_chunkwise.chunkwise_schedule(op, values, chunk_size, sub_chunk, unbounded_diagonal=unbounded_diagonal),
        ],
    )


@dataclass(frozen=True)
class DeriveSegmentScanPass(ModulePass):
    """Add a `segment_scan` entry holding the segment-scan schedule of every k3.recurrence."""

    name = "derive-segment-scan"
    # chunks of 16 as derive-chunkwise: on the H200 at B1 T131072 H16 the plain entry 10.3 ms vs
    # 13.7 and the best split 9.0 vs 9.5 ms with chunks of 32 (bench/RESULTS.md, "Context
    # parallelism": tree 1d20b26 against c766b77)
    chunk_size: int = 16
    sub_chunk: int = 16
    unbounded_diagonal: str = "guarded"  # as derive-chunkwise's

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunk_size <= 0 or self.sub_chunk <= 0:
            raise ValueError(
                f"{self.name}: chunk-size and sub-chunk must be positive, got {self.chunk_size}, {self.sub_chunk}"
            )
        derive_chunkwise.check_unbounded_diagonal(self.name, self.unbounded_diagonal)
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        arguments = recurrence_arguments(op)
        return make(
            k3s.EntryOp,
            [*arguments, segment_scan_schedule(op, argument_values(arguments), self.chunk_size, self.sub_chunk,
                                               self.unbounded_diagonal)],
            sym_name="segment_scan",
            source=SymbolRefAttr(op.sym_name),
        )
