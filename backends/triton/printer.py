"""Print a scheduled (`k3s`) module as a standalone Python module of Triton kernels.

The printer makes no scheduling decisions: every block of generated code is the printing of
one IR op (named in a comment above it), with constants read from the op's properties.
Entries become host functions (argument checks, allocation, launch), kernels become
@triton.jit functions, stages become the statements of those functions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation

from k3compile.backends.triton import context_parallel
from k3compile.backends.triton.runtime import emitted
from k3compile.errors import UnsupportedError
from k3compile.ir import k3s
from k3compile.ir.syntax import attr_to_literal

CHUNK_STAGE_TYPES = (k3s.ChunkTileOp, k3s.ChunkLoopOp)
ENTRY_PARTS = (k3s.TensorArgOp, k3s.ScalarArgOp, k3s.CheckpointArgOp, k3s.KernelOp, k3s.SummaryCombineOp)
# the pass that turns each kind of schedule into kernels
KERNEL_GROUPINGS = {"k3s.chunked": "add fuse-chunkwise after derive-chunkwise"}
# constexprs of a kernel that a launch table (k3c tune, docs/autotuning.md) may set per call
LAUNCH_CONSTANTS = ("BV",)




# k3s.kernel <dots = ...> as the DOT constexpr of the runtime prelude's _mm (Triton's input_precision)
DOT_PRECISION = {"fp32": "ieee", "tf32x3": "tf32x3"}


def launch_table_name(entry: str) -> str:
    return f"TUNED_{entry.upper()}"


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def describe(op: Operation) -> str:
    """`k3s.decay <gate = channel>`: the op as a one-line comment, without its regions."""
    items = [f"{k} = {attr_to_literal(v)}" for k, v in op.keyword_items()]
    symbol = f" @{op.properties['sym_name'].data}" if "sym_name" in op.properties else ""
    return op.name + symbol + (f" <{', '.join(items)}>" if items else "")


class Code:
    """Lines of Python with an indentation level."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

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
    """Read-only helpers over a k3s.entry: its arguments by name and role."""

    def __init__(self, entry: k3s.EntryOp) -> None:
        self.entry = entry
        self.tensors = [op for op in entry.body.ops if isinstance(op, k3s.TensorArgOp)]
        self.scalars = [op for op in entry.body.ops if isinstance(op, k3s.ScalarArgOp)]
        self.kernels = [op for op in entry.body.ops if isinstance(op, k3s.KernelOp)]
        self.args = [op for op in entry.body.ops if isinstance(op, (k3s.TensorArgOp, k3s.ScalarArgOp))]
        self.checkpoint = next((op for op in entry.body.ops if isinstance(op, k3s.CheckpointArgOp)), None)
        self.combine = next((op for op in entry.body.ops if isinstance(op, k3s.SummaryCombineOp)), None)
        self.names = {op.sym_name.data for op in self.args}

    def tensor(self, name: str) -> k3s.TensorArgOp:
        return next(op for op in self.tensors if op.sym_name.data == name)

    def dims(self, name: str) -> list[str]:
        return self.tensor(name).shape.data.split(",")

    def role(self, op: k3s.TensorArgOp) -> str:
        return op.role.data

    def optional(self) -> list[str]:
        # a combined tensor is None until the entry's combine step: kernels before it see it absent
        return [op.sym_name.data for op in self.tensors
                if op.role.data in ("optional_input", "optional_output", "combined")]


