"""derive-replay: k3.recurrence -> its speculative-decoding schedule (verify + replay).

Every token's write to the state is S <- Diag(a) S + k u^T, with u = beta (v - (Diag(a) S)^T k)
under the delta rule and u = v without it. Once u is known the writes no longer depend on the
state, so the state after any accepted prefix m follows from the committed state and the cached
(k, gate, u) of the first m tokens in one sum, with no serial dependency and no snapshots:
- verify: the recurrent token stages, plus a cache_update after the update is known (to the
  entry's `cache`, a workspace here: lower-speculative's entries keep it between rounds);
- replay of the first m = `accepted` tokens: Diag(Gamma_m) S_0 + sum_j Diag(Gamma_m / Gamma_j)
  k_j u_j^T, with Gamma of the gate's granularity (channel, scalar) and no Gamma at all without
  a gate.
`k3c prove` checks it for every accepted count m = 0..n in exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import add_entries, argument_values, make, recurrence_arguments, tensor_arg
from k3compile.passes.lower_recurrent import token_loop


def cache_type(op: RecurrenceOp, draft_tokens: int) -> k3s.TensorType:
    """A pool's cache: per slot, draft_tokens rows of (k, log-gate, u) per value head."""
    K, V, HV = op.head_k_dim.value.data, op.head_v_dim.value.data, op.num_v_heads.value.data
    return k3s.tensor("P", draft_tokens, HV, 2 * K + V, dtype="float32")


def speculative_arguments(op: RecurrenceOp, draft_tokens: int) -> list[k3s.TensorArgOp]:
    """What the schedule adds to the layer's arguments: the cache its verify writes and its
    replay reads, and how many tokens of each sequence were accepted."""
    return [tensor_arg("cache", cache_type(op, draft_tokens), "workspace", purpose="draft_states"),
            tensor_arg("accepted", k3s.tensor("B", dtype="index"), "input", purpose="accepted_counts")]


def speculative_schedule(op: RecurrenceOp, draft_tokens: int, values: dict[str, SSAValue]) -> k3s.SpeculativeOp:
    """The verify and the replay, both from the committed state (the block's argument)."""
    block = Block(arg_types=[k3s.tile("K", "V")])
    committed = block.args[0]
    committed.name_hint = "S"
    block.add_ops([token_loop(op, values, committed, cache=values["cache"]),
                   make(k3s.ReplayOp, operands=[committed, values["cache"], values["accepted"]], gate=op.gate.data,
                        result=("S", committed.type))])
    return make(k3s.SpeculativeOp, block, draft_tokens=draft_tokens)


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
        arguments = [*recurrence_arguments(op), *speculative_arguments(op, self.draft_tokens)]
        return make(
            k3s.EntryOp,
            [*arguments, speculative_schedule(op, self.draft_tokens, argument_values(arguments))],
            sym_name="speculative",
            source=SymbolRefAttr(op.sym_name),
        )
