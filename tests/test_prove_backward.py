"""`k3c prove` of derive-backward: the backward schedule's gradients equal the token recurrence's
derivative in exact arithmetic (k3compile.checking.prove.prove_backward), for every member, input form and
small chunk size; deliberately wrong adjoint rules fail it and the proof names the gradient they
break; an op without a rule is derive-backward's NotImplementedError."""

from __future__ import annotations

import random
import re
import sys
from dataclasses import replace

import numpy as np
import pytest
import sympy
import torch

from conftest import DELTA_OF_KIND, EXAMPLES, GATE_OF_KIND, RECURRENCE_KINDS, one_line, recurrence_table, run_cli
from k3compile.backends.triton.lower import STAGE_CHOICES, write_choices
from k3compile.backends.triton.printer.common import register
from k3compile.checking import exact_backward
from k3compile.ir import k3s
from k3compile.passes import adjoint_rules, derive_backward
from k3compile.checking.prove import (PROOF_K, PROOF_V, derived, dual_loss_derivative, gradient_shapes, proof_inputs,
                                      prove_backward, prove_input_forms, random_matrix)
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


# Input forms. The schedule's proof runs one head and one value head (prove.small_op) on inputs
# given as the loads' results: in exact.py a load is the identity (q and k as the rows the schedule
# reads, the decays given as factors whatever gate_input says, beta as the probability whatever
# beta_input says), and the run collects the cotangent of each load's result. So prove_backward
# proves the schedule's algebra, which every form shares: the gradients with respect to what the
# loads make. prove_input_forms proves the rest, each store's chain rule back to the raw inputs
# (l2norm, the gate's clamp, softplus or bounded sigmoid with A_log and dt_bias, beta's sigmoid) as
# the derivative of its load's form, symbolically. What else the forms change in the schedule is
# checked below: the stores carry the form, a bounded gate's Grams are factored (no span check: one
# run per length), softplus' are guarded (both outcomes), and logits_neg_eigval draws beta in (0, 2)
# (proof_inputs). The sum of a group's q, k cotangents over its value heads is the kernels' (not
# proved: one value head here). The proof inputs' decays are k/9 >= 1/9, above every lower bound
# the clamp applies; the chain rule's proof takes the gate on each side of the bound and at it.
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
    ("gated_deltanet", {"gate_input": "bounded", "gate_lower_bound": -3.0}),
    ("gla", {"gate_input": "clamped", "gate_lower_bound": -1.0}),
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

    # the stores' chain rules, one row per store in the schedule's order, each with its form
    rows = prove_input_forms(spec, 2)
    assert [r.schedule.split(": ")[1].split()[2] for r in rows] == list(stores)
    assert all(r.holds and (r.length, r.outputs_equal, r.state_equal) == (None, True, None) for r in rows), \
        [r.first_mismatch for r in rows]
    forms = {r.schedule.split(" (")[0].rpartition(" ")[2]: r.schedule.split(" (")[1].split(")")[0] for r in rows}
    assert forms["q"] == forms["k"] == ("l2norm" if options.get("qk_l2norm") else "as given")
    bound = options.get("gate_lower_bound", -5.0)
    if "g" in stores:
        assert forms["g"] == {"log": "log", "softplus": "softplus", "clamped": f"clamped at {bound:g}",
                              "bounded": f"bounded by {bound:g}"}[gate_input]
        assert rows[3].schedule.endswith(": " + ", ".join(f"d{p}" for p in params))


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
    return {op.total: e.neg(RULES[k3s.ChunkDecayOp](e, op, decay_bar)[op.total])}


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


def beta_bar_without_the_inverse(e, op, T_bar):
    """T = (I + A)^-1 Diag(beta): beta's cotangent as diag(T_bar) instead of diag((I + A)^-T T_bar)."""
    cotangents = RULES[k3s.ForwardSubstitutionOp](e, op, T_bar)
    return {**cotangents, op.beta: e.emit(k3s.DiagonalOp, [T_bar], cotangents[op.beta].type)}


