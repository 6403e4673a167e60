"""The stages of a backward schedule (ir/k3s/adjoint.py): tile algebra, the transposed solve and
the stores of the inputs' gradients, each taken back through its load's input form. Where a
store's rows are in the gradient and its input is the op's <layout> (lower-to-triton), printed by
common.tensor_address; the gate parameters' rows per value head (A_log, dt_bias) are written here,
as loads.py writes them."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import register, tensor_address, tensor_name
from k3compile.ir import k3s

LOG2E = 1.4426950408889634

# a tile's Triton shape by its dimensions: broadcasting a one-dimensional factor along rows or columns
ALONG = {"rows": "[:, None]", "columns": "[None, :]", "all": ""}
KEEP = {"strict": "o_c[:, None] > o_c[None, :]", "inclusive": "o_c[:, None] >= o_c[None, :]"}


class AdjointStages:
    """TritonPrinter's methods for the adjoint stages (one per k3s op)."""

    def print_binary(self, op, symbol: str) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = {register(op.lhs)} {symbol} {register(op.rhs)}")

    def print_k3s_add(self, op: k3s.AddOp) -> None:
        self.print_binary(op, "+")

    def print_k3s_sub(self, op: k3s.SubOp) -> None:
        self.print_binary(op, "-")

    def print_k3s_mul(self, op: k3s.MulOp) -> None:
        self.print_binary(op, "*")

    def print_k3s_neg(self, op: k3s.NegOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = -{register(op.operand)}")

    def print_k3s_dot(self, op: k3s.DotOp) -> None:
        lhs, rhs = register(op.lhs), register(op.rhs)
        if op.transpose_lhs is not None and op.transpose_lhs.value.data:
            lhs = f"tl.trans({lhs})"
        if op.transpose_rhs is not None and op.transpose_rhs.value.data:
            rhs = f"tl.trans({rhs})"
        product = "_mm_accurate" if op.accurate is not None and op.accurate.value.data else "_mm"
        self.code.comment(op)
        self.code(f"{register(op.result)} = {product}({lhs}, {rhs}, DOT)")

    def print_k3s_scale(self, op: k3s.ScaleOp) -> None:
        factor = register(op.factor) if isinstance(op.factor.type, k3s.TileType) else tensor_name(op.factor)
        self.code.comment(op)
        self.code(f"{register(op.result)} = {register(op.operand)} * {factor}{ALONG[op.along.data]}")

    def print_k3s_reduce_sum(self, op: k3s.ReduceSumOp) -> None:
        axis = {"rows": ", axis=1", "columns": ", axis=0", "all": ""}[op.along.data]
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.sum({register(op.operand)}{axis})")

    def print_k3s_mask(self, op: k3s.MaskOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.where({KEEP[op.mask.data]}, {register(op.operand)}, 0.0)")

    def print_k3s_diagonal(self, op: k3s.DiagonalOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.sum(tl.where(o_c[:, None] == o_c[None, :], {register(op.operand)}, 0.0), "
                  "axis=1)")

    def print_k3s_gated_contraction(self, op: k3s.GatedContractionOp) -> None:
        c = self.code
        c.comment(op, "G in log2 units")
        form = op.form.data
        if form == "guarded":
            c(f"if {register(op.guard)}:")
            with c.indent():
                self.print_contraction_factored(op)
            c("else:")
            with c.indent():
                self.print_contraction_elementwise(op)
        elif form == "factored":
            self.print_contraction_factored(op)
        else:
            self.print_contraction_elementwise(op)

    def print_contraction_factored(self, op: k3s.GatedContractionOp) -> None:
        M, R, G, X = (register(v) for v in (op.cotangent, op.rows, op.cumulative_gate, op.result))
        # An inclusive-masked cotangent's diagonal meets no decay (exp(G_i - G_i) = 1): its terms are
        # added elementwise in fp32, and the product takes the strict part. Through the product's
        # operands (bf16 for bf16 inputs) the diagonal's terms, undecayed and the largest where the
        # gates are steep, would be rounded, and the gate's cotangent q q_bar - k k_bar, in which they
        # cancel exactly, would keep their rounding (dg 30x off with every gate at -5 in bf16).
        diagonal = ""
        owner = op.cotangent.owner
        if isinstance(owner, k3s.MaskOp) and owner.mask.data == "inclusive":
            self.code(f"{X}_diagonal = tl.sum(tl.where(o_c[:, None] == o_c[None, :], {M}, 0.0), axis=1)")
            M, diagonal = f"tl.where({KEEP['strict']}, {M}, 0.0)", f" + {X}_diagonal[:, None] * {R}"
        if op.side.data == "rows":
            self.code(f"{X} = _mm({M}, {R} * tl.exp2(-{G}), DOT) * tl.exp2({G}){diagonal}")
        else:
            self.code(f"{X} = _mm(tl.trans({M}), {R} * tl.exp2({G}), DOT) * tl.exp2(-{G}){diagonal}")

    def print_contraction_elementwise(self, op: k3s.GatedContractionOp) -> None:
        """Token j of the chunk at a time, the decays exp2 of differences (<= 0 where M_bar is not 0)."""
        c = self.code
        M, R, G, X = (register(v) for v in (op.cotangent, op.rows, op.cumulative_gate, op.result))
        c(f"{X} = tl.zeros([BC, BK], dtype=tl.float32)", "for j in range(0, BC):")
        with c.indent():
            c("b_at = o_c == j",
              f"b_Gat = tl.sum(tl.where(b_at[:, None], {G}, 0.0), axis=0)  # token j's log-decay",
              f"b_Mj = tl.sum(tl.where(b_at[None, :], {M}, 0.0), axis=1)  # column j",
              f"b_decay = tl.exp2(tl.minimum({G} - b_Gat[None, :], 0.0))")
            if op.side.data == "rows":
                c(f"b_Rj = tl.sum(tl.where(b_at[:, None], {R}, 0.0), axis=0)",
                  f"{X} += b_Mj[:, None] * b_Rj[None, :] * b_decay")
            else:
                c(f"b_Xj = tl.sum(b_Mj[:, None] * {R} * b_decay, axis=0)",
                  f"{X} = tl.where(b_at[:, None], b_Xj[None, :], {X})")

    def print_k3s_pair_decay(self, op: k3s.PairDecayOp) -> None:
        G = register(op.cumulative_gate)
        keep = KEEP[op.mask.data]
        self.code.comment(op, "exp2 of differences that are <= 0 where kept")
        self.code(f"{register(op.result)} = tl.where({keep}, tl.exp2(tl.where({keep}, {G}[:, None] - {G}[None, :], "
                  "0.0)), 0.0)")

    def print_k3s_reverse_cumsum(self, op: k3s.ReverseCumsumOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.cumsum({register(op.operand)}, axis=0, reverse=True)")

    def print_k3s_onto_last_row(self, op: k3s.OntoLastRowOp) -> None:
        # the row k3s.gate_total reads: the chunk's last (rows past a sequence's end hold its G)
        x = register(op.operand)
        self.code.comment(op, "the row k3s.gate_total reads")
        if k3s.tile_dims(op.operand):
            self.code(f"{register(op.result)} = tl.where((o_c == BC - 1)[:, None], {x}[None, :], 0.0)")
        else:
            self.code(f"{register(op.result)} = tl.where(o_c == BC - 1, {x}, 0.0)")

    # --- the gradients' stores ---------------------------------------------------------------------

    def print_k3s_store_cotangent(self, op: k3s.StoreCotangentOp) -> None:
        c = self.code
        x = register(op.cotangent)
        c.comment(op)
        of = op.of.data
        # the rows of the input and its gradient (one layout: the gradient has the input's shape)
        (raw, mask), (gradient, _) = (tensor_address(op, tensor) for tensor in (op.inputs[0], op.gradients[0]))
        if of in ("q", "k"):
            if op.l2norm is not None and op.l2norm.value.data:  # x / |x|: (x_bar - xh (xh . x_bar)) / |x|
                c(f"b_raw = tl.load({raw}, mask={mask}, other=0.0).to(tl.float32)",
                  "b_norm = tl.sqrt(tl.sum(b_raw * b_raw, axis=1) + 1e-6)",
                  "b_unit = b_raw / b_norm[:, None]",
                  f"{x} = ({x} - b_unit * tl.sum({x} * b_unit, axis=1)[:, None]) / b_norm[:, None]")
            c("if HV == H:")
            with c.indent():
                c(f"tl.store({gradient}, {x}, mask={mask})")
            c("else:  # the value heads of a group share these rows")
            with c.indent():
                c(f"tl.atomic_add({gradient}, {x}, mask={mask})")
        elif of == "v":
            c(f"tl.store({gradient}, {x}, mask={mask})")
        elif of == "beta":
            self.print_beta_gradient(op, x, raw, gradient, mask)
        else:
            self.print_gate_gradient(op, x, raw, gradient, mask)

    def print_beta_gradient(self, op: k3s.StoreCotangentOp, x: str, raw: str, gradient: str, mask: str) -> None:
        """`raw`, `gradient`: the addresses of the rows of beta and its gradient, `mask` theirs."""
        c = self.code
        form = op.beta_input.data
        if form != "probability":  # sigmoid'(z) = s (1 - s); twice that for 2 sigmoid(z)
            c(f"b_s = tl.sigmoid(tl.load({raw}, mask={mask}, other=0.0).to(tl.float32))",
              f"{x} = {x} * b_s * (1.0 - b_s)" + (" * 2.0" if form == "logits_neg_eigval" else ""))
        c(f"tl.store({gradient}, {x}, mask={mask})")

    def print_gate_gradient(self, op: k3s.StoreCotangentOp, x: str, raw: str, gradient: str, mask: str) -> None:
        """The log-decay's cotangent taken back through the gate's input form to g (and A_log,
        dt_bias: summed over the chunk's tokens, added up over the chunks); `raw`, `gradient`: the
        addresses of the rows of g and dg, `mask` theirs."""
        c = self.code
        channel = k3s.tile_dims(op.cotangent) == ("C", "K")
        parameter_grads, parameters = ([tensor_name(t) for t in tensors[1:]] for tensors in (op.gradients, op.inputs))
        form = op.gate_input.data
        # the floor: no gradient where the form's g lies below it (nor has the decay one there)
        floor = None if op.floor is None else f"{x} = tl.where({{}} >= {op.floor.value.data!r}, {x}, 0.0)"
        if form != "log" or floor:
            c(f"b_raw = tl.load({raw}, mask={mask}, other=0.0).to(tl.float32)")
        if form in ("log", "clamped"):
            if form == "clamped":  # max(g, bound): no gradient where the bound holds (torch's clamp)
                c(f"{x} = tl.where(b_raw >= {op.lower_bound.value.data!r}, {x}, 0.0)")
            if floor:
                c(floor.format("b_raw"))
        else:
            A_log, dt_bias = parameters
            dA_log, ddt_bias = parameter_grads
            bias = (f"tl.load({dt_bias} + i_hv * K + o_k, mask=m_k, other=0.0)[None, :]" if channel
                    else f"tl.load({dt_bias} + i_hv)")
            c(f"b_a = tl.exp(tl.load({A_log} + i_hv).to(tl.float32))",
              f"b_z = b_raw + {bias}.to(tl.float32)")
            bound = repr(op.lower_bound.value.data)
            if form == "softplus":  # g = -a softplus(z): dg/dz = -a sigmoid(z), dg/dA_log = g
                c("b_dz = -b_a * tl.sigmoid(b_z)",
                  "b_dlog = -b_a * tl.where(b_z > 20.0, b_z, tl.log(1.0 + tl.exp(tl.minimum(b_z, 20.0))))")
            else:  # g = bound sigmoid(a z): dg/dz = bound s (1 - s) a, dg/dA_log = that times z
                c("b_s = tl.sigmoid(b_a * b_z)", f"b_dz = {bound} * b_s * (1.0 - b_s) * b_a", "b_dlog = b_dz * b_z")
            if floor:
                c(floor.format("b_dlog" if form == "softplus" else f"{bound} * b_s"))
            c(f"tl.atomic_add({dA_log} + i_hv, tl.sum(tl.where({mask}, {x} * b_dlog, 0.0)))")
            c(f"{x} = tl.where({mask}, {x} * b_dz, 0.0)")
            if channel:
                c(f"tl.atomic_add({ddt_bias} + i_hv * K + o_k, tl.sum({x}, axis=0), mask=m_k)")
            else:
                c(f"tl.atomic_add({ddt_bias} + i_hv, tl.sum({x}))")
        c(f"tl.store({gradient}, {x}, mask={mask})")
