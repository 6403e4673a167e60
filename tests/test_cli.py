"""`k3c`: compile, ir, opt, verify; exit codes 0 ok, 1 verification failed, 2 bad input, 3 internal error."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_cli, EXAMPLES, REPO, one_line
from k3compile.cli import main

TINY = """\
[layer]
name = "tiny"
kind = "{kind}"
num_heads = 1
head_k_dim = 8
head_v_dim = 6
dtype = "float32"
"""


run = run_cli


def assert_bad_input(code, out, err, *words):
    assert code == 2, f"exit code {code}, stderr {err!r}"
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one stderr line, got {lines!r}"
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"


@pytest.fixture
def bad_spec(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(TINY.format(kind="kda") + "head_dim = 4\n")
    return path


@pytest.fixture
def tiny_spec(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.format(kind="gla"))
    return path


# --- compile --------------------------------------------------------------------------------


def test_compile_writes_module(capsys, tmp_path):
    out_dir = tmp_path / "out" / "nested"
    code, out, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", out_dir)
    assert code == 0, err
    written = out_dir / "kda.py"
    assert written.is_file()
    assert out.strip() == str(written)
    source = written.read_text()
    compile(source, str(written), "exec")  # valid Python
    assert "def recurrent(" in source and "@triton.jit" in source and "__all__" in source
    assert err == ""


@pytest.mark.parametrize("pipeline", [None, "lower-recurrent"])
def test_compile_timing(capsys, tmp_path, pipeline):
    from k3compile.pipeline import DEFAULT_PIPELINES

    extra = ["-p", pipeline] if pipeline else []
    code, out, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", tmp_path, "--timing", *extra)
    assert code == 0
    lines = err.splitlines()
    passes = [step.split("{")[0] for step in (pipeline or DEFAULT_PIPELINES["kda"]).split(",")]
    for name in ("build-ir", *passes, "print-triton", "total"):
        matching = [line for line in lines if line.split() and line.split()[0] == name]
        assert len(matching) == 1, f"no timing line for {name}: {lines!r}"
        assert matching[0].rstrip().endswith("ms")
        float(matching[0].split()[1])


def test_compile_with_pipeline_option(capsys, tmp_path):
    code, out, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", tmp_path, "-p", "lower-recurrent{block-v=16}")
    assert code == 0, err
    assert "BV = 16" in (tmp_path / "kda.py").read_text()


def test_compile_attnres(capsys, tmp_path):
    code, out, err = run(capsys, "compile", EXAMPLES / "attnres.toml", "-o", tmp_path)
    assert code == 0, err
    assert "def aggregate(" in (tmp_path / "attnres.py").read_text()


def test_compile_is_fast(capsys, tmp_path):
    """Product requirement: compiling the KDA example takes well under 5 s."""
    start = time.perf_counter()
    code, _, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", tmp_path)
    elapsed = time.perf_counter() - start
    assert code == 0, err
    assert elapsed < 5.0, f"k3c compile took {elapsed:.2f} s"


def test_the_cli_imports_no_torch():
    """`k3c` starts without torch (1.7 s of import on this machine): the IR tests run it hundreds
    of times. Only commands that run kernels (verify, tune) import it, when they run."""
    code = "import sys; from k3compile.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False", "building the k3c parser imports torch"


def test_compile_bad_spec(capsys, bad_spec, tmp_path):
    code, out, err = run(capsys, "compile", bad_spec, "-o", tmp_path)
    assert_bad_input(code, out, err, "k3c compile", str(bad_spec), "head_dim")
    assert out == ""
    assert not list(tmp_path.glob("*.py"))


def test_compile_missing_spec(capsys, tmp_path):
    code, out, err = run(capsys, "compile", tmp_path / "missing.toml", "-o", tmp_path)
    assert_bad_input(code, out, err, "missing.toml")


def test_compile_num_v_heads_not_multiple(capsys, tmp_path):
    path = tmp_path / "hv.toml"
    path.write_text(TINY.format(kind="kda").replace("num_heads = 1", "num_heads = 2") + "num_v_heads = 3\n")
    code, out, err = run(capsys, "compile", path, "-o", tmp_path)
    assert_bad_input(code, out, err, str(path), "num_v_heads")


def test_compile_latent_moe_gives_its_entries(capsys, tmp_path):
    code, out, err = run(capsys, "compile", EXAMPLES / "latent_moe.toml", "-o", tmp_path)
    assert code == 0, err
    source = (tmp_path / "latent_moe.py").read_text()
    assert "def route(x, router_weight, router_bias):" in source
    assert ("def moe(x, router_weight, router_bias, expert_gate_up, expert_down, latent_down, latent_up, "
            'latent_norm_gain, shared_gate_up, shared_down, schedule="auto"):') in source
    assert ("__all__ = ['route', 'moe_prefill', 'moe_decode', 'moe_decode_warp', 'moe_forward', 'moe_backward', "
            "'moe']") in source


def test_compile_unknown_pass(capsys, tmp_path):
    code, out, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", tmp_path, "-p", "no-such-pass")
    assert_bad_input(code, out, err, "no-such-pass")


def test_compile_output_is_a_file(capsys, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("")
    code, out, err = run(capsys, "compile", EXAMPLES / "kda.toml", "-o", target)
    assert_bad_input(code, out, err, "a_file")


def test_compile_not_utf8_spec(capsys, tmp_path):
    path = tmp_path / "binary.toml"
    path.write_bytes(b"[layer]\nname = \"\xff\"\n")
    code, out, err = run(capsys, "compile", path, "-o", tmp_path)
    assert_bad_input(code, out, err, str(path))


# --- ir -------------------------------------------------------------------------------------


def test_ir_prints_layer_op(capsys):
    code, out, err = run(capsys, "ir", EXAMPLES / "kda.toml")
    assert code == 0, err
    assert "k3.recurrence @kda" in out and "gate = channel" in out
    assert "IR after" not in out


def test_ir_after_all_default_pipeline(capsys):
    from k3compile.pipeline import DEFAULT_PIPELINES

    code, out, err = run(capsys, "ir", EXAMPLES / "kda.toml", "--after-all")
    assert code == 0, err
    assert "IR of spec" in out
    for step in DEFAULT_PIPELINES["kda"].split(","):
        assert f"IR after {step.split('{')[0]}" in out


def test_ir_after_all(capsys):
    code, out, err = run(capsys, "ir", EXAMPLES / "kda.toml", "--after-all", "-p", "lower-recurrent")
    assert code == 0, err
    assert "IR of spec" in out
    assert "IR after lower-recurrent" in out
    after = out.split("IR after lower-recurrent", 1)[1]
    assert "k3s.entry @recurrent" in after and "k3s.token_loop" in after


def test_ir_runs_the_pipeline_without_after_all(capsys):
    """-p alone prints the IR after the pipeline (no headers), not the spec's IR."""
    code, out, err = run(capsys, "ir", EXAMPLES / "kda.toml", "-p", "lower-recurrent{block-v=16}")
    assert code == 0, err
    assert out.startswith("builtin.module {") and "IR after" not in out and "IR of spec" not in out
    assert "k3s.entry @recurrent" in out and "block_v = 16" in out
    assert "k3s.entry @decode" not in out  # only the pipeline asked for, not the kind's


