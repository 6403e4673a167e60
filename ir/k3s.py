"""The `k3s` schedule dialect: how a layer runs, as Python entry points launching kernels of stages.

A lowered module is a list of entries:

    k3s.entry @recurrent {                         the Python function of the compiled module
      k3s.tensor_arg @q <shape = "B,T,4,64", ...>  its arguments, with shapes and dtype classes
      k3s.kernel @kda_recurrent <...> {            one Triton kernel it launches
        k3s.state_tile ...                         stages, in program order; nested loops are
        k3s.token_loop { k3s.decay ... }           region ops
      }
    }

Passes in passes/ build these from `k3` ops; the Triton backend prints one block of code per
stage. Shape strings use the symbols B (batch), T (tokens per sequence), N (sequences: B, or
len(cu_seqlens) - 1), R (rows), S (sources), P (state pool rows) and NC (per-chunk slots of a
chunk entry: cdiv(B T, C) + N, enough for every chunk of any varlen split); everything else is a
number.
"""

from __future__ import annotations

from xdsl.dialects.builtin import I64, ArrayAttr, BoolAttr, FloatAttr, IntegerAttr, StringAttr
from xdsl.ir import Dialect, Operation, ParametrizedAttribute, SSAValue, TypeAttribute
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    MemoryReadEffect,
    NoTerminator,
    Pure,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import BETA_INPUTS, GATE_INPUTS, STATE_LAYOUTS
from k3compile.ir.choices import GATES as CHUNK_GATES  # chunk stages exist with any gate
from k3compile.ir.syntax import KeywordSyntax

ARG_DTYPES = ("float", "float32", "offsets", "state", "index")
ARG_ROLES = ("input", "optional_input", "forbidden", "output", "optional_output", "workspace", "inout", "combined")
GATES = ("channel", "scalar")
TOKEN_TENSORS = ("q", "k", "v")
SHAPE_SYMBOLS = ("B", "T", "N", "N+1", "S", "P", "NC")
MAX_NUM_WARPS = 32  # Triton: a power of two, at most 1024 threads per program
MIN_MAXNREG, MAX_MAXNREG = 24, 255  # what ptxas accepts as registers per thread


TILE_DIMS = ("C", "K", "V")


@irdl_attr_definition
class TileType(ParametrizedAttribute, TypeAttribute):
    """A value held in one program's registers: `!k3s.tile<C x K>` over the symbols C (a chunk's
    token rows), K (key channels) and V (the program's value columns); `<C>` one number per row,
    `<>` one number. Stages compute in fp32; loads keep the input dtype until a stage upcasts."""

    name = "k3s.tile"
    dims: ArrayAttr[StringAttr]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[ArrayAttr[StringAttr]]:
        parser.parse_punctuation("<")
        dims: list[StringAttr] = []
        if parser.parse_optional_punctuation(">") is None:
            dims.append(StringAttr(parser.parse_identifier(" (a tile dimension: C, K or V)")))
            while parser.parse_optional_keyword("x") is not None:
                dims.append(StringAttr(parser.parse_identifier(" (a tile dimension: C, K or V)")))
            parser.parse_punctuation(">")
        return [ArrayAttr(dims)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string("<" + " x ".join(d.data for d in self.dims.data) + ">")

    def verify(self) -> None:
        for dim in self.dims.data:
            if dim.data not in TILE_DIMS:
                raise VerifyException(f"{self.name}: unknown dimension {dim.data!r}; allowed: {', '.join(TILE_DIMS)}")


def tile(*dims: str) -> TileType:
    return TileType(ArrayAttr([StringAttr(d) for d in dims]))


def is_power_of_two(value: int) -> bool:
    return value > 0 and not value & (value - 1)  # 0 & -1 is 0 as well: 0 needs the sign test


def _choice(op: IRDLOperation, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(op, name).data
    if value not in allowed:
        raise VerifyException(f"{op.name}: {name} must be one of {', '.join(allowed)}; got {value!r}")


@irdl_op_definition
class EntryOp(KeywordSyntax):
    """A Python function of the compiled module: checks its arguments, launches its kernels."""

    name = "k3s.entry"
    sym_name = prop_def(StringAttr)
    source = prop_def(StringAttr)  # the k3 op this entry was lowered from
    max_sources = opt_prop_def(IntegerAttr[I64])  # upper bound on the shape symbol S
    max_tokens = opt_prop_def(IntegerAttr[I64])  # upper bound on the shape symbol T
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator())


@irdl_op_definition
class TensorArgOp(KeywordSyntax):
    """A tensor argument: its shape pattern, dtype class and whether the caller passes it.

    Roles: input (required), optional_input (may be None), forbidden (must be None: the
    member has no such input, e.g. g of DeltaNet), output / optional_output (allocated by
    the entry; an optional one only when the caller passes output_<name>=True), workspace
    (allocated by the entry for kernels to pass data between them; not returned), inout (passed
    in and updated in place, e.g. a state pool), combined (the states an entry's summary_combine
    step makes between its kernels: the entering state of every segment). Dtype classes:
    float (bf16, fp16 or fp32; outputs take the dtype of the entry's first input), float32,
    offsets (cu_seqlens: int32/int64, starting at 0, non-decreasing, ending at B*T, with B = 1),
    state (fp32 or bf16 state storage), index (int32/int64 slot numbers).
    """

    name = "k3s.tensor_arg"
    sym_name = prop_def(StringAttr)
    shape = prop_def(StringAttr)
    dtype = prop_def(StringAttr)
    role = prop_def(StringAttr)
    # another argument this one must not overlap in memory (a kernel reads one while writing the other)
    distinct_from = opt_prop_def(StringAttr)
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))

    def verify_(self) -> None:
        _choice(self, "dtype", ARG_DTYPES)
        _choice(self, "role", ARG_ROLES)
        dims = self.shape.data.split(",")
        for dim in dims:
            if not (dim.isdigit() and int(dim) > 0) and dim not in SHAPE_SYMBOLS:
                raise VerifyException(f"{self.name} @{self.sym_name.data}: bad dimension {dim!r} in shape")


