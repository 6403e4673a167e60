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
- a channel gate's Grams split their decays at references per row block of sub_chunk rows
  (`block_gates`), the operands rescaled to them (`block_rescale`): every exponent <= 0 below
  the diagonal. The blocks on the diagonal factor into two tensor-core operands only where
  sub_chunk tokens of decay fit the fp32/bf16 exponent range (in which backends form them for
  any input dtype): always when the gate is bounded below; otherwise a `block_span_check` of
  each chunk's decays guards the factored form, and the chunks it fails evaluate their
  diagonal blocks elementwise, which is exact for any gate (`unbounded_diagonal = elementwise`:
  always so).
`k3c prove` checks the result against the token recurrence in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr, i1
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.choices import BOUNDED_GATE_INPUTS
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    add_entries,
    argument_values,
    gate_tensors,
    input_loads,
    make,
    recurrence_arguments,
    recurrence_state_shape,
)

# the largest decay (nats) a factored diagonal block may span: exp(80) * |k| stays inside the
# fp32 and bf16 range (exp(88.7)) for keys up to |k| ~ 1e3. Backends form the factored operands
# in a dtype of that range whatever the inputs (Triton: bf16 or fp32, tf32 products for fp16
# inputs, whose own range ends at exp(11))
FACTORED_DECAY_LIMIT = 80.0


UNBOUNDED_DIAGONALS = (k3s.GramDiagonal.GUARDED, k3s.GramDiagonal.ELEMENTWISE)


def check_unbounded_diagonal(pass_name: str, value: str) -> None:
    if value not in UNBOUNDED_DIAGONALS:
        raise ValueError(f"{pass_name}: unbounded-diagonal must be one of {', '.join(UNBOUNDED_DIAGONALS)}, "
                         f"got {value!r}")


def check_schedule_options(options) -> None:
    """A pass's chunkwise-schedule options (chunk_size, sub_chunk, solve_block,
    unbounded_diagonal), before anything is built: a one-line ValueError naming the pass."""
    if options.chunk_size <= 0 or options.sub_chunk <= 0 or options.solve_block <= 0:
        raise ValueError(f"{options.name}: chunk-size, sub-chunk and solve-block must be positive, got "
                         f"{options.chunk_size}, {options.sub_chunk}, {options.solve_block}")
    check_unbounded_diagonal(options.name, options.unbounded_diagonal)


def gram_diagonal(op: RecurrenceOp, sub_chunk: int, unbounded: str = "guarded") -> k3s.GramDiagonal:
    bounded = op.input_option("gate_input") in BOUNDED_GATE_INPUTS
    if bounded and sub_chunk * -op.input_option("gate_lower_bound") <= FACTORED_DECAY_LIMIT:
        return k3s.GramDiagonal.FACTORED
    return k3s.GramDiagonal(unbounded)


