"""legalize-triton: what the Triton backend decides about a scheduled module, fixed in the IR
before it is printed, so that the printer only prints.

- The kernels can hold their layer (backends/triton/limits.py: tile sizes, chunk and row-block
  divisibility, grid axes); otherwise an UnsupportedError names the spec key and the limit.
- Every kernel's tile block sizes: key columns whole (next power of two of K), value columns a
  state tile's block (at most its block_v) or, in a chunk kernel, whole (its value-block loop's
  block where it has one); AttnRes rows whole;
  the MoE router's blocks of token rows, experts and hidden columns and its slices of the
  hidden columns (logits kernel) and of rows, experts (whole) and top-k slots (top-k kernel);
  the MoE experts' blocks of pairs, token rows, output and input columns.
- The MoE router's block sizes and hidden slices for calls of fewer token rows
  (k3s.launch_by_rows after its kernels): the row count is known only at launch, and a few rows
  want other tiles than many.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
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


def block_sizes(kernel: k3s.KernelOp) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for op in kernel.walk():
        if isinstance(op, k3s.StateTileOp):
            sizes.update(block_k=next_power_of_2(op.head_k_dim.value.data),
                         block_v=min(next_power_of_2(op.head_v_dim.value.data), op.block_v.value.data))
        elif isinstance(op, k3s.ChunkTileOp):  # a whole chunk, all value columns
            sizes.update(block_k=next_power_of_2(op.head_k_dim.value.data),
                         block_v=next_power_of_2(op.head_v_dim.value.data))
        elif isinstance(op, k3s.ValueBlockLoopOp):  # after the kernel's chunk tile: its value blocks
            sizes.update(block_v=min(sizes["block_v"], op.block_v.value.data))
        elif isinstance(op, k3s.ColumnLoopOp):  # a row's columns in blocks (before the fold it holds)
            sizes.update(block_d=op.columns.value.data)
        elif isinstance(op, k3s.FoldQueryOp):  # a row's columns whole, but in a column loop
            sizes.setdefault("block_d", next_power_of_2(op.hidden_size.value.data))
        elif isinstance(op, k3s.RouterLogitsOp):
            sizes.update(launches_by_rows(kernel)[-1][1])
        elif isinstance(op, k3s.SumPartialLogitsOp):  # every expert
            sizes.update(launches_by_rows(kernel)[-1][1], block_e=next_power_of_2(op.num_experts.value.data))
        elif isinstance(op, k3s.SelectTopKOp):
            sizes.update(block_ks=next_power_of_2(op.top_k.value.data))
        elif isinstance(op, (k3s.CountPairsOp, k3s.SortPairsOp)):
            sizes.update(block_r=PAIRS_PER_PROGRAM)
        elif isinstance(op, k3s.ExpertOffsetsOp):  # every expert's count in one program
            sizes.update(block_e=next_power_of_2(op.num_experts.value.data))
        elif isinstance(op, k3s.ProjectOp) and op.rows.data.value == "token_block":
            sizes.update(launches_by_rows(kernel)[-1][1], num_stages=GEMM_STAGES)
        elif isinstance(op, k3s.ProjectOp) and op.rows.data.value == "sorted_block":
            sizes.update(SORTED_PROJECTION_TILE, num_stages=GEMM_STAGES)
        elif isinstance(op, k3s.ProjectOp):
            sizes.update(PAIR_PROJECTION_TILE["bf16" if op.weight_format is None else op.weight_format.data.value])
        elif isinstance(op, k3s.ProjectSlotsOp):
            sizes.update(launches_by_rows(kernel)[-1][1])
        elif isinstance(op, k3s.SumSlotsOp):
            sizes.update(block_r=16, block_n=128)
    return sizes


def launches_by_rows(kernel: k3s.KernelOp) -> list[tuple[int | None, dict[str, int]]]:
    """(at most this many rows, None for any; block sizes and warps) of an MoE router kernel or
    projection, the tables above fitted to its layer; [] for other kernels. A row whose sizes
    equal the next row's is left out: the next launches its calls the same."""
    rows: list[tuple[int | None, dict[str, int]]] = []
    for op in kernel.walk():
        if isinstance(op, k3s.ProjectOp) and op.rows.data.value == "token_block":
            rows = list(DENSE_PROJECTION_TILES)
        elif isinstance(op, k3s.ProjectSlotsOp):
            rows = list(SLOT_PROJECTION_TILES)
        if isinstance(op, k3s.RouterLogitsOp):
            # no wider than the layer: experts and hidden columns padded to powers of two, at
            # least 16 (tl.dot's operands); no more slices than blocks of hidden columns (a
            # slice without columns would be a program that stores zeros)
            d = op.hidden_size.value.data
            experts = max(16, next_power_of_2(op.num_experts.value.data))
            columns = max(16, next_power_of_2(d))
            rows = [(most, dict(block_r=br, block_e=min(be, experts), block_d=min(bd, columns),
                                hidden_slices=min(hs, -(-d // min(bd, columns)))))
                    for most, br, be, bd, hs in ROUTER_LOGIT_TILES]
        elif isinstance(op, k3s.SumPartialLogitsOp):
            rows = [(most, dict(block_r=br)) for most, br in ROUTER_TOP_K_ROWS]
    return [row for row, after in zip(rows, [*rows[1:], None]) if after is None or row[1] != after[1]]


def add_launches_by_rows(kernel: k3s.KernelOp) -> None:
    """k3s.launch_by_rows after the kernel for its block sizes at fewer rows (replacing any)."""
    name = kernel.sym_name.data
    anchor = k3s.launch_site(kernel)
    for old in [o for o in anchor.parent_op().body.ops if isinstance(o, k3s.LaunchByRowsOp) and o.kernel.data == name]:
        Rewriter.erase_op(old)
    for most, sizes in launches_by_rows(kernel)[:-1]:  # the last is the kernel's own
        launch = make(k3s.LaunchByRowsOp, kernel=name, max_rows=most, **sizes)
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
