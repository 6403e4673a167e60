"""The autotuner (k3compile.runtime.autotune, `k3c tune`, `k3c compile --frozen/--no-autotune`) on the CPU.

The search runs for real in Triton's interpreter (compile, NaN-poisoned check against the float64
reference, the all-written check at the target shape); only the timer and the GPU name are fakes.
Tiny layers and search spaces keep it fast. The search space, buckets, cache keys and the tunes
that need no shared record are in test_autotune_search.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from autotune_cases import (CHECK, DEFAULT_STAGES, DEFAULT_WARPS, GPU, SHAPE, SMALL_SPACE, SPACE, FakeTimer,
                            LaunchRecorder, fake_gpu, spec_of, write_spec)
from conftest import RecurrenceShape, one_line, recurrence_inputs, recurrence_table, run_cli
from k3compile.runtime import autotune
from k3compile.runtime.autotune import Choice, TuneCache, measure, search


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One real tune (interpreter, fake timer) into a fresh cache, shared by the tests below."""
    cache = TuneCache(tmp_path_factory.mktemp("k3c-cache"))
    timer = FakeTimer()
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=timer, cache=cache, space=SPACE,
                           check_shape=CHECK)
    return cache, result, timer


# --- tuning ---------------------------------------------------------------------------------


def test_tune_checks_times_and_picks_the_fastest(tuned):
    _, result, timer = tuned
    assert not result.cached and result.timed == timer.calls > 0
    cands = result.candidates
    assert len(cands) == 8 and cands[0].options == {"chunk-size": 64, "num-warps": 8, "block-v": 32}
    assert all(c.status == "ok" for c in cands), [(c.label, c.status, c.detail) for c in cands]
    assert result.winner.options == {"chunk-size": 64, "num-warps": 4, "block-v": 16}
    assert result.winner.launch["tuned_chunk_scan"] == {"BV": 16, "num_warps": 4, "num_stages": DEFAULT_STAGES}
    # chunk size changes kernel code, num-warps and block-v do not (launch-only, as declared)
    hashes = {c.options["chunk-size"]: c.code_hash for c in cands}
    assert all(c.code_hash == hashes[c.options["chunk-size"]] for c in cands) and len(set(hashes.values())) == 2
    assert result.path.is_file() and json.loads(result.path.read_text())["winner"] == result.winner.index


def test_second_tune_hits_the_cache_without_timing_or_compiling(tuned, monkeypatch):
    cache, first, _ = tuned
    timer = FakeTimer()

    def no_compiling(*args, **kwargs):
        raise AssertionError("a cached tune compiled something")

    monkeypatch.setattr("k3compile.driver.lower", no_compiling)
    again = autotune.tune(spec_of(), (1, 33), "float32", gpu=GPU, timer=timer, cache=cache, space=SPACE,
                          check_shape=CHECK)  # another T in the same bucket
    assert again.cached and again.timed == 0 and timer.calls == 0
    assert again.winner.options == first.winner.options


# --- compiling with the tuned configs ---------------------------------------------------------


