"""Module and entries: the host functions (argument checks, allocation, launch) around the
kernels (kernels.py)."""

from __future__ import annotations

import contextlib

from xdsl.dialects.builtin import ModuleOp

from k3compile.backends.triton.launch import LAUNCH_CONSTANTS, launch_config
from k3compile.backends.triton.printer import context_parallel
from k3compile.backends.triton.printer.common import (
    ENTRY_PARTS,
    HOST_ARITH_DIALECT,
    KERNEL_GROUPINGS,
    Code,
    EntryView,
    describe,
    host_expression,
    launch_table_name,
)
from k3compile.backends.triton.printer.kernels import param_name
from k3compile.backends.triton.runtime import emitted
from k3compile.errors import UnsupportedError
from k3compile.ir import k3s
from k3compile.ir.syntax import attr_to_literal


# where an entry's module has a backward entry, what wraps both as a differentiable op: what an
# entry's refusal of inputs that require grad points to
DIFFERENTIABLE_WRAPPERS = {
    "chunk_backward": "for gradients call this module's chunk (differentiable, any segments / cp_group) "
                      "or k3compile.ops",
    "aggregate_backward": "for gradients call k3compile.ops.attnres.attnres_aggregate (differentiable)",
    "moe_backward": "for gradients call k3compile.ops.moe.latent_moe (differentiable)",
}

# the dtype classes of MXFP4 weights' bytes, checked by the mxfp4 runtime's _check_mx
MX_DTYPE_CLASSES = (k3s.ArgDtype.FP4X2, k3s.ArgDtype.FP4X8, k3s.ArgDtype.E8M0)


