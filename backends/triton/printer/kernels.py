"""Kernels: the @triton.jit functions (their parameters are what their code reads: arguments of
the entry, sizes, constexprs, flags) and what frames their stages (the grid axes, the guards).

The products' precision DOT is the kernel's `dots` (lower-to-triton), the block sizes are the
kernel's (legalize-triton; a Block AttnRes program's queries BQ too, sized at launch where it
holds all the call's), what a launch passes besides the kernel's arguments is its
`launch_params` (lower-to-triton: the chunk table, the run-time sizes, each the value of its
entry's k3s.launch_size, the checkpoints), the query and key heads H are its `key_heads`
(lower-to-triton: HV in a kernel that reads no key rows, the commit). Its parameters are all that
the IR gives it (kernel_params), each read by its code: the printer decides nothing here, and its
self-check refuses a parameter the code does not read."""

from __future__ import annotations

import ast
import os
import re
import textwrap

from xdsl.ir import Operation

from k3compile.backends.triton.printer.common import (
    DOT_PRECISION,
    KERNEL_CONSTANTS,
    Code,
    EntryView,
    block_constant,
    chosen,
    describe,
    host_expression,
    kernel_constants_of,
    presence_flag,
    register,
    tensor_name,
)
from k3compile.ir import k3s


def statements(code: str) -> ast.Module:
    """Indented Python code parsed, without its docstring (which names launch attributes, e.g. a
    state tile's block of value columns); comments are gone too."""
    body = ast.parse(textwrap.dedent(code)).body
    return ast.Module(body=body[1:] if isinstance(body[0], ast.Expr) else body, type_ignores=[])


class NameUses:
    """What name_uses finds: every name the code mentions (read), loads and stores, and the
    loads and stores of the code a launch runs."""

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.loaded: set[str] = set()
        self.stored: set[str] = set()
        self.launch_loaded: set[str] = set()
        self.launch_stored: set[str] = set()

    def free(self) -> set[str]:
        """The names the code reads but never assigns: its parameters and the module's globals."""
        return self.loaded - self.stored

    def launch_free(self) -> set[str]:
        """The free names of the code a launch runs (the guards its flags skip gone)."""
        return self.launch_loaded - self.launch_stored


