"""What the printer's parts share: the code buffer, a view of an entry's arguments, names and
the constants that the IR's attributes are printed with (the printer decides nothing here: a
property lower-to-triton writes is read through chosen(), which names that pass if it is
missing)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from xdsl.dialects.builtin import IntegerAttr
from xdsl.ir import Operation, OpResult, SSAValue

from k3compile.ir import k3s
from k3compile.ir.syntax import attr_to_literal

ENTRY_PARTS = (k3s.TensorArgOp, k3s.ScalarArgOp, k3s.CheckpointArgOp, k3s.AbsentTensorOp, k3s.KernelOp,
               k3s.LaunchOp, k3s.SummaryCombineOp, k3s.LaunchByRowsOp, k3s.ForkStreamsOp, k3s.JoinStreamsOp,
               k3s.SizeOp, k3s.SizeByRowsOp, k3s.BindSizeOp, k3s.LaunchSizeOp)
# the dialect of the index arithmetic of an entry's host sizes (printed by the k3s.bind_size they end in)
HOST_ARITH_DIALECT = "arith."
# index arithmetic as Python: (format, whether the result is a sum, which a product parenthesises)
HOST_ARITH = {"arith.muli": ("{} * {}", False), "arith.addi": ("{} + {}", True),
              "arith.ceildivsi": ("triton.cdiv({}, {})", False), "arith.minsi": ("min({}, {})", False)}
# the pass that turns each kind of schedule into kernels
KERNEL_GROUPINGS = {"k3s.chunked": "add fuse-chunkwise after derive-chunkwise"}
# the constexprs that a k3s.launch_by_rows's block sizes set at launch
BLOCK_CONSTANTS = {"block_r": "BR", "block_e": "BE", "block_d": "BD", "block_n": "BN"}


def host_expression(value: SSAValue, product: bool = False) -> str:
    """An index value of an entry's host sizes as one Python expression over dims[...]."""
    op = value.owner
    if isinstance(op, k3s.SizeOp):
        return f'dims["{op.symbol.data.value}"]'
    if op.name == "arith.constant":
        return str(op.value.value.data)
    form, is_sum = HOST_ARITH[op.name]
    inner = op.name == "arith.muli"
    text = form.format(*(host_expression(v, inner) for v in op.operands))
    return f"({text})" if is_sum and product else text


def pipelined_range(op: Operation, start: str, stop: str, step: str | None = None) -> str:
    """A loop of op's kernel (over tokens, sources, blocks of columns): its kernel's num_stages
    asks Triton to load the next iterations' rows while this one computes (it pipelines a loop
    without matrix products only when the loop itself says so)."""
    kernel = op.parent_op()
    while not isinstance(kernel, k3s.KernelOp):
        kernel = kernel.parent_op()
    bounds = f"{start}, {stop}" + (f", {step}" if step is not None else "")
    if kernel.num_stages is None:
        return f"range({bounds})"
    return f"tl.range({bounds}, num_stages={kernel.num_stages.value.data})"




# --- each op's part of its kernel's compile-time constants ----------------------------------
# An op interface of the printer, one function per op type (as legalize-triton's @block_sizes_of
# keeps each op's block sizes): Kernels.kernel_constants asks a kernel's ops in program order; a
# later op's constant of the same name replaces an earlier's. An op whose code reads no constant
# of its own registers none. tests/test_op_interfaces.py checks that every name a printed kernel
# reads is defined (a parameter, a constant, a run-time size or a module global), naming the op
# whose code reads one that is not.
KERNEL_CONSTANTS: dict[type[Operation], Callable[..., dict[str, int | str]]] = {}


def kernel_constants_of(*op_types: type[Operation]) -> Callable:
    """Register f(printer, op, kernel, view) -> the compile-time constants (name -> value) that
    op's code reads: its sizes, the block sizes legalize-triton fixed (kernel.block_k, ...), the
    sizes of the entry's arguments (view: its EntryView). Written as a printer method, so that it
    may use the printer's helpers."""
    def register(function: Callable) -> Callable:
        if twice := [t.name for t in op_types if KERNEL_CONSTANTS.get(t, function) is not function]:
            raise ValueError(f"{', '.join(twice)}: kernel constants registered twice")
        KERNEL_CONSTANTS.update(dict.fromkeys(op_types, function))
        return function

    return register


# k3s.kernel <dots = ...> as its launch's DOT constexpr of the runtime prelude's _mm (Triton's
# input_precision); input: _DOT_OF_DTYPE of the dtype of the entry's first tensor (its inputs')
DOT_PRECISION = {k3s.KernelDots.FP32: "'ieee'", k3s.KernelDots.TF32X3: "'tf32x3'",
                 k3s.KernelDots.INPUT: "_DOT_OF_DTYPE[{first}.dtype]"}


