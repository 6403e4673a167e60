"""fuse-attnres: k3.attnres -> one kernel over groups of token rows that scores and mixes in a single read.

The gain is folded into the pseudo-query and the RMS into the score, so the normalised keys
are never materialised; an online softmax over the sources lets each source row be read once
for both its score and its contribution to the mix. The loop over sources is software-pipelined
(num_stages): the next sources' rows are in flight while one is scored, since the score's
reductions over the row would otherwise leave the memory system idle between loads.

For training the entry can also return each row's log-sum-exp over its sources (`lse`, fp32, an
optional output: `aggregate(..., output_lse=True)`), from which derive-attnres-backward's kernel
recomputes the softmax weights instead of saving them.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from k3compile.ir import k3s
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


def fused_attnres_entry(op: AttnResOp, num_warps: int, num_stages: int, rows_per_program: int,
                        min_programs: int = 0) -> k3s.EntryOp:
    D = op.hidden_size.value.data
    arguments = [*layer_arguments(op), attnres_arg("out", ("B", "T", D), "output"),
                 attnres_arg("lse", ("B", "T"), "optional_output", "float32")]
    tensors = argument_values(arguments)
    fold = fold_query(op, tensors)
    start = make(k3s.SoftmaxStartOp, results=[("max", k3s.tile()), ("sum", k3s.tile()), ("acc", k3s.tile("D"))])
    # the online softmax carried over the sources: running max, normaliser, mix
    body = Block(arg_types=[v.type for v in start.results])
    running_max, normaliser, mix = body.args
    if rows_per_program > 1:  # one loop over the group's (row, source) pairs: restart at each row
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

    if rows_per_program > 1:
        body.add_op(make(k3s.AtRowEndOp, row_stores(new_max, new_sum, mixed.results[0])))
    body.add_op(make(k3s.NextSourceOp, operands=[new_max, new_sum, mixed.results[0]]))
    if rows_per_program > 1:
        stages = [loop(k3s.RowSourceLoopOp, list(start.results), ("max", "sum", "acc"), body, rows=rows_per_program)]
    else:
        sources = loop(k3s.SourceLoopOp, list(start.results), ("max", "sum", "acc"), body)
        stages = [sources, *row_stores(*sources.results)]
    kernel = make(
        k3s.KernelOp,
        [fold, start, *stages],
        sym_name=f"{op.sym_name.data}_aggregate",
        grid="row_group" if rows_per_program > 1 else "row",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return make(
        k3s.EntryOp,
        [*arguments, kernel, *smaller_groups(kernel.sym_name.data, rows_per_program, min_programs)],
        sym_name="aggregate",
        source=op.sym_name.data,
        max_sources=op.max_sources,
    )


def smaller_groups(kernel: str, rows_per_program: int, min_programs: int) -> list[Operation]:
    """k3s.launch_by_rows ops that give a call of few rows groups of fewer rows (powers of two, down
    to one): each group size serves the calls of too few rows to fill min_programs groups of the
    next larger size; 0: none (every call takes rows_per_program)."""
    if not min_programs:
        return []
    sizes = [1 << i for i in range(rows_per_program.bit_length()) if 1 << i < rows_per_program] + [rows_per_program]
    return [make(k3s.LaunchByRowsOp, kernel=kernel, max_rows=larger * min_programs - 1, block_r=size)
            for size, larger in zip(sizes, sizes[1:])]


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
    # a call of fewer rows takes smaller groups (k3s.launch_by_rows), so that its grid keeps
    # min_programs programs while it can: groups of 8 left 1024 at the measured N = 8192, where a
    # program per row of a call of a few hundred rows (decode) would have 8x the programs; 0: off
    min_programs: int = 1024
    # num_warps 0: by the row, 4 warps while they hold it in registers, else the fewest that do
    num_warps: int = 0

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.num_warps:
            check_num_warps(self.name, self.num_warps)
        if self.num_stages < 0:
            raise ValueError(f"{self.name}: num-stages must be >= 1 (0: by rows-per-program), got {self.num_stages}")
        if self.rows_per_program < 1:
            raise ValueError(f"{self.name}: rows-per-program must be >= 1, got {self.rows_per_program}")
        if self.min_programs < 0:
            raise ValueError(f"{self.name}: min-programs must be >= 0 (0: off), got {self.min_programs}")
        add_entries(op, AttnResOp, lambda layer: fused_attnres_entry(
            layer, self.warps_for(layer), self.stages_for(self.rows_per_program), self.rows_per_program,
            self.min_programs))

    def stages_for(self, rows_per_program: int) -> int:
        """The option, or 3 for a program per row (S sources to overlap), 4 for a group of rows."""
        return self.num_stages or (3 if rows_per_program == 1 else 4)

    def warps_for(self, layer: AttnResOp) -> int:
        """The option, or row_warps(layer)."""
        return self.num_warps or row_warps(layer)
