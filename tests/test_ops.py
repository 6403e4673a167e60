"""k3compile.ops: fla's eight functions against the float64 reference (Triton interpreter, fp32).

Every expected value comes from k3compile.ir.reference.recurrence on an op built here from a
spec table written out per case (what fla's options mean, independently of k3compile.ops), on
fresh random inputs: odd T, varlen with an empty and a one-token sequence, initial states,
grouped value heads, K = 20 and V = 12 (not powers of two). Outputs are NaN-poisoned
(K3C_POISON_OUTPUTS). Shapes are tiny (H = 2, T <= 40) and the layers shared through the
ops' own cache, which lives in a temporary K3C_CACHE_DIR.
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, RecurrenceShape, assert_rms, one_line
from conftest import recurrence_inputs as conftest_inputs
from k3compile import ops
from k3compile.ir import reference
from k3compile.ops import layers

H, K, V = 2, 20, 12
CHUNK_TOL, RECURRENT_TOL = 1e-4, 1e-5
SEQLENS = (5, 0, 1, 13)  # an empty and a one-token sequence, T = 19


pytestmark = pytest.mark.usefixtures("own_ops_cache")


@functools.cache
def op_of(kind: str, HV: int = 2, layout: str = "kv", head_k_dim: int = K, **options):
    """The k3 op of a spec table written out in the test (the oracle's side of the mapping)."""
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    table = dict(name="oracle", kind=kind, num_heads=H, num_v_heads=HV, head_k_dim=head_k_dim, head_v_dim=V,
                 state_layout=layout, **options)
    return next(iter(spec_to_module(spec_from_table(table)).ops))


def draw(kind: str, B: int = 1, T: int = 19, HV: int = 2, seqlens=None, layout: str = "kv",
         initial_state: bool = True, head_k_dim: int = K) -> dict:
    """conftest's fresh inputs: unit q, k, log-sigmoid decays (>= -5), beta in (0, 1), 0.5 randn states."""
    if seqlens:
        B, T = 1, sum(seqlens)
    return conftest_inputs(kind, layout, RecurrenceShape(B, T, H, HV, head_k_dim, V, seqlens), initial_state)


def expected(op, x: dict, **extra):
    """The reference's (o, final_state) on the inputs of x (the names of the module's entries)."""
    names = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias", "scale")
    return reference.recurrence(op, **{n: x[n] for n in names if n in x}, output_final_state=True, **extra)


def assert_close(got, want, tol):
    (o, final), (ref_o, ref_final) = got, want
    assert_rms(o, ref_o, "o", tol)
    assert_rms(final, ref_final, "final_state", tol)


def raw_gate_inputs(x: dict, channel: bool, HV: int = 2) -> dict:
    """Raw gate projections and the in-kernel gate's parameters in place of log-decays."""
    x = dict(x)
    x["g"] = torch.randn_like(x["g"])
    x["A_log"] = -0.5 + 0.3 * torch.randn(HV)
    x["dt_bias"] = 0.5 * torch.randn(HV * K if channel else HV)
    return x


def raw_qk(x: dict) -> dict:
    """q, k not unit (for use_qk_l2norm_in_kernel)."""
    return {**x, "q": 3 * torch.randn_like(x["q"]), "k": 0.5 * torch.randn_like(x["k"])}


def raw_beta(x: dict) -> dict:
    """beta as logits (for use_beta_sigmoid_in_kernel)."""
    return {**x, "beta": 2 * torch.randn_like(x["beta"])}


# --- signatures: fla-core 0.6.0's, written out from its source ---------------------------------

FLA_SIGNATURES = {
    "chunk_kda": "q k v g beta scale=None initial_state=None output_final_state=False use_qk_l2norm_in_kernel=False "
                 "use_gate_in_kernel=False use_beta_sigmoid_in_kernel=False allow_neg_eigval=False safe_gate=False "
                 "lower_bound=None disable_recompute=False return_intermediate_states=False state_v_first=False "
                 "cu_seqlens=None cu_seqlens_cpu=None cp_context=None use_graph=False max_num_seqs=None **kwargs",
    "fused_recurrent_kda": "q k v g beta A_log=None dt_bias=None scale=None initial_state=None output_final_state=False "
                           "use_qk_l2norm_in_kernel=False use_gate_in_kernel=False use_beta_sigmoid_in_kernel=False "
                           "allow_neg_eigval=False lower_bound=None state_v_first=False cu_seqlens=None **kwargs",
    "chunk_gated_delta_rule": "q k v g beta scale=None initial_state=None output_final_state=False "
                              "use_qk_l2norm_in_kernel=False use_beta_sigmoid_in_kernel=False allow_neg_eigval=False "
                              "state_v_first=False cu_seqlens=None cu_seqlens_cpu=None chunk_indices=None "
                              "cp_context=None **kwargs",
    "fused_recurrent_gated_delta_rule": "q k v g=None gk=None gv=None beta=None scale=None initial_state=None "
                                        "output_final_state=False use_qk_l2norm_in_kernel=False "
                                        "use_gate_in_kernel=False A_log=None dt_bias=None "
                                        "use_beta_sigmoid_in_kernel=False allow_neg_eigval=False state_v_first=False "
                                        "cu_seqlens=None **kwargs",
    "chunk_delta_rule": "q k v beta scale=None initial_state=None output_final_state=False "
                        "use_qk_l2norm_in_kernel=False cu_seqlens=None cu_seqlens_cpu=None **kwargs",
    "fused_recurrent_delta_rule": "q k v beta=None scale=None initial_state=None output_final_state=False "
                                  "use_qk_l2norm_in_kernel=False cu_seqlens=None",
    "chunk_gla": "q k v g scale=None initial_state=None output_final_state=False state_v_first=False "
                 "cu_seqlens=None cu_seqlens_cpu=None",
    "fused_recurrent_gla": "q k v gk=None gv=None scale=None initial_state=None output_final_state=False reverse=False "
                           "state_v_first=False cu_seqlens=None **kwargs",
}
ALIASES = {"chunk_gdn": "chunk_gated_delta_rule", "fused_recurrent_gdn": "fused_recurrent_gated_delta_rule"}
MODULES = {"kda": ("chunk_kda", "fused_recurrent_kda"),
           "gated_delta_rule": ("chunk_gated_delta_rule", "chunk_gdn", "fused_recurrent_gated_delta_rule",
                                "fused_recurrent_gdn"),
           "delta_rule": ("chunk_delta_rule", "fused_recurrent_delta_rule"),
           "gla": ("chunk_gla", "fused_recurrent_gla")}


def signature_text(fn) -> str:
    words = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            words.append(f"**{p.name}")
        else:
            assert p.kind is p.POSITIONAL_OR_KEYWORD, f"{fn.__name__}: {p.name} must be positional as in fla"
            words.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return " ".join(words)


@pytest.mark.parametrize("name", sorted(FLA_SIGNATURES))
def test_signature_is_fla_060s(name):
    assert signature_text(getattr(ops, name)) == FLA_SIGNATURES[name]


def test_module_layout_mirrors_fla_ops():
    import importlib

    assert sorted(ops.__all__) == sorted([*FLA_SIGNATURES, *ALIASES])
    for alias, name in ALIASES.items():  # fla-core 0.6.0's short names are its functions
        assert getattr(ops, alias) is getattr(ops, name)
    for module, names in MODULES.items():
        sub = importlib.import_module(f"k3compile.ops.{module}")
        assert sorted(sub.__all__) == sorted(names)
        for name in names:
            assert getattr(sub, name) is getattr(ops, name)


# --- chunk_kda ---------------------------------------------------------------------------------


def test_chunk_kda_positional_odd_T():
    x = draw("kda", B=2, T=19)
    o, final = ops.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.3, x["initial_state"], True)
    assert o.dtype == x["q"].dtype and final.dtype == torch.float32
    assert_close((o, final), expected(op_of("kda"), {**x, "scale": 0.3}), CHUNK_TOL)


