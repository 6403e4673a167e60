"""The token-by-token stages: the state tile kept on chip, the token loop, decay, the delta
rule's correction, the rank-1 update, the readout, the state's store. Where the readout's row is
in the output is its <layout> (lower-to-triton), printed by common.tensor_address."""

from __future__ import annotations

from xdsl.ir import SSAValue

from k3compile.backends.triton.printer.common import (TOKEN_ROW, pipelined_range, presence_flag, register,
                                                      tensor_address, tensor_name)
from k3compile.ir import k3s


class TokenStages:
    """TritonPrinter's methods for tokenstages (one per k3s op, and their helpers)."""

    def print_k3s_state_tile(self, op: k3s.StateTileOp) -> None:
        c = self.code
        c.comment(op, "fp32 state tile [K, BV] kept in registers for the whole sequence")
        c("o_k = tl.arange(0, BK)", "m_k = o_k < K", "m_kv = m_k[:, None] & m_v[None, :]")
        local = "o_k[:, None] * V + o_v[None, :]" if op.layout.data == "kv" else "o_v[None, :] * K + o_k[:, None]"
        S = register(op.state)
        if k3s.in_pool(op):
            state, indices = (tensor_name(t) for t in op.tensors)
            c(f"i_slot = tl.load({indices} + i_n).to(tl.int64)",
              "# a slot outside the pool (-1: padding) reads zeros and is never written; the tests are",
              "# made on vectors (Triton's interpreter rejects masks combined from scalar conditions)",
              "m_slot_k = ((i_slot + 0 * o_k) >= 0) & ((i_slot + 0 * o_k) < NSLOTS)",
              "m_slot_v = ((i_slot + 0 * o_v) >= 0) & ((i_slot + 0 * o_v) < NSLOTS)",
              "m_kv = m_kv & m_slot_v[None, :]",
              f"p_local = {local}",
              "p_state = (i_slot * HV + i_hv) * K * V + p_local",
              f"{S} = tl.load({state} + p_state, mask=m_kv, other=0.0).to(tl.float32)")
            return
        c(f"p_state = i_nh * K * V + {local}", f"{S} = tl.zeros([BK, BV], dtype=tl.float32)")
        if op.start is not None:
            if op.start.data == "identity":  # the columns of a transition M: M = I before any token
                c(f"{S} = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)")
            return
        (initial,) = op.tensors
        load = f"{S} += tl.load({tensor_name(initial)} + p_state, mask=m_kv, other=0.0)"
        if (flag := presence_flag(initial)) is None:
            c(load)
            return
        c(f"if {flag}:")  # initial_state: when the caller passes it
        with c.indent():
            c(load)

    def print_k3s_token_loop(self, op: k3s.TokenLoopOp) -> None:
        self.print_initial_state(op)
        c = self.code
        c.comment(op, "the tokens of sequence i_n, in order")
        self.print_sequence_bounds(op.offsets)
        c(f"for t in {pipelined_range(op, 'bos', 'eos')}:")
        with c.indent():
            self.print_ops(op)

    def print_initial_state(self, loop: k3s.TokenLoopOp | k3s.ChunkLoopOp) -> None:
        """The values the loop's first iteration enters with (a token loop's state; a chunk loop's
        carried values, the state first), into the registers it carries them in."""
        initial = [loop.initial] if isinstance(loop, k3s.TokenLoopOp) else loop.initial
        for carried, start in zip(loop.body.block.args, initial, strict=True):
            if register(carried) != register(start):
                self.code(f"{register(carried)} = {register(start)}")

    def print_sequence_bounds(self, offsets: SSAValue | None) -> None:
        """bos, eos: the token range of sequence i_n (varlen: from the sequence offsets, when the
        caller passes them)."""
        c = self.code
        if offsets is None:
            c("bos = i_n * T", "eos = bos + T")
            return
        name = tensor_name(offsets)
        varlen = [f"bos = tl.load({name} + i_n).to(tl.int64)", f"eos = tl.load({name} + i_n + 1).to(tl.int64)"]
        if (flag := presence_flag(offsets)) is None:
            c(*varlen)
            return
        c(f"if {flag}:")
        with c.indent():
            c(*varlen)
        c("else:")
        with c.indent():
            c("bos = i_n * T", "eos = bos + T")

    def print_k3s_decay(self, op: k3s.DecayOp) -> None:
        out, S, g = (register(v) for v in (op.decayed, op.state, op.log_gate))
        self.code.comment(op, "S <- Diag(exp g_t) S")
        self.code(f"{out} = {S} * tl.exp({g})[:, None]" if op.gate.data == "channel" else f"{out} = {S} * tl.exp({g})")

    def print_k3s_delta_correct(self, op: k3s.DeltaCorrectOp) -> None:
        out, S, k, v, beta = (register(x) for x in (op.update, op.state, op.keys, op.values, op.beta))
        self.code.comment(op, f"u = beta_t (v_t - S^T k_t), kept in {out}")
        self.code(f"{out} = {beta} * ({v} - tl.sum({S} * {k}[:, None], axis=0))")

    def print_k3s_rank1_update(self, op: k3s.Rank1UpdateOp) -> None:
        out, S, k, u = (register(v) for v in (op.updated, op.state, op.keys, op.values))
        self.code.comment(op, "S <- S + k_t u_t^T")
        self.code(f"{out} = {S} + {k}[:, None] * {u}[None, :]")

    def print_k3s_readout(self, op: k3s.ReadoutOp) -> None:
        out, S, q = (register(v) for v in (op.output, op.state, op.queries))
        o, scale = tensor_name(op.destination), tensor_name(op.scale)
        address, mask = tensor_address(op, op.destination, TOKEN_ROW)
        self.code.comment(op, "o_t = S^T (scale q_t)")
        self.code(
            f"{out} = tl.sum({S} * ({scale} * {q})[:, None], axis=0)",
            f"tl.store({address}, {out}.to({o}.dtype.element_ty), mask={mask})",
        )

    def print_k3s_next_token(self, op: k3s.NextTokenOp) -> None:
        """Nothing to print: the state a token leaves is already in the loop's state register."""

    def print_k3s_store_state(self, op: k3s.StoreStateOp) -> None:
        self.code.comment(op)
        S = register(op.state)
        if k3s.in_pool(op):
            state = tensor_name(op.tensors[0])  # the slot table (i_slot) was read by the state tile
            self.code(f"tl.store({state} + p_state, {S}.to({state}.dtype.element_ty), mask=m_kv)")
            if op.next_op is not None:  # later stages go on from the state as the pool now holds it
                self.code(f"{S} = {S}.to({state}.dtype.element_ty).to(tl.float32)")
            return
        (target,) = op.tensors
        store = f"tl.store({tensor_name(target)} + p_state, {S}, mask=m_kv)"
        if (flag := presence_flag(target)) is None:  # a segment's N or M: always written
            self.code(store)
            return
        self.code(f"if {flag}:")  # final_state: when the caller asked for it
        with self.code.indent():
            self.code(store)