def test_compiled_module_embeds_and_uses_the_tuned_launch(tuned, capsys, tmp_path, monkeypatch):
    from k3compile.ir import reference

    from k3compile.driver import load_module
    from k3compile.frontend import spec_to_module

    cache, _, _ = tuned
    spec_path = write_spec(tmp_path / "tuned.toml")
    code, out, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "out", "--frozen", "--gpu", GPU,
                             "--cache-dir", cache.root.parent)
    assert code == 0, err
    source = Path(out.strip()).read_text()
    assert "TUNED_CHUNK = {" in source and f"Autotuned (k3c tune) on '{GPU}'" in source
    assert "('float32', 1, 64): {" in source and "'num_warps': 4" in source
    module = load_module(Path(out.strip()), "tuned_embedded")
    assert module.TUNED_CHUNK[("float32", 1, 64)]["tuned_chunk_scan"] == {"BV": 16, "num_stages": DEFAULT_STAGES, "num_warps": 4}
    scan = LaunchRecorder(module.tuned_chunk_scan_kernel)
    monkeypatch.setattr(module, "tuned_chunk_scan_kernel", scan)
    op = next(iter(spec_to_module(spec_of()).ops))
    for T, expected in ((37, {"BV": 16, "num_warps": 4, "num_stages": DEFAULT_STAGES}),  # the tuned bucket (T <= 64)
                        (70, {"BV": 32, "num_warps": DEFAULT_WARPS, "num_stages": DEFAULT_STAGES})):  # not tuned: the default
        inputs = recurrence_inputs("kda", "kv", RecurrenceShape(1, T, 1, 1, 16, 32))
        o, state = module.chunk(**inputs, output_final_state=True)
        launch = scan.launches[-1]
        assert {k: launch[k] for k in expected} == expected, (T, launch)
        assert launch["grid"][0] == 32 // expected["BV"]
        ref_o, ref_state = reference.recurrence(op, **inputs, output_final_state=True)
        from conftest import assert_rms

        assert_rms(o, ref_o, f"o (T={T})", 1e-4)
        assert_rms(state, ref_state, f"state (T={T})", 1e-4)


def test_no_autotune_is_the_untuned_module(tuned, capsys, tmp_path):
    cache, _, _ = tuned
    spec_path = write_spec(tmp_path / "tuned.toml")
    code, out, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "a", "--no-autotune", "--gpu", GPU,
                             "--cache-dir", cache.root.parent)
    assert code == 0 and err == ""
    plain = Path(out.strip()).read_text()
    code, out, _ = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "b")
    assert "TUNED_CHUNK" not in plain and Path(out.strip()).read_text() == plain


def test_frozen_fails_in_one_line_naming_what_is_missing(capsys, tmp_path):
    spec_path = write_spec(tmp_path / "tuned.toml")
    empty = tmp_path / "empty-cache"
    code, out, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "out", "--frozen", "--gpu", GPU,
                             "--cache-dir", empty, "--shape", "2,5000", "--dtype", "float32")
    assert code == 2 and out == "" and one_line(err), err
    for word in ("frozen", "tuned", str(spec_path), "N*HV<=2 T<=8192", "float32", f"GPU '{GPU}'", "k3c tune"):
        assert word in err, (word, err)
    code, out, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "out", "--frozen", "--gpu", GPU,
                             "--cache-dir", empty)
    assert code == 2 and one_line(err) and "any bucket" in err and GPU in err
    assert not (tmp_path / "out").exists()


def test_frozen_without_a_gpu_fails_cleanly(capsys, tmp_path, monkeypatch):
    fake_gpu(monkeypatch, None)
    code, _, err = run_cli(capsys, "compile", write_spec(tmp_path / "tuned.toml"), "-o", tmp_path / "out", "--frozen",
                           "--cache-dir", tmp_path / "c")
    assert code == 2 and one_line(err) and "no GPU" in err
    code, _, err = run_cli(capsys, "tune", write_spec(tmp_path / "tuned.toml"), "--shape", "1,64",
                           "--cache-dir", tmp_path / "c")
    assert code == 2 and one_line(err) and "no CUDA GPU" in err
    code, _, err = run_cli(capsys, "tune", write_spec(tmp_path / "tuned.toml"), "--shape", "1,x")
    assert code == 2 and "B,T" in err


def test_cli_tune_prints_the_table_then_hits_the_cache(capsys, tmp_path, monkeypatch):
    timer = FakeTimer({"num-warps": 4})
    fake_gpu(monkeypatch, GPU)
    monkeypatch.setattr(search, "time_candidate", timer)  # tune looks these three up in search.py
    monkeypatch.setattr(search, "SEARCH_SPACE", SMALL_SPACE)
    monkeypatch.setattr(search, "DEFAULT_CHECK_SHAPE", CHECK)
    spec_path = write_spec(tmp_path / "tuned.toml")
    args = ("tune", spec_path, "--shape", "1,48", "--dtype", "float32", "--cache-dir", tmp_path / "cache")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "k3c tune tuned B,T=1,48 float32" in out and "num-warps" in out and "block-v" in out
    assert "winner: num-warps=4" in out and "tuned in" in out and timer.calls == 4 + len(autotune.SEGMENTS)
    assert "segments (chunk(..., segments='auto') uses P=1 here): P=1 " in out  # the fake timer ties: P = 1
    code, out, err = run_cli(capsys, *args[:3], "1,64", *args[4:])
    assert code == 0 and "(cached)" in out and "0 s of tuning, nothing timed" in out
    assert timer.calls == 4 + len(autotune.SEGMENTS)
    # a compile on this "GPU" now embeds the winner without being told the shape
    code, out, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "out", "--cache-dir", tmp_path / "cache")
    assert code == 0 and "tuned configs for 1 bucket(s)" in err
    assert "'num_warps': 4" in Path(out.strip()).read_text()


