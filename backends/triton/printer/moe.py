"""The MoE routing's stages. The logits kernel: the router logits (a loop over the blocks of
hidden columns of the program's slice) and their store as partial logits; a program holds a
block of BR token rows (o_r, m_r) against a block of BE experts (o_e, m_e) over slice i_hs of
the HS slices of the hidden columns, all three its grid axes. The top-k kernel: the partial
logits' sum, the sigmoid, the top-k selection, the routing weights and their store; a program
holds a block of BR token rows (its grid axis) with every expert, padded to BE (o_e, m_e: made
by the sum), and BKS top-k slots. Each kernel's launch takes the block sizes of its
k3s.launch_by_rows ops by the call's token rows; the entry sets the slice count dims["HS"] by
them before it allocates the partial logits."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import BLOCK_CONSTANTS, EntryView, describe, register, tensor_name
from k3compile.ir import k3s


class MoE:
    """TritonPrinter's methods for the MoE routing (one per k3s op, and their helpers)."""

    def print_axis_expert_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BE experts",
            f"i_eb = tl.program_id({axis})",
            "o_e = i_eb * BE + tl.arange(0, BE)",
            "m_e = o_e < E",
        )

    def print_axis_hidden_slice(self, axis: int) -> None:
        self.code(f"# grid axis {axis}: slice i_hs of the HS slices of the hidden columns", f"i_hs = tl.program_id({axis})")

    def print_launch_by_rows(self, kernel: k3s.KernelOp, view: EntryView) -> None:
        """The block sizes of the kernel's k3s.launch_by_rows ops, chosen by the call's rows."""
        launches = k3s.launch_by_rows_ops(view.entry, kernel)
        if any(launch.num_warps is not None for launch in launches):  # the launch passes num_warps=num_warps
            self.code(f"num_warps = {kernel.num_warps.value.data}")
        for index, launch in enumerate(launches):
            sizes = {constant: launch.properties[key].value.data
                     for key, constant in {**BLOCK_CONSTANTS, "num_warps": "num_warps"}.items() if key in launch.properties}
            self.code(f"# {describe(launch)}",
                      f'{"el" if index else ""}if dims["R"] <= {launch.max_rows.value.data}:')
            with self.code.indent():
                self.code(f"{', '.join(sizes)} = {', '.join(map(str, sizes.values()))}")

    def print_k3s_router_logits(self, op: k3s.RouterLogitsOp) -> None:
        c = self.code
        logits, x, weight = register(op.logits), tensor_name(op.input), tensor_name(op.weight)
        c.comment(op, "x W_r^T over the blocks of BD hidden columns of the program's slice, fp32 accumulation; "
                      "padded rows and experts are 0")
        c("# slice i_hs: blocks i_hs NB // HS .. (i_hs + 1) NB // HS - 1 of the NB = cdiv(D, BD), an even share "
          "(counts differ by at most one, none empty while HS <= NB)",
          f"{logits} = tl.zeros([BR, BE], dtype=tl.float32)",
          "for i_d in range(i_hs * tl.cdiv(D, BD) // HS, (i_hs + 1) * tl.cdiv(D, BD) // HS):")
        with c.indent():
            c("o_d = i_d * BD + tl.arange(0, BD)",
              "m_d = o_d < D",
              f"b_x = tl.load({x} + o_r[:, None] * D + o_d[None, :], mask=m_r[:, None] & m_d[None, :], other=0.0)",
              "# the router rows transposed, [BD, BE]",
              f"b_wt = tl.load({weight} + o_e[None, :] * D + o_d[:, None], mask=m_d[:, None] & m_e[None, :], "
              "other=0.0)",
              f"{logits} += _mm(b_x, b_wt, DOT)")

    def print_k3s_store_partial_logits(self, op: k3s.StorePartialLogitsOp) -> None:
        # plane i_hs of [HS, R, E]: i_hs * R stays below 2**31 (HS R E fp32 would not fit a GPU)
        self.code.comment(op, "the block's rows and experts in the plane of the program's slice")
        self.code(f"tl.store({tensor_name(op.partial_logits)} + (i_hs * R + o_r[:, None]) * E + o_e[None, :], "
                  f"{register(op.logits)}, "
                  "mask=m_r[:, None] & m_e[None, :])")

    def print_k3s_sum_partial_logits(self, op: k3s.SumPartialLogitsOp) -> None:
        c = self.code
        logits = register(op.logits)
        c.comment(op, "every expert of the block's rows, the slices in increasing order; padded experts are never "
                      "chosen, padded rows never stored (their logits 0, so their weights' sum is not 0)")
        c("o_e = tl.arange(0, BE)",
          "m_e = o_e < E",
          f"{logits} = tl.zeros([BR, BE], dtype=tl.float32)",
          "for i_hs in range(HS):")
        with c.indent():
            c(f"{logits} += tl.load({tensor_name(op.partial_logits)} + (i_hs * R + o_r[:, None]) * E + o_e[None, :], "
              "mask=m_r[:, None] & m_e[None, :], other=0.0)")

    def print_k3s_router_sigmoid(self, op: k3s.RouterSigmoidOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.scores)} = tl.sigmoid({register(op.logits)})")

    def print_k3s_select_top_k(self, op: k3s.SelectTopKOp) -> None:
        c = self.code
        s, ids, weights = register(op.scores), register(op.ids), register(op.weights)
        c.comment(op, "top_k rounds of an argmax over s + bias, each taking its expert out of the race; "
                      "argmax's tie_break_left ranks the lower expert id first, padded experts are never chosen")
        c("o_ks = tl.arange(0, BKS)",
          f"b_race = tl.where(m_e[None, :], {s} + tl.load({tensor_name(op.bias)} + o_e, mask=m_e, other=0.0)[None, :], "
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
            self.code.comment(op, "normalised over the top-k slots (+1e-20: all-underflowed scores give 0, not 0/0), scaled")
            self.code(f"{register(op.scaled)} = {weights} / (tl.sum({weights}, axis=1)[:, None] + 1e-20) * {scale}")
        else:
            self.code.comment(op, "scaled")
            self.code(f"{register(op.scaled)} = {weights} * {scale}")

    def print_k3s_store_routing(self, op: k3s.StoreRoutingOp) -> None:
        c = self.code
        c.comment(op, "the block's rows, the top_k slots")
        c("o_ks = tl.arange(0, BKS)",
          "m_rk = m_r[:, None] & (o_ks < TOP_K)[None, :]",
          f"tl.store({tensor_name(op.topk_ids)} + o_r[:, None] * TOP_K + o_ks[None, :], {register(op.ids)}, mask=m_rk)",
          f"tl.store({tensor_name(op.topk_weights)} + o_r[:, None] * TOP_K + o_ks[None, :], {register(op.weights)}, "
          "mask=m_rk)")
