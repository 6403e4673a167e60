"""On a CUDA GPU: the numeric edges an outside test suite found, natively in fp16 and bf16.

- fp16 with bounded gates (gate_input clamped / bounded, fla's safe_gate) once returned NaN: the
  factored Gram diagonal's operands span e^80 of decay and were cast to fp16 (max 65504). Rows
  for every member with a channel gate (KDA, GLA), keys as fla's tests draw them (torch.rand:
  unnormalised for GLA and through KDA's in-kernel L2 norm, normalised outside for plain KDA),
  gates at the bound, at the shapes that failed: B2 T500 H3 K = V = 60, B4 T2048 H8 D64 and
  varlen with D256.
- negative eigenvalues (beta_input = logits_neg_eigval, beta = 2 sigmoid(b) in (0, 2)) for every
  member with the delta rule, chunk and recurrent entries, bf16 and fp16; logits ~ N(0, 1) as
  fla's tests draw beta's, so about half the tokens have beta > 1.
Each row: the compiled entry against the float64 token recurrence on the same inputs, RMS ratio
within fla's 5e-3 and every element finite — except DeltaNet's chunk entry in bf16 with negative
eigenvalues, held to 1e-2: with no gate and beta up to 2 its state never forgets, so the bf16
rounding of the chunk form (the W, U, P workspaces, the state as a bf16 product operand, the
residual) adds up over the sequence: 5.3e-3 at T = 500 on the H200 (6.1e-3 with logits 3 N(0, 1)),
against 1.7e-3 in fp16 and 1.7e-3 for its token loop. A float64 emulation of the chunk form with
bf16 rounding at those points gives 4.4e-3; rounding any one of them alone gives 2.7e-3 to 3.9e-3,
so it is bf16's, not the schedule's (which k3c prove checks exactly).
Skipped without CUDA; run in a fresh process (the CPU tests' conftest turns Triton's interpreter
on, see tests/test_gpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SCRIPT = r"""
import json, pathlib, sys
import torch, torch.nn.functional as F
import k3compile
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import spec_from_table

out, seed = pathlib.Path(sys.argv[1]), int(sys.argv[2])
gen = torch.Generator(device="cuda").manual_seed(seed)
rows = []

def rand(*shape):
    return torch.rand(*shape, generator=gen, device="cuda")

def layer_of(kind, H, K, **options):
    name = "_".join([kind, f"h{H}", f"k{K}", *(f"{k}_{v}".replace("-", "m").replace(".", "p") for k, v in options.items())])
    spec = spec_from_table(dict(name=name, kind=kind, num_heads=H, head_k_dim=K, head_v_dim=K, **options))
    return k3compile.compile(spec, out_dir=out / name), next(iter(spec_to_module(spec).ops))

def run(what, layer, op, entry, inputs, dtype):
    inputs = {n: x.to(dtype) if n not in ("A_log", "dt_bias", "initial_state", "cu_seqlens") else x
              for n, x in inputs.items()}
    o, final = getattr(layer, entry)(**inputs, output_final_state=True)
    ref_o, ref_final = reference.recurrence(op, **inputs, output_final_state=True)
    for tensor, got, ref in (("o", o, ref_o), ("final_state", final, ref_final)):
        got, ref = got.double().cpu(), ref.double().cpu()
        finite = bool(torch.isfinite(got).all())
        error = ((got - ref).norm() / ref.norm()).item() if finite else float("nan")
        rows.append(dict(case=f"{what} {entry} {str(dtype)[6:]} {tensor}", rms=error, finite=finite))

