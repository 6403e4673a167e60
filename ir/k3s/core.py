"""What every k3s schedule's entries are made of: the entries (the compiled module's Python
functions), their arguments (values the kernels they launch read and write) and the tensors an
entry lacks; and how an op refers to another op of the module (ReferencesSymbols: a symbol
reference, verified by lookup). Kernels and their launches are in kernels.py; the types of
values in types.py."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import (I64, ArrayAttr, FlatSymbolRefAttrConstr, Float32Type, FloatAttr, IntAttr,
                                   IntegerAttr, StringAttr, SymbolRefAttr)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Operation, SpacedOpaqueSyntaxAttribute
from xdsl.irdl import (
    irdl_attr_definition,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
)
from xdsl.traits import (HasParent, IsolatedFromAbove, NoTerminator, SymbolOpInterface, SymbolTable,
                         SymbolUserOpInterface)
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import Word
from k3compile.ir.k3s.types import TensorType
from k3compile.ir.syntax import KeywordSyntax


class ArgRole(Word):
    INPUT = "input"
    OPTIONAL_INPUT = "optional_input"
    FORBIDDEN = "forbidden"
    OUTPUT = "output"
    OPTIONAL_OUTPUT = "optional_output"
    WORKSPACE = "workspace"
    INOUT = "inout"
    COMBINED = "combined"


@irdl_attr_definition
class ArgRoleAttr(EnumAttribute[ArgRole], SpacedOpaqueSyntaxAttribute):
    name = "k3s.arg_role"


class ArgPurpose(Word):
    """What a tensor argument means to its entry's host code beyond its shape and dtype: the
    checks and launch sizes the printer derives from it, read from this word and never from the
    argument's name."""

    SEQUENCE_OFFSETS = "sequence_offsets"  # where each sequence of a varlen batch starts (cu_seqlens)
    STATE_SLOTS = "state_slots"  # each sequence's row of a state pool, or -1 (padding)
    ACCEPTED_COUNTS = "accepted_counts"  # each sequence's accepted draft tokens: 0..the draft depth
    DRAFT_STATES = "draft_states"  # per pool row, one entry per draft token: [P, depth, ...]


@irdl_attr_definition
class ArgPurposeAttr(EnumAttribute[ArgPurpose], SpacedOpaqueSyntaxAttribute):
    name = "k3s.arg_purpose"


# the dtype class each purpose's argument must have (DRAFT_STATES: any); an offsets tensor
# needs SEQUENCE_OFFSETS, so no pass can create one the printer would not recognise
PURPOSE_DTYPE_CLASSES = {ArgPurpose.SEQUENCE_OFFSETS: "offsets", ArgPurpose.STATE_SLOTS: "index",
                         ArgPurpose.ACCEPTED_COUNTS: "index"}


@dataclass(frozen=True)
class ReferencesSymbols(SymbolUserOpInterface):
    """An op whose properties refer to other ops of the module (flat symbol references: `kernel =
    @kda_chunk_prepare`, or lists of them), each to an op of one kind: an op name (`k3s.kernel`) or a dialect (`k3`:
    the layer op an entry was lowered from). Verified as MLIR verifies symbol uses: each is looked
    up in the nearest symbol table above the op (the module); an op outside one is left alone,
    as HasParent leaves a lone op."""

    kinds: tuple[tuple[str, str], ...]  # (property, the op name or dialect it refers to)

    def __init__(self, **kinds: str):
        object.__setattr__(self, "kinds", tuple(kinds.items()))

    def verify(self, op: Operation) -> None:
        table = op.parent_op()
        while table is not None and not table.has_trait(SymbolTable):
            table = table.parent_op()
        if table is None:
            return
        where = op.name + (f" @{op.properties['sym_name'].data}" if "sym_name" in op.properties else "")
        for key, kind in self.kinds:
            if (value := op.properties.get(key)) is None:
                continue  # an optional reference left out
            for reference in value.data if isinstance(value, ArrayAttr) else [value]:  # a list: each of its items
                target = SymbolTable.lookup_symbol(table, reference)
                if target is None:
                    raise VerifyException(f"{where}: {key} = {reference}: the module has no symbol {reference}")
                if kind not in (target.name, target.dialect_name()):
                    raise VerifyException(f"{where}: {key} = {reference} is a {target.name}, not a "
                                          f"{kind if '.' in kind else kind + ' op'}")


def referenced_op(op: Operation, reference: SymbolRefAttr) -> Operation:
    """The op of the module a (verified) reference of op refers to."""
    target = SymbolTable.lookup_symbol(op, reference)
    if target is None:
        raise VerifyException(f"{op.name}: the module has no symbol {reference}")
    return target


