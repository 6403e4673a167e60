"""The op interfaces that replace per-op isinstance chains: each op whose kernel needs block sizes
says how they are fixed (backends/triton/legalize.py's @block_sizes_of, or the pass that fixes
them: block_sizes_fixed_by); each op whose code reads compile-time constants registers them
(backends/triton/printer's @kernel_constants_of); each op whose kernel reads a size known only
at run time implements k3s.RuntimeSizesInterface. Which ops need them is read off the printer:
the block sizes an op's kernel constants read; every name a printed kernel's code reads is a
parameter of the kernel or a global of the module, else the op that printed it is named.

Checked on the kernels of the examples' modules (scheduled and through the Triton backend's
passes, then printed: a few seconds), the MoE layer also with the warp decode, the backward's
small blocks and its row kernels."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest
from xdsl.context import Context

from k3compile.backends.triton import legalize
from k3compile.backends.triton.lower import LowerToTritonPass
from k3compile.backends.triton.printer import TritonPrinter
from k3compile.backends.triton.printer.common import KERNEL_CONSTANTS, EntryView, kernel_constants_of
from k3compile.backends.triton.printer.kernels import name_uses, param_name, statements
from k3compile.driver import schedule_for_triton
from k3compile.ir import k3s
from k3compile.ir.k3s import K3S
from k3compile.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MOE_SMALL_BLOCKS = ("lower-moe-routing,lower-moe-experts,derive-moe-backward{block-rows=16 dgrad-block-n=16 "
                    "dgrad-block-d=16 wgrad-block-r=16 wgrad-block-n=16 wgrad-block-d=16 row-block=4},outline-kernels")
MOE_WARP = "lower-moe-routing,lower-moe-experts{decode=warp warp-slots=2 warp-block-n=8 warp-block-d=16}"
# the backward's row kernels: the GLU's adjoint, the routed wgrads' row copies
MOE_ROW_KERNELS = ("lower-moe-routing,lower-moe-experts,derive-moe-backward{glu-adjoint=kernel "
                   "sorted-wgrad-rows=copy},outline-kernels")
# Block AttnRes in blocks of columns: its kernels hold all the call's queries (a block sized at launch)
ATTNRES_COLUMNS = ("fuse-attnres,derive-attnres-backward,derive-block-attnres{partials-schedule=columns},"
                   "derive-block-attnres-backward{partials-backward=columns},outline-kernels")
MODULES = [("kda", None), ("gated_deltanet", None), ("attnres", None), ("attnres", ATTNRES_COLUMNS),
           ("latent_moe", None), ("latent_moe", MOE_SMALL_BLOCKS), ("latent_moe", MOE_WARP), ("latent_moe_mxfp4", None),
           ("latent_moe", MOE_ROW_KERNELS)]


@pytest.fixture(scope="module")
def modules() -> list:
    """The modules as the printer gets them (the Triton backend's passes run)."""
    return [schedule_for_triton(load_spec(EXAMPLES / f"{name}.toml"), pipeline, verify="off").scheduled
            for name, pipeline in MODULES]


@pytest.fixture(scope="module")
def kernels(modules) -> list[tuple[k3s.KernelOp, EntryView]]:
    """Every (kernel, a view of an entry that launches it) of the modules."""
    found = []
    for module in modules:
        for entry in [op for op in module.ops if isinstance(op, k3s.EntryOp)]:
            view = EntryView(entry)
            found += [(kernel, view) for kernel in view.kernels]
    return found


class OneOp:
    """A kernel as the printer reads it, of one of its ops alone; records the block sizes
    (block_k, ...) whose values are read."""

    def __init__(self, kernel: k3s.KernelOp, op) -> None:
        self._kernel, self._op = kernel, op
        self.blocks_read: set[str] = set()

    def walk(self):
        return iter([self._op])

    def __getattr__(self, name: str):
        value = getattr(self._kernel, name)
        if not name.startswith("block_") or value is None:
            return value
        blocks_read = self.blocks_read
        if isinstance(value, k3s.RuntimeBlockAttr):  # sized at launch: read as a whole
            blocks_read.add(name)
            return value

        class Read:  # `kernel.block_k is None` reads nothing; `.value` reads the size
            @property
            def value(self):
                blocks_read.add(name)
                return value.value

        return Read()


def ops_reading_block_sizes(kernels) -> list[tuple[k3s.KernelOp, object, set[str]]]:
    """(kernel, op, the block sizes the op's kernel constants read: the printer's) of each op
    that reads some."""
    printer, read = TritonPrinter(None), []
    for kernel, view in kernels:
        for op in kernel.walk():
            one = OneOp(kernel, op)
            printer.kernel_constants(one, view)
            if one.blocks_read:
                read.append((kernel, op, one.blocks_read))
    return read


def by_type(read) -> dict[type, set[str]]:
    types = {}
    for _, op, blocks in read:
        types.setdefault(type(op), set()).update(blocks)
    return types


def missing_block_sizes(read: dict[type, set[str]]) -> list[str]:
    return [f"{op_type.name}: its kernel constants read {', '.join(sorted(blocks))}, but it has no @block_sizes_of "
            f"(nor block_sizes_fixed_by) in backends/triton/legalize.py"
            for op_type, blocks in sorted(read.items(), key=lambda item: item[0].name)
            if op_type not in legalize.BLOCK_SIZES]


def test_every_op_whose_constants_read_block_sizes_has_them(kernels):
    read = ops_reading_block_sizes(kernels)
    assert {k3s.StateTileOp, k3s.ProjectOp, k3s.ProjectInputGradOp} <= set(by_type(read))  # the reads were seen
    assert missing_block_sizes(by_type(read)) == []
    # legalize-triton, or the op's pass, fixed every block size the op's constants read
    for kernel, op, blocks in read:
        assert all(getattr(kernel, block) is not None for block in blocks), \
            f"{op.name} in @{kernel.sym_name.data}: not all of {sorted(blocks)} fixed"


def test_a_missing_block_sizes_function_names_the_op(monkeypatch):
    monkeypatch.delitem(legalize.BLOCK_SIZES, k3s.SelectTopKOp)
    message, = missing_block_sizes({k3s.SelectTopKOp: {"block_ks"}, k3s.StateTileOp: {"block_k"}})
    assert message.startswith("k3s.select_top_k: its kernel constants read block_ks, but it has no @block_sizes_of")
    assert "\n" not in message


def test_block_sizes_interface_registers_k3s_ops():
    registered = {*legalize.BLOCK_SIZES, *legalize.SIZES_BY_ROWS}
    assert registered <= set(K3S.operations), sorted(t.__name__ for t in registered - set(K3S.operations))
    assert set(legalize.SIZES_BY_ROWS) <= set(legalize.BLOCK_SIZES)


class RecordingPrinter(TritonPrinter):
    """The printer, recording each kernel's printed code and which op printed each of its lines
    (the innermost op: a loop's lines but its body's)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.printed: list[tuple[k3s.KernelOp, EntryView, list[str], list[tuple[object, int, int]]]] = []

    def print_kernel(self, kernel: k3s.KernelOp, view: EntryView) -> None:
        self.spans: list[tuple[object, int, int]] = []
        super().print_kernel(kernel, view)
        self.printed.append((kernel, view, self.body, self.spans))

    def print_ops(self, parent) -> None:
        self.body = self.code.lines
        for op in parent.regions[0].ops:
            first = len(self.code.lines)
            getattr(self, "print_" + op.name.replace(".", "_"))(op)
            self.spans.append((op, first, len(self.code.lines)))


def module_globals(source: str) -> set[str]:
    names = set(dir(builtins))
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def undefined_names(module) -> list[str]:
    """One line per op type whose printed code reads a name that is neither a parameter of its
    kernel (an argument, a run-time size, a constant, a flag) nor a global of the module: the
    registration the op (or another op of its kernel) lacks."""
    printer = RecordingPrinter()
    known = module_globals(printer.print_module(module, ""))
    problems: dict[str, tuple[set[str], set[str]]] = {}  # op name -> (the names, the kernels)
    for kernel, view, lines, spans in printer.printed:
        params = {param_name(param) for param, _ in printer.kernel_params(kernel, view)}
        unknown = name_uses(statements("\n".join(lines) + "\n")).free() - params - known
        for name in sorted(unknown):
            word = re.compile(rf"\b{name}\b")
            for at, line in enumerate(lines):
                if not word.search(line.split("#")[0]):
                    continue
                # the innermost op whose printing wrote the line; lines before any op: the grid axes'
                around = [(last - first, op.name) for op, first, last in spans if first <= at < last]
                where = min(around)[1] if around else f"the grid axes {', '.join(kernel.axes)}"
                names, kernels = problems.setdefault(where, (set(), set()))
                names.add(name)
                kernels.add(f"@{kernel.sym_name.data}")
    messages = []
    for where, (names, kernels) in sorted(problems.items()):
        sizes, constants = sorted(names & set(k3s.RUNTIME_SIZES)), sorted(names - set(k3s.RUNTIME_SIZES))
        at = ", ".join(sorted(kernels)[:2]) + (f" and {len(kernels) - 2} more" if len(kernels) > 2 else "")
        messages.append(f"{where}: its code (in {at}) reads names its kernel does not define"
                        + (f"; constants no @kernel_constants_of (backends/triton/printer) gives: "
                           f"{', '.join(constants)}" if constants else "")
                        + (f"; run-time sizes its runtime_sizes() (k3s.RuntimeSizesInterface) omits: "
                           f"{', '.join(sizes)}" if sizes else ""))
    return messages


def test_every_name_a_printed_kernel_reads_is_defined(modules):
    for module in modules:
        assert undefined_names(module) == []


def test_a_missing_kernel_constants_registration_names_the_op(modules, monkeypatch):
    monkeypatch.delitem(KERNEL_CONSTANTS, k3s.SelectTopKOp)
    messages = undefined_names(modules[MODULES.index(("latent_moe", None))])
    message = next(m for m in messages if m.startswith("k3s.select_top_k:"))
    assert re.match(r"k3s\.select_top_k: its code \(in @\w+, @\w+ and \d+ more\) reads names its kernel does not "
                    r"define; constants no @kernel_constants_of \(backends/triton/printer\) gives: BKS, TOP_K$",
                    message), message
    assert all("\n" not in m for m in messages)


def test_a_missing_runtime_size_names_the_op(modules, monkeypatch):
    monkeypatch.setattr(k3s.RouterLogitsOp, "runtime_sizes", lambda self: ())
    module = modules[MODULES.index(("latent_moe", None))].clone()
    for kernel in [op for op in module.walk() if isinstance(op, k3s.KernelOp)]:
        del kernel.properties["launch_params"]  # written again from the ops' run-time sizes
    LowerToTritonPass().apply(Context(), module)
    message, = undefined_names(module)
    assert re.match(r"k3s\.router_logits: its code \(in @\w+, @\w+ and \d+ more\) reads names its kernel does not "
                    r"define; run-time sizes its runtime_sizes\(\) \(k3s.RuntimeSizesInterface\) omits: HS$",
                    message), message


def test_kernel_constants_interface_registers_k3s_ops():
    assert set(KERNEL_CONSTANTS) <= set(K3S.operations), \
        sorted(t.__name__ for t in set(KERNEL_CONSTANTS) - set(K3S.operations))
    with pytest.raises(ValueError, match="k3s.project: kernel constants registered twice"):
        kernel_constants_of(k3s.ProjectOp)(lambda printer, op, kernel, view: {})


def test_runtime_sizes_are_known_sizes(kernels):
    seen = set()
    for kernel, _ in kernels:
        for op in kernel.walk():
            if isinstance(op, k3s.RuntimeSizesInterface):
                seen.add(type(op))
                assert set(op.runtime_sizes()) <= set(k3s.RUNTIME_SIZES), op.name
    assert {k3s.TokenLoopOp, k3s.ChunkTileOp, k3s.StateTileOp, k3s.RouterLogitsOp, k3s.SourceLoopOp,
            k3s.ProjectWeightGradOp} <= seen
    assert set(k3s.AXIS_RUNTIME_SIZES.values()) <= {(size,) for size in k3s.RUNTIME_SIZES}


def test_an_op_without_runtime_sizes_cannot_be_made():
    class Unsized(k3s.RuntimeSizesInterface):
        name = "k3s.unsized"

    with pytest.raises(TypeError, match="Unsized.*runtime_sizes"):
        Unsized()
