"""Block AttnRes's phase 1 in blocks of columns: its forward (derive-block-attnres's
partials-schedule=columns) and the loop and grid axis its backward shares
(derive-block-attnres-backward's partials-backward=columns: attnres_columns_backward.py).
A program's group of BR token rows with all the call's Q queries (BQ, the kernel's block_q:
legalize-triton's #k3s.runtime_block<Q>, at least 16) and all of a row's S representatives (BS,
its block_s), the hidden columns in blocks of BD. Names the grid axis defines: i_rg, o_q, m_q;
a column loop: i_c, o_d, m_d (the block's columns), m_qd.

`<R x S ..>` tiles hold the group's (row, representative) pairs flattened, k = r BS + i:
[BR * BS, ..] (o_k, its token rows i_rk, representatives i_sk, mask m_k); `<R x Q ..>` its
(row, query) pairs, m = r BQ + j: [BR * BQ, ..] (o_m, i_rm, i_qm, m_m). Products are tl.dot of
operands in the activations' dtype (exact products, fp32 sums), input_precision "ieee" (fp32
products at fp32: the setting is ignored for 16-bit operands)."""

from __future__ import annotations

import math

from k3compile.backends.triton.printer.common import block_constant, kernel_constants_of, pipelined_range, register, \
    tensor_name
from k3compile.ir import k3s

GROUP_PAIRS = ("o_k = tl.arange(0, BR * BS)", "i_rk = i_rg * BR + o_k // BS", "i_sk = o_k % BS",
               "m_k = (i_sk < S) & (i_rk < R)")
GROUP_QUERIES = ("o_m = tl.arange(0, BR * BQ)", "i_rm = i_rg * BR + o_m // BQ", "i_qm = o_m % BQ",
                 "m_m = (i_qm < Q) & (i_rm < R)")
# a sum of squares the products on the tensor cores hold exactly: no square past fp32's range
# (a sum at most 2^100) and none flushed where it matters (mean + eps at least 2^-100)
SAFE_SUM_SQ = (2.0 ** 100, 2.0 ** -100)


