"""Exact semantics of a backward schedule (k3s.chunked_backward) and the derivative it must equal.

The adjoint stages (ir/k3s/adjoint.py) get their meaning here, in sympy rationals as the forward
stages do in exact.py; their values take one form per tile type (a `<C>` tile a column, `<K>` a
row, `<>` a number), whatever form the forward stage that made an operand keeps. A gate's
cotangent is its log-space one (d/dg of exp(g) is exp(g)), which is rational since a decay is
held as its factor.

The other side of `k3c prove` for gradients is the token recurrence differentiated in forward
mode: the inputs moved along a direction d by a symbol t (a decay a by a (1 + t d), its log
moved by t d to first order), the recurrence run with every entry truncated to first order in t,
and the t coefficient of the loss <dO, O> + <dht, S_T> taken. A schedule's gradient G is right
where <G, d> equals it for a random rational d (Schwartz-Zippel again).

The stores' chain rules through the input forms (l2norm, the gate's and beta's forms) are the
last part: `store_gradients` is k3s.store_cotangent's meaning from the cotangent of a load's
result to the raw inputs' gradients, `load_result` the load's form, and `chain_rule_mismatches`
proves the first the derivative of the second, symbolically (the end of this file).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import sympy
from sympy import Matrix, zeros
from sympy.matrices import MatrixBase

from k3compile.checking.exact import SEMANTICS, ChunkRun, Chunk, ExactInputs, token_recurrence
from k3compile.ir import k3s


def canonical(value, dims: tuple[str, ...]):
    """value in the form of its tile type: `<>` a number, `<C>` a column, another `<X>` a row.
    Forward stages keep beta as a list, a scalar gate's G as equal columns per key channel and
    its G_C, gamma_C as a row of equal entries."""
    if isinstance(value, list):
        value = Matrix(value)
    if not isinstance(value, MatrixBase) or len(dims) > 1:
        return value
    if not dims:
        return value[0, 0]
    if dims[0] == "C":
        return value[:, 0]
    return value if value.rows == 1 else value.T


def tile_semantics(op_type: type):
    """Register f(run, op, *operands in canonical form) -> its result in canonical form."""
    def register(function):
        def run(run: ChunkRun, op, *values):
            tiles = [v for v in op.operands if isinstance(v.type, k3s.TileType)]
            return function(run, op, *(canonical(x, k3s.tile_dims(v)) for x, v in zip(values, tiles, strict=True)))

        SEMANTICS[op_type] = run
        return function

    return register


def entrywise(a, b, combine):
    if isinstance(a, MatrixBase):
        return Matrix(a.rows, a.cols, lambda i, j: combine(a[i, j], b[i, j]))
    return combine(a, b)


@tile_semantics(k3s.AddOp)
def add(run, op, a, b):
    return a + b


@tile_semantics(k3s.SubOp)
def sub(run, op, a, b):
    return a - b


@tile_semantics(k3s.MulOp)
def mul(run, op, a, b):
    return entrywise(a, b, lambda x, y: x * y)


@tile_semantics(k3s.NegOp)
def neg(run, op, a):
    return -a


@tile_semantics(k3s.DotOp)
def dot(run, op: k3s.DotOp, a: Matrix, b: Matrix) -> Matrix:
    flip = [bool(t and t.value.data) for t in (op.transpose_lhs, op.transpose_rhs)]
    return (a.T if flip[0] else a) * (b.T if flip[1] else b)


@tile_semantics(k3s.ScaleOp)
def scale(run, op: k3s.ScaleOp, x: Matrix, *factor) -> Matrix:
    f = factor[0] if factor else run.chunk.scale  # no tile: the entry's f32 scale
    along = op.along.data
    if along == "all":
        return x * f
    f = list(f)
    return Matrix(x.rows, x.cols, lambda i, j: x[i, j] * f[i if along == "rows" else j])


@tile_semantics(k3s.ReduceSumOp)
def reduce_sum(run, op: k3s.ReduceSumOp, x: Matrix):
    along = op.along.data
    if along == "all":
        return sum(x)
    sums = [sum(x[i, :]) for i in range(x.rows)] if along == "rows" else [sum(x[:, j]) for j in range(x.cols)]
    return canonical(sums, k3s.tile_dims(op.result))


@tile_semantics(k3s.MaskOp)
def mask(run, op: k3s.MaskOp, x: Matrix) -> Matrix:
    keep_diagonal = op.mask.data == "inclusive"
    return Matrix(x.rows, x.cols, lambda i, j: x[i, j] if j < i or (keep_diagonal and j == i) else 0)


@tile_semantics(k3s.DiagonalOp)
def diagonal(run, op, x: Matrix) -> Matrix:
    return Matrix([x[i, i] for i in range(x.rows)])


@tile_semantics(k3s.GatedContractionOp)
def gated_contraction(run, op: k3s.GatedContractionOp, M_bar: Matrix, rows: Matrix, gamma: Matrix) -> Matrix:
    """The same sum in every form (the guard only picks how a backend evaluates it); G is held as
    its factor exp(G), so exp(G_i - G_j) is gamma_i / gamma_j."""
    n, width = rows.shape
    if op.side.data == "rows":
        return Matrix(n, width, lambda i, c: sum(M_bar[i, j] * rows[j, c] * gamma[i, c] / gamma[j, c] for j in range(n)))
    return Matrix(n, width, lambda j, c: sum(M_bar[i, j] * rows[i, c] * gamma[i, c] / gamma[j, c] for i in range(n)))


@tile_semantics(k3s.PairDecayOp)
def pair_decay(run, op: k3s.PairDecayOp, gamma: Matrix) -> Matrix:
    keep_diagonal = op.mask.data == "inclusive"
    n = gamma.rows
    return Matrix(n, n, lambda i, j: gamma[i] / gamma[j] if j < i or (keep_diagonal and j == i) else 0)


@tile_semantics(k3s.ReverseCumsumOp)
def reverse_cumsum(run, op, x: Matrix) -> Matrix:
    return Matrix.vstack(*(Matrix.ones(1, x.rows - r) * x[r:, :] for r in range(x.rows)))


@tile_semantics(k3s.OntoLastRowOp)
def onto_last_row(run, op, x) -> Matrix:
    rows = run.chunk.Q.rows
    if not isinstance(x, MatrixBase):  # one number per row
        return Matrix([0] * (rows - 1) + [x])
    return Matrix.vstack(zeros(rows - 1, x.cols), x)


@tile_semantics(k3s.UnitLowerInverseOp)
def unit_lower_inverse(run, op, A: Matrix) -> Matrix:
    n = A.rows
    return Matrix(n, n, lambda i, j: (1 if i == j else 0) + (A[i, j] if j <= i else 0)).inv()


@tile_semantics(k3s.StoreCotangentOp)
def store_cotangent(run, op: k3s.StoreCotangentOp, cotangent) -> None:
    """The run's buffers collect the cotangent of each load's result by chunk: {input: {start:
    rows}}. A run's inputs are the loads' results (exact.py's loads are the identity), so this is
    the store on an input given as meant; what the store makes of it for a raw input of another
    form (l2norm, the gate's and beta's input forms) is `store_gradients`, proved on its own
    (`chain_rule_mismatches`)."""
    run.buffers.setdefault(op.of.data, {})[run.chunk.start] = cotangent


def run_backward(chunked: k3s.ChunkedBackwardOp, x: ExactInputs) -> dict[str, Matrix]:
    """Interpret a backward schedule on one head's sequence: every stage over all chunks before
    the next (the state scan chunk after chunk from x.S0, the cotangent scan from the last chunk
    back, from x.dht or zero). Returns each input's gradient ([T, K] for q, k and a channel gate's
    log decays, [T, V] for v, [T, 1] for beta and a scalar gate) and h0's ([K, V])."""
    buffers: dict = {}
    runs = []
    size = chunked.chunk_size.value.data
    for start in range(0, x.q.rows, size):
        run = ChunkRun(x, buffers=buffers)
        run.chunk = Chunk(x, start, min(start + size, x.q.rows))
        runs.append(run)
    gradients = {}
    for op in chunked.body.block.ops:
        if isinstance(op, (k3s.StateScanOp, k3s.CotangentScanOp)):
            forward = isinstance(op, k3s.StateScanOp)
            carry = x.S0 if forward else x.dht if x.dht is not None else zeros(*x.S0.shape)
            for run in runs if forward else reversed(runs):
                run.values[op.results[0]] = carry
                (carry,) = run.run_block(op.body.block, (carry,))
            if not forward:
                gradients["h0"] = carry
        else:
            for run in runs:
                run.run_op(op)
    for name, rows in buffers.items():
        gradients[name] = Matrix.vstack(*(rows[start] for start in sorted(rows)))
    return gradients


