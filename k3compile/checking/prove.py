"""`k3c prove`: check derived schedules against the token recurrence in exact arithmetic.

The schedule is produced by the real pass (on a copy of the layer op with small dimensions:
the derivation depends on the op's structure, not its sizes) and interpreted stage by stage
with sympy rationals (k3compile.checking.exact). Random rational inputs make equality of every
output and the final state an identity test (Schwartz-Zippel): a wrong stage fails it with
probability 1. A backward schedule's gradients are checked the same way against the token
recurrence's derivative along random directions (k3compile.checking.exact_backward, docs/backward.md),
and the stores' chain rules through the input forms symbolically (prove_input_forms).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, replace

import sympy

from k3compile.checking import exact, exact_backward
from k3compile.errors import ArgumentError
from k3compile.frontend import spec_to_module
from k3compile.ir import k3s
from k3compile.pipeline import run_pipeline
from k3compile.spec import LayerSpec

PROOF_K, PROOF_V = 2, 3
# the largest chunk size proved: sympy solves the C x C tiles' systems in exact rationals, at a
# cost that grows faster than C^3 (C = 64, the largest default, takes minutes for a full proof)
MAX_CHUNK_SIZE = 64


def check_chunk_size(chunk_size: int) -> None:
    """ArgumentError unless the proofs can take `chunk_size` (1 .. MAX_CHUNK_SIZE)."""
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ArgumentError(f"chunk size {chunk_size}: expected 1 .. {MAX_CHUNK_SIZE} (the proofs solve C x C "
                            f"systems in exact rationals, at a cost that grows faster than C^3)")


@dataclass
class ProofResult:
    """One claim about a schedule. A forward schedule's outputs are O and its state the final
    state; a backward schedule's (prove_backward) outputs are the inputs' gradients (dq, dk, dv
    and, where the member reads them, dg and dbeta) and its state the initial state's gradient
    dh0; a store's chain rule (prove_input_forms) is a claim about the gradients of the raw
    inputs it writes, and none about a state."""

    layer: str
    schedule: str
    length: int | None  # None: a claim about no particular sequence (the combine's associativity, a chain rule)
    outputs_equal: bool | None  # None: a claim about states only
    state_equal: bool | None  # None: a claim about no state (a store's chain rule)
    first_mismatch: str = ""

    @property
    def holds(self) -> bool:
        return self.outputs_equal is not False and self.state_equal is not False


def checked(layer: str, schedule: str, want: tuple, run) -> ProofResult:
    """Compare run() -> (O, S_T) with want, the token recurrence's (O, S_T). A schedule that
    reads what no stage produced is a failed proof, not an error: the spec was fine, the
    derivation was not."""
    want_o, want_s = want
    length = want_o.rows
    try:
        got_o, got_s = run()
    except exact.IncompleteSchedule as err:
        return ProofResult(layer, schedule, length, False, False, str(err))
    mismatch = ""
    outputs_equal = got_o.shape == want_o.shape and (got_o - want_o).is_zero_matrix
    if not outputs_equal:
        rows = [t for t in range(length) if not (got_o[t, :] - want_o[t, :]).is_zero_matrix]
        mismatch = f"o differs first at token {rows[0]}" if rows else "o has the wrong shape"
    state_equal = (got_s - want_s).is_zero_matrix
    if not state_equal and not mismatch:
        mismatch = "final state differs"
    return ProofResult(layer, schedule, length, outputs_equal, state_equal, mismatch)


def small_op(spec: LayerSpec):
    """The layer's k3.recurrence with K = 2, V = 3, one head."""
    params = {**spec.params, "num_heads": 1, "num_v_heads": 1, "head_k_dim": PROOF_K, "head_v_dim": PROOF_V}
    module = spec_to_module(dataclasses.replace(spec, params=params))
    return module


def derived(spec: LayerSpec, pipeline: str):
    """(the layer's small k3.recurrence, the module after `pipeline`): what every proof interprets."""
    module = small_op(spec)
    layer_op = next(iter(module.ops))
    run_pipeline(module, pipeline)
    return layer_op, module


def proof_inputs(rng, layer_op, length: int):
    """Exact random inputs of one value head for layer_op: beta in (0, 2) where its beta input
    allows negative eigenvalues, so the proofs cover that range too."""
    beta_max = 2 if layer_op.input_option("beta_input") == "logits_neg_eigval" else 1
    return exact.random_inputs(rng, length, PROOF_K, PROOF_V, layer_op.gate.data, beta_max)


