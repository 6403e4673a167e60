"""A pytest plugin that puts k3compile.ops' functions in place of fla's before fla's own test files
are collected (they import `from fla.ops.kda import chunk_kda`, which then reads ours), and
records for every test whether it called ours and how it ended. bench/fla_suite.py loads it
(`pytest -p fla_in_place`); it writes the records to $K3C_FLA_RECORDS (JSON).

$K3C_FLA_DEVICE=cpu points fla's test device at the CPU (fla picks "cuda" even without one), for
runs in Triton's interpreter. $K3C_FLA_DEADLINE (seconds since the epoch) skips the tests that
would start after it, with the reason BUDGET_SPENT, so a run in a bounded device call still ends
with its records (they are also rewritten after every test).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import time

import pytest
import torch

import k3compile.ops as ours
from fla_suite import BUDGET_SPENT

# fla's module -> the functions of it that k3compile.ops has (same names, same signatures)
IN_PLACE_OF = {
    "fla.ops.kda": ("chunk_kda", "fused_recurrent_kda"),
    "fla.ops.gated_delta_rule": ("chunk_gated_delta_rule", "chunk_gdn", "fused_recurrent_gated_delta_rule",
                                 "fused_recurrent_gdn"),
    "fla.ops.gla": ("chunk_gla", "fused_recurrent_gla"),
    "fla.ops.delta_rule": ("chunk_delta_rule", "fused_recurrent_delta_rule"),
    "fla.ops": tuple(ours.__all__),  # `from fla.ops import chunk_kda` too
}

calls_of_test: dict[str, int] = {}  # our function -> calls, in the running test
records: list[dict] = []


def counted(name: str, function):
    @functools.wraps(function)
    def call(*args, **kwargs):
        calls_of_test[name] = calls_of_test.get(name, 0) + 1
        return function(*args, **kwargs)
    return call


for module_name, names in IN_PLACE_OF.items():
    module = importlib.import_module(module_name)
    for name in names:
        setattr(module, name, counted(name, getattr(ours, name)))

if os.environ.get("K3C_FLA_DEVICE") == "cpu":
    import fla.utils

    from k3compile.checking.interpreter_bf16 import install

    install()  # Triton's interpreter computes bf16 as the GPU does (fla's kernels and ours alike)

    fla.utils.device = "cpu"
    fla.utils.device_torch_lib = torch.cpu  # fla's conftest synchronizes it after every test


def pytest_runtest_setup(item) -> None:
    calls_of_test.clear()
    deadline = os.environ.get("K3C_FLA_DEADLINE")
    if deadline and time.time() > float(deadline):
        pytest.skip(BUDGET_SPENT)


def pytest_runtest_logreport(report) -> None:
    # the call's outcome, or the setup's where the setup failed or skipped
    if report.when == "call" or (report.when == "setup" and not report.passed):
        message = ""
        if report.failed:
            lines = [line for line in report.longreprtext.splitlines() if line.startswith("E ")]
            message = (lines[0] if lines else report.longreprtext.splitlines()[-1])[:300]
        elif report.skipped:
            message = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        records.append(dict(test=report.nodeid, outcome=report.outcome, ours=dict(calls_of_test), message=message))
        write_records()


def pytest_sessionfinish(session) -> None:
    write_records()


def write_records() -> None:
    path = os.environ.get("K3C_FLA_RECORDS")
    if path:
        with open(path, "w") as f:
            json.dump(records, f, indent=1)
