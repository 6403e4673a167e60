"""lower-decode: k3.recurrence -> a serving decode schedule over a state pool.

The recurrent token stages (the same derivation as lower-recurrent), with the state's home a
pool row chosen by a slot table (`state_indices`, so one pool serves continuous batching) and
written back in place: no initial/final-state copies, no host synchronisation (a padding slot
-1 or any slot outside the pool is masked in the kernel, never written), so a step can be
captured in a CUDA graph. The pool may store the state in fp32 or bf16.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    add_entries,
    argument_values,
    check_num_warps,
    check_power_of_two,
    check_token_stages,
    make,
    recurrence_arguments,
    tensor_arg,
    recurrence_state_shape,
    token_kernel,
)
from k3compile.passes.lower_recurrent import token_loop

# the recurrent entry's state arguments are replaced by the pool and its slot table
NOT_IN_DECODE = ("initial_state", "final_state", "cu_seqlens")


@dataclass(frozen=True)
class LowerDecodePass(ModulePass):
    """Add a `decode` entry (token stages over a slot-indexed state pool, in place)."""

    name = "lower-decode"
    # the fastest of block-v 16/32/64 x num-warps 2/4/8 x token-stages 0/3 on the H200 at B = 64 and
    # 256 (H32 K = V = 128): B = 256 at 93% of the copy bandwidth, 278 us vs 305 (32, 4, 0);
    # bench/serving_sweep.py at 1d20b26 (bench/results/issue4_serving_sweep_v1.md)
    block_v: int = 64
    num_warps: int = 4
    token_stages: int = 3  # > 0: the token loop prefetches that many tokens ahead

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_power_of_two("lower-decode", "block-v", self.block_v)
        check_num_warps("lower-decode", self.num_warps)
        check_token_stages("lower-decode", self.token_stages)
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
        layout = op.state_layout.data
        args = [a for a in recurrence_arguments(op) if a.sym_name.data not in NOT_IN_DECODE]
        args += [
            tensor_arg("state", k3s.tensor("P", *recurrence_state_shape(op), dtype="state"), "inout"),
            tensor_arg("state_indices", k3s.tensor("B", dtype="index"), purpose="state_slots"),
        ]
        values = argument_values(args)
        pool = [values["state"], values["state_indices"]]
        tile = make(k3s.StateTileOp, operands=pool, head_k_dim=K, head_v_dim=V, block_v=self.block_v, layout=layout,
                    home="pool", result=("S", k3s.tile("K", "V")))
        loop = token_loop(op, values, tile.state)
        kernel = token_kernel(
            [tile, loop, make(k3s.StoreStateOp, operands=[loop.final, *pool], layout=layout, home="pool")],
            f"{op.sym_name.data}_decode", self.num_warps, self.token_stages,
        )
        return make(k3s.EntryOp, [*args, kernel], sym_name="decode", source=SymbolRefAttr(op.sym_name))
