"""The autotuner's search on the CPU (k3compile.runtime.autotune): the space, the buckets and the
cache keys, and tunes of their own (a wrong candidate never wins, the segments stage, the grouping,
a register cap, candidates that fail to compile). The search runs for real in Triton's
interpreter; only the timer and the GPU name are fakes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autotune_cases import (CHECK, GPU, SHAPE, SMALL_SPACE, FakeTimer, LaunchRecorder, fake_gpu, spec_of,
                            write_spec)
from conftest import RecurrenceShape, recurrence_inputs, recurrence_table, run_cli
from k3compile.runtime import autotune
from k3compile.runtime.autotune import Bucket, Choice, TuneCache, measure


# --- the search space and buckets -----------------------------------------------------------


def test_search_space_starts_at_the_pass_defaults():
    """The first value of every choice is the pass's default: the heuristic default is always
    a candidate (index 0), and --no-autotune compiles exactly it."""
    from k3compile.passes import PASSES

    for choice in autotune.SEARCH_SPACE:
        pass_type = PASSES[choice.pass_name]()
        field = choice.option.replace("-", "_")
        assert getattr(pass_type, field) == choice.values[0], choice
    options = [c.option for c in autotune.SEARCH_SPACE]
    assert len(options) == len(set(options))
    first = autotune.candidates("lower-recurrent,derive-chunkwise,fuse-chunkwise")[0]
    assert first.options == {c.option: c.values[0] for c in autotune.SEARCH_SPACE}


def test_candidates_keep_options_the_pipeline_sets():
    found = autotune.candidates("lower-recurrent,derive-chunkwise{chunk-size=32},fuse-chunkwise{num-warps=4}")
    sizes = [len(c.values) for c in autotune.SEARCH_SPACE if c.option not in ("chunk-size", "num-warps")]
    assert len(found) == math.prod(sizes)
    assert {c.options["chunk-size"] for c in found} == {32}
    assert {c.options["num-warps"] for c in found} == {4}
    assert all("derive-chunkwise{chunk-size=32}" in c.pipeline for c in found)
    assert autotune.candidates("lower-recurrent") == []
    assert [name for name, _ in autotune.split_pipeline(found[0].pipeline)] == ["lower-recurrent", "derive-chunkwise", "fuse-chunkwise"]


def test_buckets_are_powers_of_two_and_match_the_module(compile_layer):
    assert [autotune.bucket(n) for n in (1, 2, 3, 4, 5, 4096, 4097)] == [1, 2, 4, 4, 8, 4096, 8192]
    assert Bucket.of(1, 3000, 96) == Bucket.of(1, 4096, 96) == Bucket(128, 4096)
    assert Bucket.of(3, 100, 2) == Bucket.of(4, 128, 2) != Bucket.of(5, 128, 2)
    module = compile_layer(**recurrence_table("kda", H=1, K=8, V=8, name="bucket")).module
    assert all(module._bucket(n) == autotune.bucket(n) for n in range(0, 5000, 7))


def test_cache_key_changes_with_schedule_bucket_dtype_gpu_versions(monkeypatch):
    spec = spec_of()
    base = autotune.key_for(spec, None, (2, 3000), "bfloat16", GPU)
    digest = autotune.key_digest
    same = [
        autotune.key_for(spec, None, (2, 4096), "bfloat16", GPU),  # T inside the bucket
        autotune.key_for(spec, None, (2, 2049), "bfloat16", GPU),
    ]
    assert all(digest(k) == digest(base) for k in same)
    other_spec = spec_of(recurrence_table("kda", H=1, K=16, V=64, name="tuned"))
    changed = {
        "layer IR": autotune.key_for(other_spec, None, (2, 3000), "bfloat16", GPU),
        "pipeline": autotune.key_for(spec, "lower-recurrent,derive-chunkwise,fuse-chunkwise", (2, 3000), "bfloat16", GPU),
        "tokens bucket": autotune.key_for(spec, None, (2, 4097), "bfloat16", GPU),
        "heads bucket": autotune.key_for(spec, None, (3, 3000), "bfloat16", GPU),
        "dtype": autotune.key_for(spec, None, (2, 3000), "float32", GPU),
        "GPU": autotune.key_for(spec, None, (2, 3000), "bfloat16", "NVIDIA H200"),
    }
    monkeypatch.setattr("k3compile.runtime.autotune.cache.triton_version", lambda: "99.0.0")
    changed["triton"] = autotune.key_for(spec, None, (2, 3000), "bfloat16", GPU)
    monkeypatch.undo()
    monkeypatch.setattr("k3compile.runtime.autotune.cache.k3compile_version", lambda: "9.9.9+src.0")
    changed["k3compile"] = autotune.key_for(spec, None, (2, 3000), "bfloat16", GPU)
    for what, key in changed.items():
        assert digest(key) != digest(base), what
    assert len({digest(k) for k in changed.values()}) == len(changed)


def test_cache_writes_are_atomic_and_unreadable_records_are_misses(tmp_path):
    cache = TuneCache(tmp_path)
    key = autotune.key_for(spec_of(), None, SHAPE, "float32", GPU)
    path = cache.put({"key": key, "candidates": [], "winner": None})
    assert cache.get(key)["winner"] is None
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    path.write_text("{ half a rec")
    assert cache.get(key) is None


def test_cache_root_from_env_and_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("K3C_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert autotune.cache_root() == tmp_path / "xdg" / "k3compile"
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "env"))
    assert TuneCache().root == tmp_path / "env" / "autotune"
    assert TuneCache(tmp_path / "flag").root == tmp_path / "flag" / "autotune"



def test_a_wrong_candidate_can_never_win(tmp_path, monkeypatch):
    """Candidates made to return garbage, leave outputs unwritten (NaN) or fail to launch are
    timed fastest by the fake timer, yet score infinity and are reported."""
    real = measure.run_entry
    sabotage = {(4, 16): "garbage", (4, 32): "unwritten", (8, 16): "raise"}

    def run_entry(module, inputs, candidate, entry_name="chunk", **options):
        o, state = real(module, inputs, candidate, entry_name, **options)
        what = sabotage.get((candidate.options["num-warps"], candidate.options["block-v"]))
        if what == "garbage":
            o = o + 0.1 * torch.randn_like(o)
        elif what == "unwritten":
            o = o.clone()
            o[:, -1] = float("nan")
        elif what == "raise":
            raise RuntimeError("out of resource: shared memory, Required: 300000, Hardware limit: 232448")
        return o, state

    monkeypatch.setattr(measure, "run_entry", run_entry)
    timer = FakeTimer({"num-warps": 4})
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=timer, cache=TuneCache(tmp_path),
                           space=SMALL_SPACE, check_shape=CHECK)
    status = {(c.options["num-warps"], c.options["block-v"]): c for c in result.candidates}
    assert status[(4, 16)].status == "wrong" and "RMS ratio" in status[(4, 16)].detail
    assert status[(4, 32)].status == "wrong" and "NaN" in status[(4, 32)].detail
    assert status[(8, 16)].status == "error" and "out of resource" in status[(8, 16)].detail
    assert all(math.isinf(status[k].ms) for k in sabotage)
    assert result.winner.options == {"num-warps": 8, "block-v": 32}
    assert timer.calls == 1 + len(autotune.SEGMENTS)  # only the candidate that passed, then its segments stage


def test_segments_stage_picks_a_checked_P_and_auto_uses_it(tmp_path, capsys, monkeypatch):
    """The context-parallel stage times the winner with every sequence in P segments, each P
    checked first: a P made wrong never wins though timed fastest; the compiled module embeds
    the bucket's P, and chunk(..., segments="auto") in that bucket runs with it."""
    from k3compile.driver import load_module

    real = measure.run_entry

    def run_entry(module, inputs, candidate, entry_name="chunk", **options):
        o, state = real(module, inputs, candidate, entry_name, **options)
        return (o + 0.1 * torch.randn_like(o) if options.get("segments") == 8 else o), state

    class SegmentTimer(FakeTimer):
        def __call__(self, fn, candidate) -> float:
            return super().__call__(fn, candidate) - {2: 0.05, 4: 0.1, 8: 0.5}.get(candidate.options.get("segments"), 0)

    monkeypatch.setattr(measure, "run_entry", run_entry)
    cache = TuneCache(tmp_path / "cache")
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=SegmentTimer(), cache=cache, space=SMALL_SPACE,
                           check_shape=CHECK, segments=(2, 4, 8))
    stage = {r["P"]: r for r in result.record["segments"]["candidates"]}
    assert stage[8]["status"] == "wrong" and "RMS ratio" in stage[8]["detail"] and stage[8]["ms"] is None
    assert stage[1]["ms"] == result.winner.ms and stage[2]["status"] == stage[4]["status"] == "ok"
    assert result.record["segments"]["winner"] == 4
    code, out, err = run_cli(capsys, "compile", write_spec(tmp_path / "tuned.toml"), "-o", tmp_path / "out",
                             "--frozen", "--gpu", GPU, "--cache-dir", cache.root.parent)
    assert code == 0, err
    module = load_module(Path(out.strip()), "tuned_segments")
    assert module.TUNED_CHUNK[("float32", 1, 64)]["segments"] == {"P": 4}
    cp = module._CHUNK_CP
    assert cp.auto_segments([37], torch.device("cpu"), torch.float32) == 4  # the tuned bucket (T <= 64)
    assert cp.auto_segments([37], torch.device("cpu"), torch.float16) == 1  # untuned: the heuristic
    assert cp.auto_segments([70], torch.device("cpu"), torch.float32) == 1