def first_op(module, op_type):
    return next(op for op in module.walk() if isinstance(op, op_type))


GUARD_OUTCOMES = {True: ", span checks hold (factored diagonal)", False: ", span checks fail (elementwise diagonal)"}


def guard_outcomes(module) -> list[tuple[bool | None, str]]:
    """(ExactInputs.guards, the schedule label's suffix) of every run a proof takes: a schedule
    with run-time checks (k3s.block_span_check) is proved for both outcomes of them, in every
    chunk; one without, once, as the decays say."""
    guarded = any(isinstance(op, k3s.BlockSpanCheckOp) for op in module.walk())
    return list(GUARD_OUTCOMES.items()) if guarded else [(None, "")]


def proved_at_lengths(spec: LayerSpec, pipeline: str, lengths: tuple[int, ...], seed: int | None,
                      runner) -> list[ProofResult]:
    """The schedule `pipeline` derives, interpreted by runner(module) -> run(x) -> (O, S_T), against
    the token recurrence on fresh random inputs of each length."""
    rng = random.Random(seed)
    layer_op, module = derived(spec, pipeline)
    run = runner(module)
    delta_rule = bool(layer_op.delta_rule.value.data)
    results = []
    for length in lengths:
        x = proof_inputs(rng, layer_op, length)
        want = exact.token_recurrence(x, delta_rule)
        for guards, label in guard_outcomes(module):
            results.append(checked(spec.name, pipeline + label, want, lambda: run(replace(x, guards=guards))))
    return results


def prove_chunkwise(spec: LayerSpec, chunk_size: int, lengths: tuple[int, ...] | None = None,
                    seed: int | None = None, sub_chunk: int | None = None) -> list[ProofResult]:
    """Prove `derive-chunkwise{chunk-size=C}` for a recurrence spec at several sequence lengths
    (by default: one partial chunk, an exact multiple, and several chunks with a partial tail);
    sub_chunk: the channel-gated Grams' row blocks (the pass's default if None)."""
    check_chunk_size(chunk_size)

    def runner(module):
        chunked = first_op(module, k3s.ChunkedOp)
        return lambda x: exact.run_chunked(chunked, x)

    lengths = lengths or (max(1, chunk_size - 1), 2 * chunk_size, 2 * chunk_size + 1)
    blocks = f" sub-chunk={sub_chunk}" if sub_chunk else ""
    return proved_at_lengths(spec, f"derive-chunkwise{{chunk-size={chunk_size}{blocks}}}", lengths, seed, runner)


def random_rational(rng, low: int, high: int, den: int = 7) -> sympy.Rational:
    """A nonzero numerator from a range 8x wider than low..high over 1..den, as
    exact.random_inputs draws the inputs (Schwartz-Zippel: a wide draw rarely hits a root)."""
    numerator = rng.choice([n for n in range(8 * low, 8 * high + 1) if n != 0])
    return sympy.Rational(numerator, rng.randint(1, den))


def random_matrix(rng, rows: int, cols: int, bound: int) -> sympy.Matrix:
    return sympy.Matrix(rows, cols, lambda *_: random_rational(rng, -bound, bound))


def gradient_shapes(layer_op, length: int) -> dict[str, tuple[int, int]]:
    """The gradients a backward schedule of layer_op owes for one head's sequence of `length`
    tokens, in the order a mismatch names them: q, k [T, K], v [T, V], a gate's log decays
    ([T, K] per channel, [T, 1] scalar) and beta [T, 1] where the member reads them, then h0
    [K, V]."""
    gate = layer_op.gate.data
    shapes = {"q": (length, PROOF_K), "k": (length, PROOF_K), "v": (length, PROOF_V)}
    if gate != "none":
        shapes["g"] = (length, PROOF_K if gate == "channel" else 1)
    if layer_op.delta_rule.value.data:
        shapes["beta"] = (length, 1)
    return {**shapes, "h0": (PROOF_K, PROOF_V)}