@irdl_op_definition
class ScalarArgOp(KeywordSyntax):
    """A float argument with a default (e.g. the recurrence's scale)."""

    name = "k3s.scalar_arg"
    sym_name = prop_def(StringAttr)
    default = prop_def(FloatAttr)
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))


@irdl_op_definition
class CheckpointArgOp(KeywordSyntax):
    """Optional states along the sequence (prefix caching): the argument `checkpoint_every`
    (None, or a positive multiple of `chunk_size`) and, when given, one more returned tensor
    `checkpoints` of the states after every checkpoint_every tokens of each sequence, shaped
    [N, T // every, *state] (varlen: [sum of len_n // every, *state], in sequence order)."""

    name = "k3s.checkpoint_arg"
    sym_name = prop_def(StringAttr)
    chunk_size = prop_def(IntegerAttr[I64])
    state_shape = prop_def(StringAttr)
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))


KERNEL_DOTS = ("fp32", "tf32x3")


@irdl_op_definition
class KernelOp(KeywordSyntax):
    """One GPU kernel: a grid of programs, each running the stages of its body in order.

    `grid` names the parallel axes, fastest first: value_block (blocks of the value dim),
    sequence_head (sequence x value head), row (one token row).
    """

    name = "k3s.kernel"
    sym_name = prop_def(StringAttr)
    grid = prop_def(StringAttr)
    num_warps = prop_def(IntegerAttr[I64])
    num_stages = opt_prop_def(IntegerAttr[I64])  # software-pipelining depth of its loops (Triton's default if absent)
    # the operands of its chunk stages' matrix products: absent, those of the input dtype (bf16
    # tensor cores for bf16 inputs); fp32: exact fp32 whatever the inputs (the chunked verify,
    # whose products feed the committed state); tf32x3: fp32-accurate products on tensor cores
    # (three tf32 products: a x b ~ ah bh + ah bl + al bh)
    dots = opt_prop_def(StringAttr)
    # a cap on registers per thread (ptxas): fewer registers, more programs per SM, maybe spills
    maxnreg = opt_prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator(), HasParent(EntryOp), IsolatedFromAbove())

    def verify_(self) -> None:
        if self.dots is not None:
            _choice(self, "dots", KERNEL_DOTS)
        warps = self.num_warps.value.data
        if not is_power_of_two(warps) or warps > MAX_NUM_WARPS:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: num_warps must be a power of two in 1..{MAX_NUM_WARPS}, "
                f"got {warps}"
            )
        if self.num_stages is not None and self.num_stages.value.data < 1:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: num_stages must be >= 1, got {self.num_stages.value.data}"
            )
        if self.maxnreg is not None and not MIN_MAXNREG <= self.maxnreg.value.data <= MAX_MAXNREG:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: maxnreg must be in {MIN_MAXNREG}..{MAX_MAXNREG}, "
                f"got {self.maxnreg.value.data}"
            )


# --- stages of the recurrent (token-by-token) schedule -------------------------------------


