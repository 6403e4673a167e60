"""Tuning the LatentMoE layer's dispatch table (k3compile/runtime/autotune/moe.py, `k3c tune --tokens`)
on the CPU: the search runs for real in Triton's interpreter (every candidate compiled, its
NaN-poisoned output checked against float64 before it is timed); the timer and the GPU name are
fakes. The tuned table is what `k3c compile` (compile_tuned) and k3compile.ops embed; an untuned
layer keeps the default table."""

from __future__ import annotations

import pytest

from conftest import run_cli
from k3compile import driver
from k3compile.runtime.autotune import TuneCache, TuningError, compile_tuned
from k3compile.runtime.autotune.moe import moe_table, tune_moe
from k3compile.ir import k3s
from k3compile.ops import layers
from k3compile.ops.moe import MoeKey
from k3compile.spec import spec_from_table

GPU = "Fake GPU 80GB"
LAYER = dict(hidden_size=40, latent_dim=16, num_experts=12, top_k=3, expert_ffn_dim=32, num_shared_experts=1,
             shared_ffn_dim=24, activation="situ_glu")
WARP_TILES = ((8, 16), (4, 32))
# the fake timer's: warp at 4 x 32 wins 1 token; at 3 tokens prefill is fastest but wrong (BROKEN),
# so split wins
TIMES = {"1=warp/4x32": 0.1, "3=prefill": 0.05, "3=split": 0.2}
BROKEN = "3=prefill"
TUNED_BUCKETS = [(1, "decode_warp"), (3, "decode"), (None, "prefill")]
DEFAULT_BUCKETS = [(1, "decode"), (4, "decode_warp"), (None, "prefill")]


def spec_of(name: str = "tuned_moe", **changes):
    return spec_from_table({"name": name, "kind": "latent_moe", **LAYER, **changes, "dtype": "float32"},
                           source=f"<test {name}>")


def fake_timer(fn, candidate) -> float:
    return TIMES.get(candidate.options["dispatch"], 1.0)


def buckets(compilation) -> list:
    (choice,) = [op for op in compilation.scheduled.walk() if isinstance(op, k3s.EntryByRowsOp)]
    return choice.buckets()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(the cache folder, the records) of buckets 1 and 3 (float32) of spec_of()'s layer."""
    root = tmp_path_factory.mktemp("k3c_moe_tuning")
    loading = driver.load_module

    def load_breaking_one(path, name):
        """The candidate BROKEN's module returns a wrong output: it must fail its check."""
        module = loading(path, name)
        if "max_rows = [3], by_rows = [@moe_prefill, @moe_prefill]" in module.moe.__doc__:  # BROKEN's table
            moe = module.moe
            module.moe = lambda **arguments: (moe(**arguments)[0] * 1.5,)
        return module

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("K3C_CACHE_DIR", str(root))
        patch.setattr("k3compile.runtime.autotune.moe.gpu_name", lambda: GPU)
        patch.setattr(driver, "load_module", load_breaking_one)
        records = [tune_moe(spec_of(), tokens, "float32", cache=TuneCache(), timer=fake_timer, device="cpu",
                            warp_tiles=WARP_TILES) for tokens in (1, 3)]
    yield root, records


def test_each_bucket_takes_its_fastest_passing_candidate(tuned):
    _, records = tuned
    winners = [r["candidates"][r["winner"]]["options"]["dispatch"] for r in records]
    assert winners == ["1=warp/4x32", "3=split"]
    broken = next(c for c in records[1]["candidates"] if c["options"]["dispatch"] == BROKEN)
    assert broken["status"] == "failed" and "RMS ratio to float64" in broken["detail"], broken
    assert all(c["status"] == "ok" for c in records[0]["candidates"]), records[0]["candidates"]
    assert moe_table(records) == "1=warp/4x32,3=split"


def test_compile_embeds_the_tuned_table(tuned, monkeypatch):
    root, _ = tuned
    monkeypatch.setattr("k3compile.runtime.autotune.compile.gpu_name", lambda: GPU)
    compilation, plan = compile_tuned(spec_of(), cache=TuneCache(root), gpu=GPU)
    assert buckets(compilation) == TUNED_BUCKETS
    assert "moe's dispatch table 1=warp/4x32,3=split" in plan.note
    warp = [op for op in compilation.scheduled.walk() if isinstance(op, k3s.KernelOp)
            and op.sym_name.data == "tuned_moe_decode_warp_token_down"]
    assert [(op.block_n.value.data, op.block_d.value.data) for op in warp] == [(4, 32)]


def test_an_untuned_layer_keeps_the_default_table(tuned, tmp_path):
    root, _ = tuned
    other = spec_of("other_moe", top_k=2)  # other semantics: none of the records
    assert buckets(compile_tuned(other, cache=TuneCache(root), gpu=GPU)[0]) == DEFAULT_BUCKETS
    assert buckets(compile_tuned(spec_of(), cache=TuneCache(tmp_path), gpu=GPU)[0]) == DEFAULT_BUCKETS
    assert buckets(compile_tuned(spec_of(), mode="off", cache=TuneCache(root), gpu=GPU)[0]) == DEFAULT_BUCKETS
    with pytest.raises(TuningError, match="^frozen: no tuned dispatch table for other_moe .*--tokens N"):
        compile_tuned(other, mode="frozen", cache=TuneCache(root), gpu=GPU)


def test_ops_embed_the_tuned_table(tuned, monkeypatch):
    """k3compile.ops' module of the same layer (another name, its own spec) runs the tuned table."""
    root, _ = tuned
    monkeypatch.setenv("K3C_CACHE_DIR", str(root))
    monkeypatch.setattr(layers, "gpu_name", lambda: GPU)
    monkeypatch.setattr(layers, "_LOADED", {})
    assert "max_rows = [1, 3]" in layers.layer_module(MoeKey(**LAYER)).moe.__doc__
    assert "max_rows = [1, 4]" in layers.layer_module(MoeKey(**{**LAYER, "top_k": 2})).moe.__doc__


def test_tune_of_a_moe_layer_takes_tokens(tmp_path, capsys):
    spec = tmp_path / "moe.toml"
    spec.write_text('[layer]\nname = "m"\nkind = "latent_moe"\n'
                    + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in LAYER.items()))
    code, _, err = run_cli(capsys, "tune", str(spec), "--shape", "1,64")
    assert code != 0 and "a latent_moe layer is tuned per --tokens N (its dispatch table), not --shape" in err