def dual_loss_derivative(x, delta_rule: bool, name: str, direction: sympy.Matrix) -> sympy.Rational:
    """exact_backward.loss_derivative's number, d/dt at t = 0 of <x.do, O> + <x.dht, S_T> with input
    `name` moved along `direction`, computed in dual numbers: the token recurrence carrying each
    quantity's first-order part (its tangent) beside it, in rationals, where loss_derivative
    carries polynomials in a symbol t truncated to first order (the same arithmetic, some 40x
    faster; tests/test_prove_backward.py checks the two agree). A gate moves in log space: a decay
    a by a (1 + t d), so its tangent is a d."""
    T, K = x.k.shape
    tangents = {"q": sympy.zeros(T, K), "k": sympy.zeros(T, K), "v": sympy.zeros(*x.v.shape),
                "h0": sympy.zeros(*x.S0.shape), "g": sympy.zeros(T, K), "beta": [0] * T}
    if name == "g":  # a scalar gate's direction has one column, for every channel
        tangents["g"] = sympy.Matrix(T, K, lambda i, c: x.a[i, c] * direction[i, min(c, direction.cols - 1)])
    elif name == "beta":
        tangents["beta"] = [direction[i, 0] for i in range(T)]
    elif name in tangents:
        tangents[name] = direction
    else:
        raise ValueError(f"no input {name!r} to move")
    dq, dk, dv, da, dbeta = (tangents[n] for n in ("q", "k", "v", "g", "beta"))
    S, dS = x.S0, tangents["h0"]
    derivative = sympy.Integer(0)
    for t in range(T):
        k_t, v_t, dk_t, dv_t = x.k[t, :].T, x.v[t, :].T, dk[t, :].T, dv[t, :].T
        A, dA = sympy.diag(*x.a[t, :]), sympy.diag(*da[t, :])
        S, dS = A * S, dA * S + A * dS
        if delta_rule:
            r, dr = v_t - S.T * k_t, dv_t - dS.T * k_t - S.T * dk_t
            u, du = x.beta[t] * r, dbeta[t] * r + x.beta[t] * dr
        else:
            u, du = v_t, dv_t
        S, dS = S + k_t * u.T, dS + dk_t * u.T + k_t * du.T
        do_t = dS.T * (x.scale * x.q[t, :].T) + S.T * (x.scale * dq[t, :].T)  # the tangent of o_t
        derivative += sum(do_t.multiply_elementwise(x.do[t, :].T))
    if x.dht is not None:
        derivative += sum(dS.multiply_elementwise(x.dht))
    return derivative


def checked_gradients(layer: str, schedule: str, length: int, directions: dict, want: dict, run) -> ProofResult:
    """Compare the gradients run() -> {input: G} returns with the token recurrence's derivative:
    <G, d> == want[input] for the random direction d = directions[input]. outputs_equal: every
    input's gradient; state_equal: h0's. The mismatch names every gradient that differs, in
    gradient_shapes' order ("dk differs; dg differs"). A schedule that reads what no stage
    produced is a failed proof, not an error."""
    try:
        got = run()
    except exact.IncompleteSchedule as err:
        return ProofResult(layer, schedule, length, False, False, str(err))
    differ: dict[str, str] = {}  # input -> how its gradient differs
    for name, direction in directions.items():
        G = got.get(name)
        if G is None:
            differ[name] = f"d{name} is missing"
        elif G.shape != direction.shape:
            differ[name] = f"d{name} has shape {G.shape}, not {direction.shape}"
        elif sum(G.multiply_elementwise(direction)) - want[name] != 0:
            differ[name] = f"d{name} differs"
    differ.update({name: f"d{name} is of no input the layer reads" for name in got if name not in directions})
    return ProofResult(layer, schedule, length, outputs_equal=not set(differ) - {"h0"}, state_equal="h0" not in differ,
                       first_mismatch="; ".join(differ.values()))


