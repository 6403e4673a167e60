"""The recurrent (token-by-token) schedule's stages: the state tile, the token loop and its
stages, and speculative decoding's snapshot and replay (its verify cache, k3s.cache_update, which
a chunk loop holds too, is in chunk.py: this module imports nothing of the chunk's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import I64, BoolAttr, Float32Type, IntegerAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, IsTerminator, NoTerminator, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3 import GateAttr, StateLayoutAttr
from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface, WhenOp
from k3compile.ir.k3s.target import RegisterDtypeAttr, TensorLayoutAttr, kernel_key_heads, verify_layout
from k3compile.ir.k3s.types import GATED, TensorType, TileType, is_power_of_two
from k3compile.ir.syntax import KeywordSyntax

# --- stages of the recurrent (token-by-token) schedule -------------------------------------


class StateHome(Word):
    POOL = "pool"


@irdl_attr_definition
class StateHomeAttr(EnumAttribute[StateHome], SpacedOpaqueSyntaxAttribute):
    name = "k3s.state_home"


class StateStart(Word):
    ZERO = "zero"
    IDENTITY = "identity"


@irdl_attr_definition
class StateStartAttr(EnumAttribute[StateStart], SpacedOpaqueSyntaxAttribute):
    name = "k3s.state_start"


@irdl_op_definition
class StateTileOp(KeywordSyntax, RuntimeSizesInterface):
    """`%S = k3s.state_tile ...`: a [K, V-block] fp32 state tile kept on chip, its result the state
    the kernel's first stage starts from. Its home, its operands: the initial state
    (`k3s.state_tile %initial_state`: read when the caller passes it, an optional argument; else
    zero) or, home = pool, a pool row `state[state_indices[n]]` (`k3s.state_tile %state,
    %state_indices`: serving, a slot table over a state pool; a slot outside the pool, e.g. -1
    for padding, starts from zero and is never written). `start` instead fixes where it starts,
    reading nothing: zero, or identity (a square K x K tile: the columns of a segment's
    transition M, head_v_dim = head_k_dim)."""

    name = "k3s.state_tile"
    head_k_dim = prop_def(IntegerAttr[I64])
    head_v_dim = prop_def(IntegerAttr[I64])
    block_v = prop_def(IntegerAttr[I64])
    layout = prop_def(StateLayoutAttr)
    home = opt_prop_def(StateHomeAttr)  # absent: the initial state
    start = opt_prop_def(StateStartAttr)  # absent: the home's state
    tensors = var_operand_def(TensorType)  # the home: initial state, or pool and slot table; none with a start
    state = result_def(TileType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        if self.start is not None and self.home is not None:
            raise VerifyException(f"{self.name}: start and home exclude each other")
        if self.start is not None:
            expected, reads = 0, "a start reads no tensor"
        elif in_pool(self):
            expected, reads = 2, "home = pool reads the pool and its slot table"
        else:
            expected, reads = 1, "without a start or home it reads the initial state"
        if len(self.tensors) != expected:
            raise VerifyException(f"{self.name}: {reads}; got {len(self.tensors)} tensor operands")
        if self.start is not None:
            if self.start.data == "identity" and self.head_v_dim.value.data != self.head_k_dim.value.data:
                raise VerifyException(f"{self.name}: an identity start needs a square tile, got K = "
                                      f"{self.head_k_dim.value.data}, V = {self.head_v_dim.value.data}")
        if not is_power_of_two(self.block_v.value.data):
            raise VerifyException(f"{self.name}: block_v must be a power of two, got {self.block_v.value.data}")
        if self.tensors and isinstance(heads := self.tensors[0].type.dims[-3], int) and \
                (key_heads := kernel_key_heads(self)) is not None and key_heads > 0 and heads % key_heads:
            raise VerifyException(f"{self.name}: its kernel's key_heads = {key_heads} does not divide the {heads} "
                                  f"value heads of %{self.tensors[0].name_hint}")

    def runtime_sizes(self) -> tuple[str, ...]:
        """A pool row's tile reads the pool's row count (its slots beyond it start from zero)."""
        return ("NSLOTS",) if in_pool(self) else ()


@irdl_op_definition
class SpeculativeOp(KeywordSyntax):
    """Speculative decoding without state snapshots: a verify pass over `draft_tokens` tokens
    (a token loop that also caches each token's k, gate and update u), then a replay that
    rebuilds the state after any accepted prefix from the committed state and the cache. The
    committed state is its block's argument, what both start from.
    Lowerings run the two apart (verify, then commit) or fused, replay first: one launch that
    commits the previous round's accepted tokens and verifies the next round."""

    name = "k3s.speculative"
    draft_tokens = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        if self.draft_tokens.value.data <= 0:
            raise VerifyException(f"{self.name}: draft_tokens must be positive, got {self.draft_tokens.value.data}")
        if len(self.body.block.args) != 1:
            raise VerifyException(f"{self.name}: its block takes one argument, the committed state; got "
                                  f"{len(self.body.block.args)}")


@irdl_op_definition
class TokenLoopOp(KeywordSyntax, RuntimeSizesInterface):
    """`%S_final = k3s.token_loop %S, %cu_seqlens { ^bb0(%S_in): ... k3s.next_token %S_next }`:
    sequential loop over the tokens of one sequence, carrying the kernel's state tile as scf.for
    carries its iter_args: it enters the first token as the first operand, each token starts
    from the block argument and passes the state on by `next_token`; the result is the state
    after the last token. The second operand, when the entry has them, is the sequence offsets
    (varlen when the caller passes them); without it the sequences are the B rows of T tokens."""

    name = "k3s.token_loop"
    initial = operand_def(TileType)
    offsets = opt_operand_def(TensorType)
    body = region_def("single_block")
    final = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, SpeculativeOp))

    def verify_(self) -> None:
        verify_carried_values(self, [self.initial], [self.final])

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("T",)  # its sequences' tokens


