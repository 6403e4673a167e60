"""`k3c prove` of derive-backward: the backward schedule's gradients equal the token recurrence's
derivative in exact arithmetic (k3compile.prove.prove_backward), for every member, input form and
small chunk size; deliberately wrong adjoint rules fail it and the proof names the gradient they
break; an op without a rule is derive-backward's NotImplementedError."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from conftest import DELTA_OF_KIND, EXAMPLES, GATE_OF_KIND, RECURRENCE_KINDS, one_line, recurrence_table, run_cli
from k3compile.ir import exact_backward, k3s
from k3compile.passes import adjoint_rules, derive_backward
from k3compile.prove import (PROOF_K, PROOF_V, derived, dual_loss_derivative, gradient_shapes, proof_inputs,
                             prove_backward, random_matrix)
from k3compile.spec import load_spec, spec_from_table

RULES = dict(adjoint_rules.ADJOINT_RULES)  # the rules as derive-backward has them, before any test patches one
GATED_KINDS = [kind for kind in RECURRENCE_KINDS if GATE_OF_KIND[kind] != "none"]
DELTA_KINDS = [kind for kind in RECURRENCE_KINDS if DELTA_OF_KIND[kind]]


def spec_of(kind: str):
    return load_spec(EXAMPLES / f"{kind}.toml")


def runs_per_length(kind: str) -> int:
    """The channel-gated examples' Grams are guarded (unbounded log gates): proved for both
    outcomes of their span checks."""
    return 2 if GATE_OF_KIND[kind] == "channel" else 1


# --- the derived backward holds ------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 2, 4])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_backward_proved(kind, chunk_size, fresh_seed):
    """By default a partial chunk, an exact multiple, and several chunks with a partial tail (odd
    lengths: 2C + 1, and C - 1 = 3 at C = 4): every gradient, dh0 included."""
    results = prove_backward(spec_of(kind), chunk_size, seed=fresh_seed)
    lengths = [max(1, chunk_size - 1), 2 * chunk_size, 2 * chunk_size + 1]
    assert [r.length for r in results] == [n for n in lengths for _ in range(runs_per_length(kind))]
    for r in results:
        assert r.schedule.startswith(f"derive-backward{{chunk-size={chunk_size}}}")
        assert r.holds and r.outputs_equal and r.state_equal, f"T={r.length}: {r.first_mismatch}"
        assert r.first_mismatch == ""
    if runs_per_length(kind) == 2:
        assert {r.schedule.rpartition(", ")[2] for r in results} == {"span checks hold (factored diagonal)",
                                                                     "span checks fail (elementwise diagonal)"}


@pytest.mark.parametrize("chunk_size", [2, 4])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_backward_proved_at_other_lengths(kind, chunk_size, fresh_seed):
    """Lengths the defaults skip: a single token, exactly one chunk, several chunks plus 2."""
    lengths = (1, chunk_size, 3 * chunk_size + 2)
    results = prove_backward(spec_of(kind), chunk_size, lengths=lengths, seed=fresh_seed)
    assert [r.length for r in results] == [n for n in lengths for _ in range(runs_per_length(kind))]
    assert all(r.holds for r in results), [r.first_mismatch for r in results]


@pytest.mark.parametrize("kind", ["kda", "gla"])
def test_backward_proved_with_row_blocks(kind, fresh_seed):
    """Several row blocks per chunk (sub-chunk 2 of 4), a partial last chunk and block: the Grams'
    factors recomputed as the forward forms them, the Gram's rule differentiating its value."""
    results = prove_backward(spec_of(kind), 4, lengths=(7,), seed=fresh_seed, sub_chunk=2)
    assert len(results) == 2 and all("sub-chunk=2" in r.schedule for r in results)
    assert all(r.holds for r in results), [r.first_mismatch for r in results]


