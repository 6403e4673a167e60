"""derive-attnres-backward: k3.attnres -> `aggregate_backward`, the aggregate's fused backward.

The forward h = sum_i p_i x_i, p = softmax_i(score_i), score_i = q . x_i / rho_i (q = w * gain,
rho_i = sqrt(mean(x_i^2) + eps)) is differentiated by the adjoint of each of its stages, in
reverse, with what is cheap recomputed rather than saved:
- the softmax weights come back from the row's log-sum-exp L, which the forward saves
  (`aggregate(..., output_lse=True)`: one fp32 number per row): p_i = exp(score_i - L), the
  score recomputed from the source row the backward reads anyway;
- the softmax's vector-Jacobian product needs delta = sum_i p_i (dh . x_i) before the first
  source's cotangent: for the sources it is read off the saved output, dh . h (FlashAttention's
  D = rowsum(dO * O)), so each source row is read once and its cotangent written once; per
  source, score_bar_i = p_i (dh . x_i - delta) (k3s.softmax_adjoint), the score's adjoint gives
  the source's cotangent through its score (k3s.rms_score_adjoint), the mix's adds p_i dh
  (k3s.mix_adjoint), and dsources is stored;
- per source the query's cotangent gets score_bar_i x_i / rho_i too (k3s.query_adjoint). The
  saved output is rounded to the inputs' dtype, so with its delta the scores' cotangents sum to
  some sigma instead of zero (in bf16 that made the gradients up to 3.5x less accurate than torch's on
  the H200); the query's cotangent waits for the row's last source, so it is re-centred: taking
  p_i sigma from each score's cotangent takes sigma sum_i p_i x_i / rho_i from the row's share
  (k3s.recentre_query_adjoint), as delta from the sources themselves would give;
- the query's cotangent is a sum over every row: each program sums it over a group of rows in
  registers (k3s.row_loop) and adds its share to the gradients of w and gain through the fold
  (q = w * gain: dw = q_bar * gain, dgain = q_bar * w) by fp32 atomics into zero-filled buffers,
  as the recurrence's backward sums a gate's parameters.

One kernel, grid row_group (a program per group of `rows-per-program` token rows), fp32 throughout;
dsources takes the dtype of the sources (every element is written once), dquery and dgain are fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block
from xdsl.passes import ModulePass

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import AttnResOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, make
from k3compile.passes.fuse_attnres import attnres_arg, fold_query, layer_arguments, loop, row_warps, score_stages


def backward_arguments(op: AttnResOp) -> list:
    """The forward's inputs, what it saved (out, lse), the cotangent of out, and a gradient per input."""
    D = op.hidden_size.value.data
    return [
        *layer_arguments(op),
        attnres_arg("out", ("B", "T", D)),
        attnres_arg("lse", ("B", "T"), dtype="float32"),
        attnres_arg("dout", ("B", "T", D)),
        attnres_arg("dsources", ("S", "B", "T", D), "output"),
        attnres_arg("dquery", (D,), "output", "float32", fill=0),
        attnres_arg("dgain", (D,), "output", "float32", fill=0),
    ]


