"""k3compile.ops runs the tuning cache's winners: a record that `k3c tune` (here: the tuner's own
API, in Triton's interpreter with a fake timer and GPU name) wrote for a spec of the same layer
— another name, scale and spec dtype — is embedded in the module the ops compile, forward
(TUNED_CHUNK) and backward (TUNED_CHUNK_BACKWARD), and its launches take it in the tuned bucket
and dtype only; gradients still match float64 autograd. Inside k3compile.ops.tuning() a call
tunes its own bucket; outside, nothing is tuned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from autotune_cases import LaunchRecorder
from conftest import RecurrenceShape, assert_rms, recurrence_inputs, recurrence_table

from k3compile.runtime import autotune
from k3compile.runtime.autotune import Choice, TuneCache, search
from k3compile.ops import layers
from k3compile.ops.kda import chunk_kda

GPU = "Fake GPU 80GB"
H, K, V = 1, 16, 32  # V = 32: value blocks of 32 (the heuristic default here) and 16 differ
KEY = layers.LayerKey("kda", H, H, K, V)  # what chunk_kda(q, k, v, g, beta) compiles at these sizes
# the same layer as a user's spec file would give it: other name, scale and (spec) dtype
USER_TABLE = recurrence_table("kda", H=H, K=K, V=V, name="my_kda", scale=0.3, dtype="float16")
FORWARD_SPACE = (Choice("fuse-chunkwise", "block-v", (32, 16), launch_only=True),)
BACKWARD_SPACE = (Choice("lower-backward", "block-v", (32, 16), launch_only=True),)
TUNED_SHAPE, CHECK_SHAPE = (1, 48), (1, 40)  # bucket N*HV<=1, T<=64
REPO = Path(__file__).resolve().parent.parent


def spec_of(table: dict):
    from k3compile.spec import spec_from_table

    return spec_from_table(dict(table), source=f"<test {table['name']}>")


def value_blocks_16_fastest(fn, candidate) -> float:
    """A fake timer: block-v 16 wins."""
    return 0.5 if candidate.options.get("block-v") == 16 else 1.0


@pytest.fixture(scope="module")
def tuned_cache(tmp_path_factory):
    """A cache folder (K3C_CACHE_DIR: the ops' modules and the tuning cache) holding the forward's
    and the backward's records of USER_TABLE's layer for bucket (float32, 1, 64), tuned as `k3c
    tune my_kda.toml --entry both` would; this GPU is GPU, and no module is loaded yet."""
    root = tmp_path_factory.mktemp("k3c_ops_tuning")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("K3C_CACHE_DIR", str(root))
        patch.setattr(layers, "gpu_name", lambda: GPU)
        patch.setattr(layers, "_LOADED", {})  # layers other tests loaded under other caches
        for entry, space in (("chunk", FORWARD_SPACE), ("chunk_backward", BACKWARD_SPACE)):
            result = autotune.tune(spec_of(USER_TABLE), TUNED_SHAPE, "float32", gpu=GPU, timer=value_blocks_16_fastest,
                                   cache=TuneCache(), space=space, check_shape=CHECK_SHAPE, segments=(), entry=entry)
            assert result.winner.options == {"block-v": 16}, (entry, [(c.label, c.status) for c in result.candidates])
        yield root


def recorded(monkeypatch, module, kernel: str) -> LaunchRecorder:
    recorder = LaunchRecorder(getattr(module, f"{KEY.module_name()}_{kernel}_kernel"))
    monkeypatch.setattr(module, f"{KEY.module_name()}_{kernel}_kernel", recorder)
    return recorder


def kda_inputs(T: int, dtype=torch.float32) -> dict:
    return recurrence_inputs("kda", "kv", RecurrenceShape(1, T, H, H, K, V), dtype=dtype)


def test_the_cache_key_is_the_layers_semantics_not_its_name():
    """The ops' layer and a spec of it under any name, scale and spec dtype share a key, forward
    and backward; what changes the kernels (gate form, l2norm, grouped value heads, head dims),
    the input dtype or the bucket does not."""
    ops_spec = layers.layer_spec(KEY)

    def key(spec, shape=TUNED_SHAPE, dtype="float32", entry="chunk"):
        return autotune.key_digest(autotune.key_for(spec, None, shape, dtype, GPU, entry))

    for entry in ("chunk", "chunk_backward"):
        assert key(ops_spec, entry=entry) == key(spec_of(USER_TABLE), entry=entry)
    others = {
        "clamped gate": recurrence_table("kda", H=H, K=K, V=V, name="a", gate_input="clamped"),
        "l2norm": recurrence_table("kda", H=H, K=K, V=V, name="b", qk_l2norm=True),
        "grouped value heads": recurrence_table("kda", H=H, HV=2 * H, K=K, V=V, name="c"),
        "head dim": recurrence_table("kda", H=H, K=K, V=2 * V, name="d"),
        "member": recurrence_table("gla", H=H, K=K, V=V, name="e"),
    }
    different = {what: key(spec_of(table)) for what, table in others.items()}
    different["input dtype"] = key(ops_spec, dtype="bfloat16")
    different["bucket"] = key(ops_spec, shape=(1, 65))
    assert key(ops_spec) not in different.values() and len(set(different.values())) == len(different)


def test_forward_runs_the_tuned_launch_in_its_bucket_and_dtype_only(tuned_cache, monkeypatch):
    from k3compile.frontend import spec_to_module
    from k3compile.ir import reference

    module = layers.layer_module(KEY)
    assert "_tuned_" in Path(module.__file__).name
    assert module.TUNED_CHUNK[("float32", 1, 64)][f"{KEY.module_name()}_chunk_scan"]["BV"] == 16
    scan = recorded(monkeypatch, module, "chunk_scan")
    op = next(iter(spec_to_module(layers.layer_spec(KEY)).ops))
    for T, dtype, value_block in ((37, torch.float32, 16),  # the tuned bucket
                                  (70, torch.float32, 32),  # T <= 128: untuned, the heuristic default
                                  (37, torch.bfloat16, 32)):  # the tuned bucket in another dtype
        inputs = kda_inputs(T, dtype)
        with torch.no_grad():
            o, state = chunk_kda(**inputs, output_final_state=True)
        assert scan.launches[-1]["BV"] == value_block, (T, dtype, scan.launches)
        ref_o, ref_state = reference.recurrence(op, **inputs, output_final_state=True)
        tol = 1e-4 if dtype == torch.float32 else 5e-3  # bf16: fla's (k3c verify's)
        assert_rms(o, ref_o, f"o (T={T})", tol)
        assert_rms(state, ref_state, f"final state (T={T})", tol)


def test_backward_runs_the_tuned_launch_and_its_gradients_match(tuned_cache, monkeypatch):
    from k3compile.frontend import spec_to_module
    from k3compile.checking.verify_backward import draw_cotangents, gradient_tolerance, reference_gradients

    module = layers.layer_module(KEY)
    assert module.TUNED_CHUNK_BACKWARD[("float32", 1, 64)][f"{KEY.module_name()}_backward_gradients"]["BV"] == 16
    gradients = recorded(monkeypatch, module, "backward_gradients")
    op = next(iter(spec_to_module(layers.layer_spec(KEY)).ops))
    for T, dtype, value_block in ((37, torch.float32, 16),  # the tuned bucket
                                  (70, torch.float32, 32),  # untuned: the heuristic default
                                  (37, torch.bfloat16, 32)):  # the tuned bucket in another dtype
        inputs = kda_inputs(T, dtype)
        do, dht = draw_cotangents(op, inputs, True)
        leaves = {name: x.clone().requires_grad_() for name, x in inputs.items()}
        o, state = chunk_kda(**leaves, output_final_state=True)
        ((o * do).sum() + (state * dht).sum()).backward()
        assert gradients.launches[-1]["BV"] == value_block, (T, dtype, gradients.launches)
        ref = reference_gradients(op, inputs, do, dht)
        for name in ("q", "k", "v", "g", "beta"):
            assert_rms(leaves[name].grad, ref[name], f"d{name} (T={T})", gradient_tolerance(f"d{name}", dtype))
        assert_rms(leaves["initial_state"].grad, ref["h0"], f"dh0 (T={T})", gradient_tolerance("dh0", dtype))


def test_no_gpu_or_no_record_keeps_the_untuned_module(tuned_cache, monkeypatch):
    """Without a GPU nothing is looked up; a layer nobody tuned compiles as before, and its first
    call tunes nothing (no record appears)."""
    monkeypatch.setattr(layers, "_LOADED", {})
    monkeypatch.setattr(layers, "gpu_name", lambda: None)
    assert Path(layers.layer_module(KEY).__file__).stem == KEY.module_name()
    monkeypatch.setattr(layers, "gpu_name", lambda: GPU)
    untuned = layers.LayerKey("kda", H, H, K, 16)
    with torch.no_grad():
        chunk_kda(**recurrence_inputs("kda", "kv", RecurrenceShape(1, 20, H, H, K, 16)))
    assert Path(layers.layer_module(untuned).__file__).stem == untuned.module_name()
    assert layers.tuned_records(layers.layer_spec(untuned)) == (GPU, {})


def test_a_call_inside_tuning_tunes_its_bucket_forward_and_backward(tuned_cache, monkeypatch):
    """k3compile.ops.tuning(): a training call on an untuned layer tunes its forward and its
    backward for the call's bucket (the built-in spaces stand in for the small ones here), and
    runs with the winners; a call after the block finds them cached."""
    from k3compile.ops import tuning

    monkeypatch.setattr(layers, "_LOADED", {})
    monkeypatch.setattr(search, "SEARCH_SPACE", FORWARD_SPACE)
    monkeypatch.setattr(search, "BACKWARD_SEARCH_SPACE", BACKWARD_SPACE)
    monkeypatch.setattr(search, "time_candidate", value_blocks_16_fastest)
    monkeypatch.setattr(search, "DEFAULT_CHECK_SHAPE", CHECK_SHAPE)
    monkeypatch.setattr(search, "SEGMENTS", ())
    key = layers.LayerKey("kda", H, H, K, V, qk_l2norm=True)
    inputs = {name: x.requires_grad_() for name, x in kda_inputs(37).items()}
    with tuning():
        o, _ = chunk_kda(**inputs, use_qk_l2norm_in_kernel=True)
    o.sum().backward()
    records = layers.tuned_records(layers.layer_spec(key))[1]
    assert {entry: len(found) for entry, found in records.items()} == {"chunk": 1, "chunk_backward": 1}
    module = layers.layer_module(key)
    assert module.TUNED_CHUNK[("float32", 1, 64)][f"{key.module_name()}_chunk_scan"]["BV"] == 16
    assert module.TUNED_CHUNK_BACKWARD[("float32", 1, 64)][f"{key.module_name()}_backward_gradients"]["BV"] == 16
    with tuning(), torch.no_grad():  # the same bucket: cached (a new record would load another module)
        chunk_kda(**kda_inputs(40), use_qk_l2norm_in_kernel=True)
    assert layers.layer_module(key) is module


WARM_PROCESS = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from k3compile.runtime.autotune import compile as embedding
    from k3compile.ops import chunk_kda, layers
    layers.gpu_name = lambda: sys.argv[1]
    layers.compiler_fingerprint = lambda: sys.argv[2]
    embedding.k3compile_version = lambda: sys.argv[3]
    q, k = torch.nn.functional.normalize(torch.randn(2, 1, 37, 1, 16), dim=-1)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 37, 1, 16))
    with torch.no_grad():
        chunk_kda(q, k, torch.randn(1, 37, 1, 32), g, torch.rand(1, 37, 1))
    module = layers.layer_module(layers.LayerKey("kda", 1, 1, 16, 32))
    print("xdsl" in sys.modules, os.path.basename(module.__file__), sorted(module.TUNED_CHUNK))
""")


def test_a_warm_process_loads_the_tuned_module_without_xdsl(tuned_cache):
    """Finding a layer's records needs no xDSL: a second process with the cache imports the
    tuned module from disk as it imports an untuned one."""
    from k3compile.runtime.autotune.cache import k3compile_version

    compiled = Path(layers.layer_module(KEY).__file__).name
    env = {**os.environ, "K3C_CACHE_DIR": str(tuned_cache)}
    # this process's hashes of the compiler's source (the module's name, the records' key): the
    # tree may change under a long run, and what is tested here is the load, not the hashes
    versions = [layers.compiler_fingerprint(), k3compile_version()]
    result = subprocess.run([sys.executable, "-c", WARM_PROCESS, GPU, *versions], env=env, capture_output=True,
                            text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split(None, 2) == ["False", compiled, "[('float32', 1, 64)]\n"], result.stdout
