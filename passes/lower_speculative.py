"""lower-speculative: the speculative schedule (derive-replay) -> its serving entries.

- verify: the token loop from the committed pool state (read, never written), writing each
  token's output and its (k, log-decay, u) to a per-slot cache of depth draft_tokens;
- commit: the replay stage: rebuild the state after `accepted[b]` tokens from the committed
  state and the cache, and write it to the pool row in place. One state write per round,
  no snapshot per draft token;
- spec_step: the two fused, replay first: one launch per round commits the previous round's
  accepted tokens (read from `cache`), writes the pool row once, and verifies the new round
  from that state into `next_cache`. Two buffers because the kernel is split over value
  blocks: the first block of a (sequence, head) writes the new tokens' k and log-decay while
  the other blocks may still be reading the previous ones for their replay. The caller swaps
  cache and next_cache every round; the entry refuses overlapping ones.
mode = snapshot compiles today's engines' way from the same schedule, for side-by-side
comparison: verify writes the whole state after every token, commit copies the one accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (
    check_num_warps,
    check_power_of_two,
    make,
    props,
    recurrence_arguments,
    recurrence_state_shape,
)

NOT_IN_VERIFY = ("initial_state", "final_state", "cu_seqlens")


def clone(op, **changes):
    return type(op).create(properties={**op.properties, **props(**changes)})


def serving_entries(layer: RecurrenceOp, speculative: k3s.SpeculativeOp, block_v: int, num_warps: int,
                    mode: str) -> list[k3s.EntryOp]:
    name = layer.sym_name.data
    K, V, HV = layer.head_k_dim.value.data, layer.head_v_dim.value.data, layer.num_v_heads.value.data
    layout = layer.state_layout.data
    depth = speculative.draft_tokens.value.data
    loop = next(op for op in speculative.body.ops if isinstance(op, k3s.TokenLoopOp))
    replay = next(op for op in speculative.body.ops if isinstance(op, k3s.ReplayOp))

    def arg(sym_name, shape, dtype, role, **distinct_from):
        return make(k3s.TensorArgOp, sym_name=sym_name, shape=shape, dtype=dtype, role=role, **distinct_from)

    def tile():
        return make(k3s.StateTileOp, head_k_dim=K, head_v_dim=V, block_v=block_v, layout=layout, home="pool")

    state_shape = ",".join(["P", *recurrence_state_shape(layer)])
    if mode == "replay":
        buffer, buffer_shape = "cache", f"P,{depth},{HV},{2 * K + V}"
        verify_stages = [clone(op) for op in loop.body.ops]
        commit_stage = clone(replay)
    else:  # the baseline: the same verify, but a whole state written after every token
        buffer, buffer_shape = "snapshots", ",".join(["P", str(depth), *recurrence_state_shape(layer)])
        verify_stages = [make(k3s.SnapshotStateOp) if isinstance(op, k3s.CacheUpdateOp) else clone(op)
                         for op in loop.body.ops]
        commit_stage = make(k3s.RestoreSnapshotOp)
    def token_arguments():
        return [a for a in recurrence_arguments(layer) if a.sym_name.data not in NOT_IN_VERIFY]

    verify = make(
        k3s.EntryOp,
        [
            *token_arguments(),
            arg("state", state_shape, "state", "input"),
            arg("state_indices", "B", "index", "input"),
            arg(buffer, buffer_shape, "float32", "inout"),
            make(
                k3s.KernelOp,
                [tile(), make(k3s.TokenLoopOp, verify_stages)],
                sym_name=f"{name}_verify",
                grid="value_block,sequence_head",
                num_warps=num_warps,
            ),
        ],
        sym_name="verify",
        source=name,
        max_tokens=depth,
    )
    commit = make(
        k3s.EntryOp,
        [
            arg("state", state_shape, "state", "inout"),
            arg("state_indices", "B", "index", "input"),
            arg(buffer, buffer_shape, "float32", "input"),
            arg("accepted", "B", "index", "input"),
            make(
                k3s.KernelOp,
                [tile(), commit_stage, make(k3s.StoreStateOp, layout=layout, home="pool")],
                sym_name=f"{name}_commit",
                grid="value_block,sequence_head",
                num_warps=num_warps,
            ),
        ],
        sym_name="commit",
        source=name,
    )
    if mode == "snapshot":
        return [verify, commit]
    step = make(
        k3s.EntryOp,
        [
            *token_arguments(),
            arg("state", state_shape, "state", "inout"),
            arg("state_indices", "B", "index", "input"),
            arg("cache", buffer_shape, "float32", "input"),
            arg("accepted", "B", "index", "input"),
            arg("next_cache", buffer_shape, "float32", "inout", distinct_from="cache"),
            make(
                k3s.KernelOp,
                [
                    tile(),
                    clone(replay, buffer="cache"),
                    make(k3s.StoreStateOp, layout=layout, home="pool"),
                    make(k3s.TokenLoopOp, [clone(op, buffer="next_cache") if isinstance(op, k3s.CacheUpdateOp)
                                           else clone(op) for op in loop.body.ops]),
                ],
                sym_name=f"{name}_spec_step",
                grid="value_block,sequence_head",
                num_warps=num_warps,
            ),
        ],
        sym_name="spec_step",
        source=name,
        max_tokens=depth,
    )
    return [verify, commit, step]


@dataclass(frozen=True)
class LowerSpeculativePass(ModulePass):
    """Replace every `speculative` entry by its `verify`, `commit` and (replay mode) `spec_step` entries."""

    name = "lower-speculative"
    block_v: int = 32
    num_warps: int = 4
    mode: str = "replay"  # or snapshot: the baseline of today's engines, for comparison

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.mode not in ("replay", "snapshot"):
            raise ValueError(f"lower-speculative: mode must be replay or snapshot, got {self.mode!r}")
        check_power_of_two("lower-speculative", "block-v", self.block_v)
        check_num_warps("lower-speculative", self.num_warps)
        layers = {o.sym_name.data: o for o in op.ops if isinstance(o, RecurrenceOp)}
        for speculative in [o for o in op.walk() if isinstance(o, k3s.SpeculativeOp)]:
            entry = speculative.parent_op()
            entries = serving_entries(layers[entry.source.data], speculative, self.block_v, self.num_warps, self.mode)
            if entry.sym_name.data != "speculative":  # a multi-layer module's prefixed names
                prefix = entry.sym_name.data.removesuffix("speculative")
                for new in entries:
                    new.properties["sym_name"] = type(entry.sym_name)(prefix + new.sym_name.data)
            Rewriter.insert_op(entries, InsertPoint.before(entry))
            entry.detach()
            entry.erase()