class AttnResColumnsForward:
    """TritonPrinter's methods for the ops of phase 1's forward in blocks of columns, and the
    grid axis and column loop both directions share."""

    def print_axis_row_group_all_queries(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a group of BR token rows, with all Q queries and all S representatives of a row",
            f"i_rg = tl.program_id({axis}).to(tl.int64)",
            "o_q = tl.arange(0, BQ)",
            "m_q = o_q < Q",
        )

    def print_k3s_column_loop(self, op: k3s.ColumnLoopOp) -> None:
        c = self.code
        self.print_carried(op)
        if op.reverse is not None and op.reverse.value.data:
            c.comment(op, "the hidden columns in blocks of BD, the last block first")
            c(f"for i_b in {pipelined_range(op, '0', 'tl.cdiv(D, BD)')}:")
            first = ["i_c = (tl.cdiv(D, BD) - 1 - i_b) * BD"]
        else:
            c.comment(op, "the hidden columns in blocks of BD")
            c(f"for i_c in {pipelined_range(op, '0', 'D', 'BD')}:")
            first = []
        with c.indent():
            c(*first, "o_d = i_c + tl.arange(0, BD)", "m_d = o_d < D", "m_qd = m_q[:, None] & m_d[None, :]")
            self.print_ops(op)

    def print_k3s_next_column(self, op: k3s.NextColumnOp) -> None:
        """Nothing to print: the carried values are already where the loop carries them."""

    @kernel_constants_of(k3s.ColumnLoopOp)
    def column_loop_constants(self, op: k3s.ColumnLoopOp, kernel: k3s.KernelOp, view) -> dict[str, int]:
        return dict(BD=op.columns.value.data)

    @kernel_constants_of(k3s.FoldQueriesSplitOp)
    def fold_queries_split_constants(self, op: k3s.FoldQueriesSplitOp, kernel: k3s.KernelOp, view) -> dict[str, int]:
        return dict(DIN=op.hidden_size.value.data, BD=op.columns.value.data)

    @kernel_constants_of(k3s.LoadGroupSourcesOp)
    def load_group_sources_constants(self, op: k3s.LoadGroupSourcesOp, kernel: k3s.KernelOp, view) -> dict[str, int]:
        return dict(D=op.hidden_size.value.data, BR=op.rows.value.data, BS=kernel.block_s.value.data)

    @kernel_constants_of(k3s.LoadFoldedQueriesOp)
    def load_folded_queries_constants(self, op: k3s.LoadFoldedQueriesOp, kernel: k3s.KernelOp,
                                      view) -> dict[str, int | str]:
        return dict(BQ=block_constant(kernel.block_q))

    def print_k3s_fold_queries_split(self, op: k3s.FoldQueriesSplitOp) -> None:
        c = self.code
        folded = tensor_name(op.folded)
        c.comment(op, "q = w * gain for every query, over the program's columns, stored as its rounding to the "
                      "activations' dtype and the rest's")
        c("for i_q in range(0, Q):")
        with c.indent():
            c(f"b_q = tl.load({tensor_name(op.queries)} + i_q * DIN + o_d, mask=m_d, other=0.0).to(tl.float32) * "
              f"tl.load({tensor_name(op.gains)} + i_q * DIN + o_d, mask=m_d, other=0.0).to(tl.float32)",
              f"b_high = b_q.to({folded}.dtype.element_ty)",
              f"tl.store({folded} + i_q * DIN + o_d, b_high, mask=m_d)",
              f"tl.store({folded} + (Q + i_q) * DIN + o_d, (b_q - b_high.to(tl.float32))"
              f".to({folded}.dtype.element_ty), mask=m_d)")

    def print_k3s_load_group_sources(self, op: k3s.LoadGroupSourcesOp) -> None:
        last = op.last_use is not None and op.last_use.value.data
        self.code.comment(op, "the group's rows' representatives, read again later: kept in L2" if not last else
                          "the group's rows' representatives, their last read")
        self.code(*GROUP_PAIRS,
                  f"{register(op.tile)} = tl.load({tensor_name(op.representatives)} + (i_sk[:, None] * R + "
                  "i_rk[:, None]) * D + o_d[None, :], mask=m_k[:, None] & m_d[None, :], other=0.0, "
                  f"eviction_policy={'evict_first' if last else 'evict_last'!r})")

    def print_k3s_load_folded_queries(self, op: k3s.LoadFoldedQueriesOp) -> None:
        folded = tensor_name(op.folded)
        self.code(f"{register(op.high)} = tl.load({folded} + o_q[:, None] * D + o_d[None, :], mask=m_qd, other=0.0)",
                  f"{register(op.low)} = tl.load({folded} + (Q + o_q[:, None]) * D + o_d[None, :], mask=m_qd, "
                  "other=0.0)")

    def print_k3s_group_column_dots(self, op: k3s.GroupColumnDotsOp) -> None:
        x, high, low = register(op.rows), register(op.high), register(op.low)
        qx = register(op.new_query_dots)
        self.code.comment(op, "the group's Gram matrix and every query's dot with every row, one block further")
        self.code(f"{register(op.new_gram)} = tl.dot({x}, tl.trans({x}), {register(op.gram)}, input_precision=\"ieee\")",
                  f"{qx} = tl.dot({high}, tl.trans({x}), {register(op.query_dots)}, input_precision=\"ieee\")",
                  f"if {low}.dtype != tl.float32:  # the folded queries' rest (zero at fp32)")
        with self.code.indent():
            self.code(f"{qx} = tl.dot({low}, tl.trans({x}), {qx})")

    def print_k3s_group_scores(self, op: k3s.GroupScoresOp) -> None:
        c = self.code
        eps = op.eps.value.data
        root_eps = max(math.sqrt(eps), 2.0 ** -126)
        gram, score = register(op.gram), register(op.score)
        high, low = SAFE_SUM_SQ
        c.comment(op, "rho = sqrt(mean(x^2) + eps) from the Gram matrix's diagonal, score = q . x / rho; rows past "
                      "the products' safe range read again, scaled")
        c(*GROUP_PAIRS,
          f"b_sum_sq = tl.sum(tl.where(o_k[:, None] == o_k[None, :], {gram}, 0.0), axis=1)",
          f"b_mean = b_sum_sq / D + {eps!r}",
          f"b_safe = ((b_sum_sq <= {high!r}) & (b_mean >= {low!r})) | ~m_k",
          "b_rms = tl.sqrt(tl.where(b_safe, b_mean, 1.0))",
          f"{score} = tl.where(b_safe[:, None], tl.trans({register(op.query_dots)}) / b_rms[:, None], 0.0)",
          "if tl.min(b_safe.to(tl.int32)) == 0:  # rare: a row whose squares left fp32's range")
        with c.indent():
            c("b_scale = tl.zeros([BR * BS], dtype=tl.float32)",
              "b_scaled_sum_sq = tl.zeros([BR * BS], dtype=tl.float32)",
              "b_scaled_qx = tl.zeros([BR * BS, BQ], dtype=tl.float32)",
              "for i_c in tl.range(0, D, BD, num_stages=1):  # not pipelined: no shared memory for a rare path")
            with c.indent():
                folded, reps = tensor_name(op.folded), tensor_name(op.representatives)
                c("o_d = i_c + tl.arange(0, BD)", "m_d = o_d < D", "m_qd = m_q[:, None] & m_d[None, :]",
                  f"b_x = tl.load({reps} + (i_sk[:, None] * R + i_rk[:, None]) * D + o_d[None, :], "
                  "mask=m_k[:, None] & m_d[None, :], other=0.0).to(tl.float32)",
                  f"b_q = tl.load({folded} + o_q[:, None] * D + o_d[None, :], mask=m_qd, other=0.0).to(tl.float32) + "
                  f"tl.load({folded} + (Q + o_q[:, None]) * D + o_d[None, :], mask=m_qd, other=0.0).to(tl.float32)",
                  f"b_new_scale = tl.minimum(tl.maximum(tl.maximum(b_scale, tl.max(tl.abs(b_x), axis=1)), "
                  f"{root_eps!r}), {2.0 ** 126!r})",
                  "b_scaled_rows = b_x * (1.0 / b_new_scale)[:, None]",
                  "b_rescale = b_scale / b_new_scale",
                  "b_scaled_sum_sq = b_scaled_sum_sq * b_rescale * b_rescale + "
                  "tl.sum(b_scaled_rows * b_scaled_rows, axis=1)",
                  "b_scaled_qx = tl.dot(b_scaled_rows, tl.trans(b_q), b_scaled_qx * b_rescale[:, None], "
                  "input_precision=\"ieee\")",
                  "b_scale = b_new_scale")
            c(f"b_scaled_rms = tl.sqrt(b_scaled_sum_sq / D + ({root_eps!r} / b_scale) * ({root_eps!r} / b_scale))",
              f"{score} = tl.where(b_safe[:, None], {score}, b_scaled_qx / b_scaled_rms[:, None])",
              "b_rms = tl.where(b_safe, b_rms, b_scale * b_scaled_rms)")
        if op.rms is not None:
            c(f"{register(op.rms)} = b_rms")

    def print_k3s_group_softmax(self, op: k3s.GroupSoftmaxOp) -> None:
        normalised = op.normalised is not None and op.normalised.value.data
        c = self.code
        c.comment(op, "per row and query the softmax over its representatives; the mix's weights block-diagonal, "
                      "[(row, query), (row, representative)]")
        c("o_k = tl.arange(0, BR * BS)",
          f"b_score = tl.reshape(tl.where((o_k % BS < S)[:, None], {register(op.score)}, float(\"-inf\")), "
          "[BR, BS, BQ])",
          f"{register(op.running_max)} = tl.max(b_score, axis=1)",
          f"b_weight = tl.exp(b_score - {register(op.running_max)}[:, None, :])",
          f"{register(op.normaliser)} = tl.sum(b_weight, axis=1)")
        if normalised:
            c(f"b_weight = b_weight / {register(op.normaliser)}[:, None, :]")
        c("o_r = tl.arange(0, BR)",
          f"{register(op.weights)} = tl.reshape(tl.where(o_r[:, None, None, None] == o_r[None, None, :, None], "
          "tl.permute(b_weight, (0, 2, 1))[:, :, None, :], 0.0), [BR * BQ, BR * BS])")

    def print_k3s_store_group_stats(self, op: k3s.StoreGroupStatsOp) -> None:
        c = self.code
        at = "o_q[None, :] * R + i_rg * BR + tl.arange(0, BR)[:, None]"
        mask = "m_q[None, :] & (i_rg * BR + tl.arange(0, BR) < R)[:, None]"
        running_max, normaliser = register(op.running_max), register(op.normaliser)
        if len(op.stats) == 1:
            c.comment(op, "per row and query the log-sum-exp over its representatives: [Q, rows]")
            c(f"tl.store({tensor_name(op.stats[0])} + {at}, {running_max} + tl.log({normaliser}), mask={mask})")
            return
        c.comment(op, "per row and query the max and normaliser over its representatives: [Q, rows] each")
        for tensor, value in zip(op.stats, (running_max, normaliser), strict=True):
            c(f"tl.store({tensor_name(tensor)} + {at}, {value}, mask={mask})")

    def print_k3s_split_weights(self, op: k3s.SplitWeightsOp) -> None:
        c = self.code
        dtype = f"{tensor_name(op.representatives)}.dtype.element_ty"
        weights, high = register(op.weights), register(op.high)
        if op.scale is None:
            c.comment(op, "the weights in the rows' dtype, and the rest")
        else:
            c.comment(op, "the coefficients over a power of two at or above their largest magnitude, in the rows' "
                          "dtype, and the rest")
            scale = register(op.scale)
            c(f"{scale} = tl.exp2(tl.ceil(tl.log2(tl.maximum(tl.max(tl.abs({weights})), {2.0 ** -100!r}))))",
              f"b_in_range = {weights} / {scale}")
            weights = "b_in_range"
        c(f"{high} = {weights}.to({dtype})", f"{register(op.low)} = ({weights} - {high}.to(tl.float32)).to({dtype})")

    def print_k3s_group_mix(self, op: k3s.GroupMixOp) -> None:
        x, high, low, mix = register(op.rows), register(op.high), register(op.low), register(op.mix)
        self.code.comment(op, "every (row, query)'s mix over the block: the weights' product with the rows")
        self.code(f"{mix} = tl.dot({high}, {x}, input_precision=\"ieee\")",
                  f"if {low}.dtype != tl.float32:  # the weights' rest (zero at fp32)")
        with self.code.indent():
            self.code(f"{mix} = tl.dot({low}, {x}, {mix})")

    def print_k3s_store_group_rows(self, op: k3s.StoreGroupRowsOp) -> None:
        tensor = tensor_name(op.tensor)
        if "Q" in k3s.tile_dims(op.rows):
            self.code.comment(op, "each (row, query)'s row once: [Q, rows, D]")
            pairs, at, mask = GROUP_QUERIES, "i_qm[:, None] * R + i_rm[:, None]", "m_m"
        else:
            self.code.comment(op, "each (row, representative)'s row once: [S, rows, D]")
            pairs, at, mask = GROUP_PAIRS, "i_sk[:, None] * R + i_rk[:, None]", "m_k"
        self.code(*pairs,
                  f"tl.store({tensor} + ({at}) * D + o_d[None, :], {register(op.rows)}.to({tensor}.dtype.element_ty), "
                  f"mask={mask}[:, None] & m_d[None, :], eviction_policy=\"evict_first\")")
