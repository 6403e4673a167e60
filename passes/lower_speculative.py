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

verify = chunked (replay mode) builds the verify (and spec_step's verify half) from the stages
of derive-chunkwise's schedule instead of the token loop: the n <= C drafts of a round are one
chunk of C (n rounded up to 16, 32 or 64) from the committed state S_0, so O = scale (QG S_0 +
P Vr) and the update every token writes is row t of Vr = U - W S_0 (the WY form's corrected
values), which is what the cache holds. fuse-chunkwise's split gives a prepare kernel (one
program per (sequence, value head): W, U, P, QG spilled, in fp32 like all its products, since
the cached u become the committed state) and a scan kernel whose state tile is
the pool row (read, never written in verify) and whose one chunk writes o and the cache rows; the
state advance and what only it reads (KG, gamma_C) are dropped. The commit (replay) stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import region_dce

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes import derive_chunkwise, fuse_chunkwise
from k3compile.passes.derive_replay import cache_type
from k3compile.passes.common import (
    argument_values,
    check_num_warps,
    check_power_of_two,
    check_token_stages,
    make,
    props,
    rebind,
    recurrence_arguments,
    tensor_arg,
    recurrence_state_shape,
    token_kernel,
)

NOT_IN_VERIFY = ("initial_state", "final_state", "cu_seqlens")


def clone(op, **changes):
    copy = op.clone()
    copy.properties.update(props(type(op), **changes))
    return copy


def over_pool_rows(loop: k3s.TokenLoopOp, initial: SSAValue) -> k3s.TokenLoopOp:
    """The schedule's token loop (a copy) from the state `initial` as a loop over the B rows of T
    tokens of a batch: without the schedule's sequence offsets (its entry's rebinding points the
    rest at its arguments)."""
    loop.operands = [initial]
    return loop


def next_cache_loop(loop: k3s.TokenLoopOp, next_cache: SSAValue) -> k3s.TokenLoopOp:
    """The verify's token loop caching into next_cache (spec_step reads cache, writes next_cache)."""
    copy = loop.clone()
    for cached in [op for op in copy.walk() if isinstance(op, k3s.CacheUpdateOp)]:
        cached.operands[0] = next_cache
    return copy


CHUNKED_VERIFY_SIZES = (16, 32, 64)  # the chunk tiles the Triton backend prints


def verify_chunk_size(depth: int) -> int:
    """The draft depth rounded up to a chunk tile: a round is one chunk."""
    size = next((c for c in CHUNKED_VERIFY_SIZES if c >= depth), None)
    if size is None:
        raise ValueError(f"lower-speculative: verify=chunked needs draft-tokens <= {CHUNKED_VERIFY_SIZES[-1]}, got {depth}")
    return size


def chunked_verify(layer: RecurrenceOp, entry: k3s.EntryOp, values: dict[str, SSAValue], depth: int, block_v: int,
                   num_warps: int, buffer: SSAValue, name: str, dots: str) -> tuple[list, k3s.KernelOp, k3s.KernelOp]:
    """derive-chunkwise's schedule of one chunk from the pool row, split by fuse-chunkwise, for
    the entry whose arguments are `values`: (its workspaces, the prepare kernel, the scan kernel
    with its pool state tile and its chunk loop, which writes o and caches every row's k,
    log-decay and u into `buffer`, the cache tensor of that entry)."""
    gate, delta_rule = layer.gate.data, bool(layer.delta_rule.value.data)
    chunked = derive_chunkwise.chunkwise_schedule(layer, values, verify_chunk_size(depth))
    scan_region = chunked.scan
    # the verify needs the outputs and the updates the tokens write, not the state after them:
    # each chunk leaves the state as it entered, and what only the state advance read is dead
    entering, leaving = k3s.carried_state(scan_region)
    advance = leaving.owner
    scan_region.body.block.last_op.operands = (entering,)
    advance.detach()
    advance.erase()
    load = {op.results[0].name_hint: op.results[0] for op in chunked.local_ops() if op.results}
    residual = next((op.residual for op in scan_region.body.ops if isinstance(op, k3s.DeltaResidualOp)), None)
    updates = [load["k"], residual if delta_rule else load["v"], *([load["g"]] if gate != "none" else [])]
    Rewriter.insert_op(make(k3s.CacheUpdateOp, operands=[buffer, *updates], gate=gate),
                       InsertPoint.before(scan_region.body.block.last_op))
    region_dce(chunked.body)
    workspaces, (prepare, scan) = fuse_chunkwise.split_kernels(layer, entry, chunked, values, block_v, num_warps, 1)
    chunked.erase()
    for op in list(scan.walk()):
        if isinstance(op, (k3s.StoreCheckpointOp, k3s.StoreStateOp)):  # no state leaves a verify
            op.detach()
            op.erase()
    old_tile = next(op for op in scan.body.ops if isinstance(op, k3s.StateTileOp))
    pool_tile = clone(old_tile, home="pool", block_v=block_v)
    pool_tile.operands = [values["state"], values["state_indices"]]
    Rewriter.replace_op(old_tile, pool_tile)
    # fp32-accurate products (`dots`: exact fp32, or 3xTF32 on tensor cores) and fp32 workspaces
    # whatever the inputs: the cached u are the committed state's updates
    for kernel, kernel_name in ((prepare, f"{name}_prepare"), (scan, name)):
        kernel.properties.update(props(k3s.KernelOp, sym_name=kernel_name, dots=dots))
    fp32_workspaces = [tensor_arg(w.sym_name.data, w.type.with_dtype("float32"), w.role.data) for w in workspaces]
    for workspace, fp32 in zip(workspaces, fp32_workspaces, strict=True):
        workspace.tensor.replace_all_uses_with(fp32.tensor)
    return fp32_workspaces, prepare, scan