def prove_backward(spec: LayerSpec, chunk_size: int, lengths: tuple[int, ...] | None = None,
                   seed: int | None = None, sub_chunk: int | None = None,
                   derivative=dual_loss_derivative) -> list[ProofResult]:
    """Prove `derive-backward{chunk-size=C}`: its gradients equal the token recurrence's for the
    loss <do, O> + <dht, S_T> at several sequence lengths (by default: one partial chunk, an exact
    multiple, and several chunks with a partial tail), with random rational cotangents do and dht
    and scale.
    Each gradient G is checked along a random rational direction d: <G, d> equals the derivative
    of the loss with that input moved along d (forward mode, first order: `derivative`,
    dual_loss_derivative or exact_backward.loss_derivative, which agree), one direction per input
    and length, shared by both outcomes of a guarded schedule's span checks. One row per (length,
    guard outcome); sub_chunk as prove_chunkwise's."""
    check_chunk_size(chunk_size)
    lengths = lengths or (max(1, chunk_size - 1), 2 * chunk_size, 2 * chunk_size + 1)
    blocks = f" sub-chunk={sub_chunk}" if sub_chunk else ""
    pipeline = f"derive-backward{{chunk-size={chunk_size}{blocks}}}"
    rng = random.Random(seed)
    layer_op, module = derived(spec, pipeline)
    backward = first_op(module, k3s.ChunkedBackwardOp)
    delta_rule = bool(layer_op.delta_rule.value.data)
    results = []
    for length in lengths:
        x = proof_inputs(rng, layer_op, length)
        # the scale drawn too: every cotangent that do brings carries it, dht's do not
        x = replace(x, do=random_matrix(rng, length, PROOF_V, 5), dht=random_matrix(rng, PROOF_K, PROOF_V, 3),
                    scale=random_rational(rng, -1, 1))
        directions = {name: random_matrix(rng, *shape, 5) for name, shape in gradient_shapes(layer_op, length).items()}
        want = {name: derivative(x, delta_rule, name, d) for name, d in directions.items()}
        for guards, label in guard_outcomes(module):
            results.append(checked_gradients(spec.name, pipeline + label, length, directions, want,
                                             lambda: exact_backward.run_backward(backward, replace(x, guards=guards))))
    return results


def prove_input_forms(spec: LayerSpec, chunk_size: int) -> list[ProofResult]:
    """Prove the chain rules of `derive-backward{chunk-size=C}`'s stores: each k3s.store_cotangent
    takes the cotangent of its load's result back to the gradients of the raw tensors the load
    read (through l2norm, the gate's input form, beta's) by the derivative of the form that load
    applies, for all raw inputs (exact_backward.chain_rule_mismatches: symbolic). prove_backward
    proves the cotangents the stores take; with these, the gradients of the raw inputs. One row per
    store, in the schedule's order (q, k, v, g, beta), naming each gradient that differs."""
    check_chunk_size(chunk_size)
    pipeline = f"derive-backward{{chunk-size={chunk_size}}}"
    _, module = derived(spec, pipeline)
    block = first_op(module, k3s.ChunkedBackwardOp).body.block
    loads = [op for op in block.ops if isinstance(op, (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp))]
    results = []
    for store in (op for op in block.ops if isinstance(op, k3s.StoreCotangentOp)):
        form = exact_backward.store_form(store)
        load = next((op for op in loads if op.operands[0] == store.inputs[0]), None)
        if load is None:
            mismatch = f"no load reads {form.inputs[0]}"
        else:
            mismatch = "; ".join(exact_backward.chain_rule_mismatches(form, exact_backward.load_form(load)))
        gradients = ", ".join(f"d{name}" for name in form.inputs)
        results.append(ProofResult(spec.name, f"{pipeline}: store_cotangent of {form.of} ({form}): {gradients}",
                                   None, not mismatch, None, mismatch))
    return results


def prove_fused_chunkwise(spec: LayerSpec, chunk_size: int, grouping: str = "split",
                          lengths: tuple[int, ...] | None = None, seed: int | None = None) -> list[ProofResult]:
    """Prove the kernels `fuse-chunkwise{grouping=G}` makes of the chunkwise schedule: the
    token-parallel kernels run first and hand their results over only through what they spill,
    then the scan kernel's chunk loop runs from the initial state on what it reloads. A stage
    left out of every kernel, or a value read but never spilled, fails the proof."""
    check_chunk_size(chunk_size)

    def runner(module):
        kernels = entry_kernels(module, "chunk")
        return lambda x: exact.run_lowered_entry(kernels, x)

    lengths = lengths or (max(1, chunk_size - 1), 2 * chunk_size + 1)
    pipeline = f"derive-chunkwise{{chunk-size={chunk_size}}},fuse-chunkwise{{grouping={grouping}}}"
    return proved_at_lengths(spec, pipeline, lengths, seed, runner)


