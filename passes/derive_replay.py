"""derive-replay: k3.recurrence -> its speculative-decoding schedule (verify + replay).

Every token's write to the state is S <- Diag(a) S + k u^T, with u = beta (v - (Diag(a) S)^T k)
under the delta rule and u = v without it. Once u is known the writes no longer depend on the
state, so the state after any accepted prefix m follows from the committed state and the cached
(k, gate, u) of the first m tokens in one sum, with no serial dependency and no snapshots:
- verify: the recurrent token stages, plus a cache_update after the update is known;
- replay: Diag(Gamma_m) S_0 + sum_j Diag(Gamma_m / Gamma_j) k_j u_j^T, with Gamma of the gate's
  granularity (channel, scalar) and no Gamma at all without a gate.
`k3c prove` checks it for every accepted count m = 0..n in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import add_entries, argument_values, make, recurrence_arguments
from k3compile.passes.lower_recurrent import token_loop


def speculative_schedule(op: RecurrenceOp, values: dict[str, SSAValue], draft_tokens: int) -> k3s.SpeculativeOp:
    return make(
        k3s.SpeculativeOp,
        [token_loop(op, values, cache_updates=True), make(k3s.ReplayOp, gate=op.gate.data)],
        draft_tokens=draft_tokens,
    )


@dataclass(frozen=True)
class DeriveReplayPass(ModulePass):
    """Add a `speculative` entry holding the verify + replay schedule of every k3.recurrence."""

    name = "derive-replay"
    draft_tokens: int = 8

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.draft_tokens <= 0:
            raise ValueError(f"derive-replay: draft-tokens must be positive, got {self.draft_tokens}")
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        arguments = recurrence_arguments(op)
        return make(
            k3s.EntryOp,
            [*arguments, speculative_schedule(op, argument_values(arguments), self.draft_tokens)],
            sym_name="speculative",
            source=op.sym_name.data,
        )
