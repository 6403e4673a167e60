"""lower-to-triton: how the Triton backend runs each stage, written on the stages as typed
properties before printing (legalize-triton beside it fixes the block sizes), so that the
printer reads these choices off the IR rather than making them:

- a kernel's products: `k3s.kernel <dots = input>` (the precision of the input dtype, chosen at
  launch by the runtime prelude's _DOT_OF_DTYPE) on a kernel with matrix products whose pass
  chose none;
- the triangular inverse's products at least tf32 (`accurate`: an fp32 intermediate whose error
  the later products multiply) and its number of squarings;
- the dtype a load keeps its rows in: fp32 for one token's row and for rows it normalises, the
  input dtype for a chunk's rows (half the registers of fp32 for bf16 inputs; stages upcast);
- the loops over value blocks unrolled (ptxas spills a dynamic loop that large);
- a channel-gated Gram's loop over the blocks below the diagonal unrolled (NB - 1 steps, NB =
  C / sub_chunk: a few), and its elementwise diagonal's rows reloaded from memory (key rows and
  log-decays, cache-resident: cheaper than picking a row out of the [NB, SUB, BK] tiles);
- the layout of the workspace a stage stores its tiles in or loads them from (`k3s.spill %KG,
  %KG_1 <layout = #k3s.layout<token[T], head[HV], column[K]>>`), read off the workspace's shape
  and the tile; every stage that reaches one tensor of an entry agrees (check_workspace_layouts);
  likewise where a stage's rows are in an entry's tensor of token rows (the loads of q, k, v, g
  and beta, the output's stores, the gradients'), the query and key heads' for q and k;
- an entry's host sizes, the shape symbols it computes before it allocates (NC, PB, PP, HS), as
  index arithmetic or a size by the call's rows, ending in `k3s.bind_size` (host_sizes);
- the dtype of each float tensor an entry allocates: its first tensor argument's (`dtype_of = @q`);
- what each kernel's launch passes besides its arguments (`launch_params = [chunk_table, T,
  checkpoints]`: the chunk axis's table, the run-time sizes, the checkpoints), and the value each
  entry passes for a run-time size (`k3s.launch_size %R <size = R>`, R = B x T where the entry
  has [B, T, ..] tensors; launch_sizes);
- the query and key heads a kernel with a head grid axis groups its value heads by (`key_heads =
  16`): the layer's where it reads q or k rows, else its value heads (a commit reads none);
- where a checkpoint's state goes (`k3s.store_checkpoint %S <layout = kv, address =
  #k3s.layout<checkpoint[NCK], head[HV], column[K], column[V]>>`): its slot's row, its value
  head, the state's columns in its layout.

Each op type's parts are functions registered with @choices_of. An op that already has a
property keeps it: a pass that chose knows better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects.builtin import ArrayAttr, BoolAttr, FlatSymbolRefAttr, IndexType, IntegerAttr, ModuleOp, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass

from k3compile.backends.triton.printer.common import chunk_rows
from k3compile.ir import k3s
from k3compile.ir.choices import Gate

# the stages whose Triton code multiplies matrices (the runtime prelude's _mm, at the kernel's
# DOT), each with the test of those that do where not all do: the chunkwise and adjoint products,
# the router's logits and the experts' projections, but a projection of one (token, slot) pair's
# row, a vector product (tl.sum); a kernel without any (a chunk prepare that only gates and
# spills, gla's) takes no DOT
PRODUCT_STAGES: dict[type[Operation], Callable[[Operation], bool] | None] = {
    k3s.GramOp: None, k3s.BlockRescaleOp: None, k3s.UnitLowerInverseOp: None, k3s.ForwardSubstitutionOp: None,
    k3s.WYApplyOp: None, k3s.DeltaResidualOp: None, k3s.ChunkOutputOp: None, k3s.StateAdvanceOp: None,
    k3s.DotOp: None, k3s.GatedContractionOp: None, k3s.RouterLogitsOp: None,
    k3s.ProjectOp: lambda op: op.rows.data != k3s.Rows.PAIR, k3s.ProjectInputGradOp: None,
    k3s.ProjectWeightGradOp: None}


def multiplies(op: Operation) -> bool:
    """Whether op's Triton code multiplies matrices at its kernel's DOT (PRODUCT_STAGES)."""
    test = PRODUCT_STAGES.get(type(op), False)
    return test is None or (test is not False and test(op))

TRUE = BoolAttr.from_bool(True)
RELOAD_ROWS = k3s.DiagonalRowsAttr(k3s.DiagonalRows.RELOAD)
IN_FP32, IN_INPUT_DTYPE = k3s.RegisterDtypeAttr(k3s.RegisterDtype.FP32), k3s.RegisterDtypeAttr(k3s.RegisterDtype.INPUT)

# --- each op's choices: one function per op type (as legalize-triton's @block_sizes_of) ---------
STAGE_CHOICES: dict[type[Operation], list[Callable[[Operation, k3s.KernelOp], dict[str, Attribute]]]] = {}


def choices_of(*op_types: type[Operation]) -> Callable:
    """Register f(op, kernel) -> the properties lower-to-triton writes on op, a stage of kernel (an
    op type may have several, each its own properties)."""
    def register(function: Callable) -> Callable:
        for op_type in op_types:
            STAGE_CHOICES.setdefault(op_type, []).append(function)
        return function

    return register


@choices_of(k3s.ForwardSubstitutionOp, k3s.UnitLowerInverseOp)
def inverse_choices(op: k3s.ForwardSubstitutionOp | k3s.UnitLowerInverseOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Products at least tf32, and the (I + M^(2^i)) factors after (I - M) that make (I + M)^-1
    exact: M^blocks = 0 for the blocks of op.block rows of the kernel's chunk, so log2(blocks) - 1
    of them (none for one or two blocks)."""
    squarings = max((chunk_rows(op) // op.block.value.data).bit_length() - 2, 0)
    return dict(accurate=TRUE, squarings=IntegerAttr(squarings, i64))


@choices_of(k3s.LoadTokenOp)
def load_token_choices(op: k3s.LoadTokenOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    return dict(dtype=IN_FP32)


@choices_of(k3s.LoadChunkOp)
def load_chunk_choices(op: k3s.LoadChunkOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    return dict(dtype=IN_FP32 if k3s.normalises(op) else IN_INPUT_DTYPE)


@choices_of(k3s.ValueBlockLoopOp, k3s.SumValueBlockPartsOp)
def value_blocks_choices(op: Operation, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Unrolled, where there is a loop: one block a program (a value_block grid axis) has none."""
    looped = isinstance(op, k3s.SumValueBlockPartsOp) or k3s.GridAxis.VALUE_BLOCK not in kernel.axes
    return dict(unroll=TRUE) if looped else {}


@choices_of(k3s.GramOp)
def gram_choices(op: k3s.GramOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """A channel gate's block loop unrolled; an elementwise (or guarded) diagonal's rows reloaded."""
    if op.gate.data != Gate.CHANNEL:
        return {}
    choices: dict[str, Attribute] = dict(unroll=TRUE)
    if op.diagonal.data.reloads:
        choices["diagonal_rows"] = RELOAD_ROWS
    return choices


# the stages that read or write an entry's tensor of token rows [B, T, heads, ...] (q, k, v, g,
# beta, o and their gradients): the operand or result that is their tile
TOKEN_ROW_STAGES = {k3s.LoadTokenOp: "row", k3s.LoadChunkOp: "rows", k3s.LoadGateOp: "log_gate",
                    k3s.LoadBetaOp: "beta", k3s.ReadoutOp: "output", k3s.ChunkOutputOp: "output",
                    k3s.StoreCotangentOp: "cotangent"}


@choices_of(*TOKEN_ROW_STAGES)
def token_rows_choices(op: Operation, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Where op's rows are in its tensor: a row per token, then its head (the query and key head
    of q and k, else the value head), then the columns of op's tile after its chunk's rows."""
    tile = k3s.tile_dims(getattr(op, TOKEN_ROW_STAGES[type(op)]))
    keys = op.of.data in ("q", "k") if isinstance(op, k3s.StoreCotangentOp) else \
        isinstance(op, (k3s.LoadTokenOp, k3s.LoadChunkOp)) and not k3s.loads_values(op)
    heads = ("key_head", "H") if keys else ("head", "HV")
    columns = tile[1:] if tile[:1] == ("C",) else tile
    return dict(layout=k3s.TensorLayoutAttr.of(("token", "T"), heads, *[("column", d) for d in columns]))


@choices_of(k3s.StoreCheckpointOp)
def checkpoint_choices(op: k3s.StoreCheckpointOp, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Where the state goes in the checkpoints: its slot's row, its value head, then the state's
    columns in its layout (the state's own addressing, as its initial and final states have it)."""
    return dict(address=k3s.checkpoint_address(op.layout.data, k3s.tile_dims(op.state)))


# the stages that store tiles in a workspace or load them from it: (the operand or result that
# is their tile, whether the workspace holds value blocks' parts)
WORKSPACE_STAGES = {k3s.SpillOp: ("tile", False), k3s.ReloadOp: ("tile", False), k3s.RecordCheckOp: (None, False),
                    k3s.RecordedCheckOp: (None, False), k3s.SpillValueBlockPartOp: ("part", True),
                    k3s.SumValueBlockPartsOp: ("total", True)}
LAYOUT_COLUMNS = ("K", "V", "C")


@choices_of(*WORKSPACE_STAGES)
def workspace_choices(op: Operation, kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """Where op's rows are in its workspace: [B, T, HV, ...] a row per token (the tile's C rows),
    else [NC, HV, ...] a row per chunk; then, for value blocks' parts, the NVB blocks; then the
    tile's other dimensions (row-major)."""
    workspace, (tile_name, parts) = op.workspace.type, WORKSPACE_STAGES[type(op)]
    tile = k3s.tile_dims(getattr(op, tile_name)) if tile_name else ()
    per_token = workspace.dims[:2] == ("B", "T")
    rows = [("token", "T") if per_token else ("chunk", "NC"), ("head", "HV")]
    if per_token and tile[:1] != ("C",):
        raise ValueError(f"{op.name}: no layout for a per-token workspace <{workspace.pattern}> of a "
                         f"{k3s.dims_text(tile)} tile: its first dimension is the chunk's C rows")
    columns = tile[1:] if per_token else tile
    if parts:
        rows.append(("part", blocks := k3s.value_block_parts_layout(workspace, tile)))
        if isinstance(op, k3s.SpillValueBlockPartOp):  # as many slots as the programs' blocks
            chunk = next(o for o in kernel.body.ops if isinstance(o, k3s.ChunkTileOp))
            V, BV = chunk.head_v_dim.value.data, kernel.block_v.value.data
            if blocks != -(-V // BV):
                raise ValueError(f"{k3s.argument_name(op.workspace)} holds the parts of {blocks} value blocks, but "
                                 f"kernel @{kernel.sym_name.data} runs {-(-V // BV)} (V = {V}, BV = {BV})")
        if len(columns) > 1:
            raise ValueError(f"{op.name}: no layout for the value-block parts <{workspace.pattern}>: a [C], [C, K], "
                             f"[C, C], [K] or scalar tile, got {k3s.dims_text(tile)}")
    if unknown := [d for d in columns if d not in LAYOUT_COLUMNS]:
        raise ValueError(f"{op.name}: no layout for the workspace <{workspace.pattern}>: its tiles' columns are K, "
                         f"V or C, got {unknown[0]}")
    return dict(layout=k3s.TensorLayoutAttr.of(*rows, *[("column", d) for d in columns]))


def check_workspace_layouts(module: ModuleOp) -> None:
    """Every stage that reaches one tensor of an entry (through the kernels' launches) reads it in
    one layout: a ValueError naming the tensor where two disagree."""
    kernels = {op.sym_name.data: op for op in module.walk() if isinstance(op, k3s.KernelOp)}
    layouts: dict[SSAValue, tuple[Operation, k3s.TensorLayoutAttr]] = {}
    for launch in [op for op in module.walk() if isinstance(op, k3s.LaunchOp)]:
        kernel = kernels[launch.kernel.root_reference.data]
        for passed, argument in zip(launch.operands, kernel.body.block.args, strict=False):
            for use in argument.uses:
                if type(stage := use.operation) in WORKSPACE_STAGES and stage.layout is not None:
                    first, layout = layouts.setdefault(passed, (stage, stage.layout))
                    if layout != stage.layout:
                        raise ValueError(f"{k3s.argument_name(passed)}: {first.name} reads it as {layout}, "
                                         f"{stage.name} as {stage.layout}")


# --- an entry's host sizes: the shape symbols it computes before it allocates ---------------
ARGUMENT_OPS = (k3s.TensorArgOp, k3s.ScalarArgOp, k3s.CheckpointArgOp, k3s.AbsentTensorOp)


class HostSizes:
    """Builds an entry's k3s.size / arith / k3s.bind_size ops, in order."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def add(self, op: Operation, name: str | None = None) -> SSAValue:
        self.ops.append(op)
        if op.results and name is not None:
            op.results[0].name_hint = name
        return op.results[0] if op.results else None

    def size(self, symbol: str) -> SSAValue:
        return self.add(k3s.SizeOp.create(properties=dict(symbol=k3s.ShapeSymbolAttr(k3s.ShapeSymbol(symbol))),
                                          result_types=[IndexType()]), symbol)

    def const(self, value: int) -> SSAValue:
        return self.add(arith.ConstantOp.from_int_and_width(value, IndexType()), f"c{value}")

    def bind(self, symbol: str, value: SSAValue) -> None:
        self.add(k3s.BindSizeOp.create(operands=[value],
                                       properties=dict(symbol=k3s.ShapeSymbolAttr(k3s.ShapeSymbol(symbol)))))


def host_sizes(entry: k3s.EntryOp) -> list[Operation]:
    """The sizes entry computes: NC = cdiv(B T, C) + N per-chunk slots (chunk (sequence n, first
    token s) uses slot s // C + n, unique and below that bound for any split into sequences); an
    MoE dispatch plan's PB = cdiv(R k, BM) + min(R k, E) blocks (each expert's run of pairs padded
    to whole blocks of BM rows: at most one partial block per expert with pairs) and PP = PB BM."""
    sizes, ops = HostSizes(), list(k3s.walk_entry(entry))
    if any("NC" in op.type.dims for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)):
        chunk = next(op.chunk_size.value.data for op in ops if isinstance(op, k3s.ChunkTileOp))
        rows = sizes.add(arith.MuliOp(sizes.size("B"), sizes.size("T")))
        chunks = sizes.add(arith.CeilDivSIOp(rows, sizes.const(chunk)))
        sizes.bind("NC", sizes.add(arith.AddiOp(chunks, sizes.size("N")), "NC"))
    if (sort := next((op for op in ops if isinstance(op, k3s.SortPairsOp)), None)) is not None:
        k, BM = sort.top_k.value.data, sort.block_rows.value.data
        E = next(op.num_experts.value.data for op in ops if isinstance(op, (k3s.CountPairsOp, k3s.RankPairsOp)))
        pairs, block_rows = sizes.add(arith.MuliOp(sizes.size("R"), sizes.const(k)), "pairs"), sizes.const(BM)
        blocks = sizes.add(arith.CeilDivSIOp(pairs, block_rows))
        sizes.bind("PB", sizes.add(arith.AddiOp(blocks, sizes.add(arith.MinSIOp(pairs, sizes.const(E)))), "PB"))
        sizes.bind("PP", sizes.add(arith.MuliOp(sizes.size("PB"), block_rows), "PP"))
    if any("HS" in op.type.dims for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)):
        sizes.bind("HS", sizes.add(hidden_slices(entry), "HS"))
    return sizes.ops


def hidden_slices(entry: k3s.EntryOp) -> k3s.SizeByRowsOp:
    """HS, the hidden slices of the entry's router kernel at the call's rows: those of the first of
    its k3s.launch_by_rows ops that holds R, else its own; a case with the slices of the next (or
    the kernel's own, after the last) is left out: it changes nothing."""
    kernel = next(k for k in k3s.entry_kernels(entry) if k3s.GridAxis.HIDDEN_SLICE in k.axes)
    own = kernel.hidden_slices.value.data
    cases = [(op.max_rows.value.data, own if op.hidden_slices is None else op.hidden_slices.value.data)
             for op in k3s.launch_by_rows_ops(entry, kernel)]
    cases = [(most, count) for (most, count), after in zip(cases, [*cases[1:], (None, own)]) if count != after[1]]
    integers = lambda values: ArrayAttr([IntegerAttr(v, i64) for v in values])  # noqa: E731
    return k3s.SizeByRowsOp.create(properties=dict(max_rows=integers(m for m, _ in cases),
                                                   sizes=integers(c for _, c in cases), otherwise=IntegerAttr(own, i64)),
                                   result_types=[IndexType()])


def launch_sizes(entry: k3s.EntryOp) -> list[Operation]:
    """The values entry's launches pass for the run-time sizes its kernels take (their
    launch_params), each a k3s.launch_size: the shape symbol of that name, but the token rows R
    are B x T where no tensor of the entry has R rows, and NSLOTS is the state pool's rows P."""
    taken = {p.data for kernel in k3s.entry_kernels(entry) for p in kernel.launch_params or ()}
    tokens = not any("R" in op.type.dims for op in entry.body.ops if isinstance(op, k3s.TensorArgOp))
    sizes = HostSizes()
    for size in [s for s in k3s.RUNTIME_SIZES if s in taken]:
        if size == "R" and tokens:
            value = sizes.add(arith.MuliOp(sizes.size("B"), sizes.size("T")))
        else:
            value = sizes.size("P" if size == "NSLOTS" else size)
        param = k3s.LaunchParamAttr(k3s.LaunchParam(size))
        sizes.add(k3s.LaunchSizeOp.create(operands=[value], properties=dict(size=param)))
    return sizes.ops


def write_host_sizes(entry: k3s.EntryOp) -> None:
    """host_sizes(entry), then launch_sizes(entry), after its arguments, unless the entry has them
    already."""
    written = (k3s.BindSizeOp, k3s.LaunchSizeOp)
    if any(isinstance(op, written) for op in entry.body.ops) or not (ops := host_sizes(entry) + launch_sizes(entry)):
        return
    block = entry.body.block
    first = next((op for op in block.ops if not isinstance(op, ARGUMENT_OPS)), None)
    if first is None:
        block.add_ops(ops)
    else:
        block.insert_ops_before(ops, first)


def write_allocated_dtypes(entry: k3s.EntryOp) -> None:
    """The float tensors the entry allocates (outputs, workspaces) take the dtype of its first
    tensor argument (the call's q, x, ...: `dtype_of = @q`), unless a pass chose another."""
    tensors = [op for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)]
    for arg in tensors:
        if arg.role.data in ("output", "optional_output", "workspace") and arg.type.dtype_class == "float":
            write_choices(arg, dict(dtype_of=FlatSymbolRefAttr(tensors[0].sym_name.data)))


HEAD_AXES = (k3s.GridAxis.SEQUENCE_HEAD, k3s.GridAxis.VALUE_HEAD)


def key_heads_choices(kernel: k3s.KernelOp) -> dict[str, Attribute]:
    """A kernel with a head grid axis groups its value heads by the layer's query and key heads
    where a stage reads q or k rows (a key_head layout, written before this), else by its value
    heads: a kernel that reads no key rows (the commit) has no key heads, each value head stands
    alone (H = HV)."""
    if not any(axis in HEAD_AXES for axis in kernel.axes):
        return {}
    layer = k3s.launching_entry(kernel).layer()
    reads_keys = any(isinstance(layout := op.properties.get("layout"), k3s.TensorLayoutAttr)
                     and k3s.LayoutAxis.KEY_HEAD in layout.axes_words() for op in kernel.walk())
    heads = layer.num_heads if reads_keys else layer.num_v_heads
    return dict(key_heads=IntegerAttr(heads.value.data, i64))


def write_choices(op: Operation, choices: dict[str, Attribute]) -> None:
    """choices as op's properties, those it has kept."""
    op.properties.update({key: value for key, value in choices.items() if key not in op.properties})


@dataclass(frozen=True)
class LowerToTritonPass(ModulePass):
    """Write how the Triton backend runs each kernel and stage on them (the module docstring)."""

    name = "lower-to-triton"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            has_products = False
            for stage in kernel.walk():
                has_products = has_products or multiplies(stage)
                for of_op in STAGE_CHOICES.get(type(stage), ()):
                    write_choices(stage, of_op(stage, kernel))
            if has_products:  # the products' precision: the input dtype's, where no pass chose
                write_choices(kernel, dict(dots=k3s.KernelDotsAttr(k3s.KernelDots.INPUT)))
            taken = ArrayAttr([k3s.LaunchParamAttr(p) for p in k3s.launch_params(kernel)])
            write_choices(kernel, dict(launch_params=taken))
            write_choices(kernel, key_heads_choices(kernel))
        check_workspace_layouts(op)
        for entry in [o for o in op.ops if isinstance(o, k3s.EntryOp)]:
            write_host_sizes(entry)
            write_allocated_dtypes(entry)