@irdl_op_definition
class StateTileOp(KeywordSyntax):
    """A [K, V-block] fp32 state tile kept on chip. Its home: initial_state (when given; the
    default) or a pool row, `state[state_indices[n]]` (serving: a slot table over a state pool;
    a slot outside the pool, e.g. -1 for padding, starts from zero and is never written).
    `start` instead fixes where it starts: zero, or identity (a square K x K tile: the columns
    of a segment's transition M, head_v_dim = head_k_dim)."""

    name = "k3s.state_tile"
    head_k_dim = prop_def(IntegerAttr[I64])
    head_v_dim = prop_def(IntegerAttr[I64])
    block_v = prop_def(IntegerAttr[I64])
    layout = prop_def(StringAttr)
    home = opt_prop_def(StringAttr)  # absent: initial_state
    start = opt_prop_def(StringAttr)  # absent: the home's state
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _choice(self, "layout", STATE_LAYOUTS)
        _home(self)
        if self.start is not None:
            _choice(self, "start", STATE_STARTS)
            if self.home is not None:
                raise VerifyException(f"{self.name}: start and home exclude each other")
            if self.start.data == "identity" and self.head_v_dim.value.data != self.head_k_dim.value.data:
                raise VerifyException(f"{self.name}: an identity start needs a square tile, got K = "
                                      f"{self.head_k_dim.value.data}, V = {self.head_v_dim.value.data}")
        if not is_power_of_two(self.block_v.value.data):
            raise VerifyException(f"{self.name}: block_v must be a power of two, got {self.block_v.value.data}")


@irdl_op_definition
class SpeculativeOp(KeywordSyntax):
    """Speculative decoding without state snapshots: a verify pass over `draft_tokens` tokens
    (a token loop that also caches each token's k, gate and update u), then a replay that
    rebuilds the state after any accepted prefix from the committed state and the cache.
    Lowerings run the two apart (verify, then commit) or fused, replay first: one launch that
    commits the previous round's accepted tokens and verifies the next round."""

    name = "k3s.speculative"
    draft_tokens = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        if self.draft_tokens.value.data <= 0:
            raise VerifyException(f"{self.name}: draft_tokens must be positive, got {self.draft_tokens.value.data}")


@irdl_op_definition
class TokenLoopOp(KeywordSyntax):
    """Sequential loop over the tokens of one sequence (varlen through cu_seqlens)."""

    name = "k3s.token_loop"
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), HasParent(KernelOp, SpeculativeOp))


@irdl_op_definition
class CacheUpdateOp(KeywordSyntax):
    """Cache the token's k, its gate and the update u it wrote (u = beta (v - S^T k) with the
    delta rule, v without): what a replay needs instead of the state itself. In a chunk (the
    chunked verify) it caches every row of the chunk, u the rows of vr = U - W S (the delta
    rule) or of v."""

    name = "k3s.cache_update"
    gate = prop_def(StringAttr)
    buffer = opt_prop_def(StringAttr)  # the tensor argument it writes (absent: cache)
    # in a chunk: the rows of k, of u (vr or v) and, with a gate, of the log-gate g; in a token
    # loop none yet (the token stages' registers are implicit)
    rows = var_operand_def(TileType)
    # lazy: the chunk regions are defined further down
    traits = lazy_traits_def(lambda: (HasParent(TokenLoopOp, ChunkScanOp, ChunkLoopOp),))

    def verify_(self) -> None:
        _choice(self, "gate", CHUNK_GATES)


@irdl_op_definition
class SnapshotStateOp(KeywordSyntax):
    """The snapshot baseline of speculative decoding (what engines do today): write the whole
    state after every verified token to the slot's snapshot buffer."""

    name = "k3s.snapshot_state"
    traits = traits_def(HasParent(TokenLoopOp))


@irdl_op_definition
class RestoreSnapshotOp(KeywordSyntax):
    """The snapshot baseline's commit: the state after `accepted` tokens is the snapshot taken
    after token `accepted` (none accepted: the committed state stays)."""

    name = "k3s.restore_snapshot"
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class ReplayOp(KeywordSyntax):
    """S_m = Diag(Gamma_m) S_0 + sum_{j<=m} Diag(Gamma_m / Gamma_j) k_j u_j^T from the cache
    (Gamma_j the product of the first j decays; all ones without a gate): no serial dependency."""

    name = "k3s.replay"
    gate = prop_def(StringAttr)
    buffer = opt_prop_def(StringAttr)  # the tensor argument it reads (absent: cache)
    traits = traits_def(HasParent(SpeculativeOp, KernelOp))

    def verify_(self) -> None:
        _choice(self, "gate", CHUNK_GATES)


def cache_buffer(op: CacheUpdateOp | ReplayOp) -> str:
    """The tensor argument a cache_update writes or a replay reads."""
    return "cache" if op.buffer is None else op.buffer.data