def serving_entries(layer: RecurrenceOp, speculative: k3s.SpeculativeOp,
                    options: LowerSpeculativePass) -> list[k3s.EntryOp]:
    """verify, commit and (replay mode) spec_step of one layer, with the pass's options."""
    block_v, num_warps, mode = options.block_v, options.num_warps, options.mode
    name = layer.sym_name.data
    K, V = layer.head_k_dim.value.data, layer.head_v_dim.value.data
    layout = layer.state_layout.data
    depth = speculative.draft_tokens.value.data
    loop = next(op for op in speculative.body.ops if isinstance(op, k3s.TokenLoopOp))
    replay = next(op for op in speculative.body.ops if isinstance(op, k3s.ReplayOp))

    def tile(values: dict[str, SSAValue]):
        return make(k3s.StateTileOp, operands=[values["state"], values["state_indices"]], head_k_dim=K, head_v_dim=V,
                    block_v=block_v, layout=layout, home="pool", result=("S", loop.initial.type))

    def store(state: SSAValue, values: dict[str, SSAValue]):
        return make(k3s.StoreStateOp, operands=[state, values["state"], values["state_indices"]], layout=layout,
                    home="pool")

    def committing(stage: k3s.ReplayOp, committed: k3s.StateTileOp) -> k3s.ReplayOp:
        """The schedule's replay (a copy) from the committed state of the pool row's tile."""
        copy = stage.clone()
        copy.operands[0] = committed.state
        return copy

    pool = k3s.tensor("P", *recurrence_state_shape(layer), dtype="state")
    indices = k3s.tensor("B", dtype="index")
    buffer_type = cache_type(layer, depth)

    def token_arguments():
        return [a for a in recurrence_arguments(layer) if a.sym_name.data not in NOT_IN_VERIFY]

    def pool_kernel(suffix: str, body: list) -> k3s.KernelOp:
        """A kernel of one program per (value block, sequence, value head) over the pool rows."""
        return token_kernel(body, f"{name}_{suffix}", num_warps, options.token_stages)

    def entry(sym_name: str, arguments: list, kernels: list, **values) -> k3s.EntryOp:
        """The entry of these arguments and kernels, whose stages (cloned from the speculative
        entry) read and write its arguments."""
        made = make(k3s.EntryOp, [*arguments, *kernels], sym_name=sym_name, source=SymbolRefAttr(name),
                    **values)
        rebind(made.body, argument_values(list(made.body.ops)))
        return made

    if mode == "replay":
        buffer = "cache"
    else:  # the baseline: the same verify, but a whole state written after every token
        buffer, buffer_type = "snapshots", k3s.tensor("P", depth, *recurrence_state_shape(layer), dtype="float32")
    verify_arguments = [
        *token_arguments(),
        tensor_arg("state", pool, "input"),
        tensor_arg("state_indices", indices, "input", purpose="state_slots"),
        tensor_arg(buffer, buffer_type, "inout", purpose="draft_states"),
    ]
    commit_arguments = [
        tensor_arg("state", pool, "inout"),
        tensor_arg("state_indices", indices, "input", purpose="state_slots"),
        tensor_arg(buffer, buffer_type, "input", purpose="draft_states"),
        tensor_arg("accepted", indices, "input", purpose="accepted_counts"),
    ]
    verify_loop = loop.clone()
    commit_values = argument_values(commit_arguments)
    commit_tile = tile(commit_values)
    if mode == "replay":
        commit_state = committing(replay, commit_tile)
    else:
        snapshots = argument_values(verify_arguments)["snapshots"]
        for cached in [op for op in verify_loop.walk() if isinstance(op, k3s.CacheUpdateOp)]:
            state = verify_loop.body.block.last_op.state  # the state after this token
            Rewriter.replace_op(cached, make(k3s.SnapshotStateOp, operands=[snapshots, state]))
        commit_state = make(k3s.RestoreSnapshotOp,
                            operands=[commit_tile.state, commit_values["snapshots"], commit_values["accepted"]],
                            result=("S", commit_tile.state.type))

    chunked = options.verify == "chunked"
    verify_values = argument_values(verify_arguments)
    if chunked:
        workspaces, prepare, scan = chunked_verify(layer, speculative.parent_op(), verify_values, depth, block_v,
                                                   num_warps, verify_values["cache"], f"{name}_verify",
                                                   options.verify_dots)
        verify_kernels = [*workspaces, prepare, scan]
    else:
        verify_tile = tile(verify_values)
        verify_kernels = [pool_kernel("verify", [verify_tile, over_pool_rows(verify_loop, verify_tile.state)])]
    verify = entry("verify", verify_arguments, verify_kernels, max_tokens=depth)
    commit = entry("commit", commit_arguments, [
        pool_kernel("commit", [commit_tile, commit_state, store(commit_state.results[0], commit_values)]),
    ])
    if mode == "snapshot":
        return [verify, commit]
    step_arguments = [
        *token_arguments(),
        tensor_arg("state", pool, "inout"),
        tensor_arg("state_indices", indices, "input", purpose="state_slots"),
        tensor_arg("cache", buffer_type, "input", purpose="draft_states"),
        tensor_arg("accepted", indices, "input", purpose="accepted_counts"),
        tensor_arg("next_cache", buffer_type, "inout", purpose="draft_states", distinct_from=SymbolRefAttr("cache")),
    ]
    step_values = argument_values(step_arguments)
    next_cache = step_values["next_cache"]
    # the replay reads the previous round's cache (rebound to spec_step's cache and accepted); the
    # round's verify goes on from the replayed state
    if chunked:  # the prepare reads only the inputs; the scan commits the row, then verifies from it
        workspaces, prepare, scan = chunked_verify(layer, speculative.parent_op(), step_values, depth, block_v,
                                                   num_warps, next_cache, f"{name}_spec_step", options.verify_dots)
        step_tile = next(op for op in scan.body.ops if isinstance(op, k3s.StateTileOp))
        replayed = committing(replay, step_tile)
        Rewriter.insert_op([replayed, store(replayed.replayed, step_values)], InsertPoint.after(step_tile))
        chunks = next(op for op in scan.body.ops if isinstance(op, k3s.ChunkLoopOp))
        chunks.operands[0] = replayed.replayed
        step_kernels = [*workspaces, prepare, scan]
    else:
        step_tile = tile(step_values)
        replayed = committing(replay, step_tile)
        step_kernels = [pool_kernel("spec_step", [
            step_tile,
            replayed,
            store(replayed.replayed, step_values),
            over_pool_rows(next_cache_loop(loop, next_cache), replayed.replayed),
        ])]
    step = entry("spec_step", step_arguments, step_kernels, max_tokens=depth)
    return [verify, commit, step]


