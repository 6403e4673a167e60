"""Block AttnRes's phase 1 backward in blocks of columns (derive-block-attnres-backward's
partials-backward=columns): the forward's grid axis, column loop and tile layouts
(attnres_columns.py: `<R x S ..>` tiles [BR * BS, ..] with o_k, i_rk, i_sk, m_k; `<R x Q ..>`
tiles [BR * BQ, ..] with o_m, i_rm, i_qm, m_m), and the kernel that sums the queries'
cotangents over the rows: grid axes input_block (o_d, m_d: a block of BD columns) and row_part
(i_rp: a part of BR token rows). Products are tl.dot of operands in the activations' dtype,
fp32 coefficients split in two parts of that dtype (k3s.split_weights), input_precision "ieee"
(fp32 products at fp32; ignored for 16-bit operands). Decides nothing: every size is the IR's."""

from __future__ import annotations

from k3compile.backends.triton.printer.attnres_columns import GROUP_PAIRS, GROUP_QUERIES
from k3compile.backends.triton.printer.common import block_constant, kernel_constants_of, pipelined_range, register, \
    tensor_name
from k3compile.ir import k3s

GROUP_ROWS = "i_rg * BR + tl.arange(0, BR)"  # the group's token rows, [BR]
DIAGONAL = "o_r[:, None, None, None] == o_r[None, None, :, None]"  # [(r, .), (r', .)]: r = r', 4-D