def test_chunk_kda_varlen_grouped_heads():
    x = draw("kda", HV=4, seqlens=SEQLENS)
    got = ops.chunk_kda(**x, output_final_state=True, cu_seqlens_cpu=x["cu_seqlens"].clone())
    assert_close(got, expected(op_of("kda", HV=4), x), CHUNK_TOL)
    assert torch.equal(got[1][1], x["initial_state"][1]), "the empty sequence's state must pass through"


def test_chunk_kda_gate_in_kernel_softplus_l2norm_beta_logits():
    x = raw_beta(raw_qk(raw_gate_inputs(draw("kda"), channel=True)))
    got = ops.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                        output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                        use_beta_sigmoid_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
    oracle = op_of("kda", qk_l2norm=True, gate_input="softplus", beta_input="logits")
    assert_close(got, expected(oracle, x), CHUNK_TOL)


def test_chunk_kda_bounded_gate_safe_without_A_log_neg_eigval():
    """safe_gate + use_gate_in_kernel + lower_bound: lower_bound sigmoid(g + dt_bias) when A_log
    is None (exp(A_log) = 1), dt_bias None: no bias; beta = 2 sigmoid(logits)."""
    x = raw_beta(draw("kda", B=2, T=9))
    x["g"] = 2 * torch.randn_like(x["g"])
    got = ops.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                        output_final_state=True, use_gate_in_kernel=True, safe_gate=True, lower_bound=-3.0,
                        use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    oracle = op_of("kda", gate_input="bounded", gate_lower_bound=-3.0, beta_input="logits_neg_eigval")
    assert_close(got, expected(oracle, {**x, "A_log": torch.zeros(2), "dt_bias": torch.zeros(2 * K)}), CHUNK_TOL)


def test_chunk_kda_safe_gate_clamps_gates_below_the_bound():
    """safe_gate with log-decays: fla requires g >= lower_bound (-5 by default); k3compile clamps,
    so gates below it (a third of these) decay by exactly exp(-5). State layout [V, K]."""
    x = draw("kda", layout="vk")
    x["g"] = -7.5 * torch.rand_like(x["g"])
    assert (x["g"] < -5).float().mean() > 0.2
    got = ops.chunk_kda(**x, output_final_state=True, safe_gate=True, state_v_first=True)
    assert_close(got, expected(op_of("kda", layout="vk", gate_input="clamped"), x), CHUNK_TOL)
    unclamped, _ = expected(op_of("kda", layout="vk"), x)
    assert (got[0] - unclamped).norm() / unclamped.norm() > 1e-3, "the clamp must matter on these gates"


