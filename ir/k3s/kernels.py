"""Kernels and how entries run them: k3s.kernel (a module symbol whose block arguments are the
tensors its stages use), k3s.launch, the guards of stages some launches skip (k3s.when), block
sizes by row count (k3s.launch_by_rows), and the walks over an entry's kernels."""

from __future__ import annotations

import abc
import itertools
import re
from typing import ClassVar

from xdsl.dialects.builtin import (I64, ArrayAttr, BoolAttr, DictionaryAttr, FlatSymbolRefAttrConstr, ModuleOp,
                                   IntegerAttr, StringAttr, i1)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import BlockArgument, Operation, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    irdl_attr_definition,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    var_operand_def,
    traits_def,
)
from xdsl.traits import HasAncestor, HasParent, IsolatedFromAbove, NoTerminator, OpTrait, Pure, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3s.target import RuntimeBlockAttr
from k3compile.ir.k3s.types import is_power_of_two
from k3compile.ir.k3s.core import (AbsentTensorOp, EntryOp, ReferencesSymbols, ScalarArgOp, TensorArgOp,
                                   referenced_op)
from k3compile.ir.syntax import KeywordSyntax


MAX_NUM_WARPS = 32  # Triton: a power of two, at most 1024 threads per program
# a row kernel (AttnRes, the MoE router's top-k) holds its rows of next_pow2(D) fp32 (the source
# row, the accumulator, query and gain) in registers across its warps: no spill at 2048 columns
# per warp (D = 16384 with 8 warps), 4 KB of stack per thread at 8192
MAX_ROW_PER_WARP = 2048
MIN_MAXNREG, MAX_MAXNREG = 24, 255  # what ptxas accepts as registers per thread
REGISTER_FILE = 65536  # 32-bit registers of an SM (sm_80, sm_90): one program's threads x maxnreg must fit