DIRECTION_NAMES = ("q", "k", "v", "g", "beta", "h0")


def loss_derivative(x: ExactInputs, delta_rule: bool, name: str, direction: Matrix):
    """d/dt at t = 0 of <x.do, O> + <x.dht, S_T> for the token recurrence on x with input `name`
    moved along `direction` (g: the log decays, [T, K] or a scalar gate's [T, 1]; beta [T, 1];
    h0 the initial state)."""
    t = sympy.Symbol("t")

    def first_order(entry):
        entry = sympy.expand(entry)
        return entry.coeff(t, 0) + t * entry.coeff(t, 1)

    moved = {
        "q": lambda: replace(x, q=x.q + t * direction),
        "k": lambda: replace(x, k=x.k + t * direction),
        "v": lambda: replace(x, v=x.v + t * direction),
        "g": lambda: replace(x, a=Matrix(x.a.rows, x.a.cols,
                                         lambda i, c: x.a[i, c] * (1 + t * direction[i, min(c, direction.cols - 1)]))),
        "beta": lambda: replace(x, beta=[b + t * direction[i, 0] for i, b in enumerate(x.beta)]),
        "h0": lambda: replace(x, S0=x.S0 + t * direction),
    }[name]()
    O, S = token_recurrence(moved, delta_rule, lambda M: M.applyfunc(first_order))
    loss = sum(O.multiply_elementwise(x.do)) + (sum(S.multiply_elementwise(x.dht)) if x.dht is not None else 0)
    return sympy.expand(loss).coeff(t, 1)


