"""`k3c verify`'s gradient cases: each recurrence's `chunk_backward` against float64 autograd of
the reference (k3compile/checking/verify_backward.py), one table row per gradient.

The grids are checked without lowering anything; the runs pick the gradient cases out of the
grid with --shard (a case's position p: shard p/N runs it alone) and run them in Triton's
interpreter, fp32. Broken gradients (a perturbed dk, a missing one, a kernel that ignores dht)
must fail the rows of the gradients they break.
"""

from __future__ import annotations

import tempfile

import pytest
import torch

from conftest import EXAMPLES, RECURRENCE_KINDS, one_line, run_cli
from k3compile.spec import load_spec, spec_from_table
from k3compile.checking.verify import grid, verify
from k3compile.checking.verify_backward import gradient_tolerance

GRADIENTS = {  # the rows of each example's gradient cases, in chunk_backward's order
    "kda": ["dq", "dk", "dv", "dg", "dbeta", "dh0"],
    "gated_deltanet": ["dq", "dk", "dv", "dg", "dbeta", "dh0"],
    "deltanet": ["dq", "dk", "dv", "dbeta", "dh0"],
    "gla": ["dq", "dk", "dv", "dg", "dh0"],
}


@pytest.fixture(autouse=True)
def temporary_modules(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # verify writes its modules to a temp folder


def gradient_cases(spec, on_gpu: bool, quick: bool = False) -> list[tuple]:
    return [(layer, case) for layer, entry, case, _ in grid(spec, on_gpu, ["float32"], quick)
            if entry == "chunk_backward"]


def gradient_shard(spec) -> tuple[int, int]:
    """The --shard of the quick grid that runs its chunk_backward case alone."""
    entries = [entry for _, entry, _, _ in grid(spec, False, ["float32"], quick=True)]
    assert entries.count("chunk_backward") == 1
    return entries.index("chunk_backward"), len(entries)


# --- the grids ------------------------------------------------------------------------------


@pytest.mark.parametrize("member", RECURRENCE_KINDS)
def test_grids_cover_the_gradient_cases(member):
    """Every recurrence example's grid has gradient cases: odd lengths over several chunks of 16
    with a partial one, varlen with an empty and a one-token sequence, an initial state with dht
    and a zero start without, grouped value heads (the spec's or a variant's). On a CPU the
    layers have 2 heads, on a GPU the spec's size; --quick has one gradient case."""
    spec = load_spec(EXAMPLES / f"{member}.toml")
    for on_gpu in (False, True):
        cases = gradient_cases(spec, on_gpu)
        lengths = [n for _, case in cases for n in (case.seqlens or (case.length,))]
        assert any(n > 32 and n % 2 for n in lengths), lengths
        assert any(case.seqlens and {0, 1} <= set(case.seqlens) for _, case in cases)
        assert any(case.initial_state and case.dht for _, case in cases)
        assert any(not case.initial_state and not case.dht for _, case in cases)
        assert any(layer.params["num_v_heads"] > layer.params["num_heads"] for layer, _ in cases)
        heads = {layer.params["num_heads"] for layer, _ in cases}
        assert heads == ({spec.params["num_heads"]} if on_gpu else {2})
        if on_gpu:
            assert cases[0][0] is spec
    (quick,) = gradient_cases(spec, False, quick=True)
    assert quick[1].initial_state and quick[1].dht and {0, 1} <= set(quick[1].seqlens)


def test_gpu_grid_has_every_variant_and_steep_gates():
    """On a GPU the gradients are verified on the forward's variants too (negative eigenvalues,
    head dims that are not powers of two, the clamped gate's factored contractions) and with
    gates steep enough for the elementwise contractions."""
    spec = load_spec(EXAMPLES / "kda.toml")
    names = {layer.name for layer, _ in gradient_cases(spec, True)}
    assert names == {"kda", "kda_grouped", "kda_neg_eigval", "kda_npow2", "kda_clamped"}
    assert any(case.steep_from is not None for _, case in gradient_cases(spec, True))


def test_gradient_tolerances():
    """fp32: tight (the interpreter gets ~1e-7); bf16 and fp16: fla's, per gradient."""
    for name in ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"):
        assert gradient_tolerance(name, torch.float32) == 1e-4
    for dtype in (torch.bfloat16, torch.float16):
        assert [gradient_tolerance(n, dtype) for n in ("dq", "dk", "dv")] == [8e-3] * 3
        assert [gradient_tolerance(n, dtype) for n in ("dg", "dbeta", "dA_log", "ddt_bias")] == [2e-2] * 4
        assert gradient_tolerance("dh0", dtype) == 5e-3


# --- runs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("member", RECURRENCE_KINDS)
def test_verify_gradient_rows_pass(capsys, member):
    """`k3c verify EXAMPLE --quick` at its gradient case: a row per gradient, named
    chunk_backward and the gradient, each within the fp32 tolerance."""
    path = EXAMPLES / f"{member}.toml"
    index, count = gradient_shard(load_spec(path))
    code, out, err = run_cli(capsys, "verify", path, "--device", "cpu", "--quick", "--shard", f"{index}/{count}")
    assert code == 0, out + err
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") > 8]
    named = [(row[1], row[4]) for row in rows if row[4]]
    assert named == [("chunk_backward", gradient) for gradient in GRADIENTS[member]]
    assert f"{len(GRADIENTS[member])} passed, 0 failed" in out


def test_verify_gate_parameter_gradients():
    """An in-kernel gate (softplus) and beta logits with the in-kernel l2norm: dA_log and
    ddt_bias are rows too, and every gradient passes through the input forms' chain rule."""
    spec = spec_from_table(dict(name="kda_forms", kind="kda", num_heads=2, head_k_dim=16, head_v_dim=8,
                                qk_l2norm=True, gate_input="softplus", beta_input="logits", dtype="float32"))
    results = verify(spec, device="cpu", quick=True, shard=gradient_shard(spec))
    assert [r.tensor for r in results] == ["dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"]
    assert all(r.passed for r in results), [(r.tensor, r.rms_ratio) for r in results if not r.passed]


def broken_layers(monkeypatch, break_gradients):
    """verify's layers with chunk_backward's gradients passed through break_gradients(tuple)."""
    from k3compile.checking import verify as verify_module

    make_layer = verify_module.CompiledLayer

    def broken(compilation, path):
        layer = make_layer(compilation, path)
        entry = layer.module.chunk_backward
        monkeypatch.setattr(layer.module, "chunk_backward", lambda *a, **kw: break_gradients(entry(*a, **kw)))
        return layer

    monkeypatch.setattr(verify_module, "CompiledLayer", broken)


def test_verify_fails_a_perturbed_gradient(capsys, monkeypatch):
    """dk off by 1e-3 relative (ten times the fp32 tolerance): its row fails, the others pass,
    and k3c verify exits 1."""
    path = EXAMPLES / "gated_deltanet.toml"
    broken_layers(monkeypatch, lambda grads: (grads[0], grads[1] * (1 + 1e-3), *grads[2:]))
    index, count = gradient_shard(load_spec(path))
    code, out, err = run_cli(capsys, "verify", path, "--device", "cpu", "--quick", "--shard", f"{index}/{count}")
    assert code == 1, out + err
    failed = [line for line in out.splitlines() if "FAIL" in line]
    assert len(failed) == 1 and "chunk_backward" in failed[0] and "│ dk " in failed[0], failed
    assert "5 passed, 1 failed" in out


def test_verify_fails_a_missing_gradient(monkeypatch):
    """A gradient the entry returns as None fails its row (it is not an internal error)."""
    spec = load_spec(EXAMPLES / "gla.toml")
    broken_layers(monkeypatch, lambda grads: (grads[0], None, *grads[2:]))
    results = verify(spec, device="cpu", quick=True, shard=gradient_shard(spec))
    assert [r.tensor for r in results if not r.passed] == ["dk"]


def test_verify_fails_a_kernel_that_ignores_dht(monkeypatch):
    """A fault printed into the module (the cotangent scan starts from zero, not dht): dh0 fails,
    and so does every gradient that the final state's cotangent reaches: all but dq, which reads
    only do and the states."""
    from k3compile.checking import verify as verify_module

    lower = verify_module.lower

    def faulty(spec):
        compilation = lower(spec)
        assert "HAS_DHT=dht is not None" in compilation.source
        compilation.source = compilation.source.replace("HAS_DHT=dht is not None", "HAS_DHT=False")
        return compilation

    monkeypatch.setattr(verify_module, "lower", faulty)
    spec = load_spec(EXAMPLES / "kda.toml")
    results = verify(spec, device="cpu", quick=True, shard=gradient_shard(spec))
    assert {r.tensor for r in results if not r.passed} == set(GRADIENTS["kda"]) - {"dq"}


@pytest.mark.parametrize("argv, words", [
    (["--dtype", "float32", "--seed", str(2**64)], ["seed"]),
    (["--device", "tpu"], ["device", "tpu"]),
], ids=["seed", "device"])
def test_verify_bad_input_one_line(capsys, argv, words):
    """Bad input to a recurrence spec's verify (its gradient cases included) exits 2 with one line."""
    code, _, err = run_cli(capsys, "verify", EXAMPLES / "kda.toml", "--quick", *argv)
    assert code == 2 and "Traceback" not in err and one_line(err), err
    assert all(word in err for word in words), err