def block_constant(block: IntegerAttr | k3s.RuntimeBlockAttr) -> int | str:
    """A kernel's block size as its launch sets it (legalize-triton's): a fixed size, or the
    expression of the call's sizes that a k3s.runtime_block stands for."""
    if not isinstance(block, k3s.RuntimeBlockAttr):
        return block.value.data
    padded = f'triton.next_power_of_2(dims["{block.size.data.value}"])'
    return padded if block.least.data == 1 else f"max({block.least.data}, {padded})"


def chosen(op: Operation, name: str):
    """op's property `name`, which lower-to-triton writes (a ValueError where it did not run)."""
    if (value := op.properties.get(name)) is None:
        raise ValueError(f"{describe(op)} reached the Triton printer without lower-to-triton (no {name})")
    return value


# how a program indexes each axis of a tensor's layout (k3s.layout, lower-to-triton's): the index
# of a row axis (the token rows': those of the loop the stage is printed in); a column's extent
# as the kernel names it, its offsets and their mask
LAYOUT_ROWS = {k3s.LayoutAxis.CHUNK: "start // BC + i_n", k3s.LayoutAxis.HEAD: "i_hv", k3s.LayoutAxis.KEY_HEAD: "i_h",
               k3s.LayoutAxis.CHECKPOINT: "slot"}
LAYOUT_COLUMNS = {"K": ("K", "o_k", "m_k"), "V": ("V", "o_v", "m_v"), "C": ("BC", "o_c", None)}
BROADCASTS = {1: ("",), 2: ("[:, None]", "[None, :]")}
# the token rows of a chunk and their mask; a token loop's one token has no mask
CHUNK_ROWS, TOKEN_ROW = ("t_c", "m_c"), ("t", None)


def horner(terms: list[tuple[str, str]]) -> str:
    """(index, extent) pairs, outermost first, as ((i0 * e1 + i1) * e2 + i2): row-major."""
    text = terms[0][0]
    for index, extent in terms[1:]:
        text = f"{f'({text})' if ' + ' in text else text} * {extent} + {index}"
    return text


def tensor_address(op: Operation, tensor: SSAValue | str | None = None, rows: tuple[str, str | None] = CHUNK_ROWS,
                   part: str | None = None, layout: str = "layout", tile: SSAValue | None = None) -> tuple[str, str]:
    """(the address of this program's rows in the tensor op reads or writes, `tensor` (a value,
    or the name of what its kernel takes besides its arguments), else op's workspace; their
    mask, "" for none), printed from the layout lower-to-triton wrote on op (its property
    `layout`); `rows`: the token rows' index and mask (one token: no mask); `part`: the index of a
    value-block parts axis. The token rows and the columns are the axes of the tile, broadcast
    against each other in the tile's order (`tile`'s dimensions; else the layout's columns')."""
    layout = chosen(op, layout)
    axes = [(axis, extent) for axis, extent in layout.items if axis != k3s.LayoutAxis.COLUMN]
    widths = [extent for axis, extent in layout.items if axis == k3s.LayoutAxis.COLUMN]  # the strides' order
    order = list(k3s.tile_dims(tile)) if tile is not None else widths  # the tile's: the broadcasts' order
    token, token_mask = rows
    per_token = axes[0][0] == k3s.LayoutAxis.TOKEN and token_mask is not None  # the token rows a vector
    vectors = [(None, token, token_mask)] * per_token + [LAYOUT_COLUMNS[d] for d in order]  # (extent, offsets, mask)
    broadcast = BROADCASTS[len(vectors)] if vectors else ()
    index = {**LAYOUT_ROWS, k3s.LayoutAxis.PART: part,
             k3s.LayoutAxis.TOKEN: token + (broadcast[0] if per_token else "")}
    address = horner([(index[axis], extent) for axis, extent in axes])
    if widths:
        columns = [LAYOUT_COLUMNS[d] for d in widths]
        offsets = horner([(o + broadcast[per_token + order.index(d)], width)
                          for d, (width, o, _) in zip(widths, columns, strict=True)])
        address = f"{f'({address})' if ' + ' in address else address} * {' * '.join(w for w, _, _ in columns)} + {offsets}"
    mask = " & ".join(m + b for (_, _, m), b in zip(vectors, broadcast, strict=True) if m is not None)
    name = tensor if isinstance(tensor, str) else tensor_name(op.workspace if tensor is None else tensor)
    return f"{name} + {address}", mask


def value_block_count(op: Operation) -> int:
    """The number of value blocks (NVB) whose parts op's workspace holds: its layout's part axis."""
    return int(next(extent for axis, extent in chosen(op, "layout").items if axis == k3s.LayoutAxis.PART))


def launch_table_name(entry: str) -> str:
    return f"TUNED_{entry.upper()}"