@pytest.mark.parametrize("after_all", [[], ["--after-all"]])
@pytest.mark.parametrize("pipeline", ["no-such-pass{x=1}", "lower-recurrent{blok-v=16}"])
def test_ir_bad_pipeline(capsys, pipeline, after_all):
    code, out, err = run(capsys, "ir", EXAMPLES / "kda.toml", "-p", pipeline, *after_all)
    assert_bad_input(code, out, err, "k3c ir", pipeline.split("{")[0], pipeline.split("{")[1].split("=")[0])
    assert out == ""


def test_readme_ir_sample_is_the_real_output(capsys, monkeypatch):
    """The README's `k3c ir` sample, line for line; its one '... (N more ...)' line stands for N lines."""
    import re

    command = "$ .venv/bin/k3c ir examples/kda.toml --after-all -p lower-recurrent\n"
    sample = (REPO / "README.md").read_text().split(command, 1)[1].split("```", 1)[0].splitlines()
    monkeypatch.chdir(REPO)
    code, out, err = run(capsys, "ir", "examples/kda.toml", "--after-all", "-p", "lower-recurrent")
    assert code == 0, err
    real = out.rstrip("\n").splitlines()
    at = 0
    for line in sample:
        skipped = re.match(r"^\s*\.\.\. \((\d+) more ", line)
        if skipped:
            at += int(skipped[1])
            continue
        assert at < len(real) and real[at] == line, f"README line {line!r} != real line {real[at:at + 1]}"
        at += 1
    assert at == len(real), f"the README leaves out the last {len(real) - at} lines"


