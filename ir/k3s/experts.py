"""The MoE experts' stages, as ops on values: the dispatch plan that groups (token, slot) pairs by
expert, the projections (a program's rows against a block of a weight's output rows), the GLU,
the routing weights, the combine over a token's slots and the stores.

A pair p = t * top_k + j is token t's j-th routing slot (its expert topk_ids[t, j], its weight
topk_weights[t, j]). Where a program's rows come from is its `rows` word:
- token_block: a block of token rows (grid axis row_block);
- sorted_block: a block of block_rows positions of the expert-sorted pair list, all of one
  expert (grid axis sorted_block; the dispatch plan pads each expert's run to whole blocks);
- pair: one pair (grid axis pair), its token's row;
- token: one token (grid axis token);
- token_slots: one token's top_k slots as a tile axis (grid axis token; the slot tile is made by
  k3s.project_token_slots: o_j, m_j, o_pj = t * top_k + j).
Tiles: M the program's rows (one for pair and token), N its block of output columns. The tensors
a stage reads or writes are its operands (values of its entry's arguments).
"""

from __future__ import annotations

from xdsl.dialects.builtin import I64, BoolAttr, FloatAttr, IntegerAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import SpacedOpaqueSyntaxAttribute
from xdsl.ir import SSAValue
from xdsl.irdl import (
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    opt_result_def,
    prop_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import HasParent, MemoryReadEffect, Pure
from xdsl.utils.exceptions import VerifyException

from k3compile.ir.choices import WeightFormat, Word
from k3compile.ir.k3 import GluActivationAttr, WeightFormatAttr
from k3compile.ir.k3s.kernels import KernelOp
from k3compile.ir.k3s.types import TensorType, TileType
from k3compile.ir.syntax import KeywordSyntax


class Rows(Word):
    TOKEN_BLOCK = "token_block"
    SORTED_BLOCK = "sorted_block"
    PAIR = "pair"
    TOKEN = "token"
    TOKEN_SLOTS = "token_slots"


@irdl_attr_definition
class RowsAttr(EnumAttribute[Rows], SpacedOpaqueSyntaxAttribute):
    name = "k3s.rows"


class RowIndex(Word):
    """How a tensor's rows are indexed: by token, by pair (t * top_k + j), or by position in the
    expert-sorted pair list."""

    TOKEN = "token"
    PAIR = "pair"
    POSITION = "position"


@irdl_attr_definition
class RowIndexAttr(EnumAttribute[RowIndex], SpacedOpaqueSyntaxAttribute):
    name = "k3s.row_index"


class WeightLayout(Word):
    """Where output row n, input column c of a projection's weight is.
    dense: W[n, c] ([out, in]); expert: W[e, h * out + n, c] ([E, halves * out, in], e the
    program's expert, h the half: 0 gate, 1 up); stacked_out: shared experts' GLU weights
    [G, 2 * group, in] with out = G * group, n = s * group + f -> W[s, h * group + f, c];
    stacked_in: their down weights [G, out, group] with in = G * group, c = s * group + f ->
    W[s, n, f]."""

    DENSE = "dense"
    EXPERT = "expert"
    STACKED_OUT = "stacked_out"
    STACKED_IN = "stacked_in"


@irdl_attr_definition
class WeightLayoutAttr(EnumAttribute[WeightLayout], SpacedOpaqueSyntaxAttribute):
    name = "k3s.weight_layout"


class Packing(Word):
    """How MXFP4 weights' E2M1 codes lie in their packed tensor (docs/moe.md): nibbles, two a byte
    (fp4x2), input j of a block of 32 in byte j's low nibble and input j + 16 in its high one;
    words, eight a 32-bit word (fp4x8), placed so that two shifts and a bit-select give two codes'
    fp16 patterns (runtime/mxfp4.py's _e2m1_pair)."""

    NIBBLES = "nibbles"
    WORDS = "words"


@irdl_attr_definition
class PackingAttr(EnumAttribute[Packing], SpacedOpaqueSyntaxAttribute):
    name = "k3s.packing"


# the packed values' dtype class by packing
PACKED_DTYPES = {Packing.NIBBLES: "fp4x2", Packing.WORDS: "fp4x8"}


def _positive(op, *names: str) -> None:
    for name in names:
        value = getattr(op, name)
        if value is not None and value.value.data < 1:
            raise VerifyException(f"{op.name}: {name} must be positive, got {value.value.data}")


def _mxfp4(op) -> bool:
    return op.weight_format is not None and op.weight_format.data == WeightFormat.MXFP4


def weight_packing(op) -> Packing | None:
    """An MXFP4 projection's packing (absent: nibbles); None for weights of the input's dtype."""
    if not _mxfp4(op):
        return None
    return Packing.NIBBLES if op.packing is None else op.packing.data


def _verify_weight_format(op, layout: str) -> None:
    """MXFP4 weights: `scales` is their scales' tensor (e8m0), `weight` their packed values'
    (fp4x2 with packing nibbles, the default; fp4x8 with words), the layout is an expert's [E,
    out, in] (the packed layout's) and the input width a whole number of 32-weight blocks."""
    mxfp4 = _mxfp4(op)
    if op.packing is not None and not mxfp4:
        raise VerifyException(f"{op.name}: packing is given only with weight_format = mxfp4")
    if mxfp4 != (op.scales is not None):
        raise VerifyException(f"{op.name}: scales is given exactly for weight_format = mxfp4")
    values = PACKED_DTYPES[weight_packing(op)] if mxfp4 else None
    if mxfp4 and (op.weight.type.dtype_class, op.scales.type.dtype_class) != (values, "e8m0"):
        raise VerifyException(f"{op.name}: weight_format = mxfp4 reads {values} weights and e8m0 scales"
                              f"{' (packing = words)' if values == 'fp4x8' else ''}, got "
                              f"{op.weight.type.dtype_class} and {op.scales.type.dtype_class}")
    if mxfp4 and layout != WeightLayout.EXPERT:
        raise VerifyException(f"{op.name}: weight_format = mxfp4 needs layout = expert, got {layout}")
    if mxfp4 and op.in_dim.value.data % 32:
        raise VerifyException(f"{op.name}: weight_format = mxfp4 needs in_dim a multiple of 32 (a scale per 32 "
                              f"weights), got {op.in_dim.value.data}")


@irdl_op_definition
class CountPairsOp(KeywordSyntax):
    """Dispatch plan, step 1, over blocks of pairs: expert_counts[e] (zero-filled) counts the
    pairs routed to e (topk_ids[p]), and pair_rank[p] is p's place among them (the order pairs
    arrive in: an atomic counter; any order gives the same outputs, since each pair's rows are
    computed alone and summed per token in slot order)."""

    name = "k3s.count_pairs"
    num_experts = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    topk_ids = operand_def(TensorType)
    expert_counts = operand_def(TensorType)
    pair_rank = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _positive(self, "num_experts", "top_k")


@irdl_op_definition
class ExpertOffsetsOp(KeywordSyntax):
    """Dispatch plan, step 2, one program: expert_offsets[e] = sum over e' < e of expert e''s
    count rounded up to whole blocks of block_rows; expert_offsets[num_experts] the total, the
    sorted list's used length."""

    name = "k3s.expert_offsets"
    num_experts = prop_def(IntegerAttr[I64])
    block_rows = prop_def(IntegerAttr[I64])
    expert_counts = operand_def(TensorType)
    expert_offsets = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _positive(self, "num_experts", "block_rows")


@irdl_op_definition
class SortPairsOp(KeywordSyntax):
    """Dispatch plan, step 3, over blocks of pairs: sorted_pairs[expert_offsets[e] + pair_rank[p]]
    = p for every pair p of expert e = topk_ids[p], and block_expert[b] = e for every block b of
    e's run; the rest of sorted_pairs keeps its fill, -1 (padding rows, masked in every stage).
    With `chunk_base` (the pair-order plan, k3s.rank_pairs): expert_offsets[e] + chunk_base[c, e]
    + pair_rank[p] for p in chunk c (pairs_per_chunk pairs a chunk)."""

    name = "k3s.sort_pairs"
    top_k = prop_def(IntegerAttr[I64])
    block_rows = prop_def(IntegerAttr[I64])
    pairs_per_chunk = opt_prop_def(IntegerAttr[I64])
    topk_ids = operand_def(TensorType)
    expert_offsets = operand_def(TensorType)
    pair_rank = operand_def(TensorType)
    sorted_pairs = operand_def(TensorType)
    block_expert = operand_def(TensorType)
    chunk_base = opt_operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))

    def verify_(self) -> None:
        _positive(self, "top_k", "block_rows", "pairs_per_chunk")
        if (self.chunk_base is None) != (self.pairs_per_chunk is None):
            raise VerifyException(f"{self.name}: chunk_base and pairs_per_chunk come together (the pair-order plan)")


