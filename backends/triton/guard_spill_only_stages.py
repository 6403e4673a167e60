"""guard-spill-only-stages: two kernels whose bodies differ only in stages that write memory for
nobody else in the kernel run one code, each kernel's own such stages under a constexpr flag that
its launch sets.

segment_summary's prepare is the chunk prepare without the stages that only the output needs: the
query loads, the query Gram P, the gated queries QG and their spills (the summary scans read
neither). chunk_backward_segments' cotangent summary is chunk_backward's cotangent scan without
its spills (S_bar on entering each chunk, vr_bar in its middle) and storing the cotangent it
leaves to N_bar instead of dh0. For a kernel A and a kernel B of another entry with more ops
(counted at every depth), each one's extra stages are its writes (spills and state stores, at any
depth: in its chunk loop too) of tensors the other does not write, and every stage whose results
only they read (transitively). When erasing the extra stages of both leaves the same body (xDSL's
structural equivalence: the same ops, properties and use-def chains), B's extra stages include a
spill, each kernel's extra stages are runs of consecutive ops whose values no op outside the run
reads, and the kernels' code properties agree, they share one body: B's, each run of its extra
stages in a `k3s.when <flag = SPILL_S_BAR_VR_BAR>` (the flag named for B's extra spills), each
run of A's extra stages copied to its place in a `k3s.when <flag = ..., on = false>`. B and every
kernel with B's body run it with the flag on, A and every kernel with A's body with it off.
merge-identical-kernels, run next, finds them all one code (a flag's value is launch-only). It
works on outlined kernels (outline-kernels): their arguments compare by name, and a kernel given
the shared body is launched with its entry's values of its arguments' names, a tensor the entry
lacks (the summary prepare's q, the chunk backward's N_bar: read only by stages its launch skips)
as a k3s.absent_tensor of the entry.

Kernels with flags are left as they are, so running the pass again changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import BoolAttr, DictionaryAttr, ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.backends.triton.merge_identical_kernels import code_properties, equivalent, launching_entries
from k3compile.ir import k3s
from k3compile.passes.common import make

# the stages that write a tensor of the entry: what a kernel writes that another may not
WRITES = (k3s.SpillOp, k3s.StoreStateOp)


def written_tensor(op: k3s.SpillOp | k3s.StoreStateOp) -> str:
    """The name of the tensor a write stage writes (a state store's first tensor: its target, or
    the pool it writes a row of)."""
    return k3s.argument_name(op.workspace if isinstance(op, k3s.SpillOp) else op.tensors[0])


def written(kernel: k3s.KernelOp) -> set[str]:
    """The tensors a kernel's spills and state stores write, by name."""
    return {written_tensor(op) for op in kernel.walk() if isinstance(op, WRITES)}


def write_only_stages(kernel: k3s.KernelOp, kept: set[str]) -> set[Operation]:
    """The stages of kernel, at any depth, that exist only for its writes of tensors not in `kept`:
    those writes, and every stage (not a loop: it does more) whose results are read, and read
    only, by them (transitively)."""
    extra: set[Operation] = set()
    for op in reversed(list(kernel.body.walk())):  # a stage's readers come after it
        readers = {use.operation for result in op.results for use in result.uses}
        if ((isinstance(op, WRITES) and written_tensor(op) not in kept)
                or (readers and readers <= extra and not op.regions)):
            extra.add(op)
    return extra


def guarded_runs(kernel: k3s.KernelOp, extra: set[Operation]) -> list[list[Operation]] | None:
    """The extra stages as runs of consecutive ops of one block, in program order, each run's
    values read only inside it (so that one k3s.when can hold it); None where they are not."""
    runs: list[list[Operation]] = []
    for op in kernel.body.walk():
        if op not in extra:
            continue
        if runs and runs[-1][-1].next_op is op:
            runs[-1].append(op)
        else:
            runs.append([op])
    for run in runs:
        block, inside = run[0].parent_block(), set(run)
        if any(block.find_ancestor_op_in_block(use.operation) not in inside
               for op in run for result in op.results for use in result.uses):
            return None
    return runs


def same_body(kernel: k3s.KernelOp, other: k3s.KernelOp) -> bool:
    """The same body, launch properties inside it included (a kernel given another's body loses
    none of its own), and the same code properties."""
    return (code_properties(kernel) == code_properties(other)
            and equivalent(kernel.body, other.body))


def kept_ops(block: Block, extra: set[Operation]) -> Iterator[Operation]:
    """The ops of a block and of the blocks nested in them, in program order, but the extra ones."""
    for op in block.ops:
        if op in extra:
            continue
        yield op
        for region in op.regions:
            for nested in region.blocks:
                yield from kept_ops(nested, extra)


def guard(ops: list[Operation], flag: str) -> None:
    """A k3s.when on flag in the ops' place (consecutive ops of one block), holding them."""
    when = make(k3s.WhenOp, [], flag=flag)
    Rewriter.insert_op(when, InsertPoint.before(ops[0]))
    for op in ops:
        op.detach()
        when.body.block.add_op(op)


