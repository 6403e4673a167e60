"""k3c's exit codes and messages at the edges: argparse's errors in one line, internal errors
with and without K3C_TRACEBACK, a stdout closed early, repeated options, a pipeline's trailing
comma, chunk sizes `k3c prove` cannot finish, and what `k3c verify` leaves behind (a temporary
folder, numpy's warnings from values its kernels discard)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import EXAMPLES, REPO, bad_input, one_line, run_cli
from k3compile.cli import build_parser, main

TINY = """\
[layer]
name = "tiny"
kind = "{kind}"
num_heads = 1
head_k_dim = {K}
head_v_dim = 6
dtype = "float32"
"""


def write_spec(tmp_path, kind="gla", K=8) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(kind=kind, K=K))
    return path


# --- argparse's errors: one line, as every other bad input ----------------------------------


@pytest.mark.parametrize("argv, words", [
    ([], ["k3c: error:", "command", "(see k3c --help)"]),
    (["frobnicate"], ["k3c: error:", "frobnicate"]),
    (["compile", "examples/kda.toml"], ["k3c compile: error:", "-o/--output", "(see k3c compile --help)"]),
    (["verify", "examples/kda.toml", "--dtype", "float64"], ["k3c verify: error:", "--dtype", "float64"]),
    (["verify", "examples/kda.toml", "--seed", "x"], ["k3c verify: error:", "--seed", "'x'"]),
    (["compile", "examples/kda.toml", "-o", "out", "--bogus-flag"], ["--bogus-flag"]),
    (["verify", "examples/kda.toml", "--shard=-1/2"], ["--shard", "0 <= I < N", "'-1/2'"]),
    # argparse takes -1/2 for an option, not --shard's value: the message says how to write it
    (["verify", "examples/kda.toml", "--shard", "-1/2"],
     ["--shard: expected one argument", "a value that starts with '-' is written --shard=VALUE"]),
    (["compile", "examples/kda.toml", "--stdout", "--shape", "-1,5"], ["written --shape=VALUE"]),
])
def test_usage_errors_are_one_line(capsys, argv, words):
    message = bad_input(capsys, *argv)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


# --- internal errors: exit 3, the traceback only when asked for -----------------------------


@pytest.fixture
def broken_writer(monkeypatch):
    import k3compile.driver

    def broken(*args, **kwargs):
        raise RuntimeError("writer exploded\nsecond line")

    monkeypatch.setattr(k3compile.driver, "write_module", broken)


@pytest.mark.parametrize("setting", [None, "", "0", "false", "no", "off"])
def test_internal_error_without_traceback(capsys, tmp_path, monkeypatch, broken_writer, setting):
    if setting is not None:
        monkeypatch.setenv("K3C_TRACEBACK", setting)
    else:
        monkeypatch.delenv("K3C_TRACEBACK", raising=False)
    assert main(["compile", str(EXAMPLES / "kda.toml"), "-o", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert one_line(err) and "internal error: RuntimeError: writer exploded (set K3C_TRACEBACK=1" in err


@pytest.mark.parametrize("setting", ["1", "true", "True", "TRUE"])
def test_internal_error_with_traceback_keeps_its_exit_code(capsys, tmp_path, monkeypatch, broken_writer, setting):
    """The traceback is printed, and the exit code stays 3: 1 says the kernels disagreed with
    the reference, which they did not."""
    monkeypatch.setenv("K3C_TRACEBACK", setting)
    assert main(["compile", str(EXAMPLES / "kda.toml"), "-o", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: writer exploded" in err


# --- a stdout closed early (`k3c passes | head -1`) is no error ------------------------------


@pytest.mark.parametrize("argv", [["passes"], ["ir", str(EXAMPLES / "kda.toml"), "-p", "lower-recurrent"]])
def test_closed_stdout_exits_0_silently(argv):
    """The reader went away before k3c wrote (a pipe whose read end is closed: every write
    fails, as after `head -1` exits): exit 0, nothing on stderr. `passes` prints through rich,
    `ir` through print."""
    script = Path(sys.executable).with_name("k3c")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "k3compile.cli"]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(command + argv, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                                cwd=REPO)
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (0, "")


# --- repeated options: each value once ------------------------------------------------------


@pytest.mark.parametrize("argv, dest, values", [
    (["verify", "s.toml", "--dtype", "float32", "--dtype", "float16", "--dtype", "float32"], "dtype",
     ["float32", "float16"]),
    (["compile", "s.toml", "--stdout", "--shape", "1,64", "--shape", "1,64", "--dtype", "float16", "--dtype",
      "float16"], "shape", [(1, 64)]),
    (["compile", "s.toml", "--stdout", "--shape", "1,64", "--dtype", "float16", "--dtype", "float16"], "dtype",
     ["float16"]),
    (["tune", "s.toml", "--shape", "2,8", "--shape", "2,8", "--shape", "1,8"], "shape", [(2, 8), (1, 8)]),
    (["prove", "s.toml", "--chunk-size", "3", "--chunk-size", "3"], "chunk_size", [3]),
])
def test_repeated_values_count_once(argv, dest, values):
    assert getattr(build_parser().parse_args(argv), dest) == values


def test_verify_runs_each_case_once_for_a_repeated_dtype(capsys, tmp_path, monkeypatch):
    """`--dtype float32 --dtype float32`: every case once. (The cases report one row each without
    launching: which cases run is the point here.)"""
    import dataclasses
    import tempfile

    import torch

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec_path = write_spec(tmp_path)
    spec = load_spec(spec_path)
    cases = []

    def one_row(layer, entry, layer_op, case, dtype, device, gen):
        cases.append((layer.spec.name, entry, case.name, dtype))
        return [("o", torch.ones(1), torch.ones(1))]

    family = verify_module.FAMILIES[spec.kind]
    monkeypatch.setitem(verify_module.FAMILIES, spec.kind, dataclasses.replace(family, run=one_row))
    code, out, err = run_cli(capsys, "verify", spec_path, "--device", "cpu", "--quick", "--dtype", "float32",
                             "--dtype", "float32")
    assert code == 0, err
    assert len(cases) == len(set(cases)) == sum(len(group) for _, _, group in family.quick(spec, False))


# --- pipelines: a trailing comma is refused like every other empty pass name ----------------


@pytest.mark.parametrize("pipeline, column", [("lower-recurrent,", 17), ("lower-recurrent, ", 17),
                                              ("lower-recurrent,,lower-decode", 17), (",lower-recurrent", 1)])
def test_empty_pass_name_in_a_pipeline(capsys, pipeline, column):
    message = bad_input(capsys, "ir", EXAMPLES / "kda.toml", "-p", pipeline)
    assert f"pipeline '{pipeline}': column {column}: Expected pass name here" in message


# --- k3c prove: chunk sizes its exact solves can finish -------------------------------------


@pytest.mark.parametrize("size", ["65", "1000", "0", "-3"])
def test_prove_chunk_size_out_of_range(capsys, size):
    message = bad_input(capsys, "prove", EXAMPLES / "deltanet.toml", "--chunk-size", "3", f"--chunk-size={size}")
    assert message.startswith(f"k3c prove: error: chunk size {size}: expected 1 .. 64 (")
    assert "exact rationals" in message


def test_prove_functions_refuse_the_same_sizes():
    from k3compile.errors import ArgumentError
    from k3compile.checking.prove import prove_backward, prove_chunkwise, prove_segment_scan
    from k3compile.spec import load_spec

    spec = load_spec(EXAMPLES / "deltanet.toml")
    for prove in (prove_chunkwise, prove_backward, prove_segment_scan):
        with pytest.raises(ArgumentError, match="^chunk size 1000: expected 1 .. 64"):
            prove(spec, 1000)


# --- integers past 64 bits: bad input (exit 2), not an internal error -----------------------


@pytest.mark.parametrize("key", ["num_heads", "head_k_dim"])
def test_integer_past_64_bits_exits_2(capsys, tmp_path, key):
    path = write_spec(tmp_path)
    path.write_text(path.read_text().replace(f"{key} = ", f"{key} = {2**64 + 1}\n# "))
    message = bad_input(capsys, "compile", path, "-o", tmp_path / "out")
    assert f"key '{key}': expected an integer in 1 .. 2**63 - 1, got {2**64 + 1}" in message


# --- k3c verify: nothing left behind, no warnings above its table ---------------------------


def verify_folders(tmp_path) -> list[str]:
    return [path.name for path in tmp_path.iterdir() if path.name.startswith("k3c-verify-")]


@pytest.mark.parametrize("raised", [None, RuntimeError("a case exploded"), KeyboardInterrupt()])
def test_verify_removes_its_temporary_folder(tmp_path, monkeypatch, raised):
    """However the run ends (done, an error, Ctrl-C), the folder of its modules is gone after."""
    import dataclasses
    import tempfile

    import torch

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = load_spec(write_spec(tmp_path))
    seen = []

    def one_row(layer, entry, layer_op, case, dtype, device, gen):
        seen.extend(verify_folders(tmp_path))
        if raised is not None:
            raise raised
        return [("o", torch.ones(1), torch.ones(1))]

    family = verify_module.FAMILIES[spec.kind]
    monkeypatch.setitem(verify_module.FAMILIES, spec.kind, dataclasses.replace(family, run=one_row))
    if raised is None:
        assert all(r.passed for r in verify_module.verify(spec, device="cpu", quick=True))
    else:
        with pytest.raises(type(raised)):
            verify_module.verify(spec, device="cpu", quick=True)
    assert seen, "the modules were not written to a k3c-verify- folder of the temporary directory"
    assert verify_folders(tmp_path) == []


def test_verify_prints_no_numpy_warnings_for_discarded_lanes(tmp_path, monkeypatch):
    """Steep gates: the interpreter computes a guarded Gram's factored operands before its span
    check picks the elementwise blocks, and they overflow (exp2; 0 * inf in masked lanes). With
    numpy's errstate left as it is, the same run does warn (so the case computes such values);
    verify keeps its output clean, and every result still passes."""
    import contextlib

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec
    from k3compile.checking.verify import RecurrenceCase

    spec = load_spec(write_spec(tmp_path, kind="kda", K=16))
    steep = RecurrenceCase("varlen (1, 22), gates steep from token 5", 1, 0, seqlens=(1, 22), steep_from=5)
    family = verify_module.FAMILIES[spec.kind]
    monkeypatch.setitem(verify_module.FAMILIES, spec.kind,
                        verify_module.Family(family.full, lambda spec, on_gpu: [(spec, "chunk", [steep])],
                                             family.run, family.tolerance))

    def runtime_warnings() -> tuple[list, list]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = verify_module.verify(spec, device="cpu", quick=True, seed=1, out_dir=tmp_path / "out")
        return [w for w in caught if issubclass(w.category, RuntimeWarning)], results

    with monkeypatch.context() as patch:
        patch.setattr(verify_module.numpy, "errstate", lambda **kwargs: contextlib.nullcontext())
        assert runtime_warnings()[0], ("the kernels no longer compute overflowing values they discard: "
                                       "run_cases's numpy.errstate can go, and this test with it")
    caught, results = runtime_warnings()
    assert caught == [] and results and all(r.passed for r in results)


def test_verify_takes_each_dtype_once():
    """verify(dtypes=[...]) as --dtype: a repeated dtype would run every case twice."""
    from k3compile.checking.verify import defaults

    assert defaults("cpu", ["float32", "float16", "float32"]) == ("cpu", ["float32", "float16"])
