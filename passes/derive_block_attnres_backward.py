"""derive-block-attnres-backward: k3.attnres -> `block_partials_backward` and
`block_merge_backward`, the backward of Block AttnRes's two phases, derived from
derive-attnres-backward's aggregate backward by the splits derive-block-attnres makes of the
aggregate's forward.

The merge takes the softmax over the completed representatives one source further, so the two
phases together are the aggregate's softmax over [b_0 .. b_{n-1}, x] split after b_{n-1}; their
backward is the aggregate's backward split at the same place, the softmax recomputed from saved
log-sum-exps as there:

- block_merge_backward: h = alpha m + beta x over two sources, the partials (score: their
  log-sum-exp L_p, row: the normalised mix m) and the partial sum x (score s = q . x / rho(x)),
  alpha = exp(L_p - L), beta = exp(s - L), L the merged log-sum-exp the forward saves
  (block_merge(..., output_lse=True)). It is the aggregate's backward kernel over the one source x
  with the partials' adjoint before its loop (k3s.partials_adjoint: alpha and the partials' score
  cotangent lse_bar = alpha (dh . m - delta), delta = dh . h off the saved output as there) and
  their stores after it (k3s.store_partials_cotangent: d block_lse = lse_bar - alpha sigma,
  d block_mix = alpha dh). The partials' score cotangent starts the loop's sum sigma of the
  scores' cotangents, so the query's re-centring (q_bar -= sigma kbar) and d block_lse's take the
  rounding of the saved output out of both. d partial_sum, d query and d gain as the aggregate's.
- block_partials_backward: per query j and token, lse_j = log sum_i exp(s_ij) and the mix
  m_j = sum_i p_ij b_i (p_ij = exp(s_ij - lse_j)); with their cotangents lse_bar_j and m_bar_j,
  s_bar_ij = p_ij (m_bar_j . b_i - m_bar_j . m_j + lse_bar_j). With partials-backward = columns
  (columns_backward_entry) it is the forward's columns form run backwards: the queries folded
  once by the forward's fold kernel, then a program takes a group of rows (as tiles: no loop over
  them) with all the call's queries and sweeps the hidden columns twice in blocks, its products on
  the tensor cores: first the full-row dots it needs (q_j . b_i, m_bar_j . b_i, b_i . b_i), from
  which the coefficients follow (delta_j = m_bar_j . m_j taken as sum_i p_ij (m_bar_j . b_i), from
  the representatives, so the saved mix is not read and nothing needs re-centring), then per block
  of columns b_bar_i = sum_j (t_ij q_j + p_ij m_bar_j) - c_i b_i (t = s_bar / rho, c_i = sum_j
  s_bar_ij s_ij / (D rho_i^2)), stored once; q_bar_j = sum_i t_ij b_i, a sum over all the call's
  rows, by a third kernel from t (stored by the second) over parts of the rows. With
  partials-backward = query-blocks (the default) it is the aggregate's backward kernel
  batched over the program's block of queries as block_partials batches the forward: the saved
  log-sum-exp, output and its cotangent become the block's rows of block_lse, block_mix and
  d block_mix (k3s.load_query_rows), every value that depends on them or on the folded query gets
  the tile dimension Q, and the log-sum-exp's cotangent is taken from delta (k3s.lse_adjoint, which
  also starts sigma at -lse_bar: the scores' cotangents sum to lse_bar). A representative row is
  read once for the program's queries; its cotangent (k3s.rms_score_adjoint and k3s.mix_adjoint
  sum their terms over the queries) is added into a zero-filled fp32 d representatives by atomics
  (k3s.add_source_cotangent), since every block of queries of the row adds its share; d queries and
  d gains are summed over the program's rows and added by atomics as the aggregate's.

Grids: block_merge_backward row_group (a program per group of `rows-per-program` token rows),
block_partials_backward row_group_query_block (query-blocks: per group of rows and block of
queries) or, with columns, input_block (the fold), row_group_all_queries (a program per group of
`columns-rows` rows) and input_block x row_part (the queries' cotangents).
Only the normalised partials (derive-block-attnres's default) have a backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir import k3s
from k3compile.ir.k3s import GridAxis
from k3compile.ir.k3 import AttnResOp
from k3compile.passes.common import add_entries, argument_values, check_num_warps, check_power_of_two, make, props, \
    rebind, tensor_arg
from k3compile.passes.derive_attnres_backward import aggregate_backward_entry
from k3compile.passes.derive_block_attnres import DOT_LEAST, batch_over_queries, columns_rows, \
    default_queries_per_program, first, fold_kernel, padded_width, partials_warps
from k3compile.passes.fuse_attnres import attnres_arg, loop, row_warps


# partials-backward=columns: the main kernel's warps (not tuned; as the columns forward's, whose
# 4 warps did not spill offline for sm_90 at K3's and flash-attn-res's shapes: the largest
# accumulator, sweep 2's [BR BS, BD] fp32, is 32 values a thread at BR BS = 32, BD = 128) and the
# queries' kernel's ([BQ, query-columns] fp32: 16 a thread at 16 x 128)
COLUMNS_WARPS = 4
QUERY_WARPS = 4
# derive-block-attnres-backward{partials-backward=...}, default first: query-blocks, since the
# columns form before this one (a program's rows one after another, its products on the CUDA
# cores) took 50-60 ms at T = 8192 on an H100 where query-blocks took 6-52 ms (n = 1-8; 3-4% of a
# copy's bandwidth against 34-45%: bench/results/block_attnres_train_gpu_h100_f3f7295.md); the
# tensor-core columns form is not timed yet
PARTIALS_BACKWARD = ("query-blocks", "columns")


def backward_rows_held(queries: int) -> int:
    """The [next_pow2(D)] fp32 rows a block_partials_backward program holds: per query its folded
    query, d mix, its query cotangent and kbar; a representative's row and its cotangent."""
    return 4 * queries + 2