def test_readme_names_the_default_recurrence_pipeline():
    """The README's default pipeline of a recurrence is the one `k3c passes` lists and compiles."""
    from k3compile.pipeline import DEFAULT_PIPELINES

    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"The default pipeline of a recurrence (`{DEFAULT_PIPELINES['kda']}`" in readme


def test_ir_after_all_timing(capsys):
    code, out, err = run(capsys, "ir", EXAMPLES / "gla.toml", "--after-all", "--timing", "-p", "lower-recurrent")
    assert code == 0
    assert any(line.split()[:1] == ["lower-recurrent"] for line in err.splitlines())


def test_ir_generic(capsys):
    code, out, err = run(capsys, "ir", EXAMPLES / "deltanet.toml", "--generic")
    assert code == 0, err
    assert '"k3.recurrence"' in out


def test_ir_generic_attnres(capsys):
    code, out, err = run(capsys, "ir", EXAMPLES / "attnres.toml", "--generic")
    assert code == 0 and '"k3.attnres"' in out


def test_ir_bad_spec(capsys, bad_spec):
    code, out, err = run(capsys, "ir", bad_spec)
    assert_bad_input(code, out, err, "k3c ir", "head_dim")


# --- opt ------------------------------------------------------------------------------------


def write_ir(capsys, tmp_path, example="kda", generic=False) -> Path:
    args = ["ir", EXAMPLES / f"{example}.toml"] + (["--generic"] if generic else [])
    code, out, _ = run(capsys, *args)
    assert code == 0
    path = tmp_path / f"{example}{'_generic' if generic else ''}.mlir"
    path.write_text(out)
    return path


def test_opt_round_trip(capsys, tmp_path):
    path = write_ir(capsys, tmp_path)
    code, out, err = run(capsys, "opt", path)
    assert code == 0, err
    assert out == path.read_text()


def test_opt_generic_input(capsys, tmp_path):
    custom = write_ir(capsys, tmp_path, "gla")
    generic = write_ir(capsys, tmp_path, "gla", generic=True)
    code, out, err = run(capsys, "opt", generic)
    assert code == 0, err
    assert out == custom.read_text()


def test_opt_runs_pass(capsys, tmp_path):
    path = write_ir(capsys, tmp_path, "gated_deltanet")
    code, out, err = run(capsys, "opt", path, "-p", "lower-recurrent", "--timing")
    assert code == 0, err
    assert "k3s.entry @recurrent" in out
    assert re.search(r"%(\w+) = k3s.load_gate %g <gate = scalar.*\n.*k3s.decay %S\w*, %\1 <gate = scalar>", out)
    assert "lower-recurrent" in err


def test_opt_stdin(capsys, tmp_path, monkeypatch):
    import io

    text = write_ir(capsys, tmp_path, "deltanet").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code, out, err = run(capsys, "opt", "-")
    assert code == 0, err
    assert out == text


@pytest.mark.parametrize("text", [
    "this is not IR {\n",
    "builtin.module {\n  k3.recurrence @a <gate = channel>\n}\n",
    "builtin.module {\n  k3.nonsense @a\n}\n",
    "builtin.module {\n  k3.recurrence @a <gate = bogus, delta_rule = true, num_heads = 2, num_v_heads = 2, "
    "head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>\n}\n",
    "builtin.module {\n  k3.recurrence @a <gate = channel, delta_rule = true, num_heads = 2, num_v_heads = 3, "
    "head_k_dim = 8, head_v_dim = 8, scale = 0.5, state_layout = kv, dtype = float32>\n}\n",
], ids=["garbage", "missing-properties", "unknown-op", "bad-enum", "bad-heads"])
def test_opt_bad_ir(capsys, tmp_path, text):
    path = tmp_path / "bad.mlir"
    path.write_text(text)
    code, out, err = run(capsys, "opt", path)
    assert_bad_input(code, out, err, "k3c opt", "bad.mlir")


