"""fuse-chunkwise: group the stages of a k3s.chunked schedule into Triton kernels.

grouping = split (FlashKDA's split): a token-parallel `prepare` kernel, one program per
(chunk, value head), runs the chunk-local stages and spills what the scan reads (W, U, P, and
with a gate the decayed QG, KG and the chunk's decay gamma_C) to workspaces; a head-parallel
`scan` kernel, one program per (value block, sequence, value head), carries the state through
the chunks.

grouping = split-prepare: the prepare as two token-parallel kernels, `gram` (the gate cumsum,
the Grams and the triangular solve, spilling T = (I + A)^-1 Diag(beta) as a [C, C] block per
chunk) and `wy` (the WY products and the gate applications, reloading T): fewer tiles live in
each, so more programs per SM, for one more [C, C] workspace and a second read of k and g.

What crosses a cut between kernels follows from the values: a value one kernel makes and a
later one reads is spilled after its producer and reloaded before the loop body, unless it is
cheap to rebuild (the cumulative gate), in which case its producer is cloned into the reader.
Inputs are loaded in every kernel that reads them, right before their first reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerType, ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.passes.common import (
    argument_values,
    check_num_warps,
    check_power_of_two,
    entry_values,
    make,
    rebind,
    tensor_arg,
)

RECOMPUTED = (k3s.GateCumsumOp, k3s.GateTotalOp)  # cheaper to redo where read than to spill and reload
LOADS = (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp)
INPUT_ORDER = ("q", "k", "v", "g", "beta", "do")  # several loads before one stage: in this order
GROUPINGS = ("split", "split-prepare")
WY_STAGES = (k3s.WYApplyOp, k3s.GateApplyOp)  # the second prepare kernel of split-prepare
GRAM_OPERAND_STAGES = (k3s.BlockRescaleOp, k3s.BlockSpanCheckOp)  # what only a Gram reads


def producer(value: SSAValue) -> Operation | None:
    return value.owner if isinstance(value.owner, Operation) else None


def is_input(value: SSAValue) -> bool:
    return isinstance(producer(value), LOADS)


def reads(op: Operation) -> set[SSAValue]:
    """The tiles a stage reads (the tensors it reads or writes are always there)."""
    return {v for v in op.operands if isinstance(v.type, k3s.TileType | IntegerType)}  # tiles and guards


def crossing(producers: list[Operation], consumers: list[Operation]) -> tuple[list[Operation], list[SSAValue]]:
    """What `consumers` read of what `producers` make: the producers to recompute on the
    consumers' side (RECOMPUTED, with the recomputed producers they read in turn, in program
    order) and the values to spill and reload, by name."""
    made = {result: op for op in producers for result in op.results}
    needed = {v for op in consumers for v in op.operands if v in made}
    recomputed: set[Operation] = set()
    while wanted := {made[v] for v in needed if isinstance(made[v], RECOMPUTED)} - recomputed:
        recomputed |= wanted
        needed |= {v for op in wanted for v in op.operands if v in made}
    spilled = sorted((v for v in needed if made[v] not in recomputed), key=lambda v: v.name_hint)
    return [op for op in producers if op in recomputed], spilled


def with_grams_together(stages: list[Operation]) -> list[Operation]:
    """The query Gram, with the factors only it reads, right after the key Gram: both read the
    same gate references and key factors, which then die before the triangular solve instead of
    living through it."""
    grams = [op for op in stages if isinstance(op, k3s.GramOp)]
    if len(grams) < 2:
        return stages
    moved = [op for op in stages if op is grams[1] or (
        isinstance(op, k3s.BlockRescaleOp) and all(use.operation is grams[1] for use in op.factor.uses))]
    rest = [op for op in stages if op not in moved]
    at = rest.index(grams[0]) + 1
    return [*rest[:at], *moved, *rest[at:]]


def with_spilled_sinks_early(stages: list[Operation], spilled: set[SSAValue]) -> list[Operation]:
    """A stage whose result is only spilled runs as soon as everything it reads is live (made,
    or an input an earlier stage read), but not between a Gram's factors and the Gram: its
    operands then need not stay live for it."""
    ordered = list(stages)
    read_here = set().union(*(reads(op) for op in stages))
    for sink in [op for op in stages if op.results and op.results[0] in spilled - read_here]:
        at = ordered.index(sink)
        ordered.remove(sink)
        live: set[SSAValue] = set()
        for index, op in enumerate(ordered[:at]):
            live |= reads(op) | set(op.results)
            if reads(sink) <= live:
                at = index + 1
                break
        # not between a Gram's factors (and guard) and the Gram, which should meet them at once (on
        # the H200 the KDA prepare was 7% slower with KG spilled there, GLA's 4% faster: bench/RESULTS.md)
        while (not isinstance(sink, k3s.GramOp) and 0 < at < len(ordered)
               and isinstance(ordered[at - 1], GRAM_OPERAND_STAGES)):
            at += 1
        ordered.insert(at, sink)
    return ordered


class KernelBody:
    """The ops of one kernel (or its chunk loop), cloned from the schedule: `mapped` takes a
    schedule value to this kernel's copy, `workspaces` a spilled value's name to the workspace
    (tensor argument) it is spilled to; inputs are loaded right before their first reader and spills follow
    their producers, so the [C, K] tiles live briefly (registers, not local memory)."""

    def __init__(self, workspaces: dict[str, k3s.TensorArgOp], mapped: dict[SSAValue, SSAValue] | None = None) -> None:
        self.ops: list[Operation] = []
        self.workspaces = workspaces
        self.mapped: dict[SSAValue, SSAValue] = dict(mapped or {})

    def add(self, op: Operation) -> Operation:
        self.ops.append(op)
        return op

    def reload(self, value: SSAValue) -> None:
        reloaded = self.add(make(k3s.ReloadOp, operands=[self.workspaces[value.name_hint].tensor],
                                 result=(value.name_hint, value.type)))
        self.mapped[value] = reloaded.results[0]

    def place(self, stages: list[Operation], spilled: set[SSAValue] = frozenset(),
              reloaded: frozenset[SSAValue] = frozenset()) -> None:
        """Clone `stages` in order, each after the loads of the inputs it reads first and the
        reloads of the `reloaded` values it reads first; spill the `spilled` values they make."""
        for op in stages:
            inputs = sorted({v for v in op.operands if is_input(v) and v not in self.mapped},
                            key=lambda v: INPUT_ORDER.index(v.name_hint))
            for value in inputs:
                self.clone(producer(value))
            for value in dict.fromkeys(v for v in op.operands if v in reloaded and v not in self.mapped):
                self.reload(value)
            self.clone(op)
            for value in op.results:
                if value in spilled:
                    self.add(make(k3s.SpillOp, operands=[self.workspaces[value.name_hint].tensor, self.mapped[value]]))

    def clone(self, op: Operation) -> None:
        self.add(op.clone(value_mapper=self.mapped))


def workspace_arguments(layer_op, chunk_size: int, names: set[str]) -> dict[str, k3s.TensorArgOp]:
    """The workspace tensor each value crossing a cut between kernels is spilled to, by the value's
    name: [B, T, HV, width] in the input dtype (T: what the WY products' dots read, cast to it
    anyway) or fp32 (the backward's A_unscaled and T_inverse); per chunk in fp32 the chunk's decay (it multiplies the fp32 state at every chunk,
    bf16 would compound) and a backward schedule's states and their cotangents."""
    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    HV = layer_op.num_v_heads.value.data
    per_token = {"W": K, "U": V, "P": chunk_size, "QG": K, "KG": K, "T": chunk_size}
    # a backward's triangular factors, reloaded where an adjoint takes them at more than bf16's precision
    per_token_fp32 = {"A_unscaled": chunk_size, "T_inverse": chunk_size}
    per_chunk = {"gamma_C": ("NC", HV, K) if layer_op.gate.data == "channel" else ("NC", HV),
                 "S": ("NC", HV, K, V), "S_bar": ("NC", HV, K, V)}
    return {
        n: tensor_arg(k3s.workspace_name(n), k3s.tensor("B", "T", HV, per_token[n], dtype="float"), "workspace")
        if n in per_token else
        tensor_arg(k3s.workspace_name(n), k3s.tensor("B", "T", HV, per_token_fp32[n], dtype="float32"), "workspace")
        if n in per_token_fp32 else
        tensor_arg(n, k3s.tensor(*per_chunk[n], dtype="float32"), "workspace")
        for n in sorted(names)
    }


def split_kernels(layer_op, entry: k3s.EntryOp, chunked: k3s.ChunkedOp, values: dict[str, SSAValue], block_v: int,
                  num_warps: int, scan_stages: int, kernel_prefix: str | None = None, grouping: str = "split",
                  prepare_maxnreg: int = 0, scan_warps: int = 0):
    """(the workspaces, the kernels) of a chunked schedule of entry's layer, for the entry whose
    argument values are `values` (the kernels' stages read and write those of the same names;
    the sequence offsets where it has them); the schedule itself is left as is. The scan's state
    tile starts from initial_state and its store writes final_state, where that entry has them:
    an entry without them (a summary, a verify) replaces the two. The scan kernel runs scan_warps
    warps (0: num_warps, as the token-parallel ones)."""
    local = [op for op in chunked.local_ops() if not isinstance(op, LOADS)]
    scan_region = chunked.scan
    scan = list(scan_region.body.ops)[:-1]  # but next_chunk
    recomputed, spilled = crossing(local, scan)
    # split-prepare: the WY products and gate applications (and what they recompute) in a second kernel
    wy = [op for op in local if isinstance(op, WY_STAGES)] if grouping == "split-prepare" else []
    gram = [op for op in local if op not in wy]
    wy_recomputed, handed = crossing(gram, wy)
    gram_results = {v for op in gram for v in op.results}
    spilled_by_gram = {v for v in spilled if v in gram_results} | set(handed)
    spilled_by_wy = {v for v in spilled if v not in gram_results}
    local = with_spilled_sinks_early(with_grams_together(gram), spilled_by_gram)

    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    C = chunked.chunk_size.value.data
    layout = layer_op.state_layout.data
    spilled_to = workspace_arguments(layer_op, C, {v.name_hint for v in [*spilled, *handed]})
    workspaces = list(spilled_to.values())
    name = kernel_prefix or f"{entry.source.string_value()}_chunk"

    offsets = values.get("cu_seqlens")

    def chunk_kernel(suffix: str, body: KernelBody) -> k3s.KernelOp:
        tile = make(k3s.ChunkTileOp, operands=[offsets], chunk_size=C, head_k_dim=K, head_v_dim=V)
        return make(k3s.KernelOp, [tile, *body.ops],
                    sym_name=f"{name}_{suffix}", grid=[GridAxis.CHUNK, GridAxis.VALUE_HEAD], num_warps=num_warps,
                    **({"maxnreg": prepare_maxnreg} if prepare_maxnreg else {}))

    first = KernelBody(spilled_to)
    first.place(local, spilled_by_gram)
    prepares = [chunk_kernel("gram" if wy else "prepare", first)]
    if wy:
        second = KernelBody(spilled_to)
        for value in handed:
            second.reload(value)
        second.place([*wy_recomputed, *wy], spilled_by_wy)
        prepares.append(chunk_kernel("wy", second))

    entering, leaving = k3s.carried_state(scan_region)
    loop_block = Block(arg_types=[entering.type])
    loop_block.args[0].name_hint = entering.name_hint
    loop = KernelBody(spilled_to, {entering: loop_block.args[0]})
    for value in spilled:
        loop.reload(value)
    loop.place([*recomputed, *scan])
    loop_block.add_ops([*loop.ops, make(k3s.StoreCheckpointOp, operands=[loop.mapped[leaving]], layout=layout),
                        make(k3s.NextChunkOp, operands=[loop.mapped[leaving]])])
    # the state tile named as the state it carries: both live in one register
    tile = make(k3s.StateTileOp, operands=[values.get("initial_state")], head_k_dim=K, head_v_dim=V,
                block_v=block_v, layout=layout, result=(entering.name_hint, entering.type))
    chunks = k3s.ChunkLoopOp([tile.state], offsets, loop_block, chunk_size=C)
    (final,) = chunks.final
    scan_kernel = make(
        k3s.KernelOp,
        [tile, chunks, make(k3s.StoreStateOp, operands=[final, values.get("final_state")], layout=layout)],
        sym_name=f"{name}_scan",
        grid=[GridAxis.VALUE_BLOCK, GridAxis.SEQUENCE_HEAD],
        num_warps=scan_warps or num_warps,
        num_stages=scan_stages,
    )
    kernels = [*prepares, scan_kernel]
    # the schedule's stages read its own entry's arguments; spills and reloads its workspaces
    rebind(kernels, {**values, **argument_values(workspaces)})
    return workspaces, kernels


@dataclass(frozen=True)
class FuseChunkwisePass(ModulePass):
    """Replace every k3s.chunked schedule by the kernels of its grouping."""

    name = "fuse-chunkwise"
    grouping: str = "split"
    block_v: int = 64
    # 4 warps: the H200 tuner's winner at every bench shape, chunks of 16 or 32 (8 warps: 0.5-0.7x,
    # bench/RESULTS.md)
    num_warps: int = 4
    # the scan kernel's warps, 0: num-warps. Whole value rows (block-v = V) in 8 warps halve the
    # scan's reads of W, QG and KG where B H fills the SMs (sm_90 offline, K = V = 128: 220
    # registers, no spills, 338 instructions a step against 366 for block-v 64 in 4 warps);
    # not measured on a GPU yet, so neither a default nor a tuner choice
    scan_warps: int = 0
    # each pipelining stage of the scan buffers a chunk of W, U, P, QG and KG in shared memory;
    # with chunks of 16, 3 stages hide the loads best (1.13x 2 stages at B1 T8192 H96)
    scan_stages: int = 3
    # registers per thread of the token-parallel kernels, 0: no cap (at 252 the fused prepare
    # fits two programs per SM; 168 fits three but spills, docs/chunk-performance.md)
    prepare_maxnreg: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.grouping not in GROUPINGS:
            raise ValueError(f"fuse-chunkwise: unknown grouping '{self.grouping}'; allowed: {', '.join(GROUPINGS)}")
        check_power_of_two(self.name, "block-v", self.block_v)
        check_num_warps(self.name, self.num_warps)
        if self.scan_warps:  # 0: num-warps
            check_power_of_two(self.name, "scan-warps", self.scan_warps, k3s.MAX_NUM_WARPS)
        if self.prepare_maxnreg and not k3s.MIN_MAXNREG <= self.prepare_maxnreg <= k3s.MAX_MAXNREG:
            raise ValueError(f"{self.name}: prepare-maxnreg must be 0 (no cap) or in {k3s.MIN_MAXNREG}..{k3s.MAX_MAXNREG}, "
                             f"got {self.prepare_maxnreg}")
        # a chunked schedule nested in another (a segment scan's finish) is lowered with its owner
        for chunked in [o for o in op.walk() if isinstance(o, k3s.ChunkedOp) and isinstance(o.parent_op(), k3s.EntryOp)]:
            entry = chunked.parent_op()
            workspaces, kernels = split_kernels(entry.layer(), entry, chunked, entry_values(entry), self.block_v,
                                                self.num_warps, self.scan_stages, grouping=self.grouping,
                                                prepare_maxnreg=self.prepare_maxnreg, scan_warps=self.scan_warps)
            Rewriter.insert_op([*workspaces, *kernels], InsertPoint.before(chunked))
            chunked.detach()
            chunked.erase()
