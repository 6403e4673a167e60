"""The derived backward (derive-backward, lower-backward): every recurrence module's
`chunk_backward` against float64 torch autograd of k3compile.ir.reference.recurrence, with the
loss L = <do, o> + <dht, final_state>; autograd through k3compile.ops (its custom op); the
gradients' causality; the entry's one-line refusals.

Each layer is one of the example specs (examples/<member>.toml) made small (2 heads, fp32) and
compiled once per module. The kernels run in Triton's interpreter (fp32): each gradient must be
finite, fp32, of its input's shape, and within RTOL of the reference in relative norm.
"""

from __future__ import annotations

import tomllib

import pytest
import torch
import torch.nn.functional as F

from conftest import EXAMPLES, one_line
from k3compile.checking.verify_backward import chunk_backward_gradients, draw_cotangents, reference_gradients, state_shape

RTOL = 1e-4  # relative norm per gradient; the interpreter's fp32 gets ~1e-7
MEMBERS = ("kda", "gated_deltanet", "deltanet", "gla")
# the entry's pipeline: the default one, but the backward's scans in value blocks of 16 (so a V of
# 20 runs a full block and a partial one)
BACKWARD_PIPELINE = "derive-backward{chunk-size=16},lower-backward{block-v=16},outline-kernels"
SEQLENS = (5, 0, 1, 19, 17)  # packed: an empty and a one-token sequence, odd lengths (16 + 3, 16 + 1)


# --- layers: an example spec made small, compiled once per module ---------------------------


def example_table(member: str) -> dict:
    with open(EXAMPLES / f"{member}.toml", "rb") as stream:
        return tomllib.load(stream)["layer"]


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    """layers(member, pipeline=None, **overrides) -> CompiledLayer: examples/<member>.toml at
    H = HV = 2, K = 16, V = 8, fp32, with `overrides`; each distinct layer compiled once."""
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    cache = {}

    def get(member: str, pipeline: str | None = None, **overrides):
        key = (member, pipeline, tuple(sorted(overrides.items())))
        if key not in cache:
            table = {**example_table(member), "num_heads": 2, "num_v_heads": 2, "head_k_dim": 16, "head_v_dim": 8,
                     "dtype": "float32", **overrides}
            spec = spec_from_table(table, source=f"<test_backward {member}>")
            cache[key] = k3_compile(spec, out_dir=tmp_path_factory.mktemp(f"bw_{member}"), pipeline=pipeline)
        return cache[key]

    return get


def op_of(layer):
    from k3compile.frontend import spec_to_module

    return next(iter(spec_to_module(layer.spec).ops))


# --- inputs and the float64 oracle ----------------------------------------------------------


def draw_inputs(op, B: int, T: int, seqlens=None, initial_state: bool = True) -> dict:
    """Fresh random inputs (never zeros) for the op's input forms: unit q, k (raw with qk_l2norm);
    log-sigmoid decays, or with a clamped gate many below the bound, or raw projections and A_log,
    dt_bias with an in-kernel gate; beta in (0, 1), or logits."""
    H, HV = op.num_heads.value.data, op.num_v_heads.value.data
    K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
    if seqlens is not None:
        B, T = 1, sum(seqlens)
    N = len(seqlens) if seqlens is not None else B
    raw_qk = op.input_option("qk_l2norm")
    x = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, HV, V)}
    if not raw_qk:
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    gate = op.gate.data
    if gate != "none":
        shape = (B, T, HV, K) if gate == "channel" else (B, T, HV)
        form = op.input_option("gate_input")
        if form == "log":
            x["g"] = F.logsigmoid(torch.randn(shape))
        elif form == "clamped":  # about half below a bound of -1: their gradient is zero
            x["g"] = F.logsigmoid(3 * torch.randn(shape))
        else:
            x["g"] = torch.randn(shape)
            x["A_log"] = -0.5 + 0.3 * torch.randn(HV)
            x["dt_bias"] = 0.5 * torch.randn(HV * K if gate == "channel" else HV)
    if op.delta_rule.value.data:
        logits = torch.randn(B, T, HV)
        x["beta"] = logits if op.input_option("beta_input") != "probability" else torch.sigmoid(logits)
    if initial_state:
        x["initial_state"] = 0.5 * torch.randn(*state_shape(op, N))
    if seqlens is not None:
        x["cu_seqlens"] = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int64)
    return x


