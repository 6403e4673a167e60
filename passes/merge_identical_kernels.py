"""merge-identical-kernels: kernels of different entries whose code would be the same run one
code. The chunk entry and chunk_segments share their prepare and scan kernels, segment_summary
and chunk_segments their two summary scans: printed once, compiled once, each launched from its
own entry with its own launch configuration.

Two kernels have the same code when their bodies are structurally equivalent (the same ops, in
the same order, with the same properties and the same use-def chains) and their properties agree
but for those that only say how a kernel is launched. Run after the backend fixes block sizes
(legalize-triton), which are part of the code; the printer checks that the two kernels' code
agrees in their entries and says so if it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass

from k3compile.ir import k3s

# properties that say how a kernel is launched, or name it, rather than what its code is
LAUNCH_ONLY = ("sym_name", "num_warps", "num_stages", "maxnreg", "shares_code_of")


def code_properties(kernel: k3s.KernelOp) -> dict:
    return {key: value for key, value in kernel.properties.items() if key not in LAUNCH_ONLY}


def same_code(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    return (code_properties(kernel) == code_properties(other)
            and kernel.body.is_structurally_equivalent(other.body))


@dataclass(frozen=True)
class MergeIdenticalKernelsPass(ModulePass):
    """Point every kernel at the first earlier kernel, of another entry, with the same code."""

    name = "merge-identical-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        originals: list[k3s.KernelOp] = []
        for kernel in [o for o in op.walk() if isinstance(o, k3s.KernelOp)]:
            if kernel.shares_code_of is not None:
                continue
            twin = next((k for k in originals if k.parent_op() is not kernel.parent_op() and same_code(k, kernel)),
                        None)
            if twin is None:
                originals.append(kernel)
            else:
                kernel.properties["shares_code_of"] = StringAttr(twin.sym_name.data)
