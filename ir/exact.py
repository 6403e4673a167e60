"""Exact-arithmetic semantics (sympy rationals) of the recurrence and of the k3s chunkwise
stages: the two sides of `k3c prove`.

Decays enter as multiplicative factors a = exp(g) in (0, 1), so that cumulative gates are exact
products (Gamma) and gate ratios exact quotients; the stages' log-space numerics are the
backend's business, not the schedule's algebra.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy import Matrix, Rational, eye, zeros

from k3compile.ir import k3s


class IncompleteSchedule(KeyError):
    """The schedule is missing a stage: some stage reads a quantity nothing produced."""

    def __str__(self) -> str:
        return self.args[0]


@dataclass
class ExactInputs:
    """One value head's sequence: q, k [T, K]; v [T, V]; decays a [T, K] (all ones without a
    gate, equal along K for a scalar gate); beta [T]; initial state S0 [K, V]; scale."""

    q: Matrix
    k: Matrix
    v: Matrix
    a: Matrix
    beta: list
    S0: Matrix
    scale: Rational


def random_inputs(rng, length: int, K: int, V: int, gate: str) -> ExactInputs:
    def rational(low: int, high: int, den: int = 7) -> Rational:
        return Rational(rng.randint(low, high), rng.randint(1, den))

    def fraction() -> Rational:  # in (0, 1)
        return Rational(rng.randint(1, 8), 9)

    if gate == "channel":
        a = Matrix(length, K, lambda t, c: fraction())
    elif gate == "scalar":
        rows = [fraction() for _ in range(length)]
        a = Matrix(length, K, lambda t, c: rows[t])
    else:
        a = sympy.ones(length, K)
    return ExactInputs(
        q=Matrix(length, K, lambda *_: rational(-5, 5)),
        k=Matrix(length, K, lambda *_: rational(-5, 5)),
        v=Matrix(length, V, lambda *_: rational(-5, 5)),
        a=a,
        beta=[fraction() for _ in range(length)],
        S0=Matrix(K, V, lambda *_: rational(-3, 3)),
        scale=Rational(1, 2),
    )


def token_recurrence(x: ExactInputs, delta_rule: bool) -> tuple[Matrix, Matrix]:
    """The definition, one token at a time: S <- Diag(a_t) S; u = beta (v - S^T k) (or v);
    S <- S + k u^T; o_t = S^T (scale q_t). Returns (O [T, V], S_T)."""
    S = x.S0
    rows = []
    for t in range(x.q.rows):
        k_t, v_t = x.k[t, :].T, x.v[t, :].T
        S = sympy.diag(*x.a[t, :]) * S
        u = x.beta[t] * (v_t - S.T * k_t) if delta_rule else v_t
        S = S + k_t * u.T
        rows.append((S.T * (x.scale * x.q[t, :].T)).T)
    return Matrix.vstack(*rows), S


# --- the chunkwise stages ------------------------------------------------------------------


class Chunk:
    """The named per-chunk quantities the stages read and write."""

    def __init__(self, x: ExactInputs, start: int, end: int) -> None:
        self.Q, self.K, self.V = x.q[start:end, :], x.k[start:end, :], x.v[start:end, :]
        self.decays = x.a[start:end, :]
        self.beta = x.beta[start:end]
        self.scale = x.scale
        self.values: dict[str, Matrix] = {}

    def __getitem__(self, name: str) -> Matrix:
        if name not in self.values:
            raise IncompleteSchedule(f"a stage reads {name}, which no earlier stage produced")
        return self.values[name]

    def gamma(self, op) -> Matrix:
        return self["Gamma"] if op.gate.data != "none" else sympy.ones(*self.K.shape)


def gate_cumsum(op, c: Chunk, S: Matrix) -> Matrix:
    gamma = c.decays.copy()
    for r in range(1, gamma.rows):
        gamma[r, :] = gamma[r - 1, :].multiply_elementwise(c.decays[r, :])
    c.values["Gamma"] = gamma
    return S


def gram(op: k3s.GramOp, c: Chunk, S: Matrix) -> Matrix:
    gamma = c.gamma(op)
    lhs = c.Q if op.lhs.data == "q" else c.K
    right = c.K.applyfunc(lambda x: x)  # copy
    for i in range(right.rows):
        for j in range(right.cols):
            right[i, j] = right[i, j] / gamma[i, j]
    M = lhs.multiply_elementwise(gamma) * right.T
    keep_diagonal = op.mask.data == "inclusive"
    M = Matrix(M.rows, M.cols, lambda i, j: M[i, j] if (j < i or (keep_diagonal and j == i)) else 0)
    if op.beta.value.data:
        M = sympy.diag(*c.beta) * M
    c.values["A" if op.lhs.data == "k" else "P"] = M
    return S


def forward_substitution(op, c: Chunk, S: Matrix) -> Matrix:
    A = c["A"]
    n = A.rows
    T = zeros(n, n)
    for i in range(n):  # row i of (I + A) T = Diag(beta), A lower triangular
        row = -sum((A[i, j] * T[j, :] for j in range(i)), zeros(1, n))
        row[0, i] += c.beta[i]
        T[i, :] = row / (1 + A[i, i])
    c.values["T"] = T
    return S


def wy_apply(op: k3s.WYApplyOp, c: Chunk, S: Matrix) -> Matrix:
    if op.operand.data == "key":
        c.values["W"] = c["T"] * c.K.multiply_elementwise(c.gamma(op))
    else:
        c.values["U"] = c["T"] * c.V
    return S


def delta_residual(op, c: Chunk, S: Matrix) -> Matrix:
    c.values["Vr"] = c["U"] - c["W"] * S
    return S


def chunk_output(op: k3s.ChunkOutputOp, c: Chunk, S: Matrix) -> Matrix:
    values = c["Vr"] if op.residual.value.data else c.V
    c.values["O"] = c.scale * (c.Q.multiply_elementwise(c.gamma(op)) * S + c["P"] * values)
    return S


def state_advance(op: k3s.StateAdvanceOp, c: Chunk, S: Matrix) -> Matrix:
    values = c["Vr"] if op.residual.value.data else c.V
    gamma = c.gamma(op)
    last = gamma[gamma.rows - 1, :]
    carried = Matrix(gamma.rows, gamma.cols, lambda i, j: last[0, j] / gamma[i, j])
    return sympy.diag(*last) * S + c.K.multiply_elementwise(carried).T * values


STAGES = {
    k3s.GateCumsumOp: gate_cumsum,
    k3s.GramOp: gram,
    k3s.ForwardSubstitutionOp: forward_substitution,
    k3s.WYApplyOp: wy_apply,
    k3s.DeltaResidualOp: delta_residual,
    k3s.ChunkOutputOp: chunk_output,
    k3s.StateAdvanceOp: state_advance,
}


def run_chunked(chunked: k3s.ChunkedOp, x: ExactInputs) -> tuple[Matrix, Matrix]:
    """Interpret a k3s.chunked schedule on one head's sequence. Returns (O [T, V], S_T)."""
    C = chunked.chunk_size.value.data
    S = x.S0
    outputs = []
    for start in range(0, x.q.rows, C):
        chunk = Chunk(x, start, min(start + C, x.q.rows))
        for region_op in chunked.body.ops:  # chunk_local, then chunk_scan
            for stage in region_op.body.ops:
                S = STAGES[type(stage)](stage, chunk, S)
        outputs.append(chunk["O"])
    return Matrix.vstack(*outputs), S