def register_cap(maxnreg: int, num_warps: int) -> int:
    """`maxnreg` lowered where `num_warps` warps could not launch at it (0: no cap stays none)."""
    return min(maxnreg, REGISTER_FILE // (32 * num_warps)) if maxnreg else 0


class KernelDots(Word):
    FP32 = "fp32"
    TF32X3 = "tf32x3"
    INPUT = "input"  # by the input dtype at launch (lower-to-triton's where no pass chose)


@irdl_attr_definition
class KernelDotsAttr(EnumAttribute[KernelDots], SpacedOpaqueSyntaxAttribute):
    name = "k3s.dots"


class GridAxis(Word):
    """A parallel axis of a kernel's grid: what one program index along it stands for."""

    VALUE_BLOCK = "value_block"  # a block of the value columns
    SEQUENCE_HEAD = "sequence_head"  # one (sequence, value head)
    CHUNK = "chunk"  # one chunk of tokens (varlen: a row of the chunk table)
    VALUE_HEAD = "value_head"  # one value head
    ROW = "row"  # one token row
    ROW_BLOCK = "row_block"  # a block of token rows
    ROW_GROUP = "row_group"  # a group of token rows, one after another
    ROW_QUERY_BLOCK = "row_query_block"  # one token row and a block of a Block AttnRes block's queries
    ROW_GROUP_QUERY_BLOCK = "row_group_query_block"  # a group of token rows and a block of the queries
    ROW_GROUP_ALL_QUERIES = "row_group_all_queries"  # a group of token rows with all the queries
    ROW_PART = "row_part"  # a part of the token rows of a sum over all of them (each part adds its share)
    EXPERT = "expert"  # one MoE expert
    EXPERT_BLOCK = "expert_block"  # a block of MoE experts
    HIDDEN_SLICE = "hidden_slice"  # one of the HS slices of the hidden columns (the router's logits)
    TOKEN = "token"  # one token row of an MoE layer
    PAIR = "pair"  # one (token, slot) pair
    PAIR_CHUNK = "pair_chunk"  # a block of (token, slot) pairs
    SORTED_BLOCK = "sorted_block"  # a block of the expert-sorted pair list, all of one expert
    INPUT_BLOCK = "input_block"  # a block of a weight's input columns
    COLUMN_BLOCK = "column_block"  # a block of output columns
    ONE = "one"  # a single program


@irdl_attr_definition
class GridAxisAttr(EnumAttribute[GridAxis], SpacedOpaqueSyntaxAttribute):
    name = "k3s.grid_axis"


MAX_GRID_AXES = 3  # a CUDA grid's dimensions


# --- sizes known only at run time ----------------------------------------------------------
# What a kernel may read of a call's sizes, in the order its parameters take them: T (tokens per
# sequence), S (AttnRes sources), R (token rows), Q (a Block AttnRes block's queries), HS (the
# MoE router's hidden slices) and NSLOTS (the state pool's rows: the shape symbol P).
RUNTIME_SIZES = ("T", "S", "R", "Q", "HS", "NSLOTS")
# the grid axes whose program indices range over a run-time size
AXIS_RUNTIME_SIZES = {
    GridAxis.ROW_BLOCK: ("R",),
    GridAxis.PAIR_CHUNK: ("R",),
    GridAxis.ROW_QUERY_BLOCK: ("Q",),
    GridAxis.ROW_GROUP_QUERY_BLOCK: ("Q",),
    GridAxis.ROW_GROUP_ALL_QUERIES: ("Q",),
}


class RuntimeSizesInterface(Operation, abc.ABC):
    """An op interface (in the manner of xdsl.interfaces): an op whose kernel reads sizes known
    only at run time says which (runtime_sizes, below, asks a kernel's ops and grid axes)."""

    @abc.abstractmethod
    def runtime_sizes(self) -> tuple[str, ...]:
        """The RUNTIME_SIZES the op's code reads."""
        raise NotImplementedError()


class ChunkTableInterface(Operation, abc.ABC):
    """An op interface: the op that finds a chunk axis's chunk (its sequence and first token) says
    whether it reads the chunk table the launch makes from the sequence offsets (launch_params'
    chunk_table) or counts equal rows of T tokens."""

    @abc.abstractmethod
    def reads_chunk_table(self) -> bool:
        raise NotImplementedError()


def runtime_sizes(kernel: KernelOp) -> list[str]:
    """The sizes known only at run time that a kernel reads: its grid axes' and its ops', in the
    order of RUNTIME_SIZES."""
    read = {size for axis in kernel.axes for size in AXIS_RUNTIME_SIZES.get(axis, ())}
    read.update(size for op in kernel.walk() if isinstance(op, RuntimeSizesInterface) for size in op.runtime_sizes())
    return [size for size in RUNTIME_SIZES if size in read]


# --- what a launch passes besides the kernel's arguments -------------------------------------
class LaunchParam(Word):
    """A parameter of a kernel that is none of its arguments, passed by each launch: the chunk
    grid axis's table, a run-time size (RUNTIME_SIZES: the value is its entry's
    k3s.launch_size), the checkpoints a k3s.store_checkpoint writes."""

    CHUNK_TABLE = "chunk_table"  # each chunk's (sequence, first token), made at launch
    T = "T"
    S = "S"
    R = "R"
    Q = "Q"
    HS = "HS"
    NSLOTS = "NSLOTS"
    CHECKPOINTS = "checkpoints"  # the checkpoints tensor, each sequence's first slot, checkpoint_every


@irdl_attr_definition
class LaunchParamAttr(EnumAttribute[LaunchParam], SpacedOpaqueSyntaxAttribute):
    name = "k3s.launch_param"


class WritesCheckpoints(OpTrait):
    """An op whose code writes the entry's checkpoints (k3s.store_checkpoint): its kernel takes them."""


def launch_params(kernel: KernelOp) -> list[LaunchParam]:
    """What a kernel's launch passes besides its arguments, in the order its parameters take them:
    a chunk axis's table (where its chunk tile has sequence offsets), the run-time sizes it reads,
    the checkpoints. lower-to-triton writes
    them on the kernel (`launch_params`), which must say these."""
    table = [LaunchParam.CHUNK_TABLE] if GridAxis.CHUNK in kernel.axes and any(
        isinstance(op, ChunkTableInterface) and op.reads_chunk_table() for op in kernel.body.ops) else []
    checkpoints = [LaunchParam.CHECKPOINTS] if any(op.has_trait(WritesCheckpoints) for op in kernel.walk()) else []
    return [*table, *(LaunchParam(size) for size in runtime_sizes(kernel)), *checkpoints]


class IsolatedOnceOutlined(IsolatedFromAbove):
    """A kernel reads nothing from outside once outline-kernels made it a module symbol; built in
    its entry, it reads the entry's arguments. Either way its values print in their own scope."""

    def verify(self, op) -> None:
        if isinstance(op.parent_op(), ModuleOp):
            super().verify(op)


# a flag is a constexpr parameter of the printed kernel, named in upper case as the others are
FLAG_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


@irdl_op_definition
class KernelOp(KeywordSyntax):
    """One GPU kernel: a grid of programs, each running the stages of its body in order.

    A kernel is a symbol of the module whose block arguments are the tensors (and scalars) its
    stages read and write, exactly those; an entry runs it by `k3s.launch @kernel(%q, ...)`. The
    passes that lower a layer build each kernel inside the entry that launches it, its stages
    reading the entry's arguments directly; outline-kernels then makes it a symbol (as MLIR's
    gpu.launch bodies become gpu.func by outlining).

    `grid` lists the parallel axes, fastest first, each a GridAxis at most once (`grid =
    [chunk, value_head]`); `axes` is the list as GridAxis words.
    """

    name = "k3s.kernel"
    sym_name = prop_def(StringAttr)
    grid = prop_def(ArrayAttr[GridAxisAttr])
    num_warps = prop_def(IntegerAttr[I64])
    num_stages = opt_prop_def(IntegerAttr[I64])  # software-pipelining depth of its loops (Triton's default if absent)
    # the operands of its stages' matrix products: input, those of the input dtype (bf16 tensor
    # cores for bf16 inputs; lower-to-triton writes it where no pass chose; absent: no products);
    # fp32: exact fp32 whatever the inputs (the chunked verify, whose products feed the committed
    # state); tf32x3: fp32-accurate products on tensor cores (three tf32 products: a x b ~ ah bh
    # + ah bl + al bh)
    dots = opt_prop_def(KernelDotsAttr)
    # a cap on registers per thread (ptxas): fewer registers, more programs per SM, maybe spills
    maxnreg = opt_prop_def(IntegerAttr[I64])
    # the block sizes of its tiles (key, value and hidden columns; token rows, experts and top-k
    # slots of the MoE routing), fixed by a backend's legalization (backends/triton/legalize.py)
    # before printing
    block_k = opt_prop_def(IntegerAttr[I64])
    block_v = opt_prop_def(IntegerAttr[I64])
    block_d = opt_prop_def(IntegerAttr[I64])
    block_r = opt_prop_def(IntegerAttr[I64])
    block_e = opt_prop_def(IntegerAttr[I64])
    block_ks = opt_prop_def(IntegerAttr[I64])
    block_n = opt_prop_def(IntegerAttr[I64])  # an MoE projection's output columns
    block_s = opt_prop_def(IntegerAttr[I64])  # a Block AttnRes row's representatives (sources)
    # a program's Block AttnRes queries: a fixed block, or all of the call's (#k3s.runtime_block<Q>)
    block_q = opt_prop_def(IntegerAttr[I64] | RuntimeBlockAttr)
    # its constexpr flags, each the guard of its k3s.when stages, and the value its launch passes:
    # the names are code, the values launch (kernels sharing one code pass their own)
    flags = opt_prop_def(DictionaryAttr)
    # the slices of the hidden columns of a kernel with a hidden_slice grid axis (the shape
    # symbol HS) at calls of more rows than its k3s.launch_by_rows ops take
    hidden_slices = opt_prop_def(IntegerAttr[I64])
    # the calls that launch it, by their token rows (B x T of a kernel over token rows, else the
    # shape symbol R): at least min_rows, at most max_rows (absent: no bound); an entry whose
    # kernels split its calls by size (fuse-attnres: a program per row for few rows, groups for
    # many) launches those whose bounds hold the call's rows
    min_rows = opt_prop_def(IntegerAttr[I64])
    max_rows = opt_prop_def(IntegerAttr[I64])
    # another kernel of the module whose code this one runs (merge-identical-kernels: the same
    # body and properties): printed once, launched from both entries with their own configs
    shares_code_of = opt_prop_def(FlatSymbolRefAttrConstr)
    # what its launches pass besides its arguments (lower-to-triton's: launch_params(kernel))
    launch_params = opt_prop_def(ArrayAttr[LaunchParamAttr])
    # the query and key heads H its programs group their value heads by (i_h = i_hv // (HV // H))
    # on a head grid axis (lower-to-triton's): the layer's where its stages read q or k rows (a
    # key_head layout, whose tensor has that many heads), else its value heads (a commit reads no
    # key rows: each value head stands alone); the stages' verifiers hold it to their tensors
    key_heads = opt_prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator(), HasParent(EntryOp, ModuleOp), IsolatedOnceOutlined(),
                        ReferencesSymbols(shares_code_of="k3s.kernel"))

    def is_outlined(self) -> bool:
        return isinstance(self.parent_op(), ModuleOp)

    def flag_on(self, flag: str) -> bool:
        return bool(self.flags.data[flag].value.data)

    @property
    def axes(self) -> list[GridAxis]:
        """The grid's axes, fastest first."""
        return [axis.data for axis in self.grid]

    def code_name(self) -> str:
        """The kernel whose code it runs: its own, or that of the kernel it shares code with."""
        return (self.sym_name if self.shares_code_of is None else self.shares_code_of.root_reference).data

    def verify_(self) -> None:
        axes = self.axes
        if not 1 <= len(axes) <= MAX_GRID_AXES or len(set(axes)) != len(axes):
            raise VerifyException(f"{self.name} @{self.sym_name.data}: its grid must list 1 to {MAX_GRID_AXES} "
                                  f"distinct axes, got [{', '.join(axes)}]")
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
        if self.maxnreg is not None and self.maxnreg.value.data * 32 * self.num_warps.value.data > REGISTER_FILE:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: maxnreg {self.maxnreg.value.data} at {self.num_warps.value.data} "
                f"warps needs {self.maxnreg.value.data * 32 * self.num_warps.value.data} registers a program, an SM "
                f"has {REGISTER_FILE}: it could not launch"
            )
        least, most = (None if bound is None else bound.value.data for bound in (self.min_rows, self.max_rows))
        if (least is not None and least < 1) or (most is not None and most < max(least or 1, 1)):
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: rows bounds must be positive with min_rows <= max_rows, "
                f"got min_rows {least}, max_rows {most}"
            )
        if self.key_heads is not None and self.key_heads.value.data < 1:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: key_heads must be positive, got {self.key_heads.value.data}"
            )
        if self.hidden_slices is not None and self.hidden_slices.value.data < 1:
            raise VerifyException(
                f"{self.name} @{self.sym_name.data}: hidden_slices must be positive, got {self.hidden_slices.value.data}"
            )
        flags = {} if self.flags is None else self.flags.data
        for flag, value in flags.items():
            if not FLAG_NAME.fullmatch(flag) or not (isinstance(value, IntegerAttr) and value.type == i1):
                raise VerifyException(f"{self.name} @{self.sym_name.data}: a flag is an upper-case name "
                                      f"(a constexpr of the code) set to true or false; got {flag} = {value}")
        if self.is_outlined():
            for arg in self.body.block.args:
                if not arg.uses:
                    raise VerifyException(f"{self.name} @{self.sym_name.data}: its argument %{arg.name_hint} is "
                                          "never used (a kernel's arguments are exactly what its stages read and write)")
        if self.launch_params is not None and (taken := [p.data for p in self.launch_params]) != launch_params(self):
            raise VerifyException(f"{self.name} @{self.sym_name.data}: its launch_params [{', '.join(taken)}] must be "
                                  f"those its grid and stages read, [{', '.join(launch_params(self))}]")
        # each k3s.when's flag is one of these (WhenOp.verify_), and each of these guards one
        guards = {op.flag.data for op in self.walk() if isinstance(op, (WhenOp, FlagOp))}
        if guards != set(flags):
            raise VerifyException(f"{self.name} @{self.sym_name.data}: its flags {sorted(flags)} must be those its "
                                  f"k3s.when and k3s.flag stages read, {sorted(guards)}")


