"""Context parallelism's stages: the summary combine (a host step of the entry), the decay
product and the transition's store."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import EntryView, describe, register, tensor_name
from k3compile.ir import k3s


class Segments:
    """TritonPrinter's methods for segments (one per k3s op, and their helpers)."""

    def print_combine(self, op: k3s.SummaryCombineOp, view: EntryView) -> None:
        """The host step of a segments entry: the caller's combine of the summaries."""
        c = self.code
        first = view.tensors[0].sym_name.data
        *M, N, made = op.tensors
        name = tensor_name(made)
        c(f"# {describe(op)}: every segment's entering state from the summaries (the caller's scan order)",
          f"{name} = entering_states({tensor_name(M[0]) if M else 'None'}, {tensor_name(N)})",
          f'_check_tensor("{name}", {name}, "{made.type.pattern}", "{made.type.dtype_class}", dims, {first}.device)')

    def print_k3s_decay_product(self, op: k3s.DecayProductOp) -> None:
        self.code.comment(op, "M <- Diag(gamma_C) M")
        self.code(f"b_M = b_M * {register(op.decay)}")

    def print_k3s_store_transition(self, op: k3s.StoreTransitionOp) -> None:
        self.code.comment(op, "every value block holds the same M: the first one writes it")
        M = tensor_name(op.output)
        if op.transition.data == "diagonal":
            self.code(f"tl.store({M} + i_nh * K + o_k, b_M, mask=m_k & ((i_v + 0 * o_k) == 0))")
        else:
            self.code("if i_v == 0:")
            with self.code.indent():
                self.code(f"tl.store({M} + i_nh, b_M)")
