"""On a CUDA GPU: the derived backward's gradients are causal in bf16, bit for bit.

KDA at K = V = 128, B = 1, T = 1001, bf16: changing the output cotangent do at the positions
before t0 (mid-chunk) must leave every input gradient (dq, dk, dv, dg, dbeta) at the positions
from t0 on bit-identical (torch.equal), and must change them before t0. The gradient of position
t reads do only from t on, so on the GPU too nothing may leak backwards: not through a mask
applied after a tensor-core product, nor through an accumulation whose order depends on values
it should not read. (tests/test_backward.py checks the same in the interpreter, fp32; `k3c
verify` checks the gradients' values, tests/test_gpu.py runs it on the GPU.)

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

T, T0 = 1001, 517  # 517 = 32 * 16 + 5: inside a chunk at chunk sizes 16, 32 and 64

SCRIPT = r"""
import json, pathlib, sys
import torch
import k3compile
from k3compile.frontend import spec_to_module
from k3compile.spec import spec_from_table
from k3compile.checking.verify import RecurrenceCase, recurrence_inputs
from k3compile.checking.verify_backward import chunk_backward_gradients, draw_cotangents

out, seed, T, t0 = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
spec = spec_from_table(dict(name="kda_causal", kind="kda", num_heads=4, head_k_dim=128, head_v_dim=128,
                            dtype="bfloat16"))
layer = k3compile.compile(spec, out_dir=out)
op = next(iter(spec_to_module(spec).ops))
gen = torch.Generator().manual_seed(seed)
inputs = recurrence_inputs(op, RecurrenceCase("causality", 1, T), torch.bfloat16, "cuda", gen)
do, _ = draw_cotangents(op, inputs, False, gen)
changed = do.clone()
changed[:, :t0] = torch.randn(changed[:, :t0].shape, generator=gen).to(changed)
first = chunk_backward_gradients(layer.module, inputs, do, None, output_dh0=False)
second = chunk_backward_gradients(layer.module, inputs, changed, None, output_dh0=False)
rows = []
for name in ("q", "k", "v", "g", "beta"):
    a, b = first[name], second[name]
    rows.append(dict(gradient="d" + name, finite=bool(torch.isfinite(a).all() and torch.isfinite(b).all()),
                     equal_from_t0=torch.equal(a[:, t0:], b[:, t0:]),
                     max_change_from_t0=(a[:, t0:] - b[:, t0:]).abs().max().item(),
                     changed_before_t0=not torch.equal(a[:, :t0], b[:, :t0])))
print(json.dumps(rows))
"""


def test_kda_gradients_causal_in_bf16(tmp_path, fresh_seed):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "K3C_POISON_OUTPUTS")}
    env["K3C_POISON_OUTPUTS"] = "1"  # workspaces start NaN-filled: a read of an unwritten element shows
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(fresh_seed), str(T), str(T0)],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    rows = json.loads(result.stdout.strip().splitlines()[-1])
    print("\n".join(f"{r['gradient']}: max change from t0 {r['max_change_from_t0']:.2e}" for r in rows))
    assert [r["gradient"] for r in rows] == ["dq", "dk", "dv", "dg", "dbeta"]
    assert all(r["finite"] for r in rows), rows
    leaked = [f"{r['gradient']} (max change {r['max_change_from_t0']:.2e})" for r in rows if not r["equal_from_t0"]]
    assert not leaked, f"gradients at positions >= {T0} depend on do before {T0}: " + ", ".join(leaked)
    assert all(r["changed_before_t0"] for r in rows), "a gradient before t0 did not see the change of do there"