@irdl_op_definition
class LoadTokenOp(KeywordSyntax):
    """Load one token's q, k or v vector of the current head into fp32 registers
    (q and k optionally L2-normalised: x / sqrt(|x|^2 + 1e-6))."""

    name = "k3s.load_token"
    tensor = prop_def(StringAttr)
    l2norm = opt_prop_def(BoolAttr)  # absent: false
    row = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp))

    def verify_(self) -> None:
        _choice(self, "tensor", TOKEN_TENSORS)
        _no_l2norm_of_values(self)


def normalises(op) -> bool:
    """Whether a load_token / load_chunk L2-normalises what it loads."""
    return op.l2norm is not None and bool(op.l2norm.value.data)


def _no_l2norm_of_values(op) -> None:
    if op.tensor.data == "v" and normalises(op):
        raise VerifyException(f"{op.name}: l2norm applies to q and k only")


@irdl_op_definition
class DecayOp(KeywordSyntax):
    """S <- Diag(exp g_t) S, g (from load_gate) a log-decay per key channel or per head."""

    name = "k3s.decay"
    gate = prop_def(StringAttr)
    traits = traits_def(HasParent(TokenLoopOp))

    def verify_(self) -> None:
        _choice(self, "gate", GATES)


@irdl_op_definition
class DeltaCorrectOp(KeywordSyntax):
    """The delta rule's correction: u = beta_t (v_t - S^T k_t), replacing v_t (beta from load_beta)."""

    name = "k3s.delta_correct"
    traits = traits_def(HasParent(TokenLoopOp))


@irdl_op_definition
class Rank1UpdateOp(KeywordSyntax):
    """S <- S + k_t u_t^T (u = v without the delta rule)."""

    name = "k3s.rank1_update"
    traits = traits_def(HasParent(TokenLoopOp))


@irdl_op_definition
class ReadoutOp(KeywordSyntax):
    """o_t = S^T (scale q_t), read after the update, stored in the output dtype."""

    name = "k3s.readout"
    traits = traits_def(HasParent(TokenLoopOp))


@irdl_op_definition
class StoreStateOp(KeywordSyntax):
    """Write the state tile to final_state (when the caller asked for it), back to its pool row in
    place (home = pool), or to the output `tensor` (a segment's N or M)."""

    name = "k3s.store_state"
    layout = prop_def(StringAttr)
    home = opt_prop_def(StringAttr)  # absent: final_state
    tensor = opt_prop_def(StringAttr)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _choice(self, "layout", STATE_LAYOUTS)
        _home(self)
        if self.tensor is not None and self.home is not None:
            raise VerifyException(f"{self.name}: tensor and home exclude each other")


STATE_HOMES = ("pool",)
STATE_STARTS = ("zero", "identity")


def _home(op) -> None:
    if op.home is not None and op.home.data not in STATE_HOMES:
        raise VerifyException(f"{op.name}: home must be pool (or absent), got {op.home.data!r}")


def in_pool(op) -> bool:
    """Whether a state tile lives in a pool row indexed through state_indices."""
    return op.home is not None and op.home.data == "pool"


# --- stages of the chunkwise (WY/UT) schedule ----------------------------------------------
# A chunk is C consecutive tokens of one sequence and value head. The stages are ops on tile
# values: what each reads are its operands, what it makes its result. The cumulative log-gate G
# ([C, K] or [C]; Gamma = exp G), the gated key Gram A, the UT transform T, the WY factors W and
# U, the query Gram P, the decayed queries and keys QG and KG, the chunk's decay gamma_C; in the
# scan, the carried state S ([K, V], a block argument of the scan's region), the residual values
# vr the state update uses and the output o.

MASKS = ("strict", "inclusive")
GATE_ANCHORS = ("start", "end")
# how a channel-gated Gram evaluates its diagonal sub-chunk blocks: factored (two tensor-core
# factors, exponents up to sub_chunk tokens of decay: needs a bounded gate) or elementwise
# (exp of differences, exponents <= 0 for any gate)
GRAM_DIAGONALS = ("factored", "elementwise")
# the names a value crossing kernels is spilled under (the workspace it lives in, k3s.reload)
SPILLED = ("W", "U", "P", "QG", "KG", "gamma_C", "T")


def workspace_name(value: str) -> str:
    """The workspace tensor a spilled value lives in: its own name, except T (every kernel's token
    count is T)."""
    return "T_ut" if value == "T" else value


def _operand_count(op: IRDLOperation, expected: int) -> None:
    if len(op.operands) != expected:
        raise VerifyException(f"{op.name}: expected {expected} operands for its properties, got {len(op.operands)}")


