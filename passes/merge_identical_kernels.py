"""merge-identical-kernels: kernels of different entries whose code would be the same run one
code. The chunk entry and chunk_segments share their prepare and scan kernels, segment_summary
and chunk_segments their two summary scans: printed once, compiled once, each launched from its
own entry with its own launch configuration.

Two kernels have the same code when their bodies are structurally equivalent (the same ops, in
the same order, with the same properties and the same use-def chains; their arguments, the
values of their entries they read and write, matched by name) and their properties agree but for those that only say how a kernel is launched (launch configuration,
block sizes and the values of its flags, which each launch passes as constexprs). So the
summary prepare, which guard-spill-only-stages gives the chunk prepare's body with its flag off,
runs the chunk prepare's code. The printer checks that the two kernels' code agrees in their
entries and says so if it does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Region
from xdsl.passes import ModulePass

from k3compile.ir import k3s

# properties that say how a kernel is launched, or name it, rather than what its code is (block
# sizes are constexprs that each launch passes: a launch table may change them per call)
BLOCK_SIZES = ("block_k", "block_v", "block_d", "block_r", "block_e", "block_ks", "block_n")
# the MoE router's hidden slices are the runtime size HS, chosen per launch like its block sizes
LAUNCH_ONLY = ("sym_name", "num_warps", "num_stages", "maxnreg", *BLOCK_SIZES, "hidden_slices", "shares_code_of")


# the same inside a kernel's body: a state tile's value block becomes the kernel's block_v
LAUNCH_ONLY_IN_BODY = {k3s.StateTileOp: ("block_v",)}


def code_properties(kernel: k3s.KernelOp) -> dict:
    code = {key: value for key, value in kernel.properties.items() if key not in LAUNCH_ONLY}
    if kernel.flags is not None:  # which flags the code reads is code, the value each launch passes is not
        code["flags"] = sorted(kernel.flags.data)
    return code


def code_of(kernel: k3s.KernelOp) -> Region:
    """A copy of the kernel's body without the properties that only say how it is launched."""
    body = kernel.body.clone()
    for op in body.walk():
        for key in LAUNCH_ONLY_IN_BODY.get(type(op), ()):
            op.properties.pop(key, None)
    return body


def in_argument_order(body: Region, names: list[str]) -> Region:
    """A copy of an outlined kernel's body with its arguments in the order of `names` (an entry
    orders its kernels' arguments as it declares them; launches pass them by name)."""
    body = body.clone()
    block = body.block
    old = list(block.args)
    by_name = {arg.name_hint: arg for arg in old}
    for name in names:
        moved = block.insert_arg(by_name[name].type, len(block.args))
        moved.name_hint = name
        by_name[name].replace_all_uses_with(moved)
    for arg in old:
        block.erase_arg(arg)
    return body


def equivalent(body: Region, other: Region) -> bool:
    """Whether two outlined kernels' bodies are the same code: arguments of the same names and
    types, and the same ops on them (xDSL's structural equivalence)."""
    names = [arg.name_hint for arg in other.block.args]
    if sorted(arg.name_hint for arg in body.block.args) != sorted(names):
        return False
    return in_argument_order(body, names).is_structurally_equivalent(other)


def same_code(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    return code_properties(kernel) == code_properties(other) and equivalent(code_of(kernel), code_of(other))


@dataclass(frozen=True)
class MergeIdenticalKernelsPass(ModulePass):
    """Point every kernel at the first earlier kernel, of another entry, with the same code."""

    name = "merge-identical-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        originals: list[k3s.KernelOp] = []
        for kernel in k3s.outlined_kernels(op, self.name):
            if kernel.shares_code_of is not None:
                continue
            entry = k3s.launching_entry(kernel)
            twin = next((k for k in originals if k3s.launching_entry(k) is not entry and same_code(k, kernel)), None)
            if twin is None:
                originals.append(kernel)
            else:
                kernel.properties["shares_code_of"] = StringAttr(twin.sym_name.data)