def test_the_grouping_is_a_choice_the_tuner_can_make(tmp_path, capsys):
    """A string-valued row (fuse-chunkwise's grouping): both groupings are checked and timed, the
    faster wins, and the compiled module is that grouping's (the prepare as gram + wy kernels)."""
    from k3compile.ir import reference

    from k3compile.driver import load_module
    from k3compile.frontend import spec_to_module

    space = (Choice("fuse-chunkwise", "grouping", ("split", "split-prepare"), launch_only=False),)
    cache = TuneCache(tmp_path / "cache")
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=FakeTimer({"grouping": "split-prepare"}),
                           cache=cache, space=space, check_shape=CHECK, segments=())
    assert [c.status for c in result.candidates] == ["ok", "ok"]
    assert result.winner.options == {"grouping": "split-prepare"}
    assert result.candidates[0].code_hash != result.candidates[1].code_hash
    code, out, err = run_cli(capsys, "compile", write_spec(tmp_path / "tuned.toml"), "-o", tmp_path / "out",
                             "--frozen", "--gpu", GPU, "--cache-dir", cache.root.parent)
    assert code == 0, err
    module = load_module(Path(out.strip()), "tuned_grouping")
    assert hasattr(module, "tuned_chunk_gram_kernel") and hasattr(module, "tuned_chunk_wy_kernel")
    inputs = recurrence_inputs("kda", "kv", RecurrenceShape(1, 37, 1, 1, 16, 32))
    o, state = module.chunk(**inputs, output_final_state=True)
    ref_o, ref_state = reference.recurrence(next(iter(spec_to_module(spec_of()).ops)), **inputs, output_final_state=True)
    from conftest import assert_rms

    assert_rms(o, ref_o, "o", 1e-4)
    assert_rms(state, ref_state, "state", 1e-4)


