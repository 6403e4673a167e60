"""The compiled LatentMoE layer, `moe` (`moe_prefill`, expert-centric; `moe_decode`,
token-centric), against reference.latent_moe in float64, in the interpreter in fp32; and the
expert-centric dispatch plan: the sorted pair list is a bijection onto the (token, slot) pairs,
each in a block of its own expert."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_matches, layer_op
from k3compile.ir import k3s, reference
from test_moe_route import inputs as routing_inputs

# (hidden d, latent l, experts E, top_k, expert FFN F, shared experts S, shared FFN Fs, activation):
# no power of two anywhere; full width without shared experts; every expert chosen by every token
LAYERS = [(40, 24, 6, 3, 20, 2, 12, "situ_glu"), (48, 0, 8, 2, 24, 0, 0, "swiglu"),
          (36, 20, 5, 5, 17, 1, 10, "swiglu"), (40, 0, 12, 4, 16, 2, 8, "situ_glu")]
# the expert-centric plan with blocks of 16 pairs: several blocks per expert at R = 37
PIPELINES = [None, "lower-moe-routing,lower-moe-experts{block-rows=16}"]


def layer_name(p) -> str:
    return "moe_d{}_l{}_e{}_k{}_f{}_s{}x{}_{}".format(*p)


def case_id(q) -> str:
    return layer_name(q[0]) + ("_blocks16" if q[1] else "")


# block-rows changes the expert-centric plan (moe_prefill) only: moe_decode, moe_decode_warp,
# their router and the dispatch of `moe` print the same in both pipelines
# (test_block_rows_leave_the_decode_path_alone), so the decode schedule and the dispatch run on
# the default pipeline's layers and the prefill schedule on both
CASES = [(p, pipe) for p in LAYERS for pipe in PIPELINES]
DEFAULT_CASES = [q for q in CASES if q[1] is None]
SCHEDULES = [pytest.param(q, "prefill", id=case_id(q) + "-prefill") for q in CASES] + [
    pytest.param(q, "decode", id=case_id(q) + "-decode") for q in DEFAULT_CASES]


@pytest.fixture(scope="module")
def layer(request, compile_layer):
    (d, l, E, k, F, S, Fs, activation), pipeline = request.param  # noqa: E741
    return compile_layer(pipeline=pipeline, name=layer_name(request.param[0]), kind="latent_moe", hidden_size=d,
                         latent_dim=l, num_experts=E, top_k=k, expert_ffn_dim=F, num_shared_experts=S,
                         shared_ffn_dim=Fs, activation=activation, dtype="float32")


def weights(p: dict) -> dict:
    """Fresh weights in reference.latent_moe's layouts for the spec parameters p, scaled so
    activations stay O(1)."""
    d, l, E, F = p["hidden_size"], p["latent_dim"], p["num_experts"], p["expert_ffn_dim"]
    S, Fs = p["num_shared_experts"], p["shared_ffn_dim"]
    w = l or d
    out = {"expert_gate_up": torch.randn(E, 2 * F, w) / math.sqrt(w),
           "expert_down": torch.randn(E, w, F) / math.sqrt(F)}
    if l:
        out |= {"latent_down": torch.randn(l, d) / math.sqrt(d), "latent_up": torch.randn(d, l) / math.sqrt(l),
                "latent_norm_gain": 1 + 0.2 * torch.randn(l)}
    if S:
        out |= {"shared_gate_up": torch.randn(S, 2 * Fs, d) / math.sqrt(d),
                "shared_down": torch.randn(S, d, Fs) / math.sqrt(Fs)}
    return out


def inputs_of(p: dict, R: int) -> dict:
    """Fresh inputs of a layer of the spec parameters p at R tokens (no near ties in the routing)."""
    x, router_weight, router_bias = routing_inputs(R, p["hidden_size"], p["num_experts"], p["top_k"])
    return {"x": x, "router_weight": router_weight, "router_bias": router_bias, **weights(p)}


def moe_inputs(layer, R: int) -> dict:
    return inputs_of(layer.spec.params, R)


def assert_moe(layer, arguments: dict, schedule: str) -> None:
    (out,) = layer.moe(**arguments, schedule=schedule)
    ref = reference.latent_moe(layer_op(layer), **arguments)
    assert out.dtype == arguments["x"].dtype and out.shape == arguments["x"].shape
    assert_matches(out, ref, f"moe out ({schedule})", rms_tol=1e-5, atol=1e-4, rtol=1e-4)


def decode_path(layer) -> dict[str, str]:
    """The printed functions that moe_decode, moe_decode_warp and `moe` run (the entries, their
    kernels, the router's): name -> source, less the _refuse_grad line, whose advice names the
    backward that only the default pipeline derives."""
    functions, name = {}, None
    for line in layer.path.read_text().splitlines():
        if line.startswith("def "):
            name = line[4:].split("(")[0]
            functions[name] = []
        elif line[:1] not in ("", " "):  # the function's end: module code, a decorator
            name = None
        elif name is not None and line.strip() and not line.strip().startswith("_refuse_grad("):
            functions[name].append(line)
    kept = ("moe", "moe_decode", "moe_decode_warp")
    kernels = tuple(f"{layer.spec.name}_{stage}_" for stage in ("decode", "router"))
    return {n: "\n".join(body) for n, body in functions.items() if n in kept or n.startswith(kernels)}


@pytest.mark.parametrize("p", LAYERS, ids=layer_name)
def test_block_rows_leave_the_decode_path_alone(compile_layer, p):
    """What lets the decode schedule and the dispatch run on the default pipeline only: every
    function of the decode path prints the same with block-rows=16."""
    default, blocks = (compile_layer(pipeline=pipe, name=layer_name(p), kind="latent_moe", hidden_size=p[0],
                                     latent_dim=p[1], num_experts=p[2], top_k=p[3], expert_ffn_dim=p[4],
                                     num_shared_experts=p[5], shared_ffn_dim=p[6], activation=p[7],
                                     dtype="float32") for pipe in PIPELINES)
    want, got = decode_path(default), decode_path(blocks)
    assert {"moe", "moe_decode", "moe_decode_warp"} <= set(want) and len(want) > 5, sorted(want)
    assert got == want


@pytest.mark.parametrize("layer, schedule", SCHEDULES, indirect=["layer"])
@pytest.mark.parametrize("R", [1, 5, 37])
def test_matches_reference(layer, R, schedule):
    torch.manual_seed(R)
    assert_moe(layer, moe_inputs(layer, R), schedule)


@pytest.mark.parametrize("layer, schedule", SCHEDULES, indirect=["layer"])
def test_crowded_and_idle_experts(layer, schedule):
    """A bias that sends every token to the same top_k experts (lowest-scoring ones, distinct
    biases: no ties): those experts get every token, the others none."""
    torch.manual_seed(1)
    arguments = moe_inputs(layer, 37)
    k = layer.spec.params["top_k"]
    chosen = torch.randperm(layer.spec.params["num_experts"])[:k]
    arguments["router_bias"][chosen] += 10 + torch.arange(k, dtype=torch.float32)
    assert_moe(layer, arguments, schedule)


@pytest.mark.parametrize("layer", DEFAULT_CASES, ids=case_id, indirect=True)
def test_auto_picks_by_token_count(layer, monkeypatch):
    """The default dispatch table (passes/moe_dispatch.py's H100_TABLE): split at one token, warp
    up to 4, prefill above (tests/test_moe_dispatch.py covers other tables)."""
    calls = []
    entries = ("moe_decode", "moe_decode_warp", "moe_prefill")
    for entry in entries:
        original = getattr(layer.module, entry)
        monkeypatch.setattr(layer.module, entry, lambda *a, _name=entry, _f=original, **kw: calls.append(_name)
                            or _f(*a, **kw))
    torch.manual_seed(2)
    for R in (1, 3, 33):
        layer.moe(**moe_inputs(layer, R))
    assert calls == list(entries)
    with pytest.raises(ValueError, match="^schedule: expected 'auto', 'decode', 'decode_warp' or 'prefill', got "
                                         "'fast'$"):
        layer.moe(**moe_inputs(layer, 3), schedule="fast")


class Recorder:
    """Stands in for the module's torch: records the tensors its entries fill (the dispatch
    plan's counters and sorted pair list) and allocate (_alloc)."""

    def __init__(self) -> None:
        self.filled: list[torch.Tensor] = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def full(self, *args, **kwargs):
        tensor = torch.full(*args, **kwargs)
        self.filled.append(tensor)
        return tensor


def test_dispatch_plan_is_a_bijection(compile_layer, monkeypatch):
    """moe_prefill's sorted pair list holds every (token, slot) pair exactly once, each in a block
    of its expert's run (block_expert), runs aligned to whole blocks, the rest -1."""
    layer = compile_layer(pipeline=PIPELINES[1], name=layer_name(LAYERS[0]), kind="latent_moe", hidden_size=40,
                          latent_dim=24, num_experts=6, top_k=3, expert_ffn_dim=20, num_shared_experts=2,
                          shared_ffn_dim=12, activation="situ_glu", dtype="float32")
    recorder, allocated = Recorder(), []
    monkeypatch.setattr(layer.module, "torch", recorder)
    alloc = layer.module._alloc
    monkeypatch.setattr(layer.module, "_alloc", lambda *a: allocated.append(alloc(*a)) or allocated[-1])
    torch.manual_seed(3)
    arguments = moe_inputs(layer, 37)
    layer.moe_prefill(**arguments)
    ids, _ = reference.latent_moe_routing(layer_op(layer), arguments["x"], arguments["router_weight"],
                                          arguments["router_bias"])
    sorted_pairs = next(t for t in recorder.filled if t.dtype == torch.int32 and t.dim() == 1 and (t < 0).any())
    blocks = sorted_pairs.numel() // 16
    block_expert = next(t for t in allocated if t.dtype == torch.int32 and t.shape == (blocks,))
    flat = ids.flatten()
    used = sorted_pairs[sorted_pairs >= 0]
    assert sorted(used.tolist()) == list(range(flat.numel())), "not a bijection onto the pairs"
    for position, pair in enumerate(sorted_pairs.tolist()):
        if pair >= 0:
            assert block_expert[position // 16] == flat[pair], f"pair {pair} in a block of another expert"
    runs = [int(block_expert[b]) for b in range(blocks) if (sorted_pairs[b * 16:(b + 1) * 16] >= 0).any()]
    assert runs == sorted(runs), "expert runs out of order"
    counts = torch.bincount(flat, minlength=6)
    assert len(runs) == sum(math.ceil(c / 16) for c in counts.tolist()), "runs not padded to whole blocks"


@pytest.mark.parametrize("name, change, words", [
    ("expert_gate_up", lambda a: {**a, "expert_gate_up": a["expert_gate_up"][:, :-1]}, "dim 1 of shape"),
    ("expert_down", lambda a: {**a, "expert_down": a["expert_down"].double()}, "expected dtype"),
    ("latent_up", lambda a: {**a, "latent_up": None}, "required, got None"),
    ("shared_down", lambda a: {**a, "shared_down": a["shared_down"].transpose(1, 2)}, "shape"),
    ("x", lambda a: {**a, "x": a["x"][:, :-1]}, "dim 1 of shape [R,"),
])
@pytest.mark.parametrize("schedule", ["decode", "prefill"])
def test_bad_inputs_name_the_tensor(compile_layer, name, change, words, schedule):
    layer = compile_layer(name=layer_name(LAYERS[0]), kind="latent_moe", hidden_size=40, latent_dim=24,
                          num_experts=6, top_k=3, expert_ffn_dim=20, num_shared_experts=2, shared_ffn_dim=12,
                          activation="situ_glu", dtype="float32")
    arguments = change(moe_inputs(layer, 4))
    with pytest.raises(ValueError) as error:
        layer.moe(**arguments, schedule=schedule)
    message = str(error.value)
    assert message.startswith(f"{name}: ") and words in message and "\n" not in message


def test_absent_stages_take_no_weights(compile_layer):
    """latent_dim = 0 and no shared experts: their weights are refused, not ignored."""
    layer = compile_layer(name=layer_name(LAYERS[1]), kind="latent_moe", hidden_size=48, latent_dim=0, num_experts=8,
                          top_k=2, expert_ffn_dim=24, num_shared_experts=0, shared_ffn_dim=0, activation="swiglu",
                          dtype="float32")
    arguments = moe_inputs(layer, 3)
    with pytest.raises(ValueError, match="^latent_up: "):
        layer.moe(**arguments, latent_up=torch.randn(48, 8))


@pytest.mark.parametrize("schedule", ["decode", "prefill"])
def test_many_rows_take_the_gemm_tiles(compile_layer, schedule):
    """130 rows: past every launch_by_rows bucket, the projections' own (GEMM) tiles, two row
    blocks of 128."""
    layer = compile_layer(name=layer_name(LAYERS[0]), kind="latent_moe", hidden_size=40, latent_dim=24,
                          num_experts=6, top_k=3, expert_ffn_dim=20, num_shared_experts=2, shared_ffn_dim=12,
                          activation="situ_glu", dtype="float32")
    torch.manual_seed(4)
    assert_moe(layer, moe_inputs(layer, 130), schedule)


@pytest.mark.parametrize("schedule", ["decode", "prefill"])
def test_router_slices_the_hidden_columns(compile_layer, schedule):
    """300 hidden columns: the entries' router sums its logits over several hidden slices at a
    few rows (5: blocks of 128 columns, 3 slices; 37: of 256, 2), as the `route` entry does."""
    p = (300, 24, 6, 3, 20, 1, 12, "situ_glu")
    layer = compile_layer(name=layer_name(p), kind="latent_moe", hidden_size=300, latent_dim=24, num_experts=6,
                          top_k=3, expert_ffn_dim=20, num_shared_experts=1, shared_ffn_dim=12,
                          activation="situ_glu", dtype="float32")
    slices = {op.max_rows.value.data: op.hidden_slices.value.data for op in layer.compilation.scheduled.walk()
              if isinstance(op, k3s.LaunchByRowsOp)
              and op.kernel.string_value() == f"{layer_name(p)}_{schedule}_router_logits"}
    assert slices[16] == 3 and slices[128] == 2, slices
    for R in (5, 37):
        torch.manual_seed(R)
        assert_moe(layer, moe_inputs(layer, R), schedule)