# the tensors a projection's rows come from, by its rows (the rest need none): the dispatch plan
# (k3s.sort_pairs) of a sorted block, and each pair's expert
ROW_TENSORS = {Rows.SORTED_BLOCK: ("expert_offsets", "sorted_pairs", "block_expert"), Rows.PAIR: ("topk_ids",)}


@irdl_op_definition
class ProjectOp(KeywordSyntax):
    """y[m, n] = sum_c a[m, c] W[n, c] in fp32 for the program's rows m (`rows`) and its block of
    output columns n < out_dim, c < in_dim; a is `input`'s row of each m (`input_index`: its
    token's, its pair's or its sorted position's), W is `weight` in `layout`. With glu, two
    results: the gate half (h = 0) and the up half (h = 1) of the weight's rows, from one pass
    over a. With rms_eps, a's rows are RMS-normalised first, a[m, c] * gain[c] /
    sqrt(mean_c a[m, c]^2 + rms_eps), gain the `gain` tensor. Padded rows give 0.
    weight_format = mxfp4 (layout expert): `weight` holds W's E2M1 codes two a byte and `scales`
    its E8M0 scales (docs/moe.md's layout), dequantised in registers to a's dtype.

    Operands: input, weight, then the tensors its properties ask for (`tensors`), in this order:
    scales (weight_format = mxfp4), gain (rms_eps), and those its rows come from (ROW_TENSORS):
    rows = sorted_block, the dispatch plan's expert_offsets, sorted_pairs and block_expert; rows =
    pair, topk_ids (each pair's expert)."""

    name = "k3s.project"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    rows = prop_def(RowsAttr)
    input_index = prop_def(RowIndexAttr)
    layout = prop_def(WeightLayoutAttr)
    glu = prop_def(BoolAttr)
    group = opt_prop_def(IntegerAttr[I64])  # a stacked layout's rows (or columns) per shared expert
    block_rows = opt_prop_def(IntegerAttr[I64])  # rows = sorted_block: the dispatch plan's block
    rms_eps = opt_prop_def(FloatAttr)
    weight_format = opt_prop_def(WeightFormatAttr)  # absent: the input's float dtype
    packing = opt_prop_def(PackingAttr)  # mxfp4's; absent: nibbles
    input = operand_def(TensorType)
    weight = operand_def(TensorType)
    tensors = var_operand_def(TensorType)
    result = result_def(TileType)
    up = opt_result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def tensor_roles(self) -> list[str]:
        """What its operands after input and weight are, in order, as its properties ask."""
        return ((["scales"] if _mxfp4(self) else []) + (["gain"] if self.rms_eps is not None else [])
                + list(ROW_TENSORS.get(self.rows.data, ())))

    def named_tensors(self) -> dict[str, SSAValue]:
        return dict(zip(self.tensor_roles(), self.tensors, strict=True))

    @property
    def scales(self) -> SSAValue | None:
        return self.named_tensors().get("scales")

    @property
    def gain(self) -> SSAValue | None:
        return self.named_tensors().get("gain")

    def verify_(self) -> None:
        roles = self.tensor_roles()
        if len(self.tensors) != len(roles):
            raise VerifyException(f"{self.name}: after input and weight it reads {len(roles)} tensors "
                                  f"({', '.join(roles) or 'none'}: by its properties), got {len(self.tensors)}")
        _positive(self, "in_dim", "out_dim", "group", "block_rows")
        _verify_weight_format(self, self.layout.data)
        if bool(self.glu.value.data) != (self.up is not None):
            raise VerifyException(f"{self.name}: a glu projection has two results (gate, up), another one")
        if (self.group is not None) != (self.layout.data in (WeightLayout.STACKED_OUT, WeightLayout.STACKED_IN)):
            raise VerifyException(f"{self.name}: group is given exactly for the stacked layouts")
        if (self.block_rows is not None) != (self.rows.data == Rows.SORTED_BLOCK):
            raise VerifyException(f"{self.name}: block_rows is given exactly for rows = sorted_block")
        if self.rms_eps is not None and self.scales is not None:
            raise VerifyException(f"{self.name}: rms_eps is for the dense latent up-projection, not mxfp4 weights")
        if self.rms_eps is not None and self.rows.data in (Rows.PAIR, Rows.TOKEN):
            raise VerifyException(f"{self.name}: an RMS-normalised input needs a block of rows, not rows = {self.rows.data}")