class AttnResColumnsBackward:
    """TritonPrinter's methods for the ops of phase 1's backward in blocks of columns."""

    @kernel_constants_of(k3s.LoadGroupRowsOp)
    def load_group_rows_constants(self, op: k3s.LoadGroupRowsOp, kernel: k3s.KernelOp, view) -> dict[str, int | str]:
        return dict(BQ=block_constant(kernel.block_q))

    @kernel_constants_of(k3s.GroupQueryCotangentOp)
    def group_query_cotangent_constants(self, op: k3s.GroupQueryCotangentOp, kernel: k3s.KernelOp,
                                        view) -> dict[str, int | str]:
        D = op.hidden_size.value.data
        return dict(D=D, DIN=D, BD=kernel.block_d.value.data, BR=kernel.block_r.value.data, BK=op.pairs.value.data,
                    BQ=block_constant(kernel.block_q))

    def print_axis_row_part(self, axis: int) -> None:
        self.code(f"# grid axis {axis}: a part of BR token rows of a sum over all the rows",
                  f"i_rp = tl.program_id({axis}).to(tl.int64)")

    def print_k3s_load_group_rows(self, op: k3s.LoadGroupRowsOp) -> None:
        last = op.last_use is not None and op.last_use.value.data
        self.code.comment(op, "the group's (row, query) rows, their last read" if last else
                          "the group's (row, query) rows, read again later: kept in L2")
        self.code(*GROUP_QUERIES,
                  f"{register(op.rows)} = tl.load({tensor_name(op.tensor)} + (i_qm[:, None] * R + i_rm[:, None]) * D + "
                  f"o_d[None, :], mask=m_m[:, None] & m_d[None, :], other=0.0, "
                  f"eviction_policy={'evict_first' if last else 'evict_last'!r})")

    def print_k3s_group_out_bar_dots(self, op: k3s.GroupOutBarDotsOp) -> None:
        self.code.comment(op, "every (row, query)'s dh with every (row, representative) row, one block further")
        self.code(f"{register(op.new_dots)} = tl.dot({register(op.out_bar)}, tl.trans({register(op.rows)}), "
                  f"{register(op.dots)}, input_precision=\"ieee\")")

    def print_k3s_load_group_stats(self, op: k3s.LoadGroupStatsOp) -> None:
        self.code.comment(op, "per row and query: [BR, BQ]")
        self.code(f"{register(op.stats)} = tl.load({tensor_name(op.tensor)} + o_q[None, :] * R + {GROUP_ROWS}[:, None], "
                  f"mask=m_q[None, :] & ({GROUP_ROWS} < R)[:, None], other=0.0)")

    def print_k3s_group_score_adjoint(self, op: k3s.GroupScoreAdjointOp) -> None:
        c = self.code
        rms, lse_bar = register(op.rms), register(op.lse_bar)
        c.comment(op, "p = exp(s - lse), delta = sum_i p_i (dh . x_i), s_bar = p (dh . x - delta + lse_bar); "
                      "t = s_bar / rho, c = sum_j s_bar s / (D rho^2); p block-diagonal")
        c(*GROUP_PAIRS, "o_r = tl.arange(0, BR)",
          f"b_s = tl.reshape({register(op.score)}, [BR, BS, BQ])",
          f"b_weight = tl.where(tl.reshape(m_k, [BR, BS])[:, :, None] & m_q[None, None, :], "
          f"tl.exp(b_s - {register(op.lse)}[:, None, :]), 0.0)",
          f"b_dh_x = tl.permute(tl.sum(tl.where({DIAGONAL}, tl.reshape({register(op.out_bar_dots)}, "
          "[BR, BQ, BR, BS]), 0.0), axis=2), (0, 2, 1))",
          "b_delta = tl.sum(b_weight * b_dh_x, axis=1)",
          f"b_score_bar = b_weight * (b_dh_x - b_delta[:, None, :] + {lse_bar}[:, None, :])",
          f"b_rms = tl.reshape({rms}, [BR, BS])",
          f"{register(op.scaled_score_bar)} = tl.reshape(b_score_bar / b_rms[:, :, None], [BR * BS, BQ])",
          f"{register(op.centre)} = tl.reshape(tl.sum(b_score_bar * b_s, axis=2) / D / b_rms / b_rms, [BR * BS])",
          f"{register(op.weights)} = tl.reshape(tl.where({DIAGONAL}, tl.permute(b_weight, (0, 2, 1))[:, :, None, :], "
          "0.0), [BR * BQ, BR * BS])")

    def print_k3s_store_group_score_bars(self, op: k3s.StoreGroupScoreBarsOp) -> None:
        self.code.comment(op, "t per (representative, row) and query: [S, rows, Q]")
        self.code(*GROUP_PAIRS,
                  f"tl.store({tensor_name(op.score_bars)} + (i_sk[:, None] * R + i_rk[:, None]) * Q + o_q[None, :], "
                  f"{register(op.scaled_score_bar)}, mask=m_k[:, None] & m_q[None, :])")

    def print_k3s_group_sources_adjoint(self, op: k3s.GroupSourcesAdjointOp) -> None:
        c = self.code
        x_bar, dout = register(op.rows_bar), register(op.out_bar)
        t_high, t_low, p_high, p_low = (register(v) for v in (op.score_bar_high, op.score_bar_low, op.weight_high,
                                                               op.weight_low))
        c.comment(op, "x_bar_i = sum_j (t_ij q_j + p_ij dh_j) - c_i x_i over the block: t's product with the "
                      "queries (times t's scale), p's (transposed) with the (row, query) rows")
        c(f"{x_bar} = tl.dot({t_high}, {register(op.high)}, input_precision=\"ieee\")",
          f"if {t_low}.dtype != tl.float32:  # the rests' products (zero at fp32)")
        with c.indent():
            c(f"{x_bar} = tl.dot({t_high}, {register(op.low)}, {x_bar})",
              f"{x_bar} = tl.dot({t_low}, {register(op.high)}, {x_bar})")
        c(f"{x_bar} = tl.dot(tl.trans({p_high}), {dout}, {x_bar} * {register(op.score_bar_scale)}, "
          "input_precision=\"ieee\")",
          f"if {p_low}.dtype != tl.float32:  # the weights' rest (zero at fp32)")
        with c.indent():
            c(f"{x_bar} = tl.dot(tl.trans({p_low}), {dout}, {x_bar})")
        c(f"{x_bar} = {x_bar} - {register(op.centre)}[:, None] * {register(op.rows)}.to(tl.float32)")

    def print_k3s_group_query_cotangent(self, op: k3s.GroupQueryCotangentOp) -> None:
        c = self.code
        q_bar, reps = register(op.query_bar), tensor_name(op.representatives)
        dtype = f"{reps}.dtype.element_ty"
        c.comment(op, "q_bar_j = sum over the part's rows and their representatives of t_ij x_i, BK (row, "
                      "representative) pairs a product, their t over a power of two split in two parts of the "
                      "rows' dtype")
        c("o_q = tl.arange(0, BQ)", "m_q = o_q < Q", "m_qd = m_q[:, None] & m_d[None, :]",
          f"{q_bar} = tl.zeros([BQ, BD], dtype=tl.float32)",
          f"for i_j in {pipelined_range(op, '0', 'S * (BR // BK)')}:")
        with c.indent():
            c("i_s = i_j // (BR // BK)",
              "o_k = i_rp * BR + (i_j % (BR // BK)) * BK + tl.arange(0, BK)",
              "m_k = o_k < R",
              f"b_t = tl.load({tensor_name(op.score_bars)} + (i_s * R + o_k[:, None]) * Q + o_q[None, :], "
              "mask=m_k[:, None] & m_q[None, :], other=0.0)",
              f"b_x = tl.load({reps} + (i_s * R + o_k[:, None]) * D + o_d[None, :], mask=m_k[:, None] & m_d[None, :], "
              "other=0.0, eviction_policy=\"evict_first\")",
              f"b_t_scale = tl.exp2(tl.ceil(tl.log2(tl.maximum(tl.max(tl.abs(b_t)), {2.0 ** -100!r}))))",
              "b_t = b_t / b_t_scale",
              f"b_t_high = b_t.to({dtype})",
              "b_part = tl.dot(tl.trans(b_t_high), b_x, input_precision=\"ieee\")",
              f"if {dtype} != tl.float32:  # t's rest (zero at fp32)")
            with c.indent():
                c(f"b_part = tl.dot(tl.trans((b_t - b_t_high.to(tl.float32)).to({dtype})), b_x, b_part)")
            c(f"{q_bar} = {q_bar} + b_part * b_t_scale")
