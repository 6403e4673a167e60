"""The block stack (k3compile.runtime.stack, docs/block-stack.md): its [model] spec checked key by key; its
forward and gradients against the Block AttnRes recursion written out here (the paper's: every
point mixes the completed blocks and the current block's partial sum; a block's sum becomes its
representative), in float64 autograd for an attention stack and in fp32 for one with KDA layers;
activation memory under checkpointing against plain residuals plus the representatives;
torch.compile(fullgraph=True) of one layer; the two-phase switch. Compiled kernels run in Triton's
interpreter (fp32, tiny shapes, NaN-poisoned outputs); fresh random weights every run."""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

from conftest import EXAMPLES, one_line
from k3compile.errors import SpecError
from k3compile.runtime.stack import build_stack
from k3compile.runtime.stack_spec import load_model_spec, model_spec_from_table

# a non-power-of-two width, a last block of one layer (3 layers in blocks of 2)
TINY = dict(hidden_size=20, num_layers=3, block_size=2, attn_heads=2, attn_head_dim=6, kda_heads=1,
            kda_head_dim=16, ffn_hidden_size=28, dtype="float32")


MOE = dict(ffn="moe", num_experts=4, top_k=2, expert_ffn_dim=8, latent_dim=12, num_shared_experts=1,
           shared_ffn_dim=6, moe_activation="situ_glu")  # LatentMoE FFNs: latent, a shared expert, SiTU-GLU


def stack_of(**overrides):
    model = build_stack(model_spec_from_table({**TINY, **overrides}))
    with torch.no_grad():  # random weights: zero queries (the init) would make every mix a mean
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.5 if name.endswith(("query", "gain", "norm")) else 0.2))
    return model


def reference(model, x):
    """Block AttnRes written out (the paper's recursion), on the model's own weights and sublayers:
    h = RMSNorm(sum_i softmax_i(w . RMSNorm_g(v_i)) v_i) over v = blocks + [partial]."""
    spec = model.spec

    def point_input(point, sources):
        v = torch.stack(sources)
        keys = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + spec.eps) * point.gain
        h = (torch.softmax(keys @ point.query, dim=0)[..., None] * v).sum(0)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + spec.eps) * point.norm

    blocks, partial = [x], None
    for index, layer in enumerate(model.layers):
        for point, sublayer in zip(layer.points, (layer.mixer, layer.ffn)):
            out = sublayer(point_input(point, blocks + ([] if partial is None else [partial])))
            partial = out if partial is None else partial + out
        if (index + 1) % spec.block_size == 0:
            blocks, partial = blocks + [partial], None
    return point_input(model.final, blocks + ([] if partial is None else [partial]))


def grads_of(model, run) -> dict:
    model.zero_grad()
    run().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_close(got: dict, want: dict, rtol: float, noise: dict | None = None) -> None:
    """Each gradient within rtol of its largest element, or of 1e-6 of the model's largest gradient
    where it is smaller (a gradient zero in exact arithmetic — a block's first point over b_0 alone
    has a softmax over one source — comes out of the kernels as rounding noise); with `noise`
    (rounding_noise), within a hundred times a gradient's own rounding noise where that is larger:
    a nudge of 2^-24 moves a sum that cancels less than summing it in another order does (19x on
    the A_log of K3C_TEST_SEED=1381664053, -5.9e-5 from terms of order one, 2.1e-7 apart)."""
    assert got.keys() == want.keys()
    floor = 1e-6 * max(w.abs().max().item() for w in want.values())
    for name in want:
        scale = want[name].abs().max().clamp_min(floor)
        err = ((got[name].double() - want[name].double()).abs().max() / scale).item()
        tolerance = max(rtol, 100 * noise[name]) if noise else rtol
        assert err <= tolerance, f"{name}: relative error {err:.2e} > {tolerance:.1e}"


def rounding_noise(model, loss_of, weights: torch.Tensor) -> dict:
    """How far each gradient of loss_of(weights) moves, relative to its largest element, when the
    weights move by fp32 rounding (2^-24 relative). A gradient that is one sum of terms that cancel
    (a KDA gate's A_log: one number a head, over every token and channel) moves far more than the
    rest, and two fp32 evaluations that sum in other orders may differ by that much."""
    want = grads_of(model, lambda: loss_of(weights))
    moved = grads_of(model, lambda: loss_of(weights * (1 + 2.0 ** -24 * torch.randn_like(weights))))
    floor = 1e-6 * max(w.abs().max().item() for w in want.values())
    return {name: ((moved[name] - w).abs().max() / w.abs().max().clamp_min(floor)).item() for name, w in want.items()}


