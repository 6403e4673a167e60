"""Exact-arithmetic semantics (sympy rationals) of the recurrence and of the k3s chunkwise
stages: the two sides of `k3c prove`.

Decays enter as multiplicative factors a = exp(g) in (0, 1), so that cumulative gates are exact
products (Gamma) and gate ratios exact quotients; the stages' log-space numerics are the
backend's business, not the schedule's algebra.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import sympy
from sympy import Matrix, Rational, eye, zeros
from xdsl.ir import Block, SSAValue
from xdsl.traits import IsTerminator

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
    # how the schedule's run-time checks (k3s.block_span_check) come out: None as the decays
    # say, True or False in every chunk (a proof of a guarded schedule takes both)
    guards: bool | None = None
    # a backward schedule's cotangents of the outputs O [T, V] and of the final state [K, V]
    do: Matrix | None = None
    dht: Matrix | None = None

    def tokens(self, start: int, end: int, S0: Matrix | None = None) -> ExactInputs:
        """Tokens start..end-1 as a sequence of their own, from S0 (default: this one's)."""
        return replace(self, q=self.q[start:end, :], k=self.k[start:end, :], v=self.v[start:end, :],
                       a=self.a[start:end, :], beta=self.beta[start:end], S0=self.S0 if S0 is None else S0,
                       do=None if self.do is None else self.do[start:end, :])


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


def token_recurrence(x: ExactInputs, delta_rule: bool, settle: Callable[[Matrix], Matrix] | None = None
                     ) -> tuple[Matrix, Matrix]:
    """The definition, one token at a time: S <- Diag(a_t) S; u = beta (v - S^T k) (or v);
    S <- S + k u^T; o_t = S^T (scale q_t). Returns (O [T, V], S_T). `settle` is applied to the
    state and each output row as they are made (a truncation of symbolic entries)."""
    settle = settle or (lambda M: M)
    S = x.S0
    rows = []
    for t in range(x.q.rows):
        k_t, v_t = x.k[t, :].T, x.v[t, :].T
        S = sympy.diag(*x.a[t, :]) * S
        u = x.beta[t] * (v_t - S.T * k_t) if delta_rule else v_t
        S = settle(S + k_t * u.T)
        rows.append(settle((S.T * (x.scale * x.q[t, :].T)).T))
    return Matrix.vstack(*rows), S


# --- the chunkwise stages ------------------------------------------------------------------
# Each chunk op's exact meaning, as a function of its operands' values (one per op type, in the
# manner of xDSL's interpreter functions); a ChunkRun walks a block of them for one chunk.


class Chunk:
    """The exact inputs of one chunk: what its loads read."""

    def __init__(self, x: ExactInputs, start: int, end: int) -> None:
        self.start = start
        self.Q, self.K, self.V = x.q[start:end, :], x.k[start:end, :], x.v[start:end, :]
        self.dO = None if x.do is None else x.do[start:end, :]
        self.decays = x.a[start:end, :]
        self.beta = x.beta[start:end]
        self.scale = x.scale


SEMANTICS: dict[type, Callable] = {}


def semantics(op_type: type) -> Callable:
    """Register the exact meaning of an op type: f(run, op, *operand values) -> its result (or
    None for an op without one)."""
    def register(function: Callable) -> Callable:
        SEMANTICS[op_type] = function
        return function

    return register


class ChunkRun:
    """Runs chunk ops on x's chunks: the values of the block being run, what spills left in
    `workspaces` ({(chunk start, name): value}), the outputs of the chunks and the cache rows."""

    def __init__(self, x: ExactInputs, workspaces: dict | None = None, buffers: dict | None = None) -> None:
        self.x = x
        self.workspaces = {} if workspaces is None else workspaces
        self.buffers = {} if buffers is None else buffers
        self.values: dict[SSAValue, object] = {}
        self.outputs: list[Matrix] = []
        self.chunk: Chunk | None = None
        self.state: Matrix | None = None  # the carried state between a schedule's chunks (chunk_scan)

    def value(self, value: SSAValue):
        if isinstance(value.type, k3s.TensorType):  # an entry's tensor: stages read and write it by name
            return k3s.argument_name(value)
        if value not in self.values:
            raise IncompleteSchedule(f"a stage reads {value.name_hint}, which no earlier stage produced")
        return self.values[value]

    def run_block(self, block: Block, args: tuple = ()) -> tuple:
        """The block's ops in order; returns what its terminator passes on (none without one). An op's
        semantics takes its tile operands' values; the tensors it reads or writes (an entry's
        arguments) are memory, which the run stands for (its chunk, outputs and buffers)."""
        self.values.update(zip(block.args, args))
        for op in block.ops:
            if op.has_trait(IsTerminator):  # next_chunk, next_token: the carried values passed on
                return tuple(self.value(v) for v in op.operands)
            self.run_op(op)
        return ()

    def run_op(self, op) -> None:
        if type(op) not in SEMANTICS:
            raise TypeError(f"{op.name} has no exact semantics")
        tiles = (v for v in op.operands if isinstance(v.type, k3s.TileType))
        result = SEMANTICS[type(op)](self, op, *(self.value(v) for v in tiles))
        if len(op.results) == 1:
            self.values[op.results[0]] = result
        else:  # an op of several results returns them in order
            self.values.update(zip(op.results, result or (), strict=True))

    def chunks(self, size: int):
        for start in range(0, self.x.q.rows, size):
            self.chunk = Chunk(self.x, start, min(start + size, self.x.q.rows))
            yield self.chunk

    def run_chunked(self, chunked: k3s.ChunkedOp, S: Matrix) -> Matrix:
        """Every chunk through the schedule from the state S; returns the state after the last."""
        for _ in self.chunks(chunked.chunk_size.value.data):
            self.state = S
            self.run_block(chunked.body.block)
            S = self.state
        return S


def token_rows(run: ChunkRun, op: k3s.LoadChunkOp | k3s.LoadTokenOp) -> Matrix:
    """The chunk's rows of the tensor a load reads, by the argument's name: q, k, v or (a backward schedule's) do."""
    return {"q": run.chunk.Q, "k": run.chunk.K, "v": run.chunk.V, "do": run.chunk.dO}[k3s.argument_name(op.tensor)]


@semantics(k3s.LoadChunkOp)
def load_chunk(run: ChunkRun, op):
    return token_rows(run, op)


@semantics(k3s.LoadGateOp)
def load_gate(run: ChunkRun, op):  # the decays as factors a = exp(g): inputs are given exactly
    return run.chunk.decays


@semantics(k3s.LoadBetaOp)
def load_beta(run: ChunkRun, op):
    return run.chunk.beta


@semantics(k3s.GateCumsumOp)
def gate_cumsum(run: ChunkRun, op, decays: Matrix) -> Matrix:
    gamma = decays.copy()
    for r in range(1, gamma.rows):
        gamma[r, :] = gamma[r - 1, :].multiply_elementwise(decays[r, :])
    return gamma


@semantics(k3s.BlockGatesOp)
def block_gates(run: ChunkRun, op: k3s.BlockGatesOp, gamma: Matrix) -> tuple[Matrix, Matrix]:
    """(Gamma just before each row block, Gamma at its last row): a partial last block ends at
    the chunk's last row, as rows past a sequence's end add no decay."""
    sub = op.sub_chunk.value.data
    blocks = -(-gamma.rows // sub)
    end = Matrix.vstack(*(gamma[min((b + 1) * sub, gamma.rows) - 1, :] for b in range(blocks)))
    start = Matrix.vstack(sympy.ones(1, gamma.cols), *(end[b, :] for b in range(blocks - 1)))
    return start, end


def block_of(reference: SSAValue) -> int:
    """The rows per block of a block_gates result."""
    return reference.owner.sub_chunk.value.data


@semantics(k3s.BlockRescaleOp)
def block_rescale(run: ChunkRun, op: k3s.BlockRescaleOp, rows: Matrix, gamma: Matrix, reference: Matrix) -> Matrix:
    sub = block_of(op.reference)
    if op.decay.data == "row_over_reference":
        return Matrix(rows.rows, rows.cols, lambda i, c: rows[i, c] * gamma[i, c] / reference[i // sub, c])
    return Matrix(rows.rows, rows.cols, lambda i, c: rows[i, c] * reference[i // sub, c] / gamma[i, c])


@semantics(k3s.BlockSpanCheckOp)
def block_span_check(run: ChunkRun, op: k3s.BlockSpanCheckOp, start: Matrix, end: Matrix) -> bool:
    """Whether no block spans more than `limit` nats of decay (Gamma_start / Gamma_end <= e^limit),
    unless the run decides every guard one way (ExactInputs.guards: a proof takes both)."""
    if run.x.guards is not None:
        return run.x.guards
    bound = sympy.exp(sympy.Float(op.limit.value.data))
    return all(start[b, c] / end[b, c] <= bound for b in range(start.rows) for c in range(start.cols))


@semantics(k3s.GramOp)
def gram(run: ChunkRun, op: k3s.GramOp, lhs: Matrix, keys: Matrix, *rest) -> Matrix:
    keep_diagonal = op.mask.data == "inclusive"
    if op.gate.data == "channel":  # as the factors say: the bridge below the diagonal, then the diagonal
        gamma, start, end, left, right = rest[:5]
        sub = block_of(op.gate_start)
        diagonal = op.diagonal.data
        factored = diagonal == "factored" or (diagonal == "guarded" and run.value(op.factored_guard))

        def entry(i: int, j: int):
            if j > i or (j == i and not keep_diagonal):
                return 0
            if i // sub > j // sub:
                return sum(left[i, c] * right[j, c] * start[i // sub, c] / end[j // sub, c] for c in range(keys.cols))
            if factored:
                return sum(left[i, c] * rest[5][j, c] for c in range(keys.cols))
            return sum(lhs[i, c] * keys[j, c] * gamma[i, c] / gamma[j, c] for c in range(keys.cols))

        M = Matrix(lhs.rows, keys.rows, entry)
    else:
        gamma = rest[0] if op.cumulative_gate is not None else sympy.ones(*keys.shape)
        right = Matrix(keys.rows, keys.cols, lambda i, j: keys[i, j] / gamma[i, j])
        M = lhs.multiply_elementwise(gamma) * right.T
        M = Matrix(M.rows, M.cols, lambda i, j: M[i, j] if (j < i or (keep_diagonal and j == i)) else 0)
    return sympy.diag(*rest[-1]) * M if op.row_scale is not None else M


@semantics(k3s.ForwardSubstitutionOp)
def forward_substitution(run: ChunkRun, op, A: Matrix, beta: list) -> Matrix:
    n = A.rows
    T = zeros(n, n)
    for i in range(n):  # row i of (I + A) T = Diag(beta), A lower triangular
        row = -sum((A[i, j] * T[j, :] for j in range(i)), zeros(1, n))
        row[0, i] += beta[i]
        T[i, :] = row / (1 + A[i, i])
    return T


@semantics(k3s.WYApplyOp)
def wy_apply(run: ChunkRun, op, T: Matrix, rows: Matrix, gamma: Matrix | None = None) -> Matrix:
    return T * (rows if gamma is None else rows.multiply_elementwise(gamma))


@semantics(k3s.GateTotalOp)
def gate_total(run: ChunkRun, op, gamma: Matrix) -> Matrix:
    return gamma[gamma.rows - 1, :]


@semantics(k3s.GateApplyOp)
def gate_apply(run: ChunkRun, op: k3s.GateApplyOp, rows: Matrix, gamma: Matrix, total: Matrix | None = None) -> Matrix:
    if op.anchor.data == "start":
        return rows.multiply_elementwise(gamma)
    return rows.multiply_elementwise(Matrix(gamma.rows, gamma.cols, lambda i, j: total[0, j] / gamma[i, j]))


@semantics(k3s.ChunkDecayOp)
def chunk_decay(run: ChunkRun, op, total: Matrix) -> Matrix:  # exp(G_C): the decays are already factors
    return total


@semantics(k3s.ChunkScanOp)
def chunk_scan(run: ChunkRun, op: k3s.ChunkScanOp) -> None:
    (run.state,) = run.run_block(op.body.block, (run.state,))


@semantics(k3s.DeltaResidualOp)
def delta_residual(run: ChunkRun, op, S: Matrix, W: Matrix, U: Matrix | None = None) -> Matrix:
    return (zeros(W.rows, S.cols) if U is None else U) - W * S


@semantics(k3s.ChunkOutputOp)
def chunk_output(run: ChunkRun, op, queries: Matrix, S: Matrix, P: Matrix, values: Matrix) -> Matrix:
    run.outputs.append(run.chunk.scale * (queries * S + P * values))
    return run.outputs[-1]


@semantics(k3s.StateAdvanceOp)
def state_advance(run: ChunkRun, op, S: Matrix, keys: Matrix, values: Matrix, decay: Matrix | None = None) -> Matrix:
    return (S if decay is None else sympy.diag(*decay) * S) + keys.T * values


@semantics(k3s.SpillOp)
def spill(run: ChunkRun, op: k3s.SpillOp, tile) -> None:
    run.workspaces[(run.chunk.start, k3s.argument_name(op.workspace))] = tile


@semantics(k3s.ReloadOp)
def reload(run: ChunkRun, op: k3s.ReloadOp):
    workspace = k3s.argument_name(op.workspace)
    key = (run.chunk.start, workspace)
    if key not in run.workspaces:
        raise IncompleteSchedule(f"a kernel reloads {op.tile.name_hint}, which no earlier kernel spilled "
                                 f"to {workspace}")
    return run.workspaces[key]


@semantics(k3s.CacheUpdateOp)
def cache_update(run: ChunkRun, op: k3s.CacheUpdateOp, keys: Matrix, updates: Matrix, *gate) -> None:
    """The rows of k, the decays and u (per token: beta (v - S^T k) or v; per chunk: vr or v)
    appended to the op's buffer, one (k, decays, u) per token."""
    decays = run.chunk.decays
    run.buffers.setdefault(k3s.argument_name(op.cache), []).extend(
        (keys[i, :].T, decays[i, :], updates[i, :].T) for i in range(keys.rows))


@semantics(k3s.StoreCheckpointOp)
def store_checkpoint(run: ChunkRun, op, S: Matrix) -> None:
    """Prefix caching's copy of the state: nothing the schedule's algebra reads."""


def run_chunked(chunked: k3s.ChunkedOp, x: ExactInputs) -> tuple[Matrix, Matrix]:
    """Interpret a k3s.chunked schedule on one head's sequence from x.S0. Returns (O [T, V], S_T)."""
    run = ChunkRun(x)
    S = run.run_chunked(chunked, x.S0)
    return Matrix.vstack(*run.outputs), S


# --- the speculative (verify + replay) schedule ----------------------------------------------
# A cache is a list of (k, decays, u) per token; cache_update ops append to the buffer they
# name (their cache operand's, k3s.argument_name), replay ops read theirs.


# The token stages run as one-token chunks: a token's q, k, v are rows, its beta a list of one.


@semantics(k3s.LoadTokenOp)
def load_token(run: ChunkRun, op):
    return token_rows(run, op)


@semantics(k3s.DecayOp)
def decay(run: ChunkRun, op, S: Matrix, decays: Matrix) -> Matrix:
    return sympy.diag(*decays) * S


@semantics(k3s.DeltaCorrectOp)
def delta_correct(run: ChunkRun, op, S: Matrix, k: Matrix, v: Matrix, beta: list) -> Matrix:
    return beta[0] * (v - k * S)


@semantics(k3s.Rank1UpdateOp)
def rank1_update(run: ChunkRun, op, S: Matrix, k: Matrix, u: Matrix) -> Matrix:
    return S + k.T * u


@semantics(k3s.ReadoutOp)
def readout(run: ChunkRun, op, S: Matrix, q: Matrix) -> Matrix:
    run.outputs.append(run.chunk.scale * q * S)
    return run.outputs[-1]


def run_token_loop(loop: k3s.TokenLoopOp, x: ExactInputs, S: Matrix, buffers: dict[str, list]) -> tuple[Matrix, Matrix]:
    """x's tokens through the loop's stages from the state S: (O [T, V], the state after them)."""
    run = ChunkRun(x, buffers=buffers)
    for _ in run.chunks(1):
        (S,) = run.run_block(loop.body.block, (S,))
    return Matrix.vstack(*run.outputs), S


def run_verify(speculative: k3s.SpeculativeOp, x: ExactInputs) -> tuple[Matrix, Matrix, list]:
    """The verify pass: (O [n, V], S_n, the cache of (k, decays, u) per token that the
    schedule's replay reads)."""
    loop = next(op for op in speculative.body.ops if isinstance(op, k3s.TokenLoopOp))
    replayed = next(op for op in speculative.body.ops if isinstance(op, k3s.ReplayOp))
    buffers: dict[str, list] = {}
    O, S = run_token_loop(loop, x, x.S0, buffers)
    return O, S, buffers.get(k3s.argument_name(replayed.cache), [])


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
    states, row, O = {}, x.S0, None  # the kernel's state values
    for op in kernel.body.ops:
        if isinstance(op, k3s.StateTileOp):
            states[op.state] = x.S0
        elif isinstance(op, k3s.ReplayOp):
            states[op.replayed] = replay(op, states[op.state], buffers.get(k3s.argument_name(op.cache), []), accepted)
        elif isinstance(op, k3s.StoreStateOp):
            row = states[op.state]
        elif isinstance(op, k3s.TokenLoopOp):
            O, states[op.final] = run_token_loop(op, x, states[op.initial], buffers)
        elif isinstance(op, k3s.ChunkLoopOp):
            O, final = run_chunk_loop(op, x, tuple(states[v] for v in op.initial), workspaces or {}, buffers)
            states.update(zip(op.final, final, strict=True))
        else:
            raise TypeError(f"{op.name} is not a stage of a pool kernel")
    return O, row


@semantics(k3s.ChunkTileOp)
def chunk_tile(run: ChunkRun, op) -> None:
    """Which rows a program owns: the chunk being run."""


@semantics(k3s.WhenOp)
def when(run: ChunkRun, op: k3s.WhenOp) -> None:
    """Its stages, if its kernel's launch turns its flag on (the summary prepare's does not)."""
    if op.is_on():
        run.run_block(op.body.block)


@semantics(k3s.FlagOp)
def flag(run: ChunkRun, op: k3s.FlagOp) -> bool:
    """Whether its kernel's launch sets its flag as it asks."""
    return op.is_on()


def run_prepare_kernel(kernel: k3s.KernelOp, x: ExactInputs, chunk_size: int, workspaces: dict) -> None:
    """A token-parallel chunk kernel (fuse-chunkwise's prepare, gram or wy) on x's chunks: its
    ops in program order, but the guarded ones its launch skips; what it spills goes into
    `workspaces`, {(chunk start, name): value}, and what it reloads must be there (an earlier
    kernel's spill)."""
    run = ChunkRun(x, workspaces)
    for _ in run.chunks(chunk_size):
        run.run_block(kernel.body.block)


def run_chunk_loop(loop: k3s.ChunkLoopOp, x: ExactInputs, carried: tuple, workspaces: dict,
                   buffers: dict[str, list]) -> tuple[Matrix, tuple]:
    """A chunk loop of a lowered kernel from its carried values (the state first): each chunk
    starts with only what it reloads from the workspaces and loads; cache updates append the
    chunk's rows to their buffer. Returns (O of x's tokens, the carried values after them)."""
    run = ChunkRun(x, workspaces, buffers)
    for _ in run.chunks(loop.chunk_size.value.data):
        carried = run.run_block(loop.body.block, carried)
    return Matrix.vstack(*run.outputs), carried


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
    N the state the chunked schedule leaves from a zero state; a full M by the same schedule on
    the state [M | N] from [I | 0] with values [0 | V]; a diagonal or scalar M the decays' product."""
    summary, _, chunked = scan.body.ops
    form = summary.transition.data
    K, V = x.k.cols, x.v.cols
    if form == "full":
        augmented = replace(x, v=Matrix.hstack(zeros(x.v.rows, K), x.v),
                                        S0=Matrix.hstack(eye(K), zeros(K, V)))
        MN = run_chunked(chunked, augmented)[1]
        return MN[:, :K], MN[:, K:]
    N = run_chunked(chunked, replace(x, S0=zeros(K, V)))[1]
    decays = Matrix(K, 1, lambda c, _: sympy.prod(x.a[:, c]))
    return {"diagonal": decays, "scalar": decays[0], "identity": None}[form], N


def apply_summary(form: str, summary: tuple, S: Matrix) -> Matrix:
    """The state after a segment from the state S before it: M S + N."""
    return transition_apply(form, summary[0], S) + summary[1]


def transition_transpose(form: str, M):
    """M^T in M's transition form: a full M transposed; a diagonal, a scalar and the identity are
    their own transposes."""
    return M.T if form == "full" else M


def adjoint_summary(combine: k3s.SummaryCombineOp, summary: tuple) -> tuple:
    """An adjoint combine's view of a segment's (M, N_bar): (M^T, N_bar), which the combine's
    algebra composes like any summary (in the reverse direction: later segments first)."""
    return transition_transpose(combine.transition.data, summary[0]), summary[1]


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