def assert_grad(got, want, what: str, like: torch.Tensor | None = None, tol: float = RTOL) -> None:
    assert got is not None, f"{what}: no gradient"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if like is not None:
        assert got.dtype == like.dtype, f"{what}: dtype {got.dtype}, its input's is {like.dtype}"
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    assert torch.isfinite(want).all(), f"{what}: the reference is not finite"
    err = (got.double() - want).norm().item() / max(want.norm().item(), 1e-30)
    assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.0e}"


def check_backward(layer, x: dict, with_dht: bool, output_dh0: bool) -> dict:
    """chunk_backward against the oracle; returns the kernels' gradients."""
    op = op_of(layer)
    do, dht = draw_cotangents(op, x, with_dht)
    got = chunk_backward_gradients(layer.module, x, do, dht, output_dh0)
    want = reference_gradients(op, x, do, dht)
    for name, value in got.items():
        if name == "h0":
            continue
        assert value.dtype == torch.float32, f"d{name}: {value.dtype}, expected float32"
        assert_grad(value, want[name], f"d{name}")
    if output_dh0:
        assert_grad(got["h0"], want["h0"], "dh0")
    else:
        assert got["h0"] is None, "dh0 returned without output_dh0"
    return got


# --- every member, fixed length and varlen --------------------------------------------------