# --- the spec -------------------------------------------------------------------------------


def test_example_spec_is_k3_pattern():
    spec = load_model_spec(EXAMPLES / "models" / "k3_stack.toml")
    assert spec.layers == ("kda", "kda", "kda", "attn") * 2 and spec.num_blocks == 4
    k3 = model_spec_from_table({**TINY, "num_layers": 93, "block_size": 12, "layer_pattern": "kda,kda,kda,attn"})
    assert k3.num_blocks == 8 and k3.layers.count("attn") == 23 and k3.layers[-1] == "kda"


@pytest.mark.parametrize("change, words", [
    ({"hidden_size": None}, "missing key 'hidden_size'"),
    ({"hidden_size": 0}, "key 'hidden_size': expected an integer in 1"),
    ({"layers": 3}, "unknown key 'layers'"),
    ({"layer_pattern": "kda,mamba"}, "key 'layer_pattern': expected comma-separated words of kda, attn"),
    ({"num_blocks": 3}, "key 'num_blocks': expected ceil(num_layers / block_size) = 2"),
    ({"kda_heads": None, "layer_pattern": "kda"}, "missing key 'kda_heads'"),
    ({"ffn": "moe"}, "missing key 'num_experts'"),
    ({**MOE, "shared_ffn_dim": 0}, "key 'shared_ffn_dim': expected an integer >= 1 with num_shared_experts = 1"),
    ({**MOE, "moe_activation": "gelu"}, "key 'moe_activation': expected one of"),
    ({"ffn": "sparse"}, "key 'ffn': expected one of dense, moe"),
    ({"attnres": "full"}, "key 'attnres': expected one of aggregate, two_phase, torch, none"),
    ({"checkpoint_attnres": 1}, "key 'checkpoint_attnres': expected true or false"),
])
def test_spec_errors_name_the_key(change, words):
    table = {key: value for key, value in {**TINY, **change}.items() if value is not None}
    with pytest.raises(SpecError) as err:
        model_spec_from_table(table, source="s.toml")
    assert one_line(str(err.value)) and str(err.value).startswith("s.toml: [model]") and words in str(err.value)


def test_spec_file_errors(tmp_path):
    for text, words in (("[layer]\nname = 'x'\n", "unknown table or key 'layer'"), ("[model\n", "not valid TOML"),
                        ("", "missing [model] table")):
        path = tmp_path / "m.toml"
        path.write_text(text)
        with pytest.raises(SpecError, match="m.toml: ") as err:
            load_model_spec(path)
        assert words in str(err.value) and one_line(str(err.value))


def test_moe_ffn_is_the_latent_moe_layer():
    """ffn = 'moe': a layer's FFN is k3compile.ops.moe's LatentMoE (latent projections, a shared
    expert, SiTU-GLU) on the rows as tokens: its output and every weight's gradient against float64
    autograd of reference.latent_moe on the same weights; router_bias a buffer, no gradient."""
    from test_moe_backward import reference_gradients
    from test_moe_training import reference_op

    ffn = stack_of(layer_pattern="attn", attnres="torch", **MOE).layers[0].ffn
    assert "router_bias" not in dict(ffn.named_parameters()) and "router_bias" in dict(ffn.named_buffers())
    with torch.no_grad():
        ffn.router_bias.copy_(torch.randn(4) * 0.1)  # a bias that ranks: the selection must take it
    u, dout = torch.randn(2, 3, 20), torch.randn(2, 3, 20)
    ffn.zero_grad()
    out = ffn(u)
    out.backward(dout)
    weights = {name: getattr(ffn, name).detach() for name in ffn.weights}
    want, want_grads = reference_gradients(reference_op(ffn.key), {"x": u.reshape(6, 20), "router_bias":
                                                                   ffn.router_bias.detach(), **weights},
                                           dout.reshape(6, 20))
    assert_close({"out": out.detach().reshape(6, 20)}, {"out": want}, 1e-5)
    assert_close({name: getattr(ffn, name).grad for name in ffn.weights},
                 {name: want_grads[name] for name in ffn.weights}, 1e-5)
    assert sorted(ffn.weights) == sorted(["router_weight", "expert_gate_up", "expert_down", "latent_down", "latent_up",
                                          "latent_norm_gain", "shared_gate_up", "shared_down"])


