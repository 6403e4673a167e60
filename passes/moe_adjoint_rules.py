"""The adjoint of every stage of the LatentMoE layer's expert-centric schedule, one rule per op
type (`@moe_adjoint(k3s.ProjectOp)`), as passes/adjoint_rules.py's are for the recurrences'.

The recurrences' rules work on tiles inside one chunk; the MoE layer's stages are GEMMs whose
adjoints run over other grids (a weight's gradient sums over rows), so a rule here takes the
cotangent of its op's results as a tile of the backward kernel being built (`Tile`: an
elementwise adjoint stays in that kernel, e.g. the GLU's in the epilogue of the dgrad GEMM that
made it) or as a tensor of the backward entry (`Rows`: how the forward's rows read it), and
emits stages and kernels through the builder (passes/derive_moe_backward.py's MoeBackward),
returning nothing: what it makes it records as the cotangents of the op's operands
(`b.tile_cot` for tiles, `b.cot` for the tensors the forward's stages read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.ir import SSAValue

from k3compile.ir import k3s

# op type -> rule(builder, op): the cotangents of op's results are in the builder
MOE_ADJOINT_RULES: dict[type, Callable] = {}


def moe_adjoint(op_type: type) -> Callable:
    def register(rule: Callable) -> Callable:
        MOE_ADJOINT_RULES[op_type] = rule
        return rule

    return register


@dataclass(frozen=True)
class Product:
    """A forward GEMM y = a W^T as its adjoints see it: a's tensor and rows, W's tensor and layout
    (a GLU's [2 out, in], a stacked_out weight read dense), the forward's in and out widths."""

    source: str
    weight: str
    rows: str
    index: str
    in_dim: int
    out_dim: int
    layout: str
    group: int | None = None
    block_rows: int | None = None
    gain: str | None = None  # an RMS-normalised input's gain (rms_eps)

    @classmethod
    def of(cls, op: k3s.ProjectOp) -> Product:
        glu = op.up is not None
        layout = op.layout.data.value
        return cls(k3s.argument_name(op.input), k3s.argument_name(op.weight), op.rows.data.value,
                   op.input_index.data.value, op.in_dim.value.data, op.out_dim.value.data * (2 if glu else 1),
                   "dense" if layout == "stacked_out" else layout,
                   op.group.value.data if layout == "stacked_in" else None,
                   op.block_rows.value.data if op.block_rows is not None else None,
                   k3s.argument_name(op.gain) if op.gain is not None else None)


@dataclass(frozen=True)
class Tile:
    """A cotangent held in the open backward kernel: `value` over its rows (`rows`, `index`)."""

    value: SSAValue
    rows: str
    index: str


@dataclass(frozen=True)
class Rows:
    """A cotangent in a tensor of the backward entry. A forward row reads `value`'s row by
    `index` (None: the forward's own index; token: a pair's row reads its token's, the combine's
    broadcast over slots), times row_scale[pair] when `scale` (the routing weight); `dot_into`:
    the partials tensor that the routing weights' cotangent, the row dot of this cotangent with
    the forward's value, goes to (k3s.weigh_pairs)."""

    value: SSAValue
    index: str | None = None
    scale: SSAValue | None = None
    dot_into: SSAValue | None = None


@moe_adjoint(k3s.StoreRowsOp)
def store_rows(b, op: k3s.StoreRowsOp) -> None:
    """tensor[rows] = y (or += y): y's cotangent is the tensor's; a plain store overwrote what the
    tensor held before, which gets none."""
    name = k3s.argument_name(op.tensor)
    cot = b.cot.get(name)
    if cot is None:
        return
    if isinstance(cot, Tile) and (cot.rows, cot.index) != (op.rows.data.value, op.index.data.value):
        raise NotImplementedError(f"derive-moe-backward: {name}'s cotangent is held by {cot.rows} rows by "
                                  f"{cot.index}, its store writes {op.rows.data.value} rows by {op.index.data.value}")
    b.tile_cot[op.value] = cot if isinstance(cot, Tile) else dataclasses.replace(cot, index=cot.index or op.index.data.value)
    if not op.accumulate.value.data:
        del b.cot[name]


@moe_adjoint(k3s.SumSlotsOp)
def sum_slots(b, op: k3s.SumSlotsOp) -> None:
    """c[t] = sum_j input[t k + j]: every slot's row gets its token's cotangent."""
    c_bar = b.as_rows(b.tile_cot[op.result], op)
    b.cot[k3s.argument_name(op.input)] = dataclasses.replace(c_bar, index="token")


@moe_adjoint(k3s.WeighPairsOp)
def weigh_pairs(b, op: k3s.WeighPairsOp) -> None:
    """yw[m] = y[m] w[pair of m]: y_bar = yw_bar w; w_bar[pair] = yw_bar . y, a row dot product that
    the projection making y computes in its input's terms (yw_bar W . a: k3s.store_pair_dot), one
    partial per block of its columns, summed in order by the router's adjoint."""
    yw_bar = b.as_rows(b.tile_cot[op.result], op)
    name = k3s.argument_name(op.topk_weights)
    projection = op.value.owner
    columns = b.partials(k3s.argument_name(projection.input), projection.in_dim.value.data)
    partials = b.workspace(f"{name}_bar_partials", k3s.tensor("R", b.n.k, columns, dtype="float32"))
    b.tile_cot[op.value] = dataclasses.replace(yw_bar, scale=b.t[name], dot_into=partials)
    b.cot[name] = Rows(partials)


@moe_adjoint(k3s.GluOp)
def glu(b, op: k3s.GluOp) -> None:
    """act = f(g, u) elementwise: (g_bar, u_bar) = act_bar f'(g, u) in the open kernel, g and u
    the forward's saved pre-activations (k3s.store_glu_halves in its kernel). A cotangent the
    dgrad that made it stored (glu-adjoint=kernel) is loaded again by a row kernel of its own
    over the forward's rows, which applies what that dgrad left to it (the routing weight's terms)."""
    act_bar = b.tile_cot[op.result]
    saved = next(s for s in op.parent_op().body.ops if isinstance(s, k3s.StoreGluHalvesOp) and s.gate is op.gate)
    layout = dict(rows=saved.rows.data.value, index=saved.index.data.value, group=saved.group.value.data,
                  width=saved.width.value.data)
    if isinstance(act_bar, Rows):
        stored = next(s for s in op.parent_op().body.ops if isinstance(s, k3s.StoreRowsOp) and s.value is op.result)
        name = k3s.argument_name(stored.tensor)
        act_bar = b.open_row_kernel(f"{name}_glu_adjoint", act_bar, name, layout["rows"], stored.width.value.data)
    g, u = b.emit_op(k3s.LoadGluHalvesOp, [b.t[k3s.argument_name(saved.tensor)]], [("g", "M", "N"), ("u", "M", "N")],
                     **layout).results
    adjoint = b.emit_op(k3s.GluAdjointOp, [g, u, act_bar.value], [("g_bar", "M", "N"), ("u_bar", "M", "N")],
                        activation=op.activation.data)
    for value, bar in zip((op.gate, op.up), adjoint.results, strict=True):
        b.tile_cot[value] = Tile(bar, act_bar.rows, act_bar.index)
    b.glu_layout[op.gate] = layout


@moe_adjoint(k3s.ProjectOp)
def project(b, op: k3s.ProjectOp) -> None:
    """y = a W^T (with glu: both halves, one pass): a_bar = y_bar W (a GEMM over the program's rows
    with the weight transposed), W_bar = y_bar^T a (a GEMM summing over the rows, an expert's run
    for the routed experts); with rms_eps the cotangent of the normalised rows goes through the
    RMSNorm's adjoint to a's, and the gain gets its gradient."""
    p = Product.of(op)
    if op.up is not None:  # the halves' cotangents, stored in the weight's row order: one [2 out, in] weight
        y_bar = b.store_glu_cotangent(op, b.tile_cot[op.result], b.tile_cot[op.up], f"{p.weight}_out_bar")
    else:
        y_bar = b.as_rows(b.tile_cot[op.result], op)
    a_bar = b.input_grad(p, y_bar)
    if b.glu_in_kernel(p.source):  # stored as it is: the GLU's row kernel applies weigh_pairs' terms
        b.cot[p.source] = b.store_input_cotangent(p, a_bar, y_bar)
    else:  # weigh_pairs' row dot, yw_bar . (a W^T) = (yw_bar W) . a, and the rows' scale, here
        a_bar = b.row_terms(a_bar, y_bar, p.source, p.rows, p.index, p.in_dim)
        if op.rms_eps is not None:
            b.rms_norm_adjoint(p, a_bar, op.rms_eps.value.data)
        else:
            b.contribute(p.source, Tile(a_bar, p.rows, p.index))
    b.weight_grad(p, y_bar)


@moe_adjoint(k3s.StoreRoutingOp)
def store_routing(b, op: k3s.StoreRoutingOp) -> None:
    """The routing weights' cotangent (its partials summed in order), in a kernel that recomputes
    the top-k kernel's stages (and the router logits they read) for the chosen experts' scores."""
    cot = b.cot.pop(k3s.argument_name(op.topk_weights), None)
    if cot is None:
        return
    b.recompute_routing(op)
    total = b.emit_op(k3s.SumPartialsOp, [cot.value], [("weights_bar", "R", "KS")]).results[0]
    b.tile_cot[op.weights] = Tile(total, "token_block", "token")


@moe_adjoint(k3s.RoutingWeightsOp)
def routing_weights(b, op: k3s.RoutingWeightsOp) -> None:
    scaled_bar = b.tile_cot[op.scaled]
    bar = b.emit_op(k3s.RoutingWeightsAdjointOp, [b.primal[op.weights], scaled_bar.value], [("w_bar", "R", "KS")],
                    normalize=bool(op.normalize.value.data), scale=op.scale.value.data).results[0]
    b.tile_cot[op.weights] = dataclasses.replace(scaled_bar, value=bar)


@moe_adjoint(k3s.SelectTopKOp)
def select_top_k(b, op: k3s.SelectTopKOp) -> None:
    """weights = s at the chosen ids: the scores' cotangent is scattered to them; the choice (and the
    bias, which only ranks) has none."""
    w_bar = b.tile_cot[op.weights]
    bar = b.emit_op(k3s.SelectTopKAdjointOp, [b.primal[op.ids], w_bar.value], [("s_bar", "R", "E")]).results[0]
    b.tile_cot[op.scores] = dataclasses.replace(w_bar, value=bar)


@moe_adjoint(k3s.RouterSigmoidOp)
def router_sigmoid(b, op: k3s.RouterSigmoidOp) -> None:
    s_bar = b.tile_cot[op.scores]
    bar = b.emit_op(k3s.RouterSigmoidAdjointOp, [b.primal[op.scores], s_bar.value],
                    [("logits_bar", "R", "E")]).results[0]
    b.tile_cot[op.logits] = dataclasses.replace(s_bar, value=bar)


@moe_adjoint(k3s.SumPartialLogitsOp)
def sum_partial_logits(b, op: k3s.SumPartialLogitsOp) -> None:
    """logits = the sum of the slices' partial logits: each slice's cotangent is the logits'."""
    logits_bar = b.workspace("router_logits_bar", k3s.tensor("R", b.n.E, dtype="float32"))
    b.emit_op(k3s.StoreLogitsOp, [b.tile_cot[op.logits].value, logits_bar], [])
    b.close()
    b.cot[k3s.argument_name(op.partial_logits)] = Rows(logits_bar, "token")


@moe_adjoint(k3s.StorePartialLogitsOp)
def store_partial_logits(b, op: k3s.StorePartialLogitsOp) -> None:
    b.tile_cot[op.logits] = b.cot.pop(k3s.argument_name(op.partial_logits))


@moe_adjoint(k3s.RouterLogitsOp)
def router_logits(b, op: k3s.RouterLogitsOp) -> None:
    """logits = x W_r^T (the router's GEMM, in slices): x_bar += logits_bar W_r, W_r_bar = logits_bar^T x."""
    p = Product(k3s.argument_name(op.input), k3s.argument_name(op.weight), "token_block", "token",
                op.hidden_size.value.data, op.num_experts.value.data, "dense")
    b.product_adjoint(p, b.tile_cot[op.logits])