def states_at_chunk_starts(oracle, x: dict, chunk_size: int, lengths) -> torch.Tensor:
    """h from the definition: the state after every multiple of chunk_size tokens of every
    sequence below its length (the initial state, or zeros, at 0), one reference run per prefix."""
    varlen = "cu_seqlens" in x
    h, start = [], 0
    for n, length in enumerate(lengths):
        row, begin = (0, start) if varlen else (n, 0)
        state = x["initial_state"][n:n + 1] if "initial_state" in x else torch.zeros(1, *x["v"].shape[2:3], K, V)
        for c in range(-(-length // chunk_size)):
            cut = {name: x[name][row:row + 1, begin:begin + c * chunk_size] for name in ("q", "k", "v", "g", "beta")}
            h.append(reference.recurrence(oracle, **cut, initial_state=state, output_final_state=True)[1][0])
        start += length
    return torch.stack(h)


def test_chunk_kda_intermediate_states_varlen():
    """h [1, all chunks, HV, V, K] (state_v_first) in the input dtype, chunks of 32: lengths 33
    (two chunks), 0, 1 and 32 (one chunk: its final state is not in h)."""
    lengths = (33, 0, 1, 32)
    x = draw("kda", seqlens=lengths, layout="vk")
    with torch.inference_mode():
        o, final, h = ops.chunk_kda(**x, output_final_state=True, return_intermediate_states=True, chunk_size=32,
                                    state_v_first=True)
    oracle = op_of("kda", layout="vk")
    assert_close((o, final), expected(oracle, x), CHUNK_TOL)
    assert h.dtype == x["q"].dtype and h.shape == (1, 2 + 0 + 1 + 1, 2, V, K)
    assert_rms(h[0], states_at_chunk_starts(oracle, x, 32, lengths), "h", CHUNK_TOL)


def test_chunk_kda_intermediate_states_batched_without_initial_state():
    x = draw("kda", B=2, T=33, initial_state=False)
    with torch.inference_mode():
        o, final, h = ops.chunk_kda(**x, return_intermediate_states=True, chunk_size=32)
    assert final is None and h.shape == (2, 2, 2, K, V)
    assert torch.equal(h[:, 0], torch.zeros_like(h[:, 0]))
    oracle = op_of("kda")
    assert_rms(h.reshape(-1, 2, K, V), states_at_chunk_starts(oracle, x, 32, [33, 33]), "h", CHUNK_TOL)
    assert_rms(o, reference.recurrence(oracle, **x)[0], "o", CHUNK_TOL)


# --- fused_recurrent_kda -------------------------------------------------------------------------


def test_fused_recurrent_kda_positional_gate_in_kernel_grouped():
    x = raw_beta(raw_qk(raw_gate_inputs(draw("kda", B=2, T=9, HV=4), channel=True, HV=4)))
    got = ops.fused_recurrent_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], 0.25,
                                  x["initial_state"], True, True, True, True)
    oracle = op_of("kda", HV=4, qk_l2norm=True, gate_input="softplus", beta_input="logits")
    assert_close(got, expected(oracle, {**x, "scale": 0.25}), RECURRENT_TOL)


def test_fused_recurrent_kda_bounded_varlen_bf16_initial_state():
    """lower_bound with the in-kernel gate (no safe range here: -7), A_log None, negative
    eigenvalues, varlen, and a bf16 initial state read as fp32 (as fla's kernel does)."""
    x = raw_beta(raw_gate_inputs(draw("kda", seqlens=SEQLENS), channel=True))
    del x["A_log"]
    x["initial_state"] = x["initial_state"].bfloat16()
    got = ops.fused_recurrent_kda(**x, output_final_state=True, use_gate_in_kernel=True, lower_bound=-7,
                                  use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    oracle = op_of("kda", gate_input="bounded", gate_lower_bound=-7.0, beta_input="logits_neg_eigval")
    assert_close(got, expected(oracle, {**x, "A_log": torch.zeros(2)}), RECURRENT_TOL)


def test_transpose_state_layout_is_state_v_first_with_fla_warning():
    x = draw("kda", B=2, T=5, layout="vk")
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        got = ops.fused_recurrent_kda(**x, output_final_state=True, transpose_state_layout=True)
    assert_close(got, expected(op_of("kda", layout="vk"), x), RECURRENT_TOL)
    with pytest.raises(ValueError, match="both"):
        ops.fused_recurrent_kda(**x, state_v_first=True, transpose_state_layout=True)


POOL_FUNCTIONS = {
    "kda": (ops.fused_recurrent_kda, "kda"),
    "gated_delta_rule": (ops.fused_recurrent_gated_delta_rule, "gated_deltanet"),
}


@pytest.mark.parametrize("family", sorted(POOL_FUNCTIONS))
def test_ssm_state_indices_updates_the_pool_in_place(family):
    """vLLM's continuous batching: rows named by ssm_state_indices advance in place, -1 padding
    starts from zeros and writes nothing, every other row stays bit-identical; returns (o, pool)."""
    fn, kind = POOL_FUNCTIONS[family]
    x = draw(kind, B=3, T=2, initial_state=False)
    pool = torch.randn(6, 2, K, V)
    before = pool.clone()
    slots = torch.tensor([4, -1, 1])
    o, returned = fn(**x, initial_state=pool, ssm_state_indices=slots)
    assert returned is pool
    starts = torch.stack([before[4], torch.zeros_like(before[0]), before[1]])
    ref_o, ref_final = expected(op_of(kind), {**x, "initial_state": starts})
    assert_rms(o, ref_o, "o", RECURRENT_TOL)
    assert_rms(pool[[4, 1]], ref_final[[0, 2]], "pool rows", RECURRENT_TOL)
    assert torch.equal(pool[[0, 2, 3, 5]], before[[0, 2, 3, 5]]), "rows not named must stay bit-identical"


def test_ssm_state_indices_varlen_of_one_length():
    """Varlen decode: sequences of one length run as a batch, an empty sequence touches nothing;
    ragged lengths are not supported by the decode entry (NotImplementedError)."""
    x = draw("kda", seqlens=(2, 0, 2), initial_state=False)
    pool = torch.randn(4, 2, K, V)
    before = pool.clone()
    o, _ = ops.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=torch.tensor([3, 1, 0]))
    ref_o, ref_final = expected(op_of("kda"), {**x, "initial_state": before[[3, 1, 0]]})
    assert_rms(o, ref_o, "o", RECURRENT_TOL)
    assert_rms(pool[[3, 0]], ref_final[[0, 2]], "pool rows", RECURRENT_TOL)
    assert torch.equal(pool[[1, 2]], before[[1, 2]]), "the empty sequence's row and unnamed rows stay"
    ragged = draw("kda", seqlens=(1, 2), initial_state=False)
    with pytest.raises(NotImplementedError, match="cu_seqlens"):
        ops.fused_recurrent_kda(**ragged, initial_state=pool, ssm_state_indices=torch.tensor([0, 1]))