def prove_saved_forward_values(spec: LayerSpec, chunk_size: int, lengths: tuple[int, ...] | None = None,
                               seed: int | None = None) -> list[ProofResult]:
    """Prove save-forward-values' premise: what the forward's prepare kernel spills into each
    workspace that chunk_saving returns equals what the backward's prepare kernel would spill
    there (each chunk's value, exactly), so that chunk_backward_saved, which reads the former in
    place of the latter, computes chunk_backward's gradients. A workspace the pass saves that the
    forward does not write fails the proof."""
    check_chunk_size(chunk_size)
    pipeline = (f"derive-chunkwise{{chunk-size={chunk_size}}},fuse-chunkwise,derive-backward{{chunk-size={chunk_size}}},"
                "lower-backward,save-forward-values")
    rng = random.Random(seed)
    layer_op, module = derived(spec, pipeline)
    saving = entry_of(module, "chunk_saving")
    if saving is None:
        return [ProofResult(spec.name, pipeline, None, False, None, "save-forward-values added no chunk_saving")]
    forward_roles = {op.sym_name.data: op.role.data for op in entry_of(module, "chunk").body.ops
                     if isinstance(op, k3s.TensorArgOp)}
    names = [op.sym_name.data for op in saving.body.ops if isinstance(op, k3s.TensorArgOp)
             and op.role.data == k3s.ArgRole.OUTPUT and forward_roles[op.sym_name.data] == k3s.ArgRole.WORKSPACE]
    results = []
    for length in lengths or (max(1, chunk_size - 1), 2 * chunk_size + 1):
        x = proof_inputs(rng, layer_op, length)
        forward, backward = {}, {}
        exact.run_prepare_kernel(entry_kernels(module, "chunk")[0], x, chunk_size, forward)
        exact.run_prepare_kernel(entry_kernels(module, "chunk_backward")[0], x, chunk_size, backward)
        differing = [name for name in names if any(key[1] == name and forward.get(key) != value
                                                    for key, value in backward.items())]
        missing = [name for name in names if not any(key[1] == name for key in forward)]
        mismatch = f"{', '.join(missing)} not written by the forward" if missing else \
            f"{', '.join(differing)} differ" if differing else ""
        results.append(ProofResult(spec.name, f"save-forward-values: {', '.join(names)} (chunk {chunk_size})",
                                   length, not mismatch, None, mismatch))
    return results


def entry_of(module, name: str):
    """The module's entry of that name, or None."""
    return next((op for op in module.ops if isinstance(op, k3s.EntryOp) and op.sym_name.data == name), None)


def entry_kernels(module, name: str) -> list:
    """The kernels of a lowered entry, in launch order."""
    return k3s.entry_kernels(entry_of(module, name))


def prove_chunked_verify(spec: LayerSpec, draft_tokens: int, seed: int | None = None) -> list[ProofResult]:
    """Prove `lower-speculative{verify=chunked}`'s verify as lowered (the prepare kernel, then the
    scan kernel's one chunk from the pool row S_0): its outputs equal the token recurrence's, and
    the commit kernel's replay of its cached (k, decays, u) for every accepted count m = 0..n
    equals the recurrence's state after m tokens."""
    rng = random.Random(seed)
    pipeline = f"derive-replay{{draft-tokens={draft_tokens}}},lower-speculative{{verify=chunked}}"
    layer_op, module = derived(spec, pipeline)
    delta_rule = bool(layer_op.delta_rule.value.data)
    x = proof_inputs(rng, layer_op, draft_tokens)
    want_o, _ = exact.token_recurrence(x, delta_rule)
    buffers: dict[str, list] = {}
    try:
        got_o, row = exact.run_lowered_entry(entry_kernels(module, "verify"), x, buffers, 0)
    except exact.IncompleteSchedule as err:  # a stage reads what nothing produced: every row fails
        return [ProofResult(spec.name, f"{pipeline}: verify, accept {m}", draft_tokens, False, False, str(err))
                for m in range(draft_tokens + 1)]
    outputs_equal = got_o.shape == want_o.shape and (got_o - want_o).is_zero_matrix
    results = []
    for accepted in range(draft_tokens + 1):
        want_s = exact.token_recurrence(x.tokens(0, accepted), delta_rule)[1] if accepted else x.S0
        replayed = exact.run_lowered_entry(entry_kernels(module, "commit"), x, {"cache": buffers.get("cache", [])},
                                        accepted)[1]
        row_kept = (row - x.S0).is_zero_matrix
        state_equal = row_kept and (replayed - want_s).is_zero_matrix
        mismatch = ("verify outputs differ" if not outputs_equal else "verify wrote the pool row" if not row_kept
                    else "" if state_equal else f"replayed state after {accepted} accepted tokens differs")
        results.append(ProofResult(spec.name, f"{pipeline}: verify, accept {accepted}", draft_tokens, outputs_equal,
                                   state_equal, mismatch))
    return results