def test_opt_missing_file(capsys, tmp_path):
    code, out, err = run(capsys, "opt", tmp_path / "nope.mlir")
    assert_bad_input(code, out, err, "nope.mlir")


def test_opt_unknown_pass(capsys, tmp_path):
    path = write_ir(capsys, tmp_path)
    code, out, err = run(capsys, "opt", path, "-p", "frobnicate")
    assert_bad_input(code, out, err, "frobnicate")
    assert out == ""


def test_opt_bad_pass_option(capsys, tmp_path):
    path = write_ir(capsys, tmp_path)
    code, out, err = run(capsys, "opt", path, "-p", "lower-recurrent{block-v=3}")
    assert_bad_input(code, out, err, "block-v")


# --- passes ---------------------------------------------------------------------------------


def test_passes_lists_every_pass_with_its_defaults(capsys):
    import dataclasses

    from k3compile.pipeline import DEFAULT_PIPELINES, available_passes

    code, out, err = run(capsys, "passes")
    assert code == 0 and err == ""
    for name, load in available_passes().items():
        assert name in out
        for field in dataclasses.fields(load()):  # every option, spelled as -p takes it, at its default
            default = str(field.default).lower() if isinstance(field.default, bool) else field.default
            assert f"{field.name.replace('_', '-')}={default}" in out, (name, field.name)
    for kind, pipeline in DEFAULT_PIPELINES.items():
        assert f"default pipeline of kind {kind}: {pipeline or 'none (no kernels: torch runs the layer)'}" in out


def test_passes_options_as_listed_are_accepted(capsys, tmp_path):
    """What `k3c passes` prints for a pass is a valid -p spelling of it."""
    import re

    code, listed, _ = run(capsys, "passes")
    row = next(line for line in listed.splitlines() if "derive-chunkwise" in line)
    options = " ".join(re.findall(r"[a-z-]+=\w+", row))
    path = write_ir(capsys, tmp_path)
    code, out, err = run(capsys, "opt", path, "-p", f"lower-recurrent,derive-chunkwise{{{options}}}")
    assert code == 0, err
    assert "k3s.chunked <chunk_size = 16>" in out


# --- verify ---------------------------------------------------------------------------------


