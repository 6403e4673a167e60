"""The MoE experts' stages: the dispatch plan (count, offsets, sort), the projections (a K loop
over blocks of BD input columns: tl.dot for blocks of rows, a multiply-and-sum for one row),
the GLU, the routing weights, the slots' combine and the row stores.

Names the grid axes define (their print_axis_ methods below; row_block's in kernels.py): o_r,
m_r (row_block: token rows); i_sb, o_s, m_s, b_pairs, o_t, i_e (sorted_block: positions, their
pairs, tokens and the block's expert); i_p, o_t, i_e (pair); i_t (token); o_n, m_n
(column_block); o_p, m_p (pair_chunk). The sorted_block and pair axes read the tensors the
kernel's projection takes its rows from (k3s.project's ROW_TENSORS operands)."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import EntryView, kernel_constants_of, register, tensor_name
from k3compile.backends.triton.printer.experts_words import ExpertWords
from k3compile.ir import k3s

# (rows, input_index) -> the row numbers and the mask of a program's rows
BLOCK_ROWS = {
    ("token_block", "token"): ("o_r", "m_r"),
    ("sorted_block", "token"): ("o_t", "m_s"),
    ("sorted_block", "position"): ("o_s", "m_s"),
    ("sorted_block", "pair"): ("b_pairs", "m_s"),
    ("token_slots", "pair"): ("o_pj", "m_j"),  # made by k3s.project_token_slots
}
ONE_ROW = {("pair", "token"): "o_t", ("pair", "pair"): "i_p", ("token", "token"): "i_t"}
MXFP4_WORDS = "; MXFP4 weights (words layout) dequantised in registers, each block's sum scaled once"


def weight_offsets(layout: str, half: int, halves: int, n: str, k: str, row_length: str = "DIN") -> str:
    """The offsets of a weight tile's elements (k3s.weight_layout), output rows indexed by `n`
    and input columns by `k` (each an index vector with its broadcast, e.g. "o_n[None, :]"); an
    expert's rows `row_length` long (MXFP4: its bytes' or its scales')."""
    o_n, o_k = n.replace("o_n", "({})"), k.replace("o_k", "({})")
    if layout == "dense":
        return f"{n} * DIN + {k}"
    if layout == "expert":
        row = o_n.format(f"{half} * DOUT + o_n") if half else n
        return f"i_e * {halves} * DOUT * {row_length} + {row} * {row_length} + {k}"
    if layout == "stacked_out":
        return (f"{o_n.format('o_n // GROUP')} * {halves} * GROUP * DIN + "
                f"{o_n.format(f'{half} * GROUP + o_n % GROUP')} * DIN + {k}")
    return f"{o_k.format('o_k // GROUP')} * DOUT * GROUP + {n} * GROUP + {o_k.format('o_k % GROUP')}"


