"""The chunkwise (WY/UT) schedule's stages, as ops on tile values: the chunk tile, loads, spills and
reloads, the value blocks' parts, the triangular solve, the WY factors, the output and the state
update. The regions and loops that hold them are in chunk_loops.py, the gate and Gram stages in
gram.py."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, Float32Type, FloatAttr, IntegerAttr, i1
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, MemoryReadEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import GATE_INPUTS_WITH_PARAMETERS
from k3compile.ir.k3 import BetaInputAttr, GateAttr, GateInputAttr, StateLayoutAttr
from k3compile.ir.k3s.chunk_loops import (
    CHUNK_LOCAL_PARENTS,
    SCAN_PARENTS,
    ChunkLoopOp,
    ChunkScanOp,
    ValueBlockLoopOp,
)
from k3compile.ir.k3s.kernels import ChunkTableInterface, KernelOp, RuntimeSizesInterface, WhenOp, WritesCheckpoints
from k3compile.ir.k3s.target import RegisterDtypeAttr, TensorLayoutAttr, verify_layout
from k3compile.ir.k3s.types import GATED, TensorType, TileType, dims_text, tile_dims
from k3compile.ir.k3s.token import TokenLoopOp, _no_l2norm_of_values
from k3compile.ir.syntax import KeywordSyntax

# --- stages of the chunkwise (WY/UT) schedule ----------------------------------------------
# A chunk is C consecutive tokens of one sequence and value head. The stages are ops on tile
# values: what each reads are its operands, what it makes its result. The cumulative log-gate G
# ([C, K] or [C]; Gamma = exp G), the gated key Gram A, the UT transform T, the WY factors W and
# U, the query Gram P, the decayed queries and keys QG and KG, the chunk's decay gamma_C; in the
# scan, the carried state S ([K, V], a block argument of the scan's region), the residual values
# vr the state update uses and the output o.


def workspace_name(value: str) -> str:
    """The workspace tensor a spilled value lives in (the entry's argument fuse-chunkwise declares
    for it): the value's own name, except T (every kernel's token count is T)."""
    return "T_ut" if value == "T" else value


def value_block_parts_layout(workspace: TensorType, part_dims: tuple[str, ...]) -> int:
    """The number of value blocks (NVB) of a workspace of value blocks' parts: [B, T, HV, NVB, ...]
    for a part of C rows (per token, the part's other dimensions after NVB), [NC, HV, NVB, ...]
    for a part without rows (per chunk); a VerifyException where it is not that layout in fp32."""
    dims = workspace.dims
    per_token = part_dims[:1] == ("C",)
    lead = ("B", "T") if per_token else ("NC",)
    columns = part_dims[1:] if per_token else part_dims
    if (workspace.dtype_class != "float32" or len(dims) != len(lead) + 2 + len(columns) or dims[:len(lead)] != lead
            or not isinstance(dims[len(lead) + 1], int)):
        shape = " x ".join([*lead, "HV", "NVB", *columns])
        raise VerifyException(f"the workspace of a <{' x '.join(part_dims)}> tile's value-block parts is <{shape}, "
                              f"float32>, NVB the number of value blocks; got <{' x '.join(map(str, dims))}, "
                              f"{workspace.dtype_class}>")
    return dims[len(lead) + 1]


@irdl_op_definition
class SpillValueBlockPartOp(KeywordSyntax):
    """`k3s.spill_value_block_part %KG_bar_parts, %KG_bar`: this program's part of a sum over the
    value blocks (the result of a k3s.value_block_loop in a kernel whose grid has a value_block
    axis, where each program runs one block) to its block's slot of an fp32 workspace of parts:
    [B, T, HV, NVB, ...] for a tile of C rows, [NC, HV, NVB, ...] for a per-chunk one. A later
    kernel adds the NVB slots (k3s.sum_value_block_parts)."""

    name = "k3s.spill_value_block_part"
    workspace = operand_def(TensorType)
    part = operand_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        try:
            value_block_parts_layout(self.workspace.type, tuple(d.data for d in self.part.type.dims.data))
        except VerifyException as error:
            raise VerifyException(f"{self.name}: {error}") from None
        verify_layout(self, self.workspace)


@irdl_op_definition
class SumValueBlockPartsOp(KeywordSyntax):
    """`%KG_bar = k3s.sum_value_block_parts %KG_bar_parts`: the sum over the value blocks of the
    parts that an earlier kernel spilled (k3s.spill_value_block_part), added in block order (as a
    k3s.value_block_loop adds them)."""

    name = "k3s.sum_value_block_parts"
    workspace = operand_def(TensorType)
    unroll = opt_prop_def(BoolAttr)  # the Triton backend's (lower-to-triton)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    total = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        try:
            value_block_parts_layout(self.workspace.type, tuple(d.data for d in self.total.type.dims.data))
        except VerifyException as error:
            raise VerifyException(f"{self.name}: {error}") from None
        verify_layout(self, self.workspace)


@irdl_op_definition
class ExitUnlessOp(KeywordSyntax):
    """The program stops here unless `check` (a k3s.block_span_check) is `holds`: a launch whose
    guarded forms are one form (their guard its k3s.flag) runs only the chunks that form is for;
    the kernel's other launch, the other form, runs the rest."""

    name = "k3s.exit_unless"
    holds = prop_def(BoolAttr)
    check = operand_def(i1)
    traits = traits_def(HasParent(KernelOp, WhenOp))


@irdl_op_definition
class RecordCheckOp(KeywordSyntax):
    """`k3s.record_check %steep_chunks, %factorable`: store the chunk's check (a
    k3s.block_span_check) to a per-chunk workspace, so that the launch of the other form reads
    one number instead of recomputing the gates to decide (its programs mostly exit)."""

    name = "k3s.record_check"
    workspace = operand_def(TensorType)
    check = operand_def(i1)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(KernelOp, WhenOp))

    def verify_(self) -> None:
        verify_layout(self, self.workspace)


