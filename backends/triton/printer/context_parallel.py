"""Context parallelism in the compiled module (docs/context-parallel.md): host code only.

A module that has both a `chunk` entry and a `chunk_segments` entry (lower-segment-scan) gets
its chunk entry printed as `_chunk_single`, the runtime (backends/triton/runtime/context_parallel.py)
emitted, and a `chunk` wrapper with two more parameters:

- `segments=P`: split every sequence into P segments on this device and run them through the
  `chunk_segments` entry: one prepare, every segment's summary, a prefix of the combine per
  sequence (the host step between its kernels, given below), the finish of every segment from
  its true entering state (P = 1 or None: exactly `_chunk_single`);
- `cp_group=group`: this rank holds a contiguous slice of the packed token stream; one
  all-gather of fixed size carries the summary of the piece that continues into the next rank.

With a `chunk_backward` and a `chunk_backward_segments` entry too (derive-segment-scan-backward),
the plain backward is printed as `_chunk_backward_single` and `chunk_backward` takes the same two
parameters (the cotangents from the forward combine's adjoint: one more all-gather across ranks),
and `chunk` with either of them is differentiable (torch.autograd: its backward that one).

The math is derive-segment-scan's (the k3s.segment_scan schedule); the runtime needs no kernels
of its own: the combine runs in fp32 torch, its index plan copied to the device once per call.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from k3compile.backends.triton.printer.common import EntryView, describe, launch_table_name
from k3compile.backends.triton.runtime import emitted
from k3compile.ir import k3s

PLAIN_CHUNK = "_chunk_single"  # the name the plain chunk entry is printed under
PLAIN_BACKWARD = "_chunk_backward_single"  # and the plain chunk_backward entry

CP_ENTRIES = ("chunk", "chunk_segments")
CP_BACKWARD_ENTRIES = ("chunk_backward", "chunk_backward_segments")


def cp_entries(module: ModuleOp) -> tuple[k3s.EntryOp | None, ...] | None:
    """The (chunk, chunk_segments, chunk_backward, chunk_backward_segments) entries of one layer,
    or None: context parallelism needs the first two, its backward the last two (else None, None)."""
    entries = {op.sym_name.data: op for op in module.ops if isinstance(op, k3s.EntryOp)}
    found = tuple(entries.get(name) for name in CP_ENTRIES)
    if None in found or len({entry.source for entry in found}) != 1:
        return None
    backward = tuple(entries.get(name) for name in CP_BACKWARD_ENTRIES)
    if None in backward or {entry.source for entry in backward} != {found[0].source}:
        backward = (None, None)
    return found + backward


def plain_name(cp, entry: k3s.EntryOp) -> str | None:
    """The name an entry is printed under where context parallelism wraps it (else its own)."""
    if cp and entry is cp[0]:
        return PLAIN_CHUNK
    if cp and entry is cp[2]:
        return PLAIN_BACKWARD
    return None


def print_context_parallel(printer, cp) -> None:
    """Print the runtime, its instance for this layer and the `chunk` wrapper (after every entry:
    the instance holds _chunk_single and chunk_segments), and the `chunk_backward` one."""
    c = printer.code
    chunk_view, segments_entry = EntryView(cp[0]), cp[1]
    backward_view = EntryView(cp[2]) if cp[2] is not None else None
    chunk = chunk_view.entry
    layer = chunk.layer()
    # the per-token inputs (split with the tokens); beside them: scalars, A_log / dt_bias, absent inputs
    tokens = [t.sym_name.data for t in chunk_view.tensors if t.role.data == "input" and "T" in t.type.dims]
    handled = {"initial_state", "cu_seqlens", "final_state", *tokens}  # the runtime maps them to segments / ranks
    passed = ("input", "optional_input", "forbidden")
    params = [a.sym_name.data for a in chunk_view.args if a.sym_name.data not in handled
              and (isinstance(a, k3s.ScalarArgOp) or a.role.data in passed)]
    state_shape = chunk_view.dims("initial_state")[1:]
    chunk_size = next(op.chunk_size.value.data for op in k3s.walk_entry(chunk) if isinstance(op, k3s.ChunkTileOp))
    # how a summary's M is held: the schedule's combine step says (derive-segment-scan derived it)
    transition = next(op.transition.data for op in segments_entry.walk() if isinstance(op, k3s.SummaryCombineOp))
    vk = layer.state_layout.data == "vk"
    tile = next(op for op in k3s.walk_entry(segments_entry) if isinstance(op, k3s.StateTileOp) and op.start is None)
    V, block_v = tile.head_v_dim.value.data, tile.block_v.value.data
    # the chunk entry's launch table, read at call time (the tuner swaps it per candidate)
    tuned = f"lambda: {launch_table_name(chunk.sym_name.data)}" if chunk.sym_name.data in printer.launch_tables else None
    scan_programs = layer.num_v_heads.value.data * -(-V // min(block_v, 1 << (V - 1).bit_length()))
    c(*emitted("context_parallel"))
    c("", "")
    backward = "None"
    if backward_view is not None:  # the plain backward, its segments entry, the names of what they return
        returned = [t.sym_name.data for t in backward_view.tensors if t.role.data in ("output", "optional_output")]
        backward = f"({PLAIN_BACKWARD}, chunk_backward_segments, {tuple(returned)!r})"
    c(f"# k3s.entry @chunk <source = {chunk.source}> with context parallelism: transition {transition}, "
      f"states {layer.state_layout.data}",
      f"_CHUNK_CP = _ContextParallel({PLAIN_CHUNK}, chunk_segments, {transition!r}, {vk}, "
      f"{state_shape!r}, {chunk_size}, {scan_programs}, {tuned}, {backward})", "", "")
    signature = printer.signatures["chunk"] + ["segments=None", "cp_group=None"]
    c(f"def chunk({', '.join(signature)}):")
    with c.indent():
        c(f'"""{describe(chunk)} with context parallelism (docs/context-parallel.md).', "",
          f"Arguments and returns as {PLAIN_CHUNK} (the plain entry, above), and:",
          "    segments: None or 1: the plain entry, exactly. 'auto': P from the GPU's size (1 where the",
          "        sequences' scans already fill it; _ContextParallel.auto_segments). P > 1: every sequence split into P near-equal",
          f"        segments (cut at multiples of the chunk size {chunk_size} where the sequence has P chunks,",
          "        at single tokens where it is shorter; at multiples of checkpoint_every when checkpoints are",
          "        asked for) that run in parallel (chunk_segments): one prepare, their summaries, a prefix",
          "        combine per sequence (fp32), the finish of every segment from its true entering state.",
          "    cp_group: None, or a torch.distributed process group the token stream is split over. Every",
          "        rank holds T tokens of the packed stream (B = 1, the same T on every rank; rank r the",
          "        tokens r*T .. (r+1)*T - 1); cu_seqlens None (one sequence) or the global offsets",
          "        (0 .. world*T, the same on every rank), sequences may span ranks; initial_state: one",
          "        state per sequence that starts on this rank (None: zeros); final_state: one per",
          "        sequence that ends on this rank. One all_gather of 4 + (the summary) fp32 numbers per",
          "        rank, independent of T. Combines with segments; no checkpoint_every.",
          *(["Differentiable (torch.autograd; the backward: chunk_backward with the same segments /",
             "cp_group, one all-gather across ranks; checkpoints are not differentiated)."]
            if backward_view is not None else []),
          '"""')
        differentiable = [*tokens, *(n for n in params if n != "scale"), "initial_state"]
        needs_grad = f"_needs_grad({', '.join(differentiable)})"
        # a call autograd records goes through the differentiable op, split or not (the plain
        # entry refuses it: its outputs would carry no grad_fn)
        print_plain_and_check(printer, "chunk", PLAIN_CHUNK, chunk_view, "the per-token inputs", unless=needs_grad)
        c("", f"tokens = dict({', '.join(f'{n}={n}' for n in tokens)})",
          f"params = dict({', '.join(f'{n}={n}' for n in params)})")
        c(f"if {needs_grad}:  # a module without a backward refuses")
        with c.indent():
            c("return _CHUNK_CP.differentiable(check, tokens, params, initial_state, output_final_state, cu_seqlens,",
              "                                  checkpoint_every, 1 if segments is None else segments, cp_group)")
        c("if cp_group is not None:")
        with c.indent():
            c("return _CHUNK_CP.run_group(cp_group, check, tokens, params, initial_state, output_final_state, cu_seqlens,",
              "                             checkpoint_every, 1 if segments is None else segments)")
        c("_CHUNK_CP.check_segments(segments)",
          "return _CHUNK_CP.run_segments(check(), tokens, params, initial_state, output_final_state, cu_seqlens,",
          "                              checkpoint_every, segments)")
    if backward_view is not None:
        print_backward(printer, backward_view, tokens)