def shared_body(wide: k3s.KernelOp, narrow: k3s.KernelOp, wide_runs: list[list[Operation]],
                narrow_extra: set[Operation], narrow_runs: list[list[Operation]], flag: str) -> Region:
    """A copy of wide's body with each run of its extra stages in a k3s.when on flag, and a copy
    of each run of narrow's extra stages in a k3s.when on flag off, before the copy of the stage
    that follows it in narrow (at its block's end where none does). The arguments only narrow's
    runs read are added after wide's."""
    body = Region()
    wide.body.clone_into(body)
    ops = dict(zip(wide.body.walk(), body.walk(), strict=True))  # wide's op -> its copy
    for run in wide_runs:
        guard([ops[op] for op in run], flag)
    guarded = {op for run in wide_runs for op in run}
    # narrow's values as the copy holds them: its kept stages' are the same stages of wide's
    values: dict[SSAValue, SSAValue] = {}
    counterpart: dict[Operation, Operation] = {}  # narrow's kept op -> the copy of wide's
    for theirs, ours in zip(kept_ops(narrow.body.block, narrow_extra), kept_ops(wide.body.block, guarded),
                            strict=True):
        counterpart[theirs] = ops[ours]
        values.update(zip(theirs.results, ops[ours].results))
        for region, copied in zip(theirs.regions, ops[ours].regions):
            for block, copied_block in zip(region.blocks, copied.blocks):
                values.update(zip(block.args, copied_block.args))
    arguments = {arg.name_hint: arg for arg in body.block.args}
    for arg in narrow.body.block.args:
        if arg.name_hint not in arguments:
            arguments[arg.name_hint] = body.block.insert_arg(arg.type, len(body.block.args))
            arguments[arg.name_hint].name_hint = arg.name_hint
        values[arg] = arguments[arg.name_hint]
    for run in narrow_runs:
        after = run[-1].next_op
        while after is not None and after in narrow_extra:
            after = after.next_op
        where = (InsertPoint.before(counterpart[after]) if after is not None
                 else InsertPoint.at_end(counterpart_block(run[0].parent_block(), counterpart, body)))
        when = make(k3s.WhenOp, [op.clone(value_mapper=values) for op in run], flag=flag, on=False)
        Rewriter.insert_op(when, where)
    return body


def counterpart_block(block: Block, counterpart: dict[Operation, Operation], body: Region) -> Block:
    """The block of the shared body in the place of a block of narrow's (the kernel's, or one of a
    kept stage's regions)."""
    parent = block.parent_op()
    if isinstance(parent, k3s.KernelOp):
        return body.block
    return counterpart[parent].regions[list(parent.regions).index(block.parent_region())].block


def run_guarded(kernel: k3s.KernelOp, body: Region, flag: str, on: bool) -> None:
    """Give kernel (a copy of) the shared body, its launch passing flag = on and its entry's
    values of the body's arguments. A tensor its entry lacks (read only by the guarded
    stages its launch skips) becomes a k3s.absent_tensor of the entry."""
    kernel.body.erase_block(kernel.body.block)
    body.clone_into(kernel.body)
    kernel.properties["flags"] = DictionaryAttr({flag: BoolAttr.from_bool(on)})
    relaunch(kernel)


def relaunch(kernel: k3s.KernelOp) -> None:
    """Pass an outlined kernel given another's body the values its arguments now name: its
    entry's arguments of those names; a tensor the entry lacks (read only by stages the launch
    skips) as a k3s.absent_tensor of the argument's type."""
    launch = k3s.launch_site(kernel)
    values = {op.sym_name.data: op.results[0] for op in launch.parent_block().ops
              if isinstance(op, (k3s.TensorArgOp, k3s.ScalarArgOp))}
    operands = []
    for arg in kernel.body.block.args:
        if arg.name_hint not in values:
            absent = make(k3s.AbsentTensorOp, result=(arg.name_hint, arg.type))
            Rewriter.insert_op(absent, InsertPoint.before(launch))
            values[arg.name_hint] = absent.results[0]
        operands.append(values[arg.name_hint])
    launch.operands = operands


def stage_count(kernel: k3s.KernelOp) -> int:
    return sum(1 for _ in kernel.body.walk())


@dataclass(frozen=True)
class GuardSpillOnlyStagesPass(ModulePass):
    """Let two kernels whose bodies differ only in stages that write memory for nobody else run
    one code, each one's own such stages guarded by a flag its launch sets."""

    name = "guard-spill-only-stages"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kernels = k3s.outlined_kernels(op, self.name)
        entry_of = launching_entries(op)  # once: no kernel changes entry here
        # once: a kernel that changes gets flags, and is skipped after
        sizes = {kernel: stage_count(kernel) for kernel in kernels}
        writes = {kernel: written(kernel) for kernel in kernels}
        spills = {kernel: {k3s.argument_name(op.workspace) for op in kernel.walk() if isinstance(op, k3s.SpillOp)}
                  for kernel in kernels}
        for narrow in kernels:
            for wide in kernels:
                if (narrow.flags is not None or wide.flags is not None or entry_of[narrow] is entry_of[wide]
                        # cheap necessary conditions first: a spill to guard, more stages, the same code properties
                        or not spills[wide] - writes[narrow] or sizes[wide] <= sizes[narrow]
                        or code_properties(wide) != code_properties(narrow)):
                    continue
                wide_extra = write_only_stages(wide, writes[narrow])
                narrow_extra = write_only_stages(narrow, writes[wide])
                wide_runs, narrow_runs = guarded_runs(wide, wide_extra), guarded_runs(narrow, narrow_extra)
                if (wide_runs is None or narrow_runs is None
                        or not equivalent(wide.body, narrow.body, without=wide_extra, other_without=narrow_extra)):
                    continue
                guarded_spills = [op for op in wide.body.walk() if op in wide_extra and isinstance(op, k3s.SpillOp)]
                flag = "SPILL_" + "_".join(k3s.argument_name(op.workspace).upper() for op in guarded_spills)
                body = shared_body(wide, narrow, wide_runs, narrow_extra, narrow_runs, flag)
                # the kernels of either body, found before any of them changes
                runs = [(k, True) for k in kernels if k.flags is None and same_body(k, wide)]
                runs += [(k, False) for k in kernels if k.flags is None and same_body(k, narrow)]
                for kernel, on in runs:
                    run_guarded(kernel, body, flag, on)
