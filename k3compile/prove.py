"""`k3c prove`: check derived schedules against the token recurrence in exact arithmetic.

The schedule is produced by the real pass (on a copy of the layer op with small dimensions:
the derivation depends on the op's structure, not its sizes) and interpreted stage by stage
with sympy rationals (k3compile.ir.exact). Random rational inputs make equality of every
output and the final state an identity test (Schwartz-Zippel): a wrong stage fails it with
probability 1.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from k3compile.spec import LayerSpec

PROOF_K, PROOF_V = 2, 3


@dataclass
class ProofResult:
    layer: str
    schedule: str
    length: int
    outputs_equal: bool
    state_equal: bool
    first_mismatch: str = ""

    @property
    def holds(self) -> bool:
        return self.outputs_equal and self.state_equal


def small_op(spec: LayerSpec):
    """The layer's k3.recurrence with K = 2, V = 3, one head."""
    import dataclasses

    from k3compile.frontend import spec_to_module

    params = {**spec.params, "num_heads": 1, "num_v_heads": 1, "head_k_dim": PROOF_K, "head_v_dim": PROOF_V}
    module = spec_to_module(dataclasses.replace(spec, params=params))
    return module


def derive(module, pipeline: str):
    """Run the derivation pipeline on a module and return its k3s.chunked schedule."""
    from k3compile.ir import k3s
    from k3compile.pipeline import run_pipeline

    run_pipeline(module, pipeline)
    return next(op for op in module.walk() if isinstance(op, k3s.ChunkedOp))


def prove_chunkwise(spec: LayerSpec, chunk_size: int, lengths: tuple[int, ...] | None = None,
                    seed: int | None = None) -> list[ProofResult]:
    """Prove `derive-chunkwise{chunk-size=C}` for a recurrence spec at several sequence lengths
    (by default: one partial chunk, an exact multiple, and several chunks with a partial tail)."""
    from k3compile.ir import exact

    rng = random.Random(seed)
    module = small_op(spec)
    layer_op = next(iter(module.ops))
    pipeline = f"derive-chunkwise{{chunk-size={chunk_size}}}"
    chunked = derive(module, pipeline)
    lengths = lengths or (max(1, chunk_size - 1), 2 * chunk_size, 2 * chunk_size + 1)
    gate, delta_rule = layer_op.gate.data, bool(layer_op.delta_rule.value.data)
    results = []
    for length in lengths:
        x = exact.random_inputs(rng, length, PROOF_K, PROOF_V, gate)
        want_o, want_s = exact.token_recurrence(x, delta_rule)
        try:
            got_o, got_s = exact.run_chunked(chunked, x)
        except exact.IncompleteSchedule as err:  # a stage reads what no stage produced: not a proof
            results.append(ProofResult(spec.name, pipeline, length, False, False, str(err)))
            continue
        mismatch = ""
        outputs_equal = got_o.shape == want_o.shape and (got_o - want_o).is_zero_matrix
        if not outputs_equal:
            rows = [t for t in range(length) if not (got_o[t, :] - want_o[t, :]).is_zero_matrix]
            mismatch = f"o differs first at token {rows[0]}" if rows else "o has the wrong shape"
        state_equal = (got_s - want_s).is_zero_matrix
        if not state_equal and not mismatch:
            mismatch = "final state differs"
        results.append(ProofResult(spec.name, pipeline, length, outputs_equal, state_equal, mismatch))
    return results


def prove_replay(spec: LayerSpec, draft_tokens: int, seed: int | None = None) -> list[ProofResult]:
    """Prove `derive-replay{draft-tokens=n}`: the verify pass's outputs equal the token
    recurrence's, and the replay of every accepted count m = 0..n equals the recurrence's state
    after m tokens."""
    from k3compile.ir import exact, k3s
    from k3compile.pipeline import run_pipeline

    rng = random.Random(seed)
    module = small_op(spec)
    layer_op = next(iter(module.ops))
    pipeline = f"derive-replay{{draft-tokens={draft_tokens}}}"
    run_pipeline(module, pipeline)
    speculative = next(op for op in module.walk() if isinstance(op, k3s.SpeculativeOp))
    delta_rule = bool(layer_op.delta_rule.value.data)
    x = exact.random_inputs(rng, draft_tokens, PROOF_K, PROOF_V, layer_op.gate.data)
    want_o, _ = exact.token_recurrence(x, delta_rule)
    got_o, _, cache = exact.run_verify(speculative, x)
    outputs_equal = (got_o - want_o).is_zero_matrix
    results = []
    for accepted in range(draft_tokens + 1):
        prefix = exact.ExactInputs(x.q[:accepted, :], x.k[:accepted, :], x.v[:accepted, :], x.a[:accepted, :],
                                   x.beta[:accepted], x.S0, x.scale)
        want_s = exact.token_recurrence(prefix, delta_rule)[1] if accepted else x.S0
        state_equal = (exact.run_replay(speculative, x.S0, cache, accepted) - want_s).is_zero_matrix
        mismatch = "" if state_equal else f"replayed state after {accepted} accepted tokens differs"
        if not outputs_equal:
            mismatch = "verify outputs differ"
        results.append(ProofResult(spec.name, f"{pipeline}, accept {accepted}", draft_tokens, outputs_equal,
                                   state_equal, mismatch))
    return results
