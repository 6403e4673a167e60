"""On a CUDA GPU: the verification grid of every example with kernels, natively in bf16 (and fp32).

Skipped without CUDA. On the GPU machine: `pytest -m gpu tests`.

Each example is verified in a fresh Python process: conftest turns Triton's interpreter on for
the CPU tests (TRITON_INTERPRET=1 before triton is imported), and a process that has run the
interpreter can no longer compile kernels for the GPU (seen with Triton 3.6: "'ir.value' object
has no attribute 'dtype'" at the first tl.program_id).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import EXAMPLES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXAMPLES_WITH_KERNELS = ["kda", "gated_deltanet", "deltanet", "gla", "attnres"]

SCRIPT = """
import dataclasses, json, pathlib, sys
from k3compile.spec import load_spec
from k3compile.verify import verify
results = verify(load_spec(sys.argv[1]), device="cuda", dtypes=[sys.argv[2]], out_dir=pathlib.Path(sys.argv[3]))
print(json.dumps([dict(dataclasses.asdict(r), passed=r.passed) for r in results]))
"""


def run_verify(example: str, dtype: str, tmp_path) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(EXAMPLES / f"{example}.toml"), dtype, str(tmp_path / "modules")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("example", EXAMPLES_WITH_KERNELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_verify_on_cuda(example, dtype, tmp_path):
    results = run_verify(example, dtype, tmp_path)
    assert results, "no cases ran"
    assert {r["dtype"] for r in results} == {dtype}
    failed = [f"{r['layer']} / {r['case']} / {r['tensor']}: rms {r['rms_ratio']:.2e} > {r['tolerance']:.0e}"
              for r in results if not r["passed"]]
    assert not failed, "\n".join(failed)
