"""lower-recurrent: k3.recurrence -> a recurrent schedule (one token at a time, state on chip).

The stages follow from the op: a gate adds a decay stage of its granularity, the delta rule
adds the correction u = beta (v - S^T k) before the rank-1 update (and makes beta an input);
without them the stages and inputs are simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    add_entries,
    argument_values,
    check_num_warps,
    check_power_of_two,
    check_token_stages,
    input_loads,
    make,
    recurrence_arguments,
    token_kernel,
)


def token_loop(op: RecurrenceOp, values: dict[str, SSAValue], initial: SSAValue,
               cache: SSAValue | None = None) -> k3s.TokenLoopOp:
    """One token of the recurrence as values, carrying the state S from `initial`, reading and
    writing the tensors of `values` (its entry's arguments; the sequence offsets when it has
    them); given the entry's `cache` it also caches there what a replay needs (the token's k, the
    update u it wrote, its log-gate)."""
    load = input_loads(op, values)
    block = Block(arg_types=[k3s.tile("K", "V")])
    S = block.args[0]
    S.name_hint = "S"

    def stage(new):
        block.add_op(new)
        return new.results[0] if new.results else None

    q, k, v = (stage(load[name](k3s.LoadTokenOp)) for name in ("q", "k", "v"))
    g = None
    if op.gate.data != "none":
        g = stage(load["g"](k3s.LoadTokenOp))
        S = stage(make(k3s.DecayOp, operands=[S, g], result=("S", S.type), gate=op.gate.data))
    u = v
    if op.delta_rule.value.data:
        beta = stage(load["beta"](k3s.LoadTokenOp))
        u = stage(make(k3s.DeltaCorrectOp, operands=[S, k, v, beta], result=("u", v.type)))
    S = stage(make(k3s.Rank1UpdateOp, operands=[S, k, u], result=("S", S.type)))
    stage(make(k3s.ReadoutOp, operands=[S, q, values["o"], values["scale"]], result=("o", k3s.tile("V"))))
    if cache is not None:
        stage(make(k3s.CacheUpdateOp, operands=[cache, k, u, g], gate=op.gate.data))
    stage(make(k3s.NextTokenOp, operands=[S]))
    return make(k3s.TokenLoopOp, block, operands=[initial, values.get("cu_seqlens")], result=("S_final", S.type))


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
        arguments = recurrence_arguments(op)
        values = argument_values(arguments)
        tile = make(k3s.StateTileOp, operands=[values["initial_state"]], head_k_dim=K, head_v_dim=V,
                    block_v=self.block_v, layout=layout, result=("S", k3s.tile("K", "V")))
        loop = token_loop(op, values, tile.state)
        kernel = token_kernel(
            [tile, loop, make(k3s.StoreStateOp, operands=[loop.final, values["final_state"]], layout=layout)],
            f"{op.sym_name.data}_recurrent", self.num_warps, self.token_stages,
        )
        return make(k3s.EntryOp, [*arguments, kernel], sym_name="recurrent", source=SymbolRefAttr(op.sym_name))