@irdl_op_definition
class WhenOp(KeywordSyntax):
    """`k3s.when <flag = SPILL_P_QG> { stages }`: stages that run only in launches of the kernel
    that set `flag` (one of its `flags`: a compile-time constant of each launch) on; with it off
    the program skips them. `on = false` (`k3s.when <flag = STEEP, on = false>`) turns that
    round: the stages run in the launches that set the flag off. Kernels that run one code but
    write different tensors (the chunk prepare and the summary prepare, the cotangent scan and
    the cotangent summary: guard-spill-only-stages) hold the stages only some need under one;
    the backward's gradients kernel holds the exits of its two launches (the factored chunks',
    the steep chunks') under its STEEP flag. It has no results, and its stages' values are read
    only inside it, so a launch that skips them misses nothing else. `flag` refers to a flag its enclosing kernel declares, looked up by the
    verifier: a misspelt one fails `verify()` in one line, not the printer."""

    name = "k3s.when"
    flag = prop_def(StringAttr)
    on = opt_prop_def(BoolAttr)  # absent: true
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), HasAncestor(KernelOp))

    def kernel(self) -> KernelOp | None:
        return HasAncestor(KernelOp).get_ancestor(self)

    def runs_when(self) -> bool:
        """The value of its flag in the launches that run its stages."""
        return self.on is None or bool(self.on.value.data)

    def verify_(self) -> None:
        kernel, flag = self.kernel(), self.flag.data
        declared = {} if kernel is None or kernel.flags is None else kernel.flags.data
        if kernel is not None and flag not in declared:
            raise VerifyException(f"{self.name} <flag = {flag}>: its kernel @{kernel.sym_name.data} declares no flag "
                                  f"{flag} (its flags: {', '.join(sorted(declared)) or 'none'})")
        for op in self.body.walk():
            for result in op.results:
                if any(not self.is_ancestor(use.operation) for use in result.uses):
                    raise VerifyException(f"{self.name} <flag = {self.flag.data}>: %{result.name_hint} is read "
                                          "outside it, which a launch with the flag off would leave unset")

    def is_on(self) -> bool:
        """Whether its kernel's launch runs its stages."""
        return self.kernel().flag_on(self.flag.data) == self.runs_when()