@pytest.mark.parametrize("kind", ["kda", "gated_deltanet", "deltanet", "gla"])
def test_launch_only_choices_do_not_change_kernel_code(kind):
    """What SEARCH_SPACE declares launch-only must leave the @triton.jit code alone: one module
    then serves all its values. (Code choices get a module each even where the @triton.jit code
    happens to be equal, as for gla's chunk sizes: the host code differs.)"""
    from k3compile.driver import lower

    spec = spec_of(recurrence_table(kind, H=2, K=16, V=48, name=f"space_{kind}"))
    hashes: dict[tuple, set] = {}
    for cand in autotune.candidates(autotune.base_pipeline(spec, None)):
        source = lower(spec, cand.pipeline, launch_tables={"chunk": {}}).source
        hashes.setdefault(tuple(sorted(cand.code_options.items())), set()).add(autotune.kernel_code_hash(source))
    code_choices = math.prod(len(c.values) for c in autotune.SEARCH_SPACE if not c.launch_only)
    assert len(hashes) == code_choices and all(len(h) == 1 for h in hashes.values()), hashes


COMPILED_CANDIDATES: dict[tuple[str, str], tuple] = {}  # (spec, pipeline) -> (code hash, launch)


def synthetic_record(spec, shape, ms_of, gpu=GPU):
    """A cache record as tune writes it, with made-up times: ms_of(candidate) -> ms or None (failed).
    Each candidate is compiled once per spec (the records of several shapes share them)."""
    from k3compile.driver import lower

    cands = autotune.candidates(autotune.base_pipeline(spec, None), SPACE)
    for c in cands:
        key = (f"{spec.source} {sorted(spec.params.items())}", c.pipeline)
        if key not in COMPILED_CANDIDATES:
            compilation = lower(spec, c.pipeline, launch_tables={"chunk": {}})
            COMPILED_CANDIDATES[key] = autotune.kernel_code_hash(compilation.source), autotune.launch_configs(compilation)
        c.code_hash, c.launch = COMPILED_CANDIDATES[key]
        ms = ms_of(c)
        c.status, c.ms = ("ok", ms) if ms is not None else ("wrong", math.inf)
    ok = [c for c in cands if c.status == "ok"]
    return {"key": autotune.key_for(spec, None, shape, "float32", gpu), "pipeline": autotune.base_pipeline(spec, None),
            "space": [{"pass": c.pass_name, "option": c.option, "values": list(c.values), "launch_only": c.launch_only}
                      for c in SPACE],
            "candidates": [c.to_json() for c in cands], "default": 0,
            "winner": min(ok, key=lambda c: c.ms).index if ok else None}


