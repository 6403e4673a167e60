"""The AttnRes aggregate's stages: the folded query, the online softmax's start, the source loop,
the RMS score, the online softmax, the weighted mix, the normalised store and the log-sum-exp;
and its backward's: the row groups, the per-row loads, the softmax recomputed from the
log-sum-exp, the adjoints of the score, the softmax and the mix, the query's re-centring and the
cotangents' stores. Block AttnRes's two phases: the same stages over the program's block of a
block's queries (`<Q>` and `<Q x D>` tiles, broadcast against the `<D>` source row), the
partials' store and load.

Names the grid axes define (print_axis_row is in kernels.py): i_rg (row_group: the program's
group of BR rows), o_d, m_d (the hidden columns), o_q, m_q (row_query_block and
row_group_query_block: the program's BQ queries of the block's Q); the loops define i_r (the
row) and i_s (the source)."""

from __future__ import annotations

import math

from k3compile.backends.triton.printer.attnres_columns import AttnResColumnsForward
from k3compile.backends.triton.printer.attnres_columns_backward import AttnResColumnsBackward
from k3compile.backends.triton.printer.common import pipelined_range, presence_flag, register, tensor_name
from k3compile.ir import k3s

# a tile's dimensions as the shape of its register (the row's hidden columns are held whole)
TILE_SHAPES = {(): "[]", ("D",): "[BD]", ("Q",): "[BQ]", ("Q", "D"): "[BQ, BD]", ("S",): "[BS]",
               ("R", "S", "R", "S"): "[BR * BS, BR * BS]", ("Q", "R", "S"): "[BQ, BR * BS]",
               ("R", "Q", "R", "S"): "[BR * BQ, BR * BS]"}


def _tile_shape(value) -> str:
    return TILE_SHAPES[k3s.tile_dims(value)]


def _broadcast(value, dims: tuple[str, ...], name: str | None = None) -> str:
    """A tile's register (or `name`, a register of its shape) indexed to broadcast against a tile
    of `dims` (a `<Q>` or `<D>` one against `<Q x D>`); as it is where its dimensions are those or none."""
    own, name = k3s.tile_dims(value), name or register(value)
    if own in (dims, ()):
        return name
    return f"{name}[{', '.join(':' if d in own else 'None' for d in dims)}]"


def _row_dot(a, b) -> str:
    """a . b over the hidden columns of two tiles, one per query where either is `<Q x D>`."""
    dims = max(k3s.tile_dims(a), k3s.tile_dims(b), key=len)
    return f"tl.sum({_broadcast(a, dims)} * {_broadcast(b, dims)}{', axis=1' if len(dims) == 2 else ''})"


