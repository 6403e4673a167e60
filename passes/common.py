"""Builders shared by the passes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects.builtin import ArrayAttr, BoolAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, f32, f64, i64
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.irdl import IRDLOperation
from xdsl.rewriter import InsertPoint, Rewriter

from k3compile.ir.choices import BOUNDED_GATE_INPUTS, GATE_INPUTS_WITH_PARAMETERS, ZERO_DECAY_FLOOR
from k3compile.ir.syntax import fit_to_property


def to_attr(value) -> Attribute:
    """A Python value as a property attribute: str, bool, int, float, a list or tuple of them;
    attributes pass through."""
    if isinstance(value, Attribute):
        return value
    if isinstance(value, str):
        return StringAttr(value)
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, (list, tuple)):
        return ArrayAttr([to_attr(item) for item in value])
    return FloatAttr(value, f64)


def props(op_type: type[IRDLOperation] | None = None, /, **values) -> dict[str, Attribute]:
    """Python values -> property attributes (to_attr); given the op type, values take its
    properties' types as the parser reads them (a word for an enum property is that enum
    attribute, a list of words for a list of enum values a list of them)."""
    out = {key: to_attr(value) for key, value in values.items()}
    if op_type is None:
        return out
    return {key: fit_to_property(op_type, key, attr) for key, attr in out.items()}


def check_power_of_two(pass_name: str, option: str, value: int, most: int | None = None) -> None:
    """Reject a pass option that is not a power of two (at most `most`) before anything is
    built; the pipeline reports the ValueError as a one-line error."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir.k3s import is_power_of_two

    if not is_power_of_two(value) or (most is not None and value > most):
        bound = f" in 1..{most}" if most is not None else ""
        raise ValueError(f"{pass_name}: {option} must be a power of two{bound}, got {value}")


def check_num_warps(pass_name: str, num_warps: int, option: str = "num-warps") -> None:
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir.k3s import MAX_NUM_WARPS

    check_power_of_two(pass_name, option, num_warps, MAX_NUM_WARPS)


def check_token_stages(pass_name: str, token_stages: int) -> None:
    if token_stages < 0:
        raise ValueError(f"{pass_name}: token-stages must be >= 0 (0: no prefetch), got {token_stages}")


def token_kernel(body: list[Operation], sym_name: str, num_warps: int, token_stages: int) -> Operation:
    """A kernel of one program per (value block, sequence, value head) walking tokens; token_stages
    > 0 pipelines its token loops that deep (the next tokens' loads issued while one is computed)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    stages = {"num_stages": token_stages} if token_stages else {}
    return make(k3s.KernelOp, body, sym_name=sym_name, grid=[k3s.GridAxis.VALUE_BLOCK, k3s.GridAxis.SEQUENCE_HEAD],
                num_warps=num_warps, **stages)


def make(op_type: type[IRDLOperation], body: list[Operation] | Block | None = None, *,
         operands: Sequence[SSAValue | None] = (), result: tuple[str, Attribute] | None = None,
         results: Sequence[tuple[str, Attribute]] = (), **values) -> Operation:
    """Create an op from keyword properties (`sym_name` for the symbol), its operands (None: an
    absent optional one), its result as (name, type) (or its several `results`) and an optional
    body (ops, or a block with arguments)."""
    if isinstance(body, list):
        body = Block(body)
    results = [result] if result else list(results)
    op = op_type.create(operands=[v for v in operands if v is not None], properties=props(op_type, **values),
                        result_types=[t for _, t in results], regions=[Region(body)] if body is not None else [])
    for value, (name, _) in zip(op.results, results, strict=True):
        value.name_hint = name
    return op


def tensor_arg(sym_name: str, type: Attribute, role: str = "input", **values) -> Operation:
    """An entry's tensor argument: its value, named after it, is what the entry's kernels are
    launched with."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    return make(k3s.TensorArgOp, sym_name=sym_name, role=role, result=(sym_name, type), **values)


def argument_values(arguments: Sequence[Operation]) -> dict[str, SSAValue]:
    """An entry's arguments' values by name: what the stages of its kernels read and write."""
    return {op.sym_name.data: op.results[0] for op in arguments if op.results}