SCENARIOS = {
    # B = 2, T = 37: chunks of 16, 16 and 5; an initial state, dht, dh0
    "T37-h0-dht-dh0": dict(B=2, T=37, initial_state=True, with_dht=True, output_dh0=True),
    # no initial state, no dht, no dh0 (None), the other gradients still right
    "T37-no-state": dict(B=1, T=37, initial_state=False, with_dht=False, output_dh0=False),
    # an initial state but no dh0 asked for
    "T21-h0-no-dh0": dict(B=1, T=21, initial_state=True, with_dht=True, output_dh0=False),
    # packed sequences: an empty one (its dh0 is its dht), a one-token one, odd lengths
    "varlen": dict(B=1, T=None, seqlens=SEQLENS, initial_state=True, with_dht=True, output_dh0=True),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("member", MEMBERS)
def test_member_backward(layers, member, scenario):
    layer = layers(member)  # the default pipeline
    s = SCENARIOS[scenario]
    x = draw_inputs(op_of(layer), s["B"], s["T"], s.get("seqlens"), s["initial_state"])
    check_backward(layer, x, s["with_dht"], s["output_dh0"])


# grouped value heads (dq, dk summed over a group of 2) at K = 24, V = 20 (not powers of two), T = 21
# (a chunk of 16 and a partial one),
# the scans in two value blocks (16 and a partial 4)
@pytest.mark.parametrize("member", MEMBERS)
def test_grouped_heads_odd_dims(layers, member):
    layer = layers(member, BACKWARD_PIPELINE, num_v_heads=4, head_k_dim=24, head_v_dim=20)
    x = draw_inputs(op_of(layer), 1, 21)
    check_backward(layer, x, with_dht=True, output_dh0=True)


# unbounded gates steep enough that a chunk's decay passes the factored limit (80 nats) and fp32's
# exp range (~88): every such chunk fails its span check, and the channel Grams' cotangents are
# contracted elementwise (k3s.gated_contraction, form guarded); exp(-G) would overflow there
@pytest.mark.parametrize("member", ["kda", "gla"])
def test_steep_gates_take_the_elementwise_contraction(layers, member):
    layer = layers(member)
    x = draw_inputs(op_of(layer), 2, 37)
    x["g"] = 12 * x["g"]
    assert (x["g"][:, :16].sum(dim=1) < -90).any(), "no chunk steep enough to fail its span check"
    got = check_backward(layer, x, with_dht=True, output_dh0=True)
    assert all(torch.isfinite(value).all() for value in got.values())


@pytest.mark.parametrize("member", ["kda", "gla"])
def test_steep_and_mild_chunks_side_by_side(layers, member):
    """The second chunk of every sequence steep, the others mild: the factored kernel and its
    elementwise launch each store the gradients of their own chunks, and only those."""
    layer = layers(member)
    x = draw_inputs(op_of(layer), 2, 45)
    x["g"][:, 16:32] = 12 * x["g"][:, 16:32]
    # every (sequence, head) program of the second chunk fails its span check (some channel spans
    # more than 80 nats), none of the first
    assert (x["g"][:, 16:32].sum(dim=1) < -90).any(dim=-1).all() and (x["g"][:, :16].sum(dim=1) > -80).all()
    check_backward(layer, x, with_dht=True, output_dh0=True)


# --- gradients-forward=reload: the matrix stages handed from the prepare ---------------------

RELOAD_PIPELINE = "derive-backward{chunk-size=16},lower-backward{block-v=16 gradients-forward=reload},outline-kernels"
RELOAD_CASES = [("kda", {}), ("gated_deltanet", {}), ("deltanet", {}), ("gla", {}),
                ("kda", dict(qk_l2norm=True, gate_input="softplus", beta_input="logits"))]


@pytest.mark.parametrize("member, options", RELOAD_CASES,
                         ids=["-".join([m, *(f"{k}={v}" for k, v in o.items())]) for m, o in RELOAD_CASES])
def test_gradients_reload_the_forward_matrix_stages(layers, member, options):
    """The Grams, the triangular inverse and W reloaded by the gradients kernel (the prepare spills
    them) instead of recomputed there: the same gradients, varlen with every kind of sequence, and
    steep chunks next to mild ones where the member has an unbounded channel gate."""
    layer = layers(member, RELOAD_PIPELINE, **options)
    source = layer.path.read_text()
    gradients = source[source.index(f"def {layer.spec.name}_backward_gradients_kernel("):]
    assert "k3s.reload %T_inverse" in gradients or member == "gla", "the inverse is not reloaded"
    assert "k3s.gram" not in gradients[:gradients.index("\n\n\n")], "a Gram is still recomputed"
    x = draw_inputs(op_of(layer), 1, None, SEQLENS)
    if member in ("kda", "gla") and not options:
        x["g"][:, 5:21] = 12 * x["g"][:, 5:21]  # the packed stream's second chunk fails its span check
    check_backward(layer, x, with_dht=True, output_dh0=True)


# --- scan-values=spill: the scans' values handed to the gradients kernel ----------------------

SCAN_SPILL_PIPELINE = "derive-backward{chunk-size=16},lower-backward{block-v=16 scan-values=spill},outline-kernels"
BOTH_PIPELINE = ("derive-backward{chunk-size=16},lower-backward{block-v=16 scan-values=spill "
                 "gradients-forward=reload},outline-kernels")
SCAN_SPILL_CASES = [("kda", SCAN_SPILL_PIPELINE, {}), ("gated_deltanet", SCAN_SPILL_PIPELINE, {}),
                    ("deltanet", SCAN_SPILL_PIPELINE, {}), ("gla", SCAN_SPILL_PIPELINE, {}),
                    ("kda", BOTH_PIPELINE, {}),
                    ("kda", SCAN_SPILL_PIPELINE, dict(qk_l2norm=True, gate_input="softplus", beta_input="logits",
                                                      state_layout="vk"))]


@pytest.mark.parametrize("member, pipeline, options", SCAN_SPILL_CASES,
                         ids=["-".join([m, "reload" if p == BOTH_PIPELINE else "spill", *(f"{k}={v}" for k, v in o.items())])
                              for m, p, o in SCAN_SPILL_CASES])
def test_gradients_reload_the_scans_values(layers, member, pipeline, options):
    """The delta residual U - W S and its cotangent spilled by the scans that make them and
    reloaded by the gradients kernel, which then no longer recomputes the query Gram, W or U: the
    same gradients, varlen with every kind of sequence, steep chunks beside mild ones where the
    member has an unbounded channel gate. GLA (no delta rule) shares nothing with its scans."""
    layer = layers(member, pipeline, **options)
    source = layer.path.read_text()
    gradients = source[source.index(f"def {layer.spec.name}_backward_gradients_kernel("):]
    gradients = gradients[:gradients.index("\n\n\n")]
    if member == "gla":
        assert "k3s.reload %vr" not in gradients
    else:
        assert "k3s.reload %vr" in gradients and "k3s.reload %vr_bar" in gradients, "the scans' values are not reloaded"
        assert "k3s.delta_residual" not in gradients and "k3s.wy_apply" not in gradients, "the residual is recomputed"
    x = draw_inputs(op_of(layer), 1, None, SEQLENS)
    if member in ("kda", "gla") and not options:
        x["g"][:, 5:21] = 12 * x["g"][:, 5:21]  # the packed stream's second chunk fails its span check
    check_backward(layer, x, with_dht=True, output_dh0=True)


# --- input forms: the chain rule of store_cotangent -----------------------------------------

FORMS = [
    ("kda", dict(qk_l2norm=True, gate_input="softplus", beta_input="logits")),
    ("kda", dict(state_layout="vk", gate_input="bounded", gate_lower_bound=-3.0, beta_input="logits_neg_eigval")),
    ("kda", dict(gate_input="clamped", gate_lower_bound=-1.0)),
    ("gated_deltanet", dict(state_layout="vk", gate_input="softplus", beta_input="logits_neg_eigval")),
    ("gated_deltanet", dict(qk_l2norm=True, gate_input="bounded", beta_input="logits")),
    ("gated_deltanet", dict(gate_input="clamped", gate_lower_bound=-1.0)),
    ("gla", dict(qk_l2norm=True, gate_input="softplus")),  # gla's example is vk
    ("gla", dict(state_layout="kv", gate_input="bounded", gate_lower_bound=-2.0)),
    ("gla", dict(gate_input="clamped", gate_lower_bound=-1.0)),
    ("deltanet", dict(state_layout="vk", qk_l2norm=True, beta_input="logits")),
    ("deltanet", dict(beta_input="logits_neg_eigval")),
]


def form_id(form) -> str:
    member, options = form
    return "-".join([member, *(f"{k}={v}" for k, v in options.items())])


@pytest.mark.parametrize("form", FORMS, ids=[form_id(f) for f in FORMS])
def test_input_forms(layers, form):
    member, options = form
    layer = layers(member, BACKWARD_PIPELINE, **options)
    op = op_of(layer)
    x = draw_inputs(op, 1, 21)
    got = check_backward(layer, x, with_dht=True, output_dh0=True)
    if options.get("gate_input") == "clamped":  # below the bound the clamp's gradient is zero
        below = x["g"] < options["gate_lower_bound"]
        assert below.any() and (~below).any()
        assert torch.equal(got["g"][below], torch.zeros_like(got["g"][below])), \
            "dg nonzero where g is below the clamp's bound"
    if "gate_input" in options and options["gate_input"] != "clamped":
        assert got["A_log"].abs().sum() > 0 and got["dt_bias"].abs().sum() > 0


# --- causality ------------------------------------------------------------------------------


@pytest.mark.parametrize("member", ["kda", "gated_deltanet"])
def test_gradients_causal(layers, member):
    """Input position t's gradient depends only on do at positions >= t: changing do before t0
    (mid-chunk) leaves every input gradient at positions >= t0 unchanged, bit for bit."""
    layer = layers(member)
    op = op_of(layer)
    T, t0 = 37, 21
    x = draw_inputs(op, 1, T)
    do, _ = draw_cotangents(op, x, with_dht=False)
    changed = do.clone()
    changed[:, :t0] = torch.randn_like(changed[:, :t0])
    first = chunk_backward_gradients(layer.module, x, do, None, output_dh0=False)
    second = chunk_backward_gradients(layer.module, x, changed, None, output_dh0=False)
    for name in first:
        if name == "h0":
            continue
        a, b = first[name], second[name]
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        assert torch.equal(a[:, t0:], b[:, t0:]), \
            f"d{name} at positions >= {t0} depends on do before {t0} " \
            f"(max change {(a[:, t0:] - b[:, t0:]).abs().max().item():.2e})"
        assert not torch.allclose(a[:, :t0], b[:, :t0]), f"d{name} before {t0} must see the change of do there"


# --- rejections -----------------------------------------------------------------------------


def test_backward_requires_do(layers):
    layer = layers("gated_deltanet", BACKWARD_PIPELINE, num_v_heads=4)
    x = draw_inputs(op_of(layer), 1, 5)
    with pytest.raises(ValueError) as err:
        layer.module.chunk_backward(**x)
    message = str(err.value)
    assert one_line(message) and message.startswith("do"), message


@pytest.mark.parametrize("shape", [(1, 5, 2, 8), (1, 5, 4, 4), (1, 6, 4, 8)], ids=["heads", "head_v_dim", "length"])
def test_backward_rejects_do_shape(layers, shape):
    layer = layers("gated_deltanet", BACKWARD_PIPELINE, num_v_heads=4)
    x = draw_inputs(op_of(layer), 1, 5)
    with pytest.raises(ValueError) as err:
        layer.module.chunk_backward(**x, do=torch.randn(shape))
    message = str(err.value)
    assert one_line(message) and message.startswith("do") and "[B,T,4,8]" in message, message


# --- a training step through k3compile.ops --------------------------------------------------


@pytest.fixture(scope="module")
def ops_cache(tmp_path_factory):
    """k3compile.ops compiles into a temporary K3C_CACHE_DIR (never ~/.cache), with an in-process
    cache of its own."""
    from k3compile.ops import layers as ops_layers

    folder = tmp_path_factory.mktemp("ops_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("K3C_CACHE_DIR", str(folder))
        patch.setattr(ops_layers, "_LOADED", {})
        yield folder


def oracle_op(**table):
    """The k3 op of a spec table written out here (what the ops call's options mean)."""
    from k3compile.frontend import spec_to_module
    from k3compile.spec import spec_from_table

    return next(iter(spec_to_module(spec_from_table({"name": "oracle", "dtype": "float32", **table})).ops))


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.clone().requires_grad_()


def assert_sum_grad(got, want, leaves, HV: int, K: int, tol: float) -> None:
    """dA_log, one number per head, is a sum over every token and channel of terms
    dg_raw softplus(x) / sigmoid(x), x = g + dt_bias (the softplus gate -exp(A_log) softplus(x) is
    its own derivative in A_log): where they cancel, rounding of the terms dominates the sum (a
    seed gave 4.7e-3 relative to the sum in fp16), so each head's error is bounded relative to the
    sum of the terms' magnitudes."""
    x = leaves["g"].detach().double() + leaves["dt_bias"].detach().double().view(HV, K)
    terms = want["g"] * F.softplus(x) / torch.sigmoid(x)
    torch.testing.assert_close(terms.sum(dim=(0, 1, 3)), want["A_log"], rtol=1e-9, atol=1e-12)  # the terms are dA_log's
    assert got is not None and got.shape == want["A_log"].shape and torch.isfinite(got).all(), "A_log.grad"
    err = ((got.double() - want["A_log"]).abs() / terms.abs().sum(dim=(0, 1, 3))).max().item()
    assert err < tol, f"A_log.grad: error {err:.2e} of the terms' magnitude >= {tol:.0e}"


# Half-precision inputs: their gradients come back in their dtype (the kernels' workspaces too), so
# looser bounds; bf16's arithmetic runs in the interpreter on its values, rounded as on the GPU
# (k3compile.checking.interpreter_bf16). Observed: fp16 ~4e-4, bf16 2e-3 to 6e-3 (dA_log's plain ratio: to 1.1e-2).
@pytest.mark.parametrize("dtype,tol", [(torch.float32, RTOL), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)],
                         ids=["fp32", "fp16", "bf16"])
def test_ops_chunk_kda_training_step(ops_cache, dtype, tol):
    """chunk_kda with the in-kernel l2norm and softplus gate: every input (A_log, dt_bias and the
    fp32 initial state included) gets its gradient, in its own dtype and shape."""
    from k3compile.ops.kda import chunk_kda

    B, T, H, HV, K, V = 2, 19, 2, 2, 16, 8
    op = oracle_op(kind="kda", num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, qk_l2norm=True,
                   gate_input="softplus")
    x = draw_inputs(op, B, T)
    names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")
    leaves = {n: leaf(x[n] if n == "initial_state" else x[n].to(dtype)) for n in names}
    o, final = chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                         initial_state=leaves["initial_state"], output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=leaves["A_log"],
                         dt_bias=leaves["dt_bias"])
    assert o.requires_grad and final.requires_grad and o.dtype == dtype
    do, dht = torch.randn_like(o), torch.randn_like(final)
    torch.autograd.backward([o, final], [do, dht])
    # the oracle on the inputs as the kernels saw them (rounded to dtype)
    want = reference_gradients(op, {n: leaves[n].detach() for n in names}, do, dht)
    for n in names:
        got = leaves[n].grad
        assert got is not None, f"{n}.grad: none"
        assert got.dtype == leaves[n].dtype, f"{n}.grad: dtype {got.dtype}, its input's is {leaves[n].dtype}"
        if n == "A_log":
            assert_sum_grad(got, want, leaves, HV, K, tol)
        else:
            assert_grad(got.float(), want["h0" if n == "initial_state" else n], f"{n}.grad", tol=tol)
    assert list(ops_cache.rglob("*.py")), "ops compiled outside K3C_CACHE_DIR"