@irdl_op_definition
class NextTokenOp(KeywordSyntax):
    """The state the next token enters with (the token loop's carried value)."""

    name = "k3s.next_token"
    state = operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(TokenLoopOp))


@irdl_op_definition
class SnapshotStateOp(KeywordSyntax):
    """The snapshot baseline of speculative decoding (what engines do today): write the whole
    state after every verified token to the slot's row of the entry's snapshot buffer
    (`k3s.snapshot_state %snapshots, %S_2`)."""

    name = "k3s.snapshot_state"
    snapshots = operand_def(TensorType)
    state = operand_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp))


@irdl_op_definition
class RestoreSnapshotOp(KeywordSyntax):
    """The snapshot baseline's commit: the state after `accepted` tokens is the snapshot taken
    after token `accepted` (none accepted: the committed state stays). Operands: the committed
    state, the entry's snapshot buffer and its accepted counts (`%S_1 = k3s.restore_snapshot
    %S, %snapshots, %accepted`)."""

    name = "k3s.restore_snapshot"
    state = operand_def(TileType)
    snapshots = operand_def(TensorType)
    accepted = operand_def(TensorType)
    restored = result_def(TileType)
    traits = traits_def(HasParent(KernelOp))
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # the state is restored where it is held


@irdl_op_definition
class ReplayOp(KeywordSyntax):
    """S_m = Diag(Gamma_m) S_0 + sum_{j<=m} Diag(Gamma_m / Gamma_j) k_j u_j^T from the cache
    (Gamma_j the product of the first j decays; all ones without a gate): no serial dependency.
    `%S_m = k3s.replay %S_0, %cache, %accepted`: the committed state, the cache it reads and the
    accepted count m of each sequence."""

    name = "k3s.replay"
    gate = prop_def(GateAttr)
    state = operand_def(TileType)
    cache = operand_def(TensorType)
    accepted = operand_def(TensorType)
    replayed = result_def(TileType)
    traits = traits_def(HasParent(SpeculativeOp, KernelOp))
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # the state is replayed where it is held


@irdl_op_definition
class LoadTokenOp(KeywordSyntax):
    """Load one token's row of its operand (`k3s.load_token %q`: q, k or v) into fp32
    registers: a row of K key channels of q/k head i_h (`!k3s.tile<K>`) or the program's value
    columns of value head i_hv (`<V>`, v); a key row optionally L2-normalised: x / sqrt(|x|^2 +
    1e-6)."""

    name = "k3s.load_token"
    tensor = operand_def(TensorType)
    l2norm = opt_prop_def(BoolAttr)  # absent: false
    dtype = opt_prop_def(RegisterDtypeAttr)  # the Triton backend's (lower-to-triton)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    row = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp))

    def verify_(self) -> None:
        _no_l2norm_of_values(self)
        verify_layout(self, self.tensor)


def normalises(op) -> bool:
    """Whether a load_token / load_chunk L2-normalises what it loads."""
    return op.l2norm is not None and bool(op.l2norm.value.data)