# --- the input forms: what a load makes of the raw inputs, what its store makes of the cotangent --
# exact.py's loads are the identity: the schedules' proofs give the inputs as the loads' results.
# Here are the forms themselves, as the kernels' loads apply them (backends/triton/printer/loads.py;
# ir/reference.py's recurrence_inputs in float64): q and k L2-normalised per row (with the kernels'
# epsilon under the root), the gate's log decay as given, clamped at its lower bound, -exp(A_log)
# softplus(g + dt_bias) or lower_bound sigmoid(exp(A_log) (g + dt_bias)), beta as given, sigmoid(beta)
# or 2 sigmoid(beta). And k3s.store_cotangent's meaning: the raw inputs' gradients from the cotangent
# of the load's result, by the chain rule each form's store applies (the same formulas as the
# printer's print_k3s_store_cotangent, written again here in sympy: the printer prints Triton text,
# and tests/test_prove_backward.py runs that text in float64 against these). Both take any sympy
# values: symbols for the proof (chain_rule_mismatches: the store's formulas equal sympy.diff of the
# load's form, simplified to zero, for all raw inputs), numbers for the tests. The kernels' softplus
# is z itself above z = 20 (as torch's), where its derivative sigmoid(z) is 1 to fp32's precision;
# here it is softplus everywhere.


def sigmoid(x):
    return 1 / (1 + sympy.exp(-x))


def softplus(x):
    return sympy.log(1 + sympy.exp(x))


EPSILON = sympy.Symbol("epsilon", nonnegative=True)  # the L2 norm's: the kernels' and reference's 1e-6, any here
IDENTITY_FORMS = ("as given", "log", "probability")