def test_module_takes_one_chunk_size_and_the_launch_winners_of_its_code(tmp_path):
    """Bucket A: C32 wins by 10%; bucket B: C64 wins by 2x. The module takes C64 (least
    geometric-mean slowdown) and, in bucket A, the best launch among the C64 candidates."""
    spec = spec_of()
    cache = TuneCache(tmp_path)

    def bucket_a(c):
        return (0.9 if c.options["chunk-size"] == 32 else 1.0) - 0.1 * (c.options["num-warps"] == 4)

    def bucket_b(c):
        return (2.0 if c.options["chunk-size"] == 32 else 1.0) - 0.1 * (c.options["block-v"] == 16)

    cache.put(synthetic_record(spec, (1, 1000), bucket_a))
    cache.put(synthetic_record(spec, (4, 100), bucket_b))
    cache.put(synthetic_record(spec, (1, 1000), bucket_b, gpu="Another GPU"))  # not this GPU: ignored
    compilation, plan = autotune.compile_tuned(spec, gpu=GPU, cache=cache)
    assert "chunk-size=64" in plan.pipeline and not plan.messages
    table = plan.launch_tables["chunk"]
    assert table[("float32", 1, 1024)]["tuned_chunk_scan"] == {"BV": 32, "num_warps": 4, "num_stages": DEFAULT_STAGES}
    assert table[("float32", 4, 128)]["tuned_chunk_scan"] == {"BV": 16, "num_warps": 8, "num_stages": DEFAULT_STAGES}
    assert "chunk-size=64" in compilation.source and "TUNED_CHUNK = {" in compilation.source
    # asking for one bucket embeds only that one
    _, plan = autotune.compile_tuned(spec, gpu=GPU, cache=cache, shapes=[(1, 600)], dtypes=["float32"])
    assert list(plan.launch_tables["chunk"]) == [("float32", 1, 1024)]
    # a bucket where nothing passed: not in the table, said so
    cache.put(synthetic_record(spec, (1, 5000), lambda c: None))
    _, plan = autotune.compile_tuned(spec, gpu=GPU, cache=cache)
    assert ("float32", 1, 8192) not in plan.launch_tables["chunk"] and "chunk-size=64" in plan.pipeline
    assert any("heuristic default there" in m and "T<=8192" in m for m in plan.messages)
    # a bucket where only C32 passes: C64 would be wrong there, so the module takes C32
    cache.put(synthetic_record(spec, (2, 5000), lambda c: 1.0 if c.options["chunk-size"] == 32 else None))
    _, plan = autotune.compile_tuned(spec, gpu=GPU, cache=cache)
    assert "chunk-size=32" in plan.pipeline and len(plan.launch_tables["chunk"]) == 3


FAKE_MODULE = '''
POISON_OUTPUTS = True
TUNED_CHUNK = {}


class Kernel:
    def __init__(self):
        self.warmups, self.launches = [], 0

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((grid, kwargs["num_warps"]))

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
        return launch


fake_scan_kernel = Kernel()


def chunk(x, output_final_state=False):
    launch = TUNED_CHUNK.get(None)["fake_scan"]
    fake_scan_kernel[(x,)](x, num_warps=launch["num_warps"])
    if x == 2:
        raise RuntimeError("a launch that fails")
    return None, None
'''


def test_precompile_warms_every_candidate_up_without_launching():
    """The GPU-only parallel precompile (exercised here with a stand-in kernel): every candidate's
    launches become warmups, nothing runs, failures are left for the real run, and the module's
    kernels and POISON_OUTPUTS are restored."""
    import types

    module = types.ModuleType("fake_tuned_module")
    exec(FAKE_MODULE, module.__dict__)  # noqa: S102 - the stand-in module's source, above
    kernel = module.fake_scan_kernel
    group = [autotune.Candidate(i, {"num-warps": w}, "", {}, launch={"fake_scan": {"num_warps": w}})
             for i, w in enumerate((8, 4))]
    autotune.precompile([(module, group)], "chunk", [{"x": 1}, {"x": 2}], jobs=2)
    assert sorted(kernel.warmups) == [((1,), 4), ((1,), 8), ((2,), 4), ((2,), 8)]
    assert kernel.launches == 0 and module.fake_scan_kernel is kernel and module.POISON_OUTPUTS is True


# --- the backward entry (k3c tune --entry chunk_backward) ------------------------------------

# one kernel code, three launches of its value blocks; block-v 8 is made wrong below
BACKWARD_SPACE = (Choice("lower-backward", "block-v", (32, 16, 8), launch_only=True),)


class BackwardTimer(FakeTimer):
    """block-v 8 fastest (it is made wrong), then 16, then 32."""

    def __call__(self, fn, candidate) -> float:
        self.calls += 1
        return {32: 1.0, 16: 0.7, 8: 0.1}[candidate.options["block-v"]]


