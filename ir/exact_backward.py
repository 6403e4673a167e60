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
"""

from __future__ import annotations

from dataclasses import replace

import sympy
from sympy import Matrix, zeros
from sympy.matrices import MatrixBase

from k3compile.ir import k3s
from k3compile.ir.exact import SEMANTICS, ChunkRun, Chunk, ExactInputs, token_recurrence


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


@tile_semantics(k3s.TransposedSolveOp)
def transposed_solve(run, op, A: Matrix, X: Matrix) -> Matrix:
    n = A.rows
    unit_lower = Matrix(n, n, lambda i, j: (1 if i == j else 0) + (A[i, j] if j <= i else 0))
    return unit_lower.T.upper_triangular_solve(X)


@tile_semantics(k3s.StoreCotangentOp)
def store_cotangent(run, op: k3s.StoreCotangentOp, cotangent) -> None:
    """The run's buffers collect each input's cotangent rows by chunk: {input: {start: rows}}
    (the loads' input forms are the identity in exact arithmetic: inputs are given as meant)."""
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
                carry = run.run_block(op.body.block, (carry,))
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