def test_moe_stack_trains():
    """A stack of KDA and attention layers with LatentMoE FFNs: one training step gives every
    parameter a finite gradient and every FFN weight a nonzero one (none silently dropped), equal
    to the recursion's on the same sublayers."""
    model = stack_of(layer_pattern="kda,attn", attnres="aggregate", **MOE)
    x, weights = torch.randn(1, 5, 20), torch.randn(1, 5, 20)
    got = grads_of(model, lambda: (model(x) * weights).sum())
    assert got.keys() == {name for name, _ in model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in got.values())
    # every FFN weight moves (the first point's query and gain see a softmax over b_0 alone: zero)
    assert all(g.abs().max() > 0 for name, g in got.items() if ".ffn." in name)
    # fp32 on both sides, the aggregates summed in other orders (the KDA stack's 2e-4; seen 1.7e-4 on
    # A_log, and 3.4e-3 where a head's A_log nearly cancels: K3C_TEST_SEED=1381664053)
    def reference_loss(w):
        return (reference(model, x) * w).sum()

    assert_close(got, grads_of(model, lambda: reference_loss(weights)), 5e-4,
                 rounding_noise(model, reference_loss, weights))


def test_input_checks():
    model = stack_of(layer_pattern="attn", attnres="torch")
    for x, words in ((torch.randn(2, 5, 21), "x: expected hidden states [B, T, D] with D = 20, got [2, 5, 21]"),
                     (torch.randn(2, 5, 20, dtype=torch.float64), "x: expected dtype torch.float32"),
                     ([1.0], "got list")):
        with pytest.raises(ValueError, match=r"^x: ") as err:
            model(x)
        assert words in str(err.value)
    with pytest.raises(ValueError, match=r"x: expected token ids \[B, T\]"):
        stack_of(layer_pattern="attn", attnres="torch", vocab_size=11)(torch.randn(2, 5))


# --- the stack against the recursion -------------------------------------------------------