def chunkwise_schedule(op: RecurrenceOp, values: dict[str, SSAValue], chunk_size: int, sub_chunk: int = 16,
                       solve_block: int = 1, unbounded_diagonal: str = "guarded") -> k3s.ChunkedOp:
    """One chunk of the recurrence as values: the input loads, the chunk-local stages, then the
    chunk_scan carrying the state; the tensors it reads and writes are those of `values` (its
    entry's arguments). Each stage reads only what it needs, so a schedule's data flow (and what
    fuse-chunkwise spills between kernels) is its use-def chains."""
    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)
    gate_dims = ("K",) if gate == "channel" else ()
    gram = {"gate": gate}
    guard = None
    if gate == "channel":
        gram["diagonal"] = gram_diagonal(op, sub_chunk, unbounded_diagonal)
    local: list[Operation] = []

    def stage(new: Operation):
        local.append(new)
        return new.results[0] if len(new.results) == 1 else new.results

    load = input_loads(op, values)
    q, k, v = (stage(load[name](k3s.LoadChunkOp)) for name in ("q", "k", "v"))
    G = None
    if gate != "none":
        g = stage(load["g"](k3s.LoadChunkOp))
        G = stage(make(k3s.GateCumsumOp, operands=[g], result=("G", k3s.tile("C", *gate_dims)), gate=gate))
        total = stage(make(k3s.GateTotalOp, operands=[G], result=("Glast", k3s.tile(*gate_dims)), gate=gate))
    if gate == "channel":
        # the Grams' decays split at per-block references into factors whose exponents are <= 0
        # (the diagonal factor's bounded by the gate's bound); the keys' factors serve both Grams
        Gstart, Gend = stage(make(k3s.BlockGatesOp, operands=[G], sub_chunk=sub_chunk,
                                  results=[("Gstart", k3s.tile("NB", "K")), ("Gend", k3s.tile("NB", "K"))]))

        def rescale(rows, reference, decay: str, name: str):
            return stage(make(k3s.BlockRescaleOp, operands=[rows, G, reference], decay=decay,
                              result=(name, k3s.tile("C", "K"))))

        right = rescale(k, Gend, "reference_over_row", "kr")
        diagonal = rescale(k, Gstart, "reference_over_row", "kd") if gram["diagonal"].has_factor else None
        if gram["diagonal"] == k3s.GramDiagonal.GUARDED:
            guard = stage(make(k3s.BlockSpanCheckOp, operands=[Gstart, Gend], limit=FACTORED_DECAY_LIMIT,
                               result=("factorable", i1)))

    def gram_operands(lhs, name: str) -> dict:
        """What the Gram of lhs against the keys reads: with a channel gate, lhs's left factor too."""
        if gate != "channel":
            return dict(lhs=lhs, keys=k, cumulative_gate=G)
        left = rescale(lhs, Gstart, "row_over_reference", f"{name}l")
        return dict(lhs=lhs, keys=k, cumulative_gate=G, gate_start=Gstart, gate_end=Gend, left_factor=left,
                    right_factor=right, diagonal_factor=diagonal)

    def gram_stage(name: str, **operands_and_properties):
        value = stage(k3s.GramOp(**operands_and_properties, result_type=k3s.tile("C", "C"), factored_guard=guard,
                                 tensors=reloaded, **gram))
        value.name_hint = name
        return value

    # an elementwise (or guarded) diagonal reloads key rows and log-decays: the tensors the loads
    # of k and g read
    reloaded = [values["k"], *gate_tensors(op, values)] if gate == "channel" and gram["diagonal"].reloads else []
    if delta_rule:
        beta = stage(load["beta"](k3s.LoadChunkOp))
        A = gram_stage("A", **gram_operands(k, "k"), row_scale=beta, mask="strict", beta=True)
        T = stage(make(k3s.ForwardSubstitutionOp, operands=[A, beta], result=("T", k3s.tile("C", "C")),
                       block=min(solve_block, chunk_size)))
        W = stage(make(k3s.WYApplyOp, operands=[T, k, G], result=("W", k3s.tile("C", "K")), gate=gate))
        U = stage(make(k3s.WYApplyOp, operands=[T, v], result=("U", k3s.tile("C", "V")), gate="none"))
    P = gram_stage("P", **gram_operands(q, "q"), mask="inclusive", beta=False)
    queries, keys, decay = q, k, None
    if gate != "none":
        queries = stage(make(k3s.GateApplyOp, operands=[q, G], result=("QG", k3s.tile("C", "K")), anchor="start",
                             gate=gate))
        keys = stage(make(k3s.GateApplyOp, operands=[k, G, total], result=("KG", k3s.tile("C", "K")), anchor="end",
                          gate=gate))
        decay = stage(make(k3s.ChunkDecayOp, operands=[total], result=("gamma_C", k3s.tile(*gate_dims)), gate=gate))

    scan = Block(arg_types=[k3s.tile("K", "V")])
    S = scan.args[0]
    S.name_hint = "S"
    written = v  # the values the state takes
    if delta_rule:
        residual = make(k3s.DeltaResidualOp, operands=[S, W, U], result=("vr", k3s.tile("C", "V")))
        scan.add_op(residual)
        written = residual.results[0]
    scan.add_op(make(k3s.ChunkOutputOp, operands=[queries, S, P, written, values["o"], values["scale"]],
                     result=("o", k3s.tile("C", "V"))))
    advance = make(k3s.StateAdvanceOp, operands=[S, keys, written, decay], result=("S", k3s.tile("K", "V")), gate=gate)
    scan.add_ops([advance, make(k3s.NextChunkOp, operands=[advance.results[0]])])
    return make(k3s.ChunkedOp, [*local, make(k3s.ChunkScanOp, scan)], chunk_size=chunk_size)


def checkpoint_argument(op: RecurrenceOp, chunk_size: int) -> k3s.CheckpointArgOp:
    """checkpoint_every: the chunked form passes through the state at every chunk boundary, so any
    multiple of the chunk size can be kept for prefix caching."""
    return make(k3s.CheckpointArgOp, sym_name="checkpoint_every", chunk_size=chunk_size,
                state_shape=recurrence_state_shape(op))


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
    # how a channel Gram's diagonal blocks are evaluated when the gate is not bounded below:
    # guarded (factored in the chunks whose decays allow it) or elementwise
    unbounded_diagonal: str = "guarded"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_schedule_options(self)
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        arguments = recurrence_arguments(op)
        return make(
            k3s.EntryOp,
            [
                *arguments,
                checkpoint_argument(op, self.chunk_size),
                chunkwise_schedule(op, argument_values(arguments), self.chunk_size, self.sub_chunk, self.solve_block,
                                   self.unbounded_diagonal),
            ],
            sym_name="chunk",
            source=SymbolRefAttr(op.sym_name),
        )