def entry_values(entry: Operation) -> dict[str, SSAValue]:
    """The values an entry's stages may read by name: its arguments' and the tensors it marks
    absent (k3s.absent_tensor)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    return {k3s.argument_name(op.results[0]): op.results[0] for op in entry.regions[0].ops
            if isinstance(op, k3s.ARGUMENT_OPS)}


def layer_entry(module: ModuleOp, layer: Operation, name: str):
    """The layer's entry of that name (layer-prefixed in a module of several layers), or None."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    source = layer.sym_name.data
    return next((op for op in module.ops if isinstance(op, k3s.EntryOp) and op.source.root_reference == layer.sym_name
                 and op.sym_name.data in (name, f"{source}_{name}")), None)


def rebind(ops: Operation | Region | Sequence[Operation], values: dict[str, SSAValue]) -> None:
    """Point the operands of ops (and of the ops nested in them) that are arguments of some
    entry at the same-named ones of `values`, those of the entry the ops now belong to (stages
    cloned from another entry's schedule or kernel). A name `values` lacks is an error."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    roots = [ops] if isinstance(ops, (Operation, Region)) else list(ops)
    for root in roots:
        for op in root.walk():
            if not any(k3s.argument_name(v) is not None for v in op.operands):
                continue
            names = [k3s.argument_name(v) for v in op.operands]
            if missing := sorted({n for n in names if n is not None and n not in values}):
                raise ValueError(f"{op.name} reads {', '.join(missing)}, which its entry does not have")
            op.operands = [v if n is None else values[n] for v, n in zip(op.operands, names, strict=True)]


def add_entries(module: ModuleOp, layer_type: type[Operation], build: Callable[[Operation], Operation | None]
                ) -> dict[str, str]:
    """Insert build(op) after every layer op of layer_type (None: that layer has no such entry).
    The layer op stays: it is the declaration every entry of the layer is derived from (`source
    = @name`). Returns each built layer's entry name (a module of several layers names it
    <layer>_<entry>)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir.k3s import EntryByRowsOp, EntryOp

    existing = {(op.source, op.sym_name) for op in module.ops if isinstance(op, (EntryOp, EntryByRowsOp))}
    layers = [op for op in module.ops if op.name.startswith("k3.")]
    names = {}
    for op in list(module.ops):
        if isinstance(op, layer_type):
            entry = build(op)
            if entry is None:
                continue
            if len(layers) > 1:  # entries become module-level functions: keep their names apart
                entry.properties["sym_name"] = StringAttr(f"{op.sym_name.data}_{entry.sym_name.data}")
            names[op.sym_name.data] = entry.sym_name.data
            if (entry.source, entry.sym_name) not in existing:
                Rewriter.insert_op(entry, InsertPoint.after(last_entry_of(module, op)))
    return names


def last_entry_of(module: ModuleOp, layer_op: Operation) -> Operation:
    """The last op in the run of entries that follows layer_op (or layer_op itself)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir.k3s import EntryByRowsOp, EntryOp

    anchor = layer_op
    while (isinstance(anchor.next_op, (EntryOp, EntryByRowsOp))
           and anchor.next_op.source.root_reference == layer_op.sym_name):
        anchor = anchor.next_op
    return anchor


def recurrence_state_shape(op) -> list[int]:
    """One sequence's state: [HV, K, V], or [HV, V, K] for the vk layout."""
    HV, K, V = op.num_v_heads.value.data, op.head_k_dim.value.data, op.head_v_dim.value.data
    return [HV, *((K, V) if op.state_layout.data == "kv" else (V, K))]


