"""The caches recover from what is found on disk (issue 34, "Caches that never recover").

- k3compile.ops' disk cache: a damaged module (empty, truncated, garbage, edited) is compiled
  and written again, never imported; where it cannot be rewritten, the error names the file.
- The compile output folder: a `<name>.py` of any bytes there is replaced.
- The tuning cache: an unusable record is skipped with one message naming it.
- K3C_CACHE_DIR='~/x' means the home folder's x; written modules honour the umask.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import one_line, recurrence_table, run_cli

import k3compile
from k3compile import driver, ops
from k3compile.runtime import autotune
from k3compile.runtime.autotune import TuneCache
from k3compile.errors import OutputError
from k3compile.ops import layers
from k3compile.spec import spec_from_table

H, K, V, T = 1, 8, 8, 5
GLA_KEY = layers.LayerKey("gla", H, H, K, V)  # what ops.fused_recurrent_gla below compiles
GPU = "Fake GPU 80GB"
TABLE = recurrence_table("gla", H=1, K=16, V=16, name="tuned")
SHAPE = (1, 48)


@pytest.fixture
def ops_cache(tmp_path, monkeypatch) -> Path:
    """An empty ops disk cache of this test's own, and nothing loaded in process."""
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(layers, "_LOADED", {})
    return layers.cache_dir() / f"{GLA_KEY.module_name()}.py"