# Input forms. The proof runs the schedule of one head and one value head (prove.small_op), on
# inputs given as the loads' results: in exact semantics a load is the identity (q and k already
# unit rows where qk_l2norm, the decays given as factors whatever gate_input says, beta as the
# probability whatever beta_input says) and k3s.store_cotangent stores the cotangent of the load's
# result as is. So these prove the schedule's algebra, which every form shares: the gradients with
# respect to what the loads make. What the forms change in the schedule is checked below: the
# stores carry the form (the kernels take the cotangent back through l2norm, the gate's softplus,
# sigmoid or clamp, beta's sigmoid, and sum a group's q, k cotangents over its value heads: not
# proved here), a bounded gate's Grams are factored (no span check: one run per length),
# softplus' are guarded (both outcomes), and logits_neg_eigval draws beta in (0, 2) (proof_inputs).
# The proof inputs' decays are k/9 >= 1/9, above every lower bound the clamp applies.
INPUT_FORMS = [
    ("kda", {"num_v_heads": 4}),  # grouped value heads (gated_deltanet's example has them too)
    ("kda", {"qk_l2norm": True}),
    ("gated_deltanet", {"qk_l2norm": True}),
    ("kda", {"gate_input": "softplus"}),
    ("kda", {"gate_input": "bounded"}),
    ("kda", {"gate_input": "clamped"}),
    ("gla", {"gate_input": "bounded"}),
    ("gated_deltanet", {"gate_input": "softplus"}),
    ("gated_deltanet", {"gate_input": "clamped"}),
    ("kda", {"beta_input": "logits"}),
    ("deltanet", {"beta_input": "logits_neg_eigval"}),
    ("gated_deltanet", {"beta_input": "logits_neg_eigval"}),
]