@irdl_op_definition
class ChunkedOp(KeywordSyntax):
    """The chunkwise form of a recurrence: its body is one chunk. The ops before the chunk_scan
    are chunk-local (no dependency between chunks: token-parallel); the chunk_scan runs chunk
    after chunk, carrying the state (initial_state, or zero)."""

    name = "k3s.chunked"
    chunk_size = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        if self.chunk_size.value.data <= 0:
            raise VerifyException(f"{self.name}: chunk_size must be positive, got {self.chunk_size.value.data}")
        scans = [op for op in self.body.ops if isinstance(op, ChunkScanOp)]
        if len(scans) != 1 or scans[0] is not self.body.block.last_op:
            raise VerifyException(f"{self.name}: the body must end in its one chunk_scan")

    @property
    def scan(self) -> ChunkScanOp:
        return self.body.block.last_op

    def local_ops(self) -> list[Operation]:
        return list(self.body.ops)[:-1]


@irdl_op_definition
class ChunkScanOp(KeywordSyntax):
    """The stages run chunk after chunk. Its block argument is the state S entering the chunk;
    it ends in `next_chunk` with the state the next chunk enters with."""

    name = "k3s.chunk_scan"
    body = region_def("single_block")
    traits = traits_def(HasParent(ChunkedOp))


@irdl_op_definition
class ChunkLoopOp(KeywordSyntax):
    """In a kernel: the chunks of one sequence, in order (the scan of a fused schedule), carrying
    the kernel's state tile: the block argument S, the operand of the closing `next_chunk`."""

    name = "k3s.chunk_loop"
    chunk_size = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class NextChunkOp(KeywordSyntax):
    """The state the next chunk enters with (the loop-carried value of a chunk scan or loop)."""

    name = "k3s.next_chunk"
    state = operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(ChunkScanOp, ChunkLoopOp))


def carried_state(loop: ChunkScanOp | ChunkLoopOp) -> tuple[SSAValue, SSAValue]:
    """(the state a chunk enters with, the state it leaves)."""
    return loop.body.block.args[0], loop.body.block.last_op.state


CHUNK_LOCAL_PARENTS = (ChunkedOp, KernelOp, ChunkLoopOp)  # before fusion, in a prepare kernel, re-run in a scan
SCAN_PARENTS = (ChunkScanOp, ChunkLoopOp)


@irdl_op_definition
class ChunkTileOp(KeywordSyntax):
    """In a kernel over chunks: the token rows of this program's chunk (C rows, the last
    chunk of a sequence masked) and the key/value ranges."""

    name = "k3s.chunk_tile"
    chunk_size = prop_def(IntegerAttr[I64])
    head_k_dim = prop_def(IntegerAttr[I64])
    head_v_dim = prop_def(IntegerAttr[I64])
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class LoadChunkOp(KeywordSyntax):
    """Load the chunk's rows of q, k or v (v: the program's value columns); q and k optionally
    L2-normalised per row."""

    name = "k3s.load_chunk"
    tensor = prop_def(StringAttr)
    l2norm = opt_prop_def(BoolAttr)  # absent: false
    rows = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        _choice(self, "tensor", TOKEN_TENSORS)
        _no_l2norm_of_values(self)


@irdl_op_definition
class LoadGateOp(KeywordSyntax):
    """Load the gate as a log-decay g into registers (per token, or a chunk's rows; rows past
    the end read 0). input log: g as given; softplus: -exp(A_log) softplus(g + dt_bias);
    bounded: lower_bound sigmoid(exp(A_log) (g + dt_bias))."""

    name = "k3s.load_gate"
    gate = prop_def(StringAttr)
    input = prop_def(StringAttr)
    lower_bound = prop_def(FloatAttr)
    log_gate = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp, *CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        _choice(self, "gate", GATES)
        _choice(self, "input", GATE_INPUTS)
        if self.lower_bound.value.data >= 0:
            raise VerifyException(f"{self.name}: lower_bound must be < 0, got {self.lower_bound.value.data}")


@irdl_op_definition
class LoadBetaOp(KeywordSyntax):
    """Load beta into registers: as given (probability), sigmoid(beta) (logits) or 2 sigmoid(beta)
    (logits_neg_eigval)."""

    name = "k3s.load_beta"
    input = prop_def(StringAttr)
    beta = result_def(TileType)
    traits = traits_def(HasParent(TokenLoopOp, *CHUNK_LOCAL_PARENTS), MemoryReadEffect())

    def verify_(self) -> None:
        _choice(self, "input", BETA_INPUTS)


@irdl_op_definition
class StoreCheckpointOp(KeywordSyntax):
    """After a chunk: if the tokens done so far are a multiple of checkpoint_every, write the
    state to its checkpoint slot."""

    name = "k3s.store_checkpoint"
    layout = prop_def(StringAttr)
    state = operand_def(TileType)
    traits = traits_def(HasParent(ChunkLoopOp))

    def verify_(self) -> None:
        _choice(self, "layout", STATE_LAYOUTS)


