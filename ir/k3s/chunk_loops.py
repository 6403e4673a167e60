"""The chunkwise (WY/UT) schedule's regions and loops: the chunked schedule and its scan, a
backward schedule's state and cotangent scans, a kernel's chunk loop and value-block loop, and the
terminators that pass their carried values on. The stages they hold are in chunk.py and gram.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xdsl.dialects.builtin import I64, BoolAttr, IntegerAttr, i64
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import HasParent, IsTerminator, NoTerminator
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.k3s.kernels import KernelOp, RuntimeSizesInterface, WhenOp
from k3compile.ir.k3s.types import TensorType, TileType
from k3compile.ir.k3s.token import verify_carried_values
from k3compile.ir.syntax import KeywordSyntax


def _positive_chunk_size(op) -> None:
    if op.chunk_size.value.data <= 0:
        raise VerifyException(f"{op.name}: chunk_size must be positive, got {op.chunk_size.value.data}")


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
        _positive_chunk_size(self)
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
class ChunkedBackwardOp(KeywordSyntax):
    """The reverse-mode derivative of a chunkwise schedule (derive-backward), one chunk as its
    body. Its two scans split the body into phases, each run over every chunk before the next
    starts: what precedes `state_scan` is chunk-local (the forward's stages, recomputed), the
    state scan runs chunk after chunk, the cotangent scan from the last chunk to the first, and
    what follows them is chunk-local again, reading each chunk's entering state and the cotangent
    of the state it leaves."""

    name = "k3s.chunked_backward"
    chunk_size = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def verify_(self) -> None:
        _positive_chunk_size(self)


@irdl_op_definition
class StateScanOp(KeywordSyntax):
    """`%S = k3s.state_scan %initial_state { ^bb0(%S): ... k3s.next_chunk %S_1 }`: the forward
    scan's state pass, chunk after chunk from the initial state (or zero); its result, per chunk,
    is the state that chunk enters with."""

    name = "k3s.state_scan"
    initial = operand_def(TensorType)
    entering = result_def(TileType)
    body = region_def("single_block")
    traits = traits_def(HasParent(ChunkedBackwardOp))


@irdl_op_definition
class CotangentScanOp(KeywordSyntax):
    """`%dS = k3s.cotangent_scan %dht, %dh0 { ^bb0(%dS): ... k3s.next_chunk %dS_1 }`: the state
    pass in reverse, from the last chunk to the first. Its block argument is the cotangent of the
    state the chunk leaves (for the last chunk, dht's or zero), the terminator's operand that of
    the state it enters; the first chunk's is stored to dh0. Its result, per chunk, is the
    cotangent of the state that chunk leaves."""

    name = "k3s.cotangent_scan"
    final_cotangent = operand_def(TensorType)  # dht
    initial_cotangent = operand_def(TensorType)  # dh0
    leaving = result_def(TileType)
    body = region_def("single_block")
    traits = traits_def(HasParent(ChunkedBackwardOp))


@irdl_op_definition
class ChunkLoopOp(KeywordSyntax, RuntimeSizesInterface):
    """`%S_final, %M_final = k3s.chunk_loop %S, %M, %cu_seqlens { ^bb0(%S_in, %M_in): ...
    k3s.next_chunk %S_next, %M_next }`: in a kernel, the chunks of one sequence, in order (the
    scan of a fused schedule), carrying values from chunk to chunk as scf.for carries its
    iter_args: the kernel's state tile first, then whatever else the chunks build up (a segment
    summary's decay product M). The leading operands are the values the first chunk enters with,
    the block arguments those each chunk enters with, `next_chunk`'s operands those it leaves,
    the results those after the last chunk. The operand after them, when the entry has them, is
    the sequence offsets (varlen when the caller passes them); without it the sequences are the B
    rows of T tokens. `reverse`: from the last chunk to the first (a backward schedule's
    cotangent scan)."""

    name = "k3s.chunk_loop"
    chunk_size = prop_def(IntegerAttr[I64])
    reverse = opt_prop_def(BoolAttr)  # absent: false
    initial = var_operand_def(TileType)
    offsets = opt_operand_def(TensorType)
    body = region_def("single_block")
    final = var_result_def(TileType)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(HasParent(KernelOp))

    def __init__(self, initial: Sequence[SSAValue], offsets: SSAValue | None, body: Block, *, chunk_size: int,
                 reverse: bool = False):
        """The loop over `body` (its block arguments, one per initial value) carrying `initial`,
        its results named after them (`%S` -> `%S_final`)."""
        properties: dict[str, Attribute] = {"chunk_size": IntegerAttr(chunk_size, i64)}
        if reverse:
            properties["reverse"] = BoolAttr.from_bool(True)
        super().__init__(operands=[initial, offsets], result_types=[[v.type for v in initial]],
                         properties=properties, regions=[Region(body)])
        for start, result in zip(initial, self.final, strict=True):
            result.name_hint = f"{start.name_hint}_final"

    @classmethod
    def operand_segment_sizes(cls, operands: Sequence[SSAValue], properties: Mapping[str, Attribute]) -> list[int]:
        """The carried values (tiles), then the sequence offsets if the loop reads them."""
        carried = sum(isinstance(v.type, TileType) for v in operands)
        if any(isinstance(v.type, TileType) for v in operands[carried:]) or len(operands) > carried + 1:
            raise ValueError(f"{cls.name}: its operands are the values it carries (tiles), then the sequence "
                             "offsets, if it reads them")
        return [carried, len(operands) - carried]

    def verify_(self) -> None:
        verify_carried_values(self, self.initial, self.final)

    def runtime_sizes(self) -> tuple[str, ...]:
        return ("T",)  # its sequences' tokens


@irdl_op_definition
class NextChunkOp(KeywordSyntax):
    """The values the next chunk enters with (those a chunk scan or loop carries: the state, then,
    in a chunk loop, what else it carries)."""

    name = "k3s.next_chunk"
    carried = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(ChunkScanOp, ChunkLoopOp, StateScanOp, CotangentScanOp))


@irdl_op_definition
class ValueBlockLoopOp(KeywordSyntax):
    """In a kernel: its value columns in blocks of `block_v`, so that no tile holds more of them
    (a [K, V] state and its cotangent, whole, would not fit one program's registers). The body is
    the stages that read or make value columns; each result is a sum over the blocks (a product
    or reduction that contracts the value columns), carried in the block argument of its index
    and summed by the closing `k3s.sum_value_blocks`. In a kernel whose grid has a value_block
    axis the program runs one block, its own: the results are that block's parts of the sums
    (k3s.spill_value_block_part hands them to a kernel that adds them, k3s.sum_value_block_parts)."""

    name = "k3s.value_block_loop"
    block_v = prop_def(IntegerAttr[I64])
    unroll = opt_prop_def(BoolAttr)  # the Triton backend's (lower-to-triton)
    sums = var_result_def(TileType)
    body = region_def("single_block")
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        args, terminator = self.body.block.args, self.body.block.last_op
        if not isinstance(terminator, SumValueBlocksOp) or len(terminator.operands) != len(self.sums) or len(args) != len(self.sums):
            raise VerifyException(f"{self.name}: a block argument and a k3s.sum_value_blocks operand per result")
        for arg, part, total in zip(args, terminator.operands, self.sums, strict=True):
            if not arg.type == part.type == total.type:
                raise VerifyException(f"{self.name}: a sum's block argument, part and result differ in type")


@irdl_op_definition
class SumValueBlocksOp(KeywordSyntax):
    """Each operand (one value block's part of a sum) added to the loop's carried sum of its index."""

    name = "k3s.sum_value_blocks"
    parts = var_operand_def(TileType)
    traits = traits_def(IsTerminator(), HasParent(ValueBlockLoopOp))


def carried_state(loop: ChunkScanOp | ChunkLoopOp) -> tuple[SSAValue, SSAValue]:
    """(the state a chunk enters with, the state it leaves): the first value it carries."""
    return loop.body.block.args[0], loop.body.block.last_op.carried[0]


# before fusion, in a prepare kernel (or under one of its guards), re-run in a scan, recomputed
# by a backward schedule
CHUNK_LOCAL_PARENTS = (ChunkedOp, KernelOp, WhenOp, ChunkLoopOp, ChunkedBackwardOp, ValueBlockLoopOp)
# where the state a chunk enters is known: a scan, a backward schedule after its state scan, or a
# kernel that reloads it
SCAN_PARENTS = (ChunkScanOp, ChunkLoopOp, StateScanOp, ChunkedBackwardOp, KernelOp, ValueBlockLoopOp)




CHUNK_LOOPS = [
    ChunkedOp,
    ChunkScanOp,
    ChunkedBackwardOp,
    StateScanOp,
    CotangentScanOp,
    ChunkLoopOp,
    NextChunkOp,
    ValueBlockLoopOp,
    SumValueBlocksOp,
]