# what a host size is, above its line
HOST_SIZE_NOTES = {
    "NC": ("# per-chunk slots: chunk (sequence n, first token s) uses slot s // C + n, unique and",
           "# below cdiv(B T, C) + N for any split into sequences"),
    "HS": ("# the hidden slices of the router kernel at this call's rows (its k3s.launch_by_rows <hidden_slices>, "
           "else its own)",),
    "PB": ("# an MoE dispatch plan's blocks: each expert's run of pairs padded to whole blocks of BM rows: at",
           "# most one partial block per expert that has pairs"),
}
class Entries:
    """TritonPrinter's methods for entries (one per k3s op, and their helpers)."""

    GRID_AXES = {
        "value_block": "triton.cdiv(V, BV)",
        "sequence_head": 'dims["N"] * HV',
        "row": 'dims["B"] * dims["T"]',
        "row_group": 'triton.cdiv(dims["B"] * dims["T"], BR)',
        "row_query_block": 'dims["B"] * dims["T"] * triton.cdiv(dims["Q"], BQ)',
        "row_group_query_block": 'triton.cdiv(dims["B"] * dims["T"], BR) * triton.cdiv(dims["Q"], BQ)',
        "row_group_all_queries": 'triton.cdiv(dims["B"] * dims["T"], BR)',
        "row_part": 'triton.cdiv(dims["B"] * dims["T"], BR)',
        "chunk": "num_chunks",
        "value_head": "HV",
        "row_block": 'triton.cdiv(dims["R"], BR)',
        "expert_block": "triton.cdiv(E, BE)",
        "hidden_slice": 'dims["HS"]',
        "column_block": "triton.cdiv(DOUT, BN)",
        "pair_chunk": 'triton.cdiv(dims["R"] * TOP_K, BR)',
        "one": "1",
        "sorted_block": 'dims["PB"]',
        "pair": 'dims["R"] * TOP_K',
        "token": 'dims["R"]',
        "expert": "E",
        "input_block": "triton.cdiv(DIN, BD)",
    }

    def __init__(self, launch_tables: dict | None = None) -> None:
        self.code = Code()
        # entry name -> {(dtype, N*HV bucket, tokens bucket): {kernel: launch config}}: the
        # entries listed launch through a module-level table (docs/autotuning.md), others statically
        self.launch_tables = dict(launch_tables or {})
        self.signatures: dict[str, list[str]] = {}  # entry -> its printed parameters
        # kernel -> (its parameters, its statements): what a launch passes, what a kernel sharing
        # its code must print the same
        self.kernel_code: dict[str, tuple[list[str], list[str]]] = {}
        # every entry's argument names (kernels.py checks its kernels read no other)
        self.argument_names: set[str] = set()
        self.entry_names: set[str] = set()  # the module's entries (print_grad_refusal reads them)

    def print_module(self, module: ModuleOp, docstring: str) -> str:
        c = self.code
        c(f'"""{docstring}', '"""', "", "import os", "", "import torch", "import triton", "import triton.language as tl", "")
        c(*emitted("checks"))
        # MXFP4 expert weights: their packing (pack_expert_weights), checks and dequantisation
        packing = k3s.mxfp4_packing(module)
        mxfp4 = packing is not None
        if mxfp4:
            c("", "", *emitted("mxfp4"), "", "",
              "# the layout this module's kernels read MXFP4 weights in (their k3s ops' packing): "
              "pack_expert_weights' default",
              f'_MXFP4_PACKING = "{packing.value}"')
        entries = [op for op in module.ops if isinstance(op, k3s.EntryOp)]
        self.argument_names = {arg.sym_name.data for entry in entries for arg in EntryView(entry).args}
        self.entry_names = {entry.sym_name.data for entry in entries}
        # context parallelism (docs/context-parallel.md): with a chunk_segments entry, the chunk
        # entry is printed as _chunk_single and wrapped by a `chunk` that takes segments / cp_group
        cp = context_parallel.cp_entries(module)
        for entry in entries:
            view = EntryView(entry)
            for kernel in view.kernels:
                c("", "")
                self.print_kernel(kernel, view)
            c("", "")
            self.print_entry(view, context_parallel.plain_name(cp, entry))
        if cp:
            c("", "")
            context_parallel.print_context_parallel(self, cp)
        choices = [op for op in module.ops if isinstance(op, k3s.EntryByRowsOp)]
        for choice in choices:
            c("", "")
            self.print_entry_by_rows(choice)
        # what each entry returns, as its IR declares it: a wrapper that allocates without running
        # the entry (k3compile.ops' fake implementations) reads these rather than restating them
        outputs = {e.sym_name.data: {t.sym_name.data: t.type.dtype_class for t in EntryView(e).tensors
                                     if t.role.data in ("output", "optional_output")} for e in entries}
        shapes = {e.sym_name.data: {t.sym_name.data: t.type.pattern for t in EntryView(e).tensors
                                    if t.role.data in ("output", "optional_output")} for e in entries}
        nc_chunks = {e.sym_name.data: op.chunk_size.value.data for e in entries
                     for op in [next((o for o in k3s.walk_entry(e) if isinstance(o, k3s.ChunkTileOp)), None)]
                     if op is not None}
        workspaces = {e.sym_name.data: {t.sym_name.data: [t.type.pattern, t.type.dtype_class]
                                        for t in EntryView(e).tensors if t.role.data == "workspace"}
                      for e in entries}
        c("", "", "# each entry's outputs and their dtypes (float: the inputs' floating dtype)",
          f"OUTPUT_DTYPES = {outputs!r}",
          "# ... and their shapes (the symbols of the schedule IR; NC = cdiv(B T, C) + N per-chunk slots,",
          "# C the entry's chunk size in NC_CHUNK_SIZE, which has every chunked entry's)",
          f"OUTPUT_SHAPES = {shapes!r}", f"NC_CHUNK_SIZE = {nc_chunks!r}",
          "# the workspaces each entry allocates, [shape, dtype] (k3compile.ops sizes a windowed backward by them)",
          f"WORKSPACE_SHAPES = {workspaces!r}")
        exported = [e.sym_name.data for e in entries + choices] + ["pack_expert_weights"] * mxfp4
        c("", "", f"__all__ = {exported!r}")
        return c.text()

    def print_entry(self, view: EntryView, def_name: str | None = None) -> None:
        c = self.code
        entry = view.entry
        unlowered = [op.name for op in entry.body.ops
                     if not isinstance(op, ENTRY_PARTS) and not op.name.startswith(HOST_ARITH_DIALECT)]
        if unlowered or not view.kernels:
            what = f"its schedule {unlowered[0]} is not grouped into kernels" if unlowered else "it has no kernels"
            hint = KERNEL_GROUPINGS.get(unlowered[0] if unlowered else "", "no pass groups it into kernels yet")
            raise UnsupportedError(f"entry @{entry.sym_name.data} of {entry.source}: {what} ({hint})")
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
        for _, callback, _ in self.combine_steps(view):
            params.append(f"{callback}=None")
        slots = view.with_purpose(k3s.ArgPurpose.STATE_SLOTS)
        if slots is not None:
            params.append("check_indices=True")
        outputs = [t for t in view.tensors if t.role.data in ("output", "optional_output")]
        if entry.sym_name.data in self.launch_tables:
            self.print_launch_table(view)
        self.signatures[entry.sym_name.data] = params
        c(f"def {def_name or entry.sym_name.data}({', '.join(params)}):")
        with c.indent():
            c(f'"""{describe(entry)}, lowered from k3 op {entry.source}.', "")
            c("Arguments (shapes in the symbols of the schedule IR, `k3c ir`):")
            for arg in view.args:
                if isinstance(arg, k3s.ScalarArgOp):
                    c(f"    {arg.sym_name.data}: float, default {attr_to_literal(arg.default)}")
                else:
                    apart = (f", must not overlap {arg.distinct_from.root_reference.data}"
                             if arg.distinct_from is not None else "")
                    c(f"    {arg.sym_name.data}: [{arg.type.pattern}] {arg.type.dtype_class} ({arg.role.data}{apart})")
            if view.checkpoint:
                c(f"    checkpoint_every: None, or a positive multiple of {view.checkpoint.chunk_size.value.data}: "
                  "also return the states after every that many tokens of each sequence")
            for _, callback, doc in self.combine_steps(view):
                c(f"    {callback}: {doc[0]}", *(f"    {line}" for line in doc[1:]))
            if slots is not None:
                accepted = view.with_purpose(k3s.ArgPurpose.ACCEPTED_COUNTS)
                counts = f" and {accepted.sym_name.data} in 0..the cache depth" if accepted is not None else ""
                c("    check_indices: check on the host (a synchronisation, skipped while a CUDA graph is captured)",
                  f"        that every {slots.sym_name.data} entry is a pool slot or -1 (padding) and none "
                  f"repeats{counts};",
                  "        False for hot loops: the kernels still never touch memory outside the pool")
            c(f"Returns ({', '.join(o.sym_name.data for o in outputs)}"
              f"{'[, checkpoints]' if view.checkpoint else ''}); optional outputs are None unless asked for.")
            c('"""')
            self.print_grad_refusal(view)
            self.print_argument_checks(view)
            for arg in view.scalars:
                name = arg.sym_name.data
                c(f'{name} = _scalar("{name}", {name}, {attr_to_literal(arg.default)})')
            self.print_host_sizes(view)
            for out in view.tensors:
                if out.role.data in ("output", "optional_output", "workspace"):
                    self.print_allocation(out, view)
            for arg in view.tensors:
                if arg.role.data == "combined":
                    c(f"{arg.sym_name.data} = None  # made by the summary_combine step below")
            if view.checkpoint:
                first = view.tensors[0].sym_name.data
                offsets = view.with_purpose(k3s.ArgPurpose.SEQUENCE_OFFSETS)
                c(f"# {describe(view.checkpoint)}",
                  f"checkpoints, checkpoint_base = _checkpoints(checkpoint_every, {view.checkpoint.chunk_size.value.data}, "
                  f"{'None' if offsets is None else offsets.sym_name.data}, dims, {view.checkpoint.state_dims}, "
                  f"{first}.device)")
            for op in view.entry.body.ops:
                if isinstance(op, k3s.KernelOp):
                    self.print_launch(op, view)
                elif isinstance(op, k3s.LaunchOp):
                    self.print_launch(op.callee(), view, side_stream=k3s.on_side_stream(op))
                elif isinstance(op, k3s.ForkStreamsOp):
                    c(f"_side = _fork({view.tensors[0].sym_name.data}.device)  # k3s.fork_streams")
                elif isinstance(op, k3s.JoinStreamsOp):
                    c("_join(_side)  # k3s.join_streams")
                elif isinstance(op, k3s.SummaryCombineOp):
                    self.print_combine(op, view)
            returned = ", ".join(o.sym_name.data for o in outputs) + ("," if len(outputs) == 1 else "")
            if view.checkpoint:
                c("if checkpoint_every is not None:")
                with c.indent():
                    c(f"return {returned} checkpoints" if returned.endswith(",") else f"return {returned}, checkpoints")
            c(f"return {returned}")

    def print_entry_by_rows(self, op: k3s.EntryByRowsOp) -> None:
        c = self.code
        words = {word.data: entry.string_value() for word, entry in zip(op.words.data, op.entries.data)}
        params = self.signatures[next(iter(words.values()))]
        for entry in words.values():
            if self.signatures[entry] != params:
                raise ValueError(f"entry_by_rows @{op.sym_name.data}: @{entry} and @{next(iter(words.values()))} "
                                 "take different arguments")
        names = [p.split("=")[0] for p in params]
        first = names[0]
        buckets = op.buckets()
        quoted = [f'"{word}"' for word in words]
        table = ", ".join(f"{word} up to {most} rows" if most is not None else f"else {word}" for most, word in buckets)
        c(f'def {op.sym_name.data}({", ".join(params)}, schedule="auto"):')
        with c.indent():
            c(f'"""{describe(op)}: {" or ".join("@" + entry for entry in words.values())} with these arguments '
              "(see theirs).", "",
              f'schedule: "auto" (by the rows of {first}: {table}), {", ".join(quoted[:-1])} or {quoted[-1]}.', '"""')
            c(f"if schedule == \"auto\" and isinstance({first}, torch.Tensor) and {first}.dim() >= 1:")
            with c.indent():
                c("# the table's row buckets (max_rows, by_rows)",
                  "schedule = " + " else ".join(f'"{word}" if {first}.shape[0] <= {most}' if most is not None
                                                else f'"{word}"' for most, word in buckets))
            c('elif schedule == "auto":  # not a tensor: the entry says what is wrong with it')
            with c.indent():
                c(f'schedule = "{buckets[-1][1]}"')
            for word, entry in words.items():
                c(f'if schedule == "{word}":')
                with c.indent():
                    c(f"return {entry}({', '.join(f'{n}={n}' for n in names)})")
            choices = [f"'{word}'" for word in ("auto", *words)]
            c(f'raise ValueError(f"schedule: expected {", ".join(choices[:-1])} or {choices[-1]}, got {{schedule!r}}")')

    def print_grad_refusal(self, view: EntryView) -> None:
        """No printed entry has a backward of its own (a differentiable op wraps one: the chunk
        of a module with chunk_backward, k3compile.ops'): under autograd it refuses its inputs."""
        inputs = [t.sym_name.data for t in view.tensors if t.role.data in ("input", "inout", "optional_input")]
        instead = next((hint for entry, hint in DIFFERENTIABLE_WRAPPERS.items() if entry in self.entry_names),
                       "call it under torch.no_grad() or on inputs that do not require grad")
        self.code(f"_refuse_grad({view.entry.sym_name.data!r}, {instead!r}, {', '.join(inputs)})")

    def print_argument_checks(self, view: EntryView) -> None:
        c = self.code
        c(f"# {describe(view.entry)}: argument checks", "dims = {}")
        first = view.tensors[0].sym_name.data
        order = {"input": 0, "inout": 0, "forbidden": 1, "optional_input": 2}
        inputs = [t for t in view.tensors if t.role.data in order]
        # offsets bind N before the optional tensors shaped by it are checked
        inputs.sort(key=lambda t: (order[t.role.data], t.type.dtype_class != "offsets"))
        for arg in inputs:
            name, role = arg.sym_name.data, arg.role.data
            device = "None" if name == first else f"{first}.device"
            checker = "_check_mx" if arg.type.dtype_class in MX_DTYPE_CLASSES else "_check_tensor"
            check = f'{checker}("{name}", {name}, "{arg.type.pattern}", "{arg.type.dtype_class}", dims, {device})'
            if arg.type.dtype_class == "offsets":
                c(f'_check_offsets("{name}", {name}, dims, {device})')
            elif role in ("input", "inout"):
                c(check)
                if arg.distinct_from is not None:
                    other = arg.distinct_from.root_reference.data
                    c(f'_check_distinct("{name}", {name}, "{other}", {other})')
            elif role == "forbidden":
                c(f'_check_none("{name}", {name}, "k3 op {view.entry.source} has no {name} input")')
            else:
                c(f"if {name} is not None:")
                with c.indent():
                    c(check)
        batched = any("B" in t.type.dims for t in view.tensors)
        if batched and not any(t.type.dtype_class == "offsets" for t in view.tensors):
            c('dims["N"] = dims["B"]  # one sequence per batch row')
        slots = view.with_purpose(k3s.ArgPurpose.STATE_SLOTS)
        if slots is not None:
            c(f'_check_slots("{slots.sym_name.data}", {slots.sym_name.data}, dims["P"], check_indices)')
        if (accepted := view.with_purpose(k3s.ArgPurpose.ACCEPTED_COUNTS)) is not None:
            name = accepted.sym_name.data
            c(f'_check_counts("{name}", {name}, {view.draft_depth()}, check_indices)')
        heads = {self.kernel_constants(k, view).get("HV") for k in view.kernels
                 if k3s.GridAxis.SEQUENCE_HEAD in k.axes[1:]}
        rows = slots.sym_name.data if slots is not None else first  # what sets the sequence count
        for HV in sorted(heads - {None}):
            c(f'_check_grid_axis("{rows}", dims["N"], {HV})')
        for op, callback, _ in self.combine_steps(view):
            made = "leaving cotangents" if op.is_adjoint() else "entering states"
            c(f"if not callable({callback}):")
            with c.indent():
                c(f'raise ValueError(f"{callback}: expected a callable (M, {k3s.argument_name(op.tensors[-2])}) -> '
                  f'the {made}, got {{type({callback}).__name__}}")')
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
        sizes = ", ".join(str(d) if isinstance(d, int) else f'dims["{d}"]' for d in out.type.dims)
        # a float tensor's dtype is lower-to-triton's dtype_of; indices the kernels write are int32
        dtype = {"float32": "torch.float32", "index": "torch.int32"}.get(out.type.dtype_class)
        if dtype is None:
            if out.dtype_of is None:
                raise ValueError(f"{describe(out)}: no dtype_of (lower-to-triton writes it before printing)")
            dtype = f"{out.dtype_of.root_reference.data}.dtype"
        shape = f"({sizes}{',' if ',' not in sizes else ''})"
        alloc = f"_alloc({shape}, {dtype}, {first}.device)"
        if out.fill is not None:  # what the kernels count from or mark padding with
            alloc = f"torch.full({shape}, {out.fill.value.data}, dtype={dtype}, device={first}.device)"
        if out.role.data == "optional_output":
            c(f"{name} = {alloc} if output_{name} else None")
        else:
            c(f"{name} = {alloc}")

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

    @staticmethod
    def rows_bounds(kernel: k3s.KernelOp) -> list[str]:
        """The conditions on the call's token rows under which the entry launches the kernel
        (its min_rows, max_rows)."""
        token_rows = {k3s.GridAxis.ROW, k3s.GridAxis.ROW_GROUP, k3s.GridAxis.ROW_QUERY_BLOCK,
                      k3s.GridAxis.ROW_GROUP_QUERY_BLOCK, k3s.GridAxis.ROW_GROUP_ALL_QUERIES}
        rows = 'dims["B"] * dims["T"]' if token_rows & set(kernel.axes) else 'dims["R"]'
        return ([f"{rows} >= {kernel.min_rows.value.data}"] if kernel.min_rows is not None else []) + \
            ([f"{rows} <= {kernel.max_rows.value.data}"] if kernel.max_rows is not None else [])

    def print_host_sizes(self, view: EntryView) -> None:
        """The shape symbols the entry binds (k3s.bind_size, lower-to-triton's), each its index
        arithmetic as one Python expression; then the inputs of that size are checked."""
        c = self.code
        for op in view.entry.body.ops:
            if not isinstance(op, k3s.BindSizeOp):
                continue
            symbol = op.symbol.data.value
            if isinstance(by_rows := op.size.owner, k3s.SizeByRowsOp):
                c(*HOST_SIZE_NOTES.get(symbol, ()), f'dims["{symbol}"] = {by_rows.otherwise.value.data}')
                for index, (most, size) in enumerate(by_rows.cases):
                    c(f'{"el" if index else ""}if dims["R"] <= {most}:', f'    dims["{symbol}"] = {size}')
            else:
                c(*HOST_SIZE_NOTES.get(symbol, ()), f'dims["{symbol}"] = {host_expression(op.size)}')
            for arg in view.tensors:  # an input of that size is checked against it now (it bound the size above)
                if arg.role.data in ("input", "inout") and symbol in arg.type.dims:
                    c(f'_check_tensor("{arg.sym_name.data}", {arg.sym_name.data}, "{arg.type.pattern}", '
                      f'"{arg.type.dtype_class}", dims, {view.tensors[0].sym_name.data}.device)')

    def print_launch(self, kernel: k3s.KernelOp, view: EntryView, side_stream: bool = False) -> None:
        c = self.code
        constants = self.launch_constants(kernel, view)
        axes = kernel.axes
        c(f"# {describe(kernel)}: launch")
        for name, value in constants.items():
            c(f"{name} = {value}")
        self.print_launch_by_rows(kernel, view)
        tabled = view.entry.sym_name.data in self.launch_tables
        if tabled:  # the tuned config of this call's bucket, else the IR's values
            default = launch_config(kernel)
            first = view.tensors[0].sym_name.data
            c(f"launch = _tuned_launch({launch_table_name(view.entry.sym_name.data)}, {kernel.sym_name.data!r}, "
              f"{first}.dtype, dims, {'HV' if 'HV' in constants else 1}, "
              f"{{{', '.join(f'{k!r}: {k if k in constants else v}' for k, v in default.items())}}})")
            for name in LAUNCH_CONSTANTS.values():
                if name in default:
                    c(f'{name} = launch["{name}"]')
        if k3s.GridAxis.CHUNK in axes:
            first = view.tensors[0].sym_name.data
            offsets_arg = view.with_purpose(k3s.ArgPurpose.SEQUENCE_OFFSETS)
            offsets = offsets_arg.sym_name.data if offsets_arg is not None else "None"  # a verify: rows of a batch
            c(f"num_chunks, chunk_table = _chunks({offsets}, dims, BC, {first}.device)")
        grid = ", ".join(self.GRID_AXES[axis] for axis in axes)
        c(f"grid = ({grid}{',' if len(axes) == 1 else ''})")
        code = kernel.code_name()
        arguments = {param_name(param): arg for param, arg in self.kernel_params(kernel, view)}
        params = [param_name(param) for param in self.kernel_code[code][0]]
        c(f"if {' and '.join(['all(grid)', *self.rows_bounds(kernel)])}:")
        with c.indent():
            if side_stream:  # k3s.launch <side_stream = true>: on the stream k3s.fork_streams made
                c("with torch.cuda.stream(_side):")
            with c.indent() if side_stream else contextlib.nullcontext():
                c(f"{self.kernel_name(code)}[grid](")
                with c.indent():
                    for name in params:
                        skipped = arguments[name] == "None"
                        c(f"None,  # {name}: read only by the stages this launch skips" if skipped else f"{arguments[name]},")
                    if tabled:
                        c('num_warps=launch["num_warps"],')
                        if kernel.num_stages is not None:
                            c('num_stages=launch["num_stages"],')
                        if k3s.GridAxis.CHUNK in axes:  # a tuned cap on the token-parallel kernels' registers (None: none)
                            c('maxnreg=launch.get("maxnreg"),')
                    else:
                        by_rows = any(op.num_warps is not None for op in k3s.launch_by_rows_ops(view.entry, kernel))
                        c(f"num_warps={'num_warps' if by_rows else kernel.num_warps.value.data},")
                        if kernel.num_stages is not None:
                            c(f"num_stages={kernel.num_stages.value.data},")
                        if kernel.maxnreg is not None:
                            c(f"maxnreg={kernel.maxnreg.value.data},")
                c(")")

