"""The MoE backward's stages (derive-moe-backward): the projections' input gradients (a K loop
over blocks of BD of the forward's output columns, the weight read transposed) and weight
gradients (a [BN, BD] tile summed over the rows in order: every token row, or the program's
expert's run of the sorted pair list), the GLU's saved halves and adjoint, the routing weights'
partial row dots, the latent RMSNorm's adjoint and its gain's gradient, the router's adjoints.

Names the grid axes define: those of experts.py (o_r, m_r; o_n, m_n; the sorted_block axis's
o_s, m_s, b_pairs, o_t, i_e), and here i_e (expert: one expert) and o_d, m_d (input_block: a
block of BD input columns of a weight)."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import EntryView, kernel_constants_of, register, tensor_name
from k3compile.backends.triton.printer.experts import BLOCK_ROWS
from k3compile.ir import k3s

# a weight's element [k, n] read for the input gradient (k over the forward's output rows DIN,
# n over its input columns DOUT: the transposed product's), by the forward's layout
TRANSPOSED_OFFSETS = {
    "dense": "o_k[:, None] * DOUT + o_n[None, :]",
    "expert": "i_e * DIN * DOUT + o_k[:, None] * DOUT + o_n[None, :]",
    "stacked_in": "(o_n // GROUP)[None, :] * DIN * GROUP + o_k[:, None] * GROUP + (o_n % GROUP)[None, :]",
}
# a weight gradient tile's element [n, d] (n < DOUT its rows, d < DIN its columns), by layout
WEIGHT_OFFSETS = {
    "dense": "o_n[:, None] * DIN + o_d[None, :]",
    "expert": "i_e * DOUT * DIN + o_n[:, None] * DIN + o_d[None, :]",
    "stacked_in": "(o_d // GROUP)[None, :] * DOUT * GROUP + o_n[:, None] * GROUP + (o_d % GROUP)[None, :]",
}


class MoeBackward:
    """TritonPrinter's methods for the MoE backward (one per k3s op, and their helpers)."""

    # --- each stage's compile-time sizes (common.KERNEL_CONSTANTS): its widths and top_k, the
    # block sizes derive-moe-backward set on its kernel, the dispatch plan's BM and experts E

    @kernel_constants_of(k3s.RankPairsOp)
    def rank_pairs_constants(self, op: k3s.RankPairsOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return {"E": op.num_experts.value.data, "TOP_K": op.top_k.value.data, "BR": kernel.block_r.value.data}

    @kernel_constants_of(k3s.ChunkOffsetsOp)
    def chunk_offsets_constants(self, op: k3s.ChunkOffsetsOp, kernel: k3s.KernelOp,
                                view: EntryView) -> dict[str, int]:
        return {"E": op.num_experts.value.data, "TOP_K": op.top_k.value.data, "CH": op.pairs_per_chunk.value.data,
                "BC": kernel.block_r.value.data, "BE": kernel.block_e.value.data}

    @kernel_constants_of(k3s.StoreWeightGradOp)
    def store_weight_grad_constants(self, op: k3s.StoreWeightGradOp, kernel: k3s.KernelOp,
                                    view: EntryView) -> dict[str, int]:
        return {"GROUP": op.group.value.data} if op.group is not None else {}

    @kernel_constants_of(k3s.RmsNormAdjointOp)
    def rms_norm_adjoint_constants(self, op: k3s.RmsNormAdjointOp, kernel: k3s.KernelOp,
                                   view: EntryView) -> dict[str, int]:
        return {"BR": kernel.block_r.value.data, "BD": kernel.block_d.value.data}

    @kernel_constants_of(k3s.NormGainGradOp)
    def norm_gain_grad_constants(self, op: k3s.NormGainGradOp, kernel: k3s.KernelOp,
                                 view: EntryView) -> dict[str, int]:
        return {"DOUT": op.width.value.data, "BN": kernel.block_n.value.data, "BR": kernel.block_r.value.data}

    @kernel_constants_of(k3s.ProjectInputGradOp, k3s.ProjectWeightGradOp)
    def projection_grad_constants(self, op: k3s.ProjectInputGradOp | k3s.ProjectWeightGradOp, kernel: k3s.KernelOp,
                                  view: EntryView) -> dict[str, int]:
        """Its widths and tile; over the sorted pair list its slots and a dgrad's experts (a weight
        gradient's expert is its grid axis's: only its launch reads E); its rows a step: a weight
        gradient's and a dense dgrad's BR, a sorted dgrad's block of the pair list BM."""
        sizes = {"DIN": op.in_dim.value.data, "DOUT": op.out_dim.value.data, "BN": kernel.block_n.value.data,
                 "BD": kernel.block_d.value.data}
        if op.rows.data.value == "sorted_block":
            sizes |= self.pair_list_constants(view) if isinstance(op, k3s.ProjectInputGradOp) else \
                {"TOP_K": self.top_k(view)}
        if isinstance(op, k3s.ProjectWeightGradOp) or op.rows.data.value == "token_block":
            sizes["BR"] = kernel.block_r.value.data
        else:
            sizes["BM"] = op.block_rows.value.data
        if isinstance(op, k3s.ProjectInputGradOp) and op.group is not None:
            sizes["GROUP"] = op.group.value.data
        return sizes

    @kernel_constants_of(k3s.LoadRowsOp)
    def load_rows_constants(self, op: k3s.LoadRowsOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """Its columns (the program's block of them); as a row kernel's rows (k3s.load_rows with the
        pair list's tensors, or of token rows) the rows a program takes, BM of the pair list or BR
        token rows. In a dgrad's epilogue the same values as the dgrad's."""
        sizes = {"DOUT": op.width.value.data, "BN": kernel.block_n.value.data}
        if op.rows.data.value == "token_block":
            sizes["BR"] = kernel.block_r.value.data
        elif op.tensors:
            sizes |= self.pair_list_constants(view) | {"BM": kernel.block_r.value.data}
        return sizes

    def pair_list_constants(self, view: EntryView) -> dict[str, int]:
        """TOP_K and the experts E of the sorted pair list the entry reads (expert_offsets: E + 1)."""
        return {"TOP_K": self.top_k(view), "E": self.num_experts(view)}

    def print_k3s_rank_pairs(self, op: k3s.RankPairsOp) -> None:
        ids, counts, rank = (tensor_name(v) for v in (op.topk_ids, op.chunk_counts, op.pair_rank))
        self.code.comment(op, "the chunk's counts (integer adds: any order gives them), each pair's rank among "
                              "the chunk's earlier pairs of its expert")
        self.code(f"b_e = tl.load({ids} + o_p, mask=m_p, other=0)",
                  f"tl.atomic_add({counts} + tl.program_id(0) * E + b_e, 1, mask=m_p)",
                  "o_i = tl.arange(0, BR)",
                  "b_earlier = (b_e[:, None] == b_e[None, :]) & (o_i[None, :] < o_i[:, None])",
                  f"tl.store({rank} + o_p, tl.sum(b_earlier.to(tl.int32), axis=1), mask=m_p)")

    def print_k3s_chunk_offsets(self, op: k3s.ChunkOffsetsOp) -> None:
        c = self.code
        counts, totals = tensor_name(op.chunk_counts), tensor_name(op.expert_counts)
        c.comment(op, "per block of BE experts, the chunks in order, BC at a time")
        c("for i_eb in range(0, tl.cdiv(E, BE)):")
        with c.indent():
            c("o_e = i_eb * BE + tl.arange(0, BE)", "m_e = o_e < E", "b_total = tl.zeros([BE], dtype=tl.int32)",
              "for i_cb in range(0, tl.cdiv(tl.cdiv(R * TOP_K, CH), BC)):")
            with c.indent():
                c("o_c = i_cb * BC + tl.arange(0, BC)",
                  "m_ce = (o_c < tl.cdiv(R * TOP_K, CH))[:, None] & m_e[None, :]",
                  f"b_count = tl.load({counts} + o_c[:, None] * E + o_e[None, :], mask=m_ce, other=0)",
                  f"tl.store({counts} + o_c[:, None] * E + o_e[None, :], "
                  "tl.cumsum(b_count, axis=0) - b_count + b_total[None, :], mask=m_ce)",
                  "b_total += tl.sum(b_count, axis=0)")
            c(f"tl.store({totals} + o_e, b_total, mask=m_e)")

    def print_axis_expert(self, axis: int) -> None:
        self.code(f"# grid axis {axis}: one expert", f"i_e = tl.program_id({axis}).to(tl.int64)")

    def print_axis_input_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BD input columns of the weight",
            f"o_d = tl.program_id({axis}) * BD + tl.arange(0, BD)",
            "m_d = o_d < DIN",
        )

    def print_k3s_project_input_grad(self, op: k3s.ProjectInputGradOp) -> None:
        c = self.code
        acc = register(op.result)
        row, mask = BLOCK_ROWS[op.rows.data.value, op.input_index.data.value]
        c.comment(op, "fp32 accumulation over blocks of BD of the forward's output columns, the weight transposed")
        c(f"{acc} = tl.zeros([{'BR' if op.rows.data.value == 'token_block' else 'BM'}, BN], dtype=tl.float32)",
          "for i_k in range(0, tl.cdiv(DIN, BD)):")
        with c.indent():
            c("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < DIN",
              f"b_y = tl.load({tensor_name(op.input)} + {row}[:, None] * DIN + o_k[None, :], "
              f"mask={mask}[:, None] & m_k[None, :], other=0.0)",
              f"b_w = tl.load({tensor_name(op.weight)} + {TRANSPOSED_OFFSETS[op.layout.data.value]}, "
              "mask=m_k[:, None] & m_n[None, :], other=0.0)",
              f"{acc} += _mm(b_y, b_w, DOT)")

    def print_k3s_project_weight_grad(self, op: k3s.ProjectWeightGradOp) -> None:
        c = self.code
        acc, tensors = register(op.result), {role: tensor_name(v) for role, v in op.named_tensors().items()}
        rows = op.rows.data.value
        c.comment(op, "fp32 accumulation of cotangent^T input over the rows, in order")
        c(f"{acc} = tl.zeros([BN, BD], dtype=tl.float32)")
        if rows == "token_block":
            c("for i_r in range(0, R, BR):")
            with c.indent():
                c("o_r = i_r + tl.arange(0, BR)", "m_r = o_r < R")
                self.print_weight_grad_step(op, acc, tensors)
            return
        c(f"for i_s in range(tl.load({tensors['expert_offsets']} + i_e), tl.load({tensors['expert_offsets']} + i_e + 1), "
          "BR):  # the expert's run (whole blocks of BM, a multiple of BR)")
        with c.indent():
            c("o_s = i_s + tl.arange(0, BR)",
              f"b_pairs = tl.load({tensors['sorted_pairs']} + o_s).to(tl.int64)",
              "m_s = b_pairs >= 0  # -1: padding",
              "o_t = tl.where(m_s, b_pairs // TOP_K, 0)")
            self.print_weight_grad_step(op, acc, tensors)

    def print_weight_grad_step(self, op: k3s.ProjectWeightGradOp, acc: str, tensors: dict[str, str]) -> None:
        """One block of rows of a weight gradient: its cotangent rows, its input rows (weighted:
        (y_bar s)^T a = y_bar^T (s a), so the cotangent tile reaches tl.dot as loaded, which for
        the transposed operand of sm_90's wgmma saves a shuffle through shared memory)."""
        rows = op.rows.data.value
        dy_row, mask = BLOCK_ROWS[rows, op.cotangent_index.data.value]
        a_row, _ = BLOCK_ROWS[rows, op.input_index.data.value]
        self.code(f"b_dy = tl.load({tensor_name(op.cotangent)} + {dy_row}[:, None] * DOUT + o_n[None, :], "
                  f"mask={mask}[:, None] & m_n[None, :], other=0.0)",
                  f"b_a = tl.load({tensor_name(op.input)} + {a_row}[:, None] * DIN + o_d[None, :], "
                  f"mask={mask}[:, None] & m_d[None, :], other=0.0)")
        if op.scale_rows.value.data:
            self.code(f"b_a = b_a.to(tl.float32) * tl.load({tensors['row_scale']} + b_pairs, mask=m_s, other=0.0)[:, None]")
        self.code(f"{acc} += _mm(tl.trans(b_dy), b_a, DOT)")

    def print_k3s_store_weight_grad(self, op: k3s.StoreWeightGradOp) -> None:
        tensor = tensor_name(op.tensor)
        self.code.comment(op, "every element once, by this program")
        self.code(f"tl.store({tensor} + {WEIGHT_OFFSETS[op.layout.data.value]}, "
                  f"{register(op.value)}.to({tensor}.dtype.element_ty), mask=m_n[:, None] & m_d[None, :])")

    def rows_at(self, op) -> tuple[str, str]:
        """(row offsets [M], their mask) of a stage's rows (`rows`, `index`)."""
        return BLOCK_ROWS[op.rows.data.value, op.index.data.value]

    def print_k3s_load_rows(self, op: k3s.LoadRowsOp) -> None:
        row, mask = self.rows_at(op)
        self.code.comment(op)
        self.code(f"{register(op.result)} = tl.load({tensor_name(op.tensor)} + {row}[:, None] * {op.width.value.data} + "
                  f"o_n[None, :], mask={mask}[:, None] & m_n[None, :], other=0.0).to(tl.float32)")

    def glu_half_offsets(self, op) -> tuple[str, str]:
        """(the offsets of the gate half's elements of the program's rows and columns, their mask);
        the up half's are group further."""
        row, mask = self.rows_at(op)
        group = op.group.value.data
        self.code(f"o_h = (o_n // {group}) * {2 * group} + o_n % {group}  # the gate rows of column n's expert")
        return f"{row}[:, None] * {op.width.value.data} + o_h[None, :]", f"{mask}[:, None] & m_n[None, :]"

    def print_k3s_store_glu_halves(self, op: k3s.StoreGluHalvesOp) -> None:
        tensor = tensor_name(op.tensor)
        self.code.comment(op, "in the weight's row order")
        at, mask = self.glu_half_offsets(op)
        for value, shift in ((op.gate, ""), (op.up, f" + {op.group.value.data}")):
            self.code(f"tl.store({tensor} + {at}{shift}, {register(value)}.to({tensor}.dtype.element_ty), mask={mask})")

    def print_k3s_load_glu_halves(self, op: k3s.LoadGluHalvesOp) -> None:
        self.code.comment(op, "the forward's saved pre-activations")
        at, mask = self.glu_half_offsets(op)
        for value, shift in ((op.gate, ""), (op.up, f" + {op.group.value.data}")):
            self.code(f"{register(value)} = tl.load({tensor_name(op.tensor)} + {at}{shift}, mask={mask}, "
                      "other=0.0).to(tl.float32)")

    def print_k3s_glu_adjoint(self, op: k3s.GluAdjointOp) -> None:
        g, u, bar = register(op.gate), register(op.up), register(op.act_bar)
        g_bar, u_bar = register(op.gate_bar), register(op.up_bar)
        self.code.comment(op, "tanh(x) = 2 sigmoid(2 x) - 1" if op.activation.data.value == "situ_glu" else "")
        self.code(f"b_sigmoid_g = tl.sigmoid({g})")
        if op.activation.data.value == "swiglu":
            self.code(f"{g_bar} = {bar} * {u} * b_sigmoid_g * (1 + {g} * (1 - b_sigmoid_g))",
                      f"{u_bar} = {bar} * {g} * b_sigmoid_g")
            return
        self.code(f"b_tanh_g = 2 * tl.sigmoid({g} / 2) - 1", f"b_tanh_u = 2 * tl.sigmoid({u} / 12.5) - 1",
                  f"{g_bar} = {bar} * ((1 - b_tanh_g * b_tanh_g) * b_sigmoid_g + 4 * b_tanh_g * b_sigmoid_g * "
                  "(1 - b_sigmoid_g)) * 25 * b_tanh_u",
                  f"{u_bar} = {bar} * 4 * b_tanh_g * b_sigmoid_g * (1 - b_tanh_u * b_tanh_u)")

    def print_k3s_store_pair_dot(self, op: k3s.StorePairDotOp) -> None:
        partials = op.tensor.type.dims[-1]
        column_axis = self.kernel.axes.index(k3s.GridAxis.COLUMN_BLOCK)
        self.code.comment(op, f"partial {partials} of each pair's row dot: this program's block of columns")
        self.code(f"tl.store({tensor_name(op.tensor)} + b_pairs * {partials} + tl.program_id({column_axis}), "
                  f"tl.sum({register(op.a)} * {register(op.b)}, axis=1), mask=m_s)")

    def print_k3s_sum_partials(self, op: k3s.SumPartialsOp) -> None:
        c, res = self.code, register(op.result)
        partials = op.tensor.type.dims[-1]
        c.comment(op, "in order: deterministic")
        c("o_ks = tl.arange(0, BKS)", f"{res} = tl.zeros([BR, BKS], dtype=tl.float32)", f"for i_p in range({partials}):")
        with c.indent():
            c(f"{res} += tl.load({tensor_name(op.tensor)} + (o_r[:, None] * TOP_K + o_ks[None, :]) * {partials} + i_p, "
              "mask=m_r[:, None] & (o_ks < TOP_K)[None, :], other=0.0)")

    def print_k3s_routing_weights_adjoint(self, op: k3s.RoutingWeightsAdjointOp) -> None:
        w, bar, scale = register(op.weights), register(op.scaled_bar), repr(op.scale.value.data)
        self.code.comment(op)
        if op.normalize.value.data:
            self.code(f"b_total = tl.sum({w}, axis=1)[:, None] + 1e-20",
                      f"{register(op.result)} = {scale} * ({bar} / b_total - tl.sum({bar} * {w}, axis=1)[:, None] "
                      "/ (b_total * b_total))")
        else:
            self.code(f"{register(op.result)} = {bar} * {scale}")

    def print_k3s_select_top_k_adjoint(self, op: k3s.SelectTopKAdjointOp) -> None:
        c, res = self.code, register(op.result)
        c.comment(op, "slot by slot (the padded slots have none)")
        c(f"{res} = tl.zeros([BR, BE], dtype=tl.float32)", "for i_k in range(TOP_K):")
        with c.indent():
            c("b_slot = o_ks[None, :] == i_k",
              f"b_id = tl.sum(tl.where(b_slot, {register(op.ids)}, 0), axis=1)",
              f"b_slot_bar = tl.sum(tl.where(b_slot, {register(op.weights_bar)}, 0.0), axis=1)",
              f"{res} += tl.where(o_e[None, :] == b_id[:, None], b_slot_bar[:, None], 0.0)")

    def print_k3s_router_sigmoid_adjoint(self, op: k3s.RouterSigmoidAdjointOp) -> None:
        s = register(op.scores)
        self.code.comment(op)
        self.code(f"{register(op.result)} = {register(op.scores_bar)} * {s} * (1 - {s})")

    def print_k3s_store_logits(self, op: k3s.StoreLogitsOp) -> None:
        self.code.comment(op)
        self.code(f"tl.store({tensor_name(op.tensor)} + o_r[:, None] * E + o_e[None, :], {register(op.value)}, "
                  "mask=m_r[:, None] & m_e[None, :])")

    def print_rms_rows(self, op: k3s.RmsNormAdjointOp, width: int) -> None:
        """One block of BD columns of the program's rows: b_c (the input), b_gain and b_q (gain *
        the normalised rows' cotangent), fp32."""
        self.code("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < " + str(width),
                  "m_rk = m_r[:, None] & m_k[None, :]",
                  f"b_c = tl.load({tensor_name(op.input)} + o_r[:, None] * {width} + o_k[None, :], mask=m_rk, "
                  "other=0.0).to(tl.float32)",
                  f"b_gain = tl.load({tensor_name(op.gain)} + o_k, mask=m_k, other=0.0).to(tl.float32)[None, :]",
                  f"b_q = tl.load({tensor_name(op.normed_bar)} + o_r[:, None] * {width} + o_k[None, :], mask=m_rk, "
                  "other=0.0) * b_gain")

    def print_k3s_rms_norm_adjoint(self, op: k3s.RmsNormAdjointOp) -> None:
        c, width = self.code, op.width.value.data
        c.comment(op, "two passes over the rows: their sums, then the cotangent and the normalised rows")
        c("b_sumsq = tl.zeros([BR], dtype=tl.float32)", "b_cq = tl.zeros([BR], dtype=tl.float32)",
          f"for i_k in range(0, tl.cdiv({width}, BD)):")
        with c.indent():
            self.print_rms_rows(op, width)
            c("b_sumsq += tl.sum(b_c * b_c, axis=1)", "b_cq += tl.sum(b_c * b_q, axis=1)")
        c(f"b_rstd = tl.rsqrt(b_sumsq / {width} + {op.eps.value.data!r})",
          f"tl.store({tensor_name(op.rstd)} + o_r, b_rstd, mask=m_r)",
          f"b_shift = b_rstd * b_rstd * b_rstd * b_cq / {width}",
          f"for i_k in range(0, tl.cdiv({width}, BD)):")
        with c.indent():
            self.print_rms_rows(op, width)
            for tensor, value in ((op.input_bar, "b_rstd[:, None] * b_q - b_c * b_shift[:, None]"),
                                  (op.normed, "b_c * b_rstd[:, None] * b_gain")):
                c(f"tl.store({tensor_name(tensor)} + o_r[:, None] * {width} + o_k[None, :], "
                  f"({value}).to({tensor_name(tensor)}.dtype.element_ty), mask=m_rk)")

    def print_k3s_norm_gain_grad(self, op: k3s.NormGainGradOp) -> None:
        c, width = self.code, op.width.value.data
        c.comment(op, "every token row, in order")
        c("b_gain_bar = tl.zeros([BN], dtype=tl.float32)", "for i_r in range(0, R, BR):")
        with c.indent():
            c("o_r = i_r + tl.arange(0, BR)", "m_r = o_r < R", "m_rn = m_r[:, None] & m_n[None, :]",
              f"b_c = tl.load({tensor_name(op.input)} + o_r[:, None] * {width} + o_n[None, :], mask=m_rn, other=0.0)",
              f"b_dn = tl.load({tensor_name(op.normed_bar)} + o_r[:, None] * {width} + o_n[None, :], mask=m_rn, "
              "other=0.0)",
              f"b_gain_bar += tl.sum(b_dn * b_c * tl.load({tensor_name(op.rstd)} + o_r, mask=m_r, other=0.0)[:, None], "
              "axis=0)")
        c(f"tl.store({tensor_name(op.gain_bar)} + o_n, b_gain_bar, mask=m_n)")
