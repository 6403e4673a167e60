"""merge-identical-kernels: kernels of different entries whose code would be the same run one
code. The chunk entry and chunk_segments share their prepare and scan kernels, segment_summary
and chunk_segments their two summary scans: printed once, compiled once, each launched from its
own entry with its own launch configuration.

Two kernels have the same code when their bodies are structurally equivalent (the same ops, in
the same order, with the same properties and the same use-def chains; their arguments, the
values of their entries they read and write, matched by name) and their properties agree but for those that only say how a kernel is launched (launch configuration,
block sizes and the values of its flags, which each launch passes as constexprs). So the
summary prepare, which guard-spill-only-stages gives the chunk prepare's body with its flag off,
runs the chunk prepare's code. Kernels of one entry share code only where their flags differ:
the backward's gradients kernel and its steep launch (lower-backward). The printer checks that the two kernels' code agrees in their
entries and says so if it does not.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, SymbolRefAttr
from xdsl.ir import Block, BlockArgument, Operation, Region
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


def equivalent(body: Region, other: Region, *, without: Collection[Operation] = (),
               other_without: Collection[Operation] = (), ignore_launch_only: bool = False) -> bool:
    """Whether two outlined kernels' bodies are the same code: arguments of the same names and
    types, and the same ops on them: xDSL's structural equivalence (is_structurally_equivalent:
    the same ops in the same order, with the same attributes and properties, their operands the
    corresponding values), its arguments matched by name instead of position (an entry orders
    its kernels' arguments as it declares them; launches pass them by name). Read-only, no copy
    of either body. without, other_without: stages of `body`, of `other` (ops without regions),
    at any depth, that do not count (nor the arguments only they read), as if erased;
    ignore_launch_only: the properties in LAUNCH_ONLY_IN_BODY do not count."""
    skipped = (frozenset(without), frozenset(other_without))
    args, other_args = (read_arguments(region.block, ops) for region, ops in zip((body, other), skipped))
    by_name = {arg.name_hint: arg for arg in other_args}
    if (len(args) != len(other_args) or len(by_name) != len(other_args)
            or {arg.name_hint for arg in args} != by_name.keys()):
        return False
    context: dict = {}
    for arg in args:
        if arg.type != by_name[arg.name_hint].type:
            return False
        context[arg] = by_name[arg.name_hint]
    context[body.block] = other.block
    ignored = LAUNCH_ONLY_IN_BODY if ignore_launch_only else {}
    return same_ops(body.block, other.block, context, ignored, skipped)


def read_arguments(block: Block, skipped: frozenset[Operation]) -> list[BlockArgument]:
    """A kernel body's arguments that a stage reads, but the `skipped` ones."""
    if not skipped:
        return list(block.args)
    return [arg for arg in block.args if any(use.operation not in skipped for use in arg.uses)]


def same_ops(block: Block, other: Block, context: dict, ignored: dict,
             skipped: tuple[frozenset[Operation], frozenset[Operation]]) -> bool:
    """Whether two blocks' ops (but the skipped ones) are the same ops, in the same order."""
    ops = [op for op in block.ops if op not in skipped[0]] if skipped[0] else list(block.ops)
    other_ops = [op for op in other.ops if op not in skipped[1]] if skipped[1] else list(other.ops)
    return len(ops) == len(other_ops) and all(
        same_op(op, other_op, context, ignored, skipped) for op, other_op in zip(ops, other_ops))


def same_op(op: Operation, other: Operation, context: dict, ignored: dict,
            skipped: tuple[frozenset[Operation], frozenset[Operation]]) -> bool:
    """Operation.is_structurally_equivalent, the properties `ignored` names per op type left out
    and the `skipped` ops of each side's regions as if erased."""
    if (op.name != other.name or len(op.operands) != len(other.operands) or len(op.results) != len(other.results)
            or len(op.regions) != len(other.regions) or len(op.successors) != len(other.successors)
            or op.attributes != other.attributes):
        return False
    if keys := ignored.get(type(op)):
        if ({k: v for k, v in op.properties.items() if k not in keys}
                != {k: v for k, v in other.properties.items() if k not in keys}):
            return False
    elif op.properties != other.properties:
        return False
    if not all(context.get(operand, operand) == theirs for operand, theirs in zip(op.operands, other.operands)):
        return False
    if not all(context.get(block, block) == theirs for block, theirs in zip(op.successors, other.successors)):
        return False
    for region, other_region in zip(op.regions, other.regions):
        blocks, other_blocks = list(region.blocks), list(other_region.blocks)
        if len(blocks) != len(other_blocks):
            return False
        context.update(zip(blocks, other_blocks))
        for block, other_block in zip(blocks, other_blocks):
            if len(block.args) != len(other_block.args):
                return False
            for arg, other_arg in zip(block.args, other_block.args):
                if arg.type != other_arg.type:
                    return False
                context[arg] = other_arg
            if not same_ops(block, other_block, context, ignored, skipped):
                return False
    context.update(zip(op.results, other.results))
    return True


def same_code(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    return (code_properties(kernel) == code_properties(other)
            and equivalent(kernel.body, other.body, ignore_launch_only=True))


@dataclass(frozen=True)
class MergeIdenticalKernelsPass(ModulePass):
    """Point every kernel at the first earlier kernel with the same code, of another entry (or of its
    own, launched with other flags)."""

    name = "merge-identical-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        originals: list[k3s.KernelOp] = []
        kernels = k3s.outlined_kernels(op, self.name)
        entry_of = launching_entries(op)
        for kernel in kernels:
            if kernel.shares_code_of is not None:
                continue
            entry = entry_of[kernel]
            twin = next((k for k in originals if (entry_of[k] is not entry or other_launch(k, kernel))
                         and same_code(k, kernel)), None)
            if twin is None:
                originals.append(kernel)
            else:
                kernel.properties["shares_code_of"] = SymbolRefAttr(twin.sym_name)


def other_launch(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    """Whether two kernels of one entry are launches of one code with other flags (the gradients
    kernel of lower-backward and its steep launch): an entry's kernels are otherwise its own."""
    return kernel.flags is not None and other.flags is not None and kernel.flags != other.flags


def launching_entries(module: ModuleOp) -> dict[k3s.KernelOp, k3s.EntryOp]:
    """k3s.launching_entry of every outlined kernel of module, in one walk over its entries (the
    first entry that launches a kernel)."""
    first: dict[StringAttr, k3s.EntryOp] = {}
    for entry in module.ops:
        if isinstance(entry, k3s.EntryOp):
            for launch in entry.body.ops:
                if isinstance(launch, k3s.LaunchOp):
                    first.setdefault(launch.kernel.root_reference, entry)
    return {op: first[op.sym_name] for op in module.ops if isinstance(op, k3s.KernelOp)}