class Experts(ExpertWords):
    """TritonPrinter's methods for the MoE experts (one per k3s op, and their helpers); MXFP4
    weights in the words layout (packing = words) through ExpertWords' steps."""

    # --- each stage's compile-time sizes (common.KERNEL_CONSTANTS): its widths and top_k, the
    # block sizes legalize-triton fixed (BR rows, BN output and BD input columns, BE experts),
    # the dispatch plan's BM

    @kernel_constants_of(k3s.CountPairsOp, k3s.SortPairsOp)
    def pair_plan_constants(self, op: k3s.CountPairsOp | k3s.SortPairsOp, kernel: k3s.KernelOp,
                            view: EntryView) -> dict[str, int]:
        sizes = {"TOP_K": op.top_k.value.data, "BR": kernel.block_r.value.data}
        if isinstance(op, k3s.CountPairsOp):
            return sizes
        if op.chunk_base is not None:  # the pair-order plan's chunks
            sizes |= {"CH": op.pairs_per_chunk.value.data, "E": self.num_experts(view)}
        return sizes | {"BM": op.block_rows.value.data}

    @kernel_constants_of(k3s.ExpertOffsetsOp)
    def expert_offsets_constants(self, op: k3s.ExpertOffsetsOp, kernel: k3s.KernelOp,
                                 view: EntryView) -> dict[str, int]:
        return {"E": op.num_experts.value.data, "BE": kernel.block_e.value.data, "BM": op.block_rows.value.data}

    @kernel_constants_of(k3s.ProjectTokenSlotsOp, k3s.SumExpertRowsOp)
    def token_slots_constants(self, op: k3s.ProjectTokenSlotsOp | k3s.SumExpertRowsOp, kernel: k3s.KernelOp,
                              view: EntryView) -> dict[str, int]:
        return {"DOUT": op.out_dim.value.data, "BN": kernel.block_n.value.data, "DIN": op.in_dim.value.data,
                "BD": kernel.block_d.value.data, "TOP_K": op.top_k.value.data, "BJ": op.slots.value.data}

    @kernel_constants_of(k3s.SumSlotsOp)
    def sum_slots_constants(self, op: k3s.SumSlotsOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return {"DOUT": op.out_dim.value.data, "BN": kernel.block_n.value.data, "TOP_K": op.top_k.value.data,
                "BR": kernel.block_r.value.data}

    @kernel_constants_of(k3s.ProjectSlotsOp)
    def project_slots_constants(self, op: k3s.ProjectSlotsOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return {"DOUT": op.out_dim.value.data, "BN": kernel.block_n.value.data, "DIN": op.in_dim.value.data,
                "BD": kernel.block_d.value.data, "TOP_K": op.top_k.value.data}

    @kernel_constants_of(k3s.ProjectOp)
    def project_constants(self, op: k3s.ProjectOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """By its rows: a block of token rows (BR), of the expert-sorted pair list (BM, its experts
        E), or one pair; an output of grouped columns' GROUP."""
        sizes = {"DOUT": op.out_dim.value.data, "BN": kernel.block_n.value.data, "DIN": op.in_dim.value.data,
                 "BD": kernel.block_d.value.data}
        rows = op.rows.data.value
        if rows == "token_block":
            sizes["BR"] = kernel.block_r.value.data
        elif rows == "sorted_block":
            sizes |= {"BM": op.block_rows.value.data, "TOP_K": self.top_k(view),
                      "E": self.num_experts(view)}
        elif rows == "pair":
            sizes["TOP_K"] = self.top_k(view)
        if op.group is not None:
            sizes["GROUP"] = op.group.value.data
        return sizes

    def print_axis_column_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BN output columns",
            f"o_n = tl.program_id({axis}) * BN + tl.arange(0, BN)",
            "m_n = o_n < DOUT",
        )

    def print_axis_pair_chunk(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BR (token, slot) pairs, p = t * TOP_K + j",
            f"o_p = tl.program_id({axis}) * BR + tl.arange(0, BR)",
            "m_p = o_p < R * TOP_K",
        )

    def print_axis_one(self, axis: int) -> None:
        self.code(f"# grid axis {axis}: one program")

    def row_tensors(self) -> dict[str, str]:
        """The names of the tensors that the rows of the kernel's programs come from (the
        sorted_block and pair axes): those its projection (or its input gradient) takes
        (k3s.project's ROW_TENSORS), in a row kernel without one its first k3s.load_rows'."""
        source = next(op for op in self.kernel.walk() if isinstance(op, (k3s.ProjectOp, k3s.ProjectInputGradOp))
                      or isinstance(op, k3s.LoadRowsOp) and op.tensors)
        return {role: tensor_name(value) for role, value in source.named_tensors().items()}

    def print_axis_sorted_block(self, axis: int) -> None:
        plan = self.row_tensors()
        self.code(
            f"# grid axis {axis}: a block of BM positions of the expert-sorted pair list, all of one expert",
            f"i_sb = tl.program_id({axis}).to(tl.int64)",
            f"if i_sb * BM >= tl.load({plan['expert_offsets']} + E):  # past the blocks in use",
            "    return",
            "o_s = i_sb * BM + tl.arange(0, BM)",
            f"b_pairs = tl.load({plan['sorted_pairs']} + o_s).to(tl.int64)",
            "m_s = b_pairs >= 0  # -1: padding",
            "o_t = tl.where(m_s, b_pairs // TOP_K, 0)",
            f"i_e = tl.load({plan['block_expert']} + i_sb).to(tl.int64)",
        )

    def print_axis_pair(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one (token, slot) pair, p = t * TOP_K + j, and its expert",
            f"i_p = tl.program_id({axis}).to(tl.int64)",
            "o_t = i_p // TOP_K",
            f"i_e = tl.load({self.row_tensors()['topk_ids']} + i_p).to(tl.int64)",
        )

    def print_axis_token(self, axis: int) -> None:
        self.code(f"# grid axis {axis}: one token row", f"i_t = tl.program_id({axis}).to(tl.int64)")

    @staticmethod
    def top_k(view) -> int:
        """The routing's slots per token (topk_ids is [R, top_k]): the top_k of the layer the entry lowers."""
        return view.entry.layer().top_k.value.data

    @staticmethod
    def num_experts(view) -> int:
        """The routed experts E (expert_counts is [E], expert_offsets [E + 1]): its layer's."""
        return view.entry.layer().num_experts.value.data

    def print_k3s_count_pairs(self, op: k3s.CountPairsOp) -> None:
        ids, counts, rank = (tensor_name(v) for v in (op.topk_ids, op.expert_counts, op.pair_rank))
        self.code.comment(op, "atomic_add returns each pair's place among its expert's pairs")
        self.code(f"b_e = tl.load({ids} + o_p, mask=m_p, other=0)",
                  f"b_rank = tl.atomic_add({counts} + b_e, 1, mask=m_p)",
                  f"tl.store({rank} + o_p, b_rank, mask=m_p)")

    def print_k3s_expert_offsets(self, op: k3s.ExpertOffsetsOp) -> None:
        counts, offsets = tensor_name(op.expert_counts), tensor_name(op.expert_offsets)
        self.code.comment(op, "an exclusive prefix sum of the counts rounded up to whole blocks")
        self.code("o_e = tl.arange(0, BE)",
                  "m_e = o_e < E",
                  f"b_padded = tl.cdiv(tl.load({counts} + o_e, mask=m_e, other=0), BM) * BM",
                  f"tl.store({offsets} + o_e, tl.cumsum(b_padded, axis=0) - b_padded, mask=m_e)",
                  f"tl.store({offsets} + E, tl.sum(b_padded, axis=0))")

    def print_k3s_sort_pairs(self, op: k3s.SortPairsOp) -> None:
        ids, offsets, rank, pairs, blocks = (tensor_name(v) for v in (op.topk_ids, op.expert_offsets, op.pair_rank,
                                                                      op.sorted_pairs, op.block_expert))
        self.code.comment(op, "each pair to its expert's run; every block of the run names the expert")
        self.code(f"b_e = tl.load({ids} + o_p, mask=m_p, other=0)",
                  f"b_at = tl.load({offsets} + b_e, mask=m_p, other=0) + tl.load({rank} + o_p, mask=m_p, other=0)")
        if op.chunk_base is not None:  # the pair-order plan: the expert's pairs in the chunks before
            self.code(f"b_at += tl.load({tensor_name(op.chunk_base)} + (o_p // CH) * E + b_e, mask=m_p, other=0)")
        self.code(f"tl.store({pairs} + b_at, o_p.to(tl.int32), mask=m_p)",
                  f"tl.store({blocks} + b_at // BM, b_e, mask=m_p)")

    def print_k3s_project(self, op: k3s.ProjectOp) -> None:
        c = self.code
        rows, index, layout = op.rows.data.value, op.input_index.data.value, op.layout.data.value
        accumulators = [register(op.result)] + ([register(op.up)] if op.up is not None else [])
        halves = len(accumulators)
        rms = op.rms_eps is not None
        weight, source = tensor_name(op.weight), tensor_name(op.input)
        c.comment(op, "fp32 accumulation over blocks of BD input columns"
                  + ("; the rows' RMS from the same pass (it factors out of the product)" if rms else "")
                  + ("; MXFP4 weights dequantised in registers" if op.scales is not None else ""))
        one_row = rows in ("pair", "token")
        block = "BR" if rows == "token_block" else "BM"
        for acc in accumulators:
            c(f"{acc} = tl.zeros({'[BN]' if one_row else f'[{block}, BN]'}, dtype=tl.float32)")
        if rms:
            c(f"b_sumsq = tl.zeros([{block}], dtype=tl.float32)")
        c("for i_k in range(0, tl.cdiv(DIN, BD)):")
        with c.indent():
            if op.scales is not None:  # never RMS-normalised (k3s.project's verifier)
                words = k3s.weight_packing(op) == k3s.Packing.WORDS
                if one_row:
                    step = self.print_words_step if words else self.print_mxfp4_row_step
                    step(op, accumulators, f"{source} + {ONE_ROW[rows, index]} * DIN")
                else:
                    step = self.print_words_block_step if words else self.print_mxfp4_block_step
                    step(op, *BLOCK_ROWS[rows, index], accumulators)
                return
            c("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < DIN")
            if one_row:
                row = ONE_ROW[rows, index]
                c(f"b_a = tl.load({source} + {row} * DIN + o_k, mask=m_k, other=0.0).to(tl.float32)")
                for half, acc in enumerate(accumulators):
                    offsets = weight_offsets(layout, half, halves, "o_n[:, None]", "o_k[None, :]")
                    c(f"b_w = tl.load({weight} + {offsets}, mask=m_n[:, None] & m_k[None, :], other=0.0)",
                      f"{acc} += tl.sum(b_w.to(tl.float32) * b_a[None, :], axis=1)")
                return
            row, mask = BLOCK_ROWS[rows, index]
            c(f"b_a = tl.load({source} + {row}[:, None] * DIN + o_k[None, :], mask={mask}[:, None] & m_k[None, :], "
              "other=0.0)")
            if rms:
                c("b_a = b_a.to(tl.float32)",
                  "b_sumsq += tl.sum(b_a * b_a, axis=1)",
                  f"b_a = (b_a * tl.load({tensor_name(op.gain)} + o_k, mask=m_k, other=0.0).to(tl.float32)[None, :])"
                  f".to({weight}.dtype.element_ty)")
            for half, acc in enumerate(accumulators):
                offsets = weight_offsets(layout, half, halves, "o_n[None, :]", "o_k[:, None]")
                c(f"b_w = tl.load({weight} + {offsets}, mask=m_k[:, None] & m_n[None, :], other=0.0)",
                  f"{acc} += _mm(b_a, b_w, DOT)")
        if rms:
            c(f"{accumulators[0]} *= tl.rsqrt(b_sumsq / DIN + {op.rms_eps.value.data!r})[:, None]")

    def print_mxfp4_row_step(self, op, accumulators: list[str], row: str) -> None:
        """A step of one row's K loop over MXFP4 weights: the tile's BD // 32 blocks of 32 input
        columns as [BN, blocks, 16] bytes (their scales [BN, blocks, 1] broadcast), the low nibbles
        against each block's first 16 columns of the row (`row`: where it starts), the high ones
        against its last 16."""
        c = self.code
        c("o_blk = i_k * (BD // 32) + tl.arange(0, BD // 32)", "m_blk = o_blk < DIN // 32", "o_j = tl.arange(0, 16)")
        for part, first in (("lo", ""), ("hi", "16 + ")):
            c(f"b_a_{part} = tl.load({row} + o_blk[:, None] * 32 + {first}o_j[None, :], mask=m_blk[:, None], "
              "other=0.0).to(tl.float32)")
        for half, acc in enumerate(accumulators):
            self.print_mxfp4_weights(op, half, len(accumulators), "o_n[:, None, None]",
                                     "o_blk[None, :, None] * 16 + o_j[None, None, :]", "o_blk[None, :, None]",
                                     "m_n[:, None, None] & m_blk[None, :, None]")
            c(f"{acc} += tl.sum(tl.sum(b_w_lo * b_a_lo[None, :, :] + b_w_hi * b_a_hi[None, :, :], axis=2), axis=1)")

    def print_mxfp4_block_step(self, op, row: str, mask: str, accumulators: list[str]) -> None:
        """A step of a block of rows' K loop over MXFP4 weights: the tile's BD // 2 bytes of each
        weight row, byte b holding input columns o_k = b // 16 * 32 + b % 16 (low nibble) and
        o_k + 16 (high), so two dots of depth BD // 2 take the activations' two sets of columns
        as loaded, with no interleave of the nibbles."""
        c = self.code
        c("o_kb = i_k * (BD // 2) + tl.arange(0, BD // 2)", "m_kb = o_kb < DIN // 2", "o_k = o_kb // 16 * 32 + o_kb % 16")
        for part, first in (("lo", ""), ("hi", "16 + ")):
            c(f"b_a_{part} = tl.load({tensor_name(op.input)} + {row}[:, None] * DIN + {first}o_k[None, :], "
              f"mask={mask}[:, None] & m_kb[None, :], other=0.0)")
        for half, acc in enumerate(accumulators):
            self.print_mxfp4_weights(op, half, len(accumulators), "o_n[None, :]", "o_kb[:, None]", "(o_kb // 16)[:, None]",
                                     "m_kb[:, None] & m_n[None, :]")
            c(f"{acc} += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)")

    def print_mxfp4_weights(self, op, half: int, halves: int, n: str, byte: str, block: str, mask: str) -> None:
        """b_w_lo, b_w_hi: a tile of an expert's MXFP4 weights in fp32 (the low and the high
        nibbles' inputs), from its bytes (input bytes indexed by `byte`) and their blocks' scales
        (blocks indexed by `block`), rows by `n`; masked bytes and scales are 0, their weights 0."""
        packed = weight_offsets("expert", half, halves, n, byte, "(DIN // 2)")
        scales = weight_offsets("expert", half, halves, n, block, "(DIN // 32)")
        self.code(f"b_w_lo, b_w_hi = _mxfp4_dequant(tl.load({tensor_name(op.weight)} + {packed}, mask={mask}, other=0), "
                  f"tl.load({tensor_name(op.scales)} + {scales}, mask={mask}, other=0))")

    def print_k3s_project_slots(self, op: k3s.ProjectSlotsOp) -> None:
        c = self.code
        y, ids, weights = register(op.result), tensor_name(op.topk_ids), tensor_name(op.topk_weights)
        c.comment(op, "the token's slots in order, each an fp32 product with its expert's rows, weighted"
                  + ("; MXFP4 weights dequantised in registers" if op.scales is not None else ""))
        c(f"{y} = tl.zeros([BN], dtype=tl.float32)", "for i_j in range(TOP_K):")
        with c.indent():
            c(f"i_e = tl.load({ids} + i_t * TOP_K + i_j).to(tl.int64)", "b_part = tl.zeros([BN], dtype=tl.float32)",
              "for i_k in range(0, tl.cdiv(DIN, BD)):")
            with c.indent():
                if op.scales is not None:
                    step = (self.print_words_step if k3s.weight_packing(op) == k3s.Packing.WORDS
                            else self.print_mxfp4_row_step)
                    step(op, ["b_part"], f"{tensor_name(op.input)} + (i_t * TOP_K + i_j) * DIN")
                else:
                    self.print_dense_slot_step(op)
            c(f"{y} += tl.load({weights} + i_t * TOP_K + i_j) * b_part")

    def print_dense_slot_step(self, op: k3s.ProjectSlotsOp) -> None:
        """A step of a slot's K loop over weights of the input's dtype."""
        self.code("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < DIN",
                  f"b_a = tl.load({tensor_name(op.input)} + (i_t * TOP_K + i_j) * DIN + o_k, mask=m_k, other=0.0)",
                  f"b_w = tl.load({tensor_name(op.weight)} + {weight_offsets('expert', 0, 1, 'o_n[:, None]', 'o_k[None, :]')}, "
                  "mask=m_n[:, None] & m_k[None, :], other=0.0)",
                  "b_part += tl.sum(b_w.to(tl.float32) * b_a.to(tl.float32)[None, :], axis=1)")

    def print_k3s_project_token_slots(self, op: k3s.ProjectTokenSlotsOp) -> None:
        c = self.code
        accumulators = [register(op.result)] + ([register(op.up)] if op.up is not None else [])
        c.comment(op, "the token's slots a tile axis (o_j), each slot's expert rows streamed whole along the "
                      "input columns, fp32 multiply-and-sum" + MXFP4_WORDS * (op.scales is not None))
        c("o_j = tl.arange(0, BJ)", "m_j = o_j < TOP_K", "o_pj = i_t * TOP_K + o_j",
          f"b_e = tl.load({tensor_name(op.topk_ids)} + o_pj, mask=m_j, other=0).to(tl.int64)",
          *(f"{acc} = tl.zeros([BJ, BN], dtype=tl.float32)" for acc in accumulators),
          "for i_k in range(0, tl.cdiv(DIN, BD)):")
        with c.indent():
            if op.scales is not None:  # words only (its verifier)
                self.print_words_step(op, accumulators, f"{tensor_name(op.input)} + i_t * DIN", slots=True)
                return
            c("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < DIN",
              f"b_a = tl.load({tensor_name(op.input)} + i_t * DIN + o_k, mask=m_k, other=0.0).to(tl.float32)")
            for half, acc in enumerate(accumulators):
                self.print_slot_rows(op.weight, half, len(accumulators), "m_j")
                c(f"{acc} += tl.sum(b_w.to(tl.float32) * b_a[None, None, :], axis=2)")

    def print_k3s_sum_expert_rows(self, op: k3s.SumExpertRowsOp) -> None:
        c = self.code
        y, ids = register(op.result), tensor_name(op.topk_ids)
        c.comment(op, "teams of BJ slots (a tile axis), each slot's down rows streamed whole, its activations "
                      "weighted on load; the teams accumulated in fp32 registers, reduced over the slots at the end"
                  + MXFP4_WORDS * (op.scales is not None))
        c("b_teams = tl.zeros([BJ, BN], dtype=tl.float32)", "for i_j in range(0, tl.cdiv(TOP_K, BJ)):")
        with c.indent():
            c("o_j = i_j * BJ + tl.arange(0, BJ)", "m_j = o_j < TOP_K", "o_pj = i_t * TOP_K + o_j",
              f"b_e = tl.load({ids} + o_pj, mask=m_j, other=0).to(tl.int64)",
              f"b_route = tl.load({tensor_name(op.topk_weights)} + o_pj, mask=m_j, other=0.0)",
              "for i_k in range(0, tl.cdiv(DIN, BD)):")
            with c.indent():
                if op.scales is not None:  # words only (its verifier)
                    self.print_words_step(op, ["b_teams"], f"{tensor_name(op.input)} + o_pj[:, None, None] * DIN",
                                          slots=True, slot_rows=True, factor=" * b_route[:, None, None]")
                else:
                    c("o_k = i_k * BD + tl.arange(0, BD)", "m_k = o_k < DIN",
                      f"b_a = tl.load({tensor_name(op.input)} + o_pj[:, None] * DIN + o_k[None, :], "
                      "mask=m_j[:, None] & m_k[None, :], other=0.0).to(tl.float32) * b_route[:, None]")
                    self.print_slot_rows(op.weight, 0, 1, "m_j")
                    c("b_teams += tl.sum(b_w.to(tl.float32) * b_a[:, None, :], axis=2)")
        c(f"{y} = tl.sum(b_teams, axis=0)")

    def print_slot_rows(self, weight, half: int, halves: int, slots_mask: str) -> None:
        """b_w: a [BJ, BN, BD] tile of the slots' experts' rows (b_e) of `weight` [E, halves * DOUT,
        DIN], half `half`'s output rows o_n, input columns o_k."""
        rows = f"({half} * DOUT + o_n)" if half else "o_n"
        self.code(f"b_w = tl.load({tensor_name(weight)} + b_e[:, None, None] * {halves} * DOUT * DIN + "
                  f"{rows}[None, :, None] * DIN + o_k[None, None, :], "
                  f"mask={slots_mask}[:, None, None] & m_n[None, :, None] & m_k[None, None, :], other=0.0)")

    def print_k3s_glu(self, op: k3s.GluOp) -> None:
        g, u = register(op.gate), register(op.up)
        self.code.comment(op, "tanh(x) = 2 sigmoid(2 x) - 1" if op.activation.data.value == "situ_glu" else "")
        if op.activation.data.value == "swiglu":
            self.code(f"{register(op.result)} = {g} * tl.sigmoid({g}) * {u}")
        else:
            self.code(f"{register(op.result)} = (4 * (2 * tl.sigmoid({g} / 2) - 1) * tl.sigmoid({g})"
                      f" * 25 * (2 * tl.sigmoid({u} / 12.5) - 1))")

    def print_k3s_weigh_pairs(self, op: k3s.WeighPairsOp) -> None:
        self.code.comment(op, "topk_weights read flat: a pair's number is its offset")
        self.code(f"{register(op.result)} = {register(op.value)} * "
                  f"tl.load({tensor_name(op.topk_weights)} + b_pairs, mask=m_s, other=0.0)[:, None]")

    def print_k3s_sum_slots(self, op: k3s.SumSlotsOp) -> None:
        c = self.code
        y = register(op.result)
        c.comment(op, "in slot order: the same sum whatever order the pairs were computed in")
        c(f"{y} = tl.zeros([BR, BN], dtype=tl.float32)", "for i_j in range(TOP_K):")
        with c.indent():
            c(f"{y} += tl.load({tensor_name(op.input)} + (o_r * TOP_K + i_j)[:, None] * DOUT + o_n[None, :], "
              "mask=m_r[:, None] & m_n[None, :], other=0.0).to(tl.float32)")

    def print_k3s_store_rows(self, op: k3s.StoreRowsOp) -> None:
        c = self.code
        tensor, value, width = tensor_name(op.tensor), register(op.value), op.width.value.data
        rows, index = op.rows.data.value, op.index.data.value
        c.comment(op, "adding to what is there, in fp32" if op.accumulate.value.data else "")
        if rows in ("pair", "token"):
            at, mask = f"{tensor} + {ONE_ROW[rows, index]} * {width} + o_n", "m_n"
        else:
            row, rows_mask = BLOCK_ROWS[rows, index]
            at, mask = f"{tensor} + {row}[:, None] * {width} + o_n[None, :]", f"{rows_mask}[:, None] & m_n[None, :]"
        if op.accumulate.value.data:
            c(f"{value} += tl.load({at}, mask={mask}, other=0.0).to(tl.float32)")
        c(f"tl.store({at}, {value}.to({tensor}.dtype.element_ty), mask={mask})")