def gated_inputs(kind, B, T, H, K, gate_input, qk_l2norm, cu_seqlens=None):
    q, k, v = rand(B, T, H, K), rand(B, T, H, K), rand(B, T, H, K)
    if kind == "kda" and not qk_l2norm:  # the delta rule needs |k| <= 1: fla's tests normalise
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    inputs = dict(q=q, k=k, v=v)
    if gate_input == "clamped":  # at the bound and below it (the kernel clamps)
        inputs["g"] = -5.0 - rand(B, T, H, K)
    else:  # saturated projections: g near the bound
        inputs.update(g=20 + rand(B, T, H, K), A_log=torch.zeros(H, device="cuda"),
                      dt_bias=torch.zeros(H * K, device="cuda"))
    if kind == "kda":
        inputs["beta"] = rand(B, T, H)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    inputs["initial_state"] = torch.randn(N, H, K, K, generator=gen, device="cuda")
    if cu_seqlens is not None:
        inputs["cu_seqlens"] = torch.tensor(cu_seqlens, device="cuda")
    return inputs

# fp16 (and bf16 beside it) with gates at the bound, at the shapes that returned NaN
for kind, gate_input, qk_l2norm in (("kda", "clamped", False), ("kda", "bounded", True), ("gla", "clamped", False)):
    for B, T, H, K, cu in ((2, 500, 3, 60, None), (4, 2048, 8, 64, None), (1, 4096, 4, 256, [0, 100, 300, 1200, 3000, 4096])):
        layer, op = layer_of(kind, H, K, gate_input=gate_input, qk_l2norm=qk_l2norm)
        inputs = gated_inputs(kind, B, T, H, K, gate_input, qk_l2norm, cu)
        shape = f"B{B} T{T} H{H} D{K}" + (" varlen" if cu else "")
        for dtype in (torch.float16, torch.bfloat16):
            run(f"{kind} {gate_input}{' l2norm' if qk_l2norm else ''} {shape}", layer, op, "chunk", inputs, dtype)

# negative eigenvalues: beta = 2 sigmoid(b), every delta-rule member, both entries
for kind in ("kda", "gated_deltanet", "deltanet"):
    B, T, H, K = 2, 500, 3, 64
    layer, op = layer_of(kind, H, K, beta_input="logits_neg_eigval")
    inputs = dict(q=F.normalize(torch.randn(B, T, H, K, generator=gen, device="cuda"), dim=-1),
                  k=F.normalize(torch.randn(B, T, H, K, generator=gen, device="cuda"), dim=-1),
                  v=torch.randn(B, T, H, K, generator=gen, device="cuda"),
                  beta=torch.randn(B, T, H, generator=gen, device="cuda"),
                  initial_state=torch.randn(B, H, K, K, generator=gen, device="cuda"))
    if kind == "kda":
        inputs["g"] = F.logsigmoid(torch.randn(B, T, H, K, generator=gen, device="cuda")).clamp(min=-5)
    elif kind == "gated_deltanet":
        inputs["g"] = F.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda"))
    for entry in ("chunk", "recurrent"):
        for dtype in (torch.float16, torch.bfloat16):
            run(f"{kind} neg_eigval B{B} T{T} H{H} D{K}", layer, op, entry, inputs, dtype)
print(json.dumps(rows))
"""


def tolerance(case: str) -> float:
    """fla's 5e-3; 1e-2 for the one row class whose state never forgets in bf16 (docstring)."""
    return 1e-2 if case.startswith("deltanet neg_eigval") and " chunk bfloat16 " in case else 5e-3


def test_half_precision_edges_on_cuda(tmp_path, fresh_seed):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "K3C_POISON_OUTPUTS")}
    env["K3C_POISON_OUTPUTS"] = "1"  # outputs start NaN-filled: an unwritten element cannot pass
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(fresh_seed)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    print("\n".join(f"{r['case']}: rms {r['rms']:.2e}{'' if r['finite'] else ' NOT FINITE'}" for r in rows))
    assert len(rows) == 3 * 3 * 2 * 2 + 3 * 2 * 2 * 2
    failed = [f"{r['case']}: rms {r['rms']:.2e}" for r in rows if not (r["finite"] and r["rms"] <= tolerance(r["case"]))]
    assert not failed, "\n".join(failed)
