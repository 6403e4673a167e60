"""derive-chunkwise: k3.recurrence -> its chunkwise (WY/UT) schedule.

Unrolling the recurrence over a chunk of C tokens, the stages that exist follow from the op:
- a gate makes the decays inside a chunk cumulative products, so a `gate_cumsum` stage comes
  first and every Gram/apply/advance stage carries the gate (channel or scalar);
- the delta rule makes each token's write depend on the state the earlier tokens of the chunk
  produced. Solving that triangular system gives A (a strict gated key Gram scaled by beta),
  T = (I + A)^{-1} Diag(beta) by forward substitution, the WY factors W = T (Gamma K) and
  U = T V, and in the scan the residual Vr = U - W S. Without it Vr = V and those stages vanish;
- every member reads its output through the inclusive query Gram P and the carried state, and
  advances the state by the chunk's decay and its keys; with a gate, the queries decayed since
  the chunk's start (QG), the keys decayed until its end (KG) and the chunk's decay gamma_C are
  chunk-local, so they are computed with the other chunk-local stages, not in the state pass.
- a channel gate's Gram blocks on the diagonal factor into two tensor-core operands only when
  the gate is bounded below (sub_chunk tokens of decay must fit the fp32/bf16 exponent range, in
  which backends form them for any input dtype);
  otherwise they are evaluated elementwise, which is exact for any gate.
`k3c prove` checks the result against the token recurrence in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.choices import BOUNDED_GATE_INPUTS
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import add_entries, make, recurrence_arguments, recurrence_state_shape

# the largest decay (nats) a factored diagonal block may span: exp(80) * |k| stays inside the
# fp32 and bf16 range (exp(88.7)) for keys up to |k| ~ 1e3. Backends form the factored operands
# in a dtype of that range whatever the inputs (Triton: bf16 or fp32, tf32 products for fp16
# inputs, whose own range ends at exp(11))
FACTORED_DECAY_LIMIT = 80.0


def gram_diagonal(op: RecurrenceOp, sub_chunk: int) -> str:
    bounded = op.input_option("gate_input") in BOUNDED_GATE_INPUTS
    if bounded and sub_chunk * -op.input_option("gate_lower_bound") <= FACTORED_DECAY_LIMIT:
        return "factored"
    return "elementwise"


def chunkwise_schedule(op: RecurrenceOp, chunk_size: int, sub_chunk: int = 16, solve_block: int = 1) -> k3s.ChunkedOp:
    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)
    gram = {"gate": gate, "sub_chunk": sub_chunk}
    if gate == "channel":
        gram["diagonal"] = gram_diagonal(op, sub_chunk)

    local: list[Operation] = []
    if gate != "none":
        local.append(make(k3s.GateCumsumOp, gate=gate))
    if delta_rule:
        local += [
            make(k3s.GramOp, lhs="k", mask="strict", beta=True, **gram),
            make(k3s.ForwardSubstitutionOp, block=min(solve_block, chunk_size)),
            make(k3s.WYApplyOp, operand="key", gate=gate),
            make(k3s.WYApplyOp, operand="value", gate="none"),
        ]
    local.append(make(k3s.GramOp, lhs="q", mask="inclusive", beta=False, **gram))
    if gate != "none":
        local += [
            make(k3s.GateApplyOp, operand="q", anchor="start", gate=gate),
            make(k3s.GateApplyOp, operand="k", anchor="end", gate=gate),
            make(k3s.ChunkDecayOp, gate=gate),
        ]

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


def checkpoint_argument(op: RecurrenceOp, chunk_size: int) -> k3s.CheckpointArgOp:
    """checkpoint_every: the chunked form passes through the state at every chunk boundary, so any
    multiple of the chunk size can be kept for prefix caching."""
    return make(k3s.CheckpointArgOp, sym_name="checkpoint_every", chunk_size=chunk_size,
                state_shape=",".join(recurrence_state_shape(op)))


@dataclass(frozen=True)
class DeriveChunkwisePass(ModulePass):
    """Add a `chunk` entry holding the chunkwise schedule of every k3.recurrence."""

    name = "derive-chunkwise"
    # fastest on the H200 with fuse-chunkwise's defaults at every bench shape (bench/RESULTS.md:
    # 1.3x chunks of 32, whose prepare holds 252 registers); the tuner also tries 32
    chunk_size: int = 16
    sub_chunk: int = 16
    # rows of the triangular solve's diagonal blocks solved row by row; the rest by products of
    # nilpotent factors. 1: all of it by products, tensor-core dots instead of a serial loop:
    # the prepare 1.6x faster on the H200 than 16 (B1 T8192 H96: 0.75 vs 1.20 ms; bench/RESULTS.md)
    solve_block: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunk_size <= 0 or self.sub_chunk <= 0 or self.solve_block <= 0:
            raise ValueError(
                f"derive-chunkwise: chunk-size, sub-chunk and solve-block must be positive, got "
                f"{self.chunk_size}, {self.sub_chunk}, {self.solve_block}"
            )
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        return make(
            k3s.EntryOp,
            [
                *recurrence_arguments(op),
                checkpoint_argument(op, self.chunk_size),
                chunkwise_schedule(op, self.chunk_size, self.sub_chunk, self.solve_block),
            ],
            sym_name="chunk",
            source=op.sym_name.data,
        )
