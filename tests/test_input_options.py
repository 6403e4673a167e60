"""In-kernel input options of the KDA family (fla's use_qk_l2norm_in_kernel, use_gate_in_kernel,
beta as logits): the compiled `recurrent` and `chunk` entries take raw q, k, g, beta (and the
gate's parameters A_log, dt_bias) and must match k3compile.ir.reference.recurrence on the same
raw inputs; the reference's transforms are checked against formulas written out here, and the
kernels against the plain (default-option) reference on inputs transformed by hand.

Triton interpreter, fp32, small dims with grouped value heads (H = 2, HV = 4) and K, V not
powers of two (24, 40); chunk size 16 with block-v 16, so the chunk entry runs several chunks
with a partial one and 3 value blocks.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rms as shared_assert_rms
from conftest import layer_op, one_line, recurrence_table, rms_ratio
from k3compile.errors import K3Error, SpecError
from k3compile.ir import reference
from k3compile.checking.verify import RecurrenceCase
from k3compile.checking.verify import recurrence_inputs as draw_inputs

H, HV, K, V = 2, 4, 24, 40
C = 16
PIPELINE = "lower-recurrent,derive-chunkwise{chunk-size=16},fuse-chunkwise{block-v=16}"
RMS_TOL = 1e-4
ENTRIES = ("recurrent", "chunk")

# (kind, layout, input options): every option on at least two members, softplus and bounded
# gates on both gate kinds, a non-default lower bound, beta as logits with and without a gate.
CASES = [
    ("kda", "kv", dict(qk_l2norm=True, gate_input="softplus", beta_input="logits")),
    ("kda", "vk", dict(gate_input="bounded", gate_lower_bound=-3.0)),
    ("gated_deltanet", "kv", dict(gate_input="softplus", beta_input="logits")),
    ("gated_deltanet", "vk", dict(qk_l2norm=True, gate_input="bounded")),
    ("gla", "vk", dict(qk_l2norm=True, gate_input="softplus")),
    ("gla", "kv", dict(gate_input="bounded", gate_lower_bound=-3.0)),
    ("kda", "kv", dict(gate_input="clamped", gate_lower_bound=-2.0)),
    ("gla", "vk", dict(gate_input="clamped", gate_lower_bound=-1.0)),  # a bound the inputs often cross
    ("deltanet", "kv", dict(qk_l2norm=True, beta_input="logits")),
    # negative eigenvalues (fla's allow_neg_eigval): beta = 2 sigmoid(logits) in (0, 2)
    ("deltanet", "vk", dict(beta_input="logits_neg_eigval")),
    ("kda", "kv", dict(qk_l2norm=True, gate_input="bounded", beta_input="logits_neg_eigval")),
    ("gated_deltanet", "kv", dict(gate_input="softplus", beta_input="logits_neg_eigval")),
]


def case_id(case) -> str:
    kind, layout, options = case
    return "-".join([kind, layout, *(f"{k}={v}" for k, v in options.items())])


def options_layer(compile_layer, kind: str, layout: str, **options):
    suffix = "_".join(f"{k}_{v}".replace("-", "m").replace(".", "p") for k, v in options.items())
    name = f"io_{kind}_{layout}_{suffix or 'plain'}"
    return compile_layer(pipeline=PIPELINE, **recurrence_table(kind, layout, H=H, HV=HV, K=K, V=V, name=name,
                                                                **options))


@pytest.fixture(params=CASES, ids=[case_id(c) for c in CASES])
def case(request, compile_layer):
    kind, layout, options = request.param
    return kind, layout, options, options_layer(compile_layer, kind, layout, **options)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def raw_inputs(layer, seed: int, batch: int = 2, length: int = 2 * C + 3, seqlens=None,
               initial_state: bool = True) -> dict:
    """k3compile.checking.verify's inputs for the layer's options: raw q, k (not unit) with qk_l2norm, raw
    gate projections plus A_log [HV] and dt_bias [HV * K] or [HV] with an in-kernel gate, beta
    logits with beta_input = logits."""
    case = RecurrenceCase("input options", batch, length, seqlens=seqlens, initial_state=initial_state)
    return draw_inputs(layer_op(layer), case, torch.float32, "cpu", generator(seed))


def assert_rms(out, ref, what: str, tol: float = RMS_TOL) -> None:
    shared_assert_rms(out, ref, what, tol)


# --- transforms written out by hand (independent of k3compile.ir.reference) ----------------


def hand_l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float64)
    out = torch.empty_like(x)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in x.shape[:-1])).reshape(-1, x.dim() - 1):
        row = x[tuple(index)]
        out[tuple(index)] = row / (float((row * row).sum()) + 1e-6) ** 0.5
    return out


def hand_gate(g, A_log, dt_bias, form: str, lower_bound: float = -5.0) -> torch.Tensor:
    """The log-decay of fla's in-kernel gates, element by element: value head h of g[..., h, c]
    (channel gate) uses A_log[h] and dt_bias[h * K + c]; a scalar gate g[..., h] uses dt_bias[h]."""
    g, A_log, dt_bias = (x.to(torch.float64) for x in (g, A_log, dt_bias))
    out = torch.empty_like(g)
    channel = g.dim() == 4
    for b in range(g.shape[0]):
        for t in range(g.shape[1]):
            for h in range(g.shape[2]):
                a = torch.exp(A_log[h])
                for c in range(g.shape[3] if channel else 1):
                    x = (g[b, t, h, c] + dt_bias[h * g.shape[3] + c]) if channel else (g[b, t, h] + dt_bias[h])
                    value = -a * torch.log1p(torch.exp(x)) if form == "softplus" else lower_bound * torch.sigmoid(a * x)
                    if channel:
                        out[b, t, h, c] = value
                    else:
                        out[b, t, h] = value
    return out


def hand_transformed(inputs: dict, options: dict) -> dict:
    """The raw inputs turned into the plain ones (unit q, k; log-decay g; beta in (0, 1))."""
    out = {name: x for name, x in inputs.items() if name not in ("A_log", "dt_bias")}
    if options.get("qk_l2norm"):
        out["q"], out["k"] = hand_l2norm(inputs["q"]), hand_l2norm(inputs["k"])
    if options.get("gate_input") == "clamped":
        lower_bound = options.get("gate_lower_bound", -5.0)
        out["g"] = torch.where(inputs["g"] < lower_bound, torch.full_like(inputs["g"], lower_bound), inputs["g"])
    elif options.get("gate_input", "log") != "log":
        out["g"] = hand_gate(inputs["g"], inputs["A_log"], inputs["dt_bias"], options["gate_input"],
                             options.get("gate_lower_bound", -5.0))
    if options.get("beta_input", "probability") != "probability":
        squashed = 1.0 / (1.0 + torch.exp(-inputs["beta"].to(torch.float64)))
        out["beta"] = 2 * squashed if options["beta_input"] == "logits_neg_eigval" else squashed
    return out


def op_of(kind: str, layout: str = "kv", **options):
    """A verified k3.recurrence of the test's dims (for the reference only, not compiled)."""
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    table = recurrence_table(kind, layout, H=H, HV=HV, K=K, V=V, name=f"ref_{kind}", **options)
    return next(iter(spec_to_module(spec_from_table(table)).ops))


