"""The MoE experts' projections over MXFP4 weights in the words layout (their k3s op's packing =
words: pack_expert_weights(layout="words"), docs/moe.md). A row's blocks of 32 inputs are four
32-bit words each; word q's extraction i (_e2m1_words: two shifts and a bit-select) gives lane
h = 0, 1 the fp16 pattern of input 16 h + 4 i + q's E2M1 value times 2^-14, so a step's
multiply-and-sum takes, per extraction, the activations of those columns, and each block's
partial sum is scaled once (_mxfp4_scaled: 2^14, then the block's 2^(s - 127)). The
expert-centric tl.dot path dequantises a [BD / 8, BN] word tile to two [BD / 2, BN] fp32 tiles
instead (_mxfp4_words_dequant), each weight times its scale, and loads the activations in that
tile's column order.

Names: o_blk, m_blk (the step's blocks of 32 inputs), o_q (a block's words), b_words_<half>
(a half's words, uint32), b_part_<half> (its per-extraction products, summed per block at the
end of the step), i_x (the extraction), b_a_lo / b_a_hi (the activations of lane 0's and lane
1's columns), b_w_lo / b_w_hi (the lanes' weights); in the tl.dot path o_kw, m_kw (the step's
words of a row) and o_kk, m_kk (the dots' depth, 4 words + extraction) with o_k its input
columns."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import tensor_name


def at(name: str, axis: int, ndim: int) -> str:
    """`name` (a vector) along axis `axis` of an ndim-dimensional tile: o_n[None, :, None]."""
    return f"{name}[{', '.join(':' if i == axis else 'None' for i in range(ndim))}]"


class ExpertWords:
    """TritonPrinter's helpers for the experts' projections over words-layout MXFP4 weights."""

    def print_words_step(self, op, accumulators: list[str], row: str, slots: bool = False,
                         slot_rows: bool = False, factor: str = "") -> None:
        """A step of a K loop of one-row products over the step's BD // 32 blocks: per half its
        word tile ([BN, NB, 4], with `slots` [BJ, BN, NB, 4]: the slots' experts b_e, masked by
        m_j), per extraction the activations of its two lanes' columns and a multiply-and-sum,
        then each block's sum scaled and summed into the half's accumulator. The activations are
        one row starting at `row`, or with `slot_rows` a row per slot (`row` indexes them as
        [BJ, NB, 4]), times `factor` on load."""
        c = self.code
        nd = 4 if slots else 3
        lead = nd - 2  # the blocks' axis (o_blk); the output rows' (o_n) is the one before
        words = f"{'BJ, ' if slots else ''}BN, BD // 32, 4"
        halves = len(accumulators)
        c("o_blk = i_k * (BD // 32) + tl.arange(0, BD // 32)", "m_blk = o_blk < DIN // 32", "o_q = tl.arange(0, 4)")
        for half in range(halves):
            c(f"b_words_{half} = tl.load({self.words_tile(op.weight, half, halves, slots, nd, '(DIN // 8)')} + "
              f"{at('o_blk', lead, nd)} * 4 + {at('o_q', lead + 1, nd)}, mask={self.words_mask(slots, nd)}, "
              "other=0).to(tl.uint32, bitcast=True)",
              f"b_part_{half} = tl.zeros([{words}], dtype=tl.float32)")
        c("for i_x in tl.static_range(4):  # extraction i_x: lane h of word q is input 16 h + 4 i_x + q of its block")
        with c.indent():
            if slot_rows:
                blocks, mask, spread = "o_blk[None, :, None] * 32", "m_j[:, None, None] & m_blk[None, :, None]", "[:, None, :, :]"
                columns = "o_q[None, None, :]"
            else:
                blocks, mask, spread = "o_blk[:, None] * 32", "m_blk[:, None]", f"[{'None, ' * lead}:, :]"
                columns = "o_q[None, :]"
            for lane, first in (("lo", ""), ("hi", "16 + ")):
                c(f"b_a_{lane} = tl.load({row} + {blocks} + {first}4 * i_x + {columns}, mask={mask}, "
                  f"other=0.0).to(tl.float32){factor}")
            for half in range(halves):
                c(f"b_w_lo, b_w_hi = _e2m1_words(b_words_{half}, i_x)",
                  f"b_part_{half} += b_w_lo * b_a_lo{spread} + b_w_hi * b_a_hi{spread}")
        for half, acc in enumerate(accumulators):
            scales = (f"{self.words_tile(op.scales, half, halves, slots, nd - 1, '(DIN // 32)')} + "
                      f"{at('o_blk', lead, nd - 1)}")
            c(f"{acc} += tl.sum(_mxfp4_scaled(tl.sum(b_part_{half}, axis={nd - 1}), tl.load({scales}, "
              f"mask={self.words_mask(slots, nd - 1)}, other=0)), axis={nd - 2})")

    @staticmethod
    def words_tile(tensor, half: int, halves: int, slots: bool, nd: int, row_length: str) -> str:
        """Where the rows of a words tile (or of its scales) start: the expert (i_e, or the slots'
        b_e) and half `half`'s output rows o_n of `tensor` [E, halves * DOUT, row_length]."""
        rows = f"({half} * DOUT + o_n)" if half else "o_n"
        expert = at("b_e", 0, nd) if slots else "i_e"
        return (f"{tensor_name(tensor)} + {expert} * {halves} * DOUT * {row_length} + "
                f"{at(rows, int(slots), nd)} * {row_length}")

    @staticmethod
    def words_mask(slots: bool, nd: int) -> str:
        """The mask of a words tile ([BJ,] BN, NB[, 4]): slots, output rows and blocks."""
        masks = (["m_j"] if slots else []) + ["m_n", "m_blk"]
        return " & ".join(at(mask, axis, nd) for axis, mask in enumerate(masks))

    def print_words_block_step(self, op, row: str, mask: str, accumulators: list[str]) -> None:
        """A step of a block of rows' K loop (tl.dot) over words-layout weights: BD // 8 words of
        each weight row dequantised to two [BD // 2, BN] tiles (lanes 0 and 1, depth index 4 k + i
        extraction i of word k), the activations loaded at those columns."""
        c = self.code
        c("o_kw = i_k * (BD // 8) + tl.arange(0, BD // 8)", "m_kw = o_kw < DIN // 8",
          "# depth o_kk = 4 w + i: extraction i of word w, lane h's input 32 (w // 4) + 16 h + 4 i + w % 4",
          "o_kk = i_k * (BD // 2) + tl.arange(0, BD // 2)", "m_kk = o_kk < DIN // 2",
          "o_k = o_kk // 16 * 32 + o_kk % 4 * 4 + o_kk // 4 % 4")
        for lane, first in (("lo", ""), ("hi", "16 + ")):
            c(f"b_a_{lane} = tl.load({tensor_name(op.input)} + {row}[:, None] * DIN + {first}o_k[None, :], "
              f"mask={mask}[:, None] & m_kk[None, :], other=0.0)")
        halves = len(accumulators)
        for half, acc in enumerate(accumulators):
            rows = f"({half} * DOUT + o_n)[None, :]" if half else "o_n[None, :]"
            expert = f"i_e * {halves} * DOUT"
            c(f"b_w_lo, b_w_hi = _mxfp4_words_dequant(tl.load({tensor_name(op.weight)} + {expert} * (DIN // 8) + "
              f"{rows} * (DIN // 8) + o_kw[:, None], mask=m_kw[:, None] & m_n[None, :], other=0).to(tl.uint32, "
              f"bitcast=True), tl.load({tensor_name(op.scales)} + {expert} * (DIN // 32) + {rows} * (DIN // 32) + "
              "(o_kw // 4)[:, None], mask=m_kw[:, None] & m_n[None, :], other=0))",
              f"{acc} += _mm(b_a_lo, b_w_lo, DOT) + _mm(b_a_hi, b_w_hi, DOT)")
