"""Context parallelism's stages: the summary combine (a host step of the entry), the decay
product (its start, a chunk's factor) and the transition's store."""

from __future__ import annotations

from k3compile.backends.triton.printer.chunk_stages import TILE_BLOCKS
from k3compile.backends.triton.printer.common import EntryView, describe, register, tensor_name
from k3compile.ir import k3s


# a segments entry's host steps: the callback parameter each summary_combine calls (by its
# adjoint flag), what its docstring says, and the comment above the call
COMBINE_CALLBACKS = {
    False: ("entering_states", ["(M, N) -> [N, ...] float32: the state entering every segment (sequence of",
                                "    cu_seqlens), from all segments' summaries (M None for the identity transition)"],
            "every segment's entering state from the summaries (the caller's scan order)"),
    True: ("leaving_cotangents", ["(M, N_bar) -> [N, ...] float32: the cotangent of the state every segment leaves,",
                                  "    from the adjoint summaries (M^T, N_bar) of the segments after it (N_bar: the",
                                  "    entering state's cotangent from the segment's own do; M None for the identity)"],
           "every segment's leaving cotangent from the adjoint summaries (the caller's scan order, in reverse)"),
}


class Segments:
    """TritonPrinter's methods for segments (one per k3s op, and their helpers)."""

    @staticmethod
    def combine_steps(view: EntryView) -> list[tuple[k3s.SummaryCombineOp, str, list[str]]]:
        """An entry's host combine steps: (op, its callback parameter, the parameter's doc lines)."""
        steps = [op for op in view.entry.body.ops if isinstance(op, k3s.SummaryCombineOp)]
        return [(op, *COMBINE_CALLBACKS[op.is_adjoint()][:2]) for op in steps]

    def print_combine(self, op: k3s.SummaryCombineOp, view: EntryView) -> None:
        """A host step of a segments entry: the caller's combine of the summaries (or its adjoint's)."""
        c = self.code
        first = view.tensors[0].sym_name.data
        *M, N, made = op.tensors
        name = tensor_name(made)
        callback, _, what = COMBINE_CALLBACKS[op.is_adjoint()]
        c(f"# {describe(op)}: {what}",
          f"{name} = {callback}({tensor_name(M[0]) if M else 'None'}, {tensor_name(N)})",
          f'_check_tensor("{name}", {name}, "{made.type.pattern}", "{made.type.dtype_class}", dims, {first}.device)')

    def print_k3s_decay_product_start(self, op: k3s.DecayProductStartOp) -> None:
        self.code.comment(op, "M before any chunk")
        shape = ", ".join(TILE_BLOCKS[d] for d in k3s.tile_dims(op.product))
        self.code(f"{register(op.product)} = tl.full([{shape}], 1.0, tl.float32)")

    def print_k3s_decay_product(self, op: k3s.DecayProductOp) -> None:
        self.code.comment(op, "M <- Diag(gamma_C) M")
        self.code(f"{register(op.multiplied)} = {register(op.product)} * {register(op.decay)}")

    def print_k3s_store_transition(self, op: k3s.StoreTransitionOp) -> None:
        self.code.comment(op, "every value block holds the same M: the first one writes it")
        M, product = tensor_name(op.output), register(op.product)
        if op.transition.data == "diagonal":
            self.code(f"tl.store({M} + i_nh * K + o_k, {product}, mask=m_k & ((i_v + 0 * o_k) == 0))")
        else:
            self.code("if i_v == 0:")
            with self.code.indent():
                self.code(f"tl.store({M} + i_nh, {product})")