def recurrence_arguments(op) -> list[Operation]:
    """The tensor interface every entry of a k3.recurrence shares (fla's layouts)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s
    from k3compile.ir.k3s import tensor

    gate = op.gate.data
    delta_rule = bool(op.delta_rule.value.data)
    H, HV = op.num_heads.value.data, op.num_v_heads.value.data
    K, V = op.head_k_dim.value.data, op.head_v_dim.value.data
    state = tensor("N", *recurrence_state_shape(op), dtype="float32")
    gate_dims = ("B", "T", HV, K) if gate == "channel" else ("B", "T", HV)
    gate_parameter_role = "forbidden" if op.input_option("gate_input") in ("log", "clamped") else "input"

    return [
        tensor_arg("q", tensor("B", "T", H, K, dtype="float"), "input"),
        tensor_arg("k", tensor("B", "T", H, K, dtype="float"), "input"),
        tensor_arg("v", tensor("B", "T", HV, V, dtype="float"), "input"),
        tensor_arg("g", tensor(*gate_dims, dtype="float"), "forbidden" if gate == "none" else "input"),
        tensor_arg("beta", tensor("B", "T", HV, dtype="float"), "input" if delta_rule else "forbidden"),
        make(k3s.ScalarArgOp, sym_name="scale", default=op.scale.value.data, result=("scale", f32)),
        tensor_arg("initial_state", state, "optional_input"),
        tensor_arg("o", tensor("B", "T", HV, V, dtype="float"), "output"),
        tensor_arg("final_state", state, "optional_output"),
        tensor_arg("cu_seqlens", tensor("N+1", dtype="offsets"), "optional_input", purpose="sequence_offsets"),
        # the in-kernel gate's parameters (fla's A_log [HV] and dt_bias [HV * K], or [HV] for a scalar gate)
        tensor_arg("A_log", tensor(HV, dtype="float"), gate_parameter_role),
        tensor_arg("dt_bias", tensor(HV * K if gate == "channel" else HV, dtype="float"), gate_parameter_role),
    ]


def gate_tensors(op, values: dict[str, SSAValue]) -> list[SSAValue]:
    """What a k3.recurrence's gate load reads: g, then A_log and dt_bias if its input form
    computes the gate from them."""
    parameters = ("A_log", "dt_bias") if op.input_option("gate_input") in GATE_INPUTS_WITH_PARAMETERS else ()
    return [values[name] for name in ("g", *parameters)]


def can_reach_zero_decay(op) -> bool:
    """Whether a k3.recurrence's gate form can give log-decays below ZERO_DECAY_FLOOR (then its
    loads raise them to it): the log and softplus forms can (-inf included), the bounded ones
    only with a lower bound below it."""
    if op.gate.data == "none":
        return False
    if op.input_option("gate_input") in BOUNDED_GATE_INPUTS:
        return op.input_option("gate_lower_bound") < ZERO_DECAY_FLOOR
    return True


def input_loads(op, values: dict[str, SSAValue]) -> dict[str, Callable[[type[Operation]], Operation]]:
    """Builders of the load stage of each input of a k3.recurrence, by input name; the load
    op type (per token or per chunk) is the argument. They read the tensors of `values` (the
    entry's arguments) and carry what the input means; their results are named after the input
    and shaped as a chunk's rows (a token's: one row)."""
    # k3s's op definitions (~150 ms): the frontend imports this module and builds no k3s op
    from k3compile.ir import k3s

    normalised = {"l2norm": True} if op.input_option("qk_l2norm") else {}
    floor = {"floor": ZERO_DECAY_FLOOR} if can_reach_zero_decay(op) else {}
    gate_dims = ("K",) if op.gate.data == "channel" else ()

    def rows(load: type[Operation], *dims: str) -> Attribute:
        return k3s.tile(*dims) if load is k3s.LoadTokenOp else k3s.tile("C", *dims)

    return {
        "q": lambda load: make(load, operands=[values["q"]], result=("q", rows(load, "K")), **normalised),
        "k": lambda load: make(load, operands=[values["k"]], result=("k", rows(load, "K")), **normalised),
        "v": lambda load: make(load, operands=[values["v"]], result=("v", rows(load, "V"))),
        "g": lambda load: make(k3s.LoadGateOp, operands=gate_tensors(op, values), gate=op.gate.data,
                               input=op.input_option("gate_input"), lower_bound=op.input_option("gate_lower_bound"),
                               result=("g", rows(load, *gate_dims)), **floor),
        "beta": lambda load: make(k3s.LoadBetaOp, operands=[values["beta"]], input=op.input_option("beta_input"),
                                  result=("beta", rows(load))),
    }
