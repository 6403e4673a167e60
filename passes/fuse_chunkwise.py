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

Quantities a kernel needs that are cheap to rebuild (the cumulative gate) are recomputed there
instead of spilled; the data each stage reads and writes comes from `k3s.stage_dataflow`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import check_num_warps, check_power_of_two, input_loads, make

RECOMPUTED = (k3s.GateCumsumOp,)  # cheaper to redo in the scan than to spill and reload
INPUTS = ("q", "k", "v", "g", "beta")


def clone_stage(op: Operation) -> Operation:
    return type(op).create(properties=dict(op.properties))


def with_late_loads_and_early_spills(layer_op, stages: list[Operation], spilled: list[str]) -> list[Operation]:
    """Each input load right before its first reader, each spill right after its producer:
    short live ranges keep the [C, K] tiles in registers instead of local memory."""
    load = input_loads(layer_op)
    ordered: list[Operation] = []
    loaded: set[str] = set()
    for op in stages:
        reads, writes = k3s.stage_dataflow(op)
        for name in INPUTS:
            if name in reads and name not in loaded:
                ordered.append(load[name](k3s.LoadChunkOp))
                loaded.add(name)
        ordered.append(op)
        if writes in spilled:
            ordered.append(make(k3s.SpillOp, value=writes))
    return ordered


def with_grams_together(stages: list[Operation]) -> list[Operation]:
    """The query Gram right after the key Gram: both read the same gate references and key
    factors, which then die before the triangular solve instead of living through it."""
    grams = [op for op in stages if isinstance(op, k3s.GramOp)]
    if len(grams) < 2:
        return stages
    rest = [op for op in stages if op is not grams[1]]
    at = rest.index(grams[0]) + 1
    return [*rest[:at], grams[1], *rest[at:]]


def with_spilled_sinks_early(stages: list[Operation], spilled: set[str]) -> list[Operation]:
    """A stage whose result is only spilled runs as soon as everything it reads is live (produced,
    or an input an earlier stage loaded): its operands then need not stay live for it."""
    ordered = list(stages)
    read_later = set().union(*(k3s.stage_dataflow(op)[0] for op in stages))
    for sink in [op for op in stages if k3s.stage_dataflow(op)[1] in spilled - read_later]:
        reads = k3s.stage_dataflow(sink)[0]
        at = ordered.index(sink)
        ordered.remove(sink)
        live: set[str] = set()
        for index, op in enumerate(ordered[:at]):
            op_reads, op_writes = k3s.stage_dataflow(op)
            live |= op_reads | {op_writes}
            if reads <= live:
                at = index + 1
                break
        ordered.insert(at, sink)
    return ordered


GROUPINGS = ("split", "split-prepare")
WY_STAGES = (k3s.WYApplyOp, k3s.GateApplyOp)  # the second prepare kernel of split-prepare


def crossing(producers: list[Operation], consumers: list[Operation]) -> tuple[list[Operation], list[str]]:
    """What `consumers` read of what `producers` write: the stages to recompute on their side
    (RECOMPUTED) and the names to spill and reload."""
    made = {k3s.stage_dataflow(op)[1]: op for op in producers}
    reads = set().union(*(k3s.stage_dataflow(op)[0] for op in consumers))
    writes = {k3s.stage_dataflow(op)[1] for op in consumers}
    needed = sorted(name for name in reads - writes if name in made)
    return ([clone_stage(made[n]) for n in needed if isinstance(made[n], RECOMPUTED)],
            [n for n in needed if not isinstance(made[n], RECOMPUTED)])


