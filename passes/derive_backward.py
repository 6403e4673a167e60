"""derive-backward: k3.recurrence -> the reverse-mode derivative of its chunkwise schedule.

The forward schedule is derive-chunkwise's (the same options). Its derivative follows from it:
- the chunk-local stages are recomputed (nothing but the inputs is saved: fla's default), and a
  state scan, the forward's state pass without its output, gives each chunk's entering state S;
- the scan's stages are linear in the state, so the cotangent of the state a chunk enters
  depends only on that of the state it leaves and the chunk's local values: a cotangent scan
  runs the adjoint of the scan's stages from the last chunk to the first (dht in, dh0 out),
  keeping only the stages on that chain;
- with each chunk's S and the cotangent of the state it leaves known, the rest is chunk-local:
  the adjoints of the scan's stages (the cotangents of the local values they read), then of the
  local stages in reverse, accumulating where a value has several readers, down to the loads,
  whose cotangents are stored as the inputs' gradients.
Each op's vector-Jacobian product is its rule in passes/adjoint_rules.py; what no gradient needs
is removed. `k3c prove` checks the result against the derivative of the token recurrence in
exact arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, SymbolRefAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.traits import IsTerminator
from xdsl.transforms.common_subexpression_elimination import cse

from k3compile.ir import k3s
from k3compile.ir.k3 import RecurrenceOp
from k3compile.passes.adjoint_rules import ADJOINT_RULES, UNSCALED_FORMS, Emitter, result_name
from k3compile.passes.common import add_entries, argument_values, make, recurrence_arguments, tensor_arg
from k3compile.passes.derive_chunkwise import check_schedule_options, chunkwise_schedule

LOADS = (k3s.LoadChunkOp, k3s.LoadGateOp, k3s.LoadBetaOp)
# the gradient of each differentiable input, when the member reads it
DIFFERENTIABLE = ("q", "k", "v", "g", "beta", "A_log", "dt_bias")


def backward_arguments(op: RecurrenceOp) -> list[Operation]:
    """The forward's inputs, the cotangents of its outputs (do; dht, of the final state, optional)
    and the gradients of the inputs it reads (dh0 only when asked for), in the inputs' layouts."""
    forward = recurrence_arguments(op)
    by_name = {a.sym_name.data: a for a in forward}

    def like(name: str, of: str, role: str) -> Operation:
        return tensor_arg(name, by_name[of].results[0].type, role)

    grouped = op.num_v_heads.value.data > op.num_heads.value.data

    def gradient(of: str) -> Operation:
        """Zeroed fp32 where the stores of several programs add up (q and k of a group of value
        heads; the gate's parameters); else each element is stored once, unfilled: q, k and v's
        in the inputs' dtype (what autograd hands back), the gate's and beta's in fp32 (g may be
        fp32 beside bf16 q)."""
        dims = by_name[of].results[0].type.dims
        if of in ("A_log", "dt_bias") or of in ("q", "k") and grouped:
            return tensor_arg(f"d{of}", k3s.tensor(*dims, dtype="float32"), "output", fill=0)
        return tensor_arg(f"d{of}", k3s.tensor(*dims, dtype="float" if of in ("q", "k", "v") else "float32"), "output")

    inputs = [a for a in forward if a.sym_name.data not in ("o", "final_state")]
    read = [name for name in DIFFERENTIABLE if by_name[name].role.data == "input"]
    return [*inputs, like("do", "o", "input"), like("dht", "final_state", "optional_input"),
            *(gradient(name) for name in read), like("dh0", "initial_state", "optional_output")]


def remove_dead_stages(block: Block) -> None:
    """Erase the stages whose results nothing reads, until none is left (loads included: the
    backward's reads have no effect of their own); scans and stores stay."""
    while dead := [op for op in block.ops if op.results and not isinstance(op, (k3s.StateScanOp, k3s.CotangentScanOp))
                   and not any(r.uses for r in op.results)]:
        for op in reversed(dead):
            if not any(r.uses for r in op.results):
                op.detach()
                op.erase()