@pytest.fixture(scope="module")
def tuned_backward(tmp_path_factory):
    """One real tune of chunk_backward (interpreter, fake timer) into a fresh cache; the candidate
    the timer calls fastest returns a dk off by noise, as a wrong schedule would."""
    real = measure.run_backward

    def run_backward(module, inputs, candidate, entry_name="chunk_backward", **options):
        grads = real(module, inputs, candidate, entry_name, **options)
        if candidate.options["block-v"] == 8:
            grads["dk"] = grads["dk"] + 0.1 * torch.randn_like(grads["dk"])
        return grads

    cache = TuneCache(tmp_path_factory.mktemp("k3c-cache-backward"))
    timer = BackwardTimer()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure, "run_backward", run_backward)
        result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=timer, cache=cache, space=BACKWARD_SPACE,
                               check_shape=CHECK, entry="chunk_backward")
    return cache, result, timer


def test_backward_space_starts_at_the_pass_defaults_and_leaves_the_forward_out(monkeypatch):
    """Every pass default is among the backward's values and candidate 0 takes them all (the
    heuristic default), also when a pass's default is not the table's first value."""
    from k3compile.passes import PASSES

    defaults = {c.option: getattr(PASSES[c.pass_name](), c.option.replace("-", "_")) for c in autotune.BACKWARD_SEARCH_SPACE}
    assert all(defaults[c.option] in c.values for c in autotune.BACKWARD_SEARCH_SPACE), defaults
    assert len(defaults) == len(autotune.BACKWARD_SEARCH_SPACE)
    found = autotune.candidates(autotune.base_pipeline(spec_of(), None), entry="chunk_backward")
    assert len(found) == math.prod(len(c.values) for c in autotune.BACKWARD_SEARCH_SPACE)
    assert found[0].options == defaults
    monkeypatch.setattr(PASSES["lower-backward"](), "block_v", 32)  # a default changed before the table
    assert autotune.candidates(autotune.base_pipeline(spec_of(), None), entry="chunk_backward")[0].options == \
        {**defaults, "block-v": 32}
    # the backward saves nothing of the forward's: its candidates compile without the forward's passes
    assert [name for name, _ in autotune.split_pipeline(found[0].pipeline)] == \
        ["derive-backward", "lower-backward", "outline-kernels"]
    given = autotune.candidates("derive-chunkwise,derive-backward{chunk-size=32},lower-backward{num-warps=2}",
                                entry="chunk_backward")
    assert {(c.options["chunk-size"], c.options["num-warps"]) for c in given} == {(32, 2)}
    assert autotune.candidates("derive-chunkwise,fuse-chunkwise", entry="chunk_backward") == []


def test_backward_launch_only_choices_do_not_change_kernel_code():
    """What BACKWARD_SEARCH_SPACE declares launch-only leaves the @triton.jit code alone (at the
    default code choices and at the other extreme)."""
    from k3compile.driver import lower

    spec = spec_of(recurrence_table("kda", H=1, K=16, V=32, name="space_backward"))
    found = autotune.candidates(autotune.base_pipeline(spec, None), entry="chunk_backward")
    launches = len(found) // math.prod(len(c.values) for c in autotune.BACKWARD_SEARCH_SPACE if not c.launch_only)
    assert found[0].code_options == found[launches - 1].code_options != found[-1].code_options
    hashes: dict[tuple, set] = {}
    for cand in (found[0], found[launches - 1], found[-launches], found[-1]):  # each code's first and last launch
        source = lower(spec, cand.pipeline, launch_tables={"chunk_backward": {}}).source
        hashes.setdefault(tuple(sorted(cand.code_options.items())), set()).add(autotune.kernel_code_hash(source))
    assert len(hashes) == 2 and all(len(h) == 1 for h in hashes.values()), hashes