@pytest.mark.parametrize("kind, options", INPUT_FORMS,
                         ids=[f"{kind}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for kind, o in INPUT_FORMS])
def test_backward_proved_for_input_forms(kind, options, fresh_seed):
    spec = spec_from_table(recurrence_table(kind, name=f"{kind}_form", **options))
    results = prove_backward(spec, 2, lengths=(3, 5), seed=fresh_seed)
    assert all(r.holds for r in results), [r.first_mismatch for r in results]

    layer_op, module = derived(spec, "derive-backward{chunk-size=2}")
    stores = {op.of.data: op for op in module.walk() if isinstance(op, k3s.StoreCotangentOp)}
    assert set(stores) == {"q", "k", "v"} | ({"g"} if GATE_OF_KIND[kind] != "none" else set()) | (
        {"beta"} if DELTA_OF_KIND[kind] else set())
    gate_input = options.get("gate_input", "log")
    bounded = gate_input in ("bounded", "clamped")
    guarded = GATE_OF_KIND[kind] == "channel" and not bounded
    assert len(results) == 2 * (2 if guarded else 1)
    if options.get("qk_l2norm"):
        assert all(stores[x].l2norm is not None and stores[x].l2norm.value.data for x in ("q", "k"))
    if "g" in stores:
        assert stores["g"].gate_input.data == gate_input
        # softplus and bounded read A_log and dt_bias too: their gradients are stored with g's
        params = ["g", "A_log", "dt_bias"] if gate_input in ("softplus", "bounded") else ["g"]
        assert [k3s.argument_name(t) for t in stores["g"].inputs] == params
        assert [k3s.argument_name(t) for t in stores["g"].gradients] == [f"d{p}" for p in params]
    if "beta" in stores:
        assert stores["beta"].beta_input.data == options.get("beta_input", "probability")
    if options.get("beta_input") == "logits_neg_eigval":
        betas = proof_inputs(random.Random(fresh_seed), layer_op, 40).beta
        assert max(betas) > 1 and max(betas) < 2


# --- the oracle: dual numbers and exact_backward's symbolic first order agree -----------------


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_dual_derivative_equals_loss_derivative(kind, fresh_seed):
    """prove_backward's oracle (dual_loss_derivative: rationals carried with their tangents) gives
    exactly exact_backward.loss_derivative's number (polynomials in t truncated to first order),
    for every input, with dht and without."""
    rng = random.Random(fresh_seed)
    layer_op = derived(spec_of(kind), "")[0]
    delta_rule = DELTA_OF_KIND[kind]
    length = 3
    x = proof_inputs(rng, layer_op, length)
    for dht in (random_matrix(rng, PROOF_K, PROOF_V, 3), None):
        x = replace(x, do=random_matrix(rng, length, PROOF_V, 5), dht=dht)
        for name, shape in gradient_shapes(layer_op, length).items():
            d = random_matrix(rng, *shape, 5)
            assert dual_loss_derivative(x, delta_rule, name, d) == exact_backward.loss_derivative(x, delta_rule, name, d), name


def test_backward_proved_with_the_symbolic_oracle(fresh_seed):
    results = prove_backward(spec_of("kda"), 2, lengths=(3,), seed=fresh_seed,
                             derivative=exact_backward.loss_derivative)
    assert len(results) == 2 and all(r.holds for r in results), [r.first_mismatch for r in results]


# --- deliberately wrong adjoint rules fail, naming the gradient they break -------------------


def chunk_decay_sign_flipped(e, op, decay_bar):
    """gamma_C = exp(G_C), its cotangent taken with the wrong sign."""
    return {0: e.neg(RULES[k3s.ChunkDecayOp](e, op, decay_bar)[0])}


class LhsTransposeDropped(adjoint_rules.Emitter):
    """The rule's emitter, but a product meant as a^T b is emitted as a b."""

    def __init__(self, e: adjoint_rules.Emitter) -> None:
        vars(self).update(vars(e))
        self.dropped = 0

    def dot(self, a, b, transpose_lhs: bool = False, transpose_rhs: bool = False):
        self.dropped += transpose_lhs
        return super().dot(a, b, transpose_rhs=transpose_rhs)

    def like(self, op_type, operands, like, name=None, **props):
        """A channel Gram's keys side (the contraction over its rows, M_bar^T) taken as its rows side."""
        if op_type is k3s.GatedContractionOp and props.get("side") == "keys":
            self.dropped += 1
            props["side"] = "rows"
        return super().like(op_type, operands, like, name, **props)


DROPPED: list[int] = []


def gram_keys_transpose_dropped(e, op, gram_bar):
    """The keys' side of the Gram's rule as M_bar L instead of M_bar^T L (L: the rows, under the
    decays): its only product with a transposed lhs. The key Gram's keys are its rows too."""
    emitter = LhsTransposeDropped(e)
    cotangents = RULES[k3s.GramOp](emitter, op, gram_bar)
    DROPPED.append(emitter.dropped)
    return cotangents


def beta_bar_without_the_solve(e, op, T_bar):
    """T = (I + A)^-1 Diag(beta): beta's cotangent as diag(T_bar) instead of diag((I + A)^-T T_bar)."""
    cotangents = RULES[k3s.ForwardSubstitutionOp](e, op, T_bar)
    return {**cotangents, 1: e.emit(k3s.DiagonalOp, [T_bar], cotangents[1].type)}


def residual_state_sign_flipped(e, op, vr_bar):
    """vr = U - W S: the entering state's cotangent W^T vr_bar instead of -W^T vr_bar."""
    cotangents = RULES[k3s.DeltaResidualOp](e, op, vr_bar)
    return {**cotangents, 0: e.neg(cotangents[0])}


# (op type, wrong rule, kind, the mismatch the proof at T = 5, C = 3 reports: a pattern)
WRONG_RULES = (
    [(k3s.ChunkDecayOp, chunk_decay_sign_flipped, kind, "dg differs") for kind in GATED_KINDS]
    # dg too for a channel gate, whose cotangent the rule takes from the keys' side
    + [(k3s.GramOp, gram_keys_transpose_dropped, kind, r"dk differs(; dg differs)?") for kind in RECURRENCE_KINDS]
    + [(k3s.ForwardSubstitutionOp, beta_bar_without_the_solve, kind, "dbeta differs") for kind in DELTA_KINDS]
    # every gradient an earlier chunk's cotangent of the state it leaves reaches: all but dq
    + [(k3s.DeltaResidualOp, residual_state_sign_flipped, kind,
        r"dk differs; dv differs(; dg differs)?; dbeta differs; dh0 differs") for kind in DELTA_KINDS]
)


@pytest.mark.parametrize("op_type, rule, kind, says", WRONG_RULES,
                         ids=[f"{rule.__name__}-{kind}" for _, rule, kind, _ in WRONG_RULES])
def test_wrong_adjoint_rule_not_proved(monkeypatch, op_type, rule, kind, says, fresh_seed):
    monkeypatch.setitem(adjoint_rules.ADJOINT_RULES, op_type, rule)
    DROPPED.clear()
    results = prove_backward(spec_of(kind), 3, lengths=(5,), seed=fresh_seed)
    if rule is gram_keys_transpose_dropped:
        assert DROPPED and all(n == 1 for n in DROPPED), "the Gram's rule has no product of a transposed lhs to break"
    assert len(results) == runs_per_length(kind)
    for r in results:
        assert not r.holds, f"a deliberately wrong {op_type.name} rule was proved"
        assert re.fullmatch(says, r.first_mismatch), r.first_mismatch
        assert r.outputs_equal is False and r.state_equal == ("dh0" not in r.first_mismatch)


@pytest.mark.parametrize("kind", DELTA_KINDS)
def test_wrong_state_cotangent_shows_in_dh0_alone_within_one_chunk(monkeypatch, kind, fresh_seed):
    """In one chunk the entering state's cotangent is dh0 and nothing else: the inputs' gradients
    hold (outputs_equal), the state's does not."""
    monkeypatch.setitem(adjoint_rules.ADJOINT_RULES, k3s.DeltaResidualOp, residual_state_sign_flipped)
    results = prove_backward(spec_of(kind), 3, lengths=(2,), seed=fresh_seed)
    assert [(r.outputs_equal, r.state_equal, r.first_mismatch) for r in results] == \
        [(True, False, "dh0 differs")] * runs_per_length(kind)


def test_schedule_reading_what_nothing_made_is_a_failed_proof(monkeypatch, fresh_seed):
    """The transposed solve moved after its readers (the verifier does not order a block's uses):
    the exact run meets a value not yet made, and every row fails saying which, not an error."""
    original = derive_backward.backward_schedule

    def solve_last(*args, **kwargs):
        chunked = original(*args, **kwargs)
        block = chunked.body.block
        solve = next(op for op in block.ops if isinstance(op, k3s.TransposedSolveOp))
        solve.detach()
        block.add_op(solve)
        return chunked

    monkeypatch.setattr(derive_backward, "backward_schedule", solve_last)
    results = prove_backward(spec_of("deltanet"), 3, lengths=(2, 5), seed=fresh_seed)
    assert len(results) == 2
    for r in results:
        assert (r.outputs_equal, r.state_equal) == (False, False)
        assert re.fullmatch(r"a stage reads \S+, which no earlier stage produced", r.first_mismatch), r.first_mismatch


def test_op_without_an_adjoint_rule_is_not_implemented(monkeypatch, capsys, fresh_seed):
    monkeypatch.delitem(adjoint_rules.ADJOINT_RULES, k3s.ChunkDecayOp)
    with pytest.raises(NotImplementedError, match=r"^derive-backward: k3s.chunk_decay has no adjoint rule$"):
        prove_backward(spec_of("gated_deltanet"), 3)
    # k3c: an internal error, in one line
    code, out, err = run_cli(capsys, "ir", EXAMPLES / "kda.toml", "-p", "derive-backward")
    assert code == 3 and one_line(err), err
    assert "NotImplementedError: derive-backward: k3s.chunk_decay has no adjoint rule" in err
    # a member without a gate has no chunk_decay to differentiate
    assert all(r.holds for r in prove_backward(spec_of("deltanet"), 3, lengths=(4,), seed=fresh_seed))


# --- k3c prove ------------------------------------------------------------------------------


def test_cli_prove_includes_the_backward(capsys, fresh_seed):
    """At every chunk size: the smallest at its three default lengths, the others at one (two
    chunks, the second partial)."""
    code, out, err = run_cli(capsys, "prove", EXAMPLES / "deltanet.toml", "--chunk-size", 2, "--chunk-size", 4,
                             "--draft-tokens", 1, "--seed", fresh_seed)
    assert code == 0, f"exit code {code}: {out}\n{err}"
    rows = re.findall(r"derive-backward\{chunk-size=(\d+)\}\s*│\s*(\d+)\s*│\s*equal\s*│\s*equal\s*│\s*proved", out)
    assert rows == [("2", "1"), ("2", "4"), ("2", "5"), ("4", "7")], out
    assert "outputs / grads" in out and "final state / dh0" in out


def test_cli_prove_of_a_wrong_backward_exits_1(capsys, monkeypatch, fresh_seed):
    monkeypatch.setitem(adjoint_rules.ADJOINT_RULES, k3s.ChunkDecayOp, chunk_decay_sign_flipped)
    code, out, err = run_cli(capsys, "prove", EXAMPLES / "gated_deltanet.toml", "--chunk-size", 3,
                             "--draft-tokens", 1, "--seed", fresh_seed)
    assert code == 1, f"exit code {code}: {out}\n{err}"
    # the backward's 3 rows fail, the forward's hold (its rules are no part of them)
    assert "dg differs" in out and re.search(r"\d+ passed, 3 failed", out), out
