"""The input loads of token and chunk kernels (k3s.load_token, load_chunk, load_gate,
load_beta), each with what its input means (l2norm, the in-kernel gate forms, beta's form).

The printer decides nothing here: the dtype a load keeps its rows in is the op's `dtype`
(lower-to-triton), where a row lives is its tensor's layout."""

from __future__ import annotations

from xdsl.ir import SSAValue

from k3compile.backends.triton.printer.common import chosen, register, tensor_name
from k3compile.ir import k3s


class Loads:
    """TritonPrinter's methods for loads (one per k3s op, and their helpers)."""

    # where a token's row lives, by what it holds (a q or k row of key channels, or value columns
    # of v): (heads, width, head index, column offsets, column mask)
    KEY_ROWS = ("H", "K", "i_h", "o_k", "m_k")
    VALUE_ROWS = ("HV", "V", "i_hv", "o_v", "m_v")
    KEPT_AS = {k3s.RegisterDtype.INPUT: "kept in the input dtype (half the registers of fp32); stages upcast",
               k3s.RegisterDtype.FP32: "converted to fp32 as loaded"}

    def token_rows(self, op: k3s.LoadTokenOp | k3s.LoadChunkOp) -> tuple[str, str, str, str, str]:
        return self.VALUE_ROWS if k3s.loads_values(op) else self.KEY_ROWS

    def print_k3s_load_token(self, op: k3s.LoadTokenOp) -> None:
        name, row = tensor_name(op.tensor), register(op.row)
        heads, width, head, offsets, mask = self.token_rows(op)
        self.code.comment(op)
        self.code(f"{row} = tl.load({name} + (t * {heads} + {head}) * {width} + {offsets}, mask={mask}, other=0.0)"
                  + self.in_register_dtype(op))
        if k3s.normalises(op):
            self.code(f"{row} = {row} / tl.sqrt(tl.sum({row} * {row}) + 1e-6)")

    def in_register_dtype(self, op: k3s.LoadTokenOp | k3s.LoadChunkOp) -> str:
        """The conversion of a loaded tile to the dtype op keeps it in (none: the input's)."""
        return ".to(tl.float32)" if chosen(op, "dtype").data == k3s.RegisterDtype.FP32 else ""

    def print_k3s_load_chunk(self, op: k3s.LoadChunkOp) -> None:
        self.code.comment(op, self.KEPT_AS[chosen(op, "dtype").data])
        self.print_rows(op, "t_c", "m_c", register(op.rows))

    def print_rows(self, op: k3s.LoadChunkOp, rows: str, row_mask: str, target: str,
                   tensor: SSAValue | None = None) -> None:
        """The rows `rows` (token indices, masked by `row_mask`) of a chunk input into `target`, as
        op loads them, from `tensor` (default: op's)."""
        name = tensor_name(op.tensor if tensor is None else tensor)
        heads, width, head, offsets, mask = self.token_rows(op)
        self.code(
            f"{target} = tl.load({name} + ({rows}[:, None] * {heads} + {head}) * {width} + {offsets}[None, :], "
            f"mask={row_mask}[:, None] & {mask}[None, :], other=0.0)"
        )
        if upcast := self.in_register_dtype(op):
            self.code(f"{target} = {target}{upcast}")
        if k3s.normalises(op):
            self.code(f"{target} = {target} / tl.sqrt(tl.sum({target} * {target}, axis=1) + 1e-6)[:, None]")

    def print_k3s_load_gate(self, op: k3s.LoadGateOp) -> None:
        self.code.comment(op, "the log-decay g")
        per_token = isinstance(op.parent_op(), k3s.TokenLoopOp)
        self.print_gate_rows(op, *(("t", None) if per_token else ("t_c", "m_c")), register(op.log_gate))

    def print_gate_rows(self, op: k3s.LoadGateOp, rows: str, row_mask: str | None, target: str,
                        tensors: list[SSAValue] | None = None) -> None:
        """The log-decay of the token(s) `rows` (one token without a row mask) into `target`, in
        the op's input form, from `tensors` (g, then A_log and dt_bias if the form reads them;
        default: op's operands)."""
        c = self.code
        per_token = row_mask is None
        g, *parameters = (tensor_name(t) for t in (op.operands if tensors is None else tensors))
        if op.gate.data == "channel":
            cols = "o_k" if per_token else "o_k[None, :]"
            address = f"{g} + ({rows if per_token else rows + '[:, None]'} * HV + i_hv) * K + {cols}"
            mask = "m_k" if per_token else f"{row_mask}[:, None] & m_k[None, :]"
        else:
            address, mask = f"{g} + {rows} * HV + i_hv", row_mask
        c(f"{target} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''}).to(tl.float32)")
        form = op.input.data
        if form == "clamped":
            c(f"{target} = tl.maximum({target}, {op.lower_bound.value.data!r})")
        elif form != "log":
            A_log, dt_bias = parameters
            if op.gate.data == "channel":
                column_mask = "m_k" if per_token else "m_k[None, :]"
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
        beta = tensor_name(op.tensor)
        if per_token:
            self.code(f"{out} = tl.load({beta} + t * HV + i_hv).to(tl.float32)")
        else:
            self.code(f"{out} = tl.load({beta} + t_c * HV + i_hv, mask=m_c, other=0.0).to(tl.float32)")
        if op.input.data != "probability":  # logits: sigmoid(beta); logits_neg_eigval: 2 sigmoid(beta)
            form = f"2.0 * tl.sigmoid({out})" if op.input.data == "logits_neg_eigval" else f"tl.sigmoid({out})"
            self.code(f"{out} = {form}" if per_token else f"{out} = tl.where(m_c, {form}, 0.0)")