def test_a_register_cap_is_a_launch_only_choice(tmp_path, capsys, monkeypatch):
    """fuse-chunkwise's prepare-maxnreg: one module serves both values (launch-only), the tuned
    cap lands in the prepare kernel's launch of its bucket, and none elsewhere."""
    from k3compile.driver import load_module

    space = (Choice("fuse-chunkwise", "prepare-maxnreg", (0, 168), launch_only=True),)
    cache = TuneCache(tmp_path / "cache")
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=FakeTimer({"prepare-maxnreg": 168}),
                           cache=cache, space=space, check_shape=CHECK, segments=())
    first, capped = result.candidates
    assert first.code_hash == capped.code_hash and result.winner.options == {"prepare-maxnreg": 168}
    assert capped.launch["tuned_chunk_prepare"]["maxnreg"] == 168 and "maxnreg" not in first.launch["tuned_chunk_prepare"]
    assert "maxnreg" not in capped.launch["tuned_chunk_scan"]
    code, out, err = run_cli(capsys, "compile", write_spec(tmp_path / "tuned.toml"), "-o", tmp_path / "out",
                             "--frozen", "--gpu", GPU, "--cache-dir", cache.root.parent)
    assert code == 0, err
    module = load_module(Path(out.strip()), "tuned_maxnreg")
    prepare = LaunchRecorder(module.tuned_chunk_prepare_kernel)
    monkeypatch.setattr(module, "tuned_chunk_prepare_kernel", prepare)
    for T, cap in ((37, 168), (70, None)):  # the tuned bucket (T <= 64), then an untuned one
        module.chunk(**recurrence_inputs("kda", "kv", RecurrenceShape(1, T, 1, 1, 16, 32)), output_final_state=True)
        assert prepare.launches[-1]["maxnreg"] == cap, (T, prepare.launches[-1])


def test_candidates_that_do_not_compile_score_infinity(tmp_path):
    space = (Choice("fuse-chunkwise", "num-warps", (8, 3), launch_only=True),)  # 3 warps: rejected by the pass
    result = autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, timer=FakeTimer(), cache=TuneCache(tmp_path),
                           space=space, check_shape=CHECK)
    bad = result.candidates[1]
    assert bad.status == "compile error" and math.isinf(bad.ms) and "num-warps" in bad.detail
    assert result.winner.index == 0


def test_tune_refuses_without_a_gpu_or_a_chunk_entry(monkeypatch, tmp_path):
    fake_gpu(monkeypatch, None)
    with pytest.raises(autotune.TuningError, match="no CUDA GPU"):
        autotune.tune(spec_of(), SHAPE, "float32", cache=TuneCache(tmp_path))
    with pytest.raises(autotune.TuningError, match="none of the tuned passes"):
        autotune.tune(spec_of(), SHAPE, "float32", gpu=GPU, pipeline="lower-recurrent", cache=TuneCache(tmp_path))
