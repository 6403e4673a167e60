"""Workspace layouts and host sizes are IR facts (issue 39): lower-to-triton writes #k3s.layout on
each stage that stores to or loads from a workspace, and k3s.bind_size ops for the sizes an entry
computes; the printer prints addresses and sizes from them (common.tensor_address,
entries.host_expression) and decides nothing."""

from __future__ import annotations

import pytest
from xdsl.context import Context

from conftest import EXAMPLES
from k3compile.backends.triton.legalize import LegalizeTritonPass
from k3compile.backends.triton.lower import LowerToTritonPass, check_workspace_layouts
from k3compile.backends.triton.printer.common import tensor_address
from k3compile.backends.triton.printer.entries import host_expression
from k3compile.driver import schedule
from k3compile.ir import k3s
from k3compile.spec import load_spec

PIPELINE = ("lower-recurrent,derive-chunkwise,fuse-chunkwise,derive-backward,"
            "lower-backward{block-v=16 gradients-split=value-blocks},outline-kernels")


@pytest.fixture(scope="module")
def lowered():
    module = schedule(load_spec(EXAMPLES / "kda.toml"), PIPELINE).scheduled
    for backend_pass in (LegalizeTritonPass(), LowerToTritonPass()):
        backend_pass.apply(Context(), module)
    return module


def stage(module, op_type, workspace: str):
    """The first op_type stage of the module on the workspace of that name."""
    return next(op for op in module.walk() if isinstance(op, op_type) and op.workspace.name_hint == workspace)


@pytest.mark.parametrize("op_type, workspace, part, address, mask", [
    (k3s.SpillOp, "KG", None, "KG + (t_c[:, None] * HV + i_hv) * K + o_k[None, :]", "m_c[:, None] & m_k[None, :]"),
    (k3s.SpillOp, "P", None, "P + (t_c[:, None] * HV + i_hv) * BC + o_c[None, :]", "m_c[:, None]"),
    (k3s.SpillOp, "gamma_C", None, "gamma_C + ((start // BC + i_n) * HV + i_hv) * K + o_k", "m_k"),
    (k3s.SpillOp, "S", None, "S + ((start // BC + i_n) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]",
     "m_k[:, None] & m_v[None, :]"),
    (k3s.RecordCheckOp, "steep_chunks", None, "steep_chunks + (start // BC + i_n) * HV + i_hv", ""),
    (k3s.SpillValueBlockPartOp, "KG_bar_parts", "i_v", "KG_bar_parts + ((t_c[:, None] * HV + i_hv) * 8 + i_v) * K "
     "+ o_k[None, :]", "m_c[:, None] & m_k[None, :]"),
    (k3s.SpillValueBlockPartOp, "gamma_C_bar_parts", "i_v", "gamma_C_bar_parts + (((start // BC + i_n) * HV + i_hv) "
     "* 8 + i_v) * K + o_k", "m_k"),
])
def test_address_printed_from_the_layout(lowered, op_type, workspace, part, address, mask):
    assert tensor_address(stage(lowered, op_type, workspace), part=part) == (address, mask)


def test_stages_of_one_tensor_agree(lowered):
    """A reload that reads a workspace in another layout than its spill: the pass names both."""
    reload = stage(lowered, k3s.ReloadOp, "KG")
    kept = reload.layout
    reload.properties["layout"] = k3s.TensorLayoutAttr.of(("token", "T"), ("head", "HV"), ("column", "V"))
    try:
        with pytest.raises(ValueError, match=r"KG: k3s.spill reads it as #k3s.layout<token\[T\], head\[HV\], "
                                             r"column\[K\]>, k3s.reload as #k3s.layout<token\[T\], head\[HV\], column\[V\]>"):
            check_workspace_layouts(lowered)
    finally:
        reload.properties["layout"] = kept


def test_host_size_printed_from_its_arithmetic(lowered):
    bind = next(op for op in lowered.walk() if isinstance(op, k3s.BindSizeOp))
    assert bind.symbol.data == k3s.ShapeSymbol.NC
    assert host_expression(bind.size) == 'triton.cdiv(dims["B"] * dims["T"], 16) + dims["N"]'


def test_size_by_rows_needs_increasing_rows():
    from xdsl.dialects.builtin import ArrayAttr, IndexType, IntegerAttr, i64
    from xdsl.utils.exceptions import VerifyException

    ints = lambda *values: ArrayAttr([IntegerAttr(v, i64) for v in values])  # noqa: E731
    op = k3s.SizeByRowsOp.create(properties=dict(max_rows=ints(128, 16), sizes=ints(4, 8), otherwise=IntegerAttr(1, i64)),
                                 result_types=[IndexType()])
    with pytest.raises(VerifyException, match=r"max_rows increasing, one size each; got \[128, 16\]"):
        op.verify_()
