"""Host sizes: the shape symbols an entry computes on the host before it allocates (NC, PB, PP),
as index arithmetic (xDSL's arith dialect on index values) over the sizes its arguments bound,
or by the call's rows (k3s.size_by_rows), and the values its launches pass for the run-time
sizes its kernels read (k3s.launch_size). The Triton backend's lower-to-triton writes them in
each entry that needs them; the printer prints each op as a Python expression, deciding no
formula:

    %B = k3s.size <symbol = B> : index
    %T = k3s.size <symbol = T> : index
    %0 = arith.muli %B, %T : index
    %c16 = arith.constant 16 : index
    %1 = arith.ceildivsi %0, %c16 : index
    %N = k3s.size <symbol = N> : index
    %NC = arith.addi %1, %N : index
    k3s.bind_size %NC <symbol = NC>
"""

from __future__ import annotations

from xdsl.dialects.builtin import I64, ArrayAttr, IndexType, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def, traits_def
from xdsl.traits import HasParent, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.core import EntryOp
from k3compile.ir.k3s.kernels import RUNTIME_SIZES, LaunchParamAttr
from k3compile.ir.k3s.types import ShapeSymbolAttr
from k3compile.ir.syntax import KeywordSyntax


@irdl_op_definition
class SizeOp(KeywordSyntax):
    """`%B = k3s.size <symbol = B> : index`: a shape symbol's size at this call, as the entry's
    arguments bound it (or a k3s.bind_size before this op)."""

    name = "k3s.size"
    symbol = prop_def(ShapeSymbolAttr)
    size = result_def(IndexType)
    traits = traits_def(HasParent(EntryOp), Pure())


@irdl_op_definition
class SizeByRowsOp(KeywordSyntax):
    """`%HS = k3s.size_by_rows <max_rows = [16, 128], sizes = [8, 4], otherwise = 1> : index`: a
    size that depends on the call's token rows R: that of the first max_rows that holds R (in
    increasing order), else `otherwise` (the router's hidden slices, from its kernel's
    k3s.launch_by_rows ops)."""

    name = "k3s.size_by_rows"
    max_rows = prop_def(ArrayAttr[IntegerAttr[I64]])
    sizes = prop_def(ArrayAttr[IntegerAttr[I64]])
    otherwise = prop_def(IntegerAttr[I64])
    size = result_def(IndexType)
    traits = traits_def(HasParent(EntryOp), Pure())

    @property
    def cases(self) -> list[tuple[int, int]]:
        """(max_rows, size) of each case, in order."""
        return [(most.value.data, size.value.data) for most, size in zip(self.max_rows.data, self.sizes.data, strict=True)]

    def verify_(self) -> None:
        rows = [most.value.data for most in self.max_rows.data]
        if len(rows) != len(self.sizes.data) or rows != sorted(set(rows)):
            raise VerifyException(f"{self.name}: max_rows increasing, one size each; got {rows} and "
                                  f"{len(self.sizes.data)} sizes")


@irdl_op_definition
class BindSizeOp(KeywordSyntax):
    """`k3s.bind_size %NC <symbol = NC>`: the entry binds a shape symbol no argument gives to a
    size it computes (before it checks the inputs and allocates the tensors of that size)."""

    name = "k3s.bind_size"
    symbol = prop_def(ShapeSymbolAttr)
    size = operand_def(IndexType)
    traits = traits_def(HasParent(EntryOp))


@irdl_op_definition
class LaunchSizeOp(KeywordSyntax):
    """`k3s.launch_size %R <size = R>`: what the entry's launches pass for a run-time size its
    kernels read (their `launch_params`): the token rows R are the shape symbol R, or B x T where
    the entry's tensors are [B, T, ..]; NSLOTS is the state pool's rows P."""

    name = "k3s.launch_size"
    size = prop_def(LaunchParamAttr)
    value = operand_def(IndexType)
    traits = traits_def(HasParent(EntryOp))

    def verify_(self) -> None:
        if self.size.data not in RUNTIME_SIZES:
            raise VerifyException(f"{self.name}: size is a run-time size, one of {', '.join(RUNTIME_SIZES)}; "
                                  f"got {self.size.data}")


HOST_SIZE_OPS = [SizeOp, SizeByRowsOp, BindSizeOp, LaunchSizeOp]
