"""The AttnRes aggregate's stages: the folded query, the source loop, the RMS score, the
online softmax, the weighted mix and the normalised store."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import pipelined_range, register, tensor_name
from k3compile.ir import k3s


class AttnRes:
    """TritonPrinter's methods for AttnRes (one per k3s op, and their helpers)."""

    def print_k3s_fold_query(self, op: k3s.FoldQueryOp) -> None:
        self.code.comment(op, "RMSNorm gain folded into the pseudo-query")
        query, gain = tensor_name(op.pseudo_query), tensor_name(op.gain)
        self.code(f"{register(op.query)} = tl.load({query} + o_d, mask=m_d, other=0.0).to(tl.float32)"
                  f" * tl.load({gain} + o_d, mask=m_d, other=0.0).to(tl.float32)")

    def print_k3s_source_loop(self, op: k3s.SourceLoopOp) -> None:
        c = self.code
        running_max, normaliser, mix = (register(v) for v in op.body.block.args)
        c(f'{running_max} = tl.full([], float("-inf"), dtype=tl.float32)',
          f"{normaliser} = tl.zeros([], dtype=tl.float32)",
          f"{mix} = tl.zeros([BD], dtype=tl.float32)")
        c.comment(op, "each source row is read once")
        c(f"for i_s in {pipelined_range(op, '0', 'S')}:")
        with c.indent():
            self.print_ops(op)

    def print_k3s_load_source(self, op: k3s.LoadSourceOp) -> None:
        self.code(f"{register(op.row)} = tl.load({tensor_name(op.sources)} + (i_s * R + i_r) * D + o_d, mask=m_d, "
                  "other=0.0).to(tl.float32)")

    def print_k3s_rms_score(self, op: k3s.RmsScoreOp) -> None:
        x, q = register(op.row), register(op.query)
        self.code.comment(op, "score = q . x / rms(x)")
        self.code(f"{register(op.score)} = tl.sum({x} * {q}) / tl.sqrt(tl.sum({x} * {x}) / D + {op.eps.value.data!r})")

    def print_k3s_online_softmax(self, op: k3s.OnlineSoftmaxOp) -> None:
        running_max, normaliser, score = (register(v) for v in (op.running_max, op.normaliser, op.score))
        weight, rescale = register(op.weight), register(op.rescale)
        self.code.comment(op)
        self.code(
            f"b_new_max = tl.maximum({running_max}, {score})",
            f"{rescale} = tl.exp({running_max} - b_new_max)",
            f"{weight} = tl.exp({score} - b_new_max)",
            f"{register(op.new_normaliser)} = {normaliser} * {rescale} + {weight}",
            f"{register(op.new_max)} = b_new_max",
        )

    def print_k3s_mix_accumulate(self, op: k3s.MixAccumulateOp) -> None:
        mix, rescale, weight, x = (register(v) for v in (op.mix, op.rescale, op.weight, op.row))
        self.code.comment(op)
        self.code(f"{register(op.updated)} = {mix} * {rescale} + {weight} * {x}")

    def print_k3s_next_source(self, op: k3s.NextSourceOp) -> None:
        """Nothing to print: the running softmax is already where the loop carries it."""

    def print_k3s_normalize_store(self, op: k3s.NormalizeStoreOp) -> None:
        self.code.comment(op)
        out = tensor_name(op.out)
        self.code(f"tl.store({out} + i_r * D + o_d, ({register(op.mix)} / {register(op.normaliser)})"
                  f".to({out}.dtype.element_ty), mask=m_d)")