@irdl_op_definition
class ProjectSlotsOp(KeywordSyntax):
    """The token-centric combine of the down projections: y[n] = sum_j topk_weights[t, j] sum_c
    a[t * top_k + j, c] W[e_j, n, c] in fp32 for the program's token t (rows = token) over its
    top_k slots j in order, e_j = topk_ids[t, j]; a is `input` (rows by pair), W is `weight`
    ([E, out_dim, in_dim]; with weight_format = mxfp4 packed, its scales `scales`, as
    k3s.project's), the routing's `topk_ids` and `topk_weights` [R, top_k]."""

    name = "k3s.project_slots"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    weight_format = opt_prop_def(WeightFormatAttr)
    packing = opt_prop_def(PackingAttr)  # mxfp4's; absent: nibbles
    input = operand_def(TensorType)
    topk_ids = operand_def(TensorType)
    topk_weights = operand_def(TensorType)
    weight = operand_def(TensorType)
    scales = opt_operand_def(TensorType)  # weight_format = mxfp4
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _positive(self, "in_dim", "out_dim", "top_k")
        _verify_weight_format(self, WeightLayout.EXPERT)


@irdl_op_definition
class GluOp(KeywordSyntax):
    """act(g, u) elementwise in fp32: swiglu silu(g) u; situ_glu 4 tanh(g / 4) sigmoid(g) 25
    tanh(u / 25)."""

    name = "k3s.glu"
    activation = prop_def(GluActivationAttr)
    gate = operand_def(TileType)
    up = operand_def(TileType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), Pure())


