"""The op interfaces that replace per-op isinstance chains: each op whose kernel needs block sizes
says how they are fixed (backends/triton/legalize.py's @block_sizes_of, or the pass that fixes
them: block_sizes_fixed_by), and each op whose kernel reads a size known only at run time
implements k3s.RuntimeSizesInterface. Which ops need them is read off the printer: the block
sizes an op's kernel constants read, the run-time sizes a kernel of that op alone reads.

Checked on the kernels of the examples' modules (scheduled and legalized, not printed: a few
seconds), the MoE layer also with the warp decode and the backward's small blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdsl.context import Context

from k3compile.backends.triton import legalize
from k3compile.backends.triton.legalize import LegalizeTritonPass
from k3compile.backends.triton.printer import TritonPrinter
from k3compile.backends.triton.printer.common import EntryView
from k3compile.driver import schedule
from k3compile.ir import k3s
from k3compile.ir.k3s import K3S
from k3compile.passes.outline_kernels import OutlineKernelsPass
from k3compile.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MOE_SMALL_BLOCKS = ("lower-moe-routing,lower-moe-experts,derive-moe-backward{block-rows=16 dgrad-block-n=16 "
                    "dgrad-block-d=16 wgrad-block-r=16 wgrad-block-n=16 wgrad-block-d=16 row-block=4},outline-kernels")
MOE_WARP = "lower-moe-routing,lower-moe-experts{decode=warp warp-slots=2 warp-block-n=8 warp-block-d=16}"
MODULES = [("kda", None), ("gated_deltanet", None), ("attnres", None), ("latent_moe", None),
           ("latent_moe", MOE_SMALL_BLOCKS), ("latent_moe", MOE_WARP), ("latent_moe_mxfp4", None)]


@pytest.fixture(scope="module")
def kernels() -> list[tuple[k3s.KernelOp, EntryView]]:
    """Every (kernel, a view of an entry that launches it) of the modules, legalized."""
    found = []
    for name, pipeline in MODULES:
        module = schedule(load_spec(EXAMPLES / f"{name}.toml"), pipeline).scheduled
        OutlineKernelsPass().apply(Context(), module)
        LegalizeTritonPass(source=name).apply(Context(), module)
        for entry in [op for op in module.ops if isinstance(op, k3s.EntryOp)]:
            view = EntryView(entry)
            found += [(kernel, view) for kernel in view.kernels]
    return found


class OneOp:
    """A kernel as the printer reads it, of one of its ops alone (or none) and maybe other grid
    axes; records the block sizes (block_k, ...) whose values are read."""

    def __init__(self, kernel: k3s.KernelOp, op=None, axes=None) -> None:
        self._kernel, self._op, self._axes = kernel, op, axes
        self.blocks_read: set[str] = set()

    def walk(self):
        return iter([] if self._op is None else [self._op])

    @property
    def axes(self):
        return self._kernel.axes if self._axes is None else self._axes

    def __getattr__(self, name: str):
        value = getattr(self._kernel, name)
        if not name.startswith("block_") or value is None:
            return value
        blocks_read = self.blocks_read

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


def test_every_op_whose_kernel_reads_runtime_sizes_implements_the_interface(kernels):
    printer, seen = TritonPrinter(None), set()
    for kernel, _ in kernels:
        # the interface gives the printer's sizes for the whole kernel ...
        assert k3s.runtime_sizes(kernel) == printer.runtime_sizes(kernel), kernel.sym_name.data
        for op in kernel.walk():  # ... op by op
            sizes = printer.runtime_sizes(OneOp(kernel, op, axes=[]))
            if sizes:
                seen.add(type(op))
                assert isinstance(op, k3s.RuntimeSizesInterface), \
                    f"{op.name}: its kernel reads the run-time sizes {sizes}; it does not implement " \
                    f"k3s.RuntimeSizesInterface"
            if isinstance(op, k3s.RuntimeSizesInterface):
                assert list(op.runtime_sizes()) == sizes, op.name
        for axis in kernel.axes:  # ... and axis by axis
            assert list(k3s.AXIS_RUNTIME_SIZES.get(axis, ())) == printer.runtime_sizes(OneOp(kernel, axes=[axis])), axis
    assert {k3s.TokenLoopOp, k3s.ChunkTileOp, k3s.StateTileOp, k3s.RouterLogitsOp, k3s.SourceLoopOp,
            k3s.ProjectWeightGradOp} <= seen


def test_an_op_without_runtime_sizes_cannot_be_made():
    class Unsized(k3s.RuntimeSizesInterface):
        name = "k3s.unsized"

    with pytest.raises(TypeError, match="Unsized.*runtime_sizes"):
        Unsized()
