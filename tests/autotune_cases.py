"""What the autotuner's tests share (tests/test_autotune*.py): a tiny KDA layer, its search space and
shapes, a fake GPU name and timer, and a recorder of a generated kernel's launches."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import recurrence_table
from k3compile.passes.fuse_chunkwise import FuseChunkwisePass
from k3compile.runtime.autotune import Choice

GPU = "Fake GPU 80GB"
# V = 32: block-v 32 and 16 are different launches of the scan kernel
TABLE = recurrence_table("kda", H=1, K=16, V=32, name="tuned")
SPACE = (
    Choice("derive-chunkwise", "chunk-size", (64, 32), launch_only=False),
    Choice("fuse-chunkwise", "num-warps", (8, 4), launch_only=True),
    Choice("fuse-chunkwise", "block-v", (32, 16), launch_only=True),
)
SMALL_SPACE = SPACE[1:]  # one chunk size: one module
CHECK = (1, 40)
SHAPE = (1, 48)  # bucket N*HV<=1, T<=64
DEFAULT_WARPS = FuseChunkwisePass.num_warps  # the heuristic default of an untuned bucket
DEFAULT_STAGES = FuseChunkwisePass.scan_stages  # the scan's, where the space leaves it out


def write_spec(path: Path, table: dict = TABLE) -> Path:
    lines = ["[layer]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def fake_gpu(monkeypatch, name: str | None) -> None:
    """The GPU name where tune (search.py) and compile_tuned (compile.py) look it up."""
    for where in ("search", "compile"):
        monkeypatch.setattr(f"k3compile.runtime.autotune.{where}.gpu_name", lambda: name)


def spec_of(table: dict = TABLE):
    from k3compile.spec import spec_from_table

    return spec_from_table(dict(table), source=f"<test {table['name']}>")


class FakeTimer:
    """ms by candidate options; counts its calls (it never runs the candidate)."""

    def __init__(self, fastest: dict | None = None) -> None:
        self.calls = 0
        self.fastest = fastest or {"num-warps": 4, "block-v": 16}

    def __call__(self, fn, candidate) -> float:
        self.calls += 1
        matches = sum(candidate.options.get(k) == v for k, v in self.fastest.items())
        return 1.0 - 0.2 * matches + 0.01 * 64 / candidate.options.get("chunk-size", 64)  # C64 a bit faster


class LaunchRecorder:
    """Stands in for a kernel of a generated module: records the launch, then runs it."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.launches: list[dict] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append({"grid": grid, **{k: kwargs[k] for k in ("BV", "num_warps", "num_stages", "maxnreg")
                                                   if k in kwargs}})
            return self.kernel[grid](*args, **kwargs)

        return launch