@irdl_op_definition
class SpillOp(KeywordSyntax):
    """Store a chunk-local value to the workspace `value` names, for a later kernel."""

    name = "k3s.spill"
    value = prop_def(StringAttr)
    tile = operand_def(TileType)
    traits = traits_def(HasParent(KernelOp, ChunkLoopOp))

    def verify_(self) -> None:
        _choice(self, "value", SPILLED)


@irdl_op_definition
class ReloadOp(KeywordSyntax):
    """Load a chunk-local value an earlier kernel spilled to the workspace `value` names."""

    name = "k3s.reload"
    value = prop_def(StringAttr)
    tile = result_def(TileType)
    traits = traits_def(HasParent(KernelOp, ChunkLoopOp), MemoryReadEffect())

    def verify_(self) -> None:
        _choice(self, "value", SPILLED)


@irdl_op_definition
class GateCumsumOp(KeywordSyntax):
    """G_r = sum_{i<=r} g_i within the chunk (per key channel or per head)."""

    name = "k3s.gate_cumsum"
    gate = prop_def(StringAttr)
    log_gate = operand_def(TileType)
    cumulative = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "gate", GATES)


@irdl_op_definition
class GramOp(KeywordSyntax):
    """A gated Gram matrix of the chunk, masked lower-triangular. Operands: lhs (q or k), the
    keys, then G with a gate and beta when `beta`:

        lhs = k: A = Tril_mask( Diag(beta) (Gamma*K) (K/Gamma)^T )     (the delta rule's A)
        lhs = q: P = Tril_mask( (Gamma*Q) (K/Gamma)^T )                 (intra-chunk scores)

    mask strict excludes the diagonal, inclusive keeps it; gate none means Gamma = 1;
    `beta` scales the rows by beta. With a channel gate the ratio Gamma_i / Gamma_j is split at
    a reference per row block of `sub_chunk` rows: the cumulative gate just before the block.
    Blocks below the diagonal factor into K_i Gamma_i / Gamma_ref (<= 1) and K_j Gamma_ref /
    Gamma_j (<= 1): no exponent is positive, and no reference lies after a row it serves, so
    outputs never depend on later gates. `diagonal` says how the blocks on the diagonal are
    evaluated (GRAM_DIAGONALS); only a channel gate has it.
    """

    name = "k3s.gram"
    mask = prop_def(StringAttr)
    gate = prop_def(StringAttr)
    beta = prop_def(BoolAttr)
    sub_chunk = prop_def(IntegerAttr[I64])
    diagonal = opt_prop_def(StringAttr)
    inputs = var_operand_def(TileType)
    gram = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "mask", MASKS)
        _choice(self, "gate", CHUNK_GATES)
        _operand_count(self, 2 + (self.gate.data != "none") + bool(self.beta.value.data))
        if self.sub_chunk.value.data <= 0:
            raise VerifyException(f"{self.name}: sub_chunk must be positive, got {self.sub_chunk.value.data}")
        if (self.diagonal is not None) != (self.gate.data == "channel"):
            raise VerifyException(f"{self.name}: diagonal is set exactly when gate = channel; "
                                  f"got gate {self.gate.data!r}, diagonal {self.diagonal and self.diagonal.data!r}")
        if self.diagonal is not None:
            _choice(self, "diagonal", GRAM_DIAGONALS)

    @property
    def lhs(self) -> SSAValue:
        return self.inputs[0]

    @property
    def keys(self) -> SSAValue:
        return self.inputs[1]

    @property
    def cumulative_gate(self) -> SSAValue | None:
        return self.inputs[2] if self.gate.data != "none" else None

    @property
    def row_scale(self) -> SSAValue | None:
        return self.inputs[-1] if self.beta.value.data else None


@irdl_op_definition
class ForwardSubstitutionOp(KeywordSyntax):
    """T = (I + A)^{-1} Diag(beta), A lower triangular. The diagonal blocks of `block` rows
    are solved row by row (all blocks at once), the rest by log2(blocks) products."""

    name = "k3s.forward_substitution"
    block = prop_def(IntegerAttr[I64])
    gram = operand_def(TileType)
    beta = operand_def(TileType)
    transform = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())


@irdl_op_definition
class WYApplyOp(KeywordSyntax):
    """A WY factor: T (Gamma * X) with X the keys and G given (W), or T X (U = T V)."""

    name = "k3s.wy_apply"
    gate = prop_def(StringAttr)
    transform = operand_def(TileType)
    rows = operand_def(TileType)
    cumulative_gate = opt_operand_def(TileType)
    factor = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "gate", CHUNK_GATES)
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
class GateApplyOp(KeywordSyntax):
    """A chunk operand with the gate's decay applied, for the state pass:

        anchor = start:  QG = Gamma * Q            (decay since the chunk's start)
        anchor = end:    KG = (gamma_C / Gamma) * K  (decay until the chunk's end)

    Both exponents are <= 0: no overflow for any gate."""

    name = "k3s.gate_apply"
    anchor = prop_def(StringAttr)
    gate = prop_def(StringAttr)
    rows = operand_def(TileType)
    cumulative_gate = operand_def(TileType)
    decayed = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "anchor", GATE_ANCHORS)
        _choice(self, "gate", GATES)


