"""On CUDA GPUs: context parallelism natively (docs/context-parallel.md). `chunk(..., segments=P)`
against the float64 recurrence and the plain entry in bf16 and fp32 on one GPU, and
examples/cp_torchrun.py over 2 GPUs (NCCL) against the single-device call.

Skipped without CUDA (the 2-GPU test without a second GPU). On the GPU machine: `pytest -m gpu
tests`. Each run is a fresh process: this test session runs Triton's interpreter (see
tests/test_gpu.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import EXAMPLES, REPO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SEGMENTS_SCRIPT = """
import json, sys
import torch, torch.nn.functional as F
import k3compile
from k3compile.frontend import spec_to_module
from k3compile.ir import reference
from k3compile.spec import load_spec
from k3compile.checking.verify import tolerance

spec = load_spec(sys.argv[1])
dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[sys.argv[2]]
layer = k3compile.compile(spec, out_dir=sys.argv[3])
layer.module.POISON_OUTPUTS = True
op = next(iter(spec_to_module(spec).ops))
H, HV, K, V = op.num_heads.value.data, op.num_v_heads.value.data, op.head_k_dim.value.data, op.head_v_dim.value.data
gate, delta = op.gate.data, bool(op.delta_rule.value.data)
rows = []
for seqlens in ((1024,), (700, 37, 0, 1300)):
    T = sum(seqlens)
    x = dict(q=F.normalize(torch.randn(1, T, H, K, device="cuda"), dim=-1).to(dtype),
             k=F.normalize(torch.randn(1, T, H, K, device="cuda"), dim=-1).to(dtype),
             v=torch.randn(1, T, HV, V, device="cuda").to(dtype))
    if gate != "none":
        g = torch.randn(1, T, HV, K, device="cuda") if gate == "channel" else torch.randn(1, T, HV, device="cuda")
        x["g"] = F.logsigmoid(g).clamp(min=-5) / 20  # fp32; slow decays: entering states matter
    if delta:
        x["beta"] = torch.sigmoid(torch.randn(1, T, HV, device="cuda")).to(dtype)
    state = (HV, K, V) if op.state_layout.data == "kv" else (HV, V, K)
    x["initial_state"] = 0.1 * torch.randn(len(seqlens), *state, device="cuda")
    x["cu_seqlens"] = torch.tensor([0] + [sum(seqlens[:i + 1]) for i in range(len(seqlens))], device="cuda")
    ref_o, ref_s = reference.recurrence(op, **x, output_final_state=True)
    plain = layer.chunk(**x, output_final_state=True)
    for P in (1, 2, 4, 16):
        o, s = layer.chunk(**x, output_final_state=True, segments=P)
        rms = lambda a, b: ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()
        rows.append(dict(seqlens=seqlens, P=P, o=rms(o, ref_o), state=rms(s, ref_s), o_plain=rms(o, plain[0]),
                         finite=bool(torch.isfinite(o).all() and torch.isfinite(s).all()),
                         tolerance=tolerance("chunk", dtype)))
print(json.dumps(rows))
"""


@pytest.mark.parametrize("example", ["kda", "gated_deltanet", "gla"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_segments_on_cuda(example, dtype, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SEGMENTS_SCRIPT, str(EXAMPLES / f"{example}.toml"), dtype,
                           str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    bad = [r for r in rows if not r["finite"] or r["o"] > r["tolerance"] or r["state"] > r["tolerance"]]
    assert not bad, bad


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_torchrun_example(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           str(REPO / "examples" / "cp_torchrun.py"), "--device", "cuda", "--heads", "16", "--dim",
                           "128", "--tokens-per-rank", "8192", "--segments", "2"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if "RMS vs one device" in line]
    assert len(lines) == 2, done.stdout
    for line in lines:  # bf16 inputs, fp32 states: both runs round alike but not bit for bit
        errors = [float(x.split()[-1].rstrip(",")) for x in line.split("RMS vs one device: ")[1].split(", final")]
        assert all(e < 5e-3 for e in errors), line