@irdl_op_definition
class FlagOp(KeywordSyntax):
    """`%factored = k3s.flag <flag = STEEP, on = false>`: whether its kernel's launch sets `flag`
    (one of its `flags`) to `on` (absent: true), a compile-time constant of each launch. A guarded
    form that takes it as its guard is one form in each launch: the two launches of the backward's
    gradients kernel run one code, Triton compiling each with the other form gone."""

    name = "k3s.flag"
    flag = prop_def(StringAttr)
    on = opt_prop_def(BoolAttr)  # absent: true
    value = result_def(i1)
    traits = traits_def(HasAncestor(KernelOp), Pure())

    def runs_when(self) -> bool:
        return self.on is None or bool(self.on.value.data)

    def is_on(self) -> bool:
        """Its value in its kernel's launch."""
        return HasAncestor(KernelOp).get_ancestor(self).flag_on(self.flag.data) == self.runs_when()


@irdl_op_definition
class LaunchOp(KeywordSyntax):
    """`k3s.launch @kernel %q, %k, ...`: the entry runs the module's kernel @kernel (a symbol
    reference, printed in the symbol's place) on its values, one for each of the kernel's
    arguments, in order, of the same types."""

    name = "k3s.launch"
    SYMBOL_PROP: ClassVar[str] = "kernel"
    kernel = prop_def(FlatSymbolRefAttrConstr)
    side_stream = opt_prop_def(BoolAttr)  # true: on the side stream of the k3s.fork_streams before it
    arguments = var_operand_def()
    traits = traits_def(HasParent(EntryOp), ReferencesSymbols(kernel=KernelOp.name))

    def callee(self) -> KernelOp:
        return referenced_op(self, self.kernel)

    def runs(self, kernel: KernelOp) -> bool:
        return self.kernel.root_reference == kernel.sym_name

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), EntryOp) or not isinstance(self.parent_op().parent_op(), ModuleOp):
            return  # HasParent reports a lone op
        params = self.callee().body.block.args
        got = [v.type for v in self.arguments]
        if got != [p.type for p in params]:
            raise VerifyException(f"{self.name} {self.kernel}: passes {len(got)} values of types "
                                  f"{', '.join(map(str, got))}; the kernel takes {len(params)}: "
                                  f"{', '.join(str(p.type) for p in params)}")