@irdl_op_definition
class WeighPairsOp(KeywordSyntax):
    """y[m, n] * topk_weights of row m's pair: the routing weight applied to each pair's rows
    (`topk_weights` [R, top_k], read flat by pair)."""

    name = "k3s.weigh_pairs"
    value = operand_def(TileType)
    topk_weights = operand_def(TensorType)
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())


@irdl_op_definition
class SumSlotsOp(KeywordSyntax):
    """y[m, n] = sum_j `input`[m * top_k + j, n] in fp32, j over the top_k slots in order: the
    expert-centric combine of a token's weighted expert outputs (rows = token_block)."""

    name = "k3s.sum_slots"
    input = operand_def(TensorType)
    out_dim = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _positive(self, "out_dim", "top_k")


@irdl_op_definition
class StoreRowsOp(KeywordSyntax):
    """`tensor`[row of m, n] = y[m, n] (in the tensor's dtype) for the program's rows (`rows`),
    each row indexed per `index`; with
    accumulate, `tensor`[.., n] + y[m, n] (the sum in fp32). Padded rows and columns are not
    written."""

    name = "k3s.store_rows"
    rows = prop_def(RowsAttr)
    index = prop_def(RowIndexAttr)
    width = prop_def(IntegerAttr[I64])
    accumulate = prop_def(BoolAttr)
    value = operand_def(TileType)
    tensor = operand_def(TensorType)
    traits = traits_def(HasParent(KernelOp))


@irdl_op_definition
class ProjectTokenSlotsOp(KeywordSyntax):
    """The warp plan's GLU stage (token-centric, split by output neurons): y[j, n] = sum_c a[t, c]
    W[e_j, h * out_dim + n, c] in fp32 for the program's token t (grid axis token), each of its
    top_k slots j a row of a `slots`-wide tile axis (top_k padded to a power of two; padded
    slots read nothing and give 0), e_j = topk_ids[t, j], over its block of output columns n: a
    [slots, BN, BD] weight tile a step, every slot's rows streamed whole along c. glu: the gate
    (h = 0) and up (h = 1) halves, two results. `input` rows by token, `weight` [E, halves *
    out_dim, in_dim]; with weight_format = mxfp4 packed (packing = words only), its scales
    `scales`, as k3s.project's."""

    name = "k3s.project_token_slots"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64])  # the slot axis' tile width
    glu = prop_def(BoolAttr)
    weight_format = opt_prop_def(WeightFormatAttr)
    packing = opt_prop_def(PackingAttr)
    input = operand_def(TensorType)
    topk_ids = operand_def(TensorType)
    weight = operand_def(TensorType)
    scales = opt_operand_def(TensorType)  # weight_format = mxfp4
    result = result_def(TileType)
    up = opt_result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _positive(self, "in_dim", "out_dim", "top_k", "slots")
        _verify_slot_tile(self, whole=True)
        _verify_weight_format(self, WeightLayout.EXPERT)
        _verify_words_only(self)
        if bool(self.glu.value.data) != (self.up is not None):
            raise VerifyException(f"{self.name}: a glu projection has two results (gate, up), another one")