def made_here(operand: SSAValue, contribution: SSAValue) -> bool:
    """Whether a cotangent contribution is a stage a rule emitted for a named operand (not a
    cotangent passed through as it came, which keeps its own name)."""
    return bool(operand.name_hint) and isinstance(contribution.owner, Operation) and \
        not contribution.name_hint.endswith("_bar")


def accumulate_adjoints(ops: list[Operation], e: Emitter, cotangents: dict[SSAValue, SSAValue]) -> None:
    """Walk ops in reverse: each op with a cotangent on its result gets its rule applied, and
    what the rule returns adds to its operands' cotangents, each part named after the operand and
    the value it came through (`k_bar_from_P`: k's part through the query Gram P), the sum
    `k_bar`. Loads end the walk."""
    for op in reversed(ops):
        if op.has_trait(IsTerminator) or isinstance(op, LOADS):
            continue
        results = [cotangents.get(r) for r in op.results]
        if all(c is None for c in results):
            continue
        if type(op) not in ADJOINT_RULES:
            raise NotImplementedError(f"derive-backward: {op.name} has no adjoint rule")
        rule = ADJOINT_RULES[type(op)]
        e.rule = rule.__name__
        for operand, contribution in rule(e, op, *results).items():
            if operand in cotangents:
                if made_here(operand, contribution):  # this rule's part of operand's cotangent
                    contribution.name_hint = e.fresh(f"{operand.name_hint}_bar_from_{result_name(op)}")
                contribution = e.add(cotangents[operand], contribution)
            if made_here(operand, contribution):
                contribution.name_hint = f"{operand.name_hint}_bar"  # the accumulated cotangent of operand
            cotangents[operand] = contribution


def store_cotangent(load: Operation, cotangent: SSAValue, values: dict[str, SSAValue]) -> Operation:
    """The store of a load's cotangent to the gradients of the tensors the load read."""
    inputs = list(load.operands)
    gradients = [values[f"d{k3s.argument_name(t)}"] for t in inputs]
    carried = {}
    if isinstance(load, k3s.LoadChunkOp) and load.l2norm is not None:
        carried["l2norm"] = load.l2norm
    elif isinstance(load, k3s.LoadGateOp):
        carried.update(gate_input=load.input, lower_bound=load.lower_bound)
        if load.floor is not None:
            carried["floor"] = load.floor
    elif isinstance(load, k3s.LoadBetaOp):
        carried["beta_input"] = load.input
    return make(k3s.StoreCotangentOp, operands=[cotangent, *gradients, *inputs], of=load.results[0].name_hint,
                **carried)


def recompute(stage: Operation, primal: dict[SSAValue, SSAValue]) -> list[Operation]:
    """A forward stage again in the backward (primal maps the forward's values to the copies). A
    stage that scales by beta and has an unscaled form (UNSCALED_FORMS: the Gram A = Diag(beta) M,
    the forward substitution T = (I + A)^-1 Diag(beta)) is recomputed as that form and the
    scaling, because its rule reads the unscaled value too (cse then makes it once)."""
    form = UNSCALED_FORMS.get(type(stage))
    found = form(stage, primal) if form else None
    if found is None:
        return [stage.clone(value_mapper=primal)]
    unscaled, factor, along = found
    result = stage.results[0]
    scaled = make(k3s.ScaleOp, operands=[unscaled.results[0], primal[factor]], result=(result.name_hint, result.type),
                  along=along)
    primal[result] = scaled.results[0]
    return [unscaled, scaled]