def prove_replay(spec: LayerSpec, draft_tokens: int, seed: int | None = None) -> list[ProofResult]:
    """Prove `derive-replay{draft-tokens=n}`: the verify pass's outputs equal the token
    recurrence's, and the replay of every accepted count m = 0..n equals the recurrence's state
    after m tokens."""
    rng = random.Random(seed)
    pipeline = f"derive-replay{{draft-tokens={draft_tokens}}}"
    layer_op, module = derived(spec, pipeline)
    speculative = first_op(module, k3s.SpeculativeOp)
    delta_rule = bool(layer_op.delta_rule.value.data)
    x = proof_inputs(rng, layer_op, draft_tokens)
    want_o, _ = exact.token_recurrence(x, delta_rule)
    got_o, _, cache = exact.run_verify(speculative, x)
    outputs_equal = (got_o - want_o).is_zero_matrix
    results = []
    for accepted in range(draft_tokens + 1):
        want_s = exact.token_recurrence(x.tokens(0, accepted), delta_rule)[1] if accepted else x.S0
        state_equal = (exact.run_replay(speculative, x.S0, cache, accepted) - want_s).is_zero_matrix
        mismatch = "" if state_equal else f"replayed state after {accepted} accepted tokens differs"
        if not outputs_equal:
            mismatch = "verify outputs differ"
        results.append(ProofResult(spec.name, f"{pipeline}, accept {accepted}", draft_tokens, outputs_equal,
                                   state_equal, mismatch))
    return results


def prove_spec_step(spec: LayerSpec, draft_tokens: int, seed: int | None = None,
                    verify: str = "token") -> list[ProofResult]:
    """Prove the fused `spec_step` kernel that `lower-speculative` builds, stage by stage, over two
    rounds on a pool row holding S_0: the first launch (nothing accepted before, `cache` never
    read) verifies round 1 like the token recurrence from S_0; the second, keeping m = 0..n of
    round 1's tokens, leaves the row at the recurrence's state S_m after them, verifies round 2
    from S_m like the recurrence, and caches what the `commit` kernel (the last round's flush)
    replays to the state after all of round 2. verify = chunked: the same for the entry lowered
    with `verify=chunked` (its prepare kernel, then the step kernel: replay, store, one chunk)."""
    rng = random.Random(seed)
    pipeline = f"derive-replay{{draft-tokens={draft_tokens}}},lower-speculative"
    if verify != "token":
        pipeline += f"{{verify={verify}}}"
    layer_op, module = derived(spec, pipeline)
    kernel, commit = entry_kernels(module, "spec_step"), entry_kernels(module, "commit")
    delta_rule = bool(layer_op.delta_rule.value.data)
    first, second = (proof_inputs(rng, layer_op, draft_tokens) for _ in range(2))
    first_round = {"cache": []}
    try:
        got_o, left = exact.run_lowered_entry(kernel, first, first_round, 0)  # left: the row as round 1 leaves it
    except exact.IncompleteSchedule as err:  # a stage reads what nothing produced: every row fails
        return [ProofResult(spec.name, f"{pipeline}: spec_step, accept {m}", draft_tokens, False, False, str(err))
                for m in range(draft_tokens + 1)]
    first_equal = (got_o - exact.token_recurrence(first, delta_rule)[0]).is_zero_matrix
    results = []
    for accepted in range(draft_tokens + 1):
        S_m = exact.token_recurrence(first.tokens(0, accepted), delta_rule)[1] if accepted else first.S0
        x_from_S_m = second.tokens(0, draft_tokens, S_m)
        want_o, want_s = exact.token_recurrence(x_from_S_m, delta_rule)
        buffers = {"cache": first_round.get("next_cache", [])}  # the caller swaps the pair
        got_o, row = exact.run_lowered_entry(kernel, second.tokens(0, draft_tokens, left), buffers, accepted)
        outputs_equal = first_equal and (got_o - want_o).is_zero_matrix
        row_equal = (row - S_m).is_zero_matrix
        flushed = exact.run_lowered_entry(commit, x_from_S_m, {"cache": buffers.get("next_cache", [])}, draft_tokens)[1]
        cached_equal = (flushed - want_s).is_zero_matrix
        mismatch = ("round 1 outputs differ" if not first_equal else "round 2 outputs differ" if not outputs_equal
                    else "" if row_equal else f"committed row after {accepted} accepted differs")
        if not cached_equal and not mismatch:
            mismatch = "round 2's cache does not replay to its state"
        results.append(ProofResult(spec.name, f"{pipeline}: spec_step, accept {accepted}", draft_tokens,
                                   outputs_equal, row_equal and cached_equal, mismatch))
    return results