def test_ops_chunk_gated_delta_rule_training_step(ops_cache):
    """chunk_gated_delta_rule, varlen with an empty sequence; the initial state needs no grad and
    the final state is not returned: o alone is differentiated, the state gets no grad."""
    from k3compile.ops.gated_delta_rule import chunk_gated_delta_rule

    H, HV, K, V = 2, 4, 16, 8
    op = oracle_op(kind="gated_deltanet", num_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V)
    x = draw_inputs(op, 1, None, seqlens=(7, 0, 18))
    names = ("q", "k", "v", "g", "beta")
    leaves = {n: leaf(x[n]) for n in names}
    h0 = x["initial_state"].clone()
    o, final = chunk_gated_delta_rule(*(leaves[n] for n in names), initial_state=h0, cu_seqlens=x["cu_seqlens"])
    assert final is None
    do = torch.randn_like(o)
    torch.autograd.backward(o, do)
    want = reference_gradients(op, x, do, None)
    for n in names:
        assert_grad(leaves[n].grad, want[n], f"{n}.grad", like=leaves[n])
    assert h0.grad is None


# --- gradients-split=value-blocks: the value-block loop a kernel of its own -----------------------

SPLIT_PIPELINE = "derive-backward{chunk-size=16},lower-backward{block-v=16 gradients-split=value-blocks},outline-kernels"
SPLIT_RELOAD_PIPELINE = ("derive-backward{chunk-size=16},lower-backward{block-v=16 gradients-split=value-blocks "
                         "gradients-forward=reload},outline-kernels")
