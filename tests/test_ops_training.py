"""k3compile.ops' chunk functions as torch operators for training: each compiled layer's chunk is
a torch.library custom op with an autograd formula (its backward another custom op running the
layer's chunk_backward) and fake implementations. torch.library.opcheck checks the registration
(schema, autograd, fake tensors, AOT dispatch); torch.compile(fullgraph=True) captures a training
step through it without graph breaks and matches eager. Kernels run in Triton's interpreter."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from k3compile.ops.autograd import chunk_operator
from k3compile.ops.layers import LayerKey

B, T, H, K, V = 1, 19, 2, 16, 8


@pytest.fixture(autouse=True)
def ops_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "k3c_cache"))


def kda_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=gen), torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, K, generator=gen))
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen)
    return q, k, v, g, beta, h0


def kda_step(q, k, v, g, beta, h0):
    from k3compile.ops.kda import chunk_kda

    o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    return (o * o).sum() + (ht * ht).sum()


def grads_of(step, inputs):
    leaves = [x.clone().requires_grad_() for x in inputs]
    loss = step(*leaves)
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


@pytest.mark.parametrize("save_forward, window", [(False, 0), (True, 0), (False, 16)],
                         ids=["recompute", "save_forward", "windows"])
def test_chunk_custom_op_passes_opcheck(save_forward, window):
    q, k, v, g, beta, h0 = kda_inputs()
    op = chunk_operator(LayerKey("kda", H, H, K, V, qk_l2norm=True))
    args = tuple(x.requires_grad_() for x in (q, k, v, g, beta)) + (None, None, h0.requires_grad_(), None, K ** -0.5,
                                                                    True, save_forward, window)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


def test_operator_name_carries_the_mark_of_assume_constant_result():
    """k3compile.ops.autograd marks operator_name by hand (the decorator imports torch._dynamo,
    seconds of every import): the mark must be what torch.compiler.assume_constant_result sets."""
    from k3compile.ops.autograd import operator_name

    def probe():
        return "name"

    marked = torch.compiler.assume_constant_result(probe)
    assert vars(marked) == {"_dynamo_marked_constant": True}
    assert operator_name._dynamo_marked_constant is True


def test_training_step_compiles_without_graph_breaks_and_matches_eager():
    inputs = kda_inputs(1)
    eager_loss, eager_grads = grads_of(kda_step, inputs)
    compiled_loss, compiled_grads = grads_of(torch.compile(kda_step, fullgraph=True, backend="aot_eager"), inputs)
    assert torch.equal(compiled_loss, eager_loss)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "h0"), compiled_grads, eager_grads, strict=True):
        assert b is not None and torch.isfinite(b).all(), name
        assert torch.equal(a, b), name


def test_eager_gradients_match_float64_autograd_of_the_definition():
    inputs = kda_inputs(2)
    _, grads = grads_of(kda_step, inputs)
    leaves = [x.double().requires_grad_() for x in inputs]
    q, k, v, g, beta, S = leaves

    def unit(x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    q, k = unit(q), unit(k)
    outputs = []
    for t in range(T):  # the token recurrence, written out: S <- exp(g) S; S += k (beta (v - S^T k))^T
        S = S * g[:, t].exp()[..., None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, ..., None] * u[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t] * K ** -0.5))
    o = torch.stack(outputs, 1)
    ((o * o).sum() + (S * S).sum()).backward()
    for name, got, leaf in zip(("q", "k", "v", "g", "beta", "h0"), grads, leaves, strict=True):
        assert got.dtype == torch.float32 and got.shape == leaf.shape, name
        error = (got.double() - leaf.grad).norm() / leaf.grad.norm()
        assert error < 1e-4, f"d{name}: relative error {error:.2e}"


def disable_recompute_step(*inputs, **options):
    from k3compile.ops.kda import chunk_kda

    q, k, v, g, beta, h0 = inputs
    o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                      **options)
    return (o * o).sum() + (ht * ht).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_disable_recompute_saves_the_forward_values_and_changes_no_result(monkeypatch, dtype):
    """fla's disable_recompute trades memory for time, not results: the forward keeps what the
    backward's first kernel would recompute (save-forward-values), the backward reads it, and the
    outputs and gradients are those of the default call (the saved values are the recomputed
    ones: the same kernels' spills). The recomputing backward must not run."""
    from k3compile.ops.layers import layer_module

    inputs = [x.to(dtype) if x.is_floating_point() and i < 5 else x for i, x in enumerate(kda_inputs(seed=3))]
    loss, grads = grads_of(disable_recompute_step, inputs)
    module = layer_module(LayerKey("kda", H, H, K, V, qk_l2norm=True))
    monkeypatch.setattr(module, "chunk_backward", lambda *a, **k: pytest.fail("chunk_backward ran: nothing was saved"))
    loss_saved, grads_saved = grads_of(lambda *x: disable_recompute_step(*x, disable_recompute=True), inputs)
    assert torch.equal(loss, loss_saved)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "h0"), grads, grads_saved, strict=True):
        assert torch.isfinite(a).all() and a.abs().sum() > 0, name
        assert torch.equal(a, b), name


