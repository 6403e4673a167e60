"""lower-backward: a k3s.chunked_backward schedule -> its kernels.

The schedule's phases are the kernels, and what crosses between them follows from the values,
as in fuse-chunkwise:
- prepare (one program per chunk and value head): the recomputed forward stages the two scans
  read, spilled (the stages of fuse-chunkwise's prepare; printed as a kernel of its own);
- state scan (value block, sequence, value head): the state pass, spilling the state each chunk
  enters to a per-chunk workspace S;
- cotangent scan (the same grid, the chunks in reverse): from dht, spilling the cotangent of the
  state each chunk leaves to S_bar, storing the first chunk's entering one to dh0;
- gradients (chunk, value head, all value columns): the forward stages the adjoints read,
  recomputed from the inputs (or, with gradients-forward=reload, the matrix stages among them
  reloaded from the prepare's spills); S and S_bar reloaded; the adjoint stages and the stores.
  With scan-values=spill, the values the gradients kernel reads that a scan also makes from its
  carried tile (the delta residual, the residual's cotangent) are spilled by the scan and
  reloaded, and what only they needed (the query Gram, W, U) is no longer recomputed. Where it
  holds guarded forms (an unbounded channel gate), it is launched twice, its flag STEEP off for
  the chunks whose span check holds and on for the others (guarded_by_flag).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, DictionaryAttr, ModuleOp, StringAttr, i1
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.common import (argument_values, check_num_warps, check_power_of_two, entry_values, make, rebind,
                                     tensor_arg)
from k3compile.passes.fuse_chunkwise import LOADS, KernelBody, crossing, workspace_arguments


def feeding(stages: list[Operation], read: list[SSAValue], given: frozenset[SSAValue] = frozenset()
            ) -> list[Operation]:
    """The stages (in order) that make the values `read`, directly or through other stages, short
    of the values `given` (reloaded: neither they nor what only they need are recomputed)."""
    made = {result: op for op in stages for result in op.results}
    wanted: set[Operation] = set()
    frontier = [v for v in read if v not in given]
    while frontier:
        value = frontier.pop()
        if value in given:
            continue
        producer = made.get(value)
        if producer is not None and producer not in wanted:
            wanted.add(producer)
            frontier += producer.operands
    return [op for op in stages if op in wanted]


def has_value_columns(value: SSAValue) -> bool:
    return isinstance(value.type, k3s.TileType) and "V" in [d.data for d in value.type.dims.data]


def in_value_blocks(ops: list[Operation], block_v: int) -> list[Operation]:
    """ops (a chunk kernel's, in order) with the stages that read or make value columns moved
    into a k3s.value_block_loop of block_v columns: the ones before it make none and read none
    of its sums, the ones after it read them. What leaves the loop without value columns must be
    a contraction of them (a dot or a reduce_sum), so that it is the sum of its blocks' parts. ops
    as they are where that does not hold (a stage on value columns that needs such a sum)."""
    blocked = [op for op in ops if any(has_value_columns(v) for v in (*op.operands, *op.results))]
    parts = [r for op in blocked for r in op.results if not has_value_columns(r)]
    if not blocked or any(not isinstance(p.owner, (k3s.DotOp, k3s.ReduceSumOp)) for p in parts):
        return ops
    after: set[Operation] = set()
    reads_a_sum = set(parts)
    for op in ops:
        if op not in blocked and any(v in reads_a_sum for v in op.operands):
            after.add(op)
            reads_a_sum.update(op.results)
    if any(v in reads_a_sum for op in blocked for v in op.operands):
        return ops
    body = Block(arg_types=[p.type for p in parts])
    body.add_ops([*blocked, make(k3s.SumValueBlocksOp, operands=parts)])
    loop = make(k3s.ValueBlockLoopOp, body, block_v=block_v, results=[(p.name_hint, p.type) for p in parts])
    for part, carried, total in zip(parts, body.args, loop.results, strict=True):
        carried.name_hint = part.name_hint  # the sum's register; the part becomes the block's
        part.replace_uses_with_if(total, lambda use: use.operation.parent_op() is not loop)
        part.name_hint = f"{part.name_hint}_block"
    before = [op for op in ops if op not in blocked and op not in after]
    return [*before, loop, *[op for op in ops if op in after]]


def is_guarded(ops: list[Operation]) -> bool:
    """Whether ops hold a guarded form (a Gram diagonal or gated contraction, factored where the
    chunk's k3s.block_span_check holds)."""
    guarded = k3s.GramDiagonal.GUARDED
    return any(isinstance(op, k3s.GramOp) and op.diagonal is not None and op.diagonal.data == guarded
               or isinstance(op, k3s.GatedContractionOp) and op.form.data == guarded for op in ops)


# the constexpr flag of a gradients kernel with guarded forms: off in the launch that runs the
# chunks whose span check holds (the forms factored), on in its second launch, the steep chunks'
STEEP = "STEEP"


def guarded_by_flag(ops: list[Operation], steep_chunks: SSAValue | None) -> list[Operation]:
    """A chunk kernel's ops, where they hold guarded forms, as one code for two launches (the
    kernel's flag STEEP off, then on): its guarded forms take `k3s.flag <flag = STEEP, on =
    false>` as their guard instead of the span check, so Triton compiles each launch with one
    form; the span check, recording it to the workspace `steep_chunks` and the exit of the steep
    chunks run under `k3s.when <flag = STEEP, on = false>`; reading the recorded check back and
    the exit of the other chunks under `k3s.when <flag = STEEP>`, before anything else. Inlined
    together, the elementwise loops that most chunks never run would cost every chunk registers
    (ptxas spills the factored path around them); as two launches, each compiles one path, and
    most programs of the steep launch exit before loading anything. ops as they are where they
    hold no guarded form."""
    if not is_guarded(ops):
        return ops
    factored = make(k3s.FlagOp, flag=STEEP, on=False, result=("factored", i1))
    recorded = make(k3s.RecordedCheckOp, operands=[steep_chunks], result=("factorable", i1))
    steep_exit = make(k3s.WhenOp, [recorded, make(k3s.ExitUnlessOp, operands=[recorded.check], holds=False)],
                      flag=STEEP)
    merged: list[Operation] = [steep_exit, factored]
    for op in ops:
        if isinstance(op, k3s.BlockSpanCheckOp):
            op.fits.replace_all_uses_with(factored.value)  # the guards; the check itself only decides the exit
            merged.append(make(k3s.WhenOp, [op, make(k3s.RecordCheckOp, operands=[steep_chunks, op.fits]),
                                            make(k3s.ExitUnlessOp, operands=[op.fits], holds=True)],
                               flag=STEEP, on=False))
        else:
            merged.append(op)
    return merged


def without_dead_stages(kernel: list[Operation]) -> list[Operation]:
    """kernel's ops less those whose results nothing reads (erased), until none is left."""
    while dead := [op for op in kernel if op.results and not any(r.uses for r in op.results)]:
        for op in dead:
            kernel.remove(op)
            op.erase()
    return kernel


def loop_reads(loop: k3s.ValueBlockLoopOp) -> list[SSAValue]:
    """The values the stages of a value-block loop read that are made outside it, in order."""
    inside = {*loop.body.block.args, *(r for op in loop.walk() for r in op.results)}
    return list(dict.fromkeys(v for op in loop.walk() for v in op.operands if v not in inside))


# the stages that multiply matrices in a gradients kernel's value-block loop (tl.dot when printed)
PRODUCTS = (k3s.DotOp, k3s.DeltaResidualOp, k3s.WYApplyOp)


def widest_product_last(loop: k3s.ValueBlockLoopOp, sizes: dict[str, int]) -> None:
    """Reorder the loop's stages (dependencies kept, its terminator last) so that the product with
    the most columns among those with fewer rows than columns comes after every stage that does
    not read it. Triton (3.6 to 3.9) lays out a chain of products as the first it converts, which
    is a kernel's last: a [C, C] product last at C = 16 gives every product warps along the rows
    ([8, 1]: each warp repeats the whole [16, n] product), a [C, K] one warps along the columns
    ([1, 8]). Offline for sm_90, the value-block kernel of bounded KDA went from 260 tensor-core
    instructions, 255 registers and 704 B of stack to 55, 195 and none."""
    ops = list(loop.body.ops)[:-1]

    def shape(op: Operation) -> tuple[int, ...]:
        return tuple(sizes[d] for d in k3s.tile_dims(op.results[0]))

    wide = [op for op in ops if isinstance(op, PRODUCTS) and len(shape(op)) == 2 and shape(op)[0] < shape(op)[1]]
    if not wide:
        return
    widest = max(reversed(wide), key=lambda op: shape(op)[1])  # the last of the widest
    reads = {*widest.results}
    moved = [widest]
    for op in ops[ops.index(widest) + 1:]:
        if any(v in reads for v in op.operands):
            moved.append(op)
            reads.update(op.results)
    for op in moved:
        op.detach()
        loop.body.block.insert_op_before(op, loop.body.block.last_op)


def split_value_blocks(ops: list[Operation], workspaces: dict[str, k3s.TensorArgOp], layer_op: RecurrenceOp,
                       chunk_size: int, block_v: int) -> list[list[Operation]]:
    """A gradients kernel's ops (in_value_blocks') as two kernels, where they have a value-block
    loop: the loop with what it reads of the stages before it (recomputed, or reloaded where those
    are), each program one value block of a chunk, spilling its parts of the loop's sums (fp32, to
    [.., NVB, ..] workspaces added to `workspaces`); then the stages after the loop, with what
    they read of the stages before it, each loop sum added up from its NVB parts right before its
    first reader. The stores before the loop, if any, go with the second. ops as one kernel where
    there is no loop."""
    loop = next((op for op in ops if isinstance(op, k3s.ValueBlockLoopOp)), None)
    if loop is None:
        return [ops]
    before, after = ops[:ops.index(loop)], ops[ops.index(loop) + 1:]
    stores = [op for op in before if not op.results]
    K, HV = layer_op.head_k_dim.value.data, layer_op.num_v_heads.value.data
    blocks = -(-layer_op.head_v_dim.value.data // block_v)  # NVB: as many as the loop's (legalize-triton's BV)
    width = {"K": K, "C": chunk_size}
    parts: dict[SSAValue, SSAValue] = {}
    for total in loop.results:
        dims = k3s.tile_dims(total)
        per_token = dims[:1] == ("C",)
        columns = [width[d] for d in (dims[1:] if per_token else dims)]
        shape = ("B", "T", HV, blocks, *columns) if per_token else ("NC", HV, blocks, *columns)
        name = f"{total.name_hint}_parts"
        if name in workspaces:
            raise ValueError(f"lower-backward: the value-block parts {name} have the name of another workspace")
        workspaces[name] = tensor_arg(name, k3s.tensor(*shape, dtype="float32"), "workspace")
        parts[total] = workspaces[name].results[0]
    widest_product_last(loop, {"C": chunk_size, "K": K, "V": min(block_v, layer_op.head_v_dim.value.data)})
    value_blocks = [*feeding(before, loop_reads(loop)), loop,
                    *(make(k3s.SpillValueBlockPartOp, operands=[parts[t], t]) for t in loop.results)]
    rest = KernelBody(workspaces)
    for op in [*feeding(before, [v for op in [*stores, *after] for v in op.operands]), *stores]:
        rest.clone(op)
    for op in after:
        for total in dict.fromkeys(v for v in op.operands if v in parts and v not in rest.mapped):
            summed = rest.add(make(k3s.SumValueBlockPartsOp, operands=[parts[total]],
                                   result=(total.name_hint, total.type)))
            rest.mapped[total] = summed.results[0]
        rest.clone(op)
    for op in [*stores, *after]:
        op.drop_all_references()
    for op in before:
        if op not in value_blocks:
            op.drop_all_references()
    return [without_dead_stages(value_blocks), rest.ops]


def scan_values(scans: list[Operation], gradients: list[Operation]) -> dict[SSAValue, SSAValue]:
    """The values the gradients stages read that a scan's body also makes from its carried tile:
    {the gradients' value: the scan body's}. Two values are the same when the same stages make
    them from the same operands, a scan's carried tile (its block argument in the body, its result
    in the gradients stages) standing for itself and a load for its tensor and properties. Kept:
    the values with value columns that depend on a carried tile (what a scan can spill per token,
    and not cheaper to load again) and that a gradients stage other than such a value's reads."""
    keys: dict[SSAValue, object] = {}
    carried_by: dict[SSAValue, bool] = {}

    def key(value: SSAValue, stages: set[Operation]) -> object:
        if value not in keys:
            op = value.owner
            if isinstance(op, Operation) and (isinstance(op, LOADS) or op in stages):
                operands = tuple(v if isinstance(v.type, k3s.TensorType) else key(v, stages) for v in op.operands)
                keys[value] = (op.name, tuple(sorted((n, str(a)) for n, a in op.properties.items())), operands,
                               list(op.results).index(value))
                carried_by[value] = any(carried_by.get(v, False) for v in op.operands)
            else:  # made before the scans, or an entry's argument
                keys[value] = value
        return keys[value]

    made_by_scans: dict[object, SSAValue] = {}
    for scan in scans:
        body = list(scan.body.ops)[:-1]  # but next_chunk
        for carried in (scan.body.block.args[0], scan.results[0]):
            keys[carried], carried_by[carried] = scan.name, True
        for op in body:
            for result in op.results:
                made_by_scans.setdefault(key(result, set(body)), result)
    stages = set(gradients)
    shared = {result: made_by_scans[key(result, stages)] for op in gradients for result in op.results
              if key(result, stages) in made_by_scans and carried_by[result] and has_value_columns(result)}
    producers = {value.owner for value in shared}
    return {value: made for value, made in shared.items() if any(use.operation not in producers for use in value.uses)}


def needed_stages(stages: list[Operation], given: set[SSAValue]) -> list[Operation]:
    """stages (in order) less those that only make the `given` values (reloaded) or feed them:
    the stores and what they read, short of the given values."""
    stores = [op for op in stages if not op.results]
    wanted = set(feeding(stages, [v for op in stores for v in op.operands], frozenset(given))) | set(stores)
    return [op for op in stages if op in wanted]


# the forward stages that multiply matrices: what gradients-forward=reload hands from the prepare
# to the gradients kernel instead of recomputing there (their results without value columns)
MATRIX_STAGES = (k3s.GramOp, k3s.UnitLowerInverseOp, k3s.ForwardSubstitutionOp, k3s.WYApplyOp)
GRADIENTS_FORWARD = ("recompute", "reload")
SCAN_VALUES = ("recompute", "spill")
GRADIENTS_SPLIT = ("none", "value-blocks")


def handed_to_gradients(local: list[Operation], read: list[SSAValue]) -> list[SSAValue]:
    """The results of local's matrix stages that the gradients kernel reads (directly or through
    the stages it recomputes), but for those with value columns (made in its value-block loop)."""
    recomputed = feeding(local, read)
    return [r for op in recomputed if isinstance(op, MATRIX_STAGES) for r in op.results if not has_value_columns(r)]


def lower_backward(layer_op: RecurrenceOp, schedule: k3s.ChunkedBackwardOp, values: dict[str, SSAValue],
                   block_v: int, num_warps: int, scan_stages: int, state_spill: str,
                   gradients_maxnreg: int, gradients_forward: str = "recompute", scan_spills: bool = False,
                   gradients_split: str = "none", value_blocks_maxnreg: int = 255, gradients_warps: int = 0
                   ) -> tuple[list[Operation], list[Operation]]:
    """(the workspaces, the kernels) of a backward schedule, whose stages read the entry's `values`;
    S and S_bar are spilled in `state_spill` (the input dtype, or float32: twice the traffic); the
    gradients kernels' registers capped at `gradients_maxnreg` (0: ptxas' choice); the forward's
    matrix stages that the gradients kernel reads recomputed there, or (`gradients_forward` reload)
    spilled by the prepare and reloaded; with `scan_spills`, the scans spill the values the gradients
    kernel reads of theirs (scan_values) and the gradients kernel reloads them; with `gradients_split`
    value-blocks, the gradients kernel's value-block loop is a kernel of its own (split_value_blocks),
    a program per chunk, value head and value block, its registers capped at `value_blocks_maxnreg`."""
    ops = list(schedule.body.ops)
    state_scan = next(op for op in ops if isinstance(op, k3s.StateScanOp))
    cotangent_scan = next(op for op in ops if isinstance(op, k3s.CotangentScanOp))
    local = [op for op in ops[:ops.index(state_scan)] if not isinstance(op, LOADS)]
    gradients = [op for op in ops[ops.index(state_scan) + 1:] if op is not cotangent_scan and not isinstance(op, LOADS)]
    from_scans = scan_values([state_scan, cotangent_scan], gradients) if scan_spills else {}
    gradients = needed_stages(gradients, set(from_scans))
    state_stages, cotangent_stages = (list(scan.body.ops)[:-1] for scan in (state_scan, cotangent_scan))
    recomputed_s, spilled_s = crossing(local, state_stages)
    recomputed_c, spilled_c = crossing(local, cotangent_stages)
    spilled = set(spilled_s) | set(spilled_c)
    gradients_read = [v for op in gradients for v in op.operands]
    handed = handed_to_gradients(local, gradients_read) if gradients_forward == "reload" else []
    spilled |= set(handed)

    K, V = layer_op.head_k_dim.value.data, layer_op.head_v_dim.value.data
    C = schedule.chunk_size.value.data
    spilled_to = workspace_arguments(layer_op, C, {v.name_hint for v in spilled} | {"S", "S_bar"})
    HV = layer_op.num_v_heads.value.data
    for value in from_scans:  # [C, V] rows per token, in the inputs' dtype (as U)
        if value.name_hint in spilled_to:
            raise ValueError(f"lower-backward: the scans' value {value.name_hint} has the name of another workspace")
        spilled_to[value.name_hint] = tensor_arg(k3s.workspace_name(value.name_hint),
                                                 k3s.tensor("B", "T", HV, V, dtype="float"), "workspace")
    if state_spill == "input":
        for name in ("S", "S_bar"):
            dims = spilled_to[name].results[0].type.dims
            spilled_to[name] = tensor_arg(name, k3s.tensor(*dims, dtype="float"), "workspace")
    offsets = values.get("cu_seqlens")
    name = f"{layer_op.sym_name.data}_backward"

    def chunk_kernel(suffix: str, body: KernelBody, warps: int, maxnreg: int = 0,
                     grid: tuple[GridAxis, ...] = (GridAxis.CHUNK, GridAxis.VALUE_HEAD)) -> k3s.KernelOp:
        tile = make(k3s.ChunkTileOp, operands=[offsets], chunk_size=C, head_k_dim=K, head_v_dim=V)
        return make(k3s.KernelOp, [tile, *body.ops], sym_name=f"{name}_{suffix}", grid=grid,
                    num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {}))

    prepare = KernelBody(spilled_to)
    prepare.place(feeding(local, list(spilled)), spilled)

    def scan_kernel(suffix: str, scan: Operation, recomputed: list[Operation], reloaded: list[SSAValue],
                    start: SSAValue | None, workspace: str, stored: SSAValue | None, reverse: bool) -> k3s.KernelOp:
        """A value-block kernel carrying the scan's block argument (b_S) through the chunks; it spills
        the carried tile on entering each chunk: the state it enters, or the cotangent of the one it
        leaves."""
        carried = scan.body.block.args[0]
        loop_block = Block(arg_types=[carried.type])
        loop_block.args[0].name_hint = "S"  # the state tile's register
        loop = KernelBody(spilled_to, {carried: loop_block.args[0]})
        loop.add(make(k3s.SpillOp, operands=[spilled_to[workspace].results[0], loop_block.args[0]]))
        for value in reloaded:
            loop.reload(value)
        stages = list(scan.body.ops)
        spills = {made: spilled_to[value.name_hint].results[0] for value, made in from_scans.items()
                  if made.owner.parent_op() is scan}
        loop.place([*recomputed, *stages[:-1]])
        for made, workspace in spills.items():  # right after the stage that makes it
            at = loop.ops.index(loop.mapped[made].owner) + 1
            loop.ops.insert(at, make(k3s.SpillOp, operands=[workspace, loop.mapped[made]]))
        loop_block.add_ops([*loop.ops, make(k3s.NextChunkOp, operands=[loop.mapped[stages[-1].carried[0]]])])
        layout = {"layout": layer_op.state_layout.data}
        tile_type = loop_block.args[0].type
        tile = make(k3s.StateTileOp, operands=[start], head_k_dim=K, head_v_dim=V, block_v=block_v, **layout,
                    result=("S", tile_type))  # in the register of the state it carries
        chunks = k3s.ChunkLoopOp([tile.state], offsets, loop_block, chunk_size=C, reverse=reverse)
        body = [tile, chunks]
        if stored is not None:
            (final,) = chunks.final
            body.append(make(k3s.StoreStateOp, operands=[final, stored], **layout))
        return make(k3s.KernelOp, body, sym_name=f"{name}_{suffix}",
                    grid=[GridAxis.VALUE_BLOCK, GridAxis.SEQUENCE_HEAD],
                    num_warps=num_warps, num_stages=scan_stages)

    states = scan_kernel("state_scan", state_scan, recomputed_s, spilled_s, values["initial_state"], "S", None, False)
    cotangents = scan_kernel("cotangent_scan", cotangent_scan, recomputed_c, spilled_c, values["dht"], "S_bar",
                             values["dh0"], True)

    grads = KernelBody(spilled_to)
    for scan, workspace in ((state_scan, "S"), (cotangent_scan, "S_bar")):
        reloaded = make(k3s.ReloadOp, operands=[spilled_to[workspace].results[0]], result=(workspace, scan.results[0].type))
        grads.add(reloaded)
        grads.mapped[scan.results[0]] = reloaded.results[0]
    grads.place([*feeding(local, gradients_read, frozenset(handed)), *gradients],
                reloaded=frozenset(handed) | frozenset(from_scans))
    grads.ops = in_value_blocks(grads.ops, block_v)
    # the value columns in blocks of block_v (the [K, V] state and cotangent tiles a block at a
    # time), twice the prepare's warps; the chunks whose decays overflow the factored forms, if
    # any, in a second launch of it
    # with gradients-split=value-blocks, the value-block loop a kernel of its own, a value block a
    # program, before the rest
    parts = split_value_blocks(grads.ops, spilled_to, layer_op, C, block_v) if gradients_split == "value-blocks" \
        else [grads.ops]
    steep_chunks = None
    if any(is_guarded(ops) for ops in parts):  # each chunk's span check, recorded by the first launch for the steep one
        spilled_to["steep_chunks"] = tensor_arg("steep_chunks", k3s.tensor("NC", HV, dtype="float32"), "workspace")
        steep_chunks = spilled_to["steep_chunks"].results[0]
    gradient_kernels = []
    for kind, part in zip(("value_blocks", "gradients")[-len(parts):], parts):
        grid = (GridAxis.CHUNK, GridAxis.VALUE_HEAD, *((GridAxis.VALUE_BLOCK,) if kind == "value_blocks" else ()))
        warps = gradients_warps or 2 * num_warps
        # a cap the warps could not launch at is lowered to what the register file allows (at 16
        # warps 128: 255 failed to launch on the H100, "out of resource: threads, Required: 512")
        maxnreg = k3s.register_cap(value_blocks_maxnreg if kind == "value_blocks" else gradients_maxnreg, warps)
        body = KernelBody(spilled_to)
        body.ops = guarded_by_flag(part, steep_chunks)
        kernel = chunk_kernel(kind, body, warps, maxnreg, grid)
        gradient_kernels.append(kernel)
        if is_guarded(part):  # its second launch, the steep chunks': the same code (merge-identical-kernels)
            steep = kernel.clone()
            steep.properties["sym_name"] = StringAttr(f"{name}_{kind}_steep")
            for launch, on in ((kernel, False), (steep, True)):
                launch.properties["flags"] = DictionaryAttr({STEEP: BoolAttr.from_bool(on)})
            gradient_kernels.append(steep)
    kernels = [chunk_kernel("prepare", prepare, num_warps), states, cotangents, *gradient_kernels]
    workspaces = list(spilled_to.values())
    rebind(kernels, {**values, **argument_values(workspaces)})
    return workspaces, kernels


@dataclass(frozen=True)
class LowerBackwardPass(ModulePass):
    """Replace every k3s.chunked_backward schedule by its kernels."""

    name = "lower-backward"
    block_v: int = 64
    num_warps: int = 4
    scan_stages: int = 2
    # the dtype of the per-chunk state and cotangent workspaces: input (the inputs' dtype, as fla
    # keeps its chunk states; the scans still carry fp32, and the gradients kernel's products
    # take S and S_bar in the inputs' dtype anyway) or float32 (twice the bytes)
    state_spill: str = "input"
    # the gradients kernels' register cap (ptxas' maxnreg; 0: none). Without one ptxas gives the
    # steep launch 32 registers and 18 KB of stack; capped at 255 it uses 255 and 5.7 KB
    # (bench/sm90_resources.py)
    gradients_maxnreg: int = 255
    # the forward's matrix stages the gradients kernel reads (the Grams, the triangular inverse, W):
    # recompute them there from the inputs, or reload them (the prepare spills them: C x C rows in
    # fp32, W in the input dtype), so that kernel holds fewer tiles
    gradients_forward: str = "recompute"
    # the values of the gradients kernel's value-block loop that a scan also makes from its
    # carried tile (the delta residual U - W S, its cotangent): recompute them there, or spill
    # them from the scans ([C, V] per chunk in the inputs' dtype) and reload them, so that the
    # gradients kernel no longer recomputes them or what only they read (the query Gram, W, U).
    # spill by default: backward 7.76 -> 7.24 ms bounded, 8.31 -> 7.71 unbounded at B4 T4096 H32
    # on an H100 (bench/results/backward_sweep_scan_values_h100_900b2d5.md)
    scan_values: str = "spill"
    # none: one gradients kernel (a program per chunk and value head, its value-block loop
    # inside); value-blocks: the loop a kernel of its own, a program per chunk, value head and
    # value block, its parts of the loop's sums spilled in fp32 for the gradients kernel, which
    # adds them up and runs the rest (split_value_blocks)
    gradients_split: str = "none"
    # with gradients-split=value-blocks, the value-block kernels' register cap (0: none). Offline
    # for sm_90 (bounded KDA, chunks of 16) ptxas gives them 190 registers without stack at 255;
    # 128 fits two 8-warp programs on an SM for 24 B of stack
    value_blocks_maxnreg: int = 255
    # the gradients kernels' warps (0: twice num-warps). Offline for sm_90 (bench/sm90_resources.py,
    # bounded KDA, chunks of 16) 16 warps hold the kernel in 128 registers (200 B of stack), twice
    # the warps of 8 at 255 registers, one program an SM either way
    gradients_warps: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.gradients_forward not in GRADIENTS_FORWARD:
            raise ValueError(f"{self.name}: gradients-forward must be one of {', '.join(GRADIENTS_FORWARD)}, "
                             f"got {self.gradients_forward!r}")
        if self.state_spill not in ("float32", "input"):
            raise ValueError(f"lower-backward: state-spill must be float32 or input, got {self.state_spill!r}")
        if self.scan_values not in SCAN_VALUES:
            raise ValueError(f"{self.name}: scan-values must be one of {', '.join(SCAN_VALUES)}, got {self.scan_values!r}")
        for option, cap in (("gradients-maxnreg", self.gradients_maxnreg),
                            ("value-blocks-maxnreg", self.value_blocks_maxnreg)):
            if cap and not k3s.MIN_MAXNREG <= cap <= k3s.MAX_MAXNREG:
                raise ValueError(f"{self.name}: {option} must be 0 (no cap) or in {k3s.MIN_MAXNREG}.."
                                 f"{k3s.MAX_MAXNREG}, got {cap}")
        if self.gradients_split not in GRADIENTS_SPLIT:
            raise ValueError(f"{self.name}: gradients-split must be one of {', '.join(GRADIENTS_SPLIT)}, "
                             f"got {self.gradients_split!r}")
        check_power_of_two(self.name, "block-v", self.block_v)
        check_num_warps(self.name, self.num_warps)
        if self.gradients_warps:
            check_num_warps(self.name, self.gradients_warps, "gradients-warps")
        for schedule in [o for o in op.walk() if isinstance(o, k3s.ChunkedBackwardOp)]:
            entry = schedule.parent_op()
            workspaces, kernels = lower_backward(entry.layer(), schedule, entry_values(entry),
                                                 self.block_v, self.num_warps, self.scan_stages, self.state_spill,
                                                 self.gradients_maxnreg, self.gradients_forward,
                                                 self.scan_values == "spill", self.gradients_split,
                                                 self.value_blocks_maxnreg, self.gradients_warps)
            Rewriter.insert_op([*workspaces, *kernels], InsertPoint.before(schedule))
            schedule.detach()
            schedule.erase()
