"""k3compile.ops: fla's eight functions against the float64 reference (Triton interpreter, fp32).

Every expected value comes from k3compile.ir.reference.recurrence on an op built here from a
spec table written out per case (what fla's options mean, independently of k3compile.ops), on
fresh random inputs: odd T, varlen with an empty and a one-token sequence, initial states,
grouped value heads, K = 20 and V = 12 (not powers of two). Outputs are NaN-poisoned
(K3C_POISON_OUTPUTS). Shapes are tiny (H = 2, T <= 40) and the layers shared through the
ops' own cache, which lives in a temporary K3C_CACHE_DIR.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rms, one_line
from k3compile import ops
from k3compile.ir import reference
from ops_cases import (ALIASES, CHUNK_TOL, FLA_SIGNATURES, K, MODULES, RECURRENT_TOL, SEQLENS, V, assert_close, draw,
                       expected, op_of, raw_beta, raw_gate_inputs, raw_qk, reversed_sequences)

pytestmark = pytest.mark.usefixtures("own_ops_cache")


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
