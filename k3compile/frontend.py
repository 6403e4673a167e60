"""Spec -> `k3` IR: one op per layer, attributes taken from the validated spec."""

from __future__ import annotations

from xdsl.dialects.builtin import BoolAttr, FloatAttr, IntegerAttr, ModuleOp, StringAttr, f64, i64
from xdsl.ir import Attribute
from xdsl.utils.exceptions import VerifyException

from k3compile.errors import SpecError
from k3compile.spec import RECURRENCE_KINDS, LayerSpec


def _attr(value) -> Attribute:
    if isinstance(value, bool):
        return BoolAttr.from_bool(value)
    if isinstance(value, int):
        return IntegerAttr(value, i64)
    if isinstance(value, float):
        return FloatAttr(value, f64)
    return StringAttr(value)


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
    properties = {key: _attr(params[key]) for key in order if key not in defaults or params[key] != defaults[key]}
    op = op_type.create(properties=properties)
    module = ModuleOp([op])
    try:
        module.verify()
    except VerifyException as err:
        raise SpecError(f"{spec.source}: {err}") from None
    return module