def print_plain_and_check(printer, entry: str, plain_entry: str, view, checked: str, unless: str = "") -> None:
    """A context-parallel entry's first lines: the plain entry where neither segments nor
    cp_group splits the call (and the condition `unless` does not hold), and check(), which
    checks `checked` before any work."""
    c = printer.code
    first = view.tensors[0].sym_name.data
    c("if cp_group is None and (segments is None or (type(segments) is int and segments == 1))"
      f"{f' and not {unless}' if unless else ''}:")
    with c.indent():
        plain = [f"{n}={n}" for n in (p.split("=")[0] for p in printer.signatures[entry])]
        c(f"return {plain_entry}({', '.join(plain)})")
    c(f"def check():  # {checked}, checked before any work (the entries check the rest)")
    with c.indent():
        c("dims = {}")
        for arg in view.tensors:
            name = arg.sym_name.data
            device = "None" if name == first else f"{first}.device"
            if arg.role.data == "input":
                c(f'_check_tensor("{name}", {name}, "{arg.type.pattern}", "{arg.type.dtype_class}", dims, {device})')
            elif arg.role.data == "forbidden":
                c(f'_check_none("{name}", {name}, "k3 op {view.entry.source} has no {name} input")')
        c("return dims")


def print_backward(printer, view, tokens: list[str]) -> None:
    """`chunk_backward` with segments / cp_group: the plain entry's arguments and two more."""
    c = printer.code
    entry = view.entry
    handled = {"initial_state", "cu_seqlens", "do", "dht"}
    params = [a.sym_name.data for a in view.args if a.sym_name.data not in handled and a.sym_name.data not in tokens
              and (isinstance(a, k3s.ScalarArgOp) or a.role.data in ("input", "optional_input", "forbidden"))]
    signature = printer.signatures["chunk_backward"] + ["segments=None", "cp_group=None"]
    c("", "")
    c(f"def chunk_backward({', '.join(signature)}):")
    with c.indent():
        c(f'"""{describe(entry)} with context parallelism (docs/context-parallel.md).', "",
          f"Arguments and returns as {PLAIN_BACKWARD} (the plain entry, above), and segments / cp_group as",
          "chunk's: the gradients of chunk(..., segments=..., cp_group=...) with the same arguments.",
          "    segments: every sequence split as chunk splits it (chunk_backward_segments: one prepare, the",
          "        summaries, the cotangent summaries, the entering states and, by the combine's adjoint in",
          "        reverse, every segment's leaving cotangent, then the backward of every segment).",
          "    cp_group: this rank's tokens, global cu_seqlens, initial_state and dh0 for the sequences that",
          "        start on this rank, dht for those that end on it. Two all_gathers of the forward's size:",
          "        the forward's (the entering states, recomputed) and the adjoint's (the cotangents).",
          '"""')
        print_plain_and_check(printer, "chunk_backward", PLAIN_BACKWARD, view, "the per-token inputs and do")
        c("", f"tokens = dict({', '.join(f'{n}={n}' for n in tokens)})",
          f"params = dict({', '.join(f'{n}={n}' for n in params)})",
          "if cp_group is not None:")
        with c.indent():
            c("return _CHUNK_CP.run_group_backward(cp_group, check, tokens, params, initial_state, cu_seqlens, do, dht,",
              "                                    output_dh0, 1 if segments is None else segments)")
        c("_CHUNK_CP.check_segments(segments)",
          "return _CHUNK_CP.run_segments_backward(check(), tokens, params, initial_state, cu_seqlens, do, dht, output_dh0,",
          "                                       segments)")
