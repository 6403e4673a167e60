"""fuse-attnres: k3.attnres -> a kernel that scores and mixes each token row in a single read.

The gain is folded into the pseudo-query and the RMS into the score, so the normalised keys
are never materialised; an online softmax over the sources lets each source row be read once
for both its score and its contribution to the mix. The loop over sources is software-pipelined
(num_stages): the next sources' rows are in flight while one is scored, since the score's
reductions over the row would otherwise leave the memory system idle between loads. With
rows-per-program > 1 a second kernel takes a group of rows a program, its (row, source) pairs
walked as one pipelined loop, and serves the calls of at least grouped-from-rows token rows
(k3s.kernel min_rows / max_rows): a short row loop (S = 2) keeps too few loads in flight, while
a call of few rows needs a program per row to fill the GPU.

For training the entry can also return each row's log-sum-exp over its sources (`lse`, fp32, an
optional output: `aggregate(..., output_lse=True)`), from which derive-attnres-backward's kernel
recomputes the softmax weights instead of saving them.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import AttnResOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, make, tensor_arg


def attnres_arg(sym_name: str, shape: tuple[str | int, ...], role: str = "input", dtype: str = "float",
                **values) -> Operation:
    return tensor_arg(sym_name, k3s.tensor(*shape, dtype=dtype), role, **values)


def layer_arguments(op: AttnResOp) -> list[Operation]:
    """What the aggregate reads: the sources [S, B, T, D], the pseudo-query and the gain [D]."""
    D = op.hidden_size.value.data
    return [attnres_arg("sources", ("S", "B", "T", D)), attnres_arg("query", (D,)), attnres_arg("gain", (D,))]


def fold_query(op: AttnResOp, tensors: dict[str, SSAValue]) -> Operation:
    return make(k3s.FoldQueryOp, operands=[tensors["query"], tensors["gain"]], hidden_size=op.hidden_size.value.data,
                result=("q", k3s.tile("D")))


def score_stages(op: AttnResOp, tensors: dict[str, SSAValue], q: SSAValue) -> list[Operation]:
    """A source's row and its score (the RMS folded in): the loop body's first stages, which the
    backward recomputes as they are."""
    x = make(k3s.LoadSourceOp, operands=[tensors["sources"]], result=("x", k3s.tile("D")))
    score = make(k3s.RmsScoreOp, operands=[x.results[0], q], result=("score", k3s.tile()), eps=op.eps.value.data)
    return [x, score]


def loop(loop_type: type[Operation], initial: list[SSAValue], names: tuple[str, ...],
         body: Block, **values) -> Operation:
    """A loop carrying `initial` (their registers: its block arguments' and results' are named
    alike, so the printed kernel keeps each carried value in one register)."""
    looped = make(loop_type, body, operands=initial, results=[(n, v.type) for n, v in zip(names, initial, strict=True)],
                  **values)
    for arg, name in zip(body.args, names, strict=True):
        arg.name_hint = name
    return looped


def aggregate_kernel(op: AttnResOp, tensors: dict[str, SSAValue], num_warps: int, num_stages: int,
                     rows_per_program: int, **rows_bounds) -> k3s.KernelOp:
    """The fused kernel: a program per row (rows_per_program 1), else per group of that many rows
    walked as one loop over (row, source) pairs; rows_bounds: the calls it serves (min_rows,
    max_rows)."""
    fold = fold_query(op, tensors)
    start = make(k3s.SoftmaxStartOp, results=[("max", k3s.tile()), ("sum", k3s.tile()), ("acc", k3s.tile("D"))])
    # the online softmax carried over the sources: running max, normaliser, mix
    body = Block(arg_types=[v.type for v in start.results])
    running_max, normaliser, mix = body.args
    grouped = rows_per_program > 1
    if grouped:  # one loop over the group's (row, source) pairs: restart at each row
        restart = make(k3s.RowStartOp, operands=[running_max], result=("max", running_max.type))
        body.add_op(restart)
        running_max = restart.started_max
    x, score = score_stages(op, tensors, fold.results[0])
    softmax = make(k3s.OnlineSoftmaxOp, operands=[running_max, normaliser, score.results[0]],
                   results=[(name, k3s.tile()) for name in ("max", "sum", "p", "rescale")])
    new_max, new_sum, p, rescale = softmax.results
    mixed = make(k3s.MixAccumulateOp, operands=[mix, rescale, p, x.results[0]], result=("acc", k3s.tile("D")))
    body.add_ops([x, score, softmax, mixed])

    def row_stores(row_max: SSAValue, row_sum: SSAValue, row_mix: SSAValue) -> list[Operation]:
        return [make(k3s.NormalizeStoreOp, operands=[row_mix, row_sum, tensors["out"]]),
                make(k3s.StoreLseOp, operands=[row_max, row_sum, tensors["lse"]])]

    if grouped:
        body.add_op(make(k3s.AtRowEndOp, row_stores(new_max, new_sum, mixed.results[0])))
    body.add_op(make(k3s.NextSourceOp, operands=[new_max, new_sum, mixed.results[0]]))
    if grouped:
        stages = [loop(k3s.RowSourceLoopOp, list(start.results), ("max", "sum", "acc"), body, rows=rows_per_program)]
    else:
        sources = loop(k3s.SourceLoopOp, list(start.results), ("max", "sum", "acc"), body)
        stages = [sources, *row_stores(*sources.results)]
    return make(
        k3s.KernelOp,
        [fold, start, *stages],
        sym_name=f"{op.sym_name.data}_aggregate{'_groups' if grouped else ''}",
        grid=[GridAxis.ROW_GROUP if grouped else GridAxis.ROW],
        num_warps=num_warps,
        num_stages=num_stages,
        **rows_bounds,
    )


def fused_attnres_entry(op: AttnResOp, options: FuseAttnResPass) -> k3s.EntryOp:
    """The aggregate entry: the per-row kernel, the grouped one, or both splitting the calls at
    options.grouped_from_rows token rows."""
    D = op.hidden_size.value.data
    arguments = [*layer_arguments(op), attnres_arg("out", ("B", "T", D), "output"),
                 attnres_arg("lse", ("B", "T"), "optional_output", "float32")]
    tensors = argument_values(arguments)
    rows, split = options.rows_per_program, options.grouped_from_rows

    def kernel(rows_per_program: int, **rows_bounds) -> k3s.KernelOp:
        return aggregate_kernel(op, tensors, options.warps_for(op), options.stages_for(rows_per_program),
                                rows_per_program, **rows_bounds)

    if rows > 1 and split > 1:
        kernels = [kernel(1, max_rows=split - 1), kernel(rows, min_rows=split)]
    else:
        kernels = [kernel(rows)]
    return make(
        k3s.EntryOp,
        [*arguments, *kernels],
        sym_name="aggregate",
        source=SymbolRefAttr(op.sym_name),
        max_sources=op.max_sources,
    )


def warps_holding(values: int, per_warp: int, least: int = 4) -> int:
    """`least` warps while they hold `values` (per_warp each), else the fewest (a power of two, at
    most k3s.MAX_NUM_WARPS) that do."""
    warps = least
    while warps < k3s.MAX_NUM_WARPS and warps * per_warp < values:
        warps *= 2
    return warps


def row_warps(layer: AttnResOp, least: int = 4) -> int:
    """The warps that hold the row, MAX_ROW_PER_WARP columns each (warps_holding); the backend
    refuses a row no count of warps holds."""
    return warps_holding(layer.hidden_size.value.data, k3s.MAX_ROW_PER_WARP, least)


@dataclass(frozen=True)
class FuseAttnResPass(ModulePass):
    """Add an `aggregate` entry (fused score+mix kernel) for every k3.attnres."""

    name = "fuse-attnres"
    # a program's group of rows walks its (row, source) pairs as one pipelined loop, so the next
    # row's sources load while a row is scored and stored (a row's own loop of S = 2 sources is
    # too short to keep loads in flight); 1: a program per row. Loads run num_stages - 1 pairs
    # ahead; 0: by the form (stages_for). On the H200 at D = 7168, N = 8192 rows, S = 2 / 5 / 9
    # sources, 8 rows and 4 stages read at 87% / 91% / 93% of the copy bandwidth; a program per row
    # at 74% / 83% / 89% with 3 stages, 69% / 82% / 92% with 4; 16 and 32 rows tie 8
    # (bench/results/attnres_rows_per_program_ab_h200_3e6f573.md).
    rows_per_program: int = 8
    num_stages: int = 0
    # calls of fewer token rows launch a program per row instead (a second kernel of the entry):
    # groups of 8 at 256-1024 rows left too few programs, and were 1.0-2.6x slower than a
    # program per row; from 2048 rows they are level or ahead
    # (bench/results/attnres_groups_by_rows_ab_h200_4e80a9c.md); 0: groups at every call
    grouped_from_rows: int = 2048
    # num_warps 0: by the row, 4 warps while they hold it in registers, else the fewest that do
    num_warps: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.num_warps:
            check_num_warps(self.name, self.num_warps)
        if self.num_stages < 0:
            raise ValueError(f"{self.name}: num-stages must be >= 1 (0: by rows-per-program), got {self.num_stages}")
        if self.rows_per_program < 1:
            raise ValueError(f"{self.name}: rows-per-program must be >= 1, got {self.rows_per_program}")
        if self.grouped_from_rows < 0:
            raise ValueError(f"{self.name}: grouped-from-rows must be >= 0 (0: always grouped), "
                             f"got {self.grouped_from_rows}")
        add_entries(op, AttnResOp, lambda layer: fused_attnres_entry(layer, self))

    def stages_for(self, rows_per_program: int) -> int:
        """The option, or 3 for a program per row (S sources to overlap), 4 for a group of rows."""
        return self.num_stages or (3 if rows_per_program == 1 else 4)

    def warps_for(self, layer: AttnResOp) -> int:
        """The option, or row_warps(layer)."""
        return self.num_warps or row_warps(layer)