# --- the speculative (verify + replay) schedule ----------------------------------------------


class Token:
    """One token's registers while the token stages run."""

    def __init__(self, x: ExactInputs, t: int) -> None:
        self.q, self.k, self.v = x.q[t, :].T, x.k[t, :].T, x.v[t, :].T
        self.a, self.beta, self.scale = x.a[t, :], x.beta[t], x.scale
        self.o = None


def _token_stage(op, tok: Token, S: Matrix, cache: list) -> Matrix:
    if isinstance(op, (k3s.LoadTokenOp, k3s.LoadGateOp, k3s.LoadBetaOp)):
        return S  # inputs are given exactly; what a load does to them is not the schedule's algebra
    if isinstance(op, k3s.DecayOp):
        return sympy.diag(*tok.a) * S
    if isinstance(op, k3s.DeltaCorrectOp):
        tok.v = tok.beta * (tok.v - S.T * tok.k)
        return S
    if isinstance(op, k3s.Rank1UpdateOp):
        return S + tok.k * tok.v.T
    if isinstance(op, k3s.ReadoutOp):
        tok.o = (S.T * (tok.scale * tok.q)).T
        return S
    if isinstance(op, k3s.CacheUpdateOp):
        cache.append((tok.k, tok.a, tok.v))
        return S
    raise TypeError(f"{op.name} is not a token stage")


def run_verify(speculative: k3s.SpeculativeOp, x: ExactInputs) -> tuple[Matrix, Matrix, list]:
    """The verify pass: (O [n, V], S_n, the cache of (k, decays, u) per token)."""
    loop = next(op for op in speculative.body.ops if isinstance(op, k3s.TokenLoopOp))
    S, cache, rows = x.S0, [], []
    for t in range(x.q.rows):
        tok = Token(x, t)
        for stage in loop.body.ops:
            S = _token_stage(stage, tok, S, cache)
        rows.append(tok.o)
    return Matrix.vstack(*rows), S, cache


def run_replay(speculative: k3s.SpeculativeOp, S0: Matrix, cache: list, accepted: int) -> Matrix:
    """The replay stage: the state after the first `accepted` cached tokens."""
    replay = next(op for op in speculative.body.ops if isinstance(op, k3s.ReplayOp))
    K = S0.rows
    if replay.gate.data == "none":
        gamma = [sympy.ones(1, K) for _ in range(accepted + 1)]
    else:  # Gamma_j = product of the first j decays
        gamma = [sympy.ones(1, K)]
        for k_j, a_j, u_j in cache[:accepted]:
            gamma.append(gamma[-1].multiply_elementwise(a_j))
    S = sympy.diag(*gamma[accepted]) * S0
    for j, (k_j, a_j, u_j) in enumerate(cache[:accepted], start=1):
        ratio = [gamma[accepted][c] / gamma[j][c] for c in range(K)]
        S = S + sympy.diag(*ratio) * k_j * u_j.T
    return S