@pytest.mark.parametrize("form", ["aggregate", "two_phase", "torch"])
def test_attention_stack_matches_float64_autograd(form):
    """The compiled aggregate (checkpointed), the compiled two phases (batched a block, recomputed in
    the backward) and the torch form: output and every parameter's gradient against float64
    autograd of the recursion; token ids through the embedding and head."""
    model = stack_of(layer_pattern="attn", attnres=form, vocab_size=13)
    x = torch.randint(0, 13, (2, 5))
    out = model(x)
    weights = torch.randn_like(out)
    got = grads_of(model, lambda: (model(x) * weights).sum())
    model64 = copy.deepcopy(model).double()
    ref = model64.head(reference(model64, model64.embed(x)))
    with torch.no_grad():  # inference: no checkpoint, phase 1 straight through
        inference = model(x)
    for result in (out, inference):
        assert torch.isfinite(result).all()
        assert (result.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    want = grads_of(model64, lambda: (model64.head(reference(model64, model64.embed(x))) * weights.double()).sum())
    assert_close(got, want, 1e-4)


def test_kda_stack_matches_the_recursion():
    """KDA and attention layers (chunk_kda compiled), an odd length: the stack against the recursion
    on the same sublayers in fp32 (no float64 KDA in torch), output and gradients."""
    model = stack_of(layer_pattern="kda,attn")
    x = torch.randn(1, 7, 20)
    weights = torch.randn(1, 7, 20)
    got = grads_of(model, lambda: (model(x) * weights).sum())
    want = grads_of(model, lambda: (reference(model, x) * weights).sum())
    with torch.no_grad():
        assert (model(x) - reference(model, x)).abs().max() <= 1e-4 * reference(model, x).abs().max()
    assert_close(got, want, 2e-4, rounding_noise(model, lambda w: (reference(model, x) * w).sum(), weights))


def test_representatives_are_the_block_sums_not_copies():
    """A block's representative is its partial sum, the same tensor every later point receives."""
    model = stack_of(layer_pattern="attn", attnres="torch", num_layers=4)
    seen = []
    original = model.point_input
    model.point_input = lambda point, reps, partial: (seen.append(list(reps)), original(point, reps, partial))[1]
    with torch.no_grad():
        model(torch.randn(1, 3, 20))
    assert [len(reps) for reps in seen] == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert all(a is b for reps in seen[4:] for a, b in zip(reps, seen[4])) and seen[8][1] is seen[4][1]


# --- activation memory -------------------------------------------------------------------


def saved_bytes(model, x, monkeypatch) -> int:
    """Bytes of the distinct storages the forward leaves for the backward: the tensors autograd
    saves (saved_tensors_hooks) and the inputs the checkpoints hold (recorded at the call), less
    the parameters and the input."""
    from torch.utils import checkpoint

    storages: dict[int, int] = {}

    def note(t):
        if isinstance(t, torch.Tensor):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        elif isinstance(t, (list, tuple)):
            for item in t:
                note(item)

    real = checkpoint.checkpoint
    monkeypatch.setattr(checkpoint, "checkpoint", lambda fn, *args, **kw: (note(args), real(fn, *args, **kw))[1])
    with saved_tensors_hooks(lambda t: (note(t), t)[1], lambda t: t):
        out = model(x)
    monkeypatch.setattr(checkpoint, "checkpoint", real)
    for t in (*model.parameters(), x, out):
        storages.pop(t.untyped_storage().data_ptr(), None)
    return sum(storages.values())


@pytest.mark.parametrize("form", ["aggregate", "two_phase", "torch"])
def test_checkpointed_memory_is_plain_residuals_plus_the_representatives(form, monkeypatch, capsys):
    """Ours against the bound: the same stack with plain residuals plus its n representatives; and
    without checkpointing (the sources the aggregate saves) far above it."""
    layers, block, B, T, D = 4, 2, 2, 9, 20
    x = torch.randn(B, T, D, requires_grad=True)
    sizes = dict(layer_pattern="attn", num_layers=layers, block_size=block)
    ours = saved_bytes(stack_of(attnres=form, **sizes), x, monkeypatch)
    plain = saved_bytes(stack_of(attnres="none", **sizes), x, monkeypatch)
    unchecked = saved_bytes(stack_of(attnres="torch", checkpoint_attnres=False, **sizes), x, monkeypatch)
    bound = plain + layers // block * B * T * D * 4  # the representatives the forward makes (b_0 is x)
    with capsys.disabled():
        print(f"\n{form}: saved {ours} B, plain residuals {plain} B, bound {bound} B: ratio to the bound "
              f"{ours / bound:.3f}, to plain {ours / plain:.3f}; the torch form without checkpointing {unchecked / bound:.3f}")
    assert ours <= 1.05 * bound
    assert unchecked > 1.2 * bound


# --- torch.compile and the two-phase switch ----------------------------------------------


def test_one_layer_compiles_fullgraph():
    """One KDA layer's two points and sublayers (checkpointed aggregate, chunk_kda: custom ops) under
    torch.compile(fullgraph=True) with aot_eager: output and gradients equal to eager."""
    model = stack_of(layer_pattern="kda", num_layers=2)
    reps = [torch.randn(1, 6, 20, requires_grad=True), torch.randn(1, 6, 20, requires_grad=True)]
    partial = torch.randn(1, 6, 20, requires_grad=True)

    def layer(reps, partial):
        return model.run_layers(1, 2, reps, partial)[0][-1]

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    weights = torch.randn(1, 6, 20)
    results = []
    for run in (layer, compiled):
        model.zero_grad()
        for t in (*reps, partial):
            t.grad = None
        out = run(reps, partial)
        (out * weights).sum().backward()
        results.append((out.detach(), [t.grad for t in (*reps, partial)],
                        {n: p.grad.clone() for n, p in model.layers[1].named_parameters()}))
    (eager, eager_inputs, eager_params), (comp, comp_inputs, comp_params) = results
    assert torch.allclose(comp, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(comp_inputs, eager_inputs):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    assert_close(comp_params, eager_params, 1e-4)


# ops through which a saved tensor is its producer's output (the partitioned graph's views)
VIEWS = {getattr(torch.ops.aten, name).default for name in ("view", "_unsafe_view", "t", "detach", "alias")} | {
    torch.ops.aten.transpose.int, torch.ops.aten.select.int, torch.ops.aten.unbind.int, torch.ops.aten.split.Tensor,
    torch.ops.aten.slice.Tensor, operator.getitem}


@pytest.mark.filterwarnings("ignore:Your compiler for AOTAutograd is returning a function that doesn't take boxed")
def test_one_layer_of_each_form_compiles_fullgraph_and_saves_no_aggregation():
    """One attention layer at a block's start (its first point mixes the representatives alone, its
    second merges the partial sum) of the one-phase aggregate and of the two phases, under
    torch.compile(fullgraph=True) with aot_eager (torch._dynamo.testing's, which records the
    partitioned graphs): output and every gradient (representatives, parameters) equal to eager on
    fresh random inputs; and, as in eager, the compiled forward saves for the backward no output of
    an AttnRes op (the aggregate's, phase 1's rows, a merge's output or log-sum-exp), only the
    representatives, partial sums and weights they are recomputed from, and the sublayers' own."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    for form in ("aggregate", "two_phase"):
        model = stack_of(layer_pattern="attn", attnres=form)  # 3 layers in blocks of 2: layer 2 starts block 1
        reps = [torch.randn(1, 6, 20, requires_grad=True) for _ in range(2)]
        weights = torch.randn(1, 6, 20)

        def layer(reps):
            return model.run_layers(2, 3, reps, None)[1]  # the block's partial sum after the layer

        backend = AotEagerAndRecordGraphs()
        results = []
        for run in (layer, torch.compile(layer, fullgraph=True, backend=backend)):
            model.zero_grad()
            for t in reps:
                t.grad = None
            out = run(reps)
            (out * weights).sum().backward()
            results.append((out.detach(), {f"rep{i}": t.grad for i, t in enumerate(reps)} | {
                name: p.grad.clone() for name, p in model.layers[2].named_parameters()}))
        (eager, eager_grads), (compiled, compiled_grads) = results
        assert torch.isfinite(eager).all() and (compiled - eager).abs().max() <= 1e-5, form
        assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) == 2 + 10
        for name, want in eager_grads.items():
            assert (compiled_grads[name] - want).abs().max() <= 1e-5 + 1e-5 * want.abs().max(), (form, name)
        (forward,) = backend.fw_graphs
        saved = next(iter(reversed(forward.graph.nodes))).args[0][1:]  # after the layer's output
        producers = set()
        for node in saved:
            while node.op == "call_function" and node.target in VIEWS:
                node = node.args[0]
            producers.add(str(node.target))
        assert not any("k3compile.attnres_" in name for name in producers), (form, sorted(producers))
        assert any("k3compile.attnres_" in str(node.target) for node in forward.graph.nodes), form

def test_two_phase_runs_split_inside_blocks():
    """A run of layers that starts or ends inside a block (a pipeline stage's) computes phase 1 for
    its part of the block: the same output and gradients as one run."""
    model = stack_of(layer_pattern="attn", attnres="two_phase", num_layers=5, block_size=3)
    x = torch.randn(1, 4, 20)
    weights = torch.randn(1, 4, 20)

    def split(*cuts):
        def run():
            reps, partial = model.begin(x)
            for start, stop in zip(cuts, cuts[1:]):
                reps, partial = model.run_layers(start, stop, reps, partial)
            return (model.finish(reps, partial) * weights).sum()
        return run

    whole = grads_of(model, split(0, 5))
    for cuts in ((0, 1, 5), (0, 2, 4, 5), (0, 4, 5)):
        assert_close(grads_of(model, split(*cuts)), whole, 1e-4)  # fp32 sums in another order: rounding, not a gradient lost


def test_two_phase_without_recompute_is_plain_autograd():
    """checkpoint_attnres = false: the two phases' own autograd (phase 1's results kept), the same
    gradients as the recomputing path."""
    model = stack_of(layer_pattern="attn", attnres="two_phase", num_layers=3)
    plain = build_stack(model_spec_from_table({**model.spec.table(), "checkpoint_attnres": False}))
    plain.load_state_dict(model.state_dict())
    x, weights = torch.randn(1, 4, 20), torch.randn(1, 4, 20)
    assert_close(grads_of(plain, lambda: (plain(x) * weights).sum()), grads_of(model, lambda: (model(x) * weights).sum()),
                 1e-5)
    with pytest.raises(TypeError, match="^spec: expected a ModelSpec"):
        build_stack(42)


def test_two_phase_keeps_no_partials_for_the_backward():
    """Phase 1's results ([Q, B, T, D] a block) and the stacked representatives ([n, B, T, D]) are
    not among what the forward leaves (attention's [B, H, T, head_dim] are)."""
    model = stack_of(layer_pattern="attn", attnres="two_phase", num_layers=4)
    x = torch.randn(1, 5, 20, requires_grad=True)
    kept = []
    with saved_tensors_hooks(lambda t: (kept.append(t.shape), t)[1], lambda t: t):
        model(x)
    assert any(len(shape) == 4 for shape in kept)
    assert not any(len(shape) == 4 and shape[-1] == 20 for shape in kept), kept


def test_plain_residuals_are_the_residual_stream():
    model = stack_of(layer_pattern="attn", attnres="none")
    x = torch.randn(2, 4, 20)
    h = x
    for layer in model.layers:
        for point, sublayer in zip(layer.points, (layer.mixer, layer.ffn)):
            h = h + sublayer(F.rms_norm(h, (20,), point.norm, 1e-6))
    with torch.no_grad():
        assert torch.allclose(model(x), F.rms_norm(h, (20,), model.final.norm, 1e-6), atol=1e-5)