# what stages read and write: an entry's arguments, and the tensors it lacks (k3s.absent_tensor)
ARGUMENT_OPS = (TensorArgOp, ScalarArgOp, AbsentTensorOp)


def argument_name(value: SSAValue) -> str | None:
    """The name of the argument a value is: an entry's tensor or scalar argument (its symbol,
    whatever the value's printed name: `%cache_1`), a tensor the entry lacks, or an outlined
    kernel's argument (outline-kernels names each after the entry value it stands for); None for
    any other value."""
    owner = value.owner
    if isinstance(owner, AbsentTensorOp):
        return value.name_hint
    if isinstance(owner, ARGUMENT_OPS):
        return owner.sym_name.data
    if isinstance(value, BlockArgument) and isinstance(owner.parent_op(), KernelOp):
        return value.name_hint
    return None


@irdl_op_definition
class LaunchByRowsOp(KeywordSyntax):
    """Block sizes of the entry's kernel @kernel for calls of at most max_rows token rows (the
    shape symbol R, known at launch): they replace the kernel's own block sizes there. A kernel's
    launch_by_rows ops follow it in increasing max_rows and the first that holds R applies; calls
    of more rows launch with the kernel's own. A backend's legalization writes them (a few rows
    spread over more programs in narrower tiles than many). hidden_slices, of a kernel with a
    hidden_slice grid axis: the slices of the hidden columns at those calls, the shape symbol HS
    (any positive count; absent: the kernel's own). `kernel = @name` refers to a kernel built in
    the entry (before outline-kernels, no symbol table holds it) or launched: the verifier looks
    for it among the entry's ops before this one."""

    name = "k3s.launch_by_rows"
    kernel = prop_def(FlatSymbolRefAttrConstr)
    max_rows = prop_def(IntegerAttr[I64])
    block_r = opt_prop_def(IntegerAttr[I64])
    block_e = opt_prop_def(IntegerAttr[I64])
    block_d = opt_prop_def(IntegerAttr[I64])
    block_n = opt_prop_def(IntegerAttr[I64])
    num_warps = opt_prop_def(IntegerAttr[I64])
    hidden_slices = opt_prop_def(IntegerAttr[I64])
    traits = traits_def(HasParent(EntryOp))

    def applies_to(self, kernel: KernelOp) -> bool:
        return self.kernel.root_reference == kernel.sym_name

    def verify_(self) -> None:
        where = f"{self.name} <kernel = {self.kernel}, max_rows = {self.max_rows.value.data}>"
        if self.max_rows.value.data < 1:
            raise VerifyException(f"{where}: max_rows must be positive")
        for key in ("block_r", "block_e", "block_d", "block_n", "num_warps"):
            size = self.properties.get(key)
            if size is not None and not is_power_of_two(size.value.data):
                raise VerifyException(f"{where}: {key} must be a power of two, got {size.value.data}")
        if self.hidden_slices is not None and self.hidden_slices.value.data < 1:
            raise VerifyException(f"{where}: hidden_slices must be positive, got {self.hidden_slices.value.data}")
        block = self.parent_block()
        if block is None:  # HasParent reports a lone op
            return
        before = list(itertools.takewhile(lambda op: op is not self, block.ops))
        if not any(isinstance(op, (KernelOp, LaunchOp)) and launched_kernel(op) == self.kernel.root_reference
                   for op in before):
            raise VerifyException(f"{where}: no kernel {self.kernel} launched before it in its entry")
        earlier = [op.max_rows.value.data for op in before
                   if isinstance(op, LaunchByRowsOp) and op.kernel == self.kernel]
        if earlier and earlier[-1] >= self.max_rows.value.data:
            raise VerifyException(f"{where}: max_rows must increase along a kernel's launch_by_rows ops")