def test_backward_tune_checks_gradients_and_picks_the_fastest(tuned_backward):
    """The fake timer's fastest candidate (block-v 8) returns a wrong dk: it is rejected with its
    reason and never timed; the fastest that passed (block-v 16) wins and is cached as the
    backward's record, next to (not over) the forward's of the bucket."""
    _, result, timer = tuned_backward
    by_bv = {c.options["block-v"]: c for c in result.candidates}
    assert by_bv[8].status == "wrong" and by_bv[8].detail.startswith("dk: RMS ratio") and math.isinf(by_bv[8].ms)
    assert by_bv[32].status == by_bv[16].status == "ok", [(c.label, c.status, c.detail) for c in result.candidates]
    assert result.entry == "chunk_backward" and result.winner.options == {"block-v": 16}
    assert timer.calls == result.timed == 2 and result.record["segments"] is None
    assert result.winner.launch["tuned_backward_gradients"]["BV"] == 16
    assert result.winner.launch["tuned_backward_state_scan"]["BV"] == 16
    assert len({c.code_hash for c in result.candidates}) == 1
    record = json.loads(result.path.read_text())
    assert record["key"]["entry"] == "chunk_backward" and record["winner"] == result.winner.index
    forward_key = autotune.key_for(spec_of(), None, SHAPE, "float32", GPU)
    assert "entry" not in forward_key and autotune.key_digest(forward_key) != autotune.key_digest(record["key"])
    assert forward_key == {k: v for k, v in record["key"].items() if k != "entry"}


def test_second_backward_tune_hits_the_cache_without_compiling(tuned_backward, monkeypatch, capsys, tmp_path):
    cache, first, _ = tuned_backward
    timer = BackwardTimer()

    def no_compiling(*args, **kwargs):
        raise AssertionError("a cached tune compiled something")

    monkeypatch.setattr("k3compile.driver.lower", no_compiling)
    again = autotune.tune(spec_of(), (1, 33), "float32", gpu=GPU, timer=timer, cache=cache, space=BACKWARD_SPACE,
                          check_shape=CHECK, entry="chunk_backward")
    assert again.cached and again.timed == 0 and timer.calls == 0
    assert again.winner.options == first.winner.options
    # the same through `k3c tune --entry chunk_backward`
    fake_gpu(monkeypatch, GPU)
    monkeypatch.setattr(search, "BACKWARD_SEARCH_SPACE", BACKWARD_SPACE)
    code, out, err = run_cli(capsys, "tune", write_spec(tmp_path / "tuned.toml"), "--shape", "1,64", "--dtype",
                             "float32", "--entry", "chunk_backward", "--cache-dir", cache.root.parent)
    assert code == 0, err
    assert "k3c tune tuned chunk_backward B,T=1,64 float32" in out and "(cached)" in out
    assert "winner: block-v=16" in out and "0 s of tuning, nothing timed" in out


def test_compiled_module_uses_the_tuned_backward_and_its_gradients_match(tuned_backward, tuned, monkeypatch, tmp_path):
    """The cache's backward record (and the forward's, side by side) embedded: chunk_backward's
    launches in the tuned bucket take block-v 16 from TUNED_CHUNK_BACKWARD, and without the table
    the heuristic default (32); the tuned gradients equal the default's and float64's."""
    from conftest import assert_rms

    from k3compile.driver import load_module
    from k3compile.frontend import spec_to_module
    from k3compile.checking.verify_backward import draw_cotangents, reference_gradients

    cache, _, _ = tuned_backward
    forward_cache, _, _ = tuned
    cache.put(forward_cache.get(autotune.key_for(spec_of(), None, SHAPE, "float32", GPU)))  # the forward's record
    compilation, plan = autotune.compile_tuned(spec_of(), gpu=GPU, cache=cache)
    assert set(plan.launch_tables) == {"chunk", "chunk_backward"} and not plan.messages
    assert plan.launch_tables["chunk_backward"][("float32", 1, 64)]["tuned_backward_gradients"]["BV"] == 16
    assert "chunk-size=64" in plan.pipeline  # the forward's tuned code choice stays
    (tmp_path / "tuned.py").write_text(compilation.source)
    module = load_module(tmp_path / "tuned.py", "tuned_backward_module")
    assert module.TUNED_CHUNK and module.TUNED_CHUNK_BACKWARD
    gradients = LaunchRecorder(module.tuned_backward_gradients_kernel)
    monkeypatch.setattr(module, "tuned_backward_gradients_kernel", gradients)
    op = next(iter(spec_to_module(spec_of()).ops))
    inputs = recurrence_inputs("kda", "kv", RecurrenceShape(1, 37, 1, 1, 16, 32))  # the tuned bucket (T <= 64)
    do, dht = draw_cotangents(op, inputs, True)
    tuned_grads = module.chunk_backward(**inputs, do=do, dht=dht, output_dh0=True)
    assert gradients.launches[-1]["BV"] == 16, gradients.launches
    monkeypatch.setattr(module, "TUNED_CHUNK_BACKWARD", {})  # as an untuned bucket: the printed default
    default_grads = module.chunk_backward(**inputs, do=do, dht=dht, output_dh0=True)
    assert gradients.launches[-1]["BV"] == 32, gradients.launches
    ref = reference_gradients(op, inputs, do, dht)
    for name, ours, theirs in zip(("q", "k", "v", "g", "beta", "h0"), tuned_grads, default_grads, strict=True):
        assert_rms(ours, theirs.double(), f"d{name}: tuned against the default", 1e-5)
        assert_rms(ours, ref[name], f"d{name}: tuned against float64", 1e-4)