def backward_schedule(op: RecurrenceOp, values: dict[str, SSAValue], chunk_size: int, sub_chunk: int,
                      solve_block: int, unbounded_diagonal: str) -> k3s.ChunkedBackwardOp:
    # the forward schedule on this entry's tensors; its output's destination is none of them
    no_output = make(k3s.AbsentTensorOp, result=("o", values["do"].type))
    forward = chunkwise_schedule(op, {**values, "o": no_output.results[0]}, chunk_size, sub_chunk, solve_block,
                                 unbounded_diagonal)
    body = Block()
    primal: dict[SSAValue, SSAValue] = {}
    local = forward.local_ops()
    for stage in local:  # recomputed
        for recomputed in recompute(stage, primal):
            body.add_op(recomputed)

    scan = forward.scan.body.block
    S, (*scan_stages, terminator) = scan.args[0], list(scan.ops)
    output = next(s for s in scan_stages if isinstance(s, k3s.ChunkOutputOp))
    state_stages = [s for s in scan_stages if s is not output]

    # the state pass without its output: the state each chunk enters
    state_block = Block(arg_types=[S.type])
    state_block.args[0].name_hint = "S"
    on_scan = {**primal, S: state_block.args[0]}
    for stage in [*state_stages, terminator]:
        state_block.add_op(stage.clone(value_mapper=on_scan))
    state_scan = make(k3s.StateScanOp, state_block, operands=[values["initial_state"]], result=("S", S.type))
    body.add_op(state_scan)
    # the scan's stages again, chunk-local on that state: the values their adjoints read
    on_state = {**primal, S: state_scan.results[0]}
    for stage in state_stages:
        body.add_op(stage.clone(value_mapper=on_state))
    o_bar = make(k3s.LoadChunkOp, operands=[values["do"]], result=("do", output.output.type))
    body.add_op(o_bar)

    # the cotangent pass: the adjoint of the scan's stages, only what the entering state's needs
    (leaving,) = terminator.carried
    cotangent_block = Block(arg_types=[S.type])
    cotangent_block.args[0].name_hint = "S_bar"
    chain = {leaving: cotangent_block.args[0], output.output: o_bar.results[0]}
    accumulate_adjoints(scan_stages, Emitter(cotangent_block, on_state), chain)
    cotangent_block.add_op(make(k3s.NextChunkOp, operands=[chain[S]]))
    remove_dead_stages(cotangent_block)
    cotangent_scan = make(k3s.CotangentScanOp, cotangent_block, operands=[values["dht"], values["dh0"]],
                          result=("S_bar", S.type))
    body.add_op(cotangent_scan)

    # chunk-local from here: the scan's adjoints on S and the cotangent of the state left, then
    # the local stages' in reverse, down to the loads
    e = Emitter(body, on_state)
    cotangents = {leaving: cotangent_scan.results[0], output.output: o_bar.results[0]}
    accumulate_adjoints([*scan_stages, terminator], e, cotangents)
    accumulate_adjoints(local, e, cotangents)
    for stage in local:
        if isinstance(stage, LOADS) and stage.results[0] in cotangents:
            body.add_op(store_cotangent(stage, cotangents[stage.results[0]], values))
    remove_dead_stages(body)
    cse(body)  # a stage a rule emits again on the same values (the inverse, KG_bar * KG) is made once
    forward.drop_all_references()
    no_output.drop_all_references()
    return make(k3s.ChunkedBackwardOp, body, chunk_size=chunk_size)


@dataclass(frozen=True)
class DeriveBackwardPass(ModulePass):
    """Add a `chunk_backward` entry holding the derivative of every k3.recurrence's chunkwise
    schedule (options as derive-chunkwise's)."""

    name = "derive-backward"
    chunk_size: int = 16
    sub_chunk: int = 16
    solve_block: int = 1
    unbounded_diagonal: str = "guarded"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        check_schedule_options(self)
        add_entries(op, RecurrenceOp, self.build)

    def build(self, op: RecurrenceOp) -> k3s.EntryOp:
        arguments = backward_arguments(op)
        schedule = backward_schedule(op, argument_values(arguments), self.chunk_size, self.sub_chunk,
                                     self.solve_block, self.unbounded_diagonal)
        return make(k3s.EntryOp, [*arguments, schedule], sym_name="chunk_backward", source=SymbolRefAttr(op.sym_name))