def test_disable_recompute_step_compiles_without_graph_breaks_and_matches_eager():
    """The saving forward's extra outputs go through the custom op's fake (their shapes and dtypes
    from the module's OUTPUT_SHAPES / OUTPUT_DTYPES, NC from NC_CHUNK_SIZE) into the backward."""
    inputs = kda_inputs(4)
    step = lambda *x: disable_recompute_step(*x, disable_recompute=True)  # noqa: E731
    eager_loss, eager_grads = grads_of(step, inputs)
    compiled_loss, compiled_grads = grads_of(torch.compile(step, fullgraph=True, backend="aot_eager"), inputs)
    assert torch.equal(compiled_loss, eager_loss)
    assert all(torch.equal(a, b) for a, b in zip(compiled_grads, eager_grads, strict=True))


def test_no_grad_call_does_not_need_the_backward():
    q, k, v, g, beta, h0 = kda_inputs(3)
    from k3compile.ops.kda import chunk_kda

    with torch.no_grad():
        o, ht = chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o2, ht2 = chunk_kda(q, k, v, g, beta, initial_state=h0.requires_grad_(), output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
    assert torch.equal(o, o2.detach()) and torch.equal(ht, ht2.detach())
    assert o2.requires_grad and ht2.requires_grad


TRAIN_STEP = Path(__file__).resolve().parent.parent / "examples" / "train_step.py"


@pytest.mark.parametrize("options,mode", [
    (["--backend", "aot_eager"], "torch.compile(fullgraph=True, backend='aot_eager')"),
    (["--eager"], "eager"),
], ids=["compiled", "eager"])
def test_examples_train_step_lowers_the_loss(monkeypatch, capsys, options, mode):
    """examples/train_step.py: optimizer steps of a KDA block (in-kernel gate, beta logits, l2norm)
    through torch.compile(fullgraph=True) (aot_eager here: inductor's C++ build of the graphs takes
    longer than the steps) or eagerly; the last line says which."""
    monkeypatch.setattr(sys, "argv", [str(TRAIN_STEP), "--steps", "3", "--tokens", "17", *options])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(TRAIN_STEP), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert out.strip().splitlines()[-1].endswith(f"over 3 steps (cpu, torch.float32, {mode})"), out


def test_examples_train_step_falls_back_where_the_backend_cannot_build(capsys):
    """A backend that cannot build its code (inductor without a C++ compiler) gives aot_eager, and
    the script says why; one that can is kept."""
    usable_backend = runpy.run_path(str(TRAIN_STEP))["usable_backend"]

    def no_compiler(graph, example_inputs):
        raise RuntimeError("No working C++ compiler found")

    assert usable_backend(torch, no_compiler, "cpu") == "aot_eager"
    assert "cannot build its code here (No working C++ compiler found)" in capsys.readouterr().out
    assert usable_backend(torch, "eager", "cpu") == "eager"


@pytest.mark.parametrize("group", [1, 2], ids=["value_heads_equal", "grouped_value_heads"])
def test_backward_fake_gives_the_kernels_dtypes(group):
    """The backward op's fake says each gradient's dtype as the compiled entry returns it (bf16
    inputs: dq, dk, dv in bf16 where each element is stored once, fp32 where a group of value
    heads adds up; dg, dbeta fp32): a mismatch would break torch.compile's graphs, and the fp32
    inputs of the other tests cannot show one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    key = LayerKey("kda", H, H * group, K, V, qk_l2norm=True)
    chunk_operator(key)
    backward = getattr(torch.ops.k3compile, f"chunk_backward_{key.module_name()}").default
    gen = torch.Generator().manual_seed(group)
    q, k = (torch.randn(B, T, H, K, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(B, T, H * group, V, generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(B, T, H * group, K, generator=gen))
    beta = torch.rand(B, T, H * group, generator=gen).bfloat16()
    h0, do = torch.randn(B, H * group, K, V, generator=gen), torch.randn(B, T, H * group, V, generator=gen).bfloat16()
    args = (q, k, v, g, beta, None, None, h0, None, do, None, K ** -0.5, True, [], torch.empty(0), 0)
    real = backward(*args)
    with FakeTensorMode() as mode:
        fake = backward(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in args))
    assert [(x.dtype, x.shape) for x in fake] == [(x.dtype, x.shape) for x in real]
    assert real[0].dtype == (torch.float32 if group > 1 else torch.bfloat16) and real[2].dtype == torch.bfloat16


def test_wide_key_gla_compiles_without_graph_breaks_and_matches_eager():
    """GLA with more keys than a kernel holds runs as key blocks (k3compile.ops.gla): the slices,
    the blocks' custom ops and the sum of their outputs trace into one graph, forward and backward."""
    from k3compile.ops.gla import KEY_BLOCK, chunk_gla

    wide = KEY_BLOCK + 44  # two blocks of 150 keys
    gen = torch.Generator().manual_seed(3)
    q = F.normalize(torch.randn(B, 7, H, wide, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, 7, H, wide, generator=gen), dim=-1)
    v = torch.randn(B, 7, H, V, generator=gen)
    g = F.logsigmoid(torch.randn(B, 7, H, wide, generator=gen))
    h0 = 0.5 * torch.randn(B, H, wide, V, generator=gen)

    def gla_step(q, k, v, g, h0):
        o, ht = chunk_gla(q, k, v, g, initial_state=h0, output_final_state=True)
        return (o * o).sum() + (ht * ht).sum()

    inputs = (q, k, v, g, h0)
    eager_loss, eager_grads = grads_of(gla_step, inputs)
    compiled_loss, compiled_grads = grads_of(torch.compile(gla_step, fullgraph=True, backend="aot_eager"), inputs)
    assert torch.equal(compiled_loss, eager_loss)
    for name, a, b in zip(("q", "k", "v", "g", "h0"), compiled_grads, eager_grads, strict=True):
        assert b is not None and torch.isfinite(b).all() and b.abs().sum() > 0, name
        assert torch.equal(a, b), name


@pytest.mark.parametrize("final_state", [True, False], ids=["final_state", "no_final_state"])
def test_backward_in_windows_equals_the_whole_backward(monkeypatch, final_state):
    """K3C_BACKWARD_WINDOW=16 on 34 tokens: chunk_backward runs on windows of 16, 16, 2 tokens
    from the forward's checkpoints, the last first (k3compile/ops/windows.py), and every gradient
    (the in-kernel gate's A_log and dt_bias added up over the windows, q and k of grouped value
    heads, dh0) equals the backward of the whole sequence."""
    from k3compile.ops import autograd
    from k3compile.ops.kda import chunk_kda

    Bw, Tw, HV = 2, 34, 4
    gen = torch.Generator().manual_seed(7)
    tensors = dict(q=torch.randn(Bw, Tw, H, K, generator=gen), k=torch.randn(Bw, Tw, H, K, generator=gen),
                   v=torch.randn(Bw, Tw, HV, V, generator=gen), g=torch.randn(Bw, Tw, HV, K, generator=gen),
                   beta=torch.randn(Bw, Tw, HV, generator=gen), A_log=torch.randn(HV, generator=gen) * 0.3,
                   dt_bias=torch.randn(HV * K, generator=gen) * 0.3, initial_state=torch.randn(Bw, HV, K, V, generator=gen))
    cotangents = torch.randn(Bw, Tw, HV, V, generator=gen), torch.randn(Bw, HV, K, V, generator=gen)

    def gradients() -> dict:
        leaves = {n: x.clone().requires_grad_() for n, x in tensors.items()}
        o, ht = chunk_kda(**leaves, output_final_state=final_state, use_qk_l2norm_in_kernel=True,
                          use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        torch.autograd.backward([o, ht] if final_state else [o], list(cotangents) if final_state else [cotangents[0]])
        return {n: x.grad for n, x in leaves.items()}

    whole = gradients()
    calls = []
    real = autograd.windowed_backward

    def spying(entry, given, **options):  # the windows' lengths, as chunk_backward is called
        def counted(**arguments):
            calls.append(arguments["q"].shape[1])
            return entry(**arguments)
        return real(counted, given, **options)

    monkeypatch.setattr(autograd, "windowed_backward", spying)
    monkeypatch.setenv("K3C_BACKWARD_WINDOW", "16")
    windowed = gradients()
    assert calls == [2, 16, 16], calls
    for name, want in whole.items():
        assert torch.allclose(windowed[name], want, rtol=1e-4, atol=1e-5), \
            f"d{name}: max abs difference {(windowed[name] - want).abs().max():.3e}"


@pytest.mark.parametrize("value", ["10", "0", "x"])
def test_backward_window_of_whole_chunks_only(monkeypatch, value):
    """K3C_BACKWARD_WINDOW must be whole chunks (16 here): anything else is a one-line ValueError
    naming the variable, before any kernel runs."""
    from k3compile.ops.kda import chunk_kda

    monkeypatch.setenv("K3C_BACKWARD_WINDOW", value)
    q, k, v, g, beta, h0 = (x.requires_grad_() for x in kda_inputs())
    with pytest.raises(ValueError, match=r"^K3C_BACKWARD_WINDOW: expected 'inputs' or a positive multiple of 16 "
                       r"tokens") as error:
        chunk_kda(q, k, v, g, beta, initial_state=h0)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("tokens", [4096, 50])
def test_backward_window_inputs_policy_keeps_workspaces_within_the_inputs(monkeypatch, tokens):
    """K3C_BACKWARD_WINDOW=inputs: the longest window of whole chunks whose chunk_backward
    workspaces take no more than the call's q, k, v and do, and at least 1024 tokens; a shorter
    sequence runs whole (0). At K = V = 128 the per-chunk S and S_bar alone are 4x those inputs'
    bytes per token and head at chunks of 16, so a long sequence is cut."""
    from dataclasses import astuple

    from k3compile.ops.layers import layer_module
    from k3compile.ops.windows import backward_window, window_multiple, workspace_bytes

    key = LayerKey("kda", 4, 4, 128, 128, qk_l2norm=True)
    module = layer_module(key)
    batch, itemsize = 2, 2
    inputs = batch * tokens * (2 * 4 * 128 + 2 * 4 * 128) * itemsize
    monkeypatch.setenv("K3C_BACKWARD_WINDOW", "inputs")
    window = backward_window(batch, tokens, itemsize, "cpu", False, False, *astuple(key))
    multiple = window_multiple(module)

    def used(length: int) -> int:
        return workspace_bytes(module, "chunk_backward", {"B": batch, "T": length, "N": batch}, itemsize)

    if window == 0:
        assert used(tokens) <= inputs or tokens <= 1024, (tokens, used(tokens), inputs)
    else:
        assert window % multiple == 0 and 0 < window < tokens, window
        assert window >= 1024, window
        assert used(window) <= inputs or window < 1024 + multiple, (window, used(window), inputs)
        assert used(window + multiple) > inputs, (window, used(window + multiple), inputs)
    assert (window > 0) == (tokens == 4096), (tokens, window)


def test_workspace_bytes_count_the_per_chunk_states():
    """A million tokens at H16, chunks of 16, bf16: chunk_backward's workspaces hold at least the
    per-chunk state and its cotangent, 2 x 65,537 chunks x 16 x 128 x 128 x 2 bytes (64 GiB), which
    is what ran the 80 GB H100 out of memory (bench/RESULTS.md, "A million tokens")."""
    from k3compile.ops.layers import layer_module
    from k3compile.ops.windows import workspace_bytes

    module = layer_module(LayerKey("kda", 16, 16, 128, 128, qk_l2norm=True))
    T = 1 << 20
    states = 2 * (T // 16 + 1) * 16 * 128 * 128 * 2
    got = workspace_bytes(module, "chunk_backward", {"B": 1, "T": T, "N": 1}, 2)
    assert states <= got <= 2 * states, (got, states)
