"""derive-block-attnres: k3.attnres -> Block AttnRes's two phases, `block_partials` and
`block_merge`, derived from fuse-attnres's aggregate by splitting its loop over the sources.

In Block AttnRes an aggregation point attends over the n completed block representatives
b_0..b_{n-1} and its block's current partial sum x. The aggregate's loop carries the online
softmax (running max m, normaliser z, un-normalised mix a) from one source to the next, so it
splits after any source: the loop over b_0..b_{n-1} leaves (m, z, a), and taking it one source
further, over x with score s = q . x / rho(x), is

    m' = max(m, s),  z' = z e^(m - m') + e^(s - m'),  a' = a e^(m - m') + e^(s - m') x,  h = a' / z'

split-KV attention's merge. The pseudo-queries of a block's aggregation points are weights, not
functions of the input, so the first part runs once per block for all of them:

- block_partials: the aggregate's kernel batched over the block's queries. Every value that
  depends on the folded query gains the leading tile dimension Q (the scores, the softmax's max,
  normaliser, weight and rescale, the mix, and the loop's carried values); the loads of the
  representatives do not, so a program reads each representative row once for its whole block of
  queries. What the loop leaves is stored instead of normalised: by default (`partials =
  normalised`) as its log-sum-exp lse = m + log z and normalised mix a / z in the activations'
  dtype (k3s.store_normalised_partials), half the bytes at bf16 and the faster form on the H200
  at every n (bench/results/block_attnres_h200_a8d64b6.md); with `partials = numerator` as it
  stands, m, z and a in fp32 (k3s.store_partials). By default the aggregate's per-row kernel
  (grid row_query_block: a program per token row and block of queries, a row's blocks adjacent;
  at K3's n = 8 the faster on the H200); with `rows-per-program`
  > 1 its grouped kernel (a program's rows and their representatives as one pipelined loop, the
  partials stored at each row's end), so a program folds its block of queries and gains once for
  all its rows (grid row_group_query_block, a group's blocks adjacent).
- block_merge: the aggregate's kernel with its loop started from one query's partials
  (k3s.load_normalised_partials, the state (lse, 1, a / z), or k3s.load_partials, in place of
  k3s.softmax_start), over the one source after the completed ones, the current partial sum; it
  stores h as the aggregate does. (lse, 1, a / z) and (m, z, a) are the same state: with
  M = max(lse, s), e^(lse - M) = z e^(m - M), so the merge's numerator and normaliser agree.
  With `rows-per-program` > 1 the aggregate's grouped kernel, its query folded once for the
  group's rows, each row resumed from its own partials at its first source (k3s.row_resume where
  the grouped aggregate restarts at -inf); grid row_group. With groups both entries hold the
  per-row kernel too, for calls of fewer than grouped-from-rows token rows, as fuse-attnres's
  aggregate does.

For training the merge can also return each row's log-sum-exp over the partials and the partial
sum (`lse`, fp32, an optional output: `block_merge(..., output_lse=True)`, the aggregate's store
kept), from which derive-block-attnres-backward's merge backward recomputes the weights; phase
1's backward recomputes them from its stored partials (docs/attnres.md).
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
from k3compile.passes.common import add_entries, argument_values, check_power_of_two, make, props, rebind, tensor_arg
from k3compile.passes.fuse_attnres import FuseAttnResPass, attnres_arg, fused_attnres_entry, loop, warps_holding

# A block_partials program holds its block of queries and their mixes ([BQ, next_pow2(D)] fp32
# each) and a representative's row. Budget: what the aggregate's backward kernel holds at K3's
# width, six rows of 8192 fp32 in 16 warps (96 per thread; derive-attnres-backward). Not tuned
# for this kernel: at K3's width it gives BQ = 2 in 16 warps, the build timed on the H200
# (bench/results/block_attnres_h200_a8d64b6.md), no other BQ or warps there.
ROW_TILE_BUDGET = 6 * 8192
VALUES_PER_WARP = ROW_TILE_BUDGET // 16
# a block's 24 aggregation points (K3: 12 layers of two) in one program where they fit
MOST_QUERIES_PER_PROGRAM = 32


def padded_width(hidden_size: int) -> int:
    """A row's columns as a program holds them: D padded to a power of two (Triton's tiles)."""
    return 1 << (hidden_size - 1).bit_length()


def rows_held(queries: int) -> int:
    """The [next_pow2(D)] fp32 rows a block_partials program holds: its queries, their mixes, a
    representative's row."""
    return 2 * queries + 1