@irdl_op_definition
class EntryOp(KeywordSyntax):
    """A Python function of the compiled module: checks its arguments, launches its kernels."""

    name = "k3s.entry"
    sym_name = prop_def(StringAttr)
    source = prop_def(FlatSymbolRefAttrConstr)  # the k3 op this entry was lowered from
    max_sources = opt_prop_def(IntegerAttr[I64])  # upper bound on the shape symbol S
    max_tokens = opt_prop_def(IntegerAttr[I64])  # upper bound on the shape symbol T
    body = region_def("single_block")
    traits = traits_def(SymbolOpInterface(), NoTerminator(), IsolatedFromAbove(), ReferencesSymbols(source="k3"))

    def layer(self) -> Operation:
        """The k3 op it was lowered from."""
        return referenced_op(self, self.source)


@irdl_op_definition
class EntryByRowsOp(KeywordSyntax):
    """A Python function of the compiled module that calls one of its entries (which take the
    same arguments), chosen by its `schedule` argument: an entry by its word (words[i] names
    entries[i], e.g. "decode" for @moe_decode), or "auto" by the row count R of the first
    argument through a table of row buckets: bucket i holds R <= max_rows[i] (above the previous
    bound), the last bucket every larger R, and by_rows[i] is the entry bucket i calls (one more
    than max_rows). A pass writes the table (lower-moe-experts' dispatch option), a tuner
    through it."""

    name = "k3s.entry_by_rows"
    sym_name = prop_def(StringAttr)
    source = prop_def(FlatSymbolRefAttrConstr)  # the k3 op its entries were lowered from
    entries = prop_def(ArrayAttr)  # [@moe_decode, @moe_prefill]: the entries it may call
    words = prop_def(ArrayAttr)  # ["decode", "prefill"]: what `schedule` names each by
    max_rows = prop_def(ArrayAttr)  # [4]: the buckets' upper bounds, increasing
    by_rows = prop_def(ArrayAttr)  # [@moe_decode, @moe_prefill]: each bucket's entry
    traits = traits_def(SymbolOpInterface(),
                        ReferencesSymbols(source="k3", entries=EntryOp.name, by_rows=EntryOp.name))

    def verify_(self) -> None:
        where = f"{self.name} @{self.sym_name.data}"
        entries, words, bounds = self.entries.data, self.words.data, self.max_rows.data
        if not entries or len(words) != len(entries):
            raise VerifyException(f"{where}: expected one word per entry and at least one entry, got "
                                  f"{len(words)} word(s) for {len(entries)} entries")
        if not all(isinstance(word, StringAttr) for word in words) or len({w.data for w in words}) != len(words):
            raise VerifyException(f"{where}: words must be distinct strings")
        if not all(isinstance(bound, IntegerAttr) for bound in bounds):
            raise VerifyException(f"{where}: max_rows must be a list of integers")
        values = [bound.value.data for bound in bounds]
        if any(value < 1 for value in values) or any(b <= a for a, b in zip(values, values[1:])):
            raise VerifyException(f"{where}: max_rows must be positive and increasing, got {values}")
        if len(self.by_rows.data) != len(bounds) + 1:
            raise VerifyException(f"{where}: by_rows needs one entry per bucket ({len(bounds) + 1}: max_rows' "
                                  f"{len(bounds)} and the rows above), got {len(self.by_rows.data)}")
        if missing := [str(entry) for entry in self.by_rows.data if entry not in entries]:
            raise VerifyException(f"{where}: by_rows names {', '.join(missing)}, not among its entries")

    def buckets(self) -> list[tuple[int | None, str]]:
        """(the bucket's most rows, None for the last; its entry's word), in order."""
        word_of = {entry: word.data for entry, word in zip(self.entries.data, self.words.data)}
        bounds = [bound.value.data for bound in self.max_rows.data] + [None]
        return [(most, word_of[entry]) for most, entry in zip(bounds, self.by_rows.data)]