# --- compiled entries against the reference ------------------------------------------------


@pytest.mark.parametrize("entry", ENTRIES)
def test_entries_match_reference(case, entry, fresh_seed):
    """Raw inputs, B = 2, T = 2C + 3 (two full chunks and a partial one), initial state: o and the
    final state of both entries against the float64 reference on the same raw inputs; then the
    same outputs against the plain reference on hand-transformed inputs (below)."""
    kind, layout, options, layer = case
    inputs = raw_inputs(layer, fresh_seed)
    assert ("A_log" in inputs) == (options.get("gate_input", "log") in ("softplus", "bounded"))
    expected_bias = HV * K if kind in ("kda", "gla") else HV
    if "dt_bias" in inputs:
        assert inputs["A_log"].shape == (HV,) and inputs["dt_bias"].shape == (expected_bias,)
    o, final = getattr(layer, entry)(**inputs, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert o.dtype == torch.float32 and final.dtype == torch.float32
    assert_rms(o, ref_o, f"{entry} o")
    assert_rms(final, ref_final, f"{entry} final_state")
    assert_hand_transformed(kind, layout, options, inputs, o, final, entry)


def assert_hand_transformed(kind: str, layout: str, options: dict, inputs: dict, o, final, entry: str) -> None:
    """The kernels' in-kernel transforms against the default-option reference fed inputs that
    were normalised / gated / squashed here by hand; and the options must matter. On the first
    sequence of the batch (its outputs depend on its inputs only): the hand transforms loop in
    Python, element by element."""
    inputs = {n: x[:1] if n in ("q", "k", "v", "g", "beta", "initial_state") else x for n, x in inputs.items()}
    o, final = o[:1], final[:1]
    plain = op_of(kind, layout)  # the same dims, default options
    for name in ("qk_l2norm", "gate_input", "beta_input"):
        assert plain.properties.get(name) is None
    ref_o, ref_final = reference.recurrence(plain, **hand_transformed(inputs, options), output_final_state=True)
    assert_rms(o, ref_o, f"{entry} o vs hand-transformed inputs")
    assert_rms(final, ref_final, f"{entry} final_state vs hand-transformed inputs")
    if options.get("qk_l2norm"):  # raw q, k (norm ~ sqrt(K)) would give a very different output
        untransformed = hand_transformed(inputs, {**options, "qk_l2norm": False})
        other, _ = reference.recurrence(plain, **untransformed)
        assert rms_ratio(o, other) > 1e-2, "qk_l2norm must matter"
    if options.get("beta_input", "probability") != "probability":  # applied once, and with its factor
        form = options["beta_input"]
        twice = hand_transformed(inputs, options)
        twice["beta"] = torch.sigmoid(twice["beta"])
        other, _ = reference.recurrence(plain, **twice)
        assert rms_ratio(o, other) > 1e-3, f"beta_input = {form} must be applied once"
        other_form = {"logits": "logits_neg_eigval", "logits_neg_eigval": "logits"}[form]
        other, _ = reference.recurrence(plain, **hand_transformed(inputs, {**options, "beta_input": other_form}))
        assert rms_ratio(o, other) > 1e-3, f"beta_input = {form} must differ from {other_form}"
    form = options.get("gate_input", "log")
    if form != "log":  # the other in-kernel form (or no clamp) gives other decays
        other_form = {"softplus": "bounded", "bounded": "softplus", "clamped": "log"}[form]
        swapped = hand_transformed(inputs, {**options, "gate_input": other_form})
        other, _ = reference.recurrence(plain, **swapped)
        assert rms_ratio(o, other) > 1e-3, f"gate_input = {form} must matter"


VARLEN = [CASES[0], CASES[3], CASES[4], CASES[10]]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("case", VARLEN, ids=[case_id(c) for c in VARLEN], indirect=True)
def test_varlen_matches_reference(case, entry, fresh_seed):
    """Packed sequences (short, empty, several chunks with a partial tail, one token): the gate
    parameters are per value head, not per sequence, so every sequence uses the same ones."""
    kind, layout, options, layer = case
    seqlens = (C // 2 + 1, 0, 2 * C + 3, 1)
    inputs = raw_inputs(layer, fresh_seed, seqlens=seqlens)
    o, final = getattr(layer, entry)(**inputs, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert_rms(o, ref_o, f"{entry} o")
    assert_rms(final, ref_final, f"{entry} final_state")
    assert torch.equal(final[1], inputs["initial_state"][1]), "the empty sequence's state must be untouched"


@pytest.mark.parametrize("kind,options", [
    ("gated_deltanet", dict(qk_l2norm=True, gate_input="softplus", beta_input="logits")),
    ("kda", dict(gate_input="bounded", beta_input="logits")),
], ids=["gated_deltanet-softplus", "kda-bounded"])
def test_large_gate_projections_stay_finite(compile_layer, kind, options, fresh_seed):
    """Large |g + dt_bias| and |beta| (softplus past its linear threshold, sigmoids saturated):
    finite outputs that match the reference (a scalar gate, or a channel gate bounded at the
    default -5; unbounded channel-gate decays: the test below)."""
    layer = options_layer(compile_layer, kind, "kv", **options)
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=C + 3)
    inputs["g"] = inputs["g"] * 30.0
    inputs["beta"] = inputs["beta"] * 30.0
    for entry in ENTRIES:
        o, final = getattr(layer, entry)(**inputs, output_final_state=True)
        ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
        assert_rms(o, ref_o, f"{entry} o")
        assert_rms(final, ref_final, f"{entry} final_state")


@pytest.mark.parametrize("entry", ENTRIES)
def test_channel_softplus_gate_with_strong_decays(compile_layer, entry, fresh_seed):
    """KDA with a softplus gate and fla's A_log range (A = exp(A_log) = 16): per-token decays of
    about -11, a state that forgets fast but stays finite in the reference."""
    layer = options_layer(compile_layer, "kda", "kv", gate_input="softplus")
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=C + 3)
    inputs["A_log"] = torch.full((HV,), math.log(16.0))
    inputs["dt_bias"] = torch.zeros(HV * K)
    inputs["g"] = torch.zeros_like(inputs["g"])  # g = -16 softplus(0) = -11.1 everywhere
    o, final = getattr(layer, entry)(**inputs, output_final_state=True)
    ref_o, ref_final = reference.recurrence(layer_op(layer), **inputs, output_final_state=True)
    assert_rms(o, ref_o, f"{entry} o")
    assert_rms(final, ref_final, f"{entry} final_state")


# --- the reference's transforms, checked by hand --------------------------------------------


@pytest.mark.parametrize("kind", ["kda", "gated_deltanet"])
@pytest.mark.parametrize("form", ["softplus", "bounded"])
def test_reference_gate_transform_by_hand(kind, form):
    lower_bound = -3.0
    op = op_of(kind, gate_input=form, gate_lower_bound=lower_bound)
    channel = kind == "kda"
    B, T = 2, 3
    g = 3.0 * torch.randn(B, T, HV, K) if channel else 3.0 * torch.randn(B, T, HV)
    A_log = torch.randn(HV)
    dt_bias = torch.randn(HV * K if channel else HV)
    q = k = torch.randn(B, T, H, K)
    _, _, ref_g, _ = reference.recurrence_inputs(op, q, k, g, None, A_log, dt_bias)
    assert ref_g.dtype == torch.float64 and ref_g.shape == g.shape
    expected = hand_gate(g, A_log, dt_bias, form, lower_bound)
    torch.testing.assert_close(ref_g, expected, rtol=1e-12, atol=1e-12)
    # one element written out without hand_gate's indexing, for the formula itself
    if channel:
        x = float(g[1, 2, 3, 5]) + float(dt_bias[3 * K + 5])
        value = float(ref_g[1, 2, 3, 5])
    else:
        x = float(g[1, 2, 3]) + float(dt_bias[3])
        value = float(ref_g[1, 2, 3])
    a = float(torch.exp(A_log[3].double()))
    formula = -a * math.log1p(math.exp(x)) if form == "softplus" else lower_bound * (1 / (1 + math.exp(-a * x)))
    assert value == pytest.approx(formula, rel=1e-6, abs=1e-12)
    # a log-decay, never positive: softplus in (-inf, 0), bounded in (lower_bound, 0) -- strictly
    # inside where the sigmoid is not rounded to 0 or 1 in float64
    assert (ref_g <= 0).all()
    if form == "bounded":
        assert (ref_g >= lower_bound).all()
        a_x = torch.exp(A_log.double())[:, None] * (g.double() + dt_bias.double().reshape(HV, -1)) if channel \
            else torch.exp(A_log.double()) * (g.double() + dt_bias.double())
        moderate = a_x.abs() < 30
        assert moderate.any()
        assert ((ref_g[moderate] > lower_bound) & (ref_g[moderate] < 0)).all()
    else:
        assert (ref_g[(g + dt_bias.reshape(HV, -1).squeeze(-1)) > -30] < 0).all()


def test_reference_bounded_gate_default_lower_bound_and_extremes():
    op = op_of("gated_deltanet", gate_input="bounded")
    g = torch.tensor([[[-1e3, -5.0, 0.0, 5.0]]])  # B=1, T=1, HV=4
    _, _, ref_g, _ = reference.recurrence_inputs(op, torch.randn(1, 1, H, K), torch.randn(1, 1, H, K), g, None,
                                                 torch.zeros(HV), torch.zeros(HV))
    ref_g = ref_g.flatten()
    assert ref_g[0] == pytest.approx(0.0, abs=1e-300)  # sigmoid(-1000) -> 0: no decay
    assert ref_g[2] == pytest.approx(-2.5)  # lower_bound * sigmoid(0) = -5 / 2
    assert -5.0 < ref_g[3] < ref_g[2] < ref_g[1] < 0.0
    assert ref_g[3] > -5.0 and ref_g[3] == pytest.approx(-5.0 / (1 + torch.exp(torch.tensor(-5.0)).item()))


def test_reference_l2norm_gives_unit_vectors():
    op = op_of("kda", qk_l2norm=True)
    q, k = 7.0 * torch.randn(2, 3, H, K), torch.randn(2, 3, H, K) / 5.0
    q[0, 0, 0] = 0.0  # the eps keeps a zero row finite (and zero)
    ref_q, ref_k, _, _ = reference.recurrence_inputs(op, q, k, None, None)
    norms_q, norms_k = ref_q.norm(dim=-1), ref_k.norm(dim=-1)
    assert ref_q[0, 0, 0].abs().max() == 0.0
    norms_q[0, 0, 0] = 1.0
    # unit up to the eps: |x| / sqrt(|x|^2 + 1e-6), within 1e-6 / |x|^2 of 1 (|k| ~ 1 here)
    torch.testing.assert_close(norms_q, torch.ones_like(norms_q), rtol=0, atol=1e-7)
    torch.testing.assert_close(norms_k, torch.ones_like(norms_k), rtol=0, atol=1e-5)
    raw_k = k.double().norm(dim=-1)
    torch.testing.assert_close(norms_k, raw_k / torch.sqrt(raw_k**2 + 1e-6), rtol=1e-12, atol=1e-12)
    assert (norms_k < 1).all() and (norms_q <= 1).all()
    # the direction is kept
    torch.testing.assert_close(ref_q * q.double().norm(dim=-1, keepdim=True), q.double(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ref_k, hand_l2norm(k), rtol=1e-12, atol=1e-12)
    # without the option q and k are only upcast
    plain_q, plain_k, _, _ = reference.recurrence_inputs(op_of("kda"), q, k, None, None)
    assert torch.equal(plain_q, q.double()) and torch.equal(plain_k, k.double())


def test_reference_beta_logits_and_defaults_untouched():
    beta = 4.0 * torch.randn(2, 3, HV)
    g = F.logsigmoid(torch.randn(2, 3, HV, K))
    q, k = torch.randn(2, 3, H, K), torch.randn(2, 3, H, K)
    _, _, _, ref_beta = reference.recurrence_inputs(op_of("kda", beta_input="logits"), q, k, g, beta)
    torch.testing.assert_close(ref_beta, 1.0 / (1.0 + torch.exp(-beta.double())), rtol=1e-12, atol=1e-12)
    assert ((ref_beta > 0) & (ref_beta < 1)).all()
    plain = reference.recurrence_inputs(op_of("kda"), q, k, g, beta)
    for got, given in zip(plain, (q, k, g, beta)):
        assert torch.equal(got, given.double())


# --- argument errors of the compiled entries -------------------------------------------------


def entry_error(fn, **inputs) -> str:
    with pytest.raises(ValueError) as info:
        fn(**inputs)
    message = str(info.value)
    assert one_line(message), f"not one line: {message!r}"
    return message


@pytest.fixture
def gate_layers(compile_layer):
    """Softplus-gate and log-gate KDA layers, and a softplus-gate Gated DeltaNet (scalar gate)."""
    return {
        "softplus": options_layer(compile_layer, "kda", "kv", gate_input="softplus"),
        "log": options_layer(compile_layer, "kda", "kv"),
        "scalar": options_layer(compile_layer, "gated_deltanet", "kv", gate_input="softplus"),
    }


@pytest.mark.parametrize("entry", ENTRIES)
def test_in_kernel_gate_without_A_log(gate_layers, entry, fresh_seed):
    layer = gate_layers["softplus"]
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=3)
    del inputs["A_log"]
    message = entry_error(getattr(layer, entry), **inputs)
    assert "A_log" in message
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=3)
    del inputs["dt_bias"]
    assert "dt_bias" in entry_error(getattr(layer, entry), **inputs)