def test_saving_entries_read_the_tuned_entries_tables(tuned_backward, tmp_path, monkeypatch):
    """save-forward-values' chunk_backward_saved launches chunk_backward's kernels: it reads the
    same tuned table (block-v 16 in the tuned bucket, not the printed default 32)."""
    from k3compile.driver import load_module
    from k3compile.ops.autograd import saved_names

    shared, _, _ = tuned_backward
    cache = TuneCache(tmp_path / "cache")  # the backward's record alone (another test adds the forward's)
    cache.put(shared.get(autotune.key_for(spec_of(), None, SHAPE, "float32", GPU, "chunk_backward")))
    compilation, plan = autotune.compile_tuned(spec_of(), gpu=GPU, cache=cache)
    (tmp_path / "saved.py").write_text(compilation.source)
    module = load_module(tmp_path / "saved.py", "tuned_saved_module")
    bucket = next(iter(module.TUNED_CHUNK_BACKWARD))
    assert module.TUNED_CHUNK_BACKWARD_SAVED[bucket]["tuned_backward_gradients_saved"] == \
        module.TUNED_CHUNK_BACKWARD[bucket]["tuned_backward_gradients"]
    gradients = LaunchRecorder(module.tuned_backward_gradients_kernel)
    monkeypatch.setattr(module, "tuned_backward_gradients_kernel", gradients)
    inputs = recurrence_inputs("kda", "kv", RecurrenceShape(1, 37, 1, 1, 16, 32))
    o, final, *saved = module.chunk_saving(**inputs, output_final_state=True)
    module.chunk_backward_saved(**inputs, do=torch.randn_like(o), dht=torch.randn_like(final), output_dh0=True,
                                **dict(zip(saved_names(module), saved, strict=True)))
    assert gradients.launches[-1]["BV"] == 16, gradients.launches


def test_code_choices_that_make_the_same_module_are_timed_once(tmp_path):
    """GLA shares nothing with its scans, so scan-values=spill prints the module of recompute:
    the second candidate is "same as #0" (not checked, not timed) instead of a second module."""
    spec = spec_of(recurrence_table("gla", H=1, K=16, V=32, name="tuned_gla"))
    space = (Choice("lower-backward", "scan-values", ("recompute", "spill"), launch_only=False),)
    timer = FakeTimer()
    result = autotune.tune(spec, SHAPE, "float32", gpu=GPU, timer=timer, cache=TuneCache(tmp_path), space=space,
                           check_shape=CHECK, entry="chunk_backward")
    first, second = result.candidates
    assert first.status == "ok" and result.winner.index == 0 and timer.calls == 1
    assert second.status == "same as #0" and second.detail == "same generated module and launch config"
    assert first.code_options != second.code_options and first.code_hash == second.code_hash