def residual_state_sign_flipped(e, op, vr_bar):
    """vr = U - W S: the entering state's cotangent W^T vr_bar instead of -W^T vr_bar."""
    cotangents = RULES[k3s.DeltaResidualOp](e, op, vr_bar)
    return {**cotangents, op.state: e.neg(cotangents[op.state])}


# (op type, wrong rule, kind, the mismatch the proof at T = 5, C = 3 reports: a pattern)
WRONG_RULES = (
    [(k3s.ChunkDecayOp, chunk_decay_sign_flipped, kind, "dg differs") for kind in GATED_KINDS]
    # dg too for a channel gate, whose cotangent the rule takes from the keys' side
    + [(k3s.GramOp, gram_keys_transpose_dropped, kind, r"dk differs(; dg differs)?") for kind in RECURRENCE_KINDS]
    + [(k3s.ForwardSubstitutionOp, beta_bar_without_the_inverse, kind, "dbeta differs") for kind in DELTA_KINDS]
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
    """The triangular inverse moved after its readers (the verifier does not order a block's uses):
    the exact run meets a value not yet made, and every row fails saying which, not an error."""
    original = derive_backward.backward_schedule

    def inverse_last(*args, **kwargs):
        chunked = original(*args, **kwargs)
        block = chunked.body.block
        inverse = next(op for op in block.ops if isinstance(op, k3s.UnitLowerInverseOp))
        inverse.detach()
        block.add_op(inverse)
        return chunked

    monkeypatch.setattr(derive_backward, "backward_schedule", inverse_last)
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


# --- deliberately wrong chain rules fail, naming the gradient they break ----------------------


def l2norm_projection_sign_flipped(x_bar, x, epsilon):
    """(x_bar + u (u . x_bar)) / |x| instead of (x_bar - u (u . x_bar)) / |x|."""
    norm = sympy.sqrt(x.dot(x) + epsilon)
    unit = x / norm
    return (x_bar + unit * unit.dot(x_bar)) / norm


def clamp_passing_everything(x_bar, g, lower_bound):
    """The clamp's cotangent passed below its bound too."""
    return x_bar


def softplus_derivative_as_exp(z, a, lower_bound):
    """dg/dz of -a softplus(z) taken as -a exp(z) instead of -a sigmoid(z)."""
    return -a * sympy.exp(z), -a * exact_backward.softplus(z)


def bounded_dA_log_without_z(z, a, lower_bound):
    """dg/dA_log of bound sigmoid(a z) taken as dg/dz."""
    dz, _ = RULES_OF_FORMS["bounded"](z, a, lower_bound)
    return dz, dz


RULES_OF_FORMS = dict(exact_backward.GATE_DERIVATIVES)

# (what to patch, its wrong value, the layer's options, {store: the mismatch its row must say})
WRONG_CHAIN_RULES = [
    ((exact_backward, "l2norm_cotangent", l2norm_projection_sign_flipped), ("kda", {"qk_l2norm": True}),
     {"q": "dq differs", "k": "dk differs"}),
    ((exact_backward, "clamp_cotangent", clamp_passing_everything), ("gated_deltanet", {"gate_input": "clamped"}),
     {"g": "dg differs"}),
    ((exact_backward.GATE_DERIVATIVES, "softplus", softplus_derivative_as_exp), ("kda", {"gate_input": "softplus"}),
     {"g": "dg differs; ddt_bias differs"}),
    ((exact_backward.GATE_DERIVATIVES, "bounded", bounded_dA_log_without_z), ("gla", {"gate_input": "bounded"}),
     {"g": "dA_log differs"}),
    ((exact_backward.BETA_DERIVATIVES, "logits_neg_eigval", exact_backward.BETA_DERIVATIVES["logits"]),
     ("deltanet", {"beta_input": "logits_neg_eigval"}), {"beta": "dbeta differs"}),
]


@pytest.mark.parametrize("patch, layer, says", WRONG_CHAIN_RULES,
                         ids=[f"{p[2].__name__ if callable(p[2]) and p[2].__name__ != '<lambda>' else p[1]}-{k}"
                              for p, (k, _), _ in WRONG_CHAIN_RULES])
def test_wrong_chain_rule_not_proved(monkeypatch, patch, layer, says):
    """A chain rule broken in the stores' semantics fails its store's row, naming the gradients it
    breaks; every other store's row holds."""
    where, name, wrong = patch
    if isinstance(where, dict):
        monkeypatch.setitem(where, name, wrong)
    else:
        monkeypatch.setattr(where, name, wrong)
    kind, options = layer
    rows = prove_input_forms(spec_from_table(recurrence_table(kind, name=f"{kind}_wrong", **options)), 2)
    failed = {r.schedule.split(": ")[1].split()[2]: r.first_mismatch for r in rows if not r.holds}
    assert failed == says
    assert all(r.outputs_equal is False and r.state_equal is None for r in rows if not r.holds)


def test_store_with_a_bound_other_than_its_loads_not_proved(monkeypatch):
    """derive-backward copying a clamp's bound wrongly onto its store (-4 where the load clamps at
    -5): the gradient below the load's bound but above the store's passes, and dg's row fails."""
    from xdsl.dialects.builtin import FloatAttr, f64

    original = derive_backward.store_cotangent

    def wrong_bound(load, cotangent, values):
        store = original(load, cotangent, values)
        if store.lower_bound is not None:
            store.properties["lower_bound"] = FloatAttr(-4.0, f64)
        return store

    monkeypatch.setattr(derive_backward, "store_cotangent", wrong_bound)
    rows = prove_input_forms(spec_from_table(recurrence_table("kda", name="kda_clamped", gate_input="clamped")), 2)
    assert [(r.schedule.split(": ")[1], r.first_mismatch) for r in rows if not r.holds] == \
        [("store_cotangent of g (clamped at -4)", "dg differs")]


# --- the printer's chain rules in float64: its Triton text against the semantics and autograd -------
# The stores' formulas are two texts: the printer's Triton (backends/triton/printer/adjoint_stages.py)
# and exact_backward's sympy, which the proof takes. Here the printer's text for a store (and for
# its load) runs in float64 with numpy standing in for triton.language, in a chunk tile wider than
# the tokens and channels (masked rows and columns holding garbage), and must agree with the
# semantics to 1e-12, which must agree with torch autograd of ir/reference.py's input forms.


class Registers(np.ndarray):
    """A tile in registers: `.to(dtype)` keeps it float64."""

    def to(self, dtype):
        return self


def tile(x) -> Registers:
    return np.asarray(x, dtype=np.float64).view(Registers)


class Memory:
    """A tensor argument: `name + offsets` is a Pointer."""

    def __init__(self, values) -> None:
        self.data = np.array(values, dtype=np.float64).ravel()

    def __add__(self, offsets):
        return Pointer(self, np.asarray(offsets))


class Pointer:
    __array_ufunc__ = None  # `pointer + offsets` is the pointer's, not numpy's

    def __init__(self, memory: Memory, offsets) -> None:
        self.memory, self.offsets = memory, offsets

    def __add__(self, offsets):
        return Pointer(self.memory, self.offsets + np.asarray(offsets))


def masked(pointer: Pointer, mask):
    memory, offsets = pointer.memory, pointer.offsets
    shape = np.broadcast_shapes(offsets.shape, np.shape(mask) if mask is not None else ())
    keep = np.broadcast_to(True if mask is None else mask, shape)
    return memory, np.broadcast_to(offsets, shape), keep


class NumpyTriton:
    """What the printed stores and loads call of triton.language, in float64."""

    float32 = None
    sqrt, exp, log, minimum, maximum = (staticmethod(lambda *a, f=f: tile(f(*a)))
                                        for f in (np.sqrt, np.exp, np.log, np.minimum, np.maximum))

    @staticmethod
    def sigmoid(x):
        return tile(1 / (1 + np.exp(-x)))

    @staticmethod
    def where(condition, a, b):
        return tile(np.where(condition, a, b))

    @staticmethod
    def sum(x, axis=None):
        return tile(np.sum(x, axis=axis))

    @staticmethod
    def load(pointer, mask=None, other=0.0):
        memory, offsets, keep = masked(pointer, mask)
        return tile(np.where(keep, memory.data[np.where(keep, offsets, 0)], other))

    @staticmethod
    def store(pointer, value, mask=None):
        memory, offsets, keep = masked(pointer, mask)
        memory.data[offsets[keep]] = np.broadcast_to(value, offsets.shape)[keep]

    @staticmethod
    def atomic_add(pointer, value, mask=None):
        memory, offsets, keep = masked(pointer, mask)
        np.add.at(memory.data, np.atleast_1d(offsets[keep]), np.atleast_1d(np.broadcast_to(value, offsets.shape)[keep]))


def printed(print_op, op) -> str:
    from k3compile.backends.triton.printer import TritonPrinter
    from k3compile.backends.triton.printer.common import Code

    printer = TritonPrinter()
    printer.code = Code()
    getattr(printer, print_op)(op)
    return printer.code.text()


def reference_forms(layer_op, raw: dict, T: int, K: int) -> dict:
    """ir/reference.py's recurrence_inputs on one head's raw tiles ({name: [T, K] or [T, 1], A_log,
    dt_bias}), as float64 tensors that require grad -> ({name: tensor}, {input: its loaded tile})."""
    from k3compile.ir.reference import recurrence_inputs

    tensors = {name: torch.tensor(np.asarray(value, dtype=np.float64), requires_grad=True)
               for name, value in raw.items()}
    q = tensors.get("q", torch.zeros(T, K, dtype=torch.float64))
    k = tensors.get("k", torch.zeros(T, K, dtype=torch.float64))
    g = tensors.get("g")
    if g is not None:
        g = g[None, :, None] if g.shape[1] == K and layer_op.gate.data == "channel" else g[:, 0][None, :, None]
    beta = tensors["beta"][:, 0][None, :, None] if "beta" in tensors else None
    A_log = tensors["A_log"].reshape(1) if "A_log" in tensors else None
    dt_bias = tensors["dt_bias"].reshape(-1) if "dt_bias" in tensors else None
    q, k, g, beta = recurrence_inputs(layer_op, q[None, :, None], k[None, :, None], g, beta, A_log, dt_bias)
    loaded = {"q": q[0, :, 0], "k": k[0, :, 0]}
    if g is not None:
        loaded["g"] = g[0, :, 0] if layer_op.gate.data == "channel" else g[0, :, 0][:, None]
    if beta is not None:
        loaded["beta"] = beta[0, :, 0][:, None]
    return tensors, loaded


PRINTED_FORMS = [
    ("kda", {"qk_l2norm": True, "gate_input": "softplus", "beta_input": "logits"}),
    ("kda", {"gate_input": "bounded", "gate_lower_bound": -3.0, "beta_input": "logits_neg_eigval"}),
    ("kda", {"gate_input": "clamped", "gate_lower_bound": -1.0}),
    ("gated_deltanet", {"qk_l2norm": True, "gate_input": "bounded", "beta_input": "logits"}),
    ("gated_deltanet", {"gate_input": "softplus", "beta_input": "logits_neg_eigval"}),
    ("gated_deltanet", {"gate_input": "clamped", "gate_lower_bound": -1.0}),
    ("gla", {}),
    ("deltanet", {}),
]


def semantics_in_float64(form, raw: dict, cotangent) -> tuple[np.ndarray, dict]:
    """(load_result, store_gradients) on float64 raw tiles, evaluated at 30 digits."""
    def exact(value):
        return sympy.Float(value, 30) if np.ndim(value) == 0 else sympy.Matrix(np.atleast_2d(value)).applyfunc(
            lambda e: sympy.Float(e, 30))

    exact_raw = {name: exact(value) for name, value in raw.items()}
    epsilon = sympy.Float(1e-6, 30)  # the kernels' and the reference's
    gradients = exact_backward.store_gradients(form, sympy.Matrix(cotangent), exact_raw, epsilon)
    gradients = {name: np.array(sympy.Matrix([g] if np.ndim(raw[name]) == 0 else g).evalf(), dtype=np.float64)
                 .reshape(np.shape(raw[name])) for name, g in gradients.items()}
    return np.array(exact_backward.load_result(form, exact_raw, epsilon).evalf(), dtype=np.float64), gradients


PRINT_LOAD = {k3s.LoadChunkOp: "print_k3s_load_chunk", k3s.LoadGateOp: "print_k3s_load_gate",
              k3s.LoadBetaOp: "print_k3s_load_beta"}


def run_printed(load, store, raw: dict, cotangent, rng) -> tuple[np.ndarray, dict]:
    """The printed load and store on one head's tiles of T tokens and their width, in a tile of 8
    rows and 4 columns whose masked entries hold garbage: (the loaded rows, {name: gradient})."""
    (T, width), rows, cols = cotangent.shape, 8, 4
    key_width = cotangent.shape[1] if store.of.data != "v" else 3
    program = {"H": 1, "HV": 1, "i_h": 0, "i_hv": 0, "K": key_width, "V": width,
               "t_c": np.arange(rows), "m_c": np.arange(rows) < T, "o_k": np.arange(cols),
               "m_k": np.arange(cols) < key_width, "o_v": np.arange(cols), "m_v": np.arange(cols) < width}
    memory = {n: Memory(v) for n, v in raw.items()} | {f"d{n}": Memory(np.zeros(np.size(v))) for n, v in raw.items()}
    padded = rng.standard_normal((rows, cols if width > 1 else 1))
    padded[:T, :width] = cotangent
    namespace = {"tl": NumpyTriton, **program, **memory,
                 register(store.cotangent): tile(padded if width > 1 else padded[:, 0])}
    exec(printed(PRINT_LOAD[type(load)], load), namespace)
    loaded = np.asarray(namespace[register(load.results[0])], dtype=np.float64).reshape(rows, -1)[:T, :width]
    exec(printed("print_k3s_store_cotangent", store), namespace)
    return loaded, {name: memory[f"d{name}"].data.reshape(np.shape(value)) for name, value in raw.items()}


@pytest.mark.parametrize("kind, options", PRINTED_FORMS,
                         ids=[f"{kind}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for kind, o in PRINTED_FORMS])
def test_printed_chain_rules_equal_the_semantics(kind, options, fresh_seed):
    rng = np.random.default_rng(fresh_seed)
    T, K = 5, 3  # tokens and key channels
    spec = spec_from_table(recurrence_table(kind, name=f"{kind}_printed", **options))
    layer_op, module = derived(spec, "derive-backward{chunk-size=8}")
    block = next(op for op in module.walk() if isinstance(op, k3s.ChunkedBackwardOp)).body.block
    loads = {exact_backward.load_form(op).of: op for op in block.ops
             if isinstance(op, (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp))}
    for load in loads.values():  # what lower-to-triton writes on a kernel's loads (a load's own choice)
        for choices in STAGE_CHOICES.get(type(load), ()):
            write_choices(load, choices(load, None))
    for store in (op for op in block.ops if isinstance(op, k3s.StoreCotangentOp)):
        form = exact_backward.store_form(store)
        width = 1 if form.of == "beta" or (form.of == "g" and not form.channel) else K
        raw = {form.inputs[0]: rng.uniform(-3, 3, (T, width))}
        if form.form == "clamped":  # rows on both sides of the bound
            raw["g"] = float(form.lower_bound) + rng.choice([-1, 1], (T, width)) * rng.uniform(0.1, 2, (T, width))
        if len(form.inputs) == 3:
            raw["A_log"] = rng.uniform(-1, 1)
            raw["dt_bias"] = rng.uniform(-1, 1, width) if form.channel else rng.uniform(-1, 1)
        cotangent = rng.standard_normal((T, width))
        loaded, gradients = semantics_in_float64(form, raw, cotangent)
        printed_loaded, printed_gradients = run_printed(loads[form.of], store, raw, cotangent, rng)

        np.testing.assert_allclose(printed_loaded, loaded, rtol=1e-12, atol=1e-14, err_msg=f"{form.of}'s printed load")
        for name in form.inputs:
            np.testing.assert_allclose(printed_gradients[name], gradients[name], rtol=1e-12, atol=1e-14,
                                       err_msg=f"d{name}: the printed store against the semantics ({form})")
        if form.of == "v":
            continue
        tensors, reference = reference_forms(layer_op, raw, T, K)
        np.testing.assert_allclose(loaded, reference[form.of].detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=f"{form.of}: the semantics' load against the reference's")
        (reference[form.of] * torch.tensor(cotangent)).sum().backward()
        for name in form.inputs:
            np.testing.assert_allclose(gradients[name], tensors[name].grad.numpy(), rtol=1e-12, atol=1e-14,
                                       err_msg=f"d{name}: the semantics against autograd ({form})")


def test_printed_chain_rule_broken_fails(monkeypatch, fresh_seed):
    """The float64 check above is no formality: the bounded sigmoid's derivative s (1 + s) in the
    printed text instead of s (1 - s) fails it, at dg."""
    original = printed
    monkeypatch.setattr(sys.modules[__name__], "printed",
                        lambda print_op, op: original(print_op, op).replace("1.0 - b_s", "1.0 + b_s"))
    with pytest.raises(AssertionError, match="dg: the printed store against the semantics"):
        test_printed_chain_rules_equal_the_semantics("gated_deltanet", {"gate_input": "bounded"}, fresh_seed)


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
    # the stores' chain rules, once (at the smallest size): no length, no state
    forms = re.findall(r"derive-backward\{chunk-size=(\d+)\}: store_cotangent of (\w+) \(([\w ]+)\): ([\w, ]+?)"
                       r"\s*│\s*-\s*│\s*equal\s*│\s*-\s*│\s*proved", out)
    assert forms == [("2", "q", "as given", "dq"), ("2", "k", "as given", "dk"), ("2", "v", "as given", "dv"),
                     ("2", "beta", "probability", "dbeta")], out


def test_cli_prove_of_a_wrong_chain_rule_exits_1(capsys, monkeypatch, tmp_path, fresh_seed):
    """A layer with every kind of input form; softplus' derivative broken: its store's row alone fails."""
    spec = tmp_path / "kda_forms.toml"
    spec.write_text('[layer]\nname = "kda_forms"\nkind = "kda"\nnum_heads = 2\nhead_k_dim = 16\nhead_v_dim = 16\n'
                    'qk_l2norm = true\ngate_input = "softplus"\nbeta_input = "logits"\n')
    monkeypatch.setitem(exact_backward.GATE_DERIVATIVES, "softplus", softplus_derivative_as_exp)
    code, out, err = run_cli(capsys, "prove", spec, "--chunk-size", 2, "--draft-tokens", 1, "--seed", fresh_seed)
    assert code == 1, f"exit code {code}: {out}\n{err}"
    assert re.search(r"store_cotangent of g\b.*│\s*DIFFER\s*│\s*-\s*│\s*FAILED dg differs; ddt_bias differs",
                     out), out
    assert re.search(r"\d+ passed, 1 failed", out), out


def test_cli_prove_of_a_wrong_backward_exits_1(capsys, monkeypatch, fresh_seed):
    monkeypatch.setitem(adjoint_rules.ADJOINT_RULES, k3s.ChunkDecayOp, chunk_decay_sign_flipped)
    code, out, err = run_cli(capsys, "prove", EXAMPLES / "gated_deltanet.toml", "--chunk-size", 3,
                             "--draft-tokens", 1, "--seed", fresh_seed)
    assert code == 1, f"exit code {code}: {out}\n{err}"
    # the backward's 3 rows fail, the forward's hold (its rules are no part of them)
    assert "dg differs" in out and re.search(r"\d+ passed, 3 failed", out), out
