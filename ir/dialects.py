"""Lazy registration of the dialects k3compile reads and writes."""

from __future__ import annotations

from xdsl.context import Context


def _k3():
    # a dialect's ops are defined when a parse first needs them (xDSL's lazy dialects)
    from k3compile.ir.k3 import K3

    return K3


def _k3s():
    # a dialect's ops are defined when a parse first needs them (xDSL's lazy dialects)
    from k3compile.ir.k3s import K3S

    return K3S


def _arith():
    # xDSL's arith: the index arithmetic of an entry's host sizes (k3s.size, k3s.bind_size)
    from xdsl.dialects.arith import Arith

    return Arith


DIALECTS = {"k3": _k3, "k3s": _k3s, "arith": _arith}


def make_context() -> Context:
    # xDSL's builtin dialect: loaded only when a context is made
    from xdsl.dialects.builtin import Builtin

    ctx = Context()
    ctx.load_dialect(Builtin)
    for name, factory in DIALECTS.items():
        ctx.register_dialect(name, factory)
    return ctx