class AttnRes(AttnResColumnsBackward, AttnResColumnsForward):
    """TritonPrinter's methods for AttnRes (one per k3s op, and their helpers; phase 1's backward
    in blocks of columns in AttnResColumnsBackward, its forward in blocks of columns in
    AttnResColumnsForward)."""

    def print_scaled_row(self, row, eps) -> None:
        """Prints b_scaled_row = x / s and b_scaled_rms = rms(x) / s of a <D> row, rms(x) =
        sqrt(mean(x^2) + eps) and s (b_scale) the row's max-abs: as sqrt(mean((x / s)^2) +
        (sqrt(eps) / s)^2). x * x overflows fp32 for finite rows (past ~1e19) and a tiny row's
        squares underflow; the scaled ones do neither, nor do q . x / s and x / s. s is at least
        sqrt(eps) (so (sqrt(eps) / s)^2 <= 1) and a normal float, and at most 2^126 (div.full.f32,
        the GPU's fp32 `/`, returns 0 for divisors past it)."""
        root_eps = math.sqrt(eps.value.data)
        self.code(f"b_scale = tl.minimum(tl.maximum(tl.max(tl.abs({register(row)})), {max(root_eps, 2.0 ** -126)!r}), "
                  f"{2.0 ** 126!r})",
                  "b_inverse_scale = 1.0 / b_scale",
                  f"b_scaled_row = {register(row)} * b_inverse_scale",
                  f"b_scaled_root_eps = {root_eps!r} * b_inverse_scale",
                  "b_scaled_rms = tl.sqrt(tl.sum(b_scaled_row * b_scaled_row) / D "
                  "+ b_scaled_root_eps * b_scaled_root_eps)")

    def print_axis_row_group(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a group of BR token rows, one after another, of width D",
            f"i_rg = tl.program_id({axis}).to(tl.int64)",
            "o_d = tl.arange(0, BD)",
            "m_d = o_d < D",
        )

    def print_axis_row_query_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one token row and a block of BQ of its Q queries; a row's blocks are adjacent",
            "# programs, so they read its representatives close together in time",
            f"i_rq = tl.program_id({axis}).to(tl.int64)",
            "i_r = i_rq // tl.cdiv(Q, BQ)",
            "o_q = (i_rq % tl.cdiv(Q, BQ)) * BQ + tl.arange(0, BQ)",
            "m_q = o_q < Q",
            "o_d = tl.arange(0, BD)",
            "m_d = o_d < D",
            "m_qd = m_q[:, None] & m_d[None, :]",
        )

    def print_axis_row_group_query_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a group of BR token rows and a block of BQ of the Q queries; a group's blocks",
            "# are adjacent programs, so they read its representatives close together in time",
            f"i_rgq = tl.program_id({axis}).to(tl.int64)",
            "i_rg = i_rgq // tl.cdiv(Q, BQ)",
            "o_q = (i_rgq % tl.cdiv(Q, BQ)) * BQ + tl.arange(0, BQ)",
            "m_q = o_q < Q",
            "o_d = tl.arange(0, BD)",
            "m_d = o_d < D",
            "m_qd = m_q[:, None] & m_d[None, :]",
        )

    def print_carried(self, loop) -> None:
        """A loop's carried values enter it in its block arguments' registers (the same registers
        but where the pass named them apart)."""
        for initial, arg in zip(loop.initial, loop.body.block.args, strict=True):
            if register(initial) != register(arg):
                self.code(f"{register(arg)} = {register(initial)}")

    def print_k3s_fold_query(self, op: k3s.FoldQueryOp) -> None:
        if op.queries is None:
            self.code.comment(op, "RMSNorm gain folded into the pseudo-query")
            at, mask = "o_d", "m_d"
        else:
            self.code.comment(op, "RMSNorm gains folded into the program's block of the pseudo-queries")
            at, mask = "o_q[:, None] * D + o_d[None, :]", "m_qd"
        query, gain = tensor_name(op.pseudo_query), tensor_name(op.gain)
        self.code(f"{register(op.query)} = tl.load({query} + {at}, mask={mask}, other=0.0).to(tl.float32)"
                  f" * tl.load({gain} + {at}, mask={mask}, other=0.0).to(tl.float32)")

    def print_k3s_softmax_start(self, op: k3s.SoftmaxStartOp) -> None:
        self.code.comment(op, "the online softmax before any source")
        self.code(f'{register(op.running_max)} = tl.full({_tile_shape(op.running_max)}, float("-inf"), dtype=tl.float32)',
                  f"{register(op.normaliser)} = tl.zeros({_tile_shape(op.normaliser)}, dtype=tl.float32)",
                  f"{register(op.mix)} = tl.zeros({_tile_shape(op.mix)}, dtype=tl.float32)")

    def print_k3s_zeros(self, op: k3s.ZerosOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.zeros({_tile_shape(op.result)}, dtype=tl.float32)")

    def print_k3s_row_loop(self, op: k3s.RowLoopOp) -> None:
        c = self.code
        self.print_carried(op)
        c.comment(op, "the program's rows, one after another")
        c("for i_r in range(i_rg * BR, tl.minimum(i_rg * BR + BR, R)):")
        with c.indent():
            self.print_ops(op)

    def print_k3s_next_row(self, op: k3s.NextRowOp) -> None:
        """Nothing to print: the carried values are already where the loop carries them."""

    def print_k3s_source_loop(self, op: k3s.SourceLoopOp) -> None:
        c = self.code
        self.print_carried(op)
        c.comment(op, "each source row is read once")
        c(f"for i_s in {pipelined_range(op, '0', 'S')}:")
        with c.indent():
            self.print_ops(op)

    def print_k3s_row_source_loop(self, op: k3s.RowSourceLoopOp) -> None:
        c = self.code
        self.print_carried(op)
        c.comment(op, "the program's rows and their sources as one loop, sources innermost")
        c(f"for i_rs in {pipelined_range(op, 'i_rg * BR * S', 'tl.minimum(i_rg * BR + BR, R) * S')}:")
        with c.indent():
            c("i_r = i_rs // S", "i_s = i_rs % S")
            self.print_ops(op)

    def print_k3s_row_start(self, op: k3s.RowStartOp) -> None:
        self.code.comment(op, "a row's first source starts the online softmax anew")
        self.code(f'{register(op.started_max)} = tl.where(i_s == 0, float("-inf"), {register(op.running_max)})')

    def print_k3s_row_resume(self, op: k3s.RowResumeOp) -> None:
        self.code.comment(op, "a row's first source resumes the online softmax from the row's partials")
        for carried, start in ((op.running_max, op.max_from), (op.normaliser, op.sum_from), (op.mix, op.mix_from)):
            self.code(f"{register(carried)} = tl.where(i_s == 0, {register(start)}, {register(carried)})")

    def print_k3s_at_row_end(self, op: k3s.AtRowEndOp) -> None:
        c = self.code
        c.comment(op, "after the row's last source")
        c("if i_s == S - 1:")
        with c.indent():
            self.print_ops(op)

    def print_k3s_load_source(self, op: k3s.LoadSourceOp) -> None:
        self.code(f"{register(op.row)} = tl.load({tensor_name(op.sources)} + (i_s * R + i_r) * D + o_d, mask=m_d, "
                  "other=0.0).to(tl.float32)")

    def print_k3s_rms_score(self, op: k3s.RmsScoreOp) -> None:
        q = register(op.query)
        dims = k3s.tile_dims(op.query)
        scaled_row = _broadcast(op.row, dims, "b_scaled_row")
        dot = f"tl.sum({scaled_row} * {q}{', axis=1' if len(dims) == 2 else ''})"  # over D, per query
        self.code.comment(op, "score = q . x / rms(x), as q . (x / s) / (rms(x) / s)")
        self.print_scaled_row(op.row, op.eps)
        self.code(f"{register(op.score)} = {dot} / b_scaled_rms")

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
        dims = k3s.tile_dims(op.mix)
        rescale, weight, x = (_broadcast(v, dims) for v in (op.rescale, op.weight, op.row))
        self.code.comment(op)
        self.code(f"{register(op.updated)} = {register(op.mix)} * {rescale} + {weight} * {x}")

    def print_k3s_next_source(self, op: k3s.NextSourceOp) -> None:
        """Nothing to print: the carried values are already where the loop carries them."""

    def print_k3s_normalize_store(self, op: k3s.NormalizeStoreOp) -> None:
        self.code.comment(op)
        out = tensor_name(op.out)
        self.code(f"tl.store({out} + i_r * D + o_d, ({register(op.mix)} / {register(op.normaliser)})"
                  f".to({out}.dtype.element_ty), mask=m_d)")

    def print_k3s_store_lse(self, op: k3s.StoreLseOp) -> None:
        c = self.code
        c.comment(op, "the row's log-sum-exp over its sources, for the backward")
        store = f"tl.store({tensor_name(op.lse)} + i_r, {register(op.running_max)} + tl.log({register(op.normaliser)}))"
        if (flag := presence_flag(op.lse)) is None:
            c(store)
            return
        c(f"if {flag}:")
        with c.indent():
            c(store)

    # --- Block AttnRes's two phases ------------------------------------------------------------

    def print_k3s_store_partials(self, op: k3s.StorePartialsOp) -> None:
        c = self.code
        c.comment(op, "the online softmax over the representatives as it stands, per query: [Q, rows] and [Q, rows, D]")
        for tensor, value in ((op.block_max, op.running_max), (op.block_normaliser, op.normaliser)):
            c(f"tl.store({tensor_name(tensor)} + o_q * R + i_r, {register(value)}, mask=m_q)")
        c(f"tl.store({tensor_name(op.block_numerator)} + (o_q[:, None] * R + i_r) * D + o_d[None, :], "
          f"{register(op.mix)}, mask=m_qd)")

    def print_k3s_load_partials(self, op: k3s.LoadPartialsOp) -> None:
        c = self.code
        c.comment(op, "the query's partials over the completed representatives: the loop resumes from them")
        c(f"{register(op.running_max)} = tl.load({tensor_name(op.block_max)} + i_r)",
          f"{register(op.normaliser)} = tl.load({tensor_name(op.block_normaliser)} + i_r)",
          f"{register(op.mix)} = tl.load({tensor_name(op.block_numerator)} + i_r * D + o_d, mask=m_d, other=0.0)")

    def print_k3s_store_normalised_partials(self, op: k3s.StoreNormalisedPartialsOp) -> None:
        c = self.code
        c.comment(op, "per query its log-sum-exp over the representatives and its normalised mix: [Q, rows], "
                      "[Q, rows, D]")
        mix = tensor_name(op.block_mix)
        c(f"tl.store({tensor_name(op.block_lse)} + o_q * R + i_r, "
          f"{register(op.running_max)} + tl.log({register(op.normaliser)}), mask=m_q)",
          f"tl.store({mix} + (o_q[:, None] * R + i_r) * D + o_d[None, :], "
          f"({register(op.mix)} / {register(op.normaliser)}[:, None]).to({mix}.dtype.element_ty), mask=m_qd)")

    def print_k3s_load_normalised_partials(self, op: k3s.LoadNormalisedPartialsOp) -> None:
        c = self.code
        c.comment(op, "the query's state over the completed representatives, (lse, 1, normalised mix): "
                      "the loop resumes from it")
        c(f"{register(op.running_max)} = tl.load({tensor_name(op.block_lse)} + i_r)",
          f"{register(op.normaliser)} = tl.full({_tile_shape(op.normaliser)}, 1.0, dtype=tl.float32)",
          f"{register(op.mix)} = tl.load({tensor_name(op.block_mix)} + i_r * D + o_d, mask=m_d, other=0.0)"
          ".to(tl.float32)")

    # --- the backward -------------------------------------------------------------------------

    def print_k3s_load_row(self, op: k3s.LoadRowOp) -> None:
        tensor = tensor_name(op.tensor)
        if _tile_shape(op.row) == "[]":
            self.code(f"{register(op.row)} = tl.load({tensor} + i_r).to(tl.float32)")
        else:
            self.code(f"{register(op.row)} = tl.load({tensor} + i_r * D + o_d, mask=m_d, other=0.0).to(tl.float32)")

    def print_k3s_softmax_delta(self, op: k3s.SoftmaxDeltaOp) -> None:
        self.code.comment(op, "sum_i p_i (dh . x_i) = dh . h")
        self.code(f"{register(op.delta)} = {_row_dot(op.out_bar, op.out)}")

    def print_k3s_softmax_weight(self, op: k3s.SoftmaxWeightOp) -> None:
        self.code.comment(op, "p = exp(score - L), from the saved log-sum-exp")
        self.code(f"{register(op.weight)} = tl.exp({register(op.score)} - {register(op.lse)})")

    def print_k3s_weight_cotangent(self, op: k3s.WeightCotangentOp) -> None:
        self.code.comment(op, "dp = dh . x")
        self.code(f"{register(op.weight_bar)} = {_row_dot(op.out_bar, op.row)}")

    def print_k3s_softmax_adjoint(self, op: k3s.SoftmaxAdjointOp) -> None:
        self.code.comment(op, "score_bar = p (dp - delta)")
        self.code(f"{register(op.score_bar)} = {register(op.weight)} * ({register(op.weight_bar)} - "
                  f"{register(op.delta)})")

    def print_k3s_rms_score_adjoint(self, op: k3s.RmsScoreAdjointOp) -> None:
        q, score, score_bar = (register(v) for v in (op.query, op.score, op.score_bar))
        if "Q" not in k3s.tile_dims(op.query):
            self.code.comment(op, "x_bar = score_bar (q - score x / (D rms)) / rms, x / rms as (x / s) / (rms / s)")
            self.print_scaled_row(op.row, op.eps)
            self.code(f"{register(op.row_bar)} = {score_bar} / (b_scale * b_scaled_rms) * "
                      f"({q} - {score} / D * (b_scaled_row / b_scaled_rms))")
            return
        self.code.comment(op, "x_bar = sum_j score_bar_j (q_j - score_j x / (D rms)) / rms over the program's "
                              "queries")
        self.print_scaled_row(op.row, op.eps)
        self.code(f"{register(op.row_bar)} = (tl.sum({_broadcast(op.score_bar, ('Q', 'D'))} * {q}, axis=0) - "
                  f"tl.sum({score_bar} * {score}) / D * (b_scaled_row / b_scaled_rms)) / (b_scale * b_scaled_rms)")

    def print_k3s_query_adjoint(self, op: k3s.QueryAdjointOp) -> None:
        dims = k3s.tile_dims(op.query_bar)
        p, score_bar, k = _broadcast(op.weight, dims), _broadcast(op.score_bar, dims), _broadcast(op.row, dims, "b_k")
        self.code.comment(op, "k = x / rms = (x / s) / (rms / s): q_bar += score_bar k, kbar += p k, "
                              "sigma += score_bar")
        self.print_scaled_row(op.row, op.eps)
        self.code("b_k = b_scaled_row / b_scaled_rms",
                  f"{register(op.updated_query_bar)} = {register(op.query_bar)} + {score_bar} * {k}",
                  f"{register(op.updated_key_mean)} = {register(op.key_mean)} + {p} * {k}",
                  f"{register(op.updated_score_bar_sum)} = {register(op.score_bar_sum)} + {register(op.score_bar)}")

    def print_k3s_recentre_query_adjoint(self, op: k3s.RecentreQueryAdjointOp) -> None:
        self.code.comment(op, "q_bar -= sigma kbar: the scores' cotangents re-centred to sum to zero")
        sigma = _broadcast(op.score_bar_sum, k3s.tile_dims(op.query_bar))
        self.code(f"{register(op.updated)} = {register(op.query_bar)} - {sigma} * {register(op.key_mean)}")

    def print_k3s_mix_adjoint(self, op: k3s.MixAdjointOp) -> None:
        if "Q" not in k3s.tile_dims(op.weight):
            self.code.comment(op, "x_bar += p dh")
            self.code(f"{register(op.updated)} = {register(op.row_bar)} + {register(op.weight)} * "
                      f"{register(op.out_bar)}")
            return
        self.code.comment(op, "x_bar += sum_j p_j dh_j over the program's queries")
        self.code(f"{register(op.updated)} = {register(op.row_bar)} + tl.sum({_broadcast(op.weight, ('Q', 'D'))} * "
                  f"{register(op.out_bar)}, axis=0)")

    def print_k3s_store_source_cotangent(self, op: k3s.StoreSourceCotangentOp) -> None:
        self.code.comment(op)
        dsources = tensor_name(op.dsources)
        self.code(f"tl.store({dsources} + (i_s * R + i_r) * D + o_d, {register(op.row_bar)}"
                  f".to({dsources}.dtype.element_ty), mask=m_d)")

    def print_k3s_store_query_cotangent(self, op: k3s.StoreQueryCotangentOp) -> None:
        c = self.code
        c.comment(op, "q = w * gain: dw += q_bar * gain, dgain += q_bar * w, summed over the programs")
        q_bar = register(op.query_bar)
        at, mask = ("o_d", "m_d") if "Q" not in k3s.tile_dims(op.query_bar) else \
            ("o_q[:, None] * D + o_d[None, :]", "m_qd")
        for grad, other in ((op.dquery, op.gain), (op.dgain, op.pseudo_query)):
            c(f"tl.atomic_add({tensor_name(grad)} + {at}, {q_bar} * tl.load({tensor_name(other)} + {at}, "
              f"mask={mask}, other=0.0).to(tl.float32), mask={mask})")

    # --- the backward of Block AttnRes's two phases ---------------------------------------------

    def print_k3s_load_query_rows(self, op: k3s.LoadQueryRowsOp) -> None:
        tensor = tensor_name(op.tensor)
        if _tile_shape(op.rows) == "[BQ]":
            self.code(f"{register(op.rows)} = tl.load({tensor} + o_q * R + i_r, mask=m_q, other=0.0).to(tl.float32)")
        else:
            self.code(f"{register(op.rows)} = tl.load({tensor} + (o_q[:, None] * R + i_r) * D + o_d[None, :], "
                      "mask=m_qd, other=0.0).to(tl.float32)")

    def print_k3s_lse_adjoint(self, op: k3s.LseAdjointOp) -> None:
        self.code.comment(op, "the log-sum-exp's cotangent: score_bar = p (dp - (delta - lse_bar)), summing to "
                              "lse_bar")
        self.code(f"{register(op.shifted_delta)} = {register(op.delta)} - {register(op.lse_bar)}",
                  f"{register(op.score_bar_sum)} = -{register(op.lse_bar)}")

    def print_k3s_add_source_cotangent(self, op: k3s.AddSourceCotangentOp) -> None:
        self.code.comment(op, "the program's queries' share of the row's cotangent")
        self.code(f"tl.atomic_add({tensor_name(op.dsources)} + (i_s * R + i_r) * D + o_d, {register(op.row_bar)}, "
                  "mask=m_d)")

    def print_k3s_partials_adjoint(self, op: k3s.PartialsAdjointOp) -> None:
        alpha = register(op.weight)
        self.code.comment(op, "the partials as a source: alpha = exp(L_p - L), lse_bar = alpha (dh . mix - delta)")
        self.code(f"{alpha} = tl.exp({register(op.partials_lse)} - {register(op.lse)})",
                  f"{register(op.lse_bar)} = {alpha} * ({_row_dot(op.out_bar, op.mix)} - {register(op.delta)})")

    def print_k3s_store_partials_cotangent(self, op: k3s.StorePartialsCotangentOp) -> None:
        alpha, dmix = register(op.weight), tensor_name(op.dblock_mix)
        self.code.comment(op, "d block_lse = lse_bar - alpha sigma (re-centred), d block_mix = alpha dh")
        self.code(f"tl.store({tensor_name(op.dblock_lse)} + i_r, {register(op.lse_bar)} - {alpha} * "
                  f"{register(op.score_bar_sum)})",
                  f"tl.store({dmix} + i_r * D + o_d, ({alpha} * {register(op.out_bar)}).to({dmix}.dtype.element_ty), "
                  "mask=m_d)")