def register(value: SSAValue) -> str:
    """The register a value lives in: its name; a result an op updates in place (IN_PLACE) lives
    in its operand's register, and a loop's results in its carried block arguments' registers."""
    if isinstance(value, OpResult):
        owner = value.op
        if value.index in getattr(owner, "IN_PLACE", {}):
            return register(owner.operands[owner.IN_PLACE[value.index]])
        if owner.regions and owner.regions[0].blocks:  # a loop's result: what it carried
            return register(owner.regions[0].block.args[value.index])
    if not value.name_hint:  # the passes name every value they make
        raise ValueError(f"a value of {value.owner} reached the Triton printer without a name")
    return f"b_{value.name_hint}"


def chunk_rows(op: Operation) -> int:
    """The chunk size of the kernel an op is in (its chunk tile's or chunk loop's)."""
    kernel = op
    while not isinstance(kernel, k3s.KernelOp):
        kernel = kernel.parent_op()
    return next(o.chunk_size.value.data for o in kernel.body.ops if isinstance(o, (k3s.ChunkTileOp, k3s.ChunkLoopOp)))


def tensor_name(value: SSAValue) -> str:
    """The Python name of a tensor (or scalar) argument a stage reads or writes: the argument's."""
    return k3s.argument_name(value)


# the roles of the tensors a caller may leave out (a combined tensor is None until the entry's combine
# step: kernels before it see it absent); kernels read them under their HAS_<NAME> constexpr
OPTIONAL_ROLES = ("optional_input", "optional_output", "combined")


def presence_flag(value: SSAValue) -> str | None:
    """HAS_<NAME>, the constexpr saying whether an optional tensor argument was passed; None for
    a tensor every call has."""
    value = k3s.passed_value(value)
    owner = value.owner
    if isinstance(owner, k3s.TensorArgOp) and owner.role.data in OPTIONAL_ROLES:
        return f"HAS_{tensor_name(value).upper()}"
    return None


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def describe(op: Operation) -> str:
    """`%A = k3s.gram %k, %k, %G, %beta <mask = strict, ...>`: the op as a one-line comment, its
    values by name, without its regions."""
    items = [f"{k} = {attr_to_literal(v)}" for k, v in op.keyword_items()]
    symbol = f" @{op.properties['sym_name'].data}" if "sym_name" in op.properties else ""
    results = ", ".join(f"%{v.name_hint}" for v in op.results)
    operands = ", ".join(f"%{v.name_hint}" for v in op.operands)
    return ((f"{results} = " if results else "") + op.name + symbol + (f" {operands}" if operands else "")
            + (f" <{', '.join(items)}>" if items else ""))


class Code:
    """Lines of Python with an indentation level."""

    def __init__(self, level: int = 0) -> None:
        self.lines: list[str] = []
        self.level = level

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.lines.append("    " * self.level + line if line else "")

    @contextmanager
    def indent(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1

    def comment(self, op: Operation, why: str = "") -> None:
        self(f"# {describe(op)}" + (f": {why}" if why else ""))

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class EntryView:
    """Read-only helpers over a k3s.entry: its arguments by role and purpose (by name only for
    the context-parallel wrapper's initial_state, issue 39)."""

    def __init__(self, entry: k3s.EntryOp) -> None:
        self.entry = entry
        self.tensors = [op for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)]
        self.scalars = [op for op in entry.body.ops if isinstance(op, k3s.ScalarArgOp)]
        self.kernels = k3s.entry_kernels(entry)
        self.args = [op for op in entry.body.ops if isinstance(op, (k3s.TensorArgOp, k3s.ScalarArgOp))]
        self.checkpoint = next((op for op in entry.body.ops if isinstance(op, k3s.CheckpointArgOp)), None)
        self.combine = next((op for op in entry.body.ops if isinstance(op, k3s.SummaryCombineOp)), None)
        # what its launches pass for each run-time size (lower-to-triton's k3s.launch_size)
        self.launch_sizes = {op.size.data: op.value for op in entry.body.ops if isinstance(op, k3s.LaunchSizeOp)}

    def tensor(self, name: str) -> k3s.TensorArgOp:
        return next(op for op in self.tensors if op.sym_name.data == name)

    def dims(self, name: str) -> tuple[k3s.Dim, ...]:
        return self.tensor(name).type.dims

    def with_purpose(self, purpose: k3s.ArgPurpose) -> k3s.TensorArgOp | None:
        """The argument the host code reads as `purpose` (the first, where several share it: a
        spec_step's two caches have one depth), None if the entry has none."""
        return next((op for op in self.tensors if op.purpose is not None and op.purpose.data == purpose), None)

    def draft_depth(self) -> int | None:
        """The draft tokens per sequence (DEPTH): the second dim of its draft states, if any."""
        states = self.with_purpose(k3s.ArgPurpose.DRAFT_STATES)
        return states.type.dims[1] if states is not None else None

    def role(self, op: k3s.TensorArgOp) -> str:
        return op.role.data

    def optional(self) -> list[str]:
        return [op.sym_name.data for op in self.tensors if op.role.data in OPTIONAL_ROLES]
