"""The AttnRes aggregate's stages: the folded query, the source loop, the RMS score, the
online softmax, the weighted mix and the normalised store."""

from __future__ import annotations

from k3compile.ir import k3s


class AttnRes:
    """TritonPrinter's methods for AttnRes (one per k3s op, and their helpers)."""

    def print_k3s_fold_query(self, op: k3s.FoldQueryOp) -> None:
        self.code.comment(op, "RMSNorm gain folded into the pseudo-query")
        self.code(
            "b_q = tl.load(query + o_d, mask=m_d, other=0.0).to(tl.float32)"
            " * tl.load(gain + o_d, mask=m_d, other=0.0).to(tl.float32)",
            'b_max = tl.full([], float("-inf"), dtype=tl.float32)',
            "b_sum = tl.zeros([], dtype=tl.float32)",
            "b_acc = tl.zeros([BD], dtype=tl.float32)",
        )

    def print_k3s_source_loop(self, op: k3s.SourceLoopOp) -> None:
        c = self.code
        c.comment(op, "each source row is read once")
        c("for i_s in range(0, S):")
        with c.indent():
            c("b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)")
            self.print_ops(op)

    def print_k3s_rms_score(self, op: k3s.RmsScoreOp) -> None:
        self.code.comment(op, "score = q . x / rms(x)")
        self.code(f"b_score = tl.sum(b_x * b_q) / tl.sqrt(tl.sum(b_x * b_x) / D + {op.eps.value.data!r})")

    def print_k3s_online_softmax(self, op: k3s.OnlineSoftmaxOp) -> None:
        self.code.comment(op)
        self.code(
            "b_new_max = tl.maximum(b_max, b_score)",
            "b_rescale = tl.exp(b_max - b_new_max)",
            "b_p = tl.exp(b_score - b_new_max)",
            "b_sum = b_sum * b_rescale + b_p",
            "b_max = b_new_max",
        )

    def print_k3s_mix_accumulate(self, op: k3s.MixAccumulateOp) -> None:
        self.code.comment(op)
        self.code("b_acc = b_acc * b_rescale + b_p * b_x")

    def print_k3s_normalize_store(self, op: k3s.NormalizeStoreOp) -> None:
        self.code.comment(op)
        self.code("tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)")