@dataclass(frozen=True)
class LowerSpeculativePass(ModulePass):
    """Replace every `speculative` entry by its `verify`, `commit` and (replay mode) `spec_step` entries."""

    name = "lower-speculative"
    # the fastest rounds of block-v 16/32/64 x num-warps 2/4/8 x token-stages 0/3 on the H200 at
    # B = 64 and 256, n = 1 and 8 (H32 K = V = 128): spec_step at B = 256, n = 8 758 us vs 1188 with
    # (32, 4, 0); bench/serving_sweep.py at 1d20b26 (bench/results/issue4_serving_sweep_v1.md)
    block_v: int = 64
    num_warps: int = 2
    mode: str = "replay"  # or snapshot: the baseline of today's engines, for comparison
    verify: str = "token"  # or chunked: a round's drafts as one chunk of the chunkwise schedule
    token_stages: int = 3  # > 0: the token and replay loops prefetch that many tokens ahead
    # the chunked verify's products: fp32 (exact, FMA: its scan kernel took 9.7 ms at B = 256 on
    # the H200) or tf32x3 (fp32-accurate on tensor cores; not yet timed on the GPU)
    verify_dots: str = "fp32"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.mode not in ("replay", "snapshot"):
            raise ValueError(f"lower-speculative: mode must be replay or snapshot, got {self.mode!r}")
        if self.verify not in ("token", "chunked"):
            raise ValueError(f"lower-speculative: verify must be token or chunked, got {self.verify!r}")
        if self.verify_dots not in (k3s.KernelDots.FP32, k3s.KernelDots.TF32X3):
            raise ValueError(f"lower-speculative: verify-dots must be fp32 or tf32x3, "
                             f"got {self.verify_dots!r}")
        if self.verify_dots != "fp32" and self.verify != "chunked":
            raise ValueError("lower-speculative: verify-dots applies to verify=chunked (the token verify has no products)")
        if self.verify == "chunked" and self.mode != "replay":
            raise ValueError("lower-speculative: verify=chunked needs mode=replay (the snapshot baseline is token by token)")
        check_power_of_two("lower-speculative", "block-v", self.block_v)
        check_num_warps("lower-speculative", self.num_warps)
        check_token_stages("lower-speculative", self.token_stages)
        for speculative in [o for o in op.walk() if isinstance(o, k3s.SpeculativeOp)]:
            entry = speculative.parent_op()
            entries = serving_entries(entry.layer(), speculative, self)
            if entry.sym_name.data != "speculative":  # a multi-layer module's prefixed names
                prefix = entry.sym_name.data.removesuffix("speculative")
                for new in entries:
                    new.properties["sym_name"] = type(entry.sym_name)(prefix + new.sym_name.data)
            Rewriter.insert_op(entries, InsertPoint.before(entry))
            entry.detach()
            entry.erase()