def split_kernels(layer_op, entry: k3s.EntryOp, chunked: k3s.ChunkedOp, block_v: int, num_warps: int,
                  scan_stages: int, kernel_prefix: str | None = None, grouping: str = "split",
                  prepare_maxnreg: int = 0):
    local_region, scan_region = list(chunked.body.ops)
    local = list(local_region.body.ops)
    scan = list(scan_region.body.ops)
    recomputed, spilled = crossing(local, scan)
    # split-prepare: the WY products and gate applications (and what they recompute) in a second kernel
    wy = [op for op in local if isinstance(op, WY_STAGES)] if grouping == "split-prepare" else []
    gram = [op for op in local if op not in wy]
    wy_recomputed, handed = crossing(gram, wy)
    gram_writes = {k3s.stage_dataflow(op)[1] for op in gram}
    spilled_by_gram = sorted({n for n in spilled if n in gram_writes} | set(handed))
    spilled_by_wy = [n for n in spilled if n not in gram_writes]
    local = with_spilled_sinks_early(with_grams_together(gram), set(spilled_by_gram))

    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    HV = layer_op.num_v_heads.value.data
    C = chunked.chunk_size.value.data
    layout = layer_op.state_layout.data
    # [B, T, HV, width] in the input dtype (T: what the WY products' dots read, cast to it anyway)
    per_token = {"W": K, "U": V, "P": C, "QG": K, "KG": K, "T": C}
    # one fp32 row per chunk: it multiplies the fp32 state at every chunk, bf16 would compound
    per_chunk = {"gamma_C": f"NC,{HV},{K}" if layer_op.gate.data == "channel" else f"NC,{HV}"}
    workspaces = [
        make(k3s.TensorArgOp, sym_name=k3s.workspace_name(n), shape=f"B,T,{HV},{per_token[n]}", dtype="float",
             role="workspace")
        if n in per_token else
        make(k3s.TensorArgOp, sym_name=n, shape=per_chunk[n], dtype="float32", role="workspace")
        for n in sorted(set(spilled) | set(handed))
    ]
    name = kernel_prefix or f"{entry.source.data}_chunk"
    for op in [*gram, *wy, *scan]:
        op.detach()

    def chunk_kernel(suffix: str, stages: list[Operation]) -> k3s.KernelOp:
        return make(k3s.KernelOp, [make(k3s.ChunkTileOp, chunk_size=C, head_k_dim=K, head_v_dim=V), *stages],
                    sym_name=f"{name}_{suffix}", grid="chunk,value_head", num_warps=num_warps,
                    **({"maxnreg": prepare_maxnreg} if prepare_maxnreg else {}))

    prepares = [chunk_kernel("gram" if wy else "prepare",
                             with_late_loads_and_early_spills(layer_op, local, spilled_by_gram))]
    if wy:
        prepares.append(chunk_kernel("wy", [
            *(make(k3s.ReloadOp, value=n) for n in handed),
            *with_late_loads_and_early_spills(layer_op, [*wy_recomputed, *wy], spilled_by_wy)]))
    loop_body = [
        *(make(k3s.ReloadOp, value=n) for n in spilled),
        *with_late_loads_and_early_spills(layer_op, [*recomputed, *scan], []),
    ]
    scan_kernel = make(
        k3s.KernelOp,
        [
            make(k3s.StateTileOp, head_k_dim=K, head_v_dim=V, block_v=block_v, layout=layout),
            make(k3s.ChunkLoopOp, [*loop_body, make(k3s.StoreCheckpointOp, layout=layout)], chunk_size=C),
            make(k3s.StoreStateOp, layout=layout),
        ],
        sym_name=f"{name}_scan",
        grid="value_block,sequence_head",
        num_warps=num_warps,
        num_stages=scan_stages,
    )
    return workspaces, [*prepares, scan_kernel]


@dataclass(frozen=True)
class FuseChunkwisePass(ModulePass):
    """Replace every k3s.chunked schedule by the kernels of its grouping."""

    name = "fuse-chunkwise"
    grouping: str = "split"
    block_v: int = 64
    # 4 warps: the H200 tuner's winner at every bench shape, chunks of 16 or 32 (8 warps: 0.5-0.7x,
    # bench/RESULTS.md)
    num_warps: int = 4
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
        if self.prepare_maxnreg and not k3s.MIN_MAXNREG <= self.prepare_maxnreg <= k3s.MAX_MAXNREG:
            raise ValueError(f"{self.name}: prepare-maxnreg must be 0 (no cap) or in {k3s.MIN_MAXNREG}..{k3s.MAX_MAXNREG}, "
                             f"got {self.prepare_maxnreg}")
        layers = {o.sym_name.data: o for o in op.ops if isinstance(o, RecurrenceOp)}
        # a chunked schedule nested in another (a segment scan's finish) is lowered with its owner
        for chunked in [o for o in op.walk() if isinstance(o, k3s.ChunkedOp) and isinstance(o.parent_op(), k3s.EntryOp)]:
            entry = chunked.parent_op()
            layer = layers[entry.source.data]
            workspaces, kernels = split_kernels(layer, entry, chunked, self.block_v, self.num_warps, self.scan_stages,
                                                grouping=self.grouping, prepare_maxnreg=self.prepare_maxnreg)
            Rewriter.insert_op([*workspaces, *kernels], InsertPoint.before(chunked))
            chunked.detach()
            chunked.erase()
