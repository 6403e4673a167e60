"""The GPU benchmarks' CPU smoke modes (Triton's interpreter, tiny layers): each compiles its
modules, checks every method against an fp32 token loop before timing, and exits non-zero when a
check fails, so a change that breaks a bench script (or the entries it calls) fails here rather
than on the device machine. Also the chunk benchmark's gate pairings: the variant specs it derives
and the module check that keeps a row from timing another gate than it says."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import chunk_cases  # noqa: E402
import chunk_gpu  # noqa: E402

SMOKE_RUNS = {
    "block_attnres_gpu": ["bench/block_attnres_gpu.py", "--smoke"],
    "serving_sweep": ["bench/serving_sweep.py", "--smoke", "--choices", "16:4:0,16:2:2"],
    "speculative_gpu": ["bench/speculative_gpu.py", "--smoke", "--no-fla"],
    "chunk_gpu": ["bench/chunk_gpu.py", "--smoke", "--no-fla"],
    "million_tokens_gpu": ["bench/million_tokens_gpu.py", "--smoke", "--gates", "bounded", "--tokens", "48"],
}


def run_smoke(name, tmp_path, monkeypatch, capsys):
    """`python SCRIPT ARGS --out tmp_path` from the repository root with a fresh k3compile cache,
    run as the script's main(argv) in this process (which has torch, triton and k3compile
    imported already: a fresh interpreter spends seconds importing them again); the exit status
    `python SCRIPT` gives (sys.exit(main()), or main()'s own sys.exit) must be 0. What a fresh
    interpreter adds is checked apart, in one that only imports the script: the import loads no
    triton, so --smoke sets TRITON_INTERPRET before main imports it."""
    script, *args = SMOKE_RUNS[name]
    fresh = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, 'bench'); import {name}; "
                            "assert 'triton' not in sys.modules, 'importing the script imports triton'"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "argv", [script, *args, "--out", str(tmp_path)])
    try:
        status = importlib.import_module(name).main(sys.argv[1:])
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    assert status in (0, None), f"exit status {status!r}\n" + out[-2000:] + err[-2000:]
    return next(tmp_path.glob("*.md")).read_text()


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_bench_smoke_mode_checks_and_writes_its_table(name, tmp_path, monkeypatch, capsys):
    table = run_smoke(name, tmp_path, monkeypatch, capsys)
    checked = [line for line in table.splitlines() if line.endswith("| ok |")]  # a row's checks column
    assert checked and "FAILED" not in table, table
    if name == "chunk_gpu":  # both gate pairings ran, each row naming both sides' semantics
        rows = json.loads((tmp_path / "chunk_bench.json").read_text())["rows"]
        assert {(r["case"], r["pairing"]) for r in rows} == {
            ("kda_smoke", "bounded"), ("kda_smoke", "unbounded"), ("gdn_smoke", "unbounded")}
        for r in rows:
            assert r["ours_gate"].startswith(f'gate_input = "{chunk_cases.GATE_INPUT[r["pairing"]]}"')
            assert r["ours_ms"] > 0 and not r["failed"], r
        bounded, unbounded = table.split("## unbounded")
        assert "safe_gate=True, lower_bound=-5" in bounded and 'gate_input = "clamped"' in bounded
        assert "safe_gate" not in unbounded and 'gate_input = "log"' in unbounded


def test_chunk_cases_derive_one_valid_spec_per_gate_pairing(tmp_path):
    from k3compile.spec import load_spec

    listed = list(chunk_cases.write_variant_specs(tmp_path, chunk_cases.CASES))
    assert {case for _, case, _ in listed} == set(chunk_cases.CASES)
    for variant, case, pairing in listed:
        spec = load_spec(tmp_path / f"{variant}.toml")
        base = chunk_cases.read_layer(case)  # the shape's one spec, no gate of its own
        assert spec.name == variant == f"{case}_{chunk_cases.GATE_INPUT[pairing]}"
        assert spec.params["gate_input"] == chunk_cases.GATE_INPUT[pairing]
        assert (spec.kind, spec.params["num_heads"], spec.params["head_k_dim"]) == (
            base["kind"], base["num_heads"], base["head_k_dim"])
    pairings = {case: {p for _, c, p in listed if c == case} for case in chunk_cases.CASES}
    assert pairings["gdn_h32"] == {"unbounded"}  # fla 0.6.0 has no bounded scalar-gate path
    assert all(pairings[case] == {"bounded", "unbounded"} for case in chunk_cases.CASES if case != "gdn_h32")
    assert chunk_cases.fla_gate_options("kda", "bounded") == dict(safe_gate=True, lower_bound=-5.0)
    assert chunk_cases.fla_gate_options("gla", "bounded") == {} == chunk_cases.fla_gate_options("kda", "unbounded")
    assert "no bounded path" in chunk_cases.fla_semantics("gla", "bounded")


def test_chunk_cases_cli_rejects_unknown_case_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "bench/chunk_cases.py", "specs", str(tmp_path), "--cases", "kda_h96,nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nope" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_chunk_bench_refuses_a_module_of_another_gate(compile_layer):
    layer = compile_layer(name="gdn_gate_log", kind="gated_deltanet", num_heads=1, head_k_dim=8, head_v_dim=8,
                          dtype="float32")
    assert chunk_gpu.import_variant(layer.path, "unbounded").chunk
    with pytest.raises(ValueError, match="compiled with gate_input log, the bounded pairing times clamped"):
        chunk_gpu.import_variant(layer.path, "bounded")


def test_fla_suite_refuses_a_folder_that_is_not_flas_tests(tmp_path):
    """bench/fla_suite.py needs fla's tests folder (conftest.py and the test files): anything else
    is exit 2 with one line naming the folder and what is missing, before pytest or fla is touched."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "test_kda.py").write_text("")
    run = subprocess.run([sys.executable, "bench/fla_suite.py", "--tests", str(tmp_path), "--out", str(tmp_path / "out"),
                          "--files", "ops/test_kda.py", "ops/test_gla.py"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    message = run.stderr.strip()
    assert len(message.splitlines()) == 1 and str(tmp_path) in message and "ops/test_gla.py" in message, message
    assert not (tmp_path / "out").exists()


def test_fla_suite_table_names_every_test_of_ours_and_every_test_not_run():
    """fla_suite.md says which of fla's tests ran ours and how each ended (a passed one too, so a
    case of interest is shown to have run), and names the tests the time budget cut."""
    import fla_suite

    records = [
        dict(test="ops/test_gla.py::test_chunk[D512-bf16]", outcome="passed", ours={"chunk_gla": 1}, message=""),
        dict(test="ops/test_kda.py::test_chunk[T160]", outcome="failed", ours={"chunk_kda": 2}, message="E  a | b"),
        dict(test="ops/test_kda.py::test_naive", outcome="passed", ours={}, message=""),
        dict(test="ops/test_delta.py::test_chunk[C64]", outcome="skipped", ours={}, message=fla_suite.BUDGET_SPENT),
    ]
    text = fla_suite.table(records, "# header")
    assert "Tests that called k3compile.ops: 2: 1 passed, 1 failed, 0 skipped." in text
    assert "fla's own code: 1." in text and "Not run, the time budget spent: 1." in text
    assert "| `ops/test_gla.py::test_chunk[D512-bf16]` | passed | chunk_gla x1 |  |" in text
    assert "| `ops/test_kda.py::test_chunk[T160]` | failed | chunk_kda x2 | E  a / b |" in text
    assert "test_naive" not in text
    assert text.rstrip().endswith("- `ops/test_delta.py::test_chunk[C64]`")