@dataclass(frozen=True)
class InputForm:
    """What a load does to the raw tensors it reads, as the load op or the store of its cotangent
    says: `of` the input (q, k, v, g, beta); `form` q's, k's and v's "l2norm" or "as given", the
    gate's input (log, clamped, softplus, bounded), beta's (probability, logits, logits_neg_eigval);
    `inputs` the raw tensors by name (g, A_log, dt_bias for softplus and bounded); the gate's lower
    bound (exact: the float's value) and whether it is a channel gate ([T, K] rows; a scalar gate's
    and beta's are a [T, 1] column)."""

    of: str
    form: str
    inputs: tuple[str, ...]
    lower_bound: sympy.Rational | None = None
    channel: bool = False  # a gate's

    def __str__(self) -> str:
        if self.form == "clamped":
            return f"clamped at {float(self.lower_bound):g}"
        if self.form == "bounded":
            return f"bounded by {float(self.lower_bound):g}"
        return self.form


def gate_form(of: str, form, inputs: tuple[str, ...], lower_bound, tile) -> InputForm:
    return InputForm(of, str(form), inputs, sympy.Rational(lower_bound.value.data), k3s.tile_dims(tile) == ("C", "K"))


def load_form(op) -> InputForm:
    """The input form of a k3s.load_chunk, load_gate or load_beta."""
    names = tuple(k3s.argument_name(t) for t in op.operands)
    if isinstance(op, k3s.LoadGateOp):
        return gate_form(names[0], op.input.data, names, op.lower_bound, op.log_gate)
    if isinstance(op, k3s.LoadBetaOp):
        return InputForm(names[0], str(op.input.data), names)
    return InputForm(names[0], "l2norm" if k3s.normalises(op) else "as given", names)


def store_form(op: k3s.StoreCotangentOp) -> InputForm:
    """The input form a k3s.store_cotangent takes its cotangent back through (its properties)."""
    names, of = tuple(k3s.argument_name(t) for t in op.inputs), op.of.data
    if of == "g":
        return gate_form(of, op.gate_input.data if op.gate_input else "log", names, op.lower_bound, op.cotangent)
    if of == "beta":
        return InputForm(of, str(op.beta_input.data) if op.beta_input else "probability", names)
    return InputForm(of, "l2norm" if op.l2norm is not None and op.l2norm.value.data else "as given", names)


def gate_argument(form: InputForm, raw: dict):
    """(z = g + dt_bias entrywise, a = exp(A_log)): dt_bias a [1, K] row for a channel gate, a
    number for a scalar one; A_log a number."""
    g, A_log, dt_bias = (raw[name] for name in form.inputs)
    z = Matrix(g.rows, g.cols, lambda t, c: g[t, c] + (dt_bias[c] if form.channel else dt_bias))
    return z, sympy.exp(A_log)


def load_result(form: InputForm, raw: dict, epsilon=EPSILON) -> Matrix:
    """The load's result (the rows the schedule reads) from the raw tensors raw = {name: value}."""
    x = raw[form.inputs[0]]
    if form.form in IDENTITY_FORMS:
        return x
    if form.form == "l2norm":
        return Matrix.vstack(*(x[t, :] / sympy.sqrt(x[t, :].dot(x[t, :]) + epsilon) for t in range(x.rows)))
    if form.form == "clamped":
        return x.applyfunc(lambda g: sympy.Max(g, form.lower_bound))
    if form.form == "logits":
        return x.applyfunc(sigmoid)
    if form.form == "logits_neg_eigval":
        return x.applyfunc(lambda b: 2 * sigmoid(b))
    z, a = gate_argument(form, raw)
    if form.form == "softplus":
        return z.applyfunc(lambda e: -a * softplus(e))
    if form.form == "bounded":
        return z.applyfunc(lambda e: form.lower_bound * sigmoid(a * e))
    raise ValueError(f"no input form {form.form!r} of {form.of}")


# The chain rules the stores apply, as the printer's print_k3s_store_cotangent computes them (one
# entry per form, so that a test can break one).


def l2norm_cotangent(x_bar: Matrix, x: Matrix, epsilon) -> Matrix:
    """x / |x| of a row x, |x| = sqrt(x . x + epsilon): (x_bar - u (u . x_bar)) / |x|, u = x / |x|."""
    norm = sympy.sqrt(x.dot(x) + epsilon)
    unit = x / norm
    return (x_bar - unit * unit.dot(x_bar)) / norm