# V = 20 (not a power of two): two value blocks of 16, the second partial
SPLIT_DIMS = dict(head_v_dim=20)
SPLIT_CASES = [("kda", SPLIT_PIPELINE, {}), ("gated_deltanet", SPLIT_PIPELINE, dict(num_v_heads=4)),
               ("deltanet", SPLIT_PIPELINE, {}), ("gla", SPLIT_PIPELINE, {}), ("kda", SPLIT_RELOAD_PIPELINE, {}),
               ("kda", SPLIT_PIPELINE, dict(qk_l2norm=True, gate_input="softplus", beta_input="logits",
                                            state_layout="vk"))]


# --- the backward's registers are named after the values they hold ---------------------------------


@pytest.mark.parametrize("member, pipeline", [*[(m, None) for m in ("kda", "gated_deltanet", "deltanet", "gla")],
                                              ("kda", SPLIT_PIPELINE)])
def test_adjoint_values_named_after_what_they_hold(layers, member, pipeline):
    """No register of the backward kernels, nor a workspace named after one, ends in a counter
    (`b_mul19`, `b_gram_mul5`, `delta_residual_dot4_parts`): each is named after the value it
    holds, from the names of the op its rule differentiates (`b_P_bar_masked`, `b_A_unscaled_bar`,
    `b_minus_W_bar_from_vr`) or the cotangent part it is (`b_k_bar_from_P`, `b_k_bar_from_A`)."""
    import re

    source = layers(member, pipeline).path.read_text()
    backward = source[re.search(r"def \w+_backward_\w*kernel\(", source).start():]
    numbered = sorted(set(re.findall(r"\b(?:b_\w*?[A-Za-z_]\d+|\w*?[A-Za-z_]\d+_(?:parts|block))\b", backward)))
    assert not numbered, f"registers named with a counter: {numbered[:5]}"
    assert re.search(r"\bb_\w+_bar_from_(?:P|A|o|vr|W|QG|KG)\b", backward), "no cotangent part named after its value"