@irdl_op_definition
class SumExpertRowsOp(KeywordSyntax):
    """The warp plan's down projection and combine (WarpDecode): y[n] = sum_j topk_weights[t, j]
    sum_c a[t * top_k + j, c] W[e_j, n, c] in fp32 for the program's token t and block of output
    rows n, the token's slots j in teams of `slots` (a tile axis: a [slots, BN, BD] weight tile
    a step, each slot's row read whole along c, its activations weighted on load), accumulated
    over the teams in a [slots, BN] fp32 register tile and reduced over the slot axis at the end:
    no per-pair buffer, no combine. `input` rows by pair, `weight` [E, out_dim, in_dim]; with
    weight_format = mxfp4 packed (packing = words only), its scales `scales`."""

    name = "k3s.sum_expert_rows"
    in_dim = prop_def(IntegerAttr[I64])
    out_dim = prop_def(IntegerAttr[I64])
    top_k = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64])  # a team's slots
    weight_format = opt_prop_def(WeightFormatAttr)
    packing = opt_prop_def(PackingAttr)
    input = operand_def(TensorType)
    topk_ids = operand_def(TensorType)
    topk_weights = operand_def(TensorType)
    weight = operand_def(TensorType)
    scales = opt_operand_def(TensorType)  # weight_format = mxfp4
    result = result_def(TileType)
    traits = traits_def(HasParent(KernelOp), MemoryReadEffect())

    def verify_(self) -> None:
        _positive(self, "in_dim", "out_dim", "top_k", "slots")
        _verify_slot_tile(self, whole=False)
        _verify_weight_format(self, WeightLayout.EXPERT)
        _verify_words_only(self)


def _verify_slot_tile(op, whole: bool) -> None:
    """The slot axis is a power of two (a tile axis); whole: it holds every slot."""
    slots, top_k = op.slots.value.data, op.top_k.value.data
    if slots & (slots - 1):
        raise VerifyException(f"{op.name}: slots must be a power of two (a tile axis), got {slots}")
    if whole and slots < top_k:
        raise VerifyException(f"{op.name}: slots must hold every one of the top_k = {top_k} slots, got {slots}")


def _verify_words_only(op) -> None:
    """The warp plan's stages read MXFP4 weights in the words layout (a slot tile's rows
    dequantised by extraction), not nibbles."""
    if weight_packing(op) == Packing.NIBBLES:
        raise VerifyException(f"{op.name}: weight_format = mxfp4 is read here in packing = words, got nibbles")


# the stages that read the routed experts' weights (MXFP4 ones with scales and a packing)
EXPERT_WEIGHT_READERS = (ProjectOp, ProjectSlotsOp, ProjectTokenSlotsOp, SumExpertRowsOp)


def mxfp4_packing(module) -> Packing | None:
    """The packing of the MXFP4 weights a module's stages read (None: no MXFP4 weights); one per
    module: its pack_expert_weights packs in it."""
    found = {weight_packing(op) for op in module.walk() if isinstance(op, EXPERT_WEIGHT_READERS)} - {None}
    if len(found) > 1:
        raise VerifyException(f"MXFP4 weights read in packings {', '.join(sorted(found))} in one module; "
                              "its pack_expert_weights packs one")
    return next(iter(found), None)


MOE_EXPERT_STAGES = [CountPairsOp, ExpertOffsetsOp, SortPairsOp, ProjectOp, ProjectSlotsOp, GluOp, WeighPairsOp,
                     SumSlotsOp, StoreRowsOp, ProjectTokenSlotsOp, SumExpertRowsOp]
MOE_EXPERT_ATTRS = [RowsAttr, RowIndexAttr, WeightLayoutAttr, PackingAttr]
