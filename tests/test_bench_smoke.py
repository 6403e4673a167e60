"""The GPU benchmarks' CPU smoke modes (Triton's interpreter, tiny layers): each compiles its
modules, checks every method against an fp32 token loop before timing, and exits non-zero when a
check fails, so a change that breaks a bench script (or the entries it calls) fails here rather
than in a device session."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import REPO

SMOKE_RUNS = {
    "serving_sweep": ["bench/serving_sweep.py", "--smoke", "--choices", "16:4:0,16:2:2"],
    "speculative_gpu": ["bench/speculative_gpu.py", "--smoke", "--no-fla"],
}


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_bench_smoke_mode_checks_and_writes_its_table(name, tmp_path):
    env = dict(os.environ, K3C_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, *SMOKE_RUNS[name], "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = next(tmp_path.glob("*.md")).read_text()
    checked = [line for line in table.splitlines() if line.endswith("| ok |")]  # a row's checks column
    assert checked and "FAILED" not in table, table
