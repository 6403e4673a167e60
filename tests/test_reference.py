"""Independent checks of the float64 reference semantics (k3compile.ir.reference) itself.

The reference is the oracle of every kernel test, so it is checked here against formulas
written out independently: the affine (matrix) form of the recurrence with explicit K x K
matrices, a closed form of GLA, and a dense re-computation of the MoE layer.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import RECURRENCE_KINDS, RecurrenceShape, recurrence_inputs
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import spec_from_table

f64 = torch.float64


def op_of(**table):
    return next(iter(spec_to_module(spec_from_table(table)).ops))


def recurrence_op(kind, layout="kv", H=2, HV=None, K=5, V=4, scale=None):
    table = dict(name="ref", kind=kind, num_heads=H, num_v_heads=HV or H, head_k_dim=K, head_v_dim=V,
                 state_layout=layout)
    if scale is not None:
        table["scale"] = scale
    return op_of(**table)


# --- the recurrence: affine form with explicit matrices -------------------------------------


def affine_recurrence(kind, q, k, v, g, beta, scale, S0, seqs, layout):
    """S_t = A_t S_{t-1} + B_t with A_t = (I - b k k^T) Diag(exp g) (delta rule) or Diag(exp g)
    (no delta rule), B_t = b k v^T (or k v^T); o_t = S_t^T (scale q_t). Written per head with
    explicit K x K matrices and Python loops; S0 in the layer's layout, state kept [K, V]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    delta = kind in ("kda", "gated_deltanet", "deltanet")
    o = torch.full((B, T, HV, V), float("nan"), dtype=f64)
    finals = []
    for n, (b, start, end) in enumerate(seqs):
        per_head = []
        for hv in range(HV):
            h = hv // (HV // H)
            if S0 is None:
                S = torch.zeros(K, V, dtype=f64)
            else:
                S = S0[n, hv].to(f64)
                S = S.T if layout == "vk" else S
            for t in range(start, end):
                kt, qt, vt = k[b, t, h].to(f64), q[b, t, h].to(f64), v[b, t, hv].to(f64)
                if g is None:
                    decay = torch.ones(K, dtype=f64)
                elif g.dim() == 4:
                    decay = torch.exp(g[b, t, hv].to(f64))
                else:
                    decay = torch.exp(g[b, t, hv].to(f64)).expand(K)
                D = torch.diag(decay)
                if delta:
                    bt = beta[b, t, hv].to(f64)
                    A = (torch.eye(K, dtype=f64) - bt * torch.outer(kt, kt)) @ D
                    Bm = bt * torch.outer(kt, vt)
                else:
                    A = D
                    Bm = torch.outer(kt, vt)
                S = A @ S + Bm
                o[b, t, hv] = S.T @ (scale * qt)
            per_head.append(S.T if layout == "vk" else S)
        finals.append(torch.stack(per_head))
    return o, torch.stack(finals)


def sequences(B, T, cu):
    if cu is None:
        return [(b, 0, T) for b in range(B)]
    c = cu.tolist()
    return [(0, c[i], c[i + 1]) for i in range(len(c) - 1)]