@pytest.mark.parametrize("extra,error,name", [
    (dict(num_accepted_tokens=torch.tensor([1, 1])), NotImplementedError, "num_accepted_tokens"),
    (dict(ssm_state_indices=torch.tensor([[0, 1], [2, 3]])), NotImplementedError, "ssm_state_indices"),
    (dict(ssm_state_indices=torch.tensor([0, 1]), initial_state=None), ValueError, "ssm_state_indices"),
])
def test_pool_rejections(extra, error, name):
    x = draw("kda", B=2, T=1, initial_state=False)
    arguments = {"initial_state": torch.randn(4, 2, K, V), **x, **extra}
    with pytest.raises(error) as info:
        ops.fused_recurrent_kda(**arguments)
    assert name in str(info.value) and one_line(str(info.value))


# --- gated delta rule ------------------------------------------------------------------------------


def test_chunk_gated_delta_rule_varlen_grouped_bf16_state_and_host_tables():
    """A bf16 initial state is read as fp32 (fla's kernels do); cu_seqlens_cpu and fla's
    chunk_indices for chunk_size 16 are accepted (checked against cu_seqlens)."""
    x = draw("gated_deltanet", HV=4, seqlens=SEQLENS)
    x["initial_state"] = x["initial_state"].bfloat16()
    chunk_indices = torch.zeros(1 + 0 + 1 + 1, 2, dtype=torch.long)
    got = ops.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens_cpu=x["cu_seqlens"].clone(),
                                     chunk_indices=chunk_indices, chunk_size=16)
    assert_close(got, expected(op_of("gated_deltanet", HV=4), x), CHUNK_TOL)


def test_chunk_gated_delta_rule_gate_in_kernel_vk_neg_eigval():
    x = raw_beta(raw_qk(raw_gate_inputs(draw("gated_deltanet", B=2, T=19, layout="vk"), channel=False)))
    del x["dt_bias"]
    got = ops.chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                     use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True,
                                     use_gate_in_kernel=True)
    oracle = op_of("gated_deltanet", layout="vk", qk_l2norm=True, gate_input="softplus",
                   beta_input="logits_neg_eigval")
    assert_close(got, expected(oracle, {**x, "dt_bias": torch.zeros(2)}), CHUNK_TOL)


@pytest.mark.parametrize("gates", ["g", "gk", "g+gk", "none"])
def test_fused_recurrent_gated_delta_rule_gates(gates):
    """g: Gated DeltaNet; gk: a channel gate (KDA); both: KDA with log-decay g + gk; neither:
    DeltaNet (beta left out: ones, as in fla)."""
    x = draw("kda", B=2, T=9, HV=4)
    scalar = F.logsigmoid(torch.randn(2, 9, 4))
    call = {name: x[name] for name in ("q", "k", "v", "initial_state")}
    if gates == "none":
        oracle, ref = op_of("deltanet", HV=4), {**call, "beta": torch.ones(2, 9, 4)}
    else:
        call["beta"] = x["beta"]
        if gates == "g":
            call["g"] = scalar
            oracle, ref = op_of("gated_deltanet", HV=4), call
        elif gates == "gk":
            call["gk"] = x["g"]
            oracle, ref = op_of("kda", HV=4), {**call, "g": x["g"]}
        else:
            call.update(g=scalar, gk=x["g"])
            oracle, ref = op_of("kda", HV=4), {**call, "g": x["g"] + scalar[..., None]}
    got = ops.fused_recurrent_gated_delta_rule(**call, output_final_state=True)
    assert_close(got, expected(oracle, ref), RECURRENT_TOL)


