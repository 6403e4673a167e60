"""The speculative-decoding stages: the verify cache, the snapshot baseline, the replay."""

from __future__ import annotations

from k3compile.backends.triton.printer.common import pipelined_range, register, tensor_name
from k3compile.ir import k3s


class Serving:
    """TritonPrinter's methods for serving (one per k3s op, and their helpers)."""

    def print_k3s_cache_update(self, op: k3s.CacheUpdateOp) -> None:
        c = self.code
        cache = tensor_name(op.cache)
        c.comment(op, "what a replay needs: k, the log-decay and the update u this token wrote")
        if isinstance(op.parent_op(), k3s.ChunkLoopOp):
            self.print_chunk_cache_update(op, cache)
            return
        k, u, *g = (register(v) for v in op.rows)
        g = {"channel": lambda: g[0], "scalar": lambda: f"{g[0]} + 0.0 * {k}", "none": lambda: f"0.0 * {k}"}[op.gate.data]()
        c("p_cache = ((i_slot * DEPTH + (t - bos)) * HV + i_hv) * (2 * K + V)",
          "# k and g are the same for every value block: the first one writes them",
          "m_cache_k = m_k & m_slot_k & ((i_v + 0 * o_k) == 0)",
          f"tl.store({cache} + p_cache + o_k, {k}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache + K + o_k, {g}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache + 2 * K + o_v, {u}, mask=m_v & m_slot_v)")

    def print_chunk_cache_update(self, op: k3s.CacheUpdateOp, cache: str) -> None:
        """The chunked verify's cache: every row of the chunk, u the row of Vr (or v)."""
        c = self.code
        k, u, *g = (register(v) for v in op.rows)
        g = {"channel": lambda: g[0], "scalar": lambda: f"{g[0]}[:, None] + 0.0 * {k}",
             "none": lambda: f"0.0 * {k}"}[op.gate.data]()
        c("p_cache = ((i_slot * DEPTH + (t_c - bos)) * HV + i_hv) * (2 * K + V)",
          "# k and g are the same for every value block: the first one writes them",
          "m_cache_k = m_c[:, None] & (m_k & m_slot_k & ((i_v + 0 * o_k) == 0))[None, :]",
          f"tl.store({cache} + p_cache[:, None] + o_k[None, :], {k}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache[:, None] + K + o_k[None, :], {g}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache[:, None] + 2 * K + o_v[None, :], {u}, mask=m_c[:, None] & (m_v & m_slot_v)[None, :])")

    def print_k3s_snapshot_state(self, op: k3s.SnapshotStateOp) -> None:
        self.code.comment(op, "the whole state after this token")
        snapshots = tensor_name(op.snapshots)
        self.code(f"tl.store({snapshots} + ((i_slot * DEPTH + (t - bos)) * HV + i_hv) * K * V + p_local, "
                  f"{register(op.state)}, mask=m_kv)")

    def print_k3s_restore_snapshot(self, op: k3s.RestoreSnapshotOp) -> None:
        c = self.code
        snapshots = tensor_name(op.snapshots)
        c.comment(op, "the snapshot after the last accepted token")
        c(f"n_accepted = tl.minimum(tl.maximum(tl.load({tensor_name(op.accepted)} + i_n).to(tl.int64), 0), DEPTH)",
          "if n_accepted > 0:")
        with c.indent():
            c(f"{register(op.restored)} = tl.load({snapshots} + ((i_slot * DEPTH + n_accepted - 1) * HV + i_hv) * K * V + p_local, "
              "mask=m_kv, other=0.0)")

    def print_k3s_replay(self, op: k3s.ReplayOp) -> None:
        c = self.code
        cache = tensor_name(op.cache)
        c.comment(op, "the closed form's sum, accumulated token by token: S <- Diag(exp g_j) S + k_j u_j^T")
        c("# counts outside 0..DEPTH are clamped: the cache holds no more tokens; a slot outside the",
          "# pool reads nothing",
          f"n_accepted = tl.minimum(tl.maximum(tl.load({tensor_name(op.accepted)} + i_n).to(tl.int64), 0), DEPTH)",
          f"for j in {pipelined_range(op, '0', 'n_accepted')}:")
        with c.indent():
            c("p_cache = ((i_slot * DEPTH + j) * HV + i_hv) * (2 * K + V)",
              f"b_k = tl.load({cache} + p_cache + o_k, mask=m_k & m_slot_k, other=0.0)",
              f"b_u = tl.load({cache} + p_cache + 2 * K + o_v, mask=m_v & m_slot_v, other=0.0)")
            S = register(op.replayed)
            if op.gate.data != "none":
                c(f"b_g = tl.load({cache} + p_cache + K + o_k, mask=m_k & m_slot_k, other=0.0)",
                  f"{S} = {S} * tl.exp(b_g)[:, None]")
            c(f"{S} = {S} + b_k[:, None] * b_u[None, :]")