@pytest.mark.parametrize("layout", ["kv", "vk"])
@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
@pytest.mark.parametrize("grouped", [False, True], ids=["HV=H", "HV=2H"])
@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_recurrence_matches_affine_form(kind, layout, grouped, varlen):
    H, K, V = 2, 5, 4
    HV = 2 * H if grouped else H
    op = recurrence_op(kind, layout, H=H, HV=HV, K=K, V=V)
    if varlen:
        seqlens = (3, 0, 1, 4)
        shape = RecurrenceShape(B=1, T=8, H=H, HV=HV, K=K, V=V, seqlens=seqlens)
    else:
        shape = RecurrenceShape(B=2, T=6, H=H, HV=HV, K=K, V=V)
    x = {n: t.to(f64) for n, t in recurrence_inputs(kind, layout, shape).items() if n != "cu_seqlens"}
    cu = recurrence_inputs(kind, layout, shape)["cu_seqlens"] if varlen else None
    x["k"] = torch.randn_like(x["k"])  # un-normalised keys too: the affine form needs no |k| = 1
    o, final = reference.recurrence(op, **x, cu_seqlens=cu, output_final_state=True)
    scale = K ** -0.5
    exp_o, exp_final = affine_recurrence(kind, x["q"], x["k"], x["v"], x.get("g"), x.get("beta"), scale,
                                         x["initial_state"], sequences(shape.B, shape.T, cu), layout)
    assert o.dtype == f64 and final.dtype == f64
    expected_state = (shape.N, HV, K, V) if layout == "kv" else (shape.N, HV, V, K)
    assert tuple(final.shape) == expected_state
    torch.testing.assert_close(o, exp_o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(final, exp_final, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", RECURRENCE_KINDS)
def test_layouts_are_transposes(kind):
    H, K, V = 1, 4, 6
    shape = RecurrenceShape(B=2, T=5, H=H, HV=H, K=K, V=V)
    x = recurrence_inputs(kind, "kv", shape)
    o_kv, s_kv = reference.recurrence(recurrence_op(kind, "kv", H=H, K=K, V=V), **x, output_final_state=True)
    x_vk = dict(x, initial_state=x["initial_state"].transpose(-1, -2).contiguous())
    o_vk, s_vk = reference.recurrence(recurrence_op(kind, "vk", H=H, K=K, V=V), **x_vk, output_final_state=True)
    torch.testing.assert_close(o_kv, o_vk, rtol=0, atol=0)
    torch.testing.assert_close(s_kv.transpose(-1, -2), s_vk, rtol=0, atol=0)


def test_reference_no_final_state_unless_asked():
    op = recurrence_op("kda")
    x = recurrence_inputs("kda", "kv", RecurrenceShape(B=1, T=3, H=2, HV=2, K=5, V=4))
    o, final = reference.recurrence(op, **x)
    assert final is None and torch.isfinite(o).all()


def test_reference_scale_argument_overrides_op():
    op = recurrence_op("gla", scale=2.0)
    x = recurrence_inputs("gla", "kv", RecurrenceShape(B=1, T=4, H=2, HV=2, K=5, V=4))
    o_op, _ = reference.recurrence(op, **x)
    o_half, _ = reference.recurrence(op, **x, scale=1.0)
    torch.testing.assert_close(o_op, 2 * o_half, rtol=1e-12, atol=1e-12)


def test_gla_closed_form():
    """Without the delta rule the recurrence unrolls:
    o_t = (scale q_t * exp(G_t))^T S_0 + sum_{s<=t} [sum_c scale q_t[c] exp(G_t[c] - G_s[c]) k_s[c]] v_s,
    with G_t the cumulative log-decay (per channel)."""
    H, K, V, B, T = 2, 6, 3, 2, 7
    op = recurrence_op("gla", H=H, K=K, V=V)
    x = {n: t.to(f64) for n, t in recurrence_inputs("gla", "kv", RecurrenceShape(B=B, T=T, H=H, HV=H, K=K, V=V)).items()}
    scale = K ** -0.5
    o, final = reference.recurrence(op, **x, output_final_state=True)
    G = x["g"].cumsum(1)  # [B, T, H, K]
    expected = torch.zeros(B, T, H, V, dtype=f64)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                qd = scale * x["q"][b, t, h] * torch.exp(G[b, t, h])
                acc = qd @ x["initial_state"][b, h].to(f64)
                for s in range(t + 1):
                    w = (scale * x["q"][b, t, h] * torch.exp(G[b, t, h] - G[b, s, h]) * x["k"][b, s, h]).sum()
                    acc = acc + w * x["v"][b, s, h]
                expected[b, t, h] = acc
    torch.testing.assert_close(o, expected, rtol=1e-10, atol=1e-10)
    # final state: Diag(exp G_T) S_0 + sum_s Diag(exp(G_T - G_s)) k_s v_s^T
    for b in range(B):
        for h in range(H):
            S = torch.exp(G[b, -1, h])[:, None] * x["initial_state"][b, h].to(f64)
            for s in range(T):
                S = S + torch.outer(torch.exp(G[b, -1, h] - G[b, s, h]) * x["k"][b, s, h], x["v"][b, s, h])
            torch.testing.assert_close(final[b, h], S, rtol=1e-10, atol=1e-10)


def test_deltanet_with_beta_one_and_unit_key_overwrites():
    """beta = 1, |k| = 1: the delta rule replaces the value stored along k, so S^T k = v after the update."""
    H, K, V = 1, 6, 3
    op = recurrence_op("deltanet", H=H, K=K, V=V)
    x = recurrence_inputs("deltanet", "kv", RecurrenceShape(B=1, T=1, H=H, HV=H, K=K, V=V))
    x = {n: t.to(f64) for n, t in x.items()}
    x["k"] = F.normalize(x["k"], dim=-1)  # unit length in float64
    x["beta"] = torch.ones_like(x["beta"])
    _, final = reference.recurrence(op, **x, output_final_state=True)
    kt = x["k"][0, 0, 0]
    torch.testing.assert_close(final[0, 0].T @ kt, x["v"][0, 0, 0].to(f64), rtol=1e-10, atol=1e-10)


# --- latent MoE ------------------------------------------------------------------------------


def silu(x):
    return x / (1 + torch.exp(-x))


def situ(gate, up):
    return 4 * torch.tanh(gate / 4) / (1 + torch.exp(-gate)) * 25 * torch.tanh(up / 25)


ACT = {"swiglu": lambda g, u: silu(g) * u, "situ_glu": situ}


def moe_weights(d, latent, E, Fdim, Ns, Fs):
    w = latent or d
    weights = dict(
        router_weight=torch.randn(E, d, dtype=f64) / d ** 0.5,
        router_bias=torch.zeros(E, dtype=f64),
        expert_gate_up=torch.randn(E, 2 * Fdim, w, dtype=f64) / w ** 0.5,
        expert_down=torch.randn(E, w, Fdim, dtype=f64) / Fdim ** 0.5,
    )
    if latent:
        weights.update(latent_down=torch.randn(latent, d, dtype=f64) / d ** 0.5,
                       latent_up=torch.randn(d, latent, dtype=f64) / latent ** 0.5,
                       latent_norm_gain=1 + 0.2 * torch.randn(latent, dtype=f64))
    if Ns:
        weights.update(shared_gate_up=torch.randn(Ns, 2 * Fs, d, dtype=f64) / d ** 0.5,
                       shared_down=torch.randn(Ns, d, Fs, dtype=f64) / Fs ** 0.5)
    return weights


def dense_moe(x, w, act, experts, norm, rsf, latent, eps, Fdim, Fs, Ns):
    """Every token through every expert in `experts` (a list per row), weighted by the unbiased
    sigmoid scores of those experts; written with explicit matrices."""
    scores = 1 / (1 + torch.exp(-(x @ w["router_weight"].T)))
    h = x @ w["latent_down"].T if latent else x
    rows = []
    for r in range(x.shape[0]):
        chosen = experts[r]
        s = scores[r, chosen]
        if norm:
            s = s / s.sum()
        s = s * rsf
        acc = torch.zeros(h.shape[1], dtype=f64)
        for weight, e in zip(s, chosen):
            gu = w["expert_gate_up"][e]
            gate, up = gu[:Fdim] @ h[r], gu[Fdim:] @ h[r]
            acc = acc + weight * (w["expert_down"][e] @ ACT[act](gate, up))
        if latent:
            acc = acc / torch.sqrt((acc ** 2).mean() + eps) * w["latent_norm_gain"]
            acc = w["latent_up"] @ acc
        for i in range(Ns):
            gu = w["shared_gate_up"][i]
            gate, up = gu[:Fs] @ x[r], gu[Fs:] @ x[r]
            acc = acc + w["shared_down"][i] @ ACT[act](gate, up)
        rows.append(acc)
    return torch.stack(rows)


def moe_op(d, latent, E, top_k, Fdim, Ns, Fs, act, norm, rsf):
    return op_of(name="mymoe", kind="latent_moe", hidden_size=d, latent_dim=latent, num_experts=E, top_k=top_k,
                 expert_ffn_dim=Fdim, num_shared_experts=Ns, shared_ffn_dim=Fs, activation=act,
                 norm_topk_prob=norm, routed_scaling_factor=rsf)


@pytest.mark.parametrize("act", ["swiglu", "situ_glu"])
@pytest.mark.parametrize("latent", [0, 6])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("Ns", [0, 2])
def test_moe_all_experts_is_dense_weighted_sum(act, latent, norm, Ns):
    d, E, Fdim, Fs, rsf = 10, 4, 7, 5, 2.5
    op = moe_op(d, latent, E, E, Fdim, Ns, Fs if Ns else 0, act, norm, rsf)
    w = moe_weights(d, latent, E, Fdim, Ns, Fs)
    x = torch.randn(5, d, dtype=f64)
    out = reference.latent_moe(op, x, **w)
    expected = dense_moe(x, w, act, [list(range(E))] * 5, norm, rsf, latent, op.eps.value.data, Fdim, Fs, Ns)
    assert out.shape == x.shape and out.dtype == f64
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("norm", [True, False])
def test_moe_bias_selects_but_does_not_weight(norm):
    """A large bias on experts {1, 3} makes them the top-2 of every token; their weights still
    come from the unbiased scores."""
    d, E, Fdim, rsf = 8, 5, 6, 1.5
    op = moe_op(d, 0, E, 2, Fdim, 0, 0, "swiglu", norm, rsf)
    w = moe_weights(d, 0, E, Fdim, 0, 0)
    w["router_bias"] = torch.tensor([0.0, 10.0, 0.0, 10.0, 0.0], dtype=f64)
    x = torch.randn(4, d, dtype=f64)
    out = reference.latent_moe(op, x, **w)
    expected = dense_moe(x, w, "swiglu", [[1, 3]] * 4, norm, rsf, 0, op.eps.value.data, Fdim, 0, 0)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_moe_top1_picks_highest_score():
    d, E, Fdim = 8, 6, 4
    op = moe_op(d, 0, E, 1, Fdim, 0, 0, "swiglu", False, 1.0)
    w = moe_weights(d, 0, E, Fdim, 0, 0)
    x = torch.randn(7, d, dtype=f64)
    best = (x @ w["router_weight"].T).argmax(-1).tolist()
    expected = dense_moe(x, w, "swiglu", [[e] for e in best], False, 1.0, 0, op.eps.value.data, Fdim, 0, 0)
    torch.testing.assert_close(reference.latent_moe(op, x, **w), expected, rtol=1e-10, atol=1e-10)


def test_situ_glu_bounded_on_large_inputs():
    gate = torch.randn(10000, dtype=f64) * 1e4
    up = torch.randn(10000, dtype=f64) * 1e4
    out = reference.glu("situ_glu", gate, up)
    assert torch.isfinite(out).all()
    # mathematically |out| < 100; in floating point both tanh saturate to 1, so 100 is reached
    assert out.abs().max().item() <= 100
    assert out.abs().max().item() > 50  # large inputs do approach the bound
    torch.testing.assert_close(out, situ(gate, up), rtol=1e-12, atol=1e-12)
    # below saturation the bound is strict
    moderate = reference.glu("situ_glu", torch.randn(10000, dtype=f64) * 8, torch.randn(10000, dtype=f64) * 60)
    assert moderate.abs().max().item() < 100


def test_situ_glu_infinite_inputs_stay_finite():
    big = torch.tensor([float("inf"), -float("inf"), 1e308, -1e308], dtype=f64)
    out = reference.glu("situ_glu", big[:, None].expand(4, 4).reshape(-1), big.repeat(4))
    assert torch.isfinite(out).all() and out.abs().max().item() <= 100


def test_situ_moe_output_bounded():
    """With latent_dim = 0, no shared experts and normalised weights, each routed expert's
    activation is below 100 in magnitude, so |out| <= rsf * 100 * max row-sum |W_down|."""
    d, E, Fdim, rsf = 8, 4, 5, 1.0
    op = moe_op(d, 0, E, 2, Fdim, 0, 0, "situ_glu", True, rsf)
    w = moe_weights(d, 0, E, Fdim, 0, 0)
    x = torch.randn(6, d, dtype=f64) * 1e3
    out = reference.latent_moe(op, x, **w)
    bound = 100 * rsf * w["expert_down"].abs().sum(-1).max().item()
    assert torch.isfinite(out).all() and out.abs().max().item() <= bound


def test_swiglu_matches_silu():
    g, u = torch.randn(50, dtype=f64), torch.randn(50, dtype=f64)
    torch.testing.assert_close(reference.glu("swiglu", g, u), F.silu(g) * u, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(reference.glu("swiglu", g, u), silu(g) * u, rtol=1e-12, atol=1e-12)