@irdl_op_definition
class TensorArgOp(KeywordSyntax):
    """A tensor argument: its type (shape pattern and dtype class, `!k3s.tensor<B x T x 32 x 128,
    float>`) and whether the caller passes it.

    Roles: input (required), optional_input (may be None), forbidden (must be None: the
    member has no such input, e.g. g of DeltaNet), output / optional_output (allocated by
    the entry; an optional one only when the caller passes output_<name>=True), workspace
    (allocated by the entry for kernels to pass data between them; not returned), inout (passed
    in and updated in place, e.g. a state pool), combined (the states an entry's summary_combine
    step makes between its kernels: the entering state of every segment; absent to the kernels
    before that step). Dtype classes:
    float (bf16, fp16 or fp32; outputs take the dtype of the entry's first input), float32,
    offsets (cu_seqlens: int32/int64, starting at 0, non-decreasing, ending at B*T, with B = 1),
    state (fp32 or bf16 state storage), index (int32/int64 slot numbers; an output of indices,
    e.g. chosen experts, is int32), fp4x2 (uint8: two E2M1 codes a byte, MXFP4 weights' values),
    fp4x8 (int32: eight E2M1 codes a 32-bit word, MXFP4 weights' values in the words layout) and
    e8m0 (uint8: their power-of-two scales 2^(s - 127)).
    """

    name = "k3s.tensor_arg"
    sym_name = prop_def(StringAttr)
    role = prop_def(ArgRoleAttr)
    # what the host code reads it as (ArgPurpose); absent: data the kernels alone interpret
    purpose = opt_prop_def(ArgPurposeAttr)
    # another argument of the entry this one must not overlap in memory (a kernel reads one while
    # writing the other): `distinct_from = @cache`
    distinct_from = opt_prop_def(FlatSymbolRefAttrConstr)
    # a workspace's value before the kernels run (a counter's 0, a padding marker's -1); absent: any
    fill = opt_prop_def(IntegerAttr[I64])
    # the argument whose dtype a `float` tensor the entry allocates takes (`dtype_of = @q`): the
    # Triton backend's (lower-to-triton), read by its printer
    dtype_of = opt_prop_def(FlatSymbolRefAttrConstr)
    tensor = result_def(TensorType)  # the value kernels launched from the entry are passed
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))

    @property
    def type(self) -> TensorType:
        return self.tensor.type

    def verify_(self) -> None:
        where = f"{self.name} @{self.sym_name.data}"
        purpose = self.purpose.data if self.purpose is not None else None
        dtype_class = self.type.dtype_class
        if dtype_class == "offsets" and purpose != ArgPurpose.SEQUENCE_OFFSETS:
            raise VerifyException(f"{where}: an offsets tensor needs purpose = sequence_offsets")
        if (wanted := PURPOSE_DTYPE_CLASSES.get(purpose)) is not None and dtype_class != wanted:
            raise VerifyException(f"{where}: purpose = {purpose.value} needs dtype class {wanted}, got {dtype_class}")
        if purpose == ArgPurpose.DRAFT_STATES and len(self.type.dims) < 2:
            raise VerifyException(f"{where}: purpose = draft_states needs [P, depth, ...], got [{self.type.pattern}]")
        if self.dtype_of is not None and (block := self.parent_block()) is not None:
            source = self.dtype_of.root_reference.data
            given = {op.sym_name.data: op for op in block.ops if isinstance(op, TensorArgOp)}.get(source)
            if (self.role.data not in ("output", "optional_output", "workspace") or dtype_class != "float"
                    or given is None or given.role.data not in ("input", "optional_input", "inout")
                    or given.type.dtype_class != "float"):
                raise VerifyException(f"{where}: dtype_of = @{source}: a float tensor the entry allocates takes the "
                                      f"dtype of a float tensor the caller passes")
        if self.distinct_from is not None and (block := self.parent_block()) is not None:
            other = self.distinct_from.root_reference.data
            arguments = {op.sym_name.data for op in block.ops if isinstance(op, TensorArgOp) and op is not self}
            if other not in arguments:
                raise VerifyException(f"{where}: distinct_from = @{other}: its entry has no other tensor argument "
                                      f"@{other}")


@irdl_op_definition
class ScalarArgOp(KeywordSyntax):
    """A float argument with a default (e.g. the recurrence's scale)."""

    name = "k3s.scalar_arg"
    sym_name = prop_def(StringAttr)
    default = prop_def(FloatAttr)
    scalar = result_def(Float32Type)
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))


@irdl_op_definition
class CheckpointArgOp(KeywordSyntax):
    """Optional states along the sequence (prefix caching): the argument `checkpoint_every`
    (None, or a positive multiple of `chunk_size`) and, when given, one more returned tensor
    `checkpoints` of the states after every checkpoint_every tokens of each sequence, shaped
    [N, T // every, *state_shape] (varlen: [sum of len_n // every, *state_shape], in sequence
    order); state_shape is one sequence's state, `[32, 128, 128]`."""

    name = "k3s.checkpoint_arg"
    sym_name = prop_def(StringAttr)
    chunk_size = prop_def(IntegerAttr[I64])
    state_shape = prop_def(ArrayAttr[IntAttr])
    traits = traits_def(SymbolOpInterface(), HasParent(EntryOp))

    @property
    def state_dims(self) -> tuple[int, ...]:
        return tuple(size.data for size in self.state_shape.data)

    def verify_(self) -> None:
        if not self.state_dims or min(self.state_dims) <= 0:
            raise VerifyException(f"{self.name}: state_shape must be positive sizes, got {list(self.state_dims)}")


@irdl_op_definition
class AbsentTensorOp(KeywordSyntax):
    """A tensor its entry does not have, passed (as None) to a kernel argument that only stages
    its launch skips read (the chunk prepare's q, launched from segment_summary with its query
    stages guarded off)."""

    name = "k3s.absent_tensor"
    tensor = result_def(TensorType)
    traits = traits_def(HasParent(EntryOp))
