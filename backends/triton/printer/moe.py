"""The MoE routing's stages: the router logits (a loop over blocks of hidden columns), the
sigmoid, the top-k selection, the routing weights and their store. A program holds a block of
BR token rows (o_r, m_r: its grid axis) with every expert, padded to BE, and BKS top-k slots."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import register
from k3compile.ir import k3s


class MoE:
    """TritonPrinter's methods for the MoE routing (one per k3s op, and their helpers)."""

    def print_experts(self) -> None:
        self.code("o_e = tl.arange(0, BE)", "m_e = o_e < E")

    def print_k3s_router_logits(self, op: k3s.RouterLogitsOp) -> None:
        c = self.code
        logits = register(op.logits)
        c.comment(op, "x W_r^T over blocks of BD hidden columns, fp32 accumulation; padded rows and experts are 0")
        self.print_experts()
        c(f"{logits} = tl.zeros([BR, BE], dtype=tl.float32)", "for i_d in range(0, tl.cdiv(D, BD)):")
        with c.indent():
            c("o_d = i_d * BD + tl.arange(0, BD)",
              "m_d = o_d < D",
              "b_x = tl.load(x + o_r[:, None] * D + o_d[None, :], mask=m_r[:, None] & m_d[None, :], other=0.0)",
              "# the router rows transposed, [BD, BE]",
              "b_wt = tl.load(router_weight + o_e[None, :] * D + o_d[:, None], mask=m_d[:, None] & m_e[None, :], "
              "other=0.0)",
              f"{logits} += _mm(b_x, b_wt, DOT)")

    def print_k3s_router_sigmoid(self, op: k3s.RouterSigmoidOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.scores)} = tl.sigmoid({register(op.logits)})")

    def print_k3s_select_top_k(self, op: k3s.SelectTopKOp) -> None:
        c = self.code
        s, ids, weights = register(op.scores), register(op.ids), register(op.weights)
        c.comment(op, "top_k rounds of an argmax over s + bias, each taking its expert out of the race; "
                      "argmax's tie_break_left ranks the lower expert id first, padded experts are never chosen")
        self.print_experts()
        c("o_ks = tl.arange(0, BKS)",
          f'b_race = tl.where(m_e[None, :], {s} + tl.load(router_bias + o_e, mask=m_e, other=0.0)[None, :], '
          'float("-inf"))',
          f"{ids} = tl.zeros([BR, BKS], dtype=tl.int32)",
          f"{weights} = tl.zeros([BR, BKS], dtype=tl.float32)",
          "for i_k in range(TOP_K):")
        with c.indent():
            c("b_best = tl.argmax(b_race, axis=1, tie_break_left=True)",
              "b_taken = o_e[None, :] == b_best[:, None]",
              "b_slot = o_ks[None, :] == i_k",
              f"{ids} = tl.where(b_slot, b_best[:, None], {ids})",
              f"{weights} = tl.where(b_slot, tl.sum(tl.where(b_taken, {s}, 0.0), axis=1)[:, None], {weights})",
              'b_race = tl.where(b_taken, float("-inf"), b_race)')

    def print_k3s_routing_weights(self, op: k3s.RoutingWeightsOp) -> None:
        weights, scale = register(op.weights), repr(op.scale.value.data)
        if op.normalize.value.data:  # the padded slots hold 0: the sum is over the top_k
            self.code.comment(op, "normalised over the top-k slots, scaled")
            self.code(f"{register(op.scaled)} = {weights} / tl.sum({weights}, axis=1)[:, None] * {scale}")
        else:
            self.code.comment(op, "scaled")
            self.code(f"{register(op.scaled)} = {weights} * {scale}")

    def print_k3s_store_routing(self, op: k3s.StoreRoutingOp) -> None:
        c = self.code
        c.comment(op, "the block's rows, the top_k slots")
        c("o_ks = tl.arange(0, BKS)",
          "m_rk = m_r[:, None] & (o_ks < TOP_K)[None, :]",
          f"tl.store(topk_ids + o_r[:, None] * TOP_K + o_ks[None, :], {register(op.ids)}, mask=m_rk)",
          f"tl.store(topk_weights + o_r[:, None] * TOP_K + o_ks[None, :], {register(op.weights)}, mask=m_rk)")