def test_fused_recurrent_gated_delta_rule_gate_in_kernel_varlen():
    x = raw_gate_inputs(draw("gated_deltanet", seqlens=SEQLENS), channel=False)
    got = ops.fused_recurrent_gated_delta_rule(**x, output_final_state=True, use_gate_in_kernel=True)
    assert_close(got, expected(op_of("gated_deltanet", gate_input="softplus"), x), RECURRENT_TOL)


# --- delta rule ------------------------------------------------------------------------------------


def test_chunk_delta_rule_l2norm_odd_T():
    x = raw_qk(draw("deltanet", B=2, T=19))
    got = ops.chunk_delta_rule(x["q"], x["k"], x["v"], x["beta"], None, x["initial_state"], True, True, chunk_size=16)
    assert_close(got, expected(op_of("deltanet", qk_l2norm=True), x), CHUNK_TOL)


def test_chunk_delta_rule_varlen_grouped():
    x = draw("deltanet", HV=4, seqlens=SEQLENS)
    assert_close(ops.chunk_delta_rule(**x, output_final_state=True), expected(op_of("deltanet", HV=4), x), CHUNK_TOL)


def test_fused_recurrent_delta_rule_positional_beta_none():
    x = draw("deltanet", B=2, T=7)
    got = ops.fused_recurrent_delta_rule(x["q"], x["k"], x["v"], None, 0.5, x["initial_state"], True)
    want = expected(op_of("deltanet"), {**x, "beta": torch.ones(2, 7, 2), "scale": 0.5})
    assert_close(got, want, RECURRENT_TOL)


# --- GLA ---------------------------------------------------------------------------------------------


def test_chunk_gla_varlen_grouped_vk_unbounded_gates():
    x = draw("gla", HV=4, seqlens=SEQLENS, layout="vk")
    x["g"] = F.logsigmoid(3 * torch.randn_like(x["g"]))  # decays far below exp(-5) too
    got = ops.chunk_gla(**x, output_final_state=True, state_v_first=True)
    assert_close(got, expected(op_of("gla", HV=4, layout="vk"), x), CHUNK_TOL)


def test_chunk_gla_positional():
    x = draw("gla", B=2, T=19)
    got = ops.chunk_gla(x["q"], x["k"], x["v"], x["g"], 0.4, x["initial_state"], True)
    assert_close(got, expected(op_of("gla"), {**x, "scale": 0.4}), CHUNK_TOL)


def test_fused_recurrent_gla_without_gate_is_linear_attention():
    x = draw("gla", B=2, T=7)
    got = ops.fused_recurrent_gla(x["q"], x["k"], x["v"], initial_state=x["initial_state"], output_final_state=True)
    assert_close(got, expected(op_of("gla"), {**x, "g": torch.zeros_like(x["g"])}), RECURRENT_TOL)


def reversed_sequences(x: torch.Tensor, lengths) -> torch.Tensor:
    pieces, start = [], 0
    for length in lengths:
        pieces.append(x[:, start:start + length].flip(1))
        start += length
    return torch.cat(pieces, 1)


@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_fused_recurrent_gla_reverse(varlen):
    """reverse: every sequence from its last token to its first, o in token order."""
    x = draw("gla", seqlens=SEQLENS) if varlen else draw("gla", B=2, T=9)
    lengths = SEQLENS if varlen else None
    got = ops.fused_recurrent_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"],
                                  output_final_state=True, reverse=True, cu_seqlens=x.get("cu_seqlens"))
    flip = (lambda t: reversed_sequences(t, lengths)) if varlen else (lambda t: t.flip(1))
    flipped = {**x, **{name: flip(x[name]) for name in ("q", "k", "v", "g")}}
    ref_o, ref_final = expected(op_of("gla"), flipped)
    assert_close(got, (flip(ref_o), ref_final), RECURRENT_TOL)


# GLA wider than a kernel's key rows (256): key blocks, whose outputs sum (k3compile.ops.gla; the
# identity is proved in tests/test_prove.py). 300 keys: two blocks of 150, not powers of two.
WIDE_K = 300


def test_key_blocks_are_the_fewest_equal_ones_within_a_kernel():
    from k3compile.backends.triton.limits import MAX_HEAD_K_DIM
    from k3compile.ops.gla import KEY_BLOCK, key_blocks

    assert KEY_BLOCK == MAX_HEAD_K_DIM

    assert [(b.start, b.stop) for b in key_blocks(300)] == [(0, 150), (150, 300)]
    assert [(b.start, b.stop) for b in key_blocks(513)] == [(0, 171), (171, 342), (342, 513)]
    assert [(b.start, b.stop) for b in key_blocks(256)] == [(0, 256)]


def test_chunk_gla_wide_keys_varlen_grouped_vk():
    x = draw("gla", HV=4, seqlens=SEQLENS, layout="vk", head_k_dim=WIDE_K)
    got = ops.chunk_gla(**x, output_final_state=True, state_v_first=True)
    assert_close(got, expected(op_of("gla", HV=4, layout="vk", head_k_dim=WIDE_K), x), CHUNK_TOL)