def test_verify_tiny_spec_passes(capsys, tiny_spec, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # verify writes its modules to a temp folder
    code, out, err = run(capsys, "verify", tiny_spec, "--device", "cpu", "--dtype", "float32")
    assert code == 0, out + err
    assert "passed" in out and " 0 failed" in out
    assert "FAIL" not in out


def verified_cases(spec, shard=None) -> list[tuple]:
    from k3compile.checking.verify import verify

    return sorted((r.layer, r.entry, r.case, r.dtype, r.tensor) for r in verify(spec, device="cpu", seed=0, shard=shard))


def test_verify_shards_cover_the_grid_once(tiny_spec, tmp_path, monkeypatch):
    """--shard 0/2 and 1/2 together run exactly the unsharded run's cases, none twice. (Which
    cases run is the point here, not their numbers: each case reports one row without launching;
    test_verify_tiny_spec_passes runs the grid for real.)"""
    import dataclasses
    import tempfile

    import torch

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = load_spec(tiny_spec)
    family = verify_module.FAMILIES[spec.kind]
    one_row = lambda layer, entry, layer_op, case, dtype, device, gen: [("o", torch.ones(1), torch.ones(1))]  # noqa: E731
    monkeypatch.setitem(verify_module.FAMILIES, spec.kind, dataclasses.replace(family, run=one_row))
    first, second = verified_cases(spec, (0, 2)), verified_cases(spec, (1, 2))
    assert first and second
    assert sorted(first + second) == verified_cases(spec)


def test_verify_shard_lowers_only_its_cases(capsys, tiny_spec, tmp_path, monkeypatch):
    """The one case of shard last/N: only its layer is lowered (the point: skipped cases cost no
    compile), and the title says which shard ran."""
    import tempfile

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lowered = []
    lower = verify_module.lower
    monkeypatch.setattr(verify_module, "lower", lambda spec: lowered.append(spec.name) or lower(spec))
    grid = verify_module.grid(load_spec(tiny_spec), False, ["float32"])
    layer_spec, entry, case, _ = grid[-1]
    assert layer_spec.name != grid[0][0].name  # else the check below could not tell
    code, out, err = run(capsys, "verify", tiny_spec, "--device", "cpu", "--shard", f"{len(grid) - 1}/{len(grid)}")
    assert code == 0, out + err
    assert lowered == [layer_spec.name]
    assert f"shard {len(grid) - 1}/{len(grid)}: 1 of {len(grid)} cases" in out
    assert case.name in out and " 0 failed" in out


@pytest.mark.parametrize("shard", ["x", "1", "2/2", "3/2", "-1/2", "0/0", "1/2/3", "a/b"])
def test_verify_bad_shard(capsys, tiny_spec, shard):
    code, out, err = run(capsys, "verify", tiny_spec, "--device", "cpu", f"--shard={shard}")
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error" in line]  # argparse's usage lines before it
    assert len(errors) == 1, err
    assert "--shard" in errors[0] and repr(shard) in errors[0]


def test_verify_quick_runs_one_case_per_entry(capsys, tiny_spec, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out, err = run(capsys, "verify", tiny_spec, "--device", "cpu", "--quick")
    assert code == 0, out + err
    assert "--quick (one case per entry)" in out and " 0 failed" in out
    entries = {line.split("│")[2].strip() for line in out.splitlines() if line.count("│") > 8} - {""}
    # every entry of the module (chunk_segments through chunk(..., segments=2))
    assert entries == {"recurrent", "decode", "chunk", "segment_summary", "chunk_backward"}


def test_quick_grid_covers_varlen_initial_states_and_odd_lengths():
    """Each recurrence case of --quick is varlen with an empty and a one-token sequence and an
    odd length (or a batch with a padding row, decode), with initial states wherever the entry
    takes them; the chunk cases span several 16-token chunks with a partial one. On a CPU a
    4-head spec is verified at 2 heads, the value heads in the same ratio."""
    from k3compile.spec import spec_from_table
    from k3compile.checking.verify import grid

    spec = spec_from_table(dict(name="wide", kind="kda", num_heads=4, num_v_heads=8, head_k_dim=8, head_v_dim=8))
    cases = grid(spec, False, ["float32"], quick=True)
    assert {layer.params["num_heads"] for layer, *_ in cases} == {2}
    assert {layer.params["num_v_heads"] for layer, *_ in cases} == {4}
    assert {(layer.params["head_k_dim"], layer.params["head_v_dim"]) for layer, *_ in cases} == {(8, 8)}
    for _, entry, case, _ in cases:
        if entry == "decode":
            assert case.batch > 1 and case.initial_state  # run_decode_case pads row 1 and starts from the pool
            continue
        assert case.seqlens and sum(case.seqlens) % 2 == 1 and any(n % 2 for n in case.seqlens), case
        assert case.initial_state == (entry != "segment_summary"), case
        if entry in ("chunk", "segment_summary"):
            assert max(case.seqlens) > 16 and max(case.seqlens) % 16, case
    lengths = [case.seqlens for _, entry, case, _ in cases if entry == "recurrent"][0]
    assert 0 in lengths and 1 in lengths
    assert grid(spec, True, ["float32"], quick=True)[0][0] is spec  # on a GPU, the spec as given


@pytest.mark.parametrize("old, new, broken", [
    ("HAS_INITIAL_STATE=initial_state is not None", "HAS_INITIAL_STATE=False", {"recurrent", "chunk"}),
    ("m_c = t_c < eos", "m_c = t_c < eos - 1", {"chunk", "segment_summary"}),  # a chunk mask off by one
    ("tl.store(state + p_state, b_S.to(state.dtype.element_ty), mask=m_kv)", "pass", {"decode"}),
], ids=["initial-state-ignored", "last-token-masked", "pool-not-written"])
def test_verify_quick_catches_a_broken_kernel(tiny_spec, tmp_path, monkeypatch, old, new, broken):
    """--quick can fail: with one fault printed into the module, the entries it breaks fail."""
    import tempfile

    from k3compile.checking import verify as verify_module
    from k3compile.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    lower = verify_module.lower

    def faulty(spec):
        compilation = lower(spec)
        assert old in compilation.source
        compilation.source = compilation.source.replace(old, new)
        return compilation

    monkeypatch.setattr(verify_module, "lower", faulty)
    results = verify_module.verify(load_spec(tiny_spec), device="cpu", quick=True)
    assert broken <= {r.entry for r in results if not r.passed}


def test_verify_latent_moe_quick(capsys):
    """The MoE layer's entries at small widths of the example's structure, in the interpreter."""
    code, out, err = run(capsys, "verify", EXAMPLES / "latent_moe.toml", "--device", "cpu", "--quick")
    assert code == 0, out + err
    for entry in ("route", "moe_decode", "moe_decode_warp", "moe_prefill"):
        assert entry in out
    assert "5 passed, 0 failed" in out


def test_verify_latent_moe_mxfp4_quick(capsys):
    """MXFP4 expert weights: packed by the module, verified against dequantise-then-reference."""
    code, out, err = run(capsys, "verify", EXAMPLES / "latent_moe_mxfp4.toml", "--device", "cpu", "--quick")
    assert code == 0, out + err
    assert "latent_moe_mxfp4_small" in out and "4 passed, 0 failed" in out


def test_verify_bad_spec(capsys, bad_spec):
    code, out, err = run(capsys, "verify", bad_spec, "--device", "cpu")
    assert_bad_input(code, out, err, "head_dim")


# --- argparse -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["compile"],
    ["compile", "examples/kda.toml"],  # -o is required
    ["ir"],
    ["opt"],
    ["verify", "examples/kda.toml", "--dtype", "float64"],
    ["verify", "examples/kda.toml", "--seed", "x"],
    ["compile", "examples/kda.toml", "-o", "out", "--bogus-flag"],
])
def test_argparse_errors_exit_2(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "error" in err and "Traceback" not in err


def test_help_exits_0(capsys):
    code, out, err = run(capsys, "--help")
    assert code == 0 and "compile" in out


# --- the installed console script (one subprocess) ------------------------------------------


def test_console_script_bad_spec(tmp_path, bad_spec):
    script = Path(sys.executable).with_name("k3c")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "k3compile.cli"]
    result = subprocess.run(command + ["compile", str(bad_spec), "-o", str(tmp_path)], capture_output=True,
                            text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and one_line(lines[0]), lines
    assert str(bad_spec) in lines[0] and "head_dim" in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize("pipeline, schedule", [
    ("derive-chunkwise", "k3s.chunked"),
    ("lower-recurrent,derive-replay", "k3s.speculative"),
])
def test_compile_refuses_a_schedule_not_grouped_into_kernels(capsys, tmp_path, pipeline, schedule):
    """A module whose entry would launch nothing must not be written: exit 2, one line."""
    code = main(["compile", str(EXAMPLES / "kda.toml"), "-o", str(tmp_path), "-p", pipeline])
    err = capsys.readouterr().err
    assert code == 2 and schedule in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "kda.py").exists()


def test_internal_error_is_one_line(capsys, tmp_path, monkeypatch):
    """A bug below the CLI (here: a failing module writer) is reported in one line, exit 3 (not
    1, which says the kernels disagreed with the reference); K3C_TRACEBACK: test_cli_exits.py."""
    import k3compile.driver

    def broken(*args, **kwargs):
        raise RuntimeError("writer exploded\nsecond line")

    monkeypatch.setattr(k3compile.driver, "write_module", broken)
    assert main(["compile", str(EXAMPLES / "kda.toml"), "-o", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert one_line(err) and "internal error: RuntimeError: writer exploded" in err