def launched_kernel(op: KernelOp | LaunchOp) -> StringAttr:
    """The name of the kernel an entry's op runs: a kernel built in the entry, or a launch."""
    return op.kernel.root_reference if isinstance(op, LaunchOp) else op.sym_name


def launch_by_rows_ops(entry: EntryOp, kernel: KernelOp) -> list[LaunchByRowsOp]:
    """The k3s.launch_by_rows ops of an entry that apply to one of the kernels it runs, in order."""
    return [op for op in entry.body.ops if isinstance(op, LaunchByRowsOp) and op.applies_to(kernel)]


def entry_kernels(entry: EntryOp) -> list[KernelOp]:
    """The kernels an entry runs, in order: those built in it, or the callees of its launches."""
    return [op.callee() if isinstance(op, LaunchOp) else op for op in entry.body.ops
            if isinstance(op, (KernelOp, LaunchOp))]


def walk_entry(entry: EntryOp):
    """The ops of an entry and of the kernels it runs (built in it or launched)."""
    yield from entry.walk()
    for op in entry.body.ops:
        if isinstance(op, LaunchOp):
            yield from op.callee().walk()


def launching_entry(kernel: KernelOp) -> EntryOp:
    """The entry that runs a kernel: the one it was built in, or the first that launches it."""
    if not kernel.is_outlined():
        return kernel.parent_op()
    return next(entry for entry in kernel.parent_op().ops if isinstance(entry, EntryOp)
                and any(isinstance(op, LaunchOp) and op.runs(kernel) for op in entry.body.ops))


