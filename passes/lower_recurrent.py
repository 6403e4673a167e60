"""lower-recurrent: k3.recurrence -> a recurrent schedule (one token at a time, state on chip).

The stages follow from the op: a gate adds a decay stage of its granularity, the delta rule
adds the correction u = beta (v - S^T k) before the rank-1 update (and makes beta an input);
without them the stages and inputs are simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    add_entries,
    check_num_warps,
    check_power_of_two,
    check_token_stages,
    input_loads,
    make,
    recurrence_arguments,
    token_kernel,
)


def recurrent_stages(op: RecurrenceOp) -> list:
    load = input_loads(op)
    stages = [load[t](k3s.LoadTokenOp) for t in ("q", "k", "v")]
    if op.gate.data != "none":
        stages += [load["g"](k3s.LoadTokenOp), make(k3s.DecayOp, gate=op.gate.data)]
    if op.delta_rule.value.data:
        stages += [load["beta"](k3s.LoadTokenOp), make(k3s.DeltaCorrectOp)]
    return stages + [make(k3s.Rank1UpdateOp), make(k3s.ReadoutOp)]


@dataclass(frozen=True)
class LowerRecurrentPass(ModulePass):
    """Add a `recurrent` entry (token-by-token schedule) for every k3.recurrence."""

    name = "lower-recurrent"
    block_v: int = 32
    num_warps: int = 4
    token_stages: int = 0  # > 0: the token loop prefetches that many tokens ahead

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_power_of_two(self.name, "block-v", self.block_v)
        check_num_warps(self.name, self.num_warps)
        check_token_stages(self.name, self.token_stages)
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
        layout = op.state_layout.data
        kernel = token_kernel(
            [
                make(k3s.StateTileOp, head_k_dim=K, head_v_dim=V, block_v=self.block_v, layout=layout),
                make(k3s.TokenLoopOp, recurrent_stages(op)),
                make(k3s.StoreStateOp, layout=layout),
            ],
            f"{op.sym_name.data}_recurrent", self.num_warps, self.token_stages,
        )
        return make(k3s.EntryOp, [*recurrence_arguments(op), kernel], sym_name="recurrent", source=op.sym_name.data)
