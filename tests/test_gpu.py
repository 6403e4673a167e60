"""On a CUDA GPU: the verification grid of every example with kernels, natively in bf16.

Skipped without CUDA. Run on the GPU machine with `pytest -m gpu tests/test_gpu.py`.
"""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

EXAMPLES_WITH_KERNELS = ["kda", "gated_deltanet", "deltanet", "gla", "attnres"]


@pytest.fixture
def native_triton(monkeypatch):
    """conftest turns on Triton's interpreter for the CPU tests; generated modules imported
    with it unset get real GPU kernels (`@triton.jit` reads it at import)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("example", EXAMPLES_WITH_KERNELS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_verify_on_cuda(example, dtype, native_triton, tmp_path):
    from k3compile.spec import load_spec
    from k3compile.verify import verify

    results = verify(load_spec(EXAMPLES / f"{example}.toml"), device="cuda", dtypes=[dtype], out_dir=tmp_path)
    assert results, "no cases ran"
    assert {r.dtype for r in results} == {dtype}
    failed = [f"{r.layer} / {r.case} / {r.tensor}: rms {r.rms_ratio:.2e} > {r.tolerance:.0e}"
              for r in results if not r.passed]
    assert not failed, "\n".join(failed)