def block_attnres_backward_bytes(hidden_size: int = 7168, representatives: int = 8, queries: int = 12,
                                 activation_bytes: int = 2, partials_backward: str = PARTIALS_BACKWARD[0],
                                 queries_per_program: int = 0) -> dict[str, int]:
    """Bytes per token row and block of `queries` aggregation points that the backward kernels'
    loads and stores of rows name, counted from the kernels (not measured): phase 1's backward,
    the block's merges' backwards, and the one-phase aggregate's backward at as many points. A
    row of D takes activation_bytes a column (bf16: 2), log-sum-exps and workspaces fp32; weights
    (queries, gains, the folded queries) and the atomics into dqueries and dgains (per program
    or part of the rows, not per row) are left out. columns: the representatives and d mixes read
    in both sweeps (the second, last block first, partly from L2: counted), d representatives
    written once, t ([n, Q] fp32 a row) written, then read back with the representatives by the
    queries' kernel. query-blocks: each of the row's cdiv(Q, BQ) programs
    reads the representatives and adds their cotangents (fp32 atomics, counted as a write), the
    mixes and their cotangents read once, then d representatives cast (fp32 read, written in
    their dtype)."""
    D, n, Q, a = hidden_size, representatives, queries, activation_bytes
    row, lse = D * a, 4
    if partials_backward == "columns":
        phase1 = 2 * (n + Q) * row + n * row + 2 * Q * lse + n * Q * 4 + (n * row + n * Q * 4)
    else:
        programs = -(-Q // (queries_per_program or default_queries_per_program(D, backward_rows_held)))
        phase1 = programs * n * (row + 4 * D) + Q * (2 * row + 2 * lse) + n * (4 * D + row)
    merge = 4 * row + 2 * lse + 2 * row + lse  # x, m, h, dh and two lse read; dx, dm, d lse written
    aggregate = 2 * (n + 1) * row + 2 * row + lse  # the sources, h, dh and lse read; d sources written
    return {"block_partials_backward": phase1, "block_merge_backward": merge,
            "two_phase": phase1 + Q * merge, "one_phase": Q * aggregate}


def aggregate_backward_kernel(layer: AttnResOp, options: DeriveBlockAttnResBackwardPass, num_warps: int
                              ) -> k3s.KernelOp:
    """A copy of derive-attnres-backward's kernel of the layer, reading the tensors of an entry that
    is not in the module: what both phases' backward is derived from (rebind points the copy at its
    own entry's arguments)."""
    entry = aggregate_backward_entry(layer, options.rows_per_program, num_warps, options.num_stages)
    return k3s.entry_kernels(entry)[0].clone()


def row_load(kernel: k3s.KernelOp, tensor: str) -> Operation:
    """The kernel's k3s.load_row of the argument named `tensor` (lse, out, dout)."""
    return next(op for op in kernel.walk() if isinstance(op, k3s.LoadRowOp) and k3s.argument_name(op.tensor) == tensor)


def start_score_bar_sum(kernel: k3s.KernelOp, start: SSAValue) -> None:
    """The source loop's sum of the scores' cotangents starts from `start`, not from zero."""
    zeros = first(kernel, k3s.SourceLoopOp).initial[2].owner
    zeros.results[0].replace_all_uses_with(start)
    Rewriter.erase_op(zeros)


def derived(kernel: k3s.KernelOp, layer: AttnResOp, entry: str, **values) -> k3s.KernelOp:
    kernel.properties.update(props(k3s.KernelOp, sym_name=f"{layer.sym_name.data}_{entry}", **values))
    return kernel


def block_merge_backward_entry(layer: AttnResOp, options: DeriveBlockAttnResBackwardPass) -> k3s.EntryOp:
    D = layer.hidden_size.value.data
    arguments = [
        attnres_arg("partial_sum", ("S", "B", "T", D)),
        attnres_arg("query", (D,)),
        attnres_arg("gain", (D,)),
        attnres_arg("block_lse", ("B", "T"), dtype="float32"),
        attnres_arg("block_mix", ("B", "T", D)),
        attnres_arg("out", ("B", "T", D)),
        attnres_arg("lse", ("B", "T"), dtype="float32"),
        attnres_arg("dout", ("B", "T", D)),
        attnres_arg("dpartial_sum", ("S", "B", "T", D), "output"),
        attnres_arg("dquery", (D,), "output", "float32", fill=0),
        attnres_arg("dgain", (D,), "output", "float32", fill=0),
        attnres_arg("dblock_lse", ("B", "T"), "output", "float32"),
        attnres_arg("dblock_mix", ("B", "T", D), "output"),
    ]
    tensors = argument_values(arguments)
    warps = options.num_warps or min(4 * row_warps(layer), k3s.MAX_NUM_WARPS)
    kernel = aggregate_backward_kernel(layer, options, warps)
    # the partials are the merge's first source: their weight and score cotangent before the loop
    delta = first(kernel, k3s.SoftmaxDeltaOp)
    lse, dout = row_load(kernel, "lse").results[0], row_load(kernel, "dout").results[0]
    partials_lse = make(k3s.LoadRowOp, operands=[tensors["block_lse"]], result=("partials_lse", k3s.tile()))
    mix = make(k3s.LoadRowOp, operands=[tensors["block_mix"]], result=("mix", k3s.tile("D")))
    adjoint = make(k3s.PartialsAdjointOp, operands=[partials_lse.results[0], lse, mix.results[0], dout,
                                                    delta.results[0]],
                   results=[("alpha", k3s.tile()), ("lse_bar", k3s.tile())])
    Rewriter.insert_op([partials_lse, mix, adjoint], InsertPoint.after(delta))
    alpha, lse_bar = adjoint.results
    start_score_bar_sum(kernel, lse_bar)
    # after the loop sigma sums every score's cotangent: the partials' re-centred and stored
    recentre = first(kernel, k3s.RecentreQueryAdjointOp)
    store = make(k3s.StorePartialsCotangentOp, operands=[alpha, lse_bar, recentre.score_bar_sum, dout,
                                                         tensors["dblock_lse"], tensors["dblock_mix"]])
    Rewriter.insert_op(store, InsertPoint.after(recentre))
    rebind(kernel, {**tensors, "sources": tensors["partial_sum"], "dsources": tensors["dpartial_sum"]})
    del kernel.properties["num_stages"]  # one source: no next rows to load ahead
    kernel = derived(kernel, layer, "block_merge_backward")
    return make(k3s.EntryOp, [*arguments, kernel], sym_name="block_merge_backward",
                source=SymbolRefAttr(layer.sym_name), max_sources=1)


# the aggregate backward's saved tensors and the per-query tensors of block_partials_backward in their place
PER_QUERY = {"lse": "block_lse", "out": "block_mix", "dout": "dblock_mix"}


def partials_backward_arguments(layer: AttnResOp, drepresentatives: dict) -> list[Operation]:
    """What block_partials_backward takes (the forward's inputs and outputs and the outputs'
    cotangents) and gives (a gradient per input; d representatives as `drepresentatives` says)."""
    D = layer.hidden_size.value.data
    return [
        attnres_arg("representatives", ("S", "B", "T", D)),
        attnres_arg("queries", ("Q", D)),
        attnres_arg("gains", ("Q", D)),
        attnres_arg("block_lse", ("Q", "B", "T"), dtype="float32"),
        attnres_arg("block_mix", ("Q", "B", "T", D)),
        attnres_arg("dblock_lse", ("Q", "B", "T"), dtype="float32"),
        attnres_arg("dblock_mix", ("Q", "B", "T", D)),
        attnres_arg("drepresentatives", ("S", "B", "T", D), "output", **drepresentatives),
        attnres_arg("dqueries", ("Q", D), "output", "float32", fill=0),
        attnres_arg("dgains", ("Q", D), "output", "float32", fill=0),
    ]


def query_blocks_backward_entry(layer: AttnResOp, options: DeriveBlockAttnResBackwardPass) -> k3s.EntryOp:
    """partials-backward=query-blocks: the aggregate's backward batched over the program's block
    of queries (every block re-reads the representatives and adds its share by atomics)."""
    D = layer.hidden_size.value.data
    arguments = partials_backward_arguments(layer, dict(dtype="float32", fill=0))
    tensors = argument_values(arguments)
    queries = options.queries_per_program or default_queries_per_program(D, backward_rows_held)
    warps = options.num_warps or partials_warps(D, queries, backward_rows_held)
    kernel = aggregate_backward_kernel(layer, options, warps)
    # the saved rows per query
    loads = []
    for name, per_query in PER_QUERY.items():
        load = row_load(kernel, name)
        rows = make(k3s.LoadQueryRowsOp, operands=[tensors[per_query]],
                    result=(load.results[0].name_hint, k3s.tile(*k3s.tile_dims(load.results[0]))))
        Rewriter.replace_op(load, rows)
        loads.append(rows.results[0])
    # the log-sum-exp's cotangent, taken from delta
    delta = first(kernel, k3s.SoftmaxDeltaOp)
    lse_bar = make(k3s.LoadQueryRowsOp, operands=[tensors["dblock_lse"]], result=("lse_bar", k3s.tile()))
    adjoint = make(k3s.LseAdjointOp, operands=[delta.results[0], lse_bar.results[0]],
                   results=[("delta", k3s.tile()), ("score_bar_sum", k3s.tile())])
    Rewriter.insert_op([lse_bar, adjoint], InsertPoint.after(delta))
    delta.results[0].replace_uses_with_if(adjoint.results[0], lambda use: use.operation is not adjoint)
    start_score_bar_sum(kernel, adjoint.results[1])
    # a representative's cotangent: the program's queries' share, added to the other blocks'
    stored = first(kernel, k3s.StoreSourceCotangentOp)
    Rewriter.replace_op(stored, make(k3s.AddSourceCotangentOp, operands=list(stored.operands)))
    fold = first(kernel, k3s.FoldQueryOp)
    fold.properties.update(props(k3s.FoldQueryOp, queries=queries))
    batch_over_queries(kernel, fold.query, *loads, lse_bar.results[0],
                       summed=(k3s.RmsScoreAdjointOp, k3s.MixAdjointOp))
    rebind(kernel, {**tensors, "sources": tensors["representatives"], "query": tensors["queries"],
                    "gain": tensors["gains"], "dsources": tensors["drepresentatives"],
                    "dquery": tensors["dqueries"], "dgain": tensors["dgains"]})
    kernel = derived(kernel, layer, "block_partials_backward", grid=[GridAxis.ROW_GROUP_QUERY_BLOCK])
    return make(k3s.EntryOp, [*arguments, kernel], sym_name="block_partials_backward",
                source=SymbolRefAttr(layer.sym_name), max_sources=layer.num_blocks.value.data)


def columns_backward_entry(layer: AttnResOp, options: DeriveBlockAttnResBackwardPass) -> k3s.EntryOp:
    """partials-backward=columns: the forward's columns form run backwards, as three kernels.
    The call's queries folded once (derive-block-attnres's fold kernel and `folded` workspace:
    q = w * gain in two parts of the activations' dtype). Then a program per group of
    `columns-rows` token rows (at least 16 (row, representative) pairs: tl.dot's least) with all
    the call's queries and all of a row's representatives, the group's rows as tiles (no loop over
    them), sweeping the hidden columns twice in blocks of `block-columns`: sweep 1 sums as products
    on the tensor cores the group's Gram matrix (its diagonal: the sums of squares), every query's
    dot with every (row, representative) row and every (row, query)'s d mix's dot with them
    (block-diagonal: the products across rows are computed and unused); between the sweeps the
    scores and RMS (k3s.group_scores) and the coefficients p, t, c (k3s.group_score_adjoint:
    delta from the representatives, the saved mix is not read), t stored for the third kernel;
    sweep 2, last block first (L2 hits), reads the rows and d mixes again and writes each
    representative's cotangent once (its dtype, no atomics), t's product with the folded
    queries plus p's with the d mixes less c x, fp32 coefficients split in two parts as the
    forward's weights (k3s.split_weights). The queries' cotangents q_bar_j = sum t_ij x_i are a
    sum over all the call's rows: added per program they would be R / columns-rows adds of
    [Q, D] (at T = 8192, 2048 programs' 512 KB of fp32 atomics each); a third kernel
    (k3s.group_query_cotangent, grid input_block x row_part) instead reads t back and the
    representatives once more and sums them over parts of `query-rows` token rows, each part's
    [Q, block] added by fp32 atomics (R / query-rows adds: 32 at T = 8192)."""
    D, eps = layer.hidden_size.value.data, layer.eps.value.data
    sources, rows = layer.num_blocks.value.data, columns_rows(layer, options.columns_rows)
    columns = min(options.block_columns, padded_width(D))
    name = layer.sym_name.data
    arguments = partials_backward_arguments(layer, {})
    workspaces = [tensor_arg("folded", k3s.tensor(2, "Q", D, dtype="float"), "workspace"),
                  tensor_arg("score_bars", k3s.tensor("S", "B", "T", "Q", dtype="float32"), "workspace")]
    t = argument_values([*arguments, *workspaces])
    fold = fold_kernel(layer, t, f"{name}_block_partials_backward_fold")

    def column_inputs(**last) -> list[Operation]:  # the group's rows, the folded queries, the group's d mixes
        return [make(k3s.LoadGroupSourcesOp, operands=[t["representatives"]], hidden_size=D, rows=rows,
                     sources=sources, result=("x", k3s.tile("R", "S", "D")), **last),
                make(k3s.LoadFoldedQueriesOp, operands=[t["folded"]],
                     results=[("q_high", k3s.tile("Q", "D")), ("q_low", k3s.tile("Q", "D"))]),
                make(k3s.LoadGroupRowsOp, operands=[t["dblock_mix"]], result=("dout", k3s.tile("R", "Q", "D")),
                     **last)]

    # sweep 1: the Gram matrix, q . x and dh . x over the columns
    sums = (("gram", ("R", "S", "R", "S")), ("qx", ("Q", "R", "S")), ("dp", ("R", "Q", "R", "S")))
    starts = [make(k3s.ZerosOp, result=(n, k3s.tile(*dims))) for n, dims in sums]
    body = Block(arg_types=[k3s.tile(*dims) for _, dims in sums])
    x, queries, dout = column_inputs()
    dots = make(k3s.GroupColumnDotsOp, operands=[x.results[0], *queries.results, *body.args[:2]],
                results=[(n, k3s.tile(*dims)) for n, dims in sums[:2]])
    dp = make(k3s.GroupOutBarDotsOp, operands=[dout.results[0], x.results[0], body.args[2]],
              result=("dp", k3s.tile(*sums[2][1])))
    body.add_ops([x, queries, dout, dots, dp, make(k3s.NextColumnOp, operands=[*dots.results, *dp.results])])
    sweep1 = loop(k3s.ColumnLoopOp, [z.results[0] for z in starts], tuple(n for n, _ in sums), body, columns=columns)

    # the coefficients
    scores = make(k3s.GroupScoresOp, operands=[*sweep1.results[:2], t["representatives"], t["folded"]], eps=eps,
                  results=[("score", k3s.tile("R", "S", "Q")), ("rho", k3s.tile("R", "S"))])
    stats = [make(k3s.LoadGroupStatsOp, operands=[t[tensor]], result=(n, k3s.tile("R", "Q")))
             for tensor, n in (("block_lse", "lse"), ("dblock_lse", "lse_bar"))]
    adjoint = make(k3s.GroupScoreAdjointOp, operands=[*scores.results, sweep1.results[2], *(s.results[0] for s in stats)],
                   results=[("p", k3s.tile("R", "Q", "R", "S")), ("t", k3s.tile("R", "S", "Q")),
                            ("c", k3s.tile("R", "S"))])
    p, score_bar, centre = adjoint.results
    store_t = make(k3s.StoreGroupScoreBarsOp, operands=[score_bar, t["score_bars"]])
    # t (of no fixed range: the cotangents') over a power of two, p (in [0, 1]) as it is
    splits = [make(k3s.SplitWeightsOp, operands=[value, t["representatives"]],
                   results=[(f"{n}_high", value.type), (f"{n}_low", value.type), *scale])
              for value, n, scale in ((score_bar, "t", [("t_scale", k3s.tile())]), (p, "p", []))]

    # sweep 2, last block of columns first: the representatives' cotangents
    x, queries, dout = inputs = column_inputs(last_use=True)
    x_bar = make(k3s.GroupSourcesAdjointOp, operands=[x.results[0], *queries.results, dout.results[0],
                                                      *splits[0].results, *splits[1].results, centre],
                 result=("x_bar", k3s.tile("R", "S", "D")))
    store = make(k3s.StoreGroupRowsOp, operands=[x_bar.results[0], t["drepresentatives"]])
    sweep2 = loop(k3s.ColumnLoopOp, [], (), Block([*inputs, x_bar, store, make(k3s.NextColumnOp)]), columns=columns,
                  reverse=True)
    kernel = make(k3s.KernelOp, [*starts, sweep1, scores, *stats, adjoint, store_t, *splits, sweep2],
                  sym_name=f"{name}_block_partials_backward_columns", grid=[GridAxis.ROW_GROUP_ALL_QUERIES],
                  num_warps=options.num_warps or COLUMNS_WARPS, num_stages=options.num_stages)

    # the queries' cotangents, summed over parts of the rows
    q_bar = make(k3s.GroupQueryCotangentOp, operands=[t["score_bars"], t["representatives"]], hidden_size=D,
                 columns=min(options.query_columns, padded_width(D)), rows=options.query_rows,
                 pairs=options.query_pairs, result=("q_bar", k3s.tile("Q", "D")))
    query_store = make(k3s.StoreQueryCotangentOp, operands=[q_bar.results[0], t["queries"], t["gains"], t["dqueries"],
                                                            t["dgains"]])
    queries_kernel = make(k3s.KernelOp, [q_bar, query_store], sym_name=f"{name}_block_partials_backward_queries",
                          grid=[GridAxis.INPUT_BLOCK, GridAxis.ROW_PART], num_warps=QUERY_WARPS,
                          num_stages=options.num_stages)
    return make(k3s.EntryOp, [*arguments, *workspaces, fold, kernel, queries_kernel], sym_name="block_partials_backward",
                source=SymbolRefAttr(layer.sym_name), max_sources=sources)


def normalised_partials(module: ModuleOp, name: str) -> None:
    """ValueError unless the module's block_merge entries (if any) take the normalised partials."""
    for op in module.ops:
        if isinstance(op, k3s.EntryOp) and op.sym_name.data.endswith("block_merge"):
            if not any(isinstance(arg, k3s.TensorArgOp) and arg.sym_name.data == "block_lse" for arg in op.body.ops):
                raise ValueError(f"{name}: the backward takes derive-block-attnres's normalised partials "
                                 f"(partials=normalised), got {op.sym_name.data} with the numerator form")


@dataclass(frozen=True)
class DeriveBlockAttnResBackwardPass(ModulePass):
    """Add the `block_partials_backward` and `block_merge_backward` entries for every k3.attnres."""

    name = "derive-block-attnres-backward"
    # both kernels' token rows a program (derive-attnres-backward's 16): the query's cotangent is
    # summed over them in registers before the atomics. Not timed for these kernels.
    rows_per_program: int = 16
    # block_partials_backward's block of queries (a power of two); 0: the most whose
    # backward_rows_held rows fit derive-block-attnres's budget (1 at K3's width, 32 at D = 48)
    queries_per_program: int = 0
    # block_partials_backward's schedule: "query-blocks" (the aggregate's backward over a block of
    # queries a program: each block re-reads the representatives and adds their gradient by
    # atomics) or "columns" (columns_backward_entry: all the call's queries a program, its rows as
    # tiles, the representatives read three times and their gradient written once, products on
    # tl.dot). By the bytes the kernels name columns moves fewer at every n, Q and D
    # (docs/attnres.md); this columns form is not timed on a GPU yet (its predecessor, products on
    # the CUDA cores a row at a time, lost to query-blocks: 50-60 ms against 6-52 at T = 8192)
    partials_backward: str = PARTIALS_BACKWARD[0]
    # columns: a program's token rows (raised to 16 / next_pow2(num_blocks) where fewer: tl.dot's
    # least) and the hidden columns of a block (a power of two, at least 16); not tuned. 4 rows
    # and 64 columns: per pipeline stage 16 KB of shared memory at K3's shapes (the group's rows,
    # the folded queries and d mixes of a block)
    columns_rows: int = 4
    block_columns: int = 64
    # columns: the queries' kernel's token rows a part (each part adds its [Q, query-columns]
    # share by atomics), its hidden columns a program and its (row, representative) pairs a
    # product (powers of two; pairs at least 16); not tuned
    query_rows: int = 256
    query_columns: int = 128
    query_pairs: int = 64
    # 0: the merge's as the aggregate backward's (4x the aggregate's warps), the partials' by the
    # rows they hold (partials_warps; COLUMNS_WARPS with columns)
    num_warps: int = 0
    # the kernels' pipeline stages (the columns form's: its column loops' and the queries' kernel's loop)
    num_stages: int = 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.rows_per_program < 1:
            raise ValueError(f"{self.name}: rows-per-program must be >= 1, got {self.rows_per_program}")
        if self.queries_per_program:
            check_power_of_two(self.name, "queries-per-program", self.queries_per_program)
        if self.num_warps:
            check_num_warps(self.name, self.num_warps)
        if self.num_stages < 1:
            raise ValueError(f"{self.name}: num-stages must be >= 1, got {self.num_stages}")
        if self.partials_backward not in PARTIALS_BACKWARD:
            raise ValueError(f"{self.name}: partials-backward must be one of {', '.join(PARTIALS_BACKWARD)}, "
                             f"got {self.partials_backward}")
        check_power_of_two(self.name, "block-columns", self.block_columns)
        if self.block_columns < DOT_LEAST:
            raise ValueError(f"{self.name}: block-columns must be at least {DOT_LEAST} (tl.dot's least), "
                             f"got {self.block_columns}")
        if self.columns_rows < 1:
            raise ValueError(f"{self.name}: columns-rows must be >= 1, got {self.columns_rows}")
        for option, value in (("query-rows", self.query_rows), ("query-columns", self.query_columns),
                              ("query-pairs", self.query_pairs)):
            check_power_of_two(self.name, option, value)
        if not DOT_LEAST <= self.query_pairs <= self.query_rows:
            raise ValueError(f"{self.name}: query-pairs must be at least {DOT_LEAST} (tl.dot's least) and at most "
                             f"query-rows, got {self.query_pairs} (query-rows {self.query_rows})")
        if self.query_columns < DOT_LEAST:
            raise ValueError(f"{self.name}: query-columns must be at least {DOT_LEAST} (tl.dot's least), "
                             f"got {self.query_columns}")
        normalised_partials(op, self.name)
        partials = columns_backward_entry if self.partials_backward == "columns" else query_blocks_backward_entry
        add_entries(op, AttnResOp, lambda layer: partials(layer, self))
        add_entries(op, AttnResOp, lambda layer: block_merge_backward_entry(layer, self))