@irdl_op_definition
class RecordedCheckOp(KeywordSyntax):
    """`%factorable = k3s.recorded_check %steep_chunks`: the check an earlier launch recorded for
    this program's chunk (k3s.record_check)."""

    name = "k3s.recorded_check"
    workspace = operand_def(TensorType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    check = result_def(i1)
    traits = traits_def(HasParent(KernelOp, WhenOp), MemoryReadEffect())

    def verify_(self) -> None:
        verify_layout(self, self.workspace)


@irdl_op_definition
class ChunkTileOp(KeywordSyntax, RuntimeSizesInterface, ChunkTableInterface):
    """In a kernel over chunks: the token rows of this program's chunk (C rows, the last
    chunk of a sequence masked) and the key/value ranges. Its operand, when the entry has them,
    is the sequence offsets (`k3s.chunk_tile %cu_seqlens`: with them passed, a chunk's sequence
    and end come from them); without it the sequences are the B rows of T tokens."""

    name = "k3s.chunk_tile"
    chunk_size = prop_def(IntegerAttr[I64])
    head_k_dim = prop_def(IntegerAttr[I64])
    head_v_dim = prop_def(IntegerAttr[I64])
    offsets = opt_operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("T",)  # its chunk's rows end at its sequence's last token

    def reads_chunk_table(self) -> bool:
        """With sequence offsets a chunk axis's chunk is the table's row; without, of equal rows."""
        return self.offsets is not None


@irdl_op_definition
class LoadChunkOp(KeywordSyntax):
    """Load the chunk's rows of its operand (`k3s.load_chunk %q`: q, k or v), in the input
    dtype: K key channels of q/k head i_h (`!k3s.tile<C x K>`) or the program's value columns of
    value head i_hv (`<C x V>`, v); key rows optionally L2-normalised per row."""

    name = "k3s.load_chunk"
    tensor = operand_def(TensorType)
    l2norm = opt_prop_def(BoolAttr)  # absent: false
    dtype = opt_prop_def(RegisterDtypeAttr)  # the Triton backend's (lower-to-triton)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    rows = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        _no_l2norm_of_values(self)
        verify_layout(self, self.tensor)


@irdl_op_definition
class LoadGateOp(KeywordSyntax):
    """Load the gate g (its operand) as a log-decay into registers (per token, or a chunk's rows;
    rows past the end read 0). input log: g as given; clamped: max(g, lower_bound); softplus:
    -exp(A_log) softplus(g + dt_bias); bounded: lower_bound sigmoid(exp(A_log) (g + dt_bias)).
    The two forms that read A_log and dt_bias take them as operands after g: `k3s.load_gate %g,
    %A_log, %dt_bias`. With a floor, the form's result is raised to it: a log-decay whose decay is
    zero in fp32 anyway (ir/choices.py ZERO_DECAY_FLOOR), kept small enough for the chunk's
    cumulative sums; its cotangent is zero below the floor (as the decay's derivative is)."""

    name = "k3s.load_gate"
    gate = prop_def(GATED)
    input = prop_def(GateInputAttr)
    lower_bound = prop_def(FloatAttr)
    floor = opt_prop_def(FloatAttr)  # absent: the form cannot go below ZERO_DECAY_FLOOR
    tensor = operand_def(TensorType)  # g
    parameters = var_operand_def(TensorType)  # A_log, dt_bias: with input softplus or bounded
    log_gate = result_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(TokenLoopOp, *CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        verify_layout(self, self.tensor)
        if self.lower_bound.value.data >= 0:
            raise VerifyException(f"{self.name}: lower_bound must be < 0, got {self.lower_bound.value.data}")
        if self.floor is not None and self.floor.value.data >= 0:
            raise VerifyException(f"{self.name}: floor must be < 0, got {self.floor.value.data}")
        expected = 2 if self.input.data in GATE_INPUTS_WITH_PARAMETERS else 0
        if len(self.parameters) != expected:
            raise VerifyException(f"{self.name}: input {self.input.data} reads {expected} gate parameters "
                                  f"(A_log, dt_bias) after g, got {len(self.parameters)}")


@irdl_op_definition
class LoadBetaOp(KeywordSyntax):
    """Load beta (its operand, `k3s.load_beta %beta`) into registers: as given (probability),
    sigmoid(beta) (logits) or 2 sigmoid(beta) (logits_neg_eigval)."""

    name = "k3s.load_beta"
    input = prop_def(BetaInputAttr)
    tensor = operand_def(TensorType)
    beta = result_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(TokenLoopOp, *CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        verify_layout(self, self.tensor)


@irdl_op_definition
class StoreCheckpointOp(KeywordSyntax):
    """After a chunk: if the tokens done so far are a multiple of checkpoint_every, write the
    state to its checkpoint slot. `address` (the Triton backend's, lower-to-triton) is where the
    program's state tile goes in the checkpoints: `#k3s.layout<checkpoint[NCK], head[HV],
    column[K], column[V]>`, the slot's row, the value head, then the state's columns in its
    `layout` (vk: column[V], column[K])."""

    name = "k3s.store_checkpoint"
    layout = prop_def(StateLayoutAttr)
    address = opt_prop_def(TensorLayoutAttr)
    state = operand_def(TileType)
    traits = traits_def(HasParent(ChunkLoopOp), WritesCheckpoints())

    def verify_(self) -> None:
        if self.address is not None:
            expected = checkpoint_address(self.layout.data, tile_dims(self.state))
            if self.address != expected:
                raise VerifyException(f"{self.name}: address {self.address} does not fit its "
                                      f"{dims_text(tile_dims(self.state))} state in layout {self.layout.data}, expected "
                                      f"{expected}")


def checkpoint_address(layout: str, state: tuple[str, ...]) -> TensorLayoutAttr:
    """Where a state tile of these dimensions goes in the checkpoints: the slot's row, the value
    head, then the state's columns, transposed for the vk layout."""
    columns = state if layout == "kv" else tuple(reversed(state))
    return TensorLayoutAttr.of(("checkpoint", "NCK"), ("head", "HV"), *[("column", d) for d in columns])


@irdl_op_definition
class SpillOp(KeywordSyntax):
    """`k3s.spill %W, %W_1`: store a chunk-local value (the tile) to a workspace tensor of the
    entry (its first operand), for a later kernel."""

    name = "k3s.spill"
    workspace = operand_def(TensorType)
    tile = operand_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(KernelOp, WhenOp, ChunkLoopOp))

    def verify_(self) -> None:
        verify_layout(self, self.workspace)


@irdl_op_definition
class ReloadOp(KeywordSyntax):
    """`%W_1 = k3s.reload %W`: load a chunk-local value an earlier kernel spilled to a workspace
    tensor of the entry (its operand)."""

    name = "k3s.reload"
    workspace = operand_def(TensorType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    tile = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, ChunkLoopOp, ValueBlockLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        verify_layout(self, self.workspace)


@irdl_op_definition
class ForwardSubstitutionOp(KeywordSyntax):
    """T = (I + A)^{-1} Diag(beta), A lower triangular. The diagonal blocks of `block` rows
    are solved row by row (all blocks at once), the rest by log2(blocks) products."""

    name = "k3s.forward_substitution"
    block = prop_def(IntegerAttr[I64])
    accurate = opt_prop_def(BoolAttr)  # products at least tf32 (the Triton backend's, as squarings)
    squarings = opt_prop_def(IntegerAttr[I64])  # (I + M^2^i) factors after I - M: log2(C / block) - 1
    gram = operand_def(TileType)
    beta = operand_def(TileType)
    transform = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


@irdl_op_definition
class WYApplyOp(KeywordSyntax):
    """A WY factor: T (Gamma * X) with X the keys and G given (W), or T X (U = T V)."""

    name = "k3s.wy_apply"
    gate = prop_def(GateAttr)
    transform = operand_def(TileType)
    rows = operand_def(TileType)
    cumulative_gate = opt_operand_def(TileType)
    factor = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        if (self.cumulative_gate is None) != (self.gate.data == "none"):
            raise VerifyException(f"{self.name}: G is an operand exactly when gate is not none")


@irdl_op_definition
class DeltaResidualOp(KeywordSyntax):
    """vr = U - W S: the values the delta rule actually writes, given the carried state. Without
    U the value input is zero (vr = -W S): the columns of a segment's transition M."""

    name = "k3s.delta_residual"
    state = operand_def(TileType)
    keys_factor = operand_def(TileType)
    values_factor = opt_operand_def(TileType)
    residual = result_def(TileType)
    traits = traits_def(HasParent(*SCAN_PARENTS), Pure())


@irdl_op_definition
class ChunkOutputOp(KeywordSyntax):
    """o = scale (Q' S + P V'), stored to the output tensor: Q' the queries as read across chunks
    (QG, or Q without a gate), V' the values the state takes (vr with the delta rule, else V).
    `k3s.chunk_output %QG, %S, %P, %vr, %o, %scale`."""

    name = "k3s.chunk_output"
    queries = operand_def(TileType)
    state = operand_def(TileType)
    scores = operand_def(TileType)
    values = operand_def(TileType)
    destination = operand_def(TensorType)  # o
    scale = operand_def(Float32Type)
    output = result_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(*SCAN_PARENTS))

    def verify_(self) -> None:
        verify_layout(self, self.destination)


@irdl_op_definition
class StateAdvanceOp(KeywordSyntax):
    """S' = Diag(gamma_C) S + K'^T V' (K' = KG with a gate, K without; no decay without a gate)."""

    name = "k3s.state_advance"
    gate = prop_def(GateAttr)
    state = operand_def(TileType)
    keys = operand_def(TileType)
    values = operand_def(TileType)
    decay = opt_operand_def(TileType)
    advanced = result_def(TileType)
    traits = traits_def(HasParent(*SCAN_PARENTS), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # the state is updated where it is held

    def verify_(self) -> None:
        if (self.decay is None) != (self.gate.data == "none"):
            raise VerifyException(f"{self.name}: gamma_C is an operand exactly when gate is not none")


@irdl_op_definition
class CacheUpdateOp(KeywordSyntax):
    """`k3s.cache_update %cache, %k, %u, %g`: cache the token's k, its gate and the update u it
    wrote (u = beta (v - S^T k) with the delta rule, v without) in the entry's cache: what a replay
    needs instead of the state itself. In a chunk (the chunked verify) it caches every row of the
    chunk, u the rows of vr = U - W S (the delta rule) or of v."""

    name = "k3s.cache_update"
    gate = prop_def(GateAttr)
    cache = operand_def(TensorType)  # the entry's cache it writes (spec_step's verify: next_cache)
    # k, u (per token: beta (v - S^T k) or v; per chunk: vr or v) and, with a gate, the log-gate g
    rows = var_operand_def(TileType)
    # a token loop's (token.py, which this module builds on) or a chunk scan's
    traits = traits_def(HasParent(TokenLoopOp, ChunkScanOp, ChunkLoopOp))


CHUNK_STAGES = [
    SpillValueBlockPartOp,
    SumValueBlockPartsOp,
    ExitUnlessOp,
    RecordCheckOp,
    RecordedCheckOp,
    ChunkTileOp,
    LoadChunkOp,
    LoadGateOp,
    LoadBetaOp,
    StoreCheckpointOp,
    SpillOp,
    ReloadOp,
    ForwardSubstitutionOp,
    WYApplyOp,
    DeltaResidualOp,
    ChunkOutputOp,
    StateAdvanceOp,
]
