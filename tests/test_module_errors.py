"""Argument checks of the generated modules: a bad argument is a ValueError naming the tensor,
raised before any kernel runs."""

from __future__ import annotations

import pytest
import torch

from conftest import RecurrenceShape, one_line, recurrence_inputs, recurrence_table

B, T, H, K, V = 2, 5, 2, 8, 12


@pytest.fixture(scope="module")
def kda(compile_layer):
    return compile_layer(pipeline="lower-recurrent", **recurrence_table("kda", "kv", H=H, K=K, V=V, name="kda_errors"))


@pytest.fixture(scope="module")
def deltanet(compile_layer):
    return compile_layer(pipeline="lower-recurrent", **recurrence_table("deltanet", "kv", H=H, K=K, V=V, name="deltanet_errors"))


@pytest.fixture(scope="module")
def gla_vk(compile_layer):
    return compile_layer(pipeline="lower-recurrent", **recurrence_table("gla", "vk", H=H, K=K, V=V, name="gla_vk_errors"))


@pytest.fixture(scope="module")
def attnres(compile_layer):
    return compile_layer(name="attnres_errors", kind="attnres", hidden_size=24, num_blocks=3, block_size=2,
                         dtype="float32")


def kda_inputs(**shape):
    return recurrence_inputs("kda", "kv", RecurrenceShape(**{**dict(B=B, T=T, H=H, HV=H, K=K, V=V), **shape}))


def varlen_kda_inputs():
    return kda_inputs(B=1, T=T, seqlens=(2, 3))


