"""The input loads of token and chunk kernels (k3s.load_token, load_chunk, load_gate,
load_beta), each with what its input means (l2norm, the in-kernel gate forms, beta's form).

The printer decides nothing here: the dtype a load keeps its rows in is the op's `dtype`, where
its rows are in its tensor the op's `layout` (lower-to-triton's), printed by common.tensor_address."""

from __future__ import annotations

from xdsl.ir import SSAValue

from k3compile.backends.triton.printer.common import (CHUNK_ROWS, TOKEN_ROW, chosen, register, tensor_address,
                                                      tensor_name)
from k3compile.ir import k3s


class Loads:
    """TritonPrinter's methods for loads (one per k3s op, and their helpers)."""

    KEPT_AS = {k3s.RegisterDtype.INPUT: "kept in the input dtype (half the registers of fp32); stages upcast",
               k3s.RegisterDtype.FP32: "converted to fp32 as loaded"}

    def print_k3s_load_token(self, op: k3s.LoadTokenOp) -> None:
        row = register(op.row)
        address, mask = tensor_address(op, op.tensor, TOKEN_ROW)
        self.code.comment(op)
        self.code(f"{row} = tl.load({address}, mask={mask}, other=0.0)" + self.in_register_dtype(op))
        if k3s.normalises(op):
            self.code(f"{row} = {row} / tl.sqrt(tl.sum({row} * {row}) + 1e-6)")

    def in_register_dtype(self, op: k3s.LoadTokenOp | k3s.LoadChunkOp) -> str:
        """The conversion of a loaded tile to the dtype op keeps it in (none: the input's)."""
        return ".to(tl.float32)" if chosen(op, "dtype").data == k3s.RegisterDtype.FP32 else ""

    def print_k3s_load_chunk(self, op: k3s.LoadChunkOp) -> None:
        self.code.comment(op, self.KEPT_AS[chosen(op, "dtype").data])
        self.print_rows(op, CHUNK_ROWS, register(op.rows))

    def print_rows(self, op: k3s.LoadChunkOp, rows: tuple[str, str], target: str,
                   tensor: SSAValue | None = None) -> None:
        """The token rows `rows` (their index and mask) of a chunk input into `target`, as op loads
        them, from `tensor` (default: op's)."""
        address, mask = tensor_address(op, op.tensor if tensor is None else tensor, rows)
        self.code(f"{target} = tl.load({address}, mask={mask}, other=0.0)")
        if upcast := self.in_register_dtype(op):
            self.code(f"{target} = {target}{upcast}")
        if k3s.normalises(op):
            self.code(f"{target} = {target} / tl.sqrt(tl.sum({target} * {target}, axis=1) + 1e-6)[:, None]")

    def print_k3s_load_gate(self, op: k3s.LoadGateOp) -> None:
        self.code.comment(op, "the log-decay g")
        per_token = isinstance(op.parent_op(), k3s.TokenLoopOp)
        self.print_gate_rows(op, TOKEN_ROW if per_token else CHUNK_ROWS, register(op.log_gate))

    def print_gate_rows(self, op: k3s.LoadGateOp, rows: tuple[str, str | None], target: str,
                        tensors: list[SSAValue] | None = None) -> None:
        """The log-decay of the token rows `rows` (their index and mask; one token: no mask) into
        `target`, in the op's input form, from `tensors` (g, then A_log and dt_bias if the form
        reads them; default: op's operands)."""
        c = self.code
        per_token = rows[1] is None
        g, *parameters = op.operands if tensors is None else tensors
        parameters = [tensor_name(t) for t in parameters]
        address, mask = tensor_address(op, g, rows)
        c(f"{target} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''}).to(tl.float32)")
        form = op.input.data
        if form == "clamped":
            c(f"{target} = tl.maximum({target}, {op.lower_bound.value.data!r})")
        elif form != "log":
            A_log, dt_bias = parameters
            if op.gate.data == "channel":
                cols, column_mask = ("o_k", "m_k") if per_token else ("o_k[None, :]", "m_k[None, :]")
                bias = f"tl.load({dt_bias} + i_hv * K + {cols}, mask={column_mask}, other=0.0)"
            else:
                bias = f"tl.load({dt_bias} + i_hv)"
            c(f"b_a = tl.exp(tl.load({A_log} + i_hv).to(tl.float32))", f"{target} = {target} + {bias}.to(tl.float32)")
            if form == "softplus":
                c(f"{target} = -b_a * tl.where({target} > 20.0, {target}, tl.log(1.0 + tl.exp(tl.minimum({target}, 20.0))))")
            else:
                c(f"{target} = {op.lower_bound.value.data!r} * tl.sigmoid(b_a * {target})")
        if op.floor is not None:  # a zero decay either way; -inf and -1e9 would wreck the cumsum
            c(f"{target} = tl.maximum({target}, {op.floor.value.data!r})")
        # rows or channels past the end must not decay (the cumsum relies on it): the forms that
        # add dt_bias give them a log-decay
        if mask and form in ("softplus", "bounded"):
            c(f"{target} = tl.where({mask}, {target}, 0.0)")

    def print_k3s_load_beta(self, op: k3s.LoadBetaOp) -> None:
        per_token = isinstance(op.parent_op(), k3s.TokenLoopOp)
        out = register(op.beta)
        self.code.comment(op)
        address, mask = tensor_address(op, op.tensor, TOKEN_ROW if per_token else CHUNK_ROWS)
        self.code(f"{out} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''}).to(tl.float32)")
        if op.input.data != "probability":  # logits: sigmoid(beta); logits_neg_eigval: 2 sigmoid(beta)
            form = f"2.0 * tl.sigmoid({out})" if op.input.data == "logits_neg_eigval" else f"tl.sigmoid({out})"
            self.code(f"{out} = {form}" if per_token else f"{out} = tl.where(m_c, {form}, 0.0)")