def aggregate_backward_entry(op: AttnResOp, rows: int, num_warps: int, num_stages: int) -> k3s.EntryOp:
    arguments = backward_arguments(op)
    tensors = argument_values(arguments)
    fold = fold_query(op, tensors)
    q = fold.results[0]
    start = make(k3s.ZerosOp, result=("q_bar", k3s.tile("D")))

    # per source: the forward's score recomputed, the weight from the saved log-sum-exp, the adjoints
    carried = (("q_bar", ("D",)), ("k_mean", ("D",)), ("score_bar_sum", ()))
    source_body = Block(arg_types=[k3s.tile(*dims) for _, dims in carried])
    q_bar, k_mean, score_bar_sum = source_body.args
    lse, out, dout = (make(k3s.LoadRowOp, operands=[tensors[name]], result=(name, k3s.tile(*dims)))
                      for name, dims in (("lse", ()), ("out", ("D",)), ("dout", ("D",))))
    delta = make(k3s.SoftmaxDeltaOp, operands=[dout.results[0], out.results[0]], result=("delta", k3s.tile()))
    x, score = score_stages(op, tensors, q)
    p = make(k3s.SoftmaxWeightOp, operands=[score.results[0], lse.results[0]], result=("p", k3s.tile()))
    dp = make(k3s.WeightCotangentOp, operands=[x.results[0], dout.results[0]], result=("dp", k3s.tile()))
    score_bar = make(k3s.SoftmaxAdjointOp, operands=[p.results[0], dp.results[0], delta.results[0]],
                     result=("score_bar", k3s.tile()))
    x_bar = make(k3s.RmsScoreAdjointOp, operands=[x.results[0], q, score.results[0], score_bar.results[0]],
                 result=("x_bar", k3s.tile("D")), eps=op.eps.value.data)
    mixed = make(k3s.MixAdjointOp, operands=[x_bar.results[0], p.results[0], dout.results[0]],
                 result=("x_bar", k3s.tile("D")))
    query_bar = make(k3s.QueryAdjointOp, operands=[x.results[0], p.results[0], score_bar.results[0], q_bar, k_mean,
                                                   score_bar_sum],
                     results=[(name, k3s.tile(*dims)) for name, dims in carried], eps=op.eps.value.data)
    source_body.add_ops([x, score, p, dp, score_bar, x_bar, mixed,
                         make(k3s.StoreSourceCotangentOp, operands=[mixed.results[0], tensors["dsources"]]),
                         query_bar, make(k3s.NextSourceOp, operands=list(query_bar.results))])

    # per row: its saved log-sum-exp, output and the output's cotangent, then the sources, then
    # the row's share of the query's cotangent re-centred
    row_body = Block(arg_types=[k3s.tile("D")])
    zeros = [make(k3s.ZerosOp, result=(name, k3s.tile(*dims))) for name, dims in carried[1:]]
    sources = loop(k3s.SourceLoopOp, [row_body.args[0], *(z.results[0] for z in zeros)], tuple(n for n, _ in carried),
                   source_body)
    row_q_bar = make(k3s.RecentreQueryAdjointOp, operands=list(sources.results), result=("q_bar", k3s.tile("D")))
    row_body.add_ops([lse, out, dout, delta, *zeros, sources, row_q_bar,
                      make(k3s.NextRowOp, operands=[row_q_bar.results[0]])])
    rows_loop = loop(k3s.RowLoopOp, [start.results[0]], ("q_bar",), row_body, rows=rows)
    store = make(k3s.StoreQueryCotangentOp, operands=[rows_loop.results[0], tensors["query"], tensors["gain"],
                                                      tensors["dquery"], tensors["dgain"]])
    kernel = make(k3s.KernelOp, [fold, start, rows_loop, store], sym_name=f"{op.sym_name.data}_aggregate_backward",
                  grid=[GridAxis.ROW_GROUP], num_warps=num_warps, num_stages=num_stages)
    return make(k3s.EntryOp, [*arguments, kernel], sym_name="aggregate_backward", source=SymbolRefAttr(op.sym_name),
                max_sources=op.max_sources)


@dataclass(frozen=True)
class DeriveAttnResBackwardPass(ModulePass):
    """Add an `aggregate_backward` entry (the fused backward of the aggregate) for every k3.attnres."""

    name = "derive-attnres-backward"
    # rows a program takes one after another, summing the query's cotangent over them before its
    # atomics: fewer atomics per row with more, fewer programs to spread over the SMs. On the H200
    # (bf16, D = 7168, 16384 rows, 2 / 5 / 9 sources, this kernel before the query's re-centring;
    # bench/results/attnres_backward_h200_first_kernel.md) 4 rows took 10-28% longer than 16, 32
    # and 64 rows 1-7% less: not tuned further
    rows_per_program: int = 16
    # num_warps 0: by the row, four times fuse-attnres's warps (16 at K3's width): a row holds six
    # [D] tiles (the query, dh, a source row, its cotangent, the query's cotangent and the mean
    # normalised source), the forward's three. The source loop pipelined 3 deep, as fuse-attnres's:
    # in the same run 3 stages took 0.67-0.84x the time of 2, and with 3 stages 16 warps 0.96-0.98x
    # of 8 (2.2 / 2.6 / 2.7 TB/s of the bytes it must move, the forward 3.3 / 3.7 / 3.9)
    num_warps: int = 0
    num_stages: int = 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.rows_per_program < 1:
            raise ValueError(f"{self.name}: rows-per-program must be >= 1, got {self.rows_per_program}")
        if self.num_stages < 1:
            raise ValueError(f"{self.name}: num-stages must be >= 1, got {self.num_stages}")
        if self.num_warps:
            check_num_warps(self.name, self.num_warps)
        add_entries(op, AttnResOp, lambda layer: aggregate_backward_entry(
            layer, self.rows_per_program, self.num_warps or min(4 * row_warps(layer), k3s.MAX_NUM_WARPS),
            self.num_stages))