def launch_site(kernel: KernelOp) -> KernelOp | LaunchOp:
    """The op of its entry that runs a kernel: the kernel itself if built there, else its launch."""
    if not kernel.is_outlined():
        return kernel
    return next(op for op in launching_entry(kernel).body.ops if isinstance(op, LaunchOp) and op.runs(kernel))


def passed_value(value: SSAValue) -> SSAValue:
    """What a value is at run time: for an outlined kernel's argument, the entry value its (first)
    launch passes; any other value itself."""
    if isinstance(value, BlockArgument) and isinstance(value.owner.parent_op(), KernelOp):
        kernel = value.owner.parent_op()
        if kernel.is_outlined():
            return launch_site(kernel).operands[value.index]
    return value


def outlined_kernels(module: ModuleOp, pass_name: str) -> list[KernelOp]:
    """The module's kernels, for a pass that compares them as symbols: a ValueError if one is
    still built in its entry."""
    if inline := [op.sym_name.data for op in module.walk() if isinstance(op, KernelOp) and not op.is_outlined()]:
        raise ValueError(f"{pass_name}: kernels {inline} are still built in their entries; run outline-kernels first")
    return [op for op in module.ops if isinstance(op, KernelOp)]


@irdl_op_definition
class ForkStreamsOp(KeywordSyntax):
    """`k3s.fork_streams`: the launches marked `side_stream` after it, up to the k3s.join_streams,
    run on a side stream that starts after everything before the fork (on a GPU; elsewhere in
    order): they overlap the main stream's launches in between, which share no tensor they write."""

    name = "k3s.fork_streams"
    traits = traits_def(HasParent(EntryOp))


@irdl_op_definition
class JoinStreamsOp(KeywordSyntax):
    """`k3s.join_streams`: what follows waits for the side stream's launches since the fork."""

    name = "k3s.join_streams"
    traits = traits_def(HasParent(EntryOp))


def on_side_stream(launch: LaunchOp) -> bool:
    return launch.side_stream is not None and bool(launch.side_stream.value.data)
