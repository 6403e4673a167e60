"""Spec -> `k3` IR: one op per layer, attributes taken from the validated spec."""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.exceptions import VerifyException

from k3compile.errors import SpecError
from k3compile.passes.common import props
from k3compile.spec import RECURRENCE_KINDS, LayerSpec


def spec_to_module(spec: LayerSpec) -> ModuleOp:
    from k3compile.ir.k3 import AttnResOp, LatentMoEOp, RecurrenceOp

    params = dict(spec.params)
    if spec.kind in RECURRENCE_KINDS:
        op_type = RecurrenceOp
        params.update(RECURRENCE_KINDS[spec.kind])
    else:
        op_type = {"attnres": AttnResOp, "latent_moe": LatentMoEOp}[spec.kind]
    params["sym_name"] = spec.name
    # in the op's declaration order, so printed IR reads the same for every spec
    order = op_type.get_irdl_definition().properties
    defaults = getattr(op_type, "INPUT_DEFAULTS", {})  # optional properties: left out at their defaults
    properties = props(op_type, **{key: params[key] for key in order
                                   if key not in defaults or params[key] != defaults[key]})
    op = op_type.create(properties=properties)
    module = ModuleOp([op])
    try:
        module.verify()
    except VerifyException as err:
        raise SpecError(f"{spec.source}: {err}") from None
    return module