def default_queries_per_program(hidden_size: int, held=rows_held) -> int:
    """The most queries (a power of two, at most MOST_QUERIES_PER_PROGRAM) whose `held(queries)`
    rows fit ROW_TILE_BUDGET; at least one."""
    queries = MOST_QUERIES_PER_PROGRAM
    while queries > 1 and held(queries) * padded_width(hidden_size) > ROW_TILE_BUDGET:
        queries //= 2
    return queries


def partials_warps(hidden_size: int, queries: int, held=rows_held) -> int:
    """The warps that hold the program's `held(queries)` rows at VALUES_PER_WARP each (warps_holding)."""
    return warps_holding(held(queries) * padded_width(hidden_size), VALUES_PER_WARP)


PARTIALS = ("normalised", "numerator")  # derive-block-attnres{partials=...}: the stored form, default first


def partials_bytes(partials: str, hidden_size: int, activation_bytes: int) -> int:
    """One query's partials of one token row: the log-sum-exp (fp32) and the normalised mix in the
    activations' dtype, or the max and normaliser (fp32) and the fp32 numerator row."""
    if partials == "normalised":
        return 4 + hidden_size * activation_bytes
    return 2 * 4 + hidden_size * 4


def block_attnres_bytes(hidden_size: int = 7168, representatives: int = 8, aggregation_points: int = 24,
                        activation_bytes: int = 2, queries_per_program: int | None = None,
                        partials: str = PARTIALS[0]) -> dict[str, float]:
    """Bytes per token row and aggregation point that the kernels' loads and stores name, computed
    from the shapes (not measured): the one-phase aggregate over the n representatives and the
    partial sum (n + 1 rows read, h written) against the two phases: block_partials' traffic
    shared by the block's Q aggregation points (each of its cdiv(Q, BQ) programs of a row reads
    the row's n representatives) plus each point's partials written (partials_bytes), and
    block_merge (the point's partials and the partial sum read, h written). Activations take
    activation_bytes each (bf16: 2); the weights (queries, gains) are per layer, not per row, and
    left out. `*_one_read` counts each representative row once per block, as when a row's other
    programs find it in L2 (they run side by side: row_query_block)."""
    D, n, Q, a = hidden_size, representatives, aggregation_points, activation_bytes
    BQ = queries_per_program or default_queries_per_program(D)
    row, partials = D * a, partials_bytes(partials, D, a)
    figures = {
        "one_phase": (n + 1) * row + row,
        "block_partials": n * row * -(-Q // BQ) / Q + partials,
        "block_partials_one_read": n * row / Q + partials,
        "block_merge": partials + row + row,
    }
    figures["two_phase"] = figures["block_partials"] + figures["block_merge"]
    figures["two_phase_one_read"] = figures["block_partials_one_read"] + figures["block_merge"]
    return figures


def first(op: Operation, op_type: type[Operation]) -> Operation:
    """The first op of op_type in op (op included), in program order."""
    return next(o for o in op.walk() if isinstance(o, op_type))


def aggregate_kernels(layer: AttnResOp, rows_per_program: int, grouped_from_rows: int) -> list[k3s.KernelOp]:
    """Copies of fuse-attnres's kernels of the layer (their default warps and stages) for a program
    per row (rows_per_program 1) or per group of rows, split at grouped_from_rows token rows as
    fuse-attnres splits them (the per-row kernel for fewer), reading the tensors of an entry that
    is not in the module: what both phases are derived from (rebind points their copies at their
    own entries' arguments)."""
    options = FuseAttnResPass(rows_per_program=rows_per_program, grouped_from_rows=grouped_from_rows)
    return [kernel.clone() for kernel in k3s.entry_kernels(fused_attnres_entry(layer, options))]


def grouped(kernel: k3s.KernelOp) -> bool:
    """Whether the kernel walks a group of rows (fuse-attnres's rows-per-program > 1)."""
    return any(isinstance(op, k3s.RowSourceLoopOp) for op in kernel.walk())


def batch_over_queries(kernel: k3s.KernelOp, *per_query: SSAValue, summed: tuple[type[Operation], ...] = ()
                       ) -> None:
    """Give every value of the kernel that depends on the `per_query` values (the folded query, the
    loads of per-query tensors) the leading tile dimension Q: the results of an op reading such a
    value, but for the ops of the `summed` types (their results sum their terms over the queries),
    and a loop's carried value (its initial value, block argument, next value and result alike)
    when any of its four does."""
    batched = set(per_query)
    while True:
        count = len(batched)
        for op in kernel.walk():
            if isinstance(op, (k3s.SourceLoopOp, k3s.RowSourceLoopOp, k3s.RowLoopOp)):
                for carried in zip(op.initial, op.body.block.args, op.body.block.last_op.carried, op.results,
                                   strict=True):
                    if batched.intersection(carried):
                        batched.update(carried)
            elif batched.intersection(op.operands) and not isinstance(op, summed):
                batched.update(op.results)
        if len(batched) == count:
            break
    for value in batched:
        Rewriter.replace_value_with_new_type(value, k3s.tile("Q", *k3s.tile_dims(value)))


def derived_kernel(kernel: k3s.KernelOp, layer: AttnResOp, entry: str, **values) -> k3s.KernelOp:
    name = f"{layer.sym_name.data}_{entry}{'_groups' if grouped(kernel) else ''}"
    kernel.properties.update(props(k3s.KernelOp, sym_name=name, **values))
    return kernel


def partials_arguments(layer: AttnResOp, partials: str, role: str, per_query: tuple[str, ...]) -> list[Operation]:
    """The partials' tensors of block_partials (role output, per_query ("Q",)) or of block_merge
    (input, one query: ()): per token row the normalised form's log-sum-exp (fp32) and mix (the
    activations' dtype), or the numerator form's max, normaliser and numerator (fp32)."""
    D = layer.hidden_size.value.data
    if partials == "normalised":
        return [attnres_arg("block_lse", (*per_query, "B", "T"), role, "float32"),
                attnres_arg("block_mix", (*per_query, "B", "T", D), role)]
    return [attnres_arg("block_max", (*per_query, "B", "T"), role, "float32"),
            attnres_arg("block_normaliser", (*per_query, "B", "T"), role, "float32"),
            attnres_arg("block_numerator", (*per_query, "B", "T", D), role, "float32")]


STORE_PARTIALS = {"normalised": k3s.StoreNormalisedPartialsOp, "numerator": k3s.StorePartialsOp}
LOAD_PARTIALS = {"normalised": k3s.LoadNormalisedPartialsOp, "numerator": k3s.LoadPartialsOp}


def block_partials_entry(layer: AttnResOp, options: DeriveBlockAttnResPass) -> k3s.EntryOp:
    D = layer.hidden_size.value.data
    stored = partials_arguments(layer, options.partials, "output", ("Q",))
    arguments = [
        attnres_arg("representatives", ("S", "B", "T", D)),
        attnres_arg("queries", ("Q", D)),
        attnres_arg("gains", ("Q", D)),
        *stored,
    ]
    if options.partials_schedule == "columns":
        return columns_partials_entry(layer, options, arguments, stored)
    tensors = argument_values(arguments)
    kernels = [partials_kernel(kernel, layer, tensors, stored, options)
               for kernel in aggregate_kernels(layer, options.rows_per_program, options.grouped_from_rows)]
    return make(k3s.EntryOp, [*arguments, *kernels], sym_name="block_partials", source=SymbolRefAttr(layer.sym_name),
                max_sources=layer.num_blocks.value.data)


def partials_kernel(kernel: k3s.KernelOp, layer: AttnResOp, tensors: dict[str, SSAValue], stored: list[Operation],
                    options: DeriveBlockAttnResPass) -> k3s.KernelOp:
    """block_partials' kernel from an aggregate kernel: batched over the program's block of queries,
    the row's partials stored in place of h."""
    D = layer.hidden_size.value.data
    queries_per_program = options.queries_per_program or default_queries_per_program(D)
    # the loop over the sources is the scan over the representatives; where the aggregate stores a
    # row's h and log-sum-exp (after the loop, or at each row's end in a group's loop), the row's
    # partials are stored instead
    h_store, lse_store = first(kernel, k3s.NormalizeStoreOp), first(kernel, k3s.StoreLseOp)
    state = [lse_store.running_max, h_store.normaliser, h_store.mix]
    partials_store = make(STORE_PARTIALS[options.partials],
                          operands=[*state, *(tensors[arg.sym_name.data] for arg in stored)])
    Rewriter.insert_op(partials_store, InsertPoint.before(h_store))
    Rewriter.erase_op(h_store)
    Rewriter.erase_op(lse_store)
    fold = first(kernel, k3s.FoldQueryOp)
    fold.properties.update(props(k3s.FoldQueryOp, queries=queries_per_program))
    batch_over_queries(kernel, fold.query)
    rebind(kernel, {**tensors, "sources": tensors["representatives"], "query": tensors["queries"],
                    "gain": tensors["gains"]})
    return derived_kernel(kernel, layer, "block_partials",
                          grid=[GridAxis.ROW_GROUP_QUERY_BLOCK if grouped(kernel) else GridAxis.ROW_QUERY_BLOCK],
                          num_warps=partials_warps(D, queries_per_program))



# --- phase 1 in blocks of columns (partials-schedule=columns) ---------------------------------------

PARTIALS_SCHEDULES = ("query-blocks", "columns")  # derive-block-attnres{partials-schedule=...}, default first
# (columns: an option until a GPU has verified and timed it; offline it issues 5-20x fewer instructions)
FOLD_COLUMNS = 256  # the fold kernel's block of hidden columns (its programs: cdiv(D, 256); all queries each)
DOT_LEAST = 16  # tl.dot's least size of an operand's dimension: the (row, representative) pairs of a program


def columns_rows(layer: AttnResOp, rows: int) -> int:
    """The token rows of a columns program: at least `rows`, and enough that its (row,
    representative) pairs, next_pow2(num_blocks) a row, make a product's dimension (DOT_LEAST)."""
    sources = 1 << (layer.num_blocks.value.data - 1).bit_length()
    return max(rows, -(-DOT_LEAST // sources))


def fold_kernel(layer: AttnResOp, tensors: dict[str, SSAValue], name: str) -> k3s.KernelOp:
    """The kernel that folds the call's queries once (k3s.fold_queries_split into the `folded`
    workspace, [2, Q, D] in the activations' dtype): both directions' columns forms read them."""
    D = layer.hidden_size.value.data
    columns = min(FOLD_COLUMNS, padded_width(D))
    return make(k3s.KernelOp, [make(k3s.FoldQueriesSplitOp, operands=[tensors[n] for n in ("queries", "gains", "folded")],
                                    hidden_size=D, columns=columns)],
                sym_name=name, grid=[GridAxis.INPUT_BLOCK], num_warps=4, block_d=columns)


def columns_partials_entry(layer: AttnResOp, options: DeriveBlockAttnResPass, arguments: list[Operation],
                           stored: list[Operation]) -> k3s.EntryOp:
    """block_partials as two kernels: the call's queries folded once (k3s.fold_queries_split:
    q = w * gain, stored split in two parts of the activations' dtype), then a program per group
    of `columns-rows` token rows with all the call's queries and all of a row's representatives,
    sweeping the hidden columns twice in blocks of `block-columns`. Sweep 1 reads each
    representative row once and sums, as products on the tensor cores, the group's Gram matrix
    (its diagonal: the sums of squares) and every query's dot with every representative row;
    then the scores, the softmax over a row's representatives per query (its log-sum-exp, or max
    and normaliser, stored) and the mix's weights. Sweep 2, its column blocks last to first (the
    most recently read first: L2 hits), reads the rows again and writes each (row, query)'s mix
    once, the weights' product with the rows. No query is folded per row or per program, no
    online rescale: each representative row is read twice per group (once from HBM if the
    second read hits L2) and each mix written once, whatever Q."""
    D, eps = layer.hidden_size.value.data, layer.eps.value.data
    sources, rows = layer.num_blocks.value.data, columns_rows(layer, options.columns_rows)
    columns = min(options.block_columns, padded_width(D))
    folded_arg = tensor_arg("folded", k3s.tensor(2, "Q", D, dtype="float"), "workspace")
    t = argument_values([*arguments, folded_arg])
    name = layer.sym_name.data

    fold = fold_kernel(layer, t, f"{name}_block_partials_fold")

    def load_rows(**last) -> Operation:
        return make(k3s.LoadGroupSourcesOp, operands=[t["representatives"]], hidden_size=D, rows=rows,
                    sources=sources, result=("x", k3s.tile("R", "S", "D")), **last)

    # sweep 1: the Gram matrix and the queries' dots over the columns
    sums = (("gram", ("R", "S", "R", "S")), ("qx", ("Q", "R", "S")))
    starts = [make(k3s.ZerosOp, result=(n, k3s.tile(*dims))) for n, dims in sums]
    body = Block(arg_types=[k3s.tile(*dims) for _, dims in sums])
    x = load_rows()
    queries = make(k3s.LoadFoldedQueriesOp, operands=[t["folded"]],
                   results=[("q_high", k3s.tile("Q", "D")), ("q_low", k3s.tile("Q", "D"))])
    dots = make(k3s.GroupColumnDotsOp, operands=[x.results[0], *queries.results, *body.args],
                results=[(n, k3s.tile(*dims)) for n, dims in sums])
    body.add_ops([x, queries, dots, make(k3s.NextColumnOp, operands=list(dots.results))])
    sweep1 = loop(k3s.ColumnLoopOp, [z.results[0] for z in starts], tuple(n for n, _ in sums), body, columns=columns)
    scores = make(k3s.GroupScoresOp, operands=[*sweep1.results, t["representatives"], t["folded"]], eps=eps,
                  result=("score", k3s.tile("R", "S", "Q")))
    normalised = options.partials == "normalised"
    softmax = make(k3s.GroupSoftmaxOp, operands=[scores.results[0]], results=[
        ("max", k3s.tile("R", "Q")), ("sum", k3s.tile("R", "Q")), ("p", k3s.tile("R", "Q", "R", "S"))],
        **({"normalised": True} if normalised else {}))
    stats = make(k3s.StoreGroupStatsOp, operands=[*softmax.results[:2], *(t[a.sym_name.data] for a in stored[:-1])])
    split = make(k3s.SplitWeightsOp, operands=[softmax.results[2], t["representatives"]],
                 results=[("p_high", k3s.tile("R", "Q", "R", "S")), ("p_low", k3s.tile("R", "Q", "R", "S"))])

    # sweep 2, last block of columns first: the mixes
    x = load_rows(last_use=True)
    mix = make(k3s.GroupMixOp, operands=[x.results[0], *split.results], result=("mix", k3s.tile("R", "Q", "D")))
    store = make(k3s.StoreGroupRowsOp, operands=[mix.results[0], t[stored[-1].sym_name.data]])
    sweep2 = loop(k3s.ColumnLoopOp, [], (), Block([x, mix, store, make(k3s.NextColumnOp)]), columns=columns,
                  reverse=True)
    kernel = make(k3s.KernelOp, [*starts, sweep1, scores, softmax, stats, split, sweep2],
                  sym_name=f"{name}_block_partials_columns", grid=[GridAxis.ROW_GROUP_ALL_QUERIES],
                  num_warps=options.columns_warps, num_stages=options.columns_stages)
    return make(k3s.EntryOp, [*arguments, folded_arg, fold, kernel], sym_name="block_partials",
                source=SymbolRefAttr(name), max_sources=sources)


def resume_rows_from_partials(kernel: k3s.KernelOp, load: Operation) -> None:
    """A group's loop (rows-per-program > 1) resumes each row from its own partials: the load in
    the loop, and at each row's first source k3s.row_resume in place of k3s.row_start (which
    restarts from nothing), its results feeding what read the carried values."""
    row_start = first(kernel, k3s.RowStartOp)
    loop_body = row_start.parent_block()
    carried_max, carried_sum, carried_mix = loop_body.args
    for result, name in zip(load.results, ("row_max", "row_sum", "row_acc"), strict=True):
        result.name_hint = name
    resume = make(k3s.RowResumeOp, operands=[carried_max, carried_sum, carried_mix, *load.results],
                  results=[(value.name_hint, value.type) for value in (carried_max, carried_sum, carried_mix)])
    Rewriter.insert_op([load, resume], InsertPoint.before(row_start))
    for carried, resumed in zip((carried_sum, carried_mix), resume.results[1:], strict=True):
        carried.replace_uses_with_if(resumed, lambda use: use.operation is not resume)
    row_start.started_max.replace_all_uses_with(resume.results[0])
    Rewriter.erase_op(row_start)


def block_merge_entry(layer: AttnResOp, options: DeriveBlockAttnResPass) -> k3s.EntryOp:
    D = layer.hidden_size.value.data
    loaded = partials_arguments(layer, options.partials, "input", ())
    arguments = [
        attnres_arg("partial_sum", ("S", "B", "T", D)),
        attnres_arg("query", (D,)),
        attnres_arg("gain", (D,)),
        *loaded,
        attnres_arg("out", ("B", "T", D), "output"),
        attnres_arg("lse", ("B", "T"), "optional_output", "float32"),
    ]
    tensors = argument_values(arguments)
    kernels = [merge_kernel(kernel, layer, tensors, loaded, options.partials)
               for kernel in aggregate_kernels(layer, options.rows_per_program, options.grouped_from_rows)]
    return make(k3s.EntryOp, [*arguments, *kernels], sym_name="block_merge", source=SymbolRefAttr(layer.sym_name),
                max_sources=1)


def merge_kernel(kernel: k3s.KernelOp, layer: AttnResOp, tensors: dict[str, SSAValue], loaded: list[Operation],
                 partials: str) -> k3s.KernelOp:
    """block_merge's kernel from an aggregate kernel: the softmax started from the partials (its
    normalised store and optional log-sum-exp store as the aggregate's)."""
    # the loop starts from the query's partials, not from nothing
    start = first(kernel, k3s.SoftmaxStartOp)
    load = make(LOAD_PARTIALS[partials], operands=[tensors[arg.sym_name.data] for arg in loaded],
                results=[(value.name_hint, value.type) for value in start.results])
    if grouped(kernel):  # each row of the group from its own partials
        resume_rows_from_partials(kernel, load)
    else:
        Rewriter.replace_op(start, load)
        del kernel.properties["num_stages"]  # one source: no next rows to load ahead
    rebind(kernel, {**tensors, "sources": tensors["partial_sum"]})
    return derived_kernel(kernel, layer, "block_merge")


@dataclass(frozen=True)
class DeriveBlockAttnResPass(ModulePass):
    """Add Block AttnRes's `block_partials` and `block_merge` entries for every k3.attnres."""

    name = "derive-block-attnres"
    # a block_partials program's block of queries (a power of two); 0: default_queries_per_program
    queries_per_program: int = 0
    # how the partials are stored: normalised (log-sum-exp, a / z in the activations' dtype) or
    # numerator (m, z, a in fp32). Both passed their float64 checks on the H200 at K3's
    # configuration (bf16, T = 8192, D = 7168, Q = 24); the normalised two phases took 3.63 / 5.22
    # / 6.53 / 9.13 ms a block at n = 1 / 2 / 4 / 8 against the numerator's 4.81 / 6.31 / 7.61 /
    # 10.31 (bench/results/block_attnres_h200_a8d64b6.md), hence the default
    partials: str = PARTIALS[0]
    # both phases' token rows a program: > 1 loads the program's queries and gains once for all
    # of them (per row they are Q * D * 4 bytes at bf16 in phase 1, 688 KB at K3's width, and
    # 2 * D * 2 in each merge, from L2) and runs the group's (row, source) pairs as one pipelined
    # loop, as fuse-attnres's groups. 1 (a program per row) is the default: on the H200 groups of
    # 8 passed and were faster at n = 1, 2, 4 (3.47, 4.65, 6.37 ms a block with the normalised
    # partials against 3.63, 5.22, 6.53) but slower at K3's n = 8 (9.87 against 9.13 ms;
    # bench/results/block_attnres_h200_a8d64b6.md). Calls of few rows (decoding) leave few groups.
    rows_per_program: int = 1
    # with groups, calls of fewer token rows launch a program per row instead (fuse-attnres's split
    # and its threshold: groups of 8 left too few programs below 2048 rows); 0: groups at every call
    grouped_from_rows: int = 2048
    # block_partials' schedule: "columns" (a program's group of rows with all the call's queries,
    # two sweeps over the hidden columns: each representative row read twice, each mix written
    # once, the queries folded once per call; columns_partials_entry) or "query-blocks" (the
    # aggregate's kernel batched over a program's block of queries, as before: every program
    # folds its queries and scans its row's representatives once per block of queries, one row
    # at a time; queries-per-program and rows-per-program above). docs/attnres.md gives both
    # forms' bytes and instruction counts; neither is timed against the other on a GPU yet
    partials_schedule: str = PARTIALS_SCHEDULES[0]
    # columns: a program's token rows (raised to 16 / next_pow2(num_blocks) where fewer: tl.dot's
    # least), its block of hidden columns, warps and pipeline stages. 4 rows, 128 columns, 4 warps:
    # no spill offline for sm_90 at K3's and flash-attn-res's shapes (bench/block_attnres_sm90.py)
    columns_rows: int = 4
    block_columns: int = 128
    columns_warps: int = 4
    columns_stages: int = 3

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.queries_per_program:
            check_power_of_two(self.name, "queries-per-program", self.queries_per_program)
        if self.rows_per_program < 1:
            raise ValueError(f"{self.name}: rows-per-program must be >= 1, got {self.rows_per_program}")
        if self.grouped_from_rows < 0:
            raise ValueError(f"{self.name}: grouped-from-rows must be >= 0 (0: always grouped), "
                             f"got {self.grouped_from_rows}")
        if self.partials not in PARTIALS:
            raise ValueError(f"{self.name}: partials must be one of {', '.join(PARTIALS)}, got {self.partials}")
        if self.partials_schedule not in PARTIALS_SCHEDULES:
            raise ValueError(f"{self.name}: partials-schedule must be one of {', '.join(PARTIALS_SCHEDULES)}, "
                             f"got {self.partials_schedule}")
        if self.columns_rows < 1:
            raise ValueError(f"{self.name}: columns-rows must be >= 1, got {self.columns_rows}")
        check_power_of_two(self.name, "block-columns", self.block_columns)
        if self.block_columns < DOT_LEAST:
            raise ValueError(f"{self.name}: block-columns must be at least {DOT_LEAST} (tl.dot's least), "
                             f"got {self.block_columns}")
        check_power_of_two(self.name, "columns-warps", self.columns_warps, k3s.MAX_NUM_WARPS)
        if self.columns_stages < 1:
            raise ValueError(f"{self.name}: columns-stages must be >= 1, got {self.columns_stages}")
        add_entries(op, AttnResOp, lambda layer: block_partials_entry(layer, self))
        add_entries(op, AttnResOp, lambda layer: block_merge_entry(layer, self))