@irdl_op_definition
class ChunkDecayOp(KeywordSyntax):
    """gamma_C: the decay of the whole chunk (the last row of Gamma), per key channel or per head."""

    name = "k3s.chunk_decay"
    gate = prop_def(StringAttr)
    cumulative_gate = operand_def(TileType)
    decay = result_def(TileType)
    traits = traits_def(HasParent(*CHUNK_LOCAL_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "gate", GATES)


@irdl_op_definition
class ChunkOutputOp(KeywordSyntax):
    """o = scale (Q' S + P V'), stored to the output: Q' the queries as read across chunks (QG,
    or Q without a gate), V' the values the state takes (vr with the delta rule, else V)."""

    name = "k3s.chunk_output"
    queries = operand_def(TileType)
    state = operand_def(TileType)
    scores = operand_def(TileType)
    values = operand_def(TileType)
    output = result_def(TileType)
    traits = traits_def(HasParent(*SCAN_PARENTS))


@irdl_op_definition
class StateAdvanceOp(KeywordSyntax):
    """S' = Diag(gamma_C) S + K'^T V' (K' = KG with a gate, K without; no decay without a gate)."""

    name = "k3s.state_advance"
    gate = prop_def(StringAttr)
    state = operand_def(TileType)
    keys = operand_def(TileType)
    values = operand_def(TileType)
    decay = opt_operand_def(TileType)
    advanced = result_def(TileType)
    traits = traits_def(HasParent(*SCAN_PARENTS), Pure())

    def verify_(self) -> None:
        _choice(self, "gate", CHUNK_GATES)
        if (self.decay is None) != (self.gate.data == "none"):
            raise VerifyException(f"{self.name}: gamma_C is an operand exactly when gate is not none")


CHUNK_STAGES = [
    ChunkedOp,
    ChunkScanOp,
    ChunkLoopOp,
    NextChunkOp,
    ChunkTileOp,
    LoadChunkOp,
    LoadGateOp,
    LoadBetaOp,
    StoreCheckpointOp,
    SpillOp,
    ReloadOp,
    GateCumsumOp,
    GramOp,
    ForwardSubstitutionOp,
    WYApplyOp,
    GateApplyOp,
    ChunkDecayOp,
    DeltaResidualOp,
    ChunkOutputOp,
    StateAdvanceOp,
]


# --- stages of the fused AttnRes schedule --------------------------------------------------


@irdl_op_definition
class FoldQueryOp(KeywordSyntax):
    """q = w * gain: the RMSNorm gain folded into the pseudo-query, so normalised sources
    are never materialised."""

    name = "k3s.fold_query"
    hidden_size = prop_def(IntegerAttr[I64])
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class SourceLoopOp(KeywordSyntax):
    """Loop over the depth sources of one row, reading each source row once."""

    name = "k3s.source_loop"
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), HasParent(KernelOp))


@irdl_op_definition
class RmsScoreOp(KeywordSyntax):
    """score_i = q . x_i / sqrt(mean(x_i^2) + eps): the RMS folded into the score."""

    name = "k3s.rms_score"
    eps = prop_def(FloatAttr)
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class OnlineSoftmaxOp(KeywordSyntax):
    """Running max and normaliser of the softmax over sources (fp32)."""

    name = "k3s.online_softmax"
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class MixAccumulateOp(KeywordSyntax):
    """acc <- acc * rescale + p_i x_i: the mix of un-normalised sources."""

    name = "k3s.mix_accumulate"
    traits = traits_def(HasParent(SourceLoopOp))


@irdl_op_definition
class NormalizeStoreOp(KeywordSyntax):
    """h = acc / normaliser, stored in the output dtype."""

    name = "k3s.normalize_store"
    traits = traits_def(HasParent(KernelOp))



# --- the segment-scan schedule (context parallelism) ---------------------------------------
# Every token is an affine map of the state, S_t = A_t S_{t-1} + B_t with A_t = (I - beta_t k_t
# k_t^T) Diag(a_t) and B_t = beta_t k_t v_t^T (A_t = Diag(a_t), B_t = k_t v_t^T without the delta
# rule). A segment of consecutive tokens of one sequence and value head composes to its summary
# (M, N): S_end = M S_start + N, M the product of its A_t and N its state from a zero start.
# Summaries compose associatively: (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2). The transition
# form is how M is held: full (K x K), diagonal (K numbers), scalar (one number) or identity (no M).