@pytest.mark.parametrize("member, pipeline, options", SPLIT_CASES,
                         ids=["-".join([m, "reload" if p == SPLIT_RELOAD_PIPELINE else "split",
                                        *(f"{k}={v}" for k, v in o.items())]) for m, p, o in SPLIT_CASES])
def test_gradients_split_by_value_blocks(layers, member, pipeline, options):
    """The gradients kernel's value-block loop a kernel of its own (a program per chunk, value head
    and value block, its parts of the loop's sums spilled in fp32), the rest adding them up: the
    same gradients, varlen with every kind of sequence, an initial state and dh0, grouped value
    heads, steep chunks beside mild ones where the member has an unbounded channel gate (each
    kernel and its steep launch), the matrix stages reloaded."""
    layer = layers(member, pipeline, **SPLIT_DIMS, **options)
    source = layer.path.read_text()
    name = layer.spec.name
    blocks = source[source.index(f"def {name}_backward_value_blocks_kernel("):]
    blocks = blocks[:blocks.index("\n\n\n")]
    gradients = source[source.index(f"def {name}_backward_gradients_kernel("):]
    gradients = gradients[:gradients.index("\n\n\n")]
    assert "i_v = tl.program_id(2)" in blocks and "k3s.spill_value_block_part" in blocks
    assert "tl.static_range" not in blocks.split("k3s.value_block_loop")[1], "the value blocks are looped over"
    assert "k3s.sum_value_block_parts" in gradients and "k3s.value_block_loop" not in gradients
    assert "k3s.reload %S\n" not in gradients and "k3s.reload %S <" not in gradients, \
        "the gradients kernel still reads the states"
    # the steep chunks' launch of the value-block kernel runs its code, with the flag STEEP on
    assert f"def {name}_backward_value_blocks_steep_kernel(" not in source
    assert (f"# k3s.kernel @{name}_backward_value_blocks_steep " in source) == (member in ("kda", "gla") and
                                                                              pipeline == SPLIT_PIPELINE)
    x = draw_inputs(op_of(layer), 1, None, SEQLENS)
    if member in ("kda", "gla") and "gate_input" not in options:
        x["g"][:, 5:21] = 12 * x["g"][:, 5:21]  # the packed stream's second chunk fails its span check
    check_backward(layer, x, with_dht=True, output_dh0=True)
