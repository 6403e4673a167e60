"""Print a scheduled (`k3s`) module as a standalone Python module of Triton kernels.

The printer prints what the IR says: every block of generated code is the printing of one IR
op (named in a comment above it), with constants read from the op's properties; the backend's
passes wrote its choices there first (legalize-triton: block sizes; lower-to-triton: the
products' precision, the triangular inverse's form, what loads keep, unrolling, workspace
layouts, host sizes, what a launch passes besides a kernel's arguments). A file whose
docstring says it decides nothing reads every choice off the IR; the others name what they still
decide, the rest of issue 39's list.
Entries become host functions (argument checks, allocation, launch), kernels become
@triton.jit functions, stages become the statements of those functions. One file per op
family: entries.py (module, entries), kernels.py (kernels, grid axes), loads.py, token_stages.py,
chunk_stages.py, adjoint_stages.py (backward schedules), serving.py (speculative decoding),
segments.py and context_parallel.py (context parallelism), attnres.py, moe.py (MoE routing, its expert_block axis and launches by rows), experts.py (MoE
experts), moe_backward.py (the MoE backward's stages); common.py holds what they share.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

from k3compile.backends.triton.printer.adjoint_stages import AdjointStages
from k3compile.backends.triton.printer.attnres import AttnRes
from k3compile.backends.triton.printer.chunk_stages import ChunkStages
from k3compile.backends.triton.printer.common import EntryView, describe, launch_table_name
from k3compile.backends.triton.printer.entries import Entries
from k3compile.backends.triton.printer.experts import Experts
from k3compile.backends.triton.printer.kernels import Kernels
from k3compile.backends.triton.printer.loads import Loads
from k3compile.backends.triton.printer.moe import MoE
from k3compile.backends.triton.printer.moe_backward import MoeBackward
from k3compile.backends.triton.printer.segments import Segments
from k3compile.backends.triton.printer.serving import Serving
from k3compile.backends.triton.printer.token_stages import TokenStages

__all__ = ["EntryView", "TritonPrinter", "describe", "launch_table_name", "print_triton"]


class TritonPrinter(Entries, Kernels, Loads, TokenStages, ChunkStages, AdjointStages, Serving, Segments, AttnRes, MoE,
                    Experts, MoeBackward):
    """One method per k3s op. `print_module` returns the source of the compiled module."""


def print_triton(module: ModuleOp, docstring: str, launch_tables: dict | None = None) -> str:
    return TritonPrinter(launch_tables).print_module(module, docstring)