@pytest.mark.parametrize("entry", ENTRIES)
def test_log_gate_rejects_gate_parameters(gate_layers, entry, fresh_seed):
    layer = gate_layers["log"]
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=3)
    assert "A_log" not in inputs and "dt_bias" not in inputs
    message = entry_error(getattr(layer, entry), **inputs, A_log=torch.zeros(HV))
    assert "A_log" in message
    message = entry_error(getattr(layer, entry), **inputs, dt_bias=torch.zeros(HV * K))
    assert "dt_bias" in message


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("which,bad_shape", [("softplus", (HV,)), ("softplus", (HV, K)), ("scalar", (HV * K,)),
                                             ("scalar", (HV + 1,))])
def test_wrong_dt_bias_shape(gate_layers, entry, which, bad_shape, fresh_seed):
    """dt_bias is [HV * K] for a channel gate, [HV] for a scalar one: anything else names dt_bias."""
    layer = gate_layers[which]
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=3)
    inputs["dt_bias"] = torch.zeros(bad_shape)
    message = entry_error(getattr(layer, entry), **inputs)
    assert message.startswith("dt_bias"), message


@pytest.mark.parametrize("entry", ENTRIES)
def test_wrong_A_log_shape(gate_layers, entry, fresh_seed):
    layer = gate_layers["softplus"]
    inputs = raw_inputs(layer, fresh_seed, batch=1, length=3)
    inputs["A_log"] = torch.zeros(HV * K)
    assert entry_error(getattr(layer, entry), **inputs).startswith("A_log")


