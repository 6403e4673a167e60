"""The generated modules' kernels: every parameter is read, no two kernels have the same code,
and the kernels that merge-identical-kernels merges (after guard-spill-only-stages) are launched
from both entries."""

from __future__ import annotations

import ast
import re

import pytest
from xdsl.context import Context

from conftest import EXAMPLE_SPECS
from k3compile.backends.triton.printer import TritonPrinter, print_triton
from k3compile.backends.triton.printer.kernels import name_uses, names_read
from k3compile.driver import lower, schedule
from k3compile.ir import k3s
from k3compile.passes.common import props
from k3compile.backends.triton.merge_identical_kernels import MergeIdenticalKernelsPass
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
    shared = {name: k.shares_code_of.string_value() for name, k in kernels.items() if k.shares_code_of is not None}
    assert shared == {
        "kda_summary_prepare": "kda_chunk_prepare",
        "kda_segments_prepare": "kda_chunk_prepare",
        "kda_segments_scan": "kda_chunk_scan",
        "kda_segments_summary_scan_N": "kda_summary_scan_N",
        "kda_segments_summary_scan_M": "kda_summary_scan_M",
        # chunk_backward_segments (derive-segment-scan-backward): all, its cotangent summary the
        # cotangent scan's code launched with its spills off, storing N_bar (guard-spill-only-stages)
        "kda_backward_segments_prepare": "kda_backward_prepare",
        "kda_backward_segments_cotangent_summary": "kda_backward_cotangent_scan",
        "kda_backward_segments_summary_scan_N": "kda_summary_scan_N",
        "kda_backward_segments_summary_scan_M": "kda_summary_scan_M",
        "kda_backward_segments_state_scan": "kda_backward_state_scan",
        "kda_backward_segments_cotangent_scan": "kda_backward_cotangent_scan",
        "kda_backward_segments_gradients": "kda_backward_gradients",
        "kda_backward_segments_gradients_steep": "kda_backward_gradients",
        # chunk_saving and chunk_backward_saved (save-forward-values): every kernel, copied
        "kda_chunk_prepare_saving": "kda_chunk_prepare",
        "kda_chunk_scan_saving": "kda_chunk_scan",
        "kda_backward_state_scan_saved": "kda_backward_state_scan",
        "kda_backward_cotangent_scan_saved": "kda_backward_cotangent_scan",
        "kda_backward_gradients_saved": "kda_backward_gradients",
        "kda_backward_gradients_steep_saved": "kda_backward_gradients",
        # lower-backward: the steep chunks' launch of the gradients kernel, its flag STEEP on
        "kda_backward_gradients_steep": "kda_backward_gradients",
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
    # the cotangent summary's launch: the cotangent scan's code from dht, which is None until the
    # adjoint combine after it, its spills and dh0 off, N_bar on
    assert "def kda_backward_segments_cotangent_summary_kernel(" not in source
    summary = launch_in(source, "chunk_backward_segments", "kda_backward_segments_cotangent_summary")
    assert "kda_backward_cotangent_scan_kernel[grid](" in summary and "SPILL_S_BAR_VR_BAR=False," in summary
    segments = source[source.index("def chunk_backward_segments("):]
    assert "HAS_DHT=dht is not None," in summary and segments.index("dht = None") < segments.index(summary)
    for entry, kernel in (("_chunk_backward_single", "kda_backward_cotangent_scan"),
                          ("chunk_backward_segments", "kda_backward_segments_cotangent_scan")):
        assert "SPILL_S_BAR_VR_BAR=True," in launch_in(source, entry, kernel)
    # the gradients kernel printed once, launched for the factored chunks and again for the steep ones
    assert "def kda_backward_gradients_steep_kernel(" not in source
    for steep, on in (("kda_backward_gradients", False), ("kda_backward_gradients_steep", True)):
        launch = launch_in(source, "_chunk_backward_single", steep)
        assert "kda_backward_gradients_kernel[grid](" in launch and f"STEEP={on}," in launch


@pytest.mark.parametrize("kind, flag", [("kda", "SPILL_P_QG"), ("gated_deltanet", "SPILL_P_QG"),
                                        ("deltanet", "SPILL_P"), ("gla", None)])
def test_summary_prepare_runs_the_chunk_prepares_code(kind, flag):
    """The summary prepare is the chunk prepare minus the query stages; GLA's prepare interleaves
    them with its KG stages, and its query load feeds stages on both sides of them (P, QG), which
    no guards can hold without reordering the chunk prepare, so GLA's summary prepare keeps its
    own code."""
    kernels = kernel_map(lower(load_spec(next(p for p in RECURRENCES if p.stem == kind))).scheduled)
    summary = kernels[f"{kind}_summary_prepare"]
    if flag is None:
        assert summary.flags is None and summary.shares_code_of is None
    else:
        assert summary.shares_code_of.string_value() == f"{kind}_chunk_prepare" and not summary.flag_on(flag)
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
    assert kernels["kda_segments_prepare"].shares_code_of.string_value() == "kda_chunk_prepare"
    assert kernels["kda_segments_scan"].shares_code_of is None
    # no kernel shares the code of one in its own entry but a launch with other flags (the steep
    # chunks' launch of the gradients kernel), and running it again changes nothing
    before = str(module)
    MergeIdenticalKernelsPass().apply(Context(), module)
    assert str(module) == before
    for kernel in kernels.values():
        if kernel.shares_code_of is not None:
            code = kernels[kernel.code_name()]
            assert k3s.launching_entry(code) is not k3s.launching_entry(kernel) or code.flags != kernel.flags


# --- the printer's self-check (kernels.py print_kernel): what each kernel's printed code reads -----


@pytest.fixture(scope="module")
def kda_scheduled():
    """kda's module as the printer gets it (all passes run), and its printed source."""
    compilation = lower(load_spec(next(p for p in RECURRENCES if p.stem == "kda")))
    return compilation.scheduled, compilation.source


def print_with(module, monkeypatch, kernel: str, *lines: str) -> str:
    """Print module with `lines` added at the end of kernel's code."""
    printed = TritonPrinter.print_ops

    def print_ops(self, parent):
        printed(self, parent)
        if isinstance(parent, k3s.KernelOp) and parent.sym_name.data == kernel:
            self.code(*lines)

    monkeypatch.setattr(TritonPrinter, "print_ops", print_ops)
    return print_triton(module, "doc")


def test_self_check_prints_the_same_module(kda_scheduled):
    module, source = kda_scheduled
    docstring = source.split('"""')[1].removesuffix("\n")
    assert print_triton(module, docstring) == source  # a second printer (its caches) prints the same


def test_self_check_kernel_reads_only_its_arguments(kda_scheduled, monkeypatch):
    module, _ = kda_scheduled
    with pytest.raises(ValueError, match=r"kernel @kda_chunk_scan: its arguments .* are not the tensors its code "
                                         r"reads, .*'dht'"):
        print_with(module, monkeypatch, "kda_chunk_scan", "b_extra = dht")  # chunk_backward's argument


def test_self_check_launch_reads_no_absent_argument(kda_scheduled, monkeypatch):
    """The summary prepare runs the chunk prepare's code with SPILL_P_QG off and None for q, P,
    QG: with the flag on, its launch would run the query stages, which read them."""
    module, _ = kda_scheduled
    flag_on = k3s.KernelOp.flag_on
    monkeypatch.setattr(k3s.KernelOp, "flag_on",
                        lambda self, flag: self.sym_name.data == "kda_summary_prepare" or flag_on(self, flag))
    with pytest.raises(ValueError, match=r"kernel @kda_summary_prepare: its launch runs code that reads "
                                         r"\['P', 'QG', 'q'\], which entry @segment_summary does not have"):
        print_triton(module, "doc")


@pytest.mark.parametrize("lines, differs", [(["b_extra = 1"], True), (["# a comment: not code"], False)])
def test_self_check_shared_code_is_the_same(kda_scheduled, monkeypatch, lines, differs):
    """A kernel that shares another's code must print the same statements (comments aside)."""
    module, _ = kda_scheduled
    if differs:
        with pytest.raises(ValueError, match="kernel @kda_segments_scan of @chunk_segments shares the code of "
                                             "@kda_chunk_scan, but its code differs"):
            print_with(module, monkeypatch, "kda_segments_scan", *lines)
    else:
        print_with(module, monkeypatch, "kda_segments_scan", *lines)


def reference_launch_free(code: str, off: set[str], on: set[str] = frozenset()) -> set[str]:
    """The free names of the code a launch runs, as the printer first found them: a copy of the
    AST without the guards the launch skips (`if FLAG:` of a flag off, `if not FLAG:` of one on)."""
    import copy

    class SkipOff(ast.NodeTransformer):
        def visit_If(self, node):
            test = node.test
            skipped = (isinstance(test, ast.Name) and test.id in off) or (
                isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
                and isinstance(test.operand, ast.Name) and test.operand.id in on)
            return None if skipped else self.generic_visit(node)

    names = [n for n in ast.walk(SkipOff().visit(copy.deepcopy(ast.parse(code)))) if isinstance(n, ast.Name)]
    return {n.id for n in names if isinstance(n.ctx, ast.Load)} - {n.id for n in names if isinstance(n.ctx, ast.Store)}


def test_name_uses_skips_the_guards_a_launch_turns_off():
    code = "\n".join([
        "b_x = tl.load(x + o)",
        "if A:",
        "    b_y = tl.load(y)",
        "    if B:",
        "        b_z = tl.load(z)",
        "elif B:",
        "    b_w = w",
        "else:",
        "    for i in range(N):",
        "        if A:",
        "            b_v = v[i]",
        "        b_u = u",
        "if not A:",
        "    b_t = t",
        "del b_x",
        "tl.store(out, b_x)",
    ])
    tree = ast.parse(code)
    for off, on in ((set(), set()), ({"A"}, set()), ({"B"}, set()), ({"A", "B"}, set()), ({"C"}, set()),
                    (set(), {"A"}), ({"B"}, {"A"}), (set(), {"C"})):
        uses = name_uses(tree, off, on)
        assert uses.launch_free() == reference_launch_free(code, off, on), (off, on)
        assert uses.free() == reference_launch_free(code, set())
        assert uses.read == {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    # `if A:` goes with its elif and else; `if not A:` is A's guard too, skipped by a launch with A on
    assert name_uses(tree, {"A"}).launch_free() == {"tl", "x", "o", "A", "t", "out"}
    assert "t" not in name_uses(tree, set(), {"A"}).launch_free()


def test_names_read_are_the_parsed_codes_names():
    """The printer keeps a kernel's parameters by the names its code reads, scanned without
    parsing: attributes, keyword arguments, strings and comments are none of them."""
    code = "\n".join([
        '"""k3s.kernel @k <block_v = BV>, from "x"."""',
        "# the rows of K: BQ",
        "b_x = tl.load(x + o_k, mask=m_k, other=0.0).to(q.dtype.element_ty)  # with V",
        "SUB: tl.constexpr = 4",
        "b_y = tl.sum(b_x, axis=0) if HAS_Y else 'T'",
        "b_z = b_y==D",
    ])
    assert names_read(code) == {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)} | {"if", "else"}


def test_compile_prints_without_the_self_check(kda_scheduled, monkeypatch):
    """A compile skips the self-check (K3C_PRINTER_CHECKS unset): parsing every kernel was 40% of
    printing; the tests (conftest.py) run it on every module they print."""
    module, _ = kda_scheduled
    monkeypatch.delenv("K3C_PRINTER_CHECKS")
    assert "b_extra = dht" in print_with(module, monkeypatch, "kda_recurrent", "b_extra = dht")
