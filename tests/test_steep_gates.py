"""Gates of any steepness: log-decays of -3e4, -1e9, -3e38 and -inf (a full reset) in the chunk
path (forward, segment summaries through `segments`, backward) of every gated member, against the
float64 token recurrence and its autograd.

exp(g) is exactly zero in fp32 below about -104, so the gate loads raise such log-decays to a
floor of -110 (k3s.load_gate's floor, ir/choices.py ZERO_DECAY_FLOOR): before that, a chunk's
cumulative log-decays (in fp32, multiples of 64 at -1e9) lost the small gates after the steep
one (an RMS ratio of 2e-4 at -3e4, 1.4 at -1e9) and -inf gave NaN. Triton interpreter, fp32
(and bf16, with every gate at -5).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rms, layer_op
from k3compile.ir import reference
from k3compile.checking.verify_backward import chunk_backward_gradients, draw_cotangents, reference_gradients

RMS_TOL = 1e-4  # the chunk path's fp32 tolerance (tests/test_chunk.py); gates of -5 get ~1e-6
H, HV, K, V = 2, 4, 16, 24
STEEP = (-3e4, -1e9, -3e38, float("-inf"))
GATED = ("kda", "gated_deltanet", "gla")


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    """layers(kind, **overrides) -> CompiledLayer, the default pipeline (chunks of 16), fp32."""
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    cache = {}

    def get(kind: str, **overrides):
        key = (kind, tuple(sorted(overrides.items())))
        if key not in cache:
            table = dict(name=f"steep_{kind}_{len(cache)}", kind=kind, num_heads=H, num_v_heads=HV, head_k_dim=K,
                         head_v_dim=V, dtype="float32", **overrides)
            spec = spec_from_table(table, source=f"<test_steep_gates {kind}>")
            cache[key] = k3_compile(spec, out_dir=tmp_path_factory.mktemp(f"steep_{kind}"))
        return cache[key]

    return get


def steep_inputs(kind: str, value: float, T: int = 41) -> dict:
    """Unit q, k, mild log-sigmoid gates, and `value` at: one token mid-chunk (5), the first and
    last of the second chunk (16, 31), and three in a row of the third (35-37) — a random half of
    the channels each for a channel gate, the whole head for a scalar one."""
    x = {"q": F.normalize(torch.randn(1, T, H, K), dim=-1), "k": F.normalize(torch.randn(1, T, H, K), dim=-1),
         "v": torch.randn(1, T, HV, V), "initial_state": 0.5 * torch.randn(1, HV, K, V)}
    channel = kind != "gated_deltanet"
    g = F.logsigmoid(torch.randn(1, T, HV, K) if channel else torch.randn(1, T, HV))
    for t in (5, 16, 31, 35, 36, 37):
        if channel:
            half = torch.rand(HV, K) < 0.5
            g[0, t][half] = value
        else:
            g[0, t] = value
    x["g"] = g
    if kind != "gla":
        x["beta"] = torch.rand(1, T, HV)
    return x


@pytest.mark.parametrize("value", STEEP, ids=[f"{v:g}" for v in STEEP])
@pytest.mark.parametrize("kind", GATED)
def test_chunk_forward_equals_the_recurrence(layers, kind, value):
    layer = layers(kind)
    x = steep_inputs(kind, value)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **x, output_final_state=True)
    o, final = layer.chunk(**x, output_final_state=True)
    assert_rms(o, ref_o, "o", RMS_TOL)
    assert_rms(final, ref_final, "final_state", RMS_TOL)
    # split into segments: each summarised by segment_summary's kernels, combined, finished
    o, final = layer.chunk(**x, output_final_state=True, segments=3)
    assert_rms(o, ref_o, "o (segments=3)", RMS_TOL)
    assert_rms(final, ref_final, "final_state (segments=3)", RMS_TOL)


@pytest.mark.parametrize("value", (-1e9, float("-inf")), ids=["-1e9", "-inf"])
@pytest.mark.parametrize("kind", GATED)
def test_chunk_backward_equals_autograd_of_the_recurrence(layers, kind, value):
    layer = layers(kind)
    op = layer_op(layer)
    x = steep_inputs(kind, value)
    do, dht = draw_cotangents(op, x, with_dht=True)
    got = chunk_backward_gradients(layer.module, x, do, dht, output_dh0=True)
    want = reference_gradients(op, x, do, dht)
    for name, value in got.items():
        assert_rms(value, want[name], f"d{name}", RMS_TOL)
    # the decay's derivative is exp(g): nothing at a reset
    reset = x["g"] == x["g"].min()
    assert torch.equal(got["g"][reset], torch.zeros_like(got["g"][reset]))


@pytest.mark.parametrize("kind", ("kda", "gla"))
def test_bf16_gate_gradient_with_every_gate_at_the_bound(layers, kind):
    """bf16 inputs (fla's draws: positive q, k, v) with every log-decay in [-5.1, -5], a bounded
    gate at its bound: each gradient within fla's bf16 tolerance, dg included. The gate's
    cotangent q q_bar - k k_bar cancels the Gram's undecayed diagonal exactly; with that diagonal
    in the bf16 product (the factored contraction's operands) it kept the diagonal's rounding:
    dg at RMS ratios of 8e-2 to 2.6e-1 (fla allows 2e-2), ~3e-3 with it added in fp32."""
    from k3compile.checking.verify_backward import gradient_tolerance

    layer = layers(kind)
    op = layer_op(layer)
    T = 41
    x = {name: torch.rand(1, T, HV if name == "v" else H, V if name == "v" else K) for name in ("q", "k", "v")}
    if kind == "kda":
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
        x["beta"] = torch.rand(1, T, HV)
    x["g"] = -5 - 0.1 * torch.rand(1, T, HV, K)
    x = {name: t.bfloat16() for name, t in x.items()}
    x["initial_state"] = 0.5 * torch.randn(1, HV, K, V)
    do, dht = draw_cotangents(op, x, with_dht=True)
    got = chunk_backward_gradients(layer.module, x, do, dht, output_dh0=True)
    want = reference_gradients(op, x, do, dht)
    for name, value in got.items():
        assert_rms(value, want[name], f"d{name}", gradient_tolerance(f"d{name}", torch.bfloat16))


@pytest.mark.parametrize("kind", ("kda", "gated_deltanet"))
def test_in_kernel_softplus_gate_beyond_exp_range(layers, kind):
    """-exp(A_log) softplus(g + dt_bias) with A_log = 30: log-decays near -1e13, computed in the
    kernel, forward and backward (dA_log, ddt_bias included)."""
    layer = layers(kind, gate_input="softplus")
    op = layer_op(layer)
    x = steep_inputs(kind, 0.0)
    x["g"] = torch.randn_like(x["g"])
    x["A_log"] = torch.tensor([-0.5, 30.0, -0.3, 0.1])  # value head 1 resets at every token
    x["dt_bias"] = 0.5 * torch.randn(HV * K if kind == "kda" else HV)
    ref_o, ref_final = reference.recurrence(op, **x, output_final_state=True)
    o, final = layer.chunk(**x, output_final_state=True)
    assert_rms(o, ref_o, "o", RMS_TOL)
    assert_rms(final, ref_final, "final_state", RMS_TOL)
    do, dht = draw_cotangents(op, x, with_dht=True)
    got = chunk_backward_gradients(layer.module, x, do, dht, output_dh0=True)
    want = reference_gradients(op, x, do, dht)
    for name, value in got.items():
        assert_rms(value, want[name], f"d{name}", RMS_TOL)


def test_ops_chunk_kda_matches_fused_recurrent_at_a_reset():
    """The issue's repro through k3compile.ops: one token's gates at -1e9 and at -inf."""
    from k3compile.ops.kda import chunk_kda, fused_recurrent_kda

    T = 20
    q, k = F.normalize(torch.randn(1, T, 2, 16), dim=-1), F.normalize(torch.randn(1, T, 2, 16), dim=-1)
    v, beta = torch.randn(1, T, 2, 32), torch.rand(1, T, 2)
    for value in (-1e9, float("-inf")):
        g = F.logsigmoid(torch.randn(1, T, 2, 16))
        g[0, 5] = value
        o_chunk, _ = chunk_kda(q, k, v, g, beta)
        o_token, _ = fused_recurrent_kda(q, k, v, g, beta)
        assert_rms(o_chunk, o_token.double(), f"chunk_kda vs fused_recurrent_kda at g = {value:g}", RMS_TOL)