def clamp_cotangent(x_bar, g, lower_bound):
    """max(g, bound): the cotangent where g >= bound, none below it (torch's clamp, which passes
    it at the bound too)."""
    return sympy.Piecewise((x_bar, g >= lower_bound), (0, True))


def softplus_derivatives(z, a, lower_bound):
    """g = -a softplus(z), a = exp(A_log): (dg/dz, dg/dA_log) = (-a sigmoid(z), g)."""
    return -a * sigmoid(z), -a * softplus(z)


def bounded_derivatives(z, a, lower_bound):
    """g = bound sigmoid(a z): (dg/dz, dg/dA_log) = (bound s (1 - s) a, that times z), s = sigmoid(a z)."""
    s = sigmoid(a * z)
    dz = lower_bound * s * (1 - s) * a
    return dz, dz * z


# the gate forms that read A_log and dt_bias: (z, a, lower bound) -> (dg/dz, dg/dA_log)
GATE_DERIVATIVES = {"softplus": softplus_derivatives, "bounded": bounded_derivatives}
# beta's forms: beta -> d(the loaded beta)/d(beta)
BETA_DERIVATIVES = {"logits": lambda b: sigmoid(b) * (1 - sigmoid(b)),
                    "logits_neg_eigval": lambda b: 2 * sigmoid(b) * (1 - sigmoid(b))}


def store_gradients(form: InputForm, cotangent: Matrix, raw: dict, epsilon=EPSILON) -> dict:
    """k3s.store_cotangent's meaning: {raw tensor's name: its gradient} from the cotangent of the
    load's result (its shape) and the raw tensors raw = {name: value} the load read. A_log's
    gradient is summed over the tile's entries, dt_bias's over its rows (per channel for a channel
    gate): one chunk's share, which the kernels add up over the chunks."""
    names = form.inputs
    x = raw[names[0]]
    if form.form in IDENTITY_FORMS:
        return {names[0]: cotangent}
    if form.form == "l2norm":
        return {names[0]: Matrix.vstack(*(l2norm_cotangent(cotangent[t, :], x[t, :], epsilon) for t in range(x.rows)))}
    if form.form == "clamped":
        return {names[0]: Matrix(x.rows, x.cols,
                                 lambda t, c: clamp_cotangent(cotangent[t, c], x[t, c], form.lower_bound))}
    if form.form in BETA_DERIVATIVES:
        return {names[0]: Matrix(x.rows, x.cols, lambda t, c: cotangent[t, c] * BETA_DERIVATIVES[form.form](x[t, c]))}
    if form.form not in GATE_DERIVATIVES:
        raise ValueError(f"no input form {form.form!r} of {form.of}")
    z, a = gate_argument(form, raw)
    derivatives = [[GATE_DERIVATIVES[form.form](z[t, c], a, form.lower_bound) for c in range(z.cols)]
                   for t in range(z.rows)]
    dg = Matrix(z.rows, z.cols, lambda t, c: cotangent[t, c] * derivatives[t][c][0])
    dA_log = sum(cotangent[t, c] * derivatives[t][c][1] for t in range(z.rows) for c in range(z.cols))
    ddt_bias = Matrix(1, dg.cols, lambda _, c: sum(dg[:, c])) if form.channel else sum(dg)
    return {names[0]: dg, names[1]: dA_log, names[2]: ddt_bias}


def form_derivative(form: InputForm, cotangent: Matrix, raw: dict, epsilon=EPSILON) -> dict:
    """The other side: {raw tensor's name: sum_j cotangent_j d(load result)_j / d(its entry)}, by
    sympy.diff of load_result on raw symbols. The clamp's derivative at its bound (where max(g,
    bound) has none) is taken as torch's clamp takes it: from above (Heaviside(0) = 1)."""
    loaded = load_result(form, raw, epsilon)

    def gradient(entry):
        total = sum(cotangent[j] * sympy.diff(loaded[j], entry) for j in range(len(loaded)))
        return total.replace(sympy.Heaviside, lambda arg, *_: sympy.Heaviside(arg, 1))

    return {name: raw[name].applyfunc(gradient) if isinstance(raw[name], MatrixBase) else gradient(raw[name])
            for name in form.inputs}


