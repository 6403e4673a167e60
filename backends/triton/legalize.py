"""legalize-triton: what the Triton backend decides about a scheduled module, fixed in the IR
before it is printed, so that the printer only prints.

- The kernels can hold their layer (backends/triton/limits.py: tile sizes, chunk and row-block
  divisibility, grid axes); otherwise an UnsupportedError names the spec key and the limit.
- Every kernel's tile block sizes: key columns whole (next power of two of K), value columns a
  state tile's block (at most its block_v) or, in a chunk kernel, whole; AttnRes rows whole;
  the MoE router's blocks of token rows, hidden columns, experts (whole) and top-k slots; the MoE
  experts' blocks of pairs, token rows, output and input columns.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from k3compile.backends.triton.limits import ROUTER_ROWS, check_limits
from k3compile.backends.triton.printer.common import next_power_of_2
from k3compile.ir import k3s
from k3compile.passes.common import props


PAIRS_PER_PROGRAM = 256  # the dispatch plan's count and sort kernels
PROJECTION_TILE = 64  # the MoE projections' rows, output and input columns per step


def block_sizes(kernel: k3s.KernelOp) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for op in kernel.walk():
        if isinstance(op, k3s.StateTileOp):
            sizes.update(block_k=next_power_of_2(op.head_k_dim.value.data),
                         block_v=min(next_power_of_2(op.head_v_dim.value.data), op.block_v.value.data))
        elif isinstance(op, k3s.ChunkTileOp):  # a whole chunk, all value columns
            sizes.update(block_k=next_power_of_2(op.head_k_dim.value.data),
                         block_v=next_power_of_2(op.head_v_dim.value.data))
        elif isinstance(op, k3s.FoldQueryOp):
            sizes.update(block_d=next_power_of_2(op.hidden_size.value.data))
        elif isinstance(op, k3s.RouterLogitsOp):
            # experts whole (tl.dot's other side is at least 16 wide); hidden columns in blocks of
            # at most 64, fewer where the router rows of a block would pass 16384 elements (the
            # [BD, BE] operand, 64 KB in fp32, is staged in shared memory once per pipeline stage;
            # not measured); tl.dot's inner side at least 16
            experts = max(16, next_power_of_2(op.num_experts.value.data))
            columns = min(64, next_power_of_2(op.hidden_size.value.data), 16384 // experts)
            sizes.update(block_r=ROUTER_ROWS, block_e=experts, block_d=max(16, columns))
        elif isinstance(op, k3s.SelectTopKOp):
            sizes.update(block_ks=next_power_of_2(op.top_k.value.data))
        elif isinstance(op, (k3s.CountPairsOp, k3s.SortPairsOp)):
            sizes.update(block_r=PAIRS_PER_PROGRAM)
        elif isinstance(op, k3s.ExpertOffsetsOp):  # every expert's count in one program
            sizes.update(block_e=next_power_of_2(op.num_experts.value.data))
        elif isinstance(op, k3s.ProjectOp) and op.rows.data.value in ("token_block", "sorted_block"):
            # tl.dot tiles (not tuned yet); a sorted block's rows are the dispatch plan's
            sizes.update(block_n=PROJECTION_TILE, block_d=PROJECTION_TILE)
            if op.rows.data.value == "token_block":
                sizes.update(block_r=PROJECTION_TILE)
        elif isinstance(op, (k3s.ProjectOp, k3s.ProjectSlotsOp)):  # one row: a [BN, BK] weight tile per step
            sizes.update(block_n=PROJECTION_TILE, block_d=2 * PROJECTION_TILE)
        elif isinstance(op, k3s.SumSlotsOp):
            sizes.update(block_r=16, block_n=2 * PROJECTION_TILE)
    return sizes


@dataclass(frozen=True)
class LegalizeTritonPass(ModulePass):
    """Check that the kernels fit and fix their block sizes."""

    name = "legalize-triton"
    source: str = "module"  # what an error names (the spec's file)

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_limits(op, self.source)
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            kernel.properties.update(props(**block_sizes(kernel)))
