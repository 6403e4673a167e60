"""legalize-triton: what the Triton backend decides about a scheduled module, fixed in the IR
before it is printed, so that the printer only prints.

- The kernels can hold their layer (backends/triton/limits.py: tile sizes, chunk and row-block
  divisibility, grid axes); otherwise an UnsupportedError names the spec key and the limit.
- Every kernel's tile block sizes: key columns whole (next power of two of K), value columns a
  state tile's block (at most its block_v) or, in a chunk kernel, whole (its value-block loop's
  block where it has one); AttnRes rows whole;
  the MoE router's blocks of token rows, experts and hidden columns and its slices of the
  hidden columns (logits kernel) and of rows, experts (whole) and top-k slots (top-k kernel);
  the MoE experts' blocks of pairs, token rows, output and input columns; a Block AttnRes
  row's representatives whole; its queries in the block its fold names, or all the call's
  (`#k3s.runtime_block<Q>`, at least 16 where tl.dot takes them).
- The MoE router's block sizes and hidden slices for calls of fewer token rows
  (k3s.launch_by_rows after its kernels): the row count is known only at launch, and a few rows
  want other tiles than many.

Each op type's part of these is one function, registered with @block_sizes_of (and
@sizes_by_rows_of for the sizes by rows) below the tables; an op whose block sizes the pass that
builds it fixes says which pass (block_sizes_fixed_by). tests/test_op_interfaces.py checks that
every op whose kernel constants read a block size is one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.backends.triton.limits import ROUTER_ROWS, check_limits
from k3compile.backends.triton.printer.common import next_power_of_2
from k3compile.ir import k3s
from k3compile.passes.common import make, props

# The MoE router's block sizes by the token rows R of a call: (at most R, BR, BE, BD, HS) of
# the logits kernel and (at most R, BR) of the top-k kernel, the last row of each (None: any R)
# the kernel's own. Few rows make few row blocks, so the logits kernel takes narrow expert
# blocks (16, tl.dot's least) and slices the hidden columns (HS) to spread the router weight
# over many programs: K3's 896 experts make only 56 expert blocks, of the H200's 132 SMs, each
# streaming 16 x 7168 weights through a 28-step loop (latency-bound: 77 us at R = 1 against a
# 3.1 us bytes floor); 8 slices make 448 programs of 7 steps of 128 columns at R <= 16, 4
# slices 448 to 1792 programs of 7 steps of 256 at R <= 128. More rows make programs enough
# without slices and take larger GEMM tiles, which read each byte of x and of the weight fewer
# times (the largest, fp32: 192 KB of shared memory at Triton's 3 pipeline stages): at K3's
# dims the least R of each later row launches 119 to 140 programs, the most R of each 448.
# Not measured yet, the slices least of all (bench/moe_route_gpu.py).
ROUTER_LOGIT_TILES = ((16, 16, 16, 128, 8), (128, 16, 16, 256, 4), (512, 32, 32, 128, 1), (2048, 64, 64, 64, 1),
                      (None, 128, 128, 64, 1))
# a top-k program runs top_k rounds of an argmax over its rows' padded experts: one row per
# program while rows are few (short rounds, a program per row), up to ROUTER_ROWS for many
ROUTER_TOP_K_ROWS = ((256, 1), (1024, 4), (None, ROUTER_ROWS))


PAIRS_PER_PROGRAM = 256  # the dispatch plan's count and sort kernels
# The MoE experts' projections: (at most R token rows, None: any; block sizes and warps), the
# last row the kernel's own. A dense projection (token rows x a weight) of few rows is a stream
# of its weight: narrow column blocks spread it over more programs (K3's latent up-projection,
# 7168 columns: 224 programs at BN 32); many rows take GEMM tiles (8 warps: two 128 x 128 fp32
# accumulators of a GLU would not fit 4). The expert-centric kernels' rows are the dispatch
# plan's blocks, their columns GEMM-wide; the token-centric ones multiply one row: a [BN, BD]
# weight tile per step (MXFP4's dequantisation wants wider columns, bf16 longer rows), the down
# projection's BN narrowed for few tokens (K3: 896 programs at one token). The sizes at few rows
# are the best of bench/moe_tiles_gpu.py's candidates at K3's dims on an H200 at one token
# (bench/results/moe_tiles_h200.md); every block_d is a multiple of 32 (MXFP4's scale blocks).
DENSE_PROJECTION_TILES = ((16, dict(block_r=16, block_n=32, block_d=128, num_warps=4)),
                          (64, dict(block_r=64, block_n=64, block_d=64, num_warps=4)),
                          (None, dict(block_r=128, block_n=128, block_d=64, num_warps=8)))
SORTED_PROJECTION_TILE = dict(block_n=128, block_d=64, num_warps=8)
PAIR_PROJECTION_TILE = {"bf16": dict(block_n=32, block_d=256), "mxfp4": dict(block_n=128, block_d=64)}
SLOT_PROJECTION_TILES = ((2, dict(block_n=4, block_d=512)), (8, dict(block_n=16, block_d=256)),
                         (32, dict(block_n=32, block_d=128)), (None, dict(block_n=64, block_d=128)))
GEMM_STAGES = 3  # software pipelining of the tl.dot projections' loads


# --- each op's part of its kernel's block sizes ----------------------------------------------
# An op interface that this backend keeps, one function per op type (as k3compile/checking/exact.py's @semantics
# keeps each op's exact meaning): the tables above are Triton's, so the IR's op classes do not
# carry them. legalize-triton asks a kernel's ops in program order, each given the sizes its
# kernel's earlier ops fixed; a later op's sizes replace an earlier's.

Rows = list[tuple[int | None, dict[str, int]]]
BLOCK_SIZES: dict[type[Operation], Callable[[Operation, dict[str, int]], dict[str, int]]] = {}
SIZES_BY_ROWS: dict[type[Operation], Callable[[Operation], Rows | None]] = {}
FIXED_BY_PASS: dict[type[Operation], str] = {}


def block_sizes_of(*op_types: type[Operation]) -> Callable:
    """Register f(op, sizes) -> the block sizes op fixes of its kernel (`sizes`: those of the
    kernel's ops before it)."""
    def register(function: Callable) -> Callable:
        BLOCK_SIZES.update(dict.fromkeys(op_types, function))
        return function

    return register


def sizes_by_rows_of(*op_types: type[Operation]) -> Callable:
    """Register f(op) -> (at most this many token rows, None for any; block sizes and warps) of
    the launches of op's kernel, the last row the kernel's own (launches_by_rows below); None: op
    has none."""
    def register(function: Callable) -> Callable:
        SIZES_BY_ROWS.update(dict.fromkeys(op_types, function))
        return function

    return register


def block_sizes_fixed_by(pass_name: str, *op_types: type[Operation]) -> None:
    """Op types whose kernels' block sizes the pass that builds them fixes: legalize-triton adds
    none (an op implements the interface either way: tests/test_op_interfaces.py)."""
    FIXED_BY_PASS.update(dict.fromkeys(op_types, pass_name))
    BLOCK_SIZES.update(dict.fromkeys(op_types, lambda op, sizes: {}))


@block_sizes_of(k3s.StateTileOp)
def state_tile_blocks(op: k3s.StateTileOp, sizes: dict[str, int]) -> dict[str, int]:
    """Key columns whole; value columns a block of at most the tile's block_v."""
    return dict(block_k=next_power_of_2(op.head_k_dim.value.data),
                block_v=min(next_power_of_2(op.head_v_dim.value.data), op.block_v.value.data))


@block_sizes_of(k3s.ChunkTileOp)
def chunk_tile_blocks(op: k3s.ChunkTileOp, sizes: dict[str, int]) -> dict[str, int]:
    """A whole chunk, all key and value columns."""
    return dict(block_k=next_power_of_2(op.head_k_dim.value.data), block_v=next_power_of_2(op.head_v_dim.value.data))


@block_sizes_of(k3s.ValueBlockLoopOp)
def value_block_loop_blocks(op: k3s.ValueBlockLoopOp, sizes: dict[str, int]) -> dict[str, int]:
    """After the kernel's chunk tile: its value columns in blocks of at most the loop's."""
    return dict(block_v=min(sizes["block_v"], op.block_v.value.data))


@block_sizes_of(k3s.ColumnLoopOp)
def column_loop_blocks(op: k3s.ColumnLoopOp, sizes: dict[str, int]) -> dict[str, int]:
    """A row's columns in blocks (before the fold it holds)."""
    return dict(block_d=op.columns.value.data)


@block_sizes_of(k3s.FoldQueryOp)
def fold_query_blocks(op: k3s.FoldQueryOp, sizes: dict[str, int]) -> dict[str, int]:
    """A row's columns whole; a Block AttnRes block's queries in blocks of the fold's `queries`."""
    blocks = dict(block_d=next_power_of_2(op.hidden_size.value.data))
    if op.queries is not None:
        blocks["block_q"] = op.queries.value.data
    return blocks


@block_sizes_of(k3s.LoadFoldedQueriesOp, k3s.LoadGroupRowsOp)
def load_folded_queries_blocks(op: k3s.LoadFoldedQueriesOp | k3s.LoadGroupRowsOp,
                               sizes: dict[str, int]) -> dict[str, k3s.RuntimeBlockAttr]:
    """All the call's queries in one block, at least 16 (the rows of tl.dot's operands)."""
    return dict(block_q=k3s.RuntimeBlockAttr.of("Q", least=16))


@block_sizes_of(k3s.GroupQueryCotangentOp)
def group_query_cotangent_blocks(op: k3s.GroupQueryCotangentOp, sizes: dict[str, int]) -> dict[str, object]:
    """The op's block of columns and part of the rows; all the call's queries in one block, at
    least 16 (the rows of tl.dot's operands)."""
    return dict(block_d=op.columns.value.data, block_r=op.rows.value.data,
                block_q=k3s.RuntimeBlockAttr.of("Q", least=16))


@block_sizes_of(k3s.LoadGroupSourcesOp)
def source_blocks(op: k3s.LoadGroupSourcesOp, sizes: dict[str, int]) -> dict[str, int]:
    """All of a row's representatives."""
    return dict(block_s=next_power_of_2(op.sources.value.data))


@block_sizes_of(k3s.RouterLogitsOp, k3s.ProjectSlotsOp)
def own_row_blocks(op: Operation, sizes: dict[str, int]) -> dict[str, int]:
    """The last row of its sizes by rows: those of calls of any row count."""
    return dict(SIZES_BY_ROWS[type(op)](op)[-1][1])


@block_sizes_of(k3s.SumPartialLogitsOp)
def sum_partial_logits_blocks(op: k3s.SumPartialLogitsOp, sizes: dict[str, int]) -> dict[str, int]:
    """Its rows by rows (own_row_blocks), every expert."""
    return own_row_blocks(op, sizes) | dict(block_e=next_power_of_2(op.num_experts.value.data))


@block_sizes_of(k3s.SelectTopKOp)
def select_top_k_blocks(op: k3s.SelectTopKOp, sizes: dict[str, int]) -> dict[str, int]:
    return dict(block_ks=next_power_of_2(op.top_k.value.data))


@block_sizes_of(k3s.CountPairsOp, k3s.SortPairsOp)
def pair_blocks(op: Operation, sizes: dict[str, int]) -> dict[str, int]:
    return dict(block_r=PAIRS_PER_PROGRAM)


@block_sizes_of(k3s.ExpertOffsetsOp)
def expert_offsets_blocks(op: k3s.ExpertOffsetsOp, sizes: dict[str, int]) -> dict[str, int]:
    """Every expert's count in one program."""
    return dict(block_e=next_power_of_2(op.num_experts.value.data))


@block_sizes_of(k3s.ProjectOp)
def project_blocks(op: k3s.ProjectOp, sizes: dict[str, int]) -> dict[str, int]:
    """Token rows: by rows (own_row_blocks); the expert-sorted pair list's blocks: GEMM tiles;
    one pair a program: a weight tile by the weights' format."""
    rows = op.rows.data.value
    if rows == "token_block":
        return own_row_blocks(op, sizes) | dict(num_stages=GEMM_STAGES)
    if rows == "sorted_block":
        return dict(SORTED_PROJECTION_TILE, num_stages=GEMM_STAGES)
    return dict(PAIR_PROJECTION_TILE["bf16" if op.weight_format is None else op.weight_format.data.value])


@block_sizes_of(k3s.SumSlotsOp)
def sum_slots_blocks(op: k3s.SumSlotsOp, sizes: dict[str, int]) -> dict[str, int]:
    return dict(block_r=16, block_n=128)


block_sizes_fixed_by("lower-moe-experts", k3s.RankPairsOp, k3s.ChunkOffsetsOp, k3s.ProjectTokenSlotsOp,
                     k3s.SumExpertRowsOp)
block_sizes_fixed_by("derive-moe-backward", k3s.ProjectInputGradOp, k3s.ProjectWeightGradOp, k3s.RmsNormAdjointOp,
                     k3s.NormGainGradOp, k3s.LoadRowsOp)


@sizes_by_rows_of(k3s.ProjectOp)
def project_sizes_by_rows(op: k3s.ProjectOp) -> Rows | None:
    """Token rows only (a dense projection); the experts' rows are the dispatch plan's."""
    return list(DENSE_PROJECTION_TILES) if op.rows.data.value == "token_block" else None


@sizes_by_rows_of(k3s.ProjectSlotsOp)
def project_slots_sizes_by_rows(op: k3s.ProjectSlotsOp) -> Rows:
    return list(SLOT_PROJECTION_TILES)


@sizes_by_rows_of(k3s.RouterLogitsOp)
def router_logits_sizes_by_rows(op: k3s.RouterLogitsOp) -> Rows:
    # no wider than the layer: experts and hidden columns padded to powers of two, at least 16
    # (tl.dot's operands); no more slices than blocks of hidden columns (a slice without columns
    # would be a program that stores zeros)
    d = op.hidden_size.value.data
    experts = max(16, next_power_of_2(op.num_experts.value.data))
    columns = max(16, next_power_of_2(d))
    return [(most, dict(block_r=br, block_e=min(be, experts), block_d=min(bd, columns),
                        hidden_slices=min(hs, -(-d // min(bd, columns)))))
            for most, br, be, bd, hs in ROUTER_LOGIT_TILES]


@sizes_by_rows_of(k3s.SumPartialLogitsOp)
def sum_partial_logits_sizes_by_rows(op: k3s.SumPartialLogitsOp) -> Rows:
    return [(most, dict(block_r=br)) for most, br in ROUTER_TOP_K_ROWS]


def block_sizes(kernel: k3s.KernelOp) -> dict[str, int]:
    """The kernel's block sizes: what its ops fix (BLOCK_SIZES), in program order."""
    sizes: dict[str, int] = {}
    for op in kernel.walk():
        if (of_op := BLOCK_SIZES.get(type(op))) is not None:
            sizes.update(of_op(op, sizes))
    return sizes


def launches_by_rows(kernel: k3s.KernelOp) -> Rows:
    """(at most this many rows, None for any; block sizes and warps) of an MoE router kernel or
    projection, the tables above fitted to its layer (its last op's of SIZES_BY_ROWS); [] for
    other kernels. A row whose sizes equal the next row's is left out: the next launches its
    calls the same."""
    rows: Rows = []
    for op in kernel.walk():
        if type(op) in SIZES_BY_ROWS and (op_rows := SIZES_BY_ROWS[type(op)](op)) is not None:
            rows = op_rows
    return [row for row, after in zip(rows, [*rows[1:], None]) if after is None or row[1] != after[1]]


def add_launches_by_rows(kernel: k3s.KernelOp) -> None:
    """k3s.launch_by_rows after the kernel for its block sizes at fewer rows (replacing any); a
    kernel without sizes by rows here keeps those its pass wrote (the MoE warp plan's, by the
    dispatch table's buckets)."""
    rows = launches_by_rows(kernel)
    if not rows:
        return
    anchor = k3s.launch_site(kernel)
    for old in k3s.launch_by_rows_ops(anchor.parent_op(), kernel):
        Rewriter.erase_op(old)
    for most, sizes in rows[:-1]:  # the last is the kernel's own
        launch = make(k3s.LaunchByRowsOp, kernel=SymbolRefAttr(kernel.sym_name), max_rows=most, **sizes)
        Rewriter.insert_op(launch, InsertPoint.after(anchor))
        anchor = launch


@dataclass(frozen=True)
class LegalizeTritonPass(ModulePass):
    """Check that the kernels fit and fix their block sizes (the MoE router's also by rows)."""

    name = "legalize-triton"
    source: str = "module"  # what an error names (the spec's file)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_limits(op, self.source)
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            kernel.properties.update(props(**block_sizes(kernel)))
            add_launches_by_rows(kernel)