TRANSITIONS = ("full", "diagonal", "scalar", "identity")


@irdl_op_definition
class SegmentScanOp(KeywordSyntax):
    """The segments of a sequence run in parallel. Its body, in order: segment_summary (every
    segment's (M, N)), summary_combine (each segment's initial state from the summaries before
    it) and the chunked schedule that finishes every segment from that state."""

    name = "k3s.segment_scan"
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        ops = list(self.body.ops)
        if [type(op) for op in ops] != [SegmentSummaryOp, SummaryCombineOp, ChunkedOp]:
            got = ", ".join(op.name for op in ops) or "nothing"
            raise VerifyException(f"{self.name}: body must be segment_summary, summary_combine, chunked; got {got}")
        if ops[0].transition.data != ops[1].transition.data:
            raise VerifyException(f"{self.name}: summary and combine disagree on the transition form "
                                  f"({ops[0].transition.data} vs {ops[1].transition.data})")


@irdl_op_definition
class SegmentSummaryOp(KeywordSyntax):
    """Every segment's summary (M, N), all segments in parallel. N is the state the chunked
    schedule beside it leaves from a zero start, by its state pass alone (the chunked
    schedule without its output, and so without what only the output reads). A full M rides
    along in the same pass as K more state columns: [M | N] from [I | 0] with values [0 | V] (the columns evolve independently); a
    diagonal or scalar M is the segment's product of decays; identity has no M."""

    name = "k3s.segment_summary"
    transition = prop_def(StringAttr)
    traits = traits_def(HasParent(SegmentScanOp))

    def verify_(self) -> None:
        _choice(self, "transition", TRANSITIONS)


@irdl_op_definition
class SummaryCombineOp(KeywordSyntax):
    """The initial state of segment p: (sigma_{p-1} o ... o sigma_0)(S_0) from the summaries
    sigma before it and the sequence's initial state, with (M2, N2) o (M1, N1) = (M2 M1, M2 N1 +
    N2) in the transition form (diagonal: elementwise; identity: N1 + N2). Associative, so any
    scan order (serial, tree, one prefix per rank after an all-gather) gives the same states."""

    name = "k3s.summary_combine"
    transition = prop_def(StringAttr)
    # in a lowered entry (lower-segment-scan): the host step between the summary kernels and the
    # finish, its scan order the caller's (one device: a prefix per sequence; ranks: an all-gather)
    traits = traits_def(HasParent(SegmentScanOp, EntryOp))

    def verify_(self) -> None:
        _choice(self, "transition", TRANSITIONS)


@irdl_op_definition
class DecayProductOp(KeywordSyntax):
    """M <- Diag(gamma_C) M over the chunks of a segment: a diagonal or scalar transition, the
    product of the segment's decays (M starts at 1)."""

    name = "k3s.decay_product"
    transition = prop_def(StringAttr)
    decay = operand_def(TileType)  # gamma_C
    traits = traits_def(HasParent(ChunkLoopOp))

    def verify_(self) -> None:
        if self.transition.data not in ("diagonal", "scalar"):
            raise VerifyException(f"{self.name}: transition must be diagonal or scalar, got {self.transition.data!r}")


@irdl_op_definition
class StoreTransitionOp(KeywordSyntax):
    """Write the decay product M of a segment to the output M ([N, HV, K] or [N, HV])."""

    name = "k3s.store_transition"
    transition = prop_def(StringAttr)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        if self.transition.data not in ("diagonal", "scalar"):
            raise VerifyException(f"{self.name}: transition must be diagonal or scalar, got {self.transition.data!r}")


SEGMENT_SCAN_OPS = [SegmentScanOp, SegmentSummaryOp, SummaryCombineOp, DecayProductOp, StoreTransitionOp]

K3S = Dialect(
    "k3s",
    [
        EntryOp,
        TensorArgOp,
        ScalarArgOp,
        CheckpointArgOp,
        SpeculativeOp,
        CacheUpdateOp,
        ReplayOp,
        SnapshotStateOp,
        RestoreSnapshotOp,
        KernelOp,
        StateTileOp,
        TokenLoopOp,
        LoadTokenOp,
        DecayOp,
        DeltaCorrectOp,
        Rank1UpdateOp,
        ReadoutOp,
        StoreStateOp,
        FoldQueryOp,
        SourceLoopOp,
        RmsScoreOp,
        OnlineSoftmaxOp,
        MixAccumulateOp,
        NormalizeStoreOp,
        *CHUNK_STAGES,
        *SEGMENT_SCAN_OPS,
    ],
    [TileType],
)
