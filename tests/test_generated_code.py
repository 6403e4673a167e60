"""The generated modules' kernels: every parameter is read, no two kernels have the same code,
and the kernels that merge-identical-kernels merges (after guard-spill-only-stages) are launched
from both entries."""

from __future__ import annotations

import ast
import re

import pytest
from xdsl.context import Context

from conftest import EXAMPLE_SPECS
from k3compile.driver import lower, schedule
from k3compile.ir import k3s
from k3compile.passes.common import props
from k3compile.passes.merge_identical_kernels import MergeIdenticalKernelsPass
from k3compile.spec import load_spec

PIPELINES = {
    "default": None,
    "split-prepare": "derive-chunkwise,fuse-chunkwise{grouping=split-prepare}",
    "chunked-verify": "derive-replay{draft-tokens=8},lower-speculative{verify=chunked}",
    "token-verify": "derive-replay{draft-tokens=8},lower-speculative",
    "chunk-32": "derive-chunkwise{chunk-size=32 solve-block=16},fuse-chunkwise,derive-segment-scan{chunk-size=32},"
                "lower-segment-scan",
    # segment_summary first: the shared prepare's code is the summary's, whose launch skips the
    # query stages (its parameters q, P, QG come from chunk_segments' arguments)
    "summary-first": "derive-segment-scan,lower-segment-scan,derive-chunkwise,fuse-chunkwise",
}
RECURRENCES = [p for p in EXAMPLE_SPECS if load_spec(p).kind in ("kda", "gated_deltanet", "deltanet", "gla")]
CASES = [pytest.param(spec, pipeline, id=f"{spec.stem}-{name}") for spec in RECURRENCES
         for name, pipeline in PIPELINES.items()]
CASES += [pytest.param(p, None, id=p.stem) for p in EXAMPLE_SPECS if load_spec(p).kind in ("attnres", "latent_moe")]


def jit_functions(source: str) -> list[ast.FunctionDef]:
    tree = ast.parse(source)
    return [f for f in tree.body if isinstance(f, ast.FunctionDef)
            and any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)]


def code_of(function: ast.FunctionDef) -> str:
    """Its statements but the docstring, as an AST dump (names, not formatting)."""
    body = function.body[1:] if isinstance(function.body[0], ast.Expr) else function.body
    return ast.dump(ast.Module(body=body, type_ignores=[]))