def name_uses(code: ast.Module, off: frozenset[str] | set[str] = frozenset(),
              on: frozenset[str] | set[str] = frozenset()) -> NameUses:
    """The names code reads and assigns, in one read-only walk; also those of the code a launch
    that turns the flags `off` off and `on` on runs: without the guards it skips (`if FLAG:` of a
    flag off, `if not FLAG:` of a flag on; test, body and else), as if the launch's code were
    printed without them (no copy of the AST is made)."""
    uses = NameUses()
    stack = [(code, False)]
    pop, push = stack.pop, stack.append
    while stack:
        node, skipped = pop()
        if type(node) is ast.Name:
            ctx = type(node.ctx)
            uses.read.add(node.id)
            if ctx is ast.Load:
                uses.loaded.add(node.id)
                if not skipped:
                    uses.launch_loaded.add(node.id)
            elif ctx is ast.Store:
                uses.stored.add(node.id)
                if not skipped:
                    uses.launch_stored.add(node.id)
            continue
        if (off or on) and not skipped and type(node) is ast.If and skips(node.test, off, on):
            skipped = True
        for field in node._fields:
            value = getattr(node, field, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        push((item, skipped))
            elif isinstance(value, ast.AST):
                push((value, skipped))
    return uses


def skips(test: ast.expr, off: frozenset[str] | set[str], on: frozenset[str] | set[str]) -> bool:
    """Whether a launch that turns the flags `off` off and `on` on skips an `if` of this test."""
    if type(test) is ast.Name:
        return test.id in off
    return (type(test) is ast.UnaryOp and type(test.op) is ast.Not and type(test.operand) is ast.Name
            and test.operand.id in on)


def launch_flags(kernel: k3s.KernelOp) -> tuple[frozenset[str], frozenset[str]]:
    """The flags a launch of kernel turns off and those it turns on (k3s.when <on = false>'s
    guards `if not FLAG:` it skips)."""
    flags = kernel.flags.data if kernel.flags is not None else {}
    return (frozenset(flag for flag in flags if not kernel.flag_on(flag)),
            frozenset(flag for flag in flags if kernel.flag_on(flag)))


# a name printed code reads, as the printer writes code: an identifier outside strings and
# comments that is no attribute (x.dtype) and no keyword argument (mask=m, where an assignment
# has spaces around its =); a string or comment matches without a name
CODE_NAME = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'|#[^\n]*|(?<![.\w])([A-Za-z_]\w*)(?!\w|=(?!=))")


def names_read(text: str) -> set[str]:
    """The names printed code mentions (name_uses' read), found without parsing it (a tenth of
    the time); the self-check holds them to the parsed code's."""
    return {match[1] for match in CODE_NAME.finditer(text) if match[1]}


def self_check() -> bool:
    """Whether the printer checks each kernel's printed code against the IR (K3C_PRINTER_CHECKS=1,
    as the tests set it): parsing and walking every kernel was 40% of printing a compile."""
    return os.environ.get("K3C_PRINTER_CHECKS") == "1"


class PrintedCode:
    """A kernel's printed body (its lines, the first its docstring) and, when asked for, the names
    it reads and its statements parsed (statements(): no docstring, no comments). Bodies printed
    the same after their docstring (a kernel and those that share its code) are scanned and
    parsed once and walked once per set of flags turned off and on: the same text parses the same."""

    def __init__(self, lines: list[str], parsed: dict) -> None:
        self.text = "\n".join(lines[1:])
        self.lines = lines
        self.parsed = parsed  # text after the docstring -> [names read, statements, {flags off, on: name_uses}]
        if self.text not in parsed:
            parsed[self.text] = [None, None, {}]

    @property
    def read(self) -> set[str]:
        """The names the text mentions (names_read), scanned when first asked for (the self-check)."""
        known = self.parsed[self.text]
        if known[0] is None:
            known[0] = names_read(self.text)
        return known[0]

    @property
    def tree(self) -> ast.Module:
        """The statements, parsed when first asked for (the self-check, a twin whose text differs)."""
        known = self.parsed[self.text]
        if known[1] is None:
            known[1] = statements("\n".join(self.lines) + "\n")
        return known[1]

    def name_uses(self, off: frozenset[str], on: frozenset[str]) -> NameUses:
        """name_uses() of the statements, walked once per set of flags off and on."""
        walked = self.parsed[self.text][2]
        if (off, on) not in walked:
            walked[off, on] = name_uses(self.tree, off, on)
        return walked[off, on]

    def same_as(self, other: PrintedCode) -> bool:
        """Whether two kernels' statements are the same (an AST comparison: comments and the
        docstring aside). The same lines after the docstring parse the same; only bodies whose
        text differs are compared as ASTs."""
        return self.text == other.text or ast.dump(self.tree) == ast.dump(other.tree)


# the parameters of a launch param that is no run-time size (k3s.kernel <launch_params>), with
# what the launch passes: the chunk table print_launch makes, the entry's checkpoints
LAUNCH_PARAMS = {k3s.LaunchParam.CHUNK_TABLE: [("chunk_table", "chunk_table")],
                 k3s.LaunchParam.CHECKPOINTS: [("checkpoints", "checkpoints"), ("checkpoint_base", "checkpoint_base"),
                                               ("checkpoint_every", "checkpoint_every or 0")]}


def param_name(declaration: str) -> str:
    return declaration.split(":")[0]


class Kernels:
    """TritonPrinter's methods for kernels."""

    def known(self, what: str, kernel: k3s.KernelOp, view: EntryView, compute):
        """compute(), once per kernel and entry view for this printer (the printer reads the IR,
        never changes it; a kernel's constants and parameters are read by its code and again by
        each of its launches)."""
        known = self.__dict__.setdefault("_known", {})
        key = (what, id(kernel), id(view))
        if key not in known:  # the objects kept with their value: their ids are not reused
            known[key] = (kernel, view, compute())
        return known[key][2]

    def kernel_constants(self, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int | str]:
        """Compile-time constants of a kernel: sizes read from its stages and argument shapes,
        block sizes as legalize-triton fixed them (a k3s.runtime_block: its launch's expression
        of the call's sizes)."""
        return dict(self.known("constants", kernel, view, lambda: self.read_kernel_constants(kernel, view)))

    def launch_constants(self, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int | str]:
        """The constants a launch names on the host: its kernel's, then those only its grid reads
        (an expert axis's experts E, the layer's)."""
        constants = self.kernel_constants(kernel, view)
        if k3s.GridAxis.EXPERT in kernel.axes:
            constants.setdefault("E", self.num_experts(view))
        return constants

    def read_kernel_constants(self, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int | str]:
        if all(getattr(kernel, block) is None for block in ("block_k", "block_d", "block_r", "block_e")):
            raise ValueError(f"kernel @{kernel.sym_name.data} reached the printer without legalize-triton")
        constants: dict[str, int | str] = {}
        for op in kernel.walk():  # each op's (@kernel_constants_of), in program order
            if (of_op := KERNEL_CONSTANTS.get(type(op))) is not None:
                constants.update(of_op(self, op, kernel, view))
        return constants

    # --- each op's constants (common.KERNEL_CONSTANTS); the MoE experts' in experts.py ----------

    @kernel_constants_of(k3s.StateTileOp)
    def state_tile_constants(self, op: k3s.StateTileOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """Its heads (the layer's value heads, its kernel's key_heads), widths and blocks of key
        and value columns."""
        return dict(H=chosen(kernel, "key_heads").value.data, HV=view.entry.layer().num_v_heads.value.data,
                    K=op.head_k_dim.value.data, V=op.head_v_dim.value.data, BK=kernel.block_k.value.data,
                    BV=kernel.block_v.value.data)

    @kernel_constants_of(k3s.CacheUpdateOp, k3s.SnapshotStateOp, k3s.RestoreSnapshotOp, k3s.ReplayOp)
    def draft_constants(self, op: Operation, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """The draft tokens per sequence DEPTH of the cache or snapshots it indexes (its entry's)."""
        return dict(DEPTH=view.draft_depth())

    @kernel_constants_of(k3s.ChunkTileOp)
    def chunk_tile_constants(self, op: k3s.ChunkTileOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return dict(H=chosen(kernel, "key_heads").value.data, HV=view.entry.layer().num_v_heads.value.data,
                    K=op.head_k_dim.value.data,
                    V=op.head_v_dim.value.data, BK=kernel.block_k.value.data, BV=kernel.block_v.value.data,
                    BC=op.chunk_size.value.data)

    @kernel_constants_of(k3s.ChunkLoopOp)
    def chunk_loop_constants(self, op: k3s.ChunkLoopOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return dict(BC=op.chunk_size.value.data)

    @kernel_constants_of(k3s.FoldQueryOp)
    def fold_query_constants(self, op: k3s.FoldQueryOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int | str]:
        """A row's width and block of columns; the program's block of a Block AttnRes block's
        queries (legalize-triton's: fixed, or all the call's)."""
        constants: dict[str, int | str] = dict(D=op.hidden_size.value.data, BD=kernel.block_d.value.data)
        if op.queries is not None:
            constants.update(BQ=block_constant(kernel.block_q))
        return constants

    @kernel_constants_of(k3s.RowLoopOp, k3s.RowSourceLoopOp)
    def row_loop_constants(self, op: k3s.RowLoopOp | k3s.RowSourceLoopOp, kernel: k3s.KernelOp,
                           view: EntryView) -> dict[str, int]:
        return dict(BR=op.rows.value.data)

    @kernel_constants_of(k3s.RouterLogitsOp)
    def router_logits_constants(self, op: k3s.RouterLogitsOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return dict(D=op.hidden_size.value.data, E=op.num_experts.value.data, BR=kernel.block_r.value.data,
                    BD=kernel.block_d.value.data, BE=kernel.block_e.value.data)

    @kernel_constants_of(k3s.SumPartialLogitsOp)
    def sum_partial_logits_constants(self, op: k3s.SumPartialLogitsOp, kernel: k3s.KernelOp,
                                     view: EntryView) -> dict[str, int]:
        return dict(E=op.num_experts.value.data, BR=kernel.block_r.value.data, BE=kernel.block_e.value.data)

    @kernel_constants_of(k3s.SelectTopKOp)
    def select_top_k_constants(self, op: k3s.SelectTopKOp, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        return dict(TOP_K=op.top_k.value.data, BKS=kernel.block_ks.value.data)

    def kernel_name(self, symbol: str) -> str:
        return f"{symbol}_kernel"

    def kernel_params(self, kernel: k3s.KernelOp, view: EntryView) -> list[tuple[str, str]]:
        """(parameter declaration, launch argument) of every kernel parameter, in order: first its
        arguments (the tensors and scalars its stages read and write; a tensor its entry lacks is
        passed as None), then what its launch passes besides them (lower-to-triton's launch_params),
        its constants (what its stages' code reads, @kernel_constants_of), the presence flags of
        the optional tensors it is passed (in the entry's order), its flags and its products'
        precision (lower-to-triton's dots, on a kernel whose stages multiply). Each is what its
        code reads, no more: the self-check refuses a parameter the printed code does not read."""
        return list(self.known("params", kernel, view, lambda: self.read_kernel_params(kernel, view)))

    def read_kernel_params(self, kernel: k3s.KernelOp, view: EntryView) -> list[tuple[str, str]]:
        passed = k3s.launch_site(kernel).operands
        params = [(arg.name_hint, "None" if isinstance(value.owner, k3s.AbsentTensorOp) else tensor_name(value))
                  for arg, value in zip(kernel.body.block.args, passed, strict=True)]
        taken = [param.data for param in chosen(kernel, "launch_params").data]
        for param in taken:  # a run-time size: the value its entry's k3s.launch_size passes
            params += LAUNCH_PARAMS.get(param) or [(param, host_expression(view.launch_sizes[param]))]
        params += [(f"{n}: tl.constexpr", f"{n}={n}") for n in self.kernel_constants(kernel, view)]
        flags = {presence_flag(value) for value in passed if not isinstance(value.owner, k3s.AbsentTensorOp)}
        params += [(f"HAS_{n.upper()}: tl.constexpr", f"HAS_{n.upper()}={n} is not None") for n in view.optional()
                   if f"HAS_{n.upper()}" in flags]
        if k3s.LaunchParam.CHECKPOINTS in taken:
            params.append(("HAS_CHECKPOINTS: tl.constexpr", "HAS_CHECKPOINTS=checkpoints is not None"))
        if kernel.flags is not None:  # each flag as this kernel's launch sets it
            params += [(f"{flag}: tl.constexpr", f"{flag}={kernel.flag_on(flag)}") for flag in kernel.flags.data]
        if kernel.dots is not None:  # the products' precision (lower-to-triton)
            dot = DOT_PRECISION[kernel.dots.data].format(first=view.tensors[0].sym_name.data)
            params.append(("DOT: tl.constexpr", f"DOT={dot}"))
        return params

    def print_kernel(self, kernel: k3s.KernelOp, view: EntryView) -> None:
        """The @triton.jit function of a kernel. A kernel that shares another's code (k3s.kernel
        <shares_code_of>) prints none; its code in its own entry must be the other's."""
        c = self.code
        self.view, self.kernel = view, kernel
        self.code = body = Code(level=1)
        body(f'"""{describe(kernel)}, from k3 op {view.entry.source}."""')
        for axis_index, axis in enumerate(kernel.axes):
            getattr(self, f"print_axis_{axis}")(axis_index)
        self.print_ops(kernel)
        self.code = c
        # its parameters: its arguments, then the sizes and constexprs its code reads (the IR's)
        printed = PrintedCode(body.lines, self.__dict__.setdefault("_parsed", {}))
        all_params = self.kernel_params(kernel, view)
        if self_check():
            self.check_kernel(kernel, view, printed, all_params)
        params = [param for param, _ in all_params]
        if kernel.shares_code_of is not None:  # the same parameters, whatever their order in the entries
            twin_params, twin_code = self.kernel_code[kernel.code_name()]
            if sorted(twin_params) != sorted(params) or not twin_code.same_as(printed):
                raise ValueError(f"kernel @{kernel.sym_name.data} of @{view.entry.sym_name.data} shares the code "
                                 f"of {kernel.shares_code_of}, but its code differs (merge-identical-kernels)")
            return
        self.kernel_code[kernel.sym_name.data] = (params, printed)
        c("@triton.jit", f"def {self.kernel_name(kernel.sym_name.data)}(")
        with c.indent():
            for param in params:
                c(f"{param},")
        c("):")
        c.lines += body.lines

    def check_kernel(self, kernel: k3s.KernelOp, view: EntryView, printed: PrintedCode,
                     all_params: list[tuple[str, str]]) -> None:
        """The kernel's arguments are exactly what its code reads of the entries' (the IR says so,
        the printed code must agree), its launch runs no code that reads an absent one, and the
        names its parameters are kept by are those the parsed code reads (walked once, read-only)."""
        uses = printed.name_uses(*launch_flags(kernel))
        arguments = [arg.name_hint for arg in kernel.body.block.args]
        if set(arguments) != uses.free() & (self.argument_names | set(arguments)):
            raise ValueError(f"kernel @{kernel.sym_name.data}: its arguments {arguments} are not the tensors its "
                             f"code reads, {sorted(uses.free() & self.argument_names)}")
        absent = [name for name, passed in all_params[:len(arguments)] if passed == "None"]
        if skipped_read := set(absent) & uses.launch_free():
            raise ValueError(f"kernel @{kernel.sym_name.data}: its launch runs code that reads {sorted(skipped_read)}, "
                             f"which entry @{view.entry.sym_name.data} does not have")
        names = [param_name(param) for param, _ in all_params]
        if unread := [name for name in names if name not in uses.read]:
            raise ValueError(f"kernel @{kernel.sym_name.data}: its code reads no {', '.join(unread)} (a parameter "
                             f"the IR gives it: its launch_params, a @kernel_constants_of, its dots)")
        if set(names) & printed.read != set(names) & uses.read:
            raise ValueError(f"kernel @{kernel.sym_name.data}: names_read finds parameters "
                             f"{sorted(set(names) & printed.read)}, the parsed code reads {sorted(set(names) & uses.read)}")

    def print_ops(self, parent: Operation) -> None:
        for op in parent.regions[0].ops:
            getattr(self, "print_" + op.name.replace(".", "_"))(op)

    def print_k3s_when(self, op: k3s.WhenOp) -> None:
        runs = op.runs_when()
        self.code.comment(op, f"skipped by launches that pass {op.flag.data}={not runs}")
        self.code(f"if {'' if runs else 'not '}{op.flag.data}:")
        with self.code.indent():
            self.print_ops(op)

    def print_k3s_flag(self, op: k3s.FlagOp) -> None:
        # a constexpr: Triton compiles each launch with the guarded forms it reads resolved
        self.code.comment(op, "a constant of each launch")
        self.code(f"{register(op.value)}: tl.constexpr = {'' if op.runs_when() else 'not '}{op.flag.data}")

    def print_axis_value_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BV value columns",
            f"i_v = tl.program_id({axis})",
            "o_v = i_v * BV + tl.arange(0, BV)",
            "m_v = o_v < V",
        )

    def print_axis_sequence_head(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one (sequence, value head); value heads share q/k heads in groups of HV // H",
            f"i_nh = tl.program_id({axis}).to(tl.int64)",
            "i_n = i_nh // HV",
            "i_hv = i_nh % HV",
            "i_h = i_hv // (HV // H)",
        )

    def print_axis_chunk(self, axis: int) -> None:
        c = self.code
        c(f"# grid axis {axis}: one chunk of BC tokens (varlen: its row of chunk_table)",
          f"i_c = tl.program_id({axis}).to(tl.int64)")
        # the sequence offsets, the operand of the kernel's chunk tile
        offsets = next(op.offsets for op in self.kernel.body.ops if isinstance(op, k3s.ChunkTileOp))
        equal_rows = ["i_n = i_c // tl.cdiv(T, BC)", "start = i_n * T + (i_c % tl.cdiv(T, BC)) * BC",
                      "eos = i_n * T + T"]
        if offsets is None:  # a batch of equal rows (the chunked verify)
            c(*equal_rows)
            return
        varlen = ["i_n = tl.load(chunk_table + 2 * i_c).to(tl.int64)",
                  "start = tl.load(chunk_table + 2 * i_c + 1).to(tl.int64)",
                  f"eos = tl.load({tensor_name(offsets)} + i_n + 1).to(tl.int64)"]
        if (flag := presence_flag(offsets)) is None:
            c(*varlen)
            return
        c(f"if {flag}:")
        with c.indent():
            c(*varlen)
        c("else:")
        with c.indent():
            c(*equal_rows)

    def print_axis_value_head(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one value head; value heads share q/k heads in groups of HV // H",
            f"i_hv = tl.program_id({axis}).to(tl.int64)",
            "i_h = i_hv // (HV // H)",
        )

    def print_axis_row_block(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: a block of BR token rows",
            f"i_rb = tl.program_id({axis}).to(tl.int64)",
            "o_r = i_rb * BR + tl.arange(0, BR)",
            "m_r = o_r < R",
        )

    def print_axis_row(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one token row of width D",
            f"i_r = tl.program_id({axis}).to(tl.int64)",
            "o_d = tl.arange(0, BD)",
            "m_d = o_d < D",
        )