def _same(left, right) -> bool:
    """Whether two summary parts (matrices, symbols or None) are identically equal."""
    if left is None or right is None:
        return left is right
    difference = (left - right).expand()
    return difference.is_zero_matrix if isinstance(difference, sympy.MatrixBase) else difference == 0


SYMBOLS_OF_FORM = {"full": "non-commutative M, N", "diagonal": "per-channel M", "scalar": "scalar M", "identity": "no M"}


def prove_associative(layer: str, pipeline: str, combine) -> ProofResult:
    """(c o b) o a == c o (b o a) for summaries of symbols in the combine's transition form: a
    full M and N as non-commutative symbols (any K, V), a diagonal M as one symbol per channel."""
    form = combine.transition.data

    def summary(name: str) -> tuple:
        if form == "diagonal":
            return (sympy.Matrix(PROOF_K, 1, lambda c, _: sympy.Symbol(f"m_{name}{c}")),
                    sympy.Matrix(PROOF_K, PROOF_V, lambda i, j: sympy.Symbol(f"n_{name}{i}{j}")))
        M = {"full": sympy.Symbol(f"M_{name}", commutative=False), "scalar": sympy.Symbol(f"m_{name}"),
             "identity": None}[form]
        return M, sympy.Symbol(f"N_{name}", commutative=False)

    a, b, c = summary("a"), summary("b"), summary("c")
    left = exact.combine_summaries(combine, exact.combine_summaries(combine, c, b), a)
    right = exact.combine_summaries(combine, c, exact.combine_summaries(combine, b, a))
    holds = _same(left[0], right[0]) and _same(left[1], right[1])
    return ProofResult(layer, f"{pipeline}: combine associative ({SYMBOLS_OF_FORM[form]})", None, None, holds,
                       "" if holds else "(c o b) o a differs from c o (b o a)")


def prove_segment_scan(spec: LayerSpec, chunk_size: int, length: int | None = None,
                       cuts: list[list[int]] | None = None, seed: int | None = None) -> list[ProofResult]:
    """Prove `derive-segment-scan{chunk-size=C}`: the combine is associative (symbolically), and
    for several splits of one sequence (`cuts`: the tokens that start a segment; by default none,
    a one-token first segment, three random segments, a one-token segment inside, every token a
    segment) the combined summaries take the initial state to the token recurrence's final state
    and the segments finished from their combined initial states give every output."""
    check_chunk_size(chunk_size)
    rng = random.Random(seed)
    pipeline = f"derive-segment-scan{{chunk-size={chunk_size}}}"
    layer_op, module = derived(spec, pipeline)
    scan = first_op(module, k3s.SegmentScanOp)
    combine = next(op for op in scan.body.ops if isinstance(op, k3s.SummaryCombineOp))
    results = [prove_associative(spec.name, pipeline, combine)]
    length = length or 2 * chunk_size + 3
    if cuts is None:
        inner = rng.randrange(1, length - 1)
        cuts = [[], [1], sorted(rng.sample(range(1, length), 2)), [inner, inner + 1], list(range(1, length))]
    x = proof_inputs(rng, layer_op, length)
    want = exact.token_recurrence(x, bool(layer_op.delta_rule.value.data))
    for split in cuts:
        sizes = "+".join(str(end - start) for start, end in zip([0, *split], [*split, length]))
        results.append(checked(spec.name, f"{pipeline}, segments {sizes}", want,
                               lambda: exact.run_segment_scan(scan, x, split)))
    return results