# --- spec keys -------------------------------------------------------------------------------


def build(table: dict):
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    return spec_to_module(spec_from_table(dict(table), source="<options test>"))


def spec_error(table: dict) -> str:
    with pytest.raises(SpecError) as info:
        build(table)
    message = str(info.value)
    assert isinstance(info.value, K3Error) and isinstance(info.value, ValueError)
    assert one_line(message), f"not one line: {message!r}"
    assert "<options test>" in message, f"source not named: {message!r}"
    return message


@pytest.mark.parametrize("form", ["softplus", "bounded"])
def test_spec_in_kernel_gate_needs_a_gate(form):
    message = spec_error(recurrence_table("deltanet", gate_input=form))
    assert "gate_input" in message


def test_spec_unknown_gate_input():
    message = spec_error(recurrence_table("kda", gate_input="exp"))
    assert "gate_input" in message
    for allowed in ("log", "softplus", "bounded"):
        assert allowed in message
    assert "'exp'" in message


def test_spec_unknown_beta_input():
    message = spec_error(recurrence_table("kda", beta_input="sigmoid"))
    assert "beta_input" in message and "probability" in message and "logits" in message


@pytest.mark.parametrize("form", ["logits", "logits_neg_eigval"])
def test_spec_beta_logits_needs_the_delta_rule(form):
    assert "beta_input" in spec_error(recurrence_table("gla", beta_input=form))