def write_table(path: Path) -> Path:
    path.write_text("[layer]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in TABLE.items()))
    return path


def gla_inputs() -> dict:
    return {"q": F.normalize(torch.randn(1, T, H, K), dim=-1), "k": F.normalize(torch.randn(1, T, H, K), dim=-1),
            "v": torch.randn(1, T, H, V), "gk": F.logsigmoid(torch.randn(1, T, H, K))}


def gla_reference(q, k, v, gk) -> torch.Tensor:
    """GLA token by token in float64: S = diag(exp(gk_t)) S + k_t v_t^T, o_t = K^-1/2 q_t^T S."""
    state = torch.zeros(H, K, V, dtype=torch.float64)
    outputs = []
    for t in range(T):
        q_t, k_t, v_t, g_t = (x[0, t].double() for x in (q, k, v, gk))
        state = g_t.exp()[..., None] * state + k_t[..., None] * v_t[:, None, :]
        outputs.append(K ** -0.5 * torch.einsum("hk,hkv->hv", q_t, state))
    return torch.stack(outputs)[None]


def assert_gla_right() -> None:
    x = gla_inputs()
    o, _ = ops.fused_recurrent_gla(**x)
    torch.testing.assert_close(o.double(), gla_reference(**x), rtol=1e-5, atol=1e-5)


# --- the ops disk cache ---------------------------------------------------------------------------

DAMAGES = {
    "empty": lambda good: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: b"\x00\xff\xfe not python at all \x80",
    "other python": lambda good: b"x = 1\n",  # imports, then lacks every entry
    "edited body": lambda good: good.replace(b"def ", b"def _", 1),  # the hash line kept
    "no hash line": lambda good: good.partition(b"\n")[2],
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_ops_module_is_compiled_again(ops_cache, monkeypatch, damage):
    assert_gla_right()
    good = ops_cache.read_bytes()
    ops_cache.write_bytes(DAMAGES[damage](good))
    monkeypatch.setattr(layers, "_LOADED", {})  # as a later process
    assert_gla_right()
    assert ops_cache.read_bytes() == good  # written again, whole
    assert not [p.name for p in ops_cache.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_damaged_ops_module_that_cannot_be_rewritten_is_named(ops_cache, monkeypatch):
    assert_gla_right()
    ops_cache.write_bytes(b"")
    monkeypatch.setattr(layers, "_LOADED", {})

    def read_only(path, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(driver, "write_file_atomic", read_only)
    with pytest.raises(OutputError) as caught:
        ops.fused_recurrent_gla(**gla_inputs())
    message = str(caught.value)
    assert one_line(message) and str(ops_cache) in message and "fails its hash" in message
    assert "K3C_CACHE_DIR" in message


# --- the compile output folder --------------------------------------------------------------------


def test_compile_replaces_a_file_of_any_bytes(tmp_path, capsys):
    spec_path = write_table(tmp_path / "tuned.toml")
    expected = driver.lower(k3compile.load_spec(spec_path)).source.encode()
    for out in (tmp_path / "api", tmp_path / "cli"):
        out.mkdir()
        (out / "tuned.py").write_bytes(b"\xff\xfe\x00 latin-1 \xe9 and worse")
    layer = k3compile.compile(spec_path, out_dir=tmp_path / "api")
    assert layer.path.read_bytes() == expected and "recurrent" in layer.entries
    code, _, err = run_cli(capsys, "compile", spec_path, "-o", tmp_path / "cli", "--no-autotune")
    assert code == 0, err
    assert (tmp_path / "cli" / "tuned.py").read_bytes() == expected


# --- file modes and K3C_CACHE_DIR -----------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_modules_honour_the_umask(ops_cache, tmp_path, umask):
    previous = os.umask(umask)
    try:
        assert_gla_right()
        layer = k3compile.compile(spec_from_table(dict(TABLE), source="<test>"), out_dir=tmp_path / "out")
        cache = TuneCache(tmp_path / "tune")
        record = cache.put({"key": autotune.key_for(spec_from_table(dict(TABLE)), None, SHAPE, "float32", GPU),
                            "candidates": [], "winner": None})
    finally:
        os.umask(previous)
    for path in (ops_cache, layer.path, record):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def test_cache_dir_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("K3C_CACHE_DIR", "~/k3c")
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "home" / "k3c"
    assert layers.cache_dir() == root / "modules" / "ops"
    assert driver.default_cache_dir() == root / "modules"
    assert autotune.cache_root() == root and TuneCache().root == root / "autotune"
    assert autotune.cache_root("~/flag") == tmp_path / "home" / "flag"
    monkeypatch.delenv("K3C_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert autotune.cache_root() == tmp_path / "home" / "xdg" / "k3compile"
    layer = k3compile.compile(spec_from_table(dict(TABLE), source="<test>"))
    assert tmp_path / "home" in layer.path.parents and not (tmp_path / "~").exists()


# --- the tuning cache -----------------------------------------------------------------------------


def tuning_record(spec, **fields) -> dict:
    """A usable record of one passing candidate (block-v 16), with `fields` replaced."""
    candidate = {"index": 0, "options": {"block-v": 16}, "pipeline": "p", "code_options": {}, "code_hash": "h",
                 "launch": {"chunk_scan": {"BV": 16}}, "status": "ok", "ms": 1.0, "detail": ""}
    record = {"key": autotune.key_for(spec, None, SHAPE, "float32", GPU), "candidates": [candidate], "winner": 0,
              "default": 0, "space": [{"pass": "fuse-chunkwise", "option": "block-v", "values": [16],
                                       "launch_only": True}], "segments": None}
    return {**record, **fields}


BAD_CANDIDATES = {
    "missing": {},
    "not a list": {"candidates": "fast"},
    "not objects": {"candidates": [1]},
    "no pipeline": {"candidates": [{"index": 0, "options": {}, "code_options": {}}]},
    "unknown field": {"candidates": [{"index": 0, "options": {}, "pipeline": "p", "code_options": {}, "speed": 1}]},
    "ms a string": {"candidates": [{"index": 0, "options": {}, "pipeline": "p", "code_options": {}, "status": "ok",
                                    "ms": "1"}]},
    "passing in 0 ms": {"candidates": [{"index": 0, "options": {}, "pipeline": "p", "code_options": {},
                                        "status": "ok", "ms": 0}]},
    "winner out of range": {"winner": 3},
    "default true": {"default": True},
    "launch not ints": {"candidates": [{"index": 0, "options": {}, "pipeline": "p", "code_options": {},
                                        "launch": {"k": {"BV": "16"}}}]},
    "code option without a choice": {"candidates": [{"index": 0, "options": {}, "pipeline": "p",
                                                     "code_options": {"chunk-size": 32}}]},
    "segments winner missing": {"segments": {"candidates": []}},
}


@pytest.mark.parametrize("bad", BAD_CANDIDATES)
def test_a_bad_tuning_record_is_skipped_and_named(tmp_path, bad):
    spec = spec_from_table(dict(TABLE), source="<test>")
    cache = TuneCache(tmp_path)
    record = tuning_record(spec, **BAD_CANDIDATES[bad])
    if bad == "missing":
        del record["candidates"]
    path = cache.put(record)
    key = record["key"]
    assert cache.get(key) is None
    assert cache.records(key["schedule"], GPU, key["triton"], key["k3compile"]) == []
    assert len(cache.messages) == 1 and str(path) in cache.messages[0] and one_line(cache.messages[0])


def test_a_usable_tuning_record_is_used(tmp_path):
    """The control of the test above: the record unchanged is read back and embedded."""
    spec = spec_from_table(dict(TABLE), source="<test>")
    cache = TuneCache(tmp_path)
    record = tuning_record(spec)
    cache.put(record)
    assert cache.get(record["key"]) == record
    _, plan = autotune.compile_tuned(spec, gpu=GPU, cache=cache)
    assert plan.records == [record] and not cache.messages


@pytest.mark.parametrize("content", ["bad candidates", "truncated"])
def test_cli_compile_skips_a_bad_tuning_record_with_one_note(tmp_path, capsys, content):
    spec_path = write_table(tmp_path / "tuned.toml")
    spec = spec_from_table(dict(TABLE), source=str(spec_path))
    cache = TuneCache(tmp_path / "cache")
    path = cache.put(tuning_record(spec, candidates=[{"index": 0}]))
    if content == "truncated":
        path.write_bytes(json.dumps(tuning_record(spec), indent=1).encode()[:100])
    args = ("compile", spec_path, "--gpu", GPU, "--cache-dir", tmp_path / "cache")
    code, out, err = run_cli(capsys, *args, "-o", tmp_path / "out")
    notes = [line for line in err.splitlines() if str(path) in line]
    assert code == 0 and len(notes) == 1 and "skipped" in notes[0], err
    assert (tmp_path / "out" / "tuned.py").is_file()
    code, out, err = run_cli(capsys, *args, "--frozen", "-o", tmp_path / "frozen")
    assert code == 2 and one_line(err) and str(path) in err and "k3c tune" in err


def test_segments_and_ms_are_checked_as_written(tmp_path):
    """What tune writes (failed candidates with ms None, a context-parallel stage) is usable."""
    spec = spec_from_table(dict(TABLE), source="<test>")
    failed = {"index": 1, "options": {"block-v": 32}, "pipeline": "p", "code_options": {}, "code_hash": "h",
              "launch": None, "status": "wrong", "ms": None, "detail": "max error 1e3"}
    record = tuning_record(spec, segments={"winner": 2, "candidates": [
        {"P": 1, "status": "ok", "ms": 1.0, "detail": "the winner"},
        {"P": 2, "status": "ok", "ms": 0.6, "detail": ""},
        {"P": 4, "status": "error", "ms": None, "detail": "boom"}]})
    record["candidates"].append(failed)
    cache = TuneCache(tmp_path)
    cache.put(record)
    assert cache.get(record["key"]) == record and not cache.messages
