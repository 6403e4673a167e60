"""The compiled modules under autograd: `chunk` is differentiable however it is called (plain, as
well as with segments), and every entry with no backward of its own refuses inputs that require
grad while grad mode is on, naming itself and what to call instead. Before, the plain `chunk`
returned outputs with no grad_fn: a model around it trained q/k/v/g/beta's producers on zero
gradients without a word."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rms, layer_op
from k3compile.checking.verify_backward import reference_gradients

H, HV, K, V = 2, 4, 16, 12
TOL = 1e-4  # the chunk path's fp32 RMS ratio (tests/test_chunk.py)


@pytest.fixture(scope="module")
def kda(tmp_path_factory):
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    spec = spec_from_table(dict(name="autograd_kda", kind="kda", num_heads=H, num_v_heads=HV, head_k_dim=K,
                                head_v_dim=V, dtype="float32", gate_input="softplus", beta_input="logits"))
    return k3_compile(spec, out_dir=tmp_path_factory.mktemp("autograd"))


def leaves(T: int = 21) -> dict:
    x = {"q": F.normalize(torch.randn(1, T, H, K), dim=-1), "k": F.normalize(torch.randn(1, T, H, K), dim=-1),
         "v": torch.randn(1, T, HV, V), "g": torch.randn(1, T, HV, K), "beta": torch.randn(1, T, HV),
         "A_log": 0.3 * torch.randn(HV), "dt_bias": 0.5 * torch.randn(HV * K),
         "initial_state": 0.5 * torch.randn(1, HV, K, V)}
    return {n: t.requires_grad_() for n, t in x.items()}


@pytest.mark.parametrize("segments", [None, 1, 2], ids=["plain", "segments=1", "segments=2"])
def test_chunk_is_differentiable_however_called(kda, segments):
    x = leaves()
    o, final = kda.module.chunk(**x, output_final_state=True, segments=segments)
    assert o.grad_fn is not None and final.grad_fn is not None
    do, dht = torch.randn_like(o), torch.randn_like(final)
    torch.autograd.backward([o, final], [do, dht])
    detached = {n: t.detach() for n, t in x.items()}
    want = reference_gradients(layer_op(kda), detached, do, dht)
    for name, t in x.items():
        assert_rms(t.grad, want["h0" if name == "initial_state" else name], f"d{name}", TOL)


def test_entries_without_a_backward_refuse_inputs_that_require_grad(kda):
    m, x = kda.module, leaves()
    tokens = {n: x[n] for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")}
    slots = torch.tensor([0], dtype=torch.int64)
    calls = {
        "recurrent": lambda: m.recurrent(**tokens, initial_state=x["initial_state"]),
        "decode": lambda: m.decode(**{n: t[:, :1] if t.dim() > 1 else t for n, t in tokens.items()},
                                   state=torch.zeros(2, HV, K, V), state_indices=slots),
        "segment_summary": lambda: m.segment_summary(**{n: t for n, t in tokens.items() if n != "q"}),
        "chunk_backward": lambda: m.chunk_backward(**tokens, do=torch.randn(1, 21, HV, V)),
    }
    for entry, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"^{entry}: has no backward, and an input requires grad; .*chunk"):
            call()
        with torch.no_grad():
            call()  # the same call is fine where autograd records nothing


def test_attnres_aggregate_points_to_the_differentiable_op(compile_layer):
    layer = compile_layer(name="autograd_attnres", kind="attnres", hidden_size=24, num_blocks=2, block_size=2,
                          dtype="float32")
    sources = torch.randn(3, 2, 5, 24, requires_grad=True)
    query, gain = torch.randn(24), torch.ones(24)
    with pytest.raises(RuntimeError, match=r"^aggregate: has no backward.*k3compile\.ops\.attnres\.attnres_aggregate"):
        layer.aggregate(sources, query, gain)
    out, _ = layer.aggregate(sources.detach(), query, gain)
    assert torch.isfinite(out).all()
