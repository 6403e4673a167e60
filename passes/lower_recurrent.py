"""lower-recurrent: k3.recurrence -> a recurrent schedule (one token at a time, state on chip).

The stages follow from the op: a gate adds a decay stage of its granularity, the delta rule
adds the correction u = beta (v - S^T k) before the rank-1 update and makes beta an input;
without them the stages and inputs are simply absent.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import make


def recurrent_entry(op: RecurrenceOp, block_v: int, num_warps: int) -> k3s.EntryOp:
    name = op.sym_name.data
    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)
    H, HV = op.num_heads.value.data, op.num_v_heads.value.data
    K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
    layout = op.state_layout.data
    state_shape = f"N,{HV},{K},{V}" if layout == "kv" else f"N,{HV},{V},{K}"
    gate_shape = {"channel": f"B,T,{HV},{K}", "scalar": f"B,T,{HV}", "none": f"B,T,{HV}"}[gate]

    def arg(sym_name: str, shape: str, dtype: str, role: str):
        return make(k3s.TensorArgOp, sym_name=sym_name, shape=shape, dtype=dtype, role=role)

    token_stages = [make(k3s.LoadTokenOp, tensor=t) for t in ("q", "k", "v")]
    if gate != "none":
        token_stages.append(make(k3s.DecayOp, gate=gate))
    if delta_rule:
        token_stages.append(make(k3s.DeltaCorrectOp))
    token_stages += [make(k3s.Rank1UpdateOp), make(k3s.ReadoutOp)]

    kernel = make(
        k3s.KernelOp,
        [
            make(k3s.StateTileOp, head_k_dim=K, head_v_dim=V, block_v=block_v, layout=layout),
            make(k3s.TokenLoopOp, token_stages),
            make(k3s.StoreStateOp, layout=layout),
        ],
        sym_name=f"{name}_recurrent",
        grid="value_block,sequence_head",
        num_warps=num_warps,
    )
    return make(
        k3s.EntryOp,
        [
            arg("q", f"B,T,{H},{K}", "float", "input"),
            arg("k", f"B,T,{H},{K}", "float", "input"),
            arg("v", f"B,T,{HV},{V}", "float", "input"),
            arg("g", gate_shape, "float", "forbidden" if gate == "none" else "input"),
            arg("beta", f"B,T,{HV}", "float", "input" if delta_rule else "forbidden"),
            make(k3s.ScalarArgOp, sym_name="scale", default=op.scale.value.data),
            arg("initial_state", state_shape, "float32", "optional_input"),
            arg("o", f"B,T,{HV},{V}", "float", "output"),
            arg("final_state", state_shape, "float32", "optional_output"),
            arg("cu_seqlens", "N+1", "offsets", "optional_input"),
            kernel,
        ],
        sym_name="recurrent",
        source=name,
    )


@dataclass
class _LowerRecurrence(RewritePattern):
    block_v: int
    num_warps: int

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: RecurrenceOp, rewriter: PatternRewriter) -> None:
        rewriter.replace(op, recurrent_entry(op, self.block_v, self.num_warps), [])


@dataclass(frozen=True)
class LowerRecurrentPass(ModulePass):
    """Lower every k3.recurrence to a recurrent (token-by-token) schedule."""

    name = "lower-recurrent"
    block_v: int = 32
    num_warps: int = 4

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.block_v <= 0 or self.block_v & (self.block_v - 1):
            raise ValueError(f"lower-recurrent: block-v must be a power of two, got {self.block_v}")
        PatternRewriteWalker(_LowerRecurrence(self.block_v, self.num_warps)).rewrite_module(op)