# the raw tiles a chain rule is proved on: (rows, channels); a gate's rows lie above, below and
# at the clamp's bound, one side each
FORM_TILE = {"q": (2, 3), "k": (2, 3), "v": (2, 2), "g": (3, 2), "beta": (3, 1)}


def symbolic_inputs(form: InputForm) -> tuple[dict, Matrix, dict]:
    """(raw: {name: real symbols in its shape}, the cotangent of the load's result as symbols, the
    substitutions that put a clamped gate's rows above, below and at its bound (none otherwise))."""
    rows, channels = FORM_TILE[form.of]
    cols = channels if form.of in ("q", "k", "v") or (form.of == "g" and form.channel) else 1

    def tile(name: str, rows: int, cols: int) -> Matrix:
        return Matrix(rows, cols, lambda t, c: sympy.Symbol(f"{name}_{t}{c}", real=True))

    raw = {form.inputs[0]: tile(form.inputs[0], rows, cols)}
    if len(form.inputs) == 3:  # A_log, dt_bias
        raw[form.inputs[1]] = sympy.Symbol(form.inputs[1], real=True)
        raw[form.inputs[2]] = tile(form.inputs[2], 1, cols) if form.channel else sympy.Symbol(form.inputs[2], real=True)
    cases = {}
    if form.form == "clamped":
        x = raw[form.inputs[0]]
        for t in range(rows):
            for c in range(cols):
                distance = sympy.Symbol(f"delta_{t}{c}", positive=True)
                cases[x[t, c]] = form.lower_bound + [distance, -distance, 0][t % 3]
    return raw, tile(f"{form.of}_bar", rows, cols), cases


def chain_rule_mismatches(store: InputForm, load: InputForm) -> list[str]:
    """The claim of `k3c prove`'s input-form rows: the store's chain rule equals the derivative of
    its load's form, for symbolic raw inputs and cotangent (all values; a clamped gate's on each side
    of its bound and at it) and a symbolic L2-norm epsilon: store_gradients - form_derivative
    simplifies to zero for every raw tensor the load reads. Returns how it fails, naming each
    gradient that differs ("dA_log differs"), or nothing."""
    if store.inputs != load.inputs:
        return [f"the store writes the gradients of {', '.join(store.inputs)}, the load reads {', '.join(load.inputs)}"]
    if (store.of, store.channel) != (load.of, load.channel):
        return [f"the store takes the cotangent of a {'channel' if store.channel else 'scalar'} {store.of}, the load "
                f"makes a {'channel' if load.channel else 'scalar'} {load.of}"]
    raw, cotangent, cases = symbolic_inputs(load)
    try:
        got = store_gradients(store, cotangent, raw)
    except (KeyError, ValueError) as err:  # a form the store does not know
        return [f"d{store.of}: {err}"]
    want = form_derivative(load, cotangent, raw)
    differ = []
    for name, expected in want.items():
        difference = got[name] - expected
        verdicts = [vanishes(e, cases) for e in (difference if isinstance(difference, MatrixBase) else [difference])]
        if False in verdicts:
            differ.append(f"d{name} differs")
        elif None in verdicts:
            differ.append(f"d{name} not shown equal (sympy.simplify left a difference)")
    return differ


def vanishes(expression, cases: dict) -> bool | None:
    """Whether expression (after the substitutions `cases`) is identically zero: True where
    sympy.simplify makes it 0; False where it is not 0 at a random point of its symbols (evaluated
    to 50 digits: a witness, and much faster than simplify on what does not vanish); None where
    neither (simplify left a difference that vanishes, or is not finite, at the point: not proved)."""
    expression = sympy.sympify(expression).subs(cases)
    if expression == 0:
        return True
    rng = random.Random(str(expression))  # the same point for the same expression, run after run
    # entries of at most 3/2: the sigmoids and softplus of the gates' forms stay far from saturating
    point = {s: sympy.Rational(rng.randint(1, 12), 8) * (1 if s.is_nonnegative or rng.random() < .5 else -1)
             for s in expression.free_symbols}
    value = expression.xreplace(point).evalf(50)
    if value.is_number and value.is_finite and abs(value) > sympy.Float("1e-30", 50):
        return False
    return True if sympy.simplify(expression) == 0 else None
