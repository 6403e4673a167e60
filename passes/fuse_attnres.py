"""fuse-attnres: k3.attnres -> one kernel per token row that scores and mixes in a single read.

The gain is folded into the pseudo-query and the RMS into the score, so the normalised keys
are never materialised; an online softmax over the sources lets each source row be read once
for both its score and its contribution to the mix. The loop over sources is software-pipelined
(num_stages): the next sources' rows are in flight while one is scored, since the score's
reductions over the row would otherwise leave the memory system idle between loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3 import AttnResOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, make, tensor_arg


def fused_attnres_entry(op: AttnResOp, num_warps: int, num_stages: int) -> k3s.EntryOp:
    D = op.hidden_size.value.data

    def arg(sym_name: str, shape: tuple[str | int, ...], role: str = "input"):
        return tensor_arg(sym_name, k3s.tensor(*shape, dtype="float"), role)

    arguments = [arg("sources", ("S", "B", "T", D)), arg("query", (D,)), arg("gain", (D,)),
                 arg("out", ("B", "T", D), "output")]
    tensors = argument_values(arguments)
    fold = make(k3s.FoldQueryOp, operands=[tensors["query"], tensors["gain"]], hidden_size=D,
                result=("q", k3s.tile("D")))
    q = fold.results[0]
    # the online softmax carried over the sources: running max, normaliser, mix
    carried = [k3s.tile(), k3s.tile(), k3s.tile("D")]
    body = Block(arg_types=carried)
    running_max, normaliser, mix = body.args
    for carried_value, name in zip(body.args, ("max", "sum", "acc")):
        carried_value.name_hint = name
    x = make(k3s.LoadSourceOp, operands=[tensors["sources"]], result=("x", k3s.tile("D")))
    score = make(k3s.RmsScoreOp, operands=[x.results[0], q], result=("score", k3s.tile()), eps=op.eps.value.data)
    softmax = k3s.OnlineSoftmaxOp.create(operands=[running_max, normaliser, score.results[0]],
                                         result_types=[k3s.tile()] * 4)
    for result, name in zip(softmax.results, ("max", "sum", "p", "rescale")):
        result.name_hint = name
    new_max, new_sum, p, rescale = softmax.results
    mixed = make(k3s.MixAccumulateOp, operands=[mix, rescale, p, x.results[0]], result=("acc", k3s.tile("D")))
    body.add_ops([x, score, softmax, mixed,
                  make(k3s.NextSourceOp, operands=[new_max, new_sum, mixed.results[0]])])
    loop = k3s.SourceLoopOp.create(regions=[Region(body)], result_types=carried)
    for result, name in zip(loop.results, ("max", "sum", "acc")):
        result.name_hint = name
    kernel = make(
        k3s.KernelOp,
        [fold, loop, make(k3s.NormalizeStoreOp, operands=[loop.results[2], loop.results[1], tensors["out"]])],
        sym_name=f"{op.sym_name.data}_aggregate",
        grid="row",
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return make(
        k3s.EntryOp,
        [*arguments, kernel],
        sym_name="aggregate",
        source=op.sym_name.data,
        max_sources=op.max_sources,
    )


@dataclass(frozen=True)
class FuseAttnResPass(ModulePass):
    """Add an `aggregate` entry (fused score+mix kernel) for every k3.attnres."""

    name = "fuse-attnres"
    # a row's sources are loaded num_stages - 1 ahead of the one being scored: on the H200 at
    # D = 7168, N = 8192 rows, the printed kernel's loop with 4 warps and 3 stages read at 74% /
    # 83% / 89% of the copy bandwidth with S = 2 / 5 / 9 sources, against 62% / 65% / 66% with 8
    # warps and no pipelining (4 stages: 68% / 83% / 92%; 8 warps: at most 85%). An exploratory
    # run (bench/RESULTS.md, "AttnRes aggregate"); the A/B of the compiled modules is still to run.
    # num_warps 0: by the row, 4 warps while they hold it in registers, else the fewest that do
    num_warps: int = 0
    num_stages: int = 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.num_warps:
            check_num_warps(self.name, self.num_warps)
        if self.num_stages < 1:
            raise ValueError(f"{self.name}: num-stages must be >= 1, got {self.num_stages}")
        add_entries(op, AttnResOp, lambda layer: fused_attnres_entry(layer, self.warps_for(layer), self.num_stages))

    def warps_for(self, layer: AttnResOp) -> int:
        """The option, or 4 warps while 4 hold the row (MAX_ROW_PER_WARP columns each), else the
        fewest (a power of two) that do; the backend refuses a row no count of warps holds."""
        if self.num_warps:
            return self.num_warps
        warps = 4
        while warps < k3s.MAX_NUM_WARPS and warps * k3s.MAX_ROW_PER_WARP < layer.hidden_size.value.data:
            warps *= 2
        return warps

        add_entries(op, AttnResOp, lambda layer: fused_attnres_entry(layer, self.num_warps, self.num_stages))
