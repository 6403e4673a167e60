"""k3compile.ops: what every function refuses (one line naming the argument), gradients through the
recurrent forms, and the layer caches (Triton interpreter, fp32; tests/ops_cases.py's inputs).
Outputs are NaN-poisoned (K3C_POISON_OUTPUTS); the ops' cache lives in a temporary K3C_CACHE_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, one_line
from k3compile import ops
from k3compile.ops import layers
from ops_cases import (FLA_SIGNATURES, K, MODULES, RECURRENT_TOL, SEQLENS, V, assert_close, draw, expected, op_of,
                       raw_beta, raw_gate_inputs, raw_qk, reversed_sequences)

pytestmark = pytest.mark.usefixtures("own_ops_cache")

# --- every keyword: rejected ones name themselves ----------------------------------------------------

KDA, GDN, DELTA, GLA = "kda", "gated_deltanet", "deltanet", "gla"
ARGUMENT_ERRORS = [
    # (function, kind of the inputs, extra arguments, exception, what the message names)
    ("chunk_kda", KDA, dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_kda", KDA, dict(use_graph=True), NotImplementedError, "use_graph"),
    ("chunk_kda", KDA, dict(max_num_seqs=4), NotImplementedError, "max_num_seqs"),
    ("chunk_kda", KDA, dict(disable_recompute=True, return_intermediate_states=True), ValueError, "disable_recompute"),
    ("chunk_kda", KDA, dict(head_first=False), TypeError, "head_first"),  # fla's chunk_kda never reads it
    ("chunk_kda", KDA, dict(chunk_sz=32), TypeError, "chunk_sz"),
    ("chunk_kda", KDA, dict(allow_neg_eigval=True), ValueError, "use_beta_sigmoid_in_kernel"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True), ValueError, "A_log"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, safe_gate=True, A_log=torch.zeros(2)), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-6.0), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(use_gate_in_kernel=True, lower_bound=0.5), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(safe_gate=True, lower_bound=float("nan")), ValueError, "lower_bound"),
    ("chunk_kda", KDA, dict(A_log=torch.zeros(2)), ValueError, "A_log"),
    ("chunk_kda", KDA, dict(chunk_size=16), ValueError, "`chunk_size` must be either 32 or 64 for KDA, got 16"),
    ("chunk_kda", KDA, dict(initial_state=torch.zeros(2, 2, K, V, dtype=torch.bfloat16)), ValueError, "float32"),
    ("chunk_kda", KDA, dict(return_intermediate_states=True), ValueError, "inference mode"),
    ("chunk_kda", KDA, dict(cu_seqlens=torch.tensor([0, 3, 5])), ValueError, "batch size"),
    ("chunk_kda", KDA, dict(cu_seqlens_cpu=torch.tensor([0, 5])), ValueError, "cu_seqlens_cpu"),
    ("chunk_kda", KDA, dict(q=torch.randn(2, 5, 2, 257), k=torch.randn(2, 5, 2, 257)), ValueError, "256"),
    ("fused_recurrent_kda", KDA, dict(safe_gate=True), TypeError, "safe_gate"),
    ("fused_recurrent_kda", KDA, dict(dt_bias=torch.zeros(2 * K)), ValueError, "dt_bias"),
    ("chunk_gated_delta_rule", GDN, dict(head_first=True), NotImplementedError, "head_first"),
    ("chunk_gated_delta_rule", GDN, dict(cp_context=object()), NotImplementedError, "cp_context"),
    ("chunk_gated_delta_rule", GDN, dict(chunk_size=128), ValueError, "`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got 128"),
    ("chunk_gated_delta_rule", GDN, dict(use_gate_in_kernel=True), ValueError, "A_log"),
    ("chunk_gated_delta_rule", GDN, dict(chunk_indices=torch.zeros(3, 2)), ValueError, "chunk_indices"),
    ("chunk_gated_delta_rule", GDN, dict(gk=None), TypeError, "gk"),
    ("chunk_gated_delta_rule", GDN, dict(v=torch.randn(2, 5, 3, V)), ValueError, "num_v_heads (HV=3)"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(gv=torch.zeros(2, 5, 2, V)), NotImplementedError, "gv"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(use_gate_in_kernel=True, A_log=torch.zeros(2),
                                                   gk=torch.zeros(2, 5, 2, K)), NotImplementedError, "gk"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(use_gate_in_kernel=True, g=None, A_log=torch.zeros(2)),
     ValueError, "`g`"),
    ("fused_recurrent_gated_delta_rule", GDN, dict(safe_gate=True), TypeError, "safe_gate"),
    ("chunk_delta_rule", DELTA, dict(head_first=True), NotImplementedError, "head_first"),
    ("chunk_delta_rule", DELTA, dict(v=torch.zeros(2, 5, 2, V, dtype=torch.float16)), ValueError, "dtype"),
    ("chunk_delta_rule", DELTA, dict(state_v_first=True), TypeError, "state_v_first"),
    ("fused_recurrent_delta_rule", DELTA, dict(scale=-1.0), ValueError, "scale"),
    ("fused_recurrent_delta_rule", DELTA, dict(chunk_size=16), TypeError, "chunk_size"),
    ("chunk_gla", GLA, dict(initial_state=torch.zeros(2, 2, K, V, dtype=torch.bfloat16)), ValueError, "float32"),
    ("chunk_gla", GLA, dict(reverse=True), TypeError, "reverse"),
    # o would come back in q's dtype where fla's is v's: refused, never a silent precision change
    ("chunk_kda", KDA, dict(k=torch.randn(2, 5, 2, K, dtype=torch.bfloat16)), ValueError, "one dtype"),
    ("chunk_gated_delta_rule", GDN, dict(v=torch.randn(2, 5, 2, V, dtype=torch.float16)), ValueError, "one dtype"),
    ("fused_recurrent_kda", KDA, dict(q=torch.randn(2, 5, 2, K, dtype=torch.bfloat16)), ValueError, "one dtype"),
    ("fused_recurrent_gla", GLA, dict(gv=torch.zeros(2, 5, 2, V)), NotImplementedError, "gv"),
    ("fused_recurrent_gla", GLA, dict(use_gate_in_kernel=True), TypeError, "use_gate_in_kernel"),
]


def kind_of(function: str) -> str:
    module = next(module for module, names in MODULES.items() if function in names)
    return {"kda": KDA, "gated_delta_rule": GDN, "delta_rule": DELTA, "gla": GLA}[module]


def call_inputs(function: str, kind: str) -> dict:
    x = draw(kind, B=2, T=5, initial_state=False)
    if function.startswith("fused_recurrent_gla"):
        x["gk"] = x.pop("g")
    return x


@pytest.mark.parametrize("function,kind,extra,error,name", ARGUMENT_ERRORS,
                         ids=[f"{c[0]}-{next(iter(c[2]))}-{c[3].__name__}" for c in ARGUMENT_ERRORS])
def test_bad_arguments_name_themselves(function, kind, extra, error, name):
    with pytest.raises(error) as info:
        getattr(ops, function)(**{**call_inputs(function, kind), **extra})
    message = str(info.value)
    assert name in message and one_line(message), message


@pytest.mark.parametrize("name", ["chunk_kda", "fused_recurrent_gla"])
def test_varlen_needs_one_initial_state_per_sequence(name):
    x = draw(kind_of(name), seqlens=SEQLENS)
    x["initial_state"] = x["initial_state"][:3]
    if name == "fused_recurrent_gla":
        x["gk"] = x.pop("g")
    with pytest.raises(ValueError, match="i.e., 4 rather than 3"):
        getattr(ops, name)(**x)


def test_every_kwargs_function_rejects_unknown_keywords():
    for name in FLA_SIGNATURES:
        with pytest.raises(TypeError, match="not_an_fla_keyword"):
            getattr(ops, name)(**call_inputs(name, kind_of(name)), not_an_fla_keyword=1)


@pytest.mark.parametrize("name", sorted(n for n in FLA_SIGNATURES if n.startswith("fused_recurrent")))
def test_recurrent_functions_differentiate_through_the_chunk_entry(name):
    """fused_recurrent_* have no backward of their own: under autograd they run the chunk function
    of the same arguments (the same function, with a derived backward), as fla's tests expect when
    they take a recurrent function's gradients for a reference. Gradients of every input against
    float64 autograd of the reference, at an odd length with initial states."""
    kind = kind_of(name)
    x = draw(kind, B=2, T=7)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    args = {**x, **leaves}
    if name == "fused_recurrent_gla":
        args["gk"] = args.pop("g")
    o, final = getattr(ops, name)(**args, output_final_state=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    ref_o, ref_final = expected(op_of(kind), {**x, **references})
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), f"d{n}"
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"{name}: d{n} relative error {error:.2e}"


def test_recurrent_gated_delta_rule_in_kernel_gate_differentiates():
    """The in-kernel gate (A_log, dt_bias) and beta logits travel to the chunk function: every
    gradient, the gate's parameters included, against float64 autograd of the reference."""
    x = raw_beta(raw_qk(raw_gate_inputs(draw("gated_deltanet", B=2, T=7), channel=False)))
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    o, final = ops.fused_recurrent_gated_delta_rule(**{**x, **leaves}, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                                    use_beta_sigmoid_in_kernel=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    oracle = op_of("gated_deltanet", qk_l2norm=True, gate_input="softplus", beta_input="logits")
    ref_o, ref_final = expected(oracle, {**x, **references})
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


@pytest.mark.parametrize("varlen", [False, True], ids=["batch", "varlen"])
def test_recurrent_gla_reverse_differentiates(varlen):
    """GLA's reverse under autograd: the chunk function over the sequences reversed in time; every
    gradient against float64 autograd of the reference on the reversed inputs."""
    lengths = SEQLENS if varlen else None
    x = draw("gla", B=1 if varlen else 2, T=7, seqlens=lengths)
    leaves = {n: t.clone().requires_grad_() for n, t in x.items() if t.is_floating_point()}
    args = {**x, **leaves}
    args["gk"] = args.pop("g")
    o, final = ops.fused_recurrent_gla(**args, output_final_state=True, reverse=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    flip = (lambda t: reversed_sequences(t, lengths)) if varlen else (lambda t: t.flip(1))
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    flipped = {**x, **references, **{n: flip(references[n]) for n in ("q", "k", "v", "g")}}
    ref_o, ref_final = expected(op_of("gla"), flipped)
    ((flip(ref_o) * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


@pytest.mark.parametrize("gates", ["gk", "g+gk"])
def test_recurrent_gated_delta_rule_channel_gate_differentiates(gates):
    """fused_recurrent_gated_delta_rule with gk is KDA (log-decay gk + g with both): under autograd
    chunk_kda runs; gradients of q, k, v, beta, the gates and the state against float64 autograd."""
    x = draw("kda", B=2, T=9, HV=4)
    leaves = {n: x[n].clone().requires_grad_() for n in ("q", "k", "v", "beta", "initial_state")}
    leaves["gk"] = x["g"].clone().requires_grad_()
    if gates == "g+gk":
        leaves["g"] = F.logsigmoid(torch.randn(2, 9, 4)).requires_grad_()
    o, final = ops.fused_recurrent_gated_delta_rule(**leaves, output_final_state=True)
    do, dfinal = torch.randn_like(o), torch.randn_like(final)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    references = {n: t.detach().double().requires_grad_() for n, t in leaves.items()}
    decay = references["gk"] + (references["g"][..., None] if gates == "g+gk" else 0)
    ref = {**{n: references[n] for n in ("q", "k", "v", "beta", "initial_state")}, "g": decay}
    ref_o, ref_final = expected(op_of("kda", HV=4), ref)
    ((ref_o * do.double()).sum() + (ref_final * dfinal.double()).sum()).backward()
    for n, leaf in leaves.items():
        error = ((leaf.grad.double() - references[n].grad).norm() / references[n].grad.norm()).item()
        assert error < 1e-4, f"d{n} relative error {error:.2e}"


def test_recurrent_forms_without_a_chunk_function_refuse_grad():
    """A state pool (ssm_state_indices) has no chunk function: under autograd it is a one-line
    NotImplementedError."""
    x = call_inputs("fused_recurrent_kda", KDA)
    x["v"] = x["v"].requires_grad_()
    pool = torch.randn(4, 2, K, V)
    with pytest.raises(NotImplementedError) as info:
        ops.fused_recurrent_kda(**x, initial_state=pool, ssm_state_indices=torch.tensor([2, 0]))
    assert "v requires grad" in str(info.value) and one_line(str(info.value))


def test_requires_grad_runs_under_no_grad():
    x = draw("gated_deltanet", B=2, T=5)
    x["q"].requires_grad_()
    with torch.no_grad():
        got = ops.fused_recurrent_gated_delta_rule(**x, output_final_state=True)
    assert_close(got, expected(op_of("gated_deltanet"), x), RECURRENT_TOL)


# --- the caches --------------------------------------------------------------------------------------


def test_new_batch_length_and_scale_reuse_the_layer(monkeypatch):
    """Once compiled, a layer serves every B, T and scale: lowering must not run again."""
    from k3compile import driver

    x = draw("gated_deltanet", B=2, T=5)
    ops.fused_recurrent_gated_delta_rule(**x)
    compiled = len(layers._LOADED)

    def no_lowering(*args, **kwargs):
        raise AssertionError("recompiled for a new batch size, length or scale")

    monkeypatch.setattr(driver, "lower", no_lowering)
    y = draw("gated_deltanet", B=3, T=8)
    got = ops.fused_recurrent_gated_delta_rule(**y, scale=0.7, output_final_state=True)
    assert_close(got, expected(op_of("gated_deltanet"), {**y, "scale": 0.7}), RECURRENT_TOL)
    assert len(layers._LOADED) == compiled


def test_compiler_fingerprint_follows_the_source(tmp_path, monkeypatch):
    """An edited compiler gives another fingerprint, hence another module name and file."""
    (tmp_path / "pass.py").write_text("x = 1\n")
    first = layers.source_fingerprint([tmp_path])
    (tmp_path / "pass.py").write_text("x = 2\n")
    assert layers.source_fingerprint([tmp_path]) != first
    key = layers.LayerKey("kda", 2, 2, K, V)
    name = key.module_name()
    monkeypatch.setattr(layers, "compiler_fingerprint", lambda: "edited")
    assert key.module_name() != name and key.module_name().isidentifier()


def test_cache_dir_is_a_folder_of_the_drivers():
    from k3compile.driver import default_cache_dir

    assert layers.cache_dir() == default_cache_dir() / "ops"


WARM_PROCESS = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from k3compile.ops import fused_recurrent_kda
    from k3compile.ops import layers
    inputs = torch.load(sys.argv[1])
    o, final = fused_recurrent_kda(**inputs, output_final_state=True)
    torch.save({"o": o, "final": final, "xdsl": "xdsl" in sys.modules,
                "files": sorted(p.name for p in layers.cache_dir().glob("*.py"))}, sys.argv[2])
""")


def test_second_process_imports_from_disk_without_xdsl(tmp_path, monkeypatch):
    """A cold cache: this process compiles and writes the module; a second process with the same
    cache imports k3compile.ops and the module without xDSL (nothing compiled) and computes the
    same outputs, which match the reference. (The cold side in this process, which has xDSL
    imported anyway: one process start, not two.)"""
    x = draw("kda", B=2, T=6)
    torch.save(x, tmp_path / "inputs.pt")
    monkeypatch.setenv("K3C_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(layers, "_LOADED", {})
    assert not layers.cache_dir().exists()
    o, final = ops.fused_recurrent_kda(**x, output_final_state=True)
    cold = {"o": o, "final": final, "files": sorted(p.name for p in layers.cache_dir().glob("*.py"))}
    result = subprocess.run([sys.executable, "-c", WARM_PROCESS, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
                            env=dict(os.environ), capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    warm = torch.load(tmp_path / "out.pt")
    assert not warm["xdsl"], "the warm process must not import xDSL"
    assert len(cold["files"]) == 1 and warm["files"] == cold["files"]
    assert torch.equal(cold["o"], warm["o"]) and torch.equal(cold["final"], warm["final"])
    assert_close((warm["o"], warm["final"]), expected(op_of("kda"), x), RECURRENT_TOL)