@pytest.mark.parametrize("spec, pipeline", CASES)
def test_kernel_parameters_are_read_and_kernels_differ(spec, pipeline):
    source = lower(load_spec(spec), pipeline).source
    kernels = [f for f in jit_functions(source) if f.name.endswith("_kernel")]
    assert kernels
    for kernel in kernels:
        read = {n.id for n in ast.walk(ast.Module(body=kernel.body, type_ignores=[]))
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        unused = [a.arg for a in kernel.args.args if a.arg not in read]
        assert not unused, f"{kernel.name}: parameters never read: {unused}"
        assert f"{kernel.name}[grid](" in source, f"{kernel.name} is never launched"
    codes = [code_of(k) for k in kernels]
    twins = [(a.name, b.name) for i, a in enumerate(kernels) for b in kernels[i + 1:] if code_of(a) == code_of(b)]
    assert not twins, f"kernels with the same code: {twins}"
    assert len(set(codes)) == len(codes)


def kernel_map(module) -> dict[str, k3s.KernelOp]:
    return {op.sym_name.data: op for op in module.walk() if isinstance(op, k3s.KernelOp)}


def launch_in(source: str, entry: str, kernel: str) -> str:
    """The launch of a kernel (by its IR name) in the printed entry."""
    body = source[source.index(f"def {entry}("):]
    launch = body[body.index(f"# k3s.kernel @{kernel} "):]
    return launch[:re.search(r"\n\s*\)\n", launch).start()]


def test_chunk_and_segments_share_prepare_scan_and_summary_scans():
    spec = next(p for p in RECURRENCES if p.stem == "kda")
    compilation = lower(load_spec(spec))
    kernels = kernel_map(compilation.scheduled)
    shared = {name: k.shares_code_of.data for name, k in kernels.items() if k.shares_code_of is not None}
    assert shared == {
        "kda_summary_prepare": "kda_chunk_prepare",
        "kda_segments_prepare": "kda_chunk_prepare",
        "kda_segments_scan": "kda_chunk_scan",
        "kda_segments_summary_scan_N": "kda_summary_scan_N",
        "kda_segments_summary_scan_M": "kda_summary_scan_M",
        # chunk_backward_segments (derive-segment-scan-backward): all but its cotangent summary
        "kda_backward_segments_prepare": "kda_backward_prepare",
        "kda_backward_segments_summary_scan_N": "kda_summary_scan_N",
        "kda_backward_segments_summary_scan_M": "kda_summary_scan_M",
        "kda_backward_segments_state_scan": "kda_backward_state_scan",
        "kda_backward_segments_cotangent_scan": "kda_backward_cotangent_scan",
        "kda_backward_segments_gradients": "kda_backward_gradients",
        "kda_backward_segments_gradients_steep": "kda_backward_gradients_steep",
    }
    source = compilation.source
    assert "def kda_segments_scan_kernel(" not in source and "def kda_summary_prepare_kernel(" not in source
    # each entry launches the shared code with its own launch configuration
    launch = launch_in(source, "chunk_segments", "kda_segments_scan")
    assert "kda_chunk_scan_kernel[grid](" in launch
    assert f"num_stages={kernels['kda_segments_scan'].num_stages.value.data}," in launch
    # the summary's launch turns the query stages off and passes None for what only they read
    summary = launch_in(source, "segment_summary", "kda_summary_prepare")
    assert "kda_chunk_prepare_kernel[grid](" in summary and "SPILL_P_QG=False," in summary
    assert [line.strip().split(":")[0] for line in summary.splitlines() if line.strip().startswith("None,")] == \
        ["None,  # q", "None,  # P", "None,  # QG"]
    for entry, kernel in (("_chunk_single", "kda_chunk_prepare"), ("chunk_segments", "kda_segments_prepare")):
        assert "SPILL_P_QG=True," in launch_in(source, entry, kernel) and "None,  #" not in launch_in(source, entry, kernel)


@pytest.mark.parametrize("kind, flag", [("kda", "SPILL_P_QG"), ("gated_deltanet", "SPILL_P_QG"),
                                        ("deltanet", "SPILL_P"), ("gla", None)])
def test_summary_prepare_runs_the_chunk_prepares_code(kind, flag):
    """The summary prepare is the chunk prepare minus the query stages; GLA's prepare interleaves
    them with its KG stages, which one guard cannot hold without reordering the chunk prepare,
    so GLA's summary prepare keeps its own code."""
    kernels = kernel_map(lower(load_spec(next(p for p in RECURRENCES if p.stem == kind))).scheduled)
    summary = kernels[f"{kind}_summary_prepare"]
    if flag is None:
        assert summary.flags is None and summary.shares_code_of is None
    else:
        assert summary.shares_code_of.data == f"{kind}_chunk_prepare" and not summary.flag_on(flag)
        assert kernels[f"{kind}_chunk_prepare"].flag_on(flag)


def test_merge_needs_the_same_code_properties():
    spec = next(p for p in RECURRENCES if p.stem == "kda")
    module = schedule(load_spec(spec)).scheduled
    from k3compile.backends.triton.legalize import LegalizeTritonPass

    LegalizeTritonPass().apply(Context(), module)
    kernels = kernel_map(module)
    # a different launch configuration (warps, block sizes) still shares the code; other products do not
    kernels["kda_segments_prepare"].properties.update(props(num_warps=8, block_v=32))
    kernels["kda_segments_scan"].properties.update(props(dots="fp32"))
    MergeIdenticalKernelsPass().apply(Context(), module)
    assert kernels["kda_segments_prepare"].shares_code_of.data == "kda_chunk_prepare"
    assert kernels["kda_segments_scan"].shares_code_of is None
    # no kernel shares the code of one in its own entry, and running it again changes nothing
    before = str(module)
    MergeIdenticalKernelsPass().apply(Context(), module)
    assert str(module) == before
    for kernel in kernels.values():
        if kernel.shares_code_of is not None:
            assert k3s.launching_entry(kernels[kernel.shares_code_of.data]) is not k3s.launching_entry(kernel)
