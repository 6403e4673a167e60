"""The chunkwise (WY/UT) stages: the chunk tile and loop, gate cumsum, the gated Grams, the
triangular inverse, the WY factors, gate application, spills and reloads, the scan's residual,
output and state advance, checkpoints.

The products' precision (k3s.kernel <dots>), the inverse's products and squarings, the
value-block loops' and the channel-gated Gram's block loop's unrolling, where the Gram's
elementwise diagonal takes its rows from (reloaded or extracted) and where a stage's rows are in
a workspace or the output (a spill's, reload's or chunk output's <layout>, printed as addresses by
common.tensor_address; a checkpoint's <address> likewise, its slot's row first) are the IR's
(lower-to-triton). The printer decides nothing here."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import (chosen, presence_flag, register, tensor_address, tensor_name,
                                                      value_block_count)
from k3compile.ir import k3s


# a chunk kernel's tile dimensions as the block sizes of their Triton shapes
TILE_BLOCKS = {"C": "BC", "NB": "NB", "K": "BK", "V": "BV"}


class ChunkStages:
    """TritonPrinter's methods for chunkstages (one per k3s op, and their helpers)."""

    def gamma(self, gate: str, exponent: str) -> str:
        """exp2 of a log2 expression (Gamma from G) broadcast against a [BC, BK] tile."""
        return f"tl.exp2({exponent})" if gate == "channel" else f"tl.exp2({exponent})[:, None]"

    def loop_range(self, op: k3s.ValueBlockLoopOp | k3s.SumValueBlockPartsOp | k3s.GramOp) -> str:
        """The range of op's loop: unrolled (tl.static_range) where op says so."""
        return "tl.static_range" if chosen(op, "unroll").value.data else "range"

    def in_value_block_grid(self) -> bool:
        """Whether the kernel being printed runs a value block a program (a value_block grid axis)."""
        return k3s.GridAxis.VALUE_BLOCK in self.kernel.axes

    def print_k3s_chunk_tile(self, op: k3s.ChunkTileOp) -> None:
        if self.in_value_block_grid():  # o_v, m_v: the grid axis's block
            self.code.comment(op, "this program's token rows, all key columns")
            self.code("o_c = tl.arange(0, BC)", "t_c = start + o_c", "m_c = t_c < eos",
                      "o_k = tl.arange(0, BK)", "m_k = o_k < K")
            return
        self.code.comment(op, "this program's token rows, all key and value columns")
        self.code(
            "o_c = tl.arange(0, BC)", "t_c = start + o_c", "m_c = t_c < eos",
            "o_k = tl.arange(0, BK)", "m_k = o_k < K", "o_v = tl.arange(0, BV)", "m_v = o_v < V",
        )

    def print_k3s_chunk_loop(self, op: k3s.ChunkLoopOp) -> None:
        self.print_initial_state(op)
        c = self.code
        carried = ", ".join(register(arg) for arg in op.body.block.args)
        c.comment(op, f"the chunks of sequence i_n, in order, carrying {carried}")
        c("o_c = tl.arange(0, BC)")
        self.print_sequence_bounds(op.offsets)
        if op.reverse is not None and op.reverse.value.data:
            c("for i_rc in range(0, tl.cdiv(eos - bos, BC)):")
            with c.indent():
                c("start = bos + (tl.cdiv(eos - bos, BC) - 1 - i_rc) * BC  # the chunks from the last to the first")
                c("t_c = start + o_c", "m_c = t_c < eos")
                self.print_ops(op)
            return
        c("for start in range(bos, eos, BC):")
        with c.indent():
            c("t_c = start + o_c", "m_c = t_c < eos")
            self.print_ops(op)

    def print_k3s_value_block_loop(self, op: k3s.ValueBlockLoopOp) -> None:
        c = self.code
        if self.in_value_block_grid():
            c.comment(op, "one block of BV value columns, this program's (grid axis value_block): what "
                          "contracts them, its part of the sums over the blocks")
            self.print_ops(op)
            return
        c.comment(op, "the value columns in blocks of BV; what contracts them summed over the blocks")
        for carried in op.body.block.args:
            shape = ", ".join(TILE_BLOCKS[d.data] for d in carried.type.dims.data)
            c(f"{register(carried)} = tl.zeros([{shape}], dtype=tl.float32)")
        c(f"for i_vb in {self.loop_range(op)}(0, (V + BV - 1) // BV):")
        with c.indent():
            c("o_v = i_vb * BV + tl.arange(0, BV)", "m_v = o_v < V")
            self.print_ops(op)

    def print_k3s_sum_value_blocks(self, op: k3s.SumValueBlocksOp) -> None:
        self.code.comment(op)
        add = "=" if self.in_value_block_grid() else "+="  # one block a program: its part
        for carried, part in zip(op.parent_block().args, op.parts, strict=True):
            self.code(f"{register(carried)} {add} {register(part)}")

    def print_k3s_spill_value_block_part(self, op: k3s.SpillValueBlockPartOp) -> None:
        address, mask = tensor_address(op, part="i_v")
        self.code.comment(op, "its block's slot, for the kernel that adds them up")
        self.code(f"tl.store({address}, {register(op.part)}{f', mask={mask}' if mask else ''})")

    def print_k3s_sum_value_block_parts(self, op: k3s.SumValueBlockPartsOp) -> None:
        address, mask = tensor_address(op, part="i_p")
        blocks = value_block_count(op)
        out = register(op.total)
        shape = ", ".join(TILE_BLOCKS[d] for d in k3s.tile_dims(op.total))
        self.code.comment(op, "the value blocks' parts added in block order")
        self.code(f"{out} = tl.zeros([{shape}], dtype=tl.float32)",
                  f"for i_p in {self.loop_range(op)}(0, {blocks}):")
        with self.code.indent():
            self.code(f"{out} += tl.load({address}{f', mask={mask}, other=0.0' if mask else ''})")

    def print_k3s_exit_unless(self, op: k3s.ExitUnlessOp) -> None:
        holds = op.holds.value.data
        self.code.comment(op, "the other chunks are its other launch's")
        self.code(f"if {'not ' if holds else ''}{register(op.check)}:", "    return")

    def print_k3s_record_check(self, op: k3s.RecordCheckOp) -> None:
        address, _ = tensor_address(op)
        self.code.comment(op, "for its steep launch, which then skips the other chunks")
        self.code(f"tl.store({address}, {register(op.check)}.to(tl.float32))")

    def print_k3s_recorded_check(self, op: k3s.RecordedCheckOp) -> None:
        address, _ = tensor_address(op)
        self.code.comment(op)
        self.code(f"{register(op.check)} = tl.load({address}) != 0.0")

    def print_k3s_gate_cumsum(self, op: k3s.GateCumsumOp) -> None:
        self.code.comment(op, "G = cumsum(g) over the chunk, in log2 units (rows past the end add 0)")
        self.code(f"{register(op.cumulative)} = tl.cumsum({register(op.log_gate)} * 1.4426950408889634, axis=0)")

    def print_k3s_block_gates(self, op: k3s.BlockGatesOp) -> None:
        G = register(op.cumulative_gate)
        self.code.comment(op, "a row only ever meets references at or before itself (causal)")
        self.code(
            f"SUB: tl.constexpr = {op.sub_chunk.value.data}",
            "NB: tl.constexpr = BC // SUB",
            "o_b = tl.arange(0, NB)",
            "o_r = tl.arange(0, SUB)",
            "o_blk = o_c // SUB",
            f"{register(op.gate_end)} = tl.sum(tl.where((o_r == SUB - 1)[None, :, None], "
            f"tl.reshape({G}, [NB, SUB, BK]), 0.0), axis=1)",
            f"{register(op.gate_start)} = tl.sum(tl.where((o_b[:, None] == o_b[None, :] + 1)[:, :, None], "
            f"{register(op.gate_end)}[None, :, :], 0.0), axis=1)",
        )

    def print_k3s_block_span_check(self, op: k3s.BlockSpanCheckOp) -> None:
        # G is in log2 units (exp2 of it is the decay): the limit in nats times log2(e)
        self.code.comment(op)
        self.code(f"{register(op.fits)} = tl.max(tl.max({register(op.gate_start)} - {register(op.gate_end)}, axis=1), "
                  f"axis=0) <= {op.limit.value.data * 1.4426950408889634!r}")

    def print_k3s_block_rescale(self, op: k3s.BlockRescaleOp) -> None:
        rows, G, reference = (register(v) for v in (op.rows, op.cumulative_gate, op.reference))
        G3, ref = f"tl.reshape({G}, [NB, SUB, BK])", f"{reference}[:, None, :]"
        exponent = f"{G3} - {ref}" if op.decay.data == "row_over_reference" else f"{ref} - {G3}"
        # a tensor-core operand, kept as _mm takes it: bf16 (half the registers) next to bf16
        # inputs, else fp32 (a diagonal factor spans e^80: never fp16)
        self.code.comment(op)
        self.code(f"{register(op.factor)} = _dot_operand(tl.reshape(tl.reshape({rows}, [NB, SUB, BK]) * "
                  f"tl.exp2({exponent}), [BC, BK]), DOT)")

    def print_gram_factored(self, gram: k3s.GramOp, keep: str) -> None:
        """Blocks below the diagonal: the left and right factors bridged by the decay between the
        references of the two blocks; the diagonal blocks from the diagonal factor or elementwise."""
        c = self.code
        left, right, out = (register(v) for v in (gram.left_factor, gram.right_factor, gram.gram))
        Gstart, Gend = register(gram.gate_start), register(gram.gate_end)
        c(f"{out} = tl.zeros([BC, BC], dtype=tl.float32)",
          "# row block I meets column block I - d through the decay between their references",
          f"for d in {self.loop_range(gram)}(1, NB):")
        with c.indent():
            c(f"b_from = tl.sum(tl.where((o_b[:, None] == o_b[None, :] + d)[:, :, None], {Gend}[None, :, :], 0.0), axis=1)",
              f"b_left = _dot_operand(tl.reshape(tl.reshape({left}, [NB, SUB, BK]) * tl.exp2({Gstart} - b_from)[:, None, :], [BC, BK]), DOT)",
              f"{out} += tl.where((o_blk[:, None] - o_blk[None, :]) == d, _mm(b_left, tl.trans({right}), DOT), 0.0)")
        same = f"(o_blk[:, None] == o_blk[None, :]) & ({keep})"
        diagonal = gram.diagonal.data
        if diagonal == "guarded":
            c(f"if {register(gram.factored_guard)}:")
            with c.indent():
                self.print_diagonal_factored(gram, same)
            c("else:")
            with c.indent():
                self.print_diagonal_elementwise(gram, same)
        elif diagonal == "factored":
            self.print_diagonal_factored(gram, same)
        else:
            self.print_diagonal_elementwise(gram, same)

    def print_diagonal_factored(self, gram: k3s.GramOp, same: str) -> None:
        left, diagonal, out = (register(v) for v in (gram.left_factor, gram.diagonal_factor, gram.gram))
        self.code("# diagonal blocks: the left factor against the diagonal factor",
                  f"{out} += tl.where({same}, _mm({left}, tl.trans({diagonal}), DOT), 0.0)")

    def print_diagonal_elementwise(self, gram: k3s.GramOp, same: str) -> None:
        c = self.code
        lhs, G, out = (register(v) for v in (gram.lhs, gram.cumulative_gate, gram.gram))
        reload = chosen(gram, "diagonal_rows").data == k3s.DiagonalRows.RELOAD
        c("# diagonal blocks elementwise, exp of differences (<= 1 for any gate): column r of every block,",
          *(["# its key row and log-decay reloaded (cache-resident: cheaper than picking a row out of the",
             "# [NB, SUB, BK] tiles) and its G accumulated from the block's reference",
             f"b_Gj = {register(gram.gate_start)}"] if reload else
            ["# its key row and G picked out of the [NB, SUB, BK] tiles in registers"]),
          "for r in range(0, SUB):")
        with c.indent():
            if reload:
                self.print_reloaded_rows(gram)
            else:
                c("b_pick = (o_r == r)[None, :, None]",
                  f"b_kj = tl.sum(tl.where(b_pick, tl.reshape({register(gram.keys)}.to(tl.float32), [NB, SUB, BK]), "
                  "0.0), axis=1)",
                  f"b_Gj = tl.sum(tl.where(b_pick, tl.reshape({G}, [NB, SUB, BK]), 0.0), axis=1)")
            c(f"b_ratio = tl.exp2(tl.minimum(tl.reshape({G}, [NB, SUB, BK]) - b_Gj[:, None, :], 0.0))",
              f"b_col = tl.reshape(tl.sum(tl.reshape({lhs}, [NB, SUB, BK]) * b_kj[:, None, :] * b_ratio, axis=2), [BC])",
              f"{out} += tl.where({same} & ((o_c % SUB) == r)[None, :], b_col[:, None], 0.0)")

    def print_reloaded_rows(self, gram: k3s.GramOp) -> None:
        """b_kj, b_Gj: row r of every block's key row and G, the rows reloaded as the key and gate
        loads that the Gram's operands come from load them, from the tensors the Gram reads: k,
        then g (and the gate's parameters)."""
        load_k = gram.keys.owner
        load_g = gram.cumulative_gate.owner.log_gate.owner
        keys, *gate = gram.tensors
        self.code("t_j = start + o_b * SUB + r", "m_j = t_j < eos")
        self.print_rows(load_k, ("t_j", "m_j"), "b_kj", keys)
        self.print_gate_rows(load_g, ("t_j", "m_j"), "b_gj", gate)
        self.code("b_kj = b_kj.to(tl.float32)", "b_Gj = b_Gj + b_gj * 1.4426950408889634")

    def print_k3s_gram(self, op: k3s.GramOp) -> None:
        c = self.code
        gate = op.gate.data
        lhs, k, out = (register(v) for v in (op.lhs, op.keys, op.gram))
        keep = "o_c[:, None] > o_c[None, :]" if op.mask.data == "strict" else "o_c[:, None] >= o_c[None, :]"
        c.comment(op)
        if gate == "channel":
            self.print_gram_factored(op, keep)
        elif gate == "scalar":
            G = register(op.cumulative_gate)
            c(f"{out} = _mm({lhs}, tl.trans({k}), DOT)",
              f"{out} = {out} * tl.exp2(tl.where({keep}, {G}[:, None] - {G}[None, :], 0.0))")
        else:
            c(f"{out} = _mm({lhs}, tl.trans({k}), DOT)")
        c(f"{out} = tl.where({keep}, {out}, 0.0)")
        if op.row_scale is not None:
            c(f"{out} = {out} * {register(op.row_scale)}[:, None]")

    def print_k3s_forward_substitution(self, op: k3s.ForwardSubstitutionOp) -> None:
        self.code.comment(op, "T = (I + A)^-1 Diag(beta), blocked")
        self.print_unit_lower_inverse(op)
        self.code(f"{register(op.transform)} = b_inverse * {register(op.beta)}[None, :]")

    def print_k3s_unit_lower_inverse(self, op: k3s.UnitLowerInverseOp) -> None:
        self.code.comment(op, "(I + A)^-1, blocked")
        self.print_unit_lower_inverse(op)
        self.code(f"{register(op.inverse)} = b_inverse")

    def print_unit_lower_inverse(self, op: k3s.ForwardSubstitutionOp | k3s.UnitLowerInverseOp) -> None:
        """b_inverse = (I + A)^-1 for A strictly lower triangular: diagonal blocks of op's `block`
        rows solved row by row, the rest by products (op's `squarings`, `accurate` or at DOT)."""
        c = self.code
        sub, A = op.block.value.data, register(op.gram)
        mm = "_mm_accurate" if chosen(op, "accurate").value.data else "_mm"
        if sub == 1:  # unit diagonal blocks (Dinv = I): all of the inverse by the products of step 2
            c("SUB_T: tl.constexpr = 1")
        else:
            self.print_diagonal_block_inverse(sub, A)
        c("# 2. M = Dinv N, N the blocks below the diagonal: M is nilpotent (M^NB = 0), so",
          "#    (I + A)^-1 = (I + M)^-1 Dinv = (I - M)(I + M^2)(I + M^4)... Dinv, exact after log2(NB) factors",
          "b_eye = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)",
          "b_below = (o_c[:, None] // SUB_T) > (o_c[None, :] // SUB_T)",
          f"b_M = tl.where(b_below, {A}, 0.0)" if sub == 1 else f"b_M = {mm}(b_Dinv, tl.where(b_below, {A}, 0.0), DOT)",
          "b_Linv = b_eye - b_M")
        for _ in range(chosen(op, "squarings").value.data):
            c(f"b_M = {mm}(b_M, b_M, DOT)", f"b_Linv = {mm}(b_Linv, b_eye + b_M, DOT)")
        c("b_inverse = " + ("b_Linv" if sub == 1 else f"{mm}(b_Linv, b_Dinv, DOT)"))

    def print_diagonal_block_inverse(self, sub: int, A: str) -> None:
        """b_Dinv: the inverse of I + A's diagonal blocks of `sub` rows, solved row by row."""
        c = self.code
        c(f"# 1. the {sub} x {sub} diagonal blocks of I + A as [NB, SUB, SUB], inverted together: step r",
          "#    solves row r of every block (A is strictly lower: unit diagonal)",
          f"SUB_T: tl.constexpr = {sub}",
          "NB_T: tl.constexpr = BC // SUB_T",
          "o_bt = tl.arange(0, NB_T)",
          "o_rt = tl.arange(0, SUB_T)",
          "b_on_diagonal = (o_bt[:, None, None, None] == o_bt[None, None, :, None])",
          f"b_Ad = tl.sum(tl.where(b_on_diagonal, tl.reshape({A}, [NB_T, SUB_T, NB_T, SUB_T]), 0.0), axis=2)",
          "b_X = tl.zeros([NB_T, SUB_T, SUB_T], dtype=tl.float32)",
          "for r in range(0, SUB_T):")
        with c.indent():
            c("b_a = tl.sum(tl.where((o_rt == r)[None, :, None], b_Ad, 0.0), axis=1)",
              "b_row = tl.where(o_rt[None, :] == r, 1.0, 0.0) - tl.sum(b_a[:, :, None] * b_X, axis=1)",
              "b_X = tl.where((o_rt == r)[None, :, None], b_row[:, None, :], b_X)")
        c("b_Dinv = tl.reshape(tl.where(b_on_diagonal, b_X[:, :, None, :], 0.0), [BC, BC])")

    def print_k3s_wy_apply(self, op: k3s.WYApplyOp) -> None:
        self.code.comment(op)
        rows = register(op.rows)
        if op.cumulative_gate is not None:
            rows = f"{rows} * {self.gamma(op.gate.data, register(op.cumulative_gate))}"
        self.code(f"{register(op.factor)} = _mm({register(op.transform)}, {rows}, DOT)")

    def print_k3s_gate_total(self, op: k3s.GateTotalOp) -> None:
        G = register(op.cumulative_gate)
        self.code.comment(op, "G at the chunk's last row: rows past the end add 0, so the last token's")
        self.code(f"{register(op.total)} = tl.sum(tl.where((o_c == BC - 1)[:, None], {G}, 0.0), axis=0)"
                  if op.gate.data == "channel" else f"{register(op.total)} = tl.sum(tl.where(o_c == BC - 1, {G}, 0.0))")

    def print_k3s_gate_apply(self, op: k3s.GateApplyOp) -> None:
        gate, G = op.gate.data, register(op.cumulative_gate)
        out, rows = register(op.decayed), register(op.rows)
        self.code.comment(op)
        if op.anchor.data == "start":
            self.code(f"{out} = {rows} * {self.gamma(gate, G)}")
            return
        total = register(op.total) + ("[None, :]" if gate == "channel" else "")
        self.code(f"{out} = {rows} * {self.gamma(gate, f'{total} - {G}')}")

    def print_k3s_chunk_decay(self, op: k3s.ChunkDecayOp) -> None:
        self.code.comment(op)
        self.code(f"{register(op.decay)} = tl.exp2({register(op.total)})")

    def print_k3s_spill(self, op: k3s.SpillOp) -> None:
        address, mask = tensor_address(op)
        self.code.comment(op)
        self.code(f"tl.store({address}, {register(op.tile)}.to({tensor_name(op.workspace)}.dtype.element_ty)"
                  f"{f', mask={mask}' if mask else ''})")

    def print_k3s_reload(self, op: k3s.ReloadOp) -> None:
        address, mask = tensor_address(op)
        self.code.comment(op)
        self.code(f"{register(op.tile)} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''})")

    def print_k3s_delta_residual(self, op: k3s.DeltaResidualOp) -> None:
        out, W, S = (register(v) for v in (op.residual, op.keys_factor, op.state))
        if op.values_factor is None:
            self.code.comment(op, "Vr = -W S (no value input)")
            self.code(f"{out} = -_mm({W}, {S}, DOT)")
            return
        self.code.comment(op, "Vr = U - W S")
        self.code(f"{out} = {register(op.values_factor)} - _mm({W}, {S}, DOT)")

    def print_k3s_chunk_output(self, op: k3s.ChunkOutputOp) -> None:
        out, queries, S, P, values = (register(v) for v in (op.output, op.queries, op.state, op.scores, op.values))
        o, scale = tensor_name(op.destination), tensor_name(op.scale)
        address, mask = tensor_address(op, op.destination)
        self.code.comment(op, "O = scale (QG S + P Vr)")
        self.code(
            f"{out} = {scale} * (_mm({queries}, {S}, DOT) + _mm({P}, {values}, DOT))",
            f"tl.store({address}, {out}.to({o}.dtype.element_ty), mask={mask})",
        )

    def print_k3s_state_advance(self, op: k3s.StateAdvanceOp) -> None:
        out, S, keys, values = (register(v) for v in (op.advanced, op.state, op.keys, op.values))
        self.code.comment(op, "S <- Diag(gamma_C) S + KG^T Vr")
        if op.decay is None:
            self.code(f"{out} = {S} + _mm(tl.trans({keys}), {values}, DOT)")
        else:
            decay = register(op.decay) + ("[:, None]" if op.gate.data == "channel" else "")
            self.code(f"{out} = {S} * {decay} + _mm(tl.trans({keys}), {values}, DOT)")

    def print_k3s_store_checkpoint(self, op: k3s.StoreCheckpointOp) -> None:
        c = self.code
        c.comment(op, "the state after a multiple of checkpoint_every tokens")
        # the slot: counted from the sequence's first (varlen: the chunk loop's sequence offsets,
        # when the caller passes them), else from i_n's equal rows of T tokens
        offsets = op.parent_op().offsets
        varlen = "slot = tl.load(checkpoint_base + i_n).to(tl.int64) + done // checkpoint_every - 1"
        equal_rows = "slot = i_n * (T // checkpoint_every) + done // checkpoint_every - 1"
        c("if HAS_CHECKPOINTS:")
        with c.indent():
            c("done = start + BC - bos", "if (done % checkpoint_every == 0) & (start + BC <= eos):")
            with c.indent():
                if offsets is None or (flag := presence_flag(offsets)) is None:
                    c(equal_rows if offsets is None else varlen)
                else:
                    c(f"if {flag}:", f"    {varlen}", "else:", f"    {equal_rows}")
                address, mask = tensor_address(op, "checkpoints", layout="address", tile=op.state)
                c(f"tl.store({address}, {register(op.state)}, mask={mask})")

    def print_k3s_next_chunk(self, op: k3s.NextChunkOp) -> None:
        """The carried values into the loop's registers: nothing to print where a stage updated
        them in place (the state advance, the decay product)."""
        registers = [(register(arg), register(passed))
                     for arg, passed in zip(op.parent_block().args, op.carried, strict=True)]
        moves = [f"{carried} = {passed}" for carried, passed in registers if carried != passed]
        if moves:
            self.code.comment(op)
            self.code(*moves)
