"""The vector-Jacobian product of every stage of a chunkwise schedule, declared once per op type
(`@adjoint(k3s.GramOp)`), in the manner of JAX's transpose rules: given the cotangents of an op's
results, a rule emits the stages that compute the cotangents of its operands and returns them.

Gates are differentiated in log space: the cotangent of a cumulative gate G is that of its
exponent (d/dG exp(G) = exp(G)), so no rule divides by a decay. An operand a rule returns no
cotangent for gets none: a channel Gram's row-block references and factors (k3s.block_gates,
k3s.block_rescale, k3s.block_span_check) are another form of the same lhs, keys and G, so the
Gram's rule differentiates its value as a function of those three (and beta) alone.
derive-backward (passes/derive_backward.py) walks a schedule's stages in reverse with these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from xdsl.ir import Attribute, Block, Operation, SSAValue

from k3compile.ir import k3s
from k3compile.passes.common import make

# op type -> rule(emitter, op, cotangents of its results) -> {operand: cotangent}, operands by
# their names (op.keys, op.row_scale); a value an op takes twice gets one entry, the parts summed
ADJOINT_RULES: dict[type, Callable] = {}


# op type -> unscaled(stage, primal) -> (the stage's value before a scaling by beta, as an op on
# the recomputed operands; the factor; along) or None: derive-backward recomputes such a stage as
# the two, because its rule reads the unscaled value too (and cse makes it once)
UNSCALED_FORMS: dict[type, Callable] = {}


def unscaled_form(op_type: type) -> Callable:
    def register(form: Callable) -> Callable:
        UNSCALED_FORMS[op_type] = form
        return form

    return register


def adjoint(op_type: type) -> Callable:
    def register(rule: Callable) -> Callable:
        ADJOINT_RULES[op_type] = rule
        return rule

    return register


def result_name(op: Operation) -> str:
    """The name of the forward value an op makes (`A`, `P`, `KG`), which the names of the values
    its rule emits start with: two ops of one kind (the key and the query Gram) name theirs apart."""
    return op.results[0].name_hint or op.name.split(".")[-1]


class Emitter:
    """Appends stages to a block, reading forward values through `primal` (a forward value ->
    the value the backward schedule holds for it: its recomputation).

    Every value a rule emits is named (the printer's registers) after the value it holds, from
    the names of the op's values: `P_bar_masked`, `A_unscaled_bar`, `KG_bar_times_KG`,
    `minus_S_bar_from_vr`; a rule passes `name=` for each value it keeps, and what it returns as
    an operand's cotangent is renamed by derive-backward (`k_bar_from_P`). A name already in the
    block gets a counter (a value the rule makes again, such as the recomputed `A_unscaled` or
    `T_inverse`, which cse then makes once; xDSL drops a name's `_<digits>` ending)."""

    def __init__(self, block: Block, primal: dict[SSAValue, SSAValue]) -> None:
        self.block = block
        self.primal = primal
        self.names = Counter(r.name_hint for op in block.ops for r in op.results if r.name_hint)
        self.rule = "backward"  # the adjoint rule emitting now (accumulate_adjoints sets it)

    def name(self, op_type: type) -> str:
        """The name of a value no rule names: one it returns as a cotangent, which derive-backward
        renames after the operand it is the cotangent of."""
        return self.fresh(f"{self.rule}_{op_type.name.split('.')[-1]}")

    def fresh(self, base: str) -> str:
        self.names[base] += 1
        return base if self.names[base] == 1 else f"{base}{self.names[base]}"

    def __call__(self, value: SSAValue) -> SSAValue:
        return self.primal.get(value, value)  # an entry's argument is itself

    def emit(self, op_type: type, operands: list, result_type: Attribute, name: str | None = None, **props) -> SSAValue:
        op = make(op_type, operands=operands, result=(self.fresh(name) if name else self.name(op_type), result_type),
                  **props)
        self.block.add_op(op)
        return op.results[0]

    def like(self, op_type: type, operands: list, like: SSAValue, name: str | None = None, **props) -> SSAValue:
        return self.emit(op_type, operands, like.type, name, **props)

    def clone(self, op: Operation, operands: list[SSAValue], name: str | None = None, **props) -> SSAValue:
        """A forward stage again, on other operands (a linear stage applied to a cotangent)."""
        new = op.create(operands=operands, properties={**op.properties, **{k: v for k, v in props.items()}},
                        result_types=[r.type for r in op.results])
        return self.add_op(new, type(op), name)

    def add_op(self, new: Operation, kind: type, name: str | None = None) -> SSAValue:
        """A stage made elsewhere, added and its result named `name` (else as a `kind` of this rule)."""
        self.block.add_op(new)
        new.results[0].name_hint = self.fresh(name) if name else self.name(kind)
        return new.results[0]

    # tile algebra
    def add(self, a, b, name: str | None = None):
        return self.like(k3s.AddOp, [a, b], a, name)

    def sub(self, a, b, name: str | None = None):
        return self.like(k3s.SubOp, [a, b], a, name)

    def mul(self, a, b, name: str | None = None):
        return self.like(k3s.MulOp, [a, b], a, name)

    def neg(self, a, name: str | None = None):
        return self.like(k3s.NegOp, [a], a, name)

    def dot(self, a, b, transpose_lhs: bool = False, transpose_rhs: bool = False, accurate: bool = False,
            name: str | None = None):
        lhs, rhs = k3s.tile_dims(a), k3s.tile_dims(b)
        rows = lhs[-1] if transpose_lhs else lhs[0]
        cols = rhs[0] if transpose_rhs else rhs[-1]
        flags = {name: True for name, on in (("transpose_lhs", transpose_lhs), ("transpose_rhs", transpose_rhs),
                                             ("accurate", accurate)) if on}
        return self.emit(k3s.DotOp, [a, b], k3s.tile(rows, cols), name, **flags)

    def scale(self, a, factor, along: str, name: str | None = None):
        return self.like(k3s.ScaleOp, [a, factor], a, name, along=along)

    def reduce_sum(self, a, along: str, name: str | None = None):
        dims = k3s.tile_dims(a)
        return self.emit(k3s.ReduceSumOp, [a], k3s.tile(*{"rows": dims[:1], "columns": dims[-1:], "all": ()}[along]),
                         name, along=along)


def gate_scale_along(gate: str) -> str:
    """How a gate's per-chunk decay (gamma_C: <K> or <>) scales a state's rows."""
    return "rows" if gate == "channel" else "all"


def gate_cotangent(e: Emitter, product: SSAValue, gate: str) -> SSAValue:
    """The cotangent of a gate from the elementwise product (cotangent * value) of a <C x K> tile
    it decays: per channel as is, a scalar gate's summed over the channels."""
    return product if gate == "channel" else e.reduce_sum(product, "rows", f"{product.name_hint}_summed")


@adjoint(k3s.ChunkOutputOp)
def chunk_output(e: Emitter, op: k3s.ChunkOutputOp, o_bar):
    """o = scale (Q' S + P V')."""
    os_bar = e.scale(o_bar, e(op.scale), "all", f"{result_name(op)}_bar_scaled")
    return {op.queries: e.dot(os_bar, e(op.state), transpose_rhs=True),
            op.state: e.dot(e(op.queries), os_bar, transpose_lhs=True),
            op.scores: e.dot(os_bar, e(op.values), transpose_rhs=True),
            op.values: e.dot(e(op.scores), os_bar, transpose_lhs=True)}


@adjoint(k3s.StateAdvanceOp)
def state_advance(e: Emitter, op: k3s.StateAdvanceOp, S_bar):
    """S' = Diag(gamma_C) S + K'^T V'."""
    cot = {op.keys: e.dot(e(op.values), S_bar, transpose_rhs=True), op.values: e.dot(e(op.keys), S_bar)}
    if op.decay is None:
        return {op.state: S_bar, **cot}
    along = gate_scale_along(op.gate.data)
    decay_bar = e.reduce_sum(e.mul(S_bar, e(op.state), f"{result_name(op)}_bar_times_{op.state.name_hint}"), along)
    return {op.state: e.scale(S_bar, e(op.decay), along), **cot, op.decay: decay_bar}


@adjoint(k3s.DeltaResidualOp)
def delta_residual(e: Emitter, op: k3s.DeltaResidualOp, vr_bar):
    """vr = U - W S."""
    vr = result_name(op)
    cot = {op.state: e.neg(e.dot(e(op.keys_factor), vr_bar, transpose_lhs=True,
                                 name=f"minus_{op.state.name_hint}_bar_from_{vr}")),
           op.keys_factor: e.neg(e.dot(vr_bar, e(op.state), transpose_rhs=True,
                                       name=f"minus_{op.keys_factor.name_hint}_bar_from_{vr}"))}
    return {**cot, op.values_factor: vr_bar} if op.values_factor is not None else cot


@adjoint(k3s.ChunkDecayOp)
def chunk_decay(e: Emitter, op: k3s.ChunkDecayOp, decay_bar):
    """gamma_C = exp(G_C)."""
    return {op.total: e.mul(decay_bar, e(op.results[0]))}


@adjoint(k3s.GateApplyOp)
def gate_apply(e: Emitter, op: k3s.GateApplyOp, decayed_bar):
    """QG = Q exp(G) (anchor start); KG = K exp(G_C - G) (end): linear in the rows, whose
    cotangent is the same decay applied to the result's."""
    gate, decayed = op.gate.data, result_name(op)
    rows_bar = e.clone(op, [decayed_bar, *(e(v) for v in op.operands[1:])])
    times_decayed = e.mul(decayed_bar, e(op.decayed), f"{decayed}_bar_times_{decayed}")
    product = gate_cotangent(e, times_decayed, gate)
    if op.anchor.data == "start":
        return {op.rows: rows_bar, op.cumulative_gate: product}
    total_bar = e.reduce_sum(times_decayed, "columns" if gate == "channel" else "all")
    return {op.rows: rows_bar, op.cumulative_gate: e.neg(product), op.total: total_bar}


@adjoint(k3s.GateTotalOp)
def gate_total(e: Emitter, op: k3s.GateTotalOp, total_bar):
    """G_C = G at the chunk's last row."""
    return {op.cumulative_gate: e.like(k3s.OntoLastRowOp, [total_bar], op.cumulative_gate)}


@adjoint(k3s.GateCumsumOp)
def gate_cumsum(e: Emitter, op: k3s.GateCumsumOp, G_bar):
    """G_r = g_0 + ... + g_r."""
    return {op.log_gate: e.like(k3s.ReverseCumsumOp, [G_bar], G_bar)}


@adjoint(k3s.WYApplyOp)
def wy_apply(e: Emitter, op: k3s.WYApplyOp, factor_bar):
    """W = T (K exp(G)); U = T V."""
    gated, factor = op.cumulative_gate is not None, result_name(op)
    rows = e(op.rows)
    if gated:  # the rows as T multiplies them: K exp(G), the decay applied since the chunk's start
        rows = e.emit(k3s.GateApplyOp, [rows, e(op.cumulative_gate)], rows.type, f"{factor}_rows", anchor="start",
                      gate=op.gate.data)
    applied_bar = e.dot(e(op.transform), factor_bar, transpose_lhs=True, name=f"{factor}_bar_on_rows")
    cot = {op.transform: e.dot(factor_bar, rows, transpose_rhs=True)}
    if not gated:
        return {**cot, op.rows: applied_bar}
    rows_bar = e.emit(k3s.GateApplyOp, [applied_bar, e(op.cumulative_gate)], applied_bar.type, anchor="start",
                      gate=op.gate.data)
    product = e.mul(applied_bar, rows, f"{factor}_bar_on_rows_times_rows")
    return {**cot, op.rows: rows_bar, op.cumulative_gate: gate_cotangent(e, product, op.gate.data)}


@unscaled_form(k3s.ForwardSubstitutionOp)
def forward_substitution_unscaled(op: k3s.ForwardSubstitutionOp, primal: dict):
    """T = (I + A)^{-1} Diag(beta): the inverse, scaled along the columns."""
    T = op.results[0]
    inverse = make(k3s.UnitLowerInverseOp, operands=[primal[op.gram]], result=(f"{T.name_hint}_inverse", T.type),
                   block=op.block)
    return inverse, op.beta, "columns"


@adjoint(k3s.ForwardSubstitutionOp)
def forward_substitution(e: Emitter, op: k3s.ForwardSubstitutionOp, T_bar):
    """T = (I + A)^{-1} Diag(beta): with Y = (I + A)^{-T} T_bar, A_bar = -Y T^T on the entries the
    solve reads (the lower triangle and diagonal), beta_bar = diag(Y). Y is a product with the
    inverse the recomputed T is made of (derive-backward's recompute holds it as a value), not a
    substitution row after row; `accurate` (at least tf32), since diag(Y) is beta's cotangent as it is."""
    T, A = result_name(op), op.gram.name_hint
    inverse = e.like(k3s.UnitLowerInverseOp, [e(op.gram)], T_bar, f"{T}_inverse", block=op.block)
    Y = e.dot(inverse, T_bar, transpose_lhs=True, accurate=True, name=f"{T}_bar_solved")
    minus_unmasked = e.dot(Y, e(op.results[0]), transpose_rhs=True, name=f"minus_{A}_bar_unmasked")
    A_bar = e.like(k3s.MaskOp, [e.neg(minus_unmasked, f"{A}_bar_unmasked")], T_bar, mask="inclusive")
    return {op.gram: A_bar, op.beta: e.emit(k3s.DiagonalOp, [Y], e(op.beta).type)}


@unscaled_form(k3s.GramOp)
def gram_unscaled(op: k3s.GramOp, primal: dict):
    """A = Diag(beta) M: M, the Gram without beta, scaled along the rows."""
    if op.row_scale is None:
        return None
    A = op.results[0]
    M = op.rebuilt(lambda v: primal.get(v, v), row_scale=None, beta=False)
    M.results[0].name_hint = f"{A.name_hint}_unscaled"
    return M, op.row_scale, "rows"


@adjoint(k3s.GramOp)
def gram(e: Emitter, op: k3s.GramOp, gram_bar):
    """M = Mask(sum_c L_ic K_jc exp(G_ic - G_jc)), A = Diag(beta) M: the cotangent of M, masked
    as M is, is contracted against the keys (for L) and the rows (for the keys) under the same
    decays; G's is the rows' side minus the keys'."""
    gate, A = op.gate.data, result_name(op)  # A: the Gram's name, `A` (the keys') or `P` (the queries')
    lhs, keys = e(op.lhs), e(op.keys)
    M_bar = e.like(k3s.MaskOp, [gram_bar], gram_bar, f"{A}_bar_masked", mask=op.mask.data)
    cot = {}
    unscaled = None
    if op.row_scale is not None or gate == "scalar":  # M itself: the Gram without beta's rows
        unscaled = e.add_op(op.rebuilt(e, row_scale=None, beta=False), type(op), f"{A}_unscaled")
    if op.row_scale is not None:
        cot[op.row_scale] = e.reduce_sum(e.mul(gram_bar, unscaled, f"{A}_bar_times_unscaled"), "rows")
        M_bar = e.scale(M_bar, e(op.row_scale), "rows", f"{A}_unscaled_bar")
    on_rows, on_keys = f"{A}_bar_on_rows", f"{A}_bar_on_keys"  # M_bar contracted to the lhs's side, the keys'
    if gate == "none":
        lhs_bar, keys_bar = e.dot(M_bar, keys, name=on_rows), e.dot(M_bar, lhs, transpose_lhs=True, name=on_keys)
    elif gate == "scalar":
        decays = e.like(k3s.PairDecayOp, [e(op.cumulative_gate)], gram_bar, f"{A}_pair_decays", mask=op.mask.data)
        Z = e.mul(M_bar, decays, f"{A}_unscaled_bar_decayed")
        lhs_bar, keys_bar = e.dot(Z, keys, name=on_rows), e.dot(Z, lhs, transpose_lhs=True, name=on_keys)
        weighted = e.mul(M_bar, unscaled, f"{A}_unscaled_bar_times_unscaled")
        cot[op.cumulative_gate] = e.sub(e.reduce_sum(weighted, "rows", f"{A}_G_bar_rows"),
                                        e.reduce_sum(weighted, "columns", f"{A}_G_bar_keys"))
    else:
        # in the Gram's own diagonal form: factored only where its decays allow it
        G, guard = e(op.cumulative_gate), [e(op.factored_guard)] if op.factored_guard is not None else []
        form = op.diagonal.data
        lhs_bar = e.like(k3s.GatedContractionOp, [M_bar, keys, G, *guard], lhs, on_rows, side="rows", form=form)
        keys_bar = e.like(k3s.GatedContractionOp, [M_bar, lhs, G, *guard], keys, on_keys, side="keys", form=form)
        cot[op.cumulative_gate] = e.sub(e.mul(lhs_bar, lhs, f"{A}_G_bar_rows"),
                                        e.mul(keys_bar, keys, f"{A}_G_bar_keys"))
    if op.lhs is op.keys:  # the key Gram: both sides are k
        return {**cot, op.lhs: e.add(lhs_bar, keys_bar)}
    return {**cot, op.lhs: lhs_bar, op.keys: keys_bar}