def expect_error(fn, name: str, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(**kwargs)
    message = str(info.value)
    assert name in message, f"message does not name {name!r}: {message!r}"
    assert message.startswith(name), f"message should lead with {name!r}: {message!r}"
    assert one_line(message)
    return message


# --- the baselines are valid (so each error below is caused by its one change) --------------


def test_baselines_run(kda, deltanet, attnres):
    o, final = kda.recurrent(**kda_inputs(), output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    inputs = varlen_kda_inputs()
    o, final = kda.recurrent(**inputs, output_final_state=True)
    assert torch.isfinite(o).all() and final.shape[0] == 2
    inputs = recurrence_inputs("deltanet", "kv", RecurrenceShape(B=B, T=T, H=H, HV=H, K=K, V=V))
    assert torch.isfinite(deltanet.recurrent(**inputs)[0]).all()
    out, _ = attnres.aggregate(torch.randn(4, 2, 3, 24), torch.randn(24), torch.randn(24))
    assert torch.isfinite(out).all()


# --- recurrent ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_wrong_rank(kda, name):
    inputs = kda_inputs()
    inputs[name] = inputs[name][..., None]
    expect_error(kda.recurrent, name, **inputs)


def test_wrong_rank_missing_batch(kda):
    inputs = kda_inputs()
    inputs["q"] = inputs["q"][0]
    expect_error(kda.recurrent, "q", **inputs)


@pytest.mark.parametrize("name,heads", [("q", H + 1), ("k", H + 1), ("v", 2 * H), ("g", H + 1), ("beta", 1)])
def test_wrong_head_count(kda, name, heads):
    inputs = kda_inputs()
    shape = list(inputs[name].shape)
    shape[2] = heads
    inputs[name] = torch.randn(*shape)
    expect_error(kda.recurrent, name, **inputs)


@pytest.mark.parametrize("name,axis,size", [("q", 3, K + 1), ("v", 3, V - 1), ("g", 3, K * 2), ("k", 1, T + 1),
                                            ("v", 0, B + 1)])
def test_wrong_size(kda, name, axis, size):
    inputs = kda_inputs()
    shape = list(inputs[name].shape)
    shape[axis] = size
    inputs[name] = torch.randn(*shape)
    expect_error(kda.recurrent, name, **inputs)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_integer_dtype(kda, name):
    inputs = kda_inputs()
    inputs[name] = torch.randint(-3, 4, inputs[name].shape)
    message = expect_error(kda.recurrent, name, **inputs)
    assert "dtype" in message


@pytest.mark.parametrize("name", ["q", "v", "beta"])
def test_float64_input(kda, name):
    inputs = kda_inputs()
    inputs[name] = inputs[name].to(torch.float64)
    message = expect_error(kda.recurrent, name, **inputs)
    assert "float64" in message


def test_not_a_tensor(kda):
    inputs = kda_inputs()
    inputs["v"] = inputs["v"].tolist()
    expect_error(kda.recurrent, "v", **inputs)


def test_g_given_for_deltanet(deltanet):
    inputs = recurrence_inputs("deltanet", "kv", RecurrenceShape(B=B, T=T, H=H, HV=H, K=K, V=V))
    inputs["g"] = torch.randn(B, T, H)
    message = expect_error(deltanet.recurrent, "g", **inputs)
    assert "None" in message


def test_beta_given_for_gla(gla_vk):
    inputs = recurrence_inputs("gla", "vk", RecurrenceShape(B=B, T=T, H=H, HV=H, K=K, V=V))
    inputs["beta"] = torch.rand(B, T, H)
    expect_error(gla_vk.recurrent, "beta", **inputs)


@pytest.mark.parametrize("name", ["beta", "g"])
def test_required_input_none(kda, name):
    inputs = kda_inputs()
    inputs[name] = None
    message = expect_error(kda.recurrent, name, **inputs)
    assert "required" in message


@pytest.mark.parametrize("name", ["beta", "g"])
def test_required_input_left_out(kda, name):
    """Left out entirely: fla's signature has g and beta positional, so Python's own TypeError
    (naming the argument) or the module's ValueError are both acceptable."""
    inputs = kda_inputs()
    del inputs[name]
    with pytest.raises((TypeError, ValueError), match=name):
        kda.recurrent(**inputs)


def test_non_contiguous_q(kda):
    inputs = kda_inputs()
    inputs["q"] = torch.randn(B, H, T, K).transpose(1, 2)  # [B, T, H, K], strided
    assert not inputs["q"].is_contiguous()
    message = expect_error(kda.recurrent, "q", **inputs)
    assert "contiguous" in message


def test_non_contiguous_initial_state(kda):
    inputs = kda_inputs()
    inputs["initial_state"] = torch.randn(B, H, V, K).transpose(-1, -2)
    expect_error(kda.recurrent, "initial_state", **inputs)


def test_cu_seqlens_with_batch_two(kda):
    inputs = kda_inputs()  # B = 2
    inputs["cu_seqlens"] = torch.tensor([0, 2, T])
    del inputs["initial_state"]
    message = expect_error(kda.recurrent, "cu_seqlens", **inputs)
    assert "B" in message or "batch" in message


def test_cu_seqlens_not_ending_at_T(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([0, 2, T - 1])
    expect_error(kda.recurrent, "cu_seqlens", **inputs)


def test_cu_seqlens_past_T(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([0, 2, T + 1])
    expect_error(kda.recurrent, "cu_seqlens", **inputs)


def test_cu_seqlens_not_starting_at_zero(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([1, 2, T])
    expect_error(kda.recurrent, "cu_seqlens", **inputs)


def test_cu_seqlens_decreasing(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([0, 4, 2, T])
    inputs["initial_state"] = 0.5 * torch.randn(3, H, K, V)
    message = expect_error(kda.recurrent, "cu_seqlens", **inputs)
    assert "decreasing" in message


def test_cu_seqlens_float(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([0.0, 2.0, float(T)])
    message = expect_error(kda.recurrent, "cu_seqlens", **inputs)
    assert "dtype" in message


def test_cu_seqlens_2d(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([[0, 2, T]])
    expect_error(kda.recurrent, "cu_seqlens", **inputs)


def test_cu_seqlens_single_offset(kda):
    inputs = varlen_kda_inputs()
    inputs["cu_seqlens"] = torch.tensor([0])
    del inputs["initial_state"]
    expect_error(kda.recurrent, "cu_seqlens", **inputs)


def test_initial_state_wrong_n(kda):
    inputs = kda_inputs()  # N = B = 2
    inputs["initial_state"] = torch.randn(B + 1, H, K, V)
    message = expect_error(kda.recurrent, "initial_state", **inputs)
    assert "N" in message


def test_initial_state_wrong_n_varlen(kda):
    inputs = varlen_kda_inputs()  # N = 2 sequences, B = 1
    inputs["initial_state"] = torch.randn(1, H, K, V)
    expect_error(kda.recurrent, "initial_state", **inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_initial_state_must_be_fp32(kda, dtype):
    inputs = kda_inputs()
    inputs["initial_state"] = inputs["initial_state"].to(dtype)
    message = expect_error(kda.recurrent, "initial_state", **inputs)
    assert "float32" in message


def test_initial_state_in_the_other_layout(gla_vk):
    inputs = recurrence_inputs("gla", "vk", RecurrenceShape(B=B, T=T, H=H, HV=H, K=K, V=V))
    inputs["initial_state"] = torch.randn(B, H, K, V)  # [K, V] given to a V-first layer (K != V)
    expect_error(gla_vk.recurrent, "initial_state", **inputs)


@pytest.mark.parametrize("scale, shown", [("abc", "'abc'"), (float("nan"), "nan"), (float("inf"), "inf"),
                                          (True, "True"), (torch.ones(2), "Tensor"), ([0.5], "list")])
def test_scale_not_a_number(kda, scale, shown):
    message = expect_error(kda.recurrent, "scale", **kda_inputs(), scale=scale)
    assert message.endswith(f"got {shown}")


def test_scale_given_is_used(kda):
    """The control: a number (or a one-element tensor) is the scale the kernel applies."""
    inputs = kda_inputs()
    (o_half, _), (o_tensor, _) = kda.recurrent(**inputs, scale=0.5), kda.recurrent(**inputs, scale=torch.tensor(0.5))
    (o_default, _) = kda.recurrent(**inputs)
    assert torch.equal(o_half, o_tensor) and not torch.allclose(o_half, o_default)


def test_more_sequences_than_grid_axis_1_holds(kda):
    """One program per (sequence, value head) on CUDA's grid axis 1 (at most 65535): a call
    with more is refused before any launch, naming the sizes (here 32768 sequences x 2 heads)."""
    inputs = kda_inputs(B=1, T=1)
    del inputs["initial_state"]
    inputs["cu_seqlens"] = torch.tensor([0] + [1] * 32768)  # one token, then empty sequences
    message = expect_error(kda.recurrent, "q", **inputs)
    assert "32768 sequences x 2 value heads = 65536" in message and "at most 32767" in message


@pytest.mark.gpu
def test_device_mismatch(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("device mismatch needs a CUDA device next to the CPU")
    from k3compile.driver import compile as k3_compile
    from k3compile.spec import spec_from_table

    monkeypatch.delenv("TRITON_INTERPRET")  # a real GPU module (the check fires before any launch)
    layer = k3_compile(spec_from_table(recurrence_table("kda", "kv", H=H, K=K, V=V, name="kda_devices")),
                       out_dir=tmp_path, pipeline="lower-recurrent")
    inputs = {n: x.cuda() for n, x in kda_inputs().items()}
    inputs["k"] = inputs["k"].cpu()
    message = expect_error(layer.recurrent, "k", **inputs)
    assert "cuda" in message and "cpu" in message


# --- AttnRes --------------------------------------------------------------------------------


def attnres_inputs(S=3, D=24):
    return dict(sources=torch.randn(S, 2, 3, D), query=torch.randn(D), gain=torch.randn(D))


def test_attnres_too_many_sources(attnres):
    message = expect_error(attnres.aggregate, "sources", **attnres_inputs(S=5))  # num_blocks + 2
    assert "4" in message


def test_attnres_zero_sources(attnres):
    expect_error(attnres.aggregate, "sources", **attnres_inputs(S=0))


def test_attnres_max_sources_accepted(attnres):
    out, _ = attnres.aggregate(**attnres_inputs(S=4))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name,bad", [("query", torch.randn(23)), ("gain", torch.randn(24, 1)),
                                      ("sources", torch.randn(3, 2, 3, 25)), ("sources", torch.randn(2, 3, 24))])
def test_attnres_wrong_shapes(attnres, name, bad):
    inputs = attnres_inputs()
    inputs[name] = bad
    expect_error(attnres.aggregate, name, **inputs)


@pytest.mark.parametrize("name", ["sources", "query", "gain"])
def test_attnres_wrong_dtype(attnres, name):
    inputs = attnres_inputs()
    inputs[name] = inputs[name].to(torch.float64)
    expect_error(attnres.aggregate, name, **inputs)


def test_attnres_non_contiguous_sources(attnres):
    inputs = attnres_inputs()
    inputs["sources"] = torch.randn(2, 3, 24, 3).permute(3, 0, 1, 2)
    expect_error(attnres.aggregate, "sources", **inputs)