class TritonPrinter:
    """One method per k3s op. `print_module` returns the source of the compiled module."""

    def __init__(self, launch_tables: dict | None = None) -> None:
        self.code = Code()
        # entry name -> {(dtype, N*HV bucket, tokens bucket): {kernel: launch config}}: the
        # entries listed launch through a module-level table (docs/autotuning.md), others statically
        self.launch_tables = dict(launch_tables or {})
        self.signatures: dict[str, list[str]] = {}  # entry -> its printed parameters

    # --- module and entries ------------------------------------------------------------------

    def print_module(self, module: ModuleOp, docstring: str) -> str:
        c = self.code
        c(f'"""{docstring}', '"""', "", "import os", "", "import torch", "import triton", "import triton.language as tl", "")
        c(*emitted("checks"))
        entries = [op for op in module.ops if isinstance(op, k3s.EntryOp)]
        # context parallelism (docs/context-parallel.md): with a chunk_segments entry, the chunk
        # entry is printed as _chunk_single and wrapped by a `chunk` that takes segments / cp_group
        cp = context_parallel.cp_entries(module)
        for entry in entries:
            view = EntryView(entry)
            for kernel in view.kernels:
                c("", "")
                self.print_kernel(kernel, view)
            c("", "")
            self.print_entry(view, context_parallel.PLAIN_CHUNK if cp and entry is cp[0] else None)
        if cp:
            c("", "")
            context_parallel.print_context_parallel(self, module, EntryView(cp[0]), cp[1])
        c("", "", f"__all__ = {[e.sym_name.data for e in entries]!r}")
        return c.text()

    def print_entry(self, view: EntryView, def_name: str | None = None) -> None:
        c = self.code
        entry = view.entry
        unlowered = [op.name for op in entry.body.ops if not isinstance(op, ENTRY_PARTS)]
        if unlowered or not view.kernels:
            what = f"its schedule {unlowered[0]} is not grouped into kernels" if unlowered else "it has no kernels"
            hint = KERNEL_GROUPINGS.get(unlowered[0] if unlowered else "", "no pass groups it into kernels yet")
            raise UnsupportedError(f"entry @{entry.sym_name.data} of @{entry.source.data}: {what} ({hint})")
        params = []
        for arg in view.args:
            name = arg.sym_name.data
            if isinstance(arg, k3s.ScalarArgOp):
                params.append(f"{name}=None")
            elif arg.role.data in ("input", "inout"):
                # once a parameter has a default, later required ones default to None and are
                # rejected by the checks (fla's signatures do the same: g=None, beta=None)
                params.append(f"{name}=None" if any("=" in p for p in params) else name)
            elif arg.role.data in ("optional_input", "forbidden"):
                params.append(f"{name}=None")
            elif arg.role.data == "optional_output":
                params.append(f"output_{name}=False")
        if view.checkpoint:
            params.append("checkpoint_every=None")
        if view.combine:
            params.append("entering_states=None")
        if "state_indices" in view.names:
            params.append("check_indices=True")
        outputs = [t for t in view.tensors if t.role.data in ("output", "optional_output")]
        if entry.sym_name.data in self.launch_tables:
            self.print_launch_table(view)
        self.signatures[entry.sym_name.data] = params
        c(f"def {def_name or entry.sym_name.data}({', '.join(params)}):")
        with c.indent():
            c(f'"""{describe(entry)}, lowered from k3 op @{entry.source.data}.', "")
            c("Arguments (shapes in the symbols B, T, N, S of the schedule IR, `k3c ir`):")
            for arg in view.args:
                if isinstance(arg, k3s.ScalarArgOp):
                    c(f"    {arg.sym_name.data}: float, default {attr_to_literal(arg.default)}")
                else:
                    apart = f", must not overlap {arg.distinct_from.data}" if arg.distinct_from is not None else ""
                    c(f"    {arg.sym_name.data}: [{arg.shape.data}] {arg.dtype.data} ({arg.role.data}{apart})")
            if view.checkpoint:
                c(f"    checkpoint_every: None, or a positive multiple of {view.checkpoint.chunk_size.value.data}: "
                  "also return the states after every that many tokens of each sequence")
            if view.combine:
                c("    entering_states: (M, N) -> [N, ...] float32: the state entering every segment (sequence of",
                  "        cu_seqlens), from all segments' summaries (M None for the identity transition)")
            if "state_indices" in view.names:
                counts = " and accepted in 0..the cache depth" if "accepted" in view.names else ""
                c("    check_indices: check on the host (a synchronisation, skipped while a CUDA graph is captured)",
                  f"        that every state_indices entry is a pool slot or -1 (padding) and none repeats{counts};",
                  "        False for hot loops: the kernels still never touch memory outside the pool")
            c(f"Returns ({', '.join(o.sym_name.data for o in outputs)}"
              f"{'[, checkpoints]' if view.checkpoint else ''}); optional outputs are None unless asked for.")
            c('"""')
            self.print_argument_checks(view)
            for arg in view.scalars:
                name = arg.sym_name.data
                c(f'{name} = _scalar("{name}", {name}, {attr_to_literal(arg.default)})')
            if any("NC" in t.shape.data.split(",") for t in view.tensors):
                chunk_size = next(op.chunk_size.value.data for op in view.entry.walk() if isinstance(op, k3s.ChunkTileOp))
                c("# per-chunk slots: chunk (sequence n, first token s) uses slot s // C + n, unique and",
                  "# below cdiv(B T, C) + N for any split into sequences",
                  f'dims["NC"] = triton.cdiv(dims["B"] * dims["T"], {chunk_size}) + dims["N"]')
            for out in view.tensors:
                if out.role.data in ("output", "optional_output", "workspace"):
                    self.print_allocation(out, view)
            for arg in view.tensors:
                if arg.role.data == "combined":
                    c(f"{arg.sym_name.data} = None  # made by the summary_combine step below")
            if view.checkpoint:
                first = view.tensors[0].sym_name.data
                c(f"# {describe(view.checkpoint)}",
                  f"checkpoints, checkpoint_base = _checkpoints(checkpoint_every, {view.checkpoint.chunk_size.value.data}, "
                  f"cu_seqlens, dims, ({view.checkpoint.state_shape.data},), {first}.device)")
            for op in view.entry.body.ops:
                if isinstance(op, k3s.KernelOp):
                    self.print_launch(op, view)
                elif isinstance(op, k3s.SummaryCombineOp):
                    self.print_combine(op, view)
            returned = ", ".join(o.sym_name.data for o in outputs) + ("," if len(outputs) == 1 else "")
            if view.checkpoint:
                c("if checkpoint_every is not None:")
                with c.indent():
                    c(f"return {returned} checkpoints" if returned.endswith(",") else f"return {returned}, checkpoints")
            c(f"return {returned}")

    def print_combine(self, op: k3s.SummaryCombineOp, view: EntryView) -> None:
        """The host step of a segments entry: the caller's combine of the summaries."""
        c = self.code
        first = view.tensors[0].sym_name.data
        made = next(t for t in view.tensors if t.role.data == "combined")
        name = made.sym_name.data
        c(f"# {describe(op)}: every segment's entering state from the summaries (the caller's scan order)",
          f"{name} = entering_states({'M' if 'M' in view.names else 'None'}, N)",
          f'_check_tensor("{name}", {name}, "{made.shape.data}", "{made.dtype.data}", dims, {first}.device)')

    def print_argument_checks(self, view: EntryView) -> None:
        c = self.code
        c(f"# {describe(view.entry)}: argument checks", "dims = {}")
        first = view.tensors[0].sym_name.data
        order = {"input": 0, "inout": 0, "forbidden": 1, "optional_input": 2}
        inputs = [t for t in view.tensors if t.role.data in order]
        # offsets bind N before the optional tensors shaped by it are checked
        inputs.sort(key=lambda t: (order[t.role.data], t.dtype.data != "offsets"))
        for arg in inputs:
            name, role = arg.sym_name.data, arg.role.data
            device = "None" if name == first else f"{first}.device"
            check = f'_check_tensor("{name}", {name}, "{arg.shape.data}", "{arg.dtype.data}", dims, {device})'
            if arg.dtype.data == "offsets":
                c(f'_check_offsets("{name}", {name}, dims, {device})')
            elif role in ("input", "inout"):
                c(check)
                if arg.distinct_from is not None:
                    other = arg.distinct_from.data
                    c(f'_check_distinct("{name}", {name}, "{other}", {other})')
            elif role == "forbidden":
                c(f'_check_none("{name}", {name}, "k3 op @{view.entry.source.data} has no {name} input")')
            else:
                c(f"if {name} is not None:")
                with c.indent():
                    c(check)
        if not any(t.dtype.data == "offsets" for t in view.tensors):
            c('dims["N"] = dims["B"]  # one sequence per batch row')
        if "state_indices" in view.names:
            c('_check_slots("state_indices", state_indices, dims["P"], check_indices)')
        if "accepted" in view.names:
            depth = next(int(view.dims(b)[1]) for b in ("cache", "snapshots") if b in view.names)
            c(f'_check_counts("accepted", accepted, {depth}, check_indices)')
        heads = {self.kernel_constants(k, view).get("HV") for k in view.kernels
                 if "sequence_head" in k.grid.data.split(",")[1:]}
        rows = "state_indices" if "state_indices" in view.names else first  # what sets the sequence count
        for HV in sorted(heads - {None}):
            c(f'_check_grid_axis("{rows}", dims["N"], {HV})')
        if view.combine:
            c("if not callable(entering_states):")
            with c.indent():
                c('raise ValueError(f"entering_states: expected a callable (M, N) -> the entering states, '
                  'got {type(entering_states).__name__}")')
        tokens = view.entry.max_tokens
        if tokens is not None:
            c(f'if dims["T"] > {tokens.value.data}:')
            with c.indent():
                c(f'raise ValueError(f"{view.tensors[0].sym_name.data}: at most {tokens.value.data} tokens per step '
                  "(the cache depth), got T = {dims['T']}\")")
        limit = view.entry.max_sources
        if limit is not None:
            c(f'if not 1 <= dims["S"] <= {limit.value.data}:')
            with c.indent():
                c(f'raise ValueError(f"{view.tensors[0].sym_name.data}: expected 1 to {limit.value.data} '
                  f'sources (dim 0), got {{dims[\'S\']}}")')

    def print_allocation(self, out: k3s.TensorArgOp, view: EntryView) -> None:
        c = self.code
        name = out.sym_name.data
        first = view.tensors[0].sym_name.data
        sizes = ", ".join(d if d.isdigit() else f'dims["{d}"]' for d in out.shape.data.split(","))
        dtype = "torch.float32" if out.dtype.data == "float32" else f"{first}.dtype"
        alloc = f"_alloc(({sizes}{',' if ',' not in sizes else ''}), {dtype}, {first}.device)"
        if out.role.data == "optional_output":
            c(f"{name} = {alloc} if output_{name} else None")
        else:
            c(f"{name} = {alloc}")

    # --- kernels -----------------------------------------------------------------------------

    GRID_AXES = {
        "value_block": "triton.cdiv(V, BV)",
        "sequence_head": 'dims["N"] * HV',
        "row": 'dims["B"] * dims["T"]',
        "chunk": "num_chunks",
        "value_head": "HV",
    }

    def kernel_constants(self, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """Compile-time constants of a kernel, read from its stages and argument shapes."""
        constants: dict[str, int] = {}
        for op in kernel.walk():
            if isinstance(op, k3s.StateTileOp):
                K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
                # a commit kernel has no q or v: its heads come from the state pool
                HV = int(view.dims("v")[2]) if "v" in view.names else int(view.dims("state")[1])
                constants.update(
                    H=int(view.dims("q" if "q" in view.names else "k")[2]) if {"q", "k"} & set(view.names) else HV,
                    HV=HV,
                    K=K,
                    V=V,
                    BK=next_power_of_2(K),
                    BV=min(next_power_of_2(V), op.block_v.value.data),
                )
            elif isinstance(op, k3s.ChunkTileOp):  # a whole chunk, all value columns
                K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
                constants.update(
                    H=int(view.dims("k")[2]), HV=int(view.dims("v")[2]), K=K, V=V,
                    BK=next_power_of_2(K), BV=next_power_of_2(V), BC=op.chunk_size.value.data,
                )
            elif isinstance(op, k3s.ChunkLoopOp):
                constants.update(BC=op.chunk_size.value.data)
            elif isinstance(op, k3s.FoldQueryOp):
                D = op.hidden_size.value.data
                constants.update(D=D, BD=next_power_of_2(D))
        for buffer in ("cache", "snapshots"):
            if buffer in view.names:
                constants["DEPTH"] = int(view.dims(buffer)[1])
        return constants

    def runtime_sizes(self, kernel: k3s.KernelOp) -> list[str]:
        """Sizes known only at run time that a kernel reads (the token count, rows, sources)."""
        sizes = []
        if any(isinstance(op, (k3s.TokenLoopOp, k3s.ChunkLoopOp, k3s.ChunkTileOp)) for op in kernel.walk()):
            sizes.append("T")
        if any(isinstance(op, k3s.SourceLoopOp) for op in kernel.walk()):
            sizes += ["S", "R"]
        if any(isinstance(op, k3s.StateTileOp) and k3s.in_pool(op) for op in kernel.walk()):
            sizes.append("NSLOTS")  # the pool's rows (dims P; P itself may be the query Gram's workspace)
        return sizes

    def kernel_name(self, kernel: k3s.KernelOp) -> str:
        return f"{kernel.sym_name.data}_kernel"

    def kernel_params(self, kernel: k3s.KernelOp, view: EntryView) -> list[tuple[str, str]]:
        """(parameter declaration, launch argument) of every kernel parameter, in order."""
        params = [(a.sym_name.data, a.sym_name.data) for a in view.args]
        if "chunk" in kernel.grid.data.split(","):
            params.append(("chunk_table", "chunk_table"))
        runtime = {"T": 'dims["T"]', "S": 'dims["S"]', "R": 'dims["B"] * dims["T"]', "NSLOTS": 'dims["P"]'}
        params += [(s, runtime[s]) for s in self.runtime_sizes(kernel)]
        checkpointing = any(isinstance(op, k3s.StoreCheckpointOp) for op in kernel.walk())
        if checkpointing:
            params += [("checkpoints", "checkpoints"), ("checkpoint_base", "checkpoint_base"),
                       ("checkpoint_every", "checkpoint_every or 0")]
        params += [(f"{n}: tl.constexpr", f"{n}={n}") for n in self.kernel_constants(kernel, view)]
        params += [(f"HAS_{n.upper()}: tl.constexpr", f"HAS_{n.upper()}={n} is not None") for n in view.optional()]
        if checkpointing:
            params.append(("HAS_CHECKPOINTS: tl.constexpr", "HAS_CHECKPOINTS=checkpoints is not None"))
        if any(isinstance(op, CHUNK_STAGE_TYPES) for op in kernel.walk()):
            first = view.tensors[0].sym_name.data
            # the products' precision: the kernel's own (k3s.kernel <dots>), else by input dtype
            dot = repr(DOT_PRECISION[kernel.dots.data]) if kernel.dots is not None else f"_DOT_OF_DTYPE[{first}.dtype]"
            params.append(("DOT: tl.constexpr", f"DOT={dot}"))
        return params

    def launch_config(self, kernel: k3s.KernelOp, view: EntryView) -> dict[str, int]:
        """What a launch table may set for this kernel (its block-size constexprs, num_warps,
        num_stages), with the values of the IR: the heuristic default, or a tuned candidate's."""
        constants = self.kernel_constants(kernel, view)
        config = {name: constants[name] for name in LAUNCH_CONSTANTS if name in constants}
        config["num_warps"] = kernel.num_warps.value.data
        if kernel.num_stages is not None:
            config["num_stages"] = kernel.num_stages.value.data
        if kernel.maxnreg is not None:
            config["maxnreg"] = kernel.maxnreg.value.data
        return config

    def print_launch_table(self, view: EntryView) -> None:
        """TUNED_<ENTRY>: the module-level table the entry's launches read (docs/autotuning.md)."""
        c = self.code
        entry = view.entry.sym_name.data
        c(f"# launch configs of @{entry}'s kernels per (input dtype, bucket of N*HV, bucket of tokens per sequence)",
          "# (k3c tune; buckets are powers of two, rounded up); sizes in no bucket launch with the defaults",
          f"{launch_table_name(entry)} = {{")
        with c.indent():
            for key, kernels in sorted(self.launch_tables[entry].items()):
                c(f"{tuple(key)!r}: {{{', '.join(f'{k!r}: {dict(sorted(v.items()))!r}' for k, v in sorted(kernels.items()))}}},")
        c("}", "", "")

    def print_launch(self, kernel: k3s.KernelOp, view: EntryView) -> None:
        c = self.code
        constants = self.kernel_constants(kernel, view)
        axes = kernel.grid.data.split(",")
        c(f"# {describe(kernel)}: launch")
        for name, value in constants.items():
            c(f"{name} = {value}")
        tabled = view.entry.sym_name.data in self.launch_tables
        if tabled:  # the tuned config of this call's bucket, else the IR's values
            default = self.launch_config(kernel, view)
            first = view.tensors[0].sym_name.data
            c(f"launch = _tuned_launch({launch_table_name(view.entry.sym_name.data)}, {kernel.sym_name.data!r}, "
              f"{first}.dtype, dims, {'HV' if 'HV' in constants else 1}, "
              f"{{{', '.join(f'{k!r}: {k if k in constants else v}' for k, v in default.items())}}})")
            for name in LAUNCH_CONSTANTS:
                if name in default:
                    c(f'{name} = launch["{name}"]')
        if "chunk" in axes:
            first = view.tensors[0].sym_name.data
            offsets = "cu_seqlens" if "cu_seqlens" in view.names else "None"  # a verify: rows of a batch
            c(f"num_chunks, chunk_table = _chunks({offsets}, dims, BC, {first}.device)")
        grid = ", ".join(self.GRID_AXES[axis] for axis in axes)
        c(f"grid = ({grid}{',' if len(axes) == 1 else ''})")
        c("if all(grid):")
        with c.indent():
            c(f"{self.kernel_name(kernel)}[grid](")
            with c.indent():
                for _, arg in self.kernel_params(kernel, view):
                    c(f"{arg},")
                if tabled:
                    c('num_warps=launch["num_warps"],')
                    if kernel.num_stages is not None:
                        c('num_stages=launch["num_stages"],')
                    if "chunk" in axes:  # a tuned cap on the token-parallel kernels' registers (None: none)
                        c('maxnreg=launch.get("maxnreg"),')
                else:
                    c(f"num_warps={kernel.num_warps.value.data},")
                    if kernel.num_stages is not None:
                        c(f"num_stages={kernel.num_stages.value.data},")
                    if kernel.maxnreg is not None:
                        c(f"maxnreg={kernel.maxnreg.value.data},")
            c(")")

    def print_kernel(self, kernel: k3s.KernelOp, view: EntryView) -> None:
        c = self.code
        c("@triton.jit")
        c(f"def {self.kernel_name(kernel)}(")
        with c.indent():
            for param, _ in self.kernel_params(kernel, view):
                c(f"{param},")
        c("):")
        self.view = view
        self.defined: set[str] = set()
        with c.indent():
            c(f'"""{describe(kernel)}, from k3 op @{view.entry.source.data}."""')
            for axis_index, axis in enumerate(kernel.grid.data.split(",")):
                getattr(self, f"print_axis_{axis}")(axis_index)
            self.print_ops(kernel)

    def print_ops(self, parent: Operation) -> None:
        for op in parent.regions[0].ops:
            getattr(self, "print_" + op.name.replace(".", "_"))(op)

    # --- grid axes ---------------------------------------------------------------------------

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
        if "cu_seqlens" not in self.view.names:  # a batch of equal rows (the chunked verify)
            c("i_n = i_c // tl.cdiv(T, BC)", "start = i_n * T + (i_c % tl.cdiv(T, BC)) * BC", "eos = i_n * T + T")
            return
        c("if HAS_CU_SEQLENS:")
        with c.indent():
            c("i_n = tl.load(chunk_table + 2 * i_c).to(tl.int64)",
              "start = tl.load(chunk_table + 2 * i_c + 1).to(tl.int64)",
              "eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)")
        c("else:")
        with c.indent():
            c("i_n = i_c // tl.cdiv(T, BC)", "start = i_n * T + (i_c % tl.cdiv(T, BC)) * BC", "eos = i_n * T + T")

    def print_axis_value_head(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one value head; value heads share q/k heads in groups of HV // H",
            f"i_hv = tl.program_id({axis}).to(tl.int64)",
            "i_h = i_hv // (HV // H)",
        )

    def print_axis_row(self, axis: int) -> None:
        self.code(
            f"# grid axis {axis}: one token row of width D",
            f"i_r = tl.program_id({axis}).to(tl.int64)",
            "o_d = tl.arange(0, BD)",
            "m_d = o_d < D",
        )

    # --- recurrent stages --------------------------------------------------------------------

    def print_k3s_state_tile(self, op: k3s.StateTileOp) -> None:
        c = self.code
        c.comment(op, "fp32 state tile [K, BV] kept in registers for the whole sequence")
        c("o_k = tl.arange(0, BK)", "m_k = o_k < K", "m_kv = m_k[:, None] & m_v[None, :]")
        local = "o_k[:, None] * V + o_v[None, :]" if op.layout.data == "kv" else "o_v[None, :] * K + o_k[:, None]"
        if k3s.in_pool(op):
            c("i_slot = tl.load(state_indices + i_n).to(tl.int64)",
              "# a slot outside the pool (-1: padding) reads zeros and is never written; the tests are",
              "# made on vectors (Triton's interpreter rejects masks combined from scalar conditions)",
              "m_slot_k = ((i_slot + 0 * o_k) >= 0) & ((i_slot + 0 * o_k) < NSLOTS)",
              "m_slot_v = ((i_slot + 0 * o_v) >= 0) & ((i_slot + 0 * o_v) < NSLOTS)",
              "m_kv = m_kv & m_slot_v[None, :]",
              f"p_local = {local}",
              "p_state = (i_slot * HV + i_hv) * K * V + p_local",
              "b_S = tl.load(state + p_state, mask=m_kv, other=0.0).to(tl.float32)")
            return
        c(f"p_state = i_nh * K * V + {local}", "b_S = tl.zeros([BK, BV], dtype=tl.float32)")
        if op.start is not None:
            if op.start.data == "identity":  # the columns of a transition M: M = I before any token
                c("b_S = tl.where(o_k[:, None] == o_v[None, :], 1.0, 0.0)")
            return
        c("if HAS_INITIAL_STATE:")
        with c.indent():
            c("b_S += tl.load(initial_state + p_state, mask=m_kv, other=0.0)")

    def print_k3s_token_loop(self, op: k3s.TokenLoopOp) -> None:
        c = self.code
        c.comment(op, "the tokens of sequence i_n, in order")
        self.print_sequence_bounds()
        c(f"for t in {self.token_range(op, 'bos', 'eos')}:")
        with c.indent():
            self.print_ops(op)

    @staticmethod
    def token_range(op: Operation, start: str, stop: str) -> str:
        """The loop over tokens: its kernel's num_stages asks Triton to prefetch the next tokens'
        loads (it pipelines a loop without matrix products only when the loop itself says so)."""
        kernel = op.parent_op()
        while not isinstance(kernel, k3s.KernelOp):
            kernel = kernel.parent_op()
        if kernel.num_stages is None:
            return f"range({start}, {stop})"
        return f"tl.range({start}, {stop}, num_stages={kernel.num_stages.value.data})"

    def print_sequence_bounds(self) -> None:
        """bos, eos: the token range of sequence i_n (varlen: from cu_seqlens)."""
        c = self.code
        if "cu_seqlens" not in self.view.names:
            c("bos = i_n * T", "eos = bos + T")
            return
        c("if HAS_CU_SEQLENS:")
        with c.indent():
            c("bos = tl.load(cu_seqlens + i_n).to(tl.int64)", "eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)")
        c("else:")
        with c.indent():
            c("bos = i_n * T", "eos = bos + T")

    # where a token's q, k or v row lives: (heads, width, head index, column offsets, column mask)
    TOKEN_ROWS = {
        "q": ("H", "K", "i_h", "o_k", "m_k"),
        "k": ("H", "K", "i_h", "o_k", "m_k"),
        "v": ("HV", "V", "i_hv", "o_v", "m_v"),
    }

    def print_k3s_load_token(self, op: k3s.LoadTokenOp) -> None:
        name = op.tensor.data
        heads, width, head, offsets, mask = self.TOKEN_ROWS[name]
        self.code.comment(op)
        self.code(
            f"b_{name} = tl.load({name} + (t * {heads} + {head}) * {width} + {offsets}, mask={mask}, other=0.0)"
            ".to(tl.float32)"
        )
        if k3s.normalises(op):
            self.code(f"b_{name} = b_{name} / tl.sqrt(tl.sum(b_{name} * b_{name}) + 1e-6)")

    def print_k3s_decay(self, op: k3s.DecayOp) -> None:
        c = self.code
        c.comment(op, "S <- Diag(exp g_t) S")
        c("b_S = b_S * tl.exp(b_g)[:, None]" if op.gate.data == "channel" else "b_S = b_S * tl.exp(b_g)")

    def print_k3s_delta_correct(self, op: k3s.DeltaCorrectOp) -> None:
        self.code.comment(op, "u = beta_t (v_t - S^T k_t), kept in b_v")
        self.code("b_v = b_beta * (b_v - tl.sum(b_S * b_k[:, None], axis=0))")

    def print_k3s_rank1_update(self, op: k3s.Rank1UpdateOp) -> None:
        self.code.comment(op, "S <- S + k_t u_t^T")
        self.code("b_S = b_S + b_k[:, None] * b_v[None, :]")

    def print_k3s_readout(self, op: k3s.ReadoutOp) -> None:
        self.code.comment(op, "o_t = S^T (scale q_t)")
        self.code(
            "b_o = tl.sum(b_S * (scale * b_q)[:, None], axis=0)",
            "tl.store(o + (t * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)",
        )

    def print_k3s_store_state(self, op: k3s.StoreStateOp) -> None:
        self.code.comment(op)
        if k3s.in_pool(op):
            self.code("tl.store(state + p_state, b_S.to(state.dtype.element_ty), mask=m_kv)")
            if op.next_op is not None:  # later stages go on from the state as the pool now holds it
                self.code("b_S = b_S.to(state.dtype.element_ty).to(tl.float32)")
            return
        if op.tensor is not None:
            self.code(f"tl.store({op.tensor.data} + p_state, b_S, mask=m_kv)")
            return
        self.code("if HAS_FINAL_STATE:")
        with self.code.indent():
            self.code("tl.store(final_state + p_state, b_S, mask=m_kv)")

    # --- chunkwise stages ---------------------------------------------------------------------
    # Tiles: b_q, b_k [BC, BK], b_v [BC, BV] fp32; b_G the cumulative gate in log2 units
    # ([BC, BK] for a channel gate, [BC] for a scalar one); Gamma = exp2(b_G).

    def gamma(self, gate: str, exponent: str = "b_G") -> str:
        """Gamma (or exp2 of another log2 expression) broadcast against a [BC, BK] tile."""
        return f"tl.exp2({exponent})" if gate == "channel" else f"tl.exp2({exponent})[:, None]"

    def print_k3s_chunk_tile(self, op: k3s.ChunkTileOp) -> None:
        self.chunk_size = op.chunk_size.value.data
        if self.chunk_size not in (16, 32, 64):  # tl.dot tiles: powers of two, at least 16
            raise UnsupportedError(f"Triton backend: chunk size must be 16, 32 or 64, got {self.chunk_size}")
        self.code.comment(op, "this program's token rows, all key and value columns")
        self.code(
            "o_c = tl.arange(0, BC)", "t_c = start + o_c", "m_c = t_c < eos",
            "o_k = tl.arange(0, BK)", "m_k = o_k < K", "o_v = tl.arange(0, BV)", "m_v = o_v < V",
        )

    def print_k3s_chunk_loop(self, op: k3s.ChunkLoopOp) -> None:
        c = self.code
        self.chunk_size = op.chunk_size.value.data
        c.comment(op, "the chunks of sequence i_n, in order, carrying b_S")
        c("o_c = tl.arange(0, BC)")
        for product in [o for o in op.body.ops if isinstance(o, k3s.DecayProductOp)]:
            c("b_M = tl.full([BK], 1.0, tl.float32)" if product.transition.data == "diagonal"
              else "b_M = tl.full([], 1.0, tl.float32)")
        self.print_sequence_bounds()
        c("for start in range(bos, eos, BC):")
        with c.indent():
            c("t_c = start + o_c", "m_c = t_c < eos")
            self.print_ops(op)

    def print_k3s_load_chunk(self, op: k3s.LoadChunkOp) -> None:
        self.code.comment(op, "kept in the input dtype (half the registers of fp32); stages upcast")
        self.print_rows(op, "t_c", "m_c", f"b_{op.tensor.data}")

    def print_rows(self, op: k3s.LoadChunkOp, rows: str, row_mask: str, target: str) -> None:
        """The rows `rows` (token indices, masked by `row_mask`) of a chunk input into `target`."""
        name = op.tensor.data
        heads, width, head, offsets, mask = self.TOKEN_ROWS[name]
        self.code(
            f"{target} = tl.load({name} + ({rows}[:, None] * {heads} + {head}) * {width} + {offsets}[None, :], "
            f"mask={row_mask}[:, None] & {mask}[None, :], other=0.0)"
        )
        if k3s.normalises(op):
            self.code(f"{target} = {target}.to(tl.float32)",
                      f"{target} = {target} / tl.sqrt(tl.sum({target} * {target}, axis=1) + 1e-6)[:, None]")

    def print_k3s_load_gate(self, op: k3s.LoadGateOp) -> None:
        self.code.comment(op, "the log-decay g")
        per_token = isinstance(op.parent_op(), k3s.TokenLoopOp)
        self.print_gate_rows(op, *(("t", None) if per_token else ("t_c", "m_c")), "b_g")

    def print_gate_rows(self, op: k3s.LoadGateOp, rows: str, row_mask: str | None, target: str) -> None:
        """The log-decay of the token(s) `rows` (one token without a row mask) into `target`, in
        the op's input form."""
        c = self.code
        per_token = row_mask is None
        if op.gate.data == "channel":
            cols = "o_k" if per_token else "o_k[None, :]"
            address = f"g + ({rows if per_token else rows + '[:, None]'} * HV + i_hv) * K + {cols}"
            mask = "m_k" if per_token else f"{row_mask}[:, None] & m_k[None, :]"
            bias = f"tl.load(dt_bias + i_hv * K + {cols}, mask={'m_k' if per_token else 'm_k[None, :]'}, other=0.0)"
        else:
            address, mask, bias = f"g + {rows} * HV + i_hv", row_mask, "tl.load(dt_bias + i_hv)"
        c(f"{target} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''}).to(tl.float32)")
        form = op.input.data
        if form == "clamped":
            c(f"{target} = tl.maximum({target}, {op.lower_bound.value.data!r})")
        elif form != "log":
            c("b_a = tl.exp(tl.load(A_log + i_hv).to(tl.float32))", f"{target} = {target} + {bias}.to(tl.float32)")
            if form == "softplus":
                c(f"{target} = -b_a * tl.where({target} > 20.0, {target}, tl.log(1.0 + tl.exp(tl.minimum({target}, 20.0))))")
            else:
                c(f"{target} = {op.lower_bound.value.data!r} * tl.sigmoid(b_a * {target})")
            if mask:  # rows or channels past the end must not decay: the cumsum relies on it
                c(f"{target} = tl.where({mask}, {target}, 0.0)")

    def print_k3s_load_beta(self, op: k3s.LoadBetaOp) -> None:
        per_token = isinstance(op.parent_op(), k3s.TokenLoopOp)
        self.code.comment(op)
        if per_token:
            self.code("b_beta = tl.load(beta + t * HV + i_hv).to(tl.float32)")
        else:
            self.code("b_beta = tl.load(beta + t_c * HV + i_hv, mask=m_c, other=0.0).to(tl.float32)")
        if op.input.data != "probability":  # logits: sigmoid(beta); logits_neg_eigval: 2 sigmoid(beta)
            beta = "2.0 * tl.sigmoid(b_beta)" if op.input.data == "logits_neg_eigval" else "tl.sigmoid(b_beta)"
            self.code(f"b_beta = {beta}" if per_token else f"b_beta = tl.where(m_c, {beta}, 0.0)")

    def print_k3s_gate_cumsum(self, op: k3s.GateCumsumOp) -> None:
        self.code.comment(op, "G = cumsum(g) over the chunk, in log2 units (rows past the end add 0)")
        self.code("b_G = tl.cumsum(b_g * 1.4426950408889634, axis=0)")

    def once(self, name: str, *lines: str) -> None:
        """Print the lines defining `name` unless this kernel already has it (tiles that several
        stages share, such as the gate references of the two Grams)."""
        if name not in self.defined:
            self.defined.add(name)
            self.code(*lines)

    def print_gate_references(self, sub: int) -> None:
        """Per row block of `sub` rows: G at its last row (b_Gend) and just before its first row
        (b_Gstart, 0 for the first block), as [NB, BK]; b_G3 is b_G as [NB, SUB, BK]."""
        self.once(
            "b_G3",
            f"# gate references per row block of {sub} rows: G just before the block (b_Gstart) and at",
            "# its last row (b_Gend); a row only ever meets references at or before itself (causal)",
            f"SUB: tl.constexpr = {sub}",
            "NB: tl.constexpr = BC // SUB",
            "o_b = tl.arange(0, NB)",
            "o_r = tl.arange(0, SUB)",
            "o_blk = o_c // SUB",
            "b_G3 = tl.reshape(b_G, [NB, SUB, BK])",
            "b_Gend = tl.sum(tl.where((o_r == SUB - 1)[None, :, None], b_G3, 0.0), axis=1)",
            "b_Gstart = tl.sum(tl.where((o_b[:, None] == o_b[None, :] + 1)[:, :, None], b_Gend[None, :, :], 0.0), axis=1)",
        )

    def print_gram_factored(self, gram: k3s.GramOp, lhs: str, out: str, keep: str, diagonal: str) -> None:
        """Blocks below the diagonal: left factor lhs_i Gamma_i / Gamma_start(I) and right factor
        k_j Gamma_end(J) / Gamma_j, both <= 1, bridged by the decay between the two references."""
        c = self.code
        # the factors are tensor-core operands, kept as _mm takes them: bf16 (half the registers)
        # next to bf16 inputs, else fp32 (a diagonal factor spans e^80: never fp16)
        self.once("b_kr", "# right factor k_j Gamma_end / Gamma_j of each column block (<= 1)",
                  "b_kr = _dot_operand(tl.reshape(tl.reshape(b_k, [NB, SUB, BK]) * tl.exp2(b_Gend[:, None, :] - b_G3), [BC, BK]), DOT)")
        left = f"b_{lhs}l"
        self.once(left, f"# left factor {lhs}_i Gamma_i / Gamma_start of each row block (<= 1)",
                  f"{left} = _dot_operand(tl.reshape(tl.reshape(b_{lhs}, [NB, SUB, BK]) * tl.exp2(b_G3 - b_Gstart[:, None, :]), [BC, BK]), DOT)")
        c(f"{out} = tl.zeros([BC, BC], dtype=tl.float32)",
          "# row block I meets column block I - d through the decay between their references",
          "for d in tl.static_range(1, NB):")
        with c.indent():
            c("b_from = tl.sum(tl.where((o_b[:, None] == o_b[None, :] + d)[:, :, None], b_Gend[None, :, :], 0.0), axis=1)",
              f"b_left = _dot_operand(tl.reshape(tl.reshape({left}, [NB, SUB, BK]) * tl.exp2(b_Gstart - b_from)[:, None, :], [BC, BK]), DOT)",
              f"{out} += tl.where((o_blk[:, None] - o_blk[None, :]) == d, _mm(b_left, tl.trans(b_kr), DOT), 0.0)")
        same = f"(o_blk[:, None] == o_blk[None, :]) & ({keep})"
        if diagonal == "factored":
            self.once("b_kd", "# diagonal blocks: the right factor referenced at the block's start (>= 1, bounded",
                      "# by the gate's lower bound over SUB tokens)",
                      "b_kd = _dot_operand(tl.reshape(tl.reshape(b_k, [NB, SUB, BK]) * tl.exp2(b_Gstart[:, None, :] - b_G3), [BC, BK]), DOT)")
            c(f"{out} += tl.where({same}, _mm({left}, tl.trans(b_kd), DOT), 0.0)")
            return
        kernel = gram.parent_op()
        load_k = next(o for o in kernel.walk() if isinstance(o, k3s.LoadChunkOp) and o.tensor.data == "k")
        load_g = next(o for o in kernel.walk() if isinstance(o, k3s.LoadGateOp))
        c("# diagonal blocks elementwise, exp of differences (<= 1 for any gate): column r of every block,",
          "# its key row and log-decay reloaded (cache-resident: cheaper than picking a row out of the",
          "# [NB, SUB, BK] tiles) and its G accumulated from the block's reference",
          "b_Gj = b_Gstart",
          "for r in range(0, SUB):")
        with c.indent():
            c("t_j = start + o_b * SUB + r", "m_j = t_j < eos")
            self.print_rows(load_k, "t_j", "m_j", "b_kj")
            self.print_gate_rows(load_g, "t_j", "m_j", "b_gj")
            c("b_kj = b_kj.to(tl.float32)",
              "b_Gj = b_Gj + b_gj * 1.4426950408889634",
              f"b_ratio = tl.exp2(tl.minimum(b_G3 - b_Gj[:, None, :], 0.0))",
              f"b_col = tl.reshape(tl.sum(tl.reshape(b_{lhs}, [NB, SUB, BK]) * b_kj[:, None, :] * b_ratio, axis=2), [BC])",
              f"{out} += tl.where({same} & ((o_c % SUB) == r)[None, :], b_col[:, None], 0.0)")

    def print_k3s_gram(self, op: k3s.GramOp) -> None:
        c = self.code
        lhs, gate = op.lhs.data, op.gate.data
        out = "b_A" if lhs == "k" else "b_P"
        keep = "o_c[:, None] > o_c[None, :]" if op.mask.data == "strict" else "o_c[:, None] >= o_c[None, :]"
        c.comment(op)
        if gate == "channel":
            sub = op.sub_chunk.value.data
            if sub & (sub - 1) or self.chunk_size % sub:
                raise UnsupportedError(f"Triton backend: sub-chunk {sub} must be a power of two dividing the chunk "
                                       f"size {self.chunk_size}")
            self.print_gate_references(sub)
            self.print_gram_factored(op, lhs, out, keep, op.diagonal.data)
        elif gate == "scalar":
            c(f"{out} = _mm(b_{lhs}, tl.trans(b_k), DOT)",
              f"{out} = {out} * tl.exp2(tl.where({keep}, b_G[:, None] - b_G[None, :], 0.0))")
        else:
            c(f"{out} = _mm(b_{lhs}, tl.trans(b_k), DOT)")
        c(f"{out} = tl.where({keep}, {out}, 0.0)")
        if op.beta.value.data:
            c(f"{out} = {out} * b_beta[:, None]")

    def print_k3s_forward_substitution(self, op: k3s.ForwardSubstitutionOp) -> None:
        c = self.code
        sub = op.block.value.data
        if sub & (sub - 1) or self.chunk_size % sub:
            raise UnsupportedError(f"Triton backend: forward-substitution block {sub} must be a power of two "
                                   f"dividing the chunk size {self.chunk_size}")
        c.comment(op, "T = (I + A)^-1 Diag(beta), blocked")
        if sub == 1:  # unit diagonal blocks: all of the inverse by the products of step 2
            c("SUB_T: tl.constexpr = 1",
              "b_eye = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)",
              "b_Dinv = b_eye")
        else:
            self.print_diagonal_block_inverse(sub)
        c("# 2. M = Dinv N, N the blocks below the diagonal: M is nilpotent (M^NB = 0), so",
          "#    (I + A)^-1 = (I + M)^-1 Dinv = (I - M)(I + M^2)(I + M^4)... Dinv, exact after log2(NB) factors")
        if sub > 1:
            c("b_eye = tl.where(o_c[:, None] == o_c[None, :], 1.0, 0.0)")
        c("b_below = (o_c[:, None] // SUB_T) > (o_c[None, :] // SUB_T)",
          f"b_M = _mm_accurate(b_Dinv, tl.where(b_below, b_A, 0.0), DOT)",
          "b_Linv = b_eye - b_M")
        power = 2
        while power < self.chunk_size // sub:
            c(f"b_M = _mm_accurate(b_M, b_M, DOT)", f"b_Linv = _mm_accurate(b_Linv, b_eye + b_M, DOT)")
            power *= 2
        c("b_T = " + ("b_Linv" if sub == 1 else f"_mm_accurate(b_Linv, b_Dinv, DOT)") + " * b_beta[None, :]")

    def print_diagonal_block_inverse(self, sub: int) -> None:
        """b_Dinv: the inverse of I + A's diagonal blocks of `sub` rows, solved row by row."""
        c = self.code
        c(f"# 1. the {sub} x {sub} diagonal blocks of I + A as [NB, SUB, SUB], inverted together: step r",
          "#    solves row r of every block (A is strictly lower: unit diagonal)",
          f"SUB_T: tl.constexpr = {sub}",
          "NB_T: tl.constexpr = BC // SUB_T",
          "o_bt = tl.arange(0, NB_T)",
          "o_rt = tl.arange(0, SUB_T)",
          "b_on_diagonal = (o_bt[:, None, None, None] == o_bt[None, None, :, None])",
          "b_Ad = tl.sum(tl.where(b_on_diagonal, tl.reshape(b_A, [NB_T, SUB_T, NB_T, SUB_T]), 0.0), axis=2)",
          "b_X = tl.zeros([NB_T, SUB_T, SUB_T], dtype=tl.float32)",
          "for r in range(0, SUB_T):")
        with c.indent():
            c("b_a = tl.sum(tl.where((o_rt == r)[None, :, None], b_Ad, 0.0), axis=1)",
              "b_row = tl.where(o_rt[None, :] == r, 1.0, 0.0) - tl.sum(b_a[:, :, None] * b_X, axis=1)",
              "b_X = tl.where((o_rt == r)[None, :, None], b_row[:, None, :], b_X)")
        c("b_Dinv = tl.reshape(tl.where(b_on_diagonal, b_X[:, :, None, :], 0.0), [BC, BC])")

    def print_k3s_wy_apply(self, op: k3s.WYApplyOp) -> None:
        self.code.comment(op)
        if op.operand.data == "key":
            keys = "b_k" if op.gate.data == "none" else f"b_k * {self.gamma(op.gate.data)}"
            self.code(f"b_W = _mm(b_T, {keys}, DOT)")
        else:
            self.code(f"b_U = _mm(b_T, b_v, DOT)")

    def print_last_gate_row(self, gate: str) -> None:
        """b_Glast: G at the chunk's last row (rows past the end add 0, so the last token's)."""
        self.once("b_Glast", "b_Glast = tl.sum(tl.where((o_c == BC - 1)[:, None], b_G, 0.0), axis=0)" if gate == "channel"
                  else "b_Glast = tl.sum(tl.where(o_c == BC - 1, b_G, 0.0))")

    def print_k3s_gate_apply(self, op: k3s.GateApplyOp) -> None:
        gate = op.gate.data
        self.code.comment(op)
        if op.operand.data == "q":
            self.code(f"b_QG = b_q * {self.gamma(gate)}")
            return
        self.print_last_gate_row(gate)
        self.code(f"b_KG = b_k * {self.gamma(gate, 'b_Glast[None, :] - b_G' if gate == 'channel' else 'b_Glast - b_G')}")

    def print_k3s_chunk_decay(self, op: k3s.ChunkDecayOp) -> None:
        self.code.comment(op)
        self.print_last_gate_row(op.gate.data)
        self.code("b_gamma_C = tl.exp2(b_Glast)")

    SPILL_LAYOUT = {"W": ("K", "o_k", "m_k"), "U": ("V", "o_v", "m_v"), "P": ("BC", "o_c", None),
                    "QG": ("K", "o_k", "m_k"), "KG": ("K", "o_k", "m_k"), "T": ("BC", "o_c", None)}

    def spill_address(self, value: str) -> tuple[str, str]:
        if value == "gamma_C":  # one row per chunk, at slot start // BC + i_n (unique, see NC)
            if len(self.view.dims("gamma_C")) == 3:  # a channel gate: [NC, HV, K]
                return "gamma_C + ((start // BC + i_n) * HV + i_hv) * K + o_k", "m_k"
            return "gamma_C + (start // BC + i_n) * HV + i_hv", ""
        width, offsets, mask = self.SPILL_LAYOUT[value]
        address = f"{k3s.workspace_name(value)} + (t_c[:, None] * HV + i_hv) * {width} + {offsets}[None, :]"
        return address, "m_c[:, None]" + (f" & {mask}[None, :]" if mask else "")

    def print_k3s_store_checkpoint(self, op: k3s.StoreCheckpointOp) -> None:
        c = self.code
        c.comment(op, "the state after a multiple of checkpoint_every tokens")
        c("if HAS_CHECKPOINTS:")
        with c.indent():
            c("done = start + BC - bos", "if (done % checkpoint_every == 0) & (start + BC <= eos):")
            with c.indent():
                c("if HAS_CU_SEQLENS:")
                with c.indent():
                    c("slot = tl.load(checkpoint_base + i_n).to(tl.int64) + done // checkpoint_every - 1")
                c("else:")
                with c.indent():
                    c("slot = i_n * (T // checkpoint_every) + done // checkpoint_every - 1")
                c("tl.store(checkpoints + (slot * HV + i_hv) * K * V + (p_state - i_nh * K * V), b_S, mask=m_kv)")

    # --- speculative decoding stages ----------------------------------------------------------
    # cache [P, depth, HV, 2K + V] fp32 per slot and token: k (the value head's key), the
    # log-decay g (channel: [K]; scalar: repeated over K; none: 0), then u (the written update)

    def print_k3s_cache_update(self, op: k3s.CacheUpdateOp) -> None:
        c = self.code
        cache = k3s.cache_buffer(op)
        c.comment(op, "what a replay needs: k, the log-decay and the update u this token wrote")
        if isinstance(op.parent_op(), k3s.ChunkLoopOp):
            self.print_chunk_cache_update(op, cache)
            return
        g = {"channel": "b_g", "scalar": "b_g + 0.0 * b_k", "none": "0.0 * b_k"}[op.gate.data]
        c("p_cache = ((i_slot * DEPTH + (t - bos)) * HV + i_hv) * (2 * K + V)",
          "# k and g are the same for every value block: the first one writes them",
          "m_cache_k = m_k & m_slot_k & ((i_v + 0 * o_k) == 0)",
          f"tl.store({cache} + p_cache + o_k, b_k, mask=m_cache_k)",
          f"tl.store({cache} + p_cache + K + o_k, {g}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache + 2 * K + o_v, b_v, mask=m_v & m_slot_v)")

    def print_chunk_cache_update(self, op: k3s.CacheUpdateOp, cache: str) -> None:
        """The chunked verify's cache: every row of the chunk, u the row of Vr (or v)."""
        c = self.code
        g = {"channel": "b_g", "scalar": "b_g[:, None] + 0.0 * b_k", "none": "0.0 * b_k"}[op.gate.data]
        u = "b_vr" if op.residual is not None and op.residual.value.data else "b_v"
        c("p_cache = ((i_slot * DEPTH + (t_c - bos)) * HV + i_hv) * (2 * K + V)",
          "# k and g are the same for every value block: the first one writes them",
          "m_cache_k = m_c[:, None] & (m_k & m_slot_k & ((i_v + 0 * o_k) == 0))[None, :]",
          f"tl.store({cache} + p_cache[:, None] + o_k[None, :], b_k, mask=m_cache_k)",
          f"tl.store({cache} + p_cache[:, None] + K + o_k[None, :], {g}, mask=m_cache_k)",
          f"tl.store({cache} + p_cache[:, None] + 2 * K + o_v[None, :], {u}, mask=m_c[:, None] & (m_v & m_slot_v)[None, :])")

    def print_k3s_snapshot_state(self, op: k3s.SnapshotStateOp) -> None:
        self.code.comment(op, "the whole state after this token")
        self.code("tl.store(snapshots + ((i_slot * DEPTH + (t - bos)) * HV + i_hv) * K * V + p_local, b_S, mask=m_kv)")

    def print_k3s_restore_snapshot(self, op: k3s.RestoreSnapshotOp) -> None:
        c = self.code
        c.comment(op, "the snapshot after the last accepted token")
        c("n_accepted = tl.minimum(tl.maximum(tl.load(accepted + i_n).to(tl.int64), 0), DEPTH)",
          "if n_accepted > 0:")
        with c.indent():
            c("b_S = tl.load(snapshots + ((i_slot * DEPTH + n_accepted - 1) * HV + i_hv) * K * V + p_local, "
              "mask=m_kv, other=0.0)")

    def print_k3s_replay(self, op: k3s.ReplayOp) -> None:
        c = self.code
        cache = k3s.cache_buffer(op)
        c.comment(op, "the closed form's sum, accumulated token by token: S <- Diag(exp g_j) S + k_j u_j^T")
        c("# counts outside 0..DEPTH are clamped: the cache holds no more tokens; a slot outside the",
          "# pool reads nothing",
          "n_accepted = tl.minimum(tl.maximum(tl.load(accepted + i_n).to(tl.int64), 0), DEPTH)",
          f"for j in {self.token_range(op, '0', 'n_accepted')}:")
        with c.indent():
            c("p_cache = ((i_slot * DEPTH + j) * HV + i_hv) * (2 * K + V)",
              f"b_k = tl.load({cache} + p_cache + o_k, mask=m_k & m_slot_k, other=0.0)",
              f"b_u = tl.load({cache} + p_cache + 2 * K + o_v, mask=m_v & m_slot_v, other=0.0)")
            if op.gate.data != "none":
                c(f"b_g = tl.load({cache} + p_cache + K + o_k, mask=m_k & m_slot_k, other=0.0)",
                  "b_S = b_S * tl.exp(b_g)[:, None]")
            c("b_S = b_S + b_k[:, None] * b_u[None, :]")

    def print_k3s_decay_product(self, op: k3s.DecayProductOp) -> None:
        self.code.comment(op, "M <- Diag(gamma_C) M")
        self.code("b_M = b_M * b_gamma_C")

    def print_k3s_store_transition(self, op: k3s.StoreTransitionOp) -> None:
        self.code.comment(op, "every value block holds the same M: the first one writes it")
        if op.transition.data == "diagonal":
            self.code("tl.store(M + i_nh * K + o_k, b_M, mask=m_k & ((i_v + 0 * o_k) == 0))")
        else:
            self.code("if i_v == 0:")
            with self.code.indent():
                self.code("tl.store(M + i_nh, b_M)")

    def print_k3s_spill(self, op: k3s.SpillOp) -> None:
        value = op.value.data
        address, mask = self.spill_address(value)
        self.code.comment(op)
        self.code(f"tl.store({address}, b_{value}.to({k3s.workspace_name(value)}.dtype.element_ty)"
                  f"{f', mask={mask}' if mask else ''})")

    def print_k3s_reload(self, op: k3s.ReloadOp) -> None:
        value = op.value.data
        address, mask = self.spill_address(value)
        self.code.comment(op)
        self.code(f"b_{value} = tl.load({address}{f', mask={mask}, other=0.0' if mask else ''})")

    def print_k3s_delta_residual(self, op: k3s.DeltaResidualOp) -> None:
        if op.zero_values is not None and op.zero_values.value.data:
            self.code.comment(op, "Vr = -W S (no value input)")
            self.code(f"b_vr = -_mm(b_W, b_S, DOT)")
            return
        self.code.comment(op, "Vr = U - W S")
        self.code(f"b_vr = b_U - _mm(b_W, b_S, DOT)")

    def print_k3s_chunk_output(self, op: k3s.ChunkOutputOp) -> None:
        values = "b_vr" if op.residual.value.data else "b_v"
        queries = "b_q" if op.gate.data == "none" else "b_QG"
        self.code.comment(op, "O = scale (QG S + P Vr)")
        self.code(
            f"b_o = scale * (_mm({queries}, b_S, DOT) + _mm(b_P, {values}, DOT))",
            "tl.store(o + (t_c[:, None] * HV + i_hv) * V + o_v[None, :], b_o.to(o.dtype.element_ty), "
            "mask=m_c[:, None] & m_v[None, :])",
        )

    def print_k3s_state_advance(self, op: k3s.StateAdvanceOp) -> None:
        values = "b_vr" if op.residual.value.data else "b_v"
        gate = op.gate.data
        self.code.comment(op, "S <- Diag(gamma_C) S + KG^T Vr")
        if gate == "none":
            self.code(f"b_S = b_S + _mm(tl.trans(b_k), {values}, DOT)")
        else:
            decay = "b_gamma_C[:, None]" if gate == "channel" else "b_gamma_C"
            self.code(f"b_S = b_S * {decay} + _mm(tl.trans(b_KG), {values}, DOT)")

    # --- AttnRes stages ----------------------------------------------------------------------

    def print_k3s_fold_query(self, op: k3s.FoldQueryOp) -> None:
        self.code.comment(op, "RMSNorm gain folded into the pseudo-query")
        self.code(
            "b_q = tl.load(query + o_d, mask=m_d, other=0.0).to(tl.float32)"
            " * tl.load(gain + o_d, mask=m_d, other=0.0).to(tl.float32)",
            'b_max = tl.full([], float("-inf"), dtype=tl.float32)',
            "b_sum = tl.zeros([], dtype=tl.float32)",
            "b_acc = tl.zeros([BD], dtype=tl.float32)",
        )

    def print_k3s_source_loop(self, op: k3s.SourceLoopOp) -> None:
        c = self.code
        c.comment(op, "each source row is read once")
        c("for i_s in range(0, S):")
        with c.indent():
            c("b_x = tl.load(sources + (i_s * R + i_r) * D + o_d, mask=m_d, other=0.0).to(tl.float32)")
            self.print_ops(op)

    def print_k3s_rms_score(self, op: k3s.RmsScoreOp) -> None:
        self.code.comment(op, "score = q . x / rms(x)")
        self.code(f"b_score = tl.sum(b_x * b_q) / tl.sqrt(tl.sum(b_x * b_x) / D + {op.eps.value.data!r})")

    def print_k3s_online_softmax(self, op: k3s.OnlineSoftmaxOp) -> None:
        self.code.comment(op)
        self.code(
            "b_new_max = tl.maximum(b_max, b_score)",
            "b_rescale = tl.exp(b_max - b_new_max)",
            "b_p = tl.exp(b_score - b_new_max)",
            "b_sum = b_sum * b_rescale + b_p",
            "b_max = b_new_max",
        )

    def print_k3s_mix_accumulate(self, op: k3s.MixAccumulateOp) -> None:
        self.code.comment(op)
        self.code("b_acc = b_acc * b_rescale + b_p * b_x")

    def print_k3s_normalize_store(self, op: k3s.NormalizeStoreOp) -> None:
        self.code.comment(op)
        self.code("tl.store(out + i_r * D + o_d, (b_acc / b_sum).to(out.dtype.element_ty), mask=m_d)")


def print_triton(module: ModuleOp, docstring: str, launch_tables: dict | None = None) -> str:
    return TritonPrinter(launch_tables).print_module(module, docstring)
