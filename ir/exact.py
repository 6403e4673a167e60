"""Exact-arithmetic semantics (sympy rationals) of the recurrence and of the k3s chunkwise
stages: the two sides of `k3c prove`.

Decays enter as multiplicative factors a = exp(g) in (0, 1), so that cumulative gates are exact
products (Gamma) and gate ratios exact quotients; the stages' log-space numerics are the
backend's business, not the schedule's algebra.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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

    def tokens(self, start: int, end: int, S0: Matrix | None = None) -> ExactInputs:
        """Tokens start..end-1 as a sequence of their own, from S0 (default: this one's)."""
        return ExactInputs(self.q[start:end, :], self.k[start:end, :], self.v[start:end, :], self.a[start:end, :],
                           self.beta[start:end], self.S0 if S0 is None else S0, self.scale)


def random_inputs(rng, length: int, K: int, V: int, gate: str, beta_max: int = 1) -> ExactInputs:
    """Random rationals for one value head; beta in (0, beta_max) (2: negative eigenvalues)."""
    def rational(low: int, high: int, den: int = 7) -> Rational:
        # nonzero numerators from a range 8x wider: a wrong schedule agrees with the recurrence
        # only at roots of their difference, which a wide draw hits rarely (Schwartz-Zippel); with
        # -5..5 a zero or orthogonal q_t, k_t at K = 2 hid a dropped diagonal about once in 300 seeds
        numerator = rng.choice([n for n in range(8 * low, 8 * high + 1) if n != 0])
        return Rational(numerator, rng.randint(1, den))

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
        beta=[beta_max * fraction() for _ in range(length)],
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


def gate_apply(op: k3s.GateApplyOp, c: Chunk, S: Matrix) -> Matrix:
    gamma = c["Gamma"]
    if op.operand.data == "q":
        c.values["QG"] = c.Q.multiply_elementwise(gamma)
    else:
        last = gamma[gamma.rows - 1, :]
        until_end = Matrix(gamma.rows, gamma.cols, lambda i, j: last[0, j] / gamma[i, j])
        c.values["KG"] = c.K.multiply_elementwise(until_end)
    return S


def chunk_decay(op, c: Chunk, S: Matrix) -> Matrix:
    gamma = c["Gamma"]
    c.values["gamma_C"] = gamma[gamma.rows - 1, :]
    return S


def delta_residual(op, c: Chunk, S: Matrix) -> Matrix:
    c.values["Vr"] = c["U"] - c["W"] * S
    return S


def chunk_output(op: k3s.ChunkOutputOp, c: Chunk, S: Matrix) -> Matrix:
    values = c["Vr"] if op.residual.value.data else c.V
    queries = c.Q if op.gate.data == "none" else c["QG"]
    c.values["O"] = c.scale * (queries * S + c["P"] * values)
    return S


def state_advance(op: k3s.StateAdvanceOp, c: Chunk, S: Matrix) -> Matrix:
    values = c["Vr"] if op.residual.value.data else c.V
    if op.gate.data == "none":
        return S + c.K.T * values
    return sympy.diag(*c["gamma_C"]) * S + c["KG"].T * values


STAGES = {
    k3s.GateCumsumOp: gate_cumsum,
    k3s.GramOp: gram,
    k3s.ForwardSubstitutionOp: forward_substitution,
    k3s.WYApplyOp: wy_apply,
    k3s.GateApplyOp: gate_apply,
    k3s.ChunkDecayOp: chunk_decay,
    k3s.DeltaResidualOp: delta_residual,
    k3s.ChunkOutputOp: chunk_output,
    k3s.StateAdvanceOp: state_advance,
}


def run_stages(chunked: k3s.ChunkedOp, stages: list, x: ExactInputs) -> tuple[list[Chunk], Matrix]:
    """Run `stages` of a k3s.chunked schedule chunk after chunk from x.S0. Returns (the chunks
    with their quantities, S_T)."""
    C = chunked.chunk_size.value.data
    S = x.S0
    chunks = []
    for start in range(0, x.q.rows, C):
        chunk = Chunk(x, start, min(start + C, x.q.rows))
        for stage in stages:
            S = STAGES[type(stage)](stage, chunk, S)
        chunks.append(chunk)
    return chunks, S


def run_chunked(chunked: k3s.ChunkedOp, x: ExactInputs) -> tuple[Matrix, Matrix]:
    """Interpret a k3s.chunked schedule on one head's sequence from x.S0. Returns (O [T, V], S_T)."""
    stages = [stage for region_op in chunked.body.ops for stage in region_op.body.ops]  # chunk_local, chunk_scan
    chunks, S = run_stages(chunked, stages, x)
    return Matrix.vstack(*(chunk["O"] for chunk in chunks)), S


# --- the speculative (verify + replay) schedule ----------------------------------------------
# A cache is a list of (k, decays, u) per token; cache_update ops append to the buffer they
# name, replay ops read theirs (k3s.cache_buffer).


class Token:
    """One token's registers while the token stages run."""

    def __init__(self, x: ExactInputs, t: int) -> None:
        self.q, self.k, self.v = x.q[t, :].T, x.k[t, :].T, x.v[t, :].T
        self.a, self.beta, self.scale = x.a[t, :], x.beta[t], x.scale
        self.o = None


def _token_stage(op, tok: Token, S: Matrix, buffers: dict[str, list]) -> Matrix:
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
        buffers.setdefault(k3s.cache_buffer(op), []).append((tok.k, tok.a, tok.v))
        return S
    raise TypeError(f"{op.name} is not a token stage")


def run_token_loop(loop: k3s.TokenLoopOp, x: ExactInputs, S: Matrix, buffers: dict[str, list]) -> tuple[Matrix, Matrix]:
    """x's tokens through the loop's stages from the state S: (O [T, V], the state after them)."""
    rows = []
    for t in range(x.q.rows):
        tok = Token(x, t)
        for stage in loop.body.ops:
            S = _token_stage(stage, tok, S, buffers)
        rows.append(tok.o)
    return Matrix.vstack(*rows), S


def run_verify(speculative: k3s.SpeculativeOp, x: ExactInputs) -> tuple[Matrix, Matrix, list]:
    """The verify pass: (O [n, V], S_n, the cache of (k, decays, u) per token)."""
    loop = next(op for op in speculative.body.ops if isinstance(op, k3s.TokenLoopOp))
    buffers: dict[str, list] = {}
    O, S = run_token_loop(loop, x, x.S0, buffers)
    return O, S, buffers.get("cache", [])


def replay(op: k3s.ReplayOp, S0: Matrix, cache: list, accepted: int) -> Matrix:
    """The replay stage: the state after the first `accepted` cached tokens, from S0."""
    K = S0.rows
    if op.gate.data == "none":
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


def run_replay(speculative: k3s.SpeculativeOp, S0: Matrix, cache: list, accepted: int) -> Matrix:
    """The schedule's replay stage on the cache of a verify pass."""
    return replay(next(op for op in speculative.body.ops if isinstance(op, k3s.ReplayOp)), S0, cache, accepted)


def run_pool_kernel(kernel: k3s.KernelOp, x: ExactInputs, buffers: dict[str, list], accepted: int,
                    workspaces: dict | None = None) -> tuple:
    """A lowered speculative kernel's stages in program order on one pool row that holds x.S0:
    replays read `accepted` tokens of their buffer, cache updates append to theirs; a chunk loop
    (the chunked verify) reloads what a prepare kernel spilled to `workspaces`. Returns (O of
    x's tokens, or None without a token or chunk loop; the row as the kernel leaves it)."""
    S, row, O = None, x.S0, None
    for op in kernel.body.ops:
        if isinstance(op, k3s.StateTileOp):
            S = x.S0
        elif isinstance(op, k3s.ReplayOp):
            S = replay(op, S, buffers.get(k3s.cache_buffer(op), []), accepted)
        elif isinstance(op, k3s.StoreStateOp):
            row = S
        elif isinstance(op, k3s.TokenLoopOp):
            O, S = run_token_loop(op, x, S, buffers)
        elif isinstance(op, k3s.ChunkLoopOp):
            O, S = run_chunk_loop(op, x, S, workspaces or {}, buffers)
        else:
            raise TypeError(f"{op.name} is not a stage of a pool kernel")
    return O, row


def run_prepare_kernel(kernel: k3s.KernelOp, x: ExactInputs, chunk_size: int, workspaces: dict) -> None:
    """A token-parallel chunk kernel (fuse-chunkwise's prepare, gram or wy) on x's chunks: its
    stages in program order; what it spills goes into `workspaces`, {(chunk start, name): value},
    and what it reloads must be there (an earlier kernel's spill)."""
    for start in range(0, x.q.rows, chunk_size):
        chunk = Chunk(x, start, min(start + chunk_size, x.q.rows))
        for op in kernel.body.ops:
            if isinstance(op, (k3s.ChunkTileOp, k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp)):
                continue
            if isinstance(op, k3s.SpillOp):
                workspaces[(start, op.value.data)] = chunk[op.value.data]
            elif isinstance(op, k3s.ReloadOp):
                chunk.values[op.value.data] = reloaded(workspaces, start, op.value.data)
            else:
                STAGES[type(op)](op, chunk, None)


def reloaded(workspaces: dict, start: int, name: str) -> Matrix:
    if (start, name) not in workspaces:
        raise IncompleteSchedule(f"a kernel reloads {name}, which no earlier kernel spilled")
    return workspaces[(start, name)]


def run_chunk_loop(loop: k3s.ChunkLoopOp, x: ExactInputs, S: Matrix, workspaces: dict,
                   buffers: dict[str, list]) -> tuple[Matrix, Matrix]:
    """A chunk loop of a lowered kernel from the state S: each chunk starts with only what it
    reloads from the workspaces; cache updates append the chunk's rows (k, decays, u = Vr or v)
    to their buffer. Returns (O of x's tokens, the state after them)."""
    C = loop.chunk_size.value.data
    outputs = []
    for start in range(0, x.q.rows, C):
        chunk = Chunk(x, start, min(start + C, x.q.rows))
        for op in loop.body.ops:
            if isinstance(op, (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp, k3s.StoreCheckpointOp)):
                continue
            if isinstance(op, k3s.ReloadOp):
                chunk.values[op.value.data] = reloaded(workspaces, start, op.value.data)
            elif isinstance(op, k3s.CacheUpdateOp):
                u = chunk["Vr"] if op.residual is not None and op.residual.value.data else chunk.V
                buffers.setdefault(k3s.cache_buffer(op), []).extend(
                    (chunk.K[i, :].T, chunk.decays[i, :], u[i, :].T) for i in range(chunk.K.rows))
            else:
                S = STAGES[type(op)](op, chunk, S)
        outputs.append(chunk["O"])
    return Matrix.vstack(*outputs), S


def run_lowered_entry(kernels: list, x: ExactInputs, buffers: dict[str, list] | None = None, accepted: int = 0) -> tuple:
    """A lowered entry's kernels in launch order on one sequence whose state (or pool row) starts
    at x.S0: the token-parallel kernels (a chunk tile, no state) fill the workspaces that later
    kernels reload; the last kernel owns the state (the chunk entry's scan, a speculative pool
    kernel). Returns run_pool_kernel's (O, the state as the entry leaves it)."""
    workspaces: dict = {}
    for kernel in kernels[:-1]:
        tile = next(op for op in kernel.body.ops if isinstance(op, k3s.ChunkTileOp))
        run_prepare_kernel(kernel, x, tile.chunk_size.value.data, workspaces)
    return run_pool_kernel(kernels[-1], x, buffers if buffers is not None else {}, accepted, workspaces)


# --- the segment-scan schedule (context parallelism) ----------------------------------------
# A summary is (M, N), M held in its transition form: full a K x K matrix, diagonal a K x 1
# column (the diagonal), scalar a number, identity None. M and N may also be symbols: the
# combine's algebra is the same (`k3c prove` checks its associativity that way).


def transition_apply(form: str, M, X):
    """M X, for M held in the given transition form."""
    if form == "identity":
        return X
    if form == "diagonal":
        return sympy.diag(*M) * X
    return M * X  # full, scalar


def segment_summary(scan: k3s.SegmentScanOp, x: ExactInputs) -> tuple:
    """The summary (M, N) of the token range x (x.S0 unused) as the segment_summary op states it:
    N by the chunked schedule's state pass from a zero state; a full M by the same pass on the
    state [M | N] from [I | 0] with values [0 | V]; a diagonal or scalar M the decays' product."""
    summary, _, chunked = scan.body.ops
    form = summary.transition.data
    K, V = x.k.cols, x.v.cols
    stages = k3s.state_pass(chunked)
    if form == "full":
        augmented = replace(x, v=Matrix.hstack(zeros(x.v.rows, K), x.v),
                                        S0=Matrix.hstack(eye(K), zeros(K, V)))
        MN = run_stages(chunked, stages, augmented)[1]
        return MN[:, :K], MN[:, K:]
    N = run_stages(chunked, stages, replace(x, S0=zeros(K, V)))[1]
    decays = Matrix(K, 1, lambda c, _: sympy.prod(x.a[:, c]))
    return {"diagonal": decays, "scalar": decays[0], "identity": None}[form], N


def apply_summary(form: str, summary: tuple, S: Matrix) -> Matrix:
    """The state after a segment from the state S before it: M S + N."""
    return transition_apply(form, summary[0], S) + summary[1]


def combine_summaries(combine: k3s.SummaryCombineOp, later: tuple, earlier: tuple) -> tuple:
    """(M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2) in the combine op's transition form."""
    (M2, N2), (M1, N1) = later, earlier
    form = combine.transition.data
    return transition_apply(form, M2, M1), transition_apply(form, M2, N1) + N2


def run_segment_scan(scan: k3s.SegmentScanOp, x: ExactInputs, cuts: list[int]) -> tuple[Matrix, Matrix]:
    """Interpret a k3s.segment_scan on one head's sequence cut before each token in `cuts`:
    every segment's summary; each segment's initial state, the combine of the summaries before
    it applied to x.S0; every segment finished by the chunked schedule from that state.
    Returns (O [T, V], the final state by the combine of all summaries)."""
    summary, combine, chunked = scan.body.ops
    edges = [0, *cuts, x.q.rows]
    prefix, outputs = None, []  # prefix: the combine of the summaries so far
    for start, end in zip(edges, edges[1:]):
        S = x.S0 if prefix is None else apply_summary(combine.transition.data, prefix, x.S0)
        outputs.append(run_chunked(chunked, x.tokens(start, end, S))[0])
        sigma = segment_summary(scan, x.tokens(start, end))
        prefix = sigma if prefix is None else combine_summaries(combine, sigma, prefix)
    return Matrix.vstack(*outputs), apply_summary(combine.transition.data, prefix, x.S0)