def loads_values(op) -> bool:
    """Whether a load_token / load_chunk loads value columns (v) rather than key channels (q, k)."""
    dims = op.results[0].type.dims.data
    return bool(dims) and dims[-1].data == "V"


def _no_l2norm_of_values(op) -> None:
    if loads_values(op) and normalises(op):
        raise VerifyException(f"{op.name}: l2norm applies to q and k only (rows of key channels), not to values")


@irdl_op_definition
class DecayOp(KeywordSyntax):
    """S <- Diag(exp g_t) S, g (from load_gate) a log-decay per key channel or per head."""

    name = "k3s.decay"
    gate = prop_def(GATED)
    state = operand_def(TileType)
    log_gate = operand_def(TileType)
    decayed = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # the state is updated where it is held


@irdl_op_definition
class DeltaCorrectOp(KeywordSyntax):
    """The delta rule's correction: u = beta_t (v_t - S^T k_t), the values the update writes."""

    name = "k3s.delta_correct"
    state = operand_def(TileType)
    keys = operand_def(TileType)
    values = operand_def(TileType)
    beta = operand_def(TileType)
    update = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 2}  # u takes v's place: the token's v is not read after it


@irdl_op_definition
class Rank1UpdateOp(KeywordSyntax):
    """S' = S + k_t u_t^T (u = v without the delta rule)."""

    name = "k3s.rank1_update"
    state = operand_def(TileType)
    keys = operand_def(TileType)
    values = operand_def(TileType)
    updated = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp), Pure())
    IN_PLACE: ClassVar[dict[int, int]] = {0: 0}  # the state is updated where it is held


@irdl_op_definition
class ReadoutOp(KeywordSyntax):
    """o_t = S^T (scale q_t), read after the update, stored to the output tensor (in its dtype):
    `k3s.readout %S, %q, %o, %scale`."""

    name = "k3s.readout"
    state = operand_def(TileType)
    queries = operand_def(TileType)
    destination = operand_def(TensorType)  # o
    scale = operand_def(Float32Type)
    output = result_def(TileType)
    layout = opt_prop_def(TensorLayoutAttr)  # the Triton backend's (lower-to-triton): where its rows are
    traits = traits_def(HasParent(TokenLoopOp))

    def verify_(self) -> None:
        verify_layout(self, self.destination)


@irdl_op_definition
class StoreStateOp(KeywordSyntax):
    """Write a state (its first operand) to the tensor after it (`k3s.store_state %S_final,
    %final_state`: when the caller asked for it, an optional output; or a segment's N or M,
    always) or, home = pool, back to its pool row in place (`k3s.store_state %S_final, %state,
    %state_indices`)."""

    name = "k3s.store_state"
    layout = prop_def(StateLayoutAttr)
    home = opt_prop_def(StateHomeAttr)  # absent: the tensor it writes
    state = operand_def(TileType)
    tensors = var_operand_def(TensorType)  # the tensor it writes, or the pool and its slot table
    traits = traits_def(HasParent(KernelOp, WhenOp))  # under a when: a kernel sharing code writes elsewhere

    def verify_(self) -> None:
        expected, writes = (2, "home = pool writes the pool through its slot table") if in_pool(self) else (
            1, "without a home it writes one tensor")
        if len(self.tensors) != expected:
            raise VerifyException(f"{self.name}: {writes}; got {len(self.tensors)} tensor operands")


def verify_carried_values(loop: IRDLOperation, initial: Sequence[SSAValue], final: Sequence[SSAValue]) -> None:
    """A loop's carried values, as scf.for's iter_args: at least one (the state), each with an
    initial value (`initial`, its operands), a block argument, a value passed on (its
    terminator's operand) and a result (`final`), all four of one type."""
    block, terminator = loop.body.block, loop.body.block.last_op
    passed_on = terminator.operands if terminator is not None and terminator.has_trait(IsTerminator) else None
    carried = {"initial values": initial, "block arguments": block.args,
               **({"values passed on": passed_on} if passed_on is not None else {}), "results": final}
    types = {what: [value.type for value in values] for what, values in carried.items()}
    if not initial or any(kinds != types["initial values"] for kinds in types.values()):
        got = "; ".join(f"{what} ({', '.join(map(str, kinds))})" for what, kinds in types.items())
        raise VerifyException(f"{loop.name}: it carries one or more values (its state first), each an initial value, "
                              f"a block argument, a value passed on and a result of one type (scf.for's iter_args); "
                              f"got {got}")


def in_pool(op) -> bool:
    """Whether a state tile lives in a pool row indexed through state_indices (the one home a
    property names)."""
    return op.home is not None

