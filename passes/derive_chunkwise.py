"""derive-chunkwise: k3.recurrence -> its chunkwise (WY/UT) schedule.

Unrolling the recurrence over a chunk of C tokens, the stages that exist follow from the op:
- a gate makes the decays inside a chunk cumulative products, so a `gate_cumsum` stage comes
  first and every Gram/apply/advance stage carries the gate (channel or scalar);
- the delta rule makes each token's write depend on the state the earlier tokens of the chunk
  produced. Solving that triangular system gives A (a strict gated key Gram scaled by beta),
  T = (I + A)^{-1} Diag(beta) by forward substitution, the WY factors W = T (Gamma K) and
  U = T V, and in the scan the residual Vr = U - W S. Without it Vr = V and those stages vanish;
- every member reads its output through the inclusive query Gram P and the carried state, and
  advances the state by the chunk's decay and its keys.
`k3c prove` checks the result against the token recurrence in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import add_entries, make, recurrence_arguments, recurrence_state_shape


def chunkwise_schedule(op: RecurrenceOp, chunk_size: int, sub_chunk: int = 16) -> k3s.ChunkedOp:
    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)

    local: list[Operation] = []
    if gate != "none":
        local.append(make(k3s.GateCumsumOp, gate=gate))
    if delta_rule:
        local += [
            make(k3s.GramOp, lhs="k", mask="strict", gate=gate, beta=True, sub_chunk=sub_chunk),
            make(k3s.ForwardSubstitutionOp, block=min(sub_chunk, chunk_size)),
            make(k3s.WYApplyOp, operand="key", gate=gate),
            make(k3s.WYApplyOp, operand="value", gate="none"),
        ]
    local.append(make(k3s.GramOp, lhs="q", mask="inclusive", gate=gate, beta=False, sub_chunk=sub_chunk))

    scan: list[Operation] = []
    if delta_rule:
        scan.append(make(k3s.DeltaResidualOp))
    scan += [
        make(k3s.ChunkOutputOp, gate=gate, residual=delta_rule),
        make(k3s.StateAdvanceOp, gate=gate, residual=delta_rule),
    ]
    return make(
        k3s.ChunkedOp,
        [make(k3s.ChunkLocalOp, local), make(k3s.ChunkScanOp, scan)],
        chunk_size=chunk_size,
    )


@dataclass(frozen=True)
class DeriveChunkwisePass(ModulePass):
    """Add a `chunk` entry holding the chunkwise schedule of every k3.recurrence."""

    name = "derive-chunkwise"
    chunk_size: int = 64
    sub_chunk: int = 16

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunk_size <= 0 or self.sub_chunk <= 0:
            raise ValueError(
                f"derive-chunkwise: chunk-size and sub-chunk must be positive, got {self.chunk_size}, {self.sub_chunk}"
            )
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        return make(
            k3s.EntryOp,
            [
                *recurrence_arguments(op),
                # the chunked form passes through the state at every chunk boundary: any
                # multiple of the chunk size can be kept for prefix caching
                make(k3s.CheckpointArgOp, sym_name="checkpoint_every", chunk_size=self.chunk_size,
                     state_shape=",".join(recurrence_state_shape(op))),
                chunkwise_schedule(op, self.chunk_size, self.sub_chunk),
            ],
            sym_name="chunk",
            source=op.sym_name.data,
        )
