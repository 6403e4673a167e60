"""Block AttnRes's phase 1 backward in blocks of columns (derive-block-attnres-backward's
partials-backward=columns): a program's group of BR token rows with all the call's Q queries
(BQ, the next power of two) and all of a row's S representatives (BS, that of num_blocks), the
hidden columns in blocks of BD. Names the grid axis defines: i_rg, o_q, m_q, o_s, m_s; a column
loop: i_c, o_d, m_d (the block's columns), m_qd, m_sd; row loops: i_r."""

from __future__ import annotations

import math

from k3compile.backends.triton.printer.common import register, tensor_name
from k3compile.ir import k3s


def _at_sources(tensor) -> str:
    """Each representative's row of this token row over the block's columns ([S, .., D])."""
    return f"{tensor_name(tensor)} + (o_s[:, None] * R + i_r) * D + o_d[None, :]"


def _smallest_scale(eps) -> float:
    """A row's scale is at least sqrt(eps) and a normal float (k3s.rms_score's bound)."""
    return max(math.sqrt(eps.value.data), 2.0 ** -126)


class AttnResColumns:
    """TritonPrinter's methods for the ops of phase 1's backward in blocks of columns."""

    def print_axis_row_group_all_queries(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a group of BR token rows, with all Q queries and all S representatives of a row",
            f"i_rg = tl.program_id({axis}).to(tl.int64)",
            "o_q = tl.arange(0, BQ)",
            "m_q = o_q < Q",
            "o_s = tl.arange(0, BS)",
            "m_s = o_s < S",
        )

    def print_k3s_column_loop(self, op: k3s.ColumnLoopOp) -> None:
        c = self.code
        self.print_carried(op)
        c.comment(op, "the hidden columns in blocks of BD")
        c("for i_c in range(0, D, BD):")
        with c.indent():
            c("o_d = i_c + tl.arange(0, BD)", "m_d = o_d < D", "m_qd = m_q[:, None] & m_d[None, :]",
              "m_sd = m_s[:, None] & m_d[None, :]")
            self.print_ops(op)

    def print_k3s_next_column(self, op: k3s.NextColumnOp) -> None:
        """Nothing to print: the carried values are already where the loop carries them."""

    def print_k3s_load_source_columns(self, op: k3s.LoadSourceColumnsOp) -> None:
        self.code(f"{register(op.rows)} = tl.load({_at_sources(op.representatives)}, mask=m_sd, other=0.0)"
                  ".to(tl.float32)")

    def print_k3s_column_dots(self, op: k3s.ColumnDotsOp) -> None:
        x, scale, sum_sq = register(op.rows), register(op.scale), register(op.scaled_sum_sq)
        self.code.comment(op, "per representative its scale and sum of (x / scale)^2, per representative and "
                              "query q . x and dh . x, one block of columns further")
        self.code(f"b_new_scale = tl.minimum(tl.maximum(tl.maximum({scale}, tl.max(tl.abs({x}), axis=1)), "
                  f"{_smallest_scale(op.eps)!r}), {2.0 ** 126!r})",
                  f"b_scaled_rows = {x} * (1.0 / b_new_scale)[:, None]",
                  f"b_rescale = {scale} / b_new_scale",
                  f"{register(op.new_scaled_sum_sq)} = {sum_sq} * b_rescale * b_rescale + "
                  "tl.sum(b_scaled_rows * b_scaled_rows, axis=1)",
                  f"{register(op.new_scale)} = b_new_scale",
                  f"{register(op.new_query_dots)} = {register(op.query_dots)} + "
                  f"tl.sum({x}[:, None, :] * {register(op.query)}[None, :, :], axis=2)",
                  f"{register(op.new_weight_bar)} = {register(op.weight_bar)} + "
                  f"tl.sum({x}[:, None, :] * {register(op.out_bar)}[None, :, :], axis=2)")

    def print_k3s_sources_score_adjoint(self, op: k3s.SourcesScoreAdjointOp) -> None:
        scale, dp, lse_bar = register(op.scale), register(op.weight_bar), register(op.lse_bar)
        p, t = register(op.weight), register(op.scaled_score_bar)
        root_eps = math.sqrt(op.eps.value.data)
        self.code.comment(op, "rho = sqrt(mean(x^2) + eps), score = q . x / rho, p = exp(score - lse), "
                              "delta = sum_i p_i (dh . x_i), score_bar = p (dh . x - delta + lse_bar); "
                              "t = score_bar / rho, c = sum_j score_bar score / (D rho^2)")
        self.code(f"b_rms = {scale} * tl.sqrt({register(op.scaled_sum_sq)} / D + "
                  f"({root_eps!r} / {scale}) * ({root_eps!r} / {scale}))",
                  f"b_score = {register(op.query_dots)} / b_rms[:, None]",
                  f"{p} = tl.where(m_s[:, None] & m_q[None, :], tl.exp(b_score - {register(op.lse)}[None, :]), 0.0)",
                  f"b_delta = tl.sum({p} * {dp}, axis=0)",
                  f"b_score_bar = {p} * ({dp} - b_delta[None, :] + {lse_bar}[None, :])",
                  f"{t} = b_score_bar / b_rms[:, None]",
                  f"{register(op.centre)} = tl.sum(b_score_bar * b_score, axis=1) / D / b_rms / b_rms")

    def print_k3s_store_row_coefficients(self, op: k3s.StoreRowCoefficientsOp) -> None:
        c = self.code
        c.comment(op, "the row's coefficients, for the column blocks")
        at = "(o_s[:, None] * R + i_r) * Q + o_q[None, :]"
        for tensor, value in ((op.weights, op.weight), (op.score_bars, op.scaled_score_bar)):
            c(f"tl.store({tensor_name(tensor)} + {at}, {register(value)}, mask=m_s[:, None] & m_q[None, :])")
        c(f"tl.store({tensor_name(op.centres)} + o_s * R + i_r, {register(op.centre)}, mask=m_s)")

    def print_k3s_load_row_coefficients(self, op: k3s.LoadRowCoefficientsOp) -> None:
        at = "(o_s[:, None] * R + i_r) * Q + o_q[None, :]"
        for tensor, value in ((op.weights, op.weight), (op.score_bars, op.scaled_score_bar)):
            self.code(f"{register(value)} = tl.load({tensor_name(tensor)} + {at}, mask=m_s[:, None] & m_q[None, :], "
                      "other=0.0)")
        self.code(f"{register(op.centre)} = tl.load({tensor_name(op.centres)} + o_s * R + i_r, mask=m_s, other=0.0)")

    def print_k3s_sources_adjoint(self, op: k3s.SourcesAdjointOp) -> None:
        p, t = register(op.weight), register(op.scaled_score_bar)
        self.code.comment(op, "x_bar_i = sum_j (t_ij q_j + p_ij dh_j) - c_i x_i over the block's columns")
        self.code(f"{register(op.rows_bar)} = tl.sum({t}[:, :, None] * {register(op.query)}[None, :, :] + "
                  f"{p}[:, :, None] * {register(op.out_bar)}[None, :, :], axis=1) - "
                  f"{register(op.centre)}[:, None] * {register(op.rows)}")

    def print_k3s_store_source_columns(self, op: k3s.StoreSourceColumnsOp) -> None:
        self.code.comment(op, "each element once")
        self.code(f"tl.store({_at_sources(op.dsources)}, {register(op.rows_bar)}"
                  f".to({tensor_name(op.dsources)}.dtype.element_ty), mask=m_sd)")

    def print_k3s_sources_query_adjoint(self, op: k3s.SourcesQueryAdjointOp) -> None:
        self.code.comment(op, "q_bar_j += sum_i t_ij x_i")
        self.code(f"{register(op.updated)} = {register(op.query_bar)} + "
                  f"tl.sum({register(op.scaled_score_bar)}[:, :, None] * {register(op.rows)}[:, None, :], axis=0)")

    def print_k3s_program_barrier(self, op: k3s.ProgramBarrierOp) -> None:
        self.code.comment(op, "the workspaces' rows visible to all the program's threads")
        self.code("tl.debug_barrier()")