def test_reference_negative_eigenvalue_beta_reaches_two():
    """beta = 2 sigmoid(logits): large logits give beta near 2, so I - beta k k^T reflects a unit key."""
    q = k = torch.nn.functional.normalize(torch.randn(1, 2, H, K), dim=-1)
    g, beta = torch.zeros(1, 2, HV, K), torch.full((1, 2, HV), 30.0)
    _, _, _, ref_beta = reference.recurrence_inputs(op_of("kda", beta_input="logits_neg_eigval"), q, k, g, beta)
    assert torch.allclose(ref_beta, torch.full_like(ref_beta, 2.0))


@pytest.mark.parametrize("bound", [0.0, 0, 1.5])
def test_spec_lower_bound_negative(bound):
    assert "gate_lower_bound" in spec_error(recurrence_table("kda", gate_input="bounded", gate_lower_bound=bound))


@pytest.mark.parametrize("key,value", [("qk_l2norm", 1), ("qk_l2norm", "true"), ("gate_lower_bound", "low"),
                                       ("gate_input", True)])
def test_spec_option_types(key, value):
    assert key in spec_error(recurrence_table("kda", **{key: value}))


def test_spec_options_reach_the_op_and_defaults_are_left_out():
    op = next(iter(build(recurrence_table("gated_deltanet", qk_l2norm=True, gate_input="bounded",
                                          gate_lower_bound=-2, beta_input="logits")).ops))
    assert op.input_option("qk_l2norm") is True
    assert op.input_option("gate_input") == "bounded"
    assert op.input_option("gate_lower_bound") == -2.0
    assert op.input_option("beta_input") == "logits"
    plain = next(iter(build(recurrence_table("gated_deltanet", qk_l2norm=False, gate_input="log",
                                             gate_lower_bound=-5.0, beta_input="probability")).ops))
    for name in ("qk_l2norm", "gate_input", "gate_lower_bound", "beta_input"):
        assert plain.properties.get(name) is None, f"{name} at its default must be left out"
        assert plain.input_option(name) == plain.INPUT_DEFAULTS[name]


def test_input_option_qk_l2norm_is_a_bool():
    on = next(iter(build(recurrence_table("kda", qk_l2norm=True)).ops))
    off = next(iter(build(recurrence_table("kda")).ops))
    assert off.input_option("qk_l2norm") is False
    assert on.input_option("qk_l2norm") is True