def test_fused_recurrent_gla_wide_keys_reverse():
    x = draw("gla", B=2, T=9, head_k_dim=WIDE_K)
    got = ops.fused_recurrent_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["initial_state"],
                                  output_final_state=True, reverse=True)
    flipped = {**x, **{name: x[name].flip(1) for name in ("q", "k", "v", "g")}}
    ref_o, ref_final = expected(op_of("gla", head_k_dim=WIDE_K), flipped)
    assert_close(got, (ref_o.flip(1), ref_final), RECURRENT_TOL)


def test_chunk_gla_wide_keys_differentiate():
    """Every gradient through the key blocks (dv summed over them) against float64 autograd."""
    x = draw("gla", B=2, T=7, head_k_dim=WIDE_K)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    o, final = ops.chunk_gla(**leaves, output_final_state=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    ref_o, ref_final = expected(op_of("gla", head_k_dim=WIDE_K), references)
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


def test_chunk_gla_wide_keys_bad_state_names_the_whole_shape():
    x = draw("gla", B=2, T=5, head_k_dim=WIDE_K)
    with pytest.raises(ValueError) as info:
        ops.chunk_gla(**{**x, "initial_state": x["initial_state"][..., :150, :]})
    assert str(info.value).startswith(f"initial_state: expected [N, 2, {WIDE_K}, {V}]") and one_line(str(info.value))


# --- every keyword: rejected ones name themselves ----------------------------------------------------

KDA, GDN, DELTA, GLA = "kda", "gated_deltanet", "deltanet", "gla"
ARGUMENT_ERRORS = [
    # (function, kind of the inputs, extra arguments, exception, what the message names)
    ("chunk_kda", KDA, dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_kda", KDA, dict(use_graph=True), NotImplementedError, "use_graph"),
    ("chunk_kda", KDA, dict(max_num_seqs=4), NotImplementedError, "max_num_seqs"),
    ("chunk_kda", KDA, dict(disable_recompute=True, return_intermediate_states=True), ValueError, "disable_recompute"),
    ("chunk_kda", KDA, dict(head_first=False), TypeError, "head_first"),  # fla's chunk_kda never reads it
    ("chunk_kda", KDA, dict(chunk_sz=32), TypeError, "chunk_sz"),
    ("chunk_kda", KDA, dict(allow_neg_eigval=True), ValueError, "use_beta_sigmoid_in_kernel"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True), ValueError, "A_log"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2)), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, lower_bound=0.5), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(safe_gate=True, lower_bound=float("nan")), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(A_log=torch.zeros(2)), ValueError, "A_log"),
    ("chunk_kda", KDA, dict(chunk_size=16), ValueError, "`chunk_size` must be either 32 or 64 for KDA, got 16"),
    ("chunk_kda", KDA, dict(initial_state=torch.zeros(2, 2, K, V, dtype=torch.bfloat16)), ValueError, "float32"),
    ("chunk_kda", KDA, dict(return_intermediate_states=True), ValueError, "inference mode"),
    ("chunk_kda", KDA, dict(cu_seqlens=torch.tensor([0, 3, 5])), ValueError, "batch size"),
    ("chunk_kda", KDA, dict(cu_seqlens_cpu=torch.tensor([0, 5])), ValueError, "cu_seqlens_cpu"),
    ("chunk_kda", KDA, dict(q=torch.randn(2, 5, 2, 257), k=torch.randn(2, 5, 2, 257)), ValueError, "256"),
    ("fused_recurrent_kda", KDA, dict(safe_gate=True), TypeError, "safe_gate"),
    ("fused_recurrent_kda", KDA, dict(dt_bias=torch.zeros(2 * K)), ValueError, "dt_bias"),
    ("chunk_gated_delta_rule", GDN, dict(head_first=True), NotImplementedError, "head_first"),
    ("chunk_gated_delta_rule", GDN, dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_gated_delta_rule", GDN, dict(chunk_size=128), ValueError, "`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got 128"),
    ("chunk_gated_delta_rule", GDN, dict(use_gate_in_kernel=True), ValueError, "A_log"),
    ("chunk_gated_delta_rule", GDN, dict(chunk_indices=torch.zeros(3, 2)), ValueError, "chunk_indices"),
    ("chunk_gated_delta_rule", GDN, dict(gk=None), TypeError, "gk"),
    ("chunk_gated_delta_rule", GDN, dict(v=torch.randn(2, 5, 3, V)), ValueError, "num_v_heads (HV=3)"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(gv=torch.zeros(2, 5, 2, V)), NotImplementedError, "gv"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(use_gate_in_kernel=True, A_log=torch.zeros(2),
                                                   gk=torch.zeros(2, 5, 2, K)), NotImplementedError, "gk"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(use_gate_in_kernel=True, g=None, A_log=torch.zeros(2)),
     ValueError, "`g`"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(safe_gate=True), TypeError, "safe_gate"),
    ("chunk_delta_rule", DELTA, dict(head_first=True), NotImplementedError, "head_first"),
    ("chunk_delta_rule", DELTA, dict(v=torch.zeros(2, 5, 2, V, dtype=torch.float16)), ValueError, "dtype"),
    ("chunk_delta_rule", DELTA, dict(state_v_first=True), TypeError, "state_v_first"),
    ("fused_recurrent_delta_rule", DELTA, dict(scale=-1.0), ValueError, "scale"),
    ("fused_recurrent_delta_rule", DELTA, dict(chunk_size=16), TypeError, "chunk_size"),
    ("chunk_gla", GLA, dict(initial_state=torch.zeros(2, 2, K, V, dtype=torch.bfloat16)), ValueError, "float32"),
    ("chunk_gla", GLA, dict(reverse=True), TypeError, "reverse"),
    # o would come back in q's dtype where fla's is v's: refused, never a silent precision change
    ("chunk_kda", KDA, dict(k=torch.randn(2, 5, 2, K, dtype=torch.bfloat16)), ValueError, "one dtype"),
    ("chunk_gated_delta_rule", GDN, dict(v=torch.randn(2, 5, 2, V, dtype=torch.float16)), ValueError, "one dtype"),
    ("fused_recurrent_kda", KDA, dict(q=torch.randn(2, 5, 2, K, dtype=torch.bfloat16)), ValueError, "one dtype"),
    ("fused_recurrent_gla", GLA, dict(gv=torch.zeros(2, 5, 2, V)), NotImplementedError, "gv"),
    ("fused_recurrent_gla", GLA, dict(use_gate_in_kernel=True), TypeError, "use_gate_in_kernel"),
]


def kind_of(function: str) -> str:
    module = next(module for module, names in MODULES.items() if function in names)
    return {"kda": KDA, "gated_delta_rule": GDN, "delta_rule": DELTA, "gla": GLA}[module]


def call_inputs(function: str, kind: str) -> dict:
    x = draw(kind, B=2, T=5, initial_state=False)
    if function.startswith("fused_recurrent_gla"):
        x["gk"] = x.pop("g")
    return x


@pytest.mark.parametrize("function,kind,extra,error,name", ARGUMENT_ERRORS,
                         ids=[f"{c[0]}-{next(iter(c[2]))}-{c[3].__name__}" for c in ARGUMENT_ERRORS])
def test_bad_arguments_name_themselves(function, kind, extra, error, name):
    with pytest.raises(error) as info:
        getattr(ops, function)(**{**call_inputs(function, kind), **extra})
    message = str(info.value)
    assert name in message and one_line(message), message


@pytest.mark.parametrize("name", ["chunk_kda", "fused_recurrent_gla"])
def test_varlen_needs_one_initial_state_per_sequence(name):
    x = draw(kind_of(name), seqlens=SEQLENS)
    x["initial_state"] = x["initial_state"][:3]
    if name == "fused_recurrent_gla":
        x["gk"] = x.pop("g")
    with pytest.raises(ValueError, match="i.e., 4 rather than 3"):
        getattr(ops, name)(**x)


def test_every_kwargs_function_rejects_unknown_keywords():
    for name in FLA_SIGNATURES:
        with pytest.raises(TypeError, match="not_an_fla_keyword"):
            getattr(ops, name)(**call_inputs(name, kind_of(name)), not_an_fla_keyword=1)


@pytest.mark.parametrize("name", sorted(n for n in FLA_SIGNATURES if n.startswith("fused_recurrent")))
def test_recurrent_functions_differentiate_through_the_chunk_entry(name):
    """fused_recurrent_* have no backward of their own: under autograd they run the chunk function
    of the same arguments (the same function, with a derived backward), as fla's tests expect when
    they take a recurrent function's gradients for a reference. Gradients of every input against
    float64 autograd of the reference, at an odd length with initial states."""
    kind = kind_of(name)
    x = draw(kind, B=2, T=7)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    args = {**x, **leaves}
    if name == "fused_recurrent_gla":
        args["gk"] = args.pop("g")
    o, final = getattr(ops, name)(**args, output_final_state=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    ref_o, ref_final = expected(op_of(kind), {**x, **references})
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), f"d{n}"
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"{name}: d{n} relative error {error:.2e}"


def test_recurrent_gated_delta_rule_in_kernel_gate_differentiates():
    """The in-kernel gate (A_log, dt_bias) and beta logits travel to the chunk function: every
    gradient, the gate's parameters included, against float64 autograd of the reference."""
    x = raw_beta(raw_qk(raw_gate_inputs(draw("gated_deltanet", B=2, T=7), channel=False)))
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    o, final = ops.fused_recurrent_gated_delta_rule(**{**x, **leaves}, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                    use_beta_sigmoid_in_kernel=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    oracle = op_of("gated_deltanet", qk_l2norm=True, gate_input="softplus", beta_input="logits")
    ref_o, ref_final = expected(oracle, {**x, **references})
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_recurrent_gla_reverse_differentiates(varlen):
    """GLA's reverse under autograd: the chunk function over the sequences reversed in time; every
    gradient against float64 autograd of the reference on the reversed inputs."""
    lengths = SEQLENS if varlen else None
    x = draw("gla", B=1 if varlen else 2, T=7, seqlens=lengths)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    args = {**x, **leaves}
    args["gk"] = args.pop("g")
    o, final = ops.fused_recurrent_gla(**args, output_final_state=True, reverse=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    flip = (lambda t: reversed_sequences(t, lengths)) if varlen else (lambda t: t.flip(1))
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    flipped = {**x, **references, **{n: flip(references[n]) for n in ("q", "k", "v", "g")}}
    ref_o, ref_final = expected(op_of("gla"), flipped)
    ((flip(ref_o) * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


@pytest.mark.parametrize("gates", ["gk", "g+gk"])
def test_recurrent_gated_delta_rule_channel_gate_differentiates(gates):
    """fused_recurrent_gated_delta_rule with gk is KDA (log-decay gk + g with both): under autograd
    chunk_kda runs; gradients of q, k, v, beta, the gates and the state against float64 autograd."""
    x = draw("kda", B=2, T=9, HV=4)
    leaves = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "initial_state")}
    leaves["gk"] = x["g"].clone().requires_grad_()
    if gates == "g+gk":
        leaves["g"] = F.logsigmoid(torch.randn(2, 9, 4)).requires_grad_()
    o, final = ops.fused_recurrent_gated_delta_rule(**leaves, output_final_state=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    decay = references["gk"] + (references["g"][..., None] if gates == "g+gk" else 0)
    ref = {**{n: references[n] for n in ("q", "k", "v", "beta", "initial_state")}, "g": decay}
    ref_o, ref_final = expected(op_of("kda", HV=4), ref)
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


def test_recurrent_forms_without_a_chunk_function_refuse_grad():
    """A state pool (ssm_state_indices) has no chunk function: under autograd it is a one-line
    NotImplementedError."""
    x = call_inputs("fused_recurrent_kda", KDA)
    x["v"] = x["v"].requires_grad_()
    pool = torch.randn(4, 2, K, V)
    with pytest.raises(NotImplementedError) as info:
        ops.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=torch.tensor([2, 0]))
    assert "v requires grad" in str(info.value) and one_line(str(info.value))


def test_requires_grad_runs_under_no_grad():
    x = draw("gated_deltanet", B=2, T=5)
    x["q"].requires_grad_()
    with torch.no_grad():
        got = ops.fused_recurrent_gated_delta_rule(**x, output_final_state=True)
    assert_close(got, expected(op_of("gated_deltanet"), x), RECURRENT_TOL)


# --- the caches --------------------------------------------------------------------------------------


def test_new_batch_length_and_scale_reuse_the_layer(monkeypatch):
    """Once compiled, a layer serves every B, T and scale: lowering must not run again."""
    from k3compile import driver

    x = draw("gated_deltanet", B=2, T=5)
    ops.fused_recurrent_gated_delta_rule(**x)
    compiled = len(layers._LOADED)

    def no_lowering(*args, **kwargs):
        raise AssertionError("recompiled for a new batch size, length or scale")

    monkeypatch.setattr(driver, "lower", no_lowering)
    y = draw("gated_deltanet", B=3, T=8)
    got = ops.fused_recurrent_gated_delta_rule(**y, scale=0.7, output_final_state=True)
    assert_close(got, expected(op_of("gated_deltanet"), {**y, "scale": 0.7}), RECURRENT_TOL)
    assert len(layers._LOADED) == compiled


def test_compiler_fingerprint_follows_the_source(tmp_path, monkeypatch):
    """An edited compiler gives another fingerprint, hence another module name and file."""
    (tmp_path / "pass.py").write_text("x = 1\n")
    first = layers.source_fingerprint([tmp_path])
    (tmp_path / "pass.py").write_text("x = 2\n")
    assert layers.source_fingerprint([tmp_path]) != first
    key = layers.LayerKey("kda", 2, 2, K, V)
    name = key.module_name()
    monkeypatch.setattr(layers, "compiler_fingerprint", lambda: "edited")
    assert key.module_name() != name and key.module_name().isidentifier()


def test_cache_dir_is_a_folder_of_the_drivers():
    from k3compile.driver import default_cache_dir

    assert layers.cache_dir() == default_cache_dir() / "ops"


WARM_PROCESS = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from k3compile.ops import fused_recurrent_kda
    from k3compile.ops import layers
    inputs = torch.load(sys.argv[1])
    o, final = fused_recurrent_kda(**inputs, output_final_state=True)
    torch.save({"o": o, "final": final, "xdsl": "xdsl" in sys.modules,
                "files": sorted(p.name for p in layers.cache_dir().glob("*.py"))}, sys.argv[2])
""")


def test_second_process_imports_from_disk_without_xdsl(tmp_path):
    """A cold process compiles and writes the module; a second one with the same cache imports
    k3compile.ops and the module without xDSL (nothing compiled) and computes the same outputs,
    which match the reference."""
    x = draw("kda", B=2, T=6)
    torch.save(x, tmp_path / "inputs.pt")
    env = {**os.environ, "K3C_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for n in range(2):
        result = subprocess.run([sys.executable, "-c", WARM_PROCESS, str(tmp_path / "inputs.pt"),
                                 str(tmp_path / f"out{n}.pt")], env=env, capture_output=True, text=True, cwd=REPO)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(torch.load(tmp_path / f"out{n}.pt"))
    cold, warm = runs
    assert cold["xdsl"] and not warm["xdsl"], "the warm process must not import xDSL"
    assert len(cold["files"]) == 1 and warm["files"] == cold["files"]
    assert torch.equal(cold["o"], warm["o"]) and torch.equal(cold["final"], warm["final"])
    assert_close((warm["o"], warm["final"]), expected(op_of("kda"), x), RECURRENT_TOL)
